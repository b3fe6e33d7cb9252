r"""FedNova beside FedPALS and FedAvg on blobs, two seeds, with the selection protocol.

  python -m fedjax_pals_experiments.sweep --config=my_sweep.py --workdir=runs/my_sweep
"""

import ml_collections


import my_config


def get_config():
    config = my_config.get_config()
    config.sweep = ml_collections.ConfigDict(
        dict(
            row="blobs Dir(0.3)",
            seeds=(0, 1),
            methods=("fednova", "fedpals", "fedavg"),
            # Each method spans the grid keys it uses: nova_server_lr only FedNova's,
            # target_smoothing (the feature's) only FedPALS'.
            grid=dict(
                algorithm=dict(nova_server_lr=(1.0, 0.5), lam=(0.0,), target_smoothing=(0.0, 0.1))
            ),
            selection="mean_over_seeds",
        )
    )
    return config
