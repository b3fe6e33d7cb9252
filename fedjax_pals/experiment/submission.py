"""A sweep on a cluster through submitit: its shards as one job array, then a collect job.

    submission = fjp.submit_sweep(config, "/shared/runs/table1", shards=8,
                                  cluster="slurm", slurm_partition="gpu", gpus_per_node=1,
                                  timeout_min=240, slurm_array_parallelism=8)
    submission.shard_jobs[3].job_id   # '<array id>_3'
    submission.wait()                 # optional: the collect's summary once it has run

submitit (`pip install "fedjax_pals[slurm]"`) turns a picklable callable into a Slurm job:
`executor.map_array` submits the N shards (`shards.run_shard`) as one `sbatch --array` job, and
the collect (`shards.collect_sweep`) follows as a job with `--dependency=afterany:<array>`, so
it runs however the shards end and names what is missing if some failed. A shard that Slurm
preempts or that reaches its time limit receives submitit's signal, is requeued
(`ShardJob.checkpoint`) and resumes its runs from their checkpoints. `cluster="local"` runs the
same jobs as local processes (no scheduler: the collect is submitted once the shards have
ended, by `SweepSubmission.wait`), `cluster="debug"` in this process.

The workdir and submitit's folder (default `<workdir>/submitit`, logs and pickles) must be on a
file system that every node sees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
import types
from typing import Any, Callable, Mapping, Sequence

from fedjax_pals import extensions
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import shards as shards_lib
from fedjax_pals.experiment import sweep as sweep_lib

ConfigError = config_lib.ConfigError

SUBMITIT_FOLDER = "submitit"
# How often `SweepSubmission.wait` looks whether a shard's job has ended.
SHARD_POLL_SECONDS = 1.0
# Executors without job dependencies: the collect waits for the shards in `wait`.
_NO_DEPENDENCIES = ("local", "debug")


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError(
            'submitting a sweep needs submitit: pip install "fedjax_pals[slurm]" (or '
            "submitit==1.5.4)."
        ) from None
    return submitit


class ShardJob:
    """The job of one shard: `run_shard(config, workdir, Shard(index, count))`.

    submitit calls `checkpoint` when the job is preempted or about to time out; it returns the
    same call, which submitit requeues: the shard then resumes its runs from their checkpoints.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        workdir: str,
        count: int,
        imports: Sequence[extensions.ExtensionModule] = (),
    ):
        self.config = dict(config)
        self.workdir = workdir
        self.count = count
        self.imports = tuple(imports)  # the user's modules the runs need, imported first

    def __call__(self, index: int) -> dict[str, Any]:
        from fedjax_pals.runtime import configure_runtime

        extensions.import_modules(self.imports)
        configure_runtime(cpu_devices="auto")
        return shards_lib.run_shard(
            self.config, self.workdir, shards_lib.Shard(index, self.count), quiet=True
        )

    def checkpoint(self, index: int):
        return _submitit().helpers.DelayedSubmission(self, index)


class CollectJob:
    """The job that writes the sweep's table once its shards have ended (`collect_sweep`)."""

    def __init__(self, workdir: str, allow_partial: bool = False):
        self.workdir = workdir
        self.allow_partial = allow_partial

    def __call__(self) -> dict[str, Any]:
        summary = shards_lib.collect_sweep(self.workdir, allow_partial=self.allow_partial)
        return {k: summary[k] for k in ("runs", "missing", "markdown", "files")}


@dataclasses.dataclass
class SweepSubmission:
    """The jobs of a submitted sweep: `shard_jobs[i]` runs shard i; `collect_job` writes the
    table (submitted at once where the scheduler has dependencies, else by `wait`)."""

    workdir: str
    shard_jobs: list
    collect_job: Any
    executor: Any
    allow_partial: bool = False

    @property
    def array_id(self) -> str:
        """The scheduler's id of the shards' job array (a Slurm job id)."""
        return _array_id(self.shard_jobs)

    def wait(
        self, on_shard_done: Callable[[int, dict | BaseException], None] | None = None
    ) -> dict[str, Any]:
        """Waits for every shard, then for the collect (submitting it now if the executor has no
        dependencies); returns the collect's summary (`collect_sweep`: runs, missing, markdown,
        files). Raises the collect job's error (e.g. SweepIncompleteError) if it failed.

        `on_shard_done(index, outcome)`: called as each shard's job ends, in the order they
        end, with its summary (`run_shard`'s) or its error."""
        shard_errors = []
        pending = dict(enumerate(self.shard_jobs))
        while pending:
            finished = [i for i, job in pending.items() if job.done()]
            if not finished:
                time.sleep(SHARD_POLL_SECONDS)
                continue
            for index in finished:
                try:
                    outcome = pending.pop(index).result()
                except Exception as error:  # noqa: BLE001 - what the collect reports
                    outcome = _job_error(error)
                    shard_errors.append(outcome)
                if on_shard_done is not None:
                    on_shard_done(index, outcome)
        if self.collect_job is None:
            self.collect_job = self.executor.submit(CollectJob(self.workdir, self.allow_partial))
        try:
            return self.collect_job.result()
        except Exception as error:  # noqa: BLE001
            # A module the shards could not import is the cause of the runs the collect misses.
            for cause in shard_errors:
                if isinstance(cause, extensions.ExtensionImportError):
                    raise cause from None
            raise _job_error(error) from None


# Errors of the package that a job's trace may end with, re-raised here as one line.
_KNOWN_JOB_ERRORS = {
    "ExtensionImportError": extensions.ExtensionImportError,
    "SweepIncompleteError": shards_lib.SweepIncompleteError,
    "NoSweepError": shards_lib.NoSweepError,
    "ConfigError": ConfigError,
}


def _job_error(error: BaseException) -> BaseException:
    """The package's own error at the end of a failed job's trace (submitit reports it as a
    FailedJobError holding the whole traceback as text), else `error` itself."""
    if type(error).__name__ in _KNOWN_JOB_ERRORS:
        return error
    for line in reversed(str(error).splitlines()):
        name, sep, message = line.strip().partition(": ")
        known = _KNOWN_JOB_ERRORS.get(name.rpartition(".")[2]) if sep else None
        if known is not None and name.startswith("fedjax_pals."):
            return known(message)
    return error


def _array_id(jobs: Sequence[Any]) -> str:
    # submitit names array tasks "<array id>_<task>" and has no attribute for the array's id.
    return str(jobs[0].job_id).split("_")[0]


@contextlib.contextmanager
def _stderr_kept_back():
    """Holds back what child processes (sbatch) write to stderr while the block runs: submitit
    lets sbatch print its refusal there, which the one-line error then repeats."""
    kept = types.SimpleNamespace(text="")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield kept
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept.text = capture.read()


def submit_sweep(
    config: Any,
    workdir: str,
    *,
    shards: int,
    executor: Any = None,
    cluster: str | None = None,
    folder: str | None = None,
    allow_partial: bool = False,
    **parameters: Any,
) -> SweepSubmission:
    """Submits the sweep `config` as `shards` array jobs, then a collect job after them.

    Args:
      config: the sweep config (every run is validated here, before anything is submitted).
      workdir: the sweep's workdir, on a file system every node sees.
      shards: N, the number of array tasks (shard i of N each).
      executor: a submitit executor to use as it is; default: `submitit.AutoExecutor(folder,
        cluster)` with `parameters`.
      cluster: "slurm", "local" or "debug" (None: what submitit detects).
      folder: submitit's folder for logs and pickles (default: `<workdir>/submitit`).
      allow_partial: the collect writes a table marked partial if some runs did not end.
      **parameters: submitit's `update_parameters` (timeout_min, gpus_per_node, cpus_per_task,
        mem_gb, slurm_partition, slurm_array_parallelism, slurm_additional_parameters, ...).

    Raises:
      ConfigError: a bad sweep config, N, or a parameter the executor does not know.
    """
    submitit = _submitit()
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"shards must be an integer >= 1, got {shards!r}.")
    expanded = sweep_lib.expand(config)  # validates every run before anything is submitted
    try:
        extensions.check_portable(expanded.imports, "a shard job")
    except extensions.ExtensionImportError as error:
        raise ConfigError(str(error)) from None
    workdir = sweep_lib.sweep_workdir(workdir)
    plan = shards_lib.read_plan(workdir)
    if plan is not None and plan.get("shards") != shards:
        raise ConfigError(
            f"the sweep in {workdir} is already split into {plan.get('shards')} shards "
            f"({shards_lib.plan_path(workdir)}); submit {plan.get('shards')} shards."
        )
    workdir = os.path.abspath(os.fspath(workdir))
    if executor is None:
        # A folder per Slurm job; local processes share one (their controller would make the
        # pattern "%j" itself as a directory).
        job_folder = "%j" if cluster not in _NO_DEPENDENCIES else str(cluster)
        folder = folder or os.path.join(workdir, SUBMITIT_FOLDER, job_folder)
        try:
            executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
        except (ValueError, RuntimeError) as error:
            raise ConfigError(f"submitit: {' '.join(str(error).split())}") from None
        name = os.path.basename(workdir.rstrip(os.sep)) or "sweep"
        parameters = {"name": f"fjp-{name}", **parameters}
    try:
        executor.update_parameters(**parameters)
    except (NameError, AssertionError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ConfigError(f"submitit refused the job parameters: {first}") from None
    os.makedirs(workdir, exist_ok=True)
    expanded.record_imports(workdir)  # for the collect job, and a collect by workdir
    job = ShardJob(expanded.config, workdir, shards, expanded.imports)
    try:
        with _stderr_kept_back() as kept:
            jobs = executor.map_array(job, range(shards))
    except (OSError, RuntimeError, ValueError) as error:  # sbatch's own refusal, e.g.
        lines = [l for l in str(error).splitlines() if l.strip()]  # an invalid partition
        detail = next((l for l in lines if "error" in l.lower()), lines[0] if lines else "")
        raise ConfigError(f"the scheduler refused the job array: {detail.strip()}") from None
    if kept.text.strip():
        sys.stderr.write(kept.text)  # what sbatch said of a submission it accepted

    collect_job = None
    cluster_name = str(getattr(executor, "cluster", None) or type(executor).__name__.lower())
    if not any(name in cluster_name for name in _NO_DEPENDENCIES):
        # AutoExecutor prefixes a scheduler's own parameters with its name; SlurmExecutor not.
        key = "slurm_dependency" if isinstance(executor, submitit.AutoExecutor) else "dependency"
        executor.update_parameters(**{key: f"afterany:{_array_id(jobs)}"})
        collect_job = executor.submit(CollectJob(workdir, allow_partial))
    return SweepSubmission(workdir, list(jobs), collect_job, executor, allow_partial)
