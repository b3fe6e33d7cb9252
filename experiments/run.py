r"""One run from a config file, in a workdir (resumable).

  python -m experiments.run --config=configs/default.py --workdir=runs/fmnist_c3_fedpals \
      --config.algorithm.ess_fraction=0.5 --config.training.rounds=50

Writes <workdir>/results.json (rewritten at every evaluation), checkpoints/ (orbax, with the
config inside), metrics.jsonl/.csv, TensorBoard event files (`tensorboard --logdir <workdir>`)
and curves.png.
The same command again resumes where a killed run stopped; another config in the same workdir
is refused unless --overwrite. Config keys: fedjax_pals/experiment/config.py.
Without a terminal (a log file, `tee`, CI) it prints a line per evaluation (round, target and
validation accuracy, ETA). Ctrl-C or SIGTERM stops it with one line: the round it reached and
the round the same command resumes from (the last checkpoint's); exit status 130 / 143.
"""

from __future__ import annotations

import time

_STARTED = time.monotonic()  # this launch's time counts its imports too

from absl import flags  # noqa: E402

from . import flags as common  # noqa: E402

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_CONFIG = common.define_config_file("config", None, "Config file (configs/*.py).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv  # a stray argument is refused by common.run
    if _CONFIG.value.get("sweep"):  # the library's message names fjp.run_sweep, not a command
        raise SystemExit(
            "error: config.sweep is set: this config describes a sweep of runs; run it with "
            f"{common.command_for('sweep')}, or delete config.sweep for one run."
        )
    common.configure_runtime()
    started = time.time()
    with common.user_errors():
        results = fjp.train_and_evaluate(
            _CONFIG.value,
            common.WORKDIR.value,
            overwrite=common.OVERWRITE.value,
            quiet=common.QUIET.value,
            mlflow_tracking_uri=common.MLFLOW_TRACKING_URI.value,
            mlflow_experiment=common.MLFLOW_EXPERIMENT.value,
        )
    if not fjp.is_main_process():  # --quiet silences progress and logs, not the results
        return
    # This launch's time; after a resume or an extension, the training time of all launches too.
    last_start = fjp.experiment.interruption.ACTIVITY.last_start
    print(fjp.experiment.progress.result_line(results, time.monotonic() - _STARTED, last_start))
    common.print_written(common.WORKDIR.value, started)


def entry() -> None:
    """The `fedjax-pals-run` command (`python -m experiments.run`)."""
    common.run(main, takes=common.TRAINS + common.RUNTIME)


if __name__ == "__main__":
    entry()
