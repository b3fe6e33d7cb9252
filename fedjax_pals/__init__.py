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
    partition_from_label_counts,
    resample_to_label_dist,
    sparsity_partition,
    synthetic_label_shift_task,
    synthetic_target_label_dist,
)
from fedjax_pals.server_weights import (  # noqa: E402
    effective_sample_size,
    fedavg_weights,
    fedpals_objective,
    fedpals_weights,
    lambda_for_ess,
    projection_distance,
)

__version__ = "0.1.0"
from fedjax_pals.models import Model, lenet, logistic_regression, make_model  # noqa: E402
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
    STRATEGIES,
    DeviceData,
    LocalTraining,
    RoundEngine,
    client_schedule,
    default_strategy,
    device_data,
    make_local_step,
    round_engine,
)
from fedjax_pals.training import (  # noqa: E402
    TrainingHistory,
    clients_per_round_from,
    run_training,
    sample_participants,
)
from fedjax_pals.baselines import (  # noqa: E402
    ALGORITHMS,
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
    make_algorithm,
    oracle,
    oracle_partition,
    scaffold,
    scaffold_client,
    scaffold_server_update,
    uniform_weighting,
)
from fedjax_pals import engine  # noqa: E402,F401  (fjp.engine.resolve_strategy etc.)
