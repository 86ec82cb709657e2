"""``maxpool`` and ``avgpool``: VALID windows over NHWC; they keep the input's quantisation."""

from __future__ import annotations

from hwjax.core import ConvGeometry
from hwjax.errors import ArgTypeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op


def pool_geometry(attrs, in_shape) -> ConvGeometry:
    """The VALID window geometry of a pool node's ``attrs`` for a per-example (H, W, C)
    input shape (a batched shape's leading axis is dropped)."""
    if len(in_shape) == 4:
        in_shape = in_shape[1:]
    if len(in_shape) != 3:
        raise ShapeError(f"input must be (H, W, C), got shape {tuple(in_shape)}")
    for k in ("window", "strides"):
        if k not in attrs:
            raise ArgTypeError(f"attrs of a pool node need {k!r} (two positive ints), got {dict(attrs)!r}")
    return ConvGeometry.make(tuple(in_shape[:2]), tuple(attrs["window"]), tuple(attrs["strides"]), "VALID")


class _Pool(OpSpec):
    attrs = {"window": OpSpec.REQUIRED, "strides": OpSpec.REQUIRED}

    def infer(self, node, ins):
        return [(*pool_geometry(node.attrs, ins[0].shape).out_hw, ins[0].shape[-1])]


class MaxPool(_Pool):
    """Maximum over each window (exact)."""

    name = "maxpool"


class AvgPool(_Pool):
    """Average over each window, as each target rounds it."""

    name = "avgpool"


register_op(MaxPool())
register_op(AvgPool())
