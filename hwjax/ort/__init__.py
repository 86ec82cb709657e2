"""ONNX Runtime's CPU int8 arithmetic, bit-exact (spec onnxruntime.md).

The arithmetic of ONNX Runtime 1.32's CPU execution provider on x86-64, apart from the
file format (:mod:`hwjax.onnx` reads ONNX files; :class:`hwjax.targets.OnnxRuntime`
composes these kernels into a target):

* host recipes (NumPy, float32 rounded once per operation): :func:`output_scale` (the
  linear kernels' multiplier), :func:`quantize_linear`, :func:`lut_table` (QLinearSigmoid,
  QLinearLeakyRelu, QLinearConcat), :func:`qlinear_add_table` / :func:`qlinear_mul_table`
  (every pair of codes), :func:`global_pool_scale`, :func:`logistic` (MLAS's, with or
  without FMA3), :func:`fma32`;
* JAX kernels on batched NCHW int32 arrays: :func:`requantize_output`
  (``MlasRequantizeOutput``), :func:`conv_acc`, :func:`matmul_acc` (exact int32
  accumulators through :func:`hwjax.core.int_dot`; :func:`conv_acc_u8s8_avx2` /
  :func:`matmul_acc_u8s8_avx2`, the int16 pair saturation of AVX2 CPUs without VNNI), :func:`quantize_linear_jax`
  (QuantizeLinear), :func:`dequantize_linear`, :func:`avgpool_float`,
  :func:`global_avgpool`, :func:`maxpool`, :func:`lookup` / :func:`lookup2`,
  :func:`float_binary`, :func:`logistic_jax`.
"""

from hwjax.ort._host import (
    TYPE_RANGES,
    dequantize_codes,
    fma32,
    global_pool_scale,
    logistic,
    lut_table,
    output_scale,
    qlinear_add_table,
    qlinear_mul_table,
    type_range,
)
from hwjax.ort._host import quantize_linear as quantize_linear_np
from hwjax.ort._kernels import (
    avgpool_float,
    conv_acc,
    conv_acc_u8s8_avx2,
    cvt_int32,
    dequantize_linear,
    float_binary,
    global_avgpool,
    logistic_jax,
    lookup,
    lookup2,
    matmul_acc,
    matmul_acc_u8s8_avx2,
    maxpool,
    quantize_linear,
    requantize_output,
)

quantize_linear_jax = quantize_linear

__all__ = [
    "TYPE_RANGES",
    "avgpool_float",
    "conv_acc",
    "conv_acc_u8s8_avx2",
    "cvt_int32",
    "dequantize_codes",
    "dequantize_linear",
    "float_binary",
    "fma32",
    "global_avgpool",
    "global_pool_scale",
    "logistic",
    "logistic_jax",
    "lookup",
    "lookup2",
    "lut_table",
    "matmul_acc",
    "matmul_acc_u8s8_avx2",
    "maxpool",
    "output_scale",
    "qlinear_add_table",
    "qlinear_mul_table",
    "quantize_linear",
    "quantize_linear_jax",
    "quantize_linear_np",
    "requantize_output",
    "type_range",
]
