"""The FedJAX SQLite reader (fedjax_pals/data/formats/fedjax_sqlite.py) on tiny files written
here in FedJAX's schema (fedjax/core/sqlite_federated_data.py) and serialization
(fedjax/core/serialization.py: msgpack ext types 1 for arrays, 4 for arrays of bytes; zlib)."""

from __future__ import annotations

import pathlib
import sqlite3
import zlib

import msgpack
import numpy as np
import pytest

from fedjax_pals.data import load_dataset
from fedjax_pals.data.formats import fedjax_sqlite
from fedjax_pals.data.natural import DataFileError
from fedjax_pals.experiment import config as config_lib

_SCHEMA = """CREATE TABLE federated_data (
    client_id BLOB NOT NULL PRIMARY KEY,
    data BLOB NOT NULL,
    num_examples INTEGER NOT NULL
  );"""


def _pack_ext(value):
    """FedJAX's msgpack encoders: ndarrays (ext 1), arrays of bytes (ext 4)."""
    if isinstance(value, np.ndarray) and value.dtype.hasobject:
        flat = list(value.flatten())
        return msgpack.ExtType(4, msgpack.packb((value.shape, flat), use_bin_type=True))
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(1, msgpack.packb(
            (value.shape, value.dtype.name, value.tobytes("C")), use_bin_type=True))
    raise TypeError(f"cannot pack {value!r}")


def serialize(examples: dict) -> bytes:
    """A client's data column: zlib of FedJAX's msgpack_serialize."""
    return zlib.compress(msgpack.packb(examples, default=_pack_ext, strict_types=True))


def write_fedjax(path: pathlib.Path, clients) -> pathlib.Path:
    """A FedJAX SQLite file of `clients`: (client_id, examples dict[, num_examples])."""
    with sqlite3.connect(path) as connection:
        connection.execute(_SCHEMA)
        for client in clients:
            client_id, examples = client[0], client[1]
            n = client[2] if len(client) > 2 else len(next(iter(examples.values())))
            data = examples if isinstance(examples, bytes) else serialize(examples)
            connection.execute(
                "INSERT INTO federated_data (client_id, data, num_examples) VALUES (?, ?, ?);",
                (client_id, data, n))
    connection.close()
    return path


def emnist_like(seed: int = 0):
    """{split: [(client id, {"x": (n, 28, 28) float32, "y": (n,) int32})]}, not sorted by id."""
    rng = np.random.default_rng(seed)
    sizes = {"train": [(b"f0002_27", 4), (b"f0000_14", 3), (b"f0001_41", 5)],
             "test": [(b"f0000_14", 1), (b"f0002_27", 2)]}
    return {split: [(cid, {"x": (rng.integers(0, 256, (n, 28, 28)) / 255).astype(np.float32),
                           "y": rng.integers(0, 10, n).astype(np.int32)}) for cid, n in clients]
            for split, clients in sizes.items()}


@pytest.fixture
def emnist(tmp_path):
    data = emnist_like()
    train = write_fedjax(tmp_path / "emnist_train.sqlite", data["train"])
    write_fedjax(tmp_path / "emnist_test.sqlite", data["test"])
    return train, data


def test_clients_and_splits_read_as_written(emnist):
    path, data = emnist
    dataset = load_dataset("fedjax_sqlite", data_dir=path, input_shape=(28, 28, 1))
    # FedJAX's order: rowid, not sorted.
    assert dataset.client_names == ("f0002_27", "f0000_14", "f0001_41")
    for split, ids in (("train", dataset.client_ids), ("test", dataset.test_client_ids)):
        held = getattr(dataset, split)
        for client_id, examples in data[split]:
            mine = ids == dataset.client_names.index(client_id.decode())
            np.testing.assert_array_equal(held.y[mine], examples["y"])
            seen = dataset.model_inputs(held.x[mine])
            assert seen.shape == (len(examples["y"]), 28, 28, 1)
            np.testing.assert_array_equal(seen[..., 0], examples["x"])
    assert dataset.train.y.dtype == np.int32
    assert dataset.train.x.dtype in (np.float32, np.uint8)


def test_a_directory_with_the_train_and_test_files_reads_alike(emnist):
    path, _ = emnist
    a = load_dataset("fedjax_sqlite", data_dir=path)
    b = load_dataset("fedjax_sqlite", data_dir=path.parent)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.test.y, b.test.y)
    np.testing.assert_array_equal(a.test_client_ids, b.test_client_ids)
    assert len(a.test) == 3


def test_a_train_file_without_a_test_sibling_has_no_test_split(tmp_path):
    data = emnist_like()
    path = write_fedjax(tmp_path / "only_train.sqlite", data["train"])
    dataset = load_dataset("fedjax_sqlite", data_dir=path)
    assert len(dataset.train) == 12 and len(dataset.test) == 0


def test_describe_gives_the_loaded_data_sets_facts(emnist):
    path, _ = emnist
    values = fedjax_sqlite.FedJAXSQLiteOptions(input_shape=(28, 28, 1))
    facts = fedjax_sqlite.describe(path, values)
    dataset = load_dataset("fedjax_sqlite", data_dir=path, input_shape=(28, 28, 1))
    assert facts.num_train == len(dataset.train)
    assert facts.num_client_ids == dataset.num_client_ids
    assert facts.input_shape == dataset.train.x.shape[1:]
    assert facts.client_names == dataset.client_names


def test_options_name_the_features(tmp_path):
    rng = np.random.default_rng(1)
    clients = [(f"c{i}".encode(), {"image": rng.integers(0, 256, (2, 4, 4, 3), np.uint8),
                                    "label": np.array([i, i + 50], np.int64),
                                    "coarse_label": np.array([0, 1], np.int64)})
               for i in range(5)]
    path = write_fedjax(tmp_path / "cifar100_train.sqlite", clients)
    with pytest.raises(DataFileError, match=r"client 'c0' has no label feature 'y'"):
        load_dataset("fedjax_sqlite", data_dir=path)
    with pytest.raises(DataFileError, match=r"\['coarse_label', 'image'\].*fedjax_input_feature"):
        load_dataset("fedjax_sqlite", data_dir=path, fedjax_label_feature="label")
    dataset = load_dataset("fedjax_sqlite", data_dir=path, fedjax_label_feature="label",
                           fedjax_input_feature="image", num_classes=100)
    np.testing.assert_array_equal(dataset.train.x, np.concatenate([c[1]["image"] for c in clients]))
    assert dataset.train.x.dtype == np.uint8 and dataset.num_classes == 100


def test_the_config_resolves_natural_clients_from_the_file(emnist):
    config = config_lib.validate_config({
        "dataset": {"name": "fedjax_sqlite", "data_dir": str(emnist[0]),
                    "input_shape": "28,28,1"},
        "partition": {"scheme": "natural", "target_client": 0},
    })
    assert config.partition.num_clients == 3


# ---- Bad files: one error naming the file and the client --------------------------------


def test_a_foreign_or_truncated_file_is_one_error(tmp_path, emnist):
    text = tmp_path / "notes_train.sqlite"
    text.write_text("client,label\n")
    with pytest.raises(DataFileError, match=r"notes_train\.sqlite.*not an SQLite file"):
        load_dataset("fedjax_sqlite", data_dir=text)
    tff = tmp_path / "tff_train.sqlite"
    with sqlite3.connect(tff) as connection:
        connection.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT "
                           "NOT NULL, serialized_example_proto BLOB NOT NULL)")
    connection.close()
    with pytest.raises(DataFileError, match=r"tff_train\.sqlite has no table federated_data"):
        load_dataset("fedjax_sqlite", data_dir=tff)
    with pytest.raises(ValueError, match="does not hold FedJAX SQLite"):
        fedjax_sqlite.check_data_dir(tff)
    raw = emnist[0].read_bytes()
    cut = tmp_path / "cut" / "cut_train.sqlite"
    cut.parent.mkdir()
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(DataFileError, match=r"cut_train\.sqlite.*(truncated|damaged)"):
        load_dataset("fedjax_sqlite", data_dir=cut)


@pytest.mark.parametrize("blob, match", [
    (zlib.compress(b"\xc1\xc1"), "not FedJAX's msgpack"),
    (serialize({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int32)})[:-4],
     "not zlib-compressed"),
    (zlib.compress(msgpack.packb([1, 2])), "a msgpack list, not a dict"),
])
def test_a_damaged_row_names_its_client(tmp_path, blob, match):
    good = {"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int32)}
    path = write_fedjax(tmp_path / "bad_train.sqlite", [(b"a", good), (b"b", blob, 2)])
    with pytest.raises(DataFileError, match=rf"bad_train\.sqlite: client 'b' .*{match}"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_a_client_without_examples_is_one_error(tmp_path):
    clients = [(b"a", {"x": np.ones((2, 3), np.float32), "y": np.array([0, 1], np.int32)}),
               (b"b", {"x": np.ones((0, 3), np.float32), "y": np.zeros(0, np.int32)})]
    path = write_fedjax(tmp_path / "empty_train.sqlite", clients)
    with pytest.raises(DataFileError, match=r"empty_train\.sqlite: client 'b' has no train"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_labels_out_of_range_name_the_client(emnist):
    with pytest.raises(DataFileError, match=r"emnist_train\.sqlite: client 'f0002_27'.*\[0, 1\)"):
        load_dataset("fedjax_sqlite", data_dir=emnist[0], num_classes=1)


def test_a_feature_of_another_shape_names_the_client(tmp_path):
    clients = [(b"a", {"x": np.ones((2, 3), np.float32), "y": np.array([0, 1], np.int32)}),
               (b"b", {"x": np.ones((2, 4), np.float32), "y": np.array([0, 1], np.int32)})]
    path = write_fedjax(tmp_path / "shape_train.sqlite", clients)
    with pytest.raises(DataFileError, match=r"shape_train\.sqlite: client 'b'.*shape \(4,\)"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_a_client_id_given_twice_is_one_error(tmp_path):
    """The primary key tells the BLOB b'a' from the TEXT 'a'; as client names they are one."""
    examples = {"x": np.ones((2, 3), np.float32), "y": np.array([0, 1], np.int32)}
    path = write_fedjax(tmp_path / "twice_train.sqlite", [(b"a", examples), ("a", examples)])
    with pytest.raises(DataFileError, match=r"twice_train\.sqlite: client id 'a' appears twice"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_num_examples_disagreeing_with_the_data_names_the_client(tmp_path):
    examples = {"x": np.ones((2, 3), np.float32), "y": np.array([0, 1], np.int32)}
    path = write_fedjax(tmp_path / "counts_train.sqlite", [(b"a", examples), (b"b", examples, 3)])
    with pytest.raises(DataFileError,
                       match=r"counts_train\.sqlite: client 'b' has 2 inputs and 2 labels, but "
                             "num_examples 3"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_bytes_features_are_refused(tmp_path):
    tokens = np.array([b"hello world", b"federated"], dtype=object)
    path = write_fedjax(tmp_path / "stackoverflow_train.sqlite",
                        [(b"u1", {"tokens": tokens, "y": np.array([0, 1], np.int32)})])
    with pytest.raises(DataFileError, match=r"client 'u1' feature 'tokens' holds bytes"):
        load_dataset("fedjax_sqlite", data_dir=path)


def test_a_directory_needs_one_train_file(tmp_path, emnist):
    write_fedjax(tmp_path / "other_train.sqlite", emnist[1]["train"])
    with pytest.raises(ValueError, match="does not hold FedJAX SQLite.*one .* named \\*train\\*"):
        fedjax_sqlite.check_data_dir(tmp_path)
