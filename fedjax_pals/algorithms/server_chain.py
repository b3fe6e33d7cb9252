"""The server's operations on a round's updates, as one chain in declared order.

A round's updates pass through the same operations whatever the method, in this order:

    weights      alpha over the round's lanes: the method's weighting, and the sampler's
                 (Poisson sampling's fixed-denominator weights alpha_i / q); the weighting
                 declares the largest weight any one client can receive (`Weighting.max_weight`)
    clip         each update's L2 norm bounded (DP on updates' clipping)
    transform    any other change to the updates or their weights (compression, a robust
                 aggregation's re-weighting)
    noise        noise added to what the step aggregates (DP on updates' Gaussian noise)
    step         sum_i alpha_i Delta_i applied to the global model: the plain average
                 (eta_g = 1: theta = sum_i alpha_i theta_i) or a server optimiser (FedAdam ...)

The weights are the algorithm's `Weighting`; the step is `ServerChain.step`; the links between
are `ServerLink`s, each in one of `SLOTS` and ordered by it (`with_link`), whatever order the
features that add them are applied in. Each link receives the round's `RoundUpdates`, the
updates as the links before it left them, and two bounds the links after it rely on:
`max_weight`, what the weighting declares, and `clip_norm`, what the last clip link enforced
(inf before one). A link that changes the weights or the norms says so in them: the
sensitivity of the aggregate sum_i alpha_i Delta_i to one client's update being zeroed is
`clip_norm * max_weight` (`RoundUpdates.sensitivity`), which is what a noise link scales to.

A method whose server update is its own (SCAFFOLD's control variates, AFL's lambda step) has
no chain: a link, a sampler's weights or a server optimiser is refused for it.

Anchors: optax's `chain` (the order at one call site), pfl-research's ordered postprocessors,
DrJAX's aggregation as a weighted reduction.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

if TYPE_CHECKING:  # base imports this module
    from fedjax_pals.algorithms.base import ClientOutputs, FederatedAlgorithm, ServerState

# -- the steps: what closes the chain ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WeightedAverageUpdate:
    """theta <- theta + eta_g * sum_i alpha_i (theta_i - theta): the plain server update.

    With eta_g = 1 and alpha on the simplex this is theta = sum_i alpha_i theta_i, the
    aggregation of FedAvg (eq. 4) and FedPALS (eq. 8). A value, not a closure: equal learning
    rates give equal updates (one compiled round), and `with_server_optimizer` recognises it
    by type.
    """

    server_learning_rate: float = 1.0

    def __call__(self, state: ServerState, participants, outputs: ClientOutputs, weights):
        step = jax.tree_util.tree_map(
            lambda delta: self.server_learning_rate * delta,
            _weighted_mean_delta(outputs.deltas, weights),
        )
        return state._replace(
            params=optax.apply_updates(state.params, step),
            client_states=_set_client_states(state, participants, outputs),
        )


def _set_client_states(state, participants, outputs):
    """The participants' new persistent states written into the all-client stack."""
    return jax.tree_util.tree_map(
        lambda all_states, new: all_states.at[participants].set(new),
        state.client_states,
        outputs.client_states,
    )


def weighted_average_update(server_learning_rate: float = 1.0) -> WeightedAverageUpdate:
    """The plain server update (`WeightedAverageUpdate`)."""
    return WeightedAverageUpdate(server_learning_rate)


def _weighted_mean_delta(deltas, weights):
    """sum_i alpha_i (theta_i - theta)."""
    return jax.tree_util.tree_map(
        lambda delta: jnp.tensordot(weights.astype(delta.dtype), delta, axes=1), deltas
    )


@dataclasses.dataclass(frozen=True)
class OptimizerUpdate:
    """The server chain's step with a server optimiser: theta <- theta + optimizer step on
    -(sum_i alpha_i Delta_i), alpha from any weighting; reads and writes
    `state.server_opt_state` (initialised by `init_server_state` from
    `FederatedAlgorithm.server_optimizer`). A value: the same optimiser, one compiled round."""

    optimizer: optax.GradientTransformation
    label: str = "a server optimiser"

    def __call__(self, state: ServerState, participants, outputs: ClientOutputs, weights):
        delta = _weighted_mean_delta(outputs.deltas, weights)
        pseudo_gradient = jax.tree_util.tree_map(jnp.negative, delta)
        updates, opt_state = self.optimizer.update(
            pseudo_gradient, state.server_opt_state, state.params)
        return state._replace(
            params=optax.apply_updates(state.params, updates),
            client_states=_set_client_states(state, participants, outputs),
            server_opt_state=opt_state,
        )


def optimizer_update(optimizer: optax.GradientTransformation,
                     label: str = "a server optimiser") -> OptimizerUpdate:
    """The server chain's step with `optimizer` (`OptimizerUpdate`)."""
    return OptimizerUpdate(optimizer, label)




# -- the chain ---------------------------------------------------------------------------------

# The links' slots, in the order their links run (between the weights and the step).
SLOTS = ("clip", "transform", "noise")


class RoundUpdates(NamedTuple):
    """What a link receives and returns: the round's updates and what bounds them.

    deltas: each lane's update theta_i - theta, leaves stacked on a leading axis of m lanes.
    weights: (m,) the lanes' weights alpha (0 on a lane no client drew).
    participants: (m,) the lanes' client ids (M, the number of clients, on an empty lane).
    max_weight: () the largest weight any one client can receive this round, whoever was drawn
      (the weighting's declaration: max_i alpha_i over the lanes, or under Poisson sampling
      max_i alpha_i / q over every client).
    clip_norm: () the bound on each update's L2 norm over every leaf (inf: none).
    """

    deltas: Any
    weights: jax.Array
    participants: jax.Array
    max_weight: jax.Array
    clip_norm: jax.Array

    @property
    def sensitivity(self) -> jax.Array:
        """clip_norm * max_weight: how far zeroing one client's update can move
        sum_i alpha_i Delta_i (the weights held fixed): the L2 sensitivity a noise link
        scales its noise to (inf while no link has clipped)."""
        return self.clip_norm * self.max_weight


@dataclasses.dataclass(frozen=True)
class ServerLink:
    """One operation of the server chain: subclass it as a frozen dataclass, set `slot` (one of
    `SLOTS`) and implement `__call__`.

    __call__(state, updates) -> (updates, state): the round's `RoundUpdates` as the links before
      left them and the server state, traced inside the jitted round. A link keeps what persists
      across rounds in its own NamedTuple in `state.algorithm_state` (found by type,
      `fjp.find_state`) and may update it there; the round counter is `state.round`.
    describe() -> str: what it does, for the run's header ("clip to C=0.5").

    A value: links equal field by field share one compiled round, so per-run numbers (a clip
    norm that differs between the runs of a sweep) belong in the state, not in the fields.
    """

    slot: ClassVar[str] = ""

    def __call__(self, state: ServerState, updates: RoundUpdates
                 ) -> tuple[RoundUpdates, ServerState]:
        raise NotImplementedError(f"{type(self).__name__} implements __call__(state, updates).")

    def describe(self) -> str:
        return type(self).__name__


@dataclasses.dataclass(frozen=True)
class ServerChain:
    """The server update of a method that aggregates by weights: its links in slot order, then
    the step (module docstring). A value: equal chains share one compiled round."""

    links: tuple = ()
    step: Callable[..., Any] = WeightedAverageUpdate()

    def __call__(self, state: ServerState, participants: jax.Array, outputs: ClientOutputs,
                 weights: jax.Array, max_weight: jax.Array | None = None) -> ServerState:
        """The round's server update. `max_weight`: the weighting's declared bound (None: the
        largest of `weights`, which holds when the weights are fixed by who takes part)."""
        updates = RoundUpdates(
            outputs.deltas, weights, participants,
            jnp.max(weights) if max_weight is None else max_weight,
            jnp.asarray(jnp.inf, jnp.float32),
        )
        for link in self.links:
            updates, state = link(state, updates)
        return self.step(state, participants, outputs._replace(deltas=updates.deltas),
                         updates.weights)

    def describe(self, weighting: str = "the method's") -> str:
        """The chain in one line, in the order it runs."""
        step = getattr(self.step, "label", None) or (
            "the plain weighted average" if self.step == WeightedAverageUpdate()
            else f"weighted average, server learning rate {self.step.server_learning_rate:g}"
            if isinstance(self.step, WeightedAverageUpdate) else "a server optimiser")
        parts = [f"weights {weighting}", *(f"{link.slot}: {link.describe()}"
                                           for link in self.links), f"step: {step}"]
        return " -> ".join(parts)


def is_chained(server_update: Any) -> bool:
    """`server_update` aggregates by weights (a `ServerChain` or the bare plain average), so
    links, a sampler's weights and a server optimiser apply to it."""
    return isinstance(server_update, (ServerChain, WeightedAverageUpdate))


def chain_of(algorithm: FederatedAlgorithm) -> ServerChain:
    """`algorithm`'s server chain (the bare plain average is the chain without links).
    ValueError for a method whose server update is its own."""
    update = algorithm.server_update
    if isinstance(update, ServerChain):
        return update
    if isinstance(update, WeightedAverageUpdate):
        return ServerChain(step=update)
    raise ValueError(
        f"{algorithm.name!r} has a server update of its own (not a weighted average of the "
        "updates), so it has no server chain to add a link, a sampler's weights or a server "
        "optimiser to.")


def with_link(algorithm: FederatedAlgorithm, link: ServerLink) -> FederatedAlgorithm:
    """`algorithm` with `link` in its chain, after the links of its slot and of the slots
    before it (`SLOTS`), whatever was added before. ValueError: `link` is not a `ServerLink`
    with a slot of `SLOTS`, or the method has a server update of its own."""
    if not isinstance(link, ServerLink):
        raise ValueError(
            f"with_link takes a fedjax_pals.ServerLink (a frozen dataclass with a slot and "
            f"__call__(state, updates)), got {type(link).__name__}.")
    if link.slot not in SLOTS:
        raise ValueError(
            f"{type(link).__name__}.slot is {link.slot!r}, not one of the chain's slots "
            f"{list(SLOTS)} (in the order they run).")
    chain = chain_of(algorithm)
    position = SLOTS.index(link.slot)
    index = sum(1 for other in chain.links if SLOTS.index(other.slot) <= position)
    links = (*chain.links[:index], link, *chain.links[index:])
    return algorithm._replace(server_update=dataclasses.replace(chain, links=links))


def with_step(algorithm: FederatedAlgorithm, step: Callable[..., Any]) -> FederatedAlgorithm:
    """`algorithm` with the chain's step replaced (a server optimiser's update). ValueError
    when the step is not the plain average (one server optimiser a run) or the method's server
    update is its own."""
    chain = chain_of(algorithm)
    if chain.step != WeightedAverageUpdate():
        raise ValueError(
            f"{algorithm.name!r} already steps with {ServerChain(step=chain.step).describe()}; "
            "a server optimiser replaces the plain weighted average (eta_g = 1), once.")
    return algorithm._replace(server_update=dataclasses.replace(chain, step=step))


def server_round(algorithm: FederatedAlgorithm, state: ServerState, participants: jax.Array,
                 outputs: ClientOutputs, weights: jax.Array) -> ServerState:
    """The round's server update of `algorithm`: its chain, told the bound its weighting
    declares (`Weighting.max_weight`), or the method's own server update."""
    update = algorithm.server_update
    declared = algorithm.weighting.max_weight
    if declared is not None and isinstance(update, ServerChain):
        return update(state, participants, outputs, weights,
                      max_weight=declared(state, weights))
    if declared is not None and not isinstance(update, WeightedAverageUpdate):
        # A wrapper around the chain (the convention before it) would run the chain without
        # the bound: noise scaled to the round's lanes, too small under Poisson sampling.
        raise ValueError(
            f"{algorithm.name!r}: its weighting declares the largest weight a client can "
            f"receive (Poisson sampling), which only a server chain passes to its links, but "
            f"its server update is {type(update).__name__}; make what wraps the chain a link "
            "(fjp.ServerLink, fjp.with_link).")
    return update(state, participants, outputs, weights)


def describe(algorithm: FederatedAlgorithm) -> str:
    """`algorithm`'s server chain in one line (the run's header), or what it has instead."""
    weighting = algorithm.weighting.name
    if algorithm.weighting.max_weight is not None:
        weighting += " (declares the largest weight a client can receive)"
    if not is_chained(algorithm.server_update):
        return f"weights {weighting} -> the method's own server update"
    return chain_of(algorithm).describe(weighting)
