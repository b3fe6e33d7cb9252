r"""Number of clients (the paper's Fig. 8c, App. C.3): 10, 50 and 100 clients, C = 3.

  python -m experiments.sweep --config=configs/num_clients_fig9c.py --workdir=runs/num_clients

Client counts include the target. As in App. C.3, with 50 and 100 clients a fraction 0.1 of
the training clients is sampled each round and FedPALS' weights are re-solved for the
participants every round; 10 clients all take part (set
--config.sweep.axes.training.client_fraction='(0.1,0.1,0.1)' for 10 % everywhere). The paper
runs CIFAR-10; here Fashion-MNIST by default. FedPALS, FedAvg, FedProx and SCAFFOLD with the
protocol's grids, selected on the target validation set; 8 seeds; 150 rounds.
"""

import ml_collections

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.training.rounds = 150
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.eval_every = 1
    config.sweep = ml_collections.ConfigDict(
        dict(
            seeds=tuple(range(8)),
            methods=("fedpals", "fedavg", "fedprox", "scaffold"),
            grid=fjp.protocol_grid(),
            axes=dict(
                partition=dict(num_clients=(10, 50, 100)),
                training=dict(client_fraction=(1.0, 0.1, 0.1)),
            ),
            zip_axes=True,
            figures=("curves", "accuracy_vs_axis"),
        )
    )
    return config
