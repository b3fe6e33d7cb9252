"""The backends as units: their own settings and what distinguishes each.

That every backend computes a round's numbers (vs a plain reference loop) is
in tests/test_engine.py; over several devices and processes, tests/test_mesh.py.
"""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.engine import backends, convs
from fedjax_pals.engine.backends import host_loop

from test_engine import _max_diff, _random_task


def test_host_loop_cuts_active_steps_into_full_blocks_then_halving_powers_of_two():
    blocks = host_loop._blocks(np.array([0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12]), 4)
    assert [b.tolist() for b in blocks] == [[0, 1, 2, 5], [6, 7, 8, 9], [10, 11], [12]]
    assert [b.tolist() for b in host_loop._blocks(np.arange(3), 8)] == [[0, 1], [2]]
    assert host_loop._blocks(np.array([], np.int32), 4) == []


@pytest.mark.parametrize("lanes, runs, m", [(3, 2, 5), (2, 1, 4), (1, 3, 2), (4, 1, 3)])
def test_host_loop_lane_buffers_interleave_back_to_runs_by_participants(lanes, runs, m):
    # Pair i = r m + j is dealt to lane i % lanes as its slot i // lanes; a lane holds
    # ceil(runs m / lanes) slots, the last ones of some lanes unused.
    slots = -(-runs * m // lanes)
    buffer = np.full((lanes, slots, 2), -1.0, np.float32)
    for i in range(runs * m):
        buffer[i % lanes, i // lanes] = [i, -i]
    gathered = np.asarray(host_loop.HostLoop.gather_lanes(jax.numpy.asarray(buffer), runs, m))
    pairs = np.arange(runs * m, dtype=np.float32).reshape(runs, m)
    np.testing.assert_array_equal(gathered, np.stack([pairs, -pairs], axis=-1))


@pytest.mark.parametrize("steps_per_call", [1, 3, 8])
def test_host_loop_gives_the_same_round_for_any_steps_per_call(steps_per_call):
    # How a client's steps are cut into blocks does not depend on the model: the cheapest
    # one to compile (each block length is a program; LeNet's equality is in test_engine).
    model = fjp.logistic_regression((6,), 3)
    x, y, rows, sizes, dists = _random_task(4, [9, 3, 6], (6,))
    training = fjp.LocalTraining(local_epochs=2, batch_size=2, learning_rate=0.1)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    state = fjp.init_server_state(fjp.fedavg(), model.init(jax.random.PRNGKey(0)), 3)
    results = []
    for k in (steps_per_call, 2):
        engine = fjp.engine.RoundEngine(
            fjp.fedavg(), model, training, backend="host_loop", steps_per_call=k
        )
        new_state, metrics = engine.run_round(data, state, np.arange(3), jax.random.PRNGKey(1))
        results.append(new_state.params)
        np.testing.assert_array_equal(metrics["num_steps"], 2 * -(-sizes // 2))
    assert _max_diff(*results) < 1e-6


def test_host_loop_writes_each_round_into_the_last_rounds_buffers_with_the_same_numbers():
    # A fresh buffer per round cost 160,000 page faults per round at 1,000 LeNet clients
    # (host_loop.py); reused, a round's numbers must still be those of a fresh engine.
    model = fjp.logistic_regression((6,), 3)
    x, y, rows, sizes, dists = _random_task(5, [9, 3, 6, 4, 7], (6,))
    training = fjp.LocalTraining(local_epochs=1, batch_size=2, learning_rate=0.1)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)

    def engine():
        return fjp.engine.RoundEngine(fjp.fedavg(), model, training, backend="host_loop")

    reused = engine()
    made = []
    empty = reused._bound._empty
    reused._bound._empty = lambda *args: made.append(args[-1]) or empty(*args)
    state = fjp.init_server_state(fjp.fedavg(), model.init(jax.random.PRNGKey(0)), 5)
    rounds = [[0, 1, 2], [4, 3, 1], [0, 2], [2, 3, 4]]  # m = 2 in between: a buffer of its own
    states, losses = [state], []
    for r, participants in enumerate(rounds):
        new_state, metrics = reused.run_round(
            data, states[-1], np.array(participants), jax.random.PRNGKey(r)
        )
        states.append(new_state)
        losses.append(metrics["train_loss"])
    # Afterwards: a fresh engine's round takes the spare buffers over (one holder at a time).
    for r, participants in enumerate(rounds):
        fresh_state, fresh_metrics = engine().run_round(
            data, states[r], np.array(participants), jax.random.PRNGKey(r)
        )
        assert _max_diff(states[r + 1].params, fresh_state.params) == 0
        np.testing.assert_array_equal(losses[r], fresh_metrics["train_loss"])
    lanes = len(reused._bound.lanes)
    slots = [-(-len(p) // lanes) for p in rounds]
    # New buffers in rounds 0, 2 (m = 2) and 3 (m = 3 again: round 2 took the spare), one a lane.
    assert made == [s for s in (slots[0], slots[2], slots[3]) for _ in range(lanes)]


def test_host_loop_keeps_spare_buffers_for_the_last_engine_only():
    # A sweep caches up to 32 engines: each keeping its round's buffers would hold 32 rounds'.
    model = fjp.logistic_regression((6,), 3)
    x, y, rows, sizes, dists = _random_task(5, [9, 3, 6], (6,))
    training = fjp.LocalTraining(local_epochs=1, batch_size=2, learning_rate=0.1)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    state = fjp.init_server_state(fjp.fedavg(), model.init(jax.random.PRNGKey(0)), 3)
    first, second = (
        fjp.engine.RoundEngine(fjp.fedavg(), model, training, backend="host_loop") for _ in range(2)
    )
    first.run_round(data, state, np.arange(3), jax.random.PRNGKey(0))
    assert len(first._bound._spare) == len(first._bound.lanes)
    second.run_round(data, state, np.arange(3), jax.random.PRNGKey(0))
    assert first._bound._spare == {}
    assert len(second._bound._spare) == len(second._bound.lanes)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: backends.make_backend("host_loop", steps_per_call=0),
            "steps_per_call must be an integer >= 1",
        ),
        (
            lambda: backends.make_backend("vmap_chunked", chunk_size=0),
            "chunk_size must be an integer >= 1",
        ),
        (lambda: backends.make_backend("pmap"), "unknown backend 'pmap'"),
        (
            lambda: backends.resolve_backend("fast", fjp.lenet((16, 16, 1), 3)),
            "unknown backend 'fast'",
        ),
    ],
)
def test_bad_backend_settings_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_default_is_one_launch_per_round_on_accelerators_and_the_measured_fastest_on_cpu():
    lenet, logreg = fjp.lenet((16, 16, 1), 3), fjp.logistic_regression((4,), 3)
    assert (
        fjp.engine.default_backend(lenet, "gpu")
        == fjp.engine.default_backend(logreg, "tpu")
        == "vmap_scan"
    )
    assert fjp.engine.default_backend(lenet, "cpu") == "host_loop"
    assert fjp.engine.default_backend(logreg, "cpu") == "vmap_chunked"


def test_vmap_chunked_chunks_hold_a_multiple_of_the_devices():
    chunked = backends.make_backend("vmap_chunked", chunk_size=5)
    assert chunked.client_multiple(1) == 5 and chunked.client_multiple(2) == 6
    assert backends.make_backend("host_loop").client_multiple(8) == 1


@pytest.mark.parametrize(
    "x_shape, k_shape, strides, padding, dilation, dims",
    [
        ((3, 9, 8, 2), (3, 3, 2, 4), (1, 1), "VALID", (1, 1), ("NHWC", "HWIO", "NHWC")),
        ((3, 9, 8, 2), (3, 2, 2, 4), (2, 1), "SAME", (1, 1), ("NHWC", "HWIO", "NHWC")),
        ((3, 2, 9, 8), (4, 2, 3, 3), (1, 2), ((1, 2), (0, 1)), (2, 1), ("NCHW", "OIHW", "NCHW")),
        ((3, 11, 2), (3, 2, 4), (2,), "SAME", (1,), ("NWC", "WIO", "NWC")),
    ],
)
def test_a_convolution_as_patches_times_kernel_is_within_float32_rounding_of_it(
    x_shape, k_shape, strides, padding, dilation, dims
):
    # Two lanes with their own kernels (vmapped), as a vmapped client update has them; the
    # bound is gamma_k (|x| conv |k|) for each of the two results, k = kh*kw*C_in.
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(2, *x_shape)).astype(np.float32)
    ks = rng.normal(size=(2, *k_shape)).astype(np.float32)

    def conv(x, k):
        return jax.lax.conv_general_dilated(
            x, k, strides, padding, rhs_dilation=dilation, dimension_numbers=dims
        )

    native = np.asarray(jax.vmap(conv)(xs, ks))
    patches = jax.jit(jax.vmap(fjp.engine.matmul_convs(conv)))
    assert fjp.engine.conv_groups(patches.lower(xs, ks).compile().as_text()) == {}
    got = np.asarray(patches(xs, ks))
    for lane in range(2):
        dn = jax.lax.conv_dimension_numbers(x_shape, k_shape, dims)
        bound = convs.conv_error_bound(xs[lane], ks[lane], strides, padding, dn, dilation)
        assert got[lane].shape == native[lane].shape
        assert np.all(np.abs(got[lane] - native[lane]) <= 2 * bound)


def test_lenets_gpu_program_on_a_runs_axis_has_grouped_convolutions_only_when_asked():
    # The accelerator branch of LeNet's apply (flax's NHWC convolutions), as the round program
    # of 2 runs x 2 clients is lowered for a GPU (lowering needs no GPU).
    model = fjp.lenet((16, 16, 1), 3)
    training = fjp.LocalTraining(batch_size=4, learning_rate=0.1)
    algorithm = fjp.fedavg()
    x, y, rows, sizes, dists = _random_task(3, [4, 4], (16, 16, 1))
    data = fjp.engine.device_data(x, y, *[np.stack([t] * 2) for t in (rows, sizes, dists)])
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 2)
    states = jax.tree_util.tree_map(lambda leaf: np.stack([leaf] * 2), state)
    args = (data, states, np.array([[0, 1]] * 2), np.stack([jax.random.PRNGKey(1)] * 2))
    groups = {}
    for how in fjp.engine.VMAPPED_CONVS:
        engine = fjp.engine.RoundEngine(
            algorithm, model, training, backend="vmap_scan", vmapped_convs=how
        )
        traced = engine._rounds._jit_round.trace(*args)
        groups[how] = fjp.engine.conv_groups(traced.lower(lowering_platforms=("cuda",)).as_text())
    assert groups["patches"] == {}
    # conv1, conv2 forward; conv2's input gradient; both kernel gradients: a group per lane.
    assert groups["grouped"] == {(4, 1): 5}
