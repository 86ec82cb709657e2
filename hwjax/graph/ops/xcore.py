"""Op kinds for xformer's XC operators (xcore.ai XS3A; spec deployed.md §3, xs3.md §4–6).

They are produced by :func:`hwjax.tflite.load` from an xformer-converted file and carry
the integer parameters the file stores (no float recipe): the lowering is the identity
and the arithmetic is the chip's (:class:`hwjax.targets.XS3Runtime`). Every node has the
per-example output shape ``out_shape`` of the file's tensor; byte-level ops (pad, slice)
work on the row-major bytes of one example.

==================  =======  ===========================================================
op                  inputs   attributes (parameters)
==================  =======  ===========================================================
``xc_conv2d``       1        ``kernel_type`` (``"direct"``, ``"indirect"``,
                             ``"depthwise"``), ``in_shape`` (the (H, W, C) view of
                             the input's bytes), ``kernel_size``, ``stride``,
                             ``dilation``, ``initial_shift``, ``final_shr``,
                             ``transform`` (``"group"``, ``"channelwise"``),
                             ``out_shape`` (``kernel`` int8 (O, kh, kw, I), or (kh, kw, C)
                             for depthwise; ``multipliers``, ``biases`` int16 (O,);
                             channel-wise: ``shifts`` (O,))
``xc_pad``          1        ``start``, ``pad``, ``length``, ``copies``, ``end``,
                             ``value`` (int8), ``out_shape``
``xc_pad_3_to_4``   1        ``value`` (int8), ``out_shape``
``xc_pad_1_to_4``   1        ``value`` (int8), ``out_shape``
``xc_slice``        1        ``start``, ``stride``, ``length``, ``copies``, ``out_shape``
``xc_lookup``       1        ``out_shape`` (``table`` int32 (256,): output per input byte)
``xc_add``          2 (1)    ``multiplier1``, ``multiplier2``, ``bias``, ``shift``,
                             ``out_shape``, ``const_index`` (see below)
``xc_mean``         1        ``outer``, ``reduced``, ``inner``, ``in_zero_point``,
                             ``out_zero_point``, ``scale`` (float32 values), ``out_shape``
``xc_maxpool2d``    1        ``window``, ``stride``, ``out_shape``
``xc_concat``       1+       ``copies``, ``sizes``, ``out_shape``
``xc_mul``          2 (1)    ``in1_zero_point``, ``in2_zero_point``, ``bias``,
                             ``scalar``, ``vlashr_shr``, ``out_shape``, ``const_index``
``xc_softmax``      1        ``out_shape``, ``row_size`` (``table`` float32 (256,))
==================  =======  ===========================================================

``xc_add`` and ``xc_mul`` read two operands of one shape. One of them may be a constant
of the file (xformer's ``XC_broadcast`` of a constant, folded at import, or a constant
tensor): the node then has one input, ``const_index`` says which operand (0 or 1) the
constant is, and its parameters hold it as ``value`` (int8, the input's shape) with its
quantisation ``scale`` and ``zero_point`` (kept for writing the file; the kernels read
only the values).
"""

from __future__ import annotations

import math

from hwjax.errors import RangeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op


class _XcOp(OpSpec):
    """An XC op whose output shape is the file's (``out_shape``)."""

    def infer(self, node, ins):
        return [tuple(int(v) for v in node.attrs["out_shape"])]


class _ElementwiseXcOp(_XcOp):
    """An element-wise XC op: every input holds as many values as ``out_shape`` (and
    several inputs have one shape)."""

    def infer(self, node, ins):
        out = super().infer(node, ins)[0]
        if len({tuple(t.shape) for t in ins}) > 1 or any(math.prod(t.shape) != math.prod(out) for t in ins):
            raise ShapeError(
                f"{self.name} maps {[tuple(t.shape) for t in ins]} to {out}: element-wise, the "
                "shapes must hold one number of values"
            )
        return [out]


class XcConv2d(_XcOp):
    """``XC_conv2d_v2`` with the group-wise ``otfn_int8`` transform: VALID windows (xformer
    pads separately), accumulation as lib_nn's ``mat_mul_generic_int8`` /
    ``mat_mul_direct_int8`` (32-byte chunks of the im2col patch, xs3.md §5.6–5.7) or
    ``mat_mul_dw_direct`` (one VLMACC per tap, §5.4), then ``otfn_int8`` (§4.1) or, with
    ``transform="channelwise"``, ``otfn_int8_channelwise`` (§4.2: per-channel ``shifts``,
    ``final_shr``)."""

    name = "xc_conv2d"
    attrs = {
        "kernel_type": OpSpec.REQUIRED,
        "transform": "group",
        "in_shape": OpSpec.REQUIRED,
        "kernel_size": OpSpec.REQUIRED,
        "stride": (1, 1),
        "dilation": (1, 1),
        "initial_shift": OpSpec.REQUIRED,
        "final_shr": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
    }
    params = ("kernel", "multipliers", "biases", "shifts")
    choices = {"kernel_type": ("direct", "indirect", "depthwise"), "transform": ("group", "channelwise")}


def xc_conv2d_out_hw(in_shape, kernel_size, stride, dilation) -> tuple[int, int]:
    """The (OH, OW) of ``xc_conv2d``'s VALID windows: ``(H - d (k - 1) - 1) // s + 1`` per
    axis. The node's ``out_shape`` is the file's tensor, which may hold the (OH, OW, C_out)
    values reshaped (xformer writes a conv followed by a RESHAPE into the reshaped tensor)."""
    (h, w, _), (kh, kw), (sr, sc), (dr, dc) = in_shape, kernel_size, stride, dilation
    return (h - dr * (kh - 1) - 1) // sr + 1, (w - dc * (kw - 1) - 1) // sc + 1


class XcPad(_XcOp):
    """``XC_pad`` on the bytes of an example: ``start`` pad bytes, then ``copies + 1``
    blocks of ``length`` input bytes separated by ``pad`` pad bytes, then ``end`` pad
    bytes; every pad byte is ``value``."""

    name = "xc_pad"
    attrs = {
        "start": OpSpec.REQUIRED,
        "pad": OpSpec.REQUIRED,
        "length": OpSpec.REQUIRED,
        "copies": OpSpec.REQUIRED,
        "end": OpSpec.REQUIRED,
        "value": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
    }

    def infer(self, node, ins):
        a = node.attrs
        n = a["start"] + (a["copies"] + 1) * a["length"] + a["copies"] * a["pad"] + a["end"]
        if n != math.prod(a["out_shape"]) or (a["copies"] + 1) * a["length"] != math.prod(ins[0].shape):
            raise ShapeError(f"pad layout {dict(a)} does not map {tuple(ins[0].shape)} to {a['out_shape']}")
        return super().infer(node, ins)


class XcPad3To4(_XcOp):
    """``XC_pad_3_to_4``: appends a fourth channel holding ``value`` to 3-channel pixels."""

    name = "xc_pad_3_to_4"
    attrs = {"value": OpSpec.REQUIRED, "out_shape": OpSpec.REQUIRED}


class XcPad1To4(XcPad3To4):
    """``XC_pad_1_to_4``: appends three channels holding ``value`` to 1-channel pixels."""

    name = "xc_pad_1_to_4"


class XcSlice(_XcOp):
    """``XC_slice`` on the bytes of an example: the concatenation over i < ``copies`` of
    bytes ``[start + i*stride, start + i*stride + length)``."""

    name = "xc_slice"
    attrs = {
        "start": OpSpec.REQUIRED,
        "stride": OpSpec.REQUIRED,
        "length": OpSpec.REQUIRED,
        "copies": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
    }


class XcLookup(_ElementwiseXcOp):
    """``XC_lookup`` (lib_nn ``lookup8``): ``y = table[u8(x)]``."""

    name = "xc_lookup"
    attrs = {"out_shape": OpSpec.REQUIRED}
    params = ("table",)


class _BinaryXcOp(_ElementwiseXcOp):
    """An element-wise XC op of two operands, one of which may be a constant parameter
    (``const_index`` 0 or 1: the constant's place; None: two inputs)."""

    num_inputs = 2
    params = ("value", "scale", "zero_point")
    choices = {"const_index": (None, 0, 1)}

    def arity(self, node) -> int:
        return 2 if node.attrs.get("const_index") is None else 1

    def check(self, node, ins):
        super().check(node, ins)
        k = self.attr(node, "const_index")
        if k is not None and "value" not in (node.params or {}):
            raise RangeError("a constant operand (const_index) needs the parameter 'value'")

    def infer(self, node, ins):
        out = super().infer(node, ins)
        if node.attrs.get("const_index") is not None:
            value = node.params["value"]
            if tuple(value.shape) != tuple(ins[0].shape):
                raise ShapeError(f"constant operand of shape {tuple(value.shape)} for input {tuple(ins[0].shape)}")
        return out


class XcAdd(_BinaryXcOp):
    """``XC_add`` (lib_nn ``add_elementwise``, xs3.md §6.4)."""

    name = "xc_add"
    attrs = {
        "multiplier1": OpSpec.REQUIRED,
        "multiplier2": OpSpec.REQUIRED,
        "bias": OpSpec.REQUIRED,
        "shift": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
        "const_index": None,
    }


class XcMean(_XcOp):
    """``XC_mean`` (deployed.md §2, float32): for the input viewed as (outer, reduced,
    inner), ``y = clamp(rint(fl32(S - zi*n) * scale + zo), -128, 127)`` with ``S`` the
    int32 sum over the reduced axis."""

    name = "xc_mean"
    attrs = {
        "outer": OpSpec.REQUIRED,
        "reduced": OpSpec.REQUIRED,
        "inner": OpSpec.REQUIRED,
        "in_zero_point": OpSpec.REQUIRED,
        "out_zero_point": OpSpec.REQUIRED,
        "scale": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
    }


class XcMaxPool2d(_XcOp):
    """``XC_maxpool2d``: per channel the maximum over VALID windows (xs3.md §6.3)."""

    name = "xc_maxpool2d"
    attrs = {"window": OpSpec.REQUIRED, "stride": OpSpec.REQUIRED, "out_shape": OpSpec.REQUIRED}


for _spec in (XcConv2d(), XcPad(), XcPad3To4(), XcPad1To4(), XcSlice(), XcLookup(), XcAdd(), XcMean(), XcMaxPool2d()):
    register_op(_spec)


class XcConcat(_XcOp):
    """``XC_concat`` on the bytes of an example: for each of ``copies`` rows, ``sizes[k]``
    bytes of input ``k`` in turn (lib_tflite_micro ``xcore_concat.cc``; no requantisation)."""

    name = "xc_concat"
    num_inputs = 1  # at least one; check() allows any number
    attrs = {"copies": OpSpec.REQUIRED, "sizes": OpSpec.REQUIRED, "out_shape": OpSpec.REQUIRED}

    def check(self, node, ins):
        if len(node.inputs) != len(node.attrs.get("sizes", ())) or not node.inputs:
            raise RangeError(f"takes one input per size, got {len(node.inputs)} inputs")
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise RangeError(f"unknown attributes {sorted(unknown)}; xc_concat takes {sorted(self.attrs)}")

    def infer(self, node, ins):
        n, sizes = node.attrs["copies"], node.attrs["sizes"]
        if any(math.prod(t.shape) != n * s for t, s in zip(ins, sizes)) or n * sum(sizes) != math.prod(
            node.attrs["out_shape"]
        ):
            raise ShapeError(
                f"concat of {n} rows of {sizes} bytes does not map {[tuple(t.shape) for t in ins]} "
                f"to {node.attrs['out_shape']}"
            )
        return super().infer(node, ins)


class XcMul(_BinaryXcOp):
    """``XC_mul`` (lib_nn ``mul_elementwise``, the reference C of the host build):
    ``acc = (x1 - z1)(x2 - z2) - 1`` with ``z = -zp - 1`` from the stored int8 fields,
    ``v = (acc + 1) >> 1``, ``v = (scalar*v + 2**13) >> 14``, ``v = sat16(v + bias)``
    (to [-32767, 32767]), ``v = sat16(v >> shr)`` (``v << -shr`` for ``shr <= 0``),
    ``y = clamp((v + 128) >> 8, -128, 127)``; arithmetic shifts."""

    name = "xc_mul"
    attrs = {
        "in1_zero_point": OpSpec.REQUIRED,
        "in2_zero_point": OpSpec.REQUIRED,
        "bias": OpSpec.REQUIRED,
        "scalar": OpSpec.REQUIRED,
        "vlashr_shr": OpSpec.REQUIRED,
        "out_shape": OpSpec.REQUIRED,
        "const_index": None,
    }


class XcSoftmax(_ElementwiseXcOp):
    """``XC_softmax`` (lib_nn ``softmax_exp_sum`` / ``softmax_exp_div``, one thread) over
    all the values of an example, in float32: ``e_i = table[x_i + 128]``,
    ``S = (...(e_0 + e_1) + ...) + e_{n-1}`` in order, ``inv = fl32(1 / S) * 256``,
    ``y_i = sat8(roundf(fl32(e_i * inv)) - 128)`` (``roundf``: ties away from zero; the
    conversion to int8 saturates, so 256 gives 127). With ``row_size``,
    ``XC_batched_softmax`` (lib_nn ``softmax_single`` per row): the same over each run of
    ``row_size`` consecutive values."""

    name = "xc_softmax"
    attrs = {"out_shape": OpSpec.REQUIRED, "row_size": None}
    params = ("table",)

    def infer(self, node, ins):
        out = super().infer(node, ins)
        r = node.attrs.get("row_size")
        if r is not None and (not isinstance(r, int) or r < 1 or math.prod(out[0]) % r):
            raise ShapeError(f"row_size {r!r} does not divide the {math.prod(out[0])} values of an example")
        return out


for _spec in (XcConcat(), XcMul(), XcSoftmax()):
    register_op(_spec)
