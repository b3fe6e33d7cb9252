r"""The DP-on-updates experiment's report: target accuracy against epsilon for FedAvg and
FedPALS at each ESS fraction, the noise each needed, and the figure.

  python -m experiments.sweep --config=configs/beyond_private_updates.py \
      --workdir=runs/beyond_private_updates
  python -m experiments.dp_updates_report --sweep=runs/beyond_private_updates \
      --workdir=runs/beyond_private_updates_report

Reads every run's results.json (and metrics.jsonl, for the weights of each round) under the
sweep's runs/ (--sweep; finished, diverged and unfinished runs alike: a partial sweep gives a
partial report that says so) and writes into --workdir dp_updates.md (the tables below),
dp_updates.json (the same numbers) and the figure (--figure, default
<workdir>/dp_updates_accuracy_vs_epsilon.png, with its PDF): target test accuracy at the
best-validation round (as Table 1), mean ± std over seeds, against epsilon on a log2 axis with
no DP at its right end, one line per method and ESS fraction. Unlike the sweep's table (one
selected ESS per epsilon), every ESS is shown. The tables:

* accuracy per epsilon, with the noise multiplier sigma each epsilon was calibrated to, the
  ESS fraction of the highest mean test accuracy, and the one the protocol selects on the
  validation set (highest mean validation accuracy);
* the weights' cost: per round the largest weight max_i alpha_i of the participants (mean
  over rounds and seeds, from metrics.jsonl; under Poisson sampling max_i alpha_i / q over
  every client, from results.json, the weight the noise is scaled to), the aggregate's noise
  std per coordinate sigma * C * max_i alpha_i and its L2 norm over the model's parameters,
  against FedAvg's;
* every seed's accuracy, and the runs that diverged (TrainingDivergedError) or have not ended.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import time

import numpy as np
from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

FIGURE = "dp_updates_accuracy_vs_epsilon.png"
# Input shapes of the built-in image data sets (for the model's parameter count).
_INPUT_SHAPES = {"fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def _finished(results: dict) -> bool:
    rounds = results.get("rounds") or []
    return bool(rounds) and rounds[-1] == results["config"]["training"]["rounds"]


def _read_runs(sweep_dir: str) -> list[dict]:
    """One record per run directory: its config facts, its status and its results."""
    records = []
    for path in sorted(glob.glob(os.path.join(sweep_dir, "runs", "**", "hparams.json"),
                              recursive=True)):
        run_dir = os.path.dirname(path)
        try:
            with open(os.path.join(run_dir, "results.json")) as f:
                results = json.load(f)
        except (OSError, ValueError):
            results = None
        error = ""
        if os.path.exists(os.path.join(run_dir, "error.txt")):
            with open(os.path.join(run_dir, "error.txt")) as f:
                error = f.read()
        if results is not None and _finished(results):
            status = "done"
        elif "TrainingDivergedError" in error:
            status = "diverged"
        else:
            status = "not ended"
        config = (results or {}).get("config")
        if config is None:
            continue  # nothing recorded yet: the run has not started
        algorithm = config["algorithm"]
        records.append(dict(
            dir=run_dir,
            name=os.path.relpath(run_dir, os.path.join(sweep_dir, "runs")),
            method=algorithm["name"],
            ess=algorithm.get("ess_fraction"),
            epsilon=algorithm.get("dp_target_epsilon"),
            clip=algorithm.get("dp_clip_norm"),
            seed=int(config["seed"]),
            status=status,
            results=results,
            error=error,
        ))
    if not records:
        raise SystemExit(f"error: no run (results.json) under {sweep_dir}/runs")
    return records


def _line(record: dict) -> str:
    label = fjp.method_label(record["method"])
    if record["ess"] is not None:
        label += f" (ESS {100 * record['ess']:g} %)"
    return label


def _max_alpha(run_dir: str) -> float | None:
    """The mean over the run's rounds of max_i alpha_i (metrics.jsonl's server/alpha)."""
    values = []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                row = json.loads(line)
                if "server/alpha" in row:
                    values.append(max(row["server/alpha"]))
    except (OSError, ValueError):
        return None
    return float(np.mean(values)) if values else None


def _participation(config: dict, rate: float | None) -> str:
    """How the clients take part (`rate`: Poisson sampling's q, or None), as the report's
    headings say it."""
    lanes = config["training"]["clients_per_round"]
    if rate is None:
        return f"{lanes} a round"
    return f"each with probability q = {rate:g} a round (Poisson, {lanes} lanes)"


def _sensitivity_weight(record: dict, rate: float | None) -> float | None:
    """The weight the run's noise is scaled to, per round: max_i alpha_i of the participants
    (mean over rounds), or under Poisson sampling max_i alpha_i / q over every client."""
    if rate is None:
        return _max_alpha(record["dir"])
    alpha = (record.get("results") or {}).get("alpha")
    return max(alpha) / rate if alpha else None


def _num_params(results: dict) -> int | None:
    config = results["config"]
    shape = _INPUT_SHAPES.get(config["dataset"]["name"])
    if shape is None:
        return None
    import jax

    model = fjp.make_model(config["model"], shape, len(results["partition"]["target_label_dist"]))
    params = model.init(jax.random.PRNGKey(0))
    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)))


def _diverged_at(record: dict) -> str:
    """"d<round>": the round a diverged run stopped in (TrainingDivergedError's message)."""
    match = re.search(r"diverged in round (\d+)", record["error"])
    return f"d{match.group(1)}" if match else "d"


def _eps_label(epsilon) -> str:
    return "no DP" if epsilon is None else f"{epsilon:g}"


def _sample_std(values) -> float:
    """The sample standard deviation (ddof 1); 0 for a single value."""
    values = np.asarray(values, float)
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _cell(values) -> str:
    values = 100 * np.asarray(values, float)
    return f"{values.mean():.1f} ± {_sample_std(values):.1f}" if len(values) else "-"


def _last_rounds_mean(results: dict, last: int) -> float:
    """Mean target accuracy over the evaluated rounds among the run's last `last` rounds."""
    rounds = np.asarray(results["rounds"])
    accuracy = np.asarray(results["target_accuracy"], float)
    return float(accuracy[rounds > rounds[-1] - last].mean())


def _layout(runs: list[dict]) -> str:
    """How a cell's runs were trained: the sizes of the programs they shared (results.json's
    program_runs), the backend and host devices."""
    sizes = sorted({r["results"].get("program_runs", 1) for r in runs if r.get("results")})
    engines = sorted({f"{e['backend']} on {e['devices']} device{'s' * (e['devices'] != 1)}"
                      for r in runs if r.get("results")
                      for e in r["results"].get("engine", [])})
    if not sizes:
        return "-"
    return f"programs of {'/'.join(map(str, sizes))} runs, {'; '.join(engines)}"


def report(sweep_dir: str, figure: str) -> tuple[str, dict]:
    records = _read_runs(sweep_dir)
    lines_order = sorted(
        {(r["method"] != "fedavg", r["ess"] or 0.0, _line(r)) for r in records}
    )
    labels = [label for _, _, label in lines_order]
    epsilons = sorted({r["epsilon"] for r in records}, key=lambda e: (e is not None, -(e or 0)))
    cells: dict = {}
    for r in records:
        cells.setdefault((_line(r), r["epsilon"]), []).append(r)
    done = [r for r in records if r["status"] == "done"]
    any_done = done[0]["results"] if done else records[0]["results"]
    config = any_done["config"]
    rounds = config["training"]["rounds"]
    rate = fjp.experiment.config.sampling_rate(config["training"])
    seeds = sorted({r["seed"] for r in records})
    sigma = {}
    for r in done:
        if r["epsilon"] is not None:
            sigma.setdefault(r["epsilon"], set()).add(round(r["results"]["dp_noise_multiplier"], 4))
    clip = next((r["clip"] for r in records if r["clip"] is not None), None)
    delta = next((r["results"].get("dp_delta") for r in done if r["results"].get("dp_delta")),
                 None)
    head = "| | " + " | ".join(f"ε = {_eps_label(e)}" if e is not None else "no DP"
                               for e in epsilons) + " |"
    rule = "|---|" + "---|" * len(epsilons)
    text = [
        f"**{any_done['partition'].get('num_clients', '?')} training clients, "
        f"{_participation(config, rate)}, {rounds} rounds, seeds "
        f"{', '.join(map(str, seeds))}; clip norm C = {clip}, δ = {delta}** ({sweep_dir}). "
        "Target test accuracy (%) at the best-validation round, mean ± sample std over seeds "
        "(ddof 1); a cell with diverged runs gives the others' mean and how many diverged.",
        "",
        head,
        rule,
        "| noise multiplier σ (calibrated) | " + " | ".join(
            "0" if e is None else "/".join(f"{s:.3g}" for s in sorted(sigma.get(e, ()))) or "-"
            for e in epsilons) + " |",
    ]
    summary: dict = {"rounds": rounds, "seeds": seeds, "clip_norm": clip, "delta": delta,
                     "sigma": {_eps_label(e): sorted(sigma.get(e, ())) for e in epsilons},
                     "cells": {}}
    means: dict = {}  # (line, epsilon) -> mean test accuracy, where every seed ended
    selectable: dict = {}  # (line, epsilon) -> {seed: (validation, test)} of the runs that ended
    for label in labels:
        row = []
        for e in epsilons:
            runs = cells.get((label, e), [])
            ok = [r for r in runs if r["status"] == "done"]
            diverged = [r for r in runs if r["status"] == "diverged"]
            accuracy = [r["results"]["target_accuracy_at_best_val"] for r in ok]
            validation = [r["results"]["val_accuracy"][r["results"]["rounds"].index(
                r["results"]["best_val_round"])] for r in ok]
            cell = _cell(accuracy)
            if diverged:
                cell = (f"{cell} ({len(diverged)} of {len(runs)} diverged)" if ok
                        else f"diverged ({len(diverged)} of {len(runs)})")
            elif len(ok) < len(seeds):
                cell += f" ({len(ok)} of {len(seeds)} seeds ended)"
            row.append(cell)
            if ok and not diverged and len(ok) == len(seeds):
                means[(label, e)] = np.mean(accuracy)
            if ok:
                selectable[(label, e)] = {r["seed"]: (v, a)
                                          for r, v, a in zip(ok, validation, accuracy)}
            summary["cells"][f"{label} @ {_eps_label(e)}"] = dict(
                accuracy={r["seed"]: r["results"]["target_accuracy_at_best_val"] for r in ok},
                diverged=sorted(r["seed"] for r in diverged),
            )
        text.append(f"| {label} | " + " | ".join(row) + " |")
    fedpals = [label for label in labels if "ESS" in label]
    best_test, best_val = [], []
    def ess(label: str) -> str:
        return label.split("ESS ")[1].rstrip(")")

    for e in epsilons:
        candidates = [(means[(label, e)], label) for label in fedpals if (label, e) in means]
        if candidates:
            accuracy, label = max(candidates)
            best_test.append(f"{ess(label)} ({100 * accuracy:.1f})")
        else:
            best_test.append("- (no ESS with every seed ended)")
        # As the protocol (fedjax_pals/experiment/protocol.py): the row's seeds are those with a
        # run that ended in it; a point is eligible if it ended for each of them; the highest
        # mean validation accuracy wins, ties going to the earlier (smaller) ESS.
        row_seeds = sorted({r["seed"] for r in done if r["epsilon"] == e})
        eligible = [label for label in fedpals
                    if set(row_seeds) <= set(selectable.get((label, e), {}))]
        if eligible:
            label = max(eligible, key=lambda label: np.mean(
                [selectable[(label, e)][s][0] for s in row_seeds]))
            accuracy = np.mean([selectable[(label, e)][s][1] for s in row_seeds])
            best_val.append(f"{ess(label)} ({100 * accuracy:.1f}"
                            + (f", seed{'s' * (len(row_seeds) > 1)} "
                               f"{', '.join(map(str, row_seeds))} only)"
                               if len(row_seeds) < len(seeds) else ")"))
        else:
            best_val.append("-")
    text.append("| FedPALS: ESS of the highest mean test accuracy (every seed ended) | "
                + " | ".join(best_test) + " |")
    text.append("| FedPALS: ESS the protocol selects (highest mean validation accuracy), its "
                "test accuracy | " + " | ".join(best_val) + " |")
    summary["best_ess_by_test"] = dict(zip(map(_eps_label, epsilons), best_test))
    summary["best_ess_by_validation"] = dict(zip(map(_eps_label, epsilons), best_val))

    # The same runs by the last round and by the last 10 rounds: no selection on validation.
    last = 10
    text += [
        "",
        f"The same runs without the best-validation selection: target test accuracy (%) after "
        f"the last round / mean over the last {last} rounds' evaluations, mean ± sample std "
        "over the seeds that ended (ddof 1):",
        "",
        head, rule,
    ]
    for label in labels:
        row = []
        for e in epsilons:
            ok = [r for r in cells.get((label, e), []) if r["status"] == "done"]
            if not ok:
                row.append("-")
                continue
            final = [r["results"]["final_target_accuracy"] for r in ok]
            tail = [_last_rounds_mean(r["results"], last) for r in ok]
            row.append(f"{_cell(final)} / {_cell(tail)}")
            summary["cells"][f"{label} @ {_eps_label(e)}"].update(
                final={r["seed"]: a for r, a in zip(ok, final)},
                last_rounds_mean={r["seed"]: a for r, a in zip(ok, tail)})
        text.append(f"| {label} | " + " | ".join(row) + " |")
    layouts = sorted({_layout(rs) for rs in cells.values()})
    text += ["", "How the cells' runs were trained (results.json's program_runs and engine): "
             + ("every cell: " + layouts[0] if len(layouts) == 1 else "; ".join(
                 f"{label} @ {_eps_label(e)}: {_layout(cells[(label, e)])}"
                 for label in labels for e in epsilons if (label, e) in cells)) + "."]
    summary["layouts"] = {f"{label} @ {_eps_label(e)}": _layout(cells[(label, e)])
                          for label in labels for e in epsilons if (label, e) in cells}

    # The weights' cost: max alpha per round, the noise it draws.
    num_params = _num_params(any_done)
    dp_epsilons = [e for e in epsilons if e is not None]
    weight = (
        "max_i α_i per round (mean over rounds and seeds, from metrics.jsonl; the weights do "
        "not depend on the noise)" if rate is None else
        "max_i α_i / q over every client (Poisson sampling's fixed-denominator weights, from "
        "results.json; drawn or not, the noise is scaled to it)"
    )
    text += [
        "",
        f"The weights' cost under DP: {weight}, the aggregate's noise σ C max_i α_i per "
        f"coordinate and its L2 norm over the model's {num_params:,} parameters per round"
        if num_params else
        f"The weights' cost under DP ({weight}, the noise std per coordinate)",
        "",
        "| | max α per round | × FedAvg's | " + " | ".join(
            f"noise std / L2 norm at ε = {e:g}" for e in dp_epsilons) + " |",
        "|---|---|---|" + "---|" * len(dp_epsilons),
    ]
    alphas = {}
    for label in labels:
        # The weights of a round depend on the seed's participants and lambda, not on the
        # noise: every run of the line counts, those without DP and those that diverged too.
        values = [_sensitivity_weight(r, rate) for r in records if _line(r) == label]
        values = [v for v in values if v is not None]
        alphas[label] = float(np.mean(values)) if values else None
    reference = alphas.get(fjp.method_label("fedavg"))
    for label in labels:
        alpha = alphas[label]
        if alpha is None:
            continue
        noise = []
        for e in dp_epsilons:
            s = sorted(sigma.get(e, ()))
            if not s:
                noise.append("-")
                continue
            std = s[0] * clip * alpha
            noise.append(f"{std:.3g} / {std * math.sqrt(num_params):.3g}" if num_params
                         else f"{std:.3g}")
        ratio = f"{alpha / reference:.2f}" if reference else "-"
        text.append(f"| {label} | {alpha:.4f} | {ratio} | " + " | ".join(noise) + " |")
    summary["max_alpha"] = alphas
    summary["num_params"] = num_params

    # Seed by seed.
    text += ["", "Seed by seed (target test accuracy % at the best-validation round; dN: "
             "diverged in round N, -: not ended), " + ", ".join(labels) + ":", ""]
    for e in epsilons:
        parts = []
        for label in labels:
            by_seed = {r["seed"]: r for r in cells.get((label, e), [])}
            parts.append("/".join(
                f"{100 * by_seed[s]['results']['target_accuracy_at_best_val']:.1f}"
                if s in by_seed and by_seed[s]["status"] == "done"
                else (_diverged_at(by_seed[s]) if s in by_seed
                      and by_seed[s]["status"] == "diverged" else "-")
                for s in seeds))
        text.append(f"- ε = {_eps_label(e)}: " + "; ".join(parts))
    unfinished = [r["name"] for r in records if r["status"] == "not ended"]
    if unfinished:
        text += ["", f"Not ended: {len(unfinished)} run(s), e.g. {unfinished[0]}."]
    summary["not_ended"] = unfinished

    # The figure: one line per method and ESS.
    _plot(figure, labels, epsilons, cells, len(seeds),
          f"Fashion-MNIST C = 3, {any_done['partition'].get('num_clients', '?')} clients, "
          f"{_participation(config, rate)}, {rounds} rounds: target accuracy "
          f"against user-level ε (δ = {delta:g}, clip norm C = {clip:g})")
    return "\n".join(text) + "\n", summary


# The shared style's variants of one method (fedjax_pals/experiment/plots.py): line style and
# marker fill.
_LINES = ("-", (0, (6, 2)), (0, (2, 1.5)), "-.")
_FILLS = ("full", "none", "left", "bottom")


def _plot(path: str, labels, epsilons, cells, num_seeds: int, title: str) -> None:
    """Accuracy (mean ± std over seeds) against epsilon on a log2 axis, no DP at its right end
    ("∞"), one line per method and ESS (colours and markers of the shared style,
    `plots.method_style`; the lines of one method differ by line style and marker fill); a
    point whose runs all diverged is left out and marked "diverged" at the bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = fjp.experiment.plots
    numeric = sorted(e for e in epsilons if e is not None)
    at = {e: e for e in numeric}
    if None in epsilons:
        at[None] = numeric[-1] * 2 if numeric else 1.0
    fig, ax = plt.subplots(figsize=(7.6, 4.0), layout="constrained")
    variants: dict = {}
    diverged_marks, partial_marks = [], []
    for index, label in enumerate(labels):
        # Each line shifted a little along x, so that the error bars do not hide each other.
        shift = 2 ** (0.035 * (index - (len(labels) - 1) / 2))
        style = plots.method_style(label)
        k = variants.get(style["color"], 0)
        variants[style["color"]] = k + 1
        xs, ys, errs = [], [], []
        for e in sorted(epsilons, key=lambda e: at[e]):
            runs = cells.get((label, e), [])
            ok = [100 * r["results"]["target_accuracy_at_best_val"] for r in runs
                  if r["status"] == "done"]
            lost = sum(r["status"] == "diverged" for r in runs)
            if ok:
                xs.append(at[e] * shift)
                ys.append(np.mean(ok))
                errs.append(_sample_std(ok))
                if lost:
                    partial_marks.append((at[e] * shift, np.mean(ok), style["color"],
                                          f"{lost}/{len(runs)} diverged"))
            elif lost:
                diverged_marks.append((at[e] * shift, style["color"], label))
        ax.errorbar(xs, ys, yerr=errs, capsize=3, label=label, linestyle=_LINES[k % 4],
                    fillstyle=_FILLS[k % 4], **style)
    ax.set_xscale("log", base=2)
    ticks = sorted(at.values())
    ax.set_xticks(ticks)
    ax.set_xticklabels(["∞ (no DP)" if t == at.get(None) and None in at else f"{t:g}"
                        for t in ticks])
    ax.minorticks_off()
    if None in at and numeric:
        ax.axvline(np.sqrt(numeric[-1] * at[None]), color="gray", linewidth=0.6, linestyle=":")
    # Points whose runs all diverged: a cross each, stacked below the lowest point at their ε.
    low = ax.get_ylim()[0]
    stacked: dict = {}
    for x, color, label in diverged_marks:
        k = stacked.get(round(np.log2(x)), 0)
        stacked[round(np.log2(x))] = k + 1
        y = low - 3.5 * (k + 1)
        ax.plot([x], [y], marker="x", color=color, markersize=6, linestyle="none")
        ax.annotate(label.split("(")[-1].rstrip(")") if "(" in label else label, (x, y),
                    textcoords="offset points", xytext=(5, -3), fontsize=6, color=color)
    if diverged_marks:
        ax.set_ylim(bottom=low - 3.5 * (max(stacked.values()) + 1))
        ax.plot([], [], marker="x", color="gray", linestyle="none",
                label="every seed diverged (stacked below)")
    for x, y, color, text in partial_marks:
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, -3), fontsize=6,
                    color=color)
    ax.plot([], [], "|", markersize=10, color="gray",
            label=f"mean ± 1 sample std over {num_seeds} seeds\n(over the others where some "
                  "diverged)")
    ax.set_xlabel("privacy budget ε (user level; one client's data)")
    ax.set_ylabel("target accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(title, fontsize=10, wrap=True)
    fig.savefig(path, dpi=150)
    if path.endswith(".png"):
        fig.savefig(path[: -len(".png")] + ".pdf")
    plt.close(fig)


def main(argv):
    del argv  # a stray argument is refused by common.run
    started = time.time()
    workdir = common.WORKDIR.value
    os.makedirs(workdir, exist_ok=True)
    figure = flags.FLAGS.figure or os.path.join(workdir, FIGURE)
    text, summary = report(flags.FLAGS.sweep, figure)
    with open(os.path.join(workdir, "dp_updates.md"), "w") as f:
        f.write(text)
    with open(os.path.join(workdir, "dp_updates.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(text)
    common.print_written(workdir, started)
    if not os.path.abspath(figure).startswith(os.path.abspath(workdir) + os.sep):
        print(f"  {figure} (and its .pdf)")


def entry() -> None:
    """The `fedjax-pals-dp-updates-report` command (`python -m experiments.dp_updates_report`)."""
    # Defined here, not on import: tests import `report` beside other mains' flags.
    flags.DEFINE_string("sweep", None, "The sweep workdir of configs/beyond_private_updates.py.")
    flags.DEFINE_string("figure", None, f"The figure's path (.png; a .pdf beside it); default "
                        f"<workdir>/{FIGURE}.")
    flags.mark_flags_as_required(["sweep", "workdir"])
    common.run(main, takes=common.WRITES)


if __name__ == "__main__":
    entry()
