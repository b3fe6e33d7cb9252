r"""Runs several algorithms over several seeds and prints a comparison table.

  python -m experiments.compare --dataset=fashion_mnist --labels_per_client=3 \
      --algorithms=fedavg,fedpals,fedprox,scaffold,oracle --seeds=0,1,2 \
      --rounds=30 --output_dir=runs/fmnist_c3

Takes every flag of experiments.run. Each run goes to
<output_dir>/<algorithm>/seed_<s>/ (and resumes there if interrupted); the
table, comparison.json and comparison.png go to <output_dir>.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging
import numpy as np

from experiments import run as run_lib

FLAGS = flags.FLAGS
flags.DEFINE_list("algorithms", ["fedavg", "fedpals"], "Algorithms to compare.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")


def _mean_std(values) -> str:
    values = 100 * np.asarray(values, dtype=float)
    return f"{values.mean():5.1f} +- {values.std():4.1f}"


def run_comparison(
    base_config: dict,
    algorithms: list[str],
    seeds: list[int],
    output_dir: str,
    *,
    overwrite: bool = False,
) -> dict:
    """Runs every (algorithm, seed); returns {algorithm: [results per seed]}."""
    if not algorithms or not seeds:
        raise ValueError("give at least one algorithm and one seed.")
    all_results = {}
    for algorithm in algorithms:
        for seed in seeds:
            config = {**base_config, "algorithm": algorithm, "seed": int(seed)}
            run_dir = os.path.join(output_dir, algorithm, f"seed_{seed}")
            results = run_lib.run_experiment(
                config, run_dir, overwrite=overwrite, log_prefix=f"[{algorithm} seed {seed}] "
            )
            all_results.setdefault(algorithm, []).append(results)
    return all_results


def comparison_table(all_results: dict) -> str:
    lines = [
        "| algorithm | final target acc (%) | target acc at best val (%) | "
        "ESS / N | d(T,S) | seconds/run |",
        "|---|---|---|---|---|---|",
    ]
    for algorithm, runs in all_results.items():
        ess = np.mean([r["ess"] / r["total_examples"] for r in runs])
        dist = np.mean([r["projection_distance"] for r in runs])
        secs = np.mean([r["wall_seconds"] for r in runs])
        lines.append(
            f"| {algorithm} | {_mean_std([r['final_target_accuracy'] for r in runs])} | "
            f"{_mean_std([r['target_accuracy_at_best_val'] for r in runs])} | {ess:.2f} | "
            f"{dist:.3g} | {secs:.1f} |"
        )
    seeds = len(next(iter(all_results.values())))
    lines.append(f"\n(mean +- std over {seeds} seed(s); accuracy on the target test set)")
    return "\n".join(lines)


def comparison_title(all_results: dict) -> str:
    runs = next(iter(all_results.values()))
    description = runs[0]["partition"]["description"]
    # The partition's description names its seed; the comparison spans several.
    description = description.rsplit(", seed", 1)[0]
    return f"{description}; mean +- std over seeds {[r['config']['seed'] for r in runs]}"


def write_comparison(all_results: dict, output_dir: str, title: str) -> str:
    table = comparison_table(all_results)
    curves = {
        algorithm: {
            "rounds": runs[0]["rounds"],
            "target_accuracy": [r["target_accuracy"] for r in runs],
            "val_accuracy": [r["val_accuracy"] for r in runs],
        }
        for algorithm, runs in all_results.items()
    }
    run_lib.plot_curves(os.path.join(output_dir, "comparison.png"), curves, title)
    summary = {
        algorithm: {
            "final_target_accuracy": [r["final_target_accuracy"] for r in runs],
            "target_accuracy_at_best_val": [r["target_accuracy_at_best_val"] for r in runs],
            "seeds": [r["config"]["seed"] for r in runs],
        }
        for algorithm, runs in all_results.items()
    }
    with open(os.path.join(output_dir, "comparison.json"), "w") as f:
        json.dump({"table": table, "results": summary}, f, indent=2)
    return table


def main(argv):
    del argv
    config = run_lib.config_from_flags()
    seeds = [int(s) for s in FLAGS.seeds]
    all_results = run_comparison(
        config, FLAGS.algorithms, seeds, FLAGS.output_dir, overwrite=FLAGS.overwrite
    )
    table = write_comparison(all_results, FLAGS.output_dir, comparison_title(all_results))
    logging.info("done")
    print(table)
    print(f"\nwrote {FLAGS.output_dir}/comparison.json and comparison.png")


if __name__ == "__main__":
    app.run(main)
