"""Legacy lib_nn BSO kernels (spec xs3.md §3, §5, §6): golden calls, an exact model, jit/vmap.

The model below is written from the spec text with exact integers (NumPy int64 / Python
ints; no intermediate value here can exceed 2**50, so int64 is exact). It shares no code
with the kernels or with ``hwjax.xs3._vpu``.
"""

from __future__ import annotations

import functools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax import xs3
from tests.conftest import golden_path

M = 2**31 - 1
VARIANTS = ("hardware", "host", "v2021")
FIELDS = ("bias", "shift1", "scale", "offset_scale", "offset", "shift2")


@functools.lru_cache(maxsize=None)
def _golden_file():
    return json.loads(golden_path("xs3", "old_api_kernels.json").read_text())


def golden(name: str) -> dict:
    return _golden_file()[name]


def arr(case: dict, key: str) -> np.ndarray:
    a = np.asarray(case[key], np.int64)
    return a.reshape(case[key + "_shape"]) if key + "_shape" in case else a


def fields_of(case: dict) -> list[np.ndarray]:
    return [np.asarray(case[f], np.int64) for f in FIELDS]


# ---------------------------------------------------------------------------- model


def sat(x, bits: int):
    m = 2 ** (bits - 1) - 1
    return np.clip(x, -m, m)


def wrap32(x):
    return ((x + 2**31) % 2**32) - 2**31


def model_R(acc, s, variant: str):
    """§2.3 rounding shift R of VLSAT (8/16-bit modes), s the unsigned 16-bit shift."""
    acc, s = np.broadcast_arrays(np.asarray(acc, np.int64), np.asarray(s, np.int64) & 0xFFFF)
    sc = np.clip(s, 1, 31)
    half = np.left_shift(np.int64(1), sc - 1)
    small = (wrap32(acc + half) if variant != "hardware" else acc + half) >> sc
    big = acc >> np.minimum(s, 63)  # hardware for s >= 32 (undefined in host/v2021 models)
    return np.where(s == 0, acc, np.where(s >= 32, big, small))


def model_output(acc, f, variant: str, out_bits: int = 8, symmetric: bool = False):
    """§3.2 pipeline. Returns (y, shift1 clipped, output clipped)."""
    _, shift1, scale, offset_scale, offset, shift2 = f
    r1 = model_R(acc, shift1, variant)
    v = sat(r1, 16)
    t = sat(sat(v * scale, 32) + offset_scale * offset, 32)
    r2 = model_R(t, shift2, variant)
    u = sat(r2, 16)
    y = u if out_bits == 16 else np.clip(u, -127 if symmetric else -128, 127)
    return y, np.abs(r1) > 32767, y != r2


def model_chain(acc0, chunks):
    """acc <- sat32(acc + sum(chunk)) over (xs, ws) chunks; ws (N, n), xs (n,)."""
    acc = np.asarray(acc0, np.int64).copy()
    hit = np.zeros(acc.shape, bool)
    for xs, ws in chunks:
        new = acc + ws.astype(np.int64) @ xs.astype(np.int64)
        hit |= np.abs(new) > M
        acc = np.clip(new, -M, M)
    return acc, hit


def model_conv(X, K, f, zp, start, stride, out_shape, *, shallow=False, once=False):
    """§5.1 (deep) / §5.2 (shallowin) accumulation for one image: (acc, hit) (OH, OW, N)."""
    h, w, c_in = X.shape
    n, kh_, kw_, _ = K.shape
    (r0, c0), (sv, sh), (oh, ow) = start, stride, out_shape
    acc = np.zeros((oh, ow, n), np.int64)
    hit = np.zeros((oh, ow, n), bool)

    def pixel(r, c):
        return X[r, c] if 0 <= r < h and 0 <= c < w else np.full(c_in, zp, np.int64)

    for oy in range(oh):
        rows = [r0 + oy * sv + kh for kh in range(kh_)]
        top = [kh for kh in range(kh_) if rows[kh] < 0]
        bottom = [kh for kh in range(kh_) if rows[kh] >= h]
        seq = top + bottom + [kh for kh in range(kh_) if kh not in top + bottom]
        if once:
            seq = list(range(kh_))
        for ox in range(ow):
            chunks = []
            for kh in seq:
                cols = [c0 + ox * sh + kw for kw in range(kw_)]
                if shallow:
                    chunks.append((np.concatenate([pixel(rows[kh], c) for c in cols]), K[:, kh].reshape(n, -1)))
                    continue
                for kw, c in enumerate(cols):
                    p = pixel(rows[kh], c)
                    for g in range(0, c_in, 32):  # full groups, then the tail
                        chunks.append((p[g : g + 32], K[:, kh, kw, g : g + 32]))
            if once:  # "saturate once at the end": one chunk
                chunks = [(np.concatenate([a for a, _ in chunks]), np.concatenate([b for _, b in chunks], 1))]
            acc[oy, ox], hit[oy, ox] = model_chain(f[0], chunks)
    return acc, hit


def model_stats(hit, s1, out):
    axes = tuple(range(hit.ndim - 1))
    return [np.sum(a, axis=axes) for a in (hit, s1, out)]


def check(got, want_y, want_stats=None):
    if want_stats is None:
        np.testing.assert_array_equal(np.asarray(got), want_y)
        return
    y, stats = got
    np.testing.assert_array_equal(np.asarray(y), want_y)
    assert isinstance(stats, xs3.LegacyStats)
    for g, wv, name in zip(stats, want_stats, stats._fields):
        np.testing.assert_array_equal(np.asarray(g), wv, err_msg=name)


# ------------------------------------------------------------------- random data


def random_bso_fields(rng, n: int, *, big_shifts: bool, extreme_bias: bool):
    bias = rng.integers(-(2**20), 2**20, n)
    if extreme_bias:
        pick = rng.random(n) < 0.5
        near = rng.choice([M, -M, -(2**31), M - 40000, -M + 40000], n)
        bias = np.where(pick, near, bias)
    shift1 = rng.integers(0, 20, n)
    shift2 = rng.integers(10, 27, n)
    if big_shifts:  # hardware only: 32..65535 (e.g. negative int16 shifts)
        shift1 = np.where(rng.random(n) < 0.15, rng.integers(32, 2**16, n), shift1)
        shift2 = np.where(rng.random(n) < 0.15, rng.integers(24, 2**16, n), shift2)
    scale, os_, off = (rng.integers(-(2**15), 2**15, n) for _ in range(3))
    return [bias, shift1, scale, os_, off, shift2]


def saturating_kernel(rng, shape):
    """Kernels whose early rows are strongly positive (or negative) and late rows the
    opposite, per output channel: accumulators hit ±(2**31-1) and come back (§5.8)."""
    k = rng.integers(-128, 128, shape)
    if rng.random() < 0.5:
        return k
    n = shape[0]
    sign = rng.choice([-1, 1], n).reshape((n,) + (1,) * (len(shape) - 1))
    rows = np.where(np.arange(shape[1]) < shape[1] / 2, 1, -1).reshape((1, shape[1]) + (1,) * (len(shape) - 2))
    return (np.abs(k).clip(0, 127) * sign * rows).astype(np.int64)


# ------------------------------------------------------------------------- BSO


@pytest.mark.parametrize("name", ["conv2d_deep", "conv2d_depthwise", "fully_connected_8", "fully_connected_16"])
def test_make_bso_matches_nn_standard_bso_layout(name):
    case = golden(name)
    f = fields_of(case)
    bso = xs3.make_bso(*f)
    assert bso.dtype == jnp.int16
    np.testing.assert_array_equal(np.asarray(bso), arr(case, "BSO"))
    back = xs3.split_bso(arr(case, "BSO").astype(np.int16), len(f[0]))
    for got, want in zip(back, f):
        np.testing.assert_array_equal(np.asarray(got), want)


@settings(max_examples=25)
@given(n=st.sampled_from([1, 5, 16, 17, 40]), seed=st.integers(0, 2**32 - 1))
def test_bso_round_trip_and_layout(n, seed):
    rng = np.random.default_rng(seed)
    lims = [(-(2**31), 2**31), (0, 2**16), (-(2**15), 2**15), (-(2**15), 2**15), (-(2**15), 2**15), (0, 2**16)]
    f = [rng.integers(lo, hi, n) for lo, hi in lims]
    f[0][0] = rng.choice([-(2**31), M, -1, 0x7FFF, -0x8000])
    bso = np.asarray(jax.jit(xs3.make_bso)(*[jnp.asarray(a, jnp.int32) for a in f]))
    assert bso.shape == (-(-n // 16), 7, 16)
    for c in range(n):  # §3.1, channel by channel
        g, i = divmod(c, 16)
        assert int(bso[g, 0, i]) * 65536 + (int(bso[g, 1, i]) & 0xFFFF) == f[0][c]
        for row, field in zip(range(2, 7), f[1:]):
            assert int(bso[g, row, i]) & 0xFFFF == field[c] & 0xFFFF
    assert not bso.reshape(-1, 7 * 16)[-1].reshape(7, 16)[:, (n - 1) % 16 + 1 :].any()
    back = jax.jit(xs3.split_bso, static_argnums=1)(bso, n)
    for got, want in zip(back, f):
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize(
    "field,value",
    [
        ("bias", 2**31),
        ("shift1", -1),
        ("shift1", 2**16),
        ("scale", 2**15),
        ("offset_scale", -(2**15) - 1),
        ("offset", 40000),
        ("shift2", 70000),
    ],
)
def test_make_bso_rejects_out_of_range_fields(field, value):
    f = {k: np.zeros(3, np.int64) for k in FIELDS}
    f[field][1] = value
    with pytest.raises(ValueError, match=field):
        xs3.make_bso(*f.values())


def test_bso_argument_errors():
    z = np.zeros(4, np.int32)
    with pytest.raises(TypeError, match="scale"):
        xs3.make_bso(z, z, z.astype(np.float32), z, z, z)
    with pytest.raises(ValueError, match="same length"):
        xs3.make_bso(z, z, z[:3], z, z, z)
    with pytest.raises(ValueError, match="shape"):
        xs3.split_bso(np.zeros((1, 7, 16), np.int16), 17)
    with pytest.raises(ValueError, match="int16"):
        xs3.split_bso(np.full((1, 7, 16), 40000, np.int32), 16)


# --------------------------------------------------------------- §4.6 derivation


def test_derive_bso_fields_by_hand():
    w = np.array([[1, -2, 3, 4], [5, 5, 5, 5], [0, 0, 0, 1]], np.int8)
    f = xs3.derive_bso_fields(
        np.array([100, -7, 2**31 - 1]),
        w,
        input_scale=0.5,
        input_zero_point=-3,
        weight_scales=np.array([0.006, 1.99999999, 0.0]),
        output_scale=1.0,
        output_zero_point=5,
    )
    # m = 0.003: r0 = 1 - ceil(log2 0.003) = 9, scale = rint(0.003 * 2**23) = 25166, r = 2.
    # m = 0.999999995: r0 = 1, rint(m * 2**15) = 32768 -> 16384, r0 = 0, r = -7.
    # m = 0: r0 = 16, scale 32767, r = 9.
    np.testing.assert_array_equal(f.scale, [25166, 16384, 32767])
    np.testing.assert_array_equal(f.shift1, [2, 0, 9])
    np.testing.assert_array_equal(f.shift2, [21, 14, 21])
    raw = 5 * 2.0 ** np.array([21, 14, 21])
    os_ = np.round(np.sqrt(raw))
    np.testing.assert_array_equal(f.offset_scale, os_)
    np.testing.assert_array_equal(f.offset, np.round(raw / os_))
    # bias - z_in * sum(w), clipped to int32
    np.testing.assert_array_equal(f.bias, [100 + 3 * 6, -7 + 3 * 20, 2**31 - 1])
    bso = xs3.make_bso(*f)
    assert bso.shape == (1, 7, 16)


@settings(max_examples=40)
@given(m=st.floats(1e-7, 60.0), zo=st.integers(-128, 127))
def test_derive_bso_fields_approximate_the_multiplier(m, zo):
    f = xs3.derive_bso_fields(
        np.zeros(1),
        np.zeros((1, 4), np.int8),
        input_scale=m,
        input_zero_point=0,
        weight_scales=1.0,
        output_scale=1.0,
        output_zero_point=zo,
    )
    s = int(f.shift1[0]) + int(f.shift2[0])
    assert 2**14 <= f.scale[0] < 2**15
    assert abs(int(f.scale[0]) - m * 2.0**s) <= 0.5  # scale * 2**-(shift1+shift2) ~ m
    assert f.shift1[0] == 0 or f.shift2[0] == 21
    assert (
        abs(int(f.offset_scale[0]) * int(f.offset[0]) - zo * 2.0 ** int(f.shift2[0]))
        <= abs(int(f.offset_scale[0])) / 2 + 1e-9
    )


def test_derive_bso_fields_errors():
    with pytest.raises(ValueError, match="shift2"):
        xs3.derive_bso_fields(
            np.zeros(1),
            np.zeros((1, 4), np.int8),
            input_scale=2.0**23,
            input_zero_point=0,
            weight_scales=1.0,
            output_scale=1.0,
            output_zero_point=0,
        )
    with pytest.raises(TypeError, match="jit"):
        jax.jit(
            lambda b: xs3.derive_bso_fields(
                b,
                np.zeros((1, 4)),
                input_scale=1.0,
                input_zero_point=0,
                weight_scales=1.0,
                output_scale=1.0,
                output_zero_point=0,
            )
        )(jnp.zeros(1))


# ------------------------------------------------------------------ conv2d_deep


def deep_geometry(case):
    win = case["window"]
    return dict(
        zero_point=case["zero_point"],
        window_start=tuple(win["start"]),
        window_stride=tuple(win["stride"]),
        out_shape=tuple(case["Y_shape"][:2]),
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_conv2d_deep_golden(variant):
    case = golden("conv2d_deep")
    g = deep_geometry(case)
    y, stats = xs3.conv2d_deep(
        arr(case, "X"), arr(case, "K"), arr(case, "BSO").astype(np.int16), **g, variant=variant, return_stats=True
    )
    assert y.dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(y), arr(case, f"Y_{variant}").reshape(case["Y_shape"]))
    sats = np.asarray(stats.acc_saturations)
    assert sats[5] > 0 and sats[22] > 0 and sats[9] == 24  # §5.1 stress channels
    # The order is what makes channels 5 and 22 right: saturating once gives other values.
    f = fields_of(case)
    acc_once, _ = model_conv(
        arr(case, "X"),
        arr(case, "K"),
        f,
        case["zero_point"],
        g["window_start"],
        g["window_stride"],
        g["out_shape"],
        once=True,
    )
    y_once = model_output(acc_once, f, variant)[0]
    differs = np.nonzero((y_once != np.asarray(y)).any(axis=(0, 1)))[0]
    assert {5, 22} <= set(differs.tolist())


@settings(max_examples=12)
@given(seed=st.integers(0, 2**32 - 1), variant=st.sampled_from(VARIANTS))
def test_conv2d_deep_matches_model(seed, variant):
    """Golden geometry (all padding kinds, C_in tail, C_out tail group), random values."""
    case = golden("conv2d_deep")
    g = deep_geometry(case)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, case["X_shape"])
    if rng.random() < 0.5:
        x = np.abs(x).clip(0, 127)
    k = saturating_kernel(rng, case["K_shape"])
    f = random_bso_fields(rng, k.shape[0], big_shifts=variant == "hardware", extreme_bias=True)
    g["zero_point"] = int(rng.integers(-128, 128))
    got = xs3.conv2d_deep(x, k, xs3.make_bso(*f), **g, variant=variant, return_stats=True)
    acc, hit = model_conv(x, k, f, g["zero_point"], g["window_start"], g["window_stride"], g["out_shape"])
    y, s1, out = model_output(acc, f, variant)
    check(got, y, model_stats(hit, s1, out))


def test_conv2d_deep_batched_symmetric_and_other_windows():
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (2, 3, 6, 7, 32))
    k = saturating_kernel(rng, (8, 2, 3, 32))
    f = random_bso_fields(rng, 8, big_shifts=True, extreme_bias=True)
    geo = dict(zero_point=-7, window_start=(1, -2), window_stride=(1, 2), out_shape=(6, 4))
    got = xs3.conv2d_deep(x, k, xs3.make_bso(*f), **geo, symmetric=True, return_stats=True)
    assert got[0].shape == (2, 3, 6, 4, 8)
    accs = [model_conv(img, k, f, -7, (1, -2), (1, 2), (6, 4)) for img in x.reshape(6, 6, 7, 32)]
    acc = np.stack([a for a, _ in accs]).reshape(2, 3, 6, 4, 8)
    hit = np.stack([h for _, h in accs]).reshape(2, 3, 6, 4, 8)
    y, s1, out = model_output(acc, f, "hardware", symmetric=True)
    assert y.min() >= -127
    check(got, y, model_stats(hit, s1, out))


def test_conv2d_shallowin_matches_model():
    rng = np.random.default_rng(3)
    x = np.abs(rng.integers(-128, 128, (6, 7, 8))).clip(0, 127)
    k = saturating_kernel(rng, (12, 3, 4, 8))  # K_w * C_in = 32
    f = random_bso_fields(rng, 12, big_shifts=False, extreme_bias=True)
    geo = dict(zero_point=4, window_start=(-1, -2), window_stride=(2, 1), out_shape=(4, 6))
    got = xs3.conv2d_shallowin(x, k, xs3.make_bso(*f), **geo, return_stats=True)
    acc, hit = model_conv(x, k, f, 4, (-1, -2), (2, 1), (4, 6), shallow=True)
    y, s1, out = model_output(acc, f, "hardware")
    check(got, y, model_stats(hit, s1, out))
    with pytest.raises(ValueError, match="K_w \\* C_in <= 32"):
        xs3.conv2d_shallowin(x, np.zeros((4, 3, 5, 8), np.int8), xs3.make_bso(*[a[:4] for a in f]), **geo)


def test_conv2d_1x1_matches_model():
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (2, 3, 5, 44))
    k = rng.integers(-128, 128, (8, 44))
    f = random_bso_fields(rng, 8, big_shifts=False, extreme_bias=True)
    got = xs3.conv2d_1x1(x, k, xs3.make_bso(*f), variant="host", return_stats=True)
    acc, hit = model_conv(x.reshape(6, 5, 44), k[:, None, None, :], f, 0, (0, 0), (1, 1), (6, 5))
    y, s1, out = model_output(acc, f, "host")
    check(got, y.reshape(2, 3, 5, 8), model_stats(hit, s1, out))


# ------------------------------------------------------------------ depthwise


def model_depthwise(X, K, f, zp, start, stride, out_shape):
    h, w, c = X.shape
    kh_, kw_, _ = K.shape
    (r0, c0), (sv, sh), (oh, ow) = start, stride, out_shape
    acc = np.zeros((oh, ow, c), np.int64)
    hit = np.zeros((oh, ow, c), bool)
    for oy in range(oh):
        for ox in range(ow):
            a = np.asarray(f[0], np.int64).copy()
            for kh in range(kh_):
                for kw in range(kw_):
                    r, col = r0 + oy * sv + kh, c0 + ox * sh + kw
                    px = X[r, col] if 0 <= r < h and 0 <= col < w else np.full(c, zp)
                    new = a + px * K[kh, kw]
                    hit[oy, ox] |= np.abs(new) > M
                    a = np.clip(new, -M, M)
            acc[oy, ox] = a
    return acc, hit


def dw_geometry(case):
    return deep_geometry(case)


def test_conv2d_depthwise_golden():
    case = golden("conv2d_depthwise")
    for variant in VARIANTS:
        y, _ = xs3.conv2d_depthwise(
            arr(case, "X"), arr(case, "K"), arr(case, "BSO"), **dw_geometry(case), variant=variant, return_stats=True
        )
        np.testing.assert_array_equal(np.asarray(y), arr(case, "Y").reshape(case["Y_shape"]))


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1))
def test_conv2d_depthwise_matches_model(seed):
    case = golden("conv2d_depthwise")
    g = dw_geometry(case)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, case["X_shape"])
    k = rng.integers(-128, 128, case["K_shape"])
    f = random_bso_fields(rng, k.shape[-1], big_shifts=True, extreme_bias=True)
    f[0] = np.where(rng.random(len(f[0])) < 0.5, rng.choice([M - 30000, -M + 30000, -(2**31)], len(f[0])), f[0])
    got = xs3.conv2d_depthwise(x, k, xs3.make_bso(*f), **g, return_stats=True)
    acc, hit = model_depthwise(x, k, f, g["zero_point"], g["window_start"], g["window_stride"], g["out_shape"])
    y, s1, out = model_output(acc, f, "hardware")
    check(got, y, model_stats(hit, s1, out))


# ------------------------------------------------------------- fully connected


def model_fc(x, W, f, *, tail_first=True):
    n = W.shape[1]
    t = n % 32 if tail_first else 0
    bounds = ([(0, t)] if t else []) + [(s, min(s + 32, n)) for s in range(t, n, 32)]
    return model_chain(f[0], [(x[a:b], W[:, a:b]) for a, b in bounds])


@pytest.mark.parametrize("name,bits", [("fully_connected_8", 8), ("fully_connected_16", 16)])
def test_fully_connected_golden(name, bits):
    case = golden(name)
    fn = xs3.fully_connected_8 if bits == 8 else xs3.fully_connected_16
    for variant in VARIANTS:
        y, _ = fn(arr(case, "X"), arr(case, "W"), arr(case, "BSO"), variant=variant, return_stats=True)
        assert y.dtype == (jnp.int8 if bits == 8 else jnp.int16)
        np.testing.assert_array_equal(np.asarray(y), arr(case, "Y"))


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), bits=st.sampled_from([8, 16]))
def test_fully_connected_matches_model(seed, bits):
    case = golden(f"fully_connected_{bits}")
    rng = np.random.default_rng(seed)
    w = saturating_kernel(rng, case["W_shape"][::-1]).T  # positive then negative inputs
    x = np.abs(rng.integers(-128, 128, case["C_in"])).clip(0, 127)
    f = random_bso_fields(rng, w.shape[0], big_shifts=True, extreme_bias=True)
    fn = xs3.fully_connected_8 if bits == 8 else xs3.fully_connected_16
    got = fn(x, w, xs3.make_bso(*f), return_stats=True)
    acc, hit = model_fc(x, w, f)
    y, s1, out = model_output(acc, f, "hardware", out_bits=bits)
    check(got, y, model_stats(hit, s1, out))


def test_fully_connected_tail_chunk_goes_first():
    """The N mod 32 tail is accumulated first (§5.5): a case where that order matters."""
    n = 36
    x = np.full(n, 100)
    w = np.zeros((4, n), np.int64)
    w[:, :4] = 127  # tail: +50800, clips at the bound when it comes first
    w[:, 4:] = -20  # -64000
    f = [np.full(4, M - 20000)] + [np.zeros(4, int), np.ones(4, int)] + [np.zeros(4, int)] * 3
    got = xs3.fully_connected_16(x, w, xs3.make_bso(*f), return_stats=True)
    acc, hit = model_fc(x, w, f)
    acc_plain, _ = model_fc(x, w, f, tail_first=False)
    assert (acc != acc_plain).all()
    y, s1, out = model_output(acc, f, "hardware", out_bits=16)
    check(got, y, model_stats(hit[None], s1[None], out[None]))


def model_fc_deepin(x, W, B, shifts, scales, variant, bits):
    acc, hit = model_chain(B, [(x[s : s + 32], W[:, s : s + 32]) for s in range(0, W.shape[1], 32)])
    r = model_R(acc, shifts, variant)
    v = sat(r, 16)
    p = v * scales
    q = (p + 2**13) >> 14
    y = sat(q, 16)
    out = np.abs(q) > 32767
    if bits == 8:
        d = (y + 128) >> 8
        out |= np.abs(d) > 127
        y = sat(d, 8)
    return y, [hit, np.abs(r) > 32767, out]


@pytest.mark.parametrize("bits", [16, 8])
def test_fc_deepin_shallowout_golden_and_model(bits):
    case = golden(f"fc_deepin_shallowout_{bits}")
    fn = xs3.fc_deepin_shallowout_8 if bits == 8 else xs3.fc_deepin_shallowout_16
    args = (arr(case, "X"), arr(case, "W"), arr(case, "B"), arr(case, "shifts"), arr(case, "scales"))
    for variant in VARIANTS:
        y, _ = fn(*args, variant=variant, return_stats=True)
        np.testing.assert_array_equal(np.asarray(y), arr(case, "Y"))
    rng = np.random.default_rng(bits)
    x = np.abs(rng.integers(-128, 128, (5, case["C_in"]))).clip(0, 127)
    w = saturating_kernel(rng, case["W_shape"][::-1]).T
    b = rng.choice([M, -M, M - 30000, -(2**31), 1000], case["C_out"])
    s = rng.integers(0, 18, case["C_out"])
    m = rng.integers(-(2**15), 2**15, case["C_out"])
    m[0] = -(2**15)
    for variant, xi in zip(VARIANTS * 2, x):  # same shapes as the golden call: no recompiles
        y, stats = model_fc_deepin(xi, w, b, s, m, variant, bits)
        check(fn(xi, w, b, s, m, variant=variant, return_stats=True), y, stats)


# -------------------------------------------------------------------- pooling


@pytest.mark.parametrize("name", ["avgpool2d_3x3", "avgpool2d_5x3", "avgpool2d_2x4", "avgpool2d_2x2"])
def test_avgpool2d_golden(name):
    case = golden(name)
    win = case["window"]
    kh, kw = win["shape"]
    assert xs3.avgpool2d_scale_shift(kh * kw) == (case["derived_scale"], case["derived_shift"])
    y = xs3.avgpool2d(
        arr(case, "X"),
        window_shape=(kh, kw),
        window_start=tuple(win["start"]),
        window_stride=tuple(win["stride"]),
        out_shape=tuple(case["Y_shape"][:2]),
    )
    np.testing.assert_array_equal(np.asarray(y), arr(case, "Y").reshape(case["Y_shape"]))


def test_avgpool2d_scale_shift_formula():
    for p in range(1, 200):
        e = int(np.ceil(np.log2(p)))
        want = (1, e) if p == 2**e else (((2**31 // p) + 2 ** (24 - e)) >> (25 - e), e + 6)
        assert xs3.avgpool2d_scale_shift(p) == want
    assert xs3.avgpool2d_scale_shift(9) == (114, 10) and xs3.avgpool2d_scale_shift(15) == (68, 10)


def test_pools_match_model_and_symmetric():
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (2, 7, 8, 12))
    x[0, :3, 1:4] = -128
    y, stats = xs3.avgpool2d(
        x, window_shape=(3, 3), window_start=(0, 1), window_stride=(2, 2), symmetric=True, return_stats=True
    )
    assert y.shape == (2, 3, 3, 12)
    r = np.zeros((2, 3, 3, 12), np.int64)
    for i in range(3):
        for j in range(3):
            s = x[:, 2 * i : 2 * i + 3, 1 + 2 * j : 4 + 2 * j].sum(axis=(1, 2)) * 114
            r[:, i, j] = (s + 2**9) >> 10
    np.testing.assert_array_equal(np.asarray(y), np.clip(r, -127, 127))
    assert int(np.asarray(stats.output_clips).sum()) > 0
    np.testing.assert_array_equal(np.asarray(stats.output_clips), (r < -127).sum(axis=(0, 1, 2)))
    m = xs3.maxpool2d(x, window_shape=(2, 3))
    want = np.zeros((2, 3, 2, 12), np.int64)
    for i in range(3):
        for j in range(2):
            want[:, i, j] = x[:, 2 * i : 2 * i + 2, 3 * j : 3 * j + 3].max(axis=(1, 2))
    np.testing.assert_array_equal(np.asarray(m), want)
    with pytest.raises(ValueError, match="inside"):
        xs3.avgpool2d(x, window_shape=(3, 3), window_start=(-1, 0))


@pytest.mark.parametrize(
    "bias,scale,shift", [(1000, 37, 9), (M - 5000, 127, 3), (-(2**31), -128, 0), (-M + 100000, 127, 40)]
)
def test_avgpool2d_global_matches_model(bias, scale, shift):
    rng = np.random.default_rng(shift)
    x = np.abs(rng.integers(-128, 128, (2, 4, 5, 8))).clip(0, 127)
    x[1] = -x[1]
    y, stats = xs3.avgpool2d_global(x, bias, scale, shift, return_stats=True)
    hits, ys, outs = [], [], []
    for img in x.reshape(2, 20, 8):
        acc, hit = model_chain(np.full(8, bias), [(p, np.diag(np.full(8, scale))) for p in img])
        r = acc if shift == 0 else (acc + 2 ** (shift - 1)) >> shift
        ys.append(np.clip(r, -128, 127))
        outs.append(ys[-1] != r)
        hits.append(hit)
    check((y, stats), np.stack(ys), [np.sum(a, axis=0) for a in (hits, np.zeros((2, 8)), outs)])


# ---------------------------------------------------------------- element-wise


@settings(max_examples=40)
@given(
    shr0=st.integers(-24, 40),
    shr1=st.integers(-24, 40),
    m0=st.integers(-(2**15), 2**15 - 1),
    m1=st.integers(-(2**15), 2**15 - 1),
    bias=st.integers(-(2**31), 2**31 - 1),
    out_shr=st.integers(0, 255),
    sym=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_add_elementwise_matches_model(shr0, shr1, m0, m1, bias, out_shr, sym, seed):
    rng = np.random.default_rng(seed)
    x0, x1 = rng.integers(-128, 128, (2, 3, 16))
    x0[0, :2] = [-128, 127]

    def term(x, s, m):
        return (x >> s if s >= 0 else x * 2 ** (-s)) * m

    want, clips = [], []
    for a, b in zip(x0.ravel().tolist(), x1.ravel().tolist()):
        acc = bias + term(a, shr0, m0) + term(b, shr1, m1)
        r = acc if out_shr == 0 else (acc + (1 << (out_shr - 1))) >> out_shr
        want.append(max(-127 if sym else -128, min(127, r)))
        clips.append(want[-1] != r)
    y, stats = xs3.add_elementwise(
        x0,
        x1,
        shr0=shr0,
        multiplier0=m0,
        shr1=shr1,
        multiplier1=m1,
        bias=bias,
        output_shr=out_shr,
        symmetric=sym,
        return_stats=True,
    )
    np.testing.assert_array_equal(np.asarray(y), np.reshape(want, (3, 16)))
    np.testing.assert_array_equal(np.asarray(stats.output_clips), np.reshape(clips, (3, 16)).sum(0))


def test_requantize_lookup_argmax():
    x = np.arange(-(2**15), 2**15).reshape(256, 256)
    for sym in (False, True):
        y, st_ = xs3.requantize_16_to_8(x, symmetric=sym, return_stats=True)
        want = np.clip((x + 128) // 256, -127 if sym else -128, 127)
        np.testing.assert_array_equal(np.asarray(y), want)
        assert int(np.asarray(st_.output_clips).sum()) == int(((x + 128) // 256 != want).sum())
    assert int(xs3.requantize_16_to_8(np.array([-32641]))[0]) == -128
    assert int(xs3.requantize_16_to_8(np.array([-32640]))[0]) == -127
    lut = np.random.default_rng(0).integers(0, 256, 256)
    v = np.arange(-128, 128)
    out = xs3.lookup8(v, lut)
    assert out.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(out), lut[v & 0xFF])
    np.testing.assert_array_equal(np.asarray(xs3.lookup8(np.arange(256).astype(np.uint8), lut)), lut)
    a = np.array([[3, 9, -2, 9, 9], [-32768, -32768, -32768, -32768, -32768]])
    np.testing.assert_array_equal(np.asarray(xs3.argmax_16(a)), [1, 0])
    with pytest.raises(ValueError, match="N >= 1"):
        xs3.argmax_16(np.zeros((3, 0), np.int16))


# ---------------------------------------------------------------- certification


def test_certify_no_saturation_is_exact_at_the_bound():
    k = np.array([[[[3, -2]]], [[[-128, 127]]]])  # (2, 1, 1, 2)
    lo, hi = -5, 7
    pos = np.array([3 * 7 + 10, 128 * 5 + 127 * 7])
    neg = np.array([-(3 * 5) - 14, -(128 * 7) - 127 * 5])
    for edge, ok in ((M - pos, True), (M - pos + 1, False)):
        np.testing.assert_array_equal(np.asarray(xs3.certify_no_saturation(k, edge, (lo, hi))), ok)
    for edge, ok in ((-M - neg, True), (-M - neg - 1, False)):
        np.testing.assert_array_equal(np.asarray(xs3.certify_no_saturation(k, edge, (lo, hi))), ok)
    assert not bool(xs3.certify_no_saturation(k[:1], np.array([-(2**31)]), (0, 0))[0])
    jitted = jax.jit(xs3.certify_no_saturation, static_argnames=("input_range", "channel_axis"))
    np.testing.assert_array_equal(np.asarray(jitted(k, M - pos, input_range=(lo, hi))), True)
    np.testing.assert_array_equal(np.asarray(jitted(k, M - pos + 1, input_range=(lo, hi))), False)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1))
def test_certified_channels_never_saturate(seed):
    """Certified FC channels never saturate, even on the worst-case inputs."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (8, 68))
    pos = np.where(w > 0, 127 * w, -128 * w).sum(1)
    bias = (M - pos + rng.integers(-3, 3, 8)).clip(-(2**31), M)
    cert = np.asarray(xs3.certify_no_saturation(w, bias, (-128, 127)))
    worst = np.where(w > 0, 127, -128)  # the input attaining the upper bound, per channel
    for c in range(8):
        _, stats = xs3.fully_connected_16(worst[c], w, xs3.make_bso(bias, *[np.zeros(8, int)] * 5), return_stats=True)
        assert cert[c] == (pos[c] + bias[c] <= M)
        if cert[c]:
            assert int(stats.acc_saturations[c]) == 0
    depthwise = xs3.certify_no_saturation(w.T.reshape(4, 17, 8), bias, (-128, 127), channel_axis=-1)
    np.testing.assert_array_equal(np.asarray(depthwise), cert)


# ------------------------------------------------------------------ transforms


def _small_cases():
    rng = np.random.default_rng(11)
    b = 3
    f8 = random_bso_fields(rng, 8, big_shifts=False, extreme_bias=True)
    bso8 = xs3.make_bso(*f8)
    img = rng.integers(-128, 128, (b, 5, 4, 8)).astype(np.int8)
    geo = dict(window_start=(-1, 0), window_stride=(2, 1), out_shape=(3, 4))
    return [
        ("conv2d_deep", lambda x, z: xs3.conv2d_deep(x, rng_k(1, (8, 3, 2, 8)), bso8, zero_point=z, **geo), img),
        (
            "conv2d_shallowin",
            lambda x, z: xs3.conv2d_shallowin(x, rng_k(2, (8, 2, 4, 8)), bso8, zero_point=z, **geo),
            img,
        ),
        ("conv2d_1x1", lambda x, z: xs3.conv2d_1x1(x, rng_k(3, (8, 8)), bso8, variant="host"), img),
        ("conv2d_depthwise", lambda x, z: xs3.conv2d_depthwise(x, rng_k(4, (2, 2, 8)), bso8, zero_point=z, **geo), img),
        (
            "fully_connected_8",
            lambda x, z: xs3.fully_connected_8(x.reshape(-1, 40)[..., :36], rng_k(5, (8, 36)), bso8, symmetric=True),
            img,
        ),
        (
            "fc_deepin_shallowout_8",
            lambda x, z: xs3.fc_deepin_shallowout_8(
                x.reshape(-1, 160)[..., :64], rng_k(6, (5, 64)), f8[0][:5], f8[1][:5] % 20, f8[2][:5]
            ),
            img,
        ),
        ("avgpool2d_global", lambda x, z: xs3.avgpool2d_global(x, 77, -3, z + 128), img),
        ("avgpool2d", lambda x, z: xs3.avgpool2d(x, window_shape=(2, 2)), img),
        (
            "add_elementwise",
            lambda x, z: xs3.add_elementwise(
                x, x[..., ::-1], shr0=-3, multiplier0=z * 9, shr1=1, multiplier1=300, bias=z, output_shr=5
            ),
            img,
        ),
        ("requantize_16_to_8", lambda x, z: xs3.requantize_16_to_8(x.astype(np.int16) * 200), img),
        ("maxpool2d", lambda x, z: xs3.maxpool2d(x, window_shape=(2, 2), window_stride=(1, 1)), img),
        ("lookup8", lambda x, z: xs3.lookup8(x, rng_k(7, (256,)).view(np.uint8)), img),
        ("argmax_16", lambda x, z: xs3.argmax_16(x.astype(np.int16) * z), img),
    ]


def rng_k(seed, shape):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


@pytest.mark.parametrize("name,fn,x", _small_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_jit_of_vmap_equals_batched_call(name, fn, x):
    z = 5
    want = np.asarray(fn(x, z))
    got = jax.jit(jax.vmap(fn, in_axes=(0, None)))(jnp.asarray(x), jnp.asarray(z, jnp.int32))
    np.testing.assert_array_equal(np.asarray(got), want.reshape(np.shape(got)))


def test_results_independent_of_x64():
    case = golden("fully_connected_8")
    with jax.enable_x64(True):
        y = xs3.fully_connected_8(arr(case, "X"), arr(case, "W"), arr(case, "BSO"))
        y16 = xs3.requantize_16_to_8(np.array([-32641, 32639, 5]))
    np.testing.assert_array_equal(np.asarray(y), arr(case, "Y"))
    np.testing.assert_array_equal(np.asarray(y16), [-128, 127, 0])


# ---------------------------------------------------------------------- errors


def test_argument_errors():
    x = np.zeros((4, 4, 8), np.int8)
    k = np.zeros((4, 3, 3, 8), np.int8)
    bso = xs3.make_bso(*[np.zeros(4, np.int32)] * 6)
    geo = dict(zero_point=0, window_start=(-1, -1), window_stride=(1, 1), out_shape=(4, 4))
    with pytest.raises(ValueError, match="x is a float array and must hold integer values"):
        xs3.conv2d_deep(x.astype(np.float32) + 0.5, k, bso, **geo)
    with pytest.raises(ValueError, match="x must lie in \\[-128, 127\\]"):
        xs3.conv2d_deep(x.astype(np.int32) + 200, k, bso, **geo)
    with pytest.raises(ValueError, match="C_in = 8"):
        xs3.conv2d_deep(np.zeros((4, 4, 12), np.int8), k, bso, **geo)
    with pytest.raises(ValueError, match="C_out must be a positive multiple of 4"):
        xs3.conv2d_deep(x, np.zeros((6, 3, 3, 8), np.int8), xs3.make_bso(*[np.zeros(6, int)] * 6), **geo)
    with pytest.raises(ValueError, match="C_in must be a positive multiple of 4"):
        xs3.conv2d_deep(np.zeros((4, 4, 6), np.int8), np.zeros((4, 3, 3, 6), np.int8), bso, **geo)
    with pytest.raises(ValueError, match="zero_point must lie in \\[-128, 127\\]"):
        xs3.conv2d_deep(x, k, bso, **{**geo, "zero_point": 128})
    with pytest.raises(TypeError, match="window_stride"):
        xs3.conv2d_deep(x, k, bso, **{**geo, "window_stride": (1.0, 1)})
    with pytest.raises(ValueError, match="window_stride"):
        xs3.conv2d_deep(x, k, bso, **{**geo, "window_stride": (0, 1)})
    with pytest.raises(ValueError, match="variant"):
        xs3.conv2d_deep(x, k, bso, **geo, variant="chip")
    with pytest.raises(ValueError, match="bso must have shape"):
        xs3.conv2d_deep(x, k, np.zeros((1, 6, 16), np.int16), **geo)
    with pytest.raises(ValueError, match="N \\(C_in\\) must be a positive multiple of 4"):
        xs3.fully_connected_8(np.zeros(10, np.int8), np.zeros((4, 10), np.int8), bso)
    w32 = np.zeros((17, 32), np.int8)
    z17, z4 = np.zeros(17, np.int32), np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="C_out <= 16"):
        xs3.fc_deepin_shallowout_16(np.zeros(32, np.int8), w32, z17, z17, z17)
    with pytest.raises(ValueError, match="shift must lie in \\[0, 65535\\]"):
        xs3.fc_deepin_shallowout_16(np.zeros(32, np.int8), w32[:4], z4, z4 - 1, z4)
    with pytest.raises(TypeError, match="scale must be an integer"):
        xs3.fc_deepin_shallowout_16(np.zeros(32, np.int8), w32[:4], z4, z4, z4.astype(np.float32))
    with pytest.raises(ValueError, match="N \\(C_in\\) must be a positive multiple of 32"):
        xs3.fc_deepin_shallowout_8(np.zeros(36, np.int8), np.zeros((4, 36), np.int8), z4, z4, z4)
    with pytest.raises(ValueError, match="shr0 must lie in \\[-24, 32767\\]"):
        xs3.add_elementwise(x, x, shr0=-25, multiplier0=1, shr1=0, multiplier1=1, bias=0, output_shr=0)
    with pytest.raises(ValueError, match="lut"):
        xs3.lookup8(x, np.zeros(255, np.uint8))
    with pytest.raises(ValueError, match="scale must lie in \\[-128, 127\\]"):
        xs3.avgpool2d_global(x, 0, 200, 0)


def test_host_variant_warns_on_undefined_shifts():
    """VLSAT shifts >= 32 are undefined in the host/v2021 models (§2.3): computed as
    hardware, with a warning when the BSO is concrete."""
    x = np.full((2, 32), 100, np.int8)
    w = np.ones((4, 32), np.int8)
    f = [np.full(4, -(2**20)), np.full(4, 40), np.ones(4, int), np.zeros(4, int), np.zeros(4, int), np.zeros(4, int)]
    with pytest.warns(UserWarning, match="undefined"):
        y = xs3.fully_connected_8(x, w, xs3.make_bso(*f), variant="host")
    np.testing.assert_array_equal(np.asarray(y), np.full((2, 4), -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xs3.fully_connected_8(x, w, xs3.make_bso(*f), variant="hardware")
