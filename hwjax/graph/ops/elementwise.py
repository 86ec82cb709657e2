"""``add`` (two tensors, requantised to the output's quantisation), ``add_const`` (a tensor
and a constant) and ``lut`` (a table activation ``fn``)."""

from __future__ import annotations

from hwjax.errors import ShapeError
from hwjax.graph._ops import OpSpec, register_op
from hwjax.graph.ops.linear import ACTIVATIONS

LUT_FUNCTIONS = ("sigmoid", "tanh")


#: ``clamp_after`` of ``add`` / ``add_const``: the clamping activation the source file fused into
#: the ADD and the graph runs as the next (``activation``) node, ``"none"`` when there is none,
#: None when unknown. Runtimes that clamp such a fusion in their own rounding (XNNPACK) read it.
CLAMPS_AFTER = (None, "none", "relu6", "relu_n1_to_1")


class Add(OpSpec):
    """``y = q_out(real(x1) + real(x2))`` with an optional fused ReLU (``clamp_after``: see
    :data:`CLAMPS_AFTER`)."""

    name = "add"
    num_inputs = 2
    attrs = {"activation": None, "clamp_after": None}

    choices = {"activation": ACTIVATIONS, "clamp_after": CLAMPS_AFTER}

    def check(self, node, ins):
        super().check(node, ins)
        if len(ins) == 2 and tuple(ins[0].shape) != tuple(ins[1].shape):
            raise ShapeError(f"inputs have shapes {tuple(ins[0].shape)} and {tuple(ins[1].shape)}")


class AddConst(OpSpec):
    """``q_out(act(real(x) + real(value)))`` with a constant int8 operand: portable
    parameters ``value`` (int8, numpy-broadcast against each example), ``scale`` (float32)
    and ``zero_point`` (int32), its quantisation. ``const_first``: the constant is the
    first operand in the source file (runtimes that treat the operands asymmetrically)."""

    name = "add_const"
    attrs = {"activation": None, "const_first": False, "clamp_after": None}
    params = ("value", "scale", "zero_point")
    choices = {"activation": ACTIVATIONS, "clamp_after": CLAMPS_AFTER}

    def infer(self, node, ins):
        from hwjax.graph.ops.tensor import broadcast_shape

        value = (node.params or {}).get("value")
        if value is None:
            raise ShapeError("the portable parameter 'value' is required")
        return [broadcast_shape(tuple(ins[0].shape), tuple(value.shape))]


class Lut(OpSpec):
    """``y = q_out(fn(real(x)))`` through the target's lookup table."""

    name = "lut"
    attrs = {"fn": OpSpec.REQUIRED}
    choices = {"fn": LUT_FUNCTIONS}


register_op(Add())
register_op(AddConst())
register_op(Lut())
