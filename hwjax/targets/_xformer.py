"""xformer 1.4.2's compile-time decisions and parameter recipes, on the host (NumPy, C double).

What xformer computes when it converts an original int8 model (deployed.md §3), transcribed
so that :class:`hwjax.targets.XS3Compiled` derives the same integers: the choice of output
transform per linear layer (:func:`xformer_transform_choice`: group, channel-wise or the TFLM
op, by xformer's error estimates), the parameters of ``XC_add`` (:func:`xformer_add_params`),
``XC_mean`` (:func:`xformer_mean_scale`), ``XC_lookup`` (:func:`xformer_lut_table`),
``XC_softmax`` (:func:`xformer_softmax_table`, with the C library's ``expf``:
:func:`c_expf`), ``XC_mul`` (:func:`xformer_mul_params`), and which fused activations it
drops (:func:`xformer_drops_activation`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from hwjax.errors import UnsupportedOpError


ERR_THRESHOLD = 0.25  # xformer's --xcore-conv-err-threshold default


VLMUL_SHR = 14


def _frexp_e(v) -> int:
    return int(np.frexp(np.float64(v))[1])


def _c_shl(v: int, amount: int) -> int:
    """lib_nn's ``shl``: ``v * 2**amount`` (wrapping in 64 bits) for amount >= 0, else a
    rounding right shift ``(v + 2**(s-1)) >> s``."""
    if amount >= 0:
        r = (v << amount) & (2**64 - 1)
        return r - 2**64 if r >> 63 else r
    s = -amount
    return (v + (1 << (s - 1))) >> s


def _count_bits(v: int) -> int:
    """Two's-complement width of ``v`` (sign included; 1 for 0 and -1)."""
    return (v if v >= 0 else ~v).bit_length() + 1


def _fits16(v: int) -> bool:
    return _count_bits(v) <= 16


def _rint_ldexp(f: float, e: int) -> int:
    return int(np.rint(np.ldexp(np.float64(f), e)))


def canonical_transform(weights, bias_q, s_in, z_in, s_w, s_out, z_out):
    """lib_nn's canonical per-channel ``(multiplier, bias, accu_min, accu_max)`` after the
    output-clamp back-propagation (:func:`hwjax.xs3.canonical_transform`, xs3.md §4.5
    steps 1–2). NumPy float64 / int arrays."""
    from hwjax.xs3 import canonical_transform

    return canonical_transform(bias_q, weights, s_in, z_in, s_w, s_out, z_out)


def _channelwise_exponents(m, beta, amin, amax) -> tuple[list, list]:
    """``OutputTransformFnInt8_Channelwise::Quantizer::solve_for_constraints``: per-channel
    A (<= 0) and M sharing one B = A + M - 14."""
    gb = 0
    for b in beta:
        if b != 0 and _fits16(_rint_ldexp(b, 15 - _frexp_e(b))):
            gb = max(gb, _frexp_e(b))
    gb = max(15 - gb, 1)
    As, Ms = [], []
    for c in range(m.size):
        lo, hi, mc = int(amin[c]), int(amax[c]), float(m[c])
        accu_bits = max([_frexp_e(v) for v in (hi, lo) if v] or [0])
        if not ((lo or hi) and mc):
            As.append(0)
            Ms.append(gb + VLMUL_SHR)
            continue
        A, M = 15 - accu_bits, 15 - _frexp_e(mc)
        mul_sig = _count_bits(_rint_ldexp(mc, M))
        accu_sig = max(_count_bits(_c_shl(hi, A)), _count_bits(_c_shl(lo, A)))
        trying = True
        while trying:
            trying = False
            hi16, lo16 = _c_shl(hi, A), _c_shl(lo, A)
            if not (_fits16(hi16) and _fits16(lo16)):
                A, accu_sig, trying = A - 1, accu_sig - 1, True
            mul16 = _rint_ldexp(mc, M)
            if not _fits16(mul16):
                M, mul_sig, trying = M - 1, mul_sig - 1, True
            p_hi, p_lo = _c_shl(hi16 * mul16, -VLMUL_SHR), _c_shl(lo16 * mul16, -VLMUL_SHR)
            if not (_fits16(max(p_lo, p_hi)) and _fits16(min(p_lo, p_hi))):
                if A >= 0 or accu_sig > mul_sig:
                    A, accu_sig = A - 1, accu_sig - 1
                else:
                    M, mul_sig = M - 1, mul_sig - 1
                trying = True
        As.append(A)
        Ms.append(M)
    As = [min(a, 0) for a in As]
    gb = min([gb] + [a + mm - VLMUL_SHR for a, mm in zip(As, Ms)])
    for c in range(m.size):
        mul_sig = _count_bits(_rint_ldexp(m[c], Ms[c]))
        accu_sig = max(_count_bits(_c_shl(int(amax[c]), As[c])), _count_bits(_c_shl(int(amin[c]), As[c])))
        while gb < As[c] + Ms[c] - VLMUL_SHR:
            if accu_sig > mul_sig:
                As[c], accu_sig = As[c] - 1, accu_sig - 1
            else:
                Ms[c], mul_sig = Ms[c] - 1, mul_sig - 1
    return As, Ms


def channelwise_params(m, beta, amin, amax) -> dict:
    """xformer's ``otfn_int8_channelwise`` parameters from :func:`canonical_transform`:
    ``shifts = -A_c``, ``multipliers = clip(rint(m 2**M_c))``, ``biases = clip(rint(beta 2**B))``
    (no -1 compensation), ``final_shr = B - 8``."""
    As, Ms = _channelwise_exponents(m, beta, amin, amax)
    B = As[0] + Ms[0] - VLMUL_SHR if As else 8
    clip = lambda v: int(np.clip(v, -(2**15), 2**15 - 1))
    return {
        "shifts": np.array([-a for a in As], np.int32),
        "multipliers": np.array([clip(_rint_ldexp(mc, M)) for mc, M in zip(m, Ms)], np.int32),
        "biases": np.array([clip(_rint_ldexp(b, B)) for b in beta], np.int32),
        "final_shr": np.int32(B - 8),
    }


def _sat(a, bits):  # the error model's own (2**bits-wide) saturation
    return np.clip(a, -(1 << bits), (1 << bits) - 1)


def _shr(v, s, bits=16):
    return _sat((v + (1 << (s - 1))) >> s, bits) if s > 0 else _sat(v << -s, bits)


def channelwise_error(m, beta, amin, amax, qp, stop_above: float | None = None) -> float:
    """lib_nn's high-precision error of a channel-wise transform: the largest, over the
    channels, mean ``|round(accu m + beta) clamped - emulated output|`` over every accumulator
    in the channel's range (its emulation: 64-bit steps with (2**16)-wide saturation).

    With ``stop_above``, returns as soon as one channel's error exceeds it: that channel's
    error, a value above ``stop_above`` and at most the full result (the comparison with a
    threshold is all the caller needs). Channels are visited coarsest first (largest
    ``m * 2**shift``: the most accumulator rounding per output step), which only changes
    how soon such a channel is met, not the result."""
    worst = 0.0
    order = np.argsort(-(np.asarray(m, np.float64) * np.exp2(np.asarray(qp["shifts"], np.float64))), kind="stable")
    for c in order:
        acc = np.arange(int(amin[c]), int(amax[c]) + 1, dtype=np.int64)
        if not acc.size:
            continue
        t = _shr(acc, int(qp["shifts"][c]))
        t = _sat((t * int(qp["multipliers"][c]) + (1 << 13)) >> 14, 16)
        t = _sat(t + int(qp["biases"][c]), 16)
        t = _shr(t, int(qp["final_shr"]))
        t = _sat(_shr(t, 8), 8)
        v = acc.astype(np.float64) * m[c] + beta[c]
        expected = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127)  # C round
        worst = max(worst, float(np.abs(expected - t).sum()) / acc.size)
        if stop_above is not None and worst > stop_above:
            break
    return worst


TRANSFORM_MODES = ("group", "channelwise", "tflm")


_CHOICES: dict = {}


def xformer_transform_choice(weights, bias_q, s_in, z_in, s_w, s_out, z_out, threshold=ERR_THRESHOLD) -> dict:
    """:func:`_transform_choice`, memoised on the arguments' bytes (the channel-wise error
    scans every accumulator of a range and the lowering asks again for each compile)."""
    args = [np.asarray(a) for a in (weights, bias_q, s_in, z_in, s_w, s_out, z_out)]
    key = tuple((a.dtype.str, a.shape, a.tobytes()) for a in args) + (float(threshold),)
    if key not in _CHOICES:
        if len(_CHOICES) > 256:
            _CHOICES.clear()
        _CHOICES[key] = _transform_choice(*args, threshold=threshold)
    return dict(_CHOICES[key])


def _transform_choice(weights, bias_q, s_in, z_in, s_w, s_out, z_out, threshold=ERR_THRESHOLD) -> dict:
    """What xformer does with a linear layer (ConvPatternsTFL ``getOutputTransformParams``):
    the group transform when its estimate ``2**-(final_shr + 7)`` is within ``threshold``;
    else the channel-wise transform when its high-precision error is; else the TFLM op.
    Returns ``mode`` (index into :data:`TRANSFORM_MODES`) and the channel-wise parameters
    (``shifts``, ``multipliers``, ``biases``, ``final_shr``; zeros when unused)."""
    from hwjax.xs3 import solve_exponents

    m, beta, amin, amax = canonical_transform(weights, bias_q, s_in, z_in, s_w, s_out, z_out)
    A, M = solve_exponents(m, beta, amin, amax)
    zeros = np.zeros(m.size, np.int32)
    cw = {"shifts": zeros, "multipliers": zeros, "biases": zeros, "final_shr": np.int32(0)}
    if 2.0 ** -(A + M - VLMUL_SHR - 8 + 7) <= threshold:
        return {"mode": np.int32(0), **cw}
    qp = channelwise_params(m, beta, amin, amax)
    if channelwise_error(m, beta, amin, amax, qp, stop_above=threshold) <= threshold:
        return {"mode": np.int32(1), **qp}
    return {"mode": np.int32(2), **cw}


def xformer_mean_scale(s_in, s_out, count) -> np.float32:
    """``XC_mean``'s ``scale_mul`` as xformer computes it: ``float32(double(s_in) /
    double(s_out) / count)`` (the file's float32 scales widened to double)."""
    return np.float32(np.float64(np.float32(s_in)) / np.float64(np.float32(s_out)) / np.float64(count))


def _c_round(v: float) -> int:
    """C ``round``: half away from zero."""
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def xformer_add_params(s1, z1, s2, z2, s_out, z_out) -> dict:
    """``XC_add``'s ``m1, m2, bias, shift`` as xformer derives them (double arithmetic on
    the float32 scales): ``r_i = s_i / s_out``, ``shift = floor(log2(2**14 / max(r1, r2)))``,
    ``m_i = round(r_i 2**shift)``, ``bias = round((z_out - z1 r1 - z2 r2) 2**shift)`` (C
    ``round``, half away from zero). Returns int32 NumPy scalars."""
    r1 = np.float64(np.float32(s1)) / np.float64(np.float32(s_out))
    r2 = np.float64(np.float32(s2)) / np.float64(np.float32(s_out))
    shift = int(np.floor(np.log2(2.0**14 / max(r1, r2))))
    bias = (float(z_out) - float(z1) * r1 - float(z2) * r2) * 2.0**shift
    return {
        "m1": np.int32(_c_round(r1 * 2.0**shift)),
        "m2": np.int32(_c_round(r2 * 2.0**shift)),
        "bias": np.int32(_c_round(bias)),
        "shift": np.int32(shift),
    }


def _c_exp(v: float) -> float:
    """C's ``exp``: +inf where the result overflows a double (Python raises)."""
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def xformer_lut_table(fn: str, s_in, z_in, s_out, z_out) -> np.ndarray:
    """xformer's ``XC_lookup`` table of a TANH / LOGISTIC / RELU / RELU6 (``getLookupTableI8``):
    for every int8 ``n``, ``v = (n - z_in) * double(s_in)``, ``f = tanh(v)``, ``1 / (1 +
    exp(-v))``, ``max(v, 0)`` or ``min(max(v, 0), 6)`` (C double, here the C library's through
    :mod:`math`), ``t = round(f / double(s_out)) + z_out`` (C ``round``: half away from
    zero) clamped to int8. Returns int32 (256,),
    indexed by the input's byte (``u8(n)``)."""
    f = {
        "tanh": math.tanh,
        "sigmoid": lambda v: 1.0 / (1.0 + _c_exp(-v)),
        "relu": lambda v: max(v, 0.0),
        "relu6": lambda v: min(max(v, 0.0), 6.0),
    }[fn]
    si, so = float(np.float32(s_in)), float(np.float32(s_out))
    out = np.zeros(256, np.int32)
    for n in range(-128, 128):
        out[n & 0xFF] = min(max(_c_round(f((n - int(z_in)) * si) / so) + int(z_out), -128), 127)
    return out


def xformer_drops_activation(fn: str, s_in, z_in, s_out, z_out):
    """Whether XS3Compiled runs an ``activation`` node as the identity: a RELU_N1_TO_1, or a
    RELU6 with output zero point -128, between equal quantisations. That is what xformer
    1.4.2 does with such an activation fused into a CONV_2D / DEPTHWISE_CONV_2D /
    FULLY_CONNECTED / AVERAGE_POOL_2D that it converts to ``XC_conv2d_v2`` (verified on
    tests/data/xformer_act): a fused RELU or RELU6 whose output zero point is not -128
    becomes a separate ``XC_lookup``, any other fused activation is dropped (the output
    transform clamps to the int8 range only). :func:`check_xformer_lowering` refuses a graph
    where this local rule would drop an activation xformer keeps (one that is not fused
    into such an op, or whose op stays a TFLM op), unless its clamp is the identity."""
    if fn not in ("relu6", "relu_n1_to_1"):
        return jnp.asarray(False)
    same = (jnp.asarray(s_in, jnp.float32) == jnp.asarray(s_out, jnp.float32)) & (
        jnp.asarray(z_in, jnp.int32) == jnp.asarray(z_out, jnp.int32)
    )
    return same & (jnp.asarray(z_out, jnp.int32) == -128) if fn == "relu6" else same


_EXPF_N = 32
#: glibc's ``__exp2f_data.tab``: the bits of double(2**(i/32)) minus ``i << 47``
_EXPF_TAB = np.array(
    [
        0x3FF0000000000000,
        0x3FEFD9B0D3158574,
        0x3FEFB5586CF9890F,
        0x3FEF9301D0125B51,
        0x3FEF72B83C7D517B,
        0x3FEF54873168B9AA,
        0x3FEF387A6E756238,
        0x3FEF1E9DF51FDEE1,
        0x3FEF06FE0A31B715,
        0x3FEEF1A7373AA9CB,
        0x3FEEDEA64C123422,
        0x3FEECE086061892D,
        0x3FEEBFDAD5362A27,
        0x3FEEB42B569D4F82,
        0x3FEEAB07DD485429,
        0x3FEEA47EB03A5585,
        0x3FEEA09E667F3BCD,
        0x3FEE9F75E8EC5F74,
        0x3FEEA11473EB0187,
        0x3FEEA589994CCE13,
        0x3FEEACE5422AA0DB,
        0x3FEEB737B0CDC5E5,
        0x3FEEC49182A3F090,
        0x3FEED503B23E255D,
        0x3FEEE89F995AD3AD,
        0x3FEEFF76F2FB5E47,
        0x3FEF199BDD85529C,
        0x3FEF3720DCEF9069,
        0x3FEF5818DCFBA487,
        0x3FEF7C97337B9B5F,
        0x3FEFA4AFA2A490DA,
        0x3FEFD0765B6E4540,
    ],
    np.uint64,
)


def c_expf(x) -> np.ndarray:
    """The C library's ``expf`` as xformer's Linux build calls it: glibc's (>= 2.28; Arm's
    optimized-routines algorithm, error < 0.502 ULP, so not always the correctly rounded
    value): ``k = rint(x 32/ln2)``, ``r = x 32/ln2 - k``, ``2**(k/32)`` from the table,
    ``s (C0 r**3 + C1 r**2 + C2 r + 1)`` in double, rounded to float32. Elementwise on
    float32 values; +inf above 0x1.62e42ep6, 0 below -0x1.9fe368p6."""
    xd = np.asarray(x, np.float32).astype(np.float64)
    c0 = float.fromhex("0x1.c6af84b912394p-5") / _EXPF_N**3
    c1 = float.fromhex("0x1.ebfce50fac4f3p-3") / _EXPF_N**2
    c2 = float.fromhex("0x1.62e42ff0c52d6p-1") / _EXPF_N
    shift = float.fromhex("0x1.8p+52")
    with np.errstate(all="ignore"):  # the special cases are replaced below
        z = float.fromhex("0x1.71547652b82fep+0") * _EXPF_N * np.where(np.isfinite(xd), xd, 0.0)
        kd = z + shift
        ki = kd.view(np.uint64)
        r = z - (kd - shift)
        s = (_EXPF_TAB[ki % np.uint64(_EXPF_N)] + (ki << np.uint64(47))).view(np.float64)
        y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
        out = (y * s).astype(np.float32)
    out = np.where(xd > float.fromhex("0x1.62e42ep6"), np.float32(np.inf), out)
    out = np.where(xd < -float.fromhex("0x1.9fe368p6"), np.float32(0), out)
    return np.where(np.isnan(xd), np.float32(np.nan), out).astype(np.float32)


def xformer_softmax_table(s_in, z_in) -> np.ndarray:
    """``XC_softmax``'s float32 table as xformer computes it (``getExpLookupF32``): entry
    ``i`` is ``expf(float((i - 128 - z_in) * double(s_in)))`` (:func:`c_expf`)."""
    v = (np.arange(256, dtype=np.float64) - 128 - int(z_in)) * float(np.float32(s_in))
    return c_expf(v.astype(np.float32))


def xformer_mul_params(s1, z1, s2, z2, s_out, z_out) -> dict:
    """``XC_mul``'s ``nn_mul_params_t`` as xformer computes it (lib_nn ``mul_boggle`` on the
    file's float32 scales widened to double): ``in_i = -z_i - 1`` (int8), and from
    ``vlashr_shr = -1`` down, the first shift for which ``scalar = round(r 2**(23 + shr))``
    (``r = s1 s2 / s_out``) fits int16 with both extreme products and ``bias =
    round(z_out 2**(8 + shr))`` fits int16 with both sums. Returns int32 NumPy scalars
    (``in1_zero_point``, ``in2_zero_point``, ``bias``, ``scalar``, ``vlashr_shr``)."""

    def i8(v):
        return (int(v) + 128) % 256 - 128

    def i16(v):
        return (int(v) + 32768) % 65536 - 32768

    p1, p2 = i8(-int(z1) - 1), i8(-int(z2) - 1)
    ratio = float(np.float32(s1)) * float(np.float32(s2)) / float(np.float32(s_out))
    acc1, acc2 = (127 - p1) * (127 - p2), (-128 - p1) * (-128 - p2)
    max_accu, min_accu = (max(acc1, acc2) + 1) >> 1, (min(acc1, acc2) + 1) >> 1

    def i32(v):  # int32 arithmetic wraps (x86)
        return (int(v) + 2**31) % 2**32 - 2**31

    shr = -1
    while True:
        s = _c_round(ratio * 2.0 ** (1 + 14 + 8 + shr))
        if not -(2**31) <= s < 2**31:
            s = -(2**31)  # x86's conversion of an out-of-range double: rejected below as not int16
        maxp, minp = i32(max_accu * s + (1 << 13)) >> 14, i32(min_accu * s + (1 << 13)) >> 14
        if i16(s) != s or i16(maxp) != maxp or i16(minp) != minp:
            shr -= 1
            if shr < -64:
                raise UnsupportedOpError("XC_mul: mul_boggle finds no shift")
            continue
        b = _c_round(float(z_out) * 2.0 ** (8 + shr))
        if i16(b) != b or i16(maxp + b) != maxp + b or i16(minp + b) != minp + b:
            shr -= 1
            if shr < -64:
                raise UnsupportedOpError("XC_mul: mul_boggle finds no shift")
            continue
        return {
            "in1_zero_point": np.int32(p1),
            "in2_zero_point": np.int32(p2),
            "bias": np.int32(b),
            "scalar": np.int32(s),
            "vlashr_shr": np.int32(shr),
        }
