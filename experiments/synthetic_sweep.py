r"""The paper's synthetic experiment (Fig. 9, App. C.4): accuracy vs d(T, S).

  python -m experiments.synthetic_sweep --deltas=0,0.25,0.5,0.75,1 --seeds=0,1,2,3,4

For each delta, FedPALS (lam = 0) and FedAvg train logistic regression on the
two synthetic clients; the target accuracy on 2000 target points is plotted
against the projection distance d(T_delta, S). Takes every flag of
experiments.run (rounds, learning rate, ...). Writes sweep.json and
accuracy_vs_distance.png to --output_dir.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
import numpy as np

from experiments import compare, run as run_lib

FLAGS = flags.FLAGS
flags.DEFINE_list("deltas", ["0", "0.25", "0.5", "0.75", "1"], "Values of delta.")
flags.DEFINE_list("sweep_algorithms", ["fedavg", "fedpals"], "Algorithms to sweep.")


def plot_sweep(path: str, sweep: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for index, (algorithm, points) in enumerate(sweep.items()):
        distance = [p["projection_distance"] for p in points]
        mean = [np.mean(p["target_accuracy"]) for p in points]
        std = [np.std(p["target_accuracy"]) for p in points]
        ax.errorbar(
            distance, mean, yerr=std, marker="o", capsize=3, color=f"C{index}", label=algorithm
        )
    ax.set_xlabel("projection distance d(T, S)")
    ax.set_ylabel("target accuracy")
    ax.set_title("Synthetic label shift (App. C.4), mean +- std over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    del argv
    base = run_lib.config_from_flags()
    base["dataset"] = "synthetic"
    seeds = [int(s) for s in FLAGS.seeds]
    sweep = {algorithm: [] for algorithm in FLAGS.sweep_algorithms}
    rows = [
        "| delta | d(T,S) | " + " | ".join(f"{a} acc (%)" for a in sweep) + " |",
        "|---|---|" + "---|" * len(sweep),
    ]
    for delta in (float(d) for d in FLAGS.deltas):
        results = compare.run_comparison(
            {**base, "delta": delta},
            FLAGS.sweep_algorithms,
            seeds,
            os.path.join(FLAGS.output_dir, f"delta_{delta:g}"),
            overwrite=FLAGS.overwrite,
        )
        cells = []
        for algorithm, runs in results.items():
            accuracies = [r["final_target_accuracy"] for r in runs]
            sweep[algorithm].append(
                {
                    "delta": delta,
                    "projection_distance": runs[0]["projection_distance"],
                    "target_accuracy": accuracies,
                }
            )
            cells.append(f"{100 * np.mean(accuracies):.1f} +- {100 * np.std(accuracies):.1f}")
        rows.append(
            f"| {delta:g} | {runs[0]['projection_distance']:.4f} | " + " | ".join(cells) + " |"
        )
    with open(os.path.join(FLAGS.output_dir, "sweep.json"), "w") as f:
        json.dump(sweep, f, indent=2)
    plot_sweep(os.path.join(FLAGS.output_dir, "accuracy_vs_distance.png"), sweep)
    print("\n".join(rows))
    print(
        f"\n(final target accuracy, mean +- std over seeds {seeds}; wrote "
        f"{FLAGS.output_dir}/accuracy_vs_distance.png)"
    )


if __name__ == "__main__":
    app.run(main)
