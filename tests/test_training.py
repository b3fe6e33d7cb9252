"""The training loop: determinism, resume, client sampling, end-to-end runs."""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from conftest import random_image_task


def _synthetic_run(algorithm_name, delta, seed, rounds=30, learning_rate=0.05, **kwargs):
    dataset, partition = fjp.synthetic_label_shift_task(delta, seed=seed)
    algorithm = (
        fjp.fedavg()
        if algorithm_name == "fedavg"
        else fjp.fedpals(partition.target_label_dist, 0.0)
    )
    training = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=learning_rate)
    return fjp.run_training(
        algorithm,
        fjp.logistic_regression((2,), 3),
        dataset,
        partition,
        training,
        rounds=rounds,
        seed=seed,
        **kwargs,
    )


def test_same_seed_gives_identical_results_and_another_seed_does_not():
    _, first = _synthetic_run("fedpals", 0.5, seed=3, rounds=5)
    _, second = _synthetic_run("fedpals", 0.5, seed=3, rounds=5)
    _, other = _synthetic_run("fedpals", 0.5, seed=4, rounds=5)
    assert first.target_accuracy == second.target_accuracy
    assert first.train_loss == second.train_loss
    assert first.train_loss != other.train_loss


def _orbax(path, seed=1):
    return fjp.Checkpointer(path, identity={"run": f"synthetic fedpals seed {seed}"})


def test_a_resumed_run_continues_exactly_from_its_checkpoint(tmp_path):
    path = str(tmp_path / "checkpoints")
    _, full = _synthetic_run("fedpals", 0.5, seed=1, rounds=6, eval_every=2)
    _synthetic_run("fedpals", 0.5, seed=1, rounds=4, eval_every=2, checkpointer=_orbax(path))
    trained = []
    state, resumed = _synthetic_run(
        "fedpals",
        0.5,
        seed=1,
        rounds=6,
        eval_every=2,
        checkpointer=_orbax(path),
        on_round=lambda done, loss: trained.append(done),
    )
    assert trained == [5, 6]  # rounds 1-4 came from the checkpoint, not from training again
    assert int(state.round) == 6
    assert resumed.rounds == [2, 4, 6]
    assert resumed.target_accuracy == full.target_accuracy
    assert resumed.train_loss == full.train_loss


def test_a_checkpoint_of_another_identity_or_beyond_the_rounds_is_refused(tmp_path):
    path = str(tmp_path / "checkpoints")
    _synthetic_run("fedpals", 0.5, seed=1, rounds=4, eval_every=2, checkpointer=_orbax(path))
    with pytest.raises(fjp.CheckpointMismatchError, match=r"run: .*seed 1' -> .*seed 2'"):
        _synthetic_run("fedpals", 0.5, seed=2, rounds=4, checkpointer=_orbax(path, seed=2))
    with pytest.raises(
        ValueError, match=r"at round 4, beyond rounds=3: it belongs to a longer run"
    ):
        _synthetic_run("fedpals", 0.5, seed=1, rounds=3, eval_every=2, checkpointer=_orbax(path))


def test_any_checkpointer_is_saved_to_at_every_evaluation_after_the_hook():
    events = []

    class Memory:
        def __init__(self):
            self.saved = None

        def save(self, state, history):
            events.append(("save", int(state.round)))
            self.saved = (state, fjp.TrainingHistory(**history.to_dict()))

        def restore(self, template):
            return self.saved

    memory = Memory()
    _synthetic_run(
        "fedavg",
        0.5,
        seed=0,
        rounds=3,
        eval_every=2,
        checkpointer=memory,
        on_evaluation=lambda done, metrics, history: events.append(("hook", done)),
    )
    assert events == [("hook", 2), ("save", 2), ("hook", 3), ("save", 3)]
    trained = []
    _synthetic_run(
        "fedavg",
        0.5,
        seed=0,
        rounds=4,
        eval_every=2,
        checkpointer=memory,
        on_round=lambda done, loss: trained.append(done),
    )
    assert trained == [4]


@pytest.mark.integration
def test_fedpals_beats_fedavg_on_the_synthetic_task_averaged_over_seeds():
    for delta in (0.0, 1.0):
        mean = {
            name: np.mean(
                [_synthetic_run(name, delta, seed)[1].target_accuracy[-1] for seed in range(3)]
            )
            for name in ("fedavg", "fedpals")
        }
        assert mean["fedpals"] > mean["fedavg"] + 0.03, (delta, mean)


def _fashion_mnist_or_skip():
    try:
        return fjp.load_fashion_mnist()
    except fjp.DatasetUnavailableError:
        pytest.skip("Fashion-MNIST files not present (apt-get install dataset-fashion-mnist)")


@pytest.mark.integration
def test_a_short_fashion_mnist_run_learns():
    dataset = _fashion_mnist_or_skip()
    # 9 clients of 3 labels x 40 examples and a 3-label target, to stay small.
    rng = np.random.default_rng(0)
    counts = np.zeros((10, 10), np.int64)
    for i in range(10):
        counts[i, rng.choice(10, 3, replace=False)] = 40
    partition = fjp.data.partition_from_label_counts(
        dataset.train.y, dataset.test.y, counts, seed=0, description="test", target_test_size=600
    )
    training = fjp.LocalTraining(local_epochs=1, batch_size=32, learning_rate=0.1)
    algorithm = fjp.fedpals(partition.target_label_dist, 0.0)
    _, history = fjp.run_training(
        algorithm,
        fjp.lenet((28, 28, 1), 10),
        dataset,
        partition,
        training,
        rounds=6,
        seed=0,
        eval_every=3,
    )
    # Chance on a 3-label target is 1/3.
    assert history.target_accuracy[-1] > 0.5, history.target_accuracy


def test_sampling_is_reproducible_and_changes_with_the_round():
    first = fjp.training.sample_participants(seed=3, round_index=5, num_clients=50, clients_per_round=5)
    again = fjp.training.sample_participants(seed=3, round_index=5, num_clients=50, clients_per_round=5)
    other_round = fjp.training.sample_participants(
        seed=3, round_index=6, num_clients=50, clients_per_round=5
    )
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other_round)
    assert len(set(first.tolist())) == 5 and np.all(np.diff(first) > 0)
    np.testing.assert_array_equal(fjp.training.sample_participants(0, 0, 7, None), np.arange(7))


def test_sampling_many_clients_is_reproducible_and_does_not_permute_them_all():
    from fedjax_pals import training

    many = training.PERMUTATION_SAMPLING_MAX_CLIENTS + 1
    first = fjp.training.sample_participants(seed=3, round_index=5, num_clients=many, clients_per_round=50)
    np.testing.assert_array_equal(first, fjp.training.sample_participants(3, 5, many, 50))
    assert not np.array_equal(first, fjp.training.sample_participants(3, 6, many, 50))
    assert not np.array_equal(first, fjp.training.sample_participants(4, 5, many, 50))
    assert first.dtype == np.int32 and len(set(first.tolist())) == 50
    assert np.all(np.diff(first) > 0) and 0 <= first[0] and first[-1] < many
    # Below the threshold: the prefix of jax's permutation, as in every recorded run.
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(3), 2), 5)
    legacy = np.sort(np.asarray(jax.random.choice(key, 1000, (40,), replace=False)))
    np.testing.assert_array_equal(fjp.training.sample_participants(3, 5, 1000, 40), legacy)


@pytest.mark.parametrize(
    "count, fraction, expected", [(None, None, 50), (7, None, 7), (None, 0.1, 5), (None, 0.001, 1)]
)
def test_clients_per_round_from_count_or_fraction(count, fraction, expected):
    assert fjp.training.clients_per_round_from(50, count, fraction) == expected


@pytest.mark.parametrize(
    "kwargs", [dict(count=3, fraction=0.5), dict(fraction=0.0), dict(fraction=1.5)]
)
def test_clients_per_round_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        fjp.training.clients_per_round_from(10, **kwargs)


def test_run_training_rejects_bad_settings():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining()
    for kwargs, message in (
        (dict(rounds=0), "rounds must be >= 1"),
        (dict(rounds=2, eval_every=0), "eval_every must be >= 1"),
        (dict(rounds=2, clients_per_round=3), r"clients_per_round must be an integer in \[1, 2\]"),
        # 0 participants is an error, never read as "all".
        (dict(rounds=2, clients_per_round=0), r"clients_per_round must be an integer in \[1, 2\]"),
    ):
        with pytest.raises(ValueError, match=message):
            fjp.run_training(fjp.fedavg(), model, dataset, partition, training, **kwargs)


def test_a_non_finite_loss_is_divergence():
    with pytest.raises(fjp.TrainingDivergedError, match="learning rate"):
        _synthetic_run("fedavg", 0.5, seed=0, rounds=3, learning_rate=1e38)


def test_a_nan_round_loss_stops_the_run_in_that_round_not_at_the_next_evaluation():
    # Round 1's weighted training loss is NaN (NaN > limit is False: the finiteness check,
    # not the limit, must catch it); without evaluation until round 4.
    with pytest.raises(
        fjp.TrainingDivergedError, match=r"diverged in round 1: the weighted training loss is nan"
    ):
        _synthetic_run("fedavg", 0.5, seed=0, rounds=4, learning_rate=1e38, eval_every=4)


def test_validation_reads_the_target_validation_set_and_test_the_target_test_set():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=1)
    state, history = _synthetic_run("fedpals", 0.5, seed=1, rounds=2)
    model = fjp.logistic_regression((2,), 3)
    params = fjp.fedpals(partition.target_label_dist, 0.0).eval_params(state)

    def on(x, y):
        return fjp.metrics.make_evaluator(model.apply, x, y, 3)(params)

    val_idx, test_idx = partition.target_val_indices, partition.target_test_indices
    val = on(dataset.train.x[val_idx], dataset.train.y[val_idx])
    test = on(dataset.test.x[test_idx], dataset.test.y[test_idx])
    # The two sets give distinguishable numbers, so a swap cannot pass unnoticed.
    assert (val["accuracy"], val["macro_f1"]) != (test["accuracy"], test["macro_f1"])
    assert history.val_accuracy[-1] == val["accuracy"]
    assert history.val_macro_f1[-1] == val["macro_f1"]
    assert history.target_accuracy[-1] == test["accuracy"]
    assert history.target_macro_f1[-1] == test["macro_f1"]


def test_an_exploding_finite_loss_is_divergence():
    # Logistic regression at learning rate 1e6 keeps finite weights (and fair accuracy) but a
    # training loss of ~1e5 against an untrained model's ~9.
    with pytest.raises(
        fjp.TrainingDivergedError, match=r"diverged in round 1: .* above the divergence limit 9\d\."
    ):
        _synthetic_run("fedavg", 0.5, seed=0, rounds=3, learning_rate=1e6)
    # The limit is a keyword: a generous one lets the same run finish.
    _, history = _synthetic_run(
        "fedavg", 0.5, seed=0, rounds=2, learning_rate=1e6, max_train_loss=1e12
    )
    assert max(history.train_loss) > 1e4


def test_a_workable_learning_rate_is_not_divergence():
    # lr 50 is far above the task's 0.05 and its loss rises to ~20, still under the limit.
    _, history = _synthetic_run("fedavg", 0.5, seed=0, rounds=5, learning_rate=50.0)
    assert max(history.train_loss) > 10


def test_the_divergence_limit_is_ten_times_the_untrained_loss():
    assert fjp.training.divergence_limit(10) == pytest.approx(10 * np.log(10))
    assert fjp.training.divergence_limit(3, initial_loss=9.0) == pytest.approx(90.0)
    assert fjp.training.divergence_limit(3, initial_loss=0.5) == pytest.approx(10 * np.log(3))
    assert fjp.training.divergence_limit(3, initial_loss=float("nan")) == pytest.approx(10 * np.log(3))


_IMAGE = {}


def _image_run(seed, lam, dataset=None, **kwargs):
    dataset = dataset or _IMAGE.setdefault("dataset", random_image_task(0))
    partition = fjp.sparsity_partition(
        dataset.train.y,
        dataset.test.y,
        num_clients=5,
        labels_per_client=3,
        seed=seed,
        num_classes=10,
    )
    return fjp.training.TrainingRun(
        fjp.fedpals(partition.target_label_dist, lam),
        fjp.logistic_regression((8, 8, 1), 10),
        dataset,
        partition,
        fjp.LocalTraining(batch_size=16, learning_rate=0.05),
        rounds=3,
        seed=seed,
        clients_per_round=3,
        **kwargs,
    )


def test_runs_trained_together_give_their_solo_numbers_in_one_compiled_program():
    settings = [(seed, lam) for seed in range(4) for lam in (0.0, 5.0)]  # 8 runs
    solo = [fjp.training.run_trainings([_image_run(s, lam)])[0] for s, lam in settings]
    engine = fjp.engine.round_engine(
        _image_run(0, 0.0).algorithm,
        fjp.logistic_regression((8, 8, 1), 10),
        fjp.LocalTraining(batch_size=16, learning_rate=0.05),
    )
    before = engine.compilations
    runs = [_image_run(s, lam) for s, lam in settings]
    assert len({fjp.training.training_group_key(run) for run in runs}) == 1
    together = fjp.training.run_trainings(runs)
    # The 8-run program compiles once; a second sweep of runs with the same structure and
    # client-table shapes (here: other lambdas) compiles nothing.
    first_sweep = engine.compilations - before
    assert first_sweep >= 1
    fjp.training.run_trainings([_image_run(s, lam + 1.0) for s, lam in settings])
    assert engine.compilations - before == first_sweep
    for (state, history), (solo_state, solo_history) in zip(together, solo):
        np.testing.assert_allclose(history.train_loss, solo_history.train_loss, rtol=1e-5)
        np.testing.assert_allclose(history.val_accuracy, solo_history.val_accuracy, atol=1e-6)
        for a, b in zip(
            jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(solo_state.params)
        ):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert len({tuple(h.train_loss) for _, h in together}) == len(settings)  # the runs differ


def test_runs_on_different_data_sets_of_one_shape_train_together_with_their_solo_numbers():
    # As a synthetic task drawn per seed: the runs index the pooled examples of both sets.
    datasets = [random_image_task(1), random_image_task(2)]

    def runs():
        return [_image_run(seed, 0.0, dataset=d) for seed, d in zip((1, 2), datasets)]

    solo = [fjp.training.run_trainings([run])[0] for run in runs()]
    pair = runs()
    assert fjp.training.training_group_key(pair[0]) == fjp.training.training_group_key(pair[1])
    together = fjp.training.run_trainings(pair)
    for (state, history), (solo_state, solo_history) in zip(together, solo):
        np.testing.assert_allclose(history.train_loss, solo_history.train_loss, rtol=1e-5)
        for a, b in zip(
            jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(solo_state.params)
        ):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_diverging_run_fails_alone_and_runs_of_another_structure_are_refused():
    runs = [_image_run(0, 0.0), _image_run(1, 0.0, max_train_loss=1e-9)]
    (state, history), failed = fjp.training.run_trainings(runs)
    assert isinstance(failed, fjp.TrainingDivergedError) and len(history.train_loss) == 3
    other = fjp.training.TrainingRun(
        fjp.fedavg(),
        fjp.logistic_regression((8, 8, 1), 10),
        runs[0].dataset,
        runs[0].partition,
        fjp.LocalTraining(batch_size=16, learning_rate=0.05),
        rounds=3,
    )
    with pytest.raises(ValueError, match="cannot train in lockstep with run 0"):
        fjp.training.run_trainings([runs[0], other])


def test_a_state_update_replaces_one_runs_state_between_rounds():
    calls = []
    new_target = np.full(10, 0.1)

    def update(round_index, state_of):
        calls.append(round_index)
        if round_index == 2:
            return fjp.algorithms.with_target_label_dist(state_of(), new_target)
        return None

    def failing(round_index, state_of):
        raise RuntimeError("estimator broke")

    updated = _image_run(0, 0.0, update_state=update)
    plain = _image_run(1, 0.0)
    broken = _image_run(2, 0.0, update_state=failing)
    (state, history), (other, _), error = fjp.training.run_trainings([updated, plain, broken])
    assert calls == [0, 1, 2]  # before every round
    np.testing.assert_allclose(state.weighting_state.target_label_dist, new_target, atol=1e-7)
    # The other run is untouched; the run whose update raised fails alone.
    np.testing.assert_allclose(
        other.weighting_state.target_label_dist, plain.partition.target_label_dist, atol=1e-7
    )
    assert isinstance(error, RuntimeError) and "estimator broke" in str(error)
    # The new T changes the last round's weights, and only that round's.
    [(_, solo_history)] = fjp.training.run_trainings([_image_run(0, 0.0)])
    assert history.train_loss[:2] == solo_history.train_loss[:2]
    assert history.train_loss[2] != solo_history.train_loss[2]


def test_sample_participants_is_reproducible_and_changes_with_the_round():
    a = [fjp.training.sample_participants(3, r, 20, 5) for r in range(4)]
    b = [fjp.training.sample_participants(3, r, 20, 5) for r in range(4)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
        assert len(np.unique(x)) == 5 and np.all(np.diff(x) > 0)
    assert len({tuple(x) for x in a}) > 1
    assert tuple(fjp.training.sample_participants(4, 0, 20, 5)) != tuple(a[0])


def test_poisson_sampling_draws_each_client_with_probability_q_padded_to_the_lanes():
    from fedjax_pals import training

    m, q, rounds = 40, 0.2, 600
    lanes = training.poisson_capacity(m, q)
    draws = [training.sample_poisson_participants(5, r, m, q, lanes) for r in range(rounds)]
    np.testing.assert_array_equal(draws[3], training.sample_poisson_participants(5, 3, m, q, lanes))
    assert not np.array_equal(draws[3], training.sample_poisson_participants(6, 3, m, q, lanes))
    counts = np.array([np.sum(d < m) for d in draws])
    for d, n in zip(draws, counts):
        assert d.dtype == np.int32 and d.shape == (lanes,)
        assert np.all(np.diff(d[:n]) > 0) and np.all(d[n:] == m)  # sorted ids, then padding
    # Each client independently: its share of rounds within 5 standard errors of q, and the
    # round sizes Binomial(M, q) (a chi-square-free check: mean and variance, 5 SE each).
    taken = np.bincount(np.concatenate([d[d < m] for d in draws]), minlength=m) / rounds
    assert np.all(np.abs(taken - q) < 5 * np.sqrt(q * (1 - q) / rounds))
    assert abs(counts.mean() - m * q) < 5 * np.sqrt(m * q * (1 - q) / rounds)
    assert abs(counts.var() / (m * q * (1 - q)) - 1) < 5 * np.sqrt(2 / rounds)


def test_poisson_capacity_is_the_binomial_tail_quantile_and_overflow_is_an_error():
    import math

    from fedjax_pals import training

    for m, q in ((30, 0.1), (1000, 0.1), (200, 0.9), (4, 1.0)):
        lanes = training.poisson_capacity(m, q)
        # float64 reference: P(Binomial(m, q) > k) summed from the pmf in logs
        def tail(k):
            return sum(math.exp(math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1)
                                + j * math.log(q) + (m - j) * math.log1p(-q))
                       for j in range(k + 1, m + 1)) if q < 1 else float(k < m)
        assert tail(lanes) <= training.POISSON_OVERFLOW_PROBABILITY
        assert lanes == m or tail(lanes - 1) > training.POISSON_OVERFLOW_PROBABILITY
    with pytest.raises(ValueError, match=r"drew \d+ clients in round 1, more than the round's 2"):
        training.sample_poisson_participants(0, 0, 100, 0.5, 2)
    with pytest.raises(ValueError,
                       match=r"Poisson sampling rate must be a number in \(0, 1\], got 0"):
        training.poisson_capacity(10, 0.0)


def test_runs_on_one_stored_data_set_share_their_compiled_evaluators():
    # A sweep's runs each build their model for the data (uint8 pixels scaled in the step):
    # the same wrapped model, so the evaluators compile once. A new wrapper per run compiled
    # them anew and kept every copy: a 100-run sweep ran out of memory maps halfway.
    from fedjax_pals import metrics, models

    rng = np.random.default_rng(0)
    split = lambda n: fjp.LabeledSplit(rng.integers(0, 256, (n, 8, 8, 1)).astype(np.uint8),
                                       np.arange(n, dtype=np.int32) % 3)
    dataset = fjp.Dataset("u8", split(120), split(90), 3, source="test",
                          input_scaling=fjp.InputScaling(127.5, -1.0))
    partition = fjp.dirichlet_partition(dataset.train.y, dataset.test.y, num_clients=4, seed=0,
                                        beta=1.0, num_classes=3, min_target_test_size=10)
    base = models.make_model("logistic_regression", (8, 8, 1), 3)
    sizes = []
    for seed in range(3):
        model = models.model_for_data(base, dataset)
        fjp.training.TrainingRun(fjp.fedavg(), model, dataset, partition,
                                 fjp.LocalTraining(batch_size=8), rounds=1, seed=seed)
        sizes.append(metrics._compiled_evaluation.cache_info().currsize)
    assert sizes[0] == sizes[1] == sizes[2]
    assert models.model_for_data(base, dataset).apply is models.model_for_data(base,
                                                                                dataset).apply
