r"""FedPALS' aggregation weights for lambda = 0 and at ESS 10/25/50/75 % of N beside FedAvg's, clients
sorted by size (the kind of picture of the paper's Fig. 4-5). No training: the partition and eq. 8.

  python -m experiments.weights --config=configs/default.py --workdir=runs/weights \
      --config.partition.scheme=niid_bench_sparsity --config.partition.labels_per_client=3

Builds the config's task (data set, partition, the server's T), solves lambda_for_ess for each
fraction (a fraction below ESS(alpha^{0+}) / N is out of reach and is named in the output
instead) and alpha^lambda (eq. 8), prints the weights as a table (client, n_i, FedAvg's
n_i / N, alpha at lambda = 0 and per reachable ESS fraction; then each column's ESS / N and
lambda) and the fractions out of reach with the reachable range, and writes
<workdir>/weights.png and weights.json (sizes, T, and per fraction lambda, alpha and its ESS).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_CONFIG = common.define_config_file("config", None, "Run config file (configs/*.py).")
_FRACTIONS = flags.DEFINE_list(
    "ess_fractions", ["0.1", "0.25", "0.5", "0.75"], "ESS fractions of N whose weights to draw."
)
flags.mark_flags_as_required(["config", "workdir"])
common.check_number_list(
    _FRACTIONS, 0.0, 1.0, include_low=False, meaning="an ESS fraction of N: ESS(alpha) <= N"
)


def main(argv):
    del argv  # a stray argument is refused by common.run
    common.configure_runtime()
    started = time.time()
    config = _CONFIG.value
    config.algorithm.name = "fedavg"  # the task's partition and T; no FedPALS run is built
    with common.user_errors():
        task = fjp.build_task(config)
    partition = task.partition
    dists, sizes = partition.client_label_dists, partition.client_sizes
    target = task.target_label_dist
    alphas, record, unreachable = {}, [], []
    # The lambda -> 0 end of the path: the projection of T onto Conv(S) (eq. 7).
    alpha = np.asarray(fjp.fedpals_weights(dists, target, sizes, 0.0), np.float64)
    ess = float(fjp.effective_sample_size(alpha, sizes))
    alphas[f"λ = 0 (ESS {100 * ess / np.sum(sizes):.0f} %)"] = alpha
    record.append(dict(fraction=None, lam=0.0, alpha=alpha.tolist(), ess=ess))
    for text in _FRACTIONS.value:
        fraction = float(text)
        try:
            lam = float(fjp.lambda_for_ess(dists, target, sizes, fraction))
        except ValueError as error:
            if "out of range" not in str(error):
                raise
            unreachable.append(fraction)
            continue
        alpha = np.asarray(fjp.fedpals_weights(dists, target, sizes, lam), np.float64)
        ess = float(fjp.effective_sample_size(alpha, sizes))
        alphas[f"ESS {100 * fraction:g} % (λ = {lam:.4g})"] = alpha
        record.append(dict(fraction=fraction, lam=lam, alpha=alpha.tolist(), ess=ess))
    workdir = common.WORKDIR.value
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "weights.png")
    title = f"{partition.description}: FedPALS weights vs FedAvg"
    if unreachable:
        title += f" (ESS {', '.join(f'{100 * f:g}' for f in unreachable)} % out of reach)"
    fjp.experiment.plots.plot_weights_vs_ess(path, sizes, alphas, title=title)
    with open(os.path.join(workdir, "weights.json"), "w") as f:
        json.dump(
            dict(
                partition=partition.description,
                client_sizes=np.asarray(sizes).tolist(),
                target_label_dist=np.asarray(target).tolist(),
                weights=record,
                unreachable_fractions=unreachable,
            ),
            f,
            indent=1,
        )
    print(alpha_table(partition.description, sizes, record, unreachable, dists, target))
    common.print_written(workdir, started)


def reachable_low(dists, target, sizes) -> float:
    """The lowest ESS fraction lambda_for_ess reaches: ESS(alpha^(0+)) / N, alpha^(0+) taken
    at lambda = 0 and at 1e-6 N as `fjp.lambda_for_ess` does."""
    total = float(np.sum(sizes))
    return max(
        float(fjp.effective_sample_size(fjp.fedpals_weights(dists, target, sizes, lam), sizes))
        for lam in (0.0, 1e-6 * total)
    ) / total


def alpha_table(description, sizes, record, unreachable, dists, target) -> str:
    """The weights as a text table: a row per client (n_i, FedAvg's n_i / N, FedPALS' alpha
    at lambda = 0 and at each reached ESS fraction), then each column's ESS / N and lambda;
    then the fractions out of reach and the reachable range."""
    sizes = np.asarray(sizes, dtype=float)
    total = float(sizes.sum())
    columns = [("FedAvg", sizes / total, 1.0, float("inf"))]
    for entry in record:
        name = "λ = 0" if entry["fraction"] is None else f"ESS {100 * entry['fraction']:g} %"
        columns.append((name, np.asarray(entry["alpha"]), entry["ess"] / total, entry["lam"]))
    width = max(9, *(len(name) + 2 for name, *_ in columns))
    header = f"{'client':>6} {'n_i':>8}" + "".join(f"{name:>{width}}" for name, *_ in columns)
    lines = [f"{description}: aggregation weights alpha (N = {total:g})", header]
    for i, size in enumerate(sizes):
        lines.append(
            f"{i:>6} {size:>8g}" + "".join(f"{alpha[i]:>{width}.3f}" for _, alpha, *_ in columns)
        )
    lines.append(
        f"{'ESS / N':>15}" + "".join(f"{100 * e:>{width - 2}.1f} %" for *_, e, _ in columns)
    )
    lines.append(f"{'λ':>15}" + "".join(f"{lam:>{width}.4g}" for *_, lam in columns))
    if unreachable:
        low = reachable_low(dists, target, sizes)
        listed = ", ".join(f"{100 * f:g}" for f in unreachable)
        lines.append(
            f"out of reach: ESS {listed} % of N; reachable for these clients and T: "
            f"{100 * low:.1f} % (λ = 0) to 100 % (FedAvg) of N"
        )
    return "\n".join(lines)


def entry() -> None:
    """The `fedjax-pals-weights` command (`python -m experiments.weights`)."""
    common.run(main, takes=common.WRITES + common.RUNTIME)


if __name__ == "__main__":
    entry()
