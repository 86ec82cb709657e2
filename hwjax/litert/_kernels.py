"""TFLite int8 kernels (spec gemmlowp.md §2.6-§2.9): fully connected, convolution,
depthwise convolution, add, average and max pooling, with the requantisation
convention of each runtime.

Public kernels take the tensors' quantisation as concrete numbers (the recipe runs on
the host in float64, as TFLite's does); the arrays may be traced (``jit``, ``vmap``).
The accumulators are exact int32 dots (:func:`hwjax.core.int_dot`: an integer dot on
CPU, exact float32 pieces on GPU): no rounding float matmul anywhere. Fully connected and convolution run their dot
on 8-bit operands (the activations shifted into the backend's fastest 8-bit type, uint8
or int8, and the input zero point folded into the bias, see :func:`_int8_operand`), which
XLA runs several times faster than an int32 dot and which is exact for every input
(8-bit products summed in int32, wrapping as the runtime's int32 accumulator does).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import (
    ConvGeometry,
    conv_dot_kernel,
    conv_dot_patches,
    eager_program,
    int_dot,
    lhs8_dtype,
    map_chunks,
    window_products_sum,
    window_taps,
)
from hwjax.core import validate as V
from hwjax.core import surrogate as S
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.litert._arith import (
    INT32_MAX,
    INT32_MIN,
    REQUANT,
    activation_range,
    check_act_range,
    check_int_array,
    check_params,
    check_requant_params,
    check_scale,
    check_scales,
    check_zero_point,
    _traced,
    params_used,
    quantize_multiplier,
    rdbpot32,
    requant_params,
    requantize,
    srdhm32,
)

_I32 = jnp.int32


def _concrete(v, what: str):
    try:
        return np.asarray(v)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise RangeError(f"{what} must be concrete (a number or numpy array), not a traced value") from None


def _zp(v, what: str) -> int:
    check_zero_point(v, what)
    z = _concrete(v, what)
    if z.size != 1 or z.reshape(()) != np.round(z.reshape(())):
        raise RangeError(f"{what} must be one integer, got {v!r}")
    z = int(z.reshape(()))
    if not -128 <= z <= 255:
        raise RangeError(f"{what} must be in [-128, 255], got {z}")
    return z


def _int_input(x, name: str, lo: int = -128, hi: int = 127) -> jax.Array:
    a = V.as_array(x, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(f"{name} must be an integer array (int8 values), got dtype {a.dtype}")
    V.check_range(a, lo, hi, name)
    return S.host_cast(x, a, _I32)


def _int8_operand(x, zin):
    """``(x - c, zin - c, c)`` with the first two as 8-bit operands of :func:`_dot8` and
    ``c`` an int32 scalar. The operands' type is :func:`hwjax.core.lhs8_dtype` (what the
    backend's dot runs fastest: uint8 on a CPU with VNNI, else int8). For int8: ``c`` is 0
    when ``x`` holds int8 values and ``zin <= 127``, 128 otherwise (``x`` then holds uint8
    values, as a uint8 tensor's zero point and values are in [0, 255]); for uint8, ``c`` is
    that minus 128, so that ``x - c`` is in [0, 255].

    ``SUM_i (x_i - zin) w_i = SUM_i (x_i - c) w_i + (c - zin) SUM_i w_i`` exactly (also
    modulo 2**32), so a dot on the 8-bit operand plus a per-channel correction folded into
    the bias gives the runtime's int32 accumulator bit for bit, for every input.
    """
    x = jnp.asarray(x)
    zin = jnp.asarray(zin, _I32)
    if x.dtype == jnp.int8:
        c = jnp.int32(0)
    elif x.dtype == jnp.uint8:
        c = jnp.int32(128)
    else:
        top = jnp.maximum(jnp.max(x.astype(_I32), initial=-128), zin)
        c = jnp.where(top > 127, 128, 0).astype(_I32)
    dt = lhs8_dtype()
    if dt == jnp.uint8:
        c = c - 128
    return (x.astype(_I32) - c).astype(dt), (zin - c).astype(dt), c


#: the result dtypes of the int8 kernels (``out_dtype``)
OUT_DTYPES = ("int32", "int16", "int8", "uint8")


def _out_dtype(out_dtype, act_min, act_max) -> np.dtype:
    """``out_dtype`` checked: one of :data:`OUT_DTYPES`, holding every value of
    ``[act_min, act_max]`` where the bounds are concrete (traced bounds are the caller's
    promise, as for the clamp itself)."""
    try:
        dt = np.dtype(out_dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in OUT_DTYPES:
        raise ArgTypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}")
    if not (_traced(act_min) or _traced(act_max)):
        lo, hi = np.asarray(act_min).min(), np.asarray(act_max).max()
        if lo < np.iinfo(dt).min or hi > np.iinfo(dt).max:
            raise RangeError(
                f"out_dtype={dt.name} cannot hold [act_min, act_max] = [{lo}, {hi}]: the range must lie in "
                f"[{np.iinfo(dt).min}, {np.iinfo(dt).max}]"
            )
    return dt


def _requantized_chunks(one, x, n_lead: int, per_example_bytes: int, out_dtype: np.dtype) -> jax.Array:
    """:func:`hwjax.core.map_chunks` of ``one`` (a chunk's int32 requantised values) with
    each chunk stored as ``out_dtype``, inside the loop: XLA does not move a conversion of
    the loop's result into it (VWW's 48x48x16 pointwise layer, int32 chunks then int8:
    2.6 ms of 9 per batch of 256 converting, 1.6 ms initialising the int32 result)."""
    return map_chunks(lambda v: one(v).astype(out_dtype), x, n_lead, per_example_bytes)


def _dot8(a: jax.Array, b: jax.Array) -> jax.Array:
    """Exact int32 ``a @ b.T`` over the last axes of 8-bit ``a`` and int8-valued ``b`` (int32 accumulation)."""
    return int_dot(a, b.astype(jnp.int8), (((a.ndim - 1,), (1,)), ((), ())))


def _folded_bias(kernel2d, bias, zin, c, wsum=None):
    """``bias + (c - zin) * SUM_i kernel[o, i]`` (int32, wrapping): the zero-point term.
    ``wsum``: those sums when the caller has them, else computed here."""
    wsum = kernel_sums(kernel2d) if wsum is None else jnp.asarray(wsum, _I32)
    return bias.astype(_I32) + (c - zin) * wsum


def kernel_sums(kernel, *, depthwise: bool = False):
    """Per output channel, the sum of an integer ``kernel``'s weights (int32, wrapping): the
    factor of the input zero point in a layer's accumulator (:func:`fc_int`, :func:`conv_int`,
    :func:`depthwise_int` take them as ``wsum``).

    ``kernel``: ``(O, ...)`` (fully connected (O, I), conv OHWI), summed over every axis but
    the first; with ``depthwise=True`` a ``(kh, kw, C)`` kernel, summed over all but the last.
    A NumPy kernel gives a NumPy array (host lowering: nothing compiled), a JAX array (or a
    traced one) a JAX array. ArgTypeError for a non-integer kernel, ShapeError for a
    depthwise kernel without three axes. No gradient (integers)."""
    k = kernel if isinstance(kernel, (jax.Array, np.ndarray)) else np.asarray(kernel)
    if not jnp.issubdtype(k.dtype, jnp.integer):
        raise ArgTypeError(f"kernel must be an integer array, got dtype {k.dtype}")
    if (k.ndim != 3) if depthwise else (k.ndim < 1):
        raise ShapeError(f"kernel must be {'(kh, kw, C)' if depthwise else '(O, ...)'}, got shape {k.shape}")
    xp = jnp if isinstance(k, jax.Array) else np
    rows = k.reshape(-1, k.shape[-1]).T if depthwise else k.reshape(k.shape[0], -1)
    return xp.sum(rows.astype(xp.int32), axis=1, dtype=xp.int32)


def accumulator_range(kernel, bias, input_zero_point, *, depthwise: bool = False):
    """Per output channel, bounds ``(lo, hi)`` of the accumulator of :func:`fc_int`,
    :func:`conv_int` and :func:`depthwise_int`, ``bias + SUM w (x - zin)`` over the
    channel's weights, for every int8 or uint8 input ``x`` (``x - zin`` in ``[-128 - zin,
    255 - zin]``; a padded tap reads ``zin`` and adds 0): each weight takes the end of that
    interval that makes its product smallest (``lo``) or largest (``hi``).

    ``kernel`` as in :func:`kernel_sums` (int8 values), ``bias`` one int32 per output
    channel, the zero point in [-128, 255]. Concrete arguments give NumPy int64 bounds (the
    host recipe: :func:`hwjax.litert.with_acc_bound` reads them); traced ones int32 arrays,
    exact while ``|bias| + 383 SUM |w|`` stays below ``2**31``."""
    check_int_array(kernel, "kernel", -128, 127)
    check_int_array(bias, "bias", -(2**31), 2**31 - 1)
    check_zero_point(input_zero_point, "input_zero_point")
    traced = any(isinstance(v, jax.core.Tracer) for v in (kernel, bias, input_zero_point))
    xp, dt = (jnp, jnp.int32) if traced else (np, np.int64)
    k = xp.asarray(kernel).astype(dt)
    if (k.ndim != 3) if depthwise else (k.ndim < 2):
        raise ShapeError(f"kernel must be {'(kh, kw, C)' if depthwise else '(O, ...)'}, got shape {k.shape}")
    rows = k.reshape(-1, k.shape[-1]).T if depthwise else k.reshape(k.shape[0], -1)
    b = xp.asarray(bias).astype(dt).reshape(-1)
    if b.shape[0] != rows.shape[0]:
        raise ShapeError(f"bias must have {rows.shape[0]} entries (one per output channel), got {b.shape[0]}")
    z = xp.asarray(input_zero_point).astype(dt).reshape(-1)[0]
    u_lo, u_hi = -128 - z, 255 - z
    pos, neg = xp.maximum(rows, 0).sum(axis=1), xp.minimum(rows, 0).sum(axis=1)
    return b + pos * u_lo + neg * u_hi, b + pos * u_hi + neg * u_lo


# ------------------------------------------------------------------ internal (params given)


def _check_int_kernel(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, geom=None, kind="fc"):
    """The checks of :func:`fc_int`, :func:`conv_int`, :func:`depthwise_int` (values when
    concrete; shapes and types always)."""
    V.check_choice(requant, tuple(REQUANT), "requant")
    x = check_int_array(x, "x", -128, 255)
    kernel = check_int_array(kernel, "kernel", -128, 127)
    bias = check_int_array(bias, "bias", INT32_MIN, INT32_MAX)
    check_zero_point(zin, "zin")
    check_zero_point(zout, "zout")
    check_act_range(act_min, act_max)
    ndim = {"fc": 2, "conv": 4, "depthwise": 3}[kind]
    if kernel.ndim != ndim:
        layout = {"fc": "(O, I)", "conv": "OHWI", "depthwise": "(kh, kw, C)"}[kind]
        raise ShapeError(f"kernel must have {ndim} axes {layout}, got shape {kernel.shape}")
    n_out = kernel.shape[-1] if kind == "depthwise" else kernel.shape[0]
    if bias.shape != (n_out,):
        raise ShapeError(f"bias must have shape ({n_out},), got {bias.shape}")
    check_requant_params(rq, requant, "rq", n_out)
    n_in = kernel.shape[-1]
    if x.ndim < (1 if kind == "fc" else 3) or x.shape[-1] != n_in:
        raise ShapeError(
            f"x must be ({'...' if kind == 'fc' else '..., H, W'}, {n_in}) for a kernel of shape "
            f"{kernel.shape}, got shape {x.shape}"
        )
    if kind != "fc":
        if not isinstance(geom, ConvGeometry):
            raise ArgTypeError(f"geom must be a ConvGeometry (see conv_geometry), got {geom!r}")
        khw = tuple(kernel.shape[1:3] if kind == "conv" else kernel.shape[:2])
        if tuple(geom.in_hw) != tuple(x.shape[-3:-1]) or tuple(geom.kernel) != khw:
            raise ShapeError(
                f"geom (input {geom.in_hw}, kernel {geom.kernel}) does not match x of shape {x.shape} "
                f"and kernel of shape {kernel.shape}"
            )
    return x, kernel, bias


def fc_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, *, wsum=None, out_dtype="int32"):
    """x (..., I) int32 holding int8 (or uint8) values, kernel (O, I) int8 values, bias (O,) -> (..., O).
    ``wsum``: :func:`kernel_sums` of ``kernel`` where the caller has them (O,), else None.
    ``out_dtype`` (static, one of :data:`OUT_DTYPES`): the result's dtype, which must hold
    every value of ``[act_min, act_max]`` (checked where the bounds are concrete); the
    values are the same in any of them."""
    x, kernel, bias = _check_int_kernel(x, kernel, bias, zin, rq, requant, zout, act_min, act_max)
    _check_wsum(wsum, bias.shape)
    dt = _out_dtype(out_dtype, act_min, act_max)
    return _fc_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum).astype(dt)


def _check_wsum(wsum, shape) -> None:
    if wsum is not None and tuple(np.shape(wsum)) != tuple(shape):
        raise ShapeError(f"wsum must have shape {tuple(shape)} (one sum per output channel), got {np.shape(wsum)}")


@eager_program(static_argnames=("requant",))
def _fc_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum=None):
    x8, _, c = _int8_operand(x, zin)
    acc = _dot8(x8, kernel) + _folded_bias(kernel, bias, jnp.asarray(zin, _I32), c, wsum)
    return requantize(acc, rq, requant, output_zero_point=zout, act_min=act_min, act_max=act_max)


def conv_int(
    x, kernel, bias, zin, rq, requant, zout, act_min, act_max, geom: ConvGeometry, *, wsum=None, out_dtype="int32"
):
    """x (..., H, W, I), kernel OHWI -> (..., OH, OW, O): int8 im2col patches (padded taps
    read the input zero point) and one int8 dot. ``wsum``: :func:`kernel_sums` of ``kernel``
    where the caller has them (O,), else None. ``out_dtype``: as in :func:`fc_int`."""
    x, kernel, bias = _check_int_kernel(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, geom, "conv")
    _check_wsum(wsum, bias.shape)
    dt = _out_dtype(out_dtype, act_min, act_max)
    return _conv_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum, geom, dt)


@eager_program(static_argnames=("requant", "geom", "out_dtype"))
def _conv_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum, geom: ConvGeometry, out_dtype):
    # one dot in hwjax.core's fastest patch layout for the geometry (space_to_depth blocks
    # for a strided window whose sides are multiples of the stride: KWS's one-channel 10x4
    # first layer reads 10 taps instead of 40, 1.1x the model); the layout reorders the
    # products and adds zero ones, which an int32 dot sums to the same bits
    k = conv_dot_kernel(kernel, geom)

    def one(x):
        x8, z8, c = _int8_operand(x, zin)
        p = conv_dot_patches(x8, geom, pad_value=z8, width=k.shape[1])
        acc = _dot8(p, k) + _folded_bias(k, bias, jnp.asarray(zin, _I32), c, wsum)
        return requantize(acc, rq, requant, output_zero_point=zout, act_min=act_min, act_max=act_max)

    oh, ow = geom.out_hw
    return _requantized_chunks(one, x, x.ndim - 3, oh * ow * (k.shape[1] + 4 * k.shape[0]), out_dtype)


def depthwise_int(
    x, kernel, bias, zin, rq, requant, zout, act_min, act_max, geom: ConvGeometry, *, wsum=None, out_dtype="int32"
):
    """x (..., H, W, C), kernel (kh, kw, C) -> (..., OH, OW, C). ``wsum``:
    :func:`kernel_sums` of ``kernel`` (``depthwise=True``) where the caller has them (C,),
    else None. ``out_dtype``: as in :func:`fc_int`."""
    x, kernel, bias = _check_int_kernel(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, geom, "depthwise")
    _check_wsum(wsum, bias.shape)
    dt = _out_dtype(out_dtype, act_min, act_max)
    return _depthwise_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum, geom, dt)


@eager_program(static_argnames=("requant", "geom", "out_dtype"))
def _depthwise_int(x, kernel, bias, zin, rq, requant, zout, act_min, act_max, wsum, geom: ConvGeometry, out_dtype):
    # The accumulator SUM_t (x_t - zin) k_t + bias, as SUM_t x_t k_t + (bias - zin SUM_t k_t)
    # (padded taps read zin, so both agree on every tap; int32 wrapping, equal modulo 2**32).
    # Each product x_t k_t is exact in int16: x holds int8 or uint8 values (and zin is in
    # [-128, 255]), so |x_t| <= 255 and |k_t| <= 128 give |x_t k_t| <= 32640 < 2**15; the
    # products are summed in int32. On XLA:CPU (one core, AVX-512) the MLPerf Tiny 3x3
    # depthwise layers ran 1.05-1.3x faster than with int32 products.
    k16 = kernel.astype(jnp.int16)
    zin32 = jnp.asarray(zin, _I32)
    wsum = kernel_sums(kernel, depthwise=True) if wsum is None else jnp.asarray(wsum, _I32)
    folded = bias.astype(_I32) - zin32 * wsum

    def one(x):
        acc = folded + window_products_sum(x.astype(jnp.int16), k16, geom, pad_value=zin32.astype(jnp.int16))
        return requantize(acc, rq, requant, output_zero_point=zout, act_min=act_min, act_max=act_max)

    oh, ow = geom.out_hw
    return _requantized_chunks(one, x, x.ndim - 3, oh * ow * kernel.shape[-1] * 8, out_dtype)


def tap_counts(geom: ConvGeometry) -> np.ndarray:
    """(OH, OW) number of window taps inside the image (TFLite's ``filter_count``); numpy."""
    counts = []
    for ax in range(2):
        o = np.arange(geom.out_hw[ax])[:, None]
        pos = o * geom.stride[ax] - geom.padding[ax][0] + np.arange(geom.kernel[ax])[None, :] * geom.dilation[ax]
        counts.append(((pos >= 0) & (pos < geom.in_hw[ax])).sum(axis=1))
    return (counts[0][:, None] * counts[1][None, :]).astype(np.int32)


def avgpool_int(x, geom: ConvGeometry, act_min, act_max):
    """TFLite int8 average pool: in-image taps summed, divided by their count rounding
    half away from zero (C integer division of ``acc +- count/2``)."""
    return _avgpool_int(_check_pool(x, geom, act_min, act_max), geom, act_min, act_max)


@eager_program(static_argnames=("geom",))
def _avgpool_int(x, geom: ConvGeometry, act_min, act_max):
    taps = window_taps(x, geom, pad_value=0)
    acc = sum(taps[1:], taps[0])
    n = np.asarray(tap_counts(geom))[:, :, None]
    half = n // 2
    q = jnp.where(acc > 0, (acc + half) // n, -((-acc + half) // n))
    return jnp.clip(q, act_min, act_max)


def _check_pool(x, geom, act_min, act_max):
    x = check_int_array(x, "x", -128, 127)
    if not isinstance(geom, ConvGeometry):
        raise ArgTypeError(f"geom must be a ConvGeometry (see conv_geometry), got {geom!r}")
    if x.ndim < 3 or tuple(x.shape[-3:-1]) != tuple(geom.in_hw):
        raise ShapeError(f"x must be (..., {geom.in_hw[0]}, {geom.in_hw[1]}, C) for geom, got shape {x.shape}")
    check_act_range(act_min, act_max)
    return x


def maxpool_int(x, geom: ConvGeometry, act_min, act_max):
    """TFLite int8 max pool: the largest in-image tap, clamped to ``[act_min, act_max]``."""
    return _maxpool_int(_check_pool(x, geom, act_min, act_max), geom, act_min, act_max)


@eager_program(static_argnames=("geom",))
def _maxpool_int(x, geom: ConvGeometry, act_min, act_max):
    taps = window_taps(x, geom, pad_value=-(2**31))
    m = taps[0]
    for t in taps[1:]:
        m = jnp.maximum(m, t)
    return jnp.clip(m, act_min, act_max)


def add_params(s1, s2, s_out) -> dict[str, np.ndarray]:
    """TFLite int8 ADD recipe (``add.cc`` Prepare): left shift 20, input multipliers
    ``s_i / (2 max(s1, s2))`` and output multiplier ``2 max(s1, s2) / (2**20 s_out)``,
    each through ``QuantizeMultiplier`` (float64)."""
    for v, n in ((s1, "s1"), (s2, "s2"), (s_out, "s_out")):
        check_scale(v, n)
    s1, s2, s_out = (float(np.float32(np.asarray(v, np.float32).reshape(()))) for v in (s1, s2, s_out))
    twice_max = 2.0 * max(s1, s2)
    m1, e1 = quantize_multiplier(s1 / twice_max)
    m2, e2 = quantize_multiplier(s2 / twice_max)
    mo, eo = quantize_multiplier(twice_max / float(np.float32(np.float32(2**20) * np.float32(s_out))))
    return {k: np.int32(v) for k, v in dict(m1=m1, e1=e1, m2=m2, e2=e2, mo=mo, eo=eo).items()}


def _mbqm_small(x, m, e):
    """``MultiplyByQuantizedMultiplierSmallerThanOneExp`` (double-rounding build), ``-31 <= e``."""
    return rdbpot32(srdhm32(x, m), jnp.maximum(-e, 0))


ADD_KEYS = ("m1", "e1", "m2", "e2", "mo", "eo")


def check_add_operands(x1, x2):
    """Two int8-valued integer arrays of shapes that broadcast (ShapeError naming ``x2``)."""
    x1 = check_int_array(x1, "x1")
    x2 = check_int_array(x2, "x2")
    V.check_broadcast(x1, "x1", x2, "x2")
    return x1, x2


def add_int(x1, x2, p, z1, z2, zout, act_min, act_max):
    """TFLite's reference int8 ADD (``p`` from :func:`add_params`; int8 values in, int32
    out). Concrete arguments are checked; traced ones are the caller's contract."""
    x1, x2 = check_add_operands(x1, x2)
    check_params(p, "p", ADD_KEYS)
    for k in ADD_KEYS:
        lo, hi = (-31, 31) if k.startswith("e") else (INT32_MIN, INT32_MAX)
        check_int_array(p[k], f"p['{k}']", lo, hi)
    for v, n in ((z1, "z1"), (z2, "z2"), (zout, "zout")):
        check_zero_point(v, n)
    check_act_range(act_min, act_max)
    return _add_int(x1, x2, params_used(p, ADD_KEYS), z1, z2, zout, act_min, act_max)


@eager_program
def _add_int(x1, x2, p, z1, z2, zout, act_min, act_max):
    a = _mbqm_small((x1 - z1) * (1 << 20), p["m1"], p["e1"])
    b = _mbqm_small((x2 - z2) * (1 << 20), p["m2"], p["e2"])
    s = a + b
    ls = jnp.maximum(p["eo"], 0)
    v = rdbpot32(srdhm32(s << ls, p["mo"]), jnp.maximum(-p["eo"], 0))  # the left shift wraps
    return jnp.clip(jnp.clip(v, -(2**30), 2**30) + zout, act_min, act_max)


# ------------------------------------------------------------------------- public kernels


# the public kernels run as one compiled program per configuration, not op by op
_fc_jit = jax.jit(fc_int, static_argnums=(5,))
_conv_jit = jax.jit(conv_int, static_argnums=(5, 9))
_depthwise_jit = jax.jit(depthwise_int, static_argnums=(5, 9))


def _check_requant(requant: str) -> str:
    return V.check_choice(requant, tuple(REQUANT), "requant")


def _prepare(
    x,
    w,
    b,
    n_out,
    input_scale,
    input_zero_point,
    filter_scales,
    output_scale,
    output_zero_point,
    requant,
    activation,
    float32_product,
):
    _check_requant(requant)
    check_scale(input_scale, "input_scale")
    check_scale(output_scale, "output_scale")
    check_scales(filter_scales, "filter_scales")
    zin = _zp(input_zero_point, "input_zero_point")
    zout = _zp(output_zero_point, "output_zero_point")
    fs = _concrete(filter_scales, "filter_scales").astype(np.float32).reshape(-1)
    if fs.size not in (1, n_out):
        raise ShapeError(f"filter_scales must have 1 or {n_out} (output channels) entries, got {fs.size}")
    rq = requant_params(
        _concrete(input_scale, "input_scale"),
        fs,
        _concrete(output_scale, "output_scale"),
        requant,
        float32_product=float32_product and fs.size == 1,
        channels=n_out,
    )
    lo, hi = activation_range(activation, _concrete(output_scale, "output_scale"), zout)
    x = _int_input(x, "x")
    w = _int_input(w, "w")
    b = jax.device_put(np.zeros((n_out,), np.int32)) if b is None else _int_input(b, "b", -(2**31), 2**31 - 1)
    if b.shape != (n_out,):
        raise ShapeError(f"b must have shape ({n_out},), got {b.shape}")
    return x, w, b, zin, zout, rq, lo, hi


def fully_connected(
    x,
    w,
    b,
    *,
    input_scale,
    input_zero_point,
    filter_scales,
    output_scale,
    output_zero_point,
    requant: str,
    activation=None,
) -> jax.Array:
    """TFLite int8 FULLY_CONNECTED: ``clamp(R(SUM_i w[o,i] (x[..,i] - zin) + b[o]) + zout, act)``.

    Args:
      x: (..., I) int8 values. w: (O, I) int8 (zero point 0). b: (O,) int32 or None.
      input_scale, input_zero_point, output_scale, output_zero_point: the tensors'
        quantisation (concrete numbers).
      filter_scales: one scale (per tensor: the multiplier comes from the float32 scale
        product, as TFLite's per-tensor FC) or O scales (per channel).
      requant: ``"double"`` (R1), ``"float64"`` (R2), ``"ruy"`` (R3), ``"xnnpack"`` (R4)
        or ``"single"`` (spec gemmlowp.md §2.9).
      activation: None, ``"relu"``, ``"relu6"``, ``"relu_n1_to_1"`` (clamps of §2.7).
    Returns int32 (..., O) holding int8 values.
    """
    w_arr = V.as_array(w, "w")
    if w_arr.ndim != 2:
        raise ShapeError(f"w must be (O, I), got shape {w_arr.shape}")
    x, w, b, zin, zout, rq, lo, hi = _prepare(
        x,
        w,
        b,
        w_arr.shape[0],
        input_scale,
        input_zero_point,
        filter_scales,
        output_scale,
        output_zero_point,
        requant,
        activation,
        True,
    )
    if x.shape[-1] != w.shape[1]:
        raise ShapeError(f"x has {x.shape[-1]} features, w expects {w.shape[1]}")
    return _fc_jit(x, w, b, zin, rq, requant, zout, lo, hi)


def conv_geometry(in_hw, kernel_hw, stride, padding, dilation=(1, 1)) -> ConvGeometry:
    """TFLite SAME/VALID geometry (``padding.h``: the extra pixel of an odd total after)."""
    padding = padding.upper() if isinstance(padding, str) else padding
    if not (isinstance(padding, str) and padding in ("SAME", "VALID")):
        raise RangeError(f"padding must be 'SAME' or 'VALID', got {padding!r}")
    pairs = []
    for v, n in ((in_hw, "in_hw"), (kernel_hw, "kernel"), (stride, "stride"), (dilation, "dilation")):
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and n in ("stride", "dilation"):
            v = (v, v)
        if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list, np.ndarray)):
            raise ArgTypeError(
                f"{n} must be a pair of ints{' or one int' if n in ('stride', 'dilation') else ''}, got {v!r}"
            )
        pairs.append(tuple(v))
    return ConvGeometry.make(*pairs[:3], padding, pairs[3])


def conv2d(
    x,
    w,
    b,
    *,
    stride=1,
    padding="VALID",
    dilation=1,
    input_scale,
    input_zero_point,
    filter_scales,
    output_scale,
    output_zero_point,
    requant: str,
    activation=None,
) -> jax.Array:
    """TFLite int8 CONV_2D (``ConvPerChannel``, spec §2.8): x (..., H, W, I) NHWC, w OHWI,
    padded taps read the input zero point. Multipliers always from the double scale
    product (also for one filter scale). Other arguments as :func:`fully_connected`.
    Returns int32 (..., OH, OW, O)."""
    w_arr = V.as_array(w, "w")
    if w_arr.ndim != 4:
        raise ShapeError(f"w must be OHWI, got shape {w_arr.shape}")
    x, w, b, zin, zout, rq, lo, hi = _prepare(
        x,
        w,
        b,
        w_arr.shape[0],
        input_scale,
        input_zero_point,
        filter_scales,
        output_scale,
        output_zero_point,
        requant,
        activation,
        False,
    )
    if x.ndim < 3 or x.shape[-1] != w.shape[3]:
        raise ShapeError(f"x must be (..., H, W, {w.shape[3]}), got shape {x.shape}")
    geom = conv_geometry(x.shape[-3:-1], w.shape[1:3], stride, padding, dilation)
    return _conv_jit(x, w, b, zin, rq, requant, zout, lo, hi, geom)


def depthwise_conv2d(
    x,
    w,
    b,
    *,
    stride=1,
    padding="VALID",
    dilation=1,
    input_scale,
    input_zero_point,
    filter_scales,
    output_scale,
    output_zero_point,
    requant: str,
    activation=None,
) -> jax.Array:
    """TFLite int8 DEPTHWISE_CONV_2D, channel multiplier 1: x (..., H, W, C), w (kh, kw, C)
    (the file's (1, kh, kw, C)), per-channel scales along C. Returns int32 (..., OH, OW, C)."""
    w_arr = V.as_array(w, "w")
    if w_arr.ndim == 4 and w_arr.shape[0] == 1:
        w = w_arr = w_arr[0]
    if w_arr.ndim != 3:
        raise ShapeError(f"w must be (kh, kw, C) or (1, kh, kw, C), got shape {w_arr.shape}")
    x, w, b, zin, zout, rq, lo, hi = _prepare(
        x,
        w,
        b,
        w_arr.shape[2],
        input_scale,
        input_zero_point,
        filter_scales,
        output_scale,
        output_zero_point,
        requant,
        activation,
        False,
    )
    if x.ndim < 3 or x.shape[-1] != w.shape[2]:
        raise ShapeError(f"x must be (..., H, W, {w.shape[2]}), got shape {x.shape}")
    geom = conv_geometry(x.shape[-3:-1], w.shape[:2], stride, padding, dilation)
    return _depthwise_jit(x, w, b, zin, rq, requant, zout, lo, hi, geom)
