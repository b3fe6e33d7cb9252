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
posteriors). `model_probabilities` computes a model's softmax outputs in batches;
`estimate_target_label_dist` dispatches on the method.

During training, `TargetReestimation` replaces FedPALS' T by a new estimate every few rounds
(`run_training(..., update_state=TargetReestimation(...).update_state)`). The feature
`unknown_target` (`algorithm.target_estimation` set, for every run with FedPALS' weights)
starts the server from the clients' aggregate sum_i n_i S_i / N, the guess without target
labels, and re-estimates T as the run trains; registered as the variants
`fedpals_unknown_t_bbse`, `fedpals_unknown_t_bbse_soft` and `fedpals_unknown_t_em`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from fedjax_pals import _validation
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.fedpals import fedpals_state, replace_fedpals_state
from fedjax_pals.algorithms.registry import Variant, register_variant
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter
from fedjax_pals.privacy import project_to_simplex
from fedjax_pals.server_weights import projection_distance

METHODS = ("em", "bbse", "bbse_soft")
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
      EstimateNotIdentified (a ValueError): when the confusion matrix restricted to the
        classes present in the source data is singular (rank below their number; e.g. a
        model that predicts one class for everything). Then C w = mu has many solutions and
        BBSE's estimate is not identified; no fallback is guessed: use `em_label_dist`
        (which needs only the source label marginal) or a model whose predictions separate
        the classes.
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
    target_probs: Any,
    source_label_dist: Any,
    *,
    max_iter: int = EM_DEFAULT_MAX_ITER,
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
    probs = _probs("target_probs", target_probs)
    source = _validation.check_distribution("source_label_dist", source_label_dist)
    if source.shape[0] != probs.shape[1]:
        raise ValueError(
            f"source_label_dist has {source.shape[0]} classes, target_probs {probs.shape[1]}."
        )
    _validation.check_positive_int("max_iter", max_iter)
    _validation.check_positive_float("tol", tol)
    support = source > 0
    base = np.where(support[None, :], probs / np.where(support, source, 1.0)[None, :], 0.0)
    estimate = source.copy()
    for _ in range(max_iter):
        joint = base * estimate[None, :]
        norm = joint.sum(axis=1, keepdims=True)
        posterior = joint / np.where(norm > 0, norm, 1.0)
        updated = posterior.mean(axis=0)
        updated /= updated.sum()
        converged = np.max(np.abs(updated - estimate)) < tol
        estimate = updated
        if converged:
            break
    return estimate


def estimate_target_label_dist(
    target_probs: Any,
    *,
    method: str = "em",
    source_probs: Any = None,
    source_labels: Any = None,
    source_label_dist: Any = None,
    max_iter: int = EM_DEFAULT_MAX_ITER,
    tol: float = EM_DEFAULT_TOL,
) -> np.ndarray:
    """T^(Y) from a model's outputs on unlabeled target data.

    method "em" (Saerens et al., 2002; `em_label_dist`) needs `source_label_dist`, or
    `source_labels` to take it as their empirical distribution; "bbse" / "bbse_soft"
    (Lipton et al., 2018; `bbse_label_dist`) need `source_probs` and `source_labels`.
    """
    if _method(method) == "em":
        if source_label_dist is None:
            if source_labels is None:
                raise ValueError("method='em' needs source_label_dist (or source_labels).")
            k = np.asarray(target_probs).shape[-1]
            labels = np.asarray(source_labels)
            source_label_dist = np.bincount(labels, minlength=k) / labels.size
        return em_label_dist(target_probs, source_label_dist, max_iter=max_iter, tol=tol)
    if source_probs is None or source_labels is None:
        raise ValueError(f"method={method!r} needs source_probs and source_labels.")
    return bbse_label_dist(source_probs, source_labels, target_probs, soft=method == "bbse_soft")


@functools.cache
def _softmax_fn(apply_fn):
    return jax.jit(lambda params, x: jax.nn.softmax(apply_fn(params, x), axis=-1))


def model_probabilities(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    inputs: Any,
    batch_size: int = 1024,
) -> np.ndarray:
    """softmax(apply_fn(params, x)) over `inputs` in batches, as float64 (n, K)."""
    _validation.check_positive_int("batch_size", batch_size)
    inputs = np.asarray(inputs)
    step = _softmax_fn(apply_fn)
    outputs = [
        np.asarray(step(params, jnp.asarray(inputs[start : start + batch_size])), np.float64)
        for start in range(0, inputs.shape[0], batch_size)
    ]
    probs = np.concatenate(outputs, axis=0)
    return probs / probs.sum(axis=1, keepdims=True)


# -- re-estimating T during training ------------------------------------------------------------


def with_target_label_dist(state: Any, target_label_dist: Any) -> Any:
    """`state` with FedPALS' T replaced by `target_label_dist`.

    T is per-run data in the weighting's `FedPalsState` (`fedpals_state`), so a new estimate
    changes the next rounds' weights without recompiling the round.
    """
    dist = _validation.check_distribution("target_label_dist", target_label_dist)
    old = fedpals_state(state.weighting_state).target_label_dist
    if old.shape != dist.shape:
        raise ValueError(f"target_label_dist must have shape {old.shape}, got {dist.shape}.")
    new = jnp.asarray(dist, old.dtype)
    return state._replace(
        weighting_state=replace_fedpals_state(state.weighting_state, target_label_dist=new)
    )


class TargetReestimation(registry.Monitor):
    """A `TrainingRun` state update: T re-estimated from the global model every `every` rounds.

    Before rounds every, 2 every, ... the global model (`algorithm.eval_params`) gives
    probabilities on the target's *unlabeled* validation inputs and on up to `source_size`
    labeled examples drawn once (from `seed`) from the clients' pooled data;
    `estimate_target_label_dist` (`method`: "bbse" by default, which needs no calibration;
    "bbse_soft"; "em" uses the pooled clients' label distribution as the source prior) turns
    them into T^, which replaces T in the state (`with_target_label_dist`), so the next
    rounds' FedPALS weights use it without recompiling. The estimate depends only on the
    state, so a run resumed from a checkpoint makes the same estimates. `estimates` lists
    (round index, T^) of the estimates this object made. With `truth` (the true T, for the
    record only) it reports the estimate's L1 error (`scalars`, `results`).

    A round whose model does not identify T (BBSE with a singular confusion matrix: early in
    training the model may not yet predict some class at all) changes nothing: the state
    keeps the T it has (the previous estimate, or the start), the round and the reason go to
    `skipped` and a warning to the log, and the next re-estimation tries again.
    """

    def __init__(
        self,
        algorithm: Any,
        model: Any,
        dataset: Any,
        partition: Any,
        *,
        every: int,
        method: str = "bbse",
        seed: int = 0,
        source_size: int = 5000,
        truth: Any = None,
    ):
        _method(method)
        self.truth = None if truth is None else np.asarray(truth, np.float64)
        self.every = _validation.check_positive_int("every", every)
        source_size = _validation.check_positive_int("source_size", source_size)
        self.algorithm, self.model, self.method = algorithm, model, method
        num_clients = partition.num_clients
        rng = np.random.default_rng([seed, _SOURCE_SAMPLE_STREAM])
        pooled = np.concatenate([partition.client_example_indices(i) for i in range(num_clients)])
        source_idx = np.sort(rng.choice(pooled, size=min(source_size, pooled.size), replace=False))
        self.source_x = dataset.train.x[source_idx]
        self.source_y = np.asarray(dataset.train.y[source_idx])
        self.target_x = dataset.train.x[partition.target_val_indices]
        self.source_prior = partition.client_label_counts.sum(axis=0) / partition.client_sizes.sum()
        self.source_label_dists = partition.client_label_dists
        self.estimates: list[tuple[int, np.ndarray]] = []
        self.skipped: list[tuple[int, str]] = []

    def estimate(self, state: Any) -> np.ndarray:
        """T^ from the global model of `state`."""
        params = self.algorithm.eval_params(state)
        return estimate_target_label_dist(
            model_probabilities(self.model.apply, params, self.target_x),
            method=self.method,
            source_probs=model_probabilities(self.model.apply, params, self.source_x),
            source_labels=self.source_y,
            source_label_dist=self.source_prior,
        )

    @staticmethod
    def current(state: Any) -> np.ndarray:
        """The T that `state`'s FedPALS weights use now (the latest estimate, or the start)."""
        return np.asarray(fedpals_state(state.weighting_state).target_label_dist)

    def update_state(self, round_index: int, state_of: Callable[[], Any]) -> Any:
        if round_index == 0 or round_index % self.every:
            return None
        try:
            estimate = self.estimate(state_of())
        except EstimateNotIdentified as error:
            self.skipped.append((round_index, str(error)))
            logging.warning("T not re-estimated before round %d, kept: %s", round_index, error)
            return None
        self.estimates.append((round_index, estimate))
        return with_target_label_dist(state_of(), estimate)


    def _estimate_and_error(self, state: Any) -> tuple[np.ndarray, float]:
        estimate = np.asarray(self.current(state), np.float64)  # T only, not the whole state
        return estimate, float(np.abs(estimate - self.truth).sum())

    def scalars(self, state: Any) -> dict:
        """The estimate in use, its L1 error and d(T^, S), at an evaluation."""
        estimate, error = self._estimate_and_error(state)
        scalars = {
            "server/target_estimate_l1_error": error,
            "server/projection_distance": float(
                projection_distance(self.source_label_dists, estimate)
            ),
        }
        if estimate.size <= _PER_CLASS_SCALARS:
            width = len(str(estimate.size - 1))
            scalars.update(
                {f"server/target_estimate/class_{k:0{width}d}": v for k, v in enumerate(estimate)}
            )
        return scalars

    def results(self, state: Any) -> dict:
        """The server's last estimate of T, its L1 error, the rounds that kept T (this process)."""
        estimate, error = self._estimate_and_error(state)
        return {
            "target_estimate": estimate.tolist(),
            "target_estimate_l1_error": error,
            "target_estimation_skipped_rounds": [r for r, _ in self.skipped],
        }


_SOURCE_SAMPLE_STREAM = 0x5EED
# Per-class scalars of T^ for at most this many classes.
_PER_CLASS_SCALARS = 20


@dataclasses.dataclass(frozen=True)
class UnknownTarget(Hyperparameters):
    target_estimation: str | None = hyperparameter(
        None, kind="choice", choices=METHODS, optional=True,
        doc="None (T known) | bbse | bbse_soft | em: T re-estimated as the run trains",
    )
    target_estimation_every: int | None = hyperparameter(
        5, kind="integer", low=1, high=1_000_000, optional=True,
        doc="re-estimate before every this many rounds",
    )


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    estimator, every = values["target_estimation"], values["target_estimation_every"]
    estimates = facts.weights == "fedpals" and estimator is not None
    if estimates and facts.section["ess_fraction"] is not None:
        raise ValueError(
            "config.algorithm.target_estimation is set, but ess_fraction needs a known T to "
            "find its lambda; give algorithm.lam instead (default 0: the projection of T^)."
        )
    if estimates and every is None:
        raise ValueError(
            f"config.algorithm.target_estimation_every is None, but {facts.method.name} needs it."
        )
    return {
        "target_estimation": estimator if estimates else None,
        "target_estimation_every": every if estimates else None,
    }


def _prepare(hp: UnknownTarget, context: registry.MethodContext) -> registry.MethodContext:
    # T unknown: the server starts from the clients' aggregate, the guess without target
    # labels, and the run re-estimates T as it trains (`TargetReestimation`).
    partition = context.partition
    sizes = np.asarray(partition.client_sizes, np.float64)
    start = sizes @ np.asarray(partition.client_label_dists, np.float64) / sizes.sum()
    return context.replace(partition=dataclasses.replace(partition, target_label_dist=start))


def _monitor(hp: UnknownTarget, task: Any) -> TargetReestimation:
    return TargetReestimation(
        task.algorithm,
        task.model,
        task.dataset,
        task.partition,
        every=hp.target_estimation_every,
        method=hp.target_estimation,
        seed=task.config.seed,
        truth=task.partition.target_label_dist,
    )


registry.register_feature(
    registry.Feature(
        "unknown_target", "T re-estimated", UnknownTarget, _resolve, prepare=_prepare,
        monitor=_monitor, description="T(Y) unknown: re-estimated from the global model",
    ),
    replace=True,
)

for _method_name, _label in (("bbse", "BBSE"), ("bbse_soft", "soft BBSE"), ("em", "EM")):
    register_variant(
        Variant(f"fedpals_unknown_t_{_method_name}", f"FedPALS (T^ by {_label})", "fedpals",
                {"algorithm.target_estimation": _method_name}), replace=True
    )
