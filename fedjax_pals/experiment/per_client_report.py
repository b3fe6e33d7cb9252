"""The per-client report of a sweep whose runs evaluate per client (evaluation.per_client,
sweep.each_client): per_client_table.md, per_client_table.json and per_client_cdf.png.

One table row per way of serving the clients, each client's test accuracy taken as follows:

- `<method>`: the method's global model at each client's own best-validation evaluation
  (`per_client_accuracy_at_best_val`);
- `<method> + fine-tuning`, `<method> + Ditto`, `local only`: the run's personalised models
  (evaluation.personalization), each client's steps and learning rate (Ditto: lambda) chosen on
  its validation set;
- `<method> per client` (sweep.each_client): client j's accuracy from the run whose target is
  j (T = S_j), at that run's best-validation round on j's own validation set; with a grid, the
  grid point whose validation accuracy is best for j.

Per seed, over the clients: mean, median, worst 10 % (the mean of the lowest tenth), standard
deviation and variance (ddof 0; q-FFL's fairness measure), the n_i-weighted mean, and against
FedAvg's global model the share of clients improved and the mean gain. The table shows each
statistic's mean over seeds +- its std over seeds (ddof 0). Cost, per seed: client-steps (local
SGD steps of all clients, training and personalisation) and wall seconds (a run's share of its
program's time: runs trained together on the runs axis each record the program's time and
how many runs it held, `program_runs`; results without it count the whole time).
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from fedjax_pals.algorithms import registry
from fedjax_pals.experiment.plots import plot_client_accuracy_cdf
from fedjax_pals.experiment.workdir import write_json
from fedjax_pals.metrics import client_accuracy_summary
from fedjax_pals.personalization import registered_personalizations

TABLE_FILE, TABLE_JSON, CDF_FIGURE = "per_client_table.md", "per_client_table.json", \
    "per_client_cdf.png"
COLUMNS = (
    ("mean", "mean"), ("median", "median"), ("worst_10", "worst 10 %"), ("std", "std"),
    ("variance", "variance"), ("weighted_mean", "n_i-weighted"),
    ("improved_share", "improved vs FedAvg"),
)
REFERENCE_METHOD = "fedavg"


def _values(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], np.float64)


def _label(method: str, hparams: Sequence) -> str:
    label = registry.method_label(method)
    shown = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in hparams)
    return f"{label} ({shown})" if shown else label


def _training_client_steps(results: Mapping[str, Any]) -> float:
    """The local SGD steps a run's clients took over its rounds (expected under sampling)."""
    config, sizes = results["config"], np.asarray(results["partition"]["client_sizes"])
    t = config["training"]
    per_round = t["local_epochs"] * np.ceil(sizes / t["batch_size"])
    share = min(1.0, t["clients_per_round"] / len(sizes))
    if t.get("client_sampling") == "poisson":
        share = t["client_fraction"]
    return float(len(results.get("train_loss", ())) * share * per_round.sum())


def per_client_rows(runs: Sequence[Any], results_by_run: Mapping[int, Mapping[str, Any]]) -> dict:
    """{row: {label: {seed: {"accuracy": (M,), "client_steps", "wall_seconds", "sizes"}}}}."""
    rows: dict = {}
    chosen: dict = {}  # (row, label, seed, client) -> best validation accuracy so far
    for index, run in enumerate(runs):
        results = results_by_run.get(index)
        if not results or "per_client_accuracy" not in results and run.client is None:
            continue
        table = rows.setdefault(run.row, {})
        sizes = np.asarray(results["partition"]["client_sizes"], np.float64)
        steps = _training_client_steps(results)
        # Runs trained together each record their program's time: a run's share is that over
        # the runs of its program (recorded since program_runs was; before, the whole time).
        wall = float(results.get("wall_seconds", 0.0)) / results.get("program_runs", 1)
        if run.client is None:
            label = _label(run.method, run.hparams)
            table.setdefault(label, {})[run.seed] = dict(
                accuracy=_values(results["per_client_accuracy_at_best_val"]), sizes=sizes,
                client_steps=steps, wall_seconds=wall)
            modes = registered_personalizations()
            for mode, record in (results.get("personalization") or {}).items():
                federated = mode not in modes or modes[mode].federated
                shown = modes[mode].row(label) if mode in modes else f"{label} + {mode}"
                table.setdefault(shown, {}).setdefault(run.seed, dict(
                    accuracy=_values(record["per_client_accuracy"]), sizes=sizes,
                    client_steps=steps * federated + record["client_steps"],
                    wall_seconds=wall * federated + record["wall_seconds"]))
            continue
        label = f"{registry.method_label(run.method)} per client"
        cell = table.setdefault(label, {}).setdefault(run.seed, dict(
            accuracy=np.full(len(sizes), np.nan), sizes=sizes, client_steps=0.0,
            wall_seconds=0.0))
        cell["client_steps"] += steps
        cell["wall_seconds"] += wall
        best = results["val_accuracy"][_best(results["val_accuracy"])]
        key = (run.row, label, run.seed, run.client)
        if key not in chosen or best > chosen[key]:
            chosen[key] = best
            cell["accuracy"][run.client] = results["target_accuracy_at_best_val"]
    return rows


def _best(values) -> int:
    return int(np.argmax(values))


def per_client_table(rows: Mapping[str, Mapping[str, Mapping[int, dict]]]) -> dict:
    """The report's table (JSON-ready) from `per_client_rows`."""
    table = {}
    for row, methods in rows.items():
        reference_label = registry.method_label(REFERENCE_METHOD)
        reference = methods.get(reference_label, {})
        entries = {}
        for label, seeds in methods.items():
            stats = []
            for seed, cell in sorted(seeds.items()):
                ref = reference.get(seed, {}).get("accuracy")
                stats.append(client_accuracy_summary(
                    cell["accuracy"], cell["sizes"],
                    reference=None if label == reference_label else ref))
            summary = {}
            for key, _ in COLUMNS + (("mean_gain", ""),):
                values = [s[key] for s in stats if s.get(key) is not None]
                values = [v for v in values if math.isfinite(v)]
                if values:
                    summary[key] = {"mean": float(np.mean(values)), "std": float(np.std(values))}
            entries[label] = {
                "seeds": sorted(seeds),
                "summary": summary,
                "client_steps": float(np.mean([c["client_steps"] for c in seeds.values()])),
                "wall_seconds": float(np.mean([c["wall_seconds"] for c in seeds.values()])),
                "per_client_accuracy": {
                    str(seed): [None if not math.isfinite(v) else float(v)
                                for v in seeds[seed]["accuracy"]] for seed in sorted(seeds)},
            }
        table[row] = entries
    return table


def table_markdown(table: Mapping[str, Any], title: str) -> str:
    lines = [f"# Per-client accuracy: {title}", ""]
    for row, entries in table.items():
        lines += [f"## {row}", "",
                  "Each statistic over the clients of one seed (accuracy in %; std and variance "
                  "ddof 0), then mean +- std over seeds.", "",
                  "| | " + " | ".join(name for _, name in COLUMNS)
                  + " | client-steps | wall s | seeds |",
                  "|---" * (len(COLUMNS) + 4) + "|"]
        for label, entry in entries.items():
            cells = []
            for key, _ in COLUMNS:
                stat = entry["summary"].get(key)
                if stat is None:
                    cells.append("-")
                elif key == "improved_share":
                    cells.append(f"{100 * stat['mean']:.0f} % ± {100 * stat['std']:.0f}")
                elif key == "variance":
                    cells.append(f"{1e4 * stat['mean']:.0f} ± {1e4 * stat['std']:.0f}")
                else:
                    cells.append(f"{100 * stat['mean']:.1f} ± {100 * stat['std']:.1f}")
            lines.append(
                f"| {label} | " + " | ".join(cells)
                + f" | {entry['client_steps']:,.0f} | {entry['wall_seconds']:.0f} | "
                f"{len(entry['seeds'])} |")
        lines += ["", "Variance in %^2. Improved: the share of clients whose accuracy is "
                  "strictly above FedAvg's global model's (same seed, same client).", ""]
    return "\n".join(lines)


def write_per_client_report(
    workdir: str, runs: Sequence[Any], results_by_run: Mapping[int, Mapping[str, Any]], *,
    title: str, missing: Sequence[str] = (),
) -> dict:
    """Writes the report (see the module docstring) into `workdir`; returns {"table", "files"}
    ({} files when no run evaluated per client)."""
    rows = per_client_rows(runs, results_by_run)
    if not rows:
        return {"table": None, "files": {}}
    if missing:
        title = f"PARTIAL ({len(missing)} runs missing): {title}"
    table = per_client_table(rows)
    files = {"per_client_table": os.path.join(workdir, TABLE_FILE),
             "per_client_json": os.path.join(workdir, TABLE_JSON)}
    with open(files["per_client_table"], "w") as f:
        f.write(table_markdown(table, title))
    write_json(files["per_client_json"], {"title": title, "rows": table,
                                          **({"missing": list(missing)} if missing else {})})
    for number, (row, entries) in enumerate(table.items()):
        name = CDF_FIGURE if len(table) == 1 else f"per_client_cdf_{number}.png"
        accuracies = {label: [values for values in entry["per_client_accuracy"].values()]
                      for label, entry in entries.items()}
        accuracies = {label: _values(np.ravel(v).tolist()) for label, v in accuracies.items()}
        plot_client_accuracy_cdf(
            os.path.join(workdir, name), accuracies, f"{row}: per-client test accuracy",
            note="clients of every seed pooled")
        files[name] = os.path.join(workdir, name)
    return {"table": table, "files": files}
