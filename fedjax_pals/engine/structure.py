"""A hashable key for what a compiled round depends on.

Two algorithms built by separate calls of a builder are separate function objects even when they
compute the same thing; keying a cache on identity would recompile for each (and keep every one
alive). `structure_key` instead describes a function by its code and the values it closes over,
recursively, so equal hyperparameters give equal keys whether or not the builder is cached. Arrays
in closures are baked into the program as constants, so they enter the key by value (a digest of
their bytes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
from typing import Any

import jax
import numpy as np


def _array_key(value) -> tuple:
    array = np.asarray(value)
    return ("array", array.shape, str(array.dtype), hashlib.sha1(array.tobytes()).hexdigest())


def structure_key(obj: Any, _seen: frozenset = frozenset()) -> Any:
    """A hashable description of `obj` equal for functionally equal objects."""
    if isinstance(obj, (str, bytes, int, float, complex, bool, type(None))):
        return (type(obj).__name__, obj)
    if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
        return _array_key(obj)
    if id(obj) in _seen:
        return ("cycle",)
    seen = _seen | {id(obj)}
    if isinstance(obj, functools.partial):
        return (
            "partial",
            structure_key(obj.func, seen),
            structure_key(obj.args, seen),
            structure_key(sorted(obj.keywords.items()), seen),
        )
    if isinstance(obj, types.MethodType):
        return ("method", structure_key(obj.__func__, seen), structure_key(obj.__self__, seen))
    if isinstance(obj, types.FunctionType):
        cells = tuple(
            structure_key(cell.cell_contents, seen) if _cell_filled(cell) else ("empty",)
            for cell in obj.__closure__ or ()
        )
        return (
            "function",
            obj.__code__,
            structure_key(obj.__defaults__, seen),
            structure_key(obj.__kwdefaults__, seen),
            cells,
        )
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(structure_key(item, seen) for item in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, structure_key(v, seen)) for k, v in sorted(obj.items())))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = tuple(
            (f.name, structure_key(getattr(obj, f.name), seen)) for f in dataclasses.fields(obj)
        )
        return ("dataclass", type(obj), fields)
    try:
        hash(obj)
    except TypeError:
        return ("object", id(obj))
    return ("hashable", obj)


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
