"""The training loop: determinism, resume, client sampling, end-to-end runs."""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp


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


def test_a_resumed_run_continues_exactly(tmp_path):
    path = str(tmp_path / "checkpoint.msgpack")
    _, full = _synthetic_run("fedpals", 0.5, seed=1, rounds=6, eval_every=2)
    _synthetic_run("fedpals", 0.5, seed=1, rounds=4, eval_every=2, checkpoint_path=path)
    state, resumed = _synthetic_run(
        "fedpals", 0.5, seed=1, rounds=6, eval_every=2, checkpoint_path=path
    )
    assert int(state.round) == 6
    assert resumed.rounds == [2, 4, 6]
    assert resumed.target_accuracy == full.target_accuracy
    assert resumed.train_loss == full.train_loss


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
    partition = fjp.partition_from_label_counts(
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
    first = fjp.sample_participants(seed=3, round_index=5, num_clients=50, clients_per_round=5)
    again = fjp.sample_participants(seed=3, round_index=5, num_clients=50, clients_per_round=5)
    other_round = fjp.sample_participants(
        seed=3, round_index=6, num_clients=50, clients_per_round=5
    )
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other_round)
    assert len(set(first.tolist())) == 5 and np.all(np.diff(first) > 0)
    np.testing.assert_array_equal(fjp.sample_participants(0, 0, 7, None), np.arange(7))


@pytest.mark.parametrize(
    "count, fraction, expected", [(None, None, 50), (7, None, 7), (None, 0.1, 5), (None, 0.001, 1)]
)
def test_clients_per_round_from_count_or_fraction(count, fraction, expected):
    assert fjp.clients_per_round_from(50, count, fraction) == expected


@pytest.mark.parametrize(
    "kwargs", [dict(count=3, fraction=0.5), dict(fraction=0.0), dict(fraction=1.5)]
)
def test_clients_per_round_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        fjp.clients_per_round_from(10, **kwargs)


def test_run_training_rejects_bad_settings():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    model = fjp.logistic_regression((2,), 3)
    training = fjp.LocalTraining()
    for kwargs in (
        dict(rounds=0),
        dict(rounds=2, eval_every=0),
        dict(rounds=2, clients_per_round=3),
    ):
        with pytest.raises(ValueError):
            fjp.run_training(fjp.fedavg(), model, dataset, partition, training, **kwargs)


def test_divergence_is_reported_not_hidden():
    with pytest.raises(FloatingPointError, match="learning rate"):
        _synthetic_run("fedavg", 0.5, seed=0, rounds=3, learning_rate=1e38)
