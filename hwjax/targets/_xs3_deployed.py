"""The xcore.ai runtime of deployed models: xformer's XC ops and the TFLM fallback.

:class:`XS3Runtime` (registered as ``"xs3-tflm"``; ``Model.run(x, runtime="xs3")``) runs
what lib_tflite_micro runs on an xformer-converted ``.tflite`` file (deployed.md §3):
the ``xc_*`` op kinds of :mod:`hwjax.graph.ops.xcore` with the exact lib_nn kernels of
:mod:`hwjax.xs3` (``variant`` selects the VPU model: ``"host"`` = the x86 host
interpreter of xmos-ai-tools 1.4.2, ``"hardware"`` = the chip), and every builtin
operator xformer left in place with TFLite Micro's reference arithmetic, inherited from
:class:`hwjax.targets.TFLite` ``("tflm")``.

:class:`XS3Compiled` (``"xs3-xformer"``; ``Model.run(x, runtime="xs3")`` on an original
model) compiles an original int8 model as xformer 1.4.2 does with default options (its
recipes transcribed: :func:`xformer_linear_params`, :func:`xformer_transform_choice`,
:func:`xformer_add_params`, :func:`xformer_mean_scale`, :func:`xformer_lut_table`,
:func:`xformer_softmax_table`, :func:`xformer_mul_params`, :func:`xformer_drops_activation`) and
runs the result the same way;
:func:`check_xformer_lowering` refuses what it does not cover.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax import xs3
from hwjax.core import evaluated_if_concrete
from hwjax.errors import ArgTypeError, RangeError, UnsupportedOpError
from hwjax.graph import geometry
from hwjax.targets._base import Target, no_acc, register
from hwjax.targets._tflite import TFLite, host_recipe
from hwjax.targets._xs3 import xformer_host_otfn
from hwjax.tflite import activation_range

_I32 = jnp.int32


@dataclass(frozen=True)
class XS3Runtime(TFLite):
    """lib_tflite_micro on xcore.ai: XC ops on the XS3 VPU, builtins as TFLM reference kernels.

    ``variant``: the VPU model of the XC kernels (:data:`hwjax.xs3.VARIANTS`): ``"host"``
    (default; bit-equal to ``TFLMHostInterpreter`` of xmos-ai-tools 1.4.2, verified) or
    ``"hardware"`` (the chip: differs from ``"host"`` only in ``otfn_int8``'s final
    shift, xs3.md §4.1). ``runtime`` is always ``"tflm"``.
    """

    runtime: str = "tflm"
    variant: str = "host"
    name: ClassVar[str] = "xs3-tflm"
    #: op kinds with an XS3 implementation of their own (not TFLM's)
    native: ClassVar[frozenset] = frozenset()

    def __post_init__(self):
        if self.runtime != "tflm":
            raise RangeError(f"XS3Runtime runs builtins as TFLM does: runtime must be 'tflm', got {self.runtime!r}")
        if self.variant not in xs3.VARIANTS:
            raise RangeError(f"variant must be one of {xs3.VARIANTS}, got {self.variant!r}")

    def lowering(self, op: str):
        """Op kinds this class implements itself run their XS3 lowering; the others are
        TFLite's, on runtime ``"tflm"`` (with its per-runtime verification)."""
        if op in type(self).native:
            return Target.lowering(self, op)
        return super().lowering(op)


def _stored(target, attrs, portable, q_in, q_out):
    """XC nodes carry the file's integer parameters: lowering keeps them."""
    return portable


def _per_example(x: jax.Array) -> jax.Array:
    """(B, ...) -> (B, N): each example's values in row-major (memory) order."""
    return x.reshape(x.shape[0], -1)


def _shaped(y: jax.Array, attrs) -> jax.Array:
    return y.astype(_I32).reshape(y.shape[0], *attrs["out_shape"])


# ------------------------------------------------------------------------ XC_conv2d_v2


@XS3Runtime.implements("xc_conv2d", params=_stored)
def _xc_conv2d(target, attrs, p, x, return_acc: bool = False):
    """VALID convolution: ``hwjax.xs3.conv2d`` (direct and indirect kernels accumulate the
    same 32-byte chunks of the patch) or ``hwjax.xs3.depthwise_conv2d``, then otfn_int8."""
    out = tuple(attrs["out_shape"])
    ohw = (1, 1) if len(out) == 1 else out[:2]
    x = x.reshape(x.shape[0], *attrs["in_shape"])  # fully connected: the input as one pixel
    common = dict(initial_shift=attrs["initial_shift"], final_shr=attrs["final_shr"], stride=attrs["stride"],
                  pad_top_left=(0, 0), pad_value=0, out_shape=ohw, variant=target.variant)
    if attrs["kernel_type"] == "depthwise":
        y, acc = xs3.depthwise_conv2d(x, p["kernel"], p["multipliers"], p["biases"], return_accumulators=True,
                                      **common)
    else:
        y, acc = xs3.conv2d(x, p["kernel"], p["multipliers"], p["biases"], dilation=attrs["dilation"],
                            return_accumulators=True, **common)
    if attrs.get("transform", "group") == "channelwise":  # same accumulators, the §4.2 transform
        y = xs3.otfn_int8_channelwise(acc, p["shifts"], p["multipliers"], p["biases"], final_shr=attrs["final_shr"],
                                      variant=target.variant)
    return no_acc(_shaped(y, attrs), return_acc)


# ------------------------------------------------------------------ byte-moving ops


@functools.lru_cache(maxsize=None)
def _pad_index(start: int, pad: int, length: int, copies: int, end: int) -> np.ndarray:
    """Source byte of every output byte of ``XC_pad`` (-1: the pad value)."""
    parts = [np.full(start, -1)]
    for i in range(copies + 1):
        parts.append(np.arange(i * length, (i + 1) * length))
        parts.append(np.full(pad if i < copies else end, -1))
    return np.concatenate(parts).astype(np.int32)


@XS3Runtime.implements("xc_pad", params=_stored)
def _xc_pad(target, attrs, p, x, return_acc: bool = False):
    idx = _pad_index(attrs["start"], attrs["pad"], attrs["length"], attrs["copies"], attrs["end"])
    src = jnp.take(_per_example(x), jnp.asarray(np.maximum(idx, 0)), axis=1)
    y = jnp.where(jnp.asarray(idx >= 0), src, attrs["value"])
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_pad_3_to_4", params=_stored)
def _xc_pad_3_to_4(target, attrs, p, x, return_acc: bool = False):
    y = jnp.concatenate([x, jnp.full((*x.shape[:-1], 1), attrs["value"], x.dtype)], axis=-1)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_slice", params=_stored)
def _xc_slice(target, attrs, p, x, return_acc: bool = False):
    s, o, n, l = attrs["start"], attrs["stride"], attrs["copies"], attrs["length"]
    idx = (s + o * np.arange(n)[:, None] + np.arange(l)[None, :]).reshape(-1)
    y = jnp.take(_per_example(x), jnp.asarray(idx, jnp.int32), axis=1)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("reshape")
def _reshape(target, attrs, p, x, return_acc: bool = False):
    """Row-major reshape (``XC_no_op``, TFLite ``RESHAPE``): the bytes do not move."""
    return no_acc(x.reshape(x.shape[0], *attrs["shape"]), return_acc)


# ------------------------------------------------------------------- arithmetic ops


@XS3Runtime.implements("xc_lookup", params=_stored)
def _xc_lookup(target, attrs, p, x, return_acc: bool = False):
    """``y = table[u8(x)]`` (lookup8, xs3.md §6.6)."""
    y = jnp.take(jnp.asarray(p["table"], _I32), x.astype(_I32) & 0xFF, axis=0)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_add", params=_stored)
def _xc_add(target, attrs, p, x1, x2, return_acc: bool = False):
    """``add_elementwise`` (xs3.md §6.4) through :func:`hwjax.xs3.add_int8`."""
    y = xs3.add_int8(x1, x2, multiplier0=attrs["multiplier1"], multiplier1=attrs["multiplier2"], bias=attrs["bias"],
                     shift=attrs["shift"], variant=target.variant)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_mean", params=_stored)
def _xc_mean(target, attrs, p, x, return_acc: bool = False):
    """Float32 mean (deployed.md §2): ``S`` the exact int32 sum over the reduced axis, then
    ``clamp(rint(fl32(fl32(S - zi*n) * scale) + zo), -128, 127)`` (each float32 operation
    rounded; an optimisation barrier keeps the product from fusing into an FMA)."""
    y = mean_f32(x, attrs["outer"], attrs["reduced"], attrs["inner"], attrs["in_zero_point"],
                 attrs["out_zero_point"], attrs["scale"])
    return no_acc(_shaped(y, attrs), return_acc)


def mean_f32(x, outer: int, n: int, inner: int, zi, zo, scale) -> jax.Array:
    """lib_nn's float32 mean of ``x`` (B, ...) viewed as (B, outer, n, inner) over axis 2:
    ``clamp(rint(fl32(fl32(S - zi*n) * scale) + zo), -128, 127)``, ``S`` the int32 sum, ``rint``
    ties to even; ``zi``, ``zo``, ``scale`` float32 values (traced or not). Returns int32
    (B, outer, inner)."""
    s = x.astype(_I32).reshape(x.shape[0], outer, n, inner).sum(axis=2, dtype=_I32)
    f32 = jnp.float32
    centred = s.astype(f32) - jnp.asarray(zi, f32) * f32(n)  # exact: |values| < 2**24
    prod = jax.lax.optimization_barrier(centred * jnp.asarray(scale, f32))
    return jnp.clip(jnp.round(prod + jnp.asarray(zo, f32)), -128, 127).astype(_I32)


@XS3Runtime.implements("xc_maxpool2d", params=_stored)
def _xc_maxpool2d(target, attrs, p, x, return_acc: bool = False):
    """Per channel the maximum over each VALID window (the kernel starts at -128, which
    every int8 value reaches or exceeds)."""
    (kh, kw), (sr, sc) = attrs["window"], attrs["stride"]
    y = jax.lax.reduce_window(x.astype(_I32), jnp.int32(-128), jax.lax.max, (1, kh, kw, 1), (1, sr, sc, 1), "VALID")
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_concat", params=_stored)
def _xc_concat(target, attrs, p, *xs, return_acc: bool = False):
    """``XC_concat``: row ``j`` of the output is row ``j`` of every input in turn (bytes)."""
    n = attrs["copies"]
    y = jnp.concatenate([x.astype(_I32).reshape(x.shape[0], n, s) for x, s in zip(xs, attrs["sizes"])], axis=2)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_mul", params=_stored)
def _xc_mul(target, attrs, p, x1, x2, return_acc: bool = False):
    """lib_nn's ``mul_elementwise_ref`` (the host build's kernel), in int32 (no step can
    overflow: ``|acc| <= 2**16``, ``|scalar * v| < 2**31``)."""
    z1, z2 = (jnp.asarray(attrs[k], _I32) for k in ("in1_zero_point", "in2_zero_point"))
    a, c = x1.astype(_I32), x2.astype(_I32)
    acc = z2 * a + z1 * c + a * c + z1 * z2 + a + c + z1 + z2
    v = (acc + 1) >> 1
    v = (jnp.asarray(attrs["scalar"], _I32) * v + (1 << 13)) >> 14
    v = jnp.clip(v + jnp.asarray(attrs["bias"], _I32), -32767, 32767)
    shr = jnp.asarray(attrs["vlashr_shr"], _I32)
    v = jnp.clip(jnp.where(shr > 0, v >> jnp.maximum(shr, 0), v << jnp.maximum(-shr, 0)), -32767, 32767)
    y = jnp.clip((v + 128) >> 8, -128, 127)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_softmax", params=_stored)
def _xc_softmax(target, attrs, p, x, return_acc: bool = False):
    """lib_nn's float32 softmax over every value of an example, as lib_tflite_micro runs it
    with one thread (xformer's default ``--xcore-thread-count=1``; more threads would sum
    in parts): the sum in element order (one rounding per addition), ``inv = fl32(1 / S)
    * 256``, then ``roundf(fl32(e * inv)) - 128`` with ``roundf`` ties away from zero and
    the C conversion to int8 keeping the low byte (optimisation barriers keep each
    float32 operation rounded on its own)."""
    f32 = jnp.float32
    e = jnp.take(jnp.asarray(p["table"], f32), _per_example(x).astype(_I32) + 128, axis=0)
    total = jax.lax.fori_loop(1, e.shape[1], lambda i, t: t + e[:, i], e[:, 0])  # in order, no reassociation
    inv = jax.lax.optimization_barrier(f32(1.0) / total)
    inv = jax.lax.optimization_barrier(inv * f32(256.0))
    prod = jax.lax.optimization_barrier(e * inv[:, None])
    t = jnp.trunc(prod)  # roundf: half away from zero (prod - t is exact)
    r = t + jnp.where(jnp.abs(prod - t) >= f32(0.5), jnp.sign(prod), f32(0))
    y = ((r.astype(_I32) - 128 + 128) & 0xFF) - 128  # (int8_t)(r - 128): the low byte
    return no_acc(_shaped(y, attrs), return_acc)


XS3Runtime.native = frozenset(XS3Runtime._impls) - frozenset(TFLite._impls) | {"reshape"}
register("xs3-tflm", XS3Runtime)


# ------------------------------------------------ an original model, compiled as xformer does


#: the op kinds of an original model that :class:`XS3Compiled` lowers as xformer does
#: (linear ops: ``XC_conv2d_v2``; the rest run the same bytes/arithmetic either way)
COMPILED_OPS = ("conv", "depthwise_conv", "dense", "maxpool", "activation", "flatten", "reshape", "pad", "quantize",
                "add", "mean", "lut", "softmax", "mul", "concat", "avgpool")
ERR_THRESHOLD = 0.25  # xformer's --xcore-conv-err-threshold default


@dataclass(frozen=True)
class XS3Compiled(XS3Runtime):
    """An *original* int8 model run as xformer (default options) + lib_tflite_micro run it.

    CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED become ``XC_conv2d_v2`` (xs3.md §4.5):
    output channels padded with zero weights, zero bias and weight scale 0 to a multiple
    of 4 (:func:`xformer_linear_params`), the group-wise ``otfn_int8`` parameters of
    :func:`hwjax.xs3.otfn_params`, padded taps holding the input zero point, a
    3-channel conv input padded to 4 (``XC_pad_3_to_4``); a fused RELU / RELU6 whose output
    zero point is not -128 as xformer's ``XC_lookup``, every other fused activation dropped
    (:func:`xformer_drops_activation`; RELU at zero point -128 is the identity anyway).
    Per layer, :func:`xformer_transform_choice` decides as xformer does between the group
    transform, the channel-wise transform and leaving the TFLM op (computed on the host;
    all three results are computed and one is selected).
    ADD and MEAN become ``XC_add`` / ``XC_mean``; TANH and LOGISTIC ``XC_lookup``
    (:func:`xformer_lut_table`), SOFTMAX ``XC_softmax`` (:func:`xformer_softmax_table`), MUL
    ``XC_mul`` (:func:`xformer_mul_params`), CONCATENATION ``XC_concat`` (a byte copy) and
    AVERAGE_POOL_2D a depthwise ``XC_conv2d_v2`` of ones (:func:`xformer_avgpool_as_depthwise`).
    A standalone RELU / RELU6 is an ``XC_lookup`` too, RELU_N1_TO_1 TFLM's kernel.
    :func:`check_xformer_lowering` says what is not covered
    (``Model.run(runtime="xs3")`` calls it).
    """

    name: ClassVar[str] = "xs3-xformer"


def _padded_channels(n: int) -> int:
    return -(-n // 4) * 4


def _linear_kernel(op: str, k: jax.Array, xp=jnp) -> jax.Array:
    """The kernel as (C_out, kh, kw, C_in) (depthwise: (C, kh, kw, 1)); ``xp`` is ``jnp`` or,
    for host arrays, ``np``."""
    if op == "dense":
        return k[:, None, None, :]
    if op == "depthwise_conv":
        return xp.moveaxis(k, -1, 0)[..., None]
    return k


_LINEAR = {}


def xformer_linear_params(op: str, portable, q_in, q_out) -> dict:
    """:func:`_xformer_linear_params`, memoised on concrete arguments' bytes
    (:func:`check_xformer_lowering` and the lowering ask for the same layers)."""
    args = (portable["kernel"], portable["bias"], portable["w_scale"], q_in[0].scale, q_in[0].zero_point,
            q_out.scale, q_out.zero_point)
    if any(isinstance(a, jax.core.Tracer) for a in args):
        return _xformer_linear_params(op, portable, q_in, q_out)
    key = (op,) + tuple((np.asarray(a).dtype.str, np.shape(a), np.asarray(a).tobytes()) for a in args)
    if key not in _LINEAR:
        if len(_LINEAR) > 256:
            _LINEAR.clear()
        _LINEAR[key] = _xformer_linear_params(op, portable, q_in, q_out, xp=np)
    return dict(_LINEAR[key])


def _xformer_linear_params(op: str, portable, q_in, q_out, xp=jnp) -> dict:
    """xformer's ``XC_conv2d_v2`` parameters of a conv/depthwise/dense node: the kernel
    (C_pad, kh, kw, C_in) with C_pad = C_out rounded up to a multiple of 4 (pad channels:
    zero weights, zero bias, weight scale 0), and ``otfn_params``' multipliers, biases and
    ``shifts = [initial_shift, final_shr]`` over all C_pad channels (pad channels take part
    in the exponent search, as in xformer). ``xp=np`` takes concrete arguments on the host:
    padded there, and the parameters from xformer's own float64 recipe
    (:func:`hwjax.xs3.otfn_params_from_scales`, no program compiled), or from
    ``otfn_params`` where that refuses the layer (shifts outside the assembly's ranges)."""
    k = _linear_kernel(op, xp.asarray(portable["kernel"]).astype(xp.int8), xp)
    co = k.shape[0]
    extra = _padded_channels(co) - co
    kp = xp.concatenate([k, xp.zeros((extra, *k.shape[1:]), xp.int8)])
    bp = xp.concatenate([xp.asarray(portable["bias"]).astype(xp.int32), xp.zeros((extra,), xp.int32)])
    sw = xp.broadcast_to(xp.asarray(portable["w_scale"]).astype(xp.float32), (co,))
    swp = xp.concatenate([sw, xp.zeros((extra,), xp.float32)])
    host = _host_otfn_params(kp, bp, q_in[0], swp, q_out) if xp is np else None
    mul, bias, shifts = host if host is not None else xs3.otfn_params(
        kp, bp, s_in=q_in[0].scale, z_in=q_in[0].zero_point, s_w=swp, s_out=q_out.scale, z_out=q_out.zero_point)
    zin, zout = (xp.asarray(q.zero_point).astype(xp.int32) for q in (q_in[0], q_out))
    if xp is np:  # host values: transferred, not compiled
        kp, zin, zout = jax.device_put((kp, zin, zout))
    return {"kernel": kp, "multipliers": mul, "biases": bias, "shifts": shifts, "zin": zin, "zout": zout}


def _host_otfn_params(kernel, bias, q_in, s_w, q_out):
    """``otfn_params``' ``(multipliers, biases, shifts)`` from xformer's float64 host recipe,
    as device arrays; None where the recipe refuses the layer."""
    r = xformer_host_otfn(kernel, bias, q_in, s_w, q_out)
    if r is None:
        return None
    shifts = np.array([r["initial_shift"], r["final_shr"]], np.int32)
    return jax.device_put((r["multipliers"].astype(np.int32), r["biases"].astype(np.int32), shifts))


# ------------------------------------------- xformer's choice of output transform (numpy)

VLMUL_SHR = 14


def _frexp_e(v) -> int:
    return int(np.frexp(np.float64(v))[1])


def _c_shl(v: int, amount: int) -> int:
    """lib_nn's ``shl``: ``v * 2**amount`` (wrapping in 64 bits) for amount >= 0, else a
    rounding right shift ``(v + 2**(s-1)) >> s``."""
    if amount >= 0:
        r = (v << amount) & (2**64 - 1)
        return r - 2**64 if r >> 63 else r
    s = -amount
    return (v + (1 << (s - 1))) >> s


def _count_bits(v: int) -> int:
    """Two's-complement width of ``v`` (sign included; 1 for 0 and -1)."""
    return (v if v >= 0 else ~v).bit_length() + 1


def _fits16(v: int) -> bool:
    return _count_bits(v) <= 16


def _rint_ldexp(f: float, e: int) -> int:
    return int(np.rint(np.ldexp(np.float64(f), e)))


def canonical_transform(weights, bias_q, s_in, z_in, s_w, s_out, z_out):
    """lib_nn's canonical per-channel ``(multiplier, bias, accu_min, accu_max)`` after the
    output-clamp back-propagation (xs3.md §4.5 steps 1–2; ``multiplier`` the float32
    effective scale, scale-0 channels constant). NumPy float64 / int arrays."""
    from hwjax.xs3._otfn import _narrow_accu_range

    w = np.asarray(weights).reshape(np.shape(weights)[0], -1).astype(np.int64)
    sw = np.broadcast_to(np.asarray(s_w, np.float32), (w.shape[0],))
    m = (np.float32(s_in) * sw / np.float32(s_out)).astype(np.float32).astype(np.float64)
    beta = (np.asarray(bias_q, np.int64) - int(z_in) * w.sum(axis=1)).astype(np.float64) * m + float(z_out)
    amax = np.where(w > 0, 127 * w, -128 * w).sum(axis=1)
    amin = np.where(w > 0, -128 * w, 127 * w).sum(axis=1)
    return _narrow_accu_range(m, beta, amin, amax)


def _channelwise_exponents(m, beta, amin, amax) -> tuple[list, list]:
    """``OutputTransformFnInt8_Channelwise::Quantizer::solve_for_constraints``: per-channel
    A (<= 0) and M sharing one B = A + M - 14."""
    gb = 0
    for b in beta:
        if b != 0 and _fits16(_rint_ldexp(b, 15 - _frexp_e(b))):
            gb = max(gb, _frexp_e(b))
    gb = max(15 - gb, 1)
    As, Ms = [], []
    for c in range(m.size):
        lo, hi, mc = int(amin[c]), int(amax[c]), float(m[c])
        accu_bits = max([_frexp_e(v) for v in (hi, lo) if v] or [0])
        if not ((lo or hi) and mc):
            As.append(0)
            Ms.append(gb + VLMUL_SHR)
            continue
        A, M = 15 - accu_bits, 15 - _frexp_e(mc)
        mul_sig = _count_bits(_rint_ldexp(mc, M))
        accu_sig = max(_count_bits(_c_shl(hi, A)), _count_bits(_c_shl(lo, A)))
        trying = True
        while trying:
            trying = False
            hi16, lo16 = _c_shl(hi, A), _c_shl(lo, A)
            if not (_fits16(hi16) and _fits16(lo16)):
                A, accu_sig, trying = A - 1, accu_sig - 1, True
            mul16 = _rint_ldexp(mc, M)
            if not _fits16(mul16):
                M, mul_sig, trying = M - 1, mul_sig - 1, True
            p_hi, p_lo = _c_shl(hi16 * mul16, -VLMUL_SHR), _c_shl(lo16 * mul16, -VLMUL_SHR)
            if not (_fits16(max(p_lo, p_hi)) and _fits16(min(p_lo, p_hi))):
                if A >= 0 or accu_sig > mul_sig:
                    A, accu_sig = A - 1, accu_sig - 1
                else:
                    M, mul_sig = M - 1, mul_sig - 1
                trying = True
        As.append(A)
        Ms.append(M)
    As = [min(a, 0) for a in As]
    gb = min([gb] + [a + mm - VLMUL_SHR for a, mm in zip(As, Ms)])
    for c in range(m.size):
        mul_sig = _count_bits(_rint_ldexp(m[c], Ms[c]))
        accu_sig = max(_count_bits(_c_shl(int(amax[c]), As[c])), _count_bits(_c_shl(int(amin[c]), As[c])))
        while gb < As[c] + Ms[c] - VLMUL_SHR:
            if accu_sig > mul_sig:
                As[c], accu_sig = As[c] - 1, accu_sig - 1
            else:
                Ms[c], mul_sig = Ms[c] - 1, mul_sig - 1
    return As, Ms


def channelwise_params(m, beta, amin, amax) -> dict:
    """xformer's ``otfn_int8_channelwise`` parameters from :func:`canonical_transform`:
    ``shifts = -A_c``, ``multipliers = clip(rint(m 2**M_c))``, ``biases = clip(rint(beta 2**B))``
    (no -1 compensation), ``final_shr = B - 8``."""
    As, Ms = _channelwise_exponents(m, beta, amin, amax)
    B = As[0] + Ms[0] - VLMUL_SHR if As else 8
    clip = lambda v: int(np.clip(v, -(2**15), 2**15 - 1))  # noqa: E731
    return {"shifts": np.array([-a for a in As], np.int32),
            "multipliers": np.array([clip(_rint_ldexp(mc, M)) for mc, M in zip(m, Ms)], np.int32),
            "biases": np.array([clip(_rint_ldexp(b, B)) for b in beta], np.int32), "final_shr": np.int32(B - 8)}


def _sat(a, bits):  # the error model's own (2**bits-wide) saturation
    return np.clip(a, -(1 << bits), (1 << bits) - 1)


def _shr(v, s, bits=16):
    return _sat((v + (1 << (s - 1))) >> s, bits) if s > 0 else _sat(v << -s, bits)


def channelwise_error(m, beta, amin, amax, qp) -> float:
    """lib_nn's high-precision error of a channel-wise transform: the largest, over the
    channels, mean ``|round(accu m + beta) clamped - emulated output|`` over every accumulator
    in the channel's range (its emulation: 64-bit steps with (2**16)-wide saturation)."""
    worst = 0.0
    for c in range(m.size):
        acc = np.arange(int(amin[c]), int(amax[c]) + 1, dtype=np.int64)
        if not acc.size:
            continue
        t = _shr(acc, int(qp["shifts"][c]))
        t = _sat((t * int(qp["multipliers"][c]) + (1 << 13)) >> 14, 16)
        t = _sat(t + int(qp["biases"][c]), 16)
        t = _shr(t, int(qp["final_shr"]))
        t = _sat(_shr(t, 8), 8)
        v = acc.astype(np.float64) * m[c] + beta[c]
        expected = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127)  # C round
        worst = max(worst, float(np.abs(expected - t).sum()) / acc.size)
    return worst


TRANSFORM_MODES = ("group", "channelwise", "tflm")


_CHOICES: dict = {}


def xformer_transform_choice(weights, bias_q, s_in, z_in, s_w, s_out, z_out, threshold=ERR_THRESHOLD) -> dict:
    """:func:`_transform_choice`, memoised on the arguments' bytes (the channel-wise error
    scans every accumulator of a range and the lowering asks again for each compile)."""
    args = [np.asarray(a) for a in (weights, bias_q, s_in, z_in, s_w, s_out, z_out)]
    key = tuple((a.dtype.str, a.shape, a.tobytes()) for a in args) + (float(threshold),)
    if key not in _CHOICES:
        if len(_CHOICES) > 256:
            _CHOICES.clear()
        _CHOICES[key] = _transform_choice(*args, threshold=threshold)
    return dict(_CHOICES[key])


def _transform_choice(weights, bias_q, s_in, z_in, s_w, s_out, z_out, threshold=ERR_THRESHOLD) -> dict:
    """What xformer does with a linear layer (ConvPatternsTFL ``getOutputTransformParams``):
    the group transform when its estimate ``2**-(final_shr + 7)`` is within ``threshold``;
    else the channel-wise transform when its high-precision error is; else the TFLM op.
    Returns ``mode`` (index into :data:`TRANSFORM_MODES`) and the channel-wise parameters
    (``shifts``, ``multipliers``, ``biases``, ``final_shr``; zeros when unused)."""
    from hwjax.xs3._otfn import _solve_exponents

    m, beta, amin, amax = canonical_transform(weights, bias_q, s_in, z_in, s_w, s_out, z_out)
    A, M = _solve_exponents(m, beta, amin, amax)
    zeros = np.zeros(m.size, np.int32)
    cw = {"shifts": zeros, "multipliers": zeros, "biases": zeros, "final_shr": np.int32(0)}
    if 2.0 ** -(A + M - VLMUL_SHR - 8 + 7) <= threshold:
        return {"mode": np.int32(0), **cw}
    qp = channelwise_params(m, beta, amin, amax)
    if channelwise_error(m, beta, amin, amax, qp) <= threshold:
        return {"mode": np.int32(1), **qp}
    return {"mode": np.int32(2), **cw}


def _compiled_params(op: str):
    def params(target, attrs, portable, q_in, q_out):
        p = xformer_linear_params(op, portable, q_in, q_out)
        choice = host_recipe(lambda *a: xformer_transform_choice(*a), p["kernel"], jnp.pad(
            jnp.asarray(portable["bias"], _I32), (0, p["kernel"].shape[0] - portable["bias"].shape[0])),
            q_in[0].scale, q_in[0].zero_point, _padded_scales(portable, p["kernel"].shape[0]), q_out.scale,
            q_out.zero_point)
        try:  # the TFLM fallback (check_xformer_lowering refuses layers that need one TFLite cannot run)
            tflm = TFLite._impls[op].params(target, attrs, portable, q_in, q_out)
        except UnsupportedOpError:
            tflm = None
        return {**p, "choice": choice, "tflm": tflm}

    return params


def _padded_scales(portable, c_pad: int) -> jax.Array:
    k = portable["kernel"]
    co = k.shape[-1] if k.ndim == 3 else k.shape[0]
    sw = jnp.broadcast_to(jnp.asarray(portable["w_scale"], jnp.float32), (co,))
    return jnp.concatenate([sw, jnp.zeros((c_pad - co,), jnp.float32)])


def _compiled_run(op: str):
    def run(target, attrs, p, x, return_acc: bool = False):
        if tuple(attrs.get("dilation", (1, 1))) != (1, 1) or attrs.get("depth_multiplier", 1) != 1:
            from hwjax.errors import UnsupportedOpError
            raise UnsupportedOpError(f"target {target!r}: {op} with dilation {attrs.get('dilation', (1, 1))}, "
                                     f"depth_multiplier {attrs.get('depth_multiplier', 1)}: only (1, 1), 1 supported")
        k = p["kernel"]
        co = x.shape[-1] if op == "depthwise_conv" else attrs["features"]  # before padding
        if op == "dense":
            x, geom = x[:, None, None, :], None
        else:
            geom = geometry(attrs, x.shape)
        pad_tl = (0, 0) if geom is None else (geom.padding[0][0], geom.padding[1][0])
        out_hw = (1, 1) if geom is None else geom.out_hw
        common = dict(initial_shift=p["shifts"][0], final_shr=p["shifts"][1],
                      stride=(1, 1) if geom is None else geom.stride, pad_top_left=pad_tl, pad_value=p["zin"],
                      out_shape=out_hw, variant=target.variant)
        x_in = x
        if op == "depthwise_conv":
            extra = k.shape[0] - co
            xp = jnp.concatenate([x, jnp.zeros((*x.shape[:-1], extra), x.dtype)], axis=-1)
            y, acc = xs3.depthwise_conv2d(xp, jnp.moveaxis(k[..., 0], 0, -1), p["multipliers"], p["biases"],
                                          return_accumulators=True, **common)
        else:
            if x.shape[-1] == 3:  # XC_pad_3_to_4 (the 4th channel meets zero weights)
                x = jnp.concatenate([x, jnp.broadcast_to(p["zin"], (*x.shape[:-1], 1)).astype(x.dtype)], axis=-1)
                k = jnp.concatenate([k, jnp.zeros((*k.shape[:-1], 1), k.dtype)], axis=-1)
            y, acc = xs3.conv2d(x, k, p["multipliers"], p["biases"], return_accumulators=True, **common)
        c = p["choice"]
        y_cw = xs3.otfn_int8_channelwise(acc, c["shifts"], c["multipliers"], c["biases"], final_shr=c["final_shr"],
                                         variant=target.variant)
        y = jnp.where(c["mode"] == 1, y_cw, y)[..., :co].astype(_I32)
        if attrs.get("activation") == "relu":  # XC_lookup of ReLU with equal quantisation
            y = jnp.maximum(y, p["zout"])
        y = y[:, 0, 0, :] if op == "dense" else y
        if p["tflm"] is None:
            return no_acc(y, return_acc)
        y_tflm = TFLite._impls[op].run(target, attrs, p["tflm"], x_in[:, 0, 0, :] if op == "dense" else x_in)
        return no_acc(jnp.where(c["mode"] == 2, y_tflm, y), return_acc)

    return run


for _op in ("conv", "depthwise_conv", "dense"):
    XS3Compiled.implements(_op, params=_compiled_params(_op), host_params=_compiled_params(_op))(_compiled_run(_op))


def xformer_mean_scale(s_in, s_out, count) -> np.float32:
    """``XC_mean``'s ``scale_mul`` as xformer computes it: ``float32(double(s_in) /
    double(s_out) / count)`` (the file's float32 scales widened to double)."""
    return np.float32(np.float64(np.float32(s_in)) / np.float64(np.float32(s_out)) / np.float64(count))


def _c_round(v: float) -> int:
    """C ``round``: half away from zero."""
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def xformer_add_params(s1, z1, s2, z2, s_out, z_out) -> dict:
    """``XC_add``'s ``m1, m2, bias, shift`` as xformer derives them (double arithmetic on
    the float32 scales): ``r_i = s_i / s_out``, ``shift = floor(log2(2**14 / max(r1, r2)))``,
    ``m_i = round(r_i 2**shift)``, ``bias = round((z_out - z1 r1 - z2 r2) 2**shift)`` (C
    ``round``, half away from zero). Returns int32 NumPy scalars."""
    r1 = np.float64(np.float32(s1)) / np.float64(np.float32(s_out))
    r2 = np.float64(np.float32(s2)) / np.float64(np.float32(s_out))
    shift = int(np.floor(np.log2(2.0**14 / max(r1, r2))))
    bias = (float(z_out) - float(z1) * r1 - float(z2) * r2) * 2.0**shift
    return {"m1": np.int32(_c_round(r1 * 2.0**shift)), "m2": np.int32(_c_round(r2 * 2.0**shift)),
            "bias": np.int32(_c_round(bias)), "shift": np.int32(shift)}


def _mean_params(target, attrs, portable, q_in, q_out):
    r = host_recipe(lambda si, so: {"scale": xformer_mean_scale(si, so, attrs["count"])}, q_in[0].scale, q_out.scale)
    return {**r, "zi": jnp.asarray(q_in[0].zero_point, jnp.float32), "zo": jnp.asarray(q_out.zero_point, jnp.float32)}


@XS3Compiled.implements("mean", params=_mean_params)
def _mean(target, attrs, p, x, return_acc: bool = False):
    """TFLite MEAN over contiguous axes as ``XC_mean`` (float32, :func:`mean_f32`)."""
    axes, shape = tuple(attrs["axes"]), x.shape[1:]
    outer, n = int(np.prod(shape[:axes[0]])), int(np.prod(shape[axes[0]:axes[-1] + 1]))
    y = mean_f32(x, outer, n, int(np.prod(shape[axes[-1] + 1:])), p["zi"], p["zo"], p["scale"])
    kept = [d for i, d in enumerate(shape) if i not in axes]
    if attrs.get("keep_dims"):
        kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return no_acc(y.reshape(x.shape[0], *kept), return_acc)


def _add_params(target, attrs, portable, q_in, q_out):
    return host_recipe(xformer_add_params, q_in[0].scale, q_in[0].zero_point, q_in[1].scale, q_in[1].zero_point,
                       q_out.scale, q_out.zero_point)


@XS3Compiled.implements("add", params=_add_params)
def _add(target, attrs, p, x1, x2, return_acc: bool = False):
    """TFLite ADD (no fused activation) as ``XC_add``."""
    y = xs3.add_int8(x1, x2, multiplier0=p["m1"], multiplier1=p["m2"], bias=p["bias"], shift=p["shift"],
                     variant=target.variant)
    return no_acc(y.astype(_I32), return_acc)


def xformer_avgpool_as_depthwise(attrs, channels: int):
    """The DEPTHWISE_CONV_2D xformer puts in place of an AVERAGE_POOL_2D
    (``ReplaceAvgPoolWithConv2D``): every weight 1 with scale ``float32(1 / (kh kw))``,
    zero bias, the pool's window, strides and (VALID) padding. Returns (attrs, portable
    params) of a hwjax ``depthwise_conv`` node."""
    kh, kw = (int(v) for v in attrs["window"])
    dw_attrs = {"kernel_size": (kh, kw), "stride": tuple(int(v) for v in attrs["strides"]),
                "padding": ((0, 0), (0, 0)), "dilation": (1, 1), "depth_multiplier": 1, "activation": None}
    portable = {"kernel": jnp.ones((kh, kw, channels), jnp.int8), "bias": jnp.zeros((channels,), _I32),
                "w_scale": jnp.asarray(np.float32(1.0 / (kh * kw)))}
    return dw_attrs, portable


def _avgpool_params(target, attrs, portable, q_in, q_out):
    """The quantisations only: the depthwise parameters need the channel count, which
    the run reads from the input's shape."""
    return {"q_in": q_in[0], "q_out": q_out}


def _avgpool_run(target, attrs, p, x, return_acc: bool = False):
    """AVERAGE_POOL_2D as xformer's depthwise replacement (:func:`xformer_avgpool_as_depthwise`),
    then as every compiled DEPTHWISE_CONV_2D."""
    dw_attrs, dw = xformer_avgpool_as_depthwise(attrs, x.shape[-1])
    dw_p = _compiled_params("depthwise_conv")(target, dw_attrs, dw, [p["q_in"]], p["q_out"])
    return _compiled_run("depthwise_conv")(target, dw_attrs, dw_p, x, return_acc)


def xformer_lut_table(fn: str, s_in, z_in, s_out, z_out) -> np.ndarray:
    """xformer's ``XC_lookup`` table of a TANH / LOGISTIC / RELU / RELU6 (``getLookupTableI8``):
    for every int8 ``n``, ``v = (n - z_in) * double(s_in)``, ``f = tanh(v)``, ``1 / (1 +
    exp(-v))``, ``max(v, 0)`` or ``min(max(v, 0), 6)`` (C double, here the C library's through
    :mod:`math`), ``t = round(f / double(s_out)) + z_out`` (C ``round``: half away from
    zero) clamped to int8. Returns int32 (256,),
    indexed by the input's byte (``u8(n)``)."""
    f = {"tanh": math.tanh, "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v)), "relu": lambda v: max(v, 0.0),
         "relu6": lambda v: min(max(v, 0.0), 6.0)}[fn]
    si, so = float(np.float32(s_in)), float(np.float32(s_out))
    out = np.zeros(256, np.int32)
    for n in range(-128, 128):
        out[n & 0xFF] = min(max(_c_round(f((n - int(z_in)) * si) / so) + int(z_out), -128), 127)
    return out


def _lut_params(target, attrs, portable, q_in, q_out):
    fn = attrs["fn"]
    return host_recipe(lambda si, zi, so, zo: {"table": xformer_lut_table(fn, si, zi, so, zo)}, q_in[0].scale,
                       q_in[0].zero_point, q_out.scale, q_out.zero_point)


XS3Compiled.implements("avgpool", params=_avgpool_params, host_params=_avgpool_params)(_avgpool_run)


_TFLM_ACTIVATION = XS3Compiled._impls["activation"]


def xformer_drops_activation(fn: str, s_in, z_in, s_out, z_out):
    """Whether XS3Compiled runs an ``activation`` node as the identity: a RELU_N1_TO_1, or a
    RELU6 with output zero point -128, between equal quantisations. That is what xformer
    1.4.2 does with such an activation fused into a CONV_2D / DEPTHWISE_CONV_2D /
    FULLY_CONNECTED / AVERAGE_POOL_2D that it converts to ``XC_conv2d_v2`` (verified on
    tests/data/xformer_act): a fused RELU or RELU6 whose output zero point is not -128
    becomes a separate ``XC_lookup``, any other fused activation is dropped (the output
    transform clamps to the int8 range only). :func:`check_xformer_lowering` refuses a graph
    where this local rule would drop an activation xformer keeps (one that is not fused
    into such an op, or whose op stays a TFLM op), unless its clamp is the identity."""
    if fn not in ("relu6", "relu_n1_to_1"):
        return jnp.asarray(False)
    same = (jnp.asarray(s_in, jnp.float32) == jnp.asarray(s_out, jnp.float32)) & \
        (jnp.asarray(z_in, jnp.int32) == jnp.asarray(z_out, jnp.int32))
    return same & (jnp.asarray(z_out, jnp.int32) == -128) if fn == "relu6" else same


def _activation_params(target, attrs, portable, q_in, q_out):
    fn = attrs["fn"]
    p = {"tflm": _TFLM_ACTIVATION.params(target, attrs, portable, q_in, q_out),
         "drop": xformer_drops_activation(fn, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)}
    if fn in ("relu", "relu6"):
        p["table"] = _lut_params(target, attrs, portable, q_in, q_out)["table"]
    return p


@XS3Compiled.implements("activation", params=_activation_params, host_params=_activation_params)
def _activation(target, attrs, p, x, return_acc: bool = False):
    """RELU / RELU6 as ``XC_lookup`` (xformer's table, :func:`xformer_lut_table`), the
    identity where xformer drops a fused activation (:func:`xformer_drops_activation`), else
    (RELU_N1_TO_1, a TFLM op) TFLM's kernel."""
    if "table" in p:
        y = jnp.take(p["table"], x.astype(_I32) & 0xFF, axis=0)
    else:
        y = _TFLM_ACTIVATION.run(target, attrs, p["tflm"], x)
    return no_acc(jnp.where(p["drop"], x.astype(_I32), y), return_acc)


@XS3Compiled.implements("lut", params=_lut_params, host_params=_lut_params)
def _lut(target, attrs, p, x, return_acc: bool = False):
    """TANH / LOGISTIC as ``XC_lookup`` with xformer's table (:func:`xformer_lut_table`)."""
    return no_acc(jnp.take(p["table"], x.astype(_I32) & 0xFF, axis=0), return_acc)


_EXPF_N = 32
#: glibc's ``__exp2f_data.tab``: the bits of double(2**(i/32)) minus ``i << 47``
_EXPF_TAB = np.array([0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
                      0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
                      0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
                      0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
                      0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
                      0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
                      0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
                      0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540], np.uint64)


def c_expf(x) -> np.ndarray:
    """The C library's ``expf`` as xformer's Linux build calls it: glibc's (>= 2.28; Arm's
    optimized-routines algorithm, error < 0.502 ULP, so not always the correctly rounded
    value): ``k = rint(x 32/ln2)``, ``r = x 32/ln2 - k``, ``2**(k/32)`` from the table,
    ``s (C0 r**3 + C1 r**2 + C2 r + 1)`` in double, rounded to float32. Elementwise on
    float32 values; +inf above 0x1.62e42ep6, 0 below -0x1.9fe368p6."""
    xd = np.asarray(x, np.float32).astype(np.float64)
    c0 = float.fromhex("0x1.c6af84b912394p-5") / _EXPF_N ** 3
    c1 = float.fromhex("0x1.ebfce50fac4f3p-3") / _EXPF_N ** 2
    c2 = float.fromhex("0x1.62e42ff0c52d6p-1") / _EXPF_N
    shift = float.fromhex("0x1.8p+52")
    with np.errstate(all="ignore"):  # the special cases are replaced below
        z = float.fromhex("0x1.71547652b82fep+0") * _EXPF_N * np.where(np.isfinite(xd), xd, 0.0)
        kd = z + shift
        ki = kd.view(np.uint64)
        r = z - (kd - shift)
        s = (_EXPF_TAB[ki % np.uint64(_EXPF_N)] + (ki << np.uint64(47))).view(np.float64)
        y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
        out = (y * s).astype(np.float32)
    out = np.where(xd > float.fromhex("0x1.62e42ep6"), np.float32(np.inf), out)
    out = np.where(xd < -float.fromhex("0x1.9fe368p6"), np.float32(0), out)
    return np.where(np.isnan(xd), np.float32(np.nan), out).astype(np.float32)


def xformer_softmax_table(s_in, z_in) -> np.ndarray:
    """``XC_softmax``'s float32 table as xformer computes it (``getExpLookupF32``): entry
    ``i`` is ``expf(float((i - 128 - z_in) * double(s_in)))`` (:func:`c_expf`)."""
    v = (np.arange(256, dtype=np.float64) - 128 - int(z_in)) * float(np.float32(s_in))
    return c_expf(v.astype(np.float32))


def _softmax_params(target, attrs, portable, q_in, q_out):
    return host_recipe(lambda si, zi: {"table": xformer_softmax_table(si, zi)}, q_in[0].scale, q_in[0].zero_point)


@XS3Compiled.implements("softmax", params=_softmax_params, host_params=_softmax_params)
def _softmax(target, attrs, p, x, return_acc: bool = False):
    """SOFTMAX (beta 1, one row, output 1/256 - 128; :func:`check_xformer_lowering`) as
    ``XC_softmax``."""
    y = _xc_softmax(target, {"out_shape": x.shape[1:]}, p, x)
    return no_acc(y, return_acc)


def xformer_mul_params(s1, z1, s2, z2, s_out, z_out) -> dict:
    """``XC_mul``'s ``nn_mul_params_t`` as xformer computes it (lib_nn ``mul_boggle`` on the
    file's float32 scales widened to double): ``in_i = -z_i - 1`` (int8), and from
    ``vlashr_shr = -1`` down, the first shift for which ``scalar = round(r 2**(23 + shr))``
    (``r = s1 s2 / s_out``) fits int16 with both extreme products and ``bias =
    round(z_out 2**(8 + shr))`` fits int16 with both sums. Returns int32 NumPy scalars
    (``in1_zero_point``, ``in2_zero_point``, ``bias``, ``scalar``, ``vlashr_shr``)."""
    def i8(v):
        return (int(v) + 128) % 256 - 128

    def i16(v):
        return (int(v) + 32768) % 65536 - 32768

    p1, p2 = i8(-int(z1) - 1), i8(-int(z2) - 1)
    ratio = float(np.float32(s1)) * float(np.float32(s2)) / float(np.float32(s_out))
    acc1, acc2 = (127 - p1) * (127 - p2), (-128 - p1) * (-128 - p2)
    max_accu, min_accu = (max(acc1, acc2) + 1) >> 1, (min(acc1, acc2) + 1) >> 1
    def i32(v):  # int32 arithmetic wraps (x86)
        return (int(v) + 2**31) % 2**32 - 2**31

    shr = -1
    while True:
        s = _c_round(ratio * 2.0 ** (1 + 14 + 8 + shr))
        if not -2**31 <= s < 2**31:
            s = -2**31  # x86's conversion of an out-of-range double: rejected below as not int16
        maxp, minp = i32(max_accu * s + (1 << 13)) >> 14, i32(min_accu * s + (1 << 13)) >> 14
        if i16(s) != s or i16(maxp) != maxp or i16(minp) != minp:
            shr -= 1
            if shr < -64:
                raise UnsupportedOpError("XC_mul: mul_boggle finds no shift")
            continue
        b = _c_round(float(z_out) * 2.0 ** (8 + shr))
        if i16(b) != b or i16(maxp + b) != maxp + b or i16(minp + b) != minp + b:
            shr -= 1
            if shr < -64:
                raise UnsupportedOpError("XC_mul: mul_boggle finds no shift")
            continue
        return {"in1_zero_point": np.int32(p1), "in2_zero_point": np.int32(p2), "bias": np.int32(b),
                "scalar": np.int32(s), "vlashr_shr": np.int32(shr)}


def _mul_params(target, attrs, portable, q_in, q_out):
    return host_recipe(xformer_mul_params, q_in[0].scale, q_in[0].zero_point, q_in[1].scale, q_in[1].zero_point,
                       q_out.scale, q_out.zero_point)


@XS3Compiled.implements("mul", params=_mul_params, host_params=_mul_params)
def _mul(target, attrs, p, x1, x2, return_acc: bool = False):
    """TFLite MUL (same shapes, no fused activation) as ``XC_mul`` (:func:`xformer_mul_params`)."""
    y = _xc_mul(target, {**p, "out_shape": x1.shape[1:]}, None, x1, x2)
    return no_acc(y, return_acc)


def check_xformer_lowering(graph) -> None:
    """Raises UnsupportedOpError unless :class:`XS3Compiled` computes what xformer (default
    options) + lib_tflite_micro compute for ``graph`` (an original model with concrete
    parameters): every op kind must be in :data:`COMPILED_OPS` (ADD without a fused
    activation, MEAN over contiguous axes), and a linear layer that keeps the group
    transform must have its shifts in the assembly's ranges, and one that xformer leaves
    as a TFLM op must be one :class:`hwjax.targets.TFLite` ``("tflm")`` runs."""
    from hwjax.graph import Graph

    if not isinstance(graph, Graph):
        raise ArgTypeError(f"graph must be a hwjax.graph.Graph (an original model's, e.g. "
                           f"hwjax.tflite.load(path).graph), got {type(graph).__name__}")
    with evaluated_if_concrete(graph):  # host checks on concrete values, also inside a trace
        _check_xformer_lowering(graph)


def _check_xformer_lowering(graph) -> None:
    for node in graph.nodes:
        if node.op not in COMPILED_OPS:
            raise UnsupportedOpError(f"runtime 'xs3' on an original model: node {node.name!r} ({node.op}) is not "
                                     f"compiled as xformer does yet (supported: {list(COMPILED_OPS)}); convert the "
                                     "model with xformer and load its output instead")
        if node.op == "add" and node.attrs.get("activation") is not None:
            raise UnsupportedOpError(f"node {node.name!r}: ADD with a fused activation is not compiled yet")
        axes = tuple(node.attrs.get("axes", ()))
        if node.op == "mean" and axes != tuple(range(axes[0], axes[-1] + 1)):
            raise UnsupportedOpError(f"node {node.name!r}: MEAN over non-contiguous axes {axes} stays a TFLM op "
                                     "in xformer, which is not implemented here")
        q_out = graph.tensors[node.outputs[0]].quant if node.outputs[0] in graph.tensors else None
        if node.op == "lut" and node.attrs["fn"] not in ("tanh", "sigmoid"):
            raise UnsupportedOpError(f"node {node.name!r}: lut {node.attrs['fn']!r} is not compiled as xformer does")
        if node.op in ("lut", "softmax", "mul", "concat", "avgpool", "activation") and \
                any(graph.tensors[t].dtype != "int8" for t in (*node.inputs, *node.outputs)):
            raise UnsupportedOpError(f"node {node.name!r} ({node.op}): only int8 tensors are compiled as xformer does")
        if node.op == "softmax":
            shape = graph.tensors[node.inputs[0]].shape
            if float(node.attrs.get("beta", 1.0)) != 1.0 or len(shape) != 1 or \
                    float(np.asarray(q_out.scale)) != 1 / 256 or int(np.asarray(q_out.zero_point)) != -128:
                raise UnsupportedOpError(f"node {node.name!r}: only a SOFTMAX with beta 1 over one row (a (1, n) "
                                         "tensor) with output quantisation 1/256, -128 becomes XC_softmax; xformer "
                                         f"keeps this one (beta {node.attrs.get('beta', 1.0)}, shape {shape}) as a "
                                         "TFLM op or a batched XC op, which is not implemented here")
        if node.op == "mul":
            shapes = [graph.tensors[t].shape for t in (*node.inputs, *node.outputs)]
            if node.attrs.get("activation") is not None or len(set(shapes)) != 1:
                raise UnsupportedOpError(f"node {node.name!r}: only MUL of same-shape inputs {shapes} without a fused "
                                         "activation is compiled as XC_mul")
        if node.op == "concat":
            qs = {(float(np.asarray(graph.tensors[t].quant.scale)), int(np.asarray(graph.tensors[t].quant.zero_point)))
                  for t in (*node.inputs, *node.outputs)}
            if len(qs) != 1:
                raise UnsupportedOpError(f"node {node.name!r}: a CONCATENATION whose tensors are quantised "
                                         f"differently ({sorted(qs)}) becomes XC_concat, which copies bytes without "
                                         "requantising; not emulated")
    xc_linear = set()  # outputs of the linear ops (and average pools) that become XC_conv2d_v2
    for node in graph.nodes:
        if node.op == "avgpool":  # xformer's depthwise replacement
            dw_attrs, dw = xformer_avgpool_as_depthwise(node.attrs, graph.tensors[node.inputs[0]].shape[-1])
            node = node.replace(op="depthwise_conv", attrs=dw_attrs, params=dw)
        if node.op in ("conv", "depthwise_conv", "dense"):
            q_in = [graph.tensors[t].quant for t in node.inputs]
            p = xformer_linear_params(node.op, node.params, q_in, graph.tensors[node.outputs[0]].quant)
            initial_shift, final_shr = (int(v) for v in np.asarray(p["shifts"]))
            if 2.0 ** -(final_shr + 7) <= ERR_THRESHOLD:
                if not (-16 <= initial_shift <= 16 and -16 <= final_shr <= 15):
                    raise UnsupportedOpError(f"node {node.name!r} ({node.op}): xformer's shifts ({initial_shift}, "
                                             f"{final_shr}) leave the otfn_int8 ranges")
                xc_linear.add(node.outputs[0])
                continue
            choice = xformer_transform_choice(
                np.asarray(p["kernel"]), np.pad(np.asarray(node.params["bias"]), (0, p["kernel"].shape[0] -
                                                                                   node.params["bias"].shape[0])),
                np.asarray(q_in[0].scale), np.asarray(q_in[0].zero_point), np.asarray(_padded_scales(
                    node.params, p["kernel"].shape[0])), np.asarray(graph.tensors[node.outputs[0]].quant.scale),
                np.asarray(graph.tensors[node.outputs[0]].quant.zero_point))
            if int(choice["mode"]) == 2:  # xformer leaves the TFLM op: TFLite must run it
                TFLite("tflm").lowering(node.op).params(TFLite("tflm"), node.attrs, node.params, q_in,
                                                        graph.tensors[node.outputs[0]].quant)
            else:
                xc_linear.add(node.outputs[0])
    _check_activations(graph, xc_linear)


def _check_activations(graph, xc_linear: set) -> None:
    """Refuses an ``activation`` node that :func:`xformer_drops_activation` would drop
    although xformer keeps it: one not fused (by the importer's split, ``:pre_activation``)
    into a linear op or average pool xformer converts (``xc_linear``: their outputs), unless
    its clamp is the whole int8 range (then dropping it changes nothing). Also a RELU after
    a CONV_2D between different quantisations, which xformer merges into the conv
    (``TFLPatterns.td``), which is not emulated."""
    from hwjax.tflite import PRE_ACTIVATION

    producer = {t: n for n in graph.nodes for t in n.outputs}
    for node in graph.nodes:
        if node.op != "activation":
            continue
        fn, src = node.attrs["fn"], node.inputs[0]
        q_in, q_out = graph.tensors[src].quant, graph.tensors[node.outputs[0]].quant
        if q_in is None or q_out is None:
            continue
        fused = src.endswith(PRE_ACTIVATION) and src in xc_linear
        if not fused and bool(xformer_drops_activation(fn, q_in.scale, q_in.zero_point, q_out.scale,
                                                       q_out.zero_point)) and \
                activation_range(fn, q_out.scale, q_out.zero_point) != (-128, 127):
            what = producer[src].op if src in producer else "a graph input"
            raise UnsupportedOpError(f"node {node.name!r}: a {fn} with output zero point "
                                     f"{int(np.asarray(q_out.zero_point))} that is not fused into a conv/depthwise/"
                                     f"dense/avgpool which xformer converts (its input comes from {what}) is not "
                                     "compiled as xformer does (xformer 1.4.2 drops it only when fused; not verified "
                                     "otherwise)")
        if fn == "relu" and src in producer and producer[src].op == "conv" and not src.endswith(PRE_ACTIVATION) and \
                (float(np.asarray(q_in.scale)) != float(np.asarray(q_out.scale)) or
                 int(np.asarray(q_in.zero_point)) != int(np.asarray(q_out.zero_point))):
            raise UnsupportedOpError(f"node {node.name!r}: a RELU after a CONV_2D between different quantisations "
                                     "(xformer merges it into the conv) is not compiled as xformer does")


XS3Compiled.native = XS3Runtime.native | {"conv", "depthwise_conv", "dense", "mean", "add", "lut", "softmax", "mul",
                                           "avgpool"}
register("xs3-xformer", XS3Compiled)
