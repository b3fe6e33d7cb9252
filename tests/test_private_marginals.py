"""The server's copy of S in a weighting (the DP release): the weights read it, local training
keeps the exact counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp


def _synthetic():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    data = fjp.engine.device_data(
        dataset.train.x,
        dataset.train.y,
        partition.client_indices,
        partition.client_sizes,
        partition.client_label_dists,
    )
    return data, partition, fjp.logistic_regression((2,), 3)


def _one_round(algorithm, data, model):
    engine = fjp.engine.round_engine(algorithm, model, fjp.LocalTraining(1, 8, 0.1), backend="vmap_scan")
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(0)), 2)
    return engine.run_round(data, state, jnp.arange(2, dtype=jnp.int32), jax.random.PRNGKey(1))


def test_weights_read_the_servers_copy_and_training_the_exact_counts():
    data, partition, model = _synthetic()
    target, sizes = partition.target_label_dist, partition.client_sizes
    pals = fjp.fedpals(target, 0.0)
    # The exact S as the server's copy: the same run as FedPALS.
    same = pals._replace(
        weighting=fjp.algorithms.with_server_label_dists(pals.weighting, partition.client_label_dists)
    )
    ref_state, ref_metrics = _one_round(pals, data, model)
    got_state, got_metrics = _one_round(same, data, model)
    np.testing.assert_allclose(got_metrics["weights"], ref_metrics["weights"], atol=1e-7)
    for got, ref in zip(
        jax.tree_util.tree_leaves(got_state.params), jax.tree_util.tree_leaves(ref_state.params)
    ):
        np.testing.assert_allclose(got, ref, atol=1e-6)
    # Another copy: the weights are eq. 8 on it; the clients' training (FedLC reads their
    # exact counts through ClientInfo) is untouched.
    seen = np.array([[0.9, 0.1, 0.0], [0.2, 0.0, 0.8]])
    lc = fjp.fedlc(1.0, fjp.fedpals_weighting(target, 0.0))
    private = lc._replace(weighting=fjp.algorithms.with_server_label_dists(lc.weighting, seen))
    _, metrics = _one_round(private, data, model)
    expected = fjp.fedpals_weights(seen, target, sizes, 0.0)
    np.testing.assert_allclose(metrics["weights"], expected, atol=1e-6)
    assert not np.allclose(expected, ref_metrics["weights"], atol=1e-3)
    _, lc_metrics = _one_round(lc, data, model)
    np.testing.assert_allclose(metrics["train_loss"], lc_metrics["train_loss"], rtol=1e-6)
    # FedDisco's weighting (the other reader of S) wrapped alike.
    disco = fjp.feddisco(target, 0.5, 0.05, "l2")
    wrapped = disco._replace(weighting=fjp.algorithms.with_server_label_dists(disco.weighting, seen))
    _, metrics = _one_round(wrapped, data, model)
    np.testing.assert_allclose(
        metrics["weights"], fjp.algorithms.feddisco_weights(seen, sizes, target, 0.5, 0.05, "l2"), atol=1e-6
    )
    with pytest.raises(ValueError, match="must sum to 1"):
        fjp.algorithms.with_server_label_dists(pals.weighting, [[0.5, 0.6, 0.0], [1.0, 0.0, 0.0]])
