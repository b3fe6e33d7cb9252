"""Clients given as index lists: a partition made elsewhere (flwr-datasets, a script of yours)
as a `FederatedPartition`.

A Flower user partitions a Hugging Face table with a flwr-datasets `Partitioner`
(`IidPartitioner`, `DirichletPartitioner`, `PathologicalPartitioner`, ...): each
`partitioner.load_partition(i)` is a slice of the table. What fedjax_pals needs of it is the
row numbers of each slice, one list per client: `index_lists_from_partitioner` reads them
from a column of row numbers that the table carries (`ds.add_column("row", range(len(ds)))`
before `partitioner.dataset = ds`), and `partition_from_index_lists` makes the partition,
with a target T:

* `target_client=i` (or a group of lists): that list's examples are the target's: its
  validation set, and T is their label distribution (the `natural` scheme's convention);
* otherwise T is `target_label_dist` as given, or the label distribution of
  `target_test_indices` (the target's own test examples: a test partition's slice), or by
  default that of the whole test split. The validation set is then a T-distributed draw from
  the training examples that no list holds (a partitioner that dealt out every example leaves
  none: name a target client instead, or leave examples out).

The target's test set is `target_test_indices` where given, otherwise a draw of the test
split with label distribution T (as for every scheme: `partition_from_label_counts`).

`save_index_lists` writes the lists (and the target) as JSON, `load_index_lists` reads them
back, and the partition scheme `index_lists` (`config.partition.scheme = "index_lists"`,
`config.partition.index_lists_file = "clients.json"`) makes a run's clients from such a file:
the file is the bridge from an environment that holds flwr-datasets to one that holds
fedjax_pals (their pinned stacks need not agree).

The indices are rows of the data set's training split (`Dataset.train`) in the order the
data set holds them: a table partitioned by Flower and registered as a fedjax_pals data set
must keep its row order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedjax_pals import _validation
from fedjax_pals import hyperparameters as declared
from fedjax_pals.data import partitions as partitions_lib
from fedjax_pals.data.partitions import (
    MIN_TARGET_TEST_SIZE,
    FederatedPartition,
    Partition,
    PartitionContext,
    register_partition,
)

if TYPE_CHECKING:
    from fedjax_pals.data.datasets import RegisteredDataset

FORMAT_KEYS = ("clients", "target_client", "target_test_indices", "target_label_dist")


def index_lists_from_partitioner(partitioner: Any, index_column: str = "row") -> list[np.ndarray]:
    """Each partition's row numbers, read from `index_column` of `partitioner.load_partition(i)`
    for i in range(partitioner.num_partitions): the index lists of a flwr-datasets
    `Partitioner` (or anything with `num_partitions` and `load_partition(i)` returning a
    table with that column).

    The table given to the partitioner must carry its row numbers in `index_column`
    (`ds = ds.add_column("row", list(range(len(ds))))` before `partitioner.dataset = ds`):
    the slices a partitioner returns do not say where their rows came from. Needs only NumPy
    (flwr-datasets is not imported here).

    Raises:
      ValueError: a partitioner without partitions, or a partition without `index_column`.
    """
    count = getattr(partitioner, "num_partitions", None)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(
            f"expected a flwr-datasets Partitioner (num_partitions >= 1 and load_partition(i)), "
            f"got {type(partitioner).__name__} with num_partitions={count!r}."
        )
    lists = []
    for i in range(int(count)):
        part = partitioner.load_partition(i)
        names = list(getattr(part, "column_names", None) or [])
        if index_column not in names:
            raise ValueError(
                f"partition {i} has no column {index_column!r} of row numbers (its columns: "
                f"{names}); give the partitioner a table that carries them: "
                f"ds = ds.add_column({index_column!r}, list(range(len(ds)))) before "
                "partitioner.dataset = ds."
            )
        lists.append(np.asarray(part[index_column]))
    return lists


# ---- Checks -------------------------------------------------------------------------


def _index_array(name: str, values: Any, size: int, split: str) -> np.ndarray:
    """A 1-D array of distinct integers in [0, size): row numbers of `split`."""
    try:
        array = np.asarray(values)
    except ValueError as error:  # a ragged nesting
        raise ValueError(f"{name} must be a list of row numbers ({error}).") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of row numbers, got shape {array.shape}.")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if array.dtype == bool or not np.issubdtype(array.dtype, np.floating) or np.any(
            array != np.round(array)
        ):
            raise ValueError(
                f"{name} must hold integer row numbers, got dtype {array.dtype} "
                f"(e.g. {array[:3].tolist()})."
            )
    array = array.astype(np.int64)
    bad = array[(array < 0) | (array >= size)]
    if bad.size:
        raise ValueError(
            f"{name} holds row {int(bad[0])}, outside the {split} split's [0, {size}) "
            f"(the {split} split has {size} examples: rows of another table, or of the table "
            "before it was filtered?)."
        )
    unique, counts = np.unique(array, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"{name} holds row {int(unique[counts > 1][0])} twice.")
    return array


def _client_lists(client_indices: Any, size: int) -> list[np.ndarray]:
    if isinstance(client_indices, (str, bytes)) or not isinstance(
        client_indices, (Sequence, np.ndarray)
    ):
        raise ValueError(
            "client_indices must be a sequence of index lists, one per client, got "
            f"{type(client_indices).__name__}."
        )
    if len(client_indices) < 2:
        raise ValueError(
            f"client_indices must hold 2 or more lists (the training clients and the target, "
            f"or training clients beside a target given otherwise), got {len(client_indices)}."
        )
    lists = [_index_array(f"client_indices[{i}]", row, size, "train")
             for i, row in enumerate(client_indices)]
    empty = [i for i, row in enumerate(lists) if row.size == 0]
    if empty:
        raise ValueError(
            f"client_indices[{empty[0]}] is empty ({len(empty)} empty list(s): "
            f"{empty[:5]}); every client needs examples: drop the empty lists, or partition "
            "again (flwr-datasets' DirichletPartitioner: a larger min_partition_size)."
        )
    owner = np.full(size, -1, np.int64)
    for i, row in enumerate(lists):
        taken = owner[row] >= 0
        if np.any(taken):
            example = int(row[taken][0])
            raise ValueError(
                f"row {example} is in both client_indices[{owner[example]}] and "
                f"client_indices[{i}]: a client's examples are its own."
            )
        owner[row] = i
    return lists


def _target_group(target_client: Any, count: int) -> list[int]:
    group = [target_client] if np.ndim(target_client) == 0 else list(target_client)
    group = sorted({_validation.check_integer(
        "target_client", g, 0, count - 1, f" (a list of the {count} in client_indices)")
        for g in group})
    if not group or len(group) >= count:
        raise ValueError(
            f"target_client must name 1 to {count - 1} of the {count} lists (the others train), "
            f"got {len(group)}."
        )
    return group


# ---- The adapter --------------------------------------------------------------------


def partition_from_index_lists(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    client_indices: Sequence[Sequence[int]],
    *,
    target_client: int | Sequence[int] | None = None,
    target_label_dist: Any = None,
    target_test_indices: Sequence[int] | None = None,
    seed: int = 0,
    num_classes: int | None = None,
    target_test_size: int | None = None,
    val_size: int | None = None,
    min_target_test_size: int = MIN_TARGET_TEST_SIZE,
    description: str = "index lists",
) -> FederatedPartition:
    """The partition whose clients are `client_indices` (lists of row numbers of the train
    split, e.g. `index_lists_from_partitioner`), with a target (module docstring).

    Args:
      train_labels, test_labels: the labels of the data set's train and test splits.
      client_indices: one list per client; distinct rows, no row in two lists, none empty.
      target_client: the list (or lists) that is the target: its rows are the validation set
        and give T; the other lists train, in their order. None: T comes from
        `target_label_dist`, `target_test_indices` or the test split, and every list trains.
      target_label_dist: T as given (K values summing to 1); not with `target_client`.
      target_test_indices: the target's own test examples (rows of the test split): its test
        set as they are (T, unless given, is their label distribution). None: a draw of the
        test split with label distribution T.
      seed: the draws (validation and test sets, the order of each client's rows).
      num_classes: K (default: one more than the largest label).
      target_test_size, val_size: the sizes of the drawn test and validation sets (default:
        the largest the splits can give with label distribution T).
      min_target_test_size: the smallest target test set accepted (accuracy on fewer is noise).
      description: how logs and results.json name the partition's origin.

    Raises:
      ValueError: one line naming what is wrong: a list that is empty, holds a row twice or
        outside the split, a row in two lists, a target that names no list or every list, two
        sources of T, a T of the wrong length, no training example left for the validation
        set, a test set smaller than `min_target_test_size`.
    """
    seed = partitions_lib._check_seed(seed)
    min_test = _validation.check_positive_int("min_target_test_size", min_target_test_size)
    train, test, num_classes = partitions_lib._check_inputs(train_labels, test_labels, num_classes)
    lists = _client_lists(client_indices, len(train))
    own_test = None
    if target_test_indices is not None:
        own_test = _index_array("target_test_indices", target_test_indices, len(test), "test")
        if own_test.size < min_test:
            raise ValueError(
                f"target_test_indices holds {own_test.size} test examples, fewer than "
                f"min_target_test_size={min_test}: accuracy on so few is noise."
            )
        if target_test_size is not None:
            raise ValueError("target_test_size does not apply with target_test_indices (the "
                             "target is tested on all of them).")
    rng = partitions_lib._rng(seed, partitions_lib._STREAM_EXAMPLES)

    def counts_of(row):
        return np.bincount(train[row], minlength=num_classes)

    if target_client is not None:
        if target_label_dist is not None:
            raise ValueError(
                "give target_client or target_label_dist, not both: the target client's "
                "examples give T."
            )
        group = _target_group(target_client, len(lists))
        trains = [i for i in range(len(lists)) if i not in group]
        rows = [rng.permutation(lists[i]) for i in trains]
        rows.append(rng.permutation(np.concatenate([lists[g] for g in group])))
        who = (f"list {group[0]}" if len(group) == 1
               else f"lists {partitions_lib._shown_ids(group)} ({len(group)} lists)")
        what = f"{description}, {len(trains)} clients, {who} the target, seed {seed}"
        target = None
    else:
        rows = [rng.permutation(row) for row in lists]
        if target_label_dist is not None:
            target = _validation.check_distribution("target_label_dist", target_label_dist)
            if target.shape != (num_classes,):
                raise ValueError(
                    f"target_label_dist has {target.size} values, but there are K={num_classes} "
                    "classes."
                )
            source = "T given"
        elif own_test is not None:
            target = np.bincount(test[own_test], minlength=num_classes) / own_test.size
            source = "T of the target's test examples"
        else:
            target = np.bincount(test, minlength=num_classes) / test.size
            source = "T of the test split"
        free = np.ones(len(train), bool)
        free[np.concatenate(lists)] = False
        pools = partitions_lib._class_pools(np.where(free, train, -1), num_classes, rng)
        available = np.array([len(p) for p in pools])
        most = partitions_lib._largest_feasible_size(target, available)
        if val_size is not None:
            _validation.check_integer("val_size", val_size, 1, max(most, 1),
                                      " (the rows no list holds that follow T)")
        n_val = int(val_size) if val_size is not None else most
        if n_val == 0:
            lacking = np.flatnonzero((target > 0) & (available == 0)).tolist()
            raise ValueError(
                f"the target's validation set is drawn from the training rows no list holds, "
                f"and none of them is of class(es) {lacking} that T needs "
                f"({int(free.sum())} rows are free): name a target list (target_client), or "
                "leave rows of every class out of the lists."
            )
        want = partitions_lib.largest_remainder_counts(target, n_val)
        rows.append(rng.permutation(np.concatenate(
            [pools[k][: want[k]] for k in range(num_classes)])))
        what = f"{description}, {len(lists)} clients, {source}, seed {seed}"
        val_size = None  # drawn to size already
    counts = np.stack([counts_of(row) for row in rows])

    if own_test is None:
        made = partitions_lib._with_target_sets(
            train, test, rows, counts, rng, what, target_test_size, val_size, min_test
        )
    else:
        if val_size is not None:
            raise ValueError("val_size does not apply with a target list and target_test_indices "
                             "(the target is validated on all of its list).")
        made = partitions_lib._with_own_test_set(rows, counts, own_test, rng, num_classes, what)
    if target is not None:  # T exactly as given or measured, not its rounding to the draws
        made = dataclasses.replace(made, target_label_dist=target)
    return made


# ---- The file and the scheme `index_lists` ------------------------------------------


def save_index_lists(
    path: str | os.PathLike,
    client_indices: Sequence[Sequence[int]],
    *,
    target_client: int | Sequence[int] | None = None,
    target_test_indices: Sequence[int] | None = None,
    target_label_dist: Sequence[float] | None = None,
) -> str:
    """Writes the lists (and the target, as `partition_from_index_lists` takes it) as JSON:
    `{"clients": [[...], ...], "target_client": ..., ...}` (keys left out when None). Returns
    the path. The scheme `index_lists` reads the file (`partition.index_lists_file`)."""

    def plain(values):
        return np.asarray(values).tolist()

    record = {"clients": [plain(row) for row in client_indices]}
    for key, value in (("target_client", target_client),
                       ("target_test_indices", target_test_indices),
                       ("target_label_dist", target_label_dist)):
        if value is not None:
            record[key] = plain(value)
    path = os.fspath(path)
    with open(path, "w") as f:
        json.dump(record, f)
    return path


def load_index_lists(path: str | os.PathLike) -> dict[str, Any]:
    """The record `save_index_lists` wrote, as the keyword arguments of
    `partition_from_index_lists`: client_indices and, where the file has them, target_client,
    target_test_indices, target_label_dist.

    Raises:
      ValueError: a file that is missing, not JSON, or not such a record (named keys).
    """
    path = os.fspath(path)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"index lists file {path!r} does not exist.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"index lists file {path!r} is not JSON ({error}).") from None
    if not isinstance(record, dict) or not isinstance(record.get("clients"), list):
        raise ValueError(
            f"index lists file {path!r} must hold an object with \"clients\": a list of index "
            "lists (fedjax_pals.save_index_lists writes one)."
        )
    unknown = sorted(set(record) - set(FORMAT_KEYS))
    if unknown:
        raise ValueError(
            f"index lists file {path!r} has unknown key(s) {unknown}; known: {list(FORMAT_KEYS)}."
        )
    names = {"clients": "client_indices"}
    return {names.get(key, key): value for key, value in record.items()}


@dataclasses.dataclass(frozen=True)
class IndexListsFile(declared.Hyperparameters):
    index_lists_file: str | None = declared.hyperparameter(
        None, kind="text", optional=True,
        doc="a JSON file of index lists (fedjax_pals.save_index_lists): the clients, and the "
        "target")


def _file_of(values: IndexListsFile) -> str:
    if values.index_lists_file is None:
        raise ValueError(
            "index_lists_file is None: scheme='index_lists' reads the clients from a JSON file "
            "(fedjax_pals.save_index_lists writes one)."
        )
    return values.index_lists_file


def _index_lists_fit(values: IndexListsFile, dataset: RegisteredDataset) -> int:
    path = _file_of(values)
    try:
        record = load_index_lists(path)
        clients = record["client_indices"]
        if len(clients) < 2:
            raise ValueError(f"index lists file {path!r} holds {len(clients)} list(s); 2 or "
                             "more are needed.")
        if record.get("target_client") is None:
            return len(clients) + 1
        return len(clients) - len(_target_group(record["target_client"], len(clients))) + 1
    except ValueError as error:
        raise ValueError(f"index_lists_file: {error}") from None


def _index_lists_build(values: IndexListsFile, c: PartitionContext) -> FederatedPartition:
    path = _file_of(values)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    d = c.dataset
    try:
        return partition_from_index_lists(
            d.train.y, d.test.y, **load_index_lists(path), seed=c.seed,
            num_classes=d.num_classes,
            description=f"index lists of {os.path.basename(path)} (sha256 {digest})")
    except ValueError as error:
        raise ValueError(f"partition.index_lists_file {path!r}: {error}") from None


INDEX_LISTS = register_partition(Partition(
    "index_lists", _index_lists_build, IndexListsFile, _index_lists_fit,
    "index lists {index_lists_file}",
))
