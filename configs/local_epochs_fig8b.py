r"""Fig. 8b: local epochs E in {1, 2, 5, 10, 20, 40} at a fixed budget E x rounds = 150.

  python -m experiments.sweep --config=configs/local_epochs_fig8b.py --workdir=runs/fig8b

The paper runs it on CIFAR-10 with C = 3 and 10 clients; here Fashion-MNIST C = 3 by default
(--config.dataset.name=cifar10 for the paper's). Rounds = ceil(150 / E): 150, 75, 30, 15, 8, 4
(E = 20 and 40 round up to 160 local epochs in total). One table row per E; FedPALS, FedAvg,
FedProx and SCAFFOLD with the protocol's grids (`fjp.protocol_grid`), selected on the target
validation set; 8 seeds.
"""

import math

import ml_collections

import fedjax_pals as fjp

EPOCHS = (1, 2, 5, 10, 20, 40)
BUDGET = 150  # E x rounds, the paper's 150 rounds at E = 1


def get_config():
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.partition.num_clients = 10
    config.training.rounds = BUDGET
    config.training.batch_size = 32
    config.training.eval_every = 1
    config.sweep = ml_collections.ConfigDict(
        dict(
            seeds=tuple(range(8)),
            methods=("fedpals", "fedavg", "fedprox", "scaffold"),
            grid=fjp.protocol_grid(),
            axes=dict(
                training=dict(
                    local_epochs=EPOCHS,
                    rounds=tuple(math.ceil(BUDGET / e) for e in EPOCHS),
                )
            ),
            zip_axes=True,
            figures=("curves", "accuracy_vs_axis"),
        )
    )
    return config
