"""Per-client evaluation sets (fjp.client_evaluation_sets): held-out validation shares and test
sets drawn with each client's label distribution, or the format's own per-client test split."""

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.data import partitions
from fedjax_pals.data.client_sets import client_evaluation_sets


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


def _dataset(train_y, test_y, **extra):
    x = lambda n: np.zeros((n, 2), np.float32)
    return fjp.Dataset(name="t", train=fjp.LabeledSplit(x(len(train_y)), train_y),
                       test=fjp.LabeledSplit(x(len(test_y)), test_y),
                       num_classes=int(max(train_y.max(), test_y.max())) + 1, source="test",
                       **extra)


def _random_task(rng):
    k = int(rng.integers(3, 8))
    train = rng.permutation(np.concatenate([np.arange(k).repeat(200),
                                            rng.integers(0, k, 1000)])).astype(np.int32)
    test = rng.permutation(np.concatenate([np.arange(k).repeat(150),
                                           rng.integers(0, k, 300)])).astype(np.int32)
    m = int(rng.integers(4, 9))
    partition = partitions.dirichlet_partition(train, test, num_clients=m + 1, seed=int(
        rng.integers(1000)), beta=float(rng.uniform(0.3, 3.0)), num_classes=k)
    return _dataset(train, test), partition, k


def test_validation_share_is_stratified_held_out_and_disjoint_from_training(rng):
    dataset, before, k = _random_task(rng)
    fraction = float(rng.uniform(0.05, 0.4))
    after, sets = client_evaluation_sets(before, dataset, seed=3, val_fraction=fraction,
                                         test_size=50)
    train_y = dataset.train.y
    for i in range(before.num_clients):
        val = sets.val_indices[i, : sets.val_sizes[i]]
        kept = after.client_example_indices(i)
        original = before.client_example_indices(i)
        # Together they are exactly the client's examples; no overlap.
        np.testing.assert_array_equal(np.sort(np.concatenate([val, kept])), np.sort(original))
        counts = np.bincount(train_y[original], minlength=k)
        expected = np.minimum(np.floor(fraction * counts + 0.5), np.maximum(counts - 1, 0))
        np.testing.assert_array_equal(np.bincount(train_y[val], minlength=k), expected)
        np.testing.assert_array_equal(after.client_label_counts[i],
                                      np.bincount(train_y[kept], minlength=k))
    # Nobody trains on a validation example; the target's sets are untouched.
    assert partitions.partition_problem(after, dataset.train.y, dataset.test.y) is None
    np.testing.assert_array_equal(after.target_test_indices, before.target_test_indices)
    assert after.held_out_indices.size == 0


def test_drawn_test_sets_follow_each_clients_label_distribution(rng):
    dataset, before, k = _random_task(rng)
    size = int(rng.integers(20, 120))
    after, sets = client_evaluation_sets(before, dataset, seed=1, val_fraction=0.1,
                                         test_size=size)
    for i in range(after.num_clients):
        test = sets.test_indices[i, : sets.test_sizes[i]]
        assert len(np.unique(test)) == size == sets.test_sizes[i]
        np.testing.assert_array_equal(
            np.bincount(dataset.test.y[test], minlength=k),
            partitions.largest_remainder_counts(after.client_label_dists[i], size))


def test_sets_are_a_function_of_the_seed(rng):
    dataset, partition, _ = _random_task(rng)
    draw = lambda seed: client_evaluation_sets(partition, dataset, seed=seed, val_fraction=0.2,
                                               test_size=40)[1]
    a, b, c = draw(7), draw(7), draw(8)
    np.testing.assert_array_equal(a.test_indices, b.test_indices)
    np.testing.assert_array_equal(a.val_indices, b.val_indices)
    assert not np.array_equal(a.test_indices, c.test_indices)


def test_own_test_examples_come_from_the_format_split_at_most_test_size(rng):
    groups = 6
    train_ids = np.repeat(np.arange(groups), 40).astype(np.int32)
    test_ids = np.concatenate([np.repeat(np.arange(groups - 1), [3, 30, 12, 1, 25]),
                               ]).astype(np.int32)
    train_y = rng.integers(0, 3, len(train_ids)).astype(np.int32)
    train_y[:3] = [0, 1, 2]
    test_y = rng.integers(0, 3, len(test_ids)).astype(np.int32)
    dataset = _dataset(train_y, test_y, client_ids=train_ids, test_client_ids=test_ids)
    partition = partitions.natural_partition(
        train_y, test_y, train_ids, target_client=1, seed=0, num_classes=3,
        test_client_ids=test_ids)
    _, sets = client_evaluation_sets(partition, dataset, seed=0, val_fraction=0.0, test_size=10)
    trained_ids = [g for g in range(groups) if g != 1]  # training client i: the i-th other id
    own = np.bincount(test_ids, minlength=groups)
    np.testing.assert_array_equal(sets.test_sizes, np.minimum(own[trained_ids], 10))
    for i, g in enumerate(trained_ids):
        rows = sets.test_indices[i, : sets.test_sizes[i]]
        assert np.all(test_ids[rows] == g)
    assert sets.test_sizes[-1] == 0  # id 5 has no test examples: its accuracy will be NaN
    assert np.all(sets.val_sizes == 0)


def test_bad_arguments_and_impossible_sets_are_one_line_errors(rng):
    dataset, partition, _ = _random_task(rng)
    with pytest.raises(ValueError, match="val_fraction"):
        client_evaluation_sets(partition, dataset, seed=0, val_fraction=1.0, test_size=10)
    with pytest.raises(ValueError, match="test_size"):
        client_evaluation_sets(partition, dataset, seed=0, val_fraction=0.1, test_size=0)
    with pytest.raises(ValueError, match="client_test_size"):
        client_evaluation_sets(partition, dataset, seed=0, val_fraction=0.1, test_size=10**6)
    held = partitions.hold_out_stratified(partition, dataset.train.y, 0.2, seed=0)
    with pytest.raises(ValueError, match="already holds examples out"):
        client_evaluation_sets(held, dataset, seed=0, val_fraction=0.1, test_size=10)
