"""hwjax.core geometry: ConvGeometry against jax.lax conventions, extract_patches and
window_taps against a plain-Python loop (pad values, strides, dilation, crops), under
jit, vmap and grad; no gathers; argument errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax.core import ConvGeometry, extract_patches, pool_out_hw, window_products_sum, window_taps
from hwjax.core._geometry import UNROLLED_TAPS

_DN = ("NHWC", "HWIO", "NHWC")


# ------------------------------------------------------------ plain-Python model


def py_patches(x: np.ndarray, start, stride, dilation, kernel, out_hw, pad_value) -> np.ndarray:
    """patches[..., oy, ox, (i*kw + j)*C + c] = x[..., r, s, c] (pad_value outside), loops."""
    h, w, c = x.shape[-3:]
    (kh, kw), (oh, ow) = kernel, out_hw
    out = np.empty(x.shape[:-3] + (oh, ow, kh * kw * c), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            for i in range(kh):
                for j in range(kw):
                    r = start[0] + oy * stride[0] + i * dilation[0]
                    s = start[1] + ox * stride[1] + j * dilation[1]
                    t = (i * kw + j) * c
                    out[..., oy, ox, t : t + c] = x[..., r, s, :] if 0 <= r < h and 0 <= s < w else pad_value
    return out


def py_geometry_patches(x, g: ConvGeometry, pad_value):
    return py_patches(x, g.window_start, g.stride, g.dilation, g.kernel, g.out_hw, pad_value)


# ----------------------------------------------------- geometry vs jax.lax conventions


def _lax_out_hw(in_hw, kernel, stride, padding, dilation):
    """Output (H, W) of jax.lax.conv_general_dilated with this geometry (shape only)."""
    shape = jax.eval_shape(
        functools.partial(
            jax.lax.conv_general_dilated,
            window_strides=stride,
            padding=padding,
            rhs_dilation=dilation,
            dimension_numbers=_DN,
        ),
        jax.ShapeDtypeStruct((1, *in_hw, 1), jnp.float32),
        jax.ShapeDtypeStruct((*kernel, 1, 1), jnp.float32),
    ).shape
    return tuple(shape[1:3])


small = st.integers(1, 4)


@settings(max_examples=80)
@given(
    h=st.integers(1, 20),
    w=st.integers(1, 20),
    kh=small,
    kw=small,
    sv=small,
    sh=small,
    dv=small,
    dh=small,
    padding=st.one_of(
        st.sampled_from(["SAME", "VALID"]),
        st.integers(0, 3),
        st.tuples(st.tuples(st.integers(0, 3), st.integers(0, 3)), st.tuples(st.integers(0, 3), st.integers(0, 3))),
    ),
)
def test_make_matches_lax(h, w, kh, kw, sv, sh, dv, dh, padding):
    """out_hw and the explicit padding agree with jax.lax (SAME via padtype_to_pads on the
    dilated kernel); geometries without output pixels raise."""
    lax_pad = ((padding,) * 2,) * 2 if isinstance(padding, int) else padding
    if padding == "SAME":
        eff = ((kh - 1) * dv + 1, (kw - 1) * dh + 1)
        want_pads = tuple(tuple(int(v) for v in p) for p in jax.lax.padtype_to_pads((h, w), eff, (sv, sh), "SAME"))
    elif padding == "VALID":
        want_pads = ((0, 0), (0, 0))
    else:
        want_pads = lax_pad
    want_out = tuple(
        (n + sum(p) - ((k - 1) * d + 1)) // s + 1
        for n, p, k, s, d in zip((h, w), want_pads, (kh, kw), (sv, sh), (dv, dh))
    )
    if min(want_out) < 1:
        with pytest.raises(ValueError, match="no output pixels"):
            ConvGeometry.make((h, w), (kh, kw), (sv, sh), padding, (dv, dh))
        return
    g = ConvGeometry.make((h, w), (kh, kw), (sv, sh), padding, (dv, dh))
    assert g.padding == want_pads
    assert g.out_hw == want_out == _lax_out_hw((h, w), (kh, kw), (sv, sh), lax_pad, (dv, dh))
    assert g.pad_top_left == (want_pads[0][0], want_pads[1][0])
    assert g.window_start == (-want_pads[0][0], -want_pads[1][0])
    assert g.effective_kernel == ((kh - 1) * dv + 1, (kw - 1) * dh + 1)
    assert g.inside == (max(max(p) for p in want_pads) == 0)


@settings(max_examples=50)
@given(
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    kh=small,
    kw=small,
    sv=small,
    sh=small,
    r0=st.integers(-2, 3),
    c0=st.integers(-2, 3),
)
def test_pool_out_hw_matches_reduce_window(h, w, kh, kw, sv, sh, r0, c0):
    """VALID pools: pool_out_hw is reduce_window's shape on the image cropped at the start."""
    if r0 < 0 or c0 < 0:
        with pytest.raises(ValueError, match="window_start"):
            pool_out_hw((h, w), (kh, kw), (sv, sh), (r0, c0))
        return
    hh, ww = h - r0, w - c0
    if hh < kh or ww < kw:
        with pytest.raises(ValueError, match="fits inside"):
            pool_out_hw((h, w), (kh, kw), (sv, sh), (r0, c0))
        return
    shape = jax.eval_shape(
        lambda a: jax.lax.reduce_window(a, 0.0, jax.lax.add, (kh, kw), (sv, sh), "VALID"),
        jax.ShapeDtypeStruct((hh, ww), jnp.float32),
    ).shape
    assert pool_out_hw((h, w), (kh, kw), (sv, sh), (r0, c0)) == tuple(shape)
    if (r0, c0) == (0, 0):
        assert ConvGeometry.make((h, w), (kh, kw), (sv, sh), "VALID").out_hw == tuple(shape)
    # the stride defaults to the window
    assert pool_out_hw((h, w), (kh, kw), window_start=(r0, c0)) == pool_out_hw((h, w), (kh, kw), (kh, kw), (r0, c0))


def test_from_window_round_trip():
    """from_window gives exactly the requested out_hw; negative padding entries crop."""
    g = ConvGeometry.from_window((10, 9), (3, 2), (2, -1), (2, 3), (3, 4))
    assert g.out_hw == (3, 4)
    assert g.window_start == (2, -1)
    assert g.padding == ((-2, 2 + 2 * 2 + 3 - 10), (1, -1 + 3 * 3 + 2 - 9))
    assert not g.inside
    assert ConvGeometry.from_window((8, 8), (2, 2), (1, 1), (2, 2), (3, 3)).inside
    # equal geometries are equal and hash equal (static jit arguments); lists normalise
    a = ConvGeometry((5, 5), (3, 3), (1, 1), ((1, 1), (1, 1)))
    b = ConvGeometry([5, 5], [3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1])
    assert a == b and hash(a) == hash(b) and a.dilation == (1, 1)
    assert ConvGeometry.make((5, 5), (3, 3), 1, 1) == a == ConvGeometry.make((5, 5), (3, 3), (1, 1), "SAME")
    assert ConvGeometry.make((5, 5), (3, 3), 1, (1, 2)).padding == ((1, 1), (2, 2))


# ------------------------------------------------------- patches vs the Python loop

# A handful of fixed geometries (one compilation each): (in_hw, C, geometry).
GEOMS = [
    ((7, 6), 3, ConvGeometry.make((7, 6), (3, 3), (1, 1), "SAME")),
    ((7, 6), 3, ConvGeometry.make((7, 6), (3, 2), (2, 3), ((2, 0), (1, 3)))),
    ((7, 6), 3, ConvGeometry.make((7, 6), (2, 3), (1, 2), "SAME", dilation=(2, 3))),
    ((7, 6), 3, ConvGeometry.make((7, 6), (1, 1), (3, 2), "VALID")),
    # legacy windows: starting inside the image, stopping before its end, running past it
    ((7, 6), 3, ConvGeometry.from_window((7, 6), (2, 2), (1, 2), (2, 1), (2, 3))),
    ((7, 6), 3, ConvGeometry.from_window((7, 6), (3, 3), (-2, 3), (3, 2), (3, 2))),
    # one output pixel (one slice): the whole image, a padded dilated window, a cropped one
    ((7, 6), 3, ConvGeometry.make((7, 6), (7, 6), (1, 1), "VALID")),
    ((7, 6), 3, ConvGeometry.make((7, 6), (3, 4), (5, 5), ((1, 0), (2, 0)), dilation=(3, 2))),
    ((7, 6), 3, ConvGeometry.from_window((7, 6), (2, 3), (4, 1), (1, 1), (1, 1))),
]


@functools.lru_cache(maxsize=None)
def _jitted(g: ConvGeometry):
    return jax.jit(lambda x, p: extract_patches(x, g, pad_value=p))


@pytest.mark.parametrize("case", range(len(GEOMS)))
@settings(max_examples=10)
@given(data=st.data())
def test_extract_patches_matches_loop(case, data):
    """int8 images, batch of 2, traced int8 / int32 pad values (including the extremes)."""
    hw, c, g = GEOMS[case]
    seed = data.draw(st.integers(0, 2**32 - 1))
    pad = data.draw(st.sampled_from([-128, 127, 0]) | st.integers(-128, 127))
    x = np.random.default_rng(seed).integers(-128, 128, (2, *hw, c)).astype(np.int8)
    want = py_geometry_patches(x, g, pad)
    for p in (jnp.int32(pad), jnp.int8(pad)):
        y = _jitted(g)(x, p)
        assert y.dtype == jnp.int8 and y.shape == (2, *g.out_hw, g.kernel[0] * g.kernel[1] * c)
        np.testing.assert_array_equal(np.asarray(y), want)


@pytest.mark.parametrize("case", [1, 5])
def test_extract_patches_eager(case):
    """Outside jit, no batch axis, a Python int pad value."""
    hw, c, g = GEOMS[case]
    x = np.random.default_rng(case).integers(-128, 128, (*hw, c)).astype(np.int8)
    np.testing.assert_array_equal(np.asarray(extract_patches(x, g, pad_value=-77)), py_geometry_patches(x, g, -77))


def test_window_taps_are_the_patch_blocks():
    hw, c, g = GEOMS[2]
    x = np.random.default_rng(1).integers(-128, 128, (*hw, c)).astype(np.int8)
    taps = window_taps(x, g, pad_value=-3)
    assert len(taps) == g.kernel[0] * g.kernel[1]
    want = py_geometry_patches(x, g, -3)
    for t, tap in enumerate(taps):
        np.testing.assert_array_equal(np.asarray(tap), want[..., t * c : (t + 1) * c])


@pytest.mark.parametrize(
    "hw, g",
    [
        ((7, 6), GEOMS[0][2]),  # 3x3, padded: unrolled taps
        ((7, 6), GEOMS[5][2]),  # a window that crops and runs past the image
        ((25, 5), ConvGeometry.make((25, 5), (25, 5), (1, 1), "VALID")),  # a whole-image pool: 125 taps
        ((9, 8), ConvGeometry.make((9, 8), (5, 4), (2, 3), "SAME")),  # 20 taps, padded and strided
    ],
)
def test_window_products_sum_is_the_loop_sum(hw, g):
    """Both forms (unrolled taps up to UNROLLED_TAPS, here 9; patches summed in one
    reduction above it, here 20 and 125) against int64 sums of the loop model's patches;
    8-bit extremes, a batch axis, under jit."""
    assert 9 <= UNROLLED_TAPS < 20
    c = 5
    rng = np.random.default_rng(g.kernel[0] * 31 + g.kernel[1])
    x = rng.integers(-128, 256, (3, *hw, c)).astype(np.int16)
    x[0] = 255
    k = rng.integers(-128, 128, (*g.kernel, c)).astype(np.int16)
    k[..., 0] = -128
    pad = -77
    p = py_geometry_patches(x, g, pad).reshape(3, *g.out_hw, g.kernel[0] * g.kernel[1], c)
    want = (p * k.reshape(-1, c).astype(np.int64)).sum(axis=-2)
    assert np.abs(want).max() < 2**31
    f = jax.jit(lambda x, k, p: window_products_sum(x, k, g, pad_value=p))
    y = f(x, k, jnp.int16(pad))
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(y), want)


def test_other_dtypes_and_leading_axes():
    """int32 / float32 images, two leading axes; the pad value takes x's dtype."""
    _, c, g = GEOMS[1]
    rng = np.random.default_rng(2)
    x = rng.integers(-(2**31), 2**31 - 1, (2, 3, 7, 6, c), dtype=np.int64).astype(np.int32)
    y = jax.jit(lambda x: extract_patches(x, g, pad_value=-(2**31)))(x)
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(y), py_geometry_patches(x, g, -(2**31)))
    xf = x[0, 0].astype(np.float32) / 7
    yf = jax.jit(lambda x: extract_patches(x, g, pad_value=jnp.int32(5)))(xf)
    assert yf.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(yf), _float_loop(xf, g, 5.0))


def _float_loop(x, g, pad):
    h, w, c = x.shape
    (kh, kw), (oh, ow) = g.kernel, g.out_hw
    out = np.empty((oh, ow, kh * kw * c), np.float32)
    for oy in range(oh):
        for ox in range(ow):
            for i in range(kh):
                for j in range(kw):
                    r = g.window_start[0] + oy * g.stride[0] + i * g.dilation[0]
                    s = g.window_start[1] + ox * g.stride[1] + j * g.dilation[1]
                    t = (i * kw + j) * c
                    out[oy, ox, t : t + c] = x[r, s] if 0 <= r < h and 0 <= s < w else pad
    return out


def test_vmap_over_images_and_pad_values():
    _, c, g = GEOMS[0]
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (4, 7, 6, c)).astype(np.int8)
    pads = jnp.asarray([-128, -1, 0, 127], jnp.int32)
    f = jax.jit(jax.vmap(lambda xi, p: extract_patches(xi, g, pad_value=p)))
    y = np.asarray(f(x, pads))
    for b in range(4):
        np.testing.assert_array_equal(y[b], py_geometry_patches(x[b], g, int(pads[b])))
    y2 = np.asarray(jax.jit(jax.vmap(lambda xi: extract_patches(xi, g, pad_value=jnp.int8(9))))(x))
    np.testing.assert_array_equal(y2, py_geometry_patches(x, g, 9))


def test_grad_counts_uses():
    """d sum(patches * v) / dx[r, s] = sum of v over the patch entries that read (r, s)."""
    _, c, g = GEOMS[2]
    rng = np.random.default_rng(4)
    x = rng.normal(size=(7, 6, c)).astype(np.float32)
    v = rng.integers(-3, 4, (*g.out_hw, g.kernel[0] * g.kernel[1] * c)).astype(np.float32)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(extract_patches(x, g, pad_value=1.5) * v)))(x)
    want = np.zeros((7, 6, c), np.float32)
    (kh, kw), (oh, ow) = g.kernel, g.out_hw
    for oy in range(oh):
        for ox in range(ow):
            for i in range(kh):
                for j in range(kw):
                    r = g.window_start[0] + oy * g.stride[0] + i * g.dilation[0]
                    s = g.window_start[1] + ox * g.stride[1] + j * g.dilation[1]
                    if 0 <= r < 7 and 0 <= s < 6:
                        want[r, s] += v[oy, ox, (i * kw + j) * c : (i * kw + j + 1) * c]
    np.testing.assert_array_equal(np.asarray(grad), want)


def test_no_gathers():
    """The patches come from a pad, slices (static, or at a traced tap origin in XLA:CPU's
    loop) and a concatenation or in-place updates: no gather, no scatter."""
    for _, c, g in GEOMS:
        jaxpr = str(
            jax.make_jaxpr(lambda x, p: extract_patches(x, g, pad_value=p))(
                jnp.zeros((2, 7, 6, c), jnp.int8), jnp.int32(0)
            )
        )
        assert "gather" not in jaxpr and "scatter" not in jaxpr


@pytest.mark.parametrize("path", ["_patches_by_slices", "_patches_by_loop"])
def test_both_ways_of_reading_the_patches(path):
    """XLA:CPU reads small patches with a loop, larger ones (and other platforms) with
    static slices (see ``hwjax.core._geometry``): each way on every geometry, jitted and
    under vmap, equals the Python loop."""
    from hwjax.core import _geometry

    def patches(x, p, g, width):
        grown, first = _geometry._grown(x, p, g)
        return getattr(_geometry, path)(grown, origins=_geometry._tap_origins(g, first), geom=g, width=width)

    def want(x, g, pad, extra):
        p = py_geometry_patches(x, g, pad)
        return np.concatenate([p, np.zeros((*p.shape[:-1], extra), p.dtype)], axis=-1)

    rng = np.random.default_rng(5)
    for hw, c, g in GEOMS:
        if g.kernel == (1, 1):
            continue  # a single tap is one slice either way
        x = rng.integers(-128, 128, (3, *hw, c)).astype(np.int8)
        for extra in (0, 5):  # the patches' width: the taps, then zeros
            f = jax.jit(functools.partial(patches, g=g, width=g.kernel[0] * g.kernel[1] * c + extra))
            np.testing.assert_array_equal(np.asarray(f(x, jnp.int8(-7))), want(x, g, -7, extra))
            y = jax.jit(jax.vmap(f))(x, jnp.asarray([-128, 0, 127], jnp.int8))
            for b, pad in enumerate((-128, 0, 127)):
                np.testing.assert_array_equal(np.asarray(y[b]), want(x[b], g, pad, extra))


def test_extract_patches_width_appends_zeros():
    hw, c, g = GEOMS[1]
    x = np.random.default_rng(2).integers(-128, 128, (2, *hw, c)).astype(np.int8)
    k = g.kernel[0] * g.kernel[1] * c
    y = np.asarray(extract_patches(x, g, pad_value=3, width=k + 4))
    assert np.array_equal(y[..., :k], py_geometry_patches(x, g, 3)) and not y[..., k:].any()
    with pytest.raises(Exception, match="width"):
        extract_patches(x, g, pad_value=3, width=k - 1)


def test_the_loop_is_for_small_patches():
    """The loop (a fori_loop, staged as a scan) is staged for patches of at most 2**20
    elements; larger ones are read by static slices only. Under vmap the choice sees the
    whole batch of integer images (the custom_vmap rule), as a batched call does."""
    from hwjax.core import _geometry

    g = ConvGeometry.make((16, 16), (3, 3), 1, "SAME")

    def staged(batch, vmapped=False):
        x = jax.ShapeDtypeStruct((batch, 16, 16, 8), jnp.int8)
        f = lambda v: extract_patches(v, g, pad_value=0)
        return str(jax.make_jaxpr(jax.vmap(f) if vmapped else f)(x))

    per_example = 16 * 16 * 9 * 8
    small, large = _geometry._LOOP_MAX_ELEMENTS // per_example, _geometry._LOOP_MAX_ELEMENTS // per_example + 1
    for vmapped in (False, True):
        assert "scan" in staged(small, vmapped) and "scan" not in staged(large, vmapped)


# ---------------------------------------------------------------------------- errors


def test_argument_errors():
    with pytest.raises(ValueError, match="no output pixels"):
        ConvGeometry.make((2, 5), (3, 3), 1, "VALID")
    with pytest.raises(ValueError, match="no output pixels"):
        ConvGeometry((4, 4), (3, 3), (1, 1), ((-2, 0), (0, 0)))
    with pytest.raises(ValueError, match=r"padding\[0\]\[1\] must lie in \[0, "):
        ConvGeometry.make((5, 5), (3, 3), 1, ((1, -1), (0, 0)))
    with pytest.raises(ValueError, match=r"padding must lie in \[0, "):
        ConvGeometry.make((5, 5), (3, 3), 1, -1)
    with pytest.raises(ValueError, match="padding must be 'SAME', 'VALID'"):
        ConvGeometry.make((5, 5), (3, 3), 1, "same")
    with pytest.raises(TypeError, match="padding must be"):
        ConvGeometry.make((5, 5), (3, 3), 1, (1, 2, 3))
    with pytest.raises(ValueError, match=r"stride\[1\] must lie in \[1, "):
        ConvGeometry.make((5, 5), (3, 3), (1, 0))
    with pytest.raises(ValueError, match=r"kernel\[0\] must lie in \[1, "):
        ConvGeometry.make((5, 5), (0, 3))
    with pytest.raises(ValueError, match=r"dilation\[0\] must lie in \[1, "):
        ConvGeometry.make((5, 5), (3, 3), dilation=(0, 1))
    with pytest.raises(TypeError, match=r"in_hw\[0\] must be a Python int"):
        ConvGeometry.make((5.0, 5), (3, 3))
    with pytest.raises(ValueError, match=r"out_hw\[1\] must lie in \[1, "):
        ConvGeometry.from_window((5, 5), (3, 3), (0, 0), (1, 1), (2, 0))
    with pytest.raises(TypeError, match="window_start must be an int or a pair"):
        ConvGeometry.from_window((5, 5), (3, 3), (0, 0, 0), (1, 1), (2, 2))
    g = ConvGeometry.make((5, 5), (3, 3), 1, "SAME")
    x = np.zeros((5, 5, 2), np.int8)
    with pytest.raises(ValueError, match=r"pad_value \(for x of dtype int8\) must lie in \[-128, 127\]"):
        extract_patches(x, g, pad_value=128)
    with pytest.raises(TypeError, match="pad_value must be an integer scalar for an integer x"):
        extract_patches(x, g, pad_value=0.5)
    with pytest.raises(TypeError, match="pad_value must be a scalar"):
        extract_patches(x, g, pad_value=np.zeros(2, np.int8))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., H, W, C\) with \(H, W\) = geom.in_hw"):
        extract_patches(np.zeros((5, 4, 2), np.int8), g, pad_value=0)
    with pytest.raises(TypeError, match="geom must be a ConvGeometry"):
        extract_patches(x, ((5, 5), (3, 3)), pad_value=0)


@pytest.mark.parametrize("n_lead, lead", [(1, (17,)), (2, (4, 6)), (1, (5,))])
@pytest.mark.parametrize("whole", [False, True])
def test_map_chunks_is_fn_on_the_whole_batch(n_lead, lead, whole):
    """map_chunks gives fn's pytree on the whole batch: a remainder chunk (17 = 2 * 8 + 1
    at an 8-example target), chunks that divide the batch over two leading axes (24 = 3 * 8),
    and a batch within one chunk; in one_pass() the same values without a loop."""
    import contextlib

    from hwjax.core import _program
    from hwjax.core import map_chunks, one_pass

    x = jnp.arange(np.prod(lead) * 4, dtype=jnp.int32).reshape(*lead, 2, 2)

    def fn(v):
        return {"s": v.sum(axis=(-2, -1)), "y": v * 3 - 1}

    per_example = _program.CHUNK_BYTES // 8  # a target of 8 examples per chunk
    with one_pass() if whole else contextlib.nullcontext():
        got = jax.jit(lambda v: map_chunks(fn, v, n_lead, per_example))(x)
        looped = "scan" in str(jax.make_jaxpr(lambda v: map_chunks(fn, v, n_lead, per_example))(x))
    assert looped == (np.prod(lead) > 8 and not whole)
    want = fn(x)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(
    "in_hw,kernel,stride,padding,c",
    [
        ((49, 10), (10, 4), (2, 2), "SAME", 1),  # KWS's first layer
        ((9, 7), (4, 2), (2, 2), "VALID", 3),
        ((11, 8), (6, 3), (3, 1), ((2, 1), (0, 2)), 2),
        ((8, 8), (2, 2), (2, 2), "SAME", 5),
    ],
)
def test_space_to_depth_patches_hold_the_strided_products(in_hw, kernel, stride, padding, c):
    """SUM over the unit-stride patches of the blocked image times the rearranged kernel is
    the strided convolution (an independent int64 loop over output pixels and taps)."""
    from hwjax.core import space_to_depth, space_to_depth_geometry, space_to_depth_kernel

    geom = ConvGeometry.make(in_hw, kernel, stride, padding)
    unit = space_to_depth_geometry(geom)
    assert unit is not None and unit.out_hw == geom.out_hw and unit.stride == (1, 1)
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (2, *in_hw, c)).astype(np.int32)
    k = rng.integers(-128, 128, (3, *kernel, c)).astype(np.int32)
    pad = 7
    p = extract_patches(space_to_depth(x, geom, pad_value=pad), unit, pad_value=pad)
    got = np.asarray(p).astype(np.int64) @ np.asarray(space_to_depth_kernel(k, geom)).reshape(3, -1).T.astype(np.int64)
    assert np.array_equal(got, _direct_conv(x, k, geom, pad))


def _direct_conv(x, k, geom, pad):
    """The convolution by an int64 loop over output pixels and taps (pad outside the image)."""
    (pt, _), (pl, _) = geom.padding
    (h, w), (sv, sh), (kh, kw) = geom.in_hw, geom.stride, geom.kernel
    want = np.zeros((x.shape[0], *geom.out_hw, k.shape[0]), np.int64)
    for oy in range(geom.out_hw[0]):
        for ox in range(geom.out_hw[1]):
            for i in range(kh):
                for j in range(kw):
                    r, q = oy * sv - pt + i * geom.dilation[0], ox * sh - pl + j * geom.dilation[1]
                    inside = 0 <= r < h and 0 <= q < w
                    v = x[:, r, q, :] if inside else np.full((x.shape[0], x.shape[-1]), pad)
                    want[:, oy, ox, :] += v.astype(np.int64) @ k[:, i, j, :].T.astype(np.int64)
    return want


@pytest.mark.parametrize(
    "in_hw,kernel,stride,padding,c,n_out",
    [
        ((49, 10), (10, 4), (2, 2), "SAME", 1, 64),  # KWS's first layer: space_to_depth
        ((12, 12), (3, 3), (2, 2), ((0, 1), (0, 1)), 3, 8),  # VWW's first layer: K 27 -> 32
        ((7, 7), (1, 1), (1, 1), "VALID", 8, 16),  # a pointwise layer with 8 inputs
        ((9, 7), (4, 2), (2, 2), "VALID", 3, 16),
        ((8, 9), (3, 3), (1, 1), "SAME", 5, 40),
    ],
)
def test_conv_dot_operands_give_the_convolution(in_hw, kernel, stride, padding, c, n_out):
    """``conv_dot_patches @ conv_dot_kernel.T`` is the convolution (an independent int64
    loop), whichever layout and contraction width the pair chose."""
    from hwjax.core import conv_dot_kernel, conv_dot_patches, dot_width

    geom = ConvGeometry.make(in_hw, kernel, stride, padding)
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (2, *in_hw, c)).astype(np.int8)
    k = rng.integers(-128, 128, (n_out, *kernel, c)).astype(np.int8)
    w = conv_dot_kernel(k, geom)
    assert isinstance(w, np.ndarray) and w.shape[0] == n_out and w.shape[1] >= kernel[0] * kernel[1] * c
    assert w.shape[1] == dot_width(n_out, kernel[0] * kernel[1] * c)
    p = conv_dot_patches(jnp.asarray(x), geom, pad_value=np.int8(-5), width=w.shape[1])
    assert p.shape == (2, *geom.out_hw, w.shape[1]) and p.dtype == jnp.int8
    got = np.asarray(p).astype(np.int64) @ w.T.astype(np.int64)
    assert np.array_equal(got, _direct_conv(x, k, geom, -5))
    wj = conv_dot_kernel(jnp.asarray(k), geom)  # a JAX kernel: the same weights
    assert isinstance(wj, jax.Array) and np.array_equal(np.asarray(wj), w)


def test_space_to_depth_applies_only_to_whole_blocks():
    from hwjax.core import space_to_depth, space_to_depth_geometry

    assert space_to_depth_geometry(ConvGeometry.make((9, 9), (3, 3), (2, 2), "SAME")) is None  # 3 % 2
    assert space_to_depth_geometry(ConvGeometry.make((9, 9), (4, 4), (1, 1), "SAME")) is None  # unit stride
    assert space_to_depth_geometry(ConvGeometry.make((9, 9), (4, 4), (2, 2), "SAME", dilation=2)) is None
    from hwjax.errors import RangeError

    with pytest.raises(RangeError, match="space_to_depth"):
        space_to_depth(np.zeros((9, 9, 1), np.int32), ConvGeometry.make((9, 9), (3, 3), (2, 2)), pad_value=0)
    from hwjax.core import space_to_depth_kernel
    from hwjax.errors import ShapeError

    with pytest.raises(ShapeError, match="kernel"):
        space_to_depth_kernel(np.zeros((2, 3, 4, 1)), ConvGeometry.make((9, 9), (4, 4), (2, 2)))


def test_conv_dot_operands_reject_bad_arguments():
    from hwjax.core import conv_dot_kernel, conv_dot_patches, dot_width
    from hwjax.errors import ArgTypeError, RangeError, ShapeError

    geom = ConvGeometry.make((9, 9), (3, 3), (2, 2))
    with pytest.raises(ShapeError, match="kernel must be OHWI"):
        conv_dot_kernel(np.zeros((4, 3, 2, 1), np.int8), geom)
    with pytest.raises(ArgTypeError, match="geom"):
        conv_dot_kernel(np.zeros((4, 3, 3, 1), np.int8), (3, 3))
    with pytest.raises(RangeError, match="width"):
        conv_dot_patches(np.zeros((9, 9, 2), np.int8), geom, pad_value=0, width=17)  # 3 * 3 * 2 = 18 taps
    with pytest.raises(RangeError, match="n_out"):
        dot_width(0, 8)
    with pytest.raises(RangeError, match="k"):
        dot_width(8, 0)
