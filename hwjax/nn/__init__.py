"""Flax NNX layers that train for a chip: float, calibrate and bit-exact hardware modes.

Build a model from these layers with a target (``hwjax.targets.XS3()``, ...), train
it in ``"float"`` mode, run representative data in ``"calibrate"`` mode, then switch
to ``"hardware"`` mode (:func:`set_mode`): the forward pass is then the target's
exact integer pipeline, and gradients flow through float surrogates, so the model
can be fine-tuned for the chip (hardware-aware training).
"""

from hwjax.nn._base import (
    MODES,
    Calibration,
    Derived,
    HwLayer,
    LayerStats,
    Pinned,
    ScaleFactor,
    get_mode,
    set_mode,
)
from hwjax.nn._graph import GraphModel, Residual, Sequential, from_graph, to_graph
from hwjax.nn._layers import (
    Activation,
    Add,
    AvgPool,
    Conv,
    Dense,
    DepthwiseConv,
    Flatten,
    LutActivation,
    MaxPool,
    Pool,
    Quantize,
    Requantize,
    Reshape,
)
from hwjax.nn._tensor_layers import Concat, Mean, Mul, Pad, Softmax
from hwjax.nn._fit import P_MIN, FinetuneResult, accuracy, cross_entropy, fit, nll, predict
from hwjax.nn._onnx_layers import OnnxNode, QLinearConv, QLinearMatMul  # (and the other ONNX op kinds' layers)
from hwjax.nn._qarray import QArray, as_float
from hwjax.nn._quant import act_qparams, exact_forward, quantize_act, quantize_weights, weight_scales

__all__ = [
    "MODES",
    "Activation",
    "Add",
    "AvgPool",
    "Calibration",
    "Conv",
    "Derived",
    "Dense",
    "DepthwiseConv",
    "Flatten",
    "HwLayer",
    "LayerStats",
    "LutActivation",
    "MaxPool",
    "Pinned",
    "QArray",
    "Quantize",
    "Residual",
    "ScaleFactor",
    "Sequential",
    "act_qparams",
    "as_float",
    "exact_forward",
    "get_mode",
    "quantize_act",
    "quantize_weights",
    "set_mode",
    "to_graph",
    "weight_scales",
    "GraphModel",
    "from_graph",
    "Pool",
    "Requantize",
    "Reshape",
    "Pad",
    "Concat",
    "Mean",
    "Mul",
    "Softmax",
    "OnnxNode",
    "P_MIN",
    "FinetuneResult",
    "accuracy",
    "cross_entropy",
    "fit",
    "nll",
    "predict",
    "QLinearConv",
    "QLinearMatMul",
]
