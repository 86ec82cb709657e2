"""Exact float32 helpers for the float-side arithmetic that produces integers.

Quantisation recipes turn float scales into integer parameters; the integers must
not depend on the device. XLA's float32 division is not correctly rounded on every
backend, and ``jnp.exp2`` is not exact on CPU, so such recipes use these instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V
from hwjax.core._ops import _floor_divmod_small
from hwjax.core._program import eager_program
from hwjax.errors import RangeError


def div_rn(a, b) -> jax.Array:
    """IEEE float32 division ``a / b``, correctly rounded (ties to even), on every backend.

    XLA's float32 division is not correctly rounded on every backend (on CPU it differs
    from IEEE division in the last bit for a large fraction of inputs), so every float
    computation that feeds integer parameters or integer activations uses this
    instead: the quotient of the 24-bit mantissas is formed with an approximate
    division and then corrected exactly in integer arithmetic. Handles signs and
    zeros; normal (non-denormal, finite) operands and results, and IEEE special values:
    a NaN operand, ``0 / 0`` and ``inf / inf`` give NaN, ``x / 0`` (``x != 0``) and
    ``inf / y`` give a signed infinity, ``y / inf`` gives 0. Denormal operands or
    results are flushed to zero. No gradient (used on quantisation parameters and
    inside straight-through constructions).

    ``a`` and ``b``: numbers or integer or float arrays that broadcast (ArgTypeError /
    ShapeError name the argument otherwise); converted to float32.
    """
    return _div_rn_jit(*_operand_pair(a, b))


def _operand_pair(a, b) -> tuple[jax.Array, jax.Array]:
    """``a`` and ``b`` as arrays of a supported dtype that broadcast (ArgTypeError /
    ShapeError name the argument otherwise)."""
    a, b = V.as_array(a, "a"), V.as_array(b, "b")
    V.kind(a, "a")
    V.kind(b, "b")
    V.check_broadcast(a, "a", b, "b")
    return a, b


@jax.jit
def _div_rn_jit(a, b) -> jax.Array:
    a, b, (ma, ea, tiny_a), (mb, eb, tiny_b) = _float32_parts(a, b)
    s = jnp.where(ma >= mb, 23, 24)  # ma 2**s / mb in [2**23, 2**24)
    q0 = jnp.floor(ma.astype(jnp.float32) / mb.astype(jnp.float32) * _pow2(s)).astype(jnp.int32)
    # r = ma 2**s - q0 mb is small (|r| < 16 mb < 2**28, q0 being within a few units of
    # the quotient), so int32 arithmetic that wraps modulo 2**32 gives it exactly
    r = (ma << s) - q0 * mb
    c, rem = _floor_divmod_small(r, mb)  # |r / mb| < 16, mb < 2**24
    q = q0 + c
    up = (2 * rem > mb) | ((2 * rem == mb) & ((q & 1) == 1))
    q = q + up.astype(jnp.int32)
    e = ea - eb - s
    e1 = jnp.clip(e, -126, 127)
    mag = q.astype(jnp.float32) * _pow2(e1) * _pow2(jnp.clip(e - e1, -126, 127))
    negative = (jax.lax.bitcast_convert_type(a, jnp.int32) ^ jax.lax.bitcast_convert_type(b, jnp.int32)) < 0
    out = jnp.where(negative, -mag, mag)
    out = jnp.where(tiny_a, jnp.where(negative, -0.0, 0.0), out)  # zero or denormal a: a signed zero
    # IEEE special cases (NaN, infinities, division by zero, b zero or denormal): XLA's
    # division gets them exactly
    special = ~jnp.isfinite(a) | ~jnp.isfinite(b) | tiny_b
    return jnp.where(special, a / b, out)


def mul_rn(a, b) -> jax.Array:
    """IEEE float32 product ``a * b``, correctly rounded (ties to even), whatever the
    compiler does with it next.

    XLA contracts a float32 multiplication and a following addition into one fused
    multiply-add (one rounding instead of two) when both land in the same kernel, as
    XLA:CPU and XLA:GPU allow. Whether they do depends on fusion decisions, so
    ``a * b + c`` may differ in its last bit between two programs that compute it.
    Runtimes that round the product before adding it (LiteRT's float lanes) are matched
    by ``mul_rn(a, b) + c`` in any program: the 24-bit mantissas are multiplied exactly
    in int32 arithmetic (12-bit limbs, a 48-bit product in two words), the product is
    rounded once by a float32 addition of its two exactly representable halves, and
    then scaled by powers of two, which is exact. Neither step changes its value when
    contracted with an addition.

    Normal (non-denormal, finite) operands with a normal or overflowing result are
    exact (an overflow gives a signed infinity); a zero or denormal operand gives a
    signed zero, and a result below ``2**-126`` in magnitude is flushed to a signed
    zero. A NaN or infinite operand gives XLA's own ``a * b`` (IEEE: NaN for
    ``0 * inf``). No gradient (used inside integer constructions).

    ``a`` and ``b``: numbers or integer or float arrays that broadcast (ArgTypeError /
    ShapeError name the argument otherwise); converted to float32 (an integer beyond
    ``2**24`` is rounded to float32 first, as C's ``(float)`` conversion does).
    """
    return _mul_rn_jit(*_operand_pair(a, b))


@jax.jit
def _mul_rn_jit(a, b) -> jax.Array:
    a, b, (ma, ea, tiny_a), (mb, eb, tiny_b) = _float32_parts(a, b)
    # ma mb = hi 2**24 + lo exactly (both < 2**24), from 12-bit limbs: every partial
    # product and sum below stays under 2**26
    a1, a0, b1, b0 = ma >> 12, ma & 0xFFF, mb >> 12, mb & 0xFFF
    mid = a1 * b0 + a0 * b1
    low = a0 * b0 + ((mid & 0xFFF) << 12)
    hi = a1 * b1 + (mid >> 12) + (low >> 24)
    lo = low & 0xFFFFFF
    # one rounding: the float32 sum of two exact values (hi 2**24 is exact too), in
    # [2**46, 2**48]; scaled by 2**-48 into [1/4, 1], exactly
    r = (hi.astype(jnp.float32) * 2.0**24 + lo.astype(jnp.float32)) * 2.0**-48
    e = ea + eb  # |a b| = r 2**e
    e1 = jnp.clip(e, -126, 127)
    mag = r * _pow2(e1) * _pow2(jnp.clip(e - e1, -126, 127))
    mag = jnp.where(tiny_a | tiny_b | (mag < np.float32(2.0**-126)), 0.0, mag)
    negative = (jax.lax.bitcast_convert_type(a, jnp.int32) ^ jax.lax.bitcast_convert_type(b, jnp.int32)) < 0
    out = jnp.where(negative, -mag, mag)
    return jnp.where(~jnp.isfinite(a) | ~jnp.isfinite(b), a * b, out)


def _float32_parts(a, b):
    """``(a, b, _mant_exp(a), _mant_exp(b))`` of ``a`` and ``b`` as broadcast float32 arrays
    (gradients stopped)."""
    a = jax.lax.stop_gradient(jnp.asarray(a, jnp.float32))
    b = jax.lax.stop_gradient(jnp.asarray(b, jnp.float32))
    a, b = jnp.broadcast_arrays(a, b)
    return a, b, _mant_exp(a), _mant_exp(b)


def _mant_exp(v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(m, e, tiny)`` of float32 ``v`` from its bits: ``|v| = m * 2**(e - 24)`` with the
    24-bit mantissa ``m`` in [2**23, 2**24) for normal ``v`` (``frexp(|v|) = (m / 2**24,
    e)``); ``tiny`` marks zeros and denormals (flushed to zero by the callers)."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int32) & 0x7FFFFFFF
    return (bits & 0x7FFFFF) | 0x800000, (bits >> 23) - 126, bits < 0x800000


def _pow2(n) -> jax.Array:
    """``2.0**n`` as float32, exactly, for int32 ``n`` in [-126, 127] (built from its bits)."""
    n = jnp.clip(jnp.asarray(n, jnp.int32), -126, 127)
    return jax.lax.bitcast_convert_type((n + 127) << 23, jnp.float32)


def quantize_affine(x, scale, zero_point, *, lo: int = -128, hi: int = 127) -> jax.Array:
    """Affine quantisation of real values: ``clip(round(x / scale + zero_point), lo, hi)``.

    ``x / scale`` is the correctly rounded float32 division :func:`div_rn`, the zero
    point is added in float32 and ``round`` is ties-to-even, so the integers do not
    depend on the device. Returns float32 arrays holding the integers. No gradient.

    Arguments: ``x`` real values (float or integer array, converted to float32);
    ``scale`` > 0 and finite, broadcasting against ``x``; ``zero_point`` an integer (or
    integer-valued float) broadcasting against ``x``; ``lo <= hi`` static ints.

    NaN rule: a NaN or an infinity in ``x`` (or a scale that is not finite and
    positive, a zero point that is not an integer) raises
    :class:`hwjax.errors.RangeError` naming the argument when the value is concrete,
    and under :func:`hwjax.checked` when it is traced. Traced and unchecked, the
    result is the formula's: NaN for a NaN input, ``lo`` or ``hi`` for an infinity.
    """
    lo = V.check_static_int(lo, -(2**31), 2**31 - 1, "lo")
    hi = V.check_static_int(hi, -(2**31), 2**31 - 1, "hi")
    if lo > hi:
        raise RangeError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    raw = (x, scale, zero_point)  # NumPy / Python values are checked on the host, with no copy back
    x, scale, zero_point = V.as_array(x, "x"), V.as_array(scale, "scale"), V.as_array(zero_point, "zero_point")
    host = [
        r if isinstance(r, (np.ndarray, np.generic, int, float)) else a for r, a in zip(raw, (x, scale, zero_point))
    ]
    V.kind(x, "x")
    V.check_finite(host[0], "x")
    V.kind(scale, "scale")
    V.check_positive(host[1], "scale")
    if V.kind(zero_point, "zero_point") == "float":
        V.check_integral(host[2], "zero_point")
    for name, v in (("scale", scale), ("zero_point", zero_point)):
        V.check_broadcast(x, "x", v, name)
    return _quantize_affine(x, scale, zero_point, lo, hi)


@eager_program(static_argnames=("lo", "hi"))
def _quantize_affine(x, scale, zero_point, lo: int, hi: int) -> jax.Array:
    x = jax.lax.stop_gradient(x.astype(jnp.float32))
    z = zero_point.astype(jnp.float32)
    return jnp.clip(jnp.round(_div_rn_jit(x, scale) + z), lo, hi)


FP16_ROUNDINGS = ("nearest_even", "toward_zero")


def to_float16(x, *, rounding: str = "nearest_even") -> jax.Array:
    """float32 -> IEEE float16, rounded in integer arithmetic on the float32 bits.

    ``rounding="nearest_even"`` equals ``x.astype(float16)`` (IEEE round to nearest, ties
    to even; magnitudes from 65520 up give a signed infinity); ``"toward_zero"``
    truncates the magnitude (finite inputs never become infinite: from 65504 up they
    give +-65504). fp16 subnormals are produced exactly; float32 zeros and denormals
    give a signed zero; a NaN gives a NaN and an infinity the same infinity.

    Why not ``astype``: XLA may drop a float32 -> float16 -> float32 round trip on GPU
    (``xla_allow_excess_precision``, on by default), so code that rounds to fp16 and
    reads the value back would see the unrounded float32 there. Here the float16 comes
    from a bitcast of integer results, which no compiler pass removes. Gradient: straight-through
    (``d/dx = 1``, the tangent cast to float16). Works under ``jit``, ``vmap`` and ``grad``.

    Args:
      x: float array or number (converted to float32; ArgTypeError for other types).
      rounding: ``"nearest_even"`` or ``"toward_zero"``.
    """
    x = V.as_array(x, "x")
    if V.kind(x, "x") != "float":
        raise V.ArgTypeError(f"x must be a float array, got {x.dtype}")
    V.check_choice(rounding, FP16_ROUNDINGS, "rounding")
    return _to_float16_jit(x.astype(jnp.float32), rounding)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _to_float16_st(x: jax.Array, rounding: str) -> jax.Array:
    return jax.lax.bitcast_convert_type(fp16_bits(x, rounding), jnp.float16)


@_to_float16_st.defjvp
def _to_float16_st_jvp(rounding, primals, tangents):
    return _to_float16_st(primals[0], rounding), tangents[0].astype(jnp.float16)


_to_float16_jit = jax.jit(_to_float16_st, static_argnums=1)


def fp16_bits(x: jax.Array, rounding: str) -> jax.Array:
    """The uint16 bit pattern of :func:`to_float16` of a float32 array (no checks)."""
    u = jax.lax.bitcast_convert_type(jax.lax.stop_gradient(x.astype(jnp.float32)), jnp.uint32)
    sign = (u >> 16) & jnp.uint32(0x8000)
    a = u & jnp.uint32(0x7FFFFFFF)
    e = (a >> 23).astype(jnp.int32)  # biased float32 exponent
    m = a & jnp.uint32(0x7FFFFF)
    nearest = rounding == "nearest_even"
    # normal fp16 (e >= 113): exponent e - 112, top 10 mantissa bits, 13 bits dropped
    q_n = ((jnp.clip(e - 112, 0, 31).astype(jnp.uint32)) << 10) | (m >> 13)
    r_n = m & jnp.uint32(0x1FFF)
    up_n = (r_n > 0x1000) | ((r_n == 0x1000) & ((q_n & 1) == 1))
    # subnormal fp16 (1 <= e <= 112): (2**23 + m) units of 2**(e - 150) in units of 2**-24
    s = jnp.clip(126 - e, 14, 31).astype(jnp.uint32)
    full = m | jnp.uint32(0x800000)
    q_s = jnp.where(e >= 102, full >> s, jnp.uint32(0))  # e < 102: below half of 2**-24
    r_s = jnp.where(e >= 102, full & ((jnp.uint32(1) << s) - 1), full)
    half = jnp.where(e >= 102, jnp.uint32(1) << (s - 1), jnp.uint32(0xFFFFFFFF))
    up_s = (r_s > half) | ((r_s == half) & ((q_s & 1) == 1))
    normal = e >= 113
    q = jnp.where(normal, q_n, q_s)
    if nearest:
        q = q + jnp.where(normal, up_n, up_s).astype(jnp.uint32)
        big = jnp.uint32(0x7C00)  # overflow rounds to infinity
    else:
        big = jnp.uint32(0x7BFF)  # toward zero: the largest finite value
    q = jnp.where((e == 0), jnp.uint32(0), q)
    q = jnp.where((e >= 143) | (q > big), big, q)  # |x| >= 65536 (or rounded past 65504)
    q = jnp.where(e == 255, jnp.where(m == 0, jnp.uint32(0x7C00), jnp.uint32(0x7E00) | (m >> 13)), q)
    return (sign | q).astype(jnp.uint16)
