"""Bad inputs to the public functions of hwjax.xs3 (issue 16, the companion of
tests/test_bad_input.py and tests/test_bad_input_kernels.py).

One table of ``(function, argument, bad keyword arguments, error classes)``: every call
must raise an :class:`hwjax.errors.HwjaxError` of those classes whose message names the
argument (never an error raised from inside JAX or NumPy, never a silent result).
Hypothesis adds wrong types and out-of-range integers in every form (list, NumPy int64,
int32 array) on the array arguments; valid inputs in another form give the canonical
result, and traced values pass the checks under ``jit``.

Shapes are fixed and small, so each function compiles a handful of programs at most.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax import xs3
from hwjax.errors import RangeError, ShapeError

from tests.test_bad_input import (
    SETTINGS,
    check_covers_public,
    check_one_program,
    check_traceable,
    WRONG_TYPES,
    expect_error,
    expect_table_error,
    same,
    table_caller,
    table_params,
    with_value,
)

R, S, A = (RangeError,), (ShapeError,), (TypeError,)  # the error classes a case accepts
NAN, INF = float("nan"), float("inf")
I32 = np.int32
SMALL = settings(SETTINGS, max_examples=12)

# ------------------------------------------------------------------ canonical arguments
V8 = np.array([3, -7, 100, -128], I32)  # int8 lanes
V8R = V8[::-1].copy()
V16 = np.array([300, -7000, 32767, -32768], I32)  # int16 lanes
V32 = np.array([5, -9, 2**30, -(2**31)], I32)
RING = np.arange(-8, 8, dtype=I32) * 1000  # a 16-accumulator ring
L32 = np.arange(-16, 16, dtype=I32)  # 32 int8 lanes
WORDS = np.array([1, -2, 3, -(2**31), 2**31 - 1, 0, 7, -9], I32)
WORDS_R = WORDS[::-1].copy()
MUL = np.array([16384, -8000, 12000, 300], I32)
BIAS = np.array([5, -100, 0, 2000], I32)
SH4 = np.array([1, 2, 3, 4], I32)
ACC = np.array([[1000, -20000, 300000, -7], [0, 1, -1, 2**20]], I32)  # (2, C=4)
ACC16 = np.arange(-8, 8, dtype=I32).reshape(1, 16) * 100
THR16 = np.arange(16, dtype=I32)
BSO = np.asarray(xs3.make_bso(*[np.zeros(4, I32)] * 6))
XI = np.arange(-24, 24, dtype=I32).reshape(3, 4, 4)  # (H, W, C) int8 values
K4 = np.ones((4, 2, 2, 4), I32)  # OHWI
KDW = np.ones((2, 2, 4), I32)
W44 = np.ones((4, 4), I32)
X32 = np.arange(-16, 16, dtype=I32)
W432 = np.ones((4, 32), I32)
KQ = np.array([[1, 2, 3], [-4, 5, -6]], I32)
BQ = np.array([100, -50], I32)
KOHWI = np.arange(-12, 12, dtype=I32).reshape(2, 2, 2, 3)
REORD = np.asarray(xs3.reorder_kernel_weights(KOHWI))
MEM = np.asarray(xs3.serialise_output_transform(MUL, BIAS))
LUT = np.arange(256, dtype=np.uint8)[::-1].copy()
GEO = dict(zero_point=0, window_start=(0, 0), window_stride=(1, 1), out_shape=(2, 3))
SCALES = dict(s_in=0.5, z_in=1, s_w=0.01, s_out=0.2, z_out=-3)
IM2COL = dict(stride=(1, 1), pad_top_left=(0, 0), pad_value=0, out_hw=(2, 3))
DERIVE = dict(input_scale=0.5, input_zero_point=1, weight_scales=[0.01, 0.02], output_scale=0.2, output_zero_point=-3)
CONV = dict(initial_shift=2, final_shr=3, stride=(1, 1), pad_top_left=(0, 0), pad_value=0, out_shape=(2, 3))
ADDE = dict(shr0=1, multiplier0=300, shr1=2, multiplier1=-200, bias=1000, output_shr=4)

# a canonical per-channel transform (xs3.md §4.5): multipliers, offsets, accumulator ranges
TM, TB, TLO, THI = np.float64([0.01, -0.02]), np.float64([3.0, -1.5]), np.int64([-5000, -300]), np.int64([6000, 900])

FUNCS = {  # name -> (function, canonical keyword arguments)
    # ---- VPU
    "acc40_from_registers": (xs3.acc40_from_registers, dict(vd=WORDS, vr=WORDS_R)),
    "as_acc40": (xs3.as_acc40, dict(acc=V32)),
    "vdepth1": (xs3.vdepth1, dict(x=RING, mode=16)),
    "vdepth8": (xs3.vdepth8, dict(x=V16, mode=16)),
    "vdepth16": (xs3.vdepth16, dict(x=V32)),
    "vlashr": (xs3.vlashr, dict(x=V16, shr=I32(3), mode=16)),
    "vlmacc": (xs3.vlmacc, dict(acc=V32, vc=V8, mem=V8R, mode=8)),
    "vlmaccr": (xs3.vlmaccr, dict(acc=RING, vc=L32, mem=L32[::-1].copy(), mode=8)),
    "vlmaccr1": (xs3.vlmaccr1, dict(acc=RING, vc_words=WORDS, mem_words=WORDS_R)),
    "vlsub": (xs3.vlsub, dict(vr=V8, mem=V8R, mode=8)),
    "vpos": (xs3.vpos, dict(x=V8, mode=8)),
    "vladd": (xs3.vladd, dict(vr=V8, mem=V8R, mode=8)),
    "vlmul": (xs3.vlmul, dict(x=V8, m=V8R, mode=8)),
    "vlsat": (xs3.vlsat, dict(acc=V32, shift=SH4, mode=16)),
    # ---- output transforms
    "otfn_int8": (xs3.otfn_int8, dict(acc=ACC, multipliers=MUL, biases=BIAS, initial_shift=2, final_shr=3)),
    "otfn_int8_steps": (xs3.otfn_int8_steps, dict(acc=ACC, multipliers=MUL, biases=BIAS, initial_shift=2, final_shr=3)),
    "otfn_int8_channelwise": (
        xs3.otfn_int8_channelwise,
        dict(acc=ACC, shifts=SH4, multipliers=MUL, biases=BIAS, final_shr=3),
    ),
    "otfn_int8_clamped": (
        xs3.otfn_int8_clamped,
        dict(acc=ACC, offsets=SH4, multipliers=MUL, biases=BIAS, initial_shift=2, final_shr=3),
    ),
    "otfn_binary": (xs3.otfn_binary, dict(acc=ACC16, thresholds=THR16)),
    "serialise_output_transform": (xs3.serialise_output_transform, dict(multipliers=MUL, biases=BIAS)),
    "deserialise_output_transform": (xs3.deserialise_output_transform, dict(memory=MEM, channels=4)),
    "otfn_params_from_scales": (xs3.otfn_params_from_scales, dict(bias_q=BQ, weights=KQ, **SCALES)),
    "canonical_transform": (xs3.canonical_transform, dict(bias_q=BQ, weights=KQ, **SCALES)),
    "otfn_params": (xs3.otfn_params, dict(kernel_q=KQ, bias_q=BQ, **{**SCALES, "s_w": np.float32([0.01, 0.02])})),
    "otfn_params_many": (xs3.otfn_params_many, dict(layers=[(KQ, BQ, 0.5, 1, np.float32([0.01, 0.02]), 0.2, -3)])),
    "narrow_accu_range": (xs3.narrow_accu_range, dict(m=TM, beta=TB, amin=TLO, amax=THI)),
    "solve_exponents": (xs3.solve_exponents, dict(m=TM, beta=TB, amin=TLO, amax=THI)),
    # ---- lib_nn current kernels and helpers
    "conv2d": (xs3.conv2d, dict(x=XI, k_ohwi=K4[:2], multipliers=MUL[:2], biases=BIAS[:2], **CONV)),
    "depthwise_conv2d": (xs3.depthwise_conv2d, dict(x=XI, k_hwc=KDW, multipliers=MUL, biases=BIAS, **CONV)),
    "im2col": (xs3.im2col, dict(x=XI, kernel_hw=(2, 2), **IM2COL)),
    "reorder_kernel_weights": (xs3.reorder_kernel_weights, dict(k_ohwi=KOHWI)),
    "reorder_kernel_weights_inverse": (
        xs3.reorder_kernel_weights_inverse,
        dict(reordered=REORD, kernel_shape=(2, 2, 2, 3)),
    ),
    "add_int8": (xs3.add_int8, dict(x0=V8, x1=V8R, multiplier0=300, multiplier1=-200, bias=1000, shift=4)),
    "add_elementwise_int8": (
        xs3.add_elementwise_int8,
        dict(x0=V8, x1=V8R, multiplier0=300, multiplier1=-200, bias=1000, shift=4, variant="host"),
    ),
    "add_per_example": (
        xs3.add_per_example,
        dict(x0=V8.reshape(2, 2), x1=V8R.reshape(2, 2), multiplier0=300, multiplier1=-200, bias=1000, shift=4),
    ),
    # ---- BSO
    "make_bso": (
        xs3.make_bso,
        dict(
            bias=np.array([1, -2, 3, 2**31 - 1], I32), shift1=SH4, scale=MUL, offset_scale=BIAS, offset=BIAS, shift2=SH4
        ),
    ),
    "split_bso": (xs3.split_bso, dict(bso=BSO, c_out=4)),
    "derive_bso_fields": (xs3.derive_bso_fields, dict(bias_q=BQ, weights=KQ, **DERIVE)),
    # ---- legacy kernels
    "conv2d_deep": (xs3.conv2d_deep, dict(x=XI, k=K4, bso=BSO, **GEO)),
    "conv2d_shallowin": (xs3.conv2d_shallowin, dict(x=XI, k=K4, bso=BSO, **GEO)),
    "conv2d_1x1": (xs3.conv2d_1x1, dict(x=XI, k=W44, bso=BSO)),
    "conv2d_depthwise": (xs3.conv2d_depthwise, dict(x=XI, k=KDW, bso=BSO, **GEO)),
    "fully_connected_8": (xs3.fully_connected_8, dict(x=V8, w=W44, bso=BSO)),
    "fully_connected_16": (xs3.fully_connected_16, dict(x=V8, w=W44, bso=BSO)),
    "fc_deepin_shallowout_8": (xs3.fc_deepin_shallowout_8, dict(x=X32, w=W432, bias=BIAS, shift=SH4, scale=MUL)),
    "fc_deepin_shallowout_16": (xs3.fc_deepin_shallowout_16, dict(x=X32, w=W432, bias=BIAS, shift=SH4, scale=MUL)),
    "avgpool2d_scale_shift": (xs3.avgpool2d_scale_shift, dict(window_pixels=9)),
    "maxpool2d": (xs3.maxpool2d, dict(x=XI, window_shape=(2, 2))),
    "avgpool2d": (xs3.avgpool2d, dict(x=XI, window_shape=(2, 2))),
    "avgpool2d_global": (xs3.avgpool2d_global, dict(x=XI, bias=1000, scale=37, shift=9)),
    "add_elementwise": (xs3.add_elementwise, dict(x0=V8, x1=V8R, **ADDE)),
    "requantize_16_to_8": (xs3.requantize_16_to_8, dict(x=V16)),
    "lookup8": (xs3.lookup8, dict(x=V8, lut=LUT)),
    "argmax_16": (xs3.argmax_16, dict(x=V16)),
    "certify_no_saturation": (xs3.certify_no_saturation, dict(k=W44, bias=BIAS, input_range=(-128, 127))),
}


call = table_caller(FUNCS)


_with = with_value


def _f(a, v=0.5):
    """``a`` as float32 with one non-integer (or non-finite) value."""
    b = np.array(a, np.float32)
    b.flat[0] = v
    return b


LANES = ("vlsub", "vlmacc", "vpos", "vdepth8", "vlashr")
OTFN = ("otfn_int8", "otfn_int8_steps", "otfn_int8_channelwise", "otfn_int8_clamped")
LEGACY_CONV = ("conv2d_deep", "conv2d_shallowin", "conv2d_depthwise")
LEGACY_BSO = (
    "conv2d_deep",
    "conv2d_shallowin",
    "conv2d_1x1",
    "conv2d_depthwise",
    "fully_connected_8",
    "fully_connected_16",
)
FC_DEEPIN = ("fc_deepin_shallowout_8", "fc_deepin_shallowout_16")
POOL = ("maxpool2d", "avgpool2d")

# (function, argument named in the error, bad keyword arguments, accepted error classes)
CASES = [
    # ---- VPU: modes, variants, lanes
    *[(f, "mode", dict(mode=m), R) for f in LANES for m in (7, "8", None, 8.0, True)],
    *[(f, "variant", dict(variant=v), R) for f in LANES + ("vdepth16", "vlmaccr1", "vdepth1") for v in ("fast", None)],
    ("vlsub", "vr", dict(vr=_with(V8, 0, 128)), R),
    ("vlsub", "mem", dict(mem=[1, 2, 300, 4]), R),
    ("vlsub", "vr", dict(vr=_f(V8, NAN)), R),
    ("vlsub", "mem", dict(mem=np.ones(5, I32)), S),
    ("vlsub", "vr", dict(vr="abc"), A),
    ("vlsub", "vr", dict(vr=_f(V8)), R),
    ("vlmacc", "acc", dict(acc=np.int64([2**40])), R),
    ("vlmacc", "vc", dict(vc=_with(V8, 1, -129)), R),
    ("vlmacc", "mem", dict(mem=None), A),
    ("vlmacc", "acc", dict(acc=(V32, V32, V32), mode=32), S),
    ("vlmacc", "variant", dict(mode=32, variant="host"), R),
    ("vlmacc", "mem", dict(mem=np.ones(3, I32)), S),
    ("vlmaccr", "acc", dict(acc=RING[:8]), S),
    ("vlmaccr", "vc", dict(vc=L32[:16]), S),
    ("vlmaccr", "mem", dict(mem=_with(L32, 3, 200)), R),
    ("vlmaccr", "acc", dict(acc="ring"), A),
    ("vlmaccr", "mode", dict(mode=4), R),
    ("vlmaccr1", "acc", dict(acc=RING[:8]), S),
    ("vlmaccr1", "vc_words", dict(vc_words=WORDS[:4]), S),
    ("vlmaccr1", "mem_words", dict(mem_words=_f(WORDS)), A),
    ("vlmaccr1", "acc", dict(acc=np.int64([2**33] * 16)), R),
    ("vlmaccr1", "vc_words", dict(vc_words=np.int64([2**32] * 8)), R),
    ("vpos", "x", dict(x=_with(V8, 0, 200)), R),
    ("vpos", "x", dict(x=_f(V8)), A),
    ("vpos", "x", dict(x=V8, mode=8, variant="host"), S),
    ("vpos", "variant", dict(mode=32, variant="host"), R),
    ("vdepth8", "mode", dict(mode=8), R),
    ("vdepth8", "x", dict(x=_with(V16, 0, 2**15)), R),
    ("vdepth16", "x", dict(x=np.int64([2**31])), R),
    ("vdepth16", "x", dict(x=_f(V32, INF)), R),
    ("vdepth16", "saturation_grad", dict(saturation_grad="none"), R),
    ("vdepth1", "x", dict(x=RING[:8]), S),
    ("vdepth1", "x", dict(x=_with(RING, 0, 2**15)), R),
    ("vdepth1", "mode", dict(mode=12), R),
    ("vdepth1", "x", dict(x=_f(RING)), A),
    ("vlashr", "shr", dict(shr=np.int64(2**40)), R),
    ("vlashr", "shr", dict(shr=np.ones(3, I32)), S),
    ("vlashr", "shr", dict(shr="3"), A),
    ("vlashr", "x", dict(x=_with(V16, 2, 2**15)), R),
    ("vlashr", "shr", dict(shr=np.float32(1.5)), A),
    ("as_acc40", "acc", dict(acc=np.int64([2**40])), R),
    ("as_acc40", "acc", dict(acc="abc"), A),
    ("as_acc40", "acc", dict(acc=(V32, V32, V32)), S),
    ("as_acc40", "acc.lo", dict(acc=(V32, _f(V32))), A),
    ("as_acc40", "acc.hi", dict(acc=(np.int64([2**35]), V32)), R),
    ("as_acc40", "acc", dict(acc=None), A),
    ("as_acc40", "acc", dict(acc=_f(V32)), A),
    ("acc40_from_registers", "vd", dict(vd=np.int64([2**35] * 8)), R),
    ("acc40_from_registers", "vr", dict(vr="abc"), A),
    ("acc40_from_registers", "vr", dict(vr=np.ones(3, I32)), S),
    ("acc40_from_registers", "vd", dict(vd=_f(WORDS)), A),
    # ---- output transforms
    *[
        (f, arg, {arg: v}, k)
        for f in OTFN
        for arg, v, k in (
            ("acc", np.int64([[2**40] * 4]), R),
            ("acc", "abc", A),
            ("acc", _f(ACC, NAN), R + A),
            ("multipliers", _with(MUL, 0, 2**15), R),
            ("multipliers", MUL[:3], S),
            ("biases", [1, 2, 3, "a"], A),
            ("biases", _with(BIAS, 0, -(2**15) - 1), R),
            ("final_shr", 40, R),
            ("final_shr", "3", A),
            ("final_shr", 1.5, A),
            ("variant", "fast", R),
        )
    ],
    *[
        (f, arg, {arg: v}, k)
        for f in ("otfn_int8", "otfn_int8_steps", "otfn_int8_clamped")
        for arg, v, k in (
            ("initial_shift", 17, R),
            ("initial_shift", None, A),
            ("initial_shift", np.int64(-(2**40)), R),
        )
    ],
    ("otfn_int8_channelwise", "shifts", dict(shifts=_with(SH4, 0, 2**16)), R),
    ("otfn_int8_channelwise", "shifts", dict(shifts=SH4[:2]), S),
    ("otfn_int8_clamped", "offsets", dict(offsets=_with(SH4, 0, 2**15)), R),
    ("otfn_int8_clamped", "offsets", dict(offsets=np.ones(5, I32)), S),
    *[
        (f, "return_stats", dict(return_stats="yes"), A)
        for f in ("otfn_int8", "otfn_int8_channelwise", "otfn_int8_clamped")
    ],
    ("otfn_binary", "acc", dict(acc=ACC16[:, :8]), S),
    ("otfn_binary", "thresholds", dict(thresholds=THR16[:8]), S),
    ("otfn_binary", "thresholds", dict(thresholds=_with(THR16, 0, 2**15)), R),
    ("otfn_binary", "acc", dict(acc=np.int64([[2**40] * 16])), R),
    ("otfn_binary", "acc", dict(acc=_f(ACC16)), A),
    ("otfn_binary", "variant", dict(variant="x"), R),
    ("serialise_output_transform", "multipliers", dict(multipliers=_with(MUL, 0, 2**15)), R),
    ("serialise_output_transform", "biases", dict(biases=BIAS[:3]), S),
    ("serialise_output_transform", "biases", dict(biases="abc"), A),
    ("serialise_output_transform", "leading", dict(leading=SH4[:2]), S),
    ("serialise_output_transform", "leading", dict(leading=_with(SH4, 0, 2**16)), R),
    ("serialise_output_transform", "pad_value", dict(pad_value=2**15), R),
    ("serialise_output_transform", "pad_value", dict(pad_value="0"), A),
    ("serialise_output_transform", "pad_final_access", dict(pad_final_access="yes"), A),
    ("serialise_output_transform", "multipliers", dict(multipliers=_f(MUL)), A),
    ("deserialise_output_transform", "channels", dict(channels=-1), R),
    ("deserialise_output_transform", "channels", dict(channels="4"), A),
    ("deserialise_output_transform", "channels", dict(channels=1000), S),
    ("deserialise_output_transform", "memory", dict(memory="abc"), A),
    ("deserialise_output_transform", "memory", dict(memory=_with(MEM, 0, 2**15, I32)), R),
    ("deserialise_output_transform", "with_leading", dict(with_leading="yes"), A),
    *[
        (f, arg, {arg: v}, k)
        for f in ("otfn_params_from_scales", "canonical_transform", "otfn_params")
        for arg, v, k in (
            ("s_in", NAN, R),
            ("s_in", 0.0, R),
            ("s_in", "0.5", A),
            ("s_out", -1.0, R),
            ("s_out", INF, R),
            ("s_w", [0.1, 0.2, 0.3], S),
            ("s_w", NAN, R),
            ("z_in", 300, R),
            ("z_out", "3", A),
            ("z_out", 1.5, R),
            ("bias_q", BQ[:1], S),
            ("bias_q", np.int64([2**40, 0]), R),
            ("bias_q", "abc", A),
        )
    ],
    ("otfn_params_from_scales", "weights", dict(weights=_with(KQ, 0, 200)), R),
    ("otfn_params_from_scales", "weights", dict(weights="abc"), A),
    ("otfn_params_from_scales", "multiplier_factor", dict(multiplier_factor=NAN), R),
    ("canonical_transform", "weights", dict(weights=_with(KQ, 0, 200)), R),
    ("canonical_transform", "multiplier_factor", dict(multiplier_factor=NAN), R),
    ("otfn_params", "kernel_q", dict(kernel_q=_with(KQ, 0, 200)), R),
    ("otfn_params", "kernel_q", dict(kernel_q="abc"), A),
    ("otfn_params", "kernel_q", dict(kernel_q=I32(3)), S),
    ("otfn_params_many", "layers", dict(layers="abc"), A),
    ("otfn_params_many", "layers", dict(layers=[(KQ, BQ)]), A),
    ("otfn_params_many", "s_in", dict(layers=[(KQ, BQ, NAN, 1, 0.01, 0.2, -3)]), R),
    *[
        (f, arg, {arg: v}, k)
        for f in ("narrow_accu_range", "solve_exponents")
        for arg, v, k in (
            ("m", "abc", A),
            ("m", np.float64([NAN, 0.0]), R),
            ("beta", np.float64([INF, 0.0]), R),
            ("amin", np.float64([0.5, 0.0]), R),
            ("amax", np.int64([1, 2, 3]), S),
            ("amin", np.int64([7000, 0]), R),
            ("amax", None, A),
        )
    ],
    ("solve_exponents", "max_steps", dict(max_steps=0), R),
    # ---- current kernels and helpers
    ("im2col", "x", dict(x=XI[0]), S),
    ("im2col", "x", dict(x="abc"), A),
    ("im2col", "x", dict(x=None), A),
    ("im2col", "kernel_hw", dict(kernel_hw=(0, 2)), R),
    ("im2col", "kernel_hw", dict(kernel_hw=2), A),
    ("im2col", "stride", dict(stride=(0, 1)), R),
    ("im2col", "stride", dict(stride=(1.5, 1)), A),
    ("im2col", "pad_value", dict(pad_value="0"), A),
    ("im2col", "pad_value", dict(pad_value=2**40), R),
    ("im2col", "out_hw", dict(out_hw=(-1, 3)), R),
    ("im2col", "dilation", dict(dilation=(0, 1)), R),
    ("im2col", "pad_top_left", dict(pad_top_left=None), A),
    ("reorder_kernel_weights", "k_ohwi", dict(k_ohwi=KOHWI[0]), S),
    ("reorder_kernel_weights", "k_ohwi", dict(k_ohwi=_with(KOHWI, 0, 200)), R),
    ("reorder_kernel_weights", "k_ohwi", dict(k_ohwi="abc"), A),
    ("reorder_kernel_weights", "pad_value", dict(pad_value=300), R),
    ("reorder_kernel_weights", "pad_value", dict(pad_value="0"), A),
    ("reorder_kernel_weights_inverse", "kernel_shape", dict(kernel_shape=(2, 2, 2)), S),
    ("reorder_kernel_weights_inverse", "kernel_shape", dict(kernel_shape=(2, 2, 2, 0)), R),
    ("reorder_kernel_weights_inverse", "kernel_shape", dict(kernel_shape=None), A),
    ("reorder_kernel_weights_inverse", "reordered", dict(reordered=_with(REORD, 0, 200, I32)), R),
    ("reorder_kernel_weights_inverse", "reordered", dict(reordered="abc"), A),
    ("add_int8", "x0", dict(x0=_with(V8, 0, 200)), R),
    ("add_int8", "x1", dict(x1=np.ones(5, I32)), S),
    ("add_int8", "x1", dict(x1="abc"), A),
    ("add_int8", "multiplier0", dict(multiplier0=40000), R),
    ("add_int8", "multiplier1", dict(multiplier1="3"), A),
    ("add_int8", "bias", dict(bias=2**40), R),
    ("add_int8", "shift", dict(shift=2**16), R),
    ("add_int8", "shift", dict(shift=None), A),
    ("add_int8", "variant", dict(variant="fast"), R),
    ("add_int8", "x0", dict(x0=_f(V8)), A),
    ("add_elementwise_int8", "x0", dict(x0=_with(V8, 0, 200)), R),
    ("add_elementwise_int8", "x1", dict(x1=np.ones(5, I32)), S),
    ("add_elementwise_int8", "multiplier0", dict(multiplier0=40000), R),
    ("add_elementwise_int8", "bias", dict(bias=2**40), R),
    ("add_elementwise_int8", "shift", dict(shift=2**16), R),
    ("add_elementwise_int8", "variant", dict(variant="fast"), R),
    ("add_per_example", "x0", dict(x0=_with(V8.reshape(2, 2), 0, 200)), R),
    ("add_per_example", "x1", dict(x1=np.ones((2, 3), I32)), S),
    ("add_per_example", "shift", dict(shift=2**16), R),
    ("add_per_example", "variant", dict(variant="fast"), R),
    # ---- BSO
    *[
        ("make_bso", arg, {arg: v}, k)
        for arg, v, k in (
            ("bias", np.int64([2**40, 0, 0, 0]), R),
            ("bias", "abc", A),
            ("shift1", _with(SH4, 0, 2**16), R),
            ("shift1", _with(SH4, 0, -1), R),
            ("scale", _with(MUL, 0, 2**15), R),
            ("offset_scale", BIAS[:3], S),
            ("offset", _f(BIAS), A),
            ("shift2", None, A),
            ("scale", np.ones((2, 2), I32), S),
        )
    ],
    ("split_bso", "c_out", dict(c_out=0), R),
    ("split_bso", "bso", dict(c_out=17), S),
    ("split_bso", "c_out", dict(c_out="4"), A),
    ("split_bso", "bso", dict(bso=BSO[0]), S),
    ("split_bso", "bso", dict(bso=_with(BSO, 0, 2**15, I32)), R),
    ("split_bso", "bso", dict(bso="abc"), A),
    *[
        ("derive_bso_fields", arg, {arg: v}, k)
        for arg, v, k in (
            ("input_scale", NAN, R),
            ("input_scale", 0.0, R),
            ("input_scale", "0.5", A),
            ("output_scale", -1.0, R),
            ("output_scale", INF, R),
            ("weight_scales", [0.1, 0.2, 0.3], S),
            ("weight_scales", [NAN, 0.1], R),
            ("input_zero_point", 300, R),
            ("output_zero_point", "3", A),
            ("output_zero_point", 1.5, R),
            ("bias_q", BQ[:1], S),
            ("bias_q", np.int64([2**40, 0]), R),
            ("bias_q", "abc", A),
            ("weights", _with(KQ, 0, 200), R),
            ("weights", "abc", A),
            ("channel_axis", 5, R),
            ("channel_axis", "0", A),
        )
    ],
    # ---- legacy kernels
    *[
        (f, arg, {arg: v}, k)
        for f in LEGACY_BSO
        for arg, v, k in (
            ("x", _with(FUNCS[f][1]["x"], 0, 200), R),
            ("x", "abc", A),
            ("x", None, A),
            ("bso", BSO[..., :5], S),
            ("bso", _with(BSO, 0, 2**15, I32), R),
            ("bso", "abc", A),
            ("symmetric", "yes", A),
            ("variant", "fast", R),
            ("return_stats", None, A),
            ("saturation_grad", "none", R),
        )
        if (f, arg) != ("fully_connected_16", "symmetric")
    ],
    *[
        (f, arg, {arg: v}, k)
        for f in LEGACY_CONV
        for arg, v, k in (
            ("k", _with(FUNCS[f][1]["k"], 0, 200), R),
            ("k", FUNCS[f][1]["k"][..., :3], S),
            ("zero_point", 300, R),
            ("zero_point", "0", A),
            ("window_start", None, A),
            ("window_start", (0,), A),
            ("window_stride", (0, 1), R),
            ("window_stride", (1.5, 1), A),
            ("out_shape", (0, 3), R),
            ("out_shape", "ab", A),
        )
    ],
    ("conv2d_1x1", "k", dict(k=_with(W44, 0, 200)), R),
    ("conv2d_1x1", "k", dict(k=np.ones((4, 3), I32)), S),
    ("conv2d_1x1", "x", dict(x=V8), S),
    *[
        (f, arg, {arg: v}, k)
        for f in ("fully_connected_8", "fully_connected_16")
        for arg, v, k in (("w", _with(W44, 0, 200), R), ("w", np.ones((4, 3), I32), S), ("w", "abc", A))
    ],
    *[
        (f, arg, {arg: v}, k)
        for f in FC_DEEPIN
        for arg, v, k in (
            ("x", _with(X32, 0, 200), R),
            ("x", "abc", A),
            ("w", _with(W432, 0, 200), R),
            ("w", W432[:, :16], S),
            ("bias", np.int64([2**40] * 4), R),
            ("bias", BIAS[:3], S),
            ("shift", _with(SH4, 0, 2**16), R),
            ("shift", None, A),
            ("scale", _with(MUL, 0, 2**15), R),
            ("scale", _f(MUL), A),
            ("variant", "fast", R),
            ("return_stats", "yes", A),
        )
    ],
    ("avgpool2d_scale_shift", "window_pixels", dict(window_pixels=0), R),
    ("avgpool2d_scale_shift", "window_pixels", dict(window_pixels=2**30), R),
    ("avgpool2d_scale_shift", "window_pixels", dict(window_pixels=9.0), A),
    ("avgpool2d_scale_shift", "window_pixels", dict(window_pixels="9"), A),
    *[
        (f, arg, {arg: v}, k)
        for f in POOL
        for arg, v, k in (
            ("x", _with(XI, 0, 200), R),
            ("x", "abc", A),
            ("x", XI[0], S),
            ("window_shape", (0, 2), R),
            ("window_shape", None, A),
            ("window_shape", (5, 2), S),
            ("window_start", (-1, 0), R),
            ("window_start", "ab", A),
            ("window_stride", (0, 1), R),
            ("out_shape", (4, 4), S),
            ("variant", "fast", R),
            ("return_stats", "yes", A),
        )
    ],
    ("avgpool2d", "symmetric", dict(symmetric=None), A),
    *[
        ("avgpool2d_global", arg, {arg: v}, k)
        for arg, v, k in (
            ("x", _with(XI, 0, 200), R),
            ("x", "abc", A),
            ("x", XI[0], S),
            ("bias", 2**40, R),
            ("bias", "a", A),
            ("bias", np.ones(3, I32), S),
            ("scale", 200, R),
            ("scale", 1.5, A),
            ("shift", -1, R),
            ("shift", 2**20, R),
            ("shift", "9", A),
            ("symmetric", "yes", A),
            ("variant", "fast", R),
        )
    ],
    *[
        ("add_elementwise", arg, {arg: v}, k)
        for arg, v, k in (
            ("x0", _with(V8, 0, 200), R),
            ("x1", np.ones(5, I32), S),
            ("x1", "abc", A),
            ("shr0", 2**40, R),
            ("shr0", "1", A),
            ("shr1", 1.5, A),
            ("multiplier0", 2**15, R),
            ("multiplier1", None, A),
            ("bias", 2**40, R),
            ("bias", "a", A),
            ("output_shr", -1, R),
            ("output_shr", "4", A),
            ("symmetric", "yes", A),
            ("variant", "fast", R),
            ("return_stats", 1, A),
        )
    ],
    ("requantize_16_to_8", "x", dict(x=_with(V16, 0, 2**15)), R),
    ("requantize_16_to_8", "x", dict(x="abc"), A),
    ("requantize_16_to_8", "x", dict(x=_f(V16)), A),
    ("requantize_16_to_8", "symmetric", dict(symmetric="y"), A),
    ("requantize_16_to_8", "variant", dict(variant="fast"), R),
    ("lookup8", "x", dict(x=_with(V8, 0, 300)), R),
    ("lookup8", "x", dict(x="abc"), A),
    ("lookup8", "lut", dict(lut=LUT[:255]), S),
    ("lookup8", "lut", dict(lut=_with(LUT, 0, 256, np.int32)), R),
    ("lookup8", "lut", dict(lut="abc"), A),
    ("lookup8", "x", dict(x=_f(V8)), A),
    ("lookup8", "variant", dict(variant="fast"), R),
    ("argmax_16", "x", dict(x=_with(V16, 0, 2**15)), R),
    ("argmax_16", "x", dict(x=np.zeros(0, I32)), S),
    ("argmax_16", "x", dict(x="abc"), A),
    ("argmax_16", "x", dict(x=I32(3)), S),
    ("argmax_16", "x", dict(x=_f(V16)), A),
    ("argmax_16", "variant", dict(variant="fast"), R),
    *[
        (f, arg, {arg: v}, k)
        for f in ("vladd", "vlmul", "vlsat")
        for arg, v, k in (("mode", 4, R), ("variant", "fast", R), ("saturation_grad", "none", R))
    ],
    ("vladd", "vr", dict(vr=_with(V8, 0, 200)), R),
    ("vladd", "mem", dict(mem=np.ones(5, I32)), S),
    ("vlmul", "x", dict(x="abc"), A),
    ("vlmul", "m", dict(m=_with(V8, 1, -129)), R),
    ("vlsat", "acc", dict(acc=np.int64([2**40] * 4)), R),
    ("vlsat", "shift", dict(shift=np.ones(5, I32)), S),
    *[
        (f, arg, {arg: v}, k)
        for f, kern in (("conv2d", "k_ohwi"), ("depthwise_conv2d", "k_hwc"))
        for arg, v, k in (
            ("x", _with(XI, 0, 200), R),
            ("x", "abc", A),
            ("x", XI[0], S),
            (kern, np.ones((2, 2, 2, 4, 1), I32), S),
            ("multipliers", _with(MUL, 0, 2**15), R),
            ("biases", [1, 2, 3, "a"], A),
            ("initial_shift", 17, R),
            ("final_shr", 40, R),
            ("stride", (0, 1), R),
            ("pad_top_left", (-1, 0), R),
            ("pad_value", 200, R),
            ("variant", "fast", R),
        )
    ],
    *[
        ("certify_no_saturation", arg, {arg: v}, k)
        for arg, v, k in (
            ("k", _with(W44, 0, 200), R),
            ("k", "abc", A),
            ("k", I32(1), S),
            ("bias", BIAS[:3], S),
            ("bias", np.int64([2**40] * 4), R),
            ("bias", "abc", A),
            ("input_range", (5, -5), R),
            ("input_range", (0, 2**20), R),
            ("input_range", None, A),
            ("input_range", (0,), A),
            ("input_range", (0.5, 1), A),
            ("channel_axis", 3, R),
            ("channel_axis", "0", A),
        )
    ],
]


@pytest.mark.parametrize("case", table_params(CASES))
def test_bad_arguments_raise_named_hwjax_errors(case):
    expect_table_error(call, case)


# Public functions that still compile more than one program when called eagerly on a
# new shape (see tests/test_bad_input.py:check_one_program).
MULTI_PROGRAM: dict[str, str] = {}


def test_every_function_is_covered_and_runs_as_one_program_on_canonical_arguments():
    public = {n for n in dir(xs3) if not n.startswith("_") and callable(getattr(xs3, n))}
    for name, (fn, _) in FUNCS.items():
        assert fn.__name__ in public, name
    check_covers_public(FUNCS, xs3)
    check_one_program(FUNCS, call, MULTI_PROGRAM)  # runs every one of them
    covered = {f for f, *_ in CASES}
    assert covered == set(FUNCS), set(FUNCS) - covered


# -------------------------------------------------------------- hypothesis: every form

# (function, array argument, lo, hi of its values)
INT_ARRAYS = [
    ("vlsub", "vr", -128, 127),
    ("vlmacc", "acc", -(2**31), 2**31 - 1),
    ("vdepth16", "x", -(2**31), 2**31 - 1),
    ("vlmaccr1", "acc", -(2**31), 2**31 - 1),
    ("otfn_int8", "multipliers", -(2**15), 2**15 - 1),
    ("otfn_int8_channelwise", "shifts", -(2**15), 2**16 - 1),
    ("otfn_binary", "thresholds", -(2**15), 2**15 - 1),
    ("add_int8", "x1", -128, 127),
    ("make_bso", "scale", -(2**15), 2**15 - 1),
    ("conv2d_1x1", "x", -128, 127),
    ("fully_connected_8", "w", -128, 127),
    ("fc_deepin_shallowout_8", "x", -128, 127),
    ("maxpool2d", "x", -128, 127),
    ("add_elementwise", "x0", -128, 127),
    ("requantize_16_to_8", "x", -(2**15), 2**15 - 1),
    ("lookup8", "lut", 0, 255),
    ("argmax_16", "x", -(2**15), 2**15 - 1),
    ("certify_no_saturation", "bias", -(2**31), 2**31 - 1),
]


@SMALL
@given(st.sampled_from(INT_ARRAYS), WRONG_TYPES)
def test_array_arguments_reject_wrong_types(case, bad):
    fname, arg, _, _ = case
    if isinstance(bad, np.ndarray) and bad.dtype == np.uint32:
        bad = np.resize(bad, np.shape(FUNCS[fname][1][arg])).astype(np.uint32)
        if fname in ("vlmaccr1",):
            return  # uint32 words are valid bit patterns there
    expect_error(lambda: call(fname, **{arg: bad}), arg, (TypeError, ValueError))


@SMALL
@given(st.sampled_from(INT_ARRAYS), st.data())
def test_array_arguments_out_of_range_in_every_form(case, data):
    fname, arg, lo, hi = case
    canonical = FUNCS[fname][1][arg]
    big = data.draw(st.one_of(st.integers(hi + 1, 2**40), st.integers(-(2**40), lo - 1)), label="value")
    form = data.draw(st.sampled_from(["list", "np.int64", "int32"]), label="form")
    v = _with(canonical, data.draw(st.integers(0, np.size(canonical) - 1)), big, np.int64)
    if form == "list":
        bad = v.tolist()
    elif form == "np.int64":
        bad = v
    elif -(2**31) <= big < 2**31:
        bad = v.astype(np.int32)
    else:
        return
    expect_error(lambda: call(fname, **{arg: bad}), arg, (RangeError,))


def _same_tree(got, want):
    jax.tree_util.tree_map(same, got, want)


@SMALL
@given(st.sampled_from(INT_ARRAYS), st.data())
def test_valid_arrays_in_other_forms_give_the_canonical_result(case, data):
    fname, arg, lo, hi = case
    canonical = np.asarray(FUNCS[fname][1][arg])
    v = np.asarray(
        data.draw(
            st.lists(
                st.integers(max(lo, -(2**31)), min(hi, 2**31 - 1)), min_size=canonical.size, max_size=canonical.size
            )
        ),
        np.int64,
    ).reshape(canonical.shape)
    want = call(fname, **{arg: v.astype(canonical.dtype)})
    got = call(fname, **{arg: v.tolist() if data.draw(st.booleans(), label="list") else v})
    _same_tree(got, want)


@pytest.mark.parametrize(
    "fname,override",
    [
        ("add_int8", dict(multiplier0=np.int64(300), bias=np.int64(1000), shift=np.int64(4))),
        ("otfn_int8", dict(initial_shift=np.int64(2), final_shr=np.int64(3))),
        ("avgpool2d_global", dict(bias=np.int64(1000), scale=np.int64(37), shift=np.int64(9))),
        (
            "add_elementwise",
            dict(shr0=np.int64(1), multiplier0=np.int64(300), bias=np.int64(1000), output_shr=np.int64(4)),
        ),
        ("avgpool2d_scale_shift", dict(window_pixels=np.int64(9))),
        ("deserialise_output_transform", dict(channels=np.int64(4))),
        ("split_bso", dict(c_out=np.int64(4))),
        ("vlashr", dict(shr=3)),
        ("make_bso", dict(shift1=[1, 2, 3, 4])),
        ("certify_no_saturation", dict(k=W44.tolist(), input_range=[np.int64(-128), 127])),
        ("im2col", dict(x=XI.tolist(), kernel_hw=[2, 2], stride=[np.int64(1), 1])),
    ],
)
def test_valid_scalars_and_lists_give_the_canonical_result(fname, override):
    _same_tree(call(fname, **override), call(fname))


# -------------------------------------------- traced values pass the checks (jit)


@pytest.mark.parametrize(
    "fname,args",
    [
        ("vlsub", ("vr", "mem")),
        ("vlmaccr1", ("acc", "vc_words")),
        ("otfn_int8", ("acc", "multipliers", "biases")),
        ("otfn_binary", ("acc", "thresholds")),
        ("add_int8", ("x0", "x1")),
        ("fully_connected_8", ("x", "w", "bso")),
        ("lookup8", ("x", "lut")),
        ("argmax_16", ("x",)),
        ("make_bso", ("bias", "scale")),
        ("otfn_params", ("kernel_q", "bias_q")),
        ("add_elementwise", ("x0", "x1")),
    ],
)
def test_traced_values_are_not_checked(fname, args):
    fn, kw = FUNCS[fname]
    rest = {k: v for k, v in kw.items() if k not in args}
    got = jax.jit(lambda a: fn(**rest, **a))({a: kw[a] for a in args})
    _same_tree(got, call(fname))


def test_every_function_runs_inside_a_jit_trace():
    check_traceable(FUNCS, call)
