"""Natural federated data at the size of FEMNIST: load time, peak memory and a round's time.

Reads the FEMNIST-sized copy that `experiments.benchmarks.femnist_copy` writes (3,400 writers,
~700,000 28x28 images, 62 classes) through the package's readers, each measurement in a child
process of its own (so its peak resident memory is its own):

* **load**, per format (LEAF JSON, TFF SQLite): seconds of `fjp.load_dataset`, the resident
  memory after importing the package (the baseline: the interpreter, NumPy, JAX), the peak
  while loading (/proc's VmHWM, reset after the baseline), and what stays resident after, next
  to the data's own size as uint8. The reader streams client by client into arrays allocated
  once, so the peak over the baseline should stay below twice the uint8 size.
* **round**: one FedAvg round of LeNet (the config's defaults: 1 local epoch, batch 32) on the
  natural partition of the TFF copy (every writer a client, the writers f000* the target), with
  10, 100 and 1,000 participants: the median of the rounds after the first (which compiles), and
  the first.

Usage:
  python -m experiments.benchmarks.femnist_copy --out /tmp/femnist_copy
  python -m experiments.benchmarks.natural_data --copy /tmp/femnist_copy \
      --output results/natural_data.json
Prints a table (Markdown) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from experiments.benchmarks import memory

FORMATS = {"leaf": "leaf", "tff_sqlite": os.path.join("tff", "femnist_copy.sqlite")}


def _child_load(fmt: str, path: str) -> dict:
    import fedjax_pals as fjp  # the baseline includes JAX: a run imports it anyway

    baseline = memory.rss_mib()
    memory.reset_peak_rss()
    started = time.perf_counter()
    dataset = fjp.load_dataset(fmt, data_dir=path, input_shape=(28, 28, 1))
    seconds = time.perf_counter() - started
    data_bytes = sum(a.nbytes for a in (dataset.train.x, dataset.test.x))
    return {
        "format": fmt, "load_s": seconds, "baseline_mib": baseline,
        "peak_mib": memory.peak_rss_mib(), "after_mib": memory.rss_mib(),
        "uint8_mib": data_bytes / 2**20, "dtype": str(dataset.train.x.dtype),
        "num_train": len(dataset.train), "num_test": len(dataset.test),
        "clients": dataset.num_client_ids,
    }


def _child_round(path: str, participants: int, rounds: int) -> dict:
    import fedjax_pals as fjp
    from fedjax_pals.experiment.task import build_task

    config = {
        "dataset": {"name": "tff_sqlite", "data_dir": path, "input_shape": (28, 28, 1)},
        "partition": {"scheme": "natural", "target_group": "f000*"},
        "algorithm": {"name": "fedavg"},
        "model": "lenet",
        "training": {"rounds": rounds, "clients_per_round": participants,
                     "eval_every": rounds},
    }
    started = time.perf_counter()
    task = build_task(config)
    build_s = time.perf_counter() - started
    stamps = [time.perf_counter()]
    fjp.run_training(
        task.algorithm, task.model, task.dataset, task.partition, task.training,
        rounds=rounds, clients_per_round=participants, eval_every=rounds,
        on_round=lambda r, loss: stamps.append(time.perf_counter()),
    )
    per_round = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "participants": participants, "clients": task.partition.num_clients,
        "build_s": build_s, "first_round_s": per_round[0],
        "round_s": statistics.median(per_round[1:]), "rounds_timed": len(per_round) - 1,
        "peak_mib": memory.peak_rss_mib(),
    }


def _in_child(args: list[str]) -> dict:
    command = [sys.executable, "-m", "experiments.benchmarks.natural_data", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copy", help="the directory femnist_copy wrote")
    parser.add_argument("--output", default="results/natural_data.json")
    parser.add_argument("--participants", default="10,100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", default="leaf,tff_sqlite")
    parser.add_argument("--child", choices=("load", "round"), help=argparse.SUPPRESS)
    parser.add_argument("--format", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "load":
        print(json.dumps(_child_load(args.format, args.path)))
        return 0
    if args.child == "round":
        print(json.dumps(_child_round(args.path, int(args.participants), args.rounds)))
        return 0
    if not args.copy:
        parser.error("--copy is required (the directory experiments.benchmarks.femnist_copy "
                     "wrote)")
    loads, rounds = [], []
    for fmt in args.formats.split(","):
        path = os.path.join(args.copy, FORMATS[fmt])
        print(f"[natural_data] loading {fmt} from {path} ...", flush=True)
        loads.append(_in_child(["--child", "load", "--format", fmt, "--path", path]))
        print(json.dumps(loads[-1]), flush=True)
    tff = os.path.join(args.copy, FORMATS["tff_sqlite"])
    for m in (int(v) for v in args.participants.split(",")):
        print(f"[natural_data] a round with {m} participants ...", flush=True)
        rounds.append(_in_child(["--child", "round", "--path", tff, "--participants", str(m),
                                 "--rounds", str(args.rounds)]))
        print(json.dumps(rounds[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    record = {"commit": commit, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "loads": loads, "rounds": rounds}
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(record, f, indent=1)
    print("\n| format | examples | clients | as uint8 | load | baseline RSS | peak RSS | "
          "peak - baseline |\n|---|---|---|---|---|---|---|---|")
    for r in loads:
        print(f"| {r['format']} | {r['num_train']:,} + {r['num_test']:,} | {r['clients']:,} | "
              f"{r['uint8_mib']:.0f} MiB | {r['load_s']:.0f} s | {r['baseline_mib']:.0f} MiB | "
              f"{r['peak_mib']:.0f} MiB | {r['peak_mib'] - r['baseline_mib']:.0f} MiB "
              f"({(r['peak_mib'] - r['baseline_mib']) / r['uint8_mib']:.2f}x) |")
    print("\n| participants | round (median) | first round (compiles) | peak RSS |\n|---|---|---|---|")
    for r in rounds:
        print(f"| {r['participants']:,} | {r['round_s']:.2f} s | {r['first_round_s']:.1f} s | "
              f"{r['peak_mib']:.0f} MiB |")
    print(f"\nwritten: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
