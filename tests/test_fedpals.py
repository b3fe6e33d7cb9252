"""FedPALS' weighting under partial participation, and `make_algorithm` (which lives with it)."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms.feddisco import _feddisco_weights_fn
from fedjax_pals.algorithms.fedpals import _fedpals_weights
from method_testing import DIM, K, TRAINING, label_task, run, task_data


def test_fedpals_weights_with_partial_participation_match_fedpals_weights():
    counts = [[8, 1, 1], [1, 8, 1], [1, 1, 8], [5, 5, 0], [0, 4, 6], [3, 3, 4], [10, 5, 5]]
    train_x, train_y, partition = label_task(counts, seed=3)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    lam = 0.5
    algorithm = fjp.make_algorithm(
        "fedprox", partition=partition, lam=lam, prox_mu=0.01, weights="fedpals"
    )
    assert algorithm.name == "fedprox_fedpals"
    chosen = lambda r: fjp.training.sample_participants(7, r, partition.num_clients, 3)
    _, metrics = run(algorithm, data, model, TRAINING, rounds=3, participants=chosen)
    dists, sizes = partition.client_label_dists, partition.client_sizes
    for r, m in enumerate(metrics):
        who = chosen(r)
        expected = fjp.fedpals_weights(dists[who], partition.target_label_dist, sizes[who], lam)
        np.testing.assert_allclose(m["weights"], expected, atol=1e-5)


def test_fedpals_with_the_projected_gradient_solver_weighs_by_it():
    # lam = 0 with M = 7 > K = 3 and T inside Conv(S): eq. 8 has a flat set of minimisers, and
    # the two solvers stop at different ones (by 1e-2), so the round's weights tell which ran.
    counts = [[8, 1, 1], [1, 8, 1], [1, 1, 8], [5, 5, 0], [0, 4, 6], [3, 3, 4], [10, 5, 5]]
    train_x, train_y, partition = label_task(counts, seed=3)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    dists, sizes, target = (
        partition.client_label_dists, partition.client_sizes, partition.target_label_dist
    )
    algorithm = fjp.fedpals(target, 0.0, weights_solver="projected_gradient")
    assert algorithm.name == "fedpals" and algorithm.weighting.name == "fedpals"
    _, metrics = run(algorithm, data, model, TRAINING, rounds=1)
    solved = fjp.fedpals_weights(dists, target, sizes, 0.0, solver="projected_gradient")
    exact = fjp.fedpals_weights(dists, target, sizes, 0.0)
    assert np.abs(np.asarray(solved) - np.asarray(exact)).max() > 1e-3
    np.testing.assert_allclose(metrics[0]["weights"], solved, atol=1e-6)
    # One weights function per solver (the engine keys its compiled rounds on it); naming the
    # default solver is the default run.
    again = fjp.fedpals(target, 0.5, weights_solver="projected_gradient")
    assert algorithm.weighting.weights is again.weighting.weights
    default = fjp.fedpals(target, 0.0).weighting.weights
    assert default is _fedpals_weights
    assert fjp.fedpals(target, 0.0, weights_solver="active_set").weighting.weights is default
    assert fjp.fedpals_weighting(target, 0.0, solver="active_set").weights is default
    assert algorithm.weighting.weights is not default
    for bad in ("projected", "", 1):
        with pytest.raises(ValueError, match=r"weights_solver must be one of \['active_set'"):
            fjp.fedpals(target, 0.0, weights_solver=bad)
        with pytest.raises(ValueError, match=r"solver must be one of \['active_set'"):
            fjp.fedpals_weighting(target, 0.0, solver=bad)


def test_make_algorithm_builds_stable_pieces_and_validates():
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    for name in fjp.registered_methods():
        own = fjp.hyperparameters.hyperparameter_checks(fjp.get_method(name).hyperparameters)
        kwargs = dict(partition=partition, lam=0.1)
        kwargs.update({k: v for k, v in dict(prox_mu=0.01, afl_step=0.1).items() if k in own})
        first = fjp.make_algorithm(name, **kwargs)
        again = fjp.make_algorithm(name, **kwargs)
        # Equal hyperparameters -> the same functions, so the engine reuses its compiled round.
        assert first.client is again.client or first.client == again.client
        assert first.weighting.weights is again.weighting.weights
        assert first.server_update == again.server_update  # a value (WeightedAverageUpdate)
    model, training = fjp.logistic_regression((2,), 3), TRAINING
    assert fjp.engine.round_engine(fjp.algorithms.scaffold(1.0), model, training) is fjp.engine.round_engine(
        fjp.make_algorithm("scaffold", server_lr=1.0), model, training
    )
    assert fjp.make_algorithm("fedrs", fedrs_alpha=0.5).client == fjp.algorithms.fedrs_client(0.5)
    shift = fjp.make_algorithm("fedshift", partition=partition, weights="fedpals", lam=1.0)
    assert shift.name == "fedshift_fedpals" and shift.weighting.name == "fedpals"
    bad = [
        dict(name="nope"),
        dict(name="fedprox", mu=0.1),
        dict(name="fedprox_fedpals", prox_mu=0.1, weights="fedavg"),
        dict(name="fedpals_adaptive", partition=partition, lam=0.1),
        dict(name="fedpals", lam=0.1),
        dict(name="fedpals", partition=partition),
        dict(name="fedshift"),
        dict(name="fedprox", prox_mu=-1.0),
        dict(name="fedrs", fedrs_alpha=0.0),
        dict(name="fedrs", fedrs_alpha=1.5),
        dict(name="fedavg", weights="fedpals"),
        dict(name="scaffold", weights="fedpals"),
        dict(name="fedprox", prox_mu=0.1, weights="uniform"),
        dict(name="fedprox", prox_mu=0.1, weights="fedpals", lam=0.1),
        dict(name="fedavg", server_lr=0.5),
        dict(name="scaffold", server_lr=0.0),
        dict(name="afl", afl_step=-0.1),
        dict(name="fedrs", fedrs_soft="yes"),
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            fjp.make_algorithm(**kwargs)


def test_make_algorithm_builds_feddisco_and_fedlc():
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    disco = fjp.make_algorithm(
        "feddisco", partition=partition, feddisco_a=0.3, feddisco_b=0.0, feddisco_metric="l2"
    )
    assert disco.weighting.weights is _feddisco_weights_fn("l2")
    state = fjp.init_server_state(disco, {"w": jnp.zeros(1)}, partition.num_clients)
    np.testing.assert_allclose(
        state.weighting_state.global_label_dist, partition.target_label_dist
    )
    assert float(state.weighting_state.a) == pytest.approx(0.3)
    lc = fjp.make_algorithm(
        "fedlc", fedlc_tau=0.5, weights="fedpals", partition=partition, lam=0.0
    )
    assert lc.name == "fedlc_fedpals" and lc.client is fjp.algorithms.fedlc_client(0.5)
    for kwargs in (
        dict(name="feddisco"),
        dict(name="feddisco", partition=partition, weights="fedpals", lam=0.0),
        dict(name="feddisco", partition=partition, feddisco_a=-1.0),
        dict(name="fedlc", fedlc_tau=-1.0),
    ):
        with pytest.raises(ValueError):
            fjp.make_algorithm(**kwargs)


def test_a_config_selects_the_projected_gradient_solver():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    default = fjp.validate_config(config)
    assert default.algorithm.weights_solver is None
    assert "weights_solver" not in fjp.experiment.config.config_identity(default)["algorithm"]
    config.algorithm.weights_solver = "projected_gradient"
    task = fjp.build_task(config)
    assert task.config.algorithm.weights_solver == "projected_gradient"
    assert fjp.config_digest(config) != fjp.config_digest(default)
    weights = task.algorithm.weighting.weights
    again = fjp.fedpals(task.target_label_dist, 0.0, weights_solver="projected_gradient")
    assert weights is again.weighting.weights
    assert weights is not _fedpals_weights
    from fedjax_pals.experiment.task import task_summary

    p = task.partition
    expected = fjp.fedpals_weights(
        p.client_label_dists, task.target_label_dist, p.client_sizes, task.context.lam,
        solver="projected_gradient",
    )
    np.testing.assert_allclose(task_summary(task)["alpha"], expected, atol=1e-7)
    # Naming the default solver is the default run (same digest, same weights function).
    config.algorithm.weights_solver = "active_set"
    assert fjp.config_digest(config) == fjp.config_digest(default)
    assert fjp.build_task(config).algorithm.weighting.weights is _fedpals_weights
    config.algorithm.weights_solver = "projected"
    with pytest.raises(fjp.ConfigError, match=r"weights_solver must be one of .*did you mean"):
        fjp.validate_config(config)
