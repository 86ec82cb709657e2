"""XS3 VPU instructions (spec xs3.md §1–§2): golden vectors, a big-integer model, jit/vmap."""

from __future__ import annotations

import json
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwjax import xs3
from hwjax.core import wide as W
from tests.conftest import golden_path

# Golden files name the variants by model revision.
NPZ_KEY = {"hardware": "v2026", "host": "host2024", "v2021": "v2021"}
VARIANTS = ("hardware", "host", "v2021")


# ------------------------------------------------------------------ big-integer model
# Written from the spec text, on unbounded Python ints (§1.1).


def rshr(x: int, s: int) -> int:
    return x if s == 0 else (x + (1 << (s - 1))) >> s


def sat(x: int, b: int) -> int:
    m = (1 << (b - 1)) - 1
    return max(-m, min(m, x))


def wrap32(x: int) -> int:
    return ((x + (1 << 31)) % (1 << 32)) - (1 << 31)


def m_vlsat(acc: int, shift: int, b: int, variant: str) -> int:
    s = shift & 0xFFFF
    if variant == "hardware" or s >= 32:
        r = rshr(acc, s) if s <= 31 else acc >> s
    else:
        r = acc if s == 0 else wrap32(acc + (1 << (s - 1))) >> s
    return sat(r, b)


def m_vlashr(x: int, shr: int, b: int, variant: str) -> int:
    if shr >= b - 1:
        return x >> (b - 1)
    if shr > 0:
        return sat(rshr(x, shr) if variant == "host" else x >> shr, b)
    k = -shr
    if variant == "hardware" or (shr == 0 and not (variant == "host" and b == 32)):
        return sat(x << min(k, b - 1), b)
    if b == 32:  # host shr <= 0, v2021 shr < 0: bits read zero-extended
        return sat((x << k) % (1 << 32), 32)
    return sat(wrap32(x << k), b)


def m_vlmul(x: int, m: int, b: int, variant: str) -> int:
    k = {8: 6, 16: 14, 32: 30}[b]
    return sat((x * m) >> k if variant == "v2021" else rshr(x * m, k), b)


def m_vlsub(x: int, m: int, b: int, variant: str) -> int:
    mn = -(1 << (b - 1))
    if variant == "hardware" and x == mn:
        if b == 32:
            return sat(m - (1 << 31), 32)
        if m == 0:
            return mn
    return sat(m - x, b)


def m_vlmaccr(ring: list[int], c: list[int], m: list[int], b: int) -> list[int]:
    if b == 32:
        s = sum(rshr(ci * mi, 30) for ci, mi in zip(c, m))
        a = sat(ring[-1] + s, 40)
    else:
        a = sat(ring[-1] + sum(ci * mi for ci, mi in zip(c, m)), 32)
    return [a] + ring[:-1]


def lane(b: int):
    return st.integers(-(1 << (b - 1)), (1 << (b - 1)) - 1)


i32 = lane(32)
modes = st.sampled_from((8, 16, 32))
variants = st.sampled_from(VARIANTS)


# ---------------------------------------------------------------------- golden files


@pytest.fixture(scope="module")
def npz():
    return np.load(golden_path("xs3", "vpu_instructions.npz"))


@pytest.fixture(scope="module")
def edge():
    return json.loads(golden_path("xs3", "vpu_edge_cases.json").read_text())


@pytest.fixture(scope="module")
def seqs():
    return json.loads(golden_path("xs3", "vlmacc_sequences.json").read_text())


NPZ_CASES = [
    ("vlsat16", lambda d, t, v: xs3.vlsat(d[t + "__acc"], d[t + "__shift"], mode=16, variant=v)),
    ("vlsat8", lambda d, t, v: xs3.vlsat(d[t + "__acc"], d[t + "__shift"], mode=8, variant=v)),
    ("vlashr16", lambda d, t, v: xs3.vlashr(d[t + "__x"], d[t + "__shr"], mode=16, variant=v)),
    ("vlashr8", lambda d, t, v: xs3.vlashr(d[t + "__x"], d[t + "__shr"], mode=8, variant=v)),
    ("vlmul16", lambda d, t, v: xs3.vlmul(d[t + "__x"], d[t + "__m"], mode=16, variant=v)),
    ("vlmul8", lambda d, t, v: xs3.vlmul(d[t + "__x"], d[t + "__m"], mode=8, variant=v)),
    ("vdepth8_16", lambda d, t, v: xs3.vdepth8(d[t + "__x"], mode=16, variant=v)),
    ("vdepth8_32", lambda d, t, v: xs3.vdepth8(d[t + "__x"], mode=32, variant=v)),
    ("vdepth16_32", lambda d, t, v: xs3.vdepth16(d[t + "__x"], variant=v)),
    ("vladd16", lambda d, t, v: xs3.vladd(d[t + "__vR"], d[t + "__mem"], mode=16, variant=v)),
    ("vladd8", lambda d, t, v: xs3.vladd(d[t + "__vR"], d[t + "__mem"], mode=8, variant=v)),
    ("vlsub16", lambda d, t, v: xs3.vlsub(d[t + "__vR"], d[t + "__mem"], mode=16, variant=v)),
    ("vlsub8", lambda d, t, v: xs3.vlsub(d[t + "__vR"], d[t + "__mem"], mode=8, variant=v)),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("test,fn", NPZ_CASES, ids=[c[0] for c in NPZ_CASES])
def test_npz_every_row(npz, test, fn, variant):
    got = fn(npz, test, variant)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), npz[f"{test}__out_{NPZ_KEY[variant]}"])


def test_npz_variants_really_differ(npz):
    """The golden rows exercise every variant difference the README counts."""

    def diff(t, k):
        return int(np.sum(npz[f"{t}__out_v2026"] != npz[f"{t}__out_{k}"]))

    assert diff("vlsat16", "host2024") == 133 and diff("vlashr8", "host2024") == 768
    assert diff("vlmul8", "v2021") == 3022 and diff("vlsub16", "host2024") == 1


EDGE_CASES = {
    "vlashr32": lambda t, v: xs3.vlashr(np.array(t["x"], np.int32), np.array(t["shr"], np.int32), mode=32, variant=v),
    "vlsub32": lambda t, v: xs3.vlsub(np.array(t["vR"], np.int32), np.array(t["mem"], np.int32), mode=32, variant=v),
    "vpos8": lambda t, v: xs3.vpos(np.array(t["x"], np.int32), mode=8, variant=v),
    "vpos16": lambda t, v: xs3.vpos(np.array(t["x"], np.int32), mode=16, variant=v),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("key", sorted(EDGE_CASES))
def test_edge_cases_all_variants(edge, key, variant):
    t = edge[key]
    np.testing.assert_array_equal(np.asarray(EDGE_CASES[key](t, variant)), t[f"out_{variant}"])


@pytest.mark.parametrize("b", [8, 16])
def test_vlsat_wide_and_negative_shifts(edge, b):
    t = edge[f"vlsat{b}_wide_shift"]
    got = xs3.vlsat(np.array(t["acc"], np.int32), np.array(t["shift_int16"], np.int32), mode=b)
    np.testing.assert_array_equal(np.asarray(got), t["out_hardware"])


def test_vlsat32(edge):
    t = edge["vlsat32"]
    acc = (np.array(t["vD_s32"], np.int32), np.array(t["vR_u32"], np.uint32))
    got = xs3.vlsat(acc, np.array(t["shift_u32"], np.uint32), mode=32)
    np.testing.assert_array_equal(np.asarray(got), t["out_hardware"])
    # the same shifts given as int32 bit patterns
    got = xs3.vlsat(
        W.Wide(jnp.asarray(acc[0]), jnp.asarray(acc[1])), np.array(t["shift_u32"], np.uint32).view(np.int32), mode=32
    )
    np.testing.assert_array_equal(np.asarray(got), t["out_hardware"])


@pytest.mark.parametrize("key,fn", [("vlmacc32", xs3.vlmacc), ("vlmaccr32", xs3.vlmaccr)])
def test_mac32_chains(edge, key, fn):
    t = edge[key]
    acc = None
    for i, step in enumerate(t["step"]):
        if step == 0:
            acc = W.from_python(t["seed_acc40"][i])
        acc = fn(acc, np.array(t["vC_s32"][i], np.int32), np.array(t["mem_s32"][i], np.int32), mode=32)
        assert isinstance(acc, W.Wide)
        assert list(W.to_python(acc)) == t["acc40_after"][i], (key, t["sequence"][i], step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_vlmaccr8_chain(seqs, variant):
    t = seqs["vlmaccr8"]
    acc = np.array(t["seed_acc32"], np.int32)
    step = jax.jit(lambda a, c, m: xs3.vlmaccr(a, c, m, mode=8, variant=variant))
    for i, mem in enumerate(t["mem_int8"]):
        acc = step(acc, np.array(t["vC_int8"], np.int8), np.array(mem, np.int8))
        np.testing.assert_array_equal(np.asarray(acc), t["acc32_after_each_instruction"][i])


@pytest.mark.parametrize("variant", VARIANTS)
def test_vlmacc8_chain(seqs, variant):
    t = seqs["vlmacc8"]
    acc = np.array(t["seed_acc32"], np.int32)
    vc = np.array(t["vC_int8"], np.int32)[:16]  # 8-bit VLMACC uses the first 16 bytes
    for i, mem in enumerate(t["mem_int8"]):
        acc = xs3.vlmacc(acc, vc, np.array(mem, np.int32)[:16], mode=8, variant=variant)
        np.testing.assert_array_equal(np.asarray(acc), t["acc32_after_each_instruction"][i])


def test_vlmaccr8_single_saturates_once(seqs):
    t = seqs["vlmaccr8_single"]
    for seed, var, out, per_product in zip(
        t["seed_acc32"], t["vC_variant"], t["acc_out"], t["acc_out_if_saturated_after_every_product_lane_order_0_31"]
    ):
        vc = np.array([127] * 16 + [-128] * 16 if var == 0 else [-128] * 16 + [127] * 16, np.int8)
        ring = xs3.vlmaccr(np.full(16, seed, np.int32), vc, np.full(32, 127, np.int8), mode=8)
        assert int(ring[0]) == out
        np.testing.assert_array_equal(np.asarray(ring[1:]), np.full(15, seed))
    assert t["acc_out"] != t["acc_out_if_saturated_after_every_product_lane_order_0_31"]


# ------------------------------------------------------------- properties vs the model


@given(
    acc=i32,
    shift=st.one_of(st.integers(0, 40), st.integers(-32768, 65535)),
    b=st.sampled_from((8, 16)),
    variant=variants,
)
def test_vlsat_model(acc, shift, b, variant):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = int(xs3.vlsat(np.int32(acc), np.int32(shift), mode=b, variant=variant))
    assert got == m_vlsat(acc, shift, b, variant)


@given(acc=st.integers(-(1 << 63), (1 << 63) - 1), shift=st.integers(0, 2**32 - 1))
def test_vlsat32_model(acc, shift):
    got = int(xs3.vlsat(W.from_python(acc), np.uint32(shift), mode=32))
    assert got == sat(rshr(acc, min(shift, 62)), 32)


@given(data=st.data(), b=modes, shr=st.integers(-40, 40), variant=variants)
def test_vlashr_model(data, b, shr, variant):
    x = data.draw(lane(b))
    assert int(xs3.vlashr(np.int32(x), np.int32(shr), mode=b, variant=variant)) == m_vlashr(x, shr, b, variant)


@given(data=st.data(), b=modes, variant=variants)
def test_vlmul_vladd_vlsub_model(data, b, variant):
    x, m = data.draw(lane(b)), data.draw(lane(b))
    assert int(xs3.vlmul(np.int32(x), np.int32(m), mode=b, variant=variant)) == m_vlmul(x, m, b, variant)
    assert int(xs3.vladd(np.int32(x), np.int32(m), mode=b, variant=variant)) == sat(x + m, b)
    assert int(xs3.vlsub(np.int32(x), np.int32(m), mode=b, variant=variant)) == m_vlsub(x, m, b, variant)


@given(x=i32, b=st.sampled_from((16, 32)))
def test_vdepth_model(x, b):
    x = sat(x, b) if b == 16 else x
    x = max(x, -(1 << (b - 1)))
    assert int(xs3.vdepth8(np.int32(x), mode=b)) == sat(rshr(x, b - 8), 8)
    if b == 32:
        assert int(xs3.vdepth16(np.int32(x))) == sat(rshr(x, 16), 16)


@given(data=st.data(), b=st.sampled_from((8, 16)), n=st.integers(1, 4))
def test_vlmaccr_chain_model(data, b, n):
    ring = data.draw(st.lists(i32, min_size=16, max_size=16))
    vcs = [data.draw(st.lists(lane(b), min_size=32 if b == 8 else 16, max_size=32 if b == 8 else 16)) for _ in range(n)]
    mems = [data.draw(st.lists(lane(b), min_size=len(vcs[0]), max_size=len(vcs[0]))) for _ in range(n)]
    acc = np.array(ring, np.int32)
    for c, m in zip(vcs, mems):
        acc = xs3.vlmaccr(acc, np.array(c, np.int32), np.array(m, np.int32), mode=b)
        ring = m_vlmaccr(ring, c, m, b)
    assert np.asarray(acc).tolist() == ring


@given(data=st.data())
def test_vlmacc_vlmaccr32_model(data):
    ring = data.draw(st.lists(st.integers(-(2**39 - 1), 2**39 - 1), min_size=8, max_size=8))
    c = data.draw(st.lists(i32, min_size=8, max_size=8))
    m = data.draw(st.lists(i32, min_size=8, max_size=8))
    got = xs3.vlmaccr(W.from_python(ring), np.array(c, np.int32), np.array(m, np.int32), mode=32)
    assert list(W.to_python(got)) == m_vlmaccr(ring, c, m, 32)
    got = xs3.vlmacc(W.from_python(ring), np.array(c, np.int32), np.array(m, np.int32), mode=32)
    assert list(W.to_python(got)) == [sat(a + rshr(x * y, 30), 40) for a, x, y in zip(ring, c, m)]


@given(data=st.data(), b=modes)
def test_vdepth1_vpos_model(data, b):
    epv = 256 // b
    x = data.draw(st.lists(lane(b), min_size=epv, max_size=epv))
    bits = sum(1 << i for i, v in enumerate(x) if v < 0)
    assert int(xs3.vdepth1(np.array(x, np.int32), mode=b)) == wrap32(bits)
    np.testing.assert_array_equal(np.asarray(xs3.vpos(np.array(x, np.int32), mode=b)), [max(v, 0) for v in x])


@given(data=st.data())
def test_vlmaccr1_model(data):
    ring = data.draw(st.lists(i32, min_size=16, max_size=16))
    c = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=8, max_size=8))
    m = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=8, max_size=8))
    s = sum(bin(~(a ^ b) & 0xFFFFFFFF).count("1") - 16 for a, b in zip(c, m))
    got = xs3.vlmaccr1(np.array(ring, np.int32), np.array(c, np.uint32), np.array(m, np.uint32))
    assert np.asarray(got).tolist() == [sat(ring[-1] + s, 32)] + ring[:-1]


# ------------------------------------------------------------------------ jit / vmap


class TestTransforms(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_lanewise_under_jit(self):
        rng = np.random.default_rng(0)
        acc = rng.integers(-(2**31), 2**31, (4, 16), dtype=np.int64).astype(np.int32)
        sh = rng.integers(0, 40, (4, 16)).astype(np.int32)
        x16 = rng.integers(-(2**15), 2**15, (4, 16)).astype(np.int16)
        for v in VARIANTS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                f = self.variant(lambda a, s: xs3.vlsat(a, s, mode=16, variant=v))
                want = [m_vlsat(int(a), int(s), 16, v) for a, s in zip(acc.ravel(), sh.ravel())]
                np.testing.assert_array_equal(np.asarray(f(acc, sh)).ravel(), want)
            g = self.variant(lambda x, s: xs3.vlashr(x, s, mode=16, variant=v))
            want = [m_vlashr(int(x), -3, 16, v) for x in x16.ravel()]
            np.testing.assert_array_equal(np.asarray(g(x16, np.int32(-3))).ravel(), want)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ring_under_jit(self):
        rng = np.random.default_rng(1)
        ring = rng.integers(-(2**31), 2**31, (3, 16), dtype=np.int64).astype(np.int32)
        c = rng.integers(-128, 128, (3, 32)).astype(np.int8)
        m = rng.integers(-128, 128, (3, 32)).astype(np.int8)
        f = self.variant(lambda r, c, m: xs3.vlmaccr(r, c, m, mode=8))
        got = np.asarray(f(ring, c, m))
        for i in range(3):
            want = m_vlmaccr(ring[i].tolist(), c[i].tolist(), m[i].tolist(), 8)
            assert got[i].tolist() == want


def test_vmap_matches_batched():
    rng = np.random.default_rng(2)
    ring = rng.integers(-(2**39 - 1), 2**39, (5, 8), dtype=np.int64)
    acc = W.from_python(ring.astype(object))
    c = rng.integers(-(2**31), 2**31, (5, 8), dtype=np.int64).astype(np.int32)
    m = rng.integers(-(2**31), 2**31, (5, 8), dtype=np.int64).astype(np.int32)
    vm = jax.vmap(lambda a, c, m: xs3.vlmaccr(a, c, m, mode=32))(acc, c, m)
    batched = xs3.vlmaccr(acc, c, m, mode=32)
    np.testing.assert_array_equal(np.asarray(vm.hi), np.asarray(batched.hi))
    np.testing.assert_array_equal(np.asarray(vm.lo), np.asarray(batched.lo))
    for i in range(5):
        assert list(W.to_python(W.Wide(vm.hi[i], vm.lo[i]))) == m_vlmaccr(
            ring[i].tolist(), c[i].tolist(), m[i].tolist(), 32
        )
    x = rng.integers(-(2**15), 2**15, (6, 16)).astype(np.int32)
    shr = np.arange(-3, 3, dtype=np.int32)
    got = jax.vmap(lambda x, s: xs3.vlashr(x, s, mode=16, variant="host"))(x, shr)
    for i in range(6):
        assert np.asarray(got[i]).tolist() == [m_vlashr(int(v), int(shr[i]), 16, "host") for v in x[i]]


def test_no_x64_needed():
    assert not jax.config.jax_enable_x64
    assert xs3.vlmul(np.int32(-(2**31)), np.int32(-(2**31)), mode=32).dtype == jnp.int32


# ---------------------------------------------------------------------------- errors


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        xs3.vladd(1, 2, mode=12)
    with pytest.raises(ValueError, match="variant must be one of"):
        xs3.vladd(1, 2, mode=8, variant="chip")
    with pytest.raises(ValueError, match=r"x must lie in \[-128, 127\]"):
        xs3.vlashr(np.array([200]), 1, mode=8)
    with pytest.raises(ValueError, match="vr is a float array and must hold integer values"):
        xs3.vladd(np.array([1.5]), 2, mode=8)
    with pytest.raises(ValueError, match="does not model 32-bit VLSAT"):
        xs3.vlsat(np.int32(5), 1, mode=32, variant="host")
    with pytest.raises(ValueError, match="does not model 32-bit VLMACC"):
        xs3.vlmacc(np.int32(5), 1, 1, mode=32, variant="v2021")
    with pytest.raises(ValueError, match="16-accumulator ring"):
        xs3.vlmaccr(np.zeros(8, np.int32), np.zeros(32, np.int8), np.zeros(32, np.int8), mode=8)
    with pytest.raises(ValueError, match="32 lanes"):
        xs3.vlmaccr(np.zeros(16, np.int32), np.zeros(16, np.int8), np.zeros(16, np.int8), mode=8)
    with pytest.raises(ValueError, match="mode must be one of"):
        xs3.vdepth8(np.int32(1), mode=8)
    with pytest.raises(ValueError, match=r"shift must lie in \[-32768, 65535\]"):
        xs3.vlsat(np.int32(1), 70000, mode=16)


def test_host_wide_vlsat_shift_warns():
    with pytest.warns(UserWarning, match="undefined"):
        y = xs3.vlsat(np.int32(-5), np.int32(40), mode=16, variant="host")
    assert int(y) == -1


@given(acc=st.integers(-(2**39), 2**39 - 1), junk=st.integers(0, 2**24 - 1))
def test_acc40_from_registers(acc, junk):
    """§1.4: only the low byte of vD is read (signed); vR is read unsigned."""
    vd = wrap32(((acc >> 32) & 0xFF) | (junk << 8))
    vr = wrap32(acc & 0xFFFFFFFF)  # the int32 bit pattern of the low word
    got = xs3.acc40_from_registers(np.int32(vd), np.int32(vr))
    assert int(W.to_python(got)) == acc
