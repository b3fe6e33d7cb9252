"""The server's copy of the clients' label marginals in a weighting: differentially private S.

Under label DP (`fedjax_pals.privacy`: the Laplace / Gaussian mechanisms on the clients' label
histograms, and the privacy accounting) each client releases a noisy S_i(Y) once, before
training; the server solves its weights (FedPALS' eq. 8, FedDisco's discrepancies) on the
release, while the clients' local training keeps their exact counts. `with_server_label_dists`
is that wrapper around any weighting.

The feature `label_dp` (`algorithm.label_dp_epsilon` set, for every run whose server weights
read S and T): the release is drawn once from the seed's own random stream, before the method
is built (so the ESS search sees it too), and the built algorithm's weighting is wrapped.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.base import FederatedAlgorithm, ServerState, Weighting
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter
from fedjax_pals.privacy import MECHANISMS, private_label_dists


class ServerLabelDistsState(NamedTuple):
    """The wrapped weighting's state and the server's (M, K) copy of S."""

    inner: Any
    server_label_dists: jax.Array


@functools.cache
def _server_dists_weights_fn(inner_weights):
    def weights(label_dists, sizes, state: ServerState, participants):
        data = state.weighting_state
        seen = data.server_label_dists[participants].astype(label_dists.dtype)
        inner_state = state._replace(weighting_state=data.inner)
        return inner_weights(seen, sizes, inner_state, participants)

    return weights


@functools.cache
def _server_dists_max_weight_fn(inner_max_weight):
    def max_weight(state: ServerState, lane_weights):
        return inner_max_weight(
            state._replace(weighting_state=state.weighting_state.inner), lane_weights)

    return max_weight


def with_server_label_dists(weighting: Weighting, server_label_dists: chex.ArrayLike) -> Weighting:
    """`weighting` computed from the server's copy of S (e.g. the DP release) instead of the
    clients' exact S_i(Y).

    The engine hands a weighting the participants' exact label distributions, which the
    client methods (FedRS, FedShift, FedLC) also read; this wrapper keeps those and makes the
    server weights read rows of `server_label_dists` instead. The (M, K) matrix is per-run
    data in `ServerState.weighting_state` (a `ServerLabelDistsState`, the wrapped weighting's
    state in `.inner`), so runs with different releases share one compiled round.
    """
    dists = _validation.check_label_dists("server_label_dists", server_label_dists)
    data_dists = jnp.asarray(dists, jnp.float32)
    init = lambda: ServerLabelDistsState(weighting.init(), data_dists)
    declared = weighting.max_weight
    return Weighting(
        weighting.name, init, _server_dists_weights_fn(weighting.weights),
        None if declared is None else _server_dists_max_weight_fn(declared))


@dataclasses.dataclass(frozen=True)
class LabelDP(Hyperparameters):
    label_dp_epsilon: float | None = hyperparameter(
        None, low=0.0, low_open=True, optional=True,
        why=" (None: the server sees the exact label distributions)",
        doc="None (exact S_i) or the epsilon of the clients' DP release of S_i",
        per_run=True,
    )
    label_dp_mechanism: str | None = hyperparameter(
        "laplace", kind="choice", choices=MECHANISMS, optional=True,
        doc="laplace (epsilon-DP) | gaussian ((epsilon, delta)-DP)",
        per_run=True,
    )
    label_dp_delta: float | None = hyperparameter(
        1e-5, low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
        doc="the Gaussian mechanism's delta",
        per_run=True,
    )


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    epsilon, mechanism, delta = (
        values["label_dp_epsilon"], values["label_dp_mechanism"], values["label_dp_delta"]
    )
    private = facts.reads_target and epsilon is not None
    if private and facts.section.get("target_estimation") is not None:
        # T's estimator starts from and regularises towards the clients' exact label counts:
        # the release would not be all the server learns of them.
        raise ValueError(
            "config.algorithm.label_dp_epsilon is set, but algorithm.target_estimation reads "
            "the clients' exact label distributions, which label DP keeps from the server; "
            "use one or the other."
        )
    for key, value, needed in (
        ("label_dp_mechanism", mechanism, private),
        ("label_dp_delta", delta, private and mechanism == "gaussian"),
    ):
        if needed and value is None:
            raise ValueError(f"config.algorithm.{key} is None, but {facts.method.name} needs it.")
    return {
        "label_dp_epsilon": epsilon if private else None,
        "label_dp_mechanism": mechanism if private else None,
        "label_dp_delta": delta if private and mechanism == "gaussian" else None,
    }


# A random stream of its own for the DP noise of the label marginals.
_LABEL_DP_STREAM = 0xD1FF


def _prepare(hp: LabelDP, context: registry.MethodContext) -> registry.MethodContext:
    # The clients release S_i(Y) through a DP mechanism once; the server's weights and the
    # ESS search use the release (post-processing), local training the exact counts.
    key = jax.random.fold_in(jax.random.PRNGKey(context.seed), _LABEL_DP_STREAM)
    release = private_label_dists(
        context.partition.client_label_counts, hp.label_dp_epsilon, hp.label_dp_mechanism, key,
        delta=hp.label_dp_delta,
    )
    return context.replace(server_label_dists=release)


def _wrap(
    algorithm: FederatedAlgorithm, hp: LabelDP, context: registry.MethodContext
) -> FederatedAlgorithm:
    return algorithm._replace(
        weighting=with_server_label_dists(algorithm.weighting, context.server_label_dists)
    )


registry.register_feature(
    registry.Feature(
        "label_dp", "label DP", LabelDP, _resolve, prepare=_prepare, wrap=_wrap,
        stage="label_marginals",
        per_run_presence=("label_dp_epsilon",),
        description="the server's weights see a DP release of the S_i (privacy.py)",
    ),
    replace=True,
)
