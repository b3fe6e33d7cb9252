"""The round engine: every participating client trained in one round.

A round is: broadcast the global state, run E local epochs of minibatch SGD
on each participant (a fixed number of steps per client, padded with masked
no-op steps so clients of different sizes share one shape), weigh the
participants (FedAvg, FedPALS, ...) and apply the server update.

How the client axis and the local steps execute is a *strategy*; all compute
the same numbers (tests/test_engine.py):

* "vmap_scan": one jit of the whole round, vmap over clients, lax.scan over
  steps. The accelerator default: one launch per round.
* "vmap_chunked": as vmap_scan, but clients go through `lax.map` in chunks of
  `chunk_size`, which bounds memory for thousands of clients.
* "vmap_steps": a host loop over local steps of one jitted all-clients step.
  Avoids scan's slow conv backward on CPU (jax issue 12868).
* "per_client": a host loop over clients and their steps of one jitted
  single-client step. On CPU the vmapped conv step becomes a grouped
  convolution that runs ~5x slower than this (REFERENCE.md section 5).

"auto" picks the default measured fastest on the backend (BUILD_NOTES.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pals.algorithms import ClientInfo, ClientOutputs, FederatedAlgorithm, ServerState
from fedjax_pals.models import Model

STRATEGIES = ("vmap_scan", "vmap_chunked", "vmap_steps", "per_client")


class DeviceData(NamedTuple):
    """The training split on the device once; clients are index tables into it."""

    train_x: jax.Array  # (N, ...)
    train_y: jax.Array  # (N,) int32
    client_indices: jax.Array  # (M, max_n) int32 rows into train_x, padded
    client_sizes: jax.Array  # (M,) int32
    client_label_dists: jax.Array  # (M, K) float32


def device_data(train_x, train_y, client_indices, client_sizes, client_label_dists) -> DeviceData:
    return DeviceData(
        jnp.asarray(train_x, jnp.float32),
        jnp.asarray(train_y, jnp.int32),
        jnp.asarray(client_indices, jnp.int32),
        jnp.asarray(client_sizes, jnp.int32),
        jnp.asarray(client_label_dists, jnp.float32),
    )


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """Local training of one round: E epochs of minibatch SGD (optax optimizer)."""

    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.1
    momentum: float | None = None

    def __post_init__(self):
        if self.local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {self.local_epochs}.")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}.")

    def optimizer(self) -> optax.GradientTransformation:
        return optax.sgd(self.learning_rate, momentum=self.momentum)

    def steps_per_epoch(self, max_examples: int) -> int:
        return -(-max_examples // self.batch_size)

    def num_steps(self, max_examples: int) -> int:
        return self.local_epochs * self.steps_per_epoch(max_examples)


def client_schedule(
    key: chex.PRNGKey, num_examples: jax.Array, max_examples: int, training: LocalTraining
) -> tuple[jax.Array, jax.Array]:
    """The order in which a client visits its examples in one round.

    Each epoch is a fresh permutation of the client's n_i examples (key folded
    with the epoch), cut into batches of `batch_size`; the last batch of an epoch
    may be partial. Positions are laid out for the largest client: a client
    with fewer examples has masked positions and whole masked steps, which the
    local step treats as no-ops, so padding changes nothing.

    Returns:
      positions (S, B) int32 into the client's index row and mask (S, B) bool,
      S = local_epochs * ceil(max_examples / batch_size).
    """
    per_epoch = training.steps_per_epoch(max_examples) * training.batch_size
    slots = jnp.arange(per_epoch)

    def epoch(e):
        noise = jax.random.uniform(jax.random.fold_in(key, e), (per_epoch,))
        # Real examples get keys in [0, 1), padding 2: argsort puts them first, shuffled.
        order = jnp.argsort(jnp.where(slots < num_examples, noise, 2.0))
        valid = slots < num_examples
        return jnp.where(valid, order, 0).astype(jnp.int32), valid

    positions, mask = jax.vmap(epoch)(jnp.arange(training.local_epochs))
    shape = (training.num_steps(max_examples), training.batch_size)
    return positions.reshape(shape), mask.reshape(shape)


class LocalCarry(NamedTuple):
    params: Any
    opt_state: Any
    num_steps: jax.Array  # int32, active steps taken
    loss_sum: jax.Array  # sum of the active steps' losses
    first_loss: jax.Array  # the first active step's loss: at the broadcast params


def make_local_step(
    algorithm: FederatedAlgorithm, model: Model, optimizer: optax.GradientTransformation
) -> Callable:
    """One client's SGD step on one batch: (carry, x, y, mask, info, state) -> carry.

    The loss is the mean cross-entropy over the batch's valid examples (plus
    the client method's regulariser); a step whose batch is all padding leaves
    the carry unchanged.
    """
    method = algorithm.client

    def step(carry: LocalCarry, x, y, mask, info: ClientInfo, state: ServerState) -> LocalCarry:
        def loss_fn(params):
            logits = method.adjust_logits(model.apply(params, x), info, state)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            data_loss = jnp.sum(jnp.where(mask, losses, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
            return data_loss + method.regularizer(params, state.params)

        loss, grads = jax.value_and_grad(loss_fn)(carry.params)
        grads = method.correct_grads(grads, info, state)
        updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
        params = optax.apply_updates(carry.params, updates)
        active = jnp.any(mask)
        keep = lambda new, old: jnp.where(active, new, old)
        return LocalCarry(
            jax.tree_util.tree_map(keep, params, carry.params),
            jax.tree_util.tree_map(keep, opt_state, carry.opt_state),
            carry.num_steps + active.astype(jnp.int32),
            carry.loss_sum + jnp.where(active, loss, 0.0),
            jnp.where(active & (carry.num_steps == 0), loss, carry.first_loss),
        )

    return step


class RoundPlan(NamedTuple):
    """Per-participant inputs of a round (leading axis m)."""

    participants: jax.Array  # (m,) client ids
    info: ClientInfo  # stacked participants' ClientInfo
    rows: jax.Array  # (m, max_n) index rows into the training split
    positions: jax.Array  # (m, S, B)
    mask: jax.Array  # (m, S, B)


def _client_slice(plan: RoundPlan, client):
    """(info, index row, positions, mask) of the plan's participant `client`."""
    return jax.tree_util.tree_map(
        lambda leaf: leaf[client], (plan.info, plan.rows, plan.positions, plan.mask)
    )


def _gather(data: DeviceData, row, positions, mask):
    idx = row[positions]
    return data.train_x[idx], data.train_y[idx], mask


class RoundEngine:
    """Builds and runs rounds of one algorithm, compiled once per data shape.

    `run_round(data, state, participants, key) -> (state, metrics)` trains the given
    participants (a (m,) int array of client ids; its length fixes the compiled
    shape) and applies the server update. Client keys are
    `fold_in(key, client_id)`, so a client's data order does not depend on the
    strategy or on who else participates.
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        model: Model,
        training: LocalTraining,
        *,
        strategy: str = "auto",
        chunk_size: int = 64,
    ):
        self.algorithm = algorithm
        self.model = model
        self.training = training
        self.strategy = resolve_strategy(strategy, model)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        self.chunk_size = chunk_size
        optimizer = training.optimizer()
        self._optimizer = optimizer
        self._step = make_local_step(algorithm, model, optimizer)
        # Every compiled piece is built once here and takes the data as an
        # argument: a closed-over array would be baked into the program as a constant.
        self._jit_plan = jax.jit(self._make_plan)
        self._jit_aggregate = jax.jit(self._aggregate)
        self._jit_round_scan = jax.jit(self._round_scan)
        self._jit_round_chunked = jax.jit(self._round_chunked)
        self._jit_start_stacked = jax.jit(self._start_stacked, static_argnums=(1,))
        self._jit_vmapped_step = jax.jit(self._vmapped_step)
        self._jit_vmapped_finish = jax.jit(jax.vmap(self._finish, in_axes=(0, 0, None)))
        self._jit_start = jax.jit(self._start)
        self._jit_client_step = jax.jit(self._client_step)
        self._jit_empty_outputs = jax.jit(self._empty_outputs)
        # The output buffer is donated: each client's result is written in place.
        self._jit_finish_into = jax.jit(self._finish_into, donate_argnums=(0,))

    # -- the pieces -------------------------------------------------------------

    def _make_plan(self, data: DeviceData, state: ServerState, participants, key) -> RoundPlan:
        sizes = data.client_sizes[participants]
        client_states = jax.tree_util.tree_map(lambda s: s[participants], state.client_states)
        info = ClientInfo(data.client_label_dists[participants], sizes, client_states)
        keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(participants)
        max_examples = data.client_indices.shape[1]
        positions, mask = jax.vmap(lambda k, n: client_schedule(k, n, max_examples, self.training))(
            keys, sizes
        )
        return RoundPlan(participants, info, data.client_indices[participants], positions, mask)

    def _start(self, state: ServerState) -> LocalCarry:
        return LocalCarry(
            state.params,
            self._optimizer.init(state.params),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.float32),
        )

    def _start_stacked(self, state: ServerState, num_participants: int) -> LocalCarry:
        return jax.tree_util.tree_map(
            lambda leaf: jnp.broadcast_to(leaf, (num_participants, *jnp.shape(leaf))),
            self._start(state),
        )

    def _finish(self, carry: LocalCarry, info: ClientInfo, state: ServerState):
        delta = jax.tree_util.tree_map(jnp.subtract, carry.params, state.params)
        new_client_state = self.algorithm.client.update_client_state(
            info, state, carry.params, carry.num_steps, self.training.learning_rate
        )
        mean_loss = carry.loss_sum / jnp.maximum(carry.num_steps, 1)
        return delta, new_client_state, mean_loss, carry.num_steps, carry.first_loss

    def _one_step(self, data: DeviceData, carry, state, info, row, positions, mask, step_index):
        x, y, m = _gather(data, row, positions[step_index], mask[step_index])
        return self._step(carry, x, y, m, info, state)

    def _client_update(self, data: DeviceData, state, info, row, positions, mask):
        """One client's whole round: start, scan over its steps, finish."""

        def body(carry, inputs):
            x, y, m = _gather(data, row, *inputs)
            return self._step(carry, x, y, m, info, state), None

        carry, _ = jax.lax.scan(body, self._start(state), (positions, mask))
        return self._finish(carry, info, state)

    def _aggregate(self, state: ServerState, plan: RoundPlan, outputs: ClientOutputs):
        weighting = self.algorithm.weighting
        by_id = (plan.participants,) if weighting.uses_participants else ()
        weights = weighting.weights(
            plan.info.label_dist, plan.info.num_examples.astype(jnp.float32), state, *by_id
        )
        new_state = self.algorithm.server_update(state, plan.participants, outputs, weights)
        metrics = {
            "weights": weights,
            "train_loss": outputs.train_loss,
            "initial_loss": outputs.initial_loss,
            "num_steps": outputs.num_steps,
        }
        return new_state, metrics

    # -- strategies -------------------------------------------------------------

    def _round_scan(self, data, state, participants, key):
        plan = self._make_plan(data, state, participants, key)
        outs = jax.vmap(self._client_update, in_axes=(None, None, 0, 0, 0, 0))(
            data, state, plan.info, plan.rows, plan.positions, plan.mask
        )
        return self._aggregate(state, plan, ClientOutputs(*outs))

    def _round_chunked(self, data, state, participants, key):
        plan = self._make_plan(data, state, participants, key)
        m = participants.shape[0]
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
        update = jax.vmap(self._client_update, in_axes=(None, None, 0, 0, 0, 0))
        outs = jax.lax.map(lambda args: update(data, state, *args), chunked)
        outs = jax.tree_util.tree_map(lambda leaf: leaf.reshape(padded, *leaf.shape[2:])[:m], outs)
        return self._aggregate(state, plan, ClientOutputs(*outs))

    def _vmapped_step(self, data, carry, state, plan: RoundPlan, step_index):
        def one(carry, info, row, positions, mask):
            return self._one_step(data, carry, state, info, row, positions, mask, step_index)

        return jax.vmap(one)(carry, plan.info, plan.rows, plan.positions, plan.mask)

    def _round_vmap_steps(self, data, state, participants, key):
        plan = self._jit_plan(data, state, participants, key)
        carry = self._jit_start_stacked(state, int(participants.shape[0]))
        for s in range(plan.positions.shape[1]):
            carry = self._jit_vmapped_step(data, carry, state, plan, np.int32(s))
        outs = self._jit_vmapped_finish(carry, plan.info, state)
        return self._jit_aggregate(state, plan, ClientOutputs(*outs))

    def _client_step(self, data, carry, state, plan: RoundPlan, client, step_index):
        info, row, positions, mask = _client_slice(plan, client)
        return self._one_step(data, carry, state, info, row, positions, mask, step_index)

    def _empty_outputs(self, state, plan: RoundPlan):
        info = _client_slice(plan, 0)[0]
        shapes = jax.eval_shape(self._finish, self._start(state), info, state)
        return jax.tree_util.tree_map(
            lambda leaf: jnp.zeros((plan.participants.shape[0], *leaf.shape), leaf.dtype), shapes
        )

    def _finish_into(self, outputs, carry, state, plan: RoundPlan, client):
        """Writes the client's result into `outputs`; returns them and a fresh carry.

        Starting the next client here saves a dispatch per client, which shows
        for small clients (a few steps each) on the CPU.
        """
        result = self._finish(carry, _client_slice(plan, client)[0], state)
        outputs = jax.tree_util.tree_map(lambda buf, r: buf.at[client].set(r), outputs, result)
        return outputs, self._start(state)

    def _round_per_client(self, data, state, participants, key):
        plan = self._jit_plan(data, state, participants, key)
        # Only the active steps run: a masked step is a no-op by construction.
        active_steps = np.asarray(jax.device_get(jnp.any(plan.mask, axis=2)))
        # Every per-client and per-step operation is inside a jitted function: an
        # eager slice on the host costs about as much as a small model's step.
        outputs = self._jit_empty_outputs(state, plan)
        carry = self._jit_start(state)
        for j in range(active_steps.shape[0]):
            client = np.int32(j)
            for s in np.flatnonzero(active_steps[j]):
                carry = self._jit_client_step(data, carry, state, plan, client, np.int32(s))
            outputs, carry = self._jit_finish_into(outputs, carry, state, plan, client)
        return self._jit_aggregate(state, plan, ClientOutputs(*outputs))

    # -- public -----------------------------------------------------------------

    def run_round(
        self, data: DeviceData, state: ServerState, participants: chex.Array, key: chex.PRNGKey
    ) -> tuple[ServerState, dict]:
        """One round on `data` for the given participants; returns (state, metrics)."""
        participants = jnp.asarray(participants, jnp.int32)
        if self.strategy == "vmap_scan":
            return self._jit_round_scan(data, state, participants, key)
        if self.strategy == "vmap_chunked":
            return self._jit_round_chunked(data, state, participants, key)
        if self.strategy == "vmap_steps":
            return self._round_vmap_steps(data, state, participants, key)
        return self._round_per_client(data, state, participants, key)

    def compilation_counts(self) -> dict[str, int]:
        """How many times each jitted piece has compiled (for tests and benchmarks)."""
        return {
            name[5:]: getattr(self, name)._cache_size()
            for name in vars(self)
            if name.startswith("_jit_")
        }


_ENGINES: dict = {}


def round_engine(
    algorithm: FederatedAlgorithm,
    model: Model,
    training: LocalTraining,
    *,
    strategy: str = "auto",
    chunk_size: int = 64,
) -> RoundEngine:
    """A RoundEngine shared by every run with the same structure.

    The key is what the compiled round depends on (the client method, the
    weighting function, the server update, the model, the local training and
    the strategy), not the per-run data held in the state (T, lam, params):
    a sweep over seeds, targets or lam compiles its round once.
    """
    strategy = resolve_strategy(strategy, model)
    key = (
        algorithm.client,
        algorithm.weighting.weights,
        algorithm.server_update,
        model,
        training,
        strategy,
        chunk_size,
    )
    if key not in _ENGINES:
        _ENGINES[key] = RoundEngine(
            algorithm, model, training, strategy=strategy, chunk_size=chunk_size
        )
    return _ENGINES[key]


def default_strategy(model: Model, backend: str | None = None) -> str:
    """The strategy measured fastest for this model on this backend (BUILD_NOTES.md)."""
    backend = backend or jax.default_backend()
    if backend != "cpu":
        return "vmap_scan"
    return "per_client" if model.is_convolutional else "vmap_chunked"


def resolve_strategy(strategy: str, model: Model) -> str:
    if strategy == "auto":
        return default_strategy(model)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose 'auto' or one of {STRATEGIES}.")
    return strategy
