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

On CPU the integer route hands XLA its fastest 8-bit form. XLA:CPU runs an int8 x int8
dot in YNNPACK's AVX-512 kernels (sign-extended products) and, on a CPU with VNNI
instructions, a uint8 x int8 dot in its VNNI kernels (``vpdpbusd``): 2.2x faster on one
Zen 4 core (a 262144 x 144 by 144 x 16 dot: 65 -> 140 GMAC/s). JAX promotes mixed operand
types before a dot, so hwjax emits the uint8 x int8 dot itself (:func:`u8s8_dot`). An
8-bit left operand of the other type is moved there exactly: flipping the top bit of an
int8 ``v`` gives the uint8 ``v + 128`` (and back), so

    ``SUM_k x_k w_k = SUM_k (x_k + 128) w_k - SUM_k 128 w_k``

term for term in the integers, hence also modulo ``2**32`` in int32 arithmetic (the
second sum is a dot of its own, a left operand of 128s; a uint8 ``x`` moved to int8
takes off a dot of -128s instead). Either dot is XLA's exact integer dot with int32 results; no 16-bit
intermediate (``vpmaddubsw`` saturates) is involved, and the tests check the extremes
(``255 * -128`` summed over large ``K``) against NumPy's int64 products.

Every route gives the same int32 result: the exact sum, wrapped modulo ``2**32`` where
it does not fit int32 (callers prove or document that it fits).
"""

from __future__ import annotations

from typing import Literal, Sequence

import functools
import platform

import jax
import jax.numpy as jnp
import numpy as np

from jax.extend.core import Primitive
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import batching, mlir

from hwjax.core import _validate as V
from hwjax.core._program import cpu_flags, eager_program
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
        backend = jax.default_backend()
        if backend == "gpu":
            x, w = x.astype(_I32), w.astype(_I32)
        elif backend == "cpu" and w.dtype == jnp.int8 and x.dtype in (jnp.int8, jnp.uint8):
            return _cpu_dot8(x, w, dims)
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


def lhs8_dtype() -> np.dtype:
    """The 8-bit type of a dot's left operand that the default backend multiplies fastest
    with an int8 right operand: uint8 on a CPU with VNNI instructions (x86 ``avx512_vnni``
    or ``avx_vnni``), else int8. :func:`int_dot` moves an 8-bit left operand to this type
    itself (exactly, see the module docstring); a caller that has its operand in hand
    before im2col can produce it in this type and save that pass over the patches."""
    return np.dtype(np.uint8) if jax.default_backend() == "cpu" and _cpu_has_vnni() else np.dtype(np.int8)


@functools.lru_cache(maxsize=1)
def _cpu_has_vnni() -> bool:
    """Whether this x86 CPU has VNNI (its Linux flags; False where unreadable)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return bool(set(cpu_flags().split()) & {"avx512_vnni", "avx_vnni"})


def _cpu_dot8(x: jax.Array, w: jax.Array, dims) -> jax.Array:
    """The CPU integer dot of an 8-bit ``x`` and an int8 ``w`` with ``x`` in
    :func:`lhs8_dtype` (its top bit flipped and the offset's dot taken off when it comes in
    the other type; see the module docstring)."""
    (cx, cw), (bx, _) = dims
    if not bx and len(cx) == 1 and cx[0] % x.ndim == x.ndim - 1 and x.ndim > 2:
        # rows times a matrix: as a plain 2-D dot, which XLA:CPU hands its library whatever
        # the layouts (a (32, 1, 1, 128) left operand made it transpose the right one and
        # keep the dot, widened to int32, when single-threaded)
        out = _cpu_dot8(x.reshape(-1, x.shape[-1]), w, (((1,), cw), ((), ())))
        return out.reshape(*x.shape[:-1], *out.shape[1:])
    want = lhs8_dtype()
    dot = u8s8_dot if want == jnp.uint8 else _plain_dot
    if x.dtype == want:
        return dot(x, w, dims)
    # flipping the top bit adds 128 to an int8 (to uint8) or subtracts it from a uint8 (to
    # int8): x = flipped - f with f = 128 or -128, so dot(x, w) = dot(flipped, w) - dot(f, w)
    # term for term. The offset's dot has a left operand of f's with x's free axes of size
    # 1 (f * SUM w, broadcast over them): a second library dot, not reduction kernels.
    flipped = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, jnp.uint8) ^ np.uint8(0x80), want)
    kept = {a % x.ndim for a in cx + bx}
    ones = tuple(d if i in kept else 1 for i, d in enumerate(x.shape))
    offset = jnp.full(ones, 128 if want == jnp.uint8 else -128, want)
    return dot(flipped, w, dims) - dot(offset, w, dims)


def _plain_dot(x, w, dims):
    return jax.lax.dot_general(x, w, dims, preferred_element_type=_I32)


# ------------------------------------------------------------- the uint8 x int8 dot


def u8s8_dot(u: jax.Array, w: jax.Array, dims: DimensionNumbers) -> jax.Array:
    """Exact int32 ``dot_general(u, w, dims)`` of a uint8 ``u`` and an int8 ``w``, emitted
    as one HLO dot with these operand types (``jax.lax.dot_general`` would widen both to a
    common type first, which XLA:CPU runs 10-25x slower). Every product is in
    ``[-32640, 32385]`` and the sums are exact int32 (wrapping modulo ``2**32``). Works
    under ``jit`` and ``vmap``; no gradient (integers). Meant for the CPU, where XLA runs it
    in YNNPACK's VNNI kernels (:func:`lhs8_dtype`)."""
    if u.dtype != jnp.uint8 or w.dtype != jnp.int8:
        raise ArgTypeError(f"u8s8_dot takes a uint8 and an int8 array, got {u.dtype} and {w.dtype}")
    (cx, cw), (bx, bw) = _checked_dims(u, w, dims, "u")
    norm = lambda t, n: tuple(a % n for a in t)
    dims = ((norm(cx, u.ndim), norm(cw, w.ndim)), (norm(bx, u.ndim), norm(bw, w.ndim)))
    return _u8s8_p.bind(u, w, numbers=dims)


def _u8s8_shape(u_shape, w_shape, dims) -> tuple[int, ...]:
    (cx, cw), (bx, bw) = dims
    free = lambda shape, used: tuple(d for i, d in enumerate(shape) if i not in used)
    return tuple(u_shape[i] for i in bx) + free(u_shape, cx + bx) + free(w_shape, cw + bw)


def _u8s8_abstract(u, w, *, numbers):
    return jax.core.ShapedArray(_u8s8_shape(u.shape, w.shape, numbers), jnp.int32)


def _u8s8_lowering(ctx, u, w, *, numbers):
    (cx, cw), (bx, bw) = numbers
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(bx),
        rhs_batching_dimensions=list(bw),
        lhs_contracting_dimensions=list(cx),
        rhs_contracting_dimensions=list(cw),
    )
    return [stablehlo.dot_general(mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0]), u, w, numbers)]


@functools.lru_cache(maxsize=None)
def _u8s8_jit(dims):
    return jax.jit(lambda u, w: _u8s8_p.bind(u, w, numbers=dims))


def _u8s8_batch(args, axes, *, numbers):
    """vmap: a mapped axis of both operands becomes a new leading batch axis; of one
    operand, its first free axis (the result's axis at that place)."""
    (u, w), (au, aw) = args, axes
    (cx, cw), (bx, bw) = numbers
    up = lambda t: tuple(a + 1 for a in t)
    if au is not None and aw is not None:
        u, w = jnp.moveaxis(u, au, 0), jnp.moveaxis(w, aw, 0)
        new = ((up(cx), up(cw)), ((0,) + up(bx), (0,) + up(bw)))
        return _u8s8_p.bind(u, w, numbers=new), 0
    if au is not None:
        u = jnp.moveaxis(u, au, 0)
        return _u8s8_p.bind(u, w, numbers=((up(cx), cw), (up(bx), bw))), len(bx)
    w = jnp.moveaxis(w, aw, 0)
    n_uf = u.ndim - len(cx) - len(bx)
    return _u8s8_p.bind(u, w, numbers=((cx, up(cw)), (bx, up(bw)))), len(bx) + n_uf


_u8s8_p = Primitive("hwjax_u8s8_dot")
_u8s8_p.def_impl(lambda u, w, *, numbers: _u8s8_jit(numbers)(u, w))  # eager: one compiled program per dims
_u8s8_p.def_abstract_eval(_u8s8_abstract)
mlir.register_lowering(_u8s8_p, _u8s8_lowering)
batching.primitive_batchers[_u8s8_p] = _u8s8_batch


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
    (cx, cw), (bx, bw) = _checked_dims(x, w, dimension_numbers, "x")
    return _int_dot(x, w, dims=((cx, cw), (bx, bw)), route=default_route(route), prod_bits=bits[0] + bits[1])


def _checked_dims(x, w, dimension_numbers, x_name: str):
    """``dimension_numbers`` as tuples of ints, checked against the operands' shapes
    (ShapeError naming the operands ``x_name`` and ``w``)."""
    try:
        (cx, cw), (bx, bw) = dimension_numbers
        cx, cw, bx, bw = (tuple(int(i) for i in t) for t in (cx, cw, bx, bw))
    except (TypeError, ValueError):
        raise ShapeError(
            f"dimension_numbers must be ((x_contract, w_contract), (x_batch, w_batch)), got {dimension_numbers!r}"
        ) from None
    for axes, a, name in ((cx + bx, x, x_name), (cw + bw, w, "w")):
        if any(not -a.ndim <= i < a.ndim for i in axes):
            raise ShapeError(f"dimension_numbers name axes {axes} outside {name}'s {a.ndim} dimensions")
    if len(cx) != len(cw) or len(bx) != len(bw) or [x.shape[i] for i in cx + bx] != [w.shape[i] for i in cw + bw]:
        raise ShapeError(
            f"dimension_numbers {dimension_numbers!r} pair axes of different sizes: {x_name} {x.shape}, w {w.shape}"
        )
    return (cx, cw), (bx, bw)


@eager_program(static_argnames=("dims", "route", "prod_bits"))
def _int_dot(x, w, *, dims, route: str, prod_bits: int) -> jax.Array:
    """:func:`int_dot` after its checks (one program when called eagerly)."""
    return exact_dot(x, w, dims, route, prod_bits)


__all__ = ["int_dot", "default_route", "exact_dot", "lhs8_dtype", "u8s8_dot", "F32_EXACT", "FLOAT_PROD_BITS"]
