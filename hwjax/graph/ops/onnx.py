"""Op kinds of ONNX int8 models (produced by :func:`hwjax.onnx.load`), in ONNX's layouts.

Tensors keep ONNX's layout (NCHW images, row-major matrices) with the batch axis
removed: a per-example shape is the ONNX shape without its first axis. Quantised
tensors carry their ONNX scale and zero point as :class:`hwjax.graph.Quant`; the int8 or
uint8 type of a node's input and output is a static attribute (``in_dtype`` /
``out_dtype``) where the arithmetic depends on it.

=========================  ======  ============================================================
op                         inputs  attributes (portable parameters)
=========================  ======  ============================================================
``qlinear_conv``           1       ``features``, ``kernel_size``, ``strides``, ``pads``
                                   ((top, bottom), (left, right)), ``dilations``, ``group``,
                                   ``out_dtype``, ``x64_u8_weights`` (``weight`` (O, C/group, kh, kw) integer
                                   values, ``w_scale``, ``w_zero_point``, ``bias`` int32 (O,))
``conv_integer``           1       as ``qlinear_conv`` without ``out_dtype``; int32 output
                                   (``weight``, ``w_zero_point``)
``qlinear_matmul``         1       ``features``, ``alpha``, ``out_dtype``, ``x64_u8_weights`` (``weight`` (K, N),
                                   ``w_scale``, ``w_zero_point``, optional ``bias`` int32 (N,))
``matmul_integer``         1       ``features``, ``x64_u8_weights`` (``weight`` (K, N), ``w_zero_point``); int32
``qlinear_binary``         1 or 2  ``fn`` (``"add"``, ``"mul"``), ``const_index``,
                                   ``out_dtype`` (with one input: ``const`` integer values,
                                   ``const_scale``, ``const_zero_point``)
``qlinear_avgpool``        1       ``kernel_size``, ``strides``, ``pads``,
                                   ``count_include_pad``, ``out_dtype``
``qlinear_global_avgpool`` 1       ``out_dtype``
``qlinear_lut``            1       ``fn`` (``"sigmoid"``, ``"leaky_relu"``), ``alpha``,
                                   ``in_dtype``, ``out_dtype``
``qlinear_concat``         1+      ``axis`` (per-example), ``in_dtypes``, ``out_dtype``
``onnx_maxpool``           1       ``kernel_size``, ``strides``, ``pads``, ``dilations``
``onnx_transpose``         1       ``perm`` (of the per-example axes)
``onnx_float_binary``      1 or 2  ``fn`` (``"add"``, ``"mul"``), ``const_index`` (``const``
                                   float32 with one input)
``onnx_float_unary``       1       ``fn`` (``"relu"``, ``"clip"``, ``"leaky_relu"``,
                                   ``"sigmoid"``), ``alpha``, ``lo``, ``hi``
``onnx_concat``            1+      ``axis`` (per-example)
=========================  ======  ============================================================

Each kind's exact semantics is its ``OpSpec``'s docstring; how a runtime rounds is the
target's (:class:`hwjax.targets.OnnxRuntime`).
"""

from __future__ import annotations

import numpy as np

from hwjax.core import ConvGeometry
from hwjax.errors import RangeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op

INT8_TYPES = ("int8", "uint8")


def batched_const(c, ndim: int):
    """A constant operand's ONNX shape as a broadcastable batched shape (leading 1s) against an
    ``ndim``-axis batched input, as the binary op kinds read their ``const``."""
    import jax.numpy as jnp

    c = jnp.asarray(c)
    return c.reshape((1,) * max(0, ndim - c.ndim) + c.shape)


def window_geometry(attrs, in_shape) -> ConvGeometry:
    """The :class:`hwjax.core.ConvGeometry` of an NCHW window op for a per-example (C, H, W)
    input shape (a batched (B, C, H, W) shape's leading axis is dropped)."""
    if len(in_shape) == 4:
        in_shape = in_shape[1:]
    if len(in_shape) != 3:
        raise ShapeError(f"input must be (C, H, W), got shape {tuple(in_shape)}")
    return ConvGeometry.make(
        tuple(in_shape[1:]),
        tuple(attrs["kernel_size"]),
        tuple(attrs.get("strides", (1, 1))),
        attrs.get("pads", ((0, 0), (0, 0))),
        tuple(attrs.get("dilations", (1, 1))),
    )


class _Window(OpSpec):
    def infer(self, node, ins):
        oh, ow = window_geometry(node.attrs, ins[0].shape).out_hw
        c = int(node.attrs["features"]) if "features" in self.attrs else ins[0].shape[0]
        return [(c, oh, ow)]


class QLinearConv(_Window):
    """QLinearConv: per output channel ``o`` and pixel, ``acc = sum (x - x_zp)(w - w_zp[o]) +
    bias[o]`` over the window's taps (exact int32; padding holds ``x_zp``), then requantised
    to the output's quantisation (``out_dtype``). ``group`` splits input and output channels
    into equal groups; group ``g``'s outputs read group ``g``'s inputs.

    ``x64_u8_weights`` (here, on ``qlinear_matmul`` and ``matmul_integer``): whether ONNX
    Runtime's ``Avx2WeightS8ToU8Transformer`` rewrites the node's int8 weights as uint8
    (+128) when the session option ``session.x64quantprecision`` is set on an AVX2 CPU
    without VNNI, so that its products stop saturating. True for QLinearConv, MatMulInteger,
    QGemm and QLinearMatMul of opsets 10 to 20; False for QLinearMatMul of opset 21 and ONNX
    Runtime's NHWC QLinearConv (the transformer matches neither)."""

    name = "qlinear_conv"
    attrs = {
        "features": OpSpec.REQUIRED,
        "kernel_size": OpSpec.REQUIRED,
        "strides": (1, 1),
        "pads": ((0, 0), (0, 0)),
        "dilations": (1, 1),
        "group": 1,
        "out_dtype": "uint8",
        "x64_u8_weights": True,
    }
    params = ("weight", "w_scale", "w_zero_point", "bias")
    choices = {"out_dtype": INT8_TYPES}

    def infer(self, node, ins):
        g = int(self.attr(node, "group"))
        c, f = ins[0].shape[0], int(node.attrs["features"])
        if g < 1 or c % g or f % g:
            raise ShapeError(f"group {g} must divide the input channels {c} and the output channels {f}")
        return super().infer(node, ins)


class ConvInteger(QLinearConv):
    """ConvInteger: the exact int32 ``sum (x - x_zp)(w - w_zp[o])`` of :class:`QLinearConv`
    with the node's own input zero point ``x_zero_point``, not requantised (an int32 output
    without quantisation)."""

    name = "conv_integer"
    params = ("weight", "w_zero_point", "x_zero_point")


class QLinearMatMul(OpSpec):
    """QLinearMatMul / QGemm with a constant right operand: ``acc[..., n] = sum_k (a[..., k] -
    a_zp)(w[k, n] - w_zp[n]) + bias[n]`` (exact int32), requantised to the output's
    quantisation with the per-column multiplier ``alpha * s_a * w_scale[n] / s_y``.
    ``x64_u8_weights``: as :class:`QLinearConv`'s."""

    name = "qlinear_matmul"
    attrs = {"features": OpSpec.REQUIRED, "alpha": 1.0, "out_dtype": "uint8", "x64_u8_weights": True}
    params = ("weight", "w_scale", "w_zero_point", "bias")
    choices = {"out_dtype": INT8_TYPES}

    def infer(self, node, ins):
        if not ins[0].shape:
            raise ShapeError("the left operand needs at least one axis (K)")
        return [(*ins[0].shape[:-1], int(node.attrs["features"]))]


class MatMulInteger(QLinearMatMul):
    """MatMulInteger: the exact int32 ``sum_k (a - a_zp)(w - w_zp)`` with the node's own input
    zero point ``x_zero_point`` (an int32 output)."""

    name = "matmul_integer"
    attrs = {"features": OpSpec.REQUIRED, "x64_u8_weights": True}
    params = ("weight", "w_zero_point", "x_zero_point")
    choices = {}


def broadcast_shapes(a, b) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes (ShapeError when they do not broadcast)."""
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise ShapeError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast") from None


class _Binary(OpSpec):
    attrs = {"fn": OpSpec.REQUIRED, "const_index": None}
    choices = {"fn": ("add", "mul"), "const_index": (None, 0, 1)}

    def check(self, node, ins):
        one = node.attrs.get("const_index") is not None
        if len(node.inputs) != (1 if one else 2):
            raise RangeError(f"takes {'1 input and a constant' if one else '2 inputs'}, got {len(node.inputs)}")
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise RangeError(f"unknown attributes {sorted(unknown)}; {self.name} takes {sorted(self.attrs)}")
        for k, allowed in self.choices.items():
            if self.attr(node, k) not in allowed:
                raise RangeError(f"{k} must be one of {allowed}, got {self.attr(node, k)!r}")

    def infer(self, node, ins):
        if len(ins) == 2:
            return [broadcast_shapes(ins[0].shape, ins[1].shape)]
        const = (node.params or {}).get("const")
        if const is None:
            raise ShapeError("the portable parameter 'const' is required with one input")
        # the constant's ONNX shape broadcasts against the batched input: drop a leading 1
        cshape = tuple(np.shape(const))
        return [broadcast_shapes(ins[0].shape, cshape)]


class QLinearBinary(_Binary):
    """QLinearAdd / QLinearMul: ``y = Q_out(real(a) op real(b))`` as the runtime rounds it,
    element-wise with NumPy broadcasting. With one input, the other operand is the constant
    ``const`` (integer values, quantised with ``const_scale`` / ``const_zero_point``),
    operand number ``const_index``; its shape broadcasts against one example. ``swap``: the
    runtime's kernel takes the second operand as its first (ONNX Runtime does so when the
    first is a single value), which changes the rounding of QLinearAdd."""

    name = "qlinear_binary"
    attrs = {**_Binary.attrs, "swap": False, "out_dtype": "uint8"}
    params = ("const", "const_scale", "const_zero_point")
    choices = {**_Binary.choices, "out_dtype": INT8_TYPES}


class FloatBinary(_Binary):
    """Float32 ``a + b`` / ``a * b`` (one rounding), element-wise with broadcasting; with one
    input the other operand is the float32 constant ``const`` at ``const_index``."""

    name = "onnx_float_binary"
    params = ("const",)


class QLinearAvgPool(_Window):
    """QLinearAveragePool: the mean of each window (``count_include_pad``: divided by the
    window size, else by its in-image taps) of the dequantised input, quantised to the
    output's quantisation, as the runtime rounds it."""

    name = "qlinear_avgpool"
    attrs = {
        "kernel_size": OpSpec.REQUIRED,
        "strides": (1, 1),
        "pads": ((0, 0), (0, 0)),
        "count_include_pad": False,
        "out_dtype": "uint8",
    }
    choices = {"out_dtype": INT8_TYPES}


class QLinearGlobalAvgPool(OpSpec):
    """QLinearGlobalAveragePool (and an average pool whose one window is the unpadded
    image): the mean of each channel's ``count`` = H x W values, requantised: (C, H, W) ->
    (C, 1, 1)."""

    name = "qlinear_global_avgpool"
    attrs = {"count": OpSpec.REQUIRED, "out_dtype": "uint8"}
    choices = {"out_dtype": INT8_TYPES}

    def infer(self, node, ins):
        if len(ins[0].shape) != 3 or ins[0].shape[1] * ins[0].shape[2] != int(node.attrs["count"]):
            raise ShapeError(f"input must be (C, H, W) with H * W = count, got shape {tuple(ins[0].shape)}")
        return [(ins[0].shape[0], 1, 1)]


class QLinearLut(OpSpec):
    """QLinearSigmoid / QLinearLeakyRelu: ``y = Q_out(fn(real(x)))`` per element through a
    256-entry table built by the runtime (``fn`` ``"sigmoid"`` or ``"leaky_relu"`` with
    ``alpha``)."""

    name = "qlinear_lut"
    attrs = {"fn": OpSpec.REQUIRED, "alpha": 0.01, "in_dtype": "uint8", "out_dtype": "uint8"}
    choices = {"fn": ("sigmoid", "leaky_relu"), "in_dtype": INT8_TYPES, "out_dtype": INT8_TYPES}


def _concat_shape(ins, axis: int) -> tuple[int, ...]:
    shapes = [tuple(t.shape) for t in ins]
    r = len(shapes[0])
    if not -r <= axis < r or any(len(s) != r for s in shapes):
        raise ShapeError(f"cannot concatenate {shapes} on axis {axis}")
    a = axis % r
    if any(s[:a] + s[a + 1 :] != shapes[0][:a] + shapes[0][a + 1 :] for s in shapes):
        raise ShapeError(f"cannot concatenate {shapes} on axis {axis}")
    return (*shapes[0][:a], sum(s[a] for s in shapes), *shapes[0][a + 1 :])


class _Concat(OpSpec):
    def check(self, node, ins):
        if not node.inputs:
            raise RangeError("takes at least one input")
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise RangeError(f"unknown attributes {sorted(unknown)}; {self.name} takes {sorted(self.attrs)}")

    def infer(self, node, ins):
        return [_concat_shape(ins, int(node.attrs["axis"]))]


class QLinearConcat(_Concat):
    """QLinearConcat on a per-example ``axis``: every input requantised to the output's
    quantisation (copied where its scale and zero point equal the output's) and
    concatenated. ``in_dtypes``: each input's type."""

    name = "qlinear_concat"
    attrs = {"axis": OpSpec.REQUIRED, "in_dtypes": OpSpec.REQUIRED, "out_dtype": "uint8"}


class Concat(_Concat):
    """Concatenation on a per-example ``axis``, values unchanged (float32 or integers)."""

    name = "onnx_concat"
    attrs = {"axis": OpSpec.REQUIRED}


class MaxPool(_Window):
    """MaxPool, NCHW: the maximum of each window's in-image taps (exact; integer or float32)."""

    name = "onnx_maxpool"
    attrs = {"kernel_size": OpSpec.REQUIRED, "strides": (1, 1), "pads": ((0, 0), (0, 0)), "dilations": (1, 1)}


class Transpose(OpSpec):
    """Transpose of the per-example axes: output axis ``i`` is input axis ``perm[i]`` (exact)."""

    name = "onnx_transpose"
    attrs = {"perm": OpSpec.REQUIRED}
    layout_only = True

    def infer(self, node, ins):
        perm = tuple(int(p) for p in node.attrs["perm"])
        shape = tuple(ins[0].shape)
        if sorted(perm) != list(range(len(shape))):
            raise ShapeError(f"perm {perm} is not a permutation of the {len(shape)} axes of {shape}")
        return [tuple(shape[p] for p in perm)]


class FloatUnary(OpSpec):
    """Float32 element-wise ``relu`` (``max(x, 0)``), ``clip`` (``min(max(x, lo), hi)``),
    ``leaky_relu`` (``x`` if ``x >= 0`` else ``f32(alpha * x)``) or ``sigmoid`` (the runtime's
    logistic)."""

    name = "onnx_float_unary"
    attrs = {"fn": OpSpec.REQUIRED, "alpha": 0.01, "lo": float("-inf"), "hi": float("inf")}
    choices = {"fn": ("relu", "clip", "leaky_relu", "sigmoid")}


for _spec in (
    QLinearConv(),
    ConvInteger(),
    QLinearMatMul(),
    MatMulInteger(),
    QLinearBinary(),
    FloatBinary(),
    QLinearAvgPool(),
    QLinearGlobalAvgPool(),
    QLinearLut(),
    QLinearConcat(),
    Concat(),
    MaxPool(),
    Transpose(),
    FloatUnary(),
):
    register_op(_spec)
