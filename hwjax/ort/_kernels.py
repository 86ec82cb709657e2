"""ONNX Runtime's CPU int8 kernels as exact JAX functions (NCHW, batch first).

Integer tensors travel as int32 arrays holding the tensor's values. Float32 steps are
written so that no result depends on XLA's fusion decisions: a product that is followed
by an addition is :func:`hwjax.core.mul_rn`, divisions are :func:`hwjax.core.div_rn`.
"""

from __future__ import annotations

import jax.numpy as jnp

from hwjax.core import ConvGeometry, div_rn, extract_patches, int_dot, mul_rn, window_taps
from hwjax.errors import ArgTypeError, ShapeError, UnsupportedOpError

_INT_MIN = -(2**31)


def cvt_int32(t):
    """x86 ``cvtps2dq`` of float32 ``t``: ties to even, and ``INT32_MIN`` for values outside
    the int32 range or NaN."""
    ok = jnp.abs(t) < 2.0**31
    return jnp.where(ok, jnp.round(jnp.where(ok, t, 0.0)).astype(jnp.int32), _INT_MIN)


def requantize_output(acc, m, zp, lo: int, hi: int):
    """``MlasRequantizeOutput`` on int32 accumulators ``acc``: ``v = f32(f32(acc) * m)``
    (the accumulator itself rounded to float32, ties to even, above ``2**24``),
    ``y = rint(clip(v, lo - zp, hi - zp)) + zp`` (clamped in float32, ties to even). ``m``
    (float32) and ``zp`` (int32) broadcast against ``acc``. The product is not followed by
    an addition, so it is rounded once whatever XLA fuses. Returns int32."""
    v = acc.astype(jnp.float32) * m
    zp = jnp.asarray(zp, jnp.int32)
    v = jnp.clip(v, (lo - zp).astype(jnp.float32), (hi - zp).astype(jnp.float32))
    return jnp.round(v).astype(jnp.int32) + zp


def quantize_linear(x, scale, zp, lo: int, hi: int):
    """QuantizeLinear of float32 ``x``: ``clip(rint(f32(x / scale)), lo - zp, hi - zp) + zp``
    with the correctly rounded division; NaN gives ``lo``. Returns int32."""
    zp = jnp.asarray(zp, jnp.int32)
    q = jnp.round(div_rn(x.astype(jnp.float32), scale))
    q = jnp.where(jnp.isnan(q), (lo - zp).astype(jnp.float32), q)
    q = jnp.clip(q, (lo - zp).astype(jnp.float32), (hi - zp).astype(jnp.float32))
    return q.astype(jnp.int32) + zp


def dequantize_linear(q, scale, zp):
    """DequantizeLinear: ``f32(f32(q - zp) * scale)`` (the difference in int32, converted with
    ties to even, one rounded product). Returns float32."""
    d = (q.astype(jnp.int32) - jnp.asarray(zp, jnp.int32)).astype(jnp.float32)
    return mul_rn(d, jnp.asarray(scale, jnp.float32))


def conv_acc(x, w, x_zp, w_zp, geom: ConvGeometry, group: int):
    """QLinearConv / ConvInteger accumulators: ``sum (x - x_zp)(w - w_zp)`` over each window,
    exact int32 (padding holds ``x_zp``, so it contributes nothing).

    ``x``: (B, C, H, W) int32 values; ``w``: (O, C / group, kh, kw) int32 values; ``x_zp``
    a scalar, ``w_zp`` a scalar or (O,). Returns (B, O, OH, OW) int32."""
    _check_conv(x, w, w_zp, geom, group)
    b, c = x.shape[0], x.shape[1]
    o = w.shape[0]
    if group == 1:
        return _conv_acc_8bit(x, w, x_zp, w_zp, geom)
    cg, og = c // group, o // group
    xd = (x - jnp.asarray(x_zp, jnp.int32)).astype(jnp.int16).transpose(0, 2, 3, 1)  # NHWC, |v| <= 255
    wz = jnp.asarray(w_zp, jnp.int32)
    wd = (w - (wz.reshape(-1, 1, 1, 1) if wz.ndim else wz)).astype(jnp.int16)
    kh, kw = geom.kernel
    patches = extract_patches(xd, geom, pad_value=0)  # (B, OH, OW, kh*kw*C), (kh, kw, c) order
    oh, ow = geom.out_hw
    patches = patches.reshape(b, oh, ow, kh * kw, group, cg)
    # weights as (group, kh*kw, cg, og)
    wg = wd.reshape(group, og, cg, kh * kw).transpose(0, 3, 2, 1)
    acc = int_dot(patches, wg, (((3, 5), (1, 2)), ((4,), (0,))))  # (group, B, OH, OW, og)
    return acc.transpose(1, 0, 4, 2, 3).reshape(b, o, oh, ow)


def _conv_acc_8bit(x, w, x_zp, w_zp, geom: ConvGeometry):
    """:func:`conv_acc` of one group as one dot on 8-bit operands (:func:`_zp_dot`): the
    im2col patches of ``x`` shifted into uint8 (padded taps read the shifted ``x_zp``) and
    the weights shifted into int8, rows in (kh, kw, c) order."""
    c, o = x.shape[1], w.shape[0]
    kh, kw = geom.kernel
    u, uz = _to_u8(x, x_zp)
    patches = extract_patches(u.transpose(0, 2, 3, 1), geom, pad_value=uz.astype(jnp.uint8))  # (B, OH, OW, K)
    v, vz = _to_s8(w, w_zp)
    acc = _zp_dot(patches, v.transpose(0, 2, 3, 1).reshape(o, kh * kw * c), uz, vz)  # (B, OH, OW, O)
    return acc.transpose(0, 3, 1, 2)


def _to_u8(x, zp):
    """``(x - a, zp - a)``: 8-bit data (int32 values of a uint8 or int8 tensor) and its
    zero point shifted into [0, 255], as uint8 and int32 (``a`` = -128 when either is
    negative, i.e. int8 data, else 0)."""
    zp = jnp.asarray(zp, jnp.int32)
    a = jnp.where(jnp.minimum(jnp.min(x), jnp.min(zp)) < 0, -128, 0).astype(jnp.int32)
    return (x.astype(jnp.int32) - a).astype(jnp.uint8), zp - a


def _to_s8(w, zp):
    """``(w - b, zp - b)``: 8-bit weights and their zero point(s) shifted into [-128, 127],
    as int8 and int32 (``b`` = 128 when a weight exceeds 127, i.e. uint8 weights, else 0)."""
    zp = jnp.asarray(zp, jnp.int32)
    b = jnp.where(jnp.max(w) > 127, 128, 0).astype(jnp.int32)
    return (w.astype(jnp.int32) - b).astype(jnp.int8), zp - b


def _zp_dot(u, v, uz, vz):
    """``SUM_k (u[..., k] - uz)(v[n, k] - vz[n])`` (int32, exact modulo ``2**32``) for uint8
    ``u`` (..., K) and int8 rows ``v`` (N, K), ``uz`` a scalar and ``vz`` a scalar or (N,),
    as one 8-bit dot (which XLA:CPU runs in a library kernel; an int16 one it does not)::

        SUM (u - uz)(v - vz) = SUM u v - uz SUM v - vz SUM u + K uz vz

    term for term. ``SUM u`` comes out of the same dot, as a last row of ones in ``v``."""
    k = u.shape[-1]
    rows = jnp.concatenate([v, jnp.ones((1, k), jnp.int8)])
    r = int_dot(u, rows, (((u.ndim - 1,), (1,)), ((), ())))  # (..., N + 1)
    suv, su = r[..., :-1], r[..., -1:]
    sv = jnp.sum(v.astype(jnp.int32), axis=1, dtype=jnp.int32)
    vz = jnp.reshape(vz, (-1,))
    return suv - uz * sv - su * vz + k * uz * vz


def _check_int(v, name: str):
    if not jnp.issubdtype(jnp.asarray(v).dtype, jnp.integer):
        raise ArgTypeError(f"{name} must hold integers, got {jnp.asarray(v).dtype}")


def _check_conv(x, w, w_zp, geom, group):
    """ShapeError / ArgTypeError naming the argument of a convolution kernel."""
    _check_int(x, "x")
    _check_int(w, "w")
    if not isinstance(geom, ConvGeometry):
        raise ArgTypeError(f"geom must be a hwjax.core.ConvGeometry, got {type(geom).__name__}")
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"x must be (B, C, H, W) and w (O, C / group, kh, kw), got {x.shape} and {w.shape}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or x.shape[1] % group or w.shape[0] % group:
        raise ShapeError(
            f"group must be a positive int dividing the channels {x.shape[1]} and {w.shape[0]}, got {group!r}"
        )
    if w.shape[1] * group != x.shape[1] or tuple(w.shape[2:]) != tuple(geom.kernel) or tuple(x.shape[2:]) != geom.in_hw:
        raise ShapeError(f"w {w.shape} (group {group}) and geom {geom} do not fit x {x.shape}")
    if jnp.size(w_zp) not in (1, w.shape[0]):
        raise ShapeError(f"w_zp must be a scalar or hold one value per output channel, got shape {jnp.shape(w_zp)}")


def _check_matmul(a, b, b_zp):
    _check_int(a, "a")
    _check_int(b, "b")
    if a.ndim < 2 or b.ndim != 2 or a.shape[-1] != b.shape[0]:
        raise ShapeError(f"a must be (B, ..., K) and b (K, N), got {a.shape} and {b.shape}")
    if jnp.size(b_zp) not in (1, b.shape[1]):
        raise ShapeError(f"b_zp must be a scalar or hold one value per column, got shape {jnp.shape(b_zp)}")


def matmul_acc(a, b, a_zp, b_zp):
    """QLinearMatMul / MatMulInteger accumulators ``sum_k (a - a_zp)(b - b_zp)``, exact int32:
    ``a`` (B, ..., K) int32 values, ``b`` (K, N) int32 values, ``b_zp`` a scalar or (N,)."""
    _check_matmul(a, b, b_zp)
    u, uz = _to_u8(a, a_zp)
    v, vz = _to_s8(b, b_zp)
    return _zp_dot(u, v.T, uz, vz)


def lookup(x, table, lo: int):
    """``table[x - lo]`` (a 256-entry table indexed by the codes of an 8-bit type)."""
    return jnp.take(jnp.asarray(table, jnp.int32), x.astype(jnp.int32) - lo, mode="clip")


def lookup2(a, b, table, lo: int):
    """``table[a - lo, b - lo]`` of a (256, 256) table; ``a`` and ``b`` broadcast."""
    a, b = jnp.broadcast_arrays(a.astype(jnp.int32) - lo, b.astype(jnp.int32) - lo)
    return jnp.take(jnp.asarray(table, jnp.int32).reshape(-1), a * 256 + b, mode="clip")


def maxpool(x, geom: ConvGeometry, lowest):
    """MaxPool over NCHW ``x`` (integer or float32): the maximum of each window's in-image
    taps (padding holds ``lowest``, which loses every comparison)."""
    xt = x.transpose(0, 2, 3, 1)
    taps = window_taps(xt, geom, pad_value=lowest)
    y = taps[0]
    for t in taps[1:]:
        y = jnp.maximum(y, t)
    return y.transpose(0, 3, 1, 2)


def global_avgpool(x, x_zp, m, y_zp, lo: int, hi: int):
    """QLinearGlobalAveragePool (and an average pool whose window is the unpadded image):
    ``acc = sum(x) - x_zp * S`` over each channel's ``S = H * W`` pixels (int32), then
    :func:`requantize_output` with the multiplier ``m`` (:func:`hwjax.ort.global_pool_scale`)."""
    s = x.shape[2] * x.shape[3]
    acc = jnp.sum(x.astype(jnp.int32), axis=(2, 3), keepdims=True) - jnp.asarray(x_zp, jnp.int32) * s
    return requantize_output(acc, m, y_zp, lo, hi)


def avgpool_float(x, sx, zx, sy, zy, geom: ConvGeometry, count_include_pad: bool, lo: int, hi: int):
    """QLinearAveragePool's float path: ``xf = f32(sx * (x - zx))``; per window the in-image
    ``xf`` summed one by one in (row, column) order in float32; divided by the count (the
    window size with ``count_include_pad``, else the in-image taps); ``y =
    clip(rint(f32(f32(acc / sy) + zy)), lo, hi)`` (an int32 overflow gives ``lo``)."""
    xf = mul_rn((x - jnp.asarray(zx, jnp.int32)).astype(jnp.float32), jnp.float32(sx)).transpose(0, 2, 3, 1)
    ones = jnp.ones(x.shape[2:], jnp.int32)[None, :, :, None]
    taps = window_taps(xf, geom, pad_value=0.0)
    valid = window_taps(ones, geom, pad_value=0)
    acc = taps[0]
    for t in taps[1:]:
        acc = acc + t  # padded taps add an exact 0.0 (a -0.0 sum stays -0.0 only with no valid tap)
    count = sum(valid) if not count_include_pad else jnp.full_like(valid[0], len(valid))
    mean = div_rn(acc, count.astype(jnp.float32))
    t = div_rn(mean, jnp.float32(sy)) + jnp.float32(zy)
    return jnp.clip(cvt_int32(t), lo, hi).transpose(0, 3, 1, 2)


def float_binary(fn: str, a, b):
    """Element-wise float32 ``a + b`` or ``a * b`` (each rounded once); broadcasting."""
    return a + b if fn == "add" else mul_rn(a, b)


def logistic_jax(x, *, fma: bool):
    """MLAS's logistic of float32 ``x`` at run time (a float Sigmoid node). Only the SSE
    kernel (``fma=False``: every product rounded before its sum, :func:`hwjax.core.mul_rn`)
    is implemented; the FMA3 kernel raises :class:`hwjax.errors.UnsupportedOpError` (its
    fused multiply-adds have no exact float32 form here)."""
    if fma:
        raise UnsupportedOpError(
            "a float Sigmoid (MLAS's FMA3 logistic kernel) is not implemented; QLinearSigmoid's table is"
        )
    from hwjax.ort._host import LOGISTIC_ALPHA, LOGISTIC_BETA, LOGISTIC_CLIP

    v = jnp.clip(x.astype(jnp.float32), LOGISTIC_CLIP[0], LOGISTIC_CLIP[1])
    v2 = mul_rn(v, v)
    a9, a7, a5, a3, a1 = LOGISTIC_ALPHA
    b10, b8, b6, b4, b2, b0 = LOGISTIC_BETA
    p = mul_rn(v2, a9) + a7
    for c in (a5, a3, a1):
        p = mul_rn(p, v2) + c
    p = mul_rn(p, v)
    q = mul_rn(v2, b10) + b8
    for c in (b6, b4, b2, b0):
        q = mul_rn(q, v2) + c
    return jnp.clip(div_rn(p, q) + jnp.float32(0.5), 0.0, 1.0)


def _pair_dot_saturated(x, w, batch_x: tuple, batch_w: tuple):
    """``sum_j sat16(x[..., 2j] w[2j, ...] + x[..., 2j + 1] w[2j + 1, ...])`` over the last axis of
    ``x`` and axis ``len(batch_w)`` of ``w`` (K padded with a zero to an even length): the
    int16 pair saturation of ``vpmaddubsw``. Batch axes ``batch_x`` / ``batch_w`` are paired
    as in ``dot_general``; the result has the batch axes first."""
    k = x.shape[-1]
    if k % 2:
        x = jnp.concatenate([x, jnp.zeros((*x.shape[:-1], 1), x.dtype)], axis=-1)
        wa = len(batch_w)
        pad = [(0, 0)] * w.ndim
        pad[wa] = (0, 1)
        w = jnp.pad(w, pad)
    j = x.shape[-1] // 2
    xp = x.reshape(*x.shape[:-1], j, 2)
    wa = len(batch_w)
    wp = w.reshape(*w.shape[:wa], j, 2, *w.shape[wa + 1 :])
    nb = len(batch_x)
    dims = (((xp.ndim - 1,), (wa + 1,)), ((*batch_x, xp.ndim - 2), (*batch_w, wa)))
    pairs = int_dot(xp, wp, dims)  # (*batch, j, rest of x, rest of w)
    return jnp.sum(jnp.clip(pairs, -32768, 32767), axis=nb)


def matmul_acc_u8s8_avx2(a, b, a_zp, b_zp):
    """:func:`matmul_acc` as MLAS's AVX2 u8 x s8 kernels (no VNNI) compute it: the raw stored
    uint8 ``a`` and int8 ``b`` multiplied in consecutive pairs along K, each pair's sum
    saturated to int16 (``vpmaddubsw``), the zero points applied afterwards exactly:
    ``raw - b_zp * sum(a) - a_zp * sum(b) + K * a_zp * b_zp``."""
    _check_matmul(a, b, b_zp)
    k = a.shape[-1]
    a32, b32 = a.astype(jnp.int32), b.astype(jnp.int32)
    raw = _pair_dot_saturated(a32.astype(jnp.int16), b32.astype(jnp.int16), (), ())
    az, bz = jnp.asarray(a_zp, jnp.int32), jnp.asarray(b_zp, jnp.int32)
    return raw - bz * jnp.sum(a32, axis=-1, keepdims=True) - az * jnp.sum(b32, axis=0) + k * az * bz


def conv_acc_u8s8_avx2(x, w, x_zp, w_zp, geom: ConvGeometry, group: int):
    """:func:`conv_acc` as MLAS's AVX2 u8 x s8 GEMM / ConvSym kernels compute it: per group,
    the im2col rows in (kh, kw, c) order (padding holds the raw ``x_zp``) multiplied with the
    raw weights in consecutive pairs, each pair's sum saturated to int16, then the exact
    zero-point terms (as :func:`matmul_acc_u8s8_avx2`). Depthwise convolutions (one input
    and one output channel per group) run MLAS's depthwise kernel, which is exact."""
    _check_conv(x, w, w_zp, geom, group)
    b, c = x.shape[0], x.shape[1]
    o = w.shape[0]
    cg, og = c // group, o // group
    if cg == 1 and og == 1:
        return conv_acc(x, w, x_zp, w_zp, geom, group)
    kh, kw = geom.kernel
    oh, ow = geom.out_hw
    xz = jnp.asarray(x_zp, jnp.int32)
    wz = jnp.asarray(w_zp, jnp.int32).reshape(-1)[0]
    xt = x.astype(jnp.int16).transpose(0, 2, 3, 1)
    patches = extract_patches(xt, geom, pad_value=xz.astype(jnp.int16))
    patches = patches.reshape(b, oh, ow, kh * kw, group, cg).transpose(0, 1, 2, 4, 3, 5)
    patches = patches.reshape(b, oh, ow, group, kh * kw * cg)
    wg = w.astype(jnp.int16).reshape(group, og, cg, kh * kw).transpose(0, 3, 2, 1).reshape(group, kh * kw * cg, og)
    raw = _pair_dot_saturated(patches, wg, (3,), (0,))  # (group, B, OH, OW, og)
    kk = kh * kw * cg
    sum_x = jnp.sum(patches.astype(jnp.int32), axis=-1).transpose(3, 0, 1, 2)[..., None]  # (group, B, OH, OW, 1)
    sum_w = jnp.sum(wg.astype(jnp.int32), axis=1)[:, None, None, None, :]  # (group, 1, 1, 1, og)
    acc = raw - wz * sum_x - xz * sum_w + kk * xz * wz
    return acc.transpose(1, 0, 4, 2, 3).reshape(b, o, oh, ow)
