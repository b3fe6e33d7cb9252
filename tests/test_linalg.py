"""CPU linear algebra that stays deadlock-free under vmap (`fedjax_pals._linalg`)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pals import _linalg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_vmapped_thin_svd_reconstructs_each_matrix_as_numpy_does():
    rng = np.random.default_rng()
    matrices = rng.normal(size=(3, 40, 6))
    u, sigma, v_t = jax.vmap(_linalg.thin_svd)(jnp.asarray(matrices, jnp.float32))
    assert u.shape == (3, 40, 6) and sigma.shape == (3, 6) and v_t.shape == (3, 6, 6)
    for b in range(3):
        reference = np.linalg.svd(matrices[b], compute_uv=False)
        scale = reference[0]
        np.testing.assert_allclose(sigma[b], reference, atol=1e-5 * scale)
        np.testing.assert_allclose(
            (u[b] * sigma[b]) @ v_t[b], matrices[b], atol=1e-5 * scale * np.sqrt(40)
        )


def test_vmapped_solve_matches_float64_numpy_with_nested_batches():
    rng = np.random.default_rng()
    matrices = rng.normal(size=(2, 3, 12, 12)) + 6 * np.eye(12)
    rhs = rng.normal(size=(2, 3, 12, 2))
    solved = jax.vmap(jax.vmap(_linalg.solve))(
        jnp.asarray(matrices, jnp.float32), jnp.asarray(rhs, jnp.float32)
    )
    reference = np.linalg.solve(matrices, rhs)
    cond = max(np.linalg.cond(m) for m in matrices.reshape(-1, 12, 12))
    np.testing.assert_allclose(solved, reference, atol=50 * cond * 1.2e-7 * np.abs(reference).max())


# FedPALS' weights for 4 runs of 99 clients, vmapped, computed on two host devices at once:
# with jnp.linalg's batched kernels this hung every time on jaxlib 0.10.2 (see _linalg).
_CONCURRENT_SOLVES = textwrap.dedent("""
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import numpy as np
    import fedjax_pals as fjp

    runs, clients, classes = 4, 99, 10
    rng = np.random.default_rng(0)
    solve = jax.jit(jax.vmap(fjp.fedpals_weights))
    for _ in range(4):
        problem = (
            rng.dirichlet(np.full(classes, 0.3), size=(runs, clients)).astype(np.float32),
            rng.dirichlet(np.full(classes, 0.3), size=runs).astype(np.float32),
            rng.integers(100, 1000, size=(runs, clients)).astype(np.float32),
            np.full(runs, 100.0, np.float32),
        )
        outs = [solve(*jax.device_put(problem, d)) for d in jax.devices()]
        for out in outs:
            np.testing.assert_allclose(np.asarray(out).sum(axis=1), 1.0, atol=1e-5)
    print("done")
    """)


@pytest.mark.integration
def test_weights_vmapped_over_runs_on_two_devices_at_once_do_not_deadlock():
    try:
        completed = subprocess.run(
            [sys.executable, "-c", _CONCURRENT_SOLVES],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("concurrent vmapped FedPALS solves on two host devices hung (> 120 s)")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().endswith("done")


def test_every_traced_lapack_call_of_the_package_goes_through_linalg():
    """jnp.linalg's decompositions and solves (LAPACK on the CPU) are called through
    `_linalg` only, whose wrappers are unbatched under vmap (NumPy's, on the host, are not
    traced and may stay)."""
    import glob
    import re

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fedjax_pals")
    lapack = re.compile(
        r"\b(jnp|jax\.numpy|jax\.scipy)\.linalg\.(svd|solve|eigh|eigvalsh|eig|qr|inv|lstsq|"
        r"cholesky|lu|pinv|matrix_rank|det|slogdet|cho_solve|lu_solve)\b")
    calls = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        if os.path.basename(path) == "_linalg.py":
            continue
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if lapack.search(line.split("#")[0]):
                    calls.append(f"{os.path.relpath(path, root)}:{number}: {line.strip()}")
    assert not calls, "call these through fedjax_pals/_linalg.py:\n" + "\n".join(calls)
