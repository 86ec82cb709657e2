"""ONNX Runtime's CPU execution provider as a target: :class:`OnnxRuntime` (spec onnxruntime.md).

The op kinds of :mod:`hwjax.graph.ops.onnx` (and ``quantize``, ``dequantize``,
``reshape``) as ONNX Runtime 1.32's CPU kernels compute them on x86-64, composed from
:mod:`hwjax.ort`. Every recipe (multipliers, tables) is computed on the host from the
graph's concrete scales (``jax.pure_callback`` when they are traced).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from hwjax.errors import RangeError
from hwjax.graph import OpImpl, Quant
from hwjax.graph.ops.onnx import batched_const, window_geometry
from hwjax.ort import (
    avgpool_float,
    conv_acc,
    conv_acc_u8s8_avx2,
    dequantize_linear,
    float_binary,
    global_avgpool,
    global_pool_scale,
    logistic_jax,
    lookup,
    lookup2,
    lut_table,
    matmul_acc,
    matmul_acc_u8s8_avx2,
    maxpool,
    output_scale,
    qlinear_add_table,
    qlinear_mul_table,
    quantize_linear,
    requantize_output,
    type_range,
)
from hwjax.targets._base import Target, no_acc, register
from hwjax.targets._tflite import host_recipe

#: the CPUs whose arithmetic :class:`OnnxRuntime` selects (``cpu=``)
CPUS = ("vnni", "avx2", "sse")


@dataclass(frozen=True)
class OnnxRuntime(Target):
    """ONNX Runtime's CPU execution provider (x86-64, the Linux build), bit-exact for int8 models.

    ``cpu``: ``"vnni"`` (default; AVX-512 VNNI / AVX-VNNI / AMX machines: exact int32
    products, FMA3 logistic), ``"avx2"`` (AVX2 and FMA3 without VNNI: the u8 x s8 GEMM and
    ConvSym kernels of QLinearConv, QLinearMatMul, QGemm and MatMulInteger
    saturate each pair of products to int16 (:func:`hwjax.ort.conv_acc_u8s8_avx2`,
    :func:`hwjax.ort.matmul_acc_u8s8_avx2`); depthwise convolutions, ConvInteger, u8 x u8 and
    s8 x s8 stay exact), ``"sse"`` (SSE4.2 only: exact products, the logistic without FMA).

    ``x64quantprecision``: the session option ``session.x64quantprecision`` is set (``"1"``).
    On ``"avx2"`` ONNX Runtime then rewrites the int8 weights of the nodes whose
    ``x64_u8_weights`` attribute is True (QLinearConv, MatMulInteger, QGemm, QLinearMatMul
    before opset 21) as uint8, and their products are exact; elsewhere it changes nothing.
    """

    cpu: str = "vnni"
    x64quantprecision: bool = False
    name: ClassVar[str] = "onnxruntime"

    def __post_init__(self):
        if self.cpu not in CPUS:
            raise RangeError(f"cpu must be one of {CPUS}, got {self.cpu!r}")
        if not isinstance(self.x64quantprecision, bool):
            raise RangeError(f"x64quantprecision must be True or False, got {self.x64quantprecision!r}")

    @property
    def fma(self) -> bool:
        """Whether the CPU's logistic kernel uses fused multiply-adds (FMA3)."""
        return self.cpu != "sse"

    def lowering(self, op: str):
        impl = super().lowering(op)
        if impl.params is not None and impl.host_params is None:
            impl = dataclasses.replace(impl, host_params=impl.params)
        return impl


def _scalar(v, dtype=np.float32):
    return np.asarray(v, dtype).reshape(())


# --------------------------------------------------------------------- quantize / dequantize


def _quantize_params(target, attrs, portable, q_in, q_out):
    lo, hi = type_range(attrs.get("dtype", "int8"))
    return {
        "scale": jnp.asarray(q_out.scale, jnp.float32),
        "zp": jnp.asarray(q_out.zero_point, jnp.int32),
        "lo": jnp.int32(lo),
        "hi": jnp.int32(hi),
    }


@OnnxRuntime.implements("quantize", params=_quantize_params)
def _quantize(target, attrs, p, x, return_acc: bool = False):
    """QuantizeLinear of a float32 tensor (an integer input passes through)."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return no_acc(x.astype(jnp.int32), return_acc)
    lo, hi = type_range(attrs.get("dtype", "int8"))
    return no_acc(quantize_linear(x, p["scale"], p["zp"], lo, hi), return_acc)


def _dequantize_params(target, attrs, portable, q_in, q_out):
    return {"scale": jnp.asarray(q_in[0].scale, jnp.float32), "zp": jnp.asarray(q_in[0].zero_point, jnp.int32)}


@OnnxRuntime.implements("dequantize", params=_dequantize_params)
def _dequantize(target, attrs, p, x, return_acc: bool = False):
    return no_acc(dequantize_linear(x, p["scale"], p["zp"]), return_acc)


# ---------------------------------------------------------------------------- linear ops


def _narrow(op, params):
    """Registers ``run`` for ``op`` with its int8 / uint8 input in its storage type (the
    kernel depends on whether it reads uint8)."""

    def deco(run):
        OnnxRuntime.implement(op, OpImpl(run, params=params, narrow_inputs=True))
        return run

    return deco


def _in_zp(portable, q_in):
    """The input zero point: ConvInteger's / MatMulInteger's own (``x_zero_point``), else the
    input tensor's."""
    if "x_zero_point" in portable:
        return portable["x_zero_point"]
    return q_in[0].zero_point


def _conv_params(target, attrs, portable, q_in, q_out):
    o = portable["weight"].shape[0]
    p = {
        "weight": jnp.asarray(portable["weight"]),
        "x_zp": jnp.asarray(_in_zp(portable, q_in), jnp.int32),
        "w_zp": jnp.asarray(portable["w_zero_point"], jnp.int32),
    }
    if q_out is None:  # conv_integer
        return p
    m = host_recipe(
        lambda sx, sw, sy: {"m": np.broadcast_to(output_scale(sx, sw, sy), (o,)).astype(np.float32)},
        q_in[0].scale,
        portable["w_scale"],
        q_out.scale,
    )["m"]
    bias = portable.get("bias")
    bias = jnp.zeros((o,), jnp.int32) if bias is None else jnp.asarray(bias, jnp.int32)
    return {
        **p,
        "m": m.reshape(o, 1, 1),
        "bias": bias.reshape(o, 1, 1),
        "y_zp": jnp.asarray(q_out.zero_point, jnp.int32),
    }


def _saturates(target, attrs, x, w) -> bool:
    """Whether the u8 x s8 kernels of ``target``'s CPU saturate pairs of products (AVX2
    without VNNI), unless ``session.x64quantprecision`` made the node's weights uint8 (u8 x
    u8 products are exact there). (ONNX Runtime skips that rewrite when every weight lies in
    [-64, 63]; no pair of products can saturate then, so both give the exact sum.)"""
    fixed = target.x64quantprecision and bool(attrs.get("x64_u8_weights", True))
    return target.cpu == "avx2" and x.dtype == jnp.uint8 and w.dtype == jnp.int8 and not fixed


def _conv_acc(target, attrs, p, x, *, integer: bool = False):
    """The convolution accumulators; ConvInteger (``integer``) computes exact products on
    AVX2 CPUs too (stored Haswell outputs)."""
    geom = window_geometry(attrs, x.shape)
    kernel = conv_acc_u8s8_avx2 if _saturates(target, attrs, x, p["weight"]) and not integer else conv_acc
    return kernel(x, p["weight"], p["x_zp"], p["w_zp"], geom, int(attrs.get("group", 1)))


def _matmul_acc(target, attrs, p, x):
    kernel = matmul_acc_u8s8_avx2 if _saturates(target, attrs, x, p["weight"]) else matmul_acc
    return kernel(x, p["weight"], p["a_zp"], p["w_zp"])


@_narrow("qlinear_conv", params=_conv_params)
def _qlinear_conv(target, attrs, p, x, return_acc: bool = False):
    """QLinearConv: exact accumulators, then ``MlasRequantizeOutput``."""
    lo, hi = type_range(attrs.get("out_dtype", "uint8"))
    acc = _conv_acc(target, attrs, p, x) + p["bias"]
    return no_acc(requantize_output(acc, p["m"], p["y_zp"], lo, hi), return_acc)


@_narrow("conv_integer", params=_conv_params)
def _conv_integer(target, attrs, p, x, return_acc: bool = False):
    return no_acc(_conv_acc(target, attrs, p, x, integer=True), return_acc)


def _matmul_params(target, attrs, portable, q_in, q_out):
    n = portable["weight"].shape[1]
    p = {
        "weight": jnp.asarray(portable["weight"]),
        "a_zp": jnp.asarray(_in_zp(portable, q_in), jnp.int32),
        "w_zp": jnp.asarray(portable["w_zero_point"], jnp.int32),
    }
    if q_out is None:  # matmul_integer
        return p
    alpha = float(attrs.get("alpha", 1.0))

    def recipe(sa, sw, sy):
        sa32 = np.float32(sa) if alpha == 1.0 else np.float32(np.float32(alpha) * np.float32(sa))
        return {"m": np.broadcast_to(output_scale(sa32, sw, sy), (n,)).astype(np.float32)}

    m = host_recipe(recipe, q_in[0].scale, portable["w_scale"], q_out.scale)["m"]
    bias = portable.get("bias")
    bias = jnp.zeros((n,), jnp.int32) if bias is None else jnp.asarray(bias, jnp.int32)
    return {**p, "m": m, "bias": bias, "y_zp": jnp.asarray(q_out.zero_point, jnp.int32)}


@_narrow("qlinear_matmul", params=_matmul_params)
def _qlinear_matmul(target, attrs, p, x, return_acc: bool = False):
    """QLinearMatMul / QGemm: exact accumulators plus the int32 bias, then
    ``MlasRequantizeOutput`` per column."""
    lo, hi = type_range(attrs.get("out_dtype", "uint8"))
    acc = _matmul_acc(target, attrs, p, x) + p["bias"]
    return no_acc(requantize_output(acc, p["m"], p["y_zp"], lo, hi), return_acc)


@_narrow("matmul_integer", params=_matmul_params)
def _matmul_integer(target, attrs, p, x, return_acc: bool = False):
    return no_acc(_matmul_acc(target, attrs, p, x), return_acc)


# ------------------------------------------------------------------------ element-wise ops


def _binary_params(target, attrs, portable, q_in, q_out):
    fn, dtype = attrs["fn"], attrs.get("out_dtype", "uint8")
    ci = attrs.get("const_index")
    if ci is None:
        qa, qb = q_in
    else:
        qc = Quant.of(portable["const_scale"], portable["const_zero_point"])
        qa, qb = (qc, q_in[0]) if ci == 0 else (q_in[0], qc)
    swap = bool(attrs.get("swap", False))

    def recipe(sa, za, sb, zb, sc, zc):
        if fn == "add":
            t = qlinear_add_table(sa, za, sb, zb, sc, zc, dtype, swap=swap)
        else:
            t = qlinear_mul_table(sa, za, sb, zb, sc, zc, dtype)
        return {"table": t}

    r = host_recipe(recipe, qa.scale, qa.zero_point, qb.scale, qb.zero_point, q_out.scale, q_out.zero_point)
    if ci is not None:
        r = {**r, "const": jnp.asarray(portable["const"], jnp.int32)}
    return r


@OnnxRuntime.implements("qlinear_binary", params=_binary_params)
def _qlinear_binary(target, attrs, p, *xs, return_acc: bool = False):
    """QLinearAdd / QLinearMul through their (256, 256) tables of every pair of codes."""
    lo, _ = type_range(attrs.get("out_dtype", "uint8"))
    ci = attrs.get("const_index")
    if ci is not None:
        c = batched_const(p["const"], xs[0].ndim)
        xs = (c, xs[0]) if ci == 0 else (xs[0], c)
    return no_acc(lookup2(xs[0], xs[1], p["table"], lo), return_acc)


def _float_binary_params(target, attrs, portable, q_in, q_out):
    if attrs.get("const_index") is None:
        return None
    return {"const": jnp.asarray(portable["const"], jnp.float32)}


@OnnxRuntime.implements("onnx_float_binary", params=_float_binary_params)
def _float_binary(target, attrs, p, *xs, return_acc: bool = False):
    ci = attrs.get("const_index")
    if ci is not None:
        c = batched_const(p["const"], xs[0].ndim)
        xs = (c, xs[0]) if ci == 0 else (xs[0], c)
    return no_acc(float_binary(attrs["fn"], xs[0], xs[1]), return_acc)


@OnnxRuntime.implements("onnx_float_unary")
def _float_unary(target, attrs, p, x, return_acc: bool = False):
    fn = attrs["fn"]
    if fn == "relu":
        y = jnp.maximum(x, jnp.float32(0))
    elif fn == "clip":
        y = jnp.minimum(jnp.maximum(x, jnp.float32(attrs.get("lo"))), jnp.float32(attrs.get("hi")))
    elif fn == "leaky_relu":
        y = jnp.where(x >= 0, x, x * jnp.float32(attrs.get("alpha", 0.01)))
    else:
        y = logistic_jax(x, fma=target.fma)
    return no_acc(y, return_acc)


def _lut_params(target, attrs, portable, q_in, q_out):
    fn, alpha = attrs["fn"], float(attrs.get("alpha", 0.01))
    din, dout = attrs.get("in_dtype", "uint8"), attrs.get("out_dtype", "uint8")
    fma = target.fma

    def recipe(sx, zx, sy, zy):
        return {"table": lut_table(fn, sx, zx, din, sy, zy, dout, alpha=alpha, fma=fma)}

    return host_recipe(recipe, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)


@OnnxRuntime.implements("qlinear_lut", params=_lut_params)
def _qlinear_lut(target, attrs, p, x, return_acc: bool = False):
    lo, _ = type_range(attrs.get("in_dtype", "uint8"))
    return no_acc(lookup(x, p["table"], lo), return_acc)


def _concat_params(target, attrs, portable, q_in, q_out):
    dins, dout = attrs["in_dtypes"], attrs.get("out_dtype", "uint8")
    tables = []
    for q, din in zip(q_in, dins):
        same = (
            din == dout
            and np.float32(q.scale) == np.float32(q_out.scale)
            and int(np.asarray(q.zero_point)) == int(np.asarray(q_out.zero_point))
        )
        if same:
            tables.append(None)
        else:
            tables.append(
                host_recipe(
                    lambda sx, zx, sy, zy, din=din: {"t": lut_table("identity", sx, zx, din, sy, zy, dout)},
                    q.scale,
                    q.zero_point,
                    q_out.scale,
                    q_out.zero_point,
                )["t"]
            )
    return {"tables": tuple(tables)}


@OnnxRuntime.implements("qlinear_concat", params=_concat_params)
def _qlinear_concat(target, attrs, p, *xs, return_acc: bool = False):
    parts = []
    for x, t, din in zip(xs, p["tables"], attrs["in_dtypes"]):
        parts.append(x if t is None else lookup(x, t, type_range(din)[0]))
    return no_acc(jnp.concatenate(parts, axis=int(attrs["axis"]) % (xs[0].ndim - 1) + 1), return_acc)


@OnnxRuntime.implements("onnx_concat")
def _concat(target, attrs, p, *xs, return_acc: bool = False):
    return no_acc(jnp.concatenate(xs, axis=int(attrs["axis"]) % (xs[0].ndim - 1) + 1), return_acc)


# ---------------------------------------------------------------------------------- pools


def _pool_params(target, attrs, portable, q_in, q_out):
    p = {
        "sx": jnp.asarray(q_in[0].scale, jnp.float32),
        "zx": jnp.asarray(q_in[0].zero_point, jnp.int32),
        "sy": jnp.asarray(q_out.scale, jnp.float32),
        "zy": jnp.asarray(q_out.zero_point, jnp.int32),
    }
    count = attrs.get("count")
    if count is not None:
        p["m"] = host_recipe(lambda sx, sy: {"m": global_pool_scale(sx, sy, int(count))}, q_in[0].scale, q_out.scale)[
            "m"
        ]
    return p


@OnnxRuntime.implements("qlinear_avgpool", params=_pool_params)
def _qlinear_avgpool(target, attrs, p, x, return_acc: bool = False):
    """QLinearAveragePool's float path (the reader gives a window covering the unpadded
    image to ``qlinear_global_avgpool``, as MLAS does)."""
    lo, hi = type_range(attrs.get("out_dtype", "uint8"))
    geom = window_geometry(attrs, x.shape)
    cip = bool(attrs.get("count_include_pad", False))
    return no_acc(avgpool_float(x, p["sx"], p["zx"], p["sy"], p["zy"], geom, cip, lo, hi), return_acc)


@OnnxRuntime.implements("qlinear_global_avgpool", params=_pool_params)
def _qlinear_global_avgpool(target, attrs, p, x, return_acc: bool = False):
    """QLinearGlobalAveragePool: MLAS's integer path with the multiplier of ``count`` pixels."""
    lo, hi = type_range(attrs.get("out_dtype", "uint8"))
    return no_acc(global_avgpool(x, p["zx"], p["m"], p["zy"], lo, hi), return_acc)


@OnnxRuntime.implements("onnx_maxpool")
def _maxpool(target, attrs, p, x, return_acc: bool = False):
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else -(2**31)
    return no_acc(maxpool(x, window_geometry(attrs, x.shape), lowest), return_acc)


# ------------------------------------------------------------------------------ layout ops


@OnnxRuntime.implements("reshape")
def _reshape(target, attrs, p, x, return_acc: bool = False):
    return no_acc(x.reshape(x.shape[0], *attrs["shape"]), return_acc)


@OnnxRuntime.implements("onnx_transpose")
def _transpose(target, attrs, p, x, return_acc: bool = False):
    return no_acc(x.transpose(0, *(int(i) + 1 for i in attrs["perm"])), return_acc)


register("onnxruntime", OnnxRuntime)
