r"""One LeNet client step: the engine's (XLA) vs the plain loop's vs PyTorch's, side by side.

The step: batch 32 of 28x28x1 float32 inputs gathered from a device array,
conv 5x5 1->6, ReLU, max-pool 2, conv 5x5 6->16, ReLU, max-pool 2, dense
256-120-84-10 (ReLU), softmax cross-entropy, SGD (lr 0.1). Cases:

* `engine`: the engine's local step (`fjp.engine.make_client_update(...).step`, FedAvg;
  what every backend maps over the clients) as the CPU default backend
  (host_loop) calls it by default: one step per jitted call, the batch gathered
  inside. `engine_4steps`: the same with 4 steps unrolled per call
  (`steps_per_call=4`, the default until it measured slower per step).
* `plain_loop`: the benchmark's plain loop step (`BaselineLoop`, the ratio's
  reference in experiments/benchmarks/round.py), one step per call.
* `flax_nhwc`: the plain loop's step with flax's own `_LeNet.apply` (NHWC
  `lax.conv`), the formulation the engine used before
  (docs/decisions/0008-lenet-step-on-cpu.md).
* `torch_channels_last`, `torch_nchw`: the same step in PyTorch eager, 1 thread
  (`torch.set_num_threads(1)`, OMP_WAIT_POLICY=PASSIVE), channels_last
  (oneDNN) and NCHW memory formats.

Each framework runs in a worker process of its own: JAX in this interpreter's
environment, PyTorch in `--torch_python` (a separate venv: PyTorch is never a
dependency of the project). The parent holds no framework; it tells one worker
at a time to time `--steps` steps of one case, round-robin over the cases, so
that load on a shared machine hits every case alike (the idle worker blocks on
a read). Reported per case: the median (and range) over `--reps` of
client-steps/s by wall clock and by the worker's CPU time, and the ratios to
PyTorch channels_last and to the plain loop. Writes JSON and prints a Markdown
table.

Usage:
  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0
  python -m experiments.benchmarks.torch_step --torch_python=/tmp/torchvenv/bin/python
  python -m experiments.benchmarks.torch_step --jax_threads=1 --output=results/torch_step.json
  python -m experiments.benchmarks.torch_step --torch_python=/tmp/torchvenv/bin/python --pin_core=1
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time

BATCH = 32
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
LEARNING_RATE = 0.1
NUM_EXAMPLES = 2048
JAX_CASES = ("engine", "engine_4steps", "plain_loop", "flax_nhwc")
UNROLLED_STEPS = 4  # the `engine_4steps` case's steps per call
TORCH_CASES = ("torch_channels_last", "torch_nchw")
REFERENCE = "torch_channels_last"
_PREFIX = "@@fjp-step "


def _batches(num_steps: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(NUM_EXAMPLES, *INPUT_SHAPE)).astype(np.float32)
    y = rng.integers(0, NUM_CLASSES, size=NUM_EXAMPLES).astype(np.int32)
    idx = rng.integers(0, NUM_EXAMPLES, size=(num_steps, BATCH)).astype(np.int32)
    return x, y, idx


# ----------------------------------------------------------------------------
# Workers: each answers {"case", "steps"} with {"wall_s", "cpu_s"}.


def _jax_cases(steps: int) -> dict:
    """Case name -> run(n) that takes n steps of it (blocking at the end)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import fedjax_pals as fjp
    from .harness import BaselineLoop
    from fedjax_pals.models import Model, _LeNet

    model = fjp.lenet(INPUT_SHAPE, NUM_CLASSES)
    module = _LeNet(NUM_CLASSES)
    flax_model = Model(
        "lenet_flax",
        model.init,
        lambda p, x: module.apply({"params": p}, x),
        NUM_CLASSES,
        True,
    )
    training = fjp.LocalTraining(local_epochs=1, batch_size=BATCH, learning_rate=LEARNING_RATE)
    x_np, y_np, idx_np = _batches(steps)
    train_x, train_y = jnp.asarray(x_np), jnp.asarray(y_np)
    batches = jnp.asarray(idx_np)[None]  # (1 client, S, B)
    params = model.init(jax.random.PRNGKey(0))
    cases = {}

    for name, m in (("plain_loop", model), ("flax_nhwc", flax_model)):
        loop = BaselineLoop(m, training)

        def run(n, loop=loop, state=[params, loop.optimizer.init(params)]):
            p, s = state
            for t in range(n):
                p, s, _ = loop._step(
                    p, s, train_x, train_y, batches, np.int32(0), np.int32(t % steps)
                )
            jax.block_until_ready(p)

        cases[name] = run

    algorithm = fjp.fedavg()
    update = fjp.engine.make_client_update(algorithm, model, training)
    server = fjp.init_server_state(algorithm, params, num_clients=1)
    info = fjp.ClientInfo(
        jnp.full((NUM_CLASSES,), 1.0 / NUM_CLASSES, jnp.float32),
        jnp.int32(NUM_EXAMPLES),
        jax.tree_util.tree_map(lambda leaf: leaf[0], server.client_states),
    )
    mask = jnp.ones((BATCH,), bool)
    carry0 = jax.jit(update.start)(server)

    def block(carry, t0, k):
        # As the host_loop backend's call: k local steps unrolled, the batches gathered inside.
        for i in range(k):
            rows = batches[0, (t0 + i) % steps]
            carry = update.step(carry, train_x[rows], train_y[rows], mask, info, server)
        return carry

    blocks = {
        k: jax.jit(functools.partial(block, k=k), donate_argnums=(0,)) for k in (1, UNROLLED_STEPS)
    }

    def engine_case(k):
        def run(n, state=[carry0]):
            carry = jax.tree_util.tree_map(jnp.copy, state[0])
            t = 0
            while t < n:
                size = k if n - t >= k else 1
                carry = blocks[size](carry, np.int32(t))
                t += size
            jax.block_until_ready(carry)

        return run

    cases["engine"] = engine_case(1)
    cases["engine_4steps"] = engine_case(UNROLLED_STEPS)
    return cases


def _torch_cases(steps: int) -> dict:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    x_np, y_np, idx_np = _batches(steps)
    train_x = torch.from_numpy(x_np).permute(0, 3, 1, 2).contiguous()  # (N, 1, 28, 28)
    train_y = torch.from_numpy(y_np).long()
    idx = torch.from_numpy(idx_np).long()
    cases = {}
    for name, fmt in (
        ("torch_channels_last", torch.channels_last),
        ("torch_nchw", torch.contiguous_format),
    ):
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Conv2d(1, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(256, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, NUM_CLASSES),
        ).to(memory_format=fmt)
        opt = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
        loss_fn = nn.CrossEntropyLoss()
        data_x = train_x.contiguous(memory_format=fmt)

        def run(n, net=net, opt=opt, data_x=data_x, fmt=fmt):
            for t in range(n):
                rows = idx[t % steps]
                xb = data_x[rows].contiguous(memory_format=fmt)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(net(xb), train_y[rows])
                loss.backward()
                opt.step()

        cases[name] = run
    return cases


def _versions(kind: str) -> dict:
    if kind == "jax":
        import jax
        import jaxlib

        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    import torch

    return {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
    }


def worker(kind: str, steps: int) -> None:
    """Builds the cases, warms them up, then answers timing commands from stdin."""
    cases = _jax_cases(steps) if kind == "jax" else _torch_cases(steps)
    for run in cases.values():
        run(5)
    print(_PREFIX + json.dumps({"cases": list(cases), **_versions(kind)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "exit":
            break
        run = cases[cmd["case"]]
        wall, cpu = time.perf_counter(), time.process_time()
        run(cmd["steps"])
        out = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        print(_PREFIX + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------
# The parent


class _Worker:
    def __init__(self, kind: str, python: str, steps: int, env: dict, core: int | None = None):
        cmd = [python, "-m", "experiments.benchmarks.torch_step", f"--worker={kind}"]
        cmd.append(f"--steps={steps}")
        # The repository root (this file is experiments/benchmarks/torch_step.py).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**env, "PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")}
        # Pinned before the interpreter starts: every thread the framework makes stays there.
        pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
            preexec_fn=pin,
        )
        self.info = self.recv()

    def recv(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(_PREFIX):
                return json.loads(line[len(_PREFIX) :])
        raise RuntimeError(f"worker exited (rc {self.proc.wait()})")

    def time(self, case: str, steps: int) -> dict:
        self.proc.stdin.write(json.dumps({"case": case, "steps": steps}) + "\n")
        self.proc.stdin.flush()
        return self.recv()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _torch_python(requested: str | None) -> str | None:
    """The interpreter for the PyTorch worker: the flag's, else this one, if it imports torch."""
    python = requested or sys.executable
    try:
        probe = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    except OSError:
        return None
    return python if probe.returncode == 0 else None


def summarize(times: dict, steps: int) -> list[dict]:
    """Rows per case: medians and ranges of steps/s (wall and CPU) and ratios."""
    rows = []
    for case, reps in times.items():
        wall = [steps / r["wall_s"] for r in reps]
        cpu = [steps / r["cpu_s"] for r in reps if r["cpu_s"] > 0]
        rows.append(
            {
                "case": case,
                "client_steps_per_s": statistics.median(wall),
                "client_steps_per_s_range": [min(wall), max(wall)],
                "client_steps_per_cpu_s": statistics.median(cpu) if cpu else None,
                "client_steps_per_cpu_s_range": [min(cpu), max(cpu)] if cpu else None,
                "wall_s": [r["wall_s"] for r in reps],
            }
        )
    by_case = {r["case"]: r for r in rows}
    for ref_key, ref_case in (
        ("vs_torch_channels_last", REFERENCE),
        ("vs_plain_loop", "plain_loop"),
    ):
        ref = by_case.get(ref_case)
        for r in rows:
            if ref is None:
                r[ref_key] = r[ref_key + "_cpu"] = None
                continue
            r[ref_key] = r["client_steps_per_s"] / ref["client_steps_per_s"]
            cpu, ref_cpu = r["client_steps_per_cpu_s"], ref["client_steps_per_cpu_s"]
            r[ref_key + "_cpu"] = cpu / ref_cpu if cpu and ref_cpu else None
    return rows


def markdown_table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = [
        "| case | client-steps/s (median, range) | per CPU-s | vs torch channels_last "
        "(wall / CPU) | vs plain loop (wall / CPU) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["client_steps_per_s_range"]
        lines.append(
            f"| {r['case']} | {r['client_steps_per_s']:.0f} ({lo:.0f}-{hi:.0f}) | "
            f"{f(r['client_steps_per_cpu_s'], '.0f')} | "
            f"{f(r['vs_torch_channels_last'], '.2f')} / {f(r['vs_torch_channels_last_cpu'], '.2f')} | "
            f"{f(r['vs_plain_loop'], '.2f')} / {f(r['vs_plain_loop_cpu'], '.2f')} |"
        )
    return "\n".join(lines)


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def run(
    *,
    steps: int = 80,
    reps: int = 5,
    torch_python: str | None = None,
    jax_threads: str = "default",
    pin_core: int | None = None,
) -> dict:
    """Times every case (round-robin, `reps` x `steps` steps); the JSON object.

    With `pin_core`, every worker process (all its threads) runs on that one core: its
    wall-clock rate is then the framework's rate per core, whatever threads it starts.
    """
    env = dict(os.environ)
    if jax_threads == "1":
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    workers = {"jax": _Worker("jax", sys.executable, steps, env, pin_core)}
    python = _torch_python(torch_python)
    try:
        if python is not None:
            torch_env = {**env, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
            workers["torch"] = _Worker("torch", python, steps, torch_env, pin_core)
        order = [(w, c) for w in workers.values() for c in w.info["cases"]]
        load_start = _load()
        times = {c: [] for _, c in order}
        for _ in range(reps):
            for w, c in order:
                times[c].append(w.time(c, steps))
        rows = summarize(times, steps)
    finally:
        for w in workers.values():
            w.close()
    return {
        "config": {
            "batch_size": BATCH,
            "input_shape": list(INPUT_SHAPE),
            "steps_per_rep": steps,
            "reps": reps,
            "jax_threads": jax_threads,
            "pin_core": pin_core,
            "torch_python": python,
            "torch": "missing" if python is None else "ok",
        },
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_start": load_start,
            "load_average_end": _load(),
            **{k: v for w in workers.values() for k, v in w.info.items() if k != "cases"},
        },
        "results": rows,
        "markdown_table": markdown_table(rows),
    }


class _ArgumentParser(argparse.ArgumentParser):
    """argparse with the mains' convention for a command-line mistake: one `error:` line,
    exit status 2 (not the usage text). Not `experiments.cli`: the PyTorch worker runs this
    module in a venv without absl."""

    def error(self, message: str):
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> None:
    parser = _ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80, help="Steps per timed repetition.")
    parser.add_argument("--reps", type=int, default=5, help="Repetitions (median reported).")
    parser.add_argument(
        "--torch_python",
        default=None,
        help="Python with torch installed (a separate venv); default: this one, if it has torch.",
    )
    parser.add_argument(
        "--jax_threads",
        choices=("default", "1"),
        default="default",
        help="'1': XLA without its intra-op thread pool (--xla_cpu_multi_thread_eigen=false).",
    )
    parser.add_argument(
        "--pin_core",
        type=int,
        default=None,
        help="Run every worker on this one core (os.sched_setaffinity): rates per core.",
    )
    parser.add_argument("--output", default="results/torch_step.json")
    parser.add_argument("--worker", choices=("jax", "torch"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.reps < 1:
        parser.error("--steps and --reps must be >= 1.")
    if not args.output.strip():
        parser.error("--output needs a file path.")
    if args.torch_python is not None and not os.access(args.torch_python, os.X_OK):
        parser.error(f"--torch_python={args.torch_python} is not an executable file.")
    if args.pin_core is not None and args.pin_core not in os.sched_getaffinity(0):
        parser.error(
            f"--pin_core={args.pin_core} is not among this process's cores "
            f"{sorted(os.sched_getaffinity(0))}."
        )
    if args.worker:
        worker(args.worker, args.steps)
        return
    result = run(
        steps=args.steps,
        reps=args.reps,
        torch_python=args.torch_python,
        jax_threads=args.jax_threads,
        pin_core=args.pin_core,
    )
    if result["config"]["torch"] == "missing":
        print("# torch is not importable: timing the JAX cases only (see --torch_python).")
    out_dir = os.path.dirname(args.output)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2)
    m = result["machine"]
    print(
        f"# {m['cpu_count']} CPUs, load average {m['load_average_start']} at start, "
        f"{m['load_average_end']} at end; {args.reps} x {args.steps} steps, round-robin"
    )
    print(result["markdown_table"])
    print(f"# wrote {args.output}")


if __name__ == "__main__":
    main()
