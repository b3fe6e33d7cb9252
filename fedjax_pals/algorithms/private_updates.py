"""User-level differential privacy on model updates: clipped updates, a noised aggregate.

DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models",
ICLR 2018), for any method whose server update is a weighted average (FedAvg, FedPALS and its
variants, a client-side method with FedPALS' weights, a server optimiser after the noise):

    Delta_i' = Delta_i * min(1, C / ||Delta_i||_2)                      (each participant)
    Delta    = sum_i alpha_i Delta_i' + z,   z ~ N(0, (sigma * C * max_i alpha_i)^2 I)

||.||_2 is over the whole update (every leaf of the params pytree). With the weights fixed
(S_i, n_i and the participants public), replacing one client's contribution by nothing
("zero-out", dp-accounting's `REPLACE_SPECIAL`) moves sum_i alpha_i Delta_i' by at most
C max_i alpha_i, its L2 sensitivity, so z is the Gaussian mechanism with noise multiplier
sigma: the noise a given epsilon needs grows as FedPALS' weights concentrate on few clients (a
small ESS). Adding or removing a client, its weights re-normalised over the others, moves it
by up to 2 C max_i alpha_i: `algorithm.dp_neighbouring_relation = "add_remove"` scales the
noise to that, z ~ N(0, (2 sigma C max_i alpha_i)^2 I). `fedjax_pals.accounting` turns sigma,
the rounds, the client sampling and the relation into epsilon (`algorithm.dp_accountant`:
dp-accounting's RDP or PLD accountant).

Each round also keeps, in the wrapper's state, the noise's std per coordinate and the norm of
the clipped aggregate sum_i alpha_i Delta_i' before the noise: the feature's monitor reports
them with a signal-to-noise ratio, ||sum_i alpha_i Delta_i'|| / (std sqrt(d)), d the number of
parameters (std sqrt(d) is the noise vector's expected norm, to within 1/(4d)).

The noise is drawn inside the jitted round from the run's own stream (the seed's, folded with
the round counter): a resumed run draws what an uninterrupted one would. C, sigma and that key
are per-run data in `ServerState.algorithm_state` (a `PrivateUpdatesState` holding the
method's own state in `.inner`), so runs that differ only in them share one compiled round.

The feature `dp_updates` is on when `algorithm.dp_clip_norm` is set: `dp_noise_multiplier`
gives sigma, or `dp_target_epsilon` (at `dp_delta`) calibrates it before training; with both,
a run whose rounds would spend more than the target is refused, naming the last round within
it. With `dp_clip_quantile` gamma, C adapts each round towards the gamma-quantile of the update
norms from a privatised count (Andrew et al., "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021), within the same sigma. A method with a server update of its own
(SCAFFOLD, AFL, adaptive lambda's hypergradient step) is refused: its update is not a
weighted average to clip and noise.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation, accounting
from fedjax_pals.algorithms import registry, server_chain
from fedjax_pals.algorithms.base import (
    ClientOutputs, FederatedAlgorithm, ServerState, ServerUpdate, find_state, replace_state,
)
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter

# The run's random stream for the noise of DP on updates (one of its own).
DP_UPDATES_STREAM = 0xD9D0

# The L2 sensitivity of the aggregate, in units of C max_i alpha_i, under each neighbouring
# relation (`fedjax_pals.accounting.RELATIONS`, its module docstring).
SENSITIVITY_FACTOR = {"zero_out": 1.0, "add_remove": 2.0}

# Where the updates are clipped (`with_private_updates`, `algorithm.dp_clipping`).
CLIPPING = ("server", "client")


# Adaptive clipping's constants (Andrew et al., NeurIPS 2021, their defaults): the clip norm's
# geometric step and the clipped count's noise std as a share of the participants.
CLIP_LEARNING_RATE = 0.2
COUNT_STD_PER_PARTICIPANT = 1 / 20


class PrivateUpdatesState(NamedTuple):
    """DP on updates' per-run data: the method's own algorithm state, C (this round's), the
    noise's std per unit of C max_i alpha_i, the noise key, adaptive clipping's quantile, step
    and count noise (step 0: C fixed), and what the last round released: its noise std per
    coordinate and the norm of its clipped aggregate (0 before the first round)."""

    inner: Any
    clip_norm: jax.Array  # () float32, C
    # () float32: the std of the noise per unit of C max_i alpha_i: sigma of the updates
    # (sigma_Delta when adaptive) times the relation's sensitivity factor (1: zero-out, 2:
    # add/remove, `SENSITIVITY_FACTOR`)
    noise_multiplier: jax.Array
    key: jax.Array  # the run's noise key; round r draws with fold_in(key, r)
    clip_quantile: jax.Array  # () float32, gamma (unused at step 0)
    clip_learning_rate: jax.Array  # () float32, eta_C; 0: C fixed
    count_std: jax.Array  # () float32, sigma_b of the clipped count
    noise_std: jax.Array = 0.0  # () float32, the last round's noise std per coordinate
    aggregate_norm: jax.Array = 0.0  # () float32, ||sum_i alpha_i Delta_i'|| of the last round

    _built_by = "fjp.algorithms.with_private_updates (algorithm.dp_clip_norm)"


def clip_updates(deltas: Any, clip_norm: jax.Array) -> tuple[Any, jax.Array]:
    """Each update of `deltas` (leaves stacked on a leading axis of m) scaled to L2 norm at
    most `clip_norm`, its norm taken over every leaf; unchanged where it is within. Returns the
    clipped deltas and the (m,) norms before clipping."""
    leaves = jax.tree_util.tree_leaves(deltas)
    squares = sum(
        jnp.sum(jnp.square(leaf.astype(jnp.float32)).reshape(leaf.shape[0], -1), axis=1)
        for leaf in leaves
    )
    norms = jnp.sqrt(squares)
    scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, jnp.finfo(jnp.float32).tiny))

    def clip(leaf):
        return leaf * scale.reshape((-1,) + (1,) * (leaf.ndim - 1)).astype(leaf.dtype)

    return jax.tree_util.tree_map(clip, deltas), norms


def aggregate_noise_std(weights: jax.Array, clip_norm: jax.Array,
                        noise_multiplier: jax.Array) -> jax.Array:
    """sigma * C * max_i alpha_i: the noise's std for the round's weights (module docstring)."""
    return noise_multiplier * clip_norm * jnp.max(weights)


def gaussian_like(tree: Any, key: jax.Array, std: jax.Array) -> Any:
    """N(0, std^2) noise shaped as `tree` (one key per leaf)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [
        (std * jax.random.normal(k, jnp.shape(leaf), jnp.float32)).astype(jnp.result_type(leaf))
        for k, leaf in zip(keys, leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, noise)


def _round_keys(dp: PrivateUpdatesState, state: ServerState) -> tuple[jax.Array, jax.Array]:
    """(the noise's key, adaptive clipping's count key) of the round."""
    noise_key, count_key = jax.random.split(jax.random.fold_in(dp.key, state.round))
    return noise_key, count_key


def _set(state: ServerState, **changes) -> ServerState:
    return state._replace(algorithm_state=replace_state(
        state.algorithm_state, PrivateUpdatesState, **changes))


@dataclasses.dataclass(frozen=True)
class ServerClipping(server_chain.ServerLink):
    """The chain's clip link of DP on updates, on the server (the server receives each raw
    update and clips it): Delta_i' = Delta_i min(1, C / ||Delta_i||), C from the run's
    `PrivateUpdatesState`; with adaptive clipping, C for the next round from the privatised
    count of the updates within C (`adaptive`, which Poisson sampling refuses: the count is
    among a number of participants it leaves to chance)."""

    slot = "clip"
    adaptive: bool = False

    def __call__(self, state, updates):
        dp = find_state(state.algorithm_state, PrivateUpdatesState)
        _, count_key = _round_keys(dp, state)
        clipped, norms = clip_updates(updates.deltas, dp.clip_norm)
        state = _set(state, clip_norm=adapted_clip_norm(norms, dp, count_key))
        return updates._replace(deltas=clipped, clip_norm=dp.clip_norm), state

    def describe(self) -> str:
        return "each update clipped to C on the server (DP on updates)"


@dataclasses.dataclass(frozen=True)
class ClientClipping(server_chain.ServerLink):
    """The chain's clip link of DP on updates when the clients clip (`client_clip_update`,
    `algorithm.dp_clipping='client'`): it changes no update (each arrived clipped to C) and
    declares C their bound."""

    slot = "clip"

    def __call__(self, state, updates):
        dp = find_state(state.algorithm_state, PrivateUpdatesState)
        return updates._replace(clip_norm=dp.clip_norm), state

    def describe(self) -> str:
        return "each update arrives clipped to C by its client (DP on updates)"


@dataclasses.dataclass(frozen=True)
class GaussianNoise(server_chain.ServerLink):
    """The chain's noise link of DP on updates: z ~ N(0, (s sigma C max_i alpha_i)^2 I) added
    to the aggregate (`add_to_aggregate`), C and max_i alpha_i as the links before it bound
    them (`RoundUpdates.clip_norm`, `.max_weight`), s sigma from the run's
    `PrivateUpdatesState` (s: the relation's sensitivity factor). Records the round's noise
    std and the clipped aggregate's norm."""

    slot = "noise"

    def __call__(self, state, updates):
        dp = find_state(state.algorithm_state, PrivateUpdatesState)
        noise_key, _ = _round_keys(dp, state)
        std = dp.noise_multiplier * updates.clip_norm * updates.max_weight
        noise = gaussian_like(state.params, noise_key, std)
        state = _set(state, noise_std=jnp.asarray(std, jnp.float32),
                     aggregate_norm=weighted_sum_norm(updates.deltas, updates.weights))
        return add_to_aggregate(updates, noise), state

    def describe(self) -> str:
        return "Gaussian noise sigma C max_i alpha_i on the aggregate (DP on updates)"


def add_to_aggregate(updates: server_chain.RoundUpdates, z: Any) -> server_chain.RoundUpdates:
    """`updates` whose weighted sum sum_i alpha_i Delta_i is the old one plus `z` (shaped as one
    update): z / sum_i alpha_i added to every lane, so that any step linear in the weighted sum
    (the plain average, a server optimiser's pseudo-gradient) receives it exactly. Under
    Poisson sampling a round may draw no client (every weight 0): `z` alone is then the
    release, carried by lane 0 at weight 1 (a round without it would tell that no client was
    drawn)."""
    weights = updates.weights
    total = jnp.sum(weights)
    empty = total <= 0
    total = jnp.where(empty, 1.0, total)
    carried = jnp.where(empty, jnp.zeros_like(weights).at[0].set(1.0), weights)

    def spread(delta, noise):
        kept = jnp.where(empty, jnp.zeros_like(delta), delta)
        return kept + (noise / total.astype(noise.dtype))[None]

    return updates._replace(deltas=jax.tree_util.tree_map(spread, updates.deltas, z),
                            weights=carried)


def client_clip_update(delta: Any, info: Any, state: ServerState) -> Any:
    """A client's update clipped to C (the run's `PrivateUpdatesState`) before it leaves the
    client (`ClientMethod.finish_update`): with `algorithm.dp_clipping='client'` the server
    never receives a raw update."""
    dp = find_state(state.algorithm_state, PrivateUpdatesState)
    stacked = jax.tree_util.tree_map(lambda leaf: leaf[None], delta)
    clipped, _ = clip_updates(stacked, dp.clip_norm)
    return jax.tree_util.tree_map(lambda leaf: leaf[0], clipped)


@functools.cache
def _then_clip(finish_update):
    def finish(delta, info, state):
        return client_clip_update(finish_update(delta, info, state), info, state)

    return finish


def weighted_sum_norm(deltas: Any, weights: jax.Array) -> jax.Array:
    """||sum_i w_i Delta_i||_2 over every leaf of `deltas` (leaves stacked on a leading axis of
    m), in float32: the norm of a round's clipped aggregate before the noise."""
    w = weights.astype(jnp.float32)
    square = sum(
        jnp.sum(jnp.square(jnp.tensordot(w, leaf.astype(jnp.float32), axes=1)))
        for leaf in jax.tree_util.tree_leaves(deltas)
    )
    return jnp.sqrt(square)


def signal_to_noise(aggregate_norm: float, noise_std: float, num_params: int) -> float:
    """||sum_i alpha_i Delta_i'|| / (std sqrt(d)): the clipped aggregate's norm against the
    noise vector's expected norm (d parameters); inf without noise."""
    noise = float(noise_std) * float(np.sqrt(num_params))
    return float("inf") if noise == 0 else float(aggregate_norm) / noise


def adapted_clip_norm(norms: jax.Array, dp: PrivateUpdatesState, key: jax.Array) -> jax.Array:
    """Next round's C (Andrew et al., NeurIPS 2021): C exp(-eta (b - gamma)), b the privatised
    share of the m updates within C, b = (sum_i (1[||Delta_i|| <= C] - 1/2) + N(0, sigma_b^2))
    / m + 1/2 (the shifted count has sensitivity 1/2). At eta = 0, C itself."""
    m = norms.shape[0]
    count = jnp.sum((norms <= dp.clip_norm).astype(jnp.float32) - 0.5)
    share = (count + dp.count_std * jax.random.normal(key, (), jnp.float32)) / m + 0.5
    return dp.clip_norm * jnp.exp(-dp.clip_learning_rate * (share - dp.clip_quantile))


def updates_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """sigma_Delta, the updates' own multiplier when the clipped count is released too: the
    two Gaussian queries together are one of multiplier sigma when
    sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2 (Andrew et al., Thm. 1). ValueError when
    sigma >= 2 sigma_b (the count alone spends the budget)."""
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier**-2 - (2 * count_std) ** -2
    if not rest > 0:
        raise ValueError(
            f"adaptive clipping releases a clipped count with noise std {count_std:g} (the "
            f"participants / 20), which alone spends a noise multiplier of {2 * count_std:g}: "
            f"the round's noise multiplier, {noise_multiplier:g}, must be below it. Use fixed "
            "clipping (dp_clip_quantile unset) or more clients per round."
        )
    return float(rest**-0.5)


def with_private_updates(
    algorithm: FederatedAlgorithm, clip_norm: float, noise_multiplier: float, seed: int,
    *, clip_quantile: float | None = None, participants: int | None = None,
    relation: str = "zero_out", clipping: str = "server",
) -> FederatedAlgorithm:
    """`algorithm` with user-level DP on its updates (module docstring): clip norm C,
    noise multiplier sigma (of the whole round's release), the noise drawn from `seed`'s own
    stream. With `clip_quantile` gamma, C is the initial clip norm and adapts each round
    towards the gamma-quantile of the update norms (Andrew et al., NeurIPS 2021; step
    `CLIP_LEARNING_RATE`, the count's noise std `participants` / 20, the updates' multiplier
    lowered so that the round stays a release of multiplier sigma). `relation`: "zero_out"
    (noise sigma C max_i alpha_i) or "add_remove" (2 sigma C max_i alpha_i, fixed clipping
    only), `fedjax_pals.accounting.RELATIONS`. `clipping`: "server" (the server clips each raw
    update: it must be trusted with them) or "client" (each client clips its own update before
    sending it, `client_clip_update`: the server never receives a raw one; fixed clipping only).
    Adds two links to the server chain (`server_chain`): the clip link (`ServerClipping` or
    `ClientClipping`) and `GaussianNoise`, which reads the bound the weighting declares.

    Raises:
      ValueError: C <= 0, sigma < 0, gamma outside (0, 1), a sigma the count alone would
        spend, an unknown relation or clipping, add_remove or client clipping with adaptive
        clipping, or a method whose server update is its own.
    """
    clip_norm = _validation.check_number("the clip norm", clip_norm, low=0.0, low_open=True)
    noise_multiplier = _validation.check_number("the noise multiplier", noise_multiplier, low=0.0)
    if relation not in SENSITIVITY_FACTOR:
        raise ValueError(
            f"relation must be one of {tuple(SENSITIVITY_FACTOR)}, got {relation!r}.")
    if relation == "add_remove" and clip_quantile is not None:
        raise ValueError(_ADAPTIVE_ADD_REMOVE)
    if clipping not in CLIPPING:
        raise ValueError(f"clipping must be one of {CLIPPING}, got {clipping!r}.")
    if clipping == "client" and clip_quantile is not None:
        raise ValueError(_ADAPTIVE_CLIENT)
    if not server_chain.is_chained(algorithm.server_update):
        raise ValueError(
            f"DP on updates clips and noises a weighted average of the updates, but "
            f"{algorithm.name!r} has a server update of its own."
        )
    # Poisson sampling's weighting declares its bound; wrapped after DP, `with_poisson_sampling`
    # finds the adaptive clip link and refuses it.
    if algorithm.weighting.max_weight is not None and clip_quantile is not None:
        raise ValueError(ADAPTIVE_WITH_POISSON)
    quantile, rate, count_std, updates_sigma = 0.5, 0.0, 0.0, noise_multiplier
    if clip_quantile is not None:
        quantile = _validation.check_number("the clip quantile", clip_quantile, low=0.0,
                                            high=1.0, low_open=True, high_open=True)
        if participants is None or participants < 1:
            raise ValueError("adaptive clipping needs the participants a round (>= 1).")
        rate, count_std = CLIP_LEARNING_RATE, COUNT_STD_PER_PARTICIPANT * participants
        updates_sigma = updates_noise_multiplier(noise_multiplier, count_std)
    inner_init = algorithm.init_algorithm_state
    key = jax.random.fold_in(jax.random.PRNGKey(seed), DP_UPDATES_STREAM)

    std_per_sensitivity = updates_sigma * SENSITIVITY_FACTOR[relation]

    def init(params, num_clients):
        return PrivateUpdatesState(
            inner_init(params, num_clients), jnp.float32(clip_norm),
            jnp.float32(std_per_sensitivity), key, jnp.float32(quantile), jnp.float32(rate),
            jnp.float32(count_std), jnp.float32(0.0), jnp.float32(0.0),
        )

    algorithm = algorithm._replace(init_algorithm_state=init)
    if clipping == "client":
        client = algorithm.client
        finish = (client_clip_update if client.finish_update is None
                  else _then_clip(client.finish_update))
        algorithm = algorithm._replace(client=client._replace(finish_update=finish))
    clip = (ClientClipping() if clipping == "client"
            else ServerClipping(adaptive=clip_quantile is not None))
    return server_chain.with_link(server_chain.with_link(algorithm, clip), GaussianNoise())


# -- the feature -------------------------------------------------------------------------------


_DEFAULT_DELTA = 1e-5
_ADAPTIVE_CLIENT = (
    "adaptive clipping counts, on the server, the updates within C, which needs each raw "
    "update's norm; with dp_clipping='client' the server never sees one: use fixed clipping "
    "(dp_clip_quantile unset) or dp_clipping='server'."
)
ADAPTIVE_WITH_POISSON = (
    "adaptive clipping counts the clipped updates among a round's participants, a number "
    "Poisson sampling leaves to chance; use fixed clipping (dp_clip_quantile unset) with Poisson "
    "sampling."
)
_ADAPTIVE_ADD_REMOVE = (
    "adaptive clipping's clipped count is accounted for zero-out neighbours only (the share "
    "divides by the participants, which adding or removing a client changes); use "
    "dp_neighbouring_relation='zero_out' or fixed clipping (dp_clip_quantile unset)."
)


@dataclasses.dataclass(frozen=True)
class PrivateUpdatesHyperparameters(Hyperparameters):
    dp_clip_norm: float | None = hyperparameter(
        None, low=0.0, low_open=True, optional=True,
        why=" (None: no DP on the model updates)",
        doc="None (no DP on updates) or C, the L2 norm each client's update is clipped to",
        per_run=True,
    )
    dp_noise_multiplier: float | None = hyperparameter(
        None, low=0.0, optional=True,
        doc="sigma: the aggregate's noise std is sigma * C * max_i alpha_i",
        per_run=True,
    )
    dp_delta: float | None = hyperparameter(
        _DEFAULT_DELTA, low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
        doc="the delta of DP on updates' (epsilon, delta)",
        per_run=True,
    )
    dp_target_epsilon: float | None = hyperparameter(
        None, low=0.0, low_open=True, optional=True,
        doc="the epsilon (at dp_delta) to calibrate sigma to, or the budget sigma must keep",
        per_run=True,
    )
    dp_clip_quantile: float | None = hyperparameter(
        None, low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
        why=" (None: the clip norm stays dp_clip_norm)",
        doc="adaptive clipping: the quantile of the update norms the clip norm follows",
        per_run=True,
    )
    # None is the default of each (zero_out, rdp): a run that names the default resolves to
    # None too, so that it and the runs recorded before the keys keep one digest.
    dp_neighbouring_relation: str | None = hyperparameter(
        None, kind="choice", choices=accounting.RELATIONS, optional=True,
        why=" (None: zero_out)",
        doc="zero_out (None; one client's contribution zeroed, the weights fixed and public: "
        "noise sigma C max_i alpha_i) or add_remove (one client added or removed, the weights "
        "re-normalised: noise 2 sigma C max_i alpha_i, every client every round only)",
        per_run=True,
    )
    dp_accountant: str | None = hyperparameter(
        None, kind="choice", choices=accounting.ACCOUNTANTS, optional=True,
        why=" (None: rdp)",
        doc="rdp (None) or pld: dp-accounting's accountant that calibrates sigma and accounts "
        "epsilon (pld is tighter; no pld for clients drawn without replacement)",
        per_run=True,
    )

    dp_clipping: str | None = hyperparameter(
        None, kind="choice", choices=CLIPPING, optional=True,
        why=" (None: server)",
        doc="server (None; the server clips each raw update, so it is trusted with them) or "
        "client (each client clips its own update before sending it: the server never "
        "receives a raw one; fixed clipping only)",
    )

    @property
    def clipping(self) -> str:
        """Where the updates are clipped ("server" when unset)."""
        return self.dp_clipping or "server"

    @property
    def relation(self) -> str:
        """The neighbouring relation ("zero_out" when unset)."""
        return self.dp_neighbouring_relation or "zero_out"

    @property
    def accountant(self) -> str:
        """The accountant ("rdp" when unset)."""
        return self.dp_accountant or "rdp"


_KEYS = ("dp_clip_norm", "dp_noise_multiplier", "dp_delta", "dp_target_epsilon",
         "dp_clip_quantile", "dp_neighbouring_relation", "dp_accountant", "dp_clipping")
_KEY_DEFAULTS = {"dp_neighbouring_relation": "zero_out", "dp_accountant": "rdp",
                 "dp_clipping": "server"}


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    if values["dp_clip_norm"] is None:
        # A DP key without the clip norm would train without DP and record nothing of what was
        # asked (issue 57): refused, naming the key that turns DP on.
        given = [key for key in ("dp_target_epsilon", "dp_noise_multiplier", "dp_clip_quantile")
                 if values[key] is not None]
        if values["dp_delta"] not in (None, _DEFAULT_DELTA):
            given.append("dp_delta")
        given += [key for key, default in _KEY_DEFAULTS.items()
                  if values[key] not in (None, default)]
        if given:
            shown = ", ".join(f"algorithm.{key}={values[key]!r}" for key in given)
            raise ValueError(
                f"config.{shown} is set, but algorithm.dp_clip_norm is None, which turns DP on "
                "the model updates off: give algorithm.dp_clip_norm (C, the norm each client's "
                "update is clipped to) or drop the DP key."
            )
        return {key: None for key in _KEYS}
    name = facts.method.name
    if facts.method.owns_server_update:
        raise ValueError(
            f"config.algorithm.dp_clip_norm is set, but {name}'s server update is its own, not "
            "a weighted average of the updates that DP on updates can clip and noise."
        )
    if facts.section.get("lam_schedule") not in (None, "fixed"):
        raise ValueError(
            "config.algorithm.dp_clip_norm is set, but algorithm.lam_schedule="
            f"{facts.section['lam_schedule']!r} steps lambda in the server update, which DP on "
            "updates does not account for; use lam_schedule='fixed'."
        )
    if values["dp_noise_multiplier"] is None and values["dp_target_epsilon"] is None:
        raise ValueError(
            "config.algorithm.dp_clip_norm is set, but neither algorithm.dp_noise_multiplier "
            "nor algorithm.dp_target_epsilon: give sigma, or the epsilon to calibrate it to."
        )
    if values["dp_delta"] is None:
        raise ValueError("config.algorithm.dp_delta is None, but DP on updates needs it.")
    # The sampling as DP on updates accounts it (the run's sampler's `accounting()`; a user's
    # sampler may account as Poisson sampling or as m of M).
    per_round, rate = facts.clients_per_round, facts.sampling_rate
    if facts.training_clients is not None:
        per_round, rate = accounted_sampling(
            facts.sampler, facts.training_clients,
            facts.clients_per_round or facts.training_clients, facts.sampling_rate)
    if rate is not None and values["dp_clip_quantile"] is not None:
        raise ValueError(
            "config.algorithm.dp_clip_quantile is set, but the clients are Poisson-sampled: "
            "adaptive clipping counts the clipped updates among a round's participants, a "
            "number Poisson sampling leaves to chance. Use fixed clipping with Poisson sampling."
        )
    values = dict(values)
    for key, default in _KEY_DEFAULTS.items():  # the default resolves to None (the digest)
        if values[key] == default:
            values[key] = None
    if values["dp_clipping"] == "client" and values["dp_clip_quantile"] is not None:
        raise ValueError(
            f"config.algorithm.dp_clipping='client' is set with algorithm.dp_clip_quantile: "
            f"{_ADAPTIVE_CLIENT}")
    if values["dp_neighbouring_relation"] == "add_remove":
        if values["dp_clip_quantile"] is not None:
            raise ValueError(
                "config.algorithm.dp_neighbouring_relation='add_remove' is set with "
                f"algorithm.dp_clip_quantile: {_ADAPTIVE_ADD_REMOVE}")
        if facts.reads_target:
            raise ValueError(
                "config.algorithm.dp_neighbouring_relation='add_remove' is set, but "
                f"{name}'s server weights are solved from the clients' S_i and T: without one "
                "client they are solved again and can move by up to 2 in L1, so no noise of "
                "2 sigma C max_i alpha_i bounds what adding or removing a client changes. Use "
                "dp_neighbouring_relation='zero_out' (the weights public and held fixed)."
            )
        sampled = (rate is not None and rate < 1) or (
            rate is None and per_round is not None and facts.training_clients is not None
            and per_round < facts.training_clients)
        if sampled:
            raise ValueError(
                "config.algorithm.dp_neighbouring_relation='add_remove' is set, but the clients "
                "are sampled: removing one re-normalises the weights of the others drawn, which "
                "amplification by subsampling does not cover. Train every client every round, "
                "or use dp_neighbouring_relation='zero_out'."
            )
    if facts.rounds is not None and facts.training_clients is not None:
        # The budget against the run's rounds and clients, before any data is read.
        budget_for(PrivateUpdatesHyperparameters(**values), facts.training_clients,
                   per_round, facts.rounds, sampling_rate=rate)
    return values


def accounted_sampling(sampler: Any, num_clients: int, clients_per_round: int,
                       sampling_rate: float | None) -> tuple[int, float | None]:
    """(participants a round, Poisson's q or None) as DP on updates accounts the run's client
    sampler (`ClientSampler.accounting`); without a sampler, the given ones. ValueError,
    naming the sampler, for one that has no accounting."""
    if sampler is None:
        return int(min(clients_per_round, num_clients)), sampling_rate
    how = sampler.accounting(int(num_clients))
    if how is None:
        raise ValueError(
            "config.algorithm.dp_clip_norm is set, but training.client_sampling="
            f"{sampler.name or type(sampler).__name__!r} has no privacy accounting (its "
            "accounting() is None): DP on updates accounts every client, m of M without "
            "replacement, or Poisson sampling. Give the sampler an accounting, or use one of "
            "those.")
    return int(how.clients_per_round), how.sampling_rate


@dataclasses.dataclass(frozen=True)
class UpdatesBudget:
    """What DP on updates spends: sigma (given or calibrated) and the clients' sampling
    (`sampling_rate` q: Poisson sampling; None: `clients_per_round` without replacement)."""

    noise_multiplier: float
    delta: float
    num_clients: int
    clients_per_round: int
    calibrated: bool
    sampling_rate: float | None = None
    relation: str = "zero_out"
    accountant: str = "rdp"

    def epsilon(self, rounds: int) -> float:
        if self.noise_multiplier == 0:
            return float("inf") if rounds else 0.0
        return accounting.updates_epsilon(
            self.noise_multiplier, int(rounds), self.delta, num_clients=self.num_clients,
            clients_per_round=self.clients_per_round, sampling_rate=self.sampling_rate,
            accountant=self.accountant, relation=self.relation,
        )


def budget(hp: PrivateUpdatesHyperparameters, context: registry.MethodContext) -> UpdatesBudget:
    """`budget_for` the run of `context` (its training clients, participants and rounds)."""
    num_clients = int(context.partition.num_clients)
    per_round, rate = accounted_sampling(
        context.sampler, num_clients, context.clients_per_round or num_clients,
        context.sampling_rate)
    return budget_for(hp, num_clients, per_round, int(context.rounds), sampling_rate=rate)


def budget_for(hp: PrivateUpdatesHyperparameters, num_clients: int, per_round: int,
               rounds: int, *, sampling_rate: float | None = None) -> UpdatesBudget:
    """sigma for a run of `rounds` rounds of `per_round` of `num_clients` clients (with
    `sampling_rate` q: Poisson sampling at rate q), under `hp`'s neighbouring relation and by
    its accountant: `dp_noise_multiplier`, or calibrated to `dp_target_epsilon`. ValueError
    (naming the key) when no sigma reaches the target, when the rounds would spend more than
    the target, when the accountant or the relation cannot account for the sampling, or when
    adaptive clipping's count alone would spend sigma."""
    relation, accountant = hp.relation, hp.accountant
    common = dict(num_clients=num_clients, clients_per_round=per_round,
                  sampling_rate=sampling_rate, accountant=accountant, relation=relation)
    sampled_without_replacement = sampling_rate is None and per_round < num_clients
    if accountant == "pld" and sampled_without_replacement:
        raise ValueError(
            "config.algorithm.dp_accountant='pld' is set, but the run draws "
            f"{per_round} of {num_clients} clients a round without replacement, which "
            "dp-accounting's PLD accountant cannot account for: use dp_accountant='rdp', or "
            "Poisson sampling (training.client_sampling='poisson')."
        )
    try:
        accounting.updates_dp_event(1.0, 1, num_clients=num_clients,
                                    clients_per_round=per_round, sampling_rate=sampling_rate,
                                    relation=relation)
    except ValueError as error:
        raise ValueError(
            f"config.algorithm.dp_neighbouring_relation={relation!r}: {error}") from None
    kept = dict(sampling_rate=sampling_rate, relation=relation, accountant=accountant)
    sigma, target = hp.dp_noise_multiplier, hp.dp_target_epsilon
    if sigma is None:
        try:
            sigma = accounting.calibrate_noise_multiplier(target, rounds, hp.dp_delta, **common)
        except ValueError as error:
            raise ValueError(f"config.algorithm.dp_target_epsilon={target:g}: {error}") from None
        found = UpdatesBudget(sigma, hp.dp_delta, num_clients, per_round, calibrated=True,
                              **kept)
        _check_adaptive(hp, found)
        return found
    found = UpdatesBudget(float(sigma), hp.dp_delta, num_clients, per_round, calibrated=False,
                          **kept)
    _check_adaptive(hp, found)
    if target is not None and found.epsilon(rounds) > target:
        within = (
            0 if sigma == 0 else
            accounting.rounds_within(target, sigma, rounds, hp.dp_delta, **common)
        )
        raise ValueError(
            f"config.algorithm.dp_noise_multiplier={sigma:g} spends epsilon "
            f"{found.epsilon(rounds):.4g} at delta {hp.dp_delta:g} over the run's {rounds} "
            f"rounds, more than algorithm.dp_target_epsilon={target:g}: the budget holds "
            f"through round {within}. Train at most {within} rounds, raise the noise, or "
            "leave dp_noise_multiplier unset to calibrate it."
        )
    return found


def _check_adaptive(hp: PrivateUpdatesHyperparameters, spent: UpdatesBudget) -> None:
    if hp.dp_clip_quantile is not None:
        try:
            updates_noise_multiplier(
                spent.noise_multiplier, COUNT_STD_PER_PARTICIPANT * spent.clients_per_round)
        except ValueError as error:
            raise ValueError(f"config.algorithm.dp_clip_quantile is set, but {error}") from None


def _wrap(
    algorithm: FederatedAlgorithm, hp: PrivateUpdatesHyperparameters,
    context: registry.MethodContext,
) -> FederatedAlgorithm:
    spent = budget(hp, context)
    return with_private_updates(
        algorithm, hp.dp_clip_norm, spent.noise_multiplier, context.seed,
        clip_quantile=hp.dp_clip_quantile, participants=spent.clients_per_round,
        relation=spent.relation, clipping=hp.clipping,
    )


class UpdatesPrivacyMonitor(registry.Monitor):
    """Reports DP on updates: sigma, C, the neighbouring relation and accountant, the epsilon
    spent through each evaluated round, and the last round's noise std per coordinate and
    signal-to-noise ratio (`signal_to_noise`)."""

    def __init__(self, hp: PrivateUpdatesHyperparameters, spent: UpdatesBudget,
                 label_dp: Any = None, client_sizes: Any = None):
        self.hp, self.spent = hp, spent
        # Label DP's settings where the run releases the S_i through it, and the clients'
        # sizes: both releases per client (`client_level`).
        self.label_dp, self.client_sizes = label_dp, client_sizes
        self.evaluations: list[dict] = []

    def _round(self, state) -> int:
        return int(np.asarray(state.round))

    def header(self) -> str:
        s = self.spent
        how = (f"calibrated to epsilon {self.hp.dp_target_epsilon:g}" if s.calibrated
               else "given")
        if s.sampling_rate is not None:
            sampling = (
                f"each of {s.num_clients} clients a round with probability {s.sampling_rate:g} "
                "(Poisson; the fixed-denominator estimator, sensitivity C max_i alpha_i / q)"
            )
        elif s.clients_per_round == s.num_clients:
            sampling = "every client each round"
        else:
            sampling = (
                f"{s.clients_per_round} of {s.num_clients} clients a round, without replacement"
            )
        where = ("by each client before it sends its update (the server never sees a raw one)"
                 if self.hp.clipping == "client" else
                 "by the server (trusted with each raw update)")
        clip = (
            f"clip C={self.hp.dp_clip_norm:g} {where}" if self.hp.dp_clip_quantile is None else
            f"clip from C={self.hp.dp_clip_norm:g} towards the {self.hp.dp_clip_quantile:g} "
            f"quantile of the update norms (adaptive) {where}"
        )
        relation = ("zero-out neighbours (noise sigma C max_i alpha_i)"
                    if s.relation == "zero_out" else
                    "add/remove neighbours (noise 2 sigma C max_i alpha_i)")
        return (
            f"DP on updates: {clip}, noise multiplier sigma={s.noise_multiplier:.4g} ({how}), "
            f"delta={s.delta:g}, {sampling}; {relation}, {s.accountant.upper()} accountant"
        )

    def client_level(self, rounds: int) -> dict:
        """Both of the run's releases per client through `rounds` rounds
        (`client_level_privacy`)."""
        return client_level_privacy(self.spent.epsilon(rounds), self.spent.delta, self.label_dp,
                                    self.client_sizes)

    def _clip_norm(self, state) -> float:
        dp = find_state(state.algorithm_state, PrivateUpdatesState)
        return float(np.asarray(dp.clip_norm))

    def _released(self, state) -> tuple[float, float]:
        """(the last round's noise std per coordinate, its signal-to-noise ratio)."""
        dp = find_state(state.algorithm_state, PrivateUpdatesState)
        std = float(np.asarray(dp.noise_std))
        num_params = sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(state.params))
        return std, signal_to_noise(float(np.asarray(dp.aggregate_norm)), std, num_params)

    def progress(self, state) -> dict:
        shown = {"eps": f"{self.spent.epsilon(self._round(state)):.3g}"}
        if self.hp.dp_clip_quantile is not None:
            shown["C"] = f"{self._clip_norm(state):.3g}"
        if self._round(state) > 0:
            std, snr = self._released(state)
            shown["noise std"] = f"{std:.3g}"
            shown["SNR"] = f"{snr:.3g}"
        return shown

    def scalars(self, state) -> dict:
        done = self._round(state)
        epsilon, clip = self.spent.epsilon(done), self._clip_norm(state)
        std, snr = self._released(state)
        self.evaluations.append({"round": done, "dp_epsilon": epsilon, "dp_clip_norm": clip,
                                 "dp_noise_std": std, "dp_signal_to_noise": snr})
        scalars = {"privacy/dp_clip_norm": clip, "privacy/dp_noise_std": std}
        if np.isfinite(epsilon):  # sigma = 0 spends epsilon = inf: nothing to chart
            scalars["privacy/dp_epsilon"] = epsilon
        if np.isfinite(snr):
            scalars["privacy/dp_signal_to_noise"] = snr
        return scalars

    def resume(self, previous, start_round: int) -> None:
        self.evaluations = [
            e for e in previous.get("dp_evaluations", []) if e["round"] <= start_round
        ]

    def results(self, state) -> dict:
        return {
            "dp_epsilon": self.spent.epsilon(self._round(state)),
            "dp_delta": self.spent.delta,
            "dp_noise_multiplier": self.spent.noise_multiplier,
            "dp_clip_norm": float(self.hp.dp_clip_norm),  # the initial C when adaptive
            "dp_clip_quantile": self.hp.dp_clip_quantile,
            "dp_neighbouring_relation": self.spent.relation,
            "dp_accountant": self.spent.accountant,
            "dp_clipping": self.hp.clipping,
            "dp_client_level": self.client_level(self._round(state)),
            "dp_evaluations": self.evaluations,
        }


def client_level_privacy(updates_epsilon: float, delta: float, label_dp: Any,
                         client_sizes: Any) -> dict:
    """Both releases of a run per client (the run's label marginals S_i and its updates), as
    `fjp.privacy_statement` states them: with Laplace label DP at epsilon_S per example, client
    i's (epsilon_updates + n_i epsilon_S, delta) by group privacy and basic composition (the
    largest and the median over the clients); without label DP, S_i is exact: "not protected";
    with Gaussian label DP, the group's delta is not stated: "not stated"."""
    if label_dp is None:
        return {"status": "not protected",
                "why": "no label DP: the server's weights read each client's exact S_i"}
    if getattr(label_dp, "label_dp_mechanism", "laplace") not in (None, "laplace"):
        return {"status": "not stated",
                "why": "Gaussian label DP: its group privacy over n_i examples multiplies delta "
                       "by up to n_i e^((n_i - 1) epsilon_S)"}
    sizes = np.asarray(client_sizes, np.float64)
    per_client = updates_epsilon + sizes * float(label_dp.label_dp_epsilon)
    return {"status": "stated", "rule": "epsilon_updates + n_i x epsilon_S",
            "epsilon_max": float(per_client.max()),
            "epsilon_median": float(np.median(per_client)), "delta": float(delta)}


def _monitor(hp: PrivateUpdatesHyperparameters, task: Any) -> UpdatesPrivacyMonitor:
    context = registry.MethodContext(
        partition=task.partition, rounds=int(task.config.training.rounds),
        clients_per_round=task.clients_per_round, sampling_rate=task.sampling_rate,
        sampler=getattr(task, "sampler", None),
    )
    label_dp = next((settings for feature, settings in getattr(task, "features", ())
                     if feature.name == "label_dp"), None)
    return UpdatesPrivacyMonitor(hp, budget(hp, context), label_dp, task.partition.client_sizes)


registry.register_feature(
    registry.Feature(
        "dp_updates", "DP on updates", PrivateUpdatesHyperparameters, _resolve,
        wrap=_wrap, monitor=_monitor, stage="algorithm",
        per_run_presence=("dp_clip_norm",),
        description="user-level DP on model updates: clipped updates, a noised aggregate "
        "(DP-FedAvg), accounted by dp-accounting",
    ),
    replace=True,
)
