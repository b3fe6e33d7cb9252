"""AFL: lambda's projected ascent step on the simplex, partial participation, the iterates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from method_testing import (
    DIM, K, TRAINING, label_task, run, synthetic, task_data, tree_close, tree_equal,
)


def test_afl_lambda_stays_on_the_simplex_and_moves_towards_the_larger_loss():
    data, _, model = synthetic()
    states, metrics = run(fjp.algorithms.afl(0.5), data, model, TRAINING, rounds=2)
    lam0 = np.asarray(states[0].algorithm_state.lam)
    np.testing.assert_allclose(lam0, [0.5, 0.5])
    for state, m in zip(states[1:], metrics):
        lam = np.asarray(state.algorithm_state.lam)
        assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0, abs=1e-6)
    lam1, loss = np.asarray(states[1].algorithm_state.lam), np.asarray(
        metrics[0]["initial_loss"]
    )
    worse = int(np.argmax(loss))
    assert loss[worse] > loss[1 - worse] and lam1[worse] > 0.5
    # Full participation: lam_1 = Proj_simplex(lam_0 + gamma L), here in the interior.
    gap = 0.5 * (loss[worse] - loss[1 - worse])
    assert lam1[worse] == pytest.approx(min(1.0, 0.5 + 0.5 * gap), abs=1e-5)
    # The model mixes with lam; the reported model is the mean of the iterates w_1, w_2.
    np.testing.assert_allclose(metrics[1]["weights"], lam1, rtol=1e-6)
    mean_iterate = jax.tree_util.tree_map(
        lambda a, b: (a + b) / 2, states[1].params, states[2].params
    )
    assert tree_close(fjp.algorithms.afl(0.5).eval_params(states[2]), mean_iterate, atol=1e-6)


def test_afl_with_partial_participation_moves_only_the_participants_lambda():
    counts = [[8, 0, 0], [0, 8, 0], [0, 0, 8], [4, 4, 0], [10, 10, 10]]
    train_x, train_y, partition = label_task(counts, seed=2)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    schedule = [np.array([0, 2]), np.array([1, 3])]
    states, metrics = run(
        fjp.algorithms.afl(2.0),
        data,
        model,
        TRAINING,
        rounds=2,
        participants=lambda r: schedule[r],
        backend="host_loop",
    )
    for r, who in enumerate(schedule):
        before = np.asarray(states[r].algorithm_state.lam)
        after = np.asarray(states[r + 1].algorithm_state.lam)
        others = np.setdiff1d(np.arange(4), who)
        np.testing.assert_array_equal(after[others], before[others])
        assert after.sum() == pytest.approx(1.0, abs=1e-6) and np.all(after >= 0)
        assert after[who].sum() == pytest.approx(before[who].sum(), abs=1e-6)
        np.testing.assert_allclose(
            metrics[r]["weights"], before[who] / before[who].sum(), rtol=1e-6
        )
        loss = np.asarray(metrics[r]["initial_loss"])
        assert after[who][np.argmax(loss)] > before[who][np.argmax(loss)]


def _project_simplex64(v, mass):
    """Euclidean projection onto {u >= 0, sum u = mass} (sort-based, Duchi et al., 2008)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u * np.arange(1, len(v) + 1) > css - mass)[0][-1]
    return np.maximum(v - (css[rho] - mass) / (rho + 1), 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_afl_lambda_step_is_the_projected_ascent_step(seed):
    # lam_S <- Proj_{sum = m_S}(lam_S + gamma L_S), m_S = sum_{i in S} lam_i; the others kept.
    rng = np.random.default_rng(seed)
    m, gamma = 6, 0.8
    lam = rng.dirichlet(np.ones(m))
    who = np.sort(rng.choice(m, size=4, replace=False))
    losses = rng.exponential(1.0, size=4)
    params = {"w": jnp.zeros(2)}
    state = fjp.init_server_state(fjp.algorithms.afl(gamma), params, m)
    state = state._replace(
        algorithm_state=state.algorithm_state._replace(lam=jnp.asarray(lam, jnp.float32))
    )
    outputs = fjp.ClientOutputs(
        deltas={"w": jnp.zeros((4, 2))},
        client_states=(),
        train_loss=jnp.zeros(4),
        num_steps=jnp.ones(4, jnp.int32),
        initial_loss=jnp.asarray(losses, jnp.float32),
    )
    weights = jnp.asarray(lam[who] / lam[who].sum(), jnp.float32)
    new = fjp.algorithms.afl_server_update(gamma)(state, jnp.asarray(who), outputs, weights)
    got = np.asarray(new.algorithm_state.lam)
    want = lam.copy()
    want[who] = _project_simplex64(lam[who] + gamma * losses, lam[who].sum())
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert got.sum() == pytest.approx(1.0, abs=1e-6)


def test_afl_reports_the_averaged_or_the_last_iterate():
    data, _, model = synthetic()
    states, _ = run(fjp.algorithms.afl(0.5), data, model, TRAINING, rounds=2)
    last = fjp.algorithms.afl(0.5, average_iterates=False)
    assert tree_equal(last.eval_params(states[2]), states[2].params)
    assert not tree_close(fjp.algorithms.afl(0.5).eval_params(states[2]), states[2].params, atol=1e-6)
    with pytest.raises(ValueError, match="average_iterates must be a bool"):
        fjp.algorithms.afl(0.5, average_iterates=1)


@pytest.mark.parametrize("step", [0, 0.0, -0.1, float("nan")])
def test_afl_refuses_a_step_size_the_config_refuses(step):
    # The config's rule for algorithm.afl_step, in its words: a step of 0 never moves lam.
    with pytest.raises(ValueError, match=r"afl_step must be a finite number > 0"):
        fjp.algorithms.AflHyperparameters(afl_step=step)
    with pytest.raises(ValueError, match=r"^step_size must be a finite number > 0, got"):
        fjp.algorithms.afl(step)
    with pytest.raises(ValueError, match=r"^step_size must be a finite number > 0, got"):
        fjp.algorithms.afl_server_update(step)
