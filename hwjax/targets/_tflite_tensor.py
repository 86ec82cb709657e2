"""TFLite target: the tensor op kinds (see :mod:`hwjax.graph.ops.tensor`).

``pad``, ``concat`` and ``reshape`` move data and run the same on every runtime.
``mean``, ``mul``, ``mul_const``, ``square`` and ``dequantize`` round differently per
runtime (derived from LiteRT's and XNNPACK's sources and checked bit for bit against
``ai-edge-litert``); they are declared with :func:`verified_on` for ``reference``,
``optimized``, ``xnnpack`` and ``tflm``. TFLite Micro (checked against the xmos-ai-tools
1.4.2 host interpreter, ``tests/data/tflm``) runs them as LiteRT's reference kernels do:
MEAN as :func:`hwjax.litert.mean_mbqm` on every axis set (the 4-D
keep-dims spatial case included), MUL as ``mul_mbqm``, DEQUANTIZE as
``dequantize_exact``. Each recipe
computes its integer (or float32) parameters on the host as the runtime's C++ does:
float64 where it uses ``double``, float32 where it uses ``float``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hwjax.errors import ArgTypeError, RangeError, UnsupportedOpError
from hwjax.targets._base import no_acc
from hwjax.targets._tflite import TFLite, host_recipe, verified_on
from hwjax.litert import (
    activation_range,
    concat_int,
    dequantize_exact,
    dequantize_lanes,
    mean_float,
    mean_lanes,
    mean_mbqm,
    mul_float,
    mul_int16_safe,
    mul_lanes,
    mul_mbqm,
    pad_int,
    quantize_multiplier,
    square_lut,
)

_F32 = np.float32

for _op in ("mean", "mul", "mul_const", "square", "dequantize"):
    verified_on(_op, "reference", "optimized", "xnnpack", "tflm")


def _i32(**kw) -> dict[str, np.ndarray]:
    return {k: np.int32(v) for k, v in kw.items()}


# ------------------------------------------------------------------------- data movement


def _pad_params(target, attrs, portable, q_in, q_out):
    """The pad value: PADV2's constant, else the output zero point (LiteRT ``pad.cc``)."""
    value = attrs.get("value")
    return {"value": q_out.zero_point if value is None else np.int32(value)}


@TFLite.implements("pad", params=_pad_params)
def _pad(target, attrs, p, x, return_acc: bool = False):
    return no_acc(pad_int(x, attrs["paddings"], p["value"]), return_acc)


@TFLite.implements("concat")
def _concat(target, attrs, p, *xs, return_acc: bool = False):
    return no_acc(concat_int(xs, attrs["axis"]), return_acc)


# ---------------------------------------------------------------------------------- mean


def mean_multiplier(s_in, s_out, count: int) -> dict[str, np.ndarray]:
    """LiteRT ``QuantizedMeanOrSum``: ``(m0, e0) = QuantizeMultiplier(double(s_in) /
    double(s_out))``, ``k = min(floor(log2 count), 32, 31 + e0)``,
    ``m = (m0 << k) // count`` (int64), ``e = e0 - k``."""
    m0, e0 = quantize_multiplier(float(_F32(s_in)) / float(_F32(s_out)))
    k = min(int(count).bit_length() - 1, 32, 31 + e0)
    return _i32(multiplier=(m0 << k) // int(count), shift=e0 - k)


def mean_lane_params(s_in, z_in, s_out, z_out, count: int) -> dict[str, np.ndarray]:
    """LiteRT ``optimized_integer_ops::Mean`` (float32 arithmetic):
    ``t = fl32(fl32(z_in s_in) / s_out)``, ``bias = z_out - trunc(t +- 0.5)``,
    ``(m, e) = QuantizeMultiplier(fl32(s_in / fl32(count s_out)))``."""
    s_in, s_out = _F32(s_in), _F32(s_out)
    t = _F32(_F32(_F32(int(z_in)) * s_in) / s_out)
    t = _F32(t + _F32(0.5)) if t > 0 else _F32(t - _F32(0.5))
    m, e = quantize_multiplier(float(_F32(s_in / _F32(_F32(count) * s_out))))
    return _i32(multiplier=m, shift=e, bias=int(z_out) - int(np.trunc(t)))


def mean_float_params(s_in, z_in, s_out, z_out, count: int) -> dict[str, np.ndarray]:
    """XNNPACK qs8 mean (float32): ``sm = fl32(fl32(s_in / s_out) fl32(1 / count))``,
    ``zf = fl32(z_out - fl32(fl32(count z_in) sm))``."""
    sm = _F32(_F32(_F32(s_in) / _F32(s_out)) * _F32(_F32(1.0) / _F32(count)))
    zf = _F32(_F32(int(z_out)) - _F32(_F32(int(count) * int(z_in)) * sm))
    return {"sm": sm, "zf": zf}


def _mean_params(target, attrs, portable, q_in, q_out):
    count = int(attrs["count"])
    q = (q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)
    if target.runtime == "xnnpack":
        return host_recipe(lambda a, b, c, d: mean_float_params(a, b, c, d, count), *q)
    p = {"generic": {**host_recipe(lambda a, c: mean_multiplier(a, c, count), q[0], q[2]), "zin": q[1], "zout": q[3]}}
    if target.runtime == "optimized":
        p["lanes"] = host_recipe(lambda a, b, c, d: mean_lane_params(a, b, c, d, count), *q)
    return p


def _four_d_spatial(attrs, x) -> bool:
    return x.ndim == 4 and tuple(attrs["axes"]) == (0, 1) and bool(attrs.get("keep_dims", False))


@TFLite.implements("mean", params=_mean_params)
def _mean(target, attrs, p, x, return_acc: bool = False):
    axes, keep = tuple(attrs["axes"]), bool(attrs.get("keep_dims", False))
    if target.runtime == "xnnpack":
        y = mean_float(x, axes, keep, p)
    elif target.runtime == "optimized" and _four_d_spatial(attrs, x):
        y = mean_lanes(x, axes, keep, p["lanes"], 16 * (x.shape[-1] // 16))
    else:
        y = mean_mbqm(x, axes, keep, int(attrs["count"]), p["generic"])
    return no_acc(y, return_acc)


# ----------------------------------------------------------------------------------- mul


def xnnpack_activation_range(act, s_out, z_out) -> tuple[int, int]:
    """XNNPACK's clamp of a fused activation: ``lrintf(clamp(fl32(fl32(f / s_out) + z_out),
    -128, 127))`` for each finite bound ``f`` (ties to even)."""

    def q(f):
        v = _F32(_F32(_F32(f) / _F32(s_out)) + _F32(int(z_out)))
        return int(np.rint(min(max(v, _F32(-128)), _F32(127))))

    lo, hi = {None: (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}[act]
    return (-128 if lo is None else q(lo)), (127 if hi is None else q(hi))


def mul_params(act, runtime, s1, s2, s_out, z_out) -> dict[str, np.ndarray]:
    """``mul.cc`` Prepare: ``QuantizeMultiplier(real)`` and ``CalculateActivationRangeQuantized``,
    with ``real = fl32(fl32(s1 s2) / s_out)`` on LiteRT (its scales are floats: the product
    and quotient are float32) and ``double(s1) double(s2) / double(s_out)`` on TFLM;
    XNNPACK: ``scale = fl32(fl32(s1 s2) / s_out)`` and :func:`xnnpack_activation_range`."""
    f32_real = _F32(_F32(_F32(s1) * _F32(s2)) / _F32(s_out))
    if runtime == "xnnpack":
        lo, hi = xnnpack_activation_range(act, s_out, z_out)
        return {"scale": f32_real, **_i32(act_min=lo, act_max=hi)}
    if runtime == "tflm":
        m, e = quantize_multiplier(float(_F32(s1)) * float(_F32(s2)) / float(_F32(s_out)))
    else:
        m, e = quantize_multiplier(float(f32_real))
    lo, hi = activation_range(act, _F32(s_out), int(z_out))
    return _i32(multiplier=m, shift=e, act_min=lo, act_max=hi)


def _mul_params(target, attrs, portable, q_in, q_out):
    act, rt = attrs.get("activation"), target.runtime
    r = host_recipe(
        lambda a, b, c, d: mul_params(act, rt, a, b, c, d), q_in[0].scale, q_in[1].scale, q_out.scale, q_out.zero_point
    )
    return {**r, "z1": q_in[0].zero_point, "z2": q_in[1].zero_point, "zout": q_out.zero_point}


def check_tflite_lowering(graph, runtime: str) -> None:
    """Raises UnsupportedOpError naming the node where :class:`TFLite` ``(runtime)`` would
    not compute what LiteRT computes for ``graph``: on ``"optimized"``, a broadcasting MUL
    (``mul`` of two shapes, ``mul_const`` whose constant is not of the example's shape)
    whose products can reach the int16 intermediates of LiteRT's optimized kernel
    (:func:`hwjax.litert.mul_int16_safe` false), which hwjax does not model. The other
    runtimes compute MUL in int32 or float: nothing to check. ``Model.run`` calls it."""
    from hwjax.graph import Graph

    if not isinstance(graph, Graph):
        raise ArgTypeError(f"graph must be a hwjax.graph.Graph, got {type(graph).__name__}")
    if runtime not in ("reference", "optimized", "xnnpack", "tflm"):
        raise RangeError(f"runtime must be one of ('reference', 'optimized', 'xnnpack', 'tflm'), got {runtime!r}")
    if runtime != "optimized":
        return

    def scalar(v):
        return float(np.asarray(v, np.float64).reshape(-1)[0])

    for node in graph.nodes:
        if node.op not in ("mul", "mul_const"):
            continue
        t_in = [graph.tensors[i] for i in node.inputs]
        out = graph.tensors[node.outputs[0]]
        if node.op == "mul":
            shapes = (tuple(t_in[0].shape), tuple(t_in[1].shape))
            s1, s2 = scalar(t_in[0].quant.scale), scalar(t_in[1].quant.scale)
        else:
            shapes = (tuple(t_in[0].shape), tuple(np.shape(node.params["value"])))
            s1, s2 = scalar(t_in[0].quant.scale), scalar(node.params["scale"])
        if shapes[0] != shapes[1] and not mul_int16_safe(
            s1, s2, scalar(out.quant.scale), int(scalar(out.quant.zero_point))
        ):
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op}): a broadcasting MUL ({shapes[0]} by {shapes[1]}) whose products "
                "can overflow the int16 intermediates of LiteRT's optimized kernel is not supported on "
                "runtime 'optimized' (the other runtimes run it)"
            )


def _mul_run(target, p, x1, x2):
    """Broadcasting MULs on ``optimized`` follow the int32 formula, which equals LiteRT's
    int16 lanes when :func:`hwjax.litert.mul_int16_safe` holds (:func:`check_tflite_lowering`
    refuses the others on that runtime)."""
    if target.runtime == "xnnpack":
        return mul_float(x1, x2, p)
    if target.runtime == "optimized" and x1.shape == x2.shape:
        return mul_lanes(x1, x2, p)
    return mul_mbqm(x1, x2, p)


@TFLite.implements("mul", params=_mul_params)
def _mul(target, attrs, p, x1, x2, return_acc: bool = False):
    return no_acc(_mul_run(target, p, x1, x2), return_acc)


def _mul_const_params(target, attrs, portable, q_in, q_out):
    act, rt = attrs.get("activation"), target.runtime
    r = host_recipe(
        lambda a, b, c, d: mul_params(act, rt, a, b, c, d),
        q_in[0].scale,
        portable["scale"],
        q_out.scale,
        q_out.zero_point,
    )
    return {
        **r,
        "value": portable["value"],
        "z1": q_in[0].zero_point,
        "z2": portable["zero_point"],
        "zout": q_out.zero_point,
    }


@TFLite.implements("mul_const", params=_mul_const_params)
def _mul_const(target, attrs, p, x, return_acc: bool = False):
    """As ``mul``, the constant broadcast to the example's rank (a full-shape constant
    takes the optimized kernel's element-wise lanes)."""
    v = p["value"].astype(jnp.int32)
    v = v.reshape((1,) * (x.ndim - v.ndim) + v.shape)
    if v.shape[1:] == x.shape[1:]:
        v = jnp.broadcast_to(v, x.shape)
    return no_acc(_mul_run(target, p, x, v), return_acc)


def square_table(s_in, z_in, s_out, z_out) -> np.ndarray:
    """XNNPACK's qs8 square lookup table (its reference unary op in float32, ties to
    even): entry ``v + 128`` is ``clamp(rint(fl32(fl32(d * d) * fl32(1 / s_out)) + z_out),
    -128, 127)`` with ``d = fl32(fl32(v - z_in) * s_in)``."""
    v = np.arange(-128, 128).astype(_F32)
    d = ((v - _F32(int(z_in))).astype(_F32) * _F32(s_in)).astype(_F32)
    inv = _F32(_F32(1.0) / _F32(s_out))
    y = ((d * d).astype(_F32) * inv).astype(_F32) + _F32(int(z_out))
    return np.clip(np.rint(y.astype(_F32)), -128, 127).astype(np.int32)


def _square_params(target, attrs, portable, q_in, q_out):
    act, rt = attrs.get("activation"), target.runtime
    q = (q_in[0].scale, q_in[0].scale, q_out.scale, q_out.zero_point)
    r = host_recipe(lambda a, b, c, d: mul_params(act, rt, a, b, c, d), *q)
    if rt == "xnnpack":
        r["table"] = host_recipe(square_table, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)
    return {**r, "z1": q_in[0].zero_point, "z2": q_in[0].zero_point, "zout": q_out.zero_point}


@TFLite.implements("square", params=_square_params)
def _square(target, attrs, p, x, return_acc: bool = False):
    """LiteRT reference and optimized run ``x * x`` as any MUL of equal shapes; XNNPACK
    rewrites ``mul(x, x)`` into its ``square`` unary op (a lookup table)."""
    if target.runtime == "xnnpack":
        y = square_lut(x, p)
    elif target.runtime == "optimized":
        y = mul_lanes(x, x, p)
    else:
        y = mul_mbqm(x, x, p)
    return no_acc(y, return_acc)


# ------------------------------------------------------------------------------- reshape


@TFLite.implements("reshape")
def _reshape(target, attrs, p, x, return_acc: bool = False):
    """Row-major reshape of each example (exact on every runtime)."""
    return no_acc(x.reshape(x.shape[0], *attrs["shape"]), return_acc)


# ---------------------------------------------------------------------------- dequantize


def dequantize_params(s, z) -> dict[str, np.ndarray]:
    """``scale = fl32(s)``; ``zs = fl32(-z double(s))`` (LiteRT's optimized lanes)."""
    return {"scale": _F32(s), "zs": _F32(-int(z) * float(_F32(s)))}


def _dequantize_params(target, attrs, portable, q_in, q_out):
    r = host_recipe(dequantize_params, q_in[0].scale, q_in[0].zero_point)
    return {**r, "z": q_in[0].zero_point}


@TFLite.implements("dequantize", params=_dequantize_params)
def _dequantize(target, attrs, p, x, return_acc: bool = False):
    y = dequantize_lanes(x, p) if target.runtime == "optimized" else dequantize_exact(x, p)
    return no_acc(y, return_acc)
