"""``quantize`` (float -> int8 with the output tensor's quantisation) and ``flatten``."""

from __future__ import annotations

import math

import jax.numpy as jnp

from hwjax.core import quantize_affine
from hwjax.graph._ops import OpImpl, OpSpec, register_op


def _quantize_params(target, attrs, portable, q_in, q_out):
    return {"scale": q_out.scale, "zero_point": q_out.zero_point}


#: output range of ``quantize`` per ``dtype`` attribute
QUANTIZE_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _quantize_run(target, attrs, params, x, return_acc: bool = False):
    if jnp.issubdtype(x.dtype, jnp.integer):  # already quantised: passes through
        y = x.astype(jnp.int32)
    else:
        lo, hi = QUANTIZE_RANGES[attrs.get("dtype", "int8")]
        y = quantize_affine(x, params["scale"], params["zero_point"], lo=lo, hi=hi).astype(jnp.int32)
    return (y, None) if return_acc else y


def _quantize_export(target, attrs, params):
    return {}, {}


def _quantize_load(target, attrs, tensors, meta):
    return None


class Quantize(OpSpec):
    """Graph input quantiser, float32 -> ``dtype`` (``"int8"``, default, or ``"uint8"``) with the
    output tensor's quantisation; an integer input passes through unchanged.

    Generic (portable) semantics: ``q = clip(round(x / scale) + zero_point, lo, hi)``
    (correctly rounded float32 division, ties to even; ``[lo, hi]`` the dtype's range).
    A target may implement the rounding of its runtime instead: the TFLite target
    (:mod:`hwjax.targets._tflite`) implements LiteRT's QUANTIZE float32 -> int8/uint8 per
    runtime (reference: float32 quotient rounded half away from zero; XNNPACK: float32
    product with the float32 reciprocal of the scale, ties to even; optimized: the
    XNNPACK product on the first ``8 floor(N / 8)`` of an example's ``N`` elements and
    the double quotient rounded half away from zero on the rest), documented there.
    """

    name = "quantize"
    attrs = {"dtype": "int8"}
    choices = {"dtype": tuple(QUANTIZE_RANGES)}
    generic = OpImpl(_quantize_run, params=_quantize_params)


def _flatten_run(target, attrs, params, x, return_acc: bool = False):
    y = x.reshape(x.shape[0], -1)
    return (y, None) if return_acc else y


class Flatten(OpSpec):
    """Row-major flatten of all but the batch axis (NHWC memory order). Exact."""

    name = "flatten"
    generic = OpImpl(_flatten_run)
    layout_only = True

    def infer(self, node, ins):
        return [(math.prod(ins[0].shape),)]


register_op(Quantize())
register_op(Flatten())
