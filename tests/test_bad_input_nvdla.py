"""Bad inputs to the public functions of hwjax.nvdla (issue 16, the companion of
tests/test_bad_input.py and tests/test_bad_input_kernels.py).

One table of ``(function, argument, bad keyword arguments, error classes)``: every call
must raise an :class:`hwjax.errors.HwjaxError` of those classes whose message names the
argument (never an error raised from inside JAX or NumPy, never a silent result). Valid
inputs in another form (a list, a NumPy int64 array or scalar) give the canonical result,
and the kernels still trace under ``jit`` (traced values are not checked).

Shapes are fixed and small, so each function compiles a handful of programs at most.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwjax.nvdla as N
from hwjax.errors import RangeError, ShapeError

from tests.test_bad_input import (
    SETTINGS,
    check_covers_public,
    check_one_program,
    check_traceable,
    expect_error,
    expect_table_error,
    same,
    table_caller,
    table_params,
    with_value,
)

R, S, A = (RangeError,), (ShapeError,), (TypeError,)  # the error classes a case accepts
RS = (RangeError, ShapeError)
NAN, INF = float("nan"), float("inf")
I32 = np.int32

# ------------------------------------------------------------------ canonical arguments
SDP_CFG = N.sigmoid_lut()
CDP_CFG = N.lrn_lut()
V4 = np.array([[1, -2, 3, 4]], I32)  # (1, 4)
X8 = np.array(
    [[[[3, -7], [100, 0], [1, -128]], [[127, 5], [-1, 2], [9, -9]], [[0, 1], [2, 3], [4, 5]]]], I32
)  # NHWC (1, 3, 3, 2), int8 values
K8 = np.array([[[[1, -1], [2, 0]], [[0, 1], [-3, 4]]], [[[5, 6], [-7, 8]], [[1, 1], [1, 1]]]], I32)  # OHWI (2, 2, 2, 2)
KDW = np.array([[[1, -1], [2, 0]], [[0, 1], [-3, 4]]], I32)  # HWC (2, 2, 2)
X1R = dict(bias16=np.array([1, -2], I32), bias_shift=1, mul16=np.array([3, 5], I32), mul_shift=2)
F16 = np.array([1.5, -2.0, np.inf, 65504.0], np.float16)
FEAT = np.arange(-8, 8, dtype=np.int8).reshape(1, 2, 2, 4)  # NCHW
W_KCRS = np.arange(-8, 8, dtype=np.int8).reshape(2, 2, 2, 2)
W_WINO = np.arange(-9, 9, dtype=np.int8).reshape(2, 1, 3, 3)
W4 = np.arange(-16, 16, dtype=np.int16).reshape(2, 1, 4, 4)
ALU_C = np.array([1, -2, 3], np.int8)
ALU_CHW = np.arange(-6, 6, dtype=np.int8).reshape(3, 2, 2)
SEQ = np.array([0, 3, 0, 0, -1, 2, 0, 0], np.int8)
SW = N.compress_weights(W_KCRS, dtype="int8")
SSEQ = N.compress_sequence(SEQ, (4, 4), dtype="int8")


def _tanh(x):
    return np.tanh(x)


FUNCS = {  # name -> (function, canonical keyword arguments)
    # LUT unit
    "sdp_lut": (N.sdp_lut, dict(x=np.array([0, 100, -5000], I32), cfg=SDP_CFG)),
    "cdp_lut": (N.cdp_lut, dict(x=np.array([0, 100, 5000], I32), cfg=CDP_CFG)),
    "cdp_sqsum": (N.cdp_sqsum, dict(v=V4, normalz_len=1)),
    "cdp_lrn": (N.cdp_lrn, dict(v=V4, cfg=CDP_CFG, normalz_len=1)),
    # convertors
    "sign_extend": (N.sign_extend, dict(value=np.array([0x80, 0x7F, 3], I32), bits=8)),
    "int_to_fp16": (N.int_to_fp16, dict(x=np.array([1, -5, 4097], I32))),
    "cvt_unit": (
        N.cvt_unit,
        dict(unit="cdma", x=np.array([1, -2, 300], I32), offset=I32(1), scale=I32(3), shift=I32(1), out_bits=8),
    ),
    "valid_precision_conversions": (N.valid_precision_conversions, dict(unit="sdp")),
    "check_precision_conversion": (
        N.check_precision_conversion,
        dict(unit="sdp", input_precision="int8", output_precision="int16"),
    ),
    "fp16_input": (N.fp16_input, dict(x=F16, unit="conv")),
    "fp16_output": (N.fp16_output, dict(x=np.array([1.5, -1e6, 3.25], np.float32))),
    "fp16_to_int16": (N.fp16_to_int16, dict(x=F16)),
    # in-memory formats
    "feature_offsets": (N.feature_offsets, dict(shape=(1, 2, 2, 4), dtype="int8")),
    "pack_feature": (N.pack_feature, dict(x=FEAT, dtype="int8")),
    "unpack_feature": (N.unpack_feature, dict(image=N.pack_feature(FEAT), shape=(1, 2, 2, 4), dtype="int8")),
    "dc_weight_offsets": (N.dc_weight_offsets, dict(shape_kcrs=(2, 2, 2, 2), dtype="int8")),
    "pack_dc_weights": (N.pack_dc_weights, dict(w=W_KCRS, dtype="int8")),
    "unpack_dc_weights": (
        N.unpack_dc_weights,
        dict(image=N.pack_dc_weights(W_KCRS), shape_kcrs=(2, 2, 2, 2), dtype="int8"),
    ),
    "pre_extend_image_weights": (N.pre_extend_image_weights, dict(w=W_KCRS, input_channels=2)),
    "unextend_image_weights": (
        N.unextend_image_weights,
        dict(w_pre=N.pre_extend_image_weights(W_KCRS, input_channels=2), channels=2, kernel_width=2),
    ),
    "image_post_extension_factor": (
        N.image_post_extension_factor,
        dict(input_channels=2, kernel_width=2, kernel_height=2),
    ),
    "image_weight_offsets": (N.image_weight_offsets, dict(shape_kcrs=(2, 2, 2, 2), dtype="int8", input_channels=2)),
    "pack_image_weights": (N.pack_image_weights, dict(w=W_KCRS, input_channels=2)),
    "unpack_image_weights": (
        N.unpack_image_weights,
        dict(
            image=N.pack_image_weights(W_KCRS, input_channels=2),
            shape_kcrs=(2, 2, 2, 2),
            input_channels=2,
            dtype="int8",
        ),
    ),
    "pack_sdp_per_channel": (N.pack_sdp_per_channel, dict(alu=ALU_C, mul=ALU_C)),
    "unpack_sdp_per_channel": (
        N.unpack_sdp_per_channel,
        dict(image=N.pack_sdp_per_channel(ALU_C, ALU_C), channels=3, dtype="int8"),
    ),
    "sdp_per_element_offsets": (
        N.sdp_per_element_offsets,
        dict(shape_chw=(3, 2, 2), dtype="int8", proc_precision="INT8"),
    ),
    "pack_sdp_per_element": (N.pack_sdp_per_element, dict(alu=ALU_CHW, mul=ALU_CHW, proc_precision="INT8")),
    "unpack_sdp_per_element": (
        N.unpack_sdp_per_element,
        dict(
            image=N.pack_sdp_per_element(ALU_CHW, ALU_CHW, proc_precision="INT8"),
            shape_chw=(3, 2, 2),
            proc_precision="INT8",
            dtype="int8",
        ),
    ),
    "check_alignment": (N.check_alignment, dict(kind="feature", line_stride=64)),
    # sparse weights
    "weight_group_elements": (N.weight_group_elements, dict(shape=(2, 2, 2, 2), dtype="int8")),
    "compress_weights": (N.compress_weights, dict(w=W_KCRS, dtype="int8")),
    "decompress_weights": (N.decompress_weights, dict(weight=SW.weight, wmb=SW.wmb, shape=(2, 2, 2, 2), dtype="int8")),
    "compress_sequence": (N.compress_sequence, dict(seq=SEQ, group_elements=(4, 4), dtype="int8")),
    "decompress_sequence": (
        N.decompress_sequence,
        dict(weight=SSEQ.weight, wmb=SSEQ.wmb, num_elements=8, dtype="int8"),
    ),
    "wgs_image": (N.wgs_image, dict(wgs=np.array([3, 5], I32))),
    # Winograd
    "winograd_padded_channels": (N.winograd_padded_channels, dict(channels=3, dtype="int8")),
    "winograd_transform": (N.winograd_transform, dict(w=W_WINO)),
    "winograd_weight_offsets": (N.winograd_weight_offsets, dict(shape_kc44=(2, 32, 4, 4), dtype="int8")),
    "pack_winograd_weights": (N.pack_winograd_weights, dict(w=W_WINO)),
    "pack_winograd_transformed": (N.pack_winograd_transformed, dict(w4=N.winograd_transform(W_WINO))),
    "unpack_winograd_weights": (
        N.unpack_winograd_weights,
        dict(image=N.pack_winograd_weights(W_WINO), shape_kc44=(2, 32, 4, 4), dtype="int8"),
    ),
    # LUT programming (host side)
    "quantize_entries": (N.quantize_entries, dict(values=np.array([0.4, -1.5, 1e6]))),
    "slope_registers": (N.slope_registers, dict(slope=0.25, input_scale=4096.0, output_scale=32767.0)),
    "linear_layout": (N.linear_layout, dict(x_range=(-1, 1), input_scale=4096.0, depth=65)),
    "sweep": (N.sweep, dict(x_range=(-1, 1), input_scale=4.0)),
    "lut_error": (
        N.lut_error,
        dict(cfg=SDP_CFG, fn=_tanh, input_scale=4096.0, output_scale=32767.0, x_range=(-1, 1), num_points=33),
    ),
    "program_lut": (
        N.program_lut,
        dict(fn=_tanh, input_scale=4096.0, output_scale=32767.0, x_range=(-4, 4), num_points=257),
    ),
    "fit_lut": (
        N.fit_lut,
        dict(fn=_tanh, cfg=SDP_CFG, input_scale=4096.0, output_scale=32767.0, x_range=(-4, 4), steps=1, num_points=64),
    ),
    "sigmoid_lut": (N.sigmoid_lut, dict(num_points=257)),
    "tanh_lut": (N.tanh_lut, dict(num_points=257)),
    "exp_lut": (N.exp_lut, dict(num_points=257)),
    "reciprocal_lut": (N.reciprocal_lut, dict(num_points=257)),
    "lrn_lut": (N.lrn_lut, dict(num_points=257)),
    "plot_lut": (N.plot_lut, dict(cfg=SDP_CFG, fn=_tanh, path="unused.png")),
    # INT8 layer kernels
    "sdp_x": (
        N.sdp_x,
        dict(
            v=np.array([100, -300, 2**20], I32),
            alu_op=np.array([3, -4, 5], I32),
            alu_shift=2,
            mul_op=np.array([7, 7, -7], I32),
            mul_shift=3,
            relu=True,
        ),
    ),
    "sdp_x1": (N.sdp_x1, dict(acc=np.array([[100, -300], [5000, 7]], I32), **X1R)),
    "conv2d_int8": (N.conv2d_int8, dict(x=X8, kernel_ohwi=K8, **X1R)),
    "depthwise_conv2d_int8": (N.depthwise_conv2d_int8, dict(x=X8, kernel_hwc=KDW, **X1R)),
    "sdp_add_int8": (
        N.sdp_add_int8,
        dict(x=X8, y=X8[..., ::-1], x_mul=3, x_shift=1, y_scale=-5, y_shift=2, out_scale=7, out_shift=4),
    ),
    "pdp_recip_kernel": (N.pdp_recip_kernel, dict(k=3)),
    "pdp_maxpool_int8": (N.pdp_maxpool_int8, dict(x=X8, window=2, stride=1)),
    "pdp_avgpool_int8": (N.pdp_avgpool_int8, dict(x=X8, window=2, stride=1)),
}

CANONICAL_SKIP = {"plot_lut"}  # needs matplotlib


call = table_caller(FUNCS)


_with = with_value


BADTYPES = ("abc", None, [[1, 2], [3]])

# (function, argument named in the error, bad keyword arguments, accepted error classes)
CASES = [
    # ---- LUT unit
    ("sdp_lut", "x", dict(x=np.array([2**40], np.int64)), R),
    ("sdp_lut", "x", dict(x="abc"), A),
    ("sdp_lut", "x", dict(x=np.float32([0.5])), (TypeError, ValueError)),
    ("sdp_lut", "cfg", dict(cfg=CDP_CFG), A),
    ("sdp_lut", "cfg", dict(cfg=None), A),
    ("sdp_lut", "return_details", dict(return_details="yes"), A),
    ("cdp_lut", "x", dict(x="abc"), A),
    ("cdp_lut", "cfg", dict(cfg=SDP_CFG), A),
    ("cdp_lut", "x", dict(x=np.float32([NAN])), (TypeError, ValueError)),
    ("cdp_lut", "return_details", dict(return_details=1), A),
    ("cdp_sqsum", "normalz_len", dict(normalz_len=4), R),
    ("cdp_sqsum", "normalz_len", dict(normalz_len="1"), A),
    ("cdp_sqsum", "axis", dict(axis=2), R),
    ("cdp_sqsum", "v", dict(v=np.array([2**40], np.int64)), R),
    ("cdp_sqsum", "v", dict(v=None), A),
    ("cdp_sqsum", "v", dict(v=np.float32([0.5])), R),
    ("cdp_sqsum", "v", dict(v=np.array([2**20], I32)), R),
    ("cdp_lrn", "cfg", dict(cfg=SDP_CFG), A),
    ("cdp_lrn", "normalz_len", dict(normalz_len=-1), R),
    ("cdp_lrn", "v", dict(v="abc"), A),
    ("cdp_lrn", "axis", dict(axis=5), R),
    ("cdp_lrn", "sqsum_bypass", dict(sqsum_bypass="no"), A),
    ("cdp_lrn", "mul_bypass", dict(mul_bypass=None), A),
    ("cdp_lrn", "v", dict(v=np.array([[2**20, 0]], I32)), R),
    # ---- convertors
    ("sign_extend", "bits", dict(bits=0), R),
    ("sign_extend", "bits", dict(bits=33), R),
    ("sign_extend", "bits", dict(bits=8.0), A),
    ("sign_extend", "value", dict(value=np.float32([1.5])), A),
    ("sign_extend", "value", dict(value="abc"), A),
    ("sign_extend", "value", dict(value=None), A),
    ("sign_extend", "value", dict(value=[[1, 2], [3]]), A),
    ("sign_extend", "value", dict(value=np.array([2**40], np.int64)), R),
    ("int_to_fp16", "x", dict(x=np.array([2**25], I32)), R),
    ("int_to_fp16", "x", dict(x=np.float32([1.5])), A),
    ("int_to_fp16", "x", dict(x="abc"), A),
    ("int_to_fp16", "x", dict(x=None), A),
    ("cvt_unit", "unit", dict(unit="cdp"), R),
    ("cvt_unit", "out_bits", dict(out_bits=32), R),
    ("cvt_unit", "out_bits", dict(out_bits=np.array([8, 16])), R),
    ("cvt_unit", "out_bits", dict(out_bits=True), R),
    ("cvt_unit", "x", dict(x=np.array([2**17], I32)), R),
    ("cvt_unit", "offset", dict(offset=I32(2**16)), R),
    ("cvt_unit", "scale", dict(scale=I32(2**16)), R),
    ("cvt_unit", "shift", dict(shift=I32(64)), R),
    ("cvt_unit", "shift", dict(shift=I32(-1)), R),
    ("cvt_unit", "x", dict(x="abc"), A),
    ("cvt_unit", "scale", dict(scale=None), A),
    ("cvt_unit", "offset", dict(offset=np.float32(0.5)), RS + A),
    ("cvt_unit", "x", dict(x=np.float32([NAN])), RS + A),
    ("cvt_unit", "unit", dict(unit=None), R),
    ("cvt_unit", "offset", dict(offset=np.ones(5, I32)), S),
    ("cvt_unit", "return_flags", dict(return_flags="y"), A),
    ("cvt_unit", "saturation_grad", dict(saturation_grad="none"), R),
    ("valid_precision_conversions", "unit", dict(unit="conv2d"), R),
    ("valid_precision_conversions", "unit", dict(unit=None), R),
    ("check_precision_conversion", "input_precision", dict(input_precision="int4"), R),
    ("check_precision_conversion", "output_precision", dict(output_precision="fp32"), R),
    ("check_precision_conversion", "unit", dict(unit="xdp"), R),
    ("check_precision_conversion", "input_precision", dict(input_precision=["int8"]), R),
    ("fp16_input", "unit", dict(unit="x"), R),
    ("fp16_input", "x", dict(x=np.float32([1.0])), A),
    ("fp16_input", "x", dict(x="abc"), A),
    ("fp16_input", "x", dict(x=None), A),
    ("fp16_input", "nan_to_zero", dict(nan_to_zero="yes"), A),
    ("fp16_input", "unit", dict(unit=["conv"]), R),
    ("fp16_output", "x", dict(x=np.array([1, 2], I32)), A),
    ("fp16_output", "x", dict(x="abc"), A),
    ("fp16_output", "x", dict(x=None), A),
    ("fp16_output", "x", dict(x=[[1.0], [2.0, 3.0]]), A),
    ("fp16_to_int16", "x", dict(x=np.float32([1.0])), A),
    ("fp16_to_int16", "x", dict(x="abc"), A),
    ("fp16_to_int16", "x", dict(x=[[1.0], [2.0, 3.0]]), A),
    # ---- in-memory formats
    ("feature_offsets", "shape", dict(shape=(2, 2)), RS),
    ("feature_offsets", "shape", dict(shape=(1, -2, 2, 4)), RS),
    ("feature_offsets", "dtype", dict(dtype="float64"), RS + A),
    ("feature_offsets", "atom_bytes", dict(atom_bytes=0), R),
    ("feature_offsets", "line_stride", dict(line_stride=3), R),
    ("feature_offsets", "shape", dict(shape="abc"), RS + A),
    ("feature_offsets", "line_stride", dict(line_stride="64"), A),
    ("pack_feature", "x", dict(x=np.ones((2, 4), np.int8)), S),
    ("pack_feature", "x", dict(x="abc"), A),
    ("pack_feature", "x", dict(x=FEAT.astype(np.float32) + 0.5), RS + A),
    ("pack_feature", "x", dict(x=_with(FEAT, 0, 300, I32), dtype="int8"), R),
    ("pack_feature", "dtype", dict(dtype="complex64"), RS + A),
    ("pack_feature", "surf_stride", dict(surf_stride=-1), R),
    ("unpack_feature", "image", dict(image=np.zeros(10, np.uint8)), RS),
    ("unpack_feature", "image", dict(image="abc"), A),
    ("unpack_feature", "shape", dict(shape=(2, 2)), RS),
    ("unpack_feature", "dtype", dict(dtype=None), RS + A),
    ("unpack_feature", "image", dict(image=np.zeros(128, np.float32)), RS + A),
    ("dc_weight_offsets", "shape_kcrs", dict(shape_kcrs=(2, 2, 2)), RS),
    ("dc_weight_offsets", "atomic_k", dict(atomic_k=0), R),
    ("dc_weight_offsets", "atomic_c", dict(atomic_c=3.5), A),
    ("dc_weight_offsets", "dtype", dict(dtype="int64"), RS + A),
    ("pack_dc_weights", "w", dict(w=np.ones((2, 2, 2), np.int8)), S),
    ("pack_dc_weights", "w", dict(w=None), A),
    ("pack_dc_weights", "cbuf_width", dict(cbuf_width=0), R),
    ("pack_dc_weights", "w", dict(w=_with(W_KCRS, 0, 200, I32), dtype="int8"), R),
    ("unpack_dc_weights", "image", dict(image=np.zeros(3, np.uint8)), RS),
    ("unpack_dc_weights", "shape_kcrs", dict(shape_kcrs=(2, 2, 2, "a")), RS + A),
    ("pre_extend_image_weights", "input_channels", dict(input_channels=1), RS),
    ("pre_extend_image_weights", "input_channels", dict(input_channels=0), RS),
    ("pre_extend_image_weights", "w", dict(w=np.ones((2, 2), np.int8)), S),
    ("pre_extend_image_weights", "input_channels", dict(input_channels="2"), A),
    ("unextend_image_weights", "channels", dict(channels=3), RS),
    ("unextend_image_weights", "kernel_width", dict(kernel_width=0), RS),
    ("unextend_image_weights", "w_pre", dict(w_pre="abc"), A),
    ("image_post_extension_factor", "input_channels", dict(input_channels=0), R),
    ("image_post_extension_factor", "kernel_width", dict(kernel_width=-1), R),
    ("image_post_extension_factor", "stride_x", dict(stride_x="1"), A),
    ("image_post_extension_factor", "compiler_rule", dict(compiler_rule="yes"), A),
    ("image_weight_offsets", "input_channels", dict(input_channels=1), RS),
    ("image_weight_offsets", "stride_x", dict(stride_x=0), R),
    ("image_weight_offsets", "post_extension", dict(post_extension=3), R),
    ("pack_image_weights", "w", dict(w="abc"), A),
    ("pack_image_weights", "input_channels", dict(input_channels=1), RS),
    ("pack_image_weights", "stride_x", dict(stride_x=1.5), A),
    ("unpack_image_weights", "image", dict(image=np.zeros(3, np.uint8)), RS),
    ("unpack_image_weights", "input_channels", dict(input_channels=None), A),
    ("pack_sdp_per_channel", "alu", dict(alu=np.ones((2, 3), np.int8)), S),
    ("pack_sdp_per_channel", "mul", dict(mul=np.ones(4, np.int8)), S),
    ("pack_sdp_per_channel", "alu", dict(alu="abc"), A),
    ("pack_sdp_per_channel", "alu", dict(alu=np.array([300, 0, 0], I32), dtype="int8"), R),
    ("pack_sdp_per_channel", "alu", dict(alu=None, mul=None), (TypeError, ValueError)),
    ("unpack_sdp_per_channel", "channels", dict(channels=0), R),
    ("unpack_sdp_per_channel", "image", dict(channels=99), S),
    ("unpack_sdp_per_channel", "components", dict(components=("alu", "add")), R),
    ("unpack_sdp_per_channel", "image", dict(image=None), A),
    ("sdp_per_element_offsets", "proc_precision", dict(proc_precision="int4"), R),
    ("sdp_per_element_offsets", "shape_chw", dict(shape_chw=(3, 2)), RS),
    ("sdp_per_element_offsets", "components", dict(components=("x",)), R),
    ("sdp_per_element_offsets", "line_stride", dict(line_stride=3), R),
    ("pack_sdp_per_element", "alu", dict(alu=np.ones((2, 2), np.int8)), S),
    ("pack_sdp_per_element", "mul", dict(mul=np.ones((4, 2, 2), np.int8)), S),
    ("pack_sdp_per_element", "proc_precision", dict(proc_precision=None), R),
    ("pack_sdp_per_element", "alu", dict(alu=[[1, 2], [3]]), A),
    ("unpack_sdp_per_element", "image", dict(image=np.zeros(3, np.uint8)), RS),
    ("unpack_sdp_per_element", "proc_precision", dict(proc_precision=["INT8"]), R),
    ("sdp_per_element_offsets", "proc_precision", dict(proc_precision={"a": 1}), R),
    *[
        (f, arg, {arg: [[1, 2], [3]]}, A)
        for f, arg in (
            ("pack_feature", "x"),
            ("unpack_feature", "image"),
            ("pack_dc_weights", "w"),
            ("unpack_dc_weights", "image"),
            ("unpack_image_weights", "image"),
            ("unpack_sdp_per_channel", "image"),
            ("compress_weights", "w"),
            ("decompress_weights", "weight"),
            ("decompress_weights", "wmb"),
            ("compress_sequence", "seq"),
            ("decompress_sequence", "wmb"),
            ("unpack_winograd_weights", "image"),
        )
    ],
    ("unpack_sdp_per_element", "shape_chw", dict(shape_chw=(3, 2, -2)), RS),
    ("check_alignment", "kind", dict(kind="tensor"), R),
    ("check_alignment", "line_stride", dict(line_stride=48), R),
    ("check_alignment", "line_stride", dict(line_stride="64"), A),
    ("check_alignment", "address", dict(kind="weight", line_stride=None, address=128), R),
    ("check_alignment", "line_stride", dict(line_stride=-32), R),
    # ---- sparse weights
    ("weight_group_elements", "layout", dict(layout="nchw"), R),
    ("weight_group_elements", "shape", dict(shape=(2, 2)), RS),
    ("weight_group_elements", "dtype", dict(dtype="float64"), RS + A),
    ("compress_weights", "w", dict(w="abc"), A),
    ("compress_weights", "layout", dict(layout="x"), R),
    ("compress_weights", "w", dict(w=_with(W_KCRS, 0, 200, I32)), R),
    ("compress_weights", "cbuf_width", dict(cbuf_width=0), R),
    ("decompress_weights", "shape", dict(shape=(2, 2, 2)), RS),
    ("decompress_weights", "wmb", dict(wmb=np.zeros(1, np.uint8)), S),
    ("decompress_weights", "weight", dict(weight="abc"), A),
    ("decompress_weights", "layout", dict(layout="x"), R),
    ("compress_sequence", "group_elements", dict(group_elements=(4, 5)), RS),
    ("compress_sequence", "group_elements", dict(group_elements="ab"), RS + A),
    ("compress_sequence", "seq", dict(seq=None), A),
    ("compress_sequence", "seq", dict(seq=np.ones((2, 4), np.int8)), S),
    ("compress_sequence", "group_elements", dict(group_elements=(8, -0)), RS),
    ("decompress_sequence", "num_elements", dict(num_elements=-1), R),
    ("decompress_sequence", "wmb", dict(num_elements=2**20), S),
    ("decompress_sequence", "weight", dict(weight=None), A),
    ("decompress_sequence", "dtype", dict(dtype="x"), RS + A),
    ("decompress_sequence", "wmb", dict(wmb="abc"), A),
    ("wgs_image", "wgs", dict(wgs=np.array([-1], I32)), R),
    ("wgs_image", "wgs", dict(wgs="abc"), A),
    ("wgs_image", "wgs", dict(wgs=np.float32([1.5])), RS + A),
    ("wgs_image", "cbuf_width", dict(cbuf_width=0), R),
    ("wgs_image", "wgs", dict(wgs=np.array([2**40], np.int64)), R),
    # ---- Winograd
    ("winograd_padded_channels", "channels", dict(channels=0), R),
    ("winograd_padded_channels", "channels", dict(channels="3"), A),
    ("winograd_padded_channels", "dtype", dict(dtype="float64"), RS + A),
    ("winograd_padded_channels", "atom_bytes", dict(atom_bytes=0), R),
    ("winograd_transform", "w", dict(w=np.ones((2, 1, 2, 2), np.int8)), S),
    ("winograd_transform", "w", dict(w="abc"), A),
    ("winograd_transform", "w", dict(w=W_WINO.astype(np.float32) + 0.5), RS + A),
    ("winograd_weight_offsets", "shape_kc44", dict(shape_kc44=(2, 32, 3, 3)), RS),
    ("winograd_weight_offsets", "atomic_k", dict(atomic_k=0), R),
    ("pack_winograd_weights", "w", dict(w=np.ones((2, 2), np.int8)), S),
    ("pack_winograd_weights", "w", dict(w=None), A),
    ("pack_winograd_transformed", "w4", dict(w4=np.ones((2, 1, 3, 3), np.int16)), S),
    ("pack_winograd_transformed", "w4", dict(w4="abc"), A),
    ("unpack_winograd_weights", "image", dict(image=np.zeros(3, np.uint8)), RS),
    ("unpack_winograd_weights", "shape_kc44", dict(shape_kc44=(2, 32, 4)), RS),
    # ---- LUT programming
    ("quantize_entries", "values", dict(values="abc"), A),
    ("quantize_entries", "values", dict(values=None), A),
    ("quantize_entries", "values", dict(values=[[1.0], [2.0, 3.0]]), A),
    ("slope_registers", "slope", dict(slope=NAN), R),
    ("slope_registers", "input_scale", dict(input_scale=0.0), R),
    ("slope_registers", "output_scale", dict(output_scale="1"), A),
    ("slope_registers", "slope", dict(slope=None), A),
    ("slope_registers", "input_scale", dict(input_scale=-1.0), R),
    ("linear_layout", "depth", dict(depth=0), R),
    ("linear_layout", "depth", dict(depth="65"), A),
    ("linear_layout", "input_scale", dict(input_scale=NAN), R),
    ("linear_layout", "x_range", dict(x_range=(0, NAN)), R),
    ("linear_layout", "x_range", dict(x_range=(1,)), RS + A),
    ("linear_layout", "bits", dict(bits=0), R),
    ("linear_layout", "input_scale", dict(input_scale=0.0), R),
    ("linear_layout", "x_range", dict(x_range="ab"), RS + A),
    ("sweep", "num_points", dict(num_points=0), R),
    ("sweep", "input_scale", dict(input_scale=INF), R),
    ("sweep", "x_range", dict(x_range=(0, INF)), R),
    ("sweep", "x_range", dict(x_range=None), A),
    ("sweep", "geometric", dict(geometric="yes"), A),
    ("sweep", "num_points", dict(num_points=2.5), A),
    ("sweep", "input_scale", dict(input_scale=0.0), R),
    ("lut_error", "cfg", dict(cfg=None), A),
    ("lut_error", "input_scale", dict(input_scale=0.0), R),
    ("lut_error", "output_scale", dict(output_scale=NAN), R),
    ("lut_error", "fn", dict(fn="tanh"), A),
    ("lut_error", "num_points", dict(num_points=0), R),
    ("program_lut", "input_scale", dict(input_scale=-1.0), R),
    ("program_lut", "le_mode", dict(le_mode="log"), R),
    ("program_lut", "unit", dict(unit="pdp"), R),
    ("program_lut", "fn", dict(fn=None), A),
    ("program_lut", "x_range", dict(x_range=(0, NAN)), R),
    ("program_lut", "output_scale", dict(output_scale=0.0), R),
    ("program_lut", "num_points", dict(num_points=0), R),
    ("program_lut", "precision", dict(precision="int4"), R),
    ("program_lut", "le_index_offset", dict(le_index_offset="0"), A),
    ("program_lut", "return_report", dict(return_report="yes"), A),
    ("fit_lut", "cfg", dict(cfg=None), A),
    ("fit_lut", "steps", dict(steps=-1), R),
    ("fit_lut", "input_scale", dict(input_scale=0.0), R),
    ("fit_lut", "learning_rate", dict(learning_rate=NAN), R),
    *[
        (f, "input_frac_bits", dict(input_frac_bits=v), k)
        for f in ("sigmoid_lut", "tanh_lut", "exp_lut", "reciprocal_lut")
        for v, k in ((100, R), ("12", A))
    ],
    ("sigmoid_lut", "output_scale", dict(output_scale=0.0), R),
    ("exp_lut", "x_range", dict(x_range=(NAN, 0)), R),
    ("lrn_lut", "beta", dict(beta=NAN), R),
    ("lrn_lut", "n", dict(n=0), R),
    ("lrn_lut", "unit", dict(unit="pdp"), R),
    ("lrn_lut", "k", dict(k="2"), A),
    ("plot_lut", "cfg", dict(cfg=None), A),
    # ---- INT8 layer kernels
    ("sdp_x", "v", dict(v=np.array([2**40, 0, 0], np.int64)), R),
    ("sdp_x", "v", dict(v="abc"), A),
    ("sdp_x", "alu_op", dict(alu_op=np.array([2**16, 0, 0], I32)), R),
    ("sdp_x", "mul_op", dict(mul_op=np.array([-(2**15) - 1, 0, 0], I32)), R),
    ("sdp_x", "alu_shift", dict(alu_shift=64), R),
    ("sdp_x", "mul_shift", dict(mul_shift=-1), R),
    ("sdp_x", "alu_algo", dict(alu_algo="avg"), R),
    ("sdp_x", "relu", dict(relu="yes"), A),
    ("sdp_x", "alu_op", dict(alu_op=np.ones(5, I32)), S),
    ("sdp_x", "v", dict(v=np.float32([0.5, 1, 2])), RS + A),
    ("sdp_x", "mul_op", dict(mul_op="abc"), A),
    ("sdp_x", "alu_shift", dict(alu_shift=1.5), RS + A),
    ("sdp_x1", "acc", dict(acc=np.float32([[0.5, 1]])), RS + A),
    ("sdp_x1", "acc", dict(acc=None), A),
    ("sdp_x1", "bias16", dict(bias16=np.array([2**15, 0], I32)), R),
    ("sdp_x1", "bias16", dict(bias16=np.ones(3, I32)), S),
    ("sdp_x1", "mul16", dict(mul16="abc"), A),
    ("sdp_x1", "bias_shift", dict(bias_shift=64), R),
    ("sdp_x1", "mul_shift", dict(mul_shift=-1), R),
    ("sdp_x1", "relu", dict(relu=1), A),
    ("sdp_x1", "out_scale", dict(out_scale=2**16), R),
    ("sdp_x1", "out_shift", dict(out_shift=64), R),
    ("sdp_x1", "out_offset", dict(out_offset=2**40), R),
    ("sdp_x1", "out_offset", dict(out_offset=None), A),
    ("sdp_x1", "acc", dict(acc=np.int64([[2**40, 0]])), R),
    *[
        (f, arg, {arg: v}, k)
        for f in ("conv2d_int8", "depthwise_conv2d_int8")
        for arg, v, k in (
            ("x", _with(X8, 0, 200), R),
            ("x", None, A),
            ("x", X8.astype(np.float32) + 0.5, RS + A),
            ("x", X8[0, 0], S),
            ("stride", 0, R),
            ("stride", 1.5, A),
            ("padding", "FULL", R),
            ("dilation", "2", A),
            ("pad_value", 200, R),
            ("pad_value", "0", A),
            ("bias16", np.ones(3, I32), S),
            ("bias16", [2**15, 0], R),
            ("mul16", None, A),
            ("bias_shift", 64, R),
            ("relu", "yes", A),
            ("out_scale", 2**16, R),
            ("cacc_truncate", -1, R),
            ("cacc_truncate", 64, R),
        )
    ],
    ("conv2d_int8", "kernel_ohwi", dict(kernel_ohwi=_with(K8, 0, 200)), R),
    ("conv2d_int8", "kernel_ohwi", dict(kernel_ohwi=K8[..., :1]), S),
    ("conv2d_int8", "kernel_ohwi", dict(kernel_ohwi="abc"), A),
    ("depthwise_conv2d_int8", "kernel_hwc", dict(kernel_hwc=_with(KDW, 0, -200)), R),
    ("depthwise_conv2d_int8", "kernel_hwc", dict(kernel_hwc=KDW[..., :1]), S),
    ("depthwise_conv2d_int8", "kernel_hwc", dict(kernel_hwc=[[1, 2], [3]]), A),
    ("sdp_add_int8", "x", dict(x=_with(X8, 0, 200)), R),
    ("sdp_add_int8", "y", dict(y=X8[..., :1, :]), S),
    ("sdp_add_int8", "y", dict(y="abc"), A),
    ("sdp_add_int8", "x_mul", dict(x_mul=2**16), R),
    ("sdp_add_int8", "x_shift", dict(x_shift=-1), R),
    ("sdp_add_int8", "y_scale", dict(y_scale=None), A),
    ("sdp_add_int8", "y_shift", dict(y_shift=64), R),
    ("sdp_add_int8", "out_scale", dict(out_scale=1.5), RS + A),
    ("sdp_add_int8", "out_shift", dict(out_shift=-1), R),
    ("sdp_add_int8", "y_offset", dict(y_offset=2**40), R),
    ("sdp_add_int8", "x", dict(x=X8.astype(np.float32) + 0.5), RS + A),
    ("pdp_recip_kernel", "k", dict(k=0), R),
    ("pdp_recip_kernel", "k", dict(k=9), R),
    ("pdp_recip_kernel", "k", dict(k="3"), A),
    ("pdp_recip_kernel", "k", dict(k=3.0), A),
    *[
        (f, arg, {arg: v}, k)
        for f in ("pdp_maxpool_int8", "pdp_avgpool_int8")
        for arg, v, k in (
            ("x", _with(X8, 0, 200), R),
            ("x", "abc", A),
            ("x", X8[0, 0], S),
            ("window", 9, R),
            ("window", 0, R),
            ("window", "2", A),
            ("stride", 0, R),
            ("stride", 2.5, A),
            ("padding", "FULL", R),
            ("x", X8.astype(np.float32) + 0.5, RS + A),
        )
    ],
    ("pdp_avgpool_int8", "recip_kernel_width", dict(recip_kernel_width=2**17), R),
    ("pdp_avgpool_int8", "recip_kernel_height", dict(recip_kernel_height=-1), R),
    ("pdp_avgpool_int8", "recip_kernel_width", dict(recip_kernel_width="a"), A),
]


@pytest.mark.parametrize("case", table_params(CASES))
def test_bad_arguments_raise_named_hwjax_errors(case):
    expect_table_error(call, case)


# Public functions that still compile more than one program when called eagerly on a
# new shape (see tests/test_bad_input.py:check_one_program).
MULTI_PROGRAM: dict[str, str] = {}


def test_every_function_is_covered_and_runs_as_one_program_on_canonical_arguments():
    for name, (fn, _) in FUNCS.items():
        assert fn.__name__ == name, name
    check_one_program([n for n in FUNCS if n not in CANONICAL_SKIP], call, MULTI_PROGRAM)  # runs them
    covered = {f for f, *_ in CASES}
    assert covered == set(FUNCS), set(FUNCS) - covered
    check_covers_public(FUNCS, N, elsewhere={"cvt"})  # cvt: tests/test_bad_input.py


# ------------------------------------------------- valid inputs in other forms, traced values

# (function, argument, lo, hi): every form of a valid value gives the canonical result
INT_ARRAYS = [
    ("sdp_lut", "x", -(2**31), 2**31 - 1),
    ("cdp_sqsum", "v", -(2**16), 2**16 - 1),
    ("cdp_lrn", "v", -(2**16), 2**16 - 1),
    ("sign_extend", "value", -(2**31), 2**31 - 1),
    ("int_to_fp16", "x", -(2**24), 2**24),
    ("cvt_unit", "x", -(2**16), 2**16 - 1),
    ("sdp_x", "v", -(2**31), 2**31 - 1),
    ("sdp_x", "alu_op", -(2**15), 2**15 - 1),
    ("sdp_x1", "acc", -(2**31), 2**31 - 1),
    ("sdp_x1", "bias16", -(2**15), 2**15 - 1),
    ("conv2d_int8", "x", -128, 127),
    ("depthwise_conv2d_int8", "kernel_hwc", -128, 127),
    ("sdp_add_int8", "y", -128, 127),
    ("pdp_maxpool_int8", "x", -128, 127),
    ("pdp_avgpool_int8", "x", -128, 127),
    ("pack_feature", "x", -128, 127),
    ("pack_dc_weights", "w", -128, 127),
    ("wgs_image", "wgs", 0, 2**20),
]


def _tree_same(a, b):
    jax.tree_util.tree_map(same, a, b)


@SETTINGS
@given(st.sampled_from(INT_ARRAYS), st.data())
def test_valid_arrays_in_other_forms_give_the_canonical_result(case, data):
    fname, arg, lo, hi = case
    canonical = np.asarray(FUNCS[fname][1][arg])
    v = np.asarray(
        data.draw(st.lists(st.integers(lo, hi), min_size=canonical.size, max_size=canonical.size)), np.int64
    ).reshape(canonical.shape)
    want = call(fname, **{arg: v.astype(canonical.dtype)})
    form = data.draw(st.sampled_from(["list", "int64"]), label="form")
    _tree_same(call(fname, **{arg: v.tolist() if form == "list" else v}), want)


@SETTINGS
@given(st.sampled_from([c for c in INT_ARRAYS if c[0] != "wgs_image"]), st.data())
def test_array_arguments_out_of_range_in_every_form(case, data):
    fname, arg, lo, hi = case
    canonical = FUNCS[fname][1][arg]
    big = data.draw(
        st.one_of(st.integers(hi + 1, 2**40), st.integers(-(2**40), lo - 1))
        if lo > -(2**31)
        else st.integers(hi + 1, 2**40),
        label="value",
    )
    v = _with(canonical, data.draw(st.integers(0, np.size(canonical) - 1)), big, np.int64)
    form = data.draw(st.sampled_from(["list", "np.int64", "int32"]), label="form")
    if form == "int32" and not -(2**31) <= big < 2**31:
        form = "np.int64"
    bad = v.tolist() if form == "list" else v if form == "np.int64" else v.astype(np.int32)
    expect_error(lambda: call(fname, **{arg: bad}), arg, R)


@pytest.mark.parametrize(
    "fname,arg,value",
    [
        ("cvt_unit", "shift", np.int64(1)),
        ("cvt_unit", "offset", 1),
        ("sdp_x1", "bias_shift", np.int64(1)),
        ("sdp_add_int8", "x_mul", np.int64(3)),
        ("pdp_recip_kernel", "k", np.int64(3)),
        ("sign_extend", "bits", np.int64(8)),
        ("cdp_sqsum", "normalz_len", np.int64(1)),
        ("conv2d_int8", "pad_value", np.int64(0)),
        ("image_post_extension_factor", "kernel_width", np.int64(2)),
    ],
)
def test_numpy_int64_scalars_give_the_canonical_result(fname, arg, value):
    _tree_same(call(fname, **{arg: value}), call(fname))


@pytest.mark.parametrize(
    "fname,args",
    [
        ("sdp_lut", ("x",)),
        ("cdp_sqsum", ("v",)),
        ("int_to_fp16", ("x",)),
        ("sdp_x", ("v", "alu_op", "mul_op")),
        ("sdp_x1", ("acc", "bias16", "mul16")),
        ("conv2d_int8", ("x", "kernel_ohwi", "bias16")),
        ("sdp_add_int8", ("x", "y")),
        ("pdp_avgpool_int8", ("x",)),
        ("fp16_to_int16", ("x",)),
    ],
)
def test_traced_values_are_not_checked(fname, args):
    fn, kw = FUNCS[fname]
    rest = {k: v for k, v in kw.items() if k not in args}
    got = jax.jit(lambda a: fn(**rest, **a))({k: kw[k] for k in args})
    _tree_same(got, call(fname))


def test_every_function_runs_inside_a_jit_trace():
    check_traceable([n for n in FUNCS if n not in CANONICAL_SKIP], call)
