"""A host loop over local steps of one jitted all-clients step.

Avoids `lax.scan`'s slow conv backward on CPU (jax issue 12868) while keeping the clients vmapped;
the clients axis is sharded over the mesh like the traced backends'. A `HostBackend`: its results
are the round's `ClientOutputs` as they are, nothing to recycle.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fedjax_pals.algorithms import ClientOutputs
from fedjax_pals.engine.backends.base import BoundHostBackend, HostBackend
from fedjax_pals.engine.client_update import ClientUpdate
from fedjax_pals.engine.plan import DeviceData, RoundPlan, gather_batch
from fedjax_pals.engine import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class VmapSteps(HostBackend):
    name: str = "vmap_steps"
    vmaps_clients = True

    def client_multiple(self, num_devices: int) -> int:
        return num_devices

    def plan_sharding(self, mesh: jax.sharding.Mesh) -> jax.sharding.Sharding:
        return mesh_lib.clients_sharding(mesh, leading=1)  # the plan's clients axis is split

    def bind(self, update: ClientUpdate, mesh: jax.sharding.Mesh) -> "_BoundVmapSteps":
        return _BoundVmapSteps(update, mesh)


class _BoundVmapSteps(BoundHostBackend):
    """Runs (R runs x m clients) with one jitted call per local step."""

    def __init__(self, update: ClientUpdate, mesh):
        self.mesh = mesh
        clients = mesh_lib.clients_sharding(mesh, leading=1)  # (R, m, ...) sharded on m

        def start(states, plans):
            def one_run(state, plan):
                carry = update.start(state)
                m = plan.participants.shape[0]
                return jax.tree_util.tree_map(
                    lambda leaf: jax.numpy.broadcast_to(leaf, (m, *leaf.shape)), carry
                )

            return jax.vmap(one_run)(states, plans)

        def step(data: DeviceData, carry, states, plans: RoundPlan, s):
            def one_run(carry, state, plan):
                def one_client(carry, info, row, positions, mask):
                    x, y, m = gather_batch(data.train_x, data.train_y, row, positions[s], mask[s])
                    return update.step(carry, x, y, m, info, state)

                return jax.vmap(one_client)(carry, plan.info, plan.rows, plan.positions, plan.mask)

            return jax.vmap(one_run)(carry, states, plans)

        def finish(carry, states, plans: RoundPlan):
            def one_run(carry, state, plan):
                return jax.vmap(update.finish, in_axes=(0, 0, None))(carry, plan.info, state)

            return ClientOutputs(*jax.vmap(one_run)(carry, states, plans))

        self._start = jax.jit(start, out_shardings=clients)
        self._step = jax.jit(step, out_shardings=clients, donate_argnums=(1,))
        self._finish = jax.jit(finish, out_shardings=clients)

    def __call__(self, data: DeviceData, states, plans: RoundPlan) -> ClientOutputs:
        carry = self._start(states, plans)
        for s in range(plans.positions.shape[2]):
            carry = self._step(data, carry, states, plans, np.int32(s))
        return self._finish(carry, states, plans)
