r"""Runs a sweep config: every run in <workdir>/runs/<name>/, then the paper's selection protocol.

  python -m experiments.sweep --config=configs/table1_fmnist_c3.py --workdir=runs/table1_c3
  python -m experiments.sweep --config=configs/synthetic_fig9.py --workdir=runs/fig9 \
      --config.training.rounds=30 --config.sweep.seeds='(0,1)'

Every run's config is validated before anything runs. The same command again skips finished
runs (saying how many) and resumes the others from their checkpoints. Without a terminal it
prints a line per finished run (`[k/N] <run>: target acc ...`); Ctrl-C or SIGTERM stops it
with one line naming the interrupted run, its resume round and how many runs finished (exit
status 130 / 143). With the protocol (the default) it prints
the Table-1-shaped table and writes <workdir>/table.md, table.json, comparison.png and the
figures the config names. `--list` prints the runs without running them. Sweep keys:
fedjax_pals/experiment/sweep.py; selection rule: fedjax_pals/experiment/protocol.py.

One sweep over many jobs and hosts (a workdir on a shared file system; docs/guide/cluster.md):

  python -m experiments.sweep --config=C --workdir=W --shard=3/8     # shard 3 of 8 (0-based)
  python -m experiments.sweep --config=C --workdir=W --shard=auto    # in a Slurm / SGE array
  python -m experiments.sweep --workdir=W --collect                  # the table, once all ended
  python -m experiments.sweep --config=C --list --shard=3/8          # shard 3's runs and costs

A shard runs only its runs (fedjax_pals/experiment/shards.py: the split, the records); run
again, it resumes them. --collect writes the same table as the unsharded sweep, or names the
runs that have not ended and their shards (exit status 1); --allow_partial writes a table
marked partial instead.
"""

from __future__ import annotations

import time

from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_CONFIG = common.define_config_file(
    "config", None, "Sweep config file (configs/*.py); optional with --collect."
)
_LIST = flags.DEFINE_boolean(
    "list", False, "Print the sweep's runs (with --shard: that shard's runs) and exit."
)
_SHARD = flags.DEFINE_string(
    "shard",
    None,
    "Run only shard <index>/<count> of the sweep (0-based, e.g. 3/8), or 'auto': the task of "
    "a Slurm or Grid Engine array job (fedjax_pals.experiment.shards.SCHEDULERS).",
)
_COLLECT = flags.DEFINE_boolean(
    "collect",
    False,
    "Write the sweep's table and figures from its runs' results (after the shards have ended).",
)
_ALLOW_PARTIAL = flags.DEFINE_boolean(
    "allow_partial", False, "With --collect: write a table marked partial if some runs are missing."
)
_RESHARD = flags.DEFINE_boolean(
    "reshard",
    False,
    "Replace the workdir's recorded split by this command's (only once none of its shards runs).",
)


def _check_shard(value) -> bool:
    if value is not None:
        try:
            fjp.experiment.shards.parse_shard(value)
        except fjp.experiment.shards.ShardError as error:
            raise flags.ValidationError(str(error)) from None
    return True


flags.register_validator(_SHARD, _check_shard)
flags.register_multi_flags_validator(
    ["shard", "collect"],
    lambda f: not (f["shard"] is not None and f["collect"]),
    "--shard and --collect do not go together: run the shards, then one --collect.",
)
flags.register_multi_flags_validator(
    ["reshard", "collect"],
    lambda f: not (f["reshard"] and f["collect"]),
    "--reshard replaces the recorded split of shards that run (--shard) or of the whole sweep; "
    "--collect reads the split as it is.",
)
flags.register_multi_flags_validator(
    ["allow_partial", "collect"],
    lambda f: f["collect"] or not f["allow_partial"],
    "--allow_partial applies to --collect only.",
)


def _list(shard: fjp.experiment.shards.Shard | None) -> None:
    with common.user_errors():
        if shard is None:
            names = [name for name, _ in fjp.expand_sweep(_CONFIG.value)]
            print("\n".join(names))
            print(f"{len(names)} runs")
            return
        split = fjp.experiment.shards.split_sweep(_CONFIG.value, shard.count)
    mine = [(name, cost) for name, s, cost in split if s == shard.index]
    for name, cost in mine:
        print(f"{name}  (cost {cost:.3g})")
    total = sum(cost for _, _, cost in split)
    share = sum(cost for _, cost in mine) / max(total, 1e-30)
    print(
        f"shard {shard}: {len(mine)} of {len(split)} runs, {100 * share:.1f} % of the estimated "
        "cost (fedjax_pals/experiment/shards.py, run_cost)"
    )


def _collect(workdir: str, started: float) -> None:
    try:
        summary = fjp.collect_sweep(
            workdir, _CONFIG.value, allow_partial=_ALLOW_PARTIAL.value
        )
    except fjp.experiment.shards.NoSweepError as error:
        common.usage_error(str(error))
    except fjp.experiment.shards.SweepIncompleteError as error:
        raise SystemExit(f"error: {error}") from None
    except fjp.ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    if summary["markdown"] and fjp.is_main_process():
        print(f"\n{summary['markdown']}\n")
        if summary["missing"]:
            print(f"partial: {len(summary['missing'])} run(s) missing, e.g. {summary['missing'][0]}")
        common.print_written(workdir, started)


def _run_shard(workdir: str) -> None:
    with common.user_errors():
        summary = fjp.run_shard(
            _CONFIG.value,
            workdir,
            _SHARD.value,
            quiet=common.QUIET.value,
            overwrite=common.OVERWRITE.value,
            mlflow_tracking_uri=common.MLFLOW_TRACKING_URI.value,
            mlflow_experiment=common.MLFLOW_EXPERIMENT.value,
            reshard=_RESHARD.value,
        )
    counts: dict[str, int] = {}
    for status in summary["runs"].values():
        counts[status] = counts.get(status, 0) + 1
    if fjp.is_main_process():  # --quiet silences progress and logs, not the outcome
        for name, message in summary["errors"].items():
            print(f"{summary['runs'][name]}: {name}: {message}")
        done = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
        print(
            f"shard {summary['shard']}: {done} (of {summary['total_runs']} runs in the sweep). "
            f"Once every shard has ended: {common.command_for('sweep')} --workdir={workdir} "
            "--collect"
        )
    failed = [name for name, s in summary["runs"].items() if s == "failed"]
    if failed:
        raise SystemExit(f"error: {len(failed)} run(s) failed; see {workdir}/runs/<name>/error.txt")


def main(argv):
    del argv  # a stray argument is refused by common.run
    shard = fjp.experiment.shards.parse_shard(_SHARD.value) if _SHARD.value is not None else None
    if _LIST.value:
        if _CONFIG.value is None:
            common.usage_error("--config is required (the sweep to list).")
        _list(shard)
        return
    if not common.WORKDIR.value:
        common.usage_error("--workdir is required (where the sweep's runs and table go).")
    workdir = common.WORKDIR.value
    if _CONFIG.value is None and not _COLLECT.value:
        common.usage_error("--config is required (the sweep config file).")
    started = time.time()
    if _COLLECT.value:
        _collect(workdir, started)
        return
    common.configure_runtime()
    if shard is not None:
        _run_shard(workdir)
        return
    with common.user_errors():
        summary = fjp.run_sweep(
            _CONFIG.value,
            workdir,
            quiet=common.QUIET.value,
            overwrite=common.OVERWRITE.value,
            mlflow_tracking_uri=common.MLFLOW_TRACKING_URI.value,
            mlflow_experiment=common.MLFLOW_EXPERIMENT.value,
            reshard=_RESHARD.value,
        )
    failed = {name: s for name, s in summary["runs"].items() if s == "failed"}
    if fjp.is_main_process():  # --quiet silences progress and logs, not the outcome
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


def entry() -> None:
    """The `fedjax-pals-sweep` command (`python -m experiments.sweep`)."""
    common.run(main, takes=common.TRAINS + common.RUNTIME)


if __name__ == "__main__":
    entry()
