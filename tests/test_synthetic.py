"""Tests for fedjax_pals.data.synthetic: the Gaussian label-shift task of App. C.4."""

import numpy as np
import pytest

from fedjax_pals.data.partitions import largest_remainder_counts
from fedjax_pals.data.synthetic import (
    SYNTHETIC_CLIENT_LABEL_DISTS,
    SYNTHETIC_CLIENT_SIZES,
    SYNTHETIC_MEANS,
    synthetic_label_shift_task,
    synthetic_target_label_dist,
)


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


def test_target_label_dist_interpolates_between_projection_and_exterior_point(rng):
    np.testing.assert_allclose(synthetic_target_label_dist(0.0), [0.5, 0.25, 0.25])
    np.testing.assert_allclose(synthetic_target_label_dist(1.0), [0.0, 0.5, 0.5])
    for delta in rng.random(5):
        t = synthetic_target_label_dist(delta)
        np.testing.assert_allclose(t, [0.5 * (1 - delta), 0.25 + 0.25 * delta, 0.25 + 0.25 * delta])
        assert np.isclose(t.sum(), 1.0)


@pytest.mark.parametrize("delta", [-0.01, 1.5, float("nan"), "0.5"])
def test_delta_outside_unit_interval_raises(delta):
    with pytest.raises(ValueError, match="delta"):
        synthetic_target_label_dist(delta)
    with pytest.raises(ValueError, match="delta"):
        synthetic_label_shift_task(delta, seed=0)


def test_clients_have_the_paper_counts_and_labels(rng):
    delta = float(rng.random())
    ds, part = synthetic_label_shift_task(delta, seed=int(rng.integers(2**31)))
    assert part.num_clients == 2 and part.num_classes == 3
    np.testing.assert_array_equal(part.client_sizes, SYNTHETIC_CLIENT_SIZES)
    np.testing.assert_array_equal(part.client_label_counts, [[20, 20, 0], [9, 0, 9]])
    np.testing.assert_allclose(part.client_label_dists, SYNTHETIC_CLIENT_LABEL_DISTS)
    rows = [part.client_indices[i, : part.client_sizes[i]] for i in range(2)]
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(
            np.bincount(ds.train.y[row], minlength=3), part.client_label_counts[i]
        )
    everything = np.concatenate(rows + [part.target_val_indices])
    # The train split is exactly the clients' examples plus the validation set.
    assert np.array_equal(np.sort(everything), np.arange(len(ds.train)))


def test_target_sets_follow_t_delta(rng):
    delta = float(rng.random())
    num_test, num_val = int(rng.integers(100, 3000)), int(rng.integers(10, 800))
    ds, part = synthetic_label_shift_task(delta, seed=3, num_test=num_test, num_val=num_val)
    t = synthetic_target_label_dist(delta)
    np.testing.assert_allclose(part.target_label_dist, t)
    assert len(ds.test) == num_test and len(part.target_val_indices) == num_val
    np.testing.assert_array_equal(
        np.bincount(ds.test.y[part.target_test_indices], minlength=3),
        largest_remainder_counts(t, num_test),
    )
    np.testing.assert_array_equal(
        np.bincount(ds.train.y[part.target_val_indices], minlength=3),
        largest_remainder_counts(t, num_val),
    )


def test_default_test_set_has_2000_points_and_arrays_have_model_ready_types():
    ds, part = synthetic_label_shift_task(0.0, seed=0)
    assert ds.name == "synthetic" and ds.num_classes == 3
    assert ds.train.x.shape == (40 + 18 + 500, 2) and ds.test.x.shape == (2000, 2)
    assert ds.train.x.dtype == np.float32 and ds.train.y.dtype == np.int32
    assert len(part.target_test_indices) == 2000


def test_inputs_are_unit_variance_gaussians_around_the_paper_means():
    ds, _ = synthetic_label_shift_task(0.5, seed=1, num_test=8000)
    for y in range(3):
        x = ds.test.x[ds.test.y == y].astype(np.float64)
        np.testing.assert_allclose(x.mean(axis=0), SYNTHETIC_MEANS[y], atol=0.12)
        np.testing.assert_allclose(np.cov(x.T), np.eye(2), atol=0.12)


def test_same_seed_same_task_other_seed_other_points():
    a, pa = synthetic_label_shift_task(0.3, seed=7)
    b, pb = synthetic_label_shift_task(0.3, seed=7)
    c, _ = synthetic_label_shift_task(0.3, seed=8)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.test.y, b.test.y)
    np.testing.assert_array_equal(pa.client_indices, pb.client_indices)
    assert not np.array_equal(a.train.x, c.train.x)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_test=0), "num_test must be a positive int, got 0"),
        (dict(num_val=-3), "num_val must be a positive int, got -3"),
        (dict(seed=-1), "seed must be a non-negative int, got -1"),
        (dict(min_target_test_size=0), "min_target_test_size must be an integer >= 1, got 0"),
    ],
)
def test_bad_sizes_or_seed_raise(kwargs, message):
    kwargs = {"seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        synthetic_label_shift_task(0.5, **kwargs)


def test_target_test_set_below_the_minimum_is_an_error_unless_accepted_explicitly():
    with pytest.raises(ValueError, match="num_test=29 is fewer than min_target_test_size=30"):
        synthetic_label_shift_task(0.5, seed=0, num_test=29)
    dataset, _ = synthetic_label_shift_task(0.5, seed=0, num_test=29, min_target_test_size=29)
    assert len(dataset.test) == 29
