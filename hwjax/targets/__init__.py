"""Targets: the chips (and runtime conventions) hwjax graphs and layers run on.

One interface, :class:`Target`, and a registry: ``get("xs3", variant="host")``,
``available()``, ``register(name, factory)``. A target holds, per op kind it supports,
one :class:`hwjax.graph.OpImpl` (exact integer lowering, quantisation recipe, memory
formats). Targets compose the chip packages (:mod:`hwjax.xs3`, :mod:`hwjax.nvdla`),
which compose :mod:`hwjax.core`.

Adding a target: subclass :class:`Target` in its own module, register its op
implementations with ``MyTarget.implements(op, ...)`` and the target with
``register("mychip", MyTarget)``; ``hwjax.nn`` layers, :func:`hwjax.graph.run`,
:func:`hwjax.export` / :func:`hwjax.load`, the CLI and the benchmarks then find it.
"""

from hwjax.targets._base import (
    LUT_FUNCTIONS,
    ConvGeometry,
    Target,
    available,
    get,
    lut_function,
    lut_table,
    register,
    resolve,
)
from hwjax.targets._gemmlowp import Gemmlowp, GemmlowpLinearParams
from hwjax.targets._nvdla import NVDLA, NVDLAConvParams, NVDLALutParams, nvdla_lut_config
from hwjax.targets._xs3 import XS3, XS3ConvParams, XS3Legacy, XS3LegacyParams, xs3_add_params, xs3_bso
from hwjax.targets._tflite import TFLite
from hwjax.targets._onnxruntime import OnnxRuntime
from hwjax.targets import _tflite_nonlinear, _tflite_tensor
from hwjax.targets._tflite_tensor import check_tflite_lowering
from hwjax.targets._xs3_runtime import XS3Runtime
from hwjax.targets._xs3_compiled import XS3Compiled, check_xformer_lowering

__all__ = [
    "Gemmlowp",
    "GemmlowpLinearParams",
    "TFLite",
    "OnnxRuntime",
    "LUT_FUNCTIONS",
    "NVDLA",
    "ConvGeometry",
    "NVDLAConvParams",
    "NVDLALutParams",
    "Target",
    "XS3",
    "XS3ConvParams",
    "XS3Compiled",
    "XS3Legacy",
    "XS3LegacyParams",
    "XS3Runtime",
    "available",
    "check_tflite_lowering",
    "check_xformer_lowering",
    "get",
    "lut_function",
    "lut_table",
    "nvdla_lut_config",
    "register",
    "resolve",
    "xs3_add_params",
    "xs3_bso",
]
