"""Which engine each round of a run ran on: backend, devices, processes.

The engine is outside a run's identity (`config_digest`): a run may resume on another backend
or another number of devices. The numbers then agree to float32 rounding, not to the bit (the
reductions run in another order). results.json records, as `engine`, the segments of rounds
and what ran them:

    "engine": [{"first_round": 1, "backend": "host_loop", "devices": 2, "processes": 1},
               {"first_round": 7, "backend": "vmap_scan", "devices": 1, "processes": 1}]

round r ran on the last segment whose first_round <= r. A resume that changes the engine adds a
segment and says so in one warning line.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

_COMPARED = ("backend", "devices", "processes")


def current_engine(backend: str, first_round: int) -> dict:
    return {
        "first_round": int(first_round),
        "backend": backend,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
    }


def _describe(segment: Mapping[str, Any]) -> str:
    devices = segment.get("devices")
    where = f"backend {segment.get('backend')}"
    if devices is not None:
        where += f" on {devices} device(s)"
        if segment.get("processes", 1) != 1:
            where += f" in {segment['processes']} processes"
    return where


def engine_segments(
    previous: Mapping[str, Any] | None, start_round: int, backend: str
) -> tuple[list[dict], str | None]:
    """The run's engine segments once it (re)starts after `start_round` on `backend`.

    Args:
      previous: the run's results.json so far (None if none).
      start_round: the round of the checkpoint it resumes from (0: a fresh start).
      backend: the resolved engine backend it runs on now.

    Returns:
      (segments, warning): the segments to record, and a one-line warning when the rounds
      before `start_round` ran on another engine (None otherwise).
    """
    now = current_engine(backend, start_round + 1)
    earlier: list[dict] = []
    if start_round and previous:
        recorded = previous.get("engine")
        if isinstance(recorded, list):
            earlier = [
                dict(s)
                for s in recorded
                if isinstance(s, Mapping) and s.get("first_round", start_round + 1) <= start_round
            ]
        elif previous.get("backend"):  # results of a version that recorded only the backend
            earlier = [{"first_round": 1, "backend": previous["backend"]}]
    if not earlier:
        return [now], None
    last = earlier[-1]
    differs = [k for k in _COMPARED if last.get(k) is not None and last.get(k) != now[k]]
    if not differs:
        return earlier, None
    warning = (
        f"resuming after round {start_round} on {_describe(now)}, but rounds "
        f"{last['first_round']}-{start_round} ran on {_describe(last)}: the results agree to "
        "float rounding, not to the bit (a bit-identical resume needs the same backend and "
        "number of devices)."
    )
    return [*earlier, now], warning
