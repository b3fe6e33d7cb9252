"""A host loop over clients in lanes, one lane per local device, a step per call.

On a CPU the vmapped conv step becomes a grouped convolution that runs ~5x slower than one client's
step, and a rolled `lax.scan` of conv steps is ~10x slower than a loop (jax issue 12868). So here
each client trains alone, with `steps_per_call` of its local steps unrolled in one jitted call, and
the clients (of every run of the round) are dealt round-robin to the mesh's devices: each local
device is a lane, and dispatches to the lanes are interleaved so that, with several host devices
(`jax_num_cpu_devices`) or processes, the cores work at once. The default is one step a call: on a
2-core CPU an unrolled 2-step call ran 3-7 % slower per step than two 1-step calls, alone on one
core and in the lanes alike (docs/decisions/0016-one-step-per-call.md), so fewer dispatches did
not pay for themselves.

The (run, participant) pairs are dealt in order: pair i goes to lane i mod D (D devices of the mesh,
in every process), as its lane's (i // D)-th client. Each lane writes its clients' results into a
buffer of its own ceil(R m / D) slots; in one process the lanes' buffers go to the first lane's
device as a list (`join_lanes` stacks them inside the aggregation), across processes they form one
(D, slots, ...) array sharded over the mesh; the round's aggregation interleaves them back into
(R, m, ...) (`gather_lanes`; across processes, an all-gather). A lane holds only its own clients'
results: D lanes hold R m of them in all, not D R m (1.76 GB per lane for 10,000 LeNet clients when
every lane held every slot).

The lanes' buffers outlive the round: the engine hands them back (`recycle`) once the aggregation
that reads them is dispatched, and the next round with the same shapes writes into them again: a
buffer above glibc's 32 MB mmap threshold is unmapped when freed, and a new one is faulted in page
by page (2.5 us a page on a 2-core VM; at 1,000 LeNet participants the round took 160,000 faults
with fresh buffers, 58,000 with reused ones). Only the loop that ran the last round keeps its
buffers: a sweep over many cached engines holds one round's buffers, not one set per engine.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals.algorithms import ClientOutputs
from fedjax_pals.engine import mesh as mesh_lib
from fedjax_pals.engine.backends.base import BoundHostBackend, HostBackend
from fedjax_pals.engine.client_update import ClientUpdate
from fedjax_pals.engine.plan import DeviceData, RoundPlan, client_slice, gather_batch


@dataclasses.dataclass(frozen=True)
class HostLoop(HostBackend):
    """Clients one at a time per lane (each reads the whole, replicated plan); `steps_per_call`
    local steps per jitted call."""

    steps_per_call: int = 1
    name: str = "host_loop"

    def __post_init__(self):
        k = self.steps_per_call
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"steps_per_call must be an integer >= 1, got {k!r}.")

    def client_multiple(self, num_devices: int) -> int:
        return 1

    def bind(self, update: ClientUpdate, mesh: jax.sharding.Mesh) -> "_BoundHostLoop":
        return _BoundHostLoop(update, mesh, self.steps_per_call)

    @staticmethod
    def gather_lanes(leaf: jax.Array, runs: int, m: int) -> jax.Array:
        """(D, slots, ...) lane buffers -> (runs, m, ...): pair i is lane i % D's slot i // D."""
        lanes, slots = leaf.shape[:2]
        pairs = jnp.swapaxes(leaf, 0, 1).reshape(lanes * slots, *leaf.shape[2:])
        return pairs[: runs * m].reshape(runs, m, *leaf.shape[2:])

    @classmethod
    def join_lanes(cls, buffers: Any, runs: int, m: int) -> ClientOutputs:
        """The round's outputs, (runs, m, ...), from what the bound loop returned: a list of
        the lanes' (1, slots, ...) buffers (one process) or their (D, slots, ...) stack."""
        if isinstance(buffers, list):
            buffers = jax.tree_util.tree_map(lambda *lanes: jnp.concatenate(lanes), *buffers)
        return ClientOutputs(
            *jax.tree_util.tree_map(lambda leaf: cls.gather_lanes(leaf, runs, m), buffers)
        )


# The one bound loop whose spare buffers are kept (a weak reference): keeping them for every
# cached engine would hold one round's outputs per engine.
_SPARES_HOLDER: list = [None]
_SPARES_HOLDER_LOCK = threading.Lock()


def _hold_spares(loop: "_BoundHostLoop") -> None:
    with _SPARES_HOLDER_LOCK:
        previous = _SPARES_HOLDER[0]() if _SPARES_HOLDER[0] is not None else None
        if previous is not None and previous is not loop:
            previous.drop_spares()
        _SPARES_HOLDER[0] = weakref.ref(loop)


def _run(tree, r):
    return jax.tree_util.tree_map(lambda leaf: leaf[r], tree)


def _blocks(active_steps: np.ndarray, k: int) -> list[np.ndarray]:
    """The active step indices cut into blocks of k, then of halving powers of two.

    A client with fewer than k steps left still takes them in few calls (2
    steps: one call, not two); at most log2(k) + 1 block sizes are compiled.
    """
    blocks, start = [], 0
    while start < len(active_steps):
        size = min(k, 1 << (len(active_steps) - start).bit_length() - 1)
        blocks.append(active_steps[start : start + size])
        start += size
    return blocks


class _BoundHostLoop(BoundHostBackend):
    def __init__(self, update: ClientUpdate, mesh, steps_per_call: int):
        self.mesh = mesh
        self.k = steps_per_call
        self.devices = list(mesh.devices.flat)
        self.lanes = mesh_lib.local_devices(mesh)
        # device -> (shapes, buffer): the lanes' buffers of the last round, to write into again.
        self._spare: dict = {}
        self._spare_lock = threading.Lock()
        self._last_shapes = None

        # The client's programs take its run's state and plan, sliced out beforehand (`_slice`,
        # data movement alone): their arithmetic does not depend on how many runs share the
        # round, so a run on a runs axis computes what it computes alone, bit for bit
        # (docs/measurements/batch_mates.md).
        def start(state):
            return update.start(state)

        def block(train_x, train_y, carry, state, plan: RoundPlan, j, steps):
            info, row, positions, mask = client_slice(plan, j)
            for t in range(steps.shape[0]):  # unrolled: a rolled scan of conv steps is slow on CPU
                x, y, m = gather_batch(train_x, train_y, row, positions[steps[t]], mask[steps[t]])
                carry = update.step(carry, x, y, m, info, state)
            return carry

        def empty(states, plans: RoundPlan, slots: int):
            state, plan = _run(states, 0), _run(plans, 0)
            shapes = jax.eval_shape(
                update.finish, update.start(state), client_slice(plan, 0)[0], state
            )
            # A leading axis of 1: the lanes' buffers are the shards of one (devices, ...) array.
            return jax.tree_util.tree_map(
                lambda leaf: jnp.zeros((1, slots, *leaf.shape), leaf.dtype), shapes
            )

        def finish_into(buffer, carry, state, plan: RoundPlan, j, slot, next_state):
            """Writes the client's result; starts the lane's next client (one dispatch fewer)."""
            result = update.finish(carry, client_slice(plan, j)[0], state)
            buffer = jax.tree_util.tree_map(lambda buf, x: buf.at[0, slot].set(x), buffer, result)
            return buffer, update.start(next_state)

        self._start = jax.jit(start)
        self._block = jax.jit(block, donate_argnums=(2,))
        self._empty = jax.jit(empty, static_argnums=2)
        self._finish_into = jax.jit(finish_into, donate_argnums=(0, 1))
        self._slice = jax.jit(_run)

    def _buffer(self, device, shapes, states, plans, slots: int):
        """The lane's buffer of the last round when its shapes still fit, else a new one."""
        with self._spare_lock:
            spare = self._spare.pop(device, None)
        if spare is not None and spare[0] == shapes:
            return spare[1]
        # Its value depends on no input, so jit would not place it on the lane's device.
        return jax.device_put(self._empty(states, plans, slots), device)

    def _keep(self, device, shapes, buffer) -> None:
        _hold_spares(self)
        with self._spare_lock:
            self._spare[device] = (shapes, buffer)

    def drop_spares(self) -> None:
        """Lets the kept buffers go (another loop now keeps its own)."""
        with self._spare_lock:
            self._spare.clear()

    def outputs(self, buffers, runs: int, m: int) -> ClientOutputs:
        """The round's (runs, m, ...) outputs from the lanes' buffers (in the aggregation)."""
        return HostLoop.join_lanes(buffers, runs, m)

    def aggregation_device(self, buffers) -> jax.Device | None:
        """The one device holding the lanes' buffers (one process): aggregate there, once."""
        held_by = jax.tree_util.tree_leaves(buffers)[0].sharding.device_set
        return next(iter(held_by)) if len(held_by) == 1 else None

    def recycle(self, buffers) -> None:
        """Takes back the lanes' buffers among `buffers` (what `__call__` returned, once
        nothing will read them again but computations already dispatched): the next round
        writes into them."""
        shapes, self._last_shapes = self._last_shapes, None
        if shapes is None:
            return
        if isinstance(buffers, list):  # one process: the first lane's own buffer, the rest copies
            self._keep(self.lanes[0], shapes, buffers[0])
            return
        leaves, treedef = jax.tree_util.tree_flatten(buffers)
        for device, shards in zip(self.lanes, mesh_lib.device_views(leaves, self.lanes)):
            self._keep(device, shapes, jax.tree_util.tree_unflatten(treedef, shards))

    def _lane(self, views, work, buffer, results: dict, device) -> Iterator[None]:
        """One lane's dispatches; yields after each so that the lanes interleave."""
        (train_x, train_y, *_), states, plans = views
        yield
        runs: dict = {}  # r -> (state, plan) of run r, sliced once a round on this lane

        def run(r):
            if r not in runs:
                runs[r] = self._slice((states, plans), np.int32(r))
            return runs[r]

        if work:
            carry = self._start(run(work[0][0])[0])
            for index, (r, j, blocks) in enumerate(work):
                state, plan = run(r)
                for steps in blocks:
                    carry = self._block(train_x, train_y, carry, state, plan, np.int32(j), steps)
                    yield
                next_r = work[index + 1][0] if index + 1 < len(work) else r
                buffer, carry = self._finish_into(
                    buffer, carry, state, plan, np.int32(j), np.int32(index), run(next_r)[0]
                )
        results[device] = buffer

    def __call__(self, data: DeviceData, states, plans: RoundPlan):
        """The lanes' buffers (`finish`'s results): a list of (1, slots, ...) trees on the first
        lane's device in one process, one tree of (devices, slots, ...) arrays across
        processes; `outputs` (`HostLoop.join_lanes`) gives the round's `ClientOutputs`. Hand
        them back with `recycle` when the aggregation is dispatched."""
        active = np.asarray(jnp.any(mesh_lib.local_view(plans.mask), axis=-1))  # (R, m, S)
        runs, m = active.shape[:2]
        items = [(r, j) for r in range(runs) for j in range(m)]
        work = {device: [] for device in self.devices}
        for i, (r, j) in enumerate(items):
            steps = np.flatnonzero(active[r, j]).astype(np.int32)
            work[self.devices[i % len(self.devices)]].append((r, j, _blocks(steps, self.k)))

        slots = -(-len(items) // len(self.devices))
        views = mesh_lib.device_views((data, states, plans), self.lanes)
        leaves, treedef = jax.tree_util.tree_flatten((states, plans))
        shapes = (slots, treedef, tuple((leaf.shape, leaf.dtype) for leaf in leaves))
        results = {}
        lanes = [
            self._lane(
                view, work[device], self._buffer(device, shapes, *view[1:], slots), results, device
            )
            for view, device in zip(views, self.lanes)
        ]
        while lanes:
            for lane in list(lanes):
                try:
                    next(lane)
                except StopIteration:
                    lanes.remove(lane)
        local = [results[device] for device in self.lanes]
        self._last_shapes = shapes
        if jax.process_count() == 1:
            # On the first lane's device: the round's aggregation runs there once. Sharded
            # over the mesh, every host device would gather and reduce its own replica of
            # the outputs (8 host devices, 1,000 LeNet clients: 5 GB peak, 1.5-1.9 s). The
            # other lanes' buffers are copied there, so they are kept now; the first lane's
            # comes back through `recycle`. The aggregation stacks them (`outputs`).
            first = self.lanes[0]
            for device, buffer in zip(self.lanes[1:], local[1:]):
                self._keep(device, shapes, buffer)
            return [jax.device_put(buffer, first) for buffer in local]
        sharding = mesh_lib.clients_sharding(self.mesh)

        def stack(*per_lane):
            shape = (len(self.devices), *per_lane[0].shape[1:])
            return jax.make_array_from_single_device_arrays(shape, sharding, list(per_lane))

        return jax.tree_util.tree_map(stack, *local)
