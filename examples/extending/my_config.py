r"""One FedNova run on the blobs data set with the MLP, all three from my_extension.py.

  python -m fedjax_pals_experiments.run --config=my_config.py --workdir=runs/fednova
"""

import fedjax_pals as fjp

import my_extension  # noqa: F401  (registers fednova, my_mlp and blobs)


def get_config():
    config = fjp.default_config()
    config.dataset.name = "blobs"
    config.partition.scheme = "dirichlet"
    config.partition.dirichlet_beta = 0.3
    config.partition.num_clients = 6  # 5 training clients + the target
    config.model = "my_mlp"
    config.algorithm.name = "fednova"
    config.algorithm.nova_server_lr = 1.0
    config.training.rounds = 10
    config.training.batch_size = 16
    config.training.learning_rate = 0.05
    return config
