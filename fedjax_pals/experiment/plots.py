"""Pictures of runs and sweeps (matplotlib, Agg backend; every function writes one PNG).

* `plot_curves`: target accuracy per round, test solid and validation dotted, one colour per
  run; a curve with one list per seed is drawn as its mean with a +-1 std band.
* `plot_comparison`: a Table-1-style chart, one group per row (data set / split), one marker
  per method at its mean target test accuracy with +-1 std error bars (the paper's number,
  when given, as a hollow marker beside it).
* `plot_weights_vs_ess`: aggregation weights alpha per client for several lambda (labelled by
  their ESS) as bars, FedAvg's n_i / N as dots, clients sorted by size (the paper's Fig. 4).
* `plot_accuracy_vs_axis`: target accuracy against a task axis (epsilon, E, clients).
* `plot_lambda_trajectories`: lambda per round of adaptive-lambda runs.
* `plot_accuracy_vs_distance`: target accuracy against the projection distance d(T, S) of the
  synthetic task (the paper's Fig. 9), mean +- std over seeds per method.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any, Mapping, Sequence

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _check_path(path: str) -> str:
    path = os.fspath(path)
    if not path.endswith((".png", ".pdf", ".svg")):
        raise ValueError(f"path must end with .png, .pdf or .svg, got {path!r}.")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"the directory of path {path!r} does not exist.")
    return path


def _title(ax, title: str) -> None:
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=10)


def plot_curves(path: str, curves: Mapping[str, Mapping[str, Any]], title: str) -> None:
    """Target accuracy per round: test solid, validation dotted, one colour per curve.

    Args:
      path: the image file to write.
      curves: label -> {"rounds": [r...], "target_accuracy": ..., "val_accuracy": ...}; each
        accuracy is a list over rounds, or a list over seeds of such lists (drawn as the mean
        with a +-1 std band around the test curve). A results dict of `train_and_evaluate` is
        a valid curve.
      title: the plot's title.
    """
    path = _check_path(path)
    if not curves:
        raise ValueError("curves is empty: give at least one labelled curve.")
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    handles = []
    for index, (label, curve) in enumerate(curves.items()):
        color = f"C{index % 10}"
        rounds = np.asarray(curve["rounds"])
        for key, style in (("target_accuracy", "-"), ("val_accuracy", ":")):
            if key not in curve:
                continue
            values = np.asarray(curve[key], dtype=float)
            if values.shape[-1] != rounds.shape[0]:
                raise ValueError(
                    f"curve {label!r}: {key} has {values.shape[-1]} values per seed but there "
                    f"are {rounds.shape[0]} rounds."
                )
            mean = values.mean(0) if values.ndim == 2 else values
            ax.plot(rounds, mean, style, color=color, marker="." if len(rounds) < 15 else None)
            if values.ndim == 2 and key == "target_accuracy" and len(values) > 1:
                std = values.std(0)
                ax.fill_between(
                    rounds, mean - std, mean + std, color=color, alpha=0.15, linewidth=0
                )
        handles.append(Line2D([], [], color=color, label=label))
    handles += [
        Line2D([], [], color="gray", linestyle="-", label="target test"),
        Line2D([], [], color="gray", linestyle=":", label="target validation"),
    ]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_comparison(path: str, table_rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """A Table-1-shaped chart: per row, each method's mean target test accuracy +- 1 std.

    Args:
      path: the image file to write.
      table_rows: the rows of `protocol.comparison_table` (also `table.json["rows"]`): each
        `{"row": label, "cells": {method: {"mean": m, "std": s, ...}}}` with accuracies as
        fractions, optionally `"paper": {method: {"mean": m, "std": s}}` (fractions too).
      title: the plot's title.
    """
    path = _check_path(path)
    if not table_rows:
        raise ValueError("table_rows is empty: give at least one row.")
    methods: list[str] = []
    for row in table_rows:
        for method in row["cells"]:
            if method not in methods:
                methods.append(method)
    plt = _pyplot()
    width = max(6.0, 1.2 + 0.45 * len(methods) * len(table_rows))
    fig, ax = plt.subplots(figsize=(min(width, 16.0), 4.2))
    spread = 0.8 / max(len(methods), 1)
    for m, method in enumerate(methods):
        color = f"C{m % 10}"
        for r, row in enumerate(table_rows):
            x = r + (m - (len(methods) - 1) / 2) * spread
            cell = row["cells"].get(method)
            if cell is not None and cell.get("mean") is not None:
                ax.errorbar(
                    x,
                    100 * cell["mean"],
                    yerr=100 * (cell.get("std") or 0.0),
                    fmt="o",
                    color=color,
                    capsize=3,
                    label=method if r == 0 else None,
                )
            paper = (row.get("paper") or {}).get(method)
            if paper is not None:
                ax.errorbar(
                    x + spread * 0.3,
                    100 * paper["mean"],
                    yerr=100 * (paper.get("std") or 0.0),
                    fmt="o",
                    mfc="none",
                    color=color,
                    alpha=0.6,
                    capsize=2,
                )
    if any(row.get("paper") for row in table_rows):
        ax.plot([], [], "o", mfc="none", color="gray", label="paper (hollow)")
    ax.set_xlim(-0.6, len(table_rows) - 0.4)
    ax.set_xticks(range(len(table_rows)))
    ax.set_xticklabels([str(row["row"]) for row in table_rows], fontsize=8)
    ax.set_ylabel("target test accuracy (%)")
    _title(ax, title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_weights_vs_ess(
    path: str,
    sizes: Sequence[float],
    alphas_by_label: Mapping[str, Sequence[float]],
    fedavg: Sequence[float] | None = None,
    *,
    title: str = "FedPALS weights by effective sample size",
) -> None:
    """Aggregation weights per client, clients sorted by size (descending), as in the paper's
    Fig. 4: one bar series per lambda (label e.g. "ESS 25 %"), FedAvg's weights as dots.

    Args:
      path: the image file to write.
      sizes: client sizes n_i, shape (M,).
      alphas_by_label: label -> alpha, each of shape (M,).
      fedavg: FedAvg's weights (default n_i / N).
      title: the plot's title.
    """
    path = _check_path(path)
    sizes = np.asarray(sizes, dtype=float)
    if sizes.ndim != 1 or sizes.size == 0 or (sizes <= 0).any():
        raise ValueError(f"sizes must be a non-empty vector of positive sizes, got {sizes}.")
    if not alphas_by_label:
        raise ValueError("alphas_by_label is empty: give at least one alpha.")
    for label, alpha in alphas_by_label.items():
        if np.shape(alpha) != sizes.shape:
            raise ValueError(
                f"alpha {label!r} has shape {np.shape(alpha)}, expected {sizes.shape} (one "
                "weight per client)."
            )
    fedavg = sizes / sizes.sum() if fedavg is None else np.asarray(fedavg, dtype=float)
    order = np.argsort(-sizes, kind="stable")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * sizes.size + 2), 3.8))
    width = 0.8 / len(alphas_by_label)
    positions = np.arange(sizes.size)
    for index, (label, alpha) in enumerate(alphas_by_label.items()):
        offset = (index - (len(alphas_by_label) - 1) / 2) * width
        ax.bar(positions + offset, np.asarray(alpha)[order], width, label=label, color=f"C{index}")
    ax.plot(positions, fedavg[order], "ko", markersize=4, label="FedAvg")
    ax.set_xticks(positions)
    ax.set_xticklabels([str(i) for i in order], fontsize=8)
    ax.set_xlabel("client (sorted by size, largest first)")
    ax.set_ylabel("aggregation weight")
    _title(ax, title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accuracy_vs_distance(
    path: str, points: Mapping[str, Sequence[Mapping[str, Any]]], title: str
) -> None:
    """Target accuracy against the projection distance d(T, S) (the paper's Fig. 9).

    Args:
      path: the image file to write.
      points: method -> [{"projection_distance": d, "target_accuracy": [per seed]}, ...].
      title: the plot's title.
    """
    path = _check_path(path)
    if not points:
        raise ValueError("points is empty: give at least one method.")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for index, (method, series) in enumerate(points.items()):
        series = sorted(series, key=lambda p: p["projection_distance"])
        distance = [p["projection_distance"] for p in series]
        mean = [100 * np.mean(p["target_accuracy"]) for p in series]
        std = [100 * np.std(p["target_accuracy"]) for p in series]
        ax.errorbar(
            distance, mean, yerr=std, marker="o", capsize=3, color=f"C{index}", label=method
        )
    ax.set_xlabel("projection distance d(T, S)")
    ax.set_ylabel("target accuracy (%)")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accuracy_vs_axis(
    path: str, series: Mapping[str, Sequence[Mapping[str, Any]]], x_label: str, title: str
) -> None:
    """Target accuracy (mean +- std over seeds) against a task axis: epsilon, E, clients, ...

    Args:
      path: the image file to write.
      series: line label -> [{"x": value, "target_accuracy": [per seed]}, ...]. A point with
        x None (e.g. epsilon None: no privacy) is drawn as a dashed horizontal line of the
        line's colour. The x axis is logarithmic when the values span more than two decades.
      x_label: the axis' name.
      title: the plot's title.
    """
    path = _check_path(path)
    if not series:
        raise ValueError("series is empty: give at least one line.")
    xs = [p["x"] for points in series.values() for p in points if p["x"] is not None]
    if not xs:
        raise ValueError("series has no point with a numeric x.")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for index, (label, points) in enumerate(series.items()):
        color = f"C{index % 10}"
        numeric = sorted((p for p in points if p["x"] is not None), key=lambda p: p["x"])
        if numeric:
            ax.errorbar(
                [p["x"] for p in numeric],
                [100 * np.mean(p["target_accuracy"]) for p in numeric],
                yerr=[100 * np.std(p["target_accuracy"]) for p in numeric],
                marker="o",
                capsize=3,
                color=color,
                label=label,
            )
        for p in points:
            if p["x"] is None:
                ax.axhline(
                    100 * np.mean(p["target_accuracy"]),
                    color=color,
                    linestyle="--",
                    linewidth=1,
                    label=f"{label}, {x_label}=None",
                )
    positive = [x for x in xs if x > 0]
    if len(positive) == len(xs) and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel("target accuracy (%)")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_lambda_trajectories(
    path: str, trajectories: Mapping[str, Sequence[float]], title: str
) -> None:
    """lambda per round (log scale) of adaptive-lambda runs, one line per run.

    Args:
      path: the image file to write.
      trajectories: label (e.g. "seed 0") -> the lambda used in rounds 1, 2, ...
      title: the plot's title.
    """
    path = _check_path(path)
    if not trajectories:
        raise ValueError("trajectories is empty: give at least one run.")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for index, (label, lams) in enumerate(trajectories.items()):
        lams = np.asarray(lams, dtype=float)
        if lams.ndim != 1 or lams.size == 0 or not np.all(lams > 0):
            raise ValueError(f"trajectory {label!r} must be a non-empty vector of lambdas > 0.")
        ax.plot(np.arange(1, lams.size + 1), lams, marker=".", color=f"C{index % 10}", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("lambda")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
