"""Server optimisers: FedAvgM, FedAdam, FedYogi, FedAdagrad as optax transformations.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2 (FedOpt): the server
treats the weighted mean of the clients' updates as a pseudo-gradient,

    Delta_t = sum_i alpha_i (theta_i - theta_t)             (alpha: any weighting, FedPALS too)
    m_t     = b1 m_{t-1} + (1 - b1) Delta_t                 (m_{-1} = 0)
    v_t     = v_{t-1} + Delta_t^2                                      FedAdagrad
            = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   FedYogi
            = b2 v_{t-1} + (1 - b2) Delta_t^2                          FedAdam
    theta_{t+1} = theta_t + eta m_t / (sqrt(v_t) + tau)

with v_{-1} = tau^2 (Algorithm 2 takes any v_{-1} >= tau^2; we use the smallest), no bias
correction and tau OUTSIDE the square root. optax's `adam`/`yogi`/`adagrad` differ from this:
`scale_by_adam` bias-corrects m and v (a first step of eta * sign(Delta) instead of
eta * 0.1 Delta / (sqrt(0.01 Delta^2 + tau^2 ...) + tau)) and starts v at 0; `scale_by_yogi`
bias-corrects too and starts m AND v at 1e-6; `scale_by_rss` (adagrad) divides by
sqrt(v + eps) with no first moment. So the three adaptive variants are one small
transformation here (`scale_by_fedopt`, typed state `ScaleByFedOptState`), chained with
`optax.scale(-eta)`.

FedAvgM (Hsu et al., 2019; Reddi et al.'s baseline) is server SGD with heavy-ball momentum on
the pseudo-gradient -Delta: v_t = b v_{t-1} + Delta_t, theta_{t+1} = theta_t + eta v_t, which
`optax.sgd(eta, momentum=b)` (trace, not Nesterov) computes exactly. `sgd` is
`optax.sgd(eta)`: theta + eta Delta, today's `weighted_average_update(eta)` bit for bit.

Every transformation receives g = -Delta (optax minimises), so `optax.apply_updates(params,
updates)` moves along +Delta. Its state lives in `ServerState.server_opt_state` (one pytree
per run: vmapped over the runs axis, saved in checkpoints with the rest of the state).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pals import _validation, deprecation, extensions
from fedjax_pals.algorithms import server_chain
# The chain's steps live in server_chain.py; here, where they have always been imported from.
from fedjax_pals.algorithms.server_chain import (  # noqa: F401
    OptimizerUpdate, WeightedAverageUpdate, optimizer_update, weighted_average_update,
)

if TYPE_CHECKING:  # for annotations only: base.py imports this module
    from fedjax_pals.algorithms.base import (
        ClientOutputs, FederatedAlgorithm, ServerState, ServerUpdate,
    )

# The built-in server optimisers; `sgd` at learning rate 1 is the plain weighted average
# (today's server update). `registered_server_optimizers()` adds a user's own.
SERVER_OPTIMIZERS = ("sgd", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
# The label of each registered server optimiser but `sgd`, the registry's prefix of a method
# key: "fedadam_fedpals" is FedPALS with FedAdam's server step ("FedAdam+FedPALS"), a bare
# "fedadam" FedAvg with it (Reddi et al.'s name for that method). Kept up to date by
# `register_server_optimizer`.
SERVER_OPTIMIZER_LABELS: dict[str, str] = {}
# The config keys config.server.<key> a server optimiser may read (its `keys`).
SERVER_KEYS = ("learning_rate", "momentum", "b1", "b2", "tau")
# Reddi et al.'s defaults (Sec. 5 / App. D): b1 = 0.9, b2 = 0.99, tau tuned (1e-3 typical);
# FedAvgM with momentum 0.9.
DEFAULT_B1 = 0.9
DEFAULT_B2 = 0.99
DEFAULT_TAU = 1e-3
DEFAULT_MOMENTUM = 0.9


class ScaleByFedOptState(NamedTuple):
    """Reddi et al.'s m_t (first moment of the pseudo-gradient) and v_t (second moment)."""

    m: optax.Params
    v: optax.Params


def scale_by_fedopt(variant: str, b1: float, b2: float, tau: float) -> optax.GradientTransformation:
    """g -> m / (sqrt(v) + tau), Reddi et al.'s m and v of `variant` (adam | yogi | adagrad).

    m is linear in g and v reads g^2 only, so on g = -Delta this returns -(m_Delta / (sqrt(v)
    + tau)); `optax.scale(-eta)` after it gives Algorithm 2's step eta m / (sqrt(v) + tau).
    """
    if variant not in ("adam", "yogi", "adagrad"):
        raise ValueError(f"variant must be 'adam', 'yogi' or 'adagrad', got {variant!r}.")

    def init(params):
        m = jax.tree_util.tree_map(jnp.zeros_like, params)
        v = jax.tree_util.tree_map(lambda p: jnp.full_like(p, tau * tau), params)
        return ScaleByFedOptState(m=m, v=v)

    def second_moment(v, g):
        g2 = g * g
        if variant == "adam":
            return b2 * v + (1.0 - b2) * g2
        if variant == "yogi":
            return v - (1.0 - b2) * g2 * jnp.sign(v - g2)
        return v + g2

    def update(updates, state, params=None):
        del params
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, state.m, updates)
        v = jax.tree_util.tree_map(second_moment, state.v, updates)
        step = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + tau), m, v)
        return step, ScaleByFedOptState(m=m, v=v)

    return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """A registered server optimiser: `server.optimizer = name` in a config, `<name>_<method>`
    as a method key ("fedadam_fedpals"; a bare `name` is FedAvg with it).

    build(**values) -> optax.GradientTransformation, given the values of its `keys` (config
      keys server.<key>, among `SERVER_KEYS`; learning_rate always). It receives the
      pseudo-gradient -sum_i alpha_i Delta_i (optax minimises) and its state lives in the run's
      `ServerState.server_opt_state`.
    label: how tables and figures name it ("FedAdam").
    """

    name: str
    label: str
    build: Callable[..., optax.GradientTransformation]
    keys: tuple[str, ...] = ("learning_rate",)
    description: str = ""

    def __post_init__(self) -> None:
        _validation.check_registered_name("server optimiser", self.name)
        if "_" in self.name:
            raise ValueError(
                "a server optimiser's name must be a Python identifier without '_' (it is the "
                f"prefix of method keys such as fedadam_fedpals), got {self.name!r}."
            )
        unknown = sorted(set(self.keys) - set(SERVER_KEYS))
        if unknown or "learning_rate" not in self.keys:
            raise ValueError(
                f"server optimiser {self.name!r}: keys must be among the config's server keys "
                f"{list(SERVER_KEYS)} and include 'learning_rate', got {list(self.keys)}."
            )
        # `server_optimizer` calls build(**{key: value for key in keys}): a signature that does
        # not take them is refused here, not as a traceback in round 1.
        _validation.check_hook(f"server optimiser {self.name!r}", "build", self.build,
                               "(**values) -> optax.GradientTransformation",
                               keywords=tuple(self.keys))


_REGISTERED: dict[str, ServerOptimizer] = {}


def register_server_optimizer(
    optimizer: ServerOptimizer, *, replace: bool = False
) -> ServerOptimizer:
    """Registers `optimizer` under its name (config.server.optimizer, a method key's prefix)."""
    if not isinstance(optimizer, ServerOptimizer):
        raise TypeError(
            "register_server_optimizer takes a fedjax_pals.ServerOptimizer, "
            f"got {type(optimizer).__name__}."
        )
    if optimizer.name in _REGISTERED and not replace:
        raise ValueError(
            f"a server optimiser {optimizer.name!r} is already registered; pass replace=True "
            "to redefine it."
        )
    _REGISTERED[optimizer.name] = optimizer
    if optimizer.name != "sgd":
        SERVER_OPTIMIZER_LABELS[optimizer.name] = optimizer.label
    extensions.note_registration("server_optimizer", optimizer.name)
    server_optimizer.cache_clear()  # a name registered again builds anew
    return optimizer


def registered_server_optimizers() -> dict[str, ServerOptimizer]:
    """The registered server optimisers, the built-in ones first."""
    return dict(_REGISTERED)


@functools.cache
def server_optimizer(
    name: str, learning_rate: float = 1.0, *, momentum: float = DEFAULT_MOMENTUM,
    b1: float = DEFAULT_B1, b2: float = DEFAULT_B2, tau: float = DEFAULT_TAU,
) -> optax.GradientTransformation:
    """The optax transformation of server optimiser `name` (see the module docstring), from
    the values of the keys it reads.

    Cached: equal arguments give the same object, so runs differing only in what lives in the
    state share one compiled round.
    """
    if name not in _REGISTERED:
        raise ValueError(f"server optimizer must be one of {list(_REGISTERED)}, got {name!r}.")
    given = dict(learning_rate=learning_rate, momentum=momentum, b1=b1, b2=b2, tau=tau)
    registered = _REGISTERED[name]
    transformation = registered.build(**{key: given[key] for key in registered.keys})
    _check_transformation(name, transformation)
    return transformation


def _check_transformation(name: str, transformation: Any) -> None:
    """What a server optimiser's build returned is an optax transformation (callable `init` and
    `update`): refused where it is first built, before any training, not in round 1."""
    if not all(callable(getattr(transformation, attr, None)) for attr in ("init", "update")):
        raise TypeError(
            f"server optimiser {name!r}: build must return an optax.GradientTransformation "
            f"(an object with callable init and update), got {_brief(transformation)}."
        )


def _brief(value: Any) -> str:
    """`value` for a one-line message: its type and a repr cut to one short line."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _fedopt(variant: str):
    def build(learning_rate, b1=DEFAULT_B1, b2=DEFAULT_B2, tau=DEFAULT_TAU):
        eta = _validation.check_positive("learning_rate", learning_rate)
        b1, b2 = _check_decay("b1", b1), _check_decay("b2", b2)
        tau = _validation.check_positive("tau", tau)
        return optax.chain(scale_by_fedopt(variant, b1, b2, tau), optax.scale(-eta))

    return build


for _optimizer in (
    ServerOptimizer(
        "sgd", "SGD", lambda learning_rate: optax.sgd(
            _validation.check_positive("learning_rate", learning_rate))),
    ServerOptimizer(
        "fedavgm", "FedAvgM", lambda learning_rate, momentum: optax.sgd(
            _validation.check_positive("learning_rate", learning_rate),
            momentum=_check_decay("momentum", momentum)),
        ("learning_rate", "momentum")),
    ServerOptimizer("fedadam", "FedAdam", _fedopt("adam"), ("learning_rate", "b1", "b2", "tau")),
    ServerOptimizer("fedyogi", "FedYogi", _fedopt("yogi"), ("learning_rate", "b1", "b2", "tau")),
    ServerOptimizer("fedadagrad", "FedAdagrad", _fedopt("adagrad"), ("learning_rate", "b1", "tau")),
):
    register_server_optimizer(_optimizer, replace=True)


def _check_decay(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}.")
    return value


def with_server_optimizer(
    algorithm: FederatedAlgorithm, optimizer: optax.GradientTransformation, label: str = "opt"
) -> FederatedAlgorithm:
    """`algorithm` with `optimizer` as its server chain's step, in place of the plain weighted
    average (`fedjax_pals.algorithms.server_chain`: after the chain's links, so DP on updates'
    noised aggregate is what the optimiser steps on); SCAFFOLD's and AFL's server updates are
    their own: refused."""
    update = algorithm.server_update
    if (not server_chain.is_chained(update) and dataclasses.is_dataclass(update)
            and "inner" in {f.name for f in dataclasses.fields(update)}
            and server_chain.is_chained(update.inner)):
        # A user's wrapper around the plain average (the convention before the server chain):
        # the optimiser replaces the average inside it, as it did; 0.4.0 refuses it.
        deprecation.warn(
            f"{algorithm.name!r}: a server update that wraps the plain weighted average in a "
            f"frozen dataclass with an `inner` field ({type(update).__name__}) is looked "
            "through for a server optimiser; make it a link of the server chain instead "
            "(fjp.ServerLink, fjp.with_link: docs/extending.md, 'A link of the server chain').",
            refused_in="0.4.0",
        )
        inner = with_server_optimizer(algorithm._replace(server_update=update.inner), optimizer,
                                      label)
        return inner._replace(server_update=dataclasses.replace(
            update, inner=inner.server_update))
    try:
        algorithm = server_chain.with_step(algorithm, optimizer_update(optimizer, label))
    except ValueError as error:
        if server_chain.is_chained(algorithm.server_update):
            raise
        raise ValueError(
            f"a server optimizer replaces the plain weighted average, but {algorithm.name!r} "
            "has a server update of its own (SCAFFOLD's control variates, AFL's lambda)."
        ) from error
    return algorithm._replace(name=f"{label}+{algorithm.name}", server_optimizer=optimizer)


def server_optimizer_for(
    algorithm: FederatedAlgorithm, optimizer: str, learning_rate: float,
    momentum: float | None = None, b1: float | None = None, b2: float | None = None,
    tau: float | None = None,
) -> FederatedAlgorithm:
    """`algorithm` with server optimiser `optimizer` (the resolved config's `server` section;
    keys the optimiser does not use are None)."""
    given = dict(momentum=momentum, b1=b1, b2=b2, tau=tau)
    given = {k: v for k, v in given.items() if v is not None}
    transformation = server_optimizer(optimizer, learning_rate, **given)
    settings = ",".join(f"{k}={v:g}" for k, v in dict(eta=learning_rate, **given).items())
    label = "sgd" if optimizer == "sgd" else SERVER_OPTIMIZER_LABELS[optimizer]
    return with_server_optimizer(algorithm, transformation, f"{label}({settings})")
