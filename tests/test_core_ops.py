"""saturate, shift_right, fixed_mul: big-integer model, golden VPU tables, x64, grads, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwjax.core import ROUNDING_MODES, div_rn, fixed_mul, floor_divmod_small, mul_rn, saturate, shift_right
from tests.conftest import golden_path

I32 = st.integers(-(2**31), 2**31 - 1)


# ------------------------------------------------------------ plain-Python model


def py_round_shift(x: int, s: int, rounding: str) -> int:
    """round(x / 2**s) with Python's unbounded integers (s may be negative: x * 2**-s)."""
    if s <= 0:
        return x << -s
    q, r = divmod(x, 1 << s)  # floor division, 0 <= r < 2**s
    half = 1 << (s - 1)
    if rounding == "floor":
        return q
    if rounding == "half_up":
        return q + (r >= half)
    if rounding == "half_away":
        return q + (r > half or (r == half and x >= 0))
    if rounding == "half_even":
        return q + (r > half or (r == half and q % 2 == 1))
    if rounding == "trunc":
        return q + (r != 0 and x < 0)
    raise ValueError(rounding)


def py_sat(v: int, bits: int, symmetric: bool = True) -> int:
    hi = 2 ** (bits - 1) - 1
    lo = -hi if symmetric else -hi - 1
    return min(max(v, lo), hi)


# -------------------------------------------------------------- property tests


@given(x=I32, s=st.integers(0, 70), rounding=st.sampled_from(ROUNDING_MODES))
def test_shift_right_matches_bigint_model(x, s, rounding):
    assert int(shift_right(np.int32(x), s, rounding=rounding)) == py_round_shift(x, s, rounding)


@given(x=st.lists(I32, min_size=1, max_size=16), s=st.integers(-40, 40), rounding=st.sampled_from(ROUNDING_MODES))
def test_shift_right_left_shifts_saturate_to_int32(x, s, rounding):
    # Padded to one shape (one compilation per rounding mode); only the drawn values are checked.
    padded = np.zeros(16, np.int32)
    padded[: len(x)] = x
    got = np.asarray(shift_right(padded, s, rounding=rounding, allow_left=True))[: len(x)]
    want = [py_sat(py_round_shift(v, s, rounding), 32, symmetric=False) for v in x]
    np.testing.assert_array_equal(got, np.array(want, np.int64))


@given(x=I32, bits=st.integers(2, 32), symmetric=st.booleans())
def test_saturate_matches_model(x, bits, symmetric):
    assert int(saturate(np.int32(x), bits, symmetric=symmetric)) == py_sat(x, bits, symmetric)


@given(
    x=I32,
    m=I32,
    f=st.integers(0, 62),
    bits=st.integers(2, 32),
    rounding=st.sampled_from(ROUNDING_MODES),
    symmetric=st.booleans(),
)
def test_fixed_mul_int32_operands_exact(x, m, f, bits, rounding, symmetric):
    got = int(fixed_mul(np.int32(x), np.int32(m), f, rounding=rounding, bits=bits, symmetric=symmetric))
    assert got == py_sat(py_round_shift(x * m, f, rounding), bits, symmetric)


@given(
    x=st.integers(-(2**15), 2**15 - 1),
    m=st.integers(-(2**15), 2**15 - 1),
    f=st.integers(0, 31),
    rounding=st.sampled_from(ROUNDING_MODES),
)
def test_fixed_mul_int16_operands_exact(x, m, f, rounding):
    got = int(fixed_mul(np.int16(x), np.int16(m), f, rounding=rounding, bits=16))
    assert got == py_sat(py_round_shift(x * m, f, rounding), 16)


_DIVMOD = jax.jit(floor_divmod_small)  # one program: every example below has shape (8,)


@given(
    st.lists(
        st.tuples(st.integers(1, 2**24), st.integers(-(2**20) + 1, 2**20 - 1), st.integers(0, 2**24 - 1)),
        min_size=8,
        max_size=8,
    )
)
def test_floor_divmod_small_matches_python(cases):
    """floor(r / d) and the remainder for every d in [1, 2**24] and |r / d| < 2**20 that
    fits int32, near quotient boundaries too (r = q d + rem with a random rem in [0, d))."""
    d = np.array([c[0] for c in cases], np.int64)
    r = np.array([c[1] for c in cases], np.int64) * d + np.array([c[2] for c in cases], np.int64) % d
    r = np.clip(r, -(2**31), 2**31 - 1)
    q, rem = (np.asarray(v) for v in _DIVMOD(jnp.asarray(r, jnp.int32), jnp.asarray(d, jnp.int32)))
    want_q = [int(a) // int(b) for a, b in zip(r, d)]
    assert q.tolist() == want_q and rem.tolist() == [int(a) - int(b) * w for a, b, w in zip(r, d, want_q)]


def test_shift_right_issue_examples():
    assert int(shift_right(2**31 - 1, 1, rounding="half_up")) == 2**30
    assert int(shift_right(-(2**31), 32, rounding="half_away")) == -1
    assert int(shift_right(-(2**31), 32, rounding="half_up")) == 0
    assert int(shift_right(-8, 4, rounding="half_up")) == 0


# ------------------------------------------------------ golden VPU tables (core)


@pytest.fixture(scope="module")
def vpu():
    return np.load(golden_path("xs3", "vpu_instructions.npz"))


@pytest.mark.parametrize("name,bits", [("vlsat16", 16), ("vlsat8", 8)])
def test_golden_vlsat_is_half_up_shift_then_symmetric_saturation(vpu, name, bits):
    acc, s = vpu[f"{name}__acc"], vpu[f"{name}__shift"]
    got = saturate(shift_right(acc, s, rounding="half_up"), bits)
    np.testing.assert_array_equal(np.asarray(got), vpu[f"{name}__out_v2026"])


@pytest.mark.parametrize("name,bits,frac", [("vlmul16", 16, 14), ("vlmul8", 8, 6)])
@pytest.mark.parametrize("variant,rounding", [("v2026", "half_up"), ("host2024", "half_up"), ("v2021", "floor")])
def test_golden_vlmul_is_fixed_mul(vpu, name, bits, frac, variant, rounding):
    x, m = vpu[f"{name}__x"], vpu[f"{name}__m"]
    dt = np.int16 if bits == 16 else np.int8
    got = fixed_mul(x.astype(dt), m.astype(dt), frac, rounding=rounding, bits=bits)
    np.testing.assert_array_equal(np.asarray(got), vpu[f"{name}__out_{variant}"])


@pytest.mark.parametrize("name,shift,bits", [("vdepth8_16", 8, 8), ("vdepth8_32", 24, 8), ("vdepth16_32", 16, 16)])
def test_golden_vdepth_is_half_up_shift_then_saturation(vpu, name, shift, bits):
    got = saturate(shift_right(vpu[f"{name}__x"], shift, rounding="half_up"), bits)
    for variant in ("v2026", "host2024", "v2021"):
        np.testing.assert_array_equal(np.asarray(got), vpu[f"{name}__out_{variant}"])


@pytest.mark.parametrize("name,bits", [("vlashr16", 16), ("vlashr8", 8)])
def test_golden_vlashr_hardware_in_range_is_floor_shift_then_saturation(vpu, name, bits):
    x, s = vpu[f"{name}__x"], vpu[f"{name}__shr"]
    keep = s > -(bits - 1)  # left shifts beyond b-1 are capped by the VPU; see hwjax.xs3
    got = saturate(shift_right(x[keep], s[keep], rounding="floor", allow_left=True), bits)
    np.testing.assert_array_equal(np.asarray(got), vpu[f"{name}__out_v2026"][keep])


# ------------------------------------------------------- jit / vmap / x64 / dtypes


class TestTransforms(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_shift_right_variants(self):
        x = np.arange(-300, 300, 7, dtype=np.int32)
        for rounding in ROUNDING_MODES:
            f = self.variant(lambda a, r=rounding: shift_right(a, 3, rounding=r))
            want = [py_round_shift(int(v), 3, rounding) for v in x]
            np.testing.assert_array_equal(np.asarray(f(x)), want)

    @chex.variants(with_jit=True, without_jit=True)
    def test_fixed_mul_variants(self):
        x = np.arange(-(2**15), 2**15, 997, dtype=np.int32)
        f = self.variant(lambda a: fixed_mul(a, np.int32(-20000), 14, bits=16))
        np.testing.assert_array_equal(
            np.asarray(f(x)), [py_sat(py_round_shift(int(v) * -20000, 14, "half_up"), 16) for v in x]
        )

    def test_vmap_per_element_shift(self):
        x = np.arange(-50, 50, dtype=np.int32).reshape(10, 10)
        s = np.arange(10, dtype=np.int32)
        got = jax.vmap(lambda a, b: shift_right(a, b, rounding="half_even"))(x, s)
        want = [[py_round_shift(int(v), int(b), "half_even") for v in row] for row, b in zip(x, s)]
        np.testing.assert_array_equal(np.asarray(got), want)


def test_results_identical_with_x64():
    rng = np.random.default_rng(1)
    x = rng.integers(-(2**31), 2**31, 4096, dtype=np.int64).astype(np.int32)
    m = rng.integers(-(2**31), 2**31, 4096, dtype=np.int64).astype(np.int32)
    s = rng.integers(0, 40, 4096).astype(np.int32)

    def run():
        return [np.asarray(shift_right(x, s, rounding=r)) for r in ROUNDING_MODES] + [
            np.asarray(fixed_mul(x, m, 31, rounding="half_away")),
            np.asarray(saturate(x, 20)),
        ]

    base = run()
    with jax.enable_x64(True):
        wide = run()
    for a, b in zip(base, wide):
        assert a.dtype == b.dtype == np.int32
        np.testing.assert_array_equal(a, b)


def test_narrow_dtypes_accepted():
    for dt in (np.int8, np.uint8, np.int16, np.uint16):
        x = np.array([0, 1, 5, 100], dt)
        np.testing.assert_array_equal(np.asarray(shift_right(x, 1, rounding="half_up")), [0, 1, 3, 50])


# ------------------------------------------------------------------- gradients


def test_grad_shift_right_is_straight_through_scale():
    x = jnp.array([-7.0, -1.0, 0.0, 3.0, 1000.0])
    s = jnp.array([0, 1, 2, 3, 4])
    g = jax.grad(lambda a: shift_right(a, s, rounding="half_up").sum())(x)
    np.testing.assert_array_equal(np.asarray(g), 2.0 ** -np.arange(5))
    # The surrogate is the derivative of the float function it approximates, x / 2**s:
    fd = np.asarray(x + 0.5) / 2.0 ** np.arange(5) - np.asarray(x - 0.5) / 2.0 ** np.arange(5)
    np.testing.assert_array_equal(np.asarray(g), fd)


def test_grad_shift_right_scale_exact_for_all_shifts():
    s = jnp.arange(0, 40)
    g = jax.grad(lambda a: shift_right(a, s, rounding="floor").sum())(jnp.full(40, 1000.0))
    np.testing.assert_array_equal(np.asarray(g), 2.0 ** -np.arange(40))


def test_grad_left_shift_zero_where_clipped():
    x = jnp.array([1.0, 2.0**30])
    g = jax.grad(lambda a: shift_right(a, -2, rounding="floor", allow_left=True).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), [4.0, 0.0])


def test_grad_saturate_zero_where_clipped_or_pass():
    x = jnp.array([-200.0, -127.0, 0.0, 127.0, 128.0])
    g = jax.grad(lambda a: saturate(a, 8).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), [0, 1, 1, 1, 0])
    g = jax.grad(lambda a: saturate(a, 8, saturation_grad="pass").sum())(x)
    np.testing.assert_array_equal(np.asarray(g), [1, 1, 1, 1, 1])


def test_grad_fixed_mul_linear_part():
    x = jnp.array([100.0, -3000.0, 32000.0])
    m = jnp.array([16384.0, 8192.0, 32767.0])
    gx, gm = jax.grad(lambda a, b: fixed_mul(a, b, 14, bits=16).sum(), argnums=(0, 1))(x, m)
    np.testing.assert_array_equal(np.asarray(gx), [1.0, 0.5, 0.0])  # last one saturates
    np.testing.assert_array_equal(np.asarray(gm), [100.0 / 16384, -3000.0 / 16384, 0.0])
    # Integer multiplier, float activations: gradient flows to x only.
    g = jax.grad(lambda a: fixed_mul(a, np.int16(8192), 14, bits=16).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), [0.5, 0.5, 0.5])


def test_float_forward_equals_integer_forward():
    x = np.arange(-1000, 1000, 13)
    np.testing.assert_array_equal(
        np.asarray(shift_right(x.astype(np.float32), 3, rounding="half_even")),
        np.asarray(shift_right(x.astype(np.int32), 3, rounding="half_even")),
    )


# ---------------------------------------------------------------------- errors


def test_errors_name_argument_and_range():
    with pytest.raises(ValueError, match="bits must lie in \\[2, 32\\]"):
        saturate(np.int32(1), 33)
    with pytest.raises(ValueError, match="rounding must be one of"):
        shift_right(np.int32(1), 1, rounding="nearest")
    with pytest.raises(ValueError, match="shift .*allow_left"):
        shift_right(np.int32(1), -1, rounding="floor")
    with pytest.raises(TypeError, match="x must have an integer dtype"):
        saturate(np.array([True]), 8)
    with pytest.raises(ValueError, match="frac_bits must lie in \\[0, 62\\]"):
        fixed_mul(np.int32(1), np.int32(1), 63)
    with pytest.raises(ValueError, match="does not broadcast"):
        fixed_mul(np.zeros(3, np.int32), np.zeros(4, np.int32), 1)
    with pytest.raises(ValueError, match="integer values only"):
        saturate(np.array([0.5], np.float32), 8)
    with pytest.raises(ValueError, match="int32 range"):
        shift_right(2**40, 1, rounding="floor")


# ------------------------------------------------------------------------- div_rn

_NORMAL_F32 = st.floats(min_value=2.0**-60, max_value=2.0**60, width=32)


@given(_NORMAL_F32, _NORMAL_F32, st.booleans(), st.booleans())
def test_div_rn_is_ieee_division(a, b, neg_a, neg_b):
    a, b = np.float32(-a if neg_a else a), np.float32(-b if neg_b else b)
    assert np.asarray(div_rn(a, b)) == a / b  # NumPy's float32 division is IEEE (correctly rounded)


def test_div_rn_on_arrays_and_zero():
    rng = np.random.default_rng(0)
    a = (rng.choice([-1, 1], 20000) * 10 ** rng.uniform(-6, 6, 20000)).astype(np.float32)
    b = (rng.choice([-1, 1], 20000) * 10 ** rng.uniform(-6, 6, 20000)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(div_rn(a, b)), a / b)
    np.testing.assert_array_equal(np.asarray(jax.vmap(div_rn)(a, b)), a / b)
    assert float(div_rn(np.float32(0), np.float32(3))) == 0.0


# ------------------------------------------------------------------------- mul_rn


def py_f32_product(a: float, b: float) -> np.float32:
    """fl32(a * b) of float32 a, b, from the exact rational product (Python integers),
    rounded once, ties to even; results below 2**-126 in magnitude flushed to zero."""
    from fractions import Fraction

    p = Fraction(float(a)) * Fraction(float(b))
    if p == 0:
        return np.float32(0)
    mag, e = abs(p), 0
    while mag >= 2**24:
        mag, e = mag / 2, e + 1
    while mag < 2**23:
        mag, e = mag * 2, e - 1
    q, r = divmod(mag.numerator, mag.denominator)  # mag = q + r / den, q in [2**23, 2**24)
    q += 2 * r > mag.denominator or (2 * r == mag.denominator and q % 2 == 1)
    v = q * 2.0**e  # exact in float64 (q <= 2**24)
    if v < 2.0**-126:
        return np.float32(0)
    return np.float32(v if p > 0 else -v)  # v is a float32 value, or >= 2**128: inf


_WIDE_F32 = st.floats(min_value=2.0**-126, max_value=2.0**127, width=32)


@given(_WIDE_F32, _WIDE_F32, st.booleans(), st.booleans())
def test_mul_rn_is_the_rounded_exact_product(a, b, neg_a, neg_b):
    a, b = np.float32(-a if neg_a else a), np.float32(-b if neg_b else b)
    with np.errstate(over="ignore"):
        want = py_f32_product(a, b)
    got = np.asarray(mul_rn(a, b))
    assert got == want and np.signbit(got) == np.signbit(want) or (got == 0 and want == 0)


@given(
    st.lists(st.integers(-(2**24), 2**24), min_size=8, max_size=8),
    st.floats(min_value=2.0**-40, max_value=2.0**10, width=32),
    st.floats(-1e6, 1e6, width=32),
)
def test_mul_rn_then_add_rounds_twice_in_any_program(xs, s, c):
    """``mul_rn(x, s) + c`` is ``fl32(fl32(x s) + c)`` (two roundings) in a jitted program,
    where XLA may contract a plain ``x * s + c`` into one fused multiply-add, and
    inside a vmapped one."""
    x, s, c = np.array(xs, np.int32), np.float32(s), np.float32(c)
    want = np.array([py_f32_product(np.float32(v), s) for v in x], np.float32) + c
    f = jax.jit(lambda x, s, c: mul_rn(x, s) + c)
    np.testing.assert_array_equal(np.asarray(f(x, s, c)), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(f, (0, None, None))(x, s, c)), want)


def test_mul_rn_edges_and_transforms():
    big, tiny = np.float32(2.0**100), np.float32(2.0**-100)
    f32 = np.float32
    cases = [
        (big, big, np.inf),
        (-big, big, -np.inf),
        (tiny, tiny, 0.0),
        (f32(0), f32(3), 0.0),
        (f32(3), f32(-0.0), 0.0),
        (f32(np.inf), f32(2), np.inf),
        (f32(np.inf), f32(0), np.nan),
        (f32(np.nan), f32(1), np.nan),
        (f32(1 + 2.0**-23), f32(1 + 2.0**-23), f32(1 + 2.0**-22)),
        (f32(3), f32(1 / 3), f32(3) * f32(1 / 3)),
    ]
    a, b, want = (np.array(v, np.float32) for v in zip(*cases))
    for fn in (mul_rn, jax.jit(mul_rn), jax.vmap(mul_rn)):
        np.testing.assert_array_equal(np.asarray(fn(a, b)), want)
    np.testing.assert_array_equal(np.asarray(mul_rn(np.int8([-128, 127]), f32(0.5))), f32([-64, 63.5]))
    g = jax.grad(lambda v: jnp.sum(mul_rn(v, f32(2))))(f32([1.0, 2.0]))  # no gradient: zeros
    np.testing.assert_array_equal(np.asarray(g), f32([0, 0]))


def _py_rint_half_even(num: int, s: int) -> int:
    """rint(num / 2**s), ties to even, with Python integers (s >= 0)."""
    q, r = divmod(num, 1 << s)
    return q + (2 * r > (1 << s) or (2 * r == (1 << s) and q % 2 == 1))


@given(a=st.integers(-(2**62), 2**62), s=st.integers(0, 63), tie=st.booleans())
def test_wide_rint_pair_matches_big_integers(a, s, tie):
    """wide.rint_pair(a, s) = (rint(a / 2**s), rint(a / 2**s - 1)), ties to even, for
    two-word a; ``tie`` makes a an exact tie (a = (2q + 1) 2**(s-1)), the case where the
    two differ by 0 or 2."""
    from hwjax.core import wide as W

    if tie and s >= 1:
        a = ((a >> s) * 2 + 1) << (s - 1)
    r, r1 = jax.jit(W.rint_pair)(W.from_python([a]), jnp.int32(s))
    assert [int(v) for v in W.to_python(r)] == [_py_rint_half_even(a, s)]
    assert [int(v) for v in W.to_python(r1)] == [_py_rint_half_even(a - (1 << s), s)]


# ------------------------------------------------------------------------ compute_once


@pytest.mark.parametrize("trigger", [0, 1, -1, 2**31 - 1, -(2**31), -(2**31) + 1])
def test_compute_once_is_fn_for_every_trigger(trigger):
    """compute_once returns fn's value whatever the trigger's value (its other branch is
    never taken), eagerly, under jit, and under vmap with the trigger mapped or not."""
    from hwjax.core import compute_once

    def fn(a, b):
        return {"s": a * 3 + b, "d": a - b}

    a, b = jnp.arange(-6, 6, dtype=jnp.int32).reshape(3, 4), jnp.int32(5)
    want = {"s": np.asarray(a) * 3 + 5, "d": np.asarray(a) - 5}
    t = jnp.int32(trigger)
    got = [
        compute_once(fn, (a, b), t),
        jax.jit(lambda a, b, t: compute_once(fn, (a, b), t))(a, b, t),
        jax.vmap(lambda r: compute_once(fn, (r, b), t))(a),
        jax.vmap(lambda r, tt: compute_once(fn, (r, b), tt))(a, jnp.full((3,), trigger, jnp.int32)),
    ]
    for g in got:
        assert {k: np.asarray(v).tolist() for k, v in g.items()} == {k: v.tolist() for k, v in want.items()}


def test_compute_once_keeps_its_conditional_and_its_branches_compile_to_nothing():
    """Under jit the result passes through a conditional that XLA keeps (the barrier), whose
    two branches only return their operands: no kernel of their own (e.g. no zeros)."""
    import re

    from hwjax.core import compute_once

    def f(a, t):
        y = compute_once(lambda v: (v * 3 + 1) >> 2, (a,), t)
        return y[:-2] + y[1:-1] + y[2:]  # three consumers that would each recompute fn

    a = jnp.arange(1024, dtype=jnp.int32)
    text = jax.jit(f).lower(a, jnp.int32(0)).compile().as_text()
    conds = re.findall(r"conditional\(.*branch_computations=\{([^}]*)\}", text)
    assert len(conds) == 1
    for name in re.findall(r"%([\w.-]+)", conds[0]):
        body = re.search(r"^%" + re.escape(name) + r" .*?^}", text, re.S | re.M).group(0)
        assert "fusion(" not in body and "broadcast(" not in body, body
    assert np.asarray(jax.jit(f)(a, jnp.int32(0))).tolist() == np.asarray(f(a, jnp.int32(0))).tolist()


def test_evaluated_if_concrete_computes_at_once_only_inside_a_trace():
    """Inside a jit trace, work on concrete values under evaluated_if_concrete gives
    concrete arrays (readable with NumPy); work on traced values is traced as before; in an
    eager call the context does nothing (no compile-time evaluation entered)."""
    from hwjax.core import evaluated_if_concrete

    w = np.arange(6, dtype=np.int32)
    seen = {}

    def f(x):
        with evaluated_if_concrete(w):
            seen["concrete"] = jnp.cumsum(jnp.asarray(w)) * 2
        with evaluated_if_concrete(x):
            seen["traced"] = x * 2
        return x + seen["concrete"]

    y = jax.jit(f)(jnp.ones(6, jnp.int32))
    assert not isinstance(seen["concrete"], jax.core.Tracer)
    assert np.asarray(seen["concrete"]).tolist() == [0, 2, 6, 12, 20, 30]
    assert isinstance(seen["traced"], jax.core.Tracer)
    assert np.asarray(y).tolist() == [1, 3, 7, 13, 21, 31]
    import contextlib

    assert isinstance(evaluated_if_concrete(w), contextlib.nullcontext)  # eager: nothing entered
    jax.jit(lambda x: seen.update(inside=evaluated_if_concrete(w)) or x)(1)
    assert not isinstance(seen["inside"], contextlib.nullcontext)
