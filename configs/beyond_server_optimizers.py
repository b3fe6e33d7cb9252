r"""Beyond the paper: server optimisers (Reddi et al., ICLR 2021) on the rows of Table 1.

  python -m experiments.sweep --config=configs/beyond_server_optimizers.py:3,fedadam \
      --workdir=runs/beyond_fedadam_fedpals_c3
  python -m experiments.sweep --config=configs/beyond_server_optimizers.py:3,fedavgm \
      --workdir=runs/beyond_fedavgm_c3
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)'

The argument after the colon is "C,method[,session]": C the labels per client (3 or 2; default 3), the
rows of Table 1 (`fjp.table1_config`: Fashion-MNIST, 10 clients, 9 training + the target, the
paper's sparsity partition, LeNet, E = 1, batch 32, 8 seeds, 150 rounds), so that
`experiments.compare` sets these methods beside the Table 1 sweep's FedPALS and FedAvg;
method one of:

* fedadam (default): FedAdam+FedPALS, method key `fedadam_fedpals`: FedPALS' weights alpha^lam,
  the server's step FedAdam's on the weighted mean delta
  (`fedjax_pals/algorithms/server_optimizers.py`: b1 = 0.9, b2 = 0.99, tau = 1e-3, v starting at tau^2, no bias correction, as Reddi et al.'s
  Algorithm 2). Grid: server eta in {0.01, 0.03} (Reddi et al. tune eta on a half-decade grid;
  their best FedAdam server rates are around 10^-2 to 10^-1.5 for the image tasks),
  FedPALS' lambda over the protocol's lam = 0 and ESS 10/25/50/75 % of N, learning rate 0.1 /
  0.01 / 0.001 (`fjp.protocol_grid`).
* fedavgm: FedAvgM (FedAvg's weights, server heavy-ball momentum 0.9, Hsu et al. 2019; Reddi et
  al.'s baseline). Grid: server eta in {1.0, 0.3} (1.0 is Hsu et al.'s and Reddi et al.'s
  usual server rate; 0.3 because at momentum 0.9 the steady-state step is eta / (1 - 0.9) = 10
  eta times the round's delta), the protocol's learning rates.

Selected on the target validation set at each run's best validation round, mean over seeds
(`fedjax_pals/experiment/protocol.py`).

"session": the budget scripts/reproduce.sh runs (REPRODUCTION.md): 10 rounds, learning rate
0.1 (Table 1's session runs use 0.1 for every method), FedAdam+FedPALS at lam = 0 only (the
lambda -> 0+ end, which the protocol selected for FedPALS on the validation set on both rows of
Table 1, and for FedProx+FedPALS), the server eta grid as above: 16 runs per method and row.
"""

import ml_collections

import fedjax_pals as fjp

METHODS = {"fedadam": ("fedadam_fedpals", (0.01, 0.03)), "fedavgm": ("fedavgm", (1.0, 0.3))}


def get_config(arg: str = "3"):
    labels, _, rest = arg.partition(",")
    method, _, budget = rest.partition(",")
    method = method or "fedadam"
    if budget not in ("", "paper", "session"):
        raise ValueError(f"budget must be 'paper' or 'session', got {budget!r} (arg {arg!r}).")
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r} (arg {arg!r}).")
    key, rates = METHODS[method]
    config = fjp.table1_config("fashion_mnist", labels_per_client=int(labels))
    grid = fjp.protocol_grid()
    config.sweep.methods = (key,)
    config.sweep.grid = ml_collections.ConfigDict(
        dict(
            training=dict(learning_rate=grid.training.learning_rate),
            algorithm=dict(lam=grid.algorithm.lam, ess_fraction=grid.algorithm.ess_fraction),
            server=dict(learning_rate=rates),
        )
    )
    config.sweep.figures = ("curves",)
    if budget == "session":
        config.training.rounds = 10
        config.sweep.grid = ml_collections.ConfigDict(
            dict(
                training=dict(learning_rate=(0.1,)),
                algorithm=dict(lam=(0.0,)),
                server=dict(learning_rate=rates),
            )
        )
    return config
