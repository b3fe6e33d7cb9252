"""The server's copy of the clients' label marginals in a weighting: differentially private S.

Under label DP (`fedjax_pals.privacy`: the Laplace / Gaussian mechanisms on the clients' label
histograms, and the privacy accounting) each client releases a noisy S_i(Y) once, before
training; the server solves its weights (FedPALS' eq. 8, FedDisco's discrepancies) on the
release, while the clients' local training keeps their exact counts. `with_server_label_dists`
is that wrapper around any weighting.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import ServerState, Weighting


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
    inner = weighting
    data_dists = jnp.asarray(dists, jnp.float32)

    def init():
        return ServerLabelDistsState(inner.init(), data_dists)

    return Weighting(inner.name, init, _server_dists_weights_fn(inner.weights))
