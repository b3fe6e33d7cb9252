r"""Runs a sweep config: every run in <workdir>/runs/<name>/, then the paper's selection protocol.

  python -m experiments.sweep --config=configs/table1_fmnist_c3.py --workdir=runs/table1_c3
  python -m experiments.sweep --config=configs/synthetic_fig9.py --workdir=runs/fig9 \
      --config.training.rounds=30 --config.sweep.seeds='(0,1)'

Every run's config is validated before anything runs. The same command again skips finished
runs and resumes the others from their checkpoints. With the protocol (the default) it prints
the Table-1-shaped table and writes <workdir>/table.md, table.json, comparison.png and the
figures the config names. `--list` prints the runs without running them. Sweep keys:
fedjax_pals/experiment/sweep.py; selection rule: fedjax_pals/experiment/protocol.py.
"""

from __future__ import annotations

import time

from absl import app, flags

import fedjax_pals as fjp
from experiments import flags as common

_CONFIG = common.define_config_file("config", None, "Sweep config file (configs/*.py).")
_LIST = flags.DEFINE_boolean("list", False, "Print the sweep's runs and exit.")
flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _LIST.value:
        with common.user_errors():
            runs = fjp.expand_sweep(_CONFIG.value)
        print("\n".join(name for name, _ in runs))
        print(f"{len(runs)} runs")
        return
    if common.WORKDIR.value is None:
        raise app.UsageError("--workdir is required (where the sweep's runs and table go).")
    common.configure_runtime()
    workdir = common.WORKDIR.value
    started = time.time()
    with common.user_errors():
        summary = fjp.run_sweep(
            _CONFIG.value,
            workdir,
            quiet=common.QUIET.value,
            overwrite=common.OVERWRITE.value,
            mlflow_tracking_uri=common.MLFLOW_TRACKING_URI.value,
        )
    failed = {name: s for name, s in summary["runs"].items() if s == "failed"}
    if not common.QUIET.value:
        for name, message in summary["errors"].items():
            print(f"{summary['runs'][name]}: {name}: {message}")
    if summary["markdown"] and fjp.is_main_process():
        print(f"\n{summary['markdown']}\n")
        common.print_written(workdir, started)
    if failed:
        raise SystemExit(f"error: {len(failed)} run(s) failed; see {workdir}/runs/<name>/error.txt")
    busy = [name for name, s in summary["runs"].items() if s == "busy"]
    if busy:
        raise SystemExit(
            f"error: {len(busy)} run(s) are held by another process (e.g. {busy[0]}); run the "
            "same command again once it has finished."
        )


if __name__ == "__main__":
    common.run(main)
