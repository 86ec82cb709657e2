"""The LiteRT / TFLite runtimes as one target: :class:`TFLite` (``runtime=`` ``"reference"``,
``"optimized"``, ``"xnnpack"``, ``"tflm"``), spec gemmlowp.md §2.9 and deployed.md §1.

Each op kind's recipe (``params``) derives the runtime's integer parameters on the host
in float64, as the runtime's C++ does (directly when the quantisation is concrete,
through ``jax.pure_callback`` when it is traced); ``run`` is the exact integer kernel of
:mod:`hwjax.litert`. An op/runtime pair whose arithmetic has not been verified against
the runtime raises :class:`hwjax.errors.UnsupportedOpError` rather than guess.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import div_rn
from hwjax.errors import RangeError, UnsupportedOpError
from hwjax.graph import OpImpl, Quant, geometry, pool_geometry
from hwjax.graph.ops.basic import QUANTIZE_RANGES
from hwjax.graph.ops.tflite import padded_pool_geometry
from hwjax.targets._base import Target, host_array, no_acc, register
from hwjax.litert import (
    activation_range,
    add_int,
    accumulator_range,
    add_jax,
    add_params,
    add_recipe,
    avgpool_int,
    conv_int,
    depthwise_int,
    fc_int,
    kernel_sums,
    maxpool_int,
    mbqm_double,
    quantize_multiplier,
    requant_jax,
    requant_params,
    requant_recipe,
    with_acc_bound,
)

RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")
#: TFLite Micro builds whose arithmetic differs (``TFLite.tflm``): ``"current"`` the official
#: ``tflite-micro`` package; ``"xmos-1.4.2"`` the TFLM inside xmos-ai-tools 1.4.2, whose
#: per-channel FULLY_CONNECTED applies the first filter scale to every channel
TFLM_BUILDS = ("current", "xmos-1.4.2")

# requantisation convention per runtime and op (spec gemmlowp.md §2.9, deployed.md §1)
_REQUANT = {
    "reference": {"conv": "double", "depthwise_conv": "double", "dense": "float64"},
    "optimized": {"conv": "ruy", "depthwise_conv": "lanes8", "dense": "ruy"},
    "xnnpack": {"conv": "xnnpack", "depthwise_conv": "xnnpack", "dense": "xnnpack"},
    "tflm": {"conv": "double", "depthwise_conv": "double", "dense": "double"},
}
# op kinds whose arithmetic differs per runtime and is verified only on these runtimes
_VERIFIED = {
    # ADD and QUANTIZE int8 -> int8 on "optimized" / "xnnpack": hwjax.litert._xnnpack (x86
    # NEON_2_SSE vector loops, XNNPACK qs8 add / convert); AVERAGE_POOL_2D int8 is never
    # delegated to XNNPACK, so every runtime runs LiteRT's integer average pool. "tflm":
    # checked against TFLite Micro's reference kernels (xmos-ai-tools 1.4.2 host interpreter,
    # tests/data/tflm): ADD, AVERAGE_POOL_2D and QUANTIZE as LiteRT reference; conv,
    # depthwise and FULLY_CONNECTED with the double-rounding MBQM (R1), per-tensor FC's
    # multiplier from the float32 scale product; RELU6 without requantisation (_unary_params)
    "add": ("reference", "optimized", "xnnpack", "tflm"),
    "avgpool": ("reference", "optimized", "xnnpack", "tflm"),
    "requantize": ("reference", "optimized", "xnnpack", "tflm"),
}


def verified_on(op: str, *runtimes: str) -> None:
    """Declares that op kind ``op``'s arithmetic is implemented (and verified against the
    runtime) only on ``runtimes``; :meth:`TFLite.lowering` raises UnsupportedOpError on
    the others. Op kinds never declared are taken to run the same on every runtime."""
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise RangeError(f"runtimes must be among {RUNTIMES}, got {bad}")
    _VERIFIED[op] = tuple(runtimes)


def _is_concrete(tree) -> bool:
    return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(tree))


def host_recipe(fn, *args):
    """``fn(*numpy args) -> dict of numpy arrays``, on concrete arguments directly, else
    through ``jax.pure_callback`` (the output shapes come from a call on ones)."""
    if _is_concrete(args):
        return jax.device_put(fn(*[np.asarray(a) for a in args]))  # one transfer call
    dummy = fn(*[np.ones(np.shape(a), a.dtype) for a in args])
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), dummy)
    return jax.pure_callback(
        lambda *a: jax.tree.map(np.asarray, fn(*[np.asarray(v) for v in a])),
        spec,
        *jax.lax.stop_gradient(args),
        vmap_method="sequential",
    )


@dataclass(frozen=True)
class TFLite(Target):
    """A LiteRT / TFLite runtime, bit-exact for int8 models.

    ``runtime``: ``"reference"`` (LiteRT ``BUILTIN_REF``), ``"optimized"`` (LiteRT builtin
    kernels without delegate, ruy; x86), ``"xnnpack"`` (LiteRT's default interpreter,
    XNNPACK delegate; x86), ``"tflm"`` (TFLite Micro reference kernels, double-rounding
    build). Fully connected, conv and depthwise requantise per :data:`_REQUANT`.

    ``tflm`` (runtime ``"tflm"`` only; :data:`TFLM_BUILDS`): ``"current"`` (default) computes
    what the official ``tflite-micro`` package computes; ``"xmos-1.4.2"`` what the TFLM inside
    xmos-ai-tools 1.4.2 computes (its host interpreter and lib_tflite_micro on xcore.ai): the
    same except a per-channel FULLY_CONNECTED, which that build runs with the filter's
    first scale for every channel.
    """

    runtime: str = "reference"
    tflm: str = "current"
    name: ClassVar[str] = "tflite"

    def __post_init__(self):
        if self.runtime not in RUNTIMES:
            raise RangeError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.tflm not in TFLM_BUILDS:
            raise RangeError(f"tflm must be one of {TFLM_BUILDS}, got {self.tflm!r}")

    def requant(self, op: str) -> str:
        return _REQUANT[self.runtime][op]

    def lowering(self, op: str):
        ok = _VERIFIED.get(op)
        if ok is not None and self.runtime not in ok:
            raise UnsupportedOpError(
                f"target {self!r}: the {op!r} op's arithmetic on runtime {self.runtime!r} is "
                f"not implemented (runtimes with {op!r}: {list(ok)})"
            )
        impl = super().lowering(op)
        if impl.params is not None and impl.host_params is None:
            # the recipes are host computations (``host_recipe``): on concrete values
            # lowering runs them directly, so nothing is compiled and their errors surface
            impl = dataclasses.replace(impl, host_params=impl.params)
        return impl

    def check_op(self, op: str, **config: Any) -> None:
        self.lowering(op)


# ------------------------------------------------------------------------- linear ops


def _linear_params(op):
    def params(target, attrs, portable, q_in, q_out):
        requant = target.requant(op)
        kernel = portable["kernel"]
        n_out = kernel.shape[-1] if op == "depthwise_conv" else kernel.shape[0]
        act = attrs.get("activation")
        w_scale = portable["w_scale"]
        if target.runtime == "tflm" and target.tflm == "xmos-1.4.2" and op == "dense" and np.size(w_scale) > 1:
            # xmos-ai-tools 1.4.2's TFLM FULLY_CONNECTED reads only the filter tensor's first
            # scale and runs its per-tensor kernel with it (observed: tests/test_tflite_keras_mcu.py);
            # current TFLM applies each channel's scale, as LiteRT's reference kernel does
            w_scale = w_scale[0]

        # current TFLM derives a per-tensor FULLY_CONNECTED's multiplier from the double
        # product of the scales (tests/data/tflm/fc_relu_nobias differs by one output from
        # xmos' build, which takes the float32 product as LiteRT does)
        current_tflm = target.runtime == "tflm" and target.tflm == "current"

        def recipe(s_in, w_scale, s_out, z_out):
            rq = requant_params(
                s_in,
                w_scale,
                s_out,
                requant,
                channels=n_out,
                float32_product=op == "dense" and np.size(w_scale) == 1 and not current_tflm,
            )
            lo, hi = activation_range(act, s_out, int(z_out))
            return {"rq": rq, "act_min": np.int32(lo), "act_max": np.int32(hi)}

        r = host_recipe(recipe, q_in[0].scale, w_scale, q_out.scale, q_out.zero_point)
        bound_from = (kernel, portable["bias"], q_in[0].zero_point, r["rq"])
        if requant in ("double", "ruy", "lanes8") and _is_concrete(bound_from):
            # the layer's accumulators are bounded by its weights (host work): R1 / R3 then
            # take the cheaper exact SRDHM (hwjax.litert.with_acc_bound)
            acc_range = accumulator_range(
                host_array(kernel), host_array(portable["bias"]), q_in[0].zero_point, depthwise=op == "depthwise_conv"
            )
            r = {**r, "rq": with_acc_bound(r["rq"], *acc_range, in_product_loop=op == "depthwise_conv")}
        # the kernel's weight sums per output channel (the input zero point's term of the
        # accumulator), derived once here instead of by the model's program on every call
        return {
            "kernel": kernel,
            "wsum": kernel_sums(host_array(kernel), depthwise=op == "depthwise_conv"),
            "bias": portable["bias"],
            "zin": jnp.asarray(q_in[0].zero_point, jnp.int32),
            "zout": jnp.asarray(q_out.zero_point, jnp.int32),
            **r,
        }

    return params


def _linear_run(op):
    def run(target, attrs, p, x, return_acc: bool = False):
        requant = target.requant(op)
        args = (p["bias"], p["zin"], p["rq"], requant, p["zout"], p["act_min"], p["act_max"])
        wsum = p.get("wsum")  # (graphs lowered before it was a parameter: computed in the kernel)
        # int8 results: the activation range lies in [-128, 127] (activation_range's
        # defaults), and the graph stores the output tensor in 8 bits anyway; the kernels
        # then store their chunks of examples in int8 too
        kw = dict(wsum=wsum, out_dtype="int8")
        if op == "dense":
            y = fc_int(x, p["kernel"], *args, **kw)
        elif op == "conv":
            y = conv_int(x, p["kernel"], *args, geometry(attrs, x.shape), **kw)
        else:
            mult = int(attrs.get("depth_multiplier", 1))
            if mult != 1:  # output channel c * M + m reads input channel c
                x = jnp.repeat(x, mult, axis=-1)
            y = depthwise_int(x, p["kernel"], *args, geometry(attrs, x.shape), **kw)
        return no_acc(y, return_acc)

    return run


for _op in ("dense", "conv", "depthwise_conv"):
    # int8 inputs read as int8: an int8 dot without a run-time range check; depthwise's int16 products
    TFLite.implement(_op, OpImpl(_linear_run(_op), params=_linear_params(_op), narrow_inputs=True))


# ------------------------------------------------------------- quantize (float32 -> int8/uint8)

_INT_MIN = -(2**31)


def _f32_fields(v):
    """``(negative, M, E)`` of float32 ``v``: ``|v| = M * 2**E`` exactly, ``M`` an int32 in
    [0, 2**24) (subnormals included), ``E`` int32; from the bit pattern."""
    bits = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
    ex = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    return bits < 0, jnp.where(ex > 0, m | 0x800000, m), jnp.maximum(ex, 1) - 150


def _cvt_int32(r):
    """x86 ``cvt(t)ss2si`` / ``cvtps2dq`` of integral float32 ``r``: ``r`` as int32, and
    ``INT32_MIN`` (the "integer indefinite" value) when it is outside [-2**31, 2**31) or NaN."""
    ok = jnp.abs(r) < 2.0**31
    return jnp.where(ok, jnp.where(ok, r, 0.0).astype(jnp.int32), _INT_MIN)


def _round_half_away_f32(q):
    """``round(q)`` half away from zero of float32 ``q`` (C ``roundf``), exactly: ``q - trunc(q)``
    is exact, and ``trunc(q) +- 1`` is exact wherever the fraction is nonzero."""
    t = jnp.trunc(q)
    return t + jnp.where(jnp.abs(q - t) >= 0.5, jnp.sign(q), 0.0)


def _round_half_away_f64_quotient(x, s):
    """``round(double(x) / double(s))`` half away from zero as int32, for float32 ``x`` with
    ``|x| < 2**31 s`` and float32 ``s > 0``, without float64 arithmetic.

    With ``x = +-X 2**a`` and ``s = S 2**b`` (24-bit integer significands) the quotient
    is ``X 2**m / D`` with ``m = a - b + 1`` and ``D = 2 S < 2**25``: a shift-and-subtract
    long division gives its integer part ``q`` (int32 remainders below ``2 D``) and 28
    fraction bits plus a sticky bit. Below ``2**25`` the double rounding of the quotient
    cannot move it across a half-integer (a quotient that is not a half-integer is at
    least ``1 / (2 S) >= 2**-25`` from one, the double's error at most ``2**-28``), so
    the first fraction bit decides; from ``2**25`` on, the fraction is first rounded to
    the double's precision (nearest, ties to even) as the runtime's division does.
    """
    neg, xm, a = _f32_fields(x)
    _, sm, b = _f32_fields(s)
    m = a - b + 1
    d = 2 * sm
    # m < 0: floor((X 2**m + S) / D) == floor((floor(X / 2**-m) + S) / D), the same test
    xk = xm >> jnp.clip(-m, 0, 30)
    # |x| < 2**31 s with a normal s: m <= 32 (a normal x has X >= 2**23; a subnormal one m <= 1)
    steps = jnp.clip(m, 0, 32)

    def step(i, c):  # steps 0..31: integer bits (while i < steps); 32..59: 28 fraction bits
        q, f, r = c
        r2 = 2 * r
        bit = (r2 >= d).astype(jnp.int32)
        r2 = r2 - bit * d
        into_q, into_f = i < steps, i >= 32
        q = jnp.where(into_q, 2 * q + bit, q)
        f = jnp.where(into_f, 2 * f + bit, f)
        return q, f, jnp.where(into_q | into_f, r2, r)

    # a trip count known only at run time (sm > 0 always) keeps XLA from unrolling the loop
    n_steps = 60 + (jnp.min(sm, initial=1) < 0).astype(jnp.int32)
    q, f, r = jax.lax.fori_loop(0, n_steps, step, (xk // d, jnp.zeros_like(xk), xk % d))
    sticky = r != 0
    # the double's ulp, in units of 2**-28, for q in [2**e, 2**(e + 1)), e >= 25
    e = 31 - jax.lax.clz(jnp.maximum(q, 1))
    sh = jnp.clip(e - 24, 0, 7)
    u = jnp.left_shift(1, sh)
    low = f & (u - 1)
    ft = f - low
    half = u >> 1
    odd = (jnp.right_shift(ft, sh) & 1) == 1
    up = (low > half) | ((low == half) & (sticky | odd))
    f = jnp.where(q >= 2**25, ft + jnp.where(up, u, 0), f)
    mag = q + (f >= 2**27).astype(jnp.int32)
    return jnp.where(neg, -mag, mag)


def quantize_f32(x, p, runtime: str, lo: int, hi: int):
    """LiteRT QUANTIZE float32 -> int8/uint8 (``[lo, hi]``) of finite float32 ``x`` (batch
    first) with the output scale ``s`` and zero point ``z``, bit-exact per runtime (x86):

    * ``"reference"`` (``reference_ops::AffineQuantize``): the float32
      quotient ``x / s`` (correctly rounded), rounded half away from zero, converted to
      int32, plus ``z`` (int32, wrapping), clamped to ``[lo, hi]``.
    * ``"xnnpack"`` (XNNPACK ``f32-qs8/qu8-vcvt``): ``clamp(rint(x * r) + z, lo, hi)`` with
      ``r = 1/s`` rounded to float32, the product rounded to float32 and ``rint`` ties to
      even; saturating, so huge values clamp to the side of their sign.
    * ``"optimized"`` (``optimized_ops::AffineQuantize``, NEON_2_SSE): of each example's
      ``N`` elements (row-major; LiteRT runs the file's batch-1 tensor) the first
      ``8 floor(N / 8)`` as ``"xnnpack"`` but through ``cvtps2dq`` (not saturating), the
      rest as ``round(double(x) / double(s))`` half away from zero, through ``cvttsd2si``,
      plus ``z`` (int32, wrapping), clamped.

    A value whose rounded quotient leaves the int32 range (``|x| >= 2**31 s``) becomes
    ``INT32_MIN`` on the non-saturating paths, then ``INT32_MIN + z`` wraps: it clamps to
    ``hi`` when ``z < 0`` and to ``lo`` otherwise, whatever its sign (as LiteRT does).
    NaN and Inf are the caller's (``Model.run`` rejects them). Returns int32.
    """
    x = x.astype(jnp.float32)
    s, z = p["scale"], p["zero_point"]
    if runtime == "xnnpack":
        q = jnp.round(x * p["inv_scale"])
        return (jnp.clip(q, lo - z, hi - z)).astype(jnp.int32) + z
    if runtime == "reference":
        big = ~(jnp.abs(x) < s * 2.0**31)  # exact: s * 2**31 is a float32 (or inf)
        q = div_rn(jnp.where(big, 0.0, x), s)
        v = jnp.where(big, _INT_MIN, _cvt_int32(_round_half_away_f32(q)))
        return jnp.clip(v + z, lo, hi)
    if runtime != "optimized":
        raise UnsupportedOpError(
            f"QUANTIZE float32 -> int on runtime {runtime!r} is not implemented (verified on "
            "'reference', 'optimized', 'xnnpack')"
        )
    shape = x.shape
    flat = x.reshape(shape[0], -1)
    n = flat.shape[1]
    cut = 8 * (n // 8)
    head = _cvt_int32(jnp.round(flat[:, :cut] * p["inv_scale"]))
    tail = flat[:, cut:]
    big = ~(jnp.abs(tail) < s * 2.0**31)
    tv = jnp.where(big, _INT_MIN, _round_half_away_f64_quotient(jnp.where(big, 0.0, tail), s))
    v = jnp.concatenate([head, tv], axis=1)
    return jnp.clip(v + z, lo, hi).reshape(shape)


def _quantize_params(target, attrs, portable, q_in, q_out):
    """QUANTIZE float32 -> int8/uint8: the output scale (float32), its float32 reciprocal and
    the zero point (int32)."""

    def recipe(s, zp):
        s32 = np.float32(np.asarray(s).reshape(()))
        if not (np.isfinite(s32) and s32 > 0 and np.abs(s32) >= np.finfo(np.float32).tiny):
            raise UnsupportedOpError(f"quantize: the output scale must be a positive normal float32, got {s32}")
        return {
            "scale": np.float32(s32),
            "inv_scale": np.float32(np.float32(1) / s32),
            "zero_point": np.int32(np.asarray(zp).reshape(())),
        }

    return host_recipe(recipe, q_out.scale, q_out.zero_point)


@TFLite.implements("quantize", params=_quantize_params)
def _quantize(target, attrs, p, x, return_acc: bool = False):
    """``quantize``: an integer input passes through; a float32 one is :func:`quantize_f32`."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return no_acc(x.astype(jnp.int32), return_acc)
    if target.runtime not in ("reference", "optimized", "xnnpack"):
        raise UnsupportedOpError(
            f"target {target!r}: QUANTIZE float32 -> int on runtime {target.runtime!r} is not "
            "implemented (verified against LiteRT: 'reference', 'optimized', 'xnnpack')"
        )
    lo, hi = QUANTIZE_RANGES[attrs.get("dtype", "int8")]
    return no_acc(quantize_f32(x, p, target.runtime, lo, hi), return_acc)


# ------------------------------------------------------------------ requantising unary ops


def _unary_params(target, attrs, portable, q_in, q_out):
    """``(m, e)`` of ``s_in / s_out`` and the activation range on the output quantisation.
    TFLM's RELU6 does not requantise: it clamps the raw input to ``[z_in, Q_in(6)]``
    (observed), i.e. this recipe with the input's quantisation standing for the output's."""
    fn = attrs.get("fn")
    if target.runtime == "tflm" and fn == "relu6":
        q_out = q_in[0]

    def recipe(s_in, z_in, s_out, z_out):
        m, e = quantize_multiplier(float(np.float32(s_in)) / float(np.float32(s_out)))
        lo, hi = activation_range(fn, s_out, int(z_out))
        return {"m": np.int32(m), "e": np.int32(e), "act_min": np.int32(lo), "act_max": np.int32(hi)}

    r = host_recipe(recipe, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)
    return {**r, "zin": jnp.asarray(q_in[0].zero_point, jnp.int32), "zout": jnp.asarray(q_out.zero_point, jnp.int32)}


def _unary_run(target, attrs, p, x, return_acc: bool = False):
    """TFLite ``ReluX`` / ``Requantize``: ``clamp(MBQM(x - zin, m, e) + zout, act)``."""
    v = mbqm_double(x - p["zin"], p["m"], p["e"])
    y = jnp.clip(jnp.clip(v, -(2**30), 2**30) + p["zout"], p["act_min"], p["act_max"])
    return no_acc(y, return_acc)


def _requantize_params(target, attrs, portable, q_in, q_out):
    """QUANTIZE int8 -> int8: LiteRT's ``(m, e)``; on ``"optimized"`` / ``"xnnpack"`` also the
    parameters of :func:`hwjax.litert.requant_recipe`."""
    p = _unary_params(target, attrs, portable, q_in, q_out)
    rt = target.runtime
    if rt in ("optimized", "xnnpack"):
        p = {**p, **host_recipe(lambda s_in, s_out: requant_recipe(rt, s_in, s_out), q_in[0].scale, q_out.scale)}
    return p


def _requantize_run(target, attrs, p, x, return_acc: bool = False):
    """QUANTIZE int8 -> int8: the reference ``Requantize`` (``"reference"``, ``"tflm"``), else
    :func:`hwjax.litert.requant_jax` (LiteRT's x86 vector loop / XNNPACK convert)."""
    if target.runtime in ("optimized", "xnnpack"):
        return no_acc(requant_jax(x, p, target.runtime), return_acc)
    return _unary_run(target, attrs, p, x, return_acc)


TFLite.implements("activation", params=_unary_params)(_unary_run)
TFLite.implements("requantize", params=_requantize_params)(_requantize_run)


# -------------------------------------------------------------------------------- pools


def _pool_params(target, attrs, portable, q_in, q_out):
    """TFLite pools keep the input's quantisation (the converter writes equal scales and zero
    points); only the int8 range clamps (fused activations are separate ``activation`` nodes)."""
    return {"act_min": np.int32(-128), "act_max": np.int32(127)}


def _check_avg(target):
    ok = _VERIFIED["avgpool"]
    if target.runtime not in ok:
        raise UnsupportedOpError(
            f"target {target!r}: AVERAGE_POOL_2D's arithmetic on runtime {target.runtime!r} is "
            f"not implemented (runtimes with it: {list(ok)})"
        )


@TFLite.implements("maxpool", params=_pool_params)
def _maxpool(target, attrs, p, x, return_acc: bool = False):
    return no_acc(maxpool_int(x, pool_geometry(attrs, x.shape), p["act_min"], p["act_max"]), return_acc)


@TFLite.implements("avgpool", params=_pool_params)
def _avgpool(target, attrs, p, x, return_acc: bool = False):
    _check_avg(target)
    return no_acc(avgpool_int(x, pool_geometry(attrs, x.shape), p["act_min"], p["act_max"]), return_acc)


@TFLite.implements("pool", params=_pool_params)
def _pool(target, attrs, p, x, return_acc: bool = False):
    geom = padded_pool_geometry(attrs, x.shape[1:])
    if attrs["fn"] == "avg":
        _check_avg(target)
        return no_acc(avgpool_int(x, geom, p["act_min"], p["act_max"]), return_acc)
    return no_acc(maxpool_int(x, geom, p["act_min"], p["act_max"]), return_acc)


# ---------------------------------------------------------------------------------- add


def _add_params(target, attrs, portable, q_in, q_out, *, broadcast: bool = False):
    """ADD: LiteRT's ``add.cc`` parameters; on ``"optimized"`` / ``"xnnpack"`` those of
    :func:`hwjax.litert.add_recipe` (with XNNPACK's when it takes the node)."""
    act, clamp_after = attrs.get("activation"), attrs.get("clamp_after")
    rt = target.runtime

    def recipe(s1, z1, s2, z2, s_out, z_out):
        if rt in ("optimized", "xnnpack"):
            return add_recipe(rt, act, s1, z1, s2, z2, s_out, z_out, clamp_after=clamp_after, broadcast=broadcast)
        p = add_params(s1, s2, s_out)
        lo, hi = activation_range(act, s_out, int(z_out))
        return {**p, "act_min": np.int32(lo), "act_max": np.int32(hi)}

    r = host_recipe(
        recipe, q_in[0].scale, q_in[0].zero_point, q_in[1].scale, q_in[1].zero_point, q_out.scale, q_out.zero_point
    )
    return {
        **r,
        "z1": jnp.asarray(q_in[0].zero_point, jnp.int32),
        "z2": jnp.asarray(q_in[1].zero_point, jnp.int32),
        "zout": jnp.asarray(q_out.zero_point, jnp.int32),
    }


@TFLite.implements("add", params=_add_params)
def _add(target, attrs, p, x1, x2, return_acc: bool = False):
    """ADD: the reference kernel (``"reference"``, ``"tflm"``), else
    :func:`hwjax.litert.add_jax` (LiteRT's x86 vector loop / XNNPACK qs8 add)."""
    if target.runtime in ("optimized", "xnnpack"):
        return no_acc(add_jax(x1, x2, p, target.runtime), return_acc)
    return no_acc(add_int(x1, x2, p, p["z1"], p["z2"], p["zout"], p["act_min"], p["act_max"]), return_acc)


def const_operands(attrs, p, x):
    """``(x1, x2)`` of a node with a constant operand (``add_const``, ``mul_const``): the
    constant ``p["value"]`` broadcast to ``x``'s shape, in the file's operand order
    (``const_first``)."""
    v = jnp.asarray(p["value"]).astype(jnp.int32)
    v = jnp.broadcast_to(v.reshape((1,) * (x.ndim - v.ndim) + v.shape), x.shape)
    return (v, x) if attrs.get("const_first") else (x, v)


def const_operand_quants(attrs, portable, q_in) -> list:
    """The two operands' quantisations of a node with a constant operand, in the file's
    operand order: the input's and the constant's (``scale``, ``zero_point``)."""
    q_const = Quant.of(portable["scale"], portable["zero_point"])
    return [q_const, q_in[0]] if attrs.get("const_first") else [q_in[0], q_const]


def _add_const_params(target, attrs, portable, q_in, q_out):
    """ADD with a constant operand: the ``add`` recipe with the constant's quantisation,
    the constant broadcast against the input (:func:`hwjax.litert.add_recipe`'s
    ``broadcast``)."""
    q = const_operand_quants(attrs, portable, q_in)
    return {**_add_params(target, attrs, portable, q, q_out, broadcast=True), "value": portable["value"]}


@TFLite.implements("add_const", params=_add_const_params)
def _add_const(target, attrs, p, x, return_acc: bool = False):
    """ADD of a tensor and a constant broadcast against it: ``add`` on the broadcast operands."""
    return _add(target, attrs, p, *const_operands(attrs, p, x), return_acc=return_acc)


register("tflite", TFLite)
