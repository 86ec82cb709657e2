"""The LiteRT / TFLite runtimes as one target: :class:`TFLite` (``runtime=`` ``"reference"``,
``"optimized"``, ``"xnnpack"``, ``"tflm"``), spec gemmlowp.md §2.9 and deployed.md §1.

Each op kind's recipe (``params``) derives the runtime's integer parameters on the host
in float64, as the runtime's C++ does (directly when the quantisation is concrete,
through ``jax.pure_callback`` when it is traced); ``run`` is the exact integer kernel of
:mod:`hwjax.tflite`. An op/runtime pair whose arithmetic has not been verified against
the runtime raises :class:`hwjax.errors.UnsupportedOpError` rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.errors import UnsupportedOpError
from hwjax.graph import OpImpl, geometry, pool_geometry
from hwjax.graph.ops.tflite import padded_pool_geometry
from hwjax.targets._base import Target, no_acc, register
from hwjax.tflite import (
    activation_range,
    add_int,
    add_params,
    avgpool_int,
    conv_int,
    depthwise_int,
    fc_int,
    maxpool_int,
    mbqm_double,
    quantize_multiplier,
    requant_params,
)
from hwjax.tflite._xnnpack import add_jax, add_recipe, requant_jax, requant_recipe

RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")

# requantisation convention per runtime and op (spec gemmlowp.md §2.9, deployed.md §1)
_REQUANT = {
    "reference": {"conv": "double", "depthwise_conv": "double", "dense": "float64"},
    "optimized": {"conv": "ruy", "depthwise_conv": "double", "dense": "ruy"},
    "xnnpack": {"conv": "xnnpack", "depthwise_conv": "xnnpack", "dense": "xnnpack"},
    "tflm": {"conv": "double", "depthwise_conv": "double", "dense": "double"},
}
# op kinds whose arithmetic differs per runtime and is verified only on these runtimes
_VERIFIED = {
    # ADD and QUANTIZE int8 -> int8 on "optimized" / "xnnpack": hwjax.tflite._xnnpack (x86
    # NEON_2_SSE vector loops, XNNPACK qs8 add / convert); AVERAGE_POOL_2D int8 is never
    # delegated to XNNPACK, so every runtime runs LiteRT's integer average pool
    "add": ("reference", "optimized", "xnnpack", "tflm"),
    "avgpool": ("reference", "optimized", "xnnpack", "tflm"),
    "requantize": ("reference", "optimized", "xnnpack", "tflm"),
}


def verified_on(op: str, *runtimes: str) -> None:
    """Declares that op kind ``op``'s arithmetic is implemented (and verified against the
    runtime) only on ``runtimes``; :meth:`TFLite.lowering` raises UnsupportedOpError on
    the others. Op kinds never declared are taken to run the same on every runtime."""
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise ValueError(f"runtimes must be among {RUNTIMES}, got {bad}")
    _VERIFIED[op] = tuple(runtimes)


def _is_concrete(tree) -> bool:
    return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(tree))


def host_recipe(fn, *args):
    """``fn(*numpy args) -> dict of numpy arrays``, on concrete arguments directly, else
    through ``jax.pure_callback`` (the output shapes come from a call on ones)."""
    if _is_concrete(args):
        return jax.tree.map(jnp.asarray, fn(*[np.asarray(a) for a in args]))
    dummy = fn(*[np.ones(np.shape(a), a.dtype) for a in args])
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), dummy)
    return jax.pure_callback(lambda *a: jax.tree.map(np.asarray, fn(*[np.asarray(v) for v in a])), spec,
                             *jax.lax.stop_gradient(args), vmap_method="sequential")


@dataclass(frozen=True)
class TFLite(Target):
    """A LiteRT / TFLite runtime, bit-exact for int8 models.

    ``runtime``: ``"reference"`` (LiteRT ``BUILTIN_REF``), ``"optimized"`` (LiteRT builtin
    kernels without delegate, ruy; x86), ``"xnnpack"`` (LiteRT's default interpreter,
    XNNPACK delegate; x86), ``"tflm"`` (TFLite Micro reference kernels, double-rounding
    build). Fully connected, conv and depthwise requantise per :data:`_REQUANT`.
    """

    runtime: str = "reference"
    name: ClassVar[str] = "tflite"

    def __post_init__(self):
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")

    def requant(self, op: str) -> str:
        return _REQUANT[self.runtime][op]

    def lowering(self, op: str):
        ok = _VERIFIED.get(op)
        if ok is not None and self.runtime not in ok:
            raise UnsupportedOpError(f"target {self!r}: the {op!r} op's arithmetic on runtime {self.runtime!r} is "
                                     f"not implemented (runtimes with {op!r}: {list(ok)})")
        return super().lowering(op)

    def check_op(self, op: str, **config: Any) -> None:
        self.lowering(op)


# ------------------------------------------------------------------------- linear ops


def _linear_params(op):
    def params(target, attrs, portable, q_in, q_out):
        requant = target.requant(op)
        kernel = portable["kernel"]
        n_out = kernel.shape[-1] if op == "depthwise_conv" else kernel.shape[0]
        act = attrs.get("activation")

        def recipe(s_in, w_scale, s_out, z_out):
            rq = requant_params(s_in, w_scale, s_out, requant, channels=n_out,
                                float32_product=op == "dense" and np.size(w_scale) == 1)
            lo, hi = activation_range(act, s_out, int(z_out))
            return {"rq": rq, "act_min": np.int32(lo), "act_max": np.int32(hi)}

        r = host_recipe(recipe, q_in[0].scale, portable["w_scale"], q_out.scale, q_out.zero_point)
        return {"kernel": kernel, "bias": portable["bias"], "zin": jnp.asarray(q_in[0].zero_point, jnp.int32),
                "zout": jnp.asarray(q_out.zero_point, jnp.int32), **r}

    return params


def _linear_run(op):
    def run(target, attrs, p, x, return_acc: bool = False):
        requant = target.requant(op)
        args = (p["bias"], p["zin"], p["rq"], requant, p["zout"], p["act_min"], p["act_max"])
        if op == "dense":
            y = fc_int(x, p["kernel"], *args)
        elif op == "conv":
            y = conv_int(x, p["kernel"], *args, geometry(attrs, x.shape))
        else:
            y = depthwise_int(x, p["kernel"], *args, geometry(attrs, x.shape))
        return no_acc(y, return_acc)

    return run


for _op in ("dense", "conv", "depthwise_conv"):
    TFLite.implement(_op, OpImpl(_linear_run(_op), params=_linear_params(_op)))


# ------------------------------------------------------------------ requantising unary ops


def _unary_params(target, attrs, portable, q_in, q_out):
    fn = attrs.get("fn")

    def recipe(s_in, z_in, s_out, z_out):
        m, e = quantize_multiplier(float(np.float32(s_in)) / float(np.float32(s_out)))
        lo, hi = activation_range(fn, s_out, int(z_out))
        return {"m": np.int32(m), "e": np.int32(e), "act_min": np.int32(lo), "act_max": np.int32(hi)}

    r = host_recipe(recipe, q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)
    return {**r, "zin": jnp.asarray(q_in[0].zero_point, jnp.int32), "zout": jnp.asarray(q_out.zero_point, jnp.int32)}


def _unary_run(target, attrs, p, x, return_acc: bool = False):
    """TFLite ``ReluX`` / ``Requantize``: ``clamp(MBQM(x - zin, m, e) + zout, act)``."""
    v = mbqm_double(x - p["zin"], p["m"], p["e"])
    y = jnp.clip(jnp.clip(v, -(2**30), 2**30) + p["zout"], p["act_min"], p["act_max"])
    return no_acc(y, return_acc)


def _requantize_params(target, attrs, portable, q_in, q_out):
    """QUANTIZE int8 -> int8: LiteRT's ``(m, e)``; on ``"optimized"`` / ``"xnnpack"`` also the
    parameters of :func:`hwjax.tflite._xnnpack.requant_recipe`."""
    p = _unary_params(target, attrs, portable, q_in, q_out)
    rt = target.runtime
    if rt in ("optimized", "xnnpack"):
        p = {**p, **host_recipe(lambda s_in, s_out: requant_recipe(rt, s_in, s_out), q_in[0].scale, q_out.scale)}
    return p


def _requantize_run(target, attrs, p, x, return_acc: bool = False):
    """QUANTIZE int8 -> int8: the reference ``Requantize`` (``"reference"``, ``"tflm"``), else
    :func:`hwjax.tflite._xnnpack.requant_jax` (LiteRT's x86 vector loop / XNNPACK convert)."""
    if target.runtime in ("optimized", "xnnpack"):
        return no_acc(requant_jax(x, p, target.runtime), return_acc)
    return _unary_run(target, attrs, p, x, return_acc)


TFLite.implements("activation", params=_unary_params)(_unary_run)
TFLite.implements("requantize", params=_requantize_params)(_requantize_run)


# -------------------------------------------------------------------------------- pools


def _pool_params(target, attrs, portable, q_in, q_out):
    """TFLite pools keep the input's quantisation (the converter writes equal scales and zero
    points); only the int8 range clamps (fused activations are separate ``activation`` nodes)."""
    return {"act_min": jnp.int32(-128), "act_max": jnp.int32(127)}


def _check_avg(target):
    ok = _VERIFIED["avgpool"]
    if target.runtime not in ok:
        raise UnsupportedOpError(f"target {target!r}: AVERAGE_POOL_2D's arithmetic on runtime {target.runtime!r} is "
                                 f"not implemented (runtimes with it: {list(ok)})")


@TFLite.implements("maxpool", params=_pool_params)
def _maxpool(target, attrs, p, x, return_acc: bool = False):
    return no_acc(maxpool_int(x, pool_geometry(attrs, x.shape), p["act_min"], p["act_max"]), return_acc)


@TFLite.implements("avgpool", params=_pool_params)
def _avgpool(target, attrs, p, x, return_acc: bool = False):
    _check_avg(target)
    return no_acc(avgpool_int(x, pool_geometry(attrs, x.shape), p["act_min"], p["act_max"]), return_acc)


@TFLite.implements("pool", params=_pool_params)
def _pool(target, attrs, p, x, return_acc: bool = False):
    geom = padded_pool_geometry(attrs, x.shape[1:])
    if attrs["fn"] == "avg":
        _check_avg(target)
        return no_acc(avgpool_int(x, geom, p["act_min"], p["act_max"]), return_acc)
    return no_acc(maxpool_int(x, geom, p["act_min"], p["act_max"]), return_acc)


# ---------------------------------------------------------------------------------- add


def _add_params(target, attrs, portable, q_in, q_out):
    """ADD: LiteRT's ``add.cc`` parameters; on ``"optimized"`` / ``"xnnpack"`` those of
    :func:`hwjax.tflite._xnnpack.add_recipe` (with XNNPACK's when it takes the node)."""
    act = attrs.get("activation")
    rt = target.runtime

    def recipe(s1, z1, s2, z2, s_out, z_out):
        if rt in ("optimized", "xnnpack"):
            return add_recipe(rt, act, s1, z1, s2, z2, s_out, z_out)
        p = add_params(s1, s2, s_out)
        lo, hi = activation_range(act, s_out, int(z_out))
        return {**p, "act_min": np.int32(lo), "act_max": np.int32(hi)}

    r = host_recipe(recipe, q_in[0].scale, q_in[0].zero_point, q_in[1].scale, q_in[1].zero_point, q_out.scale,
                    q_out.zero_point)
    return {**r, "z1": jnp.asarray(q_in[0].zero_point, jnp.int32), "z2": jnp.asarray(q_in[1].zero_point, jnp.int32),
            "zout": jnp.asarray(q_out.zero_point, jnp.int32)}


@TFLite.implements("add", params=_add_params)
def _add(target, attrs, p, x1, x2, return_acc: bool = False):
    """ADD: the reference kernel (``"reference"``, ``"tflm"``), else
    :func:`hwjax.tflite._xnnpack.add_jax` (LiteRT's x86 vector loop / XNNPACK qs8 add)."""
    if target.runtime in ("optimized", "xnnpack"):
        return no_acc(add_jax(x1, x2, p, target.runtime), return_acc)
    return no_acc(add_int(x1, x2, p, p["z1"], p["z2"], p["zout"], p["act_min"], p["act_max"]), return_acc)


register("tflite", TFLite)
