"""Declared hyperparameters: config keys that validate themselves.

A method's (`algorithms/registry.py`: `Method`), a feature's (`Feature`) or a partition scheme's
hyperparameters are a frozen dataclass, a subclass of `Hyperparameters`, whose fields are
declared with `hyperparameter(default, ...)`: the field name is the config key (under
`algorithm.` or `partition.`), the declaration its default and its allowed values, so that the
config validator checks every key without knowing whose it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from fedjax_pals import _validation


@dataclasses.dataclass(frozen=True)
class _Check:
    kind: str  # real | integer | bool | choice | shape | text
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    optional: bool = False  # None allowed: "not set"
    why: str = ""  # appended to the allowed values in a message

    def __call__(self, name: str, value: Any) -> Any:
        if self.optional and value is None:
            return None
        if self.kind == "real":
            return _validation.check_number(
                name, value, low=self.low, high=self.high, low_open=self.low_open,
                high_open=self.high_open, why=self.why,
            )
        if self.kind == "integer":
            return _validation.check_integer(
                name, value, int(self.low if self.low is not None else -(2**63)),
                None if self.high is None else int(self.high), self.why,
            )
        if self.kind == "bool":
            return _validation.check_bool(name, value)
        if self.kind == "shape":
            return _validation.check_shape(name, value)
        if self.kind == "text":
            return _validation.check_text(name, value)
        return _validation.check_choice(name, value, self.choices, optional=self.optional)


_KINDS = ("real", "integer", "bool", "choice", "shape", "text")


def hyperparameter(
    default: Any, *, kind: str = "real", low: float | None = None, high: float | None = None,
    low_open: bool = False, high_open: bool = False, choices: tuple = (), optional: bool = False,
    why: str = "", doc: str = "", per_run: bool = False, shown: bool = False,
    axis: str | None = None, label: str | None = None, identity_when_unset: bool = False,
) -> Any:
    """A field of a `Hyperparameters` dataclass: its default and its allowed values.

    kind: "real" (a finite number in [low, high], either end open with low_open / high_open),
    "integer" (in [low, high]), "bool", "choice" (one of `choices`), "shape" (a tuple of
    positive integers, or "28,28,1") or "text" (a non-empty string: a column's name). optional: None is
    allowed too (the key is not set). why: a reason appended to the allowed values in the
    message of a bad value. per_run: its value is per-run data (held in the run's
    `ServerState`, or used on the host), not compiled into the round: runs that differ only
    in it share one compiled program on the engine's runs axis, and a sweep keeps them
    together (`config.per_run_state_keys`). shown: a run's TensorBoard HParams table shows it
    as a column by default (with the method, the seed and the learning rate). axis: keys that
    name the same axis are alternative ways to give one quantity (FedPALS' `lam` and
    `ess_fraction` both give lambda): a sweep's grid over them is one axis of their values
    (each point sets one key), not their product, and a base value of one of them is dropped
    where the grid sweeps the axis. label: its name on figures' axes ("λ"; None: the key).
    identity_when_unset: the key is in a run's identity (its digest) even when None, as the
    keys were that existed before the registry (so the digests of their recorded runs stay
    valid); every other key is left out while it is None.
    """
    if kind not in _KINDS:
        raise ValueError(f"hyperparameter kind must be one of {list(_KINDS)}, got {kind!r}.")
    if kind == "choice" and not choices:
        raise ValueError("a 'choice' hyperparameter needs its choices.")
    check = _Check(kind, low, high, low_open, high_open, tuple(choices), optional, why)
    check("the default", default)
    if axis is not None and (not isinstance(axis, str) or not axis.isidentifier()):
        raise ValueError(f"a hyperparameter's axis must be an identifier, got {axis!r}.")
    return dataclasses.field(
        default=default,
        metadata={"check": check, "doc": doc, "per_run": bool(per_run), "shown": bool(shown),
                  "axis": axis, "label": label, "identity_when_unset": bool(identity_when_unset)},
    )


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """Base of declared hyperparameters: a frozen dataclass that validates itself.

    Subclass it with `@dataclasses.dataclass(frozen=True)` and fields declared with
    `hyperparameter(...)`; the field names are config keys (`algorithm.<field>` of a method or
    a feature), so make them specific to their owner (`prox_mu`, not `mu`). Constructing it
    with a bad value raises ValueError naming the field.
    """

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is None:
                raise TypeError(
                    f"{type(self).__name__}.{field.name} must be declared with "
                    "fedjax_pals.hyperparameter(default, ...)."
                )
            object.__setattr__(self, field.name, check(field.name, getattr(self, field.name)))


def hyperparameter_checks(cls: type[Hyperparameters]) -> dict[str, Callable[[str, Any], Any]]:
    """{field name: check(name, value) -> value} of a `Hyperparameters` dataclass."""
    return {f.name: f.metadata["check"] for f in dataclasses.fields(cls)}


def hyperparameter_defaults(cls: type[Hyperparameters]) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def field_metadata(cls: type[Hyperparameters], what: str) -> dict[str, Any]:
    """{field name: its declared `what` ("shown", "axis", "label", "doc")} of `cls`."""
    return {f.name: f.metadata.get(what) for f in dataclasses.fields(cls)}


def per_run_fields(cls: type[Hyperparameters]) -> tuple[str, ...]:
    """The fields of `cls` declared `hyperparameter(..., per_run=True)`."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("per_run"))


@dataclasses.dataclass(frozen=True)
class NoHyperparameters(Hyperparameters):
    """No hyperparameters of its own (FedAvg)."""


def check_declared(owner: str, cls: type[Hyperparameters]) -> None:
    """`cls` is a `Hyperparameters` dataclass whose every field is a `hyperparameter(...)`: the
    registries read each field's check and default, so a plain field would fail later as
    KeyError: 'check'. owner: who declares it, for the message ("method 'fedprox'")."""
    if not (isinstance(cls, type) and issubclass(cls, Hyperparameters)):
        raise TypeError(f"{owner}: hyperparameters must be a Hyperparameters dataclass, got {cls!r}.")
    if "__dataclass_fields__" not in vars(cls):
        # Without the decorator the class's fields are its base's: its own are silently lost.
        raise TypeError(
            f"{owner}: its hyperparameters {cls.__name__} is not a dataclass; "
            "decorate it with @dataclasses.dataclass(frozen=True)."
        )
    for field in dataclasses.fields(cls):
        if "check" not in field.metadata:
            raise TypeError(
                f"{owner}: hyperparameter {field.name!r} of {cls.__name__} is a plain "
                f"dataclass field; declare it with fjp.hyperparameter(default, ...), e.g. "
                f"`{field.name}: float = fjp.hyperparameter(1.0, low=0.0)` (its allowed values "
                "make it a config key)."
            )


def declared_fields(
    owners: Mapping[str, type[Hyperparameters]],
) -> dict[str, tuple[Any, Callable[[str, Any], Any], tuple[str, ...]]]:
    """{field: (default, check, the owners that declare it)} of the owners' hyperparameters (a
    registry's: methods, data sets, partition schemes), in order."""
    fields: dict[str, tuple[Any, Callable, tuple[str, ...]]] = {}
    for owner, cls in owners.items():
        for field in dataclasses.fields(cls):
            default, check, users = fields.get(
                field.name, (field.default, field.metadata["check"], ())
            )
            fields[field.name] = (default, check, users + (owner,))
    return fields


def check_shared_fields(
    kind: str, name: str, cls: type[Hyperparameters], owners: Mapping[str, type], section: str,
    reserved: tuple[str, ...] = (),
) -> None:
    """A field name may be declared by two `kind`s (methods, ...) only alike: the config has
    one key `section.<field>`; and it is none of the section's own keys, `reserved`."""
    mine = {f.name: f for f in dataclasses.fields(cls)}
    if set(mine) & set(reserved):
        raise ValueError(
            f"{kind} {name!r}: {sorted(set(mine) & set(reserved))} are config keys of {section} "
            "already; give yours a name of its own."
        )
    for other, other_cls in owners.items():
        for field in dataclasses.fields(other_cls) if other != name else ():
            if field.name in mine and (
                field.metadata["check"] != mine[field.name].metadata["check"]
                or field.default != mine[field.name].default
            ):
                raise ValueError(
                    f"{kind} {name!r}: hyperparameter {field.name!r} is declared differently by "
                    f"{kind} {other!r} (one config key {section}.{field.name}); give yours a name "
                    "of its own."
                )
