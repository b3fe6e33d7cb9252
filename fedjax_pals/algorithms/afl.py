"""AFL (Mohri et al., 2019): min_w max_{lam in simplex} sum_k lam_k L_k(w).

Where ours differs from the reference implementations, and why. AFL vs Mohri et al.
(Stochastic-AFL) and litian96/fair_flearn `flearn/trainers/afl.py`: the reference runs agnostic
FedSGD: every round each client computes ONE gradient of its full local loss at w_t,
w <- w - eta sum_k lam_k g_k, lam <- Proj_simplex(lam + gamma L(w_t)) with L_k(w_t) the full
local loss, and reports the running average of the iterates. Ours keeps the lam step and the
averaged iterate but (a) lets clients run E local epochs and mixes the client MODELS with lam
(the local-update form in which the FedPALS paper trains every method), and (b) uses the loss of
the client's first minibatch at w_t, an unbiased estimate of L_k(w_t), as the lam-gradient
(exact with full-batch steps); (c) under partial participation only the participants' lam move
(see `afl_server_update`). The FedDG benchmark (Bai et al., 2024; the authors' fork
Breitholtz/FedDG_Benchmark, `AFLServer` / `AFLClient`) is another algorithm: lam over domains
weighs each client's local LOSS, the server averages models by size and the LAST iterate is
evaluated. With one domain per client, lam_i ~ 1/M there divides the effective local learning
rate by ~M. The paper does not say which AFL produced its Fashion-MNIST / CIFAR-10 rows. The
averaged iterate (1/T) sum_t w_t lags the last one by about half the run, which costs accuracy
in short runs (`afl(..., average_iterates=False)` evaluates the last iterate instead).

Grid of the selection protocol: the step size gamma_lambda in 0.1, 0.01, 0.001, 1 (Mohri et
al., 2019 leave it free).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientOutputs, FederatedAlgorithm, Params, ServerState, ServerUpdate, Weighting,
    _global_params, fedavg_weighting, find_state, plain_sgd, replace_state,
    weighted_average_update,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method


class AflState(NamedTuple):
    """AFL's server state (`ServerState.algorithm_state`): lam, the (M,) mixture weights on
    the simplex; avg_params, the running average of the iterates w_1..w_t."""

    lam: jax.Array
    avg_params: Params
    _built_by = "afl(step_size)"


def _check_step(step_size: float) -> float:
    # The config's rule for algorithm.afl_step (`AflHyperparameters`): a step of 0 never moves
    # lam, which is FedAvg with an averaged iterate, not AFL.
    return _validation.check_number("step_size", step_size, low=0.0, low_open=True)


def _afl_weights(label_dists, sizes, state, participants):
    lam = find_state(state.algorithm_state, AflState).lam[participants]
    total = jnp.sum(lam)
    m = lam.shape[0]
    return jnp.where(total > 0, lam / jnp.where(total > 0, total, 1.0), 1.0 / m)


@functools.cache
def afl_weighting() -> Weighting:
    """lam restricted to the participants and renormalised: alpha_i = lam_i / sum_{j in S} lam_j
    (alpha = lam with full participation; uniform if the participants' mass is 0)."""
    return Weighting("afl", fedavg_weighting().init, _afl_weights)


def afl_server_update(step_size: float) -> ServerUpdate:
    """AFL's server step (Mohri et al., 2019, "Agnostic Federated Learning", Stochastic-AFL).

    Model:  w_t = w_{t-1} + sum_{i in S} alpha_i (w_i - w_{t-1}), alpha from `afl_weighting`.
    Mixture weights (projected gradient ascent on sum_k lam_k L_k):

        lam_S <- Proj_{ {v >= 0, sum v = m_S} } (lam_S + gamma L_S),   m_S = sum_{i in S} lam_i,

    and lam_i unchanged for i not in S. L_i is the client's `initial_loss`, the
    loss of its first local minibatch at the broadcast w_{t-1}: an unbiased
    estimate of L_i(w_{t-1}), the stochastic gradient in lam of Stochastic-AFL
    (exactly L_i(w_{t-1}) with full-batch steps). Under full participation this is the
    paper's lam <- Proj_simplex(lam + gamma L). Under partial participation
    only the participants' losses are known, so only their block moves, and
    it keeps its total mass: lam stays on the simplex and absent clients'
    weights are exactly unchanged (rather than shrinking, as projecting the
    full vector with a zero gradient for them would do).

    Averaged iterate: avg_t = avg_{t-1} + (w_t - avg_{t-1}) / t, so
    avg_T = (1/T) sum_{t=1}^T w_t, the model the paper reports (`eval_params`).
    """
    return _afl_server_update(_check_step(step_size))


@functools.cache
def _afl_server_update(step_size: float) -> ServerUpdate:
    average = weighted_average_update(1.0)

    from jaxopt.projection import projection_simplex  # here: jaxopt's import is slow

    def update(state: ServerState, participants, outputs: ClientOutputs, weights):
        new_state = average(state, participants, outputs, weights)
        lam, avg = find_state(state.algorithm_state, AflState)
        block = lam[participants]
        mass = jnp.sum(block)
        safe_mass = jnp.where(mass > 0, mass, 1.0)
        moved = projection_simplex(
            block + step_size * outputs.initial_loss.astype(lam.dtype), safe_mass
        )
        lam = lam.at[participants].set(jnp.where(mass > 0, moved, block))
        t = (state.round + 1).astype(jnp.float32)  # rounds completed with this one, >= 1
        avg = jax.tree_util.tree_map(
            lambda a, w: a + (w - a) / t.astype(a.dtype), avg, new_state.params
        )
        return new_state._replace(
            algorithm_state=replace_state(state.algorithm_state, AflState, lam=lam, avg_params=avg)
        )

    return update


def _afl_init(params, num_clients):
    return AflState(jnp.full((num_clients,), 1.0 / num_clients, jnp.float32), params)


def _afl_eval_params(state: ServerState) -> Params:
    return find_state(state.algorithm_state, AflState).avg_params


def afl(step_size: float, average_iterates: bool = True) -> FederatedAlgorithm:
    """Agnostic Federated Learning (Mohri, Sivek & Suresh, ICML 2019).

        min_w max_{lam in simplex} sum_k lam_k L_k(w)    over all M clients,

    lam_0 uniform; clients run plain local SGD, the server mixes their updates with lam
    (`afl_weighting`) and takes a projected ascent step on lam (`afl_server_update`, gamma =
    `step_size`). `eval_params` returns the running average of the iterates, or with
    average_iterates=False the last iterate w_T (module docstring). Training is the same.
    """
    step_size = _check_step(step_size)
    average = _validation.check_flag("average_iterates", average_iterates)
    return FederatedAlgorithm(
        name="afl" if average else "afl(last iterate)", client=plain_sgd(),
        weighting=afl_weighting(), server_update=afl_server_update(step_size),
        init_algorithm_state=_afl_init,
        eval_params=_afl_eval_params if average else _global_params,
    )


@dataclasses.dataclass(frozen=True)
class AflHyperparameters(Hyperparameters):
    afl_step: float = hyperparameter(
        0.1, low=0.0, low_open=True, doc="AFL's projected-ascent step gamma on its mixture",
        identity_when_unset=True,
    )


register_method(
    Method("afl", "AFL", lambda hp, context: afl(hp.afl_step), AflHyperparameters,
           grid={"afl_step": (0.1, 0.01, 0.001, 1.0)}, owns_server_update=True,
           description="min-max over client mixtures (Mohri et al., 2019)"), replace=True
)
