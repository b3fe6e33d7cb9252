"""Input checks shared by the public functions.

The checks run on concrete inputs only: under `jax.jit`/`jax.vmap` the values
are tracers whose contents are unknown at trace time, so a traced call skips
them (validate once, outside the transformation, if in doubt).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import jax
import numpy as np

from fedjax_pals import deprecation

SUM_TOLERANCE = 1e-6


def is_concrete(*values: Any) -> bool:
    """True when no argument is (or contains) a JAX tracer."""
    leaves = jax.tree_util.tree_leaves(values)
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _finite_nonnegative(name: str, array: np.ndarray) -> None:
    if np.isnan(array).any():
        raise ValueError(f"{name} contains NaN entries.")
    if np.isinf(array).any():
        raise ValueError(f"{name} contains infinite entries.")
    if (array < 0).any():
        raise ValueError(f"{name} contains negative entries (min {array.min()}).")


def check_distribution(name: str, dist: Any) -> np.ndarray:
    """A 1-D probability vector: finite, non-negative, sums to 1."""
    array = np.asarray(dist, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {array.shape}.")
    _finite_nonnegative(name, array)
    total = array.sum()
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (within {SUM_TOLERANCE}), sums to {total!r}.")
    return array


def check_label_dists(name: str, dists: Any) -> np.ndarray:
    """An (M, K) matrix whose rows are probability vectors."""
    array = np.asarray(dists, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty (num_clients, num_classes) matrix, "
            f"got shape {array.shape}."
        )
    _finite_nonnegative(name, array)
    sums = array.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > SUM_TOLERANCE)
    if bad.size:
        raise ValueError(
            f"every row of {name} must sum to 1 (within {SUM_TOLERANCE}); rows {bad[:5].tolist()} "
            f"sum to {sums[bad[:5]].tolist()}."
        )
    return array


def check_client_sizes(client_sizes: Any, num_clients: int | None = None) -> np.ndarray:
    array = np.asarray(client_sizes, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"client_sizes must be a non-empty 1-D vector, got shape {array.shape}.")
    if np.isnan(array).any() or np.isinf(array).any():
        raise ValueError("client_sizes contains NaN or infinite entries.")
    if (array <= 0).any():
        raise ValueError(
            f"every client size n_i must be > 0; got {array[array <= 0][:5].tolist()} "
            f"at clients {np.flatnonzero(array <= 0)[:5].tolist()}."
        )
    if num_clients is not None and array.size != num_clients:
        raise ValueError(
            f"client_sizes has {array.size} entries but there are {num_clients} clients."
        )
    return array


def check_lam(lam: Any) -> float:
    """The trade-off lam of eq. 8: a real scalar >= 0 (inf allowed: FedAvg); NaN refused."""
    try:
        value = np.asarray(lam)
    except Exception as exc:  # e.g. a ragged sequence
        raise ValueError(f"lam must be a real number, got {lam!r}.") from exc
    # Refuses bool, str, bytes and None too (their dtypes are neither integer nor floating).
    if not (np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)):
        raise ValueError(f"lam must be a real number, got {lam!r}.")
    value = value.astype(np.float64)
    if value.ndim != 0:
        raise ValueError(
            f"lam must be a scalar here, got shape {value.shape} (vmap over lam instead)."
        )
    if np.isnan(value):
        raise ValueError("lam is NaN.")
    if value < 0:
        raise ValueError(f"lam must be >= 0, got {float(value)}.")
    return float(value)


def check_problem(
    client_label_dists: Any, target_label_dist: Any, client_sizes: Any | None
) -> None:
    """The FedPALS problem data: S (M, K), T (K,), n (M,)."""
    dists = check_label_dists("client_label_dists", client_label_dists)
    target = check_distribution("target_label_dist", target_label_dist)
    if target.shape[0] != dists.shape[1]:
        raise ValueError(
            f"number of classes K differs: client_label_dists has K={dists.shape[1]}, "
            f"target_label_dist has K={target.shape[0]}."
        )
    if client_sizes is not None:
        check_client_sizes(client_sizes, dists.shape[0])


def check_positive_int(name: str, value: Any) -> int:
    """A Python/NumPy integer >= 1 (an iteration budget, a count); bool is refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r} ({type(value).__name__}).")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}.")
    return int(value)


def check_positive_float(name: str, value: Any) -> float:
    """A finite real number > 0 (a tolerance, a step)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(
            f"{name} must be a finite number > 0, got {value!r} ({type(value).__name__})."
        )
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}.")
    return float(value)


def check_ess_fraction(fraction: Any) -> float:
    """An ESS target as a fraction of N: a finite scalar in (0, 1].

    The message says "ESS fraction ... out of range" (callers classify grid points by it).
    """
    array = np.asarray(fraction)
    real = np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    if array.ndim != 0 or not real:  # bool is neither
        raise TypeError(
            f"the ESS fraction must be a real scalar in (0, 1], got {fraction!r} "
            f"(shape {array.shape}, dtype {array.dtype})."
        )
    value = float(array)
    if not 0.0 < value <= 1.0:  # also refuses NaN
        raise ValueError(
            f"ESS fraction {value} is out of range: it must be in (0, 1] (ESS = fraction * N, "
            "N = sum_i n_i, which FedAvg attains at fraction 1)."
        )
    return value


def check_weights(name: str, weights: Any, num_clients: int) -> np.ndarray:
    """Aggregation weights: a finite, non-negative (num_clients,) vector, not all zero."""
    array = np.asarray(weights, dtype=np.float64)
    if array.shape != (num_clients,):
        raise ValueError(
            f"{name} has shape {array.shape} but client_sizes has shape ({num_clients},)."
        )
    _finite_nonnegative(name, array)
    if not array.any():
        raise ValueError(f"{name} is all zeros.")
    return array


def check_real(name: str, value: Any) -> float:
    """A finite real Python/NumPy number (a hyperparameter); bool is refused (ValueError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"{name} must be a real number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    return value


def check_nonnegative(name: str, value: Any) -> float:
    """`check_real`, and >= 0."""
    value = check_real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}.")
    return value


def check_positive(name: str, value: Any) -> float:
    """`check_real`, and > 0."""
    value = check_real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return value


def check_flag(name: str, value: Any) -> bool:
    """A Python/NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}.")
    return bool(value)


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
) -> float:
    """A finite real number inside [low, high] (either end open or absent); bool is refused.

    The message names `name`, the allowed range and the value, e.g. "prox_mu must be a finite
    number >= 0, got -0.1." (the config prefixes the name with its key path).
    """
    if low is not None and high is not None:
        allowed = (
            f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        )
    elif low is not None:
        allowed = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        allowed = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        allowed = "a finite number"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"{name} must be {allowed}{why}, got {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {allowed}{why}, got {value}.")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {allowed}{why}, got {value:g}.")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {allowed}{why}, got {value:g}.")
    return value


def check_integer(name: str, value: Any, low: int, high: int | None = None, why: str = "") -> int:
    """An integer (bool refused) in [low, high] (high None: no upper bound)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be {allowed}{why}, got {value!r}.")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}{why}, got {value}.")
    return value


def check_logits(name: str, logits: Any) -> np.ndarray:
    """An (n, K) float64 matrix of finite model outputs, n >= 1 and K >= 2 (calibration's and
    the label-shift estimators' logits)."""
    array = np.asarray(logits, np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] < 2:
        raise ValueError(f"{name} must be an (n, K) matrix with n >= 1, K >= 2, got {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite.")
    return array


def check_shape(name: str, value: Any) -> tuple[int, ...]:
    """An example's shape: positive integers, as a tuple or list, or a string "28,28,1" (an
    absl flag's value)."""
    items = value.replace("(", "").replace(")", "").split(",") if isinstance(value, str) else value
    try:
        dims = tuple(int(str(d).strip()) if isinstance(value, str) else d for d in items if (
            not isinstance(value, str) or str(d).strip()))
    except (TypeError, ValueError):
        dims = None
    if not dims or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                           and d > 0 for d in dims):
        raise ValueError(
            f"{name} must be a shape of positive integers, e.g. (28, 28, 1) or '28,28,1', "
            f"got {value!r}."
        )
    return tuple(int(d) for d in dims)


def check_text(name: str, value: Any) -> str:
    """A non-empty string (a column's name)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}.")
    return value


def check_bool(name: str, value: Any) -> bool:
    """True or False (NumPy bools too); the message reads as a config key's."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_choice(name: str, value: Any, choices, *, optional: bool = False) -> str | None:
    """One of `choices` (strings), with "did you mean" for a near miss; None when optional."""
    if value is None and optional:
        return None
    allowed = f"one of {list(choices)}" + (" or None" if optional else "")
    if not isinstance(value, str):
        raise ValueError(f"{name} must be {allowed}, got {value!r}.")
    if value not in choices:
        close = difflib.get_close_matches(value, list(choices), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name} must be {allowed}, got {value!r}{hint}.")
    return value


def check_registered_name(
    kind: str, name: Any, *, reserved: tuple[str, ...] = (), deprecated_until: str | None = None
) -> str:
    """A registered name (a method's, a data set's, a partition scheme's, ...): a Python
    identifier (it is a config value, a directory name and part of method keys).
    `deprecated_until`: a non-empty string that is not an identifier only warns
    (`fedjax_pals.deprecation`) until that version, where this kind accepted one before."""
    if not isinstance(name, str) or not name.isidentifier() or name in reserved:
        other = f" other than {' / '.join(map(repr, reserved))}" if reserved else ""
        message = f"a {kind}'s name must be a Python identifier{other}, got {name!r}."
        if deprecated_until and isinstance(name, str) and name.strip() and name not in reserved:
            deprecation.warn(message, refused_in=deprecated_until)
            return name
        raise ValueError(message)
    return name


def check_hook(owner: str, hook: str, value: Any, signature: str, *, optional: bool = False,
               keywords: tuple[str, ...] | None = None) -> None:
    """`value` is callable as `signature` says (None allowed when `optional`): refused when it
    is registered, not as a traceback when a run first calls it. `keywords`: the keyword
    arguments it will be called with (checked against its signature where Python can read it)."""
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{owner}: {hook} must be callable {signature}, got {value!r}.")
    if keywords is None:
        return
    import inspect

    try:
        parameters = inspect.signature(value)
    except (TypeError, ValueError):  # a builtin or C extension: nothing to read
        return
    try:
        parameters.bind(**{key: None for key in keywords})
    except TypeError as error:
        given = ", ".join(keywords) or "no arguments"
        raise TypeError(
            f"{owner}: {hook} {signature} is called with {given}, which its signature "
            f"{parameters} does not take ({error})."
        ) from None
