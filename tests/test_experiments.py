"""The launchers: results.json, plots, resume, the comparison table, the CLI."""

import json
import os
import subprocess
import sys

import pytest

from experiments import compare
from experiments import run as run_lib

REQUIRED_KEYS = (
    "config",
    "alpha",
    "ess",
    "projection_distance",
    "target_accuracy",
    "val_accuracy",
    "final_target_accuracy",
    "best_val_round",
    "target_accuracy_at_best_val",
    "wall_seconds",
    "rounds",
    "lam",
)


def _config(**overrides):
    config = {key: run_lib.FLAGS[key].default for key in run_lib.CONFIG_KEYS}
    config.update(dataset="synthetic", rounds=4, eval_every=2, batch_size=8, learning_rate=0.05)
    config.update(overrides)
    return config


def test_a_run_writes_results_and_a_plot(tmp_path):
    results = run_lib.run_experiment(_config(algorithm="fedpals"), str(tmp_path))
    with open(tmp_path / "results.json") as f:
        saved = json.load(f)
    for key in REQUIRED_KEYS:
        assert key in saved, key
    assert saved["rounds"] == [2, 4]
    assert saved["final_target_accuracy"] == saved["target_accuracy"][-1]
    assert saved["best_val_round"] in saved["rounds"]
    assert abs(sum(saved["alpha"]) - 1) < 1e-5
    assert results["final_target_accuracy"] == saved["final_target_accuracy"]
    assert os.path.getsize(tmp_path / "curves.png") > 1000


def test_a_finished_run_is_resumed_not_redone_and_a_changed_config_is_refused(tmp_path):
    first = run_lib.run_experiment(_config(algorithm="fedavg"), str(tmp_path))
    again = run_lib.run_experiment(_config(algorithm="fedavg"), str(tmp_path))
    assert again["target_accuracy"] == first["target_accuracy"]
    with pytest.raises(ValueError, match="another configuration"):
        run_lib.run_experiment(_config(algorithm="fedavg", seed=5), str(tmp_path))
    fresh = run_lib.run_experiment(
        _config(algorithm="fedavg", seed=5), str(tmp_path), overwrite=True
    )
    assert fresh["config"]["seed"] == 5


def test_lam_and_ess_fraction_are_exclusive(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        run_lib.run_experiment(_config(lam=1.0, ess_fraction=0.5), str(tmp_path))


def test_ess_fraction_sets_lambda(tmp_path):
    results = run_lib.run_experiment(_config(algorithm="fedpals", ess_fraction=0.95), str(tmp_path))
    assert results["lam"] > 0
    assert abs(results["ess"] / results["total_examples"] - 0.95) < 1e-3


def test_comparison_table_lists_every_algorithm(tmp_path):
    all_results = compare.run_comparison(_config(), ["fedavg", "fedpals"], [0, 1], str(tmp_path))
    table = compare.write_comparison(
        all_results, str(tmp_path), compare.comparison_title(all_results)
    )
    assert "| fedavg |" in table and "| fedpals |" in table
    assert "over 2 seed(s)" in table
    assert os.path.getsize(tmp_path / "comparison.png") > 1000
    with open(tmp_path / "comparison.json") as f:
        assert set(json.load(f)["results"]) == {"fedavg", "fedpals"}


@pytest.mark.integration
def test_the_command_line_takes_a_flagfile(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(
        "--dataset=synthetic\n--algorithm=fedprox\n--weights=fedpals\n"
        "--rounds=2\n--batch_size=8\n--learning_rate=0.05\n"
    )
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.run", f"--flagfile={flagfile}", f"--output_dir={out}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "final target accuracy" in completed.stdout
    with open(out / "results.json") as f:
        saved = json.load(f)
    assert saved["config"]["algorithm"] == "fedprox" and saved["config"]["weights"] == "fedpals"


@pytest.mark.integration
def test_the_demo_falls_back_to_the_synthetic_task_without_fashion_mnist(
    tmp_path, monkeypatch, capsys
):
    import fedjax_pals as fjp
    from experiments import demo

    def unavailable(data_dir=None):
        raise fjp.DatasetUnavailableError("no files (apt-get install dataset-fashion-mnist)")

    monkeypatch.setattr(fjp, "load_fashion_mnist", unavailable)
    run_lib.FLAGS([sys.argv[0], f"--output_dir={tmp_path}"])
    try:
        demo.main([])
    finally:
        run_lib.FLAGS.unparse_flags()
    printed = capsys.readouterr().out
    assert "runs the synthetic task instead" in printed
    assert "apt-get install dataset-fashion-mnist" in printed
    assert "| fedpals |" in printed and "| fedavg |" in printed
    assert os.path.getsize(tmp_path / "comparison.png") > 1000
