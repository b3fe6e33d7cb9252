"""The feature `unknown_target`: FedPALS with T(Y) estimated as the run trains.

`algorithm.target_estimation` set (for every run with FedPALS' weights, the variants
`fedpals_unknown_t_<estimator>`, and for a method that keeps its own T in its state and
declares it, `declared_target_state`: IW-ERM's loss ratios) starts the server from the
clients' aggregate sum_i n_i S_i / N, the guess without target labels, and re-estimates T from
a model's outputs on the target's unlabeled validation inputs
(`algorithms.target_estimation.TargetReestimation`, the estimators beside it); the other keys
(`UnknownTarget`) set the source data, the gate, the damping, the warm-up, the shrinkage and
the model estimated from: the run's own, or a FedAvg shadow trained beside it
(`FedAvgShadow`). This module sits above `fedjax_pals.training`, which
the shadow trains with, so that nothing under `fedjax_pals.algorithms` imports the training
loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from fedjax_pals import _validation
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.fedavg import fedavg
from fedjax_pals.algorithms.poisson_sampling import with_poisson_sampling
from fedjax_pals.algorithms.registry import Variant, register_variant
from fedjax_pals.algorithms.target_estimation import (
    DEFAULT_RHO, MAPLS_METHODS, METHOD_LABELS, METHODS, VRLS_DEFAULT_ENTROPY_WEIGHT,
    VRLS_METHODS, TargetReestimation,
)
from fedjax_pals.data.partitions import hold_out_stratified
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter
from fedjax_pals.training import run_training


class FedAvgShadow:
    """FedAvg trained beside a run on the same clients, seed and local training: a model that no
    estimate of T steers, for the estimator to read (`TargetReestimation(shadow=...)`).

    FedPALS' weights follow the estimate, so the run's own model learns worst the classes the
    estimate underrates, and its next estimate underrates them more. FedAvg's weights do not
    depend on T. The shadow is one more run's client work: it is trained once, at the first
    `params` call, for the rounds the run re-estimates before (deterministic from the seed, so a
    resumed run gets the same shadow), and its global model before every round is kept.

    With `final=True` it is FedAvg trained first, for all the run's rounds: `params` gives its
    final model whatever the round, so T can be estimated once, before round 1, from a model as
    trained as the run will be (two stages: FedAvg, then FedPALS with that estimate).

    With `sampling_rate` q the shadow samples as a Poisson-sampled run does (the same clients
    each round, from the same seed, on `clients_per_round` lanes) with FedAvg's
    fixed-denominator weights (`fjp.algorithms.with_poisson_sampling`).
    """

    def __init__(self, model: Any, dataset: Any, partition: Any, training: Any, *, rounds: int,
                 seed: int, clients_per_round: int | None = None, final: bool = False,
                 sampling_rate: float | None = None, sampler: Any = None):
        self.model, self.dataset, self.partition, self.training = model, dataset, partition, training
        self.rounds = _validation.check_positive_int("rounds", rounds)
        self.seed, self.clients_per_round = seed, clients_per_round
        self.final = bool(final)
        self.sampling_rate = sampling_rate
        # The run's client sampler (`fedjax_pals.sampling`): the shadow draws and weighs as
        # the run does; None: from clients_per_round and sampling_rate.
        self.sampler = sampler
        self._params: dict[int, Any] | None = None

    def params(self, round_index: int) -> Any:
        """The shadow's global model before round `round_index` (0-based, < rounds); with
        `final`, its model after the last round."""
        if not 0 <= round_index < self.rounds:
            raise ValueError(f"round_index must be in [0, {self.rounds}), got {round_index}.")
        if self._params is None:
            self._params = self._train()
        return self._params[self.rounds if self.final else round_index]

    def _train(self) -> dict[int, Any]:
        algorithm, params = fedavg(), {}
        p = self.partition
        if self.sampler is not None:
            algorithm = self.sampler.with_weights(algorithm, p.client_label_dists, p.client_sizes)
        elif self.sampling_rate is not None:
            algorithm = with_poisson_sampling(
                algorithm, self.sampling_rate, p.client_label_dists, p.client_sizes)

        def keep(round_index: int, state_of: Callable[[], Any]) -> None:
            params[round_index] = algorithm.eval_params(state_of())

        # Trained first: all the run's rounds, only the last model read. Beside the run: the
        # rounds it re-estimates before, each round's model kept.
        last = self.rounds if self.final else max(self.rounds - 1, 1)
        state, _ = run_training(
            algorithm, self.model, self.dataset, self.partition, self.training, rounds=last,
            seed=self.seed, eval_every=last, clients_per_round=self.clients_per_round,
            sampling_rate=self.sampling_rate, update_state=None if self.final else keep,
            sampler=self.sampler,
        )
        params[last] = algorithm.eval_params(state)
        return params


# The defaults are the best row of the ablation on Table 1's C = 3 row, seeds 0-7
# (REPRODUCTION.md, docs/decisions/0032-unknown-t-defaults-in-sample-undamped.md): constrained
# soft BBSE on 5,000 of the clients' training examples, undamped, 92.6 +- 4.5 (known T: 93.5);
# a 10 % held-out share gave 90.5 +- 6.7 there, and 84.8 against 83.3 in-sample on C = 2
# (known T: 84.6).
DEFAULT_HOLD_OUT = 0.0
ESTIMATION_MODELS = ("fedavg_shadow", "fedavg_pretrained", "fedavg_shadow_ensemble")
DEFAULT_DAMPING = 1.0


@dataclasses.dataclass(frozen=True)
class UnknownTarget(Hyperparameters):
    # Per-run keys are read on the host between rounds; T itself is per-run data in FedPALS'
    # state. The hold-out share changes the clients' data, so it is not.
    target_estimation: str | None = hyperparameter(
        None, kind="choice", choices=METHODS, optional=True,
        doc="None (T known) | bbse_constrained (recommended) | mlls | bbse | bbse_soft | em | "
        "em_output_prior | mapls | vrls | mapls_output_prior | vrls_output_prior: T "
        "re-estimated as the run trains",
        per_run=True,
    )
    target_estimation_every: int | None = hyperparameter(
        1, kind="integer", low=1, high=1_000_000, optional=True,
        doc="re-estimate before every this many rounds",
        per_run=True,
    )
    target_holdout: float | None = hyperparameter(
        DEFAULT_HOLD_OUT, kind="real", low=0.0, high=0.5, optional=True,
        doc="share of each client's examples (per class) kept out of training to calibrate "
        "and estimate with; 0 (the default): in-sample, 5,000 of the training examples",
    )
    target_estimation_rho: float | None = hyperparameter(
        DEFAULT_RHO, low=0.0, high=1e6, optional=True, doc="constrained soft BBSE's ridge rho",
        per_run=True,
    )
    target_gate_sigma_min: float | None = hyperparameter(
        None, kind="real", low=0.0, high=1.0, optional=True,
        doc="use an estimate only when the soft confusion matrix's smallest singular value "
        "is at least this (None: not checked)",
        per_run=True,
    )
    target_gate_min_recall: float | None = hyperparameter(
        None, kind="real", low=0.0, high=1.0, optional=True,
        doc="use an estimate only when every present class's recall is at least this",
        per_run=True,
    )
    target_damping: float | None = hyperparameter(
        DEFAULT_DAMPING, kind="real", low=0.0, high=1.0, low_open=True, optional=True,
        doc="T <- (1 - d) T + d T^ (1: the estimate as it is)",
        per_run=True,
    )
    # None, not 0, when off: a run without them keeps the digest it had before they existed.
    target_warmup_rounds: int | None = hyperparameter(
        None, kind="integer", low=1, high=1_000_000, optional=True,
        doc="rounds trained with FedAvg's weights before the first re-estimation (None: the "
        "first is before round target_estimation_every + 1)",
        per_run=True,
    )
    target_estimation_model: str | None = hyperparameter(
        None, kind="choice", choices=ESTIMATION_MODELS, optional=True,
        doc="the model whose outputs estimate T: None (the run's global model) | "
        "fedavg_shadow (FedAvg trained beside the run: one more run's client work) | "
        "fedavg_shadow_ensemble (the run's model's and the shadow's output probabilities "
        "averaged) | "
        "fedavg_pretrained (FedAvg trained first for the run's rounds; T estimated once, before "
        "round 1, from its final model: one more run's client work)",
        per_run=True,
    )
    # MAPLS' key; None (its adaptive prior learning) keeps every earlier run's digest.
    target_estimation_concentration: float | None = hyperparameter(
        None, kind="real", low=0.0, high=1e9, optional=True,
        doc="mapls(_output_prior): the Dirichlet prior's concentration c = sum_k (alpha_k - 1) "
        "around the uniform mean, in pseudo-examples against the target's n (0: EM's MLE); "
        "None: MAPLS' adaptive prior learning chooses it from the data",
        per_run=True,
    )
    # VRLS' key; None off VRLS (no earlier run's digest changes), its default under it.
    target_estimation_entropy_weight: float | None = hyperparameter(
        None, kind="real", low=0.0, high=1.0, optional=True,
        doc="vrls(_output_prior): the Shannon-entropy weight zeta of the temperature's fit, "
        "mean CE - zeta mean H on the source data (0: plain temperature scaling); None: "
        f"{VRLS_DEFAULT_ENTROPY_WEIGHT:g} (the authors' notebook)",
        per_run=True,
    )
    target_shrinkage: float | None = hyperparameter(
        None, kind="real", low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
        doc="T^ <- (1 - s) T^ + s A before use, A the clients' aggregate (FedAvg's point); "
        "None: no shrinkage",
        per_run=True,
    )


def declared_target_state(method: registry.Method) -> type | None:
    """The state type in which `method` keeps the T its own pieces read (IW-ERM's `IwermState`:
    its loss ratios T(y) / S_i(y)), which T re-estimation replaces; None for a method that reads
    T only through FedPALS' weights, or not at all: `Method(..., target_state=...)`."""
    return method.target_state


def reads_estimated_target(facts: registry.RunFacts) -> bool:
    """Whether the run reads the T that `algorithm.target_estimation` re-estimates: FedPALS'
    weights (FedPALS, or a client-side method with them), or a method that declares the state
    keeping its own T (`declared_target_state`: IW-ERM with FedAvg's weights)."""
    return facts.weights == "fedpals" or declared_target_state(facts.method) is not None


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    estimator = values["target_estimation"]
    estimates = reads_estimated_target(facts) and estimator is not None
    if estimates and facts.weights == "fedpals" and facts.section["ess_fraction"] is not None:
        raise ValueError(
            "config.algorithm.target_estimation is set, but ess_fraction needs a known T to "
            "find its lambda; give algorithm.lam instead (default 0: the projection of T^)."
        )
    for key in ("target_estimation_every", "target_holdout", "target_estimation_rho",
                "target_damping"):
        if estimates and values[key] is None:
            raise ValueError(
                f"config.algorithm.{key} is None, but {facts.method.name} with "
                "target_estimation needs it."
            )
    resolved = {key: value if estimates else None for key, value in values.items()}
    if estimator not in MAPLS_METHODS:  # another estimator's key, as another method's: None
        resolved["target_estimation_concentration"] = None
    if not estimates or estimator not in VRLS_METHODS:
        resolved["target_estimation_entropy_weight"] = None
    elif resolved["target_estimation_entropy_weight"] is None:
        resolved["target_estimation_entropy_weight"] = VRLS_DEFAULT_ENTROPY_WEIGHT
    return resolved


def _prepare(hp: UnknownTarget, context: registry.MethodContext) -> registry.MethodContext:
    # The clients' held-out share (if any); the server starts from the clients' aggregate.
    partition = hold_out_stratified(
        context.partition, context.dataset.train.y, hp.target_holdout, seed=context.seed
    )
    sizes = np.asarray(partition.client_sizes, np.float64)
    start = sizes @ np.asarray(partition.client_label_dists, np.float64) / sizes.sum()
    return context.replace(partition=dataclasses.replace(partition, target_label_dist=start))


def _monitor(hp: UnknownTarget, task: Any) -> TargetReestimation:
    return TargetReestimation(
        task.algorithm, task.model, task.dataset, task.partition,
        every=hp.target_estimation_every, method=hp.target_estimation, seed=task.config.seed,
        truth=task.partition.target_label_dist, rho=hp.target_estimation_rho,
        gate_sigma_min=hp.target_gate_sigma_min, gate_min_recall=hp.target_gate_min_recall,
        damping=hp.target_damping, warmup=hp.target_warmup_rounds or 0,
        shrinkage=hp.target_shrinkage or 0.0,
        shadow=None if hp.target_estimation_model is None else FedAvgShadow(
            task.model, task.dataset, task.partition, task.training,
            rounds=task.config.training.rounds, seed=task.config.seed,
            clients_per_round=task.clients_per_round, sampling_rate=task.sampling_rate,
            sampler=getattr(task, "sampler", None),
            final=hp.target_estimation_model == "fedavg_pretrained",
        ),
        ensemble=hp.target_estimation_model == "fedavg_shadow_ensemble",
        concentration=hp.target_estimation_concentration,
        entropy_weight=(VRLS_DEFAULT_ENTROPY_WEIGHT if hp.target_estimation_entropy_weight is None
                        else hp.target_estimation_entropy_weight),
    )


registry.register_feature(
    registry.Feature(
        "unknown_target", "T re-estimated", UnknownTarget, _resolve, prepare=_prepare,
        stage="target",
        monitor=_monitor, description="T(Y) unknown: re-estimated from the global model",
    ),
    replace=True,
)

for _method_name, _label in METHOD_LABELS.items():
    register_variant(
        Variant(f"fedpals_unknown_t_{_method_name}", f"FedPALS (T^ by {_label})", "fedpals",
                {"algorithm.target_estimation": _method_name}), replace=True
    )
