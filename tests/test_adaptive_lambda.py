"""FedPALS with lambda adapted by the validation hypergradient: the hypergradient against float64
finite differences of the aggregate's validation loss, the Adam step on log lambda, the recorded
trajectory, runs in lockstep against runs alone, the config and the results."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms import adaptive_lambda


def _linear_apply(params, x):
    return x @ params["w"] + params["b"]


def _problem(seed):
    rng = np.random.default_rng([seed, 0xADA])
    num_clients, num_classes, dim = 4, 3, 5
    dists = rng.dirichlet(np.full(num_classes, 0.5), size=num_clients)
    target = rng.dirichlet(np.ones(num_classes))
    sizes = rng.integers(20, 400, size=num_clients).astype(np.float64)
    params = {"w": rng.normal(size=(dim, num_classes)), "b": rng.normal(size=num_classes)}
    deltas = {
        "w": rng.normal(size=(num_clients, dim, num_classes)),
        "b": rng.normal(size=(num_clients, num_classes)),
    }
    x = rng.normal(size=(64, dim))
    y = rng.integers(0, num_classes, size=64)
    return dists, target, sizes, params, deltas, x, y


def _val_loss64(params, x, y):
    logits = x @ params["w"] + params["b"]
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -np.mean(log_probs[np.arange(len(y)), y])


def _aggregate64(params, deltas, alpha):
    return {k: params[k] + np.tensordot(alpha, deltas[k], axes=1) for k in params}


@pytest.mark.parametrize("seed", range(3))
def test_hypergradient_matches_finite_differences_of_the_validation_loss(seed):
    dists, target, sizes, params, deltas, x, y = _problem(seed)
    lam = float(fjp.lambda_for_ess(dists, target, sizes, 0.6))
    assert lam > 0

    def loss_at(log_lam):
        with jax.enable_x64(True):
            alpha = np.asarray(fjp.fedpals_weights(dists, target, sizes, np.exp(log_lam)))
        return _val_loss64(_aggregate64(params, deltas, alpha), x, y)

    h = 1e-4
    reference = (loss_at(np.log(lam) + h) - loss_at(np.log(lam) - h)) / (2 * h)
    with jax.enable_x64(True):
        alpha = fjp.fedpals_weights(dists, target, sizes, lam)
        derivative = fjp.server_weights.fedpals_lam_derivative(dists, target, sizes, lam, alpha=alpha)
        new_params = jax.tree_util.tree_map(jnp.asarray, _aggregate64(params, deltas, alpha))
        loss, grad = adaptive_lambda.validation_hypergradient(
            _linear_apply,
            new_params,
            jax.tree_util.tree_map(jnp.asarray, deltas),
            derivative,
            jnp.asarray(lam),
            jnp.asarray(x),
            jnp.asarray(y),
        )
    assert float(loss) == pytest.approx(_val_loss64(_aggregate64(params, deltas, alpha), x, y))
    # Central differences: O(h^2) relative, and the solve's float64 rounding over h.
    assert float(grad) == pytest.approx(reference, rel=1e-5, abs=1e-9)
    assert abs(reference) > 1e-6  # the test problem does move the loss


_TASK = {}


def _synthetic_run(seed, rounds, hyper_learning_rate=0.5, ess=0.9):
    # One data set for every seed (runs train in lockstep only on one data set); the seed
    # still draws the initial model, the data order and so the trajectory of lambda.
    if not _TASK:
        _TASK["task"] = fjp.synthetic_label_shift_task(0.5, seed=0)
    dataset, partition = _TASK["task"]
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=0.05)
    dists, sizes = partition.client_label_dists, partition.client_sizes
    target = partition.target_label_dist
    lam = float(fjp.lambda_for_ess(dists, target, sizes, ess))
    val = partition.target_val_indices
    algorithm = adaptive_lambda.adaptive_fedpals(
        target,
        dists,
        sizes,
        lam,
        model.apply,
        dataset.train.x[val],
        dataset.train.y[val],
        rounds=rounds,
        hyper_learning_rate=hyper_learning_rate,
    )
    run = fjp.training.TrainingRun(algorithm, model, dataset, partition, training, rounds=rounds, seed=seed)
    return run, lam


def test_lambda_takes_adam_steps_down_the_hypergradient_and_is_recorded():
    # 3 rounds: the run and program of test_runs_in_lockstep_match_runs_alone's runs alone.
    run, lam = _synthetic_run(seed=0, rounds=3, hyper_learning_rate=0.5)
    [(state, history)] = fjp.training.run_trainings([run])
    report = adaptive_lambda.lam_report(jax.device_get(state))
    lams = np.array(report["lam_per_round"])
    grads = np.array(report["hypergradient_per_round"])
    assert lams.shape == grads.shape == (3,)
    assert lams[0] == pytest.approx(lam, rel=1e-6)
    # Adam's first step is -lr * g / (|g| + eps): 0.5 in log lambda against g's sign.
    assert np.log(lams[1] / lams[0]) == pytest.approx(-0.5 * np.sign(grads[0]), rel=1e-4)
    # The weights of the next round use the new lambda.
    final = np.log(float(state.weighting_state.lam))
    assert np.all(np.isfinite(report["hyper_val_loss_per_round"]))
    assert final != pytest.approx(np.log(lams[-1]))
    assert len(history.rounds) == 3


def test_runs_in_lockstep_match_runs_alone():
    together = fjp.training.run_trainings([_synthetic_run(s, rounds=3)[0] for s in (0, 1)])
    for seed, (state, history) in zip((0, 1), together):
        [(alone, alone_history)] = fjp.training.run_trainings([_synthetic_run(seed, rounds=3)[0]])
        np.testing.assert_allclose(
            adaptive_lambda.lam_report(jax.device_get(state))["lam_per_round"],
            adaptive_lambda.lam_report(jax.device_get(alone))["lam_per_round"],
            rtol=1e-5,
        )
        np.testing.assert_allclose(history.target_accuracy, alone_history.target_accuracy)
    first, second = (adaptive_lambda.lam_report(jax.device_get(s))["lam_per_round"] for s, _ in together)
    assert first[1:] != second[1:]  # the seeds' trajectories differ: the runs are not copies


def test_validation_sets_of_any_size_give_states_of_one_shape_and_padding_is_ignored():
    # The runs of a sweep have target validation sets of different sizes; the hypergradient's
    # subset has one shape, so they still train in lockstep.
    dataset, partition = _TASK.setdefault("task", fjp.synthetic_label_shift_task(0.5, seed=0))
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=0.05)
    args = (partition.target_label_dist, partition.client_label_dists, partition.client_sizes)
    val = partition.target_val_indices
    runs = [
        fjp.training.TrainingRun(
            adaptive_lambda.adaptive_fedpals(
                *args,
                1.0,
                model.apply,
                dataset.train.x[val[:n]],
                dataset.train.y[val[:n]],
                rounds=2,
                hyper_val_size=8,
            ),
            model,
            dataset,
            partition,
            training,
            rounds=2,
            seed=seed,
        )
        for seed, n in ((0, 5), (1, 30))
    ]
    assert fjp.training.training_group_key(runs[0]) == fjp.training.training_group_key(runs[1])
    assert all(not isinstance(outcome, Exception) for outcome in fjp.training.run_trainings(runs))
    weights = runs[0].state.algorithm_state.val_weights
    np.testing.assert_array_equal(weights, [1, 1, 1, 1, 1, 0, 0, 0])
    # The weighted loss of the padded set is the mean over its real examples.
    params = model.init(jax.random.PRNGKey(0))
    data = runs[0].state.algorithm_state
    padded = adaptive_lambda._mean_cross_entropy(
        model.apply, params, data.val_inputs, data.val_labels, data.val_weights
    )
    real = adaptive_lambda._mean_cross_entropy(
        model.apply, params, dataset.train.x[val[:5]], dataset.train.y[val[:5]]
    )
    assert float(padded) == pytest.approx(float(real), rel=1e-6)


def test_bad_settings_are_refused():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    dists, sizes = partition.client_label_dists, partition.client_sizes
    x, y = dataset.train.x[:5], dataset.train.y[:5]
    model = fjp.logistic_regression((2,), 3)
    args = (partition.target_label_dist, dists, sizes)
    with pytest.raises(ValueError, match="initial_lam must be a finite number > 0"):
        adaptive_lambda.adaptive_fedpals(*args, 0.0, model.apply, x, y, rounds=3)
    with pytest.raises(ValueError, match="same number"):
        adaptive_lambda.adaptive_fedpals(*args, 1.0, model.apply, x, y[:3], rounds=3)
    with pytest.raises(ValueError, match="hyper_learning_rate"):
        adaptive_lambda.adaptive_fedpals(*args, 1.0, model.apply, x, y, rounds=3, hyper_learning_rate=0)
    # Labels outside [0, K) (K = 3 here) or fractional ones: before, accepted silently.
    for bad, message in [
        (np.array([0, 1, 3, 2, 1]), r"val_labels must lie in \[0, K\) = \[0, 3\).*\[3\]"),
        (np.array([0, -1, 2, 2, 1]), r"val_labels must lie in \[0, K\).*\[-1\]"),
        (np.array([0.0, 1.5, 2.0, 2.0, 1.0]), "val_labels must be integer class indices"),
    ]:
        with pytest.raises(ValueError, match=message):
            adaptive_lambda.adaptive_fedpals(*args, 1.0, model.apply, x, bad, rounds=3)
    algorithm = adaptive_lambda.adaptive_fedpals(*args, 1.0, model.apply, x, y, rounds=3)
    with pytest.raises(ValueError, match="built for 2 clients, the run has 3"):
        fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 3)


_CONFIG = {
    "dataset": {"name": "synthetic"},
    "algorithm": {"name": "fedpals", "ess_fraction": 0.9, "lam_schedule": "hypergradient"},
    "training": {"rounds": 3, "batch_size": 8, "learning_rate": 0.05},
}


def _config(**algorithm):
    config = fjp.default_config()
    config.update_from_flattened_dict(
        {f"{section}.{k}": v for section, values in _CONFIG.items() for k, v in values.items()}
    )
    config.update_from_flattened_dict({f"algorithm.{k}": v for k, v in algorithm.items()})
    return config


def test_config_resolves_the_schedule_and_refuses_what_cannot_adapt():
    resolved = fjp.validate_config(_config())
    assert resolved.algorithm.lam_schedule == "hypergradient"
    assert resolved.algorithm.lam_hyper_lr == 0.5
    fixed = fjp.validate_config(_config(lam_schedule="fixed"))
    # The paper's FedPALS: the keys are unused, and absent from the run's identity.
    assert fixed.algorithm.lam_schedule is None and fixed.algorithm.lam_hyper_lr is None
    assert fjp.config_digest(fixed) != fjp.config_digest(resolved)
    with pytest.raises(fjp.ConfigError, match="applies to algorithm.name='fedpals' only"):
        fjp.validate_config(_config(name="fedavg", ess_fraction=None))
    with pytest.raises(fjp.ConfigError, match="starting lambda; set algorithm.ess_fraction"):
        fjp.validate_config(_config(ess_fraction=None))
    with pytest.raises(fjp.ConfigError, match="lam_schedule"):
        fjp.validate_config(_config(lam_schedule="cosine"))


def test_train_and_evaluate_reports_the_trajectory(tmp_path):
    results = fjp.train_and_evaluate(_config(), str(tmp_path), quiet=True)
    assert len(results["lam_per_round"]) == 3
    assert results["lam_per_round"][0] == pytest.approx(results["lam"], rel=1e-6)
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["lam_per_round"] == results["lam_per_round"]


def test_an_unreachable_ess_fraction_starts_the_schedule_at_the_lower_end(tmp_path):
    # ESS 5 % of N is below the smallest client's share (18 of 58): no fixed lambda reaches it;
    # the schedule starts from lambda_for_ess's lower end, 1e-6 N, standing for lambda -> 0+.
    config = _config(ess_fraction=0.05)  # 3 rounds: the program of the test above
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert results["lam"] == pytest.approx(58 * 1e-6, rel=1e-6)
    with pytest.raises(fjp.TaskError, match="out of range"):  # a fixed lambda still refuses it
        fjp.build_task(_config(ess_fraction=0.05, lam_schedule="fixed"))


def test_the_variant_brings_its_starting_lambda_where_the_config_gives_none():
    # Every shipped config leaves lam and ess_fraction open; fedpals_adaptive starts at ESS
    # 50 % of N there, and keeps a start the config gives.
    resolved = fjp.validate_config(
        _config(name="fedpals_adaptive", ess_fraction=None, lam_schedule=None))
    assert resolved.algorithm.ess_fraction == adaptive_lambda.START_ESS_FRACTION == 0.5
    assert resolved.algorithm.lam is None
    assert resolved.algorithm.lam_schedule == "hypergradient"
    # Behind a server optimiser it is refused for what it is (its server update is its own),
    # no longer for a missing start.
    with pytest.raises(fjp.ConfigError, match="has a server update of its own"):
        fjp.validate_config(_config(name="fedadam_fedpals_adaptive", ess_fraction=None))
    given = fjp.validate_config(_config(name="fedpals_adaptive", ess_fraction=0.25))
    assert given.algorithm.ess_fraction == 0.25
    lam = fjp.validate_config(_config(name="fedpals_adaptive", ess_fraction=None, lam=3.0))
    assert lam.algorithm.lam == 3.0 and lam.algorithm.ess_fraction is None
    # The same run as one that names the start itself: one identity.
    explicit = fjp.validate_config(_config(ess_fraction=0.5))
    assert fjp.config_digest(explicit) == fjp.config_digest(
        fjp.validate_config(_config(name="fedpals_adaptive", ess_fraction=None)))


def test_lambda_zero_starts_the_schedule_at_the_lower_end(tmp_path):
    # lam = 0 (the protocol grid's lambda -> 0+ point) under the schedule: log-space needs a
    # start > 0, the lower end of lambda_for_ess's range, as for an unreachable ESS.
    task = fjp.build_task(_config(ess_fraction=None, lam=0.0))
    assert task.context.lam == pytest.approx(58 * 1e-6, rel=1e-6)
    assert fjp.build_task(_config(ess_fraction=None, lam=0.0, lam_schedule="fixed")).context.lam == 0.0


def test_a_variant_is_checked_where_it_is_registered():
    with pytest.raises(TypeError, match="takes a fedjax_pals.Variant"):
        fjp.register_variant(("fedpals_x", "x", "fedpals", {}))
    with pytest.raises(ValueError, match="in both overrides and defaults"):
        fjp.register_variant(fjp.Variant(
            "fedpals_x", "x", "fedpals", {"algorithm.lam": 1.0}, defaults={"algorithm.lam": 2.0}))
    with pytest.raises(ValueError, match="config paths 'section.key'"):
        fjp.register_variant(fjp.Variant("fedpals_x", "x", "fedpals", {"lam": 1.0}))
    assert "fedpals_x" not in fjp.algorithms.registry.method_keys()
