"""FedVLS (Guo, Ding, Liang, He, Wang & Tan, "Exploring Vacant Classes in Label-Skewed Federated
Learning", AAAI, arXiv 2401.02329 v3; its v1 was titled "Not all Minorities are Equal:
Empty-Class-Aware Distillation for Heterogeneous Federated Learning", FedED): vacant-class
distillation plus logit suppression in local training.

A client's *vacant* classes are those it holds no example of, V_i = {c : pi_c = 0}, pi = S_i(Y)
its label distribution. Its local loss on a minibatch B of N valid examples, f the local
model's logits, g the broadcast global model's (the teacher, constant in the local params),
K classes, eps = 1e-9:

    L = L_ce + mu L_ls + lambda L_vd,                                                   (1)

    L_ce = (1/N) sum_n CE(f(x_n) + log(pi + eps), y_n)                                 (2)

the prior-adjusted cross-entropy (logit adjustment by the client's own prior);

    L_ls = sum_c pi_c [ log sum_n exp(1[y_n != c] (f_c(x_n) - log(pi_c + eps)
                                                   + log(1/K + eps))) - log N ]        (3)

logit suppression: for each class c, a log-mean-exp over the batch of its adjusted logit on the
examples of *other* classes (an example of class c contributes exp(0) = 1), weighted by the
class's share pi_c: it pushes down the logits of non-label classes, most of all the frequent
classes' logits on the rare classes' examples;

    L_vd = (1/N) sum_n sum_{c in V_i} q_c(x_n) (log q_c(x_n) - log p_c(x_n)),            (4)
    q(x) = softmax_{V_i}(g(x)),  p(x) = softmax_{V_i}(f(x)),

vacant-class distillation: the KL divergence from the global model's distribution restricted to
the vacant classes to the local model's (0 when the client has no vacant class).

Source. The paper describes the two terms (vacant-class distillation from the global model,
logit suppression penalising the logits of non-label classes); eqs. (1)-(4), coefficients
included, are those of its code, `krumpguo/FedVLS`,
`system/flcore/clients/clientvls.py`, `clientVLS.train`: `loss = Prior_CELoss + LADE_loss +
VLS_loss * lamda`, with `PriorCELoss` (2), `new_LADEloss` (3) times its hard-coded 0.005 (our mu,
`algorithm.fedvls_ls_weight`, default 0.005), and `VLSloss` (4) as `KLDivLoss(reduction=
'batchmean')` of log_softmax over the vacant columns against the teacher's softmax over them;
lambda = `algorithm.fedvls_lambda`, default 1.0 (`system/main.py`'s `-lam` default; the README's
CIFAR-10 example uses 0.1: the protocol's grid tries both). N counts the batch's valid examples
(the reference's batch size; padding is left out of every sum). The reference trains locally
with SGD momentum 0.9 (its client sets weight decay to 0); ours with the package's plain SGD as
every method
(`fedjax_pals.algorithms.base`). Evaluation uses the plain logits f, as the reference does.

FedVLS is a client-side method: `fedvls_fedpals` trains with it and aggregates with FedPALS'
weights; `fedadam_fedvls` with FedAdam's server step.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import optax

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, FederatedAlgorithm, ServerState, Weighting, _suffix, combine,
    plain_sgd,
)
from fedjax_pals.algorithms.registry import Hyperparameters, Method, hyperparameter, register_method

# log(pi + eps), as the reference's `torch.log(self.prior + 1e-9)`.
FEDVLS_EPS = 1e-9
# lambda of the vacant-class distillation (the reference's `-lam` default).
FEDVLS_DEFAULT_LAMBDA = 1.0
# mu of the logit suppression (the reference's `new_LADEloss`: `return loss * 0.005`).
FEDVLS_DEFAULT_LS_WEIGHT = 0.005
# Stands for -inf where padding and non-vacant columns are left out of a log-sum-exp (finite,
# so that a batch or a client without any keeps its gradients finite).
_NEG = -1e30


def _masked_log_softmax(z: jax.Array, keep: jax.Array) -> jax.Array:
    """log softmax of z (B, K) over the columns `keep` (K,) only; 0 elsewhere (and everywhere
    when no column is kept)."""
    top = jax.lax.stop_gradient(jnp.max(jnp.where(keep, z, _NEG), axis=-1, keepdims=True))
    shifted = jnp.where(keep, z - top, 0.0)
    total = jnp.sum(jnp.where(keep, jnp.exp(shifted), 0.0), axis=-1, keepdims=True)
    total = jnp.where(jnp.any(keep), total, 1.0)
    return jnp.where(keep, shifted - jnp.log(total), 0.0)


def fedvls_loss(
    logits: chex.ArrayLike, global_logits: chex.ArrayLike, labels: chex.ArrayLike,
    mask: chex.ArrayLike, label_dist: chex.ArrayLike, lam: float = FEDVLS_DEFAULT_LAMBDA,
    ls_weight: float = FEDVLS_DEFAULT_LS_WEIGHT,
) -> jax.Array:
    """FedVLS' local loss (module docstring, eq. 1) of a batch: logits f and the global
    model's g (B, K), labels (B,), mask (B,) of the valid examples, label_dist pi = S_i (K,)."""
    f = jnp.asarray(logits)
    g = jax.lax.stop_gradient(jnp.asarray(global_logits, f.dtype))
    labels = jnp.asarray(labels)
    mask = jnp.asarray(mask, bool)
    pi = jnp.asarray(label_dist, f.dtype)
    num_classes = f.shape[-1]
    n = jnp.maximum(jnp.sum(mask), 1).astype(f.dtype)
    log_prior = jnp.log(pi + FEDVLS_EPS)
    # (2) the prior-adjusted cross-entropy.
    ce = optax.softmax_cross_entropy_with_integer_labels(f + log_prior, labels)
    ce = jnp.sum(jnp.where(mask, ce, 0.0)) / n
    # (3) logit suppression: per class, log-mean-exp over the batch of the adjusted logits of
    # the examples of the other classes (0 for its own), weighted by pi_c.
    spread = f - log_prior + jnp.log(jnp.asarray(1.0 / num_classes + FEDVLS_EPS, f.dtype))
    spread = jnp.where(labels[:, None] != jnp.arange(num_classes), spread, 0.0)
    spread = jnp.where(mask[:, None], spread, _NEG)
    suppression = jnp.sum(pi * (jax.nn.logsumexp(spread, axis=0) - jnp.log(n)))
    # (4) the KL divergence, over the vacant classes, from the global model to the local one.
    vacant = pi == 0
    log_q = _masked_log_softmax(g, vacant)
    log_p = _masked_log_softmax(f, vacant)
    kl = jnp.where(vacant, jnp.exp(log_q) * (log_q - log_p), 0.0).sum(axis=-1)
    distill = jnp.sum(jnp.where(mask, kl, 0.0)) / n
    return ce + jnp.asarray(ls_weight, f.dtype) * suppression + jnp.asarray(lam, f.dtype) * distill


def fedvls_client(
    lam: float = FEDVLS_DEFAULT_LAMBDA, ls_weight: float = FEDVLS_DEFAULT_LS_WEIGHT
) -> ClientMethod:
    """FedVLS' local loss (`fedvls_loss`) with the client's S_i from its ClientInfo and the
    broadcast global model as the teacher; lam, ls_weight >= 0."""
    return _fedvls_client(
        _validation.check_nonnegative("lam", lam),
        _validation.check_nonnegative("ls_weight", ls_weight),
    )


@functools.cache
def _fedvls_client(lam: float, ls_weight: float) -> ClientMethod:
    def data_loss(logits, labels, mask, info: ClientInfo, state: ServerState, global_logits):
        return fedvls_loss(logits, global_logits(), labels, mask, info.label_dist, lam, ls_weight)

    return plain_sgd()._replace(
        name=f"fedvls(lambda={lam:g}, ls={ls_weight:g})", data_loss=data_loss
    )


def fedvls(
    lam: float = FEDVLS_DEFAULT_LAMBDA, ls_weight: float = FEDVLS_DEFAULT_LS_WEIGHT,
    weighting: Weighting | None = None,
) -> FederatedAlgorithm:
    """FedVLS (Guo et al., arXiv 2401.02329) with FedAvg weights, or `weighting` (FedVLS+FedPALS)."""
    return combine(fedvls_client(lam, ls_weight), weighting, _suffix("fedvls", weighting))


@dataclasses.dataclass(frozen=True)
class FedVLSHyperparameters(Hyperparameters):
    fedvls_lambda: float = hyperparameter(
        FEDVLS_DEFAULT_LAMBDA, low=0.0, doc="FedVLS' vacant-class distillation weight lambda"
    )
    fedvls_ls_weight: float = hyperparameter(
        FEDVLS_DEFAULT_LS_WEIGHT, low=0.0, doc="FedVLS' logit-suppression weight"
    )


register_method(
    Method("fedvls", "FedVLS",
           lambda hp, context: fedvls(hp.fedvls_lambda, hp.fedvls_ls_weight, context.weighting),
           FedVLSHyperparameters, grid={"fedvls_lambda": (1.0, 0.1)}, client_side=True,
           description="vacant-class distillation + logit suppression (Guo et al., 2024)"),
    replace=True,
)
