"""TFF's SQLite client data: the federated data sets of TensorFlow Federated, read as their
clients without TensorFlow.

Schema (TensorFlow Federated, ``tensorflow_federated/python/simulation/datasets/
sql_client_data.py`` and ``sql_client_data_utils.py``, ``save_to_sql_client_data``)::

    CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                           serialized_example_proto BLOB NOT NULL);
    CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL,
                                  num_examples INTEGER NOT NULL);

One row of ``examples`` per example, a serialized ``tf.train.Example`` (decoded by
`fedjax_pals.data.formats.tf_example`); one row of ``client_metadata`` per client and split,
its number of examples. ``SqlClientData`` lists a split's clients sorted, so the clients here
are numbered in ``ORDER BY client_id`` order. TFF's EMNIST has splits "train" and "test",
features 'pixels' (784 floats, 28x28: config.dataset.input_shape=28,28,1) and 'label' (int64);
a file written by ``save_to_sql_client_data`` has the one split "N/A"
(config.dataset.tff_train_split="N/A"). Bytes features (Shakespeare's 'snippets') are refused.

Memory: each split is read in ``ORDER BY client_id, rowid`` order and decoded one client at a
time (SQLite sorts through its temporary files, not in memory, where no index serves the
order), into arrays allocated once from ``client_metadata``'s counts (`assemble_clients`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pathlib
import sqlite3
from collections.abc import Iterator
import numpy as np

from fedjax_pals import hyperparameters as declared
from fedjax_pals.data.datasets import DataFacts, Dataset
from fedjax_pals.data.formats.tf_example import (
    ExampleFormatError,
    decode_examples,
    feature_kinds,
)
from fedjax_pals.data.natural import (
    ClientExamples,
    DataFileError,
    ReaderOptions,
    assemble_clients,
    check_path,
    reader_path,
    register_reader,
)

FORMAT = "TFF SQLite"
SUFFIXES = (".sqlite", ".sqlite3", ".db")
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file
# The columns `SqlClientData` reads (sql_client_data.py checks those of `examples`).
_TABLES = {
    "examples": ("split_name", "client_id", "serialized_example_proto"),
    "client_metadata": ("client_id", "split_name", "num_examples"),
}


@dataclasses.dataclass(frozen=True)
class TFFSQLiteOptions(ReaderOptions):
    """The config keys of the TFF SQLite reader (config.dataset.<key>)."""

    tff_input_feature: str | None = declared.hyperparameter(
        None, kind="text", optional=True,
        doc="the tf.train.Example feature of the inputs (None: the one feature that is not the "
            "label, e.g. EMNIST's 'pixels')")
    tff_label_feature: str = declared.hyperparameter(
        "label", kind="text", doc="the tf.train.Example feature of the labels (one int64 each)")
    tff_train_split: str = declared.hyperparameter(
        "train", kind="text", doc="the split_name of the training examples ('N/A' in a file of "
                                  "save_to_sql_client_data)")
    tff_test_split: str = declared.hyperparameter(
        "test", kind="text", doc="the split_name of the clients' test examples (none there: no "
                                 "test split)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tff_train_split == self.tff_test_split:
            raise ValueError(
                f"tff_train_split and tff_test_split are both {self.tff_train_split!r}; the "
                "test examples must be another split")


def database_file(path: pathlib.Path) -> pathlib.Path:
    """The SQLite file at `path`: the file itself, or the one .sqlite / .sqlite3 / .db file in
    a directory (ValueError "does not hold ...": none, or several)."""
    check_path(path, FORMAT, suffixes=SUFFIXES)
    if path.is_file():
        return path
    found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
    if len(found) != 1:
        raise ValueError(
            f"does not hold {FORMAT}: a directory with exactly one {'/'.join(SUFFIXES)} file is "
            f"expected, it has {len(found)}"
            + (f" ({', '.join(p.name for p in found)}; give the file itself)" if found else ""))
    return found[0]


def connect_read_only(file: pathlib.Path) -> sqlite3.Connection:
    """A read-only connection (nothing, not even a journal, is written beside a user's file)."""
    return sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)


def _missing_schema(connection: sqlite3.Connection) -> str | None:
    """What the database lacks of TFF's schema, or None."""
    tables = {row[0] for row in connection.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    for table, columns in _TABLES.items():
        if table not in tables:
            return f"no table {table!r} (it has {sorted(tables) or 'none'})"
        present = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
        if missing := [c for c in columns if c not in present]:
            return f"table {table!r} lacks the column(s) {missing}"
    return None


def _open(file: pathlib.Path) -> sqlite3.Connection:
    """`file` opened read-only, checked to be SQLite with TFF's tables (ValueError)."""
    with open(file, "rb") as stream:
        if stream.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise ValueError(f"does not hold {FORMAT}: {file.name} is not an SQLite file")
    connection = connect_read_only(file)
    try:
        missing = _missing_schema(connection)
    except sqlite3.Error as error:
        connection.close()
        raise ValueError(f"does not hold {FORMAT}: {file.name} cannot be read as SQLite "
                         f"({error}; a truncated or damaged file)") from None
    if missing is not None:
        connection.close()
        raise ValueError(f"does not hold {FORMAT}: {file.name} has {missing}")
    return connection


def check_data_dir(path: pathlib.Path) -> None:
    """`path` is (or is a directory with exactly one) SQLite file with TFF's tables: its
    header and its schema are read, no rows."""
    _open(database_file(path)).close()


def _splits(connection: sqlite3.Connection) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT DISTINCT split_name FROM client_metadata ORDER BY split_name")]


def _declared(connection: sqlite3.Connection, file: pathlib.Path, split: str) -> dict[str, int]:
    """{client: examples} of `split` in client_metadata, in client order, checked: each client
    once, with examples."""
    declared: dict[str, int] = {}
    for client, count in connection.execute(
        "SELECT client_id, num_examples FROM client_metadata WHERE split_name = ? "
        "ORDER BY client_id", (split,)
    ):
        client = str(client)
        if client in declared:
            raise DataFileError(
                f"{file}: client id {client!r} appears twice in client_metadata for the split "
                f"{split!r}; each client must be one row")
        if not isinstance(count, int) or count <= 0:
            raise DataFileError(
                f"{file}: client {client!r} has {count!r} {split!r} examples in client_metadata; "
                "drop the client from the file (a client needs examples)")
        declared[client] = count
    return declared


def _first_features(connection: sqlite3.Connection, file: pathlib.Path, split: str,
                    declared: dict[str, int]) -> tuple[str, dict]:
    """The client and the feature kinds of the first example of `split`."""
    row = connection.execute(
        "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? LIMIT 1",
        (split,)).fetchone()
    if row is None:
        raise DataFileError(
            f"{file}: table examples has no rows of the split {split!r}, but client_metadata "
            f"declares {sum(declared.values())}")
    client = str(row[0])
    try:
        return client, feature_kinds(bytes(row[1]))
    except (ExampleFormatError, TypeError) as error:
        raise DataFileError(f"{file}: client {client!r}'s {split!r} {error}") from None


def _input_feature(file: pathlib.Path, features: dict, values: TFFSQLiteOptions,
                   client: str) -> str:
    """The input feature: the option, or the one feature besides the label."""
    label = values.tff_label_feature
    if label not in features:
        raise DataFileError(
            f"{file}: client {client!r}'s examples have no label feature {label!r} (they have "
            f"{sorted(features)}; set config.dataset.tff_label_feature)")
    if values.tff_input_feature is not None:
        if values.tff_input_feature not in features:
            raise DataFileError(
                f"{file}: client {client!r}'s examples have no feature "
                f"{values.tff_input_feature!r} (they have {sorted(features)}; "
                "config.dataset.tff_input_feature)")
        return values.tff_input_feature
    others = sorted(set(features) - {label})
    if len(others) != 1:
        raise DataFileError(
            f"{file}: client {client!r}'s examples have the features {others} besides the "
            f"label {label!r}: set config.dataset.tff_input_feature to the inputs' one")
    return others[0]


def _example_shape(file: pathlib.Path, features: dict, feature: str, client: str,
                   input_shape: tuple[int, ...] | None) -> tuple[int, ...]:
    kind, size = features[feature]
    if kind == "bytes":
        raise DataFileError(
            f"{file}: client {client!r}'s feature {feature!r} holds bytes (text, e.g. TFF's "
            "Shakespeare snippets): only float and int64 features are read as inputs")
    if input_shape is not None and int(np.prod(input_shape)) != size:
        raise DataFileError(
            f"{file}: client {client!r}'s feature {feature!r} has {size} values per example, "
            f"but config.dataset.input_shape {tuple(input_shape)} holds "
            f"{int(np.prod(input_shape))}")
    return tuple(input_shape) if input_shape is not None else (size,)


def _train_declared(connection: sqlite3.Connection, file: pathlib.Path,
                    split: str) -> dict[str, int]:
    declared = _declared(connection, file, split)
    if not declared:
        raise DataFileError(
            f"{file}: client_metadata has no clients of the split {split!r} (its splits: "
            f"{_splits(connection)}; set config.dataset.tff_train_split)")
    return declared


def _read_error(file: pathlib.Path, error: sqlite3.Error) -> DataFileError:
    return DataFileError(f"{file}: cannot be read ({error}; a truncated or damaged file)")


def _header(connection: sqlite3.Connection, file: pathlib.Path, values: TFFSQLiteOptions
            ) -> tuple[dict[str, dict[str, int]], str, tuple[int, ...]]:
    """client_metadata's clients of each split ({"train": {client: examples}, "test": ...}),
    the input feature and each example's shape (from the first training example)."""
    try:
        declared = {"train": _train_declared(connection, file, values.tff_train_split),
                    "test": _declared(connection, file, values.tff_test_split)}
        client, features = _first_features(connection, file, values.tff_train_split,
                                           declared["train"])
    except sqlite3.Error as error:
        raise _read_error(file, error) from None
    feature = _input_feature(file, features, values, client)
    return declared, feature, _example_shape(file, features, feature, client, values.input_shape)


def describe(path: pathlib.Path, values: TFFSQLiteOptions) -> DataFacts:
    """The facts of the TFF SQLite file at `path`: client_metadata's clients and counts, and
    the shape of the first training example (no other example is read)."""
    file = database_file(path)
    with contextlib.closing(_open(file)) as connection:
        declared, _, shape = _header(connection, file, values)
    train = declared["train"]
    return DataFacts(sum(train.values()), len(train), shape, values.num_classes,
                     client_names=tuple(train))


def _client_blocks(
    connection: sqlite3.Connection, file: pathlib.Path, tff_split: str, split: str,
    declared: dict[str, int], input_feature: str, label_feature: str,
) -> Iterator[ClientExamples]:
    """The clients of one split, one at a time, checked against client_metadata."""
    client = None
    seen: set[str] = set()
    try:
        # rowid: a client's examples in the order they were written (TFF's query has no order).
        rows = connection.execute(
            "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? "
            "ORDER BY client_id, rowid", (tff_split,))
        for client, group in itertools.groupby(rows, key=lambda row: str(row[0])):
            blobs = [bytes(row[1]) for row in group]
            if client not in declared:
                raise DataFileError(
                    f"{file}: client {client!r} has {len(blobs)} {tff_split!r} examples, but "
                    "client_metadata does not list it for that split")
            if len(blobs) != declared[client]:
                raise DataFileError(
                    f"{file}: client {client!r} has {len(blobs)} {tff_split!r} examples, but "
                    f"client_metadata declares {declared[client]}")
            seen.add(client)
            try:
                x, y = decode_examples(blobs, input_feature, label_feature)
            except ExampleFormatError as error:
                raise DataFileError(f"{file}: client {client!r}'s {tff_split!r} {error}"
                                    ) from None
            del blobs  # one client's serialized examples at a time
            yield ClientExamples(client, split, x, y, str(file))
    except sqlite3.Error as error:
        where = "before its first client" if client is None else f"at client {client!r}"
        raise DataFileError(
            f"{file}: reading the {tff_split!r} examples failed {where} ({error}; a truncated "
            "or damaged file)") from None
    if missing := [c for c in declared if c not in seen]:
        raise DataFileError(
            f"{file}: client {missing[0]!r} is declared in client_metadata with "
            f"{declared[missing[0]]} {tff_split!r} examples, but table examples has none")


def _file(data_dir: str | os.PathLike | None) -> pathlib.Path:
    return reader_path(data_dir, database_file, (
        f"{FORMAT} is read from a file: give data_dir, the .sqlite file (or a directory "
        "holding exactly one)"))


def load(
    data_dir: str | os.PathLike | None = None,
    *,
    num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    tff_input_feature: str | None = None,
    tff_label_feature: str = "label",
    tff_train_split: str = "train",
    tff_test_split: str = "test",
) -> Dataset:
    """The TFF SQLite data set at `data_dir` as a `Dataset` with its clients.

    Args:
      data_dir: the .sqlite file, or a directory holding exactly one.
      num_classes: K; None: one more than the largest label.
      input_shape: each example's shape (EMNIST's 784 pixels: (28, 28, 1)); None: as stored.
      tff_input_feature: the Example feature of the inputs; None: the one besides the label.
      tff_label_feature: the Example feature of the labels.
      tff_train_split, tff_test_split: the split_name values of the train and test examples.

    Raises:
      DataFileError: a file that is not TFF SQLite or whose rows disagree with it (one line
        naming the file and the client).
    """
    values = TFFSQLiteOptions(num_classes, input_shape, tff_input_feature, tff_label_feature,
                              tff_train_split, tff_test_split)
    file = _file(data_dir)
    try:
        connection = _open(file)
    except ValueError as error:
        raise DataFileError(f"{file} {error}") from None
    with contextlib.closing(connection):
        declared, feature, _ = _header(connection, file, values)

        def blocks() -> Iterator[ClientExamples]:
            for split, tff_split in (("train", tff_train_split), ("test", tff_test_split)):
                yield from _client_blocks(connection, file, tff_split, split, declared[split],
                                          feature, tff_label_feature)

        return assemble_clients(
            "tff_sqlite", blocks(), source=f"{FORMAT} {file}", num_classes=num_classes,
            counts={split: sum(clients.values()) for split, clients in declared.items()},
            input_shape=input_shape,
        )


register_reader(
    "tff_sqlite", load, describe, check_data_dir, label=FORMAT,
    hyperparameters=TFFSQLiteOptions, reads_file=True,
)
