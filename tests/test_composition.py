"""The composition matrix: a user's modules through every path the package offers.

One user module (written below into a project directory outside the package, as a user's own)
registers one extension of each kind: a method with its own server update, a client-side
method (run with FedPALS' weights as `mx_prox_fedpals`), a feature at the `target` stage, a
data set that comes with its clients (`client_ids`, partition scheme `natural`), a
partition scheme, a personalisation, a link of the server chain (a feature's `link`) and a
client sampler. One sweep config spans them (2 rows x 3 methods: every kind is in some
run), and every path runs it: `experiments.run` and a run extended by more rounds,
`experiments.sweep`, shards and a `--collect` by workdir alone from another directory,
`experiments.submit --cluster=local` and on Slurm where one runs (CI starts one),
`restore_run(...).evaluate()` in a fresh process, and a 2-process launch. Each path's runs
must equal the same run trained alone in this process (within float32 summation order:
`LOSS_RTOL`); a restored model evaluates to the accuracy its run recorded, and an extended
run keeps its first rounds bit for bit.

The built-in label-shift methods of `configs/beyond_loss_reweighting.py` (IW-ERM with T
estimated, IW-ERM and FedVLS with FedPALS' weights) run through `experiments.run`, a sweep and
shards + collect, each run equal to itself trained alone.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals import extensions, models, personalization, sampling
from fedjax_pals.algorithms import registry
from fedjax_pals.data import datasets as datasets_lib
from fedjax_pals.data import partitions as partitions_lib
from fedjax_pals.experiment import sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_MODULE = '''
"""One extension of each kind (tests/test_composition.py)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_pals as fjp

# -- a method with its own server update: the average, scaled by mx_server_scale
@dataclasses.dataclass(frozen=True)
class Scaled(fjp.Hyperparameters):
    mx_server_scale: float = fjp.hyperparameter(0.5, low=0.0, low_open=True)

def build_scaled(hp, context):
    average = fjp.weighted_average_update()
    def update(state, participants, outputs, weights):
        deltas = jax.tree_util.tree_map(lambda d: hp.mx_server_scale * d, outputs.deltas)
        return average(state, participants, outputs._replace(deltas=deltas), weights)
    return fjp.fedavg()._replace(server_update=update)

fjp.register_method(fjp.Method("mx_scaled", "Scaled", build_scaled, Scaled,
                               owns_server_update=True), replace=True)

# -- a client-side method: FedProx's local objective under its own key
@dataclasses.dataclass(frozen=True)
class Prox(fjp.Hyperparameters):
    mx_mu: float = fjp.hyperparameter(0.1, low=0.0)

def build_prox(hp, context):
    weighting = context.weighting or fjp.fedavg().weighting
    return fjp.combine(fjp.algorithms.fedprox_client(hp.mx_mu), weighting, "mx_prox")

fjp.register_method(fjp.Method("mx_prox", "MxProx", build_prox, Prox, client_side=True),
                    replace=True)

# -- a feature at the target stage: T mixed with the uniform distribution
@dataclasses.dataclass(frozen=True)
class Mix(fjp.Hyperparameters):
    mx_mix: float | None = fjp.hyperparameter(None, low=0.0, high=1.0, optional=True,
                                              per_run=True)

def mix(hp, context):
    t = np.asarray(context.partition.target_label_dist, np.float64)
    t = (1 - hp.mx_mix) * t + hp.mx_mix / t.size
    return context.replace(partition=dataclasses.replace(context.partition, target_label_dist=t))

fjp.register_feature(fjp.Feature(
    "mx_mix", "mixed T", Mix,
    lambda values, facts: {"mx_mix": values["mx_mix"] if facts.reads_target else None},
    prepare=mix, stage="target"), replace=True)

# -- data sets: 4 Gaussian classes in 8 dimensions; the second comes with 5 clients, each
# holding mostly two classes
K, DIM, IDS = 4, 8, 5

def _blobs(name, with_ids):
    def load():
        rng = np.random.default_rng(7)
        means = rng.normal(scale=2.0, size=(K, DIM))
        def split(n):
            y = rng.integers(0, K, size=n).astype(np.int32)
            return fjp.LabeledSplit((means[y] + rng.normal(size=(n, DIM))).astype(np.float32), y)
        train, test = split(1200), split(1200)
        ids = None
        if with_ids:
            ids = (train.y + rng.integers(0, 2, size=len(train.y)) * 2 + np.arange(len(train.y))
                   % 2) % IDS
        return fjp.Dataset(name, train, test, K, source="composition test", client_ids=ids)
    fjp.register_dataset(name, load, num_classes=K, num_train=1200, images=False,
                         num_client_ids=IDS if with_ids else None, replace=True)

_blobs("mx_blobs", False)
_blobs("mx_grouped", True)

# -- a partition scheme: equal shares of every class to the training clients; the target
# holds mx_target_class and the next class
@dataclasses.dataclass(frozen=True)
class TwoClassTarget(fjp.Hyperparameters):
    mx_target_class: int = fjp.hyperparameter(0, kind="integer", low=0)

def two_class_target(values, context):
    train, test, k = context.dataset.train.y, context.dataset.test.y, context.dataset.num_classes
    counts = np.zeros((context.num_clients, k), np.int64)
    for i in range(context.num_clients - 1):
        counts[i, [i % k, (i + 1) % k]] = 80
    counts[-1, [values.mx_target_class, (values.mx_target_class + 1) % k]] = 60
    return fjp.partition_from_label_counts(train, test, counts, seed=context.seed,
                                           description="two-class target", num_classes=k)

fjp.register_partition(fjp.Partition("mx_two_class", two_class_target, TwoClassTarget),
                       replace=True)

# -- a personalisation: two fine-tuning steps at half the run's learning rate, or none
def half_step(context):
    return fjp.fine_tune(context.apply_fn, context.global_params, *context.data,
                         learning_rates=(context.learning_rate / 2,), steps=(0, 2),
                         batch_size=context.batch_size, key=context.key)

fjp.register_personalization(fjp.Personalization("mx_half_step", half_step, "+ half step"),
                             replace=True)

# -- a link of the server chain: the updates damped by mx_damp before the step
@dataclasses.dataclass(frozen=True)
class Damp(fjp.ServerLink):
    slot = "transform"
    factor: float = 1.0

    def __call__(self, state, updates):
        deltas = jax.tree_util.tree_map(lambda d: self.factor * d, updates.deltas)
        return updates._replace(deltas=deltas), state

@dataclasses.dataclass(frozen=True)
class DampHyperparameters(fjp.Hyperparameters):
    mx_damp: float | None = fjp.hyperparameter(None, low=0.0, optional=True)

fjp.register_feature(fjp.Feature(
    "mx_damp", "damped updates", DampHyperparameters,
    lambda values, facts: {"mx_damp": None if facts.method.owns_server_update
                           else values["mx_damp"]},
    link=lambda hp, context: Damp(hp.mx_damp), stage="algorithm"), replace=True)

# -- a client sampler: the training clients in a fixed cycle, clients_per_round a round
@dataclasses.dataclass(frozen=True)
class Cycle(fjp.ClientSampler):
    clients_per_round: int
    name = "mx_cycle"

    def lanes(self, num_clients):
        return self.clients_per_round

    def draw(self, seed, round_index, num_clients):
        first = round_index * self.clients_per_round + seed
        return np.sort((first + np.arange(self.clients_per_round)) % num_clients).astype(
            np.int32)

fjp.register_client_sampler(
    "mx_cycle", lambda training, num_clients: Cycle(training["clients_per_round"]),
    replace=True)
'''

SWEEP_CONFIG = '''
import ml_collections
import fedjax_pals as fjp
import mx_ext  # noqa: F401  (registers the extensions)

def get_config():
    config = fjp.default_config()
    config.dataset.name = "mx_blobs"
    config.partition.scheme = "mx_two_class"
    config.partition.num_clients = 5
    config.partition.target_client = 4
    config.model = "logistic_regression"
    config.algorithm.lam = 0.0
    config.training.rounds = 2
    config.training.batch_size = 32
    config.training.learning_rate = 0.2
    config.evaluation.personalization = ("mx_half_step",)
    config.training.client_sampling = "mx_cycle"
    config.training.clients_per_round = 3
    config.sweep = ml_collections.ConfigDict(dict(
        seeds=(0,),
        methods=("mx_scaled", "mx_prox_fedpals", "fedpals"),
        grid=dict(algorithm=dict(mx_mix=(0.3,), mx_damp=(0.9,))),
        axes=dict(dataset=dict(name=("mx_blobs", "mx_grouped")),
                  partition=dict(scheme=("mx_two_class", "natural"))),
        zip_axes=True,
    ))
    return config
'''

# Two runs that hold every kind between them: the own-update method on the user's partition
# scheme, and the client-side method with FedPALS' weights and the feature on the data set
# with its clients (`experiments.run` and an extension by one round, per run).
RUN_CONFIG = '''
import my_sweep

def get_config(which):
    config = my_sweep.get_config()
    del config["sweep"]
    if which == "grouped":
        config.dataset.name, config.partition.scheme = "mx_grouped", "natural"
        config.algorithm.name, config.algorithm.mx_mix = "mx_prox_fedpals", 0.3
        config.algorithm.mx_damp = 0.9
    else:
        config.algorithm.name = "mx_scaled"
    return config
'''

KINDS = {
    "a method with its own server update": lambda r: (
        r["config"]["algorithm"]["name"] == "mx_scaled"),
    "a client-side method with FedPALS' weights": lambda r: (
        (r["config"]["algorithm"]["name"], r["config"]["algorithm"]["weights"])
        == ("mx_prox", "fedpals")),
    "a target-stage feature": lambda r: r["config"]["algorithm"].get("mx_mix") == 0.3,
    "a data set with client_ids under the natural partition": lambda r: (
        r["config"]["partition"]["scheme"] == "natural"),
    "a user partition scheme": lambda r: r["config"]["partition"]["scheme"] == "mx_two_class",
    "a user personalisation": lambda r: (
        tuple(r["config"]["evaluation"]["personalization"] or ()) == ("mx_half_step",)),
    "a user link of the server chain": lambda r: r["config"]["algorithm"].get("mx_damp") == 0.9,
    "a user client sampler": lambda r: r["config"]["training"]["client_sampling"] == "mx_cycle",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's project directory, its modules imported here; unregistered afterwards."""
    directory = tmp_path_factory.mktemp("project")
    (directory / "mx_ext.py").write_text(USER_MODULE)
    (directory / "my_sweep.py").write_text(SWEEP_CONFIG)
    (directory / "my_run.py").write_text(RUN_CONFIG)
    saved = (dict(registry._METHODS), dict(registry._FEATURES), dict(models.MODELS),
             dict(datasets_lib._REGISTERED), dict(partitions_lib._PARTITIONS),
             dict(extensions._REGISTRATIONS), dict(personalization._PERSONALIZATIONS),
             dict(sampling._SAMPLERS))
    sys.path.insert(0, str(directory))
    try:
        import my_sweep  # noqa: F401

        yield directory
    finally:
        sys.path.remove(str(directory))
        for name in ("mx_ext", "my_sweep"):
            sys.modules.pop(name, None)
        live = (registry._METHODS, registry._FEATURES, models.MODELS, datasets_lib._REGISTERED,
                partitions_lib._PARTITIONS, extensions._REGISTRATIONS,
                personalization._PERSONALIZATIONS, sampling._SAMPLERS)
        for registered, before in zip(live, saved):
            registered.clear()
            registered.update(before)


@pytest.fixture(scope="module")
def alone(project, tmp_path_factory):
    """{run name: results} of each run of the sweep trained alone, in this process."""
    import my_sweep

    expanded = sweep_lib.expand(my_sweep.get_config())
    # Every kind is in some run of the sweep.
    for kind, holds in KINDS.items():
        assert any(holds({"config": run.resolved}) for run in expanded.runs), kind
    assert {m.module for m in expanded.imports} == {"mx_ext"}
    root = tmp_path_factory.mktemp("alone")
    return {
        run.name: fjp.train_and_evaluate(run.config, str(root / run.name), quiet=True)
        for run in expanded.runs
    }


def _command(*args, cwd, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT}  # the package under test; the user's cwd first
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def _results(workdir, name=""):
    with open(os.path.join(workdir, name, "results.json")) as f:
        return json.load(f)


# The launchers spread a run's clients over the CPU's devices (--cpu_devices=auto), a
# library call in this process over one: the same float32 sums in another order, ~sqrt(n)
# float32 epsilons apart (n ~ 10^3 terms per loss), not bit for bit.
LOSS_RTOL = 1e-5


def _assert_same_training(got, want):
    assert got["config_digest"] == want["config_digest"]
    assert got["rounds"] == want["rounds"]
    np.testing.assert_allclose(got["train_loss"], want["train_loss"], rtol=LOSS_RTOL)
    assert got["target_accuracy"] == want["target_accuracy"]
    np.testing.assert_allclose(got["alpha"], want["alpha"], atol=1e-6)


def _assert_same_run(got, want):
    _assert_same_training(got, want)
    # The user's personalisation ran on every path (its accuracies are within float32
    # summation order of each other: checked alone against NumPy in test_personalization.py).
    assert set(got["personalization"]) == set(want["personalization"]) == {"mx_half_step"}
    assert len(got["per_client_accuracy"]) == len(want["per_client_accuracy"])


def _assert_sweep_equals_alone(workdir, alone):
    for name, want in alone.items():
        _assert_same_run(_results(workdir, os.path.join("runs", name)), want)
    table = json.loads((workdir / "table.json").read_text())
    assert table["labels"]["mx_prox_fedpals"] == "MxProx+FedPALS"
    assert [set(row["cells"]) for row in table["rows"]] == [
        {"mx_scaled", "mx_prox_fedpals", "fedpals"}] * 2


# -- the paths ----------------------------------------------------------------------------------


def _shards_then_collect(sweep, workdir, *, cwd, collect_cwd):
    """The sweep command as two shards side by side in `cwd`, then `--collect` by workdir alone
    from `collect_cwd`."""
    shards = [subprocess.Popen(
        [sys.executable, *sweep, f"--shard={i}/2"], cwd=cwd,
        env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for shard in shards:
        output, _ = shard.communicate(timeout=600)
        assert shard.returncode == 0, output[-3000:]
        assert f"--workdir={workdir} --collect" in output  # the hint it prints...
    # ... works as printed, from anywhere: the workdir names the modules the sweep imported.
    collect = _command("-m", "experiments.sweep", f"--workdir={workdir}", "--collect",
                       cwd=collect_cwd)
    assert collect.returncode == 0, collect.stderr[-3000:]


PATHS = ("sweep", "shards_and_collect_by_workdir", "submit_local", "submit_slurm",
         "two_processes")


@pytest.mark.integration
@pytest.mark.parametrize("path", PATHS)
def test_a_sweep_of_every_extension_kind_equals_its_runs_alone(path, project, alone, tmp_path):
    workdir = tmp_path / "w"
    sweep = ["-m", "experiments.sweep", "--config=my_sweep.py", f"--workdir={workdir}", "--quiet"]
    if path == "sweep":
        done = _command(*sweep, cwd=project)
        assert done.returncode == 0, done.stderr[-3000:]
    elif path == "shards_and_collect_by_workdir":
        _shards_then_collect(sweep, workdir, cwd=project, collect_cwd=tmp_path)
    elif path == "submit_slurm":  # CI runs a single-node Slurm (scripts/slurm_local.sh)
        from test_submission import _require_slurm, _wait_for_job

        _require_slurm()
        done = _command("-m", "experiments.submit", "--config=my_sweep.py",
                        f"--workdir={workdir}", "--shards=2", "--timeout_min=20", cwd=project)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        words = done.stdout.split()
        _wait_for_job(words[words.index("collect:") + 2])
        assert (workdir / "table.json").exists(), sorted(os.listdir(workdir))
    elif path == "submit_local":
        done = _command("-m", "experiments.submit", "--config=my_sweep.py",
                        f"--workdir={workdir}", "--shards=2", "--cluster=local", cwd=project)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "| MxProx+FedPALS" in done.stdout or "MxProx+FedPALS" in done.stdout
    else:
        done = _command("-m", "fedjax_pals.launch", "--num_processes=2", "--", sys.executable,
                        *sweep, cwd=project)
        assert done.returncode == 0, done.stdout[-3000:]
    _assert_sweep_equals_alone(workdir, alone)
    recorded = extensions.read_imports(str(workdir / sweep_lib.IMPORTS_FILE))
    assert [m.module for m in recorded] == ["mx_ext"]


@pytest.mark.integration
def test_runs_restore_and_extend_in_fresh_processes(project, alone, tmp_path):
    for which in ("two_class", "grouped"):
        workdir = tmp_path / which
        run = ["-m", "experiments.run", f"--config=my_run.py:{which}", f"--workdir={workdir}",
               "--quiet"]
        done = _command(*run, cwd=project)
        assert done.returncode == 0, done.stderr[-3000:]
        results = _results(workdir)
        name = next(n for n, r in alone.items() if r["config_digest"] == results["config_digest"])
        _assert_same_run(results, alone[name])
        # restore_run in a process that never imported the user's module: the run names it.
        script = (
            "import json, sys\nimport fedjax_pals as fjp\n"
            "restored = fjp.restore_run(sys.argv[1], 'last')\n"
            "print(json.dumps(restored.evaluate()))\n"
        )
        restored = _command("-c", script, str(workdir), cwd=tmp_path)
        assert restored.returncode == 0, restored.stderr[-3000:]
        metrics = json.loads(restored.stdout.strip().splitlines()[-1])
        assert metrics["accuracy"] == results["target_accuracy"][-1]
        # One more round on the same workdir: the run is extended, its first rounds kept.
        extended = _command(*run, "--config.training.rounds=3", cwd=project)
        assert extended.returncode == 0, extended.stderr[-3000:]
        longer = _results(workdir)
        assert longer["rounds"] == [1, 2, 3]
        assert longer["train_loss"][:2] == results["train_loss"]
        assert longer["target_accuracy"][:2] == results["target_accuracy"]


# -- the built-in label-shift methods of configs/beyond_loss_reweighting.py ----------------------
#
# IW-ERM with T estimated (a variant the config file registers), IW-ERM's and FedVLS' clients
# with FedPALS' weights: every cell (method x path) equals the same run trained alone here.

LOSS_REWEIGHTING_METHODS = ("iwerm_unknown_t", "iwerm_fedpals", "fedvls_fedpals")
# The config file at a tiny budget, as a user's config beside it: the sweep, or with a method
# the sweep's one run of it (the config file's import registers the variant in every process).
LOSS_REWEIGHTING_TINY = f'''
import importlib.util
import fedjax_pals as fjp

spec = importlib.util.spec_from_file_location(
    "beyond_loss_reweighting", {os.path.join(ROOT, "configs", "beyond_loss_reweighting.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

def get_config(method=None):
    config = module.get_config("3,session")
    config.dataset.name, config.training.rounds, config.training.batch_size = "synthetic", 2, 8
    config.sweep.seeds, config.sweep.figures = (0,), ()
    config.sweep.methods = {LOSS_REWEIGHTING_METHODS!r} if method is None else (method,)
    if method is None:
        return config
    ((_, run),) = fjp.expand_sweep(config)
    return run
'''


@pytest.fixture(scope="module")
def loss_reweighting_project(tmp_path_factory):
    """A directory holding the tiny config as tiny.py."""
    directory = tmp_path_factory.mktemp("loss_reweighting_project")
    (directory / "tiny.py").write_text(LOSS_REWEIGHTING_TINY)
    return directory


@pytest.fixture(scope="module")
def loss_reweighting_alone(loss_reweighting_project, tmp_path_factory):
    """{run name: results} of each of the tiny sweep's runs trained alone, in this process."""
    from config_files import load_config

    expanded = sweep_lib.expand(load_config(loss_reweighting_project / "tiny.py"))
    root = tmp_path_factory.mktemp("loss_reweighting_alone")
    alone = {run.name: fjp.train_and_evaluate(run.config, str(root / run.name), quiet=True)
             for run in expanded.runs}
    assert {name.split("/")[0] for name in alone} == set(LOSS_REWEIGHTING_METHODS)
    return alone


@pytest.mark.integration
@pytest.mark.parametrize("path", ("run", "sweep", "shards_and_collect_by_workdir"))
def test_the_loss_reweighting_methods_compose_through_every_path(
        path, loss_reweighting_project, loss_reweighting_alone, tmp_path):
    project, workdir = loss_reweighting_project, tmp_path / "w"
    sweep = ["-m", "experiments.sweep", "--config=tiny.py", f"--workdir={workdir}", "--quiet"]
    if path == "run":
        for name, want in loss_reweighting_alone.items():
            method = name.split("/")[0]
            done = _command("-m", "experiments.run", f"--config=tiny.py:{method}",
                            f"--workdir={workdir / method}", "--quiet", cwd=project)
            assert done.returncode == 0, done.stderr[-3000:]
            got = _results(workdir / method)
            _assert_same_training(got, want)
            assert got["rounds"] == [1, 2]
        return
    if path == "sweep":
        done = _command(*sweep, cwd=project)
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        _shards_then_collect(sweep, workdir, cwd=project, collect_cwd=tmp_path)
    for name, want in loss_reweighting_alone.items():
        got = _results(workdir, os.path.join("runs", name))
        _assert_same_training(got, want)
        assert got["rounds"] == [1, 2]
    table = json.loads((workdir / "table.json").read_text())
    assert [set(row["cells"]) for row in table["rows"]] == [set(LOSS_REWEIGHTING_METHODS)]
    assert table["labels"]["iwerm_fedpals"] == "IW-ERM+FedPALS"
