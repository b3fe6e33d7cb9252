"""FedDisco (Ye et al., "FedDisco: Federated Learning with Discrepancy-Aware Collaboration",
ICML 2023; reference code MediaBrain-SJTU/FedDisco, `disco.py`), a label-shift method beyond
the FedPALS paper's baselines.

FedDisco is a *weighting*: the server weighs client k by its relative dataset size and by the
discrepancy d_k between its label distribution and a global one. It uses the same server-side
information as FedPALS (the clients' S_k(Y) and the target's T(Y)), so it is FedPALS' natural
head-to-head. It composes with any client method: `fjp.combine(fedlc_client(tau),
feddisco_weighting(T))` is FedLC's local training with FedDisco's weights (`fedlc`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientMethod, FederatedAlgorithm, ServerState, Weighting, _need, combine, find_state,
    plain_sgd,
)
from fedjax_pals.algorithms.registry import (
    Hyperparameters, Method, MethodContext, hyperparameter, register_method,
)

DISCREPANCY_METRICS = ("kl", "l2")
# FedDisco's defaults in the reference code (args.py: --disco_a 0.5, --disco_b 0.1,
# --measure_difference kl).
FEDDISCO_DEFAULT_A = 0.5
FEDDISCO_DEFAULT_B = 0.1
FEDDISCO_DEFAULT_METRIC = "kl"


class FedDiscoState(NamedTuple):
    """FedDisco's per-run data (`ServerState.weighting_state`): global_label_dist, the (K,)
    G(Y) the discrepancies are measured against; a and b, float32 scalars."""

    global_label_dist: jax.Array
    a: jax.Array
    b: jax.Array
    _built_by = "feddisco(...) or combine(client_method, feddisco_weighting(...))"


def _metric(metric: Any) -> str:
    if metric not in DISCREPANCY_METRICS:
        raise ValueError(
            f"unknown FedDisco discrepancy metric {metric!r}; choose one of {DISCREPANCY_METRICS}."
        )
    return metric


def feddisco_discrepancy(
    label_dists: chex.ArrayLike, global_label_dist: chex.ArrayLike, metric: str = "kl"
) -> jax.Array:
    """FedDisco's discrepancy d_k between each client's S_k(Y) and the global G(Y).

    metric "l2":  d_k = ||S_k - G||_2                      (reference `disco.py`, metric 'l2')
    metric "kl":  d_k = KL(S_k || G) / sum_j KL(S_j || G)   (reference `disco.py`, metric 'kl')

    with KL(S || G) = sum_y S_y log(S_y / G_y) (0 log 0 = 0) and the sum over the clients
    given (a round's participants, as the reference does); d = 0 when every KL is 0.

    The reference's global distribution is the test set's (uniform, or the imbalanced test
    distribution); in the FedPALS setting that is the target's T(Y), which puts no mass on
    some classes. A client with mass m_k = sum_{y: G_y = 0} S_ky > 0 off G's support has
    KL = +inf, and the reference's normalised d becomes inf / inf = NaN. Here d is the
    limit of the normalised KL against G_eps = (1 - eps) G + eps / K as eps -> 0+: each
    such KL grows like m_k log(1 / eps), so

        d_k = m_k / sum_j m_j     when some client has mass off G's support,

    and the clients without such mass get d_k = 0 (relative to the others, their KL is
    negligible). Without off-support mass this is the reference's formula exactly.

    Args:
      label_dists: (m, K) client label distributions S_k(Y).
      global_label_dist: (K,) the global distribution G(Y).
      metric: "kl" (the reference's default) or "l2".

    Returns:
      (m,) discrepancies d_k >= 0 (for "kl", summing to 1 or all 0).
    """
    metric = _metric(metric)
    dists = jnp.asarray(label_dists, jnp.float32)
    return _discrepancy(dists, jnp.asarray(global_label_dist, jnp.float32), metric)


def _discrepancy(dists: jax.Array, target: jax.Array, metric: str) -> jax.Array:
    target = target.astype(dists.dtype)
    if metric == "l2":
        return jnp.sqrt(jnp.sum(jnp.square(dists - target[None, :]), axis=1))
    present = dists > 0
    inside = present & (target[None, :] > 0)
    off_support = jnp.sum(jnp.where(present & ~inside, dists, 0.0), axis=1)
    safe_ratio = jnp.where(inside, dists / jnp.where(inside, target[None, :], 1.0), 1.0)
    kl = jnp.maximum(jnp.sum(jnp.where(inside, dists * jnp.log(safe_ratio), 0.0), axis=1), 0.0)
    total_off, total_kl = jnp.sum(off_support), jnp.sum(kl)
    from_off = off_support / jnp.where(total_off > 0, total_off, 1.0)
    from_kl = jnp.where(total_kl > 0, kl / jnp.where(total_kl > 0, total_kl, 1.0), 0.0)
    return jnp.where(total_off > 0, from_off, from_kl)


def feddisco_weights(
    label_dists: chex.ArrayLike, client_sizes: chex.ArrayLike, global_label_dist: chex.ArrayLike,
    a: float = FEDDISCO_DEFAULT_A, b: float = FEDDISCO_DEFAULT_B,
    metric: str = FEDDISCO_DEFAULT_METRIC,
) -> jax.Array:
    """FedDisco's aggregation weights (Ye et al., 2023, Sec. 4; reference `disco.py`).

        p_k = ReLU(n_k / N - a d_k + b) / sum_j ReLU(n_j / N - a d_j + b),

    N = sum_j n_j over the clients given (a round's participants), d_k from
    `feddisco_discrepancy`. a >= 0 trades size for agreement with the global distribution,
    b lifts every client (b -> infinity: uniform weights). When every ReLU is 0 (the
    reference divides by zero there) the weights fall back to FedAvg's n_k / N.

    Limits: a = b = 0 is FedAvg; identical discrepancies for all clients (e.g. S_k = G)
    give p_k = (n_k / N + c) / (1 + m c), c = b - a d, which is FedAvg when c = 0 and
    uniform when the sizes are equal.

    Returns:
      (m,) weights on the simplex.
    """
    dists, sizes, target = (
        jnp.asarray(x, jnp.float32) for x in (label_dists, client_sizes, global_label_dist)
    )
    a = jnp.float32(_validation.check_nonnegative("a", a))
    return _disco_weights(
        dists, sizes, target, a, jnp.float32(_validation.check_real("b", b)), _metric(metric)
    )


def _disco_weights(dists, sizes, target, a, b, metric: str) -> jax.Array:
    relative = sizes / jnp.sum(sizes)
    raw = relative - a * _discrepancy(dists, target, metric) + b
    clipped = jnp.maximum(raw, 0.0)
    total = jnp.sum(clipped)
    return jnp.where(total > 0, clipped / jnp.where(total > 0, total, 1.0), relative)


@functools.cache
def _feddisco_weights_fn(metric: str):
    def weights(label_dists, sizes, state: ServerState, participants):
        data = find_state(state.weighting_state, FedDiscoState)
        return _disco_weights(label_dists, sizes, data.global_label_dist, data.a, data.b, metric)

    return weights


def feddisco_weighting(
    global_label_dist: chex.ArrayLike, a: float = FEDDISCO_DEFAULT_A,
    b: float = FEDDISCO_DEFAULT_B, metric: str = FEDDISCO_DEFAULT_METRIC,
) -> Weighting:
    """FedDisco's discrepancy-aware weights over each round's participants (`feddisco_weights`).

    Args:
      global_label_dist: G(Y), the distribution the discrepancies are measured against. In
        the FedPALS setting pass the target's T(Y) (what FedPALS' eq. 8 uses); the FedDisco
        paper's balanced test set is G = uniform.
      a: the discrepancy coefficient, >= 0 (reference default 0.5).
      b: the offset (reference default 0.1).
      metric: "kl" (reference default) or "l2".

    G, a and b are per-run data in `ServerState.weighting_state` (a `FedDiscoState`), so runs
    that differ only in them share one compiled round; the metric, which changes the traced
    program, selects the (cached) weights function.
    """
    dist = _validation.check_distribution("global_label_dist", global_label_dist)
    data = FedDiscoState(
        jnp.asarray(dist, jnp.float32),
        jnp.asarray(_validation.check_nonnegative("a", a), jnp.float32),
        jnp.asarray(_validation.check_real("b", b), jnp.float32),
    )
    return Weighting("feddisco", lambda: data, _feddisco_weights_fn(_metric(metric)))


def feddisco(
    global_label_dist: chex.ArrayLike, a: float = FEDDISCO_DEFAULT_A,
    b: float = FEDDISCO_DEFAULT_B, metric: str = FEDDISCO_DEFAULT_METRIC,
    client_method: ClientMethod | None = None,
) -> FederatedAlgorithm:
    """FedDisco (Ye et al., ICML 2023): plain local SGD (or `client_method`, e.g.
    `fedlc_client(tau)`) with FedDisco's weights (`feddisco_weighting`)."""
    weighting = feddisco_weighting(global_label_dist, a, b, metric)
    client = client_method if client_method is not None else plain_sgd()
    name = "feddisco" if client_method is None else f"{client.name}+feddisco"
    return combine(client, weighting, name)


@dataclasses.dataclass(frozen=True)
class FedDiscoHyperparameters(Hyperparameters):
    # a and b are data in the weighting's state (`FedDiscoState`): runs differing only in them
    # share one compiled program.
    feddisco_a: float = hyperparameter(
        FEDDISCO_DEFAULT_A, low=0.0, doc="FedDisco's discrepancy weight a", per_run=True
    )
    feddisco_b: float = hyperparameter(
        FEDDISCO_DEFAULT_B, doc="FedDisco's offset b", per_run=True
    )
    feddisco_metric: str = hyperparameter(
        FEDDISCO_DEFAULT_METRIC, kind="choice", choices=DISCREPANCY_METRICS,
        doc="FedDisco's discrepancy of S_k from T",
    )


def _build(hp: FedDiscoHyperparameters, context: MethodContext) -> FederatedAlgorithm:
    partition = _need(context.partition, "the partition (its target T)", "feddisco")
    return feddisco(partition.target_label_dist, hp.feddisco_a, hp.feddisco_b, hp.feddisco_metric)


register_method(
    Method("feddisco", "FedDisco", _build, FedDiscoHyperparameters, reads_target=True,
           description="weights from size and label discrepancy (Ye et al., 2023)"), replace=True
)
