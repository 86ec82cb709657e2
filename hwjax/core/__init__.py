"""Exact integer arithmetic that every hwjax target is built from.

Nothing here knows about any chip: targets compose these primitives into their
instructions and kernels.
"""

from hwjax.core import _surrogate as surrogate  # the surrogate-gradient mechanism targets use
from hwjax.core import _validate as validate  # argument validators shared by every package
from hwjax.core import _wide as wide
from hwjax.core._checked import checked
from hwjax.core._dot import int_dot, lhs8_dtype, u8s8_dot
from hwjax.core._float import div_rn, mul_rn, quantize_affine, to_float16
from hwjax.core._geometry import (
    ConvGeometry,
    conv_dot_kernel,
    conv_dot_patches,
    dot_width,
    extract_patches,
    pool_out_hw,
    space_to_depth,
    space_to_depth_geometry,
    space_to_depth_kernel,
    window_products_sum,
    window_taps,
)
from hwjax.core._mac import mac, mac_reference
from hwjax.core._program import (
    ONE_PASS_EXAMPLES,
    compute_once,
    eager_program,
    evaluated_if_concrete,
    map_chunks,
    one_pass,
)
from hwjax.core._stored import call_stored, compiler_options, stored_program, stored_value
from hwjax.core._surrogate import SaturationGrad
from hwjax.core._ops import (
    ROUNDING_MODES,
    fixed_mul,
    float0_zeros,
    floor_divmod_small,
    int_bounds,
    magnitude_bits,
    saturate,
    shift_right,
    unbroadcast,
)

__all__ = [
    "checked",
    "compute_once",
    "eager_program",
    "evaluated_if_concrete",
    "map_chunks",
    "ONE_PASS_EXAMPLES",
    "one_pass",
    "call_stored",
    "stored_program",
    "compiler_options",
    "stored_value",
    "ConvGeometry",
    "SaturationGrad",
    "float0_zeros",
    "floor_divmod_small",
    "unbroadcast",
    "ROUNDING_MODES",
    "div_rn",
    "quantize_affine",
    "extract_patches",
    "conv_dot_kernel",
    "conv_dot_patches",
    "dot_width",
    "fixed_mul",
    "int_bounds",
    "int_dot",
    "lhs8_dtype",
    "u8s8_dot",
    "mac",
    "mac_reference",
    "mul_rn",
    "magnitude_bits",
    "pool_out_hw",
    "space_to_depth",
    "space_to_depth_geometry",
    "space_to_depth_kernel",
    "saturate",
    "shift_right",
    "surrogate",
    "to_float16",
    "validate",
    "wide",
    "window_products_sum",
    "window_taps",
]
