r"""The demo (the README's main job): FedPALS vs FedAvg on Fashion-MNIST, sparsity C = 3.

  python -m experiments.demo                       # this config, workdir runs/demo
  python -m experiments.sweep --config=configs/demo.py --workdir=runs/demo

10 clients (9 training + the target), 4 rounds of one local epoch, 2 seeds. FedPALS with
lam = 0: alpha^0, the projection of T onto the clients' convex hull (eq. 7). A small sweep
(seeds x methods); the table is the paper's protocol applied to it (no hyperparameter grid).
Without Fashion-MNIST, `experiments.demo` runs the synthetic task instead (App. C.4).
"""

import ml_collections

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.partition.num_clients = 10
    # lam unset: FedPALS runs with lam = 0 (recorded so); an override may give ess_fraction.
    config.training.rounds = 4
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.learning_rate = 0.1
    config.training.eval_every = 1
    config.sweep = ml_collections.ConfigDict(
        dict(seeds=(0, 1), methods=("fedavg", "fedpals"), protocol=True, figures=("curves",))
    )
    return config
