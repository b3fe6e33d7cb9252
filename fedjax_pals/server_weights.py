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

from fedjax_pals import _linalg, _validation

# fedpals_weights' solvers: "active_set" (_solve_fedpals) and "projected_gradient"
# (_solve_fedpals_projected_gradient, the design card's); see fedpals_weights.
SOLVERS = ("active_set", "projected_gradient")
DEFAULT_SOLVER = "active_set"
# The projected gradient's budget per phase (accelerated, then plain) and its tolerance on
# ||alpha_(k+1) - alpha_k||_2. In float32 that step jitters at rounding level (1e-8 to 1e-6 in
# the problems measured), so both phases nearly always run their max_iter steps: a tolerance
# of 1e-7 stopped 0.035 off a lam = 0 minimiser (M = 20 > K = 5, S S^T singular, the steps
# near the minimiser tiny; docs/decisions/0030-projected-gradient-selectable.md). The
# active-set method uses neither.
DEFAULT_MAX_ITER = 5000
DEFAULT_TOL = 1e-9
# _active_set: at most this many clients join the dual phase's face (it is normally right,
# or off by a few), and at most this many full steps in a row refine a face's minimiser.
_MAX_ADDITIONS = 64
_MAX_REFINEMENTS = 8
# Semismooth Newton on the dual (_dual_newton): steps, and the shortest backtracked step;
# lam's path there goes from max(lam, N) down by _DUAL_PATH_FACTOR per stage.
_MAX_DUAL_STEPS = 100
_MIN_DUAL_STEP = 2.0**-30
_DUAL_PATH_FACTOR = 10.0
# Newton steps for the threshold tau of _dual_weights (each O(M); typically under 10).
_MAX_THRESHOLD_STEPS = 100

# The bisection of `lambda_for_ess` searches lam / N in [1e-6, 1e12], log-spaced.
# 1e-6 N stands for lam -> 0+: when T is in Conv(S) and M > K the lam = 0
# minimiser is not unique and lim_{lam->0+} alpha^lam is the largest-ESS one
# (App. B.2); below about 1e-6 N the float32 solve cannot resolve it.
LOG10_LAM_RANGE = (-6.0, 12.0)
# Up to this many clients an answer that is not KKT-certified is re-solved from FedAvg's
# full face (`_solve_fedpals`); above, a second solve of O(M) steps costs too much.
RESTART_MAX_CLIENTS = 512
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
    """ESS(alpha) = 1 / sum_i alpha_i^2 / n_i (Sec. 3.1 of the paper).

    alpha: finite, non-negative weights, one per client (normally on the simplex).
    """
    if _validation.is_concrete(alpha, client_sizes):
        sizes = _validation.check_client_sizes(client_sizes)
        _validation.check_weights("alpha", alpha, sizes.size)
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


def _face_newton_step(
    alpha: jax.Array,
    active: jax.Array,
    dists: jax.Array,
    target: jax.Array,
    sizes: jax.Array,
    lam: jax.Array,
    fast: jax.Array | bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One exact (Newton) step of eq. 8 on the face A of the simplex (the boolean mask `active`).

    alpha must be 0 off A and >= 0 on it (a client just added to A may be at 0).

    On the face A, eq. 8 in the correction d (d_i = 0 off A,
    sum_i d_i = 0) is an equality-constrained least-squares problem. In the
    scaled correction e = N^(-1/2) d (N = diag(n)), with q = (sqrt(n_i))_{i in A},
    P the projector onto q's orthogonal complement in A, F = S_A^T N_A^(1/2) P
    (K x M, rank <= K), r = T - alpha^T S and v = N^(-1/2) alpha, it reads

        min_{e in range(P)} ||F e - r||^2 + lam ||e + P v||^2,

    a Tikhonov problem solved with the thin SVD F^T = V diag(sigma) U^T
    (M x K: O(M K^2), cheap for thousands of clients):

        lam = 0:  e = V diag(1 / sigma) U^T r         (the minimum-norm correction,
                  which moves alpha as little as possible along flat directions);
        lam > 0:  e = V diag(1 / (sigma^2 + lam)) V^T g + (I - V V^T) g / lam,
                  g = P (N^(1/2) (-grad f(alpha) / 2)) = F^T r - lam P v.

    Both are corrections computed from the residual / gradient at alpha, so the solve's float32
    error is relative to ||d||; what remains is the rounding of r and of grad f, i.e. float32's
    floor for this problem's conditioning. At lam > 0, g is formed from grad f in alpha's own
    coordinates, less the multiplier of sum_i alpha_i = 1, before any scaling by sqrt(n_i):
    computing F^T r and lam P v apart (large terms that cancel at the optimum), or leaving the
    multiplier in, costs eps * (their size) * sqrt(n_max / n_min) in alpha, 1e-5 on
    tests/test_server_weights.py's problems. A ratio test keeps alpha >= 0: a client the step
    would make negative leaves the face at 0.

    The SVD is `_linalg.tall_thin_svd`'s (Householder QR + K x K SVD, accurate to
    float32 rounding). With `fast` it comes from the K x K Gram F F^T instead (eigh,
    about 3x cheaper at M = 10,000, but it squares F's condition number: singular values
    below sqrt(eps K) sigma_max are dropped, the rest lose accuracy); `_active_set` uses
    it only for the steps that drop clients at lam = 0.

    Returns the new alpha, whether the step was kept and whether it was a full one (t = 1). The
    step is kept only if finite and if it does not raise the objective beyond the float32
    rounding of its evaluation: in exact arithmetic it never raises it.
    """
    dtype = alpha.dtype
    eps = jnp.finfo(dtype).eps
    num_clients, num_classes = dists.shape
    sqrt_sizes = jnp.where(active, jnp.sqrt(sizes), 0.0)  # q
    q_norm2 = sqrt_sizes @ sqrt_sizes

    def project_rows(x):  # P applied to each column of an (M, K) matrix
        return x - jnp.outer(sqrt_sizes, sqrt_sizes @ x) / q_norm2

    def project(x):  # P x, for x zero off A
        return x - sqrt_sizes * (sqrt_sizes @ x) / q_norm2

    residual = target - alpha @ dists
    f_transposed = project_rows(dists * sqrt_sizes[:, None])  # F^T, (M, K)

    # F^T = V diag(sigma) U^T with V = Q (basis @ mix): Q a product of Householder
    # reflections (identity for zero reflectors), basis (M, K), mix K x K, so that products
    # with V are matrix-vector work.
    def accurate_svd(f_t):
        reflectors, u_r, sigma, u_t = _linalg.tall_thin_svd(f_t)
        # Singular values at the SVD's rounding level belong to null directions of F.
        keep = sigma > eps * max(num_clients, num_classes) * sigma[0]
        rank = sigma.shape[0]
        if rank < num_classes:  # M < K: pad to K singular triplets
            pad = num_classes - rank
            u_r = jnp.pad(u_r, ((0, 0), (0, pad)))
            sigma, keep = jnp.pad(sigma, (0, pad)), jnp.pad(keep, (0, pad))
            u_t = jnp.pad(u_t, ((0, pad), (0, 0)))
        if num_clients < 2 * num_classes:  # thin_svd's dense left factor (Q = I)
            basis, mix = u_r, jnp.diag(keep.astype(dtype))
        else:  # V = Q [U_R; 0]
            basis = jnp.eye(num_clients, num_classes, dtype=dtype)
            mix = jnp.where(keep[None, :], u_r, 0.0)
        return reflectors, basis, mix, sigma, u_t, keep

    def gram_svd(f_t):
        # F F^T = U diag(sigma^2) U^T (K x K), V = F^T U / sigma: squares F's condition
        # number, so only sigma above sqrt(eps K) sigma_max count (w > eps K w_max).
        w, u = _linalg.eigh(f_t.T @ f_t)
        w, u = w[::-1], u[:, ::-1]
        keep = w > eps * num_classes * w[0]
        sigma = jnp.sqrt(jnp.where(keep, w, 0.0))
        mix = jnp.where(keep[None, :], u / jnp.where(keep, sigma, 1.0)[None, :], 0.0)
        return jnp.zeros_like(f_t), f_t, mix, sigma, u.T, keep

    reflectors, basis, mix, sigma, u_t, keep = jax.lax.cond(
        fast, gram_svd, accurate_svd, f_transposed
    )

    def v_times(x):  # V x, x of shape (K, c): one pass of the reflections for all c columns
        y = basis @ (mix @ x)
        return jax.lax.cond(fast, lambda: y, lambda: _linalg.apply_reflectors(reflectors, y))

    def v_transposed_times(x):  # V^T x
        y = jax.lax.cond(
            fast, lambda: x, lambda: _linalg.apply_reflectors_transposed(reflectors, x)
        )
        return mix.T @ (basis.T @ y)

    safe_sigma = jnp.where(keep, sigma, 1.0)
    positive_lam = lam > 0
    safe_lam = jnp.where(positive_lam, lam, 1.0)
    # -grad f / 2 on A, less its n-weighted mean: at the optimum every entry equals the
    # multiplier of sum_i alpha_i = 1, which can be large (T far from Conv(S)). P
    # removes it in exact arithmetic; removing it here, before the scaling by
    # sqrt(n_i), keeps its rounding (eps |multiplier| sqrt(n_i)) out of the step.
    half_grad = jnp.where(active, dists @ residual - lam * alpha / sizes, 0.0)
    half_grad = jnp.where(active, half_grad - (sizes * half_grad).sum() / q_norm2, 0.0)
    grad = project(sqrt_sizes * half_grad)
    # g's part off range(V), divided by lam: (I - V V^T) F^T r / lam - (I - V V^T) P v. The
    # first term is F^T r's part in the singular directions `keep` drops, and its rounding,
    # amplified by 1 / lam: below the dual phase's lam (N 10^LOG10_LAM_RANGE[0]) it is left
    # out (else objective gaps of 1e-2 at lam = 1e-9 N), above it kept (else alpha errors
    # of 1e-5 at lam = 1e-4 N).
    tiny_lam = lam < jnp.sum(sizes) * 10.0 ** LOG10_LAM_RANGE[0]
    scaled_alpha = project(jnp.where(active, alpha / jnp.where(active, sqrt_sizes, 1.0), 0.0))
    components = v_transposed_times(jnp.stack([grad, scaled_alpha], axis=1))
    # One product with V for the four vectors: lam = 0's correction, then lam > 0's.
    columns = [
        jnp.where(keep, (u_t @ residual) / safe_sigma, 0.0),
        components[:, 0] / (safe_sigma * safe_sigma + lam),
        components[:, 0],
        components[:, 1],
    ]
    products = v_times(jnp.stack(columns, axis=1))
    e_zero = products[:, 0]
    off_range = jnp.where(
        tiny_lam, products[:, 3] - scaled_alpha, (grad - products[:, 2]) / safe_lam
    )
    e_positive = products[:, 1] + off_range
    e = jnp.where(positive_lam, e_positive, e_zero)
    step = jnp.where(active, sqrt_sizes * e, 0.0)
    # Ratio test: the longest t <= 1 with alpha + t d >= 0.
    decreasing = active & (step < 0)
    ratios = jnp.where(decreasing, alpha / jnp.where(decreasing, -step, 1.0), jnp.inf)
    blocking = jnp.argmin(ratios)
    full = ratios[blocking] >= 1.0
    t = jnp.where(full, 1.0, ratios[blocking])
    candidate = jnp.maximum(alpha + t * step, 0.0)
    candidate = jnp.where(~full & (jnp.arange(num_clients) == blocking), 0.0, candidate)
    candidate = candidate / jnp.sum(candidate)

    # The objective at alpha and at the candidate, evaluated together.
    both = jnp.stack([alpha, candidate])
    residuals = target - both @ dists
    old_value, new_value = jnp.sum(residuals * residuals, axis=1) + lam * jnp.sum(
        both * both / sizes, axis=1
    )
    # Float32 evaluation error of the objective: ~eps (f + ||r|| (||T|| + ||alpha^T S||)),
    # with ||r|| = sqrt(f) at most, times a small factor for the sums' rounding.
    slack = 16 * eps * (old_value + 2 * jnp.sqrt(old_value))
    accept = jnp.all(jnp.isfinite(candidate)) & (new_value <= old_value + slack)
    return jnp.where(accept, candidate, alpha), accept, accept & full


def _dual_weights(scores: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    """alpha_i = c_i (w_i - tau)_+ with tau such that sum_i alpha_i = 1 (c = scale, w = scores).

    phi(tau) = sum_i c_i (w_i - tau)_+ - 1 is convex, piecewise linear and decreasing;
    Newton's method from the left (tau_0 = the root with every client active, where
    phi >= 0) increases tau monotonically and stops exactly when the active set stops
    shrinking: tau = (sum_A c_i w_i - 1) / sum_A c_i. Each step is O(M), no sort.
    """

    def root(active):
        active_scale = jnp.sum(jnp.where(active, scale, 0.0))
        mean = jnp.sum(jnp.where(active, scale * scores, 0.0)) / active_scale
        return mean - 1.0 / active_scale

    def cond(carry):
        steps, _, count, previous = carry
        return (steps < _MAX_THRESHOLD_STEPS) & (count != previous)

    def body(carry):
        steps, tau, count, _ = carry
        tau = jnp.maximum(root(scores > tau), tau)
        return steps + 1, tau, jnp.sum(scores > tau), count

    tau = root(jnp.ones(scores.shape, bool))
    _, tau, _, _ = jax.lax.while_loop(cond, body, (0, tau, jnp.sum(scores > tau), -1))
    return scale * jnp.maximum(scores - tau, 0.0), tau


def _dual_newton(
    dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array
) -> jax.Array:
    """Eq. 8 for lam > 0 through its dual, a concave problem in K variables.

    With the residual r = T - S^T alpha as the dual variable, the KKT conditions of
    eq. 8 read alpha_i = (n_i / lam) (s_i^T r - tau)_+, tau fixed by sum_i alpha_i = 1
    (`_dual_weights`), and r = T - S^T alpha(r). alpha(r) maximises
    2 r^T S^T alpha - lam sum_i alpha_i^2 / n_i over the simplex, and
    q(r) = 2 r^T T - r^T r - (2 r^T S^T alpha(r) - lam sum_i alpha_i(r)^2 / n_i)
         = 2 r^T T - r^T r - r^T S^T alpha(r) - tau(r)
    is the (concave, piecewise quadratic) Lagrange dual, with gradient
    2 (T - r - S^T alpha(r)). Its generalised Hessian is -2 H with
    H = I + S_A^T (C_A - c_A c_A^T / sum_A c) S_A, C = diag(n / lam), A the active
    clients: a K x K matrix formed in O(M K^2) (rows centred on their c-weighted mean,
    so that the rank-one term never cancels in floating point). Semismooth Newton with
    an Armijo backtracking line search on q converges globally and, once the active set
    is right, ends in one full step.

    For small lam the dual is nearly non-smooth (at lam = 0 it is a maximum over the
    vertices) and Newton from FedAvg's residual crawls with one active client and
    H = I. So lam is approached along the path: from max(lam, N), where alpha is near
    FedAvg, down by _DUAL_PATH_FACTOR per stage, each stage warm-started from the last
    one's r and ended when a full Newton step keeps the active set (a few steps each).

    Returns alpha(r) at the last iterate: in float32 only approximate for small lam
    (alpha_i = c_i (s_i^T r - tau) magnifies the rounding of s_i^T r by n_i / lam), but
    its support is where the active-set method (`_active_set`) starts.
    """
    dtype = dists.dtype
    eps = jnp.finfo(dtype).eps
    num_classes = dists.shape[1]

    def evaluate(r, scale):
        scores = dists @ r
        alpha, tau = _dual_weights(scores, scale)
        value = 2.0 * (r @ target) - r @ r - scores @ alpha - tau
        noise = eps * (2.0 * jnp.abs(r @ target) + r @ r + jnp.abs(scores) @ alpha + jnp.abs(tau))
        return alpha, value, noise

    # One copy of `evaluate` in the graph (compile time): it runs only inside the line
    # search. A stage's first iteration is `stale`: alpha, q at r are re-evaluated for the
    # stage's lam (a search along a zero direction that stops after its one evaluation).
    def cond(carry):
        steps, *_, done = carry
        return (steps < _MAX_DUAL_STEPS) & ~done

    def body(carry):
        steps, stage_lam, r, alpha, value, noise, stale, _ = carry
        scale = sizes / stage_lam
        active = alpha > 0
        active_scale = jnp.where(active, scale, 0.0)
        mean_row = (active_scale @ dists) / jnp.sum(active_scale)
        centred = dists - mean_row
        hessian = jnp.eye(num_classes, dtype=dtype) + (centred * active_scale[:, None]).T @ centred
        half_gradient = target - r - alpha @ dists
        direction = jnp.where(stale, 0.0, _linalg.solve(hessian, half_gradient))
        slope = 2.0 * (half_gradient @ direction)

        def search_cond(search):
            t, _, _, new_value, new_noise = search
            sufficient = new_value >= value + 1e-4 * t * slope - 16.0 * (noise + new_noise)
            # t = 2: nothing evaluated yet.
            return (t > 1.5) | (~stale & ~sufficient & (t > _MIN_DUAL_STEP))

        def search_body(search):
            t = 0.5 * search[0]
            candidate = r + t * direction
            return (t, candidate, *evaluate(candidate, scale))

        t, new_r, new_alpha, new_value, new_noise = jax.lax.while_loop(
            search_cond, search_body, (jnp.asarray(2.0, dtype), r, alpha, value, noise)
        )
        accepted = stale | ((t > _MIN_DUAL_STEP) & jnp.all(jnp.isfinite(new_r)))
        r = jnp.where(accepted, new_r, r)
        alpha = jnp.where(accepted, new_alpha, alpha)
        value = jnp.where(accepted, new_value, value)
        noise = jnp.where(accepted, new_noise, noise)
        # A full step that keeps the active set solved the quadratic piece it lies on:
        # this stage is done (as it is when no step makes progress any more).
        stage_done = ~stale & (~accepted | ((t == 1.0) & jnp.all((new_alpha > 0) == active)))
        last_stage = stage_lam <= lam
        # The next stage's dual differs: its first iteration re-evaluates alpha, q at r.
        advance = stage_done & ~last_stage
        stage_lam = jnp.where(advance, jnp.maximum(lam, stage_lam / _DUAL_PATH_FACTOR), stage_lam)
        return steps + ~stale, stage_lam, r, alpha, value, noise, advance, stage_done & last_stage

    start_lam = jnp.maximum(lam, jnp.sum(sizes))
    start = target - (sizes / jnp.sum(sizes)) @ dists
    zero = jnp.zeros((), dtype)
    carry = (
        0, start_lam, start, sizes / jnp.sum(sizes), zero, zero, jnp.array(True), jnp.array(False)
    )
    alpha = jax.lax.while_loop(cond, body, carry)[3]
    return alpha / jnp.sum(alpha)  # tau's rounding leaves sum(alpha) off 1 for small lam


def _kkt_gaps(
    alpha: jax.Array, dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Eq. 8's KKT gaps at alpha (on the simplex) and their float32 rounding level.

    With g = grad f / 2 = -S r + lam alpha / n (r = T - S^T alpha) and mu = alpha^T g, the
    multiplier of sum_i alpha_i = 1, the KKT conditions read: gap_i = g_i - mu = 0 where
    alpha_i > 0 and gap_i >= 0 elsewhere. The slack is the rounding of g:
    32 eps (||T|| + ||S^T alpha|| + ||S r||_inf + lam max_i alpha_i / n_i + |mu|), the first
    two for r's rounding (rows of S have norm <= 1). O(M K) to compute.
    """
    eps = jnp.finfo(alpha.dtype).eps
    aggregate = alpha @ dists
    residual = target - aggregate
    correlation = dists @ residual
    penalty = lam * alpha / sizes
    half_grad = penalty - correlation
    multiplier = alpha @ half_grad
    slack = 32 * eps * (
        jnp.sqrt(target @ target)
        + jnp.sqrt(aggregate @ aggregate)
        + jnp.max(jnp.abs(correlation))
        + jnp.max(penalty)
        + jnp.abs(multiplier)
    )
    return half_grad - multiplier, slack


def _kkt_holds(
    alpha: jax.Array, dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array
) -> jax.Array:
    """Whether alpha (on the simplex) satisfies eq. 8's KKT conditions to float32 rounding."""
    gap, slack = _kkt_gaps(alpha, dists, target, sizes, lam)
    on_face = jnp.where(alpha > 0, jnp.abs(gap), 0.0)
    off_face = jnp.where(alpha > 0, 0.0, -gap)
    return (jnp.max(on_face) <= slack) & (jnp.max(off_face) <= slack) & jnp.all(jnp.isfinite(alpha))


def _active_set(
    alpha: jax.Array, dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array
) -> jax.Array:
    """A primal active-set method for eq. 8 from alpha (on the simplex), on the face alpha > 0.

    Each step is an exact step on the current face A (`_face_newton_step`). A step cut short
    by the ratio test drops the client that reached 0 and goes on on the smaller face
    (Lawson-Hanson's inner loop). A full step reaches the face's minimiser; if some client
    off A then has a KKT gap below -slack (`_kkt_gaps`), the most negative one joins A with
    weight 0: from a face minimiser, the next step raises its weight (its gap times the step's
    entry is the objective's first-order change, which is negative), so the objective
    decreases strictly from face to face and no face repeats. Stops after two full steps in a
    row with no client to add whose on-face gaps hold to rounding (float32 steps at small
    lam can need a few refinements; at most _MAX_REFINEMENTS full steps in a row), when
    a step is refused (it would raise the objective beyond rounding, or is not finite), or
    after |A_0| + 4 * _MAX_ADDITIONS + 4 steps; at most _MAX_ADDITIONS clients join A (the
    dual phase's face is normally right or off by a few).

    At lam = 0 the dual phase's face (of alpha^(1e-6 N)) can hold several times the clients
    of the face the method ends on (420 vs 122 at M = 10,000 in
    experiments/benchmarks/solve_time.py), one drop per step; a step right after a drop uses the
    Gram factorisation (`fast`), and a fast step that is full or refused is followed by an exact
    one, so the method ends on exact steps.
    """
    num_clients = alpha.shape[0]
    index = jnp.arange(num_clients)
    face = alpha > 0
    max_steps = jnp.sum(face) + 4 * _MAX_ADDITIONS + 4

    def cond(carry):
        steps, *_, done = carry
        return (steps < max_steps) & ~done

    def body(carry):
        steps, full_in_a_row, holds_in_a_row, additions, last_added = carry[:5]
        excluded, alpha, face, fast, _ = carry[5:]
        alpha, kept, full = _face_newton_step(alpha, face, dists, target, sizes, lam, fast)
        face = face & (alpha > 0)
        gap, slack = _kkt_gaps(alpha, dists, target, sizes, lam)
        off_face_gap = jnp.where(face, jnp.inf, gap)
        on_face_gap = jnp.max(jnp.where(face, jnp.abs(gap), 0.0))
        # At a face's minimiser the on-face gaps are 0 but for rounding: they measure the
        # gaps' actual rounding, often far below the bound `slack`. For lam > 0 a client
        # off the face whose gap is below -4x that (and below -slack / 32, one eps of the
        # bound) is a real violation: where lam / n_i is small, a gap within `slack` can
        # still hide weights off by 1e-2 (duplicated clients at lam = 1e-6 N). At lam = 0
        # clients with equal rows have equal gaps and the minimum-norm step gives an added
        # duplicate no weight: there only gaps below -slack count.
        threshold = jnp.where(lam > 0, jnp.maximum(4 * on_face_gap, slack / 32), slack)
        # A client the step after its addition dropped again at once is not re-added.
        excluded = excluded | ((index == last_added) & ~full & (alpha <= 0))
        off_face_gap = jnp.where(excluded, jnp.inf, off_face_gap)
        worst = jnp.argmin(off_face_gap)
        add = kept & full & (off_face_gap[worst] < -threshold) & (additions < _MAX_ADDITIONS)
        face = face | (add & (index == worst))
        last_added = jnp.where(add, worst, -1)
        full_in_a_row = jnp.where(full & ~add, full_in_a_row + 1, 0)
        # Holding in a row: after a full step with nothing to add, on-face gaps within slack.
        holds = full & ~add & (on_face_gap <= slack)
        holds_in_a_row = jnp.where(holds, holds_in_a_row + 1, 0)
        done = (
            (~kept & ~fast)
            | ((full_in_a_row >= 2) & (holds_in_a_row >= 2))
            | (full_in_a_row >= _MAX_REFINEMENTS)
        )
        fast = (lam == 0) & kept & ~full
        counters = (steps + 1, full_in_a_row, holds_in_a_row, additions + add, last_added)
        return (*counters, excluded, alpha, face, fast, done)

    excluded = jnp.zeros(num_clients, bool)
    carry = (0, 0, 0, 0, -1, excluded, alpha, face, jnp.array(False), jnp.array(False))
    return jax.lax.while_loop(cond, body, carry)[6]


@jax.jit
def _solve_fedpals(
    dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array
) -> jax.Array:
    finite_lam = jnp.where(jnp.isinf(lam), 0.0, lam)
    fedavg = sizes / jnp.sum(sizes)
    # Phase 1: the face. Semismooth Newton on eq. 8's K-dimensional dual (_dual_newton),
    # O(M K^2) a step, a few to a few tens of steps, for lam > 0; lam = 0 is approached
    # from its 0+ side. Phase 2: a primal active-set method from there (_active_set).
    # Below N 10^LOG10_LAM_RANGE[0] the dual's Newton steps are ill-conditioned (objective
    # gaps of 1e-1 at lam = 1e-12 N): the face comes from there, as for lam = 0.
    dual_lam = jnp.maximum(finite_lam, jnp.sum(sizes) * 10.0 ** LOG10_LAM_RANGE[0])
    alpha = _dual_newton(dists, target, sizes, dual_lam)
    alpha = _active_set(alpha, dists, target, sizes, finite_lam)
    if dists.shape[0] <= RESTART_MAX_CLIENTS:
        # A face the active set cannot leave (near affinely dependent clients, sizes
        # spanning 1e6, T at a vertex: about 1 draw in 50 of the edge tests at lam = 0):
        # when alpha is not KKT-certified, the active set again from FedAvg's full face,
        # which drops clients one by one (O(M) steps), and the better of the two. At lam = 0
        # eq. 8's objective does not involve the sizes, and the restart steps in unscaled
        # coordinates (unit sizes): the face steps' scaling by sqrt(n_i) makes their
        # least-squares problem sqrt(n_max / n_min) worse conditioned (1e3 for sizes 1 to
        # 1e6), which left 3 draws in 200 of that edge test uncertified at lam = 0 after both
        # runs. The sizes still pick the minimiser on a flat face (the largest-ESS one) in the
        # first run; the restart's answer replaces it only where its objective is lower.
        def restart(alpha):
            restart_sizes = jnp.where(finite_lam > 0, sizes, jnp.ones_like(sizes))
            start = restart_sizes / jnp.sum(restart_sizes)
            again = _active_set(start, dists, target, restart_sizes, finite_lam)
            better = fedpals_objective(again, dists, target, sizes, finite_lam) < (
                fedpals_objective(alpha, dists, target, sizes, finite_lam)
            )
            return jnp.where(better, again, alpha)

        certified = _kkt_holds(alpha, dists, target, sizes, finite_lam)
        alpha = jax.lax.cond(certified, lambda alpha: alpha, restart, alpha)
    return jnp.where(jnp.isinf(lam), fedavg, alpha)


def _lipschitz_bound(dists: jax.Array, sizes: jax.Array, lam: jax.Array) -> jax.Array:
    # The Hessian of eq. 8 is 2 (S S^T + lam diag(1/n)); ||S S^T||_2 = ||S^T S||_2, a K x K
    # eigenproblem, so no M x M matrix is formed; through _linalg, as every LAPACK call here
    # (vmapped over runs on several host devices, a batched call can deadlock XLA's CPU pool).
    gram_norm = _linalg.eigh(dists.T @ dists)[0][-1]
    return 2.0 * (gram_norm + lam * jnp.max(1.0 / sizes))


@functools.partial(jax.jit, static_argnames=("max_iter", "tol"))
def _solve_fedpals_projected_gradient(
    dists: jax.Array, target: jax.Array, sizes: jax.Array, lam: jax.Array, max_iter: int, tol: float
) -> jax.Array:
    """Eq. 8 by `jaxopt.ProjectedGradient` (the design card's solver): fixed step 1/L,
    Euclidean projection onto the simplex, from FedAvg; accelerated (FISTA), then plain."""
    finite_lam = jnp.where(jnp.isinf(lam), 0.0, lam)
    # The objective divided by L makes a fixed step of 1 equal to 1/L, so a traced L (vmap
    # over lam) still gives jaxopt a static step.
    lipschitz = _lipschitz_bound(dists, sizes, finite_lam)

    def scaled_objective(alpha):
        return fedpals_objective(alpha, dists, target, sizes, finite_lam) / lipschitz

    import jaxopt  # here: jaxopt imports scipy.optimize, ~0.3 CPU s of every start
    from jaxopt.projection import projection_simplex

    def run(alpha, accelerated):
        return jaxopt.ProjectedGradient(
            fun=scaled_objective,
            projection=projection_simplex,
            stepsize=1.0,
            maxiter=max_iter,
            tol=tol,
            acceleration=accelerated,
            implicit_diff=False,
        ).run(alpha).params

    fedavg = sizes / jnp.sum(sizes)
    # FedAvg is exact for lam = inf (Proposition 2) and for T equal to the clients' aggregate
    # (a fixed point, up to rounding). Accelerated alone, jaxopt can stop at a vertex that is
    # not optimal: its stopping test ||alpha_(k+1) - alpha_k|| is 0 when momentum overshoots a
    # face and the projection lands twice on the same vertex (4 of 144 small random problems
    # at lam <= 1e-3 N, objective up to 2.4e-4 too high;
    # docs/decisions/0030-projected-gradient-selectable.md). Without momentum that test is the
    # gradient mapping, 0 only at the minimiser: plain projected gradient finishes from where
    # the accelerated run stopped.
    alpha = run(run(fedavg, True), False)
    return jnp.where(jnp.isinf(lam), fedavg, alpha)


def fedpals_weights(
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    lam: chex.ArrayLike,
    *,
    solver: str = DEFAULT_SOLVER,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
) -> jax.Array:
    """FedPALS aggregation weights alpha^lam, eq. 8 of the paper.

        alpha^lam = argmin_{alpha in simplex} ||T - alpha^T S||_2^2 + lam * sum_i alpha_i^2 / n_i

    in O(M K^2) per step (M clients, K classes; no M x M matrix is formed):

    1. the face (support of alpha): semismooth Newton on eq. 8's Lagrange dual, a
       concave piecewise-quadratic problem in the K-dimensional residual r = T - S^T alpha,
       with alpha_i = (n_i / lam) (s_i^T r - tau)_+; lam is approached from max(lam, N)
       down by factors of 10, warm-started (lam = 0 stands in as 1e-6 N here);
    2. a primal active-set method from there: exact steps on the face (the KKT system
       there is linear: a least-squares problem solved in closed form through a
       Householder QR and a K x K SVD), a client whose weight would turn negative leaves
       the face, the client that most violates the KKT conditions at a face's minimiser
       joins it, until the KKT conditions hold to float32 rounding.

    At M = 10,000, K = 10 this takes 0.01-0.3 s on a 2-core CPU, at M = 100,000 0.1-2 s
    (lam = 0 is the slowest: the active set drops a client per step;
    docs/measurements/solver.md, "The active set, today's default").

    solver="projected_gradient" solves the same eq. 8 with the design card's solver instead,
    `jaxopt.ProjectedGradient` with `jaxopt.projection.projection_simplex`:

        alpha <- Proj_simplex(y - grad f(y) / L),  L = 2 (||S^T S||_2 + lam max_i 1 / n_i),

    from FedAvg, first accelerated (FISTA: the step is taken from an extrapolation y of the
    last two iterates), then plain (y = alpha, whose stopping test, the gradient mapping, is 0
    only at the minimiser), each for at most max_iter steps and until ||alpha_(k+1) -
    alpha_k||_2 <= tol; O(M K + M log M) a step (the projection sorts). On the tests' problems
    it reaches the default's minimiser to float32 rounding; it is 3-700x slower, and at lam = 0
    with M >> K (not strongly convex) the default budget can fall short
    (docs/measurements/solver.md, "Active set against projected gradient").

    Args:
      client_label_dists: S, shape (M, K); row i is client i's label distribution.
      target_label_dist: T, shape (K,).
      client_sizes: n, shape (M,), all > 0.
      lam: the trade-off lam >= 0. `jnp.inf` returns FedAvg (Proposition 2).
      solver: "active_set" (the default) or "projected_gradient" (above).
      max_iter: the projected gradient's iteration budget, an integer >= 1.
      tol: the projected gradient's stopping tolerance, a finite number > 0. Both are checked
        for either solver; the active-set method, which stops on the KKT conditions, uses
        neither.

    Returns:
      alpha, shape (M,), on the simplex.

    At lam = 0 with T inside Conv(S) and M > K the minimiser is not unique; this
    returns the one the active-set method reaches from alpha^(1e-6 N) by minimum-norm
    steps (in the metric sum_i d_i^2 / n_i), close to but not exactly the largest-ESS one
    (the lam -> 0+ limit, App. B.2); the projected gradient returns the one it reaches from
    FedAvg. Use a small positive lam for the largest-ESS one.

    Raises:
      ValueError / TypeError: bad problem data, lam < 0 or NaN, an unknown solver, or max_iter /
        tol not an integer >= 1 / a finite number > 0 (checked even under jit: they are static).
    """
    solver = _validation.check_choice("solver", solver, SOLVERS)
    max_iter = _validation.check_positive_int("max_iter", max_iter)
    tol = _validation.check_positive_float("tol", tol)
    problem = (client_label_dists, target_label_dist, client_sizes, lam)
    if _validation.is_concrete(*problem):
        _validation.check_problem(*problem[:3])
        _validation.check_lam(lam)
    dists, target, sizes, lam = map(_float_array, problem)
    chex.assert_rank(dists, 2)
    chex.assert_shape(target, (dists.shape[1],))
    chex.assert_shape(sizes, (dists.shape[0],))
    if solver == "projected_gradient":
        return _solve_fedpals_projected_gradient(
            dists, target, sizes, lam, max_iter=max_iter, tol=tol
        )
    return _solve_fedpals(dists, target, sizes, lam)


def fedpals_lam_derivative(
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    lam: chex.ArrayLike,
    alpha: chex.ArrayLike | None = None,
) -> jax.Array:
    """d alpha^lam / d lam, the derivative of eq. 8's minimiser, by implicit differentiation.

    On the face A = supp(alpha^lam) the KKT conditions of eq. 8 are linear in (alpha, nu):

        (S_A S_A^T + lam D_A) alpha_A - S_A T = nu 1,    1^T alpha_A = 1,    D = diag(1/n).

    Differentiating in lam (alpha stays 0 off A while the face does not change, i.e. under
    strict complementarity, which holds for all but finitely many lam):

        H alpha'_A - nu' 1 = -D_A alpha_A,   1^T alpha'_A = 0,   H = S_A S_A^T + lam D_A,

    so alpha'_A = nu' H^-1 1 - H^-1 D_A alpha_A with nu' = (1^T H^-1 D_A alpha_A) / (1^T H^-1 1).
    H is positive definite for lam > 0; at lam = 0 it is singular when |A| > rank(S_A) (the
    minimiser is then not unique and has no derivative), so lam must be > 0. The entries of
    alpha' sum to 0: moving lam moves weight between clients, towards FedAvg's n_i / N as lam
    grows (Proposition 2).

    Args:
      client_label_dists, target_label_dist, client_sizes, lam: eq. 8's S (M, K), T (K,),
        n (M,) and lam > 0, as in `fedpals_weights`.
      alpha: alpha^lam if already solved (it fixes the face A); solved here if None.

    Returns:
      alpha', shape (M,). Clients with alpha_i below 100 eps max(alpha) count as off the face.

    Raises:
      ValueError: bad problem data or lam <= 0 (when the inputs are concrete).
    """
    problem = (client_label_dists, target_label_dist, client_sizes, lam)
    if _validation.is_concrete(*problem):
        _validation.check_problem(*problem[:3])
        if not _validation.check_lam(lam) > 0:
            raise ValueError(
                f"lam must be > 0 for d alpha / d lam (at lam = 0 the minimiser of eq. 8 need "
                f"not be unique), got {lam!r}."
            )
    dists, target, sizes, lam = map(_float_array, problem)
    if alpha is None:
        alpha = _solve_fedpals(dists, target, sizes, lam)
    alpha = _float_array(alpha)
    return _lam_derivative(dists, target, sizes, lam, alpha)


@jax.jit
def _lam_derivative(dists, target, sizes, lam, alpha):
    del target  # enters only through alpha and its face
    eps = jnp.finfo(alpha.dtype).eps
    active = alpha > 100 * eps * jnp.max(alpha)
    mask = active.astype(alpha.dtype)
    inv_sizes = 1.0 / sizes
    hessian = dists @ dists.T + lam * jnp.diag(inv_sizes)
    # Off the face: identity rows and columns, so that the solve leaves those entries at 0.
    hessian = jnp.where(active[:, None] & active[None, :], hessian, jnp.diag(1.0 - mask))
    rhs = jnp.stack([mask, mask * inv_sizes * alpha], axis=1)
    solved = _linalg.solve(hessian, rhs)
    h_ones, h_d_alpha = solved[:, 0] * mask, solved[:, 1] * mask
    nu_prime = jnp.sum(h_d_alpha) / jnp.sum(h_ones)
    derivative = nu_prime * h_ones - h_d_alpha
    # Sums to 0 in exact arithmetic; removing the rounding also makes a lone client's 0 exact.
    return derivative - mask * jnp.sum(derivative) / jnp.sum(mask)


def projection_distance(
    client_label_dists: chex.ArrayLike, target_label_dist: chex.ArrayLike
) -> jax.Array:
    """d(T, S) = min_{alpha in simplex} ||T - alpha^T S||_2^2 (Sec. 5).

    Zero exactly when T lies in Conv(S) (Assumption 2, target coverage). A run reports it for
    the S its server weights are solved with (label DP's release where there is one) and the
    true T: `experiment.task.task_projection_distance`.
    """
    if _validation.is_concrete(client_label_dists, target_label_dist):
        _validation.check_problem(client_label_dists, target_label_dist, None)
    dists, target = _float_array(client_label_dists), _float_array(target_label_dist)
    uniform_sizes = jnp.ones(dists.shape[0], dists.dtype)
    alpha = _solve_fedpals(dists, target, uniform_sizes, jnp.zeros((), dists.dtype))
    residual = target - alpha @ dists
    return residual @ residual


def _ess_fraction_at(log10_lam_over_n, dists, target, sizes):
    total = jnp.sum(sizes)
    lam = total * 10.0**log10_lam_over_n
    alpha = _solve_fedpals(dists, target, sizes, lam)
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

    bounds = tuple(jnp.asarray(bound, dists.dtype) for bound in LOG10_LAM_RANGE)
    low, high = jax.lax.fori_loop(0, _BISECTION_STEPS, step, bounds)
    lam = jnp.sum(sizes) * 10.0 ** (0.5 * (low + high))
    fraction_at_zero = _ess_fraction_at(-jnp.inf, dists, target, sizes)
    # Within float32 rounding of ESS(alpha^0) / N (a fraction computed from alpha^0 in
    # another precision or order of summation) counts as reached at lam = 0.
    rounding = 16 * jnp.finfo(dists.dtype).eps * fraction_at_zero
    lam = jnp.where(fraction <= fraction_at_zero + rounding, 0.0, lam)
    return jnp.where(fraction >= 1.0, jnp.inf, lam)


def lambda_for_ess(
    client_label_dists: chex.ArrayLike,
    target_label_dist: chex.ArrayLike,
    client_sizes: chex.ArrayLike,
    fraction: chex.ArrayLike,
) -> jax.Array:
    """The lam at which ESS(alpha^lam) = fraction * N (App. B.3).

    The paper picks a few lam giving ESS of e.g. 25/50/75 % of N and selects among them on a
    target-distributed validation set. ESS grows with lam from ESS(alpha^{0+}) to N (FedAvg),
    alpha^{0+} = lim_{lam->0+} alpha^lam, so fractions in [ESS(alpha^{0+})/N, 1] are reachable;
    fraction = 1 returns `inf` (FedAvg), and the lower end returns 0 where alpha^0 is unique.
    When T is in Conv(S) and M > K, lam = 0 has many minimisers and ones of smaller ESS than
    alpha^{0+} are reached by no lam > 0: such fractions raise. Found by a 64-step bisection on
    log(lam) over lam/N in [1e-6, 1e12] (1e-6 N stands for 0+).

    A bad request fails before any solve (fraction = 1 returns `inf` at once; below min_i n_i / N
    no alpha on the simplex reaches it); only then is the reachable lower end solved for.

    Raises:
      ValueError: for bad problem data, or a fraction outside
        [ESS(alpha^{0+})/N, 1] (the message says "ESS fraction ... out of range"
        and gives the range: (0, 1], or the reachable one for these clients).
      TypeError: a fraction that is not a real scalar.
    """
    problem = (client_label_dists, target_label_dist, client_sizes)
    concrete = _validation.is_concrete(*problem, fraction)
    if concrete:  # the checks that need no solve come first
        _validation.check_problem(*problem)
        value = _validation.check_ess_fraction(fraction)
        if value == 1.0:  # FedAvg (Proposition 2): no solve
            return jnp.asarray(jnp.inf, jnp.result_type(float))
        sizes_np = _validation.check_client_sizes(client_sizes)
        every_alpha = sizes_np.min() / sizes_np.sum()
        if value < every_alpha:
            raise ValueError(
                f"ESS fraction {value} is out of range: every alpha on the simplex has ESS >= "
                f"min_i n_i = {sizes_np.min():g}, i.e. fraction >= {every_alpha:.6g} of "
                f"N = {sizes_np.sum():g}; the reachable range [ESS(alpha^(0+))/N, 1] starts "
                "there or higher."
            )
    dists, target, sizes = map(_float_array, problem)
    if concrete:
        ends = (-jnp.inf, LOG10_LAM_RANGE[0])
        lowest = max(float(_ess_fraction_at(end, dists, target, sizes)) for end in ends)
        # Round-off slack of the solver near lam = 0.
        if not (lowest - 1e-4 <= value <= 1.0):
            raise ValueError(
                f"ESS fraction {value} is out of range: for these clients and target the reachable "
                f"fractions are [{lowest:.6g}, 1] (ESS(alpha^(0+))/N up to FedAvg)."
            )
    return _lambda_for_ess(dists, target, sizes, _float_array(fraction))
