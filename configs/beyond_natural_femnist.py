r"""FedPALS vs FedAvg on natural clients: FEMNIST-shaped writers read from federated files.

  python -m experiments.benchmarks.femnist_copy --out /tmp/femnist_small --clients 40 --formats leaf
  python -m experiments.sweep --config=configs/beyond_natural_femnist.py \
      --config.dataset.data_dir=/tmp/femnist_small/leaf --workdir=runs/natural_leaf
  # the same clients from TFF's SQLite file:
  #   --config.dataset.name=tff_sqlite \
  #   --config.dataset.data_dir=/tmp/femnist_small/tff/femnist_copy.sqlite

Every writer of the files is a client (the scheme "natural"); the writers whose names match
f000* (ten of them) together are the target, validated on their training examples and tested
on their own test examples. LEAF's and TFF's FEMNIST store 784 values an image:
dataset.input_shape makes them 28x28x1, so model=auto is LeNet. 10 rounds of one local epoch
(batch 32, learning rate 0.05), every client every round, seeds 0 and 1 (docs/guide/
natural_data.md). The real FEMNIST: point data_dir at LEAF's data/femnist/data (run with
-t sample) or at TFF's emnist SQLite file.
"""

import os

import ml_collections

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "leaf"
    # The copy's directory: --config.dataset.data_dir, or $FEDJAX_PALS_FEMNIST_DIR.
    config.dataset.data_dir = os.environ.get("FEDJAX_PALS_FEMNIST_DIR")
    config.dataset.input_shape = (28, 28, 1)
    config.dataset.num_classes = 62
    config.partition.scheme = "natural"
    config.partition.target_group = "f000*"
    config.model = "auto"
    config.training.update(rounds=10, local_epochs=1, batch_size=32, learning_rate=0.05,
                           eval_every=1)
    config.sweep = ml_collections.ConfigDict(
        dict(seeds=(0, 1), methods=("fedavg", "fedpals"), protocol=True, figures=("curves",)))
    return config
