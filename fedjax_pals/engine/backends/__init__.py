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

"auto" picks the backend measured fastest on the platform
(docs/decisions/0003-backend-chosen-per-platform-and-model.md).

A backend is one file (a class implementing `TracedBackend` or `HostBackend`,
base.py) plus one `register_backend(name, factory)` entry; the engine has one
code path per kind and never looks at a backend's name.
"""

from __future__ import annotations

from typing import Callable

import jax

from fedjax_pals import _validation, extensions

from fedjax_pals.engine.backends.base import (
    BoundHostBackend,
    HostBackend,
    TracedBackend,
    backend_kind,
)
from fedjax_pals.engine.backends.host_loop import HostLoop
from fedjax_pals.engine.backends.vmap_steps import VmapSteps
from fedjax_pals.engine.backends.vmapped import VmapChunked, VmapScan
from fedjax_pals.models import Model

# name -> factory(chunk_size=..., steps_per_call=...) -> a TracedBackend or HostBackend.
_REGISTRY: dict[str, Callable[..., TracedBackend | HostBackend]] = {}


def register_backend(name: str, factory: Callable[..., TracedBackend | HostBackend]) -> None:
    """Makes `name` a backend: `factory(chunk_size=..., steps_per_call=...)` (the engine's
    options, as keywords; take what you use, `**_` the rest) returns its object."""
    _validation.check_registered_name(
        "backend", name, reserved=("auto",), deprecated_until="0.3.0"
    )
    _validation.check_hook(f"backend {name!r}", "factory", factory,
                           "(chunk_size=..., steps_per_call=...) -> backend",
                           keywords=("chunk_size", "steps_per_call"))
    if name in _REGISTRY:
        raise ValueError(f"backend {name!r} is already registered.")
    _REGISTRY[name] = factory
    extensions.note_registration("backend", name)


def backend_names() -> tuple[str, ...]:
    """Every registered backend's name (the built-in ones first: `BACKENDS`)."""
    return tuple(_REGISTRY)


register_backend("vmap_scan", lambda **_: VmapScan())
register_backend("vmap_chunked", lambda chunk_size=64, **_: VmapChunked(chunk_size=chunk_size))
register_backend("vmap_steps", lambda **_: VmapSteps())
register_backend("host_loop", lambda steps_per_call=1, **_: HostLoop(steps_per_call=steps_per_call))

# The built-in backends (what config validation and the tests enumerate).
BACKENDS = backend_names()


def default_backend(model: Model, platform: str | None = None) -> str:
    """The backend measured fastest for this model on this platform
    (docs/decisions/0003-backend-chosen-per-platform-and-model.md)."""
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return "vmap_scan"
    return "host_loop" if model.is_convolutional else "vmap_chunked"


def resolve_backend(backend: str, model: Model, mesh: jax.sharding.Mesh | None = None) -> str:
    if backend == "auto":
        platform = None if mesh is None else mesh.devices.flat[0].platform
        return default_backend(model, platform)
    if backend not in _REGISTRY:
        raise ValueError(f"unknown backend {backend!r}; choose 'auto' or one of {backend_names()}.")
    return backend


def make_backend(
    name: str, *, chunk_size: int = 64, steps_per_call: int = 1
) -> TracedBackend | HostBackend:
    """The backend object of a resolved name (a `TypeError` if it implements neither kind)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose one of {backend_names()}.")
    backend = _REGISTRY[name](chunk_size=chunk_size, steps_per_call=steps_per_call)
    backend_kind(backend)
    return backend
