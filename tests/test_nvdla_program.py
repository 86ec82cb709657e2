"""Programming, presets, fitting and plotting of NVDLA INT LUTs; the nvdla benchmark."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from hwjax.core import wide
from hwjax.nvdla import (
    LE,
    LO,
    PRESETS,
    CdpLutConfig,
    SdpLutConfig,
    cdp_lut,
    fit_lut,
    linear_layout,
    lrn_lut,
    lut_error,
    plot_lut,
    program_lut,
    quantize_entries,
    reciprocal_lut,
    sdp_lut,
    slope_registers,
    sweep,
)
from tests.conftest import golden_path


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _entries_half_away(values):
    """Independent restatement of spec 4.2 step 3: round half away from zero, then sat_16."""
    return [max(-32768, min(32767, int(np.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1))) for v in values]


# ----------------------------------------------------------------------- spec examples


def test_sigmoid_worked_example_matches_golden():
    """Spec 4.6 (golden scenario D_sigmoid_Q12): registers and both tables."""
    with open(golden_path("nvdla", "sdp_lut_golden.json")) as f:
        (sc,) = [s for s in json.load(f)["scenarios"] if s["name"] == "D_sigmoid_Q12"]
    cfg = program_lut(
        sigmoid, input_scale=4096, output_scale=32767, x_range=(-8, 8), density_range=(-1, 1), hybrid_priority=LE
    )
    regs = cfg.registers()
    assert {k: regs[k] for k in sc["registers"]} == sc["registers"]
    assert (regs["uflow_priority"], regs["oflow_priority"], regs["hybrid_priority"]) == (LO, LO, LE)
    assert np.asarray(cfg.lo_table).tolist() == sc["lo_table"]
    assert np.asarray(cfg.le_table).tolist() == sc["le_table"]


def test_slope_registers():
    # Spec 4.6: sigmoid'(8) at Q12 in, 32767 out -> scale 88, shift 15.
    k = sigmoid(8) * (1 - sigmoid(8))
    assert slope_registers(k, 4096, 32767) == (88, 15)
    assert slope_registers(0.0, 4096, 32767) == (0, 0)
    assert slope_registers(-1.0, 1, 1) == (-16384, 14)  # |scale| <= 32767 (spec 4.4)
    assert slope_registers(3.0, 1, 1) == (24576, 13)  # 3 * 2**13; 3 * 2**14 > 32767
    assert slope_registers(1e12, 1, 1) == (32767, -16)  # saturates at the largest left shift
    for s in (1e-3, 0.37, -5.5, 700.0, -40000.0):
        scale, sh = slope_registers(s, 1, 1)
        assert abs(scale) <= 32767 and -16 <= sh <= 15
        assert abs(scale * 2.0**-sh - s) <= 0.5 * 2.0**-sh
        assert sh == 15 or abs(round(s * 2.0 ** (sh + 1))) > 32767  # largest usable shift


def test_linear_layout_widens_to_power_of_two():
    assert linear_layout((0, 1000), 1.0, 257) == (0, 2, 1024)  # step 1000/256 -> 4
    assert linear_layout((-1, 1), 4096.0, 65) == (-4096, 7, 4096)
    assert linear_layout((0, 10), 1.0, 257) == (0, 0, 256)  # never a negative select
    with pytest.raises(ValueError, match="outside the 32-bit register range"):
        linear_layout((0, 2.0**31), 1.0, 257)
    start, sel, end = linear_layout((0, 2.0**35), 1.0, 257, bits=38, select_range=(-24, 30))
    assert (start, sel, end) == (0, 27, 256 * 2**27)


def test_program_lut_rejects_bad_arguments():
    with pytest.raises(ValueError, match="le_mode"):
        program_lut(np.tanh, input_scale=1, x_range=(0, 1), le_mode="log")
    with pytest.raises(ValueError, match="unit"):
        program_lut(np.tanh, input_scale=1, x_range=(0, 1), unit="pdp")
    with pytest.raises(ValueError, match="input_scale"):
        program_lut(np.tanh, input_scale=0, x_range=(0, 1))


# ---------------------------------------------------------------------------- presets

BOUNDS_LSB = {"sigmoid": 3.0, "tanh": 4.0, "exp": 3.0, "reciprocal": 130.0, "lrn": 120.0}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_accurate_and_consistent(name):
    cfg, report = PRESETS[name](return_report=True)
    assert isinstance(cfg, CdpLutConfig if name == "lrn" else SdpLutConfig)
    assert report.max_abs_lsb <= BOUNDS_LSB[name]
    assert report.mean_abs_lsb <= report.max_abs_lsb
    # ENDs consistent with START/SELECT for LINEAR tables (spec 4.2): continuous ends.
    for t, depth in (("le", 65), ("lo", 257)):
        if t == "le" and cfg.le_function == "EXPONENT":
            continue
        start, sel = getattr(cfg, f"{t}_start"), getattr(cfg, f"{t}_index_select")
        assert getattr(cfg, f"{t}_end") == start + (depth - 1) * 2**sel
    raw = "lo" if cfg.le_function == "LINEAR" else "le"
    assert cfg.uflow_priority == cfg.oflow_priority == (LO if raw == "lo" else LE)


def test_preset_error_report_is_independent_of_helpers():
    """The report equals an error computed here directly from sdp_lut and the real function."""
    cfg, report = PRESETS["sigmoid"](return_report=True)
    x = np.arange(-32768, 32769)
    y = np.asarray(sdp_lut(jnp.asarray(x, jnp.int32), cfg)[0]).astype(np.float64)
    err = np.abs(y - 32767 * sigmoid(x / 4096))
    assert report.num_points == x.size
    assert report.max_abs_lsb == pytest.approx(err.max(), rel=1e-12)
    assert report.mean_abs_lsb == pytest.approx(err.mean(), rel=1e-12)
    assert report.max_abs == pytest.approx(err.max() / 32767, rel=1e-12)
    # Continuity at the raw table's ends (spec 2.6): x == START reads T[0], x == END T[last].
    y_ends = np.asarray(sdp_lut(jnp.asarray([cfg.lo_start, cfg.lo_end], jnp.int32), cfg)[0])
    assert y_ends.tolist() == [int(cfg.lo_table[0]), int(cfg.lo_table[256])]


def test_exponent_table_entries():
    cfg = reciprocal_lut()
    assert cfg.le_function == "EXPONENT" and cfg.le_start == 256 and cfg.le_index_offset == 0
    xs = [(256 + 2.0**i) / 256 for i in range(65)]
    assert np.asarray(cfg.le_table).tolist() == _entries_half_away([32767 / x for x in xs])
    x = np.arange(257, 256 * 256)
    y = np.asarray(sdp_lut(jnp.asarray(x, jnp.int32), cfg)[0])
    # 1/x is decreasing: so is any interpolation between decreasing entries.
    assert np.all(np.diff(y) <= 0)


def test_lrn_preset_on_cdp_with_38_bit_inputs():
    cfg, report = lrn_lut(return_report=True)
    assert cfg.le_start == 0 and cfg.le_function == "EXPONENT"
    s = np.array([0, 1, 2, 1000, 2**20 + 3, 2**32, 9 * 2**32 - 1], dtype=np.int64)
    y = np.asarray(cdp_lut(wide.from_python(s.tolist()), cfg)[0])
    f = (2.0 + 1e-4 / 5 * s) ** -0.75
    scale = 32767 / 2.0**-0.75
    assert np.all(np.abs(y - scale * f) <= BOUNDS_LSB["lrn"])
    assert report.num_points > 30000


def test_quantize_entries():
    v = np.array([0.5, -0.5, 1.49, -2.5, 40000.0, -40000.0, np.nan, np.inf, -np.inf])
    assert quantize_entries(v).tolist() == [1, -1, 1, -3, 32767, -32768, 0, 32767, -32768]


def test_sweep():
    assert sweep((-1, 1), 4.0).tolist() == list(range(-4, 5))
    x = sweep((0, 2.0**30), 1.0, 1001)
    assert x[0] == 0 and x[-1] == 2**30 and np.all(np.diff(x) > 0) and x.size == 1001
    g = sweep((0, 2.0**30), 1.0, 1001, geometric=True)
    assert g[0] == 0 and g[-1] == 2**30
    assert np.sum(x < 2**20) <= 2 and np.sum(g < 2**20) > 200  # geometric: dense near the start


# ---------------------------------------------------------------------------- fit_lut


def test_fit_lut_improves_on_sampling():
    cfg = PRESETS["tanh"]()
    fitted, report = fit_lut(
        np.tanh, cfg, input_scale=4096, output_scale=32767, x_range=(-4, 4), steps=60, num_points=4096
    )
    assert fitted.registers() == cfg.registers()
    assert np.asarray(fitted.lo_table).dtype == np.int16
    before = lut_error(cfg, np.tanh, input_scale=4096, output_scale=32767, x_range=(-4, 4))
    after = lut_error(fitted, np.tanh, input_scale=4096, output_scale=32767, x_range=(-4, 4))
    assert report.before == before and report.after == after
    assert after.mean_abs < 0.9 * before.mean_abs
    assert report.improvement == pytest.approx(1 - after.mean_abs / before.mean_abs)


def test_fit_lut_is_one_program_shared_by_default_fits():
    """fit_lut compiles one program (optimisation, rounding and both sweeps); later default
    fits with the same shapes reuse it, whatever the number of steps and the learning
    rate; a given optimiser gives the same kind of result."""
    import optax

    from hwjax.nvdla._program import _fit

    cfg = PRESETS["tanh"]()
    kw = dict(input_scale=4096, output_scale=32767, x_range=(-4, 4), steps=3, num_points=512)
    fit_lut(np.tanh, cfg, **kw)
    n = _fit._cache_size()
    fitted, report = fit_lut(np.tanh, cfg, learning_rate=0.25, **{**kw, "steps": 5})
    assert _fit._cache_size() == n
    assert report.before == lut_error(cfg, np.tanh, **{k: kw[k] for k in ("input_scale", "output_scale", "x_range")})
    fitted, report = fit_lut(np.tanh, cfg, optimizer=optax.sgd(0.1), **kw)
    assert fitted.registers() == cfg.registers() and report.steps == 3


def test_host_functions_work_inside_a_jit_trace():
    """Programming, error reports and fits compute on the host: called while a program is
    traced (a LUT built inside a jitted model function) they give the values of an eager
    call, as NumPy, not tracers."""
    import jax

    cfg = PRESETS["sigmoid"]()
    kw = dict(input_scale=4096, output_scale=32767, x_range=(-8, 8))
    err = lut_error(cfg, sigmoid, **kw)
    fitted, report = fit_lut(sigmoid, cfg, steps=3, num_points=512, **kw)
    seen = {}

    def traced(x):
        seen["cfg"] = PRESETS["sigmoid"]()
        seen["program"] = program_lut(sigmoid, le_mode="exponent", **kw)
        seen["err"] = lut_error(cfg, sigmoid, **kw)
        seen["fit"] = fit_lut(sigmoid, cfg, steps=3, num_points=512, **kw)
        return sdp_lut(x, seen["cfg"])[0]

    x = jnp.arange(-40000, 40000, 997, dtype=jnp.int32)
    assert np.array_equal(np.asarray(jax.jit(traced)(x)), np.asarray(sdp_lut(x, cfg)[0]))
    assert seen["cfg"] == cfg and seen["err"] == err
    assert seen["program"] == program_lut(sigmoid, le_mode="exponent", **kw)
    assert seen["fit"][0] == fitted and seen["fit"][1] == report


def test_fit_lut_rejects_cdp():
    with pytest.raises(TypeError):
        fit_lut(np.tanh, lrn_lut(), input_scale=1, output_scale=1, x_range=(0, 1))


# ------------------------------------------------------------------------ plot, bench


def test_plot_lut_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sigmoid.png"
    plot_lut(
        PRESETS["sigmoid"](), sigmoid, path, input_scale=4096, output_scale=32767, x_range=(-10, 10), num_points=1025
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # Defaults: integer LSB domain, range spanning both tables.
    lsb = tmp_path / "lsb.png"
    plot_lut(PRESETS["sigmoid"](), lambda x: 32767 * sigmoid(x / 4096), lsb)
    assert lsb.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_runs(capsys):
    from hwjax.bench._nvdla import main

    assert main(["--n", "20000", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "sdp_lut" in out and "jnp.interp" in out and "ratio" in out
