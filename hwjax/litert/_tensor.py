"""Integer kernels of LiteRT's tensor operators: PAD, CONCATENATION, MEAN, MUL, DEQUANTIZE.

Kernels take batched int32 arrays holding the tensors' values and the integer parameters
the TFLite target's recipes derive; they are pure and jittable.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program, mul_rn
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.litert._arith import (
    INT32_MAX,
    INT32_MIN,
    _traced,
    check_act_range,
    check_int_array,
    check_ints,
    check_params,
    check_scales,
    check_zero_point,
    params_used,
    requantize,
)

_I32 = jnp.int32


#: |(x1 - z1) (x2 - z2)| for int8 values and zero points
_MAX_PRODUCT = 255 * 255


def mul_int16_safe(s1, s2, s_out, z_out) -> bool:
    """True when no int8 MUL product can reach LiteRT's optimized kernel's int16 narrowing
    (``|MBQM(p)| + |z_out| < 2**15``): then its 16-lane path equals the int32 formula."""
    real = float(np.float32(s1)) * float(np.float32(s2)) / float(np.float32(s_out))
    return _MAX_PRODUCT * real + 2 + abs(int(z_out)) < 2**15 - 1


def _example_axes(axes, rank: int, name: str = "axes") -> tuple:
    """Per-example axes (of an array of ``rank`` axes, the batch axis first) as a tuple of
    ints in ``[-(rank - 1), rank - 2]``."""
    seq = axes if isinstance(axes, (tuple, list)) else (axes,)
    out = []
    for a in seq:
        out.append(V.check_static_int(a, -(rank - 1), rank - 2, name))
    return tuple(out)


def _check_batch(x, name: str = "x", lo: int = -128, hi: int = 127):
    x = check_int_array(x, name, lo, hi)
    if x.ndim < 1:
        raise ShapeError(f"{name} must have a leading batch axis, got shape {x.shape}")
    return x


def _check_multiplier(p):
    """``p['multiplier']`` an int32, ``p['shift']`` in [-31, 31] (``QuantizeMultiplier``'s
    range for any scale ratio below 2**31)."""
    check_ints(p["multiplier"], "p['multiplier']", INT32_MIN, INT32_MAX)
    check_ints(p["shift"], "p['shift']", -31, 31)


def _check_mul(x1, x2, p, keys):
    x1 = _check_batch(x1, "x1")
    x2 = _check_batch(x2, "x2")
    V.check_broadcast(x1, "x1", x2, "x2")
    check_params(p, "p", keys)
    if "shift" in keys:
        _check_multiplier(p)
    for k in ("z1", "z2", "zout"):
        check_zero_point(p[k], f"p['{k}']")
    check_act_range(p["act_min"], p["act_max"], ("p['act_min']", "p['act_max']"))
    return x1, x2


def pad_int(x, paddings, value):
    """``x`` (batch, ...) padded per example by ``paddings`` with ``value``."""
    x = _check_batch(x, "x", -128, 255)  # PAD keeps the quantisation: int8 or uint8
    check_zero_point(value, "value", -128, 255)
    try:
        pads = np.asarray(paddings) if not isinstance(paddings, (str, bytes)) else None
    except (TypeError, ValueError):
        pads = None
    if pads is None or pads.dtype.kind not in "iu" or (pads.size and pads.ndim != 2):
        raise ArgTypeError(f"paddings must be one (before, after) pair of ints per example axis, got {paddings!r}")
    if pads.shape != (x.ndim - 1, 2):
        raise ShapeError(
            f"paddings must be {x.ndim - 1} (before, after) pairs (one per example axis of x of shape "
            f"{x.shape}), got shape {pads.shape}"
        )
    V.check_range(pads, 0, INT32_MAX, "paddings")
    return jnp.pad(x, ((0, 0), *paddings), constant_values=value)


def concat_int(xs, axis: int):
    """The per-example arrays ``xs`` joined along per-example ``axis``."""
    if not isinstance(xs, (list, tuple)):
        raise ArgTypeError(f"xs must be a list of arrays, got {type(xs).__name__}")
    if not xs:
        raise ShapeError("xs must hold at least one array, got none")
    xs = [check_int_array(x, f"xs[{i}]", INT32_MIN, INT32_MAX) for i, x in enumerate(xs)]
    rank = xs[0].ndim
    if rank < 2:
        raise ShapeError(f"xs[0] must have a batch axis and at least one example axis, got shape {xs[0].shape}")
    a = V.check_static_int(axis, -(rank - 1), rank - 2, "axis")
    a = a % (rank - 1)
    for i, x in enumerate(xs):
        if x.ndim != rank or x.shape[: a + 1] != xs[0].shape[: a + 1] or x.shape[a + 2 :] != xs[0].shape[a + 2 :]:
            raise ShapeError(
                f"xs[{i}] of shape {x.shape} cannot be joined with xs[0] of shape {xs[0].shape} "
                f"along example axis {axis}"
            )
    return jnp.concatenate(xs, axis=axis + 1)


def _sum(x, axes, keep: bool):
    """Exact int32 sum over per-example ``axes`` (int8 values: no overflow below 2**23 terms)."""
    return jnp.sum(x.astype(_I32), axis=tuple(a + 1 for a in axes), keepdims=keep, dtype=_I32)


def mean_mbqm(x, axes, keep: bool, count: int, p):
    """LiteRT ``QuantizedMeanOrSum`` (reference; optimized except the 4-D keep-dims case):
    ``clamp(MBQM(S - z_in count, m, e) + z_out, -128, 127)`` with ``S`` the exact sum and
    ``(m, e)`` from :func:`mean_multiplier`."""
    x = _check_batch(x)
    axes = _example_axes(axes, x.ndim)
    V.check_flag(keep, "keep")
    count = V.check_static_int(count, 1, INT32_MAX, "count")
    check_params(p, "p", ("multiplier", "shift", "zin", "zout"))
    _check_multiplier(p)
    check_zero_point(p["zin"], "p['zin']")
    check_zero_point(p["zout"], "p['zout']")
    return _mean_mbqm(x, axes, keep, count, params_used(p, ("multiplier", "shift", "zin", "zout")))


@eager_program(static_argnames=("axes", "keep", "count"))
def _mean_mbqm(x, axes, keep, count, p):
    s = _sum(x, axes, keep) - p["zin"] * count
    return requantize(s, p, "double", output_zero_point=p["zout"], act_min=-128, act_max=127)


def mean_lanes(x, axes, keep: bool, p, lanes: int):
    """LiteRT's optimized int8 ``Mean`` (4-D input, axes {1, 2}, keep_dims):
    ``clamp(R(S) + bias, -128, 127)`` with ``S`` the raw sum (no zero point), ``R`` the
    NEON-on-x86 rounding (R3: the last shift rounds ties up) on the first ``lanes``
    channels and the double-rounding MBQM on the rest."""
    x = _check_batch(x)
    axes = _example_axes(axes, x.ndim)
    V.check_flag(keep, "keep")
    lanes = V.check_static_int(lanes, 0, INT32_MAX, "lanes")
    check_params(p, "p", ("multiplier", "shift", "bias"))
    _check_multiplier(p)
    check_ints(p["bias"], "p['bias']", INT32_MIN, INT32_MAX)
    return _mean_lanes(x, axes, keep, params_used(p, ("multiplier", "shift", "bias")), lanes)


@eager_program(static_argnames=("axes", "keep", "lanes"))
def _mean_lanes(x, axes, keep, p, lanes):
    s = _sum(x, axes, keep)
    lane = jnp.arange(s.shape[-1]) < lanes
    a = requantize(s, p, "ruy", output_zero_point=p["bias"], act_min=-128, act_max=127)
    c = requantize(s, p, "double", output_zero_point=p["bias"], act_min=-128, act_max=127)
    return jnp.where(lane, a, c)


def mean_float(x, axes, keep: bool, p):
    """XNNPACK qs8 mean: ``clamp(rint(fl32(fl32(S) sm) + zf), -128, 127)`` in float32, ties
    to even (``sm`` and ``zf`` from the recipe)."""
    x = _check_batch(x)
    axes = _example_axes(axes, x.ndim)
    V.check_flag(keep, "keep")
    check_params(p, "p", ("sm", "zf"))
    check_scales(p["sm"], "p['sm']")
    if not _traced(p["zf"]) and not np.all(np.isfinite(np.asarray(p["zf"], np.float32))):
        raise RangeError(f"p['zf'] must be finite, got {p['zf']!r}")
    return _mean_float(x, axes, keep, params_used(p, ("sm", "zf")))


@eager_program(static_argnames=("axes", "keep"))
def _mean_float(x, axes, keep, p):
    v = mul_rn(_sum(x, axes, keep), p["sm"]) + p["zf"]  # fl32(S sm) rounded before the addition
    return jnp.clip(jnp.round(v), -128, 127).astype(_I32)


def mul_product(x1, x2, z1, z2):
    """``(x1 - z1) * (x2 - z2)``, broadcast per example (exact int32)."""
    return (x1 - z1) * (x2 - z2)


_MUL_KEYS = ("multiplier", "shift", "z1", "z2", "zout", "act_min", "act_max")


def mul_mbqm(x1, x2, p):
    """TFLite int8 MUL (reference, and optimized for broadcasts bounded by
    :func:`mul_int16_safe`): ``clamp(MBQM(p, m, e) + z_out, act_min, act_max)``."""
    x1, x2 = _check_mul(x1, x2, p, _MUL_KEYS)
    return _mul_mbqm(x1, x2, params_used(p, _MUL_KEYS))


@eager_program
def _mul_mbqm(x1, x2, p):
    prod = mul_product(x1, x2, p["z1"], p["z2"])
    return requantize(prod, p, "double", output_zero_point=p["zout"], act_min=p["act_min"], act_max=p["act_max"])


def mul_lanes(x1, x2, p):
    """LiteRT's optimized int8 MUL of equal shapes: elements ``[0, 16 floor(N/16))`` of each
    example (``N`` its size, row-major) take the 16-lane path (MBQM, saturated to int16,
    ``+ z_out`` wrapping in int16, saturated to int8, clamped); the rest the scalar int32
    path of :func:`mul_mbqm`."""
    x1, x2 = _check_mul(x1, x2, p, _MUL_KEYS)
    return _mul_lanes(x1, x2, params_used(p, _MUL_KEYS))


@eager_program
def _mul_lanes(x1, x2, p):
    prod = mul_product(x1, x2, p["z1"], p["z2"])
    v = requantize(prod, p, "double", output_zero_point=0, act_min=-(2**30), act_max=2**30)
    v16 = jnp.clip(v, -(2**15), 2**15 - 1) + p["zout"]
    v16 = (v16 + 2**15) % 2**16 - 2**15  # int16 wrap of vaddq_s16
    lane = jnp.clip(v16, -128, 127)
    scalar = v + p["zout"]
    n = math.prod(x1.shape[1:])
    idx = jnp.arange(n).reshape(x1.shape[1:])
    y = jnp.where(idx < 16 * (n // 16), lane, scalar)
    return jnp.clip(y, p["act_min"], p["act_max"])


def mul_float(x1, x2, p):
    """XNNPACK qs8 multiply: ``clamp(rint(fl32(fl32(p) scale)) + z_out, act_min, act_max)``."""
    x1, x2 = _check_mul(x1, x2, p, ("scale", "z1", "z2", "zout", "act_min", "act_max"))
    check_scales(p["scale"], "p['scale']")
    return _mul_float(x1, x2, params_used(p, ("scale", "z1", "z2", "zout", "act_min", "act_max")))


@eager_program
def _mul_float(x1, x2, p):
    prod = mul_product(x1, x2, p["z1"], p["z2"]).astype(jnp.float32)
    v = jnp.round(jnp.clip(prod * p["scale"], -(2.0**24), 2.0**24)).astype(_I32)
    return jnp.clip(v + p["zout"], p["act_min"], p["act_max"])


def square_lut(x, p):
    """XNNPACK's squaring of an int8 tensor: ``table[x + 128]`` clamped to the activation
    range (the table from the recipe)."""
    x = check_int_array(x, "x")
    check_params(p, "p", ("table", "act_min", "act_max"))
    if not _traced(p["table"]):
        check_ints(p["table"], "p['table']")
    if np.shape(p["table"]) != (256,):
        raise ShapeError(f"p['table'] must be a (256,) integer table, got shape {np.shape(p['table'])}")
    check_act_range(p["act_min"], p["act_max"], ("p['act_min']", "p['act_max']"))
    return _square_lut(x, params_used(p, ("table", "act_min", "act_max")))


@eager_program
def _square_lut(x, p):
    y = jnp.take(p["table"], x + 128, mode="clip")
    return jnp.clip(y, p["act_min"], p["act_max"])


def _check_dequantize(x, p, keys):
    x = _check_batch(x)
    check_params(p, "p", keys)
    check_scales(p["scale"], "p['scale']")
    check_zero_point(p["z"], "p['z']")
    if "zs" in keys and not _traced(p["zs"]) and not np.all(np.isfinite(np.asarray(p["zs"], np.float32))):
        raise RangeError(f"p['zs'] must be finite, got {p['zs']!r}")
    return x


def dequantize_exact(x, p):
    """``fl32(scale * (x - z))`` (one rounding of the exact product: LiteRT reference and
    XNNPACK)."""
    return _dequantize_exact(_check_dequantize(x, p, ("scale", "z")), params_used(p, ("scale", "z")))


@eager_program
def _dequantize_exact(x, p):
    return (x - p["z"]).astype(jnp.float32) * p["scale"]


def dequantize_lanes(x, p):
    """LiteRT's optimized int8 DEQUANTIZE: elements ``[0, 8 floor(N/8))`` of each example
    take ``fl32(fl32(x scale) + fl32(-z scale))`` (no fused multiply-add on x86); the rest
    :func:`dequantize_exact`."""
    return _dequantize_lanes(_check_dequantize(x, p, ("scale", "zs", "z")), params_used(p, ("scale", "zs", "z")))


@eager_program
def _dequantize_lanes(x, p):
    n = math.prod(x.shape[1:])
    lane = mul_rn(x, p["scale"]) + p["zs"]  # fl32(x scale) rounded before the addition
    idx = jnp.arange(n).reshape(x.shape[1:])
    return jnp.where(idx < 8 * (n // 8), lane, _dequantize_exact(x, p))
