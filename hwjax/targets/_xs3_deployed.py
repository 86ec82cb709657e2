"""The xcore.ai runtime of deployed models: xformer's XC ops and the TFLM fallback.

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
from hwjax.targets._base import no_acc, register
from hwjax.targets._tflite import TFLite

_I32 = jnp.int32


@dataclass(frozen=True)
class XS3Runtime(TFLite):
    """lib_tflite_micro on xcore.ai: XC ops on the XS3 VPU, builtins as TFLM reference kernels.

    ``variant``: the VPU model of the XC kernels (:data:`hwjax.xs3.VARIANTS`): ``"host"``
    (default; bit-equal to ``TFLMHostInterpreter`` of xmos-ai-tools 1.4.2, verified) or
    ``"hardware"`` (the chip: differs from ``"host"`` only in ``otfn_int8``'s final
    shift, xs3.md §4.1). ``runtime`` is always ``"tflm"``.
    """

    runtime: str = "tflm"
    variant: str = "host"
    name: ClassVar[str] = "xs3-tflm"

    def __post_init__(self):
        if self.runtime != "tflm":
            raise ValueError(f"XS3Runtime runs builtins as TFLM does: runtime must be 'tflm', got {self.runtime!r}")
        if self.variant not in xs3.VARIANTS:
            raise ValueError(f"variant must be one of {xs3.VARIANTS}, got {self.variant!r}")


def _stored(target, attrs, portable, q_in, q_out):
    """XC nodes carry the file's integer parameters: lowering keeps them."""
    return portable


def _per_example(x: jax.Array) -> jax.Array:
    """(B, ...) -> (B, N): each example's values in row-major (memory) order."""
    return x.reshape(x.shape[0], -1)


def _shaped(y: jax.Array, attrs) -> jax.Array:
    return y.astype(_I32).reshape(y.shape[0], *attrs["out_shape"])


# ------------------------------------------------------------------------ XC_conv2d_v2


@XS3Runtime.implements("xc_conv2d", params=_stored)
def _xc_conv2d(target, attrs, p, x, return_acc: bool = False):
    """VALID convolution: ``hwjax.xs3.conv2d`` (direct and indirect kernels accumulate the
    same 32-byte chunks of the patch) or ``hwjax.xs3.depthwise_conv2d``, then otfn_int8."""
    out = tuple(attrs["out_shape"])
    ohw = (1, 1) if len(out) == 1 else out[:2]
    x = x.reshape(x.shape[0], *attrs["in_shape"])  # fully connected: the input as one pixel
    common = dict(initial_shift=attrs["initial_shift"], final_shr=attrs["final_shr"], stride=attrs["stride"],
                  pad_top_left=(0, 0), pad_value=0, out_shape=ohw, variant=target.variant)
    if attrs["kernel_type"] == "depthwise":
        y = xs3.depthwise_conv2d(x, p["kernel"], p["multipliers"], p["biases"], **common)
    else:
        y = xs3.conv2d(x, p["kernel"], p["multipliers"], p["biases"], dilation=attrs["dilation"], **common)
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
def _xc_pad_3_to_4(target, attrs, p, x, return_acc: bool = False):
    y = jnp.concatenate([x, jnp.full((*x.shape[:-1], 1), attrs["value"], x.dtype)], axis=-1)
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


@XS3Runtime.implements("xc_add", params=_stored)
def _xc_add(target, attrs, p, x1, x2, return_acc: bool = False):
    """``add_elementwise`` (xs3.md §6.4) through :func:`hwjax.xs3.add_int8`."""
    y = xs3.add_int8(x1, x2, multiplier0=attrs["multiplier1"], multiplier1=attrs["multiplier2"], bias=attrs["bias"],
                     shift=attrs["shift"], variant=target.variant)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_mean", params=_stored)
def _xc_mean(target, attrs, p, x, return_acc: bool = False):
    """Float32 mean (deployed.md §2): ``S`` the exact int32 sum over the reduced axis, then
    ``clamp(rint(fl32(fl32(S - zi*n) * scale) + zo), -128, 127)`` (each float32 operation
    rounded; an optimisation barrier keeps the product from fusing into an FMA)."""
    outer, n, inner = attrs["outer"], attrs["reduced"], attrs["inner"]
    s = x.astype(_I32).reshape(x.shape[0], outer, n, inner).sum(axis=2, dtype=_I32)
    f32 = jnp.float32
    centred = s.astype(f32) - f32(attrs["in_zero_point"] * n)  # exact: |values| < 2**24
    prod = jax.lax.optimization_barrier(centred * f32(attrs["scale"]))
    y = jnp.clip(jnp.round(prod + f32(attrs["out_zero_point"])), -128, 127)
    return no_acc(_shaped(y, attrs), return_acc)


@XS3Runtime.implements("xc_maxpool2d", params=_stored)
def _xc_maxpool2d(target, attrs, p, x, return_acc: bool = False):
    """Per channel the maximum over each VALID window (the kernel starts at -128, which
    every int8 value reaches or exceeds)."""
    (kh, kw), (sr, sc) = attrs["window"], attrs["stride"]
    y = jax.lax.reduce_window(x.astype(_I32), jnp.int32(-128), jax.lax.max, (1, kh, kw, 1), (1, sr, sc, 1), "VALID")
    return no_acc(_shaped(y, attrs), return_acc)


register("xs3-tflm", XS3Runtime)
