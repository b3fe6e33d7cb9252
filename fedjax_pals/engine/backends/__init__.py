"""Backends: how a round's client updates are mapped over its clients.

Each backend is a small unit computing the same numbers
(tests/test_backends.py):

* "vmap_scan": one jitted program per round, vmap over clients, `lax.scan`
  over steps. The accelerator default: one launch per round.
* "vmap_chunked": as vmap_scan, clients through `lax.map` in chunks of
  `chunk_size` (bounded memory for thousands of clients).
* "vmap_steps": a host loop over local steps of one jitted all-clients step.
* "host_loop": clients one at a time in lanes, one per local device, with
  `steps_per_call` local steps unrolled per jitted call. The CPU default for
  convolutional models.

"auto" picks the backend measured fastest on the platform (BUILD_NOTES.md).
"""

from __future__ import annotations

import jax

from fedjax_pals.engine.backends.host_loop import HostLoop
from fedjax_pals.engine.backends.vmap_steps import VmapSteps
from fedjax_pals.engine.backends.vmapped import VmapChunked, VmapScan
from fedjax_pals.models import Model

BACKENDS = ("vmap_scan", "vmap_chunked", "vmap_steps", "host_loop")


def default_backend(model: Model, platform: str | None = None) -> str:
    """The backend measured fastest for this model on this platform (BUILD_NOTES.md)."""
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return "vmap_scan"
    return "host_loop" if model.is_convolutional else "vmap_chunked"


def resolve_backend(backend: str, model: Model, mesh: jax.sharding.Mesh | None = None) -> str:
    if backend == "auto":
        platform = None if mesh is None else mesh.devices.flat[0].platform
        return default_backend(model, platform)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose 'auto' or one of {BACKENDS}.")
    return backend


def make_backend(name: str, *, chunk_size: int = 64, steps_per_call: int = 1):
    """The backend object of a resolved name."""
    if name == "vmap_scan":
        return VmapScan()
    if name == "vmap_chunked":
        return VmapChunked(chunk_size=chunk_size)
    if name == "vmap_steps":
        return VmapSteps()
    if name == "host_loop":
        return HostLoop(steps_per_call=steps_per_call)
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}.")
