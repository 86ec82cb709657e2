"""Argument checks shared by the core primitives.

Static arguments are checked at trace time. Array *values* are checked only when
they are concrete (not traced): under ``jit`` the value ranges documented by each
function are the caller's contract.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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


def as_array(x: Any, name: str) -> jax.Array:
    """Converts ``x`` to a JAX array; Python ints become int32 (never int64)."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer or float array, got bool")
    if isinstance(x, int):
        if not -(2**31) <= x < 2**31:
            raise ValueError(f"{name}={x} is outside the int32 range [-2**31, 2**31-1]")
        return jnp.asarray(x, dtype=jnp.int32)
    if isinstance(x, float):
        return jnp.asarray(x, dtype=jnp.float32)
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype == np.int64:
        check_range(x, -(2**31), 2**31 - 1, name)
        x = x.astype(np.int32)
    if isinstance(x, (np.ndarray, np.generic)):
        return jax.device_put(x)  # jnp.asarray would compile a copy program per shape and dtype
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def kind(x: jax.Array, name: str) -> str:
    """Returns "int" or "float" for a supported dtype, else raises TypeError."""
    dt = np.dtype(x.dtype)
    if dt in _INT_RANGES:
        return "int"
    if dt == np.int64:
        # Only reachable with jax_enable_x64; accept values that fit int32.
        return "int"
    if jnp.issubdtype(dt, jnp.floating):
        return "float"
    raise TypeError(
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
    """Raises ValueError if concrete ``x`` has values outside [lo, hi]."""
    if not is_concrete(x):
        return
    a = np.asarray(x)
    if a.size == 0:
        return
    amin, amax = a.min(), a.max()
    if amin < lo or amax > hi:
        bad = amin if amin < lo else amax
        raise ValueError(f"{name} must lie in [{lo}, {hi}]; found {bad}")


def check_integral(x: Any, name: str) -> None:
    """Raises ValueError if concrete float ``x`` holds non-integer values."""
    if not is_concrete(x):
        return
    a = np.asarray(x)
    if a.size and not np.all(np.isfinite(a) & (np.floor(a) == a)):
        raise ValueError(f"{name} is a float array and must hold integer values only")


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
    """Validates a static Python integer argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int in [{lo}, {hi}], got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {value}")
    return int(value)


def int_scalar(value: Any, lo: int, hi: int, name: str, *, label: str | None = None) -> jax.Array:
    """An integer scalar argument as int32: a Python or NumPy int, a 0-d integer array, or
    a traced integer scalar (e.g. derived inside ``jit``).

    TypeError when it is not an integer scalar. A concrete value outside ``[lo, hi]``
    raises ValueError (``label`` names it there, default ``name``); a traced value cannot
    be checked and is returned as is.
    """
    a = value if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if isinstance(value, bool) or a.shape != () or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer scalar in [{lo}, {hi}], got "
                        f"{f'a traced {a.dtype}{list(a.shape)}' if isinstance(value, jax.core.Tracer) else repr(value)}")
    check_range(a, lo, hi, name if label is None else label)
    return jnp.asarray(a, jnp.int32)


def check_choice(value: Any, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value
