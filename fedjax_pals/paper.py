"""What the FedPALS paper reports: its Table 1 and the methods it compares.

Listo Zec, Breitholtz and Johansson, "Overcoming label shift in targeted federated learning"
(FedPALS; Table 1, Sec. 5): mean and standard deviation of the target test accuracy over 8
seeds, 10 clients (9 training + the target). The selection protocol's table
(`fedjax_pals.experiment.protocol`) prints them beside a sweep's numbers.
"""

from __future__ import annotations

# The paper's Table 1 (mean %, std %) over 8 seeds, 10 clients (9 training + the target).
_TABLE_1_METHODS = ("fedpals", "fedavg", "fedprox", "scaffold", "afl", "fedrs", "oracle")
# row: ((mean % per method), (std % per method)), methods in _TABLE_1_METHODS' order.
_TABLE_1 = {
    "Fashion-MNIST C=3": (
        (92.4, 67.1, 66.9, 69.5, 78.9, 85.3, 97.6), (2.1, 22.0, 20.8, 19.3, 14.7, 13.5, 2.1)
    ),
    "Fashion-MNIST C=2": (
        (80.6, 53.9, 52.9, 54.9, 78.6, 63.14, 97.5), (23.7, 36.2, 35.7, 36.8, 20.0, 20.2, 4.0)
    ),
    "CIFAR-10 C=3": (
        (65.6, 44.0, 43.5, 43.3, 53.2, 44.0, 85.5), (10.1, 8.4, 7.2, 7.4, 0.9, 8.0, 5.0)
    ),
    "CIFAR-10 C=2": (
        (72.8, 46.7, 47.7, 46.7, 54.7, 49.4, 89.2), (17.4, 15.8, 15.6, 14.9, 0.1, 9.5, 3.9)
    ),
    "CIFAR-10 beta=0.1": (
        (62.6, 40.8, 41.9, 43.5, 53.4, 57.1, 79.2), (17.9, 9.2, 9.7, 10.5, 11.5, 11.2, 3.7)
    ),
}
PAPER_TABLE_1 = {
    row: dict(zip(_TABLE_1_METHODS, zip(means, stds))) for row, (means, stds) in _TABLE_1.items()
}
# The methods of the paper's Table 1, and FedProx with FedPALS' weights (Sec. 5, iWildCam).
PAPER_METHODS = (*_TABLE_1_METHODS, "fedprox_fedpals")
