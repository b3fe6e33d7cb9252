"""The scaling command: its pieces without training, and one real point end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.benchmarks import scaling


def test_label_shift_clients_have_n_examples_of_their_drawn_labels_and_scale_past_the_data():
    labels = np.repeat(np.arange(10), 30)  # 300 examples, 30 per class
    indices, counts, target = scaling.label_shift_clients(labels, 500, 4, 0.5, seed=0)
    assert (
        indices.shape == (500, 4) and indices.dtype == np.int32
    )  # 2,000 > 300 examples
    assert counts.shape == (500, 10) and np.all(counts.sum(axis=1) == 4)
    for row, count in zip(indices[:50], counts[:50]):
        np.testing.assert_array_equal(np.bincount(labels[row], minlength=10), count)
    assert target.shape == (10,) and np.isclose(target.sum(), 1.0)
    again = scaling.label_shift_clients(labels, 500, 4, 0.5, seed=0)
    np.testing.assert_array_equal(indices, again[0])
    # A label shift: the clients' label mixes differ.
    assert np.std(counts / 4, axis=0).mean() > 0.1


def test_the_table_reports_errors_and_rows():
    row = {
        "curve": "M",
        "num_clients": 100,
        "participants": 10,
        "device_count": 1,
        "round_s": 0.5,
        "round_cpu_s": 0.4,
        "training_s": 0.3,
        "solve_s": 0.1,
        "aggregation_s": 0.0,
        "plan_s": 0.001,
        "sample_s": 0.001,
        "first_round_s": 9.0,
        "compile_s": 8.0,
        "peak_rss_mib": 700.0,
        "rss_after_load_mib": 400.0,
        "bytes_per_client": 76.0,
    }
    table = scaling.markdown_table(
        [row, {"curve": "m", "num_clients": 10, "participants": 10, "error": "x"}]
    )
    assert "| M | 100 | 10 | 1 | 0.500 | 0.400 |" in table and "error" in table
    assert "traced backend" not in table


def test_a_traced_round_leaves_training_and_aggregation_empty_not_mislabelled():
    # On a GPU (`vmap_scan`) the round is one program: "round" minus a solve timed alone is
    # not the aggregation, and there is no training phase to report.
    point = scaling.PointRunner.__new__(scaling.PointRunner)
    point.rounds, point.solve_for, point.participants = [], lambda p: np.zeros(3), None
    point.jax = __import__("jax")
    point._round = lambda r: {"round": 0.028, "wall": 0.03}
    timings = point.timed_round()
    assert "training" not in timings and "aggregation" not in timings
    row = {
        "curve": "M", "num_clients": 100, "participants": 100, "device_count": 1,
        "round_s": 0.028, "round_cpu_s": 0.03, "training_s": None, "solve_s": 0.022,
        "aggregation_s": None, "plan_s": None, "sample_s": 0.0, "first_round_s": 6.0,
        "compile_s": 5.0, "peak_rss_mib": 1800.0, "rss_after_load_mib": 447.0,
        "bytes_per_client": 76.0,
    }
    table = scaling.markdown_table([row])
    assert "| 0.028 | 0.030 | - | 0.022 | - |" in table and "traced backend" in table
    assert scaling._phases(row) == "one program; solve alone 0.022"
    # A file written before: training NaN, "aggregation" the round minus the solve alone.
    old = {**row, "training_s": float("nan"), "aggregation_s": 0.0036}
    assert "| 0.028 | 0.030 | - | 0.022 | - |" in scaling.markdown_table([old])


@pytest.mark.integration
def test_one_point_of_the_curve_runs_and_reports_time_and_memory(tmp_path):
    # The whole command, one child point: catches a broken import or helper in the children.
    output = tmp_path / "scaling.json"
    subprocess.run(
        [
            sys.executable, "-m", "experiments.benchmarks.scaling", "--num_clients=100",
            "--participants=10", "--curves=M", "--rounds=1", f"--output={output}", "--plot=",
        ],
        check=True,
        capture_output=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    (row,) = json.loads(output.read_text())["rows"]
    assert "error" not in row, row.get("error")
    assert row["num_clients"] == 100 and row["participants"] == 10
    assert row["round_s"] > 0 and row["peak_rss_mib"] > row["rss_after_load_mib"] > 0
