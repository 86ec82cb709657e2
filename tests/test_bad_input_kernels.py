"""Bad inputs to the public functions of hwjax.gemmlowp and hwjax.litert's kernels and recipes
(issue 16, the companion of tests/test_bad_input.py).

One table of ``(function, argument, bad value, error classes)``: every call must raise an
:class:`hwjax.errors.HwjaxError` of those classes whose message names the argument (never
an error raised from inside JAX or NumPy, never a silent result). Hypothesis adds wrong
types and out-of-range integers in every form (Python int, NumPy int64, list, int32
array) on the array arguments; valid inputs in another form give the canonical result,
and the kernels still trace under ``jit`` and ``vmap`` (traced values are not checked).

Shapes are fixed and small, so each function compiles a handful of programs at most.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hwjax import gemmlowp as G
from hwjax import litert as T
from hwjax.errors import ArgTypeError, HwjaxError, RangeError, ShapeError

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

# ------------------------------------------------------------------ canonical arguments
U8L = np.array([[0, 17, 255], [200, 3, 128]], np.uint8)  # (2, 3)
U8R = np.array([[1, 2, 3, 4], [250, 0, 9, 17], [30, 60, 90, 120]], np.uint8)  # (3, 4)
V32 = np.array([5, -9, 2**30, -(2**31)], np.int32)
X8 = np.array([[3, -7, 100, 0], [1, -128, 127, 5]], np.int32)  # (batch 2, 4), int8 values
X8B = np.array([[-1, 2, -3, 4], [127, 0, -128, 9]], np.int32)
XI = np.arange(-10, 22, dtype=np.int32).reshape(1, 4, 4, 2)  # NHWC, int8 values
XM = np.arange(-6, 6, dtype=np.int32).reshape(2, 2, 3)  # (batch, 2, 3)
FC_Q = dict(
    input_scale=0.5, input_zero_point=1, filter_scales=[0.1], output_scale=0.7, output_zero_point=-3, requant="double"
)
GEOM = T.conv_geometry((4, 4), (2, 2), 1, "VALID")
POOL = T.conv_geometry((4, 4), (2, 2), 2, "VALID")
RQ4 = T.requant_params(0.5, [0.1], 0.7, "double", channels=4)
RQ3 = T.requant_params(0.5, [0.1], 0.7, "double", channels=3)
RQ2 = T.requant_params(0.5, [0.1, 0.2], 0.7, "double")
ADDP = T.add_params(0.5, 0.25, 0.7)
STP = T.sigmoid_tanh_params(0.05)
SMP = T.softmax_reference_params(0.1, 1.0)
EXP_TABLE = T.softmax_exp_table(0.1, 1.0)
LUT = T.litert_lut_table("sigmoid", 0.1, 0, 1 / 256, -128)
I32 = np.int32
MULP = dict(
    multiplier=I32(2**30), shift=I32(-5), z1=I32(1), z2=I32(-2), zout=I32(3), act_min=I32(-128), act_max=I32(127)
)
MEANP = dict(multiplier=I32(2**30), shift=I32(-1), zin=I32(1), zout=I32(-2))
ADD_REC = {**T.add_recipe("xnnpack", None, 0.5, 1, 0.25, -2, 0.7, 3), "z1": I32(1), "z2": I32(-2), "zout": I32(3)}
RQ_REC = {**T.requant_recipe("xnnpack", 0.5, 0.7), "zin": I32(1), "zout": I32(-3)}


def _stages(shift=4):
    return (G.QuantizeDownInt32ToUint8Scale(10, 3, shift), G.SaturatingCastToUint8())


FUNCS = {  # name -> (function, canonical keyword arguments)
    # gemmlowp
    "addmod_offsets": (G.addmod_offsets, dict(n=5)),
    "xorshift_offsets": (G.xorshift_offsets, dict(n=5)),
    "nearest_offsets": (G.nearest_offsets, dict(n=5)),
    "rounding_offsets": (G.rounding_offsets, dict(mode="addmod", n=5)),
    "rounding_mode": (G.rounding_mode, dict(depth=10, rounding="auto")),
    "is_requantization_worth_it": (G.is_requantization_worth_it, dict(rows=3, cols=4)),
    "block_params": (G.block_params, dict(rows=3, depth=5, cols=4)),
    "uint16_lane_capacity": (G.uint16_lane_capacity, dict(lhs_bits=7, rhs_bits=5)),
    "check_uint16_accumulators": (G.check_uint16_accumulators, dict(lhs_bits=7, rhs_bits=5, products_per_lane=16)),
    "rmcf_constants": (G.rmcf_constants, dict(numerator=255, denominator=127)),
    "rounding_multiply_by_constant_fraction": (
        G.rounding_multiply_by_constant_fraction,
        dict(x=V32, numerator=255, denominator=127),
    ),
    "gemm": (G.gemm, dict(lhs=U8L, rhs=U8R, lhs_offset=-3, rhs_offset=5)),
    "srdhm": (G.srdhm, dict(a=V32, b=V32[::-1].copy())),
    "rounding_divide_by_pot": (G.rounding_divide_by_pot, dict(x=V32, exponent=I32(3))),
    "shift_left": (G.shift_left, dict(x=np.array([5, -9, 2**20, -(2**20)], I32), exponent=3)),
    "srdhm_int16": (G.srdhm_int16, dict(a=np.array([5, -300], I32), b=np.array([20000, -32768], I32))),
    "gemmlowp.requantize": (G.requantize, dict(x=U8L, bits=5, mode="nearest")),
    "pack_lt8": (G.pack_lt8, dict(lhs=U8L, rhs=U8R, lhs_bits=7, rhs_bits=5)),
    "gemm_lt8": (G.gemm_lt8, dict(lhs=U8L, rhs=U8R, lhs_offset=-3, rhs_offset=5, lhs_bits=7, rhs_bits=5)),
    "eight_bit_int_gemm": (
        G.eight_bit_int_gemm,
        dict(a=U8L, b=U8R, a_offset=-3, b_offset=5, c_offset=10, c_mult_int=3, c_shift=4),
    ),
    "apply_output_stages": (
        G.apply_output_stages,
        dict(acc=np.arange(6, dtype=I32).reshape(2, 3) * 1000, output_stages=_stages()),
    ),
    # tflite: arithmetic and the public kernels
    "activation_range": (T.activation_range, dict(activation="relu6", output_scale=0.05, output_zero_point=-10)),
    "quantize_multiplier": (T.quantize_multiplier, dict(real=0.3)),
    "requant_params": (
        T.requant_params,
        dict(input_scale=0.5, filter_scales=[0.1, 0.2], output_scale=0.7, requant="double"),
    ),
    "tflite.requantize": (
        T.requantize,
        dict(
            acc=np.array([100, -5000, 2**20], I32),
            params=T.requant_params(0.5, [0.1], 0.7, "double"),
            requant="double",
            output_zero_point=-3,
            act_min=-128,
            act_max=127,
        ),
    ),
    "multiply_by_quantized_multiplier": (T.multiply_by_quantized_multiplier, dict(x=V32, multiplier=2**30, shift=-3)),
    "mbqm_double": (T.mbqm_double, dict(x=V32, m=I32(2**30), s=I32(-3))),
    "fully_connected": (T.fully_connected, dict(x=X8[:, :3], w=np.ones((4, 3), I32), b=None, **FC_Q)),
    "conv2d": (T.conv2d, dict(x=XI, w=np.ones((3, 2, 2, 2), I32), b=None, **FC_Q)),
    "depthwise_conv2d": (
        T.depthwise_conv2d,
        dict(x=XI, w=np.ones((2, 2, 2), I32), b=None, **{**FC_Q, "filter_scales": [0.1, 0.2]}),
    ),
    "conv_geometry": (T.conv_geometry, dict(in_hw=(4, 4), kernel_hw=(2, 2), stride=1, padding="SAME")),
    "add_params": (T.add_params, dict(s1=0.5, s2=0.25, s_out=0.7)),
    "add_int": (T.add_int, dict(x1=X8, x2=X8B, p=ADDP, z1=1, z2=-2, zout=3, act_min=-128, act_max=127)),
    "avgpool_int": (T.avgpool_int, dict(x=XI, geom=POOL, act_min=-128, act_max=127)),
    "maxpool_int": (T.maxpool_int, dict(x=XI, geom=POOL, act_min=-128, act_max=127)),
    "kernel_sums": (T.kernel_sums, dict(kernel=np.ones((3, 2, 2, 2), I32))),
    "accumulator_range": (
        T.accumulator_range,
        dict(kernel=np.ones((3, 2, 2, 2), I32), bias=np.array([1, -2, 3], I32), input_zero_point=-5),
    ),
    "with_acc_bound": (
        T.with_acc_bound,
        dict(params=T.requant_params(0.5, [0.1, 0.2], 0.7, "double"), acc_min=[-500, -9], acc_max=[700, 9]),
    ),
    "srdhm_bounded": (T.srdhm_bounded, dict(d=np.array([5, -7, 1000], I32), b=I32(2**30 + 3), low=I32(2**30), bits=12)),
    "fc_int": (
        T.fc_int,
        dict(
            x=X8[:, :3],
            kernel=np.ones((4, 3), I32),
            bias=np.zeros(4, I32),
            zin=1,
            rq=RQ4,
            requant="double",
            zout=-3,
            act_min=-128,
            act_max=127,
        ),
    ),
    "conv_int": (
        T.conv_int,
        dict(
            x=XI,
            kernel=np.ones((3, 2, 2, 2), I32),
            bias=np.zeros(3, I32),
            zin=1,
            rq=RQ3,
            requant="double",
            zout=-3,
            act_min=-128,
            act_max=127,
            geom=GEOM,
        ),
    ),
    "depthwise_int": (
        T.depthwise_int,
        dict(
            x=XI,
            kernel=np.ones((2, 2, 2), I32),
            bias=np.zeros(2, I32),
            zin=1,
            rq=RQ2,
            requant="double",
            zout=-3,
            act_min=-128,
            act_max=127,
            geom=GEOM,
        ),
    ),
    # tflite: nonlinear
    "litert_lut_table": (T.litert_lut_table, dict(fn="sigmoid", s_in=0.1, z_in=0, s_out=1 / 256, z_out=-128)),
    "lut_lookup": (T.lut_lookup, dict(x=X8, table=LUT)),
    "softmax_exp_table": (T.softmax_exp_table, dict(s_in=0.1, beta=1.0)),
    "softmax_optimized": (T.softmax_optimized, dict(x=X8, table=EXP_TABLE, s_out=1 / 256, z_out=-128)),
    "softmax_reference_params": (T.softmax_reference_params, dict(s_in=0.1, beta=1.0)),
    "softmax_reference": (T.softmax_reference, dict(x=X8, **SMP)),
    "sigmoid_tanh_params": (T.sigmoid_tanh_params, dict(s_in=0.05)),
    "tflm_logistic": (T.tflm_logistic, dict(x=X8, z_in=1, p=STP)),
    "tflm_tanh": (T.tflm_tanh, dict(x=X8, z_in=1, p=STP)),
    # tflite: tensor ops
    "concat_int": (T.concat_int, dict(xs=[X8, X8B], axis=0)),
    "pad_int": (T.pad_int, dict(x=X8, paddings=((1, 2),), value=0)),
    "mean_mbqm": (T.mean_mbqm, dict(x=XM, axes=(0,), keep=False, count=2, p=MEANP)),
    "mean_lanes": (
        T.mean_lanes,
        dict(x=XM, axes=(0,), keep=True, p=dict(multiplier=I32(2**30), shift=I32(-1), bias=I32(2)), lanes=0),
    ),
    "mean_float": (T.mean_float, dict(x=XM, axes=(0,), keep=False, p=dict(sm=np.float32(0.3), zf=np.float32(2)))),
    "mul_mbqm": (T.mul_mbqm, dict(x1=X8, x2=X8B, p=MULP)),
    "mul_lanes": (T.mul_lanes, dict(x1=X8, x2=X8B, p=MULP)),
    "mul_float": (
        T.mul_float,
        dict(
            x1=X8,
            x2=X8B,
            p=dict(scale=np.float32(0.01), z1=I32(1), z2=I32(-2), zout=I32(3), act_min=I32(-128), act_max=I32(127)),
        ),
    ),
    "square_lut": (T.square_lut, dict(x=X8, p=dict(table=LUT, act_min=I32(-128), act_max=I32(127)))),
    "dequantize_exact": (T.dequantize_exact, dict(x=X8, p=dict(scale=np.float32(0.1), z=I32(3)))),
    "dequantize_lanes": (T.dequantize_lanes, dict(x=X8, p=dict(scale=np.float32(0.1), zs=np.float32(-0.3), z=I32(3)))),
    # tflite: TFLM-, XNNPACK- and optimized-kernel recipes
    "add_recipe": (
        T.add_recipe,
        dict(runtime="xnnpack", activation=None, s1=0.5, z1=1, s2=0.25, z2=-2, s_out=0.7, z_out=3),
    ),
    "add_jax": (T.add_jax, dict(x1=X8, x2=X8B, p=ADD_REC, runtime="xnnpack")),
    "requant_recipe": (T.requant_recipe, dict(runtime="xnnpack", s_in=0.5, s_out=0.7)),
    "requant_jax": (T.requant_jax, dict(x=X8, p=RQ_REC, runtime="xnnpack")),
}


call = table_caller(FUNCS)


_with = with_value


def _drop(d, key):
    return {k: v for k, v in d.items() if k != key}


def _nan_in(d, key):
    return {**d, key: np.float32(NAN)}


# (function, argument named in the error, bad keyword arguments, accepted error classes)
CASES = [
    # ---- gemmlowp: static integers and choices
    *[
        (f, "n", dict(n=v), k)
        for f in ("addmod_offsets", "xorshift_offsets", "nearest_offsets")
        for v, k in ((-1, R), ("5", A), (2**40, R), (None, A), (2.0, A))
    ],
    ("rounding_offsets", "mode", dict(mode="round"), R),
    ("rounding_offsets", "n", dict(n=-3), R),
    ("rounding_mode", "depth", dict(depth=-1), R),
    ("rounding_mode", "rounding", dict(rounding="fast"), R),
    ("rounding_mode", "depth", dict(depth=np.int64(2**40)), R),
    ("is_requantization_worth_it", "rows", dict(rows=-1), R),
    ("is_requantization_worth_it", "cols", dict(cols="4"), A),
    ("block_params", "rows", dict(rows=0), R),
    ("block_params", "depth", dict(depth=None), A),
    ("block_params", "l1_cache", dict(l1_cache=0), R),
    ("block_params", "l2_cache", dict(l2_cache="big"), A),
    ("block_params", "l1_cache", dict(l1_cache=2.5), A),
    ("uint16_lane_capacity", "lhs_bits", dict(lhs_bits=9), R),
    ("uint16_lane_capacity", "rhs_bits", dict(rhs_bits=0), R),
    ("uint16_lane_capacity", "lhs_bits", dict(lhs_bits=7.0), A),
    ("check_uint16_accumulators", "products_per_lane", dict(products_per_lane=0), R),
    ("check_uint16_accumulators", "products_per_lane", dict(products_per_lane=10**6), R),
    ("check_uint16_accumulators", "rhs_bits", dict(rhs_bits=9), R),
    ("rmcf_constants", "numerator", dict(numerator=0), R),
    ("rmcf_constants", "denominator", dict(denominator="3"), A),
    ("rmcf_constants", "denominator", dict(denominator=np.int64(2**40)), R),
    # ---- gemmlowp: arrays
    ("rounding_multiply_by_constant_fraction", "x", dict(x=np.float32([1.5])), A),
    ("rounding_multiply_by_constant_fraction", "x", dict(x=np.int64([2**40])), R),
    ("rounding_multiply_by_constant_fraction", "x", dict(x="abc"), A),
    ("rounding_multiply_by_constant_fraction", "denominator", dict(denominator=0), R),
    ("gemm", "lhs", dict(lhs=np.ones((2, 3), np.float32)), A),
    ("gemm", "rhs", dict(rhs=np.ones((4, 4), np.uint8)), S),
    ("gemm", "lhs_offset", dict(lhs_offset=2**40), R),
    ("srdhm", "a", dict(a=np.int64([2**31])), R),
    ("srdhm", "b", dict(b="abc"), A),
    ("rounding_divide_by_pot", "exponent", dict(exponent=I32(32)), R),
    ("rounding_divide_by_pot", "x", dict(x=None), A),
    ("shift_left", "x", dict(x=np.float32([1.5])), A),
    ("shift_left", "overflow", dict(overflow="wrap?"), R),
    ("srdhm_int16", "a", dict(a=np.array([40000, 0], I32)), R),
    ("srdhm_int16", "b", dict(b=[1, "a"]), A),
    ("srdhm_int16", "b", dict(b=np.ones(3, I32)), S),
    ("srdhm_int16", "a", dict(a=np.float32([NAN, 0])), R),
    ("gemmlowp.requantize", "x", dict(x=_with(U8L, 0, 300, np.int32)), R),
    ("gemmlowp.requantize", "bits", dict(bits=9), R),
    ("gemmlowp.requantize", "mode", dict(mode="round"), R),
    ("gemmlowp.requantize", "x", dict(x=U8L.astype(np.float32)), A),
    ("gemmlowp.requantize", "x", dict(x=None), A),
    ("pack_lt8", "rhs", dict(rhs=_with(U8R, 3, 300, np.int32)), R),
    ("pack_lt8", "lhs", dict(lhs=U8L[0]), S),
    ("pack_lt8", "lhs_bits", dict(lhs_bits=0), R),
    ("pack_lt8", "rounding", dict(rounding="fast"), R),
    ("pack_lt8", "rhs", dict(rhs=np.ones((5, 4), np.uint8)), S),
    ("gemm_lt8", "lhs_offset", dict(lhs_offset=np.array([1, 2, 3], I32)), S),
    ("gemm_lt8", "rhs_offset", dict(rhs_offset=2**40), R),
    ("gemm_lt8", "lhs_offset", dict(lhs_offset=0.5), A),
    ("gemm_lt8", "lhs", dict(lhs=_with(U8L, 1, -1, np.int32)), R),
    ("gemm_lt8", "rhs_bits", dict(rhs_bits=9), R),
    ("gemm_lt8", "uint16_lane_products", dict(uint16_lane_products=10**4), R),
    ("gemm_lt8", "result_shift", dict(result_offset=0, result_mult_int=1, result_shift=40), R),
    ("eight_bit_int_gemm", "c_shift", dict(c_shift=40), R),
    ("eight_bit_int_gemm", "c_mult_int", dict(c_mult_int=2**40), R),
    ("eight_bit_int_gemm", "a", dict(a=_with(U8L, 2, 256, np.int32)), R),
    ("eight_bit_int_gemm", "bit_depth", dict(bit_depth="A5B7"), A),
    ("eight_bit_int_gemm", "b_offset", dict(b_offset=None), A),
    ("eight_bit_int_gemm", "a_offset", dict(a_offset=np.ones(5, I32)), S),
    ("apply_output_stages", "acc", dict(acc=np.ones((2, 3), np.float32)), A),
    ("apply_output_stages", "acc", dict(acc=np.ones(3, I32)), S),
    ("apply_output_stages", "output_stages", dict(output_stages="abc"), A),
    ("apply_output_stages", "result_shift", dict(output_stages=_stages(40)), R),
    # ---- tflite public kernels (fully_connected, conv2d, depthwise_conv2d share _prepare)
    *[
        (f, arg, {arg: v}, k)
        for f in ("fully_connected", "conv2d", "depthwise_conv2d")
        for arg, v, k in (
            ("x", _with(FUNCS[f][1]["x"], 0, 200), R),
            ("x", None, A),
            ("w", [[1, 2], [3]], A),
            ("input_zero_point", 300, R),
            ("output_zero_point", "3", A),
            ("output_zero_point", 1.5, R),
            ("input_scale", NAN, R),
            ("input_scale", "0.5", A),
            ("input_scale", None, A),
            ("output_scale", 0.0, R),
            ("output_scale", -1.0, R),
            ("output_scale", [0.5, 0.7], S),
            ("filter_scales", [0.1] * 5, S),
            ("filter_scales", [NAN], R),
            ("filter_scales", [], S),
            ("requant", "fast", R),
            ("activation", "tanh", R),
            ("b", np.zeros(5, I32), S),
        )
    ],
    *[
        (f, arg, {arg: v}, k)
        for f in ("conv2d", "depthwise_conv2d")
        for arg, v, k in (("stride", 0, R), ("stride", 2.0, A), ("padding", "FULL", R), ("dilation", "2", A))
    ],
    ("conv_geometry", "stride", dict(stride=2.0), A),
    ("conv_geometry", "stride", dict(stride=0), R),
    ("conv_geometry", "in_hw", dict(in_hw=None), A),
    ("conv_geometry", "padding", dict(padding=3), R),
    ("conv_geometry", "dilation", dict(dilation=None), A),
    ("conv_geometry", "kernel", dict(kernel_hw=(0, 2)), R),
    ("activation_range", "activation", dict(activation="tanh"), R),
    ("activation_range", "output_scale", dict(output_scale=0.0), R),
    ("activation_range", "output_scale", dict(output_scale=NAN), R),
    ("activation_range", "output_scale", dict(output_scale="abc"), A),
    ("activation_range", "output_zero_point", dict(output_zero_point=300), R),
    ("activation_range", "output_zero_point", dict(output_zero_point="3"), A),
    ("activation_range", "output_zero_point", dict(output_zero_point=1.5), R),
    ("activation_range", "qmin", dict(qmin="a"), A),
    ("activation_range", "qmin", dict(qmin=10, qmax=-10), R),
    ("quantize_multiplier", "real", dict(real=NAN), R),
    ("quantize_multiplier", "real", dict(real="abc"), A),
    ("quantize_multiplier", "real", dict(real=INF), R),
    ("quantize_multiplier", "real", dict(real=[0.3, "a"]), A),
    ("quantize_multiplier", "single_rounding", dict(single_rounding="yes"), A),
    ("requant_params", "input_scale", dict(input_scale="abc"), A),
    ("requant_params", "input_scale", dict(input_scale=[0.5, 0.6]), S),
    ("requant_params", "filter_scales", dict(filter_scales=[]), S),
    ("requant_params", "output_scale", dict(output_scale=NAN), R),
    ("requant_params", "requant", dict(requant="fast"), R),
    ("requant_params", "channels", dict(channels=0), R),
    ("requant_params", "channels", dict(channels="2"), A),
    ("requant_params", "float32_product", dict(float32_product="yes"), A),
    ("tflite.requantize", "acc", dict(acc=np.float32([1.5])), A),
    ("tflite.requantize", "acc", dict(acc=np.int64([2**40])), R),
    ("tflite.requantize", "params", dict(params={}), A),
    ("tflite.requantize", "params", dict(params=None), A),
    ("tflite.requantize", "requant", dict(requant="fast"), R),
    ("tflite.requantize", "output_zero_point", dict(output_zero_point="3"), A),
    ("tflite.requantize", "act_min", dict(act_min=2**40), R),
    ("tflite.requantize", "act_min", dict(act_min=100, act_max=-100), R),
    ("multiply_by_quantized_multiplier", "shift", dict(shift=40), R),
    ("multiply_by_quantized_multiplier", "multiplier", dict(multiplier=2**40), R),
    ("multiply_by_quantized_multiplier", "x", dict(x="abc"), A),
    ("multiply_by_quantized_multiplier", "rounding", dict(rounding="half"), R),
    ("mbqm_double", "s", dict(s=40), R),
    ("mbqm_double", "x", dict(x=np.float32([1.5])), A),
    ("mbqm_double", "m", dict(m="abc"), A),
    ("mbqm_double", "x", dict(x=np.int64([2**40])), R),
    ("add_params", "s1", dict(s1=0.0), R),
    ("add_params", "s2", dict(s2=NAN), R),
    ("add_params", "s_out", dict(s_out="abc"), A),
    ("add_params", "s_out", dict(s_out=-1.0), R),
    ("add_int", "x1", dict(x1=_with(X8, 0, 200)), R),
    ("add_int", "x2", dict(x2=np.ones((2, 5), I32)), S),
    ("add_int", "p", dict(p={}), A),
    ("add_int", "p['e1']", dict(p={**ADDP, "e1": np.int32(-32)}), R),
    ("add_int", "p['eo']", dict(p={**ADDP, "eo": np.int32(32)}), R),
    ("add_int", "z1", dict(z1=300), R),
    ("add_int", "x1", dict(x1=X8 * 0.5), A),
    ("add_int", "act_min", dict(act_min="a"), A),
    ("add_int", "zout", dict(zout=None), A),
    *[
        (f, arg, {arg: v}, k)
        for f in ("avgpool_int", "maxpool_int")
        for arg, v, k in (
            ("x", _with(XI, 0, 200), R),
            ("geom", (2, 2), A),
            ("x", np.zeros((1, 5, 5, 2), I32), S),
            ("act_min", "a", A),
            ("act_max", 2**40, R),
            ("x", "abc", A),
        )
    ],
    *[
        (f, arg, {arg: v}, k)
        for f in ("fc_int", "conv_int", "depthwise_int")
        for arg, v, k in (
            ("x", _with(FUNCS[f][1]["x"], 0, 300), R),
            ("kernel", _with(FUNCS[f][1]["kernel"], 0, 200), R),
            ("bias", np.zeros(5, I32), S),
            ("zin", 300, R),
            ("requant", "fast", R),
            ("rq", {}, A),
            ("zout", "3", A),
            ("x", None, A),
            ("act_max", 2**40, R),
            ("out_dtype", "float32", A),
            ("out_dtype", None, A),
        )
    ],
    *[(f, "out_dtype", dict(out_dtype="int8", act_max=200), R) for f in ("fc_int", "conv_int", "depthwise_int")],
    ("fc_int", "x", dict(x=np.ones((2, 5), I32)), S),
    *[(f, "wsum", dict(wsum=np.zeros(5, I32)), S) for f in ("fc_int", "conv_int", "depthwise_int")],
    ("kernel_sums", "kernel", dict(kernel=np.ones((3, 2), np.float32)), A),
    ("accumulator_range", "kernel", dict(kernel=np.full((3, 4), 200, I32)), R),
    ("accumulator_range", "kernel", dict(kernel=np.ones((3, 4), I32), depthwise=True), S),
    ("accumulator_range", "bias", dict(bias=np.ones(2, I32)), S),
    ("accumulator_range", "bias", dict(bias=np.ones(3, np.float32)), A),
    ("accumulator_range", "input_zero_point", dict(input_zero_point=300), R),
    ("with_acc_bound", "params", dict(params={"multiplier": I32(2**30)}), A),
    ("with_acc_bound", "params['shift']", dict(params={"multiplier": I32(2**30), "shift": I32(40)}), R),
    ("with_acc_bound", "acc_min", dict(acc_min=[1.5, 2.0]), A),
    ("with_acc_bound", "acc_min", dict(acc_min=[1, 2, 3]), S),
    ("srdhm_bounded", "bits", dict(bits=30), R),
    ("srdhm_bounded", "d", dict(d=np.array([5000], I32)), R),
    ("srdhm_bounded", "b", dict(b=I32(-1)), R),
    ("srdhm_bounded", "low", dict(low=np.float32(3)), A),
    ("kernel_sums", "kernel", dict(kernel=np.ones((3, 2), I32), depthwise=True), S),
    ("conv_int", "geom", dict(geom=None), A),
    ("depthwise_int", "geom", dict(geom=(2, 2)), A),
    ("conv_int", "kernel", dict(kernel=np.ones((3, 2, 2, 5), I32)), S),
    # ---- tflite nonlinear
    ("litert_lut_table", "fn", dict(fn="relu"), R),
    ("litert_lut_table", "s_in", dict(s_in=NAN), R),
    ("litert_lut_table", "s_out", dict(s_out=0.0), R),
    ("litert_lut_table", "z_in", dict(z_in=300), R),
    ("litert_lut_table", "z_out", dict(z_out="3"), A),
    ("lut_lookup", "x", dict(x=_with(X8, 0, 200)), R),
    ("lut_lookup", "table", dict(table=LUT[:255]), S),
    ("lut_lookup", "table", dict(table="abc"), A),
    ("lut_lookup", "x", dict(x=X8 * 0.5), A),
    ("softmax_exp_table", "s_in", dict(s_in=NAN), R),
    ("softmax_exp_table", "s_in", dict(s_in=0.0), R),
    ("softmax_exp_table", "beta", dict(beta=INF), R),
    ("softmax_exp_table", "beta", dict(beta="1"), A),
    ("softmax_optimized", "x", dict(x=_with(X8, 0, 200)), R),
    ("softmax_optimized", "table", dict(table=EXP_TABLE[:10]), S),
    ("softmax_optimized", "s_out", dict(s_out=0.0), R),
    ("softmax_optimized", "z_out", dict(z_out=300), R),
    ("softmax_reference_params", "s_in", dict(s_in="abc"), A),
    ("softmax_reference_params", "s_in", dict(s_in=NAN), R),
    ("softmax_reference_params", "beta", dict(beta=INF), R),
    ("softmax_reference", "x", dict(x=_with(X8, 0, 200)), R),
    ("softmax_reference", "ls", dict(ls=40), R),
    ("softmax_reference", "m", dict(m="a"), A),
    ("softmax_reference", "diff_min", dict(diff_min=5), R),
    ("sigmoid_tanh_params", "s_in", dict(s_in=0.0), R),
    ("sigmoid_tanh_params", "s_in", dict(s_in=NAN), R),
    ("sigmoid_tanh_params", "s_in", dict(s_in="abc"), A),
    ("sigmoid_tanh_params", "s_in", dict(s_in=-1.0), R),
    *[
        (f, arg, {arg: v}, k)
        for f in ("tflm_logistic", "tflm_tanh")
        for arg, v, k in (
            ("x", _with(X8, 0, 200), R),
            ("z_in", 300, R),
            ("p", {}, A),
            ("x", X8 * 0.5, A),
            ("p", {**STP, "ls": I32(40)}, R),
        )
    ],
    # ---- tflite tensor ops
    ("concat_int", "axis", dict(axis=1), R),
    ("concat_int", "xs", dict(xs=[X8, np.ones((3, 4), I32)]), S),
    ("concat_int", "xs", dict(xs="abc"), A),
    ("concat_int", "xs", dict(xs=[]), S),
    ("concat_int", "axis", dict(axis="0"), A),
    ("concat_int", "xs", dict(xs=[X8, None]), A),
    ("pad_int", "paddings", dict(paddings=((-1, 2),)), R),
    ("pad_int", "paddings", dict(paddings=((1, 2), (0, 0))), S),
    ("pad_int", "value", dict(value=300), R),
    ("pad_int", "value", dict(value="0"), A),
    ("pad_int", "paddings", dict(paddings="ab"), A),
    ("mean_mbqm", "axes", dict(axes=(2,)), R),
    ("mean_mbqm", "count", dict(count=0), R),
    ("mean_mbqm", "keep", dict(keep="yes"), A),
    ("mean_mbqm", "p", dict(p={}), A),
    ("mean_mbqm", "x", dict(x=_with(XM, 0, 200)), R),
    ("mean_lanes", "lanes", dict(lanes=-1), R),
    ("mean_lanes", "lanes", dict(lanes="a"), A),
    ("mean_lanes", "p", dict(p=_drop(FUNCS["mean_lanes"][1]["p"], "bias")), A),
    ("mean_float", "p", dict(p=_nan_in(FUNCS["mean_float"][1]["p"], "sm")), R),
    ("mean_float", "axes", dict(axes=("a",)), A),
    *[
        (f, arg, {arg: v}, k)
        for f in ("mul_mbqm", "mul_lanes", "mul_float")
        for arg, v, k in (("x2", np.ones((2, 5), I32), S), ("x1", _with(X8, 0, 200), R), ("p", {}, A), ("x1", "abc", A))
    ],
    ("mul_mbqm", "p", dict(p={**MULP, "shift": I32(40)}), R),
    ("mul_float", "p", dict(p=_nan_in(FUNCS["mul_float"][1]["p"], "scale")), R),
    ("square_lut", "x", dict(x=_with(X8, 0, 200)), R),
    ("square_lut", "p", dict(p=dict(table=LUT[:100], act_min=I32(-128), act_max=I32(127))), S),
    *[
        (f, arg, {arg: v}, k)
        for f in ("dequantize_exact", "dequantize_lanes")
        for arg, v, k in (
            ("x", X8 * 0.5, A),
            ("x", _with(X8, 0, 200), R),
            ("p", {}, A),
            ("p", _nan_in(FUNCS[f][1]["p"], "scale"), R),
            ("p", {**FUNCS[f][1]["p"], "z": I32(300)}, R),
        )
    ],
    # ---- recipes and kernels of the optimized / XNNPACK paths
    ("add_recipe", "runtime", dict(runtime="reference"), R),
    ("add_recipe", "s1", dict(s1=NAN), R),
    ("add_recipe", "z1", dict(z1=300), R),
    ("add_recipe", "activation", dict(activation="tanh"), R),
    ("add_recipe", "s_out", dict(s_out=0.0), R),
    ("add_recipe", "z_out", dict(z_out="3"), A),
    ("add_jax", "runtime", dict(runtime="ref"), R),
    ("add_jax", "x1", dict(x1=_with(X8, 0, 200)), R),
    ("add_jax", "p", dict(p={}), A),
    ("add_jax", "x2", dict(x2=np.ones((2, 5), I32)), S),
    ("requant_recipe", "runtime", dict(runtime="x"), R),
    ("requant_recipe", "s_in", dict(s_in=0.0), R),
    ("requant_recipe", "s_out", dict(s_out=NAN), R),
    ("requant_jax", "x", dict(x=_with(X8, 0, 256)), R),
    ("requant_jax", "p", dict(p=_drop(RQ_REC, "zin")), A),
    ("requant_jax", "runtime", dict(runtime="reference"), R),
]


@pytest.mark.parametrize("case", table_params(CASES))
def test_bad_arguments_raise_named_hwjax_errors(case):
    expect_table_error(call, case)


# Public functions that still compile more than one program when called eagerly on a
# new shape (see tests/test_bad_input.py:check_one_program).
MULTI_PROGRAM: dict[str, str] = {}
# public functions that take no arrays (files and a static helper), checked in their own tests
# host-side predicates on scalar quantisation parameters (no arrays)
NOT_ARRAY_PRIMITIVES = {"softmax_quant_error", "mul_int16_safe"}


def test_every_function_is_covered_and_runs_as_one_program_on_canonical_arguments():
    public = set(G.__all__) | set(T.__all__)
    for name, (fn, _) in FUNCS.items():
        assert fn.__name__ in public, name
    check_covers_public(FUNCS, G, T, elsewhere=NOT_ARRAY_PRIMITIVES)
    check_one_program(FUNCS, call, MULTI_PROGRAM)  # runs every one of them
    covered = {f for f, *_ in CASES}
    assert covered == set(FUNCS), set(FUNCS) - covered


# -------------------------------------------------------------- hypothesis: every form

# (function, array argument, lo, hi of its values)
INT_ARRAYS = [
    ("rounding_multiply_by_constant_fraction", "x", -(2**31), 2**31 - 1),
    ("srdhm_int16", "a", -(2**15), 2**15 - 1),
    ("gemmlowp.requantize", "x", 0, 255),
    ("gemm_lt8", "lhs", 0, 255),
    ("eight_bit_int_gemm", "b", 0, 255),
    ("tflite.requantize", "acc", -(2**31), 2**31 - 1),
    ("mbqm_double", "x", -(2**31), 2**31 - 1),
    ("add_int", "x2", -128, 127),
    ("avgpool_int", "x", -128, 127),
    ("maxpool_int", "x", -128, 127),
    ("fc_int", "x", -128, 255),
    ("fc_int", "kernel", -128, 127),
    ("conv_int", "x", -128, 255),
    ("depthwise_int", "x", -128, 255),
    ("lut_lookup", "x", -128, 127),
    ("softmax_optimized", "x", -128, 127),
    ("softmax_reference", "x", -128, 127),
    ("tflm_logistic", "x", -128, 127),
    ("tflm_tanh", "x", -128, 127),
    ("mean_mbqm", "x", -128, 127),
    ("mean_float", "x", -128, 127),
    ("mul_mbqm", "x2", -128, 127),
    ("mul_lanes", "x1", -128, 127),
    ("mul_float", "x2", -128, 127),
    ("square_lut", "x", -128, 127),
    ("dequantize_exact", "x", -128, 127),
    ("dequantize_lanes", "x", -128, 127),
    ("add_jax", "x2", -128, 127),
    ("requant_jax", "x", -128, 255),
    ("pad_int", "x", -128, 255),
    ("fully_connected", "x", -128, 127),
]


@SETTINGS
@given(st.sampled_from(INT_ARRAYS), WRONG_TYPES)
@example(("gemm_lt8", "lhs", 0, 255), np.array([1, 2], np.uint32))  # uint32 holding 0..255 is a wrong type too
@example(("gemmlowp.requantize", "x", 0, 255), [[1, 2], [3]])
def test_array_arguments_reject_wrong_types(case, bad):
    fname, arg, _, _ = case
    if isinstance(bad, np.ndarray) and bad.dtype == np.uint32:
        bad = np.resize(bad, np.shape(FUNCS[fname][1][arg])).astype(np.uint32)
    expect_error(lambda: call(fname, **{arg: bad}), arg, (TypeError, ValueError))


@SETTINGS
@given(st.sampled_from(INT_ARRAYS), st.data())
def test_array_arguments_out_of_range_in_every_form(case, data):
    fname, arg, lo, hi = case
    canonical = FUNCS[fname][1][arg]
    big = data.draw(
        st.one_of(st.integers(hi + 1, 2**40), st.integers(-(2**40), lo - 1))
        if lo > -(2**31)
        else st.integers(hi + 1, 2**40),
        label="value",
    )
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


@SETTINGS
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
    if isinstance(want, tuple):
        for a, b in zip(got, want):
            same(a, b)
    else:
        same(got, want)


# -------------------------------------------- traced values pass the checks (jit, vmap)


@pytest.mark.parametrize(
    "fname,args",
    [
        ("add_int", ("x1", "x2")),
        ("lut_lookup", ("x",)),
        ("tflite.requantize", ("acc",)),
        ("mul_mbqm", ("x1", "x2")),
        ("tflm_logistic", ("x",)),
        ("softmax_reference", ("x",)),
        ("requant_jax", ("x",)),
        ("fc_int", ("x",)),
        ("mbqm_double", ("x",)),
    ],
)
def test_traced_values_are_not_checked(fname, args):
    fn, kw = FUNCS[fname]
    want = call(fname)
    rest = {k: v for k, v in kw.items() if k not in args}

    def f(*xs):
        return fn(**rest, **dict(zip(args, xs)))

    xs = [kw[a] for a in args]
    same(jax.jit(f)(*xs), want)
    same(jax.vmap(f)(*[np.stack([x, x]) for x in xs]), np.stack([np.asarray(want)] * 2))


def test_jit_with_every_array_and_parameter_argument_traced():
    """Every array and parameter-dict argument traced at once (the TFLite target's form):
    the checks let tracers through and the result is the eager one. Except two host
    recipes whose result differs by design when traced: ``accumulator_range`` (exact int64
    bounds on concrete values, int32 traced) and ``with_acc_bound`` (a bound is static: it
    returns the parameters unchanged when they are traced); their traced forms are tested
    below."""
    for name, (fn, kw) in FUNCS.items():
        if name in ("accumulator_range", "with_acc_bound"):
            continue
        traced = {k: v for k, v in kw.items() if isinstance(v, (np.ndarray, dict)) or (name, k) == ("concat_int", "xs")}
        static = {k: v for k, v in kw.items() if k not in traced}
        if not traced:
            continue
        got = jax.jit(lambda a, fn=fn, static=static: fn(**static, **a))(traced)
        jax.tree_util.tree_map(same, got, call(name))


def test_the_accumulator_bound_recipes_traced():
    """accumulator_range traced: the same bounds in int32; with_acc_bound on traced
    parameters: the parameters unchanged (the general requantisation)."""
    fn, kw = FUNCS["accumulator_range"]
    lo, hi = jax.jit(lambda k, b: fn(kernel=k, bias=b, input_zero_point=kw["input_zero_point"]))(
        kw["kernel"], kw["bias"]
    )
    want_lo, want_hi = call("accumulator_range")
    assert lo.dtype == np.int32 and np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi)
    fn, kw = FUNCS["with_acc_bound"]
    got = jax.jit(lambda p: fn(params=p, acc_min=kw["acc_min"], acc_max=kw["acc_max"]))(kw["params"])
    assert set(got) == {"multiplier", "shift"} and "acc_bound" in call("with_acc_bound")


def test_errors_are_hwjax_errors():
    assert issubclass(ArgTypeError, HwjaxError) and issubclass(RangeError, ValueError)


def test_every_function_runs_inside_a_jit_trace():
    check_traceable(FUNCS, call)
