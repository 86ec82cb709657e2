"""LOGISTIC, TANH and SOFTMAX (int8) against LiteRT itself, per runtime (BUILTIN_REF,
builtin optimized kernels, the default XNNPACK delegate): random one-op models built
with the flatbuffer object API, inputs covering all 256 int8 values, exact equality.
The gemmlowp fixed-point helpers are checked against a plain-Python big-integer model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("ai_edge_litert")

import hwjax.graph as hg
import hwjax.tflite as tfl
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets import TFLite
from hwjax.litert import _nonlinear as K
from hwjax.tflite.testing import ModelBuilder, run_litert

RUNTIMES = ("reference", "optimized", "xnnpack")
LOGISTIC_OUT, TANH_OUT = (1 / 256, -128), (1 / 128, 0)


# ------------------------------------------------------------------------ models


def unary_model(op, shape, s_in, z_in, s_out, z_out, *, dtype="int8", options=None) -> bytes:
    """One ``op`` between an input (s_in, z_in) and an output (s_out, z_out) of ``shape``."""
    mb = ModelBuilder()
    a = mb.tensor((1, *shape), dtype, np.float32(s_in), z_in)
    b = mb.tensor((1, *shape), dtype, np.float32(s_out), z_out)
    mb.op(op, [a], [b], options)
    return mb.finish([a], [b])


def softmax_model(shape, s_in, z_in, beta, s_out=1 / 256, z_out=-128) -> bytes:
    return unary_model("SOFTMAX", shape, s_in, z_in, s_out, z_out, options=("SoftmaxOptions", {"beta": beta}))


def all_values_batch(rng, shape, batch) -> np.ndarray:
    """``batch`` random int8 examples of ``shape`` whose first 256 values are -128..127
    (shuffled): every int8 input value occurs."""
    x = rng.integers(-128, 128, (batch, *shape))
    flat = x.reshape(-1)
    assert flat.size >= 256
    flat[:256] = rng.permutation(np.arange(-128, 128))
    return flat.reshape(x.shape).astype(np.int8)


# (op, input scale, input zero point, output quantisation): large and tiny scales,
# the converter's output quantisation and other ones LiteRT accepts
LUT_CASES = [
    ("LOGISTIC", 0.05, 3, LOGISTIC_OUT),
    ("LOGISTIC", 10.0, -128, LOGISTIC_OUT),
    ("LOGISTIC", 1e-5, 127, LOGISTIC_OUT),
    ("LOGISTIC", 0.0123, -7, (1 / 256, 0)),
    ("TANH", 0.02, 0, TANH_OUT),
    ("TANH", 4.0, 50, TANH_OUT),
    ("TANH", 2e-5, -100, TANH_OUT),
    ("TANH", 0.031, 9, (0.01, 5)),
]
LUT_SWEEP = 12  # and this many random input scales (1e-4 .. 10) and zero points per op

# (name, shape, input scale, zero point, beta, rows included in the batch[, output scale])
DISCRIMINATING_5 = [-4, -30, 29, 111, 5]  # reference and optimized differ on this row
DISCRIMINATING_37 = [
    -25,
    90,
    108,
    -125,
    -89,
    24,
    -91,
    -71,
    -61,
    72,
    -54,
    -10,
    109,
    -36,
    14,
    -111,
    -96,
    74,
    -2,
    116,
    96,
    66,
    -55,
    -4,
    -42,
    -76,
    59,
    70,
    -69,
    -21,
    38,
    -100,
    58,
    -70,
    -98,
    104,
    -48,
]
SOFTMAX_CASES = [
    ("len5_beta0.5", (5,), 0.029639151, 0, 0.5, [DISCRIMINATING_5]),
    ("len37", (37,), 0.0065199365, -3, 1.0, [DISCRIMINATING_37]),
    ("len37_large_scale", (37,), 40.0, 0, 1.0, []),
    ("len37_tiny_scale", (37,), 1e-6, 0, 1.0, []),
    ("len10_beta2.3", (10,), 0.1, 5, 2.3, []),
    ("hwc_last_axis", (4, 3, 7), 0.2, 10, 0.7, []),
    # an output scale LiteRT accepts (within 0.001/256 of 1/256): the optimized kernel
    # divides by it, the reference kernel assumes 1/256
    ("len37_out_scale_near", (37,), 0.05, 0, 1.0, [], np.float32(1 / 256 * (1 + 0.0009))),
]


@pytest.fixture(scope="module")
def lut_cases():
    rng = np.random.default_rng(20251125)
    out = []
    for op, s_in, z_in, (s_out, z_out) in LUT_CASES:
        data = unary_model(op, (256,), s_in, z_in, s_out, z_out)
        x = all_values_batch(rng, (256,), 3)
        out.append((f"{op}_{s_in}_{z_in}", data, x, {rt: run_litert(data, x, rt) for rt in RUNTIMES}))
    for op, (s_out, z_out) in (("LOGISTIC", LOGISTIC_OUT), ("TANH", TANH_OUT)):
        for _ in range(LUT_SWEEP):
            s_in, z_in = float(np.float32(10 ** rng.uniform(-4, 1))), int(rng.integers(-128, 128))
            data = unary_model(op, (256,), s_in, z_in, s_out, z_out)
            x = all_values_batch(rng, (256,), 1)
            out.append((f"{op}_{s_in}_{z_in}", data, x, {rt: run_litert(data, x, rt) for rt in RUNTIMES}))
    return out


@pytest.fixture(scope="module")
def softmax_cases():
    rng = np.random.default_rng(1125)
    out = []
    for name, shape, s_in, z_in, beta, rows, *s_out in SOFTMAX_CASES:
        data = softmax_model(shape, s_in, z_in, beta, *s_out)
        batch = max(24, -(-256 // math.prod(shape)) + 4)
        x = all_values_batch(rng, shape, batch)
        x[-1] = 127  # a row of equal maxima
        for i, row in enumerate(rows):
            x[-2 - i] = np.asarray(row, np.int8).reshape(shape)
        out.append((name, data, x, {rt: run_litert(data, x, rt) for rt in RUNTIMES}))
    return out


# -------------------------------------------------------------- LiteRT differential


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_logistic_tanh_match_litert(lut_cases, runtime):
    for name, data, x, want in lut_cases:
        m = tfl.load(data)
        assert [n.op for n in m.graph.nodes] == ["lut"]
        got = np.asarray(m.run(x, runtime=runtime))
        assert got.dtype == np.int8
        bad = int((got != want[runtime]).sum())
        assert bad == 0, f"{name} on {runtime}: {bad} of {got.size} outputs differ"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_softmax_matches_litert(softmax_cases, runtime):
    for name, data, x, want in softmax_cases:
        m = tfl.load(data)
        assert [n.op for n in m.graph.nodes] == ["softmax"]
        got = np.asarray(m.run(x, runtime=runtime))
        assert got.dtype == np.int8
        bad = int((got != want[runtime]).sum())
        assert bad == 0, f"{name} on {runtime}: {bad} of {got.size} outputs differ"


def test_softmax_runtimes_are_distinct(softmax_cases):
    """LiteRT's reference and optimized SOFTMAX differ on the discriminating rows, so one
    shared algorithm could not match both; XNNPACK leaves int8 SOFTMAX to the optimized
    kernel."""
    differ = 0
    for name, data, x, want in softmax_cases:
        differ += int(not np.array_equal(want["reference"], want["optimized"]))
        assert np.array_equal(want["optimized"], want["xnnpack"]), name
    assert differ >= 2


def test_graph_under_jit_and_vmap(softmax_cases, lut_cases):
    """The portable graph lowers inside jit (recipes through pure_callback) and the lowered
    graph runs under jit(vmap), giving LiteRT's outputs."""
    cases = ((softmax_cases[0], "reference"), (softmax_cases[5], "optimized"), (lut_cases[4], "xnnpack"))
    for (name, data, x, want), rt in cases:
        m = tfl.load(data)
        if rt != "optimized":
            y = hg.jit_run(m.graph, x.astype(np.int32), TFLite(rt))
            assert np.array_equal(np.asarray(y), want[rt]), (name, rt)
        g = m.lowered(rt)
        yv = jax.jit(jax.vmap(lambda xi: hg.run(g, xi)))(jnp.asarray(x, jnp.int32))
        assert np.array_equal(np.asarray(yv), want[rt]), (name, rt)


def test_results_do_not_depend_on_x64(softmax_cases, lut_cases):
    for (name, data, x, want), rt in ((softmax_cases[1], "reference"), (softmax_cases[1], "optimized")):
        with jax.enable_x64(True):
            got = np.asarray(tfl.load(data).run(x, runtime=rt))
        assert np.array_equal(got, want[rt]), (name, rt)


# ------------------------------------------------------------------------- errors


def test_rejected_quantisation_and_options():
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(LOGISTIC\).*1/256"):
        tfl.load(unary_model("LOGISTIC", (8,), 0.1, 0, 1 / 200, -128))
    with pytest.raises(RuntimeError):  # LiteRT refuses it too
        run_litert(unary_model("LOGISTIC", (8,), 0.1, 0, 1 / 200, -128), np.zeros((1, 8), np.int8), "reference")
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(SOFTMAX\).*-128"):
        tfl.load(softmax_model((8,), 0.1, 0, 1.0, z_out=0))
    with pytest.raises(RuntimeError):
        run_litert(softmax_model((8,), 0.1, 0, 1.0, z_out=0), np.zeros((1, 8), np.int8), "optimized")
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(SOFTMAX\).*beta"):
        tfl.load(softmax_model((8,), 0.1, 0, 0.0))
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(SOFTMAX\).*2\*\*-26"):
        tfl.load(softmax_model((8,), 1e-9, 0, 1.0))
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(TANH\).*only int8"):
        tfl.load(unary_model("TANH", (8,), 0.1, 128, 1 / 128, 128, dtype="uint8"))


def test_softmax_op_spec_validates_attributes(softmax_cases):
    g = tfl.load(softmax_cases[0][1]).graph
    node = g.nodes[0]
    assert dict(node.attrs) == {"beta": 0.5, "axis": -1}
    for attrs, what in (
        ({"beta": -1.0, "axis": -1}, "beta"),
        ({"beta": 1.0, "axis": 0}, "axis"),
        ({"beta": float("nan")}, "beta"),
    ):
        with pytest.raises(FormatError, match=what):
            g.replace(nodes=(node.replace(attrs=hg.Attrs(attrs)),)).validate()


def test_unverified_runtimes_raise(softmax_cases, lut_cases):
    # TFLM refuses to prepare a LOGISTIC whose output zero point is not -128; so does hwjax
    mb = ModelBuilder()
    a = mb.tensor((1, 16), "int8", 0.05, 0)
    b = mb.tensor((1, 16), "int8", 1 / 256, 0)
    mb.op("LOGISTIC", [a], [b])
    with pytest.raises(UnsupportedOpError, match="tflm"):
        tfl.load(mb.finish([a], [b])).run(np.zeros((1, 16), np.int8), runtime="tflm")
    long_row = tfl.load(softmax_model((512,), 0.1, 0, 1.0))
    with pytest.raises(UnsupportedOpError, match="511"):
        long_row.run(np.zeros((1, 512), np.int8), runtime="reference")


# ------------------------------------------- fixed point against a big-integer model

_MAX, _MIN = 2**31 - 1, -(2**31)


def _wrap32(v):
    return (v + 2**31) % 2**32 - 2**31


def _srdhm(a, b):
    return _MAX if a == b == _MIN else (a * b + 2**30) >> 31


def _rdbpot(x, e):
    q, r = divmod(x, 2**e)  # floor quotient, remainder in [0, 2**e)
    return q + (1 if (2 * r > 2**e or (2 * r == 2**e and x >= 0)) else 0) if e else x


def _sat_shl(x, k):
    return max(_MIN, min(_MAX, x * 2**k))


def _py_exp_interval(a):
    x = a + 2**28
    x2 = _srdhm(x, x)
    x3, x4 = _srdhm(x2, x), _srdhm(x2, x2)
    p = _rdbpot(_srdhm(_rdbpot(x4, 2) + x3, 715827883) + x2, 1)
    return 1895147668 + _srdhm(1895147668, x + p)


def _py_exp_neg(a, n=5):
    f = 31 - n
    r = a % 2 ** (f - 2) - 2 ** (f - 2)
    y = _py_exp_interval(_sat_shl(r, n))
    for k, mult in (
        (-2, 1672461947),
        (-1, 1302514674),
        (0, 790015084),
        (1, 290630308),
        (2, 39332535),
        (3, 720401),
        (4, 242),
    )[: n + 2]:
        if (r - a) >> (f + k) & 1:
            y = _srdhm(y, mult)
    return _MAX if a == 0 else y


def _py_one_over(a):
    s = a + _MAX
    h = (s + 1) // 2  # RoundingHalfSum: (s + sign) / 2 truncated, s >= 0 here
    x = 1515870810 + _srdhm(h, -1010580540)
    for _ in range(3):
        x = x + _sat_shl(_srdhm(x, 2**29 - _srdhm(h, x)), 2)
    return _sat_shl(x, 1)


def _py_softmax_row(row, m, ls, diff_min):
    mx = max(row)
    exps = [(_py_exp_neg(_srdhm(_wrap32((v - mx) * 2**ls), m)) if v - mx >= diff_min else None) for v in row]
    total = sum(_rdbpot(e, 12) for e in exps if e is not None)
    h = 32 - total.bit_length()
    r = _py_one_over(_wrap32(total * 2**h - 2**31))
    return [-128 if e is None else max(-128, min(127, _rdbpot(_srdhm(r, e), 12 - h + 23) - 128)) for e in exps]


_srdhm32 = jax.jit(K.srdhm32)
_rdbpot32 = jax.jit(K.rdbpot32)
_exp_neg = jax.jit(K.exp_on_negative_values)
_one_over = jax.jit(K.one_over_one_plus_x_for_x_in_0_1)
_softmax_ref = jax.jit(K.softmax_reference)


_EDGES = [
    _MIN,
    _MIN + 1,
    -(2**30),
    -(2**16) - 1,
    -(2**16),
    -(2**15),
    -1,
    0,
    1,
    2**15 - 1,
    2**15,
    2**16 - 1,
    2**16,
    2**30,
    _MAX - 1,
    _MAX,
]


def _check_srdhm_rdbpot(a, b, e):
    a, b, e = (np.asarray(v, np.int64) for v in (a, b, e))
    assert np.asarray(_srdhm32(a.astype(np.int32), b.astype(np.int32))).tolist() == [
        _srdhm(int(x), int(y)) for x, y in zip(a, b)
    ]
    assert np.asarray(_rdbpot32(a.astype(np.int32), e.astype(np.int32))).tolist() == [
        _rdbpot(int(x), int(k)) for x, k in zip(a, e)
    ]


def test_srdhm32_rdbpot32_edges():
    """Every pair of edge values (sign changes, 16-bit half boundaries, the saturating
    pair), each value with every exponent 0..31."""
    a = [x for x in _EDGES for _ in _EDGES]
    b = [y for _ in _EDGES for y in _EDGES]
    _check_srdhm_rdbpot(a, b, [k % 32 for k in range(len(a))])
    _check_srdhm_rdbpot([x for x in _EDGES for _ in range(32)], [-1] * 32 * len(_EDGES), list(range(32)) * len(_EDGES))


@given(
    st.lists(st.tuples(st.integers(_MIN, _MAX), st.integers(_MIN, _MAX), st.integers(0, 31)), min_size=32, max_size=32)
)
def test_srdhm32_rdbpot32_match_bigint_model(abe):
    _check_srdhm_rdbpot(*zip(*abe))


def test_exp_on_negative_values_exhaustive_grid():
    """Every multiple of 2**19 in [-2**31, 0], the 4096 values next to 0 and the barrel
    shifter's bit boundaries."""
    a = np.concatenate(
        [
            -np.arange(0, 2**31 + 1, 2**19, dtype=np.int64),
            -np.arange(1, 4097),
            [-(2**k) + d for k in range(31) for d in (-1, 0, 1)],
            [_MIN],
        ]
    )
    a = np.unique(np.clip(a, _MIN, 0)).astype(np.int32)
    for n in (5, 4):  # LiteRT's softmax, TFLM's LOGISTIC / TANH
        got = np.asarray(jax.jit(K.exp_on_negative_values, static_argnums=1)(a, n))
        want = np.array([_py_exp_neg(int(v), n) for v in a], np.int64)
        assert np.array_equal(got, want), n


@given(
    st.lists(st.integers(_MIN, 0), min_size=64, max_size=64), st.lists(st.integers(0, _MAX), min_size=64, max_size=64)
)
def test_fixed_point_helpers_match_bigint_model(neg, unit):
    assert np.asarray(_exp_neg(np.asarray(neg, np.int32))).tolist() == [_py_exp_neg(v) for v in neg]
    assert np.asarray(_one_over(np.asarray(unit, np.int32))).tolist() == [_py_one_over(v) for v in unit]


@given(
    st.floats(1e-6, 50.0),
    st.sampled_from([1.0, 0.5, 2.3, 0.05]),
    st.lists(st.lists(st.integers(-128, 127), min_size=9, max_size=9), min_size=8, max_size=8),
)
def test_softmax_reference_matches_bigint_model(s_in, beta, rows):
    p = K.softmax_reference_params(s_in, beta)
    got = np.asarray(_softmax_ref(np.asarray(rows, np.int32), p["m"], p["ls"], p["diff_min"])).tolist()
    assert got == [_py_softmax_row(r, int(p["m"]), int(p["ls"]), int(p["diff_min"])) for r in rows]
