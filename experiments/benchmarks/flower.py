r"""The benchmark's FedAvg round in Flower's simulation engine, side by side with ours.

Runs the round of `experiments.benchmarks.round` (the same JAX model from
`bench.make_model`, the same synthetic data from
`bench.synthetic_data`, batch 32, the same local steps and data order,
from the same jitted single-client SGD step as the benchmark's plain loop via
`bench.BaselineLoop.local_update`) in Flower's simulation engine (Ray actors
running `ClientApp`s, a `ServerApp` with Flower's `FedAvg`, weights n_i /
sum_j n_j), for each number of clients M and each number of Ray actors.
m = round(participation * M) clients train per round (Flower samples them).

Timed per (M, actors): every round from `configure_fit` to the end of
`aggregate_fit` (the first includes starting Ray's actor pool, the actors'
imports, data and JIT compile; the rest are steady), the median of the steady
rounds, the clients' own seconds in local steps per round, client-steps/s
and the peak RSS of this process and all its descendants (Ray's processes and
actors), sampled every 0.2 s. With --compare (default), `bench.run_benchmark`
first measures the plain loop and the engine's default for the same (model, M,
participation) in child processes, and the JSON gets the ratios of this one
run: `flower_vs_loop` = Flower s/round / loop s/round, `engine_vs_flower` =
engine client-steps/s / Flower's (> 1: ours is faster). At M = --check_clients
with full participation, Flower's params after round 1 are compared with the
loop's (max abs diff; the summation order differs, so ~1e-7).

This is an optional extra, never a dependency of fedjax_pals (nothing in the
package or its tests imports it). Install it in a separate virtual
environment (flwr 1.41 with Ray installs from PyPI on Python 3.11; 1.42 wants a
certifi release that PyPI does not have yet):

  python3 -m venv /path/to/flower-venv
  /path/to/flower-venv/bin/pip install -e /path/to/fedjax_pals   # the package, its pins
  /path/to/flower-venv/bin/pip install 'flwr[simulation]==1.41.0'

With --clients=torch the clients are the same LeNet in PyTorch eager (one thread per actor,
channels_last, the same steps, batch and learning rate on the same data; torch installed in
the Flower venv, e.g. `pip install --no-deps "torch==2.13.0+cpu"` from PyTorch's CPU index
plus its pure-Python dependencies): what a Flower user trains. Its params are not compared
(another framework's initialisation and data order).

Usage (from the repository root; a few minutes per M on a 2-core CPU):
  /path/to/flower-venv/bin/python -m experiments.benchmarks.flower --num_clients=10 \
      --actors=2,1 --rounds=3 --output=results/flower_m10.json
  /path/to/flower-venv/bin/python -m experiments.benchmarks.flower --num_clients=1000 \
      --participation=0.1 --output=results/flower_m1000.json
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import statistics
import threading
import time
from typing import Any

import numpy as np

from . import harness as bench


@dataclasses.dataclass(frozen=True)
class FlowerSetup:
    """What one simulation runs; picklable, so it travels to the Ray actors."""

    model: str
    num_clients: int
    clients_per_round: int
    rounds: int
    actors: int
    settings: bench.BenchmarkSettings
    clients: str = "jax"  # "torch": PyTorch LeNet clients (what a Flower user trains)


# ----------------------------------------------------------------------------
# The client side (runs in the Ray actors; cached per actor process)


@functools.cache
def _client_problem(setup: FlowerSetup):
    import jax

    s = setup.settings
    model = bench.make_model(setup.model)
    data = bench.synthetic_data(
        setup.model, setup.num_clients, s.examples_per_client, s.seed
    )
    loop = bench.BaselineLoop(model, bench.local_training(s))
    treedef = jax.tree_util.tree_structure(model.init(jax.random.PRNGKey(s.seed)))
    return data, loop, treedef


def torch_lenet():
    """The benchmark's LeNet in PyTorch (NCHW in, the same layer sizes as `fjp.lenet`)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )  # fmt: skip


@functools.cache
def _torch_problem(setup: FlowerSetup):
    import torch

    torch.set_num_threads(1)  # one CPU per actor, as the Ray resources say
    s = setup.settings
    data = bench.synthetic_data(setup.model, setup.num_clients, s.examples_per_client, s.seed)
    x = torch.from_numpy(np.asarray(data.train_x)).permute(0, 3, 1, 2)
    x = x.contiguous(memory_format=torch.channels_last)  # oneDNN's fastest layout here
    y = torch.from_numpy(np.asarray(data.train_y).astype(np.int64))
    model = torch_lenet().to(memory_format=torch.channels_last)
    return x, y, np.asarray(data.client_indices), model


def _torch_local_update(setup: FlowerSetup, parameters, cid: int, server_round: int):
    """The client's local SGD in PyTorch eager: the same steps, batch and learning rate as
    the loop (its own data order: a permutation per epoch from (seed, round, client))."""
    import torch

    x, y, indices, model = _torch_problem(setup)
    s = setup.settings
    with torch.no_grad():
        for p, value in zip(model.state_dict().values(), parameters):
            p.copy_(torch.from_numpy(np.asarray(value)))
    optimizer = torch.optim.SGD(model.parameters(), lr=s.learning_rate)
    rows = torch.from_numpy(indices[cid].astype(np.int64))
    generator = torch.Generator().manual_seed(s.seed * 1_000_003 + server_round * 7919 + cid)
    for _ in range(s.local_epochs):
        order = rows[torch.randperm(len(rows), generator=generator)]
        for start in range(0, len(order) - s.batch_size + 1, s.batch_size):
            batch = order[start : start + s.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
    return [v.detach().numpy().copy() for v in model.state_dict().values()]


def _torch_initial_params(setup: FlowerSetup) -> list[np.ndarray]:
    import torch

    torch.manual_seed(setup.settings.seed)
    return [v.detach().numpy().copy() for v in torch_lenet().state_dict().values()]


def _client_fn(setup: FlowerSetup, context):
    from flwr.client import NumPyClient

    cid = int(context.node_config["partition-id"])

    if setup.clients == "torch":

        class TorchClient(NumPyClient):
            def fit(self, parameters, config):
                start = time.perf_counter()
                local = _torch_local_update(setup, parameters, cid, int(config["server_round"]))
                fit_s = time.perf_counter() - start
                return local, setup.settings.examples_per_client, {"fit_s": fit_s}

        return TorchClient().to_client()

    class Client(NumPyClient):
        def fit(self, parameters, config):
            import jax

            data, loop, treedef = _client_problem(setup)
            params = jax.tree_util.tree_unflatten(treedef, [np.asarray(p) for p in parameters])
            # Round r's key, as in the benchmark: fold_in(PRNGKey(seed + 1), r), r from 0.
            key = jax.random.fold_in(
                jax.random.PRNGKey(setup.settings.seed + 1), int(config["server_round"]) - 1
            )
            start = time.perf_counter()
            local = jax.block_until_ready(loop.local_update(data, params, cid, key))
            fit_s = time.perf_counter() - start
            leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(local))]
            return leaves, int(data.client_sizes[cid]), {"fit_s": fit_s}

    return Client().to_client()


# ----------------------------------------------------------------------------
# The server side (this process)


def _timed_fedavg(setup: FlowerSetup, initial_leaves, start_time: float):
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    class TimedFedAvg(FedAvg):
        """Flower's FedAvg, recording when each round is configured and aggregated."""

        def __init__(self):
            super().__init__(
                fraction_fit=setup.clients_per_round / setup.num_clients,
                min_fit_clients=setup.clients_per_round,
                min_available_clients=setup.num_clients,
                fraction_evaluate=0.0,
                min_evaluate_clients=0,
                on_fit_config_fn=lambda r: {"server_round": r},
                initial_parameters=ndarrays_to_parameters(initial_leaves),
                accept_failures=False,
            )
            self.started: dict[int, float] = {}
            self.round_s: dict[int, float] = {}
            self.num_results: dict[int, int] = {}
            self.num_failures: dict[int, int] = {}
            self.client_fit_s: dict[int, float] = {}
            self.first_round_params = None
            self.first_round_done_s = None

        def configure_fit(self, server_round, parameters, client_manager):
            self.started[server_round] = time.perf_counter()
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            now = time.perf_counter()
            self.round_s[server_round] = now - self.started[server_round]
            if server_round == 1:
                self.first_round_done_s = now - start_time
            self.client_fit_s[server_round] = sum(
                float(fit.metrics.get("fit_s", 0.0)) for _, fit in results
            )
            self.num_results[server_round] = len(results)
            self.num_failures[server_round] = len(failures)
            if server_round == 1 and out[0] is not None:
                self.first_round_params = parameters_to_ndarrays(out[0])
            return out

    return TimedFedAvg()


class _PeakRss:
    """Peak summed RSS of this process and its descendants, sampled in a thread."""

    def __init__(self, every_s: float = 0.2):
        import psutil

        self._psutil = psutil
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float:
        me = self._psutil.Process()
        total = 0
        for p in [me] + me.children(recursive=True):
            try:
                total += p.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                pass
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self._sample())
            self._stop.wait(self._every)

    def __enter__(self) -> "_PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_flower_round(setup: FlowerSetup) -> dict:
    """One Flower simulation of `setup.rounds` FedAvg rounds; returns its timings."""
    import jax
    from flwr.client import ClientApp
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    s = setup.settings
    if setup.clients == "torch":
        initial = _torch_initial_params(setup)
    else:
        model = bench.make_model(setup.model)
        initial = [
            np.asarray(x)
            for x in jax.tree_util.tree_leaves(model.init(jax.random.PRNGKey(s.seed)))
        ]
    start = time.perf_counter()
    strategy = _timed_fedavg(setup, initial, start)

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=setup.rounds))

    backend_config = {
        # One CPU per client: Ray runs `actors` actors on a cluster of `actors` CPUs.
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": setup.actors, "num_gpus": 0, "include_dashboard": False},
    }
    with _PeakRss() as rss:
        run_simulation(
            server_app=ServerApp(server_fn=server_fn),
            client_app=ClientApp(client_fn=functools.partial(_client_fn, setup)),
            num_supernodes=setup.num_clients,
            backend_config=backend_config,
        )
    total = time.perf_counter() - start
    rounds = [strategy.round_s[r] for r in sorted(strategy.round_s)]
    if len(rounds) != setup.rounds:
        raise RuntimeError(
            f"Flower finished {len(rounds)} of {setup.rounds} rounds (failures per round: "
            f"{strategy.num_failures})."
        )
    steady = rounds[1:] or rounds
    steady_s = statistics.median(steady)
    client_steps = setup.clients_per_round * s.steps_per_client
    return {
        "model": setup.model,
        "clients": setup.clients,
        "num_clients": setup.num_clients,
        "clients_per_round": setup.clients_per_round,
        "actors": setup.actors,
        "rounds": setup.rounds,
        "first_round_s": rounds[0],
        "seconds_to_first_round_done": strategy.first_round_done_s,
        "round_times_s": rounds,
        "steady_round_s": steady_s,
        "client_steps_per_round": client_steps,
        "client_steps_per_s": client_steps / steady_s,
        "results_per_round": [strategy.num_results[r] for r in sorted(strategy.num_results)],
        # Seconds the clients spent in their local steps, summed over a round's clients:
        # the rest of a round (over the actors in parallel) is Flower's and Ray's.
        "client_fit_s_per_round": [strategy.client_fit_s[r] for r in sorted(strategy.client_fit_s)],
        "total_s": total,
        "peak_rss_mib_all_processes": rss.peak_mib,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "_first_round_params": strategy.first_round_params,
    }


def _parity(setup: FlowerSetup, flower_leaves) -> float:
    """Max abs diff between Flower's params after round 1 and the loop's (all clients)."""
    import jax

    s = setup.settings
    model = bench.make_model(setup.model)
    data = bench.synthetic_data(
        setup.model, setup.num_clients, s.examples_per_client, s.seed
    )
    params = model.init(jax.random.PRNGKey(s.seed))
    loop = bench.BaselineLoop(model, bench.local_training(s))
    expected = loop.run_round(
        data,
        params,
        np.arange(setup.num_clients),
        jax.random.fold_in(jax.random.PRNGKey(s.seed + 1), 0),
    )
    leaves = jax.tree_util.tree_leaves(expected)
    return max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(leaves, flower_leaves))


# ----------------------------------------------------------------------------


def _define_flags():
    from absl import flags

    return dict(
        num_clients=flags.DEFINE_list("num_clients", ["10"], "Numbers of clients M."),
        model=flags.DEFINE_enum("model", "lenet", list(bench.MODELS), "Model."),
        clients=flags.DEFINE_enum(
            "clients",
            "jax",
            ["jax", "torch"],
            "Flower's clients: the loop's jitted JAX step, or PyTorch eager (LeNet only; "
            "torch in the same venv as flwr).",
        ),
        actors=flags.DEFINE_list("actors", ["2", "1"], "Numbers of Ray actors (one CPU each)."),
        participation=flags.DEFINE_float(
            "participation", 1.0, "Fraction of the M clients sampled into each round."
        ),
        rounds=flags.DEFINE_integer(
            "rounds", 3, "Rounds per simulation (the first is the warm-up; median of the rest)."
        ),
        examples=flags.DEFINE_integer("examples_per_client", 64, "Examples per client."),
        batch=flags.DEFINE_integer("batch_size", 32, "Local minibatch size."),
        epochs=flags.DEFINE_integer("local_epochs", 1, "Local epochs per round."),
        lr=flags.DEFINE_float("learning_rate", 0.1, "Local SGD learning rate."),
        seed=flags.DEFINE_integer("seed", 0, "Seed of the data and the initial params."),
        compare=flags.DEFINE_boolean(
            "compare", True, "Also run the loop and the engine's default (bench.run_benchmark)."
        ),
        check_clients=flags.DEFINE_integer(
            "check_clients", 10, "At this M (full participation), compare Flower's params."
        ),
        output=flags.DEFINE_string(
            "output", "results/flower_benchmark.json", "Where to write the JSON."
        ),
    )


def main(argv, f) -> None:
    del argv
    from .. import cli

    try:
        settings = bench.BenchmarkSettings(
            examples_per_client=f["examples"].value,
            batch_size=f["batch"].value,
            local_epochs=f["epochs"].value,
            learning_rate=f["lr"].value,
            seed=f["seed"].value,
            participation=f["participation"].value,
            check_clients=f["check_clients"].value,
            rounds=max(1, f["rounds"].value - 1),
        )
        if settings.examples_per_client % settings.batch_size:
            raise ValueError("--examples_per_client must be a multiple of --batch_size.")
        sizes = sorted({int(m) for m in f["num_clients"].value})
        actors = [int(a) for a in f["actors"].value]
        if f["clients"].value == "torch" and f["model"].value != "lenet":
            raise ValueError("--clients=torch has LeNet only.")
    except ValueError as e:
        cli.usage_error(str(e))
    model = f["model"].value
    log = functools.partial(print, flush=True)
    # Flower logs through its own handler; without this absl's root handler prints it twice.
    logging.getLogger("flwr").propagate = False
    out: dict[str, Any] = {
        "config": {
            **dataclasses.asdict(settings),
            "model": model,
            "clients": f["clients"].value,
            "num_clients": sizes,
            "actors": actors,
            "flower_rounds": f["rounds"].value,
        },
        "engine": None,
        "flower": [],
    }
    try:
        import flwr
        import ray

        out["versions"] = {"flwr": flwr.__version__, "ray": ray.__version__}
    except ImportError as e:
        cli.usage_error(f"{e}: install the extra (see this module's docstring).")
    if f["compare"].value:
        cases = bench.benchmark_cases([model], sizes, ["auto"])
        log(f"# the loop and the engine's default at M = {sizes} (child processes)")
        out["engine"] = bench.run_benchmark(cases, settings, log=log)
        log(out["engine"]["markdown_table"])
    rows = {
        (r["num_clients"], r["backend"] == bench.BASELINE): r
        for r in (out["engine"] or {}).get("results", [])
        if r["status"] == "ok"
    }
    for m in sizes:
        for a in actors:
            setup = FlowerSetup(
                model,
                m,
                settings.clients_per_round(m),
                f["rounds"].value,
                a,
                settings,
                clients=f["clients"].value,
            )
            log(f"# Flower: M={m}, {setup.clients_per_round} per round, {a} actor(s)")
            row = run_flower_round(setup)
            params = row.pop("_first_round_params")
            if (
                m == settings.check_clients
                and setup.clients_per_round == m
                and params
                and setup.clients == "jax"
            ):
                row["max_abs_diff_vs_loop"] = _parity(setup, params)
            loop, engine = rows.get((m, True)), rows.get((m, False))
            if loop is not None:
                row["flower_vs_loop"] = row["steady_round_s"] / loop["steady_round_s"]
            if engine is not None:
                row["engine_backend"] = engine["backend"]
                row["engine_vs_flower"] = engine["client_steps_per_s"] / row["client_steps_per_s"]
            out["flower"].append(row)
            log(
                f"  first round {row['first_round_s']:.2f}s (Ray, actors, imports, compile), "
                f"steady {row['steady_round_s']:.3f}s/round, peak RSS "
                f"{row['peak_rss_mib_all_processes']:.0f} MiB"
                + (f", {row['flower_vs_loop']:.2f}x the loop's time" if loop else "")
                + (f", engine {row['engine_vs_flower']:.2f}x faster" if engine else "")
                + (
                    f", params vs loop {row['max_abs_diff_vs_loop']:.1e}"
                    if "max_abs_diff_vs_loop" in row
                    else ""
                )
            )
    out_dir = os.path.dirname(f["output"].value)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(f["output"].value, "w") as fh:
        json.dump(out, fh, indent=2, default=float)
    log(f"# wrote {f['output'].value}")


def entry() -> None:
    """Defines the flags and runs `main` (flags are not defined on a plain import, which
    the Ray actors do to unpickle the client function)."""
    from .. import cli

    f = _define_flags()
    # Checked while absl parses: a mistake is one `error:` line before Ray starts.
    cli.check_number_list(f["num_clients"], 1, integer=True, meaning="numbers of clients M")
    cli.check_number_list(f["actors"], 1, integer=True, meaning="numbers of Ray actors")
    cli.check_number(f["rounds"], 2, meaning="the first is the warm-up")
    for name in ("examples", "batch", "epochs"):
        cli.check_number(f[name], 1)
    cli.check_number(f["lr"], 0, include_low=False)
    cli.check_number(f["participation"], 0, 1, include_low=False)
    cli.check_number(f["check_clients"], 0, meaning="0: no comparison")
    cli.require_value(f["output"], "file path")
    cli.run(functools.partial(main, f=f))


if __name__ == "__main__":
    # Run from the importable module, so the client function pickles by reference.
    import importlib

    importlib.import_module(__spec__.name).entry()
