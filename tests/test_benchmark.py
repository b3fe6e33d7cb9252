"""Tests of experiments.benchmarks.harness: cases, ratios, the baseline loop, the row schema and
the child-process runner. No timing assertions: only what is computed from timings."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from experiments.benchmarks import harness as bench

BACKENDS = bench.available_backends()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = bench.BenchmarkSettings(
    examples_per_client=64, batch_size=32, rounds=1, min_timed_seconds=0.0, check_clients=2
)

# Keys every measured ("ok") row carries; the JSON of experiments/benchmarks/round.py.
OK_ROW_KEYS = {
    "model",
    "num_clients",
    "backend",
    "strategy",
    "devices",
    "devices_setting",
    "processes",
    "runs",
    "status",
    "is_default",
    "compile_plus_first_round_s",
    "compile_s",
    "num_compiles_first_round",
    "steady_round_s",
    "round_times_s",
    "recompiled_after_first_round",
    "client_steps_per_round",
    "client_steps_per_s",
    "examples_per_s",
    "peak_rss_mib",
    "load_average_at_start",
    "foreign_cpu_cores",
}


# -- cases -------------------------------------------------------------------------------------


def test_benchmark_cases_put_one_default_process_baseline_first_per_model_and_m():
    cases = bench.benchmark_cases(
        ["lenet", "logistic_regression"],
        ["100", 10],
        BACKENDS[:2],
        devices=["auto", "2"],
        processes=[1],
        runs=[1, 4],
    )
    per_problem = 1 + 2 * 2 * 1 * 2
    assert len(cases) == 2 * 2 * per_problem
    # Ascending M, then models in the given order.
    assert [(c.num_clients, c.model) for c in cases[::per_problem]] == [
        (10, "lenet"),
        (10, "logistic_regression"),
        (100, "lenet"),
        (100, "logistic_regression"),
    ]
    baseline = cases[0]
    assert baseline.is_baseline
    assert (baseline.devices, baseline.processes, baseline.runs) == (bench.DEFAULT_DEVICES, 1, 1)
    engine_cases = cases[1:per_problem]
    assert {(c.backend, c.devices, c.runs) for c in engine_cases} == {
        (b, d, r) for b in BACKENDS[:2] for d in ("auto", 2) for r in (1, 4)
    }
    assert not any(c.is_baseline for c in engine_cases)
    assert len({c.name for c in cases}) == len(cases)


def test_benchmark_cases_put_the_ceiling_after_the_baseline_on_the_auto_devices():
    cases = bench.benchmark_cases(["lenet"], [100, 10], ["auto"], ceiling=True)
    assert [(c.num_clients, c.backend, c.devices) for c in cases] == [
        (10, bench.BASELINE, "default"),
        (10, bench.CEILING, "auto"),
        (10, "auto", "auto"),
        (100, bench.BASELINE, "default"),
        (100, bench.CEILING, "auto"),
        (100, "auto", "auto"),
    ]
    assert cases[1].is_ceiling and not cases[1].is_baseline
    assert not any(c.is_ceiling for c in bench.benchmark_cases(["lenet"], [10], ["auto"]))


def test_benchmark_cases_without_baseline_and_with_auto_backend():
    cases = bench.benchmark_cases(["lenet"], [10], ["auto"], baseline=False)
    assert cases == [bench.BenchmarkCase("lenet", 10, "auto", "auto", 1, 1)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(models=["resnet"]), "unknown model 'resnet'"),
        (dict(backends=["warp_drive"]), "unknown backend 'warp_drive'"),
        (dict(num_clients=[0]), "num_clients must be integers >= 1, got 0"),
        (dict(num_clients=[]), "num_clients must not be empty"),
        (
            dict(devices=["many"]),
            "devices must be 'default', 'auto' or an integer >= 1, got 'many'",
        ),
        (dict(devices=[0]), "devices must be 'default', 'auto' or an integer >= 1, got 0"),
        (dict(processes=[0]), "processes must be integers >= 1, got 0"),
        (dict(runs=[1.5]), "runs must be integers >= 1, got 1.5"),
        (dict(devices=["default"], processes=[2]), "cannot go with processes > 1"),
        (dict(backends=[], baseline=False), "nothing to measure"),
    ],
)
def test_benchmark_cases_reject_bad_arguments(kwargs, match):
    args = dict(models=["lenet"], num_clients=[10], backends=[BACKENDS[0]])
    args.update(kwargs)
    positional = [args.pop(k) for k in ("models", "num_clients", "backends")]
    with pytest.raises(ValueError, match=match):
        bench.benchmark_cases(*positional, **args)


def test_parse_devices():
    assert bench.parse_devices(" auto") == "auto"
    assert bench.parse_devices("default") == "default"
    assert bench.parse_devices("8") == 8
    assert bench.parse_devices(3) == 3
    with pytest.raises(ValueError, match="got True"):
        bench.parse_devices(True)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("batch_size", 0, "batch_size must be an integer >= 1, got 0"),
        ("rounds", 2.5, "rounds must be an integer >= 1, got 2.5"),
        ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
        ("min_timed_seconds", -1.0, "min_timed_seconds must be >= 0, got -1.0"),
    ],
)
def test_settings_reject_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        bench.BenchmarkSettings(**{field: value})


def test_round_participants_sample_m_clients_per_round_the_same_for_every_case():
    everyone = bench.BenchmarkSettings()
    np.testing.assert_array_equal(bench.round_participants(5, everyone, 3), np.arange(5))
    tenth = bench.BenchmarkSettings(participation=0.1, seed=4)
    assert tenth.clients_per_round(1000) == 100 and tenth.clients_per_round(3) == 1
    a0, a1 = (bench.round_participants(1000, tenth, r) for r in (0, 1))
    assert a0.shape == (100,) and len(set(a0.tolist())) == 100
    assert np.all(np.diff(a0) > 0) and a0.min() >= 0 and a0.max() < 1000
    np.testing.assert_array_equal(a0, bench.round_participants(1000, tenth, 0))
    assert not np.array_equal(a0, a1)
    with pytest.raises(ValueError, match=r"participation must be in \(0, 1\], got 0.0"):
        bench.BenchmarkSettings(participation=0.0)


def test_settings_count_steps_per_client_with_a_partial_last_batch():
    assert bench.BenchmarkSettings(examples_per_client=64, batch_size=32).steps_per_client == 2
    s = bench.BenchmarkSettings(examples_per_client=65, batch_size=32, local_epochs=2)
    assert s.steps_per_client == 6


# -- workloads -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, model, input_shape, num_classes, m, examples, batch, steps, num_params",
    [
        # FedJAX's create_conv_model on 28x28x1 / 62 classes: 320 + 18,496 + 1,179,776 + 7,998.
        ("fedjax_emnist", "fedjax_emnist_cnn", (28, 28, 1), 62, 10, 200, 10, 20, 1_206_590),
        # pfl-research's simple_cnn on 32x32x3 / 10: 896 + 18,496 + 1,605,760 + 1,290.
        ("pfl_cifar10", "pfl_cifar10_cnn", (32, 32, 3), 10, 50, 50, 10, 5, 1_626_442),
    ],
)
def test_a_workload_sets_the_documented_shapes(
    name, model, input_shape, num_classes, m, examples, batch, steps, num_params
):
    w = bench.get_workload(name)
    assert (w.model, w.input_shape, w.num_classes) == (model, input_shape, num_classes)
    assert (w.num_clients, w.examples_per_client, w.batch_size, w.local_epochs) == (
        m, examples, batch, 1
    )
    assert w.steps_per_client == steps
    settings = bench.BenchmarkSettings(**w.settings_fields())
    assert settings.steps_per_client == steps and settings.check_clients == m
    net = bench.make_model(model)
    assert net is bench.make_model(model)  # cached: the engine's compile cache keys on it
    assert net.num_classes == num_classes and net.is_convolutional
    params = net.init(jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == num_params
    data = bench.synthetic_data(model, 3, 4, seed=0)
    assert data.train_x.shape == (12, *input_shape)
    assert int(jnp.max(data.train_y)) < num_classes and data.client_label_dists.shape == (
        3, num_classes
    )
    assert net.apply(params, data.train_x[:2]).shape == (2, num_classes)
    # The default models keep their Fashion-MNIST shapes.
    assert bench.model_input_shape("lenet") == bench.INPUT_SHAPE
    assert bench.synthetic_data("logistic_regression", 2, 4, 0).train_x.shape == (8, 784)


def test_resolve_workload_sets_model_m_and_steps_and_given_flags_win():
    given = {
        "models": (["lenet", "logistic_regression"], False),
        "num_clients": (["10", "100", "1000"], False),
        "examples_per_client": (64, False),
        "batch_size": (32, False),
        "local_epochs": (1, False),
        "check_clients": (10, False),
    }
    # No workload: the flags' values as they are.
    assert bench.resolve_workload(None, given) == {k: v for k, (v, _) in given.items()}
    out = bench.resolve_workload("pfl_cifar10", given)
    assert out == {
        "models": ["pfl_cifar10_cnn"],
        "num_clients": [50],
        "examples_per_client": 50,
        "batch_size": 10,
        "local_epochs": 1,
        "check_clients": 50,
    }
    out = bench.resolve_workload("fedjax_emnist", {**given, "batch_size": (20, True)})
    assert out["models"] == ["fedjax_emnist_cnn"]
    assert (out["num_clients"], out["batch_size"]) == ([10], 20)  # --batch_size=20 given
    assert bench.BenchmarkSettings(
        examples_per_client=out["examples_per_client"], batch_size=out["batch_size"]
    ).steps_per_client == 10
    with pytest.raises(ValueError, match="sets the model .*drop --models"):
        bench.resolve_workload("fedjax_emnist", {**given, "models": (["lenet"], True)})
    with pytest.raises(ValueError, match="unknown workload 'mnist'"):
        bench.resolve_workload("mnist", given)


def _benchmark_main(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.benchmarks.round", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--workload=cifar100"], "value should be one of <fedjax_emnist|pfl_cifar10>"),
        (["--workload=pfl_cifar10", "--models=lenet"], "drop --models"),
    ],
)
def test_a_bad_workload_is_one_error_line_and_exit_status_2(tmp_path, args, expected):
    output = tmp_path / "bench.json"
    completed = _benchmark_main(*args, f"--output={output}")
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr[-2000:]
    assert expected in lines[0]
    assert "Traceback" not in completed.stderr and completed.stdout == ""
    assert not output.exists()  # nothing measured


# -- pure arithmetic on measurements ------------------------------------------------------------


def test_plan_timed_rounds_fits_the_case_budget_and_extends_fast_rounds():
    s = bench.BenchmarkSettings(
        rounds=3, max_seconds_per_case=60.0, min_timed_seconds=1.0, max_fast_rounds=20
    )
    # 10 s rounds after a 45 s first round: one more fits the 60 s budget.
    assert bench.plan_timed_rounds(55.0, 45.0, s) == 1
    # Over budget already: still one timed round.
    assert bench.plan_timed_rounds(100.0, 10.0, s) == 1
    # 2 s rounds: --rounds.
    assert bench.plan_timed_rounds(7.0, 5.0, s) == 3
    # 0.1 s rounds: more, until they total 1 s.
    assert bench.plan_timed_rounds(5.1, 5.0, s) == 10
    # 1 ms rounds: capped at max_fast_rounds.
    assert bench.plan_timed_rounds(5.001, 5.0, s) == 20


def test_predict_case_scales_the_round_linearly_in_m():
    assert bench.predict_case(None, 100) == (None, None)
    est_round, est_case = bench.predict_case((10, 0.5, 3.0), 100)
    assert est_round == pytest.approx(5.0)
    assert est_case == pytest.approx(3.0 + 2 * 5.0)


def _measure(wall, compile_s=0.0, compiles=0, cpu=None, busy=None, rss=100.0):
    return {
        "wall_s": wall,
        "compile_s": compile_s,
        "compiles": compiles,
        "cpu_s": wall if cpu is None else cpu,
        "machine_busy_cpu_s": busy,
        "peak_rss_mib": rss,
        "rss_reset": True,
        "rss_at_start_mib": 50.0,
        "device_peak_bytes_in_use": None,
        "load_average": [1.0, 1.0, 1.0],
    }


def test_summarize_case_takes_the_slowest_process_and_sums_their_memory():
    case = bench.BenchmarkCase("lenet", 10, BACKENDS[0], 2, processes=2, runs=3)
    first = [_measure(4.0, 3.0, 5, rss=300.0), _measure(4.5, 3.1, 5, rss=200.0)]
    rounds = [
        # Process 0 busy-CPU reading: both processes' 1 s each plus 0.5 s of others'.
        [_measure(1.0, cpu=1.0, busy=2.5, rss=310.0), _measure(2.0, cpu=1.0, rss=250.0)],
        [_measure(1.0, cpu=1.0, busy=2.5), _measure(0.5, cpu=1.0)],
        [_measure(3.0, 0.2, 1, cpu=1.0, busy=2.5), _measure(1.0, cpu=1.0)],
    ]
    info = {"devices": 4, "local_devices": 2, "resolved_backend": BACKENDS[0], "is_default": True}
    row = bench.summarize_case(case, first, rounds, info, TINY, predicted_round_s=1.5)
    assert OK_ROW_KEYS <= set(row)
    assert row["round_times_s"] == [2.0, 1.0, 3.0]
    assert row["steady_round_s"] == 2.0
    assert row["compile_plus_first_round_s"] == 4.5
    assert row["compile_s"] == 3.0 and row["num_compiles_first_round"] == 5
    assert row["recompiled_after_first_round"] is True
    assert row["compile_s_during_timed_rounds"] == pytest.approx(0.2)
    # runs x m x steps per client.
    assert row["clients_per_round"] == 10
    assert row["client_steps_per_round"] == 3 * 10 * 2
    assert row["client_steps_per_s"] == pytest.approx(60 / 2.0)
    assert row["examples_per_s"] == pytest.approx(60 * 32 / 2.0)
    assert row["peak_rss_mib_per_process"] == [310.0, 250.0]
    assert row["peak_rss_mib"] == 560.0
    # 3 x 2.5 busy CPU-s, minus 6 own, over 6 s of rounds.
    assert row["foreign_cpu_cores"] == pytest.approx(1.5 / 6.0)
    assert (row["devices"], row["devices_setting"], row["processes"], row["runs"]) == (4, 2, 2, 3)
    assert row["backend"] == row["strategy"] == BACKENDS[0]
    assert row["is_default"] is True


def test_summarize_case_without_machine_cpu_readings_reports_no_foreign_load():
    case = bench.BenchmarkCase("lenet", 10, BACKENDS[0])
    row = bench.summarize_case(case, [_measure(2.0)], [[_measure(1.0)]], {}, TINY)
    assert row["foreign_cpu_cores"] is None
    assert row["recompiled_after_first_round"] is False
    with pytest.raises(ValueError, match="no timed rounds"):
        bench.summarize_case(case, [_measure(2.0)], [], {}, TINY)


def _row(model, m, backend, steps_per_s, status="ok", runs=1):
    return {
        "model": model,
        "num_clients": m,
        "backend": backend,
        "status": status,
        "runs": runs,
        "devices": 1,
        "processes": 1,
        "client_steps_per_s": steps_per_s,
        "steady_round_s": runs * m / steps_per_s if steps_per_s else None,
    }


def test_add_speedups_divides_throughput_by_the_same_model_and_m_baseline():
    rows = [
        _row("lenet", 10, bench.BASELINE, 200.0),
        _row("lenet", 10, "a", 320.0),
        _row("lenet", 10, "b", 800.0, runs=8),
        _row("lenet", 100, bench.BASELINE, 100.0),
        _row("lenet", 100, "a", 150.0),
        _row("logistic_regression", 10, "a", 5.0),  # no baseline for this model
        _row("lenet", 100, "c", None, status="skipped"),
    ]
    bench.add_speedups(rows)
    assert [r["speedup_vs_baseline"] for r in rows] == [1.0, 1.6, 4.0, 1.0, 1.5, None, None]
    # For one run the throughput ratio is the round-time ratio.
    assert rows[1]["baseline_steady_round_s"] / rows[1]["steady_round_s"] == pytest.approx(1.6)
    fastest = bench.fastest_cases(rows)
    assert fastest["lenet/M=10"]["backend"] == "b"
    assert fastest["lenet/M=100"]["backend"] == "a"


def test_add_speedups_gives_default_rows_their_fraction_of_the_same_m_ceiling():
    rows = [
        _row("lenet", 10, bench.BASELINE, 200.0),
        _row("lenet", 10, bench.CEILING, 300.0),
        _row("lenet", 10, "a", 270.0),
        _row("lenet", 10, "b", 150.0),
        _row("lenet", 100, bench.CEILING, 400.0),
        _row("lenet", 100, "a", 100.0),
        _row("logistic_regression", 10, "a", 5.0),  # no ceiling for this model
    ]
    for i in (2, 5, 6):
        rows[i]["is_default"] = True
    bench.add_speedups(rows)
    assert [r["fraction_of_ceiling"] for r in rows] == [None, None, 0.9, None, None, 0.25, None]
    assert rows[1]["speedup_vs_baseline"] == 1.5  # the ceiling's own multiple of the loop


def test_runs_axis_gains_divide_r_runs_throughput_by_one_runs_of_the_same_case():
    rows = [
        _row("lenet", 10, bench.BASELINE, 200.0),
        _row("lenet", 10, "host_loop", 300.0),
        _row("lenet", 10, "host_loop", 330.0, runs=16),
        _row("lenet", 10, "vmap_scan", 100.0, runs=16),  # no one-run row of its own
        _row("lenet", 100, "host_loop", 250.0, runs=16),  # nor at this M
        _row("lenet", 10, "host_loop", None, status="skipped", runs=4),
    ]
    for r in rows:
        r["compile_s"] = 2.0 * r["runs"]
    rows[1]["min_round_s"], rows[2]["min_round_s"] = 1.0, 12.5  # fastest timed rounds
    gains = bench.runs_axis_gains(rows)
    assert len(gains) == 1
    (g,) = gains
    assert (g["model"], g["num_clients"], g["backend"], g["runs"]) == ("lenet", 10, "host_loop", 16)
    assert g["gain"] == pytest.approx(1.1)
    assert g["gain_fastest_rounds"] == pytest.approx(16 * 1.0 / 12.5)
    assert (g["one_run_compile_s"], g["compile_s"]) == (2.0, 32.0)
    lines = bench.runs_axis_table(gains).splitlines()
    assert len(lines) == 3 and "| 1.10x | 1.28x |" in lines[2]
    assert bench.runs_axis_gains(rows[:2]) == []


def test_markdown_table_has_one_line_per_row_and_marks_the_default():
    case = bench.BenchmarkCase("lenet", 10, BACKENDS[0])
    ok = bench.summarize_case(
        case, [_measure(2.0)], [[_measure(1.0)]], {"is_default": True, "devices": 2}, TINY
    )
    skipped = bench._status_row(case, "skipped", TINY, predicted_round_s=9.0, predicted_case_s=30.0)
    failed = bench._status_row(case, "error", TINY, error="boom")
    rows = bench.add_speedups([ok, skipped, failed])
    lines = bench.markdown_table(rows).splitlines()
    assert len(lines) == 2 + 3
    assert f"{BACKENDS[0]} (default)" in lines[2]
    assert "skipped (est. 30.0s" in lines[3]
    assert "error: boom" in lines[4]


# -- measurement in this process ------------------------------------------------------------------


def test_compile_timer_counts_compilations_through_jax_monitoring():
    x = np.arange(7.0, dtype=np.float32)  # numpy inputs: no eager JAX op compiles
    with bench.CompileTimer() as timer:
        f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
        f(x).block_until_ready()
        seconds, count = timer.snapshot()
        assert count == 1 and seconds > 0
        f(x + 1).block_until_ready()  # cached: no new compilation
        assert timer.snapshot()[1] == 1
        jax.jit(lambda x: x - 2.0)(x).block_until_ready()
        assert timer.snapshot()[1] == 2
    jax.jit(lambda x: x * 5.0)(x).block_until_ready()
    assert timer.snapshot()[1] == 2  # closed: no longer listening


@pytest.mark.parametrize(
    "model_name, backends",
    [("logistic_regression", BACKENDS), ("lenet", ("auto",)), ("pfl_cifar10_cnn", ("auto",))],
)
def test_baseline_loop_equals_the_engine_round(model_name, backends):
    num_clients = 3
    model = bench.make_model(model_name)
    data = bench.synthetic_data(model_name, num_clients, 64, seed=0)
    training = bench.local_training(TINY)
    params = model.init(jax.random.PRNGKey(0))
    participants = np.array([2, 0], np.int32)  # partial participation, out of order
    key = jax.random.PRNGKey(7)
    expected = bench.BaselineLoop(model, training).run_round(data, params, participants, key)
    algorithm = fjp.fedavg()
    for backend in backends:
        engine = bench.make_engine(algorithm, model, training, backend, chunk_size=2)
        state = fjp.init_server_state(algorithm, params, num_clients)
        state, _ = engine.run_round(data, state, participants, key)
        diffs = jax.tree_util.tree_map(
            lambda a, b: float(jnp.max(jnp.abs(a - b))), expected, state.params
        )
        assert max(jax.tree_util.tree_leaves(diffs)) < 1e-5, (backend, diffs)
    # And the round did move the params (the comparison is not between two no-ops).
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), expected, params)
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-4


def test_baseline_local_updates_averaged_by_size_equal_its_round():
    model = bench.make_model("logistic_regression")
    data = bench.synthetic_data("logistic_regression", 3, 64, seed=1)
    loop = bench.BaselineLoop(model, bench.local_training(TINY))
    params = model.init(jax.random.PRNGKey(2))
    key = jax.random.PRNGKey(3)
    expected = loop.run_round(data, params, [0, 2], key)
    locals_ = [loop.local_update(data, params, c, key) for c in (0, 2)]
    # Equal sizes: FedAvg's n_i / sum n_j weights are 1/2 each.
    average = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, *locals_)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), expected, average
    )
    assert not np.allclose(locals_[0]["Dense_0"]["kernel"], locals_[1]["Dense_0"]["kernel"])


def test_baseline_loop_needs_full_batches():
    model = bench.make_model("logistic_regression")
    data = bench.synthetic_data("logistic_regression", 2, 48, seed=0)
    loop = bench.BaselineLoop(model, bench.local_training(TINY))
    with pytest.raises(ValueError, match="needs full batches"):
        loop.run_round(data, model.init(jax.random.PRNGKey(0)), [0, 1], jax.random.PRNGKey(1))


def test_worker_measures_rounds_into_a_schema_row():
    worker = bench.Worker("logistic_regression", 3, TINY)
    try:
        assert worker.info["devices"] == jax.device_count()
        assert worker.info["default_backend"] in BACKENDS
        case = bench.BenchmarkCase("logistic_regression", 3, "auto")
        added = worker.handle({"cmd": "add", "case": case.__dict__})
        assert added["resolved_backend"] == worker.info["default_backend"]
        assert added["is_default"] is True
        first = worker.handle({"cmd": "round", "case": case.name, "r": 0})
        second = worker.handle({"cmd": "round", "case": case.name, "r": 1})
        assert first["compiles"] > 0 and first["compile_s"] > 0
        assert second["compiles"] == 0  # the same shapes: nothing recompiled
        row = bench.summarize_case(case, [first], [[second]], {**worker.info, **added}, TINY)
        assert OK_ROW_KEYS <= set(row)
        assert row["backend"] == worker.info["default_backend"]
        json.dumps(bench._jsonable(row))
        with pytest.raises(ValueError, match="unknown command 'fly'"):
            worker.handle({"cmd": "fly"})
        # A baseline case is not "the default", whatever its backend column says.
        base = bench.BenchmarkCase("logistic_regression", 3, bench.BASELINE, "default")
        assert worker.handle({"cmd": "add", "case": base.__dict__})["is_default"] is False
    finally:
        worker.timer.close()


def test_child_env_clears_device_settings_and_puts_this_package_first(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4 --xla_dump_to=/x")
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "4")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("FEDJAX_PALS_PROCESS_ID", "1")  # as under fedjax_pals.launch
    env = bench._child_env(local_processes=2)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/x"
    assert "JAX_NUM_CPU_DEVICES" not in env and "FEDJAX_PALS_PROCESS_ID" not in env
    assert env["FEDJAX_PALS_LOCAL_PROCESSES"] == "2"
    root = os.path.dirname(os.path.dirname(os.path.abspath(fjp.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]


# -- child processes ------------------------------------------------------------------------------


@pytest.mark.integration
def test_run_benchmark_measures_each_device_config_in_its_own_process(monkeypatch):
    # Set in the parent, this would give every process 3 devices; the children must not inherit it.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    backend = BACKENDS[-1]
    cases = bench.benchmark_cases(["logistic_regression"], [4], [backend], devices=["default", 2])
    # Half the clients per round: parity also checks that every case trains the same sample.
    settings = dataclasses.replace(TINY, participation=0.5, check_clients=4)
    result = bench.run_benchmark(cases, settings, log=lambda msg: None)
    rows = result["results"]
    assert [(r["backend"], r["devices_setting"]) for r in rows] == [
        (bench.BASELINE, "default"),
        (backend, "default"),
        (backend, 2),
    ]
    assert all(r["status"] == "ok" for r in rows), rows
    assert [r["devices"] for r in rows] == [1, 1, 2]
    assert all(r["processes"] == 1 and r["runs"] == 1 for r in rows)
    assert all(r["clients_per_round"] == 2 and r["client_steps_per_round"] == 4 for r in rows)
    assert rows[0]["speedup_vs_baseline"] == 1.0
    assert all(r["speedup_vs_baseline"] > 0 for r in rows)
    assert all(r["num_compiles_first_round"] > 0 for r in rows)
    assert all(set(r) >= OK_ROW_KEYS for r in rows)
    parity = result["parity"]["logistic_regression"]
    assert parity["reference"] == cases[0].name
    assert len(parity["max_abs_diff"]) == 3
    assert max(parity["max_abs_diff"].values()) < 1e-5
    assert "| logistic_regression | 4 |" in result["markdown_table"]
    assert set(result["machine"]["children"]) == {
        "devices=default,processes=1",
        "devices=2,processes=1",
    }
    json.dumps(result)


def test_ceiling_loop_takes_every_step_of_the_round_and_leaves_the_params():
    settings = dataclasses.replace(TINY, examples_per_client=8, batch_size=4)
    model = bench.make_model("logistic_regression")
    data = bench.synthetic_data("logistic_regression", 5, 8, seed=0)
    ceiling = bench.CeilingLoop(model, bench.local_training(settings), data, jax.random.PRNGKey(1))
    calls = []
    step = ceiling._loop._step

    def counted(*args):
        calls.append((int(args[-2]), int(args[-1])))
        return step(*args)

    ceiling._loop._step = counted
    params = model.init(jax.random.PRNGKey(0))
    out = ceiling.run_round(params, np.array([0, 2, 3]))
    assert out is params
    assert sorted(calls) == [(c, s) for c in (0, 2, 3) for s in range(2)]


@pytest.mark.integration
def test_run_benchmark_reports_the_default_as_a_fraction_of_the_ceiling():
    cases = bench.benchmark_cases(["logistic_regression"], [4], ["auto"], ceiling=True)
    settings = dataclasses.replace(TINY, check_clients=4)
    result = bench.run_benchmark(cases, settings, log=lambda msg: None)
    baseline, ceiling, default = result["results"]
    assert [r["status"] for r in (baseline, ceiling, default)] == ["ok"] * 3
    assert ceiling["backend"] == bench.CEILING and not ceiling["is_default"]
    assert default["is_default"]
    assert default["fraction_of_ceiling"] == pytest.approx(
        default["client_steps_per_s"] / ceiling["client_steps_per_s"]
    )
    assert ceiling["fraction_of_ceiling"] is None and ceiling["speedup_vs_baseline"] > 0
    # The ceiling trains no round: it is not compared.
    assert set(result["parity"]["logistic_regression"]["max_abs_diff"]) == {
        cases[0].name,
        cases[2].name,
    }


@pytest.mark.integration
def test_run_benchmark_reports_a_failing_case_and_measures_the_rest():
    # 48 examples, batch 32: the baseline loop refuses partial batches; the engine does not.
    settings = bench.BenchmarkSettings(
        examples_per_client=48, batch_size=32, rounds=1, min_timed_seconds=0.0
    )
    cases = bench.benchmark_cases(["logistic_regression"], [2], [BACKENDS[0]], devices=["default"])
    rows = bench.run_benchmark(cases, settings, log=lambda msg: None)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "needs full batches" in rows[0]["error"]
    assert rows[1]["speedup_vs_baseline"] is None


@pytest.mark.integration
def test_run_benchmark_two_processes_equal_the_baseline():
    cases = bench.benchmark_cases(["logistic_regression"], [2], ["auto"], processes=[2])
    result = bench.run_benchmark(cases, TINY, log=lambda msg: None)
    rows = result["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert rows[1]["processes"] == 2 and len(rows[1]["peak_rss_mib_per_process"]) == 2
    # 'auto' shares the cores among the case's processes; the mesh spans both processes.
    assert rows[1]["devices"] == 2 * rows[1]["local_devices"]
    assert max(result["parity"]["logistic_regression"]["max_abs_diff"].values()) < 1e-5


@pytest.mark.integration
@pytest.mark.skipif(
    not hasattr(fjp.engine.RoundEngine, "run_rounds"), reason="the engine has no runs axis yet"
)
def test_run_benchmark_runs_axis_counts_every_run_and_run_zero_equals_the_baseline():
    cases = bench.benchmark_cases(["logistic_regression"], [2], ["auto"], runs=[3])
    result = bench.run_benchmark(cases, TINY, log=lambda msg: None)
    rows = result["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert rows[1]["client_steps_per_round"] == 3 * rows[0]["client_steps_per_round"]
    assert max(result["parity"]["logistic_regression"]["max_abs_diff"].values()) < 1e-5


def test_flower_benchmark_imports_without_defining_flags_when_flower_is_installed():
    pytest.importorskip("flwr")
    from absl import flags

    from experiments.benchmarks import flower

    assert "actors" not in flags.FLAGS  # defined only by its entry point
    setup = flower.FlowerSetup("lenet", 10, 10, 2, 1, TINY)
    assert hash(setup) == hash(flower.FlowerSetup("lenet", 10, 10, 2, 1, TINY))


# -- progress, partial results, stopping (fake workers: no processes) ----------------------------


class _FakeGroup:
    """A ChildGroup that answers at once; `interrupt_at` raises KeyboardInterrupt (Ctrl-C) when
    round `interrupt_round` (default: the first) of that case is asked for."""

    made: list = []
    interrupt_at: str | None = None
    interrupt_round: int = 0

    def __init__(self, devices, processes, model, num_clients, settings, workdir):
        self.devices, self.processes = devices, processes
        self.info = {"devices": 1, "local_devices": 1, "platform": "cpu", "device_kind": "cpu"}
        self.closed = self.killed = False
        _FakeGroup.made.append(self)

    def ask_all(self, command):
        if command["cmd"] == "add":
            return [{"resolved_backend": command["case"]["backend"], "is_default": False}]
        if command["case"] == _FakeGroup.interrupt_at and command["r"] == _FakeGroup.interrupt_round:
            raise KeyboardInterrupt
        return [_measure(0.5 if command["r"] == 0 else 0.01, compile_s=0.4 * (command["r"] == 0))]

    def close(self):
        self.closed = True

    def kill(self):
        self.killed = True


@pytest.fixture
def fake_workers(monkeypatch):
    monkeypatch.setattr(bench, "ChildGroup", _FakeGroup)
    monkeypatch.setattr(_FakeGroup, "made", [])
    monkeypatch.setattr(_FakeGroup, "interrupt_at", None)
    monkeypatch.setattr(_FakeGroup, "interrupt_round", 0)
    return _FakeGroup


FAKE_SETTINGS = dataclasses.replace(TINY, check_clients=0, rounds=2)


def test_run_benchmark_says_case_k_of_n_and_hands_over_the_result_after_every_case(fake_workers):
    cases = bench.benchmark_cases(["logistic_regression"], [2, 4], ["auto"])
    lines, updates = [], []
    result = bench.run_benchmark(cases, FAKE_SETTINGS, log=lines.append, on_update=updates.append)
    starts = [line for line in lines if line.startswith("case ")]
    assert starts == [f"case {k}/4 started: {case.name}" for k, case in enumerate(cases, 1)]
    # After each (model, M), whose cases finish together: what is done, what is left, and the
    # time left at the pace of the finished cases (none once all are done).
    finished = [line for line in lines if line.startswith("finished ")]
    assert [f.split(" (")[0] for f in finished] == [
        "finished 2/4 cases, 2 to go", "finished 4/4 cases, 0 to go"
    ]
    assert "elapsed, about" in finished[0] and " left)" in finished[0]
    assert "left" not in finished[1]
    assert lines.index(finished[0]) < lines.index(starts[2])
    # One update per finished case, each a whole JSON object marked partial, growing.
    assert [u["cases_done"] for u in updates] == [1, 2, 3, 4]
    assert all(u["partial"] and u["cases_total"] == 4 for u in updates)
    assert [len(u["results"]) for u in updates] == [1, 2, 3, 4]
    assert all("markdown_table" in u and "machine" in u for u in updates)
    json.dumps(updates)
    assert result["partial"] is False and result["cases_done"] == result["cases_total"] == 4
    assert updates[-1]["results"] == result["results"]
    assert all(group.closed and not group.killed for group in fake_workers.made)


def test_a_stopped_run_benchmark_kills_its_workers_and_its_partial_result_has_the_cases_done(
    fake_workers,
):
    cases = bench.benchmark_cases(["logistic_regression"], [2, 4], ["auto"])
    fake_workers.interrupt_at = cases[2].name  # the first case at M = 4
    updates = []
    with pytest.raises(KeyboardInterrupt):
        bench.run_benchmark(cases, FAKE_SETTINGS, log=lambda msg: None, on_update=updates.append)
    assert updates[-1]["partial"] and updates[-1]["cases_done"] == 2
    assert [r["num_clients"] for r in updates[-1]["results"]] == [2, 2]
    stopped = [g for g in fake_workers.made if g.killed]
    assert stopped and all(g.closed for g in fake_workers.made)


def test_a_benchmark_stopped_in_its_timed_rounds_keeps_the_rounds_each_case_had(fake_workers):
    # The timed rounds of a (model, M)'s cases are interleaved: stopped among them, no case
    # had finished, and nothing was kept although every case had measured rounds.
    cases = bench.benchmark_cases(["logistic_regression"], [2, 4], ["auto"])
    settings = dataclasses.replace(FAKE_SETTINGS, rounds=4, max_fast_rounds=4)
    fake_workers.interrupt_at, fake_workers.interrupt_round = cases[3].name, 2
    updates = []
    with pytest.raises(KeyboardInterrupt):
        bench.run_benchmark(cases, settings, log=lambda msg: None, on_update=updates.append)
    rows = updates[-1]["results"]
    assert updates[-1]["cases_done"] == 4 and [r["num_clients"] for r in rows] == [2, 2, 4, 4]
    assert not any(r.get("stopped_early") for r in rows[:2])
    # Round 2 of the second case at M = 4 was the one stopped: its group-mate had had it.
    assert [r["timed_rounds"] for r in rows[2:]] == [2, 1]
    assert all(r["stopped_early"] and r["planned_timed_rounds"] == 4 for r in rows[2:])
    assert all(r["status"] == "ok" for r in rows)


def test_the_budget_is_the_cases_times_the_per_case_budget():
    cases = bench.benchmark_cases(["logistic_regression", "lenet"], [10, 100], ["auto"])
    settings = dataclasses.replace(TINY, max_seconds_per_case=60.0)
    assert bench.budget_seconds(cases, settings) == len(cases) * 60.0 == 4 * 60.0 * 2
    assert bench.process_groups(cases) == 8  # (model, M) x (default devices, auto devices)
    assert bench.format_duration(36 * 60.0) == "36 min 00 s"
    assert bench.format_duration(42) == "42 s" and bench.format_duration(3725) == "1 h 02 min"


def test_a_worker_dies_with_its_parent_even_while_its_input_stays_open(tmp_path):
    # The parent starts a worker, and a second process holds the write end of the worker's
    # input: with the parent SIGKILLed the worker sees no end of file (as when it is busy
    # compiling). It must die with the parent all the same, at once.
    parent_code = r"""
import json, os, subprocess, sys, time
argv, env = json.loads(sys.stdin.readline())
env[sys.argv[1]] = str(os.getpid())
read, write = os.pipe()
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
worker = subprocess.Popen(argv, stdin=read, env=env, **quiet)
holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=[write])
print(worker.pid, holder.pid, flush=True)
time.sleep(120)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, bench._PARENT_ENV_VAR],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    parent.stdin.write(json.dumps([[sys.executable, "-c", bench.WORKER_CODE], bench._child_env()]))
    parent.stdin.write("\n")
    parent.stdin.flush()
    worker, holder = map(int, parent.stdout.readline().split())
    try:
        parent.kill()
        parent.wait()

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 10.0
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker)
    finally:
        for pid in (worker, holder):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_benchmark_stopped_by_sigterm_says_so_in_one_line_and_keeps_the_finished_cases(tmp_path):
    # The command itself, its run_benchmark replaced: one case finishes, then a SIGTERM.
    output = tmp_path / "bench.json"
    code = """
import os, signal, sys
from experiments import cli
from experiments.benchmarks import harness as bench, round as benchmark

def stopped_after_one_case(cases, settings, *, log, on_update):
    log(f"case 1/{len(cases)}")
    on_update({"partial": True, "cases_done": 1, "cases_total": len(cases), "results": [{}],
               "config": {}})
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("the SIGTERM did not stop it")

bench.run_benchmark = stopped_after_one_case
sys.argv = ["benchmark", "--models=logistic_regression", "--num_clients=2",
            "--backends=host_loop", "--noceiling", "--output=" + sys.argv[1]]
cli.run(benchmark.main)
"""
    completed = subprocess.run(
        [sys.executable, "-c", code, str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert completed.returncode == 128 + 15, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    lines = completed.stdout.strip().splitlines()
    assert lines[0].startswith("# benchmark: 2 cases") and "up to about 2 min 00 s" in lines[1]
    assert lines[-1] == (
        f"stopped by SIGTERM after 1 of 2 cases; {output} holds the 1 finished case(s) "
        '("partial": true).'
    )
    assert json.loads(output.read_text())["cases_done"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temporary file left
