"""Bias-corrected temperature scaling (BCTS): calibrated posteriors from a model's logits.

Label-shift estimators that read a model's posteriors (EM / maximum-likelihood label shift)
need them calibrated on the source distribution; a network trained by SGD is not (Guo et
al., ICML 2017), and a federated model, trained on a weighted mix of the clients'
distributions, is calibrated to none of them. BCTS (Alexandari, Kundaje & Shrikumar, ICML
2020, Sec. 3) refits the logits z on held-out labeled data:

    p(y | x) = softmax(beta z(x) + b)_y,    beta >= 0, b in R^K,

by minimising the negative log-likelihood (1/n) sum_x -log p(y_x | x), which is convex in
(beta, b) (a log-sum-exp of affine functions minus an affine function). The bias b absorbs the
difference between the label prior the model was trained under and the held-out data's, so the
calibrated posteriors are those of the held-out distribution: what MLLS takes as its source.

The fit runs jitted in float32 with optax's L-BFGS (zoom line search) until the gradient's
norm falls below `tol` or `max_steps`; if the unconstrained minimiser has beta < 0 (a model
worse than chance), beta is set to 0 and b refitted (the constrained minimiser then lies on
beta = 0, by convexity). The NLL and its gradient are sums over examples, so in a federation
each L-BFGS step is one round of per-client sums: no client shows its examples.

Classes without a held-out example have no calibrated posterior: their logits are set to
-inf (probability 0), as their bias would run to -inf.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pals import _validation

DEFAULT_MAX_STEPS = 200
DEFAULT_TOL = 1e-6


class Calibration(NamedTuple):
    """softmax(beta * z + bias) over the `present` classes (probability 0 elsewhere)."""

    beta: float  # the inverse temperature, >= 0
    bias: np.ndarray  # (K,) float64; 0 for absent classes
    present: np.ndarray  # (K,) bool: the classes the fit saw
    nll: float  # the held-out NLL at the fit
    nll_uncalibrated: float  # and at beta = 1, b = 0 (the model's own softmax)


def _nll(params, logits, labels, present):
    beta, bias = params
    masked = jnp.where(present[None, :], beta * logits + bias[None, :], -jnp.inf)
    log_probs = jax.nn.log_softmax(masked, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


@functools.partial(jax.jit, static_argnames=("max_steps", "fit_beta"))
def _fit(logits, labels, present, beta0, *, max_steps: int, tol: float, fit_beta: bool):
    def loss(params):
        beta, bias = params
        return _nll((beta if fit_beta else jax.lax.stop_gradient(beta), bias), logits, labels,
                    present)

    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    params = (jnp.asarray(beta0, logits.dtype), jnp.zeros(logits.shape[1], logits.dtype))

    def step(carry):
        params, state, _, count = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        params = optax.apply_updates(params, updates)
        return params, state, optax.tree.norm(grad), count + 1

    def running(carry):
        _, _, grad_norm, count = carry
        return (count < max_steps) & (grad_norm > tol)

    carry = (params, solver.init(params), jnp.asarray(jnp.inf, logits.dtype), 0)
    params, _, _, _ = jax.lax.while_loop(running, step, carry)
    return params, loss(params)


def fit_bias_corrected_temperature(
    logits: Any, labels: Any, *, max_steps: int = DEFAULT_MAX_STEPS, tol: float = DEFAULT_TOL
) -> Calibration:
    """BCTS fitted on held-out labeled data: argmin_{beta >= 0, b} NLL(softmax(beta z + b)).

    Args:
      logits: (n, K) the model's logits on held-out labeled source data.
      labels: (n,) their integer labels in [0, K).
      max_steps, tol: L-BFGS's step budget and its stopping gradient norm.

    Returns:
      The fitted `Calibration`; apply it with `calibrated_probabilities`.
    """
    z = _validation.check_logits("logits", logits)
    n, k = z.shape
    y = np.asarray(labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be ({n},) integers, got {y.dtype} {y.shape}.")
    if np.any(y < 0) or np.any(y >= k):
        raise ValueError(f"labels must lie in [0, {k}).")
    _validation.check_positive_int("max_steps", max_steps)
    _validation.check_positive_float("tol", tol)
    present = np.bincount(y, minlength=k) > 0
    args = (jnp.asarray(z, jnp.float32), jnp.asarray(y, jnp.int32), jnp.asarray(present))
    (beta, bias), nll = _fit(*args, 1.0, max_steps=max_steps, tol=tol, fit_beta=True)
    if float(beta) < 0:  # the constrained minimiser lies on beta = 0: refit b there
        (beta, bias), nll = _fit(*args, 0.0, max_steps=max_steps, tol=tol, fit_beta=False)
    uncalibrated = _nll((jnp.float32(1.0), jnp.zeros(k, jnp.float32)), *args)
    bias = np.where(present, np.asarray(bias, np.float64), 0.0)
    return Calibration(max(float(beta), 0.0), bias, present, float(nll), float(uncalibrated))


def calibrated_probabilities(calibration: Calibration, logits: Any) -> np.ndarray:
    """softmax(beta z + b) over the calibration's classes, as float64 (n, K)."""
    z = _validation.check_logits("logits", logits)
    if z.shape[1] != calibration.bias.shape[0]:
        raise ValueError(
            f"logits have {z.shape[1]} classes, the calibration {calibration.bias.shape[0]}."
        )
    scaled = np.where(calibration.present[None, :], calibration.beta * z + calibration.bias, -np.inf)
    return softmax(scaled)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (a logit of -inf gets probability 0)."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
