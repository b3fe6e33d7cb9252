r"""Throughput of one federated round: the engine's backends vs a plain loop.

Times one FedAvg round (all M clients, synthetic Fashion-MNIST-shaped data) for
every (model, M, backend, devices, processes, runs) case against the baseline
loop (one process with JAX's default settings, one jitted single-client SGD
step per batch), each device configuration in child processes of its own;
see `bench.run_benchmark` for what is measured and how. Writes JSON (rows with
model, num_clients, backend (= strategy), devices, processes, runs,
is_default, client_steps_per_s, speedup_vs_baseline, compile seconds, peak
RSS, machine load; fraction_of_ceiling on the default rows: their client-steps/s over the
bare step's on the same host devices) and prints a Markdown table.

`--workload` sets the round of a published benchmark instead, on synthetic tensors of its
shapes (`bench.WORKLOADS`): `fedjax_emnist` (FedJAX's EMNIST-62 CNN, 28x28x1, 62 classes,
10 clients a round, 200 examples each in batches of 10: 20 steps) or `pfl_cifar10`
(pfl-research's CIFAR-10 simple CNN, 32x32x3, 10 classes, cohort 50, 50 examples each in
batches of 10: 5 steps). It sets --models, and the defaults of --num_clients,
--examples_per_client, --batch_size, --local_epochs and --check_clients (those flags, given,
win). With several --runs, a second table gives the runs axis' gain: client-steps/s of R
runs trained together (every run's steps counted) over one run's.

It says up front how long it may take (cases x --max_seconds_per_case, a case's budget),
prints `case k/N started` as each case starts and `finished k/N, R to go` with the time
left after each model and M, and rewrites --output after every finished case ("partial":
true, "cases_done" of "cases_total"; false when it is complete): a benchmark stopped by
Ctrl-C or SIGTERM keeps what it measured (a case stopped in its timed rounds is the median
of those it had, marked stopped_early), says so in one line, and its worker
processes die with it (at once, also when it is SIGKILLed).

`--vmapped_convs=patches,grouped` measures instead how a vmapped backend (`--backends`, one
name; vmap_scan unless given) computes the model's convolutions
(docs/decisions/0106-vmapped-convolutions-as-matmuls.md): in this process, for each
formulation x --runs x M, the engine's round (`run_round` for one run, `run_rounds` for
several), its compile (first round), the median of --rounds steady rounds, client-steps/s, the
runs axis' gain, the grouped convolutions of its program (lowered, `fjp.engine.conv_groups`),
the device's peak memory where the device reports it, and the largest difference of run 0's
params after the first round from the first formulation's. One compact table, JSON in --output.
No baseline, no ceiling, no worker processes.

A mistake in the command line is one `error:` line on stderr and exit status 2.

Usage:
  python -m experiments.benchmarks.round
  python -m experiments.benchmarks.round --models=lenet --num_clients=10,100 \
      --backends=host_loop,vmap_steps --devices=1,auto --output=results/bench_small.json
  python -m experiments.benchmarks.round --workload=fedjax_emnist --runs=1,16 --backends=auto \
      --output=results/bench_emnist.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import types

from absl import flags

from .. import cli

# --help prints before JAX is imported (docs/decisions/0076-help-before-jax.md; the import is
# 10-57 s on a loaded machine): the harness, whose constants are the flags' choices, is then
# imported with a stand-in for the package (absl exits after the help, before any use), and
# the engine's backend names are named instead of listed.
_HELP = cli.asked_for_help(sys.argv)
if _HELP and "fedjax_pals" not in sys.modules:
    sys.modules["fedjax_pals"] = types.ModuleType("fedjax_pals", "stand-in while --help prints")
    try:
        from . import harness as bench
    finally:
        del sys.modules["fedjax_pals"]
else:
    from . import harness as bench
_BACKENDS_LIST = None if _HELP else bench.available_backends()

_NUM_CLIENTS = flags.DEFINE_list("num_clients", ["10", "100", "1000"], "Numbers of clients M.")
_MODELS = flags.DEFINE_list(
    "models", list(bench.MODELS), f"Models, among {list(bench.ALL_MODELS)}."
)
_WORKLOAD = flags.DEFINE_enum(
    "workload",
    None,
    list(bench.WORKLOADS),
    "A published benchmark's round on synthetic tensors of its shapes: fedjax_emnist "
    "(FedJAX's EMNIST CNN, 28x28x1, 62 classes, M=10, 200 examples, batch 10: 20 steps) or "
    "pfl_cifar10 (pfl-research's CIFAR-10 CNN, 32x32x3, 10 classes, M=50, 50 examples, batch "
    "10: 5 steps). Sets --models and the defaults of --num_clients, --examples_per_client, "
    "--batch_size, --local_epochs, --check_clients.",
)
_BACKENDS = flags.DEFINE_list(
    "backends",
    ["every backend of fjp.engine.BACKENDS"] if _HELP else list(_BACKENDS_LIST),
    f"Engine backends, among {_BACKENDS_LIST or 'fjp.engine.BACKENDS'} or 'auto'.",
)
flags.DEFINE_alias("strategies", "backends")
_DEVICES = flags.DEFINE_list(
    "devices",
    ["auto"],
    "Device settings of the engine's cases: 'auto' (one host device per core, "
    "fjp.configure_runtime(cpu_devices='auto')), 'default' (JAX untouched, the baseline's "
    "process) or a number of CPU devices.",
)
_PROCESSES = flags.DEFINE_list("processes", ["1"], "Numbers of local JAX processes per case.")
_RUNS = flags.DEFINE_list("runs", ["1"], "Numbers of runs trained together (runs axis).")
_BASELINE = flags.DEFINE_boolean(
    "baseline", True, "Also time the plain per-client loop (the ratio's reference)."
)
_CEILING = flags.DEFINE_boolean(
    "ceiling",
    True,
    "Also time the bare step on the 'auto' host devices (the machine's ceiling; default rows "
    "report fraction_of_ceiling).",
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
    "Skip a case predicted to take longer than this (compile + first + one timed round); "
    "also caps the number of timed rounds of a case (at least one).",
)
_MIN_TIMED = flags.DEFINE_float(
    "min_timed_seconds",
    1.0,
    "Time more than --rounds rounds (up to 20) while they total below this.",
)
_CHECK_CLIENTS = flags.DEFINE_integer(
    "check_clients", 10, "At this M, compare every case's resulting params (0: none)."
)
_PARTICIPATION = flags.DEFINE_float(
    "participation", 1.0, "Fraction of the M clients sampled into each round (1: all)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and the initial params.")
_VMAPPED_CONVS = flags.DEFINE_list(
    "vmapped_convs",
    [],
    "Formulations of a vmapped client update's convolutions to compare in this process "
    "(among patches, grouped; RoundEngine's vmapped_convs); empty: the usual benchmark.",
)
_OUTPUT = flags.DEFINE_string("output", "results/benchmark.json", "Where to write the JSON.")
# Checked while absl parses; the rest (numbers of clients, models, backends' names) by the
# harness before anything is measured.
cli.require_items(_BACKENDS, "backend")
cli.require_items(_DEVICES, "device setting")
cli.require_items(_MODELS, "model")
cli.require_value(_OUTPUT, "file path")
cli.check_number(_CHECK_CLIENTS, 0, meaning="0: no comparison")


def _given(holder) -> tuple:
    return holder.value, flags.FLAGS[holder.name].present


def write_result(path: str, result: dict) -> None:
    """Writes the JSON whole or not at all (a temporary file renamed over `path`)."""
    out_dir = os.path.dirname(path)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w") as f:
            json.dump(result, f, indent=2, default=float)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):  # stopped while writing: the old file stays whole
            os.remove(temporary)


def _stop_on_sigterm() -> None:
    # SIGTERM (a scheduler, `kill`) ends the benchmark as Ctrl-C does: through the finally
    # clauses that kill the workers, with the one line below, instead of silently.
    def stop(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)


def _peak_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _params_diff(a, b) -> float:
    import jax
    import numpy as np

    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def conv_ab(model_name: str, num_clients: int, runs: int, convs: str, backend: str,
            settings, *, params_of_first=None) -> dict:
    """One case of `--vmapped_convs`: the engine's round of `runs` runs of `num_clients`
    clients each with `convs`; returns its row (and run 0's params after round 0)."""
    import statistics
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    import fedjax_pals as fjp

    model = bench.make_model(model_name)
    data = bench.synthetic_data(model_name, num_clients, settings.examples_per_client,
                                settings.seed)
    training = bench.local_training(settings)
    algorithm = fjp.fedavg()
    engine = fjp.engine.RoundEngine(algorithm, model, training, backend=backend,
                                    vmapped_convs=convs)
    states = [fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(settings.seed + j)),
                                    num_clients) for j in range(runs)]
    base_key = jax.random.PRNGKey(settings.seed + 1)
    stack = lambda *xs: jax.tree_util.tree_map(lambda *l: jnp.stack(l), *xs)
    if runs == 1:
        state = states[0]

        def one_round(state, r):
            parts = bench.round_participants(num_clients, settings, r)
            return engine.run_round(data, state, parts, jax.random.fold_in(base_key, r))[0]

        run0 = lambda state: state.params
        program = engine._rounds._jit_single_round if hasattr(engine._rounds, "_jit_single_round") else None
        program_args = lambda: (engine.place_data(data), state,
                                bench.round_participants(num_clients, settings, 0), base_key)
    else:
        state = stack(*states)
        runs_data = data._replace(**{n: stack(*[getattr(data, n)] * runs) for n in
                                     ("client_indices", "client_sizes", "client_label_dists")})

        def one_round(state, r):
            parts = np.tile(bench.round_participants(num_clients, settings, r), (runs, 1))
            return engine.run_rounds(runs_data, state, parts,
                                     stack(*[jax.random.fold_in(base_key, r)] * runs))[0]

        run0 = lambda state: jax.tree_util.tree_map(lambda l: l[0], state.params)
        program = getattr(engine._rounds, "_jit_round", None)
        program_args = lambda: (runs_data, state,
                                np.tile(bench.round_participants(num_clients, settings, 0),
                                        (runs, 1)),
                                stack(*[base_key] * runs))
    groups = None
    if program is not None:  # a traced backend: its one program's convolutions
        groups = fjp.engine.conv_groups(program.lower(*program_args()).as_text())
    start = time.perf_counter()
    state = jax.block_until_ready(one_round(state, 0))
    first_s = time.perf_counter() - start
    first_params = run0(state)
    times = []
    for r in range(1, settings.rounds + 1):
        start = time.perf_counter()
        state = jax.block_until_ready(one_round(state, r))
        times.append(time.perf_counter() - start)
    steady = statistics.median(times)
    participants = len(bench.round_participants(num_clients, settings, 0))
    steps = runs * participants * settings.steps_per_client
    peak = _peak_bytes()
    return {
        "model": model_name, "vmapped_convs": convs, "backend": engine.backend.name,
        "runs": runs, "num_clients": num_clients, "lanes": runs * participants,
        "first_round_s": first_s, "steady_round_s": steady, "client_steps_per_s": steps / steady,
        "conv_groups": None if groups is None else {f"{fg}x{bg}": n for (fg, bg), n in
                                                    groups.items()},
        "grouped_convs": None if groups is None else sum(
            n for (fg, bg), n in groups.items() if fg > 1 or bg > 1),
        "device_peak_gb": None if peak is None else peak / 1e9,
        "params_diff_vs_first": None if params_of_first is None else _params_diff(
            first_params, params_of_first),
    }, first_params


def conv_ab_table(rows: list[dict]) -> str:
    """The `--vmapped_convs` rows as one Markdown table (runs gain: client-steps/s over the
    same model, M and formulation's one-run row)."""
    solo = {(r["model"], r["num_clients"], r["vmapped_convs"]): r["client_steps_per_s"]
            for r in rows if r["runs"] == 1}
    lines = ["| model | M | convs | runs | lanes | grouped convs (groups) | first round s | "
             "steady s/round | client-steps/s | runs gain | device peak GB so far | params diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = solo.get((r["model"], r["num_clients"], r["vmapped_convs"]))
        gain = "" if base is None or r["runs"] == 1 else f"{r['client_steps_per_s'] / base:.2f}x"
        groups = "" if r["conv_groups"] is None else (
            f"{r['grouped_convs']} ({', '.join(f'{k}:{n}' for k, n in r['conv_groups'].items())})")
        peak = "" if r["device_peak_gb"] is None else f"{r['device_peak_gb']:.2f}"
        diff = "" if r["params_diff_vs_first"] is None else f"{r['params_diff_vs_first']:.1e}"
        lines.append(
            f"| {r['model']} | {r['num_clients']} | {r['vmapped_convs']} | {r['runs']} | "
            f"{r['lanes']} | {groups} | {r['first_round_s']:.2f} | {r['steady_round_s']:.4f} | "
            f"{r['client_steps_per_s']:,.0f} | {gain} | {peak} | {diff} |")
    return "\n".join(lines)


def _run_conv_ab(chosen: dict, settings) -> None:
    import fedjax_pals as fjp

    convs = [c.strip() for c in _VMAPPED_CONVS.value]
    for c in convs:
        if c not in fjp.engine.VMAPPED_CONVS:
            cli.usage_error(f"--vmapped_convs: {c!r} is not among {fjp.engine.VMAPPED_CONVS}.")
    backends = [b.strip() for b in _BACKENDS.value] if flags.FLAGS["backends"].present else [
        "vmap_scan"]
    if len(backends) != 1 or backends[0] not in _BACKENDS_LIST:
        cli.usage_error("--vmapped_convs compares one named backend: give one --backends name.")
    rows = []
    for model_name in chosen["models"]:
        for m in sorted({int(v) for v in chosen["num_clients"]}):
            for runs in sorted({int(v) for v in _RUNS.value}):
                first = None
                for c in convs:
                    row, params = conv_ab(model_name.strip(), m, runs, c, backends[0], settings,
                                          params_of_first=first)
                    first = params if first is None else first
                    rows.append(row)
                    print(f"# {model_name} M={m} runs={runs} {c}: "
                          f"{row['steady_round_s']:.4f} s/round, grouped convs "
                          f"{row['grouped_convs']}", flush=True)
                    write_result(_OUTPUT.value, {"vmapped_convs": rows, "partial": True})
    import jax

    device = jax.devices()[0]
    write_result(_OUTPUT.value, {"vmapped_convs": rows, "partial": False,
                                 "device": f"{device.platform} ({device.device_kind})",
                                 "jax_version": jax.__version__})
    print(f"\n{device.platform} ({device.device_kind}), jax {jax.__version__}, backend "
          f"{backends[0]}, {settings.steps_per_client} steps/client, batch "
          f"{settings.batch_size}; params diff: run 0 after round 0 against the first "
          "formulation's.\n")
    print(conv_ab_table(rows))
    print(f"# wrote {_OUTPUT.value}")


def main(argv):
    del argv
    try:
        chosen = bench.resolve_workload(
            _WORKLOAD.value,
            {
                "models": _given(_MODELS),
                "num_clients": _given(_NUM_CLIENTS),
                "examples_per_client": _given(_EXAMPLES),
                "batch_size": _given(_BATCH),
                "local_epochs": _given(_EPOCHS),
                "check_clients": _given(_CHECK_CLIENTS),
            },
        )
        settings = bench.BenchmarkSettings(
            examples_per_client=chosen["examples_per_client"],
            batch_size=chosen["batch_size"],
            local_epochs=chosen["local_epochs"],
            learning_rate=_LR.value,
            chunk_size=_CHUNK.value,
            rounds=_ROUNDS.value,
            max_seconds_per_case=_MAX_SECONDS.value,
            min_timed_seconds=_MIN_TIMED.value,
            check_clients=chosen["check_clients"],
            seed=_SEED.value,
            participation=_PARTICIPATION.value,
        )
        if _VMAPPED_CONVS.value:
            return _run_conv_ab(chosen, settings)
        if _BASELINE.value and settings.examples_per_client % settings.batch_size:
            raise ValueError(
                "the baseline loop needs full batches: --examples_per_client must be a "
                "multiple of --batch_size (or pass --nobaseline)."
            )
        cases = bench.benchmark_cases(
            [m.strip() for m in chosen["models"]],
            chosen["num_clients"],
            [b.strip() for b in _BACKENDS.value],
            devices=_DEVICES.value,
            processes=_PROCESSES.value,
            runs=_RUNS.value,
            baseline=_BASELINE.value,
            ceiling=_CEILING.value,
        )
    except ValueError as e:
        cli.usage_error(str(e))
    workload = None if _WORKLOAD.value is None else bench.get_workload(_WORKLOAD.value)
    if workload is not None:
        shape = "x".join(str(d) for d in workload.input_shape)
        print(
            f"# workload {workload.name}: model {workload.model}, inputs {shape}, "
            f"{workload.num_classes} classes; {workload.description}",
            flush=True,
        )
    print(
        f"# benchmark: {len(cases)} cases, {settings.examples_per_client} examples/client, "
        f"batch {settings.batch_size}, {settings.steps_per_client} steps/client",
        flush=True,
    )
    budget = bench.format_duration(bench.budget_seconds(cases, settings))
    print(
        f"# measuring takes up to about {budget} "
        f"({len(cases)} cases x --max_seconds_per_case={settings.max_seconds_per_case:g} s; a "
        "case predicted to take longer is skipped), plus starting the worker processes "
        f"({bench.process_groups(cases)} sets, seconds each); a `finished k/N` line after each "
        "model and M says the time left at the pace so far. "
        f"{_OUTPUT.value} is rewritten after every case.",
        flush=True,
    )

    def with_workload(result: dict) -> dict:
        if workload is not None:
            result["config"]["workload"] = {
                **dataclasses.asdict(workload),
                "input_shape": list(workload.input_shape),
                "num_classes": workload.num_classes,
                "steps_per_client": workload.steps_per_client,
            }
        return result

    written = {"done": 0, "stopped_early": 0}

    def write_partial(result: dict) -> None:
        write_result(_OUTPUT.value, with_workload(result))
        written["done"] = result["cases_done"]
        written["stopped_early"] = sum(bool(r.get("stopped_early")) for r in result["results"])

    _stop_on_sigterm()
    try:
        result = bench.run_benchmark(
            cases, settings, log=lambda msg: print(msg, flush=True), on_update=write_partial
        )
    except KeyboardInterrupt as stopped:
        how = str(stopped) or "SIGINT"
        early = written["stopped_early"]
        where = (
            f"{_OUTPUT.value} holds the {written['done']} finished case(s) (\"partial\": true"
            + (f"; {early} of them stopped early: the median of fewer timed rounds than planned, "
               "stopped_early: true" if early else "")
            + ")"
            if written["done"]
            else "no case had measured a timed round: nothing was written"
        )
        print(f"\nstopped by {how} after {written['done']} of {len(cases)} cases; {where}.")
        sys.exit(128 + getattr(signal.Signals, how, signal.SIGINT).value)
    result = with_workload(result)
    write_result(_OUTPUT.value, result)
    machine = result["machine"]
    print(
        f"\n{machine['platform_name']} ({machine['device_kind']}), jax {machine['jax_version']}, "
        f"{machine['cpu_count']} CPUs, load average {machine['load_average_start']} at start, "
        f"{machine['load_average_end']} at end. 'vs loop' = case client-steps/s / loop's.\n"
    )
    print(result["markdown_table"])
    if result.get("runs_axis"):
        print(
            "\nRuns axis: client-steps/s of R runs trained together (every run's steps) over "
            "one run's, median steady rounds (compile apart); 'fastest rounds': the same from "
            "each case's fastest timed round (the least disturbed by other load).\n"
        )
        print(bench.runs_axis_table(result["runs_axis"]))
    for key, v in result["fastest"].items():
        print(
            f"# fastest {key}: {v['backend']} on {v['devices']} device(s) x {v['processes']} "
            f"process(es) ({v['steady_round_s']:.3f} s/round)"
        )
    print(f"# total {result['total_seconds']:.0f}s; wrote {_OUTPUT.value}")


def entry() -> None:
    """The `fedjax-pals-benchmark-round` command (`python -m experiments.benchmarks.round`)."""
    cli.run(main)


if __name__ == "__main__":
    entry()
