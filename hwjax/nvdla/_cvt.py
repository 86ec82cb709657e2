"""NVDLA precision convertors, precision-conversion validity and fp16 special values (spec 5).

The integer convertor of every unit is

    y = sat_out( [sat_17]( rshift_rhaz( (x - offset) * scale, shift ) ) )

with an exact subtraction and product (two-word integers from :mod:`hwjax.core.wide`,
so up to 64 bits without ``jax_enable_x64``), a right shift rounded half away from zero
and saturation; the CDMA and SDP output convertors saturate to int17 first (the value an
fp16 output is converted from, and the stage whose saturation is flagged).

The public functions check their arguments in Python (values when concrete), then run as
one jitted program each (static: widths and options), so an eager call compiles once per
shapes and options instead of once per ``jax.numpy`` operation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import wide
from hwjax.core import float0_zeros, int_bounds, to_float16, unbroadcast
from hwjax.errors import ArgTypeError, RangeError, ShapeError

__all__ = [
    "CONVERTORS",
    "ConvertorSpec",
    "INF_REPLACEMENT",
    "check_precision_conversion",
    "cvt",
    "cvt_unit",
    "fp16_input",
    "fp16_output",
    "fp16_to_int16",
    "int_to_fp16",
    "sign_extend",
    "valid_precision_conversions",
]

_I32 = jnp.int32
_U32 = jnp.uint32
OutBits = Union[int, Literal["fp16"]]
FP16_MAX = 65504.0


# ----------------------------------------------------------------------------- helpers


def sign_extend(value: Any, bits: int):
    """``sx_n(v)``: the low ``bits`` bits of ``value`` read as two's complement.

    Python ints give a Python int; integer arrays (at most 32 bits) give int32.
    """
    bits = V.check_static_int(bits, 1, 32, "bits")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if v >> (bits - 1) else v
    x = V.as_array(value, "value")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ArgTypeError(f"value must be an integer array, got {x.dtype}")
    return _sign_extend_jit(x, bits)


@functools.partial(jax.jit, static_argnums=1)
def _sign_extend_jit(x: jax.Array, bits: int) -> jax.Array:
    u = x.astype(_U32) if x.dtype != jnp.int32 else jax.lax.bitcast_convert_type(x, _U32)
    mask = _U32(0xFFFFFFFF) if bits == 32 else _U32((1 << bits) - 1)
    sign = _U32(1 << (bits - 1))
    return jax.lax.bitcast_convert_type(((u & mask) ^ sign) - sign, _I32)


def _in_pm1(a: wide.Wide) -> jax.Array:
    """True where the Wide value is -1, 0 or 1."""
    return ((a.hi == 0) & (a.lo <= 1)) | ((a.hi == -1) & (a.lo == _U32(0xFFFFFFFF)))


def _int17_to_fp16(v: jax.Array) -> jax.Array:
    """Integer (|v| <= 2**24) to fp16, nearest-even, clipped to +-65504 (no INF output)."""
    return to_float16(jnp.clip(v.astype(jnp.float32), -FP16_MAX, FP16_MAX))


def int_to_fp16(x: Any) -> jax.Array:
    """Integer to fp16 as NVDLA's convertors output it (int17 -> fp16, spec 5.2/5.4).

    Round to nearest even; results beyond the fp16 range saturate to +-65504 (no unit
    outputs INF). ``x``: integer array with ``|x| <= 2**24``.
    """
    x = V.as_array(x, "x")
    if V.kind(x, "x") != "int":
        raise ArgTypeError(f"x must be an integer array, got {x.dtype}")
    V.check_range(x, -(2**24), 2**24, "x")
    return _int_to_fp16_jit(x)


@jax.jit
def _int_to_fp16_jit(x: jax.Array) -> jax.Array:
    return _int17_to_fp16(x.astype(_I32))


# --------------------------------------------------------------------------------- cvt


def _cvt_int(x: wide.Wide, offset, scale, shift, stage_bits, out_bits):
    """(result int32 or fp16, clipped at any stage, C-model saturation flag)."""
    p = wide.mul_wide_int32(wide.sub(x, wide.from_int32(offset)), scale)  # |.| < 2**63
    r = wide.shift_right(p, shift, "half_away")
    first = stage_bits if stage_bits is not None else out_bits
    y, clipped = wide.saturate_to_int32(r, *int_bounds(first, symmetric=False))
    # IntShiftRightSat: flagged unless floor(p / 2**shift) is within 1 of the stage output.
    flag = ~_in_pm1(wide.sub(wide.floor_shift(p, shift), wide.from_int32(y)))
    if out_bits == "fp16":
        return _int17_to_fp16(y), clipped, flag
    if stage_bits is not None:
        y2 = jnp.clip(y, *int_bounds(out_bits, symmetric=False))
        clipped = clipped | (y2 != y)
        y = y2
    return y, clipped, flag


# One compiled kernel per (stage, output) configuration and shape: eager calls then cost a
# single dispatch instead of dozens of two-word integer ops (inside jit it is inlined).
_cvt_int_jit = jax.jit(_cvt_int, static_argnums=(4, 5))


@functools.lru_cache(maxsize=None)
def _cvt_float(stage_bits, out_bits, saturation_grad):
    def ints(x, offset, scale, shift):
        return _cvt_int_jit(wide.from_int32(x.astype(_I32)), offset, scale, shift, stage_bits, out_bits)

    def cast(y, x):
        return y if out_bits == "fp16" else y.astype(x.dtype)

    @jax.custom_vjp
    def f(x, offset, scale, shift):
        return cast(ints(x, offset, scale, shift)[0], x)

    def fwd(x, offset, scale, shift):
        y, clipped, _ = ints(x, offset, scale, shift)
        return cast(y, x), (x, offset, scale, shift, clipped)

    def bwd(res, g):
        x, offset, scale, shift, clipped = res
        gx = g.astype(jnp.float32) * jnp.ldexp(scale.astype(jnp.float32), -shift.astype(_I32))  # exact 2**-shift
        if saturation_grad == "zero":
            gx = jnp.where(clipped, jnp.zeros_like(gx), gx)
        gx = unbroadcast(gx, x.shape).astype(x.dtype)
        return gx, float0_zeros(offset), float0_zeros(scale), float0_zeros(shift)

    f.defvjp(fwd, bwd)
    return f


def _check_out(out_bits, stage_bits):
    if out_bits != "fp16":
        out_bits = V.check_static_int(out_bits, 2, 32, "out_bits (or 'fp16')")
    if stage_bits is not None:
        stage_bits = V.check_static_int(stage_bits, 2, 32, "stage_bits")
        if out_bits != "fp16" and out_bits > stage_bits:
            raise RangeError(f"out_bits={out_bits} must not exceed stage_bits={stage_bits}")
    elif out_bits == "fp16":
        raise RangeError("out_bits='fp16' converts the int17 stage: pass stage_bits=17")
    if out_bits == "fp16" and stage_bits > 25:
        raise RangeError(f"out_bits='fp16' needs stage_bits <= 25, got {stage_bits}")
    return out_bits, stage_bits


def _int_arg(v, lo, hi, name) -> jax.Array:
    """A checked integer register operand (converted to int32 inside the jitted program)."""
    a = V.as_array(v, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer or integer array, got dtype {a.dtype}")
    V.check_range(a, lo, hi, name)
    return a


def cvt(
    x: Any,
    *,
    offset: Any,
    scale: Any,
    shift: Any,
    out_bits: OutBits,
    stage_bits: Optional[int] = None,
    return_flags: bool = False,
    saturation_grad: Literal["zero", "pass"] = "zero",
):
    """NVDLA integer convertor (spec 5.1): ``sat_out([sat_stage](rshift_rhaz((x - offset) * scale, shift)))``.

    Exact: ``x - offset`` and the product are formed without overflow (up to 64 bits as
    two 32-bit words); the right shift rounds half away from zero
    (``q = (|v| + 2**(shift-1)) >> shift`` with the sign of ``v``); saturation is two's
    complement (``[-2**(n-1), 2**(n-1) - 1]``). With ``stage_bits`` (17 for the CDMA and
    SDP output convertors) the value is saturated to that width first and then to
    ``out_bits`` (equal to a single saturation for integer outputs; the stage value is what
    ``out_bits="fp16"`` converts, to nearest even, clipped to +-65504).

    Saturation flag (``return_flags``), as the C model's ``IntShiftRightSat``: set where
    ``floor(v / 2**shift)`` differs by more than 1 from the first saturation stage's output
    (the int17 stage when present), so a value clamped to int8/int16 but fitting int17 is
    not flagged.

    Args:
      x: integer array (at most 32 bits), a :class:`hwjax.core.wide.Wide` (wider inputs
        such as the CDP's int33, ``|x| < 2**40``), or a float array holding integers
        (differentiable).
      offset: int32-range integer or array (broadcasts against ``x``).
      scale: integer or array in ``[-32768, 32767]``.
      shift: integer or array in ``[0, 63]`` (right shift; under ``jit`` out-of-range
        shifts are the caller's contract).
      out_bits: output width 2..32, or ``"fp16"`` (needs ``stage_bits``).
      stage_bits: optional intermediate saturation width (>= ``out_bits``).
      return_flags: also return the boolean saturation flags.
      saturation_grad: float ``x`` only: gradient 0 where any saturation clipped
        (``"zero"``) or straight-through (``"pass"``).

    Returns:
      int32 (integer or Wide ``x``), ``x``'s float dtype (float ``x``), or float16 for
      ``out_bits="fp16"``; ``(y, flags)`` with ``return_flags``. Gradient for float ``x``:
      ``dy/dx = scale * 2**-shift`` (straight-through rounding), none for the registers.
    """
    out_bits, stage_bits = _check_out(out_bits, stage_bits)
    V.check_choice(saturation_grad, ("zero", "pass"), "saturation_grad")
    off = _int_arg(offset, -(2**31), 2**31 - 1, "offset")
    sc = _int_arg(scale, -(2**15), 2**15 - 1, "scale")
    sh = _int_arg(shift, 0, 63, "shift")
    if isinstance(x, wide.Wide):
        xa = wide.Wide(*(jax.device_put(a) if isinstance(a, (np.ndarray, np.generic)) else jnp.asarray(a) for a in x))
        if V.is_concrete(xa.hi) and V.is_concrete(xa.lo):
            hi = np.asarray(xa.hi).astype(np.int64)
            if hi.size and (hi.min() < -256 or hi.max() > 255):
                raise RangeError("x (Wide) must lie in [-2**40, 2**40)")
        shape = jnp.broadcast_shapes(xa.hi.shape, xa.lo.shape)
    else:
        xa = V.as_array(x, "x")
        if V.kind(xa, "x") == "float":
            V.check_integral(xa, "x")
            V.check_range(xa, -(2**31), 2**31 - 1, "x")
        elif np.dtype(xa.dtype) == np.int64:
            V.check_range(xa, -(2**31), 2**31 - 1, "x")
        shape = xa.shape
    try:
        jnp.broadcast_shapes(shape, off.shape, sc.shape, sh.shape)
    except ValueError as e:
        raise ShapeError(
            f"offset {off.shape}, scale {sc.shape} and shift {sh.shape} must broadcast against x {shape}"
        ) from e
    y, flags = _cvt_jit(xa, off, sc, sh, stage_bits=stage_bits, out_bits=out_bits, saturation_grad=saturation_grad)
    return (y, flags) if return_flags else y


@functools.partial(jax.jit, static_argnames=("stage_bits", "out_bits", "saturation_grad"))
def _cvt_jit(x, off, sc, sh, *, stage_bits, out_bits, saturation_grad):
    """:func:`cvt` on checked operands, one program: ``(y, flags)`` (flags unused by the
    caller cost nothing under an outer ``jit``)."""
    off, sc, sh = (a.astype(_I32) for a in (off, sc, sh))
    sh = jnp.clip(sh, 0, 63)
    if isinstance(x, wide.Wide):
        xw = wide.Wide(jnp.asarray(x.hi, _I32), jnp.asarray(x.lo, _U32))
        shape = jnp.broadcast_shapes(xw.hi.shape, xw.lo.shape)
    else:
        shape = x.shape
    bshape = jnp.broadcast_shapes(shape, off.shape, sc.shape, sh.shape)
    if not isinstance(x, wide.Wide) and jnp.issubdtype(x.dtype, jnp.floating):
        off_b, sc_b, sh_b = (jnp.broadcast_to(a, bshape) for a in (off, sc, sh))
        y = _cvt_float(stage_bits, out_bits, saturation_grad)(x, off_b, sc_b, sh_b)
        flags = _cvt_int(wide.from_int32(jax.lax.stop_gradient(x).astype(_I32)), off, sc, sh, stage_bits, out_bits)[2]
        return y, jnp.broadcast_to(flags, bshape)
    if not isinstance(x, wide.Wide):
        xw = wide.from_int32(x.astype(_I32))
    y, _, flags = _cvt_int(xw, off, sc, sh, stage_bits, out_bits)
    return jnp.broadcast_to(y, bshape), jnp.broadcast_to(flags, bshape)


# -------------------------------------------------------------------- per-unit presets


@dataclass(frozen=True)
class ConvertorSpec:
    """Widths of one NVDLA convertor (spec 5.2): signed input and offset widths, shift field
    width, optional intermediate (int17) saturation and the allowed outputs. Every
    convertor's scale is int16."""

    x_bits: int
    offset_bits: int
    shift_bits: int
    stage_bits: Optional[int]
    outputs: tuple


CONVERTORS: dict[str, ConvertorSpec] = {
    # CDMA input convertor: 17-bit pixel/feature value, int16 offset/scale, 6-bit shift.
    "cdma": ConvertorSpec(17, 16, 6, 17, (8, 16, "fp16")),
    # SDP output convertor: int32 data, int32 offset, int16 scale, 6-bit shift.
    "sdp_out": ConvertorSpec(32, 32, 6, 17, (8, 16, "fp16")),
    # SDP Y element-wise operand convertor: int16 operand, int32 offset, sat_32.
    "sdp_y_operand": ConvertorSpec(16, 32, 6, None, (32,)),
    # CDP input convertors: int16 -> sat_17, int8 -> sat_9 (5-bit shifts).
    "cdp_in_int16": ConvertorSpec(16, 16, 5, None, (17,)),
    "cdp_in_int8": ConvertorSpec(8, 8, 5, None, (9,)),
    # CDP output convertors: int33 -> sat_16 (int32 offset), int25 -> sat_8 (sx_25 offset).
    "cdp_out_int16": ConvertorSpec(33, 32, 6, None, (16,)),
    "cdp_out_int8": ConvertorSpec(25, 25, 6, None, (8,)),
}


def _check_wide_range(x, bits, name):
    if isinstance(x, wide.Wide):
        if V.is_concrete(x.hi) and V.is_concrete(x.lo):
            v = wide.to_python(wide.Wide(jnp.asarray(x.hi, _I32), jnp.asarray(x.lo, _U32)))
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            if v.size and (min(v.flat) < lo or max(v.flat) > hi):
                raise RangeError(f"{name} must lie in [{lo}, {hi}] ({bits}-bit signed)")
        return
    a = V.as_array(x, name)
    b = min(bits, 32)
    V.check_range(a, -(1 << (b - 1)), (1 << (b - 1)) - 1, name)


def cvt_unit(
    unit: str,
    x: Any,
    *,
    offset: Any,
    scale: Any,
    shift: Any,
    out_bits: Optional[OutBits] = None,
    return_flags: bool = False,
    saturation_grad: Literal["zero", "pass"] = "zero",
):
    """The convertor of one NVDLA unit (spec 5.2 table), with its operand ranges checked.

    Units (``CONVERTORS``): ``"cdma"`` (x 17-bit, offset/scale int16, shift 0..63, int17
    stage, out 8/16/fp16), ``"sdp_out"`` (x int32, offset int32, int17 stage, out
    8/16/fp16), ``"sdp_y_operand"`` (x int16, offset int32, out 32), ``"cdp_in_int16"``
    (x int16, offset int16, shift 0..31, out 17), ``"cdp_in_int8"`` (x int8, offset int8 —
    ``sign_extend(register, 8)``, shift 0..31, out 9), ``"cdp_out_int16"`` (x int33 — pass a
    Wide for values beyond int32, offset int32, out 16), ``"cdp_out_int8"`` (x int25,
    offset ``sign_extend(register, 25)``, out 8). Scales are int16 everywhere.

    ``out_bits`` defaults to the unit's only output where it has one. Concrete operands
    outside the unit's widths raise ValueError. See :func:`cvt` for semantics and flags.
    """
    V.check_choice(unit, tuple(CONVERTORS), "unit")
    V.check_flag(return_flags, "return_flags")
    spec = CONVERTORS[unit]
    if out_bits is None:
        if len(spec.outputs) != 1:
            raise RangeError(f"unit {unit!r} needs out_bits= (one of {spec.outputs})")
        out_bits = spec.outputs[0]
    if not any(
        out_bits is o
        or (
            isinstance(out_bits, (str, int, np.integer))
            and not isinstance(out_bits, (bool, np.bool_))
            and out_bits == o
        )
        for o in spec.outputs
    ):
        raise RangeError(f"out_bits for unit {unit!r} must be one of {spec.outputs}, got {out_bits!r}")
    _check_wide_range(x, spec.x_bits, "x")
    _check_wide_range(offset, spec.offset_bits, "offset")
    V.check_range(V.as_array(shift, "shift"), 0, (1 << spec.shift_bits) - 1, "shift")
    return cvt(
        x,
        offset=offset,
        scale=scale,
        shift=shift,
        out_bits=out_bits,
        stage_bits=spec.stage_bits,
        return_flags=return_flags,
        saturation_grad=saturation_grad,
    )


# ------------------------------------------------------ precision-conversion validity (5.3)

_IMAGE_INT = ("image_uint8", "image_int16", "image_uint16")
_VALID: dict[str, dict[str, tuple[str, ...]]] = {
    "conv": {
        **{f: ("int8", "int16", "fp16") for f in _IMAGE_INT},
        "image_fp16": ("fp16",),
        "int8": ("int8",),
        "int16": ("int16",),
        "fp16": ("fp16",),
    },
    "sdp": {"int8": ("int8", "int16"), "int16": ("int8", "int16", "fp16"), "fp16": ("int16", "fp16")},
    "cdp": {"int8": ("int8",), "int16": ("int16",), "fp16": ("fp16",)},
    "pdp": {"int8": ("int8",), "int16": ("int16",), "fp16": ("fp16",)},
}


def valid_precision_conversions(unit: str) -> dict[str, tuple[str, ...]]:
    """Valid ``{input: outputs}`` of a unit (spec 5.3): ``"conv"``, ``"sdp"``, ``"cdp"``, ``"pdp"``.

    Convolution inputs are ``"int8"``, ``"int16"``, ``"fp16"`` (feature data) and
    ``"image_uint8"``, ``"image_int16"``, ``"image_uint16"``, ``"image_fp16"`` (pixel
    formats); the convolution's output precision is its pipeline (and weight) precision.
    """
    V.check_choice(unit, tuple(_VALID), "unit")
    return dict(_VALID[unit])


def check_precision_conversion(unit: str, input_precision: str, output_precision: str) -> None:
    """Raises ValueError unless ``input_precision -> output_precision`` is valid for ``unit`` (5.3)."""
    table = valid_precision_conversions(unit)
    if not isinstance(input_precision, str) or input_precision not in table:
        raise RangeError(f"input_precision for unit {unit!r} must be one of {tuple(table)}, got {input_precision!r}")
    allowed = table[input_precision]
    if not isinstance(output_precision, str) or output_precision not in allowed:
        raise RangeError(
            f"{unit}: {input_precision} input cannot produce {output_precision!r} "
            f"output; allowed output_precision: {allowed}"
        )


# ------------------------------------------------------------------- fp16 special values (5.4)

INF_REPLACEMENT: dict[str, Optional[float]] = {
    "conv": 65536.0,  # direct / image convolution
    "winograd": 65504.0,
    "sdp": float(np.finfo(np.float32).max),
    "cdp": 4292870144.0,
    "pdp_avg": 4292870144.0,  # pooling, averaging
    "pdp_max": None,  # pooling, max/min: INF kept
}


def _fp16_array(x: Any, name: str) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(x, jnp.float16)
    if x.dtype != jnp.float16:
        raise ArgTypeError(f"{name} must be float16 (or uint16 fp16 bit patterns), got {x.dtype}")
    return x


def fp16_input(x: Any, *, unit: str, nan_to_zero: bool = False) -> jax.Array:
    """fp16 input data as a unit sees it (spec 5.4), as exact float32 values.

    INF becomes the unit's large finite value (``INF_REPLACEMENT``: convolution +-65536,
    Winograd +-65504, SDP +-fp32 max, CDP and average pooling +-4292870144; max/min pooling
    keeps INF). NaN propagates, or becomes 0 with ``nan_to_zero`` (the ``NAN_TO_ZERO``
    register). Denormals are kept.

    Args:
      x: float16 array, or uint16 array of fp16 bit patterns.
      unit: a key of ``INF_REPLACEMENT``.
    """
    V.check_choice(unit, tuple(INF_REPLACEMENT), "unit")
    nan_to_zero = V.check_flag(nan_to_zero, "nan_to_zero")
    return _fp16_input_jit(_fp16_dtype_checked(x, "x"), unit=unit, nan_to_zero=nan_to_zero)


def _fp16_dtype_checked(x: Any, name: str) -> jax.Array:
    """The dtype check of :func:`_fp16_array` (the bitcast runs inside the jitted program)."""
    x = V.as_array(x, name)
    if x.dtype not in (jnp.uint16, jnp.float16):
        raise ArgTypeError(f"{name} must be float16 (or uint16 fp16 bit patterns), got {x.dtype}")
    return x


@functools.partial(jax.jit, static_argnames=("unit", "nan_to_zero"))
def _fp16_input_jit(x, *, unit, nan_to_zero):
    v = _fp16_array(x, "x").astype(jnp.float32)
    rep = INF_REPLACEMENT[unit]
    if rep is not None:
        v = jnp.where(jnp.isinf(v), jnp.sign(v) * jnp.float32(rep), v)
    if nan_to_zero:
        v = jnp.where(jnp.isnan(v), jnp.float32(0), v)
    return v


def fp16_output(x: Any) -> jax.Array:
    """fp32 result to fp16 output (spec 5.4): nearest even, overflow (and INF) saturates to
    +-65504, NaN propagates, denormals are produced.

    ``x`` is converted to float32 first (NVDLA's internal format), so the result is the same
    with ``jax_enable_x64`` on or off. Differentiable (straight-through inside the range).
    """
    x = V.as_array(x, "x")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ArgTypeError(f"x must be a float array, got {x.dtype}")
    return _fp16_output_jit(x)


@jax.jit
def _fp16_output_jit(x):
    return to_float16(jnp.clip(x.astype(jnp.float32), -FP16_MAX, FP16_MAX))


def fp16_to_int16(x: Any) -> jax.Array:
    """fp16 to int16 as the SDP does for an INT16 output from FP16 processing (C model
    ``Fp16ToInt16``): round half away from zero, saturate to [-32768, 32767] (INF
    saturates), NaN gives -32768.

    Args:
      x: float16 array, or uint16 array of fp16 bit patterns.

    Returns:
      int32 array with int16 values.
    """
    return _fp16_to_int16_jit(_fp16_dtype_checked(x, "x"))


@jax.jit
def _fp16_to_int16_jit(x):
    v = _fp16_array(x, "x").astype(jnp.float32)
    # |v| + 0.5 is exact in fp32 for every fp16 v (at most 24 significant bits).
    r = jnp.sign(v) * jnp.floor(jnp.abs(v) + jnp.float32(0.5))
    r = jnp.clip(r, -32768.0, 32767.0)
    return jnp.where(jnp.isnan(v), _I32(-32768), r.astype(_I32))
