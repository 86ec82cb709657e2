"""XS3 targets: the current lib_nn API (:class:`XS3`) and the legacy BSO kernels (:class:`XS3Legacy`).

Each op kind the targets run is one :class:`hwjax.graph.OpImpl` registered below: the
exact kernel from :mod:`hwjax.xs3`, the recipe that derives its integer parameters
(xformer's for :class:`XS3`, tflite2xcore's for :class:`XS3Legacy`), and the memory
formats written by :func:`hwjax.export`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.xs3 as xs3
from hwjax.core import div_rn
from hwjax.core import validate as V
from hwjax.errors import FormatError, RangeError, UnsupportedOpError
from hwjax.graph import geometry
from hwjax.litert import kernel_sums
from hwjax.targets._base import Target, float_exponent, host_array, lut_table, no_acc, pytree, register
from hwjax.xs3 import otfn_params_many


def _acc_stat(n: int, clipped) -> dict:
    """The layers' accumulator statistic: ``n`` accumulators, of which ``saturated`` had at
    least one saturating step clip (:func:`hwjax.core.mac`'s ``return_clipped`` > 0)."""
    return {"count": jnp.int32(n), "saturated": jnp.asarray(clipped, jnp.int32).sum(dtype=jnp.int32)}


def _ohwi(kernel, op: str):
    """The portable kernel of a linear op as OHWI (dense (O, I) -> (O, 1, 1, I))."""
    return kernel.reshape(kernel.shape[0], 1, 1, kernel.shape[1]) if op == "dense" else kernel


def _to_4d(x, op: str):
    return x[:, None, None, :] if op == "dense" else x


def _from_4d(y, op: str):
    return y[:, 0, 0, :] if op == "dense" else y


def _dense_geometry(x4):
    return geometry({"kernel_size": (1, 1)}, x4.shape)


def _quant_args(q_in, q_out) -> dict:
    return dict(s_in=q_in[0].scale, z_in=q_in[0].zero_point, s_out=q_out.scale, z_out=q_out.zero_point)


# ====================================================================== XS3 (current)


@pytree
@dataclass(frozen=True)
class XS3ConvParams:
    """Integer parameters of one XS3 (current lib_nn API) convolution or dense layer.

    ``kernel``: int8 (C_out, kh, kw, C_in) (depthwise: (C, kh, kw)); ``multipliers``,
    ``biases``: int16-valued (C_out,) output-transform vectors; ``initial_shift``,
    ``final_shr``: int32 scalars; ``pad_value``: the input zero point read for padded taps;
    ``kernel_sums``: conv / dense, the kernel's int32 sums per output channel (derived at
    lowering, see :func:`hwjax.xs3.conv2d`), None for depthwise or where not derived.
    """

    kernel: jax.Array
    multipliers: jax.Array
    biases: jax.Array
    initial_shift: jax.Array
    final_shr: jax.Array
    pad_value: jax.Array
    kernel_sums: jax.Array | None = None


def conv_kernel_sums(kernel, op: str):
    """conv / dense: the (C_out,) int32 sums of each output channel's kernel values, on the
    host for a concrete kernel (:func:`hwjax.xs3.conv2d`'s ``kernel_sums``); depthwise:
    None (its taps are no dot)."""
    return None if op == "depthwise_conv" else kernel_sums(host_array(kernel))


@dataclass(frozen=True)
class XS3(Target):
    """XMOS xcore.ai XS3, current lib_nn API (xformer's ``XC_conv2d_v2``), spec xs3.md §4–§6.

    ``variant``: ``"hardware"`` (the chip; default), ``"host"`` (xmos-ai-tools 1.4.2
    host interpreter) or ``"v2021"``; see :mod:`hwjax.xs3`.

    Ops: ``conv``/``dense`` (im2col ``mat_mul_generic_int8``, 32-product chunks with
    sat32 after each, then ``otfn_int8`` with xformer's parameters), ``depthwise_conv``
    (one saturating VLMACC per tap, then ``otfn_int8``), ``maxpool`` (int8 max),
    ``avgpool`` (``avgpool2d`` scale-and-shift, §6.1), ``add`` (``add_elementwise``,
    §6.4) and ``lut`` (``lookup8``: a 256-entry table, §6.6).
    """

    variant: str = "hardware"
    name: ClassVar[str] = "xs3"

    def __post_init__(self):
        variants = ("hardware", "host", "v2021")
        if self.variant not in variants:
            raise RangeError(f"variant must be one of {variants}, got {self.variant!r}")


# ------------------------------------------------------------------ linear ops


def _xs3_linear_params(op: str):
    def params(target, attrs, p, q_in, q_out) -> XS3ConvParams:
        """xformer's parameters (:func:`hwjax.xs3.otfn_params`). A fused ReLU needs no
        parameter: its output range starts at 0, so ``z_out = -128`` and the int8 clamp
        is the ReLU."""
        return _xs3_linear_params_many(target, [(op, attrs, p, q_in, q_out)])[0]

    return params


def _xs3_linear_params_many(target, requests) -> list[XS3ConvParams]:
    """The parameters of several conv / depthwise / dense ops (``(op, attrs, portable, q_in,
    q_out)`` each) from one batched recipe (:func:`hwjax.xs3.otfn_params_many`)."""
    kernels, layers = [], []
    for op, _, p, q_in, q_out in requests:
        k = jnp.asarray(p["kernel"]).astype(jnp.int32)
        kernels.append(jnp.transpose(k, (2, 0, 1)) if op == "depthwise_conv" else _ohwi(k, op))
        qa = _quant_args(q_in, q_out)
        layers.append(
            (
                kernels[-1],
                jnp.asarray(p["bias"], jnp.int32),
                qa["s_in"],
                qa["z_in"],
                p["w_scale"],
                qa["s_out"],
                qa["z_out"],
            )
        )
    return [
        XS3ConvParams(
            k.astype(jnp.int8),
            mul,
            bias,
            shifts[0],
            shifts[1],
            jnp.asarray(layer[3], jnp.int32),
            conv_kernel_sums(k, op),
        )
        for (op, *_), k, layer, (mul, bias, shifts) in zip(requests, kernels, layers, otfn_params_many(layers))
    ]


def _xs3_linear_host_params(op: str):
    def host_params(target, attrs, p, q_in, q_out) -> XS3ConvParams | None:
        """xformer's own host recipe (:func:`hwjax.xs3.otfn_params_from_scales`, NumPy
        float64) on concrete values: what ``params`` computes in exact integer arithmetic,
        without compiling it. Defers (None) where the helper refuses the layer (a scale
        <= 0, shifts outside the assembly's ranges), so ``params`` returns them as found."""
        k = np.asarray(p["kernel"]).astype(np.int32)
        k = np.transpose(k, (2, 0, 1)) if op == "depthwise_conv" else np.asarray(_ohwi(k, op))
        r = xformer_host_otfn(k, p["bias"], q_in[0], p["w_scale"], q_out)
        if r is None:
            return None
        return XS3ConvParams(
            k.astype(np.int8),
            r["multipliers"].astype(np.int32),
            r["biases"].astype(np.int32),
            np.int32(r["initial_shift"]),
            np.int32(r["final_shr"]),
            np.int32(q_in[0].zero_point),
            conv_kernel_sums(k, op),
        )

    return host_params


def xformer_host_otfn(kernel, bias, q_in, s_w, q_out) -> dict | None:
    """:func:`hwjax.xs3.otfn_params_from_scales` (xformer's host recipe) on concrete
    kernel (C_out, ...), biases, weight scales and the input / output :class:`hwjax.graph.Quant`;
    None where the recipe refuses the layer (then the jittable ``otfn_params`` returns the
    parameters as found)."""
    try:
        return xs3.otfn_params_from_scales(
            np.asarray(bias, np.int64),
            kernel,
            float(np.float32(q_in.scale)),
            int(q_in.zero_point),
            np.asarray(s_w, np.float32),
            float(np.float32(q_out.scale)),
            int(q_out.zero_point),
        )
    except ValueError:
        return None


def _xs3_linear_run(op: str):
    def run(target, attrs, params: XS3ConvParams, x, return_acc: bool = False):
        """:func:`hwjax.xs3.conv2d` (im2col + ``mat_mul_generic_int8`` + ``otfn_int8``) or
        :func:`hwjax.xs3.depthwise_conv2d`, with the (possibly traced) shifts and pad value."""
        if tuple(attrs.get("dilation", (1, 1))) != (1, 1) or attrs.get("depth_multiplier", 1) != 1:
            raise UnsupportedOpError(
                f"target {target!r}: {op} with dilation {attrs.get('dilation', (1, 1))}, "
                f"depth_multiplier {attrs.get('depth_multiplier', 1)}: only (1, 1), 1 supported"
            )
        x4 = _to_4d(x, op)
        geom = _dense_geometry(x4) if op == "dense" else geometry(attrs, x4.shape)
        common = dict(
            initial_shift=params.initial_shift,
            final_shr=params.final_shr,
            stride=geom.stride,
            pad_top_left=geom.pad_top_left,
            pad_value=params.pad_value,
            out_shape=geom.out_hw,
            variant=target.variant,
        )
        x8 = x4.astype(jnp.int8)
        if op == "depthwise_conv":
            out = xs3.depthwise_conv2d(
                x8,
                jnp.transpose(params.kernel, (1, 2, 0)),
                params.multipliers,
                params.biases,
                return_clipped=return_acc,
                **common,
            )
            y, clipped = out if return_acc else (out, None)
            n_clipped = None if clipped is None else (clipped > 0)
        else:
            out = xs3.conv2d(
                x8,
                params.kernel,
                params.multipliers,
                params.biases,
                return_stats=return_acc,
                kernel_sums=params.kernel_sums,
                **common,
            )
            y, stats = out if return_acc else (out, None)
            n_clipped = None if stats is None else stats["acc_saturated"]
        y = _from_4d(y.astype(jnp.int32), op)
        return (y, _acc_stat(y.size, n_clipped)) if return_acc else y

    return run


def _xs3_linear_export(op: str):
    def export(target, attrs, params: XS3ConvParams):
        """``weights``: :func:`hwjax.xs3.reorder_kernel_weights` of the OHWI kernel (int8 stream;
        depthwise: (kh, kw, C), channels innermost, the ``mat_mul_dw_direct`` layout);
        ``output_transform``: :func:`hwjax.xs3.serialise_output_transform` (int16); scalars
        ``initial_shift``, ``final_shr``, ``pad_value``, ``kernel_shape``. ValueError when a
        shift leaves the range the chip's assembly supports."""
        ish, fsh = int(params.initial_shift), int(params.final_shr)
        if not (-16 <= ish <= 16 and -16 <= fsh <= 15):
            raise RangeError(
                f"initial_shift={ish} / final_shr={fsh} outside the XS3 otfn_int8 assembly's "
                f"ranges [-16, 16] / [-16, 15]: this layer cannot be exported for the chip"
            )
        k = np.asarray(params.kernel, np.int8)
        weights = (
            np.ascontiguousarray(np.transpose(k, (1, 2, 0)))
            if op == "depthwise_conv"
            else np.asarray(xs3.reorder_kernel_weights(k, pad_value=0), np.int8)
        )
        ot = np.asarray(
            xs3.serialise_output_transform(
                np.asarray(params.multipliers, np.int32), np.asarray(params.biases, np.int32)
            ),
            np.int16,
        )
        meta = {
            "initial_shift": ish,
            "final_shr": fsh,
            "pad_value": int(params.pad_value),
            "kernel_shape": list(k.shape),
        }
        return {"weights": weights, "output_transform": ot}, meta

    return export


def _xs3_linear_load(op: str):
    def load(target, attrs, tensors, meta) -> XS3ConvParams:
        shape = tuple(int(v) for v in meta["kernel_shape"])
        if op == "depthwise_conv":
            w = np.asarray(tensors["weights"])
            if len(shape) != 3 or w.shape != (shape[1], shape[2], shape[0]):
                raise FormatError(f"depthwise weights have shape {w.shape}, kernel_shape {list(shape)}")
            k = jnp.asarray(np.transpose(w, (2, 0, 1)))
        else:
            if len(shape) != 4:
                raise FormatError(f"kernel_shape must have 4 entries, got {list(shape)}")
            k = xs3.reorder_kernel_weights_inverse(jnp.asarray(tensors["weights"]), shape)
        ot = xs3.deserialise_output_transform(tensors["output_transform"], shape[0])
        return XS3ConvParams(
            k.astype(jnp.int8),
            jnp.asarray(ot["multipliers"], jnp.int32),
            jnp.asarray(ot["biases"], jnp.int32),
            jnp.int32(meta["initial_shift"]),
            jnp.int32(meta["final_shr"]),
            jnp.int32(meta["pad_value"]),
            conv_kernel_sums(k, op),
        )

    return load


for _op in ("conv", "dense", "depthwise_conv"):
    XS3.implements(
        _op,
        params=_xs3_linear_params(_op),
        export=_xs3_linear_export(_op),
        load=_xs3_linear_load(_op),
        host_params=_xs3_linear_host_params(_op),
        params_many=_xs3_linear_params_many,
    )(_xs3_linear_run(_op))


# ----------------------------------------------------------------------- pools


@XS3.implements("maxpool")
def _xs3_maxpool(target, attrs, params, x, return_acc: bool = False):
    """``maxpool`` (§6.3, :func:`hwjax.xs3.maxpool2d`): per channel, the max over the window
    starting from -128 (no padding)."""
    y = xs3.maxpool2d(
        x.astype(jnp.int8),
        window_shape=tuple(attrs["window"]),
        window_stride=tuple(attrs["strides"]),
        variant=target.variant,
    )
    return no_acc(y.astype(jnp.int32), return_acc)


@XS3.implements("avgpool")
def _xs3_avgpool(target, attrs, params, x, return_acc: bool = False):
    """``avgpool2d`` (§6.1, :func:`hwjax.xs3.avgpool2d`): ``clamp(rshr(sum(x) * scale, shift),
    -128, 127)`` with (scale, shift) from the window size; channels a multiple of 4."""
    y = xs3.avgpool2d(
        x.astype(jnp.int8),
        window_shape=tuple(attrs["window"]),
        window_stride=tuple(attrs["strides"]),
        variant=target.variant,
    )
    return no_acc(y.astype(jnp.int32), return_acc)


# ------------------------------------------------------------------------- add


def xs3_add_params(*, s1, z1, s2, z2, s_out, z_out) -> dict:
    """``add_elementwise`` parameters (§6.4): ``m1, m2`` int16, ``bias`` int32, ``shift``.

    Chooses the largest ``shift`` in [0, 24] for which ``m_i = round(s_i / s_out *
    2**shift)`` fit int16, and ``bias = round((z_out - z1 s1/s_out - z2 s2/s_out)
    2**shift)``. A fused ReLU needs no parameter: its output range starts at 0, so
    ``z_out = -128`` and the int8 clamp is the ReLU.
    """
    for v, name in ((s1, "s1"), (s2, "s2"), (s_out, "s_out")):
        V.check_positive(V.as_array(v, name), name)
    for v, name in ((z1, "z1"), (z2, "z2"), (z_out, "z_out")):
        V.check_range(V.as_array(v, name), -128, 127, name)
    r1, r2 = div_rn(s1, s_out), div_rn(s2, s_out)
    big = jnp.maximum(jnp.abs(r1), jnp.abs(r2))
    e = jnp.clip(14 - float_exponent(big), 0, 24)
    m1 = jnp.clip(jnp.round(jnp.ldexp(r1, e)), -32767, 32767)
    m2 = jnp.clip(jnp.round(jnp.ldexp(r2, e)), -32767, 32767)
    b = (
        jnp.asarray(z_out).astype(jnp.float32)
        - jnp.asarray(z1).astype(jnp.float32) * r1
        - jnp.asarray(z2).astype(jnp.float32) * r2
    )
    bias = jnp.clip(jnp.round(jnp.ldexp(b, e)), -(2.0**30), 2.0**30)
    return {
        "m1": m1.astype(jnp.int32),
        "m2": m2.astype(jnp.int32),
        "bias": bias.astype(jnp.int32),
        "shift": e.astype(jnp.int32),
    }


def _add_params(target, attrs, p, q_in, q_out) -> dict:
    return xs3_add_params(
        s1=q_in[0].scale,
        z1=q_in[0].zero_point,
        s2=q_in[1].scale,
        z2=q_in[1].zero_point,
        s_out=q_out.scale,
        z_out=q_out.zero_point,
    )


def _add_export(target, attrs, params):
    """``params``: (5, 16) int16 lanes ``m1, m2, shift, bias_hi, bias_lo``."""
    bias = int(params["bias"])
    lanes = [
        int(params["m1"]),
        int(params["m2"]),
        int(params["shift"]),
        bias >> 16,
        ((bias & 0xFFFF) ^ 0x8000) - 0x8000,
    ]  # bias_lo: the low 16 bits' int16 pattern
    return {"params": np.repeat(np.asarray(lanes, np.int16)[:, None], 16, axis=1)}, {}


def _add_load(target, attrs, tensors, meta) -> dict:
    p = np.asarray(tensors["params"], np.int32)
    if p.shape != (5, 16):
        raise FormatError(f"add params must have shape (5, 16), got {p.shape}")
    bias = (p[3, 0] << 16) + (p[4, 0] & 0xFFFF)
    return {"m1": jnp.int32(p[0, 0]), "m2": jnp.int32(p[1, 0]), "bias": jnp.int32(bias), "shift": jnp.int32(p[2, 0])}


@XS3.implements("add", params=_add_params, export=_add_export, load=_add_load)
def _xs3_add(target, attrs, params, x1, x2, return_acc: bool = False):
    """:func:`hwjax.xs3.add_int8`, the current ``add_elementwise`` (§6.4)."""
    y = xs3.add_int8(
        x1.astype(jnp.int8),
        x2.astype(jnp.int8),
        multiplier0=params["m1"],
        multiplier1=params["m2"],
        bias=params["bias"],
        shift=params["shift"],
        variant=target.variant,
    )
    return no_acc(y.astype(jnp.int32), return_acc)


# ------------------------------------------------------------------------- LUT


def _lut_params(target, attrs, p, q_in, q_out) -> dict:
    """The 256-entry int8 table of ``lookup8`` (§6.6) for ``fn`` (:func:`lut_table`)."""
    return {"table": lut_table(attrs["fn"], **_quant_args(q_in, q_out))}


def _lut_export(target, attrs, params):
    """``table``: (256,) uint8, indexed by the input byte."""
    return {"table": (np.asarray(params["table"]) & 0xFF).astype(np.uint8)}, {}


def _lut_load(target, attrs, tensors, meta) -> dict:
    t = np.asarray(tensors["table"]).astype(np.int32)
    if t.shape != (256,):
        raise FormatError(f"a LUT table must have 256 entries, got shape {t.shape}")
    return {"table": jnp.asarray(np.where(t > 127, t - 256, t), jnp.int32)}


@XS3.implements("lut", params=_lut_params, export=_lut_export, load=_lut_load)
def _xs3_lut(target, attrs, params, x, return_acc: bool = False):
    """``lookup8`` (§6.6, :func:`hwjax.xs3.lookup8`): ``y = table[u8(x)]``, the table bytes
    read back as int8."""
    table_u8 = (params["table"] & 0xFF).astype(jnp.uint8)
    y = xs3.lookup8(x.astype(jnp.int8), table_u8, variant=target.variant).astype(jnp.int32)
    return no_acc(jnp.where(y > 127, y - 256, y), return_acc)


# ======================================================================= XS3 legacy


def _host_bso_fields(bias_q, weights, s_in, z_in, s_w, s_out, z_out, *, channel_axis: int):
    f = xs3.derive_bso_fields(
        np.asarray(bias_q, np.int64),
        np.asarray(weights).astype(np.int8),
        input_scale=float(np.float32(s_in)),
        input_zero_point=int(z_in),
        weight_scales=np.asarray(s_w, np.float32),
        output_scale=float(np.float32(s_out)),
        output_zero_point=int(z_out),
        channel_axis=channel_axis,
    )
    return tuple(np.asarray(v, np.int32) for v in f)


def xs3_bso(kernel_q, bias_q, *, s_in, z_in, s_w, s_out, z_out, channel_axis: int = 0) -> jax.Array:
    """The legacy BSO tensor (spec xs3.md §3.1) that tflite2xcore derived (§4.6), for
    traced or concrete inputs: :func:`hwjax.xs3.derive_bso_fields` (host NumPy, float64)
    (directly on concrete inputs, through ``jax.pure_callback`` on traced ones), packed by
    :func:`hwjax.xs3.make_bso`. No gradient."""
    for v, name in ((s_in, "s_in"), (s_w, "s_w"), (s_out, "s_out")):
        V.check_positive(V.as_array(v, name), name)
    for v, name in ((z_in, "z_in"), (z_out, "z_out")):
        V.check_range(V.as_array(v, name), -128, 127, name)
    c = kernel_q.shape[channel_axis]
    raw = (bias_q, kernel_q, s_in, z_in, s_w, s_out, z_out)
    if not any(isinstance(a, jax.core.Tracer) for a in raw):
        return xs3.make_bso(*(jnp.asarray(f) for f in _host_bso_fields(*raw, channel_axis=channel_axis)))
    shapes = tuple(jax.ShapeDtypeStruct((c,), jnp.int32) for _ in range(6))
    args = [
        jnp.asarray(a, d)
        for a, d in (
            (bias_q, jnp.int32),
            (kernel_q, jnp.int32),
            (s_in, jnp.float32),
            (z_in, jnp.int32),
            (s_w, jnp.float32),
            (s_out, jnp.float32),
            (z_out, jnp.int32),
        )
    ]
    fields = jax.pure_callback(
        functools.partial(_host_bso_fields, channel_axis=channel_axis),
        shapes,
        *jax.lax.stop_gradient(args),
        vmap_method="sequential",
    )
    return xs3.make_bso(*fields)


@pytree
@dataclass(frozen=True)
class XS3LegacyParams:
    """Integer parameters of one legacy (BSO) layer: ``kernel`` int8 (conv: OHWI, dense:
    OHWI with a 1x1 window, depthwise: (kh, kw, C)), ``bso`` int16 (G, 7, 16),
    ``zero_point`` (the input zero point, read for padded taps)."""

    kernel: jax.Array
    bso: jax.Array
    zero_point: jax.Array


@dataclass(frozen=True)
class XS3Legacy(XS3):
    """XMOS XS3 with the legacy lib_nn kernels (≤ 2021, tflite2xcore): BSO output stages
    (spec xs3.md §3) with bias-seeded accumulators.

    Ops: ``conv`` (``conv2d_deep``; C_in and C_out multiples of 4), ``dense``
    (``fully_connected_8``; inputs a multiple of 4), ``depthwise_conv``
    (``conv2d_depthwise``; channels a multiple of 4), ``maxpool``, ``avgpool``, ``lut``
    (as :class:`XS3`) and ``add`` (legacy ``add_elementwise``). Parameters are derived
    the tflite2xcore way (:func:`xs3_bso`). ``variant`` as for :class:`XS3`.
    """

    name: ClassVar[str] = "xs3-legacy"

    def check_op(self, op: str, **config: Any) -> None:
        super().check_op(op, **config)
        need = {
            "conv": ("in_features", "out_features"),
            "dense": ("in_features",),
            "depthwise_conv": ("features",),
        }.get(op, ())
        for key in need:
            if config.get(key) is not None and config[key] % 4:
                raise UnsupportedOpError(
                    f"target {self!r}: the legacy {op} kernel needs {key} to be a multiple of 4, got {config[key]}"
                )


def _legacy_stat(st, n: int):
    return _acc_stat(n, st.acc_saturations)


def _legacy_params(op: str):
    def params(target, attrs, p, q_in, q_out) -> XS3LegacyParams:
        k = jnp.asarray(p["kernel"]).astype(jnp.int32)
        k = k if op == "depthwise_conv" else _ohwi(k, op)
        qa = _quant_args(q_in, q_out)
        bso = xs3_bso(
            k,
            jnp.asarray(p["bias"], jnp.int32),
            s_w=p["w_scale"],
            channel_axis=-1 if op == "depthwise_conv" else 0,
            **qa,
        )
        return XS3LegacyParams(k.astype(jnp.int8), bso, jnp.asarray(qa["z_in"], jnp.int32))

    return params


def _legacy_run(op: str):
    def run(target, attrs, params: XS3LegacyParams, x, return_acc: bool = False):
        """``fully_connected_8`` (dense), ``conv2d_deep`` (conv) or ``conv2d_depthwise``."""
        if tuple(attrs.get("dilation", (1, 1))) != (1, 1) or attrs.get("depth_multiplier", 1) != 1:
            raise UnsupportedOpError(
                f"target {target!r}: {op} with dilation {attrs.get('dilation', (1, 1))}, "
                f"depth_multiplier {attrs.get('depth_multiplier', 1)}: only (1, 1), 1 supported"
            )
        if op == "dense":
            c_out = params.kernel.shape[0]
            out = xs3.fully_connected_8(
                x.astype(jnp.int8),
                params.kernel.reshape(c_out, -1),
                params.bso,
                variant=target.variant,
                return_stats=return_acc,
            )
            y, st = out if return_acc else (out, None)
            y = y.astype(jnp.int32)
            return (y, _legacy_stat(st, y.size)) if return_acc else y
        geom = geometry(attrs, x.shape)
        pt, pl = geom.pad_top_left
        kernel_fn = xs3.conv2d_depthwise if op == "depthwise_conv" else xs3.conv2d_deep
        out = kernel_fn(
            x.astype(jnp.int8),
            params.kernel,
            params.bso,
            zero_point=params.zero_point,
            window_start=(-pt, -pl),
            window_stride=geom.stride,
            out_shape=geom.out_hw,
            variant=target.variant,
            return_stats=return_acc,
        )
        y, st = out if return_acc else (out, None)
        y = y.astype(jnp.int32)
        return (y, _legacy_stat(st, y.size)) if return_acc else y

    return run


def _legacy_export(op: str):
    def export(target, attrs, params: XS3LegacyParams):
        """``weights`` (the int8 kernel in the layout the legacy kernel reads: OHWI, (C_out,
        N), (kh, kw, C)) and ``bso`` (the (G, 7, 16) int16 BSO tensor)."""
        k = np.asarray(params.kernel, np.int8)
        kernel_shape = list(k.shape)
        if op == "dense":
            k = k.reshape(k.shape[0], -1)
        return (
            {"weights": k, "bso": np.asarray(params.bso, np.int16)},
            {"pad_value": int(params.zero_point), "kernel_shape": kernel_shape},
        )

    return export


def _legacy_load(op: str):
    def load(target, attrs, tensors, meta) -> XS3LegacyParams:
        shape = tuple(int(v) for v in meta["kernel_shape"])
        k = np.asarray(tensors["weights"])
        if int(np.prod(k.shape)) != int(np.prod(shape)):
            raise FormatError(f"weights hold {k.size} values, kernel_shape {list(shape)} needs {int(np.prod(shape))}")
        c_out = shape[-1] if op == "depthwise_conv" else shape[0]
        bso = np.asarray(tensors["bso"])
        if bso.shape != (-(-c_out // 16), 7, 16):
            raise FormatError(f"bso has shape {bso.shape}, expected {(-(-c_out // 16), 7, 16)}")
        return XS3LegacyParams(jnp.asarray(k.reshape(shape), jnp.int8), jnp.asarray(bso), jnp.int32(meta["pad_value"]))

    return load


for _op in ("conv", "dense", "depthwise_conv"):
    XS3Legacy.implements(_op, params=_legacy_params(_op), export=_legacy_export(_op), load=_legacy_load(_op))(
        _legacy_run(_op)
    )


@XS3Legacy.implements("add", params=_add_params, export=_add_export, load=_add_load)
def _legacy_add(target, attrs, params, x1, x2, return_acc: bool = False):
    """Legacy ``add_elementwise`` (exact 64-bit accumulation): ``acc = bias + x0 m0 + x1 m1``
    (input shifts 0), ``y = clamp(rshr(acc, output_shr), -128, 127)`` with the parameters
    of :func:`xs3_add_params` and ``output_shr = shift``."""
    y = xs3.add_elementwise(
        x1.astype(jnp.int8),
        x2.astype(jnp.int8),
        shr0=0,
        multiplier0=params["m1"],
        shr1=0,
        multiplier1=params["m2"],
        bias=params["bias"],
        output_shr=params["shift"],
        variant=target.variant,
    )
    return no_acc(y.astype(jnp.int32), return_acc)


register("xs3", XS3)
register("xs3-legacy", XS3Legacy)
