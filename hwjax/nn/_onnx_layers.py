"""Layers for the op kinds of ONNX int8 models (:mod:`hwjax.graph.ops.onnx`), so that
:func:`hwjax.nn.from_graph` fine-tunes a model read by :func:`hwjax.onnx.load` in ONNX
Runtime's arithmetic (:class:`hwjax.targets.OnnxRuntime`).

Every layer is one node of the imported graph, with the node's attributes and the
quantisation of its input and output tensors fixed (ONNX's NCHW layout, uint8 or int8
tensors). In ``"hardware"`` mode it computes exactly what :func:`hwjax.graph.run` computes for
that node on the target, bit for bit; the gradient is that of a float surrogate of the same
op (its real-valued function on the dequantised inputs, requantised to the output's scale and
zero point and clipped to the output type's range, so saturated outputs pass no gradient).
``"float"`` and ``"calibrate"`` modes run the real-valued function on float inputs (the
quantisation is the imported one: nothing is recorded).

:class:`QLinearConv` and :class:`QLinearMatMul` (QLinearConv, QLinearMatMul and QGemm) hold
trainable float weights and biases; every other layer (:class:`OnnxNode` subclasses) is
frozen.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwjax.core import compute_once, div_rn
from hwjax.errors import ArgTypeError
from hwjax.graph import Node, Quant, Tensor, derive_params
from hwjax.graph.ops.onnx import batched_const, window_geometry
from hwjax.nn._base import HwLayer, Mode, make_stats
from hwjax.nn._qarray import QArray, as_float
from hwjax.nn._quant import exact_forward, sg

#: the integer range of each ONNX tensor type
RANGES = {"int8": (-128, 127), "uint8": (0, 255)}
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


class Const(nnx.Variable):
    """Arrays of an imported node that training leaves alone (portable or target parameters)."""


def _static_quant(q) -> tuple[float, int] | None:
    """A per-tensor :class:`hwjax.graph.Quant` as ``(scale, zero_point)`` Python numbers (static
    module data), or None."""
    if q is None:
        return None
    return float(np.float32(np.asarray(q.scale).reshape(-1)[0])), int(np.asarray(q.zero_point).reshape(-1)[0])


def _quant(st) -> Quant | None:
    return None if st is None else Quant.of(np.float32(st[0]), np.int32(st[1]))


class OnnxNode(HwLayer):
    """One frozen node of an imported ONNX graph (see the module docstring).

    Built by :meth:`from_node` (``hwjax.nn.from_graph``); subclasses give the op kind
    (``kind``) and its real-valued function (:meth:`real`). ``keeps_quant`` layers (max
    pooling, transposes, concatenation of equally quantised inputs) move integers without
    requantising: their surrogate is the same movement of the integer values.
    """

    keeps_quant: ClassVar[bool] = False

    def __init__(self, node: Node, inputs, output, *, target, mode: Mode = "float"):
        super().__init__(target, mode=mode)
        self.attrs = node.attrs
        self.in_quants = tuple(_static_quant(t.quant) for t in inputs)
        self.in_dtypes = tuple(t.dtype for t in inputs)
        self.out_quant = _static_quant(output.quant)
        self.out_type = output.dtype
        self.out_shape = tuple(output.shape)
        self.portable = None if node.params is None else Const(jax.tree.map(jnp.asarray, node.params))

    @classmethod
    def from_node(cls, node, inputs, output, target) -> "OnnxNode":
        layer = cls(node, inputs, output, target=target)
        lowered = layer.derive(node.params)
        layer.lowered = None if lowered is None else Const(lowered)
        return layer

    def derive(self, portable) -> Any:
        """The target's parameters of this node for ``portable`` parameters (its recipe on the
        fixed quantisation)."""
        request = (self.kind, self.attrs, portable, [_quant(q) for q in self.in_quants], _quant(self.out_quant))
        return derive_params(self.target, [request])[0]

    def portable_params(self, inputs):
        return None if self.portable is None else jax.tree.map(np.asarray, self.portable.get_value())

    def out_dtype(self) -> str:
        return self.out_type

    def to_node(self, name: str, inputs):
        node = Node(self.kind, tuple(t.name for t in inputs), (name,), self.attrs, self.portable_params(inputs), name)
        return node, Tensor(name, self.out_shape, self.out_type, _quant(self.out_quant))

    # ------------------------------------------------------------------ the arithmetic

    def real(self, *xs: jax.Array) -> jax.Array:
        """The op's real-valued function on (batched, NCHW) float inputs."""
        raise NotImplementedError

    def params(self) -> Any:
        """The target's parameters the hardware forward runs with."""
        return None if self.lowered is None else self.lowered.get_value()

    def _exact(self, xs, params) -> jax.Array:
        """The target's op on the inputs' values: integers as the graph holds them (in their
        storage type where the op reads it), floats as they are."""
        impl = self.target.lowering(self.kind)
        vals = []
        for x, dt in zip(xs, self.in_dtypes):
            if isinstance(x, QArray):
                v = sg(x.q).astype(jnp.int32)
                vals.append(v.astype(dt) if impl.narrow_inputs and dt in RANGES else v)
            else:
                vals.append(sg(jnp.asarray(x, jnp.float32)))
        return impl.run(self.target, self.attrs, params, *vals)

    def __call__(self, *xs, return_stats: bool = False):
        if self.mode != "hardware":
            if any(isinstance(x, QArray) for x in xs):
                raise ArgTypeError(f"{type(self).__name__} in {self.mode!r} mode takes float inputs, got a QArray")
            y = self.real(*[as_float(x) for x in xs])
            return (y, make_stats(None, relu=False, y_float=y)) if return_stats else y
        for i, (x, q) in enumerate(zip(xs, self.in_quants)):
            if (q is not None) != isinstance(x, QArray):
                want = "a QArray (a quantised tensor)" if q is not None else "a float array"
                raise ArgTypeError(f"{type(self).__name__}: input {i} must be {want}, got {type(x).__name__}")
        zps = [x.zero_point for x in xs if isinstance(x, QArray)]
        trigger = zps[0] if zps else jnp.int32(0)
        exact = compute_once(lambda p, *v: self._exact(v, p), (self.params(), *jax.tree.map(sg, xs)), trigger)
        exact = exact.astype(jnp.float32)
        if self.out_quant is None:  # a float output
            y = exact_forward(exact, self.real(*[as_float(x) for x in xs]))
            return (y, make_stats(None, relu=False, y_float=y)) if return_stats else y
        s, z = self.out_quant
        lo, hi = RANGES[self.out_type]
        if self.keeps_quant:
            sur = self.real(*[x.q for x in xs])
        else:
            sur = jnp.clip(self.real(*[as_float(x) for x in xs]) / jnp.float32(s) + jnp.float32(z), lo, hi)
        y = QArray(exact_forward(exact, sur), jnp.float32(s), jnp.int32(z))
        if not return_stats:
            return y
        return y, make_stats(None, relu=False, y_float=exact, bounds=(lo + 0.5, hi - 0.5))


# ------------------------------------------------------------------------- frozen op kinds


class Dequantize(OnnxNode):
    """DequantizeLinear: ``f32((q - zero_point) * scale)``; gradient the identity."""

    kind = "dequantize"

    def real(self, x):
        return x


def _binary(attrs, xs, const):
    """``a + b`` or ``a * b`` (``attrs["fn"]``) of the inputs, with the real constant ``const``
    (a function of nothing, called when the node has one) at ``attrs["const_index"]``."""
    ci = attrs.get("const_index")
    if ci is not None:
        c = batched_const(const(), xs[0].ndim)
        xs = (c, xs[0]) if ci == 0 else (xs[0], c)
    return xs[0] + xs[1] if attrs["fn"] == "add" else xs[0] * xs[1]


class QLinearBinary(OnnxNode):
    """QLinearAdd / QLinearMul (``attrs["fn"]``), one operand possibly a quantised constant."""

    kind = "qlinear_binary"

    def real(self, *xs):
        def const():
            p = self.portable.get_value()
            return (p["const"].astype(jnp.float32) - jnp.float32(p["const_zero_point"])) * p["const_scale"]

        return _binary(self.attrs, xs, const)


class FloatBinary(OnnxNode):
    """A float32 Add / Mul ONNX Runtime leaves unfused."""

    kind = "onnx_float_binary"

    def real(self, *xs):
        return _binary(self.attrs, xs, lambda: self.portable.get_value()["const"].astype(jnp.float32))


def _activation(fn: str, x, attrs):
    if fn == "sigmoid":
        return jax.nn.sigmoid(x)
    if fn == "leaky_relu":
        return jnp.where(x >= 0, x, x * jnp.float32(attrs.get("alpha", 0.01)))
    if fn == "relu":
        return jax.nn.relu(x)
    return jnp.clip(x, jnp.float32(attrs.get("lo")), jnp.float32(attrs.get("hi")))


class QLinearLut(OnnxNode):
    """QLinearSigmoid / QLinearLeakyRelu (a 256-entry table on the target)."""

    kind = "qlinear_lut"

    def real(self, x):
        return _activation(self.attrs["fn"], x, self.attrs)


class FloatUnary(OnnxNode):
    """A float32 Relu / Clip / LeakyRelu / Sigmoid ONNX Runtime leaves unfused."""

    kind = "onnx_float_unary"

    def real(self, x):
        return _activation(self.attrs["fn"], x, self.attrs)


def _window(attrs, x):
    geom = window_geometry(attrs, x.shape)
    return geom, ((0, 0), (0, 0), *geom.padding)


class QLinearAvgPool(OnnxNode):
    """QLinearAveragePool (``count_include_pad`` or not)."""

    kind = "qlinear_avgpool"

    def real(self, x):
        geom, pads = _window(self.attrs, x)
        win, strides = (1, 1, *geom.kernel), (1, 1, *geom.stride)
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, win, strides, pads)
        if self.attrs.get("count_include_pad", False):
            return total / float(np.prod(geom.kernel))
        # taps inside the image per window: one (H, W) plane (a small constant, not one per value)
        ones = jnp.ones((1, 1, *x.shape[2:]), x.dtype)
        return total / jax.lax.reduce_window(ones, 0.0, jax.lax.add, win, strides, pads)


class QLinearGlobalAvgPool(OnnxNode):
    """QLinearGlobalAveragePool: the mean of each channel."""

    kind = "qlinear_global_avgpool"

    def real(self, x):
        return jnp.mean(x, axis=(2, 3), keepdims=True)


class QLinearConcat(OnnxNode):
    """QLinearConcat: the inputs requantised to the output's quantisation, joined."""

    kind = "qlinear_concat"

    def real(self, *xs):
        return jnp.concatenate(xs, axis=int(self.attrs["axis"]) % (xs[0].ndim - 1) + 1)


class Concat(OnnxNode):
    """A Concat of equally quantised (or float) tensors."""

    kind = "onnx_concat"
    keeps_quant = True

    def real(self, *xs):
        return jnp.concatenate(xs, axis=int(self.attrs["axis"]) % (xs[0].ndim - 1) + 1)


class MaxPool(OnnxNode):
    """MaxPool (with dilations) of integer or float tensors."""

    kind = "onnx_maxpool"
    keeps_quant = True

    def real(self, x):
        geom, pads = _window(self.attrs, x)
        dil = (1, 1, *self.attrs.get("dilations", (1, 1)))
        return jax.lax.reduce_window(
            x, -jnp.inf, jax.lax.max, (1, 1, *geom.kernel), (1, 1, *geom.stride), pads, window_dilation=dil
        )


class Transpose(OnnxNode):
    """Transpose of the per-example axes."""

    kind = "onnx_transpose"
    keeps_quant = True

    def real(self, x):
        return x.transpose(0, *(int(i) + 1 for i in self.attrs["perm"]))


# ------------------------------------------------------------------- trainable linear ops


class _QLinear(OnnxNode):
    """QLinearConv / QLinearMatMul with trainable float weights.

    ``kernel`` (the node's weight layout) holds the real weights ``(w - w_zp) * w_scale`` and
    ``bias`` the real biases; the weight scales and zero points stay the imported ones.
    Hardware mode: ``w = clip(round(kernel / w_scale) + w_zp, lo, hi)`` in the weight type
    (correctly rounded division, ties to even) and the int32 bias ``b0 + round((bias -
    bias0) / (s_in * w_scale))`` (``b0``, ``bias0``: the imported integers and their real
    values, so an untrained layer keeps them exactly, whatever their size; saturating); then
    the target's kernel on those (what :func:`hwjax.onnx.save` writes). Surrogate:
    ``clip((acc(x - x_zp, w_q - w_zp) + b_q) * m + y_zp, lo, hi)`` with ``m = s_in * w_scale /
    s_y`` (times ``alpha``), straight-through ``w_q`` and ``b_q``: ``d/dkernel = d/dw_q /
    w_scale``, ``d/dbias = d/db_q / (s_in * w_scale)``.
    """

    channel_axis: ClassVar[int] = 0

    @classmethod
    def from_node(cls, node, inputs, output, target) -> "_QLinear":
        layer = cls(node, inputs, output, target=target)
        layer.portable = None  # the weights live in kernel / bias
        p = node.params
        w = np.asarray(p["weight"])
        shape = [1] * w.ndim
        shape[cls.channel_axis] = -1
        # the fixed weight quantisation as static data (concrete inside jit: the target's
        # recipe runs on the host, not in the program)
        layer.w_type = str(w.dtype)
        layer.w_bshape = tuple(shape)
        layer.w_scales = tuple(float(v) for v in np.asarray(p["w_scale"], np.float32).reshape(-1))
        zw = np.asarray(p["w_zero_point"])
        layer.w_zp_type = str(zw.dtype)
        layer.w_zp_shape = tuple(zw.shape)
        layer.w_zps = tuple(int(v) for v in zw.reshape(-1))
        kernel = (w.astype(np.int32) - layer._w_zp()).astype(np.float32) * layer._w_scale()
        # (w - zp) * s in float32: round(((w - zp) * s) / s) == w - zp for |w - zp| <= 255
        layer.kernel = nnx.Param(jnp.asarray(kernel))
        if p.get("bias") is not None:
            b = np.asarray(p["bias"], np.int32)
            real = b.astype(np.float32) * layer._bias_scale()
            layer.bias = nnx.Param(jnp.asarray(real))
            layer.bias_ref = Const({"int": jnp.asarray(b), "real": jnp.asarray(real)})
        else:
            layer.bias = None
        return layer

    def _w_scale(self) -> np.ndarray:
        return np.asarray(self.w_scales, np.float32).reshape(self.w_bshape)

    def _w_zp(self) -> np.ndarray:
        zw = np.asarray(self.w_zps, np.int32)
        return zw.reshape(self.w_bshape) if zw.size > 1 else zw.reshape(())

    def _bias_scale(self) -> np.ndarray:
        """``s_in * w_scale`` per output channel (float32)."""
        return np.float32(self.in_quants[0][0]) * np.asarray(self.w_scales, np.float32)

    def _integers(self):
        """``(w_int, b_int)``: the integer weights (int32 values) and biases (int32 or None) of
        the current float weights (no gradient)."""
        lo, hi = RANGES[self.w_type]
        w = jnp.round(div_rn(sg(self.kernel[...]), self._w_scale())).astype(jnp.int32) + self._w_zp()
        w = jnp.clip(w, lo, hi)
        if self.bias is None:
            return w, None
        ref = self.bias_ref.get_value()
        d = jnp.round(div_rn(sg(self.bias[...]) - ref["real"], self._bias_scale()))
        d = jnp.clip(d, -(2.0**24), 2.0**24).astype(jnp.int32)
        base = ref["int"]
        b = jnp.where(
            d > 0,
            jnp.where(base > _I32_MAX - d, _I32_MAX, base + d),
            jnp.where(base < _I32_MIN - d, _I32_MIN, base + d),
        )
        return w, b

    def _portable(self, w_int, b_int) -> dict:
        out = {
            "weight": w_int.astype(self.w_type),
            "w_scale": np.asarray(self.w_scales, np.float32),
            "w_zero_point": np.asarray(self.w_zps, self.w_zp_type).reshape(self.w_zp_shape),
        }
        if b_int is not None:
            out["bias"] = b_int
        return out

    def portable_params(self, inputs):
        return jax.tree.map(np.asarray, self._portable(*self._integers()))

    def params(self):
        return self.derive(self._portable(*self._integers()))

    def _float_bias(self) -> jax.Array:
        return self.bias[...] if self.bias is not None else 0.0

    def linear(self, x, w) -> jax.Array:
        """The op's product of (batched) ``x`` and weights ``w`` in the kernel's layout."""
        raise NotImplementedError

    def _channels(self, v):
        """A per-output-channel vector broadcast against the output."""
        raise NotImplementedError

    def real(self, x):
        return self.linear(x, self.kernel[...]) * jnp.float32(self.attrs.get("alpha", 1.0)) + self._channels(
            self._float_bias()
        )

    def __call__(self, x, *, return_stats: bool = False):
        if self.mode != "hardware":
            return super().__call__(x, return_stats=return_stats)
        if not isinstance(x, QArray):
            raise ArgTypeError(f"{type(self).__name__}: input 0 must be a QArray (a quantised tensor)")
        w_int, b_int = self._integers()
        params = self.derive(self._portable(w_int, b_int))
        exact = compute_once(lambda p, v: self._exact((v,), p), (params, jax.tree.map(sg, x)), x.zero_point)
        zw = jnp.asarray(self._w_zp(), jnp.float32)
        sw = jnp.asarray(self._w_scale())
        w_q = exact_forward(w_int.astype(jnp.float32) - zw, self.kernel[...] / sw)
        acc = self.linear(x.q - x.zero_point.astype(jnp.float32), w_q)
        if b_int is not None:
            ref = self.bias_ref.get_value()
            bs = jnp.asarray(self._bias_scale())
            b_sur = (self.bias[...] - ref["real"]) / bs + sg(ref["int"]).astype(jnp.float32)
            b_q = exact_forward(b_int.astype(jnp.float32), b_sur)
            acc = acc + self._channels(b_q)
        s_y, z_y = self.out_quant
        m = np.float32(self.attrs.get("alpha", 1.0)) * self._bias_scale() / np.float32(s_y)
        lo, hi = RANGES[self.out_type]
        sur = jnp.clip(acc * self._channels(jnp.asarray(m)) + jnp.float32(z_y), lo, hi)
        y = QArray(exact_forward(exact.astype(jnp.float32), sur), jnp.float32(s_y), jnp.int32(z_y))
        if not return_stats:
            return y
        return y, make_stats(None, relu=False, y_float=exact.astype(jnp.float32), bounds=(lo + 0.5, hi - 0.5))


class QLinearConv(_QLinear):
    """QLinearConv (NCHW, weights ``(O, C / group, kh, kw)``, strides, pads, dilations, groups)
    with trainable weights; see :class:`_QLinear`."""

    kind = "qlinear_conv"
    channel_axis = 0

    def linear(self, x, w):
        geom = window_geometry(self.attrs, x.shape)
        return jax.lax.conv_general_dilated(
            x,
            w,
            geom.stride,
            geom.padding,
            rhs_dilation=tuple(self.attrs.get("dilations", (1, 1))),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
            feature_group_count=int(self.attrs.get("group", 1)),
        )

    def _channels(self, v):
        return jnp.reshape(v, (-1, 1, 1)) if jnp.ndim(v) else v


class QLinearMatMul(_QLinear):
    """QLinearMatMul / QGemm with a constant right operand ``(K, N)`` and trainable weights; see
    :class:`_QLinear`."""

    kind = "qlinear_matmul"
    channel_axis = 1

    def linear(self, x, w):
        return jnp.matmul(x, w)

    def _channels(self, v):
        return v
