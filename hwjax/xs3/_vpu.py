"""XS3 VPU instructions, lane-wise and bit-exact (spec ``xs3.md`` §1–§2).

Every instruction here is a pure function of its operands. Lane-wise instructions
accept integer arrays of any (broadcastable) shape: one array element is one lane.
Ring and reduction instructions (``vlmaccr``, ``vdepth1``, the ``host`` 8-bit
``vpos``) work on the last axis, which must hold the lanes of one vector.

Values are passed as their signed lane values (int8/int16/int32 numbers held in any
integer dtype of at most 32 bits; uint32 is also accepted where a 32-bit pattern is
read unsigned). Results are int32 arrays holding the lane values, independent of
``jax_enable_x64``. 40-bit (32-bit mode) accumulators are
:class:`hwjax.core.wide.Wide` values (``hi * 2**32 + lo``); an ``(hi, lo)`` pair is
accepted too.

Variants (§0): ``"hardware"`` (the chip; default), ``"host"`` (lib_nn 0.4/0.5 model,
xmos-ai-tools 1.4.2 host interpreter), ``"v2021"`` (lib_nn 96bd67c5 model). Each
instruction's variant quirks are written once, in that instruction's function.

Values are checked against the lane range of the mode when they are concrete (not
traced); under ``jit`` the ranges are the caller's contract. Static arguments
(``mode``, ``variant``) are checked at trace time. After its checks, every instruction
runs as one ``jax.jit``-compiled program (static: ``mode``, ``variant`` and the other
keyword options), so an eager call compiles once per shapes and options, not once per
``jax.numpy`` operation; inside ``jit``, ``vmap`` or ``grad`` the program is inlined.

Float inputs (differentiable). The data operands of ``vlsat``, ``vlashr``, ``vlmul``,
``vladd``, ``vlsub``, ``vdepth8``, ``vdepth16`` and of ``vlmacc``/``vlmaccr`` in 8/16-bit
mode may be float arrays holding integer lane values. The result is then the integer
result in that float dtype, bit-identical to the integer path (float32 holds every
integer up to 2**24 exactly; wider accumulator values need float64), and
differentiable under a surrogate gradient stated in each docstring
(:mod:`hwjax.core._surrogate`): straight-through rounding, the exact derivative of
the linear part, and 0 where the lane clipped (``saturation_grad="zero"``, the
default) or 1 there (``"pass"``). Shift operands are integer arrays and take no
gradient; a float shift raises TypeError.
"""

from __future__ import annotations

import functools
import warnings
from typing import Literal, Union

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import eager_program, fixed_mul, saturate, shift_right
from hwjax.core import wide as W
from hwjax.core import surrogate as S
from hwjax.core import SaturationGrad
from hwjax.errors import ArgTypeError, RangeError, ShapeError

Variant = Literal["hardware", "host", "v2021"]
Mode = Literal[8, 16, 32]
AccLike = Union[jax.Array, np.ndarray, W.Wide, tuple]

VARIANTS: tuple[str, ...] = ("hardware", "host", "v2021")
MODES: tuple[int, ...] = (8, 16, 32)

_I32 = jnp.int32
_U32 = jnp.uint32
ACC40_MAX = 2**39 - 1  # 32-bit-mode accumulator bound (sat40)
_VLMUL_FRAC = {8: 6, 16: 14, 32: 30}
_EPV = {8: 32, 16: 16, 32: 8}  # elements per vector
_RING = {8: 16, 16: 16, 32: 8}  # accumulators per ring


# ----------------------------------------------------------------------- validation


def _check_mode(mode, allowed: tuple[int, ...] = MODES) -> int:
    if isinstance(mode, bool) or not isinstance(mode, (int, np.integer)) or int(mode) not in allowed:
        raise RangeError(f"mode must be one of {allowed}, got {mode!r}")
    return int(mode)


def _check_variant(variant) -> str:
    return V.check_choice(variant, VARIANTS, "variant")


def _lane_range(bits: int) -> tuple[int, int]:
    """Two's-complement range of a ``bits``-wide lane."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _int_operand(x, name: str, lo: int, hi: int, *, float_ok: bool = False) -> jax.Array:
    """Integer operand as int32, value range checked when concrete. With ``float_ok`` a
    float array holding integer values in range is returned unchanged (differentiable)."""
    return S.operand(x, name, lo, hi, differentiable=float_ok, what=" (lane values)")


def _lanes(x, name: str, bits: int, *, float_ok: bool = False) -> jax.Array:
    """A vector operand of ``bits``-wide signed lanes, as int32 (or float, see above)."""
    return _int_operand(x, name, *_lane_range(bits), float_ok=float_ok)


def _checked(x, name: str, lo: int, hi: int, *, float_ok: bool = False, what: str = " (lane values)") -> jax.Array:
    """The checks of :func:`hwjax.core.surrogate.operand` without its int32 conversion: the
    operand in its own dtype, converted inside the jitted program (converting here would
    compile one program per dtype conversion)."""
    return S.operand(x, name, lo, hi, differentiable=float_ok, what=what, to_int32=False)


def _checked_lanes(x, name: str, bits: int, *, float_ok: bool = False) -> jax.Array:
    """The checks of :func:`_lanes`, without the conversion (see :func:`_checked`)."""
    return _checked(x, name, *_lane_range(bits), float_ok=float_ok)


def _checked_u32(x, name: str) -> jax.Array:
    """The checks of :func:`_bits_u32`, without the conversion (see :func:`_checked`)."""
    a = V.as_array(x, name)
    if np.dtype(a.dtype) == np.uint32:
        return a
    return _checked(a, name, -(2**31), 2**31 - 1)


def _checked_acc40(acc: AccLike, name: str = "acc"):
    """The checks of :func:`as_acc40`, without the conversion: a Wide, ``(hi, lo)`` pair
    or array of JAX arrays, which :func:`as_acc40` converts inside the jitted program."""
    if isinstance(acc, W.Wide):
        return W.Wide(V.as_array(acc.hi, f"{name}.hi"), V.as_array(acc.lo, f"{name}.lo"))
    if isinstance(acc, tuple):
        if len(acc) != 2:
            raise ShapeError(f"{name} must be a Wide or an (hi, lo) pair, got a tuple of {len(acc)}")
        return (_checked(acc[0], f"{name}.hi", -(2**31), 2**31 - 1), _checked_u32(acc[1], f"{name}.lo"))
    return _checked(acc, name, -(2**31), 2**31 - 1)


def _check_broadcast(*named) -> None:
    """:class:`ShapeError` naming the first operand (``(array, name)`` pairs; a Wide or
    ``(hi, lo)`` accumulator by its parts) whose shape does not broadcast against the
    shapes of the operands before it."""
    shape, names = None, []
    for a, name in named:
        parts = (
            [(a.hi, f"{name}.hi"), (a.lo, f"{name}.lo")]
            if isinstance(a, W.Wide)
            else [(a[0], f"{name}.hi"), (a[1], f"{name}.lo")]
            if isinstance(a, tuple)
            else [(a, name)]
        )
        for p, pname in parts:
            if shape is not None:
                V.check_broadcast(np.empty(shape, np.int8), " and ".join(names), p, pname)
            shape = jnp.broadcast_shapes(() if shape is None else shape, np.shape(p))
            names.append(pname)


def _int_only_in_32bit_mode(mode: int, what: str, *arrays) -> None:
    """32-bit-mode accumulators are 40/64-bit: float operands are not supported there."""
    if mode == 32 and S.has_float(*arrays):
        raise ArgTypeError(
            f"{what} takes float (differentiable) operands in 8/16-bit mode only; in 32-bit mode pass integer arrays"
        )


def _bits_u32(x, name: str) -> jax.Array:
    """A 32-bit field read unsigned: int32 (bit pattern) or uint32 input -> uint32."""
    a = V.as_array(x, name)
    if np.dtype(a.dtype) == np.uint32:
        return a
    return jax.lax.bitcast_convert_type(_int_operand(a, name, -(2**31), 2**31 - 1), _U32)


def _need_hardware(variant: str, what: str) -> None:
    if variant != "hardware":
        raise RangeError(f"variant={variant!r} does not model {what} (spec §2); only variant='hardware' does")


def _sat(x: jax.Array, bits: int) -> jax.Array:
    """Symmetric saturation ``sat_b`` (§1.1)."""
    return saturate(x, bits)


def _sat_wide(a: W.Wide, bits: int) -> tuple[jax.Array, jax.Array]:
    """``(sat_b(a), clipped)`` of an exact wide value."""
    hi = 2 ** (bits - 1) - 1
    return W.saturate_to_int32(a, -hi, hi)


def _sat_sum32(a: jax.Array, b: jax.Array, bits: int) -> tuple[jax.Array, jax.Array]:
    """``(sat_b(a + b), clipped)`` exactly for int32 ``a``, ``b`` (the sum may exceed int32)."""
    if bits < 32:
        return _sat_clipped(a + b, bits)
    return _sat_wide(W.add(W.from_int32(a), W.from_int32(b)), bits)


def _sat_clipped(raw: jax.Array, bits: int, symmetric: bool = True) -> tuple[jax.Array, jax.Array]:
    """``(saturate(raw, bits), clipped)`` for an exact int32 ``raw`` (the clamp itself: the
    bounds are static)."""
    hi = 2 ** (bits - 1) - 1
    raw = jnp.asarray(raw)
    # lax.clamp with bounds of raw's dtype: one operation in the trace (jnp.clip is a
    # nested program converting its bounds; this runs for every step of every transform)
    y = jax.lax.clamp(np.asarray(-hi if symmetric else -hi - 1, raw.dtype), raw, np.asarray(hi, raw.dtype))
    return y, y != raw


def _i32(*arrays) -> tuple[jax.Array, ...]:
    """The operands as int32 (the forward functions receive int32 or narrower arrays)."""
    return tuple(a.astype(_I32) for a in arrays)


# --------------------------------------------------------------- 40-bit accumulators


def as_acc40(acc: AccLike, name: str = "acc") -> W.Wide:
    """A 32-bit-mode accumulator as :class:`Wide`.

    Accepts a ``Wide``, an ``(hi, lo)`` pair (``hi`` int32, ``lo`` uint32 or the int32
    bit pattern of the low word) or an int32 array (sign-extended).
    """
    a = _checked_acc40(acc, name)
    if isinstance(a, tuple) and not isinstance(a, W.Wide):
        V.check_broadcast(a[0], f"{name}.hi", a[1], f"{name}.lo")
    return _acc40(a)


@eager_program
def _acc40(a) -> W.Wide:
    """:func:`as_acc40` on checked parts (:func:`_checked_acc40`): one program when called
    eagerly."""
    if isinstance(a, W.Wide):
        return W.from_parts(a.hi, a.lo)
    if isinstance(a, tuple):
        lo = a[1] if np.dtype(a[1].dtype) == np.uint32 else jax.lax.bitcast_convert_type(a[1].astype(_I32), _U32)
        hi, lo = jnp.broadcast_arrays(a[0].astype(_I32), lo)
        return W.Wide(hi, lo)
    return W.from_int32(a.astype(_I32))


def acc40_from_registers(vd, vr) -> W.Wide:
    """§1.4: ``acc40 = int8(vD & 0xFF) * 2**32 + u32(vR)`` for 32-bit mode lanes."""
    vd = _checked(vd, "vd", -(2**31), 2**31 - 1)
    vr = _checked_u32(vr, "vr")
    V.check_broadcast(vd, "vd", vr, "vr")
    return _acc40_from_registers_impl(vd, vr)


@jax.jit
def _acc40_from_registers_impl(vd, vr):
    vd = _int_operand(vd, "vd", -(2**31), 2**31 - 1)
    lo = _bits_u32(vr, "vr")
    hi = ((vd & 0xFF) ^ 0x80) - 0x80  # low byte, signed
    hi, lo = jnp.broadcast_arrays(hi, lo)
    return W.Wide(hi, lo)


def _sat40(a: W.Wide) -> W.Wide:
    """``sat40``: clamp a Wide value to ``[-(2**39-1), 2**39-1]``."""
    over = a.hi >= 128  # > 2**39 - 1  (hi = 127, lo = 0xFFFFFFFF is the bound)
    under = (a.hi < -128) | ((a.hi == -128) & (a.lo == 0))  # < -(2**39 - 1)
    hi = jnp.where(over, _I32(127), jnp.where(under, _I32(-128), a.hi))
    lo = jnp.where(over, _U32(0xFFFFFFFF), jnp.where(under, _U32(1), a.lo))
    return W.Wide(hi, lo)


def _wide_sum_last(a: W.Wide) -> W.Wide:
    """Exact sum over the last axis of a Wide array (fewer than 2**15 lanes).

    ``hi`` words are summed in int32 (the caller keeps them small); the uint32 low
    words are split into 16-bit halves whose sums cannot overflow.
    """
    hi = a.hi.sum(axis=-1, dtype=_I32)
    lo_hi = (a.lo >> 16).astype(_I32).sum(axis=-1, dtype=_I32)
    lo_lo = (a.lo & 0xFFFF).astype(_I32).sum(axis=-1, dtype=_I32)
    acc = W.Wide(hi, jnp.zeros_like(hi, _U32))
    acc = W.add(acc, W.Wide(lo_hi >> 16, jax.lax.bitcast_convert_type(lo_hi << 16, _U32)))
    return W.add(acc, W.from_int32(lo_lo))


def _product_terms(c: jax.Array, m: jax.Array, mode: int) -> W.Wide:
    """Per-lane MAC terms: ``c*m`` (8/16-bit) or ``rshr(c*m, 30)`` (32-bit), as Wide."""
    if mode == 8:
        return W.from_int32(c * m)
    p = W.mul_int32(c, m)
    return W.shift_right(p, jnp.asarray(30, _I32), "half_up") if mode == 32 else p


# -------------------------------------------------------------------------- §2.1 VLMACC


def vlmacc(
    acc: AccLike, vc, mem, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero"
):
    """VLMACC (§2.1): lane-wise multiply-accumulate, saturating after every product.

    * 8/16-bit mode: ``acc <- sat32(acc + c*m)`` with int32 ``acc`` and int8/int16
      ``c`` (vC lane), ``m`` (memory lane). The chip uses 16 lanes (in 8-bit mode the
      first 16 bytes of vC and memory); here every array element is a lane.
    * 32-bit mode (``hardware`` only): ``acc40 <- sat40(acc40 + rshr(c*m, 30))`` with
      the exact 64-bit product; ``acc`` is a Wide / ``(hi, lo)`` / int32 array and the
      result a :class:`Wide`.

    Identical in all variants in 8/16-bit mode; ``host``/``v2021`` do not model
    32-bit mode (ValueError).

    Args:
      acc, vc, mem: integer arrays, or (8/16-bit mode) float arrays holding integer
        values (differentiable), broadcast lane-wise.
      mode, variant: as above. saturation_grad: ``"zero"`` or ``"pass"`` (Gradient).

    Returns:
      int32 (8/16-bit mode; the float dtype for float operands) or :class:`Wide`.

    Gradient (float operands, 8/16-bit mode): that of ``acc + c*m``: ``d/dacc = 1``,
    ``d/dc = m``, ``d/dm = c``; 0 where the sum clipped at ±(2**31-1)
    (``saturation_grad="zero"``).
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    c, m = _checked_lanes(vc, "vc", mode, float_ok=True), _checked_lanes(mem, "mem", mode, float_ok=True)
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlmacc", acc, c, m)
        _need_hardware(variant, "32-bit VLMACC")
        a = _checked_acc40(acc, "acc")
    else:
        a = _checked(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)
    _check_broadcast((c, "vc"), (m, "mem"), (a, "acc"))
    return _vlmacc_impl(a, c, m, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vlmacc_impl(acc, vc, mem, *, mode, variant, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    c, m = _lanes(vc, "vc", mode, float_ok=True), _lanes(mem, "mem", mode, float_ok=True)
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlmacc", acc, c, m)
        _need_hardware(variant, "32-bit VLMACC")
        return _sat40(W.add(as_acc40(acc), _product_terms(c, m, 32)))
    a = _int_operand(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)

    def forward(a, c, m):
        a, c, m = _i32(a, c, m)
        return _sat_wide(W.add(W.from_int32(a), _product_terms(c, m, mode)), 32)

    return S.call(forward, lambda a, c, m: a + c * m, a, c, m, saturation_grad=saturation_grad)


# ------------------------------------------------------------------------- §2.2 VLMACCR


def vlmaccr(
    acc: AccLike, vc, mem, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero"
):
    """VLMACCR (§2.2): reducing multiply-accumulate into the rotating accumulator ring.

    ``acc`` is the ring, last axis = ring slots (16 in 8/16-bit mode, 8 in 32-bit
    mode); ``vc`` and ``mem`` have the EPV lanes (32 / 16 / 8) on the last axis.
    Leading axes broadcast. Per instruction::

        s = sum_i c[i]*m[i]            (exact; 32-bit mode: sum_i rshr(c[i]*m[i], 30))
        a = sat32(acc[-1] + s)         (32-bit mode: sat40 on 40-bit accumulators)
        ring <- [a, acc[0], ..., acc[-2]]   (a leaves in slot 0)

    One saturation per instruction, not per product. Returns the new ring (int32, or
    :class:`Wide` in 32-bit mode, which only ``hardware`` models).

    In 8/16-bit mode ``acc``, ``vc`` and ``mem`` may be float arrays holding integer
    values; the ring then comes back in the float dtype. Gradient: that of the float
    ring update ``[acc[-1] + sum_i c[i]*m[i], acc[0], ..., acc[-2]]``, with the new
    slot's cotangent set to 0 where its sum clipped (``saturation_grad="zero"``;
    ``"pass"`` keeps it).
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    c, m = _checked_lanes(vc, "vc", mode, float_ok=True), _checked_lanes(mem, "mem", mode, float_ok=True)
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlmaccr", acc, c, m)
        _need_hardware(variant, "32-bit VLMACCR")
        a = _checked_acc40(acc, "acc")
    else:
        a = _checked(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)
    return _vlmaccr_impl(a, c, m, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vlmaccr_impl(acc, vc, mem, *, mode, variant, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    c, m = _lanes(vc, "vc", mode, float_ok=True), _lanes(mem, "mem", mode, float_ok=True)
    epv, ring = _EPV[mode], _RING[mode]
    for a, name in ((c, "vc"), (m, "mem")):
        if a.ndim < 1 or a.shape[-1] != epv:
            raise ShapeError(
                f"{name} must have the {epv} lanes of a {mode}-bit vector on its last axis, got shape {a.shape}"
            )
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlmaccr", acc, c, m)
        _need_hardware(variant, "32-bit VLMACCR")
        s = _wide_sum_last(_product_terms(c, m, mode))
        r = as_acc40(acc)
        _check_ring(r.hi, ring)
        new = _sat40(W.add(W.Wide(r.hi[..., -1], r.lo[..., -1]), s))
        return W.Wide(_rotate_in(new.hi, r.hi), _rotate_in(new.lo, r.lo))
    r = _int_operand(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)
    _check_ring(r, ring)

    def forward(r, c, m):
        r, c, m = _i32(r, c, m)
        s = _wide_sum_last(_product_terms(c, m, mode))
        new, clipped = _sat_wide(W.add(W.from_int32(r[..., -1]), s), 32)
        return _rotate_in(new, r), _rotate_in(clipped, jnp.zeros(r.shape, bool))

    def surrogate(r, c, m):
        new = r[..., -1] + (c * m).sum(axis=-1)
        return _rotate_in(new, r.astype(new.dtype))

    return S.call(forward, surrogate, r, c, m, saturation_grad=saturation_grad)


def _check_ring(r: jax.Array, ring: int) -> None:
    if r.ndim < 1 or r.shape[-1] != ring:
        raise ShapeError(f"acc must hold the {ring}-accumulator ring on its last axis, got shape {r.shape}")


def _rotate_in(new: jax.Array, ring: jax.Array) -> jax.Array:
    """``[new, ring[0], ..., ring[-2]]`` along the last axis (broadcasting leading axes)."""
    lead = jnp.broadcast_shapes(new.shape, ring.shape[:-1])
    ring = jnp.broadcast_to(ring, lead + ring.shape[-1:])
    return jnp.concatenate([jnp.broadcast_to(new, lead)[..., None], ring[..., :-1]], axis=-1)


# --------------------------------------------------------------------------- §2.3 VLSAT


def _vlsat_shift_16(shift) -> jax.Array:
    """8/16-bit mode: the 16-bit shift element read unsigned, as int32 in [0, 65535]."""
    s = _int_operand(shift, "shift", -(2**15), 2**16 - 1)
    return s & 0xFFFF


def vlsat(
    acc: AccLike,
    shift,
    *,
    mode: Mode,
    variant: Variant = "hardware",
    symmetric: bool = True,
    saturation_grad: SaturationGrad = "zero",
) -> jax.Array:
    """VLSAT (§2.3): round-shift the accumulators right and saturate to the lane width.

    8/16-bit mode: ``acc`` int32, ``shift`` the 16-bit memory element, given as its
    int16 or uint16 value and read **unsigned** (``s = shift mod 2**16``; a negative
    int16 shift is a shift >= 32768). Result ``sat_b(R(acc, s))``, b = 8 / 16:

    * ``hardware``: ``R = rshr(acc, s)`` exactly for s <= 31 (round half up, no
      overflow); ``R = acc >> s`` (0 or -1, no rounding) for s >= 32.
    * ``host``/``v2021``: ``R = wrap32(acc + 2**(s-1)) >> s`` for s >= 1 (the rounding
      add wraps in int32, so acc near +2**31 saturates to -MAX), ``R = acc`` for s = 0.
      Shifts >= 32 are undefined in those models; they are computed as ``hardware``
      and a warning is issued when the shift is concrete.

    32-bit mode (``hardware`` only): ``acc`` is the 64-bit ``vD.s32*2**32 + u32(vR)``
    (a Wide / ``(hi, lo)`` pair / int32 array), ``shift`` a 32-bit element read
    unsigned (int32 or uint32), result ``sat32(rshr(acc64, min(s, 62)))``.

    ``symmetric=False`` models the ``VLSAT_ASYMMETRIC``/``VLSAT_FIXED`` software
    fix-up: the same R, then clamp to the two's-complement range (e.g. [-128, 127]).

    Args:
      acc: accumulators (see above); in 8/16-bit mode also a float array holding int32
        values (differentiable).
      shift: integer array (no gradient). mode, variant, symmetric: as above.
      saturation_grad: ``"zero"`` or ``"pass"`` (see Gradient).

    Returns:
      int32 lane values (the float dtype of a float ``acc``).

    Gradient (float ``acc``): straight-through rounding, ``d/dacc = 2**-s`` (s the
    unsigned shift); 0 where the lane saturated (``saturation_grad="zero"``).
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlsat", acc)
        _need_hardware(variant, "32-bit VLSAT")
        a = _checked_acc40(acc, "acc")
        s = _checked_u32(shift, "shift")
    else:
        a = _checked(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)
        s = _checked(shift, "shift", -(2**15), 2**16 - 1)
        V.check_broadcast(a, "acc", s, "shift")
        if variant != "hardware" and V.is_concrete(s) and np.any((np.asarray(s).astype(np.int64) & 0xFFFF) >= 32):
            warnings.warn(
                f"VLSAT shifts >= 32 are undefined in the {variant!r} model (spec §2.3);"
                " computing them as variant='hardware'",
                stacklevel=2,
            )
    return _vlsat_impl(a, s, mode=mode, variant=variant, symmetric=bool(symmetric), saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "symmetric",
        "saturation_grad",
    ),
)
def _vlsat_impl(acc, shift, *, mode, variant, symmetric, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    if mode == 32:
        _int_only_in_32bit_mode(mode, "vlsat", acc)
        _need_hardware(variant, "32-bit VLSAT")
        a = as_acc40(acc)
        s = _bits_u32(shift, "shift")
        s = jnp.where(s > 62, _U32(62), s).astype(_I32)
        r = W.shift_right(a, s, "half_up")
        lo, hi = (-(2**31 - 1), 2**31 - 1) if symmetric else (-(2**31), 2**31 - 1)
        return W.saturate_to_int32(r, lo, hi)[0]
    a = _int_operand(acc, "acc", -(2**31), 2**31 - 1, float_ok=True)
    s = _vlsat_shift_16(shift)  # (the warning on shifts >= 32 is issued by vlsat)

    def forward(a, s):
        return _sat_clipped(vlsat_raw(a.astype(_I32), s, variant=variant), mode, bool(symmetric))

    return S.call(forward, lambda a, s: a * S.exp2(-s, a), a, s, saturation_grad=saturation_grad)


def static_shift(s) -> int | None:
    """A shift's value where it is known while tracing (a Python or NumPy integer, a 0-d
    NumPy array, a concrete array), else None (a traced shift). The raw forms below trace
    only the form a known shift needs; a traced shift gets the form for every shift (the
    same values)."""
    if isinstance(s, jax.core.Tracer) or isinstance(s, (bool, np.bool_)) or np.ndim(s) != 0:
        return None
    try:
        v = np.asarray(s)
    except Exception:
        return None
    return int(v) if np.issubdtype(v.dtype, np.integer) else None


def vlsat_raw(acc: jax.Array, s: jax.Array, *, variant: Variant) -> jax.Array:
    """The rounding shift R of 8/16-bit VLSAT before saturation (int32; no checks).

    ``acc`` int32, ``s`` the unsigned shift in [0, 65535]. ``vlsat`` is
    ``saturate(vlsat_raw(...), mode)``; comparing the two tells where VLSAT clipped.

    One int32 expression per variant, each exact without a wider type: with
    ``k = min(s, 31)`` and ``live = 1 <= s <= 31`` (a rounding bit exists),

    * ``hardware``: ``(acc >> k) + bit``, ``bit`` the rounding bit ``s - 1`` of ``acc``
      where ``live`` (``floor(acc / 2**s + 1/2)`` is the floor quotient plus that bit, and
      ``acc >> 31`` for s >= 32);
    * ``host``/``v2021``: ``(acc + half) >> k`` with the int32 add wrapping as in the C
      model, ``half = 2**(s-1)`` where ``live``, else 0 (``acc`` at s = 0, ``acc >> 31``
      at s >= 32).
    """
    known = static_shift(s)
    if known is not None and 0 <= known <= 0xFFFF:  # the same expressions with the shift known
        if known == 0:
            return acc
        if known >= 32:
            return acc >> 31
        if variant == "hardware":
            return (acc >> known) + ((acc >> (known - 1)) & 1)
        return (acc + _I32(1 << (known - 1))) >> known
    k = jnp.minimum(s, 31)
    live = (s >= 1) & (s <= 31)
    below = jnp.clip(s - 1, 0, 30)
    if variant == "hardware":
        return (acc >> k) + ((acc >> below) & live.astype(_I32))
    return (acc + jnp.where(live, _I32(1) << below, _I32(0))) >> k


# -------------------------------------------------------------------------- §2.4 VLASHR


def _left_wrapped(x: jax.Array, k: jax.Array, zero_extend: bool) -> jax.Array:
    """``wrap32(x * 2**k)`` (k >= 0; 0 for k >= 32); the bit pattern read as unsigned
    and saturated to int32 when ``zero_extend`` (the 32-bit host/v2021 model bug)."""
    u = jax.lax.bitcast_convert_type(x, _U32) << jnp.clip(k, 0, 31).astype(_U32)
    u = jnp.where(k >= 32, _U32(0), u)
    if zero_extend:
        return jnp.where(u > _U32(2**31 - 1), _I32(2**31 - 1), u.astype(_I32))
    return jax.lax.bitcast_convert_type(u, _I32)


def vlashr(x, shr, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """VLASHR (§2.4): arithmetic shift of a memory vector by a signed 32-bit ``shr``.

    ``x`` holds b-bit lane values (b = ``mode``), ``shr`` int32 (broadcast against
    ``x``; the chip uses one scalar for all lanes). Per variant:

    * ``hardware``: shr >= 0: ``sat_b(floor(x / 2**min(shr, b-1)))`` (floor, no
      rounding; shr = 0 maps the raw minimum to -MAX); shr < 0 (k = -shr):
      ``sat_b(x * 2**min(k, b-1))``.
    * ``host``: shr >= b-1: -1 if x < 0 else 0; 1 <= shr <= b-2: round half up,
      ``sat_b(floor((x + 2**(shr-1)) / 2**shr))``; shr <= 0 in 8/16-bit mode:
      ``sat_b(wrap32(x * 2**k))``; shr <= 0 in 32-bit mode: ``sat32((x * 2**k) mod 2**32)``
      (the result bits read zero-extended: the model's bug).
    * ``v2021``: as ``hardware`` for shr >= 0 (floor), as ``host`` for shr < 0
      (wrap, and the zero-extension bug in 32-bit mode).

    Args:
      x: integer lane values, or a float array holding them (differentiable).
      shr: integer array (no gradient). mode, variant: as above.
      saturation_grad: ``"zero"`` or ``"pass"`` (see Gradient).

    Returns:
      int32 lane values (the float dtype of a float ``x``).

    Gradient (float ``x``): straight-through, ``d/dx = 2**-e`` with the effective shift
    ``e = clip(shr, -(b-1), b-1)`` (``2**k`` for a left shift by k); 0 where the lane
    saturated, i.e. ``sat_b`` changed the value or the exact ``x * 2**k`` left the
    lane range (``saturation_grad="zero"``).
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    xv = _checked_lanes(x, "x", mode, float_ok=True)
    s = _checked(shr, "shr", -(2**31), 2**31 - 1)
    V.check_broadcast(xv, "x", s, "shr")
    return _vlashr_impl(xv, s, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vlashr_impl(x, shr, *, mode, variant, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    b = mode
    xv = _lanes(x, "x", b, float_ok=True)
    s = _int_operand(shr, "shr", -(2**31), 2**31 - 1)
    V.check_broadcast(xv, "x", s, "shr")

    def forward(xv, s):
        xi = xv.astype(_I32)
        y, clipped = _sat_clipped(vlashr_raw(xi, s, mode=b, variant=variant), b)
        return y, clipped | _left_overflow(xi, s, b)

    def surrogate(xv, s):
        return xv * S.exp2(-jnp.clip(s, -(b - 1), b - 1), xv)

    return S.call(forward, surrogate, xv, s, saturation_grad=saturation_grad)


def _left_overflow(x: jax.Array, shr: jax.Array, b: int) -> jax.Array:
    """Where a left shift (shr < 0, by k = min(-shr, b-1)) of ``x`` leaves ±(2**(b-1)-1)."""
    lim = _I32(2 ** (b - 1) - 1) >> jnp.clip(-shr, 0, b - 1)
    return (shr < 0) & ((x > lim) | (x < -lim))


def vlashr_raw(x: jax.Array, shr: jax.Array, *, mode: int, variant: Variant) -> jax.Array:
    """VLASHR before the final ``sat_b`` (int32; no checks). ``x`` holds b-bit lane values
    (``|x| <= 2**(b-1)``). Exact in 8/16-bit mode; in 32-bit mode left shifts are already
    clamped to the int32 range."""
    b = mode
    known = static_shift(shr)
    if b < 32 and known is not None:  # the same expressions with the shift known
        if known < 0 and variant != "hardware":  # wrapping left shift (0 from 32 on)
            return x << (-known) if known > -32 else jnp.zeros_like(x)
        if known < 0:
            return x << min(-known, b - 1)
        if variant == "host" and 1 <= known <= b - 2:
            return (x + _I32(1 << (known - 1))) >> known
        return x >> min(known, b - 1) if known else x
    if b < 32 and variant != "hardware":  # left shifts wrap; shr >= 0 as below
        left = _left_wrapped(x, jnp.maximum(-shr, 0), zero_extend=False)
        if variant == "host":
            # 1 <= shr <= b-2: (x + 2**(shr-1)) >> shr (|x| <= 2**(b-1) <= 2**15: no
            # wrap); x at 0; shr >= b-1: the floor x >> (b-1)
            live = (shr >= 1) & (shr <= b - 2)
            half = jnp.where(live, _I32(1) << jnp.clip(shr - 1, 0, b - 3), _I32(0))
            return jnp.where(shr < 0, left, (x + half) >> jnp.clip(shr, 0, b - 1))
        return jnp.where(shr < 0, left, x >> jnp.clip(shr, 0, b - 1))  # v2021: floors
    capped = jnp.clip(shr, -(b - 1), b - 1)
    if b < 32:  # hardware
        # b-bit lanes (|x| <= 2**(b-1)) shifted left by at most b - 1: |x 2**k| <= 2**30,
        # exact in int32, so the saturating left shift of shift_right never saturates
        return jnp.where(capped >= 0, x >> jnp.maximum(capped, 0), x << jnp.maximum(-capped, 0))
    floor = shift_right(x, capped, rounding="floor", allow_left=True)
    if variant == "hardware":
        return floor
    left = _left_wrapped(x, jnp.maximum(-shr, 0), zero_extend=True)
    if variant == "host":  # 32-bit host: also the zero-extended left path at shr = 0 (its bug)
        rounded = shift_right(x, jnp.clip(shr, 0, b - 1), rounding="half_up")
        return jnp.where(shr <= 0, left, jnp.where(shr >= b - 1, floor, rounded))
    return jnp.where(shr < 0, left, floor)


# --------------------------------------------------------------------------- §2.5 VLMUL


_LANE_DTYPE = {8: jnp.int8, 16: jnp.int16, 32: _I32}


def vlmul(x, m, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """VLMUL (§2.5): fixed-point multiply of vR lanes ``x`` by memory lanes ``m``.

    With k = 6 / 14 / 30 in 8 / 16 / 32-bit mode (Q1.6 / Q1.14 / Q1.30):

    * ``hardware``, ``host``: ``sat_b(floor((x*m + 2**(k-1)) / 2**k))`` (round half up;
      -32768 * -32768 gives 32767 in 16-bit mode).
    * ``v2021``: ``sat_b(floor(x*m / 2**k))`` (truncation, no rounding term).

    The product is exact (64-bit in 32-bit mode).

    Args:
      x, m: integer lane values, or float arrays holding them (differentiable);
        broadcast lane-wise.
      mode, variant: as above. saturation_grad: ``"zero"`` or ``"pass"`` (Gradient).

    Returns:
      int32 lane values (the float dtype when an operand is float).

    Gradient (float operands): straight-through rounding, ``d/dx = m / 2**k``,
    ``d/dm = x / 2**k``; 0 where the exact rounded product left ±(2**(b-1)-1)
    (``saturation_grad="zero"``).
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    x, m = _checked_lanes(x, "x", mode, float_ok=True), _checked_lanes(m, "m", mode, float_ok=True)
    V.check_broadcast(x, "x", m, "m")
    return _vlmul_impl(x, m, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vlmul_impl(x, m, *, mode, variant, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    x, m = _lanes(x, "x", mode, float_ok=True), _lanes(m, "m", mode, float_ok=True)
    k = _VLMUL_FRAC[mode]

    def forward(x, m):
        x, m = _i32(x, m)
        y, clipped = _sat_clipped(vlmul_raw(x, m, mode=mode, variant=variant), mode)
        if mode < 32:  # the raw product fits int32: clipped is exact
            return y, clipped
        exact = W.shift_right(W.mul_int32(x, m), jnp.asarray(k, _I32), _vlmul_rounding(variant))
        return y, _sat_wide(exact, mode)[1]

    return S.call(forward, lambda x, m: x * m * 2.0**-k, x, m, saturation_grad=saturation_grad)


def _vlmul_rounding(variant: str) -> str:
    return "floor" if variant == "v2021" else "half_up"


def vlmul_raw(x: jax.Array, m: jax.Array, *, mode: int, variant: Variant) -> jax.Array:
    """VLMUL's rounded (``v2021``: floored) ``x*m / 2**k`` before ``sat_b`` (int32; no
    checks). Exact in 8/16-bit mode; already ``sat32`` in 32-bit mode."""
    dt = _LANE_DTYPE[mode]
    x, m = x.astype(dt), m.astype(dt)
    if mode == 32:
        return fixed_mul(x, m, _VLMUL_FRAC[mode], rounding=_vlmul_rounding(variant), bits=32)
    # 8/16-bit lanes: |x m| <= 2**(2b-2) <= 2**30 is exact in int32 and so is the rounding
    # add (2**(k-1) <= 2**13), so the int32 expression is the exact rounded quotient
    k = _VLMUL_FRAC[mode]
    p = x.astype(_I32) * m.astype(_I32)
    return (p if variant == "v2021" else p + (1 << (k - 1))) >> k


# ------------------------------------------------------------------- §2.6–2.8 VDEPTH*


def vdepth8(
    x, *, mode: Literal[16, 32], variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero"
) -> jax.Array:
    """VDEPTH8 (§2.6): narrow 16-bit (``mode=16``) or 32-bit (``mode=32``) lanes to int8.

    ``sat8(floor((x + 2**(b-9)) / 2**(b-8)))``: ``sat8(rshr(x, 8))`` in 16-bit mode,
    ``sat8(rshr(x, 24))`` in 32-bit mode. It saturates (x >= 32640 gives 127 in 16-bit
    mode). Identical in all variants. The chip clears the other bytes of vR; only the
    lane values are returned here.

    ``x`` may be a float array holding the lane values: the result is then in that
    dtype. Gradient: straight-through, ``d/dx = 2**-(b-8)``; 0 where the lane
    saturated (``saturation_grad="zero"``; ``"pass"`` keeps it).
    """
    mode = _check_mode(mode, (16, 32))
    _check_variant(variant)
    x = _checked_lanes(x, "x", mode, float_ok=True)
    return _vdepth8_impl(x, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vdepth8_impl(x, *, mode, variant, saturation_grad):
    mode = _check_mode(mode, (16, 32))
    _check_variant(variant)
    return _narrow(_lanes(x, "x", mode, float_ok=True), mode - 8, 8, saturation_grad)


def vdepth16(x, *, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """VDEPTH16 (§2.7, 32-bit mode): ``sat16(floor((x + 2**15) / 2**16))``. All variants.

    ``x`` may be a float array holding int32 values (result in that dtype). Gradient:
    straight-through, ``d/dx = 2**-16``; 0 where the lane saturated
    (``saturation_grad="zero"``).
    """
    _check_variant(variant)
    x = _checked_lanes(x, "x", 32, float_ok=True)
    return _vdepth16_impl(x, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "variant",
        "saturation_grad",
    ),
)
def _vdepth16_impl(x, *, variant, saturation_grad):
    _check_variant(variant)
    return _narrow(_lanes(x, "x", 32, float_ok=True), 16, 16, saturation_grad)


def _narrow(x: jax.Array, shift: int, bits: int, saturation_grad: str) -> jax.Array:
    """``sat_bits(rshr(x, shift))`` (VDEPTH8/16), differentiable for float ``x``."""

    def forward(x):
        # round half up by a static 1 <= shift <= 31: the floor quotient plus the rounding
        # bit, exact in int32 (shift_right's general form serves a traced shift)
        x = x.astype(_I32)
        return _sat_clipped((x >> shift) + ((x >> (shift - 1)) & 1), bits)

    return S.call(forward, lambda x: x * 2.0**-shift, x, saturation_grad=saturation_grad)


def vdepth1(x, *, mode: Mode, variant: Variant = "hardware") -> jax.Array:
    """VDEPTH1 (§2.8): sign bits of one vector, ``sum_{i: x[i] < 0} 2**i``.

    ``x`` has the EPV lanes (32 / 16 / 8) on its last axis; the result (the new
    ``vR.s32[0]``) is returned as int32 holding that bit pattern (bit 31 set makes it
    negative in 8-bit mode). Identical in all variants.
    """
    mode = _check_mode(mode)
    _check_variant(variant)
    x = _checked_lanes(x, "x", mode)
    return _vdepth1_impl(x, mode=mode, variant=variant)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
    ),
)
def _vdepth1_impl(x, *, mode, variant):
    mode = _check_mode(mode)
    _check_variant(variant)
    xv = _lanes(x, "x", mode)
    epv = _EPV[mode]
    if xv.ndim < 1 or xv.shape[-1] != epv:
        raise ShapeError(f"x must have the {epv} lanes of a {mode}-bit vector on its last axis, got shape {xv.shape}")
    weights = jnp.asarray(np.arange(epv, dtype=np.uint32), _U32)
    bits = jnp.where(xv < 0, _U32(1) << weights, _U32(0)).sum(axis=-1, dtype=_U32)
    return jax.lax.bitcast_convert_type(bits, _I32)


# ------------------------------------------------------------------ §2.9–2.10 add/sub


def vladd(vr, mem, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """VLADD (§2.9): ``sat_b(x + m)``, exact (no int32 wrap in 32-bit mode). All variants.

    ``vr``, ``mem`` may be float arrays holding the lane values (result in the float
    dtype). Gradient: ``d/dvr = d/dmem = 1``; 0 where the sum saturated
    (``saturation_grad="zero"``; ``"pass"`` keeps it).
    """
    mode = _check_mode(mode)
    _check_variant(variant)
    x, m = _checked_lanes(vr, "vr", mode, float_ok=True), _checked_lanes(mem, "mem", mode, float_ok=True)
    V.check_broadcast(x, "vr", m, "mem")
    return _vladd_impl(x, m, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vladd_impl(vr, mem, *, mode, variant, saturation_grad):
    mode = _check_mode(mode)
    _check_variant(variant)
    x, m = _lanes(vr, "vr", mode, float_ok=True), _lanes(mem, "mem", mode, float_ok=True)
    return S.call(lambda x, m: _sat_sum32(*_i32(x, m), mode), lambda x, m: x + m, x, m, saturation_grad=saturation_grad)


def vlsub(vr, mem, *, mode: Mode, variant: Variant = "hardware", saturation_grad: SaturationGrad = "zero") -> jax.Array:
    """VLSUB (§2.10): **memory minus register**, ``sat_b(m - x)``.

    ``hardware`` quirk for x = -2**(b-1) (the raw minimum): in 8/16-bit mode, m = 0
    returns -2**(b-1) itself (other m: ``sat_b(m - x)``); in 32-bit mode the negation
    of MIN is MIN, so the result is ``sat32(m - 2**31)``. ``host``/``v2021``: always
    ``sat_b(m - x)`` (0 - MIN gives +MAX).

    Args:
      vr, mem: integer lane values, or float arrays holding them (differentiable).
      mode, variant: as above. saturation_grad: ``"zero"`` or ``"pass"`` (Gradient).

    Returns:
      int32 lane values (the float dtype when an operand is float).

    Gradient (float operands): ``d/dmem = 1``, ``d/dvr = -1``; 0 where the result
    differs from the exact ``m - x`` (saturation, and the ``hardware`` MIN quirk)
    with ``saturation_grad="zero"``.
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    x, m = _checked_lanes(vr, "vr", mode, float_ok=True), _checked_lanes(mem, "mem", mode, float_ok=True)
    V.check_broadcast(x, "vr", m, "mem")
    return _vlsub_impl(x, m, mode=mode, variant=variant, saturation_grad=saturation_grad)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
        "saturation_grad",
    ),
)
def _vlsub_impl(vr, mem, *, mode, variant, saturation_grad):
    mode, variant = _check_mode(mode), _check_variant(variant)
    x, m = _lanes(vr, "vr", mode, float_ok=True), _lanes(mem, "mem", mode, float_ok=True)

    def forward(x, m):
        x, m = _i32(x, m)
        y = _vlsub_int(x, m, mode, variant)
        if mode < 32:
            return y, y != m - x
        fits, out = W.saturate_to_int32(W.sub(W.from_int32(m), W.from_int32(x)), -(2**31), 2**31 - 1)
        return y, out | (fits != y)

    return S.call(forward, lambda x, m: m - x, x, m, saturation_grad=saturation_grad)


def _vlsub_int(x: jax.Array, m: jax.Array, mode: int, variant: str) -> jax.Array:
    """VLSUB on int32 lane values (see :func:`vlsub`)."""
    xmin = -(2 ** (mode - 1))
    if mode == 32:
        neg_x = -x  # int32 negation wraps: -MIN == MIN, the hardware quirk
        plain = W.saturate_to_int32(W.sub(W.from_int32(m), W.from_int32(x)), -(2**31 - 1), 2**31 - 1)[0]
        quirk = _sat_sum32(m, neg_x, 32)[0]
    else:
        plain = _sat(m - x, mode)
        quirk = jnp.where(m == 0, _I32(xmin), plain)
    if variant != "hardware":
        return plain
    return jnp.where(x == xmin, quirk, plain)


# --------------------------------------------------------------------------- §2.11 VPOS


def vpos(x, *, mode: Mode, variant: Variant = "hardware") -> jax.Array:
    """VPOS (§2.11): clamp negative lanes of vR to 0.

    * ``hardware`` (and ``host``/``v2021`` in 16-bit mode): lane-wise ``max(x, 0)``,
      any shape.
    * ``host``/``v2021`` in 8-bit mode (the broken model): ``x`` is one whole vector
      (32 lanes on the last axis); lanes i = 0..15 become ``max(x[2i], 0)``, lanes
      16..31 are unchanged. 32-bit mode is not modelled there (ValueError).

    Returns int32 lane values.
    """
    mode, variant = _check_mode(mode), _check_variant(variant)
    x = _checked_lanes(x, "x", mode)
    return _vpos_impl(x, mode=mode, variant=variant)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "variant",
    ),
)
def _vpos_impl(x, *, mode, variant):
    mode, variant = _check_mode(mode), _check_variant(variant)
    xv = _lanes(x, "x", mode)
    if variant == "hardware" or mode == 16:
        return jnp.maximum(xv, 0)
    if mode == 32:
        _need_hardware(variant, "32-bit VPOS")
    if xv.ndim < 1 or xv.shape[-1] != 32:
        raise ShapeError(
            f"variant={variant!r} 8-bit VPOS works on whole vectors: x must have 32 "
            f"lanes on its last axis, got shape {xv.shape}"
        )
    return jnp.concatenate([jnp.maximum(xv[..., 0:32:2], 0), xv[..., 16:]], axis=-1)


# ------------------------------------------------------------------------ §2.12 VLMACCR1


def _popcount32(u: jax.Array) -> jax.Array:
    return jax.lax.population_count(u).astype(_I32)


def vlmaccr1(acc, vc_words, mem_words, *, variant: Variant = "hardware") -> jax.Array:
    """VLMACCR1 (§2.12): binary MAC into the 16-accumulator ring.

    ``vc_words``, ``mem_words``: the 8 32-bit words of vC and memory on the last axis
    (int32 bit patterns or uint32). ``s = sum_w popcount(~(vc_w ^ mem_w)) - 16``;
    ``a = sat32(acc[15] + s)``; the ring rotates exactly as in :func:`vlmaccr`.
    Identical in all variants.
    """
    _check_variant(variant)
    c, m = _checked_u32(vc_words, "vc_words"), _checked_u32(mem_words, "mem_words")
    r = _checked(acc, "acc", -(2**31), 2**31 - 1)
    return _vlmaccr1_impl(r, c, m, variant=variant)


@functools.partial(jax.jit, static_argnames=("variant",))
def _vlmaccr1_impl(acc, vc_words, mem_words, *, variant):
    _check_variant(variant)
    c, m = _bits_u32(vc_words, "vc_words"), _bits_u32(mem_words, "mem_words")
    for a, name in ((c, "vc_words"), (m, "mem_words")):
        if a.ndim < 1 or a.shape[-1] != 8:
            raise ShapeError(f"{name} must have the 8 words of a vector on its last axis, got {a.shape}")
    s = (_popcount32(~(c ^ m)) - 16).sum(axis=-1, dtype=_I32)
    r = _int_operand(acc, "acc", -(2**31), 2**31 - 1)
    _check_ring(r, 16)
    return _rotate_in(_sat_sum32(r[..., -1], s, 32)[0], r)
