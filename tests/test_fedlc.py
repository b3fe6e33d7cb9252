"""FedLC: the calibrated logits and loss against float64 NumPy, tau = 0 is FedAvg, and its
composition with FedPALS' and FedDisco's weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import fedjax_pals as fjp
from test_feddisco import _ref_weights
from method_testing import run, synthetic, tree_close, tree_equal


def _ref_calibrated_loss(logits, counts, labels, tau):
    logits = np.asarray(logits, np.float64)
    shifted = logits - tau * np.maximum(np.asarray(counts, np.float64), 1e-8) ** -0.25
    log_softmax = shifted - special.logsumexp(shifted, axis=1, keepdims=True)
    return -log_softmax[np.arange(len(labels)), labels]


def test_fedlc_calibrates_the_logits_by_the_clients_label_counts():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)).astype(np.float32)
    counts = np.array([16.0, 1.0, 0.0, 81.0])
    n = counts.sum()
    tau = 0.7
    info = fjp.ClientInfo(jnp.asarray(counts / n, jnp.float32), jnp.int32(n), ())
    got = fjp.algorithms.fedlc_client(tau).adjust_logits(jnp.asarray(logits), info, None)
    # tau * n^(-1/4): 16 -> tau/2, 1 -> tau, 0 -> 100 tau (the 1e-8 floor), 81 -> tau/3.
    shifts = tau * np.array([0.5, 1.0, 100.0, 1.0 / 3.0])
    np.testing.assert_allclose(got, logits - shifts, rtol=1e-5, atol=1e-5)
    labels = np.array([0, 1, 3, 3, 0])
    loss = -jax.nn.log_softmax(got)[np.arange(5), labels]
    np.testing.assert_allclose(
        loss, _ref_calibrated_loss(logits, counts, labels, tau), rtol=1e-5, atol=1e-5
    )
    # The pairwise margin: with equal logits a rare label's loss exceeds a frequent one's.
    flat = _ref_calibrated_loss(np.zeros((2, 4)), counts, np.array([1, 3]), tau)
    assert flat[0] > flat[1]
    np.testing.assert_array_equal(
        fjp.algorithms.fedlc_calibrated_logits(logits, counts, 0.0), logits
    )  # tau = 0: untouched


def test_fedlc_with_tau_zero_equals_fedavg_and_composes_with_server_weightings():
    data, partition, model = synthetic()
    ref, _ = run(fjp.fedavg(), data, model, rounds=2)
    got, _ = run(fjp.fedlc(0.0), data, model, rounds=2)
    assert tree_equal(got[-1].params, ref[-1].params)
    moved, _ = run(fjp.fedlc(1.0), data, model, rounds=2)
    assert not tree_close(moved[-1].params, ref[-1].params, atol=1e-5)
    # FedLC's client with FedPALS' or FedDisco's weights.
    target = partition.target_label_dist
    pals = fjp.fedlc(1.0, fjp.fedpals_weighting(target, 0.0))
    assert pals.name == "fedlc+fedpals" and pals.client is fjp.algorithms.fedlc_client(1.0)
    _, metrics = run(pals, data, model, rounds=1)
    np.testing.assert_allclose(
        metrics[0]["weights"],
        fjp.fedpals_weights(partition.client_label_dists, target, partition.client_sizes, 0.0),
        atol=1e-6,
    )
    disco = fjp.combine(fjp.algorithms.fedlc_client(1.0), fjp.algorithms.feddisco_weighting(target, 1.0, 0.0))
    _, metrics = run(disco, data, model, rounds=1)
    np.testing.assert_allclose(
        metrics[0]["weights"],
        _ref_weights(partition.client_label_dists, partition.client_sizes, target, 1.0, 0.0, "kl"),
        rtol=1e-5,
    )
    assert fjp.feddisco(target, client_method=fjp.algorithms.fedlc_client(1.0)).name == "fedlc(tau=1)+feddisco"
    with pytest.raises(ValueError, match="tau must be >= 0"):
        fjp.algorithms.fedlc_client(-0.1)
