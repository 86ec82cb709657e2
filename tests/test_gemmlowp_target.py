"""The gemmlowp target: registry and options, the 8-bit pipeline against a big-int model,
the less-than-8-bit GEMM against hwjax.gemmlowp.gemm_lt8, export/load, jit/vmap, training."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hwjax
import hwjax.gemmlowp as gl
import hwjax.nn as hn
from hwjax import targets as T
from hwjax._export import ExportError
from hwjax.errors import RangeError, UnsupportedOpError
from hwjax.graph import Attrs, Quant
from hwjax.targets._gemmlowp import lt8_always

RNG = np.random.default_rng(2024)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


# ------------------------------------------------------------- big-int reference model


def wrap32(v: int) -> int:
    return ((v + 2**31) % 2**32) - 2**31


def srdhm(a: int, b: int) -> int:
    if a == b == I32_MIN:
        return I32_MAX
    return (a * b + 2**30) >> 31  # floor: ties toward +inf


def rdbpot(x: int, e: int) -> int:
    if e == 0:
        return x
    s = -1 if x < 0 else 1
    return s * ((abs(x) + 2 ** (e - 1)) >> e)  # ties away from zero


def multiplier(s_in, s_w, s_out) -> tuple[int, int]:
    """(m, e) of the float32 scale fl32(fl32(s_in * s_w) / s_out) (NumPy float32 is IEEE)."""
    r = float(np.float32(np.float32(s_in) * np.float32(s_w)) / np.float32(s_out))
    f, e = math.frexp(r)
    m = int(f * 2**31)
    assert m == f * 2**31
    if r == 0 or e < -31:
        return 0, 0
    return m, e


def pipeline(acc: int, bias: int, m: int, e: int, z_out: int, act_min: int) -> int:
    """BiasAddition, ScaleInt32ByFixedPointAndExponent (saturating SHL), Clamp, int8 cast."""
    v = wrap32(acc + bias)
    v = min(max(v * 2 ** max(e, 0), I32_MIN), I32_MAX)
    v = rdbpot(srdhm(v, m), max(-e, 0))
    v = wrap32(v + z_out)
    return min(max(v, act_min, -128), 127)


def rmcf(x: int, n: int, d: int) -> int:
    """RoundingMultiplyByConstantFraction<n, d> (spec §3.10) in Python integers."""
    if n == d:
        return x
    q = (n + d // 2) // d
    rem = n - q * d
    s = (abs(rem) * 2**31 // d) * (1 if rem >= 0 else -1)
    p = x * s
    t = (p + 2**30) // 2**31 if p > 0 else -((2**30 - p) // 2**31)
    return wrap32(x * q + t)


def xorshift_period() -> list[int]:
    x, out = 128, []
    for _ in range(255):
        out.append(x - 1)
        x ^= (x << 7) & 0xFF
        x ^= x >> 5
        x ^= (x << 3) & 0xFF
    return out


def requantize_side(s: np.ndarray, bits: int, mode: str) -> np.ndarray:
    """One packing call of a W x D side (spec §3.5, §3.8 closed form, one depth block)."""
    if bits == 8:
        return s.astype(np.int64)
    w_n, d_n = s.shape
    assert d_n <= 2032  # one l1 depth block
    krd = -(-d_n // 16) * 16
    xs = xorshift_period()
    out = np.zeros(s.shape, np.int64)
    for w in range(w_n):
        for d in range(d_n):
            n = (w // 8) * 8 * krd + (d // 16) * 128 + ((d % 16) // 4) * 32 + ((w % 8) // 4) * 16 + (w % 4) * 4 + d % 4
            o = {"nearest": 127, "xorshift": xs[n % 255], "addmod": (98 + 97 * n) % 255}[mode]
            out[w, d] = (int(s[w, d]) * (2**bits - 1) + o) // 255
    return out


def im2col(x: np.ndarray, kh: int, kw: int, stride, pad, fill: int) -> np.ndarray:
    """(H, W, C) -> (OH*OW, kh*kw*C) with ``fill`` outside the image (NumPy loops)."""
    (pt, pb), (pl, pr) = pad
    xp = np.full((x.shape[0] + pt + pb, x.shape[1] + pl + pr, x.shape[2]), fill, np.int64)
    xp[pt : pt + x.shape[0], pl : pl + x.shape[1]] = x
    oh = (xp.shape[0] - kh) // stride[0] + 1
    ow = (xp.shape[1] - kw) // stride[1] + 1
    rows = [
        xp[oy * stride[0] : oy * stride[0] + kh, ox * stride[1] : ox * stride[1] + kw].reshape(-1)
        for oy in range(oh)
        for ox in range(ow)
    ]
    return np.stack(rows), (oh, ow)


# ------------------------------------------------------------------ random layers


def _layer(op: str, *, o: int, c: int, k: int = 3, seed: int = 0, r_big: bool = False):
    """Random portable parameters and quantisation of one linear layer."""
    rng = np.random.default_rng(seed)
    shape = (o, c) if op == "dense" else (o, k, k, c)
    kernel = rng.integers(-127, 128, shape).astype(np.int8)
    kernel[0].flat[0] = -127  # both extremes present
    kernel[-1].flat[-1] = 127
    bias = rng.integers(-(2**14), 2**14, o).astype(np.int32)
    w_scale = rng.uniform(0.002, 0.02, o).astype(np.float32)
    s_in, z_in = np.float32(rng.uniform(0.01, 0.05)), int(rng.integers(-128, 128))
    s_out = np.float32(rng.uniform(0.05, 0.5) * math.sqrt(kernel[0].size / 27))
    z_out = int(rng.integers(-60, 60))
    if r_big:  # a channel with a scale above 1 (positive exponent) whose shifted accumulator saturates
        w_scale[1] = np.float32(40.0) * s_out / s_in
        bias[1] = 2**29
    portable = {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias), "w_scale": jnp.asarray(w_scale)}
    return portable, (s_in, z_in), (s_out, z_out)


def _lower(target, op, attrs, portable, qi, qo):
    return target.lowering(op).params(target, attrs, portable, [Quant.of(*qi)], Quant.of(*qo))


def _reference_conv(x, portable, qi, qo, attrs, *, relu):
    """Exact int8 conv + pipeline in Python integers."""
    k = np.asarray(portable["kernel"], np.int64)
    o, kh, kw, c = k.shape
    z_in, z_out = qi[1], qo[1]
    mes = [multiplier(qi[0], s, qo[0]) for s in np.asarray(portable["w_scale"])]
    bias = np.asarray(portable["bias"], np.int64)
    act_min = max(z_out, -128) if relu else -128
    out = []
    for xb in np.asarray(x, np.int64):
        cols, (oh, ow) = im2col(xb, kh, kw, attrs["stride"], attrs["padding"], fill=z_in)
        acc = (cols - z_in) @ k.reshape(o, -1).T  # (P, O), exact in int64
        y = [
            [pipeline(wrap32(int(acc[p, ch])), int(bias[ch]), *mes[ch], z_out, act_min) for ch in range(o)]
            for p in range(acc.shape[0])
        ]
        out.append(np.asarray(y).reshape(oh, ow, o))
    return np.stack(out), mes


# ----------------------------------------------------------------------- registry


def test_registry_and_options():
    t = T.get("gemmlowp", lhs_bits=4, rhs_bits=4)
    assert isinstance(t, T.Gemmlowp) and t == T.Gemmlowp(4, 4)
    assert t.describe() == {"name": "gemmlowp", "lhs_bits": 4, "rhs_bits": 4, "rounding": "auto", "requantize": "auto"}
    assert T.resolve(t.describe()) == t and T.resolve("gemmlowp") == T.Gemmlowp(8, 8)
    assert "gemmlowp" in T.available()
    assert T.Gemmlowp(np.int64(3), 2, "xorshift", "always").lhs_bits == 3
    assert t.ops() >= {"conv", "dense", "maxpool", "avgpool", "quantize", "flatten"}
    for kw, match in (
        (dict(lhs_bits=0), r"lhs_bits must lie in \[1, 8\], got 0"),
        (dict(rhs_bits=9), r"rhs_bits must lie in \[1, 8\], got 9"),
        (
            dict(rounding="round"),
            r"rounding must be one of \('auto', 'nearest', 'xorshift', "
            r"'addmod', 'exact'\), got 'round'",
        ),
        (dict(lhs_bits=4, rounding="exact"), "rounding='exact' requires lhs_bits == rhs_bits == 8"),
        (dict(requantize="never"), r"requantize must be one of \('auto', 'always'\)"),
    ):
        with pytest.raises(RangeError, match=match):
            T.Gemmlowp(**kw)
        with pytest.raises(ValueError, match=match):
            T.get("gemmlowp", **kw)
    for bad in (4.0, True, "4"):
        with pytest.raises(TypeError, match=r"lhs_bits must be an int in \[1, 8\]"):
            T.Gemmlowp(lhs_bits=bad)
    with pytest.raises(ValueError, match="does not take the options"):
        T.get("gemmlowp", bits=4)
    assert T.Gemmlowp(8, 8, "exact").rounding == "exact"
    with pytest.raises(UnsupportedOpError, match="cannot run a 'depthwise_conv' op"):
        hn.DepthwiseConv(4, 3, target=t, rngs=nnx.Rngs(0))


# ------------------------------------------------------------- 8 bits: exact int8


def test_eight_bits_is_exact_int8_with_the_tflite_pipeline():
    attrs = Attrs(
        {"features": 6, "kernel_size": (3, 3), "stride": (2, 1), "padding": ((1, 1), (0, 2)), "activation": "relu"}
    )
    portable, qi, qo = _layer("conv", o=6, c=3, seed=1, r_big=True)
    x = RNG.integers(-128, 128, (2, 5, 6, 3)).astype(np.int32)
    want, mes = _reference_conv(x, portable, qi, qo, attrs, relu=True)
    for t in (T.Gemmlowp(), T.Gemmlowp(8, 8, "xorshift", "always")):
        p = _lower(t, "conv", attrs, portable, qi, qo)
        np.testing.assert_array_equal(np.asarray(p.multiplier), [m for m, _ in mes])
        np.testing.assert_array_equal(np.asarray(p.exponent), [e for _, e in mes])
        y = np.asarray(t.lowering("conv").run(t, attrs, p, jnp.asarray(x)))
        np.testing.assert_array_equal(y, want)
    assert mes[1][1] > 0 and (want[..., 1] == 127).all()  # the positive exponent / saturating SHL channel
    assert (want == max(qo[1], -128)).any() and (want == 127).any() and len(np.unique(want)) > 20
    # dense without activation: the clamp is the int8 range
    dattrs = Attrs({"features": 7, "activation": None})
    portable, qi, qo = _layer("dense", o=7, c=20, seed=2)
    x = RNG.integers(-128, 128, (5, 20)).astype(np.int32)
    t = T.Gemmlowp()
    y = np.asarray(t.lowering("dense").run(t, dattrs, _lower(t, "dense", dattrs, portable, qi, qo), jnp.asarray(x)))
    k, b = np.asarray(portable["kernel"], np.int64), np.asarray(portable["bias"], np.int64)
    mes = [multiplier(qi[0], s, qo[0]) for s in np.asarray(portable["w_scale"])]
    acc = (x - qi[1]) @ k.T
    want = [[pipeline(int(acc[i, c]), int(b[c]), *mes[c], qo[1], -128) for c in range(7)] for i in range(5)]
    np.testing.assert_array_equal(y, want)


def test_multiplier_recipe_edges():
    from hwjax.targets._gemmlowp import quantize_multiplier

    r = np.asarray([0.0, 0.3, 1.0, 2.0**-40, 2.0**40, np.float32(0.7).item(), 3.999], np.float32)
    m, e = (np.asarray(a) for a in jax.jit(quantize_multiplier)(r))
    want = [
        (0, 0),
        multiplier(0.3, 1, 1),
        (2**30, 1),
        (0, 0),
        (I32_MAX, 31),
        multiplier(0.7, 1, 1),
        multiplier(3.999, 1, 1),
    ]
    assert list(zip(m.tolist(), e.tolist())) == want


# ------------------------------------------------------- fewer bits: gemm_lt8 itself


def _expected_lt8_conv(x, portable, qi, qo, attrs, *, bits, rounding, relu=False):
    """Per example: NumPy im2col, then hwjax.gemmlowp.gemm_lt8 on the same uint8 operands
    with the pipeline built from independently derived (m, e)."""
    k = np.asarray(portable["kernel"], np.int64)
    o, kh, kw, c = k.shape
    lhs = (k.reshape(o, -1) + 128).astype(np.uint8)
    mes = [multiplier(qi[0], s, qo[0]) for s in np.asarray(portable["w_scale"])]
    stages = (
        gl.BiasAddition(np.asarray(portable["bias"]), shape="col"),
        gl.ScaleInt32ByFixedPointAndExponentPC(
            np.asarray([m for m, _ in mes], np.int32), np.asarray([e for _, e in mes], np.int32), qo[1], shape="col"
        ),
        gl.Clamp(max(qo[1], -128) if relu else -128, 127),
        gl.SaturatingCastToInt8(),
    )
    out = []
    for xb in np.asarray(x, np.int64):
        cols, (oh, ow) = im2col(xb + 128, kh, kw, attrs["stride"], attrs["padding"], fill=qi[1] + 128)
        y = gl.gemm_lt8(
            lhs,
            cols.T.astype(np.uint8),
            lhs_offset=-128,
            rhs_offset=-(qi[1] + 128),
            lhs_bits=bits[0],
            rhs_bits=bits[1],
            rounding=rounding,
            output_stages=stages,
        )
        out.append(np.asarray(y, np.int32).T.reshape(oh, ow, o))
    return np.stack(out)


@pytest.mark.parametrize("rounding,depth_c,k", [("auto", 4, 3), ("xorshift", 4, 3), ("addmod", 4, 3), ("auto", 400, 1)])
def test_fewer_bits_equal_gemm_lt8_on_the_same_operands(rounding, depth_c, k):
    """64 output channels x 256 pixels: gemmlowp requantizes (2*64*256 >= 100*(64+256)).
    Depth 400 with "auto" is gemmlowp's ProbabilisticAddmod mode (depth >= 384)."""
    o = 64
    attrs = Attrs(
        {
            "features": o,
            "kernel_size": (k, k),
            "stride": (1, 1),
            "padding": ((k // 2, k // 2), (k // 2, k // 2)),
            "activation": None,
        }
    )
    portable, qi, qo = _layer("conv", o=o, c=depth_c, k=k, seed=3)
    x = RNG.integers(-128, 128, (2, 16, 16, depth_c)).astype(np.int32)
    bits = (5, 3) if k == 1 else (4, 4)
    assert gl.is_requantization_worth_it(o, 256)
    want = _expected_lt8_conv(x, portable, qi, qo, attrs, bits=bits, rounding=rounding)
    eight = None
    for requantize in ("auto", "always"):
        t = T.Gemmlowp(*bits, rounding, requantize)
        p = _lower(t, "conv", attrs, portable, qi, qo)
        y = np.asarray(jax.jit(lambda v, p: t.lowering("conv").run(t, attrs, p, v))(jnp.asarray(x), p))
        np.testing.assert_array_equal(y, want)
        t8 = T.Gemmlowp()
        eight = np.asarray(
            t8.lowering("conv").run(t8, attrs, _lower(t8, "conv", attrs, portable, qi, qo), jnp.asarray(x))
        )
    assert np.mean(y != eight) > 0.2  # the requantized arithmetic really differs from 8-bit
    if rounding != "auto":
        nearest = _expected_lt8_conv(x, portable, qi, qo, attrs, bits=bits, rounding="nearest")
        assert np.mean(want != nearest) > 0.05  # the probabilistic offsets matter


def test_lt8_always_equals_gemm_lt8_where_gemmlowp_requantizes():
    lhs = RNG.integers(0, 256, (100, 40)).astype(np.uint8)
    rhs = RNG.integers(0, 256, (40, 104)).astype(np.uint8)
    for rounding, bits in (("xorshift", (3, 6)), ("addmod", (7, 5)), ("nearest", (2, 8))):
        kw = dict(lhs_offset=-121, rhs_offset=-37, lhs_bits=bits[0], rhs_bits=bits[1], rounding=rounding)
        np.testing.assert_array_equal(np.asarray(lt8_always(lhs, rhs, **kw)), np.asarray(gl.gemm_lt8(lhs, rhs, **kw)))


@pytest.fixture(scope="module")
def dense_case():
    attrs = Attrs({"features": 10, "activation": "relu"})
    portable, qi, qo = _layer("dense", o=10, c=40, seed=4)
    x = RNG.integers(-128, 128, (3, 40)).astype(np.int32)
    return attrs, portable, qi, qo, x


def _run(t, op, attrs, portable, qi, qo, x):
    return np.asarray(t.lowering(op).run(t, attrs, _lower(t, op, attrs, portable, qi, qo), jnp.asarray(x)))


def test_gemv_falls_back_to_eight_bits_like_gemmlowp(dense_case):
    """A GEMV is never worth requantizing: gemm_lt8 (and requantize="auto") run 8-bit."""
    attrs, portable, qi, qo, x = dense_case
    assert not gl.is_requantization_worth_it(10, 1)
    y = _run(T.Gemmlowp(2, 3, "xorshift"), "dense", attrs, portable, qi, qo, x)
    np.testing.assert_array_equal(y, _run(T.Gemmlowp(), "dense", attrs, portable, qi, qo, x))


def test_requantize_always_is_the_lt8_arithmetic_on_a_gemv(dense_case):
    """requantize="always" on a GEMV, against a Python big-int model of spec §3.5-§3.10
    (requantization offsets from the generators and the packing closed form)."""
    attrs, portable, qi, qo, x = dense_case
    k = np.asarray(portable["kernel"], np.int64)
    b = np.asarray(portable["bias"], np.int64)
    mes = [multiplier(qi[0], s, qo[0]) for s in np.asarray(portable["w_scale"])]
    lo, ro, depth = -128, -(qi[1] + 128), k.shape[1]
    for bits, mode in (((4, 4), "nearest"), ((3, 5), "xorshift"), ((6, 2), "addmod")):
        y = _run(T.Gemmlowp(*bits, mode, "always"), "dense", attrs, portable, qi, qo, x)
        ml, mr = 2 ** bits[0] - 1, 2 ** bits[1] - 1
        pl = requantize_side(k + 128, bits[0], mode)  # one packing call, W = 10 rows
        want = []
        for xi in x:
            pr = requantize_side((xi.astype(np.int64) + 128)[None, :], bits[1], mode)[0]  # W = 1 column
            row = []
            for ch in range(k.shape[0]):
                acc = wrap32(
                    rmcf(int(pl[ch] @ pr), 255 * 255, ml * mr)
                    + rmcf(wrap32(int(pl[ch].sum()) * ro), 255, ml)
                    + rmcf(wrap32(int(pr.sum()) * lo), 255, mr)
                    + wrap32(lo * ro * depth)
                )
                row.append(pipeline(acc, int(b[ch]), *mes[ch], qo[1], max(qo[1], -128)))
            want.append(row)
        np.testing.assert_array_equal(y, want)
        assert not np.array_equal(y, _run(T.Gemmlowp(), "dense", attrs, portable, qi, qo, x))


def test_results_do_not_depend_on_jax_enable_x64(dense_case):
    attrs, portable, qi, qo, x = dense_case
    t = T.Gemmlowp(3, 5, "xorshift", "always")
    want = _run(t, "dense", attrs, portable, qi, qo, x)
    with jax.enable_x64(True):
        p = _lower(t, "dense", attrs, portable, qi, qo)
        assert p.multiplier.dtype == jnp.int32 and p.exponent.dtype == jnp.int32
        y = np.asarray(t.lowering("dense").run(t, attrs, p, jnp.asarray(x)))
    np.testing.assert_array_equal(y, want)


def test_pools():
    x = RNG.integers(-128, 128, (2, 5, 6, 3)).astype(np.int32)
    x[0, :2, :2, 0] = [[-3, 4], [2, -2]]  # window sum 1 over 4: 0.25 -> 0
    x[0, :2, 2:4, 0] = [[3, 4], [2, -3]]  # sum 6: 1.5 -> 2 (half away from zero)
    x[0, :2, 4:6, 0] = [[-3, -4], [-2, 3]]  # sum -6: -1.5 -> -2
    t = T.Gemmlowp(4, 4)
    attrs = Attrs({"window": (2, 2), "strides": (2, 2)})
    mx = np.asarray(t.lowering("maxpool").run(t, attrs, None, jnp.asarray(x)))
    av = np.asarray(t.lowering("avgpool").run(t, attrs, None, jnp.asarray(x)))
    win = x[:, :4].reshape(2, 2, 2, 3, 2, 3)
    np.testing.assert_array_equal(mx, win.max(axis=(2, 4)))
    s = win.sum(axis=(2, 4))
    np.testing.assert_array_equal(av, np.sign(s) * ((np.abs(s) + 2) // 4))
    assert av[0, 0, :, 0].tolist() == [0, 2, -2]


# --------------------------------------------------- models: export, jit/vmap, training


def _model(target):
    r = nnx.Rngs(0)
    return hn.Sequential(
        {
            "input": hn.Quantize(target=target),
            "conv": hn.Conv(2, 8, 3, activation="relu", target=target, rngs=r, learn_scale=True),
            "max": hn.MaxPool(2, target=target),
            "avg": hn.AvgPool(2, strides=1, target=target),
            "flat": hn.Flatten(target=target),
            "fc": hn.Dense(2 * 2 * 8, 5, target=target, rngs=r),
        }
    )


TARGET = T.Gemmlowp(4, 4, "xorshift", "always")


@pytest.fixture(scope="module")
def model():
    x = jnp.asarray(RNG.uniform(-1, 1, (32, 6, 6, 2)), jnp.float32)
    m = _model(TARGET)
    hn.set_mode(m, "calibrate")
    m(x)
    hn.set_mode(m, "hardware")
    return m, x


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    m, x = model
    return hwjax.export(m, tmp_path_factory.mktemp("gemmlowp") / "m", input_shape=(6, 6, 2))


def test_export_load_round_trip_is_bit_exact(model, exported):
    m, x = model
    want = np.asarray(m(x).q, np.int32)
    loaded = hwjax.load(exported)
    np.testing.assert_array_equal(np.asarray(loaded(x)), want)
    g = hn.to_graph(m, (6, 6, 2))
    man = json.loads((exported / "manifest.json").read_text())
    assert man["target"] == {
        "name": "gemmlowp",
        "lhs_bits": 4,
        "rhs_bits": 4,
        "rounding": "xorshift",
        "requantize": "always",
    }
    conv = next(n for n in man["nodes"] if n["name"] == "conv")
    assert conv["tensors"]["weights"]["dtype"] == "uint8" and conv["tensors"]["weights"]["shape"] == [8, 18]
    assert [s["stage"] for s in conv["meta"]["output_stages"]] == [
        "BiasAddition",
        "ScaleInt32ByFixedPointAndExponentPC",
        "Clamp",
        "SaturatingCastToInt8",
    ]
    kernel = np.asarray(g.node("conv").params["kernel"], np.int64)
    blob = np.frombuffer((exported / conv["tensors"]["weights"]["file"]).read_bytes(), np.uint8)
    np.testing.assert_array_equal(blob.reshape(8, 18), kernel.reshape(8, -1) + 128)
    assert conv["meta"]["lhs_offset"] == -128
    assert conv["meta"]["rhs_offset"] == -(man["tensors"]["input"]["zero_point"] + 128)


def test_load_rejects_an_inconsistent_pipeline(exported, tmp_path):
    import shutil

    from hwjax._export import manifest_digest

    for edit, match in (
        (lambda st: st.__setitem__(2, {"stage": "Clamp8"}), "output_stages must be the pipeline"),
        (
            lambda st: st[1].__setitem__("result_exponent", [40] * 8),
            r"result_exponent must be an "
            r"integer in \[-31, 31\]",
        ),
    ):
        d = tmp_path / f"copy{len(match)}"
        shutil.copytree(exported, d)
        man = json.loads((d / "manifest.json").read_text())
        edit(next(n for n in man["nodes"] if n["name"] == "conv")["meta"]["output_stages"])
        man["digest"] = manifest_digest(man)
        (d / "manifest.json").write_text(json.dumps(man))
        with pytest.raises(ExportError, match=f"layer conv: {match}"):
            hwjax.load(d)


def test_hardware_mode_under_jit_and_vmap_is_batch_independent(model):
    m, x = model
    eager = np.asarray(m(x).q)
    g, state = nnx.split(m)
    jitted = np.asarray(jax.jit(lambda s, v: nnx.merge(g, s)(v).q)(state, x))
    vmapped = np.asarray(jax.vmap(lambda v: m(v[None]).q[0])(x[:6]))  # one example per call
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(vmapped, eager[:6])


def test_hardware_mode_trains_through_the_surrogates(model):
    m, x = model
    y = jnp.asarray(RNG.integers(0, 5, x.shape[0]))
    g, params, rest = nnx.split(m, nnx.Param, ...)

    def loss(p):
        logits = hn.as_float(nnx.merge(g, p, rest)(x))
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])

    vg = jax.jit(jax.value_and_grad(loss))
    value, grads = vg(params)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves)
    assert np.abs(np.asarray(grads["layers"][1]["kernel"][...])).sum() > 0
    assert np.abs(np.asarray(grads["layers"][1]["scale_factor"][...])) > 0
    assert np.abs(np.asarray(grads["layers"][5]["bias"][...])).sum() > 0
    new = jax.tree.map(lambda p, d: p - 0.05 * d, params, grads)
    assert float(vg(new)[0]) < float(value)  # a step along the surrogate gradient helps


def test_cli_target_options():
    from train.__main__ import make_target, parser, target_label, target_options

    args = parser().parse_args(
        [
            "digits",
            "--target",
            "gemmlowp",
            "--bits",
            "3,2",
            "--target-opt",
            "requantize=always",
            "--target-opt",
            "rounding=xorshift",
        ]
    )
    opts = target_options(args)
    assert opts == {"requantize": "always", "rounding": "xorshift", "lhs_bits": 3, "rhs_bits": 2}
    t = make_target("gemmlowp", None, opts)
    assert t == T.Gemmlowp(3, 2, "xorshift", "always")
    assert target_label(t) == "gemmlowp (lhs_bits=3, rhs_bits=2, rounding=xorshift, requantize=always)"
    assert target_label(T.XS3()) == "xs3 (hardware)" and target_label(T.NVDLA()) == "nvdla (-)"
    for bad, match in ((["--bits", "4"], "--bits takes two integers"), (["--target-opt", "x"], "KEY=VALUE")):
        with pytest.raises(SystemExit, match=match):
            target_options(parser().parse_args(["digits", "--target", "gemmlowp", *bad]))
    with pytest.raises(SystemExit, match=r"lhs_bits must lie in \[1, 8\], got 9"):
        make_target("gemmlowp", None, target_options(parser().parse_args(["digits", "--bits", "9,4"])))
