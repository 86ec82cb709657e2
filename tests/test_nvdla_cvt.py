"""NVDLA convertors (spec 5): big-integer model, CDP golden convertors, flags, fp16, validity."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax.core import wide
from hwjax.nvdla import (
    CONVERTORS,
    check_precision_conversion,
    cvt,
    cvt_unit,
    fp16_input,
    fp16_output,
    fp16_to_int16,
    int_to_fp16,
    sign_extend,
    valid_precision_conversions,
)
from tests.conftest import golden_path

# ------------------------------------------------------------ plain-Python model (spec 0, 5)


def py_rhaz(v: int, s: int) -> int:
    """rshift_rhaz: q = (|v| + 2**(s-1)) >> s with the sign of v (s > 0); v for s = 0."""
    if s == 0:
        return v
    q = (abs(v) + (1 << (s - 1))) >> s
    return q if v >= 0 else -q


def py_sat(v: int, bits: int) -> int:
    return min(max(v, -(1 << (bits - 1))), (1 << (bits - 1)) - 1)


def py_int_to_fp16(v: int) -> float:
    """Integer to fp16 value: 11 significant bits, ties to even, clipped to 65504."""
    m = abs(v)
    if m >= 2048:
        sh = m.bit_length() - 11
        q, rem = divmod(m, 1 << sh)
        half = 1 << (sh - 1)
        q += rem > half or (rem == half and q & 1)
        m = q << sh
    return math.copysign(min(m, 65504), v) if v else 0.0


def py_cvt(x, off, sc, sh, out_bits, stage_bits=None):
    """(y, flag) of spec 5.1/5.2: flag when floor(v / 2**sh) is > 1 away from the first stage."""
    v = (x - off) * sc
    r = py_rhaz(v, sh)
    first = stage_bits or out_bits
    y1 = py_sat(r, first)
    flag = abs((v >> sh) - y1) > 1
    if out_bits == "fp16":
        return py_int_to_fp16(y1), flag
    return py_sat(y1, out_bits), flag


I32 = st.integers(-(2**31), 2**31 - 1)
I16 = st.integers(-(2**15), 2**15 - 1)
OUTS = st.sampled_from(
    [(8, 17), (16, 17), ("fp16", 17), (8, None), (16, None), (17, None), (9, None), (32, None), (2, None), (24, 30)]
)


# ---------------------------------------------------------------------- property tests


@given(xs=st.lists(I32, min_size=8, max_size=8), off=I32, sc=I16, sh=st.integers(0, 63), outs=OUTS)
def test_cvt_matches_bigint_model(xs, off, sc, sh, outs):
    out_bits, stage = outs
    y, flag = cvt(
        np.array(xs, np.int32), offset=off, scale=sc, shift=sh, out_bits=out_bits, stage_bits=stage, return_flags=True
    )
    want = [py_cvt(x, off, sc, sh, out_bits, stage) for x in xs]
    assert [float(v) if out_bits == "fp16" else int(v) for v in np.asarray(y)] == [w[0] for w in want]
    assert list(np.asarray(flag)) == [w[1] for w in want]


@given(
    xs=st.lists(st.integers(-(2**40), 2**40 - 1), min_size=8, max_size=8),
    off=I32,
    sc=I16,
    sh=st.integers(0, 63),
    out_bits=st.sampled_from([8, 16, 32]),
)
def test_cvt_wide_input_matches_model(xs, off, sc, sh, out_bits):
    y, flag = cvt(wide.from_python(xs), offset=off, scale=sc, shift=sh, out_bits=out_bits, return_flags=True)
    want = [py_cvt(x, off, sc, sh, out_bits) for x in xs]
    assert [int(v) for v in np.asarray(y)] == [w[0] for w in want]
    assert list(np.asarray(flag)) == [w[1] for w in want]


@given(
    x=st.lists(st.integers(-(2**16), 2**16 - 1), min_size=4, max_size=4),
    off=st.lists(I16, min_size=4, max_size=4),
    sc=st.lists(I16, min_size=4, max_size=4),
    sh=st.lists(st.integers(0, 63), min_size=4, max_size=4),
)
def test_cvt_per_element_registers(x, off, sc, sh):
    y = cvt_unit("cdma", np.array(x), offset=np.array(off), scale=np.array(sc), shift=np.array(sh), out_bits=16)
    assert list(np.asarray(y)) == [py_cvt(*a, 16, 17)[0] for a in zip(x, off, sc, sh)]


def test_int17_to_fp16_exhaustive():
    v = np.arange(-(2**16), 2**16, dtype=np.int32)
    got = np.asarray(cvt(v, offset=0, scale=1, shift=0, out_bits="fp16", stage_bits=17), np.float64)
    want = np.array([py_int_to_fp16(int(a)) for a in v])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(int_to_fp16(v), np.float64), want)
    assert not np.isinf(got).any()


def test_double_saturation_flags_the_int17_stage_only():
    # 40000 fits int17 but not int16: clamped to 32767, not flagged; 70000 is flagged.
    y, f = cvt(
        np.array([40000, 70000, -65537, -65536]),
        offset=0,
        scale=1,
        shift=0,
        out_bits=16,
        stage_bits=17,
        return_flags=True,
    )
    assert list(np.asarray(y)) == [32767, 32767, -32768, -32768]
    assert list(np.asarray(f)) == [False, True, False, False]  # -65537 is 1 below int17's min
    # fp16 output converts the int17 value: 40000 -> 40000, 70000 -> 65535 -> 65504.
    y = cvt(np.array([40000, 70000]), offset=0, scale=1, shift=0, out_bits="fp16", stage_bits=17)
    assert y.dtype == jnp.float16 and list(np.asarray(y, np.float64)) == [40000.0, 65504.0]


def test_rounding_is_half_away_from_zero():
    y = cvt(np.array([5, -5, 6, -6, 7, -7]), offset=0, scale=1, shift=1, out_bits=32)
    assert list(np.asarray(y)) == [3, -3, 3, -3, 4, -4]


# ------------------------------------------------------------------ golden: CDP convertors


def _cdp_cases():
    return json.loads(golden_path("nvdla", "cdp_lut_int.json").read_text())["cases"]


def test_cdp_convertors_match_golden():
    """Input convertor (via the LUT inputs), output convertor and its saturation count."""
    windows = 0
    for case in _cdp_cases():
        r = case["registers"]
        i16 = r["precision"] == "INT16"
        off_in = r["datin_offset"] if i16 else sign_extend(r["datin_offset"], 8)
        off_out = r["datout_offset"] if i16 else sign_extend(r["datout_offset"], 25)
        half = r["normalz_len"] + 1
        for w in case["windows"]:
            v = [
                int(a)
                for a in np.asarray(
                    cvt_unit(
                        "cdp_in_int16" if i16 else "cdp_in_int8",
                        np.array(w["data_in"]),
                        offset=off_in,
                        scale=r["datin_scale"],
                        shift=r["datin_shifter"],
                    )
                )
            ]
            n = len(w["lut_in"])
            if r["sqsum_bypass"]:
                lut_in = [v[i + 4] for i in range(n)]
            else:
                lut_in = [sum(v[j] ** 2 for j in range(i + 4 - half, i + 5 + half)) for i in range(n)]
            assert lut_in == w["lut_in"]
            m = [w["lut_out"][i] * (1 if r["mul_bypass"] else v[i + 4]) for i in range(n)]
            y, flags = cvt_unit(
                "cdp_out_int16" if i16 else "cdp_out_int8",
                wide.from_python(m),
                offset=off_out,
                scale=r["datout_scale"],
                shift=r["datout_shifter"],
                return_flags=True,
            )
            assert [int(a) for a in np.asarray(y)] == w["out"]
            assert int(np.asarray(flags).sum()) == w["out_saturation"]
            windows += 1
    assert windows == 472


# ---------------------------------------------------------------- jit / vmap / grad / x64


def test_jit_and_vmap_match_eager():
    x = np.arange(-3000, 3000, 50, dtype=np.int32).reshape(2, -1)
    sh = np.array([[3], [9]], np.int32)
    eager = cvt(x, offset=-11, scale=-1234, shift=sh, out_bits=8, stage_bits=17, return_flags=True)
    f = jax.jit(lambda a, s: cvt(a, offset=-11, scale=-1234, shift=s, out_bits=8, stage_bits=17, return_flags=True))
    jitted = f(x, sh)
    vm = jax.vmap(lambda a, s: cvt(a, offset=-11, scale=-1234, shift=s, out_bits=8, stage_bits=17, return_flags=True))(
        x, sh[:, 0]
    )
    for got in (jitted, vm):
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(eager[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(eager[1]))


def test_float_input_gradient():
    x = jnp.array([0.0, 10.0, 200.0, -300.0, 5000.0], jnp.float32)

    def f(a, grad_mode):
        return jnp.sum(cvt(a, offset=3, scale=6, shift=2, out_bits=8, stage_bits=17, saturation_grad=grad_mode))

    y = cvt(x, offset=3, scale=6, shift=2, out_bits=8, stage_bits=17)
    assert y.dtype == jnp.float32
    assert list(np.asarray(y)) == [float(py_cvt(int(v), 3, 6, 2, 8, 17)[0]) for v in np.asarray(x)]
    g = np.asarray(jax.grad(f)(x, "zero"))
    clipped = [abs((int(v) - 3) * 6 / 4) > 127.5 for v in np.asarray(x)]
    assert list(g) == [0.0 if c else 1.5 for c in clipped]
    assert list(np.asarray(jax.grad(f)(x, "pass"))) == [1.5] * 5
    g_jit = jax.jit(jax.grad(lambda a: f(a, "zero")))(x)
    np.testing.assert_array_equal(np.asarray(g_jit), g)


def test_float_input_fp16_output():
    x = jnp.array([3.0, 70000.0, -5.0], jnp.float32)
    y = cvt(x, offset=1, scale=3, shift=1, out_bits="fp16", stage_bits=17)
    assert y.dtype == jnp.float16
    assert list(np.asarray(y, np.float64)) == [py_cvt(int(v), 1, 3, 1, "fp16", 17)[0] for v in (3, 70000, -5)]
    g = jax.grad(
        lambda a: jnp.sum(cvt(a, offset=1, scale=3, shift=1, out_bits="fp16", stage_bits=17).astype(jnp.float32))
    )(x)
    assert list(np.asarray(g)) == [1.5, 0.0, 1.5]


def test_identical_with_x64():
    x = np.array([-(2**31), -5, 0, 7, 2**31 - 1], np.int32)
    args = dict(offset=-(2**31), scale=-32768, shift=13, out_bits=16, stage_bits=17, return_flags=True)
    base = [np.asarray(a) for a in cvt(x, **args)]
    wbase = np.asarray(cvt(wide.from_python([2**39, -(2**39)]), offset=5, scale=3, shift=30, out_bits=32))
    with jax.enable_x64(True):
        got = [np.asarray(a) for a in cvt(x, **args)]
        wgot = np.asarray(cvt(wide.from_python([2**39, -(2**39)]), offset=5, scale=3, shift=30, out_bits=32))
    for a, b in zip(base, got):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    np.testing.assert_array_equal(wbase, wgot)
    assert not jax.config.jax_enable_x64


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scale=40000), "scale must lie in"),
        (dict(shift=64), "shift must lie in"),
        (dict(shift=-1), "shift must lie in"),
        (dict(out_bits=33), "out_bits"),
        (dict(out_bits="fp32"), "out_bits"),
        (dict(out_bits=16, stage_bits=8), "must not exceed stage_bits"),
        (dict(out_bits="fp16"), "stage_bits=17"),
        (dict(offset=2**31), "offset"),
    ],
)
def test_cvt_rejects_bad_arguments(kwargs, match):
    args = dict(offset=0, scale=1, shift=0, out_bits=8)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        cvt(np.array([1, 2]), **args)


def test_cvt_rejects_bad_inputs():
    with pytest.raises(ValueError, match="integer values"):
        cvt(jnp.array([1.5]), offset=0, scale=1, shift=0, out_bits=8)
    with pytest.raises(TypeError, match="scale must be an integer"):
        cvt(np.array([1]), offset=0, scale=1.0, shift=0, out_bits=8)
    with pytest.raises(ValueError, match="broadcast"):
        cvt(np.zeros(3, np.int32), offset=np.zeros(2, np.int32), scale=1, shift=0, out_bits=8)
    with pytest.raises(ValueError, match=r"2\*\*40"):
        cvt(wide.from_python([2**41]), offset=0, scale=1, shift=0, out_bits=8)


@pytest.mark.parametrize(
    "unit, kwargs, match",
    [
        ("cdp_in_int8", dict(x=np.array([200])), r"x must lie in \[-128, 127\]"),
        ("cdp_in_int8", dict(offset=-129), r"offset must lie in \[-128, 127\]"),
        ("cdp_in_int16", dict(shift=32), r"shift must lie in \[0, 31\]"),
        ("cdma", dict(x=np.array([70000]), out_bits=8), r"x must lie in \[-65536, 65535\]"),
        ("cdma", dict(), "needs out_bits"),
        ("sdp_out", dict(out_bits=32), "out_bits for unit 'sdp_out' must be one of"),
        ("cdp_out_int8", dict(x=wide.from_python([2**24])), r"x must lie in \[-16777216, 16777215\]"),
        ("gpu", dict(), "unit must be one of"),
    ],
)
def test_cvt_unit_checks_widths(unit, kwargs, match):
    args = dict(x=np.array([1]), offset=0, scale=1, shift=0)
    args.update(kwargs)
    x = args.pop("x")
    with pytest.raises(ValueError, match=match):
        cvt_unit(unit, x, **args)


def test_every_unit_runs_with_its_default_output():
    for unit, spec in CONVERTORS.items():
        out = spec.outputs[0]
        y = cvt_unit(unit, np.array([100, -100]), offset=3, scale=-7, shift=2, out_bits=out)
        want = [py_cvt(v, 3, -7, 2, out, spec.stage_bits)[0] for v in (100, -100)]
        assert [float(a) if out == "fp16" else int(a) for a in np.asarray(y)] == want


# ------------------------------------------------------ precision-conversion validity (5.3)

SPEC_TABLES = {  # written from spec 5.3
    "conv": {
        "image_uint8": {"int8", "int16", "fp16"},
        "image_int16": {"int8", "int16", "fp16"},
        "image_uint16": {"int8", "int16", "fp16"},
        "image_fp16": {"fp16"},
        "int8": {"int8"},
        "int16": {"int16"},
        "fp16": {"fp16"},
    },
    "sdp": {"int8": {"int8", "int16"}, "int16": {"int8", "int16", "fp16"}, "fp16": {"int16", "fp16"}},
    "cdp": {"int8": {"int8"}, "int16": {"int16"}, "fp16": {"fp16"}},
    "pdp": {"int8": {"int8"}, "int16": {"int16"}, "fp16": {"fp16"}},
}


@pytest.mark.parametrize("unit", sorted(SPEC_TABLES))
def test_precision_validity_table(unit):
    assert {k: set(v) for k, v in valid_precision_conversions(unit).items()} == SPEC_TABLES[unit]
    for inp, outs in SPEC_TABLES[unit].items():
        for out in ("int8", "int16", "fp16"):
            if out in outs:
                check_precision_conversion(unit, inp, out)
            else:
                with pytest.raises(ValueError, match="allowed output_precision"):
                    check_precision_conversion(unit, inp, out)
    with pytest.raises(ValueError, match="input_precision"):
        check_precision_conversion(unit, "int4", "int8")


def test_precision_validity_unknown_unit():
    with pytest.raises(ValueError, match="unit must be one of"):
        check_precision_conversion("rubik", "int8", "int8")


# ---------------------------------------------------------------------- fp16 (5.4)

ALL_FP16 = np.arange(2**16, dtype=np.uint16)


def py_fp16_to_int16(bits: int) -> int:
    v = float(np.uint16(bits).view(np.float16))
    if math.isnan(v):
        return -32768
    if math.isinf(v):
        return 32767 if v > 0 else -32768
    q = math.floor(abs(v) + 0.5)  # exact in float64
    return py_sat(q if v >= 0 else -q, 16)


def test_fp16_to_int16_exhaustive():
    got = np.asarray(fp16_to_int16(ALL_FP16))
    want = np.array([py_fp16_to_int16(int(b)) for b in ALL_FP16])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(fp16_to_int16(ALL_FP16.view(np.float16))), want)


@pytest.mark.parametrize(
    "unit, rep",
    [
        ("conv", 65536.0),
        ("winograd", 65504.0),
        ("sdp", float(np.finfo(np.float32).max)),
        ("cdp", 4292870144.0),
        ("pdp_avg", 4292870144.0),
        ("pdp_max", math.inf),
    ],
)
def test_fp16_input_replaces_inf(unit, rep):
    x = np.array([np.inf, -np.inf, np.nan, 1.5, 2.0**-24, -0.0], np.float16)
    got = np.asarray(fp16_input(x, unit=unit))
    assert got.dtype == np.float32
    assert list(got[:2]) == [rep, -rep]
    assert math.isnan(got[2])
    assert list(got[3:]) == [1.5, 2.0**-24, 0.0]
    flushed = np.asarray(fp16_input(x, unit=unit, nan_to_zero=True))
    assert flushed[2] == 0.0
    finite = ~np.isinf(ALL_FP16.view(np.float16)) & ~np.isnan(ALL_FP16.view(np.float16))
    np.testing.assert_array_equal(
        np.asarray(fp16_input(ALL_FP16, unit=unit))[finite], ALL_FP16.view(np.float16)[finite].astype(np.float32)
    )


@settings(max_examples=40)
@given(bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_fp16_output_saturates_and_propagates_nan(bits):
    x = np.array(bits, np.uint32).view(np.float32)
    got = np.asarray(fp16_output(x))
    for v, h in zip(x, got):
        if math.isnan(v):
            assert math.isnan(h)
            continue
        with np.errstate(over="ignore"):
            want = np.float16(v)  # NumPy's float32 -> float16 is nearest-even
        if math.isinf(want):
            want = np.float16(math.copysign(65504.0, v))
        assert np.float16(h).view(np.uint16) == want.view(np.uint16)


def test_fp16_output_is_differentiable_and_saturates_inf():
    assert list(np.asarray(fp16_output(np.array([np.inf, -np.inf, 1e6], np.float32)), np.float64)) == [
        65504.0,
        -65504.0,
        65504.0,
    ]
    g = jax.grad(lambda a: jnp.sum(fp16_output(a).astype(jnp.float32)))(jnp.array([1.0, 1e6]))
    assert list(np.asarray(g)) == [1.0, 0.0]


def test_fp16_helpers_reject_other_dtypes():
    with pytest.raises(TypeError, match="float16"):
        fp16_to_int16(np.array([1.0], np.float32))
    with pytest.raises(ValueError, match="unit must be one of"):
        fp16_input(np.array([1.0], np.float16), unit="gpu")
    with pytest.raises(TypeError, match="float array"):
        fp16_output(np.array([1], np.int32))


@given(v=st.integers(-(2**40), 2**40), bits=st.integers(1, 32))
def test_sign_extend(v, bits):
    low = v & ((1 << bits) - 1)
    want = low - (1 << bits) if low >= 1 << (bits - 1) else low
    assert sign_extend(v, bits) == want
    if -(2**31) <= v < 2**31:
        assert int(sign_extend(np.array([v], np.int32), bits)[0]) == want
