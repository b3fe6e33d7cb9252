"""fedjax_pals.accounting: epsilon of DP on model updates against independent computations."""

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from fedjax_pals import accounting


def _exact_gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """The exact epsilon of `rounds` Gaussian mechanisms of multiplier sigma (sensitivity 1):
    their composition is one Gaussian mechanism of multiplier sigma / sqrt(rounds) (Dong, Roth
    & Su, "Gaussian Differential Privacy", 2022), whose (epsilon, delta) curve is Balle & Wang's
    (ICML 2018, Thm. 8): delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)."""
    s = noise_multiplier / math.sqrt(rounds)

    def excess(eps):  # e^eps Phi(b) in log space: large eps must not overflow
        return (stats.norm.cdf(0.5 / s - eps * s)
                - math.exp(eps + special.log_ndtr(-0.5 / s - eps * s))) - delta

    return optimize.brentq(excess, 0.0, 1e3, xtol=1e-12)


def _closed_form_rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """RDP of the Gaussian mechanism, rounds * alpha / (2 sigma^2) (Mironov, CSF 2017, Prop. 7),
    converted to (epsilon, delta) by Balle et al. (AISTATS 2020, Thm. 21), minimised over real
    alpha > 1 in float64."""

    def epsilon(alpha):
        rdp = rounds * alpha / (2 * noise_multiplier**2)
        return rdp + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)

    found = optimize.minimize_scalar(epsilon, bounds=(1.0 + 1e-9, 1e6), method="bounded",
                                     options={"xatol": 1e-10})
    return float(found.fun)


RNG = np.random.default_rng()  # fresh inputs each run; the tolerances hold for any


@pytest.mark.parametrize("case", range(4))
def test_full_participation_epsilon_matches_the_closed_forms(case):
    sigma = float(RNG.uniform(0.8, 4.0))
    rounds = int(RNG.integers(1, 100))
    delta = float(10 ** RNG.uniform(-7, -3))
    common = dict(num_clients=10, clients_per_round=10)
    exact = _exact_gaussian_epsilon(sigma, rounds, delta)
    closed_rdp = _closed_form_rdp_epsilon(sigma, rounds, delta)
    rdp = accounting.updates_epsilon(sigma, rounds, delta, **common)
    pld = accounting.updates_epsilon(sigma, rounds, delta, accountant="pld", **common)
    note = f"sigma={sigma}, rounds={rounds}, delta={delta}"
    # RDP over dp-accounting's discrete orders is never below the continuous minimum, and
    # within 3 % of it (its orders are spaced by at most ~10 % where the optimum lies).
    assert closed_rdp * (1 - 1e-9) <= rdp <= closed_rdp * 1.03 + 1e-9, note
    # Every RDP bound is valid, so it is never below the exact curve.
    assert exact <= closed_rdp * (1 + 1e-9), note
    # PLD is pessimistic by its discretisation (value_discretization_interval 1e-4 per
    # composition step): within 2 % above the exact epsilon.
    assert exact * (1 - 1e-6) - 1e-6 <= pld <= exact * 1.02 + 1e-3, note


def test_subsampled_epsilons_agree_with_the_other_accountants_within_their_gap():
    import dp_accounting
    from dp_accounting import pld, rdp

    # Poisson sampling, the case both accountants cover: PLD is the tighter, RDP within 35 %
    # above it (the gap of RDP's conversion at these settings, Zhu et al., AISTATS 2022).
    q, sigma, rounds, delta = 0.1, 1.2, 200, 1e-5
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds)
    by_rdp = rdp.RdpAccountant().compose(event).get_epsilon(delta)
    by_pld = pld.PLDAccountant().compose(event).get_epsilon(delta)
    assert by_pld <= by_rdp <= 1.35 * by_pld
    # The engine's sampling, m of M without replacement (replace-one neighbours, the
    # multiplier halved for the sensitivity 2 C max alpha), spends less than every client
    # every round and more than Poisson sampling at the same rate with add/remove neighbours.
    sampled = accounting.updates_epsilon(sigma, rounds, delta, num_clients=1000,
                                         clients_per_round=100)
    everyone = accounting.updates_epsilon(sigma, rounds, delta, num_clients=1000,
                                          clients_per_round=1000)
    assert by_rdp < sampled < everyone
    with pytest.raises(ValueError, match="cannot account for sampling 100 of 1000"):
        accounting.updates_epsilon(sigma, rounds, delta, num_clients=1000,
                                   clients_per_round=100, accountant="pld")


def test_epsilon_grows_with_the_rounds_and_is_zero_before_any():
    common = dict(num_clients=20, clients_per_round=5)
    spent = [accounting.updates_epsilon(1.5, r, 1e-5, **common) for r in (0, 1, 10, 100)]
    assert spent[0] == 0.0 and all(a < b for a, b in zip(spent, spent[1:]))


def test_calibration_gives_the_smallest_noise_within_the_target():
    common = dict(num_clients=50, clients_per_round=50)
    target = float(RNG.uniform(1.0, 8.0))
    sigma = accounting.calibrate_noise_multiplier(target, 40, 1e-5, rtol=1e-4, **common)
    assert accounting.updates_epsilon(sigma, 40, 1e-5, **common) <= target
    assert accounting.updates_epsilon(sigma / (1 + 2e-4), 40, 1e-5, **common) > target
    with pytest.raises(ValueError, match="no noise multiplier up to 10000 keeps"):
        accounting.calibrate_noise_multiplier(1e-6, 10**6, 1e-5, **common)


def test_rounds_within_is_the_last_round_inside_the_budget():
    common = dict(num_clients=30, clients_per_round=30)
    within = accounting.rounds_within(20.0, 1.0, 500, 1e-5, **common)
    assert 0 < within < 500
    assert accounting.updates_epsilon(1.0, within, 1e-5, **common) <= 20.0
    assert accounting.updates_epsilon(1.0, within + 1, 1e-5, **common) > 20.0
    assert accounting.rounds_within(1e3, 1.0, 20, 1e-5, **common) == 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(noise_multiplier=0.0), "noise multiplier must be a finite number > 0"),
        (dict(rounds=-1), "rounds must be an integer >= 0"),
        (dict(delta=1.0), r"delta must be a number in \(0, 1\)"),
        (dict(clients_per_round=11), r"clients_per_round must be an integer in \[1, 10\] \(the participants of num_clients\)"),
        (dict(accountant="moments"), "accountant must be one of"),
    ],
)
def test_bad_input_is_refused_naming_it(kwargs, message):
    args = dict(noise_multiplier=1.0, rounds=5, delta=1e-5, num_clients=10, clients_per_round=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        accounting.updates_epsilon(
            args.pop("noise_multiplier"), args.pop("rounds"), args.pop("delta"), **args)


@pytest.mark.parametrize("clients_per_round", [40, 400])
def test_rounds_times_one_rounds_rdp_is_dp_accountings_self_composition(clients_per_round):
    import dp_accounting
    from dp_accounting import rdp

    sigma, rounds, delta = float(RNG.uniform(0.8, 3.0)), int(RNG.integers(2, 200)), 1e-5
    got = accounting.updates_epsilon(sigma, rounds, delta, num_clients=400,
                                     clients_per_round=clients_per_round)
    if clients_per_round == 400:
        one = dp_accounting.GaussianDpEvent(sigma)
        relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    else:
        one = dp_accounting.SampledWithoutReplacementDpEvent(
            400, clients_per_round, dp_accounting.GaussianDpEvent(sigma / 2))
        relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    whole = rdp.RdpAccountant(neighboring_relation=relation).compose(
        dp_accounting.SelfComposedDpEvent(one, rounds)).get_epsilon(delta)
    np.testing.assert_allclose(got, whole, rtol=1e-9)


def test_poisson_sampling_is_accounted_as_the_poisson_subsampled_gaussian():
    import dp_accounting
    from dp_accounting import pld, rdp

    q, sigma, rounds, delta = float(RNG.uniform(0.02, 0.3)), float(RNG.uniform(0.8, 2.0)), 50, 1e-5
    common = dict(num_clients=500, clients_per_round=200, sampling_rate=q)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds)
    by_rdp = rdp.RdpAccountant().compose(event).get_epsilon(delta)
    np.testing.assert_allclose(accounting.updates_epsilon(sigma, rounds, delta, **common),
                               by_rdp, rtol=1e-9)
    by_pld = accounting.updates_epsilon(sigma, rounds, delta, accountant="pld", **common)
    np.testing.assert_allclose(by_pld, pld.PLDAccountant().compose(event).get_epsilon(delta),
                               rtol=1e-9)
    assert by_pld <= by_rdp * (1 + 1e-9)
    # q = 1 is every client every round; calibration and the budget read q too.
    everyone = accounting.updates_epsilon(sigma, rounds, delta, num_clients=500,
                                          clients_per_round=500)
    assert accounting.updates_epsilon(sigma, rounds, delta, num_clients=500,
                                      clients_per_round=200, sampling_rate=1.0) == everyone
    found = accounting.calibrate_noise_multiplier(2.0, rounds, delta, **common)
    assert accounting.updates_epsilon(found, rounds, delta, **common) <= 2.0
    assert accounting.updates_epsilon(found * 0.99, rounds, delta, **common) > 2.0


# -- the neighbouring relation and the accountant (issue 58) -------------------------------------


@pytest.mark.parametrize("sampling_rate", [None, 0.1])
@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_zero_out_is_accounted_under_replace_special_which_equals_add_remove_here(
        kind, sampling_rate):
    import dp_accounting
    from dp_accounting import pld, rdp

    sigma, rounds, delta = float(RNG.uniform(0.8, 3.0)), int(RNG.integers(2, 60)), 1e-5
    common = dict(num_clients=200, clients_per_round=200, sampling_rate=sampling_rate)
    event, relation = accounting.updates_dp_event(sigma, rounds, **common)
    special = dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    assert relation == special  # the relation the noise sigma C max_i alpha_i is scaled to
    _, add_remove = accounting.updates_dp_event(sigma, rounds, relation="add_remove",
                                                num_clients=200, clients_per_round=200)
    assert add_remove == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    one = dp_accounting.GaussianDpEvent(sigma)
    if sampling_rate is not None:
        one = dp_accounting.PoissonSampledDpEvent(sampling_rate, one)
    built = dp_accounting.SelfComposedDpEvent(one, rounds)  # built here, independently
    make = rdp.RdpAccountant if kind == "rdp" else pld.PLDAccountant
    by_special = make(neighboring_relation=special).compose(built).get_epsilon(delta)
    by_add_remove = make(neighboring_relation=dp_accounting.NeighboringRelation
                         .ADD_OR_REMOVE_ONE).compose(built).get_epsilon(delta)
    got = accounting.updates_epsilon(sigma, rounds, delta, accountant=kind, **common)
    np.testing.assert_allclose(got, by_special, rtol=1e-9)
    # Zero-out compares N(mu, s^2) (the special client adds nothing, drawn or not) with
    # N(mu + v, s^2) (drawn with probability q): add/remove's pair, so the same epsilon.
    np.testing.assert_allclose(by_special, by_add_remove, rtol=1e-9)
    if sampling_rate is None and kind == "pld":
        # and the exact curve of the composed Gaussian (float64, closed form): PLD's
        # discretisation is pessimistic by at most 2 % (the test above).
        exact = _exact_gaussian_epsilon(sigma, rounds, delta)
        assert exact * (1 - 1e-6) - 1e-6 <= got <= exact * 1.02 + 1e-3


def test_add_remove_is_accounted_for_every_client_every_round_only():
    sigma, rounds, delta = 1.3, 10, 1e-5
    full = dict(num_clients=50, clients_per_round=50)
    # Its noise is 2 sigma C max alpha for sensitivity 2 C max alpha: the same multiplier,
    # hence the same epsilon as zero-out's sigma C max alpha for C max alpha.
    assert (accounting.updates_epsilon(sigma, rounds, delta, relation="add_remove", **full)
            == accounting.updates_epsilon(sigma, rounds, delta, **full))
    for sampled in (dict(num_clients=50, clients_per_round=10),
                    dict(num_clients=50, clients_per_round=50, sampling_rate=0.2)):
        with pytest.raises(ValueError, match="'add_remove' is accounted for every client"):
            accounting.updates_epsilon(sigma, rounds, delta, relation="add_remove", **sampled)
    with pytest.raises(ValueError, match="relation must be one of"):
        accounting.updates_epsilon(sigma, rounds, delta, relation="replace", **full)


@pytest.mark.parametrize("sampling_rate", [None, 0.1])
def test_pld_calibration_is_the_smallest_sigma_dp_accountings_pld_keeps_within_the_target(
        sampling_rate):
    import dp_accounting
    from dp_accounting import pld

    target, rounds, delta = float(RNG.uniform(2.0, 8.0)), 40, 1e-5
    common = dict(num_clients=1000, clients_per_round=1000, sampling_rate=sampling_rate)

    def by_pld(sigma):  # dp-accounting's PLD accountant, built here
        one = dp_accounting.GaussianDpEvent(sigma)
        if sampling_rate is not None:
            one = dp_accounting.PoissonSampledDpEvent(sampling_rate, one)
        counter = pld.PLDAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
        return counter.compose(dp_accounting.SelfComposedDpEvent(one, rounds)).get_epsilon(delta)

    sigma = accounting.calibrate_noise_multiplier(target, rounds, delta, accountant="pld",
                                                  rtol=1e-4, **common)
    assert by_pld(sigma) <= target < by_pld(sigma / (1 + 2e-4))
    rdp_sigma = accounting.calibrate_noise_multiplier(target, rounds, delta, rtol=1e-4,
                                                      **common)
    assert sigma < rdp_sigma  # PLD is the tighter: less noise for the same epsilon
