"""The method registry: a federated method is registered once, under one name used everywhere.

A `Method` ties together what the rest of the package needs to know about a method:

* `name`: the key of `algorithm.name` in a config, of `sweep.methods` in a sweep, of the
  table's column and of the built `FederatedAlgorithm.name`;
* `label`: the column header of tables and the legend of figures ("FedProx");
* `hyperparameters`: a frozen dataclass (a subclass of `Hyperparameters`) whose fields are the
  method's config keys `algorithm.<field>`, each declared with its default and its allowed
  values (`hyperparameter(...)`), so that it validates itself on construction and the config
  validator checks the keys without knowing the method;
* `grid`: the values of its hyperparameters the selection protocol tries (`protocol_grid`);
* `build(hyperparameters, context) -> FederatedAlgorithm`: the algorithm, given the run's
  `MethodContext` (the partition with the server's T, FedPALS' lambda, the weighting asked
  for by `algorithm.weights`);
* `client_side`: the method changes only local training, so it combines with FedPALS' server
  weights under the key `<name>_fedpals` ("FedProx+FedPALS");
* `partition_transform`: how the method redraws the clients' data before training (the
  Oracle's resampling to T, FedPALS App. B.5).

A *variant* is a registered key that means another method with some config keys set
(`fedpals_adaptive` is FedPALS with `algorithm.lam_schedule='hypergradient'`): it has a name
and a label, and `method_overrides(key)` gives its config keys.

A user's method is one module of theirs: define the hyperparameters and the builder, call
`register_method(Method(...))` at import time, and name the method in a config file that
imports the module (README, "Extending fedjax_pals").
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from fedjax_pals import _validation
# A server optimiser in front of a method key sets config.server.optimizer: "fedadam_fedpals"
# is FedPALS with FedAdam's server step, a bare "fedadam" is FedAvg with it. Their labels live
# with the optimisers (importable from here as before).
from fedjax_pals.server_optimizers import SERVER_OPTIMIZER_LABELS

if TYPE_CHECKING:  # the methods and the data (its data sets, partitions) import the registry
    from fedjax_pals.algorithms import FederatedAlgorithm, Weighting
    from fedjax_pals.data import FederatedPartition

# The suffix of a client-side method's key with FedPALS' server weights: "fedprox_fedpals".
FEDPALS_SUFFIX = "_fedpals"


# -- hyperparameters --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Check:
    kind: str  # real | integer | bool | choice
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()

    def __call__(self, name: str, value: Any) -> Any:
        if self.kind == "real":
            return _validation.check_number(
                name,
                value,
                low=self.low,
                high=self.high,
                low_open=self.low_open,
                high_open=self.high_open,
            )
        if self.kind == "integer":
            return _validation.check_integer(
                name, value, int(self.low if self.low is not None else -(2**63)),
                None if self.high is None else int(self.high),
            )
        if self.kind == "bool":
            return _validation.check_bool(name, value)
        return _validation.check_choice(name, value, self.choices)


_KINDS = ("real", "integer", "bool", "choice")


def hyperparameter(
    default: Any,
    *,
    kind: str = "real",
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple = (),
    doc: str = "",
) -> Any:
    """A field of a `Hyperparameters` dataclass: its default and its allowed values.

    kind: "real" (a finite number in [low, high], either end open with low_open / high_open),
    "integer" (in [low, high]), "bool", or "choice" (one of `choices`).
    """
    if kind not in _KINDS:
        raise ValueError(f"hyperparameter kind must be one of {list(_KINDS)}, got {kind!r}.")
    if kind == "choice" and not choices:
        raise ValueError("a 'choice' hyperparameter needs its choices.")
    check = _Check(kind, low, high, low_open, high_open, tuple(choices))
    check("the default", default)
    return dataclasses.field(default=default, metadata={"check": check, "doc": doc})


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """Base of a method's hyperparameters: a frozen dataclass that validates itself.

    Subclass it with `@dataclasses.dataclass(frozen=True)` and fields declared with
    `hyperparameter(...)`; the field names are the config keys `algorithm.<field>`, so make
    them specific to the method (`prox_mu`, not `mu`). Constructing it with a bad value
    raises ValueError naming the field.
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


@dataclasses.dataclass(frozen=True)
class NoHyperparameters(Hyperparameters):
    """A method without hyperparameters of its own (FedAvg)."""


# -- methods ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MethodContext:
    """What a method's builder may read of the run.

    partition: the clients the run trains (S_i, n_i, label counts) with the T the server's
      weights use (T, Table 2's perturbed T_p, or the clients' aggregate when T is estimated).
    lam: FedPALS' lambda, resolved from algorithm.lam or algorithm.ess_fraction (None when
      the run does not use FedPALS' weights).
    weighting: for a client-side method, the server weighting asked for by
      algorithm.weights (None: FedAvg's n_i / N).
    """

    partition: FederatedPartition | None = None
    lam: float | None = None
    weighting: Weighting | None = None


Builder = Callable[[Any, MethodContext], "FederatedAlgorithm"]
PartitionTransform = Callable[["FederatedPartition", np.ndarray, int], "FederatedPartition"]


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered federated method (see the module docstring)."""

    name: str
    label: str
    build: Builder
    hyperparameters: type[Hyperparameters] = NoHyperparameters
    grid: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    client_side: bool = False
    reads_target: bool = False
    partition_transform: PartitionTransform | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"a method's name must be a Python identifier (it is a config value and a "
                f"directory name), got {self.name!r}."
            )
        if self.name.endswith(FEDPALS_SUFFIX):
            raise ValueError(
                f"a method's name must not end in {FEDPALS_SUFFIX!r} (reserved for a client-side "
                f"method with FedPALS' weights), got {self.name!r}."
            )
        check_declared(f"method {self.name!r}", self.hyperparameters)
        fields = hyperparameter_checks(self.hyperparameters)
        for key, values in dict(self.grid).items():
            if key not in fields:
                raise ValueError(
                    f"method {self.name!r}: grid key {key!r} is not one of its hyperparameters "
                    f"{sorted(fields)}."
                )
            if not isinstance(values, tuple) or not values:
                raise ValueError(
                    f"method {self.name!r}: grid[{key!r}] must be a non-empty tuple, got {values!r}."
                )
            for value in values:
                fields[key](f"method {self.name!r} grid value {key}", value)

    def make(self, context: MethodContext | None = None, **values: Any) -> FederatedAlgorithm:
        """The algorithm with these hyperparameter values (the others at their defaults)."""
        known = hyperparameter_checks(self.hyperparameters)
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"{self.name} has no hyperparameter(s) {unknown}; its hyperparameters are "
                f"{sorted(known) or 'none'}."
            )
        algorithm = self.build(self.hyperparameters(**values), context or MethodContext())
        from fedjax_pals.algorithms.base import FederatedAlgorithm  # its package imports us

        if not isinstance(algorithm, FederatedAlgorithm):
            # Caught here, not at the first `_replace` or inside the compiled round.
            raise ValueError(
                f"method {self.name!r}: its build(hyperparameters, context) returned "
                f"{type(algorithm).__name__}, not a fedjax_pals.FederatedAlgorithm (e.g. "
                "fjp.fedavg()._replace(server_update=...))."
            )
        return algorithm._replace(name=self.key(context))

    def key(self, context: MethodContext | None = None) -> str:
        weighting = context.weighting if context is not None else None
        if self.client_side and weighting is not None and weighting.name != "fedavg":
            return f"{self.name}_{weighting.name}"
        return self.name


def check_declared(owner: str, cls: type[Hyperparameters]) -> None:
    """`cls` is a `Hyperparameters` dataclass whose every field is a `hyperparameter(...)`: the
    registry reads each field's check and default, so a plain field would fail later as
    KeyError: 'check'. owner: who declares it, for the message ("method 'fedprox'")."""
    if not (isinstance(cls, type) and issubclass(cls, Hyperparameters)):
        raise TypeError(
            f"{owner}: hyperparameters must be a Hyperparameters dataclass, got {cls!r}."
        )
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


@dataclasses.dataclass(frozen=True)
class Variant:
    """A key that means a registered method with some config keys set."""

    name: str
    label: str
    method: str
    overrides: Mapping[str, Any]


_METHODS: dict[str, Method] = {}
_VARIANTS: dict[str, Variant] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Registers `method` under `method.name` (again with replace=True, e.g. on a reload).

    A hyperparameter field name may be shared by two methods only with the same declaration
    (the config has one key `algorithm.<field>`).
    """
    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a fedjax_pals.Method, got {type(method).__name__}.")
    if not replace and (method.name in _METHODS or method.name in _VARIANTS):
        raise ValueError(
            f"a method {method.name!r} is already registered; pick another name, or pass "
            "replace=True to redefine it."
        )
    owners = {name: m.hyperparameters for name, m in _METHODS.items()}
    check_shared_fields("method", method.name, method.hyperparameters, owners, "algorithm")
    _METHODS[method.name] = method
    return method


def register_variant(variant: Variant, *, replace: bool = False) -> Variant:
    if not replace and (variant.name in _METHODS or variant.name in _VARIANTS):
        raise ValueError(f"a method {variant.name!r} is already registered.")
    get_method(variant.method)
    _VARIANTS[variant.name] = variant
    return variant


def registered_methods() -> tuple[str, ...]:
    """The registered method names, in registration order."""
    return tuple(_METHODS)


def client_side_methods() -> tuple[str, ...]:
    return tuple(name for name, m in _METHODS.items() if m.client_side)


def method_keys() -> tuple[str, ...]:
    """Every key a config may name as algorithm.name: methods, `<client-side>_fedpals`,
    variants (a sweep may also put a server optimiser in front: `_server_optimizer_split`)."""
    combined = tuple(f"{name}{FEDPALS_SUFFIX}" for name in client_side_methods())
    return registered_methods() + combined + tuple(_VARIANTS)


def _unknown(name: Any) -> ValueError:
    close = difflib.get_close_matches(str(name), method_keys(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(
        f"unknown method {name!r}{hint}; the registered methods are {list(method_keys())}."
    )


def get_method(name: str) -> Method:
    """The registered method called `name` (ValueError with the registered names if none)."""
    if not isinstance(name, str) or name not in _METHODS:
        raise _unknown(name)
    return _METHODS[name]


def _server_optimizer_split(key: str) -> tuple[str | None, str]:
    """("fedadam", "fedpals") for "fedadam_fedpals", ("fedadam", "fedavg") for "fedadam",
    (None, key) for a key without a server optimiser in front."""
    if key in _METHODS or key in _VARIANTS:
        return None, key
    optimizer, _, rest = key.partition("_")
    if optimizer in SERVER_OPTIMIZER_LABELS:
        return optimizer, rest or "fedavg"
    return None, key


def method_overrides(key: str) -> dict[str, Any]:
    """The config keys that a method key sets: {"algorithm.name": ..., "algorithm.weights": ...}
    plus a variant's own keys, and "server.optimizer" for a server optimiser in front."""
    if not isinstance(key, str):
        raise ValueError(f"a method key must be a string, got {key!r}.")
    optimizer, rest = _server_optimizer_split(key)
    if optimizer is not None:
        return {**method_overrides(rest), "server.optimizer": optimizer}
    if key in _VARIANTS:
        variant = _VARIANTS[key]
        return {"algorithm.name": variant.method, "algorithm.weights": None, **variant.overrides}
    if key in _METHODS:
        return {"algorithm.name": key, "algorithm.weights": None}
    if key.endswith(FEDPALS_SUFFIX):
        base = key[: -len(FEDPALS_SUFFIX)]
        if base in _METHODS and _METHODS[base].client_side:
            return {"algorithm.name": base, "algorithm.weights": "fedpals"}
        if base in _METHODS:
            raise ValueError(
                f"{key!r} combines FedPALS' weights with {base!r}, but only the client-side "
                f"methods {list(client_side_methods())} combine."
            )
    raise _unknown(key)


def method_label(key: str) -> str:
    """The column header / legend of a method key ("FedProx+FedPALS"); unknown keys as they are."""
    optimizer, rest = _server_optimizer_split(key)
    if optimizer is not None:
        label = SERVER_OPTIMIZER_LABELS[optimizer]
        return label if rest == "fedavg" else f"{label}+{method_label(rest)}"
    if key in _VARIANTS:
        return _VARIANTS[key].label
    if key in _METHODS:
        return _METHODS[key].label
    if key.endswith(FEDPALS_SUFFIX) and key[: -len(FEDPALS_SUFFIX)] in _METHODS:
        return f"{_METHODS[key[: -len(FEDPALS_SUFFIX)]].label}+{_METHODS['fedpals'].label}"
    return key


def method_labels() -> dict[str, str]:
    """{key: label} of every registered key."""
    return {key: method_label(key) for key in method_keys()}


def hyperparameter_fields() -> dict[str, tuple[Any, Callable[[str, Any], Any], tuple[str, ...]]]:
    """{config key under algorithm.: (default, check, the methods that use it)} over all
    registered methods, in registration order."""
    return declared_fields({name: m.hyperparameters for name, m in _METHODS.items()})


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


def method_grids() -> dict[str, tuple]:
    """The protocol's grid of every registered method's hyperparameters, merged."""
    grid: dict[str, tuple] = {}
    for method in _METHODS.values():
        grid.update(dict(method.grid))
    return grid
