r"""Table 2 (App. B.6): FedPALS when the server's T is perturbed, T_p = normalise(T + delta
max(eps, 0)), eps ~ N(0, I), delta in {1e-3, 1e-2, 0.5} (and delta = 0, the unperturbed T).

  python -m experiments.sweep --config=configs/target_perturbation_table2.py \
      --workdir=runs/table2

Only the server's T is perturbed (FedPALS' weights and the ESS search); the target's validation
and test sets follow the true T (`fjp.algorithms.target_perturbation.perturb_label_dist`). The paper runs it on PACS (3 seeds;
88.8 / 85.2 / 81.4 % for the three deltas), which cannot be had here; this config uses
Fashion-MNIST C = 3, 3 seeds, 150 rounds, FedPALS' lambda and learning rate selected on the
target validation set (`fjp.protocol_grid`). One table row per delta.
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
    config.training.eval_every = 1
    config.sweep = ml_collections.ConfigDict(
        dict(
            seeds=(0, 1, 2),
            methods=("fedpals",),
            grid=fjp.protocol_grid(),
            axes=dict(algorithm=dict(target_perturbation=(0.0, 1e-3, 1e-2, 0.5))),
            figures=("curves",),
        )
    )
    return config
