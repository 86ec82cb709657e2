"""TFLite / LiteRT int8 requantisation: ``QuantizeMultiplier``, ``MultiplyByQuantizedMultiplier``
and the four conventions R1-R4 of the spec (gemmlowp.md §2.4-§2.9).

The multipliers are derived on the host in float64, exactly as TFLite's C++ does
(``double`` arithmetic does not depend on ``jax_enable_x64``); the per-element
arithmetic is exact int32 / two-word integer arithmetic from :mod:`hwjax.gemmlowp` and
:mod:`hwjax.core`; R2 (LiteRT's float64 reference fully connected) is float64 arithmetic in the
program on CPU and GPU (a primitive lowered to float64 HLO, whatever
``jax_enable_x64`` says) and its exact emulation in 32-bit integer words elsewhere; R4
(XNNPACK) is float32 element-wise arithmetic by definition.
"""

from __future__ import annotations

import dataclasses
import functools

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import batching, mlir

from hwjax.core import validate as V
from hwjax.core import eager_program, wide
from hwjax.errors import ArgTypeError, RangeError, ShapeError

_I32 = jnp.int32
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

#: requantisation conventions: name -> (spec label, what runs it)
REQUANT = {
    "double": "R1: double-rounding MultiplyByQuantizedMultiplier (TFLite/TFLM reference, LiteRT BUILTIN_REF conv)",
    "float64": "R2: float64 requantisation (LiteRT BUILTIN_REF fully connected)",
    "ruy": "R3: ruy x86 (LiteRT builtin optimized kernels, no delegate)",
    "xnnpack": "R4: XNNPACK fp32 (LiteRT default interpreter)",
    "single": "TFLITE_SINGLE_ROUNDING=1 MultiplyByQuantizedMultiplier",
    "lanes8": "R3 on the channels in whole groups of 8, R1 on the rest (LiteRT optimized per-channel depthwise, x86)",
}
#: channels per vector group of the ``"lanes8"`` convention
LANES8 = 8
ACTIVATIONS = (None, "relu", "relu6", "relu_n1_to_1")


# ------------------------------------------------------- argument checks (public boundary)
#
# The kernels below and in the sibling modules run inside ``jit`` (the TFLite target): a
# traced argument passes every value check (its type is checked where that is known at
# trace time); a concrete one is checked here, with its name, range and value.


def _traced(v) -> bool:
    return isinstance(v, jax.core.Tracer)


def _numbers(v, name: str, what: str) -> np.ndarray:
    """``v`` as a NumPy integer or float array, else :class:`ArgTypeError` naming ``name``."""
    if v is None or isinstance(v, (str, bytes, bool, np.bool_, dict)):
        raise ArgTypeError(f"{name} must be {what}, got {v!r}")
    try:
        a = np.asarray(v)
    except (TypeError, ValueError, OverflowError):
        raise ArgTypeError(f"{name} must be {what}, got {v!r}") from None
    if a.dtype.kind not in "iu" and not V.is_float_dtype(a.dtype):
        raise ArgTypeError(f"{name} must be {what}, got {v!r} (dtype {a.dtype})")
    return a


def check_scale(v, name: str):
    """A quantisation scale: one concrete number whose float32 value is finite and > 0.
    Returns ``v`` unchanged (a traced value passes)."""
    if _traced(v):
        return v
    a = _numbers(v, name, "a finite float32 scale > 0")
    if a.size != 1:
        raise ShapeError(f"{name} must be one number (a finite float32 scale > 0), got shape {a.shape}")
    check_scales(a, name)
    return v


def check_scales(v, name: str):
    """One or more scales (an array of at least one entry), each finite and > 0 in float32."""
    if _traced(v):
        return v
    a = _numbers(v, name, "finite float32 scales > 0")
    if a.size == 0:
        raise ShapeError(f"{name} must hold at least one scale, got shape {a.shape}")
    with np.errstate(over="ignore", under="ignore"):
        f = a.astype(np.float32)
    ok = np.isfinite(f) & (f > 0)
    if not ok.all():
        bad = a.reshape(-1)[np.argmin(ok.reshape(-1))]
        raise RangeError(f"{name} must be finite and > 0 in float32, got {bad.item()!r}")
    return v


def check_finite_number(v, name: str):
    """One concrete finite number (float32)."""
    if _traced(v):
        return v
    a = _numbers(v, name, "a finite number")
    if a.size != 1:
        raise ShapeError(f"{name} must be one number, got shape {a.shape}")
    with np.errstate(over="ignore"):
        if not np.isfinite(a.astype(np.float32)).all():
            raise RangeError(f"{name} must be finite (float32), got {a.reshape(-1)[0].item()!r}")
    return v


def check_ints(v, name: str, lo: int = INT32_MIN, hi: int = INT32_MAX, *, scalar: bool = False):
    """Integer value(s) in ``[lo, hi]`` (a Python or NumPy int, an integer array; a float
    holding an integer is accepted for a scalar). ``scalar``: exactly one value. A traced
    value must have an integer dtype and is not range-checked. Returns ``v`` unchanged."""
    what = f"an integer{'' if scalar else ' array'} in [{lo}, {hi}]"
    if _traced(v):
        if not jnp.issubdtype(v.dtype, jnp.integer):
            raise ArgTypeError(f"{name} must be {what}, got a traced {v.dtype}")
        return v
    a = _numbers(v, name, what)
    if scalar and a.size != 1:
        raise ShapeError(f"{name} must be one integer in [{lo}, {hi}], got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if not scalar:
            raise ArgTypeError(f"{name} must be {what}, got dtype {a.dtype}")
        f = a.reshape(())
        if not (np.isfinite(f) and f == np.floor(f)):
            raise RangeError(f"{name} must be {what}, got {f.item()!r}")
    V.check_range(a, lo, hi, name)
    return v


def check_zero_point(v, name: str, lo: int = -128, hi: int = 255):
    """A zero point: one integer in ``[lo, hi]`` (int8 and uint8 tensors)."""
    return check_ints(v, name, lo, hi, scalar=True)


def check_act_range(act_min, act_max, names=("act_min", "act_max")):
    """``act_min <= act_max``, both int32 integers."""
    check_ints(act_min, names[0], scalar=True)
    check_ints(act_max, names[1], scalar=True)
    if not (_traced(act_min) or _traced(act_max)) and np.asarray(act_min).item() > np.asarray(act_max).item():
        raise RangeError(
            f"{names[0]}={np.asarray(act_min).item()} must not exceed {names[1]}={np.asarray(act_max).item()}"
        )


def check_int_array(x, name: str, lo: int = -128, hi: int = 127) -> jax.Array:
    """An integer array whose (concrete) values lie in ``[lo, hi]`` (int8 values by default),
    as a JAX array of its integer dtype (lists and Python ints: int32)."""
    a = V.as_array(x, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer array with values in [{lo}, {hi}], got dtype {a.dtype}")
    if not _traced(a):
        V.check_range(a, lo, hi, name)
    return a


def check_params(p, name: str, keys) -> Mapping:
    """A parameter dict holding ``keys`` (:class:`ArgTypeError` naming ``name`` otherwise)."""
    if not isinstance(p, Mapping):
        raise ArgTypeError(f"{name} must be a dict of parameters with keys {list(keys)}, got {type(p).__name__}")
    missing = [k for k in keys if k not in p]
    if missing:
        raise ArgTypeError(f"{name} lacks the key(s) {missing} (it needs {list(keys)})")
    return p


def params_used(p: Mapping, keys) -> dict:
    """The entries ``keys`` of a checked parameter dict: what a compiled program receives
    (its arguments then hold only the arrays it reads)."""
    return {k: p[k] for k in keys}


#: the parameter keys of each requantisation convention (:func:`requant_params`)
REQUANT_KEYS = {
    "double": ("multiplier", "shift"),
    "single": ("multiplier", "shift"),
    "ruy": ("multiplier", "shift"),
    "lanes8": ("multiplier", "shift"),
    "float64": ("eff_hi", "eff_lo"),
    "xnnpack": ("scale",),
}


def check_requant_params(params, requant: str, name: str = "params", channels: int | None = None) -> None:
    """``params`` from :func:`requant_params` for ``requant``: the keys, integer (or, for
    ``"xnnpack"``, scale) values, and 1 or ``channels`` entries each."""
    V.check_choice(requant, tuple(REQUANT), "requant")
    check_params(params, name, REQUANT_KEYS[requant])
    if "acc_bound" in params:
        b = params["acc_bound"]
        if requant not in ("double", "ruy", "lanes8") or not isinstance(b, AccBound):
            raise ArgTypeError(
                f"{name}['acc_bound'] must be an AccBound (with_acc_bound), for requant 'double', 'ruy' or "
                f"'lanes8'; got {type(b).__name__} for {requant!r}"
            )
        if not 1 <= b.bits <= 29:
            raise RangeError(f"{name}['acc_bound'].bits must be in [1, 29], got {b.bits}")
    for k in REQUANT_KEYS[requant]:
        v, what = params[k], f"{name}['{k}']"
        if requant == "xnnpack":
            check_scales(v, what)
        elif requant == "float64":
            check_ints(v, what, 0, 2**32 - 1)
        else:
            check_ints(v, what)
        if channels is not None and not _traced(v) and np.size(v) not in (1, channels):
            raise ShapeError(f"{what} must have 1 or {channels} (output channels) entries, got {np.size(v)}")


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """``std::round`` on float64 values (exact: no ``+0.5`` rounding)."""
    a = np.abs(v)
    r = np.floor(a)
    r = r + (a - r >= 0.5)
    return np.copysign(r, v)


def quantize_multiplier(real, *, single_rounding: bool = False):
    """TFLite ``QuantizeMultiplier(double)`` (spec §2.4): ``(m, shift)`` with
    ``real ~= m * 2**(shift - 31)``.

    ``frexp``, ``m = round_half_away(q * 2**31)``, ``2**31 -> (2**30, shift + 1)``,
    ``shift < -31 -> (0, 0)``; with ``single_rounding`` (a ``TFLITE_SINGLE_ROUNDING=1``
    build) ``shift > 30 -> (2**31 - 1, 30)``. Host arithmetic in float64.

    Args:
      real: a Python float or an array of them (float64 is used as given; float32
        values are widened exactly).
    Returns:
      ``(m, shift)``: Python ints for a scalar ``real``, else int32 numpy arrays.
    """
    V.check_flag(single_rounding, "single_rounding")
    r = _numbers(real, "real", "a float or an array of floats").astype(np.float64)
    scalar = r.ndim == 0
    if not np.all(np.isfinite(r)):
        raise RangeError(f"quantize_multiplier: real must be finite, got {real!r}")
    q, e = np.frexp(r)
    m = _round_half_away(q * 2.0**31).astype(np.int64)
    e = e.astype(np.int64)
    top = m == 2**31
    m = np.where(top, 2**30, m)
    e = np.where(top, e + 1, e)
    tiny = e < -31
    m = np.where(tiny | (r == 0), 0, m)
    e = np.where(tiny | (r == 0), 0, e)
    if single_rounding:
        big = e > 30
        m = np.where(big, 2**31 - 1, m)
        e = np.where(big, 30, e)
    if np.any(e > 2**30):
        raise RangeError(f"quantize_multiplier: real={real!r} is too large")
    m, e = m.astype(np.int32), e.astype(np.int32)
    return (int(m), int(e)) if scalar else (m, e)


def _int32(x, name: str) -> jax.Array:
    """``x`` checked to be an integer array of int32 values (not converted)."""
    a = V.as_array(x, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if np.dtype(a.dtype) == np.int64:
        V.check_range(a, INT32_MIN, INT32_MAX, name)
    return a


def multiply_by_quantized_multiplier(x, multiplier, shift, *, rounding: str = "double") -> jax.Array:
    """TFLite ``MultiplyByQuantizedMultiplier(int32 x, int32 m, int shift)`` (spec §2.5).

    ``rounding="double"`` (default build): ``RDBPOT(SRDHM(wrap32(x * 2**max(shift, 0)), m),
    max(-shift, 0))``; ``"single"`` (``TFLITE_SINGLE_ROUNDING=1``): ``floor((x*m +
    2**(30-shift)) / 2**(31-shift))`` from the exact 64-bit product (requires
    ``m >= 0``, ``-31 <= shift <= 30``). ``x``, ``multiplier``, ``shift`` broadcast;
    exact for all int32 without x64; jittable. Returns int32.
    """
    V.check_choice(rounding, ("double", "single"), "rounding")
    x, m, s = _int32(x, "x"), _int32(multiplier, "multiplier"), _int32(shift, "shift")
    if rounding == "double":
        V.check_range(s, -31, 31, "shift")
    else:
        V.check_range(s, -31, 30, "shift")
        V.check_range(m, 0, INT32_MAX, "multiplier")
    return _mbqm(x, m, s, rounding)


@eager_program(static_argnames=("rounding",))
def _mbqm(x, m, s, rounding: str) -> jax.Array:
    """:func:`multiply_by_quantized_multiplier` after its checks."""
    x, m, s = (jnp.asarray(v).astype(_I32) for v in (x, m, s))
    return _mbqm_double(x, m, s) if rounding == "double" else _mbqm_single(x, m, s)


def mbqm_double(x, m, s):
    """``MultiplyByQuantizedMultiplier`` (double rounding) on traced int32 ``x``, ``m``, ``s``
    (the form the TFLite target runs inside ``jit``: traced arguments are not checked;
    concrete ones must be int32 integers, ``s`` in [-31, 31])."""
    x = check_int_array(x, "x", INT32_MIN, INT32_MAX)
    m = check_int_array(m, "m", INT32_MIN, INT32_MAX)
    s = check_int_array(s, "s", -31, 31)
    return _mbqm(x, m, s, "double")


# The per-element forms below are the spec's definitions written with the fewest int32
# operations (XLA fuses each chain into one loop): no 64-bit emulation object, the
# multiplier split once per channel, wrapping int32 adds wherever the exact result is
# known to fit. They equal hwjax.gemmlowp's srdhm / rounding_divide_by_pot and
# hwjax.core.shift_right(half_up) for every int32 input.


def srdhm32(a, b) -> jax.Array:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` of int32 ``a``, ``b`` (spec §2.1)::

        2**31 - 1 if a == b == -2**31, else floor((a*b + 2**30) / 2**31)

    exact from four 16x16-bit partial products in int32: with ``a = ah 2**16 + al``,
    ``b = bh 2**16 + bl`` (``al``, ``bl`` in [0, 2**16)), ``m1 = ah bl``, ``m2 = al bh``
    (each ``|.| < 2**31``) split as ``mi = mih 2**15 + mil``::

        srdhm = 2 ah bh + m1h + m2h + floor((m1l + m2l + floor(al bl / 2**16) + 2**14) / 2**15)

    (the dropped low 16 bits of ``al bl`` cannot carry: the floor of ``(N + f) / 2**15``
    with integer ``N`` and ``0 <= f < 1`` is ``floor(N / 2**15)``). The sum wraps only for
    the saturating pair, which the final select replaces. Jittable; exact for all int32
    without x64; no argument checks."""
    a, b = jnp.asarray(a, _I32), jnp.asarray(b, _I32)
    ah, al = a >> 16, a & 0xFFFF
    bh, bl = b >> 16, b & 0xFFFF
    low = jax.lax.shift_right_logical(al.astype(jnp.uint32) * bl.astype(jnp.uint32), jnp.uint32(16))
    m1, m2 = ah * bl, al * bh
    carry = ((m1 & 0x7FFF) + (m2 & 0x7FFF) + low.astype(_I32) + (1 << 14)) >> 15
    r = 2 * (ah * bh) + (m1 >> 15) + (m2 >> 15) + carry
    return jnp.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, r)


def rdbpot32(x, e) -> jax.Array:
    """gemmlowp ``RoundingDivideByPOT`` of int32 ``x`` by ``2**e``, ``0 <= e <= 31`` (spec
    §2.3)::

        mask = 2**e - 1;  (x >> e) + ((x & mask) > (mask >> 1) + (x < 0))

    (ties away from zero). ``e`` a Python int or an int32 array; jittable; no checks."""
    x, e = jnp.asarray(x, _I32), jnp.asarray(e, _I32)
    mask = (jnp.int32(1) << e) - 1  # e = 31: wraps to 2**31 - 1
    threshold = (mask >> 1) + (x < 0).astype(_I32)
    return (x >> e) + ((x & mask) > threshold).astype(_I32)


def rdbpot32_unwrapped(x, e, *, e_positive: bool = False) -> jax.Array:
    """:func:`rdbpot32` for int32 ``x`` with ``x + 2**(e-1)`` within int32 (``0 <= e <=
    31``)::

        floor((x + 2**(e-1) - [x < 0 and e > 0]) / 2**e)

    the same value: with ``x = q 2**e + r`` (``0 <= r < 2**e``) both are ``q + [r >=
    2**(e-1) + [x < 0]]`` (ties away from zero); at ``e = 0`` both are ``x``. Five int32
    operations against eight (the per-channel ``half`` and mask fold away); four with
    ``e_positive`` (static: the caller knows every ``e >= 1``, so the ``e = 0`` case needs
    no mask). Jittable; no checks (the caller proves the range)."""
    x, e = jnp.asarray(x, _I32), jnp.asarray(e, _I32)
    if e_positive:
        return (x + (jnp.int32(1) << (e - 1)) + (x >> 31)) >> e
    rounds = -(e > 0).astype(_I32)  # all ones where e > 0
    half = (jnp.int32(1) << jnp.maximum(e - 1, 0)) & rounds
    return (x + half + ((x >> 31) & rounds)) >> e  # x >> 31: -1 where x < 0


def shift_half_up32(x, e):
    """``floor(x / 2**e + 1/2)`` for int32 ``x`` and ``e >= 0`` (any size), without overflow:
    the floor quotient plus bit ``e - 1`` (a sign bit when ``e > 32``). Ties toward +inf:
    ruy's and NEON ``VRSHL``'s rounding shift."""
    x, e = jnp.asarray(x, _I32), jnp.asarray(e, _I32)
    q = x >> jnp.minimum(e, 31)
    rb = (x >> jnp.clip(e - 1, 0, 31)) & (e > 0).astype(_I32)
    return q + rb


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["center", "high", "low"],
    meta_fields=["bits", "shifts_left", "shifts_right", "in_product_loop"],
)
@dataclasses.dataclass(frozen=True)
class AccBound:
    """An entry of R1 / R3 parameters (key ``"acc_bound"``, made by :func:`with_acc_bound`):
    a promise, proven on the host from a layer's weights, bias and input zero point and not
    checked per element, that every accumulator ``acc`` of output channel ``c`` satisfies

    * ``|acc - center[c]| * 2**ls <= 2**bits - 1`` with ``ls = max(shift[c], 0)``,
    * ``acc * 2**ls`` fits int32 (the left shift does not wrap), and
    * ``multiplier[c] >= 0``;
    * the SRDHM ``h`` plus ``2**(e-1)`` fits int32, ``e = max(-shift[c], 0)`` (R1's
      rounding shift then takes :func:`rdbpot32_unwrapped`);

    with ``high``, ``low`` the floor quotient and remainder of ``center * 2**ls * m +
    2**30`` by ``2**31``. The SRDHM of R1 / R3 is then ``high + srdhm_bounded((acc -
    center) * 2**ls, m, low, bits)``: the same value in fewer operations (on CPU and GPU,
    from :data:`WIDE_PIECES` pieces on, the SRDHM of ``acc * 2**ls`` as one 64-bit product).
    Where ``shifts_right`` (every channel's ``e >= 1``), R1's rounding shift needs no
    per-channel case for ``e = 0`` and its result is within ``2**30`` in magnitude, so the
    zero point is added without a clamp. ``in_product_loop``: the requantisation shares its
    loop with the layer's products (a depthwise convolution), where 64-bit lanes would halve
    that loop's vector width: the 64-bit form then takes over from
    :data:`WIDE_PIECES_IN_PRODUCT_LOOP` pieces on instead of :data:`WIDE_PIECES`. ``bits``,
    ``shifts_left`` (whether any ``ls > 0``), ``shifts_right`` and ``in_product_loop`` are
    static (the program's form); the three arrays (int32, one per channel) are leaves."""

    center: Any
    high: Any
    low: Any
    bits: int
    shifts_left: bool = True
    shifts_right: bool = False
    in_product_loop: bool = False


#: the widest centred accumulator bound for which :func:`srdhm_bounded` is used (five
#: partial products; a wider bound keeps :func:`srdhm32`)
BOUNDED_MAX_BITS = 23


def srdhm_bounded(d, b, low, bits: int) -> jax.Array:
    """``floor((d*b + low) / 2**31)`` for int32 ``|d| <= 2**bits - 1``, ``0 <= b < 2**31``
    and ``0 <= low < 2**31`` (``bits <= 29``, static): with ``low = 2**30`` it is
    :func:`srdhm32`'s value, and ``high + srdhm_bounded(d, m, low, bits)`` is the SRDHM of an
    accumulator ``center + d`` under an :class:`AccBound`.

    ``n = ceil(31 / p)`` pieces of ``p = 30 - bits`` bits, ``b = SUM_k b_k 2**(k p)`` and
    ``low = SUM_k l_k 2**(k p)`` (``0 <= b_k, l_k < 2**p``; the top pieces below
    ``2**(31 - (n-1) p)``), lowest first::

        c_0 = floor((d b_0 + l_0) / 2**p),   c_k = floor((d b_k + l_k + c_{k-1}) / 2**p)
        result = floor((d b_{n-1} + l_{n-1} + c_{n-2}) / 2**(31 - (n-1) p))

    Exact: ``floor((X 2**p + Y) / 2**q) = floor((X + floor(Y / 2**p)) / 2**(q-p))`` for
    integers, applied from the lowest piece up. No int32 wraps: ``|d b_k| <= (2**bits - 1)
    (2**p - 1)``, ``l_k < 2**p`` and ``|c_k| <= 2**bits + 1``, so every sum stays below
    ``2**30 + 2**bits + 2**p`` in magnitude. ``3n`` int32 operations against about 18 for
    :func:`srdhm32` (2M R1 requantisations of 19-bit accumulators: 0.88-0.95 against
    1.06-1.39 ms, one AMD EPYC core). Where the pieces would be :data:`WIDE_PIECES` or
    more, CPU and GPU programs take one 64-bit product instead (the same value; exact for
    every int32 operand). Jittable; concrete arguments are range-checked, traced ones are
    not (the caller proves their bounds)."""
    bits = V.check_static_int(bits, 1, 29, "bits")
    d = check_int_array(d, "d", -(2**bits - 1), 2**bits - 1)
    b = check_int_array(b, "b", 0, INT32_MAX)
    low = check_int_array(low, "low", 0, INT32_MAX)
    return _srdhm_bounded_jit(d, b, low, bits)


def _srdhm_bounded(d, b, low, bits: int) -> jax.Array:
    """:func:`srdhm_bounded` without its checks (the form traced into a kernel): the int32
    pieces, or, where they would be :data:`WIDE_PIECES` or more and the platform has 64-bit
    integer vectors (CPU, GPU), one 64-bit product (:func:`_floor_mul_add_wide`). The same
    value either way."""
    d, b, low = (jnp.asarray(v, _I32) for v in (d, b, low))
    pieces = functools.partial(_srdhm_pieces, bits=bits)
    return _on_wide_platforms(_floor_mul_add_wide if _pieces(bits) >= WIDE_PIECES else pieces, pieces, d, b, low)


def _pieces(bits: int) -> int:
    """The number of int32 partial products of :func:`srdhm_bounded` at width ``bits``."""
    return -(-31 // (30 - bits))


#: from this many int32 pieces on, :func:`srdhm_bounded` and R1 / R3 under an
#: :class:`AccBound` take one 64-bit product on CPU and GPU. Measured in the KWS model on
#: one AMD EPYC Zen 4 core (batch 256, per layer): its 20-bit pointwise layers (four pieces)
#: requantised in 1.21-1.26 ms against 1.40-1.43, and its 19-bit first layer's
#: requantisation (three pieces) took 0.45-0.46 ms against 0.53-0.55.
WIDE_PIECES = 3

#: :data:`WIDE_PIECES` where the requantisation shares its loop with a depthwise layer's
#: products (:attr:`AccBound.in_product_loop`): KWS's 18-bit depthwise layers (three
#: pieces) took 1.47-1.52 ms with the 64-bit form against 1.24-1.32 with the pieces (64-bit
#: lanes halve the vector width of the loop that also forms the products).
WIDE_PIECES_IN_PRODUCT_LOOP = 4


def _srdhm_pieces(d, b, low, bits: int) -> jax.Array:
    """:func:`srdhm_bounded` in int32 pieces (the derivation in its docstring)."""
    p = 30 - bits
    n = _pieces(bits)
    mask = (1 << p) - 1
    c = None
    for k in range(n):
        last = k == n - 1
        bk = b >> (k * p) if last else (b >> (k * p)) & mask
        lk = low >> (k * p) if last else (low >> (k * p)) & mask
        t = d * bk + lk
        t = t if c is None else t + c
        c = t >> (31 - k * p if last else p)
    return c


def _floor_mul_add_wide(d, b, low):
    """``floor((d*b + low) / 2**31)`` of int32 ``d``, ``b``, ``low`` (shapes equal or
    broadcastable) through one int64 product in the program, whatever
    ``jax_enable_x64`` says (a primitive lowered to 64-bit HLO). Exact for every int32
    operand: ``|d*b + low| <= 2**62 + 2**31 < 2**63``; with ``0 <= b, low < 2**31`` (the
    callers' multipliers and remainders) the quotient lies in ``[-2**31 + 1, 2**31 - 1]``
    and fits int32 for every int32 ``d``. Returns int32."""
    shape = jnp.broadcast_shapes(jnp.shape(d), jnp.shape(b), jnp.shape(low))
    return _fma_wide_p.bind(*(jnp.broadcast_to(jnp.asarray(v, _I32), shape) for v in (d, b, low)))


def _splat(t, attr):
    return hlo.constant(ir.DenseElementsAttr.get_splat(t, attr))


def _fma_wide_lowering(ctx, d, b, low):
    shape = ctx.avals_in[0].shape
    i64 = ir.IntegerType.get_signless(64)
    t64 = ir.RankedTensorType.get(shape, i64)
    p = hlo.add(hlo.multiply(hlo.convert(t64, d), hlo.convert(t64, b)), hlo.convert(t64, low))
    q = hlo.shift_right_arithmetic(p, _splat(t64, ir.IntegerAttr.get(i64, 31)))
    return [hlo.convert(mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0]), q)]


def _elementwise_batch(prim):
    """vmap of an element-wise primitive whose operands share one shape: every operand with
    the mapped axis first."""

    def rule(args, axes):
        size = next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)
        moved = [
            jnp.moveaxis(a, ax, 0) if ax is not None else jnp.broadcast_to(a, (size, *a.shape))
            for a, ax in zip(args, axes)
        ]
        return prim.bind(*moved), 0

    return rule


_fma_wide_p = Primitive("hwjax_litert_floor_mul_add_int64")
_fma_wide_p.def_impl(lambda d, b, low: jax.jit(_fma_wide_p.bind)(d, b, low))
_fma_wide_p.def_abstract_eval(lambda d, b, low: jax.core.ShapedArray(d.shape, jnp.int32))
mlir.register_lowering(_fma_wide_p, _fma_wide_lowering)
batching.primitive_batchers[_fma_wide_p] = _elementwise_batch(_fma_wide_p)


_srdhm_bounded_jit = eager_program(_srdhm_bounded, static_argnames=("bits",))


def with_acc_bound(params: Mapping, acc_min, acc_max, *, in_product_loop: bool = False) -> dict:
    """``params`` of R1 / R3 (``"double"``, ``"ruy"``, ``"lanes8"``: concrete
    ``multiplier`` and ``shift``) with an :class:`AccBound` entry where one applies.

    ``acc_min``, ``acc_max``: per channel (or one for all), proven bounds of the
    accumulators (:func:`hwjax.litert.accumulator_range`). The entry is added when every
    multiplier is non-negative, no ``acc * 2**max(shift, 0)`` leaves int32, and the
    distance from the middle of each channel's range, shifted, fits
    :data:`BOUNDED_MAX_BITS` bits; otherwise ``params`` is returned unchanged (the general
    form). Host function (NumPy, exact Python integers); the result is only as true as the
    bounds. Each of ``params``' arrays, ``acc_min`` and ``acc_max`` holds one value or one
    per channel (ShapeError otherwise); where any is traced, ``params`` is returned
    unchanged (the bound is a static property of the program). ``in_product_loop``: see
    :class:`AccBound` (the form only, never a value)."""
    check_params(params, "params", ("multiplier", "shift"))
    in_product_loop = V.check_flag(in_product_loop, "in_product_loop")
    named = {"params['multiplier']": params["multiplier"], "params['shift']": params["shift"]}
    named.update(acc_min=acc_min, acc_max=acc_max)
    if any(_traced(v) for v in named.values()):
        for name, v in named.items():
            check_ints(v, name)
        return dict(params)
    check_ints(params["multiplier"], "params['multiplier']")
    check_ints(params["shift"], "params['shift']", -31, 31)
    check_ints(acc_min, "acc_min", -(2**62), 2**62)
    check_ints(acc_max, "acc_max", -(2**62), 2**62)
    arrays = [np.asarray(v, np.int64).reshape(-1) for v in named.values()]
    sizes = {a.size for a in arrays} - {1}
    if len(sizes) > 1:
        raise ShapeError(f"params, acc_min and acc_max must hold 1 or one common number of channels, got {sizes}")
    m, s, lo, hi = np.broadcast_arrays(*arrays)
    if np.any(m < 0) or np.any(lo > hi):
        return dict(params)
    center, high, low, widest = [], [], [], 0
    for mc, sc, lc, hc in zip(m.tolist(), s.tolist(), lo.tolist(), hi.tolist()):
        ls, e = max(sc, 0), max(-sc, 0)
        if max(abs(lc), abs(hc)) << ls > 2**31 - 1:
            return dict(params)
        if e and ((hc << ls) * mc + 2**30 >> 31) + (1 << (e - 1)) > 2**31 - 1:
            return dict(params)  # the SRDHM is non-decreasing in acc (m >= 0): hc gives its top
        c = (lc + hc) // 2
        widest = max(widest, max(hc - c, c - lc) << ls)
        k = (c << ls) * mc + 2**30
        center.append(c)
        high.append(k >> 31)
        low.append(k & (2**31 - 1))
    bits = max(1, widest.bit_length())
    if bits > BOUNDED_MAX_BITS:
        return dict(params)
    arrays = (np.asarray(v, np.int64).astype(np.int32) for v in (center, high, low))
    bound = AccBound(
        *arrays,
        bits=bits,
        shifts_left=bool(np.any(s > 0)),
        shifts_right=bool(np.all(s < 0)),
        in_product_loop=in_product_loop,
    )
    return {**params, "acc_bound": bound}


def _high_mul(x, m, s, bound: AccBound | None = None):
    """The SRDHM of ``x`` shifted left by ``max(s, 0)`` (wrapping) with ``m``, and the right
    shift ``max(-s, 0)`` still to apply: the first step of R1 and R3 (through
    :func:`srdhm_bounded` under an :class:`AccBound`)."""
    ls = jnp.clip(s, 0, 31)
    if bound is None:
        return srdhm32(x << ls, m), jnp.maximum(-s, 0)
    center, high, low = (jnp.asarray(v, _I32) for v in (bound.center, bound.high, bound.low))

    def centred(x, m, center, high, low):
        d = x - center
        return high + _srdhm_pieces(d << ls if bound.shifts_left else d, m, low, bound.bits)

    def direct(x, m, center, high, low):
        # SRDHM(x << ls, m) = floor(((x << ls) m + 2**30) / 2**31): one exact int64 product
        # (m >= 0, so not the saturating pair; the shift does not wrap, by the promise)
        return _floor_mul_add_wide(x << ls if bound.shifts_left else x, m, jnp.int32(1 << 30))

    wide_ok = _pieces(bound.bits) >= (WIDE_PIECES_IN_PRODUCT_LOOP if bound.in_product_loop else WIDE_PIECES)
    return _on_wide_platforms(direct if wide_ok else centred, centred, x, m, center, high, low), jnp.maximum(-s, 0)


def _on_wide_platforms(wide_form, int32_form, *args):
    """``wide_form(*args)`` in programs for CPU and GPU (64-bit integer vectors), else
    ``int32_form(*args)``; the two give the same values."""
    if wide_form is int32_form:
        return int32_form(*args)
    return jax.lax.platform_dependent(*args, cpu=wide_form, cuda=wide_form, rocm=wide_form, default=int32_form)


def _mbqm_double(x, m, s, bound: AccBound | None = None):
    if bound is None:
        return rdbpot32(*_high_mul(x, m, s))
    return rdbpot32_unwrapped(*_high_mul(x, m, s, bound), e_positive=bound.shifts_right)


def _mbqm_single(x, m, s):
    p = wide.mul_int32(x, m)
    q = wide.shift_right(p, 31 - s, "half_up")
    return jax.lax.bitcast_convert_type(q.lo, _I32)


def _ruy(x, m, s, bound: AccBound | None = None):
    """R3: SRDHM of the wrapped left shift, then a right shift rounding ties toward +inf
    (the exact quotient, which is what ruy's overflow guard returns at the top)."""
    return shift_half_up32(*_high_mul(x, m, s, bound))


def _float64_bits(eff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(eff, np.float64).view(np.uint64)
    return (u >> np.uint64(32)).astype(np.uint32), (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _r2(acc, hi, lo):
    """R2, ``round_half_away(fl64(acc * eff))`` as int32, -2**31 where it leaves int32:
    float64 arithmetic in the program on CPU and GPU (:func:`_r2_float64`), the 32-bit
    integer emulation (:func:`_r2_int32`) on other platforms. The same values (each form
    broadcasts ``hi``, ``lo`` to ``acc``'s shape itself)."""
    return jax.lax.platform_dependent(
        jnp.asarray(acc, _I32),
        jnp.asarray(hi, jnp.uint32),
        jnp.asarray(lo, jnp.uint32),
        cpu=_r2_float64,
        cuda=_r2_float64,
        rocm=_r2_float64,
        default=_r2_int32,
    )


def _r2_float64(acc, hi, lo):
    """R2 as float64 HLO, whatever ``jax_enable_x64`` says: a primitive whose lowering
    converts to float64 inside the program (JAX without x64 has no float64 arrays).

    Exact: ``acc`` (int32) is exact in float64; the one multiply by ``eff`` (its bits
    ``hi``, ``lo``) is IEEE's correctly rounded product, as LiteRT's C++ ``double``
    multiply on x86-64 (SSE2); ``round_nearest_afz`` is C's ``round``; the conversion
    gives -2**31 outside (-2**31, 2**31), as x86's ``cvttsd2si`` (at -2**31 itself both
    give -2**31). No addition follows the multiply, so XLA has nothing to contract into a
    fused multiply-add. Where XLA flushes subnormals to zero the value is 0 either way:
    ``|acc eff| < 2**31 2**-1022`` rounds to 0. Measured on one AMD EPYC core: ad01 on
    ``"reference"`` (fully connected layers only) 171-180k -> 290-343k images/s at batch
    256 against the integer emulation, the same outputs."""
    acc = jnp.asarray(acc, _I32)
    return _r2_p.bind(acc, *(jnp.broadcast_to(jnp.asarray(v, jnp.uint32), acc.shape) for v in (hi, lo)))


def _r2_lowering(ctx, acc, hi, lo):
    shape = ctx.avals_in[0].shape
    f64, u64, i32 = ir.F64Type.get(), ir.IntegerType.get_unsigned(64), ir.IntegerType.get_signless(32)
    tf, tu = ir.RankedTensorType.get(shape, f64), ir.RankedTensorType.get(shape, u64)
    ti = mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0])
    high = hlo.shift_left(hlo.convert(tu, hi), _splat(tu, ir.IntegerAttr.get(u64, 32)))
    eff = hlo.bitcast_convert(tf, hlo.or_(high, hlo.convert(tu, lo)))
    r = hlo.round_nearest_afz(hlo.multiply(hlo.convert(tf, acc), eff))
    lo_b, hi_b = (_splat(tf, ir.FloatAttr.get(f64, v)) for v in (-(2.0**31), 2.0**31))
    direction = lambda d: hlo.ComparisonDirectionAttr.get(d)
    kind = hlo.ComparisonTypeAttr.get("FLOAT")
    inside = hlo.and_(
        hlo.compare(r, lo_b, direction("GT"), compare_type=kind),
        hlo.compare(r, hi_b, direction("LT"), compare_type=kind),
    )
    v = hlo.convert(ti, hlo.clamp(lo_b, r, _splat(tf, ir.FloatAttr.get(f64, 2.0**31 - 1))))
    return [hlo.select(inside, v, _splat(ti, ir.IntegerAttr.get(i32, INT32_MIN)))]


_r2_p = Primitive("hwjax_litert_r2_float64")
_r2_p.def_impl(lambda acc, hi, lo: jax.jit(_r2_p.bind)(acc, hi, lo))
_r2_p.def_abstract_eval(lambda acc, hi, lo: jax.core.ShapedArray(acc.shape, jnp.int32))
mlir.register_lowering(_r2_p, _r2_lowering)
batching.primitive_batchers[_r2_p] = _elementwise_batch(_r2_p)


def _r2_int32(acc, hi, lo):
    """R2, ``round_half_away(fl64(acc * eff))`` (LiteRT's double multiply) as int32, -2**31
    where it leaves int32 (x86's conversion),
    exactly in 32-bit integer arithmetic on the device, with no host callback. ``eff`` is
    given by the two words ``hi``, ``lo`` of its float64 bits (finite, >= 0).

    With ``|acc| = a`` and ``eff = E 2**-q`` (``E`` the 53-bit significand), the product
    ``P = a E < 2**84`` is held as a 53-bit top part ``H`` and a low word ``L``; ``fl64``
    keeps its 53 leading bits (ties to even), ``R = rint(P / 2**n)``, and the result is
    ``R 2**(n - q)`` rounded half away from zero (both roundings are symmetric, so the
    sign is applied last)."""
    acc = acc.astype(_I32)
    hi, lo = (
        jnp.broadcast_to(jnp.asarray(hi, jnp.uint32), acc.shape),
        jnp.broadcast_to(jnp.asarray(lo, jnp.uint32), acc.shape),
    )
    u32 = jnp.uint32
    neg = acc < 0
    bits = jax.lax.bitcast_convert_type(acc, u32)
    a = jnp.where(neg, u32(0) - bits, bits)  # |acc|, 2**31 included
    ef = ((hi >> 20) & u32(0x7FF)).astype(_I32)
    e_hi = (hi & u32(0xFFFFF)) | u32(0x100000)
    p_lo = wide.mul_uint32(a, lo)
    top = wide.add(wide.mul_uint32(a, e_hi), wide.from_uint32(jax.lax.bitcast_convert_type(p_lo.hi, u32)))
    low = p_lo.lo  # P = top 2**32 + low
    nbits = jnp.where((top.hi != 0) | (top.lo != 0), 32 + wide.bit_length(top), 32 - jax.lax.clz(low).astype(_I32))
    n = jnp.clip(nbits - 53, 0, 31)  # low bits fl64 drops
    r = wide.add(wide.shift_left(top, 32 - n), wide.from_uint32(low >> n.astype(u32)))
    nm1 = jnp.maximum(n - 1, 0).astype(u32)
    rb = ((low >> nm1) & u32(1)) == 1
    sticky = (low & ((u32(1) << nm1) - u32(1))) != 0
    inc = (n >= 1) & rb & (sticky | ((r.lo & u32(1)) == 1))
    r = wide.add(r, wide.from_uint32(inc.astype(u32)))
    s = 1075 - ef - n  # the value is r * 2**-s
    right = wide.shift_right(r, jnp.clip(s, 0, 63), "half_up")
    left = wide.shift_left(r, jnp.clip(-s, 0, 32))
    over_left = (s < 0) & (r.lo | jax.lax.bitcast_convert_type(r.hi, u32) != 0) & (wide.bit_length(r) - s > 32)
    mag = wide.where(s >= 0, right, left)
    big = over_left | wide.lt(wide.const(2**31 - 1), mag)
    m32 = jax.lax.bitcast_convert_type(mag.lo, _I32)
    # beyond int32 both signs give -2**31: C's static_cast<int32_t> of the double on x86
    # (cvttsd2si's "integer indefinite")
    out = jnp.where(big, INT32_MIN, jnp.where(neg, -m32, m32))
    return jnp.where(ef == 0, 0, out)  # eff zero (or denormal: |acc| eff < 2**-990)


def activation_range(activation, output_scale, output_zero_point, *, qmin: int = -128, qmax: int = 127):
    """``CalculateActivationRangeQuantized`` (spec §2.7): ``(act_min, act_max)`` with
    ``Q(f) = zp + round_half_away(fl32(f / s_out))``. Host arithmetic; Python ints."""
    if not any(activation is a or (isinstance(activation, str) and activation == a) for a in ACTIVATIONS):
        raise RangeError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    qmin = V.check_static_int(qmin, INT32_MIN, INT32_MAX, "qmin")
    qmax = V.check_static_int(qmax, INT32_MIN, INT32_MAX, "qmax")
    if qmin > qmax:
        raise RangeError(f"qmin={qmin} must not exceed qmax={qmax}")
    check_scale(output_scale, "output_scale")
    check_zero_point(output_zero_point, "output_zero_point", min(qmin, -128), max(qmax, 255))
    s = np.float32(np.asarray(output_scale, np.float32).reshape(()))
    zp = int(np.asarray(output_zero_point).reshape(()))

    def q(f):
        return zp + int(_round_half_away(np.float64(np.float32(f) / s)))

    if activation is None:
        return qmin, qmax
    if activation == "relu":
        return max(qmin, q(0.0)), qmax
    if activation == "relu6":
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    return max(qmin, q(-1.0)), min(qmax, q(1.0))


def requant_params(
    input_scale,
    filter_scales,
    output_scale,
    requant: str,
    *,
    float32_product: bool = False,
    channels: int | None = None,
) -> dict[str, np.ndarray]:
    """Host recipe of one requantising op (spec §2.6, §2.9): per output channel,

    * ``"double"`` / ``"ruy"`` / ``"lanes8"`` / ``"single"``: ``(multiplier, shift)`` =
      ``quantize_multiplier(eff)`` with ``eff = (double(s_in) * double(s_w)) / double(s_out)``,
      or ``double(fl32(s_in * s_w)) / double(s_out)`` when ``float32_product`` (TFLite's
      per-tensor fully connected);
    * ``"float64"``: the float64 ``eff`` (double product) as two uint32 words;
    * ``"xnnpack"``: ``scale = fl32(fl32(s_in * s_w) / s_out)``.

    ``channels`` broadcasts a per-tensor scale to that many channels.
    """
    V.check_choice(requant, tuple(REQUANT), "requant")
    V.check_flag(float32_product, "float32_product")
    if channels is not None:
        V.check_static_int(channels, 1, INT32_MAX, "channels")
    check_scale(input_scale, "input_scale")
    check_scale(output_scale, "output_scale")
    check_scales(filter_scales, "filter_scales")
    s_in = np.float32(np.asarray(input_scale, np.float32).reshape(()))
    s_out = np.float32(np.asarray(output_scale, np.float32).reshape(()))
    s_w = np.asarray(filter_scales, np.float32).reshape(-1)
    if channels is not None and s_w.size == 1:
        s_w = np.broadcast_to(s_w, (channels,))
    for v, what in ((s_in, "input_scale"), (s_out, "output_scale")):
        if not (np.isfinite(v) and v > 0):
            raise RangeError(f"{what} must be a positive finite float32, got {v}")
    if not np.all(np.isfinite(s_w) & (s_w > 0)):
        raise RangeError(f"filter_scales must be positive finite float32, got {s_w}")
    if requant == "xnnpack":
        return {"scale": ((s_in * s_w).astype(np.float32) / s_out).astype(np.float32)}
    if requant in ("double", "ruy", "lanes8", "single") and float32_product:
        eff = (s_in * s_w).astype(np.float32).astype(np.float64) / np.float64(s_out)
    else:
        eff = (np.float64(s_in) * s_w.astype(np.float64)) / np.float64(s_out)
    if requant == "float64":
        hi, lo = _float64_bits(eff)
        return {"eff_hi": hi, "eff_lo": lo}
    m, e = quantize_multiplier(eff, single_rounding=requant == "single")
    return {"multiplier": np.asarray(m, np.int32), "shift": np.asarray(e, np.int32)}


def requantize(acc, params: dict[str, Any], requant: str, *, output_zero_point, act_min, act_max) -> jax.Array:
    """``clamp(v(acc) + output_zero_point, act_min, act_max)`` with ``v`` the convention
    ``requant`` (params from :func:`requant_params`, broadcast along the last axis of
    ``acc``). Jittable; returns int32. Concrete arguments are checked (``acc`` and the
    parameters int32 integers, ``act_min <= act_max``); traced ones are not. R1 / R3
    parameters may carry an :class:`AccBound` (:func:`with_acc_bound`): the same values
    where its promise holds, in fewer operations."""
    check_requant_params(params, requant, "params")
    acc = check_int_array(acc, "acc", INT32_MIN, INT32_MAX)
    check_ints(output_zero_point, "output_zero_point")
    check_ints(act_min, "act_min")
    check_ints(act_max, "act_max")
    if not (_traced(act_min) or _traced(act_max)) and np.any(np.asarray(act_min) > np.asarray(act_max)):
        raise RangeError(f"act_min={np.asarray(act_min)} must not exceed act_max={np.asarray(act_max)}")
    used = params_used(params, REQUANT_KEYS[requant])  # requant and its keys checked above
    if "acc_bound" in params:  # its arrays are arguments, its width the program's form
        used["acc_bound"] = params["acc_bound"]
    return _requantize(acc, used, output_zero_point, act_min, act_max, requant)


@functools.partial(jax.jit, static_argnums=5)
def _requantize(acc, params, output_zero_point, act_min, act_max, requant: str) -> jax.Array:
    """:func:`requantize` after its checks, as one program."""
    acc = jnp.asarray(acc, _I32)
    bound = params.get("acc_bound")
    if requant == "double":
        v = _mbqm_double(acc, jnp.asarray(params["multiplier"], _I32), jnp.asarray(params["shift"], _I32), bound)
    elif requant == "single":
        v = _mbqm_single(acc, jnp.asarray(params["multiplier"], _I32), jnp.asarray(params["shift"], _I32))
    elif requant == "ruy":
        v = _ruy(acc, jnp.asarray(params["multiplier"], _I32), jnp.asarray(params["shift"], _I32), bound)
    elif requant == "lanes8":
        # LiteRT's optimized per-channel depthwise output stage (x86, NEON_2_SSE): for each
        # output pixel the channels run in whole groups of 8 through the vector
        # MultiplyByQuantizedMultiplier4Rows (vqrdmulh + vrshl: R3, ties toward +inf), the
        # remaining channels through the scalar MBQM (R1, ties away from zero). The two
        # differ only on negative ties, by one, and share their first step (the SRDHM).
        m, e = jnp.asarray(params["multiplier"], _I32), jnp.asarray(params["shift"], _I32)
        high, rs = _high_mul(acc, m, e, bound)
        c = acc.shape[-1]
        whole = c - c % LANES8  # static: a layer whose channels are all in groups takes one form
        if whole == c:
            v = shift_half_up32(high, rs)
        elif whole == 0:
            v = rdbpot32(high, rs)
        else:
            v = jnp.where(np.arange(c) < whole, shift_half_up32(high, rs), rdbpot32(high, rs))
    elif requant == "float64":
        v = _r2(acc, jnp.asarray(params["eff_hi"], jnp.uint32), jnp.asarray(params["eff_lo"], jnp.uint32))
    elif requant == "xnnpack":
        f = acc.astype(jnp.float32) * jnp.asarray(params["scale"], jnp.float32)
        # XNNPACK clamps above before converting (the output range less the zero point, far
        # below 2**31 - 128 here, where the clamp to the int8 range follows); below, x86's
        # cvtps2dq gives -2**31 for what leaves int32
        hi = jnp.float32(2.0**31 - 128)
        v = jnp.round(jnp.minimum(f, hi)).astype(_I32)  # jnp.round: ties to even (rint)
        v = jnp.where(f < jnp.float32(-(2.0**31)), INT32_MIN, v)
    else:
        raise RangeError(f"requant must be one of {tuple(REQUANT)}, got {requant!r}")
    zp = jnp.asarray(output_zero_point, _I32)
    if requant in ("float64", "xnnpack"):
        # x86: a value that left int32 is -2**31, and the zero point is added in wrapping
        # int32 arithmetic (LiteRT's reference FULLY_CONNECTED, XNNPACK's AVX-512 kernels):
        # with a negative zero point it wraps to the top of the range
        v = v + zp
    elif bound is not None and bound.shifts_right:
        v = v + zp  # |v| <= 2**30 (a right shift of an int32 by at least one): no wrap
    else:
        # v + zp may exceed int32 only far outside the int8 range: clamp v first (exact).
        v = jnp.clip(v, -(2**30), 2**30) + zp
    return jnp.clip(v, jnp.asarray(act_min, _I32), jnp.asarray(act_max, _I32))
