"""The method registry: one name per method, hyperparameters that validate themselves, and a
user's own method, model and data set run by the launchers without editing the package."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "extending")


@dataclasses.dataclass(frozen=True)
class _ToyHyperparameters(fjp.Hyperparameters):
    toy_strength: float = fjp.hyperparameter(0.5, low=0.0, high=1.0, low_open=True)
    toy_kind: str = fjp.hyperparameter("a", kind="choice", choices=("a", "b"))


def _toy(hp, context):
    return fjp.fedavg()


@pytest.fixture
def toy_method():
    method = fjp.Method(
        "toy", "Toy", _toy, _ToyHyperparameters, grid={"toy_strength": (0.5, 0.25)},
        client_side=True,
    )
    fjp.register_method(method, replace=True)
    yield method
    registry._METHODS.pop("toy")
    registry._METHODS.pop("clash", None)


def test_hyperparameters_validate_themselves_naming_the_field():
    assert _ToyHyperparameters().toy_strength == 0.5
    assert _ToyHyperparameters(toy_strength=1).toy_strength == 1.0
    with pytest.raises(ValueError, match=r"toy_strength must be a number in \(0, 1\], got 0"):
        _ToyHyperparameters(toy_strength=0.0)
    with pytest.raises(ValueError, match=r"toy_kind must be one of \['a', 'b'\].*did you mean"):
        _ToyHyperparameters(toy_kind="aa")
    with pytest.raises(ValueError, match="toy_strength"):
        _ToyHyperparameters(toy_strength=True)


def test_a_method_is_refused_with_a_grid_outside_its_hyperparameters():
    with pytest.raises(ValueError, match="grid key 'mu' is not one of its hyperparameters"):
        fjp.Method("bad", "Bad", _toy, _ToyHyperparameters, grid={"mu": (1.0,)})
    with pytest.raises(ValueError, match="grid value toy_strength"):
        fjp.Method("bad", "Bad", _toy, _ToyHyperparameters, grid={"toy_strength": (2.0,)})
    with pytest.raises(ValueError, match="must not end in '_fedpals'"):
        fjp.Method("bad_fedpals", "Bad", _toy)
    with pytest.raises(ValueError, match="already registered"):
        fjp.register_method(fjp.Method("fedavg", "FedAvg", _toy))


def test_a_hyperparameter_name_declared_twice_differently_is_refused(toy_method):
    @dataclasses.dataclass(frozen=True)
    class Clash(fjp.Hyperparameters):
        toy_strength: float = fjp.hyperparameter(0.9, low=0.0)

    with pytest.raises(ValueError, match="declared differently by method 'toy'"):
        fjp.register_method(fjp.Method("clash", "Clash", _toy, Clash))


def test_one_name_everywhere_config_sweep_label_and_algorithm(toy_method):
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    # The config: the method's keys are in the schema, validated by its declaration.
    resolved = fjp.validate_config({"algorithm": {"name": "toy", "toy_strength": 0.25}})
    assert resolved.algorithm.toy_strength == 0.25 and resolved.algorithm.prox_mu is None
    with pytest.raises(fjp.ConfigError, match=r"config.algorithm.toy_strength must be a number"):
        fjp.validate_config({"algorithm": {"name": "toy", "toy_strength": 3.0}})
    # Another method's run resolves the toy's keys to None and leaves them out of its identity.
    fedavg = fjp.validate_config({"algorithm": {"name": "fedavg"}})
    assert fedavg.algorithm.toy_strength is None
    assert "toy_strength" not in fjp.experiment.config.config_identity(fedavg)["algorithm"]
    # The combined key works as algorithm.name, in a sweep and as a label.
    combined = fjp.validate_config({"algorithm": {"name": "toy_fedpals"}})
    assert combined.algorithm.name == "toy" and combined.algorithm.weights == "fedpals"
    assert fjp.method_label("toy_fedpals") == "Toy+FedPALS"
    assert fjp.make_algorithm("toy_fedpals", partition=partition, lam=0.0).name == "toy_fedpals"
    assert fjp.make_algorithm("toy", toy_strength=0.5).name == "toy"
    assert fjp.protocol_grid().algorithm.toy_strength == (0.5, 0.25)
    runs = fjp.expand_sweep(
        {
            "algorithm": {"name": "fedavg"},
            "dataset": {"name": "synthetic"},
            "sweep": {"methods": ("toy", "fedavg"), "grid": {"algorithm": {"toy_strength": (0.5, 1.0)}}},
        }
    )
    names = [name for name, _ in runs]
    assert "toy/toy_strength=1/seed_0" in names and "fedavg/seed_0" in names
    assert not any("toy_strength" in n for n in names if n.startswith("fedavg"))


def test_the_digests_of_recorded_runs_are_unchanged_by_the_registry():
    # Digests computed by main before the registry (5a153d6): workdirs and sweeps recorded
    # then must still be recognised as the same runs.
    recorded = {
        "fedpals": "1fca9d43b02ac476",
        "fedavg": "1fc3103cacfb13c3",
        "fedprox": "4448c5a2b5a8aaa9",
        "scaffold": "f764be8a52e0ebbb",
        "afl": "d7af5e20b92b6671",
        "fedrs": "2772b6d053d07254",
        "fedshift": "cab91efb66d89fe7",
        "oracle": "dc51f034214093a5",
        "feddisco": "a65cd27b58638f6c",
        "fedlc": "c6c5a8af83109fd0",
    }
    for name, digest in recorded.items():
        assert fjp.config_digest({"algorithm": {"name": name}}) == digest, name
    combined = {"name": "fedprox", "weights": "fedpals", "prox_mu": 0.1}
    assert fjp.config_digest({"algorithm": combined}) == "a53eda155a04e1ec"
    assert fjp.config_digest({"algorithm": {"name": "fedprox_fedpals", "prox_mu": 0.1}}) == (
        "a53eda155a04e1ec"
    )
    disco = {"algorithm": {"name": "feddisco", "feddisco_metric": "l2"}}
    assert fjp.config_digest({**disco, "dataset": {"name": "synthetic"}}) == "d8d0f240c02e08ef"


def test_a_user_module_registers_a_method_model_and_data_set_that_the_launchers_run(tmp_path):
    # Copied outside the package, as a user's own project.
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    env = {**os.environ, "PYTHONPATH": ROOT}  # the package under test, the user's cwd first
    sweep = subprocess.run(
        [
            sys.executable, "-m", "experiments.sweep", "--config=my_sweep.py",
            f"--workdir={tmp_path / 'sweep'}", "--config.training.rounds=2",
            "--config.sweep.seeds=(0,)", "--quiet",
        ],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    table = json.loads((tmp_path / "sweep" / "table.json").read_text())
    assert table["labels"]["fednova"] == "FedNova"
    cells = table["rows"][0]["cells"]
    assert set(cells) == {"fednova", "fedpals", "fedavg"}
    assert cells["fednova"]["selected"] in ([["nova_server_lr", 1.0]], [["nova_server_lr", 0.5]])
    result = json.loads(
        (tmp_path / "sweep" / "runs" / "fednova" / "nova_server_lr=0.5" / "seed_0" / "results.json").read_text()
    )
    assert result["config"]["model"] == "my_mlp" and result["config"]["dataset"]["name"] == "blobs"
    assert result["config"]["algorithm"]["nova_server_lr"] == 0.5
    # One run of the run command, with an override of the user's own key.
    run = subprocess.run(
        [
            sys.executable, "-m", "experiments.run", "--config=my_config.py",
            f"--workdir={tmp_path / 'run'}", "--config.training.rounds=2",
            "--config.algorithm.nova_server_lr=0.5", "--quiet",
        ],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    alone = json.loads((tmp_path / "run" / "results.json").read_text())
    np.testing.assert_allclose(alone["target_accuracy"], result["target_accuracy"])


@pytest.fixture
def registries_restored():
    """Whatever a test registers is gone after it (the registries are process-wide)."""
    from fedjax_pals import models
    from fedjax_pals.data import datasets

    saved = (dict(registry._METHODS), dict(models.MODELS), dict(datasets._REGISTERED))
    yield
    for live, before in zip((registry._METHODS, models.MODELS, datasets._REGISTERED), saved):
        live.clear()
        live.update(before)


def test_the_example_fednova_update_normalises_by_local_steps(registries_restored):
    sys.path.insert(0, EXAMPLE)
    try:
        import my_extension
    finally:
        sys.path.remove(EXAMPLE)
        sys.modules.pop("my_extension", None)
    update = my_extension.fednova_server_update(0.5)
    rng = np.random.default_rng()
    deltas = rng.normal(size=(3, 4)).astype(np.float32)
    tau = np.array([1, 4, 2], np.int32)
    weights = np.array([0.2, 0.5, 0.3], np.float32)
    state = fjp.ServerState(
        params={"w": jnp.zeros(4)}, client_states=(), algorithm_state=(), weighting_state=(),
        round=jnp.zeros((), jnp.int32),
    )
    outputs = fjp.ClientOutputs(
        deltas={"w": jnp.asarray(deltas)}, client_states=(), train_loss=jnp.zeros(3),
        num_steps=jnp.asarray(tau), initial_loss=jnp.zeros(3),
    )
    new = jax.jit(update)(state, jnp.arange(3), outputs, jnp.asarray(weights))
    tau64, w64 = tau.astype(np.float64), weights.astype(np.float64)
    expected = 0.5 * (w64 @ tau64) * ((w64 / tau64) @ deltas.astype(np.float64))
    np.testing.assert_allclose(np.asarray(new.params["w"]), expected, rtol=1e-5, atol=1e-6)
    assert int(new.round) == 0  # the engine, not a server update, counts the rounds


def test_server_optimiser_keys_and_labels_cover_every_server_optimiser():
    from fedjax_pals import server_optimizers

    assert set(registry.SERVER_OPTIMIZER_LABELS) == set(server_optimizers.SERVER_OPTIMIZERS) - {"sgd"}
    for optimizer, label in registry.SERVER_OPTIMIZER_LABELS.items():
        assert registry.method_overrides(f"{optimizer}_fedpals") == {
            "algorithm.name": "fedpals",
            "algorithm.weights": None,
            "server.optimizer": optimizer,
        }
        assert fjp.method_label(optimizer) == label
