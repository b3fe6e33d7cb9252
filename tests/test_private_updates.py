"""DP on model updates (fedjax_pals/algorithms/private_updates.py): clipping, the noise, the
sensitivity, the feature's config keys, and a run's epsilon, resume and programs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fedjax_pals as fjp
from fedjax_pals import accounting
from fedjax_pals.algorithms import private_updates
from fedjax_pals.algorithms.base import ClientOutputs

RNG = np.random.default_rng()  # fresh inputs each run; the tolerances hold for any


def _deltas(m, scales):
    """A params-shaped pytree of m stacked updates, update i of norm about scales[i]."""
    tree = {"w": RNG.normal(size=(m, 3, 4)), "b": RNG.normal(size=(m, 4))}
    norms = np.sqrt(sum(np.sum(v.reshape(m, -1) ** 2, axis=1) for v in tree.values()))
    return {k: v * (np.asarray(scales) / norms).reshape((-1,) + (1,) * (v.ndim - 1))
            for k, v in tree.items()}


def test_clipping_bounds_every_norm_and_leaves_the_small_updates_as_they_are():
    m, clip = 9, float(RNG.uniform(0.5, 2.0))
    scales = RNG.uniform(0.1, 3.0, size=m) * clip
    scales[0], scales[1] = clip * 0.999, clip * 1.001  # both sides of the edge
    deltas64 = _deltas(m, scales)
    clipped, norms = private_updates.clip_updates(
        jax.tree_util.tree_map(jnp.float32, deltas64), jnp.float32(clip))
    norms64 = np.sqrt(sum(np.sum(v.reshape(m, -1) ** 2, axis=1) for v in deltas64.values()))
    np.testing.assert_allclose(norms, norms64, rtol=1e-5)
    factor = np.minimum(1.0, clip / norms64)  # the float64 reference
    for name, leaf in clipped.items():
        expected = deltas64[name] * factor.reshape((-1,) + (1,) * (leaf.ndim - 1))
        np.testing.assert_allclose(leaf, expected, rtol=2e-6, atol=1e-7)
    after = np.sqrt(sum(np.sum(np.asarray(v, np.float64).reshape(m, -1) ** 2, axis=1)
                        for v in clipped.values()))
    assert np.all(after <= clip * (1 + 1e-6))
    inside = norms64 <= clip
    for name, leaf in clipped.items():  # unclipped ones are the float32 input, bit for bit
        np.testing.assert_array_equal(np.asarray(leaf)[inside],
                                      np.float32(deltas64[name])[inside])


def _state(params, clip, sigma, seed=0, round_=0, relation="zero_out"):
    algorithm = private_updates.with_private_updates(fjp.fedavg(), clip, sigma, seed,
                                                     relation=relation)
    state = fjp.algorithms.init_server_state(algorithm, params, 5)
    return algorithm, state._replace(round=jnp.int32(round_))


def _outputs(deltas):
    m = jax.tree_util.tree_leaves(deltas)[0].shape[0]
    return ClientOutputs(deltas=deltas, client_states=(), train_loss=jnp.zeros(m),
                         num_steps=jnp.ones(m, jnp.int32), initial_loss=jnp.zeros(m))


@pytest.mark.parametrize("relation, factor", [("zero_out", 1.0), ("add_remove", 2.0)])
@pytest.mark.parametrize("weights_kind", ["fedavg", "fedpals"])
def test_the_aggregate_noise_is_gaussian_with_std_sigma_c_max_alpha(weights_kind, relation,
                                                                    factor):
    m, clip, sigma = 4, 0.7, 1.3
    if weights_kind == "fedavg":
        sizes = RNG.integers(50, 200, size=m)
        weights = sizes / sizes.sum()
    else:  # FedPALS' weights concentrate: a random point of the simplex with one large weight
        weights = RNG.dirichlet(np.full(m, 0.3))
    weights = jnp.asarray(weights, jnp.float32)
    params = {"w": jnp.zeros((6, 5)), "b": jnp.zeros(5)}
    zero = jax.tree_util.tree_map(lambda p: jnp.zeros((m, *p.shape)), params)
    algorithm, state = _state(params, clip, sigma, relation=relation)
    participants = jnp.arange(m)

    @jax.jit
    def noise_at(round_):
        new = algorithm.server_update(state._replace(round=round_), participants,
                                      _outputs(zero), weights)
        return jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree_util.tree_leaves(new.params)])

    draws = np.concatenate([np.asarray(noise_at(jnp.int32(r)), np.float64) for r in range(200)])
    # add/remove's sensitivity is 2 C max alpha: twice the noise for the same sigma
    std = factor * sigma * clip * float(np.max(np.asarray(weights, np.float64)))
    # 200 rounds x 35 coordinates: a KS test of N(0, std^2) at the 1e-4 level (the draws are
    # fresh each run; a false alarm is one run in 10,000).
    assert stats.kstest(draws / std, "norm").pvalue > 1e-4
    # and the mean within 5 standard errors of 0
    assert abs(draws.mean()) < 5 * std / np.sqrt(draws.size)


def test_moving_one_clients_update_moves_the_aggregate_by_at_most_the_sensitivity():
    m, clients, clip = 6, 10, float(RNG.uniform(0.2, 3.0))
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
    algorithm, state = _state(params, clip, 0.0)  # noiseless: the aggregate itself
    participants = jnp.asarray(RNG.choice(clients, size=m, replace=False))  # partial
    for _ in range(5):
        weights = jnp.asarray(RNG.dirichlet(np.full(m, 0.5)), jnp.float32)
        deltas = jax.tree_util.tree_map(jnp.float32, _deltas(m, RNG.uniform(0.1, 4.0, m) * clip))
        i = int(RNG.integers(m))
        move = jax.tree_util.tree_map(jnp.float32, _deltas(1, [clip]))  # a vector of norm C
        moved = jax.tree_util.tree_map(lambda d, v: d.at[i].add(v[0]), deltas, move)
        a = algorithm.server_update(state, participants, _outputs(deltas), weights).params
        b = algorithm.server_update(state, participants, _outputs(moved), weights).params
        shift = np.sqrt(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
                            for x, y in zip(jax.tree_util.tree_leaves(a),
                                            jax.tree_util.tree_leaves(b))))
        sensitivity = clip * float(np.max(np.asarray(weights, np.float64)))
        assert shift <= sensitivity * (1 + 1e-5)
    # The worst case reaches it: the heaviest client's update from 0 to far outside the ball.
    top = int(np.argmax(np.asarray(weights)))
    zero = jax.tree_util.tree_map(jnp.zeros_like, deltas)
    far = jax.tree_util.tree_map(lambda d, v: d.at[top].set(3 * v[0]), zero, move)
    a = algorithm.server_update(state, participants, _outputs(zero), weights).params
    b = algorithm.server_update(state, participants, _outputs(far), weights).params
    shift = np.sqrt(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
                        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))))
    np.testing.assert_allclose(shift, sensitivity, rtol=1e-5)


def _synthetic(rounds=3, **algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = rounds
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(dp_clip_norm=0.0), "dp_clip_norm"),
        (dict(dp_clip_norm=1.0, dp_noise_multiplier=-0.5), "dp_noise_multiplier"),
        (dict(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_delta=1.0), "dp_delta"),
        (dict(dp_clip_norm=1.0), "neither algorithm.dp_noise_multiplier nor"),
        (dict(name="scaffold", dp_clip_norm=1.0, dp_noise_multiplier=1.0),
         "scaffold's server update is its own"),
        (dict(name="afl", dp_clip_norm=1.0, dp_noise_multiplier=1.0),
         "afl's server update is its own"),
        (dict(lam_schedule="hypergradient", lam=0.1, dp_clip_norm=1.0, dp_noise_multiplier=1.0),
         "steps lambda in the server update"),
        # A DP key without the clip norm would train without DP, silently (issue 57).
        (dict(dp_target_epsilon=4.0), r"algorithm\.dp_target_epsilon=4\.0 is set, but "
         r"algorithm\.dp_clip_norm is None"),
        (dict(dp_noise_multiplier=1.0), r"dp_noise_multiplier=1\.0 is set, but .*dp_clip_norm"),
        (dict(dp_clip_quantile=0.5), r"dp_clip_quantile=0\.5 is set, but .*dp_clip_norm"),
        (dict(dp_delta=1e-6), r"dp_delta=1e-06 is set, but .*dp_clip_norm"),
    ],
)
def test_bad_settings_are_refused_before_data_is_read(settings, message):
    with pytest.raises(fjp.ConfigError, match=message):
        fjp.validate_config(_synthetic(**settings))


def test_a_budget_the_rounds_would_exceed_is_refused_naming_the_last_round_within_it():
    config = _synthetic(rounds=50, dp_clip_norm=1.0, dp_noise_multiplier=1.0,
                        dp_target_epsilon=10.0)
    within = accounting.rounds_within(10.0, 1.0, 50, 1e-5, num_clients=2, clients_per_round=2)
    with pytest.raises(fjp.ConfigError, match=f"the budget holds through round {within}\\. "):
        fjp.validate_config(config)  # before any data is read
    with pytest.raises(fjp.ConfigError, match="dp_target_epsilon=1e-06: no noise multiplier"):
        fjp.validate_config(_synthetic(rounds=10**5, dp_clip_norm=1.0, dp_target_epsilon=1e-6))


def test_a_target_epsilon_calibrates_sigma_and_composes_with_a_server_optimizer():
    config = _synthetic(rounds=20, name="fedadam_fedpals", dp_clip_norm=0.5,
                        dp_target_epsilon=4.0)
    config.server.learning_rate = 0.1
    task = fjp.build_task(config)
    update = task.algorithm.server_update
    # The optimiser is the chain's step, after DP on updates' links: it steps on the noised
    # aggregate.
    assert isinstance(update.step, fjp.algorithms.server_optimizers.OptimizerUpdate)
    assert [link.slot for link in update.links] == ["clip", "noise"]
    state = fjp.algorithms.init_server_state(task.algorithm, task.model.init(
        jax.random.PRNGKey(0)), task.partition.num_clients)
    dp = fjp.algorithms.find_state(state.algorithm_state, private_updates.PrivateUpdatesState)
    sigma = float(dp.noise_multiplier)
    common = dict(num_clients=2, clients_per_round=2)
    assert accounting.updates_epsilon(sigma, 20, 1e-5, **common) <= 4.0
    assert accounting.updates_epsilon(sigma * 0.99, 20, 1e-5, **common) > 4.0


def test_unset_keys_leave_a_run_without_dp_and_its_digest_unchanged():
    plain = fjp.resolve_config(_synthetic())
    explicit = _synthetic(dp_clip_norm=None, dp_noise_multiplier=None, dp_target_epsilon=None)
    assert fjp.resolve_config(explicit).digest == plain.digest
    assert fjp.build_task(plain).algorithm.server_update == (
        fjp.algorithms.server_optimizers.WeightedAverageUpdate())


def test_a_run_records_its_epsilon_and_a_resumed_one_is_bit_identical(tmp_path):
    settings = dict(dp_clip_norm=0.5, dp_noise_multiplier=1.1)
    whole = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "whole",
                                   quiet=True)
    fjp.train_and_evaluate(_synthetic(rounds=2, **settings), tmp_path / "parts", quiet=True)
    resumed = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "parts",
                                     quiet=True)
    for key in ("train_loss", "target_accuracy", "val_accuracy", "alpha"):
        assert resumed[key] == whole[key], key  # the noise included: bit for bit
    spent = [accounting.updates_epsilon(1.1, r, 1e-5, num_clients=2, clients_per_round=2)
             for r in (1, 2, 3, 4)]
    assert resumed["dp_epsilon"] == whole["dp_epsilon"] == spent[-1]  # not 2 + 4 rounds
    assert [e["dp_epsilon"] for e in resumed["dp_evaluations"]] == spent
    with open(tmp_path / "whole" / "results.json") as f:
        assert json.load(f)["dp_noise_multiplier"] == 1.1


def test_runs_trained_together_on_the_runs_axis_draw_the_noise_they_draw_alone(tmp_path):
    # Differing only in per-run DP settings (one program: tests/test_train.py's generated
    # per-run cases), each run's noise comes from its own state.
    from fedjax_pals.experiment import train as train_lib

    configs = [_synthetic(rounds=2, dp_clip_norm=c, dp_noise_multiplier=s)
               for c, s in ((0.5, 1.0), (1.0, 0.3), (2.0, 0.0))]
    together = train_lib.train_and_evaluate_many(configs, [tmp_path / str(i) for i in range(3)])
    alone = fjp.train_and_evaluate(configs[1], tmp_path / "alone", quiet=True)
    # to float32 rounding: the runs axis sums in another order (test_train.py's tolerances)
    np.testing.assert_allclose(together[1]["train_loss"], alone["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(together[1]["target_accuracy"], alone["target_accuracy"],
                               atol=1e-3)
    assert together[2]["dp_epsilon"] == float("inf")  # sigma = 0: no privacy


# -- adaptive clipping ---------------------------------------------------------------------------


def _dp_state(clip, quantile, rate, count_std=0.0):
    return private_updates.PrivateUpdatesState(
        (), jnp.float32(clip), jnp.float32(1.0), jax.random.PRNGKey(0), jnp.float32(quantile),
        jnp.float32(rate), jnp.float32(count_std))


def test_the_clip_norm_steps_geometrically_towards_the_quantile():
    norms = RNG.lognormal(size=20)
    clip, quantile = float(RNG.uniform(0.5, 2.0)), float(RNG.uniform(0.1, 0.9))
    got = private_updates.adapted_clip_norm(jnp.asarray(norms, jnp.float32),
                                            _dp_state(clip, quantile, 0.2), jax.random.PRNGKey(1))
    within = np.mean(norms <= clip)  # the float64 reference, noiseless count
    np.testing.assert_allclose(float(got), clip * np.exp(-0.2 * (within - quantile)), rtol=1e-6)
    # Iterated on fixed norms, C settles where a share gamma of them is within it.
    c = jnp.float32(clip)
    for _ in range(400):
        c = private_updates.adapted_clip_norm(jnp.asarray(norms, jnp.float32),
                                              _dp_state(float(c), quantile, 0.2),
                                              jax.random.PRNGKey(1))
    share = np.mean(norms <= float(c))
    assert abs(share - quantile) <= 1.5 / len(norms) + 1e-9
    fixed = private_updates.adapted_clip_norm(jnp.asarray(norms, jnp.float32),
                                              _dp_state(clip, quantile, 0.0, 3.0),
                                              jax.random.PRNGKey(2))
    assert float(fixed) == np.float32(clip)  # step 0: C fixed, whatever the count's noise


def test_the_updates_multiplier_leaves_room_for_the_count():
    sigma, count_std = float(RNG.uniform(0.5, 2.0)), 5.0
    updates = private_updates.updates_noise_multiplier(sigma, count_std)
    np.testing.assert_allclose(updates**-2 + (2 * count_std) ** -2, sigma**-2, rtol=1e-12)
    assert updates > sigma
    with pytest.raises(ValueError, match="alone spends a noise multiplier of 10"):
        private_updates.updates_noise_multiplier(10.0, count_std)


def test_an_adaptive_run_records_its_clip_norms_and_resumes_bit_identically(tmp_path):
    settings = dict(dp_clip_norm=0.05, dp_noise_multiplier=0.1, dp_clip_quantile=0.5)
    whole = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "whole",
                                   quiet=True)
    fjp.train_and_evaluate(_synthetic(rounds=2, **settings), tmp_path / "parts", quiet=True)
    resumed = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "parts",
                                     quiet=True)
    clips = [e["dp_clip_norm"] for e in whole["dp_evaluations"]]
    assert len(set(clips)) > 1 and clips[0] != 0.05  # it moved from the initial C
    assert [e["dp_clip_norm"] for e in resumed["dp_evaluations"]] == clips
    assert resumed["train_loss"] == whole["train_loss"]
    with pytest.raises(fjp.ConfigError, match="dp_clip_quantile is set, but adaptive clipping "
                       "releases a clipped count with noise std 0.1 .* noise multiplier of 0.2"):
        fjp.validate_config(_synthetic(dp_clip_norm=0.05, dp_noise_multiplier=1.0,
                                       dp_clip_quantile=0.5))


def test_an_interrupted_run_keeps_what_its_features_reported_before_the_kill(tmp_path,
                                                                             monkeypatch):
    from fedjax_pals.experiment import train as train_lib

    settings = dict(dp_clip_norm=0.5, dp_noise_multiplier=1.1)
    whole = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "whole",
                                   quiet=True)
    real = train_lib._PreparedRun._on_evaluation

    def killed_after_round_3(self, done, metrics, history):
        real(self, done, metrics, history)
        if done == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_lib._PreparedRun, "_on_evaluation", killed_after_round_3)
    with pytest.raises(KeyboardInterrupt):
        fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "killed", quiet=True)
    with open(tmp_path / "killed" / "results.json") as f:
        assert [e["round"] for e in json.load(f)["dp_evaluations"]] == [1, 2, 3]
    monkeypatch.setattr(train_lib._PreparedRun, "_on_evaluation", real)
    resumed = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "killed",
                                     quiet=True)
    assert resumed["dp_evaluations"] == whole["dp_evaluations"]
    assert resumed["train_loss"] == whole["train_loss"]


# -- the neighbouring relation, the accountant, the noise reported (issue 58) ---------------------


def _norm64(a, b):
    return float(np.sqrt(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
                             for x, y in zip(jax.tree_util.tree_leaves(a),
                                             jax.tree_util.tree_leaves(b)))))


def test_removing_a_client_moves_fedavgs_aggregate_twice_the_zero_out_sensitivity():
    # Issue 58's counter-example, through the real weighting and server update: four clients
    # of equal size, updates +C e, -C e, -C e, -C e (clipped from 1.5 C). All four: -C/2 e;
    # the first zeroed (weights fixed): -3C/4 e, a move of C/4 = C max alpha; the first
    # removed (weights re-normalised to 1/3): -C e, a move of C/2 = 2 C max alpha.
    clip, sigma = float(RNG.uniform(0.2, 3.0)), 1.3
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
    e = jax.tree_util.tree_map(jnp.float32, _deltas(1, [1.5 * clip]))  # norm 1.5 C
    signs = jnp.asarray([1.0, -1.0, -1.0, -1.0])
    deltas = jax.tree_util.tree_map(lambda v: signs.reshape((-1,) + (1,) * (v.ndim - 1)) * v,
                                    e)
    zeroed = jax.tree_util.tree_map(lambda d: d.at[0].set(0.0), deltas)
    dists, sizes = jnp.full((4, 3), 1 / 3), jnp.full((4,), 60.0)
    stds = {}
    for relation in ("zero_out", "add_remove"):
        algorithm, state = _state(params, clip, 0.0, relation=relation)  # noiseless aggregate
        everyone, rest = jnp.arange(4), jnp.arange(1, 4)
        weights = algorithm.weighting.weights(dists, sizes, state, everyone)
        weights3 = algorithm.weighting.weights(dists[1:], sizes[1:], state, rest)
        update = algorithm.server_update
        whole = update(state, everyone, _outputs(deltas), weights).params
        without = update(state, rest, _outputs(jax.tree_util.tree_map(lambda d: d[1:], deltas)),
                         weights3).params
        zero = update(state, everyone, _outputs(zeroed), weights).params
        top = float(np.max(np.asarray(weights, np.float64)))
        np.testing.assert_allclose(top, 0.25, rtol=1e-7)
        np.testing.assert_allclose(_norm64(whole, zero), clip * top, rtol=1e-5)  # 0.25 C
        np.testing.assert_allclose(_norm64(whole, without), 2 * clip * top, rtol=1e-5)  # 0.5 C
        # The noise each relation draws for this round (the std the round used, kept in
        # the state): zero-out's covers the zeroed move with multiplier sigma, add/remove's
        # the removal's.
        algorithm, state = _state(params, clip, sigma, relation=relation)
        new = algorithm.server_update(state, everyone, _outputs(deltas), weights)
        dp = fjp.algorithms.find_state(new.algorithm_state, private_updates.PrivateUpdatesState)
        stds[relation] = float(dp.noise_std)
    np.testing.assert_allclose(stds["zero_out"], sigma * 0.25 * clip, rtol=1e-6)
    np.testing.assert_allclose(stds["add_remove"], sigma * 0.5 * clip, rtol=1e-6)
    # Against the removal's move, zero-out's noise is a multiplier of sigma / 2 only.
    np.testing.assert_allclose(stds["zero_out"] / (0.5 * clip), sigma / 2, rtol=1e-6)


def test_a_round_keeps_its_noise_std_and_clipped_aggregate_norm():
    m, clip, sigma = 6, float(RNG.uniform(0.3, 2.0)), float(RNG.uniform(0.5, 2.0))
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
    algorithm, state = _state(params, clip, sigma)
    deltas64 = _deltas(m, RNG.uniform(0.1, 3.0, m) * clip)
    weights64 = RNG.dirichlet(np.full(m, 0.5))
    new = jax.jit(algorithm.server_update)(
        state, jnp.arange(m), _outputs(jax.tree_util.tree_map(jnp.float32, deltas64)),
        jnp.asarray(weights64, jnp.float32))
    dp = fjp.algorithms.find_state(new.algorithm_state, private_updates.PrivateUpdatesState)
    # float64 references: clip each update, weigh, sum, take the norm
    norms = np.sqrt(sum(np.sum(v.reshape(m, -1) ** 2, axis=1) for v in deltas64.values()))
    factor = weights64 * np.minimum(1.0, clip / norms)
    aggregate = np.sqrt(sum(np.sum(np.tensordot(factor, v, axes=1) ** 2)
                            for v in deltas64.values()))
    # float32: the clip scale and the weighted sum over m terms (relative error ~1e-6)
    np.testing.assert_allclose(float(dp.aggregate_norm), aggregate, rtol=1e-5)
    std = sigma * clip * weights64.max()
    np.testing.assert_allclose(float(dp.noise_std), std, rtol=1e-6)
    d = 3 * 4 + 4
    np.testing.assert_allclose(
        private_updates.signal_to_noise(float(dp.aggregate_norm), float(dp.noise_std), d),
        aggregate / (std * np.sqrt(d)), rtol=1e-5)
    assert private_updates.signal_to_noise(1.0, 0.0, d) == float("inf")
    # The monitor reports them: the progress line and TensorBoard's scalars.
    spent = private_updates.UpdatesBudget(sigma, 1e-5, m, m, calibrated=False)
    monitor = private_updates.UpdatesPrivacyMonitor(
        private_updates.PrivateUpdatesHyperparameters(dp_clip_norm=clip,
                                                      dp_noise_multiplier=sigma), spent)
    shown = monitor.progress(new._replace(round=jnp.int32(1)))
    assert shown["noise std"] == f"{std:.3g}"
    assert shown["SNR"] == f"{aggregate / (std * np.sqrt(d)):.3g}"
    scalars = monitor.scalars(new._replace(round=jnp.int32(1)))
    np.testing.assert_allclose(scalars["privacy/dp_noise_std"], std, rtol=1e-6)
    np.testing.assert_allclose(scalars["privacy/dp_signal_to_noise"],
                               aggregate / (std * np.sqrt(d)), rtol=1e-5)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_neighbouring_relation="add_remove"),
         "fedpals's server weights are solved from the clients' S_i and T"),
        (dict(name="fedavg", dp_clip_norm=1.0, dp_noise_multiplier=0.1,
              dp_neighbouring_relation="add_remove", dp_clip_quantile=0.5),
         "add_remove' is set with algorithm.dp_clip_quantile"),
        (dict(dp_neighbouring_relation="add_remove"),
         r"dp_neighbouring_relation='add_remove' is set, but algorithm\.dp_clip_norm is None"),
        (dict(dp_accountant="pld"), r"dp_accountant='pld' is set, but .*dp_clip_norm is None"),
        (dict(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_accountant="moments"),
         "dp_accountant"),
    ],
)
def test_bad_relation_and_accountant_settings_are_refused(settings, message):
    with pytest.raises(fjp.ConfigError, match=message):
        fjp.validate_config(_synthetic(**settings))


def test_add_remove_and_pld_are_refused_where_they_cannot_be_accounted():
    sampled = _synthetic(name="fedavg", dp_clip_norm=1.0, dp_noise_multiplier=1.0,
                         dp_neighbouring_relation="add_remove")
    sampled.training.clients_per_round = 1  # 1 of the synthetic task's 2 clients
    with pytest.raises(fjp.ConfigError, match="add_remove' is set, but the clients are sampled"):
        fjp.validate_config(sampled)
    pld = _synthetic(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_accountant="pld")
    pld.training.clients_per_round = 1
    with pytest.raises(fjp.ConfigError, match="PLD accountant cannot account for"):
        fjp.validate_config(pld)


def test_the_defaults_named_keep_the_digest_of_a_run_without_the_keys():
    settings = dict(dp_clip_norm=0.5, dp_noise_multiplier=1.0)
    plain = fjp.resolve_config(_synthetic(**settings))
    named = fjp.resolve_config(_synthetic(**settings, dp_neighbouring_relation="zero_out",
                                          dp_accountant="rdp"))
    assert named.digest == plain.digest
    other = fjp.resolve_config(_synthetic(**settings, dp_accountant="pld"))
    assert other.digest != plain.digest


def test_a_run_records_its_relation_accountant_and_noise(tmp_path):
    # FedAvg on the synthetic task's two clients, every client every round: add/remove
    # neighbours, sigma calibrated by PLD (dp-accounting's, built here).
    import dp_accounting
    from dp_accounting import pld

    config = _synthetic(rounds=3, name="fedavg", dp_clip_norm=0.5, dp_target_epsilon=8.0,
                        dp_neighbouring_relation="add_remove", dp_accountant="pld")
    results = fjp.train_and_evaluate(config, tmp_path / "run", quiet=True)
    assert results["dp_neighbouring_relation"] == "add_remove"
    assert results["dp_accountant"] == "pld"
    sigma = results["dp_noise_multiplier"]
    counter = pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    spent = counter.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(sigma), 3)).get_epsilon(1e-5)
    np.testing.assert_allclose(results["dp_epsilon"], spent, rtol=1e-9)
    assert spent <= 8.0
    # Each evaluation's noise std is 2 sigma C max_i alpha_i, FedAvg's n_i / N (40 and 18).
    top = 40 / 58
    for evaluation in results["dp_evaluations"]:
        np.testing.assert_allclose(evaluation["dp_noise_std"], 2 * sigma * 0.5 * top,
                                   rtol=1e-6)
        assert 0 < evaluation["dp_signal_to_noise"] < float("inf")
    default = fjp.train_and_evaluate(
        _synthetic(rounds=1, name="fedavg", dp_clip_norm=0.5, dp_noise_multiplier=1.0),
        tmp_path / "default", quiet=True)
    assert default["dp_neighbouring_relation"] == "zero_out"
    assert default["dp_accountant"] == "rdp"
