"""Natural federated data: the clients a data set comes with, assembled from a format's reader.

A reader of a federated file format (LEAF JSON, TFF's SQLite, FedJAX's SQLite, a Parquet table
with a client-id column: `fedjax_pals.data.formats`) yields `ClientExamples`, one client's
examples of one split at a time, and `assemble_clients` turns them into a `Dataset` whose
`client_ids` are the clients (the partition scheme "natural"), with each client's own test
examples (`Dataset.test_client_ids`) where the format has a test split.

Memory: given the number of examples of each split up front (every format stores it, or it is
read cheaply: LEAF's ``num_samples``, TFF's ``client_metadata``, FedJAX's ``num_examples``), the
examples are copied client by client into arrays allocated once, in their stored dtype, so a
data set the size of FEMNIST is held once, as uint8, and never as a second full copy. Floats
that are exactly k / 255 (LEAF's FEMNIST pixels) are stored as the uint8 k and seen by the
model as k / 255 (`InputScaling(255.0)`).

Every check names the file and the client, before anything trains: a client with no examples,
a client id given twice in a split, labels out of range or not integers, inputs of another
shape than the first client's (`DataFileError`, one line).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedjax_pals import hyperparameters as declared
from fedjax_pals._host import aligned_empty
from fedjax_pals.data.datasets import (
    PIXELS_TO_UNIT_RANGE,
    DataFacts,
    Dataset,
    InputScaling,
    LabeledSplit,
    register_dataset,
    stored_input_dtype,
)

SPLITS = ("train", "test")

# Floats k / 255 are stored as uint8 k (LEAF's FEMNIST pixels are k / 255 as JSON floats).
_QUANTUM = 255.0
UNIT_PIXELS = InputScaling(_QUANTUM, 0.0)


class DataFileError(ValueError):
    """A federated data file that cannot be used as it is: one line naming the file and the
    client (a `ValueError`: the launchers print it as one ``error:`` line)."""


class ClientExamples(NamedTuple):
    """One client's examples of one split, as a format's reader yields them.

    client: the format's client id (a writer, a speaker); split: "train" or "test"; x: (n, ...)
    inputs; y: (n,) integer labels; where: the file they came from (for the messages).
    """

    client: str
    split: str
    x: Any
    y: Any
    where: str


@dataclasses.dataclass
class _SplitBuffer:
    """The examples of one split, filled client by client."""

    expected: int | None  # total examples, when known up front: one allocation
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    ids: np.ndarray | None = None
    filled: int = 0
    pieces: list = dataclasses.field(default_factory=list)  # without `expected`

    def add(self, x: np.ndarray, y: np.ndarray, client_id: int, block: ClientExamples) -> None:
        n = len(y)
        if self.expected is None:
            self.pieces.append((x, y, client_id))
            self.filled += n
            return
        if self.x is None:
            self.x = aligned_empty((self.expected, *x.shape[1:]), x.dtype)
            self.y = np.empty(self.expected, np.int32)
            self.ids = np.empty(self.expected, np.int64)
        if self.filled + n > self.expected:
            raise DataFileError(
                f"{block.where}: client {block.client!r} brings the {block.split} split to "
                f"{self.filled + n} examples, more than the {self.expected} the file declares "
                "(its counts disagree with its data: a damaged or hand-edited file)"
            )
        end = self.filled + n
        self.x[self.filled:end] = x
        self.y[self.filled:end] = y
        self.ids[self.filled:end] = client_id
        self.filled = end

    def dequantise(self) -> None:
        """uint8 k -> float32 k / 255: the floats of a later client are not all k / 255."""
        if self.x is not None:
            self.x = UNIT_PIXELS(self.x)
        self.pieces = [(UNIT_PIXELS(x) if x.dtype == np.uint8 else x, y, i)
                       for x, y, i in self.pieces]

    def arrays(self, shape: tuple, dtype: np.dtype, where: str, split: str):
        if self.expected is None:
            if not self.pieces:
                return np.zeros((0, *shape), dtype), np.zeros(0, np.int32), np.zeros(0, np.int64)
            x = np.concatenate([p[0].astype(dtype, copy=False) for p in self.pieces])
            y = np.concatenate([p[1] for p in self.pieces]).astype(np.int32)
            ids = np.concatenate([np.full(len(p[1]), p[2], np.int64) for p in self.pieces])
            self.pieces.clear()
            return x, y, ids
        if self.filled != self.expected:
            raise DataFileError(
                f"{where}: the {split} split holds {self.filled} examples, but the file declares "
                f"{self.expected} (a truncated or damaged file)"
            )
        if self.x is None:
            return np.zeros((0, *shape), dtype), np.zeros(0, np.int32), np.zeros(0, np.int64)
        return self.x.astype(dtype, copy=False), self.y, self.ids


def _quantised(x: np.ndarray) -> np.ndarray | None:
    """`x` as uint8 k when every value is exactly k / 255 (k in 0..255), else None."""
    if not np.issubdtype(x.dtype, np.floating) or not x.size:
        return None
    k = np.rint(np.asarray(x, np.float64) * _QUANTUM)
    if k.min() < 0 or k.max() > 255:
        return None
    # In x's own precision: TFF's and FedJAX's EMNIST store float32 pixels k / 255, either
    # rounded from the float64 quotient or divided in float32 (the same but for rare ties).
    if not (np.array_equal((k / _QUANTUM).astype(x.dtype), x) or np.array_equal(
            (k.astype(x.dtype) / x.dtype.type(_QUANTUM)), x)):
        return None
    return k.astype(np.uint8)


def _stored(x: np.ndarray, quantise: bool, quantised: bool | None) -> tuple[np.ndarray, str]:
    """`x` in the dtype it is stored in, and its kind: "quantised" (floats k / 255 as uint8 k),
    "float" (float32), "integer" (uint8 pixels as they are, other integers as int32 tokens)."""
    if np.issubdtype(x.dtype, np.floating):
        if quantise and quantised is not False and (q := _quantised(x)) is not None:
            return q, "quantised"
        return x.astype(np.float32, copy=False), "float"
    if x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
        stored = stored_input_dtype(x.dtype)
        if stored == np.int32 and x.size and x.dtype != np.int32 and (
            x.min() < np.iinfo(np.int32).min or x.max() > np.iinfo(np.int32).max
        ):
            raise ValueError(f"inputs hold {x.min() if x.min() < 0 else x.max()}, outside int32 "
                             "(tokens and integer features are held as int32)")
        return x.astype(stored, copy=False), "integer"
    raise ValueError(f"inputs of dtype {x.dtype} are not numbers")


def _as_labels(block: ClientExamples) -> np.ndarray:
    y = np.asarray(block.y)
    if y.ndim != 1:
        raise DataFileError(
            f"{block.where}: client {block.client!r}'s {block.split} labels have shape "
            f"{y.shape}, not (n,)"
        )
    if y.size and not np.issubdtype(y.dtype, np.integer):
        whole = np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.array_equal(
            y, np.rint(y))
        if not whole:
            raise DataFileError(
                f"{block.where}: client {block.client!r}'s {block.split} labels are not class "
                f"indices (dtype {y.dtype}, e.g. {y.flat[0]!r})"
            )
    if y.size and (y.max() > np.iinfo(np.int32).max):
        raise DataFileError(
            f"{block.where}: client {block.client!r} has {block.split} label {int(y.max())}, "
            "beyond int32 (labels are class indices 0, ..., K-1)"
        )
    return y.astype(np.int64)


def assemble_clients(
    name: str,
    blocks: Iterable[ClientExamples],
    *,
    source: str,
    num_classes: int | None = None,
    counts: Mapping[str, int] | None = None,
    input_shape: Sequence[int] | None = None,
    quantise: bool = True,
    input_scaling: InputScaling | None = None,
    client_order: Sequence[str] | None = None,
) -> Dataset:
    """A `Dataset` of the clients in `blocks`, one client id per client in order of first
    appearance in the train split (`Dataset.client_names` keeps the format's ids).

    Args:
      name: the data set's name.
      blocks: `ClientExamples`, each client at most once per split; a client with test examples
        must have training examples.
      source: where the data came from (logs, result files).
      num_classes: K; None: one more than the largest label.
      counts: {"train": N, "test": N'}, the examples of each split when the format declares
        them: the arrays are allocated once (no second copy); None: collected, then joined.
      input_shape: each example's shape (LEAF's FEMNIST stores 784 floats: (28, 28, 1));
        None: as stored.
      quantise: store floats that are all k / 255 as uint8 k (seen by the model as k / 255).
      input_scaling: how the model sees integer inputs (None: uint8 images, examples of 2 or
        3 dimensions, get ``pixel / 127.5 - 1``; other integers are plain values, bools 0/1,
        tokens as int32 for a token model).
      client_order: the clients' names in client-id order, as the format's header lists them
        (what `describe` reports); None: the order of first appearance in the train split.

    Raises:
      DataFileError: a block that cannot be used (one line naming its file and client).
    """
    buffers = {s: _SplitBuffer(None if counts is None else int(counts.get(s, 0))) for s in SPLITS}
    ids: dict[str, int] = {}
    order = None if client_order is None else {str(c): g for g, c in enumerate(client_order)}
    native = None  # the first client's input dtype as the file gave it
    seen: set[tuple[str, str]] = set()
    shape = None if input_shape is None else tuple(int(d) for d in input_shape)
    first_where = None
    stored: np.dtype | None = None
    quantised: bool | None = None  # floats stored as uint8 k / 255 (None: no floats yet)
    largest = -1
    for block in blocks:
        where, client, split = block.where, str(block.client), block.split
        first_where = first_where or where
        if split not in SPLITS:
            raise DataFileError(f"{where}: client {client!r} has a split {split!r}, not train/test")
        if (client, split) in seen:
            raise DataFileError(
                f"{where}: client id {client!r} appears twice in the {split} split; each client "
                "must be one record (merge its examples, or give the two clients distinct ids)"
            )
        seen.add((client, split))
        y = _as_labels(block)
        x = np.asarray(block.x)
        if x.ndim < 1 or x.shape[0] != y.shape[0]:
            raise DataFileError(
                f"{where}: client {client!r} has {y.shape[0]} {split} labels but inputs of shape "
                f"{x.shape}"
            )
        if not y.size:
            raise DataFileError(
                f"{where}: client {client!r} has no {split} examples; drop the client from the "
                "file (a client needs examples to train on or be tested on)"
            )
        if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise DataFileError(
                f"{where}: client {client!r} has {split} label {bad}, outside [0, {num_classes})"
                + (" (set config.dataset.num_classes to the classes the data have)"
                   if num_classes is not None else "")
            )
        largest = max(largest, int(y.max()))
        if shape is None:
            shape = x.shape[1:]
        if int(np.prod(x.shape[1:], dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)) or (
            input_shape is None and x.shape[1:] != shape
        ):
            raise DataFileError(
                f"{where}: client {client!r}'s {split} inputs have shape {x.shape[1:]} per "
                f"example, but the first client's have {shape}"
            )
        x = x.reshape((len(y), *shape))
        try:
            x, kind = _stored(x, quantise, quantised)
        except ValueError as error:
            raise DataFileError(f"{where}: client {client!r}'s {split} {error}") from None
        dequantised = kind == "float" and quantised is True  # floats no longer all k / 255
        if dequantised:
            for buffer in buffers.values():
                buffer.dequantise()
            stored = np.dtype(np.float32)
        if kind in ("quantised", "float"):
            quantised = kind == "quantised"
        if stored is not None and x.dtype != stored:
            raise DataFileError(
                f"{where}: client {client!r}'s {split} inputs are {np.asarray(block.x).dtype}, "
                f"but the first client's are stored as {stored} (one dtype for every client)"
            )
        stored = x.dtype
        if kind == "integer" and quantised is not None or (
            kind != "integer" and native is not None and native.kind in "biu"
        ):
            raise DataFileError(
                f"{where}: client {client!r}'s {split} inputs are {np.asarray(block.x).dtype}, "
                "but the first client's are "
                f"{'floats' if native is None or native.kind == 'f' else native} (one dtype for "
                "every client)"
            )
        native = native if native is not None else np.asarray(block.x).dtype
        if split == "train":
            if order is not None and client not in order:
                raise DataFileError(f"{where}: client {client!r} is not among the clients the "
                                    "file's header lists")
            ids.setdefault(client, len(ids) if order is None else order[client])
        elif client not in ids:
            raise DataFileError(
                f"{where}: client {client!r} has test examples but no training examples (or its "
                "training examples come after its test ones)"
            )
        buffers[split].add(x, y, ids[client], block)
    if not ids:
        raise DataFileError(f"{first_where or name}: no client has training examples")
    if order is not None and len(ids) != len(order):
        missing = next(c for c in order if c not in ids)
        raise DataFileError(f"{first_where or name}: client {missing!r} is listed but has no "
                            "training examples")
    if shape is None or stored is None:  # pragma: no cover - guarded by `ids`
        raise DataFileError(f"{name}: no examples")
    k = largest + 1 if num_classes is None else int(num_classes)
    splits = {}
    for split in SPLITS:
        x, y, client_ids = buffers[split].arrays(shape, stored, first_where or name, split)
        splits[split] = (LabeledSplit(x, y), client_ids)
    scaling = input_scaling
    if scaling is None and quantised:
        scaling = UNIT_PIXELS
    elif scaling is None and stored == np.uint8 and native is not None and native != np.bool_ \
            and len(shape) in (2, 3):
        scaling = PIXELS_TO_UNIT_RANGE  # an image's pixels
    elif scaling is None and stored == np.uint8:
        scaling = InputScaling(1.0)  # bools as 0/1, small integers as their values
    names = tuple(ids) if order is None else tuple(order)
    return Dataset(
        name, splits["train"][0], splits["test"][0], num_classes=k, source=source,
        client_ids=splits["train"][1], client_names=names,
        test_client_ids=splits["test"][1] if len(splits["test"][0]) else None,
        input_scaling=scaling,
    )


@dataclasses.dataclass(frozen=True)
class ReaderOptions(declared.Hyperparameters):
    """The config keys every federated format's reader takes (config.dataset.<key>)."""

    num_classes: int | None = declared.hyperparameter(
        None, kind="integer", low=1, optional=True,
        doc="K (None: one more than the largest label in the files)")
    input_shape: tuple | None = declared.hyperparameter(
        None, kind="shape", optional=True,
        doc="each example's shape, e.g. 28,28,1 for LEAF's 784 FEMNIST floats (None: as stored)")


def check_path(path: pathlib.Path, what: str, *, suffixes: tuple[str, ...] = ()) -> None:
    """`path` exists (the data_dir check of a reader; a ValueError "does not hold ...")."""
    if not path.exists():
        raise ValueError(f"does not hold {what}: nothing is there")
    if path.is_file() and suffixes and not path.name.endswith(suffixes):
        raise ValueError(f"does not hold {what}: a file named {', '.join(suffixes)} is expected")


def reader_path(data_dir: Any, resolve: Callable[[pathlib.Path], Any], needed: str) -> Any:
    """`resolve(path)` of a reader's `data_dir` (its check, or the file(s) it names), a
    missing data_dir or a ValueError "does not hold ..." as one `DataFileError` line. needed:
    what data_dir must name, for the message ("LEAF JSON is read from files: give ...")."""
    if data_dir is None:
        raise DataFileError(needed)
    path = pathlib.Path(data_dir).expanduser().absolute()
    try:
        return resolve(path)
    except ValueError as error:
        raise DataFileError(f"{path} {error}") from None


def register_reader(
    name: str,
    load: Callable[..., Dataset],
    describe: Callable[[pathlib.Path, Any], DataFacts],
    check_data_dir: Callable[[pathlib.Path], None],
    *,
    label: str,
    hyperparameters: type[declared.Hyperparameters] = ReaderOptions,
    reads_file: bool = False,
    **facts: Any,
) -> None:
    """Registers a federated format's reader as the data set `name`: its facts come from its
    files (`describe`), its path from config.dataset.data_dir."""
    register_dataset(
        name, load, num_classes=None, num_train=None, images=None, label=label,
        check_data_dir=check_data_dir, describe=describe, reads_file=reads_file,
        hyperparameters=hyperparameters, check_counts=False, **facts,
    )
