"""Label-shift federated partitions: training clients plus one target client.

The FedPALS experiments (Listo Zec et al., Sec. 5, App. B.4) split a data set among
``num_clients`` clients with a label-skew scheme and then designate the LAST client as the
target: its label distribution is the target marginal T(Y), its share of the training split is
held out as a validation set drawn from T (used to tune lambda, early stopping, hyperparameters;
never trained on), and the target test set is drawn from the test split with label distribution
T. The remaining ``M = num_clients - 1`` clients train.

The label-skew schemes reduce to a (num_clients, K) matrix of per-class example counts, and
`partition_from_label_counts` draws disjoint examples matching it; `natural_partition` takes the
clients the data come with (client ids). Every function is deterministic given ``seed``. The
config's schemes are registered at the end (`register_partition`, config.partition.scheme).

Rounding a distribution p to integer counts summing to n uses the largest remainder (Hamilton)
method, `largest_remainder_counts`.

The target sets must be able to follow T: the test split must hold every class with T_k > 0, and
the target test set must have at least ``min_target_test_size`` (default `MIN_TARGET_TEST_SIZE`
= 30) examples; the validation set is the target's own (non-empty) training share or a
T-distributed subsample of it. Otherwise the functions raise, naming the class that limits the
test set and the remedies, rather than report accuracy on a handful of examples.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedjax_pals import _validation, extensions
from fedjax_pals import hyperparameters as declared

if TYPE_CHECKING:
    from fedjax_pals.data.datasets import Dataset, RegisteredDataset

# The smallest target test set the partition functions accept (min_target_test_size).
# The accuracy measured on n examples has a standard error of up to 0.5 / sqrt(n): 9
# points at n = 30, so a smaller set reports noise, not a measurement. The paper's
# target test sets hold thousands (Fashion-MNIST C = 3: 3000).
MIN_TARGET_TEST_SIZE = 30

# Independent random streams per purpose, so e.g. the Dirichlet draws of a
# partition do not shift when the example-drawing code changes.
_STREAM_LABELS = 1
_STREAM_EXAMPLES = 2
_STREAM_RESAMPLE = 3
_STREAM_HOLD_OUT = 4


@dataclasses.dataclass(frozen=True, eq=False)
class FederatedPartition:
    """Indices of M training clients and the target's validation/test sets.

    Attributes:
      client_indices: (M, max_n) int32 indices into the train split; row i is
        valid in ``[:client_sizes[i]]`` and padded with 0 after.
      client_sizes: (M,) int64, all > 0.
      client_label_counts: (M, K) int64 label histogram of each client.
      target_label_dist: (K,) float64 target marginal T(Y), sums to 1.
      target_val_indices: (n_val,) int32 into the train split, label
        distribution T, disjoint from every client.
      target_test_indices: (n_test,) int32 into the test split, label distribution T.
      num_classes: K.
      description: how the partition was made, for logs and result files.
      held_out_indices: (n_h,) int32 into the train split: examples the clients keep out of
        training (`hold_out_stratified`: calibration data for estimating T), disjoint from
        `client_indices`; empty (the default) for a partition that trains on everything.
    All arrays are read-only.
    """

    client_indices: np.ndarray
    client_sizes: np.ndarray
    client_label_counts: np.ndarray
    target_label_dist: np.ndarray
    target_val_indices: np.ndarray
    target_test_indices: np.ndarray
    num_classes: int
    description: str
    held_out_indices: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))

    def __post_init__(self) -> None:
        casts = {
            "client_indices": np.int32,
            "client_sizes": np.int64,
            "client_label_counts": np.int64,
            "target_label_dist": np.float64,
            "target_val_indices": np.int32,
            "target_test_indices": np.int32,
            "held_out_indices": np.int32,
        }
        for name, dtype in casts.items():
            arr = np.array(getattr(self, name), dtype=dtype)  # private copy, then frozen
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        m, k = self.client_label_counts.shape if self.client_label_counts.ndim == 2 else (-1, -1)
        if k != self.num_classes:
            raise ValueError(
                f"client_label_counts must be (M, {self.num_classes}), "
                f"got {self.client_label_counts.shape}"
            )
        if self.client_sizes.shape != (m,) or self.client_indices.shape[:-1] != (m,):
            raise ValueError(
                "client_indices (M, max_n), client_sizes (M,) and client_label_counts (M, K) "
                f"disagree: {self.client_indices.shape}, {self.client_sizes.shape}, "
                f"{self.client_label_counts.shape}"
            )
        if np.any(self.client_sizes <= 0):
            raise ValueError(f"every client needs examples; sizes {self.client_sizes.tolist()}")
        if np.any(self.client_label_counts.sum(axis=1) != self.client_sizes):
            raise ValueError("client_label_counts rows must sum to client_sizes")
        if self.client_indices.shape[1] < self.client_sizes.max():
            raise ValueError("client_indices is narrower than the largest client")
        if self.target_label_dist.shape != (self.num_classes,) or not np.isclose(
            self.target_label_dist.sum(), 1.0
        ):
            raise ValueError(
                f"target_label_dist must be a ({self.num_classes},) distribution, "
                f"got {self.target_label_dist}"
            )

    @property
    def num_clients(self) -> int:
        """M, the number of training clients (the target is not counted)."""
        return int(self.client_sizes.shape[0])

    @property
    def client_label_dists(self) -> np.ndarray:
        """(M, K) float64 empirical label distributions S_i(Y) = counts / n_i."""
        return self.client_label_counts / self.client_sizes[:, None].astype(np.float64)

    @property
    def client_mask(self) -> np.ndarray:
        """(M, max_n) bool, True where ``client_indices`` holds a real example."""
        return np.arange(self.client_indices.shape[1])[None, :] < self.client_sizes[:, None]

    def client_example_indices(self, i: int) -> np.ndarray:
        """The unpadded train-split indices of client i."""
        return self.client_indices[i, : self.client_sizes[i]]

    @property
    def target_labels_uncovered(self) -> list[int]:
        """The labels k with T(k) > 0 that no training client holds: no method trained on
        these clients can learn them, so they cap the target accuracy at 1 - sum_k T(k)."""
        held = self.client_label_counts.sum(axis=0) > 0
        return np.flatnonzero((self.target_label_dist > 0) & ~held).tolist()

    @property
    def projection_distance(self) -> float:
        """d(T, S) = min over the simplex of ||T - alpha^T S||^2 (Sec. 5): how far the
        target lies from the convex hull of the training clients' label distributions."""
        from fedjax_pals.server_weights import projection_distance

        return float(projection_distance(self.client_label_dists, self.target_label_dist))

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable description of the partition."""
        held_out = self.held_out_indices.size
        held_out = {"n_held_out": int(held_out)} if held_out else {}  # absent: as before
        return {
            "projection_distance": self.projection_distance,
            "num_clients": self.num_clients,
            "client_sizes": self.client_sizes.tolist(),
            "client_label_counts": self.client_label_counts.tolist(),
            "client_label_dists": self.client_label_dists.tolist(),
            "target_label_dist": self.target_label_dist.tolist(),
            "target_labels_uncovered": self.target_labels_uncovered,
            "n_val": int(self.target_val_indices.shape[0]),
            "n_test": int(self.target_test_indices.shape[0]),
            "description": self.description,
            **held_out,
        }


# ---- Helpers -------------------------------------------------------------


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([stream, seed])


def _check_seed(seed: int) -> int:
    return _validation.check_integer("seed", seed, 0)


def _check_labels(labels: Any, what: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of class labels, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{what} must hold integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise ValueError(f"{what} holds a negative label ({labels.min()})")
    return labels


def _check_inputs(train_labels, test_labels, num_classes):
    train = _check_labels(train_labels, "train_labels")
    test = _check_labels(test_labels, "test_labels")
    for name, labels in (("train_labels", train), ("test_labels", test)):
        if labels.size == 0:
            raise ValueError(f"{name} is empty")
    largest = int(max(train.max(), test.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    elif largest >= num_classes:
        raise ValueError(
            f"labels must lie in [0, num_classes={num_classes}), found label {largest}"
        )
    return train, test, int(num_classes)


def _check_num_clients(num_clients: int) -> int:
    return _validation.check_integer("num_clients", num_clients, 2, why=" (the target included)")


def _as_distribution(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or not np.isfinite(p).all() or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"expected a non-negative 1-D vector with positive mass, got {p}")
    return p / p.sum()


def _largest_remainder_many(p: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Largest-remainder counts of the distribution ``p`` for every n in ``ns``: (len(ns), K)."""
    exact = ns[:, None].astype(np.float64) * p[None, :]
    counts = np.floor(exact).astype(np.int64)
    short = ns - counts.sum(axis=1)
    frac = exact - counts
    frac[:, p == 0] = -1.0  # never round a zero-probability class up
    order = np.argsort(-frac, axis=1, kind="stable")  # ties -> lower class index
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p.shape[0])[None, :], axis=1)
    return counts + (rank < short[:, None])


def largest_remainder_counts(p: np.ndarray, n: int) -> np.ndarray:
    """Integer counts c >= 0 with sum(c) = n and c close to p * n (Hamilton's method).

    ``p`` is non-negative and is normalised first. c_k = floor(p_k n), plus one
    for the n - sum floor(p n) classes with the largest fractional parts (ties
    to the lower index). Classes with p_k = 0 always get 0.
    """
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    return _largest_remainder_many(_as_distribution(p), np.array([int(n)]))[0]


def _largest_feasible_size(p: np.ndarray, available: np.ndarray) -> int:
    """Largest n with largest_remainder_counts(p, n) <= available elementwise (0 if none).

    Largest-remainder rounding is not monotone in n (the Alabama paradox), so
    every n up to the bound where floor(p_k n) alone exceeds a pool is checked.
    """
    p = _as_distribution(p)
    support = p > 0
    upper = int(np.min((available[support] + 1) / p[support]))  # beyond: infeasible
    for hi in range(upper, 0, -4096):
        ns = np.arange(max(1, hi - 4095), hi + 1)
        ok = np.all(_largest_remainder_many(p, ns) <= available[None, :], axis=1)
        if ok.any():
            return int(ns[np.nonzero(ok)[0][-1]])
    return 0


def _class_pools(labels: np.ndarray, num_classes: int, rng: np.random.Generator):
    """Shuffled index arrays of each class."""
    return [rng.permutation(np.flatnonzero(labels == k)) for k in range(num_classes)]


def _pad(rows: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _check_test_split_covers_target(target_dist, test_available, description) -> None:
    """Every class with T_k > 0 must have examples in the test split."""
    lacking = np.flatnonzero((target_dist > 0) & (test_available == 0))
    if lacking.size:
        shares = ", ".join(f"T_{k} = {target_dist[k]:.4g}" for k in lacking)
        raise ValueError(
            f"the target test set cannot follow T: T needs class(es) {lacking.tolist()} "
            f"({shares}) but the test split has no example of them ({description}). Use "
            "another seed or other partition parameters, so that the target avoids those "
            "classes, or a test split that holds every class."
        )


def _check_target_test_size(n_test, min_size, target_dist, test_available, description) -> None:
    """The target test set must hold at least ``min_size`` examples."""
    if n_test >= min_size:
        return
    # The class that limits a T-distributed test set: the smallest n_k / T_k.
    support = target_dist > 0
    capacity = np.where(support, test_available / np.where(support, target_dist, 1.0), np.inf)
    k = int(np.argmin(capacity))
    raise ValueError(
        f"the target test set would hold only {n_test} examples, fewer than "
        f"min_target_test_size={min_size}, and accuracy on so few is noise ({description}). "
        f"T puts {target_dist[k]:.4g} on class {k}, of which the test split has "
        f"{test_available[k]} examples, so a T-distributed test set can hold about "
        f"{capacity[k]:.0f}. Use another seed or other partition parameters (a target with "
        f"less weight on class {k}), a test split with more examples of class {k}, or pass "
        f"min_target_test_size <= {n_test} to accept so small a set."
    )


# ---- The common core -----------------------------------------------------


def partition_from_label_counts(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    label_counts: np.ndarray,
    *,
    seed: int,
    description: str,
    num_classes: int | None = None,
    target_test_size: int | None = None,
    val_size: int | None = None,
    min_target_test_size: int = MIN_TARGET_TEST_SIZE,
) -> FederatedPartition:
    """Builds a partition whose client i holds ``label_counts[i, k]`` examples of class k.

    ``label_counts`` is (num_clients, K); rows 0..num_clients-2 are the training clients and the
    last row is the target. Examples are drawn without replacement from each class's shuffled
    pool, so all clients and the target validation set are disjoint.

    Target: T(Y) = label_counts[-1] / sum(label_counts[-1]). The validation set is the target's
    own share, or a subsample of ``val_size`` examples with per-class counts
    largest_remainder(T, val_size). The test set is drawn from the test split with counts
    largest_remainder(T, n_test), where n_test is ``target_test_size`` or, by default, the
    largest n whose counts the test split can supply.

    Raises:
      ValueError: malformed counts, a class pool smaller than the counts ask for, a training
        client or the target with no examples, an infeasible ``target_test_size`` /
        ``val_size``, a test split without a class T needs, or a target test set smaller than
        ``min_target_test_size`` (the message names the class that limits it).
    """
    seed = _check_seed(seed)
    min_test = _validation.check_positive_int("min_target_test_size", min_target_test_size)
    train, test, num_classes = _check_inputs(train_labels, test_labels, num_classes)
    counts = np.asarray(label_counts)
    if counts.ndim != 2 or counts.shape[1] != num_classes:
        raise ValueError(
            f"label_counts must be (num_clients, num_classes={num_classes}), got {counts.shape}"
        )
    if counts.size and not np.issubdtype(counts.dtype, np.integer):
        if not np.all(np.isfinite(counts)) or np.any(counts != np.round(counts)):
            raise ValueError("label_counts must hold whole numbers")
    counts = counts.astype(np.int64)
    if np.any(counts < 0):
        raise ValueError("label_counts must be non-negative")
    _check_num_clients(counts.shape[0])

    rng = _rng(seed, _STREAM_EXAMPLES)
    train_pools = _class_pools(train, num_classes, rng)
    available = np.array([len(p) for p in train_pools])
    demand = counts.sum(axis=0)
    if np.any(demand > available):
        k = int(np.argmax(demand - available))
        raise ValueError(
            f"label_counts ask for {demand[k]} examples of class {k} but the train split "
            f"has only {available[k]}"
        )
    train_sizes = counts[:-1].sum(axis=1)
    if np.any(train_sizes == 0):
        empty = np.flatnonzero(train_sizes == 0).tolist()
        raise ValueError(
            f"training client(s) {empty} would get no examples ({description}); try another "
            "seed, more labels per client, a larger Dirichlet beta, or fewer clients"
        )
    if counts[-1].sum() == 0:
        raise ValueError(
            f"the target client would get no examples, so T(Y) is undefined ({description}); "
            "try another seed or different partition parameters"
        )

    # Consecutive slices of each shuffled pool: disjoint by construction.
    offsets = np.concatenate([np.zeros((1, num_classes), np.int64), np.cumsum(counts, axis=0)])
    rows = []
    for i in range(counts.shape[0]):
        idx = np.concatenate(
            [train_pools[k][offsets[i, k] : offsets[i + 1, k]] for k in range(num_classes)]
        )
        # Mixed class order, so a client's first batch is not all one class.
        rows.append(rng.permutation(idx))
    return _with_target_sets(
        train, test, rows, counts, rng, description, target_test_size, val_size, min_test
    )


def _with_target_sets(
    train, test, rows, counts, rng, description, target_test_size, val_size, min_test
) -> FederatedPartition:
    """The partition of the clients `rows` (indices into the train split; the last is the
    target, whose share is its validation set) and the test split's T-distributed target test
    set: the part every partition shares, drawing from `rng` after the rows."""
    num_classes = counts.shape[1]
    train_sizes, target_counts = counts[:-1].sum(axis=1), counts[-1]
    target_dist = target_counts / target_counts.sum()
    val = rows[-1]
    if val_size is not None:
        if not isinstance(val_size, (int, np.integer)) or not 1 <= val_size <= len(val):
            raise ValueError(
                f"val_size must be an int in [1, {len(val)}] (the target's training share), "
                f"got {val_size!r}"
            )
        # T * val_size <= target_counts, so the rounded counts always fit.
        want = largest_remainder_counts(target_dist, int(val_size))
        val_labels = train[val]
        val = np.concatenate([val[val_labels == k][: want[k]] for k in range(num_classes)])
        if len(val) != val_size:  # pragma: no cover - guarded by the bound above
            raise ValueError(f"could not draw a T-distributed validation set of {val_size}")
        val = rng.permutation(val)

    test_pools = _class_pools(test, num_classes, rng)
    test_available = np.array([len(p) for p in test_pools])
    _check_test_split_covers_target(target_dist, test_available, description)
    if target_test_size is None:
        n_test = _largest_feasible_size(target_dist, test_available)
    else:
        if not isinstance(target_test_size, (int, np.integer)) or target_test_size < 1:
            raise ValueError(f"target_test_size must be a positive int, got {target_test_size!r}")
        n_test = int(target_test_size)
    test_counts = largest_remainder_counts(target_dist, n_test)
    if np.any(test_counts > test_available):
        k = int(np.argmax(test_counts - test_available))
        raise ValueError(
            f"target_test_size={n_test} needs {test_counts[k]} test examples of class {k} "
            f"(T_k={target_dist[k]:.4g}) but the test split has {test_available[k]}; the largest "
            f"feasible size is {_largest_feasible_size(target_dist, test_available)}"
        )
    _check_target_test_size(n_test, min_test, target_dist, test_available, description)
    test_idx = rng.permutation(
        np.concatenate([test_pools[k][: test_counts[k]] for k in range(num_classes)])
    )

    return FederatedPartition(
        client_indices=_pad(rows[:-1]),
        client_sizes=train_sizes,
        client_label_counts=counts[:-1],
        target_label_dist=target_dist,
        target_val_indices=val,
        target_test_indices=test_idx,
        num_classes=num_classes,
        description=description,
    )


# ---- Schemes -------------------------------------------------------------


def _describe(scheme: str, num_clients: int, seed: int) -> str:
    return f"{scheme}, {num_clients} clients ({num_clients - 1} train + target), seed {seed}"


def _scheme(draw: Callable[..., tuple[np.ndarray, str]]) -> Callable[..., FederatedPartition]:
    """A partition function from `draw(rng, train, num_clients, num_classes, **params) ->
    (label_counts, description)`: the checks before it and the examples drawn to its counts
    after it (`partition_from_label_counts`) are every label-count scheme's."""

    @functools.wraps(draw)
    def partition(
        train_labels: np.ndarray,
        test_labels: np.ndarray,
        *,
        num_clients: int,
        seed: int,
        num_classes: int | None = None,
        target_test_size: int | None = None,
        val_size: int | None = None,
        min_target_test_size: int = MIN_TARGET_TEST_SIZE,
        **params: Any,
    ) -> FederatedPartition:
        seed = _check_seed(seed)
        num_clients = _check_num_clients(num_clients)
        train, test, num_classes = _check_inputs(train_labels, test_labels, num_classes)
        rng = _rng(seed, _STREAM_LABELS)
        counts, what = draw(rng, train, num_clients, num_classes, **params)
        return partition_from_label_counts(
            train, test, counts, seed=seed, description=_describe(what, num_clients, seed),
            num_classes=num_classes, target_test_size=target_test_size, val_size=val_size,
            min_target_test_size=min_target_test_size,
        )

    # Its signature: the partition function's, with draw's keyword arguments for **params.
    common = [*inspect.signature(partition, follow_wrapped=False).parameters.values()][:-1]
    own = [p for p in inspect.signature(draw).parameters.values() if p.kind == p.KEYWORD_ONLY]
    partition.__signature__ = inspect.Signature(common[:3] + own + common[3:])
    return partition


def examples_per_client_of(examples_per_client: Any, num_train: int, num_clients: int) -> int:
    """The examples each client of an equal-size scheme gets: `examples_per_client`, or
    num_train // num_clients for None; a positive int whose total fits the training split."""
    if examples_per_client is None:
        examples_per_client = num_train // num_clients
    if not isinstance(examples_per_client, (int, np.integer)) or examples_per_client < 1:
        raise ValueError(
            f"examples_per_client must be a positive int, got {examples_per_client!r} "
            f"({num_train} training examples for {num_clients} clients)"
        )
    n = int(examples_per_client)
    if n * num_clients > num_train:
        raise ValueError(
            f"{num_clients} clients x {n} examples exceed the {num_train} training examples"
        )
    return n


def _draw_label_sets(
    rng: np.random.Generator, num_clients: int, num_classes: int, labels_per_client: int
) -> np.ndarray:
    """(num_clients, K) bool: client i (the last one is the target) holds C = labels_per_client
    distinct labels drawn uniformly at random. Both sparsity schemes use these draws, so for a
    seed they give every client the same labels and differ only in the counts."""
    labels_per_client = _validation.check_integer("labels_per_client", labels_per_client, 1,
                                                  num_classes)
    holds = np.zeros((num_clients, num_classes), dtype=bool)
    for i in range(num_clients):
        holds[i, rng.choice(num_classes, size=labels_per_client, replace=False)] = True
    return holds


@_scheme
def sparsity_partition(rng, train, num_clients, num_classes, *, labels_per_client):
    """Sparsity sampling as the FedPALS paper states it (Sec. 5, App. B.4): "Each client is
    assigned C random labels, with an equal number of samples for each label and no overlap
    among clients."

    Each of the ``num_clients`` clients (target included) draws C = ``labels_per_client``
    distinct labels uniformly at random. Let h_k be the number of clients holding label k and
    n_k its training examples. Every client, the target too, gets the SAME number

        c = min_{k : h_k > 0} floor(n_k / h_k)

    of disjoint examples of each of its C labels: n_i = C c for every client, S_i(Y) and T(Y)
    are exactly uniform over their C labels, and the sizes are bounded by the scarcest pool
    (the label with the fewest examples per holder). Examples of a label beyond h_k c are
    unused; labels nobody holds are unused. As in McMahan et al. (2017)'s equal shards, all
    clients have one size, so FedAvg's weights are uniform.

    `niid_bench_sparsity_partition` is the other reading (NIID-Bench's "#C=k"). Labels of the
    target that no training client holds: ``FederatedPartition.target_labels_uncovered``.

    Raises:
      ValueError: C not in [1, K], num_clients < 2, a held label with fewer training
        examples than holders (c would be 0), or target sets that cannot follow T
        (`partition_from_label_counts`).
    """
    holds = _draw_label_sets(rng, num_clients, num_classes, labels_per_client)
    available = np.bincount(train, minlength=num_classes)
    holders = holds.sum(axis=0)
    held = np.flatnonzero(holders > 0)
    per_holder = available[held] // holders[held]
    scarcest = int(held[np.argmin(per_holder)])
    per_label = int(per_holder.min())
    if per_label < 1:
        raise ValueError(
            f"class {scarcest} has {available[scarcest]} training examples but "
            f"{holders[scarcest]} clients hold it, so an equal count per label would be 0; use "
            "fewer clients, fewer labels per client, or another seed"
        )
    counts = holds.astype(np.int64) * per_label
    return counts, f"sparsity C={labels_per_client} ({per_label} per label)"


@_scheme
def niid_bench_sparsity_partition(rng, train, num_clients, num_classes, *, labels_per_client):
    """NIID-Bench's "#C=k" label split (Li et al., 2022, "noniid-#label"): each label's
    examples are split evenly among the clients that hold it.

    The clients (target included) draw their C = ``labels_per_client`` labels as in
    `sparsity_partition` (NIID-Bench itself gives client i label i mod K plus C - 1 random
    ones). The training examples of label k are split evenly and disjointly among the h_k
    clients holding it: each gets floor(n_k / h_k) and n_k mod h_k random holders get one more.
    Labels nobody holds are unused. Every client has exactly C labels, but in unequal
    proportions (h_k differs between its labels), so T(Y) is NOT uniform over the target's
    labels, unlike the FedPALS paper's reading (`sparsity_partition`), which uses fewer examples.

    Raises:
      ValueError: C not in [1, K], num_clients < 2, or a held label with
        fewer training examples than holders (a client would miss a label),
        or target sets that cannot follow T (`partition_from_label_counts`).
    """
    holds = _draw_label_sets(rng, num_clients, num_classes, labels_per_client)
    available = np.bincount(train, minlength=num_classes)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for k in range(num_classes):
        holders = np.flatnonzero(holds[:, k])
        if holders.size == 0:
            continue
        if available[k] < holders.size:
            raise ValueError(
                f"class {k} has {available[k]} training examples but {holders.size} clients "
                f"hold it, so some would get none; use fewer clients, fewer labels per "
                "client, or another seed"
            )
        base, extra = divmod(int(available[k]), holders.size)
        counts[holders, k] = base
        counts[rng.choice(holders, size=extra, replace=False), k] += 1
    return counts, f"NIID-Bench sparsity C={labels_per_client}"


def _dirichlet(rng: np.random.Generator, beta: float, size: int, num: int) -> np.ndarray:
    """(num, size) rows ~ Dir_size(beta), guarding against all-zero rows at tiny beta."""
    p = rng.dirichlet(np.full(size, beta), size=num)
    bad = ~np.isfinite(p).all(axis=1) | (p.sum(axis=1) <= 0)
    # With beta << 1 every Gamma draw can underflow; such a row is numerically
    # a point mass, so put it on one uniformly chosen coordinate.
    for i in np.flatnonzero(bad):
        p[i] = 0.0
        p[i, rng.integers(size)] = 1.0
    return p


@_scheme
def dirichlet_partition(rng, train, num_clients, num_classes, *, beta, examples_per_client=None):
    """Dirichlet sampling as in FedPALS (App. B.4; Yurochkin et al., 2019): per client over classes.

    Each client i (target included) draws p_i ~ Dir_K(beta) and gets n = ``examples_per_client``
    (default ``len(train) // num_clients``) examples, with per-class counts
    largest_remainder(p_i, n), drawn without replacement from the class pools. Clients are
    served in a random order; when a class pool runs out, the shortfall is redrawn (largest
    remainder again) from p_i restricted to the classes that still have examples, repeating
    until the client has n examples (if p_i has no mass left on those classes, the remaining
    pool sizes are used as the distribution). The reported histograms (and so T) are the counts
    actually drawn.

    This is NOT NIID-Bench's Dirichlet scheme (per class over clients); see
    `niid_bench_dirichlet_partition` for that one.

    Raises:
      ValueError: beta <= 0, num_clients < 2, examples_per_client < 1,
        num_clients * examples_per_client > len(train), or target sets that
        cannot follow T (`partition_from_label_counts`).
    """
    beta = _validation.check_number("beta", beta, low=0.0, low_open=True)
    n = examples_per_client_of(examples_per_client, len(train), num_clients)

    p = _dirichlet(rng, beta, num_classes, num_clients)
    remaining = np.bincount(train, minlength=num_classes).astype(np.int64)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for i in rng.permutation(num_clients):
        want = largest_remainder_counts(p[i], n)
        while True:
            take = np.minimum(want, remaining)
            counts[i] += take
            remaining -= take
            short = n - int(counts[i].sum())
            if short == 0:
                break
            # Each pass draws >= 1 example (want sums to short over classes
            # with examples left), and n * num_clients <= len(train).
            q = np.where(remaining > 0, p[i], 0.0)
            if q.sum() <= 0:
                q = remaining.astype(np.float64)
            want = largest_remainder_counts(q, short)
    return counts, f"dirichlet beta={beta:g} ({n}/client)"


@_scheme
def niid_bench_dirichlet_partition(
    rng, train, num_clients, num_classes, *, beta, min_size=10, max_tries=1000
):
    """NIID-Bench's Dirichlet split (Li et al., 2022, "noniid-labeldir"): per class over clients.

    For each class k, q_k ~ Dir_M(beta) over the ``num_clients`` clients (target included)
    splits class k's examples: client j gets the slice between the cut points floor(cumsum(q_k)
    * n_k). As in NIID-Bench, a client that already holds >= N / num_clients examples gets q_kj
    = 0, and the whole draw is repeated until every client has >= ``min_size`` examples. Unlike
    the FedPALS scheme (`dirichlet_partition`), client sizes vary.

    Raises:
      ValueError: beta <= 0, num_clients < 2, min_size < 1, no draw met
        ``min_size`` within ``max_tries`` attempts, or target sets that cannot
        follow T (`partition_from_label_counts`).
    """
    beta = _validation.check_number("beta", beta, low=0.0, low_open=True)
    if not isinstance(min_size, (int, np.integer)) or min_size < 1:
        raise ValueError(f"min_size must be a positive int, got {min_size!r}")
    if min_size * num_clients > len(train):
        raise ValueError(
            f"min_size={min_size} for {num_clients} clients needs more than the "
            f"{len(train)} training examples"
        )
    per_class = np.bincount(train, minlength=num_classes)
    fair_share = len(train) / num_clients
    for _ in range(max_tries):
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        for k in range(num_classes):
            q = _dirichlet(rng, beta, num_clients, 1)[0]
            q = q * (counts.sum(axis=1) < fair_share)
            if q.sum() <= 0:  # numerically all mass on full clients
                q = (counts.sum(axis=1) < fair_share).astype(np.float64)
            q = q / q.sum()
            cuts = (np.cumsum(q) * per_class[k]).astype(np.int64)[:-1]
            bounds = np.concatenate([[0], cuts, [per_class[k]]])
            counts[:, k] = np.diff(bounds)
        if counts.sum(axis=1).min() >= min_size:
            break
    else:
        raise ValueError(
            f"no NIID-Bench Dirichlet draw gave every client >= {min_size} examples in "
            f"{max_tries} tries; increase beta or lower min_size"
        )
    return counts, f"NIID-Bench dirichlet beta={beta:g}"


def target_group_ids(pattern: str, client_names: Sequence[str]) -> list[int]:
    """The client ids whose names match `pattern`: comma-separated names or shell-style
    patterns ("HAMLET/*": a play's characters; "f0001_*,f0002_*": writers), in id order.

    Raises:
      ValueError: a pattern that matches no client (named, with a few of the names).
    """
    parts = [p.strip() for p in str(pattern).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"target_group must name clients, got {pattern!r}")
    chosen: set[int] = set()
    for part in parts:
        hits = [g for g, name in enumerate(client_names) if fnmatch.fnmatchcase(name, part)]
        if not hits:
            shown = ", ".join(map(repr, list(client_names)[:5]))
            raise ValueError(
                f"target_group {part!r} matches none of the {len(client_names)} clients' names "
                f"(e.g. {shown}); give names or patterns such as 'PLAY/*'"
            )
        chosen.update(hits)
    return sorted(chosen)


def natural_partition(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    client_ids: np.ndarray,
    *,
    target_client: int | Sequence[int],
    seed: int,
    num_classes: int | None = None,
    target_test_size: int | None = None,
    val_size: int | None = None,
    min_target_test_size: int = MIN_TARGET_TEST_SIZE,
    test_client_ids: np.ndarray | None = None,
) -> FederatedPartition:
    """The clients the data come with, one per client id of the training examples
    (`Dataset.client_ids`, 0..G-1: writers, camera traps, speakers).

    The target is client id ``target_client``, or a group of ids (a sequence: a play's
    characters, a region's cameras, `target_group_ids`): its training examples are its
    validation set and give T. Its test set: with ``test_client_ids`` (a format with a
    per-client test split, `Dataset.test_client_ids`), the target's own test examples;
    without, drawn from the test split with label distribution T, as for every scheme. The
    other ids train in id order (training client i is the i-th id not in the target)."""
    seed = _check_seed(seed)
    min_test = _validation.check_positive_int("min_target_test_size", min_target_test_size)
    if not np.size(test_labels):
        raise ValueError(
            "the data have no test split, so the target cannot be tested: give the format's "
            "test split (LEAF: preprocess with -t sample; Parquet: parquet_split_column or "
            "parquet_test_fraction > 0)"
        )
    train, test, num_classes = _check_inputs(train_labels, test_labels, num_classes)
    ids = _check_labels(client_ids, "client_ids")
    num_ids = int(ids.max()) + 1 if ids.shape == train.shape and ids.size else 0
    if num_ids < 2 or np.unique(ids).size != num_ids:
        raise ValueError(
            f"client_ids must give each of the {len(train)} training examples one of G >= 2 ids "
            "0, ..., G-1, each id held by an example"
        )
    group = [target_client] if np.ndim(target_client) == 0 else list(target_client)
    group = sorted({_validation.check_integer("target_client", g, 0, num_ids - 1,
                                              " (a client id)") for g in group})
    if not group or len(group) >= num_ids:
        raise ValueError(
            f"the target group must hold 1 to {num_ids - 1} of the {num_ids} clients (others "
            f"must train), got {len(group)}"
        )
    in_target = np.isin(np.arange(num_ids), group)
    order = [g for g in range(num_ids) if not in_target[g]]
    rng = _rng(seed, _STREAM_EXAMPLES)
    rows = [rng.permutation(np.flatnonzero(ids == g)) for g in order]
    rows.append(rng.permutation(np.flatnonzero(np.isin(ids, group))))
    counts = np.stack([np.bincount(train[row], minlength=num_classes) for row in rows])
    who = (f"client id {group[0]}" if len(group) == 1
           else f"client ids {_shown_ids(group)} ({len(group)} clients)")
    description = _describe(f"natural, {who} the target", num_ids - len(group) + 1, seed)
    if test_client_ids is None:
        return _with_target_sets(
            train, test, rows, counts, rng, description, target_test_size, val_size, min_test
        )
    test_ids = _check_labels(test_client_ids, "test_client_ids")
    if test_ids.shape != test.shape:
        raise ValueError(f"test_client_ids must be {len(test)} ids, one per test example")
    own_test = np.flatnonzero(np.isin(test_ids, group))
    if len(own_test) < min_test:
        raise ValueError(
            f"the target ({who}) has {len(own_test)} test examples of its own, fewer than "
            f"min_target_test_size={min_test}: accuracy on so few is noise. Choose a larger "
            "client, or a group of clients as the target (partition.target_group)"
        )
    if target_test_size is not None or val_size is not None:
        raise ValueError(
            "target_test_size and val_size do not apply to a target with test examples of its "
            "own (it is tested on all of them and validated on its training share)"
        )
    return _with_own_test_set(rows, counts, own_test, rng, num_classes, description)


def _with_own_test_set(
    rows: Sequence[np.ndarray], counts: np.ndarray, own_test: np.ndarray,
    rng: np.random.Generator, num_classes: int, description: str,
) -> FederatedPartition:
    """The partition of the training clients `rows[:-1]` whose target is `rows[-1]`, validated
    on all of it and tested on `own_test`: T is the target's training share's label
    distribution; its test set is its own test examples as they are (a client's own, not a
    redraw to T). `counts`: (len(rows), K) label counts of the rows."""
    return FederatedPartition(
        client_indices=_pad(rows[:-1]),
        client_sizes=counts[:-1].sum(axis=1),
        client_label_counts=counts[:-1],
        target_label_dist=counts[-1] / counts[-1].sum(),
        target_val_indices=rows[-1],
        target_test_indices=rng.permutation(own_test),
        num_classes=num_classes,
        description=f"{description}; tested on its own {len(own_test)} test examples",
    )


def _shown_ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids[:4])) + (", ..." if len(ids) > 4 else "")


def resample_to_label_dist(
    partition: FederatedPartition, train_labels: np.ndarray, label_dist: np.ndarray, *, seed: int
) -> FederatedPartition:
    """Redraws every training client's data with label distribution ``label_dist``.

    Used for the Oracle baseline (FedPALS App. B.5): FedAvg on clients whose
    data follow the target distribution. Client i keeps its size n_i and gets
    largest_remainder(label_dist, n_i) examples per class, drawn from the train
    split minus the target validation set (which is never trained on).

    Per class, clients get disjoint examples when the pool covers their total demand. Otherwise
    each client draws independently from the whole pool (without replacement within the client,
    so examples repeat across clients), and a client that alone needs more than the pool draws
    that class with replacement. The target fields are kept unchanged.

    Raises:
      ValueError: ``label_dist`` is not a K-vector distribution, or puts mass
        on a class with no training examples outside the validation set.
    """
    seed = _check_seed(seed)
    train = _check_labels(train_labels, "train_labels")
    k_classes = partition.num_classes
    if train.size and train.max() >= k_classes:
        raise ValueError(f"train_labels hold label {train.max()} >= num_classes={k_classes}")
    dist = np.asarray(label_dist, dtype=np.float64)
    if dist.shape != (k_classes,) or np.any(dist < 0) or not np.isclose(dist.sum(), 1.0):
        raise ValueError(
            f"label_dist must be a non-negative ({k_classes},) vector summing to 1, got {dist}"
        )
    if partition.client_indices.size and partition.client_indices.max() >= len(train):
        raise ValueError("train_labels is shorter than the partition's indices: wrong split?")

    rng = _rng(seed, _STREAM_RESAMPLE)
    usable = np.ones(len(train), dtype=bool)
    usable[partition.target_val_indices] = False
    pools = [rng.permutation(np.flatnonzero(usable & (train == k))) for k in range(k_classes)]
    available = np.array([len(p) for p in pools])
    empty = np.flatnonzero((dist > 0) & (available == 0)).tolist()
    if empty:
        raise ValueError(
            f"label_dist puts mass on class(es) {empty}, which have no training examples "
            "outside the target validation set"
        )

    counts = np.stack([largest_remainder_counts(dist, int(n)) for n in partition.client_sizes])
    rows: list[list[np.ndarray]] = [[] for _ in range(partition.num_clients)]
    for k in range(k_classes):
        demand = counts[:, k]
        if demand.sum() <= available[k]:
            offsets = np.concatenate([[0], np.cumsum(demand)])
            for i in range(partition.num_clients):
                rows[i].append(pools[k][offsets[i] : offsets[i + 1]])
        else:
            for i in range(partition.num_clients):
                rows[i].append(
                    rng.choice(pools[k], size=demand[i], replace=bool(demand[i] > available[k]))
                )
    indices = [rng.permutation(np.concatenate(r)) for r in rows]

    shown = ", ".join(f"{v:.3g}" for v in dist)
    return dataclasses.replace(  # the sizes and the target's sets kept, nothing held out
        partition,
        client_indices=_pad(indices),
        client_label_counts=counts,
        description=f"{partition.description}; clients resampled to label_dist [{shown}] "
        f"(oracle), seed {seed}",
        held_out_indices=np.zeros(0, np.int32),
    )


def hold_out_stratified(
    partition: FederatedPartition, train_labels: np.ndarray, fraction: float, *, seed: int
) -> FederatedPartition:
    """The partition with a stratified share of every client's examples kept out of training.

    Client i keeps round(fraction * c_ik) of its c_ik examples of class k out (at most
    c_ik - 1, so that every class it holds stays in its training data and S_i keeps its
    support), drawn at random (stream `_STREAM_HOLD_OUT` of `seed`); its training examples,
    size and label counts are the rest. The held-out examples of all clients are
    `held_out_indices` (client by client, class by class). In a federation each client keeps
    its share; what leaves it are sums over it (the calibration's likelihood, per-class sums
    of posteriors). The target's sets are unchanged. fraction = 0 returns `partition` itself.

    Raises:
      ValueError: fraction outside [0, 1), or labels that do not fit the partition.
    """
    fraction = _validation.check_number("fraction", fraction, low=0.0, high=1.0, high_open=True)
    seed = _check_seed(seed)
    if fraction == 0:
        return partition
    train = _check_labels(train_labels, "train_labels")
    if partition.client_indices.size and partition.client_indices.max() >= len(train):
        raise ValueError("train_labels is shorter than the partition's indices: wrong split?")
    rng = _rng(seed, _STREAM_HOLD_OUT)
    kept, held = [], []
    for i in range(partition.num_clients):
        examples = partition.client_example_indices(i)
        labels = train[examples]
        keep = np.ones(len(examples), bool)
        for k in np.unique(labels):
            where = np.flatnonzero(labels == k)
            share = min(int(np.floor(fraction * len(where) + 0.5)), len(where) - 1)
            chosen = rng.choice(where, size=share, replace=False)
            keep[chosen] = False
            held.append(examples[np.sort(chosen)])
        kept.append(examples[keep])
    counts = np.stack([np.bincount(train[row], minlength=partition.num_classes) for row in kept])
    return dataclasses.replace(
        partition,
        client_indices=_pad(kept),
        client_sizes=np.array([len(row) for row in kept]),
        client_label_counts=counts,
        description=f"{partition.description}; {fraction:g} of each client's classes held out",
        held_out_indices=np.concatenate(held) if held else np.zeros(0, np.int32),
    )


# ---- The registry of partition schemes (config.partition.scheme) ---------


@dataclasses.dataclass(frozen=True)
class PartitionContext:
    """What a scheme's build reads: the loaded data set (its labels, num_classes, client_ids),
    partition.num_clients (target included) and the run's seed."""

    dataset: Dataset
    num_clients: int
    seed: int


@dataclasses.dataclass(frozen=True)
class Partition:
    """A partition scheme, config.partition.scheme = name (`register_partition`).

    build(values, context) -> FederatedPartition, e.g. from a (num_clients, K) matrix of label
    counts (`partition_from_label_counts`); values: its `hyperparameters`, a `Hyperparameters`
    dataclass whose fields are the config keys partition.<field> (a field two schemes share is
    declared alike; another scheme's resolves to None). fit(values, dataset), optional, checks
    them against the `RegisteredDataset` before anything is loaded (ValueError, its message
    starting with the key) and may return the clients (target included) it fixes in place of
    partition.num_clients. row: how sweep rows show it, `str.format`ted with the values.
    """

    name: str
    build: Callable[[Any, PartitionContext], FederatedPartition]
    hyperparameters: type[declared.Hyperparameters] = declared.NoHyperparameters
    fit: Callable[[Any, RegisteredDataset], int | None] | None = None
    row: str | None = None

    def __post_init__(self) -> None:
        _validation.check_registered_name(
            "partition scheme", self.name, deprecated_until="0.3.0"
        )
        owner = f"partition scheme {self.name!r}"
        _validation.check_hook(owner, "build", self.build, "(values, context) -> FederatedPartition")
        _validation.check_hook(owner, "fit", self.fit, "(values, dataset) -> int | None",
                               optional=True)
        declared.check_declared(owner, self.hyperparameters)

    def values(self, section: Mapping[str, Any]) -> Any:
        """Its hyperparameters from a (resolved) partition section."""
        fields = declared.hyperparameter_defaults(self.hyperparameters)
        return self.hyperparameters(**{key: section[key] for key in fields})

    def label(self, section: Mapping[str, Any]) -> str:
        values = dataclasses.asdict(self.values(section))
        default = " ".join([self.name, *(f"{key}={{{key}}}" for key in values)])
        return (self.row or default).format(**values)

    def make(self, section: Mapping[str, Any], dataset: Dataset, seed: int) -> FederatedPartition:
        clients = section["num_clients"]
        made = self.build(self.values(section), PartitionContext(dataset, clients, seed))
        if not isinstance(made, FederatedPartition) or made.num_clients != clients - 1:
            what = f"{made.num_clients} training clients" if isinstance(
                made, FederatedPartition) else type(made).__name__
            raise ValueError(
                f"partition scheme {self.name!r}: its build returned {what}, not a "
                f"FederatedPartition of num_clients - 1 = {clients - 1} training clients."
            )
        problem = partition_problem(made, dataset.train.y, dataset.test.y)
        if problem is not None:
            raise ValueError(f"partition scheme {self.name!r}: its build returned {problem}.")
        return made


def partition_problem(
    partition: FederatedPartition, train_labels: np.ndarray, test_labels: np.ndarray
) -> str | None:
    """What makes `partition` not a partition of these splits, or None: an index out of range
    (JAX's gathers would clamp it, NumPy's wrap a negative one: silently another example), an
    example two clients hold or a client holds beside the target's validation set or the
    held-out share, or label counts that are not the labels held (FedPALS' weights come from
    the counts)."""
    train, test = np.asarray(train_labels), np.asarray(test_labels)
    rows = [partition.client_example_indices(i) for i in range(partition.num_clients)]
    parts = (("the clients' indices", np.concatenate(rows), "train", len(train)),
             ("target_val_indices", partition.target_val_indices, "train", len(train)),
             ("held_out_indices", partition.held_out_indices, "train", len(train)),
             ("target_test_indices", partition.target_test_indices, "test", len(test)))
    for name, indices, split, size in parts:
        bad = indices[(indices < 0) | (indices >= size)]
        if bad.size:
            return f"{name} holding {int(bad[0])}, outside the {split} split's [0, {size})"
    owner = np.full(len(train), -1, np.int64)  # which part holds each train example
    owners = [f"client {i}" for i in range(len(rows))] + ["the target's validation set",
                                                          "the held-out share"]
    parts_in_order = [*rows, partition.target_val_indices, partition.held_out_indices]
    for part, indices in enumerate(parts_in_order):
        unique, counts = np.unique(indices, return_counts=True)
        if np.any(counts > 1):
            return f"{owners[part]} holding train example {int(unique[counts > 1][0])} twice"
        taken = owner[unique] >= 0
        if np.any(taken):
            example = int(unique[taken][0])
            return (f"train example {example} held by both {owners[owner[example]]} and "
                    f"{owners[part]}")
        owner[unique] = part
    k = partition.num_classes
    for i, row in enumerate(rows):
        held = np.bincount(train[row], minlength=k)[:k]
        if not np.array_equal(held, partition.client_label_counts[i]):
            return (f"client {i}'s label counts {partition.client_label_counts[i].tolist()}, but "
                    f"the labels it holds count {held.tolist()}")
    return None


_PARTITIONS: dict[str, Partition] = {}
DEFAULT_SCHEME = "sparsity"


def register_partition(partition: Partition, *, replace: bool = False) -> Partition:
    """Registers a partition scheme under `partition.name` (config.partition.scheme)."""
    if not isinstance(partition, Partition):
        raise TypeError(
            f"register_partition takes a fedjax_pals.Partition, got {type(partition).__name__}."
        )
    if partition.name in _PARTITIONS and not replace:
        raise ValueError(f"a partition scheme {partition.name!r} is already registered.")
    owners = {name: p.hyperparameters for name, p in _PARTITIONS.items()}
    declared.check_shared_fields(
        "partition scheme", partition.name, partition.hyperparameters, owners, "partition",
        ("scheme", "num_clients"),
    )
    _PARTITIONS[partition.name] = partition
    extensions.note_registration(
        "partition", partition.name, (f"partition.{key}" for key in declared.declared_fields(
            {partition.name: partition.hyperparameters}))
    )
    return partition


def registered_partitions() -> dict[str, Partition]:
    """The registered partition schemes, in registration order."""
    return dict(_PARTITIONS)


def partition_fields() -> dict[str, tuple[Any, Callable[[str, Any], Any], tuple[str, ...]]]:
    """{config key under partition.: (default, check, the schemes that use it)}."""
    return declared.declared_fields({n: p.hyperparameters for n, p in _PARTITIONS.items()})


@dataclasses.dataclass(frozen=True)
class LabelsPerClient(declared.Hyperparameters):
    labels_per_client: int = declared.hyperparameter(3, kind="integer", low=1, doc="C, <= K")


@dataclasses.dataclass(frozen=True)
class DirichletBeta(declared.Hyperparameters):
    dirichlet_beta: float = declared.hyperparameter(0.1, low=0.0, low_open=True)


@dataclasses.dataclass(frozen=True)
class TargetClient(declared.Hyperparameters):
    target_client: int = declared.hyperparameter(0, kind="integer", low=0, doc="a client id")
    target_group: str | None = declared.hyperparameter(
        None, kind="text", optional=True,
        doc="client names or patterns, comma-separated ('HAMLET/*'): the target, in place of "
        "target_client")


def _labels_fit(values: LabelsPerClient, dataset: RegisteredDataset) -> None:
    if dataset.num_classes is None:  # a reader's K, known once its files are read
        return
    k, why = dataset.num_classes, f" ({dataset.name} has K={dataset.num_classes} classes)"
    _validation.check_integer("labels_per_client", values.labels_per_client, 1, k, why)


def _natural_fit(values: TargetClient, dataset: RegisteredDataset) -> int | None:
    ids = dataset.num_client_ids or 0
    if ids == 0 and dataset.describe is not None:
        return None  # a reader whose files were not read (a recorded config): as recorded
    if ids < 2:
        raise ValueError(
            f"scheme='natural' makes one client per client id, but data set {dataset.name!r} is "
            "registered without 2 or more (register_dataset(..., num_client_ids=G); a reader "
            "of federated files: its files name fewer than 2 clients)."
        )
    if values.target_group is None:
        _validation.check_integer("target_client", values.target_client, 0, ids - 1,
                                  " (a client id)")
        return ids
    if dataset.client_names is None:
        raise ValueError(
            f"target_group={values.target_group!r} needs the clients' names, which data set "
            f"{dataset.name!r} does not give; name the target by target_client (an id)."
        )
    group = target_group_ids(values.target_group, dataset.client_names)
    if len(group) >= ids:
        raise ValueError(f"target_group={values.target_group!r} matches every client; others "
                         "must train.")
    return ids - len(group) + 1


def _natural_build(values: TargetClient, c: PartitionContext) -> FederatedPartition:
    d = c.dataset
    target: int | list[int] = values.target_client
    if values.target_group is not None:
        if d.client_names is None:
            raise ValueError(f"target_group needs the clients' names; data set {d.name!r} "
                             "gives none")
        target = target_group_ids(values.target_group, d.client_names)
    return natural_partition(
        d.train.y, d.test.y, d.client_ids, target_client=target, seed=c.seed,
        num_classes=d.num_classes, test_client_ids=d.test_client_ids)


def _calls(function: Callable[..., FederatedPartition], **fields: str) -> Callable:
    """The build of a partition function: the data set's labels, the context and the values
    (parameter=field)."""

    def build(values: Any, c: PartitionContext) -> FederatedPartition:
        d = c.dataset
        return function(
            d.train.y, d.test.y, num_clients=c.num_clients, seed=c.seed,
            num_classes=d.num_classes, **{p: getattr(values, f) for p, f in fields.items()},
        )

    return build


_C = dict(labels_per_client="labels_per_client")
for _args in (
    ("sparsity", _calls(sparsity_partition, **_C), LabelsPerClient, _labels_fit,
     "C={labels_per_client}"),
    ("dirichlet", _calls(dirichlet_partition, beta="dirichlet_beta"), DirichletBeta, None,
     "beta={dirichlet_beta:g}"),
    ("niid_bench_sparsity", _calls(niid_bench_sparsity_partition, **_C), LabelsPerClient,
     _labels_fit, "C={labels_per_client} (niid_bench_sparsity)"),
    ("natural", _natural_build, TargetClient, _natural_fit),
):
    register_partition(Partition(*_args))
