r"""One run on the paper's synthetic task (App. B.7/C.4): 3 classes of 2-D Gaussians, two
clients S_1 = [.5, .5, 0] (n = 40), S_2 = [.5, 0, .5] (n = 18), target T_delta; logistic
regression.

  python -m experiments.run --config=configs/synthetic.py --workdir=runs/synthetic \
      --config.dataset.synthetic_delta=1.0 --config.algorithm.name=fedavg

The task fixes its clients (3, the target included): the partition keys do not apply and the
run records num_clients = 3.
"""

import fedjax_pals as fjp


def get_config():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.dataset.synthetic_delta = 0.5
    # FedPALS with lam unset: lam = 0, alpha^0, the projection of T onto Conv(S) (eq. 7); give
    # --config.algorithm.lam or --config.algorithm.ess_fraction to change it.
    config.algorithm.name = "fedpals"
    config.training.rounds = 30
    config.training.batch_size = 8
    config.training.learning_rate = 0.05
    return config
