"""NVDLA SDP and CDP INT lookup tables (LUTs), bit-exact (spec: nvdla.md sections 1-3).

Both units hold two tables: **LE** (65 int16 entries, LINEAR or EXPONENT indexing) and
**LO** (257 int16 entries, always LINEAR). Each input element is classified by both
tables as HIT, UFLOW or OFLOW, one table is selected by the priority rules, and the
output is interpolated between two entries (HIT) or extrapolated from the first or last
entry with a slope (UFLOW/OFLOW).

The register fields are Python integers held as static pytree data (a jitted caller
that takes a configuration as an argument retraces when register values change); the
two tables are pytree leaves (int16 arrays), so they can be traced, batched with
``vmap`` and optimised (see :func:`hwjax.nvdla.fit_lut`). Internally the LUT kernels
receive the register values as scalar operands, so they compile once per input shape
and LE function, whatever the register values (the public functions check their
arguments in Python, then run as one jitted program each). Every intermediate that
exceeds 32 bits (the SDP's 35-bit fraction and 34-bit extrapolation offset, the CDP's
38-bit inputs) is computed exactly with two-word integers (:mod:`hwjax.core.wide`), so
results do not depend on ``jax_enable_x64``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.core import wide
from hwjax.errors import ArgTypeError, RangeError, ShapeError

_I32 = jnp.int32
_U32 = jnp.uint32
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1

HIT, UFLOW, OFLOW = 0, 1, 2
"""Per-table states as reported in ``details["le_state"]`` / ``details["lo_state"]``."""
LE, LO = 0, 1
"""Table ids as reported in ``details["sel"]`` and accepted by the priority fields."""
LE_DEPTH, LO_DEPTH = 65, 257
FUNCTIONS = ("LINEAR", "EXPONENT")

REGISTER_FIELDS: tuple[str, ...] = (
    "le_function",
    "le_start",
    "le_end",
    "lo_start",
    "lo_end",
    "le_index_offset",
    "le_index_select",
    "lo_index_select",
    "le_uflow_scale",
    "le_oflow_scale",
    "lo_uflow_scale",
    "lo_oflow_scale",
    "le_uflow_shift",
    "le_oflow_shift",
    "lo_uflow_shift",
    "lo_oflow_shift",
)
PRIORITY_FIELDS: tuple[str, ...] = ("uflow_priority", "oflow_priority", "hybrid_priority")
COUNTERS: tuple[str, ...] = ("lut_uflow", "lut_oflow", "lut_le_hit", "lut_lo_hit", "lut_hybrid")


def _sx(value: int, bits: int) -> int:
    """``sx_bits(value)``: the low ``bits`` bits read as a two's-complement number."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _check_int(unit: str, name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgTypeError(f"{unit} LUT_{name.upper()} must be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise RangeError(f"{unit} LUT_{name.upper()}={int(value)} outside [{lo}, {hi}]")
    return int(value)


def _check_table(unit: str, name: str, table: Any, depth: int) -> jax.Array:
    """Validates a table (length, integer values inside int16) and returns it as int16."""
    t = table if isinstance(table, jax.Array) else np.asarray(table)
    if t.shape != (depth,):
        raise ShapeError(f"{unit} {name} must have shape ({depth},), got {t.shape}")
    if not V.is_concrete(t):
        if not jnp.issubdtype(t.dtype, jnp.integer):
            raise ArgTypeError(f"{unit} {name} must be an integer array, got dtype {t.dtype}")
        return t.astype(jnp.int16)
    a = np.asarray(t)
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ArgTypeError(f"{unit} {name} must hold integers, got dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a) & (np.floor(a) == a)):
        raise RangeError(f"{unit} {name} must hold integers")
    if a.size and (a.min() < -(2**15) or a.max() > 2**15 - 1):
        bad = a.min() if a.min() < -(2**15) else a.max()
        raise RangeError(f"{unit} {name} entry {int(bad)} outside int16 [-32768, 32767]")
    return jax.device_put(a.astype(np.int16))  # host data: transferred, no copy program compiled


@dataclasses.dataclass(frozen=True, eq=False)
class _LutConfig:
    """Fields, validation and pytree plumbing shared by :class:`SdpLutConfig` and :class:`CdpLutConfig`."""

    UNIT: ClassVar[str]
    START_BITS: ClassVar[int]  # width of START/END
    SELECT_RANGE: ClassVar[tuple[int, int]]  # accepted active INDEX_SELECT values
    OFFSET_RANGE: ClassVar[tuple[int, int]]  # accepted EXPONENT-mode LE_INDEX_OFFSET values

    le_function: str
    le_start: int
    le_end: int
    lo_start: int
    lo_end: int
    le_index_offset: int
    le_index_select: int
    lo_index_select: int
    le_uflow_scale: int
    le_oflow_scale: int
    lo_uflow_scale: int
    lo_oflow_scale: int
    le_uflow_shift: int
    le_oflow_shift: int
    lo_uflow_shift: int
    lo_oflow_shift: int
    le_table: Any
    lo_table: Any
    uflow_priority: int = LE
    oflow_priority: int = LE
    hybrid_priority: int = LE

    def __post_init__(self):
        u = self.UNIT
        if self.le_function not in FUNCTIONS:
            raise RangeError(f"{u} LUT_LE_FUNCTION must be one of {FUNCTIONS}, got {self.le_function!r}")
        exp = self.le_function == "EXPONENT"
        lim = 2 ** (self.START_BITS - 1)
        ranges = {f: (-lim, lim - 1) for f in ("le_start", "le_end", "lo_start", "lo_end")}
        ranges["le_index_offset"] = self.OFFSET_RANGE if exp else (-128, 127)  # ignored field: any 8 bits
        ranges["le_index_select"] = (-128, 127) if exp else self.SELECT_RANGE
        ranges["lo_index_select"] = self.SELECT_RANGE
        for f in REGISTER_FIELDS[8:12]:
            ranges[f] = (-(2**15), 2**15 - 1)
        for f in REGISTER_FIELDS[12:]:
            ranges[f] = (-16, 15)
        for f in PRIORITY_FIELDS:
            ranges[f] = (0, 1)
        for f, (lo, hi) in ranges.items():
            object.__setattr__(self, f, _check_int(u, f, getattr(self, f), lo, hi))
        object.__setattr__(self, "le_table", _check_table(u, "le_table", self.le_table, LE_DEPTH))
        object.__setattr__(self, "lo_table", _check_table(u, "lo_table", self.lo_table, LO_DEPTH))

    # -- views
    def registers(self) -> dict[str, Any]:
        """Every field but the tables (registers, priorities and options) as a dict."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("le_table", "lo_table")
        }

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return (
            self.registers() == other.registers()
            and np.array_equal(np.asarray(self.le_table), np.asarray(other.le_table))
            and np.array_equal(np.asarray(self.lo_table), np.asarray(other.lo_table))
        )

    __hash__ = None  # type: ignore[assignment]

    def replace(self, **changes: Any):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # -- pytree: tables are leaves, registers static
    def tree_flatten(self):
        return (self.le_table, self.lo_table), tuple(sorted(self.registers().items()))

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        for k, v in aux:
            object.__setattr__(obj, k, v)
        object.__setattr__(obj, "le_table", children[0])
        object.__setattr__(obj, "lo_table", children[1])
        return obj


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class SdpLutConfig(_LutConfig):
    """Decoded SDP INT LUT registers (spec 1.2, 2.8) and the two tables.

    Fields are named as in the conformance files. ``le_function`` is ``"LINEAR"`` or
    ``"EXPONENT"``; START/END are int32; ``*_index_select`` / ``le_index_offset`` are
    the decoded signed values; slope scales are int16 and shifts -16..15 (negative =
    left shift); priorities are 0 (LE) or 1 (LO). ``le_table`` has 65 and ``lo_table``
    257 int16 entries.

    Accepted ranges (others raise ``ValueError`` naming the register, e.g.
    ``"SDP LUT_LO_INDEX_SELECT=40 outside [-128, 32]"``): active selects -128..32,
    EXPONENT offset -128..31; the field that the mode ignores (LE select in EXPONENT
    mode, offset in LINEAR mode) may be any 8-bit value. END is never compared with
    the input, so START > END is legal (the overflow segment is anchored at END).

    ``underflow_bias`` chooses the EXPONENT-underflow bias rule: ``"c_model"`` (default,
    ``2**off`` only for ``off > 0``; the conformance files follow it) or ``"rtl"``
    (``off >= 0``, spec 7.1).
    """

    UNIT: ClassVar[str] = "SDP"
    START_BITS: ClassVar[int] = 32
    SELECT_RANGE: ClassVar[tuple[int, int]] = (-128, 32)
    OFFSET_RANGE: ClassVar[tuple[int, int]] = (-128, 31)

    underflow_bias: str = "c_model"

    def __post_init__(self):
        if self.underflow_bias not in ("c_model", "rtl"):
            raise RangeError(f"underflow_bias must be 'c_model' or 'rtl', got {self.underflow_bias!r}")
        super().__post_init__()

    # -- raw register words (spec 1.2)
    WORDS: ClassVar[tuple[str, ...]] = (
        "S_LUT_CFG",
        "S_LUT_INFO",
        "S_LUT_LE_START",
        "S_LUT_LE_END",
        "S_LUT_LO_START",
        "S_LUT_LO_END",
        "S_LUT_LE_SLOPE_SCALE",
        "S_LUT_LE_SLOPE_SHIFT",
        "S_LUT_LO_SLOPE_SCALE",
        "S_LUT_LO_SLOPE_SHIFT",
    )
    _WORD_MASKS: ClassVar[dict[str, int]] = {
        "S_LUT_CFG": 0x71,
        "S_LUT_INFO": 0xFFFFFF,
        "S_LUT_LE_SLOPE_SHIFT": 0x3FF,
        "S_LUT_LO_SLOPE_SHIFT": 0x3FF,
    }

    @classmethod
    def from_register_words(
        cls, words: Mapping[str, int], le_table, lo_table, *, underflow_bias: str = "c_model"
    ) -> "SdpLutConfig":
        """Decodes the ten raw 32-bit SDP LUT register words (keys: :attr:`WORDS`).

        Bits outside the defined fields must be 0 (``ValueError`` otherwise), so
        ``cfg.to_register_words()`` reproduces ``words`` exactly.
        """
        missing = [k for k in cls.WORDS if k not in words]
        if missing:
            raise RangeError(f"missing SDP LUT register words: {missing}")
        w = {}
        for k in cls.WORDS:
            v = words[k]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2**32:
                raise RangeError(f"SDP register word {k}={v!r} is not an unsigned 32-bit value")
            v = int(v)
            mask = cls._WORD_MASKS.get(k, 0xFFFFFFFF)
            if v & ~mask:
                raise RangeError(f"SDP register word {k}=0x{v:08x} sets reserved bits 0x{v & ~mask:08x}")
            w[k] = v
        cfg, info = w["S_LUT_CFG"], w["S_LUT_INFO"]
        fields = dict(
            le_function="LINEAR" if cfg & 1 else "EXPONENT",
            uflow_priority=(cfg >> 4) & 1,
            oflow_priority=(cfg >> 5) & 1,
            hybrid_priority=(cfg >> 6) & 1,
            le_index_offset=_sx(info, 8),
            le_index_select=_sx(info >> 8, 8),
            lo_index_select=_sx(info >> 16, 8),
        )
        for t in ("le", "lo"):
            T = t.upper()
            fields[f"{t}_start"] = _sx(w[f"S_LUT_{T}_START"], 32)
            fields[f"{t}_end"] = _sx(w[f"S_LUT_{T}_END"], 32)
            sc, sh = w[f"S_LUT_{T}_SLOPE_SCALE"], w[f"S_LUT_{T}_SLOPE_SHIFT"]
            fields[f"{t}_uflow_scale"], fields[f"{t}_oflow_scale"] = _sx(sc, 16), _sx(sc >> 16, 16)
            fields[f"{t}_uflow_shift"], fields[f"{t}_oflow_shift"] = _sx(sh, 5), _sx(sh >> 5, 5)
        return cls(**fields, le_table=le_table, lo_table=lo_table, underflow_bias=underflow_bias)

    def to_register_words(self) -> dict[str, int]:
        """Encodes the registers as the ten unsigned 32-bit words of spec 1.2."""
        m32 = 0xFFFFFFFF
        words = {
            "S_LUT_CFG": (self.le_function == "LINEAR")
            | self.uflow_priority << 4
            | self.oflow_priority << 5
            | self.hybrid_priority << 6,
            "S_LUT_INFO": (self.le_index_offset & 0xFF)
            | (self.le_index_select & 0xFF) << 8
            | (self.lo_index_select & 0xFF) << 16,
        }
        for t in ("le", "lo"):
            T = t.upper()
            words[f"S_LUT_{T}_START"] = getattr(self, f"{t}_start") & m32
            words[f"S_LUT_{T}_END"] = getattr(self, f"{t}_end") & m32
            words[f"S_LUT_{T}_SLOPE_SCALE"] = (getattr(self, f"{t}_uflow_scale") & 0xFFFF) | (
                getattr(self, f"{t}_oflow_scale") & 0xFFFF
            ) << 16
            words[f"S_LUT_{T}_SLOPE_SHIFT"] = (getattr(self, f"{t}_uflow_shift") & 0x1F) | (
                getattr(self, f"{t}_oflow_shift") & 0x1F
            ) << 5
        return {k: int(words[k]) for k in self.WORDS}


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class CdpLutConfig(_LutConfig):
    """Decoded CDP INT LUT registers (spec 1.3, 3.7) and the two tables.

    Same fields as :class:`SdpLutConfig`, with 38-bit signed START/END, active selects
    in -24..30 (encoded so that the bits above the sign bit repeat it; bit 6 for INT16
    data, bit 5 for INT8), EXPONENT offset -128..47, and ``precision`` (``"INT16"`` or
    ``"INT8"``, the CDP data precision). The CDP applies the EXPONENT-underflow bias for
    ``off >= 0``.
    """

    UNIT: ClassVar[str] = "CDP"
    START_BITS: ClassVar[int] = 38
    SELECT_RANGE: ClassVar[tuple[int, int]] = (-24, 30)
    OFFSET_RANGE: ClassVar[tuple[int, int]] = (-128, 47)

    precision: str = "INT16"

    def __post_init__(self):
        if self.precision not in ("INT16", "INT8"):
            raise RangeError(f"CDP precision must be 'INT16' or 'INT8', got {self.precision!r}")
        super().__post_init__()

    FIELDS_RAW: ClassVar[tuple[str, ...]] = (
        "le_function",
        "uflow_priority",
        "oflow_priority",
        "hybrid_priority",
        "le_index_offset",
        "le_index_select",
        "lo_index_select",
        "le_start_low",
        "le_start_high",
        "le_end_low",
        "le_end_high",
        "lo_start_low",
        "lo_start_high",
        "lo_end_low",
        "lo_end_high",
        "le_uflow_scale",
        "le_oflow_scale",
        "le_uflow_shift",
        "le_oflow_shift",
        "lo_uflow_scale",
        "lo_oflow_scale",
        "lo_uflow_shift",
        "lo_oflow_shift",
    )
    _RAW_BITS: ClassVar[dict[str, int]] = {
        "le_function": 1,
        "uflow_priority": 1,
        "oflow_priority": 1,
        "hybrid_priority": 1,
        "le_index_offset": 8,
        "le_index_select": 8,
        "lo_index_select": 8,
        **{f"{t}_{w}_low": 32 for t in ("le", "lo") for w in ("start", "end")},
        **{f"{t}_{w}_high": 6 for t in ("le", "lo") for w in ("start", "end")},
        **{f"{t}_{k}_scale": 16 for t in ("le", "lo") for k in ("uflow", "oflow")},
        **{f"{t}_{k}_shift": 5 for t in ("le", "lo") for k in ("uflow", "oflow")},
    }

    @classmethod
    def from_register_fields(
        cls, fields: Mapping[str, int], le_table, lo_table, *, precision: str = "INT16"
    ) -> "CdpLutConfig":
        """Decodes unsigned CDP LUT register-field values (keys: :attr:`FIELDS_RAW`).

        START/END are ``sx_38(HIGH * 2**32 + LOW)``; selects and offset are 8-bit fields
        decoded as signed (active selects must repeat their sign bit, see 3.7);
        ``cfg.to_register_fields()`` reproduces ``fields`` exactly.
        """
        raw = {}
        for k in cls.FIELDS_RAW:
            if k not in fields:
                raise RangeError(f"missing CDP LUT register field {k}")
            v, bits = fields[k], cls._RAW_BITS[k]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2**bits:
                raise RangeError(f"CDP register field {k}={v!r} is not an unsigned {bits}-bit value")
            raw[k] = int(v)
        dec = {k: raw[k] for k in ("uflow_priority", "oflow_priority", "hybrid_priority")}
        dec["le_function"] = "LINEAR" if raw["le_function"] else "EXPONENT"
        for k in ("le_index_offset", "le_index_select", "lo_index_select"):
            dec[k] = _sx(raw[k], 8)
        for t in ("le", "lo"):
            for w in ("start", "end"):
                dec[f"{t}_{w}"] = _sx(raw[f"{t}_{w}_high"] << 32 | raw[f"{t}_{w}_low"], 38)
            for k in ("uflow", "oflow"):
                dec[f"{t}_{k}_scale"] = _sx(raw[f"{t}_{k}_scale"], 16)
                dec[f"{t}_{k}_shift"] = _sx(raw[f"{t}_{k}_shift"], 5)
        return cls(**dec, le_table=le_table, lo_table=lo_table, precision=precision)

    def to_register_fields(self) -> dict[str, int]:
        """Encodes the registers as unsigned field values (inverse of :meth:`from_register_fields`)."""
        out = {}
        for k in self.FIELDS_RAW:
            if k == "le_function":
                out[k] = int(self.le_function == "LINEAR")
            elif k.endswith(("_low", "_high")):
                name, part = k.rsplit("_", 1)
                v = getattr(self, name) & (2**38 - 1)
                out[k] = v & 0xFFFFFFFF if part == "low" else v >> 32
            else:
                out[k] = getattr(self, k) & ((1 << self._RAW_BITS[k]) - 1)
        return out

    @classmethod
    def from_sdp(cls, cfg: SdpLutConfig, *, precision: str = "INT16") -> "CdpLutConfig":
        """The CDP configuration with the same registers and tables as an SDP one."""
        regs = {k: v for k, v in cfg.registers().items() if k != "underflow_bias"}
        return cls(**regs, le_table=cfg.le_table, lo_table=cfg.lo_table, precision=precision)


# ============================================================================ helpers
#
# The kernels below are jitted once per element count (inputs are flattened) and LE
# function: all other register values arrive as scalar arrays (``params``), built in
# Python from the decoded fields.


def _count(flags: jax.Array) -> jax.Array:
    """Number of set flags as a uint32 counter that saturates at 2**32 - 1."""
    flags = flags.reshape(-1)
    if flags.size < 2**32:
        return jnp.sum(flags, dtype=_U32)
    chunk = 2**31  # pragma: no cover - needs more than 2**32 elements
    parts = [jnp.sum(flags[i : i + chunk], dtype=_U32) for i in range(0, flags.size, chunk)]
    total = parts[0]
    for p in parts[1:]:
        s = total + p
        total = jnp.where(s < total, _U32(2**32 - 1), s)
    return total


def _add_sat(y0: jax.Array, c: jax.Array, lo: int, hi: int) -> tuple[jax.Array, jax.Array]:
    """``clamp(y0 + c, lo, hi)`` for int16-valued ``y0`` and any int32 ``c``, without
    intermediate overflow; returns (value, clipped)."""
    if (lo, hi) == (_I32_MIN, _I32_MAX):
        lower = _I32(lo) - jnp.minimum(y0, 0)
        upper = _I32(hi) - jnp.maximum(y0, 0)
        return jnp.clip(c, lower, upper) + y0, (c < lower) | (c > upper)
    s = jnp.clip(c, -(2**30), 2**30) + y0  # |lo|, |hi| <= 2**30: clipping c first is exact
    return jnp.clip(s, lo, hi), (s < lo) | (s > hi)


def _slope_term(a: wide.Wide, scale: jax.Array, shift: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``sat_32(rshift_rhaz(a * scale, shift))`` and whether it saturated.

    ``a`` is a two-word integer with ``|a * scale| < 2**63``; ``scale`` int16; ``shift``
    in -16..15 (negative: left shift, saturating).
    """
    p = wide.mul_wide_int32(a, scale)
    right, clip_r = wide.saturate_to_int32(wide.shift_right(p, jnp.maximum(shift, 0), "half_away"), _I32_MIN, _I32_MAX)
    # Left shifts: saturating P to int32 first does not change the saturated result.
    p32, clip_p = wide.saturate_to_int32(p, _I32_MIN, _I32_MAX)
    k = jnp.clip(-shift, 0, 16)
    over, under = p32 > (_I32(_I32_MAX) >> k), p32 < (_I32(_I32_MIN) >> k)
    left = jnp.where(over, _I32(_I32_MAX), jnp.where(under, _I32(_I32_MIN), p32 << k))
    neg = shift < 0
    return jnp.where(neg, left, right), jnp.where(neg, clip_p | over | under, clip_r)


def _choose(k: jax.Array, options: jax.Array) -> jax.Array:
    """``options[k]`` per element for a short 1-D parameter array (a chain of selects)."""
    out = options[-1]
    for i in range(options.shape[0] - 2, -1, -1):
        out = jnp.where(k == i, options[i], out)
    return out


def _select_table(le_state, lo_state, up, op, hp) -> jax.Array:
    """Spec 2.3: True where LO is selected, given the two states and the priorities."""
    both_u = (le_state == UFLOW) & (lo_state == UFLOW)
    both_o = (le_state == OFLOW) & (lo_state == OFLOW)
    le_hit, lo_hit = le_state == HIT, lo_state == HIT
    hybrid = (le_hit == lo_hit) & ~both_u & ~both_o
    return (both_u & up) | (both_o & op) | (hybrid & hp) | (lo_hit & ~le_hit)


class _TableState(NamedTuple):
    state: jax.Array  # HIT / UFLOW / OFLOW (int32)
    idx: jax.Array  # entry index of y0 (int32)
    rem: Any  # fraction numerator: frac = rem / 2**n (uint32 for the SDP, Wide for the CDP)
    n: jax.Array  # fraction bits (int32)
    width: jax.Array  # log2 of the segment width in input LSBs (select, or octave exponent)


def _finish_state(above, hit, idx, last, rem, n, width=None) -> _TableState:
    state = jnp.where(~above, _I32(UFLOW), jnp.where(hit, _I32(HIT), _I32(OFLOW)))
    idx = jnp.where(hit, idx, jnp.where(above, _I32(last), _I32(0)))
    n = jnp.asarray(n, _I32)
    return _TableState(state, idx, rem, n, n if width is None else jnp.asarray(width, _I32))


def _linear_params(sel: int, depth: int) -> dict[str, int]:
    """LINEAR index operands: ``q = d >> s_r``, ``idx = q << s_l``, hit iff ``q < lim``."""
    last = depth - 1
    if sel >= 0:
        return {"s_r": sel, "s_l": 0, "lim": last}
    k = -sel
    return {"s_r": 0, "s_l": min(k, 31), "lim": -(-last // (1 << k))}  # d * 2**k < last


def _wide_param(v: int) -> tuple[np.ndarray, np.ndarray]:
    return np.int32(_sx(v >> 32, 32)), np.uint32(v & 0xFFFFFFFF)


def _extrap_params(r: dict, combos: list[tuple[str, str, int]]) -> dict[str, np.ndarray]:
    """Per-choice extrapolation operands: reference (START + bias or END), scale, shift."""
    refs = [_wide_param(ref) for _, _, ref in combos]
    return {
        "ref_hi": np.array([h for h, _ in refs], np.int32),
        "ref_lo": np.array([lo for _, lo in refs], np.uint32),
        "scale": np.array([r[f"{t}_{k}_scale"] for t, k, _ in combos], np.int32),
        "shift": np.array([r[f"{t}_{k}_shift"] for t, k, _ in combos], np.int32),
    }


def _priority_params(r: dict) -> dict[str, np.ndarray]:
    return {k: np.bool_(r[f"{k}_priority"]) for k in ("uflow", "oflow", "hybrid")}


# ============================================================================== SDP


def _sdp_linear(x: jax.Array, start, s_r, s_l, lim, depth: int) -> _TableState:
    """SDP LINEAR classification (spec 2.2), with ``d = x - START`` in uint32."""
    above = x > start
    d = jax.lax.bitcast_convert_type(x, _U32) - jax.lax.bitcast_convert_type(start, _U32)
    q = jnp.where(s_r >= 32, _U32(0), d >> jnp.minimum(s_r, 31).astype(_U32))
    hit = above & (q < lim)
    idx = (q << s_l.astype(_U32)).astype(_I32)
    mask = jnp.where(s_r >= 32, _U32(0xFFFFFFFF), (_U32(1) << jnp.minimum(s_r, 31).astype(_U32)) - _U32(1))
    return _finish_state(above, hit, idx, depth - 1, d & mask, s_r, s_r - s_l)


def _sdp_exponent(x: jax.Array, start, off) -> _TableState:
    """SDP EXPONENT classification (spec 2.2): octave index ``floor_log2(d) - off``."""
    above = x > start
    d = jax.lax.bitcast_convert_type(x, _U32) - jax.lax.bitcast_convert_type(start, _U32)
    d = jnp.where(above, d, _U32(1))
    e = 31 - jax.lax.clz(d).astype(_I32)
    i = e - off
    hit = above & (i >= 0) & (i < LE_DEPTH - 1)
    return _finish_state(above & (i >= 0), hit, i, LE_DEPTH - 1, d ^ (_U32(1) << e.astype(_U32)), e)


def _sdp_interp(y0: jax.Array, y1: jax.Array, rem: jax.Array, n: jax.Array) -> jax.Array:
    """``rshift_rhaz(y0 * 2**n + (y1 - y0) * rem, n)``, exactly (spec 2.4).

    This equals the hardware's ``rshift_rhaz(y0 * (2**35 - frac) + y1 * frac, 35)`` with
    ``frac = rem * 2**(35 - n)``; ``0 <= rem < 2**n``, ``n <= 32``. The 49-bit product
    ``|y1 - y0| * rem`` is formed as two 32-bit words.
    """
    delta = y1 - y0
    neg = delta < 0
    ad = jnp.abs(delta).astype(_U32)  # < 2**16
    pl = ad * (rem & _U32(0xFFFF))
    ph = ad * (rem >> _U32(16))
    lo = pl + (ph << _U32(16))
    hi = (ph >> _U32(16)) + (lo < pl).astype(_U32)
    nc = jnp.clip(n, 0, 31).astype(_U32)
    # q = floor(|P| / 2**n) <= |delta|; bit n-1 is in the low word because n <= 32.
    spill = jnp.where(nc == 0, _U32(0), hi << (_U32(32) - jnp.maximum(nc, _U32(1))))
    q = jnp.where(n >= 32, hi, (lo >> nc) | spill).astype(_I32)
    b = jnp.clip(n - 1, 0, 31).astype(_U32)
    rb = (n >= 1) & (((lo >> b) & _U32(1)) == 1)
    sticky = (lo & ((_U32(1) << b) - _U32(1))) != 0
    tie_up = jnp.where(neg, y0 - q <= 0, y0 + q >= 0)  # sign of the total at a tie
    up = (rb & (sticky | tie_up)).astype(_I32)
    return jnp.where(neg, y0 - (q + up), y0 + (q + up))


@functools.lru_cache(maxsize=1024)
def _sdp_params(regs: tuple) -> tuple[bool, dict]:
    """(EXPONENT mode, scalar register operands) of the SDP kernel."""
    r = dict(regs)
    exp_mode = r["le_function"] == "EXPONENT"
    off = r["le_index_offset"]
    bias_on = exp_mode and (off > 0 or (off == 0 and r["underflow_bias"] == "rtl"))
    p: dict[str, Any] = {"le_off": np.int32(off if exp_mode else 0), **_priority_params(r)}
    for t, depth in (("le", LE_DEPTH), ("lo", LO_DEPTH)):
        p[f"{t}_start"] = np.int32(r[f"{t}_start"])
        lin = (
            _linear_params(r[f"{t}_index_select"], depth)
            if not (t == "le" and exp_mode)
            else {"s_r": 0, "s_l": 0, "lim": 0}
        )
        p.update(
            {f"{t}_s_r": np.int32(lin["s_r"]), f"{t}_s_l": np.int32(lin["s_l"]), f"{t}_lim": np.uint32(lin["lim"])}
        )
    combos = [
        ("le", "uflow", r["le_start"] + ((1 << off) if bias_on else 0)),
        ("le", "oflow", r["le_end"]),
        ("lo", "uflow", r["lo_start"]),
        ("lo", "oflow", r["lo_end"]),
    ]
    p.update(_extrap_params(r, combos))
    return exp_mode, p


def _sdp_kernel(exp_mode: bool, p: dict, x: jax.Array, le_table: jax.Array, lo_table: jax.Array):
    """Exact SDP LUT on int32 ``x``: (y, stats, details, (slope numerator, slope exponent))."""
    le = (
        _sdp_exponent(x, p["le_start"], p["le_off"])
        if exp_mode
        else _sdp_linear(x, p["le_start"], p["le_s_r"], p["le_s_l"], p["le_lim"], LE_DEPTH)
    )
    lo = _sdp_linear(x, p["lo_start"], p["lo_s_r"], p["lo_s_l"], p["lo_lim"], LO_DEPTH)
    pick_lo = _select_table(le.state, lo.state, p["uflow"], p["oflow"], p["hybrid"])
    state = jnp.where(pick_lo, lo.state, le.state)
    idx = jnp.where(pick_lo, lo.idx, le.idx)
    rem = jnp.where(pick_lo, lo.rem, le.rem)
    n = jnp.where(pick_lo, lo.n, le.n)
    width = jnp.where(pick_lo, lo.width, le.width)
    hit, uflow, oflow = state == HIT, state == UFLOW, state == OFLOW

    table = jnp.concatenate([le_table.astype(_I32), lo_table.astype(_I32)], axis=-1)
    base = jnp.where(pick_lo, _I32(LE_DEPTH), _I32(0))
    y0 = table[base + idx]
    y1 = table[base + jnp.where(hit, idx + 1, idx)]
    inter = _sdp_interp(y0, y1, rem, n)

    # Extrapolation operands, one of four (LE/LO x UFLOW/OFLOW), spec 2.5.
    k = 2 * pick_lo.astype(_I32) + oflow.astype(_I32)
    ref = wide.Wide(_choose(k, p["ref_hi"]), _choose(k, p["ref_lo"]))
    scale, shift = _choose(k, p["scale"]), _choose(k, p["shift"])
    c, clip_c = _slope_term(wide.sub(wide.from_int32(x), ref), scale, shift)
    extra, clip_y = _add_sat(y0, c, _I32_MIN, _I32_MAX)
    y = jnp.where(hit, inter, extra)

    stats = {
        "lut_uflow": _count(uflow),
        "lut_oflow": _count(oflow),
        "lut_le_hit": _count(le.state == HIT),
        "lut_lo_hit": _count(lo.state == HIT),
        "lut_hybrid": _count(hit),
    }
    details = {
        "le_state": le.state,
        "lo_state": lo.state,
        "sel": pick_lo.astype(_I32),
        "addr": idx,
        "frac35": wide.shift_left(wide.from_uint32(jnp.where(hit, rem, _U32(0))), 35 - n),
        "uflow": uflow,
        "oflow": oflow,
        "le_hit": le.state == HIT,
        "lo_hit": lo.state == HIT,
        "y0": y0,
        "y1": y1,
    }
    # Gradient: (y1 - y0) / 2**width on a hit, scale / 2**shift on an unsaturated extrapolation.
    num = jnp.where(hit, y1 - y0, jnp.where(clip_c | clip_y, 0, scale))
    return y, stats, details, (num, jnp.where(hit, -width, -shift))


_sdp_jit = jax.jit(_sdp_kernel, static_argnums=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _lut_float(kernel, exp_mode, p, x, le_table, lo_table):
    y, stats, details, _ = kernel(exp_mode, p, x.astype(_I32), le_table, lo_table)
    return y.astype(x.dtype), stats, details


def _lut_float_fwd(kernel, exp_mode, p, x, le_table, lo_table):
    y, stats, details, slope = kernel(exp_mode, p, x.astype(_I32), le_table, lo_table)
    return (y.astype(x.dtype), stats, details), (slope, p, le_table, lo_table)


def _float0_like(a) -> np.ndarray:
    return np.zeros(np.shape(a), dtype=jax.dtypes.float0)


def _lut_float_bwd(kernel, exp_mode, res, cts):
    (num, exp2), p, le_table, lo_table = res
    g = cts[0]
    gx = g * jnp.ldexp(num.astype(g.dtype), exp2)  # exact power-of-two scaling
    return (jax.tree_util.tree_map(_float0_like, p), gx, _float0_like(le_table), _float0_like(lo_table))


_lut_float.defvjp(_lut_float_fwd, _lut_float_bwd)


def _flat(a: jax.Array) -> jax.Array:
    return a.reshape(-1)


def _run(kernel, params, x, cfg, return_details: bool, accept_wide: bool):
    """Input checks and float/int dispatch shared by :func:`sdp_lut` and :func:`cdp_lut`.

    The checks run here, on concrete values; the conversion, the kernel and the
    reshapes run as one jitted program (:func:`_run_jit`), compiled once per input
    shape, dtype and LE function.
    """
    V.check_flag(return_details, "return_details")
    exp_mode, p = params(tuple(sorted(cfg.registers().items())))
    if not (accept_wide and isinstance(x, wide.Wide)):
        x = V.as_array(x, "x")
        if accept_wide and np.dtype(x.dtype) == np.int64:
            pass  # split into two words inside the program
        elif V.kind(x, "x") == "float":
            V.check_integral(x, "x")
            V.check_range(x, -(2**31), 2**31 - 1, "x")
        elif np.dtype(x.dtype) == np.int64:
            V.check_range(x, -(2**31), 2**31 - 1, "x")
    y, stats, details = _run_jit(x, p, cfg.le_table, cfg.lo_table, kernel=kernel, exp_mode=exp_mode)
    return (y, stats, details) if return_details else (y, stats)


@functools.partial(jax.jit, static_argnames=("kernel", "exp_mode"))
def _run_jit(x, p, le_table, lo_table, *, kernel, exp_mode: bool):
    """``(y, stats, details)``. The kernels see 1-D inputs; per-element results are
    reshaped back to ``x``'s shape. (The details are always returned, so that one
    program serves both values of ``return_details``; under an outer ``jit`` unused
    ones cost nothing.)"""
    if isinstance(x, wide.Wide):
        x = wide.Wide(jnp.asarray(x.hi, _I32), jnp.asarray(x.lo, _U32))
    elif np.dtype(x.dtype) == np.int64:  # (the CDP with jax_enable_x64 only)
        x = wide.Wide((x >> 32).astype(_I32), (x & 0xFFFFFFFF).astype(_U32))
    elif not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(_I32)
    shape = x.hi.shape if isinstance(x, wide.Wide) else x.shape
    xf = jax.tree_util.tree_map(_flat, x)
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating):
        y, stats, details = _lut_float(kernel, exp_mode, p, xf, le_table, lo_table)
    else:
        y, stats, details, _ = kernel(exp_mode, p, xf, le_table, lo_table)
    y, details = jax.tree_util.tree_map(lambda a: a.reshape(shape), (y, details))
    return y, stats, details


def sdp_lut(x, cfg: SdpLutConfig, *, return_details: bool = False):
    """The SDP INT LUT (spec section 2), bit-exact, element-wise.

    Per element and table (LE, LO): classification HIT / UFLOW / OFLOW (2.2; underflow is
    ``x <= START``, overflow is an entry index ``>= last``; END is never compared),
    selection by the priorities (2.3), then

    * HIT: ``rshift_rhaz(T[a] * (2**35 - frac) + T[a+1] * frac, 35)`` with the 35-bit
      fraction ``frac`` (2.4);
    * UFLOW/OFLOW: ``sat_32(T[a] + sat_32(rshift_rhaz((x - ref - bias) * scale, shift)))``
      with ``ref`` = START (underflow) or END (overflow) of the selected table and the
      EXPONENT-underflow bias ``2**off`` (2.5), rounding half away from zero.

    Args:
      x: int32 array (any shape; narrower integer dtypes are widened) or a float array
        holding int32 values.
      cfg: the registers and tables (tables may carry a batch dimension under ``vmap``).
      return_details: also return per-element details.

    Returns:
      ``(y, stats)`` or ``(y, stats, details)``. ``y``: int32 (float ``x``: the same
      values in ``x``'s dtype). ``stats``: uint32 counters ``lut_uflow``, ``lut_oflow``
      (selected result under/overflowed), ``lut_hybrid`` (selected result interpolated),
      ``lut_le_hit``, ``lut_lo_hit`` (that table hit, selected or not), spec 2.7;
      saturating at ``2**32 - 1``. ``details``: ``le_state``/``lo_state`` (int32,
      ``HIT=0, UFLOW=1, OFLOW=2``), ``sel`` (int32, ``LE=0, LO=1``), ``addr`` (index of
      ``y0``), ``frac35`` (:class:`hwjax.core.wide.Wide`, 0 unless interpolated),
      ``uflow``, ``oflow``, ``le_hit``, ``lo_hit`` (bool), ``y0``, ``y1`` (the entries at
      ``addr`` and ``addr + 1``; ``y1`` equals ``y0`` unless interpolated).

    Gradient (float ``x``, ``jax.custom_vjp``): the slope of the piece actually used,
    ``(T[a+1] - T[a]) / 2**w`` on a hit, where ``2**w`` is the distance between the two
    entries in input LSBs (``w`` = the select, negative selects included, or the octave
    exponent ``floor_log2(x - START)`` in EXPONENT mode), and ``scale / 2**shift`` on an
    extrapolation, 0 where the extrapolation saturated. No gradient flows to the
    tables.
    """
    if not isinstance(cfg, SdpLutConfig):
        raise ArgTypeError(f"cfg must be an SdpLutConfig, got {type(cfg).__name__}")
    return _run(_sdp_jit, _sdp_params, x, cfg, return_details, accept_wide=False)


# ============================================================================== CDP


def _cdp_table(d: wide.Wide, exp_mode: bool, p: dict, t: str, depth: int) -> _TableState:
    """CDP classification (spec 3.2) of ``d = x - START`` (39-bit two-word integer)."""
    last = depth - 1
    above = ~wide.le(d, wide.const(0))
    if exp_mode:
        dd = wide.where(above, d, wide.const(1))
        e = wide.bit_length(dd) - 1
        i = e - p["le_off"]
        hit = above & (i >= 0) & (i < last)
        return _finish_state(above & (i >= 0), hit, i, last, wide.low_bits(dd, e), e)
    s_r, s_l = p[f"{t}_s_r"], p[f"{t}_s_l"]
    hit = above & wide.lt(d, wide.Wide(p[f"{t}_lim_hi"], p[f"{t}_lim_lo"]))
    idx = jax.lax.bitcast_convert_type(wide.floor_shift(d, s_r).lo << s_l.astype(_U32), _I32)
    return _finish_state(above, hit, idx, last, wide.low_bits(d, s_r), s_r, s_r - s_l)


def _cdp_frac16(rem: wide.Wide, n: jax.Array) -> jax.Array:
    """Spec 3.3: ``rem << (16 - n)`` if ``n <= 16`` else ``rem >> (n - 16)`` (truncating)."""
    small = jax.lax.bitcast_convert_type(rem.lo, _I32) << jnp.clip(16 - n, 0, 16)
    big = jax.lax.bitcast_convert_type(wide.floor_shift(rem, jnp.clip(n - 16, 0, 63)).lo, _I32)
    return jnp.where(n <= 16, small, big)


def _cdp_interp(y0: jax.Array, y1: jax.Array, f16: jax.Array) -> jax.Array:
    """``y0 + rshift_rhaz((y1 - y0) * f16, 16)`` (spec 3.4); |product| < 2**32 as uint32."""
    delta = y1 - y0
    p = jnp.abs(delta).astype(_U32) * f16.astype(_U32)
    q = ((p + _U32(1 << 15)) >> _U32(16)).astype(_I32)
    return jnp.where(delta < 0, y0 - q, y0 + q)


def _cdp_value(x: wide.Wide, p: dict, t: str, table: jax.Array, st: _TableState):
    """One CDP table's int16 result (spec 3.4), with its gradient numerator/exponent."""
    hit, oflow = st.state == HIT, st.state == OFLOW
    y0 = table[st.idx]
    y1 = table[jnp.where(hit, st.idx + 1, st.idx)]
    inter = _cdp_interp(y0, y1, _cdp_frac16(st.rem, st.n))
    k = oflow.astype(_I32)
    ref = wide.Wide(_choose(k, p[f"{t}_ref_hi"]), _choose(k, p[f"{t}_ref_lo"]))
    scale, shift = _choose(k, p[f"{t}_scale"]), _choose(k, p[f"{t}_shift"])
    c, clip_c = _slope_term(wide.sub(x, ref), scale, shift)
    extra, clip_y = _add_sat(y0, c, -(2**15), 2**15 - 1)
    num = jnp.where(hit, y1 - y0, jnp.where(clip_c | clip_y, 0, scale))
    return jnp.where(hit, inter, extra), (num, jnp.where(hit, -st.width, -shift))


@functools.lru_cache(maxsize=1024)
def _cdp_params(regs: tuple) -> tuple[bool, dict]:
    """(EXPONENT mode, scalar register operands) of the CDP kernel."""
    r = dict(regs)
    exp_mode = r["le_function"] == "EXPONENT"
    off = r["le_index_offset"]
    p: dict[str, Any] = {"le_off": np.int32(off if exp_mode else 0), **_priority_params(r)}
    for t, depth in (("le", LE_DEPTH), ("lo", LO_DEPTH)):
        p[f"{t}_start_hi"], p[f"{t}_start_lo"] = _wide_param(r[f"{t}_start"])
        lin = (
            _linear_params(r[f"{t}_index_select"], depth)
            if not (t == "le" and exp_mode)
            else {"s_r": 0, "s_l": 0, "lim": 0}
        )
        lim = lin["lim"] << lin["s_r"]  # d >> s_r < lim  <=>  d < lim << s_r
        p[f"{t}_lim_hi"], p[f"{t}_lim_lo"] = _wide_param(lim)
        p[f"{t}_s_r"], p[f"{t}_s_l"] = np.int32(lin["s_r"]), np.int32(lin["s_l"])
        bias = (1 << off) if t == "le" and exp_mode and off >= 0 else 0
        ex = _extrap_params(r, [(t, "uflow", r[f"{t}_start"] + bias), (t, "oflow", r[f"{t}_end"])])
        p.update({f"{t}_{k}": v for k, v in ex.items()})
    return exp_mode, p


def _cdp_kernel(exp_mode: bool, p: dict, x, le_table: jax.Array, lo_table: jax.Array):
    """Exact CDP LUT: (y int32 holding int16, stats, details, slope)."""
    xw = x if isinstance(x, wide.Wide) else wide.from_int32(x)
    states, values, slopes = {}, {}, {}
    for t, table in (("le", le_table), ("lo", lo_table)):
        d = wide.sub(xw, wide.Wide(p[f"{t}_start_hi"], p[f"{t}_start_lo"]))
        states[t] = _cdp_table(d, exp_mode and t == "le", p, t, LE_DEPTH if t == "le" else LO_DEPTH)
        values[t], slopes[t] = _cdp_value(xw, p, t, table.astype(_I32), states[t])
    le_s, lo_s = states["le"].state, states["lo"].state
    pick_lo = _select_table(le_s, lo_s, p["uflow"], p["oflow"], p["hybrid"])
    y = jnp.where(pick_lo, values["lo"], values["le"])
    le_hit, lo_hit = le_s == HIT, lo_s == HIT
    both_u = (le_s == UFLOW) & (lo_s == UFLOW)
    both_o = (le_s == OFLOW) & (lo_s == OFLOW)
    stats = {
        "lut_uflow": _count(both_u),
        "lut_oflow": _count(both_o),
        "lut_le_hit": _count(le_hit & ~lo_hit),
        "lut_lo_hit": _count(lo_hit & ~le_hit),
        "lut_hybrid": _count(~(both_u | both_o | (le_hit != lo_hit))),
    }
    details = {
        "le_state": le_s,
        "lo_state": lo_s,
        "sel": pick_lo.astype(_I32),
        "addr": jnp.where(pick_lo, states["lo"].idx, states["le"].idx),
        "le_value": values["le"],
        "lo_value": values["lo"],
    }
    slope = tuple(jnp.where(pick_lo, a, b) for a, b in zip(slopes["lo"], slopes["le"]))
    return y, stats, details, slope


_cdp_jit = jax.jit(_cdp_kernel, static_argnums=0)


def cdp_lut(x, cfg: CdpLutConfig, *, return_details: bool = False):
    """The CDP INT LUT (spec section 3), bit-exact, element-wise.

    Differences from :func:`sdp_lut`: START/END and the input are up to 38 bits; both
    tables are evaluated and each result is saturated to int16 **before** selection
    (3.4); interpolation uses the truncated 16-bit fraction ``f16`` (3.3):
    ``sat_16(T[a] + rshift_rhaz((T[a+1] - T[a]) * f16, 16))``; extrapolation
    ``sat_16(T[a] + rshift_rhaz((x - ref - bias) * scale, shift))`` with the
    EXPONENT-underflow bias ``2**off`` for ``off >= 0``; and the CDP counters (3.5):
    exactly one of ``lut_uflow`` (both underflow), ``lut_oflow`` (both overflow),
    ``lut_le_hit`` / ``lut_lo_hit`` (only that table hits) or ``lut_hybrid`` (both hit,
    or one underflows and the other overflows) per element.

    Args:
      x: LUT input: an integer array (<= 32 bits), an int64 array (with x64 enabled), a
        :class:`hwjax.core.wide.Wide` (e.g. from :func:`cdp_sqsum`), all holding values
        inside the 38-bit signed range; or a float array holding int32 values
        (differentiable).
      cfg: registers and tables.
      return_details: also return ``le_state``, ``lo_state``, ``sel``, ``addr`` and
        ``le_value``/``lo_value`` (each table's int16 result).

    Returns:
      ``(y, stats)`` or ``(y, stats, details)``; ``y`` int32 holding int16 values (float
      ``x``: its dtype). Gradient as :func:`sdp_lut`: ``(T[a+1] - T[a]) / 2**w`` with
      ``2**w`` the entry spacing, or ``scale / 2**shift``; 0 where saturated.
    """
    if not isinstance(cfg, CdpLutConfig):
        raise ArgTypeError(f"cfg must be a CdpLutConfig, got {type(cfg).__name__}")
    return _run(_cdp_jit, _cdp_params, x, cfg, return_details, accept_wide=True)


_MAX_L = 4  # NORMALZ_LEN is 2 bits: L = NORMALZ_LEN + 1 <= 4


@functools.partial(jax.jit, static_argnums=2)
def _sqsum(v: jax.Array, L: jax.Array, axis: int) -> wide.Wide:
    """Windowed sum of squares; ``L`` is traced (one compilation for every window)."""
    v = jnp.moveaxis(v.astype(_I32), axis, -1)
    n = v.shape[-1]
    sq = wide.mul_int32(v, v)
    pad = [(0, 0)] * (v.ndim - 1) + [(_MAX_L, _MAX_L)]
    sq = wide.Wide(jnp.pad(sq.hi, pad), jnp.pad(sq.lo, pad))
    acc = wide.Wide(jnp.zeros(v.shape, _I32), jnp.zeros(v.shape, _U32))
    for j in range(-_MAX_L, _MAX_L + 1):
        use = abs(j) <= L
        term = wide.Wide(sq.hi[..., _MAX_L + j : _MAX_L + j + n], sq.lo[..., _MAX_L + j : _MAX_L + j + n])
        acc = wide.add(acc, wide.where(use, term, wide.const(0)))
    return wide.Wide(jnp.moveaxis(acc.hi, -1, axis), jnp.moveaxis(acc.lo, -1, axis))


def cdp_sqsum(v, normalz_len: int, *, axis: int = -1) -> wide.Wide:
    """CDP sum-of-squares front end (spec 3.1): ``x[c] = sum(v[c+j]**2, |j| <= L)``.

    ``L = normalz_len + 1`` (window 3, 5, 7 or 9 channels along ``axis``); channels
    outside the array add nothing (the hardware fills them with the raw input offset,
    which converts to 0). ``v`` holds input-convertor outputs (int17 for INT16 data,
    int9 for INT8). Returns a two-word integer (up to ``9 * 2**32``, 36 bits).
    """
    normalz_len = V.check_static_int(normalz_len, 0, 3, "normalz_len")
    v = _checked_int32(v, "v")
    V.check_range(v, -(2**16), 2**16 - 1, "v (int17 convertor output)")
    axis = V.check_static_int(axis, -v.ndim, v.ndim - 1, "axis") % v.ndim
    return _sqsum(v, np.int32(normalz_len + 1), axis)


def _checked_int32(v, name: str) -> jax.Array:
    """``v`` as a JAX array after the checks of :func:`hwjax.core._validate.to_int32`
    (concrete values); the jitted programs convert it to int32."""
    v = V.as_array(v, name)
    if V.kind(v, name) == "float":
        V.check_integral(v, name)
        V.check_range(v, -(2**31), 2**31 - 1, name)
    elif np.dtype(v.dtype) == np.int64:
        V.check_range(v, -(2**31), 2**31 - 1, name)
    return v


def cdp_lrn(
    v,
    cfg: CdpLutConfig,
    *,
    normalz_len: int,
    sqsum_bypass: bool = False,
    mul_bypass: bool = False,
    axis: int = -1,
    return_details: bool = False,
):
    """CDP data path between the convertors (spec 3.1 steps 2-5).

    ``x`` = :func:`cdp_sqsum` of ``v`` (or ``v`` itself with ``sqsum_bypass``), then
    :func:`cdp_lut`, then ``m = lut`` (``mul_bypass``) or ``m = lut * v`` (the centre
    element; int33 for INT16 data, int25 for INT8). ``m`` is returned as a two-word
    integer, ready for the CDP output convertor.

    Returns ``(m, stats)`` or ``(m, stats, details)`` where ``details`` additionally
    holds ``lut_in`` (Wide) and ``lut`` (int32).
    """
    if not isinstance(cfg, CdpLutConfig):
        raise ArgTypeError(f"cfg must be a CdpLutConfig, got {type(cfg).__name__}")
    sqsum_bypass = V.check_flag(sqsum_bypass, "sqsum_bypass")
    mul_bypass = V.check_flag(mul_bypass, "mul_bypass")
    V.check_flag(return_details, "return_details")
    v = _checked_int32(v, "v")
    V.check_range(v, -(2**16), 2**16 - 1, "v (int17 convertor output)")
    if not sqsum_bypass:
        normalz_len = V.check_static_int(normalz_len, 0, 3, "normalz_len")
        axis = V.check_static_int(axis, -v.ndim, v.ndim - 1, "axis") % v.ndim
    exp_mode, p = _cdp_params(tuple(sorted(cfg.registers().items())))
    L = np.int32(1 if sqsum_bypass else normalz_len + 1)
    m, stats, details = _cdp_lrn_jit(
        v,
        L,
        np.bool_(sqsum_bypass),
        np.bool_(mul_bypass),
        p,
        cfg.le_table,
        cfg.lo_table,
        exp_mode=exp_mode,
        axis=-1 if sqsum_bypass else axis,
    )
    return (m, stats, details) if return_details else (m, stats)


@functools.partial(jax.jit, static_argnames=("exp_mode", "axis"))
def _cdp_lrn_jit(v, L, sqsum_bypass, mul_bypass, p, le_table, lo_table, *, exp_mode, axis):
    """:func:`cdp_lrn` on checked operands as one program: ``(m, stats, details)``. The
    window ``L = normalz_len + 1`` and the two bypass flags are traced (selects), so one
    compilation serves every register setting with the same shape and LE function."""
    v = v.astype(_I32)
    x = wide.from_int32(v)
    if v.ndim:  # (a scalar ``v`` is only accepted with sqsum_bypass)
        x = wide.where(sqsum_bypass, x, _sqsum(v, L, axis))
    lut, stats, details = _run_jit(x, p, le_table, lo_table, kernel=_cdp_jit, exp_mode=exp_mode)
    m = wide.where(mul_bypass, wide.from_int32(lut), wide.mul_int32(lut, v))
    return m, stats, {**details, "lut_in": x, "lut": lut}
