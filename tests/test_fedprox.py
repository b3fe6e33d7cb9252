"""FedProx: mu = 0 is FedAvg, the proximal pull, its local step against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from method_testing import (
    DIM, K, TRAINING, _one_local_step, run, _softmax64, synthetic, tree_close, tree_equal,
    tree_norm, tree_sub,
)


def test_fedprox_with_mu_zero_equals_fedavg():
    data, _, model = synthetic()
    ref, _ = run(fjp.fedavg(), data, model, TRAINING, rounds=3)
    got, _ = run(fjp.algorithms.fedprox(0.0), data, model, TRAINING, rounds=3)
    assert tree_equal(got[-1].params, ref[-1].params)


def test_fedprox_with_mu_positive_pulls_towards_the_global_model():
    data, _, model = synthetic()
    ref, _ = run(fjp.fedavg(), data, model, TRAINING, rounds=1)
    got, _ = run(fjp.algorithms.fedprox(1.0), data, model, TRAINING, rounds=1)
    start = ref[0].params
    assert not tree_close(got[-1].params, ref[-1].params, atol=1e-6)
    assert tree_norm(tree_sub(got[-1].params, start)) < tree_norm(
        tree_sub(ref[-1].params, start)
    )
    # The regulariser is (mu/2)||w - w_g||^2 itself.
    reg = fjp.algorithms.fedprox_client(0.5).regularizer
    w = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    g = {"a": jnp.array([0.0, 0.0]), "b": jnp.array([[1.0]])}
    assert float(reg(w, g)) == pytest.approx(0.25 * (1 + 4 + 4))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fedprox_step_adds_the_proximal_gradient_mu_times_w_minus_w_global(seed):
    # A local step away from w^t: w+ = w - lr (g(w) + mu (w - w^t)), g the CE gradient.
    rng = np.random.default_rng(seed)
    mu, lr = 0.7, 0.3
    model = fjp.logistic_regression((DIM,), K)
    w_global = model.init(jax.random.PRNGKey(seed))
    w = model.init(jax.random.PRNGKey(seed + 100))
    x = rng.normal(size=(6, DIM)).astype(np.float32)
    y = rng.integers(0, K, size=6).astype(np.int32)
    info = fjp.ClientInfo(jnp.full((K,), 1.0 / K), jnp.int32(6), ())
    algorithm = fjp.algorithms.fedprox(mu)
    state = fjp.init_server_state(algorithm, w_global, 1)
    got = _one_local_step(algorithm, model, w, state, x, y, info, lr)

    kernel, bias = (np.asarray(w["Dense_0"][n], np.float64) for n in ("kernel", "bias"))
    g_kernel, g_bias = (np.asarray(w_global["Dense_0"][n], np.float64) for n in ("kernel", "bias"))
    x64 = x.astype(np.float64)
    residual = (_softmax64(x64 @ kernel + bias) - np.eye(K)[y]) / len(y)
    want_kernel = kernel - lr * (x64.T @ residual + mu * (kernel - g_kernel))
    want_bias = bias - lr * (residual.sum(axis=0) + mu * (bias - g_bias))
    np.testing.assert_allclose(got["Dense_0"]["kernel"], want_kernel, atol=1e-5)
    np.testing.assert_allclose(got["Dense_0"]["bias"], want_bias, atol=1e-5)
    # The difference from plain SGD is exactly -lr mu (w - w^t).
    plain = _one_local_step(fjp.fedavg(), model, w, state, x, y, info, lr)
    np.testing.assert_allclose(
        np.asarray(got["Dense_0"]["kernel"]) - np.asarray(plain["Dense_0"]["kernel"]),
        -lr * mu * (kernel - g_kernel),
        atol=1e-5,
    )
