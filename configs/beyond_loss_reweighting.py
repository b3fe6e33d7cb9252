r"""Beyond the paper: loss reweighting (IW-ERM) and FedVLS beside FedPALS on Table 1's rows.

  python -m experiments.sweep --config=configs/beyond_loss_reweighting.py:3 \
      --workdir=runs/beyond_loss_reweighting_c3
  python -m experiments.sweep --config=configs/beyond_loss_reweighting.py:3,session \
      --workdir=runs/beyond_loss_reweighting_c3      # REPRODUCTION.md's budget
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)' \
  #             --config.sweep.grid.training.learning_rate='(0.1,)'

The argument after the colon is "C[,session]", C the labels per client (3 or 2; default 3): the rows are
those of Table 1 (`fjp.table1_config`: 10 clients, 9 training + the target, the paper's sparsity
partition, LeNet, E = 1, batch 32, 8 seeds, 150 rounds). The question a reviewer asks of
FedPALS first: does reweighting each client's *loss* towards T do what reweighting the
*aggregation* does?

* `iwerm` (Ramezani-Kebrya et al., TMLR 2023): client i's loss weighted per example by
  min(T(y) / S_i(y), algorithm.iwerm_max_ratio), FedAvg's weights, T known.
* `iwerm_unknown_t`: the same with T estimated as the run trains (the package's default
  estimator, constrained soft BBSE on the model's outputs, in-sample, undamped, from the
  clients' aggregate; `configs/beyond_unknown_target.py`'s `unknown_t_iwerm`).
* `iwerm_fedpals`: IW-ERM's clients with FedPALS' weights.
* `fedvls` (Guo et al., AAAI 2024): vacant-class distillation plus logit suppression, FedAvg's
  weights; `fedvls_fedpals` with FedPALS' weights.
* `fedpals`, `fedavg` and `oracle` from the same code, seeds and budget, so that the table
  stands on its own.

Grid (`fjp.protocol_grid`): learning rate 0.1 / 0.01 / 0.001; FedPALS' lambda (lam = 0 and
ESS 10/25/50/75 % of N) for every method with FedPALS' weights; FedVLS' lambda over 1.0 (the
reference default) and 0.1. Each method's hyperparameters are selected on the target
validation set at each run's best validation round, mean over seeds
(`fedjax_pals/experiment/protocol.py`). Budget per seed: 3 learning rates x (FedPALS and
IW-ERM+FedPALS 5 lambdas each, FedVLS+FedPALS 5 lambdas x 2 FedVLS lambdas, FedVLS 2, the
other four 1) = 78 runs; x 8 seeds = 624 runs of 150 rounds.

"session": the budget scripts/reproduce.sh runs (REPRODUCTION.md): 10 rounds, learning rate
0.1 (as Table 1's session runs), FedPALS' weights at lam = 0 only (the projection of T onto
Conv(S), eq. 7), FedVLS at its reference lambda 1.0: 8 runs a seed, 64 a row.
"""

import ml_collections

import fedjax_pals as fjp

METHODS = ("fedpals", "fedavg", "iwerm", "iwerm_unknown_t", "iwerm_fedpals", "fedvls",
           "fedvls_fedpals", "oracle")

# Explicit, so that the row is what it was when measured whatever the defaults become.
fjp.register_variant(
    fjp.Variant("iwerm_unknown_t", "IW-ERM, T^ by constrained soft BBSE (in-sample)", "iwerm",
                {"algorithm.target_estimation": "bbse_constrained",
                 "algorithm.target_holdout": 0.0, "algorithm.target_damping": 1.0}),
    replace=True,  # a launcher may load this file more than once
)


def get_config(arg: str = "3"):
    labels, _, budget = arg.partition(",")
    if budget not in ("", "paper", "session"):
        raise ValueError(f"budget must be 'paper' or 'session', got {budget!r} (arg {arg!r}).")
    config = fjp.table1_config("fashion_mnist", labels_per_client=int(labels or 3))
    config.sweep.methods = METHODS
    grid = fjp.protocol_grid()
    config.sweep.grid = ml_collections.ConfigDict(
        dict(
            training=dict(learning_rate=grid.training.learning_rate),
            algorithm=dict(lam=grid.algorithm.lam, ess_fraction=grid.algorithm.ess_fraction,
                           fedvls_lambda=grid.algorithm.fedvls_lambda),
        )
    )
    if budget == "session":
        config.training.rounds = 10
        config.sweep.grid = ml_collections.ConfigDict(
            dict(training=dict(learning_rate=(0.1,)),
                 algorithm=dict(lam=(0.0,), fedvls_lambda=(1.0,)))
        )
    config.sweep.figures = ("curves",)
    return config
