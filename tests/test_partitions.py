"""Tests for fedjax_pals.data.partitions: invariants of every label-shift scheme."""

import json

import numpy as np
import pytest

from fedjax_pals.data import datasets
from fedjax_pals.data.partitions import (
    FederatedPartition,
    dirichlet_partition,
    hold_out_stratified,
    largest_remainder_counts,
    niid_bench_dirichlet_partition,
    niid_bench_sparsity_partition,
    partition_from_label_counts,
    resample_to_label_dist,
    sparsity_partition,
)


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


def random_labels(rng, num_classes=None, n_train=None, n_test=None):
    """Imbalanced random train/test labels in which every class occurs.

    Every class has >= 30 test examples, so any target gets a test set of at least
    MIN_TARGET_TEST_SIZE = 30 (a class with T_k <= 1 can supply 30 T-distributed examples).
    """
    k = int(num_classes or rng.integers(3, 12))
    n_train = int(n_train or rng.integers(1500, 4000))
    n_test = int(n_test or rng.integers(400, 1000))
    probs = rng.dirichlet(np.full(k, 3.0))
    train = np.concatenate([np.arange(k).repeat(30), rng.choice(k, n_train - 30 * k, p=probs)])
    test = np.concatenate([np.arange(k).repeat(30), rng.choice(k, n_test - 30 * k, p=probs)])
    return rng.permutation(train).astype(np.int32), rng.permutation(test).astype(np.int32), k


@pytest.fixture(scope="module")
def fmnist_labels():
    try:
        ds = datasets.load_fashion_mnist()
    except datasets.DatasetUnavailableError:
        pytest.skip("Fashion-MNIST not available")
    return ds.train.y, ds.test.y


def assert_partition_invariants(p: FederatedPartition, train: np.ndarray, test: np.ndarray):
    k, m = p.num_classes, p.num_clients
    assert p.client_indices.dtype == np.int32 and p.client_sizes.dtype == np.int64
    assert p.client_indices.shape == (m, p.client_sizes.max())
    assert np.all(p.client_sizes > 0)
    mask = p.client_mask
    np.testing.assert_array_equal(mask.sum(axis=1), p.client_sizes)
    assert np.all(p.client_indices[~mask] == 0), "padding must be 0"

    rows = [p.client_indices[i, : p.client_sizes[i]] for i in range(m)]
    everything = np.concatenate(rows + [p.target_val_indices])
    assert everything.min() >= 0 and everything.max() < len(train)
    assert len(np.unique(everything)) == len(everything), "clients/val overlap"
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(
            np.bincount(train[row], minlength=k), p.client_label_counts[i]
        )
    np.testing.assert_allclose(p.client_label_dists.sum(axis=1), 1.0)

    t = p.target_label_dist
    assert t.shape == (k,) and np.isclose(t.sum(), 1.0) and np.all(t >= 0)
    test_idx = p.target_test_indices
    assert test_idx.min() >= 0 and test_idx.max() < len(test)
    assert len(np.unique(test_idx)) == len(test_idx)
    test_counts = np.bincount(test[test_idx], minlength=k)
    np.testing.assert_array_equal(test_counts, largest_remainder_counts(t, len(test_idx)))
    val_counts = np.bincount(train[p.target_val_indices], minlength=k)
    np.testing.assert_array_equal(
        val_counts, largest_remainder_counts(t, len(p.target_val_indices))
    )


def assert_same(p: FederatedPartition, q: FederatedPartition):
    for name in (
        "client_indices",
        "client_sizes",
        "client_label_counts",
        "target_label_dist",
        "target_val_indices",
        "target_test_indices",
    ):
        np.testing.assert_array_equal(getattr(p, name), getattr(q, name), err_msg=name)
    assert p.description == q.description


# ------------------------------------------------------ largest remainder


def test_largest_remainder_counts_sum_to_n_and_stay_within_one_of_p_n(rng):
    for _ in range(50):
        k = int(rng.integers(1, 15))
        p = rng.dirichlet(np.full(k, 0.5))
        p[rng.random(k) < 0.3] = 0.0
        if p.sum() == 0:
            p[0] = 1.0
        p /= p.sum()
        n = int(rng.integers(0, 5000))
        c = largest_remainder_counts(p, n)
        assert c.sum() == n and np.all(c >= 0)
        assert np.all(np.abs(c - p * n) < 1.0)
        assert np.all(c[p == 0] == 0)


def test_largest_remainder_counts_rejects_bad_input():
    with pytest.raises(ValueError, match="non-negative 1-D vector with positive mass"):
        largest_remainder_counts(np.array([0.5, -0.1, 0.6]), 5)
    with pytest.raises(ValueError, match="non-negative 1-D vector with positive mass"):
        largest_remainder_counts(np.zeros(3), 5)
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        largest_remainder_counts(np.array([1.0]), -1)


# ------------------------------------------------------ core


def test_partition_from_label_counts_honours_exact_counts(rng):
    train, test, k = random_labels(rng)
    available = np.bincount(train, minlength=k)
    num_clients = int(rng.integers(2, 7))
    # Random counts that use at most half of each class.
    counts = np.stack(
        [rng.integers(0, available // (2 * num_clients) + 1) for _ in range(num_clients)]
    )
    counts[:, 0] += 1  # every client, target included, non-empty
    p = partition_from_label_counts(train, test, counts, seed=3, description="custom")
    np.testing.assert_array_equal(p.client_label_counts, counts[:-1])
    np.testing.assert_allclose(p.target_label_dist, counts[-1] / counts[-1].sum())
    assert len(p.target_val_indices) == counts[-1].sum()
    assert p.description == "custom" and p.num_clients == num_clients - 1
    assert_partition_invariants(p, train, test)


def test_default_target_test_set_is_the_largest_feasible(rng):
    train, test, k = random_labels(rng)
    counts = np.stack([np.full(k, 5), rng.integers(1, 20, size=k)])
    p = partition_from_label_counts(train, test, counts, seed=0, description="x")
    n_test = len(p.target_test_indices)
    available = np.bincount(test, minlength=k)
    for n in range(n_test + 1, n_test + 200):
        assert np.any(largest_remainder_counts(p.target_label_dist, n) > available), n


def test_target_test_size_and_val_size_are_honoured(rng):
    train, test, k = random_labels(rng)
    counts = np.stack([np.full(k, 5), rng.integers(5, 20, size=k)])
    p = partition_from_label_counts(
        train, test, counts, seed=1, description="x", target_test_size=37, val_size=11
    )
    assert len(p.target_test_indices) == 37 and len(p.target_val_indices) == 11
    assert_partition_invariants(p, train, test)


def test_infeasible_sizes_raise(rng):
    train, test, k = random_labels(rng)
    counts = np.stack([np.full(k, 5), np.full(k, 3)])
    with pytest.raises(ValueError, match="target_test_size"):
        partition_from_label_counts(
            train, test, counts, seed=0, description="x", target_test_size=len(test) + 1
        )
    with pytest.raises(ValueError, match="val_size"):
        partition_from_label_counts(
            train, test, counts, seed=0, description="x", val_size=3 * k + 1
        )


def test_core_rejects_oversubscribed_class_and_empty_clients(rng):
    train, test, k = random_labels(rng)
    available = np.bincount(train, minlength=k)
    too_many = np.stack([np.ones(k, int), np.ones(k, int)])
    too_many[0, 1] = available[1]
    with pytest.raises(ValueError, match="class 1"):
        partition_from_label_counts(train, test, too_many, seed=0, description="x")
    empty_client = np.stack([np.zeros(k, int), np.ones(k, int), np.ones(k, int)])
    with pytest.raises(ValueError, match=r"training client\(s\) \[0\]"):
        partition_from_label_counts(train, test, empty_client, seed=0, description="x")
    empty_target = np.stack([np.ones(k, int), np.zeros(k, int)])
    with pytest.raises(ValueError, match="target"):
        partition_from_label_counts(train, test, empty_target, seed=0, description="x")
    with pytest.raises(ValueError, match="num_classes"):
        partition_from_label_counts(train, test, np.ones((2, k + 1), int), seed=0, description="x")


# ------------------------------------------------------ target sets that cannot follow T


@pytest.mark.parametrize("target_row", [[5, 5, 5], [50, 50, 1]], ids=["T_2=1/3", "T_2=1/101"])
def test_test_split_without_a_class_the_target_needs_is_an_error(target_row):
    # Even a class T weights at 1 % must be in the test split, or the test set silently
    # leaves part of T out.
    train = np.repeat(np.arange(3), 100)
    test = np.repeat(np.arange(2), 200)  # no class 2
    counts = np.array([[10, 10, 10], target_row])
    message = r"T needs class\(es\) \[2\] \(T_2 = 0\.(009901|3333)\) but the test split has no"
    with pytest.raises(ValueError, match=message):
        partition_from_label_counts(train, test, counts, seed=0, description="x")
    # The same through a scheme: every client, the target included, holds all 3 labels.
    with pytest.raises(ValueError, match=r"test split has no example of them"):
        sparsity_partition(train, test, num_clients=3, labels_per_client=3, seed=0)


def test_target_test_set_below_the_minimum_is_an_error_naming_the_limiting_class():
    train = np.repeat(np.arange(3), 100)
    test = np.concatenate([np.repeat(0, 200), np.repeat(1, 4), np.repeat(2, 200)])
    counts = np.array([[10, 10, 10], [20, 20, 0]])  # T = (0.5, 0.5, 0)
    # Class 1 has 4 test examples, so a T-distributed test set holds at most 9 (5 + 4).
    message = (
        r"only 9 examples, fewer than min_target_test_size=30.*T puts 0\.5 on class 1, of which "
        r"the test split has 4 examples"
    )
    with pytest.raises(ValueError, match=message):
        partition_from_label_counts(train, test, counts, seed=0, description="x")
    with pytest.raises(ValueError, match="min_target_test_size=10"):
        partition_from_label_counts(
            train, test, counts, seed=0, description="x", min_target_test_size=10
        )
    # Accepting a small set is an explicit choice.
    p = partition_from_label_counts(
        train, test, counts, seed=0, description="x", min_target_test_size=9
    )
    assert len(p.target_test_indices) == 9
    assert_partition_invariants(p, train, test)


def test_explicit_target_test_size_below_the_minimum_is_an_error(rng):
    train, test, k = random_labels(rng)
    counts = np.stack([np.full(k, 5), np.full(k, 5)])
    with pytest.raises(ValueError, match="only 12 examples, fewer than min_target_test_size=30"):
        partition_from_label_counts(
            train, test, counts, seed=0, description="x", target_test_size=12
        )
    p = partition_from_label_counts(
        train,
        test,
        counts,
        seed=0,
        description="x",
        target_test_size=12,
        min_target_test_size=12,
    )
    assert len(p.target_test_indices) == 12


@pytest.mark.parametrize("scheme", ["sparsity", "niid_bench_sparsity", "dirichlet", "niid_bench"])
def test_every_scheme_enforces_the_minimum_target_test_set(scheme):
    # 2 test examples per class: no target can get a test set of 30.
    train = np.repeat(np.arange(4), 200)
    test = np.repeat(np.arange(4), 2)
    make = {
        "sparsity": lambda **kw: sparsity_partition(train, test, labels_per_client=2, **kw),
        "niid_bench_sparsity": lambda **kw: niid_bench_sparsity_partition(
            train, test, labels_per_client=2, **kw
        ),
        "dirichlet": lambda **kw: dirichlet_partition(train, test, beta=1.0, **kw),
        "niid_bench": lambda **kw: niid_bench_dirichlet_partition(train, test, beta=1.0, **kw),
    }[scheme]
    with pytest.raises(ValueError, match="fewer than min_target_test_size=30"):
        make(num_clients=4, seed=0)
    p = make(num_clients=4, seed=0, min_target_test_size=1)
    assert_partition_invariants(p, train, test)


@pytest.mark.parametrize(
    "value,error,message",
    [
        (0, ValueError, "min_target_test_size must be an integer >= 1, got 0"),
        (2.5, TypeError, "min_target_test_size must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_min_target_test_size_raises(rng, value, error, message):
    train, test, k = random_labels(rng)
    with pytest.raises(error, match=message):
        sparsity_partition(
            train, test, num_clients=3, labels_per_client=1, seed=0, min_target_test_size=value
        )


@pytest.mark.parametrize(
    "bad_train, message",
    [
        (np.array([0, 1, -1, 2]), "negative"),
        (np.array([[0, 1], [1, 0]]), "1-D"),
        (np.array([0.0, 1.0, 2.0]), "integers"),
        (np.array([], dtype=int), "empty"),
    ],
)
def test_malformed_labels_raise(bad_train, message):
    with pytest.raises(ValueError, match=message):
        sparsity_partition(
            bad_train, np.array([0, 1, 2]), num_clients=2, labels_per_client=1, seed=0
        )


def test_labels_outside_num_classes_raise():
    with pytest.raises(ValueError, match="num_classes=3"):
        sparsity_partition(
            np.array([0, 1, 2, 3] * 10),
            np.array([0, 1, 2]),
            num_clients=2,
            labels_per_client=1,
            seed=0,
            num_classes=3,
        )


# ------------------------------------------------------ sparsity (the paper's reading)


def check_paper_sparsity(p, train, test, num_clients, c):
    """Independent check of the paper's "C random labels, an equal number of samples for each
    label, no overlap": every client and the target hold C labels, the SAME count
    min_k floor(n_k / h_k) of each (h_k the holders of label k), disjoint examples."""
    assert_partition_invariants(p, train, test)  # disjointness, histograms, T-distributed sets
    k = p.num_classes
    target_counts = np.bincount(train[p.target_val_indices], minlength=k)
    all_counts = np.vstack([p.client_label_counts, target_counts])
    assert all_counts.shape == (num_clients, k)
    holds = all_counts > 0
    np.testing.assert_array_equal(holds.sum(axis=1), np.full(num_clients, c))
    holders = holds.sum(axis=0)
    available = np.bincount(train, minlength=k)
    per_label = min(available[j] // holders[j] for j in range(k) if holders[j] > 0)
    np.testing.assert_array_equal(all_counts, holds * per_label)
    np.testing.assert_array_equal(p.client_sizes, np.full(num_clients - 1, c * per_label))
    # S_i(Y) and T(Y) uniform over their C labels, exactly.
    np.testing.assert_array_equal(p.target_label_dist, holds[-1] / c)
    np.testing.assert_array_equal(p.client_label_dists, holds[:-1] / c)
    uncovered = [j for j in range(k) if holds[-1, j] and not holds[:-1, j].any()]
    assert p.target_labels_uncovered == uncovered
    assert p.summary()["target_labels_uncovered"] == uncovered
    return per_label


@pytest.mark.parametrize("trial", range(4))
def test_sparsity_gives_every_client_c_labels_with_equal_counts(rng, trial):
    train, test, k = random_labels(rng)
    num_clients = int(rng.integers(2, 12))
    c = int(rng.integers(1, k + 1))
    p = sparsity_partition(train, test, num_clients=num_clients, labels_per_client=c, seed=trial)
    per_label = check_paper_sparsity(p, train, test, num_clients, c)
    assert p.description == (
        f"sparsity C={c} ({per_label} per label), {num_clients} clients "
        f"({num_clients - 1} train + target), seed {trial}"
    )


@pytest.mark.parametrize("seed", range(3))
def test_both_sparsity_readings_draw_the_same_labels_and_differ_in_counts(rng, seed):
    train, test, _ = random_labels(rng, num_classes=10)
    kwargs = dict(num_clients=10, labels_per_client=3, seed=seed)
    paper = sparsity_partition(train, test, **kwargs)
    niid = niid_bench_sparsity_partition(train, test, **kwargs)
    np.testing.assert_array_equal(paper.client_label_counts > 0, niid.client_label_counts > 0)
    np.testing.assert_array_equal(paper.target_label_dist > 0, niid.target_label_dist > 0)
    assert paper.target_labels_uncovered == niid.target_labels_uncovered
    # NIID-Bench uses every example of a held label; the paper's equal counts cannot (the
    # labels have different pools and holders here).
    assert niid.client_label_counts.sum() > paper.client_label_counts.sum()


def test_target_labels_uncovered_are_the_target_labels_no_client_holds():
    counts = np.array([[5, 5, 0, 0], [0, 5, 5, 0], [3, 0, 0, 3]])  # target on {0, 3}
    labels = np.repeat(np.arange(4), 40)
    p = partition_from_label_counts(labels, labels, counts, seed=0, description="t")
    assert p.target_labels_uncovered == [3]
    assert p.summary()["target_labels_uncovered"] == [3]
    counts[0, 3] = 1
    q = partition_from_label_counts(labels, labels, counts, seed=0, description="t")
    assert q.target_labels_uncovered == []


# ------------------------------------------------------ sparsity (NIID-Bench's "#C=k")


def check_niid_bench_sparsity(p, train, test, num_clients, c):
    assert_partition_invariants(p, train, test)
    k = p.num_classes
    target_counts = np.bincount(train[p.target_val_indices], minlength=k)
    all_counts = np.vstack([p.client_label_counts, target_counts])
    assert all_counts.shape[0] == num_clients
    np.testing.assert_array_equal((all_counts > 0).sum(axis=1), np.full(num_clients, c))
    available = np.bincount(train, minlength=k)
    for label in range(k):
        held = all_counts[:, label][all_counts[:, label] > 0]
        if held.size:
            assert held.max() - held.min() <= 1, f"label {label} split unevenly: {held}"
            assert held.sum() == available[label], "a held label must be used entirely"


@pytest.mark.parametrize("trial", range(3))
def test_niid_bench_sparsity_gives_each_client_exactly_c_labels_split_evenly(rng, trial):
    train, test, k = random_labels(rng)
    num_clients = int(rng.integers(2, 12))
    c = int(rng.integers(1, k + 1))
    p = niid_bench_sparsity_partition(
        train, test, num_clients=num_clients, labels_per_client=c, seed=trial
    )
    check_niid_bench_sparsity(p, train, test, num_clients, c)
    assert p.description == (
        f"NIID-Bench sparsity C={c}, {num_clients} clients ({num_clients - 1} train + target), "
        f"seed {trial}"
    )


@pytest.mark.parametrize("scheme", [sparsity_partition, niid_bench_sparsity_partition])
def test_sparsity_is_deterministic_per_seed_and_varies_across_seeds(rng, scheme):
    train, test, _ = random_labels(rng, num_classes=10)
    kwargs = dict(num_clients=10, labels_per_client=3)
    a = scheme(train, test, seed=5, **kwargs)
    assert_same(a, scheme(train, test, seed=5, **kwargs))
    b = scheme(train, test, seed=6, **kwargs)
    assert not np.array_equal(a.client_label_counts, b.client_label_counts) or not np.array_equal(
        a.client_indices, b.client_indices
    )


@pytest.mark.parametrize("scheme", [sparsity_partition, niid_bench_sparsity_partition])
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_clients=5, labels_per_client=0), "labels_per_client"),
        (dict(num_clients=5, labels_per_client=11), "labels_per_client"),
        (dict(num_clients=5, labels_per_client=True), "labels_per_client"),
        (dict(num_clients=1, labels_per_client=2), "num_clients"),
        (dict(num_clients=5, labels_per_client=2, seed=-1), "seed"),
    ],
)
def test_sparsity_rejects_bad_arguments(rng, scheme, kwargs, message):
    train, test, _ = random_labels(rng, num_classes=10)
    kwargs = {"seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        scheme(train, test, **kwargs)


@pytest.mark.parametrize("scheme", [sparsity_partition, niid_bench_sparsity_partition])
def test_sparsity_with_more_holders_than_examples_raises(scheme):
    train = np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="clients hold it"):
        scheme(train, np.array([0, 1]), num_clients=6, labels_per_client=2, seed=0)


# ------------------------------------------------------ Dirichlet (FedPALS)


@pytest.mark.parametrize("beta", [0.05, 0.5, 5.0])
def test_dirichlet_clients_have_exactly_examples_per_client(rng, beta):
    train, test, k = random_labels(rng)
    num_clients = int(rng.integers(2, 10))
    n = int(rng.integers(10, len(train) // num_clients + 1))
    p = dirichlet_partition(
        train, test, num_clients=num_clients, beta=beta, seed=1, examples_per_client=n
    )
    assert_partition_invariants(p, train, test)
    np.testing.assert_array_equal(p.client_sizes, np.full(num_clients - 1, n))
    assert len(p.target_val_indices) == n


def test_dirichlet_that_exhausts_the_pools_uses_every_example_once(rng):
    # num_clients * n == len(train): class pools must run dry, exercising the
    # redraw from the remaining classes.
    train, test, k = random_labels(rng)
    num_clients = 5
    n = len(train) // num_clients
    train = train[: n * num_clients]
    p = dirichlet_partition(train, test, num_clients=num_clients, beta=0.1, seed=2, num_classes=k)
    assert_partition_invariants(p, train, test)
    used = p.client_label_counts.sum(axis=0) + np.bincount(train[p.target_val_indices], minlength=k)
    np.testing.assert_array_equal(used, np.bincount(train, minlength=k))


def test_dirichlet_small_beta_gives_sparse_clients_and_large_beta_dense_ones(rng):
    # Balanced pools large enough that no class runs out (800 of 4000 used).
    train = rng.permutation(np.arange(10).repeat(400))
    test = rng.permutation(np.arange(10).repeat(100))
    sparse = dirichlet_partition(
        train, test, num_clients=8, beta=0.01, seed=0, examples_per_client=100
    )
    dense = dirichlet_partition(
        train, test, num_clients=8, beta=1000.0, seed=0, examples_per_client=100
    )
    assert (sparse.client_label_dists.max(axis=1) > 0.8).mean() > 0.5
    assert np.all(dense.client_label_counts > 0)


def test_dirichlet_is_deterministic_per_seed_and_varies_across_seeds(rng):
    train, test, _ = random_labels(rng)
    a = dirichlet_partition(train, test, num_clients=6, beta=0.3, seed=11)
    assert_same(a, dirichlet_partition(train, test, num_clients=6, beta=0.3, seed=11))
    b = dirichlet_partition(train, test, num_clients=6, beta=0.3, seed=12)
    assert not np.array_equal(a.client_label_counts, b.client_label_counts)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(beta=0.0), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(beta=float("nan")), "beta"),
        (dict(beta=0.1, num_clients=1), "num_clients"),
        (dict(beta=0.1, examples_per_client=0), "examples_per_client"),
        (dict(beta=0.1, examples_per_client=10**6), "exceed"),
    ],
)
def test_dirichlet_rejects_bad_arguments(rng, kwargs, message):
    train, test, _ = random_labels(rng)
    kwargs = {"num_clients": 4, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        dirichlet_partition(train, test, **kwargs)


# ------------------------------------------------------ NIID-Bench Dirichlet


def test_niid_bench_dirichlet_uses_all_data_and_respects_min_size(rng):
    train, test, k = random_labels(rng)
    num_clients = int(rng.integers(2, 8))
    p = niid_bench_dirichlet_partition(
        train, test, num_clients=num_clients, beta=0.5, seed=4, min_size=20
    )
    assert_partition_invariants(p, train, test)
    assert p.client_sizes.min() >= 20 and len(p.target_val_indices) >= 20
    assert p.client_sizes.sum() + len(p.target_val_indices) == len(train)
    assert "NIID-Bench" in p.description
    assert_same(
        p,
        niid_bench_dirichlet_partition(
            train, test, num_clients=num_clients, beta=0.5, seed=4, min_size=20
        ),
    )


def test_niid_bench_dirichlet_stops_feeding_clients_past_their_fair_share(rng):
    # NIID-Bench zeroes q_kj for clients already holding >= N / M examples, so
    # no client exceeds N / M by more than one class's worth.
    train = rng.permutation(np.arange(10).repeat(100))
    test = np.arange(10).repeat(30)  # a target test set of >= 30 for any T
    for seed in range(5):
        p = niid_bench_dirichlet_partition(
            train, test, num_clients=5, beta=0.01, seed=seed, min_size=1
        )
        sizes = np.append(p.client_sizes, len(p.target_val_indices))
        assert sizes.max() < len(train) / 5 + 100, sizes


def test_niid_bench_dirichlet_impossible_min_size_raises(rng):
    train, test, _ = random_labels(rng)
    with pytest.raises(ValueError, match="min_size"):
        niid_bench_dirichlet_partition(
            train, test, num_clients=4, beta=0.5, seed=0, min_size=len(train)
        )
    with pytest.raises(ValueError, match="tries"):
        niid_bench_dirichlet_partition(
            train,
            test,
            num_clients=4,
            beta=0.001,
            seed=0,
            min_size=len(train) // 4,
            max_tries=3,
        )


# ------------------------------------------------------ Oracle resampling


def test_resample_keeps_sizes_follows_label_dist_and_never_uses_validation(rng):
    k = int(rng.integers(3, 12))
    train = rng.permutation(np.arange(k).repeat(200))
    test = rng.permutation(np.arange(k).repeat(50))
    base = dirichlet_partition(train, test, num_clients=5, beta=0.2, seed=0, examples_per_client=30)
    dist = rng.dirichlet(np.full(k, 0.5))
    # Demand per class <= 4 * 30 < 200 - 30 examples outside validation.
    oracle = resample_to_label_dist(base, train, dist, seed=9)
    np.testing.assert_array_equal(oracle.client_sizes, base.client_sizes)
    expected = np.stack([largest_remainder_counts(dist, n) for n in base.client_sizes])
    np.testing.assert_array_equal(oracle.client_label_counts, expected)
    # Demand is small here, so clients stay disjoint: full invariants hold.
    assert_partition_invariants(oracle, train, test)
    for name in ("target_val_indices", "target_test_indices", "target_label_dist"):
        np.testing.assert_array_equal(getattr(oracle, name), getattr(base, name))
    assert "oracle" in oracle.description


# ------------------------------------------------------ held-out calibration share


@pytest.mark.parametrize("fraction", [0.1, 0.25])
def test_hold_out_keeps_a_stratified_share_of_every_client_out_of_training(rng, fraction):
    train, test, k = random_labels(rng)
    base = dirichlet_partition(train, test, num_clients=6, beta=0.5, seed=0)
    split = hold_out_stratified(base, train, fraction, seed=3)
    held = split.held_out_indices
    for i in range(base.num_clients):
        before = base.client_example_indices(i)
        after = split.client_example_indices(i)
        mine = np.intersect1d(held, before)
        # Client i's examples are its training rest and its held-out share, disjointly.
        np.testing.assert_array_equal(np.sort(np.r_[after, mine]), np.sort(before))
        assert np.intersect1d(after, held).size == 0
        counts = base.client_label_counts[i]
        kept = np.bincount(train[mine], minlength=k)
        # Per class: round(fraction * c), but every class the client holds keeps an example.
        expected = np.minimum(np.floor(fraction * counts + 0.5), np.maximum(counts - 1, 0))
        np.testing.assert_array_equal(kept, expected)
        np.testing.assert_array_equal(split.client_label_counts[i], counts - kept)
        assert split.client_sizes[i] == len(after)
    np.testing.assert_array_equal(split.client_label_counts > 0, base.client_label_counts > 0)
    assert len(np.unique(held)) == len(held)
    for name in ("target_val_indices", "target_test_indices", "target_label_dist"):
        np.testing.assert_array_equal(getattr(split, name), getattr(base, name))
    assert split.summary()["n_held_out"] == len(held)
    assert "n_held_out" not in base.summary()  # a plain partition's record is unchanged
    # Deterministic per seed; another seed holds out other examples.
    again = hold_out_stratified(base, train, fraction, seed=3)
    np.testing.assert_array_equal(again.held_out_indices, held)
    other = hold_out_stratified(base, train, fraction, seed=4)
    assert not np.array_equal(np.sort(other.held_out_indices), np.sort(held))
    assert hold_out_stratified(base, train, 0.0, seed=3) is base
    with pytest.raises(ValueError, match="fraction must be a number in"):
        hold_out_stratified(base, train, 1.0, seed=3)


def test_resample_with_scarce_pools_reuses_examples_but_keeps_counts(rng):
    train, test, k = random_labels(rng, num_classes=4, n_train=800)
    base = sparsity_partition(train, test, num_clients=6, labels_per_client=2, seed=0)
    dist = np.zeros(k)
    dist[int(np.argmin(np.bincount(train, minlength=k)))] = 1.0  # rarest class only
    oracle = resample_to_label_dist(base, train, dist, seed=1)
    val = set(base.target_val_indices.tolist())
    for i in range(oracle.num_clients):
        row = oracle.client_indices[i, : oracle.client_sizes[i]]
        np.testing.assert_array_equal(
            np.bincount(train[row], minlength=k), oracle.client_label_counts[i]
        )
        assert not val.intersection(row.tolist())
    np.testing.assert_array_equal(oracle.client_sizes, base.client_sizes)


def test_resample_rejects_bad_label_dist(rng):
    train, test, k = random_labels(rng)
    base = sparsity_partition(train, test, num_clients=3, labels_per_client=k, seed=0)
    with pytest.raises(ValueError, match="label_dist"):
        resample_to_label_dist(base, train, np.full(k, 0.5), seed=0)
    with pytest.raises(ValueError, match="label_dist"):
        resample_to_label_dist(base, train, np.ones(k + 1) / (k + 1), seed=0)


# ------------------------------------------------------ the partition object


def test_partition_arrays_are_read_only_and_summary_is_json(rng):
    train, test, _ = random_labels(rng)
    p = sparsity_partition(train, test, num_clients=4, labels_per_client=2, seed=0)
    with pytest.raises(ValueError, match="read-only"):
        p.client_indices[0, 0] = 1
    summary = json.loads(json.dumps(p.summary()))
    assert summary["num_clients"] == 3 and summary["n_val"] == len(p.target_val_indices)
    assert set(summary) == {
        "projection_distance",
        "num_clients",
        "client_sizes",
        "client_label_counts",
        "client_label_dists",
        "target_label_dist",
        "target_labels_uncovered",
        "n_val",
        "n_test",
        "description",
    }


def test_every_schemes_summary_is_json_with_its_own_fields(rng):
    # One shape for all (5 clients, 6 classes): the summary's projection distance is a FedPALS
    # solve, compiled once per (M, K); the invariants above leave the summary to this test.
    train, test, _ = random_labels(rng, num_classes=6)
    kw = dict(num_clients=6, seed=0)
    base = sparsity_partition(train, test, labels_per_client=2, **kw)
    schemes = {
        "sparsity": base,
        "niid_bench_sparsity": niid_bench_sparsity_partition(
            train, test, labels_per_client=2, **kw
        ),
        "dirichlet": dirichlet_partition(train, test, beta=0.5, **kw),
        "niid_bench_dirichlet": niid_bench_dirichlet_partition(train, test, beta=1.0, **kw),
        "label_counts": partition_from_label_counts(
            train, test, np.full((6, 6), 5), seed=0, description="counts"
        ),
        "oracle": resample_to_label_dist(base, train, base.target_label_dist, seed=1),
        "held_out": hold_out_stratified(base, train, 0.25, seed=2),
    }
    for name, partition in schemes.items():
        summary = json.loads(json.dumps(partition.summary()))
        assert summary["num_clients"] == 5, name
        assert 0.0 <= summary["projection_distance"] <= 2.0, name
        assert ("n_held_out" in summary) == (name == "held_out"), name


# ------------------------------------------------------ real Fashion-MNIST labels


@pytest.mark.parametrize("c", [2, 3])
def test_fmnist_paper_sparsity_partitions(fmnist_labels, c):
    train, test = fmnist_labels
    for seed in range(8):
        p = sparsity_partition(train, test, num_clients=10, labels_per_client=c, seed=seed)
        per_label = check_paper_sparsity(p, train, test, 10, c)
        assert p.num_clients == 9 and per_label >= 6000 // 10
        # T is uniform over C labels with 1000 test examples each: the whole of them.
        assert len(p.target_test_indices) == 1000 * c
        print(f"C={c} seed {seed}: uncovered target labels {p.target_labels_uncovered}")


@pytest.mark.parametrize("c", [2, 3])
def test_fmnist_niid_bench_sparsity_partitions(fmnist_labels, c):
    train, test = fmnist_labels
    for seed in range(3):
        p = niid_bench_sparsity_partition(
            train, test, num_clients=10, labels_per_client=c, seed=seed
        )
        check_niid_bench_sparsity(p, train, test, 10, c)
        # Each label holds 6000 train / 1000 test examples, so the test set
        # can follow T exactly: n_test = 1000 / max_k T_k (up to rounding).
        assert len(p.target_test_indices) >= int(1000 / p.target_label_dist.max()) - 1


def test_fmnist_paper_dirichlet_partition(fmnist_labels):
    train, test = fmnist_labels
    p = dirichlet_partition(train, test, num_clients=10, beta=0.1, seed=0)
    assert_partition_invariants(p, train, test)
    np.testing.assert_array_equal(p.client_sizes, np.full(9, 6000))
    other = dirichlet_partition(train, test, num_clients=10, beta=0.1, seed=1)
    assert not np.array_equal(p.target_label_dist, other.target_label_dist)


def test_summary_reports_the_projection_distance():
    # Target on labels {0, 1}, clients {0, 1} and {2}: T is in the hull only if a
    # client mixes labels 0 and 1 in T's proportions.
    counts = np.array([[5, 5, 0], [0, 0, 10], [6, 4, 0]])
    labels = np.repeat(np.arange(3), 40)
    partition = partition_from_label_counts(labels, labels, counts, seed=0, description="t")
    expected = float(np.sum((np.array([0.6, 0.4, 0.0]) - np.array([0.5, 0.5, 0.0])) ** 2))
    assert abs(partition.summary()["projection_distance"] - expected) < 1e-6
    assert abs(partition.projection_distance - expected) < 1e-6
