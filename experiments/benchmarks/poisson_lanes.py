r"""What Poisson sampling's padding lanes cost a round: seconds per round of FedAvg with q M
clients drawn without replacement against Poisson sampling at rate q (its lanes:
`fjp.training.poisson_capacity`), per backend.

Interleaved A/B on one task: each repeat trains both for --rounds rounds and takes the median
gap between `on_round` calls after the first two rounds (compilation excluded); the row is the
median over --repeats. Writes JSON (one row per backend and sampling) to --output and prints it.

Usage:
  python -m experiments.benchmarks.poisson_lanes --output=results/poisson_lanes.json
  python -m experiments.benchmarks.poisson_lanes --backends=auto,vmap_chunked --repeats=2
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

from absl import flags

from .. import cli

_DATASET = flags.DEFINE_string("dataset", "fashion_mnist", "The data set (Table 1's partition).")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 1000, "Training clients M (the target is one "
                                    "more).")
_RATE = flags.DEFINE_float("sampling_rate", 0.1, "q: Poisson's rate; q M clients without "
                           "replacement.")
_BACKENDS = flags.DEFINE_list("backends", ["auto", "vmap_chunked"], "Engine backends to time.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Rounds per timed run (at least 4).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved repeats per backend.")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the JSON rows (optional).")


def _task(fjp, poisson: bool):
    config = fjp.default_config()
    config.dataset.name = _DATASET.value
    if config.dataset.name != "synthetic":
        config.partition.scheme = "sparsity"
        config.partition.labels_per_client = 3
        config.partition.num_clients = _NUM_CLIENTS.value + 1
    if poisson:
        config.training.client_sampling = "poisson"
        config.training.client_fraction = _RATE.value
    else:
        config.training.client_fraction = _RATE.value  # q M clients, without replacement
    return fjp.build_task(config)


def _seconds_per_round(fjp, task, backend: str) -> float:
    stamps = []
    fjp.run_training(
        task.algorithm, task.model, task.dataset, task.partition, task.training,
        rounds=_ROUNDS.value, eval_every=_ROUNDS.value, clients_per_round=task.clients_per_round,
        sampling_rate=task.sampling_rate, backend=backend,
        on_round=lambda r, loss: stamps.append(time.perf_counter()),
    )
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:])]
    return statistics.median(gaps)


def main(argv) -> None:
    if _ROUNDS.value < 4 or _REPEATS.value < 1:
        cli.usage_error("--rounds must be at least 4 and --repeats at least 1.")
    if not 0 < _RATE.value <= 1:
        cli.usage_error(f"--sampling_rate must be in (0, 1], got {_RATE.value}.")
    import fedjax_pals as fjp

    tasks = {"without_replacement": _task(fjp, False), "poisson": _task(fjp, True)}
    rows = []
    for backend in _BACKENDS.value:
        times: dict[str, list[float]] = {name: [] for name in tasks}
        for _ in range(_REPEATS.value):
            for name, task in tasks.items():
                times[name].append(_seconds_per_round(fjp, task, backend))
        for name, task in tasks.items():
            rows.append(dict(
                backend=backend, sampling=name, lanes=task.clients_per_round,
                seconds_per_round=statistics.median(times[name]), repeats=times[name],
                dataset=_DATASET.value, num_clients=task.partition.num_clients,
                sampling_rate=_RATE.value, rounds=_ROUNDS.value,
                machine=platform.machine(), cpus=os.cpu_count(),
            ))
    text = json.dumps(rows, indent=1)
    print(text)
    if _OUTPUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
        with open(_OUTPUT.value, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    cli.run(main)
