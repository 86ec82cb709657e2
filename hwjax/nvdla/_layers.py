"""NVDLA INT8 layer kernels composed from the package's convertors (spec nvdla.md §5, §6.7).

What runs where (``nv_full``, INT8 processing precision):

* **Convolution** (:func:`conv2d_int8`): the CMAC multiplies int8 data by int8 weights and
  the CACC accumulates the products exactly (48-bit assembly), then delivers
  ``sat32(rshift_rhaz(sum, CLIP_TRUNCATE))`` to the SDP; the SDP's X1 stage
  (:func:`sdp_x1`) adds the per-channel bias, multiplies by the per-channel scale and
  converts the result to int8.
* **Depthwise convolution** (:func:`depthwise_conv2d_int8`): NVDLA has no depthwise mode.
  NVIDIA's compiler runs a grouped convolution as an ordinary one whose kernel is padded
  with zeros for the other groups' channels (``squashWeightGroups`` in
  ``umd/core/src/compiler/engine-ast/ConvCoreNode.cpp`` of ``nvdla/sw``); the zero
  products leave the exact CACC sums unchanged, so each output channel is the exact int32
  per-channel convolution, followed by the same SDP X1 pipeline per channel.
* **Element-wise add** (:func:`sdp_add_int8`): the first tensor is the SDP's main input,
  scaled by the X1 multiplier; the second is the element-wise operand of the Y (EW) unit's
  ALU, read through its operand convertor; then the SDP output convertor.
* **Pooling** (:func:`pdp_avgpool_int8`, :func:`pdp_maxpool_int8`): the PDP, int8 in,
  int8 out (no precision conversion, spec §5.3).

Notation as in the spec: ``sat_n`` clamps to n-bit two's complement, ``rshift_rhaz(v, s)``
divides by ``2**s`` rounding half away from zero. All arithmetic is exact integer
arithmetic (two-word integers from :mod:`hwjax.core.wide` where it exceeds 32 bits), so
results do not depend on ``jax_enable_x64``; the convolutions' int8 x int8 products are
summed exactly by :func:`hwjax.core.int_dot` (an integer dot on CPU, exact float32
pieces on GPU; never a rounding float matmul). Every
function is jittable and vmappable; register values that are arrays may be traced (their
ranges are then the caller's contract; concrete values are checked). Integer inputs
only: these kernels have no float/gradient path.

Where the spec is silent the semantics come from NVIDIA's C model (``nvdla/hw``, branch
``nvdlav1``, commit 8e06b1b9): the X stage from ``cmod/hls/sdp/sdp_x.cpp`` (with the
type widths of ``cmod/hls/sdp/sdp.h`` and the shifts of ``cmod/hls/include/nvdla_int.h``),
the Y stage from ``cmod/hls/sdp/sdp_y_core.cpp`` / ``sdp_y_cvt.cpp`` / ``sdp_y.cpp``, the
stage order from ``cmod/hls_wrapper/sdp_hls_wrapper.cpp`` (``sdp``), the int8 operand
read from ``cmod/sdp/NV_NVDLA_sdp.cpp``, the CACC delivery from
``cmod/cacc/NV_NVDLA_cacc.cpp``, the pooling from ``cmod/pdp/NV_NVDLA_pdp.cpp``
(``LineOperation``, ``PoolingStage0Calc``, ``PoolingStage1Calc``) and the register widths
from ``cmod/include/arnvdla.h``; the PDP reciprocals the firmware programs from
``kmd/firmware/pdp.c`` of ``nvdla/sw``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import ConvGeometry, extract_patches, int_dot, shift_right, wide, window_taps
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nvdla._cvt import cvt, sign_extend

__all__ = [
    "ALU_ALGOS",
    "MAX_CONV_PRODUCTS",
    "conv2d_int8",
    "depthwise_conv2d_int8",
    "pdp_avgpool_int8",
    "pdp_maxpool_int8",
    "pdp_recip_kernel",
    "sdp_add_int8",
    "sdp_x",
    "sdp_x1",
]

_I32 = jnp.int32
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I16_MIN, _I16_MAX = -(2**15), 2**15 - 1

ALU_ALGOS = ("sum", "max", "min")
"""X1/X2 ALU algorithms (``BS_ALU_ALGO``/``BN_ALU_ALGO``): operand added, or max/min taken."""

MAX_CONV_PRODUCTS = 131071
"""Most int8 x int8 products per output (``kh * kw * C_in``) whose sum provably fits int32
(``131071 * 128 * 128 < 2**31``); larger kernels are rejected."""

_PDP_MAX_KERNEL = 8  # the firmware's kernel table (1..8) and the RTL's 14-bit int8 window sum
_PDP_MAX_STRIDE = 16  # 4-bit KERNEL_STRIDE_* fields (value - 1)
_PDP_MAX_PAD = 7  # 3-bit PAD_* fields
_PDP_RECIP_MAX = 2**17 - 1  # 17-bit RECIP_KERNEL_* fields
_CACC_MAX_TRUNCATE = 16  # C model: truncate + 32 must not exceed the 48-bit assembly width


# ------------------------------------------------------------------------ validation


def _int_array(x: Any, lo: int, hi: int, name: str, what: str) -> jax.Array:
    """An integer array (at most 32 bits; its dtype kept: the kernels cast inside ``jit``),
    concrete values checked against [lo, hi]."""
    a = V.as_array(x, name)
    if V.kind(a, name) != "int":
        raise ArgTypeError(
            f"{name} must be an integer array of {what} values (these NVDLA kernels take "
            f"integers only), got dtype {a.dtype}"
        )
    V.check_range(a, lo, hi, f"{name} ({what})")
    return a


def _int8_array(x: Any, name: str) -> jax.Array:
    return _int_array(x, -128, 127, name, "int8")


def _i32(tree):
    """Every array leaf of ``tree`` as int32 (inside the kernels)."""
    return jax.tree.map(lambda a: a.astype(_I32), tree)


def _register(v: Any, lo: int, hi: int, name: str) -> jax.Array:
    """A per-layer register value: an integer scalar (may be traced)."""
    return V.int_scalar(v, lo, hi, name)


def _per_channel(v: Any, lo: int, hi: int, name: str, channels: int) -> jax.Array:
    """A per-layer (scalar) or per-channel ((C,)) operand as int32."""
    a = _int_array(v, lo, hi, name, f"[{lo}, {hi}]")
    if a.ndim > 1 or (a.ndim == 1 and a.shape[0] not in (1, channels)):
        raise ShapeError(
            f"{name} must be a scalar (per layer) or have shape ({channels},) (per channel), got shape {a.shape}"
        )
    return a


def _check_bool(v: Any, name: str) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise ArgTypeError(f"{name} must be a Python bool (a static register setting), got {v!r}")
    return bool(v)


def _sat32_sum(a: jax.Array, b: jax.Array) -> jax.Array:
    """``sat_32(a + b)`` for int32 ``a``, ``b`` (exact 33-bit sum)."""
    return wide.saturate_to_int32(wide.add(wide.from_int32(a), wide.from_int32(b)), _I32_MIN, _I32_MAX)[0]


# ------------------------------------------------------------------------ SDP X stage


def sdp_x(
    v, *, alu_op=None, alu_shift=0, alu_algo: str = "sum", mul_op=None, mul_shift=0, relu: bool = False
) -> jax.Array:
    """One SDP X1 (``BS``) or X2 (``BN``) stage, INT processing (C model ``sdp_x.cpp``).

    Per element, with ``v`` the stage's int32 input::

        ALU:  operand = sat_32(alu_op * 2**alu_shift)                 (IntShiftLeft<16,6,32>)
              a = v + operand | max(v, operand) | min(v, operand)     (33 bits, NOT saturated)
              (ALU bypassed, ``alu_op=None``: a = v)
        MUL:  p = a * mul_op                                          (49 bits, exact)
              (MUL bypassed, ``mul_op=None``: p = a)
        shift: t = sat_32(rshift_rhaz(p, mul_shift))                  (runs even when MUL is
                                                                       bypassed)
        ReLU: y = max(t, 0) if relu else t

    The 33-bit ALU result goes into the multiplier unsaturated: only the shift stage
    saturates. (PReLU mode is not modelled.)

    Args:
      v: integer array (int32 values): the CACC output or the previous stage.
      alu_op: int16 ALU operand(s): an integer scalar (the per-layer register) or an array
        broadcasting against ``v`` (per-channel (C,) or per-element operands read from
        memory); ``None`` bypasses the ALU.
      alu_shift: ALU operand left shift, integer scalar in [0, 63] (6-bit field).
      alu_algo: ``"sum"``, ``"max"`` or ``"min"`` (static).
      mul_op: int16 multiplier operand(s), like ``alu_op``; ``None`` bypasses the MUL.
      mul_shift: right shift of the product, integer scalar in [0, 63] (the C model uses
        6 bits of the 8-bit ``*_MUL_SHIFT_VALUE`` field).
      relu: the stage's ReLU (static bool).

    Returns:
      int32 array of the broadcast shape.
    """
    V.check_choice(alu_algo, ALU_ALGOS, "alu_algo")
    relu = _check_bool(relu, "relu")
    x = _int_array(v, _I32_MIN, _I32_MAX, "v", "int32")
    op = None if alu_op is None else _int_array(alu_op, _I16_MIN, _I16_MAX, "alu_op", "int16")
    m = None if mul_op is None else _int_array(mul_op, _I16_MIN, _I16_MAX, "mul_op", "int16")
    sh_a = _register(alu_shift, 0, 63, "alu_shift")
    sh_m = _register(mul_shift, 0, 63, "mul_shift")
    for a, name in ((op, "alu_op"), (m, "mul_op")):
        if a is not None:
            V.check_broadcast(x, "v", a, name)
    return _sdp_x_kernel(x, op, sh_a, m, sh_m, algo=alu_algo, relu=relu)


def _x_stage(x, op, alu_shift, algo, m, mul_shift, relu):
    """:func:`sdp_x` on checked int32 operands (``op``/``m`` None: bypass); traceable."""
    if op is None:
        a = wide.from_int32(x)
    else:
        operand = shift_right(op, -alu_shift, rounding="floor", allow_left=True)  # sat_32(op << alu_shift)
        if algo == "sum":
            a = wide.add(wide.from_int32(x), wide.from_int32(operand))  # 33 bits, exact
        else:
            pick = jnp.maximum if algo == "max" else jnp.minimum
            a = wide.from_int32(pick(x, operand))
    t = cvt(a, offset=0, scale=1 if m is None else m, shift=mul_shift, out_bits=32)
    return jnp.maximum(t, 0) if relu else t


@functools.partial(jax.jit, static_argnames=("algo", "relu"))
def _sdp_x_kernel(x, op, alu_shift, m, mul_shift, *, algo, relu):
    return _x_stage(*_i32((x, op, alu_shift)), algo, *_i32((m, mul_shift)), relu)


def _out_registers(offset, scale, shift) -> tuple[jax.Array, jax.Array, jax.Array]:
    return (
        _register(offset, _I32_MIN, _I32_MAX, "out_offset"),
        _register(scale, _I16_MIN, _I16_MAX, "out_scale"),
        _register(shift, 0, 63, "out_shift"),
    )


def _out8(v, out) -> jax.Array:
    """SDP output convertor to int8: ``sat_8(sat_17(rshift_rhaz((v - offset) * scale, shift)))``."""
    off, sc, sh = out
    return cvt(v, offset=off, scale=sc, shift=sh, out_bits=8, stage_bits=17).astype(jnp.int8)


def _x1_registers(acc_shape, bias16, bias_shift, mul16, mul_shift, out_offset, out_scale, out_shift):
    """The checked registers of :func:`sdp_x1` as a tuple of int32 arrays."""
    if len(acc_shape) < 1:
        raise ShapeError("acc must have a channel axis (..., C)")
    c = acc_shape[-1]
    return (
        _per_channel(bias16, _I16_MIN, _I16_MAX, "bias16", c),
        _register(bias_shift, 0, 63, "bias_shift"),
        _per_channel(mul16, _I16_MIN, _I16_MAX, "mul16", c),
        _register(mul_shift, 0, 63, "mul_shift"),
        _out_registers(out_offset, out_scale, out_shift),
    )


def _x1(acc, regs, relu):
    b, bs, m, ms, out = regs
    return _out8(_x_stage(acc, b, bs, "sum", m, ms, relu), out)


@functools.partial(jax.jit, static_argnames=("relu",))
def _sdp_x1_kernel(acc, regs, *, relu):
    return _x1(*_i32((acc, regs)), relu)


def sdp_x1(
    acc, *, bias16, bias_shift, mul16, mul_shift, relu: bool = False, out_offset=0, out_scale=1, out_shift=0
) -> jax.Array:
    """The INT8 convolution's SDP program: X1 bias + scale (+ ReLU), X2/Y bypassed, int8 output.

    Per element in channel ``c`` (last axis of ``acc``)::

        a = acc + sat_32(bias16[c] * 2**bias_shift)                   (33 bits, exact)
        t = sat_32(rshift_rhaz(a * mul16[c], mul_shift))              (49-bit product)
        t = max(t, 0) if relu
        y = sat_8(sat_17(rshift_rhaz((t - out_offset) * out_scale, out_shift)))

    that is :func:`sdp_x` with ``alu_op=bias16``, ``mul_op=mul16`` followed by the SDP
    output convertor (``cvt_unit("sdp_out", out_bits=8)``; the defaults 0, 1, 0 make it a
    plain int8 saturation). ``bias16``/``mul16`` are the per-channel operands of the X1
    DMA (``BS_DATA_USE = BOTH``, spec §6.7) or per-layer scalars.

    Args:
      acc: integer array (..., C) of int32 accumulators (the CACC output).
      bias16, mul16: int16 values, scalar or (C,).
      bias_shift, mul_shift: integer scalars in [0, 63].
      relu: X1 ReLU (static bool).
      out_offset: int32 scalar; out_scale: int16 scalar; out_shift: scalar in [0, 63].

    Returns:
      int8 array of ``acc``'s shape.
    """
    a = _int_array(acc, _I32_MIN, _I32_MAX, "acc", "int32")
    regs = _x1_registers(a.shape, bias16, bias_shift, mul16, mul_shift, out_offset, out_scale, out_shift)
    return _sdp_x1_kernel(a, regs, relu=_check_bool(relu, "relu"))


# ------------------------------------------------------------------------ convolutions


def _cacc_deliver(acc: jax.Array, truncate: jax.Array) -> jax.Array:
    """CACC delivery to the SDP: ``sat_32(rshift_rhaz(acc, CLIP_TRUNCATE))`` (acc fits int32 here)."""
    return shift_right(acc, truncate, rounding="half_away")


def _check_products(k: int, what: str) -> None:
    if k > MAX_CONV_PRODUCTS:
        raise RangeError(
            f"an NVDLA {what} with {k} products per output (kh*kw*C_in) could exceed int32; "
            f"the exact int32 accumulation here supports at most {MAX_CONV_PRODUCTS}"
        )


_CONV_DOC_ARGS = """
      stride, padding, dilation: the window geometry, as for
        :meth:`hwjax.core.ConvGeometry.make` (``padding`` ``"VALID"``, ``"SAME"``, an int, a
        pair or ``((top, bottom), (left, right))``; static).
      pad_value: the value padded taps read (the CDMA's ``ZERO_PADDING_VALUE``), an int8
        integer scalar (may be traced); default 0.
      bias16, bias_shift, mul16, mul_shift, relu, out_offset, out_scale, out_shift: the SDP
        program of :func:`sdp_x1`.
      cacc_truncate: the CACC ``CLIP_TRUNCATE`` field, integer scalar in [0, 16] (the C
        model rejects values that do not leave 32 bits of its 48-bit assembly); default 0."""


def conv2d_int8(
    x,
    kernel_ohwi,
    *,
    stride=1,
    padding="VALID",
    dilation=1,
    pad_value=0,
    bias16,
    bias_shift,
    mul16,
    mul_shift,
    relu: bool = False,
    out_offset=0,
    out_scale=1,
    out_shift=0,
    cacc_truncate=0,
):
    (
        """NVDLA INT8 direct convolution: exact CMAC/CACC accumulation, then :func:`sdp_x1`.

    ``acc[..., oy, ox, o] = sat_32(rshift_rhaz(sum_{i, j, c} x[..., r, s, c] *
    kernel_ohwi[o, i, j, c], cacc_truncate))`` with ``r``, ``s`` the window positions of
    :class:`hwjax.core.ConvGeometry` (padded taps read ``pad_value``); the sum is exact
    (one :func:`hwjax.core.int_dot` with int32 results over the (kh, kw, c) patch, at most
    :data:`MAX_CONV_PRODUCTS` products, so no saturation can occur before the delivery).
    Then ``y = sdp_x1(acc, ...)`` per output channel.

    Args:
      x: integer array (..., H, W, C_in) of int8 values (NHWC; any leading axes).
      kernel_ohwi: integer array (C_out, kh, kw, C_in) of int8 values."""
        + _CONV_DOC_ARGS
        + """

    Returns:
      ``(y, acc)``: int8 (..., OH, OW, C_out) and the int32 accumulators delivered to the
      SDP, same shape.
    """
    )
    xv, k = _int8_array(x, "x"), _int8_array(kernel_ohwi, "kernel_ohwi")
    if xv.ndim < 3 or k.ndim != 4 or k.shape[3] != xv.shape[-1]:
        raise ShapeError(
            f"x must be (..., H, W, C_in) and kernel_ohwi (C_out, kh, kw, C_in) with the same "
            f"C_in, got {xv.shape} and {k.shape}"
        )
    geom = ConvGeometry.make(xv.shape[-3:-1], k.shape[1:3], stride, padding, dilation)
    _check_products(int(np.prod(k.shape[1:])), "convolution")
    pv = _register(pad_value, -128, 127, "pad_value")
    tr = _register(cacc_truncate, 0, _CACC_MAX_TRUNCATE, "cacc_truncate")
    regs = _x1_registers(
        xv.shape[:-1] + (k.shape[0],), bias16, bias_shift, mul16, mul_shift, out_offset, out_scale, out_shift
    )
    return _conv_kernel(xv, k, pv, tr, regs, geom=geom, relu=_check_bool(relu, "relu"))


@functools.partial(jax.jit, static_argnames=("geom", "relu"))
def _conv_kernel(x, k, pad_value, truncate, regs, *, geom, relu):
    x, k = x.astype(jnp.int8), k.astype(jnp.int8)
    truncate, regs = _i32((truncate, regs))
    patches = extract_patches(x, geom, pad_value=pad_value)  # (..., OH, OW, kh*kw*C_in), (i, j, c) order
    w = k.reshape(k.shape[0], -1)
    acc = int_dot(patches, w, (((patches.ndim - 1,), (1,)), ((), ())))
    acc = _cacc_deliver(acc, truncate)
    return _x1(acc, regs, relu), acc


def depthwise_conv2d_int8(
    x,
    kernel_hwc,
    *,
    stride=1,
    padding="VALID",
    dilation=1,
    pad_value=0,
    bias16,
    bias_shift,
    mul16,
    mul_shift,
    relu: bool = False,
    out_offset=0,
    out_scale=1,
    out_shift=0,
    cacc_truncate=0,
):
    (
        """Depthwise convolution as NVDLA runs it (it has no depthwise mode).

    NVIDIA's compiler turns a grouped convolution into an ordinary one whose kernel holds
    zeros for every other group's channels; the CMAC/CACC sum stays exact, so output
    channel ``c`` is the per-channel convolution::

        acc[..., oy, ox, c] = sat_32(rshift_rhaz(sum_{i, j} x[..., r, s, c] * kernel_hwc[i, j, c],
                                                 cacc_truncate))

    (exact int32: at most kh*kw <= :data:`MAX_CONV_PRODUCTS` products, computed here per
    channel with element-wise int32 products, no float arithmetic), followed by the same
    SDP X1 program per channel: ``y = sdp_x1(acc, ...)``. Channel multiplier 1 only.

    Args:
      x: integer array (..., H, W, C) of int8 values.
      kernel_hwc: integer array (kh, kw, C) of int8 values."""
        + _CONV_DOC_ARGS
        + """

    Returns:
      ``(y, acc)``: int8 (..., OH, OW, C) and the int32 accumulators, same shape.
    """
    )
    xv, k = _int8_array(x, "x"), _int8_array(kernel_hwc, "kernel_hwc")
    if xv.ndim < 3 or k.ndim != 3 or k.shape[2] != xv.shape[-1]:
        raise ShapeError(
            f"x must be (..., H, W, C) and kernel_hwc (kh, kw, C) with the same C, got {xv.shape} and {k.shape}"
        )
    geom = ConvGeometry.make(xv.shape[-3:-1], k.shape[:2], stride, padding, dilation)
    _check_products(k.shape[0] * k.shape[1], "depthwise convolution")
    pv = _register(pad_value, -128, 127, "pad_value")
    tr = _register(cacc_truncate, 0, _CACC_MAX_TRUNCATE, "cacc_truncate")
    regs = _x1_registers(xv.shape, bias16, bias_shift, mul16, mul_shift, out_offset, out_scale, out_shift)
    return _depthwise_kernel(xv, k, pv, tr, regs, geom=geom, relu=_check_bool(relu, "relu"))


@functools.partial(jax.jit, static_argnames=("geom", "relu"))
def _depthwise_kernel(x, k, pad_value, truncate, regs, *, geom, relu):
    x = x.astype(jnp.int8)
    truncate, regs = _i32((truncate, regs))
    taps = window_taps(x, geom, pad_value=pad_value)  # kh*kw arrays (..., OH, OW, C) in (i, j) order
    kk = k.astype(_I32).reshape(-1, k.shape[2])
    acc = taps[0].astype(_I32) * kk[0]
    for t in range(1, len(taps)):
        acc = acc + taps[t].astype(_I32) * kk[t]  # exact: |acc| <= kh*kw * 2**14
    acc = _cacc_deliver(acc, truncate)
    return _x1(acc, regs, relu), acc


# ------------------------------------------------------------------- element-wise add


def sdp_add_int8(
    x, y, *, x_mul, x_shift, y_offset=0, y_scale, y_shift, out_offset=0, out_scale, out_shift
) -> jax.Array:
    """Element-wise add of two int8 tensors on the SDP, int8 output.

    Register program: the SDP reads ``x`` as its input (int8 sign-extended); X1 with the
    ALU bypassed scales it (MUL operand ``x_mul``, shift ``x_shift``); X2 is
    bypassed; the Y (EW) unit reads ``y`` as its per-element ALU operand (one byte per
    element, sign-extended to int16), passes it through the EW ALU operand convertor and
    adds it (Y MUL and LUT bypassed); the SDP output convertor makes int8. Per element::

        a  = sat_32(rshift_rhaz(x * x_mul, x_shift))                          (X1 MUL)
        op = sat_32(rshift_rhaz((y - y_offset) * y_scale, y_shift))           (EW ALU cvt)
        s  = sat_32(a + op)                                                   (Y ALU, 33 bits)
        z  = sat_8(sat_17(rshift_rhaz((s - out_offset) * out_scale, out_shift)))  (output cvt)

    The X1/X2 ALU operands have no convertor (only a left shift, :func:`sdp_x`), which is
    why the scaled operand goes through the Y unit. NVIDIA's compiler emits an add of two
    equally scaled tensors as an X1 per-element ALU SUM with the rescale in the output
    convertor; that program gives the same bits as ``x_mul=1, x_shift=0, y_offset=0,
    y_scale=1, y_shift=0`` here (both compute ``x + y`` exactly before the output
    convertor). There is no ReLU after the Y unit.

    Args:
      x, y: integer arrays of int8 values, same shape (..., C).
      x_mul: int16 X1 multiplier: an integer scalar (register) or (C,) (per-channel operand).
      x_shift: X1 MUL shift, integer scalar in [0, 63].
      y_offset: int32 scalar; y_scale: int16 scalar; y_shift: scalar in [0, 63] (the
        ``EW_ALU_CVT_*`` registers).
      out_offset: int32 scalar; out_scale: int16 scalar; out_shift: scalar in [0, 63]
        (the ``CVT_*`` registers).

    Returns:
      int8 array of the input shape.
    """
    a8, b8 = _int8_array(x, "x"), _int8_array(y, "y")
    if a8.shape != b8.shape:
        raise ShapeError(f"x and y must have the same shape, got {a8.shape} and {b8.shape}")
    if a8.ndim < 1:
        raise ShapeError("x must have a channel axis (..., C)")
    regs = (
        _per_channel(x_mul, _I16_MIN, _I16_MAX, "x_mul", a8.shape[-1]),
        _register(x_shift, 0, 63, "x_shift"),
        _register(y_offset, _I32_MIN, _I32_MAX, "y_offset"),
        _register(y_scale, _I16_MIN, _I16_MAX, "y_scale"),
        _register(y_shift, 0, 63, "y_shift"),
        _out_registers(out_offset, out_scale, out_shift),
    )
    return _add_kernel(a8, b8, regs)


@jax.jit
def _add_kernel(x, y, regs):
    m, x_shift, y_off, y_sc, y_sh, out = _i32(regs)
    a = _x_stage(x.astype(_I32), None, None, "sum", m, x_shift, False)  # X1: ALU bypass, MUL, shift
    op = cvt(y.astype(_I32), offset=y_off, scale=y_sc, shift=y_sh, out_bits=32)  # EW ALU operand cvt
    return _out8(_sat32_sum(a, op), out)  # Y ALU sum, output convertor


# ------------------------------------------------------------------------------- PDP


def pdp_recip_kernel(k: int) -> int:
    """The ``RECIP_KERNEL_WIDTH``/``HEIGHT`` value NVDLA's firmware programs for an INT8/INT16
    kernel extent ``k`` in 1..8: ``floor(2**16 / k)`` (``kmd/firmware/pdp.c``)."""
    k = V.check_static_int(k, 1, _PDP_MAX_KERNEL, "k (kernel extent)")
    return (1 << 16) // k


def _pdp_pair(v: Any, hi: int, name: str) -> None:
    """A PDP window or stride: an int or a pair of static ints, each in [1, hi]."""
    vs = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if len(vs) not in (1, 2):
        raise ShapeError(f"{name} must be an int or a pair of ints, got {v!r}")
    for e, axis in zip(vs * (3 - len(vs)), ("height", "width")):
        V.check_static_int(e, 1, hi, f"{name} {axis}")


def _pdp_geometry(x: jax.Array, window, stride, padding) -> ConvGeometry:
    if x.ndim < 3:
        raise ShapeError(f"x must be (..., H, W, C), got shape {x.shape}")
    _pdp_pair(window, _PDP_MAX_KERNEL, "window")
    if stride is not None:
        _pdp_pair(stride, _PDP_MAX_STRIDE, "stride")
    geom = ConvGeometry.make(x.shape[-3:-1], window, window if stride is None else stride, padding)
    for i, axis in enumerate(("height", "width")):
        kk, s = geom.kernel[i], geom.stride[i]
        if kk > _PDP_MAX_KERNEL:
            raise RangeError(f"window {axis} must lie in [1, {_PDP_MAX_KERNEL}] (PDP), got {kk}")
        if s > _PDP_MAX_STRIDE:
            raise RangeError(f"stride {axis} must lie in [1, {_PDP_MAX_STRIDE}] (PDP), got {s}")
        for p, side in zip(geom.padding[i], (("top", "bottom"), ("left", "right"))[i]):
            if p > min(_PDP_MAX_PAD, kk - 1):
                raise RangeError(
                    f"padding {side} must lie in [0, {min(_PDP_MAX_PAD, kk - 1)}] (PDP: 3-bit field, "
                    f"less than the window {axis}), got {p}"
                )
    return geom


_POOL_DOC_ARGS = """
      x: integer array (..., H, W, C) of int8 values.
      window: (kh, kw) (or an int), each in [1, 8] (the firmware's range; the RTL sums an
        int8 window in 14 bits).
      stride: (sv, sh) (or an int), each in [1, 16]; default ``window``.
      padding: as for :meth:`hwjax.core.ConvGeometry.make` (default ``"VALID"``); each side
        in [0, min(7, window - 1)] (3-bit ``PAD_*`` fields)."""


def pdp_maxpool_int8(x, window, stride=None, *, padding="VALID") -> jax.Array:
    (
        """PDP max pooling, int8 -> int8: the maximum of the window's input elements.

    Padded positions do not take part (the PDP's MAX method adds no pad values), so with
    padding the maximum is over the window's elements inside the image (every window
    holds at least one, given the padding limits below).

    Args:"""
        + _POOL_DOC_ARGS
        + """

    Returns:
      int8 array (..., OH, OW, C).
    """
    )
    xv = _int8_array(x, "x")
    geom = _pdp_geometry(xv, window, stride, padding)
    return _maxpool_kernel(xv, geom=geom)


@functools.partial(jax.jit, static_argnames=("geom",))
def _maxpool_kernel(x, *, geom):
    x = x.astype(jnp.int8)
    taps = window_taps(x, geom, pad_value=-128)  # -128 never exceeds a real element
    y = taps[0]
    for t in taps[1:]:
        y = jnp.maximum(y, t)
    return y


def pdp_avgpool_int8(
    x, window, stride=None, *, padding="VALID", recip_kernel_width=None, recip_kernel_height=None
) -> jax.Array:
    (
        """PDP average pooling, int8 -> int8, as the PDP computes it (C model ``PoolingStage1Calc``).

    Per output element: the exact window sum ``S`` (padded positions contribute 0: the
    ``PAD_VALUE_*`` registers are 0, as NVIDIA's compiler programs them), then the two
    reciprocal multiplications with rounding half away from zero, then the low 8 bits::

        t = rshift_rhaz(S * recip_kernel_width, 16)
        u = rshift_rhaz(t * recip_kernel_height, 16)
        y = sx_8(u)            (C model: static_cast<int8_t>, i.e. two's-complement wrap)

    ``RECIP_KERNEL_WIDTH``/``RECIP_KERNEL_HEIGHT`` are unsigned 17-bit fields holding
    ``2**16 / k`` in fixed point (``arnvdla.h``); the divisor is always the full window
    (padded positions count). With the firmware's values ``floor(2**16 / k)``
    (:func:`pdp_recip_kernel`, the default) ``|u|`` never exceeds the largest input
    magnitude, so the wrap cannot occur; larger reciprocals can make it wrap (the RTL
    additionally keeps ``t`` in 11 bits, so there results beyond that width are not
    defined by the hardware; this function follows the C model).

    Args:"""
        + _POOL_DOC_ARGS
        + """
      recip_kernel_width, recip_kernel_height: integer scalars in [0, 131071] (may be
        traced); ``None`` gives :func:`pdp_recip_kernel` of the window's width / height.

    Returns:
      int8 array (..., OH, OW, C).
    """
    )
    xv = _int8_array(x, "x")
    geom = _pdp_geometry(xv, window, stride, padding)
    kh, kw = geom.kernel
    rw = _register(
        pdp_recip_kernel(kw) if recip_kernel_width is None else recip_kernel_width,
        0,
        _PDP_RECIP_MAX,
        "recip_kernel_width",
    )
    rh = _register(
        pdp_recip_kernel(kh) if recip_kernel_height is None else recip_kernel_height,
        0,
        _PDP_RECIP_MAX,
        "recip_kernel_height",
    )
    return _avgpool_kernel(xv, rw, rh, geom=geom)


@functools.partial(jax.jit, static_argnames=("geom",))
def _avgpool_kernel(x, rw, rh, *, geom):
    x, (rw, rh) = x.astype(jnp.int8), _i32((rw, rh))
    taps = window_taps(x, geom, pad_value=0)
    s = taps[0].astype(_I32)
    for t in taps[1:]:
        s = s + t.astype(_I32)  # |S| <= 64 * 128
    t1 = shift_right(s * rw, 16, rounding="half_away")  # |S * rw| < 2**13 * 2**17 = 2**30
    u = shift_right(t1 * rh, 16, rounding="half_away")  # |t1| <= 2**14, |t1 * rh| < 2**31
    return sign_extend(u, 8).astype(jnp.int8)
