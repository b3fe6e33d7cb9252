"""FedJAX's SQLite federated data: the data sets of FedJAX (EMNIST, Shakespeare, CIFAR-100),
read as their clients without FedJAX, JAX or TensorFlow.

Schema (FedJAX, ``fedjax/core/sqlite_federated_data.py``, ``SQLiteFederatedData``)::

    CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL,
                                 num_examples INTEGER NOT NULL);

One row per client: ``data`` is the zlib-compressed msgpack of a dict {feature name: array}
(``decompress_and_deserialize``), in FedJAX's serialization (``fedjax/core/serialization.py``):
a NumPy array is the msgpack ext type 1 holding the msgpack of (shape, dtype name, C-order
bytes); an object array of bytes is ext type 4 holding (shape, flat list of bytes); a NumPy
scalar is ext type 3 (as type 1, 0-d); a complex is ext type 2 (real, imag). FedJAX lists
clients ``ORDER BY rowid``, as they are numbered here. FedJAX keeps one file per split, e.g.
``emnist_train.sqlite`` and ``emnist_test.sqlite``: the train file is given (its test sibling,
the name with its last "train" made "test", is read when present), or a directory holding one
file with "train" in its name and at most one with "test". FedJAX's EMNIST has 'x' (28x28
float32 pixels: config.dataset.input_shape=28,28,1 gives images) and 'y' (integer labels);
inputs of bytes (Stack Overflow's tokens before FedJAX's tokenizer) are refused.

Memory: rows are read one client at a time into arrays allocated once from the files'
``num_examples`` (`assemble_clients`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sqlite3
import zlib
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np

from fedjax_pals import hyperparameters as declared
from fedjax_pals.data.datasets import DataFacts, Dataset
from fedjax_pals.data.formats.tff_sqlite import SQLITE_MAGIC, SUFFIXES, connect_read_only
from fedjax_pals.data.natural import (
    ClientExamples,
    DataFileError,
    ReaderOptions,
    assemble_clients,
    check_path,
    register_reader,
)

FORMAT = "FedJAX SQLite"
_COLUMNS = ("client_id", "data", "num_examples")
# serialization.py's _MsgpackExtType.
_NDARRAY, _COMPLEX, _SCALAR, _BYTES_NDARRAY = 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class FedJAXSQLiteOptions(ReaderOptions):
    """The config keys of the FedJAX SQLite reader (config.dataset.<key>)."""

    fedjax_input_feature: str | None = declared.hyperparameter(
        None, kind="text", optional=True,
        doc="the feature of the inputs (None: the one feature that is not the label, e.g. "
            "EMNIST's 'x')")
    fedjax_label_feature: str = declared.hyperparameter(
        "y", kind="text", doc="the feature of the labels (CIFAR-100's: 'label')")


class _Unusable(ValueError):
    """A client's data that cannot be used (the message lacks the file and client)."""


def _ndarray(data: bytes) -> np.ndarray:
    shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
    name = dtype_name.decode("ascii")
    if name == "bfloat16":  # FedJAX maps it to JAX's dtype; no data set of FedJAX stores it
        raise _Unusable("holds a bfloat16 array, which is not read")
    return np.frombuffer(buffer, dtype=np.dtype(name)).reshape(shape)


def _ext_hook(code: int, data: bytes) -> Any:
    """serialization.py's ext types, decoded as FedJAX decodes them."""
    if code == _NDARRAY:
        return _ndarray(data)
    if code == _SCALAR:
        return _ndarray(data)[()]
    if code == _BYTES_NDARRAY:
        shape, flat = msgpack.unpackb(data, raw=True)
        return np.array(flat, dtype=object).reshape(shape)
    if code == _COMPLEX:
        real, imag = msgpack.unpackb(data)
        return complex(real, imag)
    return msgpack.ExtType(code, data)


def decode_client(blob: bytes) -> dict[str, Any]:
    """{feature: array} of one client's ``data`` (``decompress_and_deserialize``).

    Raises:
      ValueError: not zlib-compressed msgpack of a dict (a damaged or foreign row).
    """
    try:
        examples = msgpack.unpackb(zlib.decompress(blob), ext_hook=_ext_hook, raw=False)
    except zlib.error as error:
        raise _Unusable(f"data is not zlib-compressed ({error})") from None
    except _Unusable:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        # ExtraData, FormatError, StackError, a bad dtype name or shape: a damaged record.
        raise _Unusable(f"data is not FedJAX's msgpack ({type(error).__name__}: {error})"
                        ) from None
    if not isinstance(examples, dict):
        raise _Unusable(f"data is a msgpack {type(examples).__name__}, not a dict of arrays")
    return examples


def _features(examples: dict, values: FedJAXSQLiteOptions) -> tuple[str, str]:
    """The input and label features of a client's examples."""
    label = values.fedjax_label_feature
    if label not in examples:
        raise _Unusable(f"has no label feature {label!r} (it has {sorted(examples)}; set "
                        "config.dataset.fedjax_label_feature)")
    if values.fedjax_input_feature is not None:
        if values.fedjax_input_feature not in examples:
            raise _Unusable(f"has no feature {values.fedjax_input_feature!r} (it has "
                            f"{sorted(examples)}; config.dataset.fedjax_input_feature)")
        return values.fedjax_input_feature, label
    others = sorted(set(examples) - {label})
    if len(others) != 1:
        raise _Unusable(f"has the features {others} besides the label {label!r}: set "
                        "config.dataset.fedjax_input_feature to the inputs' one")
    return others[0], label


def _arrays(examples: dict, input_feature: str, label_feature: str,
            num_examples: Any) -> tuple[np.ndarray, np.ndarray]:
    """The inputs and labels of a client, checked against its num_examples."""
    x, y = examples.get(input_feature), examples.get(label_feature)
    for name, array in ((input_feature, x), (label_feature, y)):
        if not isinstance(array, np.ndarray) or array.ndim < 1:
            raise _Unusable(f"feature {name!r} is {type(array).__name__}, not an array of "
                            "examples")
        if array.dtype == object:
            raise _Unusable(f"feature {name!r} holds bytes (text before tokenizing, e.g. Stack "
                            "Overflow's), not numbers")
    if len(x) != len(y) or len(y) != num_examples:
        raise _Unusable(f"has {len(x)} inputs and {len(y)} labels, but num_examples "
                        f"{num_examples!r}")
    return x, y


def data_files(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path | None]:
    """The train file and the test file (None: none) at `path` (ValueError "does not hold")."""
    check_path(path, FORMAT, suffixes=SUFFIXES)
    if path.is_file():
        head, found, tail = path.name.rpartition("train")
        sibling = path.with_name(f"{head}test{tail}") if found else None
        return path, sibling if sibling is not None and sibling.is_file() else None
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
    train = [p for p in files if "train" in p.name]
    test = [p for p in files if "test" in p.name and p not in train]
    if len(train) != 1 or len(test) > 1:
        raise ValueError(
            f"does not hold {FORMAT}: a directory with one {'/'.join(SUFFIXES)} file named "
            f"*train* and at most one *test* is expected, it has {[p.name for p in files]} "
            "(give the train file itself)")
    return train[0], test[0] if test else None


def _open(file: pathlib.Path) -> sqlite3.Connection:
    """`file` opened read-only, checked to be SQLite with FedJAX's table (ValueError)."""
    with open(file, "rb") as stream:
        if stream.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise ValueError(f"does not hold {FORMAT}: {file.name} is not an SQLite file")
    connection = connect_read_only(file)
    try:
        present = {row[1] for row in connection.execute("PRAGMA table_info(federated_data)")}
    except sqlite3.Error as error:
        connection.close()
        raise ValueError(f"does not hold {FORMAT}: {file.name} cannot be read as SQLite "
                         f"({error}; a truncated or damaged file)") from None
    if missing := [c for c in _COLUMNS if c not in present]:
        connection.close()
        raise ValueError(
            f"does not hold {FORMAT}: {file.name} has "
            + (f"a table federated_data without the column(s) {missing}" if present else
               "no table federated_data"))
    return connection


def check_data_dir(path: pathlib.Path) -> None:
    """`path` is FedJAX's train file (or a directory with it): SQLite headers and the schema
    of the train file and its test sibling are read, no rows."""
    for file in data_files(path):
        if file is not None:
            _open(file).close()


def _client_name(client_id: Any) -> str:
    """FedJAX's bytes client id as text (UTF-8; bytes that are not: escaped)."""
    if isinstance(client_id, bytes):
        return client_id.decode("utf-8", "backslashreplace")
    return str(client_id)


def _first(connection: sqlite3.Connection, file: pathlib.Path,
           values: FedJAXSQLiteOptions) -> tuple[str, str, tuple[int, ...]]:
    """The input and label features and each example's shape, from the first client."""
    row = connection.execute(
        "SELECT client_id, data, num_examples FROM federated_data ORDER BY rowid LIMIT 1"
    ).fetchone()
    if row is None:
        raise DataFileError(f"{file}: table federated_data has no clients")
    client = _client_name(row[0])
    try:
        examples = decode_client(row[1])
        input_feature, label_feature = _features(examples, values)
        x, _ = _arrays(examples, input_feature, label_feature, row[2])
    except _Unusable as error:
        raise DataFileError(f"{file}: client {client!r} {error}") from None
    shape = x.shape[1:]
    if values.input_shape is not None:
        if int(np.prod(values.input_shape)) != int(np.prod(shape)):
            raise DataFileError(
                f"{file}: client {client!r}'s examples have shape {shape}, which "
                f"config.dataset.input_shape {tuple(values.input_shape)} does not hold")
        shape = tuple(values.input_shape)
    return input_feature, label_feature, shape


def _read_error(file: pathlib.Path, error: sqlite3.Error, client: str | None = None
                ) -> DataFileError:
    where = "" if client is None else f" after client {client!r}"
    return DataFileError(f"{file}: cannot be read{where} ({error}; a truncated or damaged file)")


def describe(path: pathlib.Path, values: FedJAXSQLiteOptions) -> DataFacts:
    """The facts of FedJAX's train file at `path`: its clients and num_examples, and the shape
    of the first client's examples (no other row's data is read)."""
    train, _ = data_files(path)
    with contextlib.closing(_open(train)) as connection:
        try:
            _, _, shape = _first(connection, train, values)
            num_train = connection.execute(
                "SELECT TOTAL(num_examples) FROM federated_data").fetchone()[0]
            names = tuple(_client_name(row[0]) for row in connection.execute(
                "SELECT client_id FROM federated_data ORDER BY rowid"))
        except sqlite3.Error as error:
            raise _read_error(train, error) from None
    return DataFacts(int(num_train), len(names), shape, values.num_classes, client_names=names)


def _client_blocks(connection: sqlite3.Connection, file: pathlib.Path, split: str,
                   input_feature: str, label_feature: str) -> Iterator[ClientExamples]:
    """The clients of one file, one row at a time."""
    client = None
    try:
        rows = connection.execute(
            "SELECT client_id, data, num_examples FROM federated_data ORDER BY rowid")
        for client_id, blob, num_examples in rows:
            client = _client_name(client_id)
            try:
                x, y = _arrays(decode_client(blob), input_feature, label_feature, num_examples)
            except _Unusable as error:
                raise DataFileError(f"{file}: client {client!r} {error}") from None
            yield ClientExamples(client, split, x, y, str(file))
    except sqlite3.Error as error:
        raise _read_error(file, error, client) from None


def _declared_examples(connection: sqlite3.Connection, file: pathlib.Path) -> int:
    try:
        total, = connection.execute("SELECT TOTAL(num_examples) FROM federated_data").fetchone()
    except sqlite3.Error as error:
        raise _read_error(file, error) from None
    return int(total)


def load(
    data_dir: str | os.PathLike | None = None,
    *,
    num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    fedjax_input_feature: str | None = None,
    fedjax_label_feature: str = "y",
) -> Dataset:
    """FedJAX's SQLite data set at `data_dir` as a `Dataset` with its clients.

    Args:
      data_dir: the train file (its test sibling, "train" made "test" in the name, is read
        when present), or a directory holding one *train* file and at most one *test* file.
      num_classes: K; None: one more than the largest label.
      input_shape: each example's shape (EMNIST's (28, 28) pixels: (28, 28, 1)); None: as
        stored.
      fedjax_input_feature: the inputs' feature; None: the one besides the label.
      fedjax_label_feature: the labels' feature.

    Raises:
      DataFileError: a file that is not FedJAX SQLite or whose rows disagree with it (one line
        naming the file and the client).
    """
    values = FedJAXSQLiteOptions(num_classes, input_shape, fedjax_input_feature,
                                 fedjax_label_feature)
    if data_dir is None:
        raise DataFileError(
            f"{FORMAT} is read from files: give data_dir, the train .sqlite file (or a "
            "directory holding it and its test file)")
    path = pathlib.Path(data_dir).expanduser().absolute()
    try:
        files = dict(zip(("train", "test"), data_files(path)))
        connections = {s: _open(f) for s, f in files.items() if f is not None}
    except ValueError as error:
        raise DataFileError(f"{path} {error}") from None
    with contextlib.ExitStack() as stack:
        for connection in connections.values():
            stack.enter_context(contextlib.closing(connection))
        input_feature, label_feature, _ = _first(connections["train"], files["train"], values)
        counts = {s: _declared_examples(c, files[s]) for s, c in connections.items()}

        def blocks() -> Iterator[ClientExamples]:
            for split, connection in connections.items():
                yield from _client_blocks(connection, files[split], split, input_feature,
                                          label_feature)

        return assemble_clients(
            "fedjax_sqlite", blocks(), source=f"{FORMAT} {files['train']}",
            num_classes=num_classes, counts=counts, input_shape=input_shape,
        )


register_reader(
    "fedjax_sqlite", load, describe, check_data_dir, label=FORMAT,
    hyperparameters=FedJAXSQLiteOptions, reads_file=True,
)
