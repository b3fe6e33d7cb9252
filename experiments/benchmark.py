r"""Throughput of one federated round: the engine's strategies vs a plain loop.

For each model (LeNet on Fashion-MNIST shapes (28, 28, 1), and logistic
regression on the same inputs flattened; 10 classes), each number of clients
M and each client-axis strategy of `fjp.STRATEGIES`, this times one FedAvg
round of `fjp.RoundEngine` (every client participates, E local epochs of
minibatch SGD) against a baseline written here: a Python loop over clients
and steps of one jitted single-client SGD step (`jax.value_and_grad` +
`optax.sgd`, batches gathered from the device arrays inside the jit), with the
same batch size, the same number of steps per client and the same data order
(`fjp.client_schedule` with the engine's per-client keys), and FedAvg weights.

The data are synthetic random arrays of Fashion-MNIST shape (no download),
`--examples_per_client` examples per client, so M = 1000 stays feasible.

Reported per (model, M, strategy):
  * compile + first round (s), and the part of it spent tracing, lowering and
    compiling (summed from `jax.monitoring` compile events);
  * steady-state seconds per round: the median of `--rounds` rounds after the
    first (more, up to 20, while they total under `--min_timed_seconds`), each
    ended with `jax.block_until_ready`;
  * client-steps/s and examples/s (examples visited, all epochs);
  * the speed ratio vs the baseline loop (baseline s/round / strategy s/round,
    > 1 means faster than the loop);
  * peak process RSS over the case's rounds (`resource.getrusage` ru_maxrss;
    the peak is reset before every round through /proc/self/clear_refs where
    Linux allows it, so it is the case's own peak, with the data and the other
    cases' small states resident) and, on GPU, the device's peak_bytes_in_use
    (cumulative over the process).

The timed rounds of the cases of one (model, M) are interleaved (round-robin
after every case's first round), so that load changes on a shared machine hit
the baseline and the strategies alike.

Each case uses a freshly built `fjp.RoundEngine`, so its first round is a cold
compile (`fjp.round_engine` would share compiled pieces between runs).
A case whose predicted least time (compile, first and one timed round, the
round time scaled linearly in M from the same model and strategy at the
largest smaller M) exceeds `--max_seconds_per_case` is skipped
and reported as "skipped (est. Xs)". At `--check_clients` (default 10) every
strategy's and the baseline's resulting params are compared (max abs diff).

The machine's load average is recorded: numbers taken on a shared machine are
noisy; compare ratios taken in the same run rather than absolute numbers.

Usage:
  python -m experiments.benchmark
  python -m experiments.benchmark --models=lenet --num_clients=10,100 \
      --strategies=per_client,vmap_steps --output=results/bench_small.json
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import sys
import time

from absl import app
from absl import flags

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjax_pals as fjp

BASELINE = "baseline_loop"
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
MODELS = ("lenet", "logistic_regression")

_NUM_CLIENTS = flags.DEFINE_list(
    "num_clients", ["10", "100", "1000"], "Numbers of clients M (all participate in the round)."
)
_MODELS = flags.DEFINE_list("models", list(MODELS), f"Models, among {MODELS}.")
_STRATEGIES = flags.DEFINE_list(
    "strategies", list(fjp.STRATEGIES), f"Engine strategies, among {fjp.STRATEGIES}."
)
_BASELINE = flags.DEFINE_boolean(
    "baseline", True, "Also time the plain per-client loop (the ratio's reference)."
)
_EXAMPLES = flags.DEFINE_integer("examples_per_client", 64, "Examples per client.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Local minibatch size.")
_EPOCHS = flags.DEFINE_integer("local_epochs", 1, "Local epochs per round.")
_LR = flags.DEFINE_float("learning_rate", 0.1, "Local SGD learning rate.")
_CHUNK = flags.DEFINE_integer("chunk_size", 64, "Clients per chunk for vmap_chunked.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds after the first (median reported).")
_MAX_SECONDS = flags.DEFINE_float(
    "max_seconds_per_case",
    60.0,
    "Skip a case predicted to take longer than this (compile + first + timed rounds); "
    "also caps the number of timed rounds of a case (at least one).",
)
_MIN_TIMED = flags.DEFINE_float(
    "min_timed_seconds",
    1.0,
    "Time more than --rounds rounds (up to 20) while their total is below this.",
)
_MAX_FAST_ROUNDS = 20
_CHECK_CLIENTS = flags.DEFINE_integer(
    "check_clients", 10, "At this M, compare every strategy's resulting params."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and the initial params.")
_OUTPUT = flags.DEFINE_string("output", "results/benchmark.json", "Where to write the JSON.")


# ----------------------------------------------------------------------------
# Measurement helpers

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileTimer:
    """Sums the trace + lowering + XLA compile durations JAX reports."""

    def __init__(self):
        self.seconds = 0.0
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event in _COMPILE_EVENTS:
            self.seconds += duration
            if event == _COMPILE_EVENTS[-1]:
                self.count += 1

    def snapshot(self) -> tuple[float, int]:
        return self.seconds, self.count


def _reset_peak_rss() -> bool:
    """Resets the kernel's RSS high-water mark (and so ru_maxrss) of this process."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_mib() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _device_peak_bytes() -> int | None:
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if not stats:
        return None
    return stats.get("peak_bytes_in_use")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _machine_info() -> dict:
    device = jax.devices()[0]
    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        jaxlib_version = None
    return {
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "num_devices": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "optax_version": optax.__version__,
        "fedjax_pals_version": fjp.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_start": _load(),
        "default_strategy": {m: fjp.default_strategy(_make_model(m)) for m in MODELS},
    }


def _log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------
# Problem setup


def _make_model(name: str) -> fjp.Model:
    if name == "lenet":
        return fjp.lenet(INPUT_SHAPE, NUM_CLASSES)
    if name == "logistic_regression":
        return fjp.logistic_regression((int(np.prod(INPUT_SHAPE)),), NUM_CLASSES)
    raise ValueError(f"unknown model {name!r}; choose among {MODELS}.")


def _synthetic_split(num_clients: int, examples_per_client: int, seed: int):
    """Random FMNIST-shaped examples, client i owning rows [i*n, (i+1)*n)."""
    rng = np.random.default_rng(seed)
    n = examples_per_client
    total = num_clients * n
    x = rng.random((total, *INPUT_SHAPE), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, total).astype(np.int32)
    indices = np.arange(total, dtype=np.int32).reshape(num_clients, n)
    sizes = np.full((num_clients,), n, np.int32)
    label_dists = np.stack([np.bincount(y[row], minlength=NUM_CLASSES) / n for row in indices])
    return x, y, indices, sizes, label_dists.astype(np.float32)


def _device_data_for(model_name: str, split) -> fjp.DeviceData:
    x, y, indices, sizes, label_dists = split
    if model_name == "logistic_regression":
        x = x.reshape(x.shape[0], -1)
    return fjp.device_data(x, y, indices, sizes, label_dists)


# ----------------------------------------------------------------------------
# The baseline: a Python loop over clients of a jitted single-client SGD step


class BaselineLoop:
    """FedAvg round as a plain loop of per-client jitted SGD steps.

    Uses the engine's data order (`fjp.client_schedule`, client key
    fold_in(round_key, client_id)) so that its result can be checked against
    the engine's; the schedule is computed once per round for all clients.
    Requires full batches (examples_per_client % batch_size == 0).
    """

    def __init__(self, model: fjp.Model, training: fjp.LocalTraining):
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
                positions, mask = fjp.client_schedule(
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

        self._step = jax.jit(step)
        self._schedule = jax.jit(schedule)
        self._accumulate = jax.jit(accumulate)
        self._weights = jax.jit(weights)
        self._zeros = jax.jit(lambda p: jax.tree_util.tree_map(jnp.zeros_like, p))
        self._apply = jax.jit(lambda g, acc: jax.tree_util.tree_map(jnp.add, g, acc))

    def run_round(self, data: fjp.DeviceData, params, participants, key):
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


# ----------------------------------------------------------------------------
# One case


def _timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


class Case:
    """One (model, M, strategy): a round runner, its state and its measurements.

    `warm_up()` runs the first round (cold compile included); `timed_round()`
    one more round. Rounds of the cases of one (model, M) are interleaved by
    `main` so that load changes on a shared machine hit every case alike.
    """

    def __init__(
        self, model_name, model, strategy, data, params0, num_clients, training, timer, est_round_s
    ):
        self.model_name, self.strategy, self.num_clients = model_name, strategy, num_clients
        self.training, self.timer, self.est_round_s = training, timer, est_round_s
        algorithm = fjp.fedavg()
        participants = np.arange(num_clients, dtype=np.int32)
        base_key = jax.random.PRNGKey(_SEED.value + 1)
        if strategy == BASELINE:
            runner = BaselineLoop(model, training)
            self.state = params0
            self._round = lambda state, r: runner.run_round(
                data, state, participants, jax.random.fold_in(base_key, r)
            )
            self._params_of = lambda state: state
            self._counts = lambda: None
        else:
            # A fresh engine, so that the first round is a cold compile at every M.
            engine = fjp.RoundEngine(
                algorithm, model, training, strategy=strategy, chunk_size=_CHUNK.value
            )
            self.state = fjp.init_server_state(algorithm, params0, num_clients)
            self._round = lambda state, r: engine.run_round(
                data, state, participants, jax.random.fold_in(base_key, r)
            )[0]
            self._params_of = lambda state: state.params
            self._counts = engine.compilation_counts
        self.times: list[float] = []
        self.peak_rss = 0.0
        self.compile_in_timed = 0.0
        self.compiles_in_timed = 0
        self.target_rounds = _ROUNDS.value

    def _measured_round(self, r: int) -> tuple[float, float, int]:
        gc.collect()
        self.rss_reset = _reset_peak_rss()
        c0, n0 = self.timer.snapshot()
        self.state, t = _timed(lambda: self._round(self.state, r))
        c1, n1 = self.timer.snapshot()
        self.peak_rss = max(self.peak_rss, _peak_rss_mib())
        return t, c1 - c0, n1 - n0

    def warm_up(self) -> None:
        self.load = _load()
        self.rss_at_start = _rss_mib()
        self.first_s, self.compile_s, self.num_compiles = self._measured_round(0)
        self.first_params = jax.device_get(self._params_of(self.state))
        self.counts_after_first = self._counts()
        # As many timed rounds as fit in the case budget (at least one, at most --rounds);
        # fast rounds: more (up to _MAX_FAST_ROUNDS) while they total under --min_timed_seconds.
        guess = max(self.first_s - self.compile_s, 1e-3)
        remaining = _MAX_SECONDS.value - self.first_s
        rounds = int(min(_ROUNDS.value, max(1, remaining // guess)))
        if guess * rounds < _MIN_TIMED.value:
            rounds = int(min(_MAX_FAST_ROUNDS, max(rounds, _MIN_TIMED.value // guess)))
        self.target_rounds = rounds

    def wants_more(self) -> bool:
        return len(self.times) < self.target_rounds

    def timed_round(self) -> None:
        t, c, n = self._measured_round(len(self.times) + 1)
        self.times.append(t)
        self.compile_in_timed += c
        self.compiles_in_timed += n

    def record(self) -> dict:
        steady = statistics.median(self.times)
        client_steps = self.num_clients * self.training.num_steps(_EXAMPLES.value)
        record = {
            "model": self.model_name,
            "num_clients": self.num_clients,
            "strategy": self.strategy,
            "status": "ok",
            "compile_plus_first_round_s": self.first_s,
            "compile_s": self.compile_s,
            "num_compiles_first_round": self.num_compiles,
            "steady_round_s": steady,
            "min_round_s": min(self.times),
            "round_times_s": self.times,
            "timed_rounds": len(self.times),
            "compile_s_during_timed_rounds": self.compile_in_timed,
            "recompiled_after_first_round": self.compiles_in_timed > 0,
            "client_steps_per_round": client_steps,
            "client_steps_per_s": client_steps / steady,
            "examples_per_s": client_steps * self.training.batch_size / steady,
            "peak_rss_mib": self.peak_rss,
            "peak_rss_reset_per_round": self.rss_reset,
            "rss_at_start_mib": self.rss_at_start,
            "device_peak_bytes_in_use": _device_peak_bytes(),
            "load_average_at_start": self.load,
            "predicted_round_s": self.est_round_s,
        }
        counts = self._counts()
        if counts is not None:
            record["compilation_counts"] = counts
            record["compilation_counts_changed"] = counts != self.counts_after_first
        return record


def _max_abs_diff(a, b) -> float:
    leaves = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(
            lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b
        )
    )
    return max(leaves) if leaves else 0.0


# ----------------------------------------------------------------------------
# Reporting


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


def markdown_table(records: list[dict]) -> str:
    header = (
        "| model | M | strategy | compile+1st round (s) | of which compile (s) | "
        "steady s/round | client-steps/s | examples/s | vs loop | peak RSS (MiB) | load 1m |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in records:
        name = r["strategy"] + (" (default)" if r.get("is_default") else "")
        if r["status"] != "ok":
            lines.append(
                f"| {r['model']} | {r['num_clients']} | {name} | "
                f"skipped (est. {_fmt(r['predicted_case_s'])}s, "
                f"~{_fmt(r['predicted_round_s'])}s/round) | | | | | | | |"
            )
            continue
        ratio = r.get("speedup_vs_baseline")
        lines.append(
            f"| {r['model']} | {r['num_clients']} | {name} | {_fmt(r['compile_plus_first_round_s'])} | "
            f"{_fmt(r['compile_s'])} | {_fmt(r['steady_round_s'])} | {_fmt(r['client_steps_per_s'])} | "
            f"{_fmt(r['examples_per_s'])} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{_fmt(r['peak_rss_mib'])} | {r['load_average_at_start'][0]:.2f} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------


def main(argv):
    del argv
    wall_start = time.perf_counter()
    models = [m.strip() for m in _MODELS.value]
    for m in models:
        if m not in MODELS:
            raise app.UsageError(f"unknown model {m!r}; choose among {MODELS}.")
    strategies = [s.strip() for s in _STRATEGIES.value]
    for s in strategies:
        if s not in fjp.STRATEGIES:
            raise app.UsageError(f"unknown strategy {s!r}; choose among {fjp.STRATEGIES}.")
    cases = ([BASELINE] if _BASELINE.value else []) + strategies
    num_clients_list = sorted({int(m) for m in _NUM_CLIENTS.value})
    if _BASELINE.value and _EXAMPLES.value % _BATCH.value:
        raise app.UsageError(
            "the baseline loop needs full batches: --examples_per_client must "
            "be a multiple of --batch_size (or pass --nobaseline)."
        )
    training = fjp.LocalTraining(
        local_epochs=_EPOCHS.value, batch_size=_BATCH.value, learning_rate=_LR.value
    )
    steps_per_client = training.num_steps(_EXAMPLES.value)

    timer = CompileTimer()
    info = _machine_info()
    _log(
        f"# benchmark: backend={info['backend']} device={info['device_kind']} "
        f"jax={info['jax_version']} cpus={info['cpu_count']} load={info['load_average_start']}"
    )
    _log(
        f"# {_EXAMPLES.value} examples/client, batch {_BATCH.value}, {_EPOCHS.value} epoch(s) -> "
        f"{steps_per_client} steps/client; rounds timed: {_ROUNDS.value}; "
        f"max {_MAX_SECONDS.value:.0f}s/case"
    )

    records: list[dict] = []
    last: dict = {}  # (model, case) -> (M, steady s/round, compile s) of the last measured M
    parity: dict = {}  # model -> {case: params} at --check_clients
    for num_clients in num_clients_list:
        split = _synthetic_split(num_clients, _EXAMPLES.value, _SEED.value)
        for model_name in models:
            model = _make_model(model_name)
            data = _device_data_for(model_name, split)
            params0 = model.init(jax.random.PRNGKey(_SEED.value))
            active: list[Case] = []
            for case in cases:
                est_round = est_case = None
                if (model_name, case) in last:
                    prev_m, prev_round, prev_compile = last[(model_name, case)]
                    est_round = prev_round * num_clients / prev_m
                    # The least the case can take: compile, the first round and one timed round.
                    est_case = prev_compile + 2 * est_round
                if est_case is not None and est_case > _MAX_SECONDS.value:
                    _log(
                        f"{model_name:>19} M={num_clients:<5} {case:<14} skipped "
                        f"(est. {est_case:.0f}s: ~{est_round:.1f}s/round)"
                    )
                    records.append(
                        {
                            "model": model_name,
                            "num_clients": num_clients,
                            "strategy": case,
                            "status": "skipped",
                            "predicted_round_s": est_round,
                            "predicted_case_s": est_case,
                            "client_steps_per_round": num_clients * steps_per_client,
                            "is_default": case == fjp.default_strategy(model),
                            "load_average_at_start": _load(),
                        }
                    )
                    # Chain the estimate so that larger M are skipped too.
                    last[(model_name, case)] = (num_clients, est_round, prev_compile)
                    continue
                c = Case(
                    model_name, model, case, data, params0, num_clients, training, timer, est_round
                )
                c.warm_up()
                _log(
                    f"{model_name:>19} M={num_clients:<5} {case:<14} compile+first round "
                    f"{c.first_s:.2f}s (compile {c.compile_s:.2f}s), peak RSS {c.peak_rss:.0f} MiB, "
                    f"load {c.load[0]}" + (f"; est. was {est_case:.0f}s" if est_case else "")
                )
                active.append(c)
            # Timed rounds, interleaved across the cases.
            while any(c.wants_more() for c in active):
                for c in active:
                    if c.wants_more():
                        c.timed_round()
            for c in active:
                record = c.record()
                record["is_default"] = c.strategy == fjp.default_strategy(model)
                records.append(record)
                last[(model_name, c.strategy)] = (
                    num_clients,
                    record["steady_round_s"],
                    record["compile_s"],
                )
                if num_clients == _CHECK_CLIENTS.value:
                    parity.setdefault(model_name, {})[c.strategy] = c.first_params
                _log(
                    f"{model_name:>19} M={num_clients:<5} {c.strategy:<14} steady "
                    f"{record['steady_round_s']:.4f}s/round (median of {record['timed_rounds']}), "
                    f"{record['client_steps_per_s']:.0f} client-steps/s, peak RSS "
                    f"{record['peak_rss_mib']:.0f} MiB"
                    + (
                        "  RECOMPILED in timed rounds!"
                        if record["recompiled_after_first_round"]
                        else ""
                    )
                )
            del active
            del data
        del split
        gc.collect()

    order = {(m, c): (i, j) for i, m in enumerate(models) for j, c in enumerate(cases)}
    records.sort(key=lambda r: (r["num_clients"], order[(r["model"], r["strategy"])]))

    # Speed ratios vs the baseline loop (same model and M).
    baseline_s = {
        (r["model"], r["num_clients"]): r["steady_round_s"]
        for r in records
        if r["strategy"] == BASELINE and r["status"] == "ok"
    }
    for r in records:
        base = baseline_s.get((r["model"], r["num_clients"]))
        if r["status"] == "ok" and base is not None:
            r["speedup_vs_baseline"] = base / r["steady_round_s"]
            r["baseline_steady_round_s"] = base

    # Parity: every strategy's params after the same first round, at --check_clients.
    parity_report = {}
    for model_name, by_case in parity.items():
        names = [c for c in cases if c in by_case]
        if not names:
            continue
        ref = names[0]
        diffs = {c: _max_abs_diff(by_case[ref], by_case[c]) for c in names}
        parity_report[model_name] = {"reference": ref, "max_abs_diff": diffs}
        _log(
            f"# parity at M={_CHECK_CLIENTS.value}, {model_name}: max abs diff of params vs {ref}: "
            + ", ".join(f"{c}={d:.2e}" for c, d in diffs.items())
        )
        if max(diffs.values()) > 1e-4:
            _log(f"# WARNING: {model_name}: strategies disagree by more than 1e-4!")

    # Fastest per (model, M).
    fastest = {}
    for r in records:
        if r["status"] != "ok":
            continue
        k = f"{r['model']}/M={r['num_clients']}"
        if k not in fastest or r["steady_round_s"] < fastest[k]["steady_round_s"]:
            fastest[k] = {"strategy": r["strategy"], "steady_round_s": r["steady_round_s"]}

    total_s = time.perf_counter() - wall_start
    info["load_average_end"] = _load()
    table = markdown_table(records)
    result = {
        "machine": info,
        "config": {
            "num_clients": num_clients_list,
            "models": models,
            "strategies": strategies,
            "baseline": _BASELINE.value,
            "examples_per_client": _EXAMPLES.value,
            "batch_size": _BATCH.value,
            "local_epochs": _EPOCHS.value,
            "learning_rate": _LR.value,
            "chunk_size": _CHUNK.value,
            "rounds": _ROUNDS.value,
            "max_seconds_per_case": _MAX_SECONDS.value,
            "check_clients": _CHECK_CLIENTS.value,
            "seed": _SEED.value,
            "steps_per_client": steps_per_client,
            "algorithm": "fedavg",
            "data": "synthetic uniform [0,1) inputs, random labels",
            "input_shape": {
                "lenet": list(INPUT_SHAPE),
                "logistic_regression": [int(np.prod(INPUT_SHAPE))],
            },
            "num_classes": NUM_CLASSES,
        },
        "results": records,
        "parity": parity_report,
        "fastest": fastest,
        "total_seconds": total_s,
        "markdown_table": table,
    }
    out_dir = os.path.dirname(_OUTPUT.value)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(_OUTPUT.value, "w") as f:
        json.dump(result, f, indent=2, default=float)

    _log("")
    _log(
        f"Backend {info['backend']} ({info['device_kind']}), jax {info['jax_version']}, "
        f"{info['cpu_count']} CPUs, load average {info['load_average_start']} at start, "
        f"{info['load_average_end']} at end; {_EXAMPLES.value} examples/client, "
        f"batch {_BATCH.value}, {steps_per_client} steps/client, median of "
        f"{_ROUNDS.value} rounds (up to {_MAX_FAST_ROUNDS} for rounds under "
        f"{_MIN_TIMED.value:g}s in total). 'vs loop' = baseline s/round / strategy s/round."
    )
    _log("")
    _log(table)
    _log("")
    for k, v in fastest.items():
        _log(f"# fastest {k}: {v['strategy']} ({v['steady_round_s']:.3f} s/round)")
    _log(f"# total {total_s:.0f}s; wrote {_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main)
