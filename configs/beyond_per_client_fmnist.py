r"""Every client as its own target (issue: per-client accuracy under label shift): Fashion-MNIST,
sparsity C = 3, 100 training clients (num_clients = 101: the scheme's last client, the paper's
target, is left unused), 10 % of them per round.

  python -m experiments.sweep --config=configs/beyond_per_client_fmnist.py --workdir=runs/per_client_fmnist
  # C = 2: --config=configs/beyond_per_client_fmnist.py:2

Per seed, on one partition: FedAvg, its global model evaluated on every client's own test set
and personalised after training (FedAvg + fine-tuning, Ditto, local training only: each client's
steps and learning rate, Ditto's lambda, chosen on its own validation set); and FedPALS once per
client j with T = S_j (`sweep.each_client`: 100 runs a seed, on the runs axis in blocks of
`engine.runs_per_program`), client j's accuracy from its own run. The per-client report
(per_client_table.md, per_client_cdf.png) compares them. FedPALS' lambda: ESS = 25 % of N
(App. B.3's grid point; one value, not selected, to keep the 100 runs a seed). The budget is
sized for 2 CPU cores: 15 rounds, seeds 0 and 1 (about 45 min a seed).
"""

import fedjax_pals as fjp


def get_config(labels_per_client: str = "3"):
    if labels_per_client not in ("2", "3"):
        raise ValueError(f"the argument must be 2 or 3 (labels per client), got "
                         f"{labels_per_client!r}.")
    c = int(labels_per_client)
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = c
    config.partition.num_clients = 101
    config.training.rounds = 15
    config.training.client_fraction = 0.1
    config.training.learning_rate = 0.1
    config.training.eval_every = 5
    config.evaluation.per_client = True
    config.evaluation.personalization = ("fine_tuning", "ditto", "local")
    config.sweep = dict(
        seeds=(0, 1),
        methods=("fedavg", "fedpals"),
        grid=dict(algorithm=dict(ess_fraction=(0.25,))),
        each_client=True,
        protocol=False,
        row=f"Fashion-MNIST C={c}, 100 clients",
    )
    return config
