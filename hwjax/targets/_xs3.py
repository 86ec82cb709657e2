"""XS3 targets: the current lib_nn API (:class:`XS3`) and the legacy BSO kernels (:class:`XS3Legacy`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.xs3 as xs3
from hwjax.core import div_rn
from hwjax.targets._base import ConvGeometry, Target, float_exponent, lut_table, pytree


@pytree
@dataclass(frozen=True)
class XS3ConvParams:
    """Integer parameters of one XS3 (current lib_nn API) convolution or dense layer.

    ``kernel``: int8 (C_out, kh, kw, C_in) (depthwise: (C, kh, kw)); ``multipliers``,
    ``biases``: int16-valued (C_out,) output-transform vectors; ``initial_shift``,
    ``final_shr``: int32 scalars; ``pad_value``: the input zero point read for padded taps.
    """

    kernel: jax.Array
    multipliers: jax.Array
    biases: jax.Array
    initial_shift: jax.Array
    final_shr: jax.Array
    pad_value: jax.Array


@dataclass(frozen=True)
class XS3(Target):
    """XMOS xcore.ai XS3, current lib_nn API (xformer's ``XC_conv2d_v2``), spec xs3.md §4–§6.

    ``variant``: ``"hardware"`` (the chip; default), ``"host"`` (xmos-ai-tools 1.4.2
    host interpreter) or ``"v2021"``; see :mod:`hwjax.xs3`.

    Layers: ``conv``/``dense`` (im2col ``mat_mul_generic_int8``, 32-product chunks with
    sat32 after each, then ``otfn_int8`` with xformer's parameters), ``depthwise_conv``
    (one saturating VLMACC per tap, then ``otfn_int8``), ``maxpool`` (int8 max),
    ``avgpool`` (``avgpool2d`` scale-and-shift, §6.1), ``add`` (``add_elementwise``,
    §6.4) and ``lut`` (``lookup8``: a 256-entry table, §6.6).
    """

    variant: str = "hardware"
    name: ClassVar[str] = "xs3"
    layers: ClassVar[frozenset[str]] = frozenset(
        {"conv", "dense", "depthwise_conv", "maxpool", "avgpool", "add", "lut"})

    def __post_init__(self):
        variants = ("hardware", "host", "v2021")
        if self.variant not in variants:
            raise ValueError(f"variant must be one of {variants}, got {self.variant!r}")

    # -------------------------------------------------------------- linear layers

    def conv_params(self, kernel_ohwi, bias_q, *, s_in, z_in, s_w, s_out, z_out, relu: bool = False) -> XS3ConvParams:
        """xformer's parameters (:func:`hwjax.xs3.otfn_params`) for an OHWI int8 kernel. (A
        fused ReLU needs no parameter: its output range starts at 0, so ``z_out = -128``
        and the int8 clamp is the ReLU.)"""
        mul, bias, shifts = xs3.otfn_params(kernel_ohwi, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out,
                                            z_out=z_out)
        return XS3ConvParams(kernel_ohwi.astype(jnp.int8), mul, bias, shifts[0], shifts[1],
                             jnp.asarray(z_in, jnp.int32))

    def conv(self, x, params: XS3ConvParams, geom: ConvGeometry, *, return_acc: bool = False):
        """:func:`hwjax.xs3.conv2d` (im2col + ``mat_mul_generic_int8`` + ``otfn_int8``) on int8
        NHWC ``x``, with the (possibly traced) shifts and pad value of ``params``.
        Returns ``(y, acc)``: int32 int8-valued outputs and the accumulators (or None)."""
        y, acc = xs3.conv2d(x, params.kernel, params.multipliers, params.biases,
                            initial_shift=params.initial_shift, final_shr=params.final_shr,
                            stride=geom.stride, pad_top_left=geom.pad_top_left, pad_value=params.pad_value,
                            out_shape=geom.out_hw, variant=self.variant, return_accumulators=True)
        return y.astype(jnp.int32), (acc if return_acc else None)

    def depthwise_params(self, kernel_hwc, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                         relu: bool = False) -> XS3ConvParams:
        """xformer's parameters for a depthwise (kh, kw, C) int8 kernel (stored as (C, kh, kw))."""
        k = jnp.transpose(kernel_hwc, (2, 0, 1))
        mul, bias, shifts = xs3.otfn_params(k, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out)
        return XS3ConvParams(k.astype(jnp.int8), mul, bias, shifts[0], shifts[1], jnp.asarray(z_in, jnp.int32))

    def depthwise(self, x, params: XS3ConvParams, geom: ConvGeometry, *, return_acc: bool = False):
        """:func:`hwjax.xs3.depthwise_conv2d` (``mat_mul_dw_direct`` + ``otfn_int8``)."""
        y, acc = xs3.depthwise_conv2d(x, jnp.transpose(params.kernel, (1, 2, 0)), params.multipliers,
                                      params.biases, initial_shift=params.initial_shift,
                                      final_shr=params.final_shr, stride=geom.stride,
                                      pad_top_left=geom.pad_top_left, pad_value=params.pad_value,
                                      out_shape=geom.out_hw, variant=self.variant, return_accumulators=True)
        return y.astype(jnp.int32), (acc if return_acc else None)

    # ----------------------------------------------------------------------- pools

    def maxpool(self, x, window, strides):
        """``maxpool`` (§6.3, :func:`hwjax.xs3.maxpool2d`): per channel, the max over the window
        starting from -128 (no padding)."""
        y = xs3.maxpool2d(x.astype(jnp.int8), window_shape=tuple(window), window_stride=tuple(strides),
                             variant=self.variant)
        return y.astype(jnp.int32)

    def avgpool(self, x, window, strides):
        """``avgpool2d`` (§6.1, :func:`hwjax.xs3.avgpool2d`): ``clamp(rshr(sum(x) * scale, shift),
        -128, 127)`` with (scale, shift) from the window size; channels a multiple of 4."""
        y = xs3.avgpool2d(x.astype(jnp.int8), window_shape=tuple(window), window_stride=tuple(strides),
                             variant=self.variant)
        return y.astype(jnp.int32)

    # ------------------------------------------------------------------------ add

    def add_params(self, *, s1, z1, s2, z2, s_out, z_out, relu: bool = False) -> dict:
        """``add_elementwise`` parameters (§6.4): ``m1, m2`` int16, ``bias`` int32, ``shift``.

        Chooses the largest ``shift`` in [0, 24] for which ``m_i = round(s_i / s_out *
        2**shift)`` fit int16, and ``bias = round((z_out - z1 s1/s_out - z2 s2/s_out)
        2**shift)``. ``relu`` needs no parameter: a fused ReLU's output range starts at
        0, so ``z_out = -128`` and the int8 clamp is the ReLU.
        """
        r1, r2 = div_rn(s1, s_out), div_rn(s2, s_out)
        big = jnp.maximum(jnp.abs(r1), jnp.abs(r2))
        e = jnp.clip(14 - float_exponent(big), 0, 24)
        m1 = jnp.clip(jnp.round(jnp.ldexp(r1, e)), -32767, 32767)
        m2 = jnp.clip(jnp.round(jnp.ldexp(r2, e)), -32767, 32767)
        b = z_out.astype(jnp.float32) - z1.astype(jnp.float32) * r1 - z2.astype(jnp.float32) * r2
        bias = jnp.clip(jnp.round(jnp.ldexp(b, e)), -(2.0**30), 2.0**30)
        return {"m1": m1.astype(jnp.int32), "m2": m2.astype(jnp.int32), "bias": bias.astype(jnp.int32),
                "shift": e.astype(jnp.int32)}

    def add(self, x1, x2, params: dict):
        """:func:`hwjax.xs3.add_int8`, the current ``add_elementwise`` (§6.4)."""
        y = xs3.add_int8(x1.astype(jnp.int8), x2.astype(jnp.int8), multiplier0=params["m1"],
                         multiplier1=params["m2"], bias=params["bias"], shift=params["shift"], variant=self.variant)
        return y.astype(jnp.int32)

    # ------------------------------------------------------------------------ LUT

    def lut_params(self, fn: str, *, s_in, z_in, s_out, z_out) -> dict:
        """The 256-entry int8 table of ``lookup8`` (§6.6) for ``fn`` (:func:`lut_table`)."""
        return {"table": lut_table(fn, s_in=s_in, z_in=z_in, s_out=s_out, z_out=z_out)}

    def lut(self, x, params: dict):
        """``lookup8`` (§6.6, :func:`hwjax.xs3.lookup8`): ``y = table[u8(x)]``, the table bytes
        read back as int8."""
        table_u8 = (params["table"] & 0xFF).astype(jnp.uint8)
        y = xs3.lookup8(x.astype(jnp.int8), table_u8, variant=self.variant).astype(jnp.int32)
        return jnp.where(y > 127, y - 256, y)

    # ------------------------------------------------------------- memory formats

    def export_tensors(self, kind: str, params) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The integer tensors of one layer in XS3 memory format, plus the scalars.

        * ``conv``/``dense``: ``weights`` = :func:`hwjax.xs3.reorder_kernel_weights` of the
          OHWI kernel (int8 stream), ``output_transform`` =
          :func:`hwjax.xs3.serialise_output_transform` (int16); scalars
          ``initial_shift``, ``final_shr``, ``pad_value``, ``kernel_shape``.
        * ``depthwise_conv``: ``weights`` (kh, kw, C) int8 (channels innermost, the
          ``mat_mul_dw_direct`` layout), ``output_transform`` as above.
        * ``add``: ``params`` (5, 16) int16 lanes ``m1, m2, shift, bias_hi, bias_lo``.
        * ``lut``: ``table`` (256,) uint8, indexed by the input byte.

        Raises ValueError when a shift leaves the range the chip's assembly supports.
        """
        if kind in ("conv", "dense", "depthwise_conv"):
            ish, fsh = int(params.initial_shift), int(params.final_shr)
            if not (-16 <= ish <= 16 and -16 <= fsh <= 15):
                raise ValueError(f"initial_shift={ish} / final_shr={fsh} outside the XS3 otfn_int8 assembly's "
                                 f"ranges [-16, 16] / [-16, 15]: this layer cannot be exported for the chip")
            k = np.asarray(params.kernel, np.int8)
            weights = (np.asarray(xs3.reorder_kernel_weights(k, pad_value=0), np.int8) if kind != "depthwise_conv"
                       else np.ascontiguousarray(np.transpose(k, (1, 2, 0))))
            ot = np.asarray(xs3.serialise_output_transform(np.asarray(params.multipliers, np.int32),
                                                           np.asarray(params.biases, np.int32)), np.int16)
            meta = {"initial_shift": ish, "final_shr": fsh, "pad_value": int(params.pad_value),
                    "kernel_shape": list(k.shape)}
            return {"weights": weights, "output_transform": ot}, meta
        if kind == "add":
            bias = int(params["bias"])
            lanes = [int(params["m1"]), int(params["m2"]), int(params["shift"]), bias >> 16,
                     ((bias & 0xFFFF) ^ 0x8000) - 0x8000]  # bias_lo: the low 16 bits' int16 pattern
            return {"params": np.repeat(np.asarray(lanes, np.int16)[:, None], 16, axis=1)}, {}
        if kind == "lut":
            return {"table": (np.asarray(params["table"]) & 0xFF).astype(np.uint8)}, {}
        return {}, {}

    def import_tensors(self, kind: str, tensors: dict[str, np.ndarray], meta: dict[str, Any]):
        """Inverse of :meth:`export_tensors` (ValueError on inconsistent sizes)."""
        if kind in ("conv", "dense", "depthwise_conv"):
            shape = tuple(int(v) for v in meta["kernel_shape"])
            if kind == "depthwise_conv":
                w = tensors["weights"]
                if w.shape != (shape[1], shape[2], shape[0]):
                    raise ValueError(f"depthwise weights have shape {w.shape}, expected {(shape[1], shape[2], shape[0])}")
                k = jnp.asarray(np.transpose(w, (2, 0, 1)))
            else:
                k = xs3.reorder_kernel_weights_inverse(jnp.asarray(tensors["weights"]), shape)
            ot = xs3.deserialise_output_transform(tensors["output_transform"], shape[0])
            return XS3ConvParams(k.astype(jnp.int8), jnp.asarray(ot["multipliers"], jnp.int32),
                                 jnp.asarray(ot["biases"], jnp.int32), jnp.int32(meta["initial_shift"]),
                                 jnp.int32(meta["final_shr"]), jnp.int32(meta["pad_value"]))
        if kind == "add":
            p = np.asarray(tensors["params"], np.int32)
            if p.shape != (5, 16):
                raise ValueError(f"add params must have shape (5, 16), got {p.shape}")
            bias = (p[3, 0] << 16) + (p[4, 0] & 0xFFFF)
            return {"m1": jnp.int32(p[0, 0]), "m2": jnp.int32(p[1, 0]), "bias": jnp.int32(bias),
                    "shift": jnp.int32(p[2, 0])}
        if kind == "lut":
            t = np.asarray(tensors["table"]).astype(np.int32)
            if t.shape != (256,):
                raise ValueError(f"a LUT table must have 256 entries, got shape {t.shape}")
            return {"table": jnp.asarray(np.where(t > 127, t - 256, t), jnp.int32)}
        return None


# ======================================================================= XS3 legacy


def _host_bso_fields(bias_q, weights, s_in, z_in, s_w, s_out, z_out, *, channel_axis: int):
    f = xs3.derive_bso_fields(np.asarray(bias_q, np.int64), np.asarray(weights).astype(np.int8),
                                 input_scale=float(np.float32(s_in)), input_zero_point=int(z_in),
                                 weight_scales=np.asarray(s_w, np.float32), output_scale=float(np.float32(s_out)),
                                 output_zero_point=int(z_out), channel_axis=channel_axis)
    return tuple(np.asarray(v, np.int32) for v in f)


def xs3_bso(kernel_q, bias_q, *, s_in, z_in, s_w, s_out, z_out, channel_axis: int = 0) -> jax.Array:
    """The legacy BSO tensor (spec xs3.md §3.1) that tflite2xcore derived (§4.6), for
    traced or concrete inputs: :func:`hwjax.xs3.derive_bso_fields` (host NumPy, float64)
    through ``jax.pure_callback``, packed by :func:`hwjax.xs3.make_bso`. No gradient."""
    c = kernel_q.shape[channel_axis]
    shapes = tuple(jax.ShapeDtypeStruct((c,), jnp.int32) for _ in range(6))
    args = [jnp.asarray(a, d) for a, d in ((bias_q, jnp.int32), (kernel_q, jnp.int32), (s_in, jnp.float32),
                                           (z_in, jnp.int32), (s_w, jnp.float32), (s_out, jnp.float32),
                                           (z_out, jnp.int32))]
    fields = jax.pure_callback(functools.partial(_host_bso_fields, channel_axis=channel_axis), shapes,
                               *jax.lax.stop_gradient(args), vmap_method="sequential")
    return xs3.make_bso(*fields)


@pytree
@dataclass(frozen=True)
class XS3LegacyParams:
    """Integer parameters of one legacy (BSO) layer: ``kernel`` int8 (conv: OHWI, dense:
    (C_out, N), depthwise: (kh, kw, C)), ``bso`` int16 (G, 7, 16), ``zero_point`` (the
    input zero point, read for padded taps)."""

    kernel: jax.Array
    bso: jax.Array
    zero_point: jax.Array


def _legacy_acc_stats(stats, n: int):
    return None if stats is None else {"count": n, "saturated": stats.acc_saturations.sum(dtype=jnp.int32)}


@dataclass(frozen=True)
class XS3Legacy(XS3):
    """XMOS XS3 with the legacy lib_nn kernels (≤ 2021, tflite2xcore): BSO output stages
    (spec xs3.md §3) with bias-seeded accumulators.

    Layers: ``conv`` (``conv2d_deep``; C_in and C_out multiples of 4), ``dense``
    (``fully_connected_8``; inputs a multiple of 4), ``depthwise_conv``
    (``conv2d_depthwise``; channels a multiple of 4), ``maxpool``, ``avgpool``, ``lut``
    (as :class:`XS3`) and ``add`` (legacy ``add_elementwise``). Parameters are derived
    the tflite2xcore way (:func:`xs3_bso`). ``variant`` as for :class:`XS3`.
    """

    name: ClassVar[str] = "xs3-legacy"

    def check_layer(self, kind: str, **config: Any) -> None:
        super().check_layer(kind, **config)
        need = {"conv": ("in_features", "out_features"), "dense": ("in_features",),
                "depthwise_conv": ("features",)}.get(kind, ())
        for key in need:
            if config.get(key) is not None and config[key] % 4:
                raise NotImplementedError(f"target {self!r}: the legacy {kind} kernel needs {key} to be a multiple "
                                          f"of 4, got {config[key]}")

    def conv_params(self, kernel_ohwi, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                    relu: bool = False) -> XS3LegacyParams:
        bso = xs3_bso(kernel_ohwi, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out)
        return XS3LegacyParams(kernel_ohwi.astype(jnp.int8), bso, jnp.asarray(z_in, jnp.int32))

    def conv(self, x, params: XS3LegacyParams, geom: ConvGeometry, *, return_acc: bool = False):
        """``conv2d_deep`` (1x1 kernels on a 1x1 image: ``fully_connected_8``)."""
        c_out = params.kernel.shape[0]
        if geom.in_hw == (1, 1) and geom.kernel == (1, 1) and geom.padding == ((0, 0), (0, 0)):
            out = xs3.fully_connected_8(x[:, 0, 0, :].astype(jnp.int8), params.kernel.reshape(c_out, -1),
                                        params.bso, variant=self.variant, return_stats=return_acc)
            y, st = out if return_acc else (out, None)
            return y[:, None, None, :].astype(jnp.int32), _legacy_acc_stats(st, x.shape[0] * c_out)
        pt, pl = geom.pad_top_left
        out = xs3.conv2d_deep(x.astype(jnp.int8), params.kernel, params.bso, zero_point=params.zero_point,
                              window_start=(-pt, -pl), window_stride=geom.stride, out_shape=geom.out_hw,
                              variant=self.variant, return_stats=return_acc)
        y, st = out if return_acc else (out, None)
        return y.astype(jnp.int32), _legacy_acc_stats(st, x.shape[0] * geom.out_hw[0] * geom.out_hw[1] * c_out)

    def depthwise_params(self, kernel_hwc, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                         relu: bool = False) -> XS3LegacyParams:
        bso = xs3_bso(kernel_hwc, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out, channel_axis=-1)
        return XS3LegacyParams(kernel_hwc.astype(jnp.int8), bso, jnp.asarray(z_in, jnp.int32))

    def depthwise(self, x, params: XS3LegacyParams, geom: ConvGeometry, *, return_acc: bool = False):
        """``conv2d_depthwise`` (bias-seeded, one saturating VLMACC per tap)."""
        pt, pl = geom.pad_top_left
        out = xs3.conv2d_depthwise(x.astype(jnp.int8), params.kernel, params.bso, zero_point=params.zero_point,
                                      window_start=(-pt, -pl), window_stride=geom.stride, out_shape=geom.out_hw,
                                      variant=self.variant, return_stats=return_acc)
        y, st = out if return_acc else (out, None)
        return y.astype(jnp.int32), _legacy_acc_stats(st, y.size)

    def add_params(self, *, s1, z1, s2, z2, s_out, z_out, relu: bool = False) -> dict:
        """Legacy ``add_elementwise`` parameters: ``acc = bias + x0 m0 + x1 m1`` (input shifts
        0), ``y = clamp(rshr(acc, output_shr), -128, 127)``; the same scale choice as
        :meth:`XS3.add_params`, with ``output_shr = shift``."""
        return XS3.add_params(self, s1=s1, z1=z1, s2=s2, z2=z2, s_out=s_out, z_out=z_out, relu=relu)

    def add(self, x1, x2, params: dict):
        """Legacy ``add_elementwise`` (exact 64-bit accumulation)."""
        y = xs3.add_elementwise(x1.astype(jnp.int8), x2.astype(jnp.int8), shr0=0, multiplier0=params["m1"],
                                   shr1=0, multiplier1=params["m2"], bias=params["bias"],
                                   output_shr=params["shift"], variant=self.variant)
        return y.astype(jnp.int32)

    def export_tensors(self, kind: str, params):
        """``conv``/``dense``/``depthwise_conv``: ``weights`` (the int8 kernel in the layout
        the legacy kernel reads: OHWI, (C_out, N), (kh, kw, C)) and ``bso`` (the (G, 7, 16)
        int16 BSO tensor); ``add``/``lut`` as :meth:`XS3.export_tensors`."""
        if kind not in ("conv", "dense", "depthwise_conv"):
            return XS3.export_tensors(self, kind, params)
        k = np.asarray(params.kernel, np.int8)
        if kind == "dense":
            k = k.reshape(k.shape[0], -1)
        return ({"weights": k, "bso": np.asarray(params.bso, np.int16)},
                {"pad_value": int(params.zero_point), "kernel_shape": list(np.asarray(params.kernel).shape)})

    def import_tensors(self, kind: str, tensors: dict, meta: dict):
        if kind not in ("conv", "dense", "depthwise_conv"):
            return XS3.import_tensors(self, kind, tensors, meta)
        shape = tuple(int(v) for v in meta["kernel_shape"])
        k = np.asarray(tensors["weights"])
        if int(np.prod(k.shape)) != int(np.prod(shape)):
            raise ValueError(f"weights hold {k.size} values, kernel_shape {list(shape)} needs {int(np.prod(shape))}")
        c_out = shape[-1] if kind == "depthwise_conv" else shape[0]
        bso = np.asarray(tensors["bso"])
        if bso.shape != (-(-c_out // 16), 7, 16):
            raise ValueError(f"bso has shape {bso.shape}, expected {(-(-c_out // 16), 7, 16)}")
        return XS3LegacyParams(jnp.asarray(k.reshape(shape), jnp.int8), jnp.asarray(bso),
                               jnp.int32(meta["pad_value"]))
