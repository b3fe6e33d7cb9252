r"""One run from a config file, in a workdir (resumable).

  python -m experiments.run --config=configs/default.py --workdir=runs/fmnist_c3_fedpals \
      --config.algorithm.ess_fraction=0.25 --config.training.rounds=50

Writes <workdir>/results.json (rewritten at every evaluation), checkpoints/ (orbax, with the
config inside), metrics.jsonl/.csv, TensorBoard event files (`tensorboard --logdir <workdir>`)
and curves.png.
The same command again resumes where a killed run stopped; another config in the same workdir
is refused unless --overwrite. Config keys: fedjax_pals/experiment/config.py.
"""

from __future__ import annotations

import time

from absl import flags

import fedjax_pals as fjp
from experiments import flags as common

_CONFIG = common.define_config_file("config", None, "Config file (configs/*.py).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv  # a stray argument is refused by common.run
    common.configure_runtime()
    started = time.time()
    with common.user_errors():
        results = fjp.train_and_evaluate(
            _CONFIG.value,
            common.WORKDIR.value,
            overwrite=common.OVERWRITE.value,
            quiet=common.QUIET.value,
            mlflow_tracking_uri=common.MLFLOW_TRACKING_URI.value,
        )
    if common.QUIET.value or not fjp.is_main_process():
        return
    print(
        f"final target accuracy {results['final_target_accuracy']:.4f}; "
        f"at best val (round {results['best_val_round']}) "
        f"{results['target_accuracy_at_best_val']:.4f}; {results['wall_seconds']:.1f}s"
    )
    common.print_written(common.WORKDIR.value, started)


if __name__ == "__main__":
    common.run(main)
