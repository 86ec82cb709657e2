"""TFLite target: the nonlinear op kinds (see :mod:`hwjax.graph.ops.nonlinear`).

* ``lut`` (fn ``"sigmoid"`` / ``"tanh"``, TFLite LOGISTIC / TANH): the recipe builds
  LiteRT's 256-entry table once on the host
  (:func:`hwjax.tflite._convert_nonlinear.litert_lut_table`); ``run`` is an int32
  gather. The same table on the reference, optimized and XNNPACK runtimes.
* ``softmax``: ``"reference"`` runs LiteRT's gemmlowp fixed-point kernel (recipe:
  multiplier, shift, ``diff_min``); ``"optimized"`` and ``"xnnpack"`` run the float32
  table kernel (recipe: the ``expf`` table and the output quantisation).

Both are verified against LiteRT 2.3 (x86) on ``reference``, ``optimized`` and
``xnnpack``; TFLite Micro (``"tflm"``) computes LOGISTIC, TANH and SOFTMAX with other
kernels and raises UnsupportedOpError.
"""

from __future__ import annotations

import jax.numpy as jnp

from hwjax.errors import UnsupportedOpError
from hwjax.targets._base import no_acc
from hwjax.targets._tflite import TFLite, host_recipe, verified_on
from hwjax.tflite._convert_nonlinear import (
    REFERENCE_MAX_DEPTH,
    litert_lut_table,
    lut_lookup,
    softmax_exp_table,
    softmax_optimized,
    softmax_reference,
    softmax_reference_params,
)

_RUNTIMES = ("reference", "optimized", "xnnpack")


def _lut_params(target, attrs, portable, q_in, q_out):
    """``{"table": int32 (256,)}``: LiteRT's table for the node's quantisation."""
    fn = attrs["fn"]

    def recipe(s_in, z_in, s_out, z_out):
        return {"table": litert_lut_table(fn, s_in, int(z_in), s_out, int(z_out))}

    return host_recipe(recipe, jnp.asarray(q_in[0].scale, jnp.float32), jnp.asarray(q_in[0].zero_point, jnp.int32),
                       jnp.asarray(q_out.scale, jnp.float32), jnp.asarray(q_out.zero_point, jnp.int32))


@TFLite.implements("lut", params=_lut_params)
def _lut(target, attrs, p, x, return_acc: bool = False):
    """``table[u8(x)]``."""
    return no_acc(lut_lookup(x, p["table"]), return_acc)


def _softmax_params(target, attrs, portable, q_in, q_out):
    """reference: ``{"m", "ls", "diff_min"}``; optimized / xnnpack: ``{"table"}``
    (float32 (256,)), ``"s_out"``, ``"z_out"``."""
    beta = float(attrs.get("beta", 1.0))
    s_in = jnp.asarray(q_in[0].scale, jnp.float32)
    if target.runtime == "reference":
        return host_recipe(lambda s: softmax_reference_params(s, beta), s_in)
    table = host_recipe(lambda s: {"table": softmax_exp_table(s, beta)}, s_in)
    return {**table, "s_out": jnp.asarray(q_out.scale, jnp.float32), "z_out": jnp.asarray(q_out.zero_point, jnp.int32)}


@TFLite.implements("softmax", params=_softmax_params)
def _softmax(target, attrs, p, x, return_acc: bool = False):
    """Softmax over the last axis, per runtime (see the module docstring)."""
    if target.runtime == "reference":
        depth = x.shape[-1]
        if depth > REFERENCE_MAX_DEPTH:
            raise UnsupportedOpError(f"target {target!r}: softmax over {depth} values: LiteRT's reference kernel "
                                     f"handles rows of at most {REFERENCE_MAX_DEPTH}")
        y = softmax_reference(x, p["m"], p["ls"], p["diff_min"])
    else:
        y = softmax_optimized(x, p["table"], p["s_out"], p["z_out"])
    return no_acc(y, return_acc)


verified_on("lut", *_RUNTIMES)
verified_on("softmax", *_RUNTIMES)
