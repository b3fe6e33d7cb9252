"""FedVLS: the loss (prior-adjusted CE, logit suppression, vacant-class distillation) and one
local step against float64 NumPy, the edges (no vacant class, one, padding), and its composition
with FedPALS' weights and a server optimiser."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import fedjax_pals as fjp
from method_testing import _one_local_step

DIM, K = 3, 4
EPS = 1e-9


def _linear(dim, num_classes):
    def init(key):
        kw, kb = jax.random.split(key)
        return {"W": jax.random.normal(kw, (dim, num_classes)) * 0.8,
                "b": jax.random.normal(kb, (num_classes,)) * 0.3}

    return fjp.Model("linear", init, lambda p, x: x @ p["W"] + p["b"], num_classes, False)


def _ref_loss(f, g, y, pi, lam, mu):
    """Eqs. (1)-(4) of fedjax_pals/algorithms/fedvls.py in float64, written as the reference
    (krumpguo/FedVLS clientvls.py) computes them: the vacant columns indexed out."""
    f, g, pi = (np.asarray(a, np.float64) for a in (f, g, pi))
    n, k = f.shape
    adjusted = f + np.log(pi + EPS)
    ce = np.mean(special.logsumexp(adjusted, axis=1) - adjusted[np.arange(n), y])
    spread = (f - np.log(pi + EPS) + np.log(1.0 / k + EPS)) * (y[:, None] != np.arange(k))
    ls = np.sum(pi * (special.logsumexp(spread, axis=0) - np.log(n)))
    vacant = np.flatnonzero(pi == 0)
    if vacant.size:
        log_p = special.log_softmax(f[:, vacant], axis=1)
        q = special.softmax(g[:, vacant], axis=1)
        vd = np.sum(q * (np.log(q) - log_p)) / n
    else:
        vd = 0.0
    return ce + mu * ls + lam * vd


def _params64(params):
    return {k: np.asarray(v, np.float64) for k, v in params.items()}


def _ref_step(local, global_, x, y, pi, lam, mu, lr, h=1e-6):
    """One SGD step on the reference loss, its gradient by central differences in float64."""
    x64 = np.asarray(x, np.float64)
    gl = x64 @ global_["W"] + global_["b"]

    def loss(p):
        return _ref_loss(x64 @ p["W"] + p["b"], gl, y, pi, lam, mu)

    new = {}
    for name, value in local.items():
        grad = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            up, down = dict(local), dict(local)
            up[name], down[name] = value.copy(), value.copy()
            up[name][i] += h
            down[name][i] -= h
            grad[i] = (loss(up) - loss(down)) / (2 * h)
        new[name] = value - lr * grad
    return new


@pytest.mark.parametrize("pi", [
    [0.5, 0.5, 0.0, 0.0],      # two vacant classes: a distillation over them
    [0.7, 0.2, 0.1, 0.0],      # one vacant class: its restricted softmax is 1, KL 0
    [0.4, 0.3, 0.2, 0.1],      # none
])
def test_the_loss_is_the_papers_three_terms(pi):
    rng = np.random.default_rng(0)
    pi = np.asarray(pi)
    f, g = rng.normal(size=(2, 6, K)) * 2
    y = rng.choice(np.flatnonzero(pi > 0), size=6).astype(np.int32)
    for lam, mu in ((1.0, 0.005), (0.3, 2.0), (0.0, 0.0)):
        got = fjp.algorithms.fedvls_loss(f, g, y, np.ones(6, bool), pi, lam, mu)
        np.testing.assert_allclose(got, _ref_loss(f, g, y, pi, lam, mu), rtol=1e-5, atol=1e-6)
    # Padding (mask False) is left out of every sum: the loss of the valid rows alone.
    mask = np.array([True, True, False, True, False, True])
    got = fjp.algorithms.fedvls_loss(f, g, y, mask, pi, 0.7, 0.5)
    np.testing.assert_allclose(got, _ref_loss(f[mask], g[mask], y[mask], pi, 0.7, 0.5),
                               rtol=1e-5, atol=1e-6)
    # Without two vacant classes the distillation term is 0: lambda changes nothing.
    if np.sum(pi == 0) < 2:
        a = fjp.algorithms.fedvls_loss(f, g, y, np.ones(6, bool), pi, 0.0, 0.005)
        b = fjp.algorithms.fedvls_loss(f, g, y, np.ones(6, bool), pi, 5.0, 0.005)
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_local_step_is_sgd_on_the_fedvls_loss_with_the_global_model_as_teacher(seed):
    # Client without classes 2 and 3, local params away from the broadcast global ones (the
    # teacher): every term has a gradient.
    rng = np.random.default_rng(seed)
    lam, mu, lr = 1.0, 0.5, 0.2
    pi = np.array([0.75, 0.25, 0.0, 0.0])
    model = _linear(DIM, K)
    global_ = model.init(jax.random.PRNGKey(seed))
    local = model.init(jax.random.PRNGKey(seed + 10))
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    y = rng.choice([0, 1], size=8, p=[0.75, 0.25]).astype(np.int32)
    info = fjp.ClientInfo(jnp.asarray(pi, jnp.float32), jnp.int32(40), ())
    algorithm = fjp.algorithms.fedvls(lam, mu)
    state = fjp.init_server_state(algorithm, global_, 1)
    got = _one_local_step(algorithm, model, local, state, x, y, info, lr)
    want = _ref_step(_params64(local), _params64(global_), x, y, pi, lam, mu, lr)
    for name in ("W", "b"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    # The distillation pulls the vacant columns towards the teacher: without it (lam = 0) the
    # step on them differs.
    bare = _ref_step(_params64(local), _params64(global_), x, y, pi, 0.0, mu, lr)
    assert not np.allclose(got["W"][:, 2:], bare["W"][:, 2:], atol=1e-4)


def test_the_keys_resolve_and_fedvls_fedpals_trains_a_round(tmp_path):
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    algorithm = fjp.make_algorithm("fedvls_fedpals", partition=partition, lam=0.0,
                                   fedvls_lambda=0.1)
    assert algorithm.name == "fedvls_fedpals"
    assert algorithm.client is fjp.algorithms.fedvls_client(0.1, 0.005)
    method = fjp.get_method("fedvls")
    assert method.label == "FedVLS" and method.client_side
    assert method.grid == {"fedvls_lambda": (1.0, 0.1)}
    resolved = fjp.validate_config(
        {"dataset": {"name": "synthetic"}, "algorithm": {"name": "fedadam_fedvls"}}
    )
    assert (resolved.algorithm.name, resolved.server.optimizer) == ("fedvls", "fedadam")
    assert (resolved.algorithm.fedvls_lambda, resolved.algorithm.fedvls_ls_weight) == (1.0, 0.005)
    config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": "fedvls_fedpals"},
              "training": {"rounds": 1, "eval_every": 1, "batch_size": 8}}
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert np.isfinite(results["final_target_accuracy"])
    with pytest.raises(ValueError, match="lam must be >= 0"):
        fjp.algorithms.fedvls_client(-1.0)
