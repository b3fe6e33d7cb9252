"""fedjax_pals: federated learning under label shift in JAX (FedPALS and baselines)."""

import warnings as _warnings

# jaxopt is unmaintained upstream and warns on import; the solver we use from
# it is verified against a float64 reference in tests/test_server_weights.py.
_warnings.filterwarnings("ignore", message=r".*jaxopt.*", category=DeprecationWarning)

from fedjax_pals.data import (  # noqa: E402
    DEBIAN_FASHION_MNIST_DIR,
    Dataset,
    DatasetUnavailableError,
    FederatedPartition,
    LabeledSplit,
    SYNTHETIC_CLIENT_LABEL_DISTS,
    SYNTHETIC_CLIENT_SIZES,
    SYNTHETIC_MEANS,
    dirichlet_partition,
    largest_remainder_counts,
    load_cifar10,
    load_dataset,
    load_fashion_mnist,
    niid_bench_dirichlet_partition,
    niid_bench_sparsity_partition,
    partition_from_label_counts,
    register_dataset,
    registered_datasets,
    resample_to_label_dist,
    sparsity_partition,
    synthetic_label_shift_task,
    synthetic_target_label_dist,
)
from fedjax_pals.data import MIN_TARGET_TEST_SIZE  # noqa: E402
from fedjax_pals.server_weights import (  # noqa: E402
    effective_sample_size,
    fedavg_weights,
    fedpals_objective,
    fedpals_lam_derivative,
    fedpals_weights,
    lambda_for_ess,
    projection_distance,
)

__version__ = "0.1.0"
from fedjax_pals.models import (  # noqa: E402
    Model,
    lenet,
    logistic_regression,
    make_model,
    model_from_flax,
    register_model,
    registered_models,
)
from fedjax_pals.metrics import (  # noqa: E402
    accuracy_from_confusion,
    confusion_matrix,
    macro_f1_from_confusion,
    make_evaluator,
)
from fedjax_pals.algorithms import (  # noqa: E402
    ClientInfo,
    ClientMethod,
    ClientOutputs,
    FederatedAlgorithm,
    ServerState,
    fedavg,
    fedavg_weighting,
    fedpals,
    fedpals_weighting,
    init_server_state,
    Weighting,
    plain_sgd,
    weighted_average_update,
    with_client_method,
)
from fedjax_pals.engine import (  # noqa: E402
    BACKENDS,
    ClientUpdate,
    CompilationCounter,
    DeviceData,
    LocalTraining,
    RoundEngine,
    client_mesh,
    client_schedule,
    default_backend,
    device_data,
    make_client_update,
    make_local_step,
    round_engine,
    structure_key,
)
from fedjax_pals.training import (  # noqa: E402
    CheckpointerProtocol,
    TrainingDivergedError,
    TrainingHistory,
    TrainingRun,
    clients_per_round_from,
    divergence_limit,
    run_fingerprint,
    run_training,
    run_trainings,
    sample_participants,
    training_group_key,
)
from fedjax_pals.baselines import (  # noqa: E402
    afl,
    afl_server_update,
    afl_weighting,
    combine,
    fedprox,
    fedprox_client,
    fedrs,
    fedrs_client,
    fedshift,
    fedshift_aggregate_label_dist,
    fedshift_client,
    oracle,
    oracle_partition,
    scaffold,
    scaffold_client,
    scaffold_server_update,
    uniform_weighting,
)
from fedjax_pals.registry import (  # noqa: E402
    Hyperparameters,
    Method,
    MethodContext,
    Variant,
    get_method,
    hyperparameter,
    make_algorithm,
    method_label,
    register_method,
    register_variant,
    registered_methods,
)
from fedjax_pals import builtin_methods  # noqa: E402,F401  (registers the built-in methods)
from fedjax_pals import engine  # noqa: E402,F401  (fjp.engine.resolve_backend etc.)
from fedjax_pals.runtime import configure_runtime, is_main_process  # noqa: E402

# -- the experiment layer: metric writers, progress, plots, sweeps and the paper's protocol
from fedjax_pals.experiment.writers import (  # noqa: E402
    MetricWriter,
    flatten_hparams,
    read_metrics,
)
from fedjax_pals.experiment.progress import Progress  # noqa: E402
from fedjax_pals.experiment.plots import (  # noqa: E402
    method_style,
    plot_accuracy_vs_distance,
    plot_comparison,
    plot_curves,
    plot_label_distributions,
    plot_weights_vs_ess,
)
from fedjax_pals.experiment.perturbation import perturb_label_dist  # noqa: E402
from fedjax_pals.experiment.protocol import (  # noqa: E402
    PAPER_METHODS,
    PAPER_TABLE_1,
    RunRecord,
    best_val_point,
    merge_tables,
    protocol_grid,
    table1_config,
    protocol_table,
    select_method,
    table_markdown,
    write_protocol_report,
)
from fedjax_pals.experiment.sweep import (  # noqa: E402
    SweepRun,
    execute_runs,
    expand_sweep,
    run_sweep,
)

# -- the experiment layer: configs, tasks, workdirs, checkpoints, train_and_evaluate
from fedjax_pals.experiment.config import (  # noqa: E402
    ConfigError,
    config_differences,
    config_digest,
    default_config,
    validate_config,
)
from fedjax_pals.experiment.checkpoints import (  # noqa: E402
    CheckpointError,
    CheckpointMismatchError,
    Checkpointer,
)
from fedjax_pals.experiment.task import Task, TaskError, build_task  # noqa: E402
from fedjax_pals.experiment.workdir import WorkdirError, WorkdirLockedError  # noqa: E402
from fedjax_pals.experiment.diskspace import DiskFullError  # noqa: E402
from fedjax_pals.experiment.train import train_and_evaluate, train_and_evaluate_many  # noqa: E402
from fedjax_pals.experiment.restore import RestoredRun, restore_run  # noqa: E402

# -- beyond the paper: FedDisco, FedLC, private label marginals, an unknown target T
from fedjax_pals.label_shift_baselines import (  # noqa: E402
    feddisco,
    feddisco_discrepancy,
    feddisco_weighting,
    feddisco_weights,
    fedlc,
    fedlc_calibrated_logits,
    fedlc_client,
)
from fedjax_pals.adaptive_lambda import (  # noqa: E402
    adaptive_fedpals,
    lam_report,
    validation_hypergradient,
)
from fedjax_pals.privacy import (  # noqa: E402
    gaussian_sigma,
    noise_scale,
    noisy_label_counts,
    private_label_dists,
    project_to_simplex,
    with_server_label_dists,
)
from fedjax_pals.target_estimation import (  # noqa: E402
    bbse_label_dist,
    em_label_dist,
    estimate_target_label_dist,
    model_probabilities,
    TargetReestimation,
    train_with_estimated_target,
    with_target_label_dist,
)
