"""NVDLA sparse weight compression (spec 6.6): WMB mask stream, packed data, WGS sizes."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nvdla import _bytes as B
from hwjax.nvdla import _formats as F
from hwjax.nvdla import _winograd as W

__all__ = [
    "SparseWeights",
    "compress_sequence",
    "compress_weights",
    "decompress_sequence",
    "decompress_weights",
    "weight_group_elements",
    "wgs_image",
]

LAYOUTS = ("dc", "image", "winograd")


class SparseWeights(NamedTuple):
    """Compressed weights as NVDLA reads them.

    Attributes:
      weight: uint8 image of the non-zero elements in storage order, back to back across
        kernel groups, zero-padded to a multiple of the CBUF width (128 bytes).
      wmb: uint8 weight mask bit stream: bit ``j`` (element ``j`` of the whole layer's
        sequence is non-zero) at byte ``j // 8``, bit ``j % 8``; continuous across kernel
        groups; zero-padded to a multiple of 128 bytes.
      wgs: uint32 ``(groups,)``: bytes of non-zero data of each kernel group (not
        cumulative); :func:`wgs_image` gives its little-endian memory image.
    """

    weight: jax.Array
    wmb: jax.Array
    wgs: jax.Array


def _nonzero(seq: jax.Array) -> jax.Array:
    """Mask bit of every element: 1 unless the element is zero (+0 or -0 for fp16)."""
    bits = jax.lax.bitcast_convert_type(seq, jnp.uint8 if B.element_bytes(seq.dtype) == 1 else jnp.uint16)
    if seq.dtype == jnp.float16:
        bits = bits & jnp.uint16(0x7FFF)
    return bits != 0


def _check_groups(group_elements, n: int) -> tuple[int, ...]:
    if (
        isinstance(group_elements, (str, bytes))
        or not hasattr(group_elements, "__iter__")
        or any(isinstance(g, (bool, np.bool_)) or not isinstance(g, (int, np.integer)) for g in group_elements)
    ):
        raise ArgTypeError(f"group_elements must be a sequence of ints, got {group_elements!r}")
    groups = tuple(int(g) for g in group_elements)
    if not groups or any(g < 1 for g in groups) or sum(groups) != n:
        raise RangeError(f"group_elements must be positive and sum to the sequence length {n}; got {groups}")
    return groups


def _pad_to(x: jax.Array, size: int) -> jax.Array:
    return jnp.concatenate([x, jnp.zeros((size - x.shape[0],), x.dtype)]) if size > x.shape[0] else x


def compress_sequence(seq: Any, group_elements, *, dtype: Any = None, cbuf_width: int = F.CBUF_WIDTH) -> SparseWeights:
    """Compresses an uncompressed weight element sequence (spec 6.6).

    Args:
      seq: 1-D elements in storage order (a DC, image or Winograd layout without the tail
        padding), int8, int16 or float16.
      group_elements: static number of elements of each kernel group, in order.
      dtype: element type; ``None`` uses ``seq.dtype``.
      cbuf_width: padding unit of the weight and WMB images (128).

    Returns:
      :class:`SparseWeights`. ``weight`` has ``round_up(nonzero_bytes, cbuf_width)`` bytes
      when ``seq`` is concrete; under ``jit`` (data-dependent size) it has the
      uncompressed size ``round_up(len(seq)*bpe, cbuf_width)`` and every byte past the
      non-zero data is 0.
    """
    seq = B.as_elements(seq, dtype, "seq")
    if seq.ndim != 1:
        raise ShapeError(f"seq must be 1-D, got shape {seq.shape}")
    n = seq.shape[0]
    groups = _check_groups(group_elements, n)
    cbuf = F._static_int(cbuf_width, 1, 1 << 16, "cbuf_width")
    weight, wmb, wgs = _compress_kernel(seq, groups, cbuf)
    return SparseWeights(_trim(weight, wgs, cbuf), wmb, wgs)


def _trim(weight: jax.Array, wgs: jax.Array, cbuf: int) -> jax.Array:
    """Concrete results: the weight image cut to ``round_up(sum(wgs), cbuf)`` bytes."""
    if not (V.is_concrete(weight) and V.is_concrete(wgs)):
        return weight
    size = B.round_up(int(np.asarray(wgs, np.int64).sum()), cbuf)
    return jax.device_put(np.asarray(weight)[:size])  # sliced on the host: no program per size


@functools.partial(jax.jit, static_argnums=(1, 2))
def _compress_kernel(seq: jax.Array, groups: tuple[int, ...], cbuf: int):
    n = seq.shape[0]
    bpe = B.element_bytes(seq.dtype)
    nz = _nonzero(seq)
    bits = _pad_to(nz.astype(jnp.uint8), B.round_up(n, 8)).reshape(-1, 8)
    wmb = jnp.sum(bits << jnp.arange(8, dtype=jnp.uint8), axis=1, dtype=jnp.uint8)
    wmb = _pad_to(wmb, B.round_up(wmb.shape[0], cbuf))
    count = jnp.cumsum(nz.astype(jnp.int32))
    dest = jnp.where(nz, count - 1, n)  # zeros go out of bounds and are dropped
    packed = jnp.zeros((n,), seq.dtype).at[dest].set(seq, mode="drop")
    weight = _pad_to(B.to_bytes(packed).reshape(-1), B.round_up(n * bpe, cbuf))
    ends = np.cumsum(groups)
    cum = jnp.concatenate([jnp.zeros((1,), jnp.int32), count[jnp.asarray(ends - 1)]])
    wgs = ((cum[1:] - cum[:-1]) * bpe).astype(jnp.uint32)
    return weight, wmb, wgs


def decompress_sequence(weight: Any, wmb: Any, num_elements: int, *, dtype: Any) -> jax.Array:
    """Inverse of :func:`compress_sequence`: the 1-D element sequence of ``num_elements``.

    Element ``j`` is the next packed element where mask bit ``j`` is 1, else zero (+0 for
    fp16, so -0 comes back as +0). Accepts the trimmed or the fixed-size ``weight`` image.
    """
    n = F._static_int(num_elements, 1, 2**31 - 1, "num_elements")
    dt = B.element_type(dtype)
    _check_decompress_inputs(weight, wmb, n, B.element_bytes(dt))
    return _decompress_kernel(B.check_image(weight, 0, "weight"), B.check_image(wmb, 0, "wmb"), n, dt.name)


def _check_decompress_inputs(weight, wmb, n: int, bpe: int) -> None:
    wmb = B.check_image(wmb, -(-n // 8), "wmb")
    weight = B.check_image(weight, 0, "weight")
    if V.is_concrete(wmb) and V.is_concrete(weight):
        bits = np.unpackbits(np.asarray(wmb)[: -(-n // 8)], bitorder="little")[:n]
        need = int(bits.sum()) * bpe
        if weight.shape[0] < need:
            raise ShapeError(f"weight has {weight.shape[0]} bytes but the mask selects {need}")


@functools.partial(jax.jit, static_argnums=(2, 3))
def _decompress_kernel(weight: jax.Array, wmb: jax.Array, n: int, dtype_name: str) -> jax.Array:
    bpe = B.element_bytes(dtype_name)
    bits = ((wmb[: -(-n // 8), None] >> jnp.arange(8, dtype=jnp.uint8)) & 1).reshape(-1)[:n] == 1
    if weight.shape[0] < bpe:  # all-zero weights have an empty data surface
        weight = jnp.zeros((bpe,), jnp.uint8)
    m = weight.shape[0] // bpe
    elems = B.image_elements(weight, m, dtype_name)
    pos = jnp.clip(jnp.cumsum(bits.astype(jnp.int32)) - 1, 0, m - 1)
    return jnp.where(bits, elems[pos], jnp.zeros((), elems.dtype))


# ------------------------------------------------------------------ layout-level interface


def _layout_setup(layout, shape, dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width):
    """(pack(w) -> image, unpack(image) -> w, elements, group_elements) of a weight layout."""
    if layout not in LAYOUTS:
        raise RangeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    shape = B.check_shape(shape, 4, "shape")
    bpe = B.element_bytes(dtype)
    kpg = F._check_atomics(atomic_k, atomic_c, cbuf_width, bpe)[0]
    K, C, R, S = shape
    if layout == "dc":
        kw = dict(atomic_k=atomic_k, atomic_c=atomic_c, cbuf_width=cbuf_width)
        pack = lambda w: F.pack_dc_weights(w, **kw)
        unpack = lambda im: F.unpack_dc_weights(im, shape, dtype=dtype, **kw)
        n = K * C * R * S
    elif layout == "image":
        if input_channels is None:
            raise RangeError("layout='image' needs input_channels=")
        kw = dict(
            input_channels=input_channels,
            stride_x=stride_x,
            post_extension=post_extension,
            atomic_k=atomic_k,
            atomic_c=atomic_c,
            cbuf_width=cbuf_width,
        )
        pack = lambda w: F.pack_image_weights(w, **kw)
        unpack = lambda im: F.unpack_image_weights(im, shape, dtype=dtype, **kw)
        n = K * S * F._static_int(input_channels, C, 1 << 16, "input_channels") * R
    else:
        kw = dict(atomic_k=atomic_k, cbuf_width=cbuf_width)
        pack = lambda w: W.pack_winograd_transformed(w, **kw)
        unpack = lambda im: W.unpack_winograd_weights(im, shape, dtype=dtype, **kw)
        n = K * C * 16
    per_kernel = n // K
    groups = tuple(min(kpg, K - g) * per_kernel for g in range(0, K, kpg))
    return pack, unpack, n, groups


def weight_group_elements(
    shape,
    dtype: Any,
    *,
    layout: str = "dc",
    input_channels: Optional[int] = None,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    atomic_k: int = F.ATOMIC_K,
    atomic_c: int = F.ATOMIC_C,
) -> tuple[int, ...]:
    """Elements of each kernel group in a weight layout's uncompressed sequence."""
    return _layout_setup(
        layout, shape, dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, F.CBUF_WIDTH
    )[3]


def compress_weights(
    w: Any,
    *,
    dtype: Any = None,
    layout: str = "dc",
    input_channels: Optional[int] = None,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    atomic_k: int = F.ATOMIC_K,
    atomic_c: int = F.ATOMIC_C,
    cbuf_width: int = F.CBUF_WIDTH,
) -> SparseWeights:
    """Sparse-compresses convolution weights (spec 6.6) after laying them out.

    The uncompressed element sequence is the layout's image without its tail padding:
    ``layout="dc"`` (``w`` is ``(K, C, R, S)``; :func:`pack_dc_weights`), ``"image"``
    (``(K, C, R, S)`` with ``input_channels``, ``stride_x``, ``post_extension``;
    :func:`pack_image_weights`) or ``"winograd"`` (``w`` is the transformed
    ``(K, Cp, 4, 4)`` of :func:`winograd_transform`). Then :func:`compress_sequence` with the
    layout's kernel groups (``atomic_k // bpe`` kernels each, the last may be partial).

    Returns:
      :class:`SparseWeights` (see :func:`compress_sequence` for the ``weight`` length).
    """
    w = B.as_elements(w, dtype, "w")
    fn = _layout_kernels(
        layout,
        w.shape,
        np.dtype(w.dtype).name,
        input_channels,
        stride_x,
        post_extension,
        atomic_k,
        atomic_c,
        cbuf_width,
    )[0]
    weight, wmb, wgs = fn(w)
    return SparseWeights(_trim(weight, wgs, cbuf_width), wmb, wgs)


def decompress_weights(
    weight: Any,
    wmb: Any,
    shape,
    *,
    dtype: Any,
    layout: str = "dc",
    input_channels: Optional[int] = None,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    atomic_k: int = F.ATOMIC_K,
    atomic_c: int = F.ATOMIC_C,
    cbuf_width: int = F.CBUF_WIDTH,
) -> jax.Array:
    """Inverse of :func:`compress_weights`: the ``shape`` weights of ``dtype``.

    ``shape`` is ``(K, C, R, S)`` for ``"dc"``/``"image"`` and ``(K, Cp, 4, 4)`` for
    ``"winograd"``. fp16 -0 weights come back as +0 (NVDLA's mask treats both as zero).
    """
    shape = B.check_shape(shape, 4, "shape")
    fn, n = _layout_kernels(
        layout,
        shape,
        B.element_type(dtype).name,
        input_channels,
        stride_x,
        post_extension,
        atomic_k,
        atomic_c,
        cbuf_width,
    )[1:]
    _check_decompress_inputs(weight, wmb, n, B.element_bytes(dtype))
    return fn(B.check_image(weight, 0, "weight"), B.check_image(wmb, -(-n // 8), "wmb"))


@functools.lru_cache(maxsize=64)
def _layout_kernels(
    layout, shape, dtype_name, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width
):
    """(jitted compress(w), jitted decompress(weight, wmb), elements) of one weight layout."""
    pack, unpack, n, groups = _layout_setup(
        layout, shape, dtype_name, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width
    )
    cbuf = F._static_int(cbuf_width, 1, 1 << 16, "cbuf_width")
    size = B.round_up(n * B.element_bytes(dtype_name), cbuf)

    def compress(w):
        return _compress_kernel(B.image_elements(pack(w), n, dtype_name), groups, cbuf)

    def decompress(weight, wmb):
        return unpack(B.elements_image(_decompress_kernel(weight, wmb, n, dtype_name), size))

    return jax.jit(compress), jax.jit(decompress), n


def wgs_image(wgs: Any, *, cbuf_width: int = F.CBUF_WIDTH) -> jax.Array:
    """Memory image of the WGS sizes: little-endian uint32 words, zero-padded to 128 bytes."""
    wgs = V.as_array(wgs, "wgs")
    if wgs.ndim != 1 or not jnp.issubdtype(wgs.dtype, jnp.integer):
        raise ArgTypeError(f"wgs must be a 1-D integer array, got {wgs.dtype} {wgs.shape}")
    V.check_range(wgs, 0, 2**32 - 1, "wgs")
    return _wgs_image(wgs, size=B.round_up(4 * wgs.shape[0], F._static_int(cbuf_width, 1, 1 << 16, "cbuf_width")))


@eager_program(static_argnames=("size",))
def _wgs_image(wgs: jax.Array, *, size: int) -> jax.Array:
    u = wgs.astype(jnp.uint32)
    words = jnp.stack([((u >> (8 * i)) & 0xFF).astype(jnp.uint8) for i in range(4)], -1).reshape(-1)
    return _pad_to(words, size)
