"""core.int_dot (the one exact integer dot) and core.to_float16 (exact fp16 rounding).

Both exist for the GPU: XLA's int8 dot there returned twice the true sums (jax 0.11.2,
H100), and XLA may drop a float32 -> float16 -> float32 round trip there. On CPU the
routes are forced, so the float route that GPUs take is checked here too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax import core
from hwjax.errors import ArgTypeError, RangeError, ShapeError

DIMS = (((2,), (2,)), ((0,), (0,)))  # x (G, B, K) . w (G, N, K) -> (G, B, N)


def _model(x, w):
    """int64 einsum wrapped to int32, the documented result."""
    v = np.einsum("gbk,gnk->gbn", x.astype(np.int64), w.astype(np.int64))
    return ((v + 2**31) % 2**32 - 2**31).astype(np.int32)


_int_dot_jit = jax.jit(core.int_dot, static_argnums=2, static_argnames="route")


@pytest.mark.parametrize("route", ["int", "float", "auto"])
@pytest.mark.parametrize(
    "dts", [(np.int8, np.int8), (np.uint8, np.int8), (np.int16, np.int8), (np.int16, np.int16), (np.int32, np.int8)]
)
@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1))
def test_int_dot_equals_the_integer_model(route, dts, seed):
    rng = np.random.default_rng(seed)
    # 8 x 8 bits: more than one float piece (1024 products each); wider products: 4 per piece
    k = 1500 if max(np.dtype(d).itemsize for d in dts) == 1 else 18

    def draw(dt, shape):
        info = np.iinfo(dt)
        lo, hi = (info.min, info.max) if dt != np.int32 else (-(2**20), 2**20)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dt)

    x, w = draw(dts[0], (2, 3, k)), draw(dts[1], (2, 4, k))
    got = _int_dot_jit(x, w, DIMS, route=route)  # one program per shape and route, not per example
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), _model(x, w))


def test_int_dot_extremes_and_int32_wrapping():
    x = np.full((1, 1, 3000), -128, np.int8)  # every float piece at its largest partial sum, 2**24
    for route in ("int", "float"):
        np.testing.assert_array_equal(np.asarray(core.int_dot(x, x, DIMS, route=route)), _model(x, x))
    big = np.full((1, 1, 4), -(2**31), np.int32)  # 4 * 2**62 wraps to 0 modulo 2**32
    np.testing.assert_array_equal(np.asarray(core.int_dot(big, big + 1, DIMS)), _model(big, big + 1))


def test_int_dot_under_vmap_and_plain_layouts():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (5, 7, 33)).astype(np.int8)
    w = rng.integers(-128, 128, (9, 33)).astype(np.int8)
    f = jax.vmap(lambda a: core.int_dot(a, w, (((1,), (1,)), ((), ())), route="float"))
    want = np.einsum("vbk,nk->vbn", x.astype(np.int64), w.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    got = core.int_dot(x[0].tolist(), np.int64(w).T, (((1,), (0,)), ((), ())))  # lists and int64 arrays
    np.testing.assert_array_equal(np.asarray(got), want[0])


def test_int_dot_rejects_bad_arguments():
    x8 = np.zeros((2, 3), np.int8)
    with pytest.raises(ArgTypeError, match="x must be an int8"):
        core.int_dot(x8.astype(np.float32), x8, (((1,), (1,)), ((), ())))
    with pytest.raises(ArgTypeError, match="w must be an int8"):
        core.int_dot(x8, x8.astype(np.uint32), (((1,), (1,)), ((), ())))
    with pytest.raises(RangeError, match="w"):
        core.int_dot(x8, np.full((2, 3), 2**40), (((1,), (1,)), ((), ())))
    with pytest.raises(ShapeError, match="dimension_numbers"):
        core.int_dot(x8, x8, (((1,), (0,)), ((), ())))
    with pytest.raises(ShapeError, match="dimension_numbers"):
        core.int_dot(x8, x8, "rows")
    with pytest.raises(ShapeError, match="dimension_numbers"):
        core.int_dot(x8, x8, (((5,), (1,)), ((), ())))
    with pytest.raises(ValueError, match="route"):
        core.int_dot(x8, x8, (((1,), (1,)), ((), ())), route="fast")


# ------------------------------------------------ the CPU's 8-bit forms (uint8 x int8, int8 x int8)

#: (x shape, w shape, dimension numbers): plain, batched, contracting first, several free
#: axes, batch axes out of order
LAYOUTS = [
    ((5, 7), (3, 7), (((1,), (1,)), ((), ()))),
    ((2, 5, 7), (4, 2, 7), (((2,), (2,)), ((0,), (1,)))),
    ((7, 5), (7, 3), (((0,), (0,)), ((), ()))),
    ((2, 3, 4, 6), (6, 5), (((3,), (0,)), ((), ()))),
    ((3, 4, 6, 2), (2, 6, 5), (((2,), (1,)), ((3,), (0,)))),
    ((2, 3, 5, 4), (3, 4, 5, 2), (((2, 3), (2, 1)), ((1, 0), (0, 3)))),
]


def _wide_model(x, w, dims):
    """int64 ``dot_general(x, w, dims)`` (an einsum) wrapped to int32, the documented result."""
    (cx, cw), (bx, bw) = dims
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    xl = [next(letters) for _ in range(x.ndim)]
    wl = [next(letters) for _ in range(w.ndim)]
    for i, j in zip(cx + bx, cw + bw):
        wl[j] = xl[i]
    out = [xl[i] for i in bx] + [xl[i] for i in range(x.ndim) if i not in cx + bx]
    out += [wl[j] for j in range(w.ndim) if j not in cw + bw]
    v = np.einsum(f"{''.join(xl)},{''.join(wl)}->{''.join(out)}", x.astype(np.int64), w.astype(np.int64))
    return ((v + 2**31) % 2**32 - 2**31).astype(np.int32)


def _draw(rng, dt, shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_u8s8_dot_equals_the_integer_model_eager_jit_vmap(layout):
    xs, ws, dims = LAYOUTS[layout]
    rng = np.random.default_rng(layout)
    u, w = _draw(rng, np.uint8, xs), _draw(rng, np.int8, ws)
    want = _wide_model(u, w, dims)
    f = lambda a, b: core.u8s8_dot(a, b, dims)
    for got in (f(jnp.asarray(u), jnp.asarray(w)), jax.jit(f)(u, w)):
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(got), want)
    u2, w2 = np.stack([u, 255 - u]), np.stack([w, -1 - w])
    want2 = np.stack([want, _wide_model(255 - u, -1 - w, dims)])
    np.testing.assert_array_equal(np.asarray(jax.vmap(f)(u2, w2)), want2)  # both mapped
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(f, in_axes=(1, None))(np.moveaxis(u2, 0, 1), w)),
        np.stack([want, _wide_model(255 - u, w, dims)]),
    )  # x mapped, not first
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(f, in_axes=(None, -1))(u, np.moveaxis(w2, 0, -1))),
        np.stack([want, _wide_model(u, -1 - w, dims)]),
    )  # w mapped, last


def test_u8s8_dot_extremes_wrap_like_int32():
    # 255 * -128 summed 70000 times leaves int32: no 16-bit saturation (vpmaddubsw) and
    # int32 wrapping as documented
    k, dims = 70_000, (((1,), (1,)), ((), ()))
    for xv, wv in ((255, -128), (255, 127), (0, -128), (1, -1)):
        u, w = np.full((2, k), xv, np.uint8), np.full((3, k), wv, np.int8)
        got = np.asarray(core.u8s8_dot(jnp.asarray(u), jnp.asarray(w), dims))
        np.testing.assert_array_equal(got, np.full((2, 3), (xv * wv * k + 2**31) % 2**32 - 2**31, np.int32))
    with pytest.raises(ArgTypeError, match="uint8 and an int8"):
        core.u8s8_dot(jnp.zeros((2, 2), jnp.int8), jnp.zeros((2, 2), jnp.int8), dims)
    with pytest.raises(ShapeError, match="different sizes: u"):
        core.u8s8_dot(jnp.zeros((2, 3), jnp.uint8), jnp.zeros((2, 2), jnp.int8), dims)
    with pytest.raises(ShapeError, match="outside u"):
        core.u8s8_dot(jnp.zeros((2, 2), jnp.uint8), jnp.zeros((2, 2), jnp.int8), (((2,), (1,)), ((), ())))


@pytest.mark.parametrize("lhs", [np.uint8, np.int8])
@pytest.mark.parametrize("xdt", [np.int8, np.uint8])
def test_int_dot_cpu_8bit_forms_are_exact(monkeypatch, lhs, xdt):
    """Each CPU form (the left operand moved to uint8 or to int8, its top bit flipped and
    the right operand's sums corrected) on every layout, extremes included."""
    import hwjax.core._dot as D

    monkeypatch.setattr(D, "lhs8_dtype", lambda: np.dtype(lhs))
    rng = np.random.default_rng(7)
    for xs, ws, dims in LAYOUTS:
        x, w = _draw(rng, xdt, xs), _draw(rng, np.int8, ws)
        x.flat[0], w.flat[0] = np.iinfo(xdt).min, -128
        want = _wide_model(x, w, dims)
        f = jax.jit(lambda a, b, dims=dims: core.int_dot(a, b, dims, route="int"))
        np.testing.assert_array_equal(np.asarray(f(x, w)), want)
        got = jax.vmap(lambda a, dims=dims: core.int_dot(a, w, dims, route="int"))(np.stack([x, x]))
        np.testing.assert_array_equal(np.asarray(got), np.stack([want, want]))
    k = 70_000  # the correction wraps with the sums
    x, w = np.full((1, k), np.iinfo(xdt).max, xdt), np.full((2, k), -128, np.int8)
    got = core.int_dot(x, w, (((1,), (1,)), ((), ())), route="int")
    np.testing.assert_array_equal(np.asarray(got), _wide_model(x, w, (((1,), (1,)), ((), ()))))


def test_lhs8_dtype_and_the_dot_xla_sees():
    dt = core.lhs8_dtype()
    assert dt in (np.dtype(np.uint8), np.dtype(np.int8))
    if jax.default_backend() != "cpu":
        assert dt == np.int8
        return
    text = (
        jax.jit(lambda a, b: core.int_dot(a, b, (((1,), (1,)), ((), ()))))
        .lower(jnp.zeros((4, 8), jnp.int8), jnp.zeros((3, 8), jnp.int8))
        .as_text()
    )
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert dots and all(("xui8>" in d) == (dt == np.uint8) and "xi32>, tensor" not in d for d in dots), dots


def _fp16_models(x):
    """numpy's correctly rounded conversion, and toward zero derived from it."""
    with np.errstate(all="ignore"):
        rne = x.astype(np.float16)
    bits = rne.view(np.uint16).copy()
    too_far = np.isfinite(x) & (np.abs(rne.astype(np.float32)) > np.abs(x))
    bits[too_far] -= 1
    bits[np.isfinite(x) & (np.abs(x) >= 65504)] = (
        np.signbit(x[np.isfinite(x) & (np.abs(x) >= 65504)]).astype(np.uint16) << 15
    ) | 0x7BFF
    return rne, bits.view(np.float16)


@settings(max_examples=30)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=64, max_size=64))
def test_to_float16_equals_ieee_rounding(words):
    u = np.array(words, np.uint32)
    u[:32] = (u[:32] % 0x18000000) + 0x30000000  # half of them in and around fp16's range
    x = u.view(np.float32)
    rne, rz = _fp16_models(x)
    got = np.asarray(jax.jit(core.to_float16)(x))
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], rne.view(np.uint16)[~nan])
    got_rz = np.asarray(core.to_float16(x, rounding="toward_zero"))
    np.testing.assert_array_equal(got_rz.view(np.uint16)[~nan], rz.view(np.uint16)[~nan])


def test_to_float16_edges_vmap_and_grad():
    x = np.float32([0.0, -0.0, 2.0**-25, 2.0**-25 * 1.5, 2.0**-24, 65504.0, 65519.0, 65520.0, 1e30, -np.inf, 3e-39])
    rne, rz = _fp16_models(x)
    got = np.asarray(jax.vmap(core.to_float16)(x))
    np.testing.assert_array_equal(got.view(np.uint16), rne.view(np.uint16))
    got_rz = np.asarray(core.to_float16(x, rounding="toward_zero"))
    np.testing.assert_array_equal(got_rz.view(np.uint16)[:-2], rz.view(np.uint16)[:-2])
    g = jax.grad(lambda v: jnp.sum(core.to_float16(v).astype(jnp.float32)))(jnp.float32([1.3, -7.1]))
    np.testing.assert_array_equal(np.asarray(g), [1.0, 1.0])
    with pytest.raises(ArgTypeError, match="x must be a float"):
        core.to_float16(np.int32([1]))
    with pytest.raises(ValueError, match="rounding"):
        core.to_float16(np.float32([1]), rounding="up")


def test_rows_times_a_matrix_is_a_plain_2d_dot():
    """An 8-bit CPU dot of rows (..., K) with a matrix is emitted as one 2-D dot: with a
    (32, 1, 1, 128) left operand XLA:CPU transposed the right one and, single-threaded,
    kept the dot out of its library, widened to int32 (ad01 on xs3: 3x the compile time)."""
    x, w = jnp.zeros((32, 1, 1, 128), jnp.int8), jnp.zeros((64, 128), jnp.int8)
    f = jax.jit(lambda a, b: core.int_dot(a, b, (((3,), (1,)), ((), ()))))
    if jax.default_backend() == "cpu":
        dots = [line for line in f.lower(x, w).as_text().splitlines() if "dot_general" in line]
        assert any("tensor<32x128x" in d for d in dots) and not any("x1x1x" in d for d in dots), dots
    rng = np.random.default_rng(3)
    xv, wv = rng.integers(-128, 128, (5, 2, 3, 7)).astype(np.int8), rng.integers(-128, 128, (4, 7)).astype(np.int8)
    want = np.einsum("abck,nk->abcn", xv.astype(np.int64), wv.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(f(xv, wv)), want)
