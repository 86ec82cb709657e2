"""Exact integer dot products: the one place where hwjax multiplies integer matrices.

Every integer matrix product in hwjax (``mac``'s dots, the gemmlowp GEMM, the TFLite
and NVDLA convolution and fully-connected kernels) goes through :func:`int_dot`, so
that the way a dot is made exact on each backend is decided here and nowhere else:

* ``route="int"``: one integer ``dot_general`` with int32 accumulation. On GPU the
  operands are first widened to int32: XLA's GPU int8 x int8 -> int32 dot (cuBLAS)
  returned exactly twice the true sums in jax/jaxlib 0.11.2 on an H100 (measured with
  ``scripts/gpu_diff.py``), so hwjax never hands XLA an 8-bit integer dot there.
* ``route="float"``: the contraction is cut into pieces of at most
  ``2**24 >> prod_bits`` products, each piece a float32 ``dot_general`` at
  ``precision=HIGHEST`` (no TF32), so every partial sum is an integer below ``2**24``
  and exact in float32 whatever the summation order; the pieces are added in int32.
* ``route="auto"``: ``"float"`` on GPU, ``"int"`` elsewhere.

Every route gives the same int32 result: the exact sum, wrapped modulo ``2**32`` where
it does not fit int32 (callers prove or document that it fits).
"""

from __future__ import annotations

from typing import Literal, Sequence

import jax
import jax.numpy as jnp

from hwjax.core import _validate as V
from hwjax.core._program import eager_program
from hwjax.core._ops import magnitude_bits
from hwjax.errors import ArgTypeError, ShapeError

Route = Literal["auto", "int", "float"]
DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]

_I32 = jnp.int32
_DTYPES = tuple(jnp.dtype(t) for t in (jnp.int8, jnp.uint8, jnp.int16, jnp.uint16, jnp.int32))
F32_EXACT = 2**24  # every integer of magnitude <= 2**24 is exact in float32
FLOAT_PROD_BITS = 24  # the float route needs every product exact in float32


def default_route(route: str) -> str:
    """``route`` with ``"auto"`` resolved for the default backend (``"float"`` on GPU)."""
    V.check_choice(route, ("auto", "int", "float"), "route")
    if route == "auto":
        return "float" if jax.default_backend() == "gpu" else "int"
    return route


def exact_dot(x: jax.Array, w: jax.Array, dims: DimensionNumbers, route: str, prod_bits: int) -> jax.Array:
    """:func:`int_dot` without argument checks, for callers that checked already.

    ``route`` is ``"int"`` or ``"float"`` (resolved); ``prod_bits``: every product's
    magnitude is at most ``2**prod_bits``; the float route needs ``prod_bits <= 24`` and
    one contracting dimension, and falls back to the integer route otherwise.
    """
    (cx, cw), _ = dims
    if route == "int" or prod_bits > FLOAT_PROD_BITS or len(cx) != 1:
        if jax.default_backend() == "gpu":
            x, w = x.astype(_I32), w.astype(_I32)
        return jax.lax.dot_general(x, w, dims, preferred_element_type=_I32)
    ax, aw = cx[0] % x.ndim, cw[0] % w.ndim
    k = x.shape[ax]
    kb = max(1, F32_EXACT >> prod_bits)
    out = None
    for s0 in range(0, max(k, 1), kb):
        xs = jax.lax.slice_in_dim(x, s0, min(k, s0 + kb), axis=ax).astype(jnp.float32)
        ws = jax.lax.slice_in_dim(w, s0, min(k, s0 + kb), axis=aw).astype(jnp.float32)
        part = jax.lax.dot_general(xs, ws, dims, precision=jax.lax.Precision.HIGHEST).astype(_I32)
        out = part if out is None else out + part
    return out


def int_dot(x, w, dimension_numbers: DimensionNumbers, *, route: Route = "auto") -> jax.Array:
    """Exact int32 ``jax.lax.dot_general(x, w, dimension_numbers)`` of integer arrays.

    ``x`` and ``w``: int8, uint8, int16, uint16 or int32 arrays, or int64 arrays (lists,
    NumPy integers) holding int32 values (RangeError otherwise when concrete); ArgTypeError
    for any other type.
    Returns the int32 array of ``dot_general``'s shape holding the exact sums of products,
    wrapped modulo ``2**32`` where a sum does not fit int32. ``route``: see the module
    docstring; every route gives the same bits on every backend. The float route applies
    when every product fits 24 bits (8-bit x 8-bit, 16-bit x 8-bit) and there is one
    contracting dimension; otherwise the integer route is used. No gradient (integer
    inputs). Works under ``jit`` and ``vmap``.

    Example::

        >>> int_dot(np.int8([[1, -2]]), np.int8([[3], [4]]), (((1,), (0,)), ((), ())))
        Array([[-5]], dtype=int32)
    """
    x, w = V.as_array(x, "x"), V.as_array(w, "w")
    bits = []
    ops = []
    for a, name in ((x, "x"), (w, "w")):
        if a.dtype == jnp.int64:  # NumPy's default integers (or jax_enable_x64): int32 values
            V.check_range(a, -(2**31), 2**31 - 1, name)
            a = a.astype(_I32)
        ops.append(a)
        if a.dtype not in _DTYPES:
            raise ArgTypeError(f"{name} must be an int8, uint8, int16, uint16 or int32 array, got {a.dtype}")
        bits.append(magnitude_bits(a.dtype))
    x, w = ops
    try:
        (cx, cw), (bx, bw) = dimension_numbers
        cx, cw, bx, bw = (tuple(int(i) for i in t) for t in (cx, cw, bx, bw))
    except (TypeError, ValueError):
        raise ShapeError(
            f"dimension_numbers must be ((x_contract, w_contract), (x_batch, w_batch)), got {dimension_numbers!r}"
        ) from None
    for axes, a, name in ((cx + bx, x, "x"), (cw + bw, w, "w")):
        if any(not -a.ndim <= i < a.ndim for i in axes):
            raise ShapeError(f"dimension_numbers name axes {axes} outside {name}'s {a.ndim} dimensions")
    if len(cx) != len(cw) or len(bx) != len(bw) or [x.shape[i] for i in cx + bx] != [w.shape[i] for i in cw + bw]:
        raise ShapeError(
            f"dimension_numbers {dimension_numbers!r} pair axes of different sizes: x {x.shape}, w {w.shape}"
        )
    return _int_dot(x, w, dims=((cx, cw), (bx, bw)), route=default_route(route), prod_bits=bits[0] + bits[1])


@eager_program(static_argnames=("dims", "route", "prod_bits"))
def _int_dot(x, w, *, dims, route: str, prod_bits: int) -> jax.Array:
    """:func:`int_dot` after its checks (one program when called eagerly)."""
    return exact_dot(x, w, dims, route, prod_bits)


__all__ = ["int_dot", "default_route", "exact_dot", "F32_EXACT", "FLOAT_PROD_BITS"]
