"""gemmlowp's fixed-point helpers (``fixedpoint/fixedpoint.h``, ``internal/unpack.h``).

All functions are exact for every int32 input without ``jax_enable_x64``: the 62-bit
products are formed as two 32-bit words (:mod:`hwjax.core.wide`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hwjax.core import validate as V
from hwjax.core import fixed_mul, shift_right
from hwjax.core import wide as _wide
from hwjax.errors import ArgTypeError, RangeError, ShapeError

_I32 = jnp.int32
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def _operand(x, name: str) -> jax.Array:
    """An int32 operand (or a float array holding int32 values), checked and named."""
    a = V.as_array(x, name)
    if V.kind(a, name) == "float":
        V.check_integral(a, name)
        V.check_range(a, INT32_MIN, INT32_MAX, name)
        return a
    return V.to_int32(a, name)


def _broadcast(a: jax.Array, b: jax.Array, na: str, nb: str) -> None:
    try:
        jnp.broadcast_shapes(a.shape, b.shape)
    except ValueError as e:
        raise ShapeError(f"{nb} of shape {b.shape} does not broadcast against {na} of shape {a.shape}") from e


def srdhm(a, b) -> jax.Array:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int32 (spec §2.1).

    Exact semantics (``a*b`` formed exactly, 62 bits)::

        srdhm(a, b) = 2**31 - 1                     if a == b == -2**31
                    = floor((a*b + 2**30) / 2**31)  otherwise

    i.e. the nearest integer to ``a*b / 2**31`` with ties rounded **up, toward +inf**
    (``a*b = -2**30 -> 0``, ``2**30 -> 1``, ``-3*2**30 -> -1``), not away from zero.
    The only saturating input pair is ``(INT32_MIN, INT32_MIN)``. This is ARM
    ``VQRDMULH`` and equals ``hwjax.core.fixed_mul(a, b, 31, rounding="half_up",
    symmetric=False)``.

    Args:
      a, b: int32-valued integer arrays (or Python ints in the int32 range), broadcast
        against each other. Float arrays holding int32 values are accepted and give a
        differentiable result (gradient ``da = b / 2**31``, ``db = a / 2**31``,
        straight-through for the rounding; 0 at the saturating pair).

    Returns:
      int32 (integer inputs) or the float dtype (float inputs).
    """
    a, b = _operand(a, "a"), _operand(b, "b")
    _broadcast(a, b, "a", "b")
    return fixed_mul(a, b, 31, rounding="half_up", bits=32, symmetric=False)


def srdhm_int16(a, b) -> jax.Array:
    """``SaturatingRoundingDoublingHighMul`` on int16 (spec §2.2).

    ``32767`` if ``a == b == -32768``, otherwise ``floor((a*b + 2**14) / 2**15)``
    (ties toward +inf). ``a`` and ``b`` must hold int16 values; the result is returned
    as int32 holding an int16 value (or in the float dtype for float inputs).
    """
    a, b = _operand(a, "a"), _operand(b, "b")
    V.check_range(a, -(2**15), 2**15 - 1, "a")
    V.check_range(b, -(2**15), 2**15 - 1, "b")
    _broadcast(a, b, "a", "b")
    return fixed_mul(a, b, 15, rounding="half_up", bits=16, symmetric=False)


def rounding_divide_by_pot(x, exponent) -> jax.Array:
    """gemmlowp ``RoundingDivideByPOT`` (spec §2.3): ``x / 2**exponent`` to nearest, ties
    **away from zero**.

    Exact semantics for int32 ``x`` and ``0 <= exponent <= 31``::

        mask = 2**e - 1;  remainder = x & mask;  threshold = (mask >> 1) + (x < 0)
        result = (x >> e) + (remainder > threshold)

    equivalently ``sign(x) * floor((|x| + 2**(e-1)) / 2**e)`` for ``e >= 1`` and ``x``
    for ``e == 0``. Never overflows. ``RDBPOT(4, 3) = 1``, ``RDBPOT(-4, 3) = -1``,
    ``RDBPOT(-12, 3) = -2``. This is ``hwjax.core.shift_right(x, e,
    rounding="half_away")``.

    Args:
      x: int32-valued integer array (or float array holding integers: then the result
        is differentiable, gradient ``2**-exponent``, straight-through rounding).
      exponent: integer scalar or array broadcastable against ``x``, each in 0..31
        (checked when concrete; under ``jit`` a traced exponent is the caller's
        contract).

    Returns:
      int32, or ``x``'s float dtype.
    """
    x = _operand(x, "x")
    e = V.as_array(exponent, "exponent")
    if V.kind(e, "exponent") != "int":
        raise ArgTypeError(f"exponent must be an integer scalar or array in [0, 31], got dtype {e.dtype}")
    e = V.to_int32(e, "exponent")
    V.check_range(e, 0, 31, "exponent")
    _broadcast(x, e, "x", "exponent")
    return shift_right(x, e, rounding="half_away")


def shift_left(x, exponent, *, overflow: str = "saturate") -> jax.Array:
    """``x * 2**exponent`` for int32 ``x`` and ``0 <= exponent <= 31``.

    ``overflow="saturate"``: clamps to [INT32_MIN, INT32_MAX] (gemmlowp's scalar
    ``ShiftLeft`` since 2018); ``overflow="wrap"``: ``wrap32(x * 2**exponent)``
    (gemmlowp's SSE4/NEON registers, TFLite ``MultiplyByQuantizedMultiplier``).
    Integer inputs only; returns int32.
    """
    V.check_choice(overflow, ("saturate", "wrap"), "overflow")
    x = V.as_array(x, "x")
    if V.kind(x, "x") != "int":
        raise ArgTypeError(f"x must be an integer array, got dtype {x.dtype}")
    x = V.to_int32(x, "x")
    e = V.as_array(exponent, "exponent")
    if V.kind(e, "exponent") != "int":
        raise ArgTypeError(f"exponent must be an integer scalar or array in [0, 31], got dtype {e.dtype}")
    e = V.to_int32(e, "exponent")
    V.check_range(e, 0, 31, "exponent")
    return _shift_left_jit(x, e, overflow)


def _shift_left_int(x: jax.Array, e: jax.Array, overflow: str) -> jax.Array:
    e = jnp.clip(e, 0, 31)
    if overflow == "wrap":
        return jnp.left_shift(x, e)
    return shift_right(x, -e, rounding="floor", allow_left=True)


def _rdbpot_int(x: jax.Array, e: jax.Array) -> jax.Array:
    """RDBPOT on int32 arrays with an already validated exponent (no checks)."""
    return shift_right(x, e, rounding="half_away")


def _srdhm_int(a: jax.Array, b: jax.Array) -> jax.Array:
    return fixed_mul(a, b, 31, rounding="half_up", bits=32, symmetric=False)


# ------------------------------------------------------- RoundingMultiplyByConstantFraction


def rmcf_constants(numerator: int, denominator: int) -> tuple[int, int, int]:
    """``(q, rem, s)`` of ``RoundingMultiplyByConstantFraction<N, D>`` (spec §3.10)::

    q = floor((N + floor(D/2)) / D);  rem = N - q*D;  s = trunc(rem * 2**31 / D)
    """
    n = V.check_static_int(numerator, 1, 2**31 - 1, "numerator")
    d = V.check_static_int(denominator, 1, 2**31 - 1, "denominator")
    q = (n + d // 2) // d
    rem = n - q * d
    s = abs(rem) * 2**31 // d
    s = -s if rem < 0 else s
    if not INT32_MIN <= s <= INT32_MAX or not INT32_MIN <= q <= INT32_MAX:
        raise RangeError(f"numerator/denominator = {n}/{d} gives constants outside int32")
    return q, rem, s


def rounding_multiply_by_constant_fraction(x, numerator: int, denominator: int) -> jax.Array:
    """gemmlowp ``RoundingMultiplyByConstantFraction<N, D>`` (scalar path, spec §3.10).

    For int32 ``x`` and static positive ``N``, ``D``: ``x`` if ``N == D``, otherwise::

        q = floor((N + floor(D/2)) / D);  rem = N - q*D;  s = trunc(rem * 2**31 / D)
        p = x * s                                             (exact, 64-bit)
        t = round_half_away_from_zero(p / 2**31)
        result = wrap32(x*q + t)

    Close to, but not always equal to, the nearest integer of ``x*N/D`` (the Q31
    constant ``s`` is truncated): ``N/D = 65025/3937``, ``x = 9698418`` gives
    160182787. Integer inputs only; returns int32.
    """
    x = V.as_array(x, "x")
    if V.kind(x, "x") != "int":
        raise ArgTypeError(f"x must be an integer array, got dtype {x.dtype}")
    rmcf_constants(numerator, denominator)  # checks the static arguments
    return _rmcf_jit(V.to_int32(x, "x"), int(numerator), int(denominator))


def _rmcf_int(x: jax.Array, numerator: int, denominator: int) -> jax.Array:
    if numerator == denominator:
        return x
    q, _, s = rmcf_constants(numerator, denominator)
    xq = x * _I32(q)  # wraps modulo 2**32, as upstream's int32 arithmetic
    if s == 0:
        return xq
    p = _wide.mul_int32(x, _I32(s))
    t = _wide.shift_right(p, _I32(31), "half_away")  # |t| <= |x|: fits int32
    return xq + jax.lax.bitcast_convert_type(t.lo, _I32)


_shift_left_jit = jax.jit(_shift_left_int, static_argnums=(2,))
_rmcf_jit = jax.jit(_rmcf_int, static_argnums=(1, 2))
