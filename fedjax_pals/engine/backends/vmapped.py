"""`TracedBackend`s, traced into the round's single jitted program: vmap over clients (one
launch per round: the accelerator default)."""

from __future__ import annotations

import dataclasses
import functools

import jax

from fedjax_pals.algorithms import ClientOutputs, ServerState
from fedjax_pals.engine.backends.base import TracedBackend
from fedjax_pals.engine.client_update import ClientUpdate
from fedjax_pals.engine.plan import DeviceData, RoundPlan, gather_batch, pad_plan


def client_round(
    update: ClientUpdate, data: DeviceData, state: ServerState, info, row, positions, mask
):
    """One client's whole round: start, `lax.scan` over its steps, finish."""

    def body(carry, inputs):
        x, y, m = gather_batch(data.train_x, data.train_y, row, *inputs)
        return update.step(carry, x, y, m, info, state), None

    carry, _ = jax.lax.scan(body, update.start(state), (positions, mask))
    return update.finish(carry, info, state)


def _vmapped_client_round(update, data, state):
    return jax.vmap(functools.partial(client_round, update, data, state))


@dataclasses.dataclass(frozen=True)
class VmapScan(TracedBackend):
    """vmap over the clients, `lax.scan` over their steps: one program per round.

    Memory holds every participant's params and activations at once; use
    `VmapChunked` for thousands of clients.
    """

    name: str = "vmap_scan"
    vmaps_clients = True

    def client_multiple(self, num_devices: int) -> int:
        return num_devices

    def map_clients(
        self, update: ClientUpdate, data: DeviceData, state: ServerState, plan: RoundPlan
    ) -> ClientOutputs:
        outs = _vmapped_client_round(update, data, state)(
            plan.info, plan.rows, plan.positions, plan.mask
        )
        return ClientOutputs(*outs)


@dataclasses.dataclass(frozen=True)
class VmapChunked(TracedBackend):
    """As `VmapScan`, but the clients go through `lax.map` in chunks of `chunk_size`.

    Bounds memory for thousands of clients: only a chunk's params and
    activations are live. With a mesh, each chunk is spread over the devices.
    """

    chunk_size: int = 64
    name: str = "vmap_chunked"
    vmaps_clients = True

    def __post_init__(self):
        size = self.chunk_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {self.chunk_size!r}.")

    def client_multiple(self, num_devices: int) -> int:
        # A chunk is spread over the devices, so it holds a multiple of them.
        return -(-self.chunk_size // num_devices) * num_devices

    def map_clients(
        self, update: ClientUpdate, data: DeviceData, state: ServerState, plan: RoundPlan
    ) -> ClientOutputs:
        m = plan.participants.shape[0]
        chunk = min(self.chunk_size, m)
        plan = pad_plan(plan, chunk)  # padding clients: no step (all-False mask), dropped below
        padded = plan.participants.shape[0]
        chunked = jax.tree_util.tree_map(
            lambda leaf: leaf.reshape(padded // chunk, chunk, *leaf.shape[1:]),
            (plan.info, plan.rows, plan.positions, plan.mask),
        )
        update_chunk = _vmapped_client_round(update, data, state)
        outs = jax.lax.map(lambda args: update_chunk(*args), chunked)
        outs = jax.tree_util.tree_map(lambda leaf: leaf.reshape(padded, *leaf.shape[2:])[:m], outs)
        return ClientOutputs(*outs)
