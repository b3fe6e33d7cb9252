"""The command-line conventions of every main in experiments/ (absl only: no JAX, no package).

A mistake in a command line (an unknown flag, a value of the wrong type, an empty list, a
number out of range, a stray argument) is one `error: <message>` line on stderr and exit
status 2, before any data is read or any measurement starts. The checks are absl validators,
so they run while absl parses; `run(main)` replaces `app.run(main)` to turn absl's own
"FATAL Flags parsing error" and usage dump into that one line.

The mains with a config file (run, sweep, demo, ...) go through `experiments.flags.run`, which
adds the config checks on top of these; the benchmarks (experiments/benchmarks/: round, scaling,
solve_time, flower) call `run` here, so that their `--help` lists their own flags only.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
import types
from typing import Callable, Iterable

from absl import app, flags

# Exit status of a command-line mistake (absl's own for a flag error, argparse's too).
USAGE_ERROR_STATUS = 2


def lazy_import(name: str) -> types.ModuleType:
    """`import name` (a top-level package), run at the first use of one of its attributes
    (`importlib.util.LazyLoader`): a main's `--help` prints without importing fedjax_pals,
    and with it JAX (seconds; half a minute on a loaded machine)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The packages the mains live in: the repository's folder, and its name once installed.
MAIN_PACKAGES = ("experiments", "fedjax_pals_experiments")
SCRIPT_PREFIX = "fedjax-pals-"


def script_name(main: str) -> str:
    """The console script of a main: "sweep" -> fedjax-pals-sweep, "benchmarks.solve_time" ->
    fedjax-pals-benchmark-solve-time (pyproject.toml's [project.scripts])."""
    return SCRIPT_PREFIX + main.replace("benchmarks.", "benchmark-").replace("_", "-")


def _python() -> str:
    """This interpreter as a user would type it: `python` (or `python3`) when that is the one
    on PATH, else its path (a venv's python run by its path, the venv not active)."""
    executable = sys.executable or "python"
    for name in ("python", "python3", os.path.basename(executable)):
        found = shutil.which(name)
        # Paths as they are, not resolved: a venv's python links to the system's.
        if found and os.path.abspath(found) == os.path.abspath(executable):
            return name
    return executable


def command_for(main: str, argv0: str | None = None, main_module: str | None = None) -> str:
    """The command that runs the main `main` ("sweep", "benchmarks.round") the way this process
    was launched, for the hints a main prints (`--collect` after the shards, ...):
    `python -m experiments.sweep` when launched as `python -m experiments.<main>` (from the
    repository root), `python -m fedjax_pals_experiments.sweep` when so, `fedjax-pals-sweep`
    when launched as a console script (its path if its folder is not on PATH). Otherwise
    (the main called from Python) the console script, which runs from any directory.

    `argv0` and `main_module` default to sys.argv[0] and the name `__main__` was run as."""
    if main_module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        main_module = getattr(spec, "name", None)
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
    package = (main_module or "").partition(".")[0]
    if package in MAIN_PACKAGES:
        return f"{_python()} -m {package}.{main}"
    name = script_name(main)
    found = shutil.which(name)
    if os.path.basename(argv0 or "").startswith(SCRIPT_PREFIX) and os.path.dirname(argv0):
        beside = os.path.join(os.path.dirname(argv0), name)
        if found and os.path.abspath(found) == os.path.abspath(beside):
            return name
        # Its folder (a venv's bin/) is not on PATH, or another comes first: as it was typed.
        return beside
    if not found:  # called from Python: the script of this interpreter's environment
        beside = os.path.join(os.path.dirname(sys.executable or ""), name)
        if os.path.isfile(beside):
            return beside
    return name


def usage_error(message: str) -> None:
    """Prints `error: <message>` (one line) on stderr and exits with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(USAGE_ERROR_STATUS)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with a flag error as one `error:` line and exit status 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        usage_error(str(error))


# absl's help flags: it prints the help and exits with status 1, as for an error.
HELP_FLAGS = ("--help", "-help", "-h", "--helpshort", "-helpshort", "--helpfull", "-helpfull",
              "--helpxml", "-helpxml", "-?")


def asked_for_help(argv: list[str]) -> bool:
    """A help flag before any `--` (what follows `--` is another command's)."""
    before = argv[1: argv.index("--")] if "--" in argv else argv[1:]
    return any(arg in HELP_FLAGS for arg in before)


def run_app(main: Callable[[list[str]], object], **kwargs) -> None:
    """`app.run(main, **kwargs)`, with status 0 after the help a user asked for."""
    try:
        app.run(main, **kwargs)
    except SystemExit as exit_:
        if exit_.code == 1 and asked_for_help(kwargs.get("argv") or sys.argv):
            sys.exit(0)
        raise


def show_main_flags_in_help(main: Callable) -> None:
    """absl's --help shows the docstring of the program's main module and the flags it keys by
    sys.argv[0]: run as `python -m experiments.sweep` that is the module that defined them, but
    run as the `fedjax-pals-sweep` command it is the command's script, and the usage text and
    the flags of `main`'s module would not show."""
    module = getattr(main, "__module__", None)
    if module and module != "__main__":
        for flag in flags.FLAGS.get_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
        # absl's usage text is the docstring of __main__: the command's script has none.
        script = sys.modules.get("__main__")
        if script is not None and not getattr(script, "__doc__", None):
            script.__doc__ = sys.modules[module].__doc__


def run(main: Callable[[list[str]], object]) -> None:
    """`app.run(main)` with `parse_flags`; a positional argument is refused the same way
    (absl passes it to `main`, where it would be silently ignored)."""
    show_main_flags_in_help(main)

    def checked_main(argv: list[str]):
        if len(argv) > 1:
            usage_error(f"unexpected arguments {argv[1:]} (flags are written --name=value).")
        return main(argv)

    run_app(checked_main, flags_parser=parse_flags)


def _interval(low: float, high: float, include_low: bool, include_high: bool) -> str:
    if high == math.inf:
        return f"{'>=' if include_low else '>'} {low:g}"
    if low == -math.inf:
        return f"{'<=' if include_high else '<'} {high:g}"
    return f"{'[' if include_low else '('}{low:g}, {high:g}{']' if include_high else ')'}"


def _number_problem(
    text: str,
    low: float,
    high: float,
    include_low: bool,
    include_high: bool,
    integer: bool,
    meaning: str,
    listed: bool = False,
) -> str | None:
    kind = "an integer" if integer else "a number"
    give = ("integers" if integer else "numbers") if listed else kind
    what = f" ({meaning})" if meaning else ""
    interval = _interval(low, high, include_low, include_high)
    where = interval if math.inf in (abs(low), abs(high)) else f"in {interval}"
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        listing = ", comma-separated" if listed else ""
        return f"{str(text)!r} is not {kind}; give {give} {where}{what}{listing}."
    above = value >= low if include_low else value > low
    below = value <= high if include_high else value < high
    if not (above and below):  # NaN fails both
        return f"{text} is {'not' if where == interval else 'outside'} {interval}{what}."
    return None


def check_number(
    holder: flags.FlagHolder,
    low: float,
    high: float = math.inf,
    *,
    include_low: bool = True,
    include_high: bool = True,
    meaning: str = "",
) -> None:
    """Registers a check (run while absl parses) that a numeric flag lies in the interval."""

    def check(value) -> bool:
        if value is None:
            return True
        problem = _number_problem(
            value, low, high, include_low, include_high, isinstance(value, int), meaning
        )
        if problem:
            raise flags.ValidationError(problem)
        return True

    flags.register_validator(holder, check)


def check_number_list(
    holder: flags.FlagHolder,
    low: float,
    high: float = math.inf,
    *,
    include_low: bool = True,
    include_high: bool = True,
    integer: bool = False,
    meaning: str = "",
) -> None:
    """Registers a check (run while absl parses) that every item of a list flag is a number
    (an integer with `integer`) in the interval; a bad item is named in the one `error:` line.
    An empty list (`--name=`) is refused.
    """
    kind = "integers" if integer else "numbers"
    interval = _interval(low, high, include_low, include_high)

    def check(values) -> bool:
        if values is None:
            return True
        items = [text.strip() for text in values]
        if not [text for text in items if text]:
            where = interval if math.inf in (abs(low), abs(high)) else f"in {interval}"
            what = f" ({meaning})" if meaning else ""
            raise flags.ValidationError(
                f"--{holder.name} needs at least one of the {kind} {where}{what}."
            )
        for text in items:
            problem = _number_problem(
                text, low, high, include_low, include_high, integer, meaning, listed=True
            )
            if problem:
                raise flags.ValidationError(problem)
        return True

    flags.register_validator(holder, check)


def check_count_or_auto(holder: flags.FlagHolder) -> None:
    """Registers a check that a string flag is an integer >= 1 or 'auto'."""

    def check(value) -> bool:
        if value in (None, "auto"):
            return True
        try:
            count = int(value)
        except ValueError:
            count = 0
        if count < 1:
            raise flags.ValidationError(f"must be an integer >= 1 or 'auto', got {value!r}.")
        return True

    flags.register_validator(holder, check)


def check_choices(holder: flags.FlagHolder, choices: Iterable[str], what: str) -> None:
    """Registers a check that a string flag (or every item of a list flag) is one of
    `choices`; the error lists them."""
    known = tuple(choices)

    def check(value) -> bool:
        if value is None:
            return True
        items = [value] if isinstance(value, str) else [v.strip() for v in value]
        if not items or not all(items):
            raise flags.ValidationError(f"--{holder.name} needs a {what}; choose among {known}.")
        for item in items:
            if item not in known:
                raise flags.ValidationError(f"unknown {what} {item!r}; choose among {known}.")
        return True

    flags.register_validator(holder, check)


def require_items(holder: flags.FlagHolder, what: str) -> None:
    """Registers a check (while absl parses) that a list flag, when given, names at least one
    item: `--tables=` is a mistake, not an empty merge."""

    def check(values) -> bool:
        if values is not None and not [v for v in values if v.strip()]:
            raise flags.ValidationError(f"--{holder.name} needs at least one {what}.")
        return True

    flags.register_validator(holder, check)


def require_value(holder: flags.FlagHolder, what: str) -> None:
    """Registers a check (while absl parses) that a string flag is not empty: `--output=`
    would otherwise fail only when the result is written, after the whole measurement."""

    def check(value) -> bool:
        if value is not None and not value.strip():
            raise flags.ValidationError(f"--{holder.name} needs a {what}.")
        return True

    flags.register_validator(holder, check)
