"""Float-side quantisation arithmetic shared by every layer (target independent).

Conventions (all layers, all targets):

* Activations: int8 (``[-128, 127]``), affine, one scale and zero point per tensor,
  derived from a calibrated real range ``[lo, hi]`` by :func:`act_qparams`.
* Weights: int8, symmetric per output channel, ``[-127, 127]``, zero point 0, with
  ``scale_c = max|w_c| / 127`` (:func:`weight_scales`).
* Biases: int32 in units of ``s_in * s_w[c]`` (:func:`quantize_bias`).

Every rounding here is ``jnp.round`` (ties to even), and every division that feeds an
integer is the correctly rounded :func:`hwjax.core.div_rn` (XLA's own float32
division is not correctly rounded on every backend), so the integers do not depend
on the device. Functions that produce
integers from floats return float32 arrays holding those integers, with a
straight-through gradient (documented per function), so they can sit inside a
differentiated hardware-mode forward pass.
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np


from hwjax.core import div_rn, quantize_affine
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError

sg = jax.lax.stop_gradient

INT8_MIN, INT8_MAX = -128, 127
WEIGHT_MAX = 127  # weights are symmetric int8: [-127, 127]
_I32_MAX = 2**31 - 1


def act_qparams(rng: jax.Array, *, symmetric: bool = False) -> tuple[jax.Array, jax.Array]:
    """(scale, zero_point) of an int8 tensor covering the real range ``rng = [lo, hi]``.

    The range is first widened to contain 0 (``lo <= 0 <= hi``), so real 0 is exactly
    representable. Asymmetric (default): ``scale = (hi - lo) / 255`` and
    ``zero_point = clip(round(-128 - lo / scale), -128, 127)``; a range that starts at
    0 (a ReLU output) gets ``zero_point = -128`` exactly, so the int8 lower clamp *is*
    the ReLU. Symmetric: ``scale = max(|lo|, |hi|) / 127``, ``zero_point = 0``.
    An empty or degenerate range gives ``scale = 1``. Not differentiable (used on
    calibration statistics).

    ``rng``: two real numbers (array, list, NumPy values), ``+-inf`` allowed (the empty
    range ``[inf, -inf]`` of an uncalibrated layer), NaN not (RangeError when concrete);
    ``symmetric`` a Python bool.
    """
    symmetric = V.check_flag(symmetric, "symmetric")
    rng = V.as_array(rng, "rng")
    V.kind(rng, "rng")
    if rng.shape != (2,):
        raise ShapeError(f"rng must have shape (2,) ([lo, hi]), got {rng.shape}")
    if V.is_concrete(rng) and np.isnan(np.asarray(rng, np.float32)).any():
        raise RangeError(f"rng must not hold NaN; got {np.asarray(rng).tolist()}")
    return _act_qparams(rng, symmetric)


@functools.partial(jax.jit, static_argnums=(1,))
def _act_qparams(rng: jax.Array, symmetric: bool) -> tuple[jax.Array, jax.Array]:
    rng = sg(jnp.asarray(rng, jnp.float32))
    lo = jnp.minimum(rng[0], 0.0)
    hi = jnp.maximum(rng[1], 0.0)
    if symmetric:
        scale = div_rn(jnp.maximum(-lo, hi), 127.0)
        scale = jnp.where(jnp.isfinite(scale) & (scale > 0), scale, 1.0)
        return scale, jnp.zeros((), jnp.int32)
    scale = div_rn(hi - lo, 255.0)
    scale = jnp.where(jnp.isfinite(scale) & (scale > 0), scale, 1.0)
    zp = jnp.clip(jnp.round(-128.0 - div_rn(lo, scale)), INT8_MIN, INT8_MAX)
    zp = jnp.where(jnp.isfinite(zp), zp, 0.0)
    return scale, zp.astype(jnp.int32)


def exact_forward(exact: jax.Array, surrogate: jax.Array) -> jax.Array:
    """Value of ``exact``, bit for bit; gradient of ``surrogate``.

    Value: ``exact`` in ``surrogate``'s float dtype, with ``-0.0`` read as ``+0.0``: the
    value of ``exact + (surrogate - stop_gradient(surrogate))``, whose bracket is exactly
    ``+0.0`` for every finite ``surrogate`` (``v - v == 0`` in IEEE arithmetic; unlike the
    common ``surrogate + stop_gradient(exact - surrogate)``, which can be off by an ulp).
    Gradient (a ``jax.custom_jvp``): the tangent of ``exact`` (when it is a float array)
    plus that of ``surrogate`` where ``surrogate`` is finite (0 where it is not). The value
    does not depend on ``surrogate``, so a program that only evaluates the forward pass
    (no ``grad``) drops the surrogate's computation (XLA removes the unused operand):
    a hardware-mode forward computes the integer pipeline alone.

    ``exact`` and ``surrogate``: arrays of the same shape (ShapeError otherwise);
    ``surrogate`` a float array.
    """
    exact, surrogate = V.as_array(exact, "exact"), V.as_array(surrogate, "surrogate")
    V.kind(exact, "exact")
    if V.kind(surrogate, "surrogate") != "float":
        raise ArgTypeError(f"surrogate must be a float array (it carries the gradient), got {surrogate.dtype}")
    if exact.shape != surrogate.shape:
        raise ShapeError(f"exact and surrogate must have the same shape, got {exact.shape} and {surrogate.shape}")
    return _exact_forward_jit(exact, surrogate)


@jax.custom_jvp
def _exact_forward(exact: jax.Array, surrogate: jax.Array) -> jax.Array:
    y = exact.astype(surrogate.dtype)
    return jnp.where(y == 0, jnp.zeros_like(y), y)  # -0.0 -> +0.0, as exact + (+0.0) gives


@_exact_forward.defjvp
def _exact_forward_jvp(primals, tangents):
    (exact, surrogate), (d_exact, d_surrogate) = primals, tangents
    t = jnp.where(jnp.isfinite(surrogate), d_surrogate, jnp.zeros_like(d_surrogate))
    if jnp.issubdtype(exact.dtype, jnp.floating):  # an integer exact has no tangent (float0)
        t = t + d_exact.astype(t.dtype)
    return _exact_forward(exact, surrogate), t


_exact_forward_jit = jax.jit(_exact_forward)


def act_int(x: jax.Array, scale: jax.Array, zero_point: jax.Array) -> jax.Array:
    """int8 activations of the real tensor ``x``: ``clip(round(x / scale) + zp, -128, 127)``,
    as float32 integers (correctly rounded division; no gradient)."""
    return quantize_affine(x, scale, zero_point, lo=INT8_MIN, hi=INT8_MAX)


def quantize_act(x: jax.Array, scale: jax.Array, zero_point: jax.Array) -> jax.Array:
    """:func:`act_int` with a straight-through gradient: ``1 / scale`` where the value was
    not clipped, 0 where it was. ``scale`` > 0 and ``zero_point`` an int8 value
    (RangeError when concrete), broadcasting against ``x`` (see :func:`hwjax.core.quantize_affine`)."""
    x = V.as_array(x, "x")
    zero_point = V.as_array(zero_point, "zero_point")
    V.check_range(zero_point, INT8_MIN, INT8_MAX, "zero_point")
    q = act_int(x, scale, zero_point)  # validates x, scale, zero_point
    x = x.astype(jnp.float32)
    sur = jnp.clip(x / scale + zero_point.astype(jnp.float32), INT8_MIN, INT8_MAX)
    return exact_forward(q, sur)


def weight_scales(w: jax.Array, reduce_axes: tuple[int, ...]) -> jax.Array:
    """Per-output-channel weight scales ``max|w_c| / 127`` (1 for an all-zero channel).

    ``reduce_axes`` are the axes that are *not* the output channel. No gradient
    (the scale follows the weights but is treated as a constant). ``w`` a finite float
    array (RangeError for NaN/Inf when concrete), ``reduce_axes`` axes of ``w``.
    """
    w = V.as_array(w, "w")
    V.kind(w, "w")
    V.check_finite(w, "w")
    axes = (reduce_axes,) if isinstance(reduce_axes, (int, np.integer)) else tuple(reduce_axes)
    for a in axes:
        V.check_static_int(a, -w.ndim, w.ndim - 1, "reduce_axes")
    m = jnp.max(jnp.abs(sg(w)), axis=axes)
    return jnp.where(m > 0, div_rn(m, float(WEIGHT_MAX)), 1.0)


def weights_int(w: jax.Array, scales: jax.Array) -> jax.Array:
    """``clip(round(w / scales), -127, 127)`` as float32 integers (no gradient)."""
    return jnp.clip(jnp.round(div_rn(w, scales)), -WEIGHT_MAX, WEIGHT_MAX)


def quantize_weights(w: jax.Array, scales: jax.Array) -> jax.Array:
    """:func:`weights_int` with a straight-through gradient ``1 / scales``.

    ``scales`` broadcasts against ``w`` (output channel last); the clip never binds
    for scales from :func:`weight_scales`. ``scales`` finite and > 0 (RangeError when
    concrete); ShapeError when they do not broadcast.
    """
    w, scales = V.as_array(w, "w"), V.as_array(scales, "scales")
    V.kind(w, "w")
    V.kind(scales, "scales")
    V.check_positive(scales, "scales")
    V.check_broadcast(w, "w", scales, "scales")
    return exact_forward(weights_int(w, scales), w / scales)


def bias_int(b: jax.Array, bias_scale: jax.Array) -> jax.Array:
    """The int32 bias ``round(b / bias_scale)`` as float32 integers (no gradient).

    ``bias_scale = s_in * s_w`` per channel. Clipped to ``±(2**24 - 1)``, so the
    float32 value holds the integer exactly (far beyond anything an int8 layer uses).
    """
    lim = float(2**24 - 1)
    return jnp.clip(jnp.round(div_rn(b, bias_scale)), -lim, lim)


def quantize_bias(b: jax.Array, bias_scale: jax.Array) -> jax.Array:
    """:func:`bias_int` with a straight-through gradient ``1 / bias_scale``."""
    return exact_forward(bias_int(b, bias_scale), b / bias_scale)


def clip_int8(y: jax.Array) -> jax.Array:
    """``clip(y, -128, 127)`` (gradient 0 outside the range): surrogate output clamp."""
    return jnp.clip(y, INT8_MIN, INT8_MAX)


from hwjax.core import compute_once  # noqa: E402,F401  (re-exported: the layers use it)
