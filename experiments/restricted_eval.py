r"""Re-evaluates a sweep's finished runs with the target's restricted softmax at test time.

  python -m experiments.restricted_eval --workdir=runs/fedrs_restricted_eval \
      --sweeps=runs/table1_c3,runs/table1_c2 --methods=fedrs,fedavg --alphas=0.5,0.1,0

FedRS (Li & Zhan, KDD 2021) scales, during a client's local training, the logits of the
classes that client lacks by alpha. Evaluated on the target the usual way (the global model's
plain logits), our FedRS sits near FedAvg on Fashion-MNIST, far under the FedPALS paper's
Table 1. This asks whether the paper's number is the one of FedRS evaluated as the *target's*
client, i.e. with the target's own restriction at test time:

    prediction = argmax_k a_k z_k,   a_k = 1 if T(k) > 0 else alpha,

z the global model's logits (for AFL its evaluated iterate). alpha = 1 is the plain
evaluation; alpha = 0 predicts only labels the target holds. No training: every run's final
state is restored from its checkpoint (`fjp.restore_run(run_dir, which="last")`).

Reads the finished runs of `--methods` in each of `--sweeps` (sweep workdirs) and writes
<workdir>/restricted_eval.json (per run, and per sweep, method and grid point: plain and
restricted accuracy at the final round, mean and std over seeds) and restricted_eval.md.
"""

from __future__ import annotations

import glob
import json
import os
import time

import numpy as np
from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_SWEEPS = flags.DEFINE_list("sweeps", None, "Sweep workdirs whose runs to re-evaluate.")
_METHODS = flags.DEFINE_list("methods", ["fedrs", "fedavg"], "Method directories under runs/.")
_ALPHAS = flags.DEFINE_list("alphas", ["0.5"], "Scalings a_k of the target's absent classes.")
flags.mark_flags_as_required(["workdir", "sweeps"])
common.require_items(_SWEEPS, "sweep workdir")
common.require_items(_METHODS, "method")
common.require_items(_ALPHAS, "scaling")
common.check_number_list(
    _ALPHAS, 0.0, 1.0, include_high=False, meaning="the scaling of the absent classes' logits"
)

_BATCH = 1024


def _final_params(run_dir: str) -> tuple:
    """The task and the evaluated params of the run's last checkpoint (nothing is trained)."""
    run = fjp.restore_run(run_dir, which="last")
    if run.round != run.config.training.rounds:
        raise ValueError(f"{run_dir} has no checkpoint of its last round.")
    return run.task, run.params


def restricted_accuracies(logits: np.ndarray, labels: np.ndarray, target, alphas) -> dict:
    """Accuracy of argmax_k a_k z_k for each alpha (a_k = 1 on T's support, alpha off it)."""
    support = np.asarray(target) > 0
    return {
        alpha: float(np.mean(np.argmax(logits * np.where(support, 1.0, alpha), -1) == labels))
        for alpha in alphas
    }


def evaluate_run(run_dir: str, alphas) -> dict:
    import jax  # here, not at the top: --help prints without JAX
    import jax.numpy as jnp

    with open(os.path.join(run_dir, "results.json")) as f:
        results = json.load(f)
    task, params = _final_params(run_dir)
    indices = task.partition.target_test_indices
    x, y = task.dataset.test.x[indices], task.dataset.test.y[indices]
    apply = jax.jit(task.model.apply)
    logits = np.concatenate(
        [
            np.asarray(apply(params, jnp.asarray(x[i : i + _BATCH])))
            for i in range(0, len(y), _BATCH)
        ]
    )
    restricted = restricted_accuracies(logits, y, task.target_label_dist, (1.0, *alphas))
    return dict(
        plain=restricted.pop(1.0),
        recorded_final=results["target_accuracy"][-1],
        restricted={f"{a:g}": v for a, v in restricted.items()},
    )


def main(argv):
    del argv  # a stray argument is refused by common.run
    common.configure_runtime()
    started = time.time()
    alphas = [float(a) for a in _ALPHAS.value]  # checked while parsing (check_number_list)
    # Every sweep and method is found before any run's data is read.
    todo = []
    for sweep in _SWEEPS.value:
        if not os.path.isdir(os.path.join(sweep, "runs")):
            common.usage_error(f"--sweeps: {sweep} is not a sweep workdir (it has no runs/).")
        for method in _METHODS.value:
            pattern = os.path.join(sweep, "runs", method, "**", "results.json")
            found = sorted(os.path.dirname(p) for p in glob.glob(pattern, recursive=True))
            if not found:
                common.usage_error(f"--methods: no finished runs of {method!r} under {sweep}/runs.")
            todo += [(sweep, run_dir) for run_dir in found]
    runs, groups = {}, {}
    for sweep, run_dir in todo:
        name = os.path.join(
            os.path.basename(os.path.normpath(sweep)),
            os.path.relpath(run_dir, os.path.join(sweep, "runs")),
        )
        runs[name] = record = evaluate_run(run_dir, alphas)
        groups.setdefault(os.path.dirname(name), []).append(record)
        print(name, json.dumps(record), flush=True)
    workdir = common.WORKDIR.value
    os.makedirs(workdir, exist_ok=True)
    summary = {}
    lines = [
        "Target test accuracy (%) at the final round, mean ± std over seeds: the global model's",
        "plain logits, and with the target's restricted softmax (absent classes' logits x alpha).",
        "",
        "| sweep / method / point | seeds | plain | "
        + " | ".join(f"alpha={a:g}" for a in alphas)
        + " |",
        "|---|---|---|" + "---|" * len(alphas),
    ]
    for group, records in groups.items():
        columns = {"plain": [r["plain"] for r in records]}
        for a in alphas:
            columns[f"{a:g}"] = [r["restricted"][f"{a:g}"] for r in records]
        summary[group] = {
            k: dict(mean=float(np.mean(v)), std=float(np.std(v))) for k, v in columns.items()
        }
        cells = [f"{100 * np.mean(v):.1f} ± {100 * np.std(v):.1f}" for v in columns.values()]
        lines.append(f"| {group} | {len(records)} | " + " | ".join(cells) + " |")
    with open(os.path.join(workdir, "restricted_eval.json"), "w") as f:
        json.dump(dict(alphas=alphas, runs=runs, summary=summary), f, indent=1)
    with open(os.path.join(workdir, "restricted_eval.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print()
    common.print_written(workdir, started)


def entry() -> None:
    """The `fedjax-pals-restricted-eval` command (`python -m experiments.restricted_eval`)."""
    common.run(main, takes=common.WRITES + common.RUNTIME)


if __name__ == "__main__":
    entry()
