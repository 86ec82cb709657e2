"""gemmlowp target: ``hwjax.nn`` layers and graphs on gemmlowp's uint8 GEMM, including its
removed less-than-8-bit requantizing mode (spec gemmlowp.md §1, §3), with a TFLite-style
output pipeline.

Each op kind is one :class:`hwjax.graph.OpImpl` registered below, composed from the
public functions of :mod:`hwjax.gemmlowp` (``gemm_lt8``, ``pack_lt8``, ``gemm``, the
output stages, ``rounding_multiply_by_constant_fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.gemmlowp as gl
from hwjax.core import div_rn, extract_patches, window_taps
from hwjax.errors import ArgTypeError, FormatError, RangeError
from hwjax.graph import geometry, pool_geometry
from hwjax.targets._base import Target, no_acc, pytree, register, static

_I32 = jnp.int32
_INT32_MAX = 2**31 - 1
ROUNDINGS: tuple[str, ...] = ("auto",) + tuple(gl.MODES) + ("exact",)
REQUANTIZE: tuple[str, ...] = ("auto", "always")


@dataclass(frozen=True)
class Gemmlowp(Target):
    """gemmlowp (google/gemmlowp): the uint8 GEMM with offsets and output stages (spec
    gemmlowp.md §1), and the less-than-8-bit requantizing mode of gemmlowp bc3491e (§3;
    x86_64 scalar reference build, one thread).

    Fields (the target's options, ``hwjax.targets.get("gemmlowp", lhs_bits=4, ...)``):

    * ``lhs_bits``: bit depth 1..8 of the LHS operand, **the weights**.
    * ``rhs_bits``: bit depth 1..8 of the RHS operand, **the activations** (im2col
      patches). 8 leaves a side unchanged; 8 and 8 is the exact uint8 GEMM.
    * ``rounding``: the requantization rounding, any mode :func:`hwjax.gemmlowp.gemm_lt8`
      takes by name: ``"auto"`` (gemmlowp's default strategy: Nearest below depth 384,
      ProbabilisticAddmod from 384), ``"nearest"``, ``"xorshift"``, ``"addmod"``, or
      ``"exact"`` (only with 8 and 8 bits).
    * ``requantize``: ``"auto"`` (default): gemmlowp's own dispatch, i.e. every GEMM is
      exactly ``gemm_lt8``, which silently runs the exact 8-bit GEMM when
      ``2*rows*cols < 100*(rows + cols)`` (``IsRequantizationWorthIt``, §3.3; every
      GEMV and most GEMMs of small layers). ``"always"``: every GEMM with a side below
      8 bits is requantized (the §3.5-§3.10 arithmetic forced on, as gemmlowp computes it
      when it does requantize; equal to ``gemm_lt8`` wherever gemmlowp itself
      requantizes). Use it to train small models for the < 8-bit arithmetic.

    **One GEMM per example.** Every layer runs one gemmlowp call per example of the
    batch (what an interpreter running the model on one input does), so results do not
    depend on the batch, even in the probabilistic modes, whose offsets depend on each
    element's position in the packed operand.

    **Operands.** Portable parameters (:mod:`hwjax.graph.ops.linear`): int8 symmetric
    weights ``w`` in [-127, 127], int32 bias in units of ``s_in * w_scale[c]``, int8
    activations ``q`` with zero point ``z_in``. For output channel ``o`` and GEMM depth
    index ``k`` (conv: ``(ky, kx, ci)`` order, channels fastest, as
    :func:`hwjax.core.extract_patches`; dense: the input index)::

        lhs[o, k]  = w[o, k] + 128          (uint8)   lhs_offset = -128
        rhs[k, p]  = q[k, p] + 128          (uint8)   rhs_offset = -(z_in + 128)

    with ``p`` the output pixel (row-major over (oy, ox); dense: one column), so
    ``(lhs + lhs_offset) * (rhs + rhs_offset) = w * (q - z_in)``. Padded conv taps read
    the zero point (RHS byte ``z_in + 128``), i.e. contribute 0 in the exact GEMM (in the
    requantized GEMM they are requantized like any other byte).

    **Output pipeline** (gemmlowp stages, spec §1.3; per output channel ``o`` = row)::

        BiasAddition(bias, shape="col")
        ScaleInt32ByFixedPointAndExponentPC(m[o], e[o], z_out, shape="col",
                                            shift_left_overflow="saturate")
        Clamp(act_min, 127)
        SaturatingCastToInt8

    i.e. ``y = clamp(RDBPOT(SRDHM(SHL(acc + bias, max(e, 0)), m), max(-e, 0)) + z_out,
    act_min, 127)``: TFLite's double-rounding requantisation (spec §2.5, §2.8) with
    gemmlowp's scalar-reference saturating left shift. ``act_min = max(z_out, -128)``
    with a fused ReLU (TFLite's ``CalculateActivationRangeQuantized``), else -128.

    The recipe derives ``(m, e)`` from the float32 scale ``r = fl32(fl32(s_in *
    w_scale[c]) / s_out)`` (correctly rounded, :func:`hwjax.core.div_rn`; XNNPACK's
    requantisation scale): ``r = f * 2**e`` with ``0.5 <= f < 1`` and ``m = f * 2**31``
    exactly (24 significant bits), so ``m * 2**(e - 31) == r``. ``e < -31`` gives ``m = 0,
    e = 0`` (QuantizeMultiplier's flush); ``e > 31`` saturates to ``m = 2**31 - 1, e = 31``.
    (TFLite derives ``m`` from a double quotient; the two can differ in the low bits.)

    Ops: ``dense``, ``conv`` (any stride and padding), ``maxpool`` (exact int8 maximum),
    ``avgpool`` (TFLite's reference int8 average pool: window sum, divided by the window
    size rounding half away from zero; gemmlowp itself has no pooling), and the generic
    ``quantize`` / ``flatten``. Accumulators wrap modulo 2**32 (gemmlowp's int32
    arithmetic) and never saturate; the saturation statistic is therefore always 0.
    """

    lhs_bits: int = 8
    rhs_bits: int = 8
    rounding: str = "auto"
    requantize: str = "auto"
    name: ClassVar[str] = "gemmlowp"

    def __post_init__(self):
        for field in ("lhs_bits", "rhs_bits"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgTypeError(f"{field} must be an int in [1, 8], got {v!r}")
            if not 1 <= int(v) <= 8:
                raise RangeError(f"{field} must lie in [1, 8], got {v}")
            object.__setattr__(self, field, int(v))
        if not isinstance(self.rounding, str) or self.rounding not in ROUNDINGS:
            raise RangeError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.rounding == "exact" and (self.lhs_bits, self.rhs_bits) != (8, 8):
            raise RangeError(
                f"rounding='exact' requires lhs_bits == rhs_bits == 8, got "
                f"lhs_bits={self.lhs_bits}, rhs_bits={self.rhs_bits}"
            )
        if not isinstance(self.requantize, str) or self.requantize not in REQUANTIZE:
            raise RangeError(f"requantize must be one of {REQUANTIZE}, got {self.requantize!r}")

    def requantizes(self, rows: int, cols: int) -> bool:
        """Whether a ``rows x cols`` GEMM (rows = output channels, cols = output pixels of
        one example) runs the requantized (< 8-bit) arithmetic on this target."""
        if (self.lhs_bits, self.rhs_bits) == (8, 8):
            return False
        return self.requantize == "always" or gl.is_requantization_worth_it(rows, cols)


# ------------------------------------------------------------------ linear ops


@pytree
@dataclass(frozen=True)
class GemmlowpLinearParams:
    """Integer parameters of one gemmlowp dense / conv layer (see :class:`Gemmlowp`).

    ``weights``: uint8 (O, K) LHS matrix (``w + 128``; conv K in (kh, kw, I) order);
    ``lhs_offset``, ``rhs_offset``: int32 scalars (the operands' negated zero points);
    ``bias``, ``multiplier``, ``exponent``: int32 (O,) output-stage vectors;
    ``out_offset`` (``z_out``), ``act_min``, ``act_max``: int32 scalars;
    ``kernel_shape`` (static): the portable kernel's shape.
    """

    weights: jax.Array
    lhs_offset: jax.Array
    rhs_offset: jax.Array
    bias: jax.Array
    multiplier: jax.Array
    exponent: jax.Array
    out_offset: jax.Array
    act_min: jax.Array
    act_max: jax.Array
    kernel_shape: tuple = static()

    def output_stages(self) -> tuple:
        """The gemmlowp output pipeline of this layer (rows are output channels)."""
        return (
            gl.BiasAddition(self.bias, shape="col"),
            gl.ScaleInt32ByFixedPointAndExponentPC(
                self.multiplier, self.exponent, self.out_offset, shape="col", shift_left_overflow="saturate"
            ),
            gl.Clamp(self.act_min, self.act_max),
            gl.SaturatingCastToInt8(),
        )


def quantize_multiplier(r) -> tuple[jax.Array, jax.Array]:
    """``(m, e)`` int32 with ``m * 2**(e - 31) == r`` exactly for float32 ``r > 0`` (``m`` in
    [2**30, 2**31)), ``(0, 0)`` for ``r == 0`` or ``e < -31``, ``(2**31 - 1, 31)`` for
    ``e > 31``. Jittable; no gradient."""
    r = jax.lax.stop_gradient(jnp.asarray(r, jnp.float32))
    f, e = jnp.frexp(r)
    m = jnp.ldexp(f, 31).astype(_I32)  # f has 24 significant bits: exact, below 2**31
    e = e.astype(_I32)
    flush = (r == 0) | (e < -31)
    big = e > 31
    m = jnp.where(flush, 0, jnp.where(big, _INT32_MAX, m)).astype(_I32)
    e = jnp.where(flush, 0, jnp.where(big, 31, e)).astype(_I32)
    return m, e


def _linear_params(op: str):
    def params(target, attrs, p, q_in, q_out) -> GemmlowpLinearParams:
        """The operand mapping and output pipeline of :class:`Gemmlowp` from the portable
        parameters (jittable)."""
        k = jnp.asarray(p["kernel"]).astype(_I32)
        weights = (k.reshape(k.shape[0], -1) + 128).astype(jnp.uint8)
        z_in = jnp.asarray(q_in[0].zero_point, _I32)
        z_out = jnp.asarray(q_out.zero_point, _I32)
        r = div_rn(
            jnp.asarray(q_in[0].scale, jnp.float32) * jnp.asarray(p["w_scale"], jnp.float32),
            jnp.asarray(q_out.scale, jnp.float32),
        )
        m, e = quantize_multiplier(jnp.broadcast_to(r, (k.shape[0],)))
        relu = attrs.get("activation") == "relu"
        act_min = jnp.maximum(z_out, -128) if relu else jnp.asarray(-128, _I32)
        return GemmlowpLinearParams(
            weights,
            jnp.asarray(-128, _I32),
            -(z_in + 128),
            jnp.asarray(p["bias"], _I32).reshape(k.shape[0]),
            m,
            e,
            z_out,
            act_min.astype(_I32),
            jnp.asarray(127, _I32),
            tuple(int(d) for d in k.shape),
        )

    return params


def _rmcf(x, numerator: int, denominator: int) -> jax.Array:
    return gl.rounding_multiply_by_constant_fraction(x, numerator, denominator)


def lt8_always(
    lhs, rhs, *, lhs_offset, rhs_offset, lhs_bits: int, rhs_bits: int, rounding: str, output_stages=()
) -> jax.Array:
    """gemmlowp's requantized GEMM (spec §3.5-§3.11) without the
    ``IsRequantizationWorthIt`` fallback: :func:`hwjax.gemmlowp.pack_lt8` operands, the
    exact product, and the four rescaled terms of §3.10::

        acc = wrap32( RMCF(P_L @ P_R, 65025, M_L*M_R) + RMCF(rowsum(P_L) * rhs_offset, 255, M_L)
                      + RMCF(colsum(P_R) * lhs_offset, 255, M_R) + lhs_offset * rhs_offset * K )

    then ``output_stages``. Equal to :func:`hwjax.gemmlowp.gemm_lt8` on every shape where
    gemmlowp requantizes. Scalar offsets."""
    pl, pr = gl.pack_lt8(lhs, rhs, lhs_bits=lhs_bits, rhs_bits=rhs_bits, rounding=rounding)
    ml, mr = 2**lhs_bits - 1, 2**rhs_bits - 1
    lo, ro = jnp.asarray(lhs_offset, _I32), jnp.asarray(rhs_offset, _I32)
    raw_xx = gl.gemm(pl, pr, lhs_offset=0, rhs_offset=0)
    row_sums = jnp.sum(pl.astype(_I32), axis=1, dtype=_I32)[:, None]
    col_sums = jnp.sum(pr.astype(_I32), axis=0, dtype=_I32)[None, :]
    acc = (
        _rmcf(raw_xx, 255 * 255, ml * mr)
        + _rmcf(row_sums * ro, 255, ml)
        + _rmcf(col_sums * lo, 255, mr)
        + lo * ro * _I32(lhs.shape[1])
    )
    return gl.apply_output_stages(acc, output_stages)


def _gemm(target: Gemmlowp, params: GemmlowpLinearParams, rhs) -> jax.Array:
    """One example's GEMM and output pipeline: (O, cols) int8."""
    lhs = params.weights
    common = dict(
        lhs_offset=params.lhs_offset,
        rhs_offset=params.rhs_offset,
        lhs_bits=target.lhs_bits,
        rhs_bits=target.rhs_bits,
        rounding=target.rounding,
        output_stages=params.output_stages(),
    )
    rows, cols = lhs.shape[0], rhs.shape[1]
    if target.requantizes(rows, cols) and not gl.is_requantization_worth_it(rows, cols):  # "always" only
        return lt8_always(lhs, rhs, **common)
    return gl.gemm_lt8(lhs, rhs, **common)


def _linear_run(op: str):
    def run(target, attrs, params: GemmlowpLinearParams, x, return_acc: bool = False):
        """Per example: the RHS (dense: the input column; conv: the transposed im2col
        patches, padded taps reading the zero point), then :func:`hwjax.gemmlowp.gemm_lt8`
        (or :func:`lt8_always` with ``requantize="always"``) with the layer's pipeline."""
        x = jnp.asarray(x).astype(_I32)
        xu = (x + 128).astype(jnp.uint8)
        if op == "dense":
            rhs = xu[:, :, None]  # (B, K, 1)
        else:
            geom = geometry(attrs, x.shape)
            patches = extract_patches(xu, geom, pad_value=-params.rhs_offset)  # (B, OH, OW, K)
            rhs = jnp.swapaxes(patches.reshape(x.shape[0], -1, patches.shape[-1]), 1, 2)  # (B, K, OH*OW)
        y = jax.vmap(lambda r: _gemm(target, params, r))(rhs).astype(_I32)  # (B, O, cols)
        y = y[:, :, 0] if op == "dense" else jnp.swapaxes(y, 1, 2).reshape(*patches.shape[:3], -1)
        if not return_acc:
            return y
        return y, {"count": jnp.int32(y.size), "saturated": jnp.int32(0)}  # int32 wraps, never saturates

    return run


_STAGE_NAMES = ("BiasAddition", "ScaleInt32ByFixedPointAndExponentPC", "Clamp", "SaturatingCastToInt8")


def _linear_export(op: str):
    def export(target, attrs, params: GemmlowpLinearParams):
        """``weights``: the uint8 (O, K) LHS matrix, row-major (``w + 128``); ``bias``: int32
        (O,). Meta: the operand offsets, ``kernel_shape`` and the output pipeline (stage
        names and parameters, per-channel vectors as lists)."""
        meta = {
            "kernel_shape": list(params.kernel_shape),
            "lhs_offset": int(params.lhs_offset),
            "rhs_offset": int(params.rhs_offset),
            "output_stages": [
                {"stage": "BiasAddition", "shape": "col", "bias": "the bias tensor"},
                {
                    "stage": "ScaleInt32ByFixedPointAndExponentPC",
                    "shape": "col",
                    "shift_left_overflow": "saturate",
                    "result_fixedpoint_multiplier": np.asarray(params.multiplier, np.int64).tolist(),
                    "result_exponent": np.asarray(params.exponent, np.int64).tolist(),
                    "result_offset_after_shift": int(params.out_offset),
                },
                {"stage": "Clamp", "min": int(params.act_min), "max": int(params.act_max)},
                {"stage": "SaturatingCastToInt8"},
            ],
        }
        return {"weights": np.asarray(params.weights, np.uint8), "bias": np.asarray(params.bias, np.int32)}, meta

    return export


def _int(v, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FormatError(f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _int_list(v, n: int, lo: int, hi: int, what: str) -> np.ndarray:
    if not isinstance(v, list) or len(v) != n:
        raise FormatError(f"{what} must be a list of {n} integers, got {v!r}")
    return np.asarray([_int(i, lo, hi, what) for i in v], np.int32)


def _linear_load(op: str):
    def load(target, attrs, tensors, meta) -> GemmlowpLinearParams:
        shape = tuple(int(d) for d in meta["kernel_shape"])
        if len(shape) != (2 if op == "dense" else 4) or min(shape) < 1:
            raise FormatError(f"kernel_shape {list(shape)} does not fit a {op} kernel")
        o, k = shape[0], int(np.prod(shape[1:]))
        w = np.asarray(tensors["weights"])
        if w.dtype != np.uint8 or w.shape != (o, k):
            raise FormatError(f"weights must be uint8 of shape {(o, k)}, got {w.dtype}{list(w.shape)}")
        b = np.asarray(tensors["bias"])
        if b.dtype != np.int32 or b.shape != (o,):
            raise FormatError(f"bias must be int32 of shape {(o,)}, got {b.dtype}{list(b.shape)}")
        st = meta["output_stages"]
        if not isinstance(st, list) or [s.get("stage") if isinstance(s, dict) else None for s in st] != list(
            _STAGE_NAMES
        ):
            raise FormatError(f"output_stages must be the pipeline {list(_STAGE_NAMES)}")
        if st[0].get("shape") != "col" or st[1].get("shape") != "col" or st[1].get("shift_left_overflow") != "saturate":
            raise FormatError(
                "the gemmlowp target's stages are column-shaped (per output channel) with a saturating left shift"
            )
        i32 = (-(2**31), _INT32_MAX)
        m = _int_list(st[1]["result_fixedpoint_multiplier"], o, *i32, "result_fixedpoint_multiplier")
        e = _int_list(st[1]["result_exponent"], o, -31, 31, "result_exponent")
        return GemmlowpLinearParams(
            jnp.asarray(w),
            jnp.int32(_int(meta["lhs_offset"], -255, 0, "lhs_offset")),
            jnp.int32(_int(meta["rhs_offset"], -255, 0, "rhs_offset")),
            jnp.asarray(b),
            jnp.asarray(m),
            jnp.asarray(e),
            jnp.int32(_int(st[1]["result_offset_after_shift"], *i32, "result_offset_after_shift")),
            jnp.int32(_int(st[2]["min"], -128, 127, "Clamp min")),
            jnp.int32(_int(st[2]["max"], -128, 127, "Clamp max")),
            shape,
        )

    return load


for _op in ("conv", "dense"):
    Gemmlowp.implements(_op, params=_linear_params(_op), export=_linear_export(_op), load=_linear_load(_op))(
        _linear_run(_op)
    )


# ----------------------------------------------------------------------- pools


@Gemmlowp.implements("maxpool")
def _maxpool(target, attrs, params, x, return_acc: bool = False):
    """The exact int8 maximum over each VALID window."""
    x = jnp.asarray(x).astype(_I32)
    taps = window_taps(x, pool_geometry(attrs, x.shape), pad_value=-128)
    y = taps[0]
    for t in taps[1:]:
        y = jnp.maximum(y, t)
    return no_acc(y, return_acc)


@Gemmlowp.implements("avgpool")
def _avgpool(target, attrs, params, x, return_acc: bool = False):
    """TFLite's reference int8 ``AveragePool`` (``reference_integer_ops/pooling.h``) on a
    VALID window of ``n`` taps: ``s = sum``, ``y = (s + n//2) / n`` for ``s > 0`` and
    ``(s - n//2) / n`` otherwise (C division, toward zero: half away from zero), clamped
    to [-128, 127]. The output keeps the input's quantisation."""
    x = jnp.asarray(x).astype(_I32)
    taps = window_taps(x, pool_geometry(attrs, x.shape), pad_value=0)
    s = taps[0]
    for t in taps[1:]:
        s = s + t
    n = len(taps)
    y = jnp.sign(s) * ((jnp.abs(s) + _I32(n // 2)) // _I32(n))
    return no_acc(jnp.clip(y, -128, 127).astype(_I32), return_acc)


register("gemmlowp", Gemmlowp)

__all__ = ["Gemmlowp", "GemmlowpLinearParams", "lt8_always", "quantize_multiplier"]
