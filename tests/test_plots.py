"""Plots: each writes an image of the data it is given; bad inputs are refused."""

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
    # One band (the multi-seed test curve), mean -+ std.
    (band,) = bands
    np.testing.assert_allclose(band[0], [0.2, 0.4])
    np.testing.assert_allclose(band[1], [0.4, 0.8])


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


def test_plot_lambda_trajectories_refuses_non_positive_lambdas(tmp_path):
    plots.plot_lambda_trajectories(tmp_path / "l.png", {"seed 0": [10.0, 5.0, 2.5]}, "t")
    assert _image(tmp_path / "l.png").shape[0] > 100
    with pytest.raises(ValueError, match="lambdas > 0"):
        plots.plot_lambda_trajectories(tmp_path / "l.png", {"seed 0": [1.0, 0.0]}, "t")
