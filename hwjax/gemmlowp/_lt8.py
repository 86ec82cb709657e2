"""gemmlowp's removed less-than-8-bit requantizing mode (spec §3, gemmlowp bc3491e, 2017).

Conformance profile (spec §3.1): the x86_64 scalar reference build, one thread: scalar
offset generators, reference kernel with 4x4 cells, two cells per side. Nearest-mode
results are independent of the profile; probabilistic ones depend on the packing order
reproduced here (§3.7, §3.8).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, HwjaxError, RangeError
from hwjax.gemmlowp._fixedpoint import INT32_MAX, INT32_MIN, _rmcf_int
from hwjax.gemmlowp._gemm import (
    _check_gemm_shapes,
    _gemm_jit,
    _udot,
    check_offset,
    check_uint8_array,
    check_uint8_matrix,
)
from hwjax.gemmlowp._stages import (
    QuantizeDownInt32ToUint8Scale,
    SaturatingCastToUint8,
    _apply_stages,
    _scalar,
    check_output_stages,
    check_stage_params,
)

_I32 = jnp.int32
MODES: tuple[str, ...] = ("nearest", "xorshift", "addmod")
PROBABILISTIC_THRESHOLD = 384
KERNEL_WIDTH = 8  # cells of 4 x 4, two cells per side (reference kernel)
L1_CACHE = 32768  # gemmlowp x86_64 constants (internal/common.h)
L2_CACHE = 4194304


# ---------------------------------------------------------------------------- parameters


@dataclasses.dataclass(frozen=True)
class RoundingStrategy:
    """gemmlowp ``RoundingStrategy``: ``small`` below ``threshold`` (accumulation depth),
    ``large`` at or above it. Modes: ``"nearest"``, ``"xorshift"``, ``"addmod"``."""

    small: str = "nearest"
    large: str = "addmod"
    threshold: int = PROBABILISTIC_THRESHOLD

    def __post_init__(self):
        V.check_choice(self.small, MODES, "RoundingStrategy.small")
        V.check_choice(self.large, MODES, "RoundingStrategy.large")
        V.check_static_int(self.threshold, 0, 2**31 - 1, "RoundingStrategy.threshold")

    def mode(self, depth: int) -> str:
        """The mode both sides use for accumulation depth ``depth`` (spec §3.4)."""
        return self.small if depth < self.threshold else self.large


#: ``DefaultRoundingStrategyForLessThan8Bit``: Nearest below depth 384, AddMod from 384.
DEFAULT_STRATEGY = RoundingStrategy("nearest", "addmod", PROBABILISTIC_THRESHOLD)


def _strategy(rounding: Any) -> RoundingStrategy:
    if isinstance(rounding, RoundingStrategy):
        return rounding
    if rounding == "auto":
        return DEFAULT_STRATEGY
    if isinstance(rounding, str) and rounding in MODES:
        return RoundingStrategy(rounding, rounding, 0)
    raise RangeError(f"rounding must be 'auto', one of {MODES} or a RoundingStrategy, got {rounding!r}")


@dataclasses.dataclass(frozen=True)
class BitDepthParams:
    """Bit depths of the two operands (1..8; 8 = unchanged) and the rounding strategy.

    ``rounding`` is ``"auto"`` (:data:`DEFAULT_STRATEGY`), a fixed mode, a
    :class:`RoundingStrategy`, or ``"exact"`` (only with 8 bits on both sides).
    """

    lhs_bits: int
    rhs_bits: int
    rounding: Union[str, RoundingStrategy] = "auto"

    def __post_init__(self):
        V.check_static_int(self.lhs_bits, 1, 8, "lhs_bits")
        V.check_static_int(self.rhs_bits, 1, 8, "rhs_bits")
        if self.rounding == "exact" and (self.lhs_bits, self.rhs_bits) != (8, 8):
            raise RangeError("rounding='exact' requires lhs_bits == rhs_bits == 8")
        if self.rounding != "exact":
            _strategy(self.rounding)


#: ``DefaultL8R8BitDepthParams`` (EightBitIntGemm ``A8B8``): exact 8-bit.
A8B8 = BitDepthParams(8, 8, "exact")
L8R8 = A8B8
#: ``DefaultL7R5BitDepthParams`` (EightBitIntGemm ``A5B7``): lhs ``a`` 7 bits, rhs ``b``
#: 5 bits (the upstream header comment says the reverse; the code does this, spec L6).
A5B7 = BitDepthParams(7, 5, "auto")
L7R5 = A5B7


def rounding_mode(depth: int, rounding: Any = "auto") -> str:
    """The rounding mode gemmlowp applies to both sides for accumulation depth ``depth``
    (spec §3.4): with ``"auto"``, ``"nearest"`` below 384 and ``"addmod"`` from 384."""
    depth = V.check_static_int(depth, 0, 2**31 - 1, "depth")
    return _strategy(rounding).mode(depth)


def is_requantization_worth_it(rows: int, cols: int) -> bool:
    """gemmlowp ``IsRequantizationWorthIt`` (spec §3.3): ``2*rows*cols >= 100*(rows+cols)``.

    When false, gemmlowp silently runs the exact 8-bit GEMM instead (every GEMV, and
    square products below 100 x 100)."""
    rows = V.check_static_int(rows, 0, 2**31 - 1, "rows")
    cols = V.check_static_int(cols, 0, 2**31 - 1, "cols")
    return 2 * rows * cols >= 100 * (rows + cols)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rup(a: int, n: int) -> int:
    return _cdiv(a, n) * n


def block_params(
    rows: int, depth: int, cols: int, *, l1_cache: int = L1_CACHE, l2_cache: int = L2_CACHE
) -> tuple[int, int, int, int, int, int]:
    """gemmlowp ``BlockParams::Init`` for one thread and kernel width 8 on both sides
    (spec §3.7): ``(l2_rows, l2_cols, l2_depth, l1_rows, l1_cols, l1_depth)``.

    Only ``l1_depth`` (depth sub-blocks of a packing call) and ``l2_cols`` (RHS packed in
    several calls when ``l2_cols < cols``) influence which offset each element gets.
    """
    for v, n in ((rows, "rows"), (depth, "depth"), (cols, "cols"), (l1_cache, "l1_cache"), (l2_cache, "l2_cache")):
        V.check_static_int(v, 1, 2**31 - 1, n)
    l2_depth = _rup(depth, 16)
    l2_cols = _rup(_cdiv(cols, max(1, _cdiv(cols, max(1, l2_cache // l2_depth)))), 8)
    l2_rows = _rup(rows, 8)  # the L2 RHS factor is 1.0 on x86_64
    l1_cols = l2_cols
    l1_depth = _rup(_cdiv(l2_depth, max(1, _cdiv(l2_depth, max(1, (l1_cache - 4 * 8 * 8) // (8 + 8))))), 16)
    l1_rows = _rup(_cdiv(l2_rows, max(1, _cdiv(l2_rows, max(1, l1_cache // (l1_depth + 4 * l1_cols))))), 8)
    return l2_rows, l2_cols, l2_depth, l1_rows, l1_cols, l1_depth


# ----------------------------------------------------------------------------- generators


def _xorshift_period() -> np.ndarray:
    """The first period (255 values) of the scalar Xorshift generator (spec §3.6)."""
    x, out = 128, []
    for _ in range(255):
        out.append(x - 1)
        x ^= (x << 7) & 0xFF
        x ^= x >> 5
        x ^= (x << 3) & 0xFF
    assert x == 128  # period 255
    return np.asarray(out, np.int32)


_XORSHIFT = _xorshift_period()


def _check_n(n: Any) -> int:
    return V.check_static_int(n, 0, 2**31 - 1, "n")


def xorshift_offsets(n: int) -> jax.Array:
    """The first ``n`` values of gemmlowp's scalar ``ProbabilisticXorshift`` generator.

    State: uint8 ``x`` starting at 128; ``get()`` returns ``x - 1`` then updates
    ``x ^= x << 7; x ^= x >> 5; x ^= x << 3`` (on 8 bits). Period 255, values 0..254:
    127, 163, 168, 103, 50, ... Returns int32 (n,).
    """
    n = _check_n(n)
    return jax.device_put(_XORSHIFT[np.arange(n) % 255])  # host values: transferred, not compiled


def addmod_offsets(n: int) -> jax.Array:
    """The first ``n`` values of gemmlowp's scalar ``ProbabilisticAddmod`` generator:
    ``x`` starts at 1, ``get()`` first updates ``x = (x + 97) mod 255`` then returns it,
    so value k is ``(98 + 97*k) mod 255``: 98, 195, 37, 134, ... Returns int32 (n,)."""
    n = _check_n(n)
    return jax.device_put(((98 + 97 * (np.arange(n, dtype=np.int64) % 255)) % 255).astype(np.int32))


def nearest_offsets(n: int) -> jax.Array:
    """The ``Nearest`` "generator": always 127. Returns int32 (n,)."""
    return jax.device_put(np.full((_check_n(n),), 127, np.int32))


def rounding_offsets(mode: str, n: int) -> jax.Array:
    """The first ``n`` offsets of a fresh generator of ``mode`` (``"nearest"``,
    ``"xorshift"`` or ``"addmod"``)."""
    V.check_choice(mode, MODES, "mode")
    return {"nearest": nearest_offsets, "xorshift": xorshift_offsets, "addmod": addmod_offsets}[mode](n)


def _offsets_at(index: jax.Array, mode: str) -> jax.Array:
    """Offset of draw number ``index`` (int32 array, >= 0) of a fresh generator."""
    if mode == "nearest":
        return jnp.full(index.shape, 127, _I32)
    k = index % _I32(255)
    if mode == "addmod":
        return (_I32(98) + _I32(97) * k) % _I32(255)
    return jnp.take(jnp.asarray(_XORSHIFT), k, mode="clip")


def _requantize_values(v: jax.Array, bits: int, offsets: jax.Array) -> jax.Array:
    """``floor((v*M + o) / 255)`` (spec §3.5), int32 in, int32 out."""
    m = 2**bits - 1
    return (v * _I32(m) + offsets) // _I32(255)


def requantize(x, bits: int, *, mode: str) -> jax.Array:
    """gemmlowp's ``Requantize`` of uint8 values to ``bits`` bits (spec §3.5), with one
    fresh generator of ``mode`` consumed over ``x`` in row-major (C) order.

    For element number ``k`` (flat row-major index) with value ``v``::

        out = floor((v * (2**bits - 1) + o_k) / 255)          o_k = k-th generator value

    (``"nearest"``: ``o = 127``, the exact nearest integer of ``v*M/255``;
    ``"xorshift"``/``"addmod"``: see :func:`xorshift_offsets`, :func:`addmod_offsets`).
    ``bits == 8`` returns ``x`` unchanged and does not use the generator. Under
    ``vmap`` every mapped element gets its own fresh generator.

    Args:
      x: integer array holding 0..255 (uint8, or checked when concrete).
      bits: static, 1..8.
      mode: ``"nearest"``, ``"xorshift"`` or ``"addmod"``.

    Returns:
      uint8 array of ``x``'s shape with values in 0..2**bits - 1.
    """
    bits = V.check_static_int(bits, 1, 8, "bits")
    V.check_choice(mode, MODES, "mode")
    a = check_uint8_array(x, "x")
    return _requantize_jit(a, np.int32(bits), np.int32(MODES.index(mode)))


@jax.jit
def _requantize_jit(a, bits: jax.Array, mode_index: jax.Array) -> jax.Array:
    """Bit depth and mode are traced (one compilation per shape). With ``bits == 8``
    the formula gives ``floor((255*v + o) / 255) = v`` since ``o <= 254``: the identity."""
    v = a.astype(_I32)
    k = jax.lax.broadcasted_iota(_I32, (max(v.size, 1),), 0)[: v.size].reshape(v.shape)
    offsets = jnp.stack([_offsets_at(k, m) for m in MODES])
    o = jnp.take(offsets, mode_index, axis=0)
    m = (_I32(1) << bits) - _I32(1)
    return ((v * m + o) // _I32(255)).astype(jnp.uint8)


# ------------------------------------------------------------------------ packing order


def _draw_index(w: jax.Array, d: jax.Array, wp: Any, depth: int, l1_depth: int) -> jax.Array:
    """0-based generator draw number of element (w, d) of one packing call (spec §3.8
    closed form); ``wp`` = rup8 of the width of that call (scalar or array)."""
    d0 = (d // l1_depth) * l1_depth
    krd = ((jnp.minimum(l1_depth, depth - d0) + 15) // 16) * 16
    dd = d - d0
    return (
        wp * d0
        + (w // 8) * 8 * krd
        + (dd // 16) * 128
        + ((dd % 16) // 4) * 32
        + ((w % 8) // 4) * 16
        + (w % 4) * 4
        + (d % 4)
    )


def _pack_side(v: jax.Array, bits: int, mode: str, side: str, l1_depth: int, l2_width: int) -> jax.Array:
    """Requantized values of one operand exactly as gemmlowp packs it (natural
    orientation, int32): fresh generator per packing call, traversal of spec §3.8."""
    if bits == 8:
        return v
    if mode == "nearest":
        return _requantize_values(v, bits, jnp.full(v.shape, 127, _I32))
    if side == "lhs":  # one packing call: l2_rows = rup8(rows) >= rows
        width, depth = v.shape
        w = jax.lax.broadcasted_iota(_I32, v.shape, 0)
        d = jax.lax.broadcasted_iota(_I32, v.shape, 1)
        index = _draw_index(w, d, _rup(width, 8), depth, l1_depth)
    else:  # RHS: one packing call per block of l2_width columns
        depth, width = v.shape
        d = jax.lax.broadcasted_iota(_I32, v.shape, 0)
        c = jax.lax.broadcasted_iota(_I32, v.shape, 1)
        c0 = (c // l2_width) * l2_width
        wp = ((jnp.minimum(l2_width, width - c0) + 7) // 8) * 8
        index = _draw_index(c - c0, d, wp, depth, l1_depth)
    return _requantize_values(v, bits, _offsets_at(index, mode))


def _check_bits(lhs_bits, rhs_bits, bit_depth, rounding):
    if bit_depth is not None:
        if not isinstance(bit_depth, BitDepthParams):
            raise ArgTypeError(f"bit_depth must be a BitDepthParams (e.g. A5B7, A8B8), got {bit_depth!r}")
        if lhs_bits is not None and lhs_bits != bit_depth.lhs_bits:
            raise RangeError(f"lhs_bits={lhs_bits} contradicts bit_depth.lhs_bits={bit_depth.lhs_bits}")
        if rhs_bits is not None and rhs_bits != bit_depth.rhs_bits:
            raise RangeError(f"rhs_bits={rhs_bits} contradicts bit_depth.rhs_bits={bit_depth.rhs_bits}")
        lhs_bits, rhs_bits = bit_depth.lhs_bits, bit_depth.rhs_bits
        if rounding == "auto":
            rounding = bit_depth.rounding
    if lhs_bits is None or rhs_bits is None:
        raise ArgTypeError("give lhs_bits and rhs_bits (1..8), or bit_depth=A5B7 / A8B8 / BitDepthParams(...)")
    lhs_bits = V.check_static_int(lhs_bits, 1, 8, "lhs_bits")
    rhs_bits = V.check_static_int(rhs_bits, 1, 8, "rhs_bits")
    if rounding == "exact":
        if (lhs_bits, rhs_bits) != (8, 8):
            raise RangeError("rounding='exact' requires lhs_bits == rhs_bits == 8")
    else:
        _strategy(rounding)
    return lhs_bits, rhs_bits, rounding


def pack_lt8(
    lhs,
    rhs,
    *,
    lhs_bits: int | None = None,
    rhs_bits: int | None = None,
    rounding: Any = "auto",
    bit_depth: BitDepthParams | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The requantized operands exactly as gemmlowp's ``PackLhs``/``PackRhs`` produce them
    when requantization is applied (spec §3.5-§3.8), in natural orientation.

    The mode is chosen from the depth (:func:`rounding_mode`); each packing call draws
    from a fresh generator in the cell order of §3.8 (ragged widths and depths are
    zero-padded and the padding consumes draws); a side with 8 bits is unchanged. This
    does not apply the :func:`is_requantization_worth_it` fallback (``gemm_lt8`` does).

    Returns:
      ``(lhs_packed, rhs_packed)``: uint8 (rows, depth) in 0..2**lhs_bits - 1 and uint8
      (depth, cols) in 0..2**rhs_bits - 1.
    """
    lhs_bits, rhs_bits, rounding = _check_bits(lhs_bits, rhs_bits, bit_depth, rounding)
    lhs = check_uint8_matrix(lhs, "lhs")
    rhs = check_uint8_matrix(rhs, "rhs")
    _check_gemm_shapes(lhs, rhs)
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    if rows == 0 or cols == 0 or rounding == "exact":
        return jnp.asarray(lhs, jnp.uint8), jnp.asarray(rhs, jnp.uint8)
    return _pack_jit(lhs, rhs, lhs_bits, rhs_bits, _strategy(rounding).mode(depth), block_params(rows, depth, cols))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _pack_jit(lhs, rhs, lhs_bits, rhs_bits, mode, bp):
    _, l2_cols, _, _, _, l1_depth = bp
    pl = _pack_side(lhs.astype(_I32), lhs_bits, mode, "lhs", l1_depth, _rup(lhs.shape[0], 8))
    pr = _pack_side(rhs.astype(_I32), rhs_bits, mode, "rhs", l1_depth, l2_cols)
    return pl.astype(jnp.uint8), pr.astype(jnp.uint8)


# -------------------------------------------------------------------- uint16 accumulators


def uint16_lane_capacity(lhs_bits: int, rhs_bits: int) -> int:
    """Most products of an ``lhs_bits`` x ``rhs_bits`` operand pair that one unsigned
    16-bit lane can accumulate without wrapping: ``floor(65535 / ((2**L-1)*(2**R-1)))``
    (spec §3.9; at least the ``2**(16-(L+R))`` of the spec's rule)."""
    lb = V.check_static_int(lhs_bits, 1, 8, "lhs_bits")
    rb = V.check_static_int(rhs_bits, 1, 8, "rhs_bits")
    return 65535 // ((2**lb - 1) * (2**rb - 1))


def check_uint16_accumulators(lhs_bits: int, rhs_bits: int, products_per_lane: int) -> None:
    """Raises ValueError unless ``products_per_lane`` products of the given bit depths fit
    an unsigned 16-bit local accumulator (spec §3.9). gemmlowp's ARMv7 NEON kernel for
    ``L + R <= 12`` feeds 16 products per lane (16 * 127 * 31 = 62992 for L7R5)."""
    n = V.check_static_int(products_per_lane, 1, 2**31 - 1, "products_per_lane")
    cap = uint16_lane_capacity(lhs_bits, rhs_bits)
    if n > cap:
        worst = n * (2**lhs_bits - 1) * (2**rhs_bits - 1)
        raise RangeError(
            f"uint16 local accumulators overflow: products_per_lane={n} products of {lhs_bits}-bit x "
            f"{rhs_bits}-bit operands "
            f"reach {n} * {2**lhs_bits - 1} * {2**rhs_bits - 1} = {worst} > 65535; at most {cap} products "
            f"per uint16 lane are safe for these bit depths"
        )


# ----------------------------------------------------------------------------- the GEMM


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8))
def _lt8_jit(lhs, rhs, lo, ro, stages, lhs_bits, rhs_bits, mode, bp):
    return _apply_stages(_lt8_acc(lhs, rhs, lo, ro, lhs_bits, rhs_bits, mode, bp), stages)


def _lt8_acc(lhs, rhs, lo, ro, lhs_bits, rhs_bits, mode, bp):
    """int32 accumulator of the requantized GEMM (spec §3.9, §3.10)."""
    rows, depth = lhs.shape
    lhs, rhs = lhs.astype(_I32), rhs.astype(_I32)
    _, l2_cols, _, _, _, l1_depth = bp
    ml, mr = 2**lhs_bits - 1, 2**rhs_bits - 1
    pl = _pack_side(lhs, lhs_bits, mode, "lhs", l1_depth, _rup(rows, 8))
    pr = _pack_side(rhs, rhs_bits, mode, "rhs", l1_depth, l2_cols)
    raw_xx = _udot(pl, pr, ml, mr)
    row_sums = jnp.sum(pl, axis=1, dtype=_I32)[:, None]
    col_sums = jnp.sum(pr, axis=0, dtype=_I32)[None, :]
    lo2 = lo if lo.ndim == 0 else lo[:, None]
    ro2 = ro if ro.ndim == 0 else ro[None, :]
    term_xx = _rmcf_int(raw_xx, 255 * 255, ml * mr)
    term_x1 = _rmcf_int(row_sums * ro2, 255, ml)
    term_1x = _rmcf_int(col_sums * lo2, 255, mr)
    term_11 = lo2 * ro2 * _I32(depth)
    return term_xx + term_x1 + term_1x + term_11


def gemm_lt8(
    lhs,
    rhs,
    *,
    lhs_offset,
    rhs_offset,
    lhs_bits: int | None = None,
    rhs_bits: int | None = None,
    rounding: Any = "auto",
    result_offset=None,
    result_mult_int=None,
    result_shift=None,
    bit_depth: BitDepthParams | None = None,
    output_stages=None,
    uint16_lane_products: int | None = None,
) -> jax.Array:
    """gemmlowp's less-than-8-bit GEMM (``Gemm<uint8, BitDepthParams>`` at bc3491e),
    bit for bit (spec §3.12, x86_64 scalar reference build, one thread).

    1. If ``2*rows*cols < 100*(rows+cols)`` (:func:`is_requantization_worth_it`), the
       requested bit depths are ignored: exact 8-bit GEMM (spec §1.1). Also when both
       sides have 8 bits.
    2. Mode for both sides: ``rounding`` (``"auto"`` = Nearest below depth 384,
       ProbabilisticAddmod from 384; a fixed mode; or a :class:`RoundingStrategy`).
    3. Each side with ``B < 8`` bits is requantized, ``P = floor((v*(2**B-1) + o)/255)``,
       with a fresh generator per packing call consumed in gemmlowp's packing order
       (:func:`pack_lt8`; ragged shapes and depth sub-blocks included).
    4. ``raw_xx = P_L @ P_R`` exactly (one integer dot), and with the caller's 8-bit
       offsets, ``M_L = 2**L-1``, ``M_R = 2**R-1``, ``K = depth``::

           acc = wrap32( RMCF(raw_xx, 65025, M_L*M_R)
                         + RMCF(wrap32(rowsum(P_L)[r] * rhs_offset[c]), 255, M_L)
                         + RMCF(wrap32(colsum(P_R)[c] * lhs_offset[r]), 255, M_R)
                         + wrap32(lhs_offset[r] * rhs_offset[c] * K) )

       with ``RMCF`` = :func:`rounding_multiply_by_constant_fraction`.
    5. Output: with ``result_offset``, ``result_mult_int``, ``result_shift`` (all three)
       the legacy pipeline ``clamp(RDBPOT(wrap32(wrap32(acc + result_offset) *
       result_mult_int), result_shift), 0, 255)`` as uint8; with ``output_stages`` that
       pipeline; otherwise the int32 ``acc``.

    Args:
      lhs: (rows, depth) uint8 values. rhs: (depth, cols) uint8 values.
      lhs_offset, rhs_offset: int32 scalars, or vectors of length rows / cols.
      lhs_bits, rhs_bits: static, 1..8 (or from ``bit_depth``).
      rounding: ``"auto"``, ``"nearest"``, ``"xorshift"``, ``"addmod"``, a
        :class:`RoundingStrategy`, or ``"exact"`` (8/8 only).
      result_offset, result_mult_int, result_shift: legacy output stage (int32,
        int32, 0..31).
      bit_depth: a :class:`BitDepthParams` preset (``A5B7`` = L7R5, ``A8B8``) instead
        of the two bit depths; its strategy applies when ``rounding == "auto"``.
      output_stages: an output pipeline (see :func:`gemm`) instead of the legacy stage.
      uint16_lane_products: if given, check that a kernel accumulating this many
        products per unsigned 16-bit lane (gemmlowp's ARMv7 NEON kernel: 16) cannot
        overflow for these bit depths; raises ValueError with the bound otherwise. The
        result is unchanged (within the bound the local sums are exact).

    Returns:
      (rows, cols) int32 accumulators, uint8 with the legacy stage, or the pipeline's type.

    Works under ``jit`` (bit depths, rounding and shapes static; offsets and output
    parameters may be traced) and ``vmap`` (each mapped GEMM with its own fresh
    generators, as separate gemmlowp calls). Integers only, no gradient.
    """
    lhs_bits, rhs_bits, rounding = _check_bits(lhs_bits, rhs_bits, bit_depth, rounding)
    legacy = (result_offset, result_mult_int, result_shift)
    if any(v is not None for v in legacy):
        if any(v is None for v in legacy):
            raise RangeError("give all three of result_offset, result_mult_int, result_shift, or none")
        if output_stages is not None:
            raise RangeError(
                "give either the legacy result_offset/result_mult_int/result_shift or output_stages, not both"
            )
        stages = (QuantizeDownInt32ToUint8Scale(result_offset, result_mult_int, result_shift), SaturatingCastToUint8())
    else:
        stages = () if output_stages is None else output_stages
    stages = check_output_stages(stages)
    if uint16_lane_products is not None:
        try:
            check_uint16_accumulators(lhs_bits, rhs_bits, uint16_lane_products)
        except HwjaxError as e:  # the argument is called uint16_lane_products here
            raise type(e)(str(e).replace("products_per_lane", "uint16_lane_products")) from None
    lhs = check_uint8_matrix(lhs, "lhs")
    rhs = check_uint8_matrix(rhs, "rhs")
    _check_gemm_shapes(lhs, rhs)
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    lo = check_offset(lhs_offset, rows, "lhs_offset", "lhs row")
    ro = check_offset(rhs_offset, cols, "rhs_offset", "rhs column")
    exact = (
        rounding == "exact"
        or (lhs_bits, rhs_bits) == (8, 8)
        or rows == 0
        or cols == 0
        or not is_requantization_worth_it(rows, cols)
    )
    check_stage_params(stages, (rows, cols))
    if exact:
        return _gemm_jit(lhs, rhs, lo, ro, stages)
    return _lt8_jit(
        lhs, rhs, lo, ro, stages, lhs_bits, rhs_bits, _strategy(rounding).mode(depth), block_params(rows, depth, cols)
    )


def eight_bit_int_gemm(
    a, b, *, a_offset, b_offset, c_offset, c_mult_int, c_shift, bit_depth: BitDepthParams = A8B8
) -> jax.Array:
    """gemmlowp's legacy ``EightBitIntGemm`` (spec §1.4) in natural orientation: ``a`` is
    the lhs (m x k), ``b`` the rhs (k x n), the legacy uint8 output stage, and
    ``bit_depth`` ``A8B8`` (exact) or ``A5B7`` (``a`` 7 bits, ``b`` 5 bits, with the
    fallback and depth rule of :func:`gemm_lt8`). Storage order does not matter."""
    if not isinstance(bit_depth, BitDepthParams):
        raise ArgTypeError(f"bit_depth must be a BitDepthParams (e.g. A5B7, A8B8), got {bit_depth!r}")
    # checked here under the names of this function (gemm_lt8 would name lhs, lhs_offset, result_shift...)
    a_u8 = check_uint8_matrix(a, "a")
    b_u8 = check_uint8_matrix(b, "b")
    check_offset(a_offset, a_u8.shape[0], "a_offset", "row of a")
    check_offset(b_offset, b_u8.shape[1], "b_offset", "column of b")
    _scalar(c_offset, INT32_MIN, INT32_MAX, "c_offset")
    _scalar(c_mult_int, INT32_MIN, INT32_MAX, "c_mult_int")
    _scalar(c_shift, 0, 31, "c_shift")
    return gemm_lt8(
        a,
        b,
        lhs_offset=a_offset,
        rhs_offset=b_offset,
        bit_depth=bit_depth,
        result_offset=c_offset,
        result_mult_int=c_mult_int,
        result_shift=c_shift,
    )
