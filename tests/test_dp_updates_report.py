"""experiments.dp_updates_report on a small DP sweep of the synthetic task: every ESS line,
the epsilon columns, the noise each epsilon was calibrated to, and the figure."""

import json
import os

import ml_collections
import numpy as np
import pytest

import fedjax_pals as fjp
from experiments import dp_updates_report as report_lib


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    # configs/beyond_private_updates.py's sweep, small: the synthetic task's 2 clients, 2 rounds.
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.sweep = ml_collections.ConfigDict(dict(
        seeds=(0, 1), methods=("fedavg", "fedpals"),
        grid=dict(algorithm=dict(ess_fraction=(0.9,))),
        axes=dict(algorithm=dict(dp_clip_norm=(None, 0.5), dp_target_epsilon=(None, 8.0))),
        zip_axes=True,
    ))
    workdir = str(tmp_path_factory.mktemp("dp_sweep"))
    summary = fjp.run_sweep(config, workdir, quiet=True)
    assert set(summary["runs"].values()) == {"done"}, summary["runs"]
    return workdir


def test_the_report_gives_every_line_epsilon_and_noise(sweep_dir, tmp_path):
    figure = str(tmp_path / "figure.png")
    text, summary = report_lib.report(sweep_dir, figure)
    assert os.path.getsize(figure) > 1000 and os.path.exists(str(tmp_path / "figure.pdf"))
    assert "| | no DP | ε = 8 |" in text
    assert "FedAvg" in text and "(ESS 90 %)" in text
    sigma = fjp.accounting.calibrate_noise_multiplier(8.0, 2, 1e-5, num_clients=2,
                                                      clients_per_round=2)
    assert summary["sigma"]["8"] == [round(sigma, 4)]
    assert summary["rounds"] == 2 and summary["seeds"] == [0, 1]
    json.dumps(summary, default=str)  # what main writes as dp_updates.json


def test_cells_give_the_sample_std_the_last_round_and_the_last_rounds_and_their_layout(
        sweep_dir, tmp_path):
    """Against the runs' results.json, float64 NumPy: ddof 1, the final round's accuracy, the
    mean over the last 10 rounds' evaluations, and the programs the runs shared."""
    text, summary = report_lib.report(sweep_dir, str(tmp_path / "figure.png"))
    runs = {}
    for root, _, files in os.walk(os.path.join(sweep_dir, "runs")):
        if "results.json" in files:
            with open(os.path.join(root, "results.json")) as f:
                results = json.load(f)
            if results["config"]["algorithm"].get("dp_clip_norm") == 0.5:
                runs.setdefault(results["config"]["algorithm"]["name"], []).append(results)
    fedavg = sorted(runs["fedavg"], key=lambda r: r["config"]["seed"])
    best = 100 * np.array([r["target_accuracy_at_best_val"] for r in fedavg])
    final = 100 * np.array([r["final_target_accuracy"] for r in fedavg])
    tail = 100 * np.array([np.mean(r["target_accuracy"]) for r in fedavg])  # 2 rounds <= 10
    row = next(line for line in text.splitlines() if line.startswith("| FedAvg |"))
    assert f"{best.mean():.1f} ± {best.std(ddof=1):.1f}" in row
    assert "(ddof 1)" in text
    rows = [line for line in text.splitlines() if line.startswith("| FedAvg |")]
    assert f"{final.mean():.1f} ± {final.std(ddof=1):.1f} / " \
           f"{tail.mean():.1f} ± {tail.std(ddof=1):.1f}" in rows[1]
    cell = summary["cells"]["FedAvg @ 8"]
    assert cell["final"] == {r["config"]["seed"]: r["final_target_accuracy"] for r in fedavg}
    sizes = {r["program_runs"] for rs in runs.values() for r in rs}
    assert summary["layouts"]["FedAvg @ 8"].startswith("programs of ")
    assert all(str(size) in text for size in sizes)
    mates = {name for rs in runs.values() for r in rs for name in r["program_mates"]}
    assert any("seed_1" in name for name in mates), mates


def test_a_sweep_without_runs_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="error: no run"):
        report_lib.report(str(tmp_path), str(tmp_path / "f.png"))
