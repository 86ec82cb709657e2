"""hwjax: exact, differentiable emulation of accelerator integer arithmetic in JAX."""

# first: JAX's persistent compilation cache, before anything is compiled (hwjax._cache)
from hwjax._cache import default_enable as _default_enable

_default_enable()

from hwjax.core import (  # noqa: E402
    ROUNDING_MODES,
    checked,
    fixed_mul,
    int_bounds,
    mac,
    mac_reference,
    saturate,
    shift_right,
)

from hwjax._version import __version__  # noqa: E402
from hwjax._cache import enable_compilation_cache  # noqa: E402

from hwjax import nn, targets  # noqa: E402
from hwjax._evaluate import EvalResult, evaluate  # noqa: E402
from hwjax._export import ExportError, LoadedModel, export, load  # noqa: E402

__all__ = [
    "EvalResult",
    "ExportError",
    "LoadedModel",
    "ROUNDING_MODES",
    "__version__",
    "checked",
    "enable_compilation_cache",
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
