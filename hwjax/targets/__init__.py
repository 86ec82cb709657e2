"""Target objects: which chip (and which model of it) a hwjax layer runs on.

A target is a frozen dataclass. ``hwjax.nn`` layers call its methods to turn their
quantised float-side parameters into the chip's integer parameters (``*_params``,
jittable) and to run the chip's exact integer kernels (``conv``, ``depthwise``,
``maxpool``, ``avgpool``, ``add``, ``lut``). Targets compose the chip packages
(:mod:`hwjax.xs3`, :mod:`hwjax.nvdla`), which compose :mod:`hwjax.core`.

Every target answers ``check_layer(kind, **config)`` at layer construction and raises
``NotImplementedError`` naming the layer kind and the kinds it supports when it cannot
run a layer.
"""

from hwjax.targets._base import (
    LUT_FUNCTIONS,
    ConvGeometry,
    Gemmlowp,
    Target,
    TFLite,
    lut_function,
    lut_table,
)
from hwjax.targets._nvdla import NVDLA, NVDLAConvParams, NVDLALutParams, nvdla_lut_config
from hwjax.targets._xs3 import XS3, XS3ConvParams, XS3Legacy, XS3LegacyParams, xs3_bso

__all__ = [
    "LUT_FUNCTIONS", "NVDLA", "ConvGeometry", "Gemmlowp", "NVDLAConvParams", "NVDLALutParams", "TFLite",
    "Target", "XS3", "XS3ConvParams", "XS3Legacy", "XS3LegacyParams", "lut_function", "lut_table",
    "nvdla_lut_config", "xs3_bso",
]
