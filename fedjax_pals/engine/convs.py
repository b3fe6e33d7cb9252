"""Convolutions of vmapped clients as patches times kernel: no grouped convolutions.

A backend that vmaps the client update (`vmap_scan`, `vmap_chunked`, `vmap_steps`) vmaps the
model over clients whose parameters differ, and over the runs axis on top. JAX's batching rule for
a convolution whose kernel carries a vmapped axis folds that axis into the channels: the program
holds convolutions with `feature_group_count` = lanes (runs x clients), forward, input gradient
and kernel gradient alike (docs/decisions/0106-vmapped-convolutions-as-matmuls.md counts them).
GPU convolution libraries run such grouped convolutions slowly; one H200 ran 16 runs of
pfl-research's CIFAR-10 CNN (800 lanes) at 0.41x the speed of one run (docs/measurements/gpu.md).

`matmul_convs(fn)` is `fn` with every `conv_general_dilated` of its program (also inside `cond`
branches, such as `lax.platform_dependent`'s, `jit`, `closed_call`, `scan`, `while` and `remat`)
computed as its patches (the kernel's shifted strided slices of the padded input, stacked:
(N, *out, kh*kw*C_in)) times the kernel reshaped to (kh*kw*C_in, C_out): one `dot_general`.
Vmapped, that is a batched matmul over the lanes; its gradients are batched matmuls and the
transpose of the slices (pads and adds): no convolution is left. Convolutions it does not cover
(lhs dilation, groups of the model's own, or one inside another higher-order primitive, e.g. a
`custom_vjp`) stay as they are. The numbers are the convolution's up to float32 rounding (the
kh*kw*C_in products are summed in another order): `conv_error_bound` gives the bound the tests use.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

# What an engine does with the convolutions of a vmapped client update (`RoundEngine`'s
# `vmapped_convs`): "patches" (this module) or "grouped" (JAX's batching rule, as before).
VMAPPED_CONVS = ("patches", "grouped")

# Higher-order primitives whose sub-programs are rewritten too (their params hold ClosedJaxprs
# or Jaxprs that compute what the primitive computes, nothing else).
_REWRITTEN_HIGHER_ORDER = {"cond", "pjit", "jit", "closed_call", "core_call", "scan", "while",
                           "remat", "checkpoint"}


def conv_as_matmul(
    lhs,
    rhs,
    *,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    dimension_numbers,
    feature_group_count,
    batch_group_count,
    precision=None,
    preferred_element_type=None,
    **_,
):
    """`lax.conv_general_dilated_p`'s output, as patches times kernel (one `dot_general`);
    falls back to the convolution itself where lhs dilation or groups are asked for."""
    def native():
        return lax.conv_general_dilated_p.bind(
            lhs, rhs, window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
            feature_group_count=feature_group_count, batch_group_count=batch_group_count,
            precision=precision, preferred_element_type=preferred_element_type,
        )

    if feature_group_count != 1 or batch_group_count != 1 or any(d != 1 for d in lhs_dilation):
        return native()
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nsp = len(lhs_spec) - 2
    # (N, *spatial, C_in) and (*window, C_in, C_out)
    h = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    kernel = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    zero = jnp.zeros((), h.dtype)
    h = lax.pad(h, zero, [(0, 0, 0), *[(lo, hi, 0) for lo, hi in padding], (0, 0, 0)])
    window = kernel.shape[:nsp]
    out = [
        (h.shape[1 + d] - (window[d] - 1) * rhs_dilation[d] - 1) // window_strides[d] + 1
        for d in range(nsp)
    ]
    if min(out, default=1) < 1:  # an empty output: left to the convolution
        return native()
    n, c_in = h.shape[0], h.shape[-1]
    rows = []
    for offset in itertools.product(*(range(k) for k in window)):  # ordered as the kernel's rows
        start = (0, *(o * rd for o, rd in zip(offset, rhs_dilation)), 0)
        limit = (n, *(s + (o - 1) * st + 1 for s, o, st in zip(start[1:-1], out, window_strides)),
                 c_in)
        rows.append(lax.slice(h, start, limit, (1, *window_strides, 1)))
    patches = jnp.stack(rows, axis=-2).reshape(n, *out, len(rows) * c_in)
    kernel = kernel.reshape(len(rows) * c_in, kernel.shape[-1])
    y = lax.dot_general(
        patches, kernel, (((patches.ndim - 1,), (0,)), ((), ())),
        precision=precision, preferred_element_type=preferred_element_type,
    )  # (N, *out, C_out)
    perm = [0] * y.ndim
    perm[out_spec[0]], perm[out_spec[1]] = 0, y.ndim - 1
    for d in range(nsp):
        perm[out_spec[2 + d]] = 1 + d
    return jnp.transpose(y, perm)


def _has_conv(jaxpr) -> bool:
    return any(eqn.primitive is lax.conv_general_dilated_p for eqn in jaxpr.eqns) or any(
        _has_conv(sub) for sub in _sub_jaxprs(jaxpr)
    )


def _sub_jaxprs(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _REWRITTEN_HIGHER_ORDER:
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple) else (value,):
                    if isinstance(item, jex_core.ClosedJaxpr):
                        yield item.jaxpr
                    elif isinstance(item, jex_core.Jaxpr):
                        yield item


def _aval_spec(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _rewritten(item):
    """A ClosedJaxpr / Jaxpr computing the same with its convolutions as matmuls."""
    jaxpr = item.jaxpr if isinstance(item, jex_core.ClosedJaxpr) else item
    if not _has_conv(jaxpr):
        return item
    consts = item.consts if isinstance(item, jex_core.ClosedJaxpr) else []
    if isinstance(item, jex_core.Jaxpr) and jaxpr.constvars:
        return item  # an open program with constants: left as it is
    closed = jax.make_jaxpr(lambda *args: _eval(jaxpr, consts, args))(
        *[_aval_spec(v.aval) for v in jaxpr.invars]
    )
    if isinstance(item, jex_core.ClosedJaxpr):
        return closed
    return item if closed.consts else closed.jaxpr


def _eval(jaxpr, consts, args):
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive is lax.conv_general_dilated_p:
            outvals = [conv_as_matmul(*invals, **eqn.params)]
        else:
            params = eqn.params
            if eqn.primitive.name in _REWRITTEN_HIGHER_ORDER:
                params = {
                    k: tuple(map(_rewritten, v)) if isinstance(v, tuple)
                    and all(isinstance(i, (jex_core.ClosedJaxpr, jex_core.Jaxpr)) for i in v)
                    else _rewritten(v) if isinstance(v, (jex_core.ClosedJaxpr, jex_core.Jaxpr))
                    else v
                    for k, v in params.items()
                }
            bind_params, subfuns = eqn.primitive.get_bind_params(params), ()
            if isinstance(bind_params, tuple):  # (subfuns, params) in older JAX versions
                subfuns, bind_params = bind_params
            ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
            with ctx if ctx is not None else contextlib.nullcontext():
                outvals = eqn.primitive.bind(*subfuns, *invals, **bind_params)
            if not eqn.primitive.multiple_results:
                outvals = [outvals]
        for v, x in zip(eqn.outvars, outvals):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def matmul_convs(fn: Callable) -> Callable:
    """`fn` (of arrays, pytrees in and out) with its convolutions as patches times kernel;
    a function without a convolution is computed as it is."""

    def rewritten(*args):
        flat, in_tree = jax.tree_util.tree_flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *leaves: fn(*jax.tree_util.tree_unflatten(in_tree, leaves)), return_shape=True
        )(*[_aval_spec(jax.typeof(x)) for x in flat])
        if not _has_conv(closed.jaxpr):
            return fn(*args)
        out = _eval(closed.jaxpr, closed.consts, flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), out)

    rewritten.__wrapped__ = fn
    return rewritten


def conv_error_bound(lhs, rhs, window_strides, padding, dimension_numbers=None,
                     rhs_dilation=None):
    """An elementwise bound on |computed - exact| of a float32 convolution summed in any order
    (the convolution's or its patches times kernel): gamma_k (|lhs| conv |rhs|), k = kh*kw*C_in
    products per output, gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy and Stability
    of Numerical Algorithms, Sec. 3.1). Two float32 results differ by at most twice this.
    The magnitudes are a float32 convolution at HIGHEST precision, inflated by 1 + 2 gamma_k
    for their own rounding. NHWC / HWIO unless `dimension_numbers` say otherwise."""
    lhs, rhs = jnp.abs(jnp.asarray(lhs, jnp.float32)), jnp.abs(jnp.asarray(rhs, jnp.float32))
    dn = lax.conv_dimension_numbers(
        lhs.shape, rhs.shape, dimension_numbers or ("NHWC", "HWIO", "NHWC")
    )
    k = int(np.prod(rhs.shape)) // rhs.shape[dn.rhs_spec[0]]
    u = float(np.finfo(np.float32).eps) / 2
    gamma = k * u / (1 - k * u)
    magnitude = lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, rhs_dilation=rhs_dilation, dimension_numbers=dn,
        precision=lax.Precision.HIGHEST,
    )
    return gamma * (1 + 2 * gamma) * np.asarray(magnitude)


_CONV_LINE = re.compile(r"\bconvolution\(|stablehlo\.convolution")


def conv_groups(hlo_text: str) -> dict[tuple[int, int], int]:
    """The convolutions of a program's text (an HLO module, `compile().as_text()`, or a
    StableHLO one, `lower().as_text()`): {(feature_group_count, batch_group_count): count}."""
    counts: collections.Counter = collections.Counter()
    for line in hlo_text.splitlines():
        if _CONV_LINE.search(line):
            fg = re.search(r"feature_group_count\s*=\s*(\d+)", line)
            bg = re.search(r"batch_group_count\s*=\s*(\d+)", line)
            counts[(int(fg.group(1)) if fg else 1, int(bg.group(1)) if bg else 1)] += 1
    return dict(counts)


def grouped_convs(hlo_text: str) -> int:
    """How many convolutions of the program's text have feature or batch groups (> 1)."""
    return sum(n for (fg, bg), n in conv_groups(hlo_text).items() if fg > 1 or bg > 1)
