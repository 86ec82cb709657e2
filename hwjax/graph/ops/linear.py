"""``conv``, ``depthwise_conv`` and ``dense``: the requantising linear ops.

Portable parameters (what a calibrated ``hwjax.nn`` layer or a ``.tflite`` file holds):
``kernel`` int8 (conv: (O, kh, kw, I); depthwise: (kh, kw, C); dense: (O, I)),
``bias`` int32 (O,) in units of ``s_in * w_scale``, ``w_scale`` float32 (O,) (symmetric
per-output-channel weight scales). Each target's recipe turns these and the tensors'
quantisation into its own integer parameters.
"""

from __future__ import annotations

from hwjax.core import ConvGeometry
from hwjax.errors import RangeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op

ACTIVATIONS = (None, "relu")


def _pair(v, what: str) -> tuple[int, int]:
    t = tuple(int(i) for i in v)
    if len(t) != 2 or min(t) < 1:
        raise RangeError(f"{what} must be a pair of positive ints, got {v!r}")
    return t  # type: ignore[return-value]


def geometry(attrs, in_shape) -> ConvGeometry:
    """The :class:`hwjax.core.ConvGeometry` of a ``conv``/``depthwise_conv`` node's ``attrs``
    for a per-example (H, W, C) input shape (a batched shape's leading axis is dropped)."""
    if len(in_shape) == 4:
        in_shape = in_shape[1:]
    if len(in_shape) != 3:
        raise ShapeError(f"input must be (H, W, C), got shape {tuple(in_shape)}")
    a = attrs
    return ConvGeometry.make(
        tuple(in_shape[:2]),
        _pair(a["kernel_size"], "kernel_size"),
        _pair(a.get("stride", (1, 1)), "stride"),
        a.get("padding", ((0, 0), (0, 0))),
        _pair(a.get("dilation", (1, 1)), "dilation"),
    )


class _Linear(OpSpec):
    params = ("kernel", "bias", "w_scale")
    choices = {"activation": ACTIVATIONS}


class Conv(_Linear):
    """2-D convolution, NHWC, explicit padding; output channels ``features``. ``dilation``
    (vertical, horizontal), default (1, 1): tap ``(i, j)`` of the kernel reads input pixel
    ``(oy * sv - pad_top + i * dv, ox * sh - pad_left + j * dh)`` (:class:`hwjax.core.ConvGeometry`);
    targets without dilated kernels raise :class:`hwjax.errors.UnsupportedOpError` for
    ``dilation != (1, 1)``."""

    name = "conv"
    attrs = {
        "features": OpSpec.REQUIRED,
        "kernel_size": OpSpec.REQUIRED,
        "stride": (1, 1),
        "padding": ((0, 0), (0, 0)),
        "dilation": (1, 1),
        "activation": None,
    }

    def infer(self, node, ins):
        return [(*geometry(node.attrs, ins[0].shape).out_hw, int(node.attrs["features"]))]


class DepthwiseConv(_Linear):
    """Depthwise 2-D convolution, NHWC, explicit padding; ``dilation`` as :class:`Conv`'s.
    ``depth_multiplier`` M (default 1): C input channels give C * M outputs, output channel
    ``c * M + m`` filtering input channel ``c`` with kernel channel ``c * M + m`` (TFLite's
    layout); targets without it raise :class:`hwjax.errors.UnsupportedOpError` for M != 1."""

    name = "depthwise_conv"
    attrs = {
        "kernel_size": OpSpec.REQUIRED,
        "stride": (1, 1),
        "padding": ((0, 0), (0, 0)),
        "dilation": (1, 1),
        "depth_multiplier": 1,
        "activation": None,
    }

    def infer(self, node, ins):
        mult = int(self.attr(node, "depth_multiplier"))
        if mult < 1:
            raise ShapeError(f"depth_multiplier must be a positive int, got {mult}")
        return [(*geometry(node.attrs, ins[0].shape).out_hw, ins[0].shape[-1] * mult)]


class Dense(_Linear):
    """Fully connected over the last axis: (..., N) -> (..., features). Every row of N
    values is one product with the kernel (TFLite's FULLY_CONNECTED with ``keep_num_dims``
    reads a (H, W, C) tensor as H W rows); most targets take one row, (N,)."""

    name = "dense"
    attrs = {"features": OpSpec.REQUIRED, "activation": None}

    def infer(self, node, ins):
        if len(ins[0].shape) < 1:
            raise ShapeError(f"dense needs an (..., N) input, got shape {tuple(ins[0].shape)}")
        return [(*tuple(ins[0].shape[:-1]), int(node.attrs["features"]))]


register_op(Conv())
register_op(DepthwiseConv())
register_op(Dense())
