r"""The full config schema with its defaults: FedPALS on Fashion-MNIST, sparsity C=3, 10 clients.

  python -m experiments.run --config=configs/default.py --workdir=runs/default \
      --config.algorithm.name=fedavg --config.training.rounds=50

Every key, its meaning and its allowed values: `fedjax_pals/experiment/config.py`. Other
config files start from `fjp.default_config()` and change what they need.
"""

import fedjax_pals as fjp


def get_config():
    return fjp.default_config()
