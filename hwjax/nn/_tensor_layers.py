"""Layers for the tensor op kinds of imported models: :class:`Pad`, :class:`Concat` and
:class:`Mean` (graph ops ``pad``, ``concat``, ``mean``; TFLite's PAD / PADV2,
CONCATENATION and MEAN), so that :func:`hwjax.nn.from_graph` can fine-tune models that
contain them. Axes are per example (the batch axis is not counted)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.graph import Attrs, Quant
from hwjax.nn._base import HwLayer, Mode, make_stats
from hwjax.nn._layers import _clamp_fn, _ret, _Unary, binary_forward
from hwjax.nn._qarray import QArray
from hwjax.nn._quant import compute_once, exact_forward

sg = jax.lax.stop_gradient


def _axes(v, what: str, layer: str) -> tuple[int, ...]:
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError
        out = tuple(int(a) for a in v)
    except (TypeError, ValueError):
        raise ArgTypeError(f"{layer}: {what} must be a sequence of ints, got {v!r}") from None
    if not out or list(out) != sorted(set(out)) or out[0] < 0:
        raise RangeError(f"{layer}: {what} must be distinct, sorted, non-negative per-example axes, got {v!r}")
    return out


class Pad(HwLayer):
    """Constant padding of each example (graph op ``pad``: TFLite's PAD and PADV2).

    ``paddings``: one ``(before, after)`` pair of non-negative ints per axis of an example.
    ``value``: the int8 pad value (PADV2's constant); None pads with the zero point, i.e.
    the real value 0. ``fill``: the real value the float modes pad with (0.0; a layer
    built by :func:`hwjax.nn.from_graph` for a PADV2 gets the constant's real value).
    Keeps the input's quantisation; exact in every mode (hardware mode runs the target's
    pad on the integers). Gradient: the padding is sliced off (identity on the input's
    elements, 0 for the pad value).
    """

    kind = "pad"

    def __init__(self, paddings, *, value=None, fill: float = 0.0, target, mode: Mode = "float"):
        try:
            if isinstance(paddings, (str, bytes)):
                raise TypeError
            self.paddings = tuple((int(a), int(b)) for a, b in paddings)
        except (TypeError, ValueError):
            raise ArgTypeError(f"Pad: paddings must be (before, after) pairs of ints, got {paddings!r}") from None
        if any(min(p) < 0 for p in self.paddings):
            raise RangeError(f"Pad: paddings must be non-negative, got {self.paddings}")
        if value is not None:
            V.check_static_int(value, -128, 127, "Pad value")
        self.value = None if value is None else int(value)
        self.fill = float(fill)
        super().__init__(target, mode=mode)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"paddings": self.paddings, "value": self.value})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        value = node.attrs.get("value")
        q = inputs[0].quant
        fill = (
            0.0
            if value is None or q is None
            else float(np.float32(np.asarray(q.scale).reshape(-1)[0]) * (int(value) - int(np.asarray(q.zero_point))))
        )
        return {"paddings": tuple(tuple(p) for p in node.attrs["paddings"]), "value": value, "fill": fill}

    def _pads(self, ndim: int):
        if ndim - 1 != len(self.paddings):
            raise ShapeError(f"Pad: paddings has {len(self.paddings)} pairs, the examples have {ndim - 1} axes")
        return ((0, 0), *self.paddings)

    def __call__(self, x, *, return_stats: bool = False):
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            x = V.as_array(x, "Pad input x")
            y = jnp.pad(x, self._pads(x.ndim), constant_values=self.fill)
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        pads = self._pads(x.q.ndim)
        attrs = self.node_attrs()
        q = Quant.of(sg(x.scale), x.zero_point)
        params = self.op_params(attrs, None, [q], q)
        y_int = compute_once(lambda v, p: self.op_run(attrs, p, v), (sg(x.q).astype(jnp.int32), params), x.zero_point)
        const = x.zero_point if self.value is None else self.value
        y = exact_forward(y_int, jnp.pad(x.q, pads, constant_values=jnp.asarray(const, x.q.dtype)))
        return _ret(x.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)


class Concat(HwLayer):
    """The inputs joined along the per-example ``axis`` (graph op ``concat``: TFLite's
    CONCATENATION of equally quantised tensors).

    Float modes: ``jnp.concatenate``. Hardware mode: the target's concatenation of the
    input integers; every input must carry the first input's scale and zero point, as the
    graph op requires (checked when they are concrete; a traced mismatch is the caller's
    contract). Exact; gradient: each input gets its slice.
    """

    kind = "concat"

    def __init__(self, axis: int, *, target, mode: Mode = "float"):
        self.axis = int(V.check_static_int(axis, 0, 7, "Concat axis"))
        super().__init__(target, mode=mode)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"axis": self.axis})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"axis": int(node.attrs["axis"])}

    def to_node(self, name: str, inputs):
        from hwjax.graph import Node, Tensor, get_op

        node = Node(self.kind, tuple(t.name for t in inputs), (name,), self.node_attrs(), None, name)
        return node, Tensor(name, tuple(get_op(self.kind).infer(node, inputs)[0]), inputs[0].dtype, inputs[0].quant)

    def __call__(self, *xs, return_stats: bool = False):
        if not xs:
            raise ShapeError("Concat takes at least one input")
        if not any(isinstance(x, QArray) for x in xs):
            if self.mode == "hardware":
                self._require_q(xs[0])
            xs = [V.as_array(x, "Concat input") for x in xs]
            y = jnp.concatenate(xs, axis=self.axis + 1)
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        if not all(isinstance(x, QArray) for x in xs):
            raise ArgTypeError("Concat in hardware mode takes QArray inputs only")
        first = xs[0]
        for i, x in enumerate(xs[1:], 1):
            differs = [
                V.is_concrete(a) and V.is_concrete(b) and not np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in ((x.scale, first.scale), (x.zero_point, first.zero_point))
            ]
            if any(differs):
                raise RangeError(f"Concat input {i} is quantised differently from input 0 (scale, zero point)")
        attrs = self.node_attrs()
        ints = tuple(sg(x.q).astype(jnp.int32) for x in xs)
        y_int = compute_once(lambda *v: self.op_run(attrs, None, *v), ints, first.zero_point)
        y = exact_forward(y_int, jnp.concatenate([x.q for x in xs], axis=self.axis + 1))
        return _ret(first.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)


class Mean(_Unary):
    """Mean over per-example ``axes``, requantised to its own output scale (graph op
    ``mean``: TFLite's MEAN). ``keep_dims`` keeps the reduced axes as size 1.

    Float modes: ``jnp.mean`` (calibrate mode records its range). Hardware mode: the
    target's exact integer mean with the input's and output's quantisation (TFLite: each
    runtime's rounding). Gradient (straight-through surrogate): that of
    ``clip(mean(s_in (q - z_in)) / s_out + z_out, -128, 127)``: ``s_in / (count s_out)`` per
    averaged element where the output is not saturated, 0 where it is.
    """

    kind = "mean"

    def __init__(self, axes, *, keep_dims: bool = False, target, mode: Mode = "float", learn_scale: bool = False):
        self.axes = _axes(axes, "axes", "Mean")
        self.keep_dims = V.check_flag(keep_dims, "keep_dims")
        super().__init__(target, mode=mode, learn_scale=learn_scale)

    def real_fn(self, v):
        return jnp.mean(v, axis=tuple(a + 1 for a in self.axes), keepdims=self.keep_dims)

    def node_attrs(self, in_shape=None) -> Attrs:
        if in_shape is None:
            raise ShapeError("Mean: the node attributes need the input shape (count)")
        if self.axes[-1] >= len(in_shape):
            raise ShapeError(f"Mean: axes {self.axes} outside examples of shape {tuple(in_shape)}")
        count = int(np.prod([in_shape[a] for a in self.axes]))
        return Attrs({"axes": self.axes, "keep_dims": self.keep_dims, "count": count})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"axes": tuple(node.attrs["axes"]), "keep_dims": bool(node.attrs.get("keep_dims", False))}


MUL_ACTIVATIONS = (None, "relu", "relu6", "relu_n1_to_1")


class Mul(HwLayer):
    """Element-wise product of two tensors (numpy broadcasting per example), an optional
    clamping ``activation``, requantised to its own output scale (graph op ``mul``:
    TFLite's MUL).

    ``activation``: None, ``"relu"``, ``"relu6"`` or ``"relu_n1_to_1"``. Float modes:
    ``act(x1 * x2)`` (calibrate mode records its range). Hardware mode: the target's exact
    integer product with both inputs' and the output's quantisation. Gradient (surrogate):
    that of ``clip(act(real(x1) real(x2)) / s_out + z_out, -128, 127)``.
    """

    kind = "mul"
    requantizes = True

    def __init__(self, *, activation=None, target, mode: Mode = "float", learn_scale: bool = False):
        if activation not in MUL_ACTIVATIONS:
            raise RangeError(f"Mul: activation must be one of {MUL_ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        super().__init__(target, mode=mode, learn_scale=learn_scale, activation=activation)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"activation": self.activation})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"activation": node.attrs.get("activation")}

    def to_node(self, name: str, inputs):
        from hwjax.graph import Node, Tensor, get_op

        node = Node(self.kind, tuple(t.name for t in inputs), (name,), self.node_attrs(), None, name)
        shape = get_op(self.kind).infer(node, inputs)[0]
        return node, Tensor(name, tuple(shape), "int8", Quant.of(*self.out_qparams()))

    def _act(self, v):
        return v if self.activation is None else _clamp_fn(self.activation)(v)

    def __call__(self, x1, x2, *, return_stats: bool = False):
        x1 = x1 if isinstance(x1, QArray) else V.as_array(x1, "Mul input x1")
        x2 = x2 if isinstance(x2, QArray) else V.as_array(x2, "Mul input x2")
        return binary_forward(self, x1, x2, lambda a, b: self._act(a * b), self.activation is not None, return_stats)


class Softmax(_Unary):
    """``softmax(beta * x)`` along the last axis, requantised to its own output scale (graph
    op ``softmax``: TFLite's SOFTMAX, whose int8 output is 1/256 at -128).

    Float modes: ``jax.nn.softmax(beta * x)`` (calibrate mode records its range).
    Hardware mode: the target's exact integer softmax (TFLite: per runtime). Gradient
    (straight-through surrogate): that of ``clip(softmax(beta real(x)) / s_out + z_out,
    -128, 127)``.
    """

    kind = "softmax"

    def __init__(self, *, beta: float = 1.0, target, mode: Mode = "float", learn_scale: bool = False):
        if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
            raise ArgTypeError(f"Softmax: beta must be a positive finite number, got {beta!r}")
        beta = float(beta)
        if not np.isfinite(beta) or beta <= 0:
            raise RangeError(f"Softmax: beta must be a positive finite number, got {beta}")
        self.beta = beta
        super().__init__(target, mode=mode, learn_scale=learn_scale)

    def real_fn(self, v):
        return jax.nn.softmax(self.beta * v, axis=-1)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"beta": self.beta, "axis": -1})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"beta": float(node.attrs.get("beta", 1.0))}


__all__ = ["Concat", "Mean", "Mul", "Pad", "Softmax"]
