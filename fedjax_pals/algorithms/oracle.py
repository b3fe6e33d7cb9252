"""Oracle: FedAvg on clients resampled to the target label distribution.

Where ours differs from the reference, and why. Oracle vs FedPALS App. B.5: FedAvg on clients
whose data follow T(Y); the paper does not say how the clients are drawn. Ours keeps each
client's size n_i and redraws its examples with largest-remainder counts of T from the training
split minus the target validation set (`resample_to_label_dist`).
"""

from __future__ import annotations

import numpy as np

from fedjax_pals.algorithms.base import FederatedAlgorithm
from fedjax_pals.algorithms.fedavg import fedavg
from fedjax_pals.data import FederatedPartition, resample_to_label_dist
from fedjax_pals.algorithms.registry import Method, register_method


def oracle_partition(
    partition: FederatedPartition, train_labels: np.ndarray, seed: int
) -> FederatedPartition:
    """The Oracle's clients (FedPALS App. B.5): each client i keeps n_i examples,
    redrawn with the target's label distribution T(Y) (largest-remainder
    counts). Train `oracle()` (FedAvg) on this partition."""
    return resample_to_label_dist(partition, train_labels, partition.target_label_dist, seed=seed)


def oracle() -> FederatedAlgorithm:
    """The Oracle's algorithm: FedAvg (to be run on `oracle_partition`)."""
    return fedavg()._replace(name="oracle")


register_method(
    Method("oracle", "Oracle", lambda hp, context: oracle(), partition_transform=oracle_partition,
           description="FedAvg on clients resampled to T (FedPALS App. B.5)", reference=True),
    replace=True
)
