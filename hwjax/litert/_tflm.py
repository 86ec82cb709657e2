"""TensorFlow Lite Micro's own int8 kernels where they differ from LiteRT's (``runtime="tflm"``).

Verified bit for bit against the TFLM reference kernels in the ``xmos-ai-tools`` 1.4.2 host
interpreter (``tests/data/tflm``, made by ``scripts/tflm_testdata.py``):

* LOGISTIC and TANH: TFLM does not build LiteRT's float32 table; it runs gemmlowp's
  fixed-point ``logistic`` / ``tanh`` on a Q4.27 input (:func:`sigmoid_tanh_params` on the
  host, :func:`tflm_logistic` / :func:`tflm_tanh` in int32 JAX). The output quantisation
  is fixed by the kernel: LOGISTIC writes 1/256 with zero point -128 (TFLM refuses any
  other output zero point), TANH writes 1/128 with zero point 0 whatever the output
  tensor says.
* RELU6 (in :mod:`hwjax.targets._tflite`): TFLM clamps the raw int8 input to
  ``[z_in, Q_in(6)]`` and does not requantise to the output tensor's scale and zero point.
* FULLY_CONNECTED with per-channel filter scales: TFLM 1.4.2 applies only the first scale,
  with its per-tensor kernel (:mod:`hwjax.targets._tflite` does the same on ``"tflm"``).

The gemmlowp fixed-point primitives are those of :mod:`hwjax.litert._nonlinear`
(exact int32, jittable, independent of ``jax_enable_x64``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import eager_program
from hwjax.errors import UnsupportedOpError
from hwjax.litert._arith import (
    check_int_array,
    check_ints,
    check_params,
    check_scale,
    check_zero_point,
    mbqm_double,
    params_used,
)
from hwjax.litert._nonlinear import (
    INT32_MAX,
    _sat_shl,
    exp_on_negative_values,
    one_over_one_plus_x_for_x_in_0_1,
    reciprocal_newton_q2_29,
    rdbpot32,
)

_I32 = jnp.int32

#: integer bits of the fixed-point input of TFLM's LOGISTIC and TANH (Q4.27)
INPUT_INTEGER_BITS = 4


def _round_half_away(v: float) -> int:
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


def sigmoid_tanh_params(s_in) -> dict[str, np.ndarray]:
    """TFLM's LOGISTIC / TANH Prepare for an int8 input of float32 scale ``s_in`` (float64
    arithmetic, as the C++)::

        (q, ls) = frexp(double(s_in) * 2**27)            (0.5 <= q < 1)
        m       = round_half_away(q * 2**31)
        radius  = floor(15 * 2**27 / 2**ls)

    Returns int32 ``m``, ``ls``, ``radius``. ``ls`` is clamped to 31 where it is larger:
    then ``radius`` is 0 and every output saturates before the multiplier is used.
    Raises UnsupportedOpError for a scale below 2**-28 (TFLM would shift by a negative
    amount)."""
    check_scale(s_in, "s_in")
    s_in = np.asarray(s_in, np.float32).reshape(())
    r = float(np.float32(s_in)) * 2.0 ** (31 - INPUT_INTEGER_BITS)
    q, ls = math.frexp(r)
    if ls < 0:
        raise UnsupportedOpError(f"input scale {float(np.float32(s_in))!r} is below TFLM's range for LOGISTIC / TANH")
    m = _round_half_away(q * 2.0**31)
    radius = math.floor(15.0 * 2.0 ** (31 - INPUT_INTEGER_BITS) / 2.0**ls)
    return {"m": np.int32(m), "ls": np.int32(min(ls, 31)), "radius": np.int32(radius)}


def one_minus_x_over_one_plus_x_for_x_in_0_1(a) -> jax.Array:
    """gemmlowp ``one_minus_x_over_one_plus_x_for_x_in_0_1`` of Q0.31 ``a`` in [0, 1), as
    Q0.31: Newton-Raphson on ``h = (a >> 1) + 2**30`` exactly as
    :func:`one_over_one_plus_x_for_x_in_0_1`, then ``sat((x - 2**29) * 2**2)``
    (``x - 1`` in Q2.29 rescaled to Q0.31)."""
    return _sat_shl(reciprocal_newton_q2_29(a) - jnp.int32(1 << 29), 2)


def _check_q4(x, z_in, p):
    """``(x, p)`` checked when concrete (``x`` int8 values, ``z_in`` an int8 zero point, ``p``
    from :func:`sigmoid_tanh_params`); ``p`` reduced to the keys used."""
    x = check_int_array(x, "x")
    check_zero_point(z_in, "z_in", -128, 127)
    check_params(p, "p", ("m", "ls", "radius"))
    check_ints(p["m"], "p['m']", 0, 2**31 - 1)
    check_ints(p["ls"], "p['ls']", 0, 31)
    check_ints(p["radius"], "p['radius']", 0, 2**31 - 1)
    return x, params_used(p, ("m", "ls", "radius"))


def _q4_input(x, z_in, p):
    """``(d, a)``: ``d = x - z_in`` and its Q4.27 value ``a = MBQM(d, m, ls)`` (double rounding)."""
    d = jnp.asarray(x, _I32) - jnp.asarray(z_in, _I32)
    inside = jnp.abs(d) < p["radius"]
    a = mbqm_double(jnp.where(inside, d, 0), p["m"], p["ls"])  # outside: saturated below, value unused
    return d, a


def tflm_logistic(x, z_in, p) -> jax.Array:
    """TFLM ``reference_integer_ops::Logistic`` of int8 values ``x`` (int32 out, the int8
    result)::

        d = x - z_in
        d <= -radius: -128;   d >= radius: 127
        else: a = MBQM(d, m, ls) (Q4.27);  l = gemmlowp logistic(a) (Q0.31)
              clamp(RDBPOT(l, 23) - 128, -128, 127)

    with gemmlowp ``logistic``: ``l = 1/(1 + exp(-|a|))`` (``one_over_one_plus_x`` of
    :func:`exp_on_negative_values` with 4 integer bits) for ``a > 0``, ``(2**31 - 1) - that`` for ``a < 0``,
    ``2**30`` for ``a == 0``. ``p`` from :func:`sigmoid_tanh_params`."""
    return _logistic(*_check_q4(x, z_in, p), z_in)


@eager_program
def _logistic(x, p, z_in) -> jax.Array:
    d, a = _q4_input(x, z_in, p)
    pos = a > 0
    r = one_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(-jnp.where(pos, a, -a), integer_bits=4))
    l = jnp.where(a == 0, jnp.int32(1 << 30), jnp.where(pos, r, jnp.int32(INT32_MAX) - r))
    y = jnp.clip(rdbpot32(l, 31 - 8) - 128, -128, 127)
    return jnp.where(d <= -p["radius"], -128, jnp.where(d >= p["radius"], 127, y))


def tflm_tanh(x, z_in, p) -> jax.Array:
    """TFLM ``reference_integer_ops::Tanh`` of int8 values ``x`` (int32 out)::

        d = x - z_in
        d <= -radius: -128;   d >= radius: 127
        else: a = MBQM(d, m, ls) (Q4.27);  t = gemmlowp tanh(a) (Q0.31)
              clamp(RDBPOT(t, 24), -128, 127)

    with gemmlowp ``tanh``: for ``n = -|a|`` read as Q5.26 (gemmlowp's exact ``* 2``),
    ``u = one_minus_x_over_one_plus_x(exp_on_negative_values(n))`` = tanh|a|; ``t = u`` for
    ``a > 0``, ``-u`` for ``a < 0``, 0 for ``a == 0``. ``p`` from :func:`sigmoid_tanh_params`."""
    return _tanh(*_check_q4(x, z_in, p), z_in)


@eager_program
def _tanh(x, p, z_in) -> jax.Array:
    d, a = _q4_input(x, z_in, p)
    neg = a < 0
    u = one_minus_x_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(jnp.where(neg, a, -a)))
    t = jnp.where(a == 0, 0, jnp.where(neg, -u, u))
    y = jnp.clip(rdbpot32(t, 31 - 7), -128, 127)
    return jnp.where(d <= -p["radius"], -128, jnp.where(d >= p["radius"], 127, y))
