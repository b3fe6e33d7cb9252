"""IW-ERM (Ramezani-Kebrya et al., "Federated Learning under Covariate Shifts with
Generalization Guarantees", TMLR 2023): importance-weighted local losses for target label shift.

FedPALS reweights the *aggregation* towards the target's label distribution T; IW-ERM reweights
each client's *loss*. Under label shift, S_i(X | Y) = T(X | Y), the density ratio of client i is
a function of the label alone, r_i(x, y) = T(y) / S_i(y), and the importance-weighted empirical
risk of client i (the paper's IW-ERM objective, its label-shift case) is

    R_i(h) = (1 / n_i) sum_{(x, y) in D_i} r_i(y) l(h(x), y),

an unbiased estimate of the target risk E_T[l(h(x), y)] from client i's data wherever
S_i(y) > 0. Each local SGD step minimises it on a minibatch B of |B| valid examples:

    L_i(B) = (1 / |B|) sum_{b in B} min(r_i(y_b), R) CE(f(x_b), y_b),     (1)

the *mean* over the batch of r * loss, not divided by sum_b r_i(y_b): as the reference code
does (`dafl/client.py`, `Client.train_iterator`: `torch.sum(ratio * loss) / batch_size`, with
the true ratios of `dafl/ratio_estimation.py`'s `TrueRatioModel`, looked up by the label, and
`dafl/target_shift.py`'s `get_ratios`, target over train distribution). The server averages
the clients' models with FedAvg's weights n_i / N, or with a lender's (`iwerm_fedpals`: FedPALS'
weights, eq. 8), and any server optimiser (`fedadam_iwerm`).

The clip. The reference divides by S_i(y) unclipped (its partitions give every class a
positive share, down to about 0.3 %). Here r_i(y) = T(y) / S_i(y) is capped at
R = `algorithm.iwerm_max_ratio` (default 10, our choice: neither the paper nor its code has a
cap; uncapped as the reference: `iwerm(T, None)`, or in a config a value above every ratio,
e.g. 1e6, since a config's key with a default is never None): a class of which client i holds one example in a thousand
while T gives it a third would otherwise weigh 333 x the rest, one SGD step on it moving the
model by that much. The cap does not bind on FedPALS' sparsity partitions with C <= 10 labels a
client (each client uniform over its C labels: T(y) / S_i(y) <= C), only on tiny shares
(Dirichlet partitions). A class the client lacks (S_i(y) = 0) gets r = 0; no example of it is in
its batches.

T. The known T of the partition (`partition.target_label_dist`: the T FedPALS' weights use),
per-run data in the state: with FedPALS' weights the client reads T from the weighting's
`FedPalsState`, so the T in use is the one the server's weights aim at, which
`algorithm.target_estimation` (T re-estimated between rounds, `fedjax_pals.unknown_target`)
replaces: `iwerm_fedpals` with `--config.algorithm.target_estimation=<estimator>` weights the
losses by the current estimate T^(y) / S_i(y). With FedAvg's weights the client reads its own
`IwermState` (the partition's T), which `algorithm.target_estimation` replaces alike
(`IwermState` declares `_estimated_target`, `with_target_label_dist` finds it; the method
declares `target_state`, so the unknown-T feature runs under FedAvg's weights too): plain
`iwerm` with an estimator weights its losses by T^(y) / S_i(y), T^ starting from the clients'
aggregate sum_i n_i S_i / N.

T = S_i gives r = 1 on every present class: plain local SGD, FedAvg's client, exactly.
The reference trains with its own optimiser settings; ours trains locally with the package's
plain SGD as every method (`fedjax_pals.algorithms.base`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, FederatedAlgorithm, ServerState, Weighting, _need, _suffix,
    combine, find_state, holds_state, plain_sgd,
)
from fedjax_pals.algorithms.fedpals import FedPalsState
from fedjax_pals.algorithms.registry import (
    Hyperparameters, Method, MethodContext, hyperparameter, register_method,
)

# r_i(y) = T(y) / S_i(y) is capped at this by default (`algorithm.iwerm_max_ratio`).
IWERM_DEFAULT_MAX_RATIO = 10.0


class IwermState(NamedTuple):
    """IW-ERM's per-run data (`ServerState.algorithm_state`) when no FedPALS weighting holds T:
    target_label_dist, the (K,) T(Y) of the ratios T(y) / S_i(y)."""

    target_label_dist: jax.Array
    _built_by = "iwerm(target_label_dist)"
    # The T that T re-estimation (`target_estimation.with_target_label_dist`) replaces.
    _estimated_target = True


def iwerm_target(state: ServerState) -> jax.Array:
    """The T a client's ratios use: FedPALS' (the weighting's `FedPalsState`, which T
    re-estimation replaces) when the run has one, else IW-ERM's own `IwermState`."""
    if holds_state(state.weighting_state, FedPalsState):
        return find_state(state.weighting_state, FedPalsState).target_label_dist
    return find_state(state.algorithm_state, IwermState).target_label_dist


def iwerm_ratios(
    target_label_dist: chex.ArrayLike, label_dist: chex.ArrayLike, max_ratio: float | None
) -> jax.Array:
    """r(y) = min(T(y) / S(y), max_ratio) where S(y) > 0, and 0 where S(y) = 0 (no example of y
    is on the client); max_ratio None: uncapped."""
    s = jnp.asarray(label_dist)
    t = jnp.asarray(target_label_dist, s.dtype)
    present = s > 0
    ratio = jnp.where(present, t / jnp.where(present, s, 1.0), 0.0)
    return ratio if max_ratio is None else jnp.minimum(ratio, jnp.asarray(max_ratio, s.dtype))


def iwerm_client(max_ratio: float | None = IWERM_DEFAULT_MAX_RATIO) -> ClientMethod:
    """IW-ERM's local loss (module docstring, eq. 1): the mean over the batch's valid examples
    of r_i(y) CE, r_i = `iwerm_ratios(T, S_i, max_ratio)`, T read from the state
    (`iwerm_target`), S_i the client's label distribution (its `ClientInfo`)."""
    if max_ratio is not None:
        max_ratio = _validation.check_positive("max_ratio", max_ratio)
    return _iwerm_client(max_ratio)


@functools.cache
def _iwerm_client(max_ratio: float | None) -> ClientMethod:
    def data_loss(logits, labels, mask, info: ClientInfo, state: ServerState, global_logits):
        ratios = iwerm_ratios(iwerm_target(state), info.label_dist.astype(logits.dtype), max_ratio)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels) * ratios[labels]
        return jnp.sum(jnp.where(mask, losses, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

    name = f"iwerm(max_ratio={'none' if max_ratio is None else f'{max_ratio:g}'})"
    return plain_sgd()._replace(name=name, data_loss=data_loss)


def iwerm(
    target_label_dist: chex.ArrayLike, max_ratio: float | None = IWERM_DEFAULT_MAX_RATIO,
    weighting: Weighting | None = None,
) -> FederatedAlgorithm:
    """IW-ERM (Ramezani-Kebrya et al., TMLR 2023) with FedAvg weights, or `weighting`.

    `target_label_dist` is T; it is per-run data in `ServerState.algorithm_state` (an
    `IwermState`), unless `weighting` keeps a `FedPalsState` (FedPALS' weights): then the
    clients read that T, the one the server's weights use and T re-estimation replaces.
    """
    dist = _validation.check_distribution("target_label_dist", target_label_dist)
    weighting_state = weighting.init() if weighting is not None else ()
    data = () if holds_state(weighting_state, FedPalsState) else IwermState(
        jnp.asarray(dist, jnp.float32))
    return combine(iwerm_client(max_ratio), weighting, _suffix("iwerm", weighting),
                   algorithm_state=data)


@dataclasses.dataclass(frozen=True)
class IwermHyperparameters(Hyperparameters):
    iwerm_max_ratio: float | None = hyperparameter(
        IWERM_DEFAULT_MAX_RATIO, low=0.0, low_open=True,
        doc="IW-ERM's cap on the ratio T(y) / S_i(y); a value above every ratio (1e6) leaves "
        "it uncapped, as the reference code",
    )


def _build(hp: IwermHyperparameters, context: MethodContext) -> FederatedAlgorithm:
    partition = _need(context.partition, "the partition (its T)", "iwerm")
    target = np.asarray(partition.target_label_dist, np.float64)
    return iwerm(target, hp.iwerm_max_ratio, context.weighting)


register_method(
    Method("iwerm", "IW-ERM", _build, IwermHyperparameters, client_side=True,
           description="local losses weighted by T(y) / S_i(y) (Ramezani-Kebrya et al., 2023)",
           # The state whose T its clients read: algorithm.target_estimation replaces it, with
           # FedAvg's weights too (`unknown_target`).
           target_state=IwermState),
    replace=True,
)
