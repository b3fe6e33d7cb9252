"""FedRS: alpha = 1 is FedAvg, the scaled logits, the restricted softmax's gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from method_testing import (
    DIM, K, TRAINING, _one_local_step, run, _softmax64, synthetic, tree_close, tree_equal,
)


def test_fedrs_with_alpha_one_equals_fedavg():
    data, _, model = synthetic()  # client 1 lacks class 2, client 2 lacks class 1
    ref, _ = run(fjp.fedavg(), data, model, TRAINING, rounds=2)
    got, _ = run(fjp.algorithms.fedrs(1.0), data, model, TRAINING, rounds=2)
    assert tree_equal(got[-1].params, ref[-1].params)
    moved, _ = run(fjp.algorithms.fedrs(0.5), data, model, TRAINING, rounds=2)
    assert not tree_close(moved[-1].params, ref[-1].params, atol=1e-6)


def test_fedrs_scales_the_logits_of_absent_classes():
    logits = jnp.array([[2.0, -1.0, 4.0], [1.0, 3.0, -2.0]])
    info = fjp.ClientInfo(jnp.array([0.75, 0.25, 0.0]), jnp.int32(8), ())
    hard = fjp.algorithms.fedrs_client(0.5).adjust_logits(logits, info, None)
    np.testing.assert_allclose(hard, logits * jnp.array([1.0, 1.0, 0.5]))
    soft = fjp.algorithms.fedrs_client(0.5, soft=True).adjust_logits(logits, info, None)
    # alpha + (1 - alpha) p_k / max_j p_j = [1, 0.5 + 0.5/3, 0.5]
    np.testing.assert_allclose(soft, logits * jnp.array([1.0, 0.5 + 0.5 / 3, 0.5]), rtol=1e-6)


def _linear_nobias(dim, num_classes):
    """z = x W: a bias-free linear classifier, FedRS' reference head with h = x."""

    def init(key):
        return {"W": jax.random.normal(key, (dim, num_classes)) * 0.7}

    return fjp.Model("linear_nobias", init, lambda p, x: x @ p["W"], num_classes, False)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_fedrs_scales_an_absent_class_row_gradient_as_the_restricted_softmax(soft, seed):
    # Client without class 2: its batch holds classes 0 and 1 only. With z = W^T h (h = x)
    # and a the FedRS scaling, CE(a * z) has dL/dW[:, k] = mean_b a_k (q_bk - y_bk) h_b,
    # q = softmax(a * z); for the absent k = 2 (y = 0): a_2 mean_b q_b2 h_b.
    rng = np.random.default_rng(seed)
    alpha, lr = 0.3, 0.5
    label_dist = np.array([0.6, 0.4, 0.0])
    model = _linear_nobias(DIM, K)
    w = model.init(jax.random.PRNGKey(seed))
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    y = rng.integers(0, 2, size=8).astype(np.int32)
    info = fjp.ClientInfo(jnp.asarray(label_dist, jnp.float32), jnp.int32(8), ())
    algorithm = fjp.algorithms.fedrs(alpha, soft=soft)
    state = fjp.init_server_state(algorithm, w, 1)
    got = np.asarray(_one_local_step(algorithm, model, w, state, x, y, info, lr)["W"])

    a = alpha + (1 - alpha) * label_dist / label_dist.max() if soft else np.array([1, 1, alpha])
    W, x64 = np.asarray(w["W"], np.float64), x.astype(np.float64)
    q = _softmax64(a * (x64 @ W))
    grad = x64.T @ (a * (q - np.eye(K)[y])) / len(y)
    np.testing.assert_allclose(got, W - lr * grad, atol=1e-5)
    absent_row_grad = (W[:, 2] - got[:, 2]) / lr
    np.testing.assert_allclose(absent_row_grad, a[2] * (x64.T @ q[:, 2]) / len(y), atol=1e-5)
    # ... which is not plain softmax's push-down softmax(z)_2 h.
    plain = x64.T @ _softmax64(x64 @ W)[:, 2] / len(y)
    assert not np.allclose(absent_row_grad, plain, atol=1e-3)
