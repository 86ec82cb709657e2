"""Element types, byte codecs and the one byte-placement mechanism every NVDLA layout uses.

A layout is described by the byte offset of every element of a tensor (a static NumPy
array computed from static shapes and parameters) and the size of the image. Packing
gathers the tensor's little-endian bytes into an image whose unused bytes are 0;
unpacking gathers them back. Both are single ``jnp`` gathers, so they are pure,
jittable and vmappable, and work identically with ``jax_enable_x64`` on or off.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import to_float16
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError

# Element types of NVDLA in-memory data: name -> (NumPy dtype, bytes per element).
_ELEMENT_TYPES: dict[str, tuple[np.dtype, int]] = {
    "int8": (np.dtype(np.int8), 1),
    "uint8": (np.dtype(np.uint8), 1),
    "int16": (np.dtype(np.int16), 2),
    "uint16": (np.dtype(np.uint16), 2),
    "float16": (np.dtype(np.float16), 2),
}
_ALIASES = {"fp16": "float16", "half": "float16"}
ELEMENT_TYPES: tuple[str, ...] = ("int8", "uint8", "int16", "uint16", "float16")
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16}


def element_type(dtype: Any, name: str = "dtype") -> np.dtype:
    """Normalises an element type (``"int8"``, ``"int16"``, ``"fp16"``, NumPy/JAX dtypes)."""
    if isinstance(dtype, str):
        key = _ALIASES.get(dtype.lower(), dtype.lower())
        if key in _ELEMENT_TYPES:
            return _ELEMENT_TYPES[key][0]
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is not None and dt.name in _ELEMENT_TYPES:
            return dt
    raise ArgTypeError(f"{name} must be one of {ELEMENT_TYPES} (or 'fp16'), got {dtype!r}")


def element_bytes(dtype: Any) -> int:
    """Bytes per element of an element type (1 or 2)."""
    return _ELEMENT_TYPES[element_type(dtype).name][1]


def _host_array(x: Any, name: str) -> Any:
    """``x`` if it is a JAX array (or tracer), else ``np.asarray(x)``; a ragged list, a
    string or an object raises :class:`ArgTypeError` naming ``name``."""
    if isinstance(x, jax.Array):
        return x
    if x is None or isinstance(x, (str, bytes)):
        raise ArgTypeError(f"{name} must be an array, got {x!r}")
    try:
        a = np.asarray(x)
    except (ValueError, TypeError, OverflowError):
        raise ArgTypeError(f"{name} must be an array or a (nested) list of numbers of one shape") from None
    if a.dtype == object or a.dtype.kind in "USV":
        raise ArgTypeError(f"{name} must be an array of numbers, got dtype {a.dtype}")
    return a


def as_elements(x: Any, dtype: Any, name: str) -> jax.Array:
    """Converts ``x`` to the element type, checking the values when they are concrete.

    ``dtype=None`` takes the element type from ``x`` (which must then be one of
    ``ELEMENT_TYPES``). Otherwise integer targets need integer values inside the type's
    range (ValueError names the argument and the range); the ``float16`` target takes
    float16 arrays unchanged and rounds other float arrays to nearest-even.
    """
    if dtype is None:
        dt_in = getattr(x, "dtype", None)
        if dt_in is None or np.dtype(dt_in).name not in _ELEMENT_TYPES:
            raise ArgTypeError(
                f"{name} has dtype {dt_in}; pass dtype= (one of {ELEMENT_TYPES}) "
                "or give an array of one of those dtypes"
            )
        return _device(x)
    dt = element_type(dtype)
    arr = _host_array(x, name)  # jax.Array includes tracers
    if arr.dtype == dt:
        return _device(arr)
    if dt == np.float16:
        if not np.issubdtype(arr.dtype, np.floating):
            raise ArgTypeError(f"{name} must be a float array for dtype float16, got {arr.dtype}")
        return _device(arr.astype(np.float16)) if isinstance(arr, np.ndarray) else to_float16(arr)
    info = np.iinfo(dt)
    if np.issubdtype(arr.dtype, np.floating):
        V.check_integral(arr, name)
    elif not np.issubdtype(arr.dtype, np.integer):
        raise ArgTypeError(f"{name} must hold integers for dtype {dt.name}, got dtype {arr.dtype}")
    V.check_range(arr, int(info.min), int(info.max), name)
    if isinstance(arr, np.ndarray):
        return _device(arr.astype(dt))
    return arr.astype(dt)


def _device(x) -> jax.Array:
    """``x`` as a JAX array: a JAX array (traced too) as it is, host data transferred
    (``jnp.asarray`` would compile a copy program per shape and dtype)."""
    return x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x))


def to_bytes(x: jax.Array) -> jax.Array:
    """Little-endian bytes of every element: uint8 array of shape ``x.shape + (bpe,)``."""
    bpe = element_bytes(x.dtype)
    bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[bpe])
    if bpe == 1:
        return bits[..., None]
    return jnp.stack([(bits & 0xFF).astype(jnp.uint8), (bits >> 8).astype(jnp.uint8)], axis=-1)


def from_bytes(b: jax.Array, dtype: Any) -> jax.Array:
    """Inverse of :func:`to_bytes`: ``b[..., bpe]`` little-endian bytes to ``dtype`` elements."""
    dt = element_type(dtype)
    bpe = element_bytes(dt)
    b = b.astype(_UNSIGNED[bpe])
    bits = b[..., 0] if bpe == 1 else b[..., 0] | (b[..., 1] << 8)
    return jax.lax.bitcast_convert_type(bits, jnp.dtype(dt))


def round_up(n: int, m: int) -> int:
    """Smallest multiple of ``m`` that is ``>= n``."""
    return -(-n // m) * m


class Placement:
    """Where every byte of a tensor goes in an image (static, hashable by identity).

    ``byte_index`` has shape ``tensor.shape + (bpe,)``: the image position of each byte.
    ``source`` has shape ``(size,)``: for each image byte, the flat index of the tensor
    byte stored there, or ``tensor.size * bpe`` (a zero byte) for unused bytes.
    """

    def __init__(self, offsets: np.ndarray, bpe: int, size: int):
        offsets = np.asarray(offsets, np.int64)
        idx = offsets[..., None] + np.arange(bpe, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= size):
            raise RangeError(f"layout places bytes outside the image of {size} bytes")
        if np.unique(flat).size != flat.size:
            raise RangeError("layout places two elements at the same byte (strides too small)")
        if size >= 2**31:
            raise RangeError(f"image of {size} bytes exceeds the 2**31-byte limit of this library")
        source = np.full(size, flat.size, np.int32)
        source[flat] = np.arange(flat.size, dtype=np.int32)
        self.byte_index = idx.astype(np.int32)
        self.source = source
        self.bpe = bpe
        self.size = size
        self.shape = offsets.shape


# The kernels below are jitted so that eager calls cost one compiled dispatch per shape
# instead of one compilation per primitive; inside an outer jit they are inlined. The
# static index maps are passed as (NumPy) arguments, never cached as device arrays.


@jax.jit
def place_source(x: jax.Array, source: jax.Array) -> jax.Array:
    """:func:`place` with the placement's ``source`` map (traced into a caller's program)."""
    flat = jnp.concatenate([to_bytes(x).reshape(-1), jnp.zeros((1,), jnp.uint8)])
    return flat[source]


@functools.partial(jax.jit, static_argnums=2)
def gather_index(image: jax.Array, byte_index: jax.Array, dtype_name: str) -> jax.Array:
    """:func:`gather` on a checked image with the placement's ``byte_index`` (traced into a
    caller's program)."""
    return from_bytes(image[byte_index], dtype_name)


def place(x: jax.Array, p: Placement) -> jax.Array:
    """Packs ``x`` (shape ``p.shape``) into a uint8 image of ``p.size`` bytes, unused bytes 0."""
    return place_source(x, p.source)


def gather(image: jax.Array, p: Placement, dtype: Any, name: str = "image") -> jax.Array:
    """Reads the tensor of shape ``p.shape`` back from a uint8 image (inverse of :func:`place`)."""
    return gather_index(check_image(image, p.size, name), p.byte_index, element_type(dtype).name)


@functools.partial(jax.jit, static_argnums=(1, 2))
def image_elements(image: jax.Array, n: int, dtype_name: str) -> jax.Array:
    """The first ``n`` elements of ``dtype`` stored back to back at the start of ``image``."""
    bpe = element_bytes(dtype_name)
    return from_bytes(image[: n * bpe].reshape(n, bpe), dtype_name)


@functools.partial(jax.jit, static_argnums=1)
def elements_image(x: jax.Array, size: int) -> jax.Array:
    """The bytes of ``x`` back to back, zero-padded to ``size`` bytes."""
    flat = to_bytes(x).reshape(-1)
    return jnp.concatenate([flat, jnp.zeros((size - flat.shape[0],), jnp.uint8)])


def check_image(image: Any, min_size: int, name: str = "image") -> jax.Array:
    """Checks that ``image`` is a 1-D uint8 array of at least ``min_size`` bytes."""
    image = _host_array(image, name)
    if image.dtype != np.uint8:
        raise ArgTypeError(f"{name} must be a uint8 byte image, got dtype {image.dtype}")
    if image.ndim != 1:
        raise ShapeError(f"{name} must be 1-D (a byte image), got shape {image.shape}")
    if image.shape[0] < min_size:
        raise ShapeError(f"{name} has {image.shape[0]} bytes; this layout needs at least {min_size}")
    return _device(image)


def check_shape(shape: Any, ndim: int | tuple[int, ...], name: str) -> tuple[int, ...]:
    """Validates a static shape: a tuple of positive Python ints of the given rank(s)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ArgTypeError(f"{name} must be a tuple of ints, got {shape!r}")
    shape = tuple(shape)
    if any(isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) for s in shape):
        raise ArgTypeError(f"{name} must be a tuple of ints, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    ranks = (ndim,) if isinstance(ndim, int) else ndim
    if len(shape) not in ranks:
        raise ShapeError(f"{name} must have rank {' or '.join(map(str, ranks))}, got shape {shape}")
    if any(s < 1 for s in shape):
        raise ShapeError(f"{name} must have every dimension >= 1, got {shape}")
    return shape


def check_stride(value: Any, minimum: int, multiple: int, name: str) -> int:
    """Validates a static byte stride: a multiple of ``multiple`` and ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgTypeError(f"{name} must be a Python int (bytes), got {value!r}")
    value = int(value)
    if value < minimum or value % multiple:
        raise RangeError(f"{name} must be a multiple of {multiple} and >= {minimum} bytes; got {value}")
    return value


@functools.lru_cache(maxsize=256)
def cached_placement(builder, *args) -> Placement:
    """Memoised ``Placement(*builder(*args))`` for static layout parameters."""
    offsets, bpe, size = builder(*args)
    return Placement(offsets, bpe, size)
