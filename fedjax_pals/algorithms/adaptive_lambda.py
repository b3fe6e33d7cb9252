"""FedPALS with lambda adapted during training by a hypergradient on the target validation set.

The paper fixes lambda per run and selects it from an ESS grid on a target-distributed
validation set (App. B.3), and names "dynamically tuning lambda over time" as future work
(Sec. 6). This module does that tuning online, inside the run, from the same validation set.

The method (one-step, or "greedy", hypergradient descent on log lambda):

  Round t aggregates the participants' updates Delta_i with alpha^lambda (eq. 8):

      theta_{t+1}(lambda) = theta_t + sum_i alpha_i^lambda Delta_i.

  The server then measures how the validation loss of that aggregate changes with lambda,
  holding the clients' updates fixed:

      dL_val(theta_{t+1}) / d log lambda
          = lambda * < grad L_val(theta_{t+1}),  sum_i (d alpha_i^lambda / d lambda) Delta_i >,

  with d alpha / d lambda from implicit differentiation of eq. 8 on its active face
  (`fedpals_lam_derivative`) and the inner product as one forward-mode JVP of the validation
  loss (no backward pass), and takes an Adam step (Kingma & Ba, 2015) on log lambda for the
  next round. Log-space because lambda's useful range spans decades (the ESS grid's lambdas
  differ by factors of 10-1000) and must stay > 0; Adam because the hypergradient's scale
  changes by orders of magnitude between tasks and during training, while its sign is what
  carries the information, so the step in log lambda is about `hyper_learning_rate`
  whatever the scale. log lambda is clipped to lambda_for_ess's search range
  [1e-6 N, 1e12 N].

Why this and not the alternatives: it costs one JVP of the validation loss per round (the
grid costs one full training run per lambda); d alpha / d lambda is exact (a linear solve
on the face, O(M^3) for M participants); and it keeps the paper's selection data, the
target validation set, as the only signal. It is greedy: it ignores lambda's effect on
later rounds through theta_{t+1}, the usual bias of one-step hypergradients (Baydin et al.,
"Online Learning Rate Adaptation with Hypergradient Descent", ICLR 2018, make the same
trade for learning rates). The starting lambda is the config's (e.g. ESS 50 % of N).

The validation examples, the clients' label distributions and sizes, the optimiser state
and the trajectory of lambda are per-run data in `ServerState.algorithm_state` (an
`AdaptiveLambdaState`), so runs of different seeds share one compiled round and the run resumes
exactly from a checkpoint.

The feature `adaptive_lambda` (`algorithm.lam_schedule = "hypergradient"`, FedPALS only):
the run's FedPALS becomes `adaptive_fedpals` (its weighting kept: a DP release or another
solver carries over), starting at the config's lambda (lam = 0, and an ESS fraction out of
reach, start at the lower end of lambda_for_ess's range); registered as the variant
`fedpals_adaptive`, which starts at ESS 50 % of N when the config gives neither
`algorithm.lam` nor `algorithm.ess_fraction` (`Variant.defaults`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pals import _validation
from fedjax_pals.algorithms.base import (
    FederatedAlgorithm, ServerState, _global_params, find_state, plain_sgd, replace_state,
    weighted_average_update,
)
from fedjax_pals.algorithms.fedpals import fedpals_state, fedpals_weighting, replace_fedpals_state
from fedjax_pals.algorithms.fedpals_lambda import LAMBDA, LAMBDA_FLOOR
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.registry import Variant, register_variant
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter
from fedjax_pals.server_weights import LOG10_LAM_RANGE, fedpals_lam_derivative

DEFAULT_HYPER_LEARNING_RATE = 0.5
# Where `fedpals_adaptive` starts when the config gives no lambda: ESS 50 % of N, the middle of
# the protocol's ESS grid. From lam = 0 (the lambda -> 0+ end) the hypergradient hardly moves:
# on configs/default.py lambda stayed within 1-1.2x of the floor over 10 rounds.
START_ESS_FRACTION = 0.5
# The hypergradient reads this many validation examples (a fixed subset of a larger set; a
# smaller one is padded with zero-weight slots): one shape for every run, so the runs of a
# sweep, whose target validation sets differ in size, stack on the engine's runs axis.
DEFAULT_HYPER_VAL_SIZE = 2048


class AdaptiveLambdaState(NamedTuple):
    """The adaptive schedule's per-run data (`ServerState.algorithm_state`).

    client_label_dists (M, K) and client_sizes (M,): S and n as the server sees them;
    val_inputs, val_labels, val_weights: the hypergradient's validation examples (weight 0 for
    padding); opt_state: Adam's state on log lambda; log_lam_bounds (2,): the clip on log
    lambda; lam_history, hypergradient_history, val_loss_history (rounds,): per round, the
    lambda used, dL_val / d log lambda and the aggregate's validation loss (NaN until trained).
    """

    client_label_dists: jax.Array
    client_sizes: jax.Array
    val_inputs: jax.Array
    val_labels: jax.Array
    val_weights: jax.Array
    opt_state: optax.OptState
    log_lam_bounds: jax.Array
    lam_history: jax.Array
    hypergradient_history: jax.Array
    val_loss_history: jax.Array
    _built_by = "adaptive_fedpals(...)"


def _mean_cross_entropy(apply_fn, params, inputs, labels, weights=None):
    losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, inputs), labels)
    if weights is None:
        return jnp.mean(losses)
    return jnp.sum(weights * losses) / jnp.sum(weights)


def validation_hypergradient(
    apply_fn: Callable, new_params: Any, deltas: Any, lam_derivative: jax.Array, lam: jax.Array,
    val_inputs: jax.Array, val_labels: jax.Array, val_weights: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(L_val(theta'), dL_val(theta') / d log lambda) for theta' = theta + sum_i alpha_i Delta_i.

    `deltas` are the participants' updates stacked on a leading axis, `lam_derivative` their
    d alpha_i / d lambda; the derivative is lambda times the directional derivative of the
    validation cross-entropy at theta' along sum_i (d alpha_i / d lambda) Delta_i. With
    `val_weights` the loss is the weighted mean (0 for padding slots).
    """
    direction = jax.tree_util.tree_map(
        lambda delta: jnp.tensordot(lam_derivative.astype(delta.dtype), delta, axes=1), deltas
    )
    loss, slope = jax.jvp(
        lambda p: _mean_cross_entropy(apply_fn, p, val_inputs, val_labels, val_weights),
        (new_params,),
        (direction,),
    )
    return loss, lam * slope


def _adaptive_update(apply_fn: Callable, hyper_learning_rate: float):
    # Closes over the model and the step only: the compiled round is keyed by what the closure
    # holds (`structure_key`), so per-run values (N and the bounds on lambda) live in the state.
    def update(state: ServerState, participants, outputs, weights):
        new_state = weighted_average_update()(state, participants, outputs, weights)
        optimizer = optax.adam(hyper_learning_rate)
        data = find_state(state.algorithm_state, AdaptiveLambdaState)
        fedpals = fedpals_state(state.weighting_state)
        lam = fedpals.lam
        derivative = fedpals_lam_derivative(
            data.client_label_dists[participants], fedpals.target_label_dist,
            data.client_sizes[participants], lam, alpha=weights,
        )
        loss, grad = validation_hypergradient(
            apply_fn, new_state.params, outputs.deltas, derivative, lam, data.val_inputs,
            data.val_labels, data.val_weights,
        )
        # A non-finite hypergradient (a diverged round) must not poison lambda.
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
        step, opt_state = optimizer.update(grad, data.opt_state)
        low, high = data.log_lam_bounds[0], data.log_lam_bounds[1]
        log_lam = jnp.clip(jnp.log(lam) + step, low, high)
        new_lam = jnp.exp(log_lam).astype(lam.dtype)
        done = state.round  # the round just trained, 0-based (the engine advances the count)
        algorithm_state = replace_state(
            state.algorithm_state, AdaptiveLambdaState, opt_state=opt_state,
            lam_history=data.lam_history.at[done].set(lam),
            hypergradient_history=data.hypergradient_history.at[done].set(grad),
            val_loss_history=data.val_loss_history.at[done].set(loss),
        )
        return new_state._replace(
            algorithm_state=algorithm_state,
            weighting_state=replace_fedpals_state(new_state.weighting_state, lam=new_lam),
        )

    return update


def _check_val_labels(val_labels: chex.ArrayLike, num_classes: int) -> np.ndarray:
    """Class indices in [0, K): the cross-entropy would read a label >= K as garbage (JAX
    clamps out-of-range gathers) and a fractional one would be truncated silently."""
    array = np.asarray(val_labels)
    if array.ndim != 1:
        raise ValueError(f"val_labels must be a 1-D vector of class indices, got shape {array.shape}.")
    if array.size and not (
        np.issubdtype(array.dtype, np.integer)
        or (np.issubdtype(array.dtype, np.floating) and np.all(array == np.round(array)))
    ):
        raise ValueError(f"val_labels must be integer class indices, got dtype {array.dtype}.")
    if array.size and (array.min() < 0 or array.max() >= num_classes):
        bad = array[(array < 0) | (array >= num_classes)]
        raise ValueError(
            f"val_labels must lie in [0, K) = [0, {num_classes}) (K from client_label_dists), "
            f"got {bad[:5].tolist()}."
        )
    return array.astype(np.int32)


def adaptive_fedpals(
    target_label_dist: chex.ArrayLike, client_label_dists: chex.ArrayLike,
    client_sizes: chex.ArrayLike, initial_lam: float, apply_fn: Callable,
    val_inputs: chex.ArrayLike, val_labels: chex.ArrayLike, *, rounds: int,
    hyper_learning_rate: float = DEFAULT_HYPER_LEARNING_RATE,
    hyper_val_size: int = DEFAULT_HYPER_VAL_SIZE,
) -> FederatedAlgorithm:
    """FedPALS whose lambda follows the validation hypergradient (module docstring).

    Args:
      target_label_dist: T (K,), the server's target label distribution.
      client_label_dists: S (M, K) as the server sees it (the DP release under label DP), for
        d alpha / d lambda; the weights themselves come from the engine's weighting as in
        `fedpals` (wrap it with `with_server_label_dists` for a release).
      client_sizes: n (M,).
      initial_lam: lambda for round 1, > 0 (e.g. `lambda_for_ess(S, T, n, 0.5)`).
      apply_fn: the model's `apply(params, x) -> logits`.
      val_inputs, val_labels: the target validation examples the hypergradient reads.
      rounds: the run's rounds (the length of the recorded trajectory of lambda).
      hyper_learning_rate: Adam's step on log lambda, > 0.
      hyper_val_size: how many validation examples it reads (`DEFAULT_HYPER_VAL_SIZE`).

    The state records lambda's trajectory (`AdaptiveLambdaState`, `lam_report`).
    """
    lam = _validation.check_lam(initial_lam)
    if not lam > 0 or not math.isfinite(lam):
        raise ValueError(
            f"initial_lam must be a finite number > 0 (lambda adapts in log-space), got "
            f"{initial_lam!r}."
        )
    hyper_learning_rate = _validation.check_positive_float(
        "hyper_learning_rate", hyper_learning_rate
    )
    rounds = _validation.check_positive_int("rounds", rounds)
    hyper_val_size = _validation.check_positive_int("hyper_val_size", hyper_val_size)
    dists = _validation.check_label_dists("client_label_dists", client_label_dists)
    sizes = _validation.check_client_sizes(client_sizes, dists.shape[0])
    val_inputs = np.asarray(val_inputs, np.float32)
    val_labels = _check_val_labels(val_labels, dists.shape[1])
    if val_inputs.shape[0] == 0 or val_inputs.shape[0] != val_labels.shape[0]:
        raise ValueError(
            f"val_inputs and val_labels must hold the same number (>= 1) of examples, got "
            f"{val_inputs.shape[0]} and {val_labels.shape[0]}."
        )
    count = min(val_inputs.shape[0], hyper_val_size)
    keep = np.sort(np.random.default_rng(0).permutation(val_inputs.shape[0])[:count])
    padding = hyper_val_size - count
    val_weights = np.concatenate([np.ones(count), np.zeros(padding)]).astype(np.float32)
    val_labels = np.concatenate([val_labels[keep], np.zeros(padding, np.int32)])
    val_inputs = np.concatenate(
        [val_inputs[keep], np.zeros((padding, *val_inputs.shape[1:]), np.float32)]
    )
    weighting = fedpals_weighting(target_label_dist, lam)
    optimizer = optax.adam(hyper_learning_rate)
    log_lam0 = jnp.log(jnp.asarray(lam, jnp.float32))
    data = AdaptiveLambdaState(
        client_label_dists=jnp.asarray(dists, jnp.float32),
        client_sizes=jnp.asarray(sizes, jnp.float32),
        val_inputs=jnp.asarray(val_inputs),
        val_labels=jnp.asarray(val_labels),
        val_weights=jnp.asarray(val_weights),
        opt_state=optimizer.init(log_lam0),
        # lambda_for_ess's search range, [1e-6 N, 1e12 N], in log lambda.
        log_lam_bounds=jnp.log(float(np.sum(sizes)))
        + jnp.asarray(LOG10_LAM_RANGE, jnp.float32) * math.log(10.0),
        lam_history=jnp.full((rounds,), jnp.nan, jnp.float32),
        hypergradient_history=jnp.full((rounds,), jnp.nan, jnp.float32),
        val_loss_history=jnp.full((rounds,), jnp.nan, jnp.float32),
    )

    def init(params, num_clients):
        if num_clients != dists.shape[0]:
            raise ValueError(
                f"adaptive_fedpals was built for {dists.shape[0]} clients, the run has "
                f"{num_clients}."
            )
        return data

    return FederatedAlgorithm(
        name="fedpals(adaptive lam)", client=plain_sgd(), weighting=weighting,
        server_update=_adaptive_update(apply_fn, hyper_learning_rate), init_algorithm_state=init,
        eval_params=_global_params,
    )


def lam_report(state: ServerState) -> dict[str, list[float]]:
    """The trajectory recorded by `adaptive_fedpals`: per trained round, the lambda it used,
    the hypergradient dL_val / d log lambda and the aggregate's validation loss (rounds not
    yet trained are left out)."""
    data = find_state(state.algorithm_state, AdaptiveLambdaState)
    lam = np.asarray(data.lam_history, np.float64)
    done = int(np.sum(np.isfinite(lam)))
    return {
        "lam_per_round": lam[:done].tolist(),
        "hypergradient_per_round": np.asarray(data.hypergradient_history)[:done].tolist(),
        "hyper_val_loss_per_round": np.asarray(data.val_loss_history)[:done].tolist(),
    }


@dataclasses.dataclass(frozen=True)
class AdaptiveLambda(Hyperparameters):
    lam_schedule: str | None = hyperparameter(
        "fixed", kind="choice", choices=("fixed", "hypergradient"), optional=True,
        doc="fixed (the paper) | hypergradient: lambda follows the validation hypergradient",
    )
    lam_hyper_lr: float | None = hyperparameter(
        DEFAULT_HYPER_LEARNING_RATE, low=0.0, low_open=True, optional=True,
        doc="the hypergradient's Adam step on log lambda",
    )


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    # "fixed" is the paper's FedPALS: None keeps the identity of the runs recorded before.
    adaptive = values["lam_schedule"] == "hypergradient"
    name = facts.method.name
    if adaptive and name != "fedpals":
        raise ValueError(
            "config.algorithm.lam_schedule='hypergradient' adapts FedPALS' lambda; it applies to "
            f"algorithm.name='fedpals' only, got {name!r}."
        )
    if adaptive and facts.section["lam"] is None and facts.section["ess_fraction"] is None:
        raise ValueError(
            "config.algorithm.lam_schedule='hypergradient' adapts lambda in log-space from a "
            "starting lambda; set algorithm.ess_fraction (algorithm.name='fedpals_adaptive' "
            "starts at 0.5) or algorithm.lam (0 starts at the lambda -> 0+ end)."
        )
    if adaptive and values["lam_hyper_lr"] is None:
        raise ValueError(f"config.algorithm.lam_hyper_lr is None, but {name} needs it.")
    return {
        "lam_schedule": "hypergradient" if adaptive else None,
        "lam_hyper_lr": values["lam_hyper_lr"] if adaptive else None,
    }


def _prepare(hp: AdaptiveLambda, context: registry.MethodContext) -> registry.MethodContext:
    # A fixed lambda would be out of reach (or 0); the hypergradient only needs a start > 0.
    return context.with_value(LAMBDA_FLOOR, True)


def _wrap(
    algorithm: FederatedAlgorithm, hp: AdaptiveLambda, context: registry.MethodContext
) -> FederatedAlgorithm:
    inputs, labels = context.target_validation
    adaptive = adaptive_fedpals(
        context.partition.target_label_dist, context.weight_label_dists,
        context.partition.client_sizes, context.get(LAMBDA), context.model.apply, inputs, labels,
        rounds=context.rounds, hyper_learning_rate=hp.lam_hyper_lr,
    )
    return adaptive._replace(weighting=algorithm.weighting)


class _LambdaTrajectory(registry.Monitor):
    """Reports lambda per round (`lam_report`) and the lambda in use."""

    def scalars(self, state: Any) -> dict:
        # lam_report copies its three histories to the host, not the whole state.
        lam = np.asarray(lam_report(state)["lam_per_round"], np.float64)
        return {"server/lambda": float(lam[-1])} if lam.size else {}

    def results(self, state: Any) -> dict:
        return lam_report(state)


registry.register_feature(
    registry.Feature(
        "adaptive_lambda", "adaptive λ", AdaptiveLambda, _resolve, prepare=_prepare,
        stage="lambda",
        wrap=_wrap, monitor=lambda hp, task: _LambdaTrajectory(), owns_server_update=True,
        description="lambda follows the target validation loss's hypergradient",
    ),
    replace=True,
)

register_variant(
    Variant("fedpals_adaptive", "FedPALS (adaptive λ)", "fedpals",
            {"algorithm.lam_schedule": "hypergradient"},
            defaults={"algorithm.ess_fraction": START_ESS_FRACTION, "algorithm.lam": None}),
    replace=True
)
