r"""Beyond the paper: FedPALS when the clients' label marginals are differentially private.

  python -m experiments.sweep --config=configs/beyond_private_marginals.py \
      --workdir=runs/beyond_private_marginals
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)'

Each client releases its label histogram once, before training, through the Laplace
mechanism (epsilon-DP per client; replace-one neighbours, L1 sensitivity 2, noise
Lap(2 / epsilon) per count; n_i stays exact and public), post-processed onto the simplex by
Euclidean projection; FedPALS' weights (eq. 8) and its ESS search see only the release, local
training is unchanged (`fjp.privacy.private_label_dists`, `fedjax_pals/privacy.py` states the full
accounting). The rows: epsilon in {exact S (None), 1, 0.1, 0.01, 0.001} crossed with the
client size: 10 clients (9 training, about 3,600 examples each with C = 3) and 100 clients
(99 training, about 600 each), so that the curve of target accuracy against epsilon can be
read at two client sizes. FedAvg does not read S: its runs resolve label_dp_epsilon to None and
run once per client size (the same run is not repeated across the epsilon rows).

Fashion-MNIST, the paper's sparsity sampling with C = 3, LeNet, E = 1, batch 32, learning rate
0.1, 150 rounds, every client every round; FedPALS' lambda over the protocol's lam = 0 and ESS
10/25/50/75 % of N (selected on the target validation set, `fjp.protocol_grid`), 3 seeds.
Budget: 3 seeds x (10 rows x 5 lambdas FedPALS + 2 FedAvg) = 156 runs of 150 rounds (a round
of 9 clients x ~4,000 examples took about 10 s on the 2-core CPU: ~65 h there).
"""

import ml_collections

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.partition.num_clients = 10
    config.training.rounds = 150
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.learning_rate = 0.1
    config.training.eval_every = 1
    config.algorithm.label_dp_mechanism = "laplace"
    grid = fjp.protocol_grid()
    config.sweep = ml_collections.ConfigDict(
        dict(
            row="Fashion-MNIST C=3, DP label marginals",
            seeds=(0, 1, 2),
            methods=("fedpals", "fedavg"),
            grid=dict(
                training=dict(learning_rate=(0.1,)),
                algorithm=dict(lam=grid.algorithm.lam, ess_fraction=grid.algorithm.ess_fraction),
            ),
            axes=dict(
                partition=dict(num_clients=(10, 100)),
                algorithm=dict(label_dp_epsilon=(None, 1.0, 0.1, 0.01, 0.001)),
            ),
            figures=("curves", "accuracy_vs_axis"),
            x_axis="label_dp_epsilon",
        )
    )
    return config
