"""Clients given as index lists (fedjax_pals/data/index_lists.py): generated lists become the
clients of a `FederatedPartition` with the target each way T can be given, bad lists are one
clear error, the JSON file and the scheme `index_lists` carry them into a run, and
flwr-datasets' own partitioners (IID, Dirichlet, pathological) on a small table give the lists
that `index_lists_from_partitioner` reads.

The Flower test runs in an interpreter that has flwr-datasets: this one if it can import
`flwr_datasets`, else $FEDJAX_PALS_FLOWER_PYTHON (CI: a venv of requirements/flower.txt, whose
pins conflict with requirements/lock.txt's). It skips without one, except under
FEDJAX_PALS_FLOWER_TESTS=1 (CI), where a missing one fails."""

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.data import index_lists, partitions as partitions_lib
from fedjax_pals.experiment import task as task_lib

K = 3
RNG = np.random.default_rng(0)
TRAIN = RNG.integers(0, K, 300)
TEST = RNG.integers(0, K, 200)
LISTS = [np.arange(i * 50, (i + 1) * 50)[::-1] for i in range(6)]  # 6 clients of 50 rows


def _rows(partition, i):
    return sorted(partition.client_example_indices(i).tolist())


def _is_a_partition(partition):
    assert partitions_lib.partition_problem(partition, TRAIN, TEST) is None


def test_generated_lists_are_the_clients_and_a_target_list_the_target():
    p = fjp.partition_from_index_lists(TRAIN, TEST, LISTS, target_client=2, seed=1)
    assert p.num_clients == 5 and p.num_classes == K
    for i, original in enumerate((0, 1, 3, 4, 5)):  # list order, the target left out
        assert _rows(p, i) == sorted(LISTS[original].tolist())
        np.testing.assert_array_equal(p.client_label_counts[i],
                                      np.bincount(TRAIN[LISTS[original]], minlength=K))
    assert sorted(p.target_val_indices.tolist()) == sorted(LISTS[2].tolist())
    t = np.bincount(TRAIN[LISTS[2]], minlength=K) / 50
    np.testing.assert_allclose(p.target_label_dist, t)
    test_counts = np.bincount(TEST[p.target_test_indices], minlength=K)
    np.testing.assert_allclose(test_counts / test_counts.sum(), t, atol=0.02)  # drawn to T
    assert "list 2 the target" in p.description
    _is_a_partition(p)
    # A group of lists is the target; the seed orders rows, it does not change the clients.
    g = fjp.partition_from_index_lists(TRAIN, TEST, LISTS, target_client=[4, 1], seed=2)
    assert g.num_clients == 4 and [_rows(g, i) for i in range(4)] == [
        sorted(LISTS[j].tolist()) for j in (0, 2, 3, 5)]
    assert sorted(g.target_val_indices.tolist()) == sorted(np.r_[LISTS[1], LISTS[4]].tolist())


def test_the_target_own_test_examples_are_its_test_set():
    own = np.arange(10, 60)
    p = fjp.partition_from_index_lists(TRAIN, TEST, LISTS, target_client=5,
                                       target_test_indices=own, seed=0)
    assert sorted(p.target_test_indices.tolist()) == own.tolist()
    np.testing.assert_allclose(p.target_label_dist, np.bincount(TRAIN[LISTS[5]], minlength=K) / 50)
    _is_a_partition(p)


@pytest.mark.parametrize("how", ["given", "own_test", "test_split"])
def test_without_a_target_list_T_comes_from_elsewhere_and_validation_from_free_rows(how):
    clients = LISTS[:4]  # rows 200..299 are no client's
    given = np.array([0.5, 0.5, 0.0])
    own = np.arange(100, 160)
    keys = {"given": dict(target_label_dist=given), "own_test": dict(target_test_indices=own),
            "test_split": {}}[how]
    p = fjp.partition_from_index_lists(TRAIN, TEST, clients, seed=0, **keys)
    expected = {"given": given,
                "own_test": np.bincount(TEST[own], minlength=K) / own.size,
                "test_split": np.bincount(TEST, minlength=K) / TEST.size}[how]
    np.testing.assert_allclose(p.target_label_dist, expected)  # exactly, not rounded
    assert p.num_clients == 4
    assert [_rows(p, i) for i in range(4)] == [sorted(c.tolist()) for c in clients]
    val = p.target_val_indices
    assert val.size > 30 and val.min() >= 200  # only the free rows
    val_dist = np.bincount(TRAIN[val], minlength=K) / val.size
    np.testing.assert_allclose(val_dist, expected, atol=0.03)
    if how == "own_test":
        assert sorted(p.target_test_indices.tolist()) == own.tolist()
    else:
        drawn = p.target_test_indices
        test_dist = np.bincount(TEST[drawn], minlength=K) / drawn.size
        np.testing.assert_allclose(test_dist, expected, atol=0.02)
    _is_a_partition(p)
    # val_size draws fewer.
    assert fjp.partition_from_index_lists(
        TRAIN, TEST, clients, seed=0, val_size=12, **keys).target_val_indices.size == 12


@pytest.mark.parametrize("lists, keys, message", [
    ([[0, 1], [1, 2]], {}, r"row 1 is in both client_indices\[0\] and client_indices\[1\]"),
    ([[0, 0], [1, 2]], {}, r"client_indices\[0\] holds row 0 twice"),
    ([[0, 300], [1, 2]], {}, r"client_indices\[0\] holds row 300, outside the train split's "
     r"\[0, 300\)"),
    ([[0, -1], [1, 2]], {}, r"holds row -1, outside"),
    ([[0, 1], []], {}, r"client_indices\[1\] is empty .* drop the empty lists"),
    ([[0.5, 1], [2]], {}, r"client_indices\[0\] must hold integer row numbers"),
    ([[True, False], [2]], {}, r"client_indices\[0\] must hold integer row numbers"),
    ([[0, 1]], {}, r"client_indices must hold 2 or more lists"),
    ("0,1", {}, r"client_indices must be a sequence of index lists"),
    (LISTS, dict(target_client=6), r"target_client must be an integer in \[0, 5\]"),
    (LISTS, dict(target_client=range(6)), r"target_client must name 1 to 5 of the 6 lists"),
    (LISTS, {}, r"no list holds, and none of them is of class\(es\) \[0, 1, 2\].*target_client"),
    (LISTS, dict(target_client=0, target_label_dist=[1, 0, 0]),
     r"give target_client or target_label_dist, not both"),
    (LISTS[:4], dict(target_label_dist=[0.5, 0.5]), r"target_label_dist has 2 values, but there "
     r"are K=3 classes"),
    (LISTS[:4], dict(target_label_dist=[0.5, 0.6, 0]), r"target_label_dist must sum to 1"),
    (LISTS, dict(target_client=0, target_test_indices=[1, 2, 3]),
     r"target_test_indices holds 3 test examples, fewer than min_target_test_size=30"),
    (LISTS, dict(target_client=0, target_test_indices=range(195, 235)),
     r"target_test_indices holds row 200, outside the test split's \[0, 200\)"),
])
def test_bad_lists_and_targets_are_one_clear_error(lists, keys, message):
    with pytest.raises(ValueError, match=message):
        fjp.partition_from_index_lists(TRAIN, TEST, lists, seed=0, **keys)


class _Table:
    """A slice as flwr-datasets returns it (a Hugging Face `datasets.Dataset`): columns."""

    def __init__(self, columns):
        self.columns = columns
        self.column_names = list(columns)

    def __getitem__(self, name):
        return self.columns[name]


class _Partitioner:
    """flwr-datasets' Partitioner interface: num_partitions and load_partition(i)."""

    def __init__(self, lists, column="row"):
        self.lists, self.column = lists, column
        self.num_partitions = len(lists)

    def load_partition(self, partition_id):
        rows = self.lists[partition_id]
        return _Table({self.column: list(rows), "label": TRAIN[rows].tolist()})


def test_the_lists_are_read_from_a_partitioners_row_column():
    lists = fjp.index_lists_from_partitioner(_Partitioner(LISTS))
    assert [row.tolist() for row in lists] == [row.tolist() for row in LISTS]
    named = fjp.index_lists_from_partitioner(_Partitioner(LISTS, "idx"), index_column="idx")
    assert [row.tolist() for row in named] == [row.tolist() for row in LISTS]
    with pytest.raises(ValueError, match=r"partition 0 has no column 'row' of row numbers \(its "
                       r"columns: \['idx', 'label'\]\).*ds.add_column\('row'"):
        fjp.index_lists_from_partitioner(_Partitioner(LISTS, "idx"))
    with pytest.raises(ValueError, match="expected a flwr-datasets Partitioner"):
        fjp.index_lists_from_partitioner(LISTS)


def test_the_json_file_round_trips_and_bad_files_are_named(tmp_path):
    path = fjp.save_index_lists(tmp_path / "c.json", LISTS, target_client=5,
                                target_test_indices=np.arange(40))
    record = fjp.load_index_lists(path)
    assert record["target_client"] == 5 and record["target_test_indices"] == list(range(40))
    assert [list(r) for r in record["client_indices"]] == [r.tolist() for r in LISTS]
    p = fjp.partition_from_index_lists(TRAIN, TEST, **record, seed=0)
    assert p.num_clients == 5 and sorted(p.target_test_indices.tolist()) == list(range(40))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[[0, 1], [2]]")
    (tmp_path / "key.json").write_text('{"clients": [[0], [1]], "target": 1}')
    for name, message in (("missing.json", "does not exist"), ("bad.json", "is not JSON"),
                          ("list.json", 'must hold an object with "clients"'),
                          ("key.json", r"unknown key\(s\) \['target'\]")):
        with pytest.raises(ValueError, match=message):
            fjp.load_index_lists(tmp_path / name)


def _register_table():
    def load():
        rng = np.random.default_rng(3)
        means = rng.normal(scale=3.0, size=(K, 4))

        def split(y):
            return fjp.LabeledSplit((means[y] + rng.normal(size=(y.size, 4))).astype(np.float32),
                                    y.astype(np.int32))

        return fjp.Dataset("il_table", split(TRAIN), split(TEST), K, "test table")

    fjp.register_dataset("il_table", load, num_classes=K, num_train=TRAIN.size, images=False)


def _config(path):
    config = fjp.default_config()
    config.dataset.name, config.model = "il_table", "logistic_regression"
    config.partition.scheme = "index_lists"
    config.partition.index_lists_file = None if path is None else str(path)
    config.training.rounds, config.training.batch_size = 1, 16
    return config


def test_the_scheme_index_lists_makes_a_runs_clients_from_the_file(registries_restored, tmp_path):
    _register_table()
    path = fjp.save_index_lists(tmp_path / "clients.json", LISTS, target_client=0)
    resolved = fjp.validate_config(_config(path))
    assert resolved.partition.num_clients == 6  # the file's lists, the target included
    assert resolved.partition.labels_per_client is None
    _, partition = task_lib.load_data(resolved)
    assert [_rows(partition, i) for i in range(5)] == [sorted(r.tolist()) for r in LISTS[1:]]
    assert partition.description.startswith("index lists of clients.json (sha256 ")
    # Without a target list, the target is one more client (T of the test split).
    fjp.save_index_lists(tmp_path / "four.json", LISTS[:4])
    assert fjp.validate_config(_config(tmp_path / "four.json")).partition.num_clients == 5
    # A bad file stops the config, naming the key; bad lists stop the build, naming the file.
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.index_lists_file: index "
                       "lists file .* does not exist"):
        fjp.validate_config(_config(tmp_path / "nowhere.json"))
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.index_lists_file: "
                       r"target_client must be an integer in \[0, 5\]"):
        fjp.validate_config(_config(fjp.save_index_lists(tmp_path / "t.json", LISTS,
                                                         target_client=9)))
    with pytest.raises(fjp.ConfigError, match="index_lists_file is None"):
        fjp.validate_config(_config(None))
    overlapping = fjp.save_index_lists(tmp_path / "o.json", [[0, 1], [1, 2], [3, 4]],
                                       target_client=2)
    with pytest.raises(Exception, match=r"index_lists_file .*o\.json.*row 1 is in both"):
        task_lib.load_data(fjp.validate_config(_config(overlapping)))


# ---- flwr-datasets' own partitioners ---------------------------------------------------

FLOWER_SCRIPT = """
import json, sys
import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import (
    DirichletPartitioner, IidPartitioner, PathologicalPartitioner)

labels = json.load(open(sys.argv[1]))
out = {}
for name, partitioner in (
    ("iid", IidPartitioner(num_partitions=5)),
    ("dirichlet", DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.5,
                                       min_partition_size=10, seed=1)),
    ("pathological", PathologicalPartitioner(num_partitions=5, partition_by="label",
                                             num_classes_per_partition=2, seed=1)),
):
    table = Dataset.from_dict({"x": [[float(v)] for v in labels], "label": labels})
    partitioner.dataset = table.add_column("row", list(range(len(table))))
    lists = index_lists_from_partitioner(partitioner)
    out[name] = {
        "lists": [row.tolist() for row in lists],
        "labels": [list(partitioner.load_partition(i)["label"])
                   for i in range(partitioner.num_partitions)],
    }
json.dump(out, open(sys.argv[2], "w"))
"""


def _flower_python():
    if importlib.util.find_spec("flwr_datasets") is not None:
        return sys.executable
    python = os.environ.get("FEDJAX_PALS_FLOWER_PYTHON")
    if python:
        return python
    if os.environ.get("FEDJAX_PALS_FLOWER_TESTS"):
        pytest.fail("FEDJAX_PALS_FLOWER_TESTS is set but neither this interpreter has "
                    "flwr_datasets nor FEDJAX_PALS_FLOWER_PYTHON names one that has (.ci/run "
                    "makes .venv-flower from requirements/flower.txt)")
    pytest.skip("flwr-datasets is not installed (pip install 'fedjax_pals[flower]', or "
                "FEDJAX_PALS_FLOWER_PYTHON=<a python that has it>)")


def test_flower_partitioners_give_the_lists_of_a_partition(tmp_path):
    python = _flower_python()
    # The adapter's own source runs in Flower's interpreter (it needs only NumPy there).
    source = inspect.getsource(index_lists.index_lists_from_partitioner)
    script = ("from __future__ import annotations\nimport numpy as np\nfrom typing import Any\n"
              + textwrap.dedent(source) + FLOWER_SCRIPT)
    (tmp_path / "labels.json").write_text(json.dumps(TRAIN.tolist()))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    done = subprocess.run(
        [python, "-c", script, str(tmp_path / "labels.json"), str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    for name, got in out.items():
        lists = got["lists"]
        # The lists are row numbers of the table: their labels are the partitions' labels.
        for rows, labels in zip(lists, got["labels"]):
            assert TRAIN[rows].tolist() == labels, name
        assert sorted(np.concatenate(lists).tolist()) == list(range(TRAIN.size)), name
        path = fjp.save_index_lists(tmp_path / f"{name}.json", lists, target_client=4)
        p = fjp.partition_from_index_lists(TRAIN, TEST, **fjp.load_index_lists(path), seed=0)
        assert [_rows(p, i) for i in range(4)] == [sorted(r) for r in lists[:4]], name
        assert sorted(p.target_val_indices.tolist()) == sorted(lists[4]), name
        _is_a_partition(p)
        if name == "iid":
            assert [len(r) for r in lists] == [60] * 5
        if name == "pathological":  # two classes a client
            assert all(np.count_nonzero(c) <= 2 for c in p.client_label_counts)


@pytest.mark.integration
def test_a_run_trains_on_the_clients_of_an_index_lists_file(registries_restored, tmp_path):
    _register_table()
    path = fjp.save_index_lists(tmp_path / "clients.json", LISTS, target_client=5)
    results = fjp.train_and_evaluate(_config(path), tmp_path / "run", quiet=True)
    assert results["config"]["partition"]["index_lists_file"] == str(path)
    assert results["partition"]["client_sizes"] == [50] * 5
    assert len(results["rounds"]) == 1


# ---- docs/guide/flower_fedjax.md -------------------------------------------------------

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                     "guide", "flower_fedjax.md")


def _guide_blocks():
    import re

    with open(GUIDE) as f:
        text = f.read()
    return {tag: body for tag, body in re.findall(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S)}


def test_the_guides_python_block_prints_what_the_guide_says(registries_restored, tmp_path,
                                                             monkeypatch, capsys):
    blocks = _guide_blocks()
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks["python"], GUIDE, "exec"), {})
    assert capsys.readouterr().out == blocks["text"]
    assert fjp.load_index_lists(tmp_path / "clients.json")["target_client"] == 5


def test_the_guides_flower_block_runs_in_flowers_environment(tmp_path):
    """The guide's ```py block (flwr-datasets' DirichletPartitioner, the rows as JSON), run as
    written in an interpreter that has flwr-datasets; its file makes a partition here."""
    python = _flower_python()
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    done = subprocess.run([python, "-c", _guide_blocks()["py"]], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    record = fjp.load_index_lists(tmp_path / "clients.json")
    lists = record["client_indices"]
    assert len(lists) == 11 and record["target_client"] == 10
    assert sorted(np.concatenate(lists).tolist()) == list(range(2000))
    labels = np.random.default_rng(0).integers(0, 4, 2000)  # the block's table
    p = fjp.partition_from_index_lists(labels, np.arange(400) % 4, **record, seed=0)
    assert p.num_clients == 10 and min(p.client_sizes) >= 20  # its min_partition_size
    assert sorted(p.target_val_indices.tolist()) == sorted(lists[10])
