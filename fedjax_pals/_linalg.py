"""Dense linear algebra that cannot deadlock XLA's CPU thread pool when vmapped.

jaxlib 0.10.2's CPU LAPACK kernels (SVD, LU solve, ...) fan a batched call out
to XLA's intra-op thread pool and block the pool thread they run on until the
batch is done. Two such calls at once (a round computed on each of two host
devices, or a vmapped runs axis whose program runs pieces in parallel) can hold
every pool thread waiting for work that no thread is free to run: the process
hangs with all threads asleep. Measured here (2 cores): FedPALS' weights
vmapped over 4 runs of 99 clients, run on two host devices, hung every time;
one run at a time, or 16 runs of 9 clients, did not; a vmapped 99 x 99 solve
hung at a batch of 16 and not at 4. jaxlib 0.11 compiles the parallel path out
of open-source builds; PyPI has 0.10.2 at most.

An unbatched call runs inline on its thread. `jax.custom_batching.sequential_vmap`
turns vmap of these functions into a loop over the batch (`lax.map`), so every
LAPACK call is unbatched. The matrices here are small (clients x classes), so
the loop costs little next to a round.
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
