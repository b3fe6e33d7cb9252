"""The launchers other than run and sweep check all their flags before reading any data:
one `error:` line naming the flag (exit status 2), or naming a damaged file (exit status 1)."""

import json
import os
import re
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


RUNTIME = {"cpu_devices", "coordinator_address", "num_processes", "process_id",
           "compilation_cache"}
TRAINING = {"workdir", "overwrite", "mlflow_tracking_uri", "mlflow_experiment"}
SHARED = TRAINING | RUNTIME | {"quiet"}
# What each main does: trains (run, sweep), computes with JAX and writes (demo, weights,
# restricted_eval), writes a report or a submission, or prints (privacy); --quiet everywhere.
TAKES = {
    "run": SHARED, "sweep": SHARED,
    **{m: {"workdir", "quiet"} | RUNTIME for m in ("demo", "weights", "restricted_eval")},
    **{m: {"workdir", "quiet"}
       for m in ("compare", "dp_updates_report", "unknown_target_report", "submit")},
    "privacy": {"quiet"},
}


@pytest.mark.parametrize("main", sorted(TAKES))
def test_a_mains_help_shows_the_shared_flags_it_takes_and_no_other(main):
    completed = _main(f"experiments.{main}", "--help")
    assert completed.returncode == 0, completed.stderr[-2000:]
    shown = set(re.findall(r"^  --(?:\[no\])?(\w+):", completed.stdout, re.MULTILINE))
    assert shown & SHARED == TAKES[main]


@pytest.mark.parametrize("main, flag", [
    ("privacy", "--overwrite"), ("compare", "--cpu_devices=2"), ("demo", "--overwrite"),
    ("unknown_target_report", "--mlflow_experiment=x"),
])
def test_a_shared_flag_a_main_does_not_take_is_refused_before_it_runs(tmp_path, main, flag):
    line = _error_line(_main(f"experiments.{main}", flag, *{
        "privacy": ["--config=configs/default.py"],
        "compare": [f"--tables={tmp_path / 'none'}", f"--workdir={tmp_path / 'w'}"],
        "demo": [f"--workdir={tmp_path / 'w'}"],
        "unknown_target_report": [f"--sweeps={tmp_path / 'none'}", f"--workdir={tmp_path / 'w'}"],
    }[main]), 2)
    assert f"takes no {flag.split('=')[0]} " in line
    assert not (tmp_path / "w").exists()


def test_a_users_main_declares_the_shared_flags_it_takes_and_is_named_in_the_refusal(tmp_path):
    script = tmp_path / "my_main.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {ROOT!r})\n"
        "from experiments import flags as common\n"
        "def main(argv):\n    print('workdir', common.WORKDIR.value)\n"
        "common.run(main, takes=common.WRITES)\n"
    )

    def launch(*args):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    line = _error_line(launch("--overwrite"), 2)
    assert line.startswith("error: my_main.py takes no --overwrite ")
    done = launch(f"--workdir={tmp_path / 'w'}", "--quiet")
    assert done.returncode == 0 and done.stdout == f"workdir {tmp_path / 'w'}\n", done.stderr


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


# -- the demo says what it compiled and what it loaded from the compilation cache ----------------


def test_the_compilation_count_tells_compiled_from_loaded_programs(monkeypatch):
    from experiments import demo

    count = demo.CompilationCount()
    for _ in range(3):  # three programs built, two of them loaded from the cache
        count.on_duration(demo.BACKEND_COMPILE_EVENT, 0.2, fun_name="f")
    count.on_event(demo.CACHE_HIT_EVENT)
    count.on_event(demo.CACHE_HIT_EVENT)
    count.on_duration(demo.CACHE_SAVED_EVENT, 1.25)
    count.on_event("/jax/compilation_cache/compile_requests_use_cache")  # not a program
    count.on_duration("/jax/core/compile/jaxpr_trace_duration", 0.1)
    assert (count.programs, count.compiled, count.loaded) == (3, 1, 2)
    monkeypatch.setenv("HOME", "/home/me")
    assert count.summary("/home/me/.cache/fedjax_pals/jax") == (
        "compiled 1 program, loaded 2 from the compilation cache in ~/.cache/fedjax_pals/jax "
        "(about 1.2 s of compiling saved)"
    )
    assert count.summary("/home/meow/jax").endswith("in /home/meow/jax (about 1.2 s of "
                                                    "compiling saved)")
    assert count.summary(None) == ("compiled 1 program (no persistent compilation cache: "
                                   "--compilation_cache=none)")
    assert demo.CompilationCount().summary("/c") == (
        "no program compiled or loaded (the compilation cache is /c)")
    first = demo.CompilationCount()
    first.on_duration(demo.BACKEND_COMPILE_EVENT, 0.2)
    first.on_duration(demo.BACKEND_COMPILE_EVENT, 0.2)
    assert first.summary("/c") == ("compiled 2 programs, loaded none from the compilation cache "
                                   "in /c (kept there: the next launch loads them)")


_COUNT_TWO_PROGRAMS = """
import sys
import jax, jax.numpy as jnp
import fedjax_pals as fjp
from experiments.demo import CompilationCount

fjp.configure_runtime(compilation_cache=sys.argv[1])
with CompilationCount() as count:
    jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.arange(5.0)).block_until_ready()
    jax.jit(lambda x: jnp.cos(x) + 2.0)(jnp.arange(7.0)).block_until_ready()
print(count.compiled, count.loaded)
"""


def test_a_second_process_counts_the_programs_it_loaded_from_the_cache(tmp_path):
    # JAX's own events, in fresh processes sharing a cache: the event names of this jax version.
    env = {k: v for k, v in os.environ.items() if k != "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"}
    counts = []
    for _ in range(2):
        completed = subprocess.run(
            [sys.executable, "-c", _COUNT_TWO_PROGRAMS, str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
        )
        assert completed.returncode == 0, completed.stderr[-2000:]
        counts.append(completed.stdout.split())
    (compiled, none), (again, loaded) = counts  # the two jitted functions, jnp.arange's
    assert int(compiled) >= 2 and none == "0" and again == "0" and loaded == compiled, counts
