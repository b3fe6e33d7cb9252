"""Poisson client sampling's server weights: McMahan et al.'s fixed-denominator estimator.

Under Poisson sampling each of the M clients takes part in a round independently with
probability q (`fedjax_pals.training.sample_poisson_participants`), so the participants vary
in number. The server's aggregate is then (McMahan et al., "Learning Differentially Private
Recurrent Language Models", ICLR 2018, estimator f_f):

    Delta = sum_{i sampled} (alpha_i / q) Delta_i,      alpha = the weighting over all M clients

an unbiased estimate of the full-participation aggregate sum_i alpha_i Delta_i whose
denominator (q, the expected share) does not depend on who was drawn: zeroing one client's
contribution, the weights held fixed (DP on updates' zero-out relation, `fedjax_pals.accounting`),
moves Delta by (alpha_i / q) ||Delta_i|| at most, so DP on updates' sensitivity is
C max_i alpha_i / q over all M clients, whoever was drawn: the weighting declares that bound
(`Weighting.max_weight`), and the server chain's links read it (`server_chain.RoundUpdates`). alpha is the
method's own weighting solved over every client (FedAvg: n_i / N; FedPALS: eq. 8 with every
S_i), not over the round's participants; the weights of one round do not sum to 1.

The engine's shapes are static: a round runs a fixed number of lanes, and the lanes no client
drew carry the id M (`fedjax_pals.engine.plan.make_plan`: no step); their weight here is 0.
The clients' S_i, n_i and q are per-run data in `ServerState.weighting_state` (a
`PoissonSamplingState`, the wrapped weighting's state in `.inner`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import FederatedAlgorithm, ServerState, Weighting
from fedjax_pals.algorithms import private_updates, server_chain


class PoissonSamplingState(NamedTuple):
    """The fixed-denominator weights' per-run data: the wrapped weighting's state, every
    client's label distribution (as the weights see it) and size, and q."""

    inner: Any
    label_dists: jax.Array  # (M, K) float32
    sizes: jax.Array  # (M,) float32
    sampling_rate: jax.Array  # () float32, q

    _built_by = "fjp.algorithms.with_poisson_sampling (training.client_sampling='poisson')"


def _all_clients_weights(inner_weights, state: ServerState) -> jax.Array:
    """alpha over every client: the wrapped weighting with all M clients taking part."""
    data: PoissonSamplingState = state.weighting_state
    inner_state = state._replace(weighting_state=data.inner)
    everyone = jnp.arange(data.sizes.shape[0], dtype=jnp.int32)
    return inner_weights(data.label_dists, data.sizes, inner_state, everyone)


@functools.cache
def _fixed_denominator(inner_weights):
    """The lane weights of `inner_weights` under Poisson sampling and their declared bound (one
    pair per wrapped function: the engine keys its compiled rounds on the functions)."""

    def weights(label_dists, sizes, state: ServerState, participants):
        data: PoissonSamplingState = state.weighting_state
        num_clients = data.sizes.shape[0]
        alpha = _all_clients_weights(inner_weights, state)
        drawn = participants < num_clients
        lane = alpha[jnp.minimum(participants, num_clients - 1)] / data.sampling_rate
        return jnp.where(drawn, lane, 0.0).astype(jnp.float32)

    def max_weight(state: ServerState, lane_weights):
        # max_i alpha_i / q over every client, whoever was drawn: the fixed-denominator
        # aggregate's sensitivity per unit of clip norm.
        data: PoissonSamplingState = state.weighting_state
        return jnp.max(_all_clients_weights(inner_weights, state) / data.sampling_rate)

    return weights, max_weight


def population_weights(weighting: Weighting, state: ServerState) -> jax.Array:
    """alpha / q over all M clients: the weight each client gets when drawn (the largest is
    what the weighting declares, `Weighting.max_weight`). `weighting`: one
    `with_poisson_sampling` built (ValueError otherwise)."""
    data = state.weighting_state
    if not isinstance(data, PoissonSamplingState):
        raise ValueError(
            f"weighting {weighting.name!r} is not one with_poisson_sampling built (its state is "
            f"{type(data).__name__}, not PoissonSamplingState).")
    everyone = jnp.arange(data.sizes.shape[0], dtype=jnp.int32)
    return weighting.weights(data.label_dists, data.sizes, state, everyone)


def with_poisson_sampling(
    algorithm: FederatedAlgorithm, sampling_rate: float, label_dists: Any, sizes: Any
) -> FederatedAlgorithm:
    """`algorithm` with the fixed-denominator weights of Poisson sampling at rate q (module
    docstring): `label_dists` (M, K) and `sizes` (M,) are every client's, as the weights see
    them (a weighting that reads the server's release of S reads its own copy).

    Raises:
      ValueError: q outside (0, 1], bad label distributions or sizes, a server update that
        is not the plain weighted average (a method that owns its server update averages its
        participants its own way), or DP on updates with adaptive clipping already wrapped
        around `algorithm` (either order is refused).
    """
    rate = _validation.check_number("the sampling rate q", sampling_rate, low=0.0, high=1.0,
                                    low_open=True)
    dists = _validation.check_label_dists("label_dists", label_dists)
    sizes = np.asarray(sizes, np.float64)
    if sizes.shape != (dists.shape[0],) or not np.all(sizes > 0):
        raise ValueError(
            f"sizes must be {dists.shape[0]} positive client sizes, got shape {sizes.shape}."
        )
    if not server_chain.is_chained(algorithm.server_update):
        raise ValueError(
            f"Poisson sampling's fixed-denominator estimator is a weighted sum of the drawn "
            f"clients' updates, but {algorithm.name!r} has a server update of its own."
        )
    # DP on updates wrapped first: its adaptive clip link would count among a drawn number.
    if any(isinstance(link, private_updates.ServerClipping) and link.adaptive
           for link in server_chain.chain_of(algorithm).links):
        raise ValueError(private_updates.ADAPTIVE_WITH_POISSON)
    weighting = algorithm.weighting
    inner_init = weighting.init
    table = (jnp.asarray(dists, jnp.float32), jnp.asarray(sizes, jnp.float32),
             jnp.float32(rate))

    def init():
        return PoissonSamplingState(inner_init(), *table)

    weights, max_weight = _fixed_denominator(weighting.weights)
    return algorithm._replace(weighting=Weighting(weighting.name, init, weights, max_weight))
