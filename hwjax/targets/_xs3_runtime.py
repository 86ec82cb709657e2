"""The xcore.ai runtime of xformer-converted files: XC ops on the XS3 VPU, builtins as TFLM.

:class:`XS3Runtime` (registered as ``"xs3-tflm"``; ``Model.run(x, runtime="xs3")``) runs
what lib_tflite_micro runs on an xformer-converted ``.tflite`` file (deployed.md §3):
the ``xc_*`` op kinds of :mod:`hwjax.graph.ops.xcore` with the exact lib_nn kernels of
:mod:`hwjax.xs3` (``variant`` selects the VPU model: ``"host"`` = the x86 host
interpreter of xmos-ai-tools 1.4.2, ``"hardware"`` = the chip), and every builtin
operator xformer left in place with TFLite Micro's reference arithmetic, inherited from
:class:`hwjax.targets.TFLite` ``("tflm")``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax import xs3
from hwjax.core import mul_rn
from hwjax.errors import RangeError
from hwjax.graph.ops.xcore import xc_conv2d_out_hw
from hwjax.targets._base import Target, no_acc, pytree, register, static
from hwjax.targets._tflite import TFLite


_I32 = jnp.int32


@dataclass(frozen=True)
class XS3Runtime(TFLite):
    """lib_tflite_micro on xcore.ai: XC ops on the XS3 VPU, builtins as TFLM reference kernels.

    ``variant``: the VPU model of the XC kernels (:data:`hwjax.xs3.VARIANTS`): ``"host"``
    (default; bit-equal to ``TFLMHostInterpreter`` of xmos-ai-tools 1.4.2, verified) or
    ``"hardware"`` (the chip: differs from ``"host"`` only in ``otfn_int8``'s final
    shift, xs3.md §4.1). ``runtime`` is always ``"tflm"``, and its builtins run as the
    TFLM of xmos-ai-tools 1.4.2 (``tflm="xmos-1.4.2"``).
    """

    runtime: str = "tflm"
    tflm: str = "xmos-1.4.2"
    variant: str = "host"
    name: ClassVar[str] = "xs3-tflm"
    #: op kinds with an XS3 implementation of their own (not TFLM's)
    native: ClassVar[frozenset] = frozenset()

    def __post_init__(self):
        if self.runtime != "tflm":
            raise RangeError(f"XS3Runtime runs builtins as TFLM does: runtime must be 'tflm', got {self.runtime!r}")
        super().__post_init__()
        if self.variant not in xs3.VARIANTS:
            raise RangeError(f"variant must be one of {xs3.VARIANTS}, got {self.variant!r}")

    def lowering(self, op: str):
        """Op kinds this class implements itself run their XS3 lowering; the others are
        TFLite's, on runtime ``"tflm"`` (with its per-runtime verification)."""
        if op in type(self).native:
            return Target.lowering(self, op)
        return super().lowering(op)


def _stored(target, attrs, portable, q_in, q_out):
    """XC nodes carry the file's integer parameters: lowering keeps them."""
    return portable


def _per_example(x: jax.Array) -> jax.Array:
    """(B, ...) -> (B, N): each example's values in row-major (memory) order."""
    return x.reshape(x.shape[0], -1)


def _shaped(y: jax.Array, attrs) -> jax.Array:
    shape = (y.shape[0], *attrs["out_shape"])
    return y.astype(_I32) if y.shape == shape else y.astype(_I32).reshape(shape)


# ------------------------------------------------------------------------ XC_conv2d_v2


@XS3Runtime.implements("xc_conv2d", params=_stored)
def _xc_conv2d(target, attrs, p, x, return_acc: bool = False):
    """VALID convolution: ``hwjax.xs3.conv2d`` (direct and indirect kernels accumulate the
    same 32-byte chunks of the patch) or ``hwjax.xs3.depthwise_conv2d``, then otfn_int8."""
    ohw = xc_conv2d_out_hw(attrs["in_shape"], attrs["kernel_size"], attrs["stride"], attrs["dilation"])
    x = x.reshape(x.shape[0], *attrs["in_shape"])  # fully connected: the input as one pixel
    common = dict(
        initial_shift=attrs["initial_shift"],
        final_shr=attrs["final_shr"],
        stride=attrs["stride"],
        pad_top_left=(0, 0),
        pad_value=0,
        out_shape=ohw,
        variant=target.variant,
    )
    kernel = xs3.depthwise_conv2d if attrs["kernel_type"] == "depthwise" else xs3.conv2d
    y, acc = kernel(
        x,
        p["kernel"],
        p["multipliers"],
        p["biases"],
        dilation=attrs["dilation"],
        return_accumulators=True,
        **common,
    )
    if attrs.get("transform", "group") == "channelwise":  # same accumulators, the §4.2 transform
        y = xs3.otfn_int8_channelwise(
            acc, p["shifts"], p["multipliers"], p["biases"], final_shr=attrs["final_shr"], variant=target.variant
        )
    return no_acc(_shaped(y, attrs), return_acc)


# ------------------------------------------------------------------ byte-moving ops


@functools.lru_cache(maxsize=None)
def _pad_index(start: int, pad: int, length: int, copies: int, end: int) -> np.ndarray:
    """Source byte of every output byte of ``XC_pad`` (-1: the pad value)."""
    parts = [np.full(start, -1)]
    for i in range(copies + 1):
        parts.append(np.arange(i * length, (i + 1) * length))
        parts.append(np.full(pad if i < copies else end, -1))
    return np.concatenate(parts).astype(np.int32)


@XS3Runtime.implements("xc_pad", params=_stored)
def _xc_pad(target, attrs, p, x, return_acc: bool = False):
    idx = _pad_index(attrs["start"], attrs["pad"], attrs["length"], attrs["copies"], attrs["end"])
    src = jnp.take(_per_example(x), jnp.asarray(np.maximum(idx, 0)), axis=1)
    y = jnp.where(jnp.asarray(idx >= 0), src, attrs["value"])
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_pad_3_to_4", params=_stored)
@XS3Runtime.implements("xc_pad_1_to_4", params=_stored)
def _xc_pad_to_4(target, attrs, p, x, return_acc: bool = False):
    """Pixels padded to 4 channels with the byte ``value``."""
    y = jnp.concatenate([x, jnp.full((*x.shape[:-1], 4 - x.shape[-1]), attrs["value"], x.dtype)], axis=-1)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_slice", params=_stored)
def _xc_slice(target, attrs, p, x, return_acc: bool = False):
    s, o, n, l = attrs["start"], attrs["stride"], attrs["copies"], attrs["length"]
    idx = (s + o * np.arange(n)[:, None] + np.arange(l)[None, :]).reshape(-1)
    y = jnp.take(_per_example(x), jnp.asarray(idx, jnp.int32), axis=1)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("reshape")
def _reshape(target, attrs, p, x, return_acc: bool = False):
    """Row-major reshape (``XC_no_op``, TFLite ``RESHAPE``): the bytes do not move."""
    return no_acc(x.reshape(x.shape[0], *attrs["shape"]), return_acc)


# ------------------------------------------------------------------- arithmetic ops


@XS3Runtime.implements("xc_lookup", params=_stored)
def _xc_lookup(target, attrs, p, x, return_acc: bool = False):
    """``y = table[u8(x)]`` (lookup8, xs3.md §6.6)."""
    y = jnp.take(jnp.asarray(p["table"], _I32), x.astype(_I32) & 0xFF, axis=0)
    return no_acc(_shaped(y, attrs), return_acc)


def binary_operands(attrs, p, xs) -> tuple[jax.Array, jax.Array]:
    """The two operands of an ``xc_add`` / ``xc_mul`` node: its two inputs, or its input
    and the constant ``p["value"]`` (the same for every example) in the place
    ``attrs["const_index"]``."""
    k = attrs.get("const_index")
    if k is None:
        return tuple(xs)
    (x,) = xs
    c = jnp.broadcast_to(jnp.asarray(p["value"]).astype(x.dtype), x.shape)
    return (c, x) if k == 0 else (x, c)


@XS3Runtime.implements("xc_add", params=_stored)
def _xc_add(target, attrs, p, *xs, return_acc: bool = False):
    """``add_elementwise`` (xs3.md §6.4) over an example's values, one call:
    :func:`hwjax.xs3.add_per_example`."""
    x1, x2 = binary_operands(attrs, p, xs)
    y = xs3.add_per_example(
        x1,
        x2,
        multiplier0=attrs["multiplier1"],
        multiplier1=attrs["multiplier2"],
        bias=attrs["bias"],
        shift=attrs["shift"],
        variant=target.variant,
    )
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_mean", params=_stored)
def _xc_mean(target, attrs, p, x, return_acc: bool = False):
    """Float32 mean (deployed.md §2): ``S`` the exact int32 sum over the reduced axis, then
    ``clamp(round(fl32(fl32(S - zi*n) * scale) + zo), -128, 127)`` (each float32 operation
    rounded: the product by :func:`hwjax.core.mul_rn`, never fused into an FMA; ``round``
    ties away from zero: :func:`mean_f32`)."""
    y = mean_f32(
        x,
        attrs["outer"],
        attrs["reduced"],
        attrs["inner"],
        attrs["in_zero_point"],
        attrs["out_zero_point"],
        attrs["scale"],
    )
    return no_acc(_shaped(y, attrs), return_acc)


def mean_f32(x, outer: int, n: int, inner: int, zi, zo, scale) -> jax.Array:
    """lib_nn's float32 mean of ``x`` (B, ...) viewed as (B, outer, n, inner) over axis 2:
    ``clamp(round(fl32(fl32(S - zi*n) * scale) + zo), -128, 127)``, ``S`` the int32 sum,
    ``round`` C's ``roundf``: ties away from zero (XNNPACK's MEAN, otherwise the same
    formula, ties to even: a sum of 140 at scale fl32(1/56) gives 2.5, 3 on xcore.ai and 2
    in XNNPACK; tests/data/randgraph_xs3/regress_mean_tie_away); ``zi``, ``zo``, ``scale``
    float32 values (traced or not). Returns int32 (B, outer, inner)."""
    s = x.astype(_I32).reshape(x.shape[0], outer, n, inner).sum(axis=2, dtype=_I32)
    f32 = jnp.float32
    centred = s.astype(f32) - jnp.asarray(zi, f32) * f32(n)  # exact: |values| < 2**24
    # the product rounded before the addition in any program (an optimisation barrier does
    # not keep XLA:CPU from contracting them into a fused multiply-add: seed 1148 of the
    # random-graph probe, 88.5 - 110 = -21.5 rounding to -22, gave -21.499997 and -21)
    prod = mul_rn(centred, jnp.asarray(scale, f32))
    v = jax.lax.round(prod + jnp.asarray(zo, f32), jax.lax.RoundingMethod.AWAY_FROM_ZERO)  # exact
    return jnp.clip(v, -128, 127).astype(_I32)


@XS3Runtime.implements("xc_maxpool2d", params=_stored)
def _xc_maxpool2d(target, attrs, p, x, return_acc: bool = False):
    """Per channel the maximum over each VALID window (the kernel starts at -128, which
    every int8 value reaches or exceeds)."""
    (kh, kw), (sr, sc) = attrs["window"], attrs["stride"]
    y = jax.lax.reduce_window(x.astype(_I32), jnp.int32(-128), jax.lax.max, (1, kh, kw, 1), (1, sr, sc, 1), "VALID")
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_concat", params=_stored)
def _xc_concat(target, attrs, p, *xs, return_acc: bool = False):
    """``XC_concat``: row ``j`` of the output is row ``j`` of every input in turn (bytes)."""
    n = attrs["copies"]
    y = jnp.concatenate([x.astype(_I32).reshape(x.shape[0], n, s) for x, s in zip(xs, attrs["sizes"])], axis=2)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_mul", params=_stored)
def _xc_mul(target, attrs, p, *xs, return_acc: bool = False):
    """lib_nn's ``mul_elementwise_ref`` (the host build's kernel), in int32 (no step can
    overflow: ``|acc| <= 2**16``, ``|scalar * v| < 2**31``)."""
    x1, x2 = binary_operands(attrs, p, xs)
    z1, z2 = (jnp.asarray(attrs[k], _I32) for k in ("in1_zero_point", "in2_zero_point"))
    a, c = x1.astype(_I32), x2.astype(_I32)
    acc = z2 * a + z1 * c + a * c + z1 * z2 + a + c + z1 + z2
    v = (acc + 1) >> 1
    v = (jnp.asarray(attrs["scalar"], _I32) * v + (1 << 13)) >> 14
    v = jnp.clip(v + jnp.asarray(attrs["bias"], _I32), -32767, 32767)
    shr = jnp.asarray(attrs["vlashr_shr"], _I32)
    v = jnp.clip(jnp.where(shr > 0, v >> jnp.maximum(shr, 0), v << jnp.maximum(-shr, 0)), -32767, 32767)
    y = jnp.clip((v + 128) >> 8, -128, 127)
    return no_acc(_shaped(y, attrs), return_acc)


@pytree
@dataclass(frozen=True)
class SoftmaxTable:
    """Whether an ``XC_softmax`` table can meet float32 subnormals (known at lowering,
    static): an entry below 2**-126, or a row sum above 2**126 (whose reciprocal is
    subnormal). XLA flushes subnormals to zero (on CPU, inputs and results), where the host
    interpreter computes them; such a table takes :func:`softmax_rows_subnormal`, which
    does no float operation on a subnormal value."""

    subnormals: bool = static()


def softmax_table_form(table, row_size: int):
    """The :class:`SoftmaxTable` marker of a concrete ``table`` (NumPy does not flush
    subnormals) for rows of ``row_size`` values; None for a traced table (the run then takes
    the subnormal-safe form)."""
    if isinstance(table, jax.core.Tracer):
        return None
    t = np.asarray(table, np.float32)
    finite = t[np.isfinite(t)]
    tiny = bool(np.any((finite != 0) & (np.abs(finite) < np.finfo(np.float32).tiny)))
    big = finite.size > 0 and float(finite.max()) * row_size >= 2.0**126
    return SoftmaxTable(subnormals=tiny or bool(big))


def softmax_lowered(table, row_size: int) -> dict:
    """An ``XC_softmax`` table's lowered parameters: ``table``, its :class:`SoftmaxTable`
    marker where it is concrete, and, where that says subnormals, its bits as int32
    (``bits``: the subnormal-safe form reads them as integers, never as floats)."""
    form = softmax_table_form(table, row_size)
    if form is None:
        return {"table": table}
    extra = {"bits": np.asarray(table, np.float32).view(np.int32)} if form.subnormals else {}
    return {"table": table, "form": form, **extra}


def _softmax_params(target, attrs, portable, q_in, q_out):
    n = attrs.get("row_size") or int(np.prod(attrs["out_shape"]))
    return {**portable, **softmax_lowered(portable["table"], n)}


@XS3Runtime.implements("xc_softmax", params=_softmax_params, host_params=_softmax_params)
def _xc_softmax(target, attrs, p, x, return_acc: bool = False):
    """lib_nn's float32 softmax over every value of an example (with ``row_size``, over each
    row of that many values: ``XC_batched_softmax``), as lib_tflite_micro runs it
    with one thread (xformer's default ``--xcore-thread-count=1``; more threads would sum
    in parts): the sum in element order (one rounding per addition), ``inv = fl32(1 / S)
    * 256``, then ``roundf(fl32(e * inv)) - 128`` with ``roundf`` ties away from zero and
    the conversion to int8 saturating: a dominant class whose ``roundf`` gives 256 reads
    127 (observed on xmos-ai-tools 1.4.2's host interpreter: MLPerf Tiny's KWS and
    streaming-wakeword models). The table is not shifted by the row's maximum: where an
    entry overflows to inf (a large input scale), the sum is inf, ``inv`` 0 and that entry's
    product NaN, which reads 0 (the others -128; observed on the host interpreter:
    tests/data/randgraph_xs3/regress_softmax_exp_overflow); an infinite product (``inv``
    inf) reads 127. The host computes with float32 subnormals: a table that can meet them
    (:class:`SoftmaxTable`) takes :func:`softmax_rows_subnormal`. The product feeds no
    addition, so XLA has nothing to contract it with into a fused multiply-add."""
    f32 = jnp.float32
    rows = _per_example(x)
    if attrs.get("row_size") is not None:  # XC_batched_softmax: every row on its own
        rows = rows.reshape(-1, attrs["row_size"])
    idx = rows.astype(_I32) + 128
    form = p.get("form")
    if form is None or form.subnormals:
        bits = p["bits"] if "bits" in p else jax.lax.bitcast_convert_type(jnp.asarray(p["table"], f32), _I32)
        y = softmax_rows_subnormal(jnp.take(jnp.asarray(bits, _I32), idx, axis=0))
    else:
        e = jnp.take(jnp.asarray(p["table"], f32), idx, axis=0)
        total = jax.lax.fori_loop(1, e.shape[1], lambda i, t: t + e[:, i], e[:, 0])  # in order, no reassociation
        inv = f32(1.0) / total
        inv = inv * f32(256.0)  # exact (a power of two)
        y = _softmax_round(e * inv[:, None])
    return no_acc(_shaped(y.reshape(x.shape[0], -1), attrs), return_acc)


def _softmax_round(prod):
    """``sat8(roundf(prod) - 128)`` as lib_nn converts it: ``roundf`` as its floor plus 1
    from ``t + 1/2`` on (the product only feeds the floor and comparisons, so no addition
    can be contracted with it); NaN (``inf * 0``) reads 0 and inf 127, as the host's
    float-to-int8 conversion gives them."""
    f32 = jnp.float32
    finite = jnp.where(jnp.isfinite(prod), prod, f32(0))
    t = jnp.floor(finite)
    r = t + (finite >= t + f32(0.5)).astype(f32)
    y = jnp.clip(r.astype(_I32) - 128, -128, 127)  # r in [0, 256]: only 256 saturates
    return jnp.where(jnp.isnan(prod), 0, jnp.where(jnp.isinf(prod), 127, y))


def _float_parts(bits):
    """``(E, M)`` of non-negative float32 values given as int32 bits: value ``M * 2**(E -
    150)`` with ``M`` in [2**23, 2**24) for every nonzero finite value, subnormals
    renormalised in integers (``E`` then below 1); ``E`` is the biased exponent of a
    normal value."""
    e, m = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    lz = jax.lax.clz(jnp.maximum(m, 1)) - 8  # a subnormal's shift that brings its top bit to bit 23
    return jnp.where(e == 0, 1 - lz, e), jnp.where(e == 0, m << lz, m | 0x800000)


def softmax_rows_subnormal(b: jax.Array) -> jax.Array:
    """:func:`_xc_softmax`'s int8 values for rows (R, n) of float32 table entries (>= 0,
    possibly subnormal or inf) given as their int32 bits ``b``, computed as the host does
    with float32 subnormals but without a float operation on a subnormal value (XLA
    flushes them, and LLVM turns a test of a float's bits for zero into a float comparison,
    which a flushed subnormal passes: the entries come in as integers):

    * each row is scaled by the power of two ``2**K`` that brings its maximum to [1, 2),
      on the bits (exact; entries that would fall below 2**-126 there are dropped: they are
      below 2**-126 of the maximum, so every sum that meets one rounds as without it, and
      their products round to 0). The in-order sum of the scaled row is the host's sum
      times ``2**K``; the host's sum overflows to inf where the scaled one reaches
      ``2**(128 + K)``.
    * ``fl(1/S) * 256`` is ``2**K fl(1/S') * 256`` (the reciprocal of the scaled sum ``S'``
      scaled back, inf where that leaves float32). Where ``S >= 2**126`` the host's
      reciprocal is subnormal, ``RNE(2**149 / S) * 2**-149``: the integer quotient of
      ``2**k`` by ``S``'s 24-bit significand, rounded to nearest even from the exact int32
      remainder, then scaled by 2**-141 on the exponent bits.
    * products ``e * inv`` as ``e' * fl(1/S') * 256`` (the scalings cancel), or ``e * inv``
      with the subnormal reciprocal (a product too small to count rounds to 0 either way).
    """
    f32, i32 = jnp.float32, jnp.int32
    e = jax.lax.bitcast_convert_type(b, f32)  # read only where the host's reciprocal is subnormal
    bmax = jnp.max(b, axis=1)  # non-negative floats order as their bits, subnormals included
    has_inf = bmax >= 0x7F800000
    zero_row = bmax == 0
    emax, _ = _float_parts(bmax)
    k = jnp.where(has_inf | zero_row, 0, 127 - emax)[:, None]
    ee, mm = _float_parts(b)
    ek = ee + k
    scaled = jax.lax.bitcast_convert_type((jnp.clip(ek, 1, 254) << 23) | (mm & 0x7FFFFF), f32)
    zero = (b & 0x7FFFFFFF) == 0
    es = jnp.where(zero | (ek < 1), f32(0), scaled)
    s1 = jax.lax.fori_loop(1, es.shape[1], lambda i, t: t + es[:, i], es[:, 0])  # in order
    k1 = k[:, 0]
    threshold = jax.lax.bitcast_convert_type(jnp.clip(255 + k1, 1, 255) << 23, f32)  # 2**(128 + K) (inf for K >= 0)
    s_inf = has_inf | ((k1 < 0) & (s1 >= threshold))
    r1 = f32(1.0) / jnp.where(zero_row | s_inf, f32(1), s1)
    w = r1 * f32(256.0)  # exact
    er = ((jax.lax.bitcast_convert_type(r1, i32) >> 23) & 0xFF) - 127  # fl(1/S) = 2**(er + K) * 1.x
    inv_inf = zero_row | (er + k1 + 8 >= 128)
    # the host's sum S = S' 2**-K, where S >= 2**126: its reciprocal is subnormal
    es1, ms1 = _float_parts(jax.lax.bitcast_convert_type(s1, i32))
    e_s = es1 - k1
    sub = ~(s_inf | zero_row) & (e_s >= 253)
    kq = jnp.where(e_s == 253, f32(2.0**46), f32(2.0**45))  # 2**149 / S = 2**(299 - E_S) / M
    m = jnp.where(sub, ms1, 1 << 23)
    n = jnp.floor(kq / m.astype(f32)).astype(i32)  # within 1 of the quotient (< 2**24)
    rem = -(n * m)  # 2**k - n m: 2**k is 0 modulo 2**32 and |2**k - n m| < 2**31 (int32 wraps)
    for _ in range(2):
        n, rem = jnp.where(rem < 0, n - 1, n), jnp.where(rem < 0, rem + m, rem)
        n, rem = jnp.where(rem >= m, n + 1, n), jnp.where(rem >= m, rem - m, rem)
    n = n + ((2 * rem > m) | ((2 * rem == m) & ((n & 1) == 1))).astype(i32)  # to nearest, ties to even
    # n 2**-149 * 256 = n 2**-141, normal (n >= 2**21), made on the bits: XLA would fold two
    # constant factors into one, 2**-141, which it flushes to zero
    nb = jax.lax.bitcast_convert_type(n.astype(f32), i32)
    inv_sub = jax.lax.bitcast_convert_type(nb - (141 << 23), f32)
    prod = jnp.where(sub[:, None], e * inv_sub[:, None], es * w[:, None])
    y = _softmax_round(prod)
    y = jnp.where(inv_inf[:, None], jnp.where(zero, 0, 127), y)
    return jnp.where(s_inf[:, None], jnp.where(b >= 0x7F800000, 0, -128), y)


XS3Runtime.native = frozenset(XS3Runtime._impls) - frozenset(TFLite._impls) | {"reshape"}
register("xs3-tflm", XS3Runtime)
