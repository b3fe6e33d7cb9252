"""Noise in the server's estimate of the target label distribution (the paper's App. B.6, Table 2).

    T_p = (T + delta * max(eps, 0)) / sum_k (T + delta * max(eps, 0))_k,   eps ~ N(0, I_K)

Only the server's copy of T is perturbed (what FedPALS' weights and the ESS search see); the
target's validation and test sets still follow the true T, so the experiment measures what an
error in the shared label marginal costs. Positive noise only: T_p gains mass on classes where
eps_k > 0, including classes absent from T.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from fedjax_pals import _validation

# A stream of its own, so that the perturbation never shares random numbers with the partition,
# the initialisation or the training of the same seed.
_PERTURBATION_STREAM = 0x7E57


def perturb_label_dist(
    target_label_dist: Any, delta: float, seed: int | np.random.Generator
) -> np.ndarray:
    """T_p = normalise(T + delta * max(eps, 0)), eps ~ N(0, I_K) (App. B.6 of the paper).

    Args:
      target_label_dist: T, shape (K,), a probability vector.
      delta: the noise scale, finite and >= 0 (the paper: 1e-3, 1e-2, 0.5); 0 returns T.
      seed: an integer seed (its own random stream) or a NumPy Generator.

    Returns:
      T_p, float64 of shape (K,), summing to 1.
    """
    target = _validation.check_distribution("target_label_dist", target_label_dist)
    if isinstance(delta, (bool, np.bool_)) or not isinstance(delta, numbers.Real):
        raise TypeError(f"delta must be a real number >= 0, got {delta!r}.")
    if not np.isfinite(delta) or delta < 0:
        raise ValueError(f"delta must be a finite number >= 0, got {delta!r}.")
    if isinstance(seed, np.random.Generator):
        rng = seed
    elif isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)):
        if seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed}.")
        rng = np.random.default_rng([int(seed), _PERTURBATION_STREAM])
    else:
        raise TypeError(f"seed must be an integer >= 0 or a numpy Generator, got {seed!r}.")
    eps = rng.standard_normal(target.shape[0])
    perturbed = target + float(delta) * np.maximum(eps, 0.0)
    return perturbed / perturbed.sum()
