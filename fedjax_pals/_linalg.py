"""Dense linear algebra that cannot deadlock XLA's CPU thread pool when vmapped.

jaxlib 0.10.2's CPU LAPACK kernels (SVD, LU solve, ...) fan a batched call out to XLA's intra-op
thread pool and block the pool thread they run on until the batch is done. Two such calls at
once (a round computed on each of two host devices, or a vmapped runs axis whose program runs
pieces in parallel) can hold every pool thread waiting for work that no thread is free to run:
the process hangs with all threads asleep. Measured here (2 cores): FedPALS' weights vmapped
over 4 runs of 99 clients, run on two host devices, hung every time; one run at a time, or 16
runs of 9 clients, did not; a vmapped 99 x 99 solve hung at a batch of 16 and not at 4. jaxlib
0.11 compiles the parallel path out of open-source builds; PyPI has 0.10.2 at most.

An unbatched call runs inline on its thread. `jax.custom_batching.sequential_vmap` turns vmap of
these functions into a loop over the batch (`lax.map`), so every LAPACK call is unbatched. The
matrices here are small (clients x classes), so the loop costs little next to a round.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_batching.sequential_vmap
def thin_svd(matrix: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`jnp.linalg.svd(matrix, full_matrices=False)`; under vmap, one matrix at a time."""
    return jnp.linalg.svd(matrix, full_matrices=False)


@jax.custom_batching.sequential_vmap
def solve(matrix: jax.Array, rhs: jax.Array) -> jax.Array:
    """`jnp.linalg.solve(matrix, rhs)`; under vmap, one system at a time."""
    return jnp.linalg.solve(matrix, rhs)


@jax.custom_batching.sequential_vmap
def eigh(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`jnp.linalg.eigh(matrix)`; under vmap, one matrix at a time."""
    return jnp.linalg.eigh(matrix)


def _householder_qr(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Householder QR of a tall (M, K) matrix in plain XLA ops (no LAPACK call).

    Returns (U, R): the unit reflector vectors u_j as columns of U (Q = H_0 ... H_{K-1},
    H_j = I - u_j u_j^T) and the K x K upper-triangular R. K steps of O(M K).
    Rank-deficient matrices are fine (a zero column gives u_j = 0, H_j = I).
    """
    rows, cols = matrix.shape
    index = jnp.arange(rows)

    def step(j, carry):
        a, reflectors = carry
        x = jnp.where(index >= j, a[:, j], 0.0)
        norm = jnp.sqrt(x @ x)
        pivot = a[j, j]
        v = x + jnp.where(index == j, jnp.where(pivot >= 0, norm, -norm), 0.0)
        v_norm2 = v @ v
        u = v * jnp.where(v_norm2 > 0, jnp.sqrt(2.0 / jnp.where(v_norm2 > 0, v_norm2, 1.0)), 0.0)
        a = a - jnp.outer(u, u @ a)
        return a, reflectors.at[:, j].set(u)

    a, reflectors = jax.lax.fori_loop(0, cols, step, (matrix, jnp.zeros_like(matrix)))
    return reflectors, jnp.triu(a[:cols])


def tall_thin_svd(matrix: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The thin SVD of a tall (M, K) matrix, M >= K, through a Householder QR, left factor implicit.

    `jnp.linalg.svd` and `jnp.linalg.qr` of a 1,000-10,000 x 10 float32 matrix took
    15-300 ms on this (loaded, 2-core) CPU, erratically: LAPACK's blocked kernels fan
    out to threads. Here A = Q R by K Householder reflections in plain XLA ops (O(M K^2)),
    then R = U_R diag(sigma) V^T by LAPACK on K x K (`thin_svd`, microseconds), and
    A = Q [U_R; 0] diag(sigma) V^T. Householder QR is backward stable, so the factors are as
    accurate as a direct SVD's.

    Returns (reflectors, u_r, sigma, v_t): the left singular vectors are
    `apply_reflectors(reflectors, B)` with B = [u_r; 0] (M, K); products with them need
    only matrix-vector work (`apply_reflectors`, `apply_reflectors_transposed`), O(M K)
    per vector, where forming them cost another K passes over an (M, K) matrix.
    Matrices with fewer than 2 K rows go to `thin_svd` with zero reflectors (Q = I) and
    u_r its (M, min(M, K)) left factor.
    """
    rows, cols = matrix.shape[-2:]
    if rows < 2 * cols:
        u, sigma, v_t = thin_svd(matrix)
        return jnp.zeros((rows, cols), matrix.dtype), u, sigma, v_t
    reflectors, r = _householder_qr(matrix)
    u_r, sigma, v_t = thin_svd(r)
    return reflectors, u_r, sigma, v_t


def apply_reflectors(reflectors: jax.Array, x: jax.Array) -> jax.Array:
    """Q x = H_0 (H_1 (... H_{K-1} x)) for the reflectors of `_householder_qr` (x: (M, c))."""
    cols = reflectors.shape[1]

    def apply(j, x):
        u = reflectors[:, cols - 1 - j]
        return x - jnp.outer(u, u @ x)

    return jax.lax.fori_loop(0, cols, apply, x)


def apply_reflectors_transposed(reflectors: jax.Array, x: jax.Array) -> jax.Array:
    """Q^T x = H_{K-1} (... H_0 x) (x: (M,) or (M, c))."""

    def apply(j, x):
        u = reflectors[:, j]
        return x - jnp.outer(u, u @ x).reshape(x.shape)

    return jax.lax.fori_loop(0, reflectors.shape[1], apply, x)
