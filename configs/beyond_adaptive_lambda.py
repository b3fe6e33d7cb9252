r"""Beyond the paper: FedPALS with lambda adapted during training, against the best fixed lambda.

  python -m experiments.sweep --config=configs/beyond_adaptive_lambda.py:3 \
      --workdir=runs/beyond_adaptive_lambda_c3
  python -m experiments.compare --tables=runs/table1_fmnist_c3,runs/beyond_adaptive_lambda_c3 \
      --workdir=runs/adaptive_vs_grid_c3

The argument after the colon is C, the labels per client (3 or 2; default 3): the rows are
those of Table 1 (`fjp.table1_config`: Fashion-MNIST, 10 clients, the paper's sparsity
partition, LeNet, E = 1, batch 32, 8 seeds) so that `experiments.compare` sets the adaptive
runs beside the Table 1 sweep's FedPALS, whose lambda the protocol selects from lam = 0 and ESS
10/25/50/75 % of N on the same validation set (5 runs per seed).

`fedpals_adaptive` (`fjp.algorithms.adaptive_fedpals`, `fedjax_pals/algorithms/adaptive_lambda.py`) runs once per
seed: lambda starts at ESS 50 % of N, the middle of that grid, and after every round takes an
Adam step of 0.5 on log lambda down the hypergradient of the target validation loss (implicit
d alpha / d lambda of eq. 8). Early stopping on the validation set as for every method; the
learning rate is Table 1's 0.1.
"""

import ml_collections

import fedjax_pals as fjp


def get_config(labels_per_client: str = "3"):
    config = fjp.table1_config("fashion_mnist", labels_per_client=int(labels_per_client))
    config.algorithm.lam_hyper_lr = 0.5
    config.sweep.methods = ("fedpals_adaptive",)
    config.sweep.grid = ml_collections.ConfigDict(
        dict(training=dict(learning_rate=(0.1,)), algorithm=dict(ess_fraction=(0.5,)))
    )
    config.sweep.figures = ("curves", "lambda_trajectories")
    return config
