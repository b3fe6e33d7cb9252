"""The Oracle: clients resampled to T with their own sizes."""

import numpy as np

import fedjax_pals as fjp
from method_testing import K, label_task


def test_oracle_clients_have_the_target_label_dist_and_their_sizes():
    counts = [[12, 2, 0], [0, 5, 9], [3, 3, 3], [10, 6, 4]]
    train_x, train_y, partition = label_task(counts)
    oracle = fjp.algorithms.oracle_partition(partition, train_y, seed=0)
    np.testing.assert_array_equal(oracle.client_sizes, partition.client_sizes)
    target = partition.target_label_dist
    for i, n in enumerate(partition.client_sizes):
        labels = train_y[oracle.client_example_indices(i)]
        hist = np.bincount(labels, minlength=K)
        np.testing.assert_array_equal(hist, fjp.data.largest_remainder_counts(target, int(n)))
        assert np.max(np.abs(hist / n - target)) < 1.0 / n
        assert not set(oracle.client_example_indices(i)) & set(partition.target_val_indices)
    assert fjp.make_algorithm("oracle").client is fjp.fedavg().client
