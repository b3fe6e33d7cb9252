"""A user's modules that registered methods, features, data sets, ...: found, recorded, imported.

A user's method is one module of theirs that calls `fjp.register_method(...)` when imported,
named by a config file that imports it. A run in the same process sees the registration; a
process that only reads what the run recorded does not: a sweep's shard jobs on other nodes
(`experiments.submit`, `experiments.sweep --shard`), `experiments.sweep --collect` by workdir.
So every `register_*` of the package notes which module called it (`note_registration`), a
sweep records the modules its runs need (`modules_for`, written to
`<workdir>/sweep_imports.json` by `experiment.sweep`), a run those of its own config
(`<run workdir>/imports.json`, read by `restore_run`), and a job imports them again
(`import_modules`) before it reads the config.

A module is recorded by its name, its file and the `sys.path` entry it was imported from, so
that a job started in another directory (a Slurm node's home) finds it. A module that is not
importable by its name (a config file loaded from its path) is loaded from its file. What
cannot travel is refused in one line naming the module and its file: a registration made in a
script run as `__main__` (it would run the whole script again); move it into a module that
the script imports.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from typing import Any, Iterable, Mapping, Sequence

# The kinds of registration, each with the config paths whose value names it (a method is
# named by algorithm.name, or by algorithm.weights when it lends its weights).
NAMED_BY = {
    "method": ("algorithm.name", "algorithm.weights"),
    "variant": (),
    "feature": (),
    "dataset": ("dataset.name",),
    "partition": ("partition.scheme",),
    "model": ("model",),
    "backend": ("engine.backend",),
    "server_optimizer": ("server.optimizer",),
    "personalization": ("evaluation.personalization",),
    "client_sampler": ("training.client_sampling",),
}
IMPORTS_FORMAT = 1
# A run's own record of the user modules its config needs (in its workdir, next to
# results.json; written only when there are some): `restore_run` imports them.
RUN_IMPORTS_FILE = "imports.json"


class ExtensionImportError(ImportError):
    """A module that a recorded sweep or run needs cannot be imported (one line: which, from
    where, why)."""


@dataclasses.dataclass(frozen=True)
class Registration:
    """One registration made by a module outside fedjax_pals."""

    kind: str
    name: str
    module: str
    config_keys: tuple[str, ...] = ()  # "algorithm.nova_server_lr": the config keys it declares
    # The module's file (a config file loaded by its path is not in sys.modules).
    file: str | None = None

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"


@dataclasses.dataclass(frozen=True)
class ExtensionModule:
    """A module to import again: its name, its file, the sys.path entry it came from (None:
    load it from its file), and what it registers (for messages)."""

    module: str
    file: str | None
    path: str | None
    registers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"registers": list(self.registers)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "ExtensionModule":
        return cls(
            str(value["module"]), value.get("file"), value.get("path"),
            tuple(value.get("registers") or ()),
        )


_REGISTRATIONS: dict[tuple[str, str], Registration] = {}


def _is_ours(module: str) -> bool:
    return module == "fedjax_pals" or module.startswith("fedjax_pals.")


def note_registration(kind: str, name: str, config_keys: Iterable[str] = ()) -> None:
    """Remembers which module registered `name` (called by every `register_*`): the code that
    called the `register_*` function. A built-in registration (or a user's replaced by one)
    is forgotten."""
    if kind not in NAMED_BY:
        raise ValueError(f"unknown registration kind {kind!r}; one of {list(NAMED_BY)}.")
    frame = sys._getframe(1)
    # Past the package's register_* functions, to the code that called them.
    while (
        frame is not None
        and _is_ours(frame.f_globals.get("__name__", ""))
        and frame.f_code.co_name.startswith(("register", "note_registration"))
    ):
        frame = frame.f_back
    module = None if frame is None else frame.f_globals.get("__name__")
    if not module or _is_ours(module):
        _REGISTRATIONS.pop((kind, name), None)
        return
    file = frame.f_globals.get("__file__")
    _REGISTRATIONS[(kind, name)] = Registration(
        kind, name, module, tuple(config_keys), os.path.abspath(file) if file else None
    )


def forget_registration(kind: str, name: str) -> None:
    _REGISTRATIONS.pop((kind, name), None)


def registrations() -> tuple[Registration, ...]:
    """The registrations made by modules outside fedjax_pals, in registration order."""
    return tuple(_REGISTRATIONS.values())


def needed_registrations(
    configs: Sequence[Mapping[str, Any]] = (),
    method_keys: Iterable[str] = (),
    *,
    resolved: Sequence[Mapping[str, Any]] = (),
) -> tuple[Registration, ...]:
    """The user registrations that these configs need to validate again: each one whose name
    is the value of one of its kind's `NAMED_BY` paths, whose config keys a config holds (any
    key of `configs`, as given: validation refuses a key it does not know; a key of a
    `resolved` config only when set, as a resolved config holds every registered key, None
    where unused), or (methods and variants) that one of `method_keys` names (a sweep's
    `sweep.methods`). The configs come flattened (`experiment.config.flatten`: "a.b" keys)."""
    values: dict[str, set] = {}
    keys: set[str] = set()
    for config, given in [(c, True) for c in configs] + [(c, False) for c in resolved]:
        for path, value in config.items():
            if given or value is not None:
                keys.add(path)
            if isinstance(value, str):
                values.setdefault(path, set()).add(value)
            elif isinstance(value, (list, tuple)):  # evaluation.personalization: names
                values.setdefault(path, set()).update(v for v in value if isinstance(v, str))
    named = set()
    for key in method_keys:
        # "fedadam_trimmed_mean_fedpals" names trimmed_mean: every run of its parts.
        parts = key.split("_")
        named.update("_".join(parts[i:j]) for i in range(len(parts))
                     for j in range(i + 1, len(parts) + 1))
    needed = []
    for registration in registrations():
        paths = NAMED_BY[registration.kind]
        by_name = any(registration.name in values.get(path, ()) for path in paths)
        by_key = any(key in keys for key in registration.config_keys)
        by_method_key = registration.kind in ("method", "variant") and registration.name in named
        if by_name or by_key or by_method_key:
            needed.append(registration)
    return tuple(needed)


def _import_root(module: str, file: str | None) -> str | None:
    """The sys.path entry from which `import module` finds `file`, or None."""
    if not file:
        return None
    file = os.path.abspath(file)
    parts = module.split(".")
    stem = os.path.splitext(file)[0]
    if os.path.basename(stem) == "__init__":
        stem = os.path.dirname(stem)
    tail = os.path.join(*parts)
    if not stem.endswith(os.sep + tail):
        return None
    return stem[: -len(tail) - 1] or os.sep


def describe(registrations_: Iterable[Registration]) -> tuple[ExtensionModule, ...]:
    """The modules behind `registrations_`, in order, each once."""
    modules: dict[tuple[str, str | None], list[str]] = {}
    for registration in registrations_:
        modules.setdefault((registration.module, registration.file), []).append(str(registration))
    out = []
    for (module, file), registers in modules.items():
        path = None if module == "__main__" else _import_root(module, file)
        out.append(ExtensionModule(module, file, path, tuple(registers)))
    return tuple(out)


def modules_for(
    configs: Sequence[Mapping[str, Any]] = (),
    method_keys: Iterable[str] = (),
    *,
    resolved: Sequence[Mapping[str, Any]] = (),
) -> tuple[ExtensionModule, ...]:
    """The user modules that these flattened configs need (`needed_registrations`)."""
    return describe(needed_registrations(configs, method_keys, resolved=resolved))


def check_portable(modules: Sequence[ExtensionModule], where: str) -> None:
    """Refuses (ExtensionImportError) a module that another process cannot import: one run as
    a script (`__main__`), or one with no file."""
    for module in modules:
        if module.module == "__main__" or not module.file:
            origin = module.file or "an interactive session"
            raise ExtensionImportError(
                f"{', '.join(module.registers)} {'is' if len(module.registers) == 1 else 'are'} "
                f"registered in {module.module} ({origin}), which {where} cannot import; move "
                "the registration into a module that your script or config file imports."
            )


def import_modules(modules: Sequence[ExtensionModule]) -> None:
    """Imports each recorded module that this process has not imported yet.

    Raises:
      ExtensionImportError: one line naming the module, its file and what went wrong.
    """
    check_portable(modules, "this process")
    for module in modules:
        if module.module in sys.modules:
            continue
        try:
            if module.path is not None:
                if module.path not in sys.path:
                    sys.path.append(module.path)
                importlib.import_module(module.module)
            else:
                if not os.path.isfile(module.file):
                    raise FileNotFoundError(f"{module.file} does not exist")
                spec = importlib.util.spec_from_file_location(module.module, module.file)
                loaded = importlib.util.module_from_spec(spec)
                sys.modules[module.module] = loaded
                try:
                    spec.loader.exec_module(loaded)
                except BaseException:
                    sys.modules.pop(module.module, None)
                    raise
        except Exception as error:  # noqa: BLE001 - whatever the user's module raises
            detail = " ".join(str(error).split()) or type(error).__name__
            raise ExtensionImportError(
                f"cannot import {module.module} ({module.file}), which registers "
                f"{', '.join(module.registers)}: {type(error).__name__}: {detail}"
            ) from None


def imports_record(modules: Sequence[ExtensionModule]) -> dict[str, Any]:
    """What a sweep_imports.json or a run's imports.json holds (`read_imports` reads it)."""
    return {"format": IMPORTS_FORMAT, "modules": [m.to_json() for m in modules]}


def read_imports(path: str) -> tuple[ExtensionModule, ...]:
    """The modules recorded in `path` (none if there is no such file)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as error:
        raise ExtensionImportError(f"cannot read {path}: {error}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("modules"), list):
        raise ExtensionImportError(f"{path} is not a record of imports (no 'modules' list).")
    try:
        return tuple(ExtensionModule.from_json(m) for m in data["modules"])
    except (KeyError, TypeError) as error:
        raise ExtensionImportError(f"{path}: a damaged module entry ({error}).") from None
