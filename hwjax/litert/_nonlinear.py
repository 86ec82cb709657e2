"""Integer kernels of LiteRT's nonlinear operators: SOFTMAX, LOGISTIC, TANH.

What LiteRT 2.x computes for int8 tensors (x86, one thread), and what is emulated here:

* LOGISTIC / TANH, every resolver (``BUILTIN_REF``, the builtin optimized kernels and
  the default XNNPACK delegate alike): a 256-entry table built once from float32
  arithmetic, :func:`litert_lut_table`. The table is a function of the four
  quantisation parameters only; at run time the op is a lookup (:func:`lut_lookup`).
* SOFTMAX, ``BUILTIN_REF``: the gemmlowp fixed-point algorithm (Q5.26 input
  differences, ``exp_on_negative_values``, a Q12.19 sum, the Newton-Raphson reciprocal
  ``one_over_one_plus_x_for_x_in_0_1``), all int32: :func:`softmax_reference_params`
  (host) and :func:`softmax_reference` (JAX).
* SOFTMAX, builtin optimized kernels (and the XNNPACK delegate, which leaves int8
  SOFTMAX to them): a float32 table ``exp(-s_in * beta * k)`` (:func:`softmax_exp_table`),
  a sequential float32 sum over the row and a rounded float32 product
  (:func:`softmax_optimized`).

The float32 transcendental functions are those of the C library that LiteRT's kernels
call (``expf``, ``tanhf``, through :mod:`ctypes`): they are not correctly rounded, so
neither numpy's nor XLA's ``exp`` would reproduce them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program
from hwjax.errors import RangeError, ShapeError, UnsupportedOpError
from hwjax.litert._arith import (
    INT32_MAX as _I32_MAX,
    INT32_MIN as _I32_MIN,
    _traced,
    check_finite_number,
    check_int_array,
    check_ints,
    check_scale,
    check_zero_point,
    quantize_multiplier,
    rdbpot32,
    srdhm32,
)

_I32 = jnp.int32
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
#: SOFTMAX's integer bits of the scaled input difference (Q5.26) and of the sum (Q12.19)
SCALED_DIFF_INTEGER_BITS, ACCUMULATION_INTEGER_BITS = 5, 12
#: the longest SOFTMAX row hwjax runs on LiteRT's reference kernel: from 512 values on,
#: a sum of exps of 2**28 or more (512 equal maxima) needs a final shift beyond 31, which
#: the kernel either checks and aborts on or computes with an out-of-range C shift
REFERENCE_MAX_DEPTH = 511
#: the output scale LiteRT's LOGISTIC requires ([0, 1) in 1/256 steps)
SIGMOID_OUTPUT_SCALE = 1.0 / 256


# ------------------------------------------------------------------ C library float32


@functools.lru_cache(maxsize=None)
def _libm():
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name)
        fns = {}
        for f in ("expf", "tanhf"):
            fn = getattr(lib, f)
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
            fns[f] = fn
        return fns
    except (OSError, AttributeError, TypeError):
        return None


def c_float_fn(name: str, x) -> np.ndarray:
    """The C library's float32 ``name`` (``"expf"`` or ``"tanhf"``) of each float32 in
    ``x``: the function LiteRT's kernels call, bit for bit on the same platform.
    UnsupportedOpError when the C library cannot be loaded (there is no portable
    substitute: ``expf`` / ``tanhf`` are not correctly rounded)."""
    fns = _libm()
    if fns is None:
        raise UnsupportedOpError(
            f"the C library's {name} (needed to reproduce LiteRT's float32 tables) "
            "cannot be loaded through ctypes on this platform"
        )
    fn = fns[name]
    a = np.asarray(x, np.float32)
    return np.array([fn(float(v)) for v in a.reshape(-1)], np.float32).reshape(a.shape)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """``std::round`` of float values, exactly (no ``+0.5`` rounding error)."""
    a = np.abs(v)
    r = np.floor(a)
    r = r + (a - r >= 0.5)
    return np.copysign(r, v)


# ------------------------------------------------------------------- LOGISTIC / TANH


def int8_values() -> np.ndarray:
    """The int8 value served by each table entry: entry ``i`` is the int8 whose byte is
    ``i`` (``0..127`` then ``-128..-1``), as LiteRT orders its tables."""
    v = np.arange(256)
    return np.where(v > 127, v - 256, v).astype(np.int32)


def litert_lut_table(fn: str, s_in, z_in, s_out, z_out) -> np.ndarray:
    """LiteRT's int8 LOGISTIC / TANH table (``LUTPopulate<int8_t>``), host arithmetic.

    For the int8 value ``v`` of entry ``i`` (:func:`int8_values`), all float32::

        d = s_in * (v - z_in)
        t = 1 / (1 + expf(-d))        (fn "sigmoid")    or    tanhf(d)   (fn "tanh")
        table[i] = clamp(round_half_away(t * (1 / s_out)) + z_out, -128, 127)

    Returns int32 (256,)."""
    if not (isinstance(fn, str) and fn in ("sigmoid", "tanh")):
        raise RangeError(f"fn must be 'sigmoid' or 'tanh', got {fn!r}")
    check_scale(s_in, "s_in")
    check_scale(s_out, "s_out")
    check_zero_point(z_in, "z_in")
    check_zero_point(z_out, "z_out")
    s_in, s_out = (np.float32(np.asarray(v, np.float32).reshape(())) for v in (s_in, s_out))
    z_in, z_out = (np.asarray(v).reshape(()) for v in (z_in, z_out))
    v = int8_values()
    d = (s_in * (v - np.int32(z_in)).astype(np.float32)).astype(np.float32)
    one = np.float32(1)
    if fn == "sigmoid":
        t = (one / (one + c_float_fn("expf", -d))).astype(np.float32)
    else:
        t = c_float_fn("tanhf", d)
    inv = np.float32(one / s_out)
    r = _round_half_away((t * inv).astype(np.float32))
    return np.clip(r + int(z_out), -128, 127).astype(np.int32)


def check_table(table, name: str, n: int, *, integer: bool) -> None:
    """A table of ``n`` entries (integers, or finite float32 values)."""
    kind = "integer" if integer else "float32"
    if _traced(table):
        if table.shape != (n,):
            raise ShapeError(f"{name} must be a ({n},) {kind} table, got shape {table.shape}")
        return
    if integer:
        check_ints(table, name)
        a = np.asarray(table)
    else:
        a = np.asarray(check_int_or_float(table, name))
    if a.shape != (n,):
        raise ShapeError(f"{name} must be a ({n},) {kind} table, got shape {a.shape}")


def check_int_or_float(v, name: str):
    from hwjax.litert._arith import _numbers

    return _numbers(v, name, "a float32 array")


def lut_lookup(x, table) -> jax.Array:
    """``table[u8(x)]`` for int32 ``x`` holding int8 values (an int32 gather). Jittable."""
    x = check_int_array(x, "x")
    check_table(table, "table", 256, integer=True)
    return _lut_lookup(x, table)


@eager_program
def _lut_lookup(x, table) -> jax.Array:
    idx = jnp.bitwise_and(jnp.asarray(x, _I32), 255)
    return jnp.take(jnp.asarray(table, _I32), idx, axis=0)


# ------------------------------------------------------------ SOFTMAX: host recipes


def softmax_reference_params(s_in, beta) -> dict[str, np.ndarray]:
    """LiteRT's reference SOFTMAX parameters (``PreprocessSoftmaxScaling`` with 5
    integer bits, ``CalculateInputRadius``), float64 host arithmetic::

        real = min(double(beta) * double(s_in) * 2**26, 2**31 - 1)
        (m, ls) = QuantizeMultiplier(real)           (ls >= 0 since real > 1)
        diff_min = -floor(31 * 2**26 / 2**ls)

    Returns ``{"m", "ls", "diff_min"}`` as int32 scalars. RangeError when ``real <= 1``
    (LiteRT aborts there; the converter rejects such models)."""
    check_scale(s_in, "s_in")
    check_finite_number(beta, "beta")
    beta, s_in = (np.asarray(v, np.float32).reshape(()) for v in (beta, s_in))
    real = min(float(np.float32(beta)) * float(np.float32(s_in)) * 2.0**26, 2.0**31 - 1.0)
    if not real > 1.0:
        raise RangeError(
            f"softmax: beta * s_in * 2**26 = {real!r} must exceed 1 (LiteRT's reference kernel aborts otherwise)"
        )
    m, ls = quantize_multiplier(real)
    diff_min = -math.floor(31.0 * 2.0**26 / 2.0**ls)
    return {"m": np.int32(m), "ls": np.int32(ls), "diff_min": np.int32(diff_min)}


def softmax_exp_table(s_in, beta) -> np.ndarray:
    """LiteRT's optimized SOFTMAX table (``PopulateSoftmaxLookupTable``), float32:
    ``table[k] = expf(fl32(-s_in * beta) * k)`` for ``k = 0..255`` (``k`` is the row
    maximum minus the input value). Returns float32 (256,)."""
    check_scale(s_in, "s_in")
    check_finite_number(beta, "beta")
    beta, s_in = (np.asarray(v, np.float32).reshape(()) for v in (beta, s_in))
    scale = np.float32(-np.float32(s_in) * np.float32(beta))
    k = np.arange(256).astype(np.float32)
    return c_float_fn("expf", (scale * k).astype(np.float32))


# ------------------------------------------------------ gemmlowp fixed point (int32)
#
# The SOFTMAX kernel's fixed-point steps, on the lean int32 forms of the gemmlowp
# primitives (srdhm32, rdbpot32 in hwjax.litert._arith; spec gemmlowp.md §2.1, §2.3): the
# same values as hwjax.gemmlowp.srdhm / rounding_divide_by_pot, in about a third of the
# XLA program (no argument checks, no gradients).


def _sat_shl(x, k: int):
    """gemmlowp ``SaturatingRoundingMultiplyByPOT<k>`` for static ``k > 0``:
    ``x * 2**k`` clamped to the int32 range."""
    limit = (1 << (31 - k)) - 1
    return jnp.where(x > limit, jnp.int32(INT32_MAX), jnp.where(x < -limit, jnp.int32(INT32_MIN), jnp.left_shift(x, k)))


def exp_on_interval_between_negative_one_quarter_and_0_excl(a) -> jax.Array:
    """gemmlowp's ``exp`` on Q0.31 ``a`` in [-1/4, 0): the 4th-order Taylor polynomial
    around -1/8, with ``*`` = SRDHM and int32 additions::

        x = a + 2**28;  x2 = x*x;  x3 = x2*x;  x4 = x2*x2
        p = RDBPOT((RDBPOT(x4, 2) + x3) * 715827883 + x2, 1)
        result = 1895147668 + 1895147668 * (x + p)

    Returns Q0.31 int32."""
    c = jnp.int32(1895147668)
    x = a + jnp.int32(1 << 28)
    x2 = srdhm32(x, x)
    x3 = srdhm32(x2, x)
    x4 = srdhm32(x2, x2)
    p = rdbpot32(srdhm32(rdbpot32(x4, 2) + x3, jnp.int32(715827883)) + x2, 1)
    return c + srdhm32(c, x + p)


#: exp(-2**k) in Q0.31 for k = -2..4: the barrel shifter of ``exp_on_negative_values``
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int = 5) -> jax.Array:
    """gemmlowp ``exp_on_negative_values`` of int32 ``a <= 0`` in Q(n).(31-n) (``n =
    integer_bits``, 1..5; f = 31 - n fractional bits), as Q0.31 int32::

        r = (a & (2**(f-2) - 1)) - 2**(f-2)              (a mod 1/4, minus 1/4)
        y = exp_on_interval(sat(r * 2**n))
        for each bit 2**(f + k) (k = -2..n-1) of (r - a): y = y * exp(-2**k)   (SRDHM)
        y = 2**31 - 1 where a == 0

    Exact int32 arithmetic; jittable. (LiteRT's softmax uses n = 5, TFLM's LOGISTIC and
    TANH n = 4.)"""
    if not 1 <= integer_bits <= 5:
        raise RangeError(f"integer_bits must lie in [1, 5], got {integer_bits}")
    f = 31 - integer_bits
    a = jnp.asarray(a, _I32)
    r = jnp.bitwise_and(a, jnp.int32((1 << (f - 2)) - 1)) - jnp.int32(1 << (f - 2))
    y = exp_on_interval_between_negative_one_quarter_and_0_excl(_sat_shl(r, integer_bits))
    rem = r - a
    for k, mult in _EXP_BARREL[: integer_bits + 2]:
        bit = jnp.bitwise_and(rem, jnp.int32(1 << (f + k))) != 0
        y = jnp.where(bit, srdhm32(y, jnp.int32(mult)), y)
    return jnp.where(a == 0, jnp.int32(INT32_MAX), y)


def one_over_one_plus_x_for_x_in_0_1(a) -> jax.Array:
    """gemmlowp ``one_over_one_plus_x_for_x_in_0_1`` of Q0.31 int32 ``a`` in [0, 1),
    as Q0.31 (the result is ``1/(1+a)`` in Q1.30 reinterpreted, saturated ``* 2``)::

        h = RoundingHalfSum(a, 2**31 - 1) = (a >> 1) + 2**30           (a >= 0)
        x = 1515870810 + h * (-1010580540)                 (48/17 - 32/17 h, Q2.29)
        3 times:  x = x + sat((x * (2**29 - h * x)) * 2**2)
        result = sat(x * 2)

    with ``*`` between fixed-point values = SRDHM. Exact; jittable."""
    return _sat_shl(reciprocal_newton_q2_29(a), 1)


def reciprocal_newton_q2_29(a) -> jax.Array:
    """``x ~ 1 / (1 + a)`` in Q2.29 for Q0.31 ``a`` in [0, 1): gemmlowp's three
    Newton-Raphson steps from ``48/17 - 32/17 h`` on ``h = (a >> 1) + 2**30`` (see
    :func:`one_over_one_plus_x_for_x_in_0_1`), before the final rescaling. Exact int32."""
    a = jnp.asarray(a, _I32)
    h = jnp.right_shift(a, 1) + jnp.int32(1 << 30)
    x = jnp.int32(1515870810) + srdhm32(h, jnp.int32(-1010580540))
    for _ in range(3):
        one_minus = jnp.int32(1 << 29) - srdhm32(h, x)
        x = x + _sat_shl(srdhm32(x, one_minus), 2)
    return x


def _clz32(s) -> jax.Array:
    return jax.lax.clz(jnp.asarray(s, _I32))


def softmax_reference(x, m, ls, diff_min) -> jax.Array:
    """LiteRT's reference int8 SOFTMAX over the last axis of int32 ``x`` (int8 values),
    output quantised 1/256 with zero point -128, all int32 arithmetic. Per row::

        d = x - max(x);  keep = d >= diff_min
        e = exp_on_negative_values(SRDHM(wrap32(d * 2**ls), m))         (Q0.31)
        S = sum over kept of RDBPOT(e, 12)                             (Q12.19)
        h = clz32(S);  n = 12 - h
        r = one_over_one_plus_x_for_x_in_0_1((S << h) - 2**31)         (wrapping)
        y = clamp(RDBPOT(SRDHM(r, e), n + 23) - 128, -128, 127) if keep else -128

    ``m``, ``ls``, ``diff_min`` from :func:`softmax_reference_params`. Rows longer than
    :data:`REFERENCE_MAX_DEPTH` are the caller's to reject. Returns int32."""
    x = check_int_array(x, "x")
    check_ints(m, "m", _I32_MIN, _I32_MAX)
    check_ints(ls, "ls", 0, 31)
    check_ints(diff_min, "diff_min", _I32_MIN, 0)
    return _softmax_reference(x, m, ls, diff_min)


@jax.jit
def _softmax_reference(x, m, ls, diff_min) -> jax.Array:
    """:func:`softmax_reference` after its checks, as one program."""
    x = jnp.asarray(x, _I32)
    m, ls, diff_min = (jnp.asarray(v, _I32) for v in (m, ls, diff_min))
    d = x - jnp.max(x, axis=-1, keepdims=True)
    keep = d >= diff_min
    e = exp_on_negative_values(srdhm32(jnp.left_shift(d, ls), m))
    total = jnp.sum(jnp.where(keep, rdbpot32(e, ACCUMULATION_INTEGER_BITS), 0), axis=-1, keepdims=True, dtype=_I32)
    h = _clz32(total)
    n = ACCUMULATION_INTEGER_BITS - h
    shifted_minus_one = jnp.bitwise_xor(jnp.left_shift(total, h), jnp.int32(INT32_MIN))
    r = one_over_one_plus_x_for_x_in_0_1(shifted_minus_one)
    y = rdbpot32(srdhm32(r, e), jnp.clip(n + 31 - 8, 0, 31)) - 128
    return jnp.where(keep, jnp.clip(y, -128, 127), -128)


def _round_half_away_f32(p: jax.Array) -> jax.Array:
    a = jnp.abs(p)
    r = jnp.floor(a)
    r = r + jnp.where(a - r >= 0.5, jnp.float32(1), jnp.float32(0))
    return jnp.where(p < 0, -r, r)


def sequential_sum_f32(v: jax.Array) -> jax.Array:
    """``((v[0] + v[1]) + v[2]) + ...`` over the last axis in float32, starting from 0
    (a C loop's order; ``jnp.sum`` may associate differently). Returns the sums with
    the last axis kept (size 1)."""

    def step(acc, col):
        acc = acc + col
        return acc, None

    cols = jnp.moveaxis(v, -1, 0)
    total, _ = jax.lax.scan(step, jnp.zeros(cols.shape[1:], jnp.float32), cols)
    return total[..., None]


def softmax_optimized(x, table, s_out, z_out) -> jax.Array:
    """LiteRT's optimized int8 SOFTMAX over the last axis of int32 ``x`` (int8 values),
    float32 arithmetic in the C kernel's order. Per row, with ``e = table[max(x) - x]``
    (:func:`softmax_exp_table`)::

        S = ((0 + e[0]) + e[1]) + ...                  (float32, sequential)
        inv = 1 / (S * s_out)
        y = clamp(round_half_away(e * inv) + z_out, -128, 127)

    Returns int32."""
    x = check_int_array(x, "x")
    check_table(table, "table", 256, integer=False)
    check_scale(s_out, "s_out")
    check_zero_point(z_out, "z_out", -128, 127)
    return _softmax_optimized(x, table, s_out, z_out)


@jax.jit
def _softmax_optimized(x, table, s_out, z_out) -> jax.Array:
    """:func:`softmax_optimized` after its checks, as one program."""
    x = jnp.asarray(x, _I32)
    k = jnp.max(x, axis=-1, keepdims=True) - x
    e = jnp.take(jnp.asarray(table, jnp.float32), k, axis=0)
    inv = jnp.float32(1) / (sequential_sum_f32(e) * jnp.asarray(s_out, jnp.float32))
    p = jnp.clip(_round_half_away_f32(e * inv), -1024.0, 1024.0).astype(_I32)
    return jnp.clip(p + jnp.asarray(z_out, _I32), -128, 127)


def softmax_quant_error(s_in, beta, s_out, z_out) -> str | None:
    """Why LiteRT rejects (or aborts on) an int8 SOFTMAX with these parameters, or None:
    ``beta`` must be positive and finite, the output zero point -128 and the output scale
    within 0.001/256 of 1/256 (float32, ``TF_LITE_ENSURE_NEAR``), and
    ``beta * s_in * 2**26 > 1`` (the reference kernel's multiplier must exceed one)."""
    if not (math.isfinite(beta) and beta > 0):
        return f"beta {beta!r} must be positive and finite"
    delta = abs(np.float32(s_out) - np.float32(1.0 / 256))
    if z_out != -128 or delta > np.float32(np.float32(0.001) * np.float32(1.0 / 256)):
        return (
            f"output scale {float(s_out)!r} and zero point {z_out}; LiteRT requires 1/256 (within 0.001/256) and -128"
        )
    if float(np.float32(beta)) * float(np.float32(s_in)) * 2.0**26 <= 1.0:
        return (
            f"beta * input scale = {float(np.float32(beta)) * float(np.float32(s_in))!r} is at most 2**-26: "
            "LiteRT's reference kernel aborts on it"
        )
    return None
