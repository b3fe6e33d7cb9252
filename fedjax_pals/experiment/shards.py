"""Sharded sweeps: one sweep spread over N jobs (and hosts) that share its workdir.

    run_shard(config, workdir, Shard(i, N))   runs the runs of shard i (one job of an array)
    collect_sweep(workdir)                     the protocol's report, once every run has ended

A sweep of hundreds of independent runs is what a cluster's job array is for: N jobs, each
running shard i of N, on whichever hosts the scheduler picks, all writing into one workdir on a
shared file system; then one collect job. The pieces:

* **The split** is a pure function of the expanded sweep and N (`assign_shards`): no hashing of
  Python objects, no clock, no randomness, so every process computes the same split. Shards are
  disjoint and cover every run. Runs that share one compiled program (`structure_group_key`:
  they differ only in what the engine holds per run, e.g. seed or lambda) stay together, in
  blocks of at most `MAX_RUNS_PER_PROGRAM`, unless keeping them together would unbalance the
  shards; a block split across shards costs one more compile, nothing else. Shards are balanced
  by an estimate of each run's cost (`run_cost`), not by run count.
* **The plan** (`<workdir>/shards/plan.json`): the first shard to start records the sweep
  config, N and each run's shard; every later shard checks its own config and N against it
  before anything trains, and refuses naming the keys that differ. The split is therefore fixed
  once per workdir even if a later version of this code would split differently.
* **Shard records** (`<workdir>/shards/shard-<i>-of-<N>.json`): host, pid, times and every run's
  status, rewritten as each run ends; `collect_sweep` names where a missing run lives.
* **Locks**: shard i holds `<workdir>/shards/shard-<i>-of-<N>.lock` (a `locks.Lease`, which
  holds between hosts of an NFS file system), so a second job on the same shard is refused in
  one line; a killed shard's lease is taken over by the next job of that shard (at once on the
  same host, after the lease's lifetime on another). Correctness does not rest on the locks:
  shards never share a run.
* **Resuming**: a shard command run again skips its finished runs and resumes the others from
  their checkpoints, exactly as an unsharded sweep does (the same `execute_sweep_runs`).

The collected table is the unsharded sweep's table: the same runs, the same protocol.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import heapq
import json
import math
import os
import re
import socket
import tempfile
from typing import Any, Mapping, Sequence

from fedjax_pals.data import registered_datasets
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import locks
from fedjax_pals.experiment import sweep as sweep_lib
from fedjax_pals.experiment.train import (
    MAX_RUNS_PER_PROGRAM,
    program_blocks,
    structure_group_key,
)
from fedjax_pals.experiment.workdir import write_json
from fedjax_pals.runtime import is_main_process

ConfigError = config_lib.ConfigError

PLAN_FORMAT = 1
# The shards' balance goal: the largest shard's estimated cost at most this times the mean.
# Blocks of runs that share a program are split (halved) only until it holds.
BALANCE = 1.10
# Per-example training cost of the built-in models relative to LeNet (forward + backward
# FLOPs on a 28x28x1 input: LeNet about 1.1 MFLOP; logistic regression on the synthetic task's
# 2 features and 3 classes about 36 FLOP). A model not listed counts as LeNet: within one
# sweep the model is nearly always one, and then only the other factors matter.
MODEL_COST = {"lenet": 1.0, "lenet_nobias": 1.0, "logistic_regression": 3e-5}
# How long a starting shard waits for `<workdir>/.sweep.lease`, which other shards hold only for
# the moment they check the plan (an unsharded sweep holds it while it runs).
PLAN_LOCK_WAIT_SECONDS = 30.0
# Run statuses with which a run has ended for good (the protocol counts it as not eligible).
TERMINAL_FAILURES = ("diverged", "unreachable")


class ShardError(ValueError):
    """A shard specification that cannot be used (the message says why)."""


class NoSweepError(ConfigError):
    """The workdir holds no sweep to collect."""


class SweepIncompleteError(RuntimeError):
    """Some runs of the sweep have not ended; the message names them and their shards."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0 <= index < count)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        for name in ("index", "count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShardError(f"a shard's {name} must be an integer, got {value!r}.")
        if self.count < 1:
            raise ShardError(f"a sweep is split into at least 1 shard, got {self.count}.")
        if not 0 <= self.index < self.count:
            raise ShardError(
                f"shard {self.index}/{self.count}: the index must be in [0, {self.count - 1}]."
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def stem(self) -> str:
        """File name stem of the shard's lock and record: shard-<i>-of-<N>."""
        return f"shard-{self.index}-of-{self.count}"


# -- which shard: the command line and the schedulers ----------------------------------------

# The schedulers whose array jobs `--shard=auto` understands (`scheduler_shard`).
SCHEDULERS = (
    "Slurm (SLURM_ARRAY_TASK_ID/_COUNT/_MIN/_STEP)",
    "Grid Engine: SGE, UGE, OGE (SGE_TASK_ID/_FIRST/_LAST/_STEPSIZE)",
)


def _int_env(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ShardError(f"shard 'auto': {name}={text!r} is not an integer.") from None


def _from_array(
    environ: Mapping[str, str], scheduler: str, task_id: str, first: int, step: int, count: int
) -> Shard:
    task = _int_env(environ, task_id)
    offset = task - first
    if step < 1 or offset < 0 or offset % step or offset // step >= count:
        raise ShardError(
            f"shard 'auto': {scheduler}'s array task {task} is not one of {count} tasks from "
            f"{first} in steps of {step}; give the shard as <index>/<count>."
        )
    return Shard(offset // step, count)


def scheduler_shard(environ: Mapping[str, str] | None = None) -> Shard | None:
    """The shard of this array task, from the scheduler's environment; None outside an array.

    Slurm: (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP of
    SLURM_ARRAY_TASK_COUNT, so `--array=0-7` and `--array=1-8` both give shards 0..7 of 8.
    Grid Engine (SGE, UGE, OGE; `qsub -t first-last:step`): likewise from SGE_TASK_ID,
    SGE_TASK_FIRST, SGE_TASK_LAST and SGE_TASK_STEPSIZE.
    """
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_ARRAY_TASK_ID") not in (None, ""):
        return _from_array(
            environ,
            "Slurm",
            "SLURM_ARRAY_TASK_ID",
            _int_env(environ, "SLURM_ARRAY_TASK_MIN", 0),
            _int_env(environ, "SLURM_ARRAY_TASK_STEP", 1),
            _int_env(environ, "SLURM_ARRAY_TASK_COUNT"),
        )
    if environ.get("SGE_TASK_ID") not in (None, "", "undefined"):
        first = _int_env(environ, "SGE_TASK_FIRST")
        step = _int_env(environ, "SGE_TASK_STEPSIZE", 1)
        last = _int_env(environ, "SGE_TASK_LAST")
        return _from_array(
            environ, "Grid Engine", "SGE_TASK_ID", first, step, (last - first) // max(step, 1) + 1
        )
    return None


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """`"i/N"` (shard i of N, 0-based) or `"auto"` (from the scheduler's array environment).

    Raises:
      ShardError: one line saying what is wrong with `text`.
    """
    text = str(text).strip()
    if text == "auto":
        shard = scheduler_shard(environ)
        if shard is None:
            raise ShardError(
                "shard 'auto': this is not a task of an array job (none of SLURM_ARRAY_TASK_ID, "
                "SGE_TASK_ID is set); give the shard as <index>/<count>."
            )
        return shard
    match = re.fullmatch(r"(-?\d+)\s*/\s*(-?\d+)", text)
    if not match:
        raise ShardError(f"shard {text!r} is not <index>/<count> (e.g. 0/8, 0-based) or 'auto'.")
    return Shard(int(match.group(1)), int(match.group(2)))


# -- the split ---------------------------------------------------------------------------------


def run_cost(resolved: Mapping[str, Any]) -> float:
    """A run's estimated training cost, in LeNet client-steps:

        rounds x participants per round x local steps per client x model's cost per step

    with local steps = local_epochs x ceil(examples per client / batch_size), examples per
    client = the data set's training examples / num_clients (its registered size; 1 local step
    per epoch for a data set of unknown size). Only ratios between runs matter.
    """
    training = resolved["training"]
    clients = max(int(resolved["partition"]["num_clients"] or 1), 1)
    dataset = registered_datasets().get(resolved["dataset"]["name"])
    examples = None if dataset is None else dataset.num_train
    batches = 1 if not examples else math.ceil(examples / clients / training["batch_size"])
    participants = training.get("clients_per_round") or max(clients - 1, 1)
    steps = training["local_epochs"] * batches
    model = MODEL_COST.get(resolved.get("model"), 1.0)
    return float(training["rounds"] * participants * steps * model)


def _lpt(atoms: Sequence[Sequence[int]], costs: Sequence[float], count: int):
    """Longest-processing-time-first list scheduling: each block of runs, costliest first, to
    the least loaded shard (ties to the lower index)."""
    weight = [sum(costs[i] for i in atom) for atom in atoms]
    heap = [(0.0, shard) for shard in range(count)]
    owner = [0] * len(atoms)
    for a in sorted(range(len(atoms)), key=lambda a: (-weight[a], atoms[a][0])):
        load, shard = heapq.heappop(heap)
        owner[a] = shard
        heapq.heappush(heap, (load + weight[a], shard))
    return [load for load, _ in sorted(heap, key=lambda entry: entry[1])], owner


def assign_shards(
    runs: Sequence[sweep_lib.SweepRun],
    count: int,
    *,
    max_runs_per_program: int = MAX_RUNS_PER_PROGRAM,
) -> tuple[int, ...]:
    """Each run's shard (in [0, count)): a pure function of the runs and `count`.

    Runs of one structure group (`structure_group_key`) form equal blocks of up to
    `max_runs_per_program` runs in sweep order (`train.program_blocks`: the engine trains a
    block as one program); blocks go to shards by LPT on their estimated cost (`run_cost`).
    While the largest shard exceeds BALANCE x the mean and some block has more than one run, the
    costliest such block is halved and the split redone, so groups stay whole wherever that
    costs no balance.
    """
    Shard(0, count)  # validates count
    costs = [run_cost(run.resolved) for run in runs]
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(structure_group_key(run.resolved), []).append(i)
    block = max_runs_per_program if count < len(runs) else 1  # else one run a shard at most
    atoms = [atom for members in groups.values() for atom in program_blocks(members, block)]
    if not atoms:
        return ()
    mean = sum(costs) / count
    while True:
        loads, owner = _lpt(atoms, costs, count)
        splittable = [a for a in range(len(atoms)) if len(atoms[a]) > 1]
        if max(loads) <= BALANCE * mean or not splittable:
            break
        worst = max(splittable, key=lambda a: (sum(costs[i] for i in atoms[a]), -atoms[a][0]))
        atom = atoms[worst]
        half = len(atom) // 2
        atoms[worst : worst + 1] = [atom[:half], atom[half:]]
    shard_of = {i: owner[a] for a, atom in enumerate(atoms) for i in atom}
    return tuple(shard_of[i] for i in range(len(runs)))


def split_sweep(config: Any, count: int) -> list[tuple[str, int, float]]:
    """(run name, shard, estimated cost) of every run of the sweep `config` split into `count`
    shards, in sweep order (what `--list --shard=i/N` shows). Reads no data."""
    runs = sweep_lib.expand(config).runs
    return [
        (run.name, shard, run_cost(run.resolved))
        for run, shard in zip(runs, assign_shards(runs, count))
    ]


# -- the plan ------------------------------------------------------------------------------------


def shards_dir(workdir: str) -> str:
    return os.path.join(workdir, sweep_lib.SHARDS_DIR)


def plan_path(workdir: str) -> str:
    return os.path.join(workdir, sweep_lib.SHARD_PLAN)


def record_path(workdir: str, shard: Shard) -> str:
    return os.path.join(shards_dir(workdir), f"{shard.stem}.json")


def _comparable(config: Any) -> dict[str, Any]:
    """The sweep config as JSON values, without the keys that do not change what runs (engine,
    data location): shards may run on different machines."""
    plain = json.loads(json.dumps(config_lib.as_dict(config), default=str))
    flat = config_lib.flatten(plain)
    return {
        key: value
        for key, value in flat.items()
        if not any(key == k or key.startswith(f"{k}.") for k in config_lib.NON_IDENTITY_KEYS)
    }


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}.") from None
    return value if isinstance(value, dict) else None


def read_plan(workdir: str) -> dict | None:
    """The workdir's recorded split (plan.json), or None when there is none.

    Raises:
      ConfigError: a plan.json that cannot be read or is not a plan (naming the remedy:
        --reshard replaces it).
    """
    path = plan_path(workdir)
    remedy = "--reshard (reshard=True) replaces it once none of the sweep's shards runs"
    try:
        plan = _read_json(path)
    except ConfigError as error:
        raise ConfigError(f"{error} {remedy[0].upper()}{remedy[1:]}.") from None
    if plan is None and not os.path.exists(path):
        return None
    runs = plan.get("runs") if isinstance(plan, dict) else None
    shards = plan.get("shards") if isinstance(plan, dict) else None
    if (
        not isinstance(plan, dict)
        or not isinstance(plan.get("config"), dict)
        or isinstance(shards, bool) or not isinstance(shards, int) or shards < 1
        or not isinstance(runs, list)
        or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                   and isinstance(r.get("shard"), int) and 0 <= r["shard"] < shards for r in runs)
    ):
        raise ConfigError(f"{path} is damaged (not a plan of this package's shards); {remedy}.")
    return plan


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def make_plan(config: Any, runs: Sequence[sweep_lib.SweepRun], count: int) -> dict[str, Any]:
    """The plan of `config`'s runs split into `count` shards (what plan.json records)."""
    assignment = assign_shards(runs, count)
    return {
        "format": PLAN_FORMAT,
        "shards": count,
        "config": json.loads(json.dumps(config_lib.as_dict(config), default=str)),
        "runs": [
            {"name": run.name, "shard": shard, "cost": run_cost(run.resolved)}
            for run, shard in zip(runs, assignment)
        ],
        "created": _now(),
        "created_by": locks.holder_text(),
    }


def _publish_plan(workdir: str, plan: Mapping[str, Any], *, replace: bool) -> dict:
    """Writes plan.json unless one exists (link(2): atomic on NFS too); returns the plan that
    is recorded afterwards (ours, or the one another shard wrote first)."""
    directory = shards_dir(workdir)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(plan, f, indent=1)
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, plan_path(workdir))
            return dict(plan)
        try:
            os.link(tmp, plan_path(workdir))
            return dict(plan)
        except OSError as error:
            if error.errno != errno.EEXIST:
                raise
        return read_plan(workdir)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _check_plan(
    plan: Mapping[str, Any], config: Any, runs: Sequence[sweep_lib.SweepRun], workdir: str
) -> None:
    """Refuses (ConfigError) a config that is not the recorded one, naming the keys."""
    recorded, given = _comparable(plan.get("config", {})), _comparable(config)
    differences = [
        f"{key}: {recorded.get(key, '<absent>')!r} (recorded) vs {given.get(key, '<absent>')!r}"
        for key in sorted(set(recorded) | set(given))
        if recorded.get(key, "<absent>") != given.get(key, "<absent>")
    ]
    if differences:
        more = f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""
        raise ConfigError(
            f"the sweep in {workdir} was split with another config ({plan_path(workdir)}); "
            f"differing keys: {'; '.join(differences[:4])}{more}. Use the recorded config, "
            "another workdir, or --reshard once none of its shards runs."
        )
    names = [r.get("name") for r in plan.get("runs", [])]
    if names != [run.name for run in runs]:
        raise ConfigError(
            f"{plan_path(workdir)} lists other runs than this config expands into (written by "
            "another version of fedjax_pals?); use --reshard once none of its shards runs."
        )


def _plan_for(
    config: Any,
    runs: Sequence[sweep_lib.SweepRun],
    workdir: str,
    shard: Shard,
    *,
    reshard: bool,
    origin: str = "",
    task_id: str | None = None,
) -> dict:
    """The recorded plan, made now if there is none, checked against this shard's config and N.

    `origin`: where the shard came from, for the refusal; `task_id`: the scheduler's array task
    of a `--shard=auto` (a one-index resubmission's task is the shard to run).

    Holds `<workdir>/.sweep.lease` while it looks, so that it never races an unsharded sweep
    (which holds it throughout) or another shard's first write.
    """
    sweep_lock = locks.Lease(
        os.path.join(workdir, sweep_lib.SWEEP_LOCK_FILE),
        f"the sweep workdir {os.path.abspath(workdir)} (an unsharded sweep runs in it)",
    ).acquire(wait_seconds=PLAN_LOCK_WAIT_SECONDS)
    try:
        plan = None if reshard else read_plan(workdir)  # --reshard replaces even a damaged one
        if plan is None:
            plan = _publish_plan(workdir, make_plan(config, runs, shard.count), replace=reshard)
        _check_plan(plan, config, runs, workdir)
        count = plan.get("shards")
        if count != shard.count:
            task = task_id or ""
            index = task if task.isdigit() and int(task) < count else "<index>"
            raise ConfigError(
                f"the sweep in {workdir} is split into {count} shards ({plan_path(workdir)}), "
                f"but this is shard {shard}{origin}; run --shard={index}/{count}, or --reshard "
                "once none of its shards runs."
            )
        return plan
    finally:
        sweep_lock.release()


# -- running a shard ---------------------------------------------------------------------------


class _Record:
    """The shard's record file, rewritten as each of its runs ends."""

    def __init__(self, workdir: str, shard: Shard, names: Sequence[str]):
        self.path = record_path(workdir, shard)
        self.data = {
            "shard": str(shard),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": _now(),
            "updated": _now(),
            "state": "running",
            "runs": {name: "pending" for name in names},
            "errors": {},
        }
        self.write()

    def write(self) -> None:
        self.data["updated"] = _now()
        if is_main_process():
            write_json(self.path, self.data)

    def run_ended(self, name: str, status: str, error: str | None) -> None:
        self.data["runs"][name] = status
        if error:
            self.data["errors"][name] = error
        else:
            self.data["errors"].pop(name, None)
        self.write()

    def end(self, state: str) -> None:
        self.data["state"] = state
        self.write()


def run_shard(
    config: Any,
    workdir: str,
    shard: Shard | str,
    *,
    quiet: bool = False,
    overwrite: bool = False,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    reshard: bool = False,
) -> dict[str, Any]:
    """Runs shard `shard` ("i/N", "auto" or a Shard) of the sweep `config` in `workdir`.

    Validates every run, takes the shard's lease (a second job on the same shard is refused:
    WorkdirLockedError), records or checks the split (ConfigError naming the keys when this
    config or N is not the recorded one), then trains this shard's runs that have not
    finished, each resuming from its checkpoints, recording each run's status as it ends. No
    report: `collect_sweep` writes it once every shard has ended. `reshard`: replace the
    recorded split by this config's and N (only when none of its shards runs).
    `mlflow_tracking_uri` and `mlflow_experiment` as in `run_sweep`.

    Returns:
      {"shard": "i/N", "runs": {name: status} of this shard's runs, "errors": {name: message},
        "total_runs": runs in the sweep, "files": {"record": path}}.
    """
    origin, task_id = "", None
    if isinstance(shard, str):
        if shard.strip() == "auto":
            task_id = os.environ.get("SLURM_ARRAY_TASK_ID")
            # A one-index resubmission (sbatch --array=3) reports a count of 1: say so.
            seen = [
                f"{key}={os.environ[key]}"
                for key in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")
                if key in os.environ
            ]
            origin = f" (from {', '.join(seen) or 'the scheduler array environment'})"
        shard = parse_shard(shard)
    workdir = sweep_lib.sweep_workdir(workdir)
    expanded = sweep_lib.expand(config)
    runs = list(expanded.runs)
    sweep_lib.check_workdir(workdir)
    lease = None
    if is_main_process():
        os.makedirs(shards_dir(workdir), exist_ok=True)
        lease = locks.Lease(
            os.path.join(shards_dir(workdir), f"{shard.stem}.lock"),
            f"shard {shard} of the sweep in {os.path.abspath(workdir)}",
        ).acquire()
    record = None
    try:
        plan = _plan_for(
            config, runs, workdir, shard, reshard=reshard, origin=origin, task_id=task_id
        )
        expanded.record_imports(workdir)
        # Only this shard's runs are read and checked: the others are their shards' business.
        mine = [run for run, entry in zip(runs, plan["runs"]) if entry["shard"] == shard.index]
        previous = sweep_lib.previous_results(mine, workdir, overwrite=overwrite)
        record = _Record(workdir, shard, [run.name for run in mine])
        status, errors, _ = sweep_lib.execute_sweep_runs(
            mine,
            previous,
            workdir,
            quiet=quiet,
            overwrite=overwrite,
            mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_experiment=mlflow_experiment,
            on_status=record.run_ended,
        )
        record.end("finished")
        return {
            "shard": str(shard),
            "runs": {run.name: status[run.name] for run in mine},
            "errors": errors,
            "total_runs": len(runs),
            "files": {"record": record.path},
        }
    except BaseException:
        if record is not None:
            record.end("interrupted")
        raise
    finally:
        if lease is not None:
            lease.release()


# -- collecting --------------------------------------------------------------------------------


def _recorded_config(workdir: str) -> tuple[dict, dict | None]:
    """(the sweep config recorded in the workdir, its plan or None)."""
    plan = read_plan(workdir)
    if plan is not None:
        return plan["config"], plan
    unsharded = _read_json(os.path.join(workdir, "sweep.json"))
    if unsharded is not None:
        return unsharded, None
    raise NoSweepError(
        f"{workdir} holds no sweep to collect (neither {sweep_lib.SHARD_PLAN} nor sweep.json); "
        "give the workdir the shards ran in."
    )


def _recorded_statuses(workdir: str, count: int) -> dict[str, tuple[str, str]]:
    """{run name: (status, shard)} from the shard records (the latest record wins)."""
    found: dict[str, tuple[str, str, str]] = {}
    for index in range(count):
        data = _read_json(record_path(workdir, Shard(index, count))) or {}
        for name, status in (data.get("runs") or {}).items():
            when = data.get("updated", "")
            if name not in found or when >= found[name][2]:
                found[name] = (status, f"{index}/{count}", when)
    return {name: (status, shard) for name, (status, shard, _) in found.items()}


def collect_sweep(
    workdir: str, config: Any | None = None, *, allow_partial: bool = False
) -> dict[str, Any]:
    """The protocol's report (table.md, table.json, comparison.png, figures) of the sweep in
    `workdir`, from every run's results.json: the table an unsharded `run_sweep` writes.

    `config` (optional) must be the recorded sweep config. A run has ended when its
    results.json holds its config's last round, or when its shard recorded it as diverged or
    unreachable (outcomes of a grid, as in `run_sweep`).

    Raises:
      NoSweepError: the workdir holds no sweep.
      ConfigError: `config` is not the recorded one (naming the keys).
      SweepIncompleteError: some runs have not ended (naming them, their shards and statuses),
        unless `allow_partial`; the table then says it is partial and lists them.
    """
    workdir = sweep_lib.sweep_workdir(workdir)
    recorded, plan = _recorded_config(workdir)
    sweep_lib.import_recorded_modules(workdir)
    expanded = sweep_lib.expand(recorded)
    runs, sweep = list(expanded.runs), expanded.settings
    if config is not None:
        check = plan or {"config": recorded, "runs": [{"name": r.name} for r in runs]}
        _check_plan(check, config, runs, workdir)
    count = plan["shards"] if plan else 0
    shard_of = {e["name"]: e["shard"] for e in plan["runs"]} if plan else {}
    recorded_status = _recorded_statuses(workdir, count)  # {} without a plan (count 0)
    status: dict[str, str] = {}
    results_by_run: dict[int, Mapping[str, Any]] = {}
    missing: list[str] = []
    for i, run in enumerate(runs):
        results = sweep_lib.run_results(workdir, run)
        if sweep_lib.is_finished(run, results):
            status[run.name] = "done"
            results_by_run[i] = results
            continue
        state = recorded_status.get(run.name, ("not run", ""))[0]
        if state in TERMINAL_FAILURES:
            status[run.name] = state
        else:
            status[run.name] = state if state in sweep_lib.FAILURE_STATUSES else "missing"
            missing.append(run.name)
    if missing and not allow_partial:
        lines = []
        for name in missing[:10]:
            where = f"shard {shard_of[name]}/{count}" if name in shard_of else "no shard"
            lines.append(f"{name} ({where}: {recorded_status.get(name, ('not run',))[0]})")
        more = f", and {len(missing) - 10} more" if len(missing) > 10 else ""
        shards = sorted({shard_of[n] for n in missing if n in shard_of})
        rerun = " Run the sweep again,"
        if shards:
            rerun = f" Run shard(s) {', '.join(f'{s}/{count}' for s in shards)} again (the same "
            rerun += "command resumes them),"
        raise SweepIncompleteError(
            f"{len(missing)} of {len(runs)} runs of the sweep in {workdir} have not ended: "
            f"{'; '.join(lines)}{more}.{rerun} or collect with --allow_partial."
        )
    report = sweep_lib.write_report(workdir, runs, sweep, status, results_by_run, missing=missing)
    return {"runs": status, "missing": missing, **report}
