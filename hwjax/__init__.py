"""hwjax: exact, differentiable emulation of accelerator integer arithmetic in JAX."""

from hwjax.core import (
    ROUNDING_MODES,
    fixed_mul,
    int_bounds,
    mac,
    mac_reference,
    saturate,
    shift_right,
)

__version__ = "0.1.0"

__all__ = [
    "ROUNDING_MODES",
    "__version__",
    "fixed_mul",
    "int_bounds",
    "mac",
    "mac_reference",
    "saturate",
    "shift_right",
]
