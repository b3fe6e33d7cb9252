"""The round engine: client updates mapped over a mesh's clients axis, by backends.

* `client_update`: a client's round as start / step / finish, `LocalTraining`.
* `plan`: the data on the devices and a round's per-participant plan.
* `backends`: how the client updates are mapped (vmap_scan, vmap_chunked,
  vmap_steps, host_loop): each a `TracedBackend` or a `HostBackend`, by name
  in a registry (`register_backend`).
* `mesh`: the clients placement axis over devices and processes.
* `round`: `RoundEngine` (plan, map, weighted reduction, server update; one
  run or a runs axis) and the `round_engine` cache.
* `compilation`: counting compilations through `jax.monitoring`.
* `convs`: a vmapped client update's convolutions as patches times kernel (`matmul_convs`),
  and counting a program's (grouped) convolutions (`conv_groups`, `grouped_convs`).
"""

from fedjax_pals.engine.backends import (
    BACKENDS,
    BoundHostBackend,
    HostBackend,
    TracedBackend,
    backend_names,
    default_backend,
    make_backend,
    register_backend,
    resolve_backend,
)
from fedjax_pals.engine.client_update import (
    ClientResult,
    ClientUpdate,
    LocalCarry,
    LocalTraining,
    client_schedule,
    make_client_update,
    make_local_step,
)
from fedjax_pals.engine.compilation import CompilationCounter
from fedjax_pals.engine.convs import VMAPPED_CONVS, conv_groups, grouped_convs, matmul_convs
from fedjax_pals.engine.mesh import client_mesh, local_view, replicate
from fedjax_pals.engine.plan import DeviceData, RoundPlan, device_data, make_plan
from fedjax_pals.engine.round import RoundEngine, cached_engines, engine_key, round_engine
from fedjax_pals.engine.structure import structure_key

__all__ = [
    "BACKENDS",
    "BoundHostBackend",
    "ClientResult",
    "ClientUpdate",
    "CompilationCounter",
    "DeviceData",
    "HostBackend",
    "LocalCarry",
    "LocalTraining",
    "RoundEngine",
    "RoundPlan",
    "TracedBackend",
    "VMAPPED_CONVS",
    "backend_names",
    "cached_engines",
    "client_mesh",
    "client_schedule",
    "conv_groups",
    "default_backend",
    "device_data",
    "engine_key",
    "grouped_convs",
    "local_view",
    "make_backend",
    "make_client_update",
    "make_local_step",
    "make_plan",
    "matmul_convs",
    "register_backend",
    "replicate",
    "resolve_backend",
    "round_engine",
    "structure_key",
]
