"""Rounds of several algorithms on every backend, for the mesh tests.

Run as a program (`python tests/mesh_worker.py --cpu_devices=N`, or under
`python -m fedjax_pals.launch`) it sets up the devices, runs `run_cases()`
and prints one JSON line with the final params of each case. tests/test_mesh.py
compares that with `run_cases()` run in its own one-device process.
"""

from __future__ import annotations

import argparse
import json
import sys


def _task(seed, sizes, input_shape, num_classes=3):
    import numpy as np

    rng = np.random.default_rng(seed)
    total = int(np.sum(sizes))
    x = rng.normal(size=(total, *input_shape)).astype(np.float32)
    y = rng.integers(0, num_classes, size=total).astype(np.int32)
    rows = np.zeros((len(sizes), max(sizes)), np.int32)
    perm = rng.permutation(total)
    start = 0
    for i, n in enumerate(sizes):
        rows[i, :n] = perm[start : start + n]
        start += n
    counts = np.stack(
        [np.bincount(y[rows[i, :n]], minlength=num_classes) + 1 for i, n in enumerate(sizes)]
    )
    return x, y, rows, np.asarray(sizes), counts / counts.sum(1, keepdims=True)


# Unequal client sizes; rounds with partial participation (the sample changes each round).
SIZES = [5, 9, 2, 7, 3, 6, 4]
PARTICIPANTS = [[0, 2, 3, 5, 6], [1, 2, 4, 5, 6], [0, 1, 3, 4, 6]]


def algorithms():
    import numpy as np

    import fedjax_pals as fjp

    target = np.array([0.6, 0.3, 0.1])
    return {
        "fedavg": fjp.fedavg(),
        "fedpals": fjp.fedpals(target, 0.01),  # weights re-solved for each round's sample
        "scaffold": fjp.scaffold(server_lr=1.0),  # per-client control variates
        "afl": fjp.afl(0.1),  # per-client mixture weights in the state
    }


def cases(size: str = "full"):
    """(name, model name, algorithm name, backend) of the case set `size`.

    "minimal": every backend with FedPALS; "quick": also the stateful
    algorithms (SCAFFOLD, AFL) and FedAvg on the CPU default; "full": also every
    algorithm on the accelerator default.
    """
    import fedjax_pals as fjp

    out = [(f"logreg/fedpals/{b}", "logreg", "fedpals", b) for b in fjp.engine.BACKENDS]
    if size in ("quick", "full"):
        out += [(f"logreg/{a}/host_loop", "logreg", a, "host_loop") for a in algorithms()]
    if size == "full":
        out += [(f"logreg/{a}/vmap_scan", "logreg", a, "vmap_scan") for a in algorithms()]
    return list(dict.fromkeys(out))


def run_cases(size: str = "full") -> dict[str, list[float]]:
    import jax
    import numpy as np

    import fedjax_pals as fjp

    models = {"logreg": (fjp.logistic_regression((4,), 3), (4,))}
    results = {}
    import time

    for name, model_name, algorithm_name, backend in cases(size):
        started = time.perf_counter()
        model, shape = models[model_name]
        x, y, rows, sizes, dists = _task(0, SIZES, shape)
        algorithm = algorithms()[algorithm_name]
        training = fjp.LocalTraining(local_epochs=2, batch_size=4, learning_rate=0.1)
        # min_clients_per_device=1: split even these few clients over the devices.
        engine = fjp.engine.round_engine(
            algorithm, model, training, backend=backend, chunk_size=3, min_clients_per_device=1
        )
        data = fjp.engine.device_data(x, y, rows, sizes, dists)
        state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(1)), len(SIZES))
        for r, who in enumerate(PARTICIPANTS):
            state, _ = engine.run_round(data, state, np.asarray(who), jax.random.PRNGKey(r))
        final = fjp.engine.local_view(
            (algorithm.eval_params(state), state.client_states, state.algorithm_state)
        )
        results[name] = [
            float(v) for leaf in jax.tree_util.tree_leaves(final) for v in np.ravel(leaf)
        ]
        print(f"{name}: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    for backend in RUNS_BACKENDS:
        results[f"runs/fedpals/{backend}"] = _runs_case(backend)
    return results


RUNS_BACKENDS = ("vmap_scan", "host_loop")


def num_results(size: str) -> int:
    return len(cases(size)) + len(RUNS_BACKENDS)


def _runs_case(backend: str) -> list[float]:
    """Three FedPALS runs (other seeds, T and lambda) through the runs axis."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import fedjax_pals as fjp

    model = fjp.logistic_regression((4,), 3)
    x, y, rows, sizes, dists = _task(1, SIZES, (4,))
    targets = [np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.2, 0.6]), np.array([1 / 3] * 3)]
    runs = [fjp.fedpals(t, lam) for t, lam in zip(targets, [0.0, 0.05, 1.0])]
    training = fjp.LocalTraining(local_epochs=2, batch_size=4, learning_rate=0.1)
    engine = fjp.engine.round_engine(
        runs[0], model, training, backend=backend, chunk_size=3, min_clients_per_device=1
    )
    stack = lambda *trees: jax.tree_util.tree_map(lambda *l: jnp.stack(l), *trees)
    states = stack(
        *[
            fjp.init_server_state(a, model.init(jax.random.PRNGKey(10 + r)), len(SIZES))
            for r, a in enumerate(runs)
        ]
    )
    data = fjp.engine.device_data(x, y, *[np.stack([t] * 3) for t in (rows, sizes, dists)])
    for r, who in enumerate(PARTICIPANTS):
        keys = jnp.stack([jax.random.PRNGKey(100 * run + r) for run in range(3)])
        states, _ = engine.run_rounds(data, states, np.stack([who] * 3), keys)
    leaves = jax.tree_util.tree_leaves(fjp.engine.local_view(states.params))
    return [float(v) for leaf in leaves for v in np.ravel(leaf)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu_devices", type=int, default=None)
    parser.add_argument("--cases", choices=("minimal", "quick", "full"), default="full")
    args = parser.parse_args(argv)
    from fedjax_pals import runtime

    runtime.configure_runtime(cpu_devices=args.cpu_devices)
    import jax

    results = run_cases(args.cases)
    print(
        json.dumps(
            {
                "process_index": jax.process_index(),
                "process_count": jax.process_count(),
                "device_count": jax.device_count(),
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
