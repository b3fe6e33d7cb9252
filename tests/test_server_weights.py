"""Tests for fedjax_pals.server_weights: FedPALS weights (eq. 7-8), ESS, lambda_for_ess.

The library solves eq. 8 with an iterative float32 solver (JAX's default dtype).
Every solution is checked against an independent float64 reference written
here in NumPy: a support guess from Lawson-Hanson NNLS, refined by an exact
active-set solve of the KKT system of the simplex-constrained QP

    min_alpha 1/2 alpha^T Q alpha + c^T alpha,  Q = 2 (S S^T + lam diag(1/n)),  c = -2 S T,

and accepted only when the KKT conditions (primal and dual feasibility,
stationarity) hold in float64, which certifies the global minimum of the convex
problem. `test_reference_solver_agrees_with_multistart_slsqp` cross-checks that
reference against SciPy's SLSQP from several starting points.

Since the minimiser is not unique at lam = 0 when M > K (or with duplicate
clients), solutions are compared through the objective, and, where the problem
is strictly convex on the simplex, also entrywise, within a bound on what float32
rounding alone allows (`_float32_floor`): the library polishes projected
gradient's result with exact steps on the active face, so what is left is
rounding, not the solver's stopping rule.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize, nnls

from fedjax_pals import server_weights
from fedjax_pals.server_weights import (
    effective_sample_size,
    fedavg_weights,
    fedpals_lam_derivative,
    fedpals_objective,
    fedpals_weights,
    lambda_for_ess,
    projection_distance,
)

# Relative objective gaps (f(alpha) - f*) / max(1, f*) seen in
# test_weights_reach_reference_optimum, printed at the end of the module (-s).
_OBSERVED_GAPS = []


@pytest.fixture(scope="module", autouse=True)
def _report_largest_gap():
    yield
    if _OBSERVED_GAPS:
        print(
            f"\nlargest relative objective gap vs the float64 reference: "
            f"{max(_OBSERVED_GAPS):.3e} over {len(_OBSERVED_GAPS)} solves"
        )


# ---------------------------------------------------------------------------
# Float64 references and random problems.
# ---------------------------------------------------------------------------


def _objective(alpha, dists, target, sizes, lam):
    alpha = np.asarray(alpha, np.float64)
    residual = np.asarray(target, np.float64) - alpha @ np.asarray(dists, np.float64)
    penalty = lam * np.sum(alpha**2 / np.asarray(sizes, np.float64)) if lam else 0.0
    return float(residual @ residual + penalty)


def _ess(alpha, sizes):
    return float(1.0 / np.sum(np.asarray(alpha, np.float64) ** 2 / np.asarray(sizes, np.float64)))


def _qp(dists, target, sizes, lam):
    q = 2.0 * (dists @ dists.T + lam * np.diag(1.0 / sizes))
    c = -2.0 * dists @ target
    return q, c


def _slsqp_weights(dists, target, sizes, lam, starts=4, seed=0):
    """Best of several SLSQP runs (float64, ftol 1e-15) from FedAvg, uniform and random starts."""
    dists, target, sizes = (np.asarray(a, np.float64) for a in (dists, target, sizes))
    num_clients = sizes.size
    q, c = _qp(dists, target, sizes, lam)
    rng = np.random.default_rng(seed)
    x0s = [sizes / sizes.sum(), np.full(num_clients, 1.0 / num_clients)]
    x0s += list(rng.dirichlet(np.ones(num_clients), size=starts))
    best, best_value = None, np.inf
    for x0 in x0s:
        result = minimize(
            lambda a: 0.5 * a @ q @ a + c @ a,
            x0,
            jac=lambda a: q @ a + c,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * num_clients,
            constraints=[
                {"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones_like(a)}
            ],
            options={"ftol": 1e-15, "maxiter": 2000},
        )
        alpha = np.clip(result.x, 0.0, None)
        alpha /= alpha.sum()
        value = _objective(alpha, dists, target, sizes, lam)
        if value < best_value:
            best, best_value = alpha, value
    return best


def _reference_weights(dists, target, sizes, lam):
    """A KKT-certified float64 minimiser of eq. 8 (FedAvg for lam = inf)."""
    dists, target, sizes = (np.asarray(a, np.float64) for a in (dists, target, sizes))
    num_clients = sizes.size
    if np.isinf(lam):
        return sizes / sizes.sum()
    q, c = _qp(dists, target, sizes, lam)
    # Support guess: NNLS on the least-squares form of eq. 8, with the
    # sum-to-one constraint as a heavily weighted extra row.
    heavy = 1e3
    rows, rhs = [dists.T], [target]
    if lam > 0:
        rows.append(np.diag(np.sqrt(lam / sizes)))
        rhs.append(np.zeros(num_clients))
    rows.append(np.full((1, num_clients), heavy))
    rhs.append([heavy])
    guess, _ = nnls(np.vstack(rows), np.concatenate(rhs), maxiter=100 * num_clients)
    support = guess > 1e-9 * guess.max()
    scale = max(1.0, np.abs(q).max())
    for _ in range(4 * num_clients):
        idx = np.flatnonzero(support)
        k = idx.size
        kkt = np.zeros((k + 1, k + 1))
        kkt[:k, :k] = q[np.ix_(idx, idx)]
        kkt[:k, k] = 1.0
        kkt[k, :k] = 1.0
        solution = np.linalg.lstsq(kkt, np.append(-c[idx], 1.0), rcond=None)[0]
        alpha = np.zeros(num_clients)
        alpha[idx] = solution[:k]
        multiplier = -solution[k]
        if alpha.min() < -1e-12:  # primal infeasible: drop the most negative client
            support[np.argmin(alpha)] = False
            continue
        slack = (q @ alpha + c - multiplier) / scale
        if np.abs(slack[idx]).max() > 1e-9:  # the KKT system was not solved
            break
        slack[idx] = np.inf
        if slack.min() < -1e-11:  # dual infeasible: add the most violating client
            support[np.argmin(slack)] = True
            continue
        return alpha  # KKT conditions hold: the global minimum of the convex QP
    return _slsqp_weights(dists, target, sizes, lam)


def _random_sizes(rng, num_clients):
    return np.round(np.exp(rng.uniform(np.log(5), np.log(5000), num_clients)))


def _random_dists(rng, num_clients, num_classes, sparse=True, concentrations=(0.2, 1.0, 3.0)):
    """Client label distributions; with `sparse`, about half the clients miss some labels."""
    dists = np.zeros((num_clients, num_classes))
    for i in range(num_clients):
        concentration = rng.choice(concentrations)
        if sparse and rng.random() < 0.5:
            keep = rng.choice(num_classes, size=rng.integers(1, num_classes + 1), replace=False)
        else:
            keep = np.arange(num_classes)
        dists[i, keep] = rng.dirichlet(np.full(keep.size, concentration))
    return dists


def _random_target(rng, dists, kind):
    num_clients, num_classes = dists.shape
    if kind == "random":
        return rng.dirichlet(np.ones(num_classes))
    if kind == "inside":
        return rng.dirichlet(np.ones(num_clients)) @ dists
    if kind == "sparse":
        target = np.zeros(num_classes)
        keep = rng.choice(num_classes, size=max(1, num_classes // 3), replace=False)
        target[keep] = rng.dirichlet(np.ones(keep.size))
        return target
    raise ValueError(kind)


def _assert_on_simplex(alpha, num_clients):
    alpha = np.asarray(alpha, np.float64)
    assert alpha.shape == (num_clients,)
    assert np.all(np.isfinite(alpha))
    assert alpha.min() >= -1e-7, alpha
    assert abs(alpha.sum() - 1.0) <= 1e-5, alpha.sum()


_EPS32 = float(np.finfo(np.float32).eps)
# Allowed error in alpha, in units of _float32_floor. The largest error seen over
# the 330 strictly convex solves of test_weights_reach_reference_optimum is 0.42
# floors (before the exact face polish: up to 780 floors, 1.8e-4 in alpha).
_FLOOR_FACTOR = 8.0


def _sum_zero_basis(size):
    """An orthonormal basis (size x size-1) of {d : sum_i d_i = 0}."""
    return np.linalg.svd(np.ones((1, size)))[2][1:].T


def _float32_floor(dists, target, sizes, lam, reference):
    """How far float32 rounding alone can put alpha from the minimiser `reference` of eq. 8.

    On the face A = supp(reference), eq. 8 is the least-squares problem
    min ||b - B alpha_A||^2 over sum_i alpha_i = 1, with B = [S_A^T; sqrt(lam) N_A^(-1/2)]
    and b = [T; 0]. A float32 solver evaluates the residual b - B alpha, rounded by about
    eps (||T|| + ||alpha^T S|| + sqrt(lam sum_i alpha_i^2 / n_i)); a perturbation db of the
    data moves the minimiser by at most ||db|| / sigma_min, sigma_min the smallest singular
    value of B on sum-zero directions (least-squares perturbation theory, Golub & Van Loan,
    Matrix Computations, Sec. 5.3). Plus eps for storing alpha in float32. Infinite when
    the face has a flat direction (sigma_min = 0): then alpha is not unique there.
    """
    dists, target, sizes, reference = (
        np.asarray(a, np.float64) for a in (dists, target, sizes, reference)
    )
    face = reference > 0
    scale = (
        np.linalg.norm(target)
        + np.linalg.norm(reference @ dists)
        + np.sqrt(lam * np.sum(reference**2 / sizes))
    )
    if face.sum() == 1:
        return _EPS32
    low, _ = _face_singular_values(dists, sizes, lam, face)
    return _EPS32 * (1.0 + scale / low) if low > 0 else np.inf


def _strictly_convex(dists, lam):
    """Eq. 8 has a unique minimiser: lam > 0, or S^T is injective on sum-zero directions."""
    if lam > 0 or len(dists) == 1:
        return True
    singular_values = np.linalg.svd(
        np.asarray(dists, np.float64).T @ _sum_zero_basis(len(dists)), compute_uv=False
    )
    return len(dists) - 1 <= len(singular_values) and (
        singular_values.min() > 1e-6 * singular_values.max()
    )


def _assert_near_optimal(alpha, dists, target, sizes, lam, context=""):
    reference = _reference_weights(dists, target, sizes, lam)
    f_star = _objective(reference, dists, target, sizes, lam)
    # The gap is taken at alpha rescaled onto the simplex: float32 leaves sum(alpha)
    # up to ~M eps / 2 off 1 (checked by _assert_on_simplex), and that alone moves the
    # objective by (multiplier of the sum constraint) * (sum - 1), up to 3e-7 here.
    rescaled = np.clip(np.asarray(alpha, np.float64), 0.0, None)
    rescaled /= rescaled.sum()
    gap = _objective(rescaled, dists, target, sizes, lam) - f_star
    _OBSERVED_GAPS.append(gap / max(1.0, f_star))
    assert gap <= 1e-6 * max(
        1.0, f_star
    ), f"{context}: objective {f_star + gap!r} vs reference {f_star!r} (gap {gap:.3e})"
    if _strictly_convex(dists, lam):
        bound = _FLOOR_FACTOR * _float32_floor(dists, target, sizes, lam, reference)
        error = np.abs(np.asarray(alpha, np.float64) - reference).max()
        assert error <= bound, f"{context}: max |alpha - alpha*| = {error:.3e} > {bound:.3e}"
    return reference


def test_reference_solver_agrees_with_multistart_slsqp():
    # The test's own reference must be right: compare it with SLSQP on small problems.
    rng = np.random.default_rng(101)
    for num_clients, num_classes in [(3, 6), (6, 6), (10, 4)]:
        for kind in ("random", "inside", "sparse"):
            dists = _random_dists(rng, num_clients, num_classes)
            target = _random_target(rng, dists, kind)
            sizes = _random_sizes(rng, num_clients)
            for lam in [0.0, 1e-2 * sizes.sum(), sizes.sum()]:
                reference = _reference_weights(dists, target, sizes, lam)
                _assert_on_simplex(reference, num_clients)
                f_ref = _objective(reference, dists, target, sizes, lam)
                f_slsqp = _objective(
                    _slsqp_weights(dists, target, sizes, lam), dists, target, sizes, lam
                )
                assert f_ref <= f_slsqp + 1e-12 * max(1.0, f_slsqp)
                assert f_slsqp - f_ref <= 1e-8 * max(1.0, f_ref)


# ---------------------------------------------------------------------------
# fedpals_weights against the reference.
# ---------------------------------------------------------------------------

LAMBDA_OVER_N = [0.0, 1e-4, 1e-2, 1e-1, 1.0, 10.0]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "num_clients,num_classes",
    [(3, 10), (8, 8), (20, 5), (50, 10)],
    ids=["M<K", "M=K", "M>K", "M>>K"],
)
def test_weights_reach_reference_optimum(num_clients, num_classes, seed):
    rng = np.random.default_rng([num_clients, num_classes, seed])
    dists = _random_dists(rng, num_clients, num_classes)
    sizes = _random_sizes(rng, num_clients)
    total = sizes.sum()
    for kind in ("random", "inside", "sparse"):
        target = _random_target(rng, dists, kind)
        for ratio in LAMBDA_OVER_N:
            lam = ratio * total
            alpha = np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64)
            _assert_on_simplex(alpha, num_clients)
            _assert_near_optimal(alpha, dists, target, sizes, lam, f"{kind} target, lam/N={ratio}")


@pytest.mark.parametrize("lam", [0.05, 0.07])
def test_solver_does_not_stop_at_a_vertex_it_overshoots_onto(lam):
    # Regression: FISTA's momentum carries the iterate past vertex e_1, the
    # projection returns it there twice in a row, and a stopping test on
    # ||alpha_{k+1} - alpha_k|| (jaxopt.ProjectedGradient with acceleration)
    # ended the solve at e_1, 1e-5 to 1e-4 above the optimum, about 0.03 from it.
    dists = np.array(
        [
            [0.34, 0.12, 0.06, 0, 0, 0.24, 0.06, 0, 0.07, 0.11],
            [0.35, 0.15, 0.18, 0, 0.04, 0.02, 0.09, 0.04, 0.08, 0.05],
            [0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    target = np.array([0.26, 0, 0, 0, 0.27, 0, 0, 0.47, 0, 0])
    sizes = np.array([210.0, 12.0, 475.0])
    alpha = np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64)
    # lam > 0: strictly convex, so this also checks alpha entrywise against the optimum.
    reference = _assert_near_optimal(alpha, dists, target, sizes, lam, f"lam={lam}")
    assert reference[0] > 0.01
    assert alpha[0] > 0.01


def test_fedpals_objective_matches_eq_8():
    rng = np.random.default_rng(7)
    dists = _random_dists(rng, 6, 4)
    target = _random_target(rng, dists, "random")
    sizes = _random_sizes(rng, 6)
    for lam in [0.0, 3.0, 1e3]:
        for alpha in rng.dirichlet(np.ones(6), size=3):
            value = float(fedpals_objective(alpha, dists, target, sizes, lam))
            expected = _objective(alpha, dists, target, sizes, lam)
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_clients,num_classes", [(3, 10), (20, 5)])
def test_lambda_zero_with_target_in_hull_matches_target(num_clients, num_classes, seed):
    rng = np.random.default_rng([11, num_clients, seed])
    dists = _random_dists(rng, num_clients, num_classes)
    sizes = _random_sizes(rng, num_clients)
    omega = rng.dirichlet(np.ones(num_clients))
    target = omega @ dists
    alpha = fedpals_weights(dists, target, sizes, 0.0)
    _assert_on_simplex(alpha, num_clients)
    assert _objective(alpha, dists, target, sizes, 0.0) < 1e-6
    # The target is matched by a combination other than FedAvg (so FedAvg would fail here).
    assert _objective(sizes / sizes.sum(), dists, target, sizes, 0.0) > 1e-4


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_clients,num_classes", [(3, 10), (20, 5)])
def test_lambda_zero_with_target_outside_hull_attains_projection_distance(
    num_clients, num_classes, seed
):
    rng = np.random.default_rng([12, num_clients, seed])
    dists = _random_dists(rng, num_clients, num_classes, sparse=False, concentrations=(3.0,))
    sizes = _random_sizes(rng, num_clients)
    target = _random_target(rng, dists, "sparse")
    distance = _objective(_reference_weights(dists, target, sizes, 0.0), dists, target, sizes, 0.0)
    assert distance > 1e-3  # the target is well outside Conv(S)
    alpha = fedpals_weights(dists, target, sizes, 0.0)
    _assert_on_simplex(alpha, num_clients)
    np.testing.assert_allclose(
        _objective(alpha, dists, target, sizes, 0.0), distance, rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("seed", range(3))
def test_huge_lambda_recovers_fedavg(seed):
    rng = np.random.default_rng([13, seed])
    dists = _random_dists(rng, 20, 5)
    target = _random_target(rng, dists, "sparse")
    sizes = _random_sizes(rng, 20)
    fedavg = sizes / sizes.sum()
    # alpha^0 is far from FedAvg, so the check below is not vacuous.
    assert np.abs(_reference_weights(dists, target, sizes, 0.0) - fedavg).max() > 0.05
    alpha = fedpals_weights(dists, target, sizes, 1e6 * sizes.sum())
    _assert_on_simplex(alpha, 20)
    np.testing.assert_allclose(alpha, fedavg, atol=1e-4)


def test_infinite_lambda_is_exactly_fedavg():
    rng = np.random.default_rng(14)
    dists = _random_dists(rng, 20, 5)
    target = _random_target(rng, dists, "sparse")
    sizes = _random_sizes(rng, 20)
    alpha = fedpals_weights(dists, target, sizes, jnp.inf)
    np.testing.assert_array_equal(np.asarray(alpha), np.asarray(fedavg_weights(sizes)))
    np.testing.assert_allclose(alpha, sizes / sizes.sum(), rtol=1e-6)
    np.testing.assert_array_equal(
        np.asarray(fedpals_weights(dists, target, sizes, float("inf"))), np.asarray(alpha)
    )


@pytest.mark.parametrize("num_clients,num_classes", [(3, 10), (20, 5)])
def test_target_equal_to_client_aggregate_gives_fedavg_for_every_lambda(num_clients, num_classes):
    rng = np.random.default_rng([15, num_clients])
    dists = _random_dists(rng, num_clients, num_classes)
    sizes = _random_sizes(rng, num_clients)
    fedavg = sizes / sizes.sum()
    target = fedavg @ dists
    for ratio in [0.0, 1e-3, 1e-1, 1.0, 100.0]:
        alpha = fedpals_weights(dists, target, sizes, ratio * sizes.sum())
        np.testing.assert_allclose(alpha, fedavg, atol=1e-5, err_msg=f"lam/N={ratio}")


@pytest.mark.parametrize("num_classes", [1, 10])  # M = 1, K = 10: the edge tests' "one client"
def test_single_client_gets_all_weight(num_classes):
    rng = np.random.default_rng(16)
    dists = rng.dirichlet(np.ones(num_classes), size=1)
    target = rng.dirichlet(np.ones(num_classes))
    for lam in [0.0, 1.0, 1e4, jnp.inf]:
        np.testing.assert_allclose(fedpals_weights(dists, target, [37], lam), [1.0], atol=1e-7)


def test_single_class_is_trivial():
    # K = 1: every client and the target are the point mass, the residual is
    # always 0, so lam > 0 leaves only the ESS term (FedAvg) and lam = 0 any alpha.
    sizes = np.array([10.0, 400.0, 75.0, 3.0])
    dists = np.ones((4, 1))
    for lam in [1e-3, 1.0, 1e3]:
        np.testing.assert_allclose(
            fedpals_weights(dists, [1.0], sizes, lam), sizes / sizes.sum(), atol=1e-5
        )
    alpha = fedpals_weights(dists, [1.0], sizes, 0.0)
    _assert_on_simplex(alpha, 4)
    assert _objective(alpha, dists, [1.0], sizes, 0.0) < 1e-12
    assert float(projection_distance(dists, [1.0])) < 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_duplicate_clients_split_weight_in_proportion_to_size(seed):
    # The distinct rows are ill-conditioned (smallest eigenvalue of S S^T down to
    # 7e-4 against 0.9 for seed 1): projected gradient's stopping rule alone left
    # alpha 1.8e-4 off at lam = 0, which float32 rounding (_float32_floor) would
    # allow only 3e-6 of.
    rng = np.random.default_rng([17, seed])
    distinct = _random_dists(rng, 7, 8, sparse=False, concentrations=(1.0,))
    dists = np.vstack([distinct, distinct[0]])  # client 7 duplicates client 0
    sizes = _random_sizes(rng, 8)
    total = sizes.sum()
    target = np.array([0.4, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]) @ distinct  # weight on the pair
    for ratio in [0.0, 1e-3, 1e-2, 1e-1, 1.0]:
        lam = ratio * total
        alpha = np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64)
        _assert_on_simplex(alpha, 8)
        # lam > 0: strictly convex, alpha is checked entrywise in here.
        reference = _assert_near_optimal(alpha, dists, target, sizes, lam, f"lam/N={ratio}")
        combined = reference[0] + reference[7]
        assert combined > 0.05  # the duplicated pair is in the support
        # At lam = 0 the pair's split is free (a flat direction), but their combined
        # weight and the rest of alpha are unique (the distinct rows are linearly
        # independent): the solution of the problem with the pair merged into one client.
        if lam == 0:
            merged = np.concatenate([[combined], reference[1:7]])
            bound = _FLOOR_FACTOR * _float32_floor(distinct, target, sizes[:7], lam, merged)
        else:
            bound = _FLOOR_FACTOR * _float32_floor(dists, target, sizes, lam, reference)
        np.testing.assert_allclose(alpha[0] + alpha[7], combined, atol=bound)
        np.testing.assert_allclose(alpha[1:7], reference[1:7], atol=bound)
        if lam > 0:
            # KKT: equal gradients of identical rows give alpha_0 / n_0 = alpha_7 / n_7.
            # alpha_0 and alpha_7 each within `bound` put the share within 2 bound / combined.
            share = alpha[0] / (alpha[0] + alpha[7])
            np.testing.assert_allclose(
                share, sizes[0] / (sizes[0] + sizes[7]), atol=2 * bound / combined
            )


@pytest.mark.parametrize("seed", range(3))
def test_clients_missing_labels_match_reference(seed):
    rng = np.random.default_rng([18, seed])
    num_clients, num_classes = 8, 8
    dists = np.zeros((num_clients, num_classes))
    for i in range(num_clients):  # each client holds 2 or 3 of the 8 labels
        keep = rng.choice(num_classes, size=rng.integers(2, 4), replace=False)
        dists[i, keep] = rng.dirichlet(np.ones(keep.size))
    sizes = _random_sizes(rng, num_clients)
    assert (dists == 0).sum() >= num_clients * 5  # every client misses 5 or 6 labels
    for kind in ("random", "inside", "sparse"):
        target = _random_target(rng, dists, kind)
        for ratio in [0.0, 1e-2, 1.0]:
            lam = ratio * sizes.sum()
            alpha = fedpals_weights(dists, target, sizes, lam)
            _assert_on_simplex(alpha, num_clients)
            _assert_near_optimal(alpha, dists, target, sizes, lam, f"{kind}, lam/N={ratio}")


@pytest.mark.parametrize("seed", range(3))
def test_one_hot_target_matches_reference(seed):
    rng = np.random.default_rng([19, seed])
    dists = _random_dists(rng, 20, 5)
    sizes = _random_sizes(rng, 20)
    target = np.eye(5)[rng.integers(5)]
    for ratio in [0.0, 1e-2, 1.0]:
        lam = ratio * sizes.sum()
        alpha = fedpals_weights(dists, target, sizes, lam)
        _assert_on_simplex(alpha, 20)
        _assert_near_optimal(alpha, dists, target, sizes, lam, f"lam/N={ratio}")


def test_one_hot_target_held_by_one_client_gets_all_weight_at_lambda_zero():
    rng = np.random.default_rng(20)
    dists = _random_dists(rng, 20, 5, sparse=False, concentrations=(1.0,))
    dists[3] = np.eye(5)[2]  # client 3 holds only label 2; no other client is one-hot
    sizes = _random_sizes(rng, 20)
    alpha = fedpals_weights(dists, np.eye(5)[2], sizes, 0.0)
    np.testing.assert_allclose(alpha, np.eye(20)[3], atol=1e-5)
    assert float(projection_distance(dists, np.eye(5)[2])) < 1e-10


# ---------------------------------------------------------------------------
# Transformations.
# ---------------------------------------------------------------------------


def _problem_for_transforms():
    rng = np.random.default_rng(21)
    dists = _random_dists(rng, 8, 8)
    sizes = _random_sizes(rng, 8)
    return rng, dists, sizes


def test_vmap_over_lambda_matches_per_call():
    rng, dists, sizes = _problem_for_transforms()
    target = _random_target(rng, dists, "random")
    total = sizes.sum()
    lams = np.array([0.0, 1e-2 * total, 1e-1 * total, total, 10 * total, np.inf])
    batched = np.asarray(
        jax.vmap(lambda lam: fedpals_weights(dists, target, sizes, lam))(
            jnp.asarray(lams, jnp.float32)
        )
    )
    assert batched.shape == (lams.size, 8)
    for row, lam in zip(batched, lams):
        single = np.asarray(fedpals_weights(dists, target, sizes, lam))
        # An iterative float32 solve: batched and single runs round differently.
        np.testing.assert_allclose(row, single, atol=1e-4, err_msg=f"lam={lam}")
        if np.isfinite(lam):
            np.testing.assert_allclose(
                _objective(row, dists, target, sizes, lam),
                _objective(single, dists, target, sizes, lam),
                rtol=1e-6,
                atol=1e-8,
            )
    np.testing.assert_array_equal(batched[-1], np.asarray(fedavg_weights(sizes)))
    assert np.abs(batched[0] - batched[-1]).max() > 0.05  # the batch really varies with lam


def test_vmap_over_targets_matches_per_call():
    rng, dists, sizes = _problem_for_transforms()
    targets = np.stack(
        [
            _random_target(rng, dists, kind)
            for kind in ("random", "inside", "sparse", "random", "sparse")
        ]
    )
    lam = 0.1 * sizes.sum()
    batched = np.asarray(
        jax.vmap(lambda t: fedpals_weights(dists, t, sizes, lam))(jnp.asarray(targets, jnp.float32))
    )
    for row, target in zip(batched, targets):
        np.testing.assert_allclose(row, fedpals_weights(dists, target, sizes, lam), atol=1e-5)
        _assert_near_optimal(row, dists, target, sizes, lam, "vmapped target")
    assert np.abs(batched - batched[0]).max() > 0.01


def test_jit_matches_eager():
    rng, dists, sizes = _problem_for_transforms()
    target = _random_target(rng, dists, "random")
    lam = 0.05 * sizes.sum()
    jitted = jax.jit(fedpals_weights)(dists, target, sizes, lam)
    np.testing.assert_allclose(jitted, fedpals_weights(dists, target, sizes, lam), atol=1e-6)
    _assert_near_optimal(jitted, dists, target, sizes, lam, "jit")
    alpha = rng.dirichlet(np.ones(8))
    np.testing.assert_allclose(
        jax.jit(effective_sample_size)(alpha, sizes), _ess(alpha, sizes), rtol=1e-5
    )
    np.testing.assert_allclose(
        jax.jit(projection_distance)(dists, target),
        _objective(_reference_weights(dists, target, sizes, 0.0), dists, target, sizes, 0.0),
        rtol=1e-5,
        atol=1e-7,
    )


# ---------------------------------------------------------------------------
# Effective sample size.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_effective_sample_size_matches_formula(seed):
    rng = np.random.default_rng([22, seed])
    sizes = _random_sizes(rng, 7)
    alphas = list(rng.dirichlet(np.full(7, 0.3), size=4)) + list(rng.dirichlet(np.ones(7), size=4))
    for alpha in alphas:
        np.testing.assert_allclose(
            float(effective_sample_size(alpha, sizes)), 1.0 / np.sum(alpha**2 / sizes), rtol=1e-5
        )


def test_fedavg_has_ess_n():
    sizes = np.array([3.0, 1200.0, 57.0, 800.0, 9.0])
    np.testing.assert_allclose(
        float(effective_sample_size(fedavg_weights(sizes), sizes)), sizes.sum(), rtol=1e-5
    )
    np.testing.assert_allclose(fedavg_weights(sizes), sizes / sizes.sum(), rtol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_ess_never_exceeds_total_sample_size(seed):
    rng = np.random.default_rng([23, seed])
    sizes = _random_sizes(rng, 9)
    total = sizes.sum()
    for concentration in [0.05, 0.5, 5.0, 500.0]:
        for alpha in rng.dirichlet(np.full(9, concentration), size=10):
            assert float(effective_sample_size(alpha, sizes)) <= total * (1 + 1e-6)
    for i in range(9):  # a vertex gives that client's size
        np.testing.assert_allclose(
            float(effective_sample_size(np.eye(9)[i], sizes)), sizes[i], rtol=1e-6
        )


def test_ess_grows_with_lambda():
    # The regulariser 1/ESS never grows with its weight along the path.
    rng = np.random.default_rng(24)
    dists = _random_dists(rng, 3, 10, sparse=False)
    target = _random_target(rng, dists, "sparse")
    sizes = _random_sizes(rng, 3)
    total = sizes.sum()
    grid = total * np.logspace(-4, 3, 15)
    ess = np.array([_ess(fedpals_weights(dists, target, sizes, lam), sizes) for lam in grid])
    assert np.all(np.diff(ess) >= -1e-5 * total)
    assert ess[-1] - ess[0] > 0.1 * total


# ---------------------------------------------------------------------------
# lambda_for_ess.
# ---------------------------------------------------------------------------


def _problem_with_unique_solution(rng, num_clients, num_classes):
    """alpha^0 is unique: S has full row rank (M <= K), or T is outside Conv(S) (M > K)."""
    dists = _random_dists(rng, num_clients, num_classes, sparse=False, concentrations=(1.0, 3.0))
    sizes = _random_sizes(rng, num_clients)
    if num_clients <= num_classes:
        assert np.linalg.matrix_rank(dists) == num_clients
        target = _random_target(rng, dists, "random")
    else:
        target = _random_target(rng, dists, "sparse")
        distance = _objective(
            _reference_weights(dists, target, sizes, 0.0), dists, target, sizes, 0.0
        )
        assert distance > 1e-3
    return dists, target, sizes


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_clients,num_classes", [(3, 10), (20, 5)])
def test_lambda_for_ess_hits_requested_fraction(num_clients, num_classes, seed):
    rng = np.random.default_rng([25, num_clients, seed])
    dists, target, sizes = _problem_with_unique_solution(rng, num_clients, num_classes)
    total = sizes.sum()
    lowest = _ess(_reference_weights(dists, target, sizes, 0.0), sizes) / total
    assert lowest < 0.9
    lams = []
    for q in [0.02, 0.25, 0.5, 0.75, 0.98]:
        fraction = lowest + q * (1.0 - lowest)
        lam = float(lambda_for_ess(dists, target, sizes, fraction))
        assert 0.0 < lam < np.inf
        achieved = _ess(fedpals_weights(dists, target, sizes, lam), sizes) / total
        achieved_reference = _ess(_reference_weights(dists, target, sizes, lam), sizes) / total
        assert abs(achieved - fraction) <= 1e-3, (fraction, lam, achieved)
        assert abs(achieved_reference - fraction) <= 1e-3, (fraction, lam, achieved_reference)
        lams.append(lam)
    assert np.all(np.diff(lams) > 0)


def test_lambda_for_ess_increases_with_fraction():
    rng = np.random.default_rng(26)
    dists, target, sizes = _problem_with_unique_solution(rng, 3, 10)
    lowest = _ess(_reference_weights(dists, target, sizes, 0.0), sizes) / sizes.sum()
    fractions = lowest + (1.0 - lowest) * np.linspace(0.05, 0.95, 10)
    lams = np.array([float(lambda_for_ess(dists, target, sizes, f)) for f in fractions])
    assert np.all(np.diff(lams) > 0), lams


def test_lambda_for_ess_endpoints():
    rng = np.random.default_rng(27)
    dists, target, sizes = _problem_with_unique_solution(rng, 3, 10)
    assert float(lambda_for_ess(dists, target, sizes, 1.0)) == np.inf
    # The lowest reachable fraction is the one of lam = 0.
    lowest = _ess(fedpals_weights(dists, target, sizes, 0.0), sizes) / sizes.sum()
    assert float(lambda_for_ess(dists, target, sizes, lowest)) == 0.0


def test_lambda_for_ess_rejects_unreachable_fraction_and_names_range():
    rng = np.random.default_rng(28)
    dists, target, _ = _problem_with_unique_solution(rng, 3, 10)
    sizes = np.array([300.0, 100.0, 200.0])
    lowest = _ess(_reference_weights(dists, target, sizes, 0.0), sizes) / sizes.sum()
    # In (0, 1] and above min_i n_i / N = 1/6, so only a solve can tell it is out of reach.
    fraction = 0.5 * lowest
    assert 1 / 6 < fraction < lowest - 0.1
    with pytest.raises(ValueError, match="ESS fraction .* is out of range") as info:
        lambda_for_ess(dists, target, sizes, fraction)
    reachable = re.search(r"\[([-+0-9.eE]+), 1\]", str(info.value))
    assert reachable, str(info.value)
    np.testing.assert_allclose(float(reachable.group(1)), lowest, atol=1e-3)


@pytest.fixture
def no_solves(monkeypatch):
    """Makes any solve of eq. 8 fail the test: what is checked must be checked before solving."""

    def solve(*args, **kwargs):
        raise AssertionError("eq. 8 was solved before the input was rejected")

    monkeypatch.setattr(server_weights, "_solve_fedpals", solve)
    monkeypatch.setattr(server_weights, "_lambda_for_ess", solve)


@pytest.mark.parametrize("fraction", [1.5, 1.0 + 1e-3, 0.0, -0.25, np.nan, np.inf, -np.inf])
def test_lambda_for_ess_rejects_fraction_outside_unit_interval_before_solving(fraction, no_solves):
    dists, target, sizes = _valid_problem()
    message = r"ESS fraction .* is out of range: it must be in \(0, 1\]"
    with pytest.raises(ValueError, match=message):
        lambda_for_ess(dists, target, sizes, fraction)


@pytest.mark.parametrize("fraction", [np.array([0.5, 0.6]), "half", True, None])
def test_lambda_for_ess_rejects_fraction_that_is_not_a_real_scalar(fraction, no_solves):
    dists, target, sizes = _valid_problem()
    with pytest.raises(TypeError, match="ESS fraction must be a real scalar in"):
        lambda_for_ess(dists, target, sizes, fraction)


def test_lambda_for_ess_rejects_fraction_below_smallest_client_before_solving(no_solves):
    # ESS(alpha) >= min_i n_i for every alpha on the simplex: 5 / 75 here.
    dists, target, sizes = _valid_problem()
    with pytest.raises(ValueError, match=r"ESS >= min_i n_i = 5, i\.e\. fraction >= 0\.0666667"):
        lambda_for_ess(dists, target, sizes, 0.05)


def test_lambda_for_ess_of_fraction_one_is_fedavg_without_solving(no_solves):
    dists, target, sizes = _valid_problem()
    assert float(lambda_for_ess(dists, target, sizes, 1.0)) == np.inf
    assert float(lambda_for_ess(dists, target, sizes, 1)) == np.inf


def test_lambda_for_ess_with_covered_target_and_more_clients_than_classes():
    rng = np.random.default_rng(0)
    num_clients, num_classes = 20, 5
    dists = rng.dirichlet(np.full(num_classes, 2.0), size=num_clients)
    target = rng.dirichlet(np.ones(num_clients)) @ dists
    sizes = rng.integers(5, 2000, size=num_clients).astype(np.float64)
    total = sizes.sum()
    lowest_reported = _ess(fedpals_weights(dists, target, sizes, 0.0), sizes) / total
    # ESS of lim lam->0+ alpha^lam, the lower end of what lam > 0 can reach.
    lowest_limit = _ess(_reference_weights(dists, target, sizes, 1e-9 * total), sizes) / total
    if lowest_limit <= lowest_reported + 1e-3:
        return  # lam = 0 already gives the max-ESS combination: no unreachable gap
    fraction = 0.5 * (lowest_reported + lowest_limit)
    try:
        lam = float(lambda_for_ess(dists, target, sizes, fraction))
    except ValueError:
        return  # reporting the fraction as unreachable is correct
    achieved = _ess(_reference_weights(dists, target, sizes, lam), sizes) / total
    assert abs(achieved - fraction) <= 1e-3, (fraction, lam, achieved)


# ---------------------------------------------------------------------------
# Projection distance.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_clients,num_classes", [(3, 10), (20, 5), (50, 10)])
def test_projection_distance_matches_reference(num_clients, num_classes, seed):
    rng = np.random.default_rng([29, num_clients, seed])
    ones = np.ones(num_clients)
    sparse_dists = _random_dists(rng, num_clients, num_classes)
    dense_dists = _random_dists(rng, num_clients, num_classes, sparse=False, concentrations=(3.0,))
    for dists, kind in [
        (sparse_dists, "random"),
        (sparse_dists, "sparse"),
        (dense_dists, "sparse"),
    ]:
        target = _random_target(rng, dists, kind)
        expected = _objective(
            _reference_weights(dists, target, ones, 0.0), dists, target, ones, 0.0
        )
        value = float(projection_distance(dists, target))
        assert abs(value - expected) <= 1e-6 * max(1.0, expected), (value, expected)
    assert expected > 1e-3  # the last target is well outside the hull of dense clients


@pytest.mark.parametrize("seed", range(3))
def test_projection_distance_is_zero_inside_hull(seed):
    rng = np.random.default_rng([30, seed])
    for num_clients, num_classes in [(3, 10), (20, 5)]:
        dists = _random_dists(rng, num_clients, num_classes)
        for target in [
            rng.dirichlet(np.ones(num_clients)) @ dists,
            dists[rng.integers(num_clients)],
            dists.mean(axis=0),
        ]:
            assert float(projection_distance(dists, target)) < 1e-8
        dense = _random_dists(rng, num_clients, num_classes, sparse=False, concentrations=(3.0,))
        assert float(projection_distance(dense, _random_target(rng, dense, "sparse"))) > 1e-4


# ---------------------------------------------------------------------------
# Many clients: the dual Newton / face-step solver against the float64 reference.
# ---------------------------------------------------------------------------


def _edge_problem(case, rng):
    num_classes = 10
    if case == "many clients, sparse":
        dists = _random_dists(rng, 200, num_classes)
        sizes = _random_sizes(rng, 200)
        return dists, _random_target(rng, dists, "random"), sizes
    if case == "many clients, target inside the hull":
        dists = _random_dists(rng, 200, num_classes, sparse=False, concentrations=(0.5,))
        sizes = _random_sizes(rng, 200)
        return dists, _random_target(rng, dists, "inside"), sizes
    if case == "sizes 1 to 1e6":
        dists = _random_dists(rng, 120, num_classes)
        sizes = np.round(np.exp(rng.uniform(0, np.log(1e6), 120)))
        return dists, _random_target(rng, dists, "sparse"), sizes
    if case == "target at a vertex":
        dists = _random_dists(rng, 150, num_classes, sparse=False)
        sizes = _random_sizes(rng, 150)
        return dists, np.eye(num_classes)[3], sizes
    if case == "target is a client":
        dists = _random_dists(rng, 150, num_classes)
        sizes = _random_sizes(rng, 150)
        return dists, dists[17].copy(), sizes
    if case == "duplicated clients":
        distinct = _random_dists(rng, 60, num_classes)
        dists = np.vstack([distinct, distinct[:30], distinct[:10]])
        sizes = _random_sizes(rng, 100)
        return dists, _random_target(rng, distinct, "random"), sizes
    if case == "one client":
        dists = _random_dists(rng, 1, num_classes)
        return dists, _random_target(rng, dists, "random"), np.array([12.0])
    raise ValueError(case)


_EDGE_CASES = [
    "many clients, sparse",
    "many clients, target inside the hull",
    "sizes 1 to 1e6",
    "target at a vertex",
    "target is a client",
    "duplicated clients",
    "one client",
]


@pytest.mark.parametrize("case", _EDGE_CASES)
def test_weights_on_larger_and_edge_problems_reach_reference_optimum(case):
    # Fresh random inputs each run: the solver must not depend on lucky seeds.
    rng = np.random.default_rng()
    dists, target, sizes = _edge_problem(case, rng)
    total = sizes.sum()
    for ratio in [0.0, 1e-6, 1e-3, 1e-1, 10.0]:
        lam = ratio * total
        alpha = np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64)
        _assert_on_simplex(alpha, len(sizes))
        _assert_near_optimal(alpha, dists, target, sizes, lam, f"{case}, lam/N={ratio}")
    # Huge lam (the reference's NNLS support guess breaks down there): FedAvg (Prop. 2).
    alpha = fedpals_weights(dists, target, sizes, 1e6 * total)
    np.testing.assert_allclose(alpha, sizes / total, atol=1e-4)
    if case == "target is a client":  # lam = 0 matches the target, to float32's certificate
        alpha = fedpals_weights(dists, target, sizes, 0.0)
        objective = _objective(alpha, dists, target, sizes, 0.0)
        assert objective <= _certified_objective_bound(alpha, dists, target)


def _certified_objective_bound(alpha, dists, target):
    """How far above f* = 0 a lam = 0 answer may be when T is a client's S_i.

    fedpals_weights returns alpha once its KKT gaps g_j - mu (g = -S r, r = T - S^T alpha,
    mu = alpha^T g) are within the float32 rounding of g, slack = 32 eps (||T|| +
    ||S^T alpha|| + ||S r||_inf + |mu|). The objective is convex, so f(alpha) - f* is at most
    the Frank-Wolfe gap 2 (mu - min_j g_j) <= 2 slack. (A fixed 1e-10 failed on 6 % of fresh
    draws, up to 1.7e-7; over 300 draws f(alpha) stayed below 0.033 of this bound.)
    """
    alpha, dists, target = (np.asarray(a, np.float64) for a in (alpha, dists, target))
    aggregate = alpha @ dists
    correlation = dists @ (target - aggregate)
    multiplier = -alpha @ correlation
    scale = np.linalg.norm(target) + np.linalg.norm(aggregate)
    scale += np.abs(correlation).max() + abs(multiplier)
    return 2 * 32 * float(np.finfo(np.float32).eps) * scale


@pytest.mark.parametrize(
    "case, seed",
    [
        ("sizes 1 to 1e6", 46),
        ("sizes 1 to 1e6", 62),
        ("target at a vertex", 101),
        ("sizes 1 to 1e6", 134),
        ("sizes 1 to 1e6", 179),
        ("sizes 1 to 1e6", 180),
    ],
)
def test_lambda_zero_draws_whose_first_face_stalls_are_solved_by_the_restart(case, seed):
    # Draws on which the active set from the dual's face ended uncertified (objective gaps
    # 1.4e-4, 1.5e-4 and 1.2e-2): the restart from FedAvg's full face reaches the optimum.
    # On the last three (gaps 5.0e-6, 1.4e-4 and 5.7e-5; one failed a CI run) the restart
    # with the sizes' scaling ended uncertified too: at lam = 0 it steps with unit sizes.
    dists, target, sizes = _edge_problem(case, np.random.default_rng(seed))
    alpha = np.asarray(fedpals_weights(dists, target, sizes, 0.0), np.float64)
    _assert_near_optimal(alpha, dists, target, sizes, 0.0, f"{case}, seed {seed}")


@pytest.mark.parametrize("ratio", [1e-12, 1e-9])
def test_lambda_below_the_dual_range_is_not_far_from_optimal(ratio):
    # 0 < lam < 1e-6 N, below LOG10_LAM_RANGE: the dual's Newton steps and the face step's
    # 1 / lam were ill-conditioned there (gaps 0.08 and 0.12 on these draws). Not yet to
    # 1e-6 on every draw (sizes spanning 1e6 can stay 4e-5 above): the bound here is 1e-4.
    draws = [("duplicated clients", 16), ("many clients, sparse", 1), ("sizes 1 to 1e6", 1)]
    for case, seed in draws:
        dists, target, sizes = _edge_problem(case, np.random.default_rng(seed))
        lam = ratio * sizes.sum()
        alpha = np.clip(np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64), 0, None)
        reference = _reference_weights(dists, target, sizes, lam)
        f_star = _objective(reference, dists, target, sizes, lam)
        gap = _objective(alpha / alpha.sum(), dists, target, sizes, lam) - f_star
        assert gap <= 1e-4 * max(1.0, f_star), (case, ratio, gap)


def test_lambda_zero_in_the_hull_returns_nearly_the_largest_ess_minimiser():
    # M > K with T in Conv(S): many minimisers; the one returned is (within a few % of ESS)
    # the lam -> 0+ limit, the largest-ESS one (App. B.2), not an arbitrary one.
    rng = np.random.default_rng(5)
    # M = 200, K = 10: the shape of the edge problems (one compiled solver for both).
    dists = _random_dists(rng, 200, 10, sparse=False, concentrations=(1.0,))
    sizes = _random_sizes(rng, 200)
    target = _random_target(rng, dists, "inside")
    alpha = fedpals_weights(dists, target, sizes, 0.0)
    assert _objective(alpha, dists, target, sizes, 0.0) < 1e-10
    limit = _reference_weights(dists, target, sizes, 1e-9 * sizes.sum())
    assert _ess(alpha, sizes) >= 0.97 * _ess(limit, sizes), (_ess(alpha, sizes), _ess(limit, sizes))


def test_vmap_over_runs_of_many_clients_matches_per_call():
    rng = np.random.default_rng(6)
    # 200 clients: the single solves share the edge problems' programs.
    problems = [
        (_random_dists(rng, 200, 10), None, _random_sizes(rng, 200)) for _ in range(3)
    ]
    dists = np.stack([p[0] for p in problems])
    sizes = np.stack([p[2] for p in problems])
    targets = np.stack([_random_target(rng, d, "random") for d in dists])
    lams = np.array([0.0, 1e-3, 1.0]) * sizes.sum(axis=1)
    batched = np.asarray(jax.jit(jax.vmap(fedpals_weights))(dists, targets, sizes, lams))
    for b in range(3):
        _assert_near_optimal(batched[b], dists[b], targets[b], sizes[b], lams[b], f"run {b}")
        single = np.asarray(fedpals_weights(dists[b], targets[b], sizes[b], lams[b]))
        np.testing.assert_allclose(
            _objective(batched[b], dists[b], targets[b], sizes[b], lams[b]),
            _objective(single, dists[b], targets[b], sizes[b], lams[b]),
            rtol=1e-6,
            atol=1e-9,
        )


# ---------------------------------------------------------------------------
# Proposition 1: omega-weighted client SGD steps equal the target SGD step.
# ---------------------------------------------------------------------------


def test_target_weights_turn_client_steps_into_the_target_step():
    rng = np.random.default_rng(31)
    num_classes, dim = 4, 3
    # Class pools shared by every client and the target (Assumption 1: equal p(X | Y)).
    pool_sizes = [3, 5, 2, 4]
    means = rng.normal(scale=2.0, size=(num_classes, dim))
    pools = [means[k] + rng.normal(size=(pool_sizes[k], dim)) for k in range(num_classes)]
    # Client i holds replications[i, k] copies of pool k; the target holds copies[i] copies of
    # every client's data, so T = sum_i omega_i S_i exactly with omega_i = c_i n_i / sum_j c_j n_j.
    replications = np.array([[2, 1, 0, 1], [0, 1, 3, 1], [1, 0, 1, 2]])
    copies = np.array([1, 3, 2])

    def build(reps):
        x = np.concatenate([np.tile(pools[k], (r, 1)) for k, r in enumerate(reps) if r])
        y = np.concatenate([np.full(r * pool_sizes[k], k) for k, r in enumerate(reps) if r])
        return jnp.asarray(x, jnp.float32), jnp.asarray(y)

    clients = [build(reps) for reps in replications]
    target_data = build(copies @ replications)
    dists = np.stack(
        [np.bincount(np.asarray(y), minlength=num_classes) / y.size for _, y in clients]
    )
    target = np.bincount(np.asarray(target_data[1]), minlength=num_classes) / target_data[1].size
    sizes = np.array([y.size for _, y in clients], np.float64)
    omega = copies * sizes / (copies @ sizes)
    np.testing.assert_allclose(omega @ dists, target, atol=1e-12)
    assert np.linalg.matrix_rank(dists) == 3  # omega is the unique satisfying combination

    weights = np.asarray(fedpals_weights(dists, target, sizes, 0.0), np.float64)
    np.testing.assert_allclose(weights, omega, atol=1e-4)
    fedavg = sizes / sizes.sum()
    assert np.abs(fedavg - omega).max() > 0.05

    params = {
        "w": jnp.asarray(rng.normal(scale=0.3, size=(dim, num_classes)), jnp.float32),
        "b": jnp.asarray(rng.normal(scale=0.3, size=num_classes), jnp.float32),
    }

    def risk(p, x, y):  # empirical softmax cross-entropy of a logistic-regression model
        log_probs = jax.nn.log_softmax(x @ p["w"] + p["b"])
        return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))

    learning_rate = 0.5

    @jax.jit
    def full_batch_step(x, y):
        grads = jax.grad(risk)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)

    def to_numpy(tree):
        return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float64), tree)

    client_params = [to_numpy(full_batch_step(x, y)) for x, y in clients]
    target_params = to_numpy(full_batch_step(*target_data))

    def aggregate(alpha):  # theta_{t+1} = sum_i alpha_i theta_{i,t}
        return jax.tree_util.tree_map(
            lambda *leaves: sum(a * leaf for a, leaf in zip(alpha, leaves)), *client_params
        )

    aggregated = aggregate(weights)
    for key in params:
        np.testing.assert_allclose(aggregated[key], target_params[key], atol=1e-5)
    # FedAvg weights do not give the target step.
    fedavg_params = aggregate(fedavg)
    difference = max(np.abs(fedavg_params[key] - target_params[key]).max() for key in params)
    assert difference > 1e-3, difference


# ---------------------------------------------------------------------------
# Input validation.
# ---------------------------------------------------------------------------


def _valid_problem():
    dists = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0], [0.3, 0.3, 0.4]])
    target = np.array([0.2, 0.5, 0.3])
    sizes = np.array([10.0, 20.0, 5.0, 40.0])
    return dists, target, sizes


def _with(array, index, value):
    array = np.array(array, np.float64)
    array[index] = value
    return array


def _bad_inputs():
    dists, target, sizes = _valid_problem()
    return {
        "S_negative": (
            dict(dists=_with(dists, 0, [1.1, -0.1, 0.0])),
            "client_label_dists contains negative",
        ),
        "S_nan": (dict(dists=_with(dists, (1, 0), np.nan)), "client_label_dists contains NaN"),
        "S_inf": (dict(dists=_with(dists, (2, 1), np.inf)), "client_label_dists contains infinite"),
        "S_row_sum": (
            dict(dists=_with(dists, 3, [0.3, 0.3, 0.401])),
            r"every row of client_label_dists must sum to 1.*rows \[3\]",
        ),
        "T_negative": (
            dict(target=np.array([1.2, -0.2, 0.0])),
            "target_label_dist contains negative",
        ),
        "T_nan": (dict(target=_with(target, 0, np.nan)), "target_label_dist contains NaN"),
        "T_inf": (dict(target=_with(target, 2, np.inf)), "target_label_dist contains infinite"),
        "T_sum": (dict(target=np.array([0.2, 0.5, 0.301])), "target_label_dist must sum to 1"),
        "K_mismatch": (dict(target=np.array([0.2, 0.5, 0.2, 0.1])), "number of classes K differs"),
    }


def _bad_sizes():
    _, _, sizes = _valid_problem()
    return {
        "n_zero": (_with(sizes, 1, 0.0), "client size n_i must be > 0"),
        "n_negative": (_with(sizes, 2, -5.0), "client size n_i must be > 0"),
        "n_nan": (_with(sizes, 0, np.nan), "client_sizes contains NaN"),
        "n_count": (sizes[:3], "client_sizes has 3 entries but there are 4 clients"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_distributions_raise(case):
    dists, target, sizes = _valid_problem()
    overrides, message = _bad_inputs()[case]
    dists = overrides.get("dists", dists)
    target = overrides.get("target", target)
    with pytest.raises(ValueError, match=message):
        fedpals_weights(dists, target, sizes, 1.0)
    with pytest.raises(ValueError, match=message):
        projection_distance(dists, target)
    with pytest.raises(ValueError, match=message):
        lambda_for_ess(dists, target, sizes, 0.9)


@pytest.mark.parametrize("case", list(_bad_sizes()))
def test_bad_client_sizes_raise(case):
    dists, target, _ = _valid_problem()
    sizes, message = _bad_sizes()[case]
    with pytest.raises(ValueError, match=message):
        fedpals_weights(dists, target, sizes, 1.0)
    with pytest.raises(ValueError, match=message):
        lambda_for_ess(dists, target, sizes, 0.9)
    if case != "n_count":
        with pytest.raises(ValueError, match=message):
            fedavg_weights(sizes)


@pytest.mark.parametrize(
    "lam,message",
    [
        (-1.0, "lam must be >= 0"),
        (-np.inf, "lam must be >= 0"),
        (np.nan, "lam is NaN"),
        (None, "lam must be a real number, got None"),
        ("1.0", "lam must be a real number, got '1.0'"),
        (True, "lam must be a real number, got True"),
        ([1.0, "a"], "lam must be a real number"),
    ],
)
def test_bad_lambda_raises(lam, message):
    dists, target, sizes = _valid_problem()
    with pytest.raises(ValueError, match=message):
        fedpals_weights(dists, target, sizes, lam)


def test_ess_shape_mismatch_raises():
    with pytest.raises(ValueError, match="alpha has shape"):
        effective_sample_size(np.array([0.5, 0.5]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="client size n_i must be > 0"):
        effective_sample_size(np.array([0.5, 0.5]), np.array([1.0, 0.0]))


@pytest.mark.parametrize(
    "alpha,message",
    [
        ([0.5, np.nan], "alpha contains NaN"),
        ([np.inf, 0.5], "alpha contains infinite"),
        ([1.2, -0.2], "alpha contains negative"),
        ([0.0, 0.0], "alpha is all zeros"),
    ],
)
def test_ess_rejects_weights_that_are_not_weights(alpha, message):
    with pytest.raises(ValueError, match=message):
        effective_sample_size(np.array(alpha), np.array([10.0, 20.0]))


@pytest.mark.parametrize(
    "settings,error,message",
    [
        (dict(max_iter=0), ValueError, "max_iter must be an integer >= 1, got 0"),
        (dict(max_iter=-5), ValueError, "max_iter must be an integer >= 1, got -5"),
        (dict(max_iter=2.5), TypeError, "max_iter must be an integer >= 1, got 2.5"),
        (dict(max_iter=True), TypeError, "max_iter must be an integer >= 1, got True"),
        (dict(max_iter="100"), TypeError, "max_iter must be an integer >= 1"),
        (dict(tol=0.0), ValueError, "tol must be a finite number > 0, got 0.0"),
        (dict(tol=-1e-6), ValueError, "tol must be a finite number > 0, got -1e-06"),
        (dict(tol=np.nan), ValueError, "tol must be a finite number > 0, got nan"),
        (dict(tol=np.inf), ValueError, "tol must be a finite number > 0, got inf"),
        (dict(tol="1e-7"), TypeError, "tol must be a finite number > 0"),
    ],
)
def test_bad_solver_settings_raise_before_solving(settings, error, message, no_solves):
    dists, target, sizes = _valid_problem()
    with pytest.raises(error, match=message):
        fedpals_weights(dists, target, sizes, 1.0, **settings)
    # Static under jit, so checked even when the data are traced.
    with pytest.raises(error, match=message):
        jax.jit(lambda d: fedpals_weights(d, target, sizes, 1.0, **settings))(dists)


def test_integer_solver_settings_of_numpy_types_are_accepted():
    dists, target, sizes = _valid_problem()
    alpha = fedpals_weights(
        dists, target, sizes, 1.0, max_iter=np.int64(5000), tol=np.float32(1e-7)
    )
    np.testing.assert_allclose(alpha, fedpals_weights(dists, target, sizes, 1.0), atol=1e-6)


def test_valid_problem_is_accepted():
    # The bad-input cases above differ from this one in a single entry.
    dists, target, sizes = _valid_problem()
    _assert_on_simplex(fedpals_weights(dists, target, sizes, 1.0), 4)
    assert float(projection_distance(dists, target)) >= 0.0
    assert 0.0 < float(lambda_for_ess(dists, target, sizes, 0.9)) < np.inf


# -- d alpha / d lambda (implicit differentiation) ------------------------------------------


def _finite_difference_derivative(dists, target, sizes, lam):
    """Central difference of the float64 reference minimiser, in log lam (step 1e-5)."""
    h = 1e-5
    up = _reference_weights(dists, target, sizes, lam * np.exp(h))
    down = _reference_weights(dists, target, sizes, lam * np.exp(-h))
    return (up - down) / (2 * h * lam)


# (M, K) of the random problems below: shapes other tests here solve too (in float32), so that
# each seed compiles no float32 solver of its own (a solver program compiles in 3-8 s).
_DERIVATIVE_SHAPES = [(5, 4), (4, 3), (3, 4), (2, 2)]


@pytest.mark.parametrize("seed", range(6))
def test_lam_derivative_matches_float64_finite_differences(seed):
    rng = np.random.default_rng([seed, 0xD1A])
    num_clients, num_classes = _DERIVATIVE_SHAPES[seed % len(_DERIVATIVE_SHAPES)]
    dists = _random_dists(rng, num_clients, num_classes)
    target = _random_target(rng, dists, "random")
    sizes = _random_sizes(rng, num_clients)
    for lam in np.sum(sizes) * 10.0 ** rng.uniform(-5, 1, size=3):
        reference = _finite_difference_derivative(dists, target, sizes, lam)
        with jax.enable_x64(True):
            derivative = np.asarray(fedpals_lam_derivative(dists, target, sizes, lam))
        scale = np.abs(reference).max() + 1e-300
        # The difference quotient's own error is O(h^2) relative, plus the reference's
        # rounding (~1e-11 in alpha) over the step 2 h lam: 1e-6 / lam absolute.
        error = np.abs(derivative - reference).max()
        assert error <= 1e-4 * scale + 1e-6 / lam, (lam, derivative, reference)
        assert abs(derivative.sum()) <= 1e-12 * (scale + 1e-6 / lam)  # weight moves, sum stays 1
        # Float32, the engine's precision: float32's floor on the solve, amplified by the
        # face's conditioning (relative; these problems stay below 1e-2).
        derivative32 = np.asarray(fedpals_lam_derivative(dists, target, sizes, lam))
        assert np.abs(derivative32 - reference).max() <= 1e-2 * scale + 1e-5 / lam


def test_lam_derivative_is_zero_where_alpha_does_not_depend_on_lam():
    rng = np.random.default_rng(7)
    dists = _random_dists(rng, 5, 4, sparse=False)
    sizes = _random_sizes(rng, 5)
    aggregate = sizes @ dists / sizes.sum()  # FedAvg's weights are optimal for every lam
    np.testing.assert_allclose(
        fedpals_lam_derivative(dists, aggregate, sizes, 3.0), np.zeros(5), atol=1e-6
    )
    # One client: all its weight for every lam.
    assert float(fedpals_lam_derivative(dists[:1], dists[0], sizes[:1], 2.0)[0]) == 0.0


def test_lam_derivative_moves_weight_toward_fedavg():
    # Larger lam pulls alpha toward n / N (Proposition 2): the derivative points there.
    dists = np.array([[1.0, 0.0], [0.0, 1.0]])
    target = np.array([0.9, 0.1])
    sizes = np.array([100.0, 300.0])
    lam = 50.0
    derivative = np.asarray(fedpals_lam_derivative(dists, target, sizes, lam))
    alpha = np.asarray(fedpals_weights(dists, target, sizes, lam))
    fedavg = sizes / sizes.sum()
    assert np.all(np.sign(derivative) == np.sign(fedavg - alpha))


def test_lam_derivative_rejects_lam_zero_and_bad_data():
    dists, target, sizes = np.eye(3), np.full(3, 1 / 3), np.ones(3)
    with pytest.raises(ValueError, match="lam must be > 0"):
        fedpals_lam_derivative(dists, target, sizes, 0.0)
    with pytest.raises(ValueError):
        fedpals_lam_derivative(dists, target, -sizes, 1.0)


# ---------------------------------------------------------------------------
# The design card's solver: fedpals_weights(..., solver="projected_gradient").
# ---------------------------------------------------------------------------


def _face_singular_values(dists, sizes, lam, face):
    """(sigma_min, sigma_max) of B = [S_A^T; sqrt(lam) N_A^(-1/2)] on the sum-zero directions of
    the face A (`_float32_floor`); sigma_min 0 where the face has a flat direction."""
    matrix = dists[face].T
    if lam > 0:
        matrix = np.vstack([matrix, np.diag(np.sqrt(lam / sizes[face]))])
    singular_values = np.linalg.svd(matrix @ _sum_zero_basis(face.sum()), compute_uv=False)
    low, high = singular_values.min(), singular_values.max()
    return (0.0 if low <= 1e-9 * high else low), high


def _gradient_floor(dists, target, sizes, lam, reference):
    """How far float32 rounding alone can put a gradient method's answer from `reference`.

    Projected gradient stops where its projected step is 0 to rounding. On the face A of the
    minimiser its gradient is 2 B^T (B alpha - b) (B, b as in `_float32_floor`), and the
    residual B alpha - b carries rounding of about eps * scale per entry, so the gradient
    carries about ||B Z|| eps * scale, Z the sum-zero directions of A. A gradient error dg
    moves the point where it vanishes by ||dg|| / (2 sigma_min^2), 2 sigma_min^2 the smallest
    eigenvalue of the Hessian 2 Z^T B^T B Z. Hence eps (1 + scale sigma_max / sigma_min^2):
    `_float32_floor`'s eps scale / sigma_min times the face's condition number sigma_max /
    sigma_min, which a method that works with B^T B (the normal equations) squares (Golub &
    Van Loan, Matrix Computations, Sec. 5.3.7). Infinite on a flat face.
    """
    dists, target, sizes, reference = (
        np.asarray(a, np.float64) for a in (dists, target, sizes, reference)
    )
    face = reference > 0
    scale = _objective_scale(dists, target, sizes, lam, reference)
    if face.sum() == 1:
        return _EPS32
    low, high = _face_singular_values(dists, sizes, lam, face)
    return _EPS32 * (1.0 + scale * high / low**2) if low > 0 else np.inf


def _objective_scale(dists, target, sizes, lam, alpha):
    """||T|| + ||alpha^T S|| + sqrt(lam sum_i alpha_i^2 / n_i): the size of eq. 8's terms, so
    that float32 evaluates the objective to about eps * scale^2."""
    alpha = np.asarray(alpha, np.float64)
    return (
        np.linalg.norm(target)
        + np.linalg.norm(alpha @ np.asarray(dists, np.float64))
        + np.sqrt(lam * np.sum(alpha**2 / np.asarray(sizes, np.float64)))
    )


# Allowed error of projected gradient's alpha, in units of _gradient_floor. The largest seen
# over the solves below is 0.5 (lam = 1e-3 N), 3.3 (lam = N) and 6.1 (lam = 1e3 N); on another
# problem at lam = 1e3 N it stays at 8.7 even after 10^5 steps: what is left there is rounding.
# Their objectives differ by at most 5e-3 eps scale^2 (the bound is eps scale^2).
_GRADIENT_FLOOR_FACTOR = 32.0
_PG_LAMBDA_OVER_N = [0.0, 1e-3, 1.0, 1e3]


def _pg(dists, target, sizes, lam, **settings):
    return fedpals_weights(dists, target, sizes, lam, solver="projected_gradient", **settings)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(
    "num_clients,num_classes",
    [(3, 10), (8, 8), (20, 5), (50, 10)],  # the shapes of test_weights_reach_reference_optimum
    ids=["M<K", "M=K", "M>K", "M>>K"],
)
def test_projected_gradient_reaches_the_active_set_minimiser(num_clients, num_classes, seed):
    # Fresh problems (their seeds are used nowhere else); three kinds of T, lam = 0 (not
    # strictly convex when M > K: objectives only), a small and a large lam / N.
    rng = np.random.default_rng([2907, num_clients, num_classes, seed])
    dists = _random_dists(rng, num_clients, num_classes)
    sizes = _random_sizes(rng, num_clients)
    for kind in ("random", "inside", "sparse"):
        target = _random_target(rng, dists, kind)
        for ratio in _PG_LAMBDA_OVER_N:
            lam = ratio * sizes.sum()
            context = f"{kind} T, lam/N={ratio}"
            exact = np.asarray(fedpals_weights(dists, target, sizes, lam), np.float64)
            alpha = np.asarray(_pg(dists, target, sizes, lam), np.float64)
            _assert_on_simplex(alpha, num_clients)
            # Objectives at alpha rescaled onto the simplex (as in _assert_near_optimal): equal
            # to within the rounding of evaluating eq. 8 in float32, eps * scale^2.
            gap = _objective(alpha / alpha.sum(), dists, target, sizes, lam) - _objective(
                exact / exact.sum(), dists, target, sizes, lam
            )
            scale = _objective_scale(dists, target, sizes, lam, exact)
            assert abs(gap) <= _EPS32 * scale**2, f"{context}: objective gap {gap:.3e}"
            if _strictly_convex(dists, lam):
                reference = _reference_weights(dists, target, sizes, lam)
                floor = _gradient_floor(dists, target, sizes, lam, reference)
                bound = _GRADIENT_FLOOR_FACTOR * floor
                error = np.abs(alpha - exact).max()
                assert error <= bound, f"{context}: max |alpha - alpha*| {error:.3e} > {bound:.3e}"


def test_projected_gradient_defaults_reach_a_lambda_zero_minimiser_that_tol_1e7_missed():
    # M = 20 > K = 5: at lam = 0 eq. 8 is not strongly convex (S S^T has rank 5), and near the
    # minimiser (4 clients) projected gradient's steps fall under 1e-7 long before it gets
    # there: with the card's former tol 1e-7 both phases stopped 0.035 off it (objective 2.3e-7
    # = 1.9 eps scale^2 too high). DEFAULT_TOL = 1e-9 runs the budget and reaches it.
    rng = np.random.default_rng([20, 5, 3, 7])
    dists = _random_dists(rng, 20, 5)
    sizes = _random_sizes(rng, 20)
    target = _random_target(rng, dists, "random")
    alpha = np.asarray(_pg(dists, target, sizes, 0.0), np.float64)
    _assert_on_simplex(alpha, 20)
    reference = _reference_weights(dists, target, sizes, 0.0)
    gap = _objective(alpha / alpha.sum(), dists, target, sizes, 0.0) - _objective(
        reference, dists, target, sizes, 0.0
    )
    assert gap <= _EPS32 * _objective_scale(dists, target, sizes, 0.0, reference) ** 2, gap
    assert np.abs(alpha - reference).max() <= 1e-4


def test_projected_gradient_is_selected_and_uses_max_iter_and_tol(monkeypatch):
    rng = np.random.default_rng([2907, 1])
    dists = _random_dists(rng, 20, 5)  # M > K, the shape of the tests above: compiled once
    sizes = _random_sizes(rng, 20)
    target = _random_target(rng, dists, "random")
    lam = 1e-3 * sizes.sum()
    alpha = _pg(dists, target, sizes, lam)
    # Settings that stop early give another, worse alpha: max_iter and tol are its own.
    value = _objective(alpha, dists, target, sizes, lam)
    for settings in (dict(max_iter=3), dict(tol=1e-1)):
        early = np.asarray(_pg(dists, target, sizes, lam, **settings), np.float64)
        _assert_on_simplex(early, 20)
        assert _objective(early, dists, target, sizes, lam) > value + 1e-6, settings
    # Each solver runs only its own solve.
    def refuse(*args, **kwargs):
        raise AssertionError("the other solver ran")

    monkeypatch.setattr(server_weights, "_solve_fedpals", refuse)
    np.testing.assert_array_equal(_pg(dists, target, sizes, lam), alpha)
    monkeypatch.undo()
    monkeypatch.setattr(server_weights, "_solve_fedpals_projected_gradient", refuse)
    default = fedpals_weights(dists, target, sizes, lam)
    np.testing.assert_array_equal(
        fedpals_weights(dists, target, sizes, lam, solver="active_set"), default
    )


def test_projected_gradient_is_fedavg_at_infinite_lambda_and_jits_and_vmaps():
    rng = np.random.default_rng([2907, 2])
    dists = _random_dists(rng, 20, 5)  # M > K, the shape of the tests above: compiled once
    sizes = _random_sizes(rng, 20)
    target = _random_target(rng, dists, "sparse")
    np.testing.assert_array_equal(_pg(dists, target, sizes, jnp.inf), fedavg_weights(sizes))
    lams = jnp.asarray([0.0, 1e-2 * sizes.sum(), sizes.sum(), jnp.inf], jnp.float32)
    batched = jax.jit(jax.vmap(lambda lam: _pg(dists, target, sizes, lam)))(lams)
    for lam, row in zip(lams, np.asarray(batched)):
        single = np.asarray(_pg(dists, target, sizes, lam), np.float64)
        if float(lam) > 0:  # a unique minimiser: the batched rounding moves it by ~1e-6
            np.testing.assert_allclose(row, single, atol=1e-5)
            np.testing.assert_allclose(row, fedpals_weights(dists, target, sizes, lam), atol=1e-5)
        else:  # M > K: a flat set of minimisers, along which rounding moves alpha
            scale = _objective_scale(dists, target, sizes, 0.0, single)
            gap = _objective(row, dists, target, sizes, 0.0) - _objective(
                single, dists, target, sizes, 0.0
            )
            assert abs(gap) <= _EPS32 * scale**2


@pytest.mark.parametrize("solver", ["projected", "PROJECTED_GRADIENT", "", None, 1])
def test_unknown_solver_is_refused_naming_the_solvers(solver, no_solves):
    dists, target, sizes = _valid_problem()
    message = r"solver must be one of \['active_set', 'projected_gradient'\]"
    with pytest.raises(ValueError, match=message):
        fedpals_weights(dists, target, sizes, 1.0, solver=solver)
    with pytest.raises(ValueError, match=message):  # static: checked under jit too
        jax.jit(lambda d: fedpals_weights(d, target, sizes, 1.0, solver=solver))(dists)
