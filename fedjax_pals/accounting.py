"""The privacy accountant of DP on model updates: epsilon spent over rounds, and the noise a
target epsilon needs (`dp-accounting`'s RDP and PLD accountants).

What is accounted (user-level DP, McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018): each round, every participant's model update is clipped to L2
norm C and the server adds N(0, (sigma * C * max_i alpha_i)^2 I) to the weighted aggregate
sum_i alpha_i clip(Delta_i) (`fedjax_pals.algorithms.private_updates`). The unit of privacy is
one client's whole data set.

* **The neighbouring relation** (`relation`). "zero_out" (the default): neighbouring
  federations differ in one client's data being replaced by a *special* client that contributes
  nothing to any sum a round releases, while every client's label distribution S_i, size n_i
  and participation, hence the weights alpha and the noise scale, are public and the same in
  both (dp-accounting's `REPLACE_SPECIAL`; Kairouz et al., "Practical and Private (Deep)
  Learning without Sampling or Shuffling", ICML 2021, call it zero-out). That moves the
  aggregate by alpha_j ||clip(Delta_j)|| <= C max_i alpha_i, the sensitivity the noise
  sigma C max_i alpha_i is scaled to. "add_remove": one client added or removed, the weights of
  the federation without it re-normalised over the others (alpha_i / (1 - alpha_j), as
  FedAvg's n_i / N are): the aggregate moves by up to 2 C max_i alpha_i (alpha_j of the
  client's own term and alpha_j of the others' re-normalisation), and the run's noise is
  2 sigma C max_i alpha_i (`ADD_OR_REMOVE_ONE`; every client every round only).
* **Every client takes part** (`clients_per_round == num_clients`): each round is the Gaussian
  mechanism with noise multiplier sigma (std / sensitivity), composed over the rounds
  (`GaussianDpEvent(sigma)`, `REPLACE_SPECIAL` or `ADD_OR_REMOVE_ONE`). For a Gaussian the two
  relations give the same epsilon: both compare N(mu, s^2) with N(mu + v, s^2), ||v|| at most
  the sensitivity, and dp-accounting's RDP and PLD accountants return the same number for both
  (tests/test_accounting.py checks it).
* **A fixed number m of M clients per round**, drawn without replacement (the engine's
  sampling; zero_out only): amplification by subsampling holds for neighbours that *replace*
  one client (Balle, Barthe & Gaboardi, NeurIPS 2018; Wang, Balle & Kasiviswanathan, AISTATS
  2019). Replacing one clipped update, the weights fixed, moves the aggregate by up to
  2 C max_i alpha_i, so the mechanism's multiplier is sigma / 2
  (`SampledWithoutReplacementDpEvent(M, m, GaussianDpEvent(sigma / 2))`, `REPLACE_ONE`; RDP only: dp-accounting's PLD accountant has
  no such event). A zero-out neighbour is one such replacement (by the special client), so the
  epsilon holds for zero-out too.
* **Poisson sampling** (each client independently with probability q,
  `sampling_rate`; `training.client_sampling="poisson"`; zero_out only): the
  fixed-denominator estimator (`fedjax_pals.algorithms.poisson_sampling`) moves by at most
  C max_i alpha_i / q when one client's contribution is zeroed, the sensitivity its noise is
  scaled to, so each round is the Poisson-subsampled Gaussian mechanism
  (`PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`, `REPLACE_SPECIAL`; both accountants,
  and the same epsilon as under `ADD_OR_REMOVE_ONE`: the special client, drawn or not, adds
  nothing, which is the pair of distributions add/remove compares). Under add_remove the
  re-normalised weights would move the other drawn clients' terms too, which the subsampled
  Gaussian's analysis does not cover: refused.
* The weights alpha are treated as public: FedPALS' server knows every S_i and T (with label
  DP on, their release, which `fedjax_pals.privacy` accounts for per example, not per client;
  `fjp.privacy_statement` states the client-level sum by basic composition).

Conversions to (epsilon, delta) are dp-accounting's; `rdp` is the default (the tighter `pld`
for full participation and Poisson sampling; `algorithm.dp_accountant` chooses for a run).
"""

from __future__ import annotations

import functools
import logging
import math

from fedjax_pals import _validation

ACCOUNTANTS = ("rdp", "pld")
# The neighbouring relations DP on updates can be run under (`algorithm.dp_neighbouring_relation`):
# "zero_out", one client's contributions replaced by nothing with the weights held fixed (the
# relation of the noise sigma C max_i alpha_i), and "add_remove", one client added or removed
# with the weights re-normalised over the others (noise 2 sigma C max_i alpha_i). The module
# docstring says which dp-accounting relation each is accounted under.
RELATIONS = ("zero_out", "add_remove")


def _check(noise_multiplier: float, rounds: int, num_clients: int, clients_per_round: int,
           delta: float | None = None, sampling_rate: float | None = None) -> None:
    _validation.check_number("the noise multiplier", noise_multiplier, low=0.0, low_open=True)
    _validation.check_integer("rounds", rounds, 0)
    _validation.check_integer("clients_per_round", clients_per_round, 1, num_clients,
                              why=" (the participants of num_clients)")
    if sampling_rate is not None:
        _validation.check_number("the sampling rate", sampling_rate, low=0.0, high=1.0,
                                 low_open=True)
    if delta is not None:
        _validation.check_number("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_relation(relation: str, num_clients: int, clients_per_round: int,
                    sampling_rate: float | None) -> None:
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}.")
    if relation == "add_remove" and (sampling_rate is not None and sampling_rate < 1
                                     or sampling_rate is None
                                     and clients_per_round != num_clients):
        raise ValueError(
            "relation 'add_remove' is accounted for every client every round only: with "
            "sampled clients, removing one re-normalises the weights of the others drawn, which "
            "amplification by subsampling does not cover; use relation 'zero_out'."
        )


def _event(noise_multiplier: float, rounds: int, num_clients: int, clients_per_round: int,
           sampling_rate: float | None = None, relation: str = "zero_out"):
    import dp_accounting

    neighbours = dp_accounting.NeighboringRelation
    whole = (neighbours.REPLACE_SPECIAL if relation == "zero_out"
             else neighbours.ADD_OR_REMOVE_ONE)
    if sampling_rate is not None and sampling_rate < 1:
        one = dp_accounting.PoissonSampledDpEvent(
            sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        )
        chosen = whole
    elif sampling_rate is not None or clients_per_round == num_clients:
        one = dp_accounting.GaussianDpEvent(noise_multiplier)
        chosen = whole
    else:
        one = dp_accounting.SampledWithoutReplacementDpEvent(
            num_clients, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2)
        )
        chosen = neighbours.REPLACE_ONE
    return dp_accounting.SelfComposedDpEvent(one, int(rounds)), chosen


def updates_dp_event(
    noise_multiplier: float, rounds: int, *, num_clients: int, clients_per_round: int,
    sampling_rate: float | None = None, relation: str = "zero_out",
):
    """(the dp-accounting `DpEvent` that `rounds` rounds of DP on updates are, the
    `NeighboringRelation` it is accounted under): what `updates_epsilon` composes (the module
    docstring), for a statement of what is accounted (`fjp.privacy_statement`)."""
    _check(noise_multiplier, rounds, num_clients, clients_per_round, None, sampling_rate)
    _check_relation(relation, num_clients, clients_per_round, sampling_rate)
    rate = None if sampling_rate is None else float(sampling_rate)
    return _event(noise_multiplier, rounds, num_clients, clients_per_round, rate, relation)


def _accountant(kind: str, relation):
    from dp_accounting import pld, rdp

    if kind == "rdp":
        return rdp.RdpAccountant(neighboring_relation=relation)
    if kind == "pld":
        return pld.PLDAccountant(neighboring_relation=relation)
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}.")


@functools.lru_cache(maxsize=256)
def _one_round_rdp(noise_multiplier: float, num_clients: int, clients_per_round: int,
                   sampling_rate: float | None = None, relation: str = "zero_out"):
    """(orders, RDP of one round at each order): RDP composes by addition, so r rounds are r
    times one round's (what dp-accounting's self-composition computes, without recomputing
    the subsampled Gaussian's RDP, ~0.3 s, for every round count)."""
    import numpy as np

    event, neighbours = _event(noise_multiplier, 1, num_clients, clients_per_round,
                               sampling_rate, relation)
    counter = _accountant("rdp", neighbours)
    # The Poisson-subsampled Gaussian's RDP at a few fractional orders near 1 does not converge
    # and is left out with a warning per order; the bound from the other orders stands.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        counter.compose(event)
    finally:
        absl_logger.setLevel(level)
    return tuple(counter._orders), np.asarray(counter._rdp, np.float64)


@functools.lru_cache(maxsize=4096)
def updates_epsilon(
    noise_multiplier: float, rounds: int, delta: float, *, num_clients: int,
    clients_per_round: int, accountant: str = "rdp", sampling_rate: float | None = None,
    relation: str = "zero_out",
) -> float:
    """The epsilon (at `delta`) that `rounds` rounds of DP on updates spend (module docstring);
    0 for no round, inf where the accountant gives no finite bound. `sampling_rate` q:
    Poisson sampling, each client with probability q (`clients_per_round` is then not read; q
    = 1 is every client); None: `clients_per_round` of `num_clients` without replacement.
    `relation`: the neighbouring relation ("zero_out" or "add_remove", the module docstring;
    sigma is the multiplier of the sensitivity the relation's noise is scaled to)."""
    _check(noise_multiplier, rounds, num_clients, clients_per_round, delta, sampling_rate)
    _check_relation(relation, num_clients, clients_per_round, sampling_rate)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
    if rounds == 0:
        return 0.0
    rate = None if sampling_rate is None else float(sampling_rate)
    if accountant == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        orders, rdp = _one_round_rdp(float(noise_multiplier), num_clients, clients_per_round,
                                     rate, relation)
        return float(rdp_privacy_accountant.compute_epsilon(orders, int(rounds) * rdp, delta)[0])
    event, neighbours = _event(noise_multiplier, rounds, num_clients, clients_per_round, rate,
                               relation)
    counter = _accountant(accountant, neighbours)
    if not counter.supports(event):
        raise ValueError(
            f"the {accountant} accountant cannot account for sampling {clients_per_round} of "
            f"{num_clients} clients without replacement; use accountant='rdp'."
        )
    counter.compose(event)
    return float(counter.get_epsilon(delta))


def rounds_within(
    target_epsilon: float, noise_multiplier: float, rounds: int, delta: float, *,
    num_clients: int, clients_per_round: int, accountant: str = "rdp",
    sampling_rate: float | None = None, relation: str = "zero_out",
) -> int:
    """The most rounds (at most `rounds`) whose epsilon stays within `target_epsilon`."""
    spent = functools.partial(
        updates_epsilon, noise_multiplier, delta=delta, num_clients=num_clients,
        clients_per_round=clients_per_round, accountant=accountant, sampling_rate=sampling_rate,
        relation=relation,
    )
    low, high = 0, int(rounds)  # spent(low) <= target; epsilon grows with the rounds
    if spent(high) <= target_epsilon:
        return high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if spent(mid) <= target_epsilon else (low, mid)
    return low


# The smallest noise multiplier PLD calibration considers (`calibrate_noise_multiplier`).
_PLD_LOWEST = 0.1


def calibrate_noise_multiplier(
    target_epsilon: float, rounds: int, delta: float, *, num_clients: int,
    clients_per_round: int, accountant: str = "rdp", rtol: float = 1e-3,
    sampling_rate: float | None = None, relation: str = "zero_out",
) -> float:
    """The smallest noise multiplier (to relative accuracy `rtol`, on the private side) whose
    `rounds` rounds spend at most `target_epsilon` at `delta` (at least 0.01; with
    accountant="pld" at least 0.1, whose PLD would not fit in memory below).

    Raises:
      ValueError: a target no noise multiplier up to 1e4 reaches in these rounds.
    """
    _validation.check_number("the target epsilon", target_epsilon, low=0.0, low_open=True)
    spent = functools.partial(
        updates_epsilon, rounds=int(rounds), delta=delta, num_clients=num_clients,
        clients_per_round=clients_per_round, accountant=accountant, sampling_rate=sampling_rate,
        relation=relation,
    )
    low, high = 1e-2, 1e4
    if spent(high) > target_epsilon:
        raise ValueError(
            f"no noise multiplier up to {high:g} keeps {rounds} rounds within epsilon "
            f"{target_epsilon:g} at delta {delta:g}: raise the target or train fewer rounds."
        )
    if accountant == "pld":
        # A privacy loss distribution's support grows as 1 / sigma^2 (at sigma = 0.01 and
        # dp-accounting's discretisation 1e-4, tens of GB): the bisection starts at
        # `_PLD_LOWEST` without accounting it, and only evaluates sigmas above the answer's
        # neighbourhood. `high` always keeps the target, so what it returns does too.
        low = _PLD_LOWEST
    elif spent(low) <= target_epsilon:
        return low
    while high / low > 1 + rtol:  # bisection in log sigma; epsilon falls as sigma grows
        mid = math.sqrt(low * high)
        low, high = (low, mid) if spent(mid) <= target_epsilon else (mid, high)
    return high
