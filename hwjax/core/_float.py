"""Exact float32 helpers for the float-side arithmetic that produces integers.

Quantisation recipes turn float scales into integer parameters; the integers must
not depend on the device. XLA's float32 division is not correctly rounded on every
backend, and ``jnp.exp2`` is not exact on CPU, so such recipes use these instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V
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
    a, b = V.as_array(a, "a"), V.as_array(b, "b")
    V.kind(a, "a")
    V.kind(b, "b")
    V.check_broadcast(a, "a", b, "b")
    return _div_rn_jit(a, b)


@jax.jit
def _div_rn_jit(a, b) -> jax.Array:
    a = jax.lax.stop_gradient(jnp.asarray(a, jnp.float32))
    b = jax.lax.stop_gradient(jnp.asarray(b, jnp.float32))
    a, b = jnp.broadcast_arrays(a, b)
    ma, ea, tiny_a = _mant_exp(a)
    mb, eb, tiny_b = _mant_exp(b)
    s = jnp.where(ma >= mb, 23, 24)  # ma 2**s / mb in [2**23, 2**24)
    q0 = jnp.floor(ma.astype(jnp.float32) / mb.astype(jnp.float32) * _pow2(s)).astype(jnp.int32)
    # r = ma 2**s - q0 mb is small (|r| < 16 mb < 2**28, q0 being within a few units of
    # the quotient), so int32 arithmetic that wraps modulo 2**32 gives it exactly
    r = (ma << s) - q0 * mb
    q = q0 + jnp.floor_divide(r, mb)
    rem = jnp.mod(r, mb)
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
    host = [r if isinstance(r, (np.ndarray, np.generic, int, float)) else a
            for r, a in zip(raw, (x, scale, zero_point))]
    V.kind(x, "x")
    V.check_finite(host[0], "x")
    V.kind(scale, "scale")
    V.check_positive(host[1], "scale")
    if V.kind(zero_point, "zero_point") == "float":
        V.check_integral(host[2], "zero_point")
    for name, v in (("scale", scale), ("zero_point", zero_point)):
        V.check_broadcast(x, "x", v, name)
    x = jax.lax.stop_gradient(x.astype(jnp.float32))
    z = zero_point.astype(jnp.float32)
    return jnp.clip(jnp.round(_div_rn_jit(x, scale) + z), lo, hi)
