"""A progress bar with ETA over rounds (or over the runs of a sweep), showing the latest metrics.

A thin wrapper over `tqdm` (written to stderr, so stdout keeps a program's results). `quiet=True`
prints nothing at all (for CI and for processes other than the main one). On the default stream,
the bar draws itself only when stderr is a terminal: in a log file or a pipe, only the lines of
`write` appear.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any, TextIO

import numpy as np


def _format(value: Any) -> str:
    if isinstance(value, str):
        return value
    number = float(np.asarray(value))
    return f"{number:.4g}"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """`total` steps of `unit`; `update(n, **latest)` advances by n and shows `latest`.

    Args:
      total: number of steps (rounds, runs), >= 0.
      desc: a label in front of the bar.
      initial: steps already done (a resumed run starts its bar there; the ETA counts only
        the steps done now).
      quiet: no output at all.
      unit: what a step is called ("round", "run").
      file: where the bar goes (default stderr, and then only if stderr is a terminal).
      first_step_compiles: the first step of this session includes XLA's compilation, so the
        rate, the elapsed time and the ETA restart after it (a 40 s round is not shown as the
        111 s a compiling first round took).
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
    ):
        for name, value in (("total", total), ("initial", initial)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"Progress {name} must be an integer >= 0, got {value!r}.")
        if initial > total:
            raise ValueError(f"Progress initial must be <= total ({total}), got {initial}.")
        self.total = int(total)
        self.n = int(initial)
        self.quiet = bool(quiet)
        self.latest: dict[str, str] = {}
        self._bar = None
        self._lines: TextIO | None = None  # where write() goes when there is no bar
        self._restart_after_first = bool(first_step_compiles)
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
        if self._bar is not None:
            if latest:  # shown now when no step follows (metrics of an evaluation)
                self._bar.set_postfix(self.latest, refresh=not n)
            if self._restart_after_first and n:
                self._restart_after_first = False
                bar = self._bar
                bar.reset(total=self.total)  # a new start time and rate estimate...
                bar.n = bar.last_print_n = bar.initial = self.n  # ...from the steps done
                bar.refresh()
            else:
                self._bar.update(int(n))

    def write(self, message: str) -> None:
        """Prints a line above the bar (nothing when quiet)."""
        if self._bar is not None:
            self._bar.write(message, file=self._bar.fp)
        elif self._lines is not None:
            print(message, file=self._lines, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
