"""NVDLA in-memory formats (spec section 6): feature cubes, DC and image weights, SDP operands.

Every layout here is a pair of pure, jittable, vmappable functions ``pack_*`` (tensor ->
uint8 byte image, as NVDLA reads it from memory) and ``unpack_*`` (the exact inverse),
built on one mechanism (:mod:`hwjax.nvdla._bytes`): a static byte offset for every element.
The ``*_offsets`` functions expose those offsets (NumPy, relative to the surface base).

Defaults are the ``nv_full`` configuration: 32-byte atoms, atomic-K 32, atomic-C 64 and a
128-byte CBUF entry; all are parameters. Multi-byte elements are little-endian. Element
types are int8, int16 and fp16 (``jnp.float16`` bit patterns); uint8/uint16 are accepted
where a layout only moves bytes. Shapes, strides and layout parameters are static Python
ints; values are checked only when concrete (under ``jit`` they are the caller's contract).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nvdla import _bytes as B

ATOM_BYTES = 32
ATOMIC_K = 32
ATOMIC_C = 64
CBUF_WIDTH = 128

__all__ = [
    "ALIGNMENT",
    "check_alignment",
    "dc_weight_offsets",
    "feature_offsets",
    "image_post_extension_factor",
    "image_weight_offsets",
    "pack_dc_weights",
    "pack_feature",
    "pack_image_weights",
    "pack_sdp_per_channel",
    "pack_sdp_per_element",
    "pre_extend_image_weights",
    "sdp_per_element_offsets",
    "unpack_dc_weights",
    "unpack_feature",
    "unpack_image_weights",
    "unpack_sdp_per_channel",
    "unpack_sdp_per_element",
    "unextend_image_weights",
]


def _static_int(value: Any, lo: int, hi: int, name: str) -> int:
    return V.check_static_int(value, lo, hi, name)


# ------------------------------------------------------------------ cube scheme (6.1, 6.7)


def _cube_geometry(shape_nchw, slot_bytes, slots_per_atom, line_stride, surf_stride, batch_stride, align):
    """Resolves and validates the strides of a cube whose atom holds ``slots_per_atom`` slots.

    Given strides must be multiples of ``align`` bytes and large enough not to overlap.
    """
    n, c, h, w = shape_nchw
    atom = slot_bytes * slots_per_atom
    groups = -(-c // slots_per_atom)
    line = w * atom if line_stride is None else B.check_stride(line_stride, w * atom, align, "line_stride")
    surf = line * h if surf_stride is None else B.check_stride(surf_stride, line * h, align, "surf_stride")
    need_batch = surf * groups
    if batch_stride is None:
        batch = need_batch
    else:
        batch = B.check_stride(batch_stride, need_batch if n > 1 else 0, align, "batch_stride")
    size = (n - 1) * batch + (groups - 1) * surf + (h - 1) * line + w * atom
    return line, surf, batch, size


def _cube_offsets(shape_nchw, slot_bytes, slots_per_atom, line, surf, batch):
    """Byte offset of the slot of every ``(n, c, h, w)``: spec 6.1 with a general atom."""
    n, c, h, w = (np.arange(d, dtype=np.int64) for d in shape_nchw)
    atom = slot_bytes * slots_per_atom
    return (
        n[:, None, None, None] * batch
        + (c // slots_per_atom)[None, :, None, None] * surf
        + h[None, None, :, None] * line
        + w[None, None, None, :] * atom
        + (c % slots_per_atom)[None, :, None, None] * slot_bytes
    )


def _feature_builder(shape_nchw, bpe, atom_bytes, line_stride, surf_stride, batch_stride):
    epa = atom_bytes // bpe
    line, surf, batch, size = _cube_geometry(shape_nchw, bpe, epa, line_stride, surf_stride, batch_stride, atom_bytes)
    return _cube_offsets(shape_nchw, bpe, epa, line, surf, batch), bpe, size


def _as_nchw(shape) -> tuple[int, ...]:
    shape = B.check_shape(shape, (3, 4), "shape (NCHW or CHW)")
    return shape if len(shape) == 4 else (1,) + shape


def _feature_placement(shape, dtype, line_stride, surf_stride, batch_stride, atom_bytes):
    atom_bytes = _static_int(atom_bytes, 8, 1 << 12, "atom_bytes")
    if atom_bytes % 8:
        raise RangeError(f"atom_bytes must be a multiple of 8, got {atom_bytes}")
    return B.cached_placement(
        _feature_builder, _as_nchw(shape), B.element_bytes(dtype), atom_bytes, line_stride, surf_stride, batch_stride
    )


def feature_offsets(
    shape,
    dtype: Any,
    *,
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
    batch_stride: Optional[int] = None,
    atom_bytes: int = ATOM_BYTES,
) -> np.ndarray:
    """Byte offset of every element of a feature data cube (spec 6.1).

    ``off = n*batch_stride + (c // epa)*surf_stride + h*line_stride + w*atom_bytes
    + (c % epa)*bpe`` with ``epa = atom_bytes // bpe`` (32 int8 or 16 int16/fp16 elements
    per 32-byte atom). Strides default to the packed layout: ``line_stride = atom_bytes*W``,
    ``surf_stride = line_stride*H``, ``batch_stride = surf_stride*ceil(C/epa)``. Given
    strides must be multiples of ``atom_bytes`` (32) with ``line_stride >= atom_bytes*W``,
    ``surf_stride >= line_stride*H`` and, for N > 1, ``batch_stride >= surf_stride*ceil(C/epa)``.

    Args:
      shape: ``(N, C, H, W)`` or ``(C, H, W)``.
      dtype: element type (int8, int16, fp16; uint8/uint16 accepted).

    Returns:
      int64 NumPy array of the given shape.
    """
    p = _feature_placement(shape, dtype, line_stride, surf_stride, batch_stride, atom_bytes)
    return p.byte_index[..., 0].astype(np.int64).reshape(B.check_shape(shape, (3, 4), "shape"))


def pack_feature(
    x: Any,
    *,
    dtype: Any = None,
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
    batch_stride: Optional[int] = None,
    atom_bytes: int = ATOM_BYTES,
) -> jax.Array:
    """Byte image of a feature data cube (spec 6.1), packed or with explicit strides.

    Order in memory: channel inside the 32-byte atom, then W, then H, then channel group
    (surface), then batch; offsets as in :func:`feature_offsets`. Channels are padded to a
    multiple of ``epa`` with zeros, and bytes in stride gaps are zero (the hardware does not
    read them). The image runs from offset 0 to the end of the last atom:
    ``(N-1)*batch_stride + (ceil(C/epa)-1)*surf_stride + (H-1)*line_stride + W*atom_bytes``
    bytes (``ceil(C/epa)*H*W*32`` when packed).

    Args:
      x: ``(N, C, H, W)`` or ``(C, H, W)`` tensor.
      dtype: element type; ``None`` uses ``x.dtype`` (int8, int16, float16, uint8, uint16).
        With a dtype, integer values must fit it (ValueError otherwise).
      line_stride, surf_stride, batch_stride: bytes (see :func:`feature_offsets`).
      atom_bytes: atom size (32 for ``nv_full``).

    Returns:
      uint8 image.
    """
    x = B.as_elements(x, dtype, "x")
    B.check_shape(x.shape, (3, 4), "x.shape (NCHW or CHW)")
    p = _feature_placement(x.shape, x.dtype, line_stride, surf_stride, batch_stride, atom_bytes)
    return B.place(x.reshape(p.shape), p)


def unpack_feature(
    image: Any,
    shape,
    *,
    dtype: Any,
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
    batch_stride: Optional[int] = None,
    atom_bytes: int = ATOM_BYTES,
) -> jax.Array:
    """Inverse of :func:`pack_feature`: reads the ``shape`` tensor of ``dtype`` from ``image``.

    ``image`` must be a 1-D uint8 array at least as long as the packed image; padding and
    gap bytes are ignored.
    """
    p = _feature_placement(shape, dtype, line_stride, surf_stride, batch_stride, atom_bytes)
    return B.gather(image, p, dtype).reshape(B.check_shape(shape, (3, 4), "shape"))


# ---------------------------------------------------------------------------- DC (6.3)


def _check_atomics(atomic_k, atomic_c, cbuf_width, bpe):
    atomic_k = _static_int(atomic_k, 2, 1 << 12, "atomic_k")
    atomic_c = _static_int(atomic_c, 1, 1 << 12, "atomic_c")
    cbuf_width = _static_int(cbuf_width, 1, 1 << 16, "cbuf_width")
    if atomic_k % bpe:
        raise RangeError(f"atomic_k must be a multiple of {bpe} for {bpe}-byte elements, got {atomic_k}")
    return atomic_k // bpe, atomic_c, cbuf_width


def _dc_elems(shape_kcrs, kpg, cpb) -> np.ndarray:
    """Storage position (in elements) of every ``W[k, c, r, s]`` for DC weights (spec 6.3)."""
    K, C, R, S = shape_kcrs
    k = np.arange(K, dtype=np.int64)[:, None, None, None]
    c = np.arange(C, dtype=np.int64)[None, :, None, None]
    r = np.arange(R, dtype=np.int64)[None, None, :, None]
    s = np.arange(S, dtype=np.int64)[None, None, None, :]
    kg, kk, cb, cc = k // kpg, k % kpg, c // cpb, c % cpb
    kgsize = np.minimum(kpg, K - kg * kpg)
    cbsize = np.minimum(cpb, C - cb * cpb)
    return kg * kpg * C * R * S + R * S * kgsize * (cb * cpb) + (r * S + s) * kgsize * cbsize + kk * cbsize + cc


def _dc_builder(shape_kcrs, bpe, kpg, cpb, cbuf):
    n = int(np.prod(shape_kcrs))
    return _dc_elems(shape_kcrs, kpg, cpb) * bpe, bpe, B.round_up(n * bpe, cbuf)


def _dc_placement(shape_kcrs, dtype, atomic_k, atomic_c, cbuf_width):
    shape_kcrs = B.check_shape(shape_kcrs, 4, "shape_kcrs (KCRS)")
    bpe = B.element_bytes(dtype)
    kpg, cpb, cbuf = _check_atomics(atomic_k, atomic_c, cbuf_width, bpe)
    return B.cached_placement(_dc_builder, shape_kcrs, bpe, kpg, cpb, cbuf)


def dc_weight_offsets(shape_kcrs, dtype: Any, *, atomic_k: int = ATOMIC_K, atomic_c: int = ATOMIC_C) -> np.ndarray:
    """Byte offset of every weight ``W[k, c, r, s]`` in the direct-convolution layout (spec 6.3).

    Kernel groups of ``kpg = atomic_k // bpe`` kernels (32 int8, 16 int16/fp16; the last
    group may be partial), channel blocks of ``atomic_c`` (64) elements for every precision
    (the last block is partial, not padded). Order, outermost first: kernel group, channel
    block, r, s, kernel in group, channel in block::

      elem = kg*kpg*C*R*S + R*S*Kg*(cb*64) + (r*S + s)*Kg*Cb + kk*Cb + cc;   off = elem*bpe
    """
    p = _dc_placement(shape_kcrs, dtype, atomic_k, atomic_c, CBUF_WIDTH)
    return p.byte_index[..., 0].astype(np.int64)


def pack_dc_weights(
    w: Any, *, dtype: Any = None, atomic_k: int = ATOMIC_K, atomic_c: int = ATOMIC_C, cbuf_width: int = CBUF_WIDTH
) -> jax.Array:
    """Byte image of direct-convolution weights ``w[K, C, R, S]`` (spec 6.3).

    Offsets as in :func:`dc_weight_offsets`; groups and blocks follow each other without
    padding, and zero bytes pad the image to a multiple of ``cbuf_width`` (128) bytes.

    Args:
      w: ``(K, C, R, S)`` weights.
      dtype: element type; ``None`` uses ``w.dtype`` (int8, int16, float16).

    Returns:
      uint8 image of ``round_up(K*C*R*S*bpe, cbuf_width)`` bytes.
    """
    w = B.as_elements(w, dtype, "w")
    B.check_shape(w.shape, 4, "w.shape (KCRS)")
    return B.place(w, _dc_placement(w.shape, w.dtype, atomic_k, atomic_c, cbuf_width))


def unpack_dc_weights(
    image: Any,
    shape_kcrs,
    *,
    dtype: Any,
    atomic_k: int = ATOMIC_K,
    atomic_c: int = ATOMIC_C,
    cbuf_width: int = CBUF_WIDTH,
) -> jax.Array:
    """Inverse of :func:`pack_dc_weights`: the ``(K, C, R, S)`` weights of ``dtype``."""
    return B.gather(image, _dc_placement(shape_kcrs, dtype, atomic_k, atomic_c, cbuf_width), dtype)


# ------------------------------------------------------------------- image weights (6.4)


def pre_extend_image_weights(w: Any, *, input_channels: int) -> jax.Array:
    """Channel zero-padding and mandatory pre-extension of image-input weights (spec 6.4).

    ``W_pre[k, s*Cin + c, r, 0] = W_pad[k, c, r, s]`` where ``W_pad`` is ``w`` with zero
    channels appended up to ``Cin = input_channels``. Pure reshaping; any dtype.

    Args:
      w: ``(K, C, R, S)`` weights, ``C <= input_channels``.
      input_channels: channels of the input surface (``Cin``).

    Returns:
      ``(K, S*Cin, R, 1)`` array of ``w``'s dtype.
    """
    w = V.as_array(w, "w")
    K, C, R, S = B.check_shape(w.shape, 4, "w.shape (KCRS)")
    cin = _static_int(input_channels, C, 1 << 16, "input_channels (>= the weights' C)")
    return _pre_extend(w, cin)


@functools.partial(jax.jit, static_argnums=1)
def _pre_extend(w: jax.Array, cin: int) -> jax.Array:
    K, C, R, S = w.shape
    w = jnp.pad(w, ((0, 0), (0, cin - C), (0, 0), (0, 0)))
    return jnp.transpose(w, (0, 3, 1, 2)).reshape(K, S * cin, R, 1)


def unextend_image_weights(w_pre: Any, *, channels: int, kernel_width: int) -> jax.Array:
    """Inverse of :func:`pre_extend_image_weights`: ``(K, S*Cin, R, 1)`` -> ``(K, C, R, S)``.

    Drops the zero-padding channels ``C .. Cin-1``.
    """
    w_pre = V.as_array(w_pre, "w_pre")
    K, CP, R, one = B.check_shape(w_pre.shape, 4, "w_pre.shape")
    S = _static_int(kernel_width, 1, CP, "kernel_width")
    if one != 1 or CP % S:
        raise ShapeError(f"w_pre must have shape (K, S*Cin, R, 1) with S={S}; got {w_pre.shape}")
    C = _static_int(channels, 1, CP // S, "channels")
    return _unextend(w_pre, C, S)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unextend(w_pre: jax.Array, channels: int, kernel_width: int) -> jax.Array:
    K, CP, R, _ = w_pre.shape
    S = kernel_width
    return jnp.transpose(w_pre[..., 0].reshape(K, S, CP // S, R), (0, 2, 3, 1))[:, :channels]


def image_post_extension_factor(
    *,
    input_channels: int,
    kernel_width: int,
    kernel_height: int,
    stride_x: int = 1,
    atomic_c: int = ATOMIC_C,
    compiler_rule: bool = True,
) -> int:
    """Post-extension factor of image weights (spec 6.4): 4, 2 or 1 (none).

    With ``C' = S*Cin``: 4 if ``Cin*stride_x*3 + C' <= atomic_c`` and ``C' <= atomic_c/4``;
    else 2 if ``Cin*stride_x + C' <= atomic_c`` and ``C' <= atomic_c/2``; else 1. Always 1
    when ``stride_x > S``. ``compiler_rule=True`` also applies NVDLA's compiler rule that
    skips post-extension (factor 1) when ``R // f < 2``.
    """
    cin = _static_int(input_channels, 1, 1 << 16, "input_channels")
    S = _static_int(kernel_width, 1, 1 << 16, "kernel_width")
    R = _static_int(kernel_height, 1, 1 << 16, "kernel_height")
    sx = _static_int(stride_x, 1, 1 << 16, "stride_x")
    ac = _static_int(atomic_c, 1, 1 << 12, "atomic_c")
    compiler_rule = V.check_flag(compiler_rule, "compiler_rule")
    cp = S * cin
    if sx > S:
        return 1
    if cin * sx * 3 + cp <= ac and cp <= ac // 4:
        f = 4
    elif cin * sx + cp <= ac and cp <= ac // 2:
        f = 2
    else:
        return 1
    return 1 if compiler_rule and R // f < 2 else f


def _post_ext_elems(shape_pre, kpg, f) -> np.ndarray:
    """Element position of every ``W_pre[k, c', r, 0]`` with post-extension ``f`` (spec 6.4).

    Order: kernel group, row group (``f`` rows; the last holds ``R mod f``), kernel in
    group, row in row group, channel ``c'``.
    """
    K, CP, R, _ = shape_pre
    k = np.arange(K, dtype=np.int64)[:, None, None, None]
    c = np.arange(CP, dtype=np.int64)[None, :, None, None]
    r = np.arange(R, dtype=np.int64)[None, None, :, None]
    kg, kk, g, rr = k // kpg, k % kpg, r // f, r % f
    kgsize = np.minimum(kpg, K - kg * kpg)
    rgsize = np.minimum(f, R - g * f)
    return kg * kpg * CP * R + kgsize * CP * (g * f) + kk * rgsize * CP + rr * CP + c


def _image_builder(shape_pre, bpe, kpg, cpb, cbuf, f):
    n = int(np.prod(shape_pre))
    elems = _dc_elems(shape_pre, kpg, cpb) if f == 1 else _post_ext_elems(shape_pre, kpg, f)
    return elems * bpe, bpe, B.round_up(n * bpe, cbuf)


def _image_setup(shape_kcrs, dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width):
    K, C, R, S = B.check_shape(shape_kcrs, 4, "shape_kcrs (KCRS)")
    cin = _static_int(input_channels, C, 1 << 16, "input_channels (>= the weights' C)")
    bpe = B.element_bytes(dtype)
    kpg, cpb, cbuf = _check_atomics(atomic_k, atomic_c, cbuf_width, bpe)
    auto = image_post_extension_factor(
        input_channels=cin, kernel_width=S, kernel_height=R, stride_x=stride_x, atomic_c=cpb
    )
    if post_extension is None:
        f = auto
    else:
        f = _static_int(post_extension, 1, 4, "post_extension")
        hw = image_post_extension_factor(
            input_channels=cin, kernel_width=S, kernel_height=R, stride_x=stride_x, atomic_c=cpb, compiler_rule=False
        )
        if f not in (1, 2, 4) or (f > 1 and f > hw):
            raise RangeError(
                f"post_extension must be 1 or an eligible factor (<= {hw}: spec 6.4 "
                f"with Cin={cin}, S={S}, stride_x={stride_x}); got {post_extension}"
            )
    shape_pre = (K, S * cin, R, 1)
    return B.cached_placement(_image_builder, shape_pre, bpe, kpg, cpb, cbuf, f), cin


def image_weight_offsets(
    shape_kcrs,
    dtype: Any,
    *,
    input_channels: int,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    atomic_k: int = ATOMIC_K,
    atomic_c: int = ATOMIC_C,
) -> np.ndarray:
    """Byte offsets of the pre-extended weights ``W_pre[k, c', r, 0]`` (shape ``(K, S*Cin, R, 1)``).

    ``post_extension`` 1: the DC layout of ``W_pre``; 2 or 4: the post-extended order of
    spec 6.4 (kernel group, row group, kernel, row in group, channel). ``None`` picks
    :func:`image_post_extension_factor` with the compiler rule.
    """
    p, _ = _image_setup(shape_kcrs, dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, CBUF_WIDTH)
    return p.byte_index[..., 0].astype(np.int64)


def pack_image_weights(
    w: Any,
    *,
    input_channels: int,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    dtype: Any = None,
    atomic_k: int = ATOMIC_K,
    atomic_c: int = ATOMIC_C,
    cbuf_width: int = CBUF_WIDTH,
) -> jax.Array:
    """Byte image of image-input (pixel) convolution weights ``w[K, C, R, S]`` (spec 6.4).

    Steps: zero channels up to ``input_channels``; pre-extension to ``(K, S*Cin, R, 1)``
    (:func:`pre_extend_image_weights`); then either the DC layout of that tensor
    (``post_extension=1``) or the post-extended order (2 or 4; see
    :func:`image_weight_offsets`); zero tail padding to a multiple of ``cbuf_width``.

    Args:
      w: ``(K, C, R, S)`` weights, ``C <= input_channels``.
      input_channels: channels of the input surface (e.g. 4 for RGBA with RGB weights).
      stride_x: the convolution's x stride (post-extension eligibility).
      post_extension: ``None`` = what NVDLA's compiler picks
        (:func:`image_post_extension_factor`); 1 = none; 2 or 4 = forced (must be eligible).
      dtype: element type; ``None`` uses ``w.dtype``.
    """
    w = B.as_elements(w, dtype, "w")
    p, cin = _image_setup(w.shape, w.dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width)
    return _pack_image(w, p.source, cin=cin)


@eager_program(static_argnames=("cin",))
def _pack_image(w: jax.Array, source: np.ndarray, *, cin: int) -> jax.Array:
    """Pre-extension and placement of image weights (one program when called eagerly)."""
    return B.place_source(_pre_extend(w, cin), source)


def unpack_image_weights(
    image: Any,
    shape_kcrs,
    *,
    input_channels: int,
    dtype: Any,
    stride_x: int = 1,
    post_extension: Optional[int] = None,
    atomic_k: int = ATOMIC_K,
    atomic_c: int = ATOMIC_C,
    cbuf_width: int = CBUF_WIDTH,
) -> jax.Array:
    """Inverse of :func:`pack_image_weights`: the original ``(K, C, R, S)`` weights."""
    K, C, R, S = B.check_shape(shape_kcrs, 4, "shape_kcrs (KCRS)")
    p, _ = _image_setup(shape_kcrs, dtype, input_channels, stride_x, post_extension, atomic_k, atomic_c, cbuf_width)
    image = B.check_image(image, p.size)
    return _unpack_image(image, p.byte_index, dtype_name=B.element_type(dtype).name, channels=C, kernel_width=S)


@eager_program(static_argnames=("dtype_name", "channels", "kernel_width"))
def _unpack_image(image, byte_index, *, dtype_name: str, channels: int, kernel_width: int) -> jax.Array:
    """Gather and un-extension of image weights (one program when called eagerly)."""
    return _unextend(B.gather_index(image, byte_index, dtype_name), channels, kernel_width)


# ------------------------------------------------------------------- SDP operands (6.7)

_COMPONENTS = ("alu", "mul")
_PROC_EPA = {"INT8": 32, "INT16": 16, "FP16": 16}


def _operands(alu, mul, dtype) -> tuple[tuple[jax.Array, ...], tuple[str, ...]]:
    """The given operands, checked and converted to the element type (stacked on a last
    axis inside the packing program), and their component names."""
    given = [(n, v) for n, v in zip(_COMPONENTS, (alu, mul)) if v is not None]
    if not given:
        raise RangeError("give at least one of alu= and mul=")
    arrs = tuple(B.as_elements(v, dtype, n) for n, v in given)
    if len({a.shape for a in arrs}) != 1 or len({a.dtype for a in arrs}) != 1:
        raise ShapeError(
            f"alu and mul must have the same shape and dtype; got {[(a.shape, str(a.dtype)) for a in arrs]}"
        )
    return arrs, tuple(n for n, _ in given)


def _components(components) -> tuple[str, ...]:
    comps = tuple(components)
    if comps not in (("alu",), ("mul",), ("alu", "mul")):
        raise RangeError(f"components must be ('alu',), ('mul',) or ('alu', 'mul'); got {components!r}")
    return comps


def pack_sdp_per_channel(alu: Any = None, mul: Any = None, *, dtype: Any = None) -> jax.Array:
    """Byte image of per-channel SDP operands (bias, PReLU, batch-norm; spec 6.7).

    A contiguous ``1 x 1 x C`` array in channel order with 1- or 2-byte components (from
    the element type). With both ``alu`` and ``mul`` (batch-norm, ``DATA_USE = BOTH``) the
    components are interleaved per channel: ``[alu_0, mul_0, alu_1, mul_1, ...]``. No padding.

    Args:
      alu, mul: ``(C,)`` operands (at least one).
      dtype: element type (int8, int16, fp16); ``None`` uses the arrays' dtype.
    """
    arrs, _ = _operands(alu, mul, dtype)
    if arrs[0].ndim != 1:
        raise ShapeError(f"per-channel operands must be 1-D (C,), got shape {arrs[0].shape}")
    return _pack_per_channel(arrs, size=arrs[0].size * len(arrs) * B.element_bytes(arrs[0].dtype))


@eager_program(static_argnames=("size",))
def _pack_per_channel(arrs, *, size: int) -> jax.Array:
    return B.elements_image(jnp.stack(arrs, axis=-1), size)


def unpack_sdp_per_channel(
    image: Any, channels: int, *, dtype: Any, components=("alu", "mul")
) -> tuple[jax.Array, ...]:
    """Inverse of :func:`pack_sdp_per_channel`: a tuple of ``(C,)`` arrays in ``components`` order."""
    comps = _components(components)
    C = _static_int(channels, 1, 1 << 24, "channels")
    image = B.check_image(image, C * len(comps) * B.element_bytes(dtype))
    return _unpack_per_channel(image, channels=C, ncomp=len(comps), dtype_name=B.element_type(dtype).name)


@eager_program(static_argnames=("channels", "ncomp", "dtype_name"))
def _unpack_per_channel(image, *, channels: int, ncomp: int, dtype_name: str) -> tuple[jax.Array, ...]:
    vals = B.image_elements(image, channels * ncomp, dtype_name).reshape(channels, ncomp)
    return tuple(vals[:, i] for i in range(ncomp))


def _sdp_builder(shape_chw, ncomp, cb, epa, line_stride, surf_stride):
    slot = ncomp * cb
    nchw = (1,) + shape_chw
    line, surf, batch, size = _cube_geometry(nchw, slot, epa, line_stride, surf_stride, None, 32)
    off = _cube_offsets(nchw, slot, epa, line, surf, batch)[0]
    return off[..., None] + np.arange(ncomp, dtype=np.int64) * cb, cb, size


def _sdp_placement(shape_chw, ncomp, dtype, proc_precision, line_stride, surf_stride):
    shape_chw = B.check_shape(shape_chw, 3, "shape_chw (CHW)")
    if not isinstance(proc_precision, str) or proc_precision not in _PROC_EPA:
        raise RangeError(f"proc_precision must be one of {tuple(_PROC_EPA)}, got {proc_precision!r}")
    bpa = _PROC_EPA[proc_precision] * ncomp * B.element_bytes(dtype)
    if bpa < 32:
        raise RangeError(
            f"{proc_precision} processing with {ncomp} 1-byte component gives "
            f"{bpa}-byte atoms; per-element operands need 32, 64 or 128 bytes per atom "
            "(use 2-byte components)"
        )
    return B.cached_placement(
        _sdp_builder, shape_chw, ncomp, B.element_bytes(dtype), _PROC_EPA[proc_precision], line_stride, surf_stride
    )


def sdp_per_element_offsets(
    shape_chw,
    dtype: Any,
    *,
    proc_precision: str,
    components=("alu", "mul"),
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
) -> np.ndarray:
    """Byte offset of every per-element SDP operand component (spec 6.7).

    ``epa = 32`` for INT8 processing, 16 for INT16/FP16; ``bytes_per_atom = epa * ncomp * cb``;
    ``off(c, h, w, comp) = (c // epa)*surf_stride + h*line_stride + w*bytes_per_atom
    + (c % epa)*ncomp*cb + comp*cb``; packed strides by default
    (``line_stride = W*bytes_per_atom``, ``surf_stride = line_stride*H``).

    Returns:
      int64 array of shape ``(C, H, W, ncomp)``.
    """
    p = _sdp_placement(shape_chw, len(_components(components)), dtype, proc_precision, line_stride, surf_stride)
    return p.byte_index[..., 0].astype(np.int64)


def pack_sdp_per_element(
    alu: Any = None,
    mul: Any = None,
    *,
    proc_precision: str,
    dtype: Any = None,
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
) -> jax.Array:
    """Byte image of per-element SDP operands (bias, element-wise; spec 6.7).

    The feature-cube scheme with ``epa`` elements per atom (32 for INT8 processing, 16 for
    INT16/FP16), each element holding its components (ALU first, then MUL) back to back;
    offsets as in :func:`sdp_per_element_offsets`. Padding channels and stride gaps are 0;
    the image ends with the last atom.

    Args:
      alu, mul: ``(C, H, W)`` operands (at least one).
      proc_precision: SDP processing precision ``"INT8"``, ``"INT16"`` or ``"FP16"``.
      dtype: element type (1-byte int8 or 2-byte int16/fp16 components).
    """
    arrs, comps = _operands(alu, mul, dtype)
    if arrs[0].ndim != 3:
        raise ShapeError(f"per-element operands must be 3-D (C, H, W), got shape {arrs[0].shape}")
    p = _sdp_placement(arrs[0].shape, len(comps), arrs[0].dtype, proc_precision, line_stride, surf_stride)
    return _pack_per_element(arrs, p.source)


@eager_program
def _pack_per_element(arrs, source: np.ndarray) -> jax.Array:
    return B.place_source(jnp.stack(arrs, axis=-1), source)


def unpack_sdp_per_element(
    image: Any,
    shape_chw,
    *,
    proc_precision: str,
    dtype: Any,
    components=("alu", "mul"),
    line_stride: Optional[int] = None,
    surf_stride: Optional[int] = None,
) -> tuple[jax.Array, ...]:
    """Inverse of :func:`pack_sdp_per_element`: ``(C, H, W)`` arrays in ``components`` order."""
    comps = _components(components)
    p = _sdp_placement(shape_chw, len(comps), dtype, proc_precision, line_stride, surf_stride)
    image = B.check_image(image, p.size)
    return _unpack_per_element(image, p.byte_index, dtype_name=B.element_type(dtype).name, ncomp=len(comps))


@eager_program(static_argnames=("dtype_name", "ncomp"))
def _unpack_per_element(image, byte_index, *, dtype_name: str, ncomp: int) -> tuple[jax.Array, ...]:
    vals = B.gather_index(image, byte_index, dtype_name)
    return tuple(vals[..., i] for i in range(ncomp))


# --------------------------------------------------------------------- alignment (6.8)

# data kind -> (start address, line stride, surface stride, planar/cube stride, total size)
# alignment in bytes; None where the spec has no requirement.
ALIGNMENT: dict[str, tuple[Optional[int], ...]] = {
    "feature": (32, 32, 32, 32, None),
    "weight": (256, None, None, None, 128),
    "wmb": (256, None, None, None, 128),
    "wgs": (256, None, None, None, 128),
    "pixel": (32, 32, None, None, None),
    "bias": (32, 32, 32, None, None),
    "prelu": (32, None, None, None, None),
    "batch_norm": (32, None, None, None, None),
    "element_wise": (32, 32, None, None, 32),
}
_ALIGN_FIELDS = ("address", "line_stride", "surf_stride", "cube_stride", "size")


def check_alignment(kind: str, **values: int) -> None:
    """Raises ValueError unless every given value meets spec 6.8's alignment for ``kind``.

    Args:
      kind: one of ``ALIGNMENT``'s keys.
      values: any of ``address``, ``line_stride``, ``surf_stride``, ``cube_stride``, ``size``
        (bytes).
    """
    V.check_choice(kind, tuple(ALIGNMENT), "kind")
    for field, value in values.items():
        if field not in _ALIGN_FIELDS:
            raise ArgTypeError(f"unknown alignment field {field!r}; use one of {_ALIGN_FIELDS}")
        req = ALIGNMENT[kind][_ALIGN_FIELDS.index(field)]
        if req is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ArgTypeError(f"{field} must be a non-negative int, got {value!r}")
        if value < 0:
            raise RangeError(f"{field} must be a non-negative int, got {value}")
        if value % req:
            raise RangeError(f"{kind} {field} must be a multiple of {req} bytes, got {value}")
