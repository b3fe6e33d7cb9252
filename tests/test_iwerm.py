"""IW-ERM: the ratios and one local step against float64 NumPy (a class absent from the client,
a tiny S_i(y) hitting the cap), T = S_i is FedAvg bit for bit, the T in use (FedPALS' state,
re-estimated), and its composition with FedPALS' weights and a server optimiser."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms.target_estimation import with_target_label_dist
from config_files import load_config
from method_testing import (
    DIM, K, TRAINING, _one_local_step, _softmax64, label_task, run, task_data, tree_close,
    tree_equal,
)


def _linear(dim, num_classes):
    """z = x W + b, a logistic-regression head."""

    def init(key):
        kw, kb = jax.random.split(key)
        return {"W": jax.random.normal(kw, (dim, num_classes)) * 0.7,
                "b": jax.random.normal(kb, (num_classes,)) * 0.3}

    return fjp.Model("linear", init, lambda p, x: x @ p["W"] + p["b"], num_classes, False)


def _ref_ratios(target, label_dist, max_ratio):
    t, s = np.asarray(target, np.float64), np.asarray(label_dist, np.float64)
    r = np.where(s > 0, t / np.where(s > 0, s, 1.0), 0.0)
    return r if max_ratio is None else np.minimum(r, max_ratio)


def _ref_step(params, x, y, target, label_dist, max_ratio, lr):
    """One SGD step on (1/B) sum_b r(y_b) CE(x_b W + b, y_b) (the reference's mean of r * loss),
    in float64."""
    W, b = np.asarray(params["W"], np.float64), np.asarray(params["b"], np.float64)
    x64 = np.asarray(x, np.float64)
    r = _ref_ratios(target, label_dist, max_ratio)[y]
    residual = r[:, None] * (_softmax64(x64 @ W + b) - np.eye(W.shape[1])[y]) / len(y)
    return W - lr * x64.T @ residual, b - lr * residual.sum(axis=0)


def test_the_ratios_are_t_over_s_capped_and_zero_where_the_client_lacks_the_class():
    target = np.array([0.2, 0.5, 0.3, 0.0])
    label_dist = np.array([0.6, 0.01, 0.0, 0.39])
    for cap in (None, 10.0, 1.0):
        got = fjp.algorithms.iwerm_ratios(target, label_dist, cap)
        np.testing.assert_allclose(got, _ref_ratios(target, label_dist, cap), rtol=1e-6)
    # 0.5 / 0.01 = 50 is capped at 10; the absent class 2 weighs 0, not inf.
    np.testing.assert_allclose(fjp.algorithms.iwerm_ratios(target, label_dist, 10.0),
                               [1 / 3, 10.0, 0.0, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="max_ratio must be > 0"):
        fjp.algorithms.iwerm_client(0.0)


@pytest.mark.parametrize("cap", [None, 10.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_local_step_is_sgd_on_the_importance_weighted_loss(cap, seed):
    # The client lacks class 2 and holds class 1 at S = 0.01 (T / S = 50: capped at 10); its
    # batch has a class-1 example, so the cap changes the step.
    rng = np.random.default_rng(seed)
    lr = 0.3
    target = 0.5 * rng.dirichlet(np.ones(K)) + np.array([0.0, 0.5, 0.0])  # T(1) >= 0.5
    label_dist = np.array([0.99, 0.01, 0.0])
    model = _linear(DIM, K)
    w = model.init(jax.random.PRNGKey(seed))
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    y = np.array([0, 0, 1, 0, 0, 0, 1, 0], np.int32)
    info = fjp.ClientInfo(jnp.asarray(label_dist, jnp.float32), jnp.int32(100), ())
    algorithm = fjp.algorithms.iwerm(target, cap)
    state = fjp.init_server_state(algorithm, w, 1)
    got = _one_local_step(algorithm, model, w, state, x, y, info, lr)
    W, b = _ref_step(w, x, y, target, label_dist, cap, lr)
    np.testing.assert_allclose(got["W"], W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["b"], b, rtol=1e-5, atol=1e-5)
    # The cap applies: the uncapped step (ratio 50 on class 1) is another step.
    other = None if cap is not None else 10.0
    W_other, _ = _ref_step(w, x, y, target, label_dist, other, lr)
    assert not np.allclose(got["W"], W_other, atol=1e-3)
    # Not the mean divided by sum r (self-normalised weights): another step too.
    r = _ref_ratios(target, label_dist, cap)[y]
    W_norm, _ = _ref_step(w, x, y, target, label_dist, cap, lr * len(y) / r.sum())
    assert not np.allclose(got["W"], W_norm, atol=1e-3)


def test_with_t_equal_to_every_clients_s_it_is_fedavg_bit_for_bit():
    # Every client and the target hold the classes alike: T = S_i, r = 1 on every class.
    counts = [[10, 10, 10], [20, 20, 20], [6, 6, 6], [8, 8, 8]]
    x, y, partition = label_task(counts, seed=0)
    data, model = task_data(x, y, partition), fjp.logistic_regression((DIM,), K)
    np.testing.assert_array_equal(partition.client_label_dists[0], partition.target_label_dist)
    ref, _ = run(fjp.fedavg(), data, model, TRAINING, rounds=2)
    got, _ = run(fjp.algorithms.iwerm(partition.target_label_dist), data, model, TRAINING,
                 rounds=2)
    assert tree_equal(got[-1].params, ref[-1].params)
    # Another T moves it.
    moved, _ = run(fjp.algorithms.iwerm([0.6, 0.3, 0.1]), data, model, TRAINING, rounds=2)
    assert not tree_close(moved[-1].params, ref[-1].params, atol=1e-5)


def test_with_fedpals_weights_the_clients_read_the_t_in_use():
    target, other = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.1, 0.8])
    pals = fjp.algorithms.iwerm(other, weighting=fjp.fedpals_weighting(target, 0.0))
    assert pals.name == "iwerm+fedpals"
    state = fjp.init_server_state(pals, {"w": jnp.zeros(1)}, 2)
    assert state.algorithm_state == ()  # no second copy of T: FedPALS' is the one
    np.testing.assert_allclose(fjp.algorithms.iwerm_target(state), target, rtol=1e-6)
    # T re-estimated between rounds (fedjax_pals.unknown_target) reaches the clients' ratios.
    estimate = np.array([0.2, 0.7, 0.1])
    np.testing.assert_allclose(
        fjp.algorithms.iwerm_target(with_target_label_dist(state, estimate)), estimate, rtol=1e-6
    )
    plain = fjp.algorithms.iwerm(other)
    np.testing.assert_allclose(
        fjp.algorithms.iwerm_target(fjp.init_server_state(plain, {"w": jnp.zeros(1)}, 2)), other,
        rtol=1e-6,
    )


def test_the_keys_resolve_and_iwerm_fedpals_trains_a_round(tmp_path):
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    algorithm = fjp.make_algorithm("iwerm_fedpals", partition=partition, lam=0.0,
                                   iwerm_max_ratio=5.0)
    assert algorithm.name == "iwerm_fedpals"
    assert algorithm.client is fjp.algorithms.iwerm_client(5.0)
    assert fjp.get_method("iwerm").label == "IW-ERM"
    resolved = fjp.validate_config(
        {"dataset": {"name": "synthetic"}, "algorithm": {"name": "fedadam_iwerm"}}
    )
    assert (resolved.algorithm.name, resolved.server.optimizer) == ("iwerm", "fedadam")
    assert resolved.algorithm.iwerm_max_ratio == fjp.algorithms.IWERM_DEFAULT_MAX_RATIO
    config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": "iwerm_fedpals"},
              "training": {"rounds": 1, "eval_every": 1, "batch_size": 8}}
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert np.isfinite(results["final_target_accuracy"])


def test_iwerm_fedpals_trains_with_t_estimated_and_its_clients_use_the_estimate(tmp_path):
    # --config.algorithm.target_estimation: T re-estimated before round 2 into FedPALS' state,
    # which the clients' ratios read (test_with_fedpals_weights_the_clients_read_the_t_in_use).
    config = {"dataset": {"name": "synthetic"},
              "algorithm": {"name": "iwerm_fedpals", "target_estimation": "bbse_constrained",
                            "target_estimation_every": 1, "lam": 0.0, "ess_fraction": None},
              "training": {"rounds": 2, "eval_every": 1, "batch_size": 8}}
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    (record,) = results["target_estimation_records"]
    assert record["round"] == 1 and record["used"]
    np.testing.assert_allclose(results["target_estimate"], record["target"], rtol=1e-6)


def test_runs_that_differ_in_t_share_one_compiled_round():
    # T is per-run data (IwermState), not compiled in.
    model = fjp.logistic_regression((DIM,), K)
    first = fjp.engine.round_engine(fjp.algorithms.iwerm([0.2, 0.3, 0.5]), model, TRAINING)
    assert fjp.engine.round_engine(fjp.algorithms.iwerm([0.6, 0.3, 0.1]), model, TRAINING) is first
    assert fjp.engine.round_engine(fjp.algorithms.iwerm([0.6, 0.3, 0.1], 3.0), model,
                                   TRAINING) is not first


def test_plain_iwerm_state_takes_the_reestimated_t_and_its_step_uses_it():
    # FedAvg's weights: T lives in IW-ERM's own IwermState, which with_target_label_dist
    # replaces (IwermState declares _estimated_target); the next local step is SGD on
    # T^(y) / S_i(y), capped, against float64 NumPy.
    rng = np.random.default_rng(3)
    lr, cap = 0.3, 10.0
    start, estimate = np.array([0.4, 0.3, 0.3]), np.array([0.1, 0.6, 0.3])
    label_dist = np.array([0.5, 0.04, 0.46])  # 0.6 / 0.04 = 15: capped
    model = _linear(DIM, K)
    w = model.init(jax.random.PRNGKey(0))
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 2], np.int32)
    info = fjp.ClientInfo(jnp.asarray(label_dist, jnp.float32), jnp.int32(50), ())
    algorithm = fjp.algorithms.iwerm(start, cap)
    state = fjp.init_server_state(algorithm, w, 1)
    moved = with_target_label_dist(state, estimate)
    np.testing.assert_allclose(fjp.algorithms.iwerm_target(moved), estimate, rtol=1e-6)
    np.testing.assert_allclose(
        fjp.algorithms.TargetReestimation.current(moved), estimate, rtol=1e-6)
    got = _one_local_step(algorithm, model, w, moved, x, y, info, lr)
    W, b = _ref_step(w, x, y, estimate, label_dist, cap, lr)
    np.testing.assert_allclose(got["W"], W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["b"], b, rtol=1e-5, atol=1e-5)
    W_start, _ = _ref_step(w, x, y, start, label_dist, cap, lr)
    assert not np.allclose(got["W"], W_start, atol=1e-3)
    with pytest.raises(ValueError, match="shape"):
        with_target_label_dist(state, [0.5, 0.5])


def _per_example_weights(algorithm, state, label_dist):
    """The weight of one example of each class in the client's loss: its data loss at zero
    logits (cross-entropy log K) on a batch of that one example, over log K."""
    info = fjp.ClientInfo(jnp.asarray(label_dist, jnp.float32), jnp.int32(1), ())
    logits = jnp.zeros((1, K), jnp.float32)
    return np.array([
        float(algorithm.client.data_loss(logits, jnp.array([k], jnp.int32),
                                         jnp.array([True]), info, state, None)) / np.log(K)
        for k in range(K)])


def test_plain_iwerm_with_t_estimated_reweights_its_clients_losses_by_each_estimate():
    # algorithm.target_estimation with method iwerm (FedAvg's weights): the config is accepted,
    # T starts at the clients' aggregate sum_i n_i S_i / N, and each re-estimate reaches the
    # clients' per-example weights, min(T^(y) / S_i(y), cap), against float64 NumPy.
    cap = 0.7  # T^(y) / S_i(y) reaches about 0.75-0.8 on this task
    config = {"dataset": {"name": "synthetic"},
              "algorithm": {"name": "iwerm", "target_estimation": "bbse_constrained",
                            "target_estimation_every": 1, "iwerm_max_ratio": cap},
              "training": {"rounds": 3, "eval_every": 1, "batch_size": 8}}
    resolved = fjp.validate_config(config)
    assert (resolved.algorithm.name, resolved.algorithm.weights) == ("iwerm", "fedavg")
    assert resolved.algorithm.target_estimation == "bbse_constrained"
    task = fjp.build_task(config)
    partition = task.partition
    sizes = np.asarray(partition.client_sizes, np.float64)
    dists = np.asarray(partition.client_label_dists, np.float64)
    aggregate = sizes @ dists / sizes.sum()
    state0 = fjp.init_server_state(task.algorithm, task.model.init(jax.random.PRNGKey(0)),
                                   len(sizes))
    np.testing.assert_allclose(fjp.algorithms.iwerm_target(state0), aggregate, rtol=1e-6)
    ((feature, hp),) = [(f, h) for f, h in task.features if f.name == "unknown_target"]
    monitor = feature.monitor(hp, task)
    seen = []

    def update(round_index, state_of):
        new = monitor.update_state(round_index, state_of)
        if new is not None:
            seen.append(new)
        return new

    fjp.run_training(task.algorithm, task.model, task.dataset, partition, task.training,
                     rounds=3, seed=0, update_state=update)
    used = [r for r in monitor.records if r["used"]]
    assert [r["round"] for r in used] == [1, 2] and len(seen) == 2
    clipped = False
    for record, state in zip(used, seen):
        estimate = np.asarray(record["target"], np.float64)
        assert np.abs(estimate - aggregate).sum() > 1e-3  # the estimate moved T
        for label_dist in dists:
            got = _per_example_weights(task.algorithm, state, label_dist)
            np.testing.assert_allclose(got, _ref_ratios(estimate, label_dist, cap), rtol=1e-5,
                                       atol=1e-6)
            assert not np.allclose(got, _ref_ratios(aggregate, label_dist, cap), atol=1e-4)
            clipped |= bool(np.any(_ref_ratios(estimate, label_dist, None) > cap))
    assert clipped, [r["target"] for r in used]  # the cap binds on some class of some client


def test_target_estimation_resolves_only_for_methods_that_read_t():
    # iwerm declares the state holding its T (IwermState); fedprox (no T read) with FedAvg's
    # weights keeps target_estimation None, as before.
    iwerm = fjp.get_method("iwerm")
    assert fjp.unknown_target.declared_target_state(iwerm) is fjp.algorithms.IwermState
    assert fjp.unknown_target.declared_target_state(fjp.get_method("fedprox")) is None
    for estimator in ("vrls", "mapls"):
        resolved = fjp.validate_config({"dataset": {"name": "synthetic"}, "algorithm": {
            "name": "iwerm", "target_estimation": estimator}})
        assert resolved.algorithm.target_estimation == estimator
    assert resolved.algorithm.target_estimation_concentration is None  # mapls: adaptive
    resolved = fjp.validate_config({"dataset": {"name": "synthetic"}, "algorithm": {
        "name": "fedprox", "target_estimation": "vrls"}})
    assert resolved.algorithm.target_estimation is None


def test_the_unknown_t_config_has_an_iwerm_row_with_t_estimated():
    # configs/beyond_unknown_target.py's unknown_t_iwerm: IW-ERM (FedAvg's weights) with the
    # default estimator, in-sample, undamped; accepted as a sweep's method beside iwerm.
    config = load_config("beyond_unknown_target.py", "3")
    config.algorithm.name = "unknown_t_iwerm"
    resolved = fjp.validate_config(config)
    assert (resolved.algorithm.name, resolved.algorithm.weights) == ("iwerm", "fedavg")
    assert resolved.algorithm.target_estimation == "bbse_constrained"
    assert (resolved.algorithm.target_holdout, resolved.algorithm.target_damping) == (0.0, 1.0)


def test_the_loss_reweighting_config_spans_its_methods_at_both_budgets():
    # configs/beyond_loss_reweighting.py: Table 1's rows, every IW-ERM and FedVLS form beside
    # FedPALS, FedAvg and the Oracle; the docstring's run counts.
    paper = load_config("beyond_loss_reweighting.py", "3")
    assert paper.sweep.row == "Fashion-MNIST C=3"  # Table 1's row, for experiments.compare
    runs = fjp.expand_sweep(paper)
    per_method = {}
    for name, _ in runs:
        per_method[name.split("/")[0]] = per_method.get(name.split("/")[0], 0) + 1
    # 3 learning rates x 8 seeds x (5 lambdas where FedPALS weighs; FedVLS' 2 lambdas).
    assert per_method == {"fedpals": 120, "fedavg": 24, "iwerm": 24, "iwerm_unknown_t": 24,
                          "iwerm_fedpals": 120, "fedvls": 48, "fedvls_fedpals": 240,
                          "oracle": 24}
    session = load_config("beyond_loss_reweighting.py", "2,session")
    assert session.training.rounds == 10
    assert session.partition.labels_per_client == 2
    runs = dict(fjp.expand_sweep(session))
    assert len(runs) == 64
    for name, config in runs.items():
        resolved = fjp.validate_config(config)
        assert resolved.training.learning_rate == 0.1
        if resolved.algorithm.weights == "fedpals":
            assert resolved.algorithm.lam == 0.0 and resolved.algorithm.ess_fraction is None
        if resolved.algorithm.name == "fedvls":
            assert resolved.algorithm.fedvls_lambda == 1.0
    estimated = fjp.validate_config(runs["iwerm_unknown_t/learning_rate=0.1/seed_3"])
    assert (estimated.algorithm.name, estimated.algorithm.weights) == ("iwerm", "fedavg")
    assert estimated.algorithm.target_estimation == "bbse_constrained"
    assert (estimated.algorithm.target_holdout, estimated.algorithm.target_damping) == (0.0, 1.0)
    known = fjp.validate_config(runs["iwerm/learning_rate=0.1/seed_3"])
    assert known.algorithm.target_estimation is None
    combined = fjp.validate_config(
        runs["fedvls_fedpals/fedvls_lambda=1,lam=0,learning_rate=0.1/seed_3"])
    assert (combined.algorithm.name, combined.algorithm.weights) == ("fedvls", "fedpals")
    with pytest.raises(ValueError, match="'paper' or 'session'"):
        load_config("beyond_loss_reweighting.py", "3,sesion")
