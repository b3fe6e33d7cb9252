"""The baselines: each method's defining property, on tiny tasks and few rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optax

import fedjax_pals as fjp
from fedjax_pals import baselines
from fedjax_pals.engine.client_update import LocalCarry, make_local_step

LR = 0.1
DIM, K = 4, 3


def _tree_close(a, b, atol=0.0, rtol=0.0):
    return all(
        np.allclose(np.asarray(u), np.asarray(v), atol=atol, rtol=rtol)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def _tree_equal(a, b):
    return all(
        np.array_equal(np.asarray(u), np.asarray(v))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def _tree_norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(tree))))


def _tree_sub(a, b):
    return jax.tree_util.tree_map(jnp.subtract, a, b)


def _label_task(label_counts, seed=0, pool=60):
    """Gaussian classes in DIM dims; a partition with the given (clients + target) label counts."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(K, DIM))
    train_y = np.repeat(np.arange(K), pool).astype(np.int32)
    test_y = np.repeat(np.arange(K), 20).astype(np.int32)
    train_x = (means[train_y] + rng.normal(size=(len(train_y), DIM))).astype(np.float32)
    partition = fjp.data.partition_from_label_counts(
        train_y, test_y, np.asarray(label_counts), seed=seed, description="test task"
    )
    return train_x, train_y, partition


def _data(train_x, train_y, partition):
    return fjp.engine.device_data(
        train_x,
        train_y,
        partition.client_indices,
        partition.client_sizes,
        partition.client_label_dists,
    )


def _synthetic():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    model = fjp.logistic_regression((2,), 3)
    return _data(dataset.train.x, dataset.train.y, partition), partition, model


def _run(
    algorithm, data, model, training, *, rounds, participants=None, backend="vmap_scan", seed=0
):
    """Rounds of `algorithm`; returns (states after each round incl. the initial, metrics)."""
    num_clients = int(data.client_sizes.shape[0])
    engine = fjp.engine.round_engine(algorithm, model, training, backend=backend)
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(seed)), num_clients)
    states, metrics = [state], []
    for r in range(rounds):
        who = np.arange(num_clients) if participants is None else participants(r)
        state, m = engine.run_round(
            data,
            state,
            jnp.asarray(who, jnp.int32),
            jax.random.fold_in(jax.random.PRNGKey(seed + 1), r),
        )
        states.append(state)
        metrics.append(m)
    return states, metrics


TRAINING = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=LR)


# -- client methods reducing to FedAvg ------------------------------------------


def test_fedprox_with_mu_zero_equals_fedavg():
    data, _, model = _synthetic()
    ref, _ = _run(fjp.fedavg(), data, model, TRAINING, rounds=3)
    got, _ = _run(baselines.fedprox(0.0), data, model, TRAINING, rounds=3)
    assert _tree_equal(got[-1].params, ref[-1].params)


def test_fedprox_with_mu_positive_pulls_towards_the_global_model():
    data, _, model = _synthetic()
    ref, _ = _run(fjp.fedavg(), data, model, TRAINING, rounds=1)
    got, _ = _run(baselines.fedprox(1.0), data, model, TRAINING, rounds=1)
    start = ref[0].params
    assert not _tree_close(got[-1].params, ref[-1].params, atol=1e-6)
    assert _tree_norm(_tree_sub(got[-1].params, start)) < _tree_norm(
        _tree_sub(ref[-1].params, start)
    )
    # The regulariser is (mu/2)||w - w_g||^2 itself.
    reg = baselines.fedprox_client(0.5).regularizer
    w = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    g = {"a": jnp.array([0.0, 0.0]), "b": jnp.array([[1.0]])}
    assert float(reg(w, g)) == pytest.approx(0.25 * (1 + 4 + 4))


def test_fedrs_with_alpha_one_equals_fedavg():
    data, _, model = _synthetic()  # client 1 lacks class 2, client 2 lacks class 1
    ref, _ = _run(fjp.fedavg(), data, model, TRAINING, rounds=2)
    got, _ = _run(baselines.fedrs(1.0), data, model, TRAINING, rounds=2)
    assert _tree_equal(got[-1].params, ref[-1].params)
    moved, _ = _run(baselines.fedrs(0.5), data, model, TRAINING, rounds=2)
    assert not _tree_close(moved[-1].params, ref[-1].params, atol=1e-6)


def test_fedrs_scales_the_logits_of_absent_classes():
    logits = jnp.array([[2.0, -1.0, 4.0], [1.0, 3.0, -2.0]])
    info = fjp.ClientInfo(jnp.array([0.75, 0.25, 0.0]), jnp.int32(8), ())
    hard = baselines.fedrs_client(0.5).adjust_logits(logits, info, None)
    np.testing.assert_allclose(hard, logits * jnp.array([1.0, 1.0, 0.5]))
    soft = baselines.fedrs_client(0.5, soft=True).adjust_logits(logits, info, None)
    # alpha + (1 - alpha) p_k / max_j p_j = [1, 0.5 + 0.5/3, 0.5]
    np.testing.assert_allclose(soft, logits * jnp.array([1.0, 0.5 + 0.5 / 3, 0.5]), rtol=1e-6)


def test_fedshift_with_identical_client_label_dists_equals_fedavg():
    counts = [[6, 4, 10], [6, 4, 10], [6, 4, 10], [10, 10, 10]]
    train_x, train_y, partition = _label_task(counts)
    data, model = _data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    aggregate = baselines.fedshift_aggregate_label_dist(partition.client_label_counts)
    ref, _ = _run(fjp.fedavg(), data, model, TRAINING, rounds=3)
    got, _ = _run(baselines.fedshift(aggregate), data, model, TRAINING, rounds=3)
    # s_ik = ln P_i(k) - ln P(k) = 0 up to float32 rounding of P.
    assert _tree_close(got[-1].params, ref[-1].params, atol=1e-6, rtol=1e-6)
    assert not _tree_equal(ref[-1].params, ref[0].params)
    # Another P (per-run data in the state) shifts the logits, with the same compiled round:
    # the rounds above compiled everything these rounds run.
    counter = fjp.engine.CompilationCounter()
    with counter.track():
        other, _ = _run(baselines.fedshift([0.6, 0.3, 0.1]), data, model, TRAINING, rounds=3)
    assert counter.compilations == 0
    assert not _tree_close(other[-1].params, ref[-1].params, atol=1e-4)


def test_fedshift_adds_the_log_ratio_of_smoothed_label_dists():
    counts = np.array([[3, 1, 0], [1, 1, 6]])
    aggregate = baselines.fedshift_aggregate_label_dist(counts, smoothing=1.0)
    p1, p2 = (counts + 1.0) / (counts.sum(1, keepdims=True) + 3.0)
    np.testing.assert_allclose(aggregate, (4 * p1 + 8 * p2) / 12)
    assert np.all(aggregate > 0) and aggregate.sum() == pytest.approx(1.0)
    alg = baselines.fedshift(aggregate)
    state = fjp.init_server_state(alg, {"w": jnp.zeros(1)}, 2)
    logits = jnp.array([[0.5, 1.0, -1.0]])
    info = fjp.ClientInfo(jnp.array([0.75, 0.25, 0.0]), jnp.int32(4), ())
    shifted = alg.client.adjust_logits(logits, info, state)
    np.testing.assert_allclose(shifted, logits + np.log(p1 / aggregate), rtol=1e-5)
    # A client method that reads P cannot be assembled without it.
    bare = baselines.combine(baselines.fedshift_client(), None)
    with pytest.raises(ValueError, match="aggregate_label_dist"):
        bare.client.adjust_logits(logits, info, fjp.init_server_state(bare, {"w": jnp.zeros(1)}, 2))
    with pytest.raises(ValueError, match="strictly positive"):
        baselines.fedshift([0.5, 0.5, 0.0])


# -- SCAFFOLD -------------------------------------------------------------------


def test_scaffold_first_round_equals_fedavg():
    counts = [[5, 3, 0], [0, 4, 4], [2, 2, 4], [10, 10, 10]]  # equal sizes n_i = 8
    train_x, train_y, partition = _label_task(counts)
    data, model = _data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    one_step = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=LR)
    ref, _ = _run(fjp.fedavg(), data, model, one_step, rounds=1)
    got, metrics = _run(baselines.scaffold(), data, model, one_step, rounds=1)
    np.testing.assert_array_equal(metrics[0]["num_steps"], [1, 1, 1])
    np.testing.assert_allclose(metrics[0]["weights"], [1 / 3] * 3, rtol=1e-6)
    assert _tree_close(got[-1].params, ref[-1].params, atol=1e-6, rtol=1e-6)
    # One full-batch step from c = c_i = 0: c_i+ = (x - y_i) / lr = g_i(x), and c = mean_i c_i+.
    grad = jax.jit(jax.grad(_client_loss(model, train_x, train_y)), static_argnums=1)
    x0, state = got[0].params, got[-1]
    for i in range(3):
        ci = jax.tree_util.tree_map(lambda leaf: leaf[i], state.client_states)
        assert _tree_close(ci, grad(x0, tuple(partition.client_example_indices(i))), atol=1e-4)
    mean_ci = jax.tree_util.tree_map(lambda leaf: jnp.mean(leaf, axis=0), state.client_states)
    assert _tree_close(state.algorithm_state["c"], mean_ci, atol=1e-6)


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
    train_x, train_y, partition = _label_task(counts, seed=1)
    data, model = _data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    schedule = [np.array([0]), np.array([2]), np.array([0, 1])]
    states, metrics = _run(
        baselines.scaffold(),
        data,
        model,
        training,
        rounds=3,
        participants=lambda r: schedule[r],
        backend="host_loop",
    )
    s0, s1, s2, s3 = states
    c_of = lambda s: s.algorithm_state["c"]
    ci_of = lambda s, i: jax.tree_util.tree_map(lambda leaf: leaf[i], s.client_states)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, s0.params)

    # Round 1, client 0 alone (y_0 = x_1): c_0+ = 0 - 0 + (x_0 - y_0) / (2 lr); c = c_0+ / 3.
    assert int(metrics[0]["num_steps"][0]) == 2
    c0 = jax.tree_util.tree_map(lambda x, y: (x - y) / (2 * LR), s0.params, s1.params)
    assert _tree_close(ci_of(s1, 0), c0, atol=1e-5)
    assert _tree_close(c_of(s1), jax.tree_util.tree_map(lambda v: v / 3, c0), atol=1e-6)
    assert _tree_equal(ci_of(s1, 1), zeros) and _tree_equal(ci_of(s1, 2), zeros)

    # Round 2, client 2 alone, one full-batch step: y = x_1 - lr (g_2(x_1) - c_2 + c).
    assert int(metrics[1]["num_steps"][0]) == 1
    g2 = jax.grad(_client_loss(model, train_x, train_y))(
        s1.params, tuple(partition.client_example_indices(2))
    )
    expected_y = jax.tree_util.tree_map(
        lambda x, g, c: x - LR * (g - 0.0 + c), s1.params, g2, c_of(s1)
    )
    assert _tree_close(s2.params, expected_y, atol=1e-5)
    c2 = jax.tree_util.tree_map(
        lambda c, x, y: 0.0 - c + (x - y) / LR, c_of(s1), s1.params, s2.params
    )
    assert _tree_close(ci_of(s2, 2), c2, atol=1e-4)
    # ... which option II makes equal to the plain gradient g_2(x_1).
    assert _tree_close(ci_of(s2, 2), g2, atol=1e-4)
    assert _tree_close(
        c_of(s2), jax.tree_util.tree_map(lambda c, d: c + d / 3, c_of(s1), c2), atol=1e-6
    )
    assert _tree_equal(ci_of(s2, 0), ci_of(s1, 0)) and _tree_equal(ci_of(s2, 1), zeros)

    # Round 3, clients 0 and 1: c <- c + (|S|/N) mean(c_i+ - c_i); client 2's c_i untouched.
    delta = jax.tree_util.tree_map(
        lambda a0, a1, b0, b1: (a0 - b0 + a1 - b1) / 3,
        ci_of(s3, 0),
        ci_of(s3, 1),
        ci_of(s2, 0),
        ci_of(s2, 1),
    )
    assert _tree_close(c_of(s3), jax.tree_util.tree_map(jnp.add, c_of(s2), delta), atol=1e-6)
    assert _tree_equal(ci_of(s3, 2), ci_of(s2, 2))
    assert not _tree_equal(ci_of(s3, 1), zeros)


# -- AFL ------------------------------------------------------------------------


def test_afl_lambda_stays_on_the_simplex_and_moves_towards_the_larger_loss():
    data, _, model = _synthetic()
    states, metrics = _run(baselines.afl(0.5), data, model, TRAINING, rounds=2)
    lam0 = np.asarray(states[0].algorithm_state["lam"])
    np.testing.assert_allclose(lam0, [0.5, 0.5])
    for state, m in zip(states[1:], metrics):
        lam = np.asarray(state.algorithm_state["lam"])
        assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0, abs=1e-6)
    lam1, loss = np.asarray(states[1].algorithm_state["lam"]), np.asarray(
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
    assert _tree_close(baselines.afl(0.5).eval_params(states[2]), mean_iterate, atol=1e-6)


def test_afl_with_partial_participation_moves_only_the_participants_lambda():
    counts = [[8, 0, 0], [0, 8, 0], [0, 0, 8], [4, 4, 0], [10, 10, 10]]
    train_x, train_y, partition = _label_task(counts, seed=2)
    data, model = _data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    schedule = [np.array([0, 2]), np.array([1, 3])]
    states, metrics = _run(
        baselines.afl(2.0),
        data,
        model,
        TRAINING,
        rounds=2,
        participants=lambda r: schedule[r],
        backend="host_loop",
    )
    for r, who in enumerate(schedule):
        before = np.asarray(states[r].algorithm_state["lam"])
        after = np.asarray(states[r + 1].algorithm_state["lam"])
        others = np.setdiff1d(np.arange(4), who)
        np.testing.assert_array_equal(after[others], before[others])
        assert after.sum() == pytest.approx(1.0, abs=1e-6) and np.all(after >= 0)
        assert after[who].sum() == pytest.approx(before[who].sum(), abs=1e-6)
        np.testing.assert_allclose(
            metrics[r]["weights"], before[who] / before[who].sum(), rtol=1e-6
        )
        loss = np.asarray(metrics[r]["initial_loss"])
        assert after[who][np.argmax(loss)] > before[who][np.argmax(loss)]


# -- Oracle, FedPALS weights, sampling, registry --------------------------------


def test_oracle_clients_have_the_target_label_dist_and_their_sizes():
    counts = [[12, 2, 0], [0, 5, 9], [3, 3, 3], [10, 6, 4]]
    train_x, train_y, partition = _label_task(counts)
    oracle = baselines.oracle_partition(partition, train_y, seed=0)
    np.testing.assert_array_equal(oracle.client_sizes, partition.client_sizes)
    target = partition.target_label_dist
    for i, n in enumerate(partition.client_sizes):
        labels = train_y[oracle.client_example_indices(i)]
        hist = np.bincount(labels, minlength=K)
        np.testing.assert_array_equal(hist, fjp.data.largest_remainder_counts(target, int(n)))
        assert np.max(np.abs(hist / n - target)) < 1.0 / n
        assert not set(oracle.client_example_indices(i)) & set(partition.target_val_indices)
    assert fjp.make_algorithm("oracle").client is fjp.fedavg().client


def test_fedpals_weights_with_partial_participation_match_fedpals_weights():
    counts = [[8, 1, 1], [1, 8, 1], [1, 1, 8], [5, 5, 0], [0, 4, 6], [3, 3, 4], [10, 5, 5]]
    train_x, train_y, partition = _label_task(counts, seed=3)
    data, model = _data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    lam = 0.5
    algorithm = fjp.make_algorithm(
        "fedprox", partition=partition, lam=lam, prox_mu=0.01, weights="fedpals"
    )
    assert algorithm.name == "fedprox_fedpals"
    chosen = lambda r: fjp.training.sample_participants(7, r, partition.num_clients, 3)
    _, metrics = _run(algorithm, data, model, TRAINING, rounds=3, participants=chosen)
    dists, sizes = partition.client_label_dists, partition.client_sizes
    for r, m in enumerate(metrics):
        who = chosen(r)
        expected = fjp.fedpals_weights(dists[who], partition.target_label_dist, sizes[who], lam)
        np.testing.assert_allclose(m["weights"], expected, atol=1e-5)


def test_sample_participants_is_reproducible_and_changes_with_the_round():
    a = [fjp.training.sample_participants(3, r, 20, 5) for r in range(4)]
    b = [fjp.training.sample_participants(3, r, 20, 5) for r in range(4)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
        assert len(np.unique(x)) == 5 and np.all(np.diff(x) > 0)
    assert len({tuple(x) for x in a}) > 1
    assert tuple(fjp.training.sample_participants(4, 0, 20, 5)) != tuple(a[0])


def test_make_algorithm_builds_stable_pieces_and_validates():
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    for name in fjp.registered_methods():
        own = fjp.registry.hyperparameter_checks(fjp.get_method(name).hyperparameters)
        kwargs = dict(partition=partition, lam=0.1)
        kwargs.update({k: v for k, v in dict(prox_mu=0.01, afl_step=0.1).items() if k in own})
        first = fjp.make_algorithm(name, **kwargs)
        again = fjp.make_algorithm(name, **kwargs)
        # Equal hyperparameters -> the same functions, so the engine reuses its compiled round.
        assert first.client is again.client or first.client == again.client
        assert first.weighting.weights is again.weighting.weights
        assert first.server_update is again.server_update
    model, training = fjp.logistic_regression((2,), 3), TRAINING
    assert fjp.engine.round_engine(baselines.scaffold(1.0), model, training) is fjp.engine.round_engine(
        fjp.make_algorithm("scaffold", server_lr=1.0), model, training
    )
    assert fjp.make_algorithm("fedrs", fedrs_alpha=0.5).client == baselines.fedrs_client(0.5)
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


# -- each method's defining behaviour, against float64 NumPy --------------------------------


def _softmax64(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _one_local_step(algorithm, model, params, state, x, y, info, lr):
    """One local SGD step of `algorithm`'s client from `params` (state.params is w^t)."""
    optimizer = optax.sgd(lr)
    step = make_local_step(algorithm, model, optimizer)
    zero = jnp.zeros((), jnp.float32)
    carry = LocalCarry(params, optimizer.init(params), jnp.zeros((), jnp.int32), zero, zero)
    mask = jnp.ones(len(y), bool)
    return step(carry, jnp.asarray(x), jnp.asarray(y), mask, info, state).params


def _linear_nobias(dim, num_classes):
    """z = x W: a bias-free linear classifier, FedRS' reference head with h = x."""

    def init(key):
        return {"W": jax.random.normal(key, (dim, num_classes)) * 0.7}

    return fjp.Model("linear_nobias", init, lambda p, x: x @ p["W"], num_classes, False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fedprox_step_adds_the_proximal_gradient_mu_times_w_minus_w_global(seed):
    # A local step away from w^t: w+ = w - lr (g(w) + mu (w - w^t)), g the CE gradient.
    rng = np.random.default_rng(seed)
    mu, lr = 0.7, 0.3
    model = fjp.logistic_regression((DIM,), K)
    w_global = model.init(jax.random.PRNGKey(seed))
    w = model.init(jax.random.PRNGKey(seed + 100))
    x = rng.normal(size=(6, DIM)).astype(np.float32)
    y = rng.integers(0, K, size=6).astype(np.int32)
    info = fjp.ClientInfo(jnp.full((K,), 1.0 / K), jnp.int32(6), ())
    algorithm = baselines.fedprox(mu)
    state = fjp.init_server_state(algorithm, w_global, 1)
    got = _one_local_step(algorithm, model, w, state, x, y, info, lr)

    kernel, bias = (np.asarray(w["Dense_0"][n], np.float64) for n in ("kernel", "bias"))
    g_kernel, g_bias = (np.asarray(w_global["Dense_0"][n], np.float64) for n in ("kernel", "bias"))
    x64 = x.astype(np.float64)
    residual = (_softmax64(x64 @ kernel + bias) - np.eye(K)[y]) / len(y)
    want_kernel = kernel - lr * (x64.T @ residual + mu * (kernel - g_kernel))
    want_bias = bias - lr * (residual.sum(axis=0) + mu * (bias - g_bias))
    np.testing.assert_allclose(got["Dense_0"]["kernel"], want_kernel, atol=1e-5)
    np.testing.assert_allclose(got["Dense_0"]["bias"], want_bias, atol=1e-5)
    # The difference from plain SGD is exactly -lr mu (w - w^t).
    plain = _one_local_step(fjp.fedavg(), model, w, state, x, y, info, lr)
    np.testing.assert_allclose(
        np.asarray(got["Dense_0"]["kernel"]) - np.asarray(plain["Dense_0"]["kernel"]),
        -lr * mu * (kernel - g_kernel),
        atol=1e-5,
    )


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_fedrs_scales_an_absent_class_row_gradient_as_the_restricted_softmax(soft, seed):
    # Client without class 2: its batch holds classes 0 and 1 only. With z = W^T h (h = x)
    # and a the FedRS scaling, CE(a * z) has dL/dW[:, k] = mean_b a_k (q_bk - y_bk) h_b,
    # q = softmax(a * z); for the absent k = 2 (y = 0): a_2 mean_b q_b2 h_b.
    rng = np.random.default_rng(seed)
    alpha, lr = 0.3, 0.5
    label_dist = np.array([0.6, 0.4, 0.0])
    model = _linear_nobias(DIM, K)
    w = model.init(jax.random.PRNGKey(seed))
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    y = rng.integers(0, 2, size=8).astype(np.int32)
    info = fjp.ClientInfo(jnp.asarray(label_dist, jnp.float32), jnp.int32(8), ())
    algorithm = baselines.fedrs(alpha, soft=soft)
    state = fjp.init_server_state(algorithm, w, 1)
    got = np.asarray(_one_local_step(algorithm, model, w, state, x, y, info, lr)["W"])

    a = alpha + (1 - alpha) * label_dist / label_dist.max() if soft else np.array([1, 1, alpha])
    W, x64 = np.asarray(w["W"], np.float64), x.astype(np.float64)
    q = _softmax64(a * (x64 @ W))
    grad = x64.T @ (a * (q - np.eye(K)[y])) / len(y)
    np.testing.assert_allclose(got, W - lr * grad, atol=1e-5)
    absent_row_grad = (W[:, 2] - got[:, 2]) / lr
    np.testing.assert_allclose(absent_row_grad, a[2] * (x64.T @ q[:, 2]) / len(y), atol=1e-5)
    # ... which is not plain softmax's push-down softmax(z)_2 h.
    plain = x64.T @ _softmax64(x64 @ W)[:, 2] / len(y)
    assert not np.allclose(absent_row_grad, plain, atol=1e-3)


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
    state = fjp.init_server_state(baselines.afl(gamma), params, m)
    state = state._replace(
        algorithm_state={**state.algorithm_state, "lam": jnp.asarray(lam, jnp.float32)}
    )
    outputs = fjp.ClientOutputs(
        deltas={"w": jnp.zeros((4, 2))},
        client_states=(),
        train_loss=jnp.zeros(4),
        num_steps=jnp.ones(4, jnp.int32),
        initial_loss=jnp.asarray(losses, jnp.float32),
    )
    weights = jnp.asarray(lam[who] / lam[who].sum(), jnp.float32)
    new = baselines.afl_server_update(gamma)(state, jnp.asarray(who), outputs, weights)
    got = np.asarray(new.algorithm_state["lam"])
    want = lam.copy()
    want[who] = _project_simplex64(lam[who] + gamma * losses, lam[who].sum())
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert got.sum() == pytest.approx(1.0, abs=1e-6)


def test_afl_reports_the_averaged_or_the_last_iterate():
    data, _, model = _synthetic()
    states, _ = _run(baselines.afl(0.5), data, model, TRAINING, rounds=2)
    last = baselines.afl(0.5, average_iterates=False)
    assert _tree_equal(last.eval_params(states[2]), states[2].params)
    assert not _tree_close(baselines.afl(0.5).eval_params(states[2]), states[2].params, atol=1e-6)
    with pytest.raises(ValueError, match="average_iterates must be a bool"):
        baselines.afl(0.5, average_iterates=1)


def test_scaffold_client_state_and_correction_are_option_two():
    # c_i+ = c_i - c + (x - y_i) / (K eta_l); a local gradient g becomes g - c_i + c.
    rng = np.random.default_rng(0)
    shapes = {"a": (3,), "b": (2, 2)}
    draw = lambda: {n: rng.normal(size=s) for n, s in shapes.items()}
    ci, c, x, y, g = draw(), draw(), draw(), draw(), draw()
    f32 = lambda t: jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), t)
    client = baselines.scaffold_client()
    state = fjp.init_server_state(baselines.scaffold(), f32(x), 2)
    state = state._replace(algorithm_state={"c": f32(c)})
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
    assert _tree_equal(kept, f32(ci))
