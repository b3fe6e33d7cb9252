"""Federated algorithms as explicit pure functions over pytrees.

An algorithm is split the way the paper splits FedPALS from FedProx
(Sec. 5, App. B.9): a *client method* says how a client trains locally (its
loss, gradient correction and persistent state), a *weighting* says how the
server weighs the clients' updates, and a *server update* turns the weighted
updates into the next global state. FedAvg and FedPALS share the client
method (plain SGD) and the server update and differ only in their weights
(eq. 4 vs eq. 8).

All state that lives across rounds is in `ServerState`: the global params,
every client's persistent state stacked on a leading client axis (SCAFFOLD's
control variates), and the algorithm's own server-side state. Each piece's state is a
NamedTuple of its own (`ScaffoldState`, `FedPalsState`, ...), found by its type (`find_state`).

The FedPALS paper (Sec. 5) names the baselines but not their updates; each method's module
implements the update of the paper it cites. Every method trains locally with the same plain
minibatch SGD (no momentum, no weight decay, no clipping), E local epochs per round, as the
FedPALS paper trains all methods alike (Sec. 5); references that use another local optimiser
are noted in their module.

Compilation sharing. `engine.round_engine` keys its compiled rounds on the structure of
(client method, weighting function, server update, model, training, strategy): a function's
code and the values it closes over (`engine.structure_key`), so equal hyperparameters share
one program whether or not a builder is cached. Anything that varies between runs
(FedShift's aggregate label distribution, FedPALS' target) lives in the `ServerState`
(`algorithm_state` / `weighting_state`), never in a closure.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, TypeVar

import chex
import jax
import jax.numpy as jnp
import optax

from fedjax_pals import server_weights
from fedjax_pals.algorithms import server_chain
from fedjax_pals.algorithms.server_optimizers import weighted_average_update

Params = chex.ArrayTree
PyTree = Any
StateT = TypeVar("StateT")


class ServerState(NamedTuple):
    params: Params
    client_states: PyTree  # leading axis: all M clients; () when stateless
    algorithm_state: PyTree  # the method's server-side NamedTuple (ScaffoldState); () when none
    weighting_state: PyTree  # the weighting's NamedTuple (FedPalsState: T, lam); () when none
    round: jax.Array  # int32, rounds completed
    # The server optimiser's state (server_optimizers.py: FedAdam's m and v, FedAvgM's
    # momentum); () for the plain weighted average. Last and defaulted: existing callers and
    # checkpoints of the runs without a server optimiser keep their shape.
    server_opt_state: PyTree = ()


class ClientInfo(NamedTuple):
    """What a client knows about itself during a round (one client's slice)."""

    label_dist: jax.Array  # (K,) its label distribution S_i(Y)
    num_examples: jax.Array  # int32, n_i
    state: PyTree  # its persistent state (ServerState.client_states[i])


class ClientMethod(NamedTuple):
    """The client-side part of an algorithm: pure functions used by every local step.

    adjust_logits(logits, info, server_state) -> logits  (training only; FedRS, FedShift)
    regularizer(params, global_params) -> scalar          (added to the loss; FedProx)
    correct_grads(grads, info, server_state) -> grads     (SCAFFOLD's c - c_i)
    init_client_state(params) -> state                    (per-client persistent state)
    update_client_state(info, server_state, local_params, num_steps, learning_rate) -> state
    data_loss(logits, labels, mask, info, server_state, global_logits) -> scalar, or None:
      the batch's data loss from its (adjusted) logits, labels and mask of valid examples, in
      place of the mean cross-entropy over the valid examples (IW-ERM's weighted loss,
      FedVLS' distillation); `global_logits()` gives the broadcast global model's logits on
      the batch (constant in the local params), computed only where it is called.
    finish_update(delta, info, server_state) -> delta, or None: the update theta_i - theta as
      it leaves the client (DP on updates' client-side clipping, `dp_clipping='client'`).
    """

    name: str
    adjust_logits: Callable[[jax.Array, ClientInfo, ServerState], jax.Array]
    regularizer: Callable[[Params, Params], jax.Array]
    correct_grads: Callable[[Params, ClientInfo, ServerState], Params]
    init_client_state: Callable[[Params], PyTree]
    update_client_state: Callable[[ClientInfo, ServerState, Params, jax.Array, float], PyTree]
    # Last and defaulted: a client method built before it (positionally too) keeps its loss.
    data_loss: Callable[..., jax.Array] | None = None
    # finish_update(delta, info, server_state) -> delta: the update as it leaves the client,
    # or None (as trained). DP on updates' client-side clipping; what the server receives.
    finish_update: Callable[[Params, ClientInfo, ServerState], Params] | None = None


def _identity_logits(logits, info, state):
    return logits


def _no_regularizer(params, global_params):
    return jnp.zeros((), jnp.float32)


def _identity_grads(grads, info, state):
    return grads


def _no_client_state(params):
    return ()


def _keep_client_state(info, state, params, steps, learning_rate):
    return info.state


@functools.cache
def plain_sgd() -> ClientMethod:
    """Local SGD on the cross-entropy, as in FedAvg (McMahan et al., 2017)."""
    return ClientMethod(
        name="sgd", adjust_logits=_identity_logits, regularizer=_no_regularizer,
        correct_grads=_identity_grads, init_client_state=_no_client_state,
        update_client_state=_keep_client_state,
    )


class Weighting(NamedTuple):
    """How the server weighs the participants' updates.

    init() -> the weighting's data, kept in ServerState.weighting_state so that
      runs differing only in it (another target, another lam) share one compiled
      round.
    weights(label_dists (m, K), sizes (m,), state, participants (m,)) -> simplex
      weights (m,): the round's participants' label distributions and sizes, the
      server state, and the participants' client ids (for what the state keeps per
      client, e.g. AFL's lambda or a released copy of S).
    max_weight(state, weights (m,)) -> (): the largest weight any one client can receive in
      the round, whoever takes part, or None: the largest of the round's `weights` (true of
      weights fixed by who takes part). Poisson sampling's declares max_i alpha_i / q over
      every client. What the server chain's links read as `RoundUpdates.max_weight`
      (`server_chain`: DP on updates' noise scales to it).
    """

    name: str
    init: Callable[[], PyTree]
    weights: Callable[[jax.Array, jax.Array, "ServerState", jax.Array], jax.Array]
    # Last and defaulted: a weighting built before it keeps its bound.
    max_weight: Callable[["ServerState", jax.Array], jax.Array] | None = None


def _no_weighting_state():
    return ()


def _fedavg_weights(label_dists, sizes, state, participants):
    return server_weights.fedavg_weights(sizes)


def fedavg_weighting() -> Weighting:
    """alpha_i = n_i / N over the participants (eq. 4)."""
    return Weighting("fedavg", _no_weighting_state, _fedavg_weights)


class ClientOutputs(NamedTuple):
    """Stacked over the round's participants (leading axis m)."""

    deltas: Params  # theta_i - theta (local minus global params)
    client_states: PyTree  # the participants' new persistent states
    train_loss: jax.Array  # (m,) mean training loss over the local steps
    num_steps: jax.Array  # (m,) local SGD steps taken
    initial_loss: jax.Array  # (m,) loss of the first minibatch at the broadcast params


ServerUpdate = Callable[[ServerState, jax.Array, ClientOutputs, jax.Array], ServerState]


class FederatedAlgorithm(NamedTuple):
    """A federated algorithm: client method, server weighting and server update.

    init_algorithm_state(params, num_clients) -> the server-side extras.
    eval_params(state) -> the params to evaluate (the averaged iterate for AFL).
    server_update: for a method that aggregates by weights, a `server_chain.ServerChain` (or
      the bare plain average, `WeightedAverageUpdate`): the links between the weights and the
      step, in declared order; else the method's own (SCAFFOLD, AFL).
    server_optimizer: the optax transformation whose state `init_server_state` puts in
      `ServerState.server_opt_state` (server_optimizers.with_server_optimizer sets it with
      the chain's step that reads it); None for the plain weighted average.
    """

    name: str
    client: ClientMethod
    weighting: Weighting
    server_update: ServerUpdate
    init_algorithm_state: Callable[[Params, int], PyTree]
    eval_params: Callable[[ServerState], Params]
    server_optimizer: optax.GradientTransformation | None = None


def weights_over_clients(
    algorithm: FederatedAlgorithm, client_label_dists: Any, client_sizes: Any,
    state: ServerState, sampling_rate: float | None = None,
) -> Any:
    """The server's weights alpha of `state` with every client taking part, as float64 NumPy
    (the weighting's, as it moves: AFL's lambda, adaptive lambda, T re-estimated). Under
    Poisson sampling with rate q (`sampling_rate`), alpha over every client (a drawn client's
    update is weighted alpha_i / q, so the weighting's lanes give alpha_i / q)."""
    import numpy as np

    num_clients = len(client_sizes)
    alpha = algorithm.weighting.weights(
        jnp.asarray(client_label_dists, jnp.float32), jnp.asarray(client_sizes, jnp.float32),
        state, jnp.arange(num_clients),
    )
    alpha = np.asarray(alpha, np.float64)
    return alpha if sampling_rate is None else alpha * sampling_rate


def init_server_state(
    algorithm: FederatedAlgorithm, params: Params, num_clients: int
) -> ServerState:
    one = algorithm.client.init_client_state(params)
    client_states = jax.tree_util.tree_map(
        lambda leaf: jnp.broadcast_to(leaf, (num_clients, *jnp.shape(leaf))), one
    )
    optimizer = algorithm.server_optimizer
    return ServerState(
        params=params, client_states=client_states,
        algorithm_state=algorithm.init_algorithm_state(params, num_clients),
        weighting_state=algorithm.weighting.init(), round=jnp.zeros((), jnp.int32),
        server_opt_state=() if optimizer is None else optimizer.init(params),
    )


def _no_algorithm_state(params, num_clients):
    return ()


def _global_params(state):
    return state.params


def with_client_method(
    algorithm: FederatedAlgorithm, client: ClientMethod, name: str | None = None
) -> FederatedAlgorithm:
    """The same server side with another client method (e.g. FedProx + FedPALS)."""
    return algorithm._replace(client=client, name=name or f"{client.name}+{algorithm.name}")


def combine(
    client_method: ClientMethod, weighting: Weighting | None = None, name: str | None = None,
    *, algorithm_state: PyTree = (),
) -> FederatedAlgorithm:
    """A client method with FedAvg (weighting None) or any weighting, e.g. FedPALS.

    The server update is the weighted average theta <- sum_i alpha_i theta_i.
    `algorithm_state` is per-run data the client method reads from the state
    (FedShift's P); it is placed in `ServerState.algorithm_state` at init.
    """
    weighting = weighting if weighting is not None else fedavg_weighting()
    if isinstance(algorithm_state, tuple) and not algorithm_state:
        init = _no_algorithm_state
    else:

        def init(params, num_clients, data=algorithm_state):
            return data

    return FederatedAlgorithm(
        name=name or f"{client_method.name}+{weighting.name}", client=client_method,
        weighting=weighting, server_update=weighted_average_update(), init_algorithm_state=init,
        eval_params=_global_params,
    )


def _suffix(name: str, weighting: Weighting | None) -> str:
    """`name`, or `name+<weighting>` for a weighting other than FedAvg's."""
    return name if weighting is None or weighting.name == "fedavg" else f"{name}+{weighting.name}"


def _instance_of(cls: type) -> Callable[[Any], bool]:
    return lambda node: isinstance(node, cls)


def _states_of(tree: PyTree, cls: type[StateT]) -> list[StateT]:
    return [
        node
        for node in jax.tree_util.tree_leaves(tree, is_leaf=_instance_of(cls))
        if isinstance(node, cls)
    ]


def holds_state(tree: PyTree, cls: type) -> bool:
    """Whether `tree` holds an instance of the NamedTuple type `cls` at any depth (where
    `find_state` would find one)."""
    return bool(_states_of(tree, cls))


def find_state(tree: PyTree, cls: type[StateT]) -> StateT:
    """The one instance of the NamedTuple type `cls` in `tree` (a state of nested NamedTuples,
    e.g. `ServerLabelDistsState.inner` holds the one it wraps), found at any depth by its type.

    ValueError, naming the type and what builds it (its class attribute `_built_by`), when
    `tree` holds none (the algorithm was assembled without the piece that keeps it) or several.
    """
    found = _states_of(tree, cls)
    if len(found) != 1:
        fields = ", ".join(getattr(cls, "_fields", ()))
        built_by = getattr(cls, "_built_by", "the method that keeps it")
        raise ValueError(
            f"the algorithm's state holds {len(found) or 'no'} {cls.__name__}({fields}) where "
            f"one is expected: build the algorithm with {built_by}."
        )
    return found[0]


def replace_state(tree: PyTree, cls: type, **changes: Any) -> PyTree:
    """`tree` with fields of its one `cls` (`find_state`) replaced: `_replace(**changes)`."""
    find_state(tree, cls)  # raises unless there is exactly one
    return jax.tree_util.tree_map(
        lambda node: node._replace(**changes) if isinstance(node, cls) else node,
        tree,
        is_leaf=_instance_of(cls),
    )


def _need(value, what: str, name: str):
    """A `MethodContext` entry a method's builder needs (ValueError when the run gives none)."""
    if value is None:
        raise ValueError(f"{name} needs {what}.")
    return value


def _leaf_paths(tree: PyTree) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _tree_mismatch(what: str, got: PyTree, expected: PyTree) -> str | None:
    """The first leaf where `got` differs from `expected` in presence, shape or dtype."""
    got_leaves, expected_leaves = _leaf_paths(got), _leaf_paths(expected)
    for path, leaf in expected_leaves.items():
        if path not in got_leaves:
            extra = sorted(set(got_leaves) - set(expected_leaves))[:1]
            instead = f" (it has {what}{extra[0]} instead)" if extra else ""
            return f"{what}{path} is missing{instead}"
        new = got_leaves[path]
        if not hasattr(new, "shape"):
            return f"{what}{path} is {type(new).__name__}, not an array"
        if tuple(new.shape) != tuple(leaf.shape) or new.dtype != leaf.dtype:
            return (
                f"{what}{path} has shape {tuple(new.shape)} {new.dtype} where the state it was "
                f"given has {tuple(leaf.shape)} {leaf.dtype}"
            )
    extra = sorted(set(got_leaves) - set(expected_leaves))
    if extra:
        return f"{what}{extra[0]} is new"
    if jax.tree_util.tree_structure(got) != jax.tree_util.tree_structure(expected):
        return f"{what} changes its tree structure"
    return None


def state_mismatch(new: Any, state: ServerState) -> str | None:
    """What makes `new` not a state of `state`'s structure, shapes and dtypes ("a state whose
    params['w'] has shape ..."), or None; the round counter is the engine's and not compared."""
    if not isinstance(new, ServerState):
        return f"{type(new).__name__}, not a fedjax_pals.ServerState"
    for field in ServerState._fields:
        if field == "round":
            continue
        problem = _tree_mismatch(field, getattr(new, field), getattr(state, field))
        if problem is not None:
            return f"a state whose {problem}"
    return None


def round_shape_mismatch(
    algorithm: FederatedAlgorithm, params: Params, num_clients: int, num_participants: int,
    num_classes: int,
) -> str | None:
    """What is wrong with the shapes `algorithm`'s round pieces return, or None.

    The engine feeds the server update's state back into the next round, and evaluates
    `eval_params(state)` with the model: a state of another structure, shape or dtype fails
    there as a long flax error naming neither the method nor the leaf (another dtype trains on
    silently, compiled again).
    Here each piece is traced once on abstract values (`jax.eval_shape`: nothing is computed)
    shaped as the engine gives them: `weighting.weights` must return (m,) weights, the server
    update a `ServerState` whose leaves (the round counter aside: the engine owns it) match the
    state it was given, `eval_params` params like the model's. `params` may be abstract.
    """
    abstract = lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf))
    params = jax.tree_util.tree_map(abstract, params)
    state = jax.eval_shape(lambda p: init_server_state(algorithm, p, num_clients), params)
    m = num_participants

    def stacked(tree):
        return jax.tree_util.tree_map(lambda l: jax.ShapeDtypeStruct((m, *l.shape), l.dtype), tree)

    one_client = jax.tree_util.tree_map(
        lambda l: jax.ShapeDtypeStruct(l.shape[1:], l.dtype), state.client_states
    )
    vector = lambda dtype: jax.ShapeDtypeStruct((m,), dtype)
    participants = vector(jnp.int32)
    label_dists = jax.ShapeDtypeStruct((m, num_classes), jnp.float32)
    weights = jax.eval_shape(
        algorithm.weighting.weights, label_dists, vector(jnp.float32), state, participants
    )
    if not hasattr(weights, "shape") or tuple(weights.shape) != (m,):
        got = tuple(weights.shape) if hasattr(weights, "shape") else type(weights).__name__
        return (
            f"its weighting {algorithm.weighting.name!r} returns {got} for {m} participants, "
            f"not ({m},)"
        )
    outputs = ClientOutputs(
        deltas=stacked(state.params), client_states=stacked(one_client),
        train_loss=vector(jnp.float32), num_steps=vector(jnp.int32),
        initial_loss=vector(jnp.float32),
    )
    new = jax.eval_shape(functools.partial(server_chain.server_round, algorithm), state,
                         participants, outputs, weights)
    problem = state_mismatch(new, state)
    if problem is not None:
        return f"its server update returns {problem}"
    evaluated = jax.eval_shape(algorithm.eval_params, state)
    problem = _tree_mismatch("params", evaluated, state.params)
    if problem is not None:
        return f"its eval_params returns params whose {problem}"
    return None
