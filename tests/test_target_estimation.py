"""Estimating T(Y) from unlabeled target data: EM and BBSE recover a known T on Gaussian classes
with exactly calibrated posteriors, within bounds derived from their asymptotic variances;
BCTS + MLLS recovers it from miscalibrated logits where EM does not; constrained soft BBSE is
the float64 minimiser of its QP; the re-estimation's gate and damping act as they say."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fedjax_pals as fjp
from fedjax_pals import calibration
from fedjax_pals.algorithms import target_estimation

# Three 1-D Gaussian classes N(mu_y, 1); the source (the clients' pooled data) has prior S, the
# target T. Under label shift p(x|y) is shared, and p_S(y|x) = S_y phi_y(x) / sum_j S_j phi_j(x)
# is the exactly calibrated source posterior.
MEANS = np.array([-2.0, 0.0, 2.0])
SOURCE = np.array([0.5, 0.3, 0.2])
TARGET = np.array([0.1, 0.3, 0.6])
N_TARGET = 40_000
N_SOURCE = 200_000


def _sample(prior, n, rng):
    labels = rng.choice(len(prior), size=n, p=prior)
    return rng.normal(MEANS[labels], 1.0), labels


def _posteriors(x, prior=SOURCE):
    joint = prior[None, :] * stats.norm.pdf(x[:, None] - MEANS[None, :])
    return joint / joint.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x_t, _ = _sample(TARGET, N_TARGET, rng)
    x_s, y_s = _sample(SOURCE, N_SOURCE, rng)
    return _posteriors(x_t), _posteriors(x_s), y_s


def _mle_std():
    """Asymptotic std of the MLE of T from n unlabeled points: the inverse Fisher information
    of the mixture weights, parametrised by (T_0, T_1) with T_2 = 1 - T_0 - T_1, by quadrature
    on a fine grid: I = int g g^T p dx, g_j = (phi_j - phi_2) / p."""
    x = np.linspace(-12, 12, 48_001)
    phi = stats.norm.pdf(x[:, None] - MEANS[None, :])
    p = phi @ TARGET
    g = (phi[:, :2] - phi[:, 2:]) / p[:, None]
    info = (g[:, :, None] * g[:, None, :] * p[:, None, None]).sum(axis=0) * (x[1] - x[0])
    cov = np.linalg.inv(info) / N_TARGET
    var = np.array([cov[0, 0], cov[1, 1], cov.sum()])
    return np.sqrt(var)


def test_em_recovers_a_known_target_within_its_asymptotic_error(data):
    target_probs, _, _ = data
    estimate = target_estimation.estimate_target_label_dist(
        target_probs, method="em", source_label_dist=SOURCE
    )
    std = _mle_std()  # about 0.004-0.005 per class here
    assert np.all(std < 0.01)
    assert np.all(np.abs(estimate - TARGET) <= 5 * std), (estimate, std)
    assert estimate.sum() == pytest.approx(1.0) and np.all(estimate >= 0)
    # Without the correction (the mean source posterior) the estimate is far off.
    naive = target_probs.mean(axis=0)
    assert np.max(np.abs(naive - TARGET)) > 20 * std.max()


def _log_likelihood(t, target_probs):
    return np.sum(np.log(target_probs @ (t / SOURCE)))


def test_em_returns_the_maximum_likelihood_fixed_point(data):
    target_probs = data[0][:5000]
    estimate = target_estimation.em_label_dist(target_probs, SOURCE)
    # The EM fixed point: mean_x of the re-weighted posteriors is the estimate itself.
    reweighted = target_probs * (estimate / SOURCE)[None, :]
    reweighted /= reweighted.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(reweighted.mean(axis=0), estimate, atol=1e-8)
    # ... and a maximum of the (concave) likelihood on the simplex.
    best = _log_likelihood(estimate, target_probs)
    rng = np.random.default_rng(1)
    for _ in range(50):
        direction = rng.normal(size=3)
        direction -= direction.mean()
        other = estimate + 1e-3 * direction / np.linalg.norm(direction)
        assert _log_likelihood(other, target_probs) <= best + 1e-9
    # A class the source lacks cannot be estimated: it gets 0.
    zero = target_estimation.em_label_dist(
        _posteriors(np.array([0.0, 1.0]), np.array([0.5, 0.5, 0.0])), [0.5, 0.5, 0]
    )
    assert zero[2] == 0.0 and zero.sum() == pytest.approx(1.0)


def test_bbse_is_the_solution_of_the_confusion_system():
    rng = np.random.default_rng(2)
    source_probs = rng.dirichlet(np.ones(3) * 0.5, size=300)
    source_labels = np.argmax(source_probs + rng.normal(scale=0.3, size=(300, 3)), axis=1)
    target_probs = rng.dirichlet(np.ones(3) * 0.5, size=200)
    # Independent float64 reference: C[i, j] = #(yhat = i, y = j) / n, mu_i = #(yhat = i) / n.
    confusion = np.zeros((3, 3))
    for yhat, y in zip(np.argmax(source_probs, axis=1), source_labels):
        confusion[yhat, y] += 1 / 300
    mu = np.bincount(np.argmax(target_probs, axis=1), minlength=3) / 200
    w = np.linalg.solve(confusion, mu)
    expected = confusion.sum(axis=0) * w
    got = target_estimation.bbse_label_dist(source_probs, source_labels, target_probs)
    if np.all(expected >= 0):
        np.testing.assert_allclose(got, expected, atol=1e-12)
    else:  # projected onto the simplex
        np.testing.assert_allclose(got, fjp.privacy.project_to_simplex(expected), atol=1e-12)
    np.testing.assert_allclose(
        target_estimation.bbse_confusion(source_probs, source_labels)[0], confusion, atol=1e-12
    )


def test_bbse_refuses_a_singular_confusion_matrix():
    # A model that predicts class 0 for everything: C has one non-zero row, so C w = mu has
    # a whole affine space of solutions and BBSE's estimate is not identified (before: the
    # least-squares minimum-norm one, an arbitrary estimate, returned silently).
    rng = np.random.default_rng(3)
    source_labels = rng.integers(0, 3, size=200)
    source_probs = np.tile([0.8, 0.1, 0.1], (200, 1))
    target_probs = np.tile([0.7, 0.2, 0.1], (50, 1))
    for soft in (False, True):
        with pytest.raises(
            target_estimation.EstimateNotIdentified,
            match="confusion matrix is singular: rank 1 over the 3",
        ):
            target_estimation.bbse_label_dist(source_probs, source_labels, target_probs, soft=soft)
    # A class absent from the source data is not a singularity: it gets weight 0.
    probs = np.eye(3)[[0, 1, 0, 1, 0, 1]] * 0.9 + 0.05
    probs /= probs.sum(axis=1, keepdims=True)
    estimate = target_estimation.bbse_label_dist(probs, np.array([0, 1, 0, 1, 0, 1]), probs[:4])
    assert estimate[2] == 0.0 and estimate.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("method", ["bbse", "bbse_soft"])
def test_bbse_recovers_a_known_target_within_its_asymptotic_error(data, method):
    target_probs, source_probs, source_labels = data
    estimate = target_estimation.estimate_target_label_dist(
        target_probs, method=method, source_probs=source_probs, source_labels=source_labels
    )
    # Delta method in mu (the target's mean prediction, n_t points): T^ = diag(S) C^{-1} mu,
    # Cov(T^) = A Cov(mu^) A^T with A = diag(S) C^{-1}. The source's C is estimated from
    # n_s = 5 n_t points, which adds at most about n_t / n_s of that variance: factor 1.2.
    soft = method == "bbse_soft"
    confusion, source = target_estimation.bbse_confusion(source_probs, source_labels, soft)
    a = np.diag(source) @ np.linalg.inv(confusion)
    predicted = target_probs if soft else np.eye(3)[np.argmax(target_probs, axis=1)]
    cov_mu = np.cov(predicted, rowvar=False) / N_TARGET
    std = np.sqrt(1.2 * np.diag(a @ cov_mu @ a.T))
    assert np.all(std < 0.02)
    assert np.all(np.abs(estimate - TARGET) <= 5 * std), (estimate, std)


def test_estimation_arguments_are_validated(data):
    target_probs = data[0][:10]
    with pytest.raises(ValueError, match="unknown method"):
        target_estimation.estimate_target_label_dist(target_probs, method="rlls")
    with pytest.raises(ValueError, match="needs source_label_dist"):
        target_estimation.estimate_target_label_dist(target_probs)
    with pytest.raises(ValueError, match="needs source_probs and source_labels"):
        target_estimation.estimate_target_label_dist(target_probs, method="bbse")
    with pytest.raises(ValueError, match="probability vector"):
        target_estimation.em_label_dist(target_probs * 2, SOURCE)
    with pytest.raises(ValueError, match="source_labels must lie"):
        target_estimation.bbse_label_dist(target_probs, np.full(10, 3), target_probs)
    # source_labels alone give EM its prior.
    np.testing.assert_allclose(
        target_estimation.estimate_target_label_dist(
            target_probs, source_labels=np.array([0, 0, 1, 2])
        ),
        target_estimation.em_label_dist(target_probs, [0.5, 0.25, 0.25]),
    )


def test_model_probabilities_are_the_models_softmax():
    model = fjp.logistic_regression((2,), 3)
    params = model.init(jax.random.PRNGKey(0))
    x = np.random.default_rng(0).normal(size=(25, 2)).astype(np.float32)
    got = target_estimation.model_probabilities(model.apply, params, x, batch_size=7)
    np.testing.assert_allclose(got, jax.nn.softmax(model.apply(params, jnp.asarray(x))), rtol=1e-5)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-12)


def _synthetic_fedpals(hold_out=0.0):
    """The synthetic task, logistic regression, and FedPALS started from the clients'
    aggregate (the guess without target labels), with `hold_out` of each client held out."""
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    partition = fjp.data.hold_out_stratified(partition, dataset.train.y, hold_out, seed=0)
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=1.0)
    sizes = partition.client_sizes
    start = sizes @ partition.client_label_dists / sizes.sum()
    return dataset, partition, model, training, start, fjp.fedpals(start, 0.0)


def test_fedpals_with_a_re_estimated_target():
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals()
    engine = fjp.engine.round_engine(algorithm, model, training)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=10, seed=0
    )
    state, _ = fjp.training.run_training(
        algorithm, model, dataset, partition, training, rounds=40, seed=0,
        update_state=reestimation.update_state,
    )
    estimates = reestimation.estimates
    assert [r for r, _ in estimates] == [10, 20, 30]
    truth = partition.target_label_dist
    # The synthetic classes are well separated: after 30 rounds the model is ~99 % accurate on
    # the target and the estimate is close to T, far closer than the starting guess, and it
    # is the T the state's weights use. (The estimate is only as good as the model: with
    # learning rate 0.1 the model never predicts class 2 within 30 rounds and BBSE misses T
    # by 0.25.)
    assert np.max(np.abs(estimates[-1][1] - truth)) < 0.05
    assert np.max(np.abs(start - truth)) > 0.1
    np.testing.assert_allclose(state.weighting_state.target_label_dist, estimates[-1][1], atol=1e-7)
    assert engine.compilations == 1  # new estimates are state, not a new program
    # Wrapped weightings (the DP release of S) hold T in the wrapped weighting's state.
    wrapped = algorithm._replace(
        weighting=fjp.algorithms.with_server_label_dists(
            algorithm.weighting, partition.client_label_dists
        )
    )
    initial = fjp.init_server_state(wrapped, model.init(jax.random.PRNGKey(0)), 2)
    moved = target_estimation.with_target_label_dist(initial, [0.2, 0.3, 0.5])
    np.testing.assert_allclose(moved.weighting_state.inner.target_label_dist, [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="holds no FedPalsState"):
        target_estimation.with_target_label_dist(
            fjp.init_server_state(fjp.fedavg(), {"w": jnp.zeros(1)}, 2), [0.5, 0.5]
        )


def test_a_round_whose_model_does_not_identify_t_keeps_the_current_t():
    # Early in training a model may not predict some class at all; BBSE's confusion matrix is
    # then singular (test_bbse_refuses_a_singular_confusion_matrix). That round keeps the T
    # the state has and the run goes on (before: the exception ended the run).
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals()
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=2, seed=0
    )
    identified = reestimation.estimate
    seen = []

    def estimate(state):  # the first re-estimation's model does not identify T
        seen.append(np.asarray(target_estimation.TargetReestimation.current(state)))
        if len(seen) == 1:
            raise fjp.algorithms.EstimateNotIdentified("confusion matrix is singular: rank 2")
        return identified(state)

    reestimation.estimate = estimate
    state, _ = fjp.training.run_training(
        algorithm,
        model,
        dataset,
        partition,
        training,
        rounds=5,
        seed=0,
        update_state=reestimation.update_state,
    )
    assert reestimation.skipped == [(2, "confusion matrix is singular: rank 2")]
    assert [r for r, _ in reestimation.estimates] == [4]
    np.testing.assert_allclose(seen[1], start, atol=1e-7)  # round 2 kept the start
    np.testing.assert_allclose(
        state.weighting_state.target_label_dist, reestimation.estimates[0][1], atol=1e-7
    )


def _unknown_target_config(**algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 12
    config.training.batch_size = 8
    config.training.learning_rate = 1.0
    config.algorithm.target_estimation = "bbse_constrained"
    config.algorithm.target_estimation_every = 4
    # Undamped: on this task the round-4 model predicts no class 2 yet, and only a T that
    # follows that estimate in full trains a round-8 model that does (damping has its test).
    config.algorithm.target_damping = 1.0
    config.algorithm.target_holdout = 0.1
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


def test_a_config_with_unknown_target_starts_from_the_aggregate_and_reports_its_estimate(
    tmp_path,
):
    results = fjp.train_and_evaluate(_unknown_target_config(), str(tmp_path), quiet=True)
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    # The clients train without their held-out 10 % (per class), kept to estimate T with.
    partition = fjp.data.hold_out_stratified(partition, dataset.train.y, 0.1, seed=0)
    assert results["partition"]["n_held_out"] == len(partition.held_out_indices) > 0
    assert results["partition"]["client_sizes"] == partition.client_sizes.tolist()
    sizes = partition.client_sizes
    aggregate = sizes @ partition.client_label_dists / sizes.sum()
    # Round 1's weights are those of the aggregate T: FedAvg's; results.json's alpha is the
    # weights in use at the end, FedPALS' for the last estimate.
    np.testing.assert_allclose(results["alpha_round_1"], sizes / sizes.sum(), atol=1e-6)
    final = fjp.fedpals_weights(
        partition.client_label_dists, np.float32(results["target_estimate"]), sizes,
        results["lam"],
    )
    # float32 solves of the same problem (the state holds T in float32).
    np.testing.assert_allclose(results["alpha"], final, atol=1e-5)
    assert np.abs(np.array(results["alpha"]) - results["alpha_round_1"]).sum() > 0.05
    truth = partition.target_label_dist
    assert results["target_estimate_l1_error"] < 0.5 * np.abs(aggregate - truth).sum()
    np.testing.assert_allclose(
        np.abs(np.array(results["target_estimate"]) - truth).sum(),
        results["target_estimate_l1_error"],
    )
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [4, 8]
    assert all(r["estimator"] == "bbse_constrained" and r["used"] for r in records)
    np.testing.assert_allclose(records[-1]["target"], results["target_estimate"], atol=1e-7)
    history = results["target_estimation_history"]
    assert [h["round"] for h in history] == results["rounds"]
    # The label-free accuracy estimate: the held-out share's recall weighted by the T in use.
    assert all(0.0 <= h["estimated_accuracy"] <= 1.0 + 1e-6 for h in history)  # T in float32


def test_a_known_target_run_holds_nothing_out():
    known = fjp.build_task(_unknown_target_config(target_estimation=None))
    in_sample = fjp.build_task(_unknown_target_config(target_holdout=0.0))  # the default
    assert in_sample.partition.held_out_indices.size == 0
    assert known.partition.held_out_indices.size == 0
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    np.testing.assert_array_equal(known.partition.client_indices, partition.client_indices)
    estimated = fjp.build_task(_unknown_target_config(target_holdout=0.2))
    assert estimated.partition.held_out_indices.size > 0
    assert estimated.partition.client_sizes.sum() + estimated.partition.held_out_indices.size == (
        partition.client_sizes.sum()
    )
    # The true T stays the task's (for evaluation and the record); the server starts elsewhere.
    np.testing.assert_array_equal(estimated.partition.target_label_dist,
                                  partition.target_label_dist)
    assert np.abs(estimated.target_label_dist - partition.target_label_dist).sum() > 0.1


def test_unknown_target_config_is_resolved_and_checked():
    resolved = fjp.validate_config(_unknown_target_config())
    assert resolved.algorithm.target_estimation == "bbse_constrained"
    assert resolved.algorithm.target_estimation_every == 4
    fedavg = fjp.validate_config(_unknown_target_config(name="fedavg"))
    assert fedavg.algorithm.target_estimation is None  # FedAvg never reads T
    assert fedavg.algorithm.target_estimation_every is None
    with pytest.raises(fjp.ConfigError, match="give algorithm.lam instead"):
        fjp.validate_config(_unknown_target_config(ess_fraction=0.5))
    with pytest.raises(fjp.ConfigError, match="target_estimation"):
        fjp.validate_config(_unknown_target_config(target_estimation="oracle"))
    with pytest.raises(fjp.ConfigError, match="target_estimation_every"):
        fjp.validate_config(_unknown_target_config(target_estimation_every=0))
    with pytest.raises(fjp.ConfigError, match="target_holdout"):
        fjp.validate_config(_unknown_target_config(target_holdout=0.6))
    with pytest.raises(fjp.ConfigError, match="target_damping"):
        fjp.validate_config(_unknown_target_config(target_damping=0.0))
    with pytest.raises(fjp.ConfigError, match="target_warmup_rounds"):
        fjp.validate_config(_unknown_target_config(target_warmup_rounds=0))
    with pytest.raises(fjp.ConfigError, match="target_shrinkage"):
        fjp.validate_config(_unknown_target_config(target_shrinkage=1.0))
    # Off (None) unless set, so an unknown-T config's digest is what it was before they existed.
    assert resolved.algorithm.target_warmup_rounds is None
    assert resolved.algorithm.target_shrinkage is None
    assert "target_shrinkage" not in fjp.experiment.config.config_identity(resolved)["algorithm"]
    assert resolved.algorithm.target_estimation_model is None
    with pytest.raises(fjp.ConfigError, match="target_estimation_model"):
        fjp.validate_config(_unknown_target_config(target_estimation_model="fedprox_shadow"))
    warm = fjp.validate_config(_unknown_target_config(target_warmup_rounds=3, target_shrinkage=0.25))
    assert (warm.algorithm.target_warmup_rounds, warm.algorithm.target_shrinkage) == (3, 0.25)
    assert fjp.config_digest(warm) != fjp.config_digest(resolved)
    # Off for known T, so known-T configs (and their digests) are as before.
    assert fedavg.algorithm.target_holdout is None and fedavg.algorithm.target_damping is None


# -- BCTS + MLLS, constrained soft BBSE, the gate's quantities --------------------------------


def test_bcts_and_mlls_recover_t_from_miscalibrated_logits_where_em_does_not(data):
    # The exactly calibrated posteriors' logits shown at temperature 1/3 with a per-class
    # offset: an over-confident model trained under another prior. BCTS fitted on held-out
    # labeled source data undoes both; MLLS on the calibrated posteriors then recovers T to
    # within 0.02 per class (the MLE's own asymptotic std is 0.002-0.004 here; the rest is the
    # calibration's error from 20,000 held-out points), and EM on the model's softmax (with
    # the true source prior) misses by more than 0.05.
    target_probs, source_probs, source_labels = data
    offset = np.array([0.7, 0.0, -0.4])
    target_logits = 3.0 * np.log(target_probs) + offset
    source_logits = 3.0 * np.log(source_probs[:20_000]) + offset
    labels = source_labels[:20_000]
    fit = calibration.fit_bias_corrected_temperature(source_logits, labels)
    mlls = target_estimation.estimate_target_label_dist(
        calibration.calibrated_probabilities(fit, target_logits),
        method="mlls",
        source_probs=calibration.calibrated_probabilities(fit, source_logits),
        source_labels=labels,
    )
    assert np.max(np.abs(mlls - TARGET)) < 0.02, mlls
    em = target_estimation.em_label_dist(target_estimation.softmax(target_logits), SOURCE)
    assert np.max(np.abs(em - TARGET)) > 0.05, em
    # MLLS takes as source prior the mean calibrated posterior, not the labels' counts.
    stats = target_estimation.source_statistics(source_probs[:500], source_labels[:500])
    np.testing.assert_allclose(
        target_estimation.mlls_label_dist(source_probs[:500], source_labels[:500],
                                          target_probs[:300]),
        target_estimation.em_label_dist(target_probs[:300], stats.mean_posterior),
        atol=1e-12,
    )


def _simplex_ridge_reference(confusion, mu, rho):
    """argmin_{t in simplex} ||C t - mu||^2 + rho ||t||^2 in float64, by its KKT conditions on
    every support: a convex problem's minimiser is the minimiser of the affine hull of the face
    it lies in, so the feasible face minimiser of least objective is the solution."""
    k = confusion.shape[1]
    q = confusion.T @ confusion + rho * np.eye(k)
    c = confusion.T @ mu
    best, best_value = None, np.inf
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            s = list(support)
            system = np.block([[2 * q[np.ix_(s, s)], np.ones((size, 1))],
                               [np.ones((1, size)), np.zeros((1, 1))]])
            solution = np.linalg.solve(system, np.r_[2 * c[s], 1.0])
            t = np.zeros(k)
            t[s] = solution[:size]
            if np.all(t >= -1e-12):
                value = np.sum((confusion @ t - mu) ** 2) + rho * t @ t
                if value < best_value:
                    best, best_value = t, value
    return best, best_value


@pytest.mark.parametrize("case", ["random", "singular", "absent_class"])
def test_constrained_soft_bbse_is_the_minimiser_of_its_qp(case):
    rng = np.random.default_rng(11)
    k, n = 4, 400
    labels = rng.integers(0, k, size=n)
    probs = rng.dirichlet(np.ones(k), size=n) + 2.0 * np.eye(k)[labels]
    if case == "singular":  # classes 1 and 2 look the same to the model: C is singular
        probs[(labels == 1) | (labels == 2)] = probs[np.flatnonzero(labels == 1)[0]]
    if case == "absent_class":
        labels = np.where(labels == 3, 0, labels)
    probs /= probs.sum(axis=1, keepdims=True)
    target_probs = rng.dirichlet(np.ones(k), size=150)
    rho = 1e-3
    stats = target_estimation.source_statistics(probs, labels)
    got = target_estimation.constrained_bbse_label_dist(stats, target_probs, rho=rho)
    # The reference: C from its definition, column k the mean posterior of class k's examples.
    present = np.flatnonzero(np.bincount(labels, minlength=k) > 0)
    confusion = np.stack([probs[labels == j].mean(axis=0) for j in present], axis=1)
    expected, value = _simplex_ridge_reference(confusion, target_probs.mean(axis=0), rho)
    full = np.zeros(k)
    full[present] = expected
    # fedpals_weights solves in float32: the objective to float32 rounding of its scale.
    got_value = np.sum((confusion @ got[present] - target_probs.mean(axis=0)) ** 2) + rho * (
        got @ got
    )
    assert got_value <= value + 1e-6
    np.testing.assert_allclose(got, full, atol=2e-3 if case == "singular" else 2e-4)
    assert got.sum() == pytest.approx(1.0) and np.all(got >= 0)
    if case == "singular":  # where BBSE gives up
        with pytest.raises(target_estimation.EstimateNotIdentified):
            target_estimation.bbse_label_dist(probs, labels, target_probs, soft=True)
    if case == "absent_class":
        assert got[3] == 0.0


def test_readiness_is_the_confusions_smallest_singular_value_and_the_worst_recall():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, size=300)
    probs = rng.dirichlet(np.ones(3), size=300) + np.eye(3)[labels]
    probs /= probs.sum(axis=1, keepdims=True)
    ready = target_estimation.readiness(target_estimation.source_statistics(probs, labels))
    confusion = np.stack([probs[labels == j].mean(axis=0) for j in range(3)], axis=1)
    assert ready.sigma_min == pytest.approx(np.linalg.svd(confusion)[1].min(), rel=1e-10)
    recall = [np.mean(np.argmax(probs[labels == j], axis=1) == j) for j in range(3)]
    assert ready.min_recall == pytest.approx(min(recall))
    assert ready.passes(None, None) and not ready.passes(ready.sigma_min + 1e-9, None)
    assert not ready.passes(None, ready.min_recall + 1e-9)


def _reestimation(**options):
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals(hold_out=0.1)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=2, seed=0,
        truth=partition.target_label_dist, **options,
    )
    state, _ = fjp.training.run_training(
        algorithm, model, dataset, partition, training, rounds=7, seed=0,
        update_state=reestimation.update_state,
    )
    return reestimation, state, start


def test_the_gate_keeps_t_until_the_model_is_ready():
    # The synthetic classes overlap: the soft confusion matrix's smallest singular value stays
    # well below 0.9, so a gate at 0.9 keeps the start for the whole run; without it (None)
    # the same rounds put their estimates to use.
    gated, state, start = _reestimation(gate_sigma_min=0.9)
    assert [r["round"] for r in gated.records] == [2, 4, 6]
    assert not any(r["used"] for r in gated.records)
    assert all(r["sigma_min"] < 0.9 for r in gated.records)
    assert [r for r, _ in gated.skipped] == [2, 4, 6]
    np.testing.assert_allclose(state.weighting_state.target_label_dist, start, atol=1e-7)
    open_gate, state, _ = _reestimation()
    assert all(r["used"] for r in open_gate.records)
    np.testing.assert_allclose(
        state.weighting_state.target_label_dist, open_gate.records[-1]["target"], atol=1e-7
    )
    assert np.abs(np.asarray(open_gate.records[-1]["target"]) - start).sum() > 0.1


def test_damping_averages_the_estimates_from_the_start():
    damped, state, start = _reestimation(damping=0.5)
    current = start
    for record in damped.records:
        expected = 0.5 * current + 0.5 * np.asarray(record["estimate"])
        np.testing.assert_allclose(record["target"], expected, atol=1e-7)
        current = expected
    np.testing.assert_allclose(state.weighting_state.target_label_dist, current, atol=1e-7)
    truth = damped.truth
    assert damped.records[-1]["target_l1_error"] == pytest.approx(np.abs(current - truth).sum())


def test_a_warmup_trains_fedavgs_rounds_before_the_first_estimate():
    # every = 2, warm-up 3: re-estimated before rounds 3 and 5 (not 2, 4, 6); until round 3
    # the weights use the clients' aggregate, so the first estimate moves T from the start.
    warm, state, start = _reestimation(warmup=3)
    assert [r["round"] for r in warm.records] == [3, 5]
    first = np.asarray(warm.records[0]["target"])
    assert warm.records[0]["target_change_l1"] == pytest.approx(np.abs(first - start).sum())
    np.testing.assert_allclose(
        state.weighting_state.target_label_dist, warm.records[-1]["target"], atol=1e-7
    )
    # Without a warm-up the schedule is every `every` rounds from round `every`.
    dataset, partition, model, _, _, algorithm = _synthetic_fedpals()
    plain = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=3, seed=0, warmup=0
    )
    assert [r for r in range(12) if plain.reestimates_before(r)] == [3, 6, 9]
    late = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=3, seed=0, warmup=1
    )
    assert [r for r in range(12) if late.reestimates_before(r)] == [1, 4, 7, 10]
    assert "from round 2" in late.header() and "FedAvg's weights" in late.header()


def test_shrinkage_keeps_a_fixed_share_of_the_clients_aggregate_in_every_estimate():
    # T = (1 - s) T^ + s A with A = sum_i n_i S_i / N: at lambda = 0 every client keeps a
    # share of its FedAvg weight whatever the estimate says; with damping the shrunk estimate
    # is what T moves towards.
    shrunk, state, start = _reestimation(shrinkage=0.25)
    assert shrunk.records and all(r["used"] for r in shrunk.records)
    for record in shrunk.records:
        expected = 0.75 * np.asarray(record["estimate"]) + 0.25 * start
        np.testing.assert_allclose(record["target"], expected, atol=1e-12)
    np.testing.assert_allclose(
        state.weighting_state.target_label_dist, shrunk.records[-1]["target"], atol=1e-7
    )
    both, _, _ = _reestimation(shrinkage=0.5, damping=0.5)
    current = start
    for record in both.records:
        current = 0.5 * current + 0.5 * (0.5 * np.asarray(record["estimate"]) + 0.5 * start)
        np.testing.assert_allclose(record["target"], current, atol=1e-12)
    with pytest.raises(ValueError, match="shrinkage"):
        _reestimation(shrinkage=1.0)
    with pytest.raises(ValueError, match="warmup"):
        _reestimation(warmup=-1)


def test_a_configs_warmup_and_shrinkage_reach_the_reestimation(tmp_path):
    # Every 4 rounds after a warm-up of 3: before rounds 3, 7 and 11 (not 4 and 8), each
    # estimate shrunk a quarter of the way to the clients' aggregate.
    config = _unknown_target_config(target_warmup_rounds=3, target_shrinkage=0.25)
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [3, 7, 11]
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    partition = fjp.data.hold_out_stratified(partition, dataset.train.y, 0.1, seed=0)
    sizes = np.asarray(partition.client_sizes, np.float64)
    aggregate = sizes @ partition.client_label_dists / sizes.sum()
    for record in records:
        np.testing.assert_allclose(
            record["target"], 0.75 * np.asarray(record["estimate"]) + 0.25 * aggregate,
            atol=1e-12,
        )


def test_a_fedavg_shadow_gives_the_estimator_fedavgs_model_of_the_same_round():
    # The estimate before round r is the one FedAvg's own model before round r gives (FedAvg
    # run on its own, same seed, clients and local training), not the run's steered model's.
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals(hold_out=0.1)
    shadow = fjp.unknown_target.FedAvgShadow(model, dataset, partition, training, rounds=5,
                                            seed=0)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=2, seed=0, shadow=shadow,
    )
    fjp.training.run_training(algorithm, model, dataset, partition, training, rounds=5, seed=0,
                              update_state=reestimation.update_state)
    assert [r["round"] for r in reestimation.records] == [2, 4]
    fedavg, seen = fjp.fedavg(), {}

    def keep(round_index, state_of):
        seen[round_index] = fedavg.eval_params(state_of())

    fjp.training.run_training(fedavg, model, dataset, partition, training, rounds=5, seed=0,
                              update_state=keep)
    source_x = dataset.train.x[partition.held_out_indices]
    source_y = np.asarray(dataset.train.y[partition.held_out_indices])
    target_x = dataset.train.x[partition.target_val_indices]
    for record in reestimation.records:
        params = seen[record["round"]]
        expected = target_estimation.estimate_target_label_dist(
            target_estimation.model_probabilities(model.apply, params, target_x),
            method="bbse_constrained",
            source_probs=target_estimation.model_probabilities(model.apply, params, source_x),
            source_labels=source_y,
        )
        np.testing.assert_allclose(record["estimate"], expected, atol=1e-6)
    own = fjp.algorithms.TargetReestimation(algorithm, model, dataset, partition, every=2, seed=0)
    fjp.training.run_training(algorithm, model, dataset, partition, training, rounds=5, seed=0,
                              update_state=own.update_state)
    assert np.abs(np.asarray(own.records[-1]["estimate"])
                  - reestimation.records[-1]["estimate"]).sum() > 1e-4
    assert "FedAvg shadow" in reestimation.header()
    with pytest.raises(ValueError, match="round_index"):
        shadow.params(5)


def test_an_ensemble_estimates_from_the_runs_and_the_shadows_probabilities_averaged():
    # fedavg_shadow_ensemble: BBSE on the average of the two models' output probabilities,
    # the run's own model of that round (steered) and the FedAvg shadow's (not).
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals(hold_out=0.1)
    shadow = fjp.unknown_target.FedAvgShadow(model, dataset, partition, training, rounds=5,
                                            seed=0)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=2, seed=0, shadow=shadow, ensemble=True,
    )
    own_params = {}

    def both(round_index, state_of):
        if reestimation.reestimates_before(round_index):
            own_params[round_index] = algorithm.eval_params(state_of())
        return reestimation.update_state(round_index, state_of)

    fjp.training.run_training(algorithm, model, dataset, partition, training, rounds=5, seed=0,
                              update_state=both)
    assert [r["round"] for r in reestimation.records] == [2, 4]
    source_x = dataset.train.x[partition.held_out_indices]
    source_y = np.asarray(dataset.train.y[partition.held_out_indices])
    target_x = dataset.train.x[partition.target_val_indices]
    for record in reestimation.records:
        models = (shadow.params(record["round"]), own_params[record["round"]])
        probs = [(target_estimation.model_probabilities(model.apply, p, source_x),
                  target_estimation.model_probabilities(model.apply, p, target_x))
                 for p in models]
        expected = target_estimation.estimate_target_label_dist(
            (probs[0][1] + probs[1][1]) / 2, method="bbse_constrained",
            source_probs=(probs[0][0] + probs[1][0]) / 2, source_labels=source_y,
        )
        np.testing.assert_allclose(record["estimate"], expected, atol=1e-6)
    # Before the first estimate the run's weights are FedAvg's, so at round 2 its model is the
    # shadow's; at round 4 the estimate has steered it, and the ensemble is not the shadow.
    alone = target_estimation.estimate_target_label_dist(
        probs[0][1], method="bbse_constrained", source_probs=probs[0][0], source_labels=source_y)
    assert np.abs(alone - expected).sum() > 1e-4
    assert "averaged" in reestimation.header()
    with pytest.raises(ValueError, match="ensemble=True averages"):
        fjp.algorithms.TargetReestimation(algorithm, model, dataset, partition, every=2,
                                          ensemble=True)


def test_a_pretrained_fedavg_gives_one_estimate_before_round_1_from_fedavgs_final_model():
    # fedavg_pretrained: FedAvg trained first for all the run's rounds; T estimated once, before
    # round 1, from its final model, and kept (every=1 would otherwise re-estimate each round).
    dataset, partition, model, training, start, algorithm = _synthetic_fedpals(hold_out=0.1)
    shadow = fjp.unknown_target.FedAvgShadow(model, dataset, partition, training, rounds=4,
                                            seed=0, final=True)
    reestimation = fjp.algorithms.TargetReestimation(
        algorithm, model, dataset, partition, every=1, seed=0, shadow=shadow,
    )
    in_use = {}

    def update(round_index, state_of):
        new = reestimation.update_state(round_index, state_of)
        in_use[round_index] = np.asarray(reestimation.current(new if new is not None
                                                              else state_of()))
        return new

    fjp.training.run_training(algorithm, model, dataset, partition, training, rounds=4, seed=0,
                              update_state=update)
    assert [r["round"] for r in reestimation.records] == [0]
    fedavg = fjp.fedavg()
    state, _ = fjp.training.run_training(fedavg, model, dataset, partition, training, rounds=4,
                                         seed=0)
    params = fedavg.eval_params(state)
    source_x = dataset.train.x[partition.held_out_indices]
    source_y = np.asarray(dataset.train.y[partition.held_out_indices])
    expected = target_estimation.estimate_target_label_dist(
        target_estimation.model_probabilities(
            model.apply, params, dataset.train.x[partition.target_val_indices]),
        method="bbse_constrained",
        source_probs=target_estimation.model_probabilities(model.apply, params, source_x),
        source_labels=source_y,
    )
    np.testing.assert_allclose(reestimation.records[0]["estimate"], expected, atol=1e-6)
    for round_index in range(4):  # the one estimate is the T of every round
        np.testing.assert_allclose(in_use[round_index], expected / expected.sum(), atol=1e-6)
    header = reestimation.header()
    assert "estimated once" in header and "before round 1" in header
    assert "trained first" in header


def test_em_with_the_mean_output_prior_is_the_likelihood_maximum_under_that_prior(data):
    # "em_output_prior": EM on the model's own posteriors, the source prior taken as their
    # mean on the labeled source data (not the labels' counts). Checked against the fixed point
    # and the concave likelihood sum_x log sum_y T(y) / P(y) p(y|x), P that mean, in float64.
    target_probs, source_probs, source_labels = data[0][:4000], data[1][:3000], data[2][:3000]
    estimate = target_estimation.estimate_target_label_dist(
        target_probs, method="em_output_prior", source_probs=source_probs,
        source_labels=source_labels,
    )
    prior = source_probs.mean(axis=0)
    reweighted = target_probs * (estimate / prior)[None, :]
    reweighted /= reweighted.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(reweighted.mean(axis=0), estimate, atol=1e-8)

    def log_likelihood(t):
        return np.sum(np.log(target_probs @ (t / prior)))

    rng = np.random.default_rng(2)
    for _ in range(30):
        direction = rng.normal(size=3)
        direction -= direction.mean()
        other = estimate + 1e-3 * direction / np.linalg.norm(direction)
        assert log_likelihood(other) <= log_likelihood(estimate) + 1e-9
    # The labels' prior gives another estimate (the two priors differ on this sample).
    with_labels = target_estimation.estimate_target_label_dist(
        target_probs, method="em", source_labels=source_labels
    )
    assert np.abs(with_labels - estimate).sum() > 1e-4


def test_an_unknown_target_run_at_its_defaults_estimates_t_before_every_round_and_says_so(
    tmp_path, capsys
):
    # Four rounds with every other key at its default: T is re-estimated before rounds 2, 3
    # and 4 (not first at round 5, which made a short run FedAvg under FedPALS' name).
    results = fjp.train_and_evaluate(_unknown_target_at_defaults(4), str(tmp_path), quiet=False)
    records = results["target_estimation_records"]
    assert [r["round"] for r in records] == [1, 2, 3]
    assert any(r["used"] for r in records)
    assert results["alpha"] != results["alpha_round_1"]
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "T unknown: re-estimated by constrained soft BBSE before every round from round 2" in text
    assert "T^ moved" in text or "T^ kept" in text


def _unknown_target_at_defaults(rounds):
    """The synthetic task with FedPALS' unknown-T variant, its target_* keys at their defaults."""
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.algorithm.name = "fedpals_unknown_t_bbse_constrained"
    config.training.rounds = rounds
    config.training.batch_size = 8
    config.training.learning_rate = 1.0
    return config


@pytest.mark.parametrize("model", [None, "fedavg_shadow"])
def test_a_resumed_unknown_target_run_keeps_the_estimation_history_of_earlier_launches(
    tmp_path, model
):
    # With a FedAvg shadow, the resumed launch trains its shadow again: the same one (from the
    # seed), so the estimates are those of the run that was never stopped.
    def run(rounds, workdir):
        config = _unknown_target_at_defaults(rounds)
        config.algorithm.target_estimation_model = model
        return fjp.train_and_evaluate(config, str(tmp_path / workdir), quiet=True)

    straight = run(4, "a")
    keys = ("target_estimation_records", "target_estimation_history")
    assert [r["round"] for r in straight["target_estimation_records"]] == [1, 2, 3]
    # Two rounds, then the same workdir to four (a resume after round 2), then once more
    # (the run found finished).
    run(2, "b")
    resumed, again = run(4, "b"), run(4, "b")
    for results in (resumed, again):
        for key in keys:
            assert [r["round"] for r in results[key]] == [r["round"] for r in straight[key]], key
        np.testing.assert_allclose(
            [r["target"] for r in results["target_estimation_records"] if r["used"]],
            [r["target"] for r in straight["target_estimation_records"] if r["used"]], atol=1e-6,
        )
