"""Server aggregation weights: FedAvg and FedPALS.

Notation follows the FedPALS paper: M clients, K classes, S the (M, K) matrix of
client label distributions S_i(Y), T the (K,) target label distribution T(Y),
n the (M,) client sample sizes and N = sum_i n_i.

* FedAvg (eq. 4):  alpha_i = n_i / N.
* FedPALS (eq. 8): alpha^lam = argmin_{alpha in simplex}
      || T - sum_i alpha_i S_i ||_2^2 + lam * sum_i alpha_i^2 / n_i.
  lam = 0 is the projection of T onto Conv(S) (eq. 7); lam -> infinity gives
  FedAvg (Proposition 2).
* ESS(alpha) = 1 / sum_i alpha_i^2 / n_i, the effective sample size of the
  weighted aggregate (Sec. 3.1); FedAvg attains the maximum, N.

Every function here is a pure JAX function: jit-able, and vmap-able over lam
and over targets. Inputs are validated (ValueError naming the problem) when
they are concrete; traced calls skip the checks.
"""

from __future__ import annotations


import functools

import chex
import jax
import jax.numpy as jnp
import jaxopt
from jaxopt.projection import projection_simplex

from fedjax_pals import _validation

# Projected gradient with a fixed step 1/L and Nesterov acceleration (FISTA).
# On random problems up to M = 100 (lam = 0, M > K, the slowest case) the
# objective is within 2e-8 of a float64 SLSQP reference after 2000 iterations;
# 5000 leaves margin. The tolerance is on the step ||alpha_{k+1} - y_k||, which
# float32 round-off bounds near 1e-7. See BUILD_NOTES.md.
# jaxopt's accelerated solver alone can stop early at a non-optimal vertex
# (tests/test_server_weights.py has the reproducer); an unaccelerated polish
# from its result certifies the optimum (see _solve_fedpals).
DEFAULT_MAX_ITER = 5000
DEFAULT_TOL = 1e-7
# The polish stops on the true gradient mapping and can go a decade lower
# before float32 round-off makes it wander along flat minimiser sets.
_POLISH_TOL_FACTOR = 0.1
# The polish usually stops within ~50 steps; the few that reach float32's
# noise floor would run on without gain, and under vmap every problem waits
# for the slowest, so it gets a fifth of the budget.
_POLISH_ITER_DIVISOR = 5

# The bisection of `lambda_for_ess` searches lam / N in [1e-6, 1e12], log-spaced.
# 1e-6 N stands for lam -> 0+: when T is in Conv(S) and M > K the lam = 0
# minimiser is not unique and lim_{lam->0+} alpha^lam is the largest-ESS one
# (App. B.2); below about 1e-6 N the float32 solve cannot resolve it.
_LOG10_LAM_RANGE = (-6.0, 12.0)
_BISECTION_STEPS = 64


def _float_array(x: chex.ArrayLike) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(float))


def fedavg_weights(client_sizes: chex.ArrayLike) -> jax.Array:
    """FedAvg weights alpha_i = n_i / N (eq. 4)."""
    if _validation.is_concrete(client_sizes):
        _validation.check_client_sizes(client_sizes)
    sizes = _float_array(client_sizes)
    return sizes / jnp.sum(sizes)


def effective_sample_size(alpha: chex.ArrayLike, client_sizes: chex.ArrayLike) -> jax.Array:
    """ESS(alpha) = 1 / sum_i alpha_i^2 / n_i (Sec. 3.1 of the paper)."""
    if _validation.is_concrete(alpha, client_sizes):
        sizes = _validation.check_client_sizes(client_sizes)
        if jnp.shape(alpha) != sizes.shape:
            raise ValueError(
                f"alpha has shape {jnp.shape(alpha)} but client_sizes has shape {sizes.shape}."
            )
    alpha = _float_array(alpha)
    return 1.0 / jnp.sum(alpha * alpha / _float_array(client_sizes))


def fedpals_objective(
    alpha: chex.ArrayLike,
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    lam: chex.ArrayLike,
) -> jax.Array:
    """The objective of eq. 8 at alpha (for reporting and testing)."""
    alpha = _float_array(alpha)
    residual = _float_array(target_label_dist) - alpha @ _float_array(client_label_dists)
    return residual @ residual + lam * jnp.sum(alpha * alpha / _float_array(client_sizes))


def _lipschitz_bound(dists: jax.Array, inv_sizes: jax.Array, lam: jax.Array) -> jax.Array:
    # The Hessian of eq. 8 is 2 (S S^T + lam diag(1/n)). ||S S^T||_2 equals
    # ||S^T S||_2, a K x K eigenproblem, cheap even for thousands of clients.
    gram_norm = jnp.linalg.eigvalsh(dists.T @ dists)[-1]
    return 2.0 * (gram_norm + lam * jnp.max(inv_sizes))


@functools.partial(jax.jit, static_argnames=("max_iter", "tol"))
def _solve_fedpals(
    dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array, max_iter: int, tol: float
) -> jax.Array:
    inv_sizes = 1.0 / sizes
    finite_lam = jnp.where(jnp.isinf(lam), 0.0, lam)
    # Scaling the objective by 1/L makes a fixed step of 1 equal to 1/L, so
    # a traced L (vmap over lam) still gives a fixed step.
    lipschitz = _lipschitz_bound(dists, inv_sizes, finite_lam)

    def scaled_objective(alpha):
        residual = target - alpha @ dists
        return (residual @ residual + finite_lam * jnp.sum(alpha * alpha * inv_sizes)) / lipschitz

    def solver(accelerated: bool) -> jaxopt.ProjectedGradient:
        return jaxopt.ProjectedGradient(
            fun=scaled_objective,
            projection=projection_simplex,
            stepsize=1.0,
            maxiter=max_iter if accelerated else max(1, max_iter // _POLISH_ITER_DIVISOR),
            tol=tol if accelerated else tol * _POLISH_TOL_FACTOR,
            acceleration=accelerated,
            implicit_diff=False,
        )

    fedavg = sizes / jnp.sum(sizes)
    # FedAvg is the starting point: exact for huge lam and for T equal to the
    # client aggregate, where the projected gradient vanishes at once.
    # Phase 1, accelerated (FISTA), gets close fast but stops on ||x_{k+1} - x_k||,
    # which is 0 when momentum overshoots a face of the simplex and the
    # projection lands twice on the same, possibly non-optimal, point.
    # Phase 2, plain projected gradient from there, stops on the same quantity,
    # which without momentum is the gradient mapping at x_k: 0 only at the optimum.
    alpha = solver(accelerated=True).run(fedavg).params
    alpha = solver(accelerated=False).run(alpha).params
    return jnp.where(jnp.isinf(lam), fedavg, alpha)


def fedpals_weights(
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    lam: chex.ArrayLike,
    *,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
) -> jax.Array:
    """FedPALS aggregation weights alpha^lam, eq. 8 of the paper.

        alpha^lam = argmin_{alpha in simplex} ||T - alpha^T S||_2^2 + lam * sum_i alpha_i^2 / n_i

    solved with `jaxopt.ProjectedGradient` onto the simplex (fixed step 1/L,
    started from FedAvg): accelerated, then polished without acceleration,
    whose stopping rule certifies the optimum.

    Args:
      client_label_dists: S, shape (M, K); row i is client i's label distribution.
      target_label_dist: T, shape (K,).
      client_sizes: n, shape (M,), all > 0.
      lam: the trade-off lam >= 0. `jnp.inf` returns FedAvg (Proposition 2).
      max_iter, tol: solver budget; the defaults reach 1e-8 in objective on
        random problems (BUILD_NOTES.md).

    Returns:
      alpha, shape (M,), on the simplex.

    At lam = 0 with T inside Conv(S) and M > K the minimiser is not unique; this
    returns the one projected gradient reaches from FedAvg, not necessarily the
    largest-ESS one (the lam -> 0+ limit, App. B.2). Use a small positive lam
    for that one.
    """
    if _validation.is_concrete(client_label_dists, target_label_dist, client_sizes, lam):
        _validation.check_problem(client_label_dists, target_label_dist, client_sizes)
        _validation.check_lam(lam)
    dists = _float_array(client_label_dists)
    target = _float_array(target_label_dist)
    sizes = _float_array(client_sizes)
    chex.assert_rank(dists, 2)
    chex.assert_shape(target, (dists.shape[1],))
    chex.assert_shape(sizes, (dists.shape[0],))
    return _solve_fedpals(dists, target, sizes, _float_array(lam), max_iter=max_iter, tol=tol)


def projection_distance(
    client_label_dists: chex.ArrayLike, target_label_dist: chex.ArrayLike
) -> jax.Array:
    """d(T, S) = min_{alpha in simplex} ||T - alpha^T S||_2^2 (Sec. 5).

    Zero exactly when T lies in Conv(S) (Assumption 2, target coverage).
    """
    if _validation.is_concrete(client_label_dists, target_label_dist):
        _validation.check_problem(client_label_dists, target_label_dist, None)
    dists = _float_array(client_label_dists)
    target = _float_array(target_label_dist)
    uniform_sizes = jnp.ones(dists.shape[0], dists.dtype)
    alpha = _solve_fedpals(
        dists,
        target,
        uniform_sizes,
        jnp.zeros((), dists.dtype),
        max_iter=DEFAULT_MAX_ITER,
        tol=DEFAULT_TOL,
    )
    residual = target - alpha @ dists
    return residual @ residual


def _ess_fraction_at(log10_lam_over_n, dists, target, sizes):
    total = jnp.sum(sizes)
    lam = total * 10.0**log10_lam_over_n
    alpha = _solve_fedpals(dists, target, sizes, lam, max_iter=DEFAULT_MAX_ITER, tol=DEFAULT_TOL)
    return 1.0 / (total * jnp.sum(alpha * alpha / sizes))


@jax.jit
def _lambda_for_ess(dists, target, sizes, fraction):
    # ESS(alpha^lam) is non-decreasing in lam (the penalised term of a
    # regularisation path never grows with its weight), so bisect on log(lam).
    def step(_, bounds):
        low, high = bounds
        mid = 0.5 * (low + high)
        too_small = _ess_fraction_at(mid, dists, target, sizes) < fraction
        return jnp.where(too_small, mid, low), jnp.where(too_small, high, mid)

    low, high = jax.lax.fori_loop(
        0,
        _BISECTION_STEPS,
        step,
        (
            jnp.asarray(_LOG10_LAM_RANGE[0], dists.dtype),
            jnp.asarray(_LOG10_LAM_RANGE[1], dists.dtype),
        ),
    )
    lam = jnp.sum(sizes) * 10.0 ** (0.5 * (low + high))
    fraction_at_zero = _ess_fraction_at(-jnp.inf, dists, target, sizes)
    lam = jnp.where(fraction <= fraction_at_zero, 0.0, lam)
    return jnp.where(fraction >= 1.0, jnp.inf, lam)


def lambda_for_ess(
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    fraction: chex.ArrayLike,
) -> jax.Array:
    """The lam at which ESS(alpha^lam) = fraction * N (App. B.3).

    The paper picks a few lam giving ESS of e.g. 25/50/75 % of N and selects
    among them on a target-distributed validation set. ESS grows with lam from
    ESS(alpha^{0+}) to N (FedAvg), alpha^{0+} = lim_{lam->0+} alpha^lam, so
    fractions in [ESS(alpha^{0+})/N, 1] are reachable; fraction = 1 returns
    `inf` (FedAvg), and the lower end returns 0 where alpha^0 is unique. When T
    is in Conv(S) and M > K, lam = 0 has many minimisers and ones of smaller ESS
    than alpha^{0+} are reached by no lam > 0: such fractions raise. Found by a
    64-step bisection on log(lam) over lam/N in [1e-6, 1e12] (1e-6 N stands for
    0+).

    Raises:
      ValueError: for bad problem data, or a fraction outside
        [ESS(alpha^{0+})/N, 1] (the message gives the reachable range).
    """
    dists = _float_array(client_label_dists)
    target = _float_array(target_label_dist)
    sizes = _float_array(client_sizes)
    if _validation.is_concrete(client_label_dists, target_label_dist, client_sizes, fraction):
        _validation.check_problem(client_label_dists, target_label_dist, client_sizes)
        value = float(fraction)
        lowest = max(
            float(_ess_fraction_at(-jnp.inf, dists, target, sizes)),
            float(_ess_fraction_at(_LOG10_LAM_RANGE[0], dists, target, sizes)),
        )
        # Round-off slack of the solver near lam = 0.
        if not (lowest - 1e-4 <= value <= 1.0):
            raise ValueError(
                f"ESS fraction {value} is out of range: for these clients and target the reachable "
                f"fractions are [{lowest:.6g}, 1] (ESS(alpha^(0+))/N up to FedAvg)."
            )
    return _lambda_for_ess(dists, target, sizes, _float_array(fraction))
