"""FedPALS' trade-off lambda (eq. 8): given directly, or chosen by an effective sample size.

`algorithm.lam` sets lambda; `algorithm.ess_fraction` instead picks the lambda whose weights
have ESS = fraction * N (App. B.3, `server_weights.lambda_for_ess`), searched on the host on
the S the server's weights see (a DP release included), before the method is built. Neither
set: lam = 0, the projection of T onto Conv(S) (eq. 7). Both are per-run data: runs differing
only in them share one compiled round.

A feature of every run with FedPALS' weights (FedPALS, and a client-side method with
algorithm.weights='fedpals'), at the stage "lambda", so that its lambda is searched on the T_p
or release of the stages before; after adaptive_lambda (`after=`), whose `LAMBDA_FLOOR` it
reads (a schedule that moves lambda may start an ESS fraction out of reach at the lower end of
the range). The lambda it resolves is the context slot `LAMBDA`, which FedPALS' builder reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_pals.algorithms import registry
from fedjax_pals.hyperparameters import Hyperparameters, hyperparameter
from fedjax_pals.server_weights import LOG10_LAM_RANGE, lambda_for_ess


# The lambda the run's FedPALS weights use (`context.get(LAMBDA)`): written at the stage
# "lambda" by this feature, read by FedPALS' builder (and a lender's weights).
LAMBDA = registry.ContextSlot(
    "fedpals_lambda", stage="lambda", kind=(float, int, np.floating, np.integer),
    doc="FedPALS' lambda, resolved from algorithm.lam or algorithm.ess_fraction",
    legacy_field="lam")
# Set by a schedule that moves lambda (adaptive lambda): an ESS fraction out of reach, or
# lam = 0, starts at the lower end of lambda's range (lambda -> 0+) instead of failing.
LAMBDA_FLOOR = registry.ContextSlot(
    "fedpals_lambda_floor", stage="lambda", kind=bool,
    doc="an unreachable ESS or lam = 0 starts at the lower end of lambda's range",
    legacy_field="lam_floor")


@dataclasses.dataclass(frozen=True)
class FedPalsLambda(Hyperparameters):
    lam: float | None = hyperparameter(
        None, low=0.0, optional=True,
        why=" (lam -> infinity is FedAvg: use algorithm.name='fedavg')",
        doc="FedPALS' lambda of eq. 8 (default 0: the projection of T on Conv(S))",
        per_run=True, shown=True, axis="lambda", label="λ", identity_when_unset=True,
    )
    ess_fraction: float | None = hyperparameter(
        None, low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
        why=" (ESS = N is FedAvg: use algorithm.name='fedavg')",
        doc="or: the lambda whose weights have ESS = fraction * N (App. B.3)",
        per_run=True, shown=True, axis="lambda", label="ESS fraction",
        identity_when_unset=True,
    )


def _resolve(values: dict, facts: registry.RunFacts) -> dict:
    if facts.weights != "fedpals":
        return {"lam": None, "ess_fraction": None}
    lam, ess = values["lam"], values["ess_fraction"]
    if lam is not None and ess is not None:
        raise ValueError(
            f"config.algorithm.lam={lam:g} and config.algorithm.ess_fraction={ess:g} are both "
            "set; give one of them (lam directly, or ess_fraction to choose lam by ESS), not both."
        )
    if lam is None and ess is None:
        lam = 0.0  # alpha^0: the projection of T onto Conv(S) (eq. 7)
    return {"lam": lam, "ess_fraction": ess}


def _prepare(hp: FedPalsLambda, context: registry.MethodContext) -> registry.MethodContext:
    partition, floor = context.partition, context.get(LAMBDA_FLOOR)
    if hp.ess_fraction is None:
        if hp.lam is None or not floor:
            return context.with_value(LAMBDA, None if hp.lam is None else float(hp.lam))
        lam = float(hp.lam)
    else:
        try:
            lam = float(lambda_for_ess(
                context.weight_label_dists, partition.target_label_dist, partition.client_sizes,
                hp.ess_fraction,
            ))
        except ValueError as error:
            if not (floor and "out of range" in str(error)):
                raise
            lam = 0.0
    if floor and lam == 0.0:
        # The lower end of lambda_for_ess's range, which stands for lambda -> 0+.
        lam = float(np.sum(partition.client_sizes)) * 10.0 ** LOG10_LAM_RANGE[0]
    return context.with_value(LAMBDA, lam)


registry.register_feature(
    registry.Feature(
        "fedpals_lambda", "FedPALS' lambda", FedPalsLambda, _resolve, prepare=_prepare,
        stage="lambda", after=("adaptive_lambda",),
        description="lambda of eq. 8, given or chosen by ESS (App. B.3)",
        # The paper's protocol (App. B.3): lambda -> 0+ (the projection of T onto Conv(S),
        # eq. 7) and the lambdas giving ESS = 10, 25, 50, 75 % of N.
        grid={"lam": (0.0,), "ess_fraction": (0.1, 0.25, 0.5, 0.75)},
    ),
    replace=True,
)
