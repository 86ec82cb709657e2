"""NVDLA Winograd weights (spec 6.5): the ``G g G^T`` conversion and the 4x4x4 small-cube layout."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program, to_float16
from hwjax.core import validate as V
from hwjax.errors import RangeError, ShapeError
from hwjax.nvdla import _bytes as B
from hwjax.nvdla._formats import ATOMIC_K, CBUF_WIDTH, _check_atomics

__all__ = [
    "pack_winograd_transformed",
    "pack_winograd_weights",
    "unpack_winograd_weights",
    "winograd_padded_channels",
    "winograd_transform",
    "winograd_weight_offsets",
]

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]], np.float32)
_FP16_LIMIT = 65536.0  # fp32 values at or beyond this truncate to INF in fp16


def winograd_padded_channels(channels: int, dtype: Any, atom_bytes: int = 32) -> int:
    """Channels after zero padding to a multiple of one 32-byte atom (32 int8, 16 int16/fp16)."""
    channels = V.check_static_int(channels, 1, 1 << 16, "channels")
    atom_bytes = V.check_static_int(atom_bytes, 1, 1 << 12, "atom_bytes")
    bpe = B.element_bytes(dtype)
    if atom_bytes % bpe:
        raise RangeError(f"atom_bytes must be a multiple of the element size {bpe}, got {atom_bytes}")
    return B.round_up(channels, atom_bytes // bpe)


def _matmul_in_order(a: jax.Array, b: np.ndarray, a_axis: int) -> jax.Array:
    """``sum_n a[.., n, ..] * b[n, p]`` accumulated in fp32 in the order n = 0, 1, 2 from 0.0.

    Written as explicit adds so that the rounding of each fp32 step is NVDLA's compiler's
    (``WGMatrixUtil``), independent of XLA's dot lowering.
    """
    terms = [jnp.take(a, n, axis=a_axis) for n in range(b.shape[0])]
    cols = []
    for p in range(b.shape[1]):
        acc = jnp.zeros_like(terms[0])
        for n, t in enumerate(terms):
            acc = acc + t * jnp.float32(b[n, p])
        cols.append(acc)
    return jnp.stack(cols, axis=a_axis)


def winograd_transform(w: Any, *, dtype: Any = None, atom_bytes: int = 32) -> jax.Array:
    """Converts 3x3 kernels to NVDLA's 4x4 Winograd weights (spec 6.5 steps 1-2).

    Channels are zero-padded to a multiple of one atom (32 int8, 16 int16/fp16 channels);
    then per kernel and channel ``W4 = (G g) G^T`` with
    ``G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]]``, evaluated in fp32 exactly as
    NVDLA's compiler does (each matrix product accumulated from 0.0 in index order), and
    converted back to the weight type by truncation toward zero (integers: ``int(v)``;
    fp16: rounding toward zero). For integer weights every fp32 step is exact, so the
    result is ``trunc((G' g G'^T) / 4)`` with ``G' = 2G``. No scaling is applied.

    Weights whose transformed values do not fit the weight type (int8/int16 range, or
    ``|v| >= 65536`` for fp16, which NVDLA's compiler turns into INF) raise ValueError when
    concrete; under ``jit`` integer results wrap (caller's contract).

    Args:
      w: ``(K, C, 3, 3)`` weights.
      dtype: element type; ``None`` uses ``w.dtype`` (int8, int16, float16).

    Returns:
      ``(K, Cp, 4, 4)`` array of the weight type, ``Cp`` the padded channel count.
    """
    w, K, C = _kernels(w, dtype)
    v, w4 = _winograd(w, cp=winograd_padded_channels(C, w.dtype, atom_bytes))
    _check_transformed(v, w)
    return w4


def _kernels(w: Any, dtype: Any) -> tuple[jax.Array, int, int]:
    """``(K, C, 3, 3)`` kernels in their element type, K and C."""
    w = B.as_elements(w, dtype, "w")
    K, C, R, S = B.check_shape(w.shape, 4, "w.shape (KCRS)")
    if (R, S) != (3, 3):
        raise ShapeError(f"w: Winograd weights must be 3x3 kernels, got R x S = {R} x {S}")
    return w, K, C


def _check_transformed(v: jax.Array, w: jax.Array) -> None:
    """RangeError where the fp32 transform ``v`` of concrete weights ``w`` does not fit
    their type (see :func:`winograd_transform`)."""
    if not V.is_concrete(v):
        return
    a = np.asarray(v)
    if w.dtype == jnp.float16:
        if not np.isfinite(np.asarray(w, np.float32)).all():
            raise RangeError("w: Winograd weights must be finite (no NaN or INF)")
        bad = np.abs(a) >= _FP16_LIMIT
        if bad.any():
            raise RangeError(
                f"w: transformed Winograd weights reach {a[bad].flat[0]}, which does "
                "not fit fp16 (|v| < 65536); scale the weights down"
            )
    else:
        info = np.iinfo(np.dtype(w.dtype))
        t = np.trunc(a)
        if t.min() < info.min or t.max() > info.max:
            bad = t.min() if t.min() < info.min else t.max()
            raise RangeError(
                f"w: transformed Winograd weights reach {bad}, outside the "
                f"{np.dtype(w.dtype).name} range [{info.min}, {info.max}]; scale "
                "the weights down"
            )


@eager_program(static_argnames=("cp",))
def _winograd(w: jax.Array, *, cp: int) -> tuple[jax.Array, jax.Array]:
    """The fp32 transform (for the range check) and the weights in their type, one program
    when called eagerly."""
    v = _transform_fp32(w, cp)
    return v, _to_weight_type(v, np.dtype(w.dtype).name)


@eager_program(static_argnames=("cp",))
def _winograd_image(w: jax.Array, source: np.ndarray, *, cp: int) -> tuple[jax.Array, jax.Array]:
    """:func:`_winograd` with the transformed weights placed in their byte image."""
    v, w4 = _winograd(w, cp=cp)
    return v, B.place_source(w4, source)


@functools.partial(jax.jit, static_argnums=1)
def _transform_fp32(w: jax.Array, cp: int) -> jax.Array:
    """``(G g) G^T`` in fp32 of the channel-padded 3x3 kernels, NVDLA's compiler's order."""
    g = jnp.pad(w, ((0, 0), (0, cp - w.shape[1]), (0, 0), (0, 0))).astype(jnp.float32)
    gg = _matmul_in_order(g, _G.T, a_axis=2)  # (K, Cp, 4, 3): rows = G g
    v = _matmul_in_order(gg, _G.T, a_axis=3)  # (K, Cp, 4, 4): (G g) G^T
    return jnp.where(v == 0, jnp.float32(0), v)  # sums that start from +0.0 are never -0


@functools.partial(jax.jit, static_argnums=1)
def _to_weight_type(v: jax.Array, dtype_name: str) -> jax.Array:
    """Truncation toward zero to the weight type."""
    if dtype_name == "float16":
        return to_float16(v, rounding="toward_zero")  # exact bit arithmetic (no f32->f16->f32 trip)
    return jnp.trunc(v).astype(jnp.int32).astype(dtype_name)


def _wg_builder(shape_kc44, bpe, kpg, cbuf):
    K, CP, _, _ = shape_kc44
    k = np.arange(K, dtype=np.int64)[:, None, None, None]
    c = np.arange(CP, dtype=np.int64)[None, :, None, None]
    r = np.arange(4, dtype=np.int64)[None, None, :, None]
    s = np.arange(4, dtype=np.int64)[None, None, None, :]
    kg, kk = k // kpg, k % kpg
    kgsize = np.minimum(kpg, K - kg * kpg)
    elem = kg * kpg * CP * 16 + (c // 4) * kgsize * 64 + kk * 64 + r * 16 + s * 4 + (c % 4)
    return elem * bpe, bpe, B.round_up(K * CP * 16 * bpe, cbuf)


def _wg_placement(shape_kc44, dtype, atomic_k, cbuf_width, name="shape_kc44"):
    shape = B.check_shape(shape_kc44, 4, f"{name} (K, Cp, 4, 4)")
    bpe = B.element_bytes(dtype)
    if shape[2:] != (4, 4) or shape[1] % 4:
        raise ShapeError(
            f"{name}: transformed Winograd weights must have shape (K, Cp, 4, 4) with Cp a multiple of 4; got {shape}"
        )
    kpg, _, cbuf = _check_atomics(atomic_k, 1, cbuf_width, bpe)
    return B.cached_placement(_wg_builder, shape, bpe, kpg, cbuf)


def winograd_weight_offsets(shape_kc44, dtype: Any, *, atomic_k: int = ATOMIC_K) -> np.ndarray:
    """Byte offset of every transformed weight ``W4[k, c, r, s]`` (spec 6.5 step 3).

    Kernel group (``atomic_k // bpe`` kernels) -> 4-channel block -> kernel -> r -> s ->
    channel in block::

      elem = kg*kpg*Cp*16 + (c // 4)*Kg*64 + kk*64 + r*16 + s*4 + (c % 4);   off = elem*bpe
    """
    return _wg_placement(shape_kc44, dtype, atomic_k, CBUF_WIDTH).byte_index[..., 0].astype(np.int64)


def pack_winograd_transformed(
    w4: Any, *, dtype: Any = None, atomic_k: int = ATOMIC_K, cbuf_width: int = CBUF_WIDTH
) -> jax.Array:
    """Byte image of transformed Winograd weights ``(K, Cp, 4, 4)`` (spec 6.5 steps 3-4).

    Offsets as in :func:`winograd_weight_offsets`; zero tail padding to a multiple of
    ``cbuf_width`` (128) bytes.
    """
    w4 = B.as_elements(w4, dtype, "w4")
    return B.place(w4, _wg_placement(w4.shape, w4.dtype, atomic_k, cbuf_width, "w4"))


def pack_winograd_weights(
    w: Any, *, dtype: Any = None, atomic_k: int = ATOMIC_K, cbuf_width: int = CBUF_WIDTH
) -> jax.Array:
    """Byte image of Winograd weights from 3x3 kernels ``(K, C, 3, 3)`` (spec 6.5).

    ``pack_winograd_transformed(winograd_transform(w))``. The conversion is lossy;
    :func:`unpack_winograd_weights` returns the transformed ``(K, Cp, 4, 4)`` weights.
    """
    w, K, C = _kernels(w, dtype)
    cp = winograd_padded_channels(C, w.dtype, 32)
    p = _wg_placement((K, cp, 4, 4), w.dtype, atomic_k, cbuf_width, "w4")
    v, image = _winograd_image(w, p.source, cp=cp)
    _check_transformed(v, w)
    return image


def unpack_winograd_weights(
    image: Any, shape_kc44, *, dtype: Any, atomic_k: int = ATOMIC_K, cbuf_width: int = CBUF_WIDTH
) -> jax.Array:
    """Inverse of :func:`pack_winograd_transformed`: the ``(K, Cp, 4, 4)`` transformed weights."""
    return B.gather(image, _wg_placement(shape_kc44, dtype, atomic_k, cbuf_width), dtype)
