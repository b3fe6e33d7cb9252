"""MAPLS (MAP-EM with a Dirichlet prior on T; Ye et al., WACV 2024) as an estimator of T:
checked against the MAP objective maximised by scipy in float64, against EM (concentration 0),
the prior (concentration -> infinity), the closed form of a 2-class toy (a quadratic), and the
authors' adaptive prior weight re-derived from their code; its edge cases, keys and one run."""

import numpy as np
import pytest
from scipy import optimize, stats

import fedjax_pals as fjp
from fedjax_pals.algorithms import target_estimation

MEANS = np.array([-1.5, 0.0, 1.5])
SOURCE = np.array([0.5, 0.3, 0.2])
TARGET = np.array([0.15, 0.25, 0.6])


def _posteriors(x, prior=SOURCE, means=MEANS):
    joint = prior[None, :] * stats.norm.pdf(x[:, None] - means[None, :])
    return joint / joint.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def target_probs():
    rng = np.random.default_rng(0)
    labels = rng.choice(3, size=600, p=TARGET)
    return _posteriors(rng.normal(MEANS[labels], 1.0))


def _map_objective(t, probs, source, concentration):
    """The log posterior of T (up to a constant): sum_j log sum_k T_k / S_k p(k | x_j) +
    sum_k (alpha_k - 1) log T_k, alpha_k - 1 = c / K over the classes S holds."""
    support = source > 0
    likelihood = np.sum(np.log(probs[:, support] @ (t[support] / source[support])))
    return likelihood + concentration / support.sum() * np.sum(np.log(t[support]))


def _scipy_map(probs, source, concentration):
    """Independent float64 reference: the MAP objective maximised by SLSQP over the simplex on
    the support of S (T = 0 elsewhere)."""
    support = source > 0
    k = support.sum()

    def negative(v):
        t = np.zeros(source.shape[0])
        t[support] = v
        return -_map_objective(t, probs, source, concentration)

    result = optimize.minimize(
        negative, np.full(k, 1.0 / k), method="SLSQP", bounds=[(1e-12, 1.0)] * k,
        constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1.0}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert result.success, result.message
    t = np.zeros(source.shape[0])
    t[support] = result.x
    return t


@pytest.mark.parametrize("concentration", [5.0, 60.0, 600.0])
def test_mapls_is_the_maximum_of_the_map_objective(target_probs, concentration):
    estimate = target_estimation.mapls_label_dist(
        target_probs, SOURCE, concentration=concentration)
    reference = _scipy_map(target_probs, SOURCE, concentration)
    np.testing.assert_allclose(estimate, reference, atol=2e-6)
    assert _map_objective(estimate, target_probs, SOURCE, concentration) >= _map_objective(
        reference, target_probs, SOURCE, concentration) - 1e-9
    # The M-step's form: T_k = (sum_j p_T(k | x_j) + alpha_k - 1) / (n + sum alpha - K).
    posterior = target_probs * (estimate / SOURCE)[None, :]
    posterior /= posterior.sum(axis=1, keepdims=True)
    alpha = 1.0 + concentration / 3
    n = target_probs.shape[0]
    np.testing.assert_allclose(
        (posterior.sum(axis=0) + alpha - 1) / (n + 3 * alpha - 3), estimate, atol=1e-9)


def test_mapls_without_a_prior_is_em_and_with_an_overwhelming_one_is_the_prior(target_probs):
    np.testing.assert_allclose(
        target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=0.0),
        target_estimation.em_label_dist(target_probs, SOURCE), atol=1e-12)
    np.testing.assert_allclose(
        target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=1e9),
        np.full(3, 1 / 3), atol=1e-5)
    # In between, the prior pulls the MLE towards uniform: the larger c, the closer.
    mle = target_estimation.em_label_dist(target_probs, SOURCE)
    distances = [
        np.abs(target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=c)
               - 1 / 3).sum() for c in (0.0, 50.0, 500.0, 5000.0)
    ]
    assert distances[0] == pytest.approx(np.abs(mle - 1 / 3).sum())
    assert all(a > b for a, b in zip(distances, distances[1:]))


@pytest.mark.parametrize("a,s,c", [(0.8, 0.5, 10.0), (0.3, 0.7, 100.0), (0.95, 0.2, 1.0)])
def test_mapls_on_two_classes_with_one_posterior_solves_a_quadratic(a, s, c):
    # Every target point has posterior (a, 1 - a) under the source prior (s, 1 - s). With
    # A = a / s, B = (1 - a) / (1 - s), lambda = n / (n + c) and the prior mean m = 1/2, the
    # fixed point t = lambda A t / (A t + B (1 - t)) + (1 - lambda) m solves
    #   (A - B) t^2 + (B - lambda A - (1 - lambda) m (A - B)) t - (1 - lambda) m B = 0,
    # whose one root in (0, 1) is T_0 (the polynomial is < 0 at 0 and > 0 at 1).
    n = 50
    probs = np.tile([a, 1 - a], (n, 1))
    lam, m = n / (n + c), 0.5
    big_a, big_b = a / s, (1 - a) / (1 - s)
    roots = np.roots([big_a - big_b, big_b - lam * big_a - (1 - lam) * m * (big_a - big_b),
                      -(1 - lam) * m * big_b])
    root = [r.real for r in roots if abs(r.imag) < 1e-12 and 0 < r.real < 1]
    assert len(root) == 1
    estimate = target_estimation.mapls_label_dist(probs, [s, 1 - s], concentration=c)
    np.testing.assert_allclose(estimate, [root[0], 1 - root[0]], atol=1e-9)
    # Without the prior the likelihood log(A t + B (1 - t)) is maximised at a vertex.
    em = target_estimation.mapls_label_dist(probs, [s, 1 - s], concentration=0.0)
    assert np.max(em) > 1 - 1e-6 and np.argmax(em) == int(big_a < big_b)


def _authors_prior_weight(mle, source):
    """The authors' `get_lamda` (github.com/ChangkunYe/MAPLS, label_shift/mapls.py) written out
    as their code states it: lam_inv(d, l) = (1 / (1 - l) - 1) / d, lam_forward(d, g) =
    g d / (1 + g d), KL divergences to the uniform prior U."""
    k = len(source)
    uniform = np.full(k, 1.0 / k)

    def kl(p, q):
        return sum(pi * np.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)

    def lam_inv(d, lam):
        return (1 / (1 - lam) - 1) / d

    def lam_forward(d, gamma):
        return gamma * d / (1 + gamma * d)

    su_conf = 1 - lam_forward(kl(source, uniform), lam_inv(0.5, 0.2))
    tu_conf = lam_forward(kl(mle, uniform), lam_inv(0.5, su_conf))
    ts_conf = lam_forward(kl(mle, source), lam_inv(0.5, su_conf))
    return 0.9 * tu_conf + 0.1 * (1 - ts_conf)


def test_mapls_adaptive_prior_weight_is_the_authors(target_probs):
    mle = target_estimation.em_label_dist(target_probs, SOURCE)
    weight = target_estimation.mapls_prior_weight(target_probs, SOURCE)
    assert weight == pytest.approx(_authors_prior_weight(mle, SOURCE), abs=1e-12)
    assert 0 < weight < 1
    # None: that weight, i.e. the concentration c = n (1 - lambda) / lambda.
    n = target_probs.shape[0]
    np.testing.assert_allclose(
        target_estimation.mapls_label_dist(target_probs, SOURCE),
        target_estimation.mapls_label_dist(target_probs, SOURCE,
                                           concentration=n * (1 - weight) / weight),
        atol=1e-10)
    # Closed form: with a uniform source prior KL(S || U) = 0, so the prior's confidence is 1
    # and every MLE away from U gets lambda = 0.9 (conf = 1 for d > 0); one at U gets 0.1.
    uniform_source = _posteriors(np.linspace(-2, 2, 40), np.full(3, 1 / 3))
    assert target_estimation.mapls_prior_weight(uniform_source[:30], np.full(3, 1 / 3)) == (
        pytest.approx(0.9))
    peaked = np.tile([0.2, 0.6, 0.2], (10, 1))  # its MLE is the vertex e_1, far from U
    assert target_estimation.mapls_prior_weight(peaked, np.full(3, 1 / 3)) == (
        pytest.approx(0.9))
    flat = np.full((10, 3), 1 / 3)  # uninformative posteriors: EM stays at S = U
    assert target_estimation.mapls_prior_weight(flat, np.full(3, 1 / 3)) == pytest.approx(0.1)


def test_mapls_edge_cases(target_probs):
    # A class absent from the sources: not identifiable, T^ = 0 there, and the prior spreads
    # over the classes present (as the scipy reference on that support).
    source = np.array([0.6, 0.4, 0.0])
    probs = _posteriors(np.linspace(-3, 3, 200), source)
    estimate = target_estimation.mapls_label_dist(probs, source, concentration=20.0)
    assert estimate[2] == 0.0 and estimate.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(estimate, _scipy_map(probs, source, 20.0), atol=2e-6)
    assert target_estimation.mapls_label_dist(probs, source)[2] == 0.0  # adaptive, too
    # A class absent from the target: EM drives it towards 0, the prior keeps it above
    # (1 - lambda) / K, the prior mean's share.
    rng = np.random.default_rng(3)
    x = rng.normal(MEANS[rng.choice([0, 1], size=400)], 1.0)  # classes 0 and 1 only
    probs = _posteriors(x)
    em = target_estimation.em_label_dist(probs, SOURCE)
    mapls = target_estimation.mapls_label_dist(probs, SOURCE, concentration=40.0)
    assert em[2] < 0.02
    assert mapls[2] >= (1 - 400 / 440) / 3 - 1e-12 and mapls[2] > em[2]
    # Near-singular: classes 1 and 2 give every point the same posterior (their columns are
    # equal), so the likelihood cannot split their mass; the prior (strictly concave) can, and
    # splits it evenly, as the scipy reference does.
    probs = np.stack([target_probs[:, 0], target_probs[:, 1:].sum(axis=1) / 2,
                      target_probs[:, 1:].sum(axis=1) / 2], axis=1)
    source = np.array([0.4, 0.3, 0.3])
    estimate = target_estimation.mapls_label_dist(probs, source, concentration=10.0)
    assert estimate[1] == pytest.approx(estimate[2], abs=1e-9)
    np.testing.assert_allclose(estimate, _scipy_map(probs, source, 10.0), atol=2e-6)
    # Arguments.
    with pytest.raises(ValueError, match="concentration must be >= 0"):
        target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=-1.0)
    with pytest.raises(ValueError, match="concentration must be finite"):
        target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=np.inf)
    with pytest.raises(ValueError, match="source_label_dist has 2 classes"):
        target_estimation.mapls_label_dist(target_probs, [0.5, 0.5])
    with pytest.raises(ValueError, match="method='mapls' needs source_label_dist"):
        target_estimation.estimate_target_label_dist(target_probs, method="mapls")
    np.testing.assert_allclose(
        target_estimation.estimate_target_label_dist(
            target_probs, method="mapls", source_label_dist=SOURCE, concentration=7.0),
        target_estimation.mapls_label_dist(target_probs, SOURCE, concentration=7.0))


def _config(**algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 3
    config.training.batch_size = 8
    config.training.learning_rate = 1.0
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


def test_mapls_keys_are_resolved_and_checked():
    resolved = fjp.validate_config(_config(name="fedpals_unknown_t_mapls"))
    assert resolved.algorithm.target_estimation == "mapls"
    assert resolved.algorithm.target_estimation_concentration is None  # adaptive
    identity = fjp.experiment.config.config_identity(resolved)["algorithm"]
    assert "target_estimation_concentration" not in identity
    fixed = fjp.validate_config(_config(name="fedpals_unknown_t_mapls",
                                        target_estimation_concentration=50.0))
    assert fixed.algorithm.target_estimation_concentration == 50.0
    assert fjp.config_digest(fixed) != fjp.config_digest(resolved)
    # The method key and the config key are the same run.
    assert fjp.config_digest(resolved) == fjp.config_digest(
        _config(name="fedpals", target_estimation="mapls"))
    with pytest.raises(fjp.ConfigError, match="target_estimation_concentration"):
        fjp.validate_config(_config(name="fedpals_unknown_t_mapls",
                                    target_estimation_concentration=-1.0))
    # Another estimator's run, or a known T, does not read it: None, as another method's key.
    other = fjp.validate_config(_config(name="fedpals_unknown_t_em",
                                        target_estimation_concentration=50.0))
    assert other.algorithm.target_estimation_concentration is None
    assert fjp.config_digest(other) == fjp.config_digest(_config(name="fedpals_unknown_t_em"))
    assert fjp.method_label("fedpals_unknown_t_mapls") == (
        "FedPALS (T^ by MAPLS (MAP-EM, Dirichlet prior))")


def test_a_mapls_run_estimates_t_through_the_unknown_target_path(tmp_path):
    results = fjp.train_and_evaluate(
        _config(name="fedpals_unknown_t_mapls", target_estimation_concentration=30.0),
        str(tmp_path), quiet=True)
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["estimator"] == "mapls" for r in records)
    assert any(r["used"] for r in records)
    assert results["config"]["algorithm"]["target_estimation_concentration"] == 30.0
    # The estimate is MAPLS' on the run's model (its records' T^ is on the simplex and off
    # the clients' aggregate, where the server started).
    estimate = np.asarray(records[-1]["estimate"])
    assert estimate.sum() == pytest.approx(1.0) and np.all(estimate >= 0)
