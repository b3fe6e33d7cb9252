"""Flags shared by the experiment mains (defined once here; every main imports this module and
names those it takes: `run(main, takes=...)`, from the groups `WRITES`, `TRAINS`, `RUNTIME`).

--workdir       where the run (or sweep) writes: checkpoints, results, metrics, plots
--overwrite     replace a run of another config held in --workdir
--quiet         no progress bar or lines, no log lines (CI); results and `wrote:` stay
--mlflow_tracking_uri
                also log every run's params and metrics to this MLflow store (optional extra;
                default $MLFLOW_TRACKING_URI, where set)
--mlflow_experiment
                the MLflow experiment of those runs (default $MLFLOW_EXPERIMENT_NAME, where
                set, else fedjax_pals)
--cpu_devices, --coordinator_address, --num_processes, --process_id
                the JAX runtime: host devices of this process, and the `jax.distributed`
                settings of a multi-process launch (see fjp.configure_runtime)
--compilation_cache
                JAX's persistent compilation cache: 'auto' (the default:
                $JAX_COMPILATION_CACHE_DIR, else ~/.cache/fedjax_pals/jax), a directory, or
                'none'; a second launch loads what the first compiled

Every main defines its config flag with `define_config_file` and starts with `run(main)`
(instead of `app.run`): a mistake in the command line (a missing or broken config file, a
key path that names no key, an unknown flag, a bad flag value) is then one `error:` line on
stderr and exit status 2, before any data is read; SIGINT (Ctrl-C) or SIGTERM is one line
saying where the run stopped and the round the same command resumes from, exit status 130 or
143, no traceback (`fedjax_pals.experiment.progress`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Callable, Iterable

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from . import cli, config_args

fjp = cli.lazy_import("fedjax_pals")  # imported (with JAX) at its first use, after --help

WORKDIR = flags.DEFINE_string(
    "workdir", None, "Working directory: checkpoints/, results.json, metrics, TensorBoard, plots."
)
OVERWRITE = flags.DEFINE_boolean(
    "overwrite", False, "Replace a run of another config in --workdir (after validating this one)."
)
QUIET = flags.DEFINE_boolean(
    "quiet",
    False,
    "No progress bar or lines and no log lines; the results, the `wrote:` list and errors stay.",
)
MLFLOW_TRACKING_URI = flags.DEFINE_string(
    "mlflow_tracking_uri",
    None,
    "Also log each run's params and metrics to this MLflow tracking store (e.g. "
    "file:///abs/mlruns with MLFLOW_ALLOW_FILE_STORE=true, or http://host:5000); needs "
    'pip install "fedjax_pals[mlflow]". Unset: $MLFLOW_TRACKING_URI where set, else no MLflow.',
)
MLFLOW_EXPERIMENT = flags.DEFINE_string(
    "mlflow_experiment",
    None,
    "The MLflow experiment that --mlflow_tracking_uri logs the runs into (created if missing); "
    "each run is named by its key in the sweep (fedpals/seed_0) or its workdir's name. Unset: "
    "$MLFLOW_EXPERIMENT_NAME where set, else fedjax_pals.",
)
CPU_DEVICES = flags.DEFINE_string(
    "cpu_devices",
    "auto",
    "Host (CPU) devices of this process: an integer, or 'auto' (one per core, shared among "
    "the local processes of a `python -m fedjax_pals.launch`); the CPU backends deal clients "
    "to them.",
)
# Checked while absl parses (exit status 2, before any data is read), not when JAX starts.
cli.check_count_or_auto(CPU_DEVICES)
COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None, "jax.distributed coordinator host:port (multi-process runs)."
)
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "jax.distributed: number of processes.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "jax.distributed: this process's index.")
COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache",
    "auto",
    "JAX's persistent compilation cache, so that a launch loads the programs an earlier one "
    "compiled instead of compiling them again: a directory, 'auto' ($JAX_COMPILATION_CACHE_DIR "
    "if set, else $XDG_CACHE_HOME/fedjax_pals/jax, i.e. ~/.cache/fedjax_pals/jax) or 'none'. "
    "One that cannot be used (not writable, cannot be created, no space) is reported in one "
    "line and the run goes on without a persistent cache.",
)
# An empty value is a mistake (`--workdir=` would write into the current directory, an empty
# MLflow URI would be taken as none), refused while absl parses like every other one.
cli.require_value(WORKDIR, "directory")
cli.require_value(MLFLOW_TRACKING_URI, "tracking URI (or leave the flag out)")
cli.require_value(MLFLOW_EXPERIMENT, "name for the MLflow experiment")
cli.require_value(COORDINATOR_ADDRESS, "host:port")
cli.check_number(NUM_PROCESSES, 1)
cli.check_number(PROCESS_ID, 0)
cli.require_value(COMPILATION_CACHE, "directory, 'auto' or 'none'")

# The shared flags by what a main does with them: `run(main, takes=...)` names the groups a
# main reads, its --help shows those (and --quiet, which every main honours), and a flag of
# another group is refused, not silently ignored (`--overwrite` to a report).
WRITES = ("workdir",)
TRAINS = ("workdir", "overwrite", "mlflow_tracking_uri", "mlflow_experiment")
RUNTIME = ("cpu_devices", "coordinator_address", "num_processes", "process_id",
           "compilation_cache")
_EVERY_MAIN = ("quiet",)



def _user_errors() -> tuple[type[Exception], ...]:
    """What the library raises for a user's mistake: shown as one line, without a traceback."""
    return tuple(
        getattr(fjp, name)
        for name in (
            "ConfigError",
            "TaskError",
            "WorkdirError",
            "CheckpointError",
            "DatasetUnavailableError",
            "TrainingDivergedError",
        )
    ) + (fjp.experiment.mlflow_writer.MlflowError,)


# The command-line conventions (one `error:` line, exit status 2), shared with the benchmarks.
USAGE_ERROR_STATUS = cli.USAGE_ERROR_STATUS
usage_error = cli.usage_error
# The command that runs a main ("sweep") the way this process was launched, for hints.
command_for = cli.command_for
check_number_list = cli.check_number_list
require_items = cli.require_items

# name -> default config file of the config flags the mains define.
_CONFIG_FLAGS: dict[str, str | None] = {}


def define_config_file(name: str, default: str | None, help_string: str) -> flags.FlagHolder:
    """`config_flags.DEFINE_config_file`, checked by `run` before absl parses it."""
    _CONFIG_FLAGS[name] = default
    help_string = (
        f"{help_string} Override any key with --{name}.<key path>=<value>; the keys and their "
        "meaning: fedjax_pals/experiment/config.py (docs/guide/running.md)."
    )
    if default is not None and cli.asked_for_help(sys.argv):
        # ml_collections loads a default config file here, and a config file imports the
        # package (and JAX): the help names the file instead.
        help_string, default = f"{help_string} (default: {default})", None
    return config_flags.DEFINE_config_file(name, default, help_string)


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        return cli.parse_flags(argv)
    # ml_collections raises these while applying a --config.<path> override.
    except (AttributeError, KeyError, TypeError, ValueError, OSError) as error:
        text = error.args[0] if isinstance(error, KeyError) and error.args else error
        usage_error(f"while parsing the flags: {type(error).__name__}: {text}")


def _only_errors_in_the_log() -> None:
    # --quiet: results and errors only. absl's handler carries Python logging too (JAX's
    # "Unable to initialize backend", orbax, matplotlib's font cache), so both levels go up.
    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)


class _WarningLines(absl_logging.PythonFormatter):
    """absl's log lines, but a warning is `warning: <message>`, one line, like the mains'
    `error:` lines (not `W1128 01:06:41.232532 140453246696320 protocol.py:175] ...`)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.WARNING:
            return f"warning: {' '.join(record.getMessage().split())}"
        return super().format(record)


def _warnings_as_lines() -> None:
    absl_logging.get_absl_handler().setFormatter(_WarningLines())


def _deprecations_as_lines() -> None:
    """A `FedjaxPalsDeprecationWarning` (a user's module on an interface that a later version
    refuses) is one `warning: <message> (<file>:<line>)` line on stderr, like the `error:`
    lines, not Python's two lines with the source line. By the class's name: the package
    (and JAX) is not imported for it."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if any(c.__name__ == "FedjaxPalsDeprecationWarning" for c in category.__mro__):
            print(f"warning: {' '.join(str(message).split())} ({filename}:{lineno})",
                  file=sys.stderr if file is None else file)
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _shared_flag_names() -> set[str]:
    # A main's config flag is defined here too (`define_config_file`), but it is the main's own.
    return {flag.name for flag in flags.FLAGS.get_flags_for_module(__name__)} - set(_CONFIG_FLAGS)


def _show_launcher_flags_in_help(takes: set[str]) -> None:
    # absl's --help lists the key flags of the main module (keyed by sys.argv[0]); the shared
    # flags a main takes are its own, so they belong in it, not only in --helpfull.
    for flag in flags.FLAGS.get_flags_for_module(__name__):
        if flag.name in takes or flag.name in _CONFIG_FLAGS:
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    _say_required_in_help()


def _refuse_flags_not_taken(not_taken: set[str], main: Callable) -> None:
    given = sorted(name for name in not_taken if flags.FLAGS[name].present)
    if given:
        # A user's main is not one `command_for` knows: name the script it was run as.
        ours = _main_module(main).partition(".")[0] in cli.MAIN_PACKAGES
        command = command_for(_main_name(main)) if ours else os.path.basename(sys.argv[0])
        usage_error(
            f"{command} takes no {', '.join('--' + name for name in given)} (its --help lists "
            "the flags it takes)."
        )


def _say_required_in_help() -> None:
    # absl's help says nothing of a flag marked required and shows a config flag without a
    # default as "(default: 'None')": the main's required flags say "(required)" instead, and
    # no flag shows a default of None.
    for flag in flags.FLAGS.get_key_flags_for_module(sys.argv[0]):
        required = f"Flag --{flag.name} must have a value other than None."  # absl's validator
        if any(getattr(v, "message", None) == required for v in flag.validators):
            if not flag.help.endswith("(required)"):
                flag.help += "\n(required)"
            flag.default_as_str = None
        elif flag.default is None:
            flag.default_as_str = None


def _main_module(main: Callable) -> str:
    """"experiments.sweep" of experiments.sweep's main, however it was run."""
    module = getattr(main, "__module__", None) or ""
    if module == "__main__":  # `python -m experiments.sweep`: the name it was run as
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None) or ""
    return module


def _main_name(main: Callable) -> str:
    """"sweep" of experiments.sweep's (or fedjax_pals_experiments.sweep's) main."""
    package, _, name = _main_module(main).partition(".")
    return name if package in cli.MAIN_PACKAGES and name else "run"


def run(main: Callable[[list[str]], object], takes: Iterable[str] | None = None) -> None:
    """`app.run(main)`, with the config file and `--config.<path>` overrides checked first.

    `takes`: the shared flags `main` reads (`WRITES`, `TRAINS`, `RUNTIME`, joined); --quiet
    always. Its --help shows them, and any other shared flag on the command line is a usage
    error. None: every shared flag (a main written before mains declared them)."""
    shared = _shared_flag_names()
    takes = shared if takes is None else set(takes) | set(_EVERY_MAIN)
    unknown = takes - shared
    if unknown:
        raise ValueError(f"takes names no shared flag: {sorted(unknown)}.")
    cli.show_main_flags_in_help(main)
    _show_launcher_flags_in_help(takes)
    _deprecations_as_lines()  # before the config file imports a user's module
    argv = list(sys.argv)
    new_keys: dict[str, dict] = {}
    # The help needs neither the config schema nor the package (nor JAX): printed at once.
    checks = _CONFIG_FLAGS if not cli.asked_for_help(argv) else {}
    if checks:
        config_lib, sweep_lib = fjp.experiment.config, fjp.experiment.sweep
        schema_paths = set(config_lib.flatten(config_lib.default_config()))
    for name, default in checks.items():
        # The config file's own directory first on the import path, as Python does for a
        # script's: it imports a module of the user's beside it (docs/extending.md).
        spec, _ = config_args.find_config_path(argv, name)
        config_args.add_config_directory(spec if spec is not None else default)
        try:
            argv, new_keys[name] = config_args.check_config_argv(
                argv,
                name,
                default,
                schema_paths=schema_paths,
                sweep_keys=sweep_lib.SWEEP_KEYS,
                command=command_for(_main_name(main)),
            )
        except config_args.ConfigArgError as error:
            if error.hint:  # a second line: what to do (a module the config cannot import)
                print(f"error: {' '.join(str(error).split())}\n{error.hint}", file=sys.stderr)
                sys.exit(USAGE_ERROR_STATUS)
            usage_error(str(error))
    sys.argv = argv  # ml_collections reads the overrides from sys.argv

    def checked_main(args: list[str]):
        _warnings_as_lines()
        if QUIET.value:
            _only_errors_in_the_log()
        elif absl_logging.get_verbosity() < absl_logging.DEBUG:
            # JAX's probe of absent accelerators ("Unable to initialize backend 'tpu'") is
            # every CPU user's first log line and says nothing wrong, nor do jax.distributed's
            # "Starting / Connecting to JAX distributed service"; --verbosity=1 shows them.
            for name in ("jax._src.xla_bridge", "jax._src.distributed"):
                logging.getLogger(name).setLevel(logging.WARNING)
        if len(args) > 1:
            usage_error(f"unexpected arguments {args[1:]} (flags are written --name=value).")
        _refuse_flags_not_taken(shared - takes, main)
        for name, keys in new_keys.items():
            config_args.apply_new_keys(flags.FLAGS[name].value, keys)
        interruption = fjp.experiment.interruption
        interruption.handle_signals()  # SIGINT and SIGTERM: one line (below), 130 / 143
        try:
            return main(args)
        except KeyboardInterrupt as error:  # Ctrl-C, SIGTERM: where it stopped, not a traceback
            if not _secondary_process():  # the other processes of a launch: only the status
                print(interruption.interruption_message(_signal_of(error)), file=sys.stderr)
                sys.stderr.flush()
            _quiet_shutdown()
            sys.exit(interruption.exit_status(error))
        except fjp.ExtensionImportError as error:  # a recorded user module is not importable
            usage_error(str(error))
        except Exception as error:
            if fjp.runtime.is_lost_peer_error(error):  # a peer died: one line, no traceback
                print(f"error: {fjp.runtime.lost_peer_message(error)}", file=sys.stderr)
                sys.stderr.flush()
                _quiet_shutdown()
                sys.exit(1)
            raise

    cli.run_app(checked_main, argv=argv, flags_parser=_parse_flags)


def configure_runtime() -> dict:
    """Applies the runtime flags (before any JAX computation); returns the settings
    (`fjp.configure_runtime`'s: the compilation cache directory in use, ...)."""
    cpu_devices = CPU_DEVICES.value
    if cpu_devices is not None and cpu_devices != "auto":
        cpu_devices = int(cpu_devices)  # `_check_cpu_devices` vetted it while absl parsed
    try:
        settings = fjp.configure_runtime(
            cpu_devices=cpu_devices,
            coordinator_address=COORDINATOR_ADDRESS.value,
            num_processes=NUM_PROCESSES.value,
            process_id=PROCESS_ID.value,
            compilation_cache=COMPILATION_CACHE.value,
        )
    except ValueError as error:  # flags that do not fit together: a command-line mistake
        usage_error(str(error))
    if fjp.experiment.interruption.signals_handled():
        fjp.experiment.interruption.handle_signals()  # again: jax.distributed's preemption notifier takes SIGTERM
    return settings


def _signal_of(error: KeyboardInterrupt) -> int:
    return getattr(error, "signum", signal.SIGINT)


def _quiet_shutdown() -> None:
    """After a stop's one line, drop the errors that the stop itself causes in background threads
    while the interpreter shuts down; any other error still shows.

    Orbax's async checkpoint save, caught mid-save by SIGTERM or a peer's death, fails as the
    interpreter goes and logs the error with a traceback (orbax `futures/future.py`,
    `_SignalingThread.run`; seen once in CI under a two-process run's stop line, the error
    most likely an executor refusing new work after shutdown, which tests/test_interruption.py
    reproduces). That save is lost either way (orbax commits a checkpoint only whole); the
    resume starts from the last committed one.
    """

    def caused_by_the_stop(error: BaseException | None) -> bool:
        return error is not None and (
            fjp.runtime.is_lost_peer_error(error)
            # "cannot schedule new futures after interpreter shutdown", "can't register atexit
            # after shutdown" (an executor's module first imported then)
            or (isinstance(error, RuntimeError) and " after " in str(error)
                and str(error).endswith("shutdown"))
        )

    class _DropCausedByTheStop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not caused_by_the_stop(record.exc_info[1] if record.exc_info else None)

    absl_logging.get_absl_handler().addFilter(_DropCausedByTheStop())
    default_hook = threading.excepthook

    def hook(args) -> None:
        if not caused_by_the_stop(args.exc_value):
            default_hook(args)

    threading.excepthook = hook


def _secondary_process() -> bool:
    """A process other than the first of a multi-process launch (known without asking JAX,
    which may not have started)."""
    index = PROCESS_ID.value
    if index is None:
        index = os.environ.get("FEDJAX_PALS_PROCESS_ID")
    try:
        return index is not None and int(index) != 0
    except ValueError:
        return False


@contextlib.contextmanager
def user_errors():
    """Turns the library's errors about the user's input into `error: <message>` and exit 1."""
    try:
        yield
    except _user_errors() as error:
        sys.exit(f"error: {error}")


def written_files(workdir: str, since: float) -> list[str]:
    """What this command wrote under `workdir` (modified at or after `since`, a time.time()):
    each file directly in it, and each subdirectory with the number of files written in it,
    as absolute paths."""
    root = os.path.abspath(workdir)
    if not os.path.isdir(root):
        return []
    lines, counts = [], {}
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(directory, name)
            try:
                fresh = not name.startswith(".") and os.stat(path).st_mtime >= since - 1.0
            except OSError:  # removed while we looked (another process's temporary file)
                continue
            if not fresh:
                continue
            top = os.path.relpath(directory, root).split(os.sep)[0]
            if top == ".":
                lines.append(path)
            else:
                counts[top] = counts.get(top, 0) + 1
    for top, count in sorted(counts.items()):
        lines.append(f"{os.path.join(root, top)}{os.sep} ({count} file{'s' * (count != 1)})")
    return lines


def print_written(workdir: str, since: float) -> None:
    """Ends a command: every file it wrote under `workdir` (see `written_files`)."""
    lines = written_files(workdir, since)
    if lines:
        print("wrote:")
        for line in lines:
            print(f"  {line}")
