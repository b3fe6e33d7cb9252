"""DP label marginals: the mechanisms' noise scales against their formulas, the noise against
its scale, the release on the simplex, and the server weights of a run reading the release."""

import math

import jax
import numpy as np
import pytest
from scipy import stats

import fedjax_pals as fjp
from fedjax_pals import privacy
from fedjax_pals.experiment.task import task_summary

# -- noise scales ------------------------------------------------------------------------------


def test_sensitivities_and_the_laplace_scale():
    assert privacy.count_sensitivity("replace", 1) == 2.0
    assert privacy.count_sensitivity("replace", 2) == pytest.approx(math.sqrt(2.0))
    assert privacy.count_sensitivity("add_remove", 1) == 1.0
    assert privacy.count_sensitivity("add_remove", 2) == 1.0
    # b = Delta_1 / epsilon.
    assert fjp.privacy.noise_scale(0.5, "laplace") == pytest.approx(4.0)
    assert fjp.privacy.noise_scale(0.5, "laplace", neighbouring="add_remove") == pytest.approx(2.0)
    assert fjp.privacy.noise_scale(float("inf"), "laplace") == 0.0
    assert fjp.privacy.noise_scale(2.0, "gaussian", delta=1e-5) == pytest.approx(
        fjp.privacy.gaussian_sigma(2.0, 1e-5, math.sqrt(2.0))
    )


def _gaussian_delta(sigma, epsilon, sensitivity):
    """Balle & Wang (2018), Thm. 8, evaluated independently with scipy.stats in float64."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
@pytest.mark.parametrize("sensitivity", [1.0, math.sqrt(2.0)])
def test_the_analytic_gaussian_sigma_is_the_smallest_private_one(epsilon, delta, sensitivity):
    sigma = fjp.privacy.gaussian_sigma(epsilon, delta, sensitivity)
    assert _gaussian_delta(sigma, epsilon, sensitivity) <= delta * (1 + 1e-9)
    assert _gaussian_delta(sigma * (1 - 1e-6), epsilon, sensitivity) > delta
    if epsilon < 1:
        classic = fjp.privacy.gaussian_sigma(epsilon, delta, sensitivity, "classic")
        assert classic == pytest.approx(
            sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
        )
        assert sigma <= classic
    else:
        with pytest.raises(ValueError, match="epsilon < 1 only"):
            fjp.privacy.gaussian_sigma(epsilon, delta, sensitivity, "classic")


# -- the noise -----------------------------------------------------------------------------------

# 200 x 1000 independent draws. For i.i.d. X with variance s^2 and fourth central moment mu4,
# the sample variance has standard error sqrt((mu4 - s^4) / n) (CLT for the second moment), and
# the sample mean sqrt(s^2 / n). Laplace(b): s^2 = 2 b^2, mu4 = 24 b^4, so the variance's
# standard error is sqrt(20 / n) b^2; Gaussian(sigma): mu4 = 3 sigma^4, sqrt(2 / n) sigma^2.
# The bounds below are 6 standard errors (a false alarm with probability < 1e-8).
# The kurtosis mu4 / s^4 tells the two apart: 6 for Laplace, 3 for the Gaussian; its standard
# error is at most sqrt((mu8 - mu4^2) / n) / s^4: Laplace (8! b^8 - 576 b^8)^(1/2) / (4 b^4)
# ~ 50 / sqrt(n) = 0.11, Gaussian sqrt(96 / n) = 0.022.
SHAPE = (200, 1000)
N_DRAWS = SHAPE[0] * SHAPE[1]


@pytest.mark.parametrize(
    "mechanism, epsilon, delta, neighbouring",
    [
        ("laplace", 0.5, None, "replace"),
        ("laplace", 2.0, None, "add_remove"),
        ("gaussian", 1.0, 1e-5, "replace"),
        ("gaussian", 0.3, 1e-3, "add_remove"),
    ],
)
def test_the_noise_has_the_mechanisms_distribution_and_scale(
    mechanism, epsilon, delta, neighbouring
):
    counts = np.full(SHAPE, 1000.0)
    noisy = fjp.privacy.noisy_label_counts(
        counts, epsilon, mechanism, jax.random.PRNGKey(7), delta=delta, neighbouring=neighbouring
    )
    noise = (noisy - counts).ravel()
    scale = fjp.privacy.noise_scale(epsilon, mechanism, delta=delta, neighbouring=neighbouring)
    if mechanism == "laplace":
        assert scale == privacy.count_sensitivity(neighbouring, 1) / epsilon
        variance, mu4, kurtosis, kurtosis_se = 2 * scale**2, 24 * scale**4, 6.0, 0.11
    else:
        sensitivity = privacy.count_sensitivity(neighbouring, 2)
        assert scale == fjp.privacy.gaussian_sigma(epsilon, delta, sensitivity)
        variance, mu4, kurtosis, kurtosis_se = scale**2, 3 * scale**4, 3.0, 0.022
    assert abs(noise.mean()) <= 6 * math.sqrt(variance / N_DRAWS)
    assert abs(noise.var() - variance) <= 6 * math.sqrt((mu4 - variance**2) / N_DRAWS)
    empirical_kurtosis = np.mean((noise - noise.mean()) ** 4) / noise.var() ** 2
    assert abs(empirical_kurtosis - kurtosis) <= 6 * kurtosis_se


def test_the_release_is_reproducible_from_its_key():
    counts = np.array([[30, 0, 10], [1, 1, 1]])
    first = fjp.privacy.private_label_dists(counts, 1.0, "laplace", jax.random.PRNGKey(3))
    again = fjp.privacy.private_label_dists(counts, 1.0, "laplace", jax.random.PRNGKey(3))
    other = fjp.privacy.private_label_dists(counts, 1.0, "laplace", jax.random.PRNGKey(4))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    np.testing.assert_array_equal(fjp.privacy.private_label_dists(counts, 1.0, "laplace", 3), first)


# -- post-processing onto the simplex ------------------------------------------------------------


def _bisection_projection(v):
    """Independent float64 reference: p = max(v - theta, 0), theta solving sum p = 1 by
    bisection (the sum is continuous and decreasing in theta)."""
    low, high = v.min() - 1.0, v.max()
    for _ in range(200):
        theta = 0.5 * (low + high)
        if np.maximum(v - theta, 0).sum() > 1:
            low = theta
        else:
            high = theta
    return np.maximum(v - 0.5 * (low + high), 0)


@pytest.mark.parametrize(
    "values,message",
    [
        ([0.2, np.nan, 0.5], "project_to_simplex got NaN entries"),
        ([[0.2, 0.3], [np.inf, 0.1]], "project_to_simplex got infinite entries"),
        ([], r"non-empty vector .* got shape \(0,\)"),
        (np.zeros((3, 0)), r"non-empty vector .* got shape \(3, 0\)"),
        (np.zeros((0, 4)), r"non-empty vector .* got shape \(0, 4\)"),
        (0.5, r"non-empty vector .* got shape \(\)"),
        (["a", "b"], "needs a numeric array"),
    ],
)
def test_projection_onto_the_simplex_refuses_what_has_no_projection(values, message):
    # Before: NaN in, NaN out; an empty input raised numpy's reshape error.
    with pytest.raises(ValueError, match=message):
        fjp.privacy.project_to_simplex(values)


def test_projection_onto_the_simplex_matches_an_independent_reference():
    rng = np.random.default_rng(0)
    values = rng.normal(scale=2.0, size=(50, 7))
    got = fjp.privacy.project_to_simplex(values)
    ref = np.stack([_bisection_projection(v) for v in values])
    np.testing.assert_allclose(got, ref, atol=1e-12)
    # The release with projection is exactly the projection of c~ / n_i (same key, same c~).
    counts = rng.integers(0, 30, size=(5, 7))
    counts[:, 0] += 1
    key = jax.random.PRNGKey(1)
    noisy = fjp.privacy.noisy_label_counts(counts, 0.5, "gaussian", key, delta=1e-5)
    released = fjp.privacy.private_label_dists(counts, 0.5, "gaussian", key, delta=1e-5)
    sizes = counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(
        released, np.stack([_bisection_projection(v) for v in noisy / sizes]), atol=1e-12
    )
    clipped = fjp.privacy.private_label_dists(counts, 0.5, "gaussian", key, delta=1e-5, postprocess="clip")
    kept = np.maximum(noisy, 0)
    np.testing.assert_allclose(clipped, kept / kept.sum(axis=1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize("mechanism, delta", [("laplace", None), ("gaussian", 1e-5)])
@pytest.mark.parametrize("postprocess", ["projection", "clip"])
@pytest.mark.parametrize("neighbouring", ["replace", "add_remove"])
def test_the_release_is_on_the_simplex(mechanism, delta, postprocess, neighbouring):
    counts = np.array([[5, 0, 0, 1], [100, 200, 0, 0], [1, 1, 1, 1]])
    for seed in range(20):
        for epsilon in (0.01, 1.0):
            got = fjp.privacy.private_label_dists(
                counts,
                epsilon,
                mechanism,
                seed,
                delta=delta,
                postprocess=postprocess,
                neighbouring=neighbouring,
            )
            assert got.shape == counts.shape and np.all(got >= 0)
            np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-12)
    target = fjp.privacy.private_label_dists([3, 0, 7], 1.0, mechanism, 0, delta=delta)  # one (K,) T
    assert target.shape == (3,) and target.sum() == pytest.approx(1.0)


def test_epsilon_infinity_releases_the_exact_marginals_and_noise_shrinks_with_epsilon():
    counts = np.array([[3, 0, 7], [10, 10, 0]])
    exact = counts / counts.sum(axis=1, keepdims=True)
    for mechanism, delta in (("laplace", None), ("gaussian", 1e-5)):
        for postprocess in ("projection", "clip"):
            got = fjp.privacy.private_label_dists(
                counts, float("inf"), mechanism, 0, delta=delta, postprocess=postprocess
            )
            np.testing.assert_array_equal(got, exact)
        errors = [
            np.abs(fjp.privacy.private_label_dists(counts, eps, mechanism, 0, delta=delta) - exact).max()
            for eps in (0.1, 10.0, 1e6)
        ]
        assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-3


def test_the_privacy_arguments_are_validated():
    counts = [[1, 2], [3, 4]]
    cases = [
        (dict(epsilon=0.0), "epsilon must be a number > 0"),
        (dict(epsilon=float("nan")), "epsilon must be a number > 0"),
        (dict(epsilon=1.0, mechanism="exponential"), "unknown mechanism"),
        (dict(epsilon=1.0, mechanism="gaussian"), "needs delta in"),
        (dict(epsilon=1.0, mechanism="gaussian", delta=1.0), "needs delta in"),
        (dict(epsilon=1.0, delta=1e-5), "pure epsilon-DP"),
        (dict(epsilon=1.0, neighbouring="swap"), "unknown neighbouring"),
        (dict(epsilon=1.0, postprocess="round"), "unknown postprocess"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            fjp.privacy.private_label_dists(counts, key=0, **kwargs)
    with pytest.raises(ValueError, match="at least one example"):
        fjp.privacy.private_label_dists([[0, 0], [1, 1]], 1.0, key=0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        fjp.privacy.private_label_dists([[-1, 2]], 1.0, key=0)
    with pytest.raises(ValueError, match="PRNG key"):
        fjp.privacy.private_label_dists(counts, 1.0)


# -- the server's weights on the release --------------------------------------------------------


def _synthetic_config(**algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


def test_a_run_with_label_dp_solves_eq_8_on_the_release():
    task = fjp.build_task(_synthetic_config(label_dp_epsilon=0.5, lam=1.0))
    p = task.partition
    released = task.server_label_dists
    assert released is not None and released.shape == p.client_label_dists.shape
    np.testing.assert_allclose(released.sum(axis=1), 1.0, atol=1e-12)
    assert not np.allclose(released, p.client_label_dists, atol=1e-3)
    # The clients keep their exact data; the server's weights see the release.
    np.testing.assert_array_equal(p.client_label_counts.sum(axis=1), p.client_sizes)
    alpha = task_summary(task)["alpha"]
    np.testing.assert_array_equal(task_summary(task)["server_label_dists"], released)
    np.testing.assert_allclose(
        alpha, fjp.fedpals_weights(released, p.target_label_dist, p.client_sizes, 1.0), atol=1e-6
    )
    # Reproducible from the seed; a huge epsilon is the exact run.
    again = fjp.build_task(_synthetic_config(label_dp_epsilon=0.5, lam=1.0))
    np.testing.assert_array_equal(again.server_label_dists, released)
    exact = fjp.build_task(_synthetic_config(lam=1.0))
    assert exact.server_label_dists is None
    loose = fjp.build_task(_synthetic_config(label_dp_epsilon=1e9, lam=1.0))
    np.testing.assert_allclose(
        task_summary(loose)["alpha"], task_summary(exact)["alpha"], atol=1e-5
    )
    # The ESS search runs on the release too.
    ess = fjp.build_task(_synthetic_config(label_dp_epsilon=0.5, ess_fraction=0.9))
    np.testing.assert_allclose(
        float(
            fjp.effective_sample_size(
                fjp.fedpals_weights(released, p.target_label_dist, p.client_sizes, ess.context.lam),
                p.client_sizes,
            )
        ),
        0.9 * p.client_sizes.sum(),
        rtol=1e-3,
    )


def test_the_label_dp_config_keys():
    gaussian = fjp.validate_config(
        {"algorithm": {"label_dp_epsilon": 1.0, "label_dp_mechanism": "gaussian"}}
    )
    assert gaussian.algorithm.label_dp_delta == 1e-5
    laplace = fjp.validate_config({"algorithm": {"label_dp_epsilon": 1.0}})
    assert laplace.algorithm.label_dp_mechanism == "laplace"
    assert laplace.algorithm.label_dp_delta is None
    # Methods whose weights do not read S: the keys resolve to None (the same run as without).
    fedavg = fjp.validate_config({"algorithm": {"name": "fedavg", "label_dp_epsilon": 1.0}})
    assert fedavg.algorithm.label_dp_epsilon is None
    assert fjp.config_digest(fedavg) == fjp.config_digest({"algorithm": {"name": "fedavg"}})
    assert (
        fjp.validate_config(
            {"algorithm": {"name": "feddisco", "label_dp_epsilon": 2.0}}
        ).algorithm.label_dp_epsilon
        == 2.0
    )
    assert fjp.config_digest({"algorithm": {"label_dp_epsilon": 1.0}}) != fjp.config_digest(
        fjp.default_config()
    )
    for algorithm, match in (
        ({"label_dp_epsilon": 0.0}, "label_dp_epsilon must be a finite number > 0"),
        ({"label_dp_epsilon": 1.0, "label_dp_mechanism": "rr"}, "label_dp_mechanism must be"),
        (
            {"label_dp_epsilon": 1.0, "label_dp_mechanism": "gaussian", "label_dp_delta": 1.0},
            "label_dp_delta must be",
        ),
        (
            {"label_dp_epsilon": 1.0, "label_dp_mechanism": "gaussian", "label_dp_delta": None},
            "label_dp_delta is None",
        ),
    ):
        with pytest.raises(fjp.ConfigError, match=match):
            fjp.validate_config({"algorithm": algorithm})


def test_the_private_marginals_sweep_validates_and_runs_with_tiny_overrides(tmp_path):
    from config_files import load_config

    config = load_config("beyond_private_marginals.py")
    runs = fjp.expand_sweep(config)
    assert len(runs) == 156
    epsilons = {run.algorithm.label_dp_epsilon for _, run in runs}
    assert epsilons == {None, 1.0, 0.1, 0.01, 0.001}
    # Tiny: the synthetic task, 2 rounds, one seed; FedPALS at lam = 0 for each epsilon.
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.training.batch_size = 8
    config.sweep.seeds = (0,)
    config.sweep.axes = {"algorithm": {"label_dp_epsilon": (None, 0.1)}}
    config.sweep.grid.algorithm.ess_fraction = (0.9,)
    outcome = fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert outcome["errors"] == {}
    assert set(outcome["runs"].values()) == {"done"}, outcome["runs"]
    # FedPALS at two lambdas per epsilon; FedAvg once (it does not read S).
    assert len(outcome["runs"]) == 2 * 2 + 1


def test_label_dp_with_an_estimated_target_is_refused_before_data_is_read():
    # T's estimator reads the clients' exact label counts: the release would not bound what
    # the server learns of them.
    config = _synthetic_config(label_dp_epsilon=1.0, target_estimation="bbse", lam=0.0)
    with pytest.raises(fjp.ConfigError, match="label_dp_epsilon is set, but algorithm."
                       "target_estimation reads the clients' exact label distributions"):
        fjp.validate_config(config)
    fjp.validate_config(_synthetic_config(label_dp_epsilon=1.0))  # each alone is accepted
    fjp.validate_config(_synthetic_config(target_estimation="bbse", lam=0.0))
