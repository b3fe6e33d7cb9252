"""Pictures of runs and sweeps (matplotlib, Agg backend; every function writes one figure, and
a vector PDF beside every PNG).

One style for every figure: each method has its colour and marker (`method_style`, by method
name or its display label) and is shown by its display label (`display_label`: the tables'
`fedjax_pals.method_label`), accuracies are in %, axes are named by symbols and words
(`axis_label`: lambda, epsilon, E, number of clients), and every legend with bands or error
bars says "mean ± 1 std over n seeds". Figures are laid out by matplotlib's constrained
layout with the title centred on the figure and wrapped to its width: every text (title,
ticks, labels, legends) lies inside the figure (tests/test_plots.py checks it). `file_stem`
names a figure's file after a table row.

The figures (each function's docstring says what it draws; each takes `path`, the image file
to write, .png, .pdf or .svg, and the figure's `title`): `plot_curves` (accuracy per round),
`plot_comparison` (the table's numbers, Table 1), `plot_weights_vs_ess` (Fig. 4),
`plot_accuracy_vs_axis` (against epsilon, E, clients...), `plot_lambda_trajectories`,
`plot_accuracy_vs_distance` (Fig. 9), `plot_label_distributions`, `plot_target_estimation`.
"""

from __future__ import annotations

import os
import re
import textwrap
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from fedjax_pals.algorithms.registry import hyperparameter_labels, method_labels
from fedjax_pals.algorithms.styles import method_styles


_SPARE_STYLES = [
    ("#393b79", "o"),
    ("#637939", "s"),
    ("#8c6d31", "^"),
    ("#843c39", "v"),
    ("#7b4173", "D"),
    ("#3182bd", "P"),
    ("#31a354", "X"),
    ("#756bb1", "h"),
]
# Series of one method that differ in a setting (FedPALS' lambdas in the weights figure): a
# qualitative palette (mostly Okabe and Ito's, colour-blind safe) without FedAvg's blue; any two
# differ by CIELAB Delta E > 30, and each from FedAvg's blue by > 40.
SERIES_COLORS = ("#D55E00", "#009E73", "#E69F00", "#CC79A7", "#8C564B", "#F0E442", "#999999")
# A data set's name (config.dataset.name) -> its class names in label order, for the axes that
# name classes; other data sets show class indices.
# fmt: off
CLASS_NAMES = {
    "fashion_mnist": (
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
        "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    ),
    "cifar10": (
        "airplane", "automobile", "bird", "cat", "deer",
        "dog", "frog", "horse", "ship", "truck",
    ),
}
# fmt: on
# Config keys (the last part of a dotted key) -> what an axis says.
AXIS_LABELS = {
    "label_dp_epsilon": "privacy budget ε",
    "local_epochs": "local epochs E",
    "num_clients": "number of clients",
    "clients_per_round": "clients per round",
    "client_fraction": "fraction of clients per round",
    "labels_per_client": "labels per client C",
    "dirichlet_beta": "Dirichlet β",
    "target_perturbation": "perturbation of T",
    "synthetic_delta": "δ",
    "learning_rate": "learning rate",
    "batch_size": "batch size",
    "rounds": "rounds",
    "prox_mu": "μ (FedProx)",
    "fedrs_alpha": "α (FedRS)",
    "fedlc_tau": "τ (FedLC)",
    "iwerm_max_ratio": "cap on T(y)/S_i(y) (IW-ERM)",
    "fedvls_lambda": "λ (FedVLS)",
    "fedvls_ls_weight": "logit-suppression weight (FedVLS)",
    "projection_distance": "projection distance d(T, S)",
}


def _method_key(label: str) -> str | None:
    """The method of a key or of its display label (the longest known label it starts with)."""
    if label in method_styles():
        return label
    best = None
    for key, shown in method_labels().items():
        for name in (shown, key):
            if (label == name or label.startswith(name + " ")) and (
                best is None or len(name) > len(best[1])
            ):
                best = (key, name)
    return None if best is None else best[0]


def method_style(label: str) -> dict[str, str]:
    """`{"color", "marker"}` of a method (its key, e.g. "fedpals", or its display label, e.g.
    "FedPALS (ess_fraction=0.5)"): the same in every figure; unknown labels get a spare
    style chosen from the label itself, so they too are stable across figures."""
    key = _method_key(str(label))
    styles = method_styles()
    if key is not None and key in styles:
        color, marker = styles[key]
    else:
        color, marker = _SPARE_STYLES[zlib.crc32(str(label).encode()) % len(_SPARE_STYLES)]
    return {"color": color, "marker": marker}


def dataset_class_names(dataset: str | None, num_classes: int) -> tuple[str, ...]:
    """The class names of a data set (`CLASS_NAMES`) when it has them and they are
    num_classes; else the class indices "0" ... "K-1"."""
    names = CLASS_NAMES.get(str(dataset)) if dataset is not None else None
    if names is not None and len(names) == num_classes:
        return tuple(names)
    return tuple(str(k) for k in range(num_classes))


def axis_label(key: str) -> str:
    """A config key (e.g. "algorithm.label_dp_epsilon") as an axis says it ("privacy budget
    ε"): its registration's label (`hyperparameter(..., label=...)`: FedPALS' "λ"), else
    `AXIS_LABELS`'; anything else unchanged."""
    leaf = str(key).rsplit(".", 1)[-1]
    return hyperparameter_labels().get(leaf) or AXIS_LABELS.get(leaf, str(key))


def _seeds_note(counts) -> str:
    """ "mean ± 1 std over n seeds" for the given per-point seed counts."""
    counts = sorted({int(c) for c in counts if c})
    if not counts:
        return "mean ± 1 std"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"mean ± 1 std over {n} seed{'s' if counts[-1] != 1 else ''}"


def _seeds_entry(ax, seeds) -> None:
    """A legend entry (an error-bar glyph) saying what the bars and bands are."""
    ax.plot([], [], "|", markersize=10, color="gray", label=_seeds_note(seeds))


def _save(fig, path: str, title: str) -> None:
    """Titles the figure, writes `path` (150 dpi for a PNG) and, beside a PNG, the same figure
    as a vector PDF, then closes it."""
    _title(fig, title)
    fig.savefig(path, dpi=150)
    if path.endswith(".png"):
        fig.savefig(path[: -len(".png")] + ".pdf")
    _pyplot().close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _check_path(path: str, **nonempty) -> str:
    """`path` checked; `name=(value, what)` also checks that value is not empty."""
    path = os.fspath(path)
    if not path.endswith((".png", ".pdf", ".svg")):
        raise ValueError(f"path must end with .png, .pdf or .svg, got {path!r}.")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"the directory of path {path!r} does not exist.")
    for name, (value, what) in nonempty.items():
        if not value:
            raise ValueError(f"{name} is empty: give at least {what}.")
    return path


def _figure(figsize, **kwargs):
    """A figure and its axes, laid out by constrained layout: the title, tick labels,
    colour bars and legends (inside or beside the axes) all stay inside the figure."""
    return _pyplot().subplots(figsize=figsize, layout="constrained", **kwargs)


# A space that does not break a title's line while it is wrapped (restored to a space after).
_GLUE = "\u00a0"


def _glued(title: str, phrases: bool) -> str:
    """`title` with the spaces inside parentheses glued, and with `phrases` every space but
    those after a ",", ":" or ";" too."""
    depth, out = 0, []
    for i, char in enumerate(title):
        depth = depth + (char == "(") - (char == ")" and depth > 0)
        breaks = depth == 0 and (not phrases or (i > 0 and title[i - 1] in ",:;"))
        out.append(_GLUE if char == " " and not breaks else char)
    return "".join(out)


def wrap_title(title: str, width: int) -> list[str]:
    """A title's lines of about `width` characters at most, broken at sensible points: after a
    ",", ":" or ";" when that takes no more lines than breaking between words does, else
    between words, but never inside parentheses ("(incl. target)" stays whole), at a hyphen
    ("Fashion-MNIST") or inside a word (a longer unbreakable piece keeps its own line); of
    even length (no lone last word): the narrowest wrap with as few lines."""

    def wrap(text: str, w: int) -> list[str]:
        return textwrap.wrap(text, w, break_on_hyphens=False, break_long_words=False)

    title = str(title)
    words, phrases = _glued(title, False), _glued(title, True)
    text = phrases if len(wrap(phrases, width)) <= len(wrap(words, width)) else words
    lines = wrap(text, width)
    while len(lines) > 1 and width > 20 and len(wrap(text, width - 1)) <= len(lines):
        width -= 1
    return [line.replace(_GLUE, " ") for line in wrap(text, width)]


def with_dataset(title: str, dataset: str) -> str:
    """A run's figure title that names its data set: "Fashion-MNIST: FedPALS on sparsity C=3
    ..."; `title` as it is when it names the data set already (any case: "synthetic label
    shift ..." for "Synthetic")."""
    title, dataset = str(title), str(dataset)
    return title if dataset.lower() in title.lower() else f"{dataset}: {title}"


def _title(fig, title: str, fontsize: float = 10) -> None:
    """The figure's title, centred on the figure and wrapped to its width (a title centred on
    a narrow axes with a legend beside it would run off the figure's left edge): `wrap_title`."""
    # DejaVu Sans averages about 0.55 em a character: 0.62 em leaves a margin.
    width = max(20, int(fig.get_figwidth() * 72 / (0.62 * fontsize)) - 2)
    fig.suptitle("\n".join(wrap_title(title, width)), fontsize=fontsize)


# A legend beside the axes, right of them.
_BESIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _finish(fig, ax, path: str, title: str, grid: str = "both", **legend) -> None:
    """The end every one-panel figure shares: title, grid, legend, then saved and closed."""
    ax.grid(alpha=0.3, axis=grid)
    ax.legend(**legend)
    _save(fig, path, title)


def display_label(label: str) -> str:
    """What a figure shows for a curve or a method: a method key (e.g. "fedprox_fedpals") as
    its display label ("FedProx+FedPALS", `fedjax_pals.method_label`, the labels of the
    tables); anything else (already a label, "seed 0", ...) unchanged."""
    label = str(label)
    return method_labels().get(label, label)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def file_stem(text: str) -> str:
    """A file name (without extension) for a figure of `text` (e.g. a table row): `=`,
    brackets, commas and quotes dropped, a slash one `_`, every other run of characters outside
    [A-Za-z0-9._+-] (spaces included) one `_`; stable, so the same row has the same file in
    every sweep. "Fashion-MNIST C=3" -> "Fashion-MNIST_C3", "CIFAR-10 C=3 (dirichlet)" ->
    "CIFAR-10_C3_dirichlet"."""
    text = re.sub(r"[=()\[\]{},'\"/\\]+", lambda m: "" if "/" not in m.group() else "_", str(text))
    stem = _UNSAFE.sub("_", text).strip("_.-")
    return stem or "figure"


def file_stems(texts: Sequence[str]) -> dict[str, str]:
    """`file_stem` of each text, made unique by `_2`, `_3`, ... in the order given (two rows
    differing only in dropped characters would otherwise share a file)."""
    stems: dict[str, str] = {}
    for text in dict.fromkeys(texts):
        stem, k = file_stem(text), 1
        while (stem if k == 1 else f"{stem}_{k}") in stems.values():
            k += 1
        stems[text] = stem if k == 1 else f"{stem}_{k}"
    return stems


def plot_curves(
    path: str,
    curves: Mapping[str, Mapping[str, Any]],
    title: str,
    *,
    y_range: tuple[float, float] | None = (0.0, 100.0),
) -> None:
    """Target accuracy per round: test solid, validation dotted, one colour per curve.

    The accuracy axis is fixed at `y_range` (%, default 0 to 100), so curves of different runs
    compare by eye and a change of a point does not fill the figure; None fits it to the data.

    Args:
      curves: label -> {"rounds": [r...], "target_accuracy": ..., "val_accuracy": ...}; each
        accuracy is a list over rounds, or a list over seeds of such lists (drawn as the mean
        with a +-1 std band around the test curve). A results dict of `train_and_evaluate` is
        a valid curve. A label that is a method key ("fedprox_fedpals") is shown as the
        method's display label ("FedProx+FedPALS"), as in the tables.
    """
    path = _check_path(path, curves=(curves, "one labelled curve"))
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure((8.0, 4.2))
    handles = []
    seeds = []
    band_alpha = 0.15 if len(curves) <= 3 else 0.07  # many bands stay readable
    for label, curve in curves.items():
        color = method_style(label)["color"]
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
            values = 100 * values
            mean = values.mean(0) if values.ndim == 2 else values
            ax.plot(rounds, mean, style, color=color, marker="." if len(rounds) < 15 else None)
            if values.ndim == 2 and key == "target_accuracy" and len(values) > 1:
                std = values.std(0)
                seeds.append(len(values))
                ax.fill_between(
                    rounds, mean - std, mean + std, color=color, alpha=band_alpha, linewidth=0
                )
        handles.append(Line2D([], [], color=color, label=display_label(label)))
    for linestyle, name in (("-", "target test"), (":", "target validation")):
        handles.append(Line2D([], [], color="gray", linestyle=linestyle, label=name))
    if seeds:
        from matplotlib.patches import Patch

        handles.append(Patch(color="gray", alpha=0.3, label=f"band: {_seeds_note(seeds)}"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y_range is not None:
        ax.set_ylim(*y_range)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    _finish(fig, ax, path, title, handles=handles, fontsize=8, **_BESIDE)


def plot_comparison(path: str, table_rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """A Table-1-shaped chart: per row, each method's mean target test accuracy +- 1 std.

    One row (a single data set / split): the methods along the x axis, each at its mean
    +- 1 std with the number written beside it ("71.3 ± 1.2", the table's cell), the legend
    inside the axes. Several rows: one group per row along the x axis, one marker per method,
    the legend beside the axes.

    Args:
      table_rows: the rows of `protocol.comparison_table` (also `table.json["rows"]`): each
        `{"row": label, "cells": {method: {"mean": m, "std": s, ...}}}` with accuracies as
        fractions, optionally `"paper": {method: {"mean": m, "std": s}}` (fractions too).
    """
    path = _check_path(path, table_rows=(table_rows, "one row"))
    if len(table_rows) == 1:
        _plot_comparison_one_row(path, table_rows[0], title)
        return
    methods = list(dict.fromkeys(method for row in table_rows for method in row["cells"]))
    width = max(6.0, 1.2 + 0.45 * len(methods) * len(table_rows))
    fig, ax = _figure((min(width, 16.0), 4.2))
    spread = 0.8 / max(len(methods), 1)
    seeds = []
    for m, method in enumerate(methods):
        style = method_style(method)
        marker = dict(fmt=style["marker"], color=style["color"])
        for r, row in enumerate(table_rows):
            x = r + (m - (len(methods) - 1) / 2) * spread
            cell = row["cells"].get(method)
            if cell is not None and cell.get("mean") is not None:
                seeds.append(_cell_seeds(cell))
                mean, std = _mean_std(cell)
                label = display_label(method) if r == 0 else None
                ax.errorbar(x, mean, yerr=std, capsize=3, label=label, **marker)
            paper = (row.get("paper") or {}).get(method)
            if paper is not None:
                mean, std = _mean_std(paper)
                ax.errorbar(x + spread * 0.3, mean, yerr=std, capsize=2, **marker, **_PAPER)
    if any(row.get("paper") for row in table_rows):
        ax.plot([], [], "o", mfc="none", color="gray", label="paper (hollow)")
    _seeds_entry(ax, seeds)
    ax.set_xlim(-0.6, len(table_rows) - 0.4)
    ax.set_xticks(range(len(table_rows)))
    ax.set_xticklabels([str(row["row"]) for row in table_rows], fontsize=8)
    ax.set_ylabel("target test accuracy (%)")
    _finish(fig, ax, path, title, "y", fontsize=8, **_BESIDE)


def _mean_std(cell: Mapping[str, Any]) -> tuple[float, float]:
    """A table cell's (or the paper's) mean and std, in %."""
    return 100 * cell["mean"], 100 * (cell.get("std") or 0.0)


# The paper's number beside a method's: the same marker, hollow and paler.
_PAPER = dict(mfc="none", alpha=0.6)


def _cell_seeds(cell: Mapping[str, Any]) -> int:
    """The number of seeds behind a table cell's mean and std."""
    return (cell.get("target_accuracy") or {}).get("n") or len(cell.get("per_seed") or [])


def _plot_comparison_one_row(path: str, row: Mapping[str, Any], title: str) -> None:
    """`plot_comparison` of a single row: methods against accuracy, numbers written out."""
    methods = [m for m, c in row["cells"].items() if c is not None and c.get("mean") is not None]
    paper = row.get("paper") or {}
    methods += [m for m in paper if m not in methods]
    fig, ax = _figure((max(5.6, 1.6 + 1.15 * len(methods)), 4.2))
    seeds, spans = [], []  # spans: (bottom, top) of every error bar
    offset = 0.18 if paper else 0.0
    for x, method in enumerate(methods):
        style = method_style(method)
        marker = dict(fmt=style["marker"], color=style["color"], markersize=8)
        cell = row["cells"].get(method)
        if cell is not None and cell.get("mean") is not None:
            mean, std = _mean_std(cell)
            seeds.append(_cell_seeds(cell))
            bars = dict(capsize=5, elinewidth=1.5, label=display_label(method))
            ax.errorbar(x - offset, mean, yerr=std, **bars, **marker)
            ax.annotate(
                f"{mean:.1f} ± {std:.1f}",
                (x - offset, mean + std),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                color=style["color"],
            )
            spans.append((mean - std, mean + std))
        if method in paper:
            mean, std = _mean_std(paper[method])
            ax.errorbar(x + offset, mean, yerr=std, capsize=3, **marker, **_PAPER)
            spans.append((mean - std, mean + std))
    if paper:
        ax.plot([], [], "o", mfc="none", color="gray", label="paper (hollow)")
    _seeds_entry(ax, seeds)
    # Room above the highest bar for its number and for the legend, one line inside the axes.
    low, high = min((b for b, _ in spans), default=0.0), max((t for _, t in spans), default=100.0)
    span = max(high - low, 2.0)
    ax.set_ylim(max(0.0, low - 0.15 * span), high + 0.3 * span)
    from matplotlib.ticker import MaxNLocator

    class _UpTo100(MaxNLocator):  # the headroom may pass 100 %; its ticks do not
        def tick_values(self, vmin, vmax):
            ticks = super().tick_values(vmin, vmax)
            return ticks[ticks <= 100.0 + 1e-9]

    ax.yaxis.set_major_locator(_UpTo100(steps=[1, 2, 2.5, 5, 10]))
    ax.set_xlim(-0.6, len(methods) - 0.4)
    ax.set_xticks(range(len(methods)))
    # The methods are named on the axis, in their colours; the legend says what the bars are.
    ax.set_xticklabels([display_label(m) for m in methods], fontsize=9)
    for tick, method in zip(ax.get_xticklabels(), methods):
        tick.set_color(method_style(method)["color"])
    ax.set_xlabel(str(row["row"]))
    ax.set_ylabel("target test accuracy (%)")
    shown = {display_label(m) for m in methods}
    handles = [h for h, label in zip(*ax.get_legend_handles_labels()) if label not in shown]
    legend = dict(handles=handles, fontsize=8, loc="upper center", ncol=len(handles))
    _finish(fig, ax, path, title, "y", **legend)


def plot_weights_vs_ess(
    path: str,
    sizes: Sequence[float],
    alphas_by_label: Mapping[str, Sequence[float]],
    fedavg: Sequence[float] | None = None,
    *,
    title: str = "server weights by effective sample size",
) -> None:
    """Aggregation weights per client, clients sorted by size (descending), as in the paper's
    Fig. 4: one bar series per lambda (label e.g. "ESS 25 %"), FedAvg's weights as dots.

    Args:
      sizes: client sizes n_i, shape (M,).
      alphas_by_label: label -> alpha, each of shape (M,).
      fedavg: FedAvg's weights (default n_i / N).
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
    fig, ax = _figure((min(18.0, max(6.5, 0.5 * sizes.size + 3.5)), 3.8))
    width = 0.8 / len(alphas_by_label)
    positions = np.arange(sizes.size)
    for index, (label, alpha) in enumerate(alphas_by_label.items()):
        offset = (index - (len(alphas_by_label) - 1) / 2) * width
        # One colour per lambda from a qualitative palette (shades of one red were hard to
        # tell apart), none of them FedAvg's blue.
        bars = dict(label=label, color=SERIES_COLORS[index % len(SERIES_COLORS)], linewidth=0.4)
        ax.bar(positions + offset, np.asarray(alpha)[order], width, edgecolor="white", **bars)
    style = method_style("fedavg")
    dots = dict(color=style["color"], markeredgecolor="black", markeredgewidth=0.6, markersize=6)
    ax.plot(positions, fedavg[order], style["marker"], label="FedAvg (n_i / N)", **dots)
    ax.set_xticks(positions)
    ax.set_xticklabels([str(i) for i in order], fontsize=8)
    ax.set_xlabel("client (sorted by size, largest first)")
    ax.set_ylabel("aggregation weight")
    _finish(fig, ax, path, title, "y", fontsize=8, **_BESIDE)


def plot_accuracy_vs_distance(
    path: str, points: Mapping[str, Sequence[Mapping[str, Any]]], title: str
) -> None:
    """Target accuracy against the projection distance d(T, S) (the paper's Fig. 9).

    Args:
      points: method -> [{"projection_distance": d, "target_accuracy": [per seed]}, ...].
    """
    path = _check_path(path, points=(points, "one method"))
    fig, ax = _figure((5.6, 3.8))
    seeds = []
    for method, series in points.items():
        series = sorted(series, key=lambda p: p["projection_distance"])
        distance = [p["projection_distance"] for p in series]
        mean = [100 * np.mean(p["target_accuracy"]) for p in series]
        std = [100 * np.std(p["target_accuracy"]) for p in series]
        seeds += [len(p["target_accuracy"]) for p in series]
        ax.errorbar(distance, mean, yerr=std, capsize=3, label=method, **method_style(method))
    _seeds_entry(ax, seeds)
    ax.set_xlabel(axis_label("projection_distance"))
    ax.set_ylabel("target accuracy (%)")
    _finish(fig, ax, path, title, fontsize=8)


_VARIANT_LINES = ("-", (0, (6, 2)), (0, (2, 1.5)), "-.")
_VARIANT_FILLS = ("full", "none", "left", "bottom")
_VARIANT_REFERENCES = ((0, (4, 3)), (0, (1, 2)), (0, (6, 2, 1, 2)), (0, (2, 4)))


def plot_accuracy_vs_axis(
    path: str, series: Mapping[str, Sequence[Mapping[str, Any]]], x_label: str, title: str
) -> None:
    """Target accuracy (mean +- std over seeds) against a task axis: epsilon, E, clients, ...

    Args:
      series: line label -> [{"x": value, "target_accuracy": [per seed]}, ...]. A point with
        x None (e.g. epsilon None: no privacy) is drawn as a dashed horizontal line of the
        line's colour. The x axis is logarithmic when the values span more than two decades.
      x_label: the axis' name; a config key (e.g. "label_dp_epsilon") is shown as its symbol
        or words (`axis_label`), in the title too.
    """
    path = _check_path(path, series=(series, "one line"))
    title, x_label = title.replace(str(x_label), axis_label(x_label)), axis_label(x_label)
    xs = [p["x"] for points in series.values() for p in points if p["x"] is not None]
    if not xs:
        raise ValueError("series has no point with a numeric x.")
    fig, ax = _figure((6.4, 4.0))
    seeds = []
    variants: dict = {}  # a method's colour -> how many of its lines are drawn
    for label, points in series.items():
        style = method_style(label)
        color = style["color"]
        # Lines of one method (e.g. "FedPALS (num_clients=10)" and "(num_clients=100)") keep
        # its colour and marker; they differ by line style and marker fill.
        k = variants.get(color, 0)
        variants[color] = k + 1
        numeric = sorted((p for p in points if p["x"] is not None), key=lambda p: p["x"])
        seeds += [len(p["target_accuracy"]) for p in points]
        if numeric:
            ax.errorbar(
                [p["x"] for p in numeric],
                [100 * np.mean(p["target_accuracy"]) for p in numeric],
                yerr=[100 * np.std(p["target_accuracy"]) for p in numeric],
                capsize=3,
                label=label,
                linestyle=_VARIANT_LINES[k % len(_VARIANT_LINES)],
                fillstyle=_VARIANT_FILLS[k % len(_VARIANT_FILLS)],
                **style,
            )
        for p in points:
            if p["x"] is None:
                ax.axhline(
                    100 * np.mean(p["target_accuracy"]),
                    color=color,
                    linestyle=_VARIANT_REFERENCES[k % len(_VARIANT_REFERENCES)],
                    linewidth=1,
                    label=f"{label}, no {x_label}",
                )
    _seeds_entry(ax, seeds)
    positive = [x for x in xs if x > 0]
    if len(positive) == len(xs) and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel("target accuracy (%)")
    _finish(fig, ax, path, title, fontsize=7)


def plot_lambda_trajectories(
    path: str, trajectories: Mapping[str, Sequence[float]], title: str
) -> None:
    """lambda per round (log scale) of adaptive-lambda runs, one line per run.

    Args:
      trajectories: label (e.g. "seed 0") -> the lambda used in rounds 1, 2, ...
    """
    path = _check_path(path, trajectories=(trajectories, "one run"))
    fig, ax = _figure((5.6, 3.8))
    for index, (label, lams) in enumerate(trajectories.items()):
        lams = np.asarray(lams, dtype=float)
        if lams.ndim != 1 or lams.size == 0 or not np.all(lams > 0):
            raise ValueError(f"trajectory {label!r} must be a non-empty vector of lambdas > 0.")
        ax.plot(np.arange(1, lams.size + 1), lams, marker=".", color=f"C{index % 10}", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("λ")
    _finish(fig, ax, path, title, fontsize=7, ncol=2)


def plot_label_distributions(
    path: str,
    client_label_dists: Sequence[Sequence[float]],
    target_label_dist: Sequence[float],
    alphas: Mapping[str, Sequence[float]],
    *,
    title: str = "clients' label distributions, T and the server weights",
    class_names: Sequence[str] | None = None,
    dataset: str | None = None,
) -> None:
    """The label-shift picture: the clients' label distributions S_i(Y) as a heatmap (one row
    per client), the target's T(Y) as a row beneath them, and next to each client row its
    weight alpha_i under each method (e.g. FedPALS and FedAvg) as bars.

    Args:
      client_label_dists: S, shape (M, K), rows on the simplex.
      target_label_dist: T, shape (K,).
      alphas: method -> alpha, each of shape (M,) (drawn in the method's colour).
      class_names: the K class names (default: those of `dataset`, else 0 ... K-1).
      dataset: the data set's name (e.g. "fashion_mnist"), whose class names (`CLASS_NAMES`)
        label the classes when class_names is not given.

    The heatmap draws a probability of 0 white (a class the client does not have) and every
    probability > 0 on viridis, so that 0 and a small share stand apart.
    """
    path = _check_path(path)
    dists = np.asarray(client_label_dists, dtype=float)
    target = np.asarray(target_label_dist, dtype=float)
    if dists.ndim != 2 or dists.size == 0:
        raise ValueError(f"client_label_dists must have shape (M, K), got {dists.shape}.")
    num_clients, num_classes = dists.shape
    if target.shape != (num_classes,):
        raise ValueError(
            f"target_label_dist has shape {target.shape}, expected ({num_classes},) (one "
            "probability per class)."
        )
    if not alphas:
        raise ValueError("alphas is empty: give at least one method's weights.")
    for method, alpha in alphas.items():
        if np.shape(alpha) != (num_clients,):
            raise ValueError(
                f"alpha of {method!r} has shape {np.shape(alpha)}, expected ({num_clients},) "
                "(one weight per client)."
            )
    given = dataset_class_names(dataset, num_classes) if class_names is None else class_names
    names = [str(name) for name in given]
    if len(names) != num_classes:
        raise ValueError(f"class_names has {len(names)} names for {num_classes} classes.")
    plt = _pyplot()
    from matplotlib.colors import Normalize

    height = 1.4 + 0.32 * (num_clients + 2) + (0.12 * max(map(len, names)) if names else 0)
    figsize = (max(6.5, 2.8 + 0.42 * num_classes + 2.6), height)
    ratios = {"width_ratios": [max(num_classes, 3), 4]}
    fig, (ax_heat, ax_alpha) = _figure(figsize, ncols=2, gridspec_kw=ratios, sharey=True)
    # Rows: clients 0..M-1, then a blank row, then T.
    grid = np.full((num_clients + 2, num_classes), np.nan)
    grid[:num_clients] = dists
    grid[num_clients + 1] = target
    # 0 (a class the client lacks) is below the norm's lower end and drawn white; every share
    # > 0 is on viridis, whose low end is dark: 0 and 1/3 (or 0.01) are far apart.
    cmap = plt.get_cmap("viridis").with_extremes(under="white", bad="white")
    image = ax_heat.imshow(
        np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, norm=Normalize(1e-6, 1.0)
    )
    rows = list(range(num_clients)) + [num_clients + 1]
    ax_heat.set_yticks(rows)
    ax_heat.set_yticklabels([f"client {i}" for i in range(num_clients)] + ["target T"], fontsize=8)
    ax_heat.set_xticks(range(num_classes))
    long_names = dict(rotation=45, ha="right", rotation_mode="anchor")
    ax_heat.set_xticklabels(names, fontsize=8, **(long_names if max(map(len, names)) > 3 else {}))
    # Thin white lines between the cells: neighbouring white (0) cells read as separate.
    ax_heat.set_xticks(np.arange(num_classes + 1) - 0.5, minor=True)
    ax_heat.set_yticks(np.arange(num_clients + 3) - 0.5, minor=True)
    ax_heat.grid(which="minor", color="#dddddd", linewidth=0.5)
    ax_heat.tick_params(which="minor", length=0)
    ax_heat.set_xlabel("class")
    if num_classes * (num_clients + 1) <= 160:  # small grids: the values themselves
        centred = dict(ha="center", va="center", fontsize=6)
        for r in rows:
            for k in range(num_classes):
                value = grid[r, k]
                if value >= 0.005:
                    shade = "white" if value < 0.6 else "black"
                    ax_heat.text(k, r, f"{value:.2f}", color=shade, **centred)
    # A bar as tall as the rows and about 0.16 inch wide, whatever the number of clients: its
    # aspect is the rows' height (the figure's less about 1.1 inch of title and ticks) over that
    # width; `fraction` only caps the width. (A fixed aspect of 35 drew the 2-client figure's
    # bar as a 0.06 x 0.4 inch sliver in which no gradient showed.)
    aspect = max(4.0, (height - 1.1) / 0.16)
    bar = fig.colorbar(image, ax=ax_heat, fraction=0.1, aspect=aspect, pad=0.01, extend="min")
    bar.set_label("P(Y = class); white: 0", fontsize=8)
    ax_heat.set_title("label distributions S_i(Y) and T(Y)", fontsize=9)
    width = 0.8 / len(alphas)
    for index, (method, alpha) in enumerate(alphas.items()):
        offset = (index - (len(alphas) - 1) / 2) * width
        ax_alpha.barh(
            np.arange(num_clients) + offset,
            np.asarray(alpha, dtype=float),
            height=width,
            color=method_style(method)["color"],
            label=method,
        )
    ax_alpha.set_xlabel("server weight α_i")
    ax_alpha.set_xlim(0.0, max(1e-9, max(float(np.max(a)) for a in alphas.values())) * 1.1)
    ax_alpha.grid(alpha=0.3, axis="x")
    ax_alpha.legend(fontsize=8, loc="lower right")
    ax_alpha.set_title("aggregation weights", fontsize=9)
    ax_heat.set_ylim(num_clients + 1.5, -0.5)
    _save(fig, path, title)


def plot_target_estimation(
    path: str,
    accuracy: Mapping[str, Any],
    l1_error: Mapping[str, Any],
    title: str,
    references: Sequence[str] = (),
) -> None:
    """FedPALS with T estimated: target accuracy per round (left) and the L1 error of the T
    in use, ||T^ - T||_1, per round (right), mean over seeds with a +-1 std band.

    Args:
      accuracy: label -> (rounds, per-seed accuracies (seeds, rounds) in [0, 1]).
      l1_error: label -> (rounds, per-seed L1 errors (seeds, rounds)); labels of `accuracy`
        without an entry (the references) are drawn only on the left.
      references: labels drawn as dashed grey-toned reference curves (FedAvg, FedPALS with
        T known), in their method colours.
    """
    path = _check_path(path, accuracy=(accuracy, "one labelled curve"))
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = _figure((11.0, 5.2), ncols=2)
    seeds = []
    # tab10 without its blue and red (FedAvg's and FedPALS' colours, the references').
    palette = [_pyplot().get_cmap("tab10")(i) for i in (1, 2, 4, 5, 6, 7, 8, 9)]
    estimated = 0
    for label, (rounds, values) in accuracy.items():
        reference = label in references
        if reference:
            color = method_style(label)["color"]
        else:
            color, estimated = palette[estimated % len(palette)], estimated + 1
        style = dict(color=color, linestyle="--" if reference else "-", linewidth=1.2)
        panels = [(left, rounds, values, 100.0)]
        if label in l1_error:
            panels.append((right, *l1_error[label], 1.0))
        for ax, rounds_of, series, scale in panels:
            series = scale * np.asarray(series, dtype=float)
            rounds_of = np.asarray(rounds_of)
            mean = series.mean(0)
            ax.plot(rounds_of, mean, marker="." if len(rounds_of) < 15 else None,
                    label=display_label(label) if ax is left else None, **style)
            if len(series) > 1:
                std = series.std(0)
                seeds.append(len(series))
                ax.fill_between(rounds_of, mean - std, mean + std, color=color, alpha=0.08,
                                linewidth=0)
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    left.set_ylabel("target test accuracy (%)")
    right.set_ylabel("L1 error of the T in use, ||T^ - T||_1")
    right.set_ylim(bottom=0)
    if seeds:
        _seeds_entry(left, seeds)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    _save(fig, path, title)


def plot_seed_gaps(
    path: str,
    gaps: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    title: str,
    reference: str,
    thresholds: Sequence[float] = (),
) -> None:
    """Each seed's accuracy minus the reference method's on the same seed, one marker series
    per method (seeds on the x axis, ordered as given), with a line at 0 and dotted lines at
    `thresholds` (e.g. -5: "no seed more than 5 points below").

    Args:
      gaps: label -> (seeds, gaps in points).
      reference: the method the gaps are taken to (the y axis says so).
    """
    path = _check_path(path, gaps=(gaps, "one method's gaps"))
    fig, ax = _figure((9.0, 4.6))
    seeds = sorted({int(s) for seeds_of, _ in gaps.values() for s in seeds_of})
    position = {s: i for i, s in enumerate(seeds)}
    palette = [_pyplot().get_cmap("tab10")(i) for i in (1, 2, 4, 5, 6, 7, 8, 9)]
    width = 0.8 / max(1, len(gaps))
    for index, (label, (seeds_of, values)) in enumerate(gaps.items()):
        key = _method_key(str(label))
        color = (method_style(label)["color"] if key in method_styles()
                 else palette[index % len(palette)])
        x = np.array([position[int(s)] for s in seeds_of]) + (index - (len(gaps) - 1) / 2) * width
        ax.scatter(x, values, s=18, color=color, marker=method_style(label)["marker"],
                   label=display_label(label), zorder=3)
    ax.axhline(0.0, color="black", linewidth=0.8)
    for threshold in thresholds:
        ax.axhline(threshold, color="gray", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(seeds)), [str(s) for s in seeds], fontsize=7)
    ax.set_xlabel("seed")
    ax.set_ylabel(f"target accuracy minus {display_label(reference)}'s (points)")
    _finish(fig, ax, path, title, grid="y", fontsize=8, **_BESIDE)


def plot_client_accuracy_cdf(
    path: str, accuracies: Mapping[str, Any], title: str, *, note: str | None = None
) -> None:
    """The distribution of per-client accuracies, one empirical CDF per method: the share of
    clients (y) whose accuracy is at most x. A curve further right serves more clients well; its
    left end is the worst clients. NaN (a client without test examples) is left out.

    Args:
      accuracies: label -> per-client accuracies (fractions) of one seed, or a list over seeds
        of such lists (pooled: every (client, seed) pair one step of the CDF). A method key
        ("fedavg", "fedpals") is shown as its display label.
      note: a line under the title (what was pooled, the clients' sets).
    """
    path = _check_path(path, accuracies=(accuracies, "one labelled set of accuracies"))
    fig, ax = _figure((7.2, 4.2))
    spare = iter(SERIES_COLORS)
    for index, (label, values) in enumerate(accuracies.items()):
        values = 100 * np.asarray(values, dtype=float).ravel()
        values = np.sort(values[np.isfinite(values)])
        if not values.size:
            continue
        # A method's own colour for a method (FedAvg, "FedPALS per client"); the rows derived
        # from one (its fine-tuning, Ditto) get colours and dashes of their own.
        key = _method_key(str(label))
        exact = key is not None and str(label) in (key, display_label(key))
        color = method_style(label)["color"] if exact or str(label).endswith(" per client") \
            else next(spare, None) or method_style(label)["color"]
        share = np.arange(1, values.size + 1) / values.size
        ax.step(np.concatenate([[values[0]], values]), np.concatenate([[0.0], share]),
                where="post", color=color, label=display_label(label),
                linestyle=_VARIANT_LINES[index % len(_VARIANT_LINES)])
    ax.set_xlabel("client's test accuracy (%)")
    ax.set_ylabel("share of clients at or below")
    ax.set_ylim(0, 1.02)
    _finish(fig, ax, path, title + (f" ({note})" if note else ""), fontsize=8, **_BESIDE)
