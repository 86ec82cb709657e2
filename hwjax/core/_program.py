"""How hwjax structures the programs it hands to XLA (knows no chip)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.extend
import jax.numpy as jnp

_SENTINEL = -2147483647  # a trigger value that never occurs (zero points are int8)


def compute_once(fn: Callable[..., Any], operands: tuple, trigger) -> Any:
    """``fn(*operands)``; under tracing, evaluated inside a ``while_loop`` whose trip
    count (1) is only known at run time, with the operands routed through the loop
    counter so that the compiler can neither unroll the loop nor hoist the work out.

    Why: XLA fuses element-wise producers into every consumer, duplicating them. Left
    alone, a layer's integer pipeline (or the exact-division chains behind its scales)
    would be recomputed once per kernel tap by the next layer's im2col gathers, or
    once per activation by the surrogate's fusions (a 10-20x slowdown on CPU). A loop's
    outputs cannot be fused, so the work is done once, on materialised inputs.

    ``trigger`` is any runtime int32 scalar (a zero point, a bit pattern); the loop
    runs ``1 + (trigger == -2147483647)`` times, and ``fn`` must not care (it is pure,
    so a second pass gives the same value). For integer and stop-gradient values only:
    no gradient flows through the loop. Concrete (eager) operands call ``fn`` directly.
    """
    leaves = jax.tree.leaves((operands, trigger))
    if not any(isinstance(a, jax.core.Tracer) for a in leaves):
        return fn(*operands)
    n = 1 + (jnp.asarray(trigger, jnp.int32) == _SENTINEL).astype(jnp.int32)
    # fn is traced once (its shapes and its program); the loop body replays the program
    # rather than tracing fn a second time
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*operands)
    replay = jax.extend.core.jaxpr_as_fun(closed)
    out_tree = jax.tree.structure(shapes)
    init = (jnp.int32(0), jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))

    def body(c):
        live = c[0] < n  # always true inside the loop; unknown to the compiler
        ops = [jnp.where(live, a, jnp.zeros_like(a)) for a in jax.tree.leaves(operands)]
        return c[0] + 1, jax.tree.unflatten(out_tree, replay(*ops))

    return jax.lax.while_loop(lambda c: c[0] < n, body, init)[1]


def _concrete(tree) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(tree))


def eager_program(fn: Callable[..., Any] | None = None, *, static_argnames: Sequence[str] = ()):
    """Decorator for the body of a public primitive, after its argument checks: called on
    concrete arrays (eagerly), the body runs as one compiled program per shape, dtype and
    static option (``static_argnames``), not as one program per operation; called on
    traced values it is traced into the caller's program, exactly as without the
    decorator. The value is the same either way (the bodies hwjax decorates are the ones its
    jitted graph programs run).

    Eager JAX compiles every operation on a new shape as its own small program (tens of
    milliseconds each on CPU), so a primitive of a dozen operations called on a new shape
    would otherwise wait for a dozen compilations.
    """
    if fn is None:
        return functools.partial(eager_program, static_argnames=tuple(static_argnames))
    jitted = jax.jit(fn, static_argnames=tuple(static_argnames))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return jitted(*args, **kwargs) if _concrete((args, kwargs)) else fn(*args, **kwargs)

    return call
