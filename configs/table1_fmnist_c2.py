r"""Table 1: Fashion-MNIST, sparsity sampling with C = 2 labels per client;
10 clients (9 training + the target), 8 seeds.

  python -m experiments.sweep --config=configs/table1_fmnist_c2.py --workdir=runs/table1_fmnist_c2
  # shorter: --config.training.rounds=30 --config.sweep.seeds='(0,1,2)' \
  #          --config.sweep.grid.training.learning_rate='(0.1,)'

The paper's protocol (Sec. 5, App. B.3), through `fjp.run_sweep`: FedPALS, FedAvg, FedProx,
SCAFFOLD, AFL, FedRS, the Oracle and FedProx+FedPALS (`fjp.PAPER_METHODS`); FedPALS' lambda over
lam = 0 (lambda -> 0+) and ESS = 10/25/50/75 % of N, every method's learning rate and the
baselines' own hyperparameters (`fjp.protocol_grid`), selected on the target validation set at
each run's best-validation round (early stopping, `fedjax_pals/experiment/protocol.py`).
Reported: target test accuracy and macro-F1, mean +- std over the seeds, beside the paper's
numbers. The paper's budget: 150 rounds of E = 1 local epoch; batch 32; LeNet (the paper's
"small two-layer convolutional network").
"""

import fedjax_pals as fjp


def get_config():
    return fjp.table1_config("fashion_mnist", labels_per_client=2)
