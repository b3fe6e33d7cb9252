"""Plots: each writes an image of the data it is given; bad inputs are refused."""

import os

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms.styles import method_styles
from fedjax_pals.experiment import plots


def _image(path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


def test_plot_curves_draws_a_band_for_curves_with_one_list_per_seed(tmp_path, monkeypatch):
    import matplotlib.axes

    bands = []
    original = matplotlib.axes.Axes.fill_between

    def spy(self, x, low, high, **kwargs):
        bands.append((np.asarray(low), np.asarray(high)))
        return original(self, x, low, high, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", spy)
    seeds = [[0.2, 0.4], [0.4, 0.8]]
    plots.plot_curves(
        tmp_path / "c.png",
        {
            "fedpals": {"rounds": [1, 2], "target_accuracy": seeds, "val_accuracy": seeds},
            "fedavg": {"rounds": [1, 2], "target_accuracy": [0.1, 0.2], "val_accuracy": [0, 0]},
        },
        "title",
    )
    assert _image(tmp_path / "c.png").shape[0] > 100
    # One band (the multi-seed test curve), mean -+ std, in %.
    (band,) = bands
    np.testing.assert_allclose(band[0], [20.0, 40.0])
    np.testing.assert_allclose(band[1], [40.0, 80.0])


def test_plot_curves_refuses_mismatched_lengths(tmp_path):
    with pytest.raises(ValueError, match="has 3 values per seed but there are 2 rounds"):
        plots.plot_curves(
            tmp_path / "c.png", {"x": {"rounds": [1, 2], "target_accuracy": [1, 2, 3]}}, "t"
        )


def test_plot_comparison_puts_each_mean_with_its_error_bar(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, yerr=None, **kwargs):
        drawn.append((kwargs.get("mfc", "filled"), float(y), float(yerr)))
        return original(self, x, y, yerr=yerr, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    rows = [
        {
            "row": "FMNIST C=3",
            "cells": {"fedpals": {"mean": 0.9, "std": 0.02}, "fedavg": {"mean": 0.6, "std": 0.2}},
            "paper": {"fedpals": {"mean": 0.924, "std": 0.021}},
        },
        {"row": "FMNIST C=2", "cells": {"fedpals": {"mean": 0.8, "std": 0.1}}},
    ]
    plots.plot_comparison(tmp_path / "t.png", rows, "Table 1")
    assert _image(tmp_path / "t.png").shape[0] > 100
    assert sorted((mfc, round(y, 6), round(e, 6)) for mfc, y, e in drawn) == sorted(
        [
            ("filled", 90.0, 2.0),
            ("none", 92.4, 2.1),
            ("filled", 60.0, 20.0),
            ("filled", 80.0, 10.0),
        ]
    )


def test_plot_weights_vs_ess_sorts_clients_by_size(tmp_path, monkeypatch):
    import matplotlib.axes

    heights = []
    original = matplotlib.axes.Axes.bar

    def spy(self, x, height, *args, **kwargs):
        heights.append(np.asarray(height))
        return original(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", spy)
    plots.plot_weights_vs_ess(
        tmp_path / "w.png", [10, 30, 20], {"ESS 25 %": [0.5, 0.2, 0.3], "ESS 75 %": [0.2, 0.5, 0.3]}
    )
    np.testing.assert_allclose(heights[0], [0.2, 0.3, 0.5])  # clients 1, 2, 0
    np.testing.assert_allclose(heights[1], [0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match="alpha 'x' has shape \\(2,\\), expected \\(3,\\)"):
        plots.plot_weights_vs_ess(tmp_path / "w.png", [1, 2, 3], {"x": [0.5, 0.5]})


def test_plot_accuracy_vs_distance_writes_an_image(tmp_path):
    points = {
        "fedpals": [
            {"projection_distance": 0.1, "target_accuracy": [0.8, 0.9]},
            {"projection_distance": 0.0, "target_accuracy": [0.95, 0.97]},
        ]
    }
    plots.plot_accuracy_vs_distance(tmp_path / "d.png", points, "Fig. 9")
    assert _image(tmp_path / "d.png").shape[0] > 100


def test_paths_are_checked_before_drawing(tmp_path):
    with pytest.raises(ValueError, match="must end with .png"):
        plots.plot_comparison(tmp_path / "t.txt", [{"row": "r", "cells": {}}], "t")
    with pytest.raises(ValueError, match="does not exist"):
        plots.plot_comparison(tmp_path / "missing" / "t.png", [{"row": "r", "cells": {}}], "t")
    with pytest.raises(ValueError, match="table_rows is empty"):
        plots.plot_comparison(tmp_path / "t.png", [], "t")


def test_plot_accuracy_vs_axis_draws_means_with_error_bars_and_none_as_a_line(
    tmp_path, monkeypatch
):
    import matplotlib.axes

    drawn, lines = [], []
    errorbar, axhline = matplotlib.axes.Axes.errorbar, matplotlib.axes.Axes.axhline

    def spy_errorbar(self, x, y, *args, yerr=None, **kwargs):
        drawn.append((list(x), list(y), list(yerr)))
        return errorbar(self, x, y, *args, yerr=yerr, **kwargs)

    def spy_axhline(self, y=0, *args, **kwargs):
        lines.append(y)
        return axhline(self, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy_errorbar)
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", spy_axhline)
    series = {
        "FedPALS": [
            {"x": 1.0, "target_accuracy": [0.8, 0.9]},
            {"x": 0.01, "target_accuracy": [0.6, 0.6]},
            {"x": None, "target_accuracy": [0.9, 0.95]},
        ]
    }
    plots.plot_accuracy_vs_axis(tmp_path / "e.png", series, "epsilon", "t")
    assert drawn == [([0.01, 1.0], [pytest.approx(60.0), pytest.approx(85.0)], drawn[0][2])]
    np.testing.assert_allclose(drawn[0][2], [0.0, 5.0], atol=1e-9)
    assert lines == [pytest.approx(92.5)]
    assert _image(tmp_path / "e.png").shape[0] > 100
    with pytest.raises(ValueError, match="no point with a numeric x"):
        plots.plot_accuracy_vs_axis(
            tmp_path / "e.png", {"a": [{"x": None, "target_accuracy": [1.0]}]}, "e", "t"
        )


def test_lines_of_one_method_share_its_colour_and_differ_in_line_and_fill(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn, lines = [], []
    errorbar, axhline = matplotlib.axes.Axes.errorbar, matplotlib.axes.Axes.axhline

    def spy_errorbar(self, *args, **kwargs):
        drawn.append(kwargs)
        return errorbar(self, *args, **kwargs)

    def spy_axhline(self, *args, **kwargs):
        lines.append(kwargs)
        return axhline(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy_errorbar)
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", spy_axhline)
    points = [{"x": 1.0, "target_accuracy": [0.8]}, {"x": None, "target_accuracy": [0.9]}]
    series = {
        "FedPALS (num_clients=10)": points,
        "FedPALS (num_clients=100)": points,
        "FedAvg (num_clients=10)": points,
    }
    plots.plot_accuracy_vs_axis(tmp_path / "e.png", series, "epsilon", "t")
    fedpals = plots.method_style("FedPALS")
    assert [(d["color"], d["marker"]) for d in drawn[:2]] == [
        (fedpals["color"], fedpals["marker"])
    ] * 2
    assert drawn[0]["linestyle"] != drawn[1]["linestyle"]
    assert drawn[0]["fillstyle"] != drawn[1]["fillstyle"]
    assert lines[0]["linestyle"] != lines[1]["linestyle"]
    # Another method's first line looks like FedPALS' first, in its own colour.
    assert (drawn[2]["linestyle"], drawn[2]["fillstyle"]) == (
        drawn[0]["linestyle"],
        drawn[0]["fillstyle"],
    )
    assert drawn[2]["color"] != fedpals["color"]


def test_plot_lambda_trajectories_refuses_non_positive_lambdas(tmp_path):
    plots.plot_lambda_trajectories(tmp_path / "l.png", {"seed 0": [10.0, 5.0, 2.5]}, "t")
    assert _image(tmp_path / "l.png").shape[0] > 100
    with pytest.raises(ValueError, match="lambdas > 0"):
        plots.plot_lambda_trajectories(tmp_path / "l.png", {"seed 0": [1.0, 0.0]}, "t")


# -- one style for every figure ---------------------------------------------------------------


def _legends_and_labels(monkeypatch):
    """Spies on savefig: each saved figure's legend texts and axis labels."""
    import matplotlib.figure

    saved = []
    original = matplotlib.figure.Figure.savefig

    def spy(self, path, *args, **kwargs):
        texts, xlabels, ylabels = [], [], []
        for ax in self.axes:
            if ax.get_legend() is not None:
                texts += [t.get_text() for t in ax.get_legend().get_texts()]
            xlabels.append(ax.get_xlabel())
            ylabels.append(ax.get_ylabel())
        saved.append(dict(path=str(path), legend=texts, xlabel=xlabels, ylabel=ylabels))
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    return saved


def test_every_figure_has_a_pdf_beside_its_png_and_percent_accuracy(tmp_path, monkeypatch):
    saved = _legends_and_labels(monkeypatch)
    seeds = [[0.2, 0.4], [0.4, 0.8]]
    plots.plot_curves(
        tmp_path / "c.png", {"FedPALS": {"rounds": [1, 2], "target_accuracy": seeds}}, "t"
    )
    plots.plot_comparison(
        tmp_path / "t.png",
        [{"row": "r", "cells": {"fedpals": {"mean": 0.9, "std": 0.1, "per_seed": [{}, {}, {}]}}}],
        "t",
    )
    plots.plot_accuracy_vs_distance(
        tmp_path / "d.png",
        {"FedAvg": [{"projection_distance": 0.1, "target_accuracy": [0.5]}]},
        "t",
    )
    plots.plot_accuracy_vs_axis(
        tmp_path / "e.png", {"FedAvg": [{"x": 1.0, "target_accuracy": [0.5, 0.6]}]}, "e", "t"
    )
    plots.plot_weights_vs_ess(tmp_path / "w.png", [1, 2], {"ESS 50 %": [0.5, 0.5]})
    plots.plot_lambda_trajectories(tmp_path / "l.png", {"seed 0": [1.0, 2.0]}, "t")
    plots.plot_label_distributions(
        tmp_path / "h.png", [[1, 0], [0.5, 0.5]], [0.2, 0.8], {"FedAvg": [0.5, 0.5]}
    )
    for name in "ctdewlh":
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    accuracy_axes = [y for record in saved for y in record["ylabel"] if "accuracy" in y]
    assert len(accuracy_axes) == 8 and all("(%)" in y for y in accuracy_axes)  # PNG + PDF each
    legends = {os.path.basename(r["path"]): r["legend"] for r in saved}
    assert "band: mean ± 1 std over 2 seeds" in legends["c.png"]
    assert "mean ± 1 std over 3 seeds" in legends["t.png"]
    assert "mean ± 1 std over 1 seed" in legends["d.png"]
    assert "mean ± 1 std over 2 seeds" in legends["e.png"]


def test_a_method_has_one_colour_and_marker_in_every_figure(tmp_path, monkeypatch):
    import matplotlib.axes

    colours = {}
    errorbar, plot = matplotlib.axes.Axes.errorbar, matplotlib.axes.Axes.plot

    def spy_errorbar(self, *args, label=None, color=None, marker=None, **kwargs):
        if label:
            colours.setdefault(label, set()).add((color, marker or kwargs.get("fmt")))
        return errorbar(self, *args, label=label, color=color, marker=marker, **kwargs)

    def spy_plot(self, *args, color=None, **kwargs):
        if args and len(args[0]) and color is not None:
            colours.setdefault("curve", set()).add(color)
        return plot(self, *args, color=color, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy_errorbar)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy_plot)
    plots.plot_comparison(
        tmp_path / "t.png", [{"row": "r", "cells": {"FedAvg": {"mean": 0.5, "std": 0.1}}}], "t"
    )
    plots.plot_accuracy_vs_distance(
        tmp_path / "d.png",
        {"FedAvg": [{"projection_distance": 0.1, "target_accuracy": [0.5]}]},
        "t",
    )
    plots.plot_curves(
        tmp_path / "c.png", {"FedAvg": {"rounds": [1], "target_accuracy": [0.5]}}, "t"
    )
    style = plots.method_style("fedavg")
    assert colours["FedAvg"] == {(style["color"], style["marker"])}
    assert colours["curve"] == {style["color"]}
    # A display label, with or without the grid point after it, is its method's style.
    assert plots.method_style("FedAvg (learning_rate=0.1)") == style
    assert plots.method_style("FedProx+FedPALS") == {
        "color": method_styles()["fedprox_fedpals"][0],
        "marker": method_styles()["fedprox_fedpals"][1],
    }
    assert plots.method_style("fedpals") != style
    assert plots.method_style("a new method") == plots.method_style("a new method")


def test_axes_are_named_by_symbols_and_words(tmp_path, monkeypatch):
    saved = _legends_and_labels(monkeypatch)
    series = {
        "FedPALS": [{"x": 1.0, "target_accuracy": [0.5]}, {"x": None, "target_accuracy": [0.6]}]
    }
    plots.plot_accuracy_vs_axis(
        tmp_path / "e.png",
        series,
        "algorithm.label_dp_epsilon",
        "accuracy vs algorithm.label_dp_epsilon",
    )
    assert saved[0]["xlabel"] == ["privacy budget ε"]
    assert plots.axis_label("training.local_epochs") == "local epochs E"
    assert plots.axis_label("partition.num_clients") == "number of clients"
    assert plots.axis_label("lam") == "λ"
    assert plots.axis_label("something else") == "something else"


def test_the_label_distribution_figure_shows_every_client_t_and_the_weights(tmp_path, monkeypatch):
    import matplotlib.axes

    images, bars = [], []
    imshow, barh = matplotlib.axes.Axes.imshow, matplotlib.axes.Axes.barh

    def spy_imshow(self, data, *args, **kwargs):
        images.append(np.ma.filled(np.ma.asarray(data, dtype=float), np.nan))
        return imshow(self, data, *args, **kwargs)

    def spy_barh(self, y, width, *args, label=None, **kwargs):
        bars.append((label, np.asarray(width)))
        return barh(self, y, width, *args, label=label, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", spy_imshow)
    monkeypatch.setattr(matplotlib.axes.Axes, "barh", spy_barh)
    dists = [[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]
    target = [0.2, 0.3, 0.5]
    alphas = {"FedPALS": [0.3, 0.7], "FedAvg": [0.6, 0.4]}
    plots.plot_label_distributions(tmp_path / "h.png", dists, target, alphas)
    (grid,) = images
    np.testing.assert_allclose(grid[:2], dists)
    assert np.isnan(grid[2]).all()  # a gap between the clients and T
    np.testing.assert_allclose(grid[3], target)
    assert [(label, list(width)) for label, width in bars] == [
        ("FedPALS", [0.3, 0.7]),
        ("FedAvg", [0.6, 0.4]),
    ]
    assert (tmp_path / "h.pdf").exists()
    with pytest.raises(ValueError, match=r"target_label_dist has shape \(2,\), expected \(3,\)"):
        plots.plot_label_distributions(tmp_path / "h.png", dists, [0.5, 0.5], alphas)
    with pytest.raises(ValueError, match=r"alpha of 'FedAvg' has shape \(3,\)"):
        plots.plot_label_distributions(tmp_path / "h.png", dists, target, {"FedAvg": [1, 0, 0]})


# -- every figure fits, and reads as the tables do (issue 28) ----------------------------------


def _check_every_saved_figure(monkeypatch):
    """Spies on every text a saved figure draws (PNG and PDF): per file name, how many texts
    were drawn and those whose window extent is not inside the figure's bbox."""
    import matplotlib.figure
    import matplotlib.text

    checked = {}
    saving = []
    savefig, draw = matplotlib.figure.Figure.savefig, matplotlib.text.Text.draw

    def spy_savefig(self, path, *args, **kwargs):
        saving.append(os.path.basename(str(path)))
        checked[saving[-1]] = (0, [])
        try:
            return savefig(self, path, *args, **kwargs)
        finally:
            saving.pop()

    def spy_draw(self, renderer):
        result = draw(self, renderer)
        if saving and self.get_visible() and self.get_text().strip():
            extent, box = self.get_window_extent(renderer), self.get_figure(root=True).bbox
            drawn, outside = checked[saving[-1]]
            if (
                extent.x0 < box.x0 - 0.5
                or extent.y0 < box.y0 - 0.5
                or extent.x1 > box.x1 + 0.5
                or extent.y1 > box.y1 + 0.5
            ):
                outside = outside + [(self.get_text(), tuple(round(v) for v in extent.extents))]
            checked[saving[-1]] = (drawn + 1, outside)
        return result

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy_savefig)
    monkeypatch.setattr(matplotlib.text.Text, "draw", spy_draw)
    return checked


# The demo's real comparison title: the one that ran off the figure's left edge.
_DEMO_TITLE = "Fashion-MNIST C=3: 10 clients (incl. target), 4 rounds, E=1, 2 seeds"
_ROW = {
    "row": "Fashion-MNIST C=3",
    "cells": {
        "FedAvg": {"mean": 0.5415, "std": 0.0998, "target_accuracy": {"n": 2}},
        "FedPALS": {"mean": 0.926, "std": 0.031, "target_accuracy": {"n": 2}},
    },
}


def test_every_text_of_every_figure_lies_inside_the_figure(tmp_path, monkeypatch):
    checked = _check_every_saved_figure(monkeypatch)
    long_title = _DEMO_TITLE + ", selected on the target validation set (the paper's protocol)"
    plots.plot_comparison(tmp_path / "one_row.png", [_ROW], _DEMO_TITLE)
    plots.plot_comparison(
        tmp_path / "one_row_paper.png",
        [dict(_ROW, paper={"FedPALS": {"mean": 0.924, "std": 0.021}})],
        long_title,
    )
    plots.plot_comparison(
        tmp_path / "rows.png",
        [_ROW, dict(_ROW, row="Fashion-MNIST C=2"), dict(_ROW, row="CIFAR-10 C=3")],
        long_title,
    )
    seeds = [[0.2, 0.4, 0.5], [0.4, 0.8, 0.7]]
    plots.plot_curves(
        tmp_path / "curves.png",
        {
            "fedprox_fedpals": {"rounds": [1, 2, 3], "target_accuracy": seeds},
            "fedavg": {"rounds": [1, 2, 3], "target_accuracy": [0.1, 0.2, 0.3]},
        },
        "fedpals on sparsity C=3 (1000 per label), 10 clients (9 train + target), seed 0",
    )
    plots.plot_weights_vs_ess(
        tmp_path / "weights.png",
        [3000, 1000, 2000],
        {
            "λ = 0 (ESS 30 %)": [0.5, 0.0, 0.5],
            "ESS 50 % (λ = 631.2)": [0.4, 0.2, 0.4],
            "ESS 75 % (λ = 2005)": [0.4, 0.25, 0.35],
        },
        title="sparsity C=3 (1000 per label), 10 clients (9 train + target), seed 0: FedPALS "
        "weights vs FedAvg (ESS 10, 25 % out of reach)",
    )
    dists = np.zeros((4, 10))
    for i in range(4):
        dists[i, [i, i + 3, i + 6]] = 1 / 3
    plots.plot_label_distributions(
        tmp_path / "heatmap.png",
        dists,
        np.full(10, 0.1),
        {"FedPALS": [0.4, 0.3, 0.2, 0.1], "FedAvg": [0.25] * 4},
        title="sparsity C=3 (1000 per label), 10 clients (9 train + target), seed 0: label "
        "distributions and server weights",
        dataset="fashion_mnist",
    )
    plots.plot_accuracy_vs_axis(
        tmp_path / "axis.png",
        {"FedPALS (num_clients=10)": [{"x": 1.0, "target_accuracy": [0.8]}]},
        "algorithm.label_dp_epsilon",
        long_title,
    )
    plots.plot_lambda_trajectories(tmp_path / "lambda.png", {"seed 0": [1.0, 2.0]}, long_title)
    names = ("one_row", "one_row_paper", "rows", "curves", "weights", "heatmap", "axis", "lambda")
    assert sorted(checked) == sorted(f"{name}.{ext}" for name in names for ext in ("png", "pdf"))
    for name, (drawn, outside) in checked.items():
        assert drawn >= 8, name  # the spy saw the texts: title, labels, ticks, legend
        assert outside == [], f"{name}: texts outside the figure: {outside}"


def test_a_one_row_comparison_draws_methods_against_accuracy_with_the_legend_inside(
    tmp_path, monkeypatch
):
    import matplotlib.axes
    import matplotlib.figure

    seen = {}
    original = matplotlib.figure.Figure.savefig

    def spy(self, path, *args, **kwargs):
        if str(path).endswith(".png"):
            (ax,) = self.axes
            self.canvas.draw()
            renderer = self.canvas.get_renderer()
            legend = ax.get_legend()
            seen.update(
                ticks=[t.get_text() for t in ax.get_xticklabels()],
                numbers=sorted(t.get_text() for t in ax.texts),
                legend=[t.get_text() for t in legend.get_texts()],
                legend_inside=ax.bbox.contains(*legend.get_window_extent(renderer).p0)
                and ax.bbox.contains(*legend.get_window_extent(renderer).p1),
                axes_width=ax.bbox.width / self.bbox.width,
            )
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    errorbars = []
    errorbar = matplotlib.axes.Axes.errorbar

    def spy_errorbar(self, x, y, yerr=None, **kwargs):
        errorbars.append((kwargs.get("label"), round(float(y), 6), round(float(yerr), 6)))
        return errorbar(self, x, y, yerr=yerr, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy_errorbar)
    plots.plot_comparison(tmp_path / "c.png", [_ROW], _DEMO_TITLE)
    # The methods along the x axis, each at its mean +- std (the table's cell, in %) with the
    # numbers written beside it; the legend (what the bars are) inside the axes.
    assert seen["ticks"] == ["FedAvg", "FedPALS"]
    assert errorbars == [("FedAvg", 54.15, 9.98), ("FedPALS", 92.6, 3.1)]
    assert seen["numbers"] == ["54.1 ± 10.0", "92.6 ± 3.1"]
    assert seen["legend"] == ["mean ± 1 std over 2 seeds"]
    assert seen["legend_inside"]
    assert seen["axes_width"] > 0.75  # no legend beside it taking the width


def test_curves_show_method_keys_by_the_labels_of_the_tables(tmp_path, monkeypatch):
    import fedjax_pals as fjp

    saved = _legends_and_labels(monkeypatch)
    plots.plot_curves(
        tmp_path / "c.png",
        {
            "fedprox_fedpals": {"rounds": [1, 2], "target_accuracy": [0.5, 0.6]},
            "fedpals": {"rounds": [1, 2], "target_accuracy": [0.5, 0.7]},
            "seed 0": {"rounds": [1, 2], "target_accuracy": [0.5, 0.7]},
        },
        "t",
    )
    assert saved[0]["legend"][:3] == ["FedProx+FedPALS", "FedPALS", "seed 0"]
    assert plots.display_label("fedprox_fedpals") == fjp.method_label("fedprox_fedpals")
    assert plots.display_label("FedAvg (learning_rate=0.1)") == "FedAvg (learning_rate=0.1)"


def test_figure_file_names_are_stable_and_shell_friendly():
    assert plots.file_stem("Fashion-MNIST C=3") == "Fashion-MNIST_C3"
    assert plots.file_stem("CIFAR-10 C=3 (dirichlet)") == "CIFAR-10_C3_dirichlet"
    assert plots.file_stem("synthetic delta=0.5, E=2") == "synthetic_delta0.5_E2"
    assert plots.file_stem("a/b 'c'") == "a_b_c"
    for text in ("Fashion-MNIST C=3", "x=1 (y=2), z=[3]; $HOME & `ls` * ? ! ~ # %", "=()"):
        stem = plots.file_stem(text)
        assert stem and all(c.isalnum() or c in "._+-" for c in stem), stem
        assert plots.file_stem(text) == stem  # the same row, the same file, every sweep
    # Rows that differ only in dropped characters still get files of their own.
    assert plots.file_stems(["C=3", "C3", "C=3"]) == {"C=3": "C3", "C3": "C3_2"}


def test_the_heatmap_names_the_classes_and_draws_zero_apart_from_small_shares(
    tmp_path, monkeypatch
):
    import matplotlib.axes
    import matplotlib.figure

    images, ticks = [], []
    imshow = matplotlib.axes.Axes.imshow
    savefig = matplotlib.figure.Figure.savefig

    def spy_imshow(self, *args, **kwargs):
        images.append(imshow(self, *args, **kwargs))
        return images[-1]

    def spy_savefig(self, path, *args, **kwargs):
        ticks.append([t.get_text() for t in self.axes[0].get_xticklabels()])
        return savefig(self, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", spy_imshow)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy_savefig)
    dists = np.eye(10)[:3]
    alphas = {"FedPALS": [0.5, 0.5, 0.0]}
    plots.plot_label_distributions(
        tmp_path / "h.png", dists, np.full(10, 0.1), alphas, dataset="fashion_mnist"
    )
    assert ticks[0][:2] == ["T-shirt/top", "Trouser"] and ticks[0][-1] == "Ankle boot"
    rgba = images[0].to_rgba(np.array([[0.0, 0.01, 1 / 3, 1.0]]))[0, :, :3]
    assert np.allclose(rgba[0], 1.0)  # 0: white
    for share in rgba[1:]:  # any share > 0: far from white
        assert np.linalg.norm(share - rgba[0]) > 0.8
    assert np.linalg.norm(rgba[1] - rgba[2]) > 0.3  # 1 % and 1/3 apart too
    # A data set without known names (or class_names given) keeps indices (or those names).
    plots.plot_label_distributions(tmp_path / "h.png", dists, np.full(10, 0.1), alphas)
    assert ticks[-1] == [str(k) for k in range(10)]
    assert plots.dataset_class_names("cifar10", 10)[0] == "airplane"
    assert plots.dataset_class_names("fashion_mnist", 3) == ("0", "1", "2")


def _lab(rgb):
    """CIELAB of an sRGB colour (D65): Delta E = the Euclidean distance of two of them."""
    c = np.asarray(rgb, dtype=float)
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = xyz @ c / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_the_weights_figure_gives_each_lambda_a_colour_of_its_own(tmp_path, monkeypatch):
    import matplotlib.axes
    import matplotlib.colors

    shown = []  # each bar series' colour as drawn on the white background
    bar = matplotlib.axes.Axes.bar

    def spy(self, *args, **kwargs):
        r, g, b, a = matplotlib.colors.to_rgba(kwargs["color"], kwargs.get("alpha"))
        shown.append(_lab(a * np.array([r, g, b]) + (1 - a)))
        return bar(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", spy)
    alphas = {f"ESS {f} %": [0.5, 0.5] for f in (0, 10, 25, 50, 75)}  # weights.py's five
    plots.plot_weights_vs_ess(tmp_path / "w.png", [1, 2], alphas)
    assert len(shown) == 5
    fedavg = _lab(matplotlib.colors.to_rgb(plots.method_style("fedavg")["color"]))
    for i, colour in enumerate(shown):
        assert np.linalg.norm(colour - fedavg) > 25  # apart from FedAvg's dots
        for other in shown[i + 1 :]:
            assert np.linalg.norm(colour - other) > 25  # Delta E: clearly different colours


# -- titles wrap at sensible points, the colour bar shows its gradient, curves keep their axis
# (issue 57) -----------------------------------------------------------------------------------


def _saved_figures(monkeypatch):
    """Spies on savefig: per PNG file name, its Figure (drawn, so that the layout is done)."""
    import matplotlib.figure

    figures = {}
    original = matplotlib.figure.Figure.savefig

    def spy(self, path, *args, **kwargs):
        result = original(self, path, *args, **kwargs)
        if str(path).endswith(".png"):
            figures[os.path.basename(str(path))] = self
        return result

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    return figures


def _balanced(line):
    return line.count("(") == line.count(")")


@pytest.mark.parametrize("width", range(20, 80, 3))
def test_titles_never_break_inside_parentheses_nor_at_a_hyphen(width):
    titles = [
        _DEMO_TITLE,
        "synthetic label shift delta=1 (App. C.4), 3 clients (2 train + target), seed 0: label "
        "distributions and server weights",
        "FedPALS on sparsity C=3 (1000 per label), 10 clients (9 train + target), seed 0",
    ]
    for title in titles:
        lines = plots.wrap_title(title, width)
        assert " ".join(lines) == title
        assert all(_balanced(line) for line in lines), lines
        assert not any(line.endswith("-") for line in lines), lines


def test_a_title_breaks_after_its_phrases_when_that_costs_no_line():
    assert plots.wrap_title(_DEMO_TITLE, 50) == [
        "Fashion-MNIST C=3: 10 clients (incl. target),", "4 rounds, E=1, 2 seeds"]
    assert plots.wrap_title("short", 50) == ["short"]


def test_the_comparison_title_keeps_its_parentheses_whole_and_counts_seeds(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from fedjax_pals.experiment import sweep

    figures = _saved_figures(monkeypatch)
    plots.plot_comparison(tmp_path / "c.png", [_ROW], _DEMO_TITLE)
    shown = figures["c.png"]._suptitle.get_text().split("\n")
    assert len(shown) == 2 and all(_balanced(line) for line in shown), shown
    assert "(incl. target)" in "\n".join(shown)
    # The sweep's title counts its seeds in words: "1 seed", "3 seeds", never "seed(s)".
    run = SimpleNamespace(resolved={"partition": {"num_clients": 10},
                                    "training": {"rounds": 4, "local_epochs": 1}})
    for seeds, words in (((0,), "1 seed"), ((0, 1, 2), "3 seeds")):
        title = sweep._title([run], {"row_label": "Fashion-MNIST C=3", "seeds": seeds})
        assert title == f"Fashion-MNIST C=3: 10 clients (incl. target), 4 rounds, E=1, {words}"


@pytest.mark.parametrize("num_clients", [2, 9, 60])
def test_the_label_distribution_colour_bar_is_a_full_height_gradient(
    tmp_path, monkeypatch, num_clients
):
    figures = _saved_figures(monkeypatch)
    rng = np.random.default_rng(num_clients)
    dists = rng.dirichlet(np.ones(3), num_clients)
    alphas = {"FedPALS": np.full(num_clients, 1 / num_clients)}
    plots.plot_label_distributions(tmp_path / "h.png", dists, [0.0, 0.5, 0.5], alphas)
    fig = figures["h.png"]
    heat = fig.axes[0]
    (bar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    inches = lambda box: (box.width / fig.dpi, box.height / fig.dpi)
    bar_width, bar_height = inches(bar.get_window_extent())
    # A bar, not a sliver (the 2-client figure's was 0.06 x 0.4 inch): wide enough to see the
    # colours, as tall as the rows (less its extension triangle below).
    assert bar_width >= 0.12, bar_width
    assert bar_height >= 0.85 * inches(heat.get_window_extent())[1]
    # Its colours run over every share in (0, 1], 0 below them (white).
    mappable = heat.images[0]
    assert mappable.norm.vmin <= 1e-6 and mappable.norm.vmax == 1.0
    colours = mappable.to_rgba(np.linspace(0.01, 1.0, 5))[:, :3]
    assert np.linalg.norm(colours[0] - colours[-1]) > 0.8  # a gradient, not one colour


def test_curves_keep_a_fixed_accuracy_axis(tmp_path, monkeypatch):
    figures = _saved_figures(monkeypatch)
    close = {"rounds": [1, 2, 3], "target_accuracy": [0.91, 0.912, 0.915]}
    plots.plot_curves(tmp_path / "c.png", {"fedpals": close}, "t")
    assert figures["c.png"].axes[0].get_ylim() == (0.0, 100.0)  # not zoomed onto 91-92 %
    plots.plot_curves(tmp_path / "z.png", {"fedpals": close}, "t", y_range=None)
    low, high = figures["z.png"].axes[0].get_ylim()
    assert 85 < low and high < 95


def test_a_runs_figure_title_names_its_data_set():
    title = "FedPALS on sparsity C=3 (1000 per label), 10 clients (9 train + target), seed 0"
    assert plots.with_dataset(title, "Fashion-MNIST") == f"Fashion-MNIST: {title}"
    synthetic = "FedPALS on synthetic label shift delta=1 (App. C.4), 3 clients, seed 0"
    assert plots.with_dataset(synthetic, "Synthetic") == synthetic


def test_a_registered_method_style_is_the_methods_look_in_every_figure():
    from fedjax_pals.algorithms import styles

    saved = dict(styles._STYLES)
    try:
        assert plots.method_style("My method (lr=0.1)")["color"] in {
            c for c, _ in plots._SPARE_STYLES}
        fjp.register_method_style("my_method", "#17becf", "h")
        with pytest.raises(ValueError, match=r"'my_method' has a style already"):
            fjp.register_method_style("my_method", "#000000", "h")
        with pytest.raises(ValueError, match=r"'not-a-colour' is not a Matplotlib colour"):
            fjp.register_method_style("other", "not-a-colour", "h")
        with pytest.raises(ValueError, match=r"marker 'Q' is not one of"):
            fjp.register_method_style("other", "#000000", "Q")
        assert plots.method_style("my_method") == {"color": "#17becf", "marker": "h"}
    finally:
        styles._STYLES.clear()
        styles._STYLES.update(saved)
