"""NVDLA target: the INT8 convolution pipeline with the SDP X1 stage, PDP pooling and the SDP LUT.

Each op kind is one :class:`hwjax.graph.OpImpl` registered below, composed from
:mod:`hwjax.nvdla`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.nvdla as nvdla_pkg
from hwjax.core import div_rn, shift_right
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets._base import Target, float_exponent, no_acc, pytree, register, static


def _scale_shift(r: jax.Array, max_shift: int = 63) -> tuple[jax.Array, jax.Array]:
    """An int16 ``scale`` and a right ``shift`` in [0, max_shift] with ``scale * 2**-shift``
    ~ ``r`` (> 0; per-channel ``r`` shares the shift of its largest entry): the largest
    shift that keeps ``|scale| <= 32767``."""
    e = float_exponent(jnp.max(r))
    shift = jnp.clip(15 - e, 0, max_shift).astype(jnp.int32)
    scale = jnp.clip(jnp.round(jnp.ldexp(r, shift)), -32767, 32767).astype(jnp.int32)
    return scale, shift


@pytree
@dataclass(frozen=True)
class NVDLAConvParams:
    """Integer parameters of one NVDLA convolution / dense layer (int8 pipeline).

    ``kernel`` int8 OHWI; ``bias16`` (C,) int16 SDP X1 ALU operands with the left shift
    ``bias_shift``; ``mul16`` (C,) int16 X1 MUL operands with the right shift
    ``mul_shift``; ``relu`` (static) the X1 ReLU.
    """

    kernel: jax.Array
    bias16: jax.Array
    bias_shift: jax.Array
    mul16: jax.Array
    mul_shift: jax.Array
    relu: bool = static()


@functools.lru_cache(maxsize=None)
def nvdla_lut_config(fn: str):
    """The SDP LUT programmed for ``fn`` on a Q12 input (``X = round(x * 2**12)``), output
    ``Y = round(32767 * fn(x))``: :func:`hwjax.nvdla.sigmoid_lut` / ``tanh_lut`` presets
    (spec nvdla.md §4.6 layout), computed once per function."""
    presets = {"sigmoid": nvdla_pkg.sigmoid_lut, "tanh": nvdla_pkg.tanh_lut}
    if fn not in presets:
        raise UnsupportedOpError(f"no NVDLA LUT preset for {fn!r} (available: {sorted(presets)})")
    return presets[fn]()


@pytree
@dataclass(frozen=True)
class NVDLALutParams:
    """An NVDLA LUT activation: X1 MUL ``(m_in, sh_in)`` to the Q12 LUT input, the two
    tables (registers: :func:`nvdla_lut_config` of ``fn``), output convertor
    ``(m_out, sh_out)``."""

    m_in: jax.Array
    sh_in: jax.Array
    m_out: jax.Array
    sh_out: jax.Array
    le_table: jax.Array
    lo_table: jax.Array
    fn: str = static()


_LUT_IN_BITS = 12  # the LUT input is Q12
_LUT_OUT_SCALE = 32767.0


@dataclass(frozen=True)
class NVDLA(Target):
    """NVIDIA NVDLA (``nv_full``), INT8 pipeline, spec nvdla.md: symmetric int8 activations
    (zero point 0), per-channel int8 weights.

    * ``conv``/``dense``: exact int32 accumulation (CMAC/CACC), then the SDP X1 stage:
      ALU ``sat32(acc + bias16 * 2**bias_shift)``, MUL ``sat32(rshift_rhaz(v * mul16[c],
      mul_shift))``, optional ReLU, then the SDP output convertor to int8 (int17 stage,
      :func:`hwjax.nvdla.cvt`). ``mul16 * 2**-mul_shift ~ s_in s_w[c] / s_out``.
    * ``lut``: X1 MUL to the LUT's Q12 input, the SDP LUT (:func:`hwjax.nvdla.sdp_lut`,
      programmed by the ``sigmoid_lut`` / ``tanh_lut`` presets), and the output
      convertor from ``32767 * fn(x)`` to int8.
    * ``depthwise_conv``: the same pipeline per channel (NVDLA runs it as a convolution
      whose kernel is zero outside each channel's own taps).
    * ``maxpool`` / ``avgpool``: the PDP (exact int8 maximum; window sum times the
      firmware's reciprocals ``floor(2**16 / k)``, rounded half away from zero).
    * ``add``: the SDP element-wise path (:func:`hwjax.nvdla.sdp_add_int8`); no fused ReLU.
    """

    name: ClassVar[str] = "nvdla"
    symmetric_activations: ClassVar[bool] = True
    lut_slopes: ClassVar[bool] = True

    def check_op(self, op: str, **config: Any) -> None:
        super().check_op(op, **config)
        if op == "lut" and config.get("fn") is not None:
            nvdla_lut_config(config["fn"])
        if op == "add" and config.get("activation") is not None:
            raise UnsupportedOpError(
                "NVDLA's SDP has no ReLU after the element-wise (Y) unit: use an add without activation"
            )
        for key in ("window",):
            if op in ("avgpool", "maxpool") and config.get(key) is not None and max(config[key]) > 8:
                raise UnsupportedOpError(f"NVDLA's PDP pools windows of at most 8 x 8, got {config[key]}")


# ------------------------------------------------------------------ linear ops


def _sdp_operands(p, q_in, q_out) -> tuple:
    """``(bias16, bias_shift, mul16, mul_shift)``: ``bias16 << bias_shift ~ bias`` (the largest
    int16 the bias fits, rounded half away from zero) and ``mul16 * 2**-mul_shift ~ s_in
    s_w[c] / s_out``."""
    b = jnp.asarray(p["bias"], jnp.int32)
    bits = 32 - jax.lax.clz(jnp.max(jnp.abs(b)))
    bias_shift = jnp.maximum(bits - 15, 0).astype(jnp.int32)
    bias16 = jnp.clip(shift_right(b, bias_shift, rounding="half_away"), -32768, 32767)
    mul16, mul_shift = _scale_shift(div_rn(q_in[0].scale * p["w_scale"], q_out.scale))
    return bias16, bias_shift, mul16, mul_shift


def _conv_params(op: str):
    def params(target, attrs, p, q_in, q_out) -> NVDLAConvParams:
        """The int8 kernel (dense: OHWI with a 1x1 window; depthwise: (kh, kw, C) as is) and
        the SDP X1 operands (:func:`_sdp_operands`)."""
        k = jnp.asarray(p["kernel"]).astype(jnp.int32)
        if op == "dense":
            k = k.reshape(k.shape[0], 1, 1, k.shape[1])
        return NVDLAConvParams(k.astype(jnp.int8), *_sdp_operands(p, q_in, q_out), attrs.get("activation") == "relu")

    return params


def _conv_run(op: str):
    def run(target, attrs, params: NVDLAConvParams, x, return_acc: bool = False):
        """:func:`hwjax.nvdla.conv2d_int8` (exact CMAC/CACC, then the SDP X1 program) or
        :func:`hwjax.nvdla.depthwise_conv2d_int8`; padded taps read 0 (the zero point)."""
        if tuple(attrs.get("dilation", (1, 1))) != (1, 1) or attrs.get("depth_multiplier", 1) != 1:
            raise UnsupportedOpError(
                f"target {target!r}: {op} with dilation {attrs.get('dilation', (1, 1))}, "
                f"depth_multiplier {attrs.get('depth_multiplier', 1)}: only (1, 1), 1 supported"
            )
        sdp = dict(
            bias16=params.bias16,
            bias_shift=params.bias_shift,
            mul16=params.mul16,
            mul_shift=params.mul_shift,
            relu=params.relu,
        )
        if op == "dense":
            y, acc = nvdla_pkg.conv2d_int8(x[:, None, None, :], params.kernel, **sdp)
            y, acc = y[:, 0, 0, :], acc[:, 0, 0, :]
        elif op == "depthwise_conv":
            y, acc = nvdla_pkg.depthwise_conv2d_int8(
                x, params.kernel, stride=attrs["stride"], padding=attrs["padding"], **sdp
            )
        else:
            y, acc = nvdla_pkg.conv2d_int8(x, params.kernel, stride=attrs["stride"], padding=attrs["padding"], **sdp)
        y = y.astype(jnp.int32)
        if not return_acc:
            return y
        return y, {"count": jnp.int32(acc.size), "saturated": jnp.int32(0)}  # CACC is exact: never saturates

    return run


def _kcrs(params: NVDLAConvParams, op: str) -> np.ndarray:
    """The KCRS kernel the CMAC reads: a depthwise (kh, kw, C) kernel becomes the C x C
    kernel with zeros off the diagonal, as NVIDIA's compiler squashes groups."""
    k = np.asarray(params.kernel, np.int8)
    if op == "depthwise_conv":
        kh, kw, c = k.shape
        full = np.zeros((c, c, kh, kw), np.int8)
        full[np.arange(c), np.arange(c)] = np.transpose(k, (2, 0, 1))
        return full
    return np.transpose(k, (0, 3, 1, 2))


def _conv_export(op: str):
    def export(target, attrs, params: NVDLAConvParams):
        """``weights``: :func:`hwjax.nvdla.pack_dc_weights` of the KCRS kernel (the
        direct-convolution byte image; depthwise: the zero-padded C x C kernel); ``sdp``:
        :func:`hwjax.nvdla.pack_sdp_per_channel` of the (bias16, mul16) operands; shifts and
        ReLU to the manifest."""
        image = np.asarray(nvdla_pkg.pack_dc_weights(_kcrs(params, op), dtype=np.int8), np.uint8)
        sdp = np.asarray(
            nvdla_pkg.pack_sdp_per_channel(
                np.asarray(params.bias16, np.int16), np.asarray(params.mul16, np.int16), dtype=np.int16
            ),
            np.uint8,
        )
        meta = {
            "kernel_shape": list(np.asarray(params.kernel).shape),
            "bias_shift": int(params.bias_shift),
            "mul_shift": int(params.mul_shift),
            "relu": bool(params.relu),
        }
        return {"weights": image, "sdp": sdp}, meta

    return export


def _conv_load(op: str):
    def load(target, attrs, tensors, meta) -> NVDLAConvParams:
        shape = tuple(int(v) for v in meta["kernel_shape"])
        if len(shape) != (3 if op == "depthwise_conv" else 4):
            raise FormatError(f"kernel_shape {list(shape)} does not fit a {op} kernel")
        if op == "depthwise_conv":
            kh, kw, c = shape
            kcrs = np.asarray(
                nvdla_pkg.unpack_dc_weights(jnp.asarray(tensors["weights"]), (c, c, kh, kw), dtype=jnp.int8)
            )
            diag = kcrs[np.arange(c), np.arange(c)]
            if np.count_nonzero(kcrs) != np.count_nonzero(diag):
                raise FormatError("depthwise weights have non-zero taps outside their own channel")
            kernel = jnp.asarray(np.transpose(diag, (1, 2, 0)), jnp.int8)
            c_out = c
        else:
            kcrs = nvdla_pkg.unpack_dc_weights(
                jnp.asarray(tensors["weights"]), (shape[0], shape[3], shape[1], shape[2]), dtype=jnp.int8
            )
            kernel = jnp.transpose(kcrs, (0, 2, 3, 1)).astype(jnp.int8)
            c_out = shape[0]
        bias16, mul16 = nvdla_pkg.unpack_sdp_per_channel(jnp.asarray(tensors["sdp"]), c_out, dtype=jnp.int16)
        return NVDLAConvParams(
            kernel,
            bias16.astype(jnp.int32),
            jnp.int32(meta["bias_shift"]),
            mul16.astype(jnp.int32),
            jnp.int32(meta["mul_shift"]),
            bool(meta["relu"]),
        )

    return load


for _op in ("conv", "dense", "depthwise_conv"):
    NVDLA.implements(_op, params=_conv_params(_op), export=_conv_export(_op), load=_conv_load(_op))(_conv_run(_op))


# ----------------------------------------------------------------------- pools


def _pool_attrs(attrs) -> tuple:
    return tuple(attrs["window"]), tuple(attrs["strides"])


@NVDLA.implements("maxpool")
def _nvdla_maxpool(target, attrs, params, x, return_acc: bool = False):
    """PDP max pooling (:func:`hwjax.nvdla.pdp_maxpool_int8`): the int8 maximum over each
    VALID window."""
    window, strides = _pool_attrs(attrs)
    return no_acc(nvdla_pkg.pdp_maxpool_int8(x, window, strides).astype(jnp.int32), return_acc)


def _avgpool_params(target, attrs, p, q_in, q_out) -> dict:
    """The reciprocals NVDLA's firmware programs: ``floor(2**16 / k)`` per window extent."""
    (kh, kw), _ = _pool_attrs(attrs)
    return {
        "recip_kernel_width": jnp.int32(nvdla_pkg.pdp_recip_kernel(kw)),
        "recip_kernel_height": jnp.int32(nvdla_pkg.pdp_recip_kernel(kh)),
    }


def _register_export(target, attrs, params):
    """No tensors; the register values to the manifest."""
    return {}, {k: int(v) for k, v in params.items()}


def _register_load(names):
    def load(target, attrs, tensors, meta) -> dict:
        return {k: jnp.int32(int(meta[k])) for k in names}

    return load


@NVDLA.implements(
    "avgpool",
    params=_avgpool_params,
    export=_register_export,
    load=_register_load(("recip_kernel_width", "recip_kernel_height")),
)
def _nvdla_avgpool(target, attrs, params, x, return_acc: bool = False):
    """PDP average pooling (:func:`hwjax.nvdla.pdp_avgpool_int8`): the exact window sum times
    the width and height reciprocals, each rounded half away from zero. The output keeps
    the input's quantisation."""
    window, strides = _pool_attrs(attrs)
    y = nvdla_pkg.pdp_avgpool_int8(
        x,
        window,
        strides,
        recip_kernel_width=params["recip_kernel_width"],
        recip_kernel_height=params["recip_kernel_height"],
    )
    return no_acc(y.astype(jnp.int32), return_acc)


# ------------------------------------------------------------------------- add

_ADD_GUARD_BITS = 8  # the sum is formed in units of s_out / 2**8, then the output convertor drops them


def _add_params(target, attrs, p, q_in, q_out) -> dict:
    """``x_mul 2**-x_shift ~ 2**8 s1 / s_out`` and ``y_scale 2**-y_shift ~ 2**8 s2 / s_out``
    (int16 multipliers), output convertor ``rshift_rhaz(s, 8)``: ``z ~ (s1 x + s2 y) / s_out``
    (zero points are 0 on NVDLA)."""
    if attrs.get("activation") is not None:
        raise UnsupportedOpError(
            "NVDLA's SDP has no ReLU after the element-wise (Y) unit: an add with a fused ReLU cannot run on it"
        )
    x_mul, x_shift = _scale_shift(div_rn(q_in[0].scale, q_out.scale) * float(2**_ADD_GUARD_BITS))
    y_scale, y_shift = _scale_shift(div_rn(q_in[1].scale, q_out.scale) * float(2**_ADD_GUARD_BITS))
    return {"x_mul": x_mul, "x_shift": x_shift, "y_scale": y_scale, "y_shift": y_shift}


@NVDLA.implements(
    "add", params=_add_params, export=_register_export, load=_register_load(("x_mul", "x_shift", "y_scale", "y_shift"))
)
def _nvdla_add(target, attrs, params, x1, x2, return_acc: bool = False):
    """:func:`hwjax.nvdla.sdp_add_int8`: ``x1`` through the X1 multiplier, ``x2`` as the Y
    unit's element-wise operand through its convertor, summed, then the output convertor."""
    y = nvdla_pkg.sdp_add_int8(
        x1,
        x2,
        x_mul=params["x_mul"],
        x_shift=params["x_shift"],
        y_scale=params["y_scale"],
        y_shift=params["y_shift"],
        out_scale=1,
        out_shift=_ADD_GUARD_BITS,
    )
    return no_acc(y.astype(jnp.int32), return_acc)


# ------------------------------------------------------------------------- LUT


def _lut_params(target, attrs, p, q_in, q_out) -> NVDLALutParams:
    """X1 MUL ``(m_in, sh_in)`` with ``m_in 2**-sh_in ~ s_in 2**12`` (int8 -> Q12) and the
    output convertor ``(m_out, sh_out)`` with ``m_out 2**-sh_out ~ 1 / (32767 s_out)``."""
    m_in, sh_in = _scale_shift(jnp.asarray(q_in[0].scale, jnp.float32) * float(2**_LUT_IN_BITS))
    m_out, sh_out = _scale_shift(div_rn(jnp.float32(1.0), _LUT_OUT_SCALE * jnp.asarray(q_out.scale, jnp.float32)))
    cfg = nvdla_lut_config(attrs["fn"])
    return NVDLALutParams(
        m_in,
        sh_in,
        m_out,
        sh_out,
        jnp.asarray(cfg.le_table, jnp.int16),
        jnp.asarray(cfg.lo_table, jnp.int16),
        attrs["fn"],
    )


def _lut_export(target, attrs, params: NVDLALutParams):
    """``le_table`` (65) and ``lo_table`` (257) int16 entries; registers and convertor
    settings to the manifest."""
    cfg = nvdla_lut_config(params.fn)
    regs = {k: (v if isinstance(v, (str, int)) else int(v)) for k, v in cfg.registers().items()}
    meta = {
        "fn": params.fn,
        "registers": regs,
        **{k: int(getattr(params, k)) for k in ("m_in", "sh_in", "m_out", "sh_out")},
    }
    return {"le_table": np.asarray(params.le_table, np.int16), "lo_table": np.asarray(params.lo_table, np.int16)}, meta


def _lut_load(target, attrs, tensors, meta) -> NVDLALutParams:
    cfg = nvdla_lut_config(meta["fn"])
    if meta["registers"] != {k: (v if isinstance(v, (str, int)) else int(v)) for k, v in cfg.registers().items()}:
        raise FormatError(f"LUT registers differ from this hwjax's {meta['fn']} preset")
    for t, n in (("le_table", 65), ("lo_table", 257)):
        if np.asarray(tensors[t]).shape != (n,):
            raise FormatError(f"{t} must have {n} entries, got shape {np.asarray(tensors[t]).shape}")
    return NVDLALutParams(
        *(jnp.int32(meta[k]) for k in ("m_in", "sh_in", "m_out", "sh_out")),
        jnp.asarray(tensors["le_table"], jnp.int16),
        jnp.asarray(tensors["lo_table"], jnp.int16),
        meta["fn"],
    )


@NVDLA.implements("lut", params=_lut_params, export=_lut_export, load=_lut_load)
def _nvdla_lut(target, attrs, params: NVDLALutParams, x, return_acc: bool = False):
    """X1 MUL to the Q12 LUT input (:func:`hwjax.nvdla.cvt`), :func:`hwjax.nvdla.sdp_lut`,
    then the output convertor to int8.

    Integer ``x``: int32 results. Float ``x`` holding int8 values: the same values in
    float32, differentiable with the true slopes (the convertors' ``scale *
    2**-shift`` and the slope of the LUT segment or extrapolation actually used; 0
    where a convertor saturated)."""
    cfg = nvdla_lut_config(params.fn).replace(le_table=params.le_table, lo_table=params.lo_table)
    is_float = jnp.issubdtype(x.dtype, jnp.floating)
    xin = x.astype(jnp.float32) if is_float else x.astype(jnp.int32)
    xq = nvdla_pkg.cvt(xin, offset=0, scale=params.m_in, shift=params.sh_in, out_bits=32)
    y = nvdla_pkg.sdp_lut(xq, cfg)[0]
    y = nvdla_pkg.cvt(y, offset=0, scale=params.m_out, shift=params.sh_out, out_bits=8, stage_bits=17)
    return no_acc(y if is_float else y.astype(jnp.int32), return_acc)


register("nvdla", NVDLA)
