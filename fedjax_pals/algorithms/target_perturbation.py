"""Noise in the server's copy of the target label distribution (the paper's App. B.6, Table 2).

    T_p = (T + delta * max(eps, 0)) / sum_k (T + delta * max(eps, 0))_k,   eps ~ N(0, I_K)

Only the server's copy of T is perturbed (what FedPALS' weights and the ESS search see); the
target's validation and test sets still follow the true T, so the experiment measures what an
error in the shared label marginal costs. Positive noise only: T_p gains mass on classes where
eps_k > 0, including classes absent from T.

The feature `perturbed_target` (`algorithm.target_perturbation` = delta, for every run whose
server weights read T) hands the method T_p for T; the seed's own random stream draws eps.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from fedjax_pals import _validation
from fedjax_pals.algorithms import registry
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter

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


@dataclasses.dataclass(frozen=True)
class TargetPerturbation(Hyperparameters):
    target_perturbation: float | None = hyperparameter(
        0.0, low=0.0, optional=True, doc="Table 2: the server sees T_p = perturb(T, delta)",
        per_run=True, identity_when_unset=True,
    )


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    delta = values["target_perturbation"]
    if facts.reads_target and delta is None:
        raise ValueError(
            f"config.algorithm.target_perturbation is None, but {facts.method.name} needs it."
        )
    return {"target_perturbation": delta if facts.reads_target else None}


def _prepare(hp: TargetPerturbation, context: registry.MethodContext) -> registry.MethodContext:
    if not hp.target_perturbation:  # 0: T itself
        return context
    # The server knows only T_p; the target's own sets still follow T.
    target = perturb_label_dist(
        context.partition.target_label_dist, hp.target_perturbation, context.seed
    )
    return context.replace(
        partition=dataclasses.replace(context.partition, target_label_dist=target)
    )


registry.register_feature(
    registry.Feature(
        "perturbed_target", "perturbed T", TargetPerturbation, _resolve, prepare=_prepare,
        stage="target",
        description="the server sees a noisy T (App. B.6, Table 2)",
    ),
    replace=True,
)
