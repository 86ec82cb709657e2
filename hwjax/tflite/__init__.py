"""LiteRT / TFLite int8 models, bit-exact per runtime (spec gemmlowp.md §2, deployed.md).

* :func:`quantize_multiplier`, :func:`multiply_by_quantized_multiplier`: TFLite's
  fixed-point requantisation helpers; :func:`requantize` with the conventions of
  :data:`REQUANT` (``"double"`` R1, ``"float64"`` R2, ``"ruy"`` R3, ``"xnnpack"`` R4,
  ``"single"``).
* Kernels :func:`fully_connected`, :func:`conv2d`, :func:`depthwise_conv2d`.
"""

from hwjax.tflite._arith import (
    ACTIVATIONS,
    REQUANT,
    activation_range,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requant_params,
    requantize,
)
from hwjax.tflite._kernels import conv2d, conv_geometry, depthwise_conv2d, fully_connected

__all__ = [
    "ACTIVATIONS", "REQUANT", "activation_range", "conv2d", "conv_geometry", "depthwise_conv2d",
    "fully_connected", "multiply_by_quantized_multiplier", "quantize_multiplier", "requant_params", "requantize",
]
