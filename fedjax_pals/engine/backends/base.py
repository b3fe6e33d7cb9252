"""The two kinds of backend, and exactly what the round engine calls on each (see each
class): a backend declares its kind by subclassing `TracedBackend` (the clients mapped inside
the round's one jitted program) or `HostBackend` (the host drives the clients). These are
abstract base classes: a missing method is an error when the backend is made, and anything
else is refused by `make_backend` (and so by the engine).
"""

from __future__ import annotations

import abc
from typing import Any

import jax

from fedjax_pals.algorithms import ClientOutputs, ServerState
from fedjax_pals.engine import mesh as mesh_lib
from fedjax_pals.engine.client_update import ClientUpdate
from fedjax_pals.engine.plan import DeviceData, RoundPlan


class TracedBackend(abc.ABC):
    """Maps the client update over the clients inside the traced round.

    The engine calls, once when it is built: `client_multiple(mesh.size)`; then,
    while tracing each run's round (inside `jax.jit`, under `jax.vmap` over runs
    when several runs go together): `map_clients(update, data, state, plan)`. It adds
    the plan, the sharding of the clients axis and the aggregation around it.
    """

    name: str
    # Whether the client update is vmapped over clients (each with its own params): the engine
    # then computes the model's convolutions as matmuls (`RoundEngine`'s `vmapped_convs`).
    vmaps_clients = False

    @abc.abstractmethod
    def client_multiple(self, num_devices: int) -> int:
        """The plan's clients axis is padded to a multiple of this (padding clients take
        no step and are dropped)."""

    @abc.abstractmethod
    def map_clients(
        self, update: ClientUpdate, data: DeviceData, state: ServerState, plan: RoundPlan
    ) -> ClientOutputs:
        """Every client of `plan` through `update` (start, steps, finish): (m, ...) outputs.
        Pure and traced; the clients axis may be sharded over the mesh."""


class BoundHostBackend(abc.ABC):
    """A host backend bound to a client update and a mesh (`HostBackend.bind`).

    Per round, the engine calls `__call__(data, states, plans)` (outside jit), then
    traces `outputs(results, runs, m)` inside the jitted aggregation (the first
    round of each shape), dispatches the aggregation on `aggregation_device(results)`
    (or the mesh), and then calls `recycle(results)`.
    """

    @abc.abstractmethod
    def __call__(self, data: DeviceData, states: ServerState, plans: RoundPlan) -> Any:
        """Runs every (run, client) pair of `plans` ((R, m, ...) leaves); returns the
        clients' results in whatever layout `outputs` reads."""

    def outputs(self, results: Any, runs: int, m: int) -> ClientOutputs:
        """The round's (runs, m, ...) `ClientOutputs` from `results` (traced)."""
        return results

    def aggregation_device(self, results: Any) -> jax.Device | None:
        """One device that holds all of `results`, to aggregate there; None: on the mesh."""
        return None

    def recycle(self, results: Any) -> None:
        """Takes `results` back once the aggregation that reads them is dispatched."""


class HostBackend(abc.ABC):
    """Drives the clients from the host, outside the round's traced program.

    The engine calls, once when it is built: `client_multiple(mesh.size)`, `plan_sharding(mesh)` and
    `bind(update, mesh)`; every round goes through the bound backend (`BoundHostBackend`).
    """

    name: str
    vmaps_clients = False  # as `TracedBackend.vmaps_clients`

    @abc.abstractmethod
    def client_multiple(self, num_devices: int) -> int:
        """The plan's clients axis is padded to a multiple of this."""

    def plan_sharding(self, mesh: jax.sharding.Mesh) -> jax.sharding.Sharding:
        """Where the round's (R, m, ...) plans are placed: replicated unless overridden."""
        return mesh_lib.replicated(mesh)

    @abc.abstractmethod
    def bind(self, update: ClientUpdate, mesh: jax.sharding.Mesh) -> BoundHostBackend:
        """The backend's per-round runner for this update on this mesh."""


def backend_kind(backend: Any) -> type:
    """`TracedBackend` or `HostBackend`, whichever `backend` implements; a `TypeError`
    naming both protocols for anything else."""
    kinds = [kind for kind in (TracedBackend, HostBackend) if isinstance(backend, kind)]
    if len(kinds) != 1:
        which = "both" if kinds else "neither"
        raise TypeError(
            f"backend {backend!r} implements {which} of the backend protocols "
            "TracedBackend and HostBackend (fedjax_pals.engine.backends): subclass exactly one."
        )
    return kinds[0]
