r"""The main job: FedPALS vs FedAvg on Fashion-MNIST under sparsity label shift.

  python -m experiments.demo [--output_dir=runs/demo] [--data_dir=...]

10 clients (9 training + the target), C = 3 labels per client, a few rounds
of one local epoch, 2 seeds; prints a comparison table and writes
comparison.png. If Fashion-MNIST cannot be had it says how to get it and
runs the paper's synthetic task (App. C.4) instead.
"""

from __future__ import annotations

import os

from absl import app, flags, logging

import fedjax_pals as fjp
from experiments import compare, run as run_lib

FLAGS = flags.FLAGS

DEMO_ROUNDS = 4
DEMO_SEEDS = [0, 1]


def demo_config(dataset: str) -> dict:
    config = {key: FLAGS[key].default for key in run_lib.CONFIG_KEYS}
    config.update(dataset=dataset, data_dir=FLAGS.data_dir)
    if dataset == "fashion_mnist":
        config.update(
            partition="sparsity",
            labels_per_client=3,
            num_clients=10,
            rounds=DEMO_ROUNDS,
            local_epochs=1,
            batch_size=32,
            learning_rate=0.1,
            eval_every=1,
            lam=0.0,  # alpha^0: the projection of T onto Conv(S) (eq. 7)
        )
    else:
        config.update(delta=0.5, rounds=30, batch_size=8, learning_rate=0.05, eval_every=1)
    return config


def main(argv):
    del argv
    output_dir = FLAGS.output_dir if FLAGS["output_dir"].present else "runs/demo"
    try:
        fjp.load_fashion_mnist(FLAGS.data_dir)
        dataset = "fashion_mnist"
    except fjp.DatasetUnavailableError as error:
        print(
            f"Fashion-MNIST is not available, so the demo runs the synthetic task instead.\n{error}"
        )
        dataset = "synthetic"
    config = demo_config(dataset)
    all_results = compare.run_comparison(
        config, ["fedavg", "fedpals"], DEMO_SEEDS, output_dir, overwrite=True
    )
    description = compare.comparison_title(all_results)
    table = compare.write_comparison(all_results, output_dir, description)
    logging.info("done")
    print(f"\nFedPALS vs FedAvg on {dataset}: {description}, {config['rounds']} rounds\n")
    print(table)
    print(f"\nwrote {os.path.join(output_dir, 'comparison.png')} and per-run results.json files")


if __name__ == "__main__":
    app.run(main)
