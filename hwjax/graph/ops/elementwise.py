"""``add`` (two tensors, requantised to the output's quantisation) and ``lut`` (a table
activation ``fn``)."""

from __future__ import annotations

from hwjax.errors import ShapeError
from hwjax.graph._ops import OpSpec, register_op
from hwjax.graph.ops.linear import ACTIVATIONS

LUT_FUNCTIONS = ("sigmoid", "tanh")


class Add(OpSpec):
    """``y = q_out(real(x1) + real(x2))`` with an optional fused ReLU."""

    name = "add"
    num_inputs = 2
    attrs = {"activation": None}

    choices = {"activation": ACTIVATIONS}

    def check(self, node, ins):
        super().check(node, ins)
        if len(ins) == 2 and tuple(ins[0].shape) != tuple(ins[1].shape):
            raise ShapeError(f"inputs have shapes {tuple(ins[0].shape)} and {tuple(ins[1].shape)}")


class Lut(OpSpec):
    """``y = q_out(fn(real(x)))`` through the target's lookup table."""

    name = "lut"
    attrs = {"fn": OpSpec.REQUIRED}
    choices = {"fn": LUT_FUNCTIONS}


register_op(Add())
register_op(Lut())
