"""What an interrupted command says, and the signals that interrupt it.

`ACTIVITY` records what this process is training (which runs, the round each reached, the
round of its last checkpoint, how many runs of a sweep finished): `interruption_message` turns
it into the line a command prints when SIGINT or SIGTERM stops it (`handle_signals`, used by
the mains of experiments/). `uninterrupted()` marks the few writes (a checkpoint, results.json,
a round's metrics) that such a signal waits for, so that an interrupted run leaves nothing
half written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import weakref
from typing import Iterator


@dataclasses.dataclass
class RunActivity:
    """One run this process prepared: the rounds it trained and the round of its last checkpoint."""

    name: str
    rounds: int
    done: int = 0  # rounds trained so far
    saved: int | None = None  # the round of its last checkpoint (None: none yet)
    start: int = 0  # the round this launch resumed it after
    training: bool = False  # in the program training now (not loading, not waiting)


class Activity:
    """What this process is training, for `interruption_message` (one per process: `ACTIVITY`)."""

    def __init__(self):
        self.reset()
        self.active = False  # no run or sweep began in this process (another command)

    def reset(self) -> None:
        """A run or a sweep begins: what it does is recorded from here."""
        self.active = True
        self.runs: dict[str, RunActivity] = {}
        self.names: dict[str, str] = {}  # run key -> the name to show (a sweep's run names)
        self.sweep_total: int | None = None  # runs of the sweep (None: not a sweep)
        self.sweep_finished = 0  # runs of the sweep with results (skipped ones included)
        self.ended = 0  # runs that ended (with results or an error)
        # Runs trained in one program with the run being reported, ended with it and reported
        # after it (`train_and_evaluate_many`): a sweep's ETA is not over them.
        self.ended_unreported = 0
        self.last_start = 0  # the round the last run that ended was resumed after (0: none)

    def name_runs(self, names: dict[str, str]) -> None:
        self.names.update(names)

    def run_prepared(self, key: str, name: str, rounds: int) -> None:
        self.runs[key] = RunActivity(self.names.get(key, name), int(rounds))

    def run_saved(self, key: str, done: int | None) -> None:
        """The run's last checkpoint is now the one of round `done` (None: it has none)."""
        run = self.runs.get(key)
        if run is not None:
            run.saved = None if not done else int(done)
            run.done = max(run.done, run.saved or 0)

    def run_starts(self, key: str, start_round: int) -> None:
        """The run resumes after round `start_round` (0: it starts afresh)."""
        self.run_saved(key, start_round)
        run = self.runs.get(key)
        if run is not None:
            run.start = int(start_round)

    def run_training(self, keys) -> None:
        for key in keys:
            if key in self.runs:
                self.runs[key].training = True

    def run_round(self, key: str, done: int) -> None:
        run = self.runs.get(key)
        if run is not None:
            run.done = int(done)

    def run_ended(self, key: str) -> None:
        run = self.runs.pop(key, None)
        if run is not None:
            self.ended += 1
            self.last_start = run.start

    def sweep_started(self, total: int, finished: int) -> None:
        self.sweep_total, self.sweep_finished = int(total), int(finished)

    def sweep_run_finished(self) -> None:
        self.sweep_finished += 1


ACTIVITY = Activity()


def _resume_point(run: RunActivity) -> str:
    if run.saved:
        return f"round {run.saved} (the last checkpoint)"
    return "round 0 (no checkpoint yet)"


def _where(run: RunActivity) -> str:
    if not run.training:
        return f"before round {run.done + 1}/{run.rounds}"
    if run.done >= run.rounds:
        return f"after its last round ({run.rounds}/{run.rounds})"
    return f"in round {run.done + 1}/{run.rounds}"


def interruption_message(signum: int, activity: Activity | None = None) -> str:
    """The one line a command ends with when signal `signum` stops it: where each run was,
    the round the same command resumes it from (its last checkpoint's), and for a sweep how
    many of its runs finished."""
    activity = ACTIVITY if activity is None else activity
    head = f"interrupted ({_signal_name(signum)})"
    runs = list(activity.runs.values())
    current = [run for run in runs if run.training] or runs
    if not activity.active:  # a command that trains nothing, or before its run began
        return f"{head}; the same command starts again."
    if activity.sweep_total is None:  # one run
        if not current and activity.ended:
            return f"{head} after the run ended; the same command does not train it again."
        if not current:
            return f"{head} before training began; the same command starts again."
        run = current[0]
        return (
            f"{head} {_where(run)} of {run.name}; the same command resumes from "
            f"{_resume_point(run)}."
        )
    finished = f"{activity.sweep_finished} of {activity.sweep_total} runs finished"
    if not current:
        return f"{head} with {finished}; the same command resumes the sweep."
    run = current[0]
    others = len(current) - 1
    which = f"run {run.name}" + (f" (and {others} more)" if others else "")
    return (
        f"{head} {_where(run)} of {which}, with {finished}; the same command resumes the "
        f"sweep, {'these runs' if others else 'this run'} from {_resume_point(run)}."
    )


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread while `handle_signals` is in force (a
    KeyboardInterrupt, so that whatever stops on Ctrl-C stops on it)."""

    def __init__(self, signum: int):
        super().__init__(_signal_name(signum))
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """The shell's status of a process the signal ended: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def exit_status(error: KeyboardInterrupt) -> int:
    """130 for a plain KeyboardInterrupt, 128 + N for an `Interrupted` by signal N."""
    return getattr(error, "exit_status", 128 + signal.SIGINT)


class _Signals:
    deferring = 0  # depth of `uninterrupted` blocks (main thread)
    pending: int | None = None  # a signal that arrived inside one
    raised: int | None = None  # the signal already raised (a second one ends the process)
    installed = False


# A signal that lands in a finalizer is delivered again this much later (`_on_signal`).
REDELIVERY_SECONDS = 0.05


def _in_finalizer(frame) -> bool:
    """Whether the main thread is running a finalizer (a `__del__`, a `weakref.finalize`
    callback), which the garbage collector may start between any two bytecodes: an exception
    raised there is printed as "Exception ignored in ..." with its traceback and dropped."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename == weakref.__file__:
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame) -> None:
    if _Signals.raised is not None or _Signals.pending is not None:
        # A second signal while the first one unwinds (or waits for a write): stop at once.
        print(interruption_message(signum), file=sys.stderr, flush=True)
        os._exit(128 + signum)
    if _Signals.deferring:
        _Signals.pending = signum  # raised when the write ends (`uninterrupted`)
        return
    if _in_finalizer(frame):
        # Raised here, the interrupt would be a traceback and then lost (the run would go on):
        # the signal comes again once the finalizer is done.
        timer = threading.Timer(REDELIVERY_SECONDS, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    _Signals.raised = signum
    raise Interrupted(signum)


def handle_signals() -> None:
    """From now on SIGINT and SIGTERM raise `Interrupted` in the main thread (after any
    `uninterrupted` write in progress); a second one while the first unwinds ends the process
    at once. A signal the process inherited as ignored stays ignored. Called by the mains of
    experiments/, again after `jax.distributed` starts (its preemption notifier takes
    SIGTERM). Does nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        # A signal the process was started ignoring stays ignored (`cmd &` in a script ignores
        # SIGINT, so that a Ctrl-C meant for the script does not stop it).
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _on_signal)
    _Signals.installed = True


def signals_handled() -> bool:
    return _Signals.installed


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A write that a signal (under `handle_signals`) does not cut: one arriving inside takes
    effect when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Signals.deferring += 1
    failure = None
    try:
        yield
    except BaseException as error:
        failure = error
        raise
    finally:
        _Signals.deferring -= 1
        if not _Signals.deferring and _Signals.pending is not None:
            signum, _Signals.pending = _Signals.pending, None
            _Signals.raised = signum
            if isinstance(failure, Exception):
                # The write failed too (a full disk, ...): said, not hidden by the interrupt.
                print(f"error while stopping: {failure}", file=sys.stderr, flush=True)
            raise Interrupted(signum) from failure
