r"""Submits a sweep to a cluster: its shards as one job array, then a collect job after them.

  python -m experiments.submit --config=configs/table1_fmnist_c3.py \
      --workdir=/shared/runs/table1_c3 --shards=16 \
      --slurm_partition=gpu --gpus_per_task=1 --timeout_min=240 --array_parallelism=16

Through submitit (`pip install "fedjax_pals[slurm]"`; fedjax_pals/experiment/submission.py):
shard i of N runs `experiments.sweep --shard=i/N`'s work as array task i; the collect job
(`--dependency=afterany:<array>`) writes <workdir>/table.md, table.json and the figures, or
names the runs that did not end. A preempted or timed-out shard is requeued and resumes from
its runs' checkpoints. The workdir must be on a file system every node sees. Prints the job
ids and returns; --wait blocks until the collect has run and prints the table.
--cluster=local runs the same jobs as local processes (and waits), for a try without Slurm.
"""

from __future__ import annotations

import gc
import time

from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_CONFIG = common.define_config_file("config", None, "Sweep config file (configs/*.py).")
_SHARDS = flags.DEFINE_integer("shards", None, "N: array tasks, each running one shard.", lower_bound=1)
_CLUSTER = flags.DEFINE_enum(
    "cluster", "slurm", ["slurm", "local", "debug"], "submitit's executor."
)
_PARTITION = flags.DEFINE_string("slurm_partition", None, "Slurm partition (default: the cluster's).")
_GPUS = flags.DEFINE_integer("gpus_per_task", None, "GPUs of each shard's job.", lower_bound=0)
_CPUS = flags.DEFINE_integer("cpus_per_task", None, "CPU cores of each shard's job.", lower_bound=1)
_MEM = flags.DEFINE_float("mem_gb", None, "Memory of each shard's job, GB.", lower_bound=0.0)
_TIMEOUT = flags.DEFINE_integer(
    "timeout_min", 60, "Time limit of each job, minutes (a shard is requeued at it).", lower_bound=1
)
_PARALLELISM = flags.DEFINE_integer(
    "array_parallelism", None, "At most this many shards at once (Slurm's --array=...%k).", lower_bound=1
)
_SLURM = flags.DEFINE_multi_string(
    "slurm",
    [],
    "Any other sbatch option as key=value (e.g. --slurm=account=myproj --slurm=qos=high): "
    "submitit's slurm_additional_parameters.",
)
_FOLDER = flags.DEFINE_string(
    "submitit_folder", None, "submitit's logs and pickles (default: <workdir>/submitit/<job id>)."
)
_WAIT = flags.DEFINE_boolean("wait", False, "Wait for the collect and print the table.")
_ALLOW_PARTIAL = flags.DEFINE_boolean(
    "allow_partial", False, "The collect writes a table marked partial if some runs did not end."
)
flags.mark_flags_as_required(["config", "shards"])


def _parameters() -> dict:
    extra = {}
    for item in _SLURM.value:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            common.usage_error(f"--slurm={item!r} is not key=value (an sbatch option).")
        extra[key.strip()] = value
    parameters = {"timeout_min": _TIMEOUT.value}
    if _CLUSTER.value == "slurm":
        optional = {
            "slurm_partition": _PARTITION.value,
            "slurm_gpus_per_task": _GPUS.value,
            "cpus_per_task": _CPUS.value,
            "mem_gb": _MEM.value,
            "slurm_array_parallelism": _PARALLELISM.value,
            "slurm_additional_parameters": extra or None,
        }
    else:
        if _PARTITION.value or extra or _PARALLELISM.value:
            common.usage_error(
                "--slurm_partition, --slurm and --array_parallelism need --cluster=slurm."
            )
        optional = {"gpus_per_node": _GPUS.value, "cpus_per_task": _CPUS.value}
    parameters.update({k: v for k, v in optional.items() if v is not None})
    return parameters


def main(argv):
    del argv  # a stray argument is refused by common.run
    if not common.WORKDIR.value:
        common.usage_error("--workdir is required (the sweep's workdir, on a shared file system).")
    workdir = common.WORKDIR.value
    parameters = _parameters()
    started = time.time()
    try:
        submission = fjp.submit_sweep(
            _CONFIG.value,
            workdir,
            shards=_SHARDS.value,
            cluster=_CLUSTER.value,
            folder=_FOLDER.value,
            allow_partial=_ALLOW_PARTIAL.value,
            **parameters,
        )
    except fjp.ConfigError as error:
        common.usage_error(str(error))
    jobs = submission.shard_jobs
    if _CLUSTER.value == "slurm":
        print(
            f"submitted {len(jobs)} shard(s) of {workdir} as array {submission.array_id} "
            f"(slurm): jobs {jobs[0].job_id} .. {jobs[-1].job_id}"
        )
    else:  # no scheduler: processes (or this one), not a job array
        where = "local processes" if _CLUSTER.value == "local" else "this process"
        print(f"submitted {len(jobs)} shard(s) of {workdir} as {where}; waiting for them")
    if submission.collect_job is not None:
        print(f"collect: job {submission.collect_job.job_id} (after the array)")

    def shard_done(index: int, outcome) -> None:
        if isinstance(outcome, BaseException):
            print(f"shard {index}/{len(jobs)}: failed: {' '.join(str(outcome).split())[:300]}")
        else:
            counts: dict[str, int] = {}
            for status in outcome["runs"].values():
                counts[status] = counts.get(status, 0) + 1
            done = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
            print(f"shard {index}/{len(jobs)}: ended ({done})", flush=True)

    if _WAIT.value or _CLUSTER.value != "slurm":
        try:
            summary = submission.wait(on_shard_done=shard_done)
        except (fjp.experiment.shards.SweepIncompleteError, fjp.ConfigError) as error:
            raise SystemExit(f"error: {error}") from None
        if summary.get("markdown"):
            print(f"\n{summary['markdown']}\n")
        common.print_written(workdir, started)
    else:
        print(
            f"when the collect has run: {workdir}/table.md; progress: {workdir}/shards/*.json, "
            f"logs: {fjp.experiment.submission.SUBMITIT_FOLDER}/ in the workdir"
        )
    # submitit's LocalJob objects kill their processes when collected at interpreter exit.
    del submission, jobs
    gc.collect()


def entry() -> None:
    """The `fedjax-pals-submit` command (`python -m experiments.submit`)."""
    common.run(main, takes=common.WRITES)


if __name__ == "__main__":
    entry()
