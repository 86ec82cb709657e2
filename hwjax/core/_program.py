"""How hwjax structures the programs it hands to XLA (knows no chip)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def compute_once(fn: Callable[..., Any], operands: tuple, trigger) -> Any:
    """``fn(*operands)``; under tracing, its result passed through a ``lax.cond`` whose
    predicate (``(trigger | 1) != 0``: always true, for every value, but only known at run
    time) keeps the compiler from inlining the work into the consumers.

    Why: XLA fuses element-wise producers into every consumer, duplicating them. Left
    alone, a layer's integer pipeline (or the exact-division chains behind its scales)
    would be recomputed once per kernel tap by the next layer's im2col slices, or
    once per activation by the surrogate's fusions (a 10-20x slowdown on CPU). A
    conditional's operands are materialised and its outputs cannot be fused, so the work
    is done once, into a buffer the consumers read. Only the result passes through the
    conditional (its taken branch returns its operand): ``fn`` itself stays outside, so
    constants among the operands (a model's parameters closed over by ``jit``) are still
    folded into ``fn``'s work. (A one-trip ``while_loop`` does the same with two more
    small kernels per use for its counter; the conditional compiles faster.)

    ``trigger`` is any runtime int32 scalar (a zero point, a bit pattern); the other
    branch is never taken, whatever the trigger's value, and returns the operands too. Pass a trigger
    that ``vmap`` does not map (a parameter rather than a data value): a mapped predicate
    turns the conditional into a ``select`` of both branches, and the barrier is gone
    (the values stay the same). A concrete trigger lets XLA fold the conditional away:
    the values are the same, without the barrier. For integer and stop-gradient values.
    Concrete (eager) operands call ``fn`` directly.
    """
    y = fn(*operands)
    leaves = jax.tree.leaves((operands, trigger))
    if not any(isinstance(a, jax.core.Tracer) for a in leaves):
        return y
    live = (jnp.asarray(trigger, jnp.int32) | 1) != 0  # always true; unknown to the compiler
    flat, tree = jax.tree.flatten(y)
    # both branches return the operands; the other branch through an optimization barrier,
    # so that XLA sees two different branches and keeps the conditional (identical branches
    # are folded away), while the barrier itself compiles to nothing (zeros there would be a
    # kernel of their own per node)
    other = lambda ops: list(jax.lax.optimization_barrier(list(ops)))
    return jax.tree.unflatten(tree, jax.lax.cond(live, lambda ops: list(ops), other, flat))


#: bytes of a kernel's intermediates (int8 patches, int32 accumulators) per batch chunk
CHUNK_BYTES = 1 << 20

#: batches of at most this many examples run in one pass, without a loop over chunks
#: (``jit_run(chunk=...)`` and ``Model.run`` trace such a batch under :func:`one_pass`): a
#: loop is compiled once per program, and at this size it does not pay for itself.
#: Measured on the MLPerf Tiny models (one AMD EPYC core, LiteRT reference arithmetic): a
#: batch of 32 in one pass ran 0.83x (ResNet-large), 0.91x (ResNet-8), 1.0x (ad01,
#: str_ww), 1.0-1.08x (KWS) and 1.09-1.14x (VWW) as fast as in chunks, and VWW's program
#: compiled about 0.5 s sooner; at 64 examples one pass ran 0.50x (ResNet-large) and
#: 0.63x (ResNet-8).
ONE_PASS_EXAMPLES = 32

_ONE_PASS = contextvars.ContextVar("hwjax_one_pass", default=False)


@contextlib.contextmanager
def one_pass():
    """A context in which :func:`map_chunks` runs every batch in one pass (what is traced
    in it has no loop over chunks of examples). Only speed and compile time depend on it,
    never a value (a jitted helper whose trace JAX cached outside the context keeps its
    chunks). The graph runner uses it for batches of at most :data:`ONE_PASS_EXAMPLES`;
    inside its own chunks of a larger batch the kernels keep chunking: ResNet-8 at batch
    256 ran 1.4x faster with its first convolutions in 4-example chunks inside the
    graph's 8-example ones than with one pass over each 8."""
    token = _ONE_PASS.set(True)
    try:
        yield
    finally:
        _ONE_PASS.reset(token)


def map_chunks(fn: Callable[[jax.Array], Any], x: jax.Array, n_lead: int, per_example_bytes: int) -> Any:
    """``fn(x)`` for ``x`` with ``n_lead`` leading batch axes, computed on chunks of examples
    (``jax.lax.map``) so that each chunk's intermediates stay near :data:`CHUNK_BYTES` (in
    cache): one 3x3 conv (16x16x32 -> 32) at batch 1024 ran 1.7x faster, a depthwise 2.4x,
    than in one pass over the whole batch (2-core VM). In :func:`one_pass` it runs ``fn``
    on the whole batch. ``fn`` maps an array of examples to a pytree of arrays whose
    leading axis is the examples; it must treat examples independently, so the result is
    the same. ``per_example_bytes``: the intermediates' size per example."""
    lead, rest = x.shape[:n_lead], x.shape[n_lead:]
    n = int(np.prod(lead, dtype=np.int64))
    target = max(1, CHUNK_BYTES // max(1, per_example_bytes))
    if n_lead == 0 or n <= target or _ONE_PASS.get():
        return fn(x)
    chunk = next((d for d in range(target, max(1, target // 2) - 1, -1) if n % d == 0), target)
    xf = x.reshape(n, *rest)
    full = (n // chunk) * chunk
    ys = jax.tree.map(
        lambda y: y.reshape(full, *y.shape[2:]), jax.lax.map(fn, xf[:full].reshape(n // chunk, chunk, *rest))
    )
    if full < n:
        ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=0), ys, fn(xf[full:]))
    return jax.tree.map(lambda y: y.reshape(*lead, *y.shape[1:]), ys)


def _concrete(tree) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(tree))


def evaluated_if_concrete(tree=()):
    """A context in which JAX computes on concrete values at once inside a ``jit`` trace
    (``jax.core.eval_context()``: operations run as they would outside any trace), when a
    program is being traced and no leaf of ``tree`` is traced; else a no-op.

    For host-side work on concrete values (integer parameters derived from concrete
    weights and scales, LUT tables, checks that read values): inside a trace its results
    are constants of the traced program rather than operations in it, they can be read
    with NumPy, and they can be cached without holding a tracer. Jitted helpers called in
    it run the programs an eager call compiled (the same cache entries: an eager call
    followed by ``jax.jit`` compiles them once). ``jax.ensure_compile_time_eval`` would
    not: it also folds constants while staging, a setting that is part of every program's
    cache key, so each helper would be traced, lowered and compiled again on first use
    in a trace. Outside a trace it does nothing: the work is eager already."""
    if not _concrete(tree) or not _staging():
        return contextlib.nullcontext()
    return jax.core.eval_context()


def _staging() -> bool:
    """Whether a program is being traced here (``jit``): a ``device_put`` is then staged."""
    return isinstance(jax.device_put(np.int32(0)), jax.core.Tracer)


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


@functools.lru_cache(maxsize=1)
def cpu_flags() -> str:
    """The processor's instruction-set flags as Linux lists them (``/proc/cpuinfo``'s first
    ``flags`` or ``Features`` line, space-separated); empty where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""
