"""``quantize`` (float -> int8 with the output tensor's quantisation) and ``flatten``."""

from __future__ import annotations

import math

import jax.numpy as jnp

from hwjax.core import quantize_affine
from hwjax.graph._ops import OpImpl, OpSpec, register_op


def _quantize_params(target, attrs, portable, q_in, q_out):
    return {"scale": q_out.scale, "zero_point": q_out.zero_point}


def _quantize_run(target, attrs, params, x, return_acc: bool = False):
    if jnp.issubdtype(x.dtype, jnp.integer):  # already quantised: passes through
        y = x.astype(jnp.int32)
    else:
        y = quantize_affine(x, params["scale"], params["zero_point"]).astype(jnp.int32)
    return (y, None) if return_acc else y


def _quantize_export(target, attrs, params):
    return {}, {}


def _quantize_load(target, attrs, tensors, meta):
    return None


class Quantize(OpSpec):
    """Graph input quantiser: ``q = clip(round(x / scale) + zero_point, -128, 127)`` (correctly
    rounded float32 division, ties to even) with the output tensor's quantisation; an
    integer input passes through unchanged."""

    name = "quantize"
    generic = OpImpl(_quantize_run, params=_quantize_params)


def _flatten_run(target, attrs, params, x, return_acc: bool = False):
    y = x.reshape(x.shape[0], -1)
    return (y, None) if return_acc else y


class Flatten(OpSpec):
    """Row-major flatten of all but the batch axis (NHWC memory order). Exact."""

    name = "flatten"
    generic = OpImpl(_flatten_run)

    def infer(self, node, ins):
        return [(math.prod(ins[0].shape),)]


register_op(Quantize())
register_op(Flatten())
