"""hwjax.gemmlowp less-than-8-bit mode: generators, requantization, packing order, the
end-to-end GEMM (lt8_requantize.npz, lt8_gemm_cases.npz) and a literal-loop model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwjax.gemmlowp as G
from hwjax.gemmlowp import _lt8
from tests.conftest import golden_path

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_MODE = {"Nearest": "nearest", "ProbabilisticXorshift": "xorshift", "ProbabilisticAddmod": "addmod"}


# ------------------------------------------------------- plain-Python models (the loops)


def wrap32(v: int) -> int:
    return ((v + 2**31) % 2**32) - 2**31


class Generator:
    """The scalar offset generators, stepped as upstream does (spec §3.6)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.x = {"nearest": 0, "xorshift": 128, "addmod": 1}[mode]

    def get(self) -> int:
        if self.mode == "nearest":
            return 127
        if self.mode == "xorshift":
            out = self.x - 1
            x = self.x
            x ^= (x << 7) & 0xFF
            x ^= x >> 5
            x ^= (x << 3) & 0xFF
            self.x = x
            return out
        self.x = (self.x + 97 + (1 if self.x >= 158 else 0)) & 0xFF  # uint8 form of upstream
        return self.x


def py_requantize(v: int, bits: int, gen: Generator) -> int:
    if bits == 8:
        return v
    return (v * (2**bits - 1) + gen.get()) // 255


def py_pack_call(S: np.ndarray, bits: int, mode: str, l1_depth: int) -> np.ndarray:
    """One packing call over the W x D block S, in the normative loop order of §3.8."""
    W, D = S.shape
    gen = Generator(mode)
    P = np.zeros_like(S)
    for d0 in range(0, D, l1_depth):
        ds = min(l1_depth, D - d0)
        for w1 in range(0, W, 8):
            for k in range(-(-ds // 16)):
                base_d = d0 + 16 * k
                for cell_d in (0, 4, 8, 12):
                    for cell_w in (0, 4):
                        for wi in range(4):
                            for di in range(4):
                                w, d = w1 + cell_w + wi, base_d + cell_d + di
                                inside = w < W and d < d0 + ds
                                p = py_requantize(int(S[w, d]) if inside else 0, bits, gen)
                                if inside:
                                    P[w, d] = p
                                else:
                                    assert p == 0  # padding stays zero
    return P


def py_pack(lhs, rhs, L, R, mode, bp):
    """The single-thread driver's packing calls (spec §3.7): LHS in blocks of l2_rows,
    RHS in blocks of l2_cols, each call with a fresh generator."""
    l2_rows, l2_cols, _, _, _, l1_depth = bp
    PL = np.zeros_like(lhs)
    for r0 in range(0, lhs.shape[0], l2_rows):
        PL[r0 : r0 + l2_rows] = py_pack_call(lhs[r0 : r0 + l2_rows], L, mode, l1_depth)
    PR = np.zeros_like(rhs)
    for c0 in range(0, rhs.shape[1], l2_cols):
        PR[:, c0 : c0 + l2_cols] = py_pack_call(rhs[:, c0 : c0 + l2_cols].T, R, mode, l1_depth).T
    return PL, PR


def py_rmcf(x: int, n: int, d: int) -> int:
    if n == d:
        return x
    q = (n + d // 2) // d
    rem = n - q * d
    s = abs(rem) * 2**31 // d * (1 if rem >= 0 else -1)
    p = x * s
    t = (abs(p) + 2**30) // 2**31 * (1 if p > 0 else -1)  # round half away from zero
    return wrap32(x * q + t)


def py_gemm_lt8(lhs, rhs, lo, ro, L, R, mode, bp=None, legacy=None):
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    ML, MR = 2**L - 1, 2**R - 1
    lo = np.broadcast_to(np.asarray(lo, object), (rows,))  # scalar or one per row
    ro = np.broadcast_to(np.asarray(ro, object), (cols,))  # scalar or one per column
    if 2 * rows * cols < 100 * (rows + cols) or (L, R) == (8, 8):
        acc = (lhs.astype(object) + lo[:, None]).dot(rhs.astype(object) + ro[None, :])
        acc = np.vectorize(wrap32, otypes=[object])(acc)
    else:
        PL, PR = py_pack(lhs, rhs, L, R, mode, bp or G.block_params(rows, depth, cols))
        xx = PL.astype(object).dot(PR.astype(object))
        rs, cs = PL.astype(object).sum(1), PR.astype(object).sum(0)
        acc = np.empty((rows, cols), object)
        for r in range(rows):
            for c in range(cols):
                lr, rc = int(lo[r]), int(ro[c])
                acc[r, c] = wrap32(
                    py_rmcf(int(xx[r, c]), 65025, ML * MR)
                    + py_rmcf(wrap32(int(rs[r]) * rc), 255, ML)
                    + py_rmcf(wrap32(int(cs[c]) * lr), 255, MR)
                    + wrap32(lr * rc * depth)
                )
    if legacy is not None:
        off, mult, shift = legacy
        f = lambda v: min(max(_rdbpot(wrap32(wrap32(v + off) * mult), shift), 0), 255)
        return np.vectorize(f, otypes=[np.int64])(acc)
    return acc.astype(np.int64)


def _rdbpot(x: int, e: int) -> int:
    mask = (1 << e) - 1
    return (x >> e) + (1 if (x & mask) > (mask >> 1) + (1 if x < 0 else 0) else 0)


# ------------------------------------------------------------------ generators, requantize


@pytest.fixture(scope="module")
def requant():
    return np.load(golden_path("gemmlowp", "lt8_requantize.npz"))


@pytest.fixture(scope="module")
def cases():
    return np.load(golden_path("gemmlowp", "lt8_gemm_cases.npz"))


def test_generator_streams_golden(requant):
    np.testing.assert_array_equal(np.asarray(G.xorshift_offsets(600)), requant["xorshift_scalar_first600"])
    np.testing.assert_array_equal(np.asarray(G.addmod_offsets(600)), requant["addmod_scalar_first600"])
    np.testing.assert_array_equal(np.asarray(G.rounding_offsets("nearest", 5)), [127] * 5)
    for mode, key in (("xorshift", "xorshift_scalar_first600"), ("addmod", "addmod_scalar_first600")):
        gen = Generator(mode)
        np.testing.assert_array_equal([gen.get() for _ in range(600)], requant[key])
        np.testing.assert_array_equal(np.asarray(G.rounding_offsets(mode, 600)), requant[key])
    # period 255, every value 0..254 once per period
    for f in (G.xorshift_offsets, G.addmod_offsets):
        v = np.asarray(f(510))
        assert sorted(v[:255]) == list(range(255)) and (v[:255] == v[255:]).all()


def test_requantize_golden_every_bit_depth_and_mode(requant):
    x = requant["requant_input"].astype(np.uint8)
    for bits in range(1, 9):
        for mode in G.MODES:
            got = G.requantize(x, bits, mode=mode)
            assert got.dtype == np.uint8
            np.testing.assert_array_equal(np.asarray(got), requant[f"requant_b{bits}_{mode}"], err_msg=f"{bits} {mode}")


def test_requantize_matches_model_and_endpoints(requant):
    x = requant["requant_input"].astype(np.uint8)
    for bits in (1, 5, 7):
        for mode in G.MODES:
            gen = Generator(mode)
            want = [py_requantize(int(v), bits, gen) for v in x.ravel()]
            np.testing.assert_array_equal(np.asarray(G.requantize(x, bits, mode=mode)).ravel(), want)
    ends = np.array([0, 255] * 300, np.uint8)
    for bits in range(1, 8):
        for mode in G.MODES:
            got = np.asarray(G.requantize(ends, bits, mode=mode))
            np.testing.assert_array_equal(got, np.tile([0, 2**bits - 1], 300))


def test_rmcf_golden(requant):
    pairs = sorted({k[: -len("__x")] for k in requant.files if k.startswith("frac_") and k.endswith("__x")})
    assert len(pairs) == 8
    for base in pairs:
        n, d = int(requant[base + "__numerator"]), int(requant[base + "__denominator"])
        x = requant[base + "__x"].astype(np.int32)
        got = np.asarray(G.rounding_multiply_by_constant_fraction(x, n, d))
        np.testing.assert_array_equal(got, requant[base + "__y"], err_msg=base)
        np.testing.assert_array_equal(got, [py_rmcf(int(v), n, d) for v in x], err_msg=base)


@given(
    x=st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=32, max_size=32),
    frac=st.sampled_from([(65025, 3937), (65025, 961), (65025, 945), (65025, 21), (255, 127), (255, 7)]),
)
@settings(max_examples=30)
def test_rmcf_matches_bigint_model(x, frac):
    got = np.asarray(G.rounding_multiply_by_constant_fraction(np.array(x, np.int32), *frac))
    np.testing.assert_array_equal(got, [py_rmcf(v, *frac) for v in x])


def test_rmcf_is_not_always_nearest():
    """Spec L4: the Q31 correction constant is truncated, so large |x| can be off by one."""
    got = int(G.rounding_multiply_by_constant_fraction(np.int32(9698418), 65025, 3937))
    assert got == py_rmcf(9698418, 65025, 3937)
    assert got != round(9698418 * 65025 / 3937)


# -------------------------------------------------------------- parameters and the switch


def test_rounding_mode_switch_and_worth_it():
    assert G.rounding_mode(383) == "nearest" and G.rounding_mode(384) == "addmod"
    custom = G.RoundingStrategy("nearest", "xorshift", 384)
    assert custom.mode(383) == "nearest" and custom.mode(384) == "xorshift"
    assert G.is_requantization_worth_it(100, 100) and not G.is_requantization_worth_it(100, 99)
    assert not any(G.is_requantization_worth_it(r, 1) for r in (1, 100, 10**6))
    assert (G.A5B7.lhs_bits, G.A5B7.rhs_bits) == (7, 5) and G.L7R5 is G.A5B7
    assert (G.A8B8.lhs_bits, G.A8B8.rhs_bits) == (8, 8)


def test_uint16_local_accumulator_bound():
    for L in range(1, 9):
        for R in range(1, 9):
            cap = G.uint16_lane_capacity(L, R)
            assert cap * (2**L - 1) * (2**R - 1) <= 65535 < (cap + 1) * (2**L - 1) * (2**R - 1)
            if L + R <= 16:
                assert cap >= 2 ** (16 - (L + R))
    G.check_uint16_accumulators(7, 5, 16)  # the ARMv7 NEON kernel: 16 * 127 * 31 = 62992
    with pytest.raises(ValueError, match=r"17 \* 127 \* 31 = 66929 > 65535; at most 16 products"):
        G.check_uint16_accumulators(7, 5, 17)
    with pytest.raises(ValueError, match="at most 1 products"):
        G.gemm_lt8(
            np.zeros((2, 3), np.uint8),
            np.zeros((3, 2), np.uint8),
            lhs_offset=0,
            rhs_offset=0,
            lhs_bits=8,
            rhs_bits=8,
            uint16_lane_products=2,
        )


# --------------------------------------------------------------------- golden GEMMs

_CASES = [
    "lt8_L6R4_nearest_ragged",
    "lt8_L7R5_addmod_ragged",
    "lt8_L7R5_xorshift_depth384",
    "lt8_L7R5_xorshift_depth383_nearest",
    "lt8_L4R6_addmod_l1split",
    "lt8_L5R7_xorshift_l1split_ragged",
    "lt8_L8R4_addmod",
    "lt8_L3R2_nearest_worth_boundary",
    "lt8_L7R5_fallback_not_worth_it",
    "lt8_L7R5_gemv_fallback",
]


def _case(cases, name):
    g = {k[len(name) + 2 :]: cases[k] for k in cases.files if k.startswith(name + "__")}
    assert g, name
    return g


def _strategy(g):
    return G.RoundingStrategy(
        _MODE[str(g["small_size_mode"])], _MODE[str(g["large_size_mode"])], int(g["size_threshold"])
    )


def test_all_golden_cases_are_covered(cases):
    assert sorted({k.split("__")[0] for k in cases.files}) == sorted(_CASES)


@pytest.mark.parametrize("name", _CASES)
def test_lt8_gemm_golden(cases, name):
    g = _case(cases, name)
    rows, depth, cols = int(g["rows"]), int(g["depth"]), int(g["cols"])
    L, R = int(g["lhs_bits"]), int(g["rhs_bits"])
    strat = _strategy(g)
    assert G.block_params(rows, depth, cols) == tuple(int(v) for v in g["block_params"])
    assert G.is_requantization_worth_it(rows, cols) == bool(g["requantization_worth_it"])
    for side in ("lhs", "rhs"):
        used = str(g[f"{side}_mode_used"])
        if used in _MODE:
            assert strat.mode(depth) == _MODE[used]
    kw = dict(lhs_offset=int(g["lhs_offset"]), rhs_offset=int(g["rhs_offset"]), lhs_bits=L, rhs_bits=R, rounding=strat)
    legacy = dict(
        result_offset=int(g["result_offset"]),
        result_mult_int=int(g["result_mult_int"]),
        result_shift=int(g["result_shift"]),
    )

    requantized = "lhs_requantized" in g

    @jax.jit
    def run(lhs, rhs):  # one compilation for the int32 and uint8 results and the packed operands
        packed = G.pack_lt8(lhs, rhs, lhs_bits=L, rhs_bits=R, rounding=strat) if requantized else None
        return G.gemm_lt8(lhs, rhs, **kw), G.gemm_lt8(lhs, rhs, **kw, **legacy), packed

    acc, out, packed = run(g["lhs"], g["rhs"])
    assert acc.dtype == np.int32 and out.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(acc), g["result_int32"])
    np.testing.assert_array_equal(np.asarray(out), g["result_uint8"])
    if requantized:
        pl, pr = packed
        np.testing.assert_array_equal(np.asarray(pl), g["lhs_requantized"])
        np.testing.assert_array_equal(np.asarray(pr), g["rhs_requantized"])
        np.testing.assert_array_equal(np.asarray(pl).sum(1, dtype=np.int64), g["lhs_requantized_row_sums"])
        np.testing.assert_array_equal(np.asarray(pr).sum(0, dtype=np.int64), g["rhs_requantized_col_sums"])
    else:  # fallback: the exact 8-bit GEMM
        assert not G.is_requantization_worth_it(rows, cols)
        exact = G.gemm(g["lhs"], g["rhs"], lhs_offset=kw["lhs_offset"], rhs_offset=kw["rhs_offset"])
        np.testing.assert_array_equal(np.asarray(exact), g["result_int32"])


def test_default_params_and_eight_bit_int_gemm_golden(cases):
    """DefaultL7R5BitDepthParams = A5B7 (a: 7 bits, b: 5 bits), auto rounding (AddMod at
    depth 517), through the eager (non-jitted) entry points."""
    g = _case(cases, "lt8_L7R5_addmod_ragged")
    assert str(g["bit_depth_params"]) == "DefaultL7R5BitDepthParams"
    out = G.eight_bit_int_gemm(
        g["lhs"],
        g["rhs"],
        a_offset=int(g["lhs_offset"]),
        b_offset=int(g["rhs_offset"]),
        c_offset=int(g["result_offset"]),
        c_mult_int=int(g["result_mult_int"]),
        c_shift=int(g["result_shift"]),
        bit_depth=G.A5B7,
    )
    np.testing.assert_array_equal(np.asarray(out), g["result_uint8"])


def test_golden_case_matches_literal_loop_model(cases):
    """The closed-form draw index against the literal packing loops, on golden inputs
    with two depth sub-blocks and ragged width and depth."""
    g = _case(cases, "lt8_L5R7_xorshift_l1split_ragged")
    bp = tuple(int(v) for v in g["block_params"])
    PL, PR = py_pack(g["lhs"], g["rhs"], 5, 7, "xorshift", bp)
    np.testing.assert_array_equal(PL, g["lhs_requantized"])
    np.testing.assert_array_equal(PR, g["rhs_requantized"])


# ------------------------------------------------------------ model-based properties

_R, _K, _C = 100, 37, 103  # worth it (2*100*103 >= 100*203), ragged width and depth


@settings(max_examples=4)
@given(
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(G.MODES),
    bits=st.sampled_from([(7, 5), (4, 4), (3, 6), (8, 2), (1, 1)]),
    lo=st.integers(-255, 0) | st.integers(INT32_MIN, INT32_MAX),
    ro=st.integers(-255, 0),
)
def test_gemm_lt8_matches_literal_model(seed, mode, bits, lo, ro):
    rng = np.random.default_rng(seed)
    lhs = rng.integers(0, 256, (_R, _K)).astype(np.uint8)
    rhs = rng.integers(0, 256, (_K, _C)).astype(np.uint8)
    got = G.gemm_lt8(lhs, rhs, lhs_offset=lo, rhs_offset=ro, lhs_bits=bits[0], rhs_bits=bits[1], rounding=mode)
    np.testing.assert_array_equal(np.asarray(got), py_gemm_lt8(lhs, rhs, lo, ro, *bits, mode))


@pytest.mark.parametrize("mode", ["xorshift", "addmod"])
def test_packing_with_several_rhs_calls_and_depth_blocks_matches_loops(mode):
    """Small synthetic block parameters (l2_cols < cols: the RHS is packed in three
    calls with fresh generators; l1_depth 32 < depth: three depth sub-blocks, the last
    ragged) against the literal driver and packing loops."""
    rng = np.random.default_rng(5)
    lhs = rng.integers(0, 256, (13, 70)).astype(np.int32)
    rhs = rng.integers(0, 256, (70, 21)).astype(np.int32)
    bp = (16, 8, 80, 16, 8, 32)
    pl, pr = _lt8._pack_jit(jnp.asarray(lhs), jnp.asarray(rhs), 3, 6, mode, bp)
    PL, PR = py_pack(lhs, rhs, 3, 6, mode, bp)
    np.testing.assert_array_equal(np.asarray(pl), PL)
    np.testing.assert_array_equal(np.asarray(pr), PR)


def test_block_params_several_rhs_blocks_for_large_depth():
    # cols > floor(4194304 / rup16(K)): the RHS is packed per l2_cols block
    l2_rows, l2_cols, l2_depth, _, _, l1_depth = G.block_params(100, 4096, 1100)
    assert l2_depth == 4096 and l2_cols < 1100 and l1_depth < 4096


# ------------------------------------------------------------------ jit / vmap / x64


def test_gemm_lt8_vmap_and_per_channel_offsets():
    rng = np.random.default_rng(3)
    lhs = rng.integers(0, 256, (2, _R, _K)).astype(np.uint8)
    rhs = rng.integers(0, 256, (_K, _C)).astype(np.uint8)
    lo = rng.integers(-255, 1, _R).astype(np.int32)
    ro = rng.integers(-255, 1, _C).astype(np.int32)
    f = jax.vmap(lambda a: G.gemm_lt8(a, rhs, lhs_offset=lo, rhs_offset=ro, lhs_bits=7, rhs_bits=5, rounding="addmod"))
    got = np.asarray(f(lhs))
    for i in range(2):
        np.testing.assert_array_equal(got[i], py_gemm_lt8(lhs[i], rhs, lo, ro, 7, 5, "addmod"))


def test_requantize_vmap_gives_each_row_a_fresh_generator(requant):
    x = requant["requant_input"].astype(np.uint8)
    got = jax.jit(jax.vmap(lambda r: G.requantize(r, 4, mode="xorshift")))(x)
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(G.requantize(x[i], 4, mode="xorshift")))


def test_gemm_lt8_identical_with_x64(cases):
    g = _case(cases, "lt8_L8R4_addmod")
    kw = dict(lhs_offset=int(g["lhs_offset"]), rhs_offset=int(g["rhs_offset"]), lhs_bits=8, rhs_bits=4)
    with jax.enable_x64(True):
        wide = G.gemm_lt8(g["lhs"], g["rhs"], **kw)
        req = G.requantize(g["lhs"][:4], 3, mode="addmod")
    assert wide.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(wide), g["result_int32"])
    np.testing.assert_array_equal(np.asarray(req), np.asarray(G.requantize(g["lhs"][:4], 3, mode="addmod")))


# --------------------------------------------------------------------------- errors


def test_lt8_errors():
    a = np.zeros((3, 4), np.uint8)
    b = np.zeros((4, 2), np.uint8)
    kw = dict(lhs_offset=0, rhs_offset=0)
    with pytest.raises(ValueError, match=r"lhs_bits must lie in \[1, 8\], got 9"):
        G.gemm_lt8(a, b, **kw, lhs_bits=9, rhs_bits=5)
    with pytest.raises(ValueError, match=r"rhs_bits must lie in \[1, 8\], got 0"):
        G.gemm_lt8(a, b, **kw, lhs_bits=7, rhs_bits=0)
    with pytest.raises(ValueError, match=r"bits must lie in \[1, 8\]"):
        G.requantize(a, 0, mode="nearest")
    with pytest.raises(ValueError, match="mode must be one of"):
        G.requantize(a, 4, mode="stochastic")
    with pytest.raises(ValueError, match="rounding must be 'auto'"):
        G.gemm_lt8(a, b, **kw, lhs_bits=7, rhs_bits=5, rounding="up")
    with pytest.raises(ValueError, match=r"x must lie in \[0, 255\]"):
        G.requantize(np.array([256]), 4, mode="nearest")
    with pytest.raises(ValueError, match=r"lhs must lie in \[0, 255\]"):
        G.gemm_lt8(a.astype(np.int32) - 1, b, **kw, lhs_bits=7, rhs_bits=5)
    with pytest.raises(ValueError, match="depths must match"):
        G.gemm_lt8(a, b[:3], **kw, lhs_bits=7, rhs_bits=5)
    with pytest.raises(ValueError, match=r"result_shift must lie in \[0, 31\]"):
        G.gemm_lt8(a, b, **kw, lhs_bits=7, rhs_bits=5, result_offset=0, result_mult_int=1, result_shift=-1)
    with pytest.raises(ValueError, match="all three"):
        G.gemm_lt8(a, b, **kw, lhs_bits=7, rhs_bits=5, result_offset=0)
    with pytest.raises(TypeError, match="give lhs_bits and rhs_bits"):
        G.gemm_lt8(a, b, **kw)
    with pytest.raises(ValueError, match="contradicts"):
        G.gemm_lt8(a, b, **kw, lhs_bits=5, bit_depth=G.A5B7)
    with pytest.raises(ValueError, match="requires lhs_bits == rhs_bits == 8"):
        G.BitDepthParams(7, 5, "exact")


def test_bench_numpy_reference_is_exact_on_golden_cases(cases):
    """The NumPy reference that `python -m hwjax.bench gemmlowp` times is the same
    definition: equal to upstream on the requantizing golden cases (no JAX involved)."""
    from hwjax.bench._gemmlowp import np_gemm_lt8

    for name in ("lt8_L7R5_addmod_ragged", "lt8_L5R7_xorshift_l1split_ragged", "lt8_L6R4_nearest_ragged"):
        g = _case(cases, name)
        mode = _strategy(g).mode(int(g["depth"]))
        out = np_gemm_lt8(
            g["lhs"],
            g["rhs"],
            int(g["lhs_offset"]),
            int(g["rhs_offset"]),
            int(g["lhs_bits"]),
            int(g["rhs_bits"]),
            mode,
            (int(g["result_offset"]), int(g["result_mult_int"]), int(g["result_shift"])),
        )
        np.testing.assert_array_equal(out, g["result_uint8"], err_msg=name)


def test_lt8_study_smoke(tmp_path, capsys):
    """`python -m hwjax.studies lt8` on a tiny grid: prints a markdown table, writes the PNG."""
    from hwjax.studies.__main__ import main

    out = tmp_path / "lt8.png"
    assert (
        main(
            [
                "lt8",
                "--rows",
                "100",
                "--cols",
                "100",
                "--depths",
                "32",
                "--pairs",
                "L4R4",
                "--modes",
                "nearest",
                "--data",
                "uniform",
                "--seeds",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| 32 |"))
    rms = float(row.split("|")[2].strip(" *").split()[0])
    assert 0 < rms < 50  # 4-bit operands: a few percent of error, never zero
    assert out.stat().st_size > 10_000


def test_lt8_study_model_data_are_a_trained_models_quantised_values():
    from hwjax.studies._lt8 import _trained_values, make_data

    w, x = _trained_values()
    assert w.dtype == np.uint8 and w.size == 64 * 64 and x.dtype == np.uint8
    assert set(np.unique(x)) <= {int(np.round(255 * k / 16)) for k in range(17)}  # the digits' 17 pixel levels
    assert w.min() >= 1 and (w.min() == 1 or w.max() == 255)  # max|w| -> 128 -+ 127 (symmetric, zero point 128)
    assert len(np.unique(w)) > 100  # trained float weights, not a few levels
    lhs, rhs, lo, ro = make_data("model", 2, 3, 40, 5, 0)
    assert lhs.shape == (2, 3, 40) and rhs.shape == (2, 40, 5) and (lo, ro) == (-128, 0)
    assert set(np.unique(lhs)) <= set(np.unique(w)) and set(np.unique(rhs)) <= set(np.unique(x))
