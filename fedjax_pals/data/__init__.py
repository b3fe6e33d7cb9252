"""Host-side data: data set loaders, label-shift partitions, the synthetic task."""

from fedjax_pals.data.datasets import (
    DEBIAN_FASHION_MNIST_DIR,
    Dataset,
    DatasetUnavailableError,
    dataset_label,
    LabeledSplit,
    load_cifar10,
    load_dataset,
    load_fashion_mnist,
    register_dataset,
    registered_datasets,
)
from fedjax_pals.data.partitions import (
    MIN_TARGET_TEST_SIZE,
    FederatedPartition,
    dirichlet_partition,
    largest_remainder_counts,
    niid_bench_dirichlet_partition,
    niid_bench_sparsity_partition,
    partition_from_label_counts,
    resample_to_label_dist,
    sparsity_partition,
)
from fedjax_pals.data.synthetic import (
    SYNTHETIC_CLIENT_LABEL_DISTS,
    SYNTHETIC_CLIENT_SIZES,
    SYNTHETIC_MEANS,
    synthetic_label_shift_task,
    synthetic_target_label_dist,
)

__all__ = [
    "DEBIAN_FASHION_MNIST_DIR",
    "Dataset",
    "DatasetUnavailableError",
    "FederatedPartition",
    "LabeledSplit",
    "MIN_TARGET_TEST_SIZE",
    "SYNTHETIC_CLIENT_LABEL_DISTS",
    "SYNTHETIC_CLIENT_SIZES",
    "SYNTHETIC_MEANS",
    "dirichlet_partition",
    "largest_remainder_counts",
    "load_cifar10",
    "load_dataset",
    "load_fashion_mnist",
    "dataset_label",
    "register_dataset",
    "registered_datasets",
    "niid_bench_dirichlet_partition",
    "niid_bench_sparsity_partition",
    "partition_from_label_counts",
    "resample_to_label_dist",
    "sparsity_partition",
    "synthetic_label_shift_task",
    "synthetic_target_label_dist",
]
