"""Float inputs with surrogate gradients for composite integer pipelines.

One mechanism serves every differentiable chip instruction and kernel built from the
core (the XS3 VPU instructions, output transforms and convolutions use it):
:func:`call` takes

* ``forward``: the exact integer function, ``forward(*args) -> (y, clipped, *extras)``
  with ``y`` the integer result, ``clipped`` a boolean mask (broadcastable to ``y``,
  or ``None``) of the outputs that some saturation step clipped, and ``extras``
  integer side results (accumulators, statistics) that are never differentiated;
* ``surrogate``: a real-valued function of the same arguments, the float affine
  function that the integer pipeline approximates (``x * 2**-s`` for a rounding
  shift, ``x * m / 2**k`` for a fixed-point multiply, a convolution scaled by the
  output transform's multiplier, ...);
* ``args``: the arguments, pytrees of arrays.

When every array in ``args`` is an integer array, ``forward`` runs as is and the
result is ``y`` (or ``(y, *extras)``). When some array is a float array holding
integer values, the float arrays are cast to int32, ``forward`` runs on them (so the
values are bit-identical to the integer path) and ``y`` comes back in the float
dtype, inside a ``jax.custom_vjp`` whose backward pass is the VJP of ``surrogate``
with the incoming cotangent set to 0 where ``clipped`` (``saturation_grad="zero"``,
the default) or passed unchanged (``"pass"``, straight-through saturation). Integer
arrays are constants of the surrogate: they receive float0 (no) cotangents.

``forward`` and ``surrogate`` must close over static Python values only; every array
goes through ``args`` (so the functions work under ``jit``, ``vmap`` and ``grad``).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V

SaturationGrad = Literal["zero", "pass"]
SAT_GRADS: tuple[str, ...] = ("zero", "pass")


def is_float(a: Any) -> bool:
    """True for a float array (a differentiable operand)."""
    return jnp.issubdtype(jnp.result_type(a), jnp.floating)


def has_float(*args: Any) -> bool:
    """True when some array leaf of ``args`` is a float array."""
    return any(is_float(leaf) for leaf in jax.tree_util.tree_leaves(args))


def operand(
    x: Any,
    name: str,
    lo: int,
    hi: int,
    *,
    differentiable: bool,
    what: str = "",
    label: str | None = None,
    to_int32: bool = True,
) -> jax.Array:
    """An integer operand with values in ``[lo, hi]`` (checked when concrete).

    Integer arrays come back as int32. Float arrays are accepted only where the
    argument is ``differentiable``; they must hold integer values in range and come
    back unchanged. Otherwise a float array raises TypeError naming the argument.
    ``what`` is appended to the type error's "must be an integer array"; ``label``
    (default ``name``) names the argument in the range error. ``to_int32=False`` keeps an
    integer array's own dtype (for callers that convert inside a jitted program).
    """
    label = name if label is None else label
    a = V.as_array(x, name)
    if V.kind(a, name) == "float":
        if not differentiable:
            raise V.ArgTypeError(
                f"{name} must be an integer array{what}, got dtype {a.dtype} "
                f"(float arrays are accepted only for differentiable operands)"
            )
        V.check_integral(a, name)
        V.check_range(a, lo, hi, label)
        return a
    V.check_range(a, lo, hi, label)
    return host_cast(x, a, jnp.int32) if to_int32 else a


def host_cast(x: Any, a: jax.Array, dtype) -> jax.Array:
    """``a`` (``V.as_array(x)``) as ``dtype``: a NumPy ``x`` is cast on the host and
    transferred, so an eager call compiles no conversion program per shape (inside a trace
    it is a constant either way)."""
    if a.dtype == dtype:
        return a
    if isinstance(x, (np.ndarray, np.generic)):  # (as_array has checked an int64 array's range)
        return jax.device_put(x.astype(dtype))
    return a.astype(dtype)


def exp2(s: Any, like: Any) -> jax.Array:
    """``2.0 ** s`` exactly (``ldexp``; ``jnp.exp2`` is not exact) for an integer (array)
    exponent ``s``, in ``like``'s float dtype (float32 for an integer ``like``); large
    negative ``s`` give 0."""
    dtype = jnp.result_type(like, jnp.float32)
    return jnp.ldexp(jnp.ones((), dtype), jnp.asarray(s).astype(jnp.int32))


def call(forward: Callable, surrogate: Callable, *args: Any, saturation_grad: SaturationGrad = "zero"):
    """Runs ``forward(*args)`` exactly; differentiable as ``surrogate`` for float args.

    See the module docstring. Returns ``y``, or ``(y, *extras)`` when ``forward``
    returns extras. ``y`` is in the float dtype of the float arguments (their
    ``jnp.result_type``) when there are any, else ``forward``'s integer dtype.
    """
    V.check_choice(saturation_grad, SAT_GRADS, "saturation_grad")
    leaves, tree = jax.tree_util.tree_flatten(args)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    floats = [i for i, leaf in enumerate(leaves) if is_float(leaf)]
    if not floats:
        return integer_result(forward(*jax.tree_util.tree_unflatten(tree, leaves)))
    dtype = jnp.result_type(*(leaves[i].dtype for i in floats))

    def run(flat):
        ints = [a.astype(jnp.int32) if is_float(a) else a for a in flat]
        y, clipped, *extras = forward(*jax.tree_util.tree_unflatten(tree, ints))
        return (y.astype(dtype), tuple(extras)), clipped

    @jax.custom_vjp
    def f(*flat):
        return run(flat)[0]

    def fwd(*flat):
        out, clipped = run(flat)
        return out, (flat, clipped)

    def bwd(res, ct):
        flat, clipped = res
        g = ct[0]
        if saturation_grad == "zero" and clipped is not None:
            g = jnp.where(clipped, jnp.zeros_like(g), g)
        return _surrogate_vjp(surrogate, tree, flat, floats, g)

    f.defvjp(fwd, bwd)
    y, extras = f(*leaves)
    return (y, *extras) if extras else y


def integer_result(out: tuple):
    """A forward result ``(y, clipped, *extras)`` -> ``y`` or ``(y, *extras)``."""
    y, _, *extras = out
    return (y, *extras) if extras else y


def _surrogate_vjp(surrogate: Callable, tree, flat: tuple, floats: list[int], g: jax.Array) -> tuple:
    """Cotangents of every leaf: the VJP of ``surrogate`` for float leaves, float0 else."""

    def on_floats(*values):
        full = list(flat)
        for i, v in zip(floats, values):
            full[i] = v
        return jnp.broadcast_to(surrogate(*jax.tree_util.tree_unflatten(tree, full)), g.shape)

    y_s, vjp = jax.vjp(on_floats, *(flat[i] for i in floats))
    grads = dict(zip(floats, vjp(g.astype(y_s.dtype))))
    return tuple(
        grads[i].astype(a.dtype) if i in grads else np.zeros(a.shape, jax.dtypes.float0) for i, a in enumerate(flat)
    )
