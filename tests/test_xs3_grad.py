"""Float inputs and surrogate gradients of the XS3 instructions and kernels.

Forward: float inputs holding integers give exactly the integer path's values.
Backward: ``jax.grad`` gives the documented surrogate, checked against hand-derived
values (exact equality where every value is exact in float32) or against ``jax.vjp``
of an independent float reference with the cotangent zeroed where the pipeline
clipped (relative check, for float gradients only). The clip masks come from NumPy
re-derivations of the integer pipelines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwjax import xs3

VARIANTS = ("hardware", "host", "v2021")
M32 = 2**31 - 1


def f32(a):
    return jax.device_put(np.asarray(a, np.float32))  # a transfer, not a compiled conversion


def assert_same_ints(y_float, y_int):
    """``y_float`` is a float array holding exactly the integers of ``y_int``."""
    yf = np.asarray(y_float)
    assert np.issubdtype(yf.dtype, np.floating), yf.dtype
    assert np.all(yf == np.floor(yf))
    np.testing.assert_array_equal(yf.astype(np.int64), np.asarray(y_int).astype(np.int64))


def assert_grad_close(got, want):
    """Relative check of a float gradient (sums of products are rounded in float32)."""
    want = np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-30)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6 * scale)


def rshr(v, s):
    """Exact rounding right shift (ties up) of int64 values, s >= 0."""
    v, s = np.asarray(v, np.int64), np.asarray(s, np.int64)
    return np.where(s == 0, v, (v + (np.int64(1) << np.maximum(s - 1, 0))) >> s)


def lane_max(bits):
    return 2 ** (bits - 1) - 1


def grads(fn, *args, g):
    """Gradients of ``sum(fn(*args) * g)`` with respect to every argument (one compiled
    program, not one per operation)."""
    return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * g), argnums=tuple(range(len(args)))))(*args)


def both(mask):
    """The test data reach both sides of the clip mask (else the test could not fail)."""
    assert np.any(mask) and not np.all(mask)


# ------------------------------------------------------------------ instructions


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", [8, 16])
def test_vlsat(mode, variant):
    rng = np.random.default_rng(mode)
    acc = rng.integers(-(2**23), 2**23, 256)
    s = rng.integers(0, 24, 256).astype(np.int32)
    g = rng.integers(-3, 4, 256).astype(np.float32)
    fn = lambda a: xs3.vlsat(a, s, mode=mode, variant=variant)
    assert_same_ints(fn(f32(acc)), fn(acc.astype(np.int32)))
    clipped = np.abs(rshr(acc, s)) > lane_max(mode)
    both(clipped)
    (ga,) = grads(fn, f32(acc), g=g)
    np.testing.assert_array_equal(ga, np.where(clipped, 0, g * 2.0**-s).astype(np.float32))
    (gp,) = grads(lambda a: xs3.vlsat(a, s, mode=mode, variant=variant, saturation_grad="pass"), f32(acc), g=g)
    np.testing.assert_array_equal(gp, (g * 2.0**-s).astype(np.float32))


@pytest.mark.parametrize("mode", [8, 16])
def test_vlashr(mode):
    rng = np.random.default_rng(10 + mode)
    b = mode
    x = rng.integers(-(2 ** (b - 1)), 2 ** (b - 1), 512)
    shr = rng.integers(-(b + 2), b + 3, 512).astype(np.int32)
    g = rng.integers(-3, 4, 512).astype(np.float32)
    fn = lambda v: xs3.vlashr(v, shr, mode=mode)
    assert_same_ints(fn(f32(x)), fn(x.astype(np.int32)))
    e = np.clip(shr, -(b - 1), b - 1)
    exact = np.where(e >= 0, x >> np.maximum(e, 0), x * 2 ** np.maximum(-e, 0))
    clipped = np.abs(exact) > lane_max(b)
    both(clipped)
    (gx,) = grads(fn, f32(x), g=g)
    np.testing.assert_array_equal(gx, np.where(clipped, 0, g * 2.0**-e).astype(np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", [8, 16])
def test_vlmul(mode, variant):
    rng = np.random.default_rng(20 + mode)
    lo, hi = -(2 ** (mode - 1)), 2 ** (mode - 1)
    x, m = rng.integers(lo, hi, 512), rng.integers(lo, hi, 512)
    g = rng.integers(-3, 4, 512).astype(np.float32)
    k = {8: 6, 16: 14}[mode]
    fn = lambda a, b: xs3.vlmul(a, b, mode=mode, variant=variant)
    assert_same_ints(fn(f32(x), f32(m)), fn(x.astype(np.int32), m.astype(np.int32)))
    p = x * m
    exact = (p >> k) if variant == "v2021" else rshr(p, k)
    clipped = np.abs(exact) > lane_max(mode)
    both(clipped)
    gx, gm = grads(fn, f32(x), f32(m), g=g)
    np.testing.assert_array_equal(gx, np.where(clipped, 0, g * m * 2.0**-k).astype(np.float32))
    np.testing.assert_array_equal(gm, np.where(clipped, 0, g * x * 2.0**-k).astype(np.float32))
    # one float operand: the integer one is a constant
    (gx_only,) = grads(lambda a: fn(a, m.astype(np.int32)), f32(x), g=g)
    np.testing.assert_array_equal(gx_only, gx)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("op", ["vladd", "vlsub"])
@pytest.mark.parametrize("mode", [8, 16])
def test_vladd_vlsub(op, mode, variant):
    rng = np.random.default_rng(30 + mode)
    lo, hi = -(2 ** (mode - 1)), 2 ** (mode - 1)
    x, m = rng.integers(lo, hi, 512), rng.integers(lo, hi, 512)
    x[:4], m[:4] = lo, [0, 5, -5, lo]  # the VLSUB MIN quirk
    g = rng.integers(-3, 4, 512).astype(np.float32)
    fn = lambda a, b: getattr(xs3, op)(a, b, mode=mode, variant=variant)
    assert_same_ints(fn(f32(x), f32(m)), fn(x.astype(np.int32), m.astype(np.int32)))
    sign = 1 if op == "vladd" else -1
    clipped = np.abs(m + sign * x) > lane_max(mode)
    both(clipped)
    gx, gm = grads(fn, f32(x), f32(m), g=g)
    np.testing.assert_array_equal(gx, np.where(clipped, 0, sign * g))
    np.testing.assert_array_equal(gm, np.where(clipped, 0, g))


@pytest.mark.parametrize(
    "fn,bits,shift",
    [
        (lambda v: xs3.vdepth8(v, mode=16), 16, 8),
        (lambda v: xs3.vdepth8(v, mode=32), 32, 24),
        (lambda v: xs3.vdepth16(v), 32, 16),
    ],
    ids=["vdepth8_16", "vdepth8_32", "vdepth16"],
)
def test_vdepth(fn, bits, shift):
    rng = np.random.default_rng(bits + shift)
    top = 2 ** (bits - 1)
    band = rng.integers(0, 2 ** (shift + 1), 256)  # lanes near the bounds, where sat acts
    x = np.concatenate([rng.integers(-top, top, 256), top - 1 - band, -top + band])
    if bits == 32:
        x &= ~np.int64(255)  # multiples of 256: exact in float32
    g = rng.integers(-3, 4, x.size).astype(np.float32)
    assert_same_ints(fn(f32(x)), fn(x.astype(np.int32)))
    clipped = np.abs(rshr(x, shift)) > lane_max(8 if shift != 16 else 16)
    both(clipped)
    (gx,) = grads(fn, f32(x), g=g)
    np.testing.assert_array_equal(gx, np.where(clipped, 0, g * 2.0**-shift).astype(np.float32))


@pytest.mark.parametrize("mode", [8, 16])
def test_vlmacc(mode):
    rng = np.random.default_rng(40 + mode)
    lo, hi = -(2 ** min(mode - 1, 9)), 2 ** min(mode - 1, 9)  # results exact in float32
    c, m = rng.integers(lo, hi, 512), rng.integers(lo, hi, 512)
    acc = rng.integers(-(2**23), 2**23, 512)
    fn = lambda a, b, d: xs3.vlmacc(a, b, d, mode=mode)
    assert_same_ints(fn(f32(acc), f32(c), f32(m)), fn(acc.astype(np.int32), c.astype(np.int32), m.astype(np.int32)))
    # near the int32 bounds (values exact in float32) some lanes clip at ±(2**31-1)
    acc = np.where(rng.random(512) < 0.5, acc, np.sign(acc) * (2**31 - 2**7))
    clipped = np.abs(acc + c * m) > M32
    both(clipped)
    g = rng.integers(-3, 4, 512).astype(np.float32)
    ga, gc, gm = grads(fn, f32(acc), f32(c), f32(m), g=g)
    np.testing.assert_array_equal(ga, np.where(clipped, 0, g))
    np.testing.assert_array_equal(gc, np.where(clipped, 0, g * m))
    np.testing.assert_array_equal(gm, np.where(clipped, 0, g * c))


@pytest.mark.parametrize("mode", [8, 16])
def test_vlmaccr(mode):
    rng = np.random.default_rng(50 + mode)
    epv = {8: 32, 16: 16}[mode]
    lo, hi = -(2 ** min(mode - 1, 9)), 2 ** min(mode - 1, 9)  # results exact in float32
    c, m = rng.integers(lo, hi, (64, epv)), rng.integers(lo, hi, (64, epv))
    ring = rng.integers(-(2**23), 2**23, (64, 16))
    fn = lambda r, a, b: xs3.vlmaccr(r, a, b, mode=mode)
    assert_same_ints(fn(f32(ring), f32(c), f32(m)), fn(ring.astype(np.int32), c.astype(np.int32), m.astype(np.int32)))
    s = (c * m).sum(-1)
    ring[:, -1] = np.where(rng.random(64) < 0.5, ring[:, -1], np.sign(s) * (2**31 - 2**7))
    clipped = np.abs(ring[:, -1] + s) > M32
    both(clipped)
    g = rng.integers(-3, 4, (64, 16)).astype(np.float32)
    gr, gc, gm = grads(fn, f32(ring), f32(c), f32(m), g=g)
    g0 = np.where(clipped, 0, g[:, 0])  # the new slot's cotangent
    want_r = np.concatenate([g[:, 1:], g0[:, None]], axis=1)  # ring[i] moves to slot i+1
    np.testing.assert_array_equal(gr, want_r)
    np.testing.assert_array_equal(gc, g0[:, None] * m)
    np.testing.assert_array_equal(gm, g0[:, None] * c)


def test_instruction_grad_jit_vmap_and_float0():
    rng = np.random.default_rng(60)
    x, m = f32(rng.integers(-(2**15), 2**15, (3, 16))), f32(rng.integers(-(2**15), 2**15, (3, 16)))
    s = jnp.asarray(rng.integers(0, 16, (3, 16)), jnp.int32)

    def loss(x, m, s):
        return jnp.sum(xs3.vlsat(xs3.vlmul(x, m, mode=16) * 2**10, s, mode=8) * jnp.arange(16.0))

    per = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(x, m, s)
    for i in range(3):
        want = jax.grad(loss, argnums=(0, 1))(x[i], m[i], s[i])
        for got, w in zip(per, want):
            np.testing.assert_array_equal(got[i], w)
    assert np.any(np.asarray(per[0]) != 0)
    # integer operands get float0 (no) cotangents
    _, vjp = jax.vjp(lambda a, sh: xs3.vlsat(a, sh, mode=16), x, s)
    ga, gs = vjp(jnp.ones_like(x))
    assert gs.dtype == jax.dtypes.float0 and gs.shape == s.shape
    assert ga.dtype == jnp.float32


def test_float_argument_errors():
    with pytest.raises(TypeError, match="shift must be an integer array"):
        xs3.vlsat(f32([1.0]), f32([1.0]), mode=16)
    with pytest.raises(TypeError, match="shr must be an integer array"):
        xs3.vlashr(f32([1.0]), f32(1.0), mode=16)
    with pytest.raises(ValueError, match="x is a float array and must hold integer values"):
        xs3.vlmul(f32([1.5]), 3, mode=16)
    with pytest.raises(ValueError, match=r"vr must lie in \[-128, 127\]"):
        xs3.vladd(f32([200.0]), 3, mode=8)
    with pytest.raises(TypeError, match="8/16-bit mode only"):
        xs3.vlmacc(np.int32(0), f32([1.0]), np.int32(1), mode=32)
    with pytest.raises(TypeError, match="8/16-bit mode only"):
        xs3.vlsat(f32([1.0]), 3, mode=32)
    with pytest.raises(TypeError, match="shifts must be an integer array"):
        xs3.otfn_int8_channelwise(
            f32(np.zeros((2, 4))), f32(np.zeros(4)), np.zeros(4, np.int16), np.zeros(4, np.int16), final_shr=0
        )
    with pytest.raises(ValueError, match="saturation_grad must be one of"):
        xs3.vladd(f32([1.0]), 3, mode=8, saturation_grad="clip")
    bso = xs3.make_bso(*[np.zeros(4, np.int32)] * 6)
    with pytest.raises(TypeError, match="bso must be an integer"):
        xs3.fully_connected_8(f32(np.zeros(8)), np.zeros((4, 8), np.int8), np.asarray(bso, np.float32))
    with pytest.raises(ValueError, match=r"w must lie in \[-128, 127\]"):
        xs3.fully_connected_8(np.zeros(8, np.int8), f32(np.full((4, 8), 130.0)), bso)


# -------------------------------------------------------------- output transforms


def _otfn_ref(acc, mul, bias, e1, e2):
    """The affine function otfn_int8 approximates (independent float reference)."""
    return (acc * 2.0**-e1 * mul / 2**14 + bias) / 2.0 ** (e2 + 8)


def _otfn_mask(steps):
    keys = ("initial_clipped", "mul_clipped", "bias_clipped", "final_clipped", "output_clipped")
    return np.any([np.asarray(steps[k]) for k in keys], axis=0)


def _otfn_data(seed, acc_bits):
    rng = np.random.default_rng(seed)
    acc = rng.integers(-(2**acc_bits), 2**acc_bits, (12, 16))
    mul = rng.integers(-(2**14), 2**14, 16)
    bias = rng.integers(-(2**10), 2**10, 16)
    g = rng.integers(-3, 4, (12, 16)).astype(np.float32)
    return acc, mul, bias, g


@pytest.mark.parametrize(
    "initial_shift,final_shr,variant",
    [(6, -2, "hardware"), (6, -2, "host"), (6, -2, "v2021"), (0, 0, "hardware"), (-3, -1, "host"), (7, 1, "v2021")],
)
def test_otfn_int8(initial_shift, final_shr, variant):
    e1, e2 = max(initial_shift, -15), max(final_shr, -15)
    acc, mul, bias, g = _otfn_data(70 + initial_shift, 16 + e1)  # step 1 clips about half
    kw = dict(initial_shift=initial_shift, final_shr=final_shr, variant=variant)
    ints = (acc.astype(np.int32), mul.astype(np.int16), bias.astype(np.int16))
    assert_same_ints(xs3.otfn_int8(f32(acc), f32(mul), f32(bias), **kw), xs3.otfn_int8(*ints, **kw))
    clipped = _otfn_mask(xs3.otfn_int8_steps(*ints, **kw))
    both(clipped)
    ga, gm, gb = grads(lambda a, m, b: xs3.otfn_int8(a, m, b, **kw), f32(acc), f32(mul), f32(bias), g=g)
    gz = np.where(clipped, 0, g)
    np.testing.assert_array_equal(ga, gz * mul * 2.0 ** -(e1 + e2 + 22))  # exact powers of two
    np.testing.assert_array_equal(gb, gz.sum(0) * 2.0 ** -(e2 + 8))
    want = jax.grad(lambda m: jnp.sum(gz * _otfn_ref(f32(acc), m, f32(bias), e1, e2)))(f32(mul))
    assert_grad_close(gm, want)
    # integer parameters: only acc is differentiated
    (ga_int,) = grads(lambda a: xs3.otfn_int8(a, *ints[1:], **kw), f32(acc), g=g)
    np.testing.assert_array_equal(ga_int, ga)


@pytest.mark.parametrize("return_stats", [False, True])
def test_otfn_forward_without_clip_flags(return_stats):
    """An integer call's forward leaves the clip flags out (S.call drops them): the same
    int8 values; ``return_stats`` still counts them."""
    from hwjax.xs3 import _otfn

    acc, mul, bias, _ = _otfn_data(90, 22)
    args = (acc.astype(np.int32), mul.astype(np.int32), bias.astype(np.int32), 6, -2)
    full = _otfn.int8_forward("hardware", return_stats)(*args)
    lean = _otfn.int8_forward("hardware", return_stats, flags=False)(*args)
    np.testing.assert_array_equal(np.asarray(lean[0]), np.asarray(full[0]))
    assert full[1] is not None and bool(np.asarray(full[1]).any())  # the data clip
    if return_stats:
        assert lean[1] is not None and all(np.array_equal(lean[2][k], full[2][k]) for k in full[2])
    else:
        assert lean[1] is None and _otfn.clip_flags(*args[:3]) is False
    assert _otfn.clip_flags(f32(acc), *args[1:3]) is True


@pytest.mark.parametrize("variant", VARIANTS)
def test_otfn_int8_channelwise(variant):
    rng = np.random.default_rng(80)
    shifts = rng.integers(0, 8, 16)
    acc, mul, bias, g = _otfn_data(81, 16)  # step 1 clips about half
    acc = acc << shifts
    ints = (acc.astype(np.int32), shifts.astype(np.int16), mul.astype(np.int16), bias.astype(np.int16))
    fn = lambda a, m, b: xs3.otfn_int8_channelwise(a, ints[1], m, b, final_shr=1, variant=variant)
    assert_same_ints(fn(f32(acc), f32(mul), f32(bias)), fn(*ints[0:1], *ints[2:]))
    # clip mask: steps 1-5 of §4.1 in exact NumPy, VLSAT16 by the per-channel shift
    r = rshr(acc, shifts)
    t = np.clip(r, -32767, 32767)
    p = (t * mul) >> 14 if variant == "v2021" else rshr(t * mul, 14)  # VLMUL16
    tm = np.clip(p, -32767, 32767)
    tb = np.clip(tm + bias, -32767, 32767)
    q = ((rshr(tb, 1) if variant == "host" else tb >> 1) + 128) >> 8  # VLASHR16 by 1, VDEPTH8
    clipped = (t != r) | (tm != p) | (tb != tm + bias) | (q > 127) | (q < -128)
    both(clipped)
    ga, gm, gb = grads(fn, f32(acc), f32(mul), f32(bias), g=g)
    gz = np.where(clipped, 0, g)
    np.testing.assert_array_equal(ga, gz * mul * 2.0 ** -(shifts + 14 + 1 + 8))
    np.testing.assert_array_equal(gb, gz.sum(0) * 2.0**-9)
    want = jax.grad(lambda m: jnp.sum(gz * _otfn_ref(f32(acc) * 2.0**-shifts, m, f32(bias), 0, 1)))(f32(mul))
    assert_grad_close(gm, want)


# ------------------------------------------------------------------ conv2d (current)


def _real_conv(x, k, pad, pad_value, out_hw, stride=(1, 1)):
    """Exact real NHWC x OHWI convolution with ``pad_value`` padding (float reference)."""
    oh, ow = out_hw
    kh, kw = k.shape[1:3]
    below = (oh - 1) * stride[0] + kh - x.shape[-3] - pad[0]
    right = (ow - 1) * stride[1] + kw - x.shape[-2] - pad[1]
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(pad[0], below), (pad[1], right), (0, 0)], constant_values=pad_value)
    return jax.lax.conv_general_dilated(
        xp, k, stride, "VALID", dimension_numbers=("NHWC", "OHWI", "NHWC"), precision=jax.lax.Precision.HIGHEST
    )


CONV_KW = dict(initial_shift=1, final_shr=0, stride=(2, 1), pad_top_left=(1, 1), pad_value=-5, out_shape=(4, 6))


def _conv_data(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (2, 7, 6, 5))
    k = rng.integers(-128, 128, (4, 3, 3, 5))
    mul = rng.integers(2**12, 2**14, 4) * rng.choice([-1, 1], 4)
    bias = rng.integers(-(2**9), 2**9, 4)
    g = rng.integers(-3, 4, (2, 4, 6, 4)).astype(np.float32)
    return x, k, mul, bias, g


def _conv_ref(x, k, mul, bias):
    acc = _real_conv(x, k, CONV_KW["pad_top_left"], CONV_KW["pad_value"], CONV_KW["out_shape"], CONV_KW["stride"])
    return _otfn_ref(acc, mul, bias, CONV_KW["initial_shift"], CONV_KW["final_shr"])


@pytest.mark.parametrize("saturation_grad", ["zero", "pass"])
def test_conv2d(saturation_grad):
    x, k, mul, bias, g = _conv_data(90)
    y_int, acc = xs3.conv2d(
        x.astype(np.int8),
        k.astype(np.int8),
        mul.astype(np.int16),
        bias.astype(np.int16),
        **CONV_KW,
        return_accumulators=True,
    )
    fn = lambda *a: xs3.conv2d(*a, **CONV_KW, saturation_grad=saturation_grad)
    floats = (f32(x), f32(k), f32(mul), f32(bias))
    assert_same_ints(fn(*floats), y_int)
    steps = xs3.otfn_int8_steps(
        acc,
        mul.astype(np.int16),
        bias.astype(np.int16),
        initial_shift=CONV_KW["initial_shift"],
        final_shr=CONV_KW["final_shr"],
    )
    clipped = _otfn_mask(steps)
    both(clipped)
    gz = g if saturation_grad == "pass" else np.where(clipped, 0, g)
    got = grads(fn, *floats, g=g)
    want = jax.grad(lambda *a: jnp.sum(gz * _conv_ref(*a)), argnums=(0, 1, 2, 3))(*floats)
    for gt, w in zip(got, want):
        assert_grad_close(gt, w)
    # weights only: the integer image is a constant
    (gk,) = grads(
        lambda kk: xs3.conv2d(x.astype(np.int8), kk, mul, bias, **CONV_KW, saturation_grad=saturation_grad), f32(k), g=g
    )
    assert_grad_close(gk, want[1])


def test_conv2d_grad_jit_vmap_and_stats():
    x, k, mul, bias, g = _conv_data(91)

    def loss(xi, kk):  # one (H, W, C) image
        return jnp.sum(xs3.conv2d(xi, kk, mul, bias, **CONV_KW) * jnp.asarray(g[0]))

    per = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None)))(f32(x), f32(k))
    for i in range(2):
        want = jax.grad(loss, argnums=(0, 1))(f32(x[i]), f32(k))
        assert_grad_close(per[0][i], want[0])
        assert_grad_close(per[1][i], want[1])
    # extras of the float path are the integer path's accumulators and stats
    ints = (x.astype(np.int8), k.astype(np.int8), mul, bias)
    yf, accf, sf = xs3.conv2d(f32(x), f32(k), mul, bias, **CONV_KW, return_accumulators=True, return_stats=True)
    yi, acci, si = xs3.conv2d(*ints, **CONV_KW, return_accumulators=True, return_stats=True)
    assert_same_ints(yf, yi)
    np.testing.assert_array_equal(accf, acci)
    assert sf.keys() == si.keys() and all(np.array_equal(sf[key], si[key]) for key in si)


# ---------------------------------------------------------------- legacy kernels


def _bso_np(acc, f, out_bits):
    """§3.2 pipeline (hardware, shifts <= 31) in exact NumPy; returns (y, clipped)."""
    r1 = rshr(acc, f["shift1"])
    v = np.clip(r1, -32767, 32767)
    t = v * f["scale"] + f["offset_scale"] * f["offset"]
    r2 = rshr(t, f["shift2"])
    y = np.clip(r2, -32767, 32767) if out_bits == 16 else np.clip(r2, -128, 127)
    return y, (np.abs(acc) >= M32) | (v != r1) | (y != r2)


def _bso_ref(acc, f):
    """The float affine function of the §3.2 pipeline (independent reference)."""
    v = acc * 2.0 ** -f["shift1"].astype(np.float32)
    return (v * f["scale"] + f["offset_scale"] * f["offset"]) * 2.0 ** -f["shift2"].astype(np.float32)


def _bso_fields(rng, acc, bias, out_bits):
    """BSO fields (with ``bias``, already part of ``acc``) under which every clip of the pipeline acts on
    part of ``acc``: the largest accumulators saturate shift1, about half the outputs
    saturate."""
    c_out = acc.shape[-1]
    f = dict(
        bias=bias,
        shift1=np.full(c_out, max(int(np.abs(acc).max()).bit_length() - 16, 0)),
        scale=rng.integers(2**6, 2**9, c_out) * rng.choice([-1, 1], c_out),
        offset_scale=rng.integers(-4, 5, c_out),
        offset=rng.integers(-500, 500, c_out),
    )
    t = np.clip(rshr(acc, f["shift1"]), -32767, 32767) * f["scale"]
    f["shift2"] = np.full(c_out, int(np.median(np.abs(t))).bit_length() - (7 if out_bits == 8 else 15))
    names = ("bias", "shift1", "scale", "offset_scale", "offset", "shift2")
    return f, xs3.make_bso(*(f[n] for n in names))


GEO = dict(zero_point=-3, window_start=(-1, -1), window_stride=(1, 2), out_shape=(5, 3))


def _legacy_case(name, rng):
    """(kernel, integer operands, real accumulator function, out_bits, C_out)."""
    if name in ("conv2d_deep", "conv2d_shallowin"):
        x, k = rng.integers(-128, 128, (2, 5, 6, 8)), rng.integers(-128, 128, (4, 3, 3, 8))
        return (
            lambda a, b, bso: getattr(xs3, name)(a, b, bso, **GEO),
            (x, k),
            lambda a, b, f: (
                f["bias"] + _real_conv(a, b, (1, 1), GEO["zero_point"], GEO["out_shape"], GEO["window_stride"])
            ),
            8,
            4,
        )
    if name == "conv2d_1x1":
        x, k = rng.integers(-128, 128, (2, 3, 4, 36)), rng.integers(-128, 128, (8, 36))
        return (
            lambda a, b, bso: xs3.conv2d_1x1(a, b, bso),
            (x, k),
            lambda a, b, f: f["bias"] + jnp.matmul(a, b.T, precision="highest"),
            8,
            8,
        )
    if name == "conv2d_depthwise":
        x, k = rng.integers(-128, 128, (2, 5, 6, 8)), rng.integers(-128, 128, (3, 3, 8))

        def real(a, b, f):
            kk = jnp.moveaxis(b, -1, 0)[..., None]  # (C, K_h, K_w, 1)
            xp = jnp.pad(a, [(0, 0), (1, 1), (1, 0), (0, 0)], constant_values=GEO["zero_point"])
            return f["bias"] + jax.lax.conv_general_dilated(
                xp,
                kk,
                GEO["window_stride"],
                "VALID",
                dimension_numbers=("NHWC", "OHWI", "NHWC"),
                feature_group_count=8,
                precision=jax.lax.Precision.HIGHEST,
            )

        return (lambda a, b, bso: xs3.conv2d_depthwise(a, b, bso, **GEO), (x, k), real, 8, 8)
    x, w = rng.integers(-128, 128, (3, 68)), rng.integers(-128, 128, (8, 68))
    real = lambda a, b, f: f["bias"] + jnp.matmul(a, b.T, precision="highest")
    if name == "fully_connected_8":
        return (lambda a, b, bso: xs3.fully_connected_8(a, b, bso), (x, w), real, 8, 8)
    return (lambda a, b, bso: xs3.fully_connected_16(a, b, bso), (x, w), real, 16, 8)


LEGACY = [
    "conv2d_deep",
    "conv2d_shallowin",
    "conv2d_1x1",
    "conv2d_depthwise",
    "fully_connected_8",
    "fully_connected_16",
]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_kernels(name):
    rng = np.random.default_rng(LEGACY.index(name))
    fn, (x, k), real, out_bits, c_out = _legacy_case(name, rng)
    bias = rng.integers(-(2**14), 2**14, c_out)
    acc = np.rint(np.asarray(real(f32(x), f32(k), {"bias": bias}), np.float64)).astype(np.int64)  # < 2**24
    f, bso = _bso_fields(rng, acc, bias, out_bits)
    y_int = fn(x.astype(np.int8), k.astype(np.int8), bso)
    y_np, clipped = _bso_np(acc, f, out_bits)
    np.testing.assert_array_equal(np.asarray(y_int), y_np)  # the mask derivation matches the kernel
    both(clipped)
    assert_same_ints(fn(f32(x), f32(k), bso), y_int)
    g = rng.integers(-3, 4, y_np.shape).astype(np.float32)
    gz = np.where(clipped, 0, g)
    got = grads(lambda a, b: fn(a, b, bso), f32(x), f32(k), g=g)
    want = jax.grad(lambda a, b: jnp.sum(gz * _bso_ref(real(a, b, f), f)), argnums=(0, 1))(f32(x), f32(k))
    for gt, w in zip(got, want):
        assert_grad_close(gt, w)
    (gk,) = grads(lambda b: fn(x.astype(np.int8), b, bso), f32(k), g=g)  # integer input: constant
    assert_grad_close(gk, want[1])


def test_legacy_pass_jit_vmap_and_stats():
    rng = np.random.default_rng(100)
    x, w = rng.integers(-128, 128, (4, 68)), rng.integers(-128, 128, (8, 68))
    bias = rng.integers(-(2**14), 2**14, 8)
    f, bso = _bso_fields(rng, bias + x @ w.T, bias, 8)
    g = rng.integers(-3, 4, (4, 8)).astype(np.float32)
    real = lambda a, b: _bso_ref(f["bias"] + jnp.matmul(a, b.T, precision="highest"), f)
    got = grads(lambda a, b: xs3.fully_connected_8(a, b, bso, saturation_grad="pass"), f32(x), f32(w), g=g)
    want = jax.grad(lambda a, b: jnp.sum(g * real(a, b)), argnums=(0, 1))(f32(x), f32(w))
    for gt, wt in zip(got, want):
        assert_grad_close(gt, wt)

    def loss(xi, ww, gi):
        return jnp.sum(xs3.conv2d_deep(xi, ww, bso, **GEO) * gi)

    xs = f32(rng.integers(-128, 128, (2, 5, 6, 8)))
    kk = f32(rng.integers(-128, 128, (8, 3, 3, 8)))
    gs = f32(rng.integers(-3, 4, (2, 5, 3, 8)))
    per = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None, 0)))(xs, kk, gs)
    for i in range(2):
        want = jax.grad(loss, argnums=(0, 1))(xs[i], kk, gs[i])
        assert_grad_close(per[0][i], want[0])
        assert_grad_close(per[1][i], want[1])
    assert np.any(np.asarray(per[0]) != 0)
    yf, sf = xs3.conv2d_deep(xs, kk, bso, **GEO, return_stats=True)
    yi, si = xs3.conv2d_deep(
        np.asarray(xs).astype(np.int8), np.asarray(kk).astype(np.int8), bso, **GEO, return_stats=True
    )
    assert_same_ints(yf, yi)
    for a, b in zip(sf, si):
        np.testing.assert_array_equal(a, b)
