"""NVDLA SDP/CDP INT LUT: golden vectors, a big-integer model of the spec, transforms."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwjax.core import wide
from hwjax.nvdla import (
    HIT,
    LO,
    OFLOW,
    UFLOW,
    CdpLutConfig,
    SdpLutConfig,
    cdp_lrn,
    cdp_lut,
    cdp_sqsum,
    sdp_lut,
)
from tests.conftest import golden_path

STATES = {HIT: "hit", UFLOW: "uflow", OFLOW: "oflow"}
NAMES = {"H": "hit", "U": "uflow", "O": "oflow"}
COUNTER_KEYS = ("lut_uflow", "lut_oflow", "lut_le_hit", "lut_lo_hit", "lut_hybrid")


# ------------------------------------------------------------ big-integer model (spec 0, 2, 3)


def sat(v: int, n: int) -> int:
    return max(-(1 << (n - 1)), min((1 << (n - 1)) - 1, v))


def rshift_rhaz(v: int, s: int) -> int:
    if s <= 0:
        return v << -s
    q = (abs(v) + (1 << (s - 1))) >> s
    return q if v >= 0 else -q


def sx(v: int, n: int) -> int:
    v &= (1 << n) - 1
    return v - (1 << n) if v >> (n - 1) else v


def _classify(x: int, R: dict, t: str):
    """Spec 2.2 / 3.2: (state, idx, rem, n) with fraction rem / 2**n."""
    depth = 65 if t == "le" else 257
    last = depth - 1
    d = x - R[f"{t}_start"]
    if d <= 0:
        return "U", 0, 0, 0
    if t == "le" and R["le_function"] == "EXPONENT":
        e = d.bit_length() - 1
        i = e - R["le_index_offset"]
        if i < 0:
            return "U", 0, 0, 0
        if i >= last:
            return "O", last, 0, 0
        return "H", i, d - (1 << e), e
    sel = R[f"{t}_index_select"]
    q = d >> sel if sel >= 0 else d << -sel
    if q >= last:
        return "O", last, 0, 0
    return ("H", q, d & ((1 << sel) - 1), sel) if sel >= 0 else ("H", q, 0, 0)


def _pick_lo(le: str, lo: str, R: dict) -> int:
    if le == lo == "U":
        return R["uflow_priority"]
    if le == lo == "O":
        return R["oflow_priority"]
    if (le == "H") == (lo == "H"):
        return R["hybrid_priority"]
    return 0 if le == "H" else 1


def sdp_model(x: int, R: dict, LE_T: list, LO_T: list) -> dict:
    """Spec 2.9 restated, plus the per-element fields of the conformance files."""
    le, lo = _classify(x, R, "le"), _classify(x, R, "lo")
    pick = _pick_lo(le[0], lo[0], R)
    s, idx, rem, n = lo if pick else le
    T, t = (LO_T, "lo") if pick else (LE_T, "le")
    frac = rem << (35 - n)
    if s == "H":
        out = rshift_rhaz(T[idx] * ((1 << 35) - frac) + T[idx + 1] * frac, 35)
    else:
        kind = "oflow" if s == "O" else "uflow"
        ref = R[f"{t}_end"] if s == "O" else R[f"{t}_start"]
        off = R["le_index_offset"]
        bias = (1 << off) if (t == "le" and R["le_function"] == "EXPONENT" and s == "U" and off > 0) else 0
        c = sat(rshift_rhaz((x - ref - bias) * R[f"{t}_{kind}_scale"], R[f"{t}_{kind}_shift"]), 32)
        out = sat(T[idx] + c, 32)
    return {
        "out": out,
        "sel": "LO" if pick else "LE",
        "addr": idx,
        "frac35": frac if s == "H" else 0,
        "uflow": int(s == "U"),
        "oflow": int(s == "O"),
        "le_hit": int(le[0] == "H"),
        "lo_hit": int(lo[0] == "H"),
        "le_state": NAMES[le[0]],
        "lo_state": NAMES[lo[0]],
    }


def sdp_model_counters(cases: list[dict]) -> dict:
    return {
        "lut_uflow": sum(c["uflow"] for c in cases),
        "lut_oflow": sum(c["oflow"] for c in cases),
        "lut_le_hit": sum(c["le_hit"] for c in cases),
        "lut_lo_hit": sum(c["lo_hit"] for c in cases),
        "lut_hybrid": sum(1 - c["uflow"] - c["oflow"] for c in cases),
    }


def cdp_model(x: int, R: dict, LE_T: list, LO_T: list) -> dict:
    """Spec 3.2-3.5 restated: each table's int16 value, the selection and the counter hit."""
    values, states = {}, {}
    for t, T in (("le", LE_T), ("lo", LO_T)):
        s, idx, rem, n = _classify(x, R, t)
        states[t] = s
        if s == "H":
            f16 = rem << (16 - n) if n <= 16 else rem >> (n - 16)
            values[t] = sat(T[idx] + rshift_rhaz((T[idx + 1] - T[idx]) * f16, 16), 16)
        elif s == "U":
            off = R["le_index_offset"]
            bias = (1 << off) if t == "le" and R["le_function"] == "EXPONENT" and off >= 0 else 0
            a = x - R[f"{t}_start"] - bias
            values[t] = sat(T[0] + rshift_rhaz(a * R[f"{t}_uflow_scale"], R[f"{t}_uflow_shift"]), 16)
        else:
            a = x - R[f"{t}_end"]
            values[t] = sat(T[idx] + rshift_rhaz(a * R[f"{t}_oflow_scale"], R[f"{t}_oflow_shift"]), 16)
    le, lo = states["le"], states["lo"]
    pick = _pick_lo(le, lo, R)
    if le == lo == "U":
        counter = "lut_uflow"
    elif le == lo == "O":
        counter = "lut_oflow"
    elif (le == "H") != (lo == "H"):
        counter = "lut_le_hit" if le == "H" else "lut_lo_hit"
    else:
        counter = "lut_hybrid"
    return {
        "out": values["lo" if pick else "le"],
        "le_value": values["le"],
        "lo_value": values["lo"],
        "sel": "LO" if pick else "LE",
        "counter": counter,
        "le_state": NAMES[le],
        "lo_state": NAMES[lo],
    }


# ------------------------------------------------------------------------------ helpers


def _np(a):
    return np.asarray(a).astype(np.int64)


def _sdp_fields(y, det) -> dict[str, list]:
    """Per-element fields of ``sdp_lut`` in the conformance files' vocabulary."""
    return {
        "out": _np(y).tolist(),
        "sel": ["LO" if s else "LE" for s in _np(det["sel"])],
        "addr": _np(det["addr"]).tolist(),
        "frac35": [int(v) for v in wide.to_python(det["frac35"])],
        **{k: _np(det[k]).tolist() for k in ("uflow", "oflow", "le_hit", "lo_hit")},
    }


def _counters(stats) -> dict[str, int]:
    return {k: int(stats[k]) for k in COUNTER_KEYS}


def _load(name: str) -> dict:
    with open(golden_path("nvdla", name)) as f:
        return json.load(f)


# ------------------------------------------------------------------- golden: SDP curated

SCENARIOS = [
    "A_exp_overlap",
    "B_exp_posoffset_hybridmiss",
    "C_linear_linear_hybridmiss",
    "D_sigmoid_Q12",
    "E_edge_negselect_saturation",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_sdp_golden_scenario(name):
    data = _load("sdp_lut_golden.json")
    (sc,) = [s for s in data["scenarios"] if s["name"] == name]
    assert len(sc["runs"]) == 8
    prios = {tuple(r["priorities"].values()) for r in sc["runs"]}
    assert len(prios) == 8  # every (uflow, oflow, hybrid) priority combination
    n = len(sc["inputs"])
    x = jnp.asarray(np.pad(sc["inputs"], (0, 640 - n), mode="edge"), jnp.int32)  # one shape for all
    for run in sc["runs"]:
        cfg = SdpLutConfig(**sc["registers"], le_table=sc["le_table"], lo_table=sc["lo_table"], **run["priorities"])
        assert cfg.to_register_words() == run["register_words"]
        assert SdpLutConfig.from_register_words(run["register_words"], sc["le_table"], sc["lo_table"]) == cfg
        y, stats, det = sdp_lut(x, cfg, return_details=True)
        got = _sdp_fields(y, det)
        y0, y1 = _np(det["y0"]), _np(det["y1"])
        le_st, lo_st = _np(det["le_state"]), _np(det["lo_state"])
        for i, case in enumerate(run["cases"]):
            assert case["x"] == sc["inputs"][i]
            for k in got:
                assert got[k][i] == case[k], (name, run["priorities"], case, k, got[k][i])
            assert STATES[le_st[i]] == case["le_state"] and STATES[lo_st[i]] == case["lo_state"]
            assert y0[i] == case["y0"]
            if case["y1"] is not None:
                assert y1[i] == case["y1"]
            else:
                assert case["uflow"] or case["oflow"]
        # The padding repeats the last case 640 - n times.
        last = run["cases"][-1]
        pad = {
            "lut_uflow": last["uflow"],
            "lut_oflow": last["oflow"],
            "lut_le_hit": last["le_hit"],
            "lut_lo_hit": last["lo_hit"],
            "lut_hybrid": 1 - last["uflow"] - last["oflow"],
        }
        assert _counters(stats) == {k: run["counters"][k] + (640 - n) * pad[k] for k in COUNTER_KEYS}
        total = sum(run["counters"][k] for k in ("lut_uflow", "lut_oflow", "lut_hybrid"))
        assert total == run["counters"]["total"] == n


def test_sdp_golden_categories_covered():
    data = _load("sdp_lut_golden.json")
    seen = set()
    for sc in data["scenarios"]:
        seen |= {c["category"] for r in sc["runs"] for c in r["cases"]}
    assert seen == {"both_uflow", "both_oflow", "both_hit", "le_only_hit", "lo_only_hit", "hybrid_miss"}


def test_sdp_model_matches_golden():
    """The big-integer model used by the property tests reproduces the golden scenarios."""
    data = _load("sdp_lut_golden.json")
    for sc in data["scenarios"]:
        for run in sc["runs"]:
            R = {**sc["registers"], **run["priorities"]}
            cases = [sdp_model(c["x"], R, sc["le_table"], sc["lo_table"]) for c in run["cases"]]
            for m, c in zip(cases, run["cases"]):
                assert {k: c[k] for k in m} == m
            assert sdp_model_counters(cases) == {k: run["counters"][k] for k in COUNTER_KEYS}


# ---------------------------------------------------------------------- golden: SDP fuzz


def _fuzz_check(configs):
    for i, c in enumerate(configs):
        cfg = SdpLutConfig.from_register_words(c["register_words"], c["le_table"], c["lo_table"])
        regs = cfg.registers()
        assert regs == {**c["registers"], **c["priorities"], "underflow_bias": "c_model"}
        assert cfg.to_register_words() == c["register_words"]
        y, stats, det = sdp_lut(jnp.asarray(c["x"], jnp.int32), cfg, return_details=True)
        got = _sdp_fields(y, det)
        for k, v in got.items():
            assert v == c[k], (i, k)
        assert _counters(stats) == {k: c["counters"][k] for k in COUNTER_KEYS}, i


def test_sdp_golden_fuzz_all_configs():
    _fuzz_check(_load("sdp_lut_fuzz_dev.json")["configs"])


def test_sdp_golden_fuzz_with_x64():
    configs = _load("sdp_lut_fuzz_dev.json")["configs"]
    with jax.enable_x64(True):
        _fuzz_check(configs[::4])


# ----------------------------------------------------------------------------- golden: CDP


def _cdp_icvt(values, R):
    if R["precision"] == "INT16":
        off, bits = R["datin_offset"], 17
    else:
        off, bits = sx(R["datin_offset"], 8), 9
    return [sat(rshift_rhaz((v - off) * R["datin_scale"], R["datin_shifter"]), bits) for v in values]


def _cdp_ocvt(m, R):
    if R["precision"] == "INT16":
        return sat(rshift_rhaz((m - R["datout_offset"]) * R["datout_scale"], R["datout_shifter"]), 16)
    return sat(rshift_rhaz((m - sx(R["datout_offset"], 25)) * R["datout_scale"], R["datout_shifter"]), 8)


def _cdp_golden_check(case):
    R = case["registers"]
    lut_regs = {k: v for k, v in R.items() if k in CdpLutConfig.__dataclass_fields__}
    cfg = CdpLutConfig(**lut_regs, le_table=case["le_table"], lo_table=case["lo_table"])
    raw = {k: case["register_fields_raw"][k] for k in CdpLutConfig.FIELDS_RAW}
    assert CdpLutConfig.from_register_fields(raw, case["le_table"], case["lo_table"], precision=R["precision"]) == cfg
    assert cfg.to_register_fields() == raw
    wins = case["windows"]
    assert len(wins) * len(wins[0]["data_in"]) == 192
    centre = slice(4, 8) if R["precision"] == "INT16" else slice(4, 12)
    v = jnp.asarray([_cdp_icvt(w["data_in"], R) for w in wins], jnp.int32)
    m, _, det = cdp_lrn(
        v,
        cfg,
        normalz_len=R["normalz_len"],
        sqsum_bypass=bool(R["sqsum_bypass"]),
        mul_bypass=bool(R["mul_bypass"]),
        return_details=True,
    )
    lut_in = wide.to_python(det["lut_in"])[:, centre]
    m = wide.to_python(m)[:, centre]
    hi, lo = np.asarray(det["lut_in"].hi)[:, centre], np.asarray(det["lut_in"].lo)[:, centre]
    for j, w in enumerate(wins):
        assert [int(a) for a in lut_in[j]] == w["lut_in"]
        for k in ("le_state", "lo_state"):
            assert [STATES[s] for s in _np(det[k])[j, centre]] == w[k]
        assert ["LO" if s else "LE" for s in _np(det["sel"])[j, centre]] == w["sel"]
        for k in ("le_value", "lo_value"):
            assert _np(det[k])[j, centre].tolist() == w[k]
        assert _np(det["lut"])[j, centre].tolist() == w["lut_out"]
        assert [_cdp_ocvt(int(a), R) for a in m[j]] == w["out"]
        # Counters per window, over the window's outputs only. The outputs are repeated
        # to the length of the call above (the counters scale with the repetition), so
        # the compiled kernel is reused.
        reps = 192 // hi.shape[1]
        stats = cdp_lut(wide.Wide(jnp.tile(hi[j], reps), jnp.tile(lo[j], reps)), cfg)[1]
        assert _counters(stats) == {k: reps * v for k, v in w["counters"].items()}
        model = [cdp_model(int(a), R, case["le_table"], case["lo_table"]) for a in lut_in[j]]
        assert [mm["out"] for mm in model] == w["lut_out"]


def test_cdp_golden_all_cases():
    data = _load("cdp_lut_int.json")
    groups = {c["group"] for c in data["cases"]}
    assert groups == {"A_int16_bypass_identity", "B_int16_sqsum", "C_int8_bypass", "C_int8_sqsum"}
    for case in data["cases"]:
        _cdp_golden_check(case)


def test_cdp_golden_with_x64():
    data = _load("cdp_lut_int.json")
    cases = [c for c in data["cases"] if c["group"] == "B_int16_sqsum"]
    with jax.enable_x64(True):
        for le_function in ("EXPONENT", "LINEAR"):
            _cdp_golden_check(next(c for c in cases if c["registers"]["le_function"] == le_function))


# ----------------------------------------------------------------- property tests vs model


def _sdp_registers(draw_int, exp_mode: bool, near: bool) -> dict:
    start = (lambda: draw_int(-(2**20), 2**20)) if near else (lambda: draw_int(-(2**31), 2**31 - 1))
    return {
        "le_function": "EXPONENT" if exp_mode else "LINEAR",
        "le_start": start(),
        "le_end": start(),
        "lo_start": start(),
        "lo_end": start(),
        "le_index_offset": draw_int(-40, 31) if exp_mode else draw_int(-128, 127),
        "le_index_select": draw_int(-128, 127) if exp_mode else draw_int(-12, 32),
        "lo_index_select": draw_int(-12, 32),
        **{f"{t}_{k}_scale": draw_int(-(2**15), 2**15 - 1) for t in ("le", "lo") for k in ("uflow", "oflow")},
        **{f"{t}_{k}_shift": draw_int(-16, 15) for t in ("le", "lo") for k in ("uflow", "oflow")},
        **{p: draw_int(0, 1) for p in ("uflow_priority", "oflow_priority", "hybrid_priority")},
    }


def _inputs_near(rng, anchors, n, lo, hi):
    """Uniform values plus values at and around the registers and at power-of-two offsets."""
    k = rng.integers(0, 40, n)
    a = rng.choice(anchors, n)
    off = np.where(rng.random(n) < 0.5, rng.integers(-3, 4, n), np.sign(rng.random(n) - 0.5) * (2**k))
    x = np.where(rng.random(n) < 0.25, rng.integers(lo, hi, n), a + off)
    return np.clip(x, lo, hi).astype(np.int64)


@given(seed=st.integers(0, 2**32 - 1), exp_mode=st.booleans(), near=st.booleans())
def test_sdp_matches_model(seed, exp_mode, near):
    rng = np.random.default_rng(seed)
    R = _sdp_registers(lambda a, b: int(rng.integers(a, b + 1)), exp_mode, near)
    le_t = rng.integers(-(2**15), 2**15, 65).tolist()
    lo_t = rng.integers(-(2**15), 2**15, 257).tolist()
    cfg = SdpLutConfig(**R, le_table=le_t, lo_table=lo_t)
    anchors = [R[k] for k in ("le_start", "le_end", "lo_start", "lo_end")]
    x = _inputs_near(rng, anchors, 48, -(2**31), 2**31 - 1)
    y, stats, det = sdp_lut(jnp.asarray(x, jnp.int32), cfg, return_details=True)
    got = _sdp_fields(y, det)
    model = [sdp_model(int(v), R, le_t, lo_t) for v in x]
    for k in got:
        assert got[k] == [m[k] for m in model], k
    assert _counters(stats) == sdp_model_counters(model)


@given(seed=st.integers(0, 2**32 - 1), exp_mode=st.booleans(), wide_input=st.booleans())
def test_cdp_matches_model(seed, exp_mode, wide_input):
    rng = np.random.default_rng(seed)
    lim = 2**37 if wide_input else 2**20

    def draw(a, b):
        return int(rng.integers(a, b + 1))

    R = {
        "le_function": "EXPONENT" if exp_mode else "LINEAR",
        **{k: draw(-lim, lim - 1) for k in ("le_start", "le_end", "lo_start", "lo_end")},
        "le_index_offset": draw(-40, 47) if exp_mode else draw(-128, 127),
        "le_index_select": draw(-128, 127) if exp_mode else draw(-24, 30),
        "lo_index_select": draw(-24, 30),
        **{f"{t}_{k}_scale": draw(-(2**15), 2**15 - 1) for t in ("le", "lo") for k in ("uflow", "oflow")},
        **{f"{t}_{k}_shift": draw(-16, 15) for t in ("le", "lo") for k in ("uflow", "oflow")},
        **{p: draw(0, 1) for p in ("uflow_priority", "oflow_priority", "hybrid_priority")},
    }
    le_t = rng.integers(-(2**15), 2**15, 65).tolist()
    lo_t = rng.integers(-(2**15), 2**15, 257).tolist()
    cfg = CdpLutConfig(**R, le_table=le_t, lo_table=lo_t)
    anchors = [R[k] for k in ("le_start", "le_end", "lo_start", "lo_end")]
    x = _inputs_near(rng, anchors, 48, -lim, lim - 1)
    y, stats, det = cdp_lut(wide.from_python(x.tolist()), cfg, return_details=True)
    model = [cdp_model(int(v), R, le_t, lo_t) for v in x]
    assert _np(y).tolist() == [m["out"] for m in model]
    for k in ("le_value", "lo_value"):
        assert _np(det[k]).tolist() == [m[k] for m in model]
    assert ["LO" if s else "LE" for s in _np(det["sel"])] == [m["sel"] for m in model]
    assert _counters(stats) == {k: sum(m["counter"] == k for m in model) for k in COUNTER_KEYS}


@given(seed=st.integers(0, 2**32 - 1), normalz_len=st.integers(0, 3), int8=st.booleans())
def test_cdp_sqsum_matches_model(seed, normalz_len, int8):
    rng = np.random.default_rng(seed)
    bound = 2**8 if int8 else 2**16
    v = rng.integers(-bound, bound, (3, 11))
    v[0, :3] = -bound  # extremes: (-2**16)**2 = 2**32 does not fit 32 bits
    got = wide.to_python(cdp_sqsum(jnp.asarray(v, jnp.int32), normalz_len, axis=1))
    L = normalz_len + 1
    for r in range(3):
        for c in range(11):
            assert got[r, c] == sum(int(v[r, j]) ** 2 for j in range(max(0, c - L), min(11, c + L + 1)))


# ---------------------------------------------------------------------------- transforms


@pytest.fixture(scope="module")
def sigmoid_case():
    data = _load("sdp_lut_golden.json")
    (sc,) = [s for s in data["scenarios"] if s["name"] == "D_sigmoid_Q12"]
    run = sc["runs"][5]
    cfg = SdpLutConfig(**sc["registers"], le_table=sc["le_table"], lo_table=sc["lo_table"], **run["priorities"])
    n = len(sc["inputs"]) // 7 * 7
    return cfg, np.asarray(sc["inputs"][:n]), np.asarray([c["out"] for c in run["cases"][:n]])


def _vmapped(f):
    def g(x, cfg):
        y, stats = jax.vmap(lambda row: f(row, cfg))(x.reshape(7, -1))
        return y.reshape(-1), {k: v.sum(dtype=jnp.uint32) for k, v in stats.items()}

    return g


@pytest.mark.parametrize("transform", ["eager", "jit", "vmap", "jit_vmap"])
def test_sdp_transforms(sigmoid_case, transform):
    cfg, x, expected = sigmoid_case
    f = {"eager": sdp_lut, "jit": jax.jit(sdp_lut), "vmap": _vmapped(sdp_lut), "jit_vmap": jax.jit(_vmapped(sdp_lut))}[
        transform
    ]
    y, stats = f(jnp.asarray(x, jnp.int32), cfg)
    assert _np(y).tolist() == expected.tolist()
    y_ref, stats_ref = sdp_lut(jnp.asarray(x, jnp.int32), cfg)
    assert _counters(stats) == _counters(stats_ref)


def test_sdp_vmap_over_tables(sigmoid_case):
    cfg, x, expected = sigmoid_case
    tables = jnp.stack([jnp.asarray(cfg.lo_table), -jnp.asarray(cfg.lo_table)])
    ys = jax.jit(jax.vmap(lambda t: sdp_lut(x.astype(np.int32), cfg.replace(lo_table=t))[0]))(tables)
    assert _np(ys[0]).tolist() == expected.tolist()
    neg = cfg.replace(lo_table=-np.asarray(cfg.lo_table))
    assert _np(ys[1]).tolist() == _np(sdp_lut(x.astype(np.int32), neg)[0]).tolist()


@pytest.mark.parametrize("transform", ["eager", "jit", "vmap"])
def test_cdp_transforms(transform):
    case = _load("cdp_lut_int.json")["cases"][12]
    R = case["registers"]
    cfg = CdpLutConfig(
        **{k: v for k, v in R.items() if k in CdpLutConfig.__dataclass_fields__},
        le_table=case["le_table"],
        lo_table=case["lo_table"],
    )
    x = [a for w in case["windows"] for a in w["lut_in"]]
    expected = [a for w in case["windows"] for a in w["lut_out"]]
    xw = wide.from_python(x)
    if transform == "vmap":
        rows = (xw.hi.reshape(4, -1), xw.lo.reshape(4, -1))
        y = jax.vmap(lambda h, lo: cdp_lut(wide.Wide(h, lo), cfg)[0])(*rows)
    else:
        f = jax.jit(cdp_lut) if transform == "jit" else cdp_lut
        y = f(xw, cfg)[0]
    assert _np(y).reshape(-1).tolist() == expected
    with jax.enable_x64(True):
        y64 = cdp_lut(jnp.asarray(x, jnp.int64), cfg)[0]
    assert _np(y64).tolist() == expected


def test_narrow_and_float_inputs_agree(sigmoid_case):
    cfg, x, expected = sigmoid_case
    x16 = x[(x >= -(2**15)) & (x < 2**15)]
    y16 = sdp_lut(jnp.asarray(x16, jnp.int16), cfg)[0]
    assert y16.dtype == jnp.int32
    assert _np(y16).tolist() == expected[(x >= -(2**15)) & (x < 2**15)].tolist()
    yf, stats = sdp_lut(jnp.asarray(x, jnp.float32), cfg)
    assert yf.dtype == jnp.float32
    assert np.asarray(yf).astype(np.int64).tolist() == expected.tolist()
    with pytest.raises(ValueError, match="integer values"):
        sdp_lut(jnp.asarray([0.5], jnp.float32), cfg)


# ------------------------------------------------------------------------------ gradient


def _segment_grad_checks(f, cfg, xs):
    """jax.grad at x equals the secant of the LUT over the whole segment that x uses."""
    g = jax.grad(lambda v: f(v, cfg)[0].sum())(jnp.asarray(xs, jnp.float32))
    _, _, det = f(jnp.asarray(xs, jnp.int32), cfg, return_details=True)
    return np.asarray(g), det


def test_sdp_gradient_is_segment_slope():
    rng = np.random.default_rng(0)
    R = {
        "le_function": "LINEAR",
        "le_start": -4096,
        "le_end": 4096,
        "lo_start": -32768,
        "lo_end": 32768,
        "le_index_offset": 0,
        "le_index_select": 7,
        "lo_index_select": 8,
        "le_uflow_scale": 0,
        "le_oflow_scale": 0,
        "le_uflow_shift": 0,
        "le_oflow_shift": 0,
        "lo_uflow_scale": 88,
        "lo_oflow_scale": -300,
        "lo_uflow_shift": 15,
        "lo_oflow_shift": 3,
    }
    cfg = SdpLutConfig(
        **R,
        le_table=rng.integers(-9000, 9000, 65),
        lo_table=rng.integers(-9000, 9000, 257),
        uflow_priority=1,
        oflow_priority=1,
        hybrid_priority=0,
    )
    xs = rng.integers(-40000, 40000, 400)
    g, det = _segment_grad_checks(sdp_lut, cfg, xs)
    f_int = jax.jit(lambda v: sdp_lut(v, cfg)[0])
    hit = ~np.asarray(det["uflow"] | det["oflow"])
    # Finite difference across the segment x lies in (start a, width 2**sel of the table
    # used), between its second and its last input; each end is rounded by <= 1/2.
    sel = np.where(_np(det["sel"]) == LO, 8, 7)
    a = np.where(_np(det["sel"]) == LO, -32768, -4096) + _np(det["addr"]) * 2**sel
    ya = _np(f_int(jnp.asarray(a + 1, jnp.int32)))
    yb = _np(f_int(jnp.asarray(a + 2**sel - 1, jnp.int32)))
    fd = (yb - ya) / (2.0**sel - 2)
    assert hit.sum() > 200
    assert np.all(np.abs(g - fd)[hit] <= 1.0 / (2.0**sel - 2)[hit] + 1e-6)
    # Extrapolation: secant over a long stretch of the same line (rounding averages out).
    step = np.where(_np(det["oflow"]) == 1, 2**12, -(2**18))
    y_far = _np(f_int(jnp.asarray(xs + step, jnp.int32)))
    y_here = _np(f_int(jnp.asarray(xs, jnp.int32)))
    ext = ~hit
    assert ext.sum() > 20
    np.testing.assert_allclose(g[ext], ((y_far - y_here) / step)[ext], rtol=2e-3, atol=1e-5)
    assert set(np.unique(g[ext])) == {88 / 2**15, -300 / 2**3}


def test_sdp_gradient_exponent_and_saturation():
    R = {
        "le_function": "EXPONENT",
        "le_start": 0,
        "le_end": 2**30,
        "lo_start": 2**31 - 1,
        "lo_end": 0,
        "le_index_offset": 0,
        "le_index_select": 0,
        "lo_index_select": 0,
        "le_uflow_scale": 32767,
        "le_oflow_scale": 0,
        "le_uflow_shift": -16,
        "le_oflow_shift": 0,
        "lo_uflow_scale": 0,
        "lo_oflow_scale": 0,
        "lo_uflow_shift": 0,
        "lo_oflow_shift": 0,
    }
    le_t = np.arange(65) * 100
    cfg = SdpLutConfig(**R, le_table=le_t, lo_table=np.zeros(257, int))
    xs = jnp.asarray([3.0, 5.0, 1000.0, 2.0**20 + 7, -(2.0**20), -1.0], jnp.float32)
    g = np.asarray(jax.grad(lambda v: sdp_lut(v, cfg)[0].sum())(xs))
    # Octave [2**e, 2**(e+1)) between entries e and e+1: slope 100 / 2**e.
    assert g[:4].tolist() == [100 / 2, 100 / 4, 100 / 512, 100 / 2**20]
    # Underflow with scale 32767 << 16: saturates far below START (gradient 0), not at -1.
    assert g[4] == 0.0 and g[5] == 32767 * 2.0**16


def test_cdp_gradient_is_segment_slope():
    R = {
        "le_function": "LINEAR",
        "le_start": 0,
        "le_end": 64 * 16,
        "lo_start": 2**30,
        "lo_end": 0,
        "le_index_offset": 0,
        "le_index_select": 4,
        "lo_index_select": 0,
        "le_uflow_scale": 5,
        "le_oflow_scale": -7,
        "le_uflow_shift": 1,
        "le_oflow_shift": 2,
        "lo_uflow_scale": 0,
        "lo_oflow_scale": 0,
        "lo_uflow_shift": 0,
        "lo_oflow_shift": 0,
    }
    cfg = CdpLutConfig(**R, le_table=np.arange(65) * 37, lo_table=np.zeros(257, int))
    xs = jnp.asarray([17.0, 40.0, -100.0, 5000.0], jnp.float32)
    g = np.asarray(jax.grad(lambda v: cdp_lut(v, cfg)[0].sum())(xs))
    assert g.tolist() == [37 / 16, 37 / 16, 5 / 2, -7 / 4]


# ----------------------------------------------------------------- registers, validation


def _sdp_regs(**over):
    R = {
        "le_function": "LINEAR",
        "le_start": 0,
        "le_end": 64,
        "lo_start": 0,
        "lo_end": 256,
        "le_index_offset": 0,
        "le_index_select": 0,
        "lo_index_select": 0,
        "le_uflow_scale": 0,
        "le_oflow_scale": 0,
        "lo_uflow_scale": 0,
        "lo_oflow_scale": 0,
        "le_uflow_shift": 0,
        "le_oflow_shift": 0,
        "lo_uflow_shift": 0,
        "lo_oflow_shift": 0,
        "le_table": np.zeros(65, int),
        "lo_table": np.zeros(257, int),
    }
    R.update(over)
    return R


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("lo_index_select", 40, r"SDP LUT_LO_INDEX_SELECT=40 outside \[-128, 32\]"),
        ("le_index_select", 33, r"LUT_LE_INDEX_SELECT=33 outside \[-128, 32\]"),
        ("le_uflow_shift", 16, r"LUT_LE_UFLOW_SHIFT=16 outside \[-16, 15\]"),
        ("lo_oflow_shift", -17, r"LUT_LO_OFLOW_SHIFT=-17 outside"),
        ("le_oflow_scale", 2**15, r"LUT_LE_OFLOW_SCALE=32768 outside"),
        ("le_start", 2**31, r"LUT_LE_START=2147483648 outside"),
        ("hybrid_priority", 2, r"LUT_HYBRID_PRIORITY=2 outside \[0, 1\]"),
        ("le_function", "LOG", r"LUT_LE_FUNCTION"),
        ("le_table", np.zeros(64, int), r"le_table must have shape \(65,\)"),
        ("lo_table", np.full(257, 2**15), r"lo_table entry 32768 outside int16"),
        ("le_table", np.full(65, 0.5), r"le_table must hold integers"),
    ],
)
def test_sdp_config_rejects(field, value, match):
    with pytest.raises(ValueError, match=match):
        SdpLutConfig(**_sdp_regs(**{field: value}))


def test_sdp_config_ranges_depend_on_mode():
    with pytest.raises(ValueError, match=r"LUT_LE_INDEX_OFFSET=32 outside \[-128, 31\]"):
        SdpLutConfig(**_sdp_regs(le_function="EXPONENT", le_index_offset=32))
    # Ignored fields may hold any 8-bit value; START > END is legal (END is never compared).
    SdpLutConfig(**_sdp_regs(le_function="EXPONENT", le_index_offset=31, le_index_select=127))
    SdpLutConfig(**_sdp_regs(le_index_offset=127, le_start=100, le_end=-100))
    with pytest.raises(TypeError):
        SdpLutConfig(**_sdp_regs(lo_index_select=1.0))


def test_sdp_register_words_round_trip_and_reserved_bits():
    cfg = SdpLutConfig(
        **_sdp_regs(
            le_function="EXPONENT",
            le_index_offset=-44,
            lo_index_select=-2,
            le_uflow_shift=-16,
            lo_oflow_scale=-32768,
            le_start=-1,
        ),
        uflow_priority=1,
        hybrid_priority=1,
    )
    words = cfg.to_register_words()
    assert all(0 <= w < 2**32 for w in words.values())
    assert SdpLutConfig.from_register_words(words, cfg.le_table, cfg.lo_table) == cfg
    assert words["S_LUT_LE_SLOPE_SHIFT"] & 0x1F == 0b10000  # -16 (spec 1.2 example)
    with pytest.raises(ValueError, match="reserved bits"):
        bad = {**words, "S_LUT_CFG": words["S_LUT_CFG"] | 2}
        SdpLutConfig.from_register_words(bad, cfg.le_table, cfg.lo_table)
    with pytest.raises(ValueError, match="missing"):
        SdpLutConfig.from_register_words({}, cfg.le_table, cfg.lo_table)


def test_cdp_config_ranges():
    base = _sdp_regs(le_start=-(2**37), lo_end=2**37 - 1)
    CdpLutConfig(**base)
    with pytest.raises(ValueError, match=r"CDP LUT_LO_INDEX_SELECT=31 outside \[-24, 30\]"):
        CdpLutConfig(**{**base, "lo_index_select": 31})
    with pytest.raises(ValueError, match=r"CDP LUT_LE_INDEX_OFFSET=48 outside \[-128, 47\]"):
        CdpLutConfig(**{**base, "le_function": "EXPONENT", "le_index_offset": 48})
    with pytest.raises(ValueError, match="LUT_LE_END"):
        CdpLutConfig(**{**base, "le_end": 2**37})
    cfg = CdpLutConfig(**{**base, "le_index_select": -24, "lo_index_select": 30})
    raw = cfg.to_register_fields()
    assert CdpLutConfig.from_register_fields(raw, cfg.le_table, cfg.lo_table) == cfg
    # A 0x80 select (+128 in the C model) is outside the accepted encoding.
    with pytest.raises(ValueError, match="LUT_LO_INDEX_SELECT"):
        CdpLutConfig.from_register_fields({**raw, "lo_index_select": 0x80}, cfg.le_table, cfg.lo_table)
    assert CdpLutConfig.from_sdp(SdpLutConfig(**_sdp_regs())).registers()["precision"] == "INT16"


def test_config_is_a_pytree():
    cfg = SdpLutConfig(**_sdp_regs(lo_table=np.arange(257) - 128))
    leaves, tree = jax.tree_util.tree_flatten(cfg)
    assert len(leaves) == 2 and leaves[1].dtype == jnp.int16
    assert jax.tree_util.tree_unflatten(tree, leaves) == cfg
    y = jax.jit(lambda c: sdp_lut(jnp.arange(-2, 300, dtype=jnp.int32), c)[0])(cfg)
    assert _np(y).tolist() == [
        sdp_model(v, {**cfg.registers()}, np.zeros(65, int).tolist(), (np.arange(257) - 128).tolist())["out"]
        for v in range(-2, 300)
    ]


def test_cdp_golden_end_to_end_with_convertors():
    """Input convertor -> sum of squares -> LUT -> multiply -> output convertor, using the
    library's CDP convertors, reproduces the golden ``out`` of every CDP case."""
    from hwjax.nvdla import cvt_unit, sign_extend

    for case in _load("cdp_lut_int.json")["cases"]:
        R = case["registers"]
        int16 = R["precision"] == "INT16"
        cfg = CdpLutConfig(
            **{k: v for k, v in R.items() if k in CdpLutConfig.__dataclass_fields__},
            le_table=case["le_table"],
            lo_table=case["lo_table"],
        )
        data = jnp.asarray([w["data_in"] for w in case["windows"]], jnp.int32)
        v = cvt_unit(
            "cdp_in_int16" if int16 else "cdp_in_int8",
            data,
            offset=R["datin_offset"] if int16 else sign_extend(R["datin_offset"], 8),
            scale=R["datin_scale"],
            shift=R["datin_shifter"],
        )
        m, _ = cdp_lrn(
            v, cfg, normalz_len=R["normalz_len"], sqsum_bypass=bool(R["sqsum_bypass"]), mul_bypass=bool(R["mul_bypass"])
        )
        out = cvt_unit(
            "cdp_out_int16" if int16 else "cdp_out_int8",
            m,
            offset=R["datout_offset"] if int16 else sign_extend(R["datout_offset"], 25),
            scale=R["datout_scale"],
            shift=R["datout_shifter"],
        )
        centre = slice(4, 8) if int16 else slice(4, 12)
        assert _np(out)[:, centre].tolist() == [w["out"] for w in case["windows"]], case["group"]


def test_cdp_lrn_under_jit_and_vmap():
    case = next(c for c in _load("cdp_lut_int.json")["cases"] if c["group"] == "B_int16_sqsum")
    R = case["registers"]
    cfg = CdpLutConfig(
        **{k: v for k, v in R.items() if k in CdpLutConfig.__dataclass_fields__},
        le_table=case["le_table"],
        lo_table=case["lo_table"],
    )
    v = jnp.asarray([_cdp_icvt(w["data_in"], R) for w in case["windows"]], jnp.int32)
    kw = dict(normalz_len=R["normalz_len"], mul_bypass=bool(R["mul_bypass"]))
    m_eager, stats = cdp_lrn(v, cfg, **kw)
    m_jit, stats_jit = jax.jit(lambda a, c: cdp_lrn(a, c, **kw))(v, cfg)
    m_vmap, stats_vmap = jax.vmap(lambda a: cdp_lrn(a, cfg, **kw))(v)
    expected = wide.to_python(m_eager).tolist()
    assert wide.to_python(m_jit).tolist() == expected == wide.to_python(m_vmap).tolist()
    assert _counters(stats_jit) == _counters(stats)
    assert {k: int(np.sum(stats_vmap[k])) for k in COUNTER_KEYS} == _counters(stats)
    # The transposed layout (channels on axis 0) gives the same sums of squares.
    assert (
        wide.to_python(cdp_sqsum(v.T, R["normalz_len"], axis=0)).T.tolist()
        == wide.to_python(cdp_sqsum(v, R["normalz_len"])).tolist()
    )
    with pytest.raises(ValueError, match="normalz_len"):
        cdp_sqsum(v, 4)


def test_sdp_boundaries_spec_2_6():
    """x == START, START + 1, END - 1 and END (spec 2.6), with expected values from the text."""
    rng = np.random.default_rng(7)
    le_t, lo_t = rng.integers(-30000, 30000, 65), rng.integers(-30000, 30000, 257)
    start, sel = -1000, 5
    end = start + 256 * 2**sel  # consistent LINEAR END
    lin = SdpLutConfig(
        **_sdp_regs(
            lo_start=start,
            lo_index_select=sel,
            lo_end=end,
            le_start=2**31 - 1,
            le_table=le_t,
            lo_table=lo_t,
            lo_uflow_scale=1234,
            lo_oflow_scale=-999,
            lo_uflow_shift=3,
            lo_oflow_shift=-4,
        ),
        uflow_priority=LO,
        oflow_priority=LO,
        hybrid_priority=LO,
    )
    x = jnp.asarray([start, start + 1, end - 1, end], jnp.int32)
    y, _, det = sdp_lut(x, lin, return_details=True)
    f = _sdp_fields(y, det)
    assert f["out"][0] == lo_t[0] and f["uflow"][0] == 1  # inclusive underflow, zero slope term
    assert (f["addr"][1], f["frac35"][1]) == (0, 2 ** (35 - sel))
    assert (f["addr"][2], f["frac35"][2]) == (255, (2**sel - 1) * 2 ** (35 - sel))
    assert f["out"][3] == lo_t[256] and f["oflow"][3] == 1  # END overflows, continuous
    # EXPONENT with off > 0: x == START underflows with a = -2**off (generally not T[0]).
    off, scale, shift = 6, 300, 2
    expo = SdpLutConfig(
        **_sdp_regs(
            le_function="EXPONENT",
            le_start=start,
            le_index_offset=off,
            le_uflow_scale=scale,
            le_uflow_shift=shift,
            lo_start=2**31 - 1,
            le_table=le_t,
            lo_table=lo_t,
        )
    )
    y = sdp_lut(jnp.asarray([start, start + 2**off], jnp.int32), expo)[0]
    q = (2**off * scale + 2 ** (shift - 1)) >> shift  # rshift_rhaz(-2**off * scale, shift) = -q
    assert _np(y).tolist() == [le_t[0] - q, le_t[0]]


def test_sdp_gradient_negative_select():
    """LO select -2 (golden scenario E): entries 1/4 LSB apart, slope (y1 - y0) * 4."""
    data = _load("sdp_lut_golden.json")
    (sc,) = [s for s in data["scenarios"] if s["name"] == "E_edge_negselect_saturation"]
    run = sc["runs"][0]
    cfg = SdpLutConfig(**sc["registers"], le_table=sc["le_table"], lo_table=sc["lo_table"], **run["priorities"])
    cases = [c for c in run["cases"] if c["sel"] == "LO" and c["y1"] is not None]
    assert len(cases) > 20 and sc["registers"]["lo_index_select"] == -2
    g = jax.grad(lambda v: sdp_lut(v, cfg)[0].sum())(jnp.asarray([c["x"] for c in cases], jnp.float32))
    assert np.asarray(g).tolist() == [(c["y1"] - c["y0"]) * 4.0 for c in cases]


# ------------------------------------------------- two-word helpers the LUT relies on


@given(
    vals=st.lists(st.integers(-(2**62), 2**62), min_size=8, max_size=8),
    s=st.integers(0, 63),
    m=st.integers(-(2**31), 2**31 - 1),
)
def test_wide_helpers_match_python_ints(vals, s, m):
    a = wide.from_python(vals)
    wrap = lambda v: (v + 2**63) % 2**64 - 2**63
    assert wide.to_python(wide.shift_left(a, s)).tolist() == [wrap(v << s) for v in vals]
    assert wide.to_python(wide.mul_wide_int32(a, m)).tolist() == [wrap(v * m) for v in vals]
    assert wide.to_python(wide.low_bits(a, s)).tolist() == [v % 2**s for v in vals]
    clamped = [min(max(v, -(2**40)), 2**33) for v in vals]
    assert wide.to_python(wide.clamp(a, -(2**40), 2**33)).tolist() == clamped
    c = wide.const(vals[0])
    assert wide.to_python(c) == vals[0]
    assert np.asarray(wide.lt(a, c)).tolist() == [v < vals[0] for v in vals]
    assert np.asarray(wide.le(a, c)).tolist() == [v <= vals[0] for v in vals]
    assert np.asarray(wide.eq(a, c)).tolist() == [v == vals[0] for v in vals]
    mags = wide.from_python([abs(v) for v in vals])
    assert np.asarray(wide.bit_length(mags)).tolist() == [abs(v).bit_length() for v in vals]
    u = np.asarray([abs(v) % 2**32 for v in vals], np.uint32)
    assert wide.to_python(wide.from_uint32(u)).tolist() == u.astype(np.int64).tolist()
