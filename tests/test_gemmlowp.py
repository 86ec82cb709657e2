"""hwjax.gemmlowp: fixed-point helpers, the uint8 GEMM and its output stages.

Golden vectors (fixedpoint_tflite.npz, gemm_uint8_pipelines.npz) and plain-Python
big-integer models; jit, vmap, x64, gradients, errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwjax.gemmlowp as G
from hwjax.core import fixed_mul
from tests.conftest import golden_path

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# int32 values with the edges over-represented (fixed-length lists: one compilation)
_EDGES = [
    INT32_MIN,
    INT32_MIN + 1,
    -(2**30) - 1,
    -(2**30),
    -(2**30) + 1,
    -3,
    -2,
    -1,
    0,
    1,
    2,
    3,
    2**30 - 1,
    2**30,
    2**30 + 1,
    INT32_MAX - 1,
    INT32_MAX,
]
I32 = st.one_of(st.sampled_from(_EDGES), st.integers(INT32_MIN, INT32_MAX))
N = 64


# ------------------------------------------------------------------ plain-Python models


def wrap32(v: int) -> int:
    return ((v + 2**31) % 2**32) - 2**31


def py_srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    return (a * b + 2**30) // 2**31  # floor: ties toward +inf


def py_srdhm16(a: int, b: int) -> int:
    if a == b == -(2**15):
        return 2**15 - 1
    return (a * b + 2**14) // 2**15


def py_rdbpot(x: int, e: int) -> int:
    """The upstream mask/threshold formulation, on Python integers."""
    mask = (1 << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if remainder > threshold else 0)


def py_rdbpot_closed(x: int, e: int) -> int:
    if e == 0:
        return x
    s = -1 if x < 0 else 1
    return s * ((abs(x) + 2 ** (e - 1)) // 2**e)


def py_shl(x: int, e: int, overflow: str) -> int:
    v = x * 2**e
    return min(max(v, INT32_MIN), INT32_MAX) if overflow == "saturate" else wrap32(v)


def py_gemm_acc(lhs, rhs, lo, ro) -> np.ndarray:
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    lo = np.broadcast_to(np.asarray(lo, object), (rows,))
    ro = np.broadcast_to(np.asarray(ro, object), (cols,))
    a = lhs.astype(object) + lo[:, None]
    b = rhs.astype(object) + ro[None, :]
    return np.vectorize(wrap32, otypes=[np.int64])(a.dot(b))


# ----------------------------------------------------------------- fixed point: golden


@pytest.fixture(scope="module")
def fixedpoint():
    return np.load(golden_path("gemmlowp", "fixedpoint_tflite.npz"))


@pytest.fixture(scope="module")
def pipelines():
    return np.load(golden_path("gemmlowp", "gemm_uint8_pipelines.npz"))


def test_srdhm_golden(fixedpoint):
    a, b, want = fixedpoint["srdhm_a"], fixedpoint["srdhm_b"], fixedpoint["srdhm_out"]
    got = np.asarray(G.srdhm(a.astype(np.int32), b.astype(np.int32)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    # the golden edge cases hold exact ties of both signs: SRDHM rounds them toward +inf
    p = a.astype(object) * b.astype(object)
    ties = (p % 2**31) == 2**30
    assert (ties & (p < 0)).sum() > 10 and (ties & (p > 0)).sum() > 10
    np.testing.assert_array_equal(want[ties], [(int(v) + 2**30) // 2**31 for v in p[ties]])


def test_fixed_mul_docstring_equivalence_for_srdhm(fixedpoint):
    """hwjax.core.fixed_mul's docstring states that gemmlowp's SRDHM is
    fixed_mul(a, b, 31, rounding="half_up", symmetric=False): pin that on the golden
    edge cases, and that "half_away" is NOT it (negative ties differ)."""
    a = fixedpoint["srdhm_a"].astype(np.int32)
    b = fixedpoint["srdhm_b"].astype(np.int32)
    want = fixedpoint["srdhm_out"]
    got = np.asarray(fixed_mul(a, b, 31, rounding="half_up", bits=32, symmetric=False))
    np.testing.assert_array_equal(got, want)
    away = np.asarray(fixed_mul(a, b, 31, rounding="half_away", bits=32, symmetric=False))
    assert (away != want).any()


def test_srdhm_spec_examples():
    a = np.array([-(2**15), 2**15, -3 * 2**15, INT32_MIN, INT32_MIN, INT32_MAX], np.int32)
    b = np.array([2**15, 2**15, 2**15, INT32_MIN, INT32_MAX, INT32_MAX], np.int32)
    want = [py_srdhm(int(x), int(y)) for x, y in zip(a, b)]
    assert want[:4] == [0, 1, -1, INT32_MAX]  # -2**30 -> 0, 2**30 -> 1, -3*2**30 -> -1, saturation
    np.testing.assert_array_equal(np.asarray(G.srdhm(a, b)), want)


def test_rdbpot_golden(fixedpoint):
    x, e, want = fixedpoint["rdbpot_x"], fixedpoint["rdbpot_exponent"], fixedpoint["rdbpot_out"]
    got = np.asarray(G.rounding_divide_by_pot(x.astype(np.int32), e.astype(np.int32)))
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(e)) == set(range(32))


def test_rdbpot_spec_examples():
    x = np.array([4, -4, -12, -11, 7], np.int32)
    got = np.asarray(G.rounding_divide_by_pot(x, 3))
    np.testing.assert_array_equal(got, [py_rdbpot(int(v), 3) for v in x])
    assert [py_rdbpot(int(v), 3) for v in x[:4]] == [1, -1, -2, -1]


# ------------------------------------------------------------- fixed point: properties


@given(a=st.lists(I32, min_size=N, max_size=N), b=st.lists(I32, min_size=N, max_size=N))
def test_srdhm_matches_bigint_model(a, b):
    got = np.asarray(G.srdhm(np.array(a, np.int32), np.array(b, np.int32)))
    np.testing.assert_array_equal(got, [py_srdhm(x, y) for x, y in zip(a, b)])


@given(
    a=st.lists(st.integers(-(2**15), 2**15 - 1), min_size=N, max_size=N),
    b=st.lists(
        st.sampled_from([-(2**15), -(2**15) + 1, -1, 0, 1, 2**14, 2**15 - 1]) | st.integers(-(2**15), 2**15 - 1),
        min_size=N,
        max_size=N,
    ),
)
def test_srdhm_int16_matches_bigint_model(a, b):
    got = np.asarray(G.srdhm_int16(np.array(a, np.int16), np.array(b, np.int16)))
    np.testing.assert_array_equal(got, [py_srdhm16(x, y) for x, y in zip(a, b)])


@given(x=st.lists(I32, min_size=N, max_size=N), e=st.lists(st.integers(0, 31), min_size=N, max_size=N))
def test_rdbpot_matches_bigint_models(x, e):
    got = np.asarray(G.rounding_divide_by_pot(np.array(x, np.int32), np.array(e, np.int32)))
    want = [py_rdbpot(v, k) for v, k in zip(x, e)]
    np.testing.assert_array_equal(got, want)
    assert want == [py_rdbpot_closed(v, k) for v, k in zip(x, e)]


@given(
    x=st.lists(I32, min_size=N, max_size=N),
    e=st.lists(st.integers(0, 31), min_size=N, max_size=N),
    overflow=st.sampled_from(["saturate", "wrap"]),
)
def test_shift_left_matches_model(x, e, overflow):
    got = np.asarray(G.shift_left(np.array(x, np.int32), np.array(e, np.int32), overflow=overflow))
    np.testing.assert_array_equal(got, [py_shl(v, k, overflow) for v, k in zip(x, e)])


# ----------------------------------------------------------------- GEMM: golden


def _stages_A(g, k: int):
    p = lambda name: g[f"A__p{k}__{name}"]
    if k == 1:
        return (
            G.QuantizeDownInt32ToUint8Scale(int(p("result_offset")), int(p("result_mult_int")), int(p("result_shift"))),
            G.SaturatingCastToUint8(),
        )
    if k in (2, 7):
        return (
            G.QuantizeDownInt32ToUint8Scale(int(p("result_offset")), int(p("result_mult_int")), int(p("result_shift"))),
        )
    if k == 3:
        return (
            G.BiasAddition(p("bias"), shape="row"),
            G.QuantizeDownInt32ByFixedPoint(
                int(p("result_fixedpoint_multiplier")), int(p("result_shift")), int(p("result_offset_after_shift"))
            ),
            G.SaturatingCastToInt8(),
        )
    if k == 4:
        return (
            G.ScaleInt32ByFixedPointAndExponent(
                int(p("result_fixedpoint_multiplier")), int(p("result_exponent")), int(p("result_offset_after_shift"))
            ),
            G.Clamp(int(p("clamp_min")), int(p("clamp_max"))),
            G.SaturatingCastToInt16(),
        )
    if k == 5:
        return (
            G.ScaleInt32ByFixedPointAndExponentPC(
                p("result_fixedpoint_multiplier"),
                p("result_exponent"),
                int(p("result_offset_after_shift")),
                shape="col",
            ),
            G.SaturatingCastToUint8(),
        )
    if k == 6:
        return (
            G.QuantizeDownInt32ToUint8ScalePC(
                p("result_offset"), p("result_mult_int"), int(p("result_shift")), shape="row"
            ),
            G.Clamp(int(p("clamp_min")), int(p("clamp_max"))),
            G.TruncatingCastToUint8(),
        )
    raise ValueError(k)


_OUT_DTYPES = {1: np.uint8, 2: np.int32, 3: np.int8, 4: np.int16, 5: np.uint8, 6: np.uint8, 7: np.int32}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_gemm_A_pipelines_golden(pipelines, k):
    g = pipelines
    out = G.gemm(
        g["A__lhs"],
        g["A__rhs"],
        lhs_offset=int(g["A__lhs_offset"]),
        rhs_offset=int(g["A__rhs_offset"]),
        output_stages=_stages_A(g, k),
    )
    assert out.dtype == _OUT_DTYPES[k]
    np.testing.assert_array_equal(np.asarray(out), g[f"A__p{k}__out"])


def test_gemm_A_accumulator_and_legacy_golden(pipelines):
    g = pipelines
    acc = G.gemm(g["A__lhs"], g["A__rhs"], lhs_offset=int(g["A__lhs_offset"]), rhs_offset=int(g["A__rhs_offset"]))
    assert acc.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(acc), g["A__acc_int32"])
    np.testing.assert_array_equal(
        np.asarray(acc), py_gemm_acc(g["A__lhs"], g["A__rhs"], int(g["A__lhs_offset"]), int(g["A__rhs_offset"]))
    )
    legacy = G.eight_bit_int_gemm(
        g["A__lhs"],
        g["A__rhs"],
        a_offset=int(g["A__lhs_offset"]),
        b_offset=int(g["A__rhs_offset"]),
        c_offset=int(g["A__p1__result_offset"]),
        c_mult_int=int(g["A__p1__result_mult_int"]),
        c_shift=int(g["A__p1__result_shift"]),
    )
    np.testing.assert_array_equal(np.asarray(legacy), g["A__p1__legacy_Gemm_out"])


def test_gemm_A_p2_has_negative_ties_away_from_zero(pipelines):
    """A__p2 holds 7 negative exact ties: RDBPOT (ties away from zero), not the
    documented '+ 2**(shift-1) >> shift' (ties toward +inf)."""
    g = pipelines
    v = g["A__acc_int32"].astype(np.int64) + int(g["A__p2__result_offset"])
    ties = (v < 0) & (v % 32 == 16)
    assert ties.sum() == 7
    np.testing.assert_array_equal(g["A__p2__out"][ties], -((-v[ties] + 16) // 32))
    assert (g["A__p2__out"][ties] != (v[ties] + 16) >> 5).all()


def test_gemm_A_p8_shift_left_saturates_by_default_and_wraps_on_request(pipelines):
    g = pipelines
    p = lambda name: int(g[f"A__p8__{name}"])
    args = (p("result_fixedpoint_multiplier"), p("result_exponent"), p("result_offset_after_shift"))
    run = lambda st: np.asarray(
        G.gemm(
            g["A__lhs"],
            g["A__rhs"],
            lhs_offset=int(g["A__lhs_offset"]),
            rhs_offset=int(g["A__rhs_offset"]),
            output_stages=(st,),
        )
    )
    sat = run(G.ScaleInt32ByFixedPointAndExponent(*args))
    np.testing.assert_array_equal(sat, g["A__p8__out_scalar"])
    wrapped = run(G.ScaleInt32ByFixedPointAndExponent(*args, shift_left_overflow="wrap"))
    # The SSE4 build wraps in SIMD registers everywhere except the scalar leftover
    # corner [8:11, 12], which saturates; the position-dependent mixture is not emulated.
    sse = g["A__p8__out_sse4"]
    simd = np.ones(sse.shape, bool)
    simd[8:11, 12] = False
    np.testing.assert_array_equal(wrapped[simd], sse[simd])
    np.testing.assert_array_equal(sat[~simd], sse[~simd])
    assert (wrapped != sat).sum() == 23  # every overflowing entry differs between the two


def test_gemm_B_per_channel_offsets_golden(pipelines):
    g = pipelines
    kw = dict(lhs_offset=g["B__lhs_offset"], rhs_offset=g["B__rhs_offset"])
    acc = G.gemm(g["B__lhs"], g["B__rhs"], **kw)
    np.testing.assert_array_equal(np.asarray(acc), g["B__acc_int32"])
    np.testing.assert_array_equal(
        np.asarray(acc), py_gemm_acc(g["B__lhs"], g["B__rhs"], g["B__lhs_offset"], g["B__rhs_offset"])
    )
    p1 = G.gemm(
        g["B__lhs"],
        g["B__rhs"],
        **kw,
        output_stages=(
            G.ScaleInt32ByFixedPointAndExponent(
                int(g["B__p1__result_fixedpoint_multiplier"]),
                int(g["B__p1__result_exponent"]),
                int(g["B__p1__result_offset_after_shift"]),
            ),
            G.SaturatingCastToUint8(),
        ),
    )
    np.testing.assert_array_equal(np.asarray(p1), g["B__p1__out"])
    p2 = G.gemm(
        g["B__lhs"],
        g["B__rhs"],
        **kw,
        output_stages=[G.BiasAddition(g["B__p2__bias"], shape="col"), G.SaturatingCastToInt16()],
    )
    assert p2.dtype == np.int16
    np.testing.assert_array_equal(np.asarray(p2), g["B__p2__out"])


# ------------------------------------------------------------ GEMM: model properties

_ROWS, _DEPTH, _COLS = 5, 9, 4


@settings(max_examples=25)
@given(data=st.data())
def test_gemm_matches_bigint_model_with_wrapping_offsets(data):
    u8 = st.integers(0, 255)
    lhs = np.array(data.draw(st.lists(u8, min_size=_ROWS * _DEPTH, max_size=_ROWS * _DEPTH)), np.uint8)
    rhs = np.array(data.draw(st.lists(u8, min_size=_DEPTH * _COLS, max_size=_DEPTH * _COLS)), np.uint8)
    lhs, rhs = lhs.reshape(_ROWS, _DEPTH), rhs.reshape(_DEPTH, _COLS)
    lo = np.array(data.draw(st.lists(I32, min_size=_ROWS, max_size=_ROWS)), np.int32)
    ro = np.array(data.draw(st.lists(I32, min_size=_COLS, max_size=_COLS)), np.int32)
    got = np.asarray(G.gemm(lhs, rhs, lhs_offset=lo, rhs_offset=ro))
    np.testing.assert_array_equal(got, py_gemm_acc(lhs, rhs, lo, ro))
    # scalar offsets take the same path
    got = np.asarray(G.gemm(lhs, rhs, lhs_offset=int(lo[0]), rhs_offset=int(ro[0])))
    np.testing.assert_array_equal(got, py_gemm_acc(lhs, rhs, int(lo[0]), int(ro[0])))


@settings(max_examples=25)
@given(
    x=st.lists(I32, min_size=_ROWS * _COLS, max_size=_ROWS * _COLS),
    m=I32,
    e=st.integers(-31, 31),
    o=I32,
    overflow=st.sampled_from(["saturate", "wrap"]),
    s=st.integers(0, 31),
)
def test_stages_match_bigint_models(x, m, e, o, overflow, s):
    acc = np.array(x, np.int32).reshape(_ROWS, _COLS)
    xs = [int(v) for v in acc.ravel()]
    scale = G.apply_output_stages(acc, [G.ScaleInt32ByFixedPointAndExponent(m, e, o, shift_left_overflow=overflow)])
    want = [wrap32(py_rdbpot(py_srdhm(py_shl(v, max(e, 0), overflow), m), max(-e, 0)) + o) for v in xs]
    np.testing.assert_array_equal(np.asarray(scale).ravel(), want)
    fp = G.apply_output_stages(acc, [G.QuantizeDownInt32ByFixedPoint(m, s, o)])
    np.testing.assert_array_equal(np.asarray(fp).ravel(), [wrap32(py_rdbpot(py_srdhm(v, m), s) + o) for v in xs])
    q = G.apply_output_stages(acc, [G.QuantizeDownInt32ToUint8Scale(o, m, s)])
    np.testing.assert_array_equal(np.asarray(q).ravel(), [py_rdbpot(wrap32(wrap32(v + o) * m), s) for v in xs])


def test_clamp_applies_lower_bound_first_and_casts():
    acc = np.array([[-70000, -200, -1, 0, 200, 300, 70000]], np.int32)
    out = G.apply_output_stages(acc, [G.Clamp(10, 5)])
    np.testing.assert_array_equal(np.asarray(out), np.full_like(acc, 5))  # min > max yields max
    for stage, lo, hi, dt in (
        (G.SaturatingCastToUint8(), 0, 255, np.uint8),
        (G.SaturatingCastToInt8(), -128, 127, np.int8),
        (G.SaturatingCastToInt16(), -32768, 32767, np.int16),
    ):
        out = G.apply_output_stages(acc, [stage])
        assert out.dtype == dt
        np.testing.assert_array_equal(np.asarray(out), np.clip(acc, lo, hi))
    out = G.apply_output_stages(acc, [G.TruncatingCastToUint8()])
    np.testing.assert_array_equal(np.asarray(out), [[v % 256 for v in acc[0]]])


# ------------------------------------------------------------- jit / vmap / x64 / grad


def _small_problem(seed=0, batch=None):
    rng = np.random.default_rng(seed)
    shape_l = (_ROWS, _DEPTH) if batch is None else (batch, _ROWS, _DEPTH)
    lhs = rng.integers(0, 256, shape_l).astype(np.uint8)
    rhs = rng.integers(0, 256, (_DEPTH, _COLS)).astype(np.uint8)
    return lhs, rhs


def test_gemm_under_jit_with_traced_stage_parameters():
    lhs, rhs = _small_problem()

    @jax.jit
    def f(lhs, rhs, lo, mult, exponent):
        return G.gemm(
            lhs,
            rhs,
            lhs_offset=lo,
            rhs_offset=-7,
            output_stages=(G.ScaleInt32ByFixedPointAndExponent(mult, exponent, 3), G.SaturatingCastToInt16()),
        )

    got = f(lhs, rhs, np.int32(-100), np.int32(1500000000), np.int32(-4))
    acc = py_gemm_acc(lhs, rhs, -100, -7)
    want = [
        [min(max(wrap32(py_rdbpot(py_srdhm(int(v), 1500000000), 4) + 3), -32768), 32767) for v in row] for row in acc
    ]
    assert got.dtype == np.int16
    np.testing.assert_array_equal(np.asarray(got), want)


def test_gemm_vmap_over_lhs_and_stage_parameters():
    lhs, rhs = _small_problem(1, batch=3)
    mults = np.array([5, -7, 2**30], np.int32)

    def f(a, m):
        return G.gemm(
            a,
            rhs,
            lhs_offset=-128,
            rhs_offset=np.arange(_COLS, dtype=np.int32) - 130,
            output_stages=[G.QuantizeDownInt32ToUint8Scale(17, m, 9)],
        )

    got = jax.vmap(f)(lhs, mults)
    for i in range(3):
        acc = py_gemm_acc(lhs[i], rhs, -128, np.arange(_COLS) - 130)
        want = [[py_rdbpot(wrap32(wrap32(int(v) + 17) * int(mults[i])), 9) for v in row] for row in acc]
        np.testing.assert_array_equal(np.asarray(got[i]), want)


def test_stages_are_pytrees():
    st_ = G.ScaleInt32ByFixedPointAndExponentPC(np.arange(3), np.arange(3), 5, shape="col")
    leaves, tree = jax.tree_util.tree_flatten(st_)
    assert len(leaves) == 3
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert back.shape == "col" and back.shift_left_overflow == "saturate"
    with pytest.raises(Exception):
        st_.result_exponent = 1  # frozen
    # Stages of different classes never share a tree structure (jit keys its cache on it;
    # JAX's registered dataclasses with equal static fields compare equal across classes).
    structure = jax.tree_util.tree_structure
    assert structure(G.SaturatingCastToUint8()) != structure(G.SaturatingCastToInt16())
    assert structure(G.QuantizeDownInt32ToUint8Scale(1, 2, 3)) != structure(G.QuantizeDownInt32ByFixedPoint(1, 2, 3))
    assert structure(G.Clamp(1, 2)) == structure(G.Clamp(3, 4))


def test_results_identical_with_x64(pipelines):
    g = pipelines

    def run():
        acc = G.gemm(g["B__lhs"], g["B__rhs"], lhs_offset=g["B__lhs_offset"], rhs_offset=g["B__rhs_offset"])
        a = np.asarray(acc)
        x = np.array([INT32_MIN, -(2**30), 2**30, INT32_MAX, -12345], np.int32)
        return [
            a,
            np.asarray(G.srdhm(x, x[::-1])),
            np.asarray(G.rounding_divide_by_pot(x, 7)),
            np.asarray(G.rounding_multiply_by_constant_fraction(x, 65025, 3937)),
        ]

    base = run()
    with jax.enable_x64(True):
        wide = run()
    np.testing.assert_array_equal(base[0], g["B__acc_int32"])
    for a, b in zip(base, wide):
        assert a.dtype == b.dtype == np.int32
        np.testing.assert_array_equal(a, b)


def test_srdhm_and_rdbpot_gradients_for_float_inputs():
    a = jnp.array([3.0, -(2.0**20), 2.0**30])
    b = jnp.array([2.0**31 - 1, 2.0**12, -(2.0**31)])
    ga, gb = jax.grad(lambda x, y: G.srdhm(x, y).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(np.asarray(ga), np.asarray(b) / 2.0**31)
    np.testing.assert_array_equal(np.asarray(gb), np.asarray(a) / 2.0**31)
    val = G.srdhm(a, b)
    np.testing.assert_array_equal(np.asarray(val), [py_srdhm(int(x), int(y)) for x, y in zip(a, b)])
    g = jax.grad(lambda x: G.rounding_divide_by_pot(x, jnp.array([0, 3, 31])).sum())(a)
    np.testing.assert_array_equal(np.asarray(g), [1.0, 2.0**-3, 2.0**-31])


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument_and_range():
    lhs, rhs = _small_problem()
    ok = dict(lhs_offset=0, rhs_offset=0)
    with pytest.raises(ValueError, match=r"lhs must lie in \[0, 255\]"):
        G.gemm(np.where(lhs == lhs.max(), np.int32(256), lhs.astype(np.int32)), rhs, **ok)
    with pytest.raises(ValueError, match=r"rhs must lie in \[0, 255\]"):
        G.gemm(lhs, rhs.astype(np.int32) - 255, **ok)
    with pytest.raises(TypeError, match="lhs must be an integer"):
        G.gemm(lhs.astype(np.float32), rhs, **ok)
    with pytest.raises(ValueError, match="depths must match"):
        G.gemm(lhs, rhs[1:], **ok)
    with pytest.raises(ValueError, match="lhs must be a 2-D matrix"):
        G.gemm(lhs[0], rhs, **ok)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        G.gemm(lhs[:, :0], rhs[:0], **ok)
    with pytest.raises(ValueError, match=r"lhs_offset must be a scalar or a vector of length 5"):
        G.gemm(lhs, rhs, lhs_offset=np.zeros(4, np.int32), rhs_offset=0)
    with pytest.raises(ValueError, match=r"rhs_offset must lie in \[-2147483648, 2147483647\]"):
        G.gemm(lhs, rhs, lhs_offset=0, rhs_offset=2**31)
    with pytest.raises(ValueError, match=r"result_shift must lie in \[0, 31\]"):
        G.gemm(lhs, rhs, **ok, output_stages=[G.QuantizeDownInt32ToUint8Scale(0, 1, 32)])
    with pytest.raises(ValueError, match=r"result_exponent must lie in \[-31, 31\]"):
        G.gemm(lhs, rhs, **ok, output_stages=[G.ScaleInt32ByFixedPointAndExponent(1, -32, 0)])
    with pytest.raises(ValueError, match=r"bias \(row-shaped: one per column\) must have length 4"):
        G.gemm(lhs, rhs, **ok, output_stages=[G.BiasAddition(np.zeros(5, np.int32))])
    with pytest.raises(ValueError, match="cast stage and must be the last"):
        G.gemm(lhs, rhs, **ok, output_stages=[G.SaturatingCastToUint8(), G.Clamp(0, 1)])
    with pytest.raises(TypeError, match="not a gemmlowp output stage"):
        G.gemm(lhs, rhs, **ok, output_stages=[lambda x: x])
    with pytest.raises(ValueError, match="shift_left_overflow must be one of"):
        G.gemm(lhs, rhs, **ok, output_stages=[G.ScaleInt32ByFixedPointAndExponent(1, 1, 0, shift_left_overflow="x")])
    with pytest.raises(ValueError, match=r"exponent must lie in \[0, 31\]"):
        G.rounding_divide_by_pot(np.int32(5), 32)
    with pytest.raises(ValueError, match=r"a must lie in \[-32768, 32767\]"):
        G.srdhm_int16(np.int32(2**15), np.int32(1))
    with pytest.raises(ValueError, match=r"b=2147483648 is outside the int32 range"):
        G.srdhm(1, 2**31)
