r"""Time of the FedPALS solve (eq. 8) against the number of clients M.

For every M: random client label distributions S (M x K, Dirichlet(0.5) rows),
a random target T (Dirichlet(1)) and sizes n_i uniform in [20, 2000); times
`fedpals_weights` at lam = 0 and at each lam / N in --lam_over_n, and
`lambda_for_ess` at --ess_fraction, as the compiled second call (the median of
--repeats calls after one warm-up call; compile time reported apart). Also
records the objective, the support size, and a float64 KKT residual of every
solution, so that a fast wrong answer shows. Writes JSON (one row per case) and
a PNG + PDF plot of solve time vs M. A mistake in the command line is one `error:` line and
exit status 2 before anything is solved.

Usage:
  python -m experiments.benchmarks.solve_time --output=results/solve_time.json
  python -m experiments.benchmarks.solve_time --num_clients=10,100,1000 --repeats=3
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time

from absl import flags
import numpy as np

from .. import cli

# The package, and with it JAX (10-57 s on a loaded machine), at its first use: --help prints
# before it (docs/decisions/0076-help-before-jax.md).
fjp = cli.lazy_import("fedjax_pals")

_NUM_CLIENTS = flags.DEFINE_list(
    "num_clients", ["10", "100", "1000", "10000", "100000"], "Numbers of clients M."
)
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 10, "Number of classes K.")
_LAM_OVER_N = flags.DEFINE_list(
    "lam_over_n", ["0", "1e-4", "1e-2"], "lam / N values for fedpals_weights (0 = lam 0)."
)
_ESS_FRACTION = flags.DEFINE_float(
    "ess_fraction", 0.5, "ESS fraction for lambda_for_ess (a few tens of solves); <= 0 skips it."
)
_ESS_MAX_CLIENTS = flags.DEFINE_integer(
    "ess_max_clients", 100000, "Largest M at which lambda_for_ess is timed."
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per case (median reported).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random problems.")
_OUTPUT = flags.DEFINE_string("output", "results/solve_time.json", "JSON output path.")
_PLOT = flags.DEFINE_string(
    "plot", "", "Plot path without extension (.png and .pdf); default: beside the JSON."
)

# Checked while absl parses: a mistake is one line before anything is solved.
cli.check_number_list(_NUM_CLIENTS, 1, integer=True, meaning="numbers of clients M")
cli.check_number_list(_LAM_OVER_N, 0, meaning="lam / N; 0: lam = 0")
cli.check_number(_NUM_CLASSES, 2)
cli.check_number(_ESS_FRACTION, -math.inf, 1, meaning="<= 0 skips lambda_for_ess")
cli.check_number(_ESS_MAX_CLIENTS, 1)
cli.check_number(_REPEATS, 1)
cli.require_value(_OUTPUT, "file path")


def problem(num_clients: int, num_classes: int, seed: int):
    rng = np.random.default_rng([seed, num_clients, num_classes])
    dists = rng.dirichlet(np.full(num_classes, 0.5), size=num_clients).astype(np.float32)
    target = rng.dirichlet(np.ones(num_classes)).astype(np.float32)
    sizes = rng.integers(20, 2000, size=num_clients).astype(np.float32)
    return dists, target, sizes


def kkt_residual(alpha, dists, target, sizes, lam) -> float:
    """Largest violation of eq. 8's KKT conditions at alpha, in float64 (0 at the optimum).

    g = -S r + lam alpha / n (half the gradient), mu = alpha^T g: |g_i - mu| on the
    support, max(0, mu - g_i) off it; alpha is first rescaled onto the simplex.
    """
    alpha = np.clip(np.asarray(alpha, np.float64), 0.0, None)
    alpha /= alpha.sum()
    dists, target, sizes = (np.asarray(a, np.float64) for a in (dists, target, sizes))
    residual = target - alpha @ dists
    grad = lam * alpha / sizes - dists @ residual
    mu = alpha @ grad
    on = np.abs(grad - mu)[alpha > 0]
    off = np.maximum(0.0, mu - grad)[alpha <= 0]
    return float(max(on.max(initial=0.0), off.max(initial=0.0)))


def timed(fn, repeats: int):
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return out, first, times


def run_case(num_clients, num_classes, seed, repeats, lam_over_n, ess_fraction):
    dists, target, sizes = problem(num_clients, num_classes, seed)
    total = float(sizes.sum())
    rows = []
    for ratio in lam_over_n:
        lam = ratio * total
        alpha, first, times = timed(lambda: fjp.fedpals_weights(dists, target, sizes, lam), repeats)
        alpha64 = np.asarray(alpha, np.float64)
        residual = target - alpha64 @ dists
        rows.append(
            dict(
                function="fedpals_weights",
                num_clients=num_clients,
                num_classes=num_classes,
                lam_over_n=ratio,
                lam=lam,
                seconds=statistics.median(times),
                seconds_min=min(times),
                seconds_max=max(times),
                first_call_seconds=first,
                objective=float(residual @ residual + lam * np.sum(alpha64**2 / sizes)),
                support=int((alpha64 > 0).sum()),
                ess_fraction=float(1.0 / np.sum(alpha64**2 / sizes) / total),
                kkt_residual=kkt_residual(alpha64, dists, target, sizes, lam),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    if ess_fraction is not None:
        try:
            lam, first, times = timed(
                lambda: fjp.lambda_for_ess(dists, target, sizes, ess_fraction), repeats
            )
            lam = float(lam)
            error = None
        except ValueError as exc:  # the fraction is out of this problem's reachable range
            lam, first, times, error = float("nan"), float("nan"), [float("nan")], str(exc)
        rows.append(
            dict(
                function="lambda_for_ess",
                num_clients=num_clients,
                num_classes=num_classes,
                ess_fraction_requested=ess_fraction,
                lam=lam,
                seconds=statistics.median(times),
                seconds_min=min(times),
                seconds_max=max(times),
                first_call_seconds=first,
                error=error,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(rows, path_without_extension: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series = {}
    for row in rows:
        if row["function"] == "fedpals_weights":
            label = f"fedpals_weights, lam/N = {row['lam_over_n']:g}"
        else:
            label = f"lambda_for_ess (ESS {row['ess_fraction_requested']:g} N)"
        series.setdefault(label, []).append((row["num_clients"], row["seconds"]))
    for label, points in series.items():
        points = sorted(p for p in points if np.isfinite(p[1]))
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clients M")
    ax.set_ylabel("seconds (compiled, median)")
    ax.set_title(f"FedPALS solve time, K = {rows[0]['num_classes']}, {platform.processor() or 'CPU'}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [path_without_extension + ".png", path_without_extension + ".pdf"]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def main(argv):
    del argv
    lam_over_n = [float(x) for x in _LAM_OVER_N.value]
    ess_fraction = _ESS_FRACTION.value if _ESS_FRACTION.value > 0 else None
    rows = []
    for num_clients in (int(m) for m in _NUM_CLIENTS.value):
        rows += run_case(
            num_clients,
            _NUM_CLASSES.value,
            _SEED.value,
            _REPEATS.value,
            lam_over_n,
            ess_fraction if num_clients <= _ESS_MAX_CLIENTS.value else None,
        )
    output = _OUTPUT.value
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    import jax

    meta = dict(
        jax=jax.__version__,
        platform=platform.platform(),
        processor=platform.processor(),
        cpu_count=os.cpu_count(),
        load_average=os.getloadavg(),
    )
    with open(output, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    paths = plot(rows, _PLOT.value or os.path.splitext(output)[0])
    print(f"wrote {output}, {', '.join(paths)}")


def entry() -> None:
    """The `fedjax-pals-benchmark-solve-time` command (`python -m experiments.benchmarks.solve_time`)."""
    cli.run(main)


if __name__ == "__main__":
    entry()
