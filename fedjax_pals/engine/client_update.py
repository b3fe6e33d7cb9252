"""A client's round as three pure functions: start, step, finish.

This is the unit every backend maps over a round's clients (FedJAX's
`client_init, client_step, client_final`):

    carry = start(server_state)
    carry = step(carry, x, y, mask, client_info, server_state)     # per minibatch
    result = finish(carry, client_info, server_state)              # delta, new client state, losses

`LocalTraining` fixes how many steps a client takes (E epochs of minibatch
SGD) and `client_schedule` the order in which it visits its examples.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from fedjax_pals.algorithms import ClientInfo, FederatedAlgorithm, ServerState
from fedjax_pals.models import Model


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """Local training of one round: E epochs of minibatch SGD (optax optimizer)."""

    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.1
    momentum: float | None = None

    def __post_init__(self):
        for name in ("local_epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if not (
            isinstance(self.learning_rate, (int, float)) and 0 < self.learning_rate < float("inf")
        ):
            raise ValueError(
                f"learning_rate must be a finite number > 0, got {self.learning_rate!r}."
            )
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}.")

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

    Each epoch is a fresh permutation of the client's n_i examples (key folded with the epoch), cut
    into batches of `batch_size`; the last batch of an epoch may be partial. Positions are laid out
    for the largest client: a client with fewer examples has masked positions and whole masked
    steps, which the local step treats as no-ops, so padding changes nothing.

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


class ClientResult(NamedTuple):
    """What `finish` returns for one client (stacked: `algorithms.ClientOutputs`)."""

    delta: Any  # theta_i - theta
    client_state: Any  # the client's new persistent state
    train_loss: jax.Array  # mean loss over its active steps
    num_steps: jax.Array
    initial_loss: jax.Array


class ClientUpdate(NamedTuple):
    """A client's round as pure functions (see the module docstring).

    start(state) -> LocalCarry
    step(carry, x, y, mask, info, state) -> LocalCarry; a step whose mask is all
      False leaves the carry unchanged (padding steps and padding clients).
    finish(carry, info, state) -> ClientResult
    """

    start: Callable[[ServerState], LocalCarry]
    step: Callable[..., LocalCarry]
    finish: Callable[[LocalCarry, ClientInfo, ServerState], ClientResult]


def make_local_step(
    algorithm: FederatedAlgorithm, model: Model, optimizer: optax.GradientTransformation
) -> Callable:
    """One client's SGD step on one batch: (carry, x, y, mask, info, state) -> carry.

    The loss is the mean cross-entropy over the batch's valid examples, or the client method's
    `data_loss` (plus its regulariser); a step whose batch is all padding leaves the carry
    unchanged.
    """
    method = algorithm.client

    def step(carry: LocalCarry, x, y, mask, info: ClientInfo, state: ServerState) -> LocalCarry:
        def loss_fn(params):
            logits = method.adjust_logits(model.apply(params, x), info, state)
            if method.data_loss is None:
                losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
                data_loss = jnp.sum(jnp.where(mask, losses, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
            else:
                global_logits = lambda: jax.lax.stop_gradient(model.apply(state.params, x))
                data_loss = method.data_loss(logits, y, mask, info, state, global_logits)
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


def make_client_update(
    algorithm: FederatedAlgorithm, model: Model, training: LocalTraining
) -> ClientUpdate:
    """The client update of `algorithm` with `model` trained as `training` says."""
    optimizer = training.optimizer()

    def start(state: ServerState) -> LocalCarry:
        return LocalCarry(
            state.params,
            optimizer.init(state.params),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.float32),
        )

    def finish(carry: LocalCarry, info: ClientInfo, state: ServerState) -> ClientResult:
        delta = jax.tree_util.tree_map(jnp.subtract, carry.params, state.params)
        if algorithm.client.finish_update is not None:  # e.g. clipped before it is sent
            delta = algorithm.client.finish_update(delta, info, state)
        new_client_state = algorithm.client.update_client_state(
            info, state, carry.params, carry.num_steps, training.learning_rate
        )
        mean_loss = carry.loss_sum / jnp.maximum(carry.num_steps, 1)
        return ClientResult(delta, new_client_state, mean_loss, carry.num_steps, carry.first_loss)

    return ClientUpdate(start, make_local_step(algorithm, model, optimizer), finish)
