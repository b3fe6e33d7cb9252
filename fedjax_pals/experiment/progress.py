"""What a run says while it works: a progress bar with ETA over rounds (or over the runs of a
sweep) showing the latest metrics, plain progress lines without a terminal, and its result line.

`Progress` is a thin wrapper over `tqdm` (written to stderr, so stdout keeps a program's
results). `quiet=True` prints nothing at all (for CI and for processes other than the main
one). On the default stream the bar draws itself only when stderr is a terminal with columns;
in a log file, a pipe (`tee`, `nohup`, CI) or a 0-column pty it prints plain lines instead: one
per evaluation (`round 4/30, target acc 85.2%, val acc 84.9%, ETA 0:52`) and otherwise at most
one every `LINE_INTERVAL_SECONDS`, besides the lines of `write`. What an interrupted command says: `interruption.py`.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import time
from typing import Any, TextIO

import numpy as np

# Without a terminal: at most one progress line this often, besides one per evaluation.
LINE_INTERVAL_SECONDS = 30.0

_clock = time.monotonic  # the lines' clock (tests replace it)


# What a value of None shows: the training loss of a Poisson round that drew no client (a
# round that trained nothing has no loss; 0 would read as a perfect fit).
NO_VALUE = "n/a (no client drawn)"


def _format(value: Any) -> str:
    if value is None:
        return NO_VALUE
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
    as in the tables, a DP run's epsilon and delta (DP on updates: spent through the last round,
    results.json's `dp_epsilon`, per client; label DP's, per example), and the time of this
    launch, with the round it began after when `start_round` > 0 (a resume or an extension).
    One clock: the training time summed over the launches is results.json's `wall_seconds`."""
    line = (
        f"final target accuracy {percent(results['final_target_accuracy'])}; at best val "
        f"(round {results['best_val_round']}) {percent(results['target_accuracy_at_best_val'])}; "
    )
    if results.get("dp_epsilon") is not None:  # DP on updates: what the rounds spent
        line += (f"DP epsilon {results['dp_epsilon']:.4g} at delta {results['dp_delta']:g} "
                 "(per client); ")
    label_dp = (results.get("config") or {}).get("algorithm") or {}
    if label_dp.get("label_dp_epsilon") is not None:  # resolved: None where no S is read
        delta = label_dp.get("label_dp_delta")
        line += (f"label DP epsilon {label_dp['label_dp_epsilon']:g}"
                 + (f" at delta {delta:g}" if delta is not None else "") + " (per example); ")
    line += f"{launch_seconds:.1f} s this launch"
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
