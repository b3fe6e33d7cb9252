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
