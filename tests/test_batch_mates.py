"""A run's result does not depend on its batch-mates (issue 58 item 4): runs of DP on updates under
Poisson sampling trained together on the engine's runs axis give, bit for bit, what each gives
alone (docs/measurements/batch_mates.md)."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np

import fedjax_pals as fjp
from conftest import random_image_task
from fedjax_pals.algorithms import poisson_sampling, private_updates

ROUNDS = 12  # past round 8, where the accuracies first parted
Q = 0.3


_DATA = {}


def _private_poisson_run(seed, lam, sigma):
    """FedPALS at `lam`, Poisson-sampled at rate Q, DP on updates at noise multiplier `sigma`
    (the noise drawn from the seed's own stream): every setting lives in the state."""
    dataset = _DATA.setdefault("dataset", random_image_task(0))
    # One partition for all: client tables of one width (a wider mate pads them, which
    # changes the client programs' shapes; see docs/measurements/batch_mates.md).
    partition = _DATA.setdefault("partition", fjp.sparsity_partition(
        dataset.train.y, dataset.test.y, num_clients=12, labels_per_client=3, seed=0,
        num_classes=10,
    ))
    sampled = poisson_sampling.with_poisson_sampling(
        fjp.fedpals(partition.target_label_dist, lam), Q, partition.client_label_dists,
        partition.client_sizes,
    )
    algorithm = private_updates.with_private_updates(sampled, 0.5, sigma, seed)
    return fjp.training.TrainingRun(
        algorithm,
        fjp.logistic_regression((8, 8, 1), 10),
        dataset,
        partition,
        fjp.LocalTraining(batch_size=16, learning_rate=0.1),
        rounds=ROUNDS,
        seed=seed,
        clients_per_round=fjp.training.poisson_capacity(partition.num_clients, Q),
        sampling_rate=Q,
    )


SETTINGS = [(0, 0.5, 0.02), (1, 2.0, 0.05), (2, 0.5, 0.1), (0, 0.05, 30.0)]  # (seed, lam, sigma)


def _train(runs):
    # host_loop, the CPU's backend for a conv net (as LeNet in the sweep): each client
    # trains alone. A traced backend (vmap_scan, this model's default on a CPU) vmaps the
    # round over the runs, and its arithmetic is batched (docs/design/engine.md).
    return fjp.training.run_trainings(runs, backend="host_loop")


def _leaves(state):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]


def check_runs_equal_their_solo_runs_bit_for_bit():
    # The last mate is a run the noise swamps (sigma 30 at a small lambda): it diverges
    # and keeps computing, unread, which must not reach the others.
    solo = [_train([_private_poisson_run(*s)])[0] for s in SETTINGS]
    runs = [_private_poisson_run(*s) for s in SETTINGS]
    assert len({fjp.training.training_group_key(run) for run in runs}) == 1  # one program
    together = _train(runs)
    # ... and in another order, seed 0's run last
    reordered = _train([_private_poisson_run(*s) for s in SETTINGS[::-1]])
    diverged = [isinstance(outcome, fjp.TrainingDivergedError) for outcome in solo]
    assert diverged == [False, False, False, True]  # a mate that diverges keeps computing
    for setting, alone, got_together, got_reordered in zip(
        SETTINGS, solo, together, reordered[::-1]
    ):
        if isinstance(alone, Exception):  # diverged alone: in the same round, the same words
            assert str(got_together) == str(got_reordered) == str(alone), setting
            continue
        solo_state, solo_history = alone
        for state, history in (got_together, got_reordered):
            for a, b in zip(_leaves(state), _leaves(solo_state)):
                np.testing.assert_array_equal(a, b, err_msg=str(setting))
            assert history.train_loss == solo_history.train_loss, setting
            assert history.target_accuracy == solo_history.target_accuracy, setting
            assert history.val_accuracy == solo_history.val_accuracy, setting
    # the trained runs differ from one another
    trained = [outcome for outcome in together if not isinstance(outcome, Exception)]
    assert len({tuple(history.train_loss) for _, history in trained}) == len(trained)


def test_private_poisson_runs_on_the_runs_axis_equal_their_solo_runs_bit_for_bit():
    check_runs_equal_their_solo_runs_bit_for_bit()


def test_and_on_two_host_devices_whatever_lane_a_runs_clients_fall_on():
    # As `--cpu_devices auto` on 2 cores (the sweep): the (run, client) pairs are
    # dealt to 2 lanes, so a run's clients and the lanes' buffers are laid out by its place.
    script = textwrap.dedent("""
        import sys
        import jax
        jax.config.update("jax_num_cpu_devices", 2)
        sys.path.insert(0, sys.argv[1])
        import test_batch_mates
        assert jax.device_count() == 2
        test_batch_mates.check_runs_equal_their_solo_runs_bit_for_bit()
        print("equal")
    """)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", script, here], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "equal" in done.stdout, done.stderr[-3000:]
