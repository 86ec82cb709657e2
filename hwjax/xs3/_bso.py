"""The legacy lib_nn BSO tensor (spec ``xs3.md`` §3.1) and its tflite2xcore derivation (§4.6).

A BSO tensor holds seven 16-bit fields per output channel, in blocks of 16 channels:
shape ``(ceil(C_out/16), 7, 16)``, int16, channel ``c`` at ``[c // 16, row, c % 16]``.

======  ==============  ================================================================
 row     field           stored as
======  ==============  ================================================================
  0      bias_hi         bits 31..16 of the int32 bias (signed)
  1      bias_lo         bits 15..0 of the bias; the int16 bit pattern, read unsigned
  2      shift1          uint16 bit pattern (VLSAT reads it unsigned)
  3      scale           int16
  4      offset_scale    int16
  5      offset          int16
  6      shift2          uint16 bit pattern
======  ==============  ================================================================

``bias = bias_hi * 65536 + u16(bias_lo)``. Channels past ``C_out`` in the last block
are zero (as ``nn_standard_BSO_layout`` writes them when its inputs are zero-padded).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError

ACC_PERIOD = 16  # output channels per BSO block
BSO_ROWS = 7
_I32 = jnp.int32

# (field name, lowest accepted value, highest accepted value)
FIELD_RANGES: tuple[tuple[str, int, int], ...] = (
    ("bias", -(2**31), 2**31 - 1),
    ("shift1", 0, 2**16 - 1),
    ("scale", -(2**15), 2**15 - 1),
    ("offset_scale", -(2**15), 2**15 - 1),
    ("offset", -(2**15), 2**15 - 1),
    ("shift2", 0, 2**16 - 1),
)


class BsoFields(NamedTuple):
    """The six per-channel BSO fields, each an int32 array of shape (C_out,).

    ``shift1``/``shift2`` hold the unsigned 16-bit value that VLSAT reads (0..65535).
    """

    bias: jax.Array
    shift1: jax.Array
    scale: jax.Array
    offset_scale: jax.Array
    offset: jax.Array
    shift2: jax.Array


def _field(value, name: str, lo: int, hi: int) -> jax.Array:
    a = V.as_array(value, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ShapeError(f"{name} must be a 1-D per-channel array, got shape {a.shape}")
    V.check_range(a, lo, hi, name)
    return a


def make_bso(bias, shift1, scale, offset_scale, offset, shift2) -> jax.Array:
    """Packs per-channel fields into the BSO tensor (``nn_standard_BSO_layout``, §3.1).

    Args:
      bias: (C_out,) int32 biases, any value in [-2**31, 2**31-1].
      shift1, shift2: (C_out,) shifts as VLSAT reads them, in [0, 65535] (a negative
        int16 shift element is passed as its unsigned value ``s & 0xFFFF``).
      scale, offset_scale, offset: (C_out,) int16 values in [-32768, 32767].

    All six must have the same length C_out >= 1 and an integer dtype; value ranges are
    checked when the arrays are concrete (ValueError naming the field and the range).

    Returns:
      int16 array of shape (ceil(C_out/16), 7, 16); lanes past C_out are 0.
    """
    values = (bias, shift1, scale, offset_scale, offset, shift2)
    fields = [_field(v, name, lo, hi) for v, (name, lo, hi) in zip(values, FIELD_RANGES)]
    c_out = fields[0].shape[0]
    for f, (name, _, _) in zip(fields, FIELD_RANGES):
        if f.shape[0] != c_out:
            raise ShapeError(f"all BSO fields must have the same length; bias has {c_out}, {name} has {f.shape[0]}")
    if c_out == 0:
        raise ShapeError("bias: BSO fields must describe at least one output channel")
    return _make_bso(*fields)


@eager_program
def _make_bso(*fields) -> jax.Array:
    """:func:`make_bso` after its checks (one program when called eagerly)."""
    c_out = fields[0].shape[0]
    b, *rest = (f.astype(_I32) for f in fields)
    rows = [b >> 16, b & 0xFFFF] + rest
    pad = (-c_out) % ACC_PERIOD
    stacked = jnp.stack(rows)  # (7, C_out), each value's low 16 bits are the field
    stacked = jnp.pad(stacked, ((0, 0), (0, pad)))
    as16 = ((stacked & 0xFFFF) ^ 0x8000) - 0x8000  # the 16-bit pattern, signed
    groups = (c_out + pad) // ACC_PERIOD
    return as16.astype(jnp.int16).reshape(BSO_ROWS, groups, ACC_PERIOD).transpose(1, 0, 2)


def check_bso(bso, c_out: int, name: str = "bso") -> jax.Array:
    """Validates a BSO tensor for ``c_out`` channels and returns it as int32.

    Accepts any integer dtype whose values are int16 (checked when concrete); the shape
    must be (G, 7, 16) with G >= ceil(c_out/16).
    """
    return _as_int32(_checked_bso(bso, c_out, name))


def _checked_bso(bso, c_out: int, name: str = "bso") -> jax.Array:
    """:func:`check_bso`'s checks; the array as given (cast inside the caller's program)."""
    a = V.as_array(bso, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer (int16) array, got dtype {a.dtype}")
    need = -(-c_out // ACC_PERIOD)
    if a.ndim != 3 or a.shape[1:] != (BSO_ROWS, ACC_PERIOD) or a.shape[0] < need:
        raise ShapeError(f"{name} must have shape (G, 7, 16) with G >= ceil({c_out}/16) = {need}, got {a.shape}")
    V.check_range(a, -(2**15), 2**15 - 1, f"{name} (int16 fields)")
    return a


@eager_program
def _as_int32(a: jax.Array) -> jax.Array:
    return a.astype(_I32)


def split_bso(bso, c_out: int) -> BsoFields:
    """Unpacks the first ``c_out`` channels of a BSO tensor (inverse of :func:`make_bso`).

    Returns :class:`BsoFields` of int32 arrays: ``bias = bias_hi*65536 + u16(bias_lo)``,
    ``shift1``/``shift2`` as unsigned 16-bit values, the other fields as int16 values.
    ``split_bso(make_bso(*f), len(f[0]))`` returns ``f`` exactly.
    """
    c_out = V.check_static_int(c_out, 1, 2**31 - 1, "c_out")
    return _unpack_bso(_checked_bso(bso, c_out), c_out)


def bso_rows(bso, c_out: int):
    """The seven 16-bit field rows of the first ``c_out`` channels, (7, C_out), of a (G, 7, 16)
    JAX or NumPy array (the same array type back)."""
    return bso.transpose(1, 0, 2).reshape(BSO_ROWS, -1)[:, :c_out]


@eager_program(static_argnames=("c_out",))
def _unpack_bso(bso: jax.Array, c_out: int) -> BsoFields:
    """:func:`split_bso` without its checks, for a checked (G, 7, 16) integer BSO tensor
    (one program when called eagerly; traced into the caller's program otherwise)."""
    flat = bso_rows(bso.astype(_I32), c_out)
    bias = (flat[0] << 16) | (flat[1] & 0xFFFF)
    return BsoFields(bias, flat[2] & 0xFFFF, flat[3], flat[4], flat[5], flat[6] & 0xFFFF)


# --------------------------------------------------------------- tflite2xcore (§4.6)

_SHIFT_ADJUSTMENT = 7
_MAX_POST_SHIFT = 22 + _SHIFT_ADJUSTMENT - 8  # 21


def _host_array(value, name: str, what: str = "derive_bso_fields") -> np.ndarray:
    """A concrete numeric NumPy array (host-side recipes); :class:`ArgTypeError` for a
    tracer, a string, None, a bool or a ragged list."""
    if isinstance(value, jax.core.Tracer):
        raise ArgTypeError(
            f"{name}: {what} is a host-side (NumPy, float64) conversion and cannot be traced; call it outside jit"
        )
    if value is None or isinstance(value, (str, bytes, dict, set, bool, np.bool_)):
        raise ArgTypeError(f"{name} must be a number or a numeric array, got {value!r}")
    try:
        a = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise ArgTypeError(f"{name} must be a number or a numeric array of one shape, got {value!r}") from None
    if a.dtype.kind not in "iuf":
        raise ArgTypeError(f"{name} must be a number or a numeric array, got dtype {a.dtype}")
    return a


def _host_ints(value, name: str, lo: int, hi: int, what: str = "derive_bso_fields") -> np.ndarray:
    """Concrete integer values in [lo, hi] (a float array holding integers too), as int64."""
    a = _host_array(value, name, what)
    V.check_integral(a, name)
    V.check_range(a, lo, hi, name)
    return a.astype(np.int64)


def _host_int_scalar(value, name: str, lo: int, hi: int, what: str = "derive_bso_fields") -> int:
    """A concrete integer scalar in [lo, hi] (a 0-d or one-element array too)."""
    a = _host_ints(value, name, lo, hi, what)
    if a.size != 1:
        raise ShapeError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _host_scale(value, name: str, what: str = "derive_bso_fields") -> float:
    """A concrete finite scale > 0 (a 0-d or one-element array too)."""
    a = _host_array(value, name, what)
    if a.size != 1:
        raise ShapeError(f"{name} must be a scalar, got shape {a.shape}")
    V.check_positive(a, name)
    return float(a.reshape(()))


def _host_scales(value, name: str, c_out: int, what: str = "derive_bso_fields") -> np.ndarray:
    """Concrete finite scales >= 0, a scalar or one per channel, broadcast to (c_out,) float64."""
    a = _host_array(value, name, what)
    if a.shape not in ((), (1,), (c_out,)):
        raise ShapeError(f"{name} must be a scalar or have shape ({c_out},) (one per channel), got {a.shape}")
    V.check_finite(a, name)
    if a.size and (a < 0).any():
        raise RangeError(f"{name} must be >= 0; found {a.min()}")
    return np.broadcast_to(a, (c_out,))


def derive_bso_fields(
    bias_q,
    weights,
    *,
    input_scale: float,
    input_zero_point: int,
    weight_scales,
    output_scale: float,
    output_zero_point: int,
    channel_axis: int = 0,
) -> BsoFields:
    """BSO fields as tflite2xcore derived them from a quantized TFLite op (§4.6).

    Host-side (NumPy float64, as the converter ran); not traceable. Per channel c with
    multiplier ``m = input_scale * weight_scales[c] / output_scale`` (> 0, or 0):

    * ``r0 = 1 - ceil(log2 m)``, ``scale = rint(m * 2**(14 + r0))`` (ties to even);
      if scale == 2**15 it is halved and r0 decremented; m = 0 gives r0 = 16,
      scale = 32767. ``r = r0 - 7``.
    * ``shift1 = max(r, 0)``, ``shift2 = 21 + min(r, 0)`` (ValueError if negative).
    * ``raw = output_zero_point * 2**shift2``; ``offset_scale = rint(sqrt(|raw|))``;
      ``offset = rint(raw / offset_scale)`` (0 when offset_scale = 0).
    * ``bias = clip(bias_q - input_zero_point * sum(w[c]), -2**31, 2**31-1)``, the sum
      over every axis of ``weights`` except ``channel_axis`` (whole kernel for
      conv/fully-connected; spatial taps for depthwise with ``channel_axis=-1``).

    Args:
      bias_q: (C_out,) int32 TFLite biases (zeros if the op had none).
      weights: int8 kernel with the output channels on ``channel_axis``.
      input_scale, input_zero_point, weight_scales ((C_out,) or scalar),
      output_scale, output_zero_point: TFLite quantization parameters.

    Returns:
      :class:`BsoFields` (NumPy int32 arrays), ready for :func:`make_bso`.
    """
    w = _host_ints(weights, "weights", -128, 127)
    b = _host_ints(bias_q, "bias_q", -(2**31), 2**31 - 1).reshape(-1)
    if w.ndim < 1:
        raise ShapeError(f"weights must have at least one axis (the output channels), got shape {w.shape}")
    channel_axis = V.check_static_int(channel_axis, -w.ndim, w.ndim - 1, "channel_axis")
    w = np.moveaxis(w, channel_axis, 0).reshape(w.shape[channel_axis], -1)
    c_out = w.shape[0]
    if b.shape[0] != c_out:
        raise ShapeError(f"bias_q has {b.shape[0]} channels, weights have {c_out}")
    ws = np.asarray(_host_scales(weight_scales, "weight_scales", c_out), np.float64)
    input_scale = _host_scale(input_scale, "input_scale")
    output_scale = _host_scale(output_scale, "output_scale")
    input_zero_point = _host_int_scalar(input_zero_point, "input_zero_point", -128, 127)
    output_zero_point = _host_int_scalar(output_zero_point, "output_zero_point", -128, 127)
    m = np.float64(input_scale) * ws / np.float64(output_scale)
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise RangeError("input_scale, weight_scales, output_scale: scales must be finite and non-negative")
    nz = m != 0
    r = np.full(c_out, 16, np.int64)
    scale = np.full(c_out, 2**15 - 1, np.int64)
    r[nz] = (1 - np.ceil(np.log2(m[nz]))).astype(np.int64)
    scale[nz] = np.round(m[nz] * 2.0 ** (14 + r[nz])).astype(np.int64)
    halve = scale == 2**15
    scale[halve] //= 2
    r[halve] -= 1
    r -= _SHIFT_ADJUSTMENT
    shift1 = np.maximum(r, 0)
    shift2 = _MAX_POST_SHIFT + np.minimum(r, 0)
    if np.any(shift2 < 0):
        raise RangeError(
            f"multiplier too large: shift2 would be negative for channels {np.nonzero(shift2 < 0)[0].tolist()}"
        )
    raw = np.float64(output_zero_point) * 2.0 ** shift2.astype(np.float64)
    offset_scale = np.round(np.sqrt(np.abs(raw))).astype(np.int64)
    offset = np.zeros(c_out, np.int64)
    pos = offset_scale > 0
    offset[pos] = np.round(raw[pos] / offset_scale[pos]).astype(np.int64)
    bias = np.clip(b - int(input_zero_point) * w.sum(axis=1), -(2**31), 2**31 - 1)
    out = [bias, shift1, scale, offset_scale, offset, shift2]
    for v, (name, lo, hi) in zip(out, FIELD_RANGES):
        if v.min() < lo or v.max() > hi:
            raise RangeError(f"derived {name} leaves [{lo}, {hi}]")
    return BsoFields(*(v.astype(np.int32) for v in out))
