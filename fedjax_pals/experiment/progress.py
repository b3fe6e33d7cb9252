"""What a run says while it works: a progress bar with ETA over rounds (or over the runs of a
sweep) showing the latest metrics, plain progress lines without a terminal, and the one line
an interrupted run ends with.

`Progress` is a thin wrapper over `tqdm` (written to stderr, so stdout keeps a program's
results). `quiet=True` prints nothing at all (for CI and for processes other than the main
one). On the default stream the bar draws itself only when stderr is a terminal with columns;
in a log file, a pipe (`tee`, `nohup`, CI) or a 0-column pty it prints plain lines instead: one
per evaluation (`round 4/30, target acc 85.2%, val acc 84.9%, ETA 0:52`) and otherwise at most
one every `LINE_INTERVAL_SECONDS`, besides the lines of `write`.

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
import math
import numbers
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Iterator, TextIO

import numpy as np

# Without a terminal: at most one progress line this often, besides one per evaluation.
LINE_INTERVAL_SECONDS = 30.0

_clock = time.monotonic  # the lines' clock (tests replace it)


def _format(value: Any) -> str:
    return value if isinstance(value, str) else f"{float(np.asarray(value)):.4g}"


def percent(fraction: Any) -> str:
    """An accuracy on screen, in percent like the tables: 0.8523 -> "85.2%"."""
    return f"{100 * float(np.asarray(fraction)):.1f}%"


def duration(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on ("?" when unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def result_line(results: dict, launch_seconds: float, start_round: int = 0) -> str:
    """A run's result in one line (what `experiments.run` ends with): its accuracies in percent,
    as in the tables, and the time of this launch, with the round it began after when
    `start_round` > 0 (a resume or an extension). One clock: the training time summed over
    the launches is results.json's `wall_seconds`."""
    line = (
        f"final target accuracy {percent(results['final_target_accuracy'])}; at best val "
        f"(round {results['best_val_round']}) {percent(results['target_accuracy_at_best_val'])}; "
        f"{launch_seconds:.1f} s this launch"
    )
    if start_round:
        line += f", which resumed after round {start_round}"
    return line


def _is_terminal(stream: TextIO) -> bool:
    """A terminal that can show a bar: a tty with columns and rows (a pty of 0 columns or 0
    rows, as some CI runners and `docker -t` give, shows no bar: it gets plain lines)."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):  # a tty of unknown size: trust isatty
        return True
    return size.columns > 0 and size.lines > 0


class Progress:
    """`total` steps of `unit`; `update(n, **latest)` advances by n and shows `latest`.

    An update with n = 0 and metrics is an evaluation: the bar shows it at once, and without a
    terminal it is a line of its own.

    Args:
      total: number of steps (rounds, runs), >= 0.
      desc: a label in front of the bar (and of the plain lines).
      initial: steps already done (a resumed run starts its bar there; the ETA counts only
        the steps done now).
      quiet: no output at all.
      unit: what a step is called ("round", "run").
      file: where the bar goes (default stderr, and then only if stderr is a terminal; plain
        lines otherwise).
      first_step_compiles: the first step of this session includes XLA's compilation, so the
        rate, the elapsed time and the ETA restart after it (a 40 s round is not shown as the
        111 s a compiling first round took).
      line_every: without a terminal, the most seconds between two plain lines while steps
        are made (None: lines only at evaluations and from `write`).
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str = "",
        initial: int = 0,
        quiet: bool = False,
        unit: str = "round",
        file: TextIO | None = None,
        first_step_compiles: bool = False,
        line_every: float | None = LINE_INTERVAL_SECONDS,
    ):
        for name, value in (("total", total), ("initial", initial)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"Progress {name} must be an integer >= 0, got {value!r}.")
        if initial > total:
            raise ValueError(f"Progress initial must be <= total ({total}), got {initial}.")
        self.total = int(total)
        self.n = int(initial)
        self.quiet = bool(quiet)
        self.desc, self.unit = desc, unit
        self.latest: dict[str, str] = {}
        self._evaluated: dict[str, None] = {}  # names given at evaluations (first in a line)
        self._evaluated_at: int | None = None  # the step those values were measured at
        self._bar = None
        self._lines: TextIO | None = None  # where the plain lines go when there is no bar
        self._line_every = line_every
        self._restart_after_first = bool(first_step_compiles)
        # The ETA's start: the steps and time from which the rate is measured.
        self._start_n, self._start_time = self.n, _clock()
        self._last_line = self._start_time
        if not self.quiet and file is None and not _is_terminal(sys.stderr):
            self._lines = sys.stderr
        elif not self.quiet:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total,
                initial=self.n,
                desc=desc or None,
                unit=unit,
                file=file if file is not None else sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def update(self, n: int = 1, **latest: Any) -> None:
        """Advances by `n` steps and shows `latest` (name=value; numbers to 4 digits)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"Progress.update n must be an integer >= 0, got {n!r}.")
        self.n += int(n)
        if latest:
            self.latest.update({name: _format(value) for name, value in latest.items()})
            if not n:
                self._evaluated.update(dict.fromkeys(latest))
                self._evaluated_at = self.n
        restart = self._restart_after_first and n
        if restart:
            self._restart_after_first = False
            self._start_n, self._start_time = self.n, _clock()
        if self._bar is not None:
            if latest:  # shown now when no step follows (metrics of an evaluation)
                self._bar.set_postfix(self.latest, refresh=not n)
            if restart:
                bar = self._bar
                bar.reset(total=self.total)  # a new start time and rate estimate...
                bar.n = bar.last_print_n = bar.initial = self.n  # ...from the steps done
                bar.refresh()
            else:
                self._bar.update(int(n))
        elif self._lines is not None:
            every = self._line_every
            # Not after the compiling first step: its rate is not known yet, and an evaluation
            # of that step would print the same round again.
            due = n and not restart and every is not None and _clock() - self._last_line >= every
            if (latest and not n) or due:
                self._print_line()

    def eta(self) -> str:
        """The time left at the rate of the steps done in this session (after a compiling
        first step), as m:ss; "?" before that rate is known."""
        if self.n >= self.total:
            return duration(0.0)
        done = self.n - self._start_n
        if done <= 0:
            return "?"
        return duration((self.total - self.n) * (_clock() - self._start_time) / done)

    def line(self) -> str:
        """The plain progress line: `<desc>: round r/R, <evaluation metrics>, <others>, ETA`;
        the evaluation's metrics only on a line of the round they were measured at, the ETA
        only once it is known."""
        current = self._evaluated_at == self.n
        names = [*(self._evaluated if current else ()),
                 *(k for k in self.latest if k not in self._evaluated)]
        parts = [f"{self.unit} {self.n}/{self.total}"]
        parts += [f"{name} {self.latest[name]}" for name in names if name in self.latest]
        eta = self.eta()
        if eta != "?":
            parts.append(f"ETA {eta}")
        text = ", ".join(parts)
        return f"{self.desc}: {text}" if self.desc else text

    def _print_line(self) -> None:
        print(self.line(), file=self._lines, flush=True)
        self._last_line = _clock()

    def write(self, message: str) -> None:
        """Prints a line above the bar (nothing when quiet)."""
        if self._bar is not None:
            self._bar.write(message, file=self._bar.fp)
        elif self._lines is not None:
            print(message, file=self._lines, flush=True)
            self._last_line = _clock()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# -- what an interrupted command says ---------------------------------------------------------


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
