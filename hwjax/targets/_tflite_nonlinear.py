"""TFLite target: the nonlinear op kinds (see :mod:`hwjax.graph.ops.nonlinear`).

* ``lut`` (fn ``"sigmoid"`` / ``"tanh"``, TFLite LOGISTIC / TANH): the recipe builds
  LiteRT's 256-entry table once on the host
  (:func:`hwjax.litert.litert_lut_table`); ``run`` is an int32
  gather. The same table on the reference, optimized and XNNPACK runtimes.
* ``softmax``: ``"reference"`` runs LiteRT's gemmlowp fixed-point kernel (recipe:
  multiplier, shift, ``diff_min``); ``"optimized"`` and ``"xnnpack"`` run the float32
  table kernel (recipe: the ``expf`` table and the output quantisation).

Both are verified against LiteRT 2.3 (x86) on ``reference``, ``optimized`` and
``xnnpack``, and against TFLite Micro (``"tflm"``, the xmos-ai-tools 1.4.2 host
interpreter, ``tests/data/tflm``):

* ``lut`` on ``"tflm"``: TFLM's own fixed-point kernels (:mod:`hwjax.litert._tflm`:
  gemmlowp ``logistic`` / ``tanh`` of a Q4.27 input; recipe: multiplier, shift, input
  radius). Their output quantisation is fixed (LOGISTIC 1/256 and -128, TANH 1/128 and 0);
  a LOGISTIC whose output zero point is not -128 raises UnsupportedOpError (TFLM refuses
  to prepare it).
* ``softmax`` on ``"tflm"``: the same gemmlowp fixed-point kernel as ``"reference"``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hwjax.errors import UnsupportedOpError
from hwjax.targets._base import no_acc
from hwjax.targets._tflite import TFLite, host_recipe, verified_on
from hwjax.litert import (
    REFERENCE_MAX_DEPTH,
    litert_lut_table,
    sigmoid_tanh_params,
    lut_lookup,
    softmax_exp_table,
    softmax_optimized,
    softmax_reference,
    softmax_reference_params,
    tflm_logistic,
    tflm_tanh,
)

_RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")


def _lut_params(target, attrs, portable, q_in, q_out):
    """``{"table": int32 (256,)}``: LiteRT's table for the node's quantisation; on ``"tflm"``
    :func:`hwjax.litert.sigmoid_tanh_params` of the input scale and ``"z_in"``."""
    fn = attrs["fn"]
    if target.runtime == "tflm":
        p = host_recipe(sigmoid_tanh_params, jnp.asarray(q_in[0].scale, jnp.float32))
        return {**p, "z_in": jnp.asarray(q_in[0].zero_point, jnp.int32)}

    def recipe(s_in, z_in, s_out, z_out):
        return {"table": litert_lut_table(fn, s_in, int(z_in), s_out, int(z_out))}

    return host_recipe(
        recipe,
        jnp.asarray(q_in[0].scale, jnp.float32),
        jnp.asarray(q_in[0].zero_point, jnp.int32),
        jnp.asarray(q_out.scale, jnp.float32),
        jnp.asarray(q_out.zero_point, jnp.int32),
    )


def _lut_host_params(target, attrs, portable, q_in, q_out):
    """On ``"tflm"`` (concrete quantisation): raises UnsupportedOpError for a LOGISTIC whose
    output zero point is not -128 (TFLM refuses to prepare it), else the parameters of
    :func:`_lut_params`; on the other runtimes None (the jittable recipe)."""
    if target.runtime != "tflm":
        return None
    z_out = int(np.asarray(q_out.zero_point).reshape(-1)[0])
    if attrs["fn"] == "sigmoid" and z_out != -128:
        raise UnsupportedOpError(
            f"target {target!r}: LOGISTIC with output zero point {z_out}; TFLite Micro "
            "requires -128 (it refuses to prepare the model)"
        )
    return _lut_params(target, attrs, portable, q_in, q_out)


@TFLite.implements("lut", params=_lut_params, host_params=_lut_host_params)
def _lut(target, attrs, p, x, return_acc: bool = False):
    """``table[u8(x)]``; on ``"tflm"`` :func:`hwjax.litert.tflm_logistic` /
    :func:`hwjax.litert.tflm_tanh`."""
    if target.runtime == "tflm":
        kernel = tflm_logistic if attrs["fn"] == "sigmoid" else tflm_tanh
        return no_acc(kernel(x, p["z_in"], p), return_acc)
    return no_acc(lut_lookup(x, p["table"]), return_acc)


def _softmax_params(target, attrs, portable, q_in, q_out):
    """reference: ``{"m", "ls", "diff_min"}``; optimized / xnnpack: ``{"table"}``
    (float32 (256,)), ``"s_out"``, ``"z_out"``."""
    beta = float(attrs.get("beta", 1.0))
    s_in = jnp.asarray(q_in[0].scale, jnp.float32)
    if target.runtime in ("reference", "tflm"):
        return host_recipe(lambda s: softmax_reference_params(s, beta), s_in)
    table = host_recipe(lambda s: {"table": softmax_exp_table(s, beta)}, s_in)
    return {**table, "s_out": jnp.asarray(q_out.scale, jnp.float32), "z_out": jnp.asarray(q_out.zero_point, jnp.int32)}


@TFLite.implements("softmax", params=_softmax_params)
def _softmax(target, attrs, p, x, return_acc: bool = False):
    """Softmax over the last axis, per runtime (see the module docstring)."""
    if target.runtime in ("reference", "tflm"):
        depth = x.shape[-1]
        if depth > REFERENCE_MAX_DEPTH:
            raise UnsupportedOpError(
                f"target {target!r}: softmax over {depth} values: the reference kernel "
                f"(LiteRT's, TFLM's) handles rows of at most {REFERENCE_MAX_DEPTH}"
            )
        y = softmax_reference(x, p["m"], p["ls"], p["diff_min"])
    else:
        y = softmax_optimized(x, p["table"], p["s_out"], p["z_out"])
    return no_acc(y, return_acc)


verified_on("lut", *_RUNTIMES)
verified_on("softmax", *_RUNTIMES)
