"""Element-wise exact integer primitives: saturate, shift_right, fixed_mul.

Each primitive takes integer arrays (int8, uint8, int16, uint16, int32; Python
ints become int32) and returns int32, exactly, independent of ``jax_enable_x64``.
Each also takes float arrays holding integer values and then returns the same
integers in that float dtype, differentiably: the backward pass is the surrogate
gradient stated in the docstring (the one surrogate mechanism of
:mod:`hwjax.core._surrogate`, a ``jax.custom_vjp``).

Each public function checks its arguments in Python (static arguments always, array
values when they are concrete) and then runs one ``jax.jit``-compiled program, so an
eager call compiles once per shape, dtype and static arguments instead of once per
``jax.numpy`` operation; under ``jit``, ``vmap`` and ``grad`` that program is inlined.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V
from hwjax.core import _surrogate as S
from hwjax.core import _wide


Rounding = Literal["half_up", "half_away", "half_even", "floor", "trunc"]
ROUNDING_MODES: tuple[str, ...] = ("half_up", "half_away", "half_even", "floor", "trunc")
SaturationGrad = Literal["zero", "pass"]
_SAT_GRADS = ("zero", "pass")

_I32 = jnp.int32
_U32 = jnp.uint32


def int_bounds(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """Bounds of a ``bits``-wide signed integer: symmetric ±(2^(bits-1)-1) or two's complement.

    ``bits``: a static int in [1, 64]; ``symmetric``: a bool (errors name them).
    """
    bits = V.check_static_int(bits, 1, 64, "bits")
    symmetric = V.check_flag(symmetric, "symmetric")
    hi = 2 ** (bits - 1) - 1
    return (-hi if symmetric else -hi - 1), hi


def checked_int(x: jax.Array, name: str) -> jax.Array:
    """Checks what :func:`hwjax.core._validate.to_int32` checks (concrete values only)
    and returns ``x`` unconverted: the jitted programs convert it to int32."""
    k = V.kind(x, name)
    if k == "float":
        V.check_integral(x, name)
        V.check_range(x, -(2**31), 2**31 - 1, name)
    elif np.dtype(x.dtype) == np.int64:
        V.check_range(x, -(2**31), 2**31 - 1, name)
    return x


def floor_divmod_small(r, d) -> tuple[jax.Array, jax.Array]:
    """``(floor(r / d), r - d * floor(r / d))`` exactly, without an integer division.

    ``r``: int32 values; ``d``: values in ``[1, 2**24]``, broadcasting against ``r``
    (integer arrays, or float arrays holding integers); and ``|r / d| < 2**20``. Concrete
    arguments are checked (:class:`hwjax.errors.RangeError` naming the argument); traced
    ones are not. Returns two int32 arrays of the broadcast shape. No gradient (integer
    arguments).

    How: ``d`` is exact in float32 and ``r`` rounds to it with a relative error of at most
    ``2**-24``; with a float32 division within 2 ulp (XLA's on every backend) the quotient
    is within ``2**-21 |r / d| < 1/2`` of ``r / d``, so its floor ``c`` is within 1 of
    ``floor(r / d)``; the remainder
    ``r - c d`` (exact in wrapping int32 arithmetic: its true value lies in ``[-d, 2 d)``)
    is brought into ``[0, d)`` by one compare-and-select each way. XLA's integer division
    of vectors is slow to compile and to run on CPU; this is a few element-wise
    operations (it makes :func:`div_rn` 5x faster on CPU).
    """
    r, d = V.as_array(r, "r"), V.as_array(d, "d")
    V.kind(r, "r")
    V.kind(d, "d")  # wrong types are reported before wrong shapes
    V.check_broadcast(r, "r", d, "d")
    V.check_range(d, 1, 2**24, "d")
    r, d = V.to_int32(r, "r"), V.to_int32(d, "d")
    if V.is_concrete(r) and V.is_concrete(d):
        big = np.abs(np.asarray(r, np.int64)) >= (np.asarray(d, np.int64) << 20)
        if big.any():
            raise V.RangeError(
                f"r / d must lie in (-2**20, 2**20); found r = {np.broadcast_to(r, big.shape)[big][0]} "
                f"with d = {np.broadcast_to(d, big.shape)[big][0]}"
            )
    return _floor_divmod_small(r, d)


@jax.jit
def _floor_divmod_small(r: jax.Array, d: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:func:`floor_divmod_small` after its checks (int32 operands)."""
    c = jnp.floor(r.astype(jnp.float32) / d.astype(jnp.float32)).astype(jnp.int32)
    q, rem = c, r - c * d
    low = rem < 0
    q, rem = jnp.where(low, q - 1, q), jnp.where(low, rem + d, rem)
    high = rem >= d
    return jnp.where(high, q + 1, q), jnp.where(high, rem - d, rem)


def float0_zeros(x: jax.Array):
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def unbroadcast(g: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sums ``g`` over the axes that broadcasting added to reach ``g.shape`` from ``shape``."""
    extra = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(extra))) if extra else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


# --------------------------------------------------------------------------- saturate


def _clamp(x: jax.Array, lo, hi) -> tuple[jax.Array, jax.Array]:
    """``(clip(x, lo, hi), clipped)`` for int32 ``x`` and int32 (possibly traced) bounds."""
    y = jnp.clip(x, jnp.asarray(lo, _I32), jnp.asarray(hi, _I32))
    return y, y != x


def saturate(x, bits: int, *, symmetric: bool = True, saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """Clamps ``x`` to a ``bits``-wide signed range.

    Semantics: ``min(max(x, lo), hi)`` with ``hi = 2**(bits-1) - 1`` and
    ``lo = -hi`` (``symmetric=True``, as the XS3 VPU and most accumulators do) or
    ``lo = -hi - 1`` (two's complement, ``symmetric=False``).

    Args:
      x: integer array (at most 32 bits) or float array holding integer values.
      bits: static width, 2..32.
      symmetric: symmetric bounds (default) or two's-complement bounds.
      saturation_grad: float inputs only. ``"zero"``: gradient 1 where ``x`` is
        inside the bounds, 0 where it was clipped. ``"pass"``: gradient 1 everywhere
        (straight-through).

    Returns:
      int32 for integer inputs; the input float dtype for float inputs.
    """
    bits = V.check_static_int(bits, 2, 32, "bits")
    V.check_choice(saturation_grad, _SAT_GRADS, "saturation_grad")
    symmetric = V.check_flag(symmetric, "symmetric")
    x = checked_int(V.as_array(x, "x"), "x")
    lo, hi = int_bounds(bits, symmetric)
    return _saturate_jit(x, np.int32(lo), np.int32(hi), saturation_grad)


# The bounds are traced: one compilation serves every ``bits`` and ``symmetric``.
@functools.partial(jax.jit, static_argnums=3)
def _saturate_jit(x, lo, hi, saturation_grad: str):
    if S.is_float(x):
        return S.call(_clamp, lambda v, lo, hi: v, x, lo, hi, saturation_grad=saturation_grad)
    return _clamp(x.astype(_I32), lo, hi)[0]


# ------------------------------------------------------------------------ shift_right


def _round_shift_int32(x: jax.Array, s: jax.Array, rounding: str) -> jax.Array:
    """``round(x / 2**s)`` for int32 ``x`` and ``s >= 0`` (any size), without overflow.

    The floor quotient ``q = x >> min(s, 31)`` (exact: bits above 31 are sign bits) plus the
    increment of ``rounding``, formed from only what that mode reads: none for ``"floor"``;
    the rounding bit ``s - 1`` for ``"half_up"`` (``floor(x / 2**s + 1/2) = q + bit``, the
    bit being 1 exactly when the remainder reaches ``2**(s-1)``); the rounding bit, the
    bits below it and the sign or parity for the others."""
    q = x >> jnp.minimum(s, 31)
    if rounding == "floor":
        return q
    shifted = s >= 1
    n = s - 1  # index of the rounding bit; bits above 31 are sign bits
    rb = (((x >> jnp.clip(n, 0, 31)) & 1) == 1) & shifted
    if rounding == "half_up":
        return q + rb.astype(_I32)
    mask = jnp.where(n >= 32, _U32(0xFFFFFFFF), (_U32(1) << jnp.clip(n, 0, 31).astype(_U32)) - _U32(1))
    sticky = (jax.lax.bitcast_convert_type(x, _U32) & mask) != 0
    inc = _wide.round_increment(rounding, x < 0, rb, sticky, (q & 1) == 1, shifted)
    return q + inc.astype(_I32)


def _left_shift_sat32(x: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x * 2**k`` clamped to the int32 range, ``k >= 0``; returns (value, clipped)."""
    kc = jnp.clip(k, 0, 31)
    big = k >= 31
    lim_hi = jnp.where(big, _I32(0), _I32(2**31 - 1) >> kc)
    lim_lo = jnp.where(big, _I32(-1), _I32(-(2**31)) >> kc)
    over = x > lim_hi
    under = jnp.where(big, x < -1, x < lim_lo)
    shifted = jnp.where(big, jnp.where(x == -1, _I32(-(2**31)), _I32(0)), x << kc)
    y = jnp.where(over, _I32(2**31 - 1), jnp.where(under, _I32(-(2**31)), shifted))
    return y, over | under


def _shift_int(x, s, rounding, allow_left):
    right = _round_shift_int32(x, jnp.maximum(s, 0), rounding)
    if not allow_left:
        return right, jnp.zeros(right.shape, bool)
    left, clipped = _left_shift_sat32(x, jnp.maximum(-s, 0))
    neg = s < 0
    return jnp.where(neg, left, right), neg & clipped


def shift_right(
    x, shift, *, rounding: Rounding, allow_left: bool = False, saturation_grad: SaturationGrad = "zero"
) -> jax.Array:
    """Arithmetic right shift with rounding: ``round(x / 2**shift)``.

    Exact for every int32 ``x`` and every ``shift >= 0`` (shifts of 32 and more are
    well defined: the quotient is 0 or -1 before rounding); no intermediate wraps, so
    ``shift_right(2**31 - 1, 1, rounding="half_up") == 2**30``.

    Rounding of the exact quotient ``v = x / 2**shift``:
      * ``"half_up"``: ``floor(v + 1/2)`` (ties toward +inf; XS3 VLSAT, gemmlowp RDBPOT
        uses ``"half_away"``).
      * ``"half_away"``: ties away from zero.
      * ``"half_even"``: ties to the even integer.
      * ``"floor"``: toward -inf (plain ``>>``).
      * ``"trunc"``: toward zero.

    Negative shifts mean a left shift ``x * 2**(-shift)``; they are allowed only with
    ``allow_left=True`` and then saturate to the int32 range [-2**31, 2**31-1]
    (documented, reported by the ``"zero"`` gradient mask). Without ``allow_left`` a
    concrete negative shift raises ``ValueError``; under ``jit`` negative shifts are
    the caller's error and are treated as 0.

    Args:
      x: integer array (<= 32 bits) or float array holding integers.
      shift: integer scalar or array broadcastable against ``x``.
      rounding: one of ``ROUNDING_MODES``.
      allow_left: permit negative shifts (left shifts).
      saturation_grad: gradient where a left shift clipped: ``"zero"`` or ``"pass"``.

    Returns:
      int32 (integer ``x``) or ``x``'s float dtype. Gradient (float ``x``):
      straight-through for the rounding, ``dy/dx = 2**-shift``; 0 where a left shift
      clipped (unless ``saturation_grad="pass"``); no gradient for ``shift``.
    """
    V.check_choice(rounding, ROUNDING_MODES, "rounding")
    V.check_choice(saturation_grad, _SAT_GRADS, "saturation_grad")
    allow_left = V.check_flag(allow_left, "allow_left")
    x = V.as_array(x, "x")
    s = V.as_array(shift, "shift")
    if V.kind(s, "shift") != "int":
        raise V.ArgTypeError(f"shift must be an integer array or int, got dtype {s.dtype}")
    s = checked_int(s, "shift")
    if not allow_left:
        V.check_range(s, 0, 2**31 - 1, "shift (use allow_left=True for left shifts)")
    checked_int(x, "x")
    V.check_broadcast(x, "x", s, "shift")
    return _shift_right_jit(x, s, rounding, allow_left, saturation_grad)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _shift_right_jit(x, s, rounding: str, allow_left: bool, saturation_grad: str):
    s = s.astype(_I32)
    if S.is_float(x):
        return S.call(
            lambda v, k: _shift_int(v, k, rounding, allow_left),
            lambda v, k: v * S.exp2(-k, v),
            x,
            s,
            saturation_grad=saturation_grad,
        )
    return _shift_int(x.astype(_I32), s, rounding, allow_left)[0]


# -------------------------------------------------------------------------- fixed_mul

# Magnitude bits of each integer dtype: |v| <= 2**mag.
_MAG_BITS = {np.dtype(np.int8): 7, np.dtype(np.uint8): 8, np.dtype(np.int16): 15, np.dtype(np.uint16): 16}


def magnitude_bits(dtype) -> int:
    """Smallest m with |v| <= 2**m for every value of the integer ``dtype`` (int8: 7, uint8: 8,
    int16: 15, uint16: 16, int32: 31; int64, whose values the core keeps in int32: 31);
    ArgTypeError for anything else."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not (dt in _MAG_BITS or dt in (np.dtype(np.int32), np.dtype(np.int64))):
        # int64: arrays of it hold int32 values (checked) under jax_enable_x64
        raise V.ArgTypeError(f"dtype must be one of int8, uint8, int16, uint16, int32, got {dtype!r}")
    return _MAG_BITS.get(dt, 31)


def _fixed_mul_int(x, m, frac_bits, rounding, lo, hi, narrow):
    """``(clip(round(x * m / 2**frac_bits), lo, hi), clipped)``; ``frac_bits``, ``lo`` and
    ``hi`` may be traced int32 scalars."""
    frac_bits = jnp.asarray(frac_bits, _I32)
    if narrow:  # the product provably fits int32
        return _clamp(_round_shift_int32(x * m, frac_bits, rounding), lo, hi)
    p = _wide.mul_int32(x, m)
    r = _wide.shift_right(p, frac_bits, rounding)
    return _wide.saturate_to_int32(r, jnp.asarray(lo, _I32), jnp.asarray(hi, _I32))


def fixed_mul(
    x,
    m,
    frac_bits: int,
    *,
    rounding: Rounding = "half_up",
    bits: int = 32,
    symmetric: bool = True,
    saturation_grad: SaturationGrad = "zero",
) -> jax.Array:
    """Q-format multiply: ``saturate(shift_right(x * m, frac_bits, rounding), bits)``.

    The product ``x * m`` is formed exactly (64-bit, as two 32-bit words when the
    dtypes do not prove that it fits int32), shifted right by ``frac_bits`` with
    ``rounding`` and saturated to ``bits`` (symmetric by default). Q1.14 (XS3 VLMUL
    16-bit mode) is ``frac_bits=14, bits=16``. gemmlowp's
    ``SaturatingRoundingDoublingHighMul`` (``hwjax.gemmlowp.srdhm``) is ``frac_bits=31,
    rounding="half_up", symmetric=False`` on int32 operands: ties round up, toward +inf
    (not away from zero), and only ``(-2**31) * (-2**31)`` saturates, to ``2**31 - 1``.

    Args:
      x, m: integer arrays (<= 32 bits) or float arrays holding integers; broadcast.
      frac_bits: static, 0..62.
      rounding: one of ``ROUNDING_MODES``.
      bits: static output width, 2..32.
      symmetric: symmetric (default) or two's-complement saturation.
      saturation_grad: ``"zero"`` or ``"pass"`` where the output clipped.

    Returns:
      int32 for integer inputs, else the float dtype. Gradient (float inputs):
      ``dy/dx = m / 2**frac_bits``, ``dy/dm = x / 2**frac_bits`` (exact for the linear
      part, straight-through for rounding), 0 where saturation clipped.
    """
    frac_bits = V.check_static_int(frac_bits, 0, 62, "frac_bits")
    bits = V.check_static_int(bits, 2, 32, "bits")
    V.check_choice(rounding, ROUNDING_MODES, "rounding")
    V.check_choice(saturation_grad, _SAT_GRADS, "saturation_grad")
    x = V.as_array(x, "x")
    m = V.as_array(m, "m")
    symmetric = V.check_flag(symmetric, "symmetric")
    checked_int(x, "x")
    checked_int(m, "m")
    V.check_broadcast(x, "x", m, "m")
    lo, hi = int_bounds(bits, symmetric)
    return _fixed_mul_jit(x, m, np.int32(frac_bits), np.int32(lo), np.int32(hi), rounding, saturation_grad)


# ``frac_bits`` and the bounds are traced: one compilation per shapes, dtypes and rounding.
@functools.partial(jax.jit, static_argnums=(5, 6))
def _fixed_mul_jit(x, m, frac_bits, lo, hi, rounding: str, saturation_grad: str):
    if S.is_float(x) or S.is_float(m):
        return S.call(
            lambda a, b, f, lo, hi: _fixed_mul_int(a, b, f, rounding, lo, hi, narrow=False),
            lambda a, b, f, lo, hi: a * b * S.exp2(-f, a * b),
            x,
            m,
            frac_bits,
            lo,
            hi,
            saturation_grad=saturation_grad,
        )
    narrow = magnitude_bits(x.dtype) + magnitude_bits(m.dtype) <= 31
    return _fixed_mul_int(x.astype(_I32), m.astype(_I32), frac_bits, rounding, lo, hi, narrow)[0]
