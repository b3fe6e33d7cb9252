"""Parquet tables with a client-id column (Hugging Face data sets), read as their clients.

Convention: Flower Datasets' ``NaturalIdPartitioner(partition_by="writer_id")``
(flower.ai/docs/datasets, ``flwr_datasets.partitioner.NaturalIdPartitioner``): a table of
examples, one row each, whose client-id column (FEMNIST's ``writer_id``, a speaker, a camera)
makes one client per distinct value. The tables are Hugging Face ``datasets`` Parquet files
(huggingface.co/docs/datasets, "Image" feature: a struct ``{"bytes": binary, "path":
string}``), one ``.parquet`` file or a directory of shards read in sorted name order.

Columns (config keys): ``parquet_client_column`` (ints or strings, used as ``str(id)``),
``parquet_label_column`` (integer classes), ``parquet_input_column``: numeric lists or
fixed-size lists, possibly nested (each example an array of one shape), numeric scalars (an
example of shape ()), or Hugging Face images (PNG/JPEG bytes decoded with Pillow to uint8
HxW or HxWxC). ``parquet_split_column``: a column of "train"/"test" per row; None: every row is
a training row but each client's last ``parquet_test_fraction`` of rows (by position) is its
test split.

Reading: the client (and split) columns are read first, a cheap pass that gives every count,
so the arrays are allocated once; then the input and label columns are streamed by record
batches, a client's rows kept (as Arrow data) until its last row has passed, then decoded and
handed over. A table sorted by client holds one client's rows at a time; a client's rows need
not be contiguous, at the cost of holding the rows of the clients not yet complete. Client ids
are numbered in the order in which clients complete (their last row), which is their order of
appearance in a table sorted by client.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from fedjax_pals import hyperparameters as declared
from fedjax_pals.data.datasets import DataFacts, Dataset
from fedjax_pals.data.natural import (
    ClientExamples,
    DataFileError,
    ReaderOptions,
    assemble_clients,
    check_path,
    reader_path,
    register_reader,
)

FORMAT = "Parquet"
_BATCH_ROWS = 8192
_SPLIT_VALUES = ("train", "test")
# Pillow modes that are not one of uint8 gray / RGB / RGBA as they are: their uint8 form.
_IMAGE_MODES = {"1": "L", "CMYK": "RGB", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB"}


@dataclasses.dataclass(frozen=True)
class ParquetOptions(ReaderOptions):
    """The config keys of the Parquet reader (config.dataset.<key>)."""

    parquet_client_column: str = declared.hyperparameter(
        "client_id", kind="text",
        doc="the column of client ids (Flower's NaturalIdPartitioner partition_by, e.g. writer_id)")
    parquet_label_column: str = declared.hyperparameter(
        "label", kind="text", doc="the column of integer class labels")
    parquet_input_column: str = declared.hyperparameter(
        "x", kind="text",
        doc="the column of inputs: numeric lists (nested), numeric scalars or Hugging Face images")
    parquet_split_column: str | None = declared.hyperparameter(
        None, kind="text", optional=True,
        doc="a column of 'train'/'test' per row (None: parquet_test_fraction of each client)")
    parquet_test_fraction: float = declared.hyperparameter(
        0.2, low=0.0, high=1.0, high_open=True,
        doc="each client's last fraction of rows, by position, tested on (no split column)")


def _arrow_error(path: pathlib.Path, error: BaseException) -> DataFileError:
    text = " ".join(str(error).split()) or type(error).__name__
    return DataFileError(f"{path}: not a readable Parquet file ({text}; truncated or foreign)")


def parquet_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The Parquet files at `path`: the file itself, or a directory's *.parquet, sorted."""
    return [path] if path.is_file() else sorted(path.glob("*.parquet"))


def _open(path: pathlib.Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as error:
        raise _arrow_error(path, error) from None


def _check_columns(path: pathlib.Path, schema: pa.Schema, columns: dict[str, str]) -> None:
    for option, column in columns.items():
        if schema.get_field_index(column) < 0:
            raise DataFileError(
                f"{path}: no column {column!r} (config.dataset.{option}); its columns: "
                f"{', '.join(schema.names)}"
            )


def _columns(options: ParquetOptions, *, inputs: bool) -> dict[str, str]:
    """{option: column} of the columns read (the index pass: client and split only)."""
    wanted = {"parquet_client_column": options.parquet_client_column}
    if options.parquet_split_column is not None:
        wanted["parquet_split_column"] = options.parquet_split_column
    if inputs:
        wanted["parquet_input_column"] = options.parquet_input_column
        wanted["parquet_label_column"] = options.parquet_label_column
    return wanted


@dataclasses.dataclass
class _Index:
    """Which client and split each row is in, from the client (and split) columns alone."""

    files: list[pathlib.Path]
    file_rows: list[int]
    codes: np.ndarray  # (N,) each row's client, numbered in order of first appearance
    names: list[str]  # each number's client id, as a string
    test: np.ndarray  # (N,) bool: the row is a test example
    last: np.ndarray  # (G,) each client's last row
    by_client: np.ndarray  # (N,) the rows grouped by client, each client's in file order
    starts: np.ndarray  # (G + 1,) client g's rows are by_client[starts[g]:starts[g + 1]]

    def rows_of(self, client: int) -> np.ndarray:
        return self.by_client[self.starts[client]:self.starts[client + 1]]

    def num_train(self, client: int) -> int:
        return int((~self.test[self.rows_of(client)]).sum())


def _client_ids(path: pathlib.Path, column: pa.ChunkedArray, column_name: str) -> pa.Array:
    """The client ids of a file as strings (ints as str(int))."""
    ids = column.combine_chunks()
    if ids.null_count:
        row = int(pc.index(pc.is_null(ids), True).as_py())
        raise DataFileError(f"{path}: row {row} has no client id (column {column_name!r} is null)")
    kind = ids.type
    if pa.types.is_dictionary(kind):
        ids, kind = ids.dictionary_decode(), kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind)
            or pa.types.is_large_string(kind)):
        raise DataFileError(
            f"{path}: client ids (column {column_name!r}) are {kind}, not integers or strings"
        )
    return pc.cast(ids, pa.string())


def _index(files: list[pathlib.Path], options: ParquetOptions) -> _Index:
    """The cheap pass: each row's client and split, read from those columns only."""
    wanted = _columns(options, inputs=False)
    number: dict[str, int] = {}
    codes, splits, file_rows = [], [], []
    for path in files:
        parquet = _open(path)
        _check_columns(path, parquet.schema_arrow, _columns(options, inputs=True))
        try:
            table = parquet.read(columns=list(wanted.values()))
        except (pa.ArrowException, OSError) as error:
            raise _arrow_error(path, error) from None
        encoded = pc.dictionary_encode(
            _client_ids(path, table.column(options.parquet_client_column),
                        options.parquet_client_column))
        # dictionary_encode numbers values in order of appearance: so are the global numbers.
        local = np.array([number.setdefault(name, len(number))
                          for name in encoded.dictionary.to_pylist()], np.int64)
        file_codes = local[encoded.indices.to_numpy(zero_copy_only=False)]
        codes.append(file_codes)
        file_rows.append(len(file_codes))
        if options.parquet_split_column is not None:
            splits.append(_test_rows(path, table.column(options.parquet_split_column),
                                     options.parquet_split_column, file_codes, list(number)))
    all_codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
    names = list(number)
    if options.parquet_split_column is not None:
        test = np.concatenate(splits) if splits else np.zeros(0, bool)
    else:
        test = _last_fraction(all_codes, len(names), options.parquet_test_fraction)
    by_client = np.argsort(all_codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(all_codes, minlength=len(names)))])
    last = by_client[starts[1:] - 1]  # every client has a row
    return _Index(files, file_rows, all_codes, names, test, last, by_client, starts)


def _test_rows(path: pathlib.Path, column: pa.ChunkedArray, column_name: str,
               codes: np.ndarray, names: list[str]) -> np.ndarray:
    """The rows of a file whose split column says "test" (every value "train" or "test")."""
    values = column.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise DataFileError(
            f"{path}: the split column {column_name!r} is {values.type}, not strings "
            "'train'/'test'"
        )
    known = pc.fill_null(pc.is_in(values, value_set=pa.array(_SPLIT_VALUES)), False)
    if not pc.all(known).as_py():
        row = int(pc.index(known, False).as_py())
        raise DataFileError(
            f"{path}: client {names[codes[row]]!r} has split {values[row].as_py()!r} in row "
            f"{row} (column {column_name!r}), not 'train' or 'test'"
        )
    return pc.equal(values, "test").to_numpy(zero_copy_only=False)


def _last_fraction(codes: np.ndarray, num_clients: int, fraction: float) -> np.ndarray:
    """Rows in each client's last `fraction` of its rows, by position (floor: a client of one
    row keeps it for training)."""
    order = np.argsort(codes, kind="stable")  # each client's rows together, in file order
    sizes = np.bincount(codes, minlength=num_clients)
    # A tolerance so that 10 * 0.3 = 3.0000000000000004 and 100 * 0.29 = 28.999999999999996
    # both count as the whole number they stand for.
    tests = np.array([math.floor(n * fraction + 1e-9) for n in sizes], np.int64)
    starts = np.cumsum(sizes) - sizes
    rank = np.arange(len(codes)) - starts[codes[order]]
    test = np.zeros(len(codes), bool)
    test[order] = rank >= (sizes - tests)[codes[order]]
    return test


def _images(path: pathlib.Path, client: str, column: pa.Array) -> np.ndarray:
    """Hugging Face "Image" structs {bytes, path} decoded to uint8 (n, H, W[, C])."""
    data = pc.struct_field(column, "bytes")
    files = (pc.struct_field(column, "path") if column.type.get_field_index("path") >= 0
             else pa.nulls(len(column)))
    images = []
    for row in range(len(column)):
        raw, name = data[row].as_py(), files[row].as_py()
        try:
            if raw is not None:
                image = Image.open(io.BytesIO(raw))
            elif name is not None:  # HF keeps a path only for images stored beside the table
                image = Image.open(path.parent / name)
            else:
                raise DataFileError(f"{path}: client {client!r} has an image with neither bytes "
                                    "nor path")
            image.load()
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            if isinstance(error, DataFileError):
                raise
            text = ("neither PNG, JPEG nor another format it knows"
                    if isinstance(error, UnidentifiedImageError) else " ".join(str(error).split()))
            raise DataFileError(
                f"{path}: client {client!r} has an image that Pillow cannot decode ({text})"
            ) from None
        if image.mode in ("P", "PA"):
            image = image.convert("RGBA" if "transparency" in image.info or image.mode == "PA"
                                  else "RGB")
        elif image.mode in _IMAGE_MODES:
            image = image.convert(_IMAGE_MODES[image.mode])
        images.append(np.asarray(image))
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise DataFileError(
            f"{path}: client {client!r} has images of different shapes "
            f"({', '.join(map(str, sorted(shapes)))}): resize them to one"
        )
    return np.stack(images)


def _inputs(path: pathlib.Path, client: str, column: pa.Array) -> np.ndarray:
    """An input column's rows as an (n, ...) array: nested numeric lists, numeric scalars or
    Hugging Face images."""
    kind = column.type
    if column.null_count:
        raise DataFileError(f"{path}: client {client!r} has rows without inputs (nulls)")
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        return _images(path, client, column)
    shape: list[int] = []
    values: pa.Array = column
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or (
        pa.types.is_fixed_size_list(values.type)
    ):
        if values.null_count:
            raise DataFileError(f"{path}: client {client!r} has inputs with null lists")
        if pa.types.is_fixed_size_list(values.type):
            size = values.type.list_size
        else:
            lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
            if lengths.size and (lengths != lengths[0]).any():
                raise DataFileError(
                    f"{path}: client {client!r}'s inputs are lists of different lengths "
                    f"({lengths.min()} to {lengths.max()} at depth {len(shape) + 1}), not "
                    "arrays of one shape"
                )
            size = int(lengths[0]) if lengths.size else 0
        shape.append(size)
        values = values.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
            or pa.types.is_boolean(values.type)):
        raise DataFileError(
            f"{path}: the input column holds {kind}, not numbers, lists of numbers or Hugging "
            "Face images"
        )
    if values.null_count:
        raise DataFileError(f"{path}: client {client!r} has inputs with null numbers")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), *shape)


def _client_examples(
    path: pathlib.Path, client: str, pieces: list[pa.RecordBatch], test: np.ndarray,
    options: ParquetOptions,
) -> Iterator[ClientExamples]:
    """A complete client's rows as its train (and test) examples."""
    table = pa.Table.from_batches(pieces).combine_chunks()  # one chunk: the rows are there
    x = _inputs(path, client, table.column(options.parquet_input_column).chunk(0))
    labels = table.column(options.parquet_label_column)
    if labels.null_count:
        raise DataFileError(f"{path}: client {client!r} has rows without a label (nulls)")
    y = labels.to_numpy()
    train = ~test
    if train.any():  # else `assemble_clients` says the client has test examples only
        yield ClientExamples(client, "train", x[train], y[train], where=str(path))
    if test.any():
        yield ClientExamples(client, "test", x[test], y[test], where=str(path))


def _blocks(index: _Index, options: ParquetOptions) -> Iterator[ClientExamples]:
    """The clients in order of their last row, streaming record batches."""
    columns = [options.parquet_input_column, options.parquet_label_column]
    pending: dict[int, list[pa.RecordBatch]] = {}
    start = 0
    for path, rows in zip(index.files, index.file_rows):
        file_end = start + rows
        try:
            for batch in _open(path).iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                end = start + batch.num_rows
                codes = index.codes[start:end]
                order = np.argsort(codes, kind="stable")
                complete = []
                for rows_of in np.split(order, np.flatnonzero(np.diff(codes[order])) + 1):
                    if not rows_of.size:
                        continue
                    client = int(codes[rows_of[0]])
                    contiguous = rows_of[-1] - rows_of[0] + 1 == rows_of.size
                    piece = (batch.slice(int(rows_of[0]), rows_of.size) if contiguous
                             else batch.take(pa.array(rows_of)))
                    pending.setdefault(client, []).append(piece)
                    if index.last[client] < end:  # its last row has passed
                        complete.append(client)
                for client in sorted(complete, key=lambda g: index.last[g]):
                    mask = index.test[index.rows_of(client)]
                    yield from _client_examples(path, index.names[client], pending.pop(client),
                                                mask, options)
                start = end
        except (pa.ArrowException, OSError) as error:
            raise _arrow_error(path, error) from None
        if start != file_end:
            raise DataFileError(f"{path}: its columns hold different numbers of rows")


def _path(data_dir: str | os.PathLike | None) -> pathlib.Path:
    def checked(path: pathlib.Path) -> pathlib.Path:
        check_data_dir(path)
        return path

    return reader_path(data_dir, checked, (
        "Parquet is read from files: give data_dir, a .parquet file or a directory of them"))


def load(data_dir: str | os.PathLike | None = None, **options: Any) -> Dataset:
    """The Parquet table(s) at `data_dir` as a `Dataset` with one client per client id.

    Args:
      data_dir: a .parquet file or a directory of them (Hugging Face shards, sorted by name).
      **options: the fields of `ParquetOptions` (num_classes, input_shape, the columns, the
        test fraction); missing ones take their defaults.

    Raises:
      DataFileError: a file that is not Parquet, lacks a column or whose data cannot be used
        (one line naming the file and the client).
    """
    values = ParquetOptions(**options)
    path = _path(data_dir)
    index = _index(parquet_files(path), values)
    counts = {"train": int((~index.test).sum()), "test": int(index.test.sum())}
    return assemble_clients(
        "parquet", _blocks(index, values), source=f"{FORMAT} {path}",
        num_classes=values.num_classes, counts=counts, input_shape=values.input_shape,
    )


def _label_classes(files: list[pathlib.Path], column: str) -> int | None:
    """One more than the largest label, from the files' row-group statistics (None where a row
    group has none: the classes then come from the data)."""
    largest = -1
    for path in files:
        metadata = _open(path).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            chunk = next((row_group.column(i) for i in range(row_group.num_columns)
                          if row_group.column(i).path_in_schema == column), None)
            stats = None if chunk is None else chunk.statistics
            if stats is None or not stats.has_min_max or not isinstance(stats.max, int):
                return None
            largest = max(largest, stats.max)
    return largest + 1 if largest >= 0 else None


def describe(path: pathlib.Path, values: ParquetOptions) -> DataFacts:
    """The facts of the Parquet data at `path`: counts from the client (and split) columns,
    the shape of the first row's input, the classes from the label statistics."""
    files = parquet_files(path)
    if not files:
        raise ValueError(f"does not hold {FORMAT}: no *.parquet files")
    index = _index(files, values)
    num_train = int((~index.test).sum())
    if not num_train:
        raise DataFileError(f"{files[0]}: no training rows")
    try:
        first = next(_open(files[0]).iter_batches(batch_size=1,
                                                  columns=[values.parquet_input_column]))
    except StopIteration:
        raise DataFileError(f"{files[0]}: no rows") from None
    except (pa.ArrowException, OSError) as error:
        raise _arrow_error(files[0], error) from None
    shape = _inputs(files[0], index.names[int(index.codes[0])], first.column(0)).shape[1:]
    if values.input_shape is not None:
        if int(np.prod(values.input_shape)) != int(np.prod(shape)):
            raise DataFileError(
                f"{files[0]}: input_shape {tuple(values.input_shape)} does not hold an example "
                f"of shape {shape}"
            )
        shape = tuple(values.input_shape)
    num_classes = values.num_classes or _label_classes(files, values.parquet_label_column)
    # A client with test rows only is refused by `load`; it is no client id.
    names = tuple(index.names[g] for g in np.argsort(index.last, kind="stable")
                  if index.num_train(int(g)))
    return DataFacts(num_train, len(names), shape, num_classes, client_names=names)


def check_data_dir(path: pathlib.Path) -> None:
    """`path` is a .parquet file or a directory holding some (a few stat calls)."""
    check_path(path, FORMAT, suffixes=(".parquet",))
    if path.is_dir() and not parquet_files(path):
        raise ValueError(f"does not hold {FORMAT}: no *.parquet files in it")


register_reader(
    "parquet", load, describe, check_data_dir, label=FORMAT, hyperparameters=ParquetOptions,
    reads_file=True,
)
