"""Convolution and pooling window geometry, and gather-free patch extraction.

Nothing here knows about any chip. One :class:`ConvGeometry` describes where the
windows of a 2-D convolution or pool sit on an (H, W) image; :func:`window_taps` and
:func:`extract_patches` read them out with static strided slices (no gathers; on XLA:CPU small
patches are written tap by tap in a loop, which compiles faster), taps
outside the image holding a pad value that may be traced.

Window semantics (all static Python ints). With ``(pt, pb), (pl, pr) = padding``,
``(sv, sh) = stride`` and ``(dv, dh) = dilation``, output pixel ``(oy, ox)`` and
kernel tap ``(i, j)`` read image row and column::

    r = oy * sv - pt + i * dv        c = ox * sh - pl + j * dh

and a position outside ``[0, H) x [0, W)`` reads the pad value. ``out_hw`` is XLA's
rule ``(H + pt + pb - ((kh - 1) * dv + 1)) // sv + 1`` (likewise for the width).
Negative padding entries crop, as in ``jax.lax.pad``: they come from
:meth:`ConvGeometry.from_window` (windows that start inside the image, or outputs
that stop before its end); :meth:`ConvGeometry.make` accepts only padding >= 0.
"""

from __future__ import annotations

import functools
import math

from dataclasses import dataclass
from typing import Any, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V
from hwjax.errors import RangeError, ShapeError

Pair = tuple[int, int]
Padding = Union[str, int, Sequence[int], Sequence[Sequence[int]]]

_MAX = 2**30  # bound on any geometry entry (keeps every index computation in int32 range)


def _pair(v: Any, name: str, lo: int) -> Pair:
    """``v`` (an int, or a pair of ints) as a pair of static Python ints >= ``lo``."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (v, v)
    try:
        a, b = v
    except (TypeError, ValueError):
        raise V.ArgTypeError(f"{name} must be an int or a pair of static Python ints, got {v!r}") from None
    return (V.check_static_int(a, lo, _MAX, f"{name}[0]"), V.check_static_int(b, lo, _MAX, f"{name}[1]"))


def _padding_pairs(padding: Any, *, lo: int) -> tuple[Pair, Pair]:
    """Explicit padding: an int p, a pair (ph, pw) or ((top, bottom), (left, right))."""
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        p = V.check_static_int(padding, lo, _MAX, "padding")
        return ((p, p), (p, p))
    try:
        a, b = padding
    except (TypeError, ValueError):
        raise V.ArgTypeError(
            "padding must be 'SAME', 'VALID', an int, a pair (vertical, horizontal) or "
            f"((top, bottom), (left, right)), got {padding!r}"
        ) from None
    if all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in (a, b)):
        ph, pw = _pair((a, b), "padding", lo)
        return ((ph, ph), (pw, pw))
    return (_pair(a, "padding[0]", lo), _pair(b, "padding[1]", lo))


def _dilated(k: int, d: int) -> int:
    return (k - 1) * d + 1


def _same_pads(size: int, k: int, s: int) -> Pair:
    """XLA's SAME rule: ``ceil(size / s)`` outputs, the extra padding at the bottom/right."""
    out = -(-size // s)
    total = max(0, (out - 1) * s + k - size)
    return (total // 2, total - total // 2)


@dataclass(frozen=True)
class ConvGeometry:
    """Static geometry of one 2-D window operation (convolution or pool) on an HW image.

    Fields (static Python ints, normalised to tuples, so instances are hashable and can
    be static ``jit`` arguments):

    * ``in_hw``: (H, W) of the input image, >= 1.
    * ``kernel``: (kh, kw) window shape, >= 1.
    * ``stride``: (vertical, horizontal), >= 1.
    * ``padding``: ((top, bottom), (left, right)); negative entries crop (see the
      module docstring).
    * ``dilation``: (vertical, horizontal) kernel dilation, >= 1 (default (1, 1)).

    Construction raises RangeError (naming the field) for out-of-range entries,
    ShapeError when there is no output pixel, ArgTypeError (a TypeError) for entries that
    are not ints.
    """

    in_hw: Pair
    kernel: Pair
    stride: Pair
    padding: tuple[Pair, Pair]
    dilation: Pair = (1, 1)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "in_hw", _pair(self.in_hw, "in_hw", 1))
        set_(self, "kernel", _pair(self.kernel, "kernel", 1))
        set_(self, "stride", _pair(self.stride, "stride", 1))
        set_(self, "dilation", _pair(self.dilation, "dilation", 1))
        set_(self, "padding", _padding_pairs(self.padding, lo=-_MAX))
        if min(self.out_hw) < 1:
            raise ShapeError(
                f"a {self.in_hw} input with a {self.kernel} kernel (dilation {self.dilation}), stride "
                f"{self.stride} and padding {self.padding} has no output pixels (out_hw = {self.out_hw})"
            )

    # ------------------------------------------------------------------ constructors

    @staticmethod
    def make(in_hw, kernel, stride=(1, 1), padding: Padding = "VALID", dilation=(1, 1)) -> "ConvGeometry":
        """From ``padding`` = ``"SAME"``, ``"VALID"``, an int ``p`` (all four sides), a pair
        ``(ph, pw)`` or ``((top, bottom), (left, right))``, all >= 0.

        ``"SAME"`` is XLA's rule (``jax.lax.padtype_to_pads`` on the dilated kernel):
        ``ceil(H / sv)`` output rows, total padding ``max(0, (OH - 1) * sv + (kh - 1) * dv
        + 1 - H)``, of which ``total // 2`` on top and the rest at the bottom; likewise for
        the width. ``"VALID"``: no padding. ``stride`` and ``dilation`` may be ints.
        """
        in_hw, kernel = _pair(in_hw, "in_hw", 1), _pair(kernel, "kernel", 1)
        stride, dilation = _pair(stride, "stride", 1), _pair(dilation, "dilation", 1)
        if isinstance(padding, str):
            if padding == "VALID":
                pads = ((0, 0), (0, 0))
            elif padding == "SAME":
                pads = tuple(_same_pads(in_hw[i], _dilated(kernel[i], dilation[i]), stride[i]) for i in range(2))
            else:
                raise RangeError(f"padding must be 'SAME', 'VALID', an int or explicit pairs, got {padding!r}")
        else:
            pads = _padding_pairs(padding, lo=0)
        return ConvGeometry(in_hw, kernel, stride, pads, dilation)

    @staticmethod
    def from_window(in_hw, kernel, window_start, window_stride, out_hw, dilation=(1, 1)) -> "ConvGeometry":
        """From the first window's top-left position and the output shape.

        Output ``(oy, ox)`` tap ``(i, j)`` reads row ``window_start[0] + oy * sv + i * dv``
        and column ``window_start[1] + ox * sh + j * dh`` (outside the image: the pad
        value). ``window_start`` may be negative (padding) or positive (the windows start
        inside the image); the result has ``padding = ((-r0, r0 + (OH - 1) * sv +
        (kh - 1) * dv + 1 - H), ...)``, so its ``out_hw`` is exactly ``out_hw``.
        """
        in_hw, kernel = _pair(in_hw, "in_hw", 1), _pair(kernel, "kernel", 1)
        stride, dilation = _pair(window_stride, "window_stride", 1), _pair(dilation, "dilation", 1)
        start = _pair(window_start, "window_start", -_MAX)
        out = _pair(out_hw, "out_hw", 1)
        pads = tuple(
            (-start[i], start[i] + (out[i] - 1) * stride[i] + _dilated(kernel[i], dilation[i]) - in_hw[i])
            for i in range(2)
        )
        return ConvGeometry(in_hw, kernel, stride, pads, dilation)

    # ---------------------------------------------------------------- derived values

    @property
    def out_hw(self) -> Pair:
        """(OH, OW) = ``(H + top + bottom - ((kh - 1) * dv + 1)) // sv + 1`` (and the width)."""
        return tuple(
            (self.in_hw[i] + sum(self.padding[i]) - self.effective_kernel[i]) // self.stride[i] + 1 for i in range(2)
        )  # type: ignore[return-value]

    @property
    def pad_top_left(self) -> Pair:
        """(top, left) padding."""
        return (self.padding[0][0], self.padding[1][0])

    @property
    def window_start(self) -> Pair:
        """Image (row, column) of output (0, 0)'s tap (0, 0): ``(-top, -left)``."""
        return (-self.padding[0][0], -self.padding[1][0])

    @property
    def effective_kernel(self) -> Pair:
        """The dilated window extent ``((kh - 1) * dv + 1, (kw - 1) * dh + 1)``."""
        return (_dilated(self.kernel[0], self.dilation[0]), _dilated(self.kernel[1], self.dilation[1]))

    @property
    def inside(self) -> bool:
        """True when every window lies inside the image (no tap reads the pad value)."""
        (pt, pb), (pl, pr) = self.padding
        return max(pt, pb, pl, pr) <= 0


def pool_out_hw(in_hw, window, stride=None, window_start=(0, 0)) -> Pair:
    """Output shape of a VALID pool: the most windows that fit inside the image.

    ``((H - r0 - kh) // sv + 1, (W - c0 - kw) // sh + 1)`` with ``stride`` defaulting to
    ``window`` and ``window_start`` = (r0, c0) >= 0 the first window's top-left pixel.
    Raises ValueError when no window fits.
    """
    in_hw, window = _pair(in_hw, "in_hw", 1), _pair(window, "window", 1)
    stride = window if stride is None else _pair(stride, "stride", 1)
    start = _pair(window_start, "window_start", 0)
    out = tuple((in_hw[i] - start[i] - window[i]) // stride[i] + 1 for i in range(2))
    if min(out) < 1:
        raise ShapeError(f"no {window} pooling window starting at {start} fits inside a {in_hw} image")
    return out  # type: ignore[return-value]


# ----------------------------------------------------------------- patch extraction


def _pad_scalar(pad_value: Any, dtype) -> jax.Array:
    """The pad value as a 0-d array of ``dtype`` (checked to be representable when concrete)."""
    if isinstance(pad_value, (bool, np.bool_)) or pad_value is None or isinstance(pad_value, (str, bytes)):
        raise V.ArgTypeError(f"pad_value must be a number scalar, got {pad_value!r}")
    try:
        a = pad_value if isinstance(pad_value, jax.core.Tracer) else np.asarray(pad_value)
    except (TypeError, ValueError):
        raise V.ArgTypeError(f"pad_value must be a number scalar, got {pad_value!r}") from None
    if a.shape != ():
        raise V.ArgTypeError(f"pad_value must be a scalar, got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise V.ArgTypeError(f"pad_value must be an integer or float scalar, got dtype {a.dtype}")
    if jnp.issubdtype(dtype, jnp.integer):
        if not np.issubdtype(a.dtype, np.integer):
            raise V.ArgTypeError(
                f"pad_value must be an integer scalar for an integer x ({np.dtype(dtype)}), got dtype {a.dtype}"
            )
        info = jnp.iinfo(dtype)
        V.check_range(a, int(info.min), int(info.max), f"pad_value (for x of dtype {np.dtype(dtype)})")
    return a.astype(dtype) if isinstance(a, jax.core.Tracer) else np.asarray(a).astype(np.dtype(dtype))


def _check_image(x: Any, geom: ConvGeometry) -> jax.Array:
    if not isinstance(geom, ConvGeometry):
        raise V.ArgTypeError(f"geom must be a ConvGeometry, got {type(geom).__name__}")
    x = V.as_array(x, "x")
    V.kind(x, "x")
    if x.ndim < 3 or tuple(x.shape[-3:-1]) != geom.in_hw:
        raise ShapeError(f"x must have shape (..., H, W, C) with (H, W) = geom.in_hw = {geom.in_hw}, got {x.shape}")
    return x


def window_taps(x, geom: ConvGeometry, *, pad_value) -> list[jax.Array]:
    """The kh*kw window taps of ``x`` (..., H, W, C), each (..., OH, OW, C), in (kh, kw) order.

    Tap ``(i, j)`` holds ``x[..., r, c, :]`` at the rows and columns of the module
    docstring for every output ``(oy, ox)``; positions outside the image hold
    ``pad_value``. Built from one ``jax.lax.pad`` (only where padding is positive) and
    static strided slices: no gathers, differentiable in ``x``, jit- and vmap-safe.

    Args:
      x: (..., H, W, C) array with (H, W) = ``geom.in_hw``.
      geom: the :class:`ConvGeometry`.
      pad_value: a scalar (Python number, 0-d array or traced scalar) cast to ``x``'s
        dtype; for an integer ``x`` it must be an integer representable in that dtype
        (checked when concrete).
    """
    x = _check_image(x, geom)
    pad = _pad_scalar(pad_value, x.dtype)  # validated even where no tap reads it
    return list(_window_taps_jit(x, pad, geom))


def _grown(x: jax.Array, pad: jax.Array, geom: ConvGeometry) -> tuple[jax.Array, tuple[int, int]]:
    """``x`` with the positive padding of ``geom`` added (``pad`` in the new positions), and
    the row and column of the first window in it (> 0 where the padding crops)."""
    (pt, pb), (pl, pr) = geom.padding
    grow = (max(0, pt), max(0, pb), max(0, pl), max(0, pr))
    if any(grow):
        lead = x.ndim - 3
        x = jax.lax.pad(x, pad, [(0, 0, 0)] * lead + [(grow[0], grow[1], 0), (grow[2], grow[3], 0), (0, 0, 0)])
    return x, (max(0, -pt), max(0, -pl))


def _tap_origins(geom: ConvGeometry, first: tuple[int, int]) -> list[tuple[int, int]]:
    """Row and column, in the grown image, of each tap's first window, in (kh, kw) order."""
    (r0, c0), (dv, dh) = first, geom.dilation
    return [(r0 + i * dv, c0 + j * dh) for i in range(geom.kernel[0]) for j in range(geom.kernel[1])]


def _tap(x: jax.Array, origin, geom: ConvGeometry) -> jax.Array:
    """The tap whose first window starts at ``origin`` (static ints or traced int32
    scalars) of the grown image ``x``: (..., OH, OW, C)."""
    lead = x.ndim - 3
    (oh, ow), (sv, sh) = geom.out_hw, geom.stride
    span = ((oh - 1) * sv + 1, (ow - 1) * sh + 1)
    if all(isinstance(o, int) for o in origin):
        start = (0,) * lead + (*origin, 0)
        limit = x.shape[:lead] + (origin[0] + span[0], origin[1] + span[1], x.shape[-1])
        return jax.lax.slice(x, start, limit, (1,) * lead + (sv, sh, 1))
    start = [jnp.asarray(v, jnp.int32) for v in (0,) * lead + (*origin, 0)]  # one index dtype under x64 too
    window = jax.lax.dynamic_slice(x, start, x.shape[:lead] + (*span, x.shape[-1]))
    return window if (sv, sh) == (1, 1) else window[..., ::sv, ::sh, :]


@functools.partial(jax.jit, static_argnums=2)
def _window_taps_jit(x: jax.Array, pad: jax.Array, geom: ConvGeometry) -> tuple[jax.Array, ...]:
    """The taps of :func:`window_taps` as one compiled program (not one per slice when
    called eagerly)."""
    x, first = _grown(x, pad, geom)
    return tuple(_tap(x, o, geom) for o in _tap_origins(geom, first))


def window_products_sum(x, k, geom: ConvGeometry, *, pad_value) -> jax.Array:
    """``SUM_t window_taps(x)[t] * k[t]``: a depthwise convolution's sum of products.

    ``x`` (..., H, W, C) and ``k`` (kh, kw, C) are int16 arrays holding values whose every
    product fits int16 (8-bit values: ``|x| <= 255``, ``|k| <= 128`` give at most 32640);
    each product is formed in int16 and the products are added in int32, wrapping modulo
    ``2**32``. Returns int32 (..., OH, OW, C). Integer addition modulo ``2**32`` is
    associative and commutative, so the order of the additions does not change a bit:

    * up to :data:`UNROLLED_TAPS` taps, one multiply-add per tap (the fastest form of a
      3x3 depthwise layer on XLA:CPU);
    * more taps (a pool over the whole image, a 25x5 window, run as a depthwise
      convolution), the products of :func:`extract_patches` summed over the tap axis in
      one reduction: a few operations instead of four per tap, so the program stays small
      and compiles in a fraction of the time.

    No gradient (integers); jit- and vmap-safe; ``pad_value`` as in :func:`window_taps`.
    """
    kh, kw, c = k.shape
    if kh * kw <= UNROLLED_TAPS:
        taps = window_taps(x, geom, pad_value=pad_value)
        acc = jnp.zeros((), jnp.int32)
        for t, tap in enumerate(taps):
            acc = acc + (tap * k[t // kw, t % kw]).astype(jnp.int32)
        return acc
    p = extract_patches(x, geom, pad_value=pad_value)
    p = p.reshape(*p.shape[:-1], kh * kw, c)
    return jnp.sum((p * k.reshape(kh * kw, c)).astype(jnp.int32), axis=-2, dtype=jnp.int32)


#: window sizes up to which :func:`window_products_sum` unrolls the taps
UNROLLED_TAPS = 16


def extract_patches(x, geom: ConvGeometry, *, pad_value, width: int | None = None) -> jax.Array:
    """The im2col patches of ``x``: (..., H, W, C) -> (..., OH, OW, kh*kw*C).

    ``patches[..., oy, ox, (i*kw + j)*C + ch] = x[..., r, c, ch]`` with ``r``, ``c`` as
    in the module docstring ((kh, kw, c) order, channels fastest), ``pad_value``
    outside the image: the :func:`window_taps` concatenated along the channel axis
    (no gathers: static slices and one concatenation, or, on XLA:CPU for patches of at most
    2**20 elements, a loop that writes one tap per iteration; the same values either way;
    under ``vmap`` an integer image's size counts the whole batch). Same arguments as
    :func:`window_taps`; the result has ``x``'s dtype. ``width`` (static, at least
    ``kh*kw*C``): the patches' last axis that long, zeros after the taps (for a dot whose
    library kernel runs faster on a longer contraction; the loop writes its taps into the
    wider buffer directly).
    """
    x = _check_image(x, geom)
    k = geom.kernel[0] * geom.kernel[1] * x.shape[-1]
    width = k if width is None else V.check_static_int(width, k, 2**30, "width")
    return _patches_jit(x, _pad_scalar(pad_value, x.dtype), geom, width)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _patches_jit(x: jax.Array, pad: jax.Array, geom: ConvGeometry, width: int) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.integer):  # no gradient: the vmap rule may see the batch
        return _batched_patches(geom, width)(x, pad)
    return _patches(x, pad, geom, width)


@functools.lru_cache(maxsize=None)
def _batched_patches(geom: ConvGeometry, width: int):
    """:func:`_patches` as a ``custom_vmap`` function (integer images; ``custom_vmap`` has
    no reverse-mode rule). Under ``vmap`` the mapped axis becomes a leading axis of the
    image, so the choice between the loop and the slices sees the whole batch, as a
    batched call does (a vmapped loop over a large batch ran 1.3-1.4x slower than the
    slices). A pad value per example maps the plain implementation instead."""
    impl = functools.partial(_patches, geom=geom, width=width)
    f = jax.custom_batching.custom_vmap(lambda x, pad: impl(x, pad))

    @f.def_vmap
    def rule(axis_size, in_batched, x, pad):
        xb, pb = in_batched
        if pb or not xb:
            return jax.vmap(impl, in_axes=(0 if xb else None, 0 if pb else None))(x, pad), True
        return f(x, pad), True

    return f


def _patches(x: jax.Array, pad: jax.Array, geom: ConvGeometry, width: int) -> jax.Array:
    """The patches of :func:`extract_patches` (``x`` checked, ``pad`` in its dtype), the
    last axis ``width`` long."""
    x, first = _grown(x, pad, geom)
    origins = _tap_origins(geom, first)
    if len(origins) == 1:
        return _widened(_tap(x, origins[0], geom), width)
    if geom.out_hw == (1, 1):
        # one window (a global pool run as a depthwise convolution): the patch is that
        # window of the image, rows and columns in (kh, kw, C) order, one slice instead of
        # a loop over kh * kw taps (KWS's 25x5 average pool on xs3: 125 loop iterations
        # per chunk)
        (kh, kw), (dv, dh), lead = geom.kernel, geom.dilation, x.shape[:-3]
        start = (0,) * len(lead) + (*first, 0)
        limit = x.shape[:-3] + (first[0] + (kh - 1) * dv + 1, first[1] + (kw - 1) * dh + 1, x.shape[-1])
        window = jax.lax.slice(x, start, limit, (1,) * len(lead) + (dv, dh, 1))
        return _widened(window.reshape(*lead, 1, 1, kh * kw * x.shape[-1]), width)
    loop, slices = (
        functools.partial(f, origins=origins, geom=geom, width=width) for f in (_patches_by_loop, _patches_by_slices)
    )
    if math.prod(x.shape[:-3]) * math.prod(geom.out_hw) * len(origins) * x.shape[-1] > _LOOP_MAX_ELEMENTS:
        return slices(x)
    return jax.lax.platform_dependent(x, cpu=loop, default=slices)


def _widened(p: jax.Array, width: int) -> jax.Array:
    """``p`` with zeros after its last axis's entries, up to ``width``."""
    extra = width - p.shape[-1]
    return p if extra == 0 else jnp.pad(p, [(0, 0)] * (p.ndim - 1) + [(0, extra)])


# Patches larger than this (elements, as traced) are read by static slices on every
# platform: XLA:CPU runs the slices' kernels in parallel, and above about 2**20 elements
# the loop took 1.3-1.9x their time (2-core CPU); below it the two took the same time.
_LOOP_MAX_ELEMENTS = 2**20


def _patches_by_slices(x: jax.Array, *, origins, geom: ConvGeometry, width: int) -> jax.Array:
    """The taps as static slices, concatenated (large patches on XLA:CPU; every size on
    other platforms, unchanged there)."""
    return _widened(jnp.concatenate([_tap(x, o, geom) for o in origins], axis=-1), width)


def _patches_by_loop(x: jax.Array, *, origins, geom: ConvGeometry, width: int) -> jax.Array:
    """The taps written one per iteration of a loop into the patches (XLA:CPU).

    The same values as :func:`_patches_by_slices`. XLA:CPU does not fuse a
    concatenation with its operands, so there every static slice is a kernel of its own,
    compiled separately (about 10 ms each; 9 per 3x3 layer), while the loop's body is
    compiled once for every tap. Up to ``_LOOP_MAX_ELEMENTS`` both ran equally fast.
    """
    c, t = x.shape[-1], len(origins)
    lead = x.shape[:-3]
    rows = jnp.asarray([o[0] for o in origins], jnp.int32)
    cols = jnp.asarray([o[1] for o in origins], jnp.int32)

    def write(k, out):
        tap = _tap(x, (rows[k], cols[k]), geom)
        at = [jnp.asarray(v, jnp.int32) for v in (0,) * len(lead) + (0, 0, k * c)]
        return jax.lax.dynamic_update_slice(out, tap, at)

    # the first tap, zeros after it, is the loop's initial value: one kernel writes the whole
    # buffer and the first tap at once (zeros, then the first tap written over them, took
    # 6% longer per 3x3 layer of ResNet-8)
    return jax.lax.fori_loop(1, t, write, _widened(_tap(x, origins[0], geom), width))


# ------------------------------------------------------------- strided windows as unit-stride ones


def space_to_depth_geometry(geom: ConvGeometry) -> ConvGeometry | None:
    """The unit-stride geometry of :func:`space_to_depth`'s image, or None where the
    transform does not apply: a stride above 1, each kernel side a multiple of its
    stride, no dilation and no cropping padding.

    Output ``(oy, ox)``, tap ``(a, c)`` of the new geometry reads block ``(oy + a, ox +
    c)``, whose ``(b, d)`` entry is row ``(oy + a) sv + b - pt`` and column ``(ox + c) sh
    + d - pl`` of the image: the original tap ``(a sv + b, c sh + d)``. So patches of the
    new image (``(kh / sv) (kw / sh)`` taps of ``sv sh C`` values) hold every original
    product once, in the order of :func:`space_to_depth_kernel`; fewer, wider taps (a
    one-channel 10x4 window at stride 2: 10 taps of 4 values instead of 40 of 1)."""
    (sv, sh), (kh, kw) = geom.stride, geom.kernel
    if (sv, sh) == (1, 1) or kh % sv or kw % sh or geom.dilation != (1, 1):
        return None
    if min(p for pair in geom.padding for p in pair) < 0:
        return None
    (pt, pb), (pl, pr) = geom.padding
    blocks = (-(-(geom.in_hw[0] + pt + pb) // sv), -(-(geom.in_hw[1] + pl + pr) // sh))
    return ConvGeometry.from_window(blocks, (kh // sv, kw // sh), (0, 0), (1, 1), geom.out_hw)


def space_to_depth(x, geom: ConvGeometry, *, pad_value) -> jax.Array:
    """``x`` (..., H, W, C) padded as ``geom`` says (``pad_value``; and at the bottom and
    right up to whole blocks, positions no window reads) and cut into ``sv x sh`` blocks:
    (..., H' / sv, W' / sh, sv * sh * C), block entry ``(b, d, ch)`` at ``(b * sh + d) * C +
    ch``. Requires :func:`space_to_depth_geometry` ``(geom)`` not None. Jit- and
    vmap-safe; the values are ``x``'s (a layout change)."""
    x = _check_image(x, geom)
    unit = space_to_depth_geometry(geom)
    if unit is None:
        raise RangeError(f"space_to_depth needs a stride > 1 dividing the kernel, no dilation or cropping, got {geom}")
    (sv, sh), ((pt, _), (pl, _)) = geom.stride, geom.padding
    (bh, bw), lead, c = unit.in_hw, x.shape[:-3], x.shape[-1]
    h, w = geom.in_hw
    pads = [(0, 0, 0)] * len(lead) + [(pt, bh * sv - h - pt, 0), (pl, bw * sh - w - pl, 0), (0, 0, 0)]
    x = jax.lax.pad(x, _pad_scalar(pad_value, x.dtype), pads)
    x = x.reshape(*lead, bh, sv, bw, sh, c)
    n = len(lead)
    x = jnp.transpose(x, (*range(n), n, n + 2, n + 1, n + 3, n + 4))
    return x.reshape(*lead, bh, bw, sv * sh * c)


def space_to_depth_kernel(kernel, geom: ConvGeometry):
    """An OHWI ``kernel`` (O, kh, kw, C) as the (O, kh / sv, kw / sh, sv * sh * C) kernel of
    :func:`space_to_depth_geometry`: tap ``(i, j)`` = ``(a sv + b, c sh + d)`` moves to
    tap ``(a, c)``, entry ``(b, d, ch)``. NumPy or JAX arrays alike."""
    xp = jnp if isinstance(kernel, jax.Array) else np
    kernel = kernel if isinstance(kernel, (jax.Array, np.ndarray)) else np.asarray(kernel)
    if space_to_depth_geometry(geom) is None:
        raise RangeError(f"space_to_depth needs a stride > 1 dividing the kernel, no dilation or cropping, got {geom}")
    if kernel.ndim != 4 or tuple(kernel.shape[1:3]) != geom.kernel:
        raise ShapeError(f"kernel must be OHWI with (H, W) = geom.kernel = {geom.kernel}, got shape {kernel.shape}")
    o, kh, kw, c = kernel.shape
    sv, sh = geom.stride
    k = kernel.reshape(o, kh // sv, sv, kw // sh, sh, c)
    return xp.transpose(k, (0, 1, 3, 2, 4, 5)).reshape(o, kh // sv, kw // sh, sv * sh * c)


def dot_width(n_out: int, k: int) -> int:
    """The contraction length at which an 8-bit dot of ``k`` products per output and
    ``n_out`` outputs runs fastest here: ``k``, or ``k`` rounded up to a multiple of 16 (the
    extra products read zero weights, so every sum is the same). A backend heuristic, only
    speed depends on it: on XLA:CPU (YNNPACK's uint8 x int8 kernels, one AMD EPYC Zen 4
    core, 18,432 rows) dots with at most 32 outputs ran at half speed or less at some
    lengths that are not multiples of 16 (8 outputs: K = 27 -> 32 1.30 -> 0.71 ns per
    output; 16 outputs: K = 24 -> 32 0.90 -> 0.52 ns), while the shortest ones ran fastest
    as they are (16 outputs: K = 8 0.26-0.35 ns against 0.47-0.55 at K = 16; 8 outputs:
    K = 4 0.43 against 0.67). With 40 or 48 outputs (2,048 rows) the longer dot ran
    1.02-1.57x faster for K from 72 to 600 (ResNet-large's 40-channel 3x3 layers: K = 360,
    1.03-1.10x) and the same at K = 1160; with 64 to 128 outputs it ran up to 12% slower
    for K from 200 to 1160, so wider layers keep ``k``. Other backends: ``k``."""
    n_out = V.check_static_int(n_out, 1, _MAX, "n_out")
    k = V.check_static_int(k, 1, _MAX, "k")
    if n_out > 48 or k % 16 == 0 or jax.default_backend() != "cpu":
        return k
    if k <= 4 or (k <= 8 and n_out >= 16):
        return k
    return k + (-k % 16)


def conv_dot_kernel(kernel, geom: ConvGeometry):
    """An OHWI ``kernel`` (O, kh, kw, C) as the (O, K) weights of the dot whose other
    operand is :func:`conv_dot_patches` ``(x, geom, width=K)``: the two give every product
    of the convolution once (``SUM_k patches[..., k] * weights[o, k]`` is output channel
    ``o``), in the fastest layout this module has for ``geom``:

    * where :func:`space_to_depth_geometry` applies, the taps of :func:`space_to_depth_kernel`
      (fewer, wider taps over stride-sized blocks at unit stride);
    * otherwise the kernel's own (kh, kw, C) order;

    then zero columns up to :func:`dot_width` (``K >= kh kw C``; the patches hold zeros
    there, the products add nothing). The layout changes the order of the products, never
    their sum: an integer dot that wraps modulo ``2**32`` gives the same bits in any
    order, so a saturating (order-dependent) accumulation must not use it. NumPy or JAX
    arrays alike (a NumPy kernel stays on the host)."""
    xp = jnp if isinstance(kernel, jax.Array) else np
    kernel = kernel if isinstance(kernel, (jax.Array, np.ndarray)) else np.asarray(kernel)
    if not isinstance(geom, ConvGeometry):
        raise V.ArgTypeError(f"geom must be a ConvGeometry, got {type(geom).__name__}")
    if kernel.ndim != 4 or tuple(kernel.shape[1:3]) != geom.kernel:
        raise ShapeError(f"kernel must be OHWI with (H, W) = geom.kernel = {geom.kernel}, got shape {kernel.shape}")
    if space_to_depth_geometry(geom) is not None:
        kernel = space_to_depth_kernel(kernel, geom)
    w = kernel.reshape(kernel.shape[0], -1)
    extra = dot_width(*w.shape) - w.shape[1]
    return xp.pad(w, ((0, 0), (0, extra))) if extra else w


def conv_dot_patches(x, geom: ConvGeometry, *, pad_value, width: int) -> jax.Array:
    """The patches (..., OH, OW, ``width``) of ``x`` (..., H, W, C) that
    :func:`conv_dot_kernel` ``(kernel, geom)`` (of shape (O, ``width``)) multiplies:
    :func:`extract_patches` of the image, or of its :func:`space_to_depth` blocks where
    :func:`space_to_depth_geometry` applies; zeros after the taps. ``pad_value`` as in
    :func:`window_taps`. Jit- and vmap-safe; a layout of ``x``'s values."""
    unit = space_to_depth_geometry(geom) if isinstance(geom, ConvGeometry) else None
    if unit is None:
        return extract_patches(x, geom, pad_value=pad_value, width=width)
    return extract_patches(space_to_depth(x, geom, pad_value=pad_value), unit, pad_value=pad_value, width=width)
