"""Tests for fedjax_pals.data.pachinko: TFF's Pachinko allocation as a label-shift partition."""

import dataclasses

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.data import pachinko
from fedjax_pals.data import partitions as partitions_lib
from fedjax_pals.data.pachinko import pachinko_partition
from fedjax_pals.experiment import task as task_lib

CIFAR100_LIKE = np.repeat(np.arange(20), 5)  # 20 coarse classes of 5 fine classes


def _reference_counts(train, coarse, num_clients, n, alpha, beta, seed):
    """The Pachinko draw written plainly in float64 NumPy: every weight recomputed before every
    example from what is left (the module caches them between exhaustions), from the same
    random stream in the same order (p, then q per coarse class, the serving order, then per
    client its (n, 2) uniforms)."""
    rng = np.random.default_rng([partitions_lib._STREAM_LABELS, seed])
    ids = np.unique(coarse)
    groups = [np.flatnonzero(coarse == g) for g in ids]
    p = rng.dirichlet(np.full(len(groups), alpha), size=num_clients)
    q = [rng.dirichlet(np.full(len(g), beta), size=num_clients) for g in groups]
    remaining = np.bincount(train, minlength=len(coarse))
    counts = np.zeros((num_clients, len(coarse)), np.int64)

    def draw(weights, left, u):
        w = np.where(left > 0, weights, 0.0)
        if w.sum() <= 0:
            w = left.astype(np.float64)
        cum = np.cumsum(w)
        i = int(np.searchsorted(cum, u * cum[-1], side="right"))
        return i if i < len(w) else int(np.flatnonzero(w > 0)[-1])

    for i in rng.permutation(num_clients):
        for u_coarse, u_fine in rng.random((n, 2)):
            left = np.array([remaining[g].sum() for g in groups])
            g = draw(p[i], left, u_coarse)
            k = groups[g][draw(q[g][i], remaining[groups[g]], u_fine)]
            counts[i, k] += 1
            remaining[k] -= 1
    return counts


def _all_counts(partition, train):
    """(num_clients, K) counts, the target's (its validation set: its whole share) last."""
    target = np.bincount(train[partition.target_val_indices], minlength=partition.num_classes)
    return np.vstack([partition.client_label_counts, target])


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(
    "per_class, num_clients, n, alpha, beta",
    [
        (60, 8, 40, 0.1, 10.0),  # pools outlast the draws: few exhaustions
        (12, 10, 12, 0.1, 10.0),  # every example used: classes and coarse classes run out
        (12, 10, 12, 0.5, 0.05),  # fine classes concentrated: fine exhaustion within a coarse
    ],
)
def test_counts_equal_a_plain_float64_reimplementation(seed, per_class, num_clients, n, alpha,
                                                       beta):
    coarse = np.array([3, 3, 3, 0, 0, 7, 7, 7, 7, 1])  # uneven groups, ids not 0..G-1
    train = np.repeat(np.arange(10), per_class)
    test = np.repeat(np.arange(10), 20)
    made = pachinko_partition(train, test, coarse, num_clients=num_clients, seed=seed,
                              examples_per_client=n, coarse_alpha=alpha, fine_beta=beta)
    expected = _reference_counts(train, coarse, num_clients, n, alpha, beta, seed)
    np.testing.assert_array_equal(_all_counts(made, train), expected)
    assert np.all(expected.sum(axis=1) == n)
    assert np.all(expected.sum(axis=0) <= per_class)
    assert partitions_lib.partition_problem(made, train, test) is None


def test_deterministic_given_the_seed_and_different_across_seeds():
    train = np.repeat(np.arange(100), 40)
    test = np.repeat(np.arange(100), 10)
    a, b = (pachinko_partition(train, test, CIFAR100_LIKE, num_clients=12, seed=5)
            for _ in range(2))
    for field in ("client_indices", "client_label_counts", "target_val_indices",
                  "target_test_indices", "target_label_dist"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    c = pachinko_partition(train, test, CIFAR100_LIKE, num_clients=12, seed=6)
    assert not np.array_equal(a.client_label_counts, c.client_label_counts)
    # Default examples_per_client: the training examples / num_clients (4000 / 12).
    assert a.client_sizes.tolist() == [333] * 11 and len(a.target_val_indices) == 333
    assert "pachinko coarse_alpha=0.1 fine_beta=10" in a.description


@pytest.mark.parametrize("seed", range(6))
def test_a_fine_class_that_runs_out_passes_its_share_to_its_siblings_not_other_coarse_classes(
    seed
):
    """With alpha, beta -> 0 every client puts all its mass on one fine class of one coarse
    class. Two clients take all 4 x 30 examples, 60 each: the first served exhausts its fine
    class, then (renormalising within its coarse class) takes the sibling's 30; the second, its
    own coarse class maybe exhausted, is renormalised over the coarse classes left. So each
    holds exactly one whole coarse class. Renormalising the joint (coarse, fine) distribution
    instead would scatter the rest over both coarse classes."""
    coarse = np.array([0, 0, 1, 1])
    train = np.repeat(np.arange(4), 30)
    test = np.repeat(np.arange(4), 30)
    made = pachinko_partition(train, test, coarse, num_clients=2, seed=seed,
                              examples_per_client=60, coarse_alpha=1e-4, fine_beta=1e-4)
    rows = sorted(_all_counts(made, train).tolist())
    assert rows == [[0, 0, 30, 30], [30, 30, 0, 0]]


def _unbiased_concentration(counts):
    """Per row, sum_k c_k (c_k - 1) / (m (m - 1)): unbiased for sum_k p_k^2 of the
    distribution p that the row's m >= 2 draws came from."""
    m = counts.sum(axis=1)
    return (counts * (counts - 1)).sum(axis=1) / (m * (m - 1))


def test_coarse_concentrated_as_alpha_implies_and_fine_near_uniform_for_beta_10():
    """E sum_g p_g^2 = (a + 1) / (G a + 1) under Dir_G(a): 1.1 / 3 for a = 0.1, G = 20 (a
    uniform p would give 0.05); for the fine classes, (b + 1) / (S b + 1) = 11 / 51 = 0.216 for
    b = 10, S = 5 (uniform: 0.2). Pools large enough that no class runs out, so the clients'
    counts are multinomial draws from their (p, q); tolerance 5 standard errors of the mean
    over clients (and client-coarse pairs)."""
    num_clients, n = 600, 100
    train = np.repeat(np.arange(100), 3000)  # 600 x 100 draws never exhaust 3000 per class
    counts = pachinko.pachinko_counts(
        np.random.default_rng(11), train, num_clients, [np.arange(5 * g, 5 * g + 5)
                                                        for g in range(20)],
        examples_per_client=n, coarse_alpha=0.1, fine_beta=10.0,
    )
    assert np.all(counts.sum(axis=1) == n) and counts.max() < 3000
    per_coarse = counts.reshape(num_clients, 20, 5)
    coarse_h = _unbiased_concentration(per_coarse.sum(axis=2))
    se = coarse_h.std(ddof=1) / np.sqrt(num_clients)
    assert abs(coarse_h.mean() - 1.1 / 3) < 5 * se, (coarse_h.mean(), se)
    assert coarse_h.mean() > 0.25  # far from a spread-out p
    # Fine given coarse: the (client, coarse) pairs with at least 20 draws.
    fine = per_coarse.reshape(-1, 5)
    fine = fine[fine.sum(axis=1) >= 20]
    fine_h = _unbiased_concentration(fine)
    se = fine_h.std(ddof=1) / np.sqrt(len(fine))
    assert len(fine) > 1000
    assert abs(fine_h.mean() - 11 / 51) < 5 * se, (fine_h.mean(), se)
    # Near uniform: the shares of each fine class within its coarse class average 1/5.
    shares = fine / fine.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(shares.mean(axis=0), 0.2, atol=5 * shares.std(axis=0).max()
                               / np.sqrt(len(fine)))


def test_every_example_used_when_clients_take_the_whole_split():
    train = np.repeat(np.arange(100), 20)
    test = np.repeat(np.arange(100), 5)
    made = pachinko_partition(train, test, CIFAR100_LIKE, num_clients=20, seed=2,
                              examples_per_client=100)
    counts = _all_counts(made, train)
    np.testing.assert_array_equal(counts.sum(axis=0), np.full(100, 20))
    assert partitions_lib.partition_problem(made, train, test) is None


def test_classes_without_training_examples_are_never_drawn():
    train = np.repeat(np.arange(100), 30)
    train = train[(train % 5 != 0) & (train >= 10)]  # fine class 0 of each coarse, coarse 0, 1
    test = np.repeat(np.arange(100), 5)
    made = pachinko_partition(train, test, CIFAR100_LIKE, num_clients=10, seed=4)
    counts = _all_counts(made, train)
    assert counts[:, ::5].sum() == 0 and counts[:, :10].sum() == 0
    assert np.all(counts.sum(axis=1) == len(train) // 10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(coarse_labels=np.zeros(9, int)), r"coarse class .* of each of the K = 10"),
        (dict(coarse_labels=-np.ones(10, int)), "non-negative integer"),
        (dict(coarse_labels=np.zeros(10)), "non-negative integer"),
        (dict(coarse_alpha=0.0), "coarse_alpha must be"),
        (dict(fine_beta=-1.0), "fine_beta must be"),
        (dict(examples_per_client=0), "examples_per_client must be a positive int"),
        (dict(examples_per_client=2.5), "examples_per_client must be a positive int"),
        (dict(examples_per_client=21), r"4 clients x 21 examples exceed the 80"),
        (dict(num_clients=1), "num_clients"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = dict(coarse_labels=np.arange(10) // 2, num_clients=4, seed=0, num_classes=10)
    args.update(kwargs)
    coarse = args.pop("coarse_labels")
    with pytest.raises(ValueError, match=message):
        pachinko_partition(np.repeat(np.arange(10), 8), np.arange(10).repeat(5), coarse, **args)


# ---- The scheme "pachinko" -------------------------------------------------


def _coarse_dataset(name="coarse_toy", coarse=True, n_per_class=40):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(20), n_per_class).astype(np.int32)
    yt = np.repeat(np.arange(20), 10).astype(np.int32)
    return fjp.Dataset(
        name, fjp.LabeledSplit(rng.normal(size=(len(y), 3)).astype(np.float32), y),
        fjp.LabeledSplit(rng.normal(size=(len(yt), 3)).astype(np.float32), yt), 20, "toy",
        coarse_labels=np.arange(20) // 4 if coarse else None,
    )


def _config(dataset, **partition):
    return {"dataset": {"name": dataset}, "partition": {"scheme": "pachinko", **partition}}


def test_the_scheme_is_registered_with_its_keys_and_builds_from_the_config(registries_restored):
    scheme = fjp.data.registered_partitions()["pachinko"]
    assert scheme.hyperparameters is pachinko.PachinkoHyperparameters
    fields = partitions_lib.partition_fields()
    assert fields["pachinko_coarse_alpha"][0] == 0.1 and fields["pachinko_fine_beta"][0] == 10.0
    assert fields["pachinko_examples_per_client"][0] is None
    fjp.register_dataset("coarse_toy", lambda: _coarse_dataset(), num_classes=20, num_train=800,
                         images=False)
    resolved = fjp.validate_config(_config("coarse_toy", num_clients=5, pachinko_fine_beta=2.0,
                                           pachinko_examples_per_client=100))
    p = resolved.partition
    assert (p.pachinko_coarse_alpha, p.pachinko_fine_beta, p.pachinko_examples_per_client) == (
        0.1, 2.0, 100)
    assert p.labels_per_client is None and p.dirichlet_beta is None
    assert scheme.label(p) == "pachinko alpha=0.1 beta=2"
    dataset, partition = task_lib.load_data(resolved)
    expected = pachinko_partition(dataset.train.y, dataset.test.y, dataset.coarse_labels,
                                  num_clients=5, seed=resolved.seed, examples_per_client=100,
                                  fine_beta=2.0)
    np.testing.assert_array_equal(partition.client_indices, expected.client_indices)
    assert partition.num_clients == 4 and partition.client_sizes.tolist() == [100] * 4
    # Other schemes' runs: the keys resolve to None.
    other = fjp.validate_config({})
    assert other.partition.pachinko_coarse_alpha is None


def test_a_data_set_without_coarse_labels_is_refused(registries_restored):
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.scheme='pachinko' .* data "
                       r"set 'cifar10' has no coarse labels"):
        fjp.validate_config(_config("cifar10", num_clients=5))
    # One the registration cannot tell: refused when it is loaded, naming it.
    fjp.register_dataset("flat_toy", lambda: _coarse_dataset("flat_toy", coarse=False),
                         num_classes=20, num_train=800, images=False)
    resolved = fjp.validate_config(_config("flat_toy", num_clients=5))
    with pytest.raises(ValueError, match=r"data set 'flat_toy' has no coarse labels"):
        task_lib.load_data(resolved)
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.pachinko_examples_per_client="
                       r"401 is more than half the 800 training examples"):
        fjp.validate_config(_config("flat_toy", num_clients=2, pachinko_examples_per_client=401))
    with pytest.raises(fjp.ConfigError, match=r"pachinko_coarse_alpha"):
        fjp.validate_config(_config("flat_toy", num_clients=5, pachinko_coarse_alpha=0.0))


def test_hyperparameters_are_frozen_and_checked():
    values = pachinko.PachinkoHyperparameters()
    with pytest.raises(dataclasses.FrozenInstanceError):
        values.pachinko_fine_beta = 1.0
    with pytest.raises(ValueError, match="pachinko_fine_beta"):
        pachinko.PachinkoHyperparameters(pachinko_fine_beta=-1.0)
    with pytest.raises(ValueError, match="pachinko_examples_per_client"):
        pachinko.PachinkoHyperparameters(pachinko_examples_per_client=0)
