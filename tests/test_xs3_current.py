"""Current lib_nn API (spec xs3.md §4, §5.6): output transforms, serialisation,
weight reordering, generic conv2d, xformer parameters, stats and argument errors."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax import errors as xs3_errors
from hwjax import xs3
from tests.conftest import golden_path
from tests.test_xs3_vpu import m_vlashr, m_vlmul, m_vlsat, sat

CHAIN_KEY = {"hardware": "v2026", "host": "host2024", "v2021": "v2021"}
VARIANTS = ("hardware", "host", "v2021")
STEPS = ("after_vlsat", "after_initial_vlashr", "after_vlmul", "after_vladd", "after_final_vlashr", "y_int8")


# ---------------------------------------------------------------- big-integer model


def m_otfn(acc: int, mul: int, bias: int, s0: int, shr: int, v: str) -> list[int]:
    """§4.1 on Python ints, returning the value after every step."""
    t1 = m_vlsat(acc, max(s0, 0), 16, v)
    t2 = t1 if s0 > 0 else m_vlashr(t1, s0, 16, v)
    t3 = m_vlmul(t2, mul, 16, v)
    t4 = sat(t3 + bias, 16)
    t5 = m_vlashr(t4, shr, 16, v)
    return [t1, t2, t3, t4, t5, max(-128, min(127, (t5 + 128) >> 8))]


def m_conv_acc(x: np.ndarray, k: np.ndarray, stride, pad_tl, pad_value, out_hw, dil=(1, 1)):
    """im2col [kh][kw][c], chunks of 32 spanning pixels, sat32 after each chunk."""
    c_out, kh, kw, c_in = k.shape
    h, w, _ = x.shape
    acc = np.zeros(out_hw + (c_out,), object)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            patch = []
            for i in range(kh):
                for j in range(kw):
                    r = oy * stride[0] - pad_tl[0] + i * dil[0]
                    c = ox * stride[1] - pad_tl[1] + j * dil[1]
                    inside = 0 <= r < h and 0 <= c < w
                    patch += [int(v) for v in x[r, c]] if inside else [pad_value] * c_in
            for o in range(c_out):
                wk = [int(v) for v in k[o].ravel()]
                a = 0
                for s in range(0, len(patch), 32):
                    a = sat(a + sum(p * q for p, q in zip(patch[s : s + 32], wk[s : s + 32])), 32)
                acc[oy, ox, o] = a
    return acc


# ---------------------------------------------------------------------- golden files


@pytest.fixture(scope="module")
def chain():
    return json.loads(golden_path("xs3", "otfn_int8_chain.json").read_text())


@pytest.fixture(scope="module")
def convs():
    return json.loads(golden_path("xs3", "new_api_generic_conv.json").read_text())


GROUP_ROWS = 128  # every group is padded to this many lanes: one shape, so eager ops are reused


def _chain_groups(cols, fields=("acc32", "mul", "bias")):
    """Rows sharing one (initial_shift, final_shr) pair (both are per-op): yields
    s0, shr, the row selection and ``fields`` zero-padded to GROUP_ROWS lanes."""
    keys = sorted(set(zip(cols["initial_shift"].tolist(), cols["final_shr"].tolist())))
    for s0, shr in keys:
        sel = (cols["initial_shift"] == s0) & (cols["final_shr"] == shr)
        n = int(sel.sum())
        assert n <= GROUP_ROWS
        yield s0, shr, sel, [np.pad(cols[f][sel], (0, GROUP_ROWS - n)) for f in fields]


@pytest.mark.parametrize("variant", VARIANTS)
def test_otfn_chain_every_step(chain, variant):
    cols = {k: np.asarray(v) for k, v in chain[CHAIN_KEY[variant]].items()}
    seen = 0
    for s0, shr, sel, (acc, mul, bias) in _chain_groups(cols):
        n = int(sel.sum())
        steps = xs3.otfn_int8_steps(acc, mul, bias, initial_shift=s0, final_shr=shr, variant=variant)
        for k in STEPS:
            np.testing.assert_array_equal(np.asarray(steps[k])[:n], cols[k][sel], err_msg=f"{k} {s0} {shr}")
        y = xs3.otfn_int8(acc, mul, bias, initial_shift=s0, final_shr=shr, variant=variant)
        assert y.dtype == jnp.int8
        np.testing.assert_array_equal(np.asarray(y)[:n], cols["y_int8"][sel])
        seen += n
    assert seen == cols["acc32"].size == 1227


def test_otfn_chain_variants_differ(chain):
    hw, host = (np.asarray(chain[k]["y_int8"]) for k in ("v2026", "host2024"))
    assert int((hw != host).sum()) == 76


def test_otfn_stats_against_golden_chain(chain):
    cols = {k: np.asarray(v) for k, v in chain["v2026"].items()}
    fields = ("acc32", "mul", "bias", "after_initial_vlashr", "after_final_vlashr")
    for s0, shr, sel, (acc, mul, bias, t2, t5) in _chain_groups(cols, fields):
        _, stats = xs3.otfn_int8(acc[None], mul, bias, initial_shift=s0, final_shr=shr, return_stats=True)
        q = (t5 + 128) >> 8
        np.testing.assert_array_equal(np.asarray(stats["output_clipped"]), ((q > 127) | (q < -128)).astype(int))
        exact = [(a + (1 << (s0 - 1))) >> s0 if s0 > 0 else a << -s0 for a in acc.astype(object)]
        np.testing.assert_array_equal(np.asarray(stats["initial_clipped"]), [int(abs(e) > 32767) for e in exact])
        prod = [m_vlmul(int(a), int(m), 32, "hardware") for a, m in zip(t2, mul)]
        np.testing.assert_array_equal(np.asarray(stats["mul_clipped"]), [int(abs(p) > 32767) for p in prod])


@given(data=st.data(), variant=st.sampled_from(VARIANTS), s0=st.integers(-16, 16), shr=st.integers(-16, 15))
def test_otfn_model(data, variant, s0, shr):
    n = 4
    acc = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n))
    mul = data.draw(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=n, max_size=n))
    bias = data.draw(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=n, max_size=n))
    steps = xs3.otfn_int8_steps(
        np.array(acc, np.int32),
        np.array(mul, np.int16),
        np.array(bias, np.int16),
        initial_shift=s0,
        final_shr=shr,
        variant=variant,
    )
    for i in range(n):
        want = m_otfn(acc[i], mul[i], bias[i], s0, shr, variant)
        assert [int(steps[k][i]) for k in STEPS] == want


@pytest.mark.parametrize("variant", VARIANTS)
def test_otfn_tail_with_clamps_moved_to_the_end(variant):
    """The fewer-operations form of steps 2-5 for a known final shift (the clamps moved
    past the non-decreasing steps) equals the instruction-by-instruction steps on every
    VLMUL product a 16-bit lane and a 16-bit multiplier can give, for final shifts from
    -14 (left) to 15 and biases at the ends of the 16-bit range."""
    from hwjax.xs3 import _otfn

    p = jnp.arange(-(2**16) - 1, 2**16 + 2, dtype=jnp.int32)[:, None]
    bias = jnp.array([-32768, -32767, -20000, -129, 0, 1, 127, 5000, 32767], jnp.int32)

    @jax.jit
    def both(p, bias):
        out = []
        for shr in (-14, -9, -4, -3, -1, 0, 1, 2, 7, 8, 14, 15):
            out.append(_otfn._tail_y(p, bias, shr, variant))
            out.append(_otfn._tail_from_product(p, bias, shr, variant)["y_int8"])
        return out

    got = both(p, bias)
    for fast, steps in zip(got[::2], got[1::2]):
        np.testing.assert_array_equal(np.asarray(fast), np.asarray(steps))
    assert len(np.unique(np.asarray(got[11]))) == 256  # shift 0: every int8 value occurs


def test_otfn_channelwise_matches_groupwise(chain):
    cols = {k: np.asarray(v) for k, v in chain["host2024"].items()}
    for s0, shr, sel, (acc, mul, bias) in _chain_groups(cols):
        if s0 <= 0:
            continue
        sh = np.full(GROUP_ROWS, s0, np.int16)
        y = xs3.otfn_int8_channelwise(acc, sh, mul, bias, final_shr=shr, variant="host")
        np.testing.assert_array_equal(np.asarray(y)[: int(sel.sum())], cols["y_int8"][sel])


@given(data=st.data(), variant=st.sampled_from(VARIANTS), s0=st.integers(-4, 8), shr=st.integers(-3, 10))
def test_otfn_clamped_model(data, variant, s0, shr):
    acc = data.draw(st.integers(-(2**31), 2**31 - 1))
    off, mul, bias = (data.draw(st.integers(-(2**15), 2**15 - 1)) for _ in range(3))
    x = ((acc & 0xFFFF) ^ 0x8000) - 0x8000
    t = max(sat(x + off, 16), 0)
    t = m_vlashr(t, s0, 16, variant)
    t = sat(m_vlmul(t, mul, 16, variant) + bias, 16)
    t = m_vlashr(t, shr, 16, variant)
    want = max(-128, min(127, (t + 128) >> 8))
    got = xs3.otfn_int8_clamped(
        np.array([acc], np.int32), [off], [mul], [bias], initial_shift=s0, final_shr=shr, variant=variant
    )
    assert int(got[0]) == want


# -------------------------------------------------------------- serialisation, layout


def test_serialised_multipliers_and_biases(convs):
    for name, c in convs.items():
        mem = xs3.serialise_output_transform(np.array(c["multipliers"]), np.array(c["biases"]))
        want = c["multipliers_and_biases_serialised"]
        n_last = len(c["multipliers"]) - 16 * ((len(c["multipliers"]) - 1) // 16)
        assert mem.dtype == np.int16 and mem.size == len(want) + (16 - n_last) % 16, name
        np.testing.assert_array_equal(mem[: len(want)], want)
        np.testing.assert_array_equal(mem[len(want) :], 0)
        back = xs3.deserialise_output_transform(mem, len(c["multipliers"]))
        np.testing.assert_array_equal(back["multipliers"], c["multipliers"])
        np.testing.assert_array_equal(back["biases"], c["biases"])


def test_serialise_three_columns_layout():
    c = 20
    sh, mul, bias = np.arange(c), np.arange(100, 100 + c), np.arange(200, 200 + c)
    mem = xs3.serialise_output_transform(mul, bias, leading=sh, pad_final_access=False)
    want = np.concatenate([sh[:16], mul[:16], bias[:16], sh[16:], mul[16:], bias[16:]])
    np.testing.assert_array_equal(mem, want)
    back = xs3.deserialise_output_transform(mem, c, with_leading=True)
    np.testing.assert_array_equal(back["leading"], sh)


def test_reordered_weights_byte_for_byte(convs):
    for name, c in convs.items():
        k = np.array(c["K"], np.int8).reshape(c["K_shape_OHWI"])
        rw = xs3.reorder_kernel_weights(k)
        assert rw.dtype == jnp.int8
        np.testing.assert_array_equal(np.asarray(rw), c["reordered_weights"], err_msg=name)
        np.testing.assert_array_equal(np.asarray(xs3.reorder_kernel_weights_inverse(rw, k.shape)), k)
        jitted = jax.jit(xs3.reorder_kernel_weights)(k)
        np.testing.assert_array_equal(np.asarray(jitted), c["reordered_weights"])


@settings(max_examples=15)
@given(c_out=st.integers(1, 40), kh=st.integers(1, 3), kw=st.integers(1, 3), c_in=st.integers(1, 40))
def test_reorder_roundtrip_and_layout(c_out, kh, kw, c_in):
    # Every example has its own shape: jitted, each function compiles once per example
    # instead of once per operation (the eager calls are checked by the golden test above).
    k = np.random.default_rng(c_out * 1000 + c_in).integers(-128, 128, (c_out, kh, kw, c_in)).astype(np.int8)
    rw = np.asarray(jax.jit(xs3.reorder_kernel_weights)(k))
    L, n_chunks = kh * kw * c_in, -(-kh * kw * c_in // 32)
    groups = [min(16, c_out - g) for g in range(0, c_out, 16)]
    last_block = sum(n * L for n in groups[:-1]) + groups[-1] * 32 * (n_chunks - 1)
    assert rw.size == last_block + 512
    # first chunk of group 0 holds its highest channel first
    n0, w0 = groups[0], min(32, L)
    np.testing.assert_array_equal(rw[:w0], k[n0 - 1].ravel()[:w0])
    inverse = jax.jit(xs3.reorder_kernel_weights_inverse, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(inverse(rw, k.shape)), k)


# --------------------------------------------------------------------------- conv2d


def _conv_args(c):
    x = np.array(c["X"], np.int8).reshape(c["X_shape"])
    k = np.array(c["K"], np.int8).reshape(c["K_shape_OHWI"])
    kw = dict(
        initial_shift=c["initial_shift"],
        final_shr=c["final_shr"],
        stride=tuple(c["stride"]),
        pad_top_left=tuple(c["pad_top_left"]),
        pad_value=c["input_zero_point_pad_value"],
        out_shape=tuple(c["Y_shape"]),
    )
    return x, k, np.array(c["multipliers"], np.int16), np.array(c["biases"], np.int16), kw


@pytest.mark.parametrize("case", ["generic_conv_p", "generic_conv_q", "generic_conv_r"])
def test_generic_conv_golden_all_variants(convs, case):
    c = convs[case]
    x, k, mul, bias, kw = _conv_args(c)
    for variant in VARIANTS:
        f = jax.jit(functools.partial(xs3.conv2d, variant=variant, return_accumulators=True, **kw))
        y, acc = f(x, k, mul, bias)
        assert y.dtype == jnp.int8 and y.shape == tuple(c["Y_shape"])
        np.testing.assert_array_equal(np.asarray(acc).ravel(), c["acc32"])
        np.testing.assert_array_equal(np.asarray(y).ravel(), c[f"Y_{variant}"], err_msg=variant)


@pytest.mark.parametrize("lhs", [np.uint8, np.int8])
def test_conv_dot_forms_and_kernel_sums_keep_the_golden_accumulators(convs, monkeypatch, lhs):
    """The unclipped convolution is one dot on the backend's 8-bit operand (uint8: the
    values + 128, less 128 * the kernel sums); both forms, with the sums given or derived,
    give the golden accumulators; extremes (-128 everywhere, pad -128) against the model."""
    import hwjax.xs3._conv as C

    monkeypatch.setattr(C, "lhs8_dtype", lambda: np.dtype(lhs))
    for case in ("generic_conv_p", "generic_conv_q", "generic_conv_r"):
        c = convs[case]
        x, k, mul, bias, kw = _conv_args(c)
        sums = k.reshape(k.shape[0], -1).astype(np.int32).sum(axis=1)
        for ks in (None, sums):
            _, acc = xs3.conv2d(x, k, mul, bias, return_accumulators=True, kernel_sums=ks, **kw)
            np.testing.assert_array_equal(np.asarray(acc).ravel(), c["acc32"], err_msg=f"{case} {ks is None}")
        if lhs == np.uint8:  # the sums given are the ones used: one too many takes 128 off
            _, acc = xs3.conv2d(x, k, mul, bias, return_accumulators=True, kernel_sums=sums + 1, **kw)
            np.testing.assert_array_equal(np.asarray(acc).ravel(), np.asarray(c["acc32"]) - 128)
    x, k = np.full((5, 5, 8), -128, np.int8), np.full((3, 3, 3, 8), -128, np.int8)
    kw = dict(initial_shift=0, final_shr=0, stride=(1, 1), pad_top_left=(1, 1), pad_value=-128, out_shape=(5, 5))
    _, acc = xs3.conv2d(x, k, np.ones(3, np.int16), np.zeros(3, np.int16), return_accumulators=True, **kw)
    want = m_conv_acc(x, k, (1, 1), (1, 1), -128, (5, 5)).astype(np.int64)
    np.testing.assert_array_equal(np.asarray(acc), want)
    with pytest.raises(xs3_errors.ShapeError, match="kernel_sums"):
        xs3.conv2d(x, k, np.ones(3, np.int16), np.zeros(3, np.int16), kernel_sums=np.zeros(4, np.int32), **kw)


def test_conv_accumulators_match_model(convs):
    c = convs["generic_conv_p"]
    x, k, _, _, kw = _conv_args(c)
    want = m_conv_acc(x, k, kw["stride"], kw["pad_top_left"], kw["pad_value"], kw["out_shape"][:2])
    np.testing.assert_array_equal(want.ravel().astype(np.int64), c["acc32"])


def test_conv_dilation_batch_and_vmap():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 7, 6, 5)).astype(np.int8)
    k = rng.integers(-128, 128, (18, 2, 3, 5)).astype(np.int8)
    mul = rng.integers(-(2**15), 2**15, 18).astype(np.int16)
    bias = rng.integers(-2000, 2000, 18).astype(np.int16)
    kw = dict(
        initial_shift=4,
        final_shr=3,
        stride=(2, 1),
        pad_top_left=(1, 2),
        pad_value=-3,
        out_shape=(4, 5),
        dilation=(2, 1),
    )
    f = jax.jit(functools.partial(xs3.conv2d, return_accumulators=True, **kw))
    y, acc = f(x, k, mul, bias)
    for b in range(2):
        want = m_conv_acc(x[b], k, (2, 1), (1, 2), -3, (4, 5), dil=(2, 1))
        np.testing.assert_array_equal(np.asarray(acc[b]), want.astype(np.int64))
    y_un, _ = f(x[1], k, mul, bias)  # unbatched input
    np.testing.assert_array_equal(np.asarray(y_un), np.asarray(y[1]))
    yv, _ = jax.vmap(f, in_axes=(0, None, None, None))(x, k, mul, bias)
    np.testing.assert_array_equal(np.asarray(yv), np.asarray(y))
    yo = xs3.otfn_int8(acc, mul, bias, initial_shift=4, final_shr=3)
    np.testing.assert_array_equal(np.asarray(yo), np.asarray(y))


def test_conv_chunk_saturation_and_stats():
    """A 1x1 conv long enough for the chunked accumulator to hit +(2**31-1) and come back."""
    up, down = 4200 * 32, 100 * 32 + 7  # chunks of +516128 saturate after ~4161 chunks
    x = np.concatenate([np.full(up, 127), np.full(down, -128)]).astype(np.int8).reshape(1, 1, -1)
    k = np.stack([np.full(up + down, 127), np.resize([1, -1], up + down)]).astype(np.int8)[:, None, None, :]
    y, acc, stats = xs3.conv2d(
        x,
        k,
        np.array([1 << 14, 1 << 14], np.int16),
        np.zeros(2, np.int16),
        initial_shift=16,
        final_shr=0,
        stride=(1, 1),
        pad_top_left=(0, 0),
        pad_value=0,
        out_shape=(1, 1),
        return_accumulators=True,
        return_stats=True,
    )
    a = 0
    for s in range(0, up + down, 32):
        a = sat(a + sum(int(p) * 127 for p in x.ravel()[s : s + 32]), 32)
    exact0 = int(x.ravel().astype(np.int64).sum() * 127)
    assert int(acc[0, 0, 0]) == a != exact0
    assert int(acc[0, 0, 1]) == int((x.ravel().astype(np.int64) * k[1].ravel()).sum())
    np.testing.assert_array_equal(np.asarray(stats["acc_saturated"]), [1, 0])
    assert set(stats) >= {"acc_saturated", "initial_clipped", "output_clipped"}


# ----------------------------------------------------------------- xformer recipe §4.5


@settings(max_examples=20)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from((8, 75, 300)))
def test_otfn_params_from_scales_accuracy(seed, n):
    rng = np.random.default_rng(seed)
    c = 20
    w = rng.integers(-128, 128, (c, n)).astype(np.int8)
    s_in, s_out = float(rng.uniform(0.005, 0.05)), float(rng.uniform(0.02, 0.3))
    s_w = rng.uniform(0.001, 0.02, c).astype(np.float32)
    z_in, z_out = int(rng.integers(-20, 20)), int(rng.integers(-20, 20))
    bq = rng.integers(-20000, 20000, c).astype(np.int32)
    p = xs3.otfn_params_from_scales(bq, w, s_in, z_in, s_w, s_out, z_out)
    assert p["B"] == p["A"] + p["M"] - 14 and p["initial_shift"] == -p["A"] and p["final_shr"] == p["B"] - 8
    x = rng.integers(-128, 128, (64, n)).astype(np.int64)
    acc = x @ w.T.astype(np.int64)
    y = np.asarray(
        xs3.otfn_int8(
            acc.astype(np.int32),
            p["multipliers"],
            p["biases"],
            initial_shift=p["initial_shift"],
            final_shr=p["final_shr"],
        )
    )
    m = (np.float32(s_in) * s_w / np.float32(s_out)).astype(np.float64)
    ref = np.clip(np.round((acc - z_in * w.astype(np.int64).sum(1) + bq) * m + z_out), -128, 127)
    assert np.abs(y - ref).max() <= 1


def test_otfn_params_zero_accumulators_and_constant_channel():
    # all weights zero: the accumulator range is the single value 0, which lib_nn makes a
    # constant channel (m = 0, beta = trunc(beta) = 5); A = 0, M = 14, B = 0 (the bias gets
    # the -1 compensation)
    p = xs3.otfn_params_from_scales(np.array([0, 0], np.int32), np.zeros((2, 8), np.int8), 0.1, 0, [0.1, 0.1], 0.1, 5)
    assert (p["A"], p["M"], p["final_shr"]) == (0, 14, -8)
    np.testing.assert_array_equal(p["multipliers"], 0)
    np.testing.assert_array_equal(p["biases"], 4)
    # constant channels truncate beta toward zero: 2.9 -> 2, -2.9 -> -2 (rint would give 3, -3)
    m, beta, amin, amax = xs3.canonical_transform(
        np.array([29, -29], np.int32), np.zeros((2, 8), np.int8), 0.1, 0, 1.0, 1.0, 0
    )
    np.testing.assert_array_equal(beta, [2.0, -2.0])
    assert not m.any() and not amin.any() and not amax.any()
    # channel 1's output is above 127 for every possible accumulator: constant 127
    w = np.ones((2, 4), np.int8)
    p = xs3.otfn_params_from_scales(np.array([0, 10**6], np.int32), w, 0.1, 0, 0.1, 0.1, 0)
    assert int(p["multipliers"][1]) == 0 and int(p["multipliers"][0]) != 0
    acc = np.array([[-512, -512], [0, 0], [508, 508]], np.int32)
    y = xs3.otfn_int8(acc, p["multipliers"], p["biases"], initial_shift=p["initial_shift"], final_shr=p["final_shr"])
    np.testing.assert_array_equal(np.asarray(y)[:, 1], 127)


# --------------------------------------------------------------------------- errors


def test_argument_errors():
    acc = np.zeros((3, 4), np.int32)
    mul = bias = np.zeros(4, np.int16)
    with pytest.raises(ValueError, match=r"initial_shift=17 is outside the supported range \[-16, 16\]"):
        xs3.otfn_int8(acc, mul, bias, initial_shift=17, final_shr=0)
    with pytest.raises(ValueError, match=r"final_shr=16 is outside the supported range \[-16, 15\]"):
        xs3.otfn_int8(acc, mul, bias, initial_shift=0, final_shr=16)
    with pytest.raises(ValueError, match=r"multipliers must have shape \(4,\)"):
        xs3.otfn_int8(acc, np.zeros(3, np.int16), bias, initial_shift=0, final_shr=0)
    with pytest.raises(ValueError, match=r"biases must lie in \[-32768, 32767\]"):
        xs3.otfn_int8(acc, mul, np.full(4, 40000), initial_shift=0, final_shr=0)
    with pytest.raises(ValueError, match="acc is a float array and must hold integer values"):
        xs3.otfn_int8(acc.astype(np.float32) + 0.5, mul, bias, initial_shift=0, final_shr=0)
    with pytest.raises(TypeError, match="initial_shift must be an integer scalar"):
        jax.jit(lambda s: xs3.otfn_int8(acc, mul, bias, initial_shift=s, final_shr=0))(3.0)
    x = np.zeros((4, 4, 3), np.int8)
    k = np.zeros((2, 2, 2, 3), np.int8)
    kw = dict(initial_shift=0, final_shr=0, stride=(1, 1), pad_top_left=(0, 0), pad_value=0, out_shape=(3, 3))
    with pytest.raises(ValueError, match=r"x \(int8 values\) must lie in \[-128, 127\]"):
        xs3.conv2d(np.full((4, 4, 3), 200, np.int32), k, mul[:2], bias[:2], **kw)
    with pytest.raises(ValueError, match="x is a float array and must hold integer values"):
        xs3.conv2d(x.astype(np.float32) + 0.5, k, mul[:2], bias[:2], **kw)
    with pytest.raises(ValueError, match="k_ohwi expects C_in = 3"):
        xs3.conv2d(np.zeros((4, 4, 5), np.int8), k, mul[:2], bias[:2], **kw)
    with pytest.raises(ValueError, match=r"out_shape must be \(OH, OW\) or \(OH, OW, 2\)"):
        xs3.conv2d(x, k, mul[:2], bias[:2], **{**kw, "out_shape": (3, 3, 5)})
    with pytest.raises(ValueError, match=r"stride\[0\] must lie in"):
        xs3.conv2d(x, k, mul[:2], bias[:2], **{**kw, "stride": (0, 1)})
    with pytest.raises(ValueError, match=r"pad_value \(int8\) must lie in"):
        xs3.conv2d(x, k, mul[:2], bias[:2], **{**kw, "pad_value": 300})
    with pytest.raises(ValueError, match=r"final_shr \(= B - 8\)|initial_shift \(= -A\)"):
        xs3.otfn_params_from_scales(np.array([0], np.int32), np.ones((1, 4), np.int8), 1e-6, 0, 1e-6, 10.0, 0)


# ----------------------------------------------------- traced parameters (inside jit)

RNG = np.random.default_rng(11)


def test_otfn_int8_with_traced_shifts_equals_concrete_shifts_for_every_shift_value():
    acc = np.concatenate(
        [
            RNG.integers(-(2**31) + 1, 2**31 - 1, 40),
            RNG.integers(-70000, 70000, 40),
            [2**31 - 1, -(2**31) + 1, 0, -1, 1, 32767, -32768],
        ]
    ).astype(np.int32)[:, None]
    acc = np.repeat(acc, 3, axis=1)
    mul = np.array([32767, -32768, 12345], np.int32)
    bias = np.array([-32768, 32767, -77], np.int32)
    traced = jax.jit(
        lambda a, s1, s2, v: xs3.otfn_int8(a, mul, bias, initial_shift=s1, final_shr=s2, variant=v), static_argnums=3
    )
    pairs = [(s1, s2) for s1 in range(-16, 17) for s2 in (-16, 0, 7)]
    pairs += [(s1, s2) for s1 in (-16, 0, 1) for s2 in range(-16, 16)]
    for variant in ("hardware", "host", "v2021"):
        for s1, s2 in pairs if variant == "hardware" else pairs[::3]:
            want = _otfn_model(acc, mul, bias, s1, s2, variant)
            got = np.asarray(traced(acc, np.int32(s1), np.int32(s2), variant))
            np.testing.assert_array_equal(got, want, err_msg=f"{variant} {s1} {s2}")


def _otfn_model(acc, mul, bias, s1, s2, variant):
    """otfn_int8 §4.1 on Python integers, from the VPU instruction models."""
    out = np.zeros(acc.shape, np.int64)
    for idx in np.ndindex(acc.shape):
        c = idx[-1]
        t = m_vlsat(int(acc[idx]), max(s1, 0), 16, variant)
        if s1 <= 0:
            t = m_vlashr(t, s1, 16, variant)
        t = m_vlmul(t, int(mul[c]), 16, variant)
        t = sat(t + int(bias[c]), 16)
        t = m_vlashr(t, s2, 16, variant)
        out[idx] = -128 if sat(t + 0x7F80, 16) < 0 else max(-128, min(127, (t + 128) >> 8))
    return out


def test_conv2d_with_traced_shifts_and_pad_value_equals_concrete():
    x = RNG.integers(-128, 128, (2, 5, 6, 3)).astype(np.int8)
    k = RNG.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    mul, bias = RNG.integers(-32768, 32768, 4), RNG.integers(-32768, 32768, 4)
    geo = dict(stride=(1, 2), pad_top_left=(1, 1), out_shape=(5, 3))

    @jax.jit
    def traced(s1, s2, pad):
        return xs3.conv2d(x, k, mul, bias, initial_shift=s1, final_shr=s2, pad_value=pad, **geo)

    for s1, s2, pad in [(-3, 0, -128), (0, -2, 5), (4, 1, 127), (16, -16, 0)]:
        want = xs3.conv2d(x, k, mul, bias, initial_shift=s1, final_shr=s2, pad_value=pad, **geo)
        np.testing.assert_array_equal(np.asarray(traced(s1, s2, pad)), np.asarray(want))


def test_depthwise_conv2d_matches_a_python_model():
    for variant in ("hardware", "host", "v2021"):
        x = RNG.integers(-128, 128, (2, 6, 5, 16)).astype(np.int8)
        k = RNG.integers(-128, 128, (3, 2, 16)).astype(np.int8)
        mul, bias = RNG.integers(-32768, 32768, 16), RNG.integers(-32768, 32768, 16)
        s1, s2, pad = int(RNG.integers(-4, 8)), int(RNG.integers(-2, 4)), int(RNG.integers(-128, 128))
        y, acc = xs3.depthwise_conv2d(
            x,
            k,
            mul,
            bias,
            initial_shift=s1,
            final_shr=s2,
            stride=(2, 1),
            pad_top_left=(1, 0),
            pad_value=pad,
            out_shape=(3, 4),
            variant=variant,
            return_accumulators=True,
        )
        want_acc = np.zeros((2, 3, 4, 16), np.int64)
        for b, oy, ox, c in np.ndindex(want_acc.shape):
            a = 0
            for i in range(3):
                for j in range(2):
                    r, s = oy * 2 - 1 + i, ox - 0 + j
                    v = int(x[b, r, s, c]) if 0 <= r < 6 and 0 <= s < 5 else pad
                    a = sat(a + v * int(k[i, j, c]), 32)
            want_acc[b, oy, ox, c] = a
        np.testing.assert_array_equal(np.asarray(acc), want_acc)
        np.testing.assert_array_equal(np.asarray(y), _otfn_model(want_acc, mul, bias, s1, s2, variant))


def test_add_int8_matches_a_python_model_and_saturates_in_order():
    x0 = RNG.integers(-128, 128, (4, 16)).astype(np.int8)
    x1 = RNG.integers(-128, 128, (4, 16)).astype(np.int8)
    for variant in ("hardware", "host", "v2021"):
        for m0, m1, bias, shift in [(12345, -20000, 1000, 9), (32767, 32767, 2**31 - 1, 24), (-32768, 5, -(2**31), 3)]:
            got = np.asarray(
                xs3.add_int8(x0, x1, multiplier0=m0, multiplier1=m1, bias=bias, shift=shift, variant=variant)
            )
            want = np.zeros(x0.shape, np.int64)
            for idx in np.ndindex(x0.shape):
                acc = sat(sat(bias + int(x0[idx]) * m0, 32) + int(x1[idx]) * m1, 32)
                want[idx] = max(-128, min(127, m_vlsat(acc, shift, 40, variant)))  # asymmetric int8 clamp
            np.testing.assert_array_equal(got, want, err_msg=f"{variant} {m0} {m1} {bias} {shift}")
    with pytest.raises(ValueError, match="multiplier0"):
        xs3.add_int8(x0, x1, multiplier0=40000, multiplier1=1, bias=0, shift=0)


@pytest.mark.parametrize("shape", [(24, 100), (7, 9), (32, 300)])
def test_otfn_params_matches_the_xformer_helper(shape):
    c, k = shape
    fn = jax.jit(xs3.otfn_params)
    checked = double_rounded = 0
    for trial in range(12):
        w = RNG.integers(-127, 128, (c, k))
        if trial % 4 == 0:
            w[: c // 2] = 0  # constant channels
        w = w.astype(np.int8)
        s_in, s_out = np.float32(10 ** RNG.uniform(-4, 0)), np.float32(10 ** RNG.uniform(-3, 1))
        s_w = (10 ** RNG.uniform(-4, -1, c)).astype(np.float32)
        if trial % 3 == 1:
            s_w[-2:] = 0  # zero-scale channels, as xformer pads output channels to a multiple of 4
        z_in, z_out = int(RNG.integers(-128, 128)), int(RNG.integers(-128, 128))
        # biases up to 2**28: bias - z_in sum w leaves float32's 24 bits, so beta's float32
        # steps round
        b = RNG.integers(-(2 ** int(RNG.integers(1, 29))), 2 ** int(RNG.integers(1, 29)), c).astype(np.int32)
        # multipliers where float32(float32(s_in s_w) / s_out) is not the correctly rounded
        # float32(s_in s_w / s_out) that xformer takes
        two_roundings = (np.float32(s_in) * s_w / np.float32(s_out)).astype(np.float32)
        exact = (np.float64(s_in) * s_w.astype(np.float64) / np.float64(s_out)).astype(np.float32)
        double_rounded += int(np.sum((two_roundings != exact) & (s_w > 0)))
        try:
            ref = xs3.otfn_params_from_scales(b, w, float(s_in), z_in, s_w, float(s_out), z_out)
        except ValueError:  # shifts outside the assembly's range: the helper refuses
            continue
        mul, bias, sh = fn(w, b, s_in=s_in, z_in=np.int32(z_in), s_w=s_w, s_out=s_out, z_out=np.int32(z_out))
        np.testing.assert_array_equal(np.asarray(mul), ref["multipliers"])
        np.testing.assert_array_equal(np.asarray(bias), ref["biases"])
        assert [int(sh[0]), int(sh[1])] == [ref["initial_shift"], ref["final_shr"]]
        checked += 1
    assert checked >= 6 and double_rounded > 0


def test_otfn_params_of_several_layers_in_one_recipe_equal_the_helper():
    """otfn_params_many (what the XS3 target derives a model's layers with: one batched
    recipe) gives each layer the xformer helper's parameters, whatever the other layers'
    channel counts, eagerly and under jit."""
    from hwjax.xs3 import otfn_params_many

    layers, refs = [], []
    while len(layers) < 5:
        c, k = [(24, 100), (7, 9), (32, 300), (3, 40), (16, 8)][len(layers)]
        w = RNG.integers(-127, 128, (c, k)).astype(np.int8)
        w[: c // 3] = 0 if len(layers) == 1 else w[: c // 3]  # constant channels in one layer
        s_in, s_out = np.float32(10 ** RNG.uniform(-4, 0)), np.float32(10 ** RNG.uniform(-3, 1))
        s_w = (10 ** RNG.uniform(-4, -1, c)).astype(np.float32)
        z_in, z_out = np.int32(RNG.integers(-128, 128)), np.int32(RNG.integers(-128, 128))
        b = RNG.integers(-(2**18), 2**18, c).astype(np.int32)
        try:
            ref = xs3.otfn_params_from_scales(b, w, float(s_in), int(z_in), s_w, float(s_out), int(z_out))
        except ValueError:  # shifts outside the assembly's range: draw again
            continue
        layers.append((w, b, s_in, z_in, s_w, s_out, z_out))
        refs.append(ref)
    traced_scales = jax.jit(lambda s: otfn_params_many([(*a[:2], s[i], *a[3:]) for i, a in enumerate(layers)]))(
        np.stack([a[2] for a in layers])
    )  # the kernels known, the input scales traced
    for got in (otfn_params_many(layers), jax.jit(otfn_params_many)(layers), traced_scales):
        assert len(got) == len(refs)
        for (mul, bias, sh), ref in zip(got, refs):
            np.testing.assert_array_equal(np.asarray(mul), ref["multipliers"])
            np.testing.assert_array_equal(np.asarray(bias), ref["biases"])
            assert [int(sh[0]), int(sh[1])] == [ref["initial_shift"], ref["final_shr"]]
    assert otfn_params_many([]) == []


def test_otfn_params_with_tiny_multipliers_equal_the_helper():
    """Dead channels as fine-tuning leaves them (all-zero weights, weight scales down to
    1e-12, biases at +-(2**24 - 1)) and live channels with multipliers below 2**-32: the
    jitted recipe and the batched one give the helper's parameters. (Found on MLPerf's VWW
    fine-tuned for xs3: beta 2**k left int64 there.)"""
    from hwjax.xs3 import otfn_params_many

    fn = jax.jit(xs3.otfn_params)
    c, k = 48, 27  # one shape: one program each
    checked, many = 0, []
    for trial in range(12):
        w = RNG.integers(-127, 128, (c, k)).astype(np.int8)
        dead = RNG.random(c) < 0.6
        w[dead] = 0
        s_w = (10 ** RNG.uniform(-4, -1, c)).astype(np.float32)
        s_w[dead] = 10 ** RNG.uniform(-12, -8, int(dead.sum()))
        tiny = ~dead & (RNG.random(c) < 0.3)
        s_w[tiny] = 10 ** RNG.uniform(-11, -9, int(tiny.sum()))  # m below 2**-30
        b = RNG.integers(-(2**20), 2**20, c).astype(np.int32)
        b[dead] = RNG.choice([-(2**24 - 1), 2**24 - 1], int(dead.sum()))
        s_in, s_out = np.float32(10 ** RNG.uniform(-2.5, -1)), np.float32(10 ** RNG.uniform(-2.5, -1))
        z_in = int(RNG.choice([-128, 0, int(RNG.integers(-128, 128))]))
        z_out = int([-128, 0, int(RNG.integers(-128, 128))][trial % 3])
        try:
            ref = xs3.otfn_params_from_scales(b, w, float(s_in), z_in, s_w, float(s_out), z_out)
        except ValueError:  # shifts outside the assembly's range: the helper refuses
            continue
        got = fn(w, b, s_in=s_in, z_in=np.int32(z_in), s_w=s_w, s_out=s_out, z_out=np.int32(z_out))
        many.append(((w, b, s_in, np.int32(z_in), s_w, s_out, np.int32(z_out)), ref))
        for (mul, bias, sh), r in ((got, ref),):
            np.testing.assert_array_equal(np.asarray(mul), r["multipliers"])
            np.testing.assert_array_equal(np.asarray(bias), r["biases"])
            assert [int(sh[0]), int(sh[1])] == [r["initial_shift"], r["final_shr"]]
        checked += 1
    assert checked >= 6
    for (mul, bias, sh), (_, r) in zip(otfn_params_many([a for a, _ in many[:3]]), many[:3]):
        np.testing.assert_array_equal(np.asarray(mul), r["multipliers"])
        np.testing.assert_array_equal(np.asarray(bias), r["biases"])
        assert [int(sh[0]), int(sh[1])] == [r["initial_shift"], r["final_shr"]]


def test_otfn_params_rounds_bias_ties_as_the_helper():
    """Multipliers with few significant bits make ``beta * 2**B`` land on ties: the bias
    is ``rint(beta 2**B - 1)``, which is not ``rint(beta 2**B) - 1`` there."""
    c, k, z_in, z_out = 64, 600, 3, -5
    w = RNG.integers(-127, 128, (c, k)).astype(np.int8)
    b = (np.arange(c) * 3 + 1).astype(np.int32)
    s_in, s_out, s_w = np.float32(2.0**-3), np.float32(2.0**-2), np.full(c, 1.5, np.float32)  # m = 0.75
    ref = xs3.otfn_params_from_scales(b, w, float(s_in), z_in, s_w, float(s_out), z_out)
    B = ref["final_shr"] - ref["initial_shift"] + 22 - 14  # A + M - 14, see otfn_params
    beta = (b.astype(np.int64) - z_in * w.astype(np.int64).sum(1)) * 0.75 + z_out
    assert B >= 0 and np.sum(np.mod(beta * 2.0**B, 1) == 0.5) > 10  # the case is exercised
    mul, bias, sh = jax.jit(xs3.otfn_params)(
        w, b, s_in=s_in, z_in=np.int32(z_in), s_w=s_w, s_out=s_out, z_out=np.int32(z_out)
    )
    np.testing.assert_array_equal(np.asarray(mul), ref["multipliers"])
    np.testing.assert_array_equal(np.asarray(bias), ref["biases"])
    assert [int(sh[0]), int(sh[1])] == [ref["initial_shift"], ref["final_shr"]]


def test_depthwise_and_add_under_jit_and_vmap():
    x = RNG.integers(-128, 128, (3, 4, 4, 16)).astype(np.int8)
    k = RNG.integers(-128, 128, (2, 2, 16)).astype(np.int8)
    mul, bias = RNG.integers(-32768, 32768, 16), RNG.integers(-32768, 32768, 16)

    def dw(xi, s1, pad):
        return xs3.depthwise_conv2d(
            xi,
            k,
            mul,
            bias,
            initial_shift=s1,
            final_shr=1,
            stride=(1, 1),
            pad_top_left=(0, 0),
            pad_value=pad,
            out_shape=(3, 3),
        )

    want = np.asarray(dw(x, -2, 7))
    np.testing.assert_array_equal(np.asarray(jax.jit(dw)(x, -2, 7)), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(dw, in_axes=(0, None, None))(x, -2, 7)), want)

    def add(a, b, m0):
        return xs3.add_int8(a, b, multiplier0=m0, multiplier1=-9000, bias=12345, shift=12)

    want = np.asarray(add(x, x[::-1], 23456))
    np.testing.assert_array_equal(np.asarray(jax.jit(add)(x, x[::-1], 23456)), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(add, in_axes=(0, 0, None))(x, x[::-1], 23456)), want)


def test_otfn_binary_matches_a_python_model():
    acc = RNG.integers(-(2**31), 2**31, (3, 32)).astype(np.int32)
    acc[0, :4] = [32767, -32768, 0x12348000, -1]
    thr = RNG.integers(-32768, 32768, 32)
    thr[:4] = [1, -1, 0, 1]
    got = np.asarray(jax.jit(xs3.otfn_binary)(acc, thr))
    want = np.zeros((3, 4), np.uint8)
    for b in range(3):
        for g in range(2):
            word = 0
            for i in range(16):
                c = 16 * g + i
                low = ((int(acc[b, c]) & 0xFFFF) ^ 0x8000) - 0x8000
                if max(-32767, min(32767, low + int(thr[c]))) < 0:  # VLADD saturates symmetrically
                    word |= 1 << i
            want[b, 2 * g], want[b, 2 * g + 1] = word & 0xFF, word >> 8
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="multiple of 16"):
        xs3.otfn_binary(acc[:, :20], thr[:20])


def test_add_elementwise_int8_tail_is_lib_nns_c_code():
    """One add_elementwise call over a row of N values: full 16-lane groups through VLSAT,
    on the host the last N % 16 through lib_nn's C code in wrapping int32, whose rounding
    term at shift 0 is 1 << -1 = 1 << 31 on x86 (the sign flips; seed 581 of the xs3 probe)."""
    rng = np.random.default_rng(5)
    x0, x1 = (rng.integers(-128, 128, (3, 45)).astype(np.int8) for _ in range(2))
    args = dict(multiplier0=10, multiplier1=13367, bias=1710938)

    def c_code(shift):  # lib_nn's C tail written out in NumPy (int64, wrapped to int32)
        acc = args["bias"] + x0.astype(np.int64) * args["multiplier0"] + x1.astype(np.int64) * args["multiplier1"]
        wrap = lambda v: (v + 2**31) % 2**32 - 2**31
        rnd = wrap(1 << ((shift - 1) % 32))  # x86 shift counts are taken modulo 32
        return np.clip(wrap(wrap(acc) + rnd) >> (shift % 32), -128, 127)

    for shift in (0, 1, 7, 20, -1, -3):
        vpu = np.asarray(xs3.add_int8(x0, x1, shift=shift, variant="host", **args))
        got = np.asarray(xs3.add_elementwise_int8(x0, x1, shift=shift, variant="host", **args))
        np.testing.assert_array_equal(got[:, :32], vpu[:, :32])
        np.testing.assert_array_equal(got[:, 32:], c_code(shift)[:, 32:])
        hw = np.asarray(xs3.add_elementwise_int8(x0, x1, shift=shift, variant="hardware", **args))
        np.testing.assert_array_equal(hw, np.asarray(xs3.add_int8(x0, x1, shift=shift, variant="hardware", **args)))
    at_zero = np.asarray(xs3.add_elementwise_int8(x0, x1, shift=0, variant="host", **args))[:, 32:]
    vlsat = np.asarray(xs3.add_int8(x0, x1, shift=0, variant="host", **args))[:, 32:]
    assert np.all((at_zero == 127) == (vlsat == -128))  # every tail value flipped sign
    eager = np.asarray(xs3.add_elementwise_int8(x0, x1, shift=0, variant="host", **args))
    jitted = jax.jit(lambda a, b: xs3.add_elementwise_int8(a, b, shift=0, variant="host", **args))
    np.testing.assert_array_equal(np.asarray(jitted(x0, x1)), eager)


def test_add_per_example_is_one_call_per_flattened_example():
    """add_per_example equals add_elementwise_int8 on each example's values in row-major
    order, on every variant, with and without a C tail (16 * 3 and 5 * 7 values)."""
    from hwjax import xs3

    rng = np.random.default_rng(11)
    kw = dict(multiplier0=1234, multiplier1=-2345, bias=-3456, shift=9)
    for shape in ((3, 4, 2, 6), (2, 5, 7)):
        x0, x1 = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
        for variant in ("hardware", "host", "v2021"):
            got = np.asarray(jax.jit(lambda a, b, v=variant: xs3.add_per_example(a, b, **kw, variant=v))(x0, x1))
            flat = xs3.add_elementwise_int8(x0.reshape(shape[0], -1), x1.reshape(shape[0], -1), **kw, variant=variant)
            assert got.shape == shape and np.array_equal(got, np.asarray(flat).reshape(shape))
