"""The round engine against a plain per-client reference loop."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp

LR = 0.1


def _random_task(seed, sizes, input_shape, num_classes=3, extra_padding=0):
    """Random data, clients of the given sizes as index rows (padded with 0)."""
    rng = np.random.default_rng(seed)
    total = int(np.sum(sizes))
    x = rng.normal(size=(total, *input_shape)).astype(np.float32)
    y = rng.integers(0, num_classes, size=total).astype(np.int32)
    width = max(sizes) + extra_padding
    rows = np.zeros((len(sizes), width), np.int32)
    perm = rng.permutation(total)
    start = 0
    for i, n in enumerate(sizes):
        rows[i, :n] = perm[start : start + n]
        start += n
    counts = np.stack(
        [np.bincount(y[rows[i, :n]], minlength=num_classes) for i, n in enumerate(sizes)]
    )
    dists = counts / counts.sum(1, keepdims=True)
    return x, y, rows, np.asarray(sizes), dists


def _reference_round(model, params, x, y, rows, sizes, weights, training, key):
    """One round written as plainly as possible: per client, per step, NumPy gathers."""

    def loss_fn(p, bx, by, bm):
        logp = jax.nn.log_softmax(model.apply(p, bx))
        nll = -logp[np.arange(len(by)), by]
        return jnp.sum(nll * bm) / bm.sum()

    grad_fn = jax.jit(jax.grad(loss_fn))
    width = rows.shape[1]
    new_params, first_losses = [], []
    for client, n in enumerate(sizes):
        positions, mask = fjp.engine.client_schedule(
            jax.random.fold_in(key, client), jnp.int32(n), width, training
        )
        positions, mask = np.asarray(positions), np.asarray(mask)
        p = params
        for s in range(positions.shape[0]):
            if not mask[s].any():
                continue
            idx = rows[client][positions[s]]
            if p is params:
                first_losses.append(float(loss_fn(p, x[idx], y[idx], mask[s].astype(np.float32))))
            g = grad_fn(p, x[idx], y[idx], mask[s].astype(np.float32))
            p = jax.tree_util.tree_map(lambda a, b: a - training.learning_rate * b, p, g)
        new_params.append(p)
    aggregate = jax.tree_util.tree_map(
        lambda *leaves: sum(w * leaf for w, leaf in zip(weights, leaves)), *new_params
    )
    return aggregate, np.array(first_losses)


def _max_diff(a, b):
    return max(
        float(jnp.max(jnp.abs(u - v)))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


CASES = {
    "logreg": (fjp.logistic_regression((5,), 3), (5,), [7, 3, 12, 1]),
    "lenet": (fjp.lenet((16, 16, 1), 3), (16, 16, 1), [5, 9, 2]),
}


@pytest.mark.parametrize("backend", fjp.engine.BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_backend_matches_the_per_client_reference_loop(case, backend):
    model, input_shape, sizes = CASES[case]
    x, y, rows, sizes, dists = _random_task(0, sizes, input_shape)
    training = fjp.LocalTraining(local_epochs=2, batch_size=4, learning_rate=LR)
    algorithm = fjp.fedavg()
    engine = fjp.engine.round_engine(algorithm, model, training, backend=backend, chunk_size=3)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    params = model.init(jax.random.PRNGKey(1))
    state = fjp.init_server_state(algorithm, params, len(sizes))
    key = jax.random.PRNGKey(7)
    new_state, metrics = engine.run_round(data, state, np.arange(len(sizes)), key)
    weights = sizes / sizes.sum()
    expected, first_losses = _reference_round(
        model, params, x, y, rows, sizes, weights, training, key
    )
    assert _max_diff(new_state.params, expected) < 1e-5
    np.testing.assert_allclose(metrics["initial_loss"], first_losses, rtol=1e-5)
    assert _max_diff(new_state.params, params) > 1e-3  # the round did train
    np.testing.assert_allclose(metrics["weights"], weights, rtol=1e-6)
    # Each client takes E * ceil(n_i / B) steps, whatever the padding.
    np.testing.assert_array_equal(metrics["num_steps"], 2 * -(-sizes // 4))
    assert int(new_state.round) == 1


@pytest.mark.parametrize("backend", ["vmap_scan", "host_loop"])
def test_padding_the_client_tables_changes_nothing(backend):
    model = fjp.logistic_regression((5,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    algorithm = fjp.fedavg()
    engine = fjp.engine.round_engine(algorithm, model, training, backend=backend)
    results = []
    for extra in (0, 9):
        x, y, rows, sizes, dists = _random_task(3, [6, 11], (5,), extra_padding=extra)
        state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 2)
        for r in range(2):
            state, _ = engine.run_round(
                fjp.engine.device_data(x, y, rows, sizes, dists),
                state,
                np.arange(2),
                jax.random.PRNGKey(r),
            )
        results.append(state.params)
    assert _max_diff(*results) == 0.0


def _final_params(algorithm, rounds):
    """Params after `rounds` vmap_scan rounds on a fixed 3-client task."""
    model = fjp.logistic_regression((5,), 3)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    x, y, rows, sizes, dists = _random_task(11, [9, 4, 14], (5,))
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    engine = fjp.engine.round_engine(algorithm, model, training, backend="vmap_scan")
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 3)
    for r in range(rounds):
        state, _ = engine.run_round(data, state, np.arange(3), jax.random.PRNGKey(r))
    return state.params


TARGET = np.array([0.8, 0.1, 0.1])


def test_huge_lambda_fedpals_equals_fedavg():
    assert (
        _max_diff(_final_params(fjp.fedavg(), 3), _final_params(fjp.fedpals(TARGET, 1e9), 3)) < 1e-5
    )


def test_fedpals_with_small_lambda_differs_from_fedavg():
    # The counterpart of the test above: the weighting reaches the params.
    assert (
        _max_diff(_final_params(fjp.fedavg(), 1), _final_params(fjp.fedpals(TARGET, 0.0), 1)) > 1e-3
    )


def _runs_task(num_runs):
    """num_runs runs of FedPALS differing in seed, client tables, T and lambda."""
    model = fjp.logistic_regression((5,), 3)
    tables, states, targets = [], [], []
    x, y, _, _, _ = _random_task(20, [40], (5,))
    rng = np.random.default_rng(0)
    for r in range(num_runs):
        sizes = rng.integers(2, 9, size=4)
        rows = np.zeros((4, 8), np.int32)
        for i, n in enumerate(sizes):
            rows[i, :n] = rng.choice(40, n, replace=False)
        counts = np.stack([np.bincount(y[rows[i, :n]], minlength=3) for i, n in enumerate(sizes)])
        tables.append((rows, sizes, counts / counts.sum(1, keepdims=True)))
        target = rng.dirichlet(np.ones(3))
        algorithm = fjp.fedpals(target, float(rng.choice([0.0, 0.1, 10.0])))
        states.append(fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(r)), 4))
        targets.append(algorithm)
    return model, x, y, tables, states, targets


@pytest.mark.parametrize("backend", fjp.engine.BACKENDS)
def test_a_runs_axis_gives_each_run_its_solo_numbers_and_compiles_once(backend):
    model, x, y, tables, states, algorithms = _runs_task(8)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    engine = fjp.engine.round_engine(algorithms[0], model, training, backend=backend, chunk_size=3)
    stack = lambda *trees: jax.tree_util.tree_map(lambda *l: jnp.stack(l), *trees)
    data = fjp.engine.device_data(x, y, *[np.stack(t) for t in zip(*tables)])
    participants = np.array([[0, 1, 3]] * 8)
    keys = jnp.stack([jax.random.PRNGKey(100 + r) for r in range(8)])
    batched, _ = engine.run_rounds(data, stack(*states), participants, keys)
    compiled = engine.compilations
    batched, metrics = engine.run_rounds(data, batched, participants, keys)
    assert engine.compilations == compiled  # the second round of the sweep compiles nothing
    # Each run alone: its rounds compile once. The first solo round compiles the one-run
    # program (the counter sees it, so the zero below is not vacuous); each run's second
    # round, on the data and state of its first, compiles nothing.
    first, again = fjp.engine.CompilationCounter(), fjp.engine.CompilationCounter()
    for r in range(8):
        solo_engine = fjp.engine.round_engine(
            algorithms[r], model, training, backend=backend, chunk_size=3
        )
        assert solo_engine is engine  # runs differing only in the state share one engine
        solo_data = fjp.engine.device_data(x, y, *tables[r])
        state = states[r]
        for step in range(2):
            counter = again if step else first if r == 0 else fjp.engine.CompilationCounter()
            with counter.track():
                state, solo_metrics = engine.run_round(solo_data, state, participants[r], keys[r])
        run_r = jax.tree_util.tree_map(lambda leaf: leaf[r], batched)
        assert _max_diff(run_r.params, state.params) < 1e-5
        np.testing.assert_allclose(metrics["weights"][r], solo_metrics["weights"], atol=1e-5)
    assert first.compilations > 0
    assert again.compilations == 0
    # The runs differ (T, lambda, seed, clients): a broken runs axis would not show above
    # if every run computed the same thing.
    assert (
        _max_diff(
            jax.tree_util.tree_map(lambda l: l[0], batched.params),
            jax.tree_util.tree_map(lambda l: l[1], batched.params),
        )
        > 1e-3
    )


def test_engine_key_is_the_key_of_the_shared_engine():
    model = fjp.logistic_regression((4,), 3)
    training = fjp.LocalTraining(batch_size=4, learning_rate=0.1)
    first = fjp.engine.round_engine(fjp.fedpals(np.full(3, 1 / 3), 0.0), model, training)
    # Another T and lambda (state), new closures: the same spec, the same engine.
    other = fjp.fedpals(np.asarray([0.2, 0.3, 0.5]), 1.0)
    assert fjp.engine.engine_key(other, model, training) == fjp.engine.engine_key(
        fjp.fedpals(np.full(3, 1 / 3), 0.0), model, training
    )
    assert fjp.engine.round_engine(other, model, training) is first
    assert fjp.engine.engine_key(fjp.fedprox(0.01), model, training) != fjp.engine.engine_key(
        other, model, training
    )
    assert fjp.engine.engine_key(other, model, training, chunk_size=8) != fjp.engine.engine_key(
        other, model, training
    )


@pytest.mark.parametrize("backend", fjp.engine.backend_names())
def test_a_lane_no_client_drew_takes_no_step_and_leaves_the_round_to_the_drawn(backend):
    # Poisson sampling pads a round's participants with the id M (the number of clients): such
    # a lane must neither train, nor weigh, nor change what the drawn clients compute.
    model = fjp.logistic_regression((5,), 3)
    training = fjp.LocalTraining(local_epochs=2, batch_size=4, learning_rate=LR)
    x, y, rows, sizes, dists = _random_task(5, [9, 4, 14, 7], (5,))
    q = 0.5
    algorithm = fjp.algorithms.with_poisson_sampling(fjp.fedavg(), q, dists, sizes)
    engine = fjp.engine.round_engine(algorithm, model, training, backend=backend, chunk_size=2)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    init = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 4)
    key = jax.random.PRNGKey(7)
    drawn, padded = np.array([1, 3]), np.array([1, 3, 4, 4, 4])
    lean, lean_metrics = engine.run_round(data, init, drawn, key)
    wide, wide_metrics = engine.run_round(data, init, padded, key)
    assert _max_diff(lean.params, wide.params) == 0.0
    assert _max_diff(lean.params, init.params) > 1e-3  # the drawn did train
    np.testing.assert_array_equal(wide_metrics["num_steps"][2:], 0)
    np.testing.assert_array_equal(wide_metrics["weights"][2:], 0.0)
    np.testing.assert_allclose(wide_metrics["weights"][:2], sizes[drawn] / sizes.sum() / q,
                               rtol=1e-6)


class _TinyCNN(nn.Module):
    """Two convolutions (VALID; strided SAME) and a dense head: convolutions a vmapped
    client update batches over its lanes (flax's own, unlike LeNet's on a CPU)."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), padding="VALID")(x))
        x = nn.relu(nn.Conv(5, (3, 3), strides=(2, 2), padding="SAME")(x))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def test_a_block_of_conv_net_runs_has_no_grouped_convolution_and_equals_the_runs_alone():
    # vmap_scan with a runs axis: before, the program held convolutions with one feature group
    # per lane (runs x clients), which GPU libraries run slowly; now patches times kernel.
    model = fjp.model_from_flax("tiny_cnn", _TinyCNN(), (8, 8, 2), 3, convolutional=True)
    training = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=LR)
    algorithm = fjp.fedavg()
    x, y, rows, sizes, dists = _random_task(11, [6, 8, 5], (8, 8, 2))
    runs, participants = 3, np.array([[0, 1, 2]] * 3)
    states = [fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(r)), 3)
              for r in range(runs)]
    stack = lambda *trees: jax.tree_util.tree_map(lambda *l: jnp.stack(l), *trees)
    data = fjp.engine.device_data(x, y, *[np.stack([t] * runs) for t in (rows, sizes, dists)])
    keys = jnp.stack([jax.random.PRNGKey(50 + r) for r in range(runs)])
    args = (data, stack(*states), participants, keys)
    programs = {}
    for convs in ("patches", "grouped"):
        engine = fjp.engine.RoundEngine(
            algorithm, model, training, backend="vmap_scan", vmapped_convs=convs
        )
        programs[convs] = (engine, engine._rounds._jit_round.lower(*args).compile())
    groups = {c: fjp.engine.conv_groups(p.as_text()) for c, (_, p) in programs.items()}
    assert groups["patches"] == {}  # no convolution at all: batched matmuls
    assert fjp.engine.grouped_convs(programs["grouped"][1].as_text()) > 0  # the check can see
    engine, block = programs["patches"]
    blocked, _ = block(*args)
    grouped, _ = programs["grouped"][1](*args)
    # float32 rounding's size here: what a relative 2^-23 (one ulp) change of the initial params moves
    # the round's result by (the same program); the formulations differ by their sums' order.
    nudged = stack(*[s._replace(params=jax.tree_util.tree_map(
        lambda p: p * (1 + 2.0**-23), s.params)) for s in states])
    floor = _max_diff(blocked.params, block(data, nudged, participants, keys)[0].params)
    assert 0 < floor < 1e-5
    assert _max_diff(blocked.params, grouped.params) <= 4 * floor
    solo_data = fjp.engine.device_data(x, y, rows, sizes, dists)
    for r in range(runs):
        alone, _ = engine.run_round(solo_data, states[r], participants[r], keys[r])
        run_r = jax.tree_util.tree_map(lambda leaf: leaf[r], blocked)
        assert _max_diff(run_r.params, alone.params) <= 4 * floor
        assert _max_diff(run_r.params, states[r].params) > 1e-3  # it trained
