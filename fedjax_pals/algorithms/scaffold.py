"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Where ours differs from the reference implementations, and why. SCAFFOLD vs Karimireddy et al.
(Algorithm 1) and NIID-Bench (`experiments.py`, `train_net_scaffold` /
`local_train_net_scaffold`): the same local correction y <- y - eta_l (g_i(y) - c_i + c) and
option II, c_i+ = c_i - c + (x - y_i) / (K eta_l) with K the client's own number of steps over
all its local epochs (NIID-Bench's `cnt`). Two server-side differences, both following the
paper's Algorithm 1: ours averages the models uniformly, x <- x + eta_g mean_{i in S}(y_i - x),
where NIID-Bench weighs them by size n_i / sum_S n_j; ours moves c by
(1/N) sum_{i in S} (c_i+ - c_i), N = all clients, where NIID-Bench divides by |S|. Under full
participation (Table 1) the second coincides, and under the paper's sparsity partition all
clients have one size, so the first does too. NIID-Bench starts c = c_i at a copy of a randomly
initialised network (c - c_i = 0, as with our zeros) and trains with SGD momentum; option II
assumes plain SGD. The client control variates c_i are `ServerState.client_states`.

Grid of the selection protocol: the server learning rate eta_g in 1, 0.5 (Karimireddy et al.,
2020, use eta_g = 1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, ClientOutputs, FederatedAlgorithm, Params, ServerState,
    ServerUpdate, Weighting, _global_params, fedavg_weighting, find_state, plain_sgd,
    replace_state, weighted_average_update,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method


class ScaffoldState(NamedTuple):
    """SCAFFOLD's server state (`ServerState.algorithm_state`): c, the server control variate
    (params-shaped)."""

    c: Params
    _built_by = "scaffold()"


def _server_c(state: ServerState) -> Params:
    return find_state(state.algorithm_state, ScaffoldState).c


def _scaffold_correct_grads(grads, info: ClientInfo, state: ServerState):
    c = _server_c(state)
    return jax.tree_util.tree_map(lambda g, ci, cg: g - ci + cg, grads, info.state, c)


def _zeros_like_params(params):
    return jax.tree_util.tree_map(jnp.zeros_like, params)


def _scaffold_update_client_state(
    info: ClientInfo, state: ServerState, local_params, num_steps, learning_rate
):
    c = _server_c(state)
    k = num_steps.astype(jnp.float32)
    scale = 1.0 / (jnp.maximum(k, 1.0) * learning_rate)

    def option_two(ci, cg, x, y):
        new = ci - cg + (x - y) * scale.astype(x.dtype)
        return jnp.where(k > 0, new, ci)  # a client that took no step keeps its c_i

    return jax.tree_util.tree_map(option_two, info.state, c, state.params, local_params)


@functools.cache
def scaffold_client() -> ClientMethod:
    """SCAFFOLD's client (Karimireddy et al., 2020, Algorithm 1, option II).

    Local steps y <- y - eta_l (g_i(y) - c_i + c), then, after the K local steps
    the client actually took (its own count, not the padded one),

        c_i+ = c_i - c + (x - y_i) / (K eta_l),

    x the broadcast params, c the server control variate
    (`ScaffoldState.c`), c_i the client's (its persistent state, zeros at
    the start). Option II assumes plain SGD (no momentum) locally.
    """
    return plain_sgd()._replace(
        name="scaffold", correct_grads=_scaffold_correct_grads,
        init_client_state=_zeros_like_params, update_client_state=_scaffold_update_client_state,
    )


def _uniform_weights(label_dists, sizes, state, participants):
    m = sizes.shape[0]
    return jnp.full((m,), 1.0 / m, jnp.float32)


@functools.cache
def uniform_weighting() -> Weighting:
    """alpha_i = 1 / |S| over the round's participants (SCAFFOLD's server average)."""
    return Weighting("uniform", fedavg_weighting().init, _uniform_weights)


def scaffold_server_update(server_learning_rate: float = 1.0) -> ServerUpdate:
    """SCAFFOLD's server step (Algorithm 1, lines 16-17), S the participants:

        x <- x + eta_g * sum_{i in S} alpha_i (y_i - x)       (alpha = 1/|S| in `scaffold`)
        c <- c + (|S| / N) * mean_{i in S} (c_i+ - c_i)     N = all clients

    and c_i <- c_i+ for the participants only; the others keep their c_i.
    """
    return _scaffold_server_update(_validation.check_positive("server_lr", server_learning_rate))


@functools.cache
def _scaffold_server_update(server_learning_rate: float) -> ServerUpdate:
    average = weighted_average_update(server_learning_rate)

    def update(state: ServerState, participants, outputs: ClientOutputs, weights):
        new_state = average(state, participants, outputs, weights)  # x and the c_i
        num_clients = jax.tree_util.tree_leaves(state.client_states)[0].shape[0]
        c = jax.tree_util.tree_map(
            lambda cg, new, old: cg + jnp.sum(new - old[participants], axis=0) / num_clients,
            _server_c(state), outputs.client_states, state.client_states,
        )
        return new_state._replace(
            algorithm_state=replace_state(state.algorithm_state, ScaffoldState, c=c)
        )

    return update


def _scaffold_init(params, num_clients):
    return ScaffoldState(_zeros_like_params(params))


def scaffold(server_lr: float = 1.0) -> FederatedAlgorithm:
    """SCAFFOLD (Karimireddy et al., ICML 2020), option II, uniform server average. Control
    variates start at zero (c = c_i = 0), so the first round equals FedAvg with uniform weights."""
    return FederatedAlgorithm(
        name="scaffold", client=scaffold_client(), weighting=uniform_weighting(),
        server_update=scaffold_server_update(server_lr), init_algorithm_state=_scaffold_init,
        eval_params=_global_params,
    )


@dataclasses.dataclass(frozen=True)
class ScaffoldHyperparameters(Hyperparameters):
    server_lr: float = hyperparameter(
        1.0, low=0.0, low_open=True, doc="SCAFFOLD's global step eta_g",
        identity_when_unset=True,
    )


register_method(
    Method("scaffold", "SCAFFOLD", lambda hp, context: scaffold(hp.server_lr),
           ScaffoldHyperparameters, grid={"server_lr": (1.0, 0.5)}, owns_server_update=True,
           description="control variates, option II (Karimireddy et al., 2020)"), replace=True
)
