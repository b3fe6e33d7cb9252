"""The LEAF JSON reader (fedjax_pals/data/formats/leaf.py): tiny files written in LEAF's
schema (github.com/TalwalkarLab/leaf, data/utils/split_data.py) read back per client and split,
and each damaged file refused in one line naming the file and the user."""

import json
import pathlib
import re

import numpy as np
import pytest

import fedjax_pals.data.formats.leaf as leaf  # registers "leaf"
from fedjax_pals.data import load_dataset
from fedjax_pals.data.natural import DataFileError, ReaderOptions

# LEAF's ALL_LETTERS (models/utils/language_utils.py), written out here independently of
# fedjax_pals.data.vocabulary.
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def _pixels(seed: int, n: int) -> np.ndarray:
    """n FEMNIST-like examples: 784 values k, written to the file as k / 255."""
    return np.random.default_rng(seed).integers(0, 256, (n, 784)).astype(np.uint8)


def _write(path: pathlib.Path, document) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def _femnist_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """LEAF's data/femnist/data with train/ and test/, as split_data.py writes it (a dropped
    user left as an empty entry in user_data, hierarchies after user_data)."""
    k = {("f_a", "train"): _pixels(0, 3), ("f_b", "train"): _pixels(1, 2),
         ("f_a", "test"): _pixels(2, 1), ("f_b", "test"): _pixels(3, 2)}
    y = {("f_a", "train"): [4, 0, 61], ("f_b", "train"): [7, 7],
         ("f_a", "test"): [3], ("f_b", "test"): [1, 2]}
    for split in ("train", "test"):
        _write(tmp_path / "femnist" / split / f"all_data_0_niid_0_keep_0_{split}_9.json", {
            "users": ["f_a", "f_b"],
            "num_samples": [len(y["f_a", split]), len(y["f_b", split])],
            "user_data": {
                "f_dropped": {"x": [], "y": []},
                "f_a": {"x": (k["f_a", split] / 255).tolist(), "y": y["f_a", split]},
                "f_b": {"x": (k["f_b", split] / 255).tolist(), "y": y["f_b", split]},
            },
            "hierarchies": ["w1", "w2"],
        })
    return tmp_path / "femnist", {key: (k[key], np.array(y[key])) for key in k}


def _rows(dataset, split: str, client: str):
    ids = dataset.client_ids if split == "train" else dataset.test_client_ids
    data = dataset.train if split == "train" else dataset.test
    rows = ids == dataset.client_names.index(client)
    return data.x[rows], data.y[rows]


def test_femnist_directory_reads_each_users_pixels_as_uint8_per_split(tmp_path):
    path, written = _femnist_dir(tmp_path)
    dataset = load_dataset("leaf", data_dir=path, input_shape=(28, 28, 1), num_classes=62)
    assert dataset.client_names == ("f_a", "f_b")
    assert dataset.train.x.dtype == np.uint8 and dataset.train.x.shape == (5, 28, 28, 1)
    assert dataset.num_classes == 62
    for (client, split), (k, y) in written.items():
        x_read, y_read = _rows(dataset, split, client)
        np.testing.assert_array_equal(x_read.reshape(len(k), 784), k)
        np.testing.assert_array_equal(y_read, y)
    # The model sees the file's floats k / 255.
    np.testing.assert_allclose(dataset.model_inputs(dataset.test.x[:1]).ravel(),
                               written["f_a", "test"][0][0] / 255, rtol=1e-6)
    facts = leaf.describe(path, ReaderOptions(input_shape=(28, 28, 1)))
    assert (facts.num_train, facts.num_client_ids, facts.input_shape, facts.client_names) == (
        len(dataset.train), dataset.num_client_ids, dataset.train.x.shape[1:],
        dataset.client_names)


def test_shakespeare_file_is_encoded_as_leaf_letter_indices(tmp_path):
    lines = {"THE_TEMPEST_PROSPERO": ["To be, or not to be: that is the question!".ljust(80, "}"),
                                      "Whether 'tis nobler in the mind to suffer\n".ljust(80, "?")],
             "HAMLET_HORATIO": ["(ALL) 0123456789 & [more] - more; done>".ljust(80, ".")]}
    targets = {"THE_TEMPEST_PROSPERO": ["a", "\n"], "HAMLET_HORATIO": ["Z"]}
    path = _write(tmp_path / "shakespeare.json", {
        "users": list(lines), "num_samples": [2, 1],
        "user_data": {u: {"x": lines[u], "y": targets[u]} for u in lines},
    })
    dataset = load_dataset("leaf", data_dir=path)
    assert dataset.train.x.dtype == np.int32 and dataset.train.x.shape == (3, 80)
    assert dataset.num_classes == 80 and len(dataset.test) == 0
    for user in lines:
        x_read, y_read = _rows(dataset, "train", user)
        np.testing.assert_array_equal(x_read, [[LETTERS.index(c) for c in s] for s in lines[user]])
        np.testing.assert_array_equal(y_read, [LETTERS.index(c) for c in targets[user]])
    facts = leaf.describe(path, ReaderOptions())
    assert (facts.num_train, facts.num_client_ids, facts.input_shape, facts.num_classes) == (
        3, 2, (80,), 80)


def test_directory_of_json_files_is_one_training_split(tmp_path):
    for i, user in enumerate(["u1", "u2"]):
        _write(tmp_path / "d" / f"part_{i}.json", {
            "users": [user], "num_samples": [2],
            "user_data": {user: {"x": [[i, 1.5], [2.5, i]], "y": [i, 1]}},
        })
    dataset = load_dataset("leaf", data_dir=tmp_path / "d")
    assert dataset.client_names == ("u1", "u2") and len(dataset.test) == 0
    assert dataset.train.x.dtype == np.float32
    np.testing.assert_array_equal(dataset.train.x, [[0, 1.5], [2.5, 0], [1, 1.5], [2.5, 1]])
    np.testing.assert_array_equal(dataset.client_ids, [0, 0, 1, 1])


def _one_user(x, y, num_samples=None, user="w_7"):
    return {"users": [user], "num_samples": [len(y) if num_samples is None else num_samples],
            "user_data": {user: {"x": x, "y": y}}}


def _bad_files(tmp_path: pathlib.Path) -> dict:
    """{case: (data_dir, the file named, the user named, load options)}."""
    ok = _one_user([[0.0, 1.0]], [1])
    cases = {}

    def add(case, document, user="w_7", options=None, raw=None):
        path = tmp_path / case / "train" / f"{case}.json"
        if raw is None:
            _write(path, document)
        else:
            path.parent.mkdir(parents=True)
            path.write_bytes(raw)
        cases[case] = (tmp_path / case, path.name, user, options or {})
        return path

    add("truncated", None, user=None, raw=json.dumps(ok).encode()[:30])
    add("foreign", None, user=None, raw=b"PAR1\x15\x04\x15\x10\x15\x14L\x15\x02\x15\x00")
    add("zero_examples", _one_user([], [], user="w_empty"), user="w_empty")
    add("label_out_of_range", _one_user([[0.0, 1.0]], [5]), options={"num_classes": 3})
    add("another_shape", {"users": ["w_0", "w_7"], "num_samples": [1, 1], "user_data": {
        "w_0": {"x": [[0.0, 1.0]], "y": [0]}, "w_7": {"x": [[0.0, 1.0, 0.5]], "y": [1]}}})
    add("num_samples_disagree", _one_user([[0.0, 1.0], [1.0, 0.0]], [1, 0], num_samples=3))
    add("not_in_vocabulary", _one_user(["caf\u00e9 au lait"], ["e"]))
    add("sent140", _one_user([["1467810369", "Mon Apr 06", "NO_QUERY", "w_7", "hi"]], [0]))
    add("no_user_data", {"users": ["w_7"], "num_samples": [1], "user_data": {}})
    add("users_and_counts_differ", {"users": ["w_7", "w_8"], "num_samples": [1],
                                    "user_data": {"w_7": {"x": [[0.0]], "y": [0]}}},
        user="w_8")
    # The same user in two training files.
    add("repeated", ok)
    _write(tmp_path / "repeated" / "train" / "second.json", ok)
    cases["repeated"] = (tmp_path / "repeated", "second.json", "w_7", {})
    # Split by user (-t user): a test user that never trains.
    add("split_by_user", ok)
    _write(tmp_path / "split_by_user" / "test" / "t.json", _one_user([[0.0, 1.0]], [1], user="w_9"))
    cases["split_by_user"] = (tmp_path / "split_by_user", "t.json", "w_9", {})
    return cases


CASES = ["truncated", "foreign", "zero_examples", "label_out_of_range", "another_shape",
         "num_samples_disagree", "not_in_vocabulary", "sent140", "no_user_data",
         "users_and_counts_differ", "repeated", "split_by_user"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_file_is_one_error_naming_the_file_and_the_user(tmp_path, case):
    data_dir, file_name, user, options = _bad_files(tmp_path)[case]
    pattern = re.escape(file_name) + (f".*{re.escape(repr(user))}" if user else "")
    with pytest.raises(DataFileError, match=pattern) as raised:
        load_dataset("leaf", data_dir=data_dir, **options)
    assert "\n" not in str(raised.value)


def test_describe_refuses_a_foreign_file_in_one_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("<html>not json</html>")
    with pytest.raises(DataFileError, match=re.escape(str(path))) as raised:
        leaf.describe(path, ReaderOptions())
    assert "\n" not in str(raised.value)


def test_check_data_dir_needs_json_files(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(ValueError, match="does not hold LEAF JSON: no train/"):
        leaf.check_data_dir(tmp_path)
    with pytest.raises(ValueError, match="does not hold LEAF JSON: nothing is there"):
        leaf.check_data_dir(tmp_path / "absent")
    _write(tmp_path / "train" / "a.json", _one_user([[0.0]], [0]))
    leaf.check_data_dir(tmp_path)


def test_config_resolves_num_clients_to_the_number_of_users(tmp_path):
    from fedjax_pals.experiment.config import validate_config

    # 12 training examples: the default partition.num_clients (10) is checked against the
    # training examples before the scheme "natural" counts the users.
    path = tmp_path / "leaf"
    for split, n in (("train", 4), ("test", 1)):
        _write(path / split / "data.json", {
            "users": ["a", "b", "c"], "num_samples": [n] * 3,
            "user_data": {u: {"x": (_pixels(i, n) / 255).tolist(), "y": [i] * n}
                          for i, u in enumerate("abc")},
        })
    resolved = validate_config({
        "dataset": {"name": "leaf", "data_dir": str(path), "input_shape": "28,28,1"},
        "partition": {"scheme": "natural", "target_client": 0},
    })
    assert resolved.partition.num_clients == 3
    assert tuple(resolved.dataset.input_shape) == (28, 28, 1)


def test_describe_and_load_number_the_users_alike_whatever_user_datas_order(tmp_path):
    """The ids follow the users list (what describe reports), not user_data's order."""
    from fedjax_pals.data.formats import leaf

    for split in ("train", "test"):
        _write(tmp_path / split / "all.json", {
            "users": ["b", "a"], "num_samples": [1, 2],
            "user_data": {"a": {"x": [[0.0, 1.0], [1.0, 0.0]], "y": [0, 1]},
                          "b": {"x": [[1.0, 1.0]], "y": [1]}}})
    facts = leaf.describe(tmp_path, leaf.ReaderOptions())
    data = leaf.load(tmp_path)
    assert facts.client_names == data.client_names == ("b", "a")
    np.testing.assert_array_equal(data.client_ids, [1, 1, 0])  # a's examples first in the file
    np.testing.assert_array_equal(data.train.y[data.client_ids == 1], [0, 1])
