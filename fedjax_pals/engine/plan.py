"""The data a round runs on and its per-participant plan.

`DeviceData` holds the training split on the devices once; clients are rows of indices into it. A
round's `RoundPlan` stacks, over its participants, what each needs: its `ClientInfo`, its index row
and its step schedule. Client keys are `fold_in(round_key, client_id)`, so a client's data order
depends neither on the backend nor on who else takes part.

With a runs axis (several runs in one program, `RoundEngine.run_rounds`) the client tables
(`client_indices`, `client_sizes`, `client_label_dists`) carry a leading runs axis; the examples
themselves are shared.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals._host import is_aligned
from fedjax_pals.algorithms import ClientInfo, ServerState
from fedjax_pals.data.datasets import stored_input_dtype
from fedjax_pals.engine.client_update import LocalTraining, client_schedule


class DeviceData(NamedTuple):
    """The training split on the device once; clients are index tables into it."""

    train_x: jax.Array  # (N, ...) as stored: uint8 pixels, int32 tokens, float32
    train_y: jax.Array  # (N,) int32
    client_indices: jax.Array  # ([R,] M, max_n) int32 rows into train_x, padded
    client_sizes: jax.Array  # ([R,] M) int32
    client_label_dists: jax.Array  # ([R,] M, K) float32


# vmap axes of DeviceData over the runs axis: examples shared, client tables per run.
RUNS_AXES = DeviceData(None, None, 0, 0, 0)


def _examples_on_device(x, dtype) -> jax.Array:
    """`x` on the default device; on a CPU, a read-only, 64-byte-aligned, C-contiguous NumPy
    array of `dtype` is not copied (the device buffer aliases it), so the data set is held
    once per process: `fjp.load_fashion_mnist` returns such arrays. Anything else is copied
    (a writeable array could change under the device's feet)."""
    if isinstance(x, np.ndarray) and (
        x.dtype == dtype
        and x.flags.c_contiguous
        and not x.flags.writeable
        and is_aligned(x)
        and jax.default_backend() == "cpu"
    ):
        return jax.device_put(x)
    return jnp.array(x, dtype, copy=True)  # never an alias: device_put may alias any aligned one


def device_data(train_x, train_y, client_indices, client_sizes, client_label_dists) -> DeviceData:
    """DeviceData from host arrays (placed on the default device; see `mesh.replicate`); the
    examples in their stored dtype (uint8 pixels stay uint8: the model scales them per batch)
    as `_examples_on_device` places them (a loader's read-only arrays: no copy)."""
    return DeviceData(
        _examples_on_device(train_x, stored_input_dtype(np.asarray(train_x).dtype)),
        _examples_on_device(train_y, np.int32),
        jnp.asarray(client_indices, jnp.int32),
        jnp.asarray(client_sizes, jnp.int32),
        jnp.asarray(client_label_dists, jnp.float32),
    )


class RoundPlan(NamedTuple):
    """Per-participant inputs of a round (leading axis m)."""

    participants: jax.Array  # (m,) client ids
    info: ClientInfo  # stacked participants' ClientInfo
    rows: jax.Array  # (m, max_n) index rows into the training split
    positions: jax.Array  # (m, S, B)
    mask: jax.Array  # (m, S, B)


def make_plan(
    training: LocalTraining, data: DeviceData, state: ServerState, participants, key
) -> RoundPlan:
    """The plan of one round of one run (traceable).

    A participant id M (the number of clients; Poisson sampling's padding,
    `fedjax_pals.training.sample_poisson_participants`) is a lane no client drew: it reads
    client M - 1's tables with zero examples, so it takes no step; its weight is 0 and the
    server update's scatter of client states drops it (out of range).
    """
    num_clients = data.client_sizes.shape[0]
    drawn = jnp.minimum(participants, num_clients - 1)
    sizes = jnp.where(participants < num_clients, data.client_sizes[drawn], 0)
    client_states = jax.tree_util.tree_map(lambda s: s[drawn], state.client_states)
    info = ClientInfo(data.client_label_dists[drawn], sizes, client_states)
    keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(participants)
    max_examples = data.client_indices.shape[1]
    positions, mask = jax.vmap(lambda k, n: client_schedule(k, n, max_examples, training))(
        keys, sizes
    )
    return RoundPlan(participants, info, data.client_indices[drawn], positions, mask)


def pad_plan(plan: RoundPlan, multiple: int) -> RoundPlan:
    """The plan with participants appended up to a multiple of `multiple`.

    A padding participant has an all-False mask: it takes no step, its result
    is dropped before the server update and it gets no weight.
    """
    m = plan.participants.shape[0]
    padded = -(-m // multiple) * multiple
    if padded == m:
        return plan

    def pad(leaf):
        return jnp.concatenate([leaf, jnp.zeros((padded - m, *leaf.shape[1:]), leaf.dtype)])

    return jax.tree_util.tree_map(pad, plan)


def client_slice(plan: RoundPlan, client):
    """(info, index row, positions, mask) of the plan's participant `client`."""
    return jax.tree_util.tree_map(
        lambda leaf: leaf[client], (plan.info, plan.rows, plan.positions, plan.mask)
    )


def gather_batch(train_x, train_y, row, positions, mask):
    """The examples of one step: (x, y, mask) from index positions into a client's row."""
    idx = row[positions]
    return train_x[idx], train_y[idx], mask
