"""Federated algorithms, one module per method; importing the package registers the built-ins.

`base` holds the pieces every method is made of (`ClientMethod`, `Weighting`, server updates,
`FederatedAlgorithm`, `combine`); each method module defines its pieces, the notes on where it
differs from its reference implementation, and its registration in `fedjax_pals.algorithms.registry`
(hyperparameters, grid, label, builder), in the order of the imports below. A user's method is
one module of theirs written the same way (docs/extending.md).
"""

from fedjax_pals.algorithms.base import (
    ClientInfo, ClientMethod, ClientOutputs, FederatedAlgorithm, Params, PyTree, ServerState,
    ServerUpdate, Weighting, combine, fedavg_weighting, find_state, init_server_state, plain_sgd,
    replace_state, weighted_average_update, with_client_method,
)
from fedjax_pals.algorithms.fedavg import fedavg
from fedjax_pals.algorithms.fedpals import (
    FedPalsState, fedpals, fedpals_state, fedpals_weighting, replace_fedpals_state,
)
from fedjax_pals.algorithms.fedprox import FedProxHyperparameters, fedprox, fedprox_client
from fedjax_pals.algorithms.scaffold import (
    ScaffoldHyperparameters, ScaffoldState, scaffold, scaffold_client, scaffold_server_update,
    uniform_weighting,
)
from fedjax_pals.algorithms.afl import (
    AflHyperparameters, AflState, afl, afl_server_update, afl_weighting,
)
from fedjax_pals.algorithms.fedrs import FedRSHyperparameters, fedrs, fedrs_client
from fedjax_pals.algorithms.fedshift import (
    FedShiftState, fedshift, fedshift_aggregate_label_dist, fedshift_client, smoothed_label_dists,
)
from fedjax_pals.algorithms.oracle import oracle, oracle_partition
from fedjax_pals.algorithms.feddisco import (
    DISCREPANCY_METRICS, FEDDISCO_DEFAULT_A, FEDDISCO_DEFAULT_B, FEDDISCO_DEFAULT_METRIC,
    FedDiscoHyperparameters, FedDiscoState, feddisco, feddisco_discrepancy, feddisco_weighting,
    feddisco_weights,
)
from fedjax_pals.algorithms.fedlc import (
    FEDLC_DEFAULT_TAU, FEDLC_MIN_COUNT, FedLCHyperparameters, fedlc, fedlc_calibrated_logits,
    fedlc_client,
)
from fedjax_pals.algorithms.iwerm import (
    IWERM_DEFAULT_MAX_RATIO, IwermHyperparameters, IwermState, iwerm, iwerm_client, iwerm_ratios,
    iwerm_target,
)
from fedjax_pals.algorithms.fedvls import (
    FEDVLS_DEFAULT_LAMBDA, FEDVLS_DEFAULT_LS_WEIGHT, FedVLSHyperparameters, fedvls, fedvls_client,
    fedvls_loss,
)
# The features: importing their modules registers them. Their hooks run by stage
# (registry.FEATURE_STAGES: T_p and T unknown, the DP release, adaptive lambda and FedPALS'
# lambda, DP on updates), within a stage after what each declares (`Feature.after`:
# fedpals_lambda after adaptive_lambda), not in the order of these imports.
from fedjax_pals.algorithms.target_perturbation import perturb_label_dist
from fedjax_pals.algorithms.private_marginals import ServerLabelDistsState, with_server_label_dists
from fedjax_pals.algorithms.poisson_sampling import PoissonSamplingState, with_poisson_sampling
from fedjax_pals.algorithms.server_chain import (
    SLOTS as SERVER_CHAIN_SLOTS, RoundUpdates, ServerChain, ServerLink, server_round, with_link,
)
from fedjax_pals.algorithms.private_updates import (
    ClientClipping, GaussianNoise, PrivateUpdatesState, ServerClipping, add_to_aggregate,
    client_clip_update, clip_updates, with_private_updates,
)
from fedjax_pals.algorithms.adaptive_lambda import (
    DEFAULT_HYPER_LEARNING_RATE, DEFAULT_HYPER_VAL_SIZE, AdaptiveLambdaState, adaptive_fedpals,
    lam_report, validation_hypergradient,
)
from fedjax_pals.algorithms.target_estimation import (
    EstimateNotIdentified, Readiness, SourceStatistics, TargetReestimation, bbse_confusion,
    bbse_label_dist, constrained_bbse_label_dist, em_label_dist, estimate_target_label_dist,
    mlls_label_dist, model_logits, model_probabilities, readiness, source_statistics,
    with_target_label_dist, mapls_label_dist, mapls_prior_weight, density_ratio_mle,
    fit_vrls_temperature, vrls_label_dist,
)
from fedjax_pals.algorithms import fedpals_lambda  # noqa: F401  (registers its feature)
from fedjax_pals.algorithms.registry import make_algorithm

__all__ = [
    # base
    "ClientInfo", "ClientMethod", "ClientOutputs", "FederatedAlgorithm", "Params", "PyTree",
    "ServerState", "ServerUpdate", "Weighting", "combine", "fedavg_weighting", "init_server_state",
    "plain_sgd", "weighted_average_update", "with_client_method", "find_state", "replace_state",
    # the methods
    "fedavg", "fedpals", "fedpals_weighting", "make_algorithm", "FedPalsState", "fedpals_state",
    "replace_fedpals_state", "FedProxHyperparameters", "fedprox", "fedprox_client",
    "ScaffoldHyperparameters", "ScaffoldState", "scaffold", "scaffold_client",
    "scaffold_server_update", "uniform_weighting", "AflHyperparameters", "AflState", "afl",
    "afl_server_update", "afl_weighting", "FedRSHyperparameters", "fedrs", "fedrs_client",
    "FedShiftState", "fedshift", "fedshift_aggregate_label_dist", "fedshift_client",
    "smoothed_label_dists", "oracle", "oracle_partition", "DISCREPANCY_METRICS",
    "FEDDISCO_DEFAULT_A", "FEDDISCO_DEFAULT_B", "FEDDISCO_DEFAULT_METRIC",
    "FedDiscoHyperparameters", "FedDiscoState", "feddisco", "feddisco_discrepancy",
    "feddisco_weighting", "feddisco_weights", "FEDLC_DEFAULT_TAU", "FEDLC_MIN_COUNT",
    "FedLCHyperparameters", "fedlc", "fedlc_calibrated_logits", "fedlc_client",
    "IWERM_DEFAULT_MAX_RATIO", "IwermHyperparameters", "IwermState", "iwerm", "iwerm_client",
    "iwerm_ratios", "iwerm_target", "FEDVLS_DEFAULT_LAMBDA", "FEDVLS_DEFAULT_LS_WEIGHT",
    "FedVLSHyperparameters", "fedvls", "fedvls_client", "fedvls_loss",
    # beyond the paper: DP label marginals and updates, adaptive lambda, unknown T
    "ServerLabelDistsState", "with_server_label_dists", "ServerClipping", "ClientClipping", "GaussianNoise",
    "add_to_aggregate", "client_clip_update", "PrivateUpdatesState",
    "clip_updates", "with_private_updates", "PoissonSamplingState", "with_poisson_sampling",
    "SERVER_CHAIN_SLOTS", "RoundUpdates", "ServerChain", "ServerLink", "server_round", "with_link",
    "DEFAULT_HYPER_LEARNING_RATE",
    "DEFAULT_HYPER_VAL_SIZE", "AdaptiveLambdaState", "adaptive_fedpals", "lam_report",
    "validation_hypergradient", "EstimateNotIdentified", "TargetReestimation", "bbse_confusion",
    "bbse_label_dist", "em_label_dist", "estimate_target_label_dist", "model_probabilities",
    "with_target_label_dist", "perturb_label_dist", "Readiness", "SourceStatistics",
    "constrained_bbse_label_dist", "mlls_label_dist", "model_logits", "readiness",
    "source_statistics", "mapls_label_dist", "mapls_prior_weight", "density_ratio_mle",
    "fit_vrls_temperature", "vrls_label_dist",
]
