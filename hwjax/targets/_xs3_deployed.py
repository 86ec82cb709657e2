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
:func:`xformer_add_params`, :func:`xformer_mean_scale`) and runs the result the same way;
:func:`check_xformer_lowering` refuses what it does not cover.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax import xs3
from hwjax.errors import UnsupportedOpError
from hwjax.graph import geometry
from hwjax.targets._base import Target, no_acc, register
from hwjax.targets._tflite import TFLite, host_recipe

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
            raise ValueError(f"XS3Runtime runs builtins as TFLM does: runtime must be 'tflm', got {self.runtime!r}")
        if self.variant not in xs3.VARIANTS:
            raise ValueError(f"variant must be one of {xs3.VARIANTS}, got {self.variant!r}")

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


XS3Runtime.native = frozenset(XS3Runtime._impls) - frozenset(TFLite._impls) | {"reshape"}
register("xs3-tflm", XS3Runtime)


# ------------------------------------------------ an original model, compiled as xformer does


#: the op kinds of an original model that :class:`XS3Compiled` lowers as xformer does
#: (linear ops: ``XC_conv2d_v2``; the rest run the same bytes/arithmetic either way)
COMPILED_OPS = ("conv", "depthwise_conv", "dense", "maxpool", "activation", "flatten", "reshape", "pad", "quantize",
                "add", "mean")
ERR_THRESHOLD = 0.25  # xformer's --xcore-conv-err-threshold default


@dataclass(frozen=True)
class XS3Compiled(XS3Runtime):
    """An *original* int8 model run as xformer (default options) + lib_tflite_micro run it.

    CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED become ``XC_conv2d_v2`` (xs3.md §4.5):
    output channels padded with zero weights, zero bias and weight scale 0 to a multiple
    of 4 (:func:`xformer_linear_params`), the group-wise ``otfn_int8`` parameters of
    :func:`hwjax.xs3.otfn_params`, padded taps holding the input zero point, a
    3-channel conv input padded to 4 (``XC_pad_3_to_4``), and a fused ReLU as a clamp
    (xformer's ``XC_lookup``). Per layer, :func:`xformer_transform_choice` decides as
    xformer does between the group transform, the channel-wise transform and leaving the
    TFLM op (computed on the host; all three results are computed and one is selected).
    ADD and MEAN become ``XC_add`` / ``XC_mean``. :func:`check_xformer_lowering` says what
    is not covered (``Model.run(runtime="xs3")`` calls it).
    """

    name: ClassVar[str] = "xs3-xformer"


def _padded_channels(n: int) -> int:
    return -(-n // 4) * 4


def _linear_kernel(op: str, k: jax.Array) -> jax.Array:
    """The kernel as (C_out, kh, kw, C_in) (depthwise: (C, kh, kw, 1))."""
    if op == "dense":
        return k[:, None, None, :]
    if op == "depthwise_conv":
        return jnp.moveaxis(k, -1, 0)[..., None]
    return k


def xformer_linear_params(op: str, portable, q_in, q_out) -> dict:
    """xformer's ``XC_conv2d_v2`` parameters of a conv/depthwise/dense node: the kernel
    (C_pad, kh, kw, C_in) with C_pad = C_out rounded up to a multiple of 4 (pad channels:
    zero weights, zero bias, weight scale 0), and ``otfn_params``' multipliers, biases and
    ``shifts = [initial_shift, final_shr]`` over all C_pad channels (pad channels take part
    in the exponent search, as in xformer)."""
    k = _linear_kernel(op, jnp.asarray(portable["kernel"], jnp.int8))
    co = k.shape[0]
    extra = _padded_channels(co) - co
    kp = jnp.concatenate([k, jnp.zeros((extra, *k.shape[1:]), jnp.int8)])
    bp = jnp.concatenate([jnp.asarray(portable["bias"], _I32), jnp.zeros((extra,), _I32)])
    sw = jnp.broadcast_to(jnp.asarray(portable["w_scale"], jnp.float32), (co,))
    swp = jnp.concatenate([sw, jnp.zeros((extra,), jnp.float32)])
    mul, bias, shifts = xs3.otfn_params(kp, bp, s_in=q_in[0].scale, z_in=q_in[0].zero_point, s_w=swp,
                                        s_out=q_out.scale, z_out=q_out.zero_point)
    return {"kernel": kp, "multipliers": mul, "biases": bias, "shifts": shifts,
            "zin": jnp.asarray(q_in[0].zero_point, _I32), "zout": jnp.asarray(q_out.zero_point, _I32)}


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
    XS3Compiled.implements(_op, params=_compiled_params(_op))(_compiled_run(_op))


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


def check_xformer_lowering(graph) -> None:
    """Raises UnsupportedOpError unless :class:`XS3Compiled` computes what xformer (default
    options) + lib_tflite_micro compute for ``graph`` (an original model with concrete
    parameters): every op kind must be in :data:`COMPILED_OPS` (ADD without a fused
    activation, MEAN over contiguous axes), and a linear layer that keeps the group
    transform must have its shifts in the assembly's ranges, and one that xformer leaves
    as a TFLM op must be one :class:`hwjax.targets.TFLite` ``("tflm")`` runs."""
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
        if node.op == "activation" and node.attrs["fn"] != "relu" and \
                int(np.asarray(graph.tensors[node.outputs[0]].quant.zero_point)) == -128 and \
                any(n.op in ("conv", "depthwise_conv", "dense") and node.inputs[0] in n.outputs for n in graph.nodes):
            # observed (tests/data/xformer/chain): xformer 1.4.2 drops a fused RELU6 whose output zero
            # point is -128 instead of clamping; the rule behind it is not derived yet
            raise UnsupportedOpError(f"node {node.name!r}: a fused {node.attrs['fn']} with output zero point -128 "
                                     "is not compiled as xformer does (it may drop it)")
    for node in graph.nodes:
        if node.op in ("conv", "depthwise_conv", "dense"):
            q_in = [graph.tensors[t].quant for t in node.inputs]
            p = xformer_linear_params(node.op, node.params, q_in, graph.tensors[node.outputs[0]].quant)
            initial_shift, final_shr = (int(v) for v in np.asarray(p["shifts"]))
            if 2.0 ** -(final_shr + 7) <= ERR_THRESHOLD:
                if not (-16 <= initial_shift <= 16 and -16 <= final_shr <= 15):
                    raise UnsupportedOpError(f"node {node.name!r} ({node.op}): xformer's shifts ({initial_shift}, "
                                             f"{final_shr}) leave the otfn_int8 ranges")
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


XS3Compiled.native = XS3Runtime.native | {"conv", "depthwise_conv", "dense", "mean", "add"}
register("xs3-xformer", XS3Compiled)
