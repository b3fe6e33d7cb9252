"""FedPALS: local SGD, target-aware weights alpha^lam (eq. 8, Algorithm 1).

FedAvg's client and server update with the weights of eq. 8: the projection of the target's
T(Y) onto the convex hull of the participants' S_i(Y), traded off by lam against the effective
sample size, re-solved whenever the participants change. T and lam are per-run data in
`ServerState.weighting_state`, so runs differing only in them share one compiled round.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_pals import _validation, server_weights
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.fedpals_lambda import LAMBDA
from fedjax_pals.algorithms.base import (
    FederatedAlgorithm, Weighting, _need, combine, find_state, plain_sgd, replace_state,
)


class FedPalsState(NamedTuple):
    """FedPALS' per-run data: the weighting's state (`ServerState.weighting_state`)."""

    target_label_dist: jax.Array  # (K,) T(Y)
    lam: jax.Array  # float32 scalar, eq. 8's lambda
    _built_by = "fedpals(...) or a fedpals_weighting"


def fedpals_state(weighting_state: Any) -> FedPalsState:
    """The `FedPalsState` in `weighting_state`, also inside a wrapper's state
    (`with_server_label_dists`): `find_state(weighting_state, FedPalsState)`."""
    return find_state(weighting_state, FedPalsState)


def replace_fedpals_state(weighting_state: Any, **changes: Any) -> Any:
    """`weighting_state` with fields of its `FedPalsState` (see `fedpals_state`) replaced."""
    return replace_state(weighting_state, FedPalsState, **changes)


@functools.cache
def _fedpals_weights_with(solver: str):
    """The weights function that solves eq. 8 with `solver` (one per solver: the engine keys
    its compiled rounds on the function's identity)."""

    def weights(label_dists, sizes, state, participants):
        data = fedpals_state(state.weighting_state)
        return server_weights.fedpals_weights(
            label_dists, data.target_label_dist, sizes, data.lam, solver=solver
        )

    return weights


_fedpals_weights = _fedpals_weights_with(server_weights.DEFAULT_SOLVER)


def _check_solver(name: str, solver: str | None) -> str | None:
    """None, or one of `server_weights.SOLVERS`; the default solver is None, so that a run that
    names it shares the default's compiled round."""
    solver = _validation.check_choice(name, solver, server_weights.SOLVERS, optional=True)
    return None if solver == server_weights.DEFAULT_SOLVER else solver


def fedpals_weighting(
    target_label_dist: chex.ArrayLike, lam: float, *, solver: str | None = None
) -> Weighting:
    """alpha^lam of eq. 8 over the participants, re-solved whenever they change.

    solver: how `server_weights.fedpals_weights` solves eq. 8: None or "active_set" (the
    default, exact) or "projected_gradient" (the design card's jaxopt solver, slower).
    """
    # Checked here: inside the jitted round the values are traced and unchecked.
    _validation.check_distribution("target_label_dist", target_label_dist)
    _validation.check_lam(lam)
    solver = _check_solver("solver", solver)
    data = FedPalsState(jnp.asarray(target_label_dist, jnp.float32), jnp.asarray(lam, jnp.float32))
    weights = _fedpals_weights_with(solver or server_weights.DEFAULT_SOLVER)
    return Weighting("fedpals", lambda: data, weights)


def fedpals(
    target_label_dist: chex.ArrayLike, lam: float, *, weights_solver: str | None = None
) -> FederatedAlgorithm:
    """FedPALS (module docstring); weights_solver: `fedpals_weighting`'s solver."""
    weighting = fedpals_weighting(
        target_label_dist, lam, solver=_check_solver("weights_solver", weights_solver)
    )
    return combine(plain_sgd(), weighting, "fedpals")


@dataclasses.dataclass(frozen=True)
class FedPalsHyperparameters(registry.Hyperparameters):
    # Declared with its check rather than registry.hyperparameter, whose choices exclude None:
    # None, the default solver, leaves the key out of a run's identity (config_identity), so
    # the digests of the runs recorded before it stay valid; "active_set" resolves to None.
    weights_solver: str | None = dataclasses.field(
        default=None,
        metadata={
            "check": _check_solver,
            "doc": "FedPALS' weights solver: None (active_set) | active_set | projected_gradient",
        },
    )


def _build(hp: FedPalsHyperparameters, context: registry.MethodContext) -> FederatedAlgorithm:
    partition = _need(context.partition, "the partition (its target T)", "fedpals")
    lam = _need(context.get(LAMBDA), "FedPALS' trade-off lam", "fedpals")
    return fedpals(partition.target_label_dist, lam, weights_solver=hp.weights_solver)


class FedPalsMonitor(registry.Monitor):
    """What a run with FedPALS' weights reports of them (`Method.monitor`): lambda, the ESS of
    round 1's weights over every client, and d(T, S) of the S the weights are solved with (a
    `label_marginals` feature's release, e.g. label DP's, where there is one) against the T
    they aim at.

    results.json: `lam`, `projection_distance` and `projection_distance_s` (where that S is:
    "server_label_dists" or "partition.client_label_dists"; the partition's own
    `projection_distance` stays that of the exact S_i). Scalars: `server/lambda` and
    `server/projection_distance` (a feature's override them: adaptive lambda's lambda, T
    re-estimated's d(T^, S)).
    """

    def __init__(self, hp: FedPalsHyperparameters, task: Any) -> None:
        del hp
        context, partition = task.context, task.partition
        self.lam = context.get(LAMBDA)
        released = context.server_label_dists
        dists = partition.client_label_dists if released is None else released
        self.distance_s = (
            "partition.client_label_dists" if released is None else "server_label_dists")
        self.distance = float(server_weights.projection_distance(
            dists, partition.target_label_dist))
        # Round 1's weights over every client, as the run's summary has them.
        self.ess, self.total = task.summary["ess"], task.summary["total_examples"]

    def headline(self) -> str:
        lam = "-" if self.lam is None else f"{self.lam:.4g}"
        released = " (S: label DP's release)" if self.distance_s == "server_label_dists" else ""
        return (f"lam={lam} ESS={self.ess:.0f}/{self.total} "
                f"d(T,S)={self.distance:.4g}{released}")

    def scalars(self, state: Any) -> dict:
        del state
        scalars = {"server/projection_distance": self.distance}
        if self.lam is not None:
            scalars["server/lambda"] = float(self.lam)
        return scalars

    def results(self, state: Any) -> dict:
        del state
        return {"lam": self.lam, "projection_distance": self.distance,
                "projection_distance_s": self.distance_s}


registry.register_method(
    registry.Method(
        "fedpals", "FedPALS", _build, FedPalsHyperparameters, reads_target=True,
        lends_weighting=True, description="local SGD, target-aware weights alpha^lam (eq. 8)",
        monitor=FedPalsMonitor,
    ),
    replace=True,
)
