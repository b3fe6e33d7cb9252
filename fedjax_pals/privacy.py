"""Differentially private label marginals: clients report S_i(Y) through a DP mechanism.

FedPALS' server needs every client's label distribution S_i(Y) (eq. 8). Here each client
releases its label histogram c_i in N^K once, before training, through the Laplace or the
Gaussian mechanism, and the server solves eq. 8 on the noisy marginals; local training is
unchanged (a client knows its own counts).

Privacy accounting (stated once, used everywhere below).

* Unit of privacy: one training example of one client. Neighbouring datasets differ by
  *replacing* one example ("replace", bounded DP: n_i is unchanged and public, which is what
  FedAvg's n_i / N and FedPALS' ESS term use) or by *adding or removing* one ("add_remove",
  unbounded DP: n_i itself is then private and must not be released exactly).
* Sensitivity of a count histogram: replacing one example moves one unit of count from one
  class to another, so ||c - c'||_1 = 2 and ||c - c'||_2 = sqrt(2); adding or removing one
  changes one count by 1: L1 = L2 = 1.
* Laplace mechanism (Dwork et al., 2006; Dwork & Roth, 2014, Thm. 3.6): c~ = c + Lap(b)^K,
  b = Delta_1 / epsilon, is epsilon-DP.
* Gaussian mechanism: c~ = c + N(0, sigma^2 I_K) with the analytic sigma of Balle & Wang
  (ICML 2018, Thm. 8): the smallest sigma with
      Phi(Delta_2 / (2 sigma) - epsilon sigma / Delta_2)
        - e^epsilon Phi(-Delta_2 / (2 sigma) - epsilon sigma / Delta_2) <= delta,
  which is (epsilon, delta)-DP for every epsilon > 0 (`gaussian_sigma(..., "analytic")`).
  The classic calibration sigma = Delta_2 sqrt(2 ln(1.25 / delta)) / epsilon (Dwork & Roth,
  2014, Thm. A.1, valid for epsilon < 1) is available as `method="classic"`; it is never
  smaller than the analytic one.
* Post-processing (Dwork & Roth, 2014, Prop. 2.1): mapping c~ onto the simplex, solving
  eq. 8 with it in every round, re-solving for each round's participants and the lambda
  search by ESS are functions of the release only, so they cost no further privacy.
* Composition: each client releases once, and the clients' datasets are disjoint, so by
  parallel composition the whole federation's release of S is epsilon-DP (resp.
  (epsilon, delta)-DP) with respect to any single training example.
* Not covered: the model updates the clients send each round are not privatised here; the
  guarantee is for the label marginals that FedPALS adds to FedAvg's protocol.

The same machinery applies to the target's T(Y) (its histogram through the same
mechanism). The paper's own perturbation of T (App. B.6, Table 2) is
`fjp.algorithms.target_perturbation.perturb_label_dist`, a non-private positive-noise model; it is not duplicated here.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special


MECHANISMS = ("laplace", "gaussian")
NEIGHBOURING = ("replace", "add_remove")
POSTPROCESSING = ("projection", "clip")
GAUSSIAN_METHODS = ("analytic", "classic")
# Relative accuracy of the analytic Gaussian sigma (bisection in log sigma; the returned
# sigma is on the private side of the bracket).
_SIGMA_RTOL = 1e-12


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {choices}.")
    return value


def _real(value: Any, valid: Callable[[float], bool], message: str) -> float:
    """float(value) for a real number (bool refused) that is `valid`; else ValueError(message)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{message}, got {value!r}.")
    if not valid(float(value)):
        raise ValueError(f"{message}, got {float(value)!r}.")
    return float(value)


def _epsilon(epsilon: Any) -> float:
    return _real(epsilon, lambda e: e > 0, "epsilon must be a number > 0 (or inf: no noise)")


def _delta(delta: Any) -> float:
    return _real(delta, lambda d: 0.0 < d < 1.0, "the Gaussian mechanism needs delta in (0, 1)")


def count_sensitivity(neighbouring: str = "replace", norm: int = 1) -> float:
    """Sensitivity of a label-count histogram: L1 2 / L2 sqrt(2) under "replace" (one example
    changes class), L1 = L2 = 1 under "add_remove" (one example more or less)."""
    _choice("neighbouring", neighbouring, NEIGHBOURING)
    if norm not in (1, 2):
        raise ValueError(f"norm must be 1 or 2, got {norm!r}.")
    if neighbouring == "add_remove":
        return 1.0
    return 2.0 if norm == 1 else math.sqrt(2.0)


def _analytic_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """delta(sigma) of the Gaussian mechanism (Balle & Wang, 2018, Thm. 8), in float64."""
    u = sensitivity / sigma
    first = special.ndtr(u / 2.0 - epsilon / u)
    second = math.exp(epsilon + special.log_ndtr(-u / 2.0 - epsilon / u))
    return float(first - second)


def gaussian_sigma(
    epsilon: float, delta: float, l2_sensitivity: float = 1.0, method: str = "analytic"
) -> float:
    """The Gaussian mechanism's noise std for (epsilon, delta)-DP at L2 sensitivity Delta_2.

    analytic (Balle & Wang, ICML 2018, Thm. 8): the smallest sigma with
        Phi(Delta_2/(2 sigma) - eps sigma/Delta_2) - e^eps Phi(-Delta_2/(2 sigma) - eps sigma/Delta_2)
          <= delta,
      found by bisection in log sigma to relative accuracy 1e-12 (the returned sigma satisfies
      the inequality). Valid for every epsilon > 0.
    classic (Dwork & Roth, 2014, Thm. A.1): sigma = Delta_2 sqrt(2 ln(1.25 / delta)) / epsilon,
      valid for epsilon in (0, 1) only (raises otherwise).

    epsilon = inf gives 0 (no noise).
    """
    epsilon, delta = _epsilon(epsilon), _delta(delta)
    _choice("method", method, GAUSSIAN_METHODS)
    sensitivity = float(l2_sensitivity)
    if not math.isfinite(sensitivity) or sensitivity <= 0:
        raise ValueError(f"l2_sensitivity must be a finite number > 0, got {l2_sensitivity!r}.")
    if math.isinf(epsilon):
        return 0.0
    if method == "classic":
        if epsilon >= 1.0:
            raise ValueError(
                f"the classic Gaussian calibration holds for epsilon < 1 only, got {epsilon!r}; "
                "use method='analytic'."
            )
        return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    high = sensitivity
    while _analytic_delta(high, epsilon, sensitivity) > delta:
        high *= 2.0
    low = high
    while _analytic_delta(low, epsilon, sensitivity) <= delta:
        low /= 2.0
    # low violates, high satisfies; delta(sigma) is decreasing in sigma.
    while high / low - 1.0 > _SIGMA_RTOL:
        middle = math.sqrt(low * high)
        if _analytic_delta(middle, epsilon, sensitivity) <= delta:
            high = middle
        else:
            low = middle
    return high


def noise_scale(
    epsilon: float,
    mechanism: str = "laplace",
    *,
    delta: float | None = None,
    neighbouring: str = "replace",
) -> float:
    """The per-count noise scale: Laplace b = Delta_1 / epsilon (std sqrt(2) b), or the
    analytic Gaussian sigma at Delta_2 (see the module docstring); 0 for epsilon = inf."""
    epsilon = _epsilon(epsilon)
    _choice("mechanism", mechanism, MECHANISMS)
    if mechanism == "laplace":
        if delta is not None:
            raise ValueError("the Laplace mechanism is pure epsilon-DP: leave delta as None.")
        return count_sensitivity(neighbouring, 1) / epsilon
    return gaussian_sigma(epsilon, _delta(delta), count_sensitivity(neighbouring, 2))


def _counts(counts: Any) -> np.ndarray:
    array = np.asarray(counts, np.float64)
    if array.ndim not in (1, 2) or array.size == 0:
        raise ValueError(
            f"counts must be a (K,) or (M, K) label histogram, got shape {array.shape}."
        )
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("counts must be finite and >= 0.")
    if np.any(array.sum(axis=-1) <= 0):
        raise ValueError("every histogram needs at least one example (a row sums to 0).")
    return array


def _key(key: Any) -> jax.Array:
    if isinstance(key, numbers.Integral) and not isinstance(key, (bool, np.bool_)):
        return jax.random.PRNGKey(int(key))
    if key is None:
        raise ValueError("a PRNG key (jax.random.PRNGKey(seed) or an int seed) is required.")
    return key


def noisy_label_counts(
    counts: Any,
    epsilon: float,
    mechanism: str = "laplace",
    key: Any = None,
    *,
    delta: float | None = None,
    neighbouring: str = "replace",
) -> np.ndarray:
    """c~ = c + noise, the mechanism's release of the histogram(s) (float64, may be < 0).

    Laplace: noise_k ~ Lap(0, Delta_1 / epsilon) i.i.d.; Gaussian: N(0, sigma^2), sigma the
    analytic calibration (`noise_scale`). Rows of an (M, K) input are independent releases.
    """
    array = _counts(counts)
    scale = noise_scale(epsilon, mechanism, delta=delta, neighbouring=neighbouring)
    if scale == 0.0:
        return array.copy()
    draw = jax.random.laplace if mechanism == "laplace" else jax.random.normal
    noise = np.asarray(draw(_key(key), array.shape, jnp.float32), np.float64)
    return array + scale * noise


def project_to_simplex(values: Any) -> np.ndarray:
    """Euclidean projection of each row onto the probability simplex, in float64.

    argmin_{p >= 0, sum p = 1} ||p - v||_2 = max(v - theta, 0), theta chosen so that the
    result sums to 1 (the sort-based algorithm: Held, Wolfe & Crowder, 1974; Duchi et al.,
    ICML 2008, Fig. 1).

    Raises:
      ValueError: an input that is empty (no rows or no entries per row), not numeric, or
        has NaN or infinite entries (a projection of those is not defined).
    """
    try:
        v = np.asarray(values, np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"project_to_simplex needs a numeric array of values, got {values!r}."
        ) from exc
    if v.ndim == 0 or v.size == 0:
        raise ValueError(
            "project_to_simplex needs a non-empty vector (or rows of one) to project, got "
            f"shape {v.shape}."
        )
    if not np.all(np.isfinite(v)):
        bad = "NaN" if np.isnan(v).any() else "infinite"
        raise ValueError(f"project_to_simplex got {bad} entries; the projection is undefined.")
    flat = v.reshape(-1, v.shape[-1])
    u = -np.sort(-flat, axis=1)
    cumulative = np.cumsum(u, axis=1) - 1.0
    ks = np.arange(1, flat.shape[1] + 1)
    rho = np.sum(u - cumulative / ks > 0, axis=1)
    theta = cumulative[np.arange(flat.shape[0]), rho - 1] / rho
    return np.maximum(flat - theta[:, None], 0.0).reshape(v.shape)


def private_label_dists(
    counts: Any,
    epsilon: float,
    mechanism: str = "laplace",
    key: Any = None,
    *,
    delta: float | None = None,
    neighbouring: str = "replace",
    postprocess: str = "projection",
) -> np.ndarray:
    """Differentially private label distributions from label histograms.

    c~ = `noisy_label_counts(counts, ...)`, then onto the simplex (post-processing):

      projection: S~ = Proj_simplex(c~ / n), the Euclidean projection (`project_to_simplex`)
        of the unbiased noisy frequencies; n = the exact n_i under "replace" (public there),
        the noisy total max(sum_k c~_k, 1) under "add_remove" (n_i is private there).
      clip: S~ = max(c~, 0) / sum_k max(c~_k, 0), uniform if every count clips to 0.

    Args:
      counts: (M, K) client label histograms (or one (K,) histogram, e.g. the target's).
      epsilon: the privacy budget per client, > 0; inf releases the exact S.
      mechanism: "laplace" (epsilon-DP) or "gaussian" ((epsilon, delta)-DP, analytic sigma).
      key: a jax PRNG key (or an int seed) for the noise.
      delta: the Gaussian mechanism's delta in (0, 1); None for Laplace.
      neighbouring: "replace" (default; n_i public) or "add_remove" (see the module docstring).
      postprocess: "projection" (default) or "clip".

    Returns:
      float64 array of counts' shape, every row on the simplex.
    """
    array = _counts(counts)
    _choice("postprocess", postprocess, POSTPROCESSING)
    noisy = noisy_label_counts(
        array, epsilon, mechanism, key, delta=delta, neighbouring=neighbouring
    )
    sizes = array.sum(axis=-1, keepdims=True)
    if math.isinf(_epsilon(epsilon)):
        return array / sizes
    if postprocess == "clip":
        kept = np.maximum(noisy, 0.0)
        total = kept.sum(axis=-1, keepdims=True)
        uniform = np.full_like(kept, 1.0 / kept.shape[-1])
        return np.where(total > 0, kept / np.where(total > 0, total, 1.0), uniform)
    if neighbouring == "add_remove":
        sizes = np.maximum(noisy.sum(axis=-1, keepdims=True), 1.0)
    return project_to_simplex(noisy / sizes)
