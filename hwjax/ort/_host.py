"""Host-side (NumPy) float32 recipes of ONNX Runtime's CPU kernels: output scales and tables.

Every value here is computed from concrete scales and zero points with IEEE float32
operations, each rounded once (NumPy's float32 ``+ - * /`` are correctly rounded), and a
fused multiply-add :func:`fma32` computed exactly. The results are the integer tables and
float32 multipliers that the JAX kernels of :mod:`hwjax.ort._kernels` apply.
"""

from __future__ import annotations

import numpy as np

from hwjax.errors import RangeError

F32 = np.float32

#: output range of each integer type ONNX Runtime's int8 kernels write
TYPE_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}

#: MLAS's logistic constants (lower / upper clip, the odd numerator's and the even
#: denominator's coefficients), Eigen's rational approximation
LOGISTIC_CLIP = (F32(-18.0), F32(18.0))
LOGISTIC_ALPHA = tuple(
    F32(v)
    for v in (
        4.37031012579801e-11,
        1.15627324459942e-07,
        6.08574864600143e-05,
        8.51377133304701e-03,
        2.48287947061529e-01,
    )
)
LOGISTIC_BETA = tuple(
    F32(v)
    for v in (
        6.10247389755681e-13,
        5.76102136993427e-09,
        6.29106785017040e-06,
        1.70198817374094e-03,
        1.16817656904453e-01,
        9.93151921023180e-01,
    )
)


def type_range(dtype: str) -> tuple[int, int]:
    """``(lo, hi)`` of ``dtype`` (``"int8"`` or ``"uint8"``); RangeError naming it otherwise."""
    try:
        return TYPE_RANGES[dtype]
    except KeyError:
        raise RangeError(f"dtype must be one of {tuple(TYPE_RANGES)}, got {dtype!r}") from None


def fma32(a, b, c) -> np.ndarray:
    """``a * b + c`` of float32 arrays rounded once to float32 (nearest, ties to even),
    element-wise with NumPy broadcasting: the C ``fmaf`` of finite operands.

    The product of two float32 values is exact in float64; the float64 sum is rounded to
    odd (its error, from Knuth's two-sum, decides the last bit), and a round-to-odd value
    with at least two more bits than float32 rounds to float32 as the exact sum would.
    """
    a, b, c = (np.asarray(v, F32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))  # two-sum: s + err == p + c exactly
    bits = s.view(np.int64) if s.ndim else np.array(s).view(np.int64)
    even = (bits & 1) == 0
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where((err != 0) & even & np.isfinite(s), np.nextafter(s, toward), s)
    return s.astype(F32)


def output_scale(x_scale, w_scale, y_scale) -> np.ndarray:
    """The requantisation multiplier of the linear kernels: ``f32(f32(x_scale * w_scale) /
    y_scale)`` per weight channel (float32 array shaped like ``w_scale``)."""
    return (F32(x_scale) * np.asarray(w_scale, F32)) / F32(y_scale)


def quantize_linear(x, scale, zero_point, dtype: str) -> np.ndarray:
    """QuantizeLinear of float32 ``x``: ``clip(rint(f32(x / scale)), lo - zp, hi - zp) + zp``
    (true float32 division, ties to even; NaN gives ``lo``, infinities saturate); int32."""
    lo, hi = type_range(dtype)
    zp = np.asarray(zero_point, np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(np.asarray(x, F32) / np.asarray(scale, F32))
    q = np.where(np.isnan(q), lo - zp, q)
    return (np.clip(q, lo - zp, hi - zp) + zp).astype(np.int32)


def dequantize_codes(scale, zero_point, dtype: str) -> np.ndarray:
    """DequantizeLinear of every code of ``dtype`` (256 float32 values, code ``lo`` first):
    ``f32(f32(i - zp) * scale)``."""
    lo, hi = type_range(dtype)
    i = np.arange(lo, hi + 1, dtype=np.int64)
    return (i - int(zero_point)).astype(F32) * F32(scale)


def logistic(v, *, fma: bool = True) -> np.ndarray:
    """MLAS's logistic of float32 ``v`` (``MlasComputeLogistic``): the clipped argument's
    rational approximation ``p(x) / q(x) + 0.5``. ``fma=True``: the FMA3 kernel (every
    Horner step one fused multiply-add; the result clamped below at 0); ``fma=False``: the
    SSE kernel (separate products and sums; clamped to [0, 1])."""
    x = np.clip(np.asarray(v, F32), *LOGISTIC_CLIP).astype(F32)
    x2 = x * x
    a9, a7, a5, a3, a1 = LOGISTIC_ALPHA
    b10, b8, b6, b4, b2, b0 = LOGISTIC_BETA
    if fma:
        step = fma32
    else:

        def step(u, w, c):
            return (np.asarray(u, F32) * np.asarray(w, F32)).astype(F32) + c

    p = step(x2, a9, a7)
    for c in (a5, a3, a1):
        p = step(x2, p, c)
    p = (p * x).astype(F32)
    q = step(x2, b10, b8)
    for c in (b6, b4, b2, b0):
        q = step(x2, q, c)
    r = (p / q).astype(F32) + F32(0.5)
    return np.maximum(F32(0), r) if fma else np.clip(r, F32(0), F32(1))


def lut_table(fn: str, s_in, z_in, in_dtype: str, s_out, z_out, out_dtype: str, *, alpha=0.01, fma=True) -> np.ndarray:
    """The 256-entry table of a QLinear lookup op (``QlinearBuildLookupTable``):
    ``table[i - lo] = QuantizeLinear(fn(f32(s_in * f32(i - z_in))), s_out, z_out)``.

    ``fn``: ``"identity"`` (QLinearConcat's requantisation), ``"sigmoid"`` (MLAS's logistic,
    :func:`logistic` with ``fma``) or ``"leaky_relu"`` (``v`` if ``v >= 0`` else
    ``f32(alpha * v)``). Returns int32 (256,)."""
    v = dequantize_codes(s_in, z_in, in_dtype)
    if fn == "sigmoid":
        v = logistic(v, fma=fma)
    elif fn == "leaky_relu":
        v = np.where(v >= 0, v, F32(alpha) * v).astype(F32)
    elif fn != "identity":
        raise RangeError(f"fn must be 'identity', 'sigmoid' or 'leaky_relu', got {fn!r}")
    return quantize_linear(v, s_out, z_out, out_dtype)


def qlinear_add_table(sa, za, sb, zb, sc, zc, dtype: str, *, swap: bool = False) -> np.ndarray:
    """QLinearAdd's result for every pair of codes, ``table[a - lo, b - lo]`` (int32
    (256, 256)), as MLAS's AVX2 kernel computes it with the zero points folded into one
    float32 constant before rounding:

    ``rA = f32(sA / sC)``, ``rB = f32(sB / sC)``,
    ``F = f32(zC - fma(rA, zA, f32(rB * zB)))``,
    ``y = clip(rint(fma(a, rA, fma(b, rB, F))), lo, hi)`` (``rint`` ties to even; a value
    beyond the int32 range gives ``lo``, as ``cvtps2dq``'s integer indefinite saturates).

    ``swap=True`` (the ONNX first operand is a scalar broadcast): the kernel takes the
    ONNX second operand as its ``a``; the table is still indexed by ONNX ``(a, b)``."""
    lo, hi = type_range(dtype)
    if swap:
        sa, za, sb, zb = sb, zb, sa, za
    ra, rb = F32(F32(sa) / F32(sc)), F32(F32(sb) / F32(sc))
    f = F32(F32(zc) - fma32(ra, F32(za), F32(rb * F32(zb))))
    codes = np.arange(lo, hi + 1).astype(F32)
    g = fma32(codes, rb, f)  # (256,) over the kernel's b
    t = fma32(codes[:, None], ra, g[None, :])  # [kernel a, kernel b]
    y = _cvt_clip(t, lo, hi)
    return np.ascontiguousarray(y.T) if swap else y


def qlinear_mul_table(sa, za, sb, zb, sc, zc, dtype: str) -> np.ndarray:
    """QLinearMul's result for every pair of codes, ``table[a - lo, b - lo]`` (int32
    (256, 256)), as MLAS's ``MlasQLinearMulVectorS16``: ``M = f32(f32(sA * sB) / sC)``,
    ``p = (a - zA)(b - zB)`` exact, ``y = clip(rint(f32(f32(p * M) + zC)), lo, hi)``."""
    lo, hi = type_range(dtype)
    m = F32(F32(F32(sa) * F32(sb)) / F32(sc))
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    p = ((codes[:, None] - int(za)) * (codes[None, :] - int(zb))).astype(F32)
    t = (p * m).astype(F32) + F32(zc)
    return _cvt_clip(t, lo, hi)


def _cvt_clip(t, lo: int, hi: int) -> np.ndarray:
    """``cvtps2dq`` (ties to even; outside the int32 range or NaN: ``INT32_MIN``) of float32
    ``t``, then saturated to ``[lo, hi]`` as the kernels' packs do; int32."""
    t = np.asarray(t, F32)
    ok = np.abs(t) < F32(2.0**31)
    r = np.where(ok, np.rint(np.where(ok, t, 0)), -(2.0**31))
    return np.clip(r, lo, hi).astype(np.int32)


def global_pool_scale(s_in, s_out, count: int) -> np.float32:
    """QLinearGlobalAveragePool's multiplier ``f32(s_in / f32(s_out * f32(count)))``; RangeError
    where MLAS refuses the pool (``count >= 2**24`` or the multiplier outside ``[2**-32, 256)``)."""
    m = F32(F32(s_in) / F32(F32(s_out) * F32(count)))
    if count >= 2**24 or not (2.0**-32 <= m < 256.0):
        raise RangeError(f"global average pool: count {count} / multiplier {m} outside what MLAS accepts")
    return m
