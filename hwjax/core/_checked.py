"""Checked mode: the value ranges that the core documents become runtime checks.

Outside checked mode a value that is known now (a NumPy or Python value, a concrete
JAX array) is checked in Python by the core validators (:mod:`hwjax.core._validate`)
and a traced value (inside ``jit``, ``vmap``, ``grad``) cannot be: it is the caller's
contract, and each docstring states what an out-of-range traced value does (wraps,
clips, is treated as 0...).

``hwjax.checked(fn)`` traces ``fn`` with checked mode on. While it is on, every
validator that meets a traced value emits a :func:`jax.experimental.checkify.check`
of exactly the condition it would have checked on a concrete value (the operand
ranges of ``saturate``, ``shift_right``, ``fixed_mul`` and ``mac``, ``mac``'s ``acc0``
range, integer-valued float operands, non-finite inputs to the quantizers...), and
the wrapper raises :class:`hwjax.errors.RangeError` with the validator's message,
the argument's name, its allowed range and the first offending value, when a check
fails. ``fn`` may itself use ``jit``, ``vmap``, ``grad``.

The flag is a JAX configuration state that is part of the trace context, so a
function that ``jax.jit`` traced (and cached) without checks is traced anew under
``checked`` instead of reusing the unchecked program, and the default path's traces,
programs and caches are the ones it has without this module.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from hwjax.errors import ArgTypeError, RangeError

# Appended to every message of a check that hwjax emits (to tell them from a user's
# own checkify checks inside fn, which the wrapper re-raises as checkify raises them).
TAG = " [hwjax.checked]"

try:  # a trace-context config state: part of jit's cache key
    from jax._src import config as _jax_config

    _FLAG = _jax_config.bool_state(
        "hwjax_checked_mode",
        False,
        "Set by hwjax.checked() while it traces: hwjax validators emit checkify checks "
        "for traced values. Not meant to be set directly.",
        include_in_trace_context=True,
    )

    def enabled() -> bool:
        """True while :func:`checked` traces its function."""
        return bool(_FLAG.value)

    def _on():
        return _FLAG(True)
except (ImportError, AttributeError, TypeError):  # pragma: no cover - other JAX versions
    import contextvars

    _VAR = contextvars.ContextVar("hwjax_checked_mode", default=False)

    def enabled() -> bool:
        """True while :func:`checked` traces its function."""
        return _VAR.get()

    @contextlib.contextmanager
    def _on():
        token = _VAR.set(True)
        try:
            yield
        finally:
            _VAR.reset(token)


def is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _escape(s: str) -> str:
    return s.replace("{", "{{").replace("}", "}}")


def check_ok(ok: jax.Array, x: jax.Array, message: str) -> None:
    """Emits a check that every element of the boolean ``ok`` is true (checked mode,
    traced values only); the failure message is ``message`` followed by "; found v",
    ``v`` the first element of ``x`` where ``ok`` is false."""
    ok = jnp.broadcast_to(ok, jnp.shape(x)).ravel()
    flat = jnp.ravel(x)
    if flat.size == 0:
        return
    bad = flat[jnp.argmin(ok)]  # argmin of a bool array: the first False
    checkify.check(jnp.all(ok), _escape(message) + "; found {bad}" + TAG, bad=bad)


def check_range(x: jax.Array, lo: int, hi: int, name: str) -> None:
    """Checked mode: emits the check ``lo <= x <= hi`` (NaN fails) for a traced ``x``."""
    dt = np.dtype(x.dtype)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        if lo <= info.min and hi >= info.max:
            return  # every value of the dtype is in range
        lo_c, hi_c = max(lo, int(info.min)), min(hi, int(info.max))
        ok = (x >= dt.type(lo_c)) & (x <= dt.type(hi_c)) if lo_c <= hi_c else jnp.zeros(x.shape, bool)
    elif np.issubdtype(dt, np.floating):  # bounds rounded to the dtype, as the concrete check does
        ok = (x >= dt.type(lo)) & (x <= dt.type(hi))
    else:
        return
    check_ok(ok, x, f"{name} must lie in [{lo}, {hi}]")


def check_integral(x: jax.Array, name: str) -> None:
    """Checked mode: emits the check that a traced float ``x`` holds integers only."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return
    check_ok(jnp.isfinite(x) & (jnp.floor(x) == x), x, f"{name} is a float array and must hold integer values only")


def check_finite(x: jax.Array, name: str) -> None:
    """Checked mode: emits the check that a traced float ``x`` has no NaN or Inf."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return
    check_ok(jnp.isfinite(x), x, f"{name} must be finite (no NaN or Inf)")


def checked(fn: Callable) -> Callable:
    """``fn`` with every documented value range of the hwjax primitives it calls checked
    at run time, also for traced values (under ``jit``, ``vmap``, ``grad``).

    ``checked(fn)(*args, **kwargs)`` traces ``fn`` with
    :func:`jax.experimental.checkify.checkify` while checked mode is on: each hwjax
    validator that meets a traced value emits a check of the condition it enforces on
    concrete values. When a check fails the call raises
    :class:`hwjax.errors.RangeError` whose message names the argument, its allowed range
    and the first offending value (e.g. ``x must lie in [-128, 127]; found 300``); a
    failing ``checkify.check`` of ``fn``'s own is raised as checkify raises it
    (``JaxRuntimeError``). Otherwise it returns ``fn``'s result, equal to the unchecked
    result.

    Use it as the outermost transformation: ``checked(jax.jit(f))``,
    ``checked(jax.vmap(f))``; ``checked`` calls inside another ``checked`` are fine.
    Inside a plain ``jax.jit`` / ``vmap`` (``jax.jit(checked(f))``) the error could only
    be raised at run time outside the trace, so that raises TypeError when traced.
    Slower than ``fn`` (each call traces ``fn`` and the checks run on device): meant for
    debugging, testing and validating data; ``fn`` itself is unchanged.
    """

    if not callable(fn):
        raise ArgTypeError(f"hwjax.checked needs a callable fn, got {type(fn).__name__}")
    cfn = checkify.checkify(fn, errors=checkify.user_checks)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nested = enabled()
        with _on():
            err, out = cfn(*args, **kwargs)
        if any(is_traced(leaf) for leaf in jax.tree_util.tree_leaves(err)):
            if nested:  # an enclosing checked() functionalises and reports it
                checkify.check_error(err)
                return out
            raise ArgTypeError(
                "hwjax.checked(fn) must be the outermost transformation: call "
                "hwjax.checked(jax.jit(fn)) rather than jax.jit(hwjax.checked(fn))"
            )
        msg = err.get()
        if msg is not None:
            if TAG in msg:
                raise RangeError(msg.split(TAG)[0])
            err.throw()
        return out

    return wrapper


__all__ = ["checked", "enabled"]
