"""Plots: each writes an image of the data it is given; bad inputs are refused."""

import os

import numpy as np
import pytest

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
        "color": plots.METHOD_STYLES["fedprox_fedpals"][0],
        "marker": plots.METHOD_STYLES["fedprox_fedpals"][1],
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
