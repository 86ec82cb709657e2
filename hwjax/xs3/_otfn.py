"""Current lib_nn output transforms (spec ``xs3.md`` §4), composed from VPU instructions.

An output transform turns the int32 accumulators that the aggregate functions leave
(one per output channel, last axis) into int8 outputs. Every transform here is the
exact instruction sequence of lib_nn's ``output_transform_fn_impl`` / assembly, built
from :mod:`hwjax.xs3._vpu`, so the variant quirks come from the instructions.

Accumulators may have any leading shape ``(..., C)``; per-channel parameters have
shape ``(C,)`` (or broadcast against ``acc``). Outputs are int8 arrays.

Every transform checks its arguments in Python (values when concrete), then runs as
one ``jax.jit``-compiled program (static: ``variant``, ``return_stats``,
``saturation_grad``; shifts are traced), so an eager call compiles once per shapes and
options; inside ``jit``, ``vmap`` or ``grad`` the program is inlined.

Float inputs (:func:`otfn_int8`, :func:`otfn_int8_channelwise`): ``acc``,
``multipliers`` and ``biases`` may be float arrays holding integer values. The output
is then the int8 result in that float dtype (bit-identical to the integer path) and
differentiable with the gradient of the float affine function the transform
approximates (see :func:`otfn_int8`); shifts are integers and take no gradient.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import surrogate as S
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.xs3 import _bso
from hwjax.xs3 import _vpu as vpu
from hwjax.core import SaturationGrad, eager_program, evaluated_if_concrete
from hwjax.xs3._vpu import Variant

_I32 = jnp.int32
EPV16 = 16  # 16-bit lanes per vector = output channels per group

INITIAL_SHIFT_RANGE = (-16, 16)
FINAL_SHR_RANGE = (-16, 15)
STEPS = ("after_vlsat", "after_initial_vlashr", "after_vlmul", "after_vladd", "after_final_vlashr", "y_int8")
STAT_KEYS = ("initial_clipped", "mul_clipped", "bias_clipped", "final_clipped", "output_clipped")


# ----------------------------------------------------------------------- validation


def _shift(value, lo: int, hi: int, name: str) -> jax.Array | np.int32:
    """A per-op shift as an int32 scalar (:func:`hwjax.core._validate.int_scalar`): a
    concrete value must lie in ``[lo, hi]``, the range the assembly supports; a traced
    one (hardware-aware training derives shifts inside ``jit``) cannot be checked, and
    the result is what the VPU instructions compute with it (they define every shift).
    """
    try:
        checked = V.int_scalar(value, lo, hi, name)
    except ValueError:
        raise RangeError(
            f"{name}={value} is outside the supported range [{lo}, {hi}] of the XS3 otfn_int8 assembly (spec §4.1)"
        ) from None
    # a concrete shift stays a NumPy scalar: known while a caller's program is traced, it
    # selects the one form of each VPU step it needs (vpu.static_shift)
    return checked if isinstance(value, jax.core.Tracer) else np.int32(np.asarray(value))


def _acc32(acc, name: str = "acc", *, float_ok: bool = False) -> jax.Array:
    """int32 accumulators (..., C) as int32, or (``float_ok``) a float array holding them."""
    a = S.operand(acc, name, -(2**31), 2**31 - 1, differentiable=float_ok, what=" of int32 accumulators")
    if a.ndim < 1:
        raise ShapeError(f"{name} must have the output channels on its last axis, got a scalar")
    return a


def _channel_param(
    p, name: str, channels: int, lo: int = -(2**15), hi: int = 2**15 - 1, *, float_ok: bool = False
) -> jax.Array:
    """A (C,) parameter of int16 values (shifts: up to 65535) as int32, or a float array."""
    a = S.operand(p, name, lo, hi, differentiable=float_ok, what=" (int16 values)")
    if a.shape != (channels,):
        raise ShapeError(f"{name} must have shape ({channels},) (one per output channel), got {a.shape}")
    return a


def _checked_acc32(acc, name: str = "acc", *, float_ok: bool = False) -> jax.Array:
    """The checks of :func:`_acc32` without its int32 conversion (done in the jitted program)."""
    a = vpu._checked(acc, name, -(2**31), 2**31 - 1, float_ok=float_ok, what=" of int32 accumulators")
    if a.ndim < 1:
        raise ShapeError(f"{name} must have the output channels on its last axis, got a scalar")
    return a


def _checked_channel_param(
    p, name: str, channels: int, lo: int = -(2**15), hi: int = 2**15 - 1, *, float_ok: bool = False
) -> jax.Array:
    """The checks of :func:`_channel_param` without its int32 conversion."""
    a = vpu._checked(p, name, lo, hi, float_ok=float_ok, what=" (int16 values)")
    if a.shape != (channels,):
        raise ShapeError(f"{name} must have shape ({channels},) (one per output channel), got {a.shape}")
    return a


def _checked_int8_operands(acc, multipliers, biases, *, float_ok: bool):
    """The checks of :func:`_int8_operands` without the int32 conversions."""
    a = _checked_acc32(acc, float_ok=float_ok)
    c = a.shape[-1]
    return (
        a,
        _checked_channel_param(multipliers, "multipliers", c, float_ok=float_ok),
        _checked_channel_param(biases, "biases", c, float_ok=float_ok),
    )


# ------------------------------------------------------------------------- the steps


def _vdepth8_fixed(t: jax.Array, variant: Variant) -> jax.Array:
    """Step 5 of §4.1: ``clamp(floor((t + 128) / 256), -128, 127)``.

    As the assembly does it: lanes with ``sat16(t + 0x7F80) < 0`` (VLADD, VDEPTH1)
    get -128, the others VDEPTH8.
    """
    low = vpu.vladd(t, 0x7F80, mode=16, variant=variant) < 0
    return jnp.where(low, _I32(-128), vpu.vdepth8(t, mode=16, variant=variant))


def _output_clipped(t: jax.Array) -> jax.Array:
    """Where step 5 clamped: ``floor((t + 128) / 256)`` outside [-128, 127]."""
    q = (t + 128) >> 8
    return (q > 127) | (q < -128)


def _tail(
    t: jax.Array, mul: jax.Array, bias: jax.Array, final_shr: jax.Array, variant: Variant, *, flags: bool = True
) -> dict:
    """Steps 2–5 of §4.1 (shared by every int8 transform), with their clip flags unless
    ``flags`` is False; ``t`` holds 16-bit lane values (step 1's saturated result)."""
    # each saturating step as its exact result saturated (what vlmul / vlashr compute on
    # int32 lanes), so that the exact result serves the value and its clip flag alike
    p = vpu.vlmul_raw(t, mul, mode=16, variant=variant)
    known = vpu.static_shift(final_shr)
    shr = final_shr if known is not None else jnp.asarray(final_shr, _I32)
    fast = known is not None and known >= -14
    steps = _tail_from_product(p, bias, shr, variant, with_y=not fast)
    t_mul, t_add, t_fin, raw_fin = (steps[k] for k in ("after_vlmul", "after_vladd", "after_final_vlashr", "raw_fin"))
    y = _tail_y(p, bias, known, variant) if fast else steps["y_int8"]
    values = {"after_vlmul": t_mul, "after_vladd": t_add, "after_final_vlashr": t_fin, "y_int8": y}
    if not flags:
        return values
    return {
        **values,
        "mul_clipped": p != t_mul,
        "bias_clipped": (t_mul + bias) != t_add,
        "final_clipped": raw_fin != t_fin,  # only left shifts can clip here
        "output_clipped": _output_clipped(t_fin),
    }


def _tail_from_product(p: jax.Array, bias: jax.Array, shr, variant: Variant, *, with_y: bool = True) -> dict:
    """Steps 2 (its saturation) to 5 of §4.1, instruction by instruction, from VLMUL's
    exact rounded product ``p`` (step 5 only ``with_y``: the caller may form it otherwise)."""
    t_mul = vpu._sat_clipped(p, 16)[0]
    t_add = vpu._sat_sum32(t_mul, bias, 16)[0]  # VLADD's value (integer lanes)
    raw_fin = vpu.vlashr_raw(t_add, shr, mode=16, variant=variant)
    t_fin = vpu._sat_clipped(raw_fin, 16)[0]
    steps = {"after_vlmul": t_mul, "after_vladd": t_add, "raw_fin": raw_fin, "after_final_vlashr": t_fin}
    return {**steps, "y_int8": _vdepth8_fixed(t_fin, variant)} if with_y else steps


def _tail_y(p: jax.Array, bias: jax.Array, shr: int, variant: Variant) -> jax.Array:
    """Step 5's int8 value for a known final shift ``shr >= -14``, in fewer operations:
    ``clip(D(S(p + bias)), Y(-32767), Y(32767))`` with ``D(x) = floor((x + 128) / 256)``,
    ``S`` the final VLASHR's shift (:func:`hwjax.xs3._vpu.vlashr_raw`) and ``Y`` the
    instruction-by-instruction steps (:func:`_tail_from_product`) on two products per
    channel.

    Exact: ``Y(p) = c4(D(c3(S(c2(c1(p) + bias)))))``, each ``c`` a clamp (16-bit
    saturation, step 5's int8 range: :func:`_vdepth8_fixed` is ``c4(D(t))`` on 16-bit
    ``t``) and every other map non-decreasing in its argument (an add, a flooring or
    half-up right shift or a left shift that does not overflow, ``D``). For a
    non-decreasing ``g``, ``g(clip(x, lo, hi)) = clip(g(x), g(lo), g(hi))``, so every
    clamp moves to the end: ``Y(p) = clip(F(p), L, H)`` with ``F`` the composition
    without clamps and ``[L, H]`` the image of the clamps, which ``Y`` itself reaches at
    the first clamp's ends (``L = Y(-32767)``, ``H = Y(32767)``). No int32 overflow:
    ``|p| <= 2**16`` (16-bit lanes times a 16-bit multiplier over ``2**14``), so ``|p +
    bias| <= 98305`` and a left shift by up to 14 stays below ``2**31``. (XS3's
    compiled models shift left here: KWS's layers by 3 and 4.)"""
    # Y at both ends in one pass (step 5 as its value on 16-bit t: clip(floor((t + 128) / 256)))
    ends = jnp.stack([jnp.full_like(bias, -32767), jnp.full_like(bias, 32767)])
    t_fin = _tail_from_product(ends, bias, shr, variant, with_y=False)["after_final_vlashr"]
    lo, hi = jnp.clip((t_fin + 128) >> 8, -128, 127)
    f = (vpu.vlashr_raw(p + bias, shr, mode=16, variant=variant) + 128) >> 8
    return jnp.clip(f, lo, hi)


def _initial_int8(acc: jax.Array, initial_shift: jax.Array, variant: Variant) -> dict:
    """Step 1 of §4.1: VLSAT16 by ``max(initial_shift, 0)``, then VLASHR16 by
    ``min(initial_shift, 0)`` (a saturating left shift; by 0 it changes nothing, so
    the assembly's branch on the sign of ``initial_shift`` needs no branch here)."""
    known = vpu.static_shift(initial_shift)
    if known is not None:  # one of the two steps shifts; the other is the identity
        t, clip1 = vpu._sat_clipped(vpu.vlsat_raw(acc, max(known, 0), variant=variant), 16)
        if known >= 0:
            return {"after_vlsat": t, "after_initial_vlashr": t, "initial_clipped": clip1}
        t2, clip2 = vpu._sat_clipped(vpu.vlashr_raw(t, known, mode=16, variant=variant), 16)
        return {"after_vlsat": t, "after_initial_vlashr": t2, "initial_clipped": clip1 | clip2}
    s1 = jnp.asarray(initial_shift, _I32)
    s = jnp.maximum(s1, 0)  # in [0, 16]: VLSAT's shift as read, no shift >= 32
    t, clip1 = vpu._sat_clipped(vpu.vlsat_raw(acc, s, variant=variant), 16)  # vlsat, symmetric
    shr = jnp.minimum(s1, 0)
    t2, clip2 = vpu._sat_clipped(vpu.vlashr_raw(t, shr, mode=16, variant=variant), 16)  # vlashr
    clipped = clip1 | clip2
    return {"after_vlsat": t, "after_initial_vlashr": t2, "initial_clipped": clipped}


def _count_per_channel(flags: jax.Array) -> jax.Array:
    """Number of True entries per output channel (last axis), int32."""
    return flags.reshape((-1, flags.shape[-1])).sum(axis=0, dtype=_I32)


def _outputs(steps: dict, return_stats: bool, flags: bool = True) -> tuple:
    """``(y int8, clipped, [stats])`` of an int8 transform, the forward result of
    :func:`hwjax.core._surrogate.call`: ``clipped`` marks lanes that any step clipped;
    None without ``flags`` (an integer call, whose result drops it; callers that count
    ``return_stats`` pass ``flags=True``, and their steps hold the flags)."""
    y = steps["y_int8"].astype(jnp.int8)
    if not flags:
        return y, None
    clipped = functools.reduce(operator.or_, (steps[k] for k in STAT_KEYS))
    if not return_stats:
        return y, clipped
    return y, clipped, {k: _count_per_channel(steps[k]) for k in STAT_KEYS}


def _finish(steps: dict, return_stats: bool):
    """``y`` or ``(y, stats)`` of an integer-only transform."""
    return S.integer_result(_outputs(steps, return_stats))


# ------------------------------------------------------------------- the surrogates


def _initial_scale(initial_shift, like) -> jax.Array:
    """Step 1's factor ``2**-e``: VLSAT right shifts by ``initial_shift > 0``; VLASHR16
    left shifts by at most 15 (the ``hardware`` cap)."""
    return S.exp2(-jnp.maximum(initial_shift, -15), like)


def _tail_affine(t, mul, bias, final_shr):
    """The real-valued function steps 2–5 approximate: ``(t*mul/2**14 + bias) / 2**(final_shr+8)``
    (a left shift capped at 15 as in VLASHR16)."""
    return (t * mul * 2.0**-14 + bias) * S.exp2(-(jnp.maximum(final_shr, -15) + 8), t)


def int8_surrogate(acc, mul, bias, initial_shift, final_shr):
    """The float affine function :func:`otfn_int8` approximates (its surrogate)."""
    return _tail_affine(acc * _initial_scale(initial_shift, acc), mul, bias, final_shr)


def int8_steps(a, mul, bias, initial_shift, final_shr, *, variant: Variant, flags: bool = True) -> dict:
    """Steps 1–5 of §4.1 on checked int32 operands (see :func:`otfn_int8_steps`); the
    clip flags of steps 2-5 only with ``flags``."""
    a, mul, bias = vpu._i32(a, mul, bias)
    head = _initial_int8(a, initial_shift, variant)
    return {**head, **_tail(head["after_initial_vlashr"], mul, bias, final_shr, variant, flags=flags)}


def int8_forward(variant: Variant, return_stats: bool, *, flags: bool = True):
    """The forward function ``(acc, mul, bias, initial_shift, final_shr)`` of
    :func:`otfn_int8` for :func:`hwjax.core._surrogate.call`. ``flags=False`` (a call
    whose operands are all integers: :func:`clip_flags`) leaves the clip flags out
    unless ``return_stats`` counts them: the values are the same, the program shorter."""
    flags = flags or return_stats

    def forward(a, mul, bias, initial_shift, final_shr):
        steps = int8_steps(a, mul, bias, initial_shift, final_shr, variant=variant, flags=flags)
        return _outputs(steps, return_stats, flags)

    return forward


def clip_flags(*operands) -> bool:
    """Whether a transform's forward needs its clip flags: only for the gradient of
    float (differentiable) operands; :func:`hwjax.core._surrogate.call` drops them for
    integer ones."""
    return S.has_float(*operands)


# --------------------------------------------------------------------- §4.1 otfn_int8


def otfn_int8_steps(
    acc, multipliers, biases, *, initial_shift: int, final_shr: int, variant: Variant = "hardware"
) -> dict[str, jax.Array]:
    """Every intermediate of :func:`otfn_int8` (int32 lane values), keyed as the golden
    ``otfn_int8_chain.json`` columns: ``after_vlsat``, ``after_initial_vlashr``,
    ``after_vlmul``, ``after_vladd``, ``after_final_vlashr``, ``y_int8``; plus boolean
    clip flags ``initial_clipped``, ``mul_clipped``, ``bias_clipped``,
    ``final_clipped``, ``output_clipped`` (same shape as ``acc``).

    ``after_vlsat`` is ``VLSAT16(acc, max(initial_shift, 0))``; ``after_initial_vlashr``
    equals it when ``initial_shift > 0``. Arguments as for :func:`otfn_int8`.
    """
    initial_shift, final_shr = check_int8_config(initial_shift, final_shr, variant)
    a, mul, bias = _checked_int8_operands(acc, multipliers, biases, float_ok=False)
    return _otfn_int8_steps_impl(a, mul, bias, initial_shift, final_shr, variant=variant)


@functools.partial(jax.jit, static_argnames=("variant",))
def _otfn_int8_steps_impl(acc, multipliers, biases, initial_shift, final_shr, *, variant):
    initial_shift, final_shr = check_int8_config(initial_shift, final_shr, variant)
    a, mul, bias = _int8_operands(acc, multipliers, biases, float_ok=False)
    return int8_steps(a, mul, bias, initial_shift, final_shr, variant=variant)


def check_int8_config(initial_shift, final_shr, variant) -> tuple[jax.Array, jax.Array]:
    """Validates the shifts and variant of :func:`otfn_int8`; returns the two shifts
    as int32 scalars (see :func:`_shift` for traced shifts)."""
    vpu._check_variant(variant)
    return (
        _shift(initial_shift, *INITIAL_SHIFT_RANGE, "initial_shift"),
        _shift(final_shr, *FINAL_SHR_RANGE, "final_shr"),
    )


def _int8_operands(acc, multipliers, biases, *, float_ok: bool, channels: int | None = None):
    """``acc`` (..., C) int32 values; ``multipliers``, ``biases`` (C,) int16 values."""
    a = None if acc is None else _acc32(acc, float_ok=float_ok)
    c = a.shape[-1] if channels is None else channels
    return (
        a,
        _channel_param(multipliers, "multipliers", c, float_ok=float_ok),
        _channel_param(biases, "biases", c, float_ok=float_ok),
    )


def otfn_int8(
    acc,
    multipliers,
    biases,
    *,
    initial_shift: int,
    final_shr: int,
    variant: Variant = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """``otfn_int8`` (§4.1): int32 accumulators -> int8, group-wise parameters.

    Per lane (channel c = last axis of ``acc``), in 16-bit mode:

    1. ``initial_shift > 0``: ``t = VLSAT16(acc, initial_shift)``; otherwise
       ``t = VLASHR16(VLSAT16(acc, 0), initial_shift)`` (saturating left shift).
    2. ``t = VLMUL16(t, multipliers[c])`` (Q1.14, round half up; ``v2021`` floors).
    3. ``t = VLADD16(t, biases[c])``.
    4. ``t = VLASHR16(t, final_shr)`` (floors on ``hardware``/``v2021``, rounds half up
       on ``host``).
    5. ``y = clamp(floor((t + 128) / 256), -128, 127)`` (the VDEPTH8_FIXED fix-up).

    Args:
      acc: (..., C) int32 accumulators: an integer array, or a float array holding
        integer values (differentiable).
      multipliers, biases: (C,) int16 values: integer arrays (no gradient) or float
        arrays holding integers (differentiable).
      initial_shift: int in [-16, 16]; final_shr: int in [-16, 15] (the ranges the
        chip's assembly supports; ValueError outside). Either may also be a traced
        int32 scalar (e.g. derived inside ``jit``), which cannot be range-checked and
        is applied as the instructions define it.
      variant: ``"hardware"``, ``"host"`` or ``"v2021"``.
      return_stats: also return per-channel counts (int32, shape (C,)) of lanes that
        saturated in step 1 (``initial_clipped``), 2 (``mul_clipped``), 3
        (``bias_clipped``), 4 (``final_clipped``, left shifts) and 5
        (``output_clipped``), summed over the leading axes.
      saturation_grad: ``"zero"`` (default) or ``"pass"``; see Gradient.

    Returns:
      int8 array shaped like ``acc`` (the float dtype when an input is float; equal
      values), and the stats dict when ``return_stats``.

    Gradient (float inputs): that of the affine function the pipeline approximates,
    ``y ~ (acc * 2**-e1 * multipliers / 2**14 + biases) / 2**(e2 + 8)`` with
    ``e1 = max(initial_shift, -15)``, ``e2 = max(final_shr, -15)`` (rounding
    straight-through; VLASHR16 caps left shifts at 15): ``d/dacc =
    multipliers * 2**-(e1 + 14 + e2 + 8)``, ``d/dmultipliers = acc * 2**-(e1 + 14 + e2
    + 8)``, ``d/dbiases = 2**-(e2 + 8)``; 0 for lanes that any step clipped
    (``saturation_grad="zero"``; ``"pass"`` keeps the affine gradient there).
    """
    initial_shift, final_shr = check_int8_config(initial_shift, final_shr, variant)
    a, mul, bias = _checked_int8_operands(acc, multipliers, biases, float_ok=True)
    return _otfn_int8_impl(
        a,
        mul,
        bias,
        initial_shift,
        final_shr,
        variant=variant,
        return_stats=V.check_flag(return_stats, "return_stats"),
        saturation_grad=saturation_grad,
    )


@eager_program(static_argnames=("variant", "return_stats", "saturation_grad"))
def _otfn_int8_impl(acc, multipliers, biases, initial_shift, final_shr, *, variant, return_stats, saturation_grad):
    initial_shift, final_shr = check_int8_config(initial_shift, final_shr, variant)
    a, mul, bias = _int8_operands(acc, multipliers, biases, float_ok=True)
    return call_with_shifts(
        int8_forward(variant, return_stats, flags=clip_flags(a, mul, bias)),
        int8_surrogate,
        (a, mul, bias),
        (initial_shift, final_shr),
        saturation_grad=saturation_grad,
    )


def call_with_shifts(forward, surrogate, args: tuple, shifts: tuple, *, saturation_grad: SaturationGrad):
    """``S.call(forward, surrogate, *args, *shifts)``, the shifts being the functions' last
    arguments. Where every shift is known while tracing (:func:`hwjax.xs3._vpu.static_shift`:
    a model's lowering passes its layers' shifts as NumPy integers), they are closed over
    as Python ints instead, so each VPU step traces only the form its shift needs; the
    values are the same either way."""
    known = tuple(vpu.static_shift(s) for s in shifts)
    if any(k is None for k in known):
        return S.call(forward, surrogate, *args, *shifts, saturation_grad=saturation_grad)
    return S.call(
        lambda *a: forward(*a, *known), lambda *a: surrogate(*a, *known), *args, saturation_grad=saturation_grad
    )


# --------------------------------------------------------- §4.2 otfn_int8_channelwise


def otfn_int8_channelwise(
    acc,
    shifts,
    multipliers,
    biases,
    *,
    final_shr: int,
    variant: Variant = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """``otfn_int8_channelwise`` (§4.2): as :func:`otfn_int8` but step 1 is always
    ``t = VLSAT16(acc, shifts[c])`` with a per-channel 16-bit shift read unsigned
    (int16 or uint16 values; no left-shift path). Steps 2–5 as in :func:`otfn_int8`.

    Args:
      acc: (..., C) int32 values (integer array, or float array: differentiable).
      shifts: (C,) integer array (no gradient). multipliers, biases: (C,) int16 values
        (integer arrays, or float arrays: differentiable).
      final_shr: in [-16, 15] (or traced, as in :func:`otfn_int8`). variant,
        return_stats, saturation_grad: as in
        :func:`otfn_int8`.

    Returns:
      int8 (the float dtype for float inputs), and stats as in :func:`otfn_int8`
      (step 1 = the VLSAT clip).

    Gradient (float inputs): as :func:`otfn_int8` with ``2**-shifts[c]`` in place of
    ``2**-e1``: ``d/dacc = multipliers * 2**-(shifts + 14 + e2 + 8)``; 0 where any
    step clipped (``saturation_grad="zero"``).
    """
    vpu._check_variant(variant)
    final_shr = _shift(final_shr, *FINAL_SHR_RANGE, "final_shr")
    a = _checked_acc32(acc, float_ok=True)
    c = a.shape[-1]
    sh = _checked_channel_param(shifts, "shifts", c, -(2**15), 2**16 - 1)
    mul = _checked_channel_param(multipliers, "multipliers", c, float_ok=True)
    bias = _checked_channel_param(biases, "biases", c, float_ok=True)
    return _otfn_int8_channelwise_impl(
        a,
        sh,
        mul,
        bias,
        final_shr,
        variant=variant,
        return_stats=V.check_flag(return_stats, "return_stats"),
        saturation_grad=saturation_grad,
    )


@eager_program(static_argnames=("variant", "return_stats", "saturation_grad"))
def _otfn_int8_channelwise_impl(acc, shifts, multipliers, biases, final_shr, *, variant, return_stats, saturation_grad):
    vpu._check_variant(variant)
    final_shr = _shift(final_shr, *FINAL_SHR_RANGE, "final_shr")
    a = _acc32(acc, float_ok=True)
    c = a.shape[-1]
    sh = _channel_param(shifts, "shifts", c, -(2**15), 2**16 - 1) & 0xFFFF
    _, mul, bias = _int8_operands(None, multipliers, biases, float_ok=True, channels=c)

    flags = return_stats or clip_flags(a, mul, bias)

    def forward(a, sh, mul, bias, final_shr):
        a, mul, bias = vpu._i32(a, mul, bias)
        t = vpu.vlsat(a, sh, mode=16, variant=variant)
        steps = _tail(t, mul, bias, final_shr, variant, flags=flags)
        if flags:
            steps["initial_clipped"] = vpu.vlsat_raw(a, sh, variant=variant) != t
        return _outputs(steps, return_stats, flags)

    def surrogate(a, sh, mul, bias, final_shr):
        return _tail_affine(a * S.exp2(-sh, a), mul, bias, final_shr)

    return call_with_shifts(forward, surrogate, (a, sh, mul, bias), (final_shr,), saturation_grad=saturation_grad)


# ------------------------------------------------------------ §4.3 otfn_int8_clamped


def otfn_int8_clamped(
    acc,
    offsets,
    multipliers,
    biases,
    *,
    initial_shift: int,
    final_shr: int,
    variant: Variant = "hardware",
    return_stats: bool = False,
):
    """``otfn_int8_clamped`` (§4.3, after binary convolutions).

    Only the low 16 bits of each accumulator are read (``vR.s16``, signed), so ``acc``
    may be int32 accumulators (the low half is taken) or int16 values. Per lane::

        t = sat16(x + offsets[c])          (VLADD)
        t = max(t, 0)                      (VPOS, 16-bit mode)
        t = VLASHR16(t, initial_shift)     (positive = right shift, floor on hardware)
        then steps 2–5 of otfn_int8

    ``initial_shift`` in [-16, 16], ``final_shr`` in [-16, 15] (or traced, as in
    :func:`otfn_int8`). Returns int8
    (and stats as in :func:`otfn_int8`; ``initial_clipped`` counts the VLADD and
    VLASHR saturations).
    """
    vpu._check_variant(variant)
    initial_shift = _shift(initial_shift, *INITIAL_SHIFT_RANGE, "initial_shift")
    final_shr = _shift(final_shr, *FINAL_SHR_RANGE, "final_shr")
    a = _checked_acc32(acc)
    c = a.shape[-1]
    off = _checked_channel_param(offsets, "offsets", c)
    mul = _checked_channel_param(multipliers, "multipliers", c)
    bias = _checked_channel_param(biases, "biases", c)
    return _otfn_int8_clamped_impl(
        a,
        off,
        mul,
        bias,
        initial_shift,
        final_shr,
        variant=variant,
        return_stats=V.check_flag(return_stats, "return_stats"),
    )


@functools.partial(jax.jit, static_argnames=("variant", "return_stats"))
def _otfn_int8_clamped_impl(acc, offsets, multipliers, biases, initial_shift, final_shr, *, variant, return_stats):
    vpu._check_variant(variant)
    initial_shift = _shift(initial_shift, *INITIAL_SHIFT_RANGE, "initial_shift")
    final_shr = _shift(final_shr, *FINAL_SHR_RANGE, "final_shr")
    a = _acc32(acc)
    x = _low16(a)
    c = a.shape[-1]
    off = _channel_param(offsets, "offsets", c)
    mul = _channel_param(multipliers, "multipliers", c)
    bias = _channel_param(biases, "biases", c)
    t = vpu.vladd(x, off, mode=16, variant=variant)
    clipped = (x + off) != t
    t = vpu.vpos(t, mode=16, variant=variant)
    t2 = vpu.vlashr(t, initial_shift, mode=16, variant=variant)
    clipped = clipped | (vpu.vlashr_raw(t, initial_shift, mode=16, variant=variant) != t2)
    return _finish({"initial_clipped": clipped, **_tail(t2, mul, bias, final_shr, variant)}, return_stats)


def _low16(a: jax.Array) -> jax.Array:
    """``vR.s16``: the low 16 bits of each int32 accumulator, read as int16."""
    return ((a & 0xFFFF) ^ 0x8000) - 0x8000


# -------------------------------------------------------------------- §4.4 otfn_binary


def otfn_binary(acc, thresholds, *, variant: Variant = "hardware") -> jax.Array:
    """``otfn_binary`` (§4.4): one output bit per channel.

    Per lane (channel c): ``bit = 1 if sat16(vR.s16 + thresholds[c]) < 0 else 0``
    (VLADD, then VDEPTH1 over the 16 lanes of a group). ``vR.s16`` is the low half of
    the accumulator read as int16, so ``acc`` may be int32 accumulators or int16
    values. Each group of 16 channels becomes the 16-bit word ``sum_i bit_i 2**i``,
    stored as 2 bytes, little-endian.

    Args:
      acc: (..., C) integer array, C a multiple of 16 (the chip writes whole groups).
      thresholds: (C,) int16 values.
      variant: ``"hardware"``, ``"host"`` or ``"v2021"`` (identical here).

    Returns:
      uint8 array (..., C // 8): the bytes the chip writes. Integer inputs only.
    """
    vpu._check_variant(variant)
    a = _checked_acc32(acc)
    c = a.shape[-1]
    if c % EPV16:
        raise ShapeError(f"acc must have a multiple of {EPV16} channels (whole 16-lane groups), got {c}")
    thr = _checked_channel_param(thresholds, "thresholds", c)
    return _otfn_binary_impl(a, thr, variant=variant)


@functools.partial(jax.jit, static_argnames=("variant",))
def _otfn_binary_impl(acc, thresholds, *, variant):
    vpu._check_variant(variant)
    a = _acc32(acc)
    c = a.shape[-1]
    if c % EPV16:
        raise ShapeError(f"acc must have a multiple of {EPV16} channels (whole 16-lane groups), got {c}")
    thr = _channel_param(thresholds, "thresholds", c)
    t = vpu.vladd(_low16(a), thr, mode=16, variant=variant)
    words = vpu.vdepth1(t.reshape(a.shape[:-1] + (c // EPV16, EPV16)), mode=16, variant=variant)
    return jnp.stack([words & 0xFF, (words >> 8) & 0xFF], axis=-1).reshape(a.shape[:-1] + (c // 8,)).astype(jnp.uint8)


# -------------------------------------------------------------------- serialisation


def serialise_output_transform(
    multipliers, biases, *, leading=None, pad_value: int = 0, pad_final_access: bool = True
) -> np.ndarray:
    """The int16 parameter memory that the output transforms read (§4.1, §4.2, §4.3).

    Channels go in groups of 16. For each full group g: the group's 16 ``leading``
    values (if given: channel-wise shifts §4.2 or clamped offsets §4.3), then its 16
    ``multipliers``, then its 16 ``biases``. The last group (n = C - 16*(G-1)
    channels) stores n of each, so its group starts at int16 offset 32*g (48*g with
    ``leading``) and its biases start n elements after its multipliers.

    With ``pad_final_access`` (lib_nn's ``pad_final_access(vec, 16, pad_value)``) the
    array is extended with ``pad_value`` by ``(16 - (len // 2) % 16) % 16`` elements,
    so the last group's 16-lane bias load (two arrays: 16 - n elements) stays inside
    it. The golden ``multipliers_and_biases_serialised`` is the unpadded prefix.

    Args:
      multipliers, biases (and ``leading``): (C,) int16 values (concrete arrays).
      pad_value: int16 pad value.
      pad_final_access: append the padding.

    Returns:
      NumPy int16 array.
    """
    cols = ([] if leading is None else [("leading", leading)]) + [("multipliers", multipliers), ("biases", biases)]
    arrays = []
    for name, a in cols:
        if isinstance(a, jax.core.Tracer):
            raise ArgTypeError(f"{name} must be concrete: serialisation builds a memory image")
        a = np.asarray(a)
        if not np.issubdtype(a.dtype, np.integer):
            raise ArgTypeError(f"{name} must be an integer array (int16 values), got dtype {a.dtype}")
        if a.ndim != 1:
            raise ShapeError(f"{name} must be 1-D (one value per output channel), got shape {a.shape}")
        V.check_range(a, -(2**15), 2**16 - 1 if name == "leading" else 2**15 - 1, name)
        arrays.append(a.astype(np.int64))
    c = arrays[-1].size
    for (name, _), a in zip(cols, arrays):
        if a.size != c:
            raise ShapeError(f"all parameter arrays must have the same length: {name} has {a.size} values, biases {c}")
    pad_value = V.check_static_int(pad_value, -(2**15), 2**15 - 1, "pad_value")
    pad_final_access = V.check_flag(pad_final_access, "pad_final_access")
    parts = [a[g : g + EPV16] for g in range(0, c, EPV16) for a in arrays]
    out = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if pad_final_access:
        out = np.concatenate([out, np.full((EPV16 - (out.size // 2) % EPV16) % EPV16, pad_value)])
    return ((out + 2**15) % 2**16 - 2**15).astype(np.int16)  # uint16 shifts as their int16 bits


def deserialise_output_transform(memory, channels: int, *, with_leading: bool = False) -> dict[str, Any]:
    """Inverse of :func:`serialise_output_transform` (trailing padding ignored).

    Returns ``{"multipliers", "biases"}`` (and ``"leading"`` when ``with_leading``) as
    NumPy int16 arrays of length ``channels``.
    """
    channels = V.check_static_int(channels, 0, 2**31 - 1, "channels")
    with_leading = V.check_flag(with_leading, "with_leading")
    if isinstance(memory, jax.core.Tracer):
        raise ArgTypeError("memory must be concrete: deserialisation reads a memory image")
    with evaluated_if_concrete(memory):  # a host read, also when called inside a trace
        mem = np.asarray(V.as_array(memory, "memory"))
        if not np.issubdtype(mem.dtype, np.integer):
            raise ArgTypeError(f"memory must be an integer array (int16 values), got dtype {mem.dtype}")
        V.check_range(mem, -(2**15), 2**15 - 1, "memory")
    names = (["leading"] if with_leading else []) + ["multipliers", "biases"]
    k = len(names)
    if mem.size < k * channels:
        raise ShapeError(f"memory holds {mem.size} values, fewer than the {k * channels} of {channels} channels")
    out: dict[str, list] = {n: [] for n in names}
    pos = 0
    for g in range(0, channels, EPV16):
        n = min(EPV16, channels - g)
        for name in names:
            out[name].append(mem[pos : pos + n])
            pos += n
    return {n: (np.concatenate(v) if v else np.zeros(0)).astype(np.int16) for n, v in out.items()}


# ------------------------------------------------------- §4.5 xformer parameter recipe


def _frexp_exp(v) -> int:
    """``e`` with ``v = f * 2**e``, 0.5 <= |f| < 1 (frexp); v != 0."""
    return int(np.frexp(np.float64(v))[1])


def _fits16(v: int) -> bool:
    return -(2**15) <= v <= 2**15 - 1


def _sig_bits(v: int) -> int:
    """Bits of a two's-complement representation of ``v`` (sign included)."""
    return (v if v >= 0 else ~v).bit_length() + 1


def _scale_accu(a: int, A: int) -> int:
    """``accu16``: ``a * 2**A`` for A >= 0, ``rshr(a, -A)`` for A < 0."""
    return a << A if A >= 0 else (a + (1 << (-A - 1))) >> -A


def _rint(x: float) -> int:
    return int(np.rint(x))


def _check_transform(m, beta, amin, amax) -> tuple[np.ndarray, ...]:
    """The per-channel canonical transform ``(m, beta, amin, amax)`` of §4.5 as NumPy
    arrays (float64, float64, int64, int64) of one length, each checked by name: finite
    floats, and integer accumulator bounds within int32 with ``amin <= amax``."""
    out = []
    for v, name, integer in ((m, "m", False), (beta, "beta", False), (amin, "amin", True), (amax, "amax", True)):
        if v is None or isinstance(v, (str, bytes, dict)):
            raise ArgTypeError(f"{name} must be a 1-D array of numbers, got {v!r}")
        try:
            a = np.asarray(v)
        except (TypeError, ValueError):
            raise ArgTypeError(f"{name} must be a 1-D array of numbers, got {v!r}") from None
        if a.dtype.kind not in "iuf" or a.ndim != 1:
            raise ArgTypeError(f"{name} must be a 1-D array of numbers, got dtype {a.dtype} and shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise RangeError(f"{name} must be finite, got {a}")
        if integer:
            if a.dtype.kind == "f" and np.any(a != np.floor(a)):
                raise RangeError(f"{name} must hold integers, got {a}")
            if np.any(np.abs(a) > 2**31):
                raise RangeError(f"{name} must lie in [-2**31, 2**31], got {a}")
        out.append(a.astype(np.int64 if integer else np.float64))
    if len({a.shape for a in out}) != 1:
        raise ShapeError(f"m, beta, amin and amax must have one length each, got {[a.shape for a in out]}")
    if np.any(out[2] > out[3]):
        raise RangeError(f"amin must not exceed amax, got {out[2]} and {out[3]}")
    return tuple(out)


def narrow_accu_range(m, beta, amin, amax):
    """§4.5 step 2: keep the accumulators whose output is not clamped to [-128, 127],
    as lib_nn's ``backprop_output_clamps_to_accu_limits`` does.

    Args: ``m``, ``beta`` the channels' multipliers and offsets (float32 values, as
    :func:`canonical_transform` makes them), ``amin``, ``amax`` their integer accumulator
    ranges (1-D, one length). Per channel with ``m != 0``: ``hi = (127 - beta) / m`` and
    ``lo = (-128 - beta) / m`` in float64, rounded to float32 (lib_nn's ``round_up`` /
    ``round_down`` take a float), then ``amax' = min(amax, ceil(hi))``,
    ``amin' = max(amin, floor(lo))`` (ends sorted). When ``amax' <= amin'`` or ``m == 0``
    the channel is constant: ``beta = clip(trunc(beta), -128, 127)`` (C's ``(int32_t)``
    conversion; beyond int32, x86's -2**31), ``m = 0``, range [0, 0] (for ``m == 0``, as
    xformer's blobs show for its zero-scale pad channels, beta is ``z_out``). Returns (m, beta, amin, amax) as float64 / int64 arrays. Host (NumPy)
    only; bad arguments raise :mod:`hwjax.errors` exceptions naming them.
    """
    m, beta, amin, amax = _check_transform(m, beta, amin, amax)
    m, beta = m.copy(), beta.copy()
    amin, amax = amin.copy(), amax.copy()
    for c in range(m.size):
        lo = hi = 0
        if m[c] != 0:
            ends = sorted(float(np.float32((v - beta[c]) / m[c])) for v in (-128.0, 127.0))
            lo, hi = max(amin[c], int(np.floor(ends[0]))), min(amax[c], int(np.ceil(ends[1])))
        if m[c] == 0 or hi <= lo:
            b = beta[c]
            const = int(np.trunc(b)) if -(2.0**31) < b < 2.0**31 else -(2**31)
            m[c], beta[c], amin[c], amax[c] = 0.0, float(min(max(const, -128), 127)), 0, 0
        else:
            amin[c], amax[c] = lo, hi
    return m, beta, amin, amax


def canonical_transform(
    bias_q, weights, s_in: float, z_in: int, s_w, s_out: float, z_out: int, *, multiplier_factor=None, what=None
) -> tuple[np.ndarray, ...]:
    """§4.5 steps 1–2 as xformer 1.4.2 evaluates them on the host.

    Inputs as :func:`otfn_params_from_scales`'s (``weights`` (C_out, ...) int8 values,
    flattened per channel; ``bias_q`` (C_out,) int32; ``s_w`` scalar or (C_out,)):
    ``m = float32(double(s_in) * s_w / s_out)`` (the correctly rounded float32 quotient:
    the double product is exact and the double rounding innocuous), optionally clamped to
    ``min(m) * multiplier_factor``; ``beta = float32(float32(float32(n) * m) + z_out)``
    with ``n = bias_q - z_in * sum_k w`` (C++ ``int * float + int``: float32 steps);
    ``accu_max = sum_k (w > 0 ? 127w : -128w)``, ``accu_min = sum_k (w > 0 ? -128w :
    127w)``; then :func:`narrow_accu_range`. Returns (m, beta, amin, amax) as float64 /
    int64 arrays. Host (NumPy) only; bad arguments raise :mod:`hwjax.errors` exceptions
    naming them.
    """
    what = what or "canonical_transform"
    w = _bso._host_array(weights, "weights", what)
    if not np.issubdtype(w.dtype, np.integer) or w.ndim < 1:
        raise ArgTypeError(f"weights must be an integer array (C_out, ...) of int8 values, got {w.dtype}")
    V.check_range(w, -128, 127, "weights (int8 values)")
    c_out = w.shape[0]
    w2 = w.reshape(c_out, -1).astype(np.int64)
    bq = _bso._host_array(bias_q, "bias_q", what)
    if not np.issubdtype(bq.dtype, np.integer):
        raise ArgTypeError(f"bias_q must be an integer array of shape ({c_out},), got dtype {bq.dtype}")
    if bq.shape != (c_out,):
        raise ShapeError(f"bias_q must be an integer array of shape ({c_out},), got shape {bq.shape}")
    V.check_range(bq, -(2**31), 2**31 - 1, "bias_q (int32)")
    z_in = _bso._host_int_scalar(z_in, "z_in", -128, 127, what)
    z_out = _bso._host_int_scalar(z_out, "z_out", -128, 127, what)
    s_in, s_out = _bso._host_scale(s_in, "s_in", what), _bso._host_scale(s_out, "s_out", what)
    sw = np.asarray(_bso._host_scales(s_w, "s_w", c_out, what), np.float32)
    if multiplier_factor is not None:
        multiplier_factor = _bso._host_scale(multiplier_factor, "multiplier_factor", what)
    weights, bias_q = w2, bq.astype(np.int64)
    m = (np.float64(s_in) * sw.astype(np.float64) / np.float64(s_out)).astype(np.float32)
    if multiplier_factor is not None:
        m = np.minimum(m, np.float32(m.min() * np.float32(multiplier_factor)))
    n = (bias_q - int(z_in) * weights.sum(axis=1)).astype(np.float32)
    beta = (n * m).astype(np.float32) + np.float32(z_out)
    amax = np.where(weights > 0, 127 * weights, -128 * weights).sum(axis=1)
    amin = np.where(weights > 0, -128 * weights, 127 * weights).sum(axis=1)
    return narrow_accu_range(m.astype(np.float64), beta.astype(np.float64), amin, amax)


def solve_exponents(m, beta, amin, amax, max_steps: int = 512) -> tuple[int, int]:
    """§4.5 step 3: the accumulator exponent A and multiplier exponent M (B = A + M - 14)
    of the narrowed transform (:func:`narrow_accu_range`), searched for at most
    ``max_steps`` steps. Host (NumPy) only; bad arguments raise :mod:`hwjax.errors`
    exceptions naming them."""
    m, beta, amin, amax = _check_transform(m, beta, amin, amax)
    max_steps = V.check_static_int(max_steps, 1, 2**20, "max_steps")
    accus = [int(v) for v in np.concatenate([amin, amax]) if v != 0]
    muls = [float(v) for v in m if v != 0]
    if not accus or not muls:
        return 0, 14
    A = 15 - max(_frexp_exp(v) for v in accus)
    M = 15 - max(_frexp_exp(v) for v in muls)
    accu_bits = max(_sig_bits(_scale_accu(v, A)) for v in accus)
    mul_bits = max(_sig_bits(_rint(np.ldexp(v, M))) for v in muls)
    for _ in range(max_steps):
        retry = None
        for c in range(m.size):
            ends = (_scale_accu(int(amin[c]), A), _scale_accu(int(amax[c]), A))
            if not all(_fits16(e) for e in ends):
                retry = "A"
                break
            mul16 = _rint(np.ldexp(m[c], M))
            if not _fits16(mul16):
                retry = "M"
                break
            b16 = _rint(np.ldexp(beta[c], A + M - 14))
            ps = [(e * mul16 + (1 << 13)) >> 14 for e in ends]
            if not all(_fits16(v) for v in ps + [p + b16 for p in ps] + [b16]):
                retry = "A" if (A >= 0 or accu_bits > mul_bits) else "M"
                break
        if retry is None:
            return A, M
        if retry == "A":
            A, accu_bits = A - 1, accu_bits - 1
        else:
            M, mul_bits = M - 1, mul_bits - 1
    raise RangeError("no accumulator/multiplier exponents satisfy the otfn_int8 constraints")


def otfn_params_from_scales(
    bias_q, weights, s_in: float, z_in: int, s_w, s_out: float, z_out: int, *, multiplier_factor: float | None = None
) -> dict[str, Any]:
    """Group-wise :func:`otfn_int8` parameters as xformer derives them (§4.5).

    Inputs (per output channel c): ``bias_q[c]`` (TFLite int32 bias), ``weights``
    (C_out, ...) int8 (flattened per channel), input scale/zero point ``s_in, z_in``,
    weight scale ``s_w`` (scalar or (C_out,)), output ``s_out, z_out``. Steps:

    1.–2. :func:`canonical_transform`: ``m_c = float32(s_in * s_w[c] / s_out)``
       correctly rounded (with ``multiplier_factor``, xformer's
       ``--xcore-conv-multiplier-factor``, default None = UINT32_MAX = no clamp,
       ``m_c = min(m_c, min_c(m_c) * factor)``); ``beta_c = (bias_q[c] - z_in *
       sum_k w[c,k]) * m_c + z_out`` in float32 steps; the accumulator range narrowed by
       :func:`narrow_accu_range` (float32-rounded ends; a range of at most one value
       makes the channel constant: m = 0, beta = ``clip(trunc(beta), -128, 127)``).
    3. Exponents A (accumulator), M (multiplier), B = A + M - 14: start at
       ``A = 15 - max e(accu)``, ``M = 15 - max e(m)`` (frexp exponents over non-zero
       range ends / multipliers; A = 0, M = 14 when there are none). Repeat over the
       channels in order until all pass, with ``accu16 = accu * 2**A`` (A >= 0) or
       ``rshr(accu, -A)``: decrement A if an ``accu16`` end leaves int16; decrement M if
       ``rint(m * 2**M)`` does; else with ``b16 = rint(beta * 2**B)`` and
       ``p = rshr(accu16 * mul16, 14)`` at both ends, if any of p, p + b16, b16 leaves
       int16, decrement A when ``A >= 0`` or the accumulator needs more significant
       bits than the multiplier, else M. "Significant bits" (the spec leaves it open)
       are tracked as in lib_nn's earlier solver: the largest two's-complement width
       of the ``accu16`` ends (of ``rint(m * 2**M)``) at the starting exponents,
       decremented with every decrement of A (of M).
    4. ``initial_shift = -A``, ``final_shr = B - 8``,
       ``multipliers[c] = clip(rint(m_c * 2**M), -32768, 32767)``,
       ``biases[c] = clip(rint(beta_c * 2**B - 1), -32768, 32767)`` for B >= 0 (one LSB
       compensates the double rounding of steps 4–5 of §4.1); for B < 0 (not covered by
       the spec) ``rint(beta_c * 2**B)``.

    ``rint`` rounds half to even. The error check and channel-wise fallback of §4.5
    step 5 are not performed. Raises ValueError when the resulting shifts leave the
    supported ranges (initial_shift in [-16, 16], final_shr in [-16, 15]).

    Returns:
      dict with ``multipliers``, ``biases`` (NumPy int16, (C_out,)), ``initial_shift``,
      ``final_shr`` (ints) and the exponents ``A``, ``M``, ``B``.
    """
    m, beta, amin, amax = canonical_transform(
        bias_q,
        weights,
        s_in,
        z_in,
        s_w,
        s_out,
        z_out,
        multiplier_factor=multiplier_factor,
        what="otfn_params_from_scales",
    )
    A, M = solve_exponents(m, beta, amin, amax)
    B = A + M - 14
    initial_shift, final_shr = -A, B - 8
    _shift(initial_shift, *INITIAL_SHIFT_RANGE, "initial_shift (= -A)")
    _shift(final_shr, *FINAL_SHR_RANGE, "final_shr (= B - 8)")
    mul = np.clip(np.rint(np.ldexp(m, M)), -(2**15), 2**15 - 1)
    bias = np.rint(np.ldexp(beta, B) - 1) if B >= 0 else np.rint(np.ldexp(beta, B))
    return {
        "multipliers": mul.astype(np.int16),
        "biases": np.clip(bias, -(2**15), 2**15 - 1).astype(np.int16),
        "initial_shift": initial_shift,
        "final_shr": final_shr,
        "A": A,
        "M": M,
        "B": B,
    }
