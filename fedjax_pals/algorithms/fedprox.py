"""FedProx (Li et al., 2020): local loss + (mu/2) ||w - w_global||^2.

Where ours differs from the reference implementations, and why. FedProx vs FedJAX
`fedjax/algorithms/fed_prox.py`: the same objective, mean over the batch of
CE + (mu/2) ||w - w^t||_2^2, so the local gradient is g(w) + mu (w - w^t); the same
size-weighted average of the client deltas (FedJAX applies it through a server optimizer; ours
is that optimizer with SGD at rate 1). The FedPALS authors' precursor code
(Breitholtz/FedDG_Benchmark, `fed_alpha_experiments/utils.py` and `src/client.py`) adds
(mu/2) sum over tensors of the UNsquared norm ||w_l - w^t_l||_2; we keep the squared norm of
the FedProx paper (eq. 2) and FedJAX.

Grid of the selection protocol: mu in 0.01, 0.001, 0.1, 1 (the candidate set of Li et al.,
2020; the first is the default).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientMethod, FederatedAlgorithm, PyTree, Weighting, _suffix, combine, plain_sgd,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method


def _tree_sq_norm(tree: PyTree) -> jax.Array:
    return sum(
        (jnp.sum(jnp.square(leaf)) for leaf in jax.tree_util.tree_leaves(tree)),
        jnp.zeros((), jnp.float32),
    )


def fedprox_client(mu: float) -> ClientMethod:
    """FedProx's local objective (Li et al., 2020, eq. 2).

        h_i(w; w^t) = F_i(w) + (mu / 2) ||w - w^t||_2^2,

    w^t the broadcast global params: local SGD steps are pulled back towards
    w^t with strength mu. mu = 0 is plain local SGD (FedAvg's client).
    """
    return _fedprox_client(_validation.check_nonnegative("mu", mu))


@functools.cache
def _fedprox_client(mu: float) -> ClientMethod:
    def regularizer(params, global_params):
        diff = jax.tree_util.tree_map(jnp.subtract, params, global_params)
        return 0.5 * mu * _tree_sq_norm(diff)

    return plain_sgd()._replace(name=f"fedprox(mu={mu:g})", regularizer=regularizer)


def fedprox(mu: float, weighting: Weighting | None = None) -> FederatedAlgorithm:
    """FedProx (Li et al., MLSys 2020) with FedAvg weights, or `weighting` (FedProx+FedPALS)."""
    return combine(fedprox_client(mu), weighting, _suffix("fedprox", weighting))


@dataclasses.dataclass(frozen=True)
class FedProxHyperparameters(Hyperparameters):
    prox_mu: float = hyperparameter(
        0.01, low=0.0, doc="FedProx' proximal strength mu", identity_when_unset=True)


register_method(
    Method("fedprox", "FedProx", lambda hp, context: fedprox(hp.prox_mu, context.weighting),
           FedProxHyperparameters,
           grid={"prox_mu": (0.01, 0.001, 0.1, 1.0)}, client_side=True,
           description="local loss + (mu/2) ||w - w_global||^2 (Li et al., 2020)"), replace=True
)
