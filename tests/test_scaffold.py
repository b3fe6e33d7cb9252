"""SCAFFOLD: its first round is FedAvg's, and its control variates follow option II."""

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_pals as fjp
from method_testing import DIM, K, LR, label_task, run, task_data, tree_close, tree_equal


def test_scaffold_first_round_equals_fedavg():
    counts = [[5, 3, 0], [0, 4, 4], [2, 2, 4], [10, 10, 10]]  # equal sizes n_i = 8
    train_x, train_y, partition = label_task(counts)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    one_step = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=LR)
    ref, _ = run(fjp.fedavg(), data, model, one_step, rounds=1)
    got, metrics = run(fjp.algorithms.scaffold(), data, model, one_step, rounds=1)
    np.testing.assert_array_equal(metrics[0]["num_steps"], [1, 1, 1])
    np.testing.assert_allclose(metrics[0]["weights"], [1 / 3] * 3, rtol=1e-6)
    assert tree_close(got[-1].params, ref[-1].params, atol=1e-6, rtol=1e-6)
    # One full-batch step from c = c_i = 0: c_i+ = (x - y_i) / lr = g_i(x), and c = mean_i c_i+.
    grad = jax.jit(jax.grad(_client_loss(model, train_x, train_y)), static_argnums=1)
    x0, state = got[0].params, got[-1]
    for i in range(3):
        ci = jax.tree_util.tree_map(lambda leaf: leaf[i], state.client_states)
        assert tree_close(ci, grad(x0, tuple(partition.client_example_indices(i))), atol=1e-4)
    mean_ci = jax.tree_util.tree_map(lambda leaf: jnp.mean(leaf, axis=0), state.client_states)
    assert tree_close(state.algorithm_state.c, mean_ci, atol=1e-6)


def _client_loss(model, train_x, train_y):
    """Mean cross-entropy of params on the examples `idx` (a tuple)."""

    def loss(params, idx):
        idx = np.asarray(idx)
        logits = model.apply(params, jnp.asarray(train_x[idx]))
        return jnp.mean(-jax.nn.log_softmax(logits)[np.arange(len(idx)), train_y[idx]])

    return loss


def test_scaffold_control_variates_follow_option_two():
    # n = (8, 8, 4), batch 4: clients 0 and 1 take K = 2 steps, client 2 takes K = 1 (full batch).
    counts = [[5, 3, 0], [0, 4, 4], [2, 1, 1], [10, 10, 10]]
    train_x, train_y, partition = label_task(counts, seed=1)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    schedule = [np.array([0]), np.array([2]), np.array([0, 1])]
    states, metrics = run(
        fjp.algorithms.scaffold(),
        data,
        model,
        training,
        rounds=3,
        participants=lambda r: schedule[r],
        backend="host_loop",
    )
    s0, s1, s2, s3 = states
    c_of = lambda s: s.algorithm_state.c
    ci_of = lambda s, i: jax.tree_util.tree_map(lambda leaf: leaf[i], s.client_states)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, s0.params)

    # Round 1, client 0 alone (y_0 = x_1): c_0+ = 0 - 0 + (x_0 - y_0) / (2 lr); c = c_0+ / 3.
    assert int(metrics[0]["num_steps"][0]) == 2
    c0 = jax.tree_util.tree_map(lambda x, y: (x - y) / (2 * LR), s0.params, s1.params)
    assert tree_close(ci_of(s1, 0), c0, atol=1e-5)
    assert tree_close(c_of(s1), jax.tree_util.tree_map(lambda v: v / 3, c0), atol=1e-6)
    assert tree_equal(ci_of(s1, 1), zeros) and tree_equal(ci_of(s1, 2), zeros)

    # Round 2, client 2 alone, one full-batch step: y = x_1 - lr (g_2(x_1) - c_2 + c).
    assert int(metrics[1]["num_steps"][0]) == 1
    g2 = jax.grad(_client_loss(model, train_x, train_y))(
        s1.params, tuple(partition.client_example_indices(2))
    )
    expected_y = jax.tree_util.tree_map(
        lambda x, g, c: x - LR * (g - 0.0 + c), s1.params, g2, c_of(s1)
    )
    assert tree_close(s2.params, expected_y, atol=1e-5)
    c2 = jax.tree_util.tree_map(
        lambda c, x, y: 0.0 - c + (x - y) / LR, c_of(s1), s1.params, s2.params
    )
    assert tree_close(ci_of(s2, 2), c2, atol=1e-4)
    # ... which option II makes equal to the plain gradient g_2(x_1).
    assert tree_close(ci_of(s2, 2), g2, atol=1e-4)
    assert tree_close(
        c_of(s2), jax.tree_util.tree_map(lambda c, d: c + d / 3, c_of(s1), c2), atol=1e-6
    )
    assert tree_equal(ci_of(s2, 0), ci_of(s1, 0)) and tree_equal(ci_of(s2, 1), zeros)

    # Round 3, clients 0 and 1: c <- c + (|S|/N) mean(c_i+ - c_i); client 2's c_i untouched.
    delta = jax.tree_util.tree_map(
        lambda a0, a1, b0, b1: (a0 - b0 + a1 - b1) / 3,
        ci_of(s3, 0),
        ci_of(s3, 1),
        ci_of(s2, 0),
        ci_of(s2, 1),
    )
    assert tree_close(c_of(s3), jax.tree_util.tree_map(jnp.add, c_of(s2), delta), atol=1e-6)
    assert tree_equal(ci_of(s3, 2), ci_of(s2, 2))
    assert not tree_equal(ci_of(s3, 1), zeros)


def test_scaffold_client_state_and_correction_are_option_two():
    # c_i+ = c_i - c + (x - y_i) / (K eta_l); a local gradient g becomes g - c_i + c.
    rng = np.random.default_rng(0)
    shapes = {"a": (3,), "b": (2, 2)}
    draw = lambda: {n: rng.normal(size=s) for n, s in shapes.items()}
    ci, c, x, y, g = draw(), draw(), draw(), draw(), draw()
    f32 = lambda t: jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), t)
    client = fjp.algorithms.scaffold_client()
    state = fjp.init_server_state(fjp.algorithms.scaffold(), f32(x), 2)
    state = state._replace(algorithm_state=fjp.algorithms.ScaffoldState(f32(c)))
    info = fjp.ClientInfo(jnp.ones(K) / K, jnp.int32(8), f32(ci))
    lr, steps = 0.05, 3
    got = client.update_client_state(info, state, f32(y), jnp.int32(steps), lr)
    for n in shapes:
        want = ci[n] - c[n] + (x[n] - y[n]) / (steps * lr)
        np.testing.assert_allclose(got[n], want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(
            client.correct_grads(f32(g), info, state)[n], g[n] - ci[n] + c[n], atol=1e-6
        )
    # A client that took no step keeps its control variate.
    kept = client.update_client_state(info, state, f32(y), jnp.int32(0), lr)
    assert tree_equal(kept, f32(ci))
