"""LiteRT / TFLite int8 models, bit-exact per runtime (spec gemmlowp.md §2, deployed.md).

* :func:`quantize_multiplier`, :func:`multiply_by_quantized_multiplier`: TFLite's
  fixed-point requantisation helpers; :func:`requantize` with the conventions of
  :data:`REQUANT` (``"double"`` R1, ``"float64"`` R2, ``"ruy"`` R3, ``"xnnpack"`` R4,
  ``"single"``).
* Kernels :func:`fully_connected`, :func:`conv2d`, :func:`depthwise_conv2d`.
* :func:`load` reads an int8 ``.tflite`` file into a :class:`Model` (``Model.graph`` is a
  :class:`hwjax.graph.Graph`); ``Model.run(x, runtime=...)`` runs a batch bit-exactly as
  the runtime does (the target :class:`hwjax.targets.TFLite`).
"""

from hwjax.tflite._arith import (
    ACTIVATIONS,
    REQUANT,
    activation_range,
    mbqm_double,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requant_params,
    requantize,
)
from hwjax.tflite._kernels import (  # the integer kernels (the *_int forms are what the TFLite target runs)
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
    maxpool_int,
)
from hwjax.tflite._model import CHUNK_BYTES, RUNTIMES, SUPPORTED_OPS, Model, TensorInfo, batch_chunk, load
from hwjax.tflite._save import save
# the runtime kernels and recipes the TFLite target (hwjax.targets) composes
from hwjax.tflite._convert_nonlinear import (  # noqa: E402
    REFERENCE_MAX_DEPTH,
    litert_lut_table,
    lut_lookup,
    softmax_exp_table,
    softmax_optimized,
    softmax_reference,
    softmax_reference_params,
)
from hwjax.tflite._convert_tensor import (  # noqa: E402
    concat_int,
    dequantize_exact,
    dequantize_lanes,
    mean_float,
    mean_lanes,
    mean_mbqm,
    mul_float,
    mul_lanes,
    mul_mbqm,
    pad_int,
    square_lut,
)
from hwjax.tflite._tflm import (  # noqa: E402
    sigmoid_tanh_params,
    tflm_logistic,
    tflm_tanh,
)
from hwjax.tflite._xnnpack import (  # noqa: E402
    add_jax,
    add_recipe,
    requant_jax,
    requant_recipe,
)
from hwjax.tflite._cli import COMMANDS as CLI_COMMANDS  # noqa: E402
from hwjax.tflite._import import PRE_ACTIVATION  # noqa: E402  (suffix of a fused activation's input tensor)

__all__ = [
    "ACTIVATIONS", "CHUNK_BYTES", "Model", "PRE_ACTIVATION", "REQUANT", "RUNTIMES", "SUPPORTED_OPS", "TensorInfo", "activation_range", "conv2d",
    "batch_chunk", "conv_geometry", "depthwise_conv2d",
    "fully_connected", "multiply_by_quantized_multiplier", "quantize_multiplier", "requant_params", "requantize",
    "load", "add_int", "add_params", "avgpool_int", "conv_int", "depthwise_int", "fc_int", "maxpool_int",
    "mbqm_double", "save", "CLI_COMMANDS",
    "REFERENCE_MAX_DEPTH",
    "litert_lut_table",
    "lut_lookup",
    "softmax_exp_table",
    "softmax_optimized",
    "softmax_reference",
    "softmax_reference_params",
    "concat_int",
    "dequantize_exact",
    "dequantize_lanes",
    "mean_float",
    "mean_lanes",
    "mean_mbqm",
    "mul_float",
    "mul_lanes",
    "mul_mbqm",
    "pad_int",
    "square_lut",
    "sigmoid_tanh_params",
    "tflm_logistic",
    "tflm_tanh",
    "add_jax",
    "add_recipe",
    "requant_jax",
    "requant_recipe",
]
