"""The experiments' config files as a launcher loads them, for the tests that check them: one
loader, the command line's (`experiments.config_args.load_config_file`), so that a test reads
`--config=configs/NAME:ARGUMENT` exactly as a user's command does."""

import importlib.util
import os
from types import ModuleType
from typing import Any

from experiments.config_args import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config_path(name: str) -> str:
    """configs/NAME in this repository (NAME with its .py)."""
    return os.path.join(ROOT, "configs", name)


def load_config(name_or_path: str | os.PathLike, argument: str = "") -> Any:
    """`get_config(argument)` (or `get_config()` without one) of configs/NAME, or of a path
    holding a separator; a mistake in the file or its argument is the launcher's one-line
    `ConfigArgError` (a ValueError) carrying the file's own message."""
    path = os.fspath(name_or_path)
    if os.sep not in path:
        path = config_path(path)
    return load_config_file(f"{path}:{argument}" if argument else path)


def config_module(name: str) -> ModuleType:
    """configs/NAME as a module, for a test that reads its constants (a seed set, its methods)."""
    spec = importlib.util.spec_from_file_location(f"config_{name.removesuffix('.py')}",
                                                  config_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
