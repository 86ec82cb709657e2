"""Exact integer arithmetic that every hwjax target is built from.

Nothing here knows about any chip: targets compose these primitives into their
instructions and kernels.
"""

from hwjax.core import _wide as wide
from hwjax.core._float import div_rn
from hwjax.core._mac import mac, mac_reference
from hwjax.core._ops import (
    ROUNDING_MODES,
    fixed_mul,
    int_bounds,
    magnitude_bits,
    saturate,
    shift_right,
)

__all__ = [
    "ROUNDING_MODES",
    "div_rn",
    "fixed_mul",
    "int_bounds",
    "mac",
    "mac_reference",
    "magnitude_bits",
    "saturate",
    "shift_right",
    "wide",
]
