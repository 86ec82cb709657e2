"""An original int8 model compiled as xformer 1.4.2 does, then run as lib_tflite_micro runs it.

:class:`XS3Compiled` (registered as ``"xs3-xformer"``; ``Model.run(x, runtime="xs3")`` on an
original model) lowers each op the way xformer converts it with default options (the
recipes of :mod:`hwjax.targets._xformer`: output transforms, ADD, MEAN, LUT, SOFTMAX, MUL
parameters, dropped activations) and runs the result with the XC kernels of
:class:`XS3Runtime`; :func:`check_xformer_lowering` refuses what it does not cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax import xs3
from hwjax.core import evaluated_if_concrete, stored_value
from hwjax.errors import ArgTypeError, UnsupportedOpError
from hwjax.graph import PRE_ACTIVATION, Attrs, geometry
from hwjax.targets._base import no_acc, pytree, register, static
from hwjax.targets._tflite import TFLite, const_operand_quants, const_operands, host_recipe
from hwjax.targets._xs3 import conv_kernel_sums, xformer_host_otfn
from hwjax.litert import activation_range
from hwjax.targets._xformer import (
    ERR_THRESHOLD,
    xformer_add_params,
    xformer_drops_activation,
    xformer_lut_table,
    xformer_mean_scale,
    xformer_mul_params,
    xformer_softmax_table,
    xformer_transform_choice,
)
from hwjax.targets._xs3_runtime import XS3Runtime, _I32, _xc_mul, _xc_softmax, mean_f32, softmax_lowered


#: the op kinds of an original model that :class:`XS3Compiled` lowers as xformer does
#: (linear ops: ``XC_conv2d_v2``; the rest run the same bytes/arithmetic either way)
COMPILED_OPS = (
    "conv",
    "depthwise_conv",
    "dense",
    "maxpool",
    "activation",
    "flatten",
    "reshape",
    "pad",
    "quantize",
    "add",
    "mean",
    "lut",
    "softmax",
    "mul",
    "concat",
    "avgpool",
    "add_const",
    "mul_const",
    "pool",
)


@dataclass(frozen=True)
class XS3Compiled(XS3Runtime):
    """An *original* int8 model run as xformer (default options) + lib_tflite_micro run it.

    CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED become ``XC_conv2d_v2`` (xs3.md §4.5):
    output channels padded with zero weights, zero bias and weight scale 0 to a multiple
    of 4 (:func:`xformer_linear_params`), the group-wise ``otfn_int8`` parameters of
    :func:`hwjax.xs3.otfn_params`, padded taps holding the input zero point, a
    3-channel conv input padded to 4 (``XC_pad_3_to_4``); a fused RELU / RELU6 whose output
    zero point is not -128 as xformer's ``XC_lookup``, every other fused activation dropped
    (:func:`xformer_drops_activation`; RELU at zero point -128 is the identity anyway).
    Per layer, :func:`xformer_transform_choice` decides as xformer does between the group
    transform, the channel-wise transform and leaving the TFLM op (computed on the host;
    all three results are computed and one is selected).
    ADD and MEAN become ``XC_add`` / ``XC_mean``; TANH and LOGISTIC ``XC_lookup``
    (:func:`xformer_lut_table`), SOFTMAX ``XC_softmax`` / ``XC_batched_softmax`` per row
    (:func:`xformer_softmax_table`), MUL ``XC_mul`` (:func:`xformer_mul_params`; a fused
    RELU / RELU6 of ADD or MUL an ``XC_lookup`` after it), an ADD's or MUL's constant operand
    ``XC_broadcast`` to the input's shape, CONCATENATION ``XC_concat`` (a byte copy) and
    AVERAGE_POOL_2D a depthwise ``XC_conv2d_v2`` of ones (:func:`xformer_avgpool_as_depthwise`;
    with SAME padding after an ``XC_pad`` of the input zero point; a padded MAX_POOL_2D gives
    TFLite's values).
    A standalone RELU / RELU6 is an ``XC_lookup`` too, RELU_N1_TO_1 TFLM's kernel.
    :func:`check_xformer_lowering` says what is not covered
    (``Model.run(runtime="xs3")`` calls it).
    """

    name: ClassVar[str] = "xs3-xformer"


def _padded_channels(n: int) -> int:
    return -(-n // 4) * 4


def _linear_kernel(op: str, k: jax.Array, xp=jnp) -> jax.Array:
    """The kernel as (C_out, kh, kw, C_in) (depthwise: (C, kh, kw, 1)); ``xp`` is ``jnp`` or,
    for host arrays, ``np``."""
    if op == "dense":
        return k[:, None, None, :]
    if op == "depthwise_conv":
        return xp.moveaxis(k, -1, 0)[..., None]
    return k


_LINEAR = {}


def xformer_linear_params(op: str, portable, q_in, q_out) -> dict:
    """:func:`_xformer_linear_params`, memoised on concrete arguments' bytes
    (:func:`check_xformer_lowering` and the lowering ask for the same layers)."""
    args = (
        portable["kernel"],
        portable["bias"],
        portable["w_scale"],
        q_in[0].scale,
        q_in[0].zero_point,
        q_out.scale,
        q_out.zero_point,
    )
    if any(isinstance(a, jax.core.Tracer) for a in args):
        return _xformer_linear_params(op, portable, q_in, q_out)
    key = (op,) + tuple((np.asarray(a).dtype.str, np.shape(a), np.asarray(a).tobytes()) for a in args)
    if key not in _LINEAR:
        if len(_LINEAR) > 256:
            _LINEAR.clear()
        _LINEAR[key] = _xformer_linear_params(op, portable, q_in, q_out, xp=np)
    return dict(_LINEAR[key])


def _xformer_linear_params(op: str, portable, q_in, q_out, xp=jnp) -> dict:
    """xformer's ``XC_conv2d_v2`` parameters of a conv/depthwise/dense node: the kernel
    (C_pad, kh, kw, C_in) with C_pad = C_out rounded up to a multiple of 4 (pad channels:
    zero weights, zero bias, weight scale 0), and ``otfn_params``' multipliers, biases and
    ``shifts = [initial_shift, final_shr]`` over all C_pad channels (pad channels take part
    in the exponent search, as in xformer). ``xp=np`` takes concrete arguments on the host:
    padded there, and the parameters from xformer's own float64 recipe
    (:func:`hwjax.xs3.otfn_params_from_scales`, no program compiled), or from
    ``otfn_params`` where that refuses the layer (shifts outside the assembly's ranges)."""
    k = _linear_kernel(op, xp.asarray(portable["kernel"]).astype(xp.int8), xp)
    co = k.shape[0]
    extra = _padded_channels(co) - co
    kp = xp.concatenate([k, xp.zeros((extra, *k.shape[1:]), xp.int8)])
    bp = xp.concatenate([xp.asarray(portable["bias"]).astype(xp.int32), xp.zeros((extra,), xp.int32)])
    sw = xp.broadcast_to(xp.asarray(portable["w_scale"]).astype(xp.float32), (co,))
    swp = xp.concatenate([sw, xp.zeros((extra,), xp.float32)])
    host = _host_otfn_params(kp, bp, q_in[0], swp, q_out) if xp is np else None
    mul, bias, shifts = (
        host
        if host is not None
        else xs3.otfn_params(
            kp, bp, s_in=q_in[0].scale, z_in=q_in[0].zero_point, s_w=swp, s_out=q_out.scale, z_out=q_out.zero_point
        )
    )
    zin, zout = (xp.asarray(q.zero_point).astype(xp.int32) for q in (q_in[0], q_out))
    sums = conv_kernel_sums(kp, op)  # conv / dense: derived here once, not by the model's program
    if xp is np:  # host values: transferred, not compiled
        kp, zin, zout, sums = jax.device_put((kp, zin, zout, sums))
    return {
        "kernel": kp,
        "multipliers": mul,
        "biases": bias,
        "shifts": shifts,
        "zin": zin,
        "zout": zout,
        "kernel_sums": sums,
    }


def _host_otfn_params(kernel, bias, q_in, s_w, q_out):
    """``otfn_params``' ``(multipliers, biases, shifts)`` from xformer's float64 host recipe,
    as device arrays; None where the recipe refuses the layer."""
    r = xformer_host_otfn(kernel, bias, q_in, s_w, q_out)
    if r is None:
        return None
    shifts = np.array([r["initial_shift"], r["final_shr"]], np.int32)
    return jax.device_put((r["multipliers"].astype(np.int32), r["biases"].astype(np.int32), shifts))


@pytree
@dataclass(frozen=True)
class KnownMode:
    """xformer's choice for a compiled layer (0: its output transform, 1: the per-channel
    one, 2: the builtin op under TFLM), known at lowering: a static part of the
    parameters' structure (no leaf), so the traced program holds that branch only."""

    mode: int = static()


@pytree
@dataclass(frozen=True)
class KnownShifts:
    """A compiled layer's ``(initial_shift, final_shr)``, known at lowering: static, so
    that its program traces only the form of each shift step these values need
    (:func:`hwjax.xs3.conv2d` takes them as ints)."""

    initial_shift: int = static()
    final_shr: int = static()


@pytree
@dataclass(frozen=True)
class KnownFinalShift:
    """The ``final_shr`` of xformer's per-channel output transform (mode 1), known at
    lowering: static, so that the transform takes the form that shift needs."""

    final_shr: int = static()


def _tflm_builtin(op: str, attrs, portable) -> tuple:
    """``(op, attrs, portable)`` of the builtin that TFLM runs where xformer leaves a layer
    unconverted: the layer itself, except that a FULLY_CONNECTED is a 1x1 CONV_2D by then
    (xformer rewrites every FULLY_CONNECTED as one first: no converted file seen holds a
    FULLY_CONNECTED, and TFLM's CONV_2D applies each channel's scale where xmos' TFLM
    FULLY_CONNECTED takes the first; tests/data/randgraph_xs3/regress_fc_left_to_tflm)."""
    if op != "dense":
        return op, attrs, portable
    conv = Attrs(
        {
            "features": attrs["features"],
            "kernel_size": (1, 1),
            "stride": (1, 1),
            "padding": ((0, 0), (0, 0)),
            "activation": attrs.get("activation"),
        }
    )
    return "conv", conv, {**portable, "kernel": portable["kernel"][:, None, None, :]}


def _compiled_params(op: str, prune: bool = True):
    """The parameters of a compiled conv / depthwise / dense node. With ``prune`` and a
    concrete lowering (the host's), those of the branches :func:`_compiled_run` will not take
    are left out and the choice is kept as :class:`KnownMode`, so its program holds the one
    branch instead of a run-time switch (each branch a whole convolution to compile)."""

    def params(target, attrs, portable, q_in, q_out):
        if attrs.get("depth_multiplier", 1) != 1:  # TFLM's depthwise (see _compiled_run)
            return {"tflm": TFLite._impls[op].params(target, attrs, portable, q_in, q_out)}
        p = xformer_linear_params(op, portable, q_in, q_out)
        xp = _xp(portable["bias"])
        choice = host_recipe(
            lambda *a: xformer_transform_choice(*a),
            p["kernel"],
            xp.pad(xp.asarray(portable["bias"], _I32), (0, p["kernel"].shape[0] - portable["bias"].shape[0])),
            q_in[0].scale,
            q_in[0].zero_point,
            _padded_scales(portable, p["kernel"].shape[0]),
            q_out.scale,
            q_out.zero_point,
        )
        mode = None if not prune or isinstance(choice["mode"], jax.core.Tracer) else int(np.asarray(choice["mode"]))
        tflm = None
        if mode in (None, 2):
            try:  # the TFLM fallback (check_xformer_lowering refuses layers that need one TFLite cannot run)
                b_op, b_attrs, b_portable = _tflm_builtin(op, attrs, portable)
                tflm = TFLite._impls[b_op].params(target, b_attrs, b_portable, q_in, q_out)
            except UnsupportedOpError:
                pass
        if mode not in (None, 1):
            choice = {"mode": choice["mode"]}
        if mode is not None:
            choice = {**choice, "known": KnownMode(mode)}
        if not isinstance(p["shifts"], jax.core.Tracer):  # a concrete lowering: static shifts
            p = {**p, "shifts": KnownShifts(*(int(v) for v in np.asarray(p["shifts"])))}
        if mode == 1 and not isinstance(choice["final_shr"], jax.core.Tracer):
            choice = {**choice, "final_shr": KnownFinalShift(int(np.asarray(choice["final_shr"])))}
        return {**p, "choice": choice, "tflm": tflm}

    return params


def _padded_scales(portable, c_pad: int) -> jax.Array:
    k = portable["kernel"]
    co = k.shape[-1] if k.ndim == 3 else k.shape[0]
    xp = _xp(portable["w_scale"])
    sw = xp.broadcast_to(xp.asarray(portable["w_scale"], np.float32), (co,))
    return xp.concatenate([sw, xp.zeros((c_pad - co,), np.float32)])


def _xp(*arrays):
    """NumPy for concrete arrays (host lowering: no small program compiled per shape), else
    ``jax.numpy`` (parameters lowered inside a trace)."""
    return jnp if any(isinstance(a, jax.core.Tracer) for a in arrays) else np


def _compiled_run(op: str):
    def run(target, attrs, p, x, return_acc: bool = False):
        if attrs.get("depth_multiplier", 1) != 1:
            # xformer 1.4.2 leaves a depthwise convolution with a channel multiplier to TFLM
            # (after an XC_pad of the zero point for SAME, the same values) where its input
            # channels are not a multiple of 4, and writes an XC_conv2d_v2 with one channel's
            # weights per input channel otherwise, whose outputs the host interpreter does not
            # compute as TFLM does (tests/data/randgraph_xs3/regress_depthwise_multiplier)
            if x.shape[-1] % 4 == 0:
                from hwjax.errors import UnsupportedOpError

                raise UnsupportedOpError(
                    f"target {target!r}: {op} with depth_multiplier {attrs['depth_multiplier']} on "
                    f"{x.shape[-1]} channels (a multiple of 4): xformer 1.4.2 writes it as an XC_conv2d_v2 "
                    "with one channel's weights per input channel, which is not emulated"
                )
            return no_acc(TFLite._impls[op].run(target, attrs, p["tflm"], x), return_acc)
        if op == "dense" and x.ndim != 2:
            from hwjax.errors import UnsupportedOpError

            raise UnsupportedOpError(
                f"target {target!r}: dense over several rows (an input of shape {tuple(x.shape[1:])}) is not "
                "compiled as xformer does yet"
            )
        k = p["kernel"]
        co = x.shape[-1] if op == "depthwise_conv" else attrs["features"]  # before padding
        if op == "dense":
            x, geom = x[:, None, None, :], None
        else:
            geom = geometry(attrs, x.shape)
        pad_tl = (0, 0) if geom is None else (geom.padding[0][0], geom.padding[1][0])
        out_hw = (1, 1) if geom is None else geom.out_hw
        shifts = p["shifts"]
        known = isinstance(shifts, KnownShifts)
        common = dict(
            initial_shift=shifts.initial_shift if known else shifts[0],
            final_shr=shifts.final_shr if known else shifts[1],
            stride=(1, 1) if geom is None else geom.stride,
            pad_top_left=pad_tl,
            pad_value=p["zin"],
            out_shape=out_hw,
            variant=target.variant,
        )
        x_in = x
        c = p["choice"]

        def accumulate(x):
            """xformer's compiled op: the output-transform result and the accumulators."""
            if op == "depthwise_conv":
                extra = k.shape[0] - co
                xp = jnp.concatenate([x, jnp.zeros((*x.shape[:-1], extra), x.dtype)], axis=-1) if extra else x
                return xs3.depthwise_conv2d(
                    xp,
                    jnp.moveaxis(k[..., 0], 0, -1),
                    p["multipliers"],
                    p["biases"],
                    dilation=geom.dilation,
                    return_accumulators=True,
                    **common,
                )
            kk = k
            # XC_pad_3_to_4: xformer pads a 3-channel input to 4 channels, the 4th meeting zero
            # weights. Where no partial sum of the 4-channel layer's products can saturate
            # (each |x k| <= 2**14 and kh kw 4 products, at most 2**31 - 1 together), its
            # accumulators are the exact sums, to which the zero products add nothing: the
            # 3-channel convolution gives the same values without the padded copy of the
            # input (VWW's 96x96 RGB layer on xs3: 18-20% more images/s at batch 256)
            if x.shape[-1] == 3 and kk.shape[1] * kk.shape[2] * 4 * 2**14 > 2**31 - 1:
                x = jnp.concatenate([x, jnp.broadcast_to(p["zin"], (*x.shape[:-1], 1)).astype(x.dtype)], axis=-1)
                kk = jnp.concatenate([kk, jnp.zeros((*kk.shape[:-1], 1), kk.dtype)], axis=-1)
            return xs3.conv2d(
                x,
                kk,
                p["multipliers"],
                p["biases"],
                dilation=(1, 1) if geom is None else geom.dilation,
                return_accumulators=True,
                kernel_sums=p.get("kernel_sums"),  # the 4th channel's zero weights add nothing
                **common,
            )

        def finish(y):
            y = y[..., :co].astype(_I32)
            if attrs.get("activation") == "relu":  # XC_lookup of ReLU with equal quantisation
                y = jnp.maximum(y, p["zout"])
            return y[:, 0, 0, :] if op == "dense" else y

        def compiled(x):  # mode 0: the layer's output transform
            return finish(accumulate(x)[0])

        def channelwise(x):  # mode 1: xformer's per-channel output transform
            acc = accumulate(x)[1]
            final_shr = c["final_shr"].final_shr if isinstance(c["final_shr"], KnownFinalShift) else c["final_shr"]
            return finish(
                xs3.otfn_int8_channelwise(
                    acc, c["shifts"], c["multipliers"], c["biases"], final_shr=final_shr, variant=target.variant
                )
            )

        def tflm(x):  # mode 2: xformer leaves the builtin op, which TFLM runs (dense: a 1x1 conv)
            b_op, b_attrs, _ = _tflm_builtin(op, attrs, {"kernel": k})
            y = TFLite._impls[b_op].run(target, b_attrs, p["tflm"], x).astype(_I32)  # as the other modes
            return y[:, 0, 0, :] if op == "dense" else y

        # one branch runs (a conditional, not a select of all of them): the mode is the
        # lowering's, a run-time value when the parameters are traced; the branches whose
        # parameters a pruned lowering left out (_compiled_params) are not in the program
        options = [(0, compiled)]
        if "multipliers" in c:
            options.append((1, channelwise))
        if p["tflm"] is not None:
            options.append((2, tflm))
        if len(options) == 1:
            return no_acc(compiled(x_in), return_acc)
        known = c.get("known")
        if isinstance(known, KnownMode):  # xformer's choice known at lowering: that branch only
            return no_acc(next((f for m, f in options if m == known.mode), compiled)(x_in), return_acc)
        m = jnp.asarray(c["mode"], _I32)
        branch = jnp.int32(0)
        for i, (mode, _) in enumerate(options[1:], 1):
            branch = jnp.where(m == mode, i, branch)
        return no_acc(jax.lax.switch(branch, [f for _, f in options], x_in), return_acc)

    return run


for _op in ("conv", "depthwise_conv", "dense"):
    XS3Compiled.implements(_op, params=_compiled_params(_op), host_params=_compiled_params(_op))(_compiled_run(_op))


def _mean_params(target, attrs, portable, q_in, q_out):
    r = host_recipe(lambda si, so: {"scale": xformer_mean_scale(si, so, attrs["count"])}, q_in[0].scale, q_out.scale)
    return {**r, "zi": jnp.asarray(q_in[0].zero_point, jnp.float32), "zo": jnp.asarray(q_out.zero_point, jnp.float32)}


@XS3Compiled.implements("mean", params=_mean_params)
def _mean(target, attrs, p, x, return_acc: bool = False):
    """TFLite MEAN over contiguous axes as ``XC_mean`` (float32, :func:`mean_f32`)."""
    axes, shape = tuple(attrs["axes"]), x.shape[1:]
    outer, n = int(np.prod(shape[: axes[0]])), int(np.prod(shape[axes[0] : axes[-1] + 1]))
    y = mean_f32(x, outer, n, int(np.prod(shape[axes[-1] + 1 :])), p["zi"], p["zo"], p["scale"])
    kept = [d for i, d in enumerate(shape) if i not in axes]
    if attrs.get("keep_dims"):
        kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return no_acc(y.reshape(x.shape[0], *kept), return_acc)


def _add_params(target, attrs, portable, q_in, q_out):
    p = host_recipe(
        xformer_add_params,
        q_in[0].scale,
        q_in[0].zero_point,
        q_in[1].scale,
        q_in[1].zero_point,
        q_out.scale,
        q_out.zero_point,
    )
    return {**p, **_activation_table(attrs, q_out)}


def _activation_table(attrs, q_out) -> dict:
    """``{"table": ...}`` for a fused RELU / RELU6: the separate ``XC_lookup`` xformer puts
    after an ``XC_add`` / ``XC_mul`` (the table of :func:`xformer_lut_table` between equal
    quantisations, the output's); ``{}`` without an activation. An ADD's RELU6 is the
    ``activation`` node after it (``clamp_after``): the ADD applies its lookup, so that node
    may run as the identity where xformer's rule for a fused linear op drops it (the table
    applied twice gives the same values)."""
    act = attrs.get("activation")
    if act is None and attrs.get("clamp_after") == "relu6":
        act = "relu6"
    if act is None:
        return {}
    return {
        "table": host_recipe(lambda s, z: {"t": xformer_lut_table(act, s, z, s, z)}, q_out.scale, q_out.zero_point)["t"]
    }


def _looked_up(p, y):
    """``y`` through the fused activation's ``XC_lookup`` table, where there is one."""
    return jnp.take(p["table"], y & 0xFF, axis=0) if "table" in p else y


@XS3Compiled.implements("add", params=_add_params, host_params=_add_params)
def _add(target, attrs, p, x1, x2, return_acc: bool = False):
    """TFLite ADD as ``XC_add``; a fused RELU as xformer's ``XC_lookup`` after it (the
    table of :func:`xformer_lut_table` between equal quantisations: ``max(v, z_out)``)."""
    y = xs3.add_per_example(  # one call over an example's values
        x1, x2, multiplier0=p["m1"], multiplier1=p["m2"], bias=p["bias"], shift=p["shift"], variant=target.variant
    ).astype(_I32)
    return no_acc(_looked_up(p, y), return_acc)


def _add_const_params(target, attrs, portable, q_in, q_out):
    return {
        **_add_params(target, attrs, portable, const_operand_quants(attrs, portable, q_in), q_out),
        "value": portable["value"],
    }


@XS3Compiled.implements("add_const", params=_add_const_params, host_params=_add_const_params)
def _add_const(target, attrs, p, x, return_acc: bool = False):
    """ADD with a constant as xformer compiles it: the constant broadcast to the input's
    shape (``XC_broadcast``, or a constant of that shape), then ``XC_add`` as for ``add``."""
    return _add(target, attrs, p, *const_operands(attrs, p, x), return_acc=return_acc)


def xformer_avgpool_as_depthwise(attrs, channels: int):
    """The DEPTHWISE_CONV_2D xformer puts in place of an AVERAGE_POOL_2D
    (``ReplaceAvgPoolWithConv2D``): every weight 1 with scale ``float32(1 / (kh kw))``,
    zero bias, the pool's window, strides and (VALID) padding. Returns (attrs, portable
    params) of a hwjax ``depthwise_conv`` node."""
    kh, kw = (int(v) for v in attrs["window"])
    dw_attrs = {
        "kernel_size": (kh, kw),
        "stride": tuple(int(v) for v in attrs["strides"]),
        "padding": ((0, 0), (0, 0)),
        "dilation": (1, 1),
        "depth_multiplier": 1,
        "activation": None,
    }
    portable = {  # host constants (NumPy: no program compiled for them)
        "kernel": np.ones((kh, kw, channels), np.int8),
        "bias": np.zeros((channels,), np.int32),
        "w_scale": np.asarray(np.float32(1.0 / (kh * kw))),
    }
    return dw_attrs, portable


#: channels for which an average pool's depthwise parameters are derived (one XS3 group of 4)
_POOL_CHANNELS = 4


def _avgpool_params(target, attrs, portable, q_in, q_out):
    """The parameters of xformer's depthwise replacement for 4 channels. Its channels are
    all alike (weights 1 with one scale, zero bias), so each channel's parameters are those
    of any other: the run repeats channel 0's for the input's channel count
    (:func:`_pool_channels`). Derived here, not in the run, so that a run holds no host
    recipe (a host callback would keep JAX from caching the compiled program on disk)."""
    dw_attrs, dw = xformer_avgpool_as_depthwise(attrs, _POOL_CHANNELS)
    return _compiled_params("depthwise_conv", prune=False)(target, dw_attrs, dw, q_in, q_out)


def _pool_channels(p, channels: int):
    """Depthwise parameters derived for :data:`_POOL_CHANNELS` like channels (``p``), for
    ``channels`` like channels: channel 0's values repeated (to the multiple of 4 that
    xformer pads the compiled op to; TFLM's fallback to ``channels``)."""
    padded = -(-channels // 4) * 4

    def rep(a, n, axis=0):
        a = jnp.asarray(a)
        return jnp.repeat(jax.lax.slice_in_dim(a, 0, 1, axis=axis), n, axis=axis)

    out = {**p, **{k: rep(p[k], padded) for k in ("kernel", "multipliers", "biases")}}
    out["choice"] = {**p["choice"], **{k: rep(p["choice"][k], padded) for k in ("biases", "multipliers", "shifts")}}
    if p["tflm"] is not None:
        t = p["tflm"]
        out["tflm"] = {
            **t,
            "bias": rep(t["bias"], channels),
            "kernel": rep(t["kernel"], channels, axis=-1),
            "rq": jax.tree.map(lambda a: rep(a, channels), t["rq"]),
            **({"wsum": rep(t["wsum"], channels)} if "wsum" in t else {}),
        }
    return out


def _avgpool_run(target, attrs, p, x, return_acc: bool = False):
    """AVERAGE_POOL_2D as xformer's depthwise replacement (:func:`xformer_avgpool_as_depthwise`),
    then as every compiled DEPTHWISE_CONV_2D; with a channel count that is not a multiple
    of 4 xformer keeps that depthwise a builtin, run as TFLM runs it (verified on the host
    interpreter: tests/data/randgraph_xs3)."""
    dw_attrs, _ = xformer_avgpool_as_depthwise(attrs, x.shape[-1])
    dw_p = _pool_channels(p, x.shape[-1])
    if x.shape[-1] % 4:  # xformer leaves this depthwise a builtin that TFLM runs (its double rounding)
        dw_p = {**dw_p, "choice": {**dw_p["choice"], "mode": np.int32(2)}}
    return _compiled_run("depthwise_conv")(target, dw_attrs, dw_p, x, return_acc)


def _lut_params(target, attrs, portable, q_in, q_out):
    fn = attrs["fn"]
    return host_recipe(
        lambda si, zi, so, zo: {"table": xformer_lut_table(fn, si, zi, so, zo)},
        q_in[0].scale,
        q_in[0].zero_point,
        q_out.scale,
        q_out.zero_point,
    )


XS3Compiled.implements("avgpool", params=_avgpool_params, host_params=_avgpool_params)(_avgpool_run)

_TFLM_POOL = TFLite._impls["pool"]


def _pool_params(target, attrs, portable, q_in, q_out):
    if attrs["fn"] == "max":
        return _TFLM_POOL.params(target, attrs, portable, q_in, q_out)
    return {**_avgpool_params(target, attrs, portable, q_in, q_out), "zin": np.int8(np.asarray(q_in[0].zero_point))}


@XS3Compiled.implements("pool", params=_pool_params, host_params=_pool_params)
def _pool(target, attrs, p, x, return_acc: bool = False):
    """A pool with padding (SAME) as xformer compiles it: an ``XC_pad`` of the input, then
    the pool over VALID windows. An average pool's padding holds the input zero point, so
    the padded taps count in the divisor (:func:`_avgpool_run`; TFLite counts the in-image
    taps only). A max pool's holds -128, which no tap exceeds: TFLite's max pool over the
    in-image taps, run as TFLM runs it (its fused activation is refused,
    :func:`check_xformer_lowering`)."""
    if attrs["fn"] == "max":
        return _TFLM_POOL.run(target, attrs, p, x, return_acc=return_acc)
    (top, bottom), (left, right) = attrs["padding"]
    xp = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=p["zin"].astype(x.dtype))
    return _avgpool_run(target, {"window": attrs["window"], "strides": attrs["strides"]}, p, xp, return_acc)


_TFLM_ACTIVATION = XS3Compiled._impls["activation"]


def _activation_params(target, attrs, portable, q_in, q_out):
    fn = attrs["fn"]
    p = {
        "tflm": _TFLM_ACTIVATION.params(target, attrs, portable, q_in, q_out),
        "drop": xformer_drops_activation(fn, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point),
    }
    if fn in ("relu", "relu6"):
        p["table"] = _lut_params(target, attrs, portable, q_in, q_out)["table"]
    return p


@XS3Compiled.implements("activation", params=_activation_params, host_params=_activation_params)
def _activation(target, attrs, p, x, return_acc: bool = False):
    """RELU / RELU6 as ``XC_lookup`` (xformer's table, :func:`xformer_lut_table`), the
    identity where xformer drops a fused activation (:func:`xformer_drops_activation`), else
    (RELU_N1_TO_1, a TFLM op) TFLM's kernel."""
    if "table" in p:
        y = jnp.take(p["table"], x.astype(_I32) & 0xFF, axis=0)
    else:
        y = _TFLM_ACTIVATION.run(target, attrs, p["tflm"], x)
    return no_acc(jnp.where(p["drop"], x.astype(_I32), y), return_acc)


@XS3Compiled.implements("lut", params=_lut_params, host_params=_lut_params)
def _lut(target, attrs, p, x, return_acc: bool = False):
    """TANH / LOGISTIC as ``XC_lookup`` with xformer's table (:func:`xformer_lut_table`)."""
    return no_acc(jnp.take(p["table"], x.astype(_I32) & 0xFF, axis=0), return_acc)


def xformer_keeps_softmax(attrs, q_out) -> bool:
    """Whether xformer 1.4.2 leaves a SOFTMAX to TFLM (a builtin): beta other than 1, or an
    output quantisation other than 1/256 at -128; it makes the others ``XC_softmax`` /
    ``XC_batched_softmax``. Concrete quantisation (host values)."""
    return (
        float(attrs.get("beta", 1.0)) != 1.0
        or float(np.asarray(q_out.scale)) != 1 / 256
        or int(np.asarray(q_out.zero_point)) != -128
    )


_TFLM_SOFTMAX = TFLite._impls["softmax"]


def _softmax_params(target, attrs, portable, q_in, q_out):
    tflm = {"tflm": _TFLM_SOFTMAX.params(target, attrs, portable, q_in, q_out)}
    if not isinstance(q_out.scale, jax.core.Tracer) and xformer_keeps_softmax(attrs, q_out):
        return tflm
    p = host_recipe(lambda si, zi: {"table": xformer_softmax_table(si, zi)}, q_in[0].scale, q_in[0].zero_point)
    # rows of up to 2**24 values (the shape is not known here); TFLM's for a (1, 1, n) input
    return {**softmax_lowered(p["table"], 2**24), **tflm}


@XS3Compiled.implements("softmax", params=_softmax_params, host_params=_softmax_params)
def _softmax(target, attrs, p, x, return_acc: bool = False):
    """SOFTMAX (beta 1, output 1/256 - 128) over the last axis as ``XC_softmax`` (an example
    of one axis: a (1, n) tensor) or ``XC_batched_softmax`` (several rows: xformer reshapes
    the input to (1, rows, n)), the same arithmetic on every row; one row of a tensor of
    more axes ((1, 1, n), (1, 1, 1, n)) stays TFLM's builtin, as does any other SOFTMAX
    (:func:`xformer_keeps_softmax`; verified on the xs3 probe: seed 3215)."""
    one_row = x.ndim > 2 and math.prod(x.shape[1:-1]) == 1
    if "table" not in p or one_row:
        return _TFLM_SOFTMAX.run(target, attrs, p["tflm"], x, return_acc=return_acc)
    y = _xc_softmax(target, {"out_shape": x.shape[1:], "row_size": x.shape[-1]}, p, x)
    return no_acc(y, return_acc)


def _mul_params(target, attrs, portable, q_in, q_out):
    p = host_recipe(
        xformer_mul_params,
        q_in[0].scale,
        q_in[0].zero_point,
        q_in[1].scale,
        q_in[1].zero_point,
        q_out.scale,
        q_out.zero_point,
    )
    return {**p, **_activation_table(attrs, q_out)}


@XS3Compiled.implements("mul", params=_mul_params, host_params=_mul_params)
def _mul(target, attrs, p, x1, x2, return_acc: bool = False):
    """TFLite MUL (same shapes) as ``XC_mul`` (:func:`xformer_mul_params`); a fused RELU or
    RELU6 as xformer's ``XC_lookup`` after it."""
    y = _xc_mul(target, {**p, "out_shape": x1.shape[1:]}, None, x1, x2)
    return no_acc(_looked_up(p, y), return_acc)


def _mul_const_params(target, attrs, portable, q_in, q_out):
    return {
        **_mul_params(target, attrs, portable, const_operand_quants(attrs, portable, q_in), q_out),
        "value": portable["value"],
    }


@XS3Compiled.implements("mul_const", params=_mul_const_params, host_params=_mul_const_params)
def _mul_const(target, attrs, p, x, return_acc: bool = False):
    """MUL by a constant as xformer compiles it: the constant broadcast to the input's shape,
    then ``XC_mul`` as for ``mul``."""
    return _mul(target, attrs, p, *const_operands(attrs, p, x), return_acc=return_acc)


def check_xformer_lowering(graph) -> None:
    """Raises UnsupportedOpError unless :class:`XS3Compiled` computes what xformer (default
    options) + lib_tflite_micro compute for ``graph`` (an original model with concrete
    parameters): every op kind must be in :data:`COMPILED_OPS` (ADD without a fused
    activation, MEAN over contiguous axes), and a linear layer that keeps the group
    transform must have its shifts in the assembly's ranges, and one that xformer leaves
    as a TFLM op must be one :class:`hwjax.targets.TFLite` ``("tflm")`` runs."""
    from hwjax.graph import Graph

    if not isinstance(graph, Graph):
        raise ArgTypeError(
            f"graph must be a hwjax.graph.Graph (an original model's, e.g. "
            f"hwjax.tflite.load(path).graph), got {type(graph).__name__}"
        )
    with evaluated_if_concrete(graph):  # host checks on concrete values, also inside a trace
        # a graph that passed once is not checked again in a later process (stored_value:
        # keyed by every weight and scale); a failing check stores nothing and raises again

        def passed():
            _check_xformer_lowering(graph)
            return np.zeros((), np.int8)  # a marker: the check passed

        stored_value(passed, graph, ("hwjax.targets.check_xformer_lowering",))


def _check_xformer_lowering(graph) -> None:
    for node in graph.nodes:
        if node.op not in COMPILED_OPS:
            raise UnsupportedOpError(
                f"runtime 'xs3' on an original model: node {node.name!r} ({node.op}) is not "
                f"compiled as xformer does yet (supported: {list(COMPILED_OPS)}); convert the "
                "model with xformer and load its output instead"
            )
        if node.op in ("add", "add_const") and node.attrs.get("activation") not in (None, "relu"):
            raise UnsupportedOpError(
                f"node {node.name!r}: ADD with a fused {node.attrs['activation']} is not compiled yet"
            )
        axes = tuple(node.attrs.get("axes", ()))
        if node.op == "mean" and axes != tuple(range(axes[0], axes[-1] + 1)):
            raise UnsupportedOpError(
                f"node {node.name!r}: MEAN over non-contiguous axes {axes} stays a TFLM op "
                "in xformer, which is not implemented here"
            )
        if node.op == "lut" and node.attrs["fn"] not in ("tanh", "sigmoid"):
            raise UnsupportedOpError(f"node {node.name!r}: lut {node.attrs['fn']!r} is not compiled as xformer does")
        if node.op in ("lut", "softmax", "mul", "mul_const", "add_const", "concat", "avgpool", "activation") and any(
            graph.tensors[t].dtype != "int8" for t in (*node.inputs, *node.outputs)
        ):
            raise UnsupportedOpError(f"node {node.name!r} ({node.op}): only int8 tensors are compiled as xformer does")
        if node.op in ("mul", "mul_const"):
            shapes = [graph.tensors[t].shape for t in (*node.inputs, *node.outputs)]
            if node.attrs.get("activation") not in (None, "relu", "relu6") or len(set(shapes)) != 1:
                raise UnsupportedOpError(
                    f"node {node.name!r}: only MUL of same-shape inputs {shapes} without a fused "
                    "activation or with a fused RELU / RELU6 is compiled as XC_mul (and XC_lookup)"
                )
        if node.op == "concat":
            qs = {
                (float(np.asarray(graph.tensors[t].quant.scale)), int(np.asarray(graph.tensors[t].quant.zero_point)))
                for t in (*node.inputs, *node.outputs)
            }
            if len(qs) != 1:
                raise UnsupportedOpError(
                    f"node {node.name!r}: a CONCATENATION whose tensors are quantised "
                    f"differently ({sorted(qs)}) becomes XC_concat, which copies bytes without "
                    "requantising; not emulated"
                )
    xc_linear = set()  # outputs of the linear ops (and average pools) that become XC_conv2d_v2
    for node in graph.nodes:
        if node.op == "avgpool" or (node.op == "pool" and node.attrs["fn"] == "avg"):  # xformer's depthwise
            dw_attrs, dw = xformer_avgpool_as_depthwise(node.attrs, graph.tensors[node.inputs[0]].shape[-1])
            node = node.replace(op="depthwise_conv", attrs=dw_attrs, params=dw)
        if node.op == "depthwise_conv" and node.attrs.get("depth_multiplier", 1) != 1:
            c = graph.tensors[node.inputs[0]].shape[-1]
            if c % 4 == 0:
                raise UnsupportedOpError(
                    f"node {node.name!r}: a depthwise convolution with channel multiplier "
                    f"{node.attrs['depth_multiplier']} on {c} channels (a multiple of 4), which xformer "
                    "1.4.2 writes as an XC_conv2d_v2 with one channel's weights per input channel, is not emulated"
                )
            continue  # left to TFLM by xformer
        if node.op in ("conv", "depthwise_conv", "dense"):
            q_in = [graph.tensors[t].quant for t in node.inputs]
            p = xformer_linear_params(node.op, node.params, q_in, graph.tensors[node.outputs[0]].quant)
            initial_shift, final_shr = (int(v) for v in np.asarray(p["shifts"]))
            if 2.0 ** -(final_shr + 7) <= ERR_THRESHOLD:
                if not (-16 <= initial_shift <= 16 and -16 <= final_shr <= 15):
                    raise UnsupportedOpError(
                        f"node {node.name!r} ({node.op}): xformer's shifts ({initial_shift}, "
                        f"{final_shr}) leave the otfn_int8 ranges"
                    )
                xc_linear.add(node.outputs[0])
                continue
            choice = xformer_transform_choice(
                np.asarray(p["kernel"]),
                np.pad(np.asarray(node.params["bias"]), (0, p["kernel"].shape[0] - node.params["bias"].shape[0])),
                np.asarray(q_in[0].scale),
                np.asarray(q_in[0].zero_point),
                np.asarray(_padded_scales(node.params, p["kernel"].shape[0])),
                np.asarray(graph.tensors[node.outputs[0]].quant.scale),
                np.asarray(graph.tensors[node.outputs[0]].quant.zero_point),
            )
            if int(choice["mode"]) == 2:  # xformer leaves the TFLM op: TFLite must run it
                b_op, b_attrs, b_portable = _tflm_builtin(node.op, node.attrs, node.params)
                TFLite("tflm").lowering(b_op).params(
                    TFLite("tflm"), b_attrs, b_portable, q_in, graph.tensors[node.outputs[0]].quant
                )
            else:
                xc_linear.add(node.outputs[0])
    _check_activations(graph, xc_linear)


def _check_activations(graph, xc_linear: set) -> None:
    """Refuses an ``activation`` node that :func:`xformer_drops_activation` would drop
    although xformer keeps it: one not fused (by the importer's split, ``:pre_activation``)
    into a linear op or average pool xformer converts (``xc_linear``: their outputs), unless
    its clamp is the whole int8 range (then dropping it changes nothing). Also a RELU after
    a CONV_2D between different quantisations, which xformer merges into the conv
    (``TFLPatterns.td``), which is not emulated."""
    producer = {t: n for n in graph.nodes for t in n.outputs}
    for node in graph.nodes:
        if node.op != "activation":
            continue
        fn, src = node.attrs["fn"], node.inputs[0]
        q_in, q_out = graph.tensors[src].quant, graph.tensors[node.outputs[0]].quant
        if q_in is None or q_out is None:
            continue
        fused = src.endswith(PRE_ACTIVATION) and src in xc_linear
        by_add = (  # an ADD's RELU6: the ADD applies xformer's XC_lookup itself (_activation_table)
            fn == "relu6"
            and src in producer
            and producer[src].op in ("add", "add_const")
            and producer[src].attrs.get("clamp_after") == "relu6"
        )
        if (
            not by_add
            and not fused
            and bool(xformer_drops_activation(fn, q_in.scale, q_in.zero_point, q_out.scale, q_out.zero_point))
            and activation_range(fn, q_out.scale, q_out.zero_point) != (-128, 127)
        ):
            what = producer[src].op if src in producer else "a graph input"
            raise UnsupportedOpError(
                f"node {node.name!r}: a {fn} with output zero point "
                f"{int(np.asarray(q_out.zero_point))} that is not fused into a conv/depthwise/"
                f"dense/avgpool which xformer converts (its input comes from {what}) is not "
                "compiled as xformer does (xformer 1.4.2 drops it only when fused; not verified "
                "otherwise)"
            )
        if (
            src.endswith(PRE_ACTIVATION)
            and src in producer
            and (producer[src].op == "maxpool" or producer[src].op == "pool" and producer[src].attrs["fn"] == "max")
            and activation_range(fn, q_out.scale, q_out.zero_point) != (-128, 127)
        ):
            raise UnsupportedOpError(
                f"node {node.name!r}: a {fn} fused into a MAX_POOL_2D is not compiled as xformer "
                "does (xformer 1.4.2 dropped a fused RELU6 where it made the pool an "
                "XC_maxpool2d; when it does is not emulated)"
            )
        if (
            fn == "relu"
            and src in producer
            and producer[src].op == "conv"
            and not src.endswith(PRE_ACTIVATION)
            and (
                float(np.asarray(q_in.scale)) != float(np.asarray(q_out.scale))
                or int(np.asarray(q_in.zero_point)) != int(np.asarray(q_out.zero_point))
            )
        ):
            raise UnsupportedOpError(
                f"node {node.name!r}: a RELU after a CONV_2D between different quantisations "
                "(xformer merges it into the conv) is not compiled as xformer does"
            )


XS3Compiled.native = XS3Runtime.native | {
    "conv",
    "depthwise_conv",
    "dense",
    "mean",
    "add",
    "lut",
    "softmax",
    "mul",
    "avgpool",
    "add_const",
    "mul_const",
}
register("xs3-xformer", XS3Compiled)
