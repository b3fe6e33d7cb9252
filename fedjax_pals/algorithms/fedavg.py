"""FedAvg (McMahan et al., 2017): local SGD, size-weighted averaging alpha_i = n_i / N (eq. 4).

Its client method (`base.plain_sgd`) and weighting (`base.fedavg_weighting`) are the defaults
every other method is assembled from (`base.combine`).
"""

from __future__ import annotations

from fedjax_pals.algorithms.base import FederatedAlgorithm, combine, fedavg_weighting, plain_sgd
from fedjax_pals.algorithms.registry import Method, register_method


def fedavg() -> FederatedAlgorithm:
    """FedAvg: local SGD, size-weighted averaging (eq. 4)."""
    return combine(plain_sgd(), fedavg_weighting(), "fedavg")


register_method(
    Method("fedavg", "FedAvg", lambda hp, context: fedavg(),
           description="local SGD, weights n_i / N (eq. 4)"), replace=True
)
