"""The paper's model-selection protocol and its Table-1-shaped report.

The FedPALS paper (Sec. 5, App. B.3) tunes "early stopping, model hyperparameters, and lambda in
FedPALS ... using a validation set that reflects the target distribution" and reports the mean
and standard deviation of the target test accuracy over 8 seeds (Table 1). It does not say how
the selection combines seeds; this module implements one rule, stated here and recorded in every
table it writes:

1. Early stopping, per run: a run (one method, one hyperparameter point, one seed) is read at
   its *best-validation round* r* = argmax_r val_accuracy(r), the earliest on ties (what
   `train_and_evaluate` reports as `best_val_round`). Its validation score is
   val_accuracy(r*), its test scores target_accuracy(r*) and target_macro_f1(r*).
2. Hyperparameters, per method and per table row: among the grid points h run for every seed
   of the row, choose h* = argmax_h mean_seeds val_accuracy(r*_{h,seed}) (`"mean_over_seeds"`,
   the default; ties: the earliest point in the sweep's grid order). A point with a run that
   failed or diverged, or lacks a seed, is not eligible. The grid covers, as the paper's
   protocol: FedPALS' lambda (lambda -> 0+, i.e. lam = 0, and the lambda giving ESS of 10, 25,
   50 and 75 % of N, `lambda_for_ess`), every method's learning rate, FedProx' mu, SCAFFOLD's
   server learning rate, AFL's step size and FedRS' alpha (see `configs/`).
   `selection="per_seed"` instead chooses h*_seed = argmax_h val_accuracy(r*_{h,seed}) for each
   seed separately.
3. Reported: for each method, the target test accuracy (and macro-F1) at (h*, r*) of each seed;
   the table cell is mean +- std over seeds, std the population standard deviation (NumPy's
   default, ddof = 0), in percent.

Test metrics never enter a choice. The inputs are `RunRecord`s: where a run sits in the sweep
(row, method, grid point, seed) and the results dict of `train_and_evaluate`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import ml_collections

from fedjax_pals.data import dataset_label
from fedjax_pals.algorithms.registry import is_reference, method_label, protocol_grids
# The paper's Table 1 and its methods, re-exported here where the protocol's table reads them.
from fedjax_pals.paper import PAPER_METHODS, PAPER_TABLE_1  # noqa: F401

SELECTIONS = ("mean_over_seeds", "per_seed")



def protocol_grid() -> "ml_collections.ConfigDict":
    """The hyperparameter grids of the selection protocol, as a `config.sweep.grid` section.

    The first value of each grid is the conventional default (ties go to the first point).

    * Every registered feature's grid (`Feature.grid`), first: FedPALS' lambda (App. B.3),
      lam = 0 (the lambda -> 0+ end: the projection of T onto Conv(S), eq. 7) and the lambdas
      giving ESS = 10, 25, 50, 75 % of N (`lambda_for_ess`; a fraction below
      ESS(alpha^{0+}) / N is out of reach for that partition and its runs end "unreachable",
      not eligible); algorithms/fedpals_lambda.py.
    * Learning rate, every method: 0.1, 0.01, 0.001 (decades below plain SGD's usual 0.1 for a
      LeNet; the paper tunes "model hyperparameters" without listing them).
    * Every registered method's own grid (`Method.grid`; the built-in ones and their sources
      are in each method's module, algorithms/<method>.py): FedProx' mu, SCAFFOLD's eta_g,
      AFL's step, FedRS' alpha.
    """
    import ml_collections

    return ml_collections.ConfigDict(
        dict(
            training=dict(learning_rate=(0.1, 0.01, 0.001)),
            algorithm=protocol_grids(),
        )
    )


def ignored_method_grids(
    methods: Mapping[str, tuple[str, Mapping[str, Any]]], named: Iterable[str]
) -> dict[str, dict[str, tuple[tuple, Any]]]:
    """The registered grids (`Method.grid`) a sweep leaves out, per method key it runs.

    A sweep tries only the values its `config.sweep.grid` names (`fjp.protocol_grid()` names
    every registered method's grid); a method's declared grid is not added by itself, so that
    a sweep's runs are exactly what its config says (and a finished sweep stays finished).

    Args:
      methods: method key -> (the registered method's name, its resolved `algorithm` section:
        the values the runs use), e.g. {"fedprox_fedpals": ("fedprox", {"prox_mu": 0.01,
        ...})}.
      named: the config paths the sweep varies or fixes on purpose: its grid and task axes,
        and what the method key itself sets (e.g. "algorithm.prox_mu").

    Returns:
      method key -> {hyperparameter: (its declared values, the one value the runs use)} for
      each declared grid key the sweep does not name; methods without one are left out.
    """
    from fedjax_pals.algorithms.registry import get_method

    named = set(named)
    ignored = {}
    for key, (name, algorithm) in methods.items():
        try:
            declared = dict(get_method(name).grid)
        except ValueError:  # not a registered method: the runs' validation names it
            continue
        missing = {
            field: (tuple(values), algorithm.get(field))
            for field, values in declared.items()
            if f"algorithm.{field}" not in named
        }
        if missing:
            ignored[key] = missing
    return ignored


def ignored_grid_message(method: str, missing: Mapping[str, tuple[tuple, Any]]) -> str:
    """One line: which declared grid of `method` the sweep does not try, and how to try it."""
    declared = ", ".join(f"{field}={values}" for field, (values, _) in missing.items())
    used = ", ".join(f"{field}={value!r}" for field, (_, value) in missing.items())
    add = "; ".join(
        f"config.sweep.grid.algorithm.{field} = {values}" for field, (values, _) in missing.items()
    )
    return (
        f"the sweep selects {method} without the grid its method declares ({declared}): its "
        f"runs use {used} only. To try the declared values, add them to the sweep ({add}), or "
        "start the grid from fjp.protocol_grid() (every registered method's grid, the learning "
        "rates and every registered feature's grid, e.g. FedPALS' lambda)."
    )


# (method key, its ignored grid) already warned about in this process: a sweep is expanded
# several times (listing, validation, each shard), the warning is given once.
_WARNED_GRIDS: set = set()


def warn_ignored_grids(
    methods: Mapping[str, tuple[str, Mapping[str, Any]]], named: Iterable[str]
) -> dict[str, dict[str, tuple[tuple, Any]]]:
    """`ignored_method_grids`, with one warning line per method (once per process)."""
    from absl import logging

    ignored = ignored_method_grids(methods, named)
    for method, missing in ignored.items():
        key = (method, repr(sorted(missing.items())))
        if key not in _WARNED_GRIDS:
            _WARNED_GRIDS.add(key)
            logging.warning("%s", ignored_grid_message(method, missing))
    return ignored


def table1_config(
    dataset: str,
    *,
    labels_per_client: int | None = None,
    dirichlet_beta: float | None = None,
) -> "ml_collections.ConfigDict":
    """The sweep config of one row of the paper's Table 1, at the paper's full budget.

    10 clients (9 training + the target); the paper's sparsity sampling with C =
    `labels_per_client` (App. B.4: C random labels per client and target, the same number of
    examples of each, no overlap; T uniform over C), or its Dirichlet sampling p_i ~
    Dir_K(`dirichlet_beta`) of clients and target; LeNet for every method (the sweep gives all
    methods one model; FedRS' reference head has no bias: `--config.model=lenet_nobias`);
    150 rounds of E = 1 local epoch (the paper's tuning "consistently resulted in" E = 1),
    batch 32, evaluation every round (early stopping may pick any); 8 seeds; every method of
    `PAPER_METHODS` over `protocol_grid()`, selected by the mean over seeds of the validation
    accuracy; the paper's numbers beside ours.
    """
    import ml_collections

    from fedjax_pals.experiment.config import default_config

    if (labels_per_client is None) == (dirichlet_beta is None):
        raise ValueError("give labels_per_client (sparsity) or dirichlet_beta, not both.")
    config = default_config()
    config.dataset.name = dataset
    config.partition.num_clients = 10
    label = dataset_label(dataset)
    if labels_per_client is not None:
        config.partition.scheme = "sparsity"
        config.partition.labels_per_client = labels_per_client
        row = f"{label} C={labels_per_client}"
    else:
        config.partition.scheme = "dirichlet"
        config.partition.dirichlet_beta = dirichlet_beta
        row = f"{label} beta={dirichlet_beta:g}"
    config.model = "auto"
    config.training.update(rounds=150, local_epochs=1, batch_size=32, eval_every=1)
    config.training.learning_rate = 0.1  # overridden by the grid
    config.sweep = ml_collections.ConfigDict(
        dict(
            row=row,
            seeds=tuple(range(8)),
            methods=PAPER_METHODS,
            grid=protocol_grid(),
            selection="mean_over_seeds",
            paper=ml_collections.ConfigDict(PAPER_TABLE_1[row]),
            figures=("curves", "weights"),
        )
    )
    return config


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One finished run and its place in a sweep.

    Attributes:
      row: the table row (data set / split, plus any task axis), e.g. "Fashion-MNIST C=3".
      method: the method's key, e.g. "fedprox_fedpals".
      hparams: the grid point, as ((name, value), ...) in grid order, e.g.
        (("learning_rate", 0.1), ("prox_mu", 0.01)); () for a method without a grid.
      seed: the run's seed.
      results: the results dict of `train_and_evaluate` (needs rounds, val_accuracy,
        target_accuracy, target_macro_f1; best_val_round if present).
    """

    row: str
    method: str
    hparams: tuple
    seed: int
    results: Mapping[str, Any]


def hparams_label(hparams: Sequence) -> str:
    """("learning_rate", 0.1), ("prox_mu", 0.01) -> "learning_rate=0.1, prox_mu=0.01"."""
    if not hparams:
        return "(defaults)"
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in hparams)


def best_val_point(results: Mapping[str, Any]) -> dict[str, Any]:
    """Early stopping of one run: its scores at the round of best validation accuracy.

    Returns {"round", "val_accuracy", "target_accuracy", "target_macro_f1"} at r* =
    argmax_r val_accuracy(r) (earliest on ties); `results["best_val_round"]`, when present,
    must agree.
    """
    rounds = list(results["rounds"])
    val = np.asarray(results["val_accuracy"], dtype=float)
    if not rounds or val.shape != (len(rounds),):
        raise ValueError(
            f"results need one val_accuracy per evaluated round; got {len(rounds)} rounds and "
            f"{val.shape[0] if val.ndim else 0} values."
        )
    if not np.isfinite(val).any():
        raise ValueError("results have no finite validation accuracy.")
    index = int(np.nanargmax(np.where(np.isfinite(val), val, -np.inf)))
    given = results.get("best_val_round")
    if given is not None and given != rounds[index]:
        raise ValueError(
            f"results' best_val_round {given} disagrees with its val_accuracy, whose "
            f"(first) maximum is at round {rounds[index]}."
        )
    return {
        "round": int(rounds[index]),
        "val_accuracy": float(val[index]),
        "target_accuracy": float(results["target_accuracy"][index]),
        "target_macro_f1": float(results["target_macro_f1"][index]),
    }


def _group(records: Iterable[RunRecord]):
    """{row: {method: {hparams: {seed: record}}}} keeping first-seen order at every level."""
    grouped: dict = {}
    for record in records:
        if not isinstance(record, RunRecord):
            raise TypeError(f"records must be RunRecords, got {type(record).__name__}.")
        runs = grouped.setdefault(record.row, {}).setdefault(record.method, {})
        seeds = runs.setdefault(tuple(record.hparams), {})
        if record.seed in seeds:
            raise ValueError(
                f"two runs for row {record.row!r}, method {record.method!r}, "
                f"{hparams_label(record.hparams)}, seed {record.seed}."
            )
        seeds[record.seed] = record
    return grouped


def _privacy(results: Mapping[str, Any]) -> dict[str, float]:
    """A DP run's epsilon and delta (DP on updates: spent through its last round, per client);
    nothing for a run without DP on updates."""
    if results.get("dp_epsilon") is None:
        return {}
    return {"dp_epsilon": float(results["dp_epsilon"]), "dp_delta": float(results["dp_delta"])}


def select_method(
    runs: Mapping[tuple, Mapping[int, RunRecord]],
    seeds: Sequence[int],
    *,
    selection: str = "mean_over_seeds",
) -> dict[str, Any]:
    """The protocol for one method in one row (see the module docstring).

    Args:
      runs: grid point -> {seed: record}, in grid order.
      seeds: the row's seeds; a grid point needs a finished run for each.
      selection: "mean_over_seeds" or "per_seed".

    Returns:
      {"selected": grid point(s), "per_seed": [{seed, hparams, round, val_accuracy,
      target_accuracy, target_macro_f1, and a DP run's dp_epsilon, dp_delta}], "target_accuracy": {"mean", "std", "n"},
      "target_macro_f1": {...}, "val_accuracy": {...}, "candidates": [{hparams, mean_val,
      eligible}]}; or {"selected": None, ...} when no grid point is eligible.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {list(SELECTIONS)}, got {selection!r}.")
    points = {
        h: {s: best_val_point(r.results) for s, r in by_seed.items()} for h, by_seed in runs.items()
    }
    candidates = []
    for h, by_seed in points.items():
        eligible = all(s in by_seed for s in seeds)
        mean_val = float(np.mean([by_seed[s]["val_accuracy"] for s in seeds])) if eligible else None
        candidates.append(
            {"hparams": [list(kv) for kv in h], "mean_val": mean_val, "eligible": eligible}
        )
    # max() keeps the first of equal maxima: ties go to the earliest grid point.
    chosen: list[tuple[int, tuple]] = []
    if selection == "mean_over_seeds":
        mean_val = {h: c["mean_val"] for h, c in zip(points, candidates) if c["eligible"]}
        if mean_val:
            chosen = [(s, max(mean_val, key=mean_val.get)) for s in seeds]
    else:
        for s in seeds:
            having = [h for h, by_seed in points.items() if s in by_seed]
            if not having:
                chosen = []
                break
            chosen.append((s, max(having, key=lambda h: points[h][s]["val_accuracy"])))
    if not chosen:
        return {"selected": None, "per_seed": [], "candidates": candidates}
    per_seed = [{"seed": s, "hparams": [list(kv) for kv in h], **points[h][s],
                 **_privacy(runs[h][s].results)} for s, h in chosen]
    selected = [row["hparams"] for row in per_seed]
    if selection == "mean_over_seeds":
        selected = [list(kv) for kv in chosen[0][1]]
    out: dict[str, Any] = {"selected": selected, "per_seed": per_seed, "candidates": candidates}
    for metric in ("target_accuracy", "target_macro_f1", "val_accuracy"):
        values = np.asarray([row[metric] for row in per_seed], dtype=float)
        out[metric] = {"mean": float(values.mean()), "std": float(values.std()), "n": len(per_seed)}
    return out


def protocol_table(
    records: Iterable[RunRecord],
    *,
    methods: Sequence[str] | None = None,
    selection: str = "mean_over_seeds",
    paper: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    title: str = "",
) -> dict[str, Any]:
    """Applies the protocol to every (row, method) and returns the table as a JSON-able dict.

    Args:
      records: the sweep's finished runs.
      methods: column order (default: first-seen order).
      selection: see `select_method`.
      paper: row -> method -> (mean %, std %), the paper's numbers to show beside ours.
      title: a caption.

    Returns:
      {"title", "selection", "protocol" (the rule in words), "methods", "labels",
       "rows": [{"row", "seeds", "projection_distance", "cells": {method: select_method(...)
       with "mean"/"std" of the target accuracy lifted to the cell}, "paper": {method:
       {"mean", "std"}} as fractions}]}
    """
    grouped = _group(records)
    seen = [m for by_method in grouped.values() for m in by_method]
    order = list(methods) if methods is not None else list(dict.fromkeys(seen))
    rows = []
    for row, by_method in grouped.items():
        seeds = sorted(
            {s for runs in by_method.values() for by_seed in runs.values() for s in by_seed}
        )
        cells = {}
        distances = []
        for method in order:
            if method not in by_method:
                continue
            cell = select_method(by_method[method], seeds, selection=selection)
            if cell["selected"] is not None:
                cell.update({key: cell["target_accuracy"][key] for key in ("mean", "std")})
            cells[method] = cell
            for by_seed in by_method[method].values():
                for record in by_seed.values():
                    # The partition's d(T, S) of the exact S_i: the row's, whatever the method.
                    d = record.results.get("partition", {}).get("projection_distance")
                    if d is not None and math.isfinite(d):
                        distances.append(float(d))
        entry = {
            "row": row,
            "seeds": seeds,
            "projection_distance": float(np.mean(distances)) if distances else None,
            "cells": cells,
        }
        row_paper = (paper or {}).get(row)
        if row_paper:
            entry["paper"] = {
                m: {"mean": float(v[0]) / 100, "std": float(v[1]) / 100}
                for m, v in row_paper.items()
            }
        rows.append(entry)
    return {
        "title": title,
        "selection": selection,
        "protocol": _PROTOCOL_TEXT[selection],
        "methods": order,
        "labels": {m: method_label(m) for m in order},
        "rows": rows,
    }


_PROTOCOL_TEXT = {
    "mean_over_seeds": (
        "target test accuracy (%) at each run's best-validation round; per method and row the "
        "grid point with the best mean-over-seeds validation accuracy; mean ± std (ddof 0) "
        "over seeds"
    ),
    "per_seed": (
        "target test accuracy (%) at each run's best-validation round; per method, row and "
        "seed the grid point with the best validation accuracy; mean ± std (ddof 0) over seeds"
    ),
}


def _pm(stats: Mapping[str, float]) -> str:
    return f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}"


def _cell_text(cell: Mapping[str, Any] | None, metric: str = "target_accuracy") -> str:
    if cell is None:
        return ""
    return "n/a" if cell.get("selected") is None else _pm(cell[metric])


def _privacy_text(per_seed: Sequence[Mapping[str, Any]]) -> str:
    """The selected runs' epsilon (delta), each value once ("7.996 (1e-05)"); "" without DP."""
    spent = dict.fromkeys(
        f"{p['dp_epsilon']:.4g} ({p['dp_delta']:g})" for p in per_seed if "dp_epsilon" in p)
    return ", ".join(spent)


def table_markdown(table: Mapping[str, Any]) -> str:
    """The table in markdown, shaped like the paper's Table 1 (rows: data / split; columns:
    methods), then the macro-F1 table, the selected grid points, and the rule used."""
    methods = [m for m in table["methods"] if any(m in r["cells"] for r in table["rows"])]
    labels = [table["labels"].get(m, m) for m in methods]
    n_seeds = sorted({len(r["seeds"]) for r in table["rows"]})
    lines = []
    if table.get("title"):
        lines += [f"**{table['title']}**", ""]
    header = "| data / split | " + " | ".join(labels) + " |"
    rule = "|---|" + "---|" * len(methods)
    lines += ["Target test accuracy (%), mean ± std over seeds", "", header, rule]
    for row in table["rows"]:
        competitors = {
            m: c["mean"]
            for m, c in row["cells"].items()
            # Not a reference (`Method.reference`: the Oracle): bold marks the best of the others.
            if not is_reference(m) and c.get("selected") is not None
        }
        best = {m for m, mean in competitors.items() if mean == max(competitors.values())}
        cells = [_cell_text(row["cells"].get(m)) for m in methods]
        cells = [f"**{text}**" if m in best else text for m, text in zip(methods, cells)]
        lines.append(f"| {row['row']} | " + " | ".join(cells) + " |")
        if any(m in row.get("paper", {}) for m in methods):  # no line of empty cells
            paper = [_pm(row["paper"][m]) if m in row["paper"] else "" for m in methods]
            lines.append("| ↳ paper | " + " | ".join(paper) + " |")
    lines += [
        "",
        "Target test macro-F1 (%), mean ± std over seeds. Macro-F1: the unweighted mean of each "
        "class's F1 = 2 TP / (2 TP + FP + FN) over the classes present in the target's test "
        "labels (a prediction of a class the target lacks is an error of the true class; the "
        "absent class is not averaged in as F1 = 0).",
        "",
        header,
        rule,
    ]
    for row in table["rows"]:
        cells = [_cell_text(row["cells"].get(m), "target_macro_f1") for m in methods]
        lines.append(f"| {row['row']} | " + " | ".join(cells) + " |")
    # DP runs' epsilon (delta): a column only when a selected run is private.
    private = any("dp_epsilon" in p for r in table["rows"] for c in r["cells"].values()
                  for p in c.get("per_seed") or ())
    lines += [
        "",
        "Selected on the target validation set" + (
            "; ε (δ): DP on updates, spent over each run's rounds, per client" if private
            else ""),
        "",
        "| data / split | method | selected | val acc (%) | best-val rounds |"
        + " ε (δ) |" * private,
        "|---|---|---|---|---|" + "---|" * private,
    ]
    for row in table["rows"]:
        for m in methods:
            cell = row["cells"].get(m)
            if cell is None:
                continue
            if cell["selected"] is None:
                lines.append(f"| {row['row']} | {table['labels'].get(m, m)} | none eligible | | |"
                             + " |" * private)
                continue
            if table["selection"] == "mean_over_seeds":
                selected = hparams_label(cell["selected"])
            else:
                selected = "; ".join(hparams_label(h) for h in cell["selected"])
            rounds = ", ".join(str(p["round"]) for p in cell["per_seed"])
            lines.append(
                f"| {row['row']} | {table['labels'].get(m, m)} | {selected} | "
                f"{100 * cell['val_accuracy']['mean']:.1f} | {rounds} |"
                + (f" {_privacy_text(cell['per_seed'])} |" if private else "")
            )
    seeds_text = "/".join(str(n) for n in n_seeds)
    seeds_word = "seed" if n_seeds and max(n_seeds) == 1 else "seeds"
    lines += ["", f"Protocol: {table['protocol']} ({seeds_text} {seeds_word} per row)."]
    runs = table.get("runs")
    if runs and runs.get("not_finished"):
        counts = collections.Counter(runs["not_finished"].values())
        listed = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        lines.append(
            f"Runs: {runs['total']} in the sweep; not eligible: {listed} (names in table.json)."
        )
    return "\n".join(lines)


def write_protocol_report(
    directory: str, table: Mapping[str, Any], *, plot: bool = True
) -> dict[str, str]:
    """Writes `table.md`, `table.json` and (plot=True) `comparison.png` to `directory`;
    returns their paths."""
    from fedjax_pals.experiment.plots import plot_comparison

    os.makedirs(directory, exist_ok=True)
    paths = {
        "markdown": os.path.join(directory, "table.md"),
        "json": os.path.join(directory, "table.json"),
    }
    _atomic_write(paths["markdown"], table_markdown(table) + "\n")
    _atomic_write(paths["json"], json.dumps(table, indent=2) + "\n")
    rows = [
        r for r in table["rows"] if any(c.get("selected") is not None for c in r["cells"].values())
    ]
    if plot and rows:
        paths["comparison"] = os.path.join(directory, "comparison.png")
        plot_rows = [
            {
                "row": r["row"],
                "cells": {
                    table["labels"].get(m, m): c
                    for m, c in r["cells"].items()
                    if c.get("selected") is not None
                },
                "paper": {table["labels"].get(m, m): p for m, p in (r.get("paper") or {}).items()},
            }
            for r in rows
        ]
        plot_comparison(
            paths["comparison"], plot_rows, table.get("title") or "target test accuracy"
        )
    return paths


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def paired_differences(table: Mapping[str, Any], reference: str) -> list[dict[str, Any]]:
    """Each method's target accuracy against `reference`'s, seed by seed, in every row.

    The difference on seed s is d_s = acc(method, s) - acc(reference, s), each at its cell's
    selected point and best-validation round (the values the table's mean is over), in points.
    Over the n seeds both cells hold: the mean, the sample standard deviation (ddof 1), how
    many seeds are ahead and behind, and the two-sided paired t-test's p: t = mean(d) /
    (std(d) / sqrt(n)) on n - 1 degrees of freedom (None where n < 2 or every d_s is equal,
    where the test says nothing). Three seeds or eight: p is a description of these seeds,
    not a guarantee about others.

    Returns:
      One dict per (row, method) with both cells selected, in the table's order: row, method,
      label, seeds, differences, mean, std, ahead, behind, p.
    """
    from scipy import stats

    if reference not in table["methods"]:
        raise ValueError(
            f"the reference method {reference!r} is not in the table; its methods are "
            f"{list(table['methods'])}.")
    out = []
    for row in table["rows"]:
        base = row["cells"].get(reference)
        if base is None or base.get("selected") is None:
            continue
        base_by_seed = {p["seed"]: p["target_accuracy"] for p in base["per_seed"]}
        for method in table["methods"]:
            cell = row["cells"].get(method)
            if method == reference or cell is None or cell.get("selected") is None:
                continue
            seeds = [p["seed"] for p in cell["per_seed"] if p["seed"] in base_by_seed]
            by_seed = {p["seed"]: p["target_accuracy"] for p in cell["per_seed"]}
            d = np.asarray([100 * (by_seed[s] - base_by_seed[s]) for s in seeds], np.float64)
            std = float(d.std(ddof=1)) if len(d) > 1 else None
            p = None
            if std is not None and std > 1e-9:  # equal differences (to rounding): no test
                t = d.mean() / (std / math.sqrt(len(d)))
                p = float(2 * stats.t.sf(abs(t), len(d) - 1))
            out.append({
                "row": row["row"], "method": method,
                "label": table["labels"].get(method, method), "seeds": seeds,
                "differences": [float(x) for x in d], "mean": float(d.mean()) if len(d) else None,
                "std": std, "ahead": int((d > 0).sum()), "behind": int((d < 0).sum()), "p": p,
            })
    return out


def paired_markdown(pairs: Sequence[Mapping[str, Any]], reference_label: str) -> str:
    """`paired_differences` as a markdown table, one line per (row, method); a pair whose
    cells share no seed says so."""
    # "FedPALS'", "FedAvg's"
    possessive = reference_label + ("'" if reference_label.lower().endswith("s") else "'s")
    lines = [
        f"Target test accuracy minus {possessive}, seed by seed (points): mean, sample "
        "std (ddof 1), seeds ahead / behind, two-sided paired t-test p",
        "",
        "| data / split | method | mean difference | std | ahead / behind | p | per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        if not pair["seeds"]:  # both cells selected, on disjoint seeds: nothing to pair
            lines.append(f"| {pair['row']} | {pair['label']} | - | - | 0 / 0 | - | "
                         "no seed in common |")
            continue
        per_seed = ", ".join(f"{d:+.1f}" for d in pair["differences"])
        lines.append(
            f"| {pair['row']} | {pair['label']} | {pair['mean']:+.1f} | "
            + ("-" if pair["std"] is None else f"{pair['std']:.1f}")
            + f" | {pair['ahead']} / {pair['behind']} | "
            + ("-" if pair["p"] is None else f"{pair['p']:.2g}") + f" | {per_seed} |")
    return "\n".join(lines)


def write_paired_report(workdir: str, table: Mapping[str, Any], reference: str) -> str:
    """Writes paired.md and paired.json (`paired_differences` against `reference`) to
    `workdir`; returns the markdown."""
    pairs = paired_differences(table, reference)
    text = paired_markdown(pairs, table["labels"].get(reference, reference))
    os.makedirs(workdir, exist_ok=True)
    _atomic_write(os.path.join(workdir, "paired.md"), text + "\n")
    _atomic_write(os.path.join(workdir, "paired.json"), json.dumps(pairs, indent=1) + "\n")
    return text


def merge_tables(tables: Sequence[Mapping[str, Any]], *, title: str = "") -> dict[str, Any]:
    """Several tables (e.g. one per Table-1 row config) as one: rows concatenated, methods in
    first-seen order. Rows of the same label and seeds (one task, e.g. Table 1's sweep and a
    sweep of a further method on the same row) become one row holding the cells of both; the
    same method in both is an error. The tables must use the same selection rule."""
    if not tables:
        raise ValueError("merge_tables needs at least one table.")
    selections = {t["selection"] for t in tables}
    if len(selections) != 1:
        raise ValueError(f"the tables use different selection rules: {sorted(selections)}.")
    methods = list(dict.fromkeys(m for t in tables for m in t["methods"]))
    labels = {m: method_label(m) for m in methods}
    for t in tables:
        labels.update(t.get("labels", {}))
    return {
        "title": title,
        "selection": tables[0]["selection"],
        "protocol": tables[0]["protocol"],
        "methods": methods,
        "labels": labels,
        "rows": _merged_rows([row for t in tables for row in t["rows"]]),
    }


def _merged_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        label = row["row"]
        into = merged.setdefault(label, {**row, "cells": {}, "paper": {}})  # filled below
        if list(into["seeds"]) != list(row["seeds"]):
            raise ValueError(
                f"row {label!r} appears twice with different seeds ({into['seeds']} and "
                f"{row['seeds']}); merge rows of the same task only."
            )
        twice = sorted(set(into["cells"]) & set(row["cells"]))
        if twice:
            raise ValueError(f"row {label!r}: methods {twice} appear in more than one table.")
        into["cells"].update(row["cells"])
        into["paper"].update(row.get("paper", {}))
    return list(merged.values())
