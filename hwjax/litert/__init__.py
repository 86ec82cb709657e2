"""LiteRT and TensorFlow Lite Micro int8 arithmetic, bit-exact per runtime (spec gemmlowp.md §2, deployed.md).

The arithmetic of the runtimes that run ``.tflite`` files, apart from the file format
(:mod:`hwjax.tflite` reads and writes the files; :class:`hwjax.targets.TFLite` composes
these kernels into a target):

* requantisation: :func:`quantize_multiplier`, :func:`multiply_by_quantized_multiplier`,
  :func:`requantize` with the conventions of :data:`REQUANT` (``"double"`` R1,
  ``"float64"`` R2, ``"ruy"`` R3, ``"xnnpack"`` R4, ``"single"``); a layer's proven
  accumulator range (:func:`accumulator_range`, :func:`with_acc_bound`) lets R1 / R3 take
  a cheaper exact form (:func:`srdhm_bounded`);
* linear and pool kernels: :func:`fully_connected`, :func:`conv2d`,
  :func:`depthwise_conv2d` (user-facing), and the ``*_int`` forms the target runs;
* ADD and element-wise requantisation as LiteRT's x86 vector loops and XNNPACK compute
  them (:func:`add_recipe` / :func:`add_jax`, :func:`requant_recipe` / :func:`requant_jax`);
* tensor ops (PAD, CONCATENATION, MEAN, MUL, DEQUANTIZE) and the nonlinear ops
  (LOGISTIC / TANH tables, SOFTMAX reference and optimized; TFLM's own fixed-point
  LOGISTIC / TANH).

Every kernel is a pure JAX function of batched int32 arrays holding int8 values and the
integer parameters its recipe derives; concrete arguments are range-checked and raise
:mod:`hwjax.errors` exceptions naming the argument.
"""

from hwjax.litert._arith import (
    ACTIVATIONS,
    REQUANT,
    AccBound,
    activation_range,
    mbqm_double,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requant_params,
    requantize,
    srdhm_bounded,
    with_acc_bound,
)
from hwjax.litert._kernels import (
    accumulator_range,
    add_int,
    add_params,
    avgpool_int,
    conv2d,
    conv_geometry,
    conv_int,
    depthwise_conv2d,
    depthwise_int,
    fc_int,
    fully_connected,
    kernel_sums,
    maxpool_int,
)
from hwjax.litert._nonlinear import (
    REFERENCE_MAX_DEPTH,
    SIGMOID_OUTPUT_SCALE,
    litert_lut_table,
    lut_lookup,
    softmax_exp_table,
    softmax_optimized,
    softmax_quant_error,
    softmax_reference,
    softmax_reference_params,
)
from hwjax.litert._tensor import (
    concat_int,
    dequantize_exact,
    dequantize_lanes,
    mean_float,
    mean_lanes,
    mean_mbqm,
    mul_float,
    mul_int16_safe,
    mul_lanes,
    mul_mbqm,
    pad_int,
    square_lut,
)
from hwjax.litert._tflm import sigmoid_tanh_params, tflm_logistic, tflm_tanh
from hwjax.litert._xnnpack import add_jax, add_recipe, requant_jax, requant_recipe

__all__ = [
    "ACTIVATIONS",
    "AccBound",
    "REFERENCE_MAX_DEPTH",
    "REQUANT",
    "SIGMOID_OUTPUT_SCALE",
    "accumulator_range",
    "activation_range",
    "add_int",
    "add_jax",
    "add_params",
    "add_recipe",
    "avgpool_int",
    "concat_int",
    "conv2d",
    "conv_geometry",
    "conv_int",
    "depthwise_conv2d",
    "depthwise_int",
    "dequantize_exact",
    "dequantize_lanes",
    "fc_int",
    "fully_connected",
    "kernel_sums",
    "litert_lut_table",
    "lut_lookup",
    "maxpool_int",
    "mbqm_double",
    "mean_float",
    "mean_lanes",
    "mean_mbqm",
    "mul_float",
    "mul_int16_safe",
    "mul_lanes",
    "mul_mbqm",
    "multiply_by_quantized_multiplier",
    "pad_int",
    "quantize_multiplier",
    "requant_jax",
    "requant_params",
    "requant_recipe",
    "requantize",
    "sigmoid_tanh_params",
    "softmax_exp_table",
    "softmax_optimized",
    "softmax_quant_error",
    "softmax_reference",
    "softmax_reference_params",
    "srdhm_bounded",
    "square_lut",
    "tflm_logistic",
    "tflm_tanh",
    "with_acc_bound",
]
