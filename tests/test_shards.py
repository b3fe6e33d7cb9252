"""Sharded sweeps: the split, the plan and shard records, collect, the command line's bad input."""

import glob
import json
import os
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import locks
from fedjax_pals.experiment import shards as shards_lib
from fedjax_pals.experiment import sweep as sweep_lib
from fedjax_pals.experiment.train import structure_group_key
from config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_config(seeds=(0, 1, 2, 3), methods=("fedavg", "fedpals"), rates=(0.05, 0.1)):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.sweep = ml_collections.ConfigDict(
        dict(seeds=seeds, methods=methods, grid=dict(training=dict(learning_rate=rates)))
    )
    return config


def _loads(runs, assignment, count):
    costs = [shards_lib.run_cost(run.resolved) for run in runs]
    return [sum(c for c, s in zip(costs, assignment) if s == k) for k in range(count)]


# -- the split ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def table1_runs():
    runs, _ = sweep_lib._runs(load_config("table1_fmnist_c3.py"))
    return runs


@pytest.mark.parametrize("count", [1, 2, 3, 8, 17, 2000])
def test_the_split_gives_every_run_exactly_one_shard_in_range(table1_runs, count):
    assignment = fjp.assign_shards(table1_runs, count)
    assert len(assignment) == len(table1_runs)
    assert all(0 <= s < count for s in assignment)
    # Every shard gets work while there are at least as many runs as shards.
    assert len(set(assignment)) == min(count, len(table1_runs))
    listed = shards_lib.split_sweep(load_config("table1_fmnist_c3.py"), count)
    assert [(n, s) for n, s, _ in listed] == [
        (run.name, s) for run, s in zip(table1_runs, assignment)
    ]


def test_the_table1_split_into_8_shards_is_balanced_by_cost(table1_runs):
    loads = _loads(table1_runs, fjp.assign_shards(table1_runs, 8), 8)
    assert max(loads) <= 1.5 * np.mean(loads)
    assert max(loads) <= shards_lib.BALANCE * np.mean(loads)


def test_the_split_balances_cost_not_run_count():
    # Runs of 8 rounds cost 4x runs of 2: a count-balanced split of these 16 runs in 2 shards
    # would give one shard 4 long runs and the other 4 long runs... unless it splits by count.
    config = _sweep_config(seeds=(0, 1, 2, 3), methods=("fedavg",), rates=(0.05,))
    config.sweep.axes = ml_collections.ConfigDict(dict(training=dict(rounds=(2, 2, 2, 8))))
    runs, _ = sweep_lib._runs(config)
    assignment = fjp.assign_shards(runs, 2)
    loads = _loads(runs, assignment, 2)
    assert max(loads) == pytest.approx(np.mean(loads))  # 32 = 4 x 8 rounds, and 12 x 2 + 8
    counts = [assignment.count(k) for k in range(2)]
    assert sorted(counts) != [8, 8]


def test_runs_sharing_a_program_stay_together_where_that_costs_no_balance():
    # 2 methods x 2 learning rates: 4 groups of 4 seeds, equal costs; 4 shards: one group each.
    runs, _ = sweep_lib._runs(_sweep_config())
    assignment = fjp.assign_shards(runs, 4)
    by_group = {}
    for run, shard in zip(runs, assignment):
        by_group.setdefault(structure_group_key(run.resolved), set()).add(shard)
    assert len(by_group) == 4
    assert all(len(shards) == 1 for shards in by_group.values())
    assert sorted(s for shards in by_group.values() for s in shards) == [0, 1, 2, 3]
    # 2 groups on 4 shards: keeping them whole would leave two shards idle; they are split.
    runs, _ = sweep_lib._runs(_sweep_config(methods=("fedavg",)))
    loads = _loads(runs, fjp.assign_shards(runs, 4), 4)
    assert max(loads) == pytest.approx(np.mean(loads))


def test_a_group_larger_than_one_program_is_cut_into_program_sized_blocks():
    runs, _ = sweep_lib._runs(
        _sweep_config(seeds=tuple(range(20)), methods=("fedavg",), rates=(0.05,))
    )
    assignment = fjp.assign_shards(runs, 2, max_runs_per_program=10)
    assert assignment == (0,) * 10 + (1,) * 10


# The per-run state that structure_group_key removed before the label-DP keys joined
# config.per_run_state_keys().
_STATE_KEYS_BEFORE_DP = (
    "seed",
    "algorithm.lam",
    "algorithm.ess_fraction",
    "algorithm.target_perturbation",
)
SWEEP_CONFIGS = sorted(
    name
    for name in (os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "*.py")))
    if "sweep" in load_config(name)
)


def _key_before_dp(resolved):
    plain = config_lib.as_dict(resolved)
    plain.pop("seed", None)
    for key in ("lam", "ess_fraction", "target_perturbation"):
        plain.get("algorithm", {}).pop(key, None)
    return json.dumps(plain, sort_keys=True, default=str)


def _partition(indices, key):
    groups = {}
    for i in indices:
        groups.setdefault(key(i), []).append(i)
    return sorted(groups.values())


@pytest.mark.parametrize("name", SWEEP_CONFIGS)
def test_each_sweep_config_groups_as_before_but_for_runs_differing_only_in_the_added_keys(name):
    runs, _ = sweep_lib._runs(load_config(name))
    added = [k for k in config_lib.per_run_state_keys() if k not in _STATE_KEYS_BEFORE_DP]
    assert "algorithm.label_dp_epsilon" in added
    flat = [config_lib.flatten(config_lib.as_dict(run.resolved)) for run in runs]
    new = [structure_group_key(run.resolved) for run in runs]
    old = [_key_before_dp(run.resolved) for run in runs]
    everything = range(len(runs))
    # A group of before lies in one group of now ...
    for members in _partition(everything, old.__getitem__):
        assert len({new[i] for i in members}) == 1
    # ... and a group of now is the groups of before that differ only in the added keys.
    for members in _partition(everything, new.__getitem__):
        assert _partition(members, old.__getitem__) == _partition(
            members, lambda i: json.dumps([flat[i][k] for k in added])
        )
    # The DP release, T's estimator (its settings are read on the host between rounds),
    # FedDisco's a and b (its state's) and DP on updates' C and sigma (its state's) are per-run
    # state, and so is the client that is the target (sweep.each_client): their sweeps' runs
    # share programs they did not share before. (Estimating T with one estimator in a sweep
    # that otherwise has T known, as beyond_loss_reweighting.py's IW-ERM, shares nothing: a run
    # that estimates T and one that does not differ in structure.)
    estimators = {f["algorithm.target_estimation"] for f in flat} - {None}
    shared = len(estimators) > 1 or any(
        f["algorithm.label_dp_epsilon"] is not None
        or f["algorithm.feddisco_a"] is not None or f["algorithm.dp_clip_norm"] is not None
        or f.get("evaluation.client_as_target") is not None
        for f in flat
    )
    before, now = len(set(old)), len(set(new))
    assert now < before if shared else now == before, (before, now)


def test_the_split_is_the_same_in_fresh_processes_with_other_hash_seeds(table1_runs):
    code = (
        "import json, sys, importlib.util\n"
        "from fedjax_pals.experiment import shards\n"
        f"spec = importlib.util.spec_from_file_location('c', {os.path.join(ROOT, 'configs', 'table1_fmnist_c3.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(json.dumps(shards.split_sweep(m.get_config(), 8)))\n"
    )
    # One fresh process whose string hashes differ from this one's: a hash seed other than
    # this process's (random unless PYTHONHASHSEED fixes it; then the child takes another).
    seed = "4242" if os.environ.get("PYTHONHASHSEED") != "4242" else "0"
    env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    output = json.loads(done.stdout)
    here = [[run.name, s] for run, s in zip(table1_runs, fjp.assign_shards(table1_runs, 8))]
    assert [[n, s] for n, s, _ in output] == here
    # All of it (names, shards, costs) as this process splits it.
    split_here = shards_lib.split_sweep(load_config("table1_fmnist_c3.py"), 8)
    assert output == json.loads(json.dumps(split_here))


def test_run_cost_is_rounds_times_participants_times_local_steps():
    config = fjp.default_config()  # Fashion-MNIST, 10 clients (9 train), batch 32, LeNet
    config.training.rounds = 3
    config.training.local_epochs = 2
    resolved = fjp.validate_config(config).to_dict()
    steps = 2 * int(np.ceil(60_000 / 10 / 32))
    assert shards_lib.run_cost(resolved) == 3 * 9 * steps
    config.training.clients_per_round = 4
    assert shards_lib.run_cost(fjp.validate_config(config).to_dict()) == 3 * 4 * steps


# -- which shard ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, match",
    [
        ("3/2", r"index must be in \[0, 1\]"),
        ("0/0", "at least 1 shard"),
        ("-1/4", r"index must be in \[0, 3\]"),
        ("a/b", "is not <index>/<count>"),
        ("1", "is not <index>/<count>"),
        ("", "is not <index>/<count>"),
        ("auto", "not a task of an array job"),
    ],
)
def test_bad_shards_are_refused_in_one_line(text, match):
    with pytest.raises(shards_lib.ShardError, match=match):
        shards_lib.parse_shard(text, environ={})


@pytest.mark.parametrize(
    "environ, shard",
    [
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8"}, (3, 8)),
        (  # --array=1-8
            {"SLURM_ARRAY_TASK_ID": "8", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1"},
            (7, 8),
        ),
        (  # --array=0-14:2
            {
                "SLURM_ARRAY_TASK_ID": "4",
                "SLURM_ARRAY_TASK_COUNT": "8",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_STEP": "2",
            },
            (2, 8),
        ),
        (  # qsub -t 1-4
            {"SGE_TASK_ID": "2", "SGE_TASK_FIRST": "1", "SGE_TASK_LAST": "4"},
            (1, 4),
        ),
    ],
)
def test_auto_reads_the_schedulers_array_task(environ, shard):
    assert shards_lib.parse_shard("auto", environ) == fjp.Shard(*shard)


def test_auto_refuses_an_array_task_outside_its_range():
    environ = {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "8"}
    with pytest.raises(shards_lib.ShardError, match="not one of 8 tasks"):
        shards_lib.parse_shard("auto", environ)
    assert shards_lib.scheduler_shard({"SGE_TASK_ID": "undefined"}) is None


# -- running shards and collecting, with a stand-in for training --------------------------------


class FakeTraining:
    """train_and_evaluate_many writing results.json from a hash of the run; records the calls."""

    def __init__(self, fail=()):
        self.calls = []
        self.fail = set(fail)

    def many(self, configs, workdirs, *, on_done=None, **kwargs):
        outcomes = []
        for index, (config, workdir) in enumerate(zip(configs, workdirs)):
            resolved = fjp.validate_config(config)
            name = os.path.relpath(workdir, os.path.join(os.path.dirname(workdir), "..", ".."))
            self.calls.append(workdir)
            rng = np.random.default_rng([resolved.seed, int(1000 * resolved.training.learning_rate)])
            if any(workdir.endswith(f) for f in self.fail):
                outcome = RuntimeError(f"boom in {name}")
            else:
                rounds = list(range(1, resolved.training.rounds + 1))
                val = rng.uniform(size=len(rounds)).tolist()
                outcome = {
                    "config": resolved.to_dict(),
                    "config_digest": fjp.config_digest(resolved),
                    "rounds": rounds,
                    "val_accuracy": val,
                    "target_accuracy": rng.uniform(size=len(rounds)).tolist(),
                    "target_macro_f1": rng.uniform(size=len(rounds)).tolist(),
                    "best_val_round": rounds[int(np.argmax(val))],
                    "projection_distance": 0.0,
                }
                os.makedirs(workdir, exist_ok=True)
                with open(os.path.join(workdir, "results.json"), "w") as f:
                    json.dump(outcome, f)
            outcomes.append(outcome)
            if on_done is not None:
                on_done(index, outcome)
        return outcomes

    def install(self, monkeypatch):
        monkeypatch.setattr(fjp.experiment.train, "train_and_evaluate_many", self.many)
        return self


def _without_times(table):
    return json.loads(json.dumps(table, sort_keys=True))


def test_shards_then_collect_write_the_unsharded_table(tmp_path, monkeypatch):
    FakeTraining().install(monkeypatch)
    config = _sweep_config()
    whole = fjp.run_sweep(config, str(tmp_path / "whole"), quiet=True)
    fake = FakeTraining().install(monkeypatch)
    ran = set()
    for index in range(3):
        summary = fjp.run_shard(config, str(tmp_path / "sharded"), f"{index}/3", quiet=True)
        assert not ran & set(summary["runs"])  # disjoint
        ran |= set(summary["runs"])
        assert set(summary["runs"].values()) == {"done"}
    assert ran == set(whole["runs"]) and len(fake.calls) == 16
    collected = fjp.collect_sweep(str(tmp_path / "sharded"))
    assert _without_times(collected["table"]) == _without_times(whole["table"])
    with open(tmp_path / "sharded" / "table.json") as f, open(tmp_path / "whole" / "table.json") as g:
        assert json.load(f) == json.load(g)
    record = json.loads((tmp_path / "sharded" / "shards" / "shard-1-of-3.json").read_text())
    assert record["state"] == "finished" and record["shard"] == "1/3"
    assert set(record["runs"].values()) == {"done"} and record["pid"] == os.getpid()
    # Run again, a shard skips its finished runs.
    again = fjp.run_shard(config, str(tmp_path / "sharded"), "0/3", quiet=True)
    assert set(again["runs"].values()) == {"skipped"} and len(fake.calls) == 16


def test_collect_names_missing_runs_and_their_shards_or_writes_a_partial_table(
    tmp_path, monkeypatch
):
    FakeTraining(fail=("fedpals/learning_rate=0.1/seed_2",)).install(monkeypatch)
    config = _sweep_config()
    workdir = str(tmp_path)
    fjp.run_shard(config, workdir, "0/2", quiet=True)
    plan = shards_lib.read_plan(workdir)
    shard_of = {entry["name"]: entry["shard"] for entry in plan["runs"]}
    with pytest.raises(shards_lib.SweepIncompleteError) as info:
        fjp.collect_sweep(workdir)
    message = str(info.value)
    not_run = [n for n, s in shard_of.items() if s == 1]
    assert f"{len(not_run) + (shard_of['fedpals/learning_rate=0.1/seed_2'] == 0)} of 16 runs" in message
    assert "shard 1/2: not run" in message and "Run shard(s)" in message
    assert not os.path.exists(os.path.join(workdir, "table.json"))
    partial = fjp.collect_sweep(workdir, allow_partial=True)
    assert partial["table"]["runs"]["partial"] is True
    assert set(partial["table"]["runs"]["missing"]) == set(partial["missing"])
    assert partial["table"]["title"].startswith("PARTIAL")
    fjp.run_shard(config, workdir, "1/2", quiet=True)
    with pytest.raises(shards_lib.SweepIncompleteError, match=r"seed_2 \(shard \d/2: failed\)"):
        fjp.collect_sweep(workdir)


def test_a_shard_with_another_config_or_count_is_refused_before_anything_trains(
    tmp_path, monkeypatch
):
    fake = FakeTraining().install(monkeypatch)
    workdir = str(tmp_path)
    fjp.run_shard(_sweep_config(), workdir, "0/2", quiet=True)
    calls = len(fake.calls)
    other = _sweep_config()
    other.training.rounds = 3
    other.sweep.seeds = (0, 1)
    with pytest.raises(fjp.ConfigError) as info:
        fjp.run_shard(other, workdir, "1/2", quiet=True)
    assert "training.rounds: 2 (recorded) vs 3" in str(info.value)
    assert "sweep.seeds" in str(info.value)
    with pytest.raises(fjp.ConfigError, match="split into 2 shards .* this is shard 1/3"):
        fjp.run_shard(_sweep_config(), workdir, "1/3", quiet=True)
    with pytest.raises(fjp.ConfigError, match="is split into shards"):
        fjp.run_sweep(_sweep_config(), workdir, quiet=True)
    assert len(fake.calls) == calls
    # The engine is not part of what runs: a shard on another machine may choose its own.
    gpu = _sweep_config()
    gpu.engine.backend = "vmap_steps"
    fjp.run_shard(gpu, workdir, "1/2", quiet=True)
    assert fjp.collect_sweep(workdir)["table"] is not None
    # --reshard replaces the split.
    resplit = fjp.run_shard(_sweep_config(seeds=(0, 1)), workdir, "0/1", quiet=True, reshard=True)
    assert len(resplit["runs"]) == 8 and set(resplit["runs"].values()) == {"skipped"}
    assert shards_lib.read_plan(workdir)["shards"] == 1


def test_a_one_index_resubmission_with_auto_is_refused_naming_the_shard_to_run(
    tmp_path, monkeypatch
):
    fake = FakeTraining().install(monkeypatch)
    fjp.run_shard(_sweep_config(), str(tmp_path), "0/4", quiet=True)
    # sbatch --array=3 of a sweep split into 4: Slurm says task 3 of an array of 1.
    for key, value in dict(
        SLURM_ARRAY_TASK_ID="3", SLURM_ARRAY_TASK_COUNT="1", SLURM_ARRAY_TASK_MIN="3"
    ).items():
        monkeypatch.setenv(key, value)
    calls = len(fake.calls)
    with pytest.raises(fjp.ConfigError) as info:
        fjp.run_shard(_sweep_config(), str(tmp_path), "auto", quiet=True)
    message = str(info.value)
    assert "split into 4 shards" in message and "this is shard 0/1" in message
    assert "SLURM_ARRAY_TASK_COUNT=1" in message and "run --shard=3/4" in message
    assert len(fake.calls) == calls


def test_a_second_job_on_the_same_shard_is_refused_at_once_naming_the_holder(
    tmp_path, monkeypatch
):
    fake = FakeTraining().install(monkeypatch)
    workdir = str(tmp_path)
    os.makedirs(tmp_path / "shards")
    lease = locks.Lease(str(tmp_path / "shards" / "shard-1-of-2.lock"), "test").acquire()
    try:
        start = time.perf_counter()
        with pytest.raises(fjp.WorkdirLockedError) as info:
            fjp.run_shard(_sweep_config(), workdir, "1/2", quiet=True)
        assert time.perf_counter() - start < 5.0
        assert f"process {os.getpid()} on " in str(info.value)
        assert "shard 1/2 of the sweep" in str(info.value)
        assert fake.calls == []
        # The other shard is free.
        assert len(fjp.run_shard(_sweep_config(), workdir, "0/2", quiet=True)["runs"]) == 8
    finally:
        lease.release()
    assert len(fjp.run_shard(_sweep_config(), workdir, "1/2", quiet=True)["runs"]) == 8


def test_collect_refuses_a_workdir_without_a_sweep_and_another_config(tmp_path, monkeypatch):
    with pytest.raises(shards_lib.NoSweepError, match="holds no sweep"):
        fjp.collect_sweep(str(tmp_path))
    FakeTraining().install(monkeypatch)
    fjp.run_sweep(_sweep_config(), str(tmp_path), quiet=True)  # unsharded: sweep.json
    assert fjp.collect_sweep(str(tmp_path))["table"] is not None
    other = _sweep_config(seeds=(0, 1))
    with pytest.raises(fjp.ConfigError, match="sweep.seeds"):
        fjp.collect_sweep(str(tmp_path), other)


# -- the command line ----------------------------------------------------------------------------


def _sweep_main(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.sweep", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SGE_"))},
            "JAX_PLATFORMS": "cpu",
        },
    )


@pytest.mark.parametrize(
    "args, match",
    [
        (["--shard=3/2"], "index must be in"),
        (["--shard=0/0"], "at least 1 shard"),
        (["--shard=-1/4"], "index must be in"),
        (["--shard=a/b"], "is not <index>/<count>"),
        (["--shard=auto"], "not a task of an array job"),
        (["--shard=0/2", "--collect"], "do not go together"),
        (["--collect"], "holds no sweep"),
        (["--allow_partial"], "applies to --collect only"),
        (["--collect", "--reshard"], "--collect reads the split as it is"),
    ],
)
def test_the_sweep_command_refuses_bad_shard_input_in_one_line(tmp_path, args, match):
    done = _sweep_main(
        f"--config={os.path.join(ROOT, 'configs', 'demo.py')}", f"--workdir={tmp_path}", *args
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], lines
    assert not os.path.exists(tmp_path / "runs")  # nothing ran, no data read


def test_the_sweep_command_lists_a_shards_runs(tmp_path):
    done = _sweep_main(f"--config={os.path.join(ROOT, 'configs', 'demo.py')}", "--list", "--shard=1/2")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("shard 1/2: 2 of 4 runs, 50.0 %")
    assert all("(cost " in line for line in lines[:-1]) and len(lines) == 3


# -- end to end: concurrent shard processes on one workdir ---------------------------------------


def _synthetic_sweep_file(tmp_path):
    path = tmp_path / "sweep_config.py"
    path.write_text(
        "import ml_collections\n"
        "import fedjax_pals as fjp\n\n\n"
        "def get_config():\n"
        "    config = fjp.default_config()\n"
        "    config.dataset.name = 'synthetic'\n"
        "    config.training.rounds = 6\n"
        "    config.training.batch_size = 8\n"
        "    config.sweep = ml_collections.ConfigDict(dict(\n"
        "        seeds=(0, 1, 2, 3), methods=('fedavg', 'fedpals'),\n"
        "        grid=dict(training=dict(learning_rate=(0.05, 0.1))), figures=('curves',)))\n"
        "    return config\n"
    )
    return str(path)


def _start_shard(config_file, workdir, shard):
    return subprocess.Popen(
        [
            sys.executable, "-m", "experiments.sweep", f"--config={config_file}",
            f"--workdir={workdir}", f"--shard={shard}", "--quiet",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _has_a_checkpoint(workdir, names):
    for name in names:
        directory = os.path.join(workdir, "runs", name, "checkpoints")
        if os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory)):
            return True
    return False


@pytest.mark.integration
def test_four_concurrent_shards_one_killed_and_rerun_collect_the_unsharded_table(tmp_path):
    config_file = _synthetic_sweep_file(tmp_path)
    sharded = str(tmp_path / "sharded")
    processes = {i: _start_shard(config_file, sharded, f"{i}/4") for i in range(4)}
    try:
        # Shard 0 is SIGKILLed mid-run: once one of its runs has a checkpoint.
        deadline = time.monotonic() + 600
        victim = None
        while time.monotonic() < deadline:
            plan = shards_lib.read_plan(sharded) if os.path.exists(shards_lib.plan_path(sharded)) else None
            if plan is not None:
                victim = [e["name"] for e in plan["runs"] if e["shard"] == 0]
                if _has_a_checkpoint(sharded, victim):
                    break
            assert processes[0].poll() is None, processes[0].communicate()[0][-3000:]
            time.sleep(0.05)
        record = json.loads((tmp_path / "sharded" / "shards" / "shard-0-of-4.json").read_text())
        assert record["state"] == "running"
        processes[0].kill()
        processes[0].wait()
        for i in (1, 2, 3):
            output, _ = processes[i].communicate(timeout=900)
            assert processes[i].returncode == 0, output[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    # Collect refuses: shard 0's runs have not all ended.
    with pytest.raises(shards_lib.SweepIncompleteError, match="shard 0/4"):
        fjp.collect_sweep(sharded)
    rerun = _start_shard(config_file, sharded, "0/4")
    output, _ = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, output[-3000:]
    assert "shard 0/4:" in output
    collected = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", f"--workdir={sharded}", "--collect", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert collected.returncode == 0, collected.stderr[-3000:]
    # The unsharded sweep of the same config, in this process.
    whole = fjp.run_sweep(load_config(config_file), str(tmp_path / "whole"), quiet=True)
    assert set(whole["runs"].values()) == {"done"}
    with open(os.path.join(sharded, "table.json")) as f:
        table = json.load(f)
    with open(tmp_path / "whole" / "table.json") as f:
        assert table == json.load(f)
    # The killed shard's runs resumed from their checkpoints: every round once in their metrics.
    for name in victim:
        with open(os.path.join(sharded, "runs", name, "results.json")) as f:
            assert json.load(f)["rounds"] == list(range(1, 7))


@pytest.mark.parametrize("text", ["[]", "{", '{"shards": 2}', '{"shards": 2, "runs": 5, "config": {}}',
                                  '{"shards": 2, "runs": [{"name": "x", "shard": 7}], "config": {}}'])
def test_a_damaged_plan_is_one_error_and_reshard_replaces_it(tmp_path, text, monkeypatch):
    workdir = tmp_path / "w"
    (workdir / "shards").mkdir(parents=True)
    (workdir / "shards" / "plan.json").write_text(text)
    config = _sweep_config(seeds=(0,), rates=(0.05,))
    for damaged in (lambda: shards_lib.read_plan(str(workdir)),
                    lambda: fjp.run_shard(config, str(workdir), "0/2", quiet=True),
                    lambda: fjp.collect_sweep(str(workdir))):
        with pytest.raises(fjp.ConfigError, match=r"plan.json.*--reshard \(reshard=True\) "
                           r"replaces it once none of the sweep's shards runs") as raised:
            damaged()
        assert "\n" not in str(raised.value)
    # --reshard replaces it (nothing trains here: the runs are the shard's business).
    monkeypatch.setattr(
        sweep_lib, "execute_sweep_runs",
        lambda runs, previous, *a, **k: ({r.name: "done" for r in runs}, {}, {}),
    )
    fjp.run_shard(config, str(workdir), "0/2", quiet=True, reshard=True)
    plan = shards_lib.read_plan(str(workdir))
    assert plan["shards"] == 2 and len(plan["runs"]) == 2


def test_a_workdir_with_dot_dot_makes_nothing_outside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(
        sweep_lib, "execute_sweep_runs",
        lambda runs, previous, *a, **k: ({r.name: "done" for r in runs}, {}, {}),
    )
    config = _sweep_config(seeds=(0,), rates=(0.05,))
    config.sweep.protocol = False
    fjp.run_shard(config, str(tmp_path / "nope" / ".." / "sharded"), "0/2", quiet=True)
    fjp.run_sweep(config, str(tmp_path / "nope2" / ".." / "whole"), quiet=True)
    assert sorted(os.listdir(tmp_path)) == ["sharded", "whole"]
