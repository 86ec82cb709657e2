"""hwjax: exact, differentiable emulation of accelerator integer arithmetic in JAX."""

from hwjax.core import (
    ROUNDING_MODES,
    checked,
    fixed_mul,
    int_bounds,
    mac,
    mac_reference,
    saturate,
    shift_right,
)

from hwjax._version import __version__

from hwjax import nn, targets
from hwjax._evaluate import EvalResult, evaluate
from hwjax._export import ExportError, LoadedModel, export, load

__all__ = [
    "EvalResult",
    "ExportError",
    "LoadedModel",
    "ROUNDING_MODES",
    "__version__",
    "checked",
    "evaluate",
    "export",
    "fixed_mul",
    "int_bounds",
    "load",
    "mac",
    "mac_reference",
    "nn",
    "saturate",
    "shift_right",
    "targets",
]
