"""FedLC (Zhang et al., "Federated Learning with Label Distribution Skew via Logits
Calibration", ICML 2022), a label-shift method beyond the FedPALS paper's baselines.

FedLC is a *client method*: during local training every logit is calibrated by the client's
count of that label. It composes with any weighting: `fjp.combine(fedlc_client(tau),
fjp.fedpals_weighting(T, lam))` is FedLC+FedPALS. tau, which changes the traced program,
selects a cached function.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, FederatedAlgorithm, ServerState, Weighting, _suffix, combine,
    plain_sgd,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method

# FedLC: the count of a class the client does not hold is floored at this value before the
# power -1/4, as in the public implementations (FL-bench `src/client/fedlc.py`, fluke
# `fluke/algorithms/fedlc.py`: max(1e-8, count)); the shift of an absent class is then
# tau * (1e-8)^(-1/4) = 100 tau.
FEDLC_MIN_COUNT = 1e-8
FEDLC_DEFAULT_TAU = 1.0


def fedlc_calibrated_logits(
    logits: chex.ArrayLike, label_counts: chex.ArrayLike, tau: float
) -> jax.Array:
    """FedLC's calibrated logits (Zhang et al., 2022, Sec. 4, the calibrated loss):

        f~_y(x) = f_y(x) - tau * n_{k,y}^{-1/4},

    n_{k,y} the client's count of label y, floored at `FEDLC_MIN_COUNT` = 1e-8 for absent
    labels (the public implementations' choice). The local loss is the softmax
    cross-entropy of f~, as FL-bench and fluke compute it:

        L_cal(x, y) = -log( exp(f~_y(x)) / sum_{y'} exp(f~_{y'}(x)) ),

    so the pair (y, y') gets the margin tau (n_{k,y}^{-1/4} - n_{k,y'}^{-1/4}): a rare
    label must beat a frequent one by more. tau = 0 is the plain cross-entropy.
    """
    tau = _validation.check_nonnegative("tau", tau)
    logits = jnp.asarray(logits)
    counts = jnp.maximum(jnp.asarray(label_counts, logits.dtype), FEDLC_MIN_COUNT)
    return logits - jnp.asarray(tau, logits.dtype) * counts ** jnp.asarray(-0.25, logits.dtype)


@functools.cache
def _fedlc_client(tau: float) -> ClientMethod:
    def adjust_logits(logits, info: ClientInfo, state: ServerState):
        counts = info.label_dist.astype(logits.dtype) * info.num_examples.astype(logits.dtype)
        return fedlc_calibrated_logits(logits, counts, tau)

    return plain_sgd()._replace(name=f"fedlc(tau={tau:g})", adjust_logits=adjust_logits)


def fedlc_client(tau: float = FEDLC_DEFAULT_TAU) -> ClientMethod:
    """FedLC's logit calibration during local training (`fedlc_calibrated_logits`).

    The client's label counts n_{k,y} = S_k(y) n_k come from its ClientInfo; evaluation uses
    the uncalibrated logits. tau >= 0; tau = 0 is plain local SGD (FedAvg's client).
    """
    return _fedlc_client(_validation.check_nonnegative("tau", tau))


def fedlc(tau: float = FEDLC_DEFAULT_TAU, weighting: Weighting | None = None) -> FederatedAlgorithm:
    """FedLC (Zhang et al., ICML 2022) with FedAvg weights, or `weighting` (e.g. FedPALS' or
    FedDisco's)."""
    return combine(fedlc_client(tau), weighting, _suffix("fedlc", weighting))


@dataclasses.dataclass(frozen=True)
class FedLCHyperparameters(Hyperparameters):
    fedlc_tau: float = hyperparameter(
        FEDLC_DEFAULT_TAU, low=0.0, doc="FedLC's calibration strength tau"
    )


register_method(
    Method("fedlc", "FedLC", lambda hp, context: fedlc(hp.fedlc_tau, context.weighting),
           FedLCHyperparameters, client_side=True,
           description="logit calibration by label counts (Zhang et al., 2022)"), replace=True
)
