"""LEAF JSON: the federated data sets of LEAF (FEMNIST, Shakespeare), read as their clients.

Schema (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018;
github.com/TalwalkarLab/leaf, ``data/utils/split_data.py`` and each ``data/<name>/README.md``):
every JSON file is one object

    {"users": [uid, ...], "num_samples": [n, ...],
     "user_data": {uid: {"x": [example, ...], "y": [label, ...]}, ...}}

(``hierarchies`` may follow; it is ignored), written in that key order by ``json.dump``. A
data set split by sample (``preprocess.sh -t sample``) is ``data/<name>/data/train/*.json``
and ``data/<name>/data/test/*.json``, the same users in both, each with at least one example
in each. ``split_data.py`` also leaves an empty ``{"x": [], "y": []}`` in ``user_data`` for
each user it dropped (fewer than 2 examples) while listing only the kept users in ``users``:
such entries are skipped. FEMNIST's x is 784 floats k / 255 per example (stored as the uint8
k; config.dataset.input_shape=28,28,1 gives images); Shakespeare's x is 80-character strings
and y single characters, encoded as LEAF's 80-symbol vocabulary (`vocabulary.encode`, int32
tokens, 80 classes). Inputs that are lists of strings (Sent140's, Reddit's tokens) or file
names (CelebA's images live outside the JSON) are refused with a message.

Accepted paths: a directory with ``train/`` (and ``test/``) of JSON files; a directory of JSON
files (train only, no test split); one ``.json`` file (train only). Files are read in sorted
order, streamed with ijson one user at a time (``users`` and ``num_samples``, written first,
give every count before any ``user_data`` is parsed, so the arrays are allocated once).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import ijson
import numpy as np
from ijson.common import ObjectBuilder

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
from fedjax_pals.data.vocabulary import NUM_LEAF_LETTERS, encode

FORMAT = "LEAF JSON"
_HEADER_KEYS = ("users", "num_samples")


class _Header(NamedTuple):
    """A LEAF file's ``users`` and ``num_samples``."""

    users: list[str]
    num_samples: list[int]


def _json_error(path: pathlib.Path, error: ijson.JSONError) -> DataFileError:
    # yajl's message continues with a drawing of the bad bytes on further lines: keep the first.
    first = (str(error).strip().splitlines() or ["unreadable"])[0].strip().rstrip(".")
    return DataFileError(f"{path}: not a valid JSON file ({first}; truncated or not LEAF JSON)")


def leaf_files(path: pathlib.Path) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """The train and test JSON files at `path` (a file, a directory with train/ and test/, or a
    directory of JSON files), each list sorted by name."""
    if path.is_file():
        return [path], []
    if (path / "train").is_dir():
        return sorted((path / "train").glob("*.json")), sorted((path / "test").glob("*.json"))
    return sorted(path.glob("*.json")), []


def _header(path: pathlib.Path) -> _Header:
    """`users` and `num_samples` of a LEAF file, reading no further than both (LEAF writes them
    before `user_data`; in another order the rest of the file is scanned, not kept)."""
    found: dict[str, list] = {}
    complete: set[str] = set()
    try:
        with open(path, "rb") as f:
            for prefix, event, value in ijson.parse(f, use_float=True):
                if prefix == "":
                    if event == "end_map":
                        break
                    if event not in ("start_map", "map_key"):
                        kind = event.replace("start_", "")
                        raise DataFileError(
                            f"{path}: not a LEAF JSON file (its top level is a {kind}, not an "
                            "object of users, num_samples and user_data)"
                        )
                elif prefix in _HEADER_KEYS:
                    if event == "start_array":
                        found[prefix] = []
                    elif event == "end_array":
                        complete.add(prefix)
                        if len(complete) == len(_HEADER_KEYS):
                            break
                    else:
                        raise DataFileError(f"{path}: {prefix!r} is a {event}, not a list")
                elif prefix in ("users.item", "num_samples.item"):
                    key = prefix[: -len(".item")]
                    if event not in ("string", "number"):
                        raise DataFileError(
                            f"{path}: {key!r} holds a {event.replace('start_', '')}, not "
                            f"{'user ids' if key == 'users' else 'counts'}"
                        )
                    found[key].append(value)
    except ijson.JSONError as error:
        raise _json_error(path, error) from None
    missing = [key for key in _HEADER_KEYS if key not in complete]
    if missing:
        raise DataFileError(
            f"{path}: not a LEAF JSON file: no {' or '.join(missing)} list (LEAF writes users, "
            "num_samples and user_data)"
        )
    users = [str(u) for u in found["users"]]
    counts = found["num_samples"]
    if len(users) != len(counts):
        which = (f"user {users[len(counts)]!r} has no num_samples" if len(users) > len(counts)
                 else "num_samples has more counts than users")
        raise DataFileError(
            f"{path}: {which} ({len(users)} users, {len(counts)} num_samples: one per user)"
        )
    seen: set[str] = set()
    for user, n in zip(users, counts):
        if user in seen:
            raise DataFileError(f"{path}: user {user!r} appears twice in users")
        seen.add(user)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise DataFileError(f"{path}: user {user!r} has num_samples {n!r}, not a count")
    return _Header(users, counts)


def _first_example(path: pathlib.Path) -> tuple[Any, Any] | None:
    """The first x and the first y in `user_data` of a LEAF file (users with empty lists, as
    LEAF leaves for those it dropped, are passed over), parsing no further; None: no user has
    examples."""
    first: dict[str, Any] = {}
    builder: ObjectBuilder | None = None
    depth = 0
    key = ""
    try:
        with open(path, "rb") as f:
            for prefix, event, value in ijson.parse(f, use_float=True):
                if builder is not None:  # inside a nested first example: build it whole
                    builder.event(event, value)
                    depth += event in ("start_array", "start_map")
                    depth -= event in ("end_array", "end_map")
                    if depth == 0:
                        first[key], builder = builder.value, None
                elif prefix.startswith("user_data.") and prefix.endswith((".x.item", ".y.item")):
                    key = prefix[-len("x.item")]  # "x" or "y"
                    if key in first:
                        continue
                    if event in ("start_array", "start_map"):
                        builder, depth = ObjectBuilder(), 1
                        builder.event(event, value)
                    else:
                        first[key] = value
                if len(first) == 2 and builder is None:
                    return first["x"], first["y"]
    except ijson.JSONError as error:
        raise _json_error(path, error) from None
    return None


def _is_text(x: Any, y: Any) -> bool:
    """Shakespeare's kind of example: a string input and a one-character label."""
    return isinstance(x, str) and isinstance(y, str)


def _refusal(x: Any, y: Any) -> str | None:
    """Why inputs like `x` (with label `y`) cannot be read, or None."""
    if isinstance(x, str):
        if isinstance(y, str):
            return None  # Shakespeare's
        return (f"inputs are strings ({x[:40]!r}) with numeric labels, as LEAF's CelebA (file "
                "names of images outside the JSON): only Shakespeare's strings are read")
    inner = x
    while isinstance(inner, list) and inner:
        inner = inner[0]
    if isinstance(inner, str):
        return ("inputs are lists of strings, as LEAF's Sent140 and Reddit: tokenise them into "
                "numbers first (only FEMNIST-style numbers and Shakespeare's strings are read)")
    if isinstance(inner, dict):
        return "inputs are JSON objects, not numbers or strings"
    return None


def _client_arrays(
    path: pathlib.Path, user: str, split: str, x: list, y: list
) -> tuple[np.ndarray, np.ndarray]:
    """One user's (x, y) as arrays: numbers as they are (floats k / 255 become uint8 in
    `assemble_clients`), Shakespeare's strings as LEAF vocabulary indices."""
    where = f"{path}: user {user!r}'s {split}"
    if not y:
        return np.zeros((0,)), np.zeros((0,), np.int64)  # `assemble_clients` names the client
    if (why := _refusal(x[0], y[0])) is not None:
        raise DataFileError(f"{where} {why}")
    if _is_text(x[0], y[0]):
        if not all(isinstance(s, str) for s in x) or len({len(s) for s in x}) != 1:
            raise DataFileError(f"{where} inputs are not strings of one length (LEAF's 80)")
        if not all(isinstance(c, str) and len(c) == 1 for c in y):
            raise DataFileError(f"{where} labels are not single characters")
        try:
            tokens = encode("".join(x)).reshape(len(x), len(x[0]))
            labels = encode("".join(y))
        except ValueError as error:
            raise DataFileError(f"{where} data: {error}") from None
        return tokens, labels
    try:
        inputs = np.asarray(x)
    except ValueError:
        raise DataFileError(f"{where} inputs differ in shape from one example to another") from None
    if inputs.dtype == object or not (inputs.dtype == np.bool_ or np.issubdtype(
            inputs.dtype, np.number)):
        raise DataFileError(f"{where} inputs are not numbers of one shape")
    return inputs, np.asarray(y)


def _blocks(path: pathlib.Path, split: str, header: _Header) -> Iterator[ClientExamples]:
    """The users of one LEAF file, one at a time, checked against its header."""
    declared = dict(zip(header.users, header.num_samples))
    seen: set[str] = set()
    try:
        with open(path, "rb") as f:
            for user, record in ijson.kvitems(f, "user_data", use_float=True):
                user = str(user)
                if not isinstance(record, dict) or not isinstance(record.get("x"), list) or (
                    not isinstance(record.get("y"), list)
                ):
                    raise DataFileError(
                        f"{path}: user {user!r}'s user_data is not an object of lists x and y"
                    )
                x, y = record["x"], record["y"]
                if user not in declared:
                    if not x and not y:
                        continue  # a user LEAF's split_data.py dropped: listed nowhere, empty
                    raise DataFileError(
                        f"{path}: user {user!r} has examples in user_data but is not in users"
                    )
                if user in seen:
                    raise DataFileError(f"{path}: user {user!r} appears twice in user_data")
                seen.add(user)
                if len(y) != declared[user] or len(x) != len(y):
                    raise DataFileError(
                        f"{path}: user {user!r} has {len(x)} x and {len(y)} y in user_data, but "
                        f"num_samples says {declared[user]}"
                    )
                inputs, labels = _client_arrays(path, user, split, x, y)
                del record, x, y  # one user's parsed lists at a time
                yield ClientExamples(user, split, inputs, labels, where=str(path))
    except ijson.JSONError as error:
        raise _json_error(path, error) from None
    absent = [u for u in header.users if u not in seen]
    if absent:
        raise DataFileError(
            f"{path}: user {absent[0]!r} is in users but has no entry in user_data"
            + (f" ({len(absent) - 1} more users lack one too)" if len(absent) > 1 else "")
        )


def _check_users(train: dict, test: dict) -> None:
    """Every test user is a training user: a per-client test split (LEAF's ``-t sample``)."""
    train_users = {u for header in train.values() for u in header.users}
    for path, header in test.items():
        for user in header.users:
            if user not in train_users:
                raise DataFileError(
                    f"{path}: test user {user!r} is in no training file; this reader takes LEAF "
                    "data split by sample (preprocess.sh -t sample), each user in both splits, "
                    "not split by user (-t user)"
                )


def _path(data_dir: str | os.PathLike | None) -> pathlib.Path:
    def checked(path: pathlib.Path) -> pathlib.Path:
        check_data_dir(path)
        return path

    return reader_path(data_dir, checked, (
        "LEAF JSON is read from files: give data_dir, the directory with train/ and test/ "
        "(LEAF's data/<name>/data) or one .json file"))


def load(
    data_dir: str | os.PathLike | None = None,
    *,
    num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> Dataset:
    """The LEAF data set at `data_dir` as a `Dataset` with its users as clients.

    Args:
      data_dir: a directory with train/ and test/ JSON files (LEAF's data/<name>/data), a
        directory of JSON files (train only) or one .json file (train only).
      num_classes: K; None: 80 for Shakespeare's characters, else one more than the largest
        label (FEMNIST's 62 classes may not all occur in a sample: set it).
      input_shape: each example's shape (FEMNIST: (28, 28, 1)); None: as stored.

    Raises:
      DataFileError: a file that is not LEAF JSON or whose data disagree with it (one line
        naming the file and the user).
    """
    path = _path(data_dir)
    train_files, test_files = leaf_files(path)
    train = {f: _header(f) for f in train_files}
    test = {f: _header(f) for f in test_files}
    _check_users(train, test)
    counts = {"train": sum(sum(h.num_samples) for h in train.values()),
              "test": sum(sum(h.num_samples) for h in test.values())}
    first = _first_example(train_files[0])
    if num_classes is None and first is not None and _is_text(*first):
        num_classes = NUM_LEAF_LETTERS

    def blocks() -> Iterator[ClientExamples]:
        for split, headers in (("train", train), ("test", test)):
            for file, header in headers.items():
                yield from _blocks(file, split, header)

    # Client ids follow the training files' users lists (what `describe` reports), whatever
    # the order of user_data.
    users = tuple(dict.fromkeys(u for h in train.values() for u in h.users))
    return assemble_clients(
        "leaf", blocks(), source=f"{FORMAT} {path}", num_classes=num_classes, counts=counts,
        input_shape=input_shape, client_order=users,
    )


def _example_shape(path: pathlib.Path, x: Any, y: Any) -> tuple[int, ...]:
    if (why := _refusal(x, y)) is not None:
        raise DataFileError(f"{path}: {why}")
    if isinstance(x, str):
        return (len(x),)
    try:
        return np.shape(np.asarray(x))
    except ValueError:
        raise DataFileError(f"{path}: the first example is not an array of one shape") from None


def describe(path: pathlib.Path, values: ReaderOptions) -> DataFacts:
    """The facts of the LEAF data set at `path` from the headers of its training files and its
    first example (no ``user_data`` beyond it is parsed)."""
    train_files, _ = leaf_files(path)
    if not train_files:
        raise ValueError(f"does not hold {FORMAT}: no JSON files")
    headers = {f: _header(f) for f in train_files}
    num_train = sum(sum(h.num_samples) for h in headers.values())
    if not num_train:
        raise DataFileError(f"{train_files[0]}: the training files declare no examples")
    first = _first_example(train_files[0])
    if first is None:
        raise DataFileError(f"{train_files[0]}: no user has examples in user_data")
    x, y = first
    shape = _example_shape(train_files[0], x, y)
    if values.input_shape is not None:
        if int(np.prod(values.input_shape)) != int(np.prod(shape)):
            raise DataFileError(
                f"{train_files[0]}: input_shape {tuple(values.input_shape)} does not hold an "
                f"example of shape {shape}"
            )
        shape = tuple(values.input_shape)
    num_classes = values.num_classes
    if num_classes is None and _is_text(x, y):
        num_classes = NUM_LEAF_LETTERS
    # Client ids follow the training files' users lists (`load` passes the same order).
    users = tuple(dict.fromkeys(u for h in headers.values() for u in h.users))
    return DataFacts(num_train, len(users), shape, num_classes, client_names=users)


def check_data_dir(path: pathlib.Path) -> None:
    """`path` is a .json file, or a directory with train/*.json or *.json (a few stat calls)."""
    check_path(path, FORMAT, suffixes=(".json",))
    if path.is_dir() and not leaf_files(path)[0]:
        raise ValueError(
            f"does not hold {FORMAT}: no train/*.json (LEAF's data/<name>/data/train) and no "
            "*.json files in it"
        )


register_reader("leaf", load, describe, check_data_dir, label=FORMAT, reads_file=True)
