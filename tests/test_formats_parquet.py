"""The Parquet reader (fedjax_pals/data/formats/parquet.py): tiny tables in the Hugging Face /
Flower Datasets convention (a client-id column, NaturalIdPartitioner(partition_by=...); images
as the HF "Image" struct {bytes, path}) read back per client and split, and each bad table
refused in one line naming the file and the client."""

import io
import pathlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import fedjax_pals.data.formats.parquet as parquet  # registers "parquet"
from fedjax_pals.data import load_dataset
from fedjax_pals.data.natural import DataFileError


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _rows(dataset, split: str, client: str):
    ids = dataset.client_ids if split == "train" else dataset.test_client_ids
    data = dataset.train if split == "train" else dataset.test
    rows = ids == dataset.client_names.index(client)
    return data.x[rows], data.y[rows]


def _facts_match(dataset, path, **options):
    facts = parquet.describe(path, parquet.ParquetOptions(**options))
    assert (facts.num_train, facts.num_client_ids, facts.input_shape, facts.num_classes,
            facts.client_names) == (len(dataset.train), dataset.num_client_ids,
                                    dataset.train.x.shape[1:], dataset.num_classes,
                                    dataset.client_names)


def test_image_structs_with_a_split_column_are_decoded_per_client(tmp_path):
    rng = np.random.default_rng(0)
    # Int writer ids, rows of a client not contiguous, a split column (HF "train"/"test").
    writers = [7, 3, 7, 3, 7, 12, 12, 3]
    splits = ["train", "train", "test", "train", "train", "train", "test", "test"]
    images = [rng.integers(0, 256, (5, 4, 3), dtype=np.uint8) for _ in writers]
    labels = [0, 4, 2, 1, 3, 9, 5, 6]
    path = tmp_path / "femnist.parquet"
    pq.write_table(pa.table({
        "writer_id": writers,
        "image": [{"bytes": _png(a), "path": f"{i}.png"} for i, a in enumerate(images)],
        "character": labels,
        "split": splits,
    }), path)
    options = dict(parquet_client_column="writer_id", parquet_input_column="image",
                   parquet_label_column="character", parquet_split_column="split")
    dataset = load_dataset("parquet", data_dir=path, **options)
    assert dataset.train.x.dtype == np.uint8 and dataset.train.x.shape == (5, 5, 4, 3)
    assert sorted(dataset.client_names) == ["12", "3", "7"] and len(dataset.test) == 3
    for client in ("7", "3", "12"):
        for split in ("train", "test"):
            rows = [i for i, (w, s) in enumerate(zip(writers, splits))
                    if str(w) == client and s == split]
            x_read, y_read = _rows(dataset, split, client)
            np.testing.assert_array_equal(x_read, np.array([images[i] for i in rows]))
            np.testing.assert_array_equal(y_read, [labels[i] for i in rows])
    _facts_match(dataset, path, **options)


def test_grey_images_are_height_by_width(tmp_path):
    pixels = [np.full((3, 2), v, np.uint8) for v in (0, 128, 255)]
    path = tmp_path / "grey.parquet"
    pq.write_table(pa.table({"client_id": ["a", "a", "b"], "label": [0, 1, 0],
                             "x": [{"bytes": _png(p), "path": None} for p in pixels]}), path)
    dataset = load_dataset("parquet", data_dir=path, parquet_test_fraction=0.0)
    np.testing.assert_array_equal(dataset.train.x, np.stack(pixels))
    assert dataset.train.x.dtype == np.uint8 and len(dataset.test) == 0


def test_shards_of_nested_lists_hold_out_each_clients_last_rows(tmp_path, monkeypatch):
    # Batches of 3 rows: clients span batches and shards, interleaved.
    monkeypatch.setattr(parquet, "_BATCH_ROWS", 3)
    rng = np.random.default_rng(1)
    shards = {"train-00000-of-00002.parquet": ["u", "v", "u", "w", "u"],
              "train-00001-of-00002.parquet": ["v", "u", "v", "w", "v", "u"]}
    written = {}
    position = 0
    kind = pa.list_(pa.list_(pa.float32(), 2))  # (rows, 2) per example, rows a plain list
    for name, clients in shards.items():
        x = rng.normal(size=(len(clients), 3, 2)).astype(np.float32)
        y = list(range(position, position + len(clients)))
        pq.write_table(pa.table({"client_id": clients, "label": y,
                                 "x": pa.array(x.tolist(), kind)}), tmp_path / name)
        for client, example, label in zip(clients, x, y):
            written.setdefault(client, []).append((example, label))
        position += len(clients)
    dataset = load_dataset("parquet", data_dir=tmp_path, num_classes=20)
    assert dataset.train.x.dtype == np.float32 and dataset.train.x.shape[1:] == (3, 2)
    # u: 5 rows, 1 test; v: 5 rows, 1 test; w: 2 rows, none (floor of 0.4).
    for client, examples in written.items():
        held = int(len(examples) * 0.2)
        for split, part in (("train", examples[:len(examples) - held]),
                            ("test", examples[len(examples) - held:])):
            x_read, y_read = _rows(dataset, split, client)
            np.testing.assert_array_equal(x_read, np.array([e for e, _ in part]).reshape(-1, 3, 2))
            np.testing.assert_array_equal(y_read, [label for _, label in part])
    _facts_match(dataset, tmp_path, num_classes=20)


def test_scalar_features_and_no_test_fraction(tmp_path):
    path = tmp_path / "scalars.parquet"
    pq.write_table(pa.table({"speaker": ["s1", "s2", "s1"], "y": [1, 0, 1],
                             "loudness": pa.array([0.5, -1.25, 3.0], pa.float64())}), path)
    options = dict(parquet_client_column="speaker", parquet_label_column="y",
                   parquet_input_column="loudness", parquet_test_fraction=0.0)
    dataset = load_dataset("parquet", data_dir=path, **options)
    assert dataset.train.x.shape == (3,) and len(dataset.test) == 0
    np.testing.assert_array_equal(_rows(dataset, "train", "s1")[0], [0.5, 3.0])
    np.testing.assert_array_equal(_rows(dataset, "train", "s2")[0], [-1.25])
    _facts_match(dataset, path, **options)


def _table(**columns) -> pa.Table:
    base = {"client_id": ["c_1", "c_2", "c_2"], "label": [0, 1, 2],
            "x": pa.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]], pa.list_(pa.float64()))}
    return pa.table({**base, **columns})


def _bad_tables(tmp_path: pathlib.Path) -> dict:
    """{case: (the file, the client named, load options)}."""
    cases = {}

    def add(case, table=None, client=None, options=None, raw=None):
        path = tmp_path / f"{case}.parquet"
        if raw is None:
            pq.write_table(table, path)
        else:
            path.write_bytes(raw)
        cases[case] = (path, client, options or {})

    add("foreign", raw=b'{"users": [], "num_samples": [], "user_data": {}}')
    buffer = io.BytesIO()
    pq.write_table(_table(), buffer)
    add("truncated", raw=buffer.getvalue()[: len(buffer.getvalue()) // 2])
    add("no_such_column", _table(), options={"parquet_input_column": "pixels"})
    add("label_out_of_range", _table(label=[0, 1, 7]), client="c_2", options={"num_classes": 3})
    add("another_shape", _table(x=pa.array([[0.0, 1.0], [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]])),
        client="c_2")
    add("ragged_within_a_client", _table(x=pa.array([[0.0, 1.0], [1.0], [2.0, 3.0]])),
        client="c_2")
    add("bad_split_value", _table(split=["train", "validation", "test"]), client="c_2",
        options={"parquet_split_column": "split"})
    add("test_rows_only", _table(split=["train", "test", "test"]), client="c_2",
        options={"parquet_split_column": "split"})
    add("undecodable_image", _table(x=[{"bytes": b"\x89PNG-but-not", "path": None}] * 3),
        client="c_1")
    add("null_client_id", _table(client_id=["c_1", None, "c_2"]), client=None)
    add("string_labels", _table(label=["cat", "dog", "dog"]), client="c_1")
    return cases


CASES = ["foreign", "truncated", "no_such_column", "label_out_of_range", "another_shape",
         "ragged_within_a_client", "bad_split_value", "test_rows_only", "undecodable_image",
         "null_client_id", "string_labels"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_table_is_one_error_naming_the_file_and_the_client(tmp_path, case):
    path, client, options = _bad_tables(tmp_path)[case]
    pattern = re.escape(path.name) + (f".*{re.escape(repr(client))}" if client else "")
    with pytest.raises(DataFileError, match=pattern) as raised:
        load_dataset("parquet", data_dir=path, **options)
    assert "\n" not in str(raised.value)


def test_describe_refuses_a_foreign_file_in_one_line(tmp_path):
    path = tmp_path / "data.parquet"
    path.write_text("client_id,label,x\n1,2,3\n")
    with pytest.raises(DataFileError, match=re.escape(str(path))) as raised:
        parquet.describe(path, parquet.ParquetOptions())
    assert "\n" not in str(raised.value)


def test_check_data_dir_needs_parquet_files(tmp_path):
    with pytest.raises(ValueError, match=r"does not hold Parquet: no \*\.parquet files"):
        parquet.check_data_dir(tmp_path)
    (tmp_path / "table.csv").write_text("a")
    with pytest.raises(ValueError, match="does not hold Parquet: a file named .parquet"):
        parquet.check_data_dir(tmp_path / "table.csv")
    pq.write_table(_table(), tmp_path / "t.parquet")
    parquet.check_data_dir(tmp_path)


def test_config_resolves_num_clients_to_the_number_of_writers(tmp_path):
    from fedjax_pals.experiment.config import validate_config

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"writer_id": [i % 3 for i in range(15)], "label": [0, 1, 2] * 5,
                             "x": [[float(i)] * 4 for i in range(15)]}), path)
    resolved = validate_config({
        "dataset": {"name": "parquet", "data_dir": str(path), "input_shape": "2,2,1",
                    "parquet_client_column": "writer_id"},
        "partition": {"scheme": "natural", "target_client": 0},
    })
    assert resolved.partition.num_clients == 3
    assert resolved.dataset.parquet_client_column == "writer_id"
