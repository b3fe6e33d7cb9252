"""experiments/benchmarks/torch_step.py: its summary and table, and the JAX cases it times (no
PyTorch: the project never depends on it). No timing assertions."""

from __future__ import annotations

import pytest

from experiments.benchmarks import torch_step


def test_summary_takes_medians_and_ratios_to_torch_and_to_the_plain_loop():
    times = {
        "plain_loop": [{"wall_s": 1.0, "cpu_s": 1.0}, {"wall_s": 0.5, "cpu_s": 0.5}] * 2
        + [{"wall_s": 1.0, "cpu_s": 1.0}],
        "engine": [{"wall_s": 0.5, "cpu_s": 0.25}] * 5,
        "torch_channels_last": [{"wall_s": 0.8, "cpu_s": 0.5}] * 5,
    }
    rows = {r["case"]: r for r in torch_step.summarize(times, 80)}
    assert rows["plain_loop"]["client_steps_per_s"] == 80.0  # median of 80, 160, 80, 160, 80
    assert rows["plain_loop"]["client_steps_per_s_range"] == [80.0, 160.0]
    assert rows["engine"]["vs_plain_loop"] == 2.0
    assert rows["engine"]["vs_torch_channels_last"] == pytest.approx(1.6)
    assert rows["engine"]["vs_torch_channels_last_cpu"] == pytest.approx(2.0)
    table = torch_step.markdown_table(list(rows.values()))
    assert table.count("\n") == 4 and "| engine | 160 (160-160) | 320 | 1.60 / 2.00 |" in table


def test_summary_without_torch_has_no_torch_ratios():
    rows = torch_step.summarize({"plain_loop": [{"wall_s": 1.0, "cpu_s": 1.0}]}, 10)
    assert rows[0]["vs_torch_channels_last"] is None and rows[0]["vs_plain_loop"] == 1.0
    assert "| plain_loop | 10 (10-10) | 10 | - / - | 1.00 / 1.00 |" in torch_step.markdown_table(
        rows
    )


def test_jax_cases_take_steps():
    cases = torch_step._jax_cases(steps=2)
    assert set(cases) == set(torch_step.JAX_CASES)
    for run in cases.values():
        run(3)  # wraps around the 2 scheduled batches
