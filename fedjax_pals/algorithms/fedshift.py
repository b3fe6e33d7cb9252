"""FedShift (Shen et al., 2021): logits shifted by ln(P_i(k) / P(k)) in local training.

Where ours differs from the reference, and why. FedShift vs Shen et al. (Algorithm 1, eq. 5;
no public code): the same shift s_ik = ln(P_i(k) / P(k)) in local training only,
P = sum_i (n_i / N) P_i over all clients, Laplace-smoothed counts (the paper names the
smoothing but not its constant: ours is 1). The paper aggregates
w + sum_{i in M_t} (n_i / N)(w_i - w), N over ALL clients, so a round with partial
participation takes a step shrunk by the participants' share; ours normalises over the
participants (FedAvg's weights). The two coincide under full participation. The paper trains
with SGD momentum 0.9, weight decay 1e-4 and a decayed learning rate.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, FederatedAlgorithm, ServerState, Weighting, _need, _suffix,
    combine, find_state, plain_sgd,
)
from fedjax_pals.algorithms.registry import Method, MethodContext, register_method


class FedShiftState(NamedTuple):
    """FedShift's per-run data (`ServerState.algorithm_state`): aggregate_label_dist, the (K,)
    global P(Y) the clients' logits are shifted against."""

    aggregate_label_dist: jax.Array
    _built_by = "fedshift(aggregate_label_dist)"


def smoothed_label_dists(client_label_counts: chex.ArrayLike, smoothing: float = 1.0) -> np.ndarray:
    """Laplace-smoothed client label distributions P_i(k) = (c_ik + s) / (n_i + K s)."""
    s = _validation.check_positive("smoothing", smoothing)
    counts = np.asarray(client_label_counts, np.float64)
    if counts.ndim != 2 or not counts.size or np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError(
            "client_label_counts must be a non-empty, non-negative (M, K) matrix, "
            f"got shape {counts.shape}."
        )
    sizes = counts.sum(axis=1, keepdims=True)
    if np.any(sizes <= 0):
        raise ValueError("every client needs examples (a row of client_label_counts sums to 0).")
    return (counts + s) / (sizes + counts.shape[1] * s)


def fedshift_aggregate_label_dist(
    client_label_counts: chex.ArrayLike, smoothing: float = 1.0
) -> np.ndarray:
    """FedShift's global P(Y) over ALL M clients: P(k) = sum_i n_i P_i(k) / sum_i n_i.

    P_i the Laplace-smoothed client distributions (`smoothed_label_dists`), so
    P(k) > 0 for every class and, when all clients share one label
    distribution and size, P = P_i exactly (FedShift reduces to FedAvg). In the
    paper this is computed once, before training, by secure aggregation.
    """
    smoothed = smoothed_label_dists(client_label_counts, smoothing)
    sizes = np.asarray(client_label_counts, np.float64).sum(axis=1)
    return sizes @ smoothed / sizes.sum()


def fedshift_client(smoothing: float = 1.0) -> ClientMethod:
    """FedShift's classifier shift (Shen et al., 2021, eq. 7), during local training only.

        f~_k(w; x) = f_k(w; x) + s_ik,   s_ik = ln(P_i(y=k) / P(y=k)),

    P_i the client's Laplace-smoothed label distribution (`smoothed_label_dists`, its counts
    c_ik = p_ik n_i from its ClientInfo, s = `smoothing` > 0) and P the aggregate read from the
    state's `FedShiftState` (see `fedshift`). Evaluation uses the unshifted logits.
    """
    return _fedshift_client(_validation.check_positive("smoothing", smoothing))


@functools.cache
def _fedshift_client(smoothing: float) -> ClientMethod:
    def adjust_logits(logits, info: ClientInfo, state: ServerState):
        aggregate = find_state(state.algorithm_state, FedShiftState).aggregate_label_dist
        num_classes = logits.shape[-1]
        n = info.num_examples.astype(logits.dtype)
        counts = info.label_dist.astype(logits.dtype) * n
        local = (counts + smoothing) / (n + num_classes * smoothing)
        return logits + (jnp.log(local) - jnp.log(aggregate.astype(logits.dtype)))

    return plain_sgd()._replace(name=f"fedshift(s={smoothing:g})", adjust_logits=adjust_logits)


def fedshift(
    aggregate_label_dist: chex.ArrayLike, smoothing: float = 1.0, weighting: Weighting | None = None
) -> FederatedAlgorithm:
    """FedShift (Shen et al., 2021) with FedAvg weights, or `weighting`.

    `aggregate_label_dist` is the global P(Y) over all clients, strictly
    positive: compute it with `fedshift_aggregate_label_dist(
    partition.client_label_counts, smoothing)`. It is per-run data, so it goes
    into `ServerState.algorithm_state` (a `FedShiftState`), and runs on
    different partitions share one compiled round.
    """
    dist = _validation.check_distribution("aggregate_label_dist", aggregate_label_dist)
    if np.any(dist <= 0):
        raise ValueError(
            "aggregate_label_dist must be strictly positive (ln P(k) is taken); smooth the counts "
            f"with fedshift_aggregate_label_dist, got {dist.tolist()}."
        )
    return combine(
        fedshift_client(smoothing), weighting, _suffix("fedshift", weighting),
        algorithm_state=FedShiftState(jnp.asarray(dist, jnp.float32)),
    )


def _build(hp, context: MethodContext) -> FederatedAlgorithm:
    partition = _need(context.partition, "the partition (its label counts)", "fedshift")
    aggregate = fedshift_aggregate_label_dist(partition.client_label_counts)
    return fedshift(aggregate, weighting=context.weighting)


register_method(
    Method("fedshift", "FedShift", _build, client_side=True, description="logits shifted by "
           "ln(P_i(k) / P(k)) in local training (Shen et al., 2021)"), replace=True
)
