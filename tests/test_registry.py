"""The method registry: one name per method, hyperparameters that validate themselves, and a
user's own method, model and data set run by the launchers without editing the package."""

import ast
import dataclasses
import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms import registry
from fedjax_pals.data import datasets as datasets_lib

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


def test_a_user_module_registers_a_method_feature_model_and_data_set_that_the_launchers_run(
    tmp_path,
):
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
    # The user's feature: FedPALS' runs span its key, FedNova's and FedAvg's resolve it to None.
    smoothed = json.loads(
        (tmp_path / "sweep" / "runs" / "fedpals" / "lam=0,target_smoothing=0.1" / "seed_0"
         / "results.json").read_text()
    )
    assert smoothed["config"]["algorithm"]["target_smoothing"] == 0.1
    truth = np.asarray(smoothed["partition"]["target_label_dist"])
    np.testing.assert_allclose(smoothed["smoothed_target"], 0.9 * truth + 0.1 / 4, atol=1e-12)
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

    live = (registry._METHODS, models.MODELS, datasets._REGISTERED, fjp.extensions._REGISTRATIONS)
    saved = tuple(dict(registered) for registered in live)
    yield
    for registered, before in zip(live, saved):
        registered.clear()
        registered.update(before)


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


def test_a_misspelt_method_is_refused_suggesting_the_registered_one():
    # Not a fallback to another method (FedAvg): a typo in a config would run the wrong one.
    with pytest.raises(ValueError, match=r"unknown method 'fedprx' \(did you mean 'fedprox'\?\)"):
        fjp.get_method("fedprx")
    for name in ("fedprox", "fedavg", "afl"):
        assert fjp.get_method(name).name == name
    with pytest.raises(ValueError, match=r"unknown method 'no_such_method'; the registered"):
        fjp.get_method("no_such_method")


def test_server_optimiser_keys_and_labels_cover_every_server_optimiser():
    from fedjax_pals.algorithms import server_optimizers

    # Defined with the optimisers; the registry's name is the same dict.
    assert registry.SERVER_OPTIMIZER_LABELS is server_optimizers.SERVER_OPTIMIZER_LABELS
    assert set(registry.SERVER_OPTIMIZER_LABELS) == set(server_optimizers.SERVER_OPTIMIZERS) - {"sgd"}
    for optimizer, label in registry.SERVER_OPTIMIZER_LABELS.items():
        assert registry.method_overrides(f"{optimizer}_fedpals") == {
            "algorithm.name": "fedpals",
            "algorithm.weights": None,
            "server.optimizer": optimizer,
        }
        assert fjp.method_label(optimizer) == label


# -- a user's extension that does not fit: one line naming it, before anything trains ---------
#
# Each case registers a tiny extension (4 Gaussian classes in 8 dimensions, an MLP, a method)
# with one mistake and launches it with `train_and_evaluate`, whose training is replaced by a
# failure: the mistake must be refused while the task is built.

_FIT_CLASSES, _FIT_DIM = 4, 8


class _FitMLP(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))


def _register_blobs(name, *, declared_classes=_FIT_CLASSES, damage=None):
    def load():
        rng = np.random.default_rng(0)
        means = rng.normal(scale=3.0, size=(_FIT_CLASSES, _FIT_DIM))

        def split(n):
            y = rng.integers(0, _FIT_CLASSES, size=n).astype(np.int32)
            return (means[y] + rng.normal(size=(n, _FIT_DIM))).astype(np.float32), y

        (x, y), (x_test, y_test) = split(1000), split(1000)
        if damage is not None:
            damage(x, x_test)
        return fjp.Dataset(
            name, fjp.LabeledSplit(x, y), fjp.LabeledSplit(x_test, y_test), _FIT_CLASSES, "test"
        )

    fjp.register_dataset(name, load, num_classes=declared_classes, num_train=1000, images=False)


def _register_mlp(name, *, extra_logits=0, returns=None):
    def build(input_shape, num_classes):
        if returns is not None:
            return returns(num_classes)
        module = _FitMLP(num_classes + extra_logits)
        return fjp.model_from_flax(name, module, input_shape, num_classes)

    fjp.register_model(name, functools.cache(build))


def _fit_config(dataset, model="logistic_regression", method="fedavg"):
    config = fjp.default_config()
    config.dataset.name, config.model, config.algorithm.name = dataset, model, method
    config.partition.scheme, config.partition.dirichlet_beta = "dirichlet", 0.3
    config.partition.num_clients = 6
    config.training.rounds = 1
    return config


@pytest.fixture
def no_training(monkeypatch, registries_restored):
    """Training refused: a test passes only if the mistake is caught before it."""
    from fedjax_pals.experiment import train as train_lib

    def trained(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train_lib, "run_trainings", trained)


def _refused(config, tmp_path) -> str:
    """The one-line TaskError (an `error:` line on the command line) of a launch; nothing
    trained or written."""
    with pytest.raises(fjp.TaskError) as raised:
        fjp.train_and_evaluate(config, tmp_path / "run", quiet=True)
    message = str(raised.value)
    assert "\n" not in message
    assert not (tmp_path / "run" / "results.json").exists()
    return message


def test_a_model_with_more_logits_than_classes_is_refused_before_training_naming_it(
    no_training, tmp_path
):
    _register_blobs("fit_blobs")
    _register_mlp("wide_mlp", extra_logits=3)
    message = _refused(_fit_config("fit_blobs", "wide_mlp"), tmp_path)
    assert message == (
        "model 'wide_mlp' outputs 7 logits but data set 'fit_blobs' has 4 classes; give its "
        "last layer the num_classes its builder is passed."
    )


def test_a_model_with_fewer_logits_than_classes_is_refused_before_training_naming_it(
    no_training, tmp_path
):
    _register_blobs("fit_blobs")
    _register_mlp("narrow_mlp", extra_logits=-1)
    message = _refused(_fit_config("fit_blobs", "narrow_mlp"), tmp_path)
    assert message.startswith("model 'narrow_mlp' outputs 3 logits but data set 'fit_blobs' has 4")


def test_a_model_declaring_another_num_classes_than_it_was_built_for_is_refused(
    no_training, tmp_path
):
    # Its logits fit, but evaluation would count the classes its Model declares.
    _register_blobs("fit_blobs")
    _register_mlp(
        "liar_mlp",
        returns=lambda k: fjp.model_from_flax("liar_mlp", _FitMLP(k), (_FIT_DIM,), k + 1),
    )
    message = _refused(_fit_config("fit_blobs", "liar_mlp"), tmp_path)
    assert "model 'liar_mlp'" in message and "num_classes=5" in message


def _nan_in_train(x, x_test):
    x[5, 2] = np.nan


def _inf_in_test(x, x_test):
    x_test[[7, 9], 1] = [np.inf, -np.inf]


@pytest.mark.parametrize(
    "damage, expected",
    [
        (_nan_in_train, "its train split holds 1 non-finite feature value (NaN or inf), the "
         "first in example 5"),
        (_inf_in_test, "its test split holds 2 non-finite feature values (NaN or inf), the "
         "first in example 7"),
    ],
)
def test_non_finite_features_are_refused_before_training_naming_the_data_set_and_split(
    no_training, tmp_path, damage, expected
):
    _register_blobs("nan_blobs", damage=damage)
    message = _refused(_fit_config("nan_blobs"), tmp_path)
    assert message.startswith(f"data set 'nan_blobs': {expected}")
    assert "learning rate" not in message


@pytest.mark.parametrize("declared", [_FIT_CLASSES + 2, _FIT_CLASSES - 1])
def test_a_registered_num_classes_other_than_the_loaded_data_sets_is_refused(
    no_training, tmp_path, declared
):
    _register_blobs("k_blobs", declared_classes=declared)
    message = _refused(_fit_config("k_blobs"), tmp_path)
    assert message.startswith(
        f"data set 'k_blobs' is registered with num_classes={declared}, but its loader "
        "returned one with 4 classes; register it with num_classes=4"
    )


def test_a_registered_num_train_or_images_other_than_the_loaded_data_sets_is_refused(
    no_training, tmp_path
):
    _register_blobs("n_blobs")
    load = datasets_lib.registered_datasets()["n_blobs"].load
    fjp.register_dataset("n_blobs", load, num_classes=4, num_train=999, images=False, replace=True)
    assert "num_train=999, but its loader returned one with 1000 training examples" in _refused(
        _fit_config("n_blobs"), tmp_path
    )
    fjp.register_dataset("n_blobs", load, num_classes=4, num_train=1000, images=True, replace=True)
    assert "registered with images=True, but its inputs have shape (8,) per example" in _refused(
        _fit_config("n_blobs"), tmp_path
    )


def test_a_registered_data_set_s_label_names_its_sweep_rows(registries_restored):
    from fedjax_pals.experiment import sweep as sweep_lib

    _register_blobs("l_blobs")
    config = _fit_config("l_blobs")
    config.sweep = {"seeds": (0,), "methods": ("fedavg",)}
    ((run,), _) = sweep_lib._runs(config)
    assert run.row == "l_blobs beta=0.3"  # no label: the name
    load = datasets_lib.registered_datasets()["l_blobs"].load
    fjp.register_dataset(
        "l_blobs", load, num_classes=4, num_train=1000, images=False, label="Blobs", replace=True
    )
    ((run,), _) = sweep_lib._runs(config)
    assert run.row == "Blobs beta=0.3"
    assert fjp.data.dataset_label("l_blobs") == "Blobs"
    assert fjp.data.dataset_label("cifar10") == "CIFAR-10"
    with pytest.raises(ValueError, match="label must be a non-empty string"):
        fjp.register_dataset("l_blobs", load, num_classes=4, num_train=1000, images=False,
                             label=" ", replace=True)


def test_float_labels_of_a_registered_data_set_are_refused_naming_it(no_training, tmp_path):
    def load():
        split = fjp.LabeledSplit(np.zeros((1000, 2), np.float32), np.zeros(1000, np.float32))
        return fjp.Dataset("float_blobs", split, split, 2, "test")

    fjp.register_dataset("float_blobs", load, num_classes=2, num_train=1000, images=False)
    message = _refused(_fit_config("float_blobs"), tmp_path)
    assert message == (
        "data set 'float_blobs': y must hold integer class labels, got dtype float32"
    )


def test_a_hyperparameters_field_without_hyperparameter_is_refused_at_registration():
    @dataclasses.dataclass(frozen=True)
    class Plain(fjp.Hyperparameters):
        check_strength: float = 1.0

    with pytest.raises(TypeError) as raised:
        fjp.Method("plainly", "Plainly", _toy, Plain)
    message = str(raised.value)
    assert message.startswith(
        "method 'plainly': hyperparameter 'check_strength' of Plain is a plain dataclass field; "
        "declare it with fjp.hyperparameter(default, ...)"
    )
    assert "plainly" not in registry.registered_methods()

    class Undecorated(fjp.Hyperparameters):
        check_strength: float = fjp.hyperparameter(1.0)

    with pytest.raises(TypeError, match="method 'plainly': its hyperparameters Undecorated is "
                       "not a dataclass; decorate it with @dataclasses.dataclass"):
        fjp.Method("plainly", "Plainly", _toy, Undecorated)


@functools.cache
def _bad_server_update(kind):
    average = fjp.weighted_average_update()

    def update(state, participants, outputs, weights):
        new = average(state, participants, outputs, weights)
        if kind == "transposed":
            return new._replace(params=jax.tree_util.tree_map(jnp.transpose, new.params))
        if kind == "bfloat16":  # trained silently, recompiling every round
            return new._replace(
                params=jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), new.params)
            )
        return new.params  # not a ServerState

    return update


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("transposed", "its server update returns a state whose params['Dense_0']['kernel'] has "
         "shape (4, 8) float32 where the state it was given has (8, 4) float32."),
        ("bfloat16", "its server update returns a state whose params['Dense_0']['bias'] has "
         "shape (4,) bfloat16 where the state it was given has (4,) float32."),
        ("params", "its server update returns dict, not a fedjax_pals.ServerState."),
    ],
)
def test_a_server_update_returning_another_state_is_refused_before_training_naming_it(
    no_training, tmp_path, kind, expected
):
    def build(hp, context):
        return fjp.fedavg()._replace(server_update=_bad_server_update(kind))

    fjp.register_method(fjp.Method("badupdate", "BadUpdate", build, owns_server_update=True))
    _register_blobs("fit_blobs")
    message = _refused(_fit_config("fit_blobs", method="badupdate"), tmp_path)
    assert message == f"method 'badupdate': {expected}"


def test_a_model_builder_returning_no_model_is_refused_naming_it(no_training, tmp_path):
    _register_blobs("fit_blobs")
    _register_mlp("module_only", returns=_FitMLP)  # the flax module, not its Model
    message = _refused(_fit_config("fit_blobs", "module_only"), tmp_path)
    assert message.endswith(
        "model 'module_only': its builder returned _FitMLP, not a fedjax_pals.Model; make one "
        "from a flax module with fjp.model_from_flax('module_only', module, input_shape, "
        "num_classes)."
    )


def test_a_method_builder_returning_no_algorithm_is_refused_naming_it(no_training, tmp_path):
    fjp.register_method(
        fjp.Method("halfbuilt", "HalfBuilt", lambda hp, context: fjp.weighted_average_update())
    )
    _register_blobs("fit_blobs")
    message = _refused(_fit_config("fit_blobs", method="halfbuilt"), tmp_path)
    assert message.endswith(
        "method 'halfbuilt': its build(hyperparameters, context) returned "
        "WeightedAverageUpdate, not a fedjax_pals.FederatedAlgorithm (e.g. fjp.fedavg()._replace(server_update=...))."
    )


def _shift_train(x, x_test):
    x += 1000.0


def test_a_data_set_registered_again_is_loaded_again(registries_restored):
    # A notebook redefining its data set (replace=True) gets the new data, not a cached copy.
    from fedjax_pals.experiment import task as task_lib

    _register_blobs("again_blobs")
    config = fjp.validate_config(_fit_config("again_blobs"))
    assert task_lib.load_data(config)[0].train.x.max() < 100.0
    datasets_lib._REGISTERED.pop("again_blobs")
    _register_blobs("again_blobs", damage=_shift_train)
    assert task_lib.load_data(config)[0].train.x.min() > 100.0


_WIDE_EXTENSION = """
import functools
import inspect
import flax.linen as nn, numpy as np
import fedjax_pals as fjp

class Wide(nn.Module):
    num_classes: int
    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes + 3)(x)  # the mistake: 3 logits too many

fjp.register_model("wide_mlp", functools.cache(
    lambda shape, k: fjp.model_from_flax("wide_mlp", Wide(k), shape, k)))

def load():
    rng = np.random.default_rng(0)
    def split(n):
        y = rng.integers(0, 4, size=n)
        return fjp.LabeledSplit((rng.normal(size=(n, 8)) + y[:, None]).astype(np.float32), y)
    return fjp.Dataset("blobs", split(1000), split(1000), 4, source="wide")

fjp.register_dataset("blobs", load, num_classes=4, num_train=1000, images=False)
"""
_WIDE_CONFIG = """
import fedjax_pals as fjp
import wide_extension  # noqa: F401

def get_config():
    config = fjp.default_config()
    config.dataset.name, config.model, config.algorithm.name = "blobs", "wide_mlp", "fedavg"
    config.partition.scheme, config.partition.dirichlet_beta = "dirichlet", 0.3
    config.partition.num_clients = 6
    config.training.rounds = 1
    return config
"""


def test_a_model_that_does_not_fit_the_data_is_one_error_line_of_the_run_command(tmp_path):
    # It used to train silently (argmax over 7 logits for 4 classes) and exit 0.
    (tmp_path / "wide_extension.py").write_text(_WIDE_EXTENSION)
    (tmp_path / "wide.py").write_text(_WIDE_CONFIG)
    run = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--config=wide.py",
         f"--workdir={tmp_path / 'run'}", "--quiet"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
        timeout=600,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "error: model 'wide_mlp' outputs 7 logits but data set 'blobs' has 4 classes; give its "
        "last layer the num_classes its builder is passed."
    )
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "run" / "results.json").exists()


def _code_string_literals(module) -> set[str]:
    """The string literals of `module`'s code (f-string parts included), docstrings left out."""
    tree = ast.parse(inspect.getsource(module))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def test_config_and_task_name_no_registered_method_feature_data_set_or_partition():
    # Both loop over the registries: a method, feature, data set or partition scheme is known
    # by its declaration (its keys, its hooks, owns_server_update, lends_weighting, its data
    # directory check), never by name in config.py or task.py.
    from fedjax_pals.data import registered_datasets, registered_partitions
    from fedjax_pals.experiment import config as config_lib, task as task_lib

    names = set(registry.method_keys()) | {f.name for f in registry.registered_features()}
    names |= set(registered_datasets()) | set(registered_partitions())
    assert {"fedpals", "fedavg", "scaffold", "fedpals_adaptive", "label_dp", "fashion_mnist",
            "synthetic", "sparsity", "dirichlet"} <= names
    for module in (config_lib, task_lib):
        literals = _code_string_literals(module)
        named = sorted(
            name for name in names
            if any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) for text in literals)
        )
        assert not named, f"{module.__name__} names {named}"


# -- feature stages ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Mixing(fjp.Hyperparameters):
    mix_uniform: float | None = fjp.hyperparameter(None, low=0.0, high=1.0, optional=True)


def _mix_uniform(hp, context):
    target = np.asarray(context.partition.target_label_dist, np.float64)
    mixed = (1.0 - hp.mix_uniform) * target + hp.mix_uniform / target.size
    return context.replace(partition=dataclasses.replace(context.partition, target_label_dist=mixed))


def _mixing_feature(**stage):
    return fjp.Feature(
        "mix_uniform", "T mixed", _Mixing,
        lambda values, facts: {"mix_uniform": values["mix_uniform"] if facts.reads_target else None},
        prepare=_mix_uniform, per_run_state=("mix_uniform",), **stage,
    )


@pytest.fixture
def features_restored():
    saved = dict(registry._FEATURES)
    yield
    registry._FEATURES.clear()
    registry._FEATURES.update(saved)
    for name in ("mix_uniform", "test_budget", "test_two_ways"):
        fjp.extensions.forget_registration("feature", name)


def _ess_fraction_reached(ess_fraction, mix):
    from fedjax_pals.experiment.task import task_summary

    if "stage_blobs" not in datasets_lib.registered_datasets():
        _register_blobs("stage_blobs")  # 5 Dirichlet clients; T away from their aggregate
    config = _fit_config("stage_blobs", method="fedpals")
    config.algorithm.ess_fraction = ess_fraction
    config.algorithm.mix_uniform = mix
    task = fjp.build_task(config)
    summary = task_summary(task)
    return summary["ess"] / summary["total_examples"], task.target_label_dist


def test_a_user_feature_at_the_target_stage_is_seen_by_the_lambda_search(
    features_restored, registries_restored
):
    # Registered after the built-in fedpals_lambda: its stage, not its registration, puts its
    # T before the ESS search, so the weights reach the ESS asked for with the T they use.
    fjp.register_feature(_mixing_feature(stage="target"))
    rng = np.random.default_rng()
    mix = float(rng.uniform(0.2, 0.8))
    for fraction in (0.9, 0.97):
        reached, target = _ess_fraction_reached(fraction, mix)
        truth = np.asarray(fjp.build_task(_fit_config("stage_blobs")).target_label_dist)
        np.testing.assert_allclose(target, (1 - mix) * truth + mix / truth.size, atol=1e-12)
        # lambda_for_ess' bisection tolerance on the ESS, relative to N.
        assert abs(reached - fraction) < 1e-4, (fraction, reached)


def _synthetic():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 1
    return config


def test_a_feature_without_a_stage_warns_and_runs_after_the_staged_ones(
    features_restored, registries_restored
):
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match=r"feature 'mix_uniform' declares no stage.*stage=.*'target'.* 0\.3\.0"):
        fjp.register_feature(_mixing_feature())
    assert registry.registered_features()[-1].name == "mix_uniform"
    # As before stages: lambda is searched on the true T, the weights use the mixed one.
    reached, _ = _ess_fraction_reached(0.8, 0.5)
    assert reached > 0.85


def test_features_run_by_stage_then_registration_order(features_restored):
    fjp.register_feature(_mixing_feature(stage="target"))
    order = [(f.stage, f.name) for f in registry.registered_features()]
    stages = [registry.FEATURE_STAGES.index(stage) for stage, _ in order]
    assert stages == sorted(stages)
    names = [name for _, name in order]
    # Within a stage, registration order: the built-in T features, then the user's.
    assert names.index("perturbed_target") < names.index("unknown_target") < names.index(
        "mix_uniform") < names.index("label_dp") < names.index("adaptive_lambda") < names.index(
        "fedpals_lambda")


def test_wrap_algorithm_wraps_by_stage_and_places_a_features_link_by_its_slot():
    seen = []

    def feature(name, stage, slot=None):
        def wrap(algorithm, hp, context):
            seen.append(name)
            return algorithm

        link = None
        if slot is not None:
            link_type = dataclasses.make_dataclass(
                f"Link_{name}", [], bases=(fjp.ServerLink,), frozen=True,
                namespace={"slot": slot, "__call__": lambda self, state, updates: (updates, state)})
            link = lambda hp, context: link_type()
        return registry.Feature(name, name, fjp.Hyperparameters, lambda values, facts: {},
                                wrap=wrap, stage=stage, link=link)

    # Given out of stage order, with an unstaged one (deprecated: it runs last); the noise link
    # comes from an earlier stage than the clip link, and the chain still clips first.
    features = [(feature(n, s, slot), None) for n, s, slot in (
        ("late", "algorithm", "clip"), ("unstaged", None, None), ("first", "target", "noise"),
        ("mid", "lambda", None), ("late2", "algorithm", "transform"))]
    algorithm = fjp.algorithms.registry.wrap_algorithm(
        fjp.fedavg(), features, registry.MethodContext())
    assert seen == ["first", "mid", "late", "late2", "unstaged"]
    assert [type(link).__name__ for link in algorithm.server_update.links] == [
        "Link_late", "Link_late2", "Link_first"]


def test_a_stage_that_is_not_one_is_refused_naming_the_stages():
    with pytest.raises(ValueError, match=r"stage 'targt' is not a stage \(did you mean 'target'"):
        _mixing_feature(stage="targt")


# -- stage contracts (issue 59): what a stage fixes, a later prepare may not change -------------


def _stage_config(method="fedpals"):
    if "stage_blobs" not in datasets_lib.registered_datasets():
        _register_blobs("stage_blobs")  # 5 Dirichlet clients; T away from their aggregate
    return _fit_config("stage_blobs", method=method)


def test_a_feature_at_the_lambda_stage_that_changes_t_is_refused_naming_the_target_stage(
    features_restored, no_training, tmp_path
):
    # Run after the ESS search, its T would not be the one lambda was searched on (silently
    # wrong until issue 59): refused, in one line, before anything trains.
    fjp.register_feature(_mixing_feature(stage="lambda"))
    config = _stage_config()
    config.algorithm.mix_uniform = 0.5
    message = _refused(config, tmp_path)
    assert "feature 'mix_uniform' at the stage 'lambda': its prepare changed T " in message
    assert message.endswith("declare Feature(..., stage='target').")


@dataclasses.dataclass(frozen=True)
class _Floor(fjp.Hyperparameters):
    s_floor: float | None = fjp.hyperparameter(None, low=0.0, high=1.0, optional=True)


def _floor_s(hp, context):
    floored = np.maximum(np.asarray(context.weight_label_dists, np.float64), hp.s_floor)
    return context.replace(server_label_dists=floored / floored.sum(axis=1, keepdims=True))


def _floor_feature(stage):
    return fjp.Feature(
        "s_floor", "S floored", _Floor,
        lambda values, facts: {"s_floor": values["s_floor"] if facts.reads_target else None},
        prepare=_floor_s, stage=stage,
    )


def test_a_feature_at_the_lambda_stage_that_changes_s_is_refused_naming_label_marginals(
    features_restored, no_training, tmp_path
):
    fjp.register_feature(_floor_feature("lambda"))
    config = _stage_config()
    config.algorithm.s_floor = 0.05
    message = _refused(config, tmp_path)
    assert "feature 's_floor' at the stage 'lambda': its prepare changed the S_i the weights " \
        "see" in message
    assert message.endswith("declare Feature(..., stage='label_marginals').")
    # At its own stage the same prepare runs, and the weights see what it made.
    fjp.register_feature(_floor_feature("label_marginals"), replace=True)
    task = fjp.build_task(config)
    assert np.min(task.server_label_dists) > 0.04


def test_a_prepare_at_the_algorithm_stage_warns_and_runs_but_may_not_change_t(
    features_restored, registries_restored, no_training, tmp_path
):
    # Today a prepare at 'algorithm' runs (after lambda, before the method is built): what
    # does not touch T or S still works, with a warning (0.4.0 refuses it) ...
    seen = []

    def prepare(hp, context):
        seen.append(context.lam)
        return context

    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match=r"feature 's_floor' has a prepare at the stage 'algorithm', which is "
                            r"wrap-only.* 0\.4\.0 will refuse it"):
        fjp.register_feature(dataclasses.replace(_floor_feature("algorithm"), prepare=prepare))
    config = _stage_config()
    config.algorithm.s_floor = 0.05
    fjp.build_task(config)
    assert seen == [0.0]
    # ... what changes T there is silently wrong today: refused now.
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning, match="wrap-only"):
        fjp.register_feature(_mixing_feature(stage="algorithm"))
    config = _stage_config()
    config.algorithm.mix_uniform = 0.5
    assert "declare Feature(..., stage='target')" in _refused(config, tmp_path)


def test_a_deprecation_is_one_warning_line_at_the_launchers(capsys):
    # The mains show a FedjaxPalsDeprecationWarning (the one above, raised while the config
    # file imports the user's module) as one `warning:` line, like their `error:` lines.
    import warnings

    from experiments import flags as flags_lib

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        flags_lib._deprecations_as_lines()
        fjp.deprecation.warn("feature 'x' has a prepare at the stage 'algorithm'.",
                             refused_in="0.4.0")
    err = capsys.readouterr().err
    assert err.startswith("warning: feature 'x' has a prepare at the stage 'algorithm'. "
                          "fedjax_pals 0.4.0 will refuse it (CHANGELOG.md). ("), err
    assert err.count("\n") == 1, err


def _ordered_feature(name, stage="target", after=()):
    return registry.Feature(name, name, fjp.Hyperparameters, lambda values, facts: {},
                            stage=stage, after=after)


def test_after_orders_features_of_a_stage_registered_in_the_other_order(
    features_restored, registries_restored
):
    fjp.register_feature(_ordered_feature("second", after=("first",)))
    fjp.register_feature(_ordered_feature("first"))
    fjp.register_feature(_ordered_feature("third"))
    names = [f.name for f in registry.registered_features()]
    # Only what after= declares moves: the others keep their registration order.
    assert [name for name in names if name in ("first", "second", "third")] == [
        "first", "second", "third"]
    assert names.index("perturbed_target") < names.index("unknown_target") < names.index(
        "first")
    # A feature of an earlier stage is after it anyway.
    fjp.register_feature(_ordered_feature("late", stage="lambda", after=("first",)))


def test_after_naming_an_unknown_feature_is_refused_when_the_order_is_computed(
    features_restored, registries_restored
):
    config = _synthetic()
    # Allowed at registration (the module of the one it names may be imported later) ...
    fjp.register_feature(_ordered_feature("early", stage="lambda", after=("adaptive_lamda",)))
    # ... refused when a run's features are ordered: every config check.
    with pytest.raises(ValueError, match=r"feature 'early': after=\('adaptive_lamda',\) names "
                       r"'adaptive_lamda', which no registered feature is \(did you mean "
                       r"'adaptive_lambda'\?\)"):
        registry.registered_features()
    with pytest.raises(fjp.ConfigError, match="which no registered feature is"):
        fjp.validate_config(config)


def test_after_making_a_cycle_or_naming_a_later_stage_is_refused_at_registration(
    features_restored, registries_restored
):
    fjp.register_feature(_ordered_feature("a", after=("b",)))
    with pytest.raises(ValueError, match=r"features \['a', 'b'\]: their after= make a cycle "
                       r"\('(a|b)' after '(a|b)' after '(a|b)'\)"):
        fjp.register_feature(_ordered_feature("b", after=("a",)))
    assert "b" not in registry._FEATURES
    with pytest.raises(ValueError, match=r"feature 'c' \(stage 'target'\): after names "
                       r"'fedpals_lambda', whose stage 'lambda' runs later"):
        fjp.register_feature(_ordered_feature("c", after=("fedpals_lambda",)))
    with pytest.raises(ValueError, match="after names the feature itself"):
        _ordered_feature("d", after=("d",))
    with pytest.raises(ValueError, match="after must be a tuple of feature names"):
        _ordered_feature("d", after="first")


def test_fedpals_lambda_declares_it_runs_after_adaptive_lambda_whatever_the_registration_order(
    features_restored, registries_restored
):
    # fedpals_lambda reads adaptive_lambda's lam_floor: declared, not left to import order.
    lam_feature, adaptive = registry._FEATURES["fedpals_lambda"], registry._FEATURES[
        "adaptive_lambda"]
    assert lam_feature.after == ("adaptive_lambda",)
    for name in ("fedpals_lambda", "adaptive_lambda"):
        del registry._FEATURES[name]
    fjp.register_feature(lam_feature)  # first, this time
    fjp.register_feature(adaptive)
    names = [f.name for f in registry.registered_features()]
    assert names.index("adaptive_lambda") < names.index("fedpals_lambda")
    # lam = 0 with the hypergradient schedule starts at the lower end of the ESS range (the
    # floor adaptive_lambda sets), not at 0, where log-lambda could not move.
    from fedjax_pals.server_weights import LOG10_LAM_RANGE

    config = _stage_config("fedpals_adaptive")
    config.algorithm.lam = 0.0
    task = fjp.build_task(config)
    n = float(np.sum(task.partition.client_sizes))
    np.testing.assert_allclose(task.context.lam, n * 10.0 ** LOG10_LAM_RANGE[0], rtol=1e-12)


def test_an_own_server_update_not_declared_warns_and_runs(registries_restored, tmp_path):
    # Written for the interface before owns_server_update: it still runs, with a warning
    # naming the fix, for one minor version (CHANGELOG.md).
    average = fjp.weighted_average_update()

    def halved(state, participants, outputs, weights):
        deltas = jax.tree_util.tree_map(lambda d: 0.5 * d, outputs.deltas)
        return average(state, participants, outputs._replace(deltas=deltas), weights)

    fjp.register_method(fjp.Method(
        "undeclared", "U", lambda hp, c: fjp.fedavg()._replace(server_update=halved)))
    config = _synthetic()
    config.algorithm.name = "undeclared"
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match=r"method 'undeclared'.*owns_server_update=True.* 0\.3\.0"):
        task = fjp.build_task(config)
    assert task.algorithm.server_update is halved


def test_a_user_method_that_lends_its_weights_combines_with_every_client_side_method(
    registries_restored
):
    # lends_weighting is generic: "<client-side>_<lender>" keys and algorithm.weights both.
    def inverse_size(hp, context):
        def weights(label_dists, sizes, state, participants):
            return (1.0 / sizes) / jnp.sum(1.0 / sizes)

        return fjp.fedavg()._replace(weighting=fjp.Weighting("inverse", lambda: (), weights))

    fjp.register_method(fjp.Method("inverse_size", "InvSize", inverse_size, lends_weighting=True))
    keys = registry.method_keys()
    for method in registry.client_side_methods():
        assert f"{method}_inverse_size" in keys and f"{method}_fedpals" in keys
    assert fjp.method_label("fedprox_inverse_size") == "FedProx+InvSize"
    for how in ({"name": "fedprox_inverse_size"}, {"name": "fedprox", "weights": "inverse_size"}):
        config = _synthetic()
        for key, value in how.items():
            config.algorithm[key] = value
        resolved = fjp.validate_config(config)
        assert (resolved.algorithm.name, resolved.algorithm.weights) == ("fedprox", "inverse_size")
        assert resolved.algorithm.lam is None  # FedPALS' lambda is FedPALS' alone
        task = fjp.build_task(resolved)
        assert task.algorithm.name == "fedprox_inverse_size"
        sizes = np.asarray(task.partition.client_sizes, np.float64)
        alpha = fjp.experiment.task.server_weights(task)
        np.testing.assert_allclose(alpha, (1 / sizes) / np.sum(1 / sizes), rtol=1e-6)
    with pytest.raises(ValueError, match="only the client-side methods"):
        registry.method_overrides("scaffold_inverse_size")


@pytest.mark.parametrize("change, message", [
    (lambda s: s._replace(params=jax.tree_util.tree_map(lambda p: p.astype(jnp.float16), s.params)),
     r"a state whose params\[.*\] has shape .* float16 where the state it was given has .* "
     r"float32"),
    (lambda s: s._replace(params={"extra": jnp.zeros(2), **s.params}),
     r"a state whose params\['extra'\] is new"),
    (lambda s: s.params, r"dict, not a fedjax_pals.ServerState"),
])
def test_a_feature_s_update_state_of_another_structure_is_one_error_naming_it(
    features_restored, tmp_path, change, message
):
    @dataclasses.dataclass(frozen=True)
    class Nudge(fjp.Hyperparameters):
        nudge: bool | None = fjp.hyperparameter(None, kind="bool", optional=True)

    class NudgeMonitor(fjp.Monitor):
        def update_state(self, round_index, state_of):
            return change(state_of()) if round_index == 1 else None

    fjp.register_feature(fjp.Feature(
        "nudge", "Nudge", Nudge, lambda values, facts: dict(values), stage="algorithm",
        monitor=lambda hp, task: NudgeMonitor()))
    config = _synthetic()
    config.training.rounds = 2
    config.algorithm.nudge = True
    with pytest.raises(ValueError, match=r"feature 'nudge': its Monitor.update_state returned "
                       + message + r".*\(before round 2\)") as raised:
        fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert "\n" not in str(raised.value)


def test_a_loader_returning_an_empty_split_is_refused_as_empty(no_training, tmp_path):
    def load():
        x, y = np.zeros((0, _FIT_DIM), np.float32), np.zeros(0, np.int32)
        rng = np.random.default_rng(0)
        test = fjp.LabeledSplit(rng.normal(size=(100, _FIT_DIM)).astype(np.float32),
                                (np.arange(100) % _FIT_CLASSES).astype(np.int32))
        return fjp.Dataset("empty_blobs", fjp.LabeledSplit(x, y), test, _FIT_CLASSES, "test")

    fjp.register_dataset("empty_blobs", load, num_classes=_FIT_CLASSES, num_train=1000,
                         images=False)
    message = _refused(_fit_config("empty_blobs"), tmp_path)
    # Not "register it with num_train=0", which register_dataset refuses.
    assert message == ("data set 'empty_blobs': its loader returned an empty train split; a run "
                       "needs examples to train on and a target to test on.")


def test_a_client_side_method_with_fedpals_weights_takes_fedpals_own_keys():
    # fedprox_fedpals' weights are FedPALS': its weights_solver applies (it was resolved to
    # None and the exact solver ran, silently).
    import importlib

    fedpals_lib = importlib.import_module("fedjax_pals.algorithms.fedpals")

    config = {"dataset": {"name": "synthetic"}, "training": {"rounds": 1},
              "algorithm": {"name": "fedprox_fedpals", "weights_solver": "projected_gradient"}}
    resolved = fjp.validate_config(config)
    assert resolved.algorithm.weights_solver == "projected_gradient"
    task = fjp.build_task(resolved)
    assert task.algorithm.weighting.weights is fedpals_lib._fedpals_weights_with(
        "projected_gradient")
    plain = fjp.build_task({**config, "algorithm": {"name": "fedprox_fedpals"}})
    assert plain.algorithm.weighting.weights is not task.algorithm.weighting.weights
    # FedAvg's weights borrow nothing: the key resolves to None there.
    fedprox = fjp.validate_config({**config, "algorithm": {
        "name": "fedprox", "weights_solver": "projected_gradient"}})
    assert fedprox.algorithm.weights_solver is None


# -- typed context slots -----------------------------------------------------------------------

_BUDGET = fjp.ContextSlot("test_budget", stage="label_marginals", kind=float,
                          doc="a user's quantity written at label_marginals")


@dataclasses.dataclass(frozen=True)
class _Budget(fjp.Hyperparameters):
    test_budget: float | None = fjp.hyperparameter(None, low=0.0, optional=True)


def _budget_feature(stage, slot=_BUDGET, name="test_budget"):
    return fjp.Feature(
        name, "budget", _Budget,
        lambda values, facts: {"test_budget": values["test_budget"]},
        prepare=lambda hp, context: context.with_value(slot, float(hp.test_budget)),
        stage=stage,
    )


def _budget_config(value):
    config = _synthetic()
    config.algorithm.test_budget = value
    return config


def test_a_slot_written_at_its_stage_is_what_later_hooks_and_the_task_read(features_restored):
    fjp.register_feature(_budget_feature("label_marginals"))
    value = float(np.random.default_rng().uniform(0.1, 9.0))
    task = fjp.build_task(_budget_config(value))
    assert task.context.get(_BUDGET) == value
    assert fjp.build_task(_synthetic()).context.get(_BUDGET) is None


def test_a_feature_writing_a_slot_of_another_stage_is_refused_naming_the_slots_stage(
    features_restored, no_training, tmp_path
):
    fjp.register_feature(_budget_feature("lambda"))
    message = _refused(_budget_config(1.0), tmp_path)
    assert "feature 'test_budget' at the stage 'lambda': its prepare wrote the context slot " \
        "'test_budget', which the stage 'label_marginals' writes" in message
    assert message.endswith("declare Feature(..., stage='label_marginals').")


def test_fedpals_lambda_is_written_only_at_the_lambda_stage(features_restored, no_training,
                                                            tmp_path):
    from fedjax_pals.algorithms.fedpals_lambda import LAMBDA

    fjp.register_feature(_budget_feature("target", slot=LAMBDA))
    message = _refused(_budget_config(3.0), tmp_path)
    assert "wrote the context slot 'fedpals_lambda', which the stage 'lambda' writes" in message


def test_a_slot_refuses_a_value_of_another_kind_and_a_second_slot_of_its_name():
    with pytest.raises(ValueError, match=r"context slot 'test_budget' holds float, got str"):
        fjp.MethodContext().with_value(_BUDGET, "much")
    with pytest.raises(ValueError, match=r"two context slots are named 'test_budget'"):
        fjp.ContextSlot("test_budget", stage="target", kind=float)
    with pytest.raises(ValueError, match=r"stage 'algorithm' is not a stage that prepares"):
        fjp.ContextSlot("test_wrap_only", stage="algorithm", kind=float)


def test_the_legacy_lam_field_mirrors_fedpals_lambdas_slot_both_ways():
    from fedjax_pals.algorithms.fedpals_lambda import LAMBDA

    # lam = 0 (the projection of T onto Conv(S)) is a value, not "unset".
    built = fjp.MethodContext(None, 0.0)
    assert built.get(LAMBDA) == 0.0 and built.lam == 0.0
    written = fjp.MethodContext().with_value(LAMBDA, 2.5)
    assert written.lam == 2.5
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match=r"replace\(lam=\.\.\.\) is deprecated.*with_value.*0\.4\.0"):
        replaced = written.replace(lam=0.5)
    assert replaced.get(LAMBDA) == 0.5 and replaced.lam == 0.5


def test_a_legacy_feature_setting_lam_still_sets_fedpals_lambda(features_restored):
    # A user's feature from before slots: context.replace(lam=...) at the lambda stage, after
    # fedpals_lambda. It warns, and FedPALS' weights use its lambda.
    value = float(np.random.default_rng().uniform(0.5, 5.0))
    fjp.register_feature(fjp.Feature(
        "test_budget", "budget", _Budget,
        lambda values, facts: {"test_budget": values["test_budget"]},
        prepare=lambda hp, context: context.replace(lam=hp.test_budget),
        stage="lambda", after=("fedpals_lambda",),
    ))
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning, match=r"replace\(lam="):
        task = fjp.build_task(_budget_config(value))
    from fedjax_pals.algorithms.fedpals import FedPalsState

    state = fjp.init_server_state(task.algorithm, task.model.init(jax.random.PRNGKey(0)), 2)
    lam = fjp.algorithms.base.find_state(state.weighting_state, FedPalsState).lam
    np.testing.assert_allclose(float(lam), value, rtol=1e-6)


# -- declarations that replace the experiment layer's lists --------------------------------------


@dataclasses.dataclass(frozen=True)
class _TwoWays(fjp.Hyperparameters):
    test_rate: float | None = fjp.hyperparameter(
        None, low=0.0, optional=True, shown=True, axis="test_speed", label="rate r")
    test_period: float | None = fjp.hyperparameter(
        None, low=0.0, low_open=True, optional=True, axis="test_speed")


def test_declared_shown_axis_and_label_are_what_the_registry_reports(features_restored):
    assert registry.hyperparameter_axes()["lambda"] == ("algorithm.lam", "algorithm.ess_fraction")
    assert {"algorithm.lam", "algorithm.ess_fraction"} <= set(registry.shown_hyperparameters())
    fjp.register_feature(fjp.Feature(
        "test_two_ways", "two ways", _TwoWays, lambda values, facts: dict(values),
        stage="algorithm",
        grid={"test_rate": (0.5,), "test_period": (2.0, 4.0)}))
    assert registry.hyperparameter_axes()["test_speed"] == (
        "algorithm.test_rate", "algorithm.test_period")
    assert "algorithm.test_rate" in registry.shown_hyperparameters()
    assert "algorithm.test_period" not in registry.shown_hyperparameters()
    assert registry.hyperparameter_labels()["test_rate"] == "rate r"
    from fedjax_pals.experiment import plots

    assert plots.axis_label("algorithm.test_rate") == "rate r"
    assert plots.axis_label("algorithm.lam") == "λ"
    # A feature's grid is in the protocol's, after no method's and before every method's.
    grid = registry.protocol_grids()
    assert grid["test_period"] == (2.0, 4.0) and grid["ess_fraction"] == (0.1, 0.25, 0.5, 0.75)
    assert fjp.protocol_grid().algorithm.test_rate == (0.5,)


def test_a_feature_grid_outside_its_hyperparameters_is_refused():
    with pytest.raises(ValueError, match=r"feature 'test_two_ways': grid key 'speed' is not one"):
        fjp.Feature("test_two_ways", "two ways", _TwoWays, lambda values, facts: dict(values),
                    stage="algorithm",
                    grid={"speed": (1.0,)})


def test_the_keys_declared_identity_when_unset_are_those_of_before_the_registry():
    # The digests of runs recorded before the registry depend on exactly these (None) keys.
    assert set(registry.identity_when_unset()) == {
        f"algorithm.{key}" for key in ("prox_mu", "server_lr", "afl_step", "fedrs_alpha",
                                       "fedrs_soft", "lam", "ess_fraction",
                                       "target_perturbation")}
