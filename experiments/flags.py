"""Flags shared by the experiment mains (defined once here; every main imports this module).

--workdir       where the run (or sweep) writes: checkpoints, results, metrics, plots
--overwrite     replace a run of another config held in --workdir
--quiet         no progress bar, no log lines (CI)
--cpu_devices, --coordinator_address, --num_processes, --process_id
                the JAX runtime: host devices of this process, and the `jax.distributed`
                settings of a multi-process launch (see fjp.configure_runtime)
"""

from __future__ import annotations

import contextlib
import sys

from absl import flags

import fedjax_pals as fjp

WORKDIR = flags.DEFINE_string(
    "workdir", None, "Working directory: checkpoints/, results.json, metrics, TensorBoard, plots."
)
OVERWRITE = flags.DEFINE_boolean(
    "overwrite", False, "Replace a run of another config in --workdir (after validating this one)."
)
QUIET = flags.DEFINE_boolean("quiet", False, "No progress bar and no log lines.")
CPU_DEVICES = flags.DEFINE_string(
    "cpu_devices",
    "auto",
    "Host (CPU) devices of this process: an integer, or 'auto' (one per core, shared among "
    "the local processes of a `python -m fedjax_pals.launch`); the CPU backends deal clients "
    "to them.",
)
COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None, "jax.distributed coordinator host:port (multi-process runs)."
)
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "jax.distributed: number of processes.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "jax.distributed: this process's index.")

# What the library raises for a user's mistake: shown as one line, without a traceback.
USER_ERRORS = tuple(
    getattr(fjp, name)
    for name in (
        "ConfigError",
        "TaskError",
        "WorkdirError",
        "CheckpointError",
        "DatasetUnavailableError",
        "TrainingDivergedError",
    )
)


def configure_runtime() -> None:
    """Applies the runtime flags (before any JAX computation)."""
    cpu_devices = CPU_DEVICES.value
    if cpu_devices is not None and cpu_devices != "auto":
        try:
            cpu_devices = int(cpu_devices)
        except ValueError:
            sys.exit(f"error: --cpu_devices must be an integer or 'auto', got {cpu_devices!r}.")
    try:
        fjp.configure_runtime(
            cpu_devices=cpu_devices,
            coordinator_address=COORDINATOR_ADDRESS.value,
            num_processes=NUM_PROCESSES.value,
            process_id=PROCESS_ID.value,
        )
    except ValueError as error:
        sys.exit(f"error: {error}")


@contextlib.contextmanager
def user_errors():
    """Turns the library's errors about the user's input into `error: <message>` and exit 1."""
    try:
        yield
    except USER_ERRORS as error:
        sys.exit(f"error: {error}")
