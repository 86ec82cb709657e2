"""Legacy lib_nn kernels (BSO API, lib_nn <= 2021), bit-exact (spec ``xs3.md`` §3, §5, §6).

Every convolution and fully-connected kernel here accumulates through
:func:`hwjax.core.mac` in the chip's (assembly's) chunk order of §5, starting at the
bias, saturating to ±(2**31-1) after every chunk, and then runs the BSO output
pipeline of §3.2 with :func:`hwjax.xs3.vlsat` as shift1 and shift2 (the only
variant-sensitive step). Where the plain-C reference kernels of lib_nn differ from the
assembly (exact 64-bit sums, int32 rounding adds), the assembly is followed.

Conventions:

* Images are HWC; a leading batch of any rank is allowed, ``(..., H, W, C)``.
  Convolution kernels are OHWI ``(C_out, K_h, K_w, C_in)``; depthwise kernels
  ``(K_h, K_w, C)``; fully-connected weights ``(C_out, N)``.
* int8 operands may be held in any integer dtype; values are range-checked when
  concrete (under ``jit`` the range is the caller's contract).
* Float inputs: the images/inputs and weights of ``conv2d_deep``,
  ``conv2d_shallowin``, ``conv2d_1x1``, ``conv2d_depthwise``, ``fully_connected_8``
  and ``fully_connected_16`` may be float arrays holding int8 values. The output is
  then bit-identical to the integer path, in the float dtype, and differentiable
  with the gradient of the float function the kernel approximates (the exact real
  convolution / matrix product from the bias, then the affine BSO pipeline
  ``((acc * 2**-shift1) * scale + offset_scale * offset) * 2**-shift2``), set to 0 for
  outputs that clipped (accumulator at ±(2**31-1), shift1 VLSAT saturation, output
  narrowing) unless ``saturation_grad="pass"``. BSO fields and zero points are
  integers and take no gradient; float arrays there (and elsewhere) raise TypeError.
* Window geometry (``window_start`` (row, col), ``window_stride`` (vertical,
  horizontal), ``out_shape`` (H_out, W_out), window shapes) is static Python ints.
* ``symmetric=True`` selects the ``CONFIG_SYMMETRIC_SATURATION_<op> = 1`` build
  (outputs in [-127, 127]); the default clamps int8 outputs to [-128, 127].
* ``variant`` is one of ``"hardware"`` (default), ``"host"``, ``"v2021"`` (§0).
* ``return_stats=True`` returns ``(y, LegacyStats)``: per output channel (the last
  output axis), summed over batch and pixels, exact counts of

  - ``acc_saturations``: outputs whose accumulation was clipped at ±(2**31-1) by at
    least one chunk (the exact ``acc + chunk_sum`` left [-(2**31-1), 2**31-1]; a bias
    of -2**31 counts, since the first chunk clips it);
  - ``shift1_clips``: outputs whose shift1 VLSAT saturated (the variant's rounded
    value left [-32767, 32767]);
  - ``output_clips``: outputs whose final narrowing clipped (shift2 VLSAT saturation
    or the clamp to the output range; for fc_deepin_shallowout the VLMUL/VDEPTH8
    saturation).

  Counts that a kernel cannot produce are 0.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import (
    ConvGeometry,
    eager_program,
    extract_patches,
    fixed_mul,
    mac,
    pool_out_hw,
    shift_right,
    window_taps,
)
from hwjax.core import wide as W
from hwjax.core import surrogate as S
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.xs3._bso import BsoFields, _checked_bso, _unpack_bso, bso_rows
from hwjax.core import SaturationGrad
from hwjax.xs3._vpu import VARIANTS, vdepth8, vlmul, vlsat

M32 = 2**31 - 1  # accumulator saturation bound
LANES = 32  # int8 products per VLMACCR chunk
_I32 = jnp.int32


class LegacyStats(NamedTuple):
    """Per-output-channel int32 counts (see the module docstring for definitions)."""

    acc_saturations: jax.Array
    shift1_clips: jax.Array
    output_clips: jax.Array


# ------------------------------------------------------------------------ validation


def _int_values(x, name: str, lo: int, hi: int, dtype, *, float_ok: bool = False) -> jax.Array:
    """Integer array holding values in [lo, hi] (checked when concrete), cast to ``dtype``;
    with ``float_ok`` a float array holding such values is returned unchanged."""
    a = S.operand(x, name, lo, hi, differentiable=float_ok, what=f" (values in [{lo}, {hi}])", to_int32=False)
    return a if S.is_float(a) else S.host_cast(x, a, dtype)


def _int8(x, name: str, *, float_ok: bool = False) -> jax.Array:
    return _int_values(x, name, -128, 127, jnp.int8, float_ok=float_ok)


def _scalar(x, name: str, lo: int, hi: int) -> jax.Array:
    a = _int_values(x, name, lo, hi, _I32)
    if a.ndim != 0:
        raise ShapeError(f"{name} must be a scalar, got shape {a.shape}")
    return a


def _pair(v, name: str, lo: int | None = None) -> tuple[int, int]:
    try:
        a, b = v
    except (TypeError, ValueError):
        raise ArgTypeError(f"{name} must be a pair of Python ints, got {v!r}") from None
    out = []
    for e in (a, b):
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)):
            raise ArgTypeError(f"{name} must be a pair of static Python ints, got {v!r}")
        if lo is not None and e < lo:
            raise RangeError(f"{name} entries must be >= {lo}, got {v!r}")
        out.append(int(e))
    return out[0], out[1]


def _variant(variant: str, **flags) -> str:
    """Checks ``variant`` and the static bool ``flags`` (``symmetric``, ``return_stats``)."""
    for name, value in flags.items():
        V.check_flag(value, name)
    return V.check_choice(variant, VARIANTS, "variant")


def _multiple_of(n: int, m: int, what: str) -> None:
    if n < 1 or n % m:
        raise RangeError(f"{what} must be a positive multiple of {m} (lib_nn constraint), got {n}")


def _image(x, name: str = "x", *, float_ok: bool = False, batch: bool = True) -> tuple[jax.Array, tuple[int, ...]]:
    """int8 image (..., H, W, C) -> (B, H, W, C) (as given with ``batch=False``, for
    callers that reshape inside their program) and the leading shape."""
    a = _int8(x, name, float_ok=float_ok)
    if a.ndim < 3:
        raise ShapeError(f"{name} must have shape (H, W, C) or (..., H, W, C), got {a.shape}")
    return (_batched(a) if batch else a), a.shape[:-3]


def _batched(a: jax.Array) -> jax.Array:
    return a.reshape((-1,) + a.shape[-3:])


def _warn_undefined_shifts(variant: str, *shifts) -> None:
    """VLSAT shifts >= 32 are undefined in the host/v2021 models (§2.3): they are
    computed as ``hardware``; warn when the shifts are concrete."""
    if variant == "hardware":
        return
    for s in shifts:
        if V.is_concrete(s) and np.any((np.asarray(s) & 0xFFFF) >= 32):
            warnings.warn(
                f"VLSAT shifts >= 32 are undefined in the {variant!r} model (spec §2.3); "
                "computing them as variant='hardware'",
                stacklevel=4,
            )
            return


def _checked_fields(bso, c_out: int, variant: str) -> jax.Array:
    """Validates a BSO tensor for ``c_out`` channels (warning as above, read on the host);
    returned as given: the kernel's program unpacks it (:func:`_unpack_bso`)."""
    a = _checked_bso(bso, c_out)
    if variant != "hardware" and V.is_concrete(a):
        rows = bso_rows(np.asarray(a).astype(np.int64), c_out)
        _warn_undefined_shifts(variant, rows[2], rows[6])
    return a


# ---------------------------------------------------------------------- windows


def _window(in_hw, window_shape, window_start, window_stride, out_shape) -> ConvGeometry:
    """The :class:`hwjax.core.ConvGeometry` of a legacy window grid (static arguments
    validated with the legacy names): window ``(oy, ox)`` starts at ``window_start +
    (oy, ox) * window_stride``; taps outside the image read the pad value."""
    return ConvGeometry.from_window(
        tuple(in_hw),
        _pair(window_shape, "window shape", 1),
        _pair(window_start, "window_start"),
        _pair(window_stride, "window_stride", 1),
        _pair(out_shape, "out_shape", 1),
    )


def _windows(x: jax.Array, win: ConvGeometry, pad_value: jax.Array) -> jax.Array:
    """(B, H, W, C) -> (B, H_out, W_out, K_h*K_w, C): the window taps in (kh, kw) order.

    Taps outside the image take ``pad_value`` (:func:`hwjax.core.window_taps`).
    """
    return jnp.stack(window_taps(x, win, pad_value=pad_value), axis=3)


def _check_inside(win: ConvGeometry) -> None:
    """Pooling windows must lie inside the image (no padding, §6.1)."""
    if not win.inside:
        (h, w), (r0, c0) = win.in_hw, win.window_start
        raise ShapeError(
            f"pooling windows must lie inside the {h}x{w} image (no padding): "
            f"window_start {(r0, c0)}, window_shape {win.kernel}, window_stride {win.stride}, "
            f"out_shape {win.out_hw}"
        )


def _row_sequence(oy: int, win: ConvGeometry, h: int) -> tuple[int, ...]:
    """Kernel-row order of output row ``oy`` (§5.1): top padding, bottom padding, interior."""
    rows = [win.window_start[0] + oy * win.stride[0] + kh for kh in range(win.kernel[0])]
    top = [kh for kh, r in enumerate(rows) if r < 0]
    bottom = [kh for kh, r in enumerate(rows) if r >= h]
    return tuple(top + bottom + [kh for kh, r in enumerate(rows) if 0 <= r < h])


# ------------------------------------------------------------------- chunk orders


def _pad_chunk(lanes: Sequence[int]) -> list[int]:
    """One VLMACCR chunk: the lanes, then empty lanes (-1) up to 32."""
    return list(lanes) + [-1] * (LANES - len(lanes))


def _pixel_chunks(base: int, c_in: int) -> list[int]:
    """Chunks of one pixel: full 32-channel groups, then the tail as one chunk."""
    full = c_in - c_in % LANES
    out = list(range(base, base + full))
    if full < c_in:
        out += _pad_chunk(range(base + full, base + c_in))
    return out


def deep_order(kh_sequence: Sequence[int], k_w: int, c_in: int) -> np.ndarray:
    """conv2d_deep visiting order (§5.1) over the (kh, kw, c) patch, chunk = 32.

    For each kernel row in ``kh_sequence``, kw increasing, each pixel's full
    32-channel groups then its C_in tail, padded with empty lanes (-1).
    """
    return np.asarray(
        [k for kh in kh_sequence for kw in range(k_w) for k in _pixel_chunks((kh * k_w + kw) * c_in, c_in)], np.int64
    )


def shallowin_order(kh_sequence: Sequence[int], k_w: int, c_in: int) -> np.ndarray:
    """conv2d_shallowin visiting order (§5.2): one 32-lane chunk per kernel row."""
    row = k_w * c_in
    return np.asarray([k for kh in kh_sequence for k in _pad_chunk(range(kh * row, kh * row + row))], np.int64)


def fc_order(n: int) -> np.ndarray:
    """fully_connected_8/16 visiting order (§5.5): the N mod 32 tail first, then full chunks."""
    t = n % LANES
    return np.asarray((_pad_chunk(range(t)) if t else []) + list(range(t, n)), np.int64)


# ------------------------------------------------------------------ accumulation


def _saturation_scan(acc0: jax.Array, sums: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Runs ``acc <- sat32(acc + s)`` over the leading axis of ``sums`` (|s| < 2**30).

    Returns the final accumulators and whether any step clipped (exact, no wrap): the
    meaning of :func:`hwjax.core.mac`'s ``return_clipped`` (> 0), for the per-channel
    (depthwise / pool) accumulations that are not dot products.
    """
    acc0 = jnp.broadcast_to(acc0.astype(_I32), sums.shape[1:])

    def step(carry, s):
        acc, hit = carry
        over = (s >= 0) & (acc > M32 - s)
        under = (s <= 0) & (acc < -M32 - s)
        acc = jnp.where(over, _I32(M32), jnp.where(under, _I32(-M32), acc + s))
        return (acc, hit | over | under), None

    (acc, hit), _ = jax.lax.scan(step, (acc0, jnp.zeros(acc0.shape, bool)), sums)
    return acc, hit


def _ordered_mac(
    bias: jax.Array, x: jax.Array, w: jax.Array, order: np.ndarray, chunk: int, stats: bool
) -> tuple[jax.Array, jax.Array | None]:
    """Saturating accumulation from the bias in ``order`` (core ``mac``), plus, with
    ``stats``, whether any of its saturating steps clipped (``mac``'s ``return_clipped``)."""
    if not stats:
        return mac(bias, x, w, order=order, chunk=chunk), None
    acc, clipped = mac(bias, x, w, order=order, chunk=chunk, return_clipped=True)
    return acc, clipped > 0


def _grouped_rows_mac(
    patches: jax.Array,
    w: jax.Array,
    bias: jax.Array,
    sequences: list[tuple[int, ...]],
    order_for: Callable,
    stats: bool,
):
    """Accumulates (B, H_out, W_out, L) patches, one ``mac`` per kernel-row order.

    Output rows whose windows have the same padding pattern share one order (§5.1).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for oy, seq in enumerate(sequences):
        groups.setdefault(seq, []).append(oy)
    accs, hits, rows = [], [], []
    for seq, oys in groups.items():
        if oys == list(range(oys[0], oys[-1] + 1)):
            xs = patches[:, oys[0] : oys[-1] + 1]
        else:
            xs = jnp.take(patches, np.asarray(oys), axis=1)
        acc, hit = _ordered_mac(bias, xs, w, order_for(seq), LANES, stats)
        accs.append(acc)
        hits.append(hit)
        rows += oys
    acc = jnp.concatenate(accs, axis=1) if len(accs) > 1 else accs[0]
    hit = (jnp.concatenate(hits, axis=1) if len(hits) > 1 else hits[0]) if stats else None
    if rows != sorted(rows):
        inv = np.argsort(np.asarray(rows))
        acc = jnp.take(acc, inv, axis=1)
        hit = jnp.take(hit, inv, axis=1) if stats else None
    return acc, hit


# ---------------------------------------------------------------- output pipeline


def _vlsat16_clipped(acc: jax.Array, shift: jax.Array, out: jax.Array, variant: str) -> jax.Array:
    """Where ``out = VLSAT16(acc, shift)`` saturated: the rounded value left ±32767.

    Low side: the two's-complement VLSAT (``symmetric=False``) gives -32768. High side:
    ``out`` is 32767 and stays 32767 when acc drops by one output step 2**s (a rounding
    shift satisfies R(acc - 2**s, s) = R(acc, s) - 1); only s <= 16 can exceed 32767.
    """
    s = shift & 0xFFFF
    low = vlsat(acc, shift, mode=16, variant=variant, symmetric=False) == -32768
    top = (out == 32767) & (s <= 16)
    step = jnp.left_shift(_I32(1), jnp.minimum(s, 16))
    below = vlsat(jnp.where(top, acc - step, acc), shift, mode=16, variant=variant)
    return low | (top & (below == 32767))


@functools.partial(jax.jit, static_argnames=("out_bits", "symmetric", "variant", "stats"))
def bso_output(acc: jax.Array, f: BsoFields, *, out_bits: int, symmetric: bool, variant: str, stats: bool = True):
    """§3.2 output pipeline; returns (y int8/int16, shift1 clipped, output clipped).

    The clip flags are None unless ``stats``.

    ``v = VLSAT16(acc, shift1)``; ``t = v*scale + offset_scale*offset`` (both VLMACCs
    are exact: |t| <= 32767*32768 + 32768**2 < 2**31, so their sat32 never acts);
    ``u = VLSAT16(t, shift2)``; int8 output ``clamp(u, -128 | -127, 127)`` (equal to
    the symmetric build's 8-bit VLSAT ``sat8(R(t, shift2))``), int16 output ``u``.
    """
    v = vlsat(acc, f.shift1, mode=16, variant=variant)
    t = v * f.scale + f.offset_scale * f.offset
    u = vlsat(t, f.shift2, mode=16, variant=variant)
    y = u if out_bits == 16 else jnp.clip(u, -127 if symmetric else -128, 127)
    dtype = jnp.int16 if out_bits == 16 else jnp.int8
    if not stats:
        return y.astype(dtype), None, None
    s1_clip = _vlsat16_clipped(acc, f.shift1, v, variant)
    out_clip = _vlsat16_clipped(t, f.shift2, u, variant) if out_bits == 16 else y != u
    return y.astype(dtype), s1_clip, out_clip


def _counts(flags, shape_c: tuple[int, ...]) -> jax.Array:
    if flags is None:
        return jnp.zeros(shape_c, _I32)
    axes = tuple(range(flags.ndim - len(shape_c)))
    return flags.sum(axis=axes, dtype=_I32)


def _result(y: jax.Array, return_stats: bool, acc_hit=None, s1=None, out=None, channels=None):
    if not return_stats:
        return y
    shape_c = (y.shape[-1],) if channels is None else channels
    return y, LegacyStats(_counts(acc_hit, shape_c), _counts(s1, shape_c), _counts(out, shape_c))


def _bso_affine(acc, f: BsoFields):
    """The real-valued function the §3.2 pipeline approximates (rounding straight-through):
    ``((acc * 2**-shift1) * scale + offset_scale * offset) * 2**-shift2``."""
    t = acc * S.exp2(-f.shift1, acc) * f.scale + f.offset_scale * f.offset
    return t * S.exp2(-f.shift2, t)


def _spec(fn: Callable, **kwargs) -> tuple:
    """A static, hashable stand-in for ``functools.partial(fn, **kwargs)`` (the key of the
    kernel's compiled program)."""
    return fn, tuple(sorted(kwargs.items()))


def _bound(spec: tuple) -> Callable:
    fn, kwargs = spec
    return functools.partial(fn, **dict(kwargs))


@eager_program(
    static_argnames=(
        "accumulate",
        "real_acc",
        "c_out",
        "lead",
        "out_bits",
        "symmetric",
        "variant",
        "return_stats",
        "saturation_grad",
    )
)
def _bso_kernel(
    operands: tuple,
    bso,
    consts: tuple,
    *,
    accumulate: tuple,
    real_acc: tuple,
    c_out: int,
    lead: tuple[int, ...] | None,
    out_bits: int,
    symmetric: bool,
    variant: str,
    return_stats: bool,
    saturation_grad: str,
):
    """A BSO kernel: accumulation then the §3.2 pipeline, differentiable for float operands,
    as one program when called eagerly.

    ``accumulate`` and ``real_acc`` are :func:`_spec` s of ``accumulate(*operands, bias,
    *consts, stats=...) -> (acc, hit)``, the exact integer accumulation (int8 operands),
    and ``real_acc(*operands, bias, *consts)``, the real-valued one (the surrogate).
    ``bso`` is the checked BSO tensor for ``c_out`` channels. With ``lead`` given, the
    first operand is an image (..., H, W, C) run as (B, H, W, C) and the output's batch
    axis is reshaped to ``lead``. Returns ``y`` [, LegacyStats].
    """
    f = _unpack_bso(bso, c_out)
    stats, flags = return_stats, return_stats or S.has_float(operands)
    if lead is not None:
        operands = (_batched(operands[0]), *operands[1:])

    def unbatch(a):
        return a if lead is None else a.reshape(lead + a.shape[1:])

    def forward(operands, f, consts):
        acc, hit = _bound(accumulate)(*(o.astype(jnp.int8) for o in operands), f.bias, *consts, stats=stats)
        y, s1, oc = bso_output(acc, f, out_bits=out_bits, symmetric=symmetric, variant=variant, stats=flags)
        clipped = unbatch((acc == M32) | (acc == -M32) | s1 | oc) if flags else None
        extras = (_result(y, True, hit, s1, oc)[1],) if stats else ()
        return (unbatch(y), clipped, *extras)

    def surrogate(operands, f, consts):
        return unbatch(_bso_affine(_bound(real_acc)(*operands, f.bias, *consts), f))

    return S.call(forward, surrogate, operands, f, consts, saturation_grad=saturation_grad)


# ------------------------------------------------------------------ convolutions


def _conv_bso(
    x,
    k,
    bso,
    *,
    zero_point,
    window_start,
    window_stride,
    out_shape,
    symmetric,
    variant,
    return_stats,
    saturation_grad,
    order_for,
    check_kernel=None,
):
    """Shared BSO convolution driver: validation, then :func:`_bso_kernel` on the jitted
    :func:`_conv_acc`."""
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xb, lead = _image(x, float_ok=True, batch=False)
    k = _int8(k, "k", float_ok=True)
    if k.ndim != 4:
        raise ShapeError(f"k must have shape (C_out, K_h, K_w, C_in), got {k.shape}")
    c_out, kh, kw, c_in = k.shape
    if xb.shape[-1] != c_in:
        raise ShapeError(f"x has {xb.shape[-1]} channels but k expects C_in = {c_in}")
    _multiple_of(c_in, 4, "C_in")
    _multiple_of(c_out, 4, "C_out")
    if check_kernel is not None:
        check_kernel(kh, kw, c_in)
    win = _window(xb.shape[-3:-1], (kh, kw), window_start, window_stride, out_shape)
    bso = _checked_fields(bso, c_out, variant)
    zp = _scalar(zero_point, "zero_point", -128, 127)
    return _bso_kernel(
        (xb, k),
        bso,
        (zp,),
        accumulate=_spec(_conv_acc, win=win, order_for=order_for),
        real_acc=_spec(_conv_real_acc, win=win),
        c_out=c_out,
        lead=lead,
        out_bits=8,
        symmetric=bool(symmetric),
        variant=variant,
        return_stats=bool(return_stats),
        saturation_grad=saturation_grad,
    )


def _conv_patches(xb, k_shape, win: ConvGeometry, zp):
    """(B, H, W, C_in) -> the (B, H_out, W_out, K_h*K_w*C_in) window patches."""
    return extract_patches(xb, win, pad_value=zp)


@functools.partial(jax.jit, static_argnames=("win", "order_for", "stats"))
def _conv_acc(xb, k, bias, zp, *, win, order_for, stats):
    """(B, H, W, C_in) int8 -> accumulators (B, H_out, W_out, C_out) and clip flags."""
    c_out, kh, kw, c_in = k.shape
    patches = _conv_patches(xb, k.shape, win, zp)
    seqs = [_row_sequence(oy, win, xb.shape[1]) for oy in range(win.out_hw[0])]
    return _grouped_rows_mac(patches, k.reshape(c_out, -1), bias, seqs, lambda seq: order_for(seq, kw, c_in), stats)


def _conv_real_acc(xb, k, bias, zp, *, win):
    """The exact real convolution from the bias (no saturation): the surrogate of
    :func:`_conv_acc`."""
    patches = _conv_patches(xb, k.shape, win, zp)
    return bias + _real_matmul(patches, k.reshape(k.shape[0], -1))


def _real_matmul(x, w):
    """``x @ w.T`` in float (full precision)."""
    return jnp.matmul(x, w.T, precision=jax.lax.Precision.HIGHEST)


def conv2d_deep(
    x,
    k,
    bso,
    *,
    zero_point,
    window_start,
    window_stride,
    out_shape,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """Legacy ``conv2d_deep`` (§3.2, §5.1): int8 convolution with a BSO output stage.

    Output ``(oy, ox, c)``: window rows ``r0 + oy*sv + kh``, columns ``c0 + ox*sh + kw``
    (taps outside the image read ``zero_point``). ``acc = bias[c]``, then one saturating
    32-lane chunk at a time in this order: top padding rows, bottom padding rows,
    interior rows (kh increasing within each), kw increasing, per pixel the full
    32-channel groups then the C_in tail as one chunk. Then the §3.2 pipeline.

    Args:
      x: (H, W, C_in) or (..., H, W, C_in) int8 values (integer array, or float array
        holding them: differentiable).
      k: (C_out, K_h, K_w, C_in) int8 values (integer or float, as ``x``); C_in and
        C_out multiples of 4.
      bso: BSO tensor (ceil(C_out/16), 7, 16) (:func:`make_bso`); integer, no gradient.
      zero_point: value of padded pixels, int in [-128, 127] (may be traced; integer).
      window_start: static (row, col) of the first window; may be negative (padding).
      window_stride: static (vertical, horizontal) >= 1.
      out_shape: static (H_out, W_out).
      symmetric: outputs in [-127, 127] (symmetric build) instead of [-128, 127].
      variant: VPU model for shift1/shift2 (``"hardware"``, ``"host"``, ``"v2021"``).
      return_stats: also return :class:`LegacyStats` (per output channel).
      saturation_grad: ``"zero"`` (default) or ``"pass"``; see Gradient.

    Returns:
      int8 (..., H_out, W_out, C_out) (the float dtype when ``x`` or ``k`` is float;
      equal values) [, LegacyStats].

    Gradient (float ``x``/``k``): that of ``((bias + conv(x, k)) * 2**-shift1 * scale
    + offset_scale * offset) * 2**-shift2`` with ``conv`` the exact real convolution
    (padded taps = ``zero_point``): the convolution gradients scaled per channel by
    ``scale * 2**-(shift1 + shift2)``; 0 for outputs whose accumulator ended at
    ±(2**31-1), whose shift1 VLSAT saturated or whose output narrowing clipped
    (``saturation_grad="zero"``).
    """
    return _conv_bso(
        x,
        k,
        bso,
        zero_point=zero_point,
        window_start=window_start,
        window_stride=window_stride,
        out_shape=out_shape,
        symmetric=symmetric,
        variant=variant,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
        order_for=deep_order,
    )


def _shallow_kernel(kh: int, kw: int, c_in: int) -> None:
    if kw * c_in > LANES:
        raise RangeError(f"conv2d_shallowin needs K_w * C_in <= 32, got {kw} * {c_in} = {kw * c_in}")


def conv2d_shallowin(
    x,
    k,
    bso,
    *,
    zero_point,
    window_start,
    window_stride,
    out_shape,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """Legacy ``conv2d_shallowin`` (§3.2, §5.2): as :func:`conv2d_deep`, one chunk per kernel row.

    ``k`` is (C_out, K_h, K_w, C_in) with K_w * C_in <= 32 (the unpadded kernel; lib_nn's
    zero padding of each row to 32 bytes contributes nothing). Chunk order: top padding
    rows, bottom padding rows, interior rows; each row's K_w*C_in products form one
    saturating chunk. Other arguments, the result, float inputs and the gradient as
    in :func:`conv2d_deep`.
    """
    return _conv_bso(
        x,
        k,
        bso,
        zero_point=zero_point,
        window_start=window_start,
        window_stride=window_stride,
        out_shape=out_shape,
        symmetric=symmetric,
        variant=variant,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
        order_for=shallowin_order,
        check_kernel=_shallow_kernel,
    )


def conv2d_1x1(
    x,
    k,
    bso,
    *,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """Legacy ``conv2d_1x1`` (§3.2, §5.3): per pixel, 32-channel groups then the tail.

    Args:
      x: (H, W, C_in) or (..., H, W, C_in) int8 values (integer, or float: differentiable).
      k: (C_out, C_in) (or (C_out, 1, 1, C_in)) int8 values (integer or float); C_in,
        C_out multiples of 4.
      bso, symmetric, variant, return_stats, saturation_grad: as :func:`conv2d_deep`.

    Returns:
      int8 (..., H, W, C_out) (float dtype for float inputs) [, LegacyStats]. (lib_nn's
      C reference saturates after every product; the chip, and this function, once
      per chunk.)

    Gradient (float ``x``/``k``): as :func:`conv2d_deep` with the per-pixel product
    ``x @ k.T`` in place of the convolution.
    """
    ka = V.as_array(k, "k")
    if ka.ndim == 2:  # (a host array is reshaped on the host: no program for it)
        shape4 = (ka.shape[0], 1, 1, ka.shape[1])
        host = not isinstance(k, jax.Array) and not isinstance(ka, jax.core.Tracer)
        ka = np.asarray(ka).reshape(shape4) if host else ka.reshape(shape4)
    if ka.ndim != 4 or ka.shape[1:3] != (1, 1):
        raise ShapeError(f"k must have shape (C_out, C_in) or (C_out, 1, 1, C_in), got {ka.shape}")
    xa = V.as_array(x, "x")
    if xa.ndim < 3:
        raise ShapeError(f"x must have shape (H, W, C) or (..., H, W, C), got {xa.shape}")
    return _conv_bso(
        x,
        ka,
        bso,
        zero_point=0,
        window_start=(0, 0),
        window_stride=(1, 1),
        out_shape=xa.shape[-3:-1],
        symmetric=symmetric,
        variant=variant,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
        order_for=deep_order,
    )


def conv2d_depthwise(
    x,
    k,
    bso,
    *,
    zero_point,
    window_start,
    window_stride,
    out_shape,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """Legacy ``conv2d_depthwise`` (§3.2, §5.4): one saturating VLMACC per kernel tap.

    Per channel c: ``acc = bias[c]``, then for each tap (kh, kw) in row-major order
    ``acc = sat32(acc + x_tap[c] * k[kh, kw, c])`` (padded taps read ``zero_point``).
    Implemented with core ``mac`` on the per-tap products (int16) against unit weights
    with ``chunk=1``. Then the §3.2 pipeline.

    Args:
      x: (H, W, C) or (..., H, W, C) int8 values (integer, or float: differentiable);
        C a multiple of 4.
      k: (K_h, K_w, C) int8 values (integer or float).
      bso, zero_point, window_start, window_stride, out_shape, symmetric, variant,
      return_stats, saturation_grad: as :func:`conv2d_deep`.

    Returns:
      int8 (..., H_out, W_out, C) (float dtype for float inputs) [, LegacyStats].

    Gradient (float ``x``/``k``): as :func:`conv2d_deep` with the real depthwise
    convolution ``bias[c] + sum_taps x_tap[c] * k[kh, kw, c]`` as the accumulator.
    """
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xb, lead = _image(x, float_ok=True, batch=False)
    k = _int8(k, "k", float_ok=True)
    if k.ndim != 3:
        raise ShapeError(f"k must have shape (K_h, K_w, C), got {k.shape}")
    kh, kw, c = k.shape
    if xb.shape[-1] != c:
        raise ShapeError(f"x has {xb.shape[-1]} channels but k has C = {c}")
    _multiple_of(c, 4, "C")
    win = _window(xb.shape[-3:-1], (kh, kw), window_start, window_stride, out_shape)
    bso = _checked_fields(bso, c, variant)
    zp = _scalar(zero_point, "zero_point", -128, 127)
    return _bso_kernel(
        (xb, k),
        bso,
        (zp,),
        accumulate=_spec(_depthwise_acc, win=win),
        real_acc=_spec(_depthwise_real_acc, win=win),
        c_out=c,
        lead=lead,
        out_bits=8,
        symmetric=bool(symmetric),
        variant=variant,
        return_stats=bool(return_stats),
        saturation_grad=saturation_grad,
    )


def _depthwise_real_acc(xb, k, bias, zp, *, win):
    """The exact real depthwise convolution from the bias: the surrogate of
    :func:`_depthwise_acc`."""
    kh, kw, c = k.shape
    return bias + (_windows(xb, win, zp) * k.reshape(kh * kw, c)).sum(axis=3)


@functools.partial(jax.jit, static_argnames=("win", "stats"))
def _depthwise_acc(xb, k, bias, zp, *, win, stats):
    """Per-tap saturating accumulation (§5.4) -> (B, H_out, W_out, C) and clip flags."""
    kh, kw, c = k.shape
    taps = _windows(xb, win, zp)  # (B, OH, OW, T, C)
    prods = taps.astype(jnp.int16) * k.reshape(kh * kw, c).astype(jnp.int16)
    prods = jnp.swapaxes(prods, -1, -2)  # (B, OH, OW, C, T)
    ones = jnp.ones((1, kh * kw), jnp.int8)
    acc = mac(bias[:, None], prods, ones, chunk=1)[..., 0]
    hit = _saturation_scan(bias, jnp.moveaxis(prods, -1, 0).astype(_I32))[1] if stats else None
    return acc, hit


# --------------------------------------------------------------- fully connected


def _fc_operands(x, w, *, n_multiple: int, float_ok: bool = False):
    xa = _int8(x, "x", float_ok=float_ok)
    wa = _int8(w, "w", float_ok=float_ok)
    if wa.ndim != 2:
        raise ShapeError(f"w must have shape (C_out, N), got {wa.shape}")
    if xa.ndim < 1 or xa.shape[-1] != wa.shape[1]:
        raise ShapeError(f"x must have shape (..., N) with N = w.shape[1] = {wa.shape[1]}, got {xa.shape}")
    _multiple_of(wa.shape[1], n_multiple, "N (C_in)")
    return xa, wa


def _fully_connected(x, w, bso, *, out_bits, symmetric, variant, return_stats, saturation_grad):
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xa, wa = _fc_operands(x, w, n_multiple=4, float_ok=True)
    bso = _checked_fields(bso, wa.shape[0], variant)
    return _bso_kernel(
        (xa, wa),
        bso,
        (),
        accumulate=_spec(_fc_acc, tail_first=True),
        real_acc=_spec(_fc_real_acc),
        c_out=wa.shape[0],
        lead=None,
        out_bits=out_bits,
        symmetric=bool(symmetric),
        variant=variant,
        return_stats=bool(return_stats),
        saturation_grad=saturation_grad,
    )


def _fc_real_acc(xa, wa, bias):
    """``bias + x @ w.T`` in float: the surrogate of :func:`_fc_acc`."""
    return bias + _real_matmul(xa, wa)


@functools.partial(jax.jit, static_argnames=("tail_first", "stats"))
def _fc_acc(xa, wa, bias, *, tail_first, stats):
    """32-lane chunks from the bias: §5.5 order (tail first) or plain ascending chunks."""
    n = wa.shape[1]
    return _ordered_mac(bias, xa, wa, fc_order(n) if tail_first else np.arange(n), LANES, stats)


def fully_connected_8(
    x,
    w,
    bso,
    *,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
    saturation_grad: SaturationGrad = "zero",
):
    """Legacy ``fully_connected_8`` (§3.2, §5.5): int8 outputs.

    ``acc = bias[c]``; first the chunk of the N mod 32 leading inputs ``x[0:t]``, then
    the full chunks ``x[t+32j : t+32j+32]``, saturating after each; then §3.2.

    Args:
      x: (N,) or (..., N) int8 values (integer, or float: differentiable); N a
        multiple of 4.
      w: (C_out, N) int8 values (integer or float).
      bso: BSO tensor for C_out channels. symmetric, variant, return_stats,
        saturation_grad: as :func:`conv2d_deep`.

    Returns:
      int8 (..., C_out) (float dtype for float inputs) [, LegacyStats].

    Gradient (float ``x``/``w``): that of ``((bias + x @ w.T) * 2**-shift1 * scale +
    offset_scale * offset) * 2**-shift2``, i.e. ``d/dx = g' @ w``, ``d/dw = g'.T @ x``
    with ``g' = g * scale * 2**-(shift1 + shift2)``; 0 for clipped outputs (see
    :func:`conv2d_deep`).
    """
    return _fully_connected(
        x,
        w,
        bso,
        out_bits=8,
        symmetric=symmetric,
        variant=variant,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
    )


def fully_connected_16(
    x, w, bso, *, variant: str = "hardware", return_stats: bool = False, saturation_grad: SaturationGrad = "zero"
):
    """Legacy ``fully_connected_16``: as :func:`fully_connected_8` with int16 outputs
    ``y = VLSAT16(t, shift2) = sat16(R(t, shift2))`` (§3.2). Float inputs and the
    gradient as in :func:`fully_connected_8` (int16 values in the float dtype)."""
    return _fully_connected(
        x,
        w,
        bso,
        out_bits=16,
        symmetric=False,
        variant=variant,
        return_stats=return_stats,
        saturation_grad=saturation_grad,
    )


def _fc_deepin(x, w, bias, shift, scale, *, out_bits, variant, return_stats):
    _variant(variant, return_stats=return_stats)
    xa, wa = _fc_operands(x, w, n_multiple=LANES)
    c_out = wa.shape[0]
    if c_out > 16:
        raise RangeError(f"fc_deepin_shallowout supports C_out <= 16, got {c_out}")
    b = _int_values(bias, "bias", -(2**31), 2**31 - 1, _I32)
    s = _int_values(shift, "shift", 0, 2**16 - 1, _I32)
    m = _int_values(scale, "scale", -(2**15), 2**15 - 1, _I32)
    for a, name in ((b, "bias"), (s, "shift"), (m, "scale")):
        if a.shape != (c_out,):
            raise ShapeError(f"{name} must have shape ({c_out},), got {a.shape}")
    _warn_undefined_shifts(variant, s)
    return _fc_deepin_program(xa, wa, b, s, m, out_bits=out_bits, variant=variant, stats=bool(return_stats))


@eager_program(static_argnames=("out_bits", "variant", "stats"))
def _fc_deepin_program(xa, wa, b, s, m, *, out_bits, variant, stats):
    acc, hit = _fc_acc(xa, wa, b, tail_first=False, stats=stats)
    y, s1, oc = _deepin_output(acc, s, m, out_bits=out_bits, variant=variant, stats=stats)
    return _result(y, stats, hit, s1, oc)


@functools.partial(jax.jit, static_argnames=("out_bits", "variant", "stats"))
def _deepin_output(acc, s, m, *, out_bits, variant, stats):
    """§3.3 output: VLSAT16, VLMUL Q1.14 (rounding), [VDEPTH8]; clip flags if ``stats``."""
    v = vlsat(acc, s, mode=16, variant=variant)
    # The reference (and chip) round in the Q1.14 multiply in every variant (§3.3).
    y = vlmul(v, m, mode=16, variant="hardware")
    oc = None
    if stats:
        oc = jnp.abs(fixed_mul(v, m, 14, rounding="half_up", bits=32)) > 32767
    if out_bits == 8:
        if stats:
            oc = oc | _vdepth8_clipped(y)
        y = vdepth8(y, mode=16, variant=variant).astype(jnp.int8)
    else:
        y = y.astype(jnp.int16)
    s1 = _vlsat16_clipped(acc, s, v, variant) if stats else None
    return y, s1, oc


def _vdepth8_clipped(v: jax.Array) -> jax.Array:
    """Where 16-bit VDEPTH8 saturated: the result stays at ±127 one step (256) inward."""
    y = vdepth8(v, mode=16)
    hi = (y == 127) & (vdepth8(jnp.where(y == 127, v - 256, v), mode=16) == 127)
    lo = (y == -127) & (vdepth8(jnp.where(y == -127, v + 256, v), mode=16) == -127)
    return hi | lo


def fc_deepin_shallowout_16(x, w, bias, shift, scale, *, variant: str = "hardware", return_stats: bool = False):
    """``fc_deepin_shallowout_16`` (§3.3): C_out <= 16 outputs, C_in a multiple of 32.

    ``acc = bias[k]``, one saturating chunk per 32 inputs in order;
    ``v = VLSAT16(acc, shift[k])`` (variant-sensitive);
    ``y = sat16(floor((v*scale[k] + 2**13) / 2**14))`` (VLMUL Q1.14, rounding in every
    variant: the v2021 reference does not use the truncating model here).

    Args:
      x: (N,) or (..., N) int8 values. w: (C_out, N) int8 values.
      bias: (C_out,) int32. shift: (C_out,) in [0, 65535]. scale: (C_out,) int16 values.

    Returns:
      int16 (..., C_out) [, LegacyStats]; output_clips counts VLMUL saturation.
    """
    return _fc_deepin(x, w, bias, shift, scale, out_bits=16, variant=variant, return_stats=return_stats)


def fc_deepin_shallowout_8(x, w, bias, shift, scale, *, variant: str = "hardware", return_stats: bool = False):
    """``fc_deepin_shallowout_8`` (§3.3): as the ``_16`` version, then VDEPTH8,
    ``y = sat8(floor((v + 128) / 256))`` in [-127, 127]. Returns int8 (..., C_out);
    output_clips counts VLMUL or VDEPTH8 saturation."""
    return _fc_deepin(x, w, bias, shift, scale, out_bits=8, variant=variant, return_stats=return_stats)


# ---------------------------------------------------------------------- pooling


def avgpool2d_scale_shift(window_pixels: int) -> tuple[int, int]:
    """The (scale, shift) that legacy ``avgpool2d`` derives for a P-pixel window (§6.1).

    ``e = ceil(log2 P)``; P = 2**e: (1, e); otherwise ``q = 25 - e``,
    ``g = floor(2**31 / P)``, ``scale = floor((g + 2**(q-1)) / 2**q)``, ``shift = e + 6``.
    """
    p = V.check_static_int(window_pixels, 1, 2**24, "window_pixels")
    e = (p - 1).bit_length()
    if p == 1 << e:
        return 1, e
    q = 25 - e
    g = (1 << 31) // p
    return (g + (1 << (q - 1))) >> q, e + 6


def _pool_geometry(x, window_shape, window_start, window_stride, out_shape):
    """The image as given (reshaped inside the pool's program), its leading shape and the
    window geometry."""
    xb, lead = _image(x, batch=False)
    stride = window_shape if window_stride is None else window_stride
    if out_shape is None:
        kshape, start = _pair(window_shape, "window_shape", 1), _pair(window_start, "window_start")
        if min(start) < 0:
            raise RangeError(
                f"pooling windows must lie inside the image (no padding): window_start {start} is negative"
            )
        if any(st + k > n for st, k, n in zip(start, kshape, xb.shape[-3:-1])):
            raise ShapeError(
                f"no pooling window of window_shape {kshape} starting at window_start {start} "
                f"fits inside the {xb.shape[-3]}x{xb.shape[-2]} image"
            )
        out_shape = pool_out_hw(xb.shape[-3:-1], kshape, _pair(stride, "window_stride", 1), start)
    win = _window(xb.shape[-3:-1], window_shape, window_start, stride, out_shape)
    _check_inside(win)
    return xb, lead, win


def maxpool2d(
    x,
    *,
    window_shape,
    window_start=(0, 0),
    window_stride=None,
    out_shape=None,
    variant: str = "hardware",
    return_stats: bool = False,
):
    """Legacy ``maxpool2d`` (§6.3): per channel, the maximum over the window (from -128).

    Windows must lie inside the image. ``window_stride`` defaults to ``window_shape``,
    ``out_shape`` to the most windows that fit. Returns int8 (..., H_out, W_out, C)
    [, LegacyStats (all zero)].
    """
    _variant(variant, return_stats=return_stats)
    xb, lead, win = _pool_geometry(x, window_shape, window_start, window_stride, out_shape)
    return _maxpool_call(xb, win=win, lead=lead, return_stats=bool(return_stats))


@eager_program(static_argnames=("win", "lead", "return_stats"))
def _maxpool_call(x, *, win, lead, return_stats):
    y = functools.reduce(jnp.maximum, window_taps(_batched(x), win, pad_value=0))
    return _result(y.reshape(lead + y.shape[1:]), return_stats)


def avgpool2d(
    x,
    *,
    window_shape,
    window_start=(0, 0),
    window_stride=None,
    out_shape=None,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
):
    """Legacy ``avgpool2d`` (§6.1): ``y = clamp(rshr(sum_window(x) * scale, shift), -128, 127)``.

    (scale, shift) from :func:`avgpool2d_scale_shift` of the window size; the int32 sum
    cannot saturate. Windows must lie inside the image; C a multiple of 4.
    ``window_stride`` defaults to ``window_shape``, ``out_shape`` to the most windows
    that fit. Returns int8 (..., H_out, W_out, C) [, LegacyStats: output clips].
    """
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xb, lead, win = _pool_geometry(x, window_shape, window_start, window_stride, out_shape)
    _multiple_of(xb.shape[-1], 4, "C")
    return _avgpool_call(xb, win=win, lead=lead, symmetric=bool(symmetric), return_stats=bool(return_stats))


@eager_program(static_argnames=("win", "lead", "symmetric", "return_stats"))
def _avgpool_call(x, *, win, lead, symmetric, return_stats):
    y, out = _avgpool_core(_batched(x), win=win, symmetric=symmetric)
    return _result(y.reshape(lead + y.shape[1:]), return_stats, out=out)


def _avgpool_core(xb, *, win, symmetric):
    scale, shift = avgpool2d_scale_shift(win.kernel[0] * win.kernel[1])
    acc = functools.reduce(jnp.add, (t.astype(_I32) for t in window_taps(xb, win, pad_value=0))) * scale
    r = shift_right(acc, shift, rounding="half_up")
    y = jnp.clip(r, -127 if symmetric else -128, 127)
    return y.astype(jnp.int8), y != r


def avgpool2d_global(
    x, bias, scale, shift, *, symmetric: bool = False, variant: str = "hardware", return_stats: bool = False
):
    """Legacy ``avgpool2d_global`` (§6.2): ``y[c] = clamp(rshr(acc, shift), -128, 127)``.

    ``acc = bias``, then ``acc = sat32(acc + x[p, c] * scale)`` pixel by pixel in
    row-major order (one VLMACC per pixel; the sat32 can only act for extreme biases).

    Args:
      x: (H, W, C) or (..., H, W, C) int8 values.
      bias: int32 scalar. scale: int8 scalar. shift: scalar in [0, 65535].

    Returns:
      int8 (..., C) [, LegacyStats: accumulator saturations and output clips].
    """
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xb, lead = _image(x, batch=False)
    b = _scalar(bias, "bias", -(2**31), 2**31 - 1)
    sc = _scalar(scale, "scale", -128, 127)
    sh = _scalar(shift, "shift", 0, 2**16 - 1)
    return _avgpool_global_call(xb, b, sc, sh, lead=lead, symmetric=bool(symmetric), return_stats=bool(return_stats))


@eager_program(static_argnames=("lead", "symmetric", "return_stats"))
def _avgpool_global_call(x, b, sc, sh, *, lead, symmetric, return_stats):
    y, hit, out = _avgpool_global_core(_batched(x), b, sc, sh, symmetric=symmetric, stats=return_stats)
    return _result(y.reshape(lead + y.shape[1:]), return_stats, hit, None, out)


def _avgpool_global_core(xb, b, sc, sh, *, symmetric, stats):
    n, h, w, c = xb.shape
    pix = jnp.swapaxes(xb.reshape(n, h * w, c), 1, 2)  # (B, C, HW)
    wts = jnp.broadcast_to(sc.astype(jnp.int8), (1, h * w))
    acc = mac(b, pix, wts, chunk=1)[..., 0]
    hit = _saturation_scan(b, jnp.moveaxis(pix.astype(_I32) * sc, -1, 0))[1] if stats else None
    r = shift_right(acc, sh, rounding="half_up")
    y = jnp.clip(r, -127 if symmetric else -128, 127)
    return y.astype(jnp.int8), hit, y != r


# --------------------------------------------------------------- element-wise ops


def add_elementwise(
    x0,
    x1,
    *,
    shr0: int,
    multiplier0,
    shr1: int,
    multiplier1,
    bias,
    output_shr,
    symmetric: bool = False,
    variant: str = "hardware",
    return_stats: bool = False,
):
    """Legacy ``add_elementwise`` (§6.4, lib_nn 2021), exact.

    ``acc = bias + (x0 >> shr0) * multiplier0 + (x1 >> shr1) * multiplier1`` (``>>``
    floors; a negative shr is a left shift ``x * 2**-shr``), formed exactly in 64 bits;
    ``y = clamp(rshr(acc, output_shr), -128, 127)`` ([-127, 127] if ``symmetric``).

    Args:
      x0, x1: int8 values, same shape.
      shr0, shr1: input shifts in [-24, 32767] (scalars, may be traced).
      multiplier0, multiplier1: int16 scalars. bias: int32 scalar.
      output_shr: scalar in [0, 255] (``uint8``).

    Returns:
      int8 array of the input shape [, LegacyStats per last-axis element: output clips].
    """
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    a0, a1 = _int8(x0, "x0"), _int8(x1, "x1")
    if a0.shape != a1.shape:
        raise ShapeError(f"x0 and x1 must have the same shape, got {a0.shape} and {a1.shape}")
    params = (
        _scalar(shr0, "shr0", -24, 2**15 - 1),
        _scalar(multiplier0, "multiplier0", -(2**15), 2**15 - 1),
        _scalar(shr1, "shr1", -24, 2**15 - 1),
        _scalar(multiplier1, "multiplier1", -(2**15), 2**15 - 1),
        _scalar(bias, "bias", -(2**31), 2**31 - 1),
        _scalar(output_shr, "output_shr", 0, 255),
    )
    y, out = _add_core(a0, a1, *params, symmetric=bool(symmetric))
    return _result(y, return_stats, out=out, channels=a0.shape[-1:])


@functools.partial(jax.jit, static_argnames=("symmetric",))
def _add_core(a0, a1, shr0, m0, shr1, m1, bias, output_shr, *, symmetric):
    def term(x, s, m):  # |x * 2**24| <= 2**31: the left shift is exact
        return W.mul_int32(shift_right(x, s, rounding="floor", allow_left=True), m)

    acc = W.add(W.add(W.from_int32(jnp.broadcast_to(bias, a0.shape)), term(a0, shr0, m0)), term(a1, shr1, m1))
    s_out = jnp.minimum(output_shr, 63)  # |acc| < 2**49: shifts beyond 63 give the same
    y, out = W.saturate_to_int32(W.shift_right(acc, s_out, "half_up"), -127 if symmetric else -128, 127)
    return y.astype(jnp.int8), out


def requantize_16_to_8(x, *, symmetric: bool = False, variant: str = "hardware", return_stats: bool = False):
    """Legacy ``requantize_16_to_8`` (§6.5): ``y = clamp(floor((x + 128) / 256), -128, 127)``.

    ([-127, 127] if ``symmetric``.) ``x`` int16 values, any shape; returns int8
    [, LegacyStats per last-axis element: output clips].
    """
    _variant(variant, symmetric=symmetric, return_stats=return_stats)
    xa = _int_values(x, "x", -(2**15), 2**15 - 1, jnp.int16)
    y, out = _requantize_core(xa, symmetric=bool(symmetric))
    return _result(y, return_stats, out=out, channels=xa.shape[-1:])


@functools.partial(jax.jit, static_argnames=("symmetric",))
def _requantize_core(xa, *, symmetric):
    r = shift_right(xa, 8, rounding="half_up")  # floor((x + 128) / 256)
    y = jnp.clip(r, -127 if symmetric else -128, 127)
    return y.astype(jnp.int8), y != r


def lookup8(x, lut, *, variant: str = "hardware", return_stats: bool = False):
    """Legacy ``lookup8`` (§6.6): ``y = lut[u8(x)]``.

    ``x``: int8 or uint8 values (int8 values index by their byte ``x & 0xFF``);
    ``lut``: (256,) uint8 values. Returns uint8 of x's shape [, zero LegacyStats].
    """
    _variant(variant, return_stats=return_stats)
    xa = _int_values(x, "x", -128, 255, _I32)
    t = _int_values(lut, "lut", 0, 255, jnp.uint8)
    if t.shape != (256,):
        raise ShapeError(f"lut must have shape (256,), got {t.shape}")
    return _lookup8(xa, t, return_stats=bool(return_stats))


@eager_program(static_argnames=("return_stats",))
def _lookup8(xa, t, *, return_stats):
    return _result(jnp.take(t, xa & 0xFF), return_stats, channels=xa.shape[-1:])


def argmax_16(x, *, variant: str = "hardware", return_stats: bool = False):
    """Legacy ``argmax_16`` (§6.7): the first index of the maximum over the last axis.

    ``x`` (..., N) int16 values, N >= 1 (lib_nn writes nothing for N <= 0; here that is
    a ValueError). Returns int32 (...) [, zero LegacyStats of shape ()].
    """
    _variant(variant, return_stats=return_stats)
    xa = _int_values(x, "x", -(2**15), 2**15 - 1, jnp.int16)
    if xa.ndim < 1 or xa.shape[-1] < 1:
        raise ShapeError(f"x must have shape (..., N) with N >= 1, got {xa.shape}")
    y = jnp.argmax(xa, axis=-1).astype(_I32)  # jnp.argmax returns the first maximum
    return _result(y, return_stats, channels=())


# ------------------------------------------------------------------ certification


def _exact_nonneg_sum(p: jax.Array) -> W.Wide:
    """Exact sum over the last axis of int32 values in [0, 2**22) (fewer than 2**20 terms)."""
    hi = (p >> 11).sum(axis=-1, dtype=_I32)
    lo = (p & 0x7FF).sum(axis=-1, dtype=_I32)
    return W.add(W.mul_int32(hi, jnp.asarray(2048, _I32)), W.from_int32(lo))


def certify_no_saturation(k, bias, input_range: tuple[int, int], *, channel_axis: int = 0) -> jax.Array:
    """Proves per output channel that the accumulator can never clip at ±(2**31-1).

    Interval arithmetic from the weights alone: for inputs in ``[lo, hi]`` every product
    ``w*x`` lies in ``[min(w*lo, w*hi), max(w*lo, w*hi)]``, so every partial sum of any
    subset of products (hence every chunk prefix of every order) lies in
    ``[bias + N, bias + P]`` with P (N) the sum of the positive (negative) product
    maxima (minima). The channel is certified when ``-(2**31-1) <= bias + N`` and
    ``bias + P <= 2**31-1`` (exact 64-bit comparison). Include the padding
    ``zero_point`` in ``input_range`` for padded convolutions.

    Args:
      k: integer kernel (int8 values) with output channels on ``channel_axis``
        (0 for conv OHWI and fully-connected (C_out, N); -1 for depthwise (K_h, K_w, C)).
      bias: (C,) int32 biases.
      input_range: static (lo, hi), int16 values, lo <= hi.

    Returns:
      bool (C,): True where saturation is impossible for every input in range.
    """
    lo, hi = _pair(input_range, "input_range")
    if not -(2**15) <= lo <= hi <= 2**15 - 1:
        raise RangeError(f"input_range must satisfy -32768 <= lo <= hi <= 32767, got {input_range!r}")
    w = _int8(k, "k")
    if w.ndim < 1:
        raise ShapeError("k must have at least one axis (the output channels)")
    channel_axis = V.check_static_int(channel_axis, -w.ndim, w.ndim - 1, "channel_axis") % w.ndim
    n_out = w.shape[channel_axis]
    per_channel = int(np.prod([s for i, s in enumerate(w.shape) if i != channel_axis], dtype=np.int64))
    if per_channel >= 2**20:
        raise ShapeError(f"certify_no_saturation supports fewer than 2**20 products per channel, got {per_channel}")
    b = _int_values(bias, "bias", -(2**31), 2**31 - 1, _I32)
    if b.shape != (n_out,):
        raise ShapeError(f"bias must have shape ({n_out},), got {b.shape}")
    return _certify(w, b, channel_axis=channel_axis, lo=lo, hi=hi)


@functools.partial(jax.jit, static_argnames=("channel_axis", "lo", "hi"))
def _certify(w, b, *, channel_axis, lo, hi):
    w2 = jnp.moveaxis(w, channel_axis, 0)
    w2 = w2.reshape(w2.shape[0], -1).astype(_I32)
    p_lo, p_hi = w2 * lo, w2 * hi
    pos = _exact_nonneg_sum(jnp.maximum(jnp.maximum(p_lo, p_hi), 0))
    neg = _exact_nonneg_sum(jnp.maximum(-jnp.minimum(p_lo, p_hi), 0))
    top = W.saturate_to_int32(W.add(W.from_int32(b), pos), -M32, M32)[1]
    bottom = W.saturate_to_int32(W.sub(W.from_int32(b), neg), -M32, M32)[1]
    return ~(top | bottom)
