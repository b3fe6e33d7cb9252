"""The launchers other than run and sweep check all their flags before reading any data:
one `error:` line naming the flag (exit status 2), or naming a damaged file (exit status 1)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(module, *args):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _error_line(completed, status):
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == status, completed.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    "fractions, expected",
    [
        ("0.5,abc", "'abc' is not a number; give numbers in (0, 1]"),
        ("1.5", "1.5 is outside (0, 1]"),
        ("0", "0 is outside (0, 1]"),
    ],
)
def test_weights_checks_its_fractions_before_reading_data(tmp_path, fractions, expected):
    # A data dir without the data: reading it would be another error.
    line = _error_line(
        _main(
            "experiments.weights",
            "--config=configs/default.py",
            f"--config.dataset.data_dir={tmp_path / 'no_data'}",
            f"--workdir={tmp_path / 'w'}",
            f"--ess_fractions={fractions}",
        ),
        2,
    )
    assert "--ess_fractions" in line and expected in line
    assert not (tmp_path / "w").exists()


def test_weights_prints_the_alpha_table_and_the_ess_targets_out_of_reach(tmp_path):
    # The synthetic task (two clients, n = 40 and 18): ESS(alpha^0) / N = 85.6 %, so 50 % is
    # out of reach and 90 % is reached.
    completed = _main(
        "experiments.weights",
        "--config=configs/synthetic.py",
        f"--workdir={tmp_path / 'w'}",
        "--ess_fractions=0.5,0.9",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.split()[:2] == ["client", "n_i"]]
    assert headers, f"no alpha table in:\n{completed.stdout}"
    header = headers[0]
    assert lines[header].split()[2:] == ["FedAvg", "λ", "=", "0", "ESS", "90", "%"]
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [row[:3] for row in rows] == [["0", "40", "0.690"], ["1", "18", "0.310"]]
    record = json.loads((tmp_path / "w" / "weights.json").read_text())
    for i, row in enumerate(rows):  # lambda = 0, then ESS 90 %: the alphas of weights.json
        assert [float(v) for v in row[3:]] == [
            pytest.approx(w["alpha"][i], abs=5e-4) for w in record["weights"]
        ]
    assert lines[header + 3].split() == ["ESS", "/", "N", "100.0", "%", "85.6", "%", "90.0", "%"]
    assert lines[header + 4].split()[:3] == ["λ", "inf", "0"]
    assert (
        "out of reach: ESS 50 % of N; reachable for these clients and T: 85.6 % (λ = 0) to "
        "100 % (FedAvg) of N"
    ) in lines
    assert record["unreachable_fractions"] == [0.5]
    assert "wrote:" in lines


def test_restricted_eval_names_a_bad_alpha_and_a_sweep_without_runs(tmp_path):
    line = _error_line(
        _main(
            "experiments.restricted_eval",
            f"--workdir={tmp_path / 'w'}",
            f"--sweeps={tmp_path}",
            "--alphas=0.5,abc",
        ),
        2,
    )
    assert "--alphas" in line and "'abc' is not a number" in line
    line = _error_line(
        _main("experiments.restricted_eval", f"--workdir={tmp_path / 'w'}", f"--sweeps={tmp_path}"),
        2,
    )
    assert f"--sweeps: {tmp_path} is not a sweep workdir" in line
    assert not (tmp_path / "w").exists()


def test_compare_names_a_damaged_table(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "table.json").write_text('{"rows": [')
    line = _error_line(
        _main("experiments.compare", f"--tables={tmp_path / 'a'}", f"--workdir={tmp_path / 'w'}"),
        1,
    )
    assert f"cannot read {tmp_path / 'a' / 'table.json'} (JSONDecodeError" in line
