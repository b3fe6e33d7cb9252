"""The Pachinko allocation partition: clients drawn through a class hierarchy (coarse -> fine).

TensorFlow Federated's federated CIFAR-100 (Reddi et al., 2020, "Adaptive Federated
Optimization", App. C) splits CIFAR-100 by its 20 super-classes with the Pachinko Allocation
Method (Li & McCallum, 2006), a two-level Dirichlet process: every client has

  * a distribution p over the coarse classes, p ~ Dir(coarse_alpha) (TFF: 0.1), and
  * for every coarse class g, a distribution q_g over the fine classes of g, q_g ~ Dir(fine_beta)
    (TFF: 10),

and each of its examples is drawn by first sampling a coarse class g ~ p, then a fine class
f ~ q_g, then an example of class f without replacement. When the pool of a fine class runs
out, the class is removed from its coarse class's q_g and q_g is renormalised (its share goes to
the siblings of the same coarse class); when every fine class of a coarse class has run out, the
coarse class is removed from p and p is renormalised.

Here the clients are the scheme's ``num_clients`` (the LAST is the target, as in every scheme of
`fedjax_pals.data.partitions`), each of ``examples_per_client`` examples (TFF: 500 clients of
100), served in a random order (so that the target is not always the one left the exhausted
pools). Only the counts are drawn here; `partition_from_label_counts` draws the examples
(uniformly within each class, without replacement) and the target's sets.

Registered as the partition scheme "pachinko" (config keys partition.pachinko_coarse_alpha,
partition.pachinko_fine_beta, partition.pachinko_examples_per_client). It needs a data set with
coarse labels (`Dataset.coarse_labels`: CIFAR-100's, `load_cifar100`).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np

from fedjax_pals import _validation
from fedjax_pals import hyperparameters as declared
from fedjax_pals.data import partitions
from fedjax_pals.data.partitions import (
    MIN_TARGET_TEST_SIZE,
    FederatedPartition,
    Partition,
    PartitionContext,
    register_partition,
)

# TFF's federated CIFAR-100 (Reddi et al., 2020, App. C).
DEFAULT_COARSE_ALPHA = 0.1
DEFAULT_FINE_BETA = 10.0

# The registered data sets known to come without coarse labels (refused when the config is
# checked); any other is checked when its data are loaded (`Dataset.coarse_labels`).
_WITHOUT_COARSE_LABELS = frozenset({"fashion_mnist", "cifar10", "emnist", "synthetic"})


def _coarse_groups(coarse_labels: Any, num_classes: int) -> list[np.ndarray]:
    """The fine classes of each coarse class (coarse ids in sorted order, empty ones skipped)."""
    coarse = np.asarray(coarse_labels)
    if coarse.shape != (num_classes,) or (
        coarse.size and not np.issubdtype(coarse.dtype, np.integer)
    ) or (coarse.size and coarse.min() < 0):
        raise ValueError(
            f"coarse_labels must give the coarse class (a non-negative integer) of each of the "
            f"K = {num_classes} classes, got {coarse!r} (shape {coarse.shape})"
        )
    _, inverse = np.unique(coarse, return_inverse=True)
    return [np.flatnonzero(inverse == g) for g in range(int(inverse.max()) + 1)]


def _pick(cumulative: list[float], u: float) -> int:
    """The index i with cumulative[i-1] <= u * total < cumulative[i] (a draw from the weights
    whose running sums are `cumulative`, with a uniform u in [0, 1)); never a zero weight."""
    i = bisect.bisect_right(cumulative, u * cumulative[-1])
    if i < len(cumulative):
        return i
    # u * total rounded up to total: the last class with positive weight.
    return bisect.bisect_left(cumulative, cumulative[-1])


def _live_weights(weights: np.ndarray, left: np.ndarray) -> list[float]:
    """Running sums of `weights` on the classes with examples left, renormalisation implied;
    where those weights have no mass (a Dirichlet draw that put it all on exhausted classes), of
    the examples left."""
    live = np.where(left > 0, weights, 0.0)
    if live.sum() <= 0:
        live = left.astype(np.float64)
    return np.cumsum(live).tolist()


def _draw_client(
    p: np.ndarray, q: list[np.ndarray], groups: list[np.ndarray], remaining: np.ndarray,
    uniforms: np.ndarray,
) -> np.ndarray:
    """(K,) counts of one client's examples, drawn one by one (coarse class ~ p, then fine
    class ~ q[g], with the uniforms (n, 2)); `remaining` (K,) is decremented in place. The
    running sums are recomputed only when a class runs out."""
    counts = np.zeros_like(remaining)
    coarse_left = np.array([remaining[g].sum() for g in groups])
    coarse_cum = _live_weights(p, coarse_left)
    fine_cum = [_live_weights(q[g], remaining[fine]) if coarse_left[g] else None
                for g, fine in enumerate(groups)]
    for u_coarse, u_fine in uniforms.tolist():
        g = _pick(coarse_cum, u_coarse)
        k = int(groups[g][_pick(fine_cum[g], u_fine)])
        counts[k] += 1
        remaining[k] -= 1
        coarse_left[g] -= 1
        if coarse_left[g] == 0:  # the coarse class is exhausted: renormalise p
            coarse_cum = _live_weights(p, coarse_left)
        elif remaining[k] == 0:  # the fine class is exhausted: renormalise q_g
            fine_cum[g] = _live_weights(q[g], remaining[groups[g]])
    return counts


def pachinko_counts(
    rng: np.random.Generator,
    train: np.ndarray,
    num_clients: int,
    groups: list[np.ndarray],
    *,
    examples_per_client: int,
    coarse_alpha: float,
    fine_beta: float,
) -> np.ndarray:
    """(num_clients, K) counts of the Pachinko allocation (see the module docstring).

    Random draws, in order: p (num_clients, G) ~ Dir(coarse_alpha); for each coarse class g in
    turn, q_g (num_clients, |g|) ~ Dir(fine_beta); the order the clients are served in (a
    permutation); then, per client served, (n, 2) uniforms (the coarse and the fine draw of
    each example).
    """
    num_classes = sum(len(g) for g in groups)
    p = partitions._dirichlet(rng, coarse_alpha, len(groups), num_clients)
    q_by_group = [partitions._dirichlet(rng, fine_beta, len(g), num_clients) for g in groups]
    remaining = np.bincount(train, minlength=num_classes).astype(np.int64)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for i in rng.permutation(num_clients):
        uniforms = rng.random((examples_per_client, 2))
        counts[i] = _draw_client(p[i], [q[i] for q in q_by_group], groups, remaining, uniforms)
    return counts


@partitions._scheme
def _pachinko(
    rng, train, num_clients, num_classes, *, coarse_labels, examples_per_client, coarse_alpha,
    fine_beta,
):
    coarse_alpha = _validation.check_number("coarse_alpha", coarse_alpha, low=0.0, low_open=True)
    fine_beta = _validation.check_number("fine_beta", fine_beta, low=0.0, low_open=True)
    groups = _coarse_groups(coarse_labels, num_classes)
    if isinstance(examples_per_client, (bool, np.bool_)):  # True is no count of examples
        raise ValueError(
            f"examples_per_client must be a positive int, got {examples_per_client!r} "
            f"({len(train)} training examples for {num_clients} clients)"
        )
    n = partitions.examples_per_client_of(examples_per_client, len(train), num_clients)
    counts = pachinko_counts(rng, train, num_clients, groups, examples_per_client=n,
                             coarse_alpha=coarse_alpha, fine_beta=fine_beta)
    what = (f"pachinko coarse_alpha={coarse_alpha:g} fine_beta={fine_beta:g} "
            f"({len(groups)} coarse classes, {n}/client)")
    return counts, what


def pachinko_partition(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    coarse_labels: np.ndarray,
    *,
    num_clients: int,
    seed: int,
    examples_per_client: int | None = None,
    coarse_alpha: float = DEFAULT_COARSE_ALPHA,
    fine_beta: float = DEFAULT_FINE_BETA,
    num_classes: int | None = None,
    target_test_size: int | None = None,
    val_size: int | None = None,
    min_target_test_size: int = MIN_TARGET_TEST_SIZE,
) -> FederatedPartition:
    """TFF's Pachinko allocation of CIFAR-100 (Reddi et al., 2020, App. C) as a label-shift
    partition: see the module docstring.

    coarse_labels: (K,) the coarse class of each class (K = num_classes, by default
    len(coarse_labels)). Each of the ``num_clients`` clients (the last one the target) gets
    ``examples_per_client`` examples (default ``len(train_labels) // num_clients``). Its
    coarse distribution is Dir(``coarse_alpha``), each coarse class's fine distribution
    Dir(``fine_beta``); examples are drawn coarse class first, then fine class, without
    replacement, renormalising over what is left when a fine or a coarse class runs out.
    Deterministic given ``seed``; the target's sets as in `partition_from_label_counts`.

    Raises:
      ValueError: coarse_labels not K non-negative integers, coarse_alpha or fine_beta <= 0,
        examples_per_client < 1, num_clients * examples_per_client > len(train_labels),
        num_clients < 2, or target sets that cannot follow T (`partition_from_label_counts`).
    """
    if num_classes is None:
        num_classes = int(np.shape(coarse_labels)[0]) if np.ndim(coarse_labels) == 1 else None
    return _pachinko(
        train_labels, test_labels, num_clients=num_clients, seed=seed, num_classes=num_classes,
        target_test_size=target_test_size, val_size=val_size,
        min_target_test_size=min_target_test_size, coarse_labels=coarse_labels,
        examples_per_client=examples_per_client, coarse_alpha=coarse_alpha, fine_beta=fine_beta,
    )


# ---- The scheme "pachinko" (config.partition.scheme) ---------------------


@dataclasses.dataclass(frozen=True)
class PachinkoHyperparameters(declared.Hyperparameters):
    pachinko_coarse_alpha: float = declared.hyperparameter(
        DEFAULT_COARSE_ALPHA, low=0.0, low_open=True,
        doc="Dirichlet concentration of each client's coarse-class distribution (TFF: 0.1)",
    )
    pachinko_fine_beta: float = declared.hyperparameter(
        DEFAULT_FINE_BETA, low=0.0, low_open=True,
        doc="Dirichlet concentration of each coarse class's fine-class distribution (TFF: 10)",
    )
    pachinko_examples_per_client: int | None = declared.hyperparameter(
        None, kind="integer", low=1, optional=True,
        doc="examples of every client, the target's too (None: the training examples / "
        "num_clients; TFF: 100)",
    )


def _pachinko_fit(values: PachinkoHyperparameters, dataset: Any) -> None:
    """What the registration tells: a built-in data set without coarse labels is refused, and
    the clients' examples must fit in the training split (at least two clients)."""
    if dataset.name in _WITHOUT_COARSE_LABELS:
        raise ValueError(
            f"scheme='pachinko' draws each client's classes through their coarse classes, but "
            f"data set {dataset.name!r} has no coarse labels; use a data set with them "
            "(cifar100) or another scheme (dirichlet)."
        )
    n = values.pachinko_examples_per_client
    if n is not None and dataset.num_train is not None and 2 * n > dataset.num_train:
        raise ValueError(
            f"pachinko_examples_per_client={n} is more than half the {dataset.num_train} "
            f"training examples of {dataset.name!r}, so not even 2 clients (the target "
            "included) fit."
        )


def _pachinko_build(values: PachinkoHyperparameters, c: PartitionContext) -> FederatedPartition:
    d = c.dataset
    if d.coarse_labels is None:
        raise ValueError(
            f"scheme 'pachinko' needs the coarse class of every class, but data set {d.name!r} "
            "has no coarse labels (Dataset.coarse_labels is None); use a data set with them "
            "(cifar100) or another scheme (dirichlet)."
        )
    return pachinko_partition(
        d.train.y, d.test.y, d.coarse_labels, num_clients=c.num_clients, seed=c.seed,
        num_classes=d.num_classes, examples_per_client=values.pachinko_examples_per_client,
        coarse_alpha=values.pachinko_coarse_alpha, fine_beta=values.pachinko_fine_beta,
    )


PACHINKO = register_partition(Partition(
    "pachinko", _pachinko_build, PachinkoHyperparameters, _pachinko_fit,
    "pachinko alpha={pachinko_coarse_alpha:g} beta={pachinko_fine_beta:g}",
))
