"""Programming NVDLA INT LUTs from real functions (spec section 4), fitting and plotting.

Fixed-point contract (spec 4.1): the LUT input integer ``X = round(x * input_scale)``
represents the real ``x``; the output integer ``Y`` represents ``f(x) = Y /
output_scale``. Tables follow the spec's recipes: a LINEAR table over ``[x_min, x_max]``
has ``START = round(x_min * input_scale)``, a power-of-two step ``2**sel`` (the range is
widened upwards until the step is a power of two) and ``END = START + last * 2**sel``;
an EXPONENT LE table has entry ``i`` at ``X = START + 2**(i + off)``; entries are
``sat_16(round_half_away(output_scale * f(x_i)))``; extrapolation slopes follow 4.4.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import evaluated_if_concrete, wide
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nvdla._lut import (
    LE,
    LE_DEPTH,
    LO,
    LO_DEPTH,
    CdpLutConfig,
    SdpLutConfig,
    cdp_lut,
    sdp_lut,
)

Fn = Callable[[np.ndarray], Any]


def _real(v: Any, name: str, *, positive: bool = False) -> float:
    """A finite real scalar argument (a Python or NumPy number, not a bool); ``positive``: > 0."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ArgTypeError(f"{name} must be a real number, got {v!r}")
    f = float(v)
    if not math.isfinite(f) or (positive and not f > 0):
        raise RangeError(f"{name} must be finite{' and > 0' if positive else ''}, got {v!r}")
    return f


def _range(x_range: Any, name: str = "x_range") -> tuple[float, float]:
    """A ``(lo, hi)`` pair of finite reals."""
    if isinstance(x_range, (str, bytes)) or not isinstance(x_range, (tuple, list, np.ndarray)):
        raise ArgTypeError(f"{name} must be a pair (lo, hi) of real numbers, got {x_range!r}")
    if len(x_range) != 2:
        raise ShapeError(f"{name} must be a pair (lo, hi) of real numbers, got {x_range!r}")
    a, b = (_real(v, name) for v in x_range)
    return a, b


def _fn(fn: Any, name: str = "fn") -> Any:
    if not callable(fn):
        raise ArgTypeError(f"{name} must be a callable (a NumPy-callable real function), got {fn!r}")
    return fn


def _cfg(cfg: Any, name: str = "cfg") -> Any:
    if not isinstance(cfg, (SdpLutConfig, CdpLutConfig)):
        raise ArgTypeError(f"{name} must be an SdpLutConfig or CdpLutConfig, got {type(cfg).__name__}")
    return cfg


_UNITS = {"sdp": (SdpLutConfig, 32, (-128, 32)), "cdp": (CdpLutConfig, 38, (-24, 30))}


@dataclasses.dataclass(frozen=True)
class LutReport:
    """Absolute error of a LUT against ``f`` over a dense sweep of integer inputs.

    ``max_abs`` / ``mean_abs`` are in real output units (``|Y / output_scale - f(x)|``);
    ``*_lsb`` are the same in output LSBs (``|Y - output_scale * f(x)|``).
    """

    max_abs: float
    mean_abs: float
    max_abs_lsb: float
    mean_abs_lsb: float
    num_points: int


@dataclasses.dataclass(frozen=True)
class FitReport:
    """Errors of plain sampling (``before``) and of the fitted tables (``after``)."""

    before: LutReport
    after: LutReport
    steps: int

    @property
    def improvement(self) -> float:
        """Relative reduction of the mean absolute error (0.25 = 25 % lower)."""
        return 1.0 - self.after.mean_abs / self.before.mean_abs if self.before.mean_abs else 0.0


# ---------------------------------------------------------------------------- helpers


def _on_host(fn):
    """For the functions that compute on the host and return NumPy values (tables, reports):
    their JAX work on concrete values runs at once, also when they are called inside a
    ``jit`` trace (:func:`hwjax.core.evaluated_if_concrete`)."""

    @functools.wraps(fn)
    def host(*args, **kwargs):
        with evaluated_if_concrete((args, kwargs)):
            return fn(*args, **kwargs)

    return host


def _round_half_away(v, xp=np):
    return xp.sign(v) * xp.floor(xp.abs(v) + 0.5)


def _eval(fn: Fn, x: np.ndarray) -> np.ndarray:
    """``fn`` at float64 points, as float64 (non-finite values kept for saturation)."""
    with np.errstate(all="ignore"):
        return np.asarray(fn(np.asarray(x, np.float64)), dtype=np.float64).reshape(np.shape(x))


def quantize_entries(values: np.ndarray) -> np.ndarray:
    """``sat_16(round_half_away(values))`` as int16 (NaN becomes 0, +-inf saturates)."""
    try:
        a = np.asarray(values)
    except (ValueError, TypeError):
        a = None
    if a is None or a.dtype.kind not in "iuf":
        raise ArgTypeError(f"values must be a real array (or a list of numbers), got {values!r}")
    return _round_sat16(a.astype(np.float64), np)


def _round_sat16(v, xp):
    """``sat_16(round_half_away(v))`` as int16 with NaN -> 0 (``xp``: ``np`` on the host,
    ``jnp`` in a program; in float32, ``|v| + 0.5`` is exact below 2**23, and larger values
    saturate either way)."""
    v = xp.where(xp.isnan(v), 0.0, v)
    return xp.clip(_round_half_away(v, xp), -(2**15), 2**15 - 1).astype(xp.int16)


def slope_registers(slope: float, input_scale: float, output_scale: float) -> tuple[int, int]:
    """``(scale, shift)`` for a real slope ``dy/dx`` (spec 4.4).

    ``s = output_scale * slope / input_scale`` output LSBs per input LSB; the largest
    ``shift`` in -16..15 with ``|round(s * 2**shift)| <= 32767`` (saturating at
    shift -16); ``s = 0`` gives ``(0, 0)``.
    """
    slope = _real(slope, "slope")
    input_scale = _real(input_scale, "input_scale", positive=True)
    output_scale = _real(output_scale, "output_scale", positive=True)
    s = output_scale * float(slope) / input_scale
    if not math.isfinite(s):
        raise RangeError(f"slope {slope} is not finite")
    for sh in range(15, -17, -1):
        scale = float(_round_half_away(np.float64(s * 2.0**sh)))
        if abs(scale) <= 2**15 - 1:
            return (int(scale), sh if scale else 0)
    return (int(math.copysign(2**15 - 1, s)), -16)


def _int_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def linear_layout(
    x_range: tuple[float, float],
    input_scale: float,
    depth: int,
    bits: int = 32,
    select_range: tuple[int, int] = (0, 32),
) -> tuple[int, int, int]:
    """``(START, sel, END)`` of a LINEAR table covering ``x_range`` (spec 4.2).

    ``START = round(x_min * input_scale)``; ``sel`` the smallest select (never below 0
    or ``select_range``) with ``START + (depth - 1) * 2**sel >= x_max * input_scale``;
    ``END = START + (depth - 1) * 2**sel``.
    """
    lo, hi = sorted(_range(x_range))
    input_scale = _real(input_scale, "input_scale", positive=True)
    depth = V.check_static_int(depth, 2, 1 << 16, "depth")
    bits = V.check_static_int(bits, 2, 64, "bits")
    if isinstance(select_range, (str, bytes)) or not isinstance(select_range, (tuple, list)) or len(select_range) != 2:
        raise ArgTypeError(f"select_range must be a pair of ints, got {select_range!r}")
    select_range = tuple(V.check_static_int(v, -256, 256, "select_range") for v in select_range)
    start = int(_round_half_away(np.float64(lo * input_scale)))
    width = hi * input_scale - start
    sel = max(select_range[0], 0)
    while (depth - 1) * 2**sel < width and sel < select_range[1]:
        sel += 1
    end = start + (depth - 1) * 2**sel
    rmin, rmax = _int_range(bits)
    if not (rmin <= start <= rmax and rmin <= end <= rmax):
        raise RangeError(
            f"table over {x_range} at input_scale {input_scale} needs START={start}, "
            f"END={end} outside the {bits}-bit register range"
        )
    return start, sel, end


def _linear_entries(fn: Fn, start: int, sel: int, depth: int, input_scale: float, output_scale: float) -> np.ndarray:
    x = (start + np.arange(depth, dtype=np.float64) * 2.0**sel) / input_scale
    return quantize_entries(output_scale * _eval(fn, x))


def _exponent_entries(fn: Fn, start: int, off: int, input_scale: float, output_scale: float) -> np.ndarray:
    x = (start + 2.0 ** (np.arange(LE_DEPTH, dtype=np.float64) + off)) / input_scale
    return quantize_entries(output_scale * _eval(fn, x))


def _derivative(fn: Fn, x: float, h: float) -> float:
    """One-sided difference ``(f(x + h) - f(x)) / h`` (``h < 0`` looks left); 0 if not finite."""
    y = _eval(fn, np.array([x, x + h]))
    d = (y[1] - y[0]) / h
    return float(d) if math.isfinite(d) else 0.0


def sweep(
    x_range: tuple[float, float], input_scale: float, num_points: int = 65537, geometric: bool = False
) -> np.ndarray:
    """Sorted distinct integer inputs over ``x_range`` (int64): every integer if there are
    at most ``num_points``, else ``num_points`` evenly spaced ones; with ``geometric``
    half of them are instead spaced geometrically in the offset from ``x_min`` (for
    EXPONENT tables, whose segments grow by octaves)."""
    lo, hi = sorted(_range(x_range))
    input_scale = _real(input_scale, "input_scale", positive=True)
    num_points = V.check_static_int(num_points, 1, 2**31 - 1, "num_points")
    geometric = V.check_flag(geometric, "geometric")
    a = int(_round_half_away(np.float64(lo * input_scale)))
    b = int(_round_half_away(np.float64(hi * input_scale)))
    if b - a + 1 <= num_points:
        return np.arange(a, b + 1, dtype=np.int64)
    if not geometric:
        return np.unique(np.round(np.linspace(a, b, num_points)).astype(np.int64))
    half = num_points // 2
    lin = np.round(np.linspace(a, b, num_points - half))
    geo = a + np.round(np.geomspace(1, b - a, half))
    return np.unique(np.concatenate([lin, geo, [a]]).astype(np.int64))


def _as_lut_input(x: np.ndarray, cfg) -> Any:
    """int32 array for the SDP; int32 or two-word array for the CDP's 38-bit inputs."""
    if isinstance(cfg, SdpLutConfig) or (x.min() >= -(2**31) and x.max() < 2**31):
        return jax.device_put(x.astype(np.int32))  # host data: transferred, no copy program compiled
    return wide.Wide(jax.device_put((x >> 32).astype(np.int32)), jax.device_put((x & 0xFFFFFFFF).astype(np.uint32)))


@_on_host
def evaluate(cfg, x: np.ndarray) -> np.ndarray:
    """Exact LUT outputs (int64 NumPy) for integer inputs ``x`` (SDP or CDP config)."""
    lut = sdp_lut if isinstance(cfg, SdpLutConfig) else cdp_lut
    y = lut(_as_lut_input(np.asarray(x, np.int64), cfg), cfg)[0]  # kernel is jitted per shape
    return np.asarray(y).astype(np.int64)


def _report(y: np.ndarray, target: np.ndarray, output_scale: float) -> LutReport:
    err = np.abs(y - target)
    return LutReport(
        max_abs=float(err.max() / output_scale),
        mean_abs=float(err.mean() / output_scale),
        max_abs_lsb=float(err.max()),
        mean_abs_lsb=float(err.mean()),
        num_points=int(y.size),
    )


@_on_host
def lut_error(
    cfg,
    fn: Fn,
    *,
    input_scale: float,
    output_scale: float,
    x_range: tuple[float, float],
    num_points: int = 65537,
    geometric: bool = False,
) -> LutReport:
    """Max and mean absolute error of the exact LUT against ``fn`` over :func:`sweep`."""
    _cfg(cfg)
    _fn(fn)
    input_scale = _real(input_scale, "input_scale", positive=True)
    output_scale = _real(output_scale, "output_scale", positive=True)
    x, target = _sweep_target(fn, x_range, input_scale, output_scale, num_points, geometric)
    return _report(evaluate(cfg, x).astype(np.float64), target, output_scale)


def _sweep_target(
    fn: Fn, x_range, input_scale: float, output_scale: float, num_points: int = 65537, geometric: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sweep`'s integer inputs and ``fn``'s float64 values there in output LSBs
    (what :func:`lut_error` compares the LUT with)."""
    x = sweep(x_range, input_scale, num_points, geometric)
    return x, output_scale * _eval(fn, x / input_scale)


# ----------------------------------------------------------------------- program_lut


def _worst_point(cfg, *, fn, input_scale, output_scale, x_range, geometric) -> float:
    """Real input where ``cfg`` errs most (where the density table should go)."""
    x = sweep(x_range, input_scale, 8193, geometric)
    err = np.abs(evaluate(cfg, x) - output_scale * _eval(fn, x / input_scale))
    return float(x[int(np.argmax(np.nan_to_num(err, nan=0.0, posinf=0.0)))] / input_scale)


def _density_candidates(le_mode, lo_x, hi_x, worst, input_scale) -> list[tuple[float, float]]:
    """LINEAR mode: a window of 1/8 of the range centred on the raw table's worst point.
    EXPONENT mode: windows from ``x_min`` of 256 * 2**j input LSBs, j = 0, 1, ...
    (the best one is chosen by error)."""
    if le_mode == "linear":
        w = (hi_x - lo_x) / 8
        a = min(max(worst - w / 2, lo_x), hi_x - w)
        return [(a, a + w)]
    width = (hi_x - lo_x) * input_scale
    return [(lo_x, lo_x + 256.0 * 2**j / input_scale) for j in range(0, 64) if 256 * 2 ** (j - 1) < width]


def _raw_table(fn, le_mode, lo_x, hi_x, input_scale, output_scale, bits, sel_range, off):
    """Registers and entries of the raw table; returns (regs, entries, real END abscissa)."""
    if le_mode == "linear":
        start, sel, end = linear_layout((lo_x, hi_x), input_scale, LO_DEPTH, bits, sel_range)
        regs = dict(le_function="LINEAR", lo_start=start, lo_index_select=sel, lo_end=end, le_index_offset=0)
        return regs, _linear_entries(fn, start, sel, LO_DEPTH, input_scale, output_scale), end / input_scale
    start = int(_round_half_away(np.float64(lo_x * input_scale)))
    rmin, rmax = _int_range(bits)
    end = min(max(start + 2 ** (LE_DEPTH - 1 + off), rmin), rmax)  # clamped if unreachable
    regs = dict(le_function="EXPONENT", le_start=start, le_index_offset=off, le_end=end, le_index_select=0)
    return regs, _exponent_entries(fn, start, off, input_scale, output_scale), hi_x


@_on_host
def program_lut(
    fn: Fn,
    *,
    input_scale: float,
    output_scale: float | None = None,
    x_range: tuple[float, float],
    le_mode: Literal["linear", "exponent"] = "linear",
    density_range: tuple[float, float] | None = None,
    le_index_offset: int = 0,
    uflow_slope: float | Literal["auto"] = "auto",
    oflow_slope: float | Literal["auto"] = "auto",
    hybrid_priority: int | Literal["auto"] = "auto",
    unit: Literal["sdp", "cdp"] = "sdp",
    precision: str = "INT16",
    num_points: int = 65537,
    return_report: bool = False,
):
    """Programs both LUT tables for the real function ``fn`` (spec 4.2-4.5).

    * ``le_mode="linear"``: LO is the raw table, LINEAR over ``x_range``; LE is a LINEAR
      density table over ``density_range`` (default: 1/8 of the range, so half the raw
      step, centred where the raw table alone errs most).
    * ``le_mode="exponent"``: LE is the raw table, EXPONENT from ``START = round(x_min *
      input_scale)`` with entry ``i`` at ``START + 2**(i + off)`` (``off`` =
      ``le_index_offset``; 0 covers every octave from one LSB on); LO is a LINEAR
      density table over ``density_range`` (default: the best, by maximum error, of the
      windows ``[x_min, x_min + 256 * 2**j LSBs)``).

    Priorities: UFLOW/OFLOW use the raw table; HYBRID uses the density table, or with
    ``hybrid_priority="auto"`` whichever table gives the smaller maximum error. The raw
    table's extrapolation slopes come from ``uflow_slope`` / ``oflow_slope`` (real
    ``dy/dx``; ``"auto"``: a one-LSB difference of ``fn`` inside the table's ends),
    encoded by :func:`slope_registers`; the density table's slopes are 0 (spec 4.6).
    LINEAR ENDs are ``START + last * 2**sel``, so the curve is continuous at the ends.

    Args:
      fn: NumPy-callable real function.
      input_scale: input LSBs per real unit (``X = round(x * input_scale)``).
      output_scale: output LSBs per real unit; default ``32767 / max|fn|`` over the range.
      x_range: ``(x_min, x_max)`` real range of the raw table.
      unit: ``"sdp"`` (returns :class:`SdpLutConfig`) or ``"cdp"`` (38-bit START/END,
        selects -24..30; returns :class:`CdpLutConfig` with ``precision``).
      num_points: size of the dense error sweep of the report (geometrically densified
        near ``x_min`` in EXPONENT mode, see :func:`sweep`).
      return_report: also return the :class:`LutReport` of the result.

    Returns:
      The configuration, or ``(cfg, report)``.
    """
    _fn(fn)
    V.check_choice(le_mode, ("linear", "exponent"), "le_mode")
    V.check_choice(unit, tuple(_UNITS), "unit")
    input_scale = _real(input_scale, "input_scale", positive=True)
    if output_scale is not None:
        output_scale = _real(output_scale, "output_scale", positive=True)
    if density_range is not None:
        density_range = _range(density_range, "density_range")
    le_index_offset = V.check_static_int(le_index_offset, -128, 127, "le_index_offset")
    for name, slope in (("uflow_slope", uflow_slope), ("oflow_slope", oflow_slope)):
        if not (isinstance(slope, str) and slope == "auto"):
            _real(slope, name)
    if not (isinstance(hybrid_priority, str) and hybrid_priority == "auto"):
        V.check_static_int(hybrid_priority, 0, 1, "hybrid_priority")
    V.check_choice(precision, ("INT16", "INT8"), "precision")
    V.check_static_int(num_points, 1, 2**31 - 1, "num_points")
    V.check_flag(return_report, "return_report")
    cls, bits, sel_range = _UNITS[unit]
    lo_x, hi_x = sorted(_range(x_range))
    if output_scale is None:
        peak = np.nanmax(np.abs(_eval(fn, np.linspace(lo_x, hi_x, 4097))))
        output_scale = (2**15 - 1) / peak if peak > 0 else 1.0
    extra = {"precision": precision} if unit == "cdp" else {}
    raw_t, dens_t = ("lo", "le") if le_mode == "linear" else ("le", "lo")
    raw_id, dens_depth = (LO, LE_DEPTH) if raw_t == "lo" else (LE, LO_DEPTH)
    regs, raw_entries, raw_end_x = _raw_table(
        fn, le_mode, lo_x, hi_x, input_scale, output_scale, bits, sel_range, int(le_index_offset)
    )
    h = 1.0 / input_scale
    slopes = {
        "uflow": _derivative(fn, lo_x, h) if uflow_slope == "auto" else float(uflow_slope),
        "oflow": _derivative(fn, raw_end_x, -h) if oflow_slope == "auto" else float(oflow_slope),
    }
    for kind in ("uflow", "oflow"):
        regs[f"{raw_t}_{kind}_scale"], regs[f"{raw_t}_{kind}_shift"] = slope_registers(
            slopes[kind], input_scale, output_scale
        )
        regs[f"{dens_t}_{kind}_scale"] = regs[f"{dens_t}_{kind}_shift"] = 0
    regs.update(uflow_priority=raw_id, oflow_priority=raw_id, **extra)

    def build(d_range, hp):
        d_start, d_sel, d_end = linear_layout(d_range, input_scale, dens_depth, bits, sel_range)
        return cls(
            **regs,
            **{
                f"{dens_t}_start": d_start,
                f"{dens_t}_index_select": d_sel,
                f"{dens_t}_end": d_end,
                f"{raw_t}_table": raw_entries,
                f"{dens_t}_table": _linear_entries(fn, d_start, d_sel, dens_depth, input_scale, output_scale),
            },
            hybrid_priority=hp,
        )

    kw = dict(
        fn=fn, input_scale=input_scale, output_scale=output_scale, x_range=(lo_x, hi_x), geometric=le_mode == "exponent"
    )
    if density_range is None:
        # Raw table alone: a density table parked at the largest START always underflows.
        rmax = _int_range(bits)[1]
        raw_only = cls(
            **{
                **regs,
                f"{dens_t}_start": rmax,
                f"{dens_t}_end": rmax,
                f"{dens_t}_index_select": 0,
                f"{raw_t}_table": raw_entries,
                f"{dens_t}_table": np.zeros(dens_depth, np.int16),
            },
            hybrid_priority=raw_id,
        )
        worst = _worst_point(raw_only, **kw)
        ranges = _density_candidates(le_mode, lo_x, hi_x, worst, input_scale)
    else:
        ranges = [density_range]
    hps = (1 - raw_id, raw_id) if hybrid_priority == "auto" else (int(hybrid_priority),)
    cands = [build(r, hp) for r in ranges for hp in hps]
    if len(cands) > 1:
        errs = [lut_error(c, **kw, num_points=8193) for c in cands]
        cfg = cands[min(range(len(cands)), key=lambda i: (errs[i].max_abs, errs[i].mean_abs))]
    else:
        cfg = cands[0]
    return (cfg, lut_error(cfg, **kw, num_points=num_points)) if return_report else cfg


# ---------------------------------------------------------------------------- presets


def _preset(fn: Fn, x_range, input_frac_bits: int, **kw):
    input_frac_bits = V.check_static_int(input_frac_bits, -64, 64, "input_frac_bits")
    return program_lut(fn, input_scale=2.0**input_frac_bits, x_range=x_range, **kw)


def sigmoid_lut(*, input_frac_bits: int = 12, x_range=(-8.0, 8.0), output_scale: float = 32767.0, **kw):
    """Sigmoid on a Q``input_frac_bits`` input, ``Y = output_scale * sigmoid(x)`` (spec 4.6 layout)."""
    return _preset(lambda x: 1.0 / (1.0 + np.exp(-x)), x_range, input_frac_bits, output_scale=output_scale, **kw)


def tanh_lut(*, input_frac_bits: int = 12, x_range=(-4.0, 4.0), output_scale: float = 32767.0, **kw):
    """tanh on a Q``input_frac_bits`` input, ``Y = output_scale * tanh(x)``."""
    return _preset(np.tanh, x_range, input_frac_bits, output_scale=output_scale, **kw)


def exp_lut(*, input_frac_bits: int = 12, x_range=(-8.0, 0.0), output_scale: float = 32767.0, **kw):
    """exp on non-positive inputs (softmax numerators), ``Y = output_scale * exp(x)``."""
    return _preset(np.exp, x_range, input_frac_bits, output_scale=output_scale, **kw)


def reciprocal_lut(*, input_frac_bits: int = 8, x_range=(1.0, 256.0), output_scale: float = 32767.0, **kw):
    """``1 / x`` over a wide positive range with an EXPONENT raw table."""
    kw.setdefault("le_mode", "exponent")
    kw.setdefault("oflow_slope", 0.0)
    return _preset(lambda x: 1.0 / x, x_range, input_frac_bits, output_scale=output_scale, **kw)


def lrn_lut(
    *,
    k: float = 2.0,
    alpha: float = 1e-4,
    beta: float = 0.75,
    n: int = 5,
    input_frac_bits: int = 0,
    x_range=(0.0, 2.0**32),
    output_scale: float | None = None,
    unit: Literal["sdp", "cdp"] = "cdp",
    **kw,
):
    """LRN scale ``(k + alpha / n * s) ** -beta`` of a sum of squares ``s`` (spec 4.5, 4.7).

    EXPONENT raw LE table from ``s = 0`` (as NVDLA's compiler does), LINEAR density LO
    table for small sums; CDP configuration by default.
    """
    k, alpha, beta = _real(k, "k"), _real(alpha, "alpha"), _real(beta, "beta")
    n = V.check_static_int(n, 1, 1 << 16, "n")
    kw.setdefault("le_mode", "exponent")
    kw.setdefault("oflow_slope", 0.0)
    return _preset(
        lambda s: (k + alpha / n * s) ** -beta, x_range, input_frac_bits, output_scale=output_scale, unit=unit, **kw
    )


PRESETS: dict[str, Callable[..., Any]] = {
    "sigmoid": sigmoid_lut,
    "tanh": tanh_lut,
    "exp": exp_lut,
    "reciprocal": reciprocal_lut,
    "lrn": lrn_lut,
}


# ---------------------------------------------------------------------------- fit_lut


def _frac_weight(frac35: wide.Wide) -> jax.Array:
    return (frac35.hi.astype(jnp.float32) * 2.0**32 + frac35.lo.astype(jnp.float32)) * 2.0**-35


def _surrogate(params: dict, cfg: SdpLutConfig, x: jax.Array):
    """Exact LUT output with a gradient w.r.t. the (float) entries.

    Forward: the exact SDP LUT on the entries rounded to int16. Backward: the output is
    treated as ``(1 - w) * T[a] + w * T[a+1]`` (``w = frac35 / 2**35``) on a hit and
    ``T[a] + const`` on an extrapolation.
    """
    ints = {t: jnp.clip(jnp.round(p), -(2**15), 2**15 - 1).astype(jnp.int16) for t, p in params.items()}
    y, _, det = sdp_lut(x, cfg.replace(le_table=ints["le"], lo_table=ints["lo"]), return_details=True)
    table = jnp.concatenate([params["le"], params["lo"]])
    base = det["sel"] * LE_DEPTH + det["addr"]
    w = _frac_weight(det["frac35"])
    hit = ~(det["uflow"] | det["oflow"])
    sur = (1 - w) * table[base] + jnp.where(hit, w * table[jnp.where(hit, base + 1, base)], 0.0)
    y = y.astype(jnp.float32)
    return sur + jax.lax.stop_gradient(y - sur)


@_on_host
def fit_lut(
    fn: Fn,
    cfg: SdpLutConfig,
    *,
    input_scale: float,
    output_scale: float,
    x_range: tuple[float, float],
    steps: int = 300,
    learning_rate: float = 0.5,
    num_points: int = 8192,
    optimizer=None,
) -> tuple[SdpLutConfig, FitReport]:
    """Optimises the int16 entries of an SDP configuration for ``fn`` with optax.

    The entries are float parameters; the forward pass is the exact LUT on the entries
    rounded to int16 and the backward pass the interpolation weights (see
    ``_surrogate``). The loss is the mean squared error in output LSBs over
    ``num_points`` inputs of ``x_range``. Registers are kept; the best rounded tables
    seen (by mean absolute error on the training inputs, plain sampling included) are
    returned with a :class:`FitReport` measured on the dense sweep of :func:`lut_error`.

    ``fn`` is evaluated on the host (float64); the optimisation (``steps`` optax steps in
    a ``lax.fori_loop``), the rounding of the best entries (:func:`quantize_entries`) and
    both error sweeps then run as one compiled program, shared by later calls with the
    same ``num_points`` and sweep size when ``optimizer`` is None.
    """
    _fn(fn)
    if not isinstance(cfg, SdpLutConfig):
        raise ArgTypeError(f"cfg: fit_lut optimises SdpLutConfig tables, got {type(cfg).__name__}")
    input_scale = _real(input_scale, "input_scale", positive=True)
    output_scale = _real(output_scale, "output_scale", positive=True)
    steps = V.check_static_int(steps, 0, 2**31 - 1, "steps")
    learning_rate = _real(learning_rate, "learning_rate", positive=True)
    x_np, target = _sweep_target(fn, x_range, input_scale, output_scale, num_points)
    target = target.astype(np.float32)
    x_err, target_err = _sweep_target(fn, x_range, input_scale, output_scale)  # lut_error's sweep
    params = {t: np.asarray(getattr(cfg, f"{t}_table"), np.float32) for t in ("le", "lo")}
    data = (jax.device_put(a) for a in (x_np.astype(np.int32), target, x_err.astype(np.int32)))
    tables, y_before, y_after = _fit(params, cfg, *data, np.float32(learning_rate), np.int32(steps), opt=optimizer)
    fitted = cfg.replace(le_table=np.asarray(tables["le"]), lo_table=np.asarray(tables["lo"]))
    report = [_report(np.asarray(y).astype(np.float64), target_err, output_scale) for y in (y_before, y_after)]
    return fitted, FitReport(before=report[0], after=report[1], steps=steps)


@functools.partial(jax.jit, static_argnames=("opt",))
def _fit(params, cfg, x, target, x_err, learning_rate, steps, *, opt):
    """The body of :func:`fit_lut`, one program: ``steps`` optimiser steps (``opt``, or
    ``optax.adam(learning_rate)`` when None; ``steps`` is traced, so that default fits
    of any length and learning rate share the program), the best entries rounded, and
    the LUT outputs on ``x_err`` for the given and the fitted tables. Returns
    ``(int16 tables, y_before, y_after)``."""
    import optax

    tx = optax.adam(learning_rate) if opt is None else opt

    def loss(p):
        err = _surrogate(p, cfg, x) - target
        return jnp.mean(err**2), jnp.mean(jnp.abs(jax.lax.stop_gradient(err)))

    def step(_, carry):
        p, s, best, best_mae = carry
        (_, mae), g = jax.value_and_grad(loss, has_aux=True)(p)
        updates, s = tx.update(g, s, p)
        better = mae < best_mae  # mae belongs to p (before this update)
        best = jax.tree.map(lambda b, q: jnp.where(better, q, b), best, p)
        return optax.apply_updates(p, updates), s, best, jnp.where(better, mae, best_mae)

    init = (params, tx.init(params), params, jnp.float32(jnp.inf))
    best = jax.lax.fori_loop(0, steps, step, init)[2]
    tables = {t: _round_sat16(b, jnp) for t, b in best.items()}  # quantize_entries
    # both sweeps through one LUT kernel, mapped over the (given, fitted) tables
    both = {t: jnp.stack([jnp.asarray(getattr(cfg, f"{t}_table"), jnp.int16), tables[t]]) for t in tables}
    y = jax.vmap(lambda le, lo: sdp_lut(x_err, cfg.replace(le_table=le, lo_table=lo))[0])(both["le"], both["lo"])
    return tables, y[0], y[1]


# ---------------------------------------------------------------------------- plot_lut


def _table_abscissas(cfg, t: str, input_scale: float) -> np.ndarray:
    start = getattr(cfg, f"{t}_start")
    if t == "le" and cfg.le_function == "EXPONENT":
        return (start + 2.0 ** (np.arange(LE_DEPTH) + cfg.le_index_offset)) / input_scale
    depth = LE_DEPTH if t == "le" else LO_DEPTH
    return (start + np.arange(depth) * 2.0 ** getattr(cfg, f"{t}_index_select")) / input_scale


def _table_span(cfg, input_scale: float) -> tuple[float, float]:
    """Real input range spanned by both tables' entries, with a 1/16 margin either side."""
    lo, hi = [], []
    for t in ("le", "lo"):
        ab = _table_abscissas(cfg, t, 1.0)
        ab = ab[np.abs(ab) < 2.0 ** (cfg.START_BITS - 1)]  # reachable entries
        if getattr(cfg, f"{t}_start") < 2 ** (cfg.START_BITS - 1) - 1 and ab.size:  # not parked
            lo.append(ab.min())
            hi.append(ab.max())
    a, b = min(lo), max(hi)
    m = (b - a) / 16
    return (a - m) / input_scale, (b + m) / input_scale


@_on_host
def plot_lut(
    cfg,
    fn: Fn,
    path,
    *,
    input_scale: float = 1.0,
    output_scale: float = 1.0,
    x_range: tuple[float, float] | None = None,
    num_points: int = 4097,
) -> None:
    """Writes a PNG: ``fn`` and the exact LUT output (top) and their difference in output
    LSBs (bottom), with the entry abscissas of both tables marked. Needs matplotlib.

    With the default scales of 1 the plot is in integer LSBs (``fn`` maps input LSBs to
    output LSBs); ``x_range`` defaults to the span of both tables plus a margin, so the
    extrapolation is visible.
    """
    _cfg(cfg)
    _fn(fn)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x_range is None:
        x_range = _table_span(cfg, input_scale)
    x = sweep(x_range, input_scale, num_points)
    xr = x / input_scale
    y = evaluate(cfg, x)
    target = output_scale * _eval(fn, xr)
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax0.plot(xr, target / output_scale, label="f(x)", lw=2, alpha=0.5)
    ax0.plot(xr, y / output_scale, label="LUT", lw=1)
    lo_x, hi_x = sorted(x_range)
    for t, mark in (("lo", "|"), ("le", "x")):
        ab = _table_abscissas(cfg, t, input_scale)
        keep = (ab >= lo_x) & (ab <= hi_x)
        ent = np.asarray(getattr(cfg, f"{t}_table"), np.float64)
        ax0.plot(ab[keep], ent[keep] / output_scale, mark, ms=4, label=f"{t.upper()} entries")
    ax0.legend(loc="best")
    ax0.set_ylabel("output (real units)")
    ax1.plot(xr, y - target, lw=1)
    ax1.set_ylabel("LUT - f (output LSBs)")
    ax1.set_xlabel("x (real units)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
