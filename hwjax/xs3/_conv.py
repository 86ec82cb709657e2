"""Current lib_nn convolutions and add (spec ``xs3.md`` §5.6, §5.4, §6.4, §4.1).

``conv2d`` reproduces ``memcpyfn_imtocol_padded`` + ``mat_mul_generic_int8`` +
``otfn_int8``: the im2col patch ``[kh][kw][c]`` (taps outside the image hold the pad
value), accumulators from 0, one VLMACCR per 32-byte chunk of the patch (chunks span
pixel boundaries; the last chunk is the tail), ``sat32`` after every chunk, then the
output transform. The chunked saturating accumulation is :func:`hwjax.core.mac` with
``chunk=32``: exactly the chip's saturation points, and a plain integer dot product
whenever saturation is impossible.

``reorder_kernel_weights`` builds the weight stream that the chip reads (§5.6); the
convolution itself does not need it (lanes and channel order do not change any sum).

``conv2d`` also takes float arrays holding integer values (inputs, weights,
multipliers, biases): the output is then bit-identical to the integer path, in the
float dtype, and differentiable with a surrogate gradient (see :func:`conv2d`).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import (
    ConvGeometry,
    eager_program,
    conv_dot_kernel,
    conv_dot_patches,
    extract_patches,
    int_dot,
    lhs8_dtype,
    mac,
    map_chunks,
    window_products_sum,
    window_taps,
)
from hwjax.errors import ArgTypeError, ShapeError
from hwjax.xs3 import _otfn
from hwjax.core import surrogate as S
from hwjax.xs3 import _vpu as vpu
from hwjax.core import SaturationGrad
from hwjax.xs3._vpu import Variant

_I32 = jnp.int32
CHUNK = 32  # bytes per VLMACCR in 8-bit mode
GROUP = 16  # output channels per accumulator ring
ACC_MAX = 2**31 - 1


# ----------------------------------------------------------------------- validation


def _pair(v, name: str, lo: int) -> tuple[int, int]:
    try:
        a, b = v
        return (V.check_static_int(a, lo, 2**20, f"{name}[0]"), V.check_static_int(b, lo, 2**20, f"{name}[1]"))
    except (TypeError, ValueError) as e:
        if isinstance(e, ValueError) and "must lie in" in str(e):
            raise
        raise ArgTypeError(f"{name} must be a pair of static ints >= {lo}, got {v!r}") from None


def _int8_operand(x, name: str, *, float_ok: bool = False) -> jax.Array:
    """int8 values as int8, or (``float_ok``) a float array holding them."""
    a = S.operand(
        x,
        name,
        -128,
        127,
        differentiable=float_ok,
        what=" holding int8 values",
        label=f"{name} (int8 values)",
        to_int32=False,
    )
    return a if S.is_float(a) else S.host_cast(x, a, jnp.int8)


# --------------------------------------------------------------------------- im2col


def _geometry(in_hw, kernel_hw, stride, pad_top_left, out_hw, dilation=(1, 1)) -> ConvGeometry:
    """The :class:`hwjax.core.ConvGeometry` of an im2col window grid (arguments validated
    and named as in :func:`im2col`): windows start at ``-pad_top_left``; bottom and right
    padding follow from ``out_hw`` (negative where the windows stop before the edge)."""
    kh, kw = _pair(kernel_hw, "kernel_hw", 1)
    sv, sh = _pair(stride, "stride", 1)
    pt, pl = _pair(pad_top_left, "pad_top_left", 0)
    dv, dh = _pair(dilation, "dilation", 1)
    oh, ow = _pair(out_hw, "out_hw", 1)
    return ConvGeometry.from_window(in_hw, (kh, kw), (-pt, -pl), (sv, sh), (oh, ow), (dv, dh))


def im2col(
    x,
    kernel_hw: Sequence[int],
    *,
    stride: Sequence[int],
    pad_top_left: Sequence[int],
    pad_value: int,
    out_hw: Sequence[int],
    dilation: Sequence[int] = (1, 1),
) -> jax.Array:
    """The im2col patches of ``memcpyfn_imtocol_padded`` (§5.6).

    For output (oy, ox) the patch is ``x[r, c, :]`` for kh, kw in row-major order with
    ``r = oy*stride[0] - pad_top_left[0] + kh*dilation[0]`` and
    ``c = ox*stride[1] - pad_top_left[1] + kw*dilation[1]``; taps outside the image take
    ``pad_value``. ``x`` is (..., H, W, C); the result is (..., OH, OW, KH*KW*C) in
    ``x``'s dtype (the chip's trailing 32 zero bytes are not materialised). Built by
    :func:`hwjax.core.extract_patches` (static strided slices, no gathers).
    """
    x = V.as_array(x, "x")
    if x.ndim < 3:
        raise ShapeError(f"x must have shape (..., H, W, C), got {x.shape}")
    geom = _geometry(x.shape[-3:-1], kernel_hw, stride, pad_top_left, out_hw, dilation)
    return extract_patches(x, geom, pad_value=pad_value)


# ------------------------------------------------------------ weight reordering §5.6


@functools.lru_cache(maxsize=None)
def _reorder_index(c_out: int, patch: int) -> np.ndarray:
    """Flat OHWI index of every byte of the reordered stream; -1 = padding."""
    n_chunks = -(-patch // CHUNK)
    parts, block_start, pos = [], 0, 0
    for g0 in range(0, c_out, GROUP):
        n = min(GROUP, c_out - g0)
        for j in range(n_chunks):
            width = min(CHUNK, patch - CHUNK * j)
            block_start = pos
            for ch in range(g0 + n - 1, g0 - 1, -1):  # descending channel order
                parts.append(ch * patch + CHUNK * j + np.arange(width))
                pos += width
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    total = block_start + GROUP * CHUNK if parts else 0
    return np.concatenate([idx, -np.ones(total - idx.size, np.int64)])


def _check_kernel(k, name: str = "k_ohwi", *, float_ok: bool = False) -> jax.Array:
    k = _int8_operand(k, name, float_ok=float_ok)
    if k.ndim != 4:
        raise ShapeError(f"{name} must have shape (C_out, K_h, K_w, C_in), got {k.shape}")
    return k


def reorder_kernel_weights(k_ohwi, *, pad_value: int = 0) -> jax.Array:
    """The weight stream of ``MatMulInt8::reorder_kernel_weights(K, shape, 8, pad, false)``.

    With L = K_h*K_w*C_in bytes per output channel and chunks of 32 bytes (the last one
    ``L - 32*(ceil(L/32)-1)`` bytes): for each group of 16 output channels (the last
    group may be smaller), for each chunk j, for each of the group's channels in
    **descending** order, that channel's bytes of chunk j, stored densely. The stream
    is padded with ``pad_value`` to (offset of the last chunk block of the last
    group) + 16*32 bytes.

    Args:
      k_ohwi: (C_out, K_h, K_w, C_in) int8 values.
      pad_value: int8 padding value.

    Returns:
      1-D int8 array (traceable: a static gather).
    """
    k = _check_kernel(k_ohwi)
    pad_value = (
        V.int_scalar(pad_value, -128, 127, "pad_value")
        if isinstance(pad_value, jax.core.Tracer)
        else V.check_static_int(pad_value, -128, 127, "pad_value")
    )
    c_out, patch = k.shape[0], int(np.prod(k.shape[1:]))
    idx = _reorder_index(c_out, patch)
    return _reorder_apply(k, np.maximum(idx, 0), idx >= 0, pad_value)


def reorder_kernel_weights_inverse(reordered, kernel_shape: Sequence[int]) -> jax.Array:
    """Recovers the (C_out, K_h, K_w, C_in) kernel from :func:`reorder_kernel_weights`'s
    stream (padding ignored). ``kernel_shape`` is static."""
    if isinstance(kernel_shape, (str, bytes)) or not hasattr(kernel_shape, "__iter__"):
        raise ArgTypeError(
            f"kernel_shape must be a sequence of 4 static ints (C_out, K_h, K_w, C_in), got {kernel_shape!r}"
        )
    shape = tuple(V.check_static_int(s, 1, 2**30, "kernel_shape[i]") for s in kernel_shape)
    if len(shape) != 4:
        raise ShapeError(f"kernel_shape must be (C_out, K_h, K_w, C_in), got {kernel_shape!r}")
    r = _int8_operand(reordered, "reordered")
    idx = _reorder_index(shape[0], int(np.prod(shape[1:])))
    if r.shape != idx.shape:
        raise ShapeError(f"reordered must have shape {idx.shape} for kernel_shape {shape}, got {r.shape}")
    inverse = np.empty(int(np.prod(shape)), np.int64)
    valid = np.nonzero(idx >= 0)[0]
    inverse[idx[valid]] = valid
    return _reorder_inverse_apply(r, inverse, shape)


@jax.jit
def _reorder_apply(k: jax.Array, idx: np.ndarray, valid: np.ndarray, pad_value) -> jax.Array:
    """The reordered stream: ``k`` flattened, read at ``idx``, ``pad_value`` where not
    ``valid`` (one program per kernel shape)."""
    flat = k.reshape(-1)
    vals = flat[idx] if flat.size else jnp.zeros(idx.shape, jnp.int8)
    return jnp.where(valid, vals, jnp.asarray(pad_value).astype(jnp.int8))


@functools.partial(jax.jit, static_argnums=2)
def _reorder_inverse_apply(r: jax.Array, inverse: np.ndarray, shape: tuple) -> jax.Array:
    return r[inverse].reshape(shape)


# -------------------------------------------------------------------------- conv2d


def conv2d(
    x,
    k_ohwi,
    multipliers,
    biases,
    *,
    initial_shift: int,
    final_shr: int,
    stride: Sequence[int],
    pad_top_left: Sequence[int],
    pad_value: int,
    out_shape: Sequence[int],
    dilation: Sequence[int] = (1, 1),
    variant: Variant = "hardware",
    return_accumulators: bool = False,
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
    kernel_sums=None,
):
    """Current-API int8 convolution: im2col + ``mat_mul_generic_int8`` + ``otfn_int8``.

    Per output pixel and channel c: ``acc = 0``; for chunk j = 0..ceil(L/32)-1 of the
    im2col patch P (L = K_h*K_w*C_in, see :func:`im2col`),
    ``acc = sat32(acc + sum_{i in chunk j} P[i] * K[c, i])``; then
    ``y = otfn_int8(acc, multipliers, biases, initial_shift, final_shr, variant)``.

    Args:
      x: (H, W, C_in) or (B, H, W, C_in) int8 values (any integer dtype, or a float
        array holding integers: differentiable; checked when concrete).
      k_ohwi: (C_out, K_h, K_w, C_in) int8 values (integer or float array, as ``x``).
      multipliers, biases: (C_out,) int16 values (integer arrays: no gradient; float
        arrays: differentiable).
      initial_shift: int in [-16, 16]; final_shr: int in [-16, 15] (or traced int32
        scalars, as in :func:`otfn_int8`).
      stride: (vertical, horizontal) >= 1. pad_top_left: (top, left) >= 0 (bottom and
        right padding follow from ``out_shape``). pad_value: int8 value of padded
        taps (xformer: the input zero point; a traced int32 scalar is accepted).
        dilation: (vertical, horizontal).
      out_shape: (OH, OW) or (OH, OW, C_out).
      variant: ``"hardware"``, ``"host"`` or ``"v2021"`` (only the output transform
        depends on it; the accumulation is identical in all variants).
      return_accumulators: also return the int32 accumulators (..., OH, OW, C_out).
      return_stats: also return a dict of per-output-channel int32 counts (shape
        (C_out,), summed over batch and pixels): ``acc_saturated`` (accumulators where
        at least one chunk step clipped: :func:`hwjax.core.mac`'s ``return_clipped``
        > 0) and the output-transform counts of :func:`otfn_int8`.
      saturation_grad: ``"zero"`` (default) or ``"pass"``; see Gradient.
      kernel_sums: optional (C_out,) int32 sums of each output channel's kernel values,
        where the caller has them (a model's lowering computes them once on the host);
        else the program computes them. They only enter where the chunked sums cannot
        clip, which makes them one exact dot: on a CPU with VNNI that dot runs on the
        patches + 128 as uint8, less 128 * ``kernel_sums``. ShapeError for another shape.

    Returns:
      ``y`` int8 (..., OH, OW, C_out) (the float dtype when an input is float; equal
      values); with the flags, a tuple ``(y, [acc], [stats])`` in that order (the
      accumulators and stats are integer arrays and take no gradient).

    Gradient (float inputs): that of the float function the pipeline approximates,
    ``otfn(conv(x, k))`` with ``conv`` the exact real convolution (same im2col, padded
    taps = ``pad_value``, no chunk saturation) and ``otfn`` the affine surrogate of
    :func:`otfn_int8`: ``y ~ (conv * 2**-e1 * multipliers / 2**14 + biases) /
    2**(e2 + 8)``. So ``d/dx`` and ``d/dk`` are the convolution gradients scaled by the
    effective multiplier ``multipliers * 2**-(e1 + e2 + 22)``; 0 for outputs that any
    output-transform step clipped (an accumulator that ended at ±(2**31-1) always
    clips in step 1) with ``saturation_grad="zero"``; ``"pass"`` keeps them.
    """
    xv, k = _int8_operand(x, "x", float_ok=True), _check_kernel(k_ohwi, float_ok=True)
    if xv.ndim not in (3, 4):
        raise ShapeError(f"x must have shape (H, W, C_in) or (B, H, W, C_in), got {xv.shape}")
    c_out, kh, kw, c_in = k.shape
    if xv.shape[-1] != c_in:
        raise ShapeError(f"x has {xv.shape[-1]} channels but k_ohwi expects C_in = {c_in}")
    out_shape = tuple(out_shape)
    if len(out_shape) not in (2, 3) or (len(out_shape) == 3 and out_shape[2] != c_out):
        raise ShapeError(f"out_shape must be (OH, OW) or (OH, OW, {c_out}), got {out_shape!r}")
    initial_shift, final_shr = _otfn.check_int8_config(initial_shift, final_shr, variant)
    pad_value = V.int_scalar(pad_value, -128, 127, "pad_value", label="pad_value (int8)")
    _, mul, bias = _otfn._int8_operands(None, multipliers, biases, float_ok=True, channels=c_out)
    geom = _geometry(xv.shape[-3:-1], (kh, kw), stride, pad_top_left, out_shape[:2], dilation)
    if kernel_sums is not None and tuple(np.shape(kernel_sums)) != (c_out,):
        raise ShapeError(f"kernel_sums must have shape ({c_out},), one per output channel, got {np.shape(kernel_sums)}")
    return _conv2d(
        xv,
        k,
        mul,
        bias,
        pad_value,
        initial_shift,
        final_shr,
        kernel_sums,
        geom=geom,
        variant=variant,
        return_accumulators=return_accumulators,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
    )


@eager_program(static_argnames=("geom", "variant", "return_accumulators", "return_stats", "saturation_grad"))
def _conv2d(
    xv,
    k,
    mul,
    bias,
    pad_value,
    initial_shift,
    final_shr,
    kernel_sums,
    *,
    geom,
    variant,
    return_accumulators,
    return_stats,
    saturation_grad,
):
    """:func:`conv2d` after its checks (one program when called eagerly)."""
    c_out = k.shape[0]
    patches_of = functools.partial(extract_patches, geom=geom)
    otfn_forward = _otfn.int8_forward(variant, return_stats, flags=_otfn.clip_flags(xv, k, mul, bias, pad_value))

    def forward(xv, k, mul, bias, pad, s1, s2):
        w = k.astype(jnp.int8).reshape(c_out, -1)
        if return_stats:  # per-channel counts over the whole batch: one pass
            patches = patches_of(xv.astype(jnp.int8), pad_value=pad)
            acc, acc_clips = mac(np.zeros((), np.int32), patches, w, chunk=CHUNK, return_clipped=True)
            y, clipped, stats = otfn_forward(acc, mul, bias, s1, s2)
            extras = (acc,) if return_accumulators else ()
            return (y, clipped, *extras, {"acc_saturated": _otfn._count_per_channel(acc_clips > 0), **stats})

        unclipped = w.shape[1] * 2**14 <= ACC_MAX  # no prefix of 8-bit products can clip
        if unclipped:
            # the chunked saturating sums never clip, so they are one exact dot: on the
            # backend's fastest 8-bit operand (uint8: the values + 128, the patches' pad
            # too), less 128 * SUM w, which gives SUM x w exactly (it fits int32)
            lhs = lhs8_dtype()
            off = 128 if lhs == np.uint8 else 0
            sums = jnp.sum(w.astype(_I32), axis=1, dtype=_I32) if kernel_sums is None else kernel_sums
            taken = off * jnp.asarray(sums, _I32) if off else 0
            # in hwjax.core's fastest patch layout: the products reordered (and zero ones
            # added), which the wrapping dot sums to the same bits
            wd = conv_dot_kernel(k.astype(jnp.int8), geom)

        def one(v):  # examples are independent: chunks of the batch give the same values
            if unclipped:
                u = (v.astype(_I32) + off).astype(lhs)
                p = conv_dot_patches(u, geom, pad_value=(jnp.asarray(pad, _I32) + off).astype(lhs), width=wd.shape[1])
                acc = int_dot(p, wd, (((p.ndim - 1,), (1,)), ((), ()))) - taken
            else:
                acc = mac(np.zeros((), np.int32), patches_of(v.astype(jnp.int8), pad_value=pad), w, chunk=CHUNK)
            return (*otfn_forward(acc, mul, bias, s1, s2), *((acc,) if return_accumulators else ()))

        oh, ow = geom.out_hw
        return map_chunks(one, xv, xv.ndim - 3, oh * ow * (w.shape[1] + 4 * c_out))

    def surrogate(xv, k, mul, bias, pad, s1, s2):
        acc = jnp.matmul(patches_of(xv, pad_value=pad), k.reshape(c_out, -1).T, precision=jax.lax.Precision.HIGHEST)
        return _otfn.int8_surrogate(acc, mul, bias, s1, s2)

    return _otfn.call_with_shifts(
        forward, surrogate, (xv, k, mul, bias, pad_value), (initial_shift, final_shr), saturation_grad=saturation_grad
    )


# ------------------------------------------------------------- depthwise §5.4, add §6.4


def depthwise_conv2d(
    x,
    k_hwc,
    multipliers,
    biases,
    *,
    initial_shift,
    final_shr,
    stride: Sequence[int],
    pad_top_left: Sequence[int],
    pad_value,
    out_shape: Sequence[int],
    variant: Variant = "hardware",
    return_accumulators: bool = False,
    return_clipped: bool = False,
    dilation: Sequence[int] = (1, 1),
):
    """Current-API depthwise convolution: ``mat_mul_dw_direct`` (§5.4) + ``otfn_int8``.

    Per output pixel and channel c: ``acc = 0``; for every kernel tap (i, j) in
    row-major (kh, kw) order, ``acc = sat32(acc + x[r, s, c] * k[i, j, c])`` (one
    VLMACC per tap, :func:`hwjax.xs3.vlmacc`) with ``r = oy*stride[0] - top + i*dilation[0]``,
    ``s = ox*stride[1] - left + j*dilation[1]``; taps outside the image read ``pad_value``. Then
    ``y = otfn_int8(acc, multipliers, biases, initial_shift, final_shr, variant)``.

    Args:
      x: (H, W, C) or (B, H, W, C) int8 values (integer array).
      k_hwc: (K_h, K_w, C) int8 values (channels innermost, the layout the kernel reads).
      multipliers, biases: (C,) int16 values (integer arrays).
      initial_shift, final_shr, pad_value: as for :func:`conv2d` (concrete values are
        range-checked; traced int32 scalars are accepted).
      stride, pad_top_left, out_shape ((OH, OW)), dilation: as for :func:`conv2d` (the
        kernel's tap offsets, xformer's dilated depthwise: its per-tap input offsets).
      variant: ``"hardware"``, ``"host"`` or ``"v2021"`` (only the output transform
        depends on it).
      return_accumulators: also return the int32 accumulators (..., OH, OW, C).
      return_clipped: also return, per accumulator, how many of its VLMACC steps clipped
        (the unsaturated ``acc + x * k`` was outside ``[-(2**31-1), 2**31-1]``; the
        meaning of :func:`hwjax.core.mac`'s ``return_clipped``), int32 (..., OH, OW, C).

    Returns:
      int8 (..., OH, OW, C), then the accumulators and the clip counts when asked.
      Integer inputs only.
    """
    xv, k = _int8_operand(x, "x"), _int8_operand(k_hwc, "k_hwc")
    if xv.ndim not in (3, 4) or k.ndim != 3 or xv.shape[-1] != k.shape[-1]:
        raise ShapeError(
            f"x must be (..., H, W, C) and k_hwc (K_h, K_w, C) with the same C, got {xv.shape} and {k.shape}"
        )
    kh, kw, c = k.shape
    geom = _geometry(xv.shape[-3:-1], (kh, kw), stride, pad_top_left, tuple(out_shape)[:2], dilation)
    initial_shift, final_shr = _otfn.check_int8_config(initial_shift, final_shr, variant)
    _, mul, bias = _otfn._int8_operands(None, multipliers, biases, float_ok=False, channels=c)
    pad_value = V.int_scalar(pad_value, -128, 127, "pad_value", label="pad_value (int8)")
    return _depthwise_conv2d(
        xv,
        k,
        mul,
        bias,
        pad_value,
        initial_shift,
        final_shr,
        geom=geom,
        variant=variant,
        return_accumulators=return_accumulators,
        return_clipped=return_clipped,
    )


@eager_program(static_argnames=("geom", "variant", "return_accumulators", "return_clipped"))
def _depthwise_conv2d(
    xv, k, mul, bias, pad_value, initial_shift, final_shr, *, geom, variant, return_accumulators, return_clipped
):
    """:func:`depthwise_conv2d` after its checks (one program when called eagerly)."""
    kw = k.shape[1]
    if not return_clipped and k.shape[0] * kw * 2**14 <= ACC_MAX:
        # No VLMACC can saturate: the accumulator starts at 0 and every product of int8
        # values has |x k| <= 2**14, so after t taps |acc| <= t 2**14 <= 2**31 - 1 and each
        # sat32 is the identity. The plain sum of the products is then the same int32
        # value, and each product is exact in int16 (summed in int32).
        pad16 = jnp.asarray(pad_value).astype(jnp.int16)
        acc = window_products_sum(xv.astype(jnp.int16), k.astype(jnp.int16), geom, pad_value=pad16)
        y = _otfn.otfn_int8(acc, mul, bias, initial_shift=initial_shift, final_shr=final_shr, variant=variant)
        return (y, acc) if return_accumulators else y
    taps = window_taps(xv.astype(_I32), geom, pad_value=pad_value)
    acc = jnp.zeros(taps[0].shape, _I32)
    clips = jnp.zeros(taps[0].shape, _I32)
    for t, tap in enumerate(taps):  # (kh, kw) row-major, one VLMACC per tap
        kt = k[t // kw, t % kw].astype(_I32)
        if return_clipped:  # |prod| <= 2**14: the comparisons cannot wrap
            prod = tap * kt
            over = (prod > 0) & (acc > ACC_MAX - jnp.maximum(prod, 0))
            under = (prod < 0) & (acc < -ACC_MAX - jnp.minimum(prod, 0))
            clips = clips + (over | under).astype(_I32)
        acc = vpu.vlmacc(acc, tap, kt, mode=8, variant=variant)
    y = _otfn.otfn_int8(acc, mul, bias, initial_shift=initial_shift, final_shr=final_shr, variant=variant)
    out = (y,) + ((acc,) if return_accumulators else ()) + ((clips,) if return_clipped else ())
    return out if len(out) > 1 else y


def add_int8(x0, x1, *, multiplier0, multiplier1, bias, shift, variant: Variant = "hardware"):
    """Current-API ``add_elementwise`` (§6.4), full 16-lane groups.

    Per element: ``acc = sat32(sat32(bias + x0 * multiplier0) + x1 * multiplier1)``
    (two VLMACCs), ``y = clamp(R(acc, shift), -128, 127)`` with the variant's 8-bit
    VLSAT rounding R (:func:`hwjax.xs3.vlsat`, two's-complement clamp). lib_nn's C model
    computes the last ``count mod 16`` elements in plain int32 with ``rshr``; where
    ``|acc| < 2**31 - 2**23`` and R rounds half up, both agree.

    Args:
      x0, x1: int8 values, same shape (integer arrays).
      multiplier0, multiplier1: int16 scalars; bias: int32 scalar; shift: VLSAT shift,
        the 16-bit memory element as int16 or uint16 value, read unsigned as VLSAT reads it
        (xformer may store a negative shift: -3 is 65533, a shift >= 32, which gives
        ``acc >> 31``; lib_nn's C code for the last values of a call reads it signed:
        :func:`add_elementwise_int8`). Integer scalars; concrete values are range-checked,
        traced ones accepted.
      variant: ``"hardware"``, ``"host"`` or ``"v2021"``.

    Returns:
      int8 array of the input shape.
    """
    a0, a1 = _int8_operand(x0, "x0"), _int8_operand(x1, "x1")
    if a0.shape != a1.shape:
        raise ShapeError(f"x0 and x1 must have the same shape, got {a0.shape} and {a1.shape}")
    return _add_int8(a0, a1, *_add_scalars(multiplier0, multiplier1, bias, shift), variant=variant)


def _add_scalars(multiplier0, multiplier1, bias, shift) -> tuple:
    """``add_elementwise``'s scalars checked: int16 multipliers, an int32 bias, the shift's
    16-bit element as int16 or uint16 (RangeError naming the argument)."""
    return (
        V.int_scalar(multiplier0, -(2**15), 2**15 - 1, "multiplier0"),
        V.int_scalar(multiplier1, -(2**15), 2**15 - 1, "multiplier1"),
        V.int_scalar(bias, -(2**31), 2**31 - 1, "bias"),
        V.int_scalar(shift, -(2**15), 2**16 - 1, "shift"),
    )


@eager_program(static_argnames=("variant",))
def _add_int8(a0, a1, m0, m1, b, s, *, variant):
    """:func:`add_int8` after its checks (one program when called eagerly)."""
    acc = jnp.broadcast_to(b, a0.shape)
    acc = vpu.vlmacc(acc, a0.astype(_I32), m0, mode=16, variant=variant)
    acc = vpu.vlmacc(acc, a1.astype(_I32), m1, mode=16, variant=variant)
    return vpu.vlsat(acc, s, mode=8, variant=variant, symmetric=False).astype(jnp.int8)


def add_elementwise_int8(x0, x1, *, multiplier0, multiplier1, bias, shift, variant: Variant = "hardware"):
    """One call of the current-API ``add_elementwise`` (§6.4) per row of the last axis, as
    xformer's ``XC_add`` makes it for an example (one thread).

    The first ``16 * (N // 16)`` values of a row of ``N`` are :func:`add_int8`'s full
    16-lane groups. On ``variant="host"`` the last ``N % 16`` are lib_nn's C code, in int32
    arithmetic that wraps: ``acc = bias + x0 * multiplier0 + x1 * multiplier1``, then
    ``(acc + (1 << (shift - 1))) >> shift`` clamped to [-128, 127], with ``shift`` the
    stored 16-bit element as a signed value and both shift counts taken modulo 32, as x86
    computes the C code's out-of-range shifts. At ``shift = 0`` the rounding term
    ``1 << -1`` is ``1 << 31``: the host interpreter of xmos-ai-tools 1.4.2 gives ``acc +
    2**31`` wrapped (the sign flipped, so 127 where VLSAT gives -128 and the reverse;
    random-graph seed 581, tests/data/randgraph_xs3/regress_add_shift_zero_tail). A
    negative stored shift ``-1`` gives ``(acc + 2**30) >> 31`` (0 where VLSAT's ``acc >>
    31`` gives -1 for ``-2**30 <= acc < 0``; seed 2208, regress_add_negative_shift_tail).
    Other variants compute every value as :func:`add_int8` (the chip's assembly is not
    modelled here separately). Arguments as for :func:`add_int8`; ``x0``, ``x1`` of shape
    (..., N). Returns int8 (..., N).
    """
    a0, a1 = _call_operands(x0, x1, variant, "..., N")
    return _add_elementwise_int8(a0, a1, *_add_scalars(multiplier0, multiplier1, bias, shift), variant=variant)


def _call_operands(x0, x1, variant, layout: str):
    """The int8 operands of :func:`add_elementwise_int8` / :func:`add_per_example`: one
    shape with at least one axis (``layout`` names it in the error), and the variant."""
    a0, a1 = _int8_operand(x0, "x0"), _int8_operand(x1, "x1")
    if a0.shape != a1.shape or a0.ndim < 1:
        raise ShapeError(f"x0 and x1 must have one shape ({layout}), got {a0.shape} and {a1.shape}")
    V.check_choice(variant, vpu.VARIANTS, "variant")
    return a0, a1


@eager_program(static_argnames=("variant",))
def _add_elementwise_int8(a0, a1, m0, m1, b, s, *, variant):
    """:func:`add_elementwise_int8` after its checks (one program when called eagerly)."""
    y = _add_int8(a0, a1, m0, m1, b, s, variant=variant)
    n = a0.shape[-1]
    if variant != "host" or n % 16 == 0:
        return y
    t0 = 16 * (n // 16)
    tail = _add_c_tail(a0[..., t0:], a1[..., t0:], m0, m1, b, s)
    return jnp.concatenate([y[..., :t0], tail.astype(jnp.int8)], axis=-1)


def add_per_example(x0, x1, *, multiplier0, multiplier1, bias, shift, variant: Variant = "hardware"):
    """:func:`add_elementwise_int8` with one call per example: ``x0``, ``x1`` of shape
    (B, ...), each example's values in row-major order as one row (xformer's ``XC_add``,
    one thread). Returns int8 of the input shape.

    Where an example has no C tail (a multiple of 16 values, or another variant than
    ``"host"``), every value is :func:`add_int8`'s and is computed in the inputs' own
    shape: flattening the examples puts a reshape inside the add's loop kernel, which
    XLA:CPU's classic emitter ran 13x slower (ResNet-large on ``"xs3"``: 98 ms per batch of
    256 in one add). The same values either way."""
    a0, a1 = _call_operands(x0, x1, variant, "B, ...")
    scalars = _add_scalars(multiplier0, multiplier1, bias, shift)
    if variant != "host" or math.prod(a0.shape[1:]) % 16 == 0:
        return _add_int8(a0, a1, *scalars, variant=variant)
    flat = [a.reshape(a.shape[0], -1) for a in (a0, a1)]
    return _add_elementwise_int8(*flat, *scalars, variant=variant).reshape(a0.shape)


def _add_c_tail(a0, a1, m0, m1, b, shift):
    """lib_nn's C code for the last ``N % 16`` values: int32 arithmetic that wraps, the
    16-bit shift element signed, and x86's shift counts modulo 32 (``1 << (shift - 1)`` at
    ``shift = 0`` is ``1 << 31``; a negative shift ``s`` shifts by ``s mod 32``)."""
    acc = jnp.asarray(b, _I32) + a0.astype(_I32) * jnp.asarray(m0, _I32) + a1.astype(_I32) * jnp.asarray(m1, _I32)
    s16 = ((jnp.asarray(shift, _I32) & 0xFFFF) ^ 0x8000) - 0x8000  # the element as int16
    rnd = jnp.left_shift(jnp.int32(1), (s16 - 1) & 31)  # 1 << 31 = -2**31 at s = 0
    return jnp.clip(jnp.right_shift(acc + rnd, s16 & 31), -128, 127)
