"""hwjax.tflite requantisation and kernels against the golden vectors (gemmlowp.md §2.4-§2.9)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hwjax.litert as tfl
from hwjax.errors import RangeError
from tests.conftest import golden_path

FIELDS = {"double": None, "float64": "out_ref", "ruy": "out_optimized_nodelegate", "xnnpack": "out_default_xnnpack"}


@pytest.fixture(scope="module")
def fixedpoint():
    return np.load(golden_path("gemmlowp", "fixedpoint_tflite.npz"))


@pytest.fixture(scope="module")
def litert():
    d = np.load(golden_path("gemmlowp", "litert_int8_cases.npz"))
    names = sorted({k.split("__")[0] for k in d.files})
    return d, names


@pytest.mark.parametrize("single", [False, True])
def test_quantize_multiplier_golden(fixedpoint, single):
    build = "single" if single else "double"
    m, e = tfl.quantize_multiplier(fixedpoint["qm_real"], single_rounding=single)
    np.testing.assert_array_equal(m, fixedpoint[f"qm_multiplier_{build}_rounding_build"])
    np.testing.assert_array_equal(e, fixedpoint[f"qm_shift_{build}_rounding_build"])


def test_quantize_multiplier_examples():
    assert tfl.quantize_multiplier(0.3) == (1288490189, -1)
    assert tfl.quantize_multiplier(1 - 2.0**-40) == (2**30, 1)
    assert tfl.quantize_multiplier(2.0**-33) == (0, 0)
    assert tfl.quantize_multiplier(0.0) == (0, 0)
    with pytest.raises(RangeError, match="finite"):
        tfl.quantize_multiplier(float("nan"))


@pytest.mark.parametrize("rounding", ["double", "single"])
def test_mbqm_golden(fixedpoint, rounding):
    x, m, s = (fixedpoint[f"mbqm32_{k}"].astype(np.int32) for k in ("x", "multiplier", "shift"))
    want = fixedpoint[f"mbqm32_out_{rounding}_rounding"]
    if rounding == "single":
        keep = (m >= 0) & (s <= 30)
        x, m, s, want = x[keep], m[keep], s[keep], want[keep]
    f = jax.jit(lambda a, b, c: tfl.multiply_by_quantized_multiplier(a, b, c, rounding=rounding))
    got = np.asarray(f(x, m, s))
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:10]


def test_mbqm_example_differs_between_builds():
    m = 1431655765
    assert int(tfl.multiply_by_quantized_multiplier(1, m, -1, rounding="double")) == 1
    assert int(tfl.multiply_by_quantized_multiplier(1, m, -1, rounding="single")) == 0


def _run_case(d, name, requant):
    g = lambda k: d[f"{name}__{k}"]
    op = str(g("op"))
    act = {"NONE": None, "RELU": "relu", "RELU6": "relu6"}[str(g("fused_activation"))]
    kw = dict(
        input_scale=g("input_scale"),
        input_zero_point=g("input_zero_point"),
        filter_scales=g("filter_scales"),
        output_scale=g("output_scale"),
        output_zero_point=g("output_zero_point"),
        requant=requant,
        activation=act,
    )
    if op == "FULLY_CONNECTED":
        return tfl.fully_connected(g("input"), g("filter"), g("bias"), **kw)
    return tfl.conv2d(
        g("input"),
        g("filter"),
        g("bias"),
        stride=int(g("stride")),
        padding=str(g("padding")),
        dilation=int(g("dilation")),
        **kw,
    )


@pytest.mark.parametrize("requant", ["float64", "ruy", "xnnpack", "double"])
def test_litert_cases(litert, requant):
    """Every golden LiteRT case: R2 is BUILTIN_REF's FC, R1 its conv; R3 optimized; R4 XNNPACK."""
    d, names = litert
    checked = 0
    for name in names:
        op = str(d[f"{name}__op"])
        field = FIELDS[requant]
        if requant == "double":  # R1 is the reference runtime's conv convention
            if op != "CONV_2D":
                continue
            field = "out_ref"
        elif requant == "float64" and op != "FULLY_CONNECTED":
            continue
        got = np.asarray(_run_case(d, name, requant))
        want = d[f"{name}__{field}"].astype(np.int32)
        assert np.array_equal(got, want), (name, int((got != want).sum()))
        checked += 1
    assert checked >= 6


def test_conventions_differ_at_ties(litert):
    """The tie sweep separates the conventions (a convention that ignored `requant` fails)."""
    d, _ = litert
    outs = {
        r: np.asarray(_run_case(d, "fc_tie_sweep_in1_out4_bias0_zp9", r))
        for r in ("double", "float64", "ruy", "xnnpack")
    }
    assert len({o.tobytes() for o in outs.values()}) == 4


def test_kernels_jit_vmap(litert):
    d, _ = litert
    name = "conv_per_channel_same_s2_k5"
    g = lambda k: d[f"{name}__{k}"]
    kw = dict(
        stride=2,
        padding="SAME",
        input_scale=g("input_scale"),
        input_zero_point=g("input_zero_point"),
        filter_scales=g("filter_scales"),
        output_scale=g("output_scale"),
        output_zero_point=g("output_zero_point"),
        requant="ruy",
    )
    f = jax.jit(jax.vmap(lambda x: tfl.conv2d(x, g("filter"), g("bias"), **kw)))
    x = np.stack([g("input"), g("input")])
    got = np.asarray(f(x))
    assert np.array_equal(got[0], g("out_optimized_nodelegate")) and np.array_equal(got[1], got[0])


def test_kernel_errors():
    x = np.zeros((2, 4), np.int8)
    w = np.zeros((3, 4), np.int8)
    kw = dict(input_scale=0.1, input_zero_point=0, output_scale=0.1, output_zero_point=0)
    with pytest.raises(ValueError, match="requant"):
        tfl.fully_connected(x, w, None, filter_scales=[0.1], requant="fast", **kw)
    with pytest.raises(ValueError, match="filter_scales"):
        tfl.fully_connected(x, w, None, filter_scales=[0.1, 0.2], requant="ruy", **kw)
    with pytest.raises(RangeError, match="activation"):
        tfl.fully_connected(x, w, None, filter_scales=[0.1], requant="ruy", activation="gelu", **kw)
    with pytest.raises(RangeError, match="output_scale"):
        tfl.fully_connected(x, w, None, filter_scales=[0.1], requant="ruy", **{**kw, "output_scale": 0.0})


def _r2_host(acc, eff):
    """R2 in float64 on the host: ``std::round(acc * eff)`` converted to int32 as x86 does
    (-2**31 for a value outside int32) (the model)."""
    v = np.asarray(acc, np.int64).astype(np.float64) * np.float64(eff)
    r = np.floor(np.abs(v))
    r = np.copysign(r + (np.abs(v) - r >= 0.5), v)
    return np.where((r < -(2**31)) | (r > 2**31 - 1), -(2**31), r).astype(np.int64)


# (acc, eff) whose float64 product rounds onto a tie k + 1/2 that the exact product is
# not: std::round then rounds away from zero where the exact value rounds the other way
DOUBLE_ROUNDED = [
    (1594375599, 0.42501909332093335),
    (1980111272, 0.42501909332093335),
    (1625186177, 0.39631194851099205),
    (1264224265, 0.34714852629410653),
    (1597736774, 0.34714852629410653),
    (1772262660, 0.3442493425325567),
    (1955473633, 0.3442493425325567),
    (1743648068, 0.3541787868972651),
    (1521988381, 0.344820503265064),
]


@pytest.mark.parametrize("form", ["_r2", "_r2_float64", "_r2_int32"])
def test_r2_float64_requant_is_exact(form):
    """R2 (LiteRT's reference FULLY_CONNECTED: ``round(acc * (double)eff)``), as it runs
    (``_r2``: float64 HLO on CPU/GPU) and in both of its forms (float64 HLO; 32-bit integer
    arithmetic, the other platforms'), equals the float64 model everywhere: random
    accumulators and multipliers, int32 extremes, exact ties and the cases where the
    float64 rounding itself decides."""
    from fractions import Fraction

    from hwjax.litert import _arith
    from hwjax.litert._arith import _float64_bits

    f = jax.jit(getattr(_arith, form))
    rng = np.random.default_rng(11)
    for eff in [*10.0 ** rng.uniform(-9, 2, 12), 0.5, 0.375 * 2.0**-20, 3.0, 1e-300, 0.0]:
        acc = np.concatenate(
            [rng.integers(-(2**31), 2**31, 3000), rng.integers(-(2**12), 2**12, 1000), [-(2**31), 2**31 - 1, 0, 1, -1]]
        ).astype(np.int32)
        hi, lo = _float64_bits(np.array(eff))
        got = np.asarray(f(jnp.asarray(acc), jnp.asarray(hi), jnp.asarray(lo)))
        np.testing.assert_array_equal(got, _r2_host(acc, eff), err_msg=f"eff={eff!r}")
    acc = np.array([a for a, _ in DOUBLE_ROUNDED], np.int32)
    effs = np.array([e for _, e in DOUBLE_ROUNDED])
    for a, e in DOUBLE_ROUNDED:  # the cases are what they claim: the float64 product is a tie, the exact one not
        v = np.float64(a) * np.float64(e)
        assert v - np.floor(v) == 0.5 and Fraction(a) * Fraction(e) != Fraction(v)
    hi, lo = _float64_bits(effs)
    for sign in (1, -1):
        got = np.asarray(f(jnp.asarray(sign * acc), jnp.asarray(hi), jnp.asarray(lo)))
        np.testing.assert_array_equal(got, [_r2_host(sign * a, e) for a, e in DOUBLE_ROUNDED])


def test_r2_runs_in_float64_on_cpu_also_under_vmap_and_eagerly():
    """On CPU the R2 program multiplies in float64 (without jax_enable_x64); under vmap
    and eagerly it gives the float64 model's values."""
    from hwjax.litert._arith import _float64_bits, _r2, _r2_float64

    acc = np.array([[7, -7, 2**31 - 1, -(2**31)], [5, -5, 3, 0]], np.int32)
    effs = np.array([0.5, 1.5, 1e-3, 2.0])
    hi, lo = _float64_bits(effs)
    want = np.stack([_r2_host(acc[:, j], effs[j]) for j in range(4)], axis=1)
    text = jax.jit(_r2).lower(acc, hi, lo).as_text()
    if jax.default_backend() == "cpu":
        assert "f64" in text and "round_nearest_afz" in text, text[:2000]
    np.testing.assert_array_equal(np.asarray(jax.jit(_r2)(acc, hi, lo)), want)
    np.testing.assert_array_equal(np.asarray(_r2_float64(acc, hi, lo)), want)  # eager
    by_row = jax.vmap(lambda a: _r2(a, hi, lo))(acc)
    by_column = jax.vmap(lambda a, h, l: _r2(a, h, l), in_axes=(1, 0, 0), out_axes=1)(acc, hi, lo)
    np.testing.assert_array_equal(np.asarray(by_row), want)
    np.testing.assert_array_equal(np.asarray(by_column), want)


def test_moved_names_still_reachable_from_hwjax_tflite_with_a_deprecation_warning():
    import hwjax.tflite

    with pytest.warns(DeprecationWarning, match="hwjax.tflite.fully_connected moved to hwjax.litert.fully_connected"):
        fn = hwjax.tflite.fully_connected
    assert fn is tfl.fully_connected
    with pytest.raises(AttributeError, match="no_such_name"):
        hwjax.tflite.no_such_name


def test_kernel_sums_per_output_channel():
    """kernel_sums: the int8 weights of each output channel added in int32; NumPy in, NumPy
    out (host lowering), JAX in (also traced), JAX out."""
    from hwjax.litert import kernel_sums

    rng = np.random.default_rng(3)
    conv = rng.integers(-128, 128, (5, 3, 3, 7)).astype(np.int8)  # OHWI
    dw = rng.integers(-128, 128, (3, 3, 6)).astype(np.int8)  # (kh, kw, C)
    want_conv = [int(conv[o].astype(np.int64).sum()) for o in range(5)]
    want_dw = [int(dw[..., c].astype(np.int64).sum()) for c in range(6)]
    host = kernel_sums(conv)
    assert isinstance(host, np.ndarray) and host.dtype == np.int32 and host.tolist() == want_conv
    assert kernel_sums(dw, depthwise=True).tolist() == want_dw
    dev = jax.jit(lambda k: kernel_sums(k, depthwise=True))(jax.device_put(dw))
    assert isinstance(dev, jax.Array) and dev.tolist() == want_dw


@pytest.mark.parametrize("channels", [3, 8, 13, 24])
def test_lanes8_is_ruy_on_whole_groups_of_eight_and_double_on_the_rest(channels):
    """LiteRT's optimized per-channel depthwise output stage: channels in whole groups of 8
    take R3 (ties toward +inf), the rest R1 (ties away from zero). Accumulators at exact
    negative ties (multiplier 2**30, shift -1: acc / 4, ties where acc = 2 mod 4) make the
    two differ, so a form that used one convention everywhere fails."""
    params = {"multiplier": np.full(channels, 2**30, np.int32), "shift": np.full(channels, -1, np.int32)}
    acc = np.arange(-40, 40, dtype=np.int32).repeat(channels).reshape(-1, channels)
    whole = channels - channels % 8
    kw = dict(output_zero_point=0, act_min=-128, act_max=127)
    got = np.asarray(jax.jit(lambda a: tfl.requantize(a, params, "lanes8", **kw))(acc))
    ruy = np.asarray(tfl.requantize(acc, params, "ruy", **kw))
    double = np.asarray(tfl.requantize(acc, params, "double", **kw))
    assert np.array_equal(got[:, :whole], ruy[:, :whole]) and np.array_equal(got[:, whole:], double[:, whole:])
    assert not np.array_equal(ruy, double)  # ties: -2 / 4 is 0 in R3, -1 in R1
    assert int(ruy[38, 0]) == 0 and int(double[38, 0]) == -1  # acc = -2


@pytest.mark.parametrize("form", ["public", "pieces", "wide"])
@pytest.mark.parametrize("bits", [1, 7, 12, 19, 20, 23, 29])
def test_srdhm_bounded_is_the_exact_rounded_high_product(bits, form):
    """floor((d*b + low) / 2**31) against Python integers, at the ends of every range: the
    public function and both of its forms (int32 pieces; one int64 product, also vmapped)."""
    from hwjax.litert import _arith

    fn = {
        "public": lambda *a: tfl.srdhm_bounded(*a, bits),
        "pieces": lambda *a: _arith._srdhm_pieces(*a, bits),
        "wide": lambda d, b, low: jax.vmap(_arith._floor_mul_add_wide)(d[:, None], b[:, None], low[:, None])[:, 0],
    }[form]
    rng = np.random.default_rng(bits)
    lim = 2**bits - 1
    d = np.concatenate([[lim, -lim, 0, -1, 1, lim], rng.integers(-lim, lim + 1, 20000)])
    b = np.concatenate([[2**31 - 1, 2**31 - 1, 0, 2**30, 1, 0], rng.integers(0, 2**31, 20000)])
    low = np.concatenate([[2**31 - 1, 0, 2**31 - 1, 2**30, 0, 2**31 - 1], rng.integers(0, 2**31, 20000)])
    want = [(int(x) * int(y) + int(z)) >> 31 for x, y, z in zip(d, b, low)]
    got = jax.jit(fn)(*(v.astype(np.int32) for v in (d, b, low)))
    assert np.asarray(got).tolist() == want


def test_accumulator_range_holds_the_extreme_inputs():
    """The range's ends are reached: every weight's product at the end of [-128 - zin,
    255 - zin] that makes it smallest (largest)."""
    k = np.array([[3, -2, 0], [-1, -1, 5]], np.int8)
    lo, hi = tfl.accumulator_range(k, np.array([10, -7]), 3)
    u = np.array([-131, 252])  # x - zin at x = -128 and x = 255
    brute = [[int(np.dot(row, [u[i], u[j], u[l]])) for i in (0, 1) for j in (0, 1) for l in (0, 1)] for row in k]
    assert lo.tolist() == [10 + min(brute[0]), -7 + min(brute[1])]
    assert hi.tolist() == [10 + max(brute[0]), -7 + max(brute[1])]


@pytest.mark.parametrize("requant", ["double", "ruy", "lanes8"])
@pytest.mark.parametrize(
    "shifts", [np.arange(-9, 3), np.arange(-12, 0), np.r_[0, np.arange(-11, 0)]], ids=["mixed", "right", "zero"]
)
@pytest.mark.parametrize("width", [2**13, 2**18, 2**21], ids=["narrow", "mid", "wide"])
@pytest.mark.parametrize("form", ["platform", "int32", "in_loop"])
def test_requantize_with_an_accumulator_bound_gives_the_same_values(requant, shifts, width, form, monkeypatch):
    """R1 / R3 through an AccBound (with_acc_bound) equal the general form on every
    accumulator of the proven range: shifts left and right (every channel right: the
    shorter rounding shift and tail), narrow and wide ranges (int32 pieces; from
    WIDE_PIECES on one int64 product on CPU), the int32 form other platforms take
    (WIDE_PIECES out of reach) and a depthwise layer's (in_product_loop), ties included."""
    from hwjax.litert import _arith

    if form == "int32":
        monkeypatch.setattr(_arith, "WIDE_PIECES", 99)
        monkeypatch.setattr(_arith, "WIDE_PIECES_IN_PRODUCT_LOOP", 99)
    rng = np.random.default_rng(7)
    c = 12
    params = {"multiplier": rng.integers(2**30, 2**31, c).astype(np.int32), "shift": shifts.astype(np.int32)}
    params["multiplier"][0] = 2**30  # ties
    lo = rng.integers(-(2**20), 2**18, c)
    hi = lo + rng.integers(width // 2, width, c)
    bounded = tfl.with_acc_bound(params, lo, hi, in_product_loop=form == "in_loop")
    assert "acc_bound" in bounded and "acc_bound" not in params
    bound = bounded["acc_bound"]
    assert bound.in_product_loop == (form == "in_loop")
    assert bound.shifts_right == bool(np.all(shifts < 0))
    pieces = _arith._pieces(bound.bits)  # every form: two pieces, three (int64 unless in the loop), four+
    assert {2**13: pieces == 2, 2**18: pieces in (3, 4), 2**21: pieces >= 4}[width]
    acc = np.concatenate([lo[None], hi[None], rng.integers(lo, hi + 1, (4000, c))]).astype(np.int32)
    kw = dict(output_zero_point=-3, act_min=-128, act_max=127)
    want = np.asarray(tfl.requantize(acc, params, requant, **kw))
    got = np.asarray(jax.jit(lambda a, p: _arith._requantize.__wrapped__(a, p, -3, -128, 127, requant))(acc, bounded))
    assert np.array_equal(got, want)
    assert np.any((want > -128) & (want < 127))  # the values are not all clamped


def test_with_acc_bound_leaves_params_alone_where_it_cannot_promise():
    """A negative multiplier, an accumulator whose left shift would wrap, or a range too
    wide for BOUNDED_MAX_BITS: no AccBound (the general form)."""
    p = {"multiplier": np.array([2**30, 2**30], np.int32), "shift": np.array([-3, 0], np.int32)}
    assert "acc_bound" in tfl.with_acc_bound(p, [-1000, -5], [1000, 5])
    assert "acc_bound" not in tfl.with_acc_bound({**p, "multiplier": np.array([2**30, -1], np.int32)}, 0, 10)
    assert "acc_bound" not in tfl.with_acc_bound({**p, "shift": np.array([-3, 12], np.int32)}, -(2**20), 2**20)
    assert "acc_bound" not in tfl.with_acc_bound(p, -(2**30), 2**30)
    top = {"multiplier": np.array([2**31 - 1], np.int32), "shift": np.array([-2], np.int32)}
    assert "acc_bound" in tfl.with_acc_bound(top, 2**31 - 2**22, 2**31 - 2**21)
    assert "acc_bound" not in tfl.with_acc_bound(top, 2**31 - 2**22, 2**31 - 1)  # SRDHM + 2**(e-1) leaves int32
    with pytest.raises(Exception, match="acc_bound"):
        tfl.requantize(
            np.zeros((1, 2), np.int32), {**p, "acc_bound": 5}, "double", output_zero_point=0, act_min=-128, act_max=127
        )


def test_rdbpot32_unwrapped_equals_rdbpot32_where_it_applies():
    """Every shift 0-31 (1-31 with e_positive), ties of both signs, the ends of the range where
    x + 2**(e-1) fits."""
    from hwjax.litert._arith import rdbpot32, rdbpot32_unwrapped

    rng = np.random.default_rng(3)
    for e in range(32):
        top = 2**31 - 1 - ((1 << e) >> 1)
        ties = np.array([(1 << e) >> 1, -((1 << e) >> 1), 3 * ((1 << e) >> 1), -3 * ((1 << e) >> 1)])
        x = np.concatenate([[top, -(2**31), 0, -1, 1], ties, rng.integers(-(2**31), top + 1, 3000)]).astype(np.int32)
        x = np.clip(x.astype(np.int64), -(2**31), top).astype(np.int32)
        got = np.asarray(jax.jit(rdbpot32_unwrapped)(x, np.int32(e)))
        want = np.asarray(jax.jit(rdbpot32)(x, np.int32(e)))
        assert np.array_equal(got, want), e
        if e:  # the form for shifts known to be positive
            positive = jax.jit(functools.partial(rdbpot32_unwrapped, e_positive=True))(x, np.int32(e))
            assert np.array_equal(np.asarray(positive), want), e


@pytest.mark.parametrize("kind", ["fc", "conv", "depthwise"])
def test_out_dtype_gives_the_int32_values(kind):
    """``out_dtype`` stores each chunk of examples (and the result) in a narrower type: the
    int32 result's values, bit for bit, on a batch the kernel loops over in chunks with a
    remainder (41 examples of 32x32 images)."""
    rng = np.random.default_rng(7)
    c, o = 4, 8
    x = rng.integers(-128, 128, (41, 32, 32, c)).astype(np.int32)
    rq = tfl.requant_params(0.05, rng.uniform(0.002, 0.01, o if kind != "depthwise" else c), 0.03, "double")
    bias = rng.integers(-2000, 2000, o if kind != "depthwise" else c).astype(np.int32)
    common = (bias, 3, rq, "double", -5, -128, 127)
    if kind == "fc":
        k = rng.integers(-127, 128, (o, c)).astype(np.int32)
        call = lambda dt: tfl.fc_int(x[:, 0, 0], k, *common, out_dtype=dt)
    elif kind == "conv":
        geom = tfl.conv_geometry((32, 32), (3, 3), stride=1, padding="SAME")
        k = rng.integers(-127, 128, (o, 3, 3, c)).astype(np.int32)
        call = lambda dt: tfl.conv_int(x, k, *common, geom, out_dtype=dt)
    else:
        geom = tfl.conv_geometry((32, 32), (3, 3), stride=1, padding="SAME")
        k = rng.integers(-127, 128, (3, 3, c)).astype(np.int32)
        call = lambda dt: tfl.depthwise_int(x, k, *common, geom, out_dtype=dt)
    wide = np.asarray(jax.jit(lambda: call("int32"))())
    for dt in ("int8", "int16"):
        got = jax.jit(lambda: call(dt))()
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(np.asarray(got).astype(np.int32), wide)
    assert wide.min() == -128 and wide.max() == 127  # both clamps reached
    with pytest.raises(RangeError, match="out_dtype=uint8"):
        call("uint8")
