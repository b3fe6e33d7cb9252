"""The TFF SQLite reader (fedjax_pals/data/formats/tff_sqlite.py) on tiny files written here in
TFF's schema (tensorflow_federated/python/simulation/datasets/sql_client_data_utils.py), with
tf.train.Examples encoded by hand in the protobuf wire format (independently of the reader,
which parses them with protobuf's own parser)."""

from __future__ import annotations

import pathlib
import sqlite3

import numpy as np
import pytest

from fedjax_pals.data import datasets, load_dataset
from fedjax_pals.data.formats import tff_sqlite
from fedjax_pals.data.natural import DataFileError
from fedjax_pals.experiment import config as config_lib

# The statements of TFF's save_to_sql_client_data.
_SCHEMA = (
    """CREATE TABLE examples (
       split_name TEXT NOT NULL,
       client_id TEXT NOT NULL,
       serialized_example_proto BLOB NOT NULL);""",
    """CREATE TABLE client_metadata (
       client_id TEXT NOT NULL,
       split_name TEXT NOT NULL,
       num_examples INTEGER NOT NULL);""",
)
PIXELS = 784  # TFF's EMNIST: 28x28 floats


# ---- tf.train.Example in the protobuf wire format ---------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten bytes, two's complement
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(kind: str, values, packed: bool = True) -> bytes:
    if kind == "float" and packed:
        body = _delimited(1, np.asarray(values, "<f4").tobytes())
    elif kind == "float":  # one fixed32 field per value: valid, if not what TF writes
        body = b"".join(_varint(1 << 3 | 5) + np.float32(v).astype("<f4").tobytes()
                        for v in values)
    elif kind == "int64":
        body = _delimited(1, b"".join(_varint(int(v)) for v in values))
    else:
        body = b"".join(_delimited(1, v) for v in values)
    return _delimited({"bytes": 1, "float": 2, "int64": 3}[kind], body)


def example(packed: bool = True, **features) -> bytes:
    """A serialized tf.train.Example of features name=(kind, values)."""
    entries = b"".join(
        _delimited(1, _delimited(1, name.encode()) + _delimited(2, _feature(*spec, packed)))
        for name, spec in features.items())
    return _delimited(1, entries)


def pixel_example(pixels: np.ndarray, label: int, packed: bool = True) -> bytes:
    return example(packed, pixels=("float", pixels), label=("int64", [label]))


# ---- Files ----------------------------------------------------------------------------


def write_tff(path: pathlib.Path, rows, metadata=None) -> pathlib.Path:
    """A TFF SQLite file of `rows` (split, client, serialized example); client_metadata
    counted from them unless `metadata` (client, split, num_examples) is given."""
    with sqlite3.connect(path) as connection:
        for statement in _SCHEMA:
            connection.execute(statement)
        connection.executemany(
            "INSERT INTO examples (split_name, client_id, serialized_example_proto) "
            "VALUES (?, ?, ?);", rows)
        if metadata is None:
            counts: dict = {}
            for split, client, _ in rows:
                counts[client, split] = counts.get((client, split), 0) + 1
            metadata = [(c, s, n) for (c, s), n in counts.items()]
        connection.executemany(
            "INSERT INTO client_metadata (client_id, split_name, num_examples) VALUES (?, ?, ?);",
            metadata)
    connection.close()
    return path


def emnist_like(seed: int = 0):
    """{split: {client: (pixels (n, 784) float32 k/255, labels)}}, clients out of order and
    their rows interleaved in the table."""
    rng = np.random.default_rng(seed)
    sizes = {"train": {"f0002": 4, "f0000": 3, "f0001": 5}, "test": {"f0000": 1, "f0002": 2}}
    data = {}
    for split, clients in sizes.items():
        data[split] = {}
        for client, n in clients.items():
            k = rng.integers(0, 256, (n, PIXELS))
            data[split][client] = ((k / 255).astype(np.float32), rng.integers(0, 10, n))
    return data


def rows_of(data, packed=True):
    """The rows of `data`, the clients' examples interleaved (round robin), each client's in
    order: the reader must group them by client and keep the table's order within one."""
    queues = [[(split, client, pixel_example(x[i], int(y[i]), packed)) for i in range(len(y))]
              for split, clients in data.items() for client, (x, y) in clients.items()]
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


@pytest.fixture
def emnist(tmp_path):
    data = emnist_like()
    return write_tff(tmp_path / "emnist.sqlite", rows_of(data)), data


# ---- Reading --------------------------------------------------------------------------


def test_clients_and_splits_read_as_written(emnist):
    path, data = emnist
    dataset = load_dataset("tff_sqlite", data_dir=path, input_shape=(28, 28, 1))
    assert dataset.client_names == ("f0000", "f0001", "f0002")  # TFF's sorted client ids
    for split, ids in (("train", dataset.client_ids), ("test", dataset.test_client_ids)):
        held = getattr(dataset, split)
        for client, (x, y) in data[split].items():
            mine = ids == dataset.client_names.index(client)
            np.testing.assert_array_equal(held.y[mine], y)
            seen = dataset.model_inputs(held.x[mine])
            assert seen.shape == (len(y), 28, 28, 1)
            np.testing.assert_array_equal(seen.reshape(len(y), -1), x)
    assert dataset.train.y.dtype == np.int32
    assert dataset.num_classes == 1 + max(int(y.max()) for c in data.values()
                                          for _, y in c.values())


def test_float32_pixels_k_over_255_are_held_as_stored_or_as_uint8(emnist):
    """float32 k/255 pixels are held exactly: as float32, or as uint8 k seen as k/255."""
    dataset = load_dataset("tff_sqlite", data_dir=emnist[0])
    assert dataset.train.x.dtype in (np.float32, np.uint8)
    if dataset.train.x.dtype == np.uint8:
        assert dataset.input_scaling == datasets.InputScaling(255.0)


def test_unpacked_floats_and_a_directory_with_one_file_read_alike(tmp_path, emnist):
    path, data = emnist
    other = tmp_path / "unpacked"
    other.mkdir()
    write_tff(other / "data.sqlite", rows_of(data, packed=False))
    a = load_dataset("tff_sqlite", data_dir=path)
    b = load_dataset("tff_sqlite", data_dir=other)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.test.y, b.test.y)
    np.testing.assert_array_equal(a.test_client_ids, b.test_client_ids)


def test_describe_gives_the_loaded_data_sets_facts(emnist):
    path, _ = emnist
    values = tff_sqlite.TFFSQLiteOptions(input_shape=(28, 28, 1))
    facts = tff_sqlite.describe(path, values)
    dataset = load_dataset("tff_sqlite", data_dir=path, input_shape=(28, 28, 1))
    assert facts.num_train == len(dataset.train)
    assert facts.num_client_ids == dataset.num_client_ids
    assert facts.input_shape == dataset.train.x.shape[1:]
    assert facts.client_names == dataset.client_names
    assert facts.num_classes is None


def test_options_name_features_and_splits(tmp_path):
    rows = [("N/A", c, example(img=("int64", [i, i + 1, -7]), extra=("float", [0.5]),
                               digit=("int64", [i % 3])))
            for i, c in enumerate(["b", "a", "b"])]
    path = write_tff(tmp_path / "saved.sqlite", rows)
    with pytest.raises(DataFileError, match=r"saved\.sqlite.*no clients of the split 'train'.*N/A"):
        load_dataset("tff_sqlite", data_dir=path, tff_label_feature="digit")
    with pytest.raises(DataFileError, match=r"client 'b'.*\['extra', 'img'\].*tff_input_feature"):
        load_dataset("tff_sqlite", data_dir=path, tff_label_feature="digit",
                     tff_train_split="N/A")
    dataset = load_dataset("tff_sqlite", data_dir=path, tff_label_feature="digit",
                           tff_train_split="N/A", tff_input_feature="img", num_classes=3)
    assert dataset.client_names == ("a", "b") and len(dataset.test) == 0
    np.testing.assert_array_equal(dataset.train.x, [[1, 2, -7], [0, 1, -7],
                                                    [2, 3, -7]])
    np.testing.assert_array_equal(dataset.train.y, [1, 0, 2])


def test_the_config_resolves_natural_clients_from_the_file(emnist):
    config = config_lib.validate_config({
        "dataset": {"name": "tff_sqlite", "data_dir": str(emnist[0]), "input_shape": "28,28,1"},
        "partition": {"scheme": "natural", "target_client": 0},
    })
    assert config.partition.num_clients == 3
    assert tuple(config.dataset.input_shape) == (28, 28, 1)


# ---- Bad files: one error naming the file and the client --------------------------------


def test_a_foreign_or_truncated_file_is_one_error(tmp_path, emnist):
    text = tmp_path / "notes.sqlite"
    text.write_text("client,label\n")
    with pytest.raises(DataFileError, match=r"notes\.sqlite.*not an SQLite file"):
        load_dataset("tff_sqlite", data_dir=text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE federated_data (client_id BLOB, data BLOB)")
    connection.close()
    with pytest.raises(DataFileError, match=r"other\.sqlite.*no table 'examples'"):
        load_dataset("tff_sqlite", data_dir=other)
    with pytest.raises(ValueError, match="does not hold TFF SQLite.*no table 'examples'"):
        tff_sqlite.check_data_dir(other)
    raw = emnist[0].read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataFileError, match=r"cut\.sqlite.*(truncated|damaged)"):
        load_dataset("tff_sqlite", data_dir=cut)


def test_a_damaged_example_names_its_client(tmp_path, emnist):
    rows = rows_of(emnist[1])
    rows[0] = (rows[0][0], rows[0][1], rows[0][2][:-3])
    path = write_tff(tmp_path / "damaged.sqlite", rows)
    with pytest.raises(DataFileError,
                       match=rf"damaged\.sqlite: client '{rows[0][1]}'.*not a serialized "
                             "tf.train.Example"):
        load_dataset("tff_sqlite", data_dir=path)


def test_a_client_without_examples_is_one_error(tmp_path, emnist):
    rows = rows_of(emnist[1])
    meta = [("f0000", "train", 3), ("f0001", "train", 5), ("f0002", "train", 4),
            ("f0003", "train", 0)]
    path = write_tff(tmp_path / "empty.sqlite", rows, meta + [("f0000", "test", 1),
                                                             ("f0002", "test", 2)])
    with pytest.raises(DataFileError, match=r"empty\.sqlite: client 'f0003' has 0 'train'"):
        load_dataset("tff_sqlite", data_dir=path)


def test_labels_out_of_range_name_the_client(emnist):
    with pytest.raises(DataFileError, match=r"emnist\.sqlite: client 'f0000'.*label \d.*\[0, 1\)"):
        load_dataset("tff_sqlite", data_dir=emnist[0], num_classes=1)


def test_a_feature_of_another_shape_names_the_client(tmp_path, emnist):
    rows = [r for r in rows_of(emnist[1]) if r[1] != "f0001"]
    rows += [("train", "f0001", pixel_example(np.zeros(PIXELS - 1, np.float32), 1))] * 5
    path = write_tff(tmp_path / "shape.sqlite", rows)
    with pytest.raises(DataFileError, match=r"shape\.sqlite: client 'f0001'.*shape \(783,\)"):
        load_dataset("tff_sqlite", data_dir=path)
    rows[-1] = ("train", "f0001", pixel_example(np.zeros(PIXELS, np.float32), 1))
    path = write_tff(tmp_path / "within.sqlite", rows)
    with pytest.raises(DataFileError, match=r"within\.sqlite: client 'f0001'.*example 4 has 784"):
        load_dataset("tff_sqlite", data_dir=path)


def test_a_client_id_given_twice_is_one_error(tmp_path, emnist):
    rows = rows_of(emnist[1])
    meta = [("f0000", "train", 3), ("f0001", "train", 5), ("f0002", "train", 4),
            ("f0001", "train", 5), ("f0000", "test", 1), ("f0002", "test", 2)]
    path = write_tff(tmp_path / "twice.sqlite", rows, meta)
    with pytest.raises(DataFileError, match=r"twice\.sqlite: client id 'f0001' appears twice"):
        load_dataset("tff_sqlite", data_dir=path)


@pytest.mark.parametrize("meta, match", [
    ([("f0000", "train", 3), ("f0001", "train", 6), ("f0002", "train", 4)],
     r"client 'f0001' has 5 'train' examples, but client_metadata declares 6"),
    ([("f0000", "train", 3), ("f0001", "train", 5)],
     r"client 'f0002' has 4 'train' examples, but client_metadata does not list it"),
    ([("f0000", "train", 3), ("f0001", "train", 5), ("f0002", "train", 4), ("f0009", "train", 1)],
     r"client 'f0009' is declared in client_metadata with 1 'train' examples"),
])
def test_counts_that_disagree_with_the_rows_name_the_client(tmp_path, emnist, meta, match):
    rows = [r for r in rows_of(emnist[1]) if r[0] == "train"]
    path = write_tff(tmp_path / "counts.sqlite", rows, meta)
    with pytest.raises(DataFileError, match=r"counts\.sqlite: " + match):
        load_dataset("tff_sqlite", data_dir=path)


def test_bytes_features_are_refused(tmp_path):
    rows = [("train", "THE_TEMPEST_ARIEL", example(snippets=("bytes", [b"Full fathom five"]),
                                                   label=("int64", [0])))]
    path = write_tff(tmp_path / "shakespeare.sqlite", rows)
    with pytest.raises(DataFileError, match=r"client 'THE_TEMPEST_ARIEL'.*'snippets' holds bytes"):
        load_dataset("tff_sqlite", data_dir=path)
    with pytest.raises(DataFileError, match="holds bytes"):
        tff_sqlite.describe(path, tff_sqlite.TFFSQLiteOptions())


def test_a_directory_must_hold_exactly_one_sqlite_file(tmp_path, emnist):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="does not hold TFF SQLite.*it has 0"):
        tff_sqlite.check_data_dir(empty)
    write_tff(tmp_path / "second.sqlite", rows_of(emnist[1]))
    with pytest.raises(ValueError, match="it has 2.*emnist.sqlite, second.sqlite"):
        tff_sqlite.check_data_dir(tmp_path)
