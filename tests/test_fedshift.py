"""FedShift: identical clients give FedAvg, the shift is the log ratio of smoothed dists."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from method_testing import DIM, K, TRAINING, label_task, run, task_data, tree_close, tree_equal


def test_fedshift_with_identical_client_label_dists_equals_fedavg():
    counts = [[6, 4, 10], [6, 4, 10], [6, 4, 10], [10, 10, 10]]
    train_x, train_y, partition = label_task(counts)
    data, model = task_data(train_x, train_y, partition), fjp.logistic_regression((DIM,), K)
    aggregate = fjp.algorithms.fedshift_aggregate_label_dist(partition.client_label_counts)
    ref, _ = run(fjp.fedavg(), data, model, TRAINING, rounds=3)
    got, _ = run(fjp.algorithms.fedshift(aggregate), data, model, TRAINING, rounds=3)
    # s_ik = ln P_i(k) - ln P(k) = 0 up to float32 rounding of P.
    assert tree_close(got[-1].params, ref[-1].params, atol=1e-6, rtol=1e-6)
    assert not tree_equal(ref[-1].params, ref[0].params)
    # Another P (per-run data in the state) shifts the logits, with the same compiled round:
    # the rounds above compiled everything these rounds run.
    counter = fjp.engine.CompilationCounter()
    with counter.track():
        other, _ = run(fjp.algorithms.fedshift([0.6, 0.3, 0.1]), data, model, TRAINING, rounds=3)
    assert counter.compilations == 0
    assert not tree_close(other[-1].params, ref[-1].params, atol=1e-4)


def test_fedshift_adds_the_log_ratio_of_smoothed_label_dists():
    counts = np.array([[3, 1, 0], [1, 1, 6]])
    aggregate = fjp.algorithms.fedshift_aggregate_label_dist(counts, smoothing=1.0)
    p1, p2 = (counts + 1.0) / (counts.sum(1, keepdims=True) + 3.0)
    np.testing.assert_allclose(aggregate, (4 * p1 + 8 * p2) / 12)
    assert np.all(aggregate > 0) and aggregate.sum() == pytest.approx(1.0)
    alg = fjp.algorithms.fedshift(aggregate)
    state = fjp.init_server_state(alg, {"w": jnp.zeros(1)}, 2)
    logits = jnp.array([[0.5, 1.0, -1.0]])
    info = fjp.ClientInfo(jnp.array([0.75, 0.25, 0.0]), jnp.int32(4), ())
    shifted = alg.client.adjust_logits(logits, info, state)
    np.testing.assert_allclose(shifted, logits + np.log(p1 / aggregate), rtol=1e-5)
    # A client method that reads P cannot be assembled without it.
    bare = fjp.combine(fjp.algorithms.fedshift_client(), None)
    with pytest.raises(ValueError, match="aggregate_label_dist"):
        bare.client.adjust_logits(logits, info, fjp.init_server_state(bare, {"w": jnp.zeros(1)}, 2))
    with pytest.raises(ValueError, match="strictly positive"):
        fjp.algorithms.fedshift([0.5, 0.5, 0.0])
