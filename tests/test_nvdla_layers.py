"""NVDLA INT8 layer kernels (hwjax.nvdla._layers) against plain-Python integer models.

The models below are written from the spec (nvdla.md §0, §5) and the C-model description
in the module docstring (SDP X stage: 33-bit ALU, 49-bit MUL, rounding shift with int32
saturation; Y ALU operand convertor; PDP sum and two reciprocal multiplications), one
element at a time with Python big integers, independently of the JAX code.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwjax.nvdla as nv
from hwjax.nvdla import cvt_unit

I32_MIN, I32_MAX = -(2**31), 2**31 - 1

# ------------------------------------------------------------------ plain-Python models


def py_rhaz(v: int, s: int) -> int:
    """rshift_rhaz (spec §0): (|v| + 2**(s-1)) >> s with v's sign; v for s = 0."""
    if s == 0:
        return v
    q = (abs(v) + (1 << (s - 1))) >> s
    return q if v >= 0 else -q


def py_sat(v: int, bits: int) -> int:
    return min(max(v, -(1 << (bits - 1))), (1 << (bits - 1)) - 1)


def py_sdp_x(v, alu_op=None, alu_shift=0, algo="sum", mul_op=None, mul_shift=0, relu=False) -> int:
    """One X stage: operand sat32(op << s); 33-bit ALU; 49-bit product; sat32(rhaz(., shift)); ReLU."""
    a = v
    if alu_op is not None:
        operand = py_sat(alu_op * 2**alu_shift, 32)
        a = {"sum": v + operand, "max": max(v, operand), "min": min(v, operand)}[algo]
    p = a if mul_op is None else a * mul_op
    t = py_sat(py_rhaz(p, mul_shift), 32)
    return max(t, 0) if relu else t


def py_out_cvt(t, off=0, sc=1, sh=0) -> int:
    return py_sat(py_sat(py_rhaz((t - off) * sc, sh), 17), 8)


def py_sdp_x1(acc, c, r) -> int:
    """The conv SDP program for channel c with registers r (dict)."""
    b = int(r["bias16"][c] if np.ndim(r["bias16"]) else r["bias16"])
    m = int(r["mul16"][c] if np.ndim(r["mul16"]) else r["mul16"])
    t = py_sdp_x(acc, b, r["bias_shift"], "sum", m, r["mul_shift"], r["relu"])
    return py_out_cvt(t, r["out_offset"], r["out_scale"], r["out_shift"])


def py_window(h, w, kh, kw, stride, pads, dil=(1, 1)):
    """Output size and, per output (oy, ox), the (i, j, r, s) taps (r, s may be outside)."""
    (pt, pb), (pl, pr) = pads
    oh = (h + pt + pb - ((kh - 1) * dil[0] + 1)) // stride[0] + 1
    ow = (w + pl + pr - ((kw - 1) * dil[1] + 1)) // stride[1] + 1

    def taps(oy, ox):
        return [
            (i, j, oy * stride[0] - pt + i * dil[0], ox * stride[1] - pl + j * dil[1])
            for i in range(kh)
            for j in range(kw)
        ]

    return oh, ow, taps


def py_conv(x, k, stride, pads, dil, pad_value, trunc, r):
    """x (B, H, W, C) ints, k (O, kh, kw, C): (y, acc) nested lists via exact sums."""
    bsz, h, w, cin = x.shape
    o, kh, kw, _ = k.shape
    oh, ow, taps = py_window(h, w, kh, kw, stride, pads, dil)
    y = np.zeros((bsz, oh, ow, o), np.int64)
    acc = np.zeros_like(y)
    for b in range(bsz):
        for oy in range(oh):
            for ox in range(ow):
                for oc in range(o):
                    s = 0
                    for i, j, rr, cc in taps(oy, ox):
                        for c in range(cin):
                            v = int(x[b, rr, cc, c]) if 0 <= rr < h and 0 <= cc < w else pad_value
                            s += v * int(k[oc, i, j, c])
                    a = py_sat(py_rhaz(s, trunc), 32)
                    acc[b, oy, ox, oc] = a
                    y[b, oy, ox, oc] = py_sdp_x1(a, oc, r)
    return y, acc


def py_depthwise(x, k, stride, pads, dil, pad_value, trunc, r):
    bsz, h, w, cin = x.shape
    kh, kw, _ = k.shape
    oh, ow, taps = py_window(h, w, kh, kw, stride, pads, dil)
    y = np.zeros((bsz, oh, ow, cin), np.int64)
    acc = np.zeros_like(y)
    for b in range(bsz):
        for oy in range(oh):
            for ox in range(ow):
                for c in range(cin):
                    s = 0
                    for i, j, rr, cc in taps(oy, ox):
                        v = int(x[b, rr, cc, c]) if 0 <= rr < h and 0 <= cc < w else pad_value
                        s += v * int(k[i, j, c])
                    a = py_sat(py_rhaz(s, trunc), 32)
                    acc[b, oy, ox, c] = a
                    y[b, oy, ox, c] = py_sdp_x1(a, c, r)
    return y, acc


def py_pool(x, window, stride, pads, method, rw=None, rh=None):
    """PDP: average = wrap8(rhaz(rhaz(S * rw, 16) * rh, 16)) with S the sum over the window's
    elements inside the image; max = maximum over those elements."""
    bsz, h, w, c = x.shape
    kh, kw = window
    oh, ow, taps = py_window(h, w, kh, kw, stride, pads)
    y = np.zeros((bsz, oh, ow, c), np.int64)
    for b in range(bsz):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    vals = [int(x[b, rr, cc, ch]) for _, _, rr, cc in taps(oy, ox) if 0 <= rr < h and 0 <= cc < w]
                    if method == "max":
                        y[b, oy, ox, ch] = max(vals)
                    else:
                        u = py_rhaz(py_rhaz(sum(vals) * rw, 16) * rh, 16)
                        y[b, oy, ox, ch] = ((u + 128) % 256) - 128
    return y


# ------------------------------------------------------------------------- strategies

I32 = st.integers(I32_MIN, I32_MAX)
I16 = st.integers(-(2**15), 2**15 - 1)
SHIFT = st.integers(0, 63)


def int8_data(seed: int, shape, extreme: float = 0.3) -> np.ndarray:
    """Random int8 values with a share of -128/127 (saturating sums and products)."""
    rng = np.random.default_rng(seed)
    v = rng.integers(-128, 128, shape)
    ext = rng.random(shape) < extreme
    return np.where(ext, rng.choice([-128, 127], shape), v).astype(np.int8)


def sdp_regs(channels: int):
    """SDP X1 + output-convertor registers; shifts cover both exact and saturating ranges."""
    return st.fixed_dictionaries(
        {
            "bias16": st.lists(I16, min_size=channels, max_size=channels).map(lambda v: np.array(v, np.int32)),
            "bias_shift": st.one_of(st.integers(0, 20), SHIFT),
            "mul16": st.lists(I16, min_size=channels, max_size=channels).map(lambda v: np.array(v, np.int32)),
            "mul_shift": st.one_of(st.integers(0, 24), SHIFT),
            "relu": st.booleans(),
            "out_offset": st.one_of(st.just(0), I32),
            "out_scale": st.one_of(st.just(1), I16),
            "out_shift": st.one_of(st.just(0), st.integers(0, 20), SHIFT),
        }
    )


_SDP_KEYS = ("bias16", "bias_shift", "mul16", "mul_shift", "out_offset", "out_scale", "out_shift")


def _traced(r):
    return {k: jnp.asarray(r[k], jnp.int32) for k in _SDP_KEYS}


# ----------------------------------------------------------------------- SDP X stage


@functools.lru_cache(maxsize=None)
def _sdp_x_jit(algo, relu, alu, mul):
    def f(v, op, a_sh, m, m_sh):
        return nv.sdp_x(
            v,
            alu_op=op if alu else None,
            alu_shift=a_sh,
            alu_algo=algo,
            mul_op=m if mul else None,
            mul_shift=m_sh,
            relu=relu,
        )

    return jax.jit(f)


@settings(max_examples=50)
@given(
    v=st.lists(I32, min_size=16, max_size=16),
    op=st.lists(I16, min_size=16, max_size=16),
    a_sh=SHIFT,
    m=st.lists(I16, min_size=16, max_size=16),
    m_sh=SHIFT,
    algo=st.sampled_from(nv.ALU_ALGOS),
    relu=st.booleans(),
)
def test_sdp_x_matches_model(v, op, a_sh, m, m_sh, algo, relu):
    got = _sdp_x_jit(algo, relu, True, True)(
        np.array(v, np.int32), np.array(op, np.int32), np.int32(a_sh), np.array(m, np.int32), np.int32(m_sh)
    )
    assert got.dtype == jnp.int32
    want = [py_sdp_x(a, o, a_sh, algo, mm, m_sh, relu) for a, o, mm in zip(v, op, m)]
    assert [int(g) for g in np.asarray(got)] == want


@pytest.mark.parametrize("alu,mul", [(False, True), (True, False), (False, False)])
@given(v=st.lists(I32, min_size=16, max_size=16), op=I16, a_sh=SHIFT, m=I16, m_sh=SHIFT)
@settings(max_examples=25)
def test_sdp_x_bypasses(alu, mul, v, op, a_sh, m, m_sh):
    """Bypassed ALU passes v on; bypassed MUL still runs the rounding shift and saturation."""
    got = _sdp_x_jit("sum", False, alu, mul)(
        np.array(v, np.int32), np.int32(op), np.int32(a_sh), np.int32(m), np.int32(m_sh)
    )
    want = [py_sdp_x(a, op if alu else None, a_sh, "sum", m if mul else None, m_sh) for a in v]
    assert [int(g) for g in np.asarray(got)] == want


def test_sdp_x_alu_result_is_33_bits_before_the_multiplier():
    # acc + (1 << 20) exceeds int32; the C model keeps 33 bits, so halving it does not clip.
    acc, bias16, bias_shift, mul16, mul_shift = I32_MAX, 1, 20, 1, 1
    got = int(nv.sdp_x(np.int32(acc), alu_op=bias16, alu_shift=bias_shift, mul_op=mul16, mul_shift=mul_shift))
    assert got == py_sdp_x(acc, bias16, bias_shift, "sum", mul16, mul_shift)
    assert got != py_rhaz(I32_MAX, 1)  # what saturating the ALU first would give


@functools.lru_cache(maxsize=None)
def _sdp_x1_jit(relu):
    return jax.jit(lambda acc, r: nv.sdp_x1(acc, relu=relu, **r))


@settings(max_examples=40)
@given(acc=st.lists(I32, min_size=8, max_size=8), r=sdp_regs(4))
def test_sdp_x1_matches_model(acc, r):
    a = np.array(acc, np.int32).reshape(2, 4)
    got = _sdp_x1_jit(r["relu"])(a, _traced(r))
    assert got.dtype == jnp.int8
    want = [[py_sdp_x1(int(a[i, c]), c, r) for c in range(4)] for i in range(2)]
    assert np.asarray(got).tolist() == want


# ------------------------------------------------------------------------- convolutions

CONV_CASES = {
    # name: (x shape, kernel shape (O, kh, kw, C), stride, padding, dilation)
    "strided_explicit_pad": ((2, 5, 6, 3), (4, 3, 2, 3), (2, 1), ((1, 0), (1, 1)), (1, 1)),
    "same_dilated": ((1, 6, 5, 2), (4, 2, 3, 2), (1, 2), "SAME", (2, 1)),
}


@functools.lru_cache(maxsize=None)
def _conv_jit(case, relu):
    _, _, stride, padding, dil = CONV_CASES[case]
    return jax.jit(
        lambda x, k, pv, tr, r: nv.conv2d_int8(
            x, k, stride=stride, padding=padding, dilation=dil, pad_value=pv, relu=relu, cacc_truncate=tr, **r
        )
    )


def _pads(x_shape, k_hw, stride, padding, dil):
    from hwjax.core import ConvGeometry

    return ConvGeometry.make(x_shape[1:3], k_hw, stride, padding, dil).padding


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**32 - 1),
    pad_value=st.integers(-128, 127),
    trunc=st.sampled_from([0, 0, 3, 16]),
    r=sdp_regs(4),
)
def test_conv2d_int8_matches_model(case, seed, pad_value, trunc, r):
    xs, ks, stride, padding, dil = CONV_CASES[case]
    x, k = int8_data(seed, xs), int8_data(seed + 1, ks)
    y, acc = _conv_jit(case, r["relu"])(x, k, np.int32(pad_value), np.int32(trunc), _traced(r))
    assert y.dtype == jnp.int8 and acc.dtype == jnp.int32
    want_y, want_acc = py_conv(x, k, stride, _pads(xs, ks[1:3], stride, padding, dil), dil, pad_value, trunc, r)
    np.testing.assert_array_equal(np.asarray(acc), want_acc)
    np.testing.assert_array_equal(np.asarray(y), want_y)


@functools.lru_cache(maxsize=None)
def _dw_jit(relu):
    return jax.jit(
        lambda x, k, pv, tr, r: nv.depthwise_conv2d_int8(
            x, k, stride=(1, 2), padding="SAME", pad_value=pv, relu=relu, cacc_truncate=tr, **r
        )
    )


@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**32 - 1), pad_value=st.integers(-128, 127), trunc=st.sampled_from([0, 0, 5]), r=sdp_regs(4)
)
def test_depthwise_conv2d_int8_matches_model(seed, pad_value, trunc, r):
    x, k = int8_data(seed, (2, 6, 5, 4)), int8_data(seed + 1, (3, 3, 4))
    y, acc = _dw_jit(r["relu"])(x, k, np.int32(pad_value), np.int32(trunc), _traced(r))
    assert y.dtype == jnp.int8
    want_y, want_acc = py_depthwise(
        x, k, (1, 2), _pads((2, 6, 5, 4), (3, 3), (1, 2), "SAME", (1, 1)), (1, 1), pad_value, trunc, r
    )
    np.testing.assert_array_equal(np.asarray(acc), want_acc)
    np.testing.assert_array_equal(np.asarray(y), want_y)


def test_depthwise_equals_conv_with_zero_padded_group_kernel():
    """The compiler's route (squashWeightGroups): a full kernel with zeros off the diagonal."""
    x, k = int8_data(7, (1, 7, 6, 5)), int8_data(8, (3, 2, 5))
    full = np.zeros((5, 3, 2, 5), np.int8)
    for c in range(5):
        full[c, :, :, c] = k[:, :, c]
    r = dict(
        bias16=np.arange(5) * 999 - 2000,
        bias_shift=3,
        mul16=np.arange(5) * 3001 - 7000,
        mul_shift=14,
        relu=True,
        out_offset=-3,
        out_scale=-2,
        out_shift=1,
    )
    dw = nv.depthwise_conv2d_int8(x, k, stride=2, padding=1, pad_value=-7, **r)
    cv = nv.conv2d_int8(x, full, stride=2, padding=1, pad_value=-7, **r)
    for a, b in zip(dw, cv):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------- element-wise add


@jax.jit
def _add_jit(x, y, r):
    return nv.sdp_add_int8(x, y, **r)


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**32 - 1),
    r=st.fixed_dictionaries(
        {
            "x_mul": st.lists(I16, min_size=4, max_size=4).map(lambda v: np.array(v, np.int32)),
            "x_shift": st.one_of(st.integers(0, 16), SHIFT),
            "y_offset": st.one_of(st.integers(-300, 300), I32),
            "y_scale": I16,
            "y_shift": st.one_of(st.integers(0, 16), SHIFT),
            "out_offset": st.one_of(st.just(0), I32),
            "out_scale": I16,
            "out_shift": st.one_of(st.integers(0, 20), SHIFT),
        }
    ),
)
def test_sdp_add_int8_matches_model(seed, r):
    x, y = int8_data(seed, (2, 3, 4)), int8_data(seed + 1, (2, 3, 4))
    got = _add_jit(x, y, {k: jnp.asarray(v, jnp.int32) for k, v in r.items()})
    assert got.dtype == jnp.int8
    want = np.zeros(x.shape, np.int64)
    for idx in np.ndindex(x.shape):
        a = py_sat(py_rhaz(int(x[idx]) * int(r["x_mul"][idx[-1]]), r["x_shift"]), 32)  # X1 MUL
        op = py_sat(py_rhaz((int(y[idx]) - r["y_offset"]) * r["y_scale"], r["y_shift"]), 32)  # EW ALU cvt
        want[idx] = py_out_cvt(py_sat(a + op, 32), r["out_offset"], r["out_scale"], r["out_shift"])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_sdp_add_unit_registers_equal_the_compilers_x1_sum_program():
    """NVIDIA's compiler: X1 per-element ALU SUM (operand = y, shift 0, MUL 1, truncate 0)."""
    x, y = int8_data(3, (4, 5, 8), 0.5), int8_data(4, (4, 5, 8), 0.5)
    cvt_regs = dict(offset=-17, scale=23011, shift=15)
    got = nv.sdp_add_int8(
        x,
        y,
        x_mul=1,
        x_shift=0,
        y_scale=1,
        y_shift=0,
        out_offset=cvt_regs["offset"],
        out_scale=cvt_regs["scale"],
        out_shift=cvt_regs["shift"],
    )
    x1 = nv.sdp_x(x.astype(np.int32), alu_op=y.astype(np.int32), alu_shift=0, mul_op=1, mul_shift=0)
    want = cvt_unit("sdp_out", x1, out_bits=8, **cvt_regs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# ------------------------------------------------------------------------------- PDP

POOL_CASES = {
    # name: (window, stride, padding)
    "2x2_valid": ((2, 2), (2, 2), "VALID"),
    "3x2_overlap": ((3, 2), (2, 1), "VALID"),
    "3x3_pad1": ((3, 3), (2, 2), 1),
    "8x8_s16": ((8, 8), (16, 16), ((0, 0), (0, 0))),
}
POOL_X = (2, 9, 8, 3)


@functools.lru_cache(maxsize=None)
def _avg_jit(case):
    window, stride, padding = POOL_CASES[case]
    return jax.jit(
        lambda x, rw, rh: nv.pdp_avgpool_int8(
            x, window, stride, padding=padding, recip_kernel_width=rw, recip_kernel_height=rh
        )
    )


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@settings(max_examples=15)
@given(
    seed=st.integers(0, 2**32 - 1),
    recips=st.one_of(st.just(None), st.tuples(st.integers(0, 2**17 - 1), st.integers(0, 2**17 - 1))),
)
def test_pdp_avgpool_matches_model(case, seed, recips):
    window, stride, padding = POOL_CASES[case]
    xs = (2, 16, 16, 3) if window == (8, 8) else POOL_X
    x = int8_data(seed, xs, 0.5)
    rw, rh = recips or ((1 << 16) // window[1], (1 << 16) // window[0])
    got = _avg_jit(case)(x, np.int32(rw), np.int32(rh))
    assert got.dtype == jnp.int8
    want = py_pool(x, window, stride, _pads(xs, window, stride, padding, (1, 1)), "avg", rw, rh)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_pdp_avgpool_default_reciprocals_are_the_firmwares():
    assert [nv.pdp_recip_kernel(k) for k in range(1, 9)] == [65536 // k for k in range(1, 9)]
    x = int8_data(11, (1, 7, 7, 4), 0.6)
    got = nv.pdp_avgpool_int8(x, (3, 2), (1, 2), padding=((1, 2), (0, 1)))
    want = py_pool(x, (3, 2), (1, 2), ((1, 2), (0, 1)), "avg", 65536 // 2, 65536 // 3)
    np.testing.assert_array_equal(np.asarray(got), want)
    # with the firmware's reciprocals the average never leaves the input range (no wrap)
    lo = np.full((1, 8, 8, 1), -128, np.int8)
    assert int(nv.pdp_avgpool_int8(lo, 8)[0, 0, 0, 0]) == -128
    assert int(nv.pdp_avgpool_int8(np.full((1, 8, 8, 1), 127, np.int8), 8)[0, 0, 0, 0]) == 127


def test_pdp_avgpool_wraps_like_the_c_model():
    """Reciprocals above 2**16 / k: the C model's int8 cast wraps (no saturation)."""
    x = np.full((1, 2, 2, 1), 100, np.int8)
    got = int(nv.pdp_avgpool_int8(x, 2, recip_kernel_width=2**16, recip_kernel_height=2**16)[0, 0, 0, 0])
    assert got == py_pool(x, (2, 2), (2, 2), ((0, 0), (0, 0)), "avg", 2**16, 2**16)[0, 0, 0, 0] == 400 - 512


@functools.lru_cache(maxsize=None)
def _max_jit(case):
    window, stride, padding = POOL_CASES[case]
    return jax.jit(lambda x: nv.pdp_maxpool_int8(x, window, stride, padding=padding))


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1))
def test_pdp_maxpool_matches_model(case, seed):
    window, stride, padding = POOL_CASES[case]
    xs = (2, 16, 16, 3) if window == (8, 8) else POOL_X
    x = int8_data(seed, xs, 0.5)
    got = _max_jit(case)(x)
    assert got.dtype == jnp.int8
    np.testing.assert_array_equal(
        np.asarray(got), py_pool(x, window, stride, _pads(xs, window, stride, padding, (1, 1)), "max")
    )


# --------------------------------------------------------------- the target's conv today


def _target_conv(x, kernel, bias_q, s_in, s_w, s_out, relu, stride, padding):
    """(y, params) of hwjax.targets.NVDLA's ``conv`` lowering, its parameters built by the
    target's own recipe (the OpImpl's ``params``), jitted as one program."""
    from hwjax.graph import Attrs, Quant, geometry
    from hwjax.targets import NVDLA

    t = NVDLA()
    pads = geometry({"kernel_size": kernel.shape[1:3], "stride": stride, "padding": padding}, x.shape).padding
    attrs = Attrs(
        {
            "features": kernel.shape[0],
            "kernel_size": kernel.shape[1:3],
            "stride": stride,
            "padding": pads,
            "activation": "relu" if relu else None,
        }
    )
    impl = t.lowering("conv")

    def f(x, kernel, bias_q, s_in, s_w, s_out):
        p = impl.params(
            t, attrs, {"kernel": kernel, "bias": bias_q, "w_scale": s_w}, [Quant.of(s_in, 0)], Quant.of(s_out, 0)
        )
        return impl.run(t, attrs, p, x), p

    return jax.jit(f)(x, kernel, bias_q, s_in, s_w, s_out)


@pytest.mark.parametrize("relu", [False, True])
def test_conv2d_int8_equals_the_nvdla_targets_conv(relu):
    rng = np.random.default_rng(5 + relu)
    x, k = int8_data(21 + relu, (3, 8, 7, 6)), int8_data(22, (5, 3, 3, 6))
    bias_q = rng.integers(-(2**17), 2**17, 5).astype(np.int32)
    s_w = jnp.asarray(rng.uniform(0.002, 0.02, 5), jnp.float32)
    s_in, s_out = jnp.float32(0.03), jnp.float32(0.25)
    y_t, p = _target_conv(x, k, bias_q, s_in, s_w, s_out, relu, (2, 1), ((1, 1), (0, 2)))
    y, _ = nv.conv2d_int8(
        x,
        p.kernel,
        stride=(2, 1),
        padding=((1, 1), (0, 2)),
        bias16=p.bias16,
        bias_shift=p.bias_shift,
        mul16=p.mul16,
        mul_shift=p.mul_shift,
        relu=p.relu,
    )
    assert int(p.bias_shift) > 0  # the bias path actually shifts
    np.testing.assert_array_equal(np.asarray(y, np.int32), np.asarray(y_t, np.int32))
    assert len(np.unique(np.asarray(y))) > 20  # not a degenerate, all-saturated output


# ------------------------------------------------------------------- jit / vmap / x64


def test_vmap_over_images_and_registers_matches_loop():
    x = int8_data(31, (3, 5, 5, 2))
    k = int8_data(32, (2, 3, 3, 2))
    shifts = np.array([6, 10, 14], np.int32)

    def f(xi, s):
        return nv.conv2d_int8(
            xi, k, padding="SAME", bias16=np.array([5, -9]), bias_shift=4, mul16=np.array([20000, -31000]), mul_shift=s
        )[0]

    got = jax.vmap(f)(x, shifts)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(f(x[i], int(shifts[i]))))
    pooled = jax.vmap(lambda xi: nv.pdp_avgpool_int8(xi, 2))(x)
    np.testing.assert_array_equal(np.asarray(pooled), np.asarray(nv.pdp_avgpool_int8(x, 2)))
    added = jax.vmap(
        lambda a, b, s: nv.sdp_add_int8(a, b, x_mul=3, x_shift=1, y_scale=-5, y_shift=s, out_scale=7, out_shift=3)
    )(x, x[::-1], shifts)
    for i in range(3):
        want = nv.sdp_add_int8(
            x[i], x[2 - i], x_mul=3, x_shift=1, y_scale=-5, y_shift=int(shifts[i]), out_scale=7, out_shift=3
        )
        np.testing.assert_array_equal(np.asarray(added[i]), np.asarray(want))


def test_identical_with_x64():
    x, k = int8_data(41, (1, 6, 6, 3)), int8_data(42, (2, 2, 2, 3))
    args = dict(
        bias16=np.array([32767, -32768]),
        bias_shift=40,
        mul16=np.array([-3, 12345]),
        mul_shift=45,
        relu=False,
        out_offset=I32_MIN,
        out_scale=-32768,
        out_shift=20,
    )
    base = nv.conv2d_int8(x, k, **args)
    pool = nv.pdp_avgpool_int8(x, 3, 1, recip_kernel_width=99999, recip_kernel_height=77777)
    with jax.enable_x64(True):
        got = nv.conv2d_int8(x, k, **args)
        gpool = nv.pdp_avgpool_int8(x, 3, 1, recip_kernel_width=99999, recip_kernel_height=77777)
    for a, b in zip(base + (pool,), got + (gpool,)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype
    assert not jax.config.jax_enable_x64


# ---------------------------------------------------------------------------- errors


def _conv_args(**kw):
    args = dict(bias16=0, bias_shift=0, mul16=1, mul_shift=0)
    args.update(kw)
    return args


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(bias_shift=64), r"bias_shift.*\[0, 63\]"),
        (dict(mul_shift=-1), r"mul_shift.*\[0, 63\]"),
        (dict(mul16=np.array([1, 40000])), r"mul16.*32767"),
        (dict(bias16=np.array([1, 2, 3])), r"bias16 must be a scalar .* shape \(2,\)"),
        (dict(out_scale=40000), r"out_scale.*32767"),
        (dict(cacc_truncate=17), r"cacc_truncate.*\[0, 16\]"),
        (dict(pad_value=200), r"pad_value"),
    ],
)
def test_conv_register_errors(kw, match):
    x, k = np.zeros((1, 4, 4, 3), np.int8), np.zeros((2, 2, 2, 3), np.int8)
    with pytest.raises(ValueError, match=match):
        nv.conv2d_int8(x, k, **_conv_args(**kw))


def test_input_errors():
    x, k = np.zeros((1, 4, 4, 3), np.int8), np.zeros((2, 2, 2, 3), np.int8)
    with pytest.raises(TypeError, match="x must be an integer array"):
        nv.conv2d_int8(x.astype(np.float32), k, **_conv_args())
    with pytest.raises(ValueError, match=r"x \(int8\) must lie in \[-128, 127\]"):
        nv.conv2d_int8(np.full((1, 4, 4, 3), 300, np.int32), k, **_conv_args())
    with pytest.raises(ValueError, match="same C_in"):
        nv.conv2d_int8(x, np.zeros((2, 2, 2, 4), np.int8), **_conv_args())
    with pytest.raises(ValueError, match="at most 131071"):
        nv.conv2d_int8(np.zeros((1, 1, 1, 131072), np.int8), np.zeros((1, 1, 1, 131072), np.int8), **_conv_args())
    with pytest.raises(ValueError, match="same shape"):
        nv.sdp_add_int8(x, x[..., :2], x_mul=1, x_shift=0, y_scale=1, y_shift=0, out_scale=1, out_shift=0)
    with pytest.raises(ValueError, match=r"y_shift.*\[0, 63\]"):
        nv.sdp_add_int8(x, x, x_mul=1, x_shift=0, y_scale=1, y_shift=64, out_scale=1, out_shift=0)
    with pytest.raises(ValueError, match="alu_algo"):
        nv.sdp_x(np.int32(1), alu_op=1, alu_algo="mul")
    with pytest.raises(TypeError, match="relu"):
        nv.sdp_x1(np.zeros((2,), np.int32), **_conv_args(relu=1))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x: nv.pdp_avgpool_int8(x, 9), r"window height must lie in \[1, 8\]"),
        (lambda x: nv.pdp_maxpool_int8(x, 2, 17), r"stride height must lie in \[1, 16\]"),
        (lambda x: nv.pdp_maxpool_int8(x, 2, padding=2), r"padding top must lie in \[0, 1\]"),
        (lambda x: nv.pdp_avgpool_int8(x, 2, recip_kernel_width=2**17), r"recip_kernel_width.*131071"),
        (lambda x: nv.pdp_recip_kernel(0), r"k \(kernel extent\) must lie in \[1, 8\]"),
    ],
)
def test_pool_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.zeros((1, 12, 12, 2), np.int8))
