"""Client samplers: who takes part in each round, as registered values.

A sampler is a frozen dataclass (`ClientSampler`) that says, for M training clients:

    lanes(M)                       the lanes a round runs (the engine's shapes are static)
    draw(seed, round_index, M)     the round's client ids, (lanes,) int32, sorted, the lanes no
                                   client drew last with the id M (no step, weight 0); a function
                                   of (seed, round_index) alone, so a resumed run draws the same
    with_weights(algorithm, S, n)  its weights link: the algorithm as it aggregates under this
                                   sampler (Poisson: McMahan et al.'s fixed-denominator weights
                                   alpha_i / q over every client); the others leave it as it is
    accounting()                   how DP on updates accounts a round of it (`Accounting`: every
                                   client, m of M without replacement, or Poisson at rate q), or
                                   None: a run with DP on updates is refused
    dp_event(sigma, rounds, M, relation)   its dp-accounting event over the run

Built in: `EveryClient`, `WithoutReplacement(m)` (McMahan et al.'s uniform sample) and
`PoissonSampling(q)`. `training.client_sampling` names one (None: m of M without replacement,
every client when m = M); a user's (cyclic, availability-driven) is registered with
`register_client_sampler(name, build)`, `build(training, num_clients) -> ClientSampler` given
the run's checked `training` section (its `clients_per_round` resolved from a count or a
fraction). The records that say how clients take part (`MethodContext.sampler`, `Task.sampler`,
`TrainingRun.sampler`) carry the sampler; their `sampling_rate` is its `rate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation, extensions

# The random streams of the draws (the run's seed's; the training's own are 0 and 1).
_SAMPLING_STREAM, _POISSON_STREAM = 2, 3
# Poisson sampling's lanes are as many as a round draws clients with at least this probability
# less than one (`poisson_capacity`): a round that draws more stops the run, never truncates.
POISSON_OVERFLOW_PROBABILITY = 1e-9


def sample_participants(
    seed: int, round_index: int, num_clients: int, clients_per_round: int | None
) -> np.ndarray:
    """The sorted client ids taking part in round `round_index`.

    Depends only on (seed, round_index): reproducible, and independent of what happened in earlier
    rounds. None or num_clients means every client. Up to `PERMUTATION_SAMPLING_MAX_CLIENTS` clients
    the sample is a random permutation's prefix (O(M log M)); above, it is drawn in O(m).
    """
    if clients_per_round is not None and (
        isinstance(clients_per_round, (bool, np.bool_))
        or not isinstance(clients_per_round, (int, np.integer))
        or not 1 <= clients_per_round <= num_clients
    ):
        raise ValueError(
            f"clients_per_round must be an integer in [1, {num_clients}], got "
            f"{clients_per_round!r}."
        )
    if clients_per_round is None or clients_per_round == num_clients:
        return np.arange(num_clients, dtype=np.int32)
    if num_clients <= PERMUTATION_SAMPLING_MAX_CLIENTS:
        key = jax.random.fold_in(
            jax.random.fold_in(jax.random.PRNGKey(seed), _SAMPLING_STREAM), round_index
        )
        return np.asarray(_choose_by_permutation(key, num_clients, clients_per_round))
    # O(m) for m << M (Generator.choice draws by Floyd's algorithm when m <= M / 50).
    rng = np.random.default_rng([_SAMPLING_STREAM, int(seed), int(round_index)])
    return np.sort(rng.choice(num_clients, clients_per_round, replace=False)).astype(np.int32)


def poisson_capacity(num_clients: int, sampling_rate: float) -> int:
    """The lanes a round of Poisson sampling needs: the smallest k with P(Binomial(M, q) > k)
    <= `POISSON_OVERFLOW_PROBABILITY` (at most M, at least 1). The engine's shapes are static,
    so a round runs k lanes; the ones no client drew are padding (no step, weight 0)."""
    from scipy import stats

    _check_sampling_rate(sampling_rate)
    m = int(num_clients)
    k = int(stats.binom.isf(POISSON_OVERFLOW_PROBABILITY, m, sampling_rate))
    while k < m and stats.binom.sf(k, m, sampling_rate) > POISSON_OVERFLOW_PROBABILITY:
        k += 1
    return max(1, min(k, m))


def _check_sampling_rate(sampling_rate) -> float:
    return float(_validation.check_number(
        "the Poisson sampling rate", sampling_rate, low=0.0, high=1.0, low_open=True))


def sample_poisson_participants(
    seed: int, round_index: int, num_clients: int, sampling_rate: float, lanes: int
) -> np.ndarray:
    """Round `round_index`'s participants under Poisson sampling: each of the M clients takes
    part independently with probability q (McMahan et al., ICLR 2018), its id sorted, then
    padded to `lanes` with the id M (no client: the engine gives such a lane no step and no
    weight). Depends only on (seed, round_index), as `sample_participants`.

    Raises:
      ValueError: the round drew more clients than `lanes` (see `poisson_capacity`).
    """
    rate = _check_sampling_rate(sampling_rate)
    rng = np.random.default_rng([_POISSON_STREAM, int(seed), int(round_index)])
    drawn = np.flatnonzero(rng.random(int(num_clients)) < rate).astype(np.int32)
    if drawn.size > lanes:
        raise ValueError(
            f"Poisson sampling drew {drawn.size} clients in round {round_index + 1}, more than "
            f"the round's {lanes} lanes (q={rate:g} of {num_clients} clients). Give more lanes "
            "(poisson_capacity's tail probability is POISSON_OVERFLOW_PROBABILITY)."
        )
    return np.concatenate([drawn, np.full(lanes - drawn.size, num_clients, np.int32)])


# Up to this many clients the sample is a prefix of a random permutation of all M ids (jax's
# `choice` without replacement), so the same seed gives the same clients as in every run
# recorded so far; above it, `np.random.Generator.choice` (O(m); timings in
# docs/decisions/0009-client-sampling-in-o-m.md).
PERMUTATION_SAMPLING_MAX_CLIENTS = 4096


@functools.partial(jax.jit, static_argnums=(1, 2))
def _choose_by_permutation(key, num_clients: int, clients_per_round: int):
    return jnp.sort(
        jax.random.choice(key, num_clients, (clients_per_round,), replace=False)
    ).astype(jnp.int32)





class Accounting(NamedTuple):
    """How DP on updates accounts one round of a sampler (`fedjax_pals.accounting`): m of the
    M clients without replacement (m = M: every client), or each with probability q (Poisson,
    `sampling_rate`; then `clients_per_round` is the lanes)."""

    clients_per_round: int
    sampling_rate: float | None = None


@dataclasses.dataclass(frozen=True)
class ClientSampler:
    """Who takes part in each round (module docstring). Subclass it as a frozen dataclass: equal
    samplers are one compiled program and one sweep group."""

    name: ClassVar[str] = ""

    def lanes(self, num_clients: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} implements lanes(num_clients).")

    def draw(self, seed: int, round_index: int, num_clients: int) -> np.ndarray:
        raise NotImplementedError(
            f"{type(self).__name__} implements draw(seed, round_index, num_clients).")

    def with_weights(self, algorithm: Any, label_dists: Any, sizes: Any) -> Any:
        return algorithm

    def accounting(self, num_clients: int) -> Accounting | None:
        return None

    @property
    def rate(self) -> float | None:
        """Poisson sampling's q (results.json's `sampling_rate`), else None."""
        return None

    def describe(self, num_clients: int) -> str:
        return type(self).__name__

    def dp_event(self, noise_multiplier: float, rounds: int, num_clients: int,
                 relation: str = "zero_out") -> Any:
        """The dp-accounting event of DP on updates over `rounds` rounds of this sampler.
        ValueError when the sampler has no accounting (`accounting()` is None)."""
        from fedjax_pals import accounting  # dp-accounting, imported where it is used

        how = self.accounting(num_clients)
        if how is None:
            raise ValueError(
                f"client sampler {self.name or type(self).__name__!r} has no privacy accounting "
                "(its accounting() is None), so DP on updates cannot state an epsilon for it.")
        return accounting.updates_dp_event(
            noise_multiplier, rounds, num_clients=num_clients,
            clients_per_round=how.clients_per_round, sampling_rate=how.sampling_rate,
            relation=relation)


@dataclasses.dataclass(frozen=True)
class EveryClient(ClientSampler):
    """Every client in every round."""

    name: ClassVar[str] = "every_client"

    def lanes(self, num_clients: int) -> int:
        return int(num_clients)

    def draw(self, seed: int, round_index: int, num_clients: int) -> np.ndarray:
        return np.arange(num_clients, dtype=np.int32)

    def accounting(self, num_clients: int) -> Accounting:
        return Accounting(int(num_clients))

    def describe(self, num_clients: int) -> str:
        return "every client each round"


@dataclasses.dataclass(frozen=True)
class WithoutReplacement(ClientSampler):
    """`clients_per_round` of the M clients uniformly at random without replacement, drawn
    afresh each round (`fedjax_pals.training.sample_participants`)."""

    clients_per_round: int
    name: ClassVar[str] = "without_replacement"

    def __post_init__(self):
        count = self.clients_per_round
        if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) or (
                count < 1):
            raise ValueError(f"clients_per_round must be an integer >= 1, got {count!r}.")

    def lanes(self, num_clients: int) -> int:
        return int(self.clients_per_round)

    def draw(self, seed: int, round_index: int, num_clients: int) -> np.ndarray:
        return sample_participants(seed, round_index, num_clients, self.clients_per_round)

    def accounting(self, num_clients: int) -> Accounting:
        return Accounting(int(self.clients_per_round))

    def describe(self, num_clients: int) -> str:
        return f"{self.clients_per_round} of {num_clients} clients a round, without replacement"


@dataclasses.dataclass(frozen=True)
class PoissonSampling(ClientSampler):
    """Each client independently with probability `rate` q each round (McMahan et al., ICLR
    2018), on `fedjax_pals.training.poisson_capacity` lanes, aggregated with the fixed-
    denominator weights alpha_i / q (`fedjax_pals.algorithms.with_poisson_sampling`)."""

    sampling_rate: float
    name: ClassVar[str] = "poisson"

    def __post_init__(self):
        object.__setattr__(self, "sampling_rate", float(_validation.check_number(
            "the Poisson sampling rate", self.sampling_rate, low=0.0, high=1.0,
            low_open=True)))

    @property
    def rate(self) -> float:
        return self.sampling_rate

    def lanes(self, num_clients: int) -> int:
        return poisson_capacity(num_clients, self.sampling_rate)

    def draw(self, seed: int, round_index: int, num_clients: int) -> np.ndarray:
        return sample_poisson_participants(seed, round_index, num_clients, self.sampling_rate,
                                           self.lanes(num_clients))

    def with_weights(self, algorithm: Any, label_dists: Any, sizes: Any) -> Any:
        from fedjax_pals.algorithms.poisson_sampling import with_poisson_sampling

        return with_poisson_sampling(algorithm, self.sampling_rate, label_dists, sizes)

    def accounting(self, num_clients: int) -> Accounting:
        return Accounting(self.lanes(num_clients), self.sampling_rate)

    def describe(self, num_clients: int) -> str:
        return (f"each of {num_clients} clients a round with probability "
                f"{self.sampling_rate:g} (Poisson) on {self.lanes(num_clients)} lanes")


def participation(clients_per_round: int | None, num_clients: int,
                  sampling_rate: float | None = None) -> ClientSampler:
    """The built-in sampler of the older arguments: Poisson at `sampling_rate` q, else
    `clients_per_round` of `num_clients` without replacement (None or all: every client)."""
    if sampling_rate is not None:
        return PoissonSampling(sampling_rate)
    if clients_per_round is None or clients_per_round == num_clients:
        return EveryClient()
    return WithoutReplacement(clients_per_round)


# -- the registry ------------------------------------------------------------------------------

SamplerBuild = Callable[[Mapping[str, Any], int], ClientSampler]
_SAMPLERS: dict[str, SamplerBuild] = {}


def _without_replacement(training: Mapping[str, Any], num_clients: int) -> ClientSampler:
    count = training.get("clients_per_round")
    # A method may train fewer clients than the config counted (the Oracle's resampling).
    return participation(None if count is None else min(int(count), num_clients), num_clients)


def _poisson(training: Mapping[str, Any], num_clients: int) -> ClientSampler:
    return PoissonSampling(training["client_fraction"])


def register_client_sampler(name: str, build: SamplerBuild, *, replace: bool = False) -> None:
    """Registers a client sampler: `training.client_sampling=name` builds it with
    `build(training, num_clients)` (the run's checked `training` section, its
    `clients_per_round` the resolved count; the training clients)."""
    _validation.check_registered_name("client sampler", name)
    _validation.check_hook(f"client sampler {name!r}", "build", build,
                           "(training, num_clients) -> ClientSampler")
    if not replace and name in _SAMPLERS:
        raise ValueError(
            f"a client sampler {name!r} is already registered; pick another name, or pass "
            "replace=True to redefine it.")
    _SAMPLERS[name] = build
    extensions.note_registration("client_sampler", name, ())


def registered_client_samplers() -> tuple[str, ...]:
    """The names `training.client_sampling` accepts."""
    return tuple(_SAMPLERS)


def sampler_for(training: Mapping[str, Any], num_clients: int) -> ClientSampler:
    """The sampler a resolved `training` section names (`training.client_sampling`; None: m of
    M without replacement), for `num_clients` training clients. ValueError for a name no
    sampler is registered under, or a build that returns no `ClientSampler`."""
    name = training.get("client_sampling") or "without_replacement"
    if name not in _SAMPLERS:
        raise ValueError(
            f"training.client_sampling={name!r} is no registered client sampler; the "
            f"registered ones: {list(_SAMPLERS)}.")
    sampler = _SAMPLERS[name](training, int(num_clients))
    if not isinstance(sampler, ClientSampler):
        raise ValueError(
            f"client sampler {name!r}: its build returned {type(sampler).__name__}, not a "
            "fedjax_pals.ClientSampler.")
    return sampler


register_client_sampler("without_replacement", _without_replacement, replace=True)
register_client_sampler("poisson", _poisson, replace=True)
