"""Each training client's own evaluation examples: a validation set and a test set per client.

FedPALS evaluates one target. The questions asked of a federation are also per client: how well
does the model serve client i on *its* data (Li et al., ICLR 2020, q-FFL; Li et al., ICML 2021,
Ditto). `client_evaluation_sets` gives every training client

- a **validation set** held out of its own training examples: a stratified share
  `val_fraction` of each class it holds (at most c_ik - 1 of its c_ik examples of class k,
  so that S_i keeps its support), which no client trains on. It chooses what a client may
  choose on its own data (fine-tuning's steps, a personal model's early stopping) and, when
  the client is the run's target (`as_target`), the run's validation set, as the target's own
  training share is in the paper's protocol (App. B.4);
- a **test set** from the test split: the client's own test examples where the format has a
  per-client test split (`Dataset.test_client_ids`: LEAF, TFF, Parquet), at most `test_size`
  of them at random; otherwise `test_size` examples drawn from the test split with the
  client's label distribution S_i (largest-remainder counts, without replacement within the
  client, independently across clients): under label shift p(x | y) is shared, so this is a
  draw from the client's own distribution, as the target's test set is a draw with T.

Everything is a function of the seed (its own stream), so every run of a sweep on one
partition holds out the same examples and tests on the same sets.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_pals import _validation
from fedjax_pals.data.datasets import Dataset
from fedjax_pals.data.partitions import (
    FederatedPartition,
    _largest_remainder_many,
    _pad,
    hold_out_stratified,
)

_STREAM_CLIENT_TEST = 5  # partitions.py's streams are 1-4


@dataclasses.dataclass(frozen=True, eq=False)
class ClientEvaluationSets:
    """The training clients' own validation and test examples (row i: client i).

    Attributes:
      val_indices: (M, V) int32 into the train split, valid in [:val_sizes[i]], padded with 0;
        disjoint from every client's training examples.
      val_sizes: (M,) int64 (0 for a client too small to hold one out).
      test_indices: (M, T) int32 into the test split, valid in [:test_sizes[i]].
      test_sizes: (M,) int64 (0 for a client without test examples: its accuracy is NaN).
      description: where the sets come from, for results.json.
    All arrays are read-only.
    """

    val_indices: np.ndarray
    val_sizes: np.ndarray
    test_indices: np.ndarray
    test_sizes: np.ndarray
    description: str

    def __post_init__(self) -> None:
        for name, dtype in (("val_indices", np.int32), ("val_sizes", np.int64),
                            ("test_indices", np.int32), ("test_sizes", np.int64)):
            array = np.array(getattr(self, name), dtype=dtype)
            array.flags.writeable = False
            object.__setattr__(self, name, array)
        m = self.val_sizes.shape[0]
        for kind in ("val", "test"):
            indices, sizes = getattr(self, f"{kind}_indices"), getattr(self, f"{kind}_sizes")
            if indices.ndim != 2 or indices.shape[0] != m or sizes.shape != (m,):
                raise ValueError(
                    f"{kind}_indices (M, n) and {kind}_sizes (M,) disagree with the {m} clients: "
                    f"{indices.shape}, {sizes.shape}"
                )
            if np.any(sizes < 0) or (m and sizes.max() > indices.shape[1]):
                raise ValueError(f"{kind}_sizes must be in [0, {indices.shape[1]}]")

    @property
    def num_clients(self) -> int:
        return int(self.val_sizes.shape[0])

    def summary(self) -> dict:
        """JSON-ready sizes of the sets (results.json's `client_sets`)."""
        return {
            "description": self.description,
            "val_sizes": self.val_sizes.tolist(),
            "test_sizes": self.test_sizes.tolist(),
        }


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    """(M, width) rows padded with 0, at least one column (a jitted gather needs one)."""
    return _pad([*rows, np.zeros(1, np.int32)])[:-1] if rows else np.zeros((0, 1), np.int32)


def _rows(flat: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(sizes)[:-1]) if len(sizes) else []


def client_evaluation_sets(
    partition: FederatedPartition,
    dataset: Dataset,
    *,
    seed: int,
    val_fraction: float,
    test_size: int,
) -> tuple[FederatedPartition, ClientEvaluationSets]:
    """The partition with each client's validation share held out, and the clients' sets.

    Args:
      partition: the run's partition (its training clients; the target's sets are kept).
      dataset: the data set it indexes (its test split, and `test_client_ids` if it has them).
      seed: the run's seed (the draws use streams of their own).
      val_fraction: the share of each class a client holds that becomes its validation set,
        in [0, 1): round(val_fraction * c_ik), at most c_ik - 1 (`hold_out_stratified`).
      test_size: examples per client's test set, >= 1: drawn with S_i from the test split, or
        at most this many of the client's own test examples.

    Returns:
      (partition, sets): the clients train on what is not their validation set (their sizes
      and label counts are of that, so S_i is the label distribution they train on).

    Raises:
      ValueError: bad arguments, a partition that already holds examples out (unknown T's
        calibration share: the two would take from the same examples), or a test split
        without the examples some client's S_i needs (the class is named).
    """
    fraction = _validation.check_number(
        "val_fraction", val_fraction, low=0.0, high=1.0, high_open=True)
    test_size = _validation.check_positive_int("test_size", test_size)
    if partition.held_out_indices.size:
        raise ValueError(
            "the partition already holds examples out of training (target_holdout, unknown T's "
            "calibration share); per-client validation sets would take from the same examples"
        )
    sizes_before = partition.client_sizes
    kept = hold_out_stratified(partition, dataset.train.y, fraction, seed=seed)
    held = kept.held_out_indices
    val_rows = _rows(held, sizes_before - kept.client_sizes) if held.size else [
        np.zeros(0, np.int32) for _ in range(partition.num_clients)]
    kept = dataclasses.replace(
        kept, held_out_indices=np.zeros(0, np.int32), description=partition.description)
    rng = np.random.default_rng([_STREAM_CLIENT_TEST, int(seed)])
    if dataset.test_client_ids is not None and dataset.client_ids is not None:
        test_rows, where = _own_test_examples(kept, dataset, test_size, rng)
    else:
        test_rows, where = _drawn_test_examples(kept, dataset, test_size, rng)
    val_sizes = np.array([len(r) for r in val_rows], np.int64)
    description = (f"per client: {fraction:g} of each class held out of training as its "
                   f"validation set; {where}")
    sets = ClientEvaluationSets(
        val_indices=_padded(val_rows),
        val_sizes=val_sizes,
        test_indices=_padded(test_rows),
        test_sizes=np.array([len(r) for r in test_rows], np.int64),
        description=description,
    )
    return kept, sets


def _own_test_examples(partition, dataset, test_size, rng) -> tuple[list[np.ndarray], str]:
    """Each client's own test examples (its data id's), at most `test_size` at random."""
    ids = dataset.client_ids[partition.client_indices[:, 0]]  # a natural client: one id
    test_ids = np.asarray(dataset.test_client_ids)
    order = np.argsort(test_ids, kind="stable")
    starts = np.searchsorted(test_ids[order], ids, side="left")
    ends = np.searchsorted(test_ids[order], ids, side="right")
    rows = []
    for start, end in zip(starts, ends):
        own = order[start:end]
        rows.append(np.sort(rng.permutation(own)[:test_size]).astype(np.int32))
    return rows, f"its own test examples (the format's split), at most {test_size}"


def _drawn_test_examples(partition, dataset, test_size, rng) -> tuple[list[np.ndarray], str]:
    """`test_size` test examples per client with its label distribution S_i."""
    k = partition.num_classes
    test = np.asarray(dataset.test.y)
    pools = [np.flatnonzero(test == c) for c in range(k)]
    available = np.array([len(p) for p in pools])
    counts = np.stack([
        _largest_remainder_many(dist, np.array([test_size]))[0]
        for dist in partition.client_label_dists
    ]) if partition.num_clients else np.zeros((0, k), np.int64)
    short = counts > available[None, :]
    if short.any():
        client, c = map(int, np.argwhere(short)[0])
        raise ValueError(
            f"client {client}'s test set of {test_size} examples with its label distribution "
            f"needs {counts[client, c]} test examples of class {c}, but the test split has "
            f"{available[c]}; give a smaller evaluation.client_test_size"
        )
    rows = []
    for row in counts:
        parts = [rng.choice(pools[c], size=int(n), replace=False) for c, n in enumerate(row) if n]
        rows.append(np.sort(np.concatenate(parts)).astype(np.int32))
    return rows, f"{test_size} test examples drawn from the test split with its S_i"
