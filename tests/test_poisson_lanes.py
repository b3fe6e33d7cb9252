"""experiments.benchmarks.poisson_lanes: one row per backend and sampling, Poisson's lanes,
and a bad flag as one error line."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "experiments.benchmarks.poisson_lanes", *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )


def test_it_times_both_samplings_per_backend_and_writes_the_rows(tmp_path):
    import fedjax_pals as fjp

    out = tmp_path / "rows.json"
    done = _run("--dataset=synthetic", "--rounds=4", "--repeats=1", "--sampling_rate=0.5",
                "--backends=vmap_scan,host_loop", f"--output={out}")
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert [(r["backend"], r["sampling"]) for r in rows] == [
        ("vmap_scan", "without_replacement"), ("vmap_scan", "poisson"),
        ("host_loop", "without_replacement"), ("host_loop", "poisson")]
    lanes = {r["sampling"]: r["lanes"] for r in rows}
    assert lanes == {"without_replacement": 1, "poisson": fjp.training.poisson_capacity(2, 0.5)}
    assert all(r["seconds_per_round"] > 0 for r in rows)


def test_a_bad_flag_is_one_error_line_and_status_2():
    done = _run("--sampling_rate=1.5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --sampling_rate must be in (0, 1], got 1.5."]
