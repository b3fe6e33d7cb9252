"""The `--config=<file>` and `--config.<path>=<value>` arguments, checked before absl parses them.

ml_collections loads the config file and applies every `--config.<path>` override while absl
parses the flags, before `validate_config` runs: a missing file, a syntax error in it, or a
typo in a key path would surface there as a traceback (or as a bare `KeyError`). The mains
call `check_config_argv` first (through `experiments.flags.run`): it loads the file itself and
walks each override's path through the loaded config, so that such a mistake is one line
naming the file or the key, with "did you mean" where a near name exists.

A sweep's grid and task axes are open-ended: `--config.sweep.grid.algorithm.lam='(0.0,)'` adds
an axis that the file's grid does not have (ml_collections cannot create it), which is fine
when `algorithm.lam` is a key of the run config. Such overrides (and `sweep.<key>` for a sweep
key the file leaves out) are taken out of argv and returned, to be set on the parsed config by
`apply_new_keys`.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import sys
import traceback
from typing import Any, Mapping, Sequence


class ConfigArgError(ValueError):
    """A config file or override that cannot be used (the message names it; `hint`, when set,
    is a second line saying what to do)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


# Sections of the sweep whose keys are run-config paths (new ones are legitimate axes).
_AXIS_SECTIONS = ("grid", "axes")


def _near(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def find_config_path(argv: Sequence[str], name: str) -> tuple[str | None, int]:
    """The value of `--<name>` in argv (and its index), else (None, -1)."""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        match = re.fullmatch(rf"--?{re.escape(name)}(=(.*))?", arg, re.S)
        if match:
            if match.group(1) is not None:
                return match.group(2), i
            if i + 1 < len(argv):
                return argv[i + 1], i
            return None, i
    return None, -1


def _same_directory(entry: str, directory: str) -> bool:
    try:
        return os.path.realpath(entry or os.getcwd()) == os.path.realpath(directory)
    except (OSError, ValueError):
        return False


def add_config_directory(spec: str | None, path: list[str] | None = None) -> str | None:
    """Puts the directory of the config file `spec` (`file.py` or `file.py:argument`) first on
    the import path (`sys.path`), as Python does for a script's: a config file imports a module
    of the user's that lies beside it (`import my_extension`) from whichever directory the
    command runs, `python -m` or a console script alike. A directory already on the path
    (`python -m` run from it) stays where it is. Returns the directory, or None when `spec`
    names no file (the config check reports that).

    A sweep's shard jobs need not get it: the modules a sweep's runs need are recorded with the
    directory they were imported from (`fedjax_pals.extensions`) and imported from there."""
    file = (spec or "").partition(":")[0]
    if not file or not os.path.isfile(file):
        return None
    directory = os.path.dirname(os.path.abspath(file))
    entries = sys.path if path is None else path
    if not any(_same_directory(entry, directory) for entry in entries):
        entries.insert(0, directory)
    return directory


def _where_raised(error: BaseException) -> str:
    """' (at FILE, line N: CODE)': the innermost frame of the error's traceback outside
    importlib's own, i.e. the user's line that failed; '' without one."""
    frames = [
        f for f in traceback.extract_tb(error.__traceback__)
        if not f.filename.startswith("<frozen ")
    ]
    if not frames:
        return ""
    frame = frames[-1]
    code = f": {frame.line.strip()}" if frame.line and frame.line.strip() else ""
    return f" (at {os.path.normpath(frame.filename)}, line {frame.lineno}{code})"


def _import_hint(error: ImportError, path: str, command: str) -> str | None:
    """What to do about a module that a config file (or a module it imports) cannot find."""
    name = getattr(error, "name", None)
    if not isinstance(error, ModuleNotFoundError) or not name:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    top = name.partition(".")[0]
    return (
        f"hint: {top!r} is looked for beside the config file (in {directory}) and on the "
        "import path (sys.path): a module of yours elsewhere needs its directory on PYTHONPATH "
        f"(PYTHONPATH=/its/directory {command} ...); a package needs installing into this "
        f"environment ({sys.executable} -m pip install ...)."
    )


def load_config_file(spec: str, flag: str = "config", command: str = "<command>") -> Any:
    """Loads `get_config()` of a config file as ml_collections does; a mistake is one line (a
    module it cannot import: with a hint naming `command`, the launcher, as a second)."""
    path, _, argument = spec.partition(":")
    where = f"--{flag}={spec}"
    if not path:
        raise ConfigArgError(f"{where}: the config file path is empty.")
    if not os.path.isfile(path):
        directory = os.path.dirname(path) or "."
        try:
            siblings = [
                os.path.join(os.path.dirname(path), f)
                for f in os.listdir(directory)
                if f.endswith(".py")
            ]
        except OSError:
            siblings = []
        what = "is a directory, not a config file" if os.path.isdir(path) else "does not exist"
        raise ConfigArgError(f"{where}: the config file {path} {what}{_near(path, siblings)}.")
    try:
        module_spec = importlib.util.spec_from_file_location(f"{flag}_config_check", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigArgError(
            f"{where}: syntax error in {path}, line {error.lineno}: {error.msg}."
        ) from None
    except ImportError as error:  # the config file's imports, or those of a module of yours
        raise ConfigArgError(
            f"{where}: loading {path} raised {type(error).__name__}: {_one_line(error)}"
            f"{_where_raised(error)}",
            hint=_import_hint(error, path, command),
        ) from None
    except Exception as error:  # noqa: BLE001 - whatever the file raises is the user's to fix
        raise ConfigArgError(
            f"{where}: loading {path} raised {type(error).__name__}: {_one_line(error)}"
        ) from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigArgError(f"{where}: {path} defines no get_config() function.")
    try:
        config = get_config(argument) if argument else get_config()
    except Exception as error:  # noqa: BLE001
        raise ConfigArgError(
            f"{where}: {path}: get_config() raised {type(error).__name__}: {_one_line(error)}"
        ) from None
    if not isinstance(config, Mapping) and not hasattr(config, "keys"):
        raise ConfigArgError(
            f"{where}: {path}: get_config() returned {type(config).__name__}, not a ConfigDict."
        )
    return config


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _keys(node: Any) -> list[str] | None:
    """The keys of a section (ConfigDict or mapping), None for a leaf."""
    if isinstance(node, Mapping) or (hasattr(node, "keys") and hasattr(node, "__getitem__")):
        return [str(k) for k in node.keys()]
    return None


def _overrides(argv: Sequence[str], flag: str):
    """(index, path, value text or None, how many argv entries) of each `--<flag>.<path>`."""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        match = re.fullmatch(rf"--?(no)?{re.escape(flag)}\.([^=]*)(=(.*))?", arg, re.S)
        if not match:
            continue
        negated, path, has_value, value = match.groups()
        if has_value is not None:
            yield i, path, value, 1, negated
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            yield i, path, argv[i + 1], 2, negated
        else:
            yield i, path, None, 1, negated


def _literal(text: str | None, negated: str | None) -> Any:
    if text is None:
        return not negated
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _new_axis(flag: str, parts: Sequence[str], schema_paths: set[str]) -> bool:
    axis = ".".join(parts[2:])
    if axis in schema_paths:
        return True
    raise ConfigArgError(
        f"{flag}: {axis!r} is not a config key, so it cannot be a sweep {parts[1]} "
        f"axis{_near(axis, schema_paths)}."
    )


def check_override(config: Any, path: str, schema_paths: set[str], sweep_keys: Sequence[str]):
    """Checks one override path against the loaded config.

    Returns:
      False when the path exists in the config (ml_collections applies it), True when it is a
      legitimate new key (a grid or task axis over a run-config key, or a sweep key the file
      leaves out) to be set after parsing.

    Raises:
      ConfigArgError: the path names no key (and none it could legitimately add).
    """
    flag = f"--config.{path}"
    parts = path.split(".")
    if not all(parts):
        raise ConfigArgError(f"{flag}: {path!r} is not a key path (empty component).")
    node = config
    for depth, part in enumerate(parts):
        where = ".".join(["config", *parts[:depth]])
        keys = _keys(node)
        if node is None and parts[0] == "sweep" and parts[1] in _AXIS_SECTIONS and depth == 2:
            keys = []  # an empty grid/axes section written as None
        if keys is None:
            raise ConfigArgError(
                f"{flag}: {where} is a value ({node!r}), not a section, so it has no key "
                f"{part!r}."
            )
        if part in keys:
            node = node[part]
            continue
        # A key the config does not hold: legitimate only as a new sweep key or axis.
        if parts[0] == "sweep" and depth == 1:
            if part in _AXIS_SECTIONS and len(parts) > 2:
                return _new_axis(flag, parts, schema_paths)
            if part in sweep_keys:
                return True
            raise ConfigArgError(
                f"{flag}: {part!r} is not a sweep key{_near(part, [*keys, *sweep_keys])}; the "
                f"sweep keys are {list(sweep_keys)}."
            )
        if parts[0] == "sweep" and len(parts) > 2 and parts[1] in _AXIS_SECTIONS and depth >= 2:
            return _new_axis(flag, parts, schema_paths)
        near = _near(part, keys)
        if not near and depth == 0:
            near = _near(path, schema_paths)
        raise ConfigArgError(f"{flag}: {where} has no key {part!r}{near}.")
    return False


def check_config_argv(
    argv: Sequence[str],
    flag: str,
    default: str | None,
    *,
    schema_paths: set[str],
    sweep_keys: Sequence[str],
    command: str = "<command>",
) -> tuple[list[str], dict[str, Any]]:
    """Checks the config file and overrides in argv.

    Returns:
      argv without the overrides that add new sweep keys or axes, and those as {path: value};
      of a key given twice, only the last.

    Raises:
      ConfigArgError: one line naming the file or the key path.
    """
    spec, _ = find_config_path(argv, flag)
    if spec is None:
        spec = default
    overrides = list(_overrides(argv, flag))
    if spec is None:
        return list(argv), {}  # absl reports the missing required flag
    config = load_config_file(spec, flag, command)
    new: dict[str, Any] = {}
    dropped: set[int] = set()
    # A key given twice: the last wins, as for any absl flag (ml_collections would append a
    # tuple's second value to the first: seeds=(0,1) then seeds=(5,) ran seeds 0, 1 and 5).
    last = {path: i for i, path, *_ in overrides}
    for i, path, _, count, _ in overrides:
        if last[path] != i:
            dropped.update(range(i, i + count))
    overrides = [o for o in overrides if last[o[1]] == o[0]]
    for i, path, text, count, negated in overrides:
        if check_override(config, path, schema_paths, sweep_keys):
            new[path] = _literal(text, negated)
            dropped.update(range(i, i + count))
    return [a for i, a in enumerate(argv) if i not in dropped], new


def apply_new_keys(config: Any, new: Mapping[str, Any]) -> None:
    """Sets the overrides `check_config_argv` took out of argv, creating their sections."""
    import ml_collections

    if not new:
        return
    unlocked = config.unlocked() if hasattr(config, "unlocked") else None
    if unlocked is not None:
        unlocked.__enter__()
    try:
        for path, value in new.items():
            *sections, leaf = path.split(".")
            node = config
            for section in sections:
                child = node.get(section) if hasattr(node, "get") else None
                if child is None:
                    node[section] = ml_collections.ConfigDict()
                    child = node[section]
                node = child
            node[leaf] = value
    finally:
        if unlocked is not None:
            unlocked.__exit__(None, None, None)
