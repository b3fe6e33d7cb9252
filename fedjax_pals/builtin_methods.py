"""The methods that ship with fedjax_pals, registered in `fedjax_pals.registry`.

Each entry is what a user's own method module would write (README, "Extending
fedjax_pals"): its hyperparameters (the config keys `algorithm.<field>`, with their defaults
and allowed values), the grid the selection protocol tries, and a builder from the pieces in
`algorithms`, `baselines` and `label_shift_baselines`.

Grids (the first value is the conventional default; ties go to it):

* FedProx' mu: 0.01, 0.001, 0.1, 1 (the candidate set of Li et al., 2020, FedProx).
* SCAFFOLD's server learning rate eta_g: 1, 0.5 (Karimireddy et al., 2020, use eta_g = 1).
* AFL's step size gamma_lambda: 0.1, 0.01, 0.001, 1 (Mohri et al., 2019 leave it free).
* FedRS' alpha: 0.5, 0.9, 0.1 (Li & Zhan, 2021).
"""

from __future__ import annotations

import dataclasses

from fedjax_pals import algorithms, baselines, label_shift_baselines
from fedjax_pals.registry import (
    Hyperparameters,
    Method,
    MethodContext,
    Variant,
    hyperparameter,
    register_method,
    register_variant,
)

def _need(value, what: str, name: str):
    if value is None:
        raise ValueError(f"{name} needs {what}.")
    return value


def _fedavg(hp, context: MethodContext):
    return algorithms.fedavg()


def _fedpals(hp, context: MethodContext):
    partition = _need(context.partition, "the partition (its target T)", "fedpals")
    lam = _need(context.lam, "FedPALS' trade-off lam", "fedpals")
    return algorithms.fedpals(partition.target_label_dist, lam)


@dataclasses.dataclass(frozen=True)
class FedProxHyperparameters(Hyperparameters):
    prox_mu: float = hyperparameter(0.01, low=0.0, doc="FedProx' proximal strength mu")


def _fedprox(hp: FedProxHyperparameters, context: MethodContext):
    return baselines.fedprox(hp.prox_mu, context.weighting)


@dataclasses.dataclass(frozen=True)
class ScaffoldHyperparameters(Hyperparameters):
    server_lr: float = hyperparameter(
        1.0, low=0.0, low_open=True, doc="SCAFFOLD's global step eta_g"
    )


def _scaffold(hp: ScaffoldHyperparameters, context: MethodContext):
    return baselines.scaffold(hp.server_lr)


@dataclasses.dataclass(frozen=True)
class AflHyperparameters(Hyperparameters):
    afl_step: float = hyperparameter(
        0.1, low=0.0, low_open=True, doc="AFL's projected-ascent step gamma on its mixture"
    )


def _afl(hp: AflHyperparameters, context: MethodContext):
    return baselines.afl(hp.afl_step)


@dataclasses.dataclass(frozen=True)
class FedRSHyperparameters(Hyperparameters):
    fedrs_alpha: float = hyperparameter(
        0.5, low=0.0, high=1.0, low_open=True, doc="FedRS' scaling of absent classes' logits"
    )
    fedrs_soft: bool = hyperparameter(False, kind="bool", doc="FedRS' soft variant")


def _fedrs(hp: FedRSHyperparameters, context: MethodContext):
    return baselines.fedrs(hp.fedrs_alpha, hp.fedrs_soft, context.weighting)


def _fedshift(hp, context: MethodContext):
    partition = _need(context.partition, "the partition (its label counts)", "fedshift")
    aggregate = baselines.fedshift_aggregate_label_dist(partition.client_label_counts)
    return baselines.fedshift(aggregate, weighting=context.weighting)


def _oracle(hp, context: MethodContext):
    return baselines.oracle()


def _oracle_partition(partition, train_labels, seed):
    return baselines.oracle_partition(partition, train_labels, seed=seed)


@dataclasses.dataclass(frozen=True)
class FedDiscoHyperparameters(Hyperparameters):
    feddisco_a: float = hyperparameter(
        label_shift_baselines.FEDDISCO_DEFAULT_A, low=0.0, doc="FedDisco's discrepancy weight a"
    )
    feddisco_b: float = hyperparameter(
        label_shift_baselines.FEDDISCO_DEFAULT_B, doc="FedDisco's offset b"
    )
    feddisco_metric: str = hyperparameter(
        label_shift_baselines.FEDDISCO_DEFAULT_METRIC,
        kind="choice",
        choices=label_shift_baselines.DISCREPANCY_METRICS,
        doc="FedDisco's discrepancy of S_k from T",
    )


def _feddisco(hp: FedDiscoHyperparameters, context: MethodContext):
    partition = _need(context.partition, "the partition (its target T)", "feddisco")
    return label_shift_baselines.feddisco(
        partition.target_label_dist, hp.feddisco_a, hp.feddisco_b, hp.feddisco_metric
    )


@dataclasses.dataclass(frozen=True)
class FedLCHyperparameters(Hyperparameters):
    fedlc_tau: float = hyperparameter(
        label_shift_baselines.FEDLC_DEFAULT_TAU, low=0.0, doc="FedLC's calibration strength tau"
    )


def _fedlc(hp: FedLCHyperparameters, context: MethodContext):
    return label_shift_baselines.fedlc(hp.fedlc_tau, context.weighting)


BUILTIN_METHODS = (
    Method("fedavg", "FedAvg", _fedavg, description="local SGD, weights n_i / N (eq. 4)"),
    Method("fedpals", "FedPALS", _fedpals, reads_target=True,
           description="local SGD, target-aware weights alpha^lam (eq. 8)"),
    Method("fedprox", "FedProx", _fedprox, FedProxHyperparameters,
           grid={"prox_mu": (0.01, 0.001, 0.1, 1.0)}, client_side=True,
           description="local loss + (mu/2) ||w - w_global||^2 (Li et al., 2020)"),
    Method("scaffold", "SCAFFOLD", _scaffold, ScaffoldHyperparameters,
           grid={"server_lr": (1.0, 0.5)},
           description="control variates, option II (Karimireddy et al., 2020)"),
    Method("afl", "AFL", _afl, AflHyperparameters, grid={"afl_step": (0.1, 0.01, 0.001, 1.0)},
           description="min-max over client mixtures (Mohri et al., 2019)"),
    Method("fedrs", "FedRS", _fedrs, FedRSHyperparameters,
           grid={"fedrs_alpha": (0.5, 0.9, 0.1)}, client_side=True,
           description="restricted softmax in local training (Li & Zhan, 2021)"),
    Method("fedshift", "FedShift", _fedshift, client_side=True,
           description="logits shifted by ln(P_i(k) / P(k)) in local training (Shen et al., 2021)"),
    Method("oracle", "Oracle", _oracle, partition_transform=_oracle_partition,
           description="FedAvg on clients resampled to T (FedPALS App. B.5)"),
    Method("feddisco", "FedDisco", _feddisco, FedDiscoHyperparameters, reads_target=True,
           description="weights from size and label discrepancy (Ye et al., 2023)"),
    Method("fedlc", "FedLC", _fedlc, FedLCHyperparameters, client_side=True,
           description="logit calibration by label counts (Zhang et al., 2022)"),
)
BUILTIN_VARIANTS = (
    Variant("fedpals_adaptive", "FedPALS (adaptive λ)", "fedpals",
            {"algorithm.lam_schedule": "hypergradient"}),
    Variant("fedpals_unknown_t_bbse", "FedPALS (T^ by BBSE)", "fedpals",
            {"algorithm.target_estimation": "bbse"}),
    Variant("fedpals_unknown_t_bbse_soft", "FedPALS (T^ by soft BBSE)", "fedpals",
            {"algorithm.target_estimation": "bbse_soft"}),
    Variant("fedpals_unknown_t_em", "FedPALS (T^ by EM)", "fedpals",
            {"algorithm.target_estimation": "em"}),
)

for _method in BUILTIN_METHODS:
    register_method(_method, replace=True)
for _variant in BUILTIN_VARIANTS:
    register_variant(_variant, replace=True)
