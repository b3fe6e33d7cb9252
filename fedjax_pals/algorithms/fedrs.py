"""FedRS (Li & Zhan, 2021): restricted softmax, absent classes' logits scaled.

Where ours differs from the reference implementations, and why. FedRS vs lxcnju/FedRepo
`algorithms/fedrs.py`: the reference computes z = a * (W h) with a bias-free classifier W and
a_k = alpha + (1 - alpha) p_ik / max_j p_ij (our soft=True), trains on CE(z) and evaluates the
unscaled W h. Ours offers that scaling (soft) and the paper's restricted softmax (hard:
a_k = alpha for absent classes, 1 otherwise, the default). Under the FedPALS sparsity partition
every client is uniform over its labels, so p_ik / max_j p_ij is 1 or 0 and
hard == soft == the reference. Ours scales the model's logits; with the bias-free head
(`lenet(..., head_bias=False)`, model "lenet_nobias") that is exactly the reference's
a * (W h); with a head bias b it is a * (W h + b). The Table 1 configs train every method, FedRS
included, with one model, config.model = "auto" (LeNet with a head bias, as the paper's CNN):
the sweep gives all methods one model; run FedRS with --config.model=lenet_nobias for the
reference head. The reference also clips gradients and uses its own optimiser settings; ours
does not clip. Evaluation uses the plain logits, as the reference does; the FedPALS paper's
FedRS numbers are matched instead by evaluating with the target's own restriction (T's absent
labels' logits x alpha), measured by `experiments/restricted_eval.py` (REPRODUCTION.md,
Table 1).

Grid of the selection protocol: alpha in 0.5, 0.9, 0.1 (Li & Zhan, 2021).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, FederatedAlgorithm, ServerState, Weighting, _suffix, combine,
    plain_sgd,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method


def fedrs_client(alpha: float, soft: bool = False) -> ClientMethod:
    """FedRS's restricted softmax (Li & Zhan, KDD 2021), during local training only.

    Client i scales the logit of class k by

        hard: a_ik = 1 if p_ik > 0 else alpha          (classes absent on the client)
        soft: a_ik = alpha + (1 - alpha) p_ik / max_j p_ij,

    p_i = S_i(Y) its label distribution, alpha in (0, 1]; the loss is CE(a_i * z), z the
    model's logits. alpha = 1 is plain local SGD. Evaluation uses the unscaled logits.

    For an example of client i and a class k it lacks (p_ik = 0, so y_k = 0) the gradient
    of the loss in class k's classifier row w_k (z_k = w_k^T h) is

        dL/dw_k = a_ik * softmax(a_i * z)_k * h,

    the restricted softmax: the absent class is pushed down by a_ik times its (scaled)
    probability rather than by softmax(z)_k (a head bias: module docstring).
    """
    alpha = _validation.check_real("alpha", alpha)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"FedRS alpha must be in (0, 1], got {alpha!r}.")
    return _fedrs_client(alpha, _validation.check_flag("soft", soft))


@functools.cache
def _fedrs_client(alpha: float, soft: bool) -> ClientMethod:
    def adjust_logits(logits, info: ClientInfo, state: ServerState):
        p = info.label_dist.astype(logits.dtype)
        if soft:
            scale = alpha + (1.0 - alpha) * p / jnp.max(p)
        else:
            scale = jnp.where(p > 0, 1.0, alpha).astype(logits.dtype)
        return logits * scale

    name = f"fedrs(alpha={alpha:g}{', soft' if soft else ''})"
    return plain_sgd()._replace(name=name, adjust_logits=adjust_logits)


def fedrs(
    alpha: float, soft: bool = False, weighting: Weighting | None = None
) -> FederatedAlgorithm:
    """FedRS (Li & Zhan, KDD 2021) with FedAvg weights, or `weighting`."""
    return combine(fedrs_client(alpha, soft), weighting, _suffix("fedrs", weighting))


@dataclasses.dataclass(frozen=True)
class FedRSHyperparameters(Hyperparameters):
    fedrs_alpha: float = hyperparameter(
        0.5, low=0.0, high=1.0, low_open=True, doc="FedRS' scaling of absent classes' logits",
        identity_when_unset=True,
    )
    fedrs_soft: bool = hyperparameter(
        False, kind="bool", doc="FedRS' soft variant", identity_when_unset=True)


register_method(
    Method("fedrs", "FedRS",
           lambda hp, context: fedrs(hp.fedrs_alpha, hp.fedrs_soft, context.weighting),
           FedRSHyperparameters,
           grid={"fedrs_alpha": (0.5, 0.9, 0.1)}, client_side=True,
           description="restricted softmax in local training (Li & Zhan, 2021)"), replace=True
)
