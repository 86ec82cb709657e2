"""Op kinds that TFLite models need beyond the built-in ones (produced by :func:`hwjax.tflite.load`).

=================  =======  ==========================================================
op                 inputs   attributes
=================  =======  ==========================================================
``activation``     1        ``fn`` (``"relu"``, ``"relu6"``, ``"relu_n1_to_1"``):
                            ``q_out(clamp(real(x)))``; with equal input and output
                            quantisation a clamp (TFLite's fused activations)
``requantize``     1        -- (int8/uint8 -> int8/uint8 with the output's quantisation)
``reshape``        1        ``shape`` (per-example output shape; row-major, exact)
``pool``           1        ``fn`` (``"avg"``/``"max"``), ``window``, ``strides``,
                            ``padding`` (explicit pairs; taps outside the image are
                            left out: averages divide by the in-image count)
=================  =======  ==========================================================
"""

from __future__ import annotations

import math

from hwjax.core import ConvGeometry
from hwjax.errors import ShapeError
from hwjax.graph._ops import OpSpec, register_op

ACTIVATION_FUNCTIONS = ("relu", "relu6", "relu_n1_to_1")


class Activation(OpSpec):
    """``y = q_out(f(real(x)))`` for a clamping activation ``f``."""

    name = "activation"
    attrs = {"fn": OpSpec.REQUIRED}
    choices = {"fn": ACTIVATION_FUNCTIONS}


class Requantize(OpSpec):
    """``y = q_out(real(x))`` between integer tensors (TFLite QUANTIZE int8 -> int8)."""

    name = "requantize"


class Reshape(OpSpec):
    """Row-major reshape of each example to ``shape`` (exact)."""

    name = "reshape"
    attrs = {"shape": OpSpec.REQUIRED}
    layout_only = True

    def infer(self, node, ins):
        shape = tuple(int(v) for v in node.attrs["shape"])
        if math.prod(shape) != math.prod(ins[0].shape) or min(shape, default=1) < 1:
            raise ShapeError(f"cannot reshape {tuple(ins[0].shape)} to {shape}")
        return [shape]


def padded_pool_geometry(attrs, in_shape) -> ConvGeometry:
    """The window geometry of a ``pool`` node for a per-example (H, W, C) input shape."""
    if len(in_shape) != 3:
        raise ShapeError(f"input must be (H, W, C), got shape {tuple(in_shape)}")
    return ConvGeometry.make(
        tuple(in_shape[:2]), tuple(attrs["window"]), tuple(attrs["strides"]), attrs.get("padding", ((0, 0), (0, 0)))
    )


class Pool(OpSpec):
    """Average or maximum over windows with explicit padding (in-image taps only)."""

    name = "pool"
    attrs = {"fn": OpSpec.REQUIRED, "window": OpSpec.REQUIRED, "strides": OpSpec.REQUIRED, "padding": ((0, 0), (0, 0))}
    choices = {"fn": ("avg", "max")}

    def infer(self, node, ins):
        return [(*padded_pool_geometry(node.attrs, ins[0].shape).out_hw, ins[0].shape[-1])]


register_op(Activation())
register_op(Requantize())
register_op(Reshape())
register_op(Pool())
