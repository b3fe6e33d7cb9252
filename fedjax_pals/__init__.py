"""fedjax_pals: federated learning under label shift in JAX (FedPALS and baselines).

The top level is the API a user needs: configs and `train_and_evaluate`, sweeps, the method
registry and the pieces a method is made of, the server weights, data sets and partitions,
models, and `restore_run`. Everything else stays importable from its submodule (also as an
attribute: `fjp.engine.round_engine`, `fjp.training.run_trainings`, `fjp.privacy`,
`fjp.algorithms.target_estimation`, `fjp.algorithms.fedprox_client`, `fjp.experiment.protocol`,
...).
"""

import warnings as _warnings

# jaxopt is unmaintained upstream and warns on import; the solver we use from
# it is verified against a float64 reference in tests/test_server_weights.py.
_warnings.filterwarnings("ignore", message=r".*jaxopt.*", category=DeprecationWarning)

# The minor version counts changes of what a user's module must declare (CHANGELOG.md).
__version__ = "0.2.0"

# -- data sets and label-shift partitions
from fedjax_pals.data import (  # noqa: E402
    ClientExamples,
    DataFacts,
    DataFileError,
    Dataset,
    DatasetUnavailableError,
    FederatedPartition,
    InputScaling,
    LabeledSplit,
    Partition,
    dirichlet_partition,
    load_cifar10,
    load_dataset,
    load_fashion_mnist,
    natural_partition,
    niid_bench_dirichlet_partition,
    niid_bench_sparsity_partition,
    partition_from_label_counts,
    register_dataset,
    assemble_clients,
    register_partition,
    register_reader,
    sparsity_partition,
    synthetic_label_shift_task,
)
from fedjax_pals.data.index_lists import (  # noqa: E402  (registers the scheme "index_lists")
    index_lists_from_partitioner,
    load_index_lists,
    partition_from_index_lists,
    save_index_lists,
)

# -- server weights (pure JAX: jit- and vmap-able over lam and targets)
from fedjax_pals.server_weights import (  # noqa: E402
    effective_sample_size,
    fedavg_weights,
    fedpals_weights,
    lambda_for_ess,
    projection_distance,
)

# -- models
from fedjax_pals.models import (  # noqa: E402
    Model,
    lenet,
    logistic_regression,
    make_model,
    model_from_flax,
    register_model,
)

# -- a method's pieces, the built-in methods (importing the package registers them), the registry
from fedjax_pals.algorithms import (  # noqa: E402
    ClientInfo, ClientMethod, ClientOutputs, FederatedAlgorithm, ServerState, Weighting, afl,
    combine, fedavg, feddisco, fedlc, fedpals, fedpals_weighting, fedprox, fedrs, fedshift,
    init_server_state, make_algorithm, oracle, scaffold, weighted_average_update,
)
# -- the server chain: a user's operation on the round's updates (noise, compression) is a link
from fedjax_pals.algorithms.server_chain import (  # noqa: E402
    RoundUpdates, ServerChain, ServerLink, with_link,
)
from fedjax_pals.algorithms.base import find_state, replace_state  # noqa: E402
from fedjax_pals.algorithms.registry import (  # noqa: E402
    ContextSlot,
    Feature,
    Hyperparameters,
    Method,
    MethodContext,
    MethodKey,
    Monitor,
    RunFacts,
    Variant,
    get_method,
    hyperparameter,
    method_label,
    register_method,
    register_feature,
    register_variant,
    registered_methods,
)
from fedjax_pals.algorithms.styles import register_method_style  # noqa: E402

# -- server optimisers (a method key's prefix: fedadam_fedpals)
from fedjax_pals.algorithms.server_optimizers import (  # noqa: E402
    ServerOptimizer,
    register_server_optimizer,
    registered_server_optimizers,
)

# -- client samplers (training.client_sampling names one)
from fedjax_pals.sampling import (  # noqa: E402
    ClientSampler,
    EveryClient,
    PoissonSampling,
    WithoutReplacement,
    register_client_sampler,
    registered_client_samplers,
)

# -- training a federation (library level)
from fedjax_pals.engine import LocalTraining  # noqa: E402
from fedjax_pals.training import TrainingDivergedError, TrainingHistory, run_training  # noqa: E402
from fedjax_pals.runtime import configure_runtime, is_main_process  # noqa: E402

# -- per-client evaluation and personalisation (every client on its own examples)
from fedjax_pals.data.client_sets import ClientEvaluationSets, client_evaluation_sets  # noqa: E402
from fedjax_pals.metrics import (  # noqa: E402
    ClientEvaluation,
    client_accuracies,
    client_accuracy_summary,
)
from fedjax_pals.personalization import (  # noqa: E402
    Personalization,
    PersonalizationContext,
    PersonalizationResult,
    ditto,
    fine_tune,
    local_only,
    personalize,
    register_personalization,
    registered_personalizations,
)

# -- experiments: configs, tasks, workdirs, sweeps and the paper's protocol, restore
from fedjax_pals.experiment.config import (  # noqa: E402
    ConfigError,
    ResolvedConfig,
    config_digest,
    default_config,
    resolve_config,
    validate_config,
)
from fedjax_pals.experiment.task import Task, TaskError, build_task  # noqa: E402
from fedjax_pals.experiment.train import train_and_evaluate, train_and_evaluate_many  # noqa: E402
from fedjax_pals.experiment.sweep import expand_sweep, run_sweep  # noqa: E402
from fedjax_pals.experiment.shards import (  # noqa: E402
    Shard,
    assign_shards,
    collect_sweep,
    run_shard,
)
from fedjax_pals.experiment.submission import submit_sweep  # noqa: E402
from fedjax_pals.experiment.protocol import PAPER_METHODS, protocol_grid, table1_config  # noqa: E402
from fedjax_pals.experiment.restore import RestoredRun, restore_run  # noqa: E402
from fedjax_pals.dp_statement import PrivacyStatement, privacy_statement  # noqa: E402
from fedjax_pals.experiment.checkpoints import (  # noqa: E402
    CheckpointError,
    CheckpointMismatchError,
    Checkpointer,
)
from fedjax_pals.experiment.errors import WorkdirError, WorkdirLockedError  # noqa: E402
from fedjax_pals.experiment.diskspace import DiskFullError  # noqa: E402
from fedjax_pals.extensions import ExtensionImportError  # noqa: E402

# The submodules, as attributes (fjp.engine.round_engine, fjp.experiment.plots, ...).
from fedjax_pals import (  # noqa: E402,F401
    accounting,
    algorithms,
    calibration,
    data,
    deprecation,
    engine,
    experiment,
    extensions,
    metrics,
    models,
    personalization,
    privacy,
    hyperparameters,
    server_weights,
    training,
    unknown_target,
)
from fedjax_pals.experiment import (  # noqa: E402,F401
    checkpoints,
    plots,
    progress,
    protocol,
    shards,
    submission,
    sweep,
    writers,
)

__all__ = [
    # data
    "Dataset", "DatasetUnavailableError", "FederatedPartition", "LabeledSplit",
    "dirichlet_partition", "load_cifar10", "load_dataset", "load_fashion_mnist",
    "niid_bench_dirichlet_partition", "niid_bench_sparsity_partition", "register_dataset",
    "sparsity_partition", "synthetic_label_shift_task", "Partition", "natural_partition",
    "partition_from_label_counts", "register_partition", "InputScaling", "DataFacts",
    "ClientExamples", "DataFileError", "assemble_clients", "register_reader",
    "partition_from_index_lists", "index_lists_from_partitioner", "save_index_lists",
    "load_index_lists",
    # server weights
    "effective_sample_size", "fedavg_weights", "fedpals_weights", "lambda_for_ess",
    "projection_distance",
    # models
    "Model", "lenet", "logistic_regression", "make_model", "model_from_flax", "register_model",
    # methods
    "ClientInfo", "ClientMethod", "ClientOutputs", "FederatedAlgorithm", "ServerState",
    "Weighting", "fedavg", "fedpals", "fedpals_weighting", "init_server_state",
    "weighted_average_update", "afl", "combine", "fedprox", "fedrs", "fedshift", "oracle",
    "scaffold", "feddisco", "fedlc", "Hyperparameters", "Method", "MethodContext", "get_method",
    "hyperparameter", "make_algorithm", "method_label", "register_method", "registered_methods",
    "register_method_style",
    "MethodKey",
    "Variant", "register_variant",
    "Feature", "Monitor", "RunFacts", "register_feature", "ContextSlot",
    # the server chain
    "ServerLink", "RoundUpdates", "ServerChain", "with_link", "find_state", "replace_state",
    # server optimisers
    "ServerOptimizer", "register_server_optimizer", "registered_server_optimizers",
    # client samplers
    "ClientSampler", "EveryClient", "WithoutReplacement", "PoissonSampling",
    "register_client_sampler", "registered_client_samplers",
    # training
    "LocalTraining", "TrainingDivergedError", "TrainingHistory", "run_training",
    "configure_runtime", "is_main_process",
    # per-client evaluation and personalisation
    "ClientEvaluationSets", "client_evaluation_sets", "ClientEvaluation", "client_accuracies",
    "client_accuracy_summary", "PersonalizationResult", "personalize", "fine_tune", "ditto",
    "local_only", "Personalization", "PersonalizationContext", "register_personalization",
    "registered_personalizations",
    # experiments
    "ConfigError", "ResolvedConfig", "config_digest", "default_config", "resolve_config",
    "validate_config", "Task", "TaskError",
    "build_task", "train_and_evaluate", "train_and_evaluate_many", "expand_sweep", "run_sweep",
    "Shard", "assign_shards", "collect_sweep", "run_shard", "submit_sweep",
    "PAPER_METHODS", "protocol_grid", "table1_config", "RestoredRun", "restore_run",
    "PrivacyStatement", "privacy_statement",
    "CheckpointError", "CheckpointMismatchError", "Checkpointer", "WorkdirError",
    "WorkdirLockedError",
    "DiskFullError", "ExtensionImportError",
]


def __getattr__(name: str):
    # fjp.server_optimizers moved to fjp.algorithms.server_optimizers (0.3.0): the old module
    # (fedjax_pals/server_optimizers.py) gives the new one and warns; 0.4.0 refuses it.
    if name == "server_optimizers":
        import importlib

        return importlib.import_module("fedjax_pals.server_optimizers")
    raise AttributeError(f"module 'fedjax_pals' has no attribute {name!r}")
