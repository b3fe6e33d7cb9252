r"""Beyond the paper: FedDisco and FedLC on the rows of Table 1 (Fashion-MNIST, C = 3 or 2).

  python -m experiments.sweep --config=configs/beyond_feddisco_fedlc.py:3 \
      --workdir=runs/beyond_feddisco_fedlc_c3
  python -m experiments.compare --tables=runs/table1_fmnist_c3,runs/beyond_feddisco_fedlc_c3 \
      --workdir=runs/feddisco_fedlc_vs_table1_c3
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)' \
  #             --config.sweep.grid.training.learning_rate='(0.1,)'

The argument after the colon is C, the labels per client (3 or 2; default 3): the rows are
those of Table 1 (`fjp.table1_config`: 10 clients, 9 training + the target, the paper's sparsity
partition, LeNet, E = 1, batch 32, 8 seeds, 150 rounds), so that `experiments.compare` sets
these methods beside the Table 1 sweep's FedPALS and FedAvg (same seeds, partitions, budget).

* FedDisco (Ye et al., ICML 2023): server weights ReLU(n_k/N - a d_k + b), normalised, d_k the
  normalised KL divergence of S_k(Y) from the target's T(Y) (`fjp.algorithms.feddisco_weighting`): the
  same server-side information as FedPALS, so the head-to-head. Grid: a in {0.5 (reference
  default), 0.1, 1.0}, b in {0.1 (reference default), 0.0}.
* FedLC (Zhang et al., ICML 2022): local logits calibrated by the client's label counts,
  f_y - tau n_{k,y}^(-1/4) (`fjp.algorithms.fedlc_client`), with FedAvg's weights and with FedPALS'
  (fedlc_fedpals, FedPALS' lambda over the protocol's lam = 0 and ESS 10/25/50/75 % of N).
  Grid: tau in {1.0, 0.5, 0.1} (ours; the public implementations default to 1.0).
* Learning rate 0.1 / 0.01 / 0.001 for every method (`fjp.protocol_grid`).

Each method's hyperparameters are selected on the target validation set at each run's best
validation round, mean over seeds (`fedjax_pals/experiment/protocol.py`). Budget per seed: 18
(FedDisco) + 9 (FedLC) + 45 (FedLC+FedPALS) = 72 runs; x 8 seeds = 576 runs of 150 rounds.
"""

import fedjax_pals as fjp


def get_config(labels_per_client: str = "3"):
    config = fjp.table1_config("fashion_mnist", labels_per_client=int(labels_per_client))
    grid = fjp.protocol_grid()
    grid.algorithm.feddisco_a = (0.5, 0.1, 1.0)
    grid.algorithm.feddisco_b = (0.1, 0.0)
    grid.algorithm.fedlc_tau = (1.0, 0.5, 0.1)
    config.sweep.methods = ("feddisco", "fedlc", "fedlc_fedpals")
    config.sweep.grid = grid
    config.sweep.figures = ("curves",)
    return config
