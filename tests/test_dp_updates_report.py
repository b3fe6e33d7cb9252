"""experiments.dp_updates_report on a small DP sweep of the synthetic task: every ESS line,
the epsilon columns, the noise each epsilon was calibrated to, and the figure."""

import json
import os

import ml_collections
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


def test_a_sweep_without_runs_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="error: no run"):
        report_lib.report(str(tmp_path), str(tmp_path / "f.png"))
