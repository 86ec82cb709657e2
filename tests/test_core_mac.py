"""mac vs a plain-Python model and vs mac_reference: orders, chunks, routes, saturation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax.core import mac, mac_reference

M32 = 2**31 - 1


def py_mac(acc0, x, w, order, chunk, acc_bits=32):
    """The definition, with Python integers: one output."""
    m = 2 ** (acc_bits - 1) - 1
    order = list(order) + [-1] * ((-len(order)) % chunk)
    acc = int(acc0)
    for c in range(0, len(order), chunk):
        s = sum(int(x[k]) * int(w[k]) for k in order[c:c + chunk] if k >= 0)
        acc = min(max(acc + s, -m), m)
    return acc


def py_mac_all(acc0, x, w, order, chunk, acc_bits=32):
    b, n = x.shape[0], w.shape[0]
    acc0 = np.broadcast_to(acc0, (b, n))
    return np.array([[py_mac(acc0[i, j], x[i], w[j], order, chunk, acc_bits) for j in range(n)]
                     for i in range(b)], dtype=np.int64)


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
    want = py_mac_all(acc0, x, w, range(x.shape[1]) if order is None else order, chunk, acc_bits)
    kw = dict(order=order, chunk=chunk, acc_bits=acc_bits)
    np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, **kw)), want)
    np.testing.assert_array_equal(np.asarray(mac(acc0, x, w, route="float", **kw)), want)
    np.testing.assert_array_equal(np.asarray(mac_reference(acc0, x, w, **kw)), want)


@given(st.integers(0, 2**16), st.sampled_from([1, 4, 16]))
def test_mac_int16_operands(seed, chunk):
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**15), 2**15, (2, 20)).astype(np.int16)
    w = rng.integers(-(2**15), 2**15, (3, 20)).astype(np.int16) if chunk == 1 else \
        rng.integers(-128, 128, (3, 20)).astype(np.int8)
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
            np.testing.assert_array_equal(np.asarray(mac(acc, x16, w16, chunk=1, route=route)),
                                          py_mac_all(acc, x16, w16, range(6), 1))
    rng = np.random.default_rng(11)
    xs = rng.integers(-128, 128, (3, 300)).astype(np.int8)
    ws = rng.integers(-128, 128, (4, 300)).astype(np.int8)
    a12 = rng.integers(-2048, 2048, (3, 4)).astype(np.int32)
    for chunk in (1, 4):
        np.testing.assert_array_equal(np.asarray(mac(a12, xs, ws, chunk=chunk, acc_bits=12)),
                                      py_mac_all(a12, xs, ws, range(300), chunk, acc_bits=12))


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
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda a: mac(0.0, a, w, chunk=1).sum())(x[:1])),
                                  np.asarray(jax.grad(f)(x[:1])))


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
