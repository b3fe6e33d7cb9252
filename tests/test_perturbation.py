"""perturb_label_dist: T_p = normalise(T + delta max(eps, 0)), eps ~ N(0, I) (App. B.6)."""

import numpy as np
import pytest

from fedjax_pals.algorithms.target_perturbation import _PERTURBATION_STREAM, perturb_label_dist

T = np.array([0.5, 0.5, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("delta", [1e-3, 1e-2, 0.5])
def test_the_formula_with_the_same_noise(delta):
    eps = np.random.default_rng([3, _PERTURBATION_STREAM]).standard_normal(T.size)
    expected = T + delta * np.maximum(eps, 0)
    expected /= expected.sum()
    np.testing.assert_allclose(perturb_label_dist(T, delta, 3), expected, rtol=1e-12)


def test_positive_noise_only_and_larger_delta_moves_further():
    rng_eps = np.random.default_rng([0, _PERTURBATION_STREAM]).standard_normal(T.size)
    distances = []
    for delta in (1e-3, 1e-2, 0.5):
        perturbed = perturb_label_dist(T, delta, 0)
        assert abs(perturbed.sum() - 1) < 1e-12 and (perturbed >= 0).all()
        # Classes whose noise is negative gain nothing (beyond renormalisation).
        np.testing.assert_array_equal(perturbed[(T == 0) & (rng_eps <= 0)], 0.0)
        distances.append(np.abs(perturbed - T).sum())
    assert distances[0] < distances[1] < distances[2]


def test_delta_zero_is_the_identity_and_seeds_are_reproducible():
    np.testing.assert_array_equal(perturb_label_dist(T, 0.0, 1), T)
    np.testing.assert_array_equal(perturb_label_dist(T, 0.5, 1), perturb_label_dist(T, 0.5, 1))
    assert not np.array_equal(perturb_label_dist(T, 0.5, 1), perturb_label_dist(T, 0.5, 2))


@pytest.mark.parametrize(
    "target, delta, seed, error, match",
    [
        (T, -0.1, 0, ValueError, "delta must be a finite number >= 0, got -0.1"),
        (T, float("nan"), 0, ValueError, "delta must be a finite number >= 0"),
        (T, "0.1", 0, TypeError, "delta must be a real number"),
        (T, 0.1, -1, ValueError, "seed must be an integer >= 0, got -1"),
        (T, 0.1, 1.5, TypeError, "seed must be an integer >= 0 or a numpy Generator"),
        ([0.5, 0.6], 0.1, 0, ValueError, "target_label_dist must sum to 1"),
    ],
)
def test_bad_inputs_are_refused(target, delta, seed, error, match):
    with pytest.raises(error, match=match):
        perturb_label_dist(target, delta, seed)
