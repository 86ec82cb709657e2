"""LiteRT's x86 int8 paths that differ from its reference kernels, for ADD and QUANTIZE
(int8 -> int8): the XNNPACK delegate's ``qs8`` add and ``qs8 -> qs8`` convert, and the
builtin *optimized* kernels, whose vector loops LiteRT compiles on x86 from NEON
intrinsics emulated with SSE (``NEON_2_SSE``). Spec gemmlowp.md §2.9 (R4: XNNPACK).

Host recipes (``*_params``) derive the integer parameters once, as the runtime's C does
(float32 arithmetic where XNNPACK uses ``float``: numpy float32 operations are IEEE
round-to-nearest-even, ``lrintf`` is ``np.rint``; float64 where LiteRT uses ``double``).
The kernels (``*_int``) are exact int32 JAX, elementwise, jittable and ``vmap``-able, and
do not depend on ``jax_enable_x64``. Every kernel takes arrays of shape
``(batch, *example_shape)``: LiteRT's optimized loops treat the first ``16 * (N // 16)``
elements of each example (``N`` its element count, row-major) in vector registers and the
rest with the scalar reference code, so the arithmetic depends on the flat index within
one example (:func:`vector_lanes`).

What each runtime runs (``ai-edge-litert`` 2.3.0, x86-64, verified against it):

* ADD, ``"optimized"``: :func:`neon_add_int`. ``"xnnpack"``: the delegate takes the node
  when ``fl32(s_i / s_out)`` is in ``[2**-10, 2**8)`` for both inputs
  (:func:`xnn_add_delegated`), then :func:`xnn_add_int`; otherwise the optimized kernel.
* QUANTIZE int8 -> int8, ``"optimized"``: :func:`neon_requantize_int`. ``"xnnpack"``:
  delegated when ``fl32(s_in / s_out)`` is in ``[2**-8, 2**7]`` (:func:`xnn_cvt_delegated`),
  then :func:`xnn_cvt_int`; otherwise the optimized kernel.
* AVERAGE_POOL_2D int8 is never delegated (the delegate takes float pools only): every
  runtime runs LiteRT's integer average pool (``hwjax.tflite.avgpool_int``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hwjax.errors import RangeError, ShapeError, UnsupportedOpError
from hwjax.core import eager_program
from hwjax.core import validate as V
from hwjax.litert._arith import (
    INT32_MAX,
    INT32_MIN,
    check_act_range,
    check_int_array,
    check_ints,
    check_params,
    check_scale,
    check_zero_point,
    activation_range,
    params_used,
    quantize_multiplier,
    rdbpot32,
    shift_half_up32,
    srdhm32,
)
from hwjax.litert._kernels import ADD_KEYS, add_params, check_add_operands

_I32 = jnp.int32
_RUNTIMES = ("optimized", "xnnpack")  # the runtimes whose ADD / QUANTIZE differ from the reference kernels
#: elements per iteration of LiteRT's optimized (NEON / NEON_2_SSE) int8 ADD and Requantize loops
VECTOR_BLOCK = 16


# ---------------------------------------------------------------------------- helpers


def vector_lanes(shape, block: int = VECTOR_BLOCK) -> np.ndarray:
    """Boolean numpy array of ``shape`` (one example): True where the row-major flat index
    is below ``block * (N // block)`` (``N = prod(shape)``), the elements LiteRT's optimized
    loop computes in vector registers; False for the scalar tail."""
    n = int(np.prod(shape, dtype=np.int64))
    return (np.arange(n) < block * (n // block)).reshape(shape)


def _by_lanes(shape, vec, tail):
    """``vec()`` on the vector-loop elements of each example and ``tail()`` on the rest
    (:func:`vector_lanes` of ``shape``); a path no element takes is not traced."""
    lanes = vector_lanes(shape)
    if lanes.all():
        return vec()
    if not lanes.any():
        return tail()
    return jnp.where(lanes, vec(), tail())


def _f32(v) -> np.float32:
    return np.float32(np.asarray(v, np.float32).reshape(()))


def xnn_qs8_quantize(value: float, scale, zero_point) -> int:
    """XNNPACK's ``xnn_qs8_quantize``: ``lrintf(min(max(fl32(fl32(value / scale) + zp), -128),
    127))`` in float32 (ties to even); ``value`` may be +-inf. Host; a Python int."""
    v = np.float32(np.float32(value) / _f32(scale))
    v = np.float32(v + np.float32(int(zero_point)))
    return int(np.rint(np.minimum(np.maximum(v, np.float32(-128.0)), np.float32(127.0))))


def _vshl(x, n):
    """NEON ``VSHL`` by a signed count ``n`` (``|n| < 32``): ``x << n`` (wrapping) for
    ``n >= 0``, the arithmetic (flooring) ``x >> -n`` otherwise."""
    n = jnp.asarray(n, _I32)
    return jnp.where(n >= 0, x << jnp.maximum(n, 0), x >> jnp.maximum(-n, 0))


# ---------------------------------------------------------------------------------- ADD


def xnn_add_delegated(s1, s2, s_out) -> bool:
    """Whether LiteRT's XNNPACK delegate takes an int8 ADD: both ``fl32(s_i / s_out)`` in
    ``[1/1024, 256)`` (float32 division and comparison, as the delegate checks)."""
    so = _f32(s_out)
    return all(np.float32(1.0 / 1024.0) <= np.float32(_f32(s) / so) < np.float32(256.0) for s in (s1, s2))


def xnn_add_params(s1, z1, s2, z2, s_out, z_out, activation=None) -> dict[str, np.ndarray]:
    """XNNPACK's ``qs8`` add parameters (``xnn_init_qs8_add_minmax_scalar_params``), float32:

    * ``r_i = fl32(s_i / s_out)``; ``shift = 20 - (unbiased float32 exponent of max(r_1, r_2))``
      (12..30 inside the delegated range);
    * ``a_mult = lrintf(r_1 * 2**shift)``, ``b_mult = lrintf(r_2 * 2**shift)`` (exact scaling,
      ties to even; the larger in ``[2**20, 2**21]``);
    * ``bias = 2**(shift - 1) - a_mult * z1 - b_mult * z2``;
    * the fused activation's bounds by :func:`xnn_qs8_quantize` of its float range
      (``relu``: ``[0, inf)``; ``relu6``: ``[0, 6]``; ``relu_n1_to_1``: ``[-1, 1]``).

    Raises RangeError outside the delegated range (:func:`xnn_add_delegated`). Host; int32
    numpy scalars ``a_mult``, ``b_mult``, ``bias``, ``shift``, ``act_min``, ``act_max``.
    """
    if not xnn_add_delegated(s1, s2, s_out):
        raise RangeError(
            f"XNNPACK add: input/output scale ratios {float(_f32(s1) / _f32(s_out))}, "
            f"{float(_f32(s2) / _f32(s_out))} are outside [2**-10, 2**8)"
        )
    so = _f32(s_out)
    r1, r2 = np.float32(_f32(s1) / so), np.float32(_f32(s2) / so)
    top = max(r1, r2)
    exponent = int((np.asarray(top, np.float32).view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)) - 127
    shift = 20 - exponent
    a = int(np.rint(np.float32(r1 * np.float32(2.0**shift))))
    b = int(np.rint(np.float32(r2 * np.float32(2.0**shift))))
    bias = (1 << (shift - 1)) - a * int(z1) - b * int(z2)
    if activation not in _FLOAT_RANGES:
        raise RangeError(f"activation must be one of {tuple(_FLOAT_RANGES)}, got {activation!r}")
    lo, hi = (xnn_qs8_quantize(v, s_out, z_out) for v in _FLOAT_RANGES[activation])
    return {k: np.int32(v) for k, v in dict(a_mult=a, b_mult=b, bias=bias, shift=shift, act_min=lo, act_max=hi).items()}


def xnn_add_int(x1, x2, p, zout):
    """XNNPACK ``qs8`` add (``xnn_qs8_vadd_minmax`` kernels):
    ``clamp(clamp(((bias + x1 a_mult + x2 b_mult) >> shift) + zout, -128, 127), act_min, act_max)``
    with an arithmetic (flooring) shift; the int32 sum cannot overflow in the delegated range
    (``|.| < 2**30 + 2**29``). ``p`` from :func:`xnn_add_params`."""
    acc = p["bias"] + x1 * p["a_mult"] + x2 * p["b_mult"]
    y = jnp.clip((acc >> p["shift"]) + zout, -128, 127)
    return jnp.clip(y, p["act_min"], p["act_max"])


def litert_add_params(s1, s2, s_out) -> dict[str, np.ndarray]:
    """LiteRT's int8 ADD parameters (``add.cc``), :func:`hwjax.tflite.add_params`; raises
    UnsupportedOpError when the output multiplier ``2 max(s1, s2) / (2**20 s_out)`` is not
    below 1 (``QuantizeMultiplierSmallerThanOneExp`` aborts LiteRT there)."""
    p = add_params(s1, s2, s_out)
    if int(p["eo"]) > 0:
        raise UnsupportedOpError(
            f"ADD: input/output scale ratio {max(float(s1), float(s2)) / float(s_out)} "
            "is 2**19 or more; LiteRT rejects it"
        )
    return p


def neon_add_int(x1, x2, p, z1, z2, zout, act_min, act_max):
    """LiteRT's optimized int8 ADD on x86 (``AddElementwiseInt8``), ``p`` from
    :func:`litert_add_params` (left shift 20, ``e1, e2, eo <= 0``).

    Vector elements (:func:`vector_lanes`)::

        t_i = SRDHM(VSHL(x_i - z_i, 20 + e_i), m_i)       (VSHL: << or flooring >>)
        o   = RDBPOT(SRDHM(wrap32(t_1 + t_2), mo), -eo)
        y   = clamp(sat8(wrap16(wrap16(o) + zout)), act_min, act_max)

    (the sum narrowed to int16 by truncation before the zero point is added); the scalar
    tail is the reference kernel (:func:`hwjax.tflite.add_int`: the same without the
    ``20 + e_i`` shortcut, ``t_i = RDBPOT(SRDHM((x_i - z_i) 2**20, m_i), -e_i)``, and
    without the int16 narrowing).
    """
    d1, d2 = x1 - z1, x2 - z2

    def vec():
        t1 = srdhm32(_vshl(d1, 20 + p["e1"]), p["m1"])
        t2 = srdhm32(_vshl(d2, 20 + p["e2"]), p["m2"])
        o = rdbpot32(srdhm32(t1 + t2, p["mo"]), -p["eo"])
        o16 = ((o + 0x8000) & 0xFFFF) - 0x8000
        return jnp.clip(((o16 + zout + 0x8000) & 0xFFFF) - 0x8000, -128, 127)

    def tail():  # reference_integer_ops::Add (MultiplyByQuantizedMultiplierSmallerThanOneExp)
        u1 = rdbpot32(srdhm32(d1 << 20, p["m1"]), -p["e1"])
        u2 = rdbpot32(srdhm32(d2 << 20, p["m2"]), -p["e2"])
        return jnp.clip(rdbpot32(srdhm32(u1 + u2, p["mo"]), -p["eo"]), -(2**30), 2**30) + zout

    return jnp.clip(_by_lanes(x1.shape[1:], vec, tail), act_min, act_max)


# ------------------------------------------------------------------- QUANTIZE int8->int8


def xnn_cvt_delegated(s_in, s_out) -> bool:
    """Whether LiteRT's XNNPACK delegate takes an int8 -> int8 QUANTIZE:
    ``fl32(s_in / s_out)`` in ``[1/256, 128]`` (float32)."""
    r = np.float32(_f32(s_in) / _f32(s_out))
    return bool(np.float32(1.0 / 256.0) <= r <= np.float32(128.0))


def xnn_cvt_params(s_in, s_out) -> dict[str, np.ndarray]:
    """XNNPACK ``qs8 -> qs8`` convert (``xnn_init_qs8_cvt_scalar_params``):
    ``multiplier = lrintf(256 * fl32(s_in / s_out))`` (float32, ties to even; 1..32768 in
    the delegated range, else RangeError). Host; ``{"cvt_mult": int32}``."""
    if not xnn_cvt_delegated(s_in, s_out):
        raise RangeError(f"XNNPACK convert: scale ratio {float(_f32(s_in) / _f32(s_out))} is outside [2**-8, 2**7]")
    r = np.float32(_f32(s_in) / _f32(s_out))
    return {"cvt_mult": np.int32(np.rint(np.float32(np.float32(256.0) * r)))}


def xnn_cvt_int(x, zin, zout, mult):
    """XNNPACK ``qs8 -> qs8`` convert (``xnn_qs8_vcvt`` kernels; on AVX2 a rounding int16
    high multiply of ``(zin - x) << 7`` by ``-mult``, the same integer):
    ``clamp(floor(((x - zin) mult + 128) / 256) + zout, -128, 127)``."""
    return jnp.clip((((x - zin) * mult + 128) >> 8) + zout, -128, 127)


def neon_requantize_int(x, m, e, zin, zout):
    """LiteRT's optimized int8 -> int8 ``Requantize`` on x86 (``m, e`` =
    ``QuantizeMultiplier(double(s_in) / double(s_out))``).

    Vector elements (:func:`vector_lanes`), ``MultiplyByQuantizedMultiplier4Rows``::

        clamp(shift_half_up(SRDHM((x - zin) << max(e, 0), m), max(-e, 0)) + zout, -128, 127)

    with the right shift rounding ties toward +inf (``VRSHL``); the scalar tail is the
    reference ``MultiplyByQuantizedMultiplier`` (ties away from zero).
    """
    d = x - zin
    t = srdhm32(d << jnp.maximum(e, 0), m)
    rs = jnp.maximum(-e, 0)
    v = _by_lanes(x.shape[1:], lambda: shift_half_up32(t, rs), lambda: rdbpot32(t, rs))
    return jnp.clip(jnp.clip(v, -(2**30), 2**30) + zout, -128, 127)


def requant_jax(x, p, runtime: str):
    """QUANTIZE int8 -> int8 as ``runtime`` (``"optimized"`` or ``"xnnpack"``) runs it, ``p``
    with ``m, e, zin, zout`` (LiteRT) and, for ``"xnnpack"``, ``cvt_mult`` and ``xnn``
    (1 where the delegate takes the node)."""
    V.check_choice(runtime, _RUNTIMES, "runtime")
    x = check_int_array(x, "x", -128, 255)  # a QUANTIZE may read a uint8 tensor
    if x.ndim < 1:
        raise ShapeError(f"x must have a leading batch axis, got shape {x.shape}")
    check_params(p, "p", ("m", "e", "zin", "zout") + (("cvt_mult", "xnn") if runtime == "xnnpack" else ()))
    check_ints(p["m"], "p['m']", INT32_MIN, INT32_MAX)
    check_ints(p["e"], "p['e']", -31, 31)
    check_zero_point(p["zin"], "p['zin']")
    check_zero_point(p["zout"], "p['zout']")
    keys = ("m", "e", "zin", "zout") + (("cvt_mult", "xnn") if runtime == "xnnpack" else ())
    return _requant_jax(x, params_used(p, keys), runtime)


@eager_program(static_argnames=("runtime",))
def _requant_jax(x, p, runtime: str):
    y = neon_requantize_int(x, p["m"], p["e"], p["zin"], p["zout"])
    if runtime == "xnnpack":
        y = jnp.where(p["xnn"] != 0, xnn_cvt_int(x, p["zin"], p["zout"], p["cvt_mult"]), y)
    return y


def add_jax(x1, x2, p, runtime: str):
    """ADD as ``runtime`` (``"optimized"`` or ``"xnnpack"``) runs it; ``p`` holds the LiteRT
    parameters (:func:`litert_add_params`, ``z1, z2, zout, act_min, act_max``) and, for
    ``"xnnpack"``, the XNNPACK ones prefixed ``xnn_`` and ``xnn`` (1 where delegated)."""
    V.check_choice(runtime, _RUNTIMES, "runtime")
    x1, x2 = check_add_operands(x1, x2)
    if x1.ndim < 1:
        raise ShapeError(f"x1 must have a leading batch axis, got shape {x1.shape}")
    xnn = ("xnn",) + tuple("xnn_" + k for k in ("a_mult", "b_mult", "bias", "shift", "act_min", "act_max"))
    check_params(p, "p", ADD_KEYS + ("z1", "z2", "zout", "act_min", "act_max") + (xnn if runtime == "xnnpack" else ()))
    for k in ADD_KEYS:
        check_ints(p[k], f"p['{k}']", INT32_MIN, INT32_MAX)
    for k in ("z1", "z2", "zout"):
        check_zero_point(p[k], f"p['{k}']")
    check_act_range(p["act_min"], p["act_max"], ("p['act_min']", "p['act_max']"))
    keys = ADD_KEYS + ("z1", "z2", "zout", "act_min", "act_max") + (xnn if runtime == "xnnpack" else ())
    return _add_jax(x1, x2, params_used(p, keys), runtime)


@eager_program(static_argnames=("runtime",))
def _add_jax(x1, x2, p, runtime: str):
    y = neon_add_int(x1, x2, p, p["z1"], p["z2"], p["zout"], p["act_min"], p["act_max"])
    if runtime == "xnnpack":
        q = {k[4:]: v for k, v in p.items() if k.startswith("xnn_")}
        y = jnp.where(p["xnn"] != 0, xnn_add_int(x1, x2, q, p["zout"]), y)
    return y


_FLOAT_RANGES = {None: (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def xnn_clamp_disagrees(s_out, z_out) -> list[str]:
    """The clamping activations (``relu6``, ``relu_n1_to_1``) whose int8 bounds XNNPACK
    (:func:`xnn_qs8_quantize`: float32 sum with the zero point, ties to even) and LiteRT
    (``CalculateActivationRangeQuantized``: ties away from zero) quantise differently for
    output quantisation ``(s_out, z_out)`` — only at rounding ties, e.g. ``6 / 0.48 = 12.5``."""
    out = []
    for act in ("relu6", "relu_n1_to_1"):
        xnn = tuple(xnn_qs8_quantize(v, s_out, z_out) for v in _FLOAT_RANGES[act])
        if xnn != tuple(activation_range(act, s_out, int(z_out))):
            out.append(act)
    return out


def _neon_add_sum_fits_int16(s1, z1, s2, z2, s_out) -> bool:
    """Whether LiteRT's optimized int8 ADD keeps its output sum (the value narrowed to int16
    before the output zero point is added, :func:`neon_add_int`) within int16 for every pair
    of int8 inputs: ``(max|x1 - z1| s1 + max|x2 - z2| s2) / s_out``, with a margin for the
    fixed-point roundings (0.1% and 8), below ``2**15 - 1 - 128``. Host function."""
    reach = [max(abs(-128 - int(z)), abs(127 - int(z))) for z in (z1, z2)]
    bound = (reach[0] * float(_f32(s1)) + reach[1] * float(_f32(s2))) / float(_f32(s_out))
    return bound * (1 + 2**-10) + 8 <= 2**15 - 1 - 128


def add_recipe(
    runtime: str, activation, s1, z1, s2, z2, s_out, z_out, *, clamp_after=None, broadcast: bool = False
) -> dict[str, np.ndarray]:
    """Host recipe of ADD on ``"optimized"`` / ``"xnnpack"``: :func:`litert_add_params`, the
    LiteRT activation range, and on ``"xnnpack"`` :func:`xnn_add_params` (``xnn_``-prefixed,
    zeros when not delegated) with the flag ``xnn``.

    ``broadcast``: one operand (a constant) is broadcast against the other. LiteRT's
    optimized kernels (``"optimized"``, and ``"xnnpack"`` where XNNPACK does not take the
    node) then run their broadcast loops, which split the vector and scalar lanes
    differently from the element-wise loop :func:`neon_add_int` models; the two agree while
    the int16 output sum cannot overflow. Where it can (a tiny output scale),
    UnsupportedOpError: random graphs 3949 and 4066 gave 127 where LiteRT gives -128
    (tests/test_random_graph_regressions.py).

    A delegated ADD whose fused RELU6 / RELU_N1_TO_1 the importer made a separate
    ``activation`` node (LiteRT's bounds) while XNNPACK clamps with its own is exact
    unless those bounds differ (:func:`xnn_clamp_disagrees`). ``clamp_after`` names that
    activation (``"none"``: no such node); where it is unknown (None), any disagreeing
    clamp raises UnsupportedOpError rather than risk it."""
    V.check_choice(runtime, _RUNTIMES, "runtime")
    V.check_choice(clamp_after, (None, "none", "relu6", "relu_n1_to_1"), "clamp_after")
    for v, n in ((s1, "s1"), (s2, "s2"), (s_out, "s_out")):
        check_scale(v, n)
    for v, n in ((z1, "z1"), (z2, "z2"), (z_out, "z_out")):
        check_zero_point(v, n)
    V.check_flag(broadcast, "broadcast")
    p = dict(litert_add_params(s1, s2, s_out))
    builtin = runtime == "optimized" or not xnn_add_delegated(s1, s2, s_out)
    if broadcast and builtin and not _neon_add_sum_fits_int16(s1, z1, s2, z2, s_out):
        raise UnsupportedOpError(
            f"ADD with a broadcast operand on {runtime!r}: scales {float(_f32(s1)):.6g}, {float(_f32(s2)):.6g} -> "
            f"{float(_f32(s_out)):.6g} let the int16 sum of LiteRT's optimized broadcast loops overflow, whose "
            "vector and scalar lanes hwjax does not model"
        )
    lo, hi = activation_range(activation, s_out, int(z_out))
    p.update(act_min=np.int32(lo), act_max=np.int32(hi))
    if runtime == "xnnpack":
        ok = xnn_add_delegated(s1, s2, s_out)
        bad = xnn_clamp_disagrees(s_out, z_out) if ok and activation not in ("relu6", "relu_n1_to_1") else []
        if clamp_after is not None:
            bad = [a for a in bad if a == clamp_after]
        if bad:
            raise UnsupportedOpError(
                f"ADD on xnnpack: output scale {float(_f32(s_out))} / zero point {int(z_out)} put XNNPACK's "
                f"{bad} bounds on the other side of a rounding tie from LiteRT's; a fused {bad[0].upper()} "
                "(a separate activation node here) would be clamped differently, so this ADD is not supported"
            )
        q = (
            xnn_add_params(s1, z1, s2, z2, s_out, z_out, activation)
            if ok
            else dict.fromkeys(("a_mult", "b_mult", "bias", "shift", "act_min", "act_max"), np.int32(0))
        )
        p.update({"xnn_" + k: v for k, v in q.items()})
        p["xnn"] = np.int32(ok)
    return p


def requant_recipe(runtime: str, s_in, s_out) -> dict[str, np.ndarray]:
    """Host recipe of QUANTIZE int8 -> int8 on ``"optimized"`` / ``"xnnpack"``: LiteRT's
    ``QuantizeMultiplier(double(s_in) / double(s_out))`` as ``m, e``; on ``"xnnpack"`` also
    :func:`xnn_cvt_params` (0 when not delegated) and the flag ``xnn``."""
    V.check_choice(runtime, _RUNTIMES, "runtime")
    check_scale(s_in, "s_in")
    check_scale(s_out, "s_out")
    m, e = quantize_multiplier(float(_f32(s_in)) / float(_f32(s_out)))
    p = {"m": np.int32(m), "e": np.int32(e)}
    if runtime == "xnnpack":
        ok = xnn_cvt_delegated(s_in, s_out)
        p["cvt_mult"] = xnn_cvt_params(s_in, s_out)["cvt_mult"] if ok else np.int32(0)
        p["xnn"] = np.int32(ok)
    return p


__all__ = [
    "VECTOR_BLOCK",
    "add_jax",
    "add_recipe",
    "litert_add_params",
    "neon_add_int",
    "neon_requantize_int",
    "requant_jax",
    "requant_recipe",
    "vector_lanes",
    "xnn_add_delegated",
    "xnn_add_int",
    "xnn_add_params",
    "xnn_clamp_disagrees",
    "xnn_cvt_delegated",
    "xnn_cvt_int",
    "xnn_cvt_params",
    "xnn_qs8_quantize",
]
