r"""Beyond the paper: FedDisco and FedLC beside FedPALS and FedAvg on Fashion-MNIST C = 3 and C = 2.

  python -m experiments.sweep --config=configs/beyond_feddisco_fedlc.py \
      --workdir=runs/beyond_feddisco_fedlc
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)' \
  #             --config.sweep.grid.training.learning_rate='(0.1,)'

* FedDisco (Ye et al., ICML 2023): server weights ReLU(n_k/N - a d_k + b), normalised, d_k the
  normalised KL divergence of S_k(Y) from the target's T(Y) (`fjp.feddisco_weighting`): the
  same server-side information as FedPALS, so the head-to-head. Grid: a in {0.5 (reference
  default), 0.1, 1.0}, b in {0.1 (reference default), 0.0}.
* FedLC (Zhang et al., ICML 2022): local logits calibrated by the client's label counts,
  f_y - tau n_{k,y}^(-1/4) (`fjp.fedlc_client`), with FedAvg's weights and with FedPALS'
  (fedlc_fedpals). Grid: tau in {1.0, 0.5, 0.1} (ours; the public implementations default
  to 1.0).
* FedPALS and FedAvg as in Table 1 (`fjp.protocol_grid`: lam = 0 and ESS 10/25/50/75 % of N;
  learning rate 0.1 / 0.01 / 0.001 for every method).

Each method's hyperparameters are selected on the target validation set at each run's best
validation round, mean over seeds (`fedjax_pals/experiment/protocol.py`); one table row per C.
The paper's budget: 150 rounds of E = 1, batch 32, LeNet, 10 clients (9 training + the
target), 8 seeds. Budget: per row and seed 15 (FedPALS) + 3 (FedAvg) + 18 (FedDisco) + 9
(FedLC) + 45 (FedLC+FedPALS) = 90 runs; x 2 rows x 8 seeds = 1,440 runs of 150 rounds.
"""

import ml_collections

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.partition.num_clients = 10  # 9 training clients + the target
    config.training.rounds = 150
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.learning_rate = 0.1  # overridden by the grid
    config.training.eval_every = 1
    grid = fjp.protocol_grid()
    grid.algorithm.feddisco_a = (0.5, 0.1, 1.0)
    grid.algorithm.feddisco_b = (0.1, 0.0)
    grid.algorithm.fedlc_tau = (1.0, 0.5, 0.1)
    config.sweep = ml_collections.ConfigDict(
        dict(
            row="Fashion-MNIST",
            seeds=tuple(range(8)),
            methods=("fedpals", "fedavg", "feddisco", "fedlc", "fedlc_fedpals"),
            grid=grid,
            axes=dict(partition=dict(labels_per_client=(3, 2))),
            figures=("curves",),
        )
    )
    return config
