"""The registry of methods and features: each is registered once, under one name used everywhere.

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
  `MethodContext` (the partition with the server's T, the weighting asked for by
  `algorithm.weights`, the typed slots the features' stages wrote: FedPALS' lambda);
* `client_side`: the method changes only local training, so it combines with the server
  weights of a method that lends them under the key `<name>_<lender>` ("fedprox_fedpals",
  "FedProx+FedPALS");
* `partition_transform`: how the method redraws the clients' data before training (the
  Oracle's resampling to T, FedPALS App. B.5);
* `monitor(hp, task) -> Monitor`: what the method reports of itself while its run trains
  (FedPALS: lambda, its weights' ESS, d(T, S) of the S its weights see), through the same
  protocol as a feature's; a client-side method's run reports its weights' lender's too;
* `target_state`: the state type (a NamedTuple with `target_label_dist`) in which the method
  keeps the T its own pieces read (IW-ERM's `IwermState`: its loss ratios), which T
  re-estimation replaces, so that `algorithm.target_estimation` runs without FedPALS' weights;
* `reference`: a reference, not a competitor (the Oracle sees the target's data): a protocol
  table marks the best of the other methods;
* `owns_server_update`: its server update is its own (SCAFFOLD's control variates, AFL's
  lambda), so no server optimiser replaces it (the config refuses, `with_server_optimizer`
  too); `lends_weighting`: its server weights serve the client-side methods too
  (FedPALS: `algorithm.weights='fedpals'`, or the key `fedprox_fedpals`; a user's lender
  alike), built with its default hyperparameters from the run's partition (and lambda).

A `Feature` is what a run adds to its method, switched on by its own config keys (label DP,
Table 2's perturbed T, adaptive lambda, T re-estimated, FedPALS' lambda by ESS; see `Feature`).
The config validator, `build_task` and `train_and_evaluate` loop over the registry; none of
them names a method or a feature.

A *variant* is a registered key that means another method with some config keys set
(`fedpals_adaptive` is FedPALS with `algorithm.lam_schedule='hypergradient'`): it has a name
and a label, and `method_overrides(key)` gives its config keys.

A user's method or feature is one module of theirs: define the hyperparameters and the
builder (the hooks), call `register_method(Method(...))` (`register_feature(Feature(...))`) at
import time, and name it in a config file that imports the module (docs/extending.md;
examples/extending/my_extension.py has one of each).
"""

from __future__ import annotations

import dataclasses
import types
import difflib
from typing import Any, Callable, Mapping

import numpy as np

from fedjax_pals import _validation, deprecation, extensions
from fedjax_pals.algorithms.base import FederatedAlgorithm, Weighting
from fedjax_pals.data import FederatedPartition
from fedjax_pals.hyperparameters import (
    Hyperparameters, NoHyperparameters, check_declared, check_shared_fields, declared_fields,
    field_metadata, hyperparameter, hyperparameter_checks, per_run_fields,
)
# A server optimiser in front of a method key sets config.server.optimizer: "fedadam_fedpals"
# is FedPALS with FedAdam's server step, a bare "fedadam" is FedAvg with it.
from fedjax_pals.algorithms.server_optimizers import SERVER_OPTIMIZER_LABELS
from fedjax_pals.algorithms import server_chain


# The method of the default config.
DEFAULT_METHOD = "fedpals"
# The suffix of a client-side method's key with FedPALS' server weights: "fedprox_fedpals".
FEDPALS_SUFFIX = "_fedpals"


# -- methods ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContextSlot:
    """A typed value of the `MethodContext` that one feature stage writes (`context.get(slot)`,
    `context.with_value(slot, value)`): FedPALS' lambda (`fedpals_lambda.LAMBDA`, stage
    "lambda"), a user's quantity that a later hook reads. A feature may write a slot only at
    the slot's stage (`prepare_context` refuses another, naming the stage to declare), so
    what a stage writes is fixed for the stages after it.

    name: unique ("fedpals_lambda"); stage: one of `FEATURE_STAGES` but "algorithm" (wrap
      only); kind: the type (or tuple of types) of its values (None is always allowed: unset);
      doc: what it holds. legacy_field: the `MethodContext` field it replaces (kept until
      0.4.0, mirrored both ways: `context.lam` still reads FedPALS' lambda).
    """

    name: str
    stage: str
    kind: Any
    doc: str = ""
    legacy_field: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a context slot's name must be an identifier, got {self.name!r}.")
        if self.stage not in FEATURE_STAGES[:-1]:
            raise ValueError(
                f"context slot {self.name!r}: stage {self.stage!r} is not a stage that prepares "
                f"the context; choose one of {list(FEATURE_STAGES[:-1])}."
            )
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if not kinds or not all(isinstance(k, type) for k in kinds):
            raise ValueError(
                f"context slot {self.name!r}: kind must be a type or a tuple of types, got "
                f"{self.kind!r}.")
        if self.legacy_field is not None and self.legacy_field not in _LEGACY_FIELDS:
            raise ValueError(f"context slot {self.name!r}: {self.legacy_field!r} is not a "
                             f"deprecated MethodContext field ({list(_LEGACY_FIELDS)}).")
        _known_slot(self)  # known from its definition on: two slots may not share a name

    def check(self, value: Any) -> Any:
        if value is not None and not isinstance(value, self.kind):
            kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
            raise ValueError(
                f"context slot {self.name!r} holds {' or '.join(k.__name__ for k in kinds)}, "
                f"got {type(value).__name__} ({value!r})."
            )
        return value


# The MethodContext fields that typed slots replace (FedPALS' lambda and its floor): kept as
# fields until 0.4.0, mirrored with their slots.
_LEGACY_FIELDS = ("lam", "lam_floor")
# name -> slot, of every slot a context has been given (the legacy fields' at import).
_SLOTS: dict[str, ContextSlot] = {}


def _known_slot(slot: ContextSlot) -> ContextSlot:
    if not isinstance(slot, ContextSlot):
        raise TypeError(f"a context slot is a fedjax_pals.ContextSlot, got {type(slot).__name__}.")
    known = _SLOTS.setdefault(slot.name, slot)
    if known != slot:
        raise ValueError(f"two context slots are named {slot.name!r}: {known} and {slot}.")
    return slot


@dataclasses.dataclass(frozen=True)
class MethodContext:
    """What a method's builder and a feature's hooks may read of the run (built once per run).

    partition: the clients the run trains (S_i, n_i, label counts; a feature may hold some of
      their examples out) with the T the server's weights use (T, Table 2's perturbed T_p, or
      the clients' aggregate when T is estimated).
    lam: deprecated (0.4.0 removes it): FedPALS' lambda is the slot `fedpals_lambda.LAMBDA`
      (`context.get(LAMBDA)`); this field mirrors it.
    weighting: for a client-side method, the server weighting asked for by
      algorithm.weights (None: FedAvg's n_i / N).
    server_label_dists: the clients' S_i(Y) as the server's weights see them (a DP release),
      or None: the exact S_i of `partition`.
    target_validation: the target validation split (inputs, labels).
    dataset: the run's `Dataset` (its train split's labels, e.g. to hold examples out).
    model: the run's `Model`; rounds, seed: the run's; clients_per_round: the participants a
      round (at most the training clients; None: every client), the lanes a round under
      Poisson sampling; sampling_rate: q of Poisson sampling (None: clients_per_round drawn
      without replacement); sampler: the run's client sampler (`fedjax_pals.sampling`), of which
      those two are the lanes and the rate.
    lam_floor: deprecated (0.4.0 removes it): the slot `fedpals_lambda.LAMBDA_FLOOR`, which
      this field mirrors.
    slots: the typed values the features' stages wrote ({slot name: value}; `get`,
      `with_value`, `ContextSlot`).
    """

    partition: FederatedPartition | None = None
    lam: float | None = None
    weighting: Weighting | None = None
    server_label_dists: np.ndarray | None = None
    target_validation: tuple[np.ndarray, np.ndarray] | None = None
    dataset: Any = None
    model: Any = None
    rounds: int | None = None
    seed: int = 0
    clients_per_round: int | None = None
    lam_floor: bool = False
    sampling_rate: float | None = None
    slots: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The run's client sampler (`fedjax_pals.sampling.ClientSampler`): who takes part, its
    # weights link and its accounting; sampling_rate is its `rate`. None: built from
    # clients_per_round and sampling_rate (`sampling.participation`) where it is read.
    sampler: Any = None

    def __post_init__(self) -> None:
        # A context built with a legacy field (MethodContext(partition, lam)) holds it in its
        # slot too; a slot's value wins where both are given.
        slots = dict(self.slots)
        for slot in _SLOTS.values():
            if slot.legacy_field is None:
                continue
            legacy = getattr(self, slot.legacy_field)
            if slot.name not in slots and legacy is not _unset(slot):  # lam = 0.0 is set
                slots[slot.name] = slot.check(legacy)
            object.__setattr__(self, slot.legacy_field, slots.get(slot.name, _unset(slot)))
        object.__setattr__(self, "slots", types.MappingProxyType(slots))

    def get(self, slot: ContextSlot) -> Any:
        """The value a stage wrote into `slot` (None: unset)."""
        return self.slots.get(_known_slot(slot).name)

    def with_value(self, slot: ContextSlot, value: Any) -> "MethodContext":
        """The context with `slot` holding `value` (checked against the slot's kind)."""
        _known_slot(slot)
        slots = {**self.slots, slot.name: slot.check(value)}
        changes = {} if slot.legacy_field is None else {slot.legacy_field: _unset(slot)}
        return dataclasses.replace(self, slots=slots, **changes)

    @property
    def weight_label_dists(self) -> np.ndarray:
        """The S the server's weights see: the release if there is one, else the exact S_i."""
        if self.server_label_dists is not None:
            return self.server_label_dists
        return self.partition.client_label_dists

    def replace(self, **changes: Any) -> "MethodContext":
        """The context with these fields changed (`with_value` for a slot)."""
        context = self
        for slot in list(_SLOTS.values()):
            if slot.legacy_field in changes:
                deprecation.warn(
                    f"MethodContext.replace({slot.legacy_field}=...) is deprecated: write the "
                    f"slot, context.with_value({slot.name.upper()}, value) (the slot "
                    f"{slot.name!r}, {slot.doc}).", refused_in="0.4.0")
                context = context.with_value(slot, changes.pop(slot.legacy_field))
        return dataclasses.replace(context, **changes) if changes else context


def _unset(slot: ContextSlot) -> Any:
    """A legacy field's value for an unset slot: its old default (False for lam_floor)."""
    return False if slot.legacy_field == "lam_floor" else None


def _check_grid(owner: str, hyperparameters: type[Hyperparameters], grid: Mapping) -> None:
    """A registration's protocol grid: {its hyperparameter: a non-empty tuple of its values}."""
    fields = hyperparameter_checks(hyperparameters)
    for key, values in dict(grid).items():
        if key not in fields:
            raise ValueError(
                f"{owner}: grid key {key!r} is not one of its hyperparameters {sorted(fields)}."
            )
        if not isinstance(values, tuple) or not values:
            raise ValueError(f"{owner}: grid[{key!r}] must be a non-empty tuple, got {values!r}.")
        for value in values:
            fields[key](f"{owner} grid value {key}", value)


Builder = Callable[[Any, MethodContext], "FederatedAlgorithm"]
PartitionTransform = Callable[[FederatedPartition, np.ndarray, int], FederatedPartition]


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
    owns_server_update: bool = False
    lends_weighting: bool = False
    monitor: Callable[[Any, Any], "Monitor"] | None = None
    reference: bool = False
    target_state: type | None = None

    def __post_init__(self) -> None:
        _validation.check_registered_name("method", self.name)
        _validation.check_hook(
            f"method {self.name!r}", "build", self.build, "(hyperparameters, context) -> "
            "FederatedAlgorithm")
        _validation.check_hook(
            f"method {self.name!r}", "monitor", self.monitor, "(hp, task) -> Monitor",
            optional=True)
        _validation.check_hook(
            f"method {self.name!r}", "partition_transform", self.partition_transform,
            "(partition, train_labels, seed) -> FederatedPartition", optional=True)
        if self.name.endswith(FEDPALS_SUFFIX):
            raise ValueError(
                f"a method's name must not end in {FEDPALS_SUFFIX!r} (reserved for a client-side "
                f"method with FedPALS' weights), got {self.name!r}."
            )
        check_declared(f"method {self.name!r}", self.hyperparameters)
        _check_grid(f"method {self.name!r}", self.hyperparameters, self.grid)

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
        if not isinstance(algorithm, FederatedAlgorithm):
            # Caught here, not at the first `_replace` or inside the compiled round.
            raise ValueError(
                f"method {self.name!r}: its build(hyperparameters, context) returned "
                f"{type(algorithm).__name__}, not a fedjax_pals.FederatedAlgorithm (e.g. "
                "fjp.fedavg()._replace(server_update=...))."
            )
        if not self.owns_server_update and not server_chain.is_chained(
            algorithm.server_update
        ):
            # Required since 0.2.0; a module written before still runs (a server optimiser
            # is refused for it when the algorithm is built, `with_server_optimizer`).
            deprecation.warn(
                f"method {self.name!r}: its server update is its own (not "
                "fjp.weighted_average_update()); declare it with Method(..., "
                "owns_server_update=True), so that the config refuses a server optimiser for "
                "it before anything runs.",
                refused_in="0.3.0",
            )
        return algorithm._replace(name=self.key(context))

    def key(self, context: MethodContext | None = None) -> str:
        weighting = context.weighting if context is not None else None
        if self.client_side and weighting is not None and weighting.name != "fedavg":
            return f"{self.name}_{weighting.name}"
        return self.name


def make_algorithm(
    name: str, *, partition: FederatedPartition | None = None, lam: float | None = None,
    weights: str | None = None, context: MethodContext | None = None, **hyperparameters: Any,
) -> FederatedAlgorithm:
    """The registered method `name` (or `<client-side>_fedpals`) with these hyperparameters.

    Args:
      name: a registered method, e.g. "fedprox", or "<client-side method>_fedpals".
      partition: the training partition (with the server's T); the methods whose weights read
        T (FedPALS, FedDisco) or whose clients read the label counts (FedShift) need it.
      lam: FedPALS' lambda (fedpals, or a client-side method with weights="fedpals"); the slot
        `fedpals_lambda.LAMBDA` of the context the method is built from.
      context: a run's prepared `MethodContext` instead of partition and lam: the method is
        built from its partition and the slots its features' stages wrote (`build_task`).
      weights: the weighting of a client-side method: None or "fedavg" (FedAvg), or a method
        whose weights serve client-side methods (`lends_weighting`: "fedpals"), built from the
        same partition and lam with its own hyperparameters among `hyperparameters`.
      **hyperparameters: the method's own (`get_method(name).hyperparameters`), e.g. prox_mu,
        and with a lender's weights the lender's (FedPALS' weights_solver).

    Raises:
      ValueError: an unknown name, weighting or hyperparameter, or a missing or bad argument.
    """
    overrides = method_overrides(name)
    if set(overrides) - {"algorithm.name", "algorithm.weights"}:
        raise ValueError(
            f"{name!r} is a variant set by the config ({overrides}); build it with build_task."
        )
    method = get_method(overrides["algorithm.name"])
    if overrides["algorithm.weights"] is not None:
        if weights not in (None, overrides["algorithm.weights"]):
            raise ValueError(f"{name!r} uses {overrides['algorithm.weights']}' weights; "
                             f"weights={weights!r} contradicts it.")
        weights = overrides["algorithm.weights"]
    lending = lenders()
    if weights not in (None, "fedavg") + lending:
        raise ValueError(f"unknown weights {weights!r}; choose one of {('fedavg',) + lending}.")
    if weights in lending and not method.client_side:
        raise ValueError(
            f"{method.name} has its own server weights; weights={weights!r} applies only to "
            f"{client_side_methods()} (or use name={weights!r})."
        )
    if context is not None:
        if partition is not None or lam is not None:
            raise ValueError("give context, or partition and lam, not both.")
        partition = context.partition
        base = MethodContext(partition, slots=context.slots)
    else:
        base = MethodContext(partition, lam)
    if partition is not None and not isinstance(partition, FederatedPartition):
        raise ValueError(f"partition must be a FederatedPartition, got {type(partition).__name__}.")
    weighting, own = None, dict(hyperparameters)
    if weights in lending:
        if partition is None:
            raise ValueError(f"{method.name} with weights={weights!r} needs partition=....")
        lender = get_method(weights)
        # The lender's own keys build its weights (FedPALS' weights_solver); the method's
        # build the rest (a key both declare goes to both).
        lent = {k: v for k, v in hyperparameters.items()
                if k in hyperparameter_checks(lender.hyperparameters)}
        own = {k: v for k, v in hyperparameters.items()
               if k not in lent or k in hyperparameter_checks(method.hyperparameters)}
        # The lender's builder says what else it needs (FedPALS: lam).
        weighting = lender.make(base, **lent).weighting
        # Named as its lender: the key of the combination is "<method>_<lender>".
        weighting = weighting._replace(name=weights)
    return method.make(dataclasses.replace(base, weighting=weighting), **own)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A key that means a registered method with some config keys set.

    `overrides` are what the key means: a config that sets one of them to another value than
    the variant's (and than its default) is refused. `defaults` are settings the variant brings
    when the config leaves them open: applied together, and only where the config holds every
    key they name at its default (a None value names a key that must be open and stays so).
    `fedpals_adaptive` starts lambda at ESS 50 % of N unless the config gives `algorithm.lam`
    or `algorithm.ess_fraction`: `{"algorithm.ess_fraction": 0.5, "algorithm.lam": None}`.
    """

    name: str
    label: str
    method: str
    overrides: Mapping[str, Any]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)


_METHODS: dict[str, Method] = {}
_VARIANTS: dict[str, Variant] = {}
_FEATURES: dict[str, "Feature"] = {}


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
    mine = hyperparameter_checks(method.hyperparameters)
    for feature in _FEATURES.values():
        taken = sorted(set(mine) & set(hyperparameter_checks(feature.hyperparameters)))
        if taken:
            raise ValueError(
                f"method {method.name!r}: hyperparameter {taken[0]!r} is a config key of feature "
                f"{feature.name!r} (algorithm.{taken[0]}); give yours a name of its own."
            )
    _METHODS[method.name] = method
    extensions.note_registration(
        "method", method.name, (f"algorithm.{key}" for key in mine)
    )
    return method


def register_variant(variant: Variant, *, replace: bool = False) -> Variant:
    if not isinstance(variant, Variant):
        raise TypeError(
            f"register_variant takes a fedjax_pals.Variant, got {type(variant).__name__}."
        )
    if not replace and (variant.name in _METHODS or variant.name in _VARIANTS):
        raise ValueError(f"a method {variant.name!r} is already registered.")
    get_method(variant.method)
    for field in ("overrides", "defaults"):
        keys = getattr(variant, field)
        if not isinstance(keys, Mapping) or not all(
            isinstance(k, str) and k.count(".") == 1 for k in keys
        ):
            raise ValueError(
                f"variant {variant.name!r}: {field} must map config paths 'section.key' to "
                f"values, got {keys!r}."
            )
    both = sorted(set(variant.overrides) & set(variant.defaults))
    if both:
        raise ValueError(
            f"variant {variant.name!r}: {both[0]!r} is in both overrides and defaults; a key the "
            "variant means goes in overrides, one it only brings when the config leaves it open "
            "in defaults."
        )
    _VARIANTS[variant.name] = variant
    extensions.note_registration("variant", variant.name)
    return variant


def registered_methods() -> tuple[str, ...]:
    """The registered method names, in registration order."""
    return tuple(_METHODS)


def client_side_methods() -> tuple[str, ...]:
    return tuple(name for name, m in _METHODS.items() if m.client_side)


def lenders() -> tuple[str, ...]:
    """The methods whose server weights serve the client-side methods (`lends_weighting`)."""
    return tuple(name for name, m in _METHODS.items() if m.lends_weighting)


def method_keys() -> tuple[str, ...]:
    """Every key a config may name as algorithm.name: methods, `<client-side>_<lender>`
    (`fedprox_fedpals`), variants; a server optimiser may stand in front of any
    (`_server_optimizer_split`)."""
    combined = tuple(
        f"{name}_{lender}" for lender in lenders() for name in client_side_methods()
    )
    return registered_methods() + combined + tuple(_VARIANTS)


def _lender_split(key: str) -> tuple[str, str] | None:
    """(method, lender) of a key "<method>_<lender>" whose method is registered, else None."""
    for lender in sorted(lenders(), key=len, reverse=True):
        base = key[: -len(lender) - 1]
        if key.endswith(f"_{lender}") and base in _METHODS:
            return base, lender
    return None


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


def server_optimizer_key(optimizer: str, key: str) -> str:
    """The method key of `key` with server optimiser `optimizer` in front: "fedadam_fedpals",
    a bare "fedadam" for FedAvg (the inverse of `_server_optimizer_split`)."""
    return optimizer if key == "fedavg" else f"{optimizer}_{key}"


@dataclasses.dataclass(frozen=True)
class MethodKey:
    """A method key as a value: what `algorithm.name` or `sweep.methods` names, in parts.

    method: the registered method (`algorithm.name` once resolved: "fedprox");
    lender: the method whose server weights a client-side method uses (`algorithm.weights`:
      "fedpals"), None for the method's own weights or FedAvg's;
    optimizer: the server optimiser in front (`server.optimizer`: "fedadam"), None for plain
      SGD (the weighted average);
    variant: the registered `Variant` the key names ("fedpals_adaptive"), None for none.

    `MethodKey.parse("fedadam_fedprox_fedpals")` is its inverse of `str(key)` / `key.key`;
    `label` is how every table, figure and screen line names it ("FedAdam+FedProx+FedPALS");
    `overrides` the config keys it means; `defaults` the settings its variant brings where
    the config leaves them open (`Variant.defaults`).

    `MethodKey.of(resolved)` is the key a `ResolvedConfig` was built from, read, not searched:
    the resolved config's algorithm.name, algorithm.weights and server.optimizer give the
    method, lender and optimizer, and the variant is the one the given key named (a variant
    cannot be read back from settings: two variants, or a variant and a method, may mean the
    same settings, "fedpals_again" copying FedPALS'). There is no candidate list to pick
    from, so no "first match" or "most specific match" rule can be wrong: the key a run is
    named by is the key it was given, whatever other key would give the same config.
    """

    method: str
    lender: str | None = None
    optimizer: str | None = None
    variant: str | None = None

    @classmethod
    def parse(cls, key: Any) -> "MethodKey":
        """The parts of a key ("fedadam_fedpals", "fedprox_fedpals", "fedpals_adaptive", a bare
        "fedadam" for FedAvg with FedAdam); ValueError for a key that names nothing
        registered, or a combination with a method that is not client-side."""
        if not isinstance(key, str):
            raise ValueError(f"a method key must be a string, got {key!r}.")
        optimizer, rest = _server_optimizer_split(key)
        if optimizer is not None:
            return dataclasses.replace(cls.parse(rest), optimizer=optimizer)
        if key in _VARIANTS:
            variant = _VARIANTS[key]
            lender = variant.overrides.get("algorithm.weights")
            return cls(variant.method, None if lender == "fedavg" else lender, variant=key)
        if key in _METHODS:
            return cls(key)
        split = _lender_split(key)
        if split is not None:
            base, lender = split
            if _METHODS[base].client_side:
                return cls(base, lender)
            raise ValueError(
                f"{key!r} combines {_METHODS[lender].label}'s weights with {base!r}, but only "
                f"the client-side methods {list(client_side_methods())} combine."
            )
        raise _unknown(key)

    @classmethod
    def of_settings(
        cls, name: str, weights: str | None = None, optimizer: str | None = None,
        named: Any = None,
    ) -> "MethodKey":
        """The key of a resolved config's algorithm.name, algorithm.weights and
        server.optimizer, with the variant of `named` (the key the config was given, whose
        overrides the config was resolved with; None or a key that is no variant of `name`:
        no variant)."""
        variant = None
        if isinstance(named, str):
            try:
                given = cls.parse(named)
            except ValueError:
                given = None
            if given is not None and given.variant is not None and given.method == name:
                variant = given.variant
        return cls(
            name,
            None if weights in (None, "fedavg") else weights,
            None if optimizer in (None, "sgd") else optimizer,
            variant,
        )

    @staticmethod
    def of(resolved: Any) -> "MethodKey":
        """The key `resolved` (a `ResolvedConfig`) was built from: its `key`, recorded when it
        was resolved (see the class docstring: by construction, not by search)."""
        key = getattr(resolved, "key", None)
        if not isinstance(key, MethodKey):
            raise TypeError(
                "MethodKey.of takes a fedjax_pals.experiment.ResolvedConfig (resolve_config), "
                f"got {type(resolved).__name__}."
            )
        return key

    @property
    def key(self) -> str:
        """The key as a config or a sweep names it ("fedadam_fedprox_fedpals")."""
        base = self.variant or (f"{self.method}_{self.lender}" if self.lender else self.method)
        return server_optimizer_key(self.optimizer, base) if self.optimizer else base

    def __str__(self) -> str:
        return self.key

    @property
    def label(self) -> str:
        """The display name ("FedAdam+FedProx+FedPALS")."""
        if self.variant is not None:
            base = _VARIANTS[self.variant].label if self.variant in _VARIANTS else self.variant
        else:
            method = _METHODS[self.method].label if self.method in _METHODS else self.method
            if self.lender is not None:
                lender = _METHODS[self.lender].label if self.lender in _METHODS else self.lender
                method = f"{method}+{lender}"
            base = method
        if self.optimizer is None:
            return base
        label = SERVER_OPTIMIZER_LABELS.get(self.optimizer, self.optimizer)
        bare = self.variant is None and self.lender is None and self.method == "fedavg"
        return label if bare else f"{label}+{base}"

    @property
    def overrides(self) -> dict[str, Any]:
        """The config keys the key means: {"algorithm.name": ..., "algorithm.weights": ...}
        plus a variant's own keys, and "server.optimizer" for a server optimiser in front."""
        if self.variant is not None:
            variant = _VARIANTS[self.variant]
            keys = {"algorithm.name": variant.method, "algorithm.weights": None,
                    **variant.overrides}
        else:
            keys = {"algorithm.name": self.method, "algorithm.weights": self.lender}
        if self.optimizer is not None:
            keys["server.optimizer"] = self.optimizer
        return keys

    @property
    def defaults(self) -> dict[str, Any]:
        """The settings the key brings where the config leaves them open (its variant's
        `Variant.defaults`; {} for a key that is no variant)."""
        variant = _VARIANTS.get(self.variant) if self.variant is not None else None
        return dict(variant.defaults) if variant is not None else {}


def method_overrides(key: str) -> dict[str, Any]:
    """The config keys that a method key sets (`MethodKey.parse(key).overrides`)."""
    return MethodKey.parse(key).overrides


def method_defaults(key: str) -> dict[str, Any]:
    """The settings a method key brings when the config leaves them open
    (`MethodKey.parse(key).defaults`)."""
    return MethodKey.parse(key).defaults


def method_label(key: Any) -> str:
    """The column header / legend of a method key ("FedProx+FedPALS"); unknown keys as they
    are (a run recorded with a user's key whose module is not imported)."""
    if isinstance(key, MethodKey):
        return key.label
    try:
        return MethodKey.parse(key).label
    except ValueError:
        return key


def method_labels() -> dict[str, str]:
    """{key: label} of every registered key."""
    return {key: method_label(key) for key in method_keys()}


# -- features ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What a feature's `resolve` may read of the run: its method, whose server weights it
    uses (`weights`: "fedpals" for FedPALS and FedProx+FedPALS; None for a method's own
    weights, FedAvg's n_i / N included), and its `algorithm` section with every key checked
    by its declaration (not yet resolved); the run's resolved `rounds`, its training clients
    and their participants a round (None where the caller has no run, e.g. a sweep's grid),
    and Poisson sampling's rate q (None: the participants drawn without replacement)."""

    method: Method
    weights: str | None
    section: Mapping[str, Any]
    rounds: int | None = None
    training_clients: int | None = None
    clients_per_round: int | None = None
    sampling_rate: float | None = None
    # The run's client sampler (`fedjax_pals.sampling`), None where the caller has no run.
    sampler: Any = None

    @property
    def reads_target(self) -> bool:
        """The server's weights read T and the S_i (FedPALS' weights, FedDisco)."""
        lender = _METHODS.get(self.weights) if self.weights is not None else None
        return (lender or self.method).reads_target


# resolve({field: value checked by its declaration}, RunFacts) -> {field: resolved value}:
# None for what the run does not use; ValueError for an inconsistent setting.
Resolve = Callable[[dict, RunFacts], dict]


class Monitor:
    """What a feature or a method does while its run trains, and what it reports
    (`Feature.monitor(hp, task)`, `Method.monitor(hp, task)` build one).

    headline() -> a short text for the run's first line, after its title ("lam=0 ESS=630/738
      d(T,S)=0.02": FedPALS'); "" for none.

    update_state(round_index, state_of) -> a new ServerState or None: called before each
      round (`TrainingRun(update_state=...)`), e.g. T re-estimated from the global model.
    scalars(state) -> {name: value} logged at each evaluation (they override the run's own,
      e.g. "server/lambda"); results(state) -> entries of results.json (pure: written at
      every evaluation and at the end).
    header() -> a line shown when the run starts; progress(state) -> {name: text} for the
      progress line at each evaluation; resume(previous, start_round): a resumed run's
      results.json so far, to report the rounds before this launch too.
    """

    update_state: Callable[[int, Callable[[], Any]], Any] | None = None

    def headline(self) -> str:
        """A short text for the run's first line ("" for none)."""
        return ""

    def header(self) -> str:
        """A line shown under the run's first line when it starts: what the feature does
        ("" for none), so that a run is never silently another method."""
        return ""

    def progress(self, state: Any) -> dict:
        """{name: short text} for the progress line at each evaluation."""
        return {}

    def resume(self, previous: Mapping[str, Any], start_round: int) -> None:
        """Called when the run resumes after `start_round` rounds, with the results.json the
        launches before wrote: take back what `results` reports of those rounds."""

    def scalars(self, state: Any) -> dict:
        return {}

    def results(self, state: Any) -> dict:
        return {}


class ServerWeightsMonitor(Monitor):
    """What every run reports of its server's weights, whatever its method: alpha with every
    client taking part at the state of each evaluation (`alpha`, `ess` in results.json; the
    task's summary keeps round 1's as `alpha_round_1`, `ess_round_1`). The weights move where
    the weighting's state does (AFL's lambda, adaptive lambda, T re-estimated)."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def results(self, state: Any) -> dict:
        from fedjax_pals.algorithms.base import weights_over_clients
        from fedjax_pals.runtime import is_main_process
        from fedjax_pals.server_weights import effective_sample_size

        if not is_main_process():  # only the process that writes results.json reads them
            return {}
        task, partition = self.task, self.task.partition
        alpha = weights_over_clients(
            task.algorithm, partition.client_label_dists, partition.client_sizes, state,
            task.sampling_rate)
        sizes = np.asarray(partition.client_sizes, np.float64)
        return {"alpha": alpha.tolist(), "ess": float(effective_sample_size(alpha, sizes))}


# The stages of a run's features, in the order their hooks (`prepare`, then `wrap`) run;
# within one stage, after the features each declares (`Feature.after`), else in registration
# order. Each stage sees what the stages before it made, and may not change what they fixed
# (`prepare_context` refuses it, naming the stage to declare):
#   target           the data and the T the server's weights aim at (Table 2's perturbed T,
#                    T estimated from the target's inputs, a user's smoothing of T);
#   label_marginals  what the weights see of the clients' S_i (label DP's release);
#   lambda           what parameterises the weights: FedPALS' lambda, searched by ESS on the
#                    T and S of the stages before, and its schedule (adaptive lambda);
#   algorithm        the built algorithm only (`wrap`), after every change of the context
#                    (a `prepare` here is deprecated: it runs after lambda is searched).
FEATURE_STAGES = ("target", "label_marginals", "lambda", "algorithm")
# Where a feature that declares no stage runs (deprecated): after every staged one, as all
# user features did before stages existed.
_UNSTAGED = len(FEATURE_STAGES)


@dataclasses.dataclass(frozen=True)
class Feature:
    """A registered feature: what a run adds to its method, switched on by a config key.

    name, label: its registry key and its display name.
    hyperparameters: its config keys `algorithm.<field>` with their defaults and allowed
      values (`hyperparameter(..., optional=True)` for a key that may be unset).
    resolve: the run's values of its keys, resolved (see `Resolve`): None where the run does
      not use them, ValueError (naming `config.algorithm.<key>`) for an inconsistent setting.
      The feature is on in a run where any of its resolved keys is not None.
    stage: when its hooks run, one of `FEATURE_STAGES` ("target": it changes T or the data;
      "label_marginals": what the weights see of S; "lambda": what parameterises the
      weights; "algorithm": it only wraps the built algorithm). A feature that changes T must
      say "target", so that FedPALS' lambda search sees the T the weights use.
    after: the features of its stage whose hooks must run before its own (fedpals_lambda reads
      adaptive_lambda's `lam_floor`: after=("adaptive_lambda",)); within a stage the hooks run
      in the order these declare, else in registration order. A name of an earlier stage is
      satisfied by the stages' order; one of a later stage, or a cycle, is refused at
      registration; a name no feature has registered yet is allowed then (its module may be
      imported later) and refused when the order is computed (`registered_features`, when a
      config is checked) if it is still unknown.
    prepare(hp, context) -> context: what the method is built from (T_p for T, the DP release
      of S, lambda from an ESS fraction), by stage. What an earlier stage fixed it may not
      change (`prepare_context`): after "target" the T the weights aim at, the client sizes
      and the clients' S_i; after "label_marginals" the S_i the weights see. The "algorithm"
      stage is wrap-only: a prepare there warns (deprecated; 0.4.0 refuses it).
    wrap(algorithm, hp, context) -> algorithm: the built algorithm with the feature, by stage.
    link(hp, context) -> ServerLink or a tuple of them: an operation on the round's updates (noise, compression, a
      robust aggregation), placed in its slot of the server chain (`fjp.ServerLink`,
      `server_chain.SLOTS`); the chain's order, not the stage, says where it runs. Its per-run
      state, if any, a `wrap` adds to the algorithm's state.
    monitor(hp, task) -> Monitor: its work while the run trains and what it reports.
    owns_server_update: it replaces the server update (a server optimiser cannot).
    per_run_state: its keys whose values are per-run data (ServerState), not compiled in,
      besides those declared `hyperparameter(..., per_run=True)` (the way to declare it, as a
      method does); per_run_presence: those of them whose being set at all changes the
      program.
    """

    name: str
    label: str
    hyperparameters: type[Hyperparameters]
    resolve: Resolve
    prepare: Callable[[Any, MethodContext], MethodContext] | None = None
    wrap: Callable[[FederatedAlgorithm, Any, MethodContext], FederatedAlgorithm] | None = None
    monitor: Callable[[Any, Any], Monitor] | None = None
    link: Callable[[Any, MethodContext], Any] | None = None
    owns_server_update: bool = False
    per_run_state: tuple[str, ...] = ()
    per_run_presence: tuple[str, ...] = ()
    description: str = ""
    stage: str | None = None
    after: tuple[str, ...] = ()
    grid: Mapping[str, tuple] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _validation.check_registered_name("feature", self.name)
        owner = f"feature {self.name!r}"
        _check_grid(owner, self.hyperparameters, self.grid)
        if isinstance(self.after, list):
            object.__setattr__(self, "after", tuple(self.after))
        if not isinstance(self.after, tuple) or not all(
            isinstance(name, str) for name in self.after
        ):
            raise ValueError(
                f"{owner}: after must be a tuple of feature names (after=('adaptive_lambda',)), "
                f"got {self.after!r}."
            )
        if self.name in self.after:
            raise ValueError(f"{owner}: after names the feature itself.")
        _validation.check_hook(owner, "resolve", self.resolve, "(values, facts) -> dict")
        for hook, signature in (("prepare", "(hp, context) -> MethodContext"),
                                ("wrap", "(algorithm, hp, context) -> FederatedAlgorithm"),
                                ("link", "(hp, context) -> ServerLink | tuple[ServerLink, ...]"),
                                ("monitor", "(hp, task) -> Monitor")):
            _validation.check_hook(owner, hook, getattr(self, hook), signature, optional=True)
        if self.stage is not None and self.stage not in FEATURE_STAGES:
            close = difflib.get_close_matches(str(self.stage), FEATURE_STAGES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"feature {self.name!r}: stage {self.stage!r} is not a stage{hint}; the stages, "
                f"in the order they run: {list(FEATURE_STAGES)}."
            )
        check_declared(f"feature {self.name!r}", self.hyperparameters)
        fields = hyperparameter_checks(self.hyperparameters)
        for key in (*self.per_run_state, *self.per_run_presence):
            if key not in fields:
                raise ValueError(
                    f"feature {self.name!r}: {key!r} is not one of its hyperparameters "
                    f"{sorted(fields)}."
                )

    @property
    def per_run_keys(self) -> tuple[str, ...]:
        """Its keys that are per-run data: declared `per_run=True`, or named in per_run_state."""
        declared = per_run_fields(self.hyperparameters)
        return tuple(dict.fromkeys((*declared, *self.per_run_state)))

    def resolve_section(self, facts: RunFacts) -> dict:
        """Its keys of the run's `algorithm` section (`facts.section`, checked), resolved."""
        checked = {key: facts.section[key] for key in hyperparameter_checks(self.hyperparameters)}
        resolved = self.resolve(checked, facts)
        if set(resolved) != set(checked):
            raise ValueError(
                f"feature {self.name!r}: resolve returned the keys {sorted(resolved)}, not its "
                f"hyperparameters {sorted(checked)}."
            )
        return resolved

    def settings(self, section: Mapping[str, Any]) -> Hyperparameters | None:
        """Its hyperparameters in a resolved `algorithm` section, None when it is off."""
        values = {key: section[key] for key in hyperparameter_checks(self.hyperparameters)}
        if all(value is None for value in values.values()):
            return None
        return self.hyperparameters(**values)

    def switched_on_by(self, section: Mapping[str, Any]) -> str:
        """"key=value" of its first key set in a resolved section (for messages)."""
        for key in hyperparameter_checks(self.hyperparameters):
            if section[key] is not None:
                return f"{key}={section[key]!r}"
        return self.name


def register_feature(feature: Feature, *, replace: bool = False) -> Feature:
    """Registers `feature` under `feature.name`. Its keys may not be another feature's or a
    method's hyperparameters (one config key, one owner)."""
    if not isinstance(feature, Feature):
        raise TypeError(
            f"register_feature takes a fedjax_pals.Feature, got {type(feature).__name__}."
        )
    if not replace and feature.name in _FEATURES:
        raise ValueError(
            f"a feature {feature.name!r} is already registered; pick another name, or pass "
            "replace=True to redefine it."
        )
    mine = set(hyperparameter_checks(feature.hyperparameters))
    owners = {key: f"method {users[0]!r}" for key, (_, _, users) in hyperparameter_fields().items()}
    for other in _FEATURES.values():
        if other.name != feature.name:
            owners.update({key: f"feature {other.name!r}" for key in
                           hyperparameter_checks(other.hyperparameters)})
    taken = sorted(mine & set(owners))
    if taken:
        raise ValueError(
            f"feature {feature.name!r}: config key algorithm.{taken[0]} is already declared by "
            f"{owners[taken[0]]}; give yours a name of its own."
        )
    candidates = dict(_FEATURES)
    candidates[feature.name] = feature
    # A later stage named in `after`, or a cycle, is refused now; a name not registered yet,
    # when the order is computed (`registered_features`).
    _feature_order(tuple(candidates.values()), strict=False)
    if feature.stage == "algorithm" and feature.prepare is not None:
        # Today it runs (after lambda is searched, before the method is built): what it
        # changes of T or S is refused (`prepare_context`), anything else still works.
        deprecation.warn(
            f"feature {feature.name!r} has a prepare at the stage 'algorithm', which is "
            "wrap-only (its prepare runs after FedPALS' lambda is searched). Declare the stage "
            "of what the prepare changes (Feature(..., stage='target') for T, "
            "'label_marginals' for the S the weights see, 'lambda' for lambda), or do its "
            "work in wrap.",
            refused_in="0.4.0",
        )
    if feature.stage is None:
        deprecation.warn(
            f"feature {feature.name!r} declares no stage, so its hooks run after every staged "
            "feature, FedPALS' lambda search included (a T it changes is not the T that lambda "
            f"is searched on). Declare Feature(..., stage=...), one of {list(FEATURE_STAGES)} "
            "('target' for a feature that changes T).",
            refused_in="0.3.0",
        )
    _FEATURES[feature.name] = feature
    extensions.note_registration("feature", feature.name, (f"algorithm.{key}" for key in mine))
    return feature


def stage_index(feature: Feature) -> int:
    """The position of the feature's stage in `FEATURE_STAGES` (no stage: after them all)."""
    return _UNSTAGED if feature.stage is None else FEATURE_STAGES.index(feature.stage)


def wrap_algorithm(
    algorithm: FederatedAlgorithm, features: Any, context: MethodContext,
) -> FederatedAlgorithm:
    """`algorithm` with the `wrap` and the `link` of each (feature, settings) of `features`, by
    stage (`FEATURE_STAGES`, then the features without one), in their order within a stage. A
    link goes to its slot of the server chain (`server_chain.with_link`), so where it runs does
    not depend on this order."""
    for stage in (*FEATURE_STAGES, None):
        for feature, hp in features:
            if feature.stage != stage:
                continue
            if feature.wrap is not None:
                algorithm = feature.wrap(algorithm, hp, context)
            if feature.link is not None:
                links = feature.link(hp, context)
                for link in links if isinstance(links, tuple) else (links,):
                    try:
                        algorithm = server_chain.with_link(algorithm, link)
                    except ValueError as error:
                        raise ValueError(f"feature {feature.name!r}: {error}") from None
    return algorithm


def registered_features() -> tuple[Feature, ...]:
    """The registered features in the order of their hooks: by stage (`FEATURE_STAGES`), and
    within one after the features each declares (`Feature.after`), else in registration
    order. ValueError for an `after` that names no registered feature."""
    return _feature_order(tuple(_FEATURES.values()), strict=True)


def _stage_name(feature: Feature) -> str:
    return "no stage" if feature.stage is None else f"stage {feature.stage!r}"


def _feature_order(features: tuple[Feature, ...], *, strict: bool) -> tuple[Feature, ...]:
    """`features` (in registration order) by stage, then by a topological sort on `after`
    with registration order breaking ties (features that declare nothing keep their order).
    ValueError: an `after` naming a feature of a later stage, a cycle, and (strict) a name
    that no feature in `features` has."""
    by_name = {feature.name: feature for feature in features}
    for feature in features:
        for name in feature.after:
            other = by_name.get(name)
            if other is None:
                if strict:
                    close = difflib.get_close_matches(name, by_name, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else (
                        "; import the module that registers it")
                    raise ValueError(
                        f"feature {feature.name!r}: after={feature.after!r} names {name!r}, "
                        f"which no registered feature is{hint}."
                    )
                continue
            if stage_index(other) > stage_index(feature):
                raise ValueError(
                    f"feature {feature.name!r} ({_stage_name(feature)}): after names {name!r}, "
                    f"whose {_stage_name(other)} runs later; features run by stage "
                    f"{list(FEATURE_STAGES)}: declare a stage no earlier than {other.stage!r}, "
                    "or leave it out of after."
                )
    order: list[Feature] = []
    for index in sorted({stage_index(feature) for feature in features}):
        pending = [feature for feature in features if stage_index(feature) == index]
        here = {feature.name for feature in pending}
        placed: set[str] = set()
        while pending:
            ready = next((feature for feature in pending
                          if set(feature.after) & here <= placed), None)
            if ready is None:
                raise ValueError(_cycle_message(pending, here))
            order.append(ready)
            placed.add(ready.name)
            pending.remove(ready)
    return tuple(order)


def _cycle_message(pending: list[Feature], here: set[str]) -> str:
    """The refusal of a cycle among `pending` (none of them ready): the cycle, named."""
    by_name = {feature.name: feature for feature in pending}
    path, feature = [], pending[0]
    while feature.name not in path:
        path.append(feature.name)
        feature = by_name[next(name for name in feature.after if name in by_name)]
    cycle = path[path.index(feature.name):] + [feature.name]
    return (
        f"features {sorted(set(cycle))}: their after= make a cycle "
        f"({' after '.join(repr(name) for name in cycle)}); leave one of them out of after."
    )


def _same(before: Any, now: Any) -> bool:
    """The same array, by identity or by value."""
    if before is now:
        return True
    if before is None or now is None:
        return False
    before, now = np.asarray(before), np.asarray(now)
    if before.shape != now.shape:
        return False
    try:
        return bool(np.array_equal(before, now, equal_nan=True))
    except TypeError:  # a dtype without NaN
        return bool(np.array_equal(before, now))


def _of_partition(field: str) -> Callable[[MethodContext], Any]:
    return lambda c: None if c.partition is None else getattr(c.partition, field)


# What each stage fixes for the stages after it: (what, its value in a context). After
# "target": the T the weights aim at and the clients' data (a held-out share changes n_i and
# S_i); after "label_marginals": the S_i the weights see (a DP release).
_FIXED_BY_STAGE: dict[str, tuple[tuple[str, Callable[[MethodContext], Any]], ...]] = {
    "target": (
        ("T (context.partition.target_label_dist)", _of_partition("target_label_dist")),
        ("the client sizes (context.partition.client_sizes)", _of_partition("client_sizes")),
        ("the clients' S_i (context.partition.client_label_dists)",
         _of_partition("client_label_dists")),
    ),
    "label_marginals": (
        ("the S_i the weights see (context.weight_label_dists)",
         lambda c: None if c.partition is None and c.server_label_dists is None
         else c.weight_label_dists),
    ),
}


def prepare_context(features: Any, context: MethodContext) -> MethodContext:
    """`context` after the `prepare` of each (feature, settings) of `features`, in their order
    (`registered_features`'). A staged feature's prepare may not change what an earlier stage
    fixed (`_FIXED_BY_STAGE`): after "target" T, the client sizes and the S_i; after
    "label_marginals" the S_i the weights see (FedPALS' lambda is searched on them, and the
    weights aim at them). ValueError naming the feature and the stage to declare. A feature
    without a stage (deprecated) is not checked: its warning says that it runs last."""
    for feature, hp in features:
        if feature.prepare is None:
            continue
        earlier = () if feature.stage is None else FEATURE_STAGES[
            :FEATURE_STAGES.index(feature.stage)]
        fixed = [(stage, what, read, read(context)) for stage in earlier
                 for what, read in _FIXED_BY_STAGE.get(stage, ())]
        prepared = feature.prepare(hp, context)
        if not isinstance(prepared, MethodContext):
            raise ValueError(
                f"feature {feature.name!r}: its prepare(hp, context) returned "
                f"{type(prepared).__name__}, not a MethodContext (context.replace(...))."
            )
        if feature.stage is not None:
            for name in set(context.slots) | set(prepared.slots):
                slot = _SLOTS[name]
                if slot.stage != feature.stage and not _same(
                        context.slots.get(name), prepared.slots.get(name)):
                    raise ValueError(
                        f"feature {feature.name!r} at the stage {feature.stage!r}: its prepare "
                        f"wrote the context slot {name!r}, which the stage {slot.stage!r} "
                        f"writes; declare Feature(..., stage={slot.stage!r})."
                    )
        for stage, what, read, before in fixed:
            if not _same(before, read(prepared)):
                raise ValueError(
                    f"feature {feature.name!r} at the stage {feature.stage!r}: its prepare "
                    f"changed {what}, which the stage {stage!r} fixes for the stages after it "
                    f"(FedPALS' lambda is searched on it, the weights aim at it); declare "
                    f"Feature(..., stage={stage!r})."
                )
        context = prepared
    return context


def hyperparameter_fields() -> dict[str, tuple[Any, Callable[[str, Any], Any], tuple[str, ...]]]:
    """{config key under algorithm.: (default, check, the methods that use it)} over all
    registered methods, in registration order."""
    return declared_fields({name: m.hyperparameters for name, m in _METHODS.items()})


def run_methods(name: str, weights: str | None, section: Mapping[str, Any]) -> tuple:
    """((Method, its hyperparameters), ...) of a run of method `name` with `weights`: the
    method, then the lender of its weights (FedPALS for "fedprox_fedpals"), each with its
    values of the run's resolved `algorithm` section. What reports the run's method while it
    trains (`Method.monitor`)."""
    methods = [get_method(name)]
    if weights is not None and weights in lenders() and weights != name:
        methods.append(get_method(weights))
    return tuple(
        (method, method.hyperparameters(**{
            key: section[key] for key in hyperparameter_checks(method.hyperparameters)
            if section.get(key) is not None}))
        for method in methods
    )


def _declared(what: str) -> dict[str, Any]:
    """{"algorithm.<key>": its declared `what`} over the hyperparameters of every registered
    method and feature, where declared (not None, not False)."""
    owners = [m.hyperparameters for m in _METHODS.values()]
    owners += [f.hyperparameters for f in _FEATURES.values()]
    declared: dict[str, Any] = {}
    for cls in owners:
        for key, value in field_metadata(cls, what).items():
            if value not in (None, False):
                declared.setdefault(f"algorithm.{key}", value)
    return declared


def is_reference(key: str) -> bool:
    """Whether the method of a method key is registered as a reference (`Method.reference`:
    the Oracle); False for a key no module registers now."""
    try:
        return get_method(method_overrides(key)["algorithm.name"]).reference
    except ValueError:
        return False


def reads_target(name: str, weights: str | None = None) -> bool:
    """Whether the server weights of a run of method `name` with `weights` read T: the method,
    or the lender of its weights, is registered with `reads_target` (`RunFacts.reads_target`)."""
    return RunFacts(get_method(name), weights, {}).reads_target


def shown_hyperparameters() -> tuple[str, ...]:
    """The keys declared `hyperparameter(..., shown=True)` ("algorithm.lam", ...): a run's
    HParams table shows them by default."""
    return tuple(_declared("shown"))


def hyperparameter_axes() -> dict[str, tuple[str, ...]]:
    """{axis: its keys} of the keys declared `hyperparameter(..., axis=...)`: alternative
    ways to give one quantity ({"lambda": ("algorithm.lam", "algorithm.ess_fraction")}),
    which a sweep's grid crosses as one axis."""
    axes: dict[str, tuple[str, ...]] = {}
    for key, axis in _declared("axis").items():
        axes[axis] = axes.get(axis, ()) + (key,)
    return axes


def identity_when_unset() -> tuple[str, ...]:
    """The keys declared `hyperparameter(..., identity_when_unset=True)` ("algorithm.lam",
    ...): in a run's identity even when None."""
    return tuple(_declared("identity_when_unset"))


def hyperparameter_labels() -> dict[str, str]:
    """{key without its section ("lam"): its label on figures ("λ")}, where declared."""
    return {key.split(".", 1)[1]: label for key, label in _declared("label").items()}


def method_grids() -> dict[str, tuple]:
    """The protocol's grid of every registered method's hyperparameters, merged."""
    return {key: values for method in _METHODS.values() for key, values in method.grid.items()}


def protocol_grids() -> dict[str, tuple]:
    """The selection protocol's grid of every registered feature's hyperparameters (FedPALS'
    lambda: `Feature.grid`), then every method's (`method_grids`), merged."""
    features = {key: values for feature in _FEATURES.values()
                for key, values in feature.grid.items()}
    return {**features, **method_grids()}
