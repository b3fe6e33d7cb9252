"""Two estimators of T from unlabeled target data, each against an independent float64
reference and closed forms on toy problems, with their edge cases, keys and one run each.

MAPLS (MAP-EM with a Dirichlet prior on T; Ye et al., WACV 2024): against the MAP objective
maximised by scipy, EM (concentration 0), the prior (concentration -> infinity), the root of a
2-class quadratic, and the authors' adaptive prior weight written out from their code.

VRLS (Wu et al., ICLR 2025): the ratio's MLE against scipy on the constrained likelihood and
EM's fixed point (its closed form); the entropy-regularised temperature against a brute-force
grid of the objective written with scipy's log-softmax and entropy, and against the temperature
a known rescaling of calibrated logits undoes."""

import numpy as np
import pytest
from scipy import optimize, special, stats

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


@pytest.mark.parametrize("estimator", ["mapls", "mapls_output_prior"])
def test_a_mapls_run_estimates_t_through_the_unknown_target_path(tmp_path, estimator):
    results = fjp.train_and_evaluate(
        _config(name=f"fedpals_unknown_t_{estimator}", target_estimation_concentration=30.0),
        str(tmp_path), quiet=True)
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["estimator"] == estimator for r in records)
    assert any(r["used"] for r in records)
    assert results["config"]["algorithm"]["target_estimation_concentration"] == 30.0
    # results.json says whether the estimate in use was identified, and which were not.
    assert results["target_estimate_identified"] == [r for r in records if r["used"]][-1][
        "identified"]
    assert results["target_estimation_unidentified_rounds"] == [
        r["round"] for r in records if not r["identified"]]
    # The estimate is MAPLS' on the run's model (its records' T^ is on the simplex and off
    # the clients' aggregate, where the server started).
    estimate = np.asarray(records[-1]["estimate"])
    assert estimate.sum() == pytest.approx(1.0) and np.all(estimate >= 0)


# -- VRLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vrls_data():
    """Exactly calibrated posteriors (under SOURCE) of 3,000 target and 4,000 labeled source
    points, and their logits log p shown at temperature 1/3 (logits 3 log p: over-confident)."""
    rng = np.random.default_rng(5)
    target_labels = rng.choice(3, size=3000, p=TARGET)
    source_labels = rng.choice(3, size=4000, p=SOURCE)
    target = _posteriors(rng.normal(MEANS[target_labels], 1.0))
    source = _posteriors(rng.normal(MEANS[source_labels], 1.0))
    return target, source, source_labels


def _scipy_ratio(probs, source):
    """Independent float64 reference: argmax_{w >= 0, S.w = 1} sum_j log (p_j . w), SLSQP over
    the ratios of the classes S holds (w = 0 elsewhere)."""
    support = source > 0

    def negative(w):
        return -np.sum(np.log(probs[:, support] @ w))

    def gradient(w):
        return -(probs[:, support] / (probs[:, support] @ w)[:, None]).sum(axis=0)

    result = optimize.minimize(
        negative, np.ones(support.sum()), jac=gradient, method="SLSQP",
        bounds=[(0.0, None)] * support.sum(),
        constraints=[{"type": "eq", "fun": lambda w: w @ source[support] - 1.0,
                      "jac": lambda w: source[support]}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert result.success, result.message
    w = np.zeros(source.shape[0])
    w[support] = result.x
    return w


def test_vrls_ratio_is_the_constrained_likelihood_maximum_and_em_s_fixed_point(vrls_data):
    target = vrls_data[0][:600]
    ratio = target_estimation.density_ratio_mle(target, SOURCE)
    reference = _scipy_ratio(target, SOURCE)
    np.testing.assert_allclose(ratio, reference, atol=1e-5)
    assert ratio @ SOURCE == pytest.approx(1.0, abs=1e-12) and np.all(ratio >= 0)
    # Closed form: with T = S w the problem is EM's likelihood on the simplex, so S w^ is the
    # EM fixed point of Saerens et al.: mean_j of the re-weighted posteriors is S w^ itself.
    t = SOURCE * ratio
    reweighted = target * ratio[None, :]
    reweighted /= reweighted.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(reweighted.mean(axis=0), t, atol=1e-8)
    np.testing.assert_allclose(t, target_estimation.em_label_dist(target, SOURCE), atol=1e-12)


def _brute_force_temperature(logits, labels, zeta):
    """The VRLS objective written independently (scipy's log-softmax and entropy), minimised
    by brute force: a grid of inverse temperatures in [0.05, 1] in steps of 1e-3, then steps of
    1e-5 within 2e-3 of its best point."""
    def objective(beta):
        log_probs = special.log_softmax(beta * logits, axis=1)
        cross_entropy = -log_probs[np.arange(len(labels)), labels].mean()
        entropy = stats.entropy(np.exp(log_probs), axis=1).mean()
        return cross_entropy - zeta * entropy

    coarse = np.arange(0.05, 1.0 + 1e-9, 1e-3)
    best = coarse[int(np.argmin([objective(b) for b in coarse]))]
    fine = np.arange(best - 2e-3, best + 2e-3 + 1e-12, 1e-5)
    return fine[int(np.argmin([objective(b) for b in fine]))]


def test_vrls_temperature_minimises_the_entropy_regularised_loss(vrls_data):
    _, source, labels = vrls_data
    logits = 3.0 * np.log(source) + 0.5  # calibrated posteriors shown 3 times too sharp
    fitted = {}
    for zeta in (0.0, 0.1, 0.5):
        fitted[zeta] = target_estimation.fit_vrls_temperature(logits, labels, zeta)
        reference = _brute_force_temperature(logits, labels, zeta)
        assert abs(fitted[zeta] - reference) <= 2e-5, (zeta, fitted[zeta], reference)
        assert target_estimation.vrls_objective(fitted[zeta], logits, labels, zeta) <= (
            target_estimation.vrls_objective(reference, logits, labels, zeta) + 1e-12)
    # Closed form at zeta = 0: temperature scaling undoes the factor 3 (1/3 up to the NLL
    # minimiser's sampling error on 4,000 points, about 2 %).
    assert fitted[0.0] == pytest.approx(1 / 3, rel=0.05)
    # The entropy term rewards softer outputs: d/dbeta (-H) = beta Var_p(z) >= 0, so the
    # minimiser moves down as zeta grows.
    assert fitted[0.5] < fitted[0.1] < fitted[0.0]


def test_vrls_without_regularisation_on_calibrated_logits_is_em_and_recovers_t(vrls_data):
    target, source, labels = vrls_data
    target_logits, source_logits = np.log(target), np.log(source)
    estimate = target_estimation.vrls_label_dist(
        source_logits, labels, target_logits, SOURCE, entropy_weight=0.0)
    beta = target_estimation.fit_vrls_temperature(source_logits, labels, 0.0)
    assert beta == pytest.approx(1.0, rel=0.05)  # already calibrated
    np.testing.assert_allclose(
        estimate, target_estimation.em_label_dist(
            target_estimation.softmax(beta * target_logits), SOURCE), atol=1e-12)
    # The MLE's std at n = 3,000 is about 0.01-0.02 per class here.
    assert np.max(np.abs(estimate - TARGET)) < 0.06, estimate
    # From over-confident logits (x3) VRLS' temperature recovers nearly the same T; EM on their
    # softmax does not.
    sharp = target_estimation.vrls_label_dist(
        3 * source_logits, labels, 3 * target_logits, SOURCE, entropy_weight=0.0)
    np.testing.assert_allclose(sharp, estimate, atol=0.02)
    naive = target_estimation.em_label_dist(target_estimation.softmax(3 * target_logits), SOURCE)
    assert np.max(np.abs(naive - TARGET)) > np.max(np.abs(sharp - TARGET)) + 0.03
    # Through the dispatcher: the caller calibrates, "vrls" is then the ratio's MLE.
    np.testing.assert_allclose(
        target_estimation.estimate_target_label_dist(
            target_estimation.softmax(beta * target_logits), method="vrls",
            source_label_dist=SOURCE),
        estimate, atol=1e-12)


def test_vrls_edge_cases(vrls_data):
    target = vrls_data[0][:600]
    # A class absent from the sources has no ratio: w = 0 and T^ = 0 there.
    source = np.array([0.6, 0.4, 0.0])
    probs = _posteriors(np.linspace(-3, 3, 300), source)
    ratio = target_estimation.density_ratio_mle(probs, source)
    assert ratio[2] == 0.0
    np.testing.assert_allclose(ratio, _scipy_ratio(probs, source), atol=1e-5)
    rng = np.random.default_rng(6)
    labels = rng.choice(2, size=200, p=[0.6, 0.4])
    estimate = target_estimation.vrls_label_dist(
        np.log(probs[:200] + 1e-300), labels, np.log(probs + 1e-300), source)
    assert estimate[2] == 0.0 and estimate.sum() == pytest.approx(1.0)
    # A class absent from the target: its ratio goes to (nearly) 0.
    x = rng.normal(MEANS[rng.choice([0, 1], size=600)], 1.0)
    ratio = target_estimation.density_ratio_mle(_posteriors(x), SOURCE)
    assert ratio[2] * SOURCE[2] < 0.02
    # Near-singular: classes 1 and 2 give every point the same posterior; the likelihood cannot
    # split their mass. The maximum's value is scipy's, and so is the mass they share.
    merged = np.stack([target[:, 0], target[:, 1:].sum(axis=1) / 2,
                       target[:, 1:].sum(axis=1) / 2], axis=1)
    source = np.array([0.4, 0.3, 0.3])
    ratio = target_estimation.density_ratio_mle(merged, source)
    reference = _scipy_ratio(merged, source)
    assert np.sum(np.log(merged @ ratio)) == pytest.approx(np.sum(np.log(merged @ reference)),
                                                           abs=1e-7)
    assert ratio[1:] @ source[1:] == pytest.approx(reference[1:] @ source[1:], abs=1e-5)
    # Arguments.
    logits = np.log(target)
    labels = rng.choice(3, size=600)
    with pytest.raises(ValueError, match="entropy_weight must be"):
        target_estimation.fit_vrls_temperature(logits, labels, -0.1)
    with pytest.raises(ValueError, match="entropy_weight must be"):
        target_estimation.fit_vrls_temperature(logits, labels, 2.0)
    with pytest.raises(ValueError, match="target_logits has 2 classes"):
        target_estimation.vrls_label_dist(logits, labels, logits[:, :2])
    with pytest.raises(ValueError, match="source_labels must lie"):
        target_estimation.vrls_label_dist(logits, np.full(600, 3), logits)
    with pytest.raises(ValueError, match="must be finite"):
        target_estimation.fit_vrls_temperature(np.full((3, 3), np.nan), np.zeros(3, int))


def test_vrls_keys_are_resolved_and_checked():
    resolved = fjp.validate_config(_config(name="fedpals_unknown_t_vrls"))
    assert resolved.algorithm.target_estimation == "vrls"
    assert resolved.algorithm.target_estimation_entropy_weight == (
        target_estimation.VRLS_DEFAULT_ENTROPY_WEIGHT)
    assert fjp.config_digest(resolved) == fjp.config_digest(
        _config(name="fedpals", target_estimation="vrls", target_estimation_entropy_weight=0.1))
    plain = fjp.validate_config(_config(name="fedpals_unknown_t_vrls",
                                        target_estimation_entropy_weight=0.0))
    assert plain.algorithm.target_estimation_entropy_weight == 0.0
    assert fjp.config_digest(plain) != fjp.config_digest(resolved)
    for bad in (-0.1, 1.5):
        with pytest.raises(fjp.ConfigError, match="target_estimation_entropy_weight"):
            fjp.validate_config(_config(name="fedpals_unknown_t_vrls",
                                        target_estimation_entropy_weight=bad))
    # Off VRLS it is None: other estimators' and known-T runs keep their digests.
    for name in ("fedpals_unknown_t_bbse_constrained", "fedpals", "fedavg"):
        other = fjp.validate_config(_config(name=name, target_estimation_entropy_weight=0.3))
        assert other.algorithm.target_estimation_entropy_weight is None
        assert fjp.config_digest(other) == fjp.config_digest(_config(name=name))
        assert "target_estimation_entropy_weight" not in (
            fjp.experiment.config.config_identity(other)["algorithm"])


@pytest.mark.parametrize("estimator", ["vrls", "vrls_output_prior"])
def test_a_vrls_run_estimates_t_through_the_unknown_target_path(tmp_path, estimator):
    results = fjp.train_and_evaluate(_config(name=f"fedpals_unknown_t_{estimator}"),
                                     str(tmp_path), quiet=True)
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["estimator"] == estimator for r in records)
    assert any(r["used"] for r in records)
    # The record's inverse temperature is the entropy-regularised fit's.
    assert all(1e-3 <= r["calibration_beta"] <= 1e3 for r in records)
    assert results["config"]["algorithm"]["target_estimation_entropy_weight"] == 0.1
    estimate = np.asarray(records[-1]["estimate"])
    assert estimate.sum() == pytest.approx(1.0) and np.all(estimate >= 0)


# -- the mean-output prior ----------------------------------------------------------------------


def test_the_output_prior_variants_take_s_as_the_mean_source_output(vrls_data):
    # "mapls_output_prior" / "vrls_output_prior": the same estimators with S the model's mean
    # output on the labeled source data (over the classes the labels hold), not their counts.
    target, source, labels = vrls_data[0][:500], vrls_data[1][:800], vrls_data[2][:800]
    source = source.copy()
    labels = np.where(labels == 2, 1, labels)  # class 2 absent from the source labels
    prior = source.mean(axis=0) * np.array([1.0, 1.0, 0.0])
    prior /= prior.sum()
    assert np.abs(prior - np.bincount(labels, minlength=3) / labels.size).sum() > 0.05
    got = target_estimation.estimate_target_label_dist(
        target, method="mapls_output_prior", source_probs=source, source_labels=labels,
        concentration=25.0)
    np.testing.assert_allclose(
        got, target_estimation.mapls_label_dist(target, prior, concentration=25.0), atol=1e-12)
    assert got[2] == 0.0
    got = target_estimation.estimate_target_label_dist(
        target, method="vrls_output_prior", source_probs=source, source_labels=labels)
    np.testing.assert_allclose(got, target_estimation.em_label_dist(target, prior), atol=1e-12)
    np.testing.assert_allclose(got, prior * _scipy_ratio(target, prior), atol=1e-5)
    with pytest.raises(ValueError, match="'vrls_output_prior' needs source_probs"):
        target_estimation.estimate_target_label_dist(target, method="vrls_output_prior")
    # Their keys are MAPLS' and VRLS'.
    mapls = fjp.validate_config(_config(name="fedpals_unknown_t_mapls_output_prior",
                                        target_estimation_concentration=5.0))
    assert mapls.algorithm.target_estimation_concentration == 5.0
    assert mapls.algorithm.target_estimation_entropy_weight is None
    vrls = fjp.validate_config(_config(name="fedpals_unknown_t_vrls_output_prior",
                                       target_estimation_concentration=5.0))
    assert vrls.algorithm.target_estimation_entropy_weight == 0.1
    assert vrls.algorithm.target_estimation_concentration is None


# -- the unknown-T report --------------------------------------------------------------------


def test_the_unknown_target_report_names_the_new_rows(tmp_path):
    # The ablation's rows (configs/beyond_unknown_target.py, registered by the report) and the
    # package's own variants come out under their labels, with their L1 columns.
    import json
    import os

    from experiments import unknown_target_report as report_lib

    rounds = [1, 2, 3, 4, 5]

    def _write(root, method, seed, accuracy, val_best, estimated=None, l1=None, used=None):
        run = os.path.join(root, "runs", method, "lam=0", f"seed_{seed}")
        os.makedirs(run)
        results = {
            "config": {"seed": seed, "training": {"rounds": 5}, "algorithm": {}},
            "partition": {"target_label_dist": None}, "rounds": rounds,
            "target_accuracy": accuracy, "final_target_accuracy": accuracy[-1],
            "target_accuracy_at_best_val": accuracy[val_best],
        }
        if estimated is not None:
            results["target_estimation_history"] = [
                {"round": r, "estimated_accuracy": e, "target_l1_error": d}
                for r, e, d in zip(rounds, estimated, l1)]
            results["target_estimation_records"] = [
                {"round": r, "used": u, "estimate_l1_error": d / 2}
                for r, u, d in zip(rounds[:-1], used, l1)]
        with open(os.path.join(run, "results.json"), "w") as f:
            json.dump(results, f)

    root = str(tmp_path / "sweep")
    methods = ("unknown_t_mapls", "unknown_t_vrls", "fedpals_unknown_t_mapls",
               "fedpals_unknown_t_vrls")
    for seed in (0, 1):
        _write(root, "fedavg", seed, [0.5, 0.6, 0.6, 0.7, 0.7], 3)
        _write(root, "fedpals", seed, [0.8, 0.9, 0.9, 0.95, 0.94], 3)
        for method in methods:
            _write(root, method, seed, [0.5, 0.7, 0.9, 0.8, 0.85], 2,
                   estimated=[0.5, 0.8, 0.95, 0.9, 0.9], l1=[1.2, 0.4, 0.2, 0.1, 0.05],
                   used=[True] * 4)
    report_lib._register_ablation()
    text = report_lib.report(root)
    labels = {
        "unknown_t_mapls": "FedPALS, T^ by MAPLS (in-sample)",
        "unknown_t_vrls": "FedPALS, T^ by VRLS (in-sample)",
        "fedpals_unknown_t_mapls": "FedPALS (T^ by MAPLS (MAP-EM, Dirichlet prior))",
        "fedpals_unknown_t_vrls":
            "FedPALS (T^ by VRLS (entropy-regularised temperature + ratio MLE))",
    }
    for method in methods:
        assert fjp.method_label(method) == labels[method]
        row = next(line for line in text.splitlines() if line.startswith(f"| {labels[method]} |"))
        assert row.split("|")[6].strip() == "0.100 ± 0.000"  # the L1 after round 4


# -- an estimate that is not identified says so -------------------------------------------------


def test_an_unidentified_estimate_is_flagged_in_the_records_results_progress_and_log(caplog):
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=1.0)
    sizes = partition.client_sizes
    start = sizes @ partition.client_label_dists / sizes.sum()
    algorithm = fjp.fedpals(start, 0.0)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=1, seed=0, method="mapls")
    real = reestimation.estimate
    calls = []

    def estimate(state):  # round 2's model cannot tell classes 1 and 2 apart
        estimate, stats, beta = real(state)
        calls.append(1)
        if len(calls) == 2:
            sums = stats.posterior_sums.copy()
            sums[1:] = np.outer(stats.counts[1:], sums[1:].sum(axis=0) / stats.counts[1:].sum())
            stats = stats._replace(posterior_sums=sums)  # its columns 1 and 2 now equal
        return estimate, stats, beta

    reestimation.estimate = estimate
    with caplog.at_level("WARNING"):
        state, _ = fjp.training.run_training(
            algorithm, model, dataset, partition, training, rounds=4, seed=0,
            update_state=reestimation.update_state)
    records = reestimation.records
    assert [r["round"] for r in records] == [1, 2, 3]
    assert [r["identified"] for r in records] == [True, False, True]
    assert records[1]["sigma_min"] < target_estimation.IDENTIFIED_SIGMA_MIN <= min(
        records[0]["sigma_min"], records[2]["sigma_min"])
    assert all(r["used"] for r in records)  # reported, not gated
    assert "T^ before round 2 is not identified" in caplog.text
    results = reestimation.results(state)
    assert results["target_estimation_unidentified_rounds"] == [2]
    assert results["target_estimate_identified"] is True  # the last one used (round 3)
    reestimation.records = records[:2]
    assert reestimation.results(state)["target_estimate_identified"] is False
    assert reestimation.progress(state)["T^"].endswith(", not identified")
    reestimation.records = []
    assert reestimation.results(state)["target_estimate_identified"] is None
