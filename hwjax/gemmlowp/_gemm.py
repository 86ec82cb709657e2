"""gemmlowp's uint8 GEMM with offsets (spec §1.1) followed by an output pipeline."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import int_dot
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, ShapeError
from hwjax.gemmlowp._fixedpoint import INT32_MAX, INT32_MIN
from hwjax.gemmlowp._stages import _apply_stages, _to_i32, check_output_stages, check_stage_params

_I32 = jnp.int32


def _int_array(x: Any, name: str, what: str) -> Any:
    """``x`` as a NumPy array (a JAX array is kept) of a supported integer dtype: a wrong
    type (bool, uint32, float, complex, a ragged list...) raises ArgTypeError naming
    ``name`` and ``what`` it must be."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        a = x
    else:  # a number or a (nested) list, converted on the host (checked below even under a trace)
        try:
            a = np.asarray(x)
        except (ValueError, TypeError, OverflowError):
            a = None
        if a is None or a.dtype == object:
            raise ArgTypeError(f"{name} must be {what}, got a {type(x).__name__} that is not one")
    try:
        ok = V.kind(a, name) == "int"
    except ArgTypeError:
        ok = False
    if not ok:
        raise ArgTypeError(f"{name} must be {what}, got dtype {a.dtype}")
    return a


def check_uint8_array(x: Any, name: str) -> Any:
    """Checks an integer array holding 0..255 (an integer dtype of at most 32 bits but
    uint32; values checked when concrete, a traced non-uint8 array is the caller's
    contract). Returns a uint8 or int32 array (NumPy or JAX); the jitted programs
    convert it to int32."""
    a = _int_array(x, name, "an integer (uint8) array with values in [0, 255]")
    if a.dtype != np.uint8:
        V.check_range(a, 0, 255, name)
        if not isinstance(a, jax.core.Tracer):
            a = np.asarray(a).astype(np.uint8)
    return a


def check_uint8_matrix(x: Any, name: str) -> Any:
    """:func:`check_uint8_array` of a 2-D matrix (ShapeError otherwise)."""
    a = check_uint8_array(x, name)
    if a.ndim != 2:
        raise ShapeError(f"{name} must be a 2-D matrix, got shape {tuple(a.shape)}")
    return a


def check_offset(x: Any, length: int, name: str, per: str) -> jax.Array:
    """An int32 offset: a scalar, or a vector of ``length`` (one per ``per``).

    Returns an int32 array of shape () or (length,).
    """
    a = _int_array(x, name, f"an int32 scalar or a vector of {length} int32 values (one per {per})")
    if not isinstance(a, jax.core.Tracer):
        a = np.asarray(a)
    if a.ndim > 1 or (a.ndim == 1 and a.shape[0] != length):
        raise ShapeError(
            f"{name} must be a scalar or a vector of length {length} (one per {per}), got shape {tuple(a.shape)}"
        )
    V.check_range(a, INT32_MIN, INT32_MAX, name)
    return _to_i32(a)


def _dot_i8(a: jax.Array, b: jax.Array) -> jax.Array:
    """Exact int32 ``a @ b`` for int8 operands (:func:`hwjax.core.int_dot`)."""
    return int_dot(a, b, (((1,), (0,)), ((), ())))


def _to_int8(x: jax.Array, xmax: int) -> tuple[jax.Array, int]:
    """(int8 array, c) with ``x = int8 + c``: c = 128 when values may exceed 127."""
    c = 128 if xmax > 127 else 0
    return (x - c).astype(jnp.int8), c


def _udot(a: jax.Array, b: jax.Array, amax: int = 255, bmax: int = 255) -> jax.Array:
    """Exact ``a @ b`` (wrap32) for int32 matrices holding 0..amax and 0..bmax (<= 255):
    one int8 dot plus the rank-one corrections of any side shifted by -128."""
    a, b = a.astype(_I32), b.astype(_I32)
    a8, ca = _to_int8(a, amax)
    b8, cb = _to_int8(b, bmax)
    acc = _dot_i8(a8, b8)
    if cb:
        acc = acc + _I32(cb) * jnp.sum(a8, axis=1, dtype=_I32)[:, None]
    if ca:
        acc = acc + _I32(ca) * jnp.sum(b8, axis=0, dtype=_I32)[None, :]
    if ca and cb:
        acc = acc + _I32(ca * cb * a.shape[1])
    return acc


def offset_matmul(lhs: jax.Array, rhs: jax.Array, lhs_offset: jax.Array, rhs_offset: jax.Array) -> jax.Array:
    """``wrap32(SUM_d (lhs[r, d] + lhs_offset[r]) * (rhs[d, c] + rhs_offset[c]))``.

    ``lhs``/``rhs`` are int32 arrays holding 0..255; offsets are int32 scalars or
    vectors. Both sides are shifted by -128 into int8 (the shift is folded into the
    offsets), so the product is one int8 x int8 -> int32 integer dot plus rank-one
    corrections, all in wrapping int32 arithmetic: congruent modulo 2**32 to the exact
    sum, hence equal after wrap32. (The int8 dot's own partial sums stay below 2**31
    for depth < 2**17; beyond that XLA's int32 accumulation wraps, still congruent.)
    """
    depth = lhs.shape[1]
    lhs, rhs = lhs.astype(_I32), rhs.astype(_I32)
    lo = (lhs_offset if lhs_offset.ndim == 0 else lhs_offset[:, None]) + _I32(128)
    ro = (rhs_offset if rhs_offset.ndim == 0 else rhs_offset[None, :]) + _I32(128)
    a, _ = _to_int8(lhs, 255)
    b, _ = _to_int8(rhs, 255)
    acc = _dot_i8(a, b)
    row_sums = jnp.sum(a, axis=1, dtype=_I32)[:, None]
    col_sums = jnp.sum(b, axis=0, dtype=_I32)[None, :]
    return acc + ro * row_sums + lo * col_sums + lo * ro * _I32(depth)


def _check_gemm_shapes(lhs: jax.Array, rhs: jax.Array) -> None:
    if lhs.shape[1] != rhs.shape[0]:
        raise ShapeError(
            f"lhs is {lhs.shape[0]}x{lhs.shape[1]} (rows x depth) and rhs is "
            f"{rhs.shape[0]}x{rhs.shape[1]} (depth x cols): their depths must match"
        )
    if lhs.shape[1] == 0:
        raise ShapeError("lhs and rhs: depth must be >= 1 (gemmlowp writes no output at all when depth is 0)")


def gemm(lhs, rhs, *, lhs_offset, rhs_offset, output_stages=()) -> jax.Array:
    """gemmlowp's uint8 GEMM with offsets and an output pipeline (spec §1), bit-exact.

    Exact semantics::

        acc[r, c] = wrap32( SUM_d (lhs[r, d] + lhs_offset[r]) * (rhs[d, c] + rhs_offset[c]) )
        result    = output_stages applied left to right to acc

    An offset is the negated zero point of its operand (zero point 128 -> offset
    -128). ``wrap32`` is two's-complement reduction modulo 2**32, as upstream's int32
    arithmetic. Accumulation is one integer int8 x int8 -> int32 dot (never a float
    matmul) plus wrapping int32 rank-one corrections; results do not depend on
    ``jax_enable_x64``. Works under ``jit`` and ``vmap`` (integers only, no gradient).

    Args:
      lhs: (rows, depth) matrix of uint8 values (uint8 dtype, or another integer dtype
        holding 0..255: checked when concrete).
      rhs: (depth, cols) matrix of uint8 values.
      lhs_offset: int32 scalar, or vector of length rows (``VectorShape::Col``).
      rhs_offset: int32 scalar, or vector of length cols (``VectorShape::Row``).
      output_stages: sequence of stage objects (``QuantizeDownInt32ToUint8Scale``,
        ``QuantizeDownInt32ByFixedPoint``, ``ScaleInt32ByFixedPointAndExponent``, the
        ``...PC`` variants, ``BiasAddition``, ``Clamp``, the cast stages); a cast may
        only be the last stage. Empty: the int32 accumulators.

    Returns:
      (rows, cols) array of the last stage's type (int32 without stages or cast).

    Raises:
      TypeError / ValueError naming the argument: non-integer or non-2-D operands,
      values outside 0..255, mismatched depths, depth 0, offsets of the wrong length
      or outside int32, stage parameters out of range, a cast that is not last.
    """
    stages = check_output_stages(output_stages)
    lhs = check_uint8_matrix(lhs, "lhs")
    rhs = check_uint8_matrix(rhs, "rhs")
    _check_gemm_shapes(lhs, rhs)
    lo = check_offset(lhs_offset, lhs.shape[0], "lhs_offset", "lhs row")
    ro = check_offset(rhs_offset, rhs.shape[1], "rhs_offset", "rhs column")
    check_stage_params(stages, (lhs.shape[0], rhs.shape[1]))
    return _gemm_jit(lhs, rhs, lo, ro, stages)


@jax.jit
def _gemm_jit(lhs, rhs, lo, ro, stages):
    return _apply_stages(offset_matmul(lhs, rhs, lo, ro), stages)
