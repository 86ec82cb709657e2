"""Argument checks shared by the core primitives.

Static arguments are checked at trace time. Array *values* are checked when they are
concrete (not traced); a traced value is checked only in checked mode
(:func:`hwjax.checked`, :mod:`hwjax.core._checked`), where each check below becomes a
``checkify`` check. Otherwise, under ``jit``, the value ranges documented by each
function are the caller's contract.

Errors: :class:`hwjax.errors.RangeError` for a value out of range,
:class:`hwjax.errors.ShapeError` for a shape, :class:`ArgTypeError` (a TypeError) for a
type; every message names the argument.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _checked
from hwjax.errors import ArgTypeError, HwjaxError, RangeError, ShapeError  # noqa: F401  (ArgTypeError re-exported)

# Integer dtypes the core accepts, with their value ranges.
_INT_RANGES = {
    np.dtype(np.int8): (-(2**7), 2**7 - 1),
    np.dtype(np.uint8): (0, 2**8 - 1),
    np.dtype(np.int16): (-(2**15), 2**15 - 1),
    np.dtype(np.uint16): (0, 2**16 - 1),
    np.dtype(np.int32): (-(2**31), 2**31 - 1),
}


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values known now (not a tracer)."""
    return not isinstance(x, jax.core.Tracer)


def is_float_dtype(dtype: Any) -> bool:
    """True for every float dtype, bfloat16 and the other ml_dtypes floats included (whose
    NumPy ``kind`` is not ``"f"``)."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


def _type_name(x: Any) -> str:
    return "None" if x is None else type(x).__name__


def as_array(x: Any, name: str) -> jax.Array:
    """Converts ``x`` to a JAX array.

    Accepts JAX arrays (traced too), NumPy arrays and scalars, Python ints and floats,
    (nested) lists or tuples of numbers or arrays, and objects with ``__array__`` or
    ``__jax_array__``. Python ints (also in lists) become int32,
    never int64: a NumPy int64 (array or scalar) or Python int outside the int32 range
    raises RangeError. Python floats become float32. Anything else (a string, None, a
    bool, a complex or object array, a ragged list...) raises :class:`ArgTypeError`
    naming the argument. Values are not checked otherwise (see :func:`kind`).
    """
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, (bool, np.bool_)):
        raise ArgTypeError(f"{name} must be an integer or float array, got bool")
    if isinstance(x, int):
        if not -(2**31) <= x < 2**31:
            raise RangeError(f"{name}={x} is outside the int32 range [-2**31, 2**31-1]")
        return jax.device_put(np.int32(x))  # (jnp.asarray would compile a conversion program)
    if isinstance(x, float):
        return jax.device_put(np.float32(x))
    if isinstance(x, (np.ndarray, np.generic)):
        a = x
    elif hasattr(x, "__jax_array__") or (
        isinstance(x, (list, tuple)) and any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(x))
    ):
        try:  # a list holding JAX (maybe traced) arrays
            arr = jnp.asarray(x)
        except (ValueError, TypeError) as e:
            raise ArgTypeError(f"{name} must be an array or a (nested) list of numbers of one shape: {e}") from None
        return as_array(arr, name)
    elif isinstance(x, (list, tuple)) or hasattr(x, "__array__"):
        try:
            a = np.asarray(x)
        except (ValueError, TypeError, OverflowError):
            a = None
        if a is None or a.dtype == object:
            raise ArgTypeError(
                f"{name} must be an array or a (nested) list of numbers of one shape, "
                f"got a {_type_name(x)} that is not one"
            )
    else:
        raise ArgTypeError(f"{name} must be an array or a number, got {_type_name(x)}")
    if a.dtype.kind not in "iu" and not is_float_dtype(a.dtype):
        raise ArgTypeError(_dtype_message(name, a.dtype))
    if a.dtype == np.int64 or (a.dtype.kind == "u" and a.dtype.itemsize == 8):
        check_range(a, -(2**31), 2**31 - 1, name)
        a = a.astype(np.int32)
    return jax.device_put(a)  # jnp.asarray would compile a copy program per shape and dtype


def kind(x: jax.Array, name: str) -> str:
    """Returns "int" or "float" for a supported dtype, else raises :class:`ArgTypeError`."""
    dt = np.dtype(x.dtype)
    if dt in _INT_RANGES:
        return "int"
    if dt == np.int64:
        # Only reachable with jax_enable_x64; accept values that fit int32.
        return "int"
    if jnp.issubdtype(dt, jnp.floating):
        return "float"
    raise ArgTypeError(_dtype_message(name, dt))


def _dtype_message(name: str, dt) -> str:
    return (
        f"{name} must have an integer dtype of at most 32 bits (int8, uint8, int16, "
        f"uint16, int32) or a float dtype holding integer values; got {dt}"
    )


def int_range(dtype: Any) -> tuple[int, int]:
    """(min, max) of a supported integer dtype."""
    dt = np.dtype(dtype)
    if dt == np.int64:
        return (-(2**31), 2**31 - 1)
    return _INT_RANGES[dt]


def check_range(x: Any, lo: int, hi: int, name: str) -> None:
    """Raises :class:`RangeError` if concrete ``x`` has values outside ``[lo, hi]`` (a NaN
    is outside). A traced ``x`` is checked only in checked mode (a ``checkify`` check).

    Integer arrays are compared exactly. Float arrays are compared with the bounds
    rounded to their dtype: a float32 array may hold ``2**31``, float32's rounding of
    ``2**31 - 1`` (it converts to ``2**31 - 1``: XLA's float-to-int conversion
    saturates), but not ``2**31 + 256``, the next float32.
    """
    if not is_concrete(x):
        if _checked.enabled():
            _checked.check_range(x, lo, hi, name)
        return
    a = np.asarray(x)
    if a.size == 0:
        return
    if is_float_dtype(a.dtype) and np.isnan(a).any():
        raise RangeError(f"{name} must lie in [{lo}, {hi}]; found nan")
    if is_float_dtype(a.dtype):  # the bounds as the float dtype rounds them (float32: +-2**31 for int32)
        amin, amax, lo_c, hi_c = a.min(), a.max(), a.dtype.type(lo), a.dtype.type(hi)
    else:  # Python ints: exact
        amin, amax, lo_c, hi_c = a.min().item(), a.max().item(), lo, hi
    if amin < lo_c or amax > hi_c:
        bad = amin if amin < lo else amax
        raise RangeError(f"{name} must lie in [{lo}, {hi}]; found {bad}")


def check_integral(x: Any, name: str) -> None:
    """Raises :class:`RangeError` if concrete float ``x`` holds NaN, Inf or non-integer
    values. A traced ``x`` is checked only in checked mode."""
    if not is_concrete(x):
        if _checked.enabled():
            _checked.check_integral(x, name)
        return
    a = np.asarray(x)
    if a.size and is_float_dtype(a.dtype):
        ok = np.isfinite(a) & (np.floor(a) == a)
        if not ok.all():
            raise RangeError(
                f"{name} is a float array and must hold integer values only; found {a.ravel()[np.argmin(ok.ravel())]}"
            )


def check_finite(x: Any, name: str) -> None:
    """Raises :class:`RangeError` if concrete float ``x`` holds a NaN or an Inf. A traced
    ``x`` is checked only in checked mode."""
    if not is_concrete(x):
        if _checked.enabled():
            _checked.check_finite(x, name)
        return
    a = np.asarray(x)
    if a.size and is_float_dtype(a.dtype):
        ok = np.isfinite(a)
        if not ok.all():
            raise RangeError(f"{name} must be finite (no NaN or Inf); found {a.ravel()[np.argmin(ok.ravel())]}")


def check_positive(x: Any, name: str) -> None:
    """Raises :class:`RangeError` unless every value of concrete ``x`` is finite and > 0 (a
    scale). A traced ``x`` is checked only in checked mode."""
    if not is_concrete(x):
        if _checked.enabled():
            _checked.check_ok(
                jnp.isfinite(x) & (x > 0) if jnp.issubdtype(x.dtype, jnp.floating) else x > 0,
                x,
                f"{name} must be finite and > 0",
            )
        return
    a = np.asarray(x)
    if a.size:
        ok = (np.isfinite(a) & (a > 0)) if is_float_dtype(a.dtype) else a > 0
        if not ok.all():
            raise RangeError(f"{name} must be finite and > 0; found {a.ravel()[np.argmin(ok.ravel())]}")


def to_int32(x: jax.Array, name: str) -> jax.Array:
    """Checks and converts an integer or integer-valued float array to int32."""
    k = kind(x, name)
    if k == "float":
        check_integral(x, name)
        check_range(x, -(2**31), 2**31 - 1, name)
    elif np.dtype(x.dtype) == np.int64:
        check_range(x, -(2**31), 2**31 - 1, name)
    return x.astype(jnp.int32)


def check_static_int(value: Any, lo: int, hi: int, name: str) -> int:
    """Validates a static Python integer argument (a Python or NumPy int, not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgTypeError(f"{name} must be a Python int in [{lo}, {hi}], got {value!r}")
    if not lo <= int(value) <= hi:
        raise RangeError(f"{name} must lie in [{lo}, {hi}], got {value}")
    return int(value)


def check_flag(value: Any, name: str) -> bool:
    """A static bool argument: a Python or NumPy bool (anything else raises
    :class:`ArgTypeError`: ``"yes"``, 1 or None are not flags)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgTypeError(f"{name} must be a Python bool (static), got {value!r}")
    return bool(value)


def int_scalar(value: Any, lo: int, hi: int, name: str, *, label: str | None = None) -> jax.Array:
    """An integer scalar argument as int32: a Python or NumPy int, a 0-d integer array, or
    a traced integer scalar (e.g. derived inside ``jit``).

    :class:`ArgTypeError` when it is not an integer scalar. A concrete value outside
    ``[lo, hi]`` raises :class:`RangeError` (``label`` names it there, default ``name``);
    a traced value is checked only in checked mode and otherwise returned as is.
    """
    traced = isinstance(value, jax.core.Tracer)
    if traced:
        a = value
    elif value is None or isinstance(value, (str, bytes, dict, set)):
        a = None
    else:
        try:
            a = np.asarray(value)
        except (ValueError, TypeError, OverflowError):
            a = None
    if isinstance(value, (bool, np.bool_)) or a is None or a.shape != () or not np.issubdtype(a.dtype, np.integer):
        raise ArgTypeError(
            f"{name} must be an integer scalar in [{lo}, {hi}], got "
            f"{f'a traced {a.dtype}{list(a.shape)}' if traced else repr(value)}"
        )
    check_range(a, lo, hi, name if label is None else label)
    return a.astype(jnp.int32) if traced else jax.device_put(a.astype(np.int32))  # host: no program


def check_broadcast(x: Any, x_name: str, y: Any, y_name: str) -> None:
    """Raises :class:`ShapeError` naming ``y`` unless the shapes of ``y`` and ``x``
    broadcast against each other."""
    try:
        jnp.broadcast_shapes(np.shape(x), np.shape(y))
    except ValueError:
        raise ShapeError(
            f"{y_name} of shape {tuple(np.shape(y))} does not broadcast against {x_name} of shape {tuple(np.shape(x))}"
        ) from None


def check_choice(value: Any, choices: tuple, name: str) -> Any:
    """``value`` if it is one of ``choices`` (strings compare by value, anything else by
    identity, so an array or a number is never mistaken for a choice); else
    :class:`RangeError` listing them."""
    ok = any((isinstance(value, str) and isinstance(c, str) and value == c) or value is c for c in choices)
    if not ok:
        raise RangeError(f"{name} must be one of {choices}, got {value!r}")
    return value
