r"""Throughput of one federated round: the engine's backends vs a plain loop.

A *case* is (model, M, backend, devices, processes, runs): one FedAvg round of
`fjp.engine.RoundEngine` in which m of M clients participate (all by default; E local
epochs of minibatch SGD, batch B), with the client axis executed by `backend`, in
`processes` JAX processes of `devices` CPU devices each, for `runs` runs at
once (the engine's runs axis). The reference is the *baseline loop*
(`BASELINE`): one process with JAX's default settings (one CPU device,
default threading), a Python loop over clients and steps of one jitted
single-client SGD step (`jax.value_and_grad` + `optax.sgd`, the batch gathered
from the device arrays inside the jit), with the same batch size, steps per
client, data order (`fjp.engine.client_schedule`, client key fold_in(round_key, id))
and FedAvg weights n_i / sum_j n_j, so its params equal the engine's.

Device settings such as `jax_num_cpu_devices` only take effect at process
start, so every group of cases with the same (devices, processes) runs in
child processes of its own: `devices="default"` is JAX untouched (the
baseline's process), `"auto"` is one host device per core
(`fjp.configure_runtime(cpu_devices="auto")`, what a user's run gets), an
integer n is n CPU devices. The parent drives the children over a pipe, one
command at a time, so that:

* the first rounds (cold compiles) run one case at a time;
* the timed rounds of all cases of one (model, M) are interleaved round-robin
  across the children (the idle ones block on a read), so load changes on a
  shared machine hit the baseline and the backends alike;
* a case of several processes gets every command at once (they compute the
  round together) and its round time is the slowest process's.

Measured per case: compile + first round, the trace + lower + XLA compile
seconds within it and their count (JAX's own `jax.monitoring` events), the
median of the timed rounds' seconds, client-steps/s = runs * m * steps / s,
peak RSS (reset per round through /proc/self/clear_refs; summed over the
case's processes), and the machine's load: the 1-minute load average, and the
CPU time others used during the timed rounds (`foreign_cpu_cores`: busy CPU
seconds of the whole machine from /proc/stat, minus the case's own processes',
per second of the timed rounds together). `speedup_vs_baseline` = case
client-steps/s / baseline client-steps/s for the same (model, M) (for runs = 1:
baseline s/round / case s/round); > 1 is faster than the loop.

*Workloads* (`WORKLOADS`, experiments/benchmarks/round.py's `--workload`): the round of a published
benchmark on synthetic tensors of its shapes: FedJAX's EMNIST-62 CNN (28x28x1, 62 classes,
10 clients a round, 200 examples in batches of 10: 20 steps) and pfl-research's CIFAR-10
simple CNN (32x32x3, 10 classes, cohort 50, 50 examples in batches of 10: 5 steps); the model
name fixes the input shape and the classes (`model_input_shape`, `model_num_classes`). With
cases of several runs, `runs_axis_gains` gives the runs axis' gain: R runs' client-steps/s
(every run's steps counted) over one run's, same (model, M, backend, devices, processes).

The *ceiling* (`CEILING`, device setting 'auto'): the baseline's bare jitted step with
nothing around it (no schedule, no aggregation, data and params placed beforehand), the
round's client steps dealt round-robin to the host devices and dispatched alternately from
one thread. It is what the machine's cores give for this step, whatever drives them; every
default row reports `fraction_of_ceiling` = its client-steps/s / the ceiling's at the same
(model, M).
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import os
import platform
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

import fedjax_pals as fjp
from . import memory

BASELINE = "baseline_loop"
"""The name of the plain-loop reference in the `backend` column."""
CEILING = "ceiling"
"""The bare step on the host devices, no round around it: the machine's ceiling for the step."""
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
MODELS = ("lenet", "logistic_regression")
"""The default models (Fashion-MNIST-shaped inputs, 10 classes): `--models`' default."""
WORKLOAD_MODELS = ("fedjax_emnist_cnn", "pfl_cifar10_cnn")
"""The models of the published workloads (`WORKLOADS`), each with its own input shape and
classes (`model_input_shape`, `model_num_classes`)."""
ALL_MODELS = MODELS + WORKLOAD_MODELS
_MODEL_SHAPES = {
    "lenet": (INPUT_SHAPE, NUM_CLASSES),
    "logistic_regression": (INPUT_SHAPE, NUM_CLASSES),
    "fedjax_emnist_cnn": ((28, 28, 1), 62),
    "pfl_cifar10_cnn": ((32, 32, 3), 10),
}
DEFAULT_DEVICES = "default"
"""Device setting 'JAX untouched': one CPU device, default threading (the baseline's)."""
AUTO_DEVICES = "auto"
"""Device setting `fjp.configure_runtime(cpu_devices="auto")`: one host device per core (the
cores divided among a case's local processes). The engine's cases default to it, and
`is_default` marks the engine's default backend on it: keep it what a user's run gets."""

_PROTOCOL_PREFIX = "@@fjp-bench "
# The parent's pid, in each worker's environment (the worker dies with it, `WORKER_CODE`).
_PARENT_ENV_VAR = "FEDJAX_PALS_BENCH_PARENT"
# A worker's program. Its first statements make it die with the parent (Linux): the kernel
# sends SIGKILL when the parent dies (PR_SET_PDEATHSIG, as fedjax_pals/launch.py's children),
# even by SIGKILL or in the middle of an XLA compile, and a worker whose parent died before
# the prctl took effect exits at once. Done here, not in a `preexec_fn` (launch.py's way): the
# parent has reader threads by the time it starts its later workers, and a `preexec_fn` is not
# safe in a process with threads. Before the heavy imports, so that the window is short.
WORKER_CODE = f"""\
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != os.environ.get("{_PARENT_ENV_VAR}", str(os.getppid())):
        os._exit(1)
import {__name__} as b
b.worker_main()
"""
# Environment variables that change JAX's device count or collectives: cleared in
# every child so that only the case's own settings apply.
_DEVICE_ENV_VARS = ("JAX_NUM_CPU_DEVICES", "JAX_CPU_COLLECTIVES_IMPLEMENTATION")
_XLA_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_MIN_FOREIGN_WINDOW_S = 0.5


def available_backends() -> tuple[str, ...]:
    """The engine's backend names (`fjp.engine.BACKENDS`; `fjp.STRATEGIES` in older versions)."""
    names = (
        getattr(fjp.engine, "BACKENDS", None)
        or getattr(fjp, "BACKENDS", None)
        or getattr(fjp, "STRATEGIES")
    )
    return tuple(str(getattr(b, "name", b)) for b in names)


# ----------------------------------------------------------------------------
# Cases and settings


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """The round being timed and how long to time it.

    Attributes:
      examples_per_client: n_i for every client (synthetic data); the baseline needs
        it to be a multiple of `batch_size` (full batches).
      batch_size, local_epochs, learning_rate: local SGD; steps per client =
        local_epochs * ceil(examples_per_client / batch_size).
      chunk_size: clients per chunk of the chunked backend.
      rounds: timed rounds after the first (median reported), fewer when they would
        not fit in `max_seconds_per_case`, more (up to `max_fast_rounds`) while
        they total under `min_timed_seconds`.
      max_seconds_per_case: a case predicted to take longer (compile + first + one
        timed round, scaled linearly in M from the largest smaller M) is skipped.
      check_clients: at this M, every case's first-round params are compared with
        the first case's (max abs diff).
      seed: seed of the synthetic data and of the initial params.
      participation: fraction of the M clients that train in a round (m = round(p M),
        at least 1; a fresh uniform sample every round, the same for every case).
      round_timeout_s: a child that answers no command for this long is an error.
    """

    examples_per_client: int = 64
    batch_size: int = 32
    local_epochs: int = 1
    learning_rate: float = 0.1
    chunk_size: int = 64
    rounds: int = 3
    max_seconds_per_case: float = 60.0
    min_timed_seconds: float = 1.0
    max_fast_rounds: int = 20
    check_clients: int = 10
    seed: int = 0
    participation: float = 1.0
    round_timeout_s: float = 1800.0

    def __post_init__(self):
        for name in (
            "examples_per_client",
            "batch_size",
            "local_epochs",
            "chunk_size",
            "rounds",
            "max_fast_rounds",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        for name in ("learning_rate", "max_seconds_per_case", "round_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
        if not 0 < self.participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}.")
        if not self.min_timed_seconds >= 0:
            raise ValueError(f"min_timed_seconds must be >= 0, got {self.min_timed_seconds!r}.")

    @property
    def steps_per_client(self) -> int:
        steps_per_epoch = -(-self.examples_per_client // self.batch_size)
        return self.local_epochs * steps_per_epoch

    def clients_per_round(self, num_clients: int) -> int:
        """m = round(participation * M), at least 1."""
        return max(1, min(num_clients, round(self.participation * num_clients)))


def round_participants(num_clients: int, settings: BenchmarkSettings, r: int) -> np.ndarray:
    """The sorted client ids of round r: all M, or a uniform sample of m drawn from (seed, r)."""
    m = settings.clients_per_round(num_clients)
    if m == num_clients:
        return np.arange(num_clients, dtype=np.int32)
    rng = np.random.default_rng([settings.seed, r])
    return np.sort(rng.choice(num_clients, m, replace=False)).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class BenchmarkCase:
    """One measured configuration: (model, M, backend, devices, processes, runs)."""

    model: str
    num_clients: int
    backend: str
    devices: str | int = AUTO_DEVICES
    processes: int = 1
    runs: int = 1

    @property
    def is_baseline(self) -> bool:
        return self.backend == BASELINE

    @property
    def is_ceiling(self) -> bool:
        return self.backend == CEILING

    @property
    def device_config(self) -> tuple[str | int, int]:
        """What must be set at process start: cases sharing it share child processes."""
        return (self.devices, self.processes)

    @property
    def name(self) -> str:
        return (
            f"{self.model}/M={self.num_clients}/{self.backend}/devices={self.devices}"
            f"/processes={self.processes}/runs={self.runs}"
        )


def parse_devices(value: str | int) -> str | int:
    """'default', 'auto' or a positive integer (from a flag's string)."""
    if isinstance(value, str):
        value = value.strip()
        if value in (DEFAULT_DEVICES, AUTO_DEVICES):
            return value
        try:
            value = int(value)
        except ValueError:
            raise ValueError(
                f"devices must be {DEFAULT_DEVICES!r}, {AUTO_DEVICES!r} or an integer >= 1, "
                f"got {value!r}."
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"devices must be {DEFAULT_DEVICES!r}, {AUTO_DEVICES!r} or an integer >= 1, "
            f"got {value!r}."
        )
    return int(value)


def _positive_ints(name: str, values: Iterable[Any]) -> list[int]:
    out = []
    for v in values:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be integers >= 1, got {v!r}.") from None
        if iv < 1 or iv != float(v):
            raise ValueError(f"{name} must be integers >= 1, got {v!r}.")
        out.append(iv)
    if not out:
        raise ValueError(f"{name} must not be empty.")
    return out


def benchmark_cases(
    models: Sequence[str],
    num_clients: Sequence[int],
    backends: Sequence[str],
    *,
    devices: Sequence[str | int] = (AUTO_DEVICES,),
    processes: Sequence[int] = (1,),
    runs: Sequence[int] = (1,),
    baseline: bool = True,
    ceiling: bool = False,
) -> list[BenchmarkCase]:
    """The cases of a benchmark, in measuring order.

    For every M (ascending) and model: the baseline first (if `baseline`), the ceiling
    (if `ceiling`), then the product backends x devices x processes x runs. `backends`
    are names of `available_backends()` or 'auto' (the engine's own choice). The
    baseline is always one process with JAX's default settings and one run; the
    ceiling one process on the 'auto' device setting.
    """
    models = list(models)
    if not models:
        raise ValueError("models must not be empty.")
    for m in models:
        if m not in ALL_MODELS:
            raise ValueError(f"unknown model {m!r}; choose among {ALL_MODELS}.")
    sizes = sorted(set(_positive_ints("num_clients", num_clients)))
    known = available_backends()
    backends = list(backends)
    for b in backends:
        if b != "auto" and b not in known:
            raise ValueError(f"unknown backend {b!r}; choose 'auto' or among {known}.")
    device_settings = [parse_devices(d) for d in devices]
    process_counts = _positive_ints("processes", processes)
    run_counts = _positive_ints("runs", runs)
    if not (baseline or ceiling or backends):
        raise ValueError("nothing to measure: no backends, baseline=False and ceiling=False.")
    for d in device_settings:
        if d == DEFAULT_DEVICES and any(p > 1 for p in process_counts):
            raise ValueError(
                f"devices={DEFAULT_DEVICES!r} means one untouched JAX process; "
                f"it cannot go with processes > 1 (got processes={process_counts})."
            )
    cases = []
    for m in sizes:
        for model in models:
            if baseline:
                cases.append(BenchmarkCase(model, m, BASELINE, DEFAULT_DEVICES, 1, 1))
            if ceiling:
                cases.append(BenchmarkCase(model, m, CEILING, AUTO_DEVICES, 1, 1))
            for b in backends:
                for d in device_settings:
                    for p in process_counts:
                        for r in run_counts:
                            cases.append(BenchmarkCase(model, m, b, d, p, r))
    return cases


def plan_timed_rounds(first_s: float, compile_s: float, settings: BenchmarkSettings) -> int:
    """How many timed rounds a case gets after its first one.

    A round is guessed to take (first round - compile) seconds; as many as fit in
    the case's budget (at least one, at most `settings.rounds`), and more (up to
    `max_fast_rounds`) while they total under `min_timed_seconds`.
    """
    guess = max(first_s - compile_s, 1e-3)
    remaining = settings.max_seconds_per_case - first_s
    rounds = int(min(settings.rounds, max(1, remaining // guess)))
    if guess * rounds < settings.min_timed_seconds:
        rounds = int(
            min(settings.max_fast_rounds, max(rounds, settings.min_timed_seconds // guess))
        )
    return rounds


def predict_case(
    previous: tuple[int, float, float] | None, num_clients: int
) -> tuple[float | None, float | None]:
    """(round s, least case s) at M from the same case's (M', round s, compile s) at M' < M.

    The round time scales linearly in M; the least a case takes is its compile,
    its first round and one timed round.
    """
    if previous is None:
        return None, None
    prev_m, prev_round, prev_compile = previous
    est_round = prev_round * num_clients / prev_m
    return est_round, prev_compile + 2 * est_round


def _case_key(case: BenchmarkCase) -> tuple:
    return (case.model, case.backend, case.devices, case.processes, case.runs)


def summarize_case(
    case: BenchmarkCase,
    first: Mapping[str, Any],
    rounds: Sequence[Sequence[Mapping[str, Any]]],
    info: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    predicted_round_s: float | None = None,
) -> dict:
    """The JSON row of a measured case.

    `first` holds the first round's measurements (one dict per process), `rounds`
    the timed rounds' (a list per round of one dict per process); `info` is the
    children's description (devices, resolved backend, defaults). A round's time
    is its slowest process's; RSS peaks are summed over processes; foreign CPU =
    the machine's busy CPU seconds minus the case's processes' own.
    """
    if not rounds:
        raise ValueError(f"case {case.name}: no timed rounds to summarize.")
    times = [max(p["wall_s"] for p in r) for r in rounds]
    steady = statistics.median(times)
    clients_per_round = settings.clients_per_round(case.num_clients)
    client_steps = case.runs * clients_per_round * settings.steps_per_client
    # CPU time is counted in clock ticks (10 ms): a ratio over all timed rounds together,
    # and none when they are too short for it to mean anything.
    busy = [r[0].get("machine_busy_cpu_s") for r in rounds]
    foreign = None
    if None not in busy and sum(times) >= _MIN_FOREIGN_WINDOW_S:
        own = sum(p["cpu_s"] for r in rounds for p in r)
        foreign = max(sum(busy) - own, 0.0) / sum(times)
    peak_per_process = [
        max([first[i]["peak_rss_mib"]] + [r[i]["peak_rss_mib"] for r in rounds])
        for i in range(len(first))
    ]
    first_wall = max(p["wall_s"] for p in first)
    compile_s = first[0]["compile_s"]
    backend = info.get("resolved_backend", case.backend)
    row = {
        "model": case.model,
        "num_clients": case.num_clients,
        "backend": backend,
        "strategy": backend,
        "backend_requested": case.backend,
        "devices_setting": case.devices,
        "devices": info.get("devices"),
        "local_devices": info.get("local_devices"),
        "processes": case.processes,
        "runs": case.runs,
        "clients_per_round": clients_per_round,
        "status": "ok",
        "is_default": bool(info.get("is_default", False)),
        "compile_plus_first_round_s": first_wall,
        "compile_s": compile_s,
        "num_compiles_first_round": first[0]["compiles"],
        "steady_round_s": steady,
        "min_round_s": min(times),
        "round_times_s": times,
        "timed_rounds": len(times),
        "compile_s_during_timed_rounds": sum(r[0]["compile_s"] for r in rounds),
        "recompiled_after_first_round": any(r[0]["compiles"] > 0 for r in rounds),
        "client_steps_per_round": client_steps,
        "client_steps_per_s": client_steps / steady,
        "examples_per_s": client_steps * settings.batch_size / steady,
        "peak_rss_mib": sum(peak_per_process),
        "peak_rss_mib_per_process": peak_per_process,
        "peak_rss_reset_per_round": all(p.get("rss_reset", False) for p in first),
        "rss_at_start_mib": first[0].get("rss_at_start_mib"),
        "device_peak_bytes_in_use": first[0].get("device_peak_bytes_in_use"),
        "load_average_at_start": first[0].get("load_average"),
        "load_average_at_end": rounds[-1][0].get("load_average"),
        "foreign_cpu_cores": foreign,
        "predicted_round_s": predicted_round_s,
    }
    return row


def _ok_rows_of(records: Sequence[dict], backend: str) -> dict:
    """(model, M) -> the ok row of `backend` (the baseline's or the ceiling's)."""
    return {
        (r["model"], r["num_clients"]): r
        for r in records
        if r["backend"] == backend and r["status"] == "ok"
    }


def add_speedups(records: list[dict]) -> list[dict]:
    """Sets `speedup_vs_baseline` and, on default rows, `fraction_of_ceiling`.

    `speedup_vs_baseline`: a row's client-steps/s over the ok `BASELINE` row's of the same
    (model, M); for one run this is baseline s/round / case s/round. Rows without a
    baseline get None. `fraction_of_ceiling`: a default row's client-steps/s over the ok
    `CEILING` row's of the same (model, M); None on every other row.
    """
    baseline = _ok_rows_of(records, BASELINE)
    ceiling = _ok_rows_of(records, CEILING)
    for r in records:
        base = baseline.get((r["model"], r["num_clients"]))
        if r["status"] == "ok" and base is not None:
            r["speedup_vs_baseline"] = r["client_steps_per_s"] / base["client_steps_per_s"]
            r["baseline_steady_round_s"] = base["steady_round_s"]
        else:
            r["speedup_vs_baseline"] = None
        top = ceiling.get((r["model"], r["num_clients"]))
        ok = r["status"] == "ok" and r.get("is_default") and top is not None
        r["fraction_of_ceiling"] = (
            r["client_steps_per_s"] / top["client_steps_per_s"] if ok else None
        )
    return records


def fastest_cases(records: Sequence[dict]) -> dict:
    """The ok row with the most client-steps/s per (model, M)."""
    fastest: dict = {}
    for r in records:
        if r["status"] != "ok":
            continue
        key = f"{r['model']}/M={r['num_clients']}"
        if key not in fastest or r["client_steps_per_s"] > fastest[key]["client_steps_per_s"]:
            fastest[key] = {
                k: r[k]
                for k in (
                    "backend",
                    "devices",
                    "processes",
                    "runs",
                    "steady_round_s",
                    "client_steps_per_s",
                )
            }
    return fastest


def runs_axis_gains(records: Sequence[dict]) -> list[dict]:
    """The runs axis' gain: each ok row of R > 1 runs against the ok one-run row of the same
    (model, M, requested backend, device setting, processes).

    gain = client-steps/s of the R runs together (counting every run's steps) / client-steps/s
    of one run: R runs trained together take gain times less time than one at a time. One
    dict per such pair, with both rows' steady s/round and compile seconds (the runs axis
    compiles its own program; compile time is apart from client-steps/s, which come from
    the steady rounds).
    """
    def key(r):
        return (
            r["model"],
            r["num_clients"],
            r.get("backend_requested", r["backend"]),
            r.get("devices_setting"),
            r["processes"],
        )

    solo = {key(r): r for r in records if r["status"] == "ok" and r["runs"] == 1}
    out = []
    for r in records:
        one = solo.get(key(r))
        if r["status"] != "ok" or r["runs"] == 1 or one is None:
            continue
        out.append(
            {
                "model": r["model"],
                "num_clients": r["num_clients"],
                "backend": r["backend"],
                "devices": r.get("devices"),
                "processes": r["processes"],
                "runs": r["runs"],
                "client_steps_per_s": r["client_steps_per_s"],
                "one_run_client_steps_per_s": one["client_steps_per_s"],
                "gain": r["client_steps_per_s"] / one["client_steps_per_s"],
                # The same from each case's fastest timed round: a long R-run round and a
                # short one-run round see a shared machine's load differently; the fastest
                # of each is the least disturbed.
                "gain_fastest_rounds": _fastest_rounds_gain(r, one),
                "steady_round_s": r["steady_round_s"],
                "one_run_steady_round_s": one["steady_round_s"],
                "compile_s": r.get("compile_s"),
                "one_run_compile_s": one.get("compile_s"),
            }
        )
    return out


def _fastest_rounds_gain(row: dict, one: dict) -> float | None:
    """`row`'s client-steps/s over `one`'s, both from their fastest timed rounds."""
    if not row.get("min_round_s") or not one.get("min_round_s"):
        return None
    return (row["runs"] * one["min_round_s"]) / (one["runs"] * row["min_round_s"])


def runs_axis_table(gains: Sequence[dict]) -> str:
    """`runs_axis_gains` as a Markdown table."""
    lines = [
        "| model | M | backend | devices | procs | runs | client-steps/s, 1 run | "
        "client-steps/s, R runs | runs-axis gain | gain, fastest rounds | s/round, 1 run | "
        "s/round, R runs | compile (s), 1 run | compile (s), R runs |",
        "|" + "---|" * 14,
    ]
    for g in gains:
        fastest = g.get("gain_fastest_rounds")
        lines.append(
            f"| {g['model']} | {g['num_clients']} | {g['backend']} | {g['devices']} | "
            f"{g['processes']} | {g['runs']} | {_fmt(g['one_run_client_steps_per_s'])} | "
            f"{_fmt(g['client_steps_per_s'])} | {g['gain']:.2f}x | "
            f"{'-' if fastest is None else f'{fastest:.2f}x'} | "
            f"{_fmt(g['one_run_steady_round_s'])} | {_fmt(g['steady_round_s'])} | "
            f"{_fmt(g['one_run_compile_s'])} | {_fmt(g['compile_s'])} |"
        )
    return "\n".join(lines)


def _fmt(x, digits=3):
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


def markdown_table(records: Sequence[dict]) -> str:
    """The rows as a Markdown table ('vs loop' = speedup_vs_baseline)."""
    header = (
        "| model | M | backend | devices | procs | runs | compile+1st round (s) | "
        "of which compile (s) | steady s/round | client-steps/s | vs loop | of ceiling | "
        "peak RSS (MiB) | load 1m | others' CPU (cores) |"
    )
    lines = [header, "|" + "---|" * 15]
    for r in records:
        name = r["backend"] + (" (default)" if r.get("is_default") else "")
        devices = r.get("devices") or r.get("devices_setting")
        head = (
            f"| {r['model']} | {r['num_clients']} | {name} | {devices} | "
            f"{r['processes']} | {r['runs']} |"
        )
        if r["status"] == "skipped":
            lines.append(
                f"{head} skipped (est. {_fmt(r['predicted_case_s'])}s, "
                f"~{_fmt(r['predicted_round_s'])}s/round) | | | | | | | | |"
            )
            continue
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']}: {r.get('error', '')[:60]} | | | | | | | | |")
            continue
        ratio = r.get("speedup_vs_baseline")
        of_ceiling = r.get("fraction_of_ceiling")
        load = r.get("load_average_at_start") or [None]
        lines.append(
            f"{head} {_fmt(r['compile_plus_first_round_s'])} | {_fmt(r['compile_s'])} | "
            f"{_fmt(r['steady_round_s'])} | {_fmt(r['client_steps_per_s'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'-' if of_ceiling is None else f'{of_ceiling:.2f}'} | {_fmt(r['peak_rss_mib'])} | "
            f"{_fmt(load[0])} | {_fmt(r.get('foreign_cpu_cores'), 2)} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Measurement helpers (used inside the children)


class CompileTimer:
    """Trace + lowering + XLA compile seconds, and XLA compilations, from now until `close()`.

    The engine's `CompilationCounter` (public `jax.monitoring` events) tracking
    everything this thread runs; a context manager, or call `close()` to stop.
    """

    def __init__(self):
        from fedjax_pals.engine.compilation import CompilationCounter

        self._counter = CompilationCounter()
        self._tracking = self._counter.track()
        self._tracking.__enter__()

    @property
    def seconds(self) -> float:
        return self._counter.compile_seconds

    @property
    def count(self) -> int:
        return self._counter.compilations

    def snapshot(self) -> tuple[float, int]:
        return self.seconds, self.count

    def close(self) -> None:
        if self._tracking is not None:
            self._tracking.__exit__(None, None, None)
            self._tracking = None

    def __enter__(self) -> "CompileTimer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _machine_busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    values = [int(v) for v in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ----------------------------------------------------------------------------
# Problem setup


def model_input_shape(name: str) -> tuple[int, ...]:
    """The (H, W, C) inputs of model `name` (logistic regression: flattened in the data)."""
    if name not in _MODEL_SHAPES:
        raise ValueError(f"unknown model {name!r}; choose among {ALL_MODELS}.")
    return tuple(_MODEL_SHAPES[name][0])


def model_num_classes(name: str) -> int:
    """The classes of model `name`'s synthetic task."""
    if name not in _MODEL_SHAPES:
        raise ValueError(f"unknown model {name!r}; choose among {ALL_MODELS}.")
    return _MODEL_SHAPES[name][1]


def _conv_dense_cnn_module(num_classes: int):
    import flax.linen as nn

    class ConvDenseCNN(nn.Module):
        """conv3x3-32, relu, conv3x3-64, relu, maxpool 2x2, flatten, dense 128, relu, dense K;
        VALID padding. No dropout (see `conv_dense_cnn`)."""

        num_classes: int

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(32, (3, 3), padding="VALID")(x))
            x = nn.relu(nn.Conv(64, (3, 3), padding="VALID")(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.relu(nn.Dense(128)(x))
            return nn.Dense(self.num_classes)(x)

    return ConvDenseCNN(num_classes)


_CONV_DENSE_CNNS: dict = {}


def conv_dense_cnn(name: str, input_shape: Sequence[int], num_classes: int) -> "fjp.Model":
    """The two-convolution CNN that FedJAX and pfl-research benchmark with (one network).

    * FedJAX's EMNIST CNN, `fedjax.models.emnist.create_conv_model` (google/fedjax,
      fedjax/models/emnist.py, `ConvDropoutModule`; "matches the model used in" Reddi et al.,
      Adaptive Federated Optimization, arXiv:2003.00295): haiku Conv2D 32 3x3 VALID, relu,
      Conv2D 64 3x3 VALID, relu, MaxPool 2x2 stride 2, dropout 0.25, flatten, Linear 128,
      relu, dropout 0.5, Linear 62 (28x28x1 inputs).
    * pfl-research's `simple_cnn` (apple/pfl-research, benchmarks/model/pytorch/cnn.py and
      benchmarks/model/tf2/cnn.py: "A simple CNN with 2 convolutional layers and one dense
      hidden layer"), the `model_name: simple_cnn` of its CIFAR-10 benchmark
      (benchmarks/image_classification/configs/baseline.yaml): the same layers, on 32x32x3
      inputs with 10 outputs (flatten 14 x 14 x 64 = 12,544 -> 128).

    Built with flax through `fjp.model_from_flax(..., convolutional=True)` (so the engine's
    CPU default trains clients one at a time, as for LeNet). **Without dropout**: the
    library's `Model.apply(params, x)` takes no rng, so the engine cannot draw dropout
    masks; at train time dropout is two elementwise masks, small against the two
    convolutions' FLOPs, so the step's cost is that of the references' up to them. The
    initialisation is flax's (the references use haiku's / Glorot uniform): irrelevant to
    throughput. Cached: equal arguments give the same Model (the engine's compile cache is
    keyed on it).
    """
    key = (name, tuple(int(d) for d in input_shape), int(num_classes))
    if key not in _CONV_DENSE_CNNS:
        _CONV_DENSE_CNNS[key] = fjp.model_from_flax(
            name, _conv_dense_cnn_module(key[2]), key[1], key[2], convolutional=True
        )
    return _CONV_DENSE_CNNS[key]


def make_model(name: str, input_shape: Sequence[int] | None = None) -> "fjp.Model":
    """The benchmark's model `name` on (H, W, C) inputs (its own, `model_input_shape`, by
    default): LeNet, logistic regression on the inputs flattened (10 classes), or a
    workload's CNN (`conv_dense_cnn`; FedJAX's EMNIST CNN with 62 classes, pfl-research's
    CIFAR-10 CNN with 10)."""
    if name not in _MODEL_SHAPES:
        raise ValueError(f"unknown model {name!r}; choose among {ALL_MODELS}.")
    shape = model_input_shape(name) if input_shape is None else tuple(input_shape)
    if name == "lenet":
        return fjp.lenet(shape, NUM_CLASSES)
    if name == "logistic_regression":
        return fjp.logistic_regression((int(np.prod(shape)),), NUM_CLASSES)
    return conv_dense_cnn(name, shape, model_num_classes(name))


def synthetic_data(
    model_name: str,
    num_clients: int,
    examples_per_client: int,
    seed: int,
    input_shape: Sequence[int] | None = None,
) -> "fjp.engine.DeviceData":
    """Uniform [0, 1) inputs of the model's shape and random labels of its classes; client i
    owns rows [i n, (i + 1) n)."""
    shape = model_input_shape(model_name) if input_shape is None else tuple(input_shape)
    num_classes = model_num_classes(model_name)
    rng = np.random.default_rng(seed)
    n = examples_per_client
    total = num_clients * n
    x = rng.random((total, *shape), dtype=np.float32)
    y = rng.integers(0, num_classes, total).astype(np.int32)
    indices = np.arange(total, dtype=np.int32).reshape(num_clients, n)
    sizes = np.full((num_clients,), n, np.int32)
    label_dists = np.stack([np.bincount(y[row], minlength=num_classes) / n for row in indices])
    if model_name == "logistic_regression":
        x = x.reshape(total, -1)
    return fjp.engine.device_data(x, y, indices, sizes, label_dists.astype(np.float32))


# ----------------------------------------------------------------------------
# Published workloads: the field's benchmark rounds, on synthetic tensors of their shapes


@dataclasses.dataclass(frozen=True)
class Workload:
    """A published federated benchmark's round: model, clients per round and local steps.

    The data stay synthetic (uniform inputs, random labels: throughput does not depend on
    the values); `model` fixes the input shape and the classes.
    """

    name: str
    model: str
    num_clients: int
    examples_per_client: int
    batch_size: int
    local_epochs: int
    description: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        return model_input_shape(self.model)

    @property
    def num_classes(self) -> int:
        return model_num_classes(self.model)

    @property
    def steps_per_client(self) -> int:
        return self.local_epochs * -(-self.examples_per_client // self.batch_size)

    def settings_fields(self) -> dict:
        """The `BenchmarkSettings` fields the workload sets (check_clients = its M: parity
        of every case's first round at the workload's own M)."""
        return {
            "examples_per_client": self.examples_per_client,
            "batch_size": self.batch_size,
            "local_epochs": self.local_epochs,
            "check_clients": self.num_clients,
        }


WORKLOADS = {
    "fedjax_emnist": Workload(
        name="fedjax_emnist",
        model="fedjax_emnist_cnn",
        num_clients=10,
        examples_per_client=200,
        batch_size=10,
        local_epochs=1,
        description=(
            "FedJAX's federated EMNIST-62 FedAvg (google/fedjax examples/emnist_fed_avg.py: "
            "create_conv_model, 10 clients a round, 1 epoch): 28x28x1, 62 classes, 200 "
            "examples per client (EMNIST-62's mean: 671,585 examples / 3,400 writers), batch "
            "10 -> 20 steps (FedJAX's example batches by 20: --batch_size=20 for its 10)"
        ),
    ),
    "pfl_cifar10": Workload(
        name="pfl_cifar10",
        model="pfl_cifar10_cnn",
        num_clients=50,
        examples_per_client=50,
        batch_size=10,
        local_epochs=1,
        description=(
            "pfl-research's CIFAR-10 benchmark (apple/pfl-research "
            "benchmarks/image_classification/configs/baseline.yaml: simple_cnn, cohort_size "
            "50, mean_datapoints_per_user 50 constant, local_batch_size 10, local_num_epochs "
            "1): 32x32x3, 10 classes, 50 examples per client, batch 10 -> 5 steps"
        ),
    ),
}
"""`--workload` presets of experiments/benchmarks/round.py."""


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose among {tuple(WORKLOADS)}.")
    return WORKLOADS[name]


def resolve_workload(name: str | None, given: Mapping[str, tuple[Any, bool]]) -> dict:
    """The command line's models, M and settings fields under workload `name`.

    `given` maps each flag a workload sets (models, num_clients, examples_per_client,
    batch_size, local_epochs, check_clients) to (its value, whether the command line gave
    it). Without a workload: the values. With one: its model (--models given too is an
    error: the model fixes the input shape and classes) and, for every other flag not
    given, the workload's value; a flag given wins.
    """
    out = {key: value for key, (value, _) in given.items()}
    if name is None:
        return out
    workload = get_workload(name)
    if given["models"][1]:
        raise ValueError(f"--workload={name} sets the model ({workload.model}); drop --models.")
    out["models"] = [workload.model]
    defaults = {"num_clients": [workload.num_clients], **workload.settings_fields()}
    for key, value in defaults.items():
        if not given[key][1]:
            out[key] = value
    return out


def local_training(settings: BenchmarkSettings) -> "fjp.LocalTraining":
    return fjp.LocalTraining(
        local_epochs=settings.local_epochs,
        batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
    )


# ----------------------------------------------------------------------------
# The baseline: a Python loop over clients of a jitted single-client SGD step


class BaselineLoop:
    """FedAvg round as a plain loop of per-client jitted SGD steps.

    x_{t+1} = x_t + sum_i (n_i / sum_j n_j) (x_i - x_t), where x_i is client i after
    its local steps of SGD from x_t. Uses the engine's data order
    (`fjp.engine.client_schedule`, client key fold_in(round_key, client_id)) so that its
    result can be checked against the engine's; the schedule is computed once per
    round for all clients. Requires full batches (examples_per_client %
    batch_size == 0).
    """

    def __init__(self, model: "fjp.Model", training: "fjp.LocalTraining"):
        import jax
        import jax.numpy as jnp
        import optax

        self.model = model
        self.training = training
        optimizer = optax.sgd(training.learning_rate, momentum=training.momentum)
        self.optimizer = optimizer

        def loss_fn(params, x, y):
            logits = model.apply(params, x)
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

        def step(params, opt_state, train_x, train_y, batches, client, s):
            idx = batches[client, s]  # (B,) rows into the split
            x, y = train_x[idx], train_y[idx]
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        def schedule(client_indices, client_sizes, participants, key):
            max_examples = client_indices.shape[1]

            def one(c):
                positions, mask = fjp.engine.client_schedule(
                    jax.random.fold_in(key, c), client_sizes[c], max_examples, training
                )
                return client_indices[c][positions], mask

            return jax.vmap(one)(participants)  # (m, S, B) rows, (m, S, B) mask

        def accumulate(acc, params, global_params, weight):
            return jax.tree_util.tree_map(
                lambda a, p, g: a + weight * (p - g), acc, params, global_params
            )

        def weights(client_sizes, participants):
            sizes = client_sizes[participants].astype(jnp.float32)
            return sizes / jnp.sum(sizes)

        self._jnp = jnp
        self._step = jax.jit(step)
        self._schedule = jax.jit(schedule)
        self._accumulate = jax.jit(accumulate)
        self._weights = jax.jit(weights)
        self._zeros = jax.jit(lambda p: jax.tree_util.tree_map(jnp.zeros_like, p))
        self._apply = jax.jit(lambda g, acc: jax.tree_util.tree_map(jnp.add, g, acc))

    def run_round(self, data: "fjp.engine.DeviceData", params, participants, key):
        """One FedAvg round from `params` over `participants`; returns the new params."""
        jnp = self._jnp
        participants = jnp.asarray(participants, jnp.int32)
        batches, mask = self._schedule(data.client_indices, data.client_sizes, participants, key)
        if not bool(jnp.all(mask)):
            raise ValueError(
                "the baseline needs full batches: examples_per_client must be a "
                "multiple of batch_size."
            )
        num_steps = batches.shape[1]
        weights = self._weights(data.client_sizes, participants)
        acc = self._zeros(params)
        for j in range(int(participants.shape[0])):
            local, opt_state = params, self.optimizer.init(params)
            for s in range(num_steps):
                local, opt_state, _ = self._step(
                    local, opt_state, data.train_x, data.train_y, batches, np.int32(j), np.int32(s)
                )
            acc = self._accumulate(acc, local, params, weights[j])
        return self._apply(params, acc)

    def local_update(self, data: "fjp.engine.DeviceData", params, client: int, key):
        """Client `client`'s params after its local steps from `params` (the loop's inner part,
        with the same jitted step and data order; for other frameworks' clients)."""
        jnp = self._jnp
        batches, mask = self._schedule(
            data.client_indices, data.client_sizes, jnp.asarray([client], jnp.int32), key
        )
        if not bool(jnp.all(mask)):
            raise ValueError(
                "the baseline needs full batches: examples_per_client must be a "
                "multiple of batch_size."
            )
        local, opt_state = params, self.optimizer.init(params)
        for s in range(batches.shape[1]):
            local, opt_state, _ = self._step(
                local, opt_state, data.train_x, data.train_y, batches, np.int32(0), np.int32(s)
            )
        return local


class CeilingLoop:
    """The machine's ceiling for the step: the baseline's jitted step and nothing else.

    Each local device holds its own copy of the data and of every client's batch indices
    (one data order, drawn once) before any round; a round deals its participants
    round-robin to the devices and dispatches their steps alternately to the devices from
    one thread, one step per call, the step's outputs fed straight back. No schedule, no
    aggregation, no result buffers: what the cores give for this step, whatever drives them.
    """

    def __init__(self, model: "fjp.Model", training: "fjp.LocalTraining", data, key):
        import jax

        self._loop = loop = BaselineLoop(model, training)
        everyone = jax.numpy.arange(data.client_indices.shape[0], dtype=jax.numpy.int32)
        batches, _ = loop._schedule(data.client_indices, data.client_sizes, everyone, key)
        self._devices = jax.local_devices()
        self._placed = jax.block_until_ready(
            [jax.device_put((data.train_x, data.train_y, batches), d) for d in self._devices]
        )

    def run_round(self, params, participants):
        """Every participant's local steps from `params`; returns `params` unchanged."""
        import jax

        loop, devices = self._loop, self._devices
        starts = [jax.device_put(params, d) for d in devices]
        num_steps = self._placed[0][2].shape[1]
        lanes = [
            [(c, s) for c in participants[i :: len(devices)] for s in range(num_steps)]
            for i in range(len(devices))
        ]
        carries = [None] * len(devices)
        for t in range(max(len(lane) for lane in lanes)):
            for i, lane in enumerate(lanes):
                if t >= len(lane):
                    continue
                c, s = lane[t]
                if s == 0:
                    carries[i] = (starts[i], loop.optimizer.init(starts[i]))
                x, y, batches = self._placed[i]
                local, opt_state, _ = loop._step(
                    *carries[i], x, y, batches, np.int32(c), np.int32(s)
                )
                carries[i] = (local, opt_state)
        jax.block_until_ready([c for c in carries if c is not None])
        return params


# ----------------------------------------------------------------------------
# The engine side


def _backend_name(engine) -> str:
    backend = getattr(engine, "backend", None) or getattr(engine, "strategy", None)
    return str(getattr(backend, "name", backend))


def make_engine(
    algorithm: "fjp.FederatedAlgorithm",
    model: "fjp.Model",
    training: "fjp.LocalTraining",
    backend: str,
    chunk_size: int,
) -> "fjp.engine.RoundEngine":
    """A fresh `fjp.engine.RoundEngine` (so its first round is a cold compile)."""
    params = inspect.signature(fjp.engine.RoundEngine).parameters
    kwargs: dict[str, Any] = {"backend" if "backend" in params else "strategy": backend}
    if "chunk_size" in params:
        kwargs["chunk_size"] = chunk_size
    return fjp.engine.RoundEngine(algorithm, model, training, **kwargs)


class _Unsupported(Exception):
    pass


class CaseRunner:
    """One case's round, state and measurements inside a (child) process.

    `round(r)` runs round r (r = 0 is the first, cold-compile round) and returns its
    measurements; `first_params` are the (first run's) params after round 0.
    """

    def __init__(
        self,
        case: BenchmarkCase,
        model: "fjp.Model",
        data: "fjp.engine.DeviceData",
        settings: BenchmarkSettings,
        timer: CompileTimer,
    ):
        import jax
        import jax.numpy as jnp

        self.case, self.timer = case, timer
        self._jax = jax
        training = local_training(settings)
        algorithm = fjp.fedavg()

        def participants(r):
            return round_participants(case.num_clients, settings, r)

        base_key = jax.random.PRNGKey(settings.seed + 1)
        params0 = model.init(jax.random.PRNGKey(settings.seed))
        self.resolved_backend = case.backend
        if case.is_ceiling:
            ceiling = CeilingLoop(model, training, data, base_key)
            self.state = params0
            self._round = lambda state, r: ceiling.run_round(state, participants(r))
            self._first_params = None  # no round: nothing to compare
            return
        if case.is_baseline:
            if settings.examples_per_client % settings.batch_size:
                raise ValueError(
                    "the baseline loop needs full batches: examples_per_client "
                    f"({settings.examples_per_client}) must be a multiple of batch_size "
                    f"({settings.batch_size})."
                )
            runner = BaselineLoop(model, training)
            self.state = params0
            self._round = lambda state, r: runner.run_round(
                data, state, participants(r), jax.random.fold_in(base_key, r)
            )
            self._first_params = lambda state: state
            return
        engine = make_engine(algorithm, model, training, case.backend, settings.chunk_size)
        self.resolved_backend = _backend_name(engine)
        if case.runs == 1:
            self.state = fjp.init_server_state(algorithm, params0, case.num_clients)
            self._round = lambda state, r: engine.run_round(
                data, state, participants(r), jax.random.fold_in(base_key, r)
            )[0]
            self._first_params = lambda state: state.params
            return
        # The runs axis (`engine.run_rounds(data, states, (R, m) participants, (R, 2) keys)`,
        # client tables with a leading runs axis): R states stacked on a leading axis, run j
        # initialised from seed + j (run 0 is the solo run), all on the same partition, the
        # same participants and the same data order.
        run_rounds = getattr(engine, "run_rounds", None)
        if run_rounds is None:
            raise _Unsupported("this engine has no run_rounds (runs axis)")
        runs = case.runs

        def stack(x):
            return jnp.stack([x] * runs)

        states = [
            fjp.init_server_state(
                algorithm, model.init(jax.random.PRNGKey(settings.seed + j)), case.num_clients
            )
            for j in range(runs)
        ]
        self.state = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states)
        runs_data = data._replace(
            client_indices=stack(data.client_indices),
            client_sizes=stack(data.client_sizes),
            client_label_dists=stack(data.client_label_dists),
        )
        self._round = lambda state, r: run_rounds(
            runs_data,
            state,
            np.tile(participants(r), (runs, 1)),
            stack(jax.random.fold_in(base_key, r)),
        )[0]
        self._first_params = lambda state: jax.tree_util.tree_map(lambda x: x[0], state.params)

    def round(self, r: int) -> dict:
        """Runs round r, timed to `block_until_ready`; returns its measurements."""
        jax = self._jax
        gc.collect()
        load = _load()
        rss_at_start = memory.rss_mib()
        rss_reset = memory.reset_peak_rss()
        c0, n0 = self.timer.snapshot()
        busy0, own0 = _machine_busy_cpu_s(), _own_cpu_s()
        start = time.perf_counter()
        self.state = jax.block_until_ready(self._round(self.state, r))
        wall = time.perf_counter() - start
        busy1, own1 = _machine_busy_cpu_s(), _own_cpu_s()
        c1, n1 = self.timer.snapshot()
        if r == 0 and self._first_params is not None:
            self.first_params = jax.device_get(self._first_params(self.state))
        return {
            "wall_s": wall,
            "compile_s": c1 - c0,
            "compiles": n1 - n0,
            "cpu_s": own1 - own0,
            "machine_busy_cpu_s": None if busy0 is None else busy1 - busy0,
            "peak_rss_mib": memory.peak_rss_mib(),
            "rss_reset": rss_reset,
            "rss_at_start_mib": rss_at_start,
            "device_peak_bytes_in_use": _device_peak_bytes(),
            "load_average": load,
        }


def _device_peak_bytes() -> int | None:
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if not stats:
        return None
    return stats.get("peak_bytes_in_use")


# ----------------------------------------------------------------------------
# Child processes: configuration, worker loop, parent-side handle


def configure_process(
    devices: str | int,
    num_processes: int = 1,
    process_id: int = 0,
    coordinator_address: str | None = None,
) -> None:
    """Applies a case's device settings; must run before any JAX computation.

    'default' leaves JAX untouched; otherwise `fjp.configure_runtime(cpu_devices=devices,
    ...)` ('auto': one host device per available core, the cores divided among the
    local processes) or, in a package without it, the same through
    `jax_num_cpu_devices` and, for several processes, gloo collectives +
    `jax.distributed.initialize`.
    """
    import jax

    devices = parse_devices(devices)
    if devices == DEFAULT_DEVICES:
        if num_processes != 1:
            raise ValueError(f"devices={DEFAULT_DEVICES!r} needs num_processes=1.")
        return
    configure = getattr(fjp, "configure_runtime", None)
    if configure is not None:
        kwargs: dict[str, Any] = {"cpu_devices": devices}
        if num_processes > 1:
            kwargs.update(
                coordinator_address=coordinator_address,
                num_processes=num_processes,
                process_id=process_id,
            )
        configure(**kwargs)
        return
    if devices == AUTO_DEVICES:  # one per core, the cores shared among the local processes
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        devices = max(1, (cores or 1) // num_processes)
    jax.config.update("jax_num_cpu_devices", devices)
    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


class Worker:
    """The child's side: one (model, M) problem and the cases of one device config.

    Commands (dicts) and replies (dicts):
      {"cmd": "add", "case": {...}} -> {"resolved_backend", "is_default"} (builds a runner)
      {"cmd": "round", "case": name, "r": r} -> the round's measurements
      {"cmd": "params", "case": name, "path": p} -> {} (saves the first-round params, .npz)
      {"cmd": "drop", "case": name} -> {} (frees the runner)
      {"cmd": "exit"} -> {}
    An exception in a command is replied as {"error": message}.
    """

    def __init__(self, model_name: str, num_clients: int, settings: BenchmarkSettings):
        import jax

        self.settings = settings
        self.timer = CompileTimer()
        self.model = make_model(model_name)
        self.data = synthetic_data(
            model_name, num_clients, settings.examples_per_client, settings.seed
        )
        self.runners: dict[str, CaseRunner] = {}
        default = make_engine(
            fjp.fedavg(), self.model, local_training(settings), "auto", settings.chunk_size
        )
        self.default_backend = _backend_name(default)
        del default
        self.info = {
            "devices": jax.device_count(),
            "local_devices": jax.local_device_count(),
            "process_count": jax.process_count(),
            "platform": jax.default_backend(),
            "device_kind": jax.devices()[0].device_kind,
            "default_backend": self.default_backend,
        }

    def handle(self, command: Mapping[str, Any]) -> dict:
        cmd = command["cmd"]
        if cmd == "add":
            case = BenchmarkCase(**command["case"])
            runner = CaseRunner(case, self.model, self.data, self.settings, self.timer)
            self.runners[case.name] = runner
            return {
                "resolved_backend": runner.resolved_backend,
                "is_default": (
                    not case.is_baseline
                    and not case.is_ceiling
                    and case.devices == AUTO_DEVICES
                    and case.processes == 1
                    and case.runs == 1
                    and runner.resolved_backend == self.default_backend
                ),
            }
        if cmd == "round":
            return self.runners[command["case"]].round(int(command["r"]))
        if cmd == "params":
            import jax

            leaves = jax.tree_util.tree_leaves(self.runners[command["case"]].first_params)
            np.savez(command["path"], *[np.asarray(x) for x in leaves])
            return {}
        if cmd == "drop":
            self.runners.pop(command["case"], None)
            gc.collect()
            return {}
        if cmd == "exit":
            return {}
        raise ValueError(f"unknown command {cmd!r}.")


def worker_main() -> None:
    """Entry point of a child: reads JSON commands on stdin, answers on stdout.

    The first line configures the process and builds the problem:
    {"devices", "num_processes", "process_id", "coordinator_address", "model",
    "num_clients", "settings"}. Anything else printed goes to stderr.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (warnings, logs) must not corrupt the protocol

    def reply(obj) -> None:
        proto.write(_PROTOCOL_PREFIX + json.dumps(_jsonable(obj)) + "\n")
        proto.flush()

    try:
        setup = json.loads(sys.stdin.readline())
        configure_process(
            setup["devices"],
            setup.get("num_processes", 1),
            setup.get("process_id", 0),
            setup.get("coordinator_address"),
        )
        worker = Worker(
            setup["model"], setup["num_clients"], BenchmarkSettings(**setup["settings"])
        )
        reply(worker.info)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        reply({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            out = worker.handle(command)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        reply(out)
        if command.get("cmd") == "exit":
            break


class ChildError(RuntimeError):
    """A child process died, timed out or could not start."""


def _child_env(local_processes: int = 1) -> dict[str, str]:
    """The environment of a child: this one, minus device-count and launcher settings, with
    the package this process imported first on PYTHONPATH (so both run the same code)."""
    env = dict(os.environ)
    for var in list(env):
        if var in _DEVICE_ENV_VARS or var.startswith("FEDJAX_PALS_"):
            del env[var]
    # Read by configure_runtime(cpu_devices="auto") to share the cores among the processes.
    env["FEDJAX_PALS_LOCAL_PROCESSES"] = str(local_processes)
    env[_PARENT_ENV_VAR] = str(os.getpid())  # the worker dies with this process
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_XLA_DEVICE_FLAG)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(fjp.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


class _Child:
    """A worker process and a thread reading its replies."""

    def __init__(self, setup: dict, log_path: str, timeout_s: float, local_processes: int = 1):
        self.log_path = log_path
        self.timeout_s = timeout_s
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=_child_env(local_processes),
            text=True,
            bufsize=1,
        )
        self._replies: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send(setup)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(_PROTOCOL_PREFIX):
                self._replies.put(json.loads(line[len(_PROTOCOL_PREFIX) :]))
        self._replies.put(None)  # end of stream

    def send(self, obj: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ChildError(f"child exited early ({e}); log tail:\n{self.log_tail()}") from None

    def recv(self) -> dict:
        try:
            out = self._replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self.kill()
            raise ChildError(
                f"child answered nothing for {self.timeout_s:.0f}s; log tail:\n{self.log_tail()}"
            ) from None
        if out is None:
            self.proc.wait()
            raise ChildError(
                f"child exited (rc {self.proc.returncode}); log tail:\n{self.log_tail()}"
            )
        return out

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        try:
            with open(self.log_path) as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def request_exit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "exit"})
            except ChildError:
                pass

    def close(self) -> None:
        """Waits for the child to exit (after `request_exit`), killing it after 60 s."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildGroup:
    """The processes of one device configuration for one (model, M).

    Every command goes to all of them at once and every reply is collected; a
    reply with an "error" raises `CaseError` (the children stay usable).
    """

    def __init__(
        self,
        devices: str | int,
        processes: int,
        model: str,
        num_clients: int,
        settings: BenchmarkSettings,
        workdir: str,
    ):
        self.devices, self.processes = devices, processes
        address = f"127.0.0.1:{_free_port()}" if processes > 1 else None
        self.children: list[_Child] = []
        try:
            for i in range(processes):
                setup = {
                    "devices": devices,
                    "num_processes": processes,
                    "process_id": i,
                    "coordinator_address": address,
                    "model": model,
                    "num_clients": num_clients,
                    "settings": dataclasses.asdict(settings),
                }
                log = os.path.join(
                    workdir, f"child-{model}-M{num_clients}-d{devices}-p{processes}-{i}.log"
                )
                self.children.append(_Child(setup, log, settings.round_timeout_s, processes))
            self.info = self.ask_all(None)[0]
        except Exception:
            self.close()
            raise
        except BaseException:  # Ctrl-C, SIGTERM: stop now, do not wait for the children
            self.kill()
            raise

    def ask_all(self, command: dict | None) -> list[dict]:
        if command is not None:
            for c in self.children:
                c.send(command)
        replies = [c.recv() for c in self.children]
        errors = [r for r in replies if "error" in r]
        if errors:
            raise CaseError(errors[0]["error"], errors[0].get("traceback", ""))
        return replies

    def close(self) -> None:
        # Every process first: under jax.distributed each one's exit waits for the others'.
        for c in self.children:
            c.request_exit()
        for c in self.children:
            c.close()

    def kill(self) -> None:
        """Kills every process at once (the benchmark is being stopped)."""
        for c in self.children:
            c.kill()
        for c in self.children:
            c.close()


class CaseError(RuntimeError):
    """A command failed inside a child (the case is reported with status 'error')."""

    def __init__(self, message: str, child_traceback: str = ""):
        super().__init__(message)
        self.child_traceback = child_traceback


# ----------------------------------------------------------------------------
# The parent: run every case


def _max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((float(np.max(np.abs(x - y))) for x, y in zip(a, b)), default=0.0)


def _load_params(path: str) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def _status_row(case: BenchmarkCase, status: str, settings: BenchmarkSettings, **extra) -> dict:
    row = {
        "model": case.model,
        "num_clients": case.num_clients,
        "backend": case.backend,
        "strategy": case.backend,
        "backend_requested": case.backend,
        "devices_setting": case.devices,
        "devices": None,
        "local_devices": None,
        "processes": case.processes,
        "runs": case.runs,
        "status": status,
        "is_default": False,
        "clients_per_round": settings.clients_per_round(case.num_clients),
        "client_steps_per_round": case.runs
        * settings.clients_per_round(case.num_clients)
        * settings.steps_per_client,
        "load_average_at_start": _load(),
    }
    row.update(extra)
    return row


@dataclasses.dataclass(eq=False)  # compared by identity
class _Active:
    case: BenchmarkCase
    group: ChildGroup
    info: dict
    first: list
    target: int
    predicted_round_s: float | None
    rounds: list = dataclasses.field(default_factory=list)


def budget_seconds(cases: Sequence[BenchmarkCase], settings: BenchmarkSettings) -> float:
    """The measuring time of a benchmark of `cases`, at most about: each case's budget
    (`max_seconds_per_case`: a case predicted to take longer is skipped, and a case's timed
    rounds stop within it) times the cases. Not counted: starting the worker processes of
    each of the `process_groups` (seconds each: Python, JAX, the data), and a case measured
    first at its size (no smaller M to predict it from) may take longer than its budget."""
    return len(cases) * settings.max_seconds_per_case


def process_groups(cases: Sequence[BenchmarkCase]) -> int:
    """How many sets of worker processes the cases start: one per (model, M, devices,
    processes)."""
    return len({(c.model, c.num_clients, c.device_config) for c in cases})


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class _Progress:
    """A `case k/N started` line as each case starts its warm-up; after each finished case,
    the partial result, and once the cases of a problem (one model and M, whose timed rounds
    are interleaved, so that they finish together) have all finished, a `finished k/N` line
    with the time left at the pace so far."""

    def __init__(self, total: int, log: Callable[[str], None], on_case_done: Callable[[], None]):
        self.total, self.log, self.on_case_done = total, log, on_case_done
        self.started = time.perf_counter()
        self.begun = 0
        self.done = 0

    def begin(self, case: BenchmarkCase) -> None:
        self.begun += 1
        self.log(f"case {self.begun}/{self.total} started: {case.name}")

    def finished(self) -> None:
        self.done += 1
        self.on_case_done()

    def report(self) -> None:
        """The `finished k/N` line: what is done, what remains, and the time left."""
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done
        timing = f"{format_duration(elapsed)} elapsed"
        if left:  # the finished cases' mean pace
            timing += f", about {format_duration(elapsed / self.done * left)} left"
        self.log(f"finished {self.done}/{self.total} cases, {left} to go ({timing})")


def run_benchmark(
    cases: Sequence[BenchmarkCase],
    settings: BenchmarkSettings = BenchmarkSettings(),
    *,
    log: Callable[[str], None] = print,
    on_update: Callable[[dict], None] | None = None,
) -> dict:
    """Measures every case in child processes; returns the benchmark's JSON object.

    Keys: "machine", "config", "results" (rows, see `summarize_case`; skipped and
    failed cases have status 'skipped' / 'error'), "parity" (max abs diff of
    first-round params vs the first case at `settings.check_clients`), "fastest",
    "total_seconds", "markdown_table", and "partial" (False), "cases_done", "cases_total".

    `log` gets a `case k/N started` line as each case starts and a `finished k/N` line (with
    the time left) after each problem. `on_update(result)` is called after every finished
    case with the result so far (the same keys, "partial": True, the rows of the cases done
    so far; no parity): write it, and a stopped benchmark leaves what it measured; a case
    stopped in its timed rounds is a row of the rounds it had (stopped_early: True,
    planned_timed_rounds). On KeyboardInterrupt or SystemExit (a SIGTERM turned into one) the child
    processes are killed at once; every child also dies with this process (PR_SET_PDEATHSIG:
    strictly, with the thread that calls `run_benchmark`, so call it from one that lives as
    long as the benchmark, e.g. the main thread).
    """
    wall_start = time.perf_counter()
    cases = list(cases)
    if not cases:
        raise ValueError("cases must not be empty.")
    load_start = _load()
    records: list[dict] = []
    last: dict = {}  # case key -> (M, steady s/round, compile s) at the largest measured M
    parity_params: dict = {}  # model -> {case name: params leaves}
    child_infos: dict = {}
    problems: dict = {}
    for case in cases:
        problems.setdefault((case.num_clients, case.model), []).append(case)

    def partial_result() -> None:
        if on_update is not None:
            rows = [dict(r) for r in records]
            on_update(
                _assemble(cases, settings, rows, {}, child_infos, load_start, wall_start, True)
            )

    progress = _Progress(len(cases), log, partial_result)
    with tempfile.TemporaryDirectory(prefix="fjp-bench-") as workdir:
        for (num_clients, model), group_cases in problems.items():
            _run_problem(
                model,
                num_clients,
                group_cases,
                settings,
                workdir,
                records,
                last,
                parity_params,
                child_infos,
                log,
                progress,
            )
    parity = {}
    for model, by_case in parity_params.items():
        names = list(by_case)
        ref = names[0]
        diffs = {n: _max_abs_diff(by_case[ref], by_case[n]) for n in names}
        parity[model] = {
            "num_clients": settings.check_clients,
            "reference": ref,
            "max_abs_diff": diffs,
        }
        log(
            f"# parity at M={settings.check_clients}, {model}: max abs diff of params vs {ref}: "
            + ", ".join(f"{n}={d:.2e}" for n, d in diffs.items())
        )
        if max(diffs.values()) > 1e-4:
            log(f"# WARNING: {model}: cases disagree by more than 1e-4!")
    return _assemble(cases, settings, records, parity, child_infos, load_start, wall_start, False)


def _assemble(
    cases: Sequence[BenchmarkCase],
    settings: BenchmarkSettings,
    records: list[dict],
    parity: dict,
    child_infos: Mapping[str, Any],
    load_start: list[float],
    wall_start: float,
    partial: bool,
) -> dict:
    """The benchmark's JSON object from the rows measured so far (`records`, modified)."""
    order = {c.name: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: order[r["_case"]])
    for r in records:
        del r["_case"]
    add_speedups(records)
    total = time.perf_counter() - wall_start
    case_models = list(dict.fromkeys(c.model for c in cases))
    runs_axis = runs_axis_gains(records)
    extra = {"runs_axis": runs_axis} if runs_axis else {}
    return {
        "partial": partial,
        "cases_done": len(records),
        "cases_total": len(cases),
        "machine": _machine_info(child_infos, load_start),
        "config": {
            **dataclasses.asdict(settings),
            "steps_per_client": settings.steps_per_client,
            "cases": [dataclasses.asdict(c) for c in cases],
            "algorithm": "fedavg",
            "data": "synthetic uniform [0,1) inputs, random labels",
            "input_shape": {
                "lenet": list(INPUT_SHAPE),
                "logistic_regression": [int(np.prod(INPUT_SHAPE))],
                **{m: list(model_input_shape(m)) for m in case_models if m not in MODELS},
            },
            "num_classes": (
                model_num_classes(case_models[0])
                if len({model_num_classes(m) for m in case_models}) == 1
                else {m: model_num_classes(m) for m in case_models}
            ),
        },
        "results": records,
        "parity": parity,
        "fastest": fastest_cases(records),
        "total_seconds": total,
        "markdown_table": markdown_table(records),
        **extra,
    }


def _run_problem(
    model,
    num_clients,
    cases,
    settings,
    workdir,
    records,
    last,
    parity_params,
    child_infos,
    log,
    progress=None,
):
    """The cases of one (model, M): warm-ups one at a time, then interleaved timed rounds."""
    progress = progress or _Progress(len(cases), lambda msg: None, lambda: None)

    def record(row: dict) -> None:
        records.append(row)
        progress.finished()

    runnable = []
    for case in cases:
        est_round, est_case = predict_case(last.get(_case_key(case)), num_clients)
        if est_case is not None and est_case > settings.max_seconds_per_case:
            progress.begin(case)
            log(f"{case.name}: skipped (est. {est_case:.0f}s: ~{est_round:.1f}s/round)")
            row = _status_row(
                case, "skipped", settings, predicted_round_s=est_round, predicted_case_s=est_case
            )
            row["_case"] = case.name
            record(row)
            # Chain the estimate so that larger M are skipped too.
            last[_case_key(case)] = (num_clients, est_round, last[_case_key(case)][2])
            continue
        runnable.append((case, est_round))

    groups: dict = {}
    active: list[_Active] = []
    try:
        for case, est_round in runnable:
            progress.begin(case)
            try:
                group = groups.get(case.device_config)
                if group is None:
                    group = ChildGroup(
                        case.devices, case.processes, model, num_clients, settings, workdir
                    )
                    groups[case.device_config] = group
                    child_infos[f"devices={case.devices},processes={case.processes}"] = group.info
                added, *_ = group.ask_all({"cmd": "add", "case": dataclasses.asdict(case)})
                first = group.ask_all({"cmd": "round", "case": case.name, "r": 0})
            except (CaseError, ChildError) as e:
                log(f"{case.name}: ERROR {e}")
                row = _status_row(case, "error", settings, error=str(e)[:2000])
                row["_case"] = case.name
                record(row)
                # A dead child, or processes that may now wait on each other in a collective.
                if case.device_config in groups and (
                    isinstance(e, ChildError) or case.processes > 1
                ):
                    groups.pop(case.device_config).close()
                continue
            info = {**group.info, **added}
            first_wall = max(p["wall_s"] for p in first)
            target = plan_timed_rounds(first_wall, first[0]["compile_s"], settings)
            log(
                f"{case.name}: compile+first round {first_wall:.2f}s "
                f"(compile {first[0]['compile_s']:.2f}s), {info['devices']} device(s), "
                f"load {first[0]['load_average'][0]}"
            )
            active.append(_Active(case, group, info, first, target, est_round))

        # Timed rounds, interleaved across cases and children.
        r = 1
        while any(len(a.rounds) < a.target for a in active):
            for a in list(active):
                if a not in active or len(a.rounds) >= a.target:
                    continue
                try:
                    a.rounds.append(a.group.ask_all({"cmd": "round", "case": a.case.name, "r": r}))
                except (CaseError, ChildError) as e:
                    broken = isinstance(e, ChildError) or a.case.processes > 1
                    for b in list(active):
                        if b is a or (broken and b.group is a.group):
                            log(f"{b.case.name}: ERROR {e}")
                            row = _status_row(b.case, "error", settings, error=str(e)[:2000])
                            row["_case"] = b.case.name
                            record(row)
                            active.remove(b)
                    if broken:
                        groups.pop(a.case.device_config, None)
                        a.group.close()
            r += 1

        for a in active:
            row = summarize_case(
                a.case, a.first, a.rounds, a.info, settings, predicted_round_s=a.predicted_round_s
            )
            row["_case"] = a.case.name
            records.append(row)
            last[_case_key(a.case)] = (num_clients, row["steady_round_s"], row["compile_s"])
            if num_clients == settings.check_clients and not a.case.is_ceiling:
                path = os.path.join(workdir, f"params-{len(records)}.npz")
                try:
                    a.group.children[0].send({"cmd": "params", "case": a.case.name, "path": path})
                    if "error" not in a.group.children[0].recv():
                        parity_params.setdefault(model, {})[a.case.name] = _load_params(path)
                except ChildError:
                    pass
            log(
                f"{a.case.name}: steady {row['steady_round_s']:.4f}s/round (median of "
                f"{row['timed_rounds']}), {row['client_steps_per_s']:.0f} client-steps/s, "
                f"peak RSS {row['peak_rss_mib']:.0f} MiB"
                + ("  RECOMPILED in timed rounds!" if row["recompiled_after_first_round"] else "")
            )
            progress.finished()  # after its parity params: the child is done with the case
    except BaseException as error:
        if not isinstance(error, Exception):  # Ctrl-C, SIGTERM: kill the children, not wait
            for group in groups.values():
                group.kill()
            # What the stopped cases measured is kept: each case with a timed round is a row
            # (the median of the rounds it had), marked stopped_early.
            for a in active:
                if a.rounds and not any(r.get("_case") == a.case.name for r in records):
                    row = summarize_case(
                        a.case, a.first, a.rounds, a.info, settings,
                        predicted_round_s=a.predicted_round_s,
                    )
                    row.update(_case=a.case.name, stopped_early=True, planned_timed_rounds=a.target)
                    record(row)
        raise
    finally:
        for group in groups.values():
            group.close()
    progress.report()


def _machine_info(child_infos: Mapping[str, Any], load_start: list[float]) -> dict:
    import jax
    import optax

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        jaxlib_version = None
    baseline = child_infos.get(f"devices={DEFAULT_DEVICES},processes=1") or next(
        iter(child_infos.values()), {}
    )
    return {
        "platform_name": baseline.get("platform"),
        "device_kind": baseline.get("device_kind"),
        "children": dict(child_infos),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "optax_version": optax.__version__,
        "fedjax_pals_version": fjp.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_start": load_start,
        "load_average_end": _load(),
        "env_cleared_in_children": list(_DEVICE_ENV_VARS)
        + [f"XLA_FLAGS {_XLA_DEVICE_FLAG}", "FEDJAX_PALS_*"],
    }
