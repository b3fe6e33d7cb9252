"""Process-level set-up: host devices, and several processes under `jax.distributed`.

Call `configure_runtime` first thing in a program, before any JAX computation: the number of
host (CPU) devices and the distributed runtime are fixed when JAX initialises its backends.

* One machine, all cores: `configure_runtime(cpu_devices="auto")` gives one host device per
  core; the engine's CPU backend deals clients to them.
* Several processes (on one machine for testing, or many hosts):
  `configure_runtime(coordinator_address="host:port", num_processes=N, process_id=i)` in each;
  on SLURM or TPU pods `configure_runtime(distributed=True)` lets JAX detect the cluster. On CPU
  the processes talk through gloo. The engine's mesh then spans every process's devices.
* Compiling once across launches: `configure_runtime(compilation_cache="auto")` turns on
  JAX's persistent compilation cache (`compilation_cache_dir`), so that a second launch loads
  the programs the first one compiled; the launchers of `experiments/` do so by default
  (`--compilation_cache=DIR|none`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import jax
from absl import logging

_configured: dict = {}

# What `configure_runtime(compilation_cache=...)` accepts besides a directory.
COMPILATION_CACHE_AUTO = "auto"
COMPILATION_CACHE_OFF = ("none", "off")
# Programs that compile faster than this are not written to the persistent cache. JAX's own
# default is 1 s, measured on the machine at hand: on a fast, quiet one the demo's mid-sized
# programs compile in under that and would be compiled at every launch. 0 keeps every program
# (the demo: 102 entries, 1.3 MB, against 20 at 1 s, whose second launch still compiled 82
# programs: docs/decisions/0017-persistent-compilation-cache.md).
CACHE_MIN_COMPILE_SECONDS = 0.0


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def configure_runtime(
    *,
    cpu_devices: int | str | None = None,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    distributed: bool | None = None,
    compilation_cache: str | os.PathLike | None = None,
) -> dict:
    """Sets up host devices and, if asked, the multi-process runtime; returns the settings.

    Args:
      cpu_devices: host devices of this process: an int >= 1, "auto" (one per available core,
        divided among the local processes started by `python -m fedjax_pals.launch`), or None
        (JAX's default, one). Once JAX has started, "auto" keeps the devices there are, and an
        int must equal their number.
      coordinator_address: `jax.distributed.initialize`'s coordinator host:port. Giving it,
        `num_processes` or `process_id` starts the distributed runtime; when none of the three
        is given they are read from the environment that `fedjax_pals.launch` sets.
      num_processes: the number of processes of the distributed runtime.
      process_id: this process's index among them.
      distributed: True to start it with JAX's auto-detection (SLURM, TPU pods, Open MPI); None
        starts it only when the settings above are given.
      compilation_cache: JAX's persistent compilation cache: a directory, "auto"
        (`compilation_cache_dir("auto")`: $JAX_COMPILATION_CACHE_DIR, else the user's cache
        directory), "none" (off, even if $JAX_COMPILATION_CACHE_DIR is set), or None (JAX's
        settings left as they are). Every program is cached (`CACHE_MIN_COMPILE_SECONDS`,
        unless $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise). The directory is
        trusted: whoever can write to it can run code in this process, so keep it your own.
    """
    env = os.environ
    if coordinator_address is None and num_processes is None and process_id is None:
        # Set by `python -m fedjax_pals.launch` for each local process.
        if "FEDJAX_PALS_COORDINATOR" in env:
            coordinator_address = env["FEDJAX_PALS_COORDINATOR"]
            num_processes = int(env["FEDJAX_PALS_NUM_PROCESSES"])
            process_id = int(env["FEDJAX_PALS_PROCESS_ID"])
    cpu_devices_setting = cpu_devices
    if cpu_devices is not None:
        if cpu_devices == "auto":
            per_process = int(os.environ.get("FEDJAX_PALS_LOCAL_PROCESSES", "1"))
            cpu_devices = max(1, available_cores() // max(per_process, 1))
        if isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1:
            raise ValueError(f"cpu_devices must be an integer >= 1 or 'auto', got {cpu_devices!r}.")
    if num_processes is not None and (
        isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1
    ):
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}.")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id must be in [0, {num_processes - 1}] for {num_processes} processes, "
            f"got {process_id!r}."
        )
    start_distributed = distributed or (
        distributed is None
        and any(v is not None for v in (coordinator_address, num_processes, process_id))
    )
    # The cache setting is checked before anything is set.
    cache_dir = None if compilation_cache is None else compilation_cache_dir(compilation_cache)
    try:
        if cpu_devices is not None:
            try:
                jax.config.update("jax_num_cpu_devices", cpu_devices)
            except RuntimeError:  # JAX has started: only a no-op, or a default, is fine
                if not (cpu_devices_setting == "auto" or jax.local_device_count() == cpu_devices):
                    raise
                logging.info(
                    "configure_runtime: JAX has already started with %d device(s); keeping "
                    "them (cpu_devices=%r).",
                    jax.local_device_count(),
                    cpu_devices_setting,
                )
                cpu_devices = jax.local_device_count()
        if start_distributed:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except RuntimeError as error:  # raised once the backends exist
        raise RuntimeError(
            "configure_runtime must run before any JAX computation (the host device count "
            f"and the collectives are fixed when JAX starts): {error}"
        ) from error
    if start_distributed and not _configured.get("distributed"):
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    if compilation_cache is not None:
        # None when the directory cannot be used: the run goes on without a persistent cache.
        _configured.update(compilation_cache=_use_compilation_cache(cache_dir))
    _configured.update(cpu_devices=cpu_devices, distributed=bool(start_distributed))
    return dict(_configured)


def default_compilation_cache_dir() -> str:
    """$XDG_CACHE_HOME/fedjax_pals/jax, or ~/.cache/fedjax_pals/jax without it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fedjax_pals", "jax")


def compilation_cache_dir(setting: str | os.PathLike) -> str | None:
    """The directory `configure_runtime(compilation_cache=setting)` uses, or None for off.

    "auto": $JAX_COMPILATION_CACHE_DIR when set (the test suite's, or the user's own), else
    `default_compilation_cache_dir()`; "none" or "off": None; anything else: that directory,
    made absolute (created at the first compile).
    """
    if isinstance(setting, os.PathLike):
        setting = os.fspath(setting)
    if not isinstance(setting, str) or not setting.strip():
        raise ValueError(
            f"compilation_cache must be a directory, 'auto' or 'none', got {setting!r}."
        )
    setting = setting.strip()
    if setting.lower() in COMPILATION_CACHE_OFF:
        return None
    if setting.lower() == COMPILATION_CACHE_AUTO:
        setting = os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_compilation_cache_dir()
    return os.path.abspath(os.path.expanduser(setting))


def _use_compilation_cache(directory: str | None) -> str | None:
    """Points JAX's persistent compilation cache at `directory` (None: turns it off); returns
    the directory in use, or None.

    A directory that cannot be used (not a directory, cannot be made or written, its file
    system full) is reported in one line and then not given to JAX, which would otherwise warn
    at every compile that fails to write an entry (59 warnings in a demo run): the run goes on
    without a persistent cache.
    """
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    problem = None
    if os.path.realpath(directory) == os.path.realpath(default_compilation_cache_dir()):
        try:  # the user's own cache, readable and writable by them alone
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as error:
            problem = f"it cannot be created: {error.strerror or error}"
    if problem is None:
        problem = compilation_cache_problem(directory)
    if problem is not None:
        _cache_warning(directory, problem)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # the user's wins
        jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)
    return directory


# Less free space than this where the compilation cache lives: entries fail to be written.
CACHE_MIN_FREE_BYTES = 64 * 2**20


def compilation_cache_problem(directory: str) -> str | None:
    """Why JAX could not write compiled programs into `directory`, or None: it is not a
    directory, cannot be made or written, or its file system is (nearly) full."""
    existing = directory
    while not os.path.exists(existing):  # where it would be made
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if os.path.exists(directory) and not os.path.isdir(directory):
        return "it is not a directory"
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} cannot be written"
    if existing == directory:  # a read-only mount, an ACL: only a write tells
        try:
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".fedjax_pals-probe-"):
                pass
        except OSError as error:
            return f"it cannot be written: {error.strerror or error}"
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return None
    if free < CACHE_MIN_FREE_BYTES:
        return f"its file system has only {free / 2**20:.0f} MiB free"
    return None


def _cache_warning(directory: str, problem: str) -> None:
    print(
        f"warning: the compilation cache {directory} is not usable ({problem}): this run goes on "
        "without one and compiles its programs anew; pass --compilation_cache=DIR (another "
        "directory) or none.",
        file=sys.stderr,
        flush=True,
    )


# What a collective or the coordination service raises when another process has died.
_LOST_PEER_MARKERS = (
    "gloo",
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "coordination service",
    "heartbeat",
)


def is_lost_peer_error(error: BaseException) -> bool:
    """True for the error a process of a multi-process run gets when a peer has died."""
    if not _configured.get("distributed"):
        return False
    text = str(error).lower()
    return any(marker in text for marker in _LOST_PEER_MARKERS)


def lost_peer_message(error: BaseException) -> str:
    """One line for `is_lost_peer_error`: which process, what it saw, how to resume."""
    first = " ".join(str(error).split())[:200]
    return (
        f"process {jax.process_index()} of {jax.process_count()} lost contact with another "
        f"process of the run ({type(error).__name__}: {first}); run the same command again to "
        "resume the run from its last checkpoint."
    )


def is_main_process() -> bool:
    """True in the process that writes files (process 0); always True in a single process."""
    return jax.process_index() == 0
