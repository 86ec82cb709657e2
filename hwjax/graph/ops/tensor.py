"""Op kinds for tensor operators (data movement, reductions, element-wise products).

All axes and shapes are per example (the batch axis is not counted).

=================  =======  ==========================================================
op                 inputs   attributes
=================  =======  ==========================================================
``pad``            1        ``paddings`` ((before, after) per axis), ``value`` (the
                            pad value; None: the output's zero point). Exact.
``concat``         >= 1     ``axis``: the inputs joined along ``axis`` (equal
                            quantisation everywhere; exact)
``mean``           1        ``axes`` (sorted, distinct), ``keep_dims``, ``count``
                            (the number of elements averaged, checked against the
                            shape; recipes need it): ``q_out(mean(real(x)))`` over
                            ``axes``, as each target rounds it
``mul``            2        ``activation`` (None, ``"relu"``, ``"relu6"``,
                            ``"relu_n1_to_1"``): ``q_out(act(real(x1) * real(x2)))``;
                            the shapes broadcast (numpy rules)
``mul_const``      1        ``activation``: ``mul`` by a constant (``value`` int8,
                            broadcast per example; ``scale``, ``zero_point`` its
                            quantisation)
``square``         1        ``activation`` (as ``mul``): ``q_out(act(real(x)**2))``
                            (a product of a tensor with itself)
``dequantize``     1        -- : float32 ``real(x) = scale * (x - zero_point)``
=================  =======  ==========================================================
"""

from __future__ import annotations

import math

from hwjax.errors import RangeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op

MUL_ACTIVATIONS = (None, "relu", "relu6", "relu_n1_to_1")


def _ints(v, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(i) for i in v)
    except TypeError:
        raise RangeError(f"{what} must be a sequence of ints, got {v!r}") from None


class Pad(OpSpec):
    """Constant padding: ``paddings[i] = (before, after)`` elements added on axis ``i``,
    holding ``value`` (default: the output tensor's zero point, which represents 0.0)."""

    name = "pad"
    attrs = {"paddings": OpSpec.REQUIRED, "value": None}

    def infer(self, node, ins):
        pads = tuple(_ints(p, "paddings entry") for p in node.attrs["paddings"])
        shape = tuple(ins[0].shape)
        if len(pads) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
            raise ShapeError(
                f"paddings must hold one non-negative (before, after) pair per axis of {shape}, got {pads}"
            )
        return [tuple(d + a + b for d, (a, b) in zip(shape, pads))]


class Concat(OpSpec):
    """The inputs joined along ``axis`` (all other axes equal). Exact: every input and
    the output share one quantisation."""

    name = "concat"
    num_inputs = 1  # at least one; check() allows any number
    attrs = {"axis": OpSpec.REQUIRED}

    def check(self, node, ins):
        if len(node.inputs) < 1:
            raise RangeError("takes at least 1 input")
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise RangeError(f"unknown attributes {sorted(unknown)}; concat takes ['axis']")
        if "axis" not in node.attrs:
            raise RangeError("attribute 'axis' is required")

    def infer(self, node, ins):
        axis = int(node.attrs["axis"])
        shapes = [tuple(t.shape) for t in ins]
        rank = len(shapes[0])
        if not 0 <= axis < rank:
            raise ShapeError(f"axis {axis} is outside the inputs' {rank} axes")
        rest = {s[:axis] + s[axis + 1 :] for s in shapes}
        if len(rest) != 1 or any(len(s) != rank for s in shapes):
            raise ShapeError(f"inputs {shapes} differ outside axis {axis}")
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        return [tuple(out)]


class Mean(OpSpec):
    """``q_out(mean over axes of real(x))``; ``keep_dims`` keeps the reduced axes as 1;
    ``count`` is the product of the reduced axes' sizes (the quantisation recipes derive
    their multipliers from it without seeing shapes)."""

    name = "mean"
    attrs = {"axes": OpSpec.REQUIRED, "keep_dims": False, "count": OpSpec.REQUIRED}
    choices = {"keep_dims": (False, True)}

    def infer(self, node, ins):
        axes = _ints(node.attrs["axes"], "axes")
        shape = tuple(ins[0].shape)
        if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(shape):
            raise ShapeError(f"axes must be distinct sorted axes of {shape}, got {axes}")
        count = math.prod(shape[i] for i in axes)
        if int(node.attrs["count"]) != count:
            raise ShapeError(f"count is {node.attrs['count']}, the axes {axes} of {shape} hold {count} elements")
        if self.attr(node, "keep_dims"):
            return [tuple(1 if i in axes else d for i, d in enumerate(shape))]
        return [tuple(d for i, d in enumerate(shape) if i not in axes)]


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting of two per-example shapes (ValueError if they do not broadcast)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


class Mul(OpSpec):
    """``q_out(act(real(x1) * real(x2)))``; the input shapes broadcast."""

    name = "mul"
    num_inputs = 2
    attrs = {"activation": None}
    choices = {"activation": MUL_ACTIVATIONS}

    def infer(self, node, ins):
        return [broadcast_shape(tuple(ins[0].shape), tuple(ins[1].shape))]


class MulConst(OpSpec):
    """``q_out(act(real(x) * real(value)))`` with a constant int8 operand: portable
    parameters ``value`` (int8, numpy-broadcast against each example), ``scale`` (float32)
    and ``zero_point`` (int32), its quantisation."""

    name = "mul_const"
    attrs = {"activation": None}
    params = ("value", "scale", "zero_point")
    choices = {"activation": MUL_ACTIVATIONS}

    def infer(self, node, ins):
        value = (node.params or {}).get("value")
        if value is None:
            raise ShapeError("the portable parameter 'value' is required")
        return [broadcast_shape(tuple(ins[0].shape), tuple(value.shape))]


class Square(OpSpec):
    """``q_out(act(real(x) ** 2))``: a MUL of a tensor by itself, which some runtimes
    (XNNPACK) rewrite into a squaring with its own rounding."""

    name = "square"
    attrs = {"activation": None}
    choices = {"activation": MUL_ACTIVATIONS}


class Dequantize(OpSpec):
    """float32 ``scale * (x - zero_point)`` of an integer tensor (the output is float32,
    without quantisation), as each target rounds it."""

    name = "dequantize"


register_op(Pad())
register_op(Concat())
register_op(Mean())
register_op(Mul())
register_op(MulConst())
register_op(Square())
register_op(Dequantize())
