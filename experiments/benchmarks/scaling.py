r"""Client-count scaling of FedPALS rounds on Fashion-MNIST: time and memory against M and m.

Two curves of FedPALS rounds (LeNet, the engine's default backend), each point
in a child process of its own (so that its peak RSS is its own):

* against the number of clients M (default 10^2 ... 10^5) at a fixed number
  of participants per round m (default 100);
* against m (default 10 ... 10^4) at a fixed M (default 10^4).

The clients: Fashion-MNIST's 60,000 training examples (the real files, through
`fjp.load_fashion_mnist`) split into M clients of `--examples_per_client`
examples each (default 8) with a label shift: client i draws its label mix
p_i ~ Dir_K(beta), its per-class counts ~ Multinomial(n, p_i), and its
examples from the class pools. Examples are drawn with replacement, so M n may
exceed the 60,000 examples (from M = 7,500 at n = 8): the data set is held once
whatever M, the clients are O(M) rows of indices. (`fjp.dirichlet_partition`
gives disjoint clients, so at most 60,000 / n of them; the partition here is
the same Dirichlet label mix without that cap.) The target T is one more
Dirichlet draw. Every round samples its m participants
(`fjp.training.sample_participants`) and re-solves the FedPALS weights over them.

Per point: time per round, split into sampling, the plan, training (the
clients' updates), the FedPALS solve (timed alone on the round's participants,
the same `fjp.fedpals_weights` the engine calls) and aggregation (the engine's
aggregate phase minus the solve: the weighted reduction and the server update;
training and aggregation are left empty for a traced backend, `vmap_scan` or `vmap_chunked`,
whose round is one program); the first round's seconds and its XLA compile seconds; peak RSS
(the child's whole life, and during the timed rounds alone); RSS after loading the data set;
the bytes per client of the O(M) tables (index rows, sizes, label
distributions). Writes JSON and draws the curves (PNG + PDF).

`--curves=M` or `--curves=m` measures one of the two curves. A mistake in the command line
(an unknown flag, a bad number, an empty list) is one `error:` line and exit status 2 before
anything is measured.

Also: `--runs_split=R` alternates one run's round with R runs' round (the
benchmark's LeNet FedAvg round) and records each phase; `--from_json=a,b`
merges result files and redraws.

Usage:
  python -m experiments.benchmarks.scaling
  python -m experiments.benchmarks.scaling --runs_split=8 --devices=auto \
      --output=results/runs_split.json
  python -m experiments.benchmarks.scaling --curves=M --num_clients=100,1000 \
      --output=results/scaling_small.json --plot=results/scaling_small
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from .. import cli
from . import memory

_CURVES = flags.DEFINE_list(
    "curves",
    ["M", "m"],
    "The curves to measure: M (time against the number of clients at --participants) and/or m "
    "(against the participants per round at --participants_curve_clients).",
)
_NUM_CLIENTS = flags.DEFINE_list(
    "num_clients", ["100", "1000", "10000", "100000"], "M of the curve against M."
)
_PARTICIPANTS = flags.DEFINE_integer(
    "participants", 100, "Participants per round m of the curve against M."
)
_PARTICIPANTS_CURVE = flags.DEFINE_list(
    "participants_curve", ["10", "100", "1000", "10000"], "m of the curve against m."
)
_CURVE_CLIENTS = flags.DEFINE_integer(
    "participants_curve_clients", 10000, "M of the curve against m."
)
_EXAMPLES = flags.DEFINE_integer("examples_per_client", 8, "Examples per client n.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Local minibatch size.")
_EPOCHS = flags.DEFINE_integer("local_epochs", 1, "Local epochs per round.")
_LR = flags.DEFINE_float("learning_rate", 0.05, "Local SGD learning rate.")
_BETA = flags.DEFINE_float(
    "beta", 0.5, "Dirichlet concentration of the clients' label mixes."
)
_LAM = flags.DEFINE_float("lam", 0.01, "FedPALS lambda.")
_BACKEND = flags.DEFINE_string("backend", "auto", "Engine backend.")
_DEVICES = flags.DEFINE_string(
    "devices", "1", "Host devices per child: a number or 'auto' (one per core)."
)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 4, "Timed rounds after the first (median reported)."
)
_MAX_TIMED = flags.DEFINE_float(
    "max_timed_seconds",
    60.0,
    "Stop timing a point's rounds once they total this (>= 1 round).",
)
_SEED = flags.DEFINE_integer(
    "seed", 0, "Seed of the partition, the params and the sampling."
)
_OUTPUT = flags.DEFINE_string(
    "output", "results/scaling.json", "Where to write the JSON."
)
_PLOT = flags.DEFINE_string(
    "plot",
    "results/scaling",
    "Path of the figure without extension (.png and .pdf written); empty: no figure.",
)
_POINT = flags.DEFINE_string(
    "point", None, "Internal: run one point (JSON) and print it."
)
_RUNS_SPLIT = flags.DEFINE_integer(
    "runs_split",
    0,
    "Instead of the curves: R runs together vs one run, the benchmark's round (LeNet, FedAvg, "
    "M = --runs_split_clients clients of 64 synthetic examples, batch 32, every client), "
    "alternating in one process, with each round's plan / train / aggregate phases.",
)
_FROM_JSON = flags.DEFINE_list(
    "from_json",
    [],
    "Instead of measuring: merge the rows of these result files, draw, print.",
)
_RUNS_SPLIT_CLIENTS = flags.DEFINE_integer(
    "runs_split_clients", 10, "M of --runs_split."
)
_RUNS_SPLIT_PAIRS = flags.DEFINE_integer(
    "runs_split_pairs", 15, "Alternations of --runs_split."
)

# Checked while absl parses: a mistake is one line before anything is measured.
cli.check_choices(_CURVES, ("M", "m"), "curve")
cli.check_number_list(
    _NUM_CLIENTS, 1, integer=True, meaning="the numbers of clients M; --curves=m skips the curve"
)
cli.check_number_list(
    _PARTICIPANTS_CURVE,
    1,
    integer=True,
    meaning="participants per round m; --curves=M skips the curve",
)
for _holder in (_PARTICIPANTS, _CURVE_CLIENTS, _EXAMPLES, _BATCH, _EPOCHS, _ROUNDS):
    cli.check_number(_holder, 1)
for _holder in (_LR, _BETA, _MAX_TIMED):
    cli.check_number(_holder, 0, include_low=False)
cli.check_number(_LAM, 0)
cli.check_number(_RUNS_SPLIT, 0, meaning="0: the curves")
cli.check_number(_RUNS_SPLIT_CLIENTS, 1)
cli.check_number(_RUNS_SPLIT_PAIRS, 1)
cli.check_count_or_auto(_DEVICES)
cli.require_value(_OUTPUT, "file path")


@flags.validator(_BACKEND.name, message="")
def _check_backend(name: str) -> bool:
    if name == "auto":
        return True
    from fedjax_pals import engine  # JAX is imported only for a backend named explicitly

    known = ("auto", *engine.BACKENDS)
    if name not in known:
        raise flags.ValidationError(f"unknown backend {name!r}; choose among {known}.")
    return True


@flags.validator(_FROM_JSON.name, message="")
def _check_result_files(paths: list[str]) -> bool:
    missing = [path for path in paths if path.strip() and not os.path.isfile(path)]
    if missing:
        raise flags.ValidationError(f"no such result file: {', '.join(missing)}.")
    return True


@flags.multi_flags_validator(
    [_PARTICIPANTS_CURVE.name, _CURVE_CLIENTS.name, _CURVES.name], message=""
)
def _check_participants_fit(values: dict) -> bool:
    if "m" not in (values[_CURVES.name] or []):
        return True
    clients = values[_CURVE_CLIENTS.name]
    # Items that are not integers are refused by the list's own check.
    listed = [p.strip() for p in values[_PARTICIPANTS_CURVE.name] or []]
    too_many = [p for p in listed if p.lstrip("-").isdigit() and int(p) > clients]
    if too_many:
        raise flags.ValidationError(
            f"--participants_curve={','.join(too_many)} exceeds "
            f"--participants_curve_clients={clients} (m <= M)."
        )
    return True


_PREFIX = "@@fjp-scaling "
NUM_CLASSES = 10


def label_shift_clients(labels, num_clients, examples_per_client, beta, seed):
    """(indices (M, n) int32, label counts (M, K), target T (K,)) of the Dirichlet clients."""
    labels = np.asarray(labels)
    rng = np.random.default_rng([7, seed])
    p = rng.dirichlet(np.full(NUM_CLASSES, beta), size=num_clients + 1)
    p = np.where(np.isfinite(p), p, 0.0)
    p[p.sum(axis=1) <= 0, 0] = 1.0  # a Gamma underflow at tiny beta: a point mass
    p /= p.sum(axis=1, keepdims=True)
    counts = rng.multinomial(examples_per_client, p[:-1])  # (M, K), rows sum to n
    classes = np.repeat(np.tile(np.arange(NUM_CLASSES), num_clients), counts.ravel())
    classes = classes.reshape(num_clients, examples_per_client)
    order = np.argsort(labels, kind="stable")
    pool = np.bincount(labels, minlength=NUM_CLASSES)
    starts = np.concatenate([[0], np.cumsum(pool)[:-1]])
    picks = rng.integers(0, pool[classes])
    indices = order[starts[classes] + picks].astype(np.int32)
    return indices, counts, p[-1]


def _rss_now_mib() -> float:
    rss = memory.rss_mib()
    return float("nan") if rss is None else rss


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class PointRunner:
    """One (M, m) point in this process (which must not have started JAX).

    `__init__` loads the data, builds the clients and runs the first (compiling)
    round; `timed_round()` runs and times one more; `summary()` gives the point's row.
    """

    def __init__(self, spec: dict):
        import fedjax_pals as fjp

        devices = spec["devices"]
        fjp.configure_runtime(
            cpu_devices=devices if devices == "auto" else int(devices)
        )
        import jax
        import jax.numpy as jnp

        self.spec, self.fjp, self.jax = spec, fjp, jax
        self.backend_compile_s = 0.0

        def listen(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                self.backend_compile_s += duration

        jax.monitoring.register_event_duration_secs_listener(listen)
        self.rss_start = _rss_now_mib()
        started = time.perf_counter()
        dataset = fjp.load_fashion_mnist()
        self.load_s = time.perf_counter() - started
        self.rss_loaded = _rss_now_mib()
        self.dataset_mib = (dataset.train.x.nbytes + dataset.train.y.nbytes) / 2**20
        self.num_clients, self.m = spec["num_clients"], spec["participants"]
        started = time.perf_counter()
        indices, counts, target = label_shift_clients(
            dataset.train.y,
            self.num_clients,
            spec["examples_per_client"],
            spec["beta"],
            spec["seed"],
        )
        sizes = counts.sum(axis=1)
        dists = (counts / sizes[:, None]).astype(np.float32)
        self.partition_s = time.perf_counter() - started
        self.data = fjp.engine.device_data(
            dataset.train.x, dataset.train.y, indices, sizes, dists
        )
        tables = (
            self.data.client_indices,
            self.data.client_sizes,
            self.data.client_label_dists,
        )
        self.table_bytes = int(sum(t.nbytes for t in tables))
        del indices, counts, dataset
        model = fjp.lenet((28, 28, 1), NUM_CLASSES)
        algorithm = fjp.fedpals(target, spec["lam"])
        training = fjp.LocalTraining(
            local_epochs=spec["local_epochs"],
            batch_size=spec["batch_size"],
            learning_rate=spec["learning_rate"],
        )
        self.engine = fjp.engine.round_engine(
            algorithm, model, training, backend=spec["backend"]
        )
        seed = spec["seed"]
        self.state = fjp.init_server_state(
            algorithm, model.init(jax.random.PRNGKey(seed)), self.num_clients
        )
        self.round_root = jax.random.PRNGKey(seed + 1)
        weight_data = algorithm.weighting.init()
        solve = jax.jit(fjp.fedpals_weights)
        sizes_f = jnp.asarray(sizes, jnp.float32)
        dists_d = self.data.client_label_dists

        def solve_for(participants):
            return solve(
                dists_d[participants],
                weight_data.target_label_dist,
                sizes_f[participants],
                weight_data.lam,
            )

        self.solve_for = solve_for
        compile0 = self.backend_compile_s
        self.first = self._round(0)
        self.first["compile"] = self.backend_compile_s - compile0
        t0 = time.perf_counter()
        jax.block_until_ready(solve_for(self.participants))
        self.first["solve_first_call"] = time.perf_counter() - t0
        self.rss_after_first = _rss_now_mib()
        self.peak_before_timed = memory.peak_rss_mib()  # load, placement, first round
        self.rss_reset = memory.reset_peak_rss()
        self.rounds: list[dict] = []

    def _round(self, r: int) -> dict:
        jax, timings = self.jax, {}
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        self.participants = self.fjp.training.sample_participants(
            self.spec["seed"], r, self.num_clients, self.m
        )
        timings["sample"] = time.perf_counter() - t0
        self.state, self.metrics = jax.block_until_ready(
            self.engine.run_round(
                self.data,
                self.state,
                self.participants,
                jax.random.fold_in(self.round_root, r),
                timings=timings,
            )
        )
        timings["wall"] = time.perf_counter() - t0
        timings["cpu"] = (
            _cpu_s() - cpu0
        )  # this process's CPU seconds: less load-sensitive
        return timings

    def timed_round(self) -> dict:
        timings = self._round(len(self.rounds) + 1)
        t0 = time.perf_counter()
        self.jax.block_until_ready(self.solve_for(self.participants))
        timings["solve"] = time.perf_counter() - t0
        # A traced backend (`vmap_scan`, a GPU's default, or `vmap_chunked`) runs the round as one
        # program: no training or aggregate phase to time apart, and its "round" minus a solve
        # timed alone is not the aggregation. Those columns stay empty there, not mislabelled.
        if "aggregate" in timings:
            timings["aggregation"] = max(timings["aggregate"] - timings["solve"], 0.0)
        if "train" in timings:
            timings["training"] = timings["train"]
        timings["load_average"] = os.getloadavg()[0]
        self.rounds.append(timings)
        return timings

    def timed_seconds(self) -> float:
        return sum(t["wall"] for t in self.rounds)

    def summary(self) -> dict:
        rounds, metrics = self.rounds, self.metrics
        loss = float(
            np.sum(np.asarray(metrics["train_loss"]) * np.asarray(metrics["weights"]))
        )

        def med(name):
            values = [t[name] for t in rounds if name in t]
            return statistics.median(values) if values else None

        peak_timed = memory.peak_rss_mib()
        return {
            **self.spec,
            "backend_resolved": self.engine.backend.name,
            "device_count": self.jax.device_count(),
            "load_s": self.load_s,
            "partition_s": self.partition_s,
            "first_round_s": self.first["wall"],
            "compile_s": self.first["compile"],
            "solve_first_call_s": self.first["solve_first_call"],
            "timed_rounds": len(rounds),
            "round_s": med("wall"),
            "round_s_all": [t["wall"] for t in rounds],
            "round_cpu_s": med("cpu"),
            "sample_s": med("sample"),
            "plan_s": med("plan"),
            "training_s": med("training"),
            "solve_s": med("solve"),
            "aggregate_phase_s": med("aggregate"),
            "aggregation_s": med("aggregation"),
            "weighted_train_loss": loss,
            "rss_start_mib": self.rss_start,
            "rss_after_load_mib": self.rss_loaded,
            "rss_after_first_round_mib": self.rss_after_first,
            "peak_rss_mib": max(self.peak_before_timed, peak_timed),
            "peak_rss_timed_mib": peak_timed if self.rss_reset else None,
            "dataset_mib": self.dataset_mib,
            "table_bytes": self.table_bytes,
            "bytes_per_client": self.table_bytes / self.num_clients,
            "load_average_timed": [round(t["load_average"], 2) for t in rounds],
        }


def point_main(spec: dict) -> None:
    """The child: builds the point, then answers "round" / "summary" lines on stdin."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol

    def reply(obj):
        out.write(_PREFIX + json.dumps(obj) + "\n")
        out.flush()

    try:
        runner = PointRunner(spec)
        reply({"ready": True, "first_round_s": runner.first["wall"]})
    except Exception as e:  # noqa: BLE001 - reported to the parent
        import traceback

        reply({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"})
        return
    for line in sys.stdin:
        command = line.strip()
        if command == "round":
            reply(runner.timed_round())
        elif command == "summary":
            reply(runner.summary())
            return


class _Child:
    def __init__(self, spec: dict):
        # The repository root (this file is experiments/benchmarks/scaling.py).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {
            **os.environ,
            "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self.spec = spec
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "experiments.benchmarks.scaling",
                "--point=" + json.dumps(spec),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=root,
            env=env,
        )
        self.timed = 0.0
        self.rounds = 0

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(_PREFIX):
                return json.loads(line[len(_PREFIX) :])
        self.stderr.seek(0)
        return {"error": "the child ended: " + self.stderr.read()[-3000:]}

    def ask(self, command: str) -> dict:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        return self.read()

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)
        self.stderr.close()


def run_points(
    specs: list[dict], rounds: int, max_timed_seconds: float, log=print
) -> list[dict]:
    """The points of one curve: each child set up in turn (its cold first round alone), then
    their timed rounds interleaved round-robin, so that load on a shared machine hits every
    point alike; a point stops at `rounds` timed rounds or `max_timed_seconds`."""
    children, rows = [], {}
    for i, spec in enumerate(specs):
        child = _Child(spec)
        ready = child.read()
        if "error" in ready:
            rows[i] = {**spec, "error": ready["error"]}
            child.close()
            log(f"# {spec}: error\n{ready['error']}")
            continue
        log(
            f"# set up M={spec['num_clients']} m={spec['participants']}: first round "
            f"{ready['first_round_s']:.1f} s"
        )
        children.append((i, child))
    active = list(children)
    while active:
        for i, child in list(active):
            timings = child.ask("round")
            if "error" in timings:
                rows[i] = {**child.spec, "error": timings["error"]}
                active.remove((i, child))
                continue
            child.rounds += 1
            child.timed += timings["wall"]
            if child.rounds >= rounds or child.timed >= max_timed_seconds:
                active.remove((i, child))
    for i, child in children:
        if i not in rows:
            rows[i] = child.ask("summary")
        child.close()
    return [rows[i] for i in range(len(specs))]


def _peak(row):
    """The child's peak RSS over its whole life (loading, placement, compiles, rounds)."""
    return row.get("peak_rss_mib")


def _traced(row) -> bool:
    """A traced backend's row: no training phase (None; NaN in files written before 2026-11-28,
    whose "aggregation" was the round minus the solve timed alone, blanked here too)."""
    training = row.get("training_s")
    return training is None or training != training


def _phases(row) -> str:
    solve = f"solve alone {row['solve_s']:.3f}"
    if _traced(row):  # the round is one program
        return f"one program; {solve}"
    return f"training {row['training_s']:.3f}, {solve}, aggregation {row['aggregation_s']:.3f}"


def markdown_table(rows) -> str:
    head = (
        "| curve | M | m | devices | s/round | CPU s/round | training | solve | aggregation | plan + sample | "
        "first round (compile) | peak RSS MiB | RSS after load | bytes/client |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )

    def f(x, d=3):
        return "-" if x is None else f"{x:.{d}f}"

    lines = []
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['curve']} | {row['num_clients']} | {row['participants']} | "
                f"{row.get('devices')} | error | | | | | | | | | |"
            )
            continue
        traced = _traced(row)
        training = None if traced else row["training_s"]
        aggregation = None if traced else row["aggregation_s"]
        lines.append(
            f"| {row['curve']} | {row['num_clients']:,} | {row['participants']:,} | "
            f"{row['device_count']} | {f(row['round_s'])} | {f(row.get('round_cpu_s'))} | "
            f"{f(training)} | {f(row['solve_s'])} | "
            f"{f(aggregation)} | {f((row['plan_s'] or 0) + row['sample_s'])} | "
            f"{f(row['first_round_s'], 1)} ({f(row['compile_s'], 1)}) | {f(_peak(row), 0)} | "
            f"{f(row['rss_after_load_mib'], 0)} | {f(row['bytes_per_client'], 0)} |"
        )
    table = head + "\n".join(lines)
    if any("error" not in row and _traced(row) for row in rows):
        table += (
            "\n\nA row whose training and aggregation are `-` ran a traced backend (`vmap_scan`, "
            "the accelerator default, or `vmap_chunked`): the round is one program, so its "
            "phases have no times of their own; the solve is timed alone beside it."
        )
    return table


def draw(rows, path: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, curve, x_name, title in (
        (axes[0], "M", "num_clients", "against M"),
        (axes[1], "m", "participants", "against participants m"),
    ):
        pts = sorted(
            (r for r in rows if r["curve"] == curve and "error" not in r),
            key=lambda r: r[x_name],
        )
        if not pts:
            continue
        x = [r[x_name] for r in pts]
        for key, label in (
            ("round_s", "round (total)"),
            ("round_cpu_s", "round, CPU s of the process"),
            ("training_s", "training"),
            ("solve_s", "FedPALS solve (alone)"),
            ("aggregate_phase_s", "engine's aggregate phase (solve + reduction)"),
        ):
            if all(r.get(key) is not None for r in pts):
                ax.plot(x, [max(r[key], 1e-5) for r in pts], "o-", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        fixed = pts[0]["participants"] if curve == "M" else pts[0]["num_clients"]
        ax.set_title(
            f"s per round {title} ({'m' if curve == 'M' else 'M'} = {fixed:,})"
        )
        ax.set_xlabel("clients M" if curve == "M" else "participants per round m")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    pts = sorted(
        (r for r in rows if r["curve"] == "M" and "error" not in r),
        key=lambda r: r["num_clients"],
    )
    if pts:
        x = [r["num_clients"] for r in pts]
        axes[2].plot(x, [_peak(r) for r in pts], "o-", label="peak RSS")
        axes[2].plot(
            x, [r["rss_after_load_mib"] for r in pts], "s--", label="RSS after loading"
        )
        axes[2].plot(
            x,
            [r["rss_start_mib"] + r["dataset_mib"] for r in pts],
            ":",
            label="start + data set once",
        )
        axes[2].set_xscale("log")
        axes[2].set_xlabel("clients M")
        axes[2].set_ylabel("MiB")
        axes[2].set_ylim(bottom=0)
        axes[2].set_title("memory against M")
        axes[2].grid(True, which="both", alpha=0.3)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    written = []
    for ext in ("png", "pdf"):
        out = f"{path}.{ext}"
        if os.path.dirname(out):
            os.makedirs(os.path.dirname(out), exist_ok=True)
        fig.savefig(out, dpi=80)
        written.append(out)
    plt.close(fig)
    return written


def runs_split(runs: int, num_clients: int, pairs: int, devices: str) -> dict:
    """One run's round and `runs` runs' round, alternated `pairs` times in this process.

    The bound it shows: a round of R runs costs at least R times one run's client
    training (`host_loop` trains each (run, client) alone: on a CPU a vmapped conv
    step is a grouped convolution, ~5x slower), so R runs together can save at
    most the per-round part of a solo round (plan, aggregate, dispatch), i.e.
    ratio >= train / (plan + train + aggregate) of the solo round.
    """
    import fedjax_pals as fjp

    fjp.configure_runtime(cpu_devices=devices if devices == "auto" else int(devices))
    import jax
    import jax.numpy as jnp

    from . import harness as bench

    settings = bench.BenchmarkSettings()
    model = bench.make_model("lenet")
    data = bench.synthetic_data("lenet", num_clients, settings.examples_per_client, 0)
    training = bench.local_training(settings)
    algorithm = fjp.fedavg()
    engine = fjp.engine.round_engine(algorithm, model, training)
    participants = np.arange(num_clients, dtype=np.int32)
    solo = fjp.init_server_state(
        algorithm, model.init(jax.random.PRNGKey(0)), num_clients
    )
    stack = lambda x: jnp.stack([x] * runs)
    states = jax.tree_util.tree_map(
        lambda *xs: jnp.stack(xs),
        *[
            fjp.init_server_state(
                algorithm, model.init(jax.random.PRNGKey(j)), num_clients
            )
            for j in range(runs)
        ],
    )
    runs_data = data._replace(
        client_indices=stack(data.client_indices),
        client_sizes=stack(data.client_sizes),
        client_label_dists=stack(data.client_label_dists),
    )
    key = jax.random.PRNGKey(1)

    def one(state, timings):
        t0 = time.perf_counter()
        out = jax.block_until_ready(
            engine.run_round(data, state, participants, key, timings=timings)
        )
        timings["wall"] = time.perf_counter() - t0
        return out[0]

    def many(states, timings):
        t0 = time.perf_counter()
        out = jax.block_until_ready(
            engine.run_rounds(
                runs_data,
                states,
                np.tile(participants, (runs, 1)),
                stack(key),
                timings=timings,
            )
        )
        timings["wall"] = time.perf_counter() - t0
        return out[0]

    for _ in range(2):  # compile and warm both
        solo = one(solo, {})
        states = many(states, {})
    solo_t, many_t = [], []
    for _ in range(pairs):
        t: dict = {}
        solo = one(solo, t)
        solo_t.append(t)
        t = {}
        states = many(states, t)
        many_t.append(t)

    def med(rows, name):
        return statistics.median(r.get(name, 0.0) for r in rows)

    ratios = [b["wall"] / (runs * a["wall"]) for a, b in zip(solo_t, many_t)]
    out = {
        "runs": runs,
        "num_clients": num_clients,
        "devices": jax.device_count(),
        "backend": engine.backend.name,
        "pairs": pairs,
        "solo": {k: med(solo_t, k) for k in ("wall", "plan", "train", "aggregate")},
        "together": {k: med(many_t, k) for k in ("wall", "plan", "train", "aggregate")},
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "ratio_of_medians": med(many_t, "wall") / (runs * med(solo_t, "wall")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    s = out["solo"]
    out["solo_train_fraction"] = s["train"] / s["wall"]
    out["together_train_per_run_vs_solo_train"] = out["together"]["train"] / (
        runs * s["train"]
    )
    return out


def main(argv):
    del argv
    if _FROM_JSON.value:
        rows = []
        for path in _FROM_JSON.value:
            with open(path) as f:
                rows += json.load(f)["rows"]
        plots = draw(rows, _PLOT.value) if _PLOT.value else []
        print(markdown_table(rows))
        print(f"# drew {plots}")
        return
    if _RUNS_SPLIT.value:
        out = runs_split(
            _RUNS_SPLIT.value,
            _RUNS_SPLIT_CLIENTS.value,
            _RUNS_SPLIT_PAIRS.value,
            _DEVICES.value,
        )
        print(json.dumps(out, indent=2))
        if os.path.dirname(_OUTPUT.value):
            os.makedirs(os.path.dirname(_OUTPUT.value), exist_ok=True)
        with open(_OUTPUT.value, "w") as f:
            json.dump(out, f, indent=2)
        return
    base = {
        "examples_per_client": _EXAMPLES.value,
        "batch_size": _BATCH.value,
        "local_epochs": _EPOCHS.value,
        "learning_rate": _LR.value,
        "beta": _BETA.value,
        "lam": _LAM.value,
        "backend": _BACKEND.value,
        "devices": _DEVICES.value,
        "rounds": _ROUNDS.value,
        "max_timed_seconds": _MAX_TIMED.value,
        "seed": _SEED.value,
    }
    if _POINT.value is not None:
        point_main({**base, **json.loads(_POINT.value)})
        return
    curves = {
        "M": [
            {
                "curve": "M",
                "num_clients": int(c),
                "participants": min(_PARTICIPANTS.value, int(c)),
            }
            for c in _NUM_CLIENTS.value
            if "M" in _CURVES.value
        ],
        "m": [
            {"curve": "m", "num_clients": _CURVE_CLIENTS.value, "participants": int(p)}
            for p in _PARTICIPANTS_CURVE.value
            if "m" in _CURVES.value
        ],
    }
    rows = []
    started = time.perf_counter()
    for specs in curves.values():
        if not specs:
            continue
        for row in run_points(
            [{**base, **spec} for spec in specs],
            _ROUNDS.value,
            _MAX_TIMED.value,
            log=lambda msg: print(msg, flush=True),
        ):
            rows.append(row)
            if "error" not in row:
                print(
                    f"# {row['curve']} M={row['num_clients']} m={row['participants']}: "
                    f"{row['round_s']:.3f} s/round ({_phases(row)}), peak RSS "
                    f"{_peak(row):.0f} MiB",
                    flush=True,
                )
    import jax

    result = {
        "command": " ".join(sys.argv),
        "settings": base,
        "rows": rows,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": jax.default_backend(),
            "jax_version": jax.__version__,
        },
        "total_seconds": time.perf_counter() - started,
    }
    m_rows = [r for r in rows if r["curve"] == "M" and "error" not in r]
    if len(m_rows) > 1:
        times = [r["round_s"] for r in m_rows]
        result["round_s_spread_over_M"] = max(times) / min(times) - 1
    if os.path.dirname(_OUTPUT.value):
        os.makedirs(os.path.dirname(_OUTPUT.value), exist_ok=True)
    with open(_OUTPUT.value, "w") as f:
        json.dump(result, f, indent=2)
    result["plots"] = draw(rows, _PLOT.value) if _PLOT.value else []
    table = markdown_table(rows)
    print(table)
    if "round_s_spread_over_M" in result:
        print(
            f"# time per round over M: max/min - 1 = {result['round_s_spread_over_M']:.1%}"
        )
    print(
        f"# wrote {_OUTPUT.value} and {result['plots']}; {result['total_seconds']:.0f} s"
    )


def entry() -> None:
    """The `fedjax-pals-benchmark-scaling` command (`python -m experiments.benchmarks.scaling`)."""
    cli.run(main)


if __name__ == "__main__":
    entry()
