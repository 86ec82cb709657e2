"""mac vs a plain-Python model and vs mac_reference: orders, chunks, routes, saturation."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax.core import mac, mac_reference

M32 = 2**31 - 1


def py_mac(acc0, x, w, order, chunk, acc_bits=32, clips=False):
    """The definition, with Python integers: one output (and its clip count)."""
    m = 2 ** (acc_bits - 1) - 1
    order = list(order) + [-1] * ((-len(order)) % chunk)
    acc, clipped = int(acc0), 0
    for c in range(0, len(order), chunk):
        s = sum(int(x[k]) * int(w[k]) for k in order[c : c + chunk] if k >= 0)
        clipped += not -m <= acc + s <= m
        acc = min(max(acc + s, -m), m)
    return (acc, clipped) if clips else acc


def py_mac_all(acc0, x, w, order, chunk, acc_bits=32, clips=False):
    """All outputs of x (B, K), w (N, K); with ``clips`` the pair (acc, clip counts)."""
    b, n = x.shape[0], w.shape[0]
    acc0 = np.broadcast_to(acc0, (b, n))
    r = np.array(
        [[py_mac(acc0[i, j], x[i], w[j], order, chunk, acc_bits, clips=True) for j in range(n)] for i in range(b)],
        dtype=np.int64,
    ).reshape(b, n, 2)
    return (r[..., 0], r[..., 1]) if clips else r[..., 0]


def assert_pair_equal(got, want):
    """(acc, clipped) against the model's pair: exact, int32."""
    for g, w_ in zip(got, want):
        assert g.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(g), w_)


@st.composite
def mac_case(draw):
    k = draw(st.sampled_from([1, 5, 33]))  # few shapes: each new static order recompiles
    b, n = 2, 3
    chunk = draw(st.sampled_from([1, 2, 3, 8, 32]))
    acc_bits = draw(st.sampled_from([32, 32, 24, 16, 8]))  # 8: both bounds hit within a block
    m = 2 ** (acc_bits - 1) - 1
    near = st.sampled_from([m, -m, -m - 1, m - 5000, -m + 5000, 0, m - 70000])
    acc0 = np.array(draw(st.lists(near, min_size=b * n, max_size=b * n)), np.int64).reshape(b, n)
    acc0 = np.clip(acc0, -m - 1, m).astype(np.int32)
    # Runs of strongly positive then strongly negative products: saturate, then recover.
    style = draw(st.sampled_from(["random", "updown", "downup"]))
    ints8 = st.integers(-128, 127)
    x = np.array(draw(st.lists(ints8, min_size=b * k, max_size=b * k)), np.int8).reshape(b, k)
    w = np.array(draw(st.lists(ints8, min_size=n * k, max_size=n * k)), np.int8).reshape(n, k)
    if style != "random":
        x = np.abs(x.astype(np.int16)).clip(0, 127).astype(np.int8)
        sign = np.where(np.arange(k) < k // 2, 1, -1) * (1 if style == "updown" else -1)
        w = (np.abs(w.astype(np.int16)).clip(0, 127) * sign).astype(np.int8)
    if draw(st.booleans()):  # the default ascending order: x and w are reshaped, not gathered
        return acc0, x, w, None, chunk, acc_bits
    order = draw(st.permutations(list(range(k))))
    holes = draw(st.lists(st.integers(0, len(order)), max_size=4))
    order = list(order)
    for h in sorted(holes, reverse=True):
        order.insert(h, -1)
    return acc0, x, w, order, chunk, acc_bits


@settings(max_examples=30)
@given(mac_case())
def test_mac_matches_python_model_and_reference(case):
    acc0, x, w, order, chunk, acc_bits = case
    want = py_mac_all(acc0, x, w, range(x.shape[1]) if order is None else order, chunk, acc_bits, clips=True)
    kw = dict(order=order, chunk=chunk, acc_bits=acc_bits)
    np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, **kw)), want[0])
    assert_pair_equal(mac(acc0, x, w, route="float", return_clipped=True, **kw), want)
    assert_pair_equal(mac_reference(acc0, x, w, return_clipped=True, **kw), want)


@given(st.integers(0, 2**16), st.sampled_from([1, 4, 16]))
def test_mac_int16_operands(seed, chunk):
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**15), 2**15, (2, 20)).astype(np.int16)
    w = (
        rng.integers(-(2**15), 2**15, (3, 20)).astype(np.int16)
        if chunk == 1
        else rng.integers(-128, 128, (3, 20)).astype(np.int8)
    )
    acc0 = rng.choice([0, M32, -M32, M32 - 2**30], (2, 3)).astype(np.int32)
    order = rng.permutation(20)
    want = py_mac_all(acc0, x, w, order, chunk)
    np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, order=order, chunk=chunk)), want)
    np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, order=order, chunk=chunk, route="float")), want)


def test_long_saturating_sequences_equal_reference():
    """Large K (several slow-path blocks), biases at +-(2**31-1), both routes."""
    rng = np.random.default_rng(7)
    b, n, k = 6, 5, 1500
    x = rng.integers(-128, 128, (b, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w[:, :700] = np.abs(w[:, :700]).clip(0, 127)
    x[:, :700] = np.abs(x[:, :700]).clip(0, 127)
    acc0 = rng.choice([M32, -M32, M32 - 10**6, -M32 + 10**6, 0], (b, n)).astype(np.int32)
    # Random orders gather; the ascending order reshapes (zero-padded to whole blocks).
    # chunk=1: 6 screened blocks of 250 products (loop of 32-term bodies plus a rest of
    # 26); chunk=2: one block of 750 chunk sums; chunk=32: one block of 47 (32 + 15).
    for chunk, order in ((1, rng.permutation(k)), (32, rng.permutation(k)), (1, None), (2, None), (32, None)):
        ref = np.asarray(mac_reference(acc0, x, w, order=order, chunk=chunk))
        np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, order=order, chunk=chunk)), ref)
        np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, order=order, chunk=chunk, route="float")), ref)
        unclipped = acc0.astype(np.int64) + x.astype(np.int64) @ w.T.astype(np.int64)
        assert np.any(ref != unclipped)  # the data does saturate
    # A sequence that provably saturates and recovers, checked against the model.
    x1 = np.full((1, 64), 127, np.int8)
    w1 = np.concatenate([np.full(32, 127), np.full(32, -128)]).astype(np.int8)[None]
    got = int(mac(np.int32(M32 - 1000), x1, w1, chunk=1)[0, 0])
    assert got == py_mac(M32 - 1000, x1[0], w1[0], range(64), 1)
    assert got < M32 - 1000 - 400000  # recovered well below the bound


def test_walk_edges_equal_model():
    """The slow path's clipped walk at its limits: acc0 = -2**31 (clipped only once a
    product is added), products of exactly 2**30 (int16 x int16, one product per
    block), and both bounds touched within one block (acc_bits=12)."""
    lo32 = -(2**31)
    x = np.array([[-1] + [127] * 40 + [-128] * 40], np.int8)
    w = np.array([[1] + [127] * 40 + [127] * 40, [-1] + [-128] * 80], np.int8)
    acc0 = np.array([[lo32, M32]], np.int32)
    k = x.shape[1]
    for chunk in (1, 3):
        got = np.asarray(mac(acc0, x, w, chunk=chunk))
        np.testing.assert_array_equal(got, py_mac_all(acc0, x, w, range(k), chunk))
    x16 = np.array([[-32768, -32768, 32767, -32768, 32767, 32767]], np.int16)
    w16 = np.array([[-32768] * 6, [32767] * 6], np.int16)
    for a in (lo32, -M32, 0, M32, M32 - 2**30):
        acc = np.array([[a, a]], np.int32)
        for route in ("int", "float"):
            np.testing.assert_array_equal(
                np.asarray(mac(acc, x16, w16, chunk=1, route=route)), py_mac_all(acc, x16, w16, range(6), 1)
            )
    rng = np.random.default_rng(11)
    xs = rng.integers(-128, 128, (3, 300)).astype(np.int8)
    ws = rng.integers(-128, 128, (4, 300)).astype(np.int8)
    a12 = rng.integers(-2048, 2048, (3, 4)).astype(np.int32)
    for chunk in (1, 4):
        np.testing.assert_array_equal(
            np.asarray(mac(a12, xs, ws, chunk=chunk, acc_bits=12)),
            py_mac_all(a12, xs, ws, range(300), chunk, acc_bits=12),
        )


def test_order_changes_result_when_saturating():
    x = np.array([[100, 100, 100, 100]], np.int8)
    w = np.array([[100, 100, -100, -100]], np.int8)
    a = np.int32(M32 - 10000)
    asc = int(mac(a, x, w, chunk=1)[0, 0])
    desc = int(mac(a, x, w, order=[2, 3, 0, 1], chunk=1)[0, 0])
    assert asc == py_mac(a, x[0], w[0], [0, 1, 2, 3], 1) == M32 - 20000
    assert desc == py_mac(a, x[0], w[0], [2, 3, 0, 1], 1) == M32 - 10000
    assert int(mac(a, x, w, chunk=4)[0, 0]) == M32 - 10000


def test_callable_order_and_leading_batch_dims():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 3, 10)).astype(np.int8)
    w = rng.integers(-128, 128, (4, 10)).astype(np.int8)
    got = mac(np.int32(5), x, w, order=lambda k: list(reversed(range(k))), chunk=3)
    assert got.shape == (2, 3, 4) and got.dtype == jnp.int32
    want = py_mac_all(np.int32(5), x.reshape(6, 10), w, list(reversed(range(10))), 3).reshape(2, 3, 4)
    np.testing.assert_array_equal(np.asarray(got), want)


class TestMacTransforms(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit(self):
        rng = np.random.default_rng(4)
        x = rng.integers(-128, 128, (5, 40)).astype(np.int8)
        w = rng.integers(-128, 128, (3, 40)).astype(np.int8)
        acc0 = np.array([M32, 0, -M32], np.int32)
        f = self.variant(lambda a, b, c: mac(a, b, c, chunk=8))
        np.testing.assert_array_equal(np.asarray(f(acc0, x, w)), py_mac_all(acc0, x, w, range(40), 8))

    def test_vmap(self):
        rng = np.random.default_rng(5)
        x = rng.integers(-128, 128, (4, 2, 30)).astype(np.int8)
        w = rng.integers(-128, 128, (3, 30)).astype(np.int8)
        acc0 = rng.choice([M32 - 3000, 7, -M32], (4, 2, 3)).astype(np.int32)
        got = jax.vmap(lambda a, b: mac(a, b, w, chunk=1))(acc0, x)
        want = np.stack([py_mac_all(acc0[i], x[i], w, range(30), 1) for i in range(4)])
        np.testing.assert_array_equal(np.asarray(got), want)


def test_identical_with_x64():
    rng = np.random.default_rng(6)
    x = rng.integers(-128, 128, (8, 300)).astype(np.int8)
    w = rng.integers(-128, 128, (6, 300)).astype(np.int8)
    acc0 = rng.choice([M32, -M32, 0], (8, 6)).astype(np.int32)
    runs = []
    for enabled in (False, True):
        with jax.enable_x64(enabled):
            runs.append([np.asarray(mac(acc0, x, w, chunk=c, route=r)) for c in (1, 32) for r in ("int", "float")])
    for a, b in zip(*runs):
        assert a.dtype == b.dtype == np.int32
        np.testing.assert_array_equal(a, b)


def test_no_batch_n_k_product_tensor():
    """Neither path forms the (B, N, K) product tensor (the slow path works per block)."""
    x = jnp.zeros((16, 1024), jnp.int8)
    w = jnp.zeros((8, 1024), jnp.int8)
    hlo = jax.jit(lambda a, b: mac(jnp.int32(0), a, b)).lower(x, w).as_text()
    assert "dot_general" in hlo
    assert "16x8x1024" not in hlo and "16x1024x8" not in hlo


# ------------------------------------------------------------------- gradients


def test_grad_is_linear_surrogate_masked_where_saturated():
    x = jnp.array([[1.0, 2.0, 3.0], [100.0, 100.0, 100.0]])
    w = jnp.array([[1.0, -1.0, 2.0], [127.0, 127.0, 127.0]])
    acc0 = jnp.array([[0.0, 0.0], [0.0, float(2**31 - 100)]])
    gx, gw, ga = jax.grad(lambda a, b, c: mac(c, a, b, chunk=1).sum(), argnums=(0, 1, 2))(x, w, acc0)
    live = np.array([[1, 1], [1, 0]], np.float32)  # output (1, 1) saturates
    np.testing.assert_array_equal(np.asarray(ga), live)
    np.testing.assert_array_equal(np.asarray(gx), live @ np.asarray(w))
    np.testing.assert_array_equal(np.asarray(gw), live.T @ np.asarray(x))
    # Away from saturation the surrogate is the derivative of the float function x @ w.T:
    f = lambda a: (a @ w.T).sum()
    np.testing.assert_array_equal(
        np.asarray(jax.grad(lambda a: mac(0.0, a, w, chunk=1).sum())(x[:1])), np.asarray(jax.grad(f)(x[:1]))
    )


def test_float_inputs_forward_exact():
    rng = np.random.default_rng(8)
    x = rng.integers(-128, 128, (3, 50)).astype(np.int8)
    w = rng.integers(-128, 128, (2, 50)).astype(np.int8)
    acc0 = np.array([2**31 - 2**16, -(2**31) + 256], np.int32)  # exactly representable in float32
    yi = mac(acc0, x, w, chunk=1)
    yf = mac(acc0.astype(np.float32), x.astype(np.float32), w.astype(np.float32), chunk=1)
    assert yf.dtype == jnp.float32
    # Same integers; float32 holds them rounded to its 24-bit mantissa near 2**31.
    np.testing.assert_array_equal(np.asarray(yf), np.asarray(yi).astype(np.float32))


# ---------------------------------------------------------------------- errors


def test_errors():
    x = np.zeros((2, 4), np.int8)
    w = np.zeros((3, 4), np.int8)
    with pytest.raises(ValueError, match="order must visit every k"):
        mac(0, x, w, order=[0, 1, 2])
    with pytest.raises(ValueError, match="order entries must lie in"):
        mac(0, x, w, order=[0, 1, 2, 4])
    with pytest.raises(ValueError, match="w.shape\\[1\\]"):
        mac(0, np.zeros((2, 5), np.int8), w)
    with pytest.raises(TypeError, match="at most 16 bits"):
        mac(0, x.astype(np.int32), w)
    with pytest.raises(ValueError, match="chunk=64"):
        mac(0, x.astype(np.int16), w.astype(np.int16), chunk=64)
    with pytest.raises(ValueError, match="acc0"):
        mac(np.int32(40000), x, w, acc_bits=16)
    with pytest.raises(ValueError, match="declared int8"):
        mac(0.0, np.full((2, 4), 300.0, np.float32), w)
    with pytest.raises(ValueError, match="route must be one of"):
        mac(0, x, w, route="tf32")
    with pytest.raises(TypeError, match="return_clipped"):
        mac(0, x, w, return_clipped="yes")
    with pytest.raises(TypeError, match="return_clipped"):
        mac_reference(0, x, w, return_clipped=1)


@given(st.integers(0, 2**16), st.integers(1, 40))
def test_weight_certificate_selects_fast_path(seed, wmax):
    """Whenever XS3's certify_no_saturation holds, mac proves its fast path too."""
    from hwjax.core._mac import _fast_bound_ok
    from hwjax.xs3 import certify_no_saturation

    rng = np.random.default_rng(seed)
    w = rng.integers(-wmax, wmax + 1, (6, 288)).astype(np.int8)
    room = np.abs(w.astype(np.int64)).sum(axis=1) * 128
    bias = (M32 - room - rng.integers(0, 10**5, 6)).astype(np.int32)  # just inside the certificate
    assert np.asarray(certify_no_saturation(w, bias, (-128, 127))).all()
    x = rng.integers(-128, 128, (4, 288)).astype(np.int8)
    acc0 = jnp.asarray(np.broadcast_to(bias, (4, 6)))
    assert bool(_fast_bound_ok(acc0, jnp.asarray(x), jnp.asarray(w), M32, (-128, 127), exact_weights=True))


# ------------------------------------------------- vmap (fast paths kept) and clip counts

VB, BB, NB, KB = 3, 2, 3, 33  # fixed shapes: hypothesis draws values, not shapes
_PERM = [int(i) for i in np.random.default_rng(12).permutation(KB)]
_PERM = _PERM[:10] + [-1] + _PERM[10:] + [-1, -1]  # with empty lanes


@functools.lru_cache(maxsize=None)
def _vmapped(kind, permuted, chunk):
    """vmap (or vmap of jit) of mac over x and acc0, one function per static setting."""
    order = _PERM if permuted else None
    f = lambda a, x, w: mac(a, x, w, order=order, chunk=chunk, return_clipped=True)
    return jax.vmap(jax.jit(f) if kind == "vmap_jit" else f, in_axes=(0, 0, None))


@st.composite
def vmap_case(draw):
    chunk = draw(st.sampled_from([1, 3]))
    ints8 = st.integers(-128, 127)
    x = np.array(draw(st.lists(ints8, min_size=VB * BB * KB, max_size=VB * BB * KB)), np.int8)
    w = np.array(draw(st.lists(ints8, min_size=NB * KB, max_size=NB * KB)), np.int8).reshape(NB, KB)
    if draw(st.booleans()):  # some rows may clip: the slow path for the whole vmapped batch
        near = st.sampled_from([M32, -M32, -M32 - 1, M32 - 5000, -M32 + 5000, 0, M32 - 70000])
        acc0 = draw(st.lists(near, min_size=VB * BB * NB, max_size=VB * BB * NB))
    else:  # far from the bounds: a proof holds and the fast path is taken
        small = st.integers(-(10**6), 10**6)
        acc0 = draw(st.lists(small, min_size=VB * BB * NB, max_size=VB * BB * NB))
    acc0 = np.array(acc0, np.int64).astype(np.int32).reshape(VB, BB, NB)
    return acc0, x.reshape(VB, BB, KB), w, draw(st.booleans()), chunk


def _want_stacked(acc0, x, w, order, chunk, acc_bits):
    runs = [py_mac_all(acc0[v], x[v], w, order, chunk, acc_bits, clips=True) for v in range(x.shape[0])]
    return np.stack([r[0] for r in runs]), np.stack([r[1] for r in runs])


@settings(max_examples=20)
@given(vmap_case(), st.sampled_from(["vmap", "vmap_jit"]))
def test_vmap_matches_python_model(case, kind):
    """vmap and vmap-of-jit of mac (acc and clip counts) equal the big-integer model."""
    acc0, x, w, permuted, chunk = case
    want = _want_stacked(acc0, x, w, _PERM if permuted else range(KB), chunk, 32)
    assert_pair_equal(_vmapped(kind, permuted, chunk)(acc0, x, w), want)


def _vmap_data(seed=21, v=3, b=2, n=4, k=24):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (v, b, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    acc0 = rng.choice([M32, -M32, -M32 - 1, M32 - 10**5, 0, 12345], (v, b, n)).astype(np.int32)
    return acc0, x, w


def test_vmap_in_axes_and_nesting():
    """Every in_axes combination (w or acc0 batched too, or alone; chunk=1) and nested
    vmap/jit (chunk=3)."""
    acc0, x, w = _vmap_data()
    chunk = 1
    v = x.shape[0]
    ws = np.stack([w, -w, w[::-1]])  # per-instance weights
    rk = range(x.shape[-1])
    f = lambda a, xx, ww: mac(a, xx, ww, chunk=chunk, return_clipped=True)
    model = lambda a, xx, ww: py_mac_all(a, xx, ww, rk, chunk, clips=True)
    stack = lambda runs: (np.stack([r[0] for r in runs]), np.stack([r[1] for r in runs]))
    cases = [
        ((0, 0, None), (acc0, x, w), [(acc0[i], x[i], w) for i in range(v)]),
        ((0, 0, None), (acc0[:, 0, :], x, w), [(acc0[i, 0], x[i], w) for i in range(v)]),  # acc0 (N,) each
        ((None, 0, None), (acc0[0], x, w), [(acc0[0], x[i], w) for i in range(v)]),
        ((0, None, None), (acc0, x[0], w), [(acc0[i], x[0], w) for i in range(v)]),
        ((None, 0, 0), (acc0[0], x, ws), [(acc0[0], x[i], ws[i]) for i in range(v)]),  # w batched
        ((0, 0, 0), (acc0, x, ws), [(acc0[i], x[i], ws[i]) for i in range(v)]),
    ]
    for in_axes, args, per in cases:
        assert_pair_equal(jax.vmap(f, in_axes=in_axes)(*args), stack([model(*p) for p in per]))
    # Nested: vmap of vmap, vmap of jit of vmap, jit of vmap of vmap over (2, 3, B, K).
    chunk = 3
    x2, a2 = np.stack([x, x[::-1]]), np.stack([acc0, acc0[:, ::-1]])
    want = tuple(np.stack(p) for p in zip(*[stack([model(a2[j, i], x2[j, i], w) for i in range(v)]) for j in range(2)]))
    g = lambda a, xx: f(a, xx, w)
    for fn in (jax.vmap(jax.vmap(g)), jax.vmap(jax.jit(jax.vmap(g))), jax.jit(jax.vmap(jax.vmap(g)))):
        assert_pair_equal(fn(a2, x2), want)


def test_vmap_keeps_the_cond():
    """Under vmap the path choice stays a conditional (one path runs), not a select of both."""
    acc0, x, w = _vmap_data()
    ws = np.stack([w, w, w])
    for chunk in (1, 32):
        f = lambda a, xx, ww: mac(a, xx, ww, chunk=chunk)
        kept = jax.jit(jax.vmap(f, in_axes=(0, 0, None))).lower(acc0, x, w).as_text()
        assert "stablehlo.case" in kept or "stablehlo.if" in kept
        # With w batched the rows no longer share weights: the plain vmap (both branches).
        fallback = jax.jit(jax.vmap(f, in_axes=(0, 0, 0))).lower(acc0, x, ws).as_text()
        assert "stablehlo.case" not in fallback and "stablehlo.if" not in fallback


def test_clip_counts_edges():
    """acc0 = -2**31 counts one clip at the first step; clipping and recovering counts
    every clipping step; the fast path reports zeros; an empty chunk can clip."""
    x = np.array([[0, 0, 0, 0], [127, 127, -128, -128]], np.int8)
    w = np.array([[127, 127, 127, 127], [1, 1, 1, 1]], np.int8)
    acc0 = np.array([[-(2**31), M32 - 100], [M32 - 100, -(2**31)]], np.int32)
    for chunk, order in ((1, None), (3, None), (2, [-1, -1, 0, 1, 2, 3])):  # the last: an empty chunk
        want = py_mac_all(acc0, x, w, range(4) if order is None else order, chunk, clips=True)
        assert_pair_equal(mac(acc0, x, w, chunk=chunk, order=order, return_clipped=True), want)
        assert_pair_equal(mac_reference(acc0, x, w, chunk=chunk, order=order, return_clipped=True), want)
    assert py_mac(M32 - 100, x[1], w[0], range(4), 1, clips=True) == (M32 - 127 * 256, 2)
    acc, clipped = mac(np.int32(5), x, w, return_clipped=True)  # proved at trace time
    np.testing.assert_array_equal(np.asarray(acc), 5 + x.astype(np.int64) @ w.T.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(clipped), np.zeros((2, 2)))
    a = np.array([[0, -(10**6)], [10**6, 0]], np.int32)  # traced: proved at run time
    got = jax.jit(lambda t: mac(t, x, w, chunk=1, return_clipped=True))(a)
    assert_pair_equal(got, py_mac_all(a, x, w, range(4), 1, clips=True))
    # chunk=1, three screened blocks of 200 products: safe, clipping, safe (passed by the
    # screen, walked only for the block that may clip): the counts survive the safe blocks.
    xl = np.full((2, 600), 100, np.int8)
    wl = np.concatenate([np.tile([3, -3], 100), np.full(200, 127), np.full(200, -50)])
    wl = np.stack([wl, -wl]).astype(np.int8)
    al = np.array([[M32 - 10**6, 0], [0, -M32 + 10**6]], np.int32)
    want = py_mac_all(al, xl, wl, range(600), 1, clips=True)
    assert want[1][0, 0] > 100 and want[1][1, 1] > 100 and want[1][0, 1] == want[1][1, 0] == 0
    assert_pair_equal(mac(al, xl, wl, chunk=1, return_clipped=True), want)


def test_grad_under_vmap():
    """Float inputs: vmap of grad, grad of vmap (w shared or batched) equal per-example grads."""
    _, x, w = _vmap_data(seed=22)
    rng = np.random.default_rng(23)  # accumulators exact in float32, some at the bounds' edge
    acc0 = rng.choice([2**31 - 128, -(2**31) + 128, 2**31 - 2**16, 0, 12345], (3, 2, 4)).astype(np.int32)
    xf, wf, af = x.astype(np.float32), w.astype(np.float32), acc0.astype(np.float32)
    loss = lambda a, xx, ww: (mac(a, xx, ww, chunk=4) * jnp.arange(1.0, 5.0)).sum()
    per = [jax.grad(loss, argnums=(0, 1, 2))(af[i], xf[i], wf) for i in range(x.shape[0])]
    g_vg = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, None))(af, xf, wf)
    g_gv = jax.grad(lambda a, xx, ww: jax.vmap(loss, in_axes=(0, 0, None))(a, xx, ww).sum(), argnums=(0, 1, 2))(
        af, xf, wf
    )
    for j in range(2):
        np.testing.assert_array_equal(np.asarray(g_vg[j]), np.stack([p[j] for p in per]))
        np.testing.assert_array_equal(np.asarray(g_gv[j]), np.stack([p[j] for p in per]))
    np.testing.assert_array_equal(np.asarray(g_vg[2]), np.stack([p[2] for p in per]))
    np.testing.assert_array_equal(np.asarray(g_gv[2]), sum(np.asarray(p[2]) for p in per))
    assert np.any(np.asarray(g_vg[0]) == 0)  # some outputs saturate: their gradient is zeroed
    wb = np.stack([wf, -wf, wf])
    g_wb = jax.vmap(jax.grad(loss, argnums=2))(af, xf, wb)
    np.testing.assert_array_equal(
        np.asarray(g_wb), np.stack([jax.grad(loss, argnums=2)(af[i], xf[i], wb[i]) for i in range(3)])
    )
    # The clip counts of the float path, under vmap: those of the integer model.
    acc, clipped = jax.vmap(lambda a, xx: mac(a, xx, wf, chunk=4, return_clipped=True))(af, xf)
    want = _want_stacked(acc0, x, w, range(x.shape[-1]), 4, 32)
    assert want[1].any()
    np.testing.assert_array_equal(np.asarray(clipped), want[1])
    np.testing.assert_array_equal(np.asarray(acc), want[0].astype(np.float32))
