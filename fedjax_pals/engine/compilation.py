"""Counting XLA compilations through JAX's public monitoring events.

`jax.monitoring` reports `/jax/core/compile/backend_compile_duration` once per XLA compilation,
synchronously in the thread that triggered it. A `CompilationCounter` attributes those events to
whatever is running inside its `track()` context, so an engine can say how many programs it compiled
(and tests can check that a second round compiles nothing) without private APIs such as
`_cache_size`.
"""

from __future__ import annotations

import contextlib
import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE_EVENT,
)

_active = threading.local()
_registered = False
_lock = threading.Lock()


def _listen(event: str, duration: float, **kwargs) -> None:
    for counter in getattr(_active, "counters", ()):
        if event == BACKEND_COMPILE_EVENT:
            counter.compilations += 1
        if event in _COMPILE_EVENTS:
            counter.compile_seconds += duration


def _ensure_listener() -> None:
    global _registered
    with _lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_listen)
            _registered = True


class CompilationCounter:
    """XLA compilations (and trace + lower + compile seconds) inside `track()`."""

    def __init__(self):
        _ensure_listener()
        self.compilations = 0
        self.compile_seconds = 0.0

    @contextlib.contextmanager
    def track(self):
        counters = getattr(_active, "counters", ())
        _active.counters = (*counters, self)
        try:
            yield self
        finally:
            _active.counters = counters
