r"""Beyond the paper: FedPALS when the target's T(Y) is unknown, re-estimated during training.

  python -m experiments.sweep --config=configs/beyond_unknown_target.py:3 \
      --workdir=runs/beyond_unknown_target_c3
  python -m experiments.compare --tables=runs/table1_fmnist_c3,runs/beyond_unknown_target_c3 \
      --workdir=runs/unknown_target_vs_known_c3

The argument after the colon is C (3 or 2; default 3): the rows are Table 1's
(`fjp.table1_config`), so that `experiments.compare` sets these runs beside FedPALS given the
true T and FedAvg of the Table 1 sweep (same seeds, partitions and budget).

The server starts from the clients' aggregate sum_i n_i S_i / N (the only guess without target
labels; FedPALS' weights are then FedAvg's) and, before every `target_estimation_every` = 2
rounds, re-estimates T from the global model's predictions on the target's unlabeled
validation inputs (`fjp.algorithms.TargetReestimation`): black-box shift estimation (Lipton et al., 2018)
with the confusion matrix of 5,000 labeled examples of the clients' pooled data
(fedpals_unknown_t_bbse), or EM re-weighting of the posteriors (Saerens et al., 2002;
fedpals_unknown_t_em). lam = 0 (the projection of T^ onto Conv(S)): ESS fractions need a known T.
The target validation labels still select the stopping round, as for every method.
"""

import ml_collections

import fedjax_pals as fjp


def get_config(labels_per_client: str = "3"):
    config = fjp.table1_config("fashion_mnist", labels_per_client=int(labels_per_client))
    config.algorithm.target_estimation_every = 2
    config.sweep.methods = ("fedpals_unknown_t_bbse", "fedpals_unknown_t_em")
    config.sweep.grid = ml_collections.ConfigDict(
        dict(training=dict(learning_rate=(0.1,)), algorithm=dict(lam=(0.0,)))
    )
    config.sweep.figures = ("curves",)
    return config
