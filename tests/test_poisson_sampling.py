"""Poisson client sampling's fixed-denominator weights (fedjax_pals/algorithms/poisson_sampling.py)
and how they compose: with DP on updates (the sensitivity over every client, an empty round's
noise), with label DP, in a run (resume, the runs axis) and in the config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fedjax_pals as fjp
from fedjax_pals import accounting
from fedjax_pals.algorithms import poisson_sampling, private_updates
from fedjax_pals.algorithms.base import ClientOutputs
from fedjax_pals.algorithms.server_chain import server_round
from fedjax_pals.training import sample_poisson_participants

RNG = np.random.default_rng()  # fresh inputs each run; the tolerances hold for any


def _clients(m, k=4):
    dists = RNG.dirichlet(np.full(k, 0.4), size=m)
    sizes = RNG.integers(20, 300, size=m).astype(np.float64)
    return dists, sizes


def _state(algorithm, m, params=None):
    params = {"w": jnp.zeros((3, 2))} if params is None else params
    return fjp.algorithms.init_server_state(algorithm, params, m)


def _lanes(drawn, m, lanes):
    return jnp.asarray(np.concatenate([np.sort(drawn), np.full(lanes - len(drawn), m)]),
                       jnp.int32)


def test_fedavgs_fixed_denominator_weights_are_n_i_over_n_q_for_the_drawn_and_0_elsewhere():
    m, q = 12, float(RNG.uniform(0.1, 0.9))
    dists, sizes = _clients(m)
    algorithm = poisson_sampling.with_poisson_sampling(fjp.fedavg(), q, dists, sizes)
    state = _state(algorithm, m)
    drawn = RNG.choice(m, size=5, replace=False)
    participants = _lanes(drawn, m, 8)
    # What the engine hands the weighting for a padding lane is not read: give it garbage.
    got = algorithm.weighting.weights(jnp.full((8, 4), jnp.nan), jnp.zeros(8), state,
                                      participants)
    expected = np.zeros(8)
    expected[:5] = sizes[np.sort(drawn)] / sizes.sum() / q  # float64 reference
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_fedpals_fixed_denominator_weights_are_eq_8_over_every_client_divided_by_q():
    m, k, q, lam = 10, 5, 0.3, float(RNG.uniform(0.0, 0.5))
    dists, sizes = _clients(m, k)
    target = RNG.dirichlet(np.ones(k))
    everyone = fjp.server_weights.fedpals_weights(dists, target, sizes, lam)  # not the drawn's
    plain = fjp.fedpals(target, lam)
    algorithm = poisson_sampling.with_poisson_sampling(plain, q, dists, sizes)
    state = _state(algorithm, m)
    drawn = np.sort(RNG.choice(m, size=4, replace=False))
    got = algorithm.weighting.weights(None, None, state, _lanes(drawn, m, 6))
    np.testing.assert_allclose(got[:4], np.asarray(everyone)[drawn] / q, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[4:], 0.0)
    # The summary's alpha over every client is eq. 8's (the drawn weigh alpha_i / q).
    full = poisson_sampling.population_weights(algorithm.weighting, state)
    np.testing.assert_allclose(np.asarray(full) * q, everyone, rtol=1e-5, atol=1e-7)
    # What the weighting declares to the server chain: max_i alpha_i / q over every client,
    # whoever was drawn (here the 4 lanes above).
    declared = algorithm.weighting.max_weight(state, got)
    np.testing.assert_allclose(float(declared), np.max(everyone) / q, rtol=1e-5)


def test_the_fixed_denominator_aggregate_is_unbiased_for_the_full_participation_one():
    m, q, rounds = 8, 0.25, 4000
    dists, sizes = _clients(m)
    algorithm = poisson_sampling.with_poisson_sampling(fjp.fedavg(), q, dists, sizes)
    state = _state(algorithm, m)
    updates = RNG.normal(size=m)
    full = float(np.sum(sizes / sizes.sum() * updates))
    weigh = jax.jit(lambda p: algorithm.weighting.weights(None, None, state, p))
    estimates = []
    for r in range(rounds):
        p = sample_poisson_participants(7, r, m, q, m)
        w = np.asarray(weigh(jnp.asarray(p)), np.float64)
        drawn = p < m
        estimates.append(float(np.sum(w[drawn] * updates[p[drawn]])))
    estimates = np.asarray(estimates)
    # The mean of 4,000 independent rounds within 5 standard errors of the full aggregate.
    assert abs(estimates.mean() - full) < 5 * estimates.std() / np.sqrt(rounds)


def _outputs(deltas):
    m = jax.tree_util.tree_leaves(deltas)[0].shape[0]
    return ClientOutputs(deltas=deltas, client_states=(), train_loss=jnp.zeros(m),
                         num_steps=jnp.ones(m, jnp.int32), initial_loss=jnp.zeros(m))


def _private(m, q, clip, sigma):
    dists, sizes = _clients(m)
    sizes[0] = 5000.0  # client 0 carries the largest weight
    sampled = poisson_sampling.with_poisson_sampling(fjp.fedavg(), q, dists, sizes)
    algorithm = private_updates.with_private_updates(sampled, clip, sigma, seed=3)
    return algorithm, _state(algorithm, m, {"w": jnp.zeros((5, 7))}), sizes


def test_the_noise_is_scaled_to_the_heaviest_client_of_all_even_when_it_was_not_drawn():
    m, q, clip, sigma, lanes = 6, 0.4, 0.8, 1.2, 4
    algorithm, state, sizes = _private(m, q, clip, sigma)
    participants = _lanes(np.array([2, 4]), m, lanes)  # client 0 not drawn
    zero = {"w": jnp.zeros((lanes, 5, 7))}

    @jax.jit
    def noise_at(round_):
        s = state._replace(round=round_)
        weights = algorithm.weighting.weights(None, None, s, participants)
        return jnp.ravel(server_round(algorithm, s, participants, _outputs(zero), weights)
                         .params["w"])

    draws = np.concatenate([np.asarray(noise_at(jnp.int32(r)), np.float64) for r in range(150)])
    std = sigma * clip * sizes.max() / sizes.sum() / q  # float64: C max_i alpha_i / q
    assert stats.kstest(draws / std, "norm").pvalue > 1e-4  # one false alarm in 10,000 runs
    # A round that drew nobody still releases the noise (else it would tell nobody was drawn).
    nobody = _lanes(np.array([], np.int64), m, lanes)
    s = state._replace(round=jnp.int32(0))
    weights = algorithm.weighting.weights(None, None, s, nobody)
    assert float(jnp.sum(weights)) == 0.0
    moved = np.asarray(server_round(algorithm, s, nobody, _outputs(zero), weights).params["w"])
    assert stats.kstest(moved.ravel() / std, "norm").pvalue > 1e-4


def test_adding_or_removing_one_client_moves_the_aggregate_by_at_most_the_sensitivity():
    m, q, clip, lanes = 9, 0.35, float(RNG.uniform(0.3, 2.0)), 7
    algorithm, state, sizes = _private(m, q, clip, 0.0)  # noiseless: the aggregate itself
    sensitivity = clip * sizes.max() / sizes.sum() / q
    shifts = []
    for _ in range(8):
        updates = RNG.normal(size=(m, 5, 7)) * RNG.uniform(0.05, 4.0, size=(m, 1, 1)) * clip
        drawn = np.sort(RNG.choice(m, size=4, replace=False))
        extra = int(RNG.choice(np.setdiff1d(np.arange(m), drawn)))
        if RNG.random() < 0.5:
            extra = 0  # the heaviest client is the one added: the worst case
            drawn = drawn[drawn != 0]
        aggregates = []
        for ids in (drawn, np.sort(np.append(drawn, extra))):  # the neighbour adds `extra`
            p = _lanes(ids, m, lanes)
            deltas = np.zeros((lanes, 5, 7))
            deltas[:len(ids)] = updates[ids]  # padding lanes: zeros (no step taken)
            w = algorithm.weighting.weights(None, None, state, p)
            new = server_round(algorithm, state, p, _outputs({"w": jnp.float32(deltas)}), w)
            aggregates.append(np.asarray(new.params["w"], np.float64))
        shifts.append(np.sqrt(np.sum((aggregates[0] - aggregates[1]) ** 2)))
    assert max(shifts) <= sensitivity * (1 + 1e-5)


def test_a_method_with_its_own_server_update_is_refused():
    dists, sizes = _clients(4)
    with pytest.raises(ValueError, match="'scaffold' has a server update of its own"):
        poisson_sampling.with_poisson_sampling(fjp.algorithms.scaffold(), 0.5, dists, sizes)
    with pytest.raises(ValueError, match="sampling rate q"):
        poisson_sampling.with_poisson_sampling(fjp.fedavg(), 0.0, dists, sizes)
    algorithm = poisson_sampling.with_poisson_sampling(fjp.fedavg(), 0.5, dists, sizes)
    with pytest.raises(ValueError, match="adaptive clipping counts"):
        private_updates.with_private_updates(algorithm, 1.0, 1.0, 0, clip_quantile=0.5,
                                             participants=4)


def test_adaptive_clipping_is_refused_with_dp_wrapped_first_and_fixed_clipping_is_not():
    dists, sizes = _clients(4)
    adaptive = private_updates.with_private_updates(fjp.fedavg(), 1.0, 0.3, 0, clip_quantile=0.5,
                                                    participants=4)
    with pytest.raises(ValueError, match="adaptive clipping counts"):
        poisson_sampling.with_poisson_sampling(adaptive, 0.5, dists, sizes)
    fixed = private_updates.with_private_updates(fjp.fedavg(), 1.0, 1.0, 0)
    wrapped = poisson_sampling.with_poisson_sampling(fixed, 0.5, dists, sizes)
    assert wrapped.weighting.max_weight is not None


# -- in a run ------------------------------------------------------------------------------------


def _synthetic(rounds=3, q=0.5, **algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = rounds
    config.training.client_sampling = "poisson"
    config.training.client_fraction = q
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


@pytest.mark.parametrize(
    "training, algorithm, message",
    [
        (dict(client_fraction=None), {}, "needs training.client_fraction"),
        (dict(clients_per_round=1), {}, "give the rate, not a count"),
        (dict(client_fraction=1.5), {}, "client_fraction"),
        (dict(client_sampling="poison"), {}, "did you mean 'poisson'"),
        ({}, dict(name="scaffold"), "brings a server update of its own"),
        ({}, dict(name="afl"), "brings a server update of its own"),
        ({}, dict(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_clip_quantile=0.5),
         "adaptive clipping counts"),
    ],
)
def test_bad_settings_are_refused_before_data_is_read(training, algorithm, message):
    config = _synthetic(**algorithm)
    for key, value in training.items():
        config.training[key] = value
    with pytest.raises(fjp.ConfigError, match=message):
        fjp.validate_config(config)


def test_the_resolved_config_keeps_q_and_its_lanes_and_resolves_again_to_itself():
    resolved = fjp.resolve_config(_synthetic(q=0.3))
    training = resolved.config.training
    assert (training.client_sampling, training.client_fraction) == ("poisson", 0.3)
    assert training.clients_per_round == fjp.training.poisson_capacity(2, 0.3)
    assert fjp.resolve_config(resolved.config).digest == resolved.digest
    plain = fjp.default_config()
    plain.dataset.name = "synthetic"
    named = fjp.default_config()
    named.dataset.name = "synthetic"
    named.training.client_sampling = "without_replacement"  # the default, said: same digest
    assert fjp.resolve_config(named).digest == fjp.resolve_config(plain).digest
    assert fjp.resolve_config(plain).digest != resolved.digest


def test_a_private_poisson_run_spends_poisson_epsilon_and_resumes_bit_identically(tmp_path):
    settings = dict(name="fedpals", dp_clip_norm=0.5, dp_noise_multiplier=1.0)
    whole = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "whole",
                                   quiet=True)
    fjp.train_and_evaluate(_synthetic(rounds=2, **settings), tmp_path / "parts", quiet=True)
    resumed = fjp.train_and_evaluate(_synthetic(rounds=4, **settings), tmp_path / "parts",
                                     quiet=True)
    for key in ("train_loss", "target_accuracy", "val_accuracy", "alpha"):
        assert resumed[key] == whole[key], key
    spent = accounting.updates_epsilon(1.0, 4, 1e-5, num_clients=2, clients_per_round=2,
                                       sampling_rate=0.5)
    assert resumed["dp_epsilon"] == whole["dp_epsilon"] == spent
    # alpha over every client sums to 1 (the drawn weigh alpha_i / q)
    np.testing.assert_allclose(sum(whole["alpha"]), 1.0, rtol=1e-6)


def test_runs_on_the_runs_axis_draw_what_they_draw_alone(tmp_path):
    from fedjax_pals.experiment import train as train_lib

    configs = [_synthetic(rounds=3, q=0.6, dp_clip_norm=1.0, dp_noise_multiplier=0.5)
               for _ in range(2)]
    configs[1].seed = 1
    together = train_lib.train_and_evaluate_many(configs, [tmp_path / str(i) for i in range(2)])
    alone = fjp.train_and_evaluate(configs[1], tmp_path / "alone", quiet=True)
    # None: a round that drew no client (seed 1 at q = 0.6 has one)
    assert [x is None for x in together[1]["train_loss"]] == [
        x is None for x in alone["train_loss"]]
    np.testing.assert_allclose([x for x in together[1]["train_loss"] if x is not None],
                               [x for x in alone["train_loss"] if x is not None], rtol=1e-5)
    np.testing.assert_allclose(together[1]["target_accuracy"], alone["target_accuracy"],
                               atol=1e-3)


def test_in_a_task_it_composes_with_label_dp_dp_on_updates_and_a_client_side_method():
    config = _synthetic(q=0.5, name="fedprox_fedpals", prox_mu=0.01, lam=0.1,
                        label_dp_epsilon=2.0, dp_clip_norm=0.5, dp_noise_multiplier=1.0)
    task = fjp.build_task(config)
    update = task.algorithm.server_update
    # DP on updates' links sit in the chain; its noise reads the bound Poisson sampling's
    # weighting declares.
    assert [type(link) for link in update.links] == [private_updates.ServerClipping,
                                                     private_updates.GaussianNoise]
    state = fjp.algorithms.init_server_state(
        task.algorithm, task.model.init(jax.random.PRNGKey(0)), task.partition.num_clients)
    got = poisson_sampling.population_weights(task.algorithm.weighting, state)
    # FedPALS' eq. 8 over every client's *released* S (label DP), divided by q.
    released = np.asarray(task.server_label_dists, np.float64)
    expected = fjp.server_weights.fedpals_weights(
        released, task.target_label_dist, task.partition.client_sizes, task.context.lam)
    np.testing.assert_allclose(np.asarray(got) * 0.5, expected, rtol=1e-5, atol=1e-6)
    assert task.sampling_rate == 0.5


def test_a_run_says_under_its_first_line_that_it_samples_by_poisson(tmp_path, capfd):
    fjp.train_and_evaluate(_synthetic(rounds=1, q=0.5), tmp_path / "w")
    shown = capfd.readouterr()
    lanes = fjp.training.poisson_capacity(2, 0.5)
    assert (f"Poisson sampling: each client a round with probability 0.5 on {lanes} lanes"
            in shown.out + shown.err)


def test_a_fedavg_shadow_samples_as_its_poisson_run_does(tmp_path):
    # T re-estimated from a FedAvg shadow under Poisson sampling: the shadow draws the run's
    # clients each round and weighs them as FedAvg's fixed-denominator estimator does.
    config = _synthetic(rounds=3, q=0.5, target_estimation="bbse_constrained",
                        target_estimation_model="fedavg_shadow")
    task = fjp.build_task(config)
    (monitor,) = [f.monitor(hp, task) for f, hp in task.features if f.name == "unknown_target"]
    shadow = monitor.shadow
    assert shadow.sampling_rate == 0.5 and shadow.clients_per_round == task.clients_per_round
    fedavg = poisson_sampling.with_poisson_sampling(
        fjp.fedavg(), 0.5, task.partition.client_label_dists, task.partition.client_sizes)
    state, _ = fjp.run_training(fedavg, task.model, task.dataset, task.partition, task.training,
                                rounds=2, seed=config.seed, eval_every=2,
                                clients_per_round=task.clients_per_round, sampling_rate=0.5)
    expected = fedavg.eval_params(state)
    got = shadow.params(2)  # the shadow's model before round 3: after 2 rounds
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(a, b)
    fjp.train_and_evaluate(config, tmp_path / "w", quiet=True)  # and the run itself goes through


def test_a_round_that_draws_no_client_records_no_loss_rather_than_a_perfect_fit(tmp_path, capfd):
    # Seed 1, q = 0.5 over the 2 synthetic clients: round 2 draws nobody, rounds 1 and 3 some.
    import json

    from fedjax_pals.experiment.progress import Progress

    config = _synthetic(rounds=3, q=0.5)
    config.seed = 1
    lanes = fjp.training.poisson_capacity(2, 0.5)
    drawn = [sample_poisson_participants(1, r, 2, 0.5, lanes) < 2 for r in range(3)]
    assert [bool(d.any()) for d in drawn] == [True, False, True]
    results = fjp.train_and_evaluate(config, tmp_path / "w")
    loss = results["train_loss"]
    assert loss[1] is None and loss[0] > 0 and loss[2] > 0  # not 0.0: nothing trained
    # results.json stays strict JSON (null, not NaN)
    def refuse(constant):
        raise ValueError(constant)

    with open(tmp_path / "w" / "results.json") as f:
        assert json.loads(f.read(), parse_constant=refuse)["train_loss"] == loss
    with open(tmp_path / "w" / "metrics.jsonl") as f:
        steps = {}
        for line in f:
            record = json.loads(line, parse_constant=refuse)
            steps.setdefault(record["step"], {}).update(record)
    assert ["train/loss" in steps[s] for s in (1, 2, 3)] == [True, False, True]
    shown = capfd.readouterr()
    assert "loss n/a (no client drawn)" in shown.out + shown.err
    assert "loss 0," not in shown.out + shown.err
    bar = Progress(3, quiet=True)
    bar.update(1, loss=None)
    assert bar.line().startswith("round 1/3, loss n/a (no client drawn)")
