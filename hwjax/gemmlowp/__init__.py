"""gemmlowp, bit-exact: the uint8 GEMM with offsets and its output stages, the fixed-point
helpers, and the removed less-than-8-bit requantizing mode (spec: shared/spec/gemmlowp.md
§1, §2.1-§2.3, §3).

* :func:`gemm` — ``wrap32(SUM (lhs + lhs_offset) * (rhs + rhs_offset))`` then an output
  pipeline of stage objects (frozen dataclasses, JAX pytrees).
* :func:`srdhm` (ties toward +inf), :func:`rounding_divide_by_pot` (ties away from
  zero), :func:`rounding_multiply_by_constant_fraction`: exact for all int32 without x64.
* :func:`gemm_lt8` — gemmlowp bc3491e's L<8 / R<8 GEMM (x86_64 scalar reference build,
  one thread): fallback, depth-based rounding mode, packing-order offsets, rescaling.
  :func:`requantize`, :func:`xorshift_offsets`, :func:`addmod_offsets`, :func:`pack_lt8`,
  presets :data:`A8B8`, :data:`A5B7` (= :data:`L7R5`).
"""

from hwjax.gemmlowp._fixedpoint import (
    rmcf_constants,
    rounding_divide_by_pot,
    rounding_multiply_by_constant_fraction,
    shift_left,
    srdhm,
    srdhm_int16,
)
from hwjax.gemmlowp._gemm import gemm
from hwjax.gemmlowp._lt8 import (
    A5B7,
    A8B8,
    DEFAULT_STRATEGY,
    L7R5,
    L8R8,
    MODES,
    PROBABILISTIC_THRESHOLD,
    BitDepthParams,
    RoundingStrategy,
    addmod_offsets,
    block_params,
    check_uint16_accumulators,
    eight_bit_int_gemm,
    gemm_lt8,
    is_requantization_worth_it,
    nearest_offsets,
    pack_lt8,
    requantize,
    rounding_mode,
    rounding_offsets,
    uint16_lane_capacity,
    xorshift_offsets,
)
from hwjax.gemmlowp._stages import (
    BiasAddition,
    Clamp,
    QuantizeDownInt32ByFixedPoint,
    QuantizeDownInt32ToUint8Scale,
    QuantizeDownInt32ToUint8ScalePC,
    SaturatingCastToInt8,
    SaturatingCastToInt16,
    SaturatingCastToUint8,
    ScaleInt32ByFixedPointAndExponent,
    ScaleInt32ByFixedPointAndExponentPC,
    TruncatingCastToUint8,
    apply_output_stages,
)

__all__ = [
    "A5B7",
    "A8B8",
    "BiasAddition",
    "BitDepthParams",
    "Clamp",
    "DEFAULT_STRATEGY",
    "L7R5",
    "L8R8",
    "MODES",
    "PROBABILISTIC_THRESHOLD",
    "QuantizeDownInt32ByFixedPoint",
    "QuantizeDownInt32ToUint8Scale",
    "QuantizeDownInt32ToUint8ScalePC",
    "RoundingStrategy",
    "SaturatingCastToInt16",
    "SaturatingCastToInt8",
    "SaturatingCastToUint8",
    "ScaleInt32ByFixedPointAndExponent",
    "ScaleInt32ByFixedPointAndExponentPC",
    "TruncatingCastToUint8",
    "addmod_offsets",
    "apply_output_stages",
    "block_params",
    "check_uint16_accumulators",
    "eight_bit_int_gemm",
    "gemm",
    "gemm_lt8",
    "is_requantization_worth_it",
    "nearest_offsets",
    "pack_lt8",
    "requantize",
    "rmcf_constants",
    "rounding_divide_by_pot",
    "rounding_mode",
    "rounding_multiply_by_constant_fraction",
    "rounding_offsets",
    "shift_left",
    "srdhm",
    "srdhm_int16",
    "uint16_lane_capacity",
    "xorshift_offsets",
]
