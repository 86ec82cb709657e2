"""Exact 64-bit signed integers as two 32-bit words, without ``jax_enable_x64``.

A :class:`Wide` value is ``hi * 2**32 + lo`` with ``hi`` an int32 array and ``lo`` a
uint32 array (two's complement split). Every operation here is exact; the caller
keeps values inside the signed 64-bit range. The module is chip-agnostic: targets
use it for products of two int32 values, 35-bit fractions, 38/40-bit accumulators.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hwjax.errors import RangeError

_U32 = jnp.uint32
_I32 = jnp.int32


class Wide(NamedTuple):
    """Signed 64-bit integer ``hi * 2**32 + lo`` (``hi`` int32, ``lo`` uint32)."""

    hi: jax.Array
    lo: jax.Array


def from_int32(x: jax.Array) -> Wide:
    """Sign-extends an int32 array to :class:`Wide`."""
    x = jnp.asarray(x, _I32)
    return Wide(x >> 31, jax.lax.bitcast_convert_type(x, _U32))


def from_parts(hi: jax.Array, lo: jax.Array) -> Wide:
    """Builds ``hi * 2**32 + lo`` from an int32 high word and a uint32 low word."""
    return Wide(jnp.asarray(hi, _I32), jnp.asarray(lo, _U32))


def _add_u32(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = a + b
    return s, (s < a).astype(_I32)


def add(a: Wide, b: Wide) -> Wide:
    """Exact ``a + b`` (the caller keeps the result inside int64)."""
    lo, carry = _add_u32(a.lo, b.lo)
    return Wide(a.hi + b.hi + carry, lo)


def neg(a: Wide) -> Wide:
    """Exact ``-a``."""
    lo = ~a.lo + _U32(1)
    carry = (lo == 0).astype(_I32)
    return Wide(~a.hi + carry, lo)


def sub(a: Wide, b: Wide) -> Wide:
    """Exact ``a - b``."""
    return add(a, neg(b))


def mul_int32(a: jax.Array, b: jax.Array) -> Wide:
    """Exact 64-bit product of two int32 arrays (broadcasting)."""
    a = jnp.asarray(a, _I32)
    b = jnp.asarray(b, _I32)
    ah, al = a >> 16, (a & 0xFFFF)  # ah signed in [-2**15, 2**15), al in [0, 2**16)
    bh, bl = b >> 16, (b & 0xFFFF)
    ll = al.astype(_U32) * bl.astype(_U32)  # < 2**32, exact in uint32
    hh = ah * bh  # |.| <= 2**30
    c1 = ah * bl  # |.| < 2**31
    c2 = al * bh
    acc = Wide(hh, ll)
    for c in (c1, c2):  # add c * 2**16 as a Wide value
        acc = add(acc, Wide(c >> 16, (c.astype(_U32) << 16)))
    return acc


def lt_zero(a: Wide) -> jax.Array:
    return a.hi < 0


def _bit(a: Wide, pos: jax.Array) -> jax.Array:
    """Bit ``pos`` (0..63) of the two's complement representation, as bool."""
    pos = jnp.asarray(pos, _I32)
    lo_bit = (a.lo >> jnp.clip(pos, 0, 31).astype(_U32)) & 1
    hi_bit = (a.hi >> jnp.clip(pos - 32, 0, 31)) & 1
    return jnp.where(pos < 32, lo_bit == 1, hi_bit == 1)


def _low_bits_nonzero(a: Wide, n: jax.Array) -> jax.Array:
    """True where any of the ``n`` lowest bits (0 <= n <= 64) is set."""
    n = jnp.asarray(n, _I32)
    nlo = jnp.clip(n, 0, 32)
    mask_lo = jnp.where(nlo >= 32, _U32(0xFFFFFFFF), (_U32(1) << jnp.clip(nlo, 0, 31).astype(_U32)) - 1)
    nhi = jnp.clip(n - 32, 0, 32)
    hi_u = jax.lax.bitcast_convert_type(a.hi, _U32)
    mask_hi = jnp.where(nhi >= 32, _U32(0xFFFFFFFF), (_U32(1) << jnp.clip(nhi, 0, 31).astype(_U32)) - 1)
    return ((a.lo & mask_lo) != 0) | ((hi_u & mask_hi) != 0)


def floor_shift(a: Wide, s: jax.Array) -> Wide:
    """``floor(a / 2**s)`` for 0 <= s <= 63."""
    s = jnp.asarray(s, _I32)
    s_lo = jnp.clip(s, 0, 31)
    # s < 32: lo' = (lo >> s) | (hi << (32 - s)); hi' = hi >> s.
    hi_u = jax.lax.bitcast_convert_type(a.hi, _U32)
    spill = jnp.where(s_lo == 0, _U32(0), hi_u << jnp.clip(32 - s_lo, 0, 31).astype(_U32))
    lo_small = (a.lo >> s_lo.astype(_U32)) | spill
    hi_small = a.hi >> s_lo
    # s >= 32: lo' = hi >> (s - 32) (as bits), hi' = sign.
    lo_big = jax.lax.bitcast_convert_type(a.hi >> jnp.clip(s - 32, 0, 31), _U32)
    hi_big = a.hi >> 31
    big = s >= 32
    return Wide(jnp.where(big, hi_big, hi_small), jnp.where(big, lo_big, lo_small))


def round_increment(
    rounding: str, negative: jax.Array, round_bit: jax.Array, sticky: jax.Array, q_odd: jax.Array, shifted: jax.Array
) -> jax.Array:
    """Whether to add 1 to ``floor(x / 2**s)`` for each rounding mode.

    ``round_bit`` is bit s-1 of x, ``sticky`` whether any lower bit is set, ``q_odd``
    whether the floor quotient is odd, ``shifted`` whether s >= 1.
    """
    above = round_bit & sticky
    tie = round_bit & ~sticky
    if rounding == "floor":
        inc = jnp.zeros_like(round_bit)
    elif rounding == "half_up":
        inc = round_bit
    elif rounding == "half_away":
        inc = above | (tie & ~negative)
    elif rounding == "half_even":
        inc = above | (tie & q_odd)
    elif rounding == "trunc":
        inc = negative & (round_bit | sticky)
    else:  # pragma: no cover - validated by callers
        raise RangeError(rounding)
    return inc & shifted


def _floor_parts(a: Wide, s: jax.Array) -> tuple[Wide, jax.Array, jax.Array, jax.Array]:
    """``(floor(a / 2**s), round bit, sticky, s >= 1)`` for 0 <= s <= 63 (see
    :func:`round_increment`)."""
    s = jnp.asarray(s, _I32)
    shifted = s >= 1
    rb = _bit(a, jnp.maximum(s - 1, 0)) & shifted
    return floor_shift(a, s), rb, _low_bits_nonzero(a, jnp.maximum(s - 1, 0)), shifted


def shift_right(a: Wide, s: jax.Array, rounding: str) -> Wide:
    """``a / 2**s`` rounded with ``rounding`` (see ``hwjax.core.shift_right``), 0 <= s <= 63."""
    q, rb, sticky, shifted = _floor_parts(a, s)
    inc = round_increment(rounding, lt_zero(a), rb, sticky, (q.lo & 1) == 1, shifted)
    return add(q, Wide(jnp.zeros_like(q.hi), inc.astype(_U32)))


def rint_pair(a: Wide, s: jax.Array) -> tuple[Wide, Wide]:
    """``(rint(a / 2**s), rint(a / 2**s - 1))``, both rounded half to even, for
    0 <= s <= 63, from one floor shift. (They differ by 1 except at a tie, where both
    round to the even neighbour: by 0 or 2.)"""
    q, rb, sticky, shifted = _floor_parts(a, s)
    odd = (q.lo & 1) == 1
    neg = lt_zero(a)  # (not read by half_even)
    up = round_increment("half_even", neg, rb, sticky, odd, shifted)  # rint(q + f) = q + up
    up1 = round_increment("half_even", neg, rb, sticky, ~odd, shifted)  # rint(q - 1 + f) = q - 1 + up1
    minus_one = Wide(jnp.full_like(q.hi, -1), jnp.full_like(q.lo, 0xFFFFFFFF))
    return add(q, Wide(jnp.zeros_like(q.hi), up.astype(_U32))), where(up1, q, add(q, minus_one))


def saturate_to_int32(a: Wide, lo: int, hi: int) -> tuple[jax.Array, jax.Array]:
    """Clamps ``a`` to [lo, hi] (a sub-range of int32); returns (int32 value, clipped)."""
    lo_i, hi_i = _I32(lo), _I32(hi)
    as_i32 = jax.lax.bitcast_convert_type(a.lo, _I32)
    fits = ((a.hi == 0) & (as_i32 >= 0)) | ((a.hi == -1) & (as_i32 < 0))
    over = (a.hi > 0) | (fits & (as_i32 > hi_i)) | ((a.hi == 0) & (as_i32 < 0))
    under = (a.hi < -1) | (fits & (as_i32 < lo_i)) | ((a.hi == -1) & (as_i32 >= 0))
    out = jnp.where(over, hi_i, jnp.where(under, lo_i, as_i32))
    return out, over | under


def to_python(a: Wide):
    """Converts concrete Wide values to a NumPy object array of Python ints (tests, debugging)."""
    import numpy as np

    hi = np.asarray(a.hi).astype(object)
    lo = np.asarray(a.lo).astype(object)
    return hi * (1 << 32) + lo


def from_python(values, shape=None) -> Wide:
    """Builds a Wide array from Python ints (any magnitude inside int64)."""
    import numpy as np

    v = np.asarray(values, dtype=object)
    hi = np.vectorize(lambda t: int(t) >> 32, otypes=[np.int64])(v).astype(np.int32)
    lo = np.vectorize(lambda t: int(t) & 0xFFFFFFFF, otypes=[np.int64])(v).astype(np.uint32)
    return Wide(jnp.asarray(hi), jnp.asarray(lo))


# ------------------------------------------------------------------ constants, comparisons


def from_uint32(x: jax.Array) -> Wide:
    """Zero-extends a uint32 array to :class:`Wide`."""
    x = jnp.asarray(x, _U32)
    return Wide(jnp.zeros(x.shape, _I32), x)


def const(value: int) -> Wide:
    """A Python integer inside the signed 64-bit range as a scalar :class:`Wide`."""
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise RangeError(f"value={value} is outside the signed 64-bit range")
    hi = (value >> 32) & 0xFFFFFFFF
    hi = hi - (1 << 32) if hi >= 1 << 31 else hi
    return Wide(jnp.asarray(hi, _I32), jnp.asarray(value & 0xFFFFFFFF, _U32))


def where(cond: jax.Array, a: Wide, b: Wide) -> Wide:
    """Element-wise ``a if cond else b``."""
    return Wide(jnp.where(cond, a.hi, b.hi), jnp.where(cond, a.lo, b.lo))


def eq(a: Wide, b: Wide) -> jax.Array:
    """``a == b``."""
    return (a.hi == b.hi) & (a.lo == b.lo)


def lt(a: Wide, b: Wide) -> jax.Array:
    """``a < b`` (signed)."""
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo < b.lo))


def le(a: Wide, b: Wide) -> jax.Array:
    """``a <= b`` (signed)."""
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo <= b.lo))


def clamp(a: Wide, lo: int, hi: int) -> Wide:
    """Clamps ``a`` to the Python-integer bounds ``[lo, hi]`` (inside int64)."""
    lo_w, hi_w = const(lo), const(hi)
    return where(lt(a, lo_w), lo_w, where(lt(hi_w, a), hi_w, a))


# -------------------------------------------------------------------- shifts and products


def shift_left(a: Wide, s: jax.Array) -> Wide:
    """``a * 2**s`` modulo 2**64, for 0 <= s <= 63 (the caller keeps it inside int64)."""
    s = jnp.asarray(s, _I32)
    s_lo = jnp.clip(s, 0, 31)
    hi_u = jax.lax.bitcast_convert_type(a.hi, _U32)
    carry = jnp.where(s_lo == 0, _U32(0), a.lo >> jnp.clip(32 - s_lo, 1, 31).astype(_U32))
    hi_small = (hi_u << s_lo.astype(_U32)) | carry
    lo_small = a.lo << s_lo.astype(_U32)
    hi_big = a.lo << jnp.clip(s - 32, 0, 31).astype(_U32)
    big = s >= 32
    hi = jnp.where(big, hi_big, hi_small)
    return Wide(jax.lax.bitcast_convert_type(hi, _I32), jnp.where(big, _U32(0), lo_small))


def mul_uint32(a: jax.Array, b: jax.Array) -> Wide:
    """The exact product of two uint32 arrays (< 2**64; ``hi`` holds its top word's bits
    as int32, so products of 2**63 and more read as negative Wide values)."""
    a, b = jnp.asarray(a, _U32), jnp.asarray(b, _U32)
    m16 = _U32(0xFFFF)
    a0, a1, b0, b1 = a & m16, a >> 16, b & m16, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1  # each < 2**32
    mid, c_mid = _add_u32(p01, p10)  # p01 + p10 = mid + c_mid 2**32
    lo, c_lo = _add_u32(p00, mid << 16)
    hi = p11 + (mid >> 16) + (c_mid.astype(_U32) << 16) + c_lo.astype(_U32)
    return Wide(jax.lax.bitcast_convert_type(hi, _I32), lo)


def mul_wide_int32(a: Wide, m: jax.Array) -> Wide:
    """``a * m`` modulo 2**64 for an int32 array ``m`` (exact while the product fits int64)."""
    m = jnp.asarray(m, _I32)
    lo_s = jax.lax.bitcast_convert_type(a.lo, _I32)
    p = mul_int32(lo_s, m)  # lo_s * m, where lo = lo_s + 2**32 * (lo_s < 0)
    hi = p.hi + a.hi * m + jnp.where(lo_s < 0, m, _I32(0))  # wraps modulo 2**32 as intended
    return Wide(hi, p.lo)


def low_bits(a: Wide, n: jax.Array) -> Wide:
    """``a mod 2**n`` (the ``n`` lowest bits, a non-negative value) for 0 <= n <= 64."""
    n = jnp.asarray(n, _I32)

    def mask(k):
        return jnp.where(k >= 32, _U32(0xFFFFFFFF), (_U32(1) << jnp.clip(k, 0, 31).astype(_U32)) - _U32(1))

    hi_u = jax.lax.bitcast_convert_type(a.hi, _U32) & mask(jnp.clip(n - 32, 0, 32))
    return Wide(jax.lax.bitcast_convert_type(hi_u, _I32), a.lo & mask(jnp.clip(n, 0, 32)))


def bit_length(a: Wide) -> jax.Array:
    """Number of significant bits of a non-negative ``a`` (0 for 0), as int32: floor(log2 a) + 1."""
    hi_u = jax.lax.bitcast_convert_type(a.hi, _U32)
    n_hi = 64 - jax.lax.clz(hi_u).astype(_I32)
    n_lo = 32 - jax.lax.clz(a.lo).astype(_I32)
    return jnp.where(a.hi != 0, n_hi, n_lo)
