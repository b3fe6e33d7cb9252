"""Estimating the target's label distribution T(Y) from unlabeled target data.

FedPALS assumes the server knows T(Y) exactly. Under label shift, S(X|Y) = T(X|Y), a
classifier trained on the clients' data can estimate T from the target's *unlabeled*
inputs. Two classical estimators, both in float64 NumPy (they run on the host, on the
model's outputs):

* Black-box shift estimation, BBSE (Lipton, Wang & Smola, ICML 2018, eq. 3 / Alg. 1): with
  hard predictions yhat = argmax f(x), C[i, j] = P_S(yhat = i, y = j) on labeled source data
  and mu[i] = P_T(yhat = i) on the target, label shift gives C w = mu for the importance
  weights w_y = T(y) / S(y). Solve w = C^+ mu (least squares; C^{-1} mu when C is
  invertible), set T^ = S(y) w_y and map it onto the simplex (Euclidean projection). The
  soft variant uses the predicted probabilities in place of the one-hot predictions
  (C[i, j] = E_S[f_i(x) 1{y = j}], mu = E_T[f(x)]); the same identity holds.
* EM re-weighting of the posteriors (Saerens, Latinne & Decaestecker, Neural Computation
  2002, eqs. 2.9-2.10): from the training prior S(y) of a calibrated classifier p_S(y|x),
      p_T^{(s)}(y|x) = [T^{(s)}(y) / S(y)] p_S(y|x) / sum_j [T^{(s)}(j) / S(j)] p_S(j|x),
      T^{(s+1)}(y)   = mean_x p_T^{(s)}(y|x),
  the EM iteration for the maximum-likelihood T of the unlabeled target sample. Classes
  with S(y) = 0 are not identifiable from the classifier and get T^(y) = 0.

Both are consistent under label shift (BBSE needs C invertible; EM needs calibrated
posteriors). Two refinements of them (REPRODUCTION.md compares all five on Fashion-MNIST):

* constrained soft BBSE: T^ = argmin_{T in simplex} ||C T - mu||^2 + rho ||T||^2 with C the
  soft conditional confusion matrix, solved as eq. 8 of the FedPALS paper by
  `fedpals_weights` (`constrained_bbse_label_dist`): defined for every C, so a model that
  cannot yet separate two classes splits their mass instead of leaving T unidentified;
* MLLS (Alexandari, Kundaje & Shrikumar, ICML 2020): EM on posteriors calibrated by
  bias-corrected temperature scaling (`fedjax_pals.calibration`) on held-out source data, the
  source prior taken as their mean (`mlls_label_dist`).

Both read the source data only through per-class sums (`SourceStatistics`), what a server
gets from secure aggregation. `model_logits` / `model_probabilities` compute a model's
outputs in batches; `estimate_target_label_dist` dispatches on the method.

During training, `TargetReestimation` replaces FedPALS' T by a new estimate every few rounds
(`run_training(..., update_state=TargetReestimation(...).update_state)`). The feature
`unknown_target` that runs it from a config, and its FedAvg shadow, are in
`fedjax_pals.unknown_target` (above the training loop, which the shadow trains with).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from fedjax_pals import _validation
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.base import holds_state
from fedjax_pals.algorithms.fedpals import FedPalsState, fedpals_state, replace_fedpals_state
from fedjax_pals.calibration import (
    calibrated_probabilities, fit_bias_corrected_temperature, softmax,
)
from fedjax_pals.privacy import project_to_simplex
from fedjax_pals.server_weights import fedpals_weights, projection_distance

METHODS = (
    "em", "bbse", "bbse_soft", "bbse_constrained", "mlls", "em_output_prior", "mapls", "vrls",
    "mapls_output_prior", "vrls_output_prior",
)
# MAPLS' and VRLS' estimators, with the source prior S the clients' pooled labels (the papers'
# label marginal) or, "_output_prior", the model's mean (calibrated) output on the source data
# (MAPLS' code's "soft" prior; the prior the posteriors are calibrated to, as in MLLS).
MAPLS_METHODS = ("mapls", "mapls_output_prior")
VRLS_METHODS = ("vrls", "vrls_output_prior")
# How a run's header and the variants' labels name them.
METHOD_LABELS = {
    "bbse": "BBSE", "bbse_soft": "soft BBSE", "em": "EM",
    "bbse_constrained": "constrained soft BBSE", "mlls": "BCTS + MLLS",
    "em_output_prior": "EM (mean-output prior)", "mapls": "MAPLS (MAP-EM, Dirichlet prior)",
    "vrls": "VRLS (entropy-regularised temperature + ratio MLE)",
    "mapls_output_prior": "MAPLS (mean-output prior)",
    "vrls_output_prior": "VRLS (mean-output prior)",
}
# Constrained soft BBSE's ridge rho (||C T - mu||^2 + rho ||T||^2): small against the
# squared singular values of a useful confusion matrix (the gate's >= 0.1 gives >= 1e-2).
DEFAULT_RHO = 1e-4
# VRLS' Shannon-entropy weight zeta: the authors' notebook (zhiyuan-11/VRLS_main,
# Density_Ratio_Estimation.ipynb: entropy_weight=0.1).
VRLS_DEFAULT_ENTROPY_WEIGHT = 0.1
# Below this smallest singular value of the soft confusion matrix (`readiness`) an estimate is
# recorded as not identified and a warning says so (it is still used unless a gate is set).
# Provisional, from a handful of runs (issue 60): the failing seed it reports had 0.0000 at
# round 4 and MAPLS' failing run on seed 12 2.1e-5, where the default's good in-sample estimates
# (L1 0.05 by round 3) had 0.0015-0.009 and held-out ones a median of 0.001 (REPRODUCTION.md).
IDENTIFIED_SIGMA_MIN = 1e-4
EM_DEFAULT_MAX_ITER = 10_000
EM_DEFAULT_TOL = 1e-10


def _method(method: Any) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}.")
    return method


def _probs(name: str, probs: Any) -> np.ndarray:
    array = np.asarray(probs, np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] < 2:
        raise ValueError(f"{name} must be an (n, K) matrix with n >= 1, K >= 2, got {array.shape}.")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must be finite and >= 0.")
    sums = array.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > 1e-4):
        raise ValueError(
            f"every row of {name} must be a probability vector (softmax outputs); row sums "
            f"range over [{sums.min()}, {sums.max()}]."
        )
    return array / sums[:, None]


def _labels(labels: Any, n: int, num_classes: int) -> np.ndarray:
    array = np.asarray(labels)
    if array.shape != (n,) or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"source_labels must be ({n},) integers, got {array.dtype} {array.shape}.")
    if np.any(array < 0) or np.any(array >= num_classes):
        raise ValueError(f"source_labels must lie in [0, {num_classes}).")
    return array


class EstimateNotIdentified(ValueError):
    """The data do not identify the target's label distribution (BBSE's confusion matrix is
    singular): C w = mu has many solutions, and picking one would be a guess."""


def bbse_confusion(
    source_probs: Any, source_labels: Any, soft: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """BBSE's joint confusion matrix C[i, j] = P_S(yhat = i, y = j) (soft: E_S[f_i(x) 1{y=j}])
    and the source label marginal S(j) = sum_i C[i, j], from labeled source data."""
    probs = _probs("source_probs", source_probs)
    n, k = probs.shape
    labels = _labels(source_labels, n, k)
    predicted = probs if soft else np.eye(k)[np.argmax(probs, axis=1)]
    confusion = predicted.T @ np.eye(k)[labels] / n
    return confusion, confusion.sum(axis=0)


def bbse_label_dist(
    source_probs: Any, source_labels: Any, target_probs: Any, *, soft: bool = False
) -> np.ndarray:
    """T^ by black-box shift estimation (Lipton et al., 2018): w = C^+ mu, T^ = Proj(S * w).

    Args:
      source_probs: (n_s, K) the model's probabilities on held-out labeled source data (the
        clients' data, or any data whose p(x|y) is the target's).
      source_labels: (n_s,) their labels.
      target_probs: (n_t, K) the model's probabilities on the unlabeled target data.
      soft: use probabilities instead of hard predictions.

    Returns:
      (K,) float64 on the simplex. Classes absent from the source data get weight 0 in S * w.

    Raises:
      EstimateNotIdentified (a ValueError): the confusion matrix restricted to the classes
        present in the source data is singular (e.g. a model that predicts one class for
        everything): C w = mu has many solutions, and no fallback is guessed.
    """
    confusion, source = bbse_confusion(source_probs, source_labels, soft)
    present = source > 0
    rank = np.linalg.matrix_rank(confusion[:, present])
    if rank < present.sum():
        raise EstimateNotIdentified(
            f"BBSE's confusion matrix is singular: rank {rank} over the {present.sum()} classes "
            "present in the source data, so the model's predictions cannot tell them apart "
            f"(predicted classes on the source data: {np.flatnonzero(confusion.sum(axis=1) > 0).tolist()}) "
            "and the target estimate is not identified. Use em_label_dist, or a model that "
            "separates the classes."
        )
    target = _probs("target_probs", target_probs)
    if target.shape[1] != confusion.shape[0]:
        raise ValueError(
            f"target_probs has {target.shape[1]} classes, source_probs {confusion.shape[0]}."
        )
    predicted = target if soft else np.eye(target.shape[1])[np.argmax(target, axis=1)]
    mu = predicted.mean(axis=0)
    w = np.linalg.lstsq(confusion, mu, rcond=None)[0]
    return project_to_simplex(source * w)


def em_label_dist(
    target_probs: Any, source_label_dist: Any, *, max_iter: int = EM_DEFAULT_MAX_ITER,
    tol: float = EM_DEFAULT_TOL,
) -> np.ndarray:
    """T^ by EM re-weighting of the posteriors (Saerens et al., 2002, eqs. 2.9-2.10).

    Iterates T <- mean_x normalise(T / S * p_S(.|x)) from T = S until max_k |dT_k| < tol.
    The fixed point maximises the target sample's likelihood sum_x log sum_y T(y)/S(y)
    p_S(y|x) over the simplex (restricted to supp S).

    Args:
      target_probs: (n_t, K) the calibrated model's posteriors p_S(y|x) on the target data.
      source_label_dist: (K,) the label prior the posteriors were trained under (for a
        federated model, e.g. the aggregate sum_i alpha_i S_i of its server weights).
      max_iter, tol: the iteration budget and stopping tolerance.

    Returns:
      (K,) float64 on the simplex.
    """
    probs, source = _em_arguments(target_probs, source_label_dist, max_iter, tol)
    return _em_fixed_point(probs, source, 1.0, max_iter, tol)


def _em_arguments(
    target_probs: Any, source_label_dist: Any, max_iter: int, tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """The checked (probs, source) of an EM estimator (`em_label_dist`, `mapls_label_dist`)."""
    probs = _probs("target_probs", target_probs)
    source = _validation.check_distribution("source_label_dist", source_label_dist)
    if source.shape[0] != probs.shape[1]:
        raise ValueError(
            f"source_label_dist has {source.shape[0]} classes, target_probs {probs.shape[1]}."
        )
    _validation.check_positive_int("max_iter", max_iter)
    _validation.check_positive_float("tol", tol)
    return probs, source


def _em_fixed_point(
    probs: np.ndarray, source: np.ndarray, weight: float, max_iter: int, tol: float
) -> np.ndarray:
    """Saerens et al.'s EM from T = S until max_k |dT_k| < tol, its M-step
    T <- weight * mean_x posterior + (1 - weight) * U, U uniform over supp S: weight = 1 is
    the MLE (`em_label_dist`), weight = n / (n + c) MAPLS' MAP update (`mapls_label_dist`)."""
    support = source > 0
    mean = np.where(support, 1.0 / support.sum(), 0.0)
    base = np.where(support[None, :], probs / np.where(support, source, 1.0)[None, :], 0.0)
    estimate = source.copy()
    for _ in range(max_iter):
        joint = base * estimate[None, :]
        norm = joint.sum(axis=1, keepdims=True)
        posterior = joint / np.where(norm > 0, norm, 1.0)
        updated = weight * posterior.mean(axis=0) + (1.0 - weight) * mean
        updated /= updated.sum()
        converged = np.max(np.abs(updated - estimate)) < tol
        estimate = updated
        if converged:
            break
    return estimate


_ROUNDING_DIVERGENCE = 1e-12


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) in nats over the support of p (q > 0 there)."""
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def _confidence(divergence: float, at_half: float) -> float:
    """MAPLS' map from a divergence d >= 0 to [0, 1): gamma d / (1 + gamma d) with gamma chosen
    so that d = 1/2 maps to `at_half`, i.e. at_half d / (at_half d + (1 - at_half) / 2)
    (`lam_forward(d, lam_inv(0.5, at_half))` of the authors' code); 0 at d = 0, and so for a
    d that is rounding error (< 1e-12; at at_half = 1 the map jumps from 0 to 1 at d = 0)."""
    if divergence < _ROUNDING_DIVERGENCE:
        return 0.0
    numerator = at_half * divergence
    denominator = numerator + (1.0 - at_half) / 2.0
    return float(numerator / denominator) if denominator > 0 else 0.0


def mapls_prior_weight(target_probs: Any, source_label_dist: Any, **em_options: Any) -> float:
    """MAPLS' adaptive prior learning (APL): the weight lambda in (0, 1) of the data against the
    Dirichlet prior, from how far the MLE of T (`em_label_dist`) lies from the prior's uniform
    mean U and from the source prior S (Ye et al., WACV 2024; `get_lamda` in
    github.com/ChangkunYe/MAPLS, label_shift/mapls.py):

        c_SU = 1 - conf(KL(S || U), 0.2),   c_TU = conf(KL(T_mle || U), c_SU),
        c_TS = conf(KL(T_mle || S), c_SU),  lambda = 0.9 c_TU + 0.1 (1 - c_TS),

    conf as in `_confidence`. An MLE far from uniform gets a weak prior (lambda near 1); one
    near uniform, a strong one. U, S and T are taken over the classes present in S."""
    probs = _probs("target_probs", target_probs)
    source = _validation.check_distribution("source_label_dist", source_label_dist)
    support = source > 0
    uniform = np.where(support, 1.0 / support.sum(), 0.0)
    mle = em_label_dist(probs, source, **em_options)
    su = _confidence(_kl(source, uniform), 0.2)
    c_su = 1.0 - su
    c_tu = _confidence(_kl(mle, uniform), c_su)
    c_ts = _confidence(_kl(mle, source), c_su)
    return 0.9 * c_tu + 0.1 * (1.0 - c_ts)


def mapls_label_dist(
    target_probs: Any, source_label_dist: Any, *, concentration: float | None = None,
    max_iter: int = EM_DEFAULT_MAX_ITER, tol: float = EM_DEFAULT_TOL,
) -> np.ndarray:
    """T^ by MAPLS: the maximum a posteriori T under a Dirichlet prior, by EM (Ye, Tsuchida,
    Petersson & Barnes, "Label Shift Estimation for Class-Imbalance Problem: A Bayesian
    Approach", WACV 2024; the authors' code github.com/ChangkunYe/MAPLS, label_shift/mapls.py).

    The prior is Dirichlet(alpha) on T over the K' classes present in S, alpha_k = 1 + c / K'
    (mean uniform, as the authors' code sets it; c = sum_k (alpha_k - 1) the concentration in
    pseudo-examples). Saerens et al.'s E-step is kept (`em_label_dist`) and the M-step becomes
    the MAP update

        T_k <- (sum_j p_T(k | x_j) + alpha_k - 1) / (n + sum_k alpha_k - K')
             = lambda mean_j p_T(k | x_j) + (1 - lambda) / K',   lambda = n / (n + c),

    whose fixed point maximises sum_j log sum_k T_k / S_k p_S(k | x_j) + sum_k (alpha_k - 1)
    log T_k on the simplex (concave: the maximiser is unique for c > 0). c = 0 is EM's MLE;
    c -> infinity keeps T at the uniform prior mean.

    Args:
      target_probs: (n, K) the model's posteriors p_S(y|x) on the unlabeled target data.
      source_label_dist: (K,) the prior the posteriors were trained under; classes it lacks
        are not identifiable and get T^ = 0 (the prior lives on its support).
      concentration: c >= 0; None: MAPLS' adaptive prior learning (`mapls_prior_weight`)
        chooses lambda, i.e. c = n (1 - lambda) / lambda.
      max_iter, tol: the iteration budget and the stopping tolerance on max_k |dT_k|.

    Returns:
      (K,) float64 on the simplex.
    """
    probs, source = _em_arguments(target_probs, source_label_dist, max_iter, tol)
    n = probs.shape[0]
    if concentration is None:
        weight = mapls_prior_weight(probs, source, max_iter=max_iter, tol=tol)
    else:
        concentration = _validation.check_nonnegative("concentration", concentration)
        weight = n / (n + concentration)
    return _em_fixed_point(probs, source, weight, max_iter, tol)


def density_ratio_mle(
    target_probs: Any, source_label_dist: Any, *, max_iter: int = EM_DEFAULT_MAX_ITER,
    tol: float = EM_DEFAULT_TOL,
) -> np.ndarray:
    """The maximum-likelihood label density ratio w(y) = T(y) / S(y) from unlabeled target data
    (VRLS' estimator, Wu, Choi, Cao, Cevher & Ramezani-Kebrya, ICLR 2025, arXiv 2502.02544; the
    MLLS of Garg et al., NeurIPS 2020):

        w^ = argmax_{w >= 0, sum_y w_y S(y) = 1} sum_j log sum_y p_S(y | x_j) w_y,

    the target's likelihood p_T(x) = p_S(x) sum_y p_S(y|x) w_y over the ratios whose T = S w
    is a distribution. With T = S w this is EM's likelihood on the simplex, so EM's fixed point
    (`em_label_dist`) solves it: w^ = T^ / S on the support of S, 0 elsewhere (a class the
    source lacks has no ratio).

    Args:
      target_probs: (n, K) calibrated posteriors p_S(y|x) on the unlabeled target data.
      source_label_dist: (K,) S, the prior the posteriors are calibrated to.
      max_iter, tol: EM's budget and stopping tolerance.

    Returns:
      (K,) float64 w^ >= 0 with sum_y w^_y S(y) = 1.
    """
    source = _validation.check_distribution("source_label_dist", source_label_dist)
    estimate = em_label_dist(target_probs, source, max_iter=max_iter, tol=tol)
    return np.where(source > 0, estimate / np.where(source > 0, source, 1.0), 0.0)


def vrls_objective(beta: float, logits: Any, labels: Any, entropy_weight: float) -> float:
    """VRLS' regularised training loss at inverse temperature `beta`: mean_i CE(softmax(beta
    z_i), y_i) - zeta mean_i H(softmax(beta z_i)), H the Shannon entropy (nats). The paper
    trains the predictor with it (zeta > 0 penalises over-confidence); here it is fitted to
    the post-hoc temperature (`fit_vrls_temperature`)."""
    z = np.asarray(logits, np.float64) * beta
    shifted = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    log_probs = shifted - log_norm[:, None]
    probs = np.exp(log_probs)
    cross_entropy = -np.take_along_axis(log_probs, np.asarray(labels)[:, None], axis=1)[:, 0]
    entropy = -np.sum(probs * log_probs, axis=1)
    return float(np.mean(cross_entropy) - entropy_weight * np.mean(entropy))


# The fitted temperature's range: inverse temperatures in [1e-3, 1e3], scanned on a log grid of
# 121 points (0.05 decades), then refined by bounded Brent between the best point's neighbours.
_VRLS_LOG_BETA = (np.log(1e-3), np.log(1e3))
_VRLS_GRID = 121


def fit_vrls_temperature(
    logits: Any, labels: Any, entropy_weight: float = VRLS_DEFAULT_ENTROPY_WEIGHT,
) -> float:
    """VRLS' calibration: the inverse temperature beta in [1e-3, 1e3] minimising
    `vrls_objective` on labeled source data (the authors' notebook fits the network with
    cross-entropy - 0.1 entropy, then a temperature by NLL; a server cannot retrain the clients'
    model, so the regularised loss is fitted to the one parameter it trains, the temperature:
    zeta = 0 is Guo et al.'s temperature scaling, zeta > 0 a softer one). The objective need not
    be convex in beta: a grid over log beta, then bounded Brent around its minimum."""
    from scipy import optimize  # scipy comes with jax

    z = _validation.check_logits("logits", logits)
    n, k = z.shape
    y = _labels(labels, n, k)
    zeta = _validation.check_number("entropy_weight", entropy_weight, low=0.0, high=1.0)

    def loss(log_beta):
        return vrls_objective(float(np.exp(log_beta)), z, y, zeta)

    grid = np.linspace(*_VRLS_LOG_BETA, _VRLS_GRID)
    values = np.array([loss(g) for g in grid])
    best = int(np.argmin(values))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, _VRLS_GRID - 1)]
    result = optimize.minimize_scalar(loss, bounds=(low, high), method="bounded",
                                      options={"xatol": 1e-10})
    log_beta = result.x if result.fun <= values[best] else grid[best]
    return float(np.exp(log_beta))


def vrls_label_dist(
    source_logits: Any, source_labels: Any, target_logits: Any, source_label_dist: Any = None,
    *, entropy_weight: float = VRLS_DEFAULT_ENTROPY_WEIGHT, max_iter: int = EM_DEFAULT_MAX_ITER,
    tol: float = EM_DEFAULT_TOL,
) -> np.ndarray:
    """T^ by VRLS (Wu et al., ICLR 2025): the temperature fitted by `fit_vrls_temperature` on
    the labeled source logits, then the maximum-likelihood ratio w^ (`density_ratio_mle`) on the
    target's calibrated posteriors, T^ = S w^. `source_label_dist` S: the clients' pooled label
    distribution (as `em`; the authors' code divides by the training labels' marginal); None:
    the source labels' empirical distribution."""
    z_source = _validation.check_logits("source_logits", source_logits)
    z_target = _validation.check_logits("target_logits", target_logits)
    if z_target.shape[1] != z_source.shape[1]:
        raise ValueError(
            f"target_logits has {z_target.shape[1]} classes, source_logits {z_source.shape[1]}."
        )
    labels = _labels(source_labels, *z_source.shape)
    if source_label_dist is None:
        source_label_dist = np.bincount(labels, minlength=z_source.shape[1]) / labels.size
    beta = fit_vrls_temperature(z_source, labels, entropy_weight)
    source = _validation.check_distribution("source_label_dist", source_label_dist)
    ratio = density_ratio_mle(softmax(beta * z_target), source, max_iter=max_iter, tol=tol)
    estimate = source * ratio
    return estimate / estimate.sum()


class SourceStatistics(NamedTuple):
    """Per-class sums over labeled source data: all that the server needs from the clients'
    held-out shares (what secure aggregation of the clients' sums would give it).

    posterior_sums[k] = sum over the examples of class k of p(. | x), a (K,) vector;
    counts[k] = their number; correct[k] = how many of them argmax p(. | x) gets right.
    """

    posterior_sums: np.ndarray  # (K, K) float64
    counts: np.ndarray  # (K,) int64
    correct: np.ndarray  # (K,) int64

    @property
    def present(self) -> np.ndarray:
        """(K,) bool: the classes with at least one example."""
        return self.counts > 0

    @property
    def conditional_confusion(self) -> np.ndarray:
        """(K, K) C[i, k] = E[p_i(x) | y = k] (soft, column-stochastic; 0 for absent k)."""
        return (self.posterior_sums / np.maximum(self.counts, 1)[:, None]).T

    @property
    def recall(self) -> np.ndarray:
        """(K,) per-class accuracy of the hard predictions (nan for absent classes)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.present, self.correct / self.counts, np.nan)

    @property
    def mean_posterior(self) -> np.ndarray:
        """(K,) the mean posterior over all examples: MLLS's source prior (for calibrated
        posteriors it estimates the data's label distribution; Alexandari et al., 2020)."""
        return self.posterior_sums.sum(axis=0) / self.counts.sum()


def source_statistics(source_probs: Any, source_labels: Any) -> SourceStatistics:
    """`SourceStatistics` of labeled source data from the model's posteriors on it."""
    probs = _probs("source_probs", source_probs)
    n, k = probs.shape
    labels = _labels(source_labels, n, k)
    one_hot = np.eye(k)[labels]
    correct = np.bincount(labels[np.argmax(probs, axis=1) == labels], minlength=k)
    return SourceStatistics(
        posterior_sums=one_hot.T @ probs,
        counts=one_hot.sum(axis=0).astype(np.int64),
        correct=correct.astype(np.int64),
    )


class Readiness(NamedTuple):
    """How well a model tells the source's classes apart (the gate before an estimate).

    sigma_min: the smallest singular value of the soft conditional confusion matrix
      restricted to the classes present (0 when a class's posteriors are a mix of the
      others': its share of the target cannot be told from theirs);
    min_recall: the smallest per-class accuracy over the classes present.
    """

    sigma_min: float
    min_recall: float

    def passes(self, sigma_min: float | None, min_recall: float | None) -> bool:
        return (sigma_min is None or self.sigma_min >= sigma_min) and (
            min_recall is None or self.min_recall >= min_recall
        )


def readiness(stats: SourceStatistics) -> Readiness:
    """The gate's quantities of `stats` (see `Readiness`)."""
    confusion = stats.conditional_confusion[:, stats.present]
    return Readiness(
        sigma_min=float(np.linalg.svd(confusion, compute_uv=False).min()),
        min_recall=float(np.nanmin(stats.recall)),
    )


def constrained_bbse_label_dist(
    stats: SourceStatistics, target_probs: Any, *, rho: float = DEFAULT_RHO
) -> np.ndarray:
    """T^ by constrained soft BBSE: argmin_{T in simplex} ||C T - mu||^2 + rho ||T||^2.

    C[:, k] = E_S[p(. | x) | y = k] (the soft conditional confusion matrix, each column a
    distribution over the K outputs) and mu = E_T[p(. | x)]; under label shift C T = mu. This
    is eq. 8 of the FedPALS paper with the classes as "clients" (S_k = C[:, k], n_k = 1,
    lambda = rho) and mu as the "target", so `fedpals_weights` solves it exactly. It has a
    solution for every C (unique for rho > 0): a model that cannot separate two classes
    splits their mass instead of failing, unlike BBSE's C^{-1} mu (`bbse_label_dist`).
    Classes absent from the source data get T^ = 0 (not identifiable). Regularised BBSE
    (RLLS; Azizzadenesheli et al., ICLR 2019) shrinks in the same way.
    """
    target = _probs("target_probs", target_probs)
    k = stats.counts.shape[0]
    if target.shape[1] != k:
        raise ValueError(f"target_probs has {target.shape[1]} classes, the source data {k}.")
    _validation.check_nonnegative("rho", rho)
    present = stats.present
    columns = stats.conditional_confusion[:, present].T  # (K_present, K): the "clients"
    weights = fedpals_weights(columns, target.mean(axis=0), np.ones(present.sum()), rho)
    estimate = np.zeros(k)
    estimate[present] = np.asarray(weights, np.float64)
    return estimate / estimate.sum()


def mlls_label_dist(
    source_probs: Any, source_labels: Any, target_probs: Any, **em_options: Any
) -> np.ndarray:
    """T^ by maximum-likelihood label shift (EM, `em_label_dist`) on calibrated posteriors,
    with the source prior taken as the mean calibrated posterior on the held-out source data
    (Alexandari, Kundaje & Shrikumar, ICML 2020): the prior the posteriors are calibrated to,
    whatever prior the model was trained under. Calibrate first
    (`fedjax_pals.calibration.fit_bias_corrected_temperature` on held-out logits)."""
    stats = source_statistics(source_probs, source_labels)
    prior = np.where(stats.present, stats.mean_posterior, 0.0)
    return em_label_dist(target_probs, prior / prior.sum(), **em_options)


def output_prior(source_probs: Any, source_labels: Any) -> np.ndarray:
    """The model's mean output on labeled source data, over the classes the labels hold (0
    elsewhere), normalised: the source prior its posteriors are calibrated to (MLLS' prior,
    `mlls_label_dist`; MAPLS' code's "soft" prior)."""
    stats = source_statistics(source_probs, source_labels)
    prior = np.where(stats.present, stats.mean_posterior, 0.0)
    return prior / prior.sum()


def estimate_target_label_dist(
    target_probs: Any, *, method: str = "em", source_probs: Any = None,
    source_labels: Any = None, source_label_dist: Any = None,
    max_iter: int = EM_DEFAULT_MAX_ITER, tol: float = EM_DEFAULT_TOL, rho: float = DEFAULT_RHO,
    concentration: float | None = None,
) -> np.ndarray:
    """T^(Y) from a model's outputs on unlabeled target data.

    method "em" (Saerens et al., 2002; `em_label_dist`), "mapls" (Ye et al., 2024;
    `mapls_label_dist`, with `concentration`) and "vrls" (Wu et al., 2025: the ratio MLE,
    `density_ratio_mle`, on posteriors the caller calibrated by `fit_vrls_temperature`; the
    whole of it from logits is `vrls_label_dist`) need `source_label_dist`, or
    `source_labels` to take it as their empirical distribution; "bbse" / "bbse_soft"
    (Lipton et al., 2018; `bbse_label_dist`), "bbse_constrained"
    (`constrained_bbse_label_dist`, with `rho`), "mlls" (`mlls_label_dist`: pass
    calibrated posteriors) and "em_output_prior" (EM on the uncalibrated posteriors with the
    source prior taken as their mean on the source data, `mlls_label_dist` without the
    calibration) need `source_probs` and `source_labels`; so do "mapls_output_prior" and
    "vrls_output_prior", "mapls" and "vrls" with the source prior taken as the mean of
    `source_probs` over the classes the source labels hold (`output_prior`).
    """
    if _method(method) in ("mapls_output_prior", "vrls_output_prior"):
        if source_probs is None or source_labels is None:
            raise ValueError(f"method={method!r} needs source_probs and source_labels.")
        method = method.removesuffix("_output_prior")
        source_label_dist = output_prior(source_probs, source_labels)
    if method in ("em", "mapls", "vrls"):  # the caller calibrates for "vrls"
        if source_label_dist is None:
            if source_labels is None:
                raise ValueError(f"method={method!r} needs source_label_dist (or source_labels).")
            k = np.asarray(target_probs).shape[-1]
            labels = np.asarray(source_labels)
            source_label_dist = np.bincount(labels, minlength=k) / labels.size
        if method == "mapls":
            return mapls_label_dist(target_probs, source_label_dist, concentration=concentration,
                                    max_iter=max_iter, tol=tol)
        return em_label_dist(target_probs, source_label_dist, max_iter=max_iter, tol=tol)
    if source_probs is None or source_labels is None:
        raise ValueError(f"method={method!r} needs source_probs and source_labels.")
    if method in ("mlls", "em_output_prior"):  # the caller calibrates for "mlls"
        return mlls_label_dist(source_probs, source_labels, target_probs, max_iter=max_iter,
                               tol=tol)
    if method == "bbse_constrained":
        return constrained_bbse_label_dist(
            source_statistics(source_probs, source_labels), target_probs, rho=rho
        )
    return bbse_label_dist(source_probs, source_labels, target_probs, soft=method == "bbse_soft")


@functools.cache
def _logits_fn(apply_fn):
    return jax.jit(apply_fn)


def model_logits(
    apply_fn: Callable[[Any, jax.Array], jax.Array], params: Any, inputs: Any,
    batch_size: int = 1024,
) -> np.ndarray:
    """apply_fn(params, x) over `inputs` in batches, as float64 (n, K)."""
    _validation.check_positive_int("batch_size", batch_size)
    inputs = np.asarray(inputs)
    step = _logits_fn(apply_fn)
    outputs = [
        np.asarray(step(params, jnp.asarray(inputs[start : start + batch_size])), np.float64)
        for start in range(0, inputs.shape[0], batch_size)
    ]
    return np.concatenate(outputs, axis=0)


def model_probabilities(
    apply_fn: Callable[[Any, jax.Array], jax.Array], params: Any, inputs: Any,
    batch_size: int = 1024,
) -> np.ndarray:
    """softmax(apply_fn(params, x)) over `inputs` in batches, as float64 (n, K)."""
    return softmax(model_logits(apply_fn, params, inputs, batch_size))


# -- re-estimating T during training ------------------------------------------------------------


def _is_target_state(node: Any) -> bool:
    """A state NamedTuple that declares (class attribute `_estimated_target = True`) that its
    field target_label_dist is the T its method reads (IW-ERM's `IwermState`)."""
    return getattr(type(node), "_estimated_target", False) is True


def _target_states(tree: Any) -> list:
    return [node for node in jax.tree_util.tree_leaves(tree, is_leaf=_is_target_state)
            if _is_target_state(node)]


def target_label_dist_in_use(state: Any) -> jax.Array:
    """The T that `state`'s run reads now (the start, or the latest estimate): the one in the
    weighting's `FedPalsState` (FedPALS' weights, and the clients of a client-side method
    with them) when it holds one, else the one of the method's own state that declares it
    (`_estimated_target = True` on its class: IW-ERM's `IwermState` under FedAvg's weights).

    ValueError when the state holds neither, or several declared ones."""
    if holds_state(state.weighting_state, FedPalsState):
        return fedpals_state(state.weighting_state).target_label_dist
    found = _target_states(state.algorithm_state)
    if len(found) != 1:
        raise ValueError(
            f"the algorithm's state holds no FedPalsState (FedPALS' weights) and "
            f"{len(found) or 'no'} method state declaring its T (`_estimated_target = True` on "
            "its class: IW-ERM's IwermState) where one T to re-estimate is expected."
        )
    return found[0].target_label_dist


def with_target_label_dist(state: Any, target_label_dist: Any) -> Any:
    """`state` with the T its run reads (`target_label_dist_in_use`) replaced by
    `target_label_dist`.

    T is per-run data in the state: FedPALS' in the weighting's `FedPalsState`
    (`fedpals_state`), a method's own in its declared state (IW-ERM's `IwermState`: the T of
    its loss ratios T(y) / S_i(y)), so a new estimate changes the next rounds' weights or
    losses without recompiling the round. Every T the state holds is replaced (a run with
    FedPALS' weights keeps one, there).
    """
    dist = _validation.check_distribution("target_label_dist", target_label_dist)
    old = target_label_dist_in_use(state)
    if old.shape != dist.shape:
        raise ValueError(f"target_label_dist must have shape {old.shape}, got {dist.shape}.")
    new = jnp.asarray(dist, old.dtype)
    if holds_state(state.weighting_state, FedPalsState):
        state = state._replace(
            weighting_state=replace_fedpals_state(state.weighting_state, target_label_dist=new))
    if _target_states(state.algorithm_state):
        state = state._replace(algorithm_state=jax.tree_util.tree_map(
            lambda node: (node._replace(target_label_dist=new.astype(node.target_label_dist.dtype))
                          if _is_target_state(node) else node),
            state.algorithm_state, is_leaf=_is_target_state))
    return state


class TargetReestimation(registry.Monitor):
    """A `TrainingRun` state update: T re-estimated from the global model every `every` rounds,
    into the state's T in use (`with_target_label_dist`: FedPALS' weights', or the method's own,
    IW-ERM's loss ratios under FedAvg's weights).

    Before rounds every, 2 every, ... the global model (`algorithm.eval_params`) gives its
    logits on the target's *unlabeled* validation inputs and on labeled source data: the
    clients' held-out share (`partition.held_out_indices`, see `hold_out_stratified`) when
    the partition has one, else up to `source_size` examples drawn once (from `seed`) from
    the clients' training data (in-sample: the model has fit them). Then `method`
    (`estimate_target_label_dist`; default "bbse_constrained", ridge `rho`) estimates T^ from
    their softmax: "mlls" calibrated by bias-corrected temperature scaling fitted on the source
    data, "em" uncalibrated with the clients' pooled label distribution as the source prior
    (the calibration's likelihood and gradient are per-class sums too), "mapls" as "em" with
    MAPLS' Dirichlet prior of `concentration` (None: its adaptive prior learning), "vrls"
    calibrated by a temperature fitted with VRLS' entropy regulariser (`entropy_weight`) on the
    source data, then the ratio's MLE with the clients' pooled label distribution as S.

    The estimate is used when the model is ready (`readiness`: the soft confusion matrix's
    smallest singular value >= `gate_sigma_min` and every present class's recall >=
    `gate_min_recall`; None skips a check) and when it is identified (BBSE's confusion
    matrix is not singular; `EstimateNotIdentified`). It is first shrunk towards the clients'
    aggregate A = sum_i n_i S_i / N, T^ <- (1 - shrinkage) T^ + shrinkage A (at lambda = 0
    the weights then stay near a (1 - shrinkage, shrinkage) mix of the estimate's and FedAvg's:
    no client is starved by an estimate that cannot tell its classes from others'), and then
    moves T by `damping`: T <- (1 - damping) T + damping T^, an exponential average of the
    estimates that starts from the server's T (A); damping = 1 takes T^ as it is. With
    `warmup` = W > 0 the first re-estimation is before round W instead of round `every` (the
    model of rounds 0 .. W - 1 is FedAvg's, which no estimate has steered), then every `every`
    rounds. With `shadow` (an object whose `params(round_index)` is a model's parameters, e.g.
    `fedjax_pals.unknown_target.FedAvgShadow`) the estimator reads that model of the same
    round instead of the run's own; with `ensemble` as well, it reads the average of the two
    models' output probabilities (an ensemble whose confusion matrix BBSE estimates on the
    source data as it does a single model's). Otherwise the state keeps its T (the start, or
    the last estimate), the round goes to `skipped` and a warning to the log, and the next
    re-estimation tries again. Everything depends only on the state, so a run resumed from a
    checkpoint makes the same estimates.

    `records` lists one dict per re-estimation of this process (round, estimator, the gate's
    quantities, whether it was used, T^ and the T put in use, their L1 errors to `truth` when
    given, the calibration's inverse temperature, `identified`: the soft confusion matrix's
    smallest singular value >= `IDENTIFIED_SIGMA_MIN`, below which a warning says the estimate
    is not identified). At each evaluation `scalars` reports the T in use, its L1 error and
    `estimated_accuracy` (the stopping criterion of a target without labels); `results` adds
    the records, the per-evaluation history, whether the last estimate used was identified and
    the rounds whose estimates were not.
    """

    def __init__(
        self, algorithm: Any, model: Any, dataset: Any, partition: Any, *, every: int,
        method: str = "bbse_constrained", seed: int = 0, source_size: int = 5000,
        truth: Any = None, rho: float = DEFAULT_RHO, gate_sigma_min: float | None = None,
        gate_min_recall: float | None = None, damping: float = 1.0, warmup: int = 0,
        shrinkage: float = 0.0, shadow: Any = None, ensemble: bool = False,
        concentration: float | None = None,
        entropy_weight: float = VRLS_DEFAULT_ENTROPY_WEIGHT,
    ):
        self.method = _method(method)
        self.entropy_weight = _validation.check_number("entropy_weight", entropy_weight,
                                                       low=0.0, high=1.0)
        self.concentration = (
            None if concentration is None
            else _validation.check_nonnegative("concentration", concentration)
        )
        self.truth = None if truth is None else np.asarray(truth, np.float64)
        self.every = _validation.check_positive_int("every", every)
        source_size = _validation.check_positive_int("source_size", source_size)
        self.rho = _validation.check_nonnegative("rho", rho)
        self.gate = (gate_sigma_min, gate_min_recall)
        self.damping = _validation.check_number("damping", damping, low=0.0, high=1.0,
                                                low_open=True)
        self.warmup = _validation.check_integer("warmup", warmup, low=0)
        self.shrinkage = _validation.check_number("shrinkage", shrinkage, low=0.0, high=1.0,
                                                  high_open=True)
        self.algorithm, self.model, self.shadow = algorithm, model, shadow
        if ensemble and shadow is None:
            raise ValueError("ensemble=True averages the run's model with a shadow's: give one.")
        self.ensemble = bool(ensemble)
        self.held_out = bool(partition.held_out_indices.size)
        if self.held_out:
            source_idx = np.asarray(partition.held_out_indices)
        else:  # in-sample
            rng = np.random.default_rng([seed, _SOURCE_SAMPLE_STREAM])
            pooled = partition.client_indices[partition.client_mask]  # client by client
            source_idx = np.sort(
                rng.choice(pooled, size=min(source_size, pooled.size), replace=False)
            )
        self.source_x = dataset.train.x[source_idx]
        self.source_y = np.asarray(dataset.train.y[source_idx])
        self.target_x = dataset.train.x[partition.target_val_indices]
        # The clients' pooled labels, sum_i n_i S_i / N: EM's source prior, what the weights
        # start from (their FedPALS weights are FedAvg's) and what `shrinkage` pulls towards.
        self.source_prior = partition.client_label_counts.sum(axis=0) / partition.client_sizes.sum()
        self.source_label_dists = partition.client_label_dists
        self.records: list[dict] = []
        self.evaluations: list[dict] = []

    @property
    def estimates(self) -> list[tuple[int, np.ndarray]]:
        """(round, T^) of the estimates this process put to use (before damping)."""
        return [(r["round"], np.asarray(r["estimate"])) for r in self.records if r["used"]]

    @property
    def skipped(self) -> list[tuple[int, str]]:
        """(round, reason) of the re-estimations this process did not put to use."""
        return [(r["round"], r["reason"]) for r in self.records if not r["used"]]

    def _l1(self, dist: np.ndarray) -> float | None:
        return None if self.truth is None else float(np.abs(dist - self.truth).sum())

    def _probabilities(self, params: Any) -> tuple[np.ndarray, np.ndarray, float | None]:
        """One model's output probabilities on the source and target inputs (calibrated for
        "mlls" and "vrls"), and the calibration's inverse temperature (None without)."""
        source = model_logits(self.model.apply, params, self.source_x)
        target = model_logits(self.model.apply, params, self.target_x)
        if self.method == "mlls":
            calibration = fit_bias_corrected_temperature(source, self.source_y)
            return (calibrated_probabilities(calibration, source),
                    calibrated_probabilities(calibration, target), calibration.beta)
        if self.method in VRLS_METHODS:
            beta = fit_vrls_temperature(source, self.source_y, self.entropy_weight)
            return softmax(beta * source), softmax(beta * target), beta
        return softmax(source), softmax(target), None

    def estimate(self, state: Any) -> tuple[np.ndarray, SourceStatistics, float | None]:
        """T^ from the global model of `state` (or the FedAvg shadow's of that round, or the
        two models' averaged probabilities), the source data's statistics (of the posteriors
        the estimator read), and the calibration's inverse temperature (None without, and for
        an ensemble)."""
        models = []
        if self.shadow is not None:
            models.append(self.shadow.params(int(state.round)))
        if self.shadow is None or self.ensemble:
            models.append(self.algorithm.eval_params(state))
        outputs = [self._probabilities(params) for params in models]
        source_probs = np.mean([o[0] for o in outputs], axis=0)
        target_probs = np.mean([o[1] for o in outputs], axis=0)
        beta = outputs[0][2] if len(outputs) == 1 else None
        stats = source_statistics(source_probs, self.source_y)
        estimate = estimate_target_label_dist(
            target_probs, method=self.method, source_probs=source_probs,
            source_labels=self.source_y, source_label_dist=self.source_prior, rho=self.rho,
            concentration=self.concentration,
        )
        return estimate, stats, beta

    @staticmethod
    def current(state: Any) -> np.ndarray:
        """The T that `state`'s run reads now (the latest estimate, or the start): FedPALS'
        weights' or the method's own (`target_label_dist_in_use`)."""
        return np.asarray(target_label_dist_in_use(state))

    def _skip(self, record: dict, reason: str) -> None:
        record.update(used=False, reason=reason)
        self.records.append(record)
        logging.warning("T not re-estimated before round %d, kept: %s", record["round"], reason)

    @property
    def _once(self) -> bool:
        """A shadow trained first to its end (`FedAvgShadow(final=True)`): one estimate."""
        return bool(getattr(self.shadow, "final", False))

    @property
    def first_round(self) -> int:
        """The round before which T is first re-estimated: `warmup` when set, else `every`
        (0 from a shadow trained first: its model is ready before round 1)."""
        return self.warmup or (0 if self._once else self.every)

    def reestimates_before(self, round_index: int) -> bool:
        """Whether T is re-estimated before round `round_index` (0-based); from a shadow
        trained first, once (its model does not change)."""
        start = self.first_round
        if self._once:
            return round_index == start
        return round_index >= start and (round_index - start) % self.every == 0

    def update_state(self, round_index: int, state_of: Callable[[], Any]) -> Any:
        if not self.reestimates_before(round_index):
            return None
        state = state_of()
        record: dict = {"round": round_index, "estimator": self.method}
        try:
            estimate, stats, beta = self.estimate(state)
        except EstimateNotIdentified as error:
            self._skip(record, str(error))
            return None
        ready = readiness(stats)
        record.update(
            sigma_min=ready.sigma_min, min_recall=ready.min_recall,
            recall=[None if np.isnan(r) else float(r) for r in stats.recall],
            calibration_beta=beta, estimate=estimate.tolist(), estimate_l1_error=self._l1(estimate),
            identified=ready.sigma_min >= IDENTIFIED_SIGMA_MIN,
        )
        if not record["identified"]:
            logging.warning(
                "T^ before round %d is not identified: the soft confusion matrix's smallest "
                "singular value is %.2g (< %g), so the model's outputs cannot tell some classes' "
                "shares of the target apart", round_index, ready.sigma_min, IDENTIFIED_SIGMA_MIN)
        if not ready.passes(*self.gate):
            self._skip(
                record,
                f"the model is not ready: sigma_min {ready.sigma_min:.3g}, min recall "
                f"{ready.min_recall:.3g} (gate: {self.gate[0]}, {self.gate[1]})",
            )
            return None
        current = np.asarray(self.current(state), np.float64)
        shrunk = (1.0 - self.shrinkage) * estimate + self.shrinkage * self.source_prior
        used = (1.0 - self.damping) * current + self.damping * shrunk
        used /= used.sum()
        record.update(
            used=True, target=used.tolist(), target_l1_error=self._l1(used),
            target_change_l1=float(np.abs(used - current).sum()),
        )
        self.records.append(record)
        return with_target_label_dist(state, used)

    def resume(self, previous: Mapping[str, Any], start_round: int) -> None:
        """The re-estimations before round `start_round` and the evaluations up to it, as the
        earlier launches recorded them (a re-estimation of round `start_round` itself, if one
        was made before the kill, is made again)."""
        self.records = [
            r for r in previous.get("target_estimation_records") or () if r["round"] < start_round
        ] + self.records
        self.evaluations = [
            e for e in previous.get("target_estimation_history") or () if e["round"] <= start_round
        ] + self.evaluations

    def header(self) -> str:
        source = (
            f"{self.source_y.size} held-out client examples" if self.held_out
            else f"{self.source_y.size} of the clients' training examples (in-sample)"
        )
        every = "every round" if self.every == 1 else f"every {self.every} rounds"
        shrinkage = (
            f", each estimate shrunk {self.shrinkage:g} of the way to the clients' aggregate"
            if self.shrinkage else ""
        )
        model = (
            "a FedAvg model's, trained first for the run's rounds (one more run's client work)"
            if self._once else
            "the global model's and a FedAvg shadow model's averaged (one more run's client "
            "work)" if self.ensemble else
            "a FedAvg shadow model's (one more run's client work)" if self.shadow is not None
            else "the global model's"
        )
        when = (
            f"estimated once by {METHOD_LABELS.get(self.method, self.method)} before round "
            f"{self.first_round + 1}" if self._once else
            f"re-estimated by {METHOD_LABELS.get(self.method, self.method)} before {every} from "
            f"round {self.first_round + 1}"
        )
        return (
            f"T unknown: {when}, from {model} outputs on the "
            f"target's {len(self.target_x)} unlabeled validation inputs and on {source}"
            f"{shrinkage}; until then T is the clients' aggregate label distribution (under "
            "which FedPALS' weights are FedAvg's weights)"
        )

    def progress(self, state: Any) -> dict:
        if not self.records:
            return {"T^": "not estimated yet"}
        last = self.records[-1]
        if not last["used"]:
            return {"T^": f"kept at round {last['round']}"}
        text = f"moved {last['target_change_l1']:.3f}"
        if last.get("target_l1_error") is not None:
            text += f", L1 err {last['target_l1_error']:.3f}"
        if last.get("identified") is False:
            text += ", not identified"
        return {"T^": text}

    def estimated_accuracy(self, state: Any, estimate: np.ndarray) -> float:
        """sum_k T(k) recall_k on the source data: its accuracy importance-weighted by T / S,
        an estimate of the target accuracy that needs no target label."""
        params = self.algorithm.eval_params(state)
        probs = softmax(model_logits(self.model.apply, params, self.source_x))
        recall = np.nan_to_num(source_statistics(probs, self.source_y).recall)
        return float(estimate @ recall)

    def scalars(self, state: Any) -> dict:
        """The estimate in use, its L1 error and d(T^, S), the label-free accuracy estimate."""
        estimate = np.asarray(self.current(state), np.float64)  # T only, not the whole state
        error = self._l1(estimate)
        accuracy = self.estimated_accuracy(state, estimate)
        self.evaluations.append(
            {"round": int(state.round), "target_l1_error": error, "estimated_accuracy": accuracy}
        )
        distance = float(projection_distance(self.source_label_dists, estimate))
        scalars = {"server/projection_distance": distance, "target/estimated_accuracy": accuracy}
        if error is not None:
            scalars["server/target_estimate_l1_error"] = error
        if self.records and "sigma_min" in self.records[-1]:
            scalars["server/target_estimation/sigma_min"] = self.records[-1]["sigma_min"]
            scalars["server/target_estimation/min_recall"] = self.records[-1]["min_recall"]
        if estimate.size <= _PER_CLASS_SCALARS:
            width = len(str(estimate.size - 1))
            scalars.update(
                {f"server/target_estimate/class_{k:0{width}d}": v for k, v in enumerate(estimate)}
            )
        return scalars

    def results(self, state: Any) -> dict:
        """The last T in use and its L1 error; this process's re-estimations and evaluations."""
        estimate = np.asarray(self.current(state), np.float64)
        used = [r for r in self.records if r["used"]]
        return {
            "target_estimate": estimate.tolist(),
            "target_estimate_l1_error": self._l1(estimate),
            # Whether the last estimate put to use was identified (None: none used yet).
            "target_estimate_identified": used[-1].get("identified") if used else None,
            "target_estimation_unidentified_rounds": [
                r["round"] for r in self.records if r.get("identified") is False],
            "target_estimation_skipped_rounds": [r for r, _ in self.skipped],
            "target_estimation_records": self.records,
            "target_estimation_history": self.evaluations,
        }


_SOURCE_SAMPLE_STREAM = 0x5EED
# Per-class scalars of T^ for at most this many classes.
_PER_CLASS_SCALARS = 20
