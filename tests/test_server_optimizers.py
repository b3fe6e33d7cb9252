"""Server optimisers (server_optimizers.py) against a float64 NumPy copy of Reddi et al.'s
FedOpt update, with every weighting, under the runs axis, through checkpoints and configs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms import server_optimizers as so
from fedjax_pals.algorithms import ClientOutputs, weighted_average_update
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import sweep as sweep_lib
from fedjax_pals.experiment.checkpoints import Checkpointer
from fedjax_pals.algorithms.registry import method_label

ETA, B1, B2, TAU, MOMENTUM = 0.1, 0.9, 0.99, 1e-3, 0.9
# Pseudo-gradient scale per round: large, then small (Yogi's sign(v - Delta^2) takes both
# signs), and near tau / sqrt(1 - b2) where v's start at tau^2 matters.
SCALES = (0.01, 0.1, 0.001, 0.05, 0.0005, 0.02)


def _reference(name, params, deltas, weights, eta=ETA):
    """Reddi et al., Algorithm 2 (and FedAvgM, Hsu et al.), float64, written out plainly."""
    theta = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in theta.items()}
    v = {k: np.full_like(x, TAU**2) for k, x in theta.items()}  # v_{-1} = tau^2
    for round_deltas, alpha in zip(deltas, weights):
        alpha = np.asarray(alpha, np.float64)
        for k in theta:
            d = np.tensordot(alpha, np.asarray(round_deltas[k], np.float64), axes=1)
            if name == "sgd":
                theta[k] = theta[k] + eta * d
                continue
            if name == "fedavgm":  # heavy ball on -Delta: m = b m + Delta, theta += eta m
                m[k] = MOMENTUM * m[k] + d
                theta[k] = theta[k] + eta * m[k]
                continue
            m[k] = B1 * m[k] + (1 - B1) * d
            if name == "fedadagrad":
                v[k] = v[k] + d**2
            elif name == "fedyogi":
                v[k] = v[k] - (1 - B2) * d**2 * np.sign(v[k] - d**2)
            else:
                v[k] = B2 * v[k] + (1 - B2) * d**2
            theta[k] = theta[k] + eta * m[k] / (np.sqrt(v[k]) + TAU)
    return theta


def _rounds(seed, num_rounds=len(SCALES), clients=4):
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(3, 5)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    deltas, weights = [], []
    for r in range(num_rounds):
        scale = SCALES[r % len(SCALES)]
        deltas.append(
            {k: (scale * rng.normal(size=(clients, *p.shape))).astype(np.float32) for k, p in params.items()}
        )
        weights.append(rng.dirichlet(np.ones(clients)).astype(np.float32))
    return params, deltas, weights


def _outputs(deltas, clients):
    zeros = jnp.zeros(clients)
    return ClientOutputs(
        deltas=jax.tree_util.tree_map(jnp.asarray, deltas),
        client_states=(),
        train_loss=zeros,
        num_steps=zeros,
        initial_loss=zeros,
    )


def _run_updates(algorithm, params, deltas, weights):
    state = fjp.init_server_state(algorithm, jax.tree_util.tree_map(jnp.asarray, params), 4)
    update = jax.jit(algorithm.server_update)
    participants = jnp.arange(4)
    for round_deltas, alpha in zip(deltas, weights):
        state = update(state, participants, _outputs(round_deltas, 4), jnp.asarray(alpha))
    return state


def _optimizer(name):
    return so.server_optimizer(name, ETA, momentum=MOMENTUM, b1=B1, b2=B2, tau=TAU)


@pytest.mark.parametrize("name", so.SERVER_OPTIMIZERS)
def test_each_optimizer_matches_reddi_et_al_in_float64(name):
    for seed in range(2):  # fresh random deltas and weights every round, two draws
        params, deltas, weights = _rounds(seed)
        algorithm = so.with_server_optimizer(fjp.fedavg(), _optimizer(name))
        state = _run_updates(algorithm, params, deltas, weights)
        expected = _reference(name, params, deltas, weights)
        for k in params:
            np.testing.assert_allclose(state.params[k], expected[k], rtol=2e-5, atol=2e-6)
        assert int(state.round) == 0  # the engine, not the server update, counts rounds
        moved = max(np.max(np.abs(expected[k] - params[k])) for k in params)
        assert moved > 1e-2  # the comparison is not dominated by the tolerance


def test_sgd_at_learning_rate_one_is_the_weighted_average_bit_for_bit():
    params, deltas, weights = _rounds(7)
    plain = _run_updates(fjp.fedavg(), params, deltas, weights)
    sgd = _run_updates(so.with_server_optimizer(fjp.fedavg(), optax.sgd(1.0)), params, deltas, weights)
    for k in params:
        np.testing.assert_array_equal(np.asarray(sgd.params[k]), np.asarray(plain.params[k]))
    # eta != 1: weighted_average_update(eta) is sgd(eta) too.
    scaled = fjp.fedavg()._replace(server_update=weighted_average_update(0.3))
    plain = _run_updates(scaled, params, deltas, weights)
    sgd = _run_updates(so.with_server_optimizer(fjp.fedavg(), optax.sgd(0.3)), params, deltas, weights)
    for k in params:
        np.testing.assert_array_equal(np.asarray(sgd.params[k]), np.asarray(plain.params[k]))


# -- through the engine -----------------------------------------------------------------------


def _task(seed=11, sizes=(9, 4, 14)):
    rng = np.random.default_rng(seed)
    total = int(np.sum(sizes))
    x = rng.normal(size=(total, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=total).astype(np.int32)
    rows = np.zeros((len(sizes), max(sizes)), np.int32)
    perm, start = rng.permutation(total), 0
    for i, n in enumerate(sizes):
        rows[i, :n] = perm[start : start + n]
        start += n
    counts = np.stack([np.bincount(y[rows[i, :n]], minlength=3) for i, n in enumerate(sizes)])
    return x, y, rows, np.asarray(sizes), counts / counts.sum(1, keepdims=True)


MODEL = fjp.logistic_regression((5,), 3)
TRAINING = fjp.LocalTraining(local_epochs=1, batch_size=4, learning_rate=0.1)
TARGET = np.array([0.8, 0.1, 0.1])


def _engine_rounds(algorithm, rounds, backend="vmap_scan"):
    data = fjp.engine.device_data(*_task())
    engine = fjp.engine.round_engine(algorithm, MODEL, TRAINING, backend=backend)
    state = fjp.init_server_state(algorithm, MODEL.init(jax.random.PRNGKey(0)), 3)
    metrics = None
    for r in range(rounds):
        state, metrics = engine.run_round(data, state, np.arange(3), jax.random.PRNGKey(r))
    return state, metrics


def test_sgd_at_learning_rate_one_through_the_engine_is_todays_fedpals_bit_for_bit():
    fedpals = fjp.fedpals(TARGET, 0.0)
    plain, _ = _engine_rounds(fedpals, 3)
    sgd, _ = _engine_rounds(so.with_server_optimizer(fedpals, optax.sgd(1.0)), 3)
    for a, b in zip(jax.tree_util.tree_leaves(plain.params), jax.tree_util.tree_leaves(sgd.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fedadam_composes_with_fedpals_weights():
    """One round of FedAdam+FedPALS is FedAdam's step on FedPALS' weighted mean delta: the
    delta read off plain FedPALS' round (eta = 1: theta_1 - theta_0), not FedAvg's."""
    fedpals, fedavg = fjp.fedpals(TARGET, 0.0), fjp.fedavg()
    theta0 = MODEL.init(jax.random.PRNGKey(0))
    plain, metrics = _engine_rounds(fedpals, 1)
    adam = so.with_server_optimizer(fedpals, _optimizer("fedadam"))
    composed, adam_metrics = _engine_rounds(adam, 1)
    np.testing.assert_array_equal(metrics["weights"], adam_metrics["weights"])
    fedavg_alpha = np.asarray(fjp.fedavg_weights(np.asarray([9, 4, 14], np.float32)))
    assert np.max(np.abs(np.asarray(metrics["weights"]) - fedavg_alpha)) > 0.05
    for leaf0, leaf1, got in zip(
        jax.tree_util.tree_leaves(theta0),
        jax.tree_util.tree_leaves(plain.params),
        jax.tree_util.tree_leaves(composed.params),
    ):
        delta = np.asarray(leaf1, np.float64) - np.asarray(leaf0, np.float64)
        m, v = (1 - B1) * delta, B2 * TAU**2 + (1 - B2) * delta**2
        expected = np.asarray(leaf0, np.float64) + ETA * m / (np.sqrt(v) + TAU)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    other, _ = _engine_rounds(so.with_server_optimizer(fedavg, _optimizer("fedadam")), 1)
    gap = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree_util.tree_leaves(other.params), jax.tree_util.tree_leaves(composed.params))
    )
    assert gap > 1e-3  # the weighting reaches the optimiser's step


@pytest.mark.parametrize("backend", ["vmap_scan", "host_loop"])
def test_the_runs_axis_keeps_each_runs_optimizer_state(backend):
    """Runs differing in T, lambda and seed share one engine; each keeps its own m and v."""
    x, y, rows, sizes, dists = _task()
    rng = np.random.default_rng(3)
    algorithms = [
        so.with_server_optimizer(fjp.fedpals(rng.dirichlet(np.ones(3)), lam), _optimizer("fedadam"))
        for lam in (0.0, 0.1, 10.0)
    ]
    states = [
        fjp.init_server_state(a, MODEL.init(jax.random.PRNGKey(r)), 3) for r, a in enumerate(algorithms)
    ]
    engine = fjp.engine.round_engine(algorithms[0], MODEL, TRAINING, backend=backend)
    assert all(fjp.engine.round_engine(a, MODEL, TRAINING, backend=backend) is engine for a in algorithms)
    stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *states)
    data = fjp.engine.device_data(x, y, *(np.stack([t] * 3) for t in (rows, sizes, dists)))
    participants = np.stack([np.arange(3)] * 3)
    keys = jnp.stack([jax.random.PRNGKey(50 + r) for r in range(3)])
    for _ in range(2):
        stacked, _ = engine.run_rounds(data, stacked, participants, keys)
    solo_data = fjp.engine.device_data(x, y, rows, sizes, dists)
    for r, state in enumerate(states):
        for _ in range(2):
            state, _ = engine.run_round(solo_data, state, participants[r], keys[r])
        run_r = jax.tree_util.tree_map(lambda leaf: leaf[r], stacked)
        for a, b in zip(jax.tree_util.tree_leaves(run_r), jax.tree_util.tree_leaves(state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    m = stacked.server_opt_state[0].m
    assert float(jnp.max(jnp.abs(jax.tree_util.tree_leaves(m)[0][0] - jax.tree_util.tree_leaves(m)[0][1]))) > 1e-4


# -- checkpoints ------------------------------------------------------------------------------


def _history():
    return fjp.TrainingHistory(
        rounds=[3],
        target_accuracy=[0.5],
        target_macro_f1=[0.5],
        val_accuracy=[0.5],
        val_macro_f1=[0.5],
        train_loss=[1.0, 1.0, 1.0],
        wall_seconds=1.0,
    )


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_optimizer_state_round_trips_through_a_checkpoint(tmp_path, name):
    params, deltas, weights = _rounds(1, num_rounds=3)
    algorithm = so.with_server_optimizer(fjp.fedavg(), _optimizer(name))
    state = _run_updates(algorithm, params, deltas, weights)
    Checkpointer(tmp_path / "ckpt").save(state, _history())
    template = fjp.init_server_state(algorithm, jax.tree_util.tree_map(jnp.asarray, params), 4)
    restored, _ = Checkpointer(tmp_path / "ckpt").restore(template)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The restored state goes on as the uninterrupted one.
    more = _rounds(2, num_rounds=2)
    go_on = lambda s: _continue(algorithm, s, more[1], more[2])
    for a, b in zip(jax.tree_util.tree_leaves(go_on(restored)), jax.tree_util.tree_leaves(go_on(state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _continue(algorithm, state, deltas, weights):
    update = jax.jit(algorithm.server_update)
    for round_deltas, alpha in zip(deltas, weights):
        state = update(state, jnp.arange(4), _outputs(round_deltas, 4), jnp.asarray(alpha))
    return state


def test_a_checkpoint_without_an_optimizer_keeps_the_layout_it_had(tmp_path):
    """Runs without a server optimiser save no server_opt_state: their checkpoints, the ones
    written before ServerState had the field included, restore into today's state."""
    from typing import Any, NamedTuple

    class ServerState(NamedTuple):  # the layout before server_opt_state
        params: Any
        client_states: Any
        algorithm_state: Any
        weighting_state: Any
        round: Any

    old = ServerState({"w": jnp.ones(3)}, (), (), {"lam": jnp.float32(0.5)}, jnp.int32(3))
    Checkpointer(tmp_path / "old").save(old, _history())
    template = fjp.ServerState({"w": jnp.zeros(3)}, (), (), {"lam": jnp.float32(0)}, jnp.int32(0))
    restored, _ = Checkpointer(tmp_path / "old").restore(template)
    assert restored.server_opt_state == ()
    np.testing.assert_array_equal(restored.params["w"], np.ones(3))
    new = template._replace(params={"w": jnp.full(3, 2.0)}, round=jnp.int32(3))
    Checkpointer(tmp_path / "new").save(new, _history())
    names = sorted(os.listdir(tmp_path / "new" / "3" / "state"))
    old_names = sorted(os.listdir(tmp_path / "old" / "3" / "state"))
    assert names == old_names


# -- config, sweeps, labels -------------------------------------------------------------------

# config_digest(default_config()) before the server section existed (main at 5a153d6).
DEFAULT_DIGEST = "1fca9d43b02ac476"


def test_config_server_section_keeps_existing_identities_and_validates():
    assert config_lib.config_digest(config_lib.default_config()) == DEFAULT_DIGEST
    explicit = config_lib.default_config()
    explicit.server.optimizer, explicit.server.learning_rate = "sgd", 1.0
    assert config_lib.config_digest(explicit) == DEFAULT_DIGEST
    assert dict(config_lib.validate_config(explicit).server) == dict.fromkeys(
        ("optimizer", "learning_rate", "momentum", "b1", "b2", "tau")
    )
    adam = config_lib.default_config()
    adam.server.optimizer, adam.server.learning_rate = "fedadam", 0.01
    resolved = config_lib.validate_config(adam).server
    assert (resolved.optimizer, resolved.learning_rate, resolved.momentum) == ("fedadam", 0.01, None)
    assert (resolved.b1, resolved.b2, resolved.tau) == (B1, B2, TAU)
    assert config_lib.config_digest(adam) != DEFAULT_DIGEST
    for config in (config_lib.default_config(), adam):  # a resolved config validates as itself
        once = config_lib.validate_config(config)
        assert config_lib.validate_config(once).to_dict() == once.to_dict()
        assert config_lib.config_digest(once) == config_lib.config_digest(config)
    grad = config_lib.default_config()
    grad.server.optimizer = "fedadagrad"
    assert config_lib.validate_config(grad).server.b2 is None  # Adagrad has no b2

    def error(**changes):
        c = config_lib.default_config()
        for path, value in changes.items():
            section, leaf = path.split("__")
            c[section][leaf] = value
        with pytest.raises(config_lib.ConfigError) as info:
            config_lib.validate_config(c)
        message = str(info.value)
        assert "\n" not in message
        return message

    assert "did you mean 'fedadam'" in error(server__optimizer="fedadm")
    assert "config.server.b1 must be a number in [0, 1)" in error(server__optimizer="fedadam", server__b1=1.0)
    assert "config.server.tau" in error(server__optimizer="fedyogi", server__tau=0.0)
    assert "config.server.learning_rate" in error(server__learning_rate=-1.0)
    assert "server update of its own" in error(algorithm__name="scaffold", server__optimizer="fedadam")
    assert "server update of its own" in error(
        algorithm__name="fedpals", algorithm__lam_schedule="hypergradient",
        algorithm__ess_fraction=0.5, server__optimizer="fedavgm",
    )


def test_sweep_method_keys_and_labels():
    config = {
        "dataset": {"name": "synthetic"},
        "sweep": {
            "methods": ("fedadam_fedpals", "fedavgm", "fedpals"),
            "seeds": (0,),
            "grid": {"server": {"learning_rate": (0.01, 0.03)}},
        },
    }
    runs = {name: c for name, c in sweep_lib.expand_sweep(config)}
    adam = config_lib.validate_config(runs["fedadam_fedpals/learning_rate=0.03/seed_0"])
    assert (adam.algorithm.name, adam.server.optimizer, adam.server.learning_rate) == (
        "fedpals", "fedadam", 0.03,
    )
    avgm = config_lib.validate_config(runs["fedavgm/learning_rate=0.01/seed_0"])
    assert (avgm.algorithm.name, avgm.server.optimizer, avgm.server.momentum) == ("fedavg", "fedavgm", 0.9)
    assert method_label("fedadam_fedpals") == "FedAdam+FedPALS"
    assert method_label("fedavgm") == "FedAvgM"
    assert method_label("fedyogi_fedprox_fedpals") == "FedYogi+FedProx+FedPALS"
    with pytest.raises(config_lib.ConfigError, match="cannot be an axis"):
        sweep_lib.expand_sweep({**config, "sweep": {"grid": {"server": {"optimizer": ("fedadam",)}}}})


# -- end to end -------------------------------------------------------------------------------


def test_fedadam_fedpals_end_to_end_on_the_synthetic_task(tmp_path):
    config = {
        "dataset": {"name": "synthetic"},
        "algorithm": {"name": "fedpals"},
        "training": {"rounds": 3, "batch_size": 8, "learning_rate": 0.05},
        "server": {"optimizer": "fedadam", "learning_rate": 0.1},
    }
    results = fjp.train_and_evaluate(config, str(tmp_path / "adam"), quiet=True)
    assert results["config"]["server"]["optimizer"] == "fedadam"
    assert results["rounds"][-1] == 3 and all(np.isfinite(results["target_accuracy"]))
    with open(tmp_path / "adam" / "results.json") as f:
        assert json.load(f)["config_digest"] == config_lib.config_digest(config)
    # The run's last checkpoint holds FedAdam's moments, and the run differs from FedPALS.
    task = fjp.build_task(config)
    assert task.algorithm.name == "fedadam_fedpals"  # one name: the method key
    template = fjp.init_server_state(task.algorithm, task.model.init(jax.random.PRNGKey(0)), 3)
    state, _ = Checkpointer(tmp_path / "adam" / "checkpoints").restore(template)
    assert int(state.round) == 3
    assert max(float(jnp.max(jnp.abs(m))) for m in jax.tree_util.tree_leaves(state.server_opt_state[0].m)) > 0
    plain = fjp.train_and_evaluate({**config, "server": {}}, str(tmp_path / "plain"), quiet=True)
    assert plain["target_accuracy"] != results["target_accuracy"]


@pytest.fixture
def signsgd():
    """A user's server optimiser, registered for one test: theta + eta sign(Delta)."""
    optimizer = fjp.ServerOptimizer(
        "signsgd", "SignSGD",
        lambda learning_rate: optax.chain(optax.scale_by_sign(), optax.scale(-learning_rate)),
    )
    fjp.register_server_optimizer(optimizer)
    yield optimizer
    so._REGISTERED.pop("signsgd")
    so.SERVER_OPTIMIZER_LABELS.pop("signsgd")
    fjp.extensions.forget_registration("server_optimizer", "signsgd")
    so.server_optimizer.cache_clear()


def test_a_registered_server_optimizer_is_a_config_value_and_a_method_key_prefix(signsgd):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.algorithm.name = "signsgd_fedpals"
    config.server.learning_rate = 0.01
    resolved = fjp.validate_config(config)
    assert resolved.server.optimizer == "signsgd" and resolved.algorithm.name == "fedpals"
    # It reads only its own key; the others resolve to None.
    assert resolved.server.to_dict() == dict(
        optimizer="signsgd", learning_rate=0.01, momentum=None, b1=None, b2=None, tau=None)
    assert method_label("signsgd_fedpals") == "SignSGD+FedPALS"
    assert method_label("signsgd") == "SignSGD"
    task = fjp.build_task(resolved)
    assert task.algorithm.name == "signsgd_fedpals"
    # Its step, against NumPy: theta + eta sign(sum_i alpha_i Delta_i).
    params, deltas, weights = _rounds(seed=int(np.random.default_rng().integers(1 << 30)),
                                      num_rounds=2)
    algorithm = so.with_server_optimizer(fjp.fedavg(), so.server_optimizer("signsgd", 0.01))
    state = _run_updates(algorithm, params, deltas, weights)
    for k in params:
        expected = np.asarray(params[k], np.float64)
        for round_deltas, alpha in zip(deltas, weights):
            mean = np.tensordot(np.float64(alpha), np.float64(round_deltas[k]), axes=1)
            expected = expected + 0.01 * np.sign(mean)
        np.testing.assert_allclose(state.params[k], expected, rtol=1e-6, atol=1e-7)


def test_a_server_optimizer_reading_a_key_the_config_has_not_is_refused():
    with pytest.raises(ValueError, match=r"keys must be among the config's server keys"):
        fjp.ServerOptimizer("lion", "Lion", lambda learning_rate, beta: None,
                            ("learning_rate", "beta"))
    with pytest.raises(ValueError, match="without '_'"):
        fjp.ServerOptimizer("my_opt", "Mine", lambda learning_rate: None)
    with pytest.raises(ValueError, match="already registered"):
        fjp.register_server_optimizer(so.registered_server_optimizers()["fedadam"])


def test_a_server_optimizer_build_that_does_not_fit_is_named_in_one_line():
    """A build without learning_rate is refused when registered; one returning no optax
    transformation, when the task is built (before any training): each one line naming it."""
    with pytest.raises(TypeError) as info:
        fjp.register_server_optimizer(fjp.ServerOptimizer(
            "nolr", "NoLR", lambda lr: optax.sgd(lr)))
    assert "server optimiser 'nolr'" in str(info.value) and "learning_rate" in str(info.value)
    assert "\n" not in str(info.value) and "nolr" not in so.registered_server_optimizers()
    with pytest.raises(TypeError, match="server optimiser 'nob1'.*momentum"):
        fjp.ServerOptimizer("nob1", "NoB1", lambda learning_rate: optax.sgd(learning_rate),
                            ("learning_rate", "momentum"))
    fjp.register_server_optimizer(fjp.ServerOptimizer(
        "notx", "NotTx", lambda learning_rate: {"lr": learning_rate}))
    try:
        config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": "notx_fedavg"},
                  "server": {"learning_rate": 0.1}}
        with pytest.raises(fjp.TaskError) as info:
            fjp.build_task(config)
        message = str(info.value)
        assert message.startswith("server optimiser 'notx': build must return an optax")
        assert "got dict" in message and "\n" not in message
    finally:
        so._REGISTERED.pop("notx")
        so.SERVER_OPTIMIZER_LABELS.pop("notx")
        fjp.extensions.forget_registration("server_optimizer", "notx")
        so.server_optimizer.cache_clear()


def test_the_old_module_path_warns_and_gives_the_moved_module(monkeypatch):
    # fedjax_pals/server_optimizers.py moved into algorithms/ (0.3.0); the old import path
    # still gives the same module, with a warning naming the version that refuses it.
    import importlib
    import sys

    for spelled in ("import", "attribute"):
        monkeypatch.delitem(sys.modules, "fedjax_pals.server_optimizers", raising=False)
        if "server_optimizers" in vars(fjp):  # (hasattr would import it: __getattr__)
            monkeypatch.delattr(fjp, "server_optimizers")
        with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                          match="algorithms.server_optimizers.*0.4.0 will refuse"):
            if spelled == "import":
                old = importlib.import_module("fedjax_pals.server_optimizers")
            else:
                old = fjp.server_optimizers
        assert old is so and old.SERVER_OPTIMIZER_LABELS is so.SERVER_OPTIMIZER_LABELS
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fjp.nope  # noqa: B018
