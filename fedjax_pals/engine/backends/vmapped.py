"""Backends traced into the round's single jitted program: vmap over clients.

`TracedBackend`s: `map_clients(update, data, state, plan) -> ClientOutputs`
is pure; the round engine wraps it with the plan, the sharding of the clients axis over the mesh
and the aggregation, and jits the whole round (vmapped over runs when several
runs go together). One launch per round: the accelerator default.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pals.algorithms import ClientOutputs, ServerState
from fedjax_pals.engine.backends.base import TracedBackend
from fedjax_pals.engine.client_update import ClientUpdate
from fedjax_pals.engine.plan import DeviceData, RoundPlan, gather_batch


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
    return jax.vmap(
        lambda info, row, positions, mask: client_round(
            update, data, state, info, row, positions, mask
        )
    )


@dataclasses.dataclass(frozen=True)
class VmapScan(TracedBackend):
    """vmap over the clients, `lax.scan` over their steps: one program per round.

    Memory holds every participant's params and activations at once; use
    `VmapChunked` for thousands of clients.
    """

    name: str = "vmap_scan"

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
        padded = -(-m // chunk) * chunk

        def pad_and_chunk(leaf):
            if padded > m:
                leaf = jnp.concatenate([leaf, jnp.zeros((padded - m, *leaf.shape[1:]), leaf.dtype)])
            return leaf.reshape(padded // chunk, chunk, *leaf.shape[1:])

        # Padding clients have an all-False mask: they take no step and are dropped.
        chunked = jax.tree_util.tree_map(
            pad_and_chunk, (plan.info, plan.rows, plan.positions, plan.mask)
        )
        update_chunk = _vmapped_client_round(update, data, state)
        outs = jax.lax.map(lambda args: update_chunk(*args), chunked)
        outs = jax.tree_util.tree_map(lambda leaf: leaf.reshape(padded, *leaf.shape[2:])[:m], outs)
        return ClientOutputs(*outs)
