"""Lowering a portable graph for a target, and running a graph exactly."""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import ONE_PASS_EXAMPLES, compute_once, evaluated_if_concrete, one_pass
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, FormatError, RangeError, ShapeError
from hwjax.graph._ir import INT_DTYPES, Graph, Node
from hwjax.graph._ops import get_op

_NP_DTYPES = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "float32": np.float32}


def _check_graph(graph) -> None:
    if not isinstance(graph, Graph):
        raise ArgTypeError(f"graph must be a hwjax.graph.Graph, got {type(graph).__name__}")


def _as_target(target):
    """``target`` itself when it is a target object (anything with a ``lowering(op)``
    method, as :class:`hwjax.targets.Target` has). The graph layer knows no target by name:
    a name is resolved where the user passes it (``hwjax.targets.get(name)``)."""
    if callable(getattr(target, "lowering", None)):
        return target
    hint = f" (hwjax.targets.get({target!r}) resolves a name)" if isinstance(target, str) else ""
    raise ArgTypeError(f"target must be a target object such as hwjax.targets.get('xs3'){hint}, got {target!r}")


def _resolve_target(graph: Graph, target):
    _check_graph(graph)
    if target is None:
        if graph.target is None:
            raise RangeError(
                "this graph holds portable parameters: pass the target to run it on (e.g. hwjax.targets.get('xs3'))"
            )
        return graph.target
    target = _as_target(target)
    if graph.target is not None and target != graph.target:
        raise RangeError(f"this graph was lowered for {graph.target!r}; it cannot run on {target!r}")
    return target


def lower_node(node: Node, graph: Graph, target) -> Node:
    """``node`` with its portable parameters replaced by ``target``'s (its recipe)."""
    return node.replace(params=derive_params(target, [_request(node, graph)])[0])


def _request(node: Node, graph: Graph) -> tuple:
    """The ``(op, attrs, portable, q_in, q_out)`` of a node, for :func:`derive_params`."""
    q_in = [graph.tensors[t].quant for t in node.inputs]
    return node.op, node.attrs, node.params, q_in, graph.tensors[node.outputs[0]].quant


def derive_params(target, requests) -> list:
    """``target``'s integer parameters for several ops: ``requests`` is a list of ``(op,
    attrs, portable, q_in, q_out)`` (an op kind, its :class:`Attrs`, portable parameters and
    input / output :class:`Quant`); returns one entry per request (None where the op has
    no parameters on ``target``), what ``target.lowering(op).params(target, attrs, portable,
    q_in, q_out)`` gives, bit for bit.

    Requests whose impls share a ``params_many`` recipe (:class:`OpImpl`) are derived by
    one call to it, so that a program deriving a whole model's parameters holds one copy of
    that recipe, not one per layer (XS3's output-transform recipe is some 2,000 operations).
    Jittable; no gradient. ArgTypeError names ``target`` or ``requests`` when they are not a
    target and a list of 5-tuples."""
    target = _as_target(target)
    if not isinstance(requests, (list, tuple)) or not all(isinstance(r, tuple) and len(r) == 5 for r in requests):
        raise ArgTypeError(
            f"requests must be a list of (op, attrs, portable, q_in, q_out) tuples, got {type(requests).__name__}"
        )
    out: list = [None] * len(requests)
    batches: dict = {}
    for i, (op, attrs, portable, q_in, q_out) in enumerate(requests):
        impl = target.lowering(op)
        if impl.params_many is not None:
            batches.setdefault(impl.params_many, []).append(i)
        elif impl.params is not None:
            out[i] = impl.params(target, attrs, portable, q_in, q_out)
    for many, idx in batches.items():
        for i, p in zip(idx, many(target, [requests[i] for i in idx])):
            out[i] = p
    return out


def lower(graph: Graph, target) -> Graph:
    """The graph with every node's integer parameters derived for ``target`` (its
    quantisation recipes, jittable), ready to :func:`run` or to export in the target's
    formats. A graph already lowered for ``target`` is returned unchanged. A graph with
    concrete parameters is lowered at once, also inside a ``jit`` trace (its integer
    parameters become constants of the traced program, not a recipe in it); one whose
    parameters are traced is lowered in the trace.

    Raises :class:`hwjax.errors.UnsupportedOpError` naming the first op the target
    cannot run."""
    target = _resolve_target(graph, target)
    if graph.target is not None:
        return graph
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(graph)):
        return _lower(graph, target)
    # concrete parameters: derived now, also when called inside a trace (the result holds
    # no tracer, so a caller may cache it); host recipes where the target has them, the
    # others as one compiled program (not op by op)
    with evaluated_if_concrete(graph):
        host = {}
        for i, n in enumerate(graph.nodes):
            p = _host_lowered(n, graph, target)
            if p is not None:
                host[i] = n.replace(params=p)
        rest = [i for i, n in enumerate(graph.nodes) if i not in host and target.lowering(n.op).params is not None]
        low = _lower_jit(graph, target, tuple(sorted(host))) if rest else _lower(graph, target, tuple(sorted(host)))
        return low.replace(nodes=tuple(host.get(i, n) for i, n in enumerate(low.nodes)))


def _host_lowered(node: Node, graph: Graph, target):
    """The node's parameters from the target's host recipe, or None (no host recipe, or
    it deferred)."""
    impl = target.lowering(node.op)
    if impl.host_params is None:
        return None
    q_in = [jax.tree.map(np.asarray, graph.tensors[t].quant) for t in node.inputs]
    q_out = jax.tree.map(np.asarray, graph.tensors[node.outputs[0]].quant)
    p = impl.host_params(target, node.attrs, jax.tree.map(np.asarray, node.params), q_in, q_out)
    return None if p is None else jax.device_put(p)  # host values: transferred (one call), not compiled


def _lower(graph: Graph, target, skip: tuple[int, ...] = ()) -> Graph:
    """Every node but those at ``skip`` lowered with the target's (jittable) recipes, derived
    together (:func:`derive_params`)."""
    todo = [i for i in range(len(graph.nodes)) if i not in skip]
    params = dict(zip(todo, derive_params(target, [_request(graph.nodes[i], graph) for i in todo])))
    nodes = tuple(n.replace(params=params[i]) if i in params else n for i, n in enumerate(graph.nodes))
    return graph.replace(nodes=nodes, target=target)


_lower_jit = jax.jit(_lower, static_argnums=(1, 2))


def _batched(graph: Graph, inputs) -> tuple[list[jax.Array], bool]:
    if isinstance(inputs, Mapping):
        missing = [t for t in graph.inputs if t not in inputs]
        if missing:
            raise RangeError(f"inputs lack the graph inputs {missing}")
        xs = [inputs[t] for t in graph.inputs]
    elif isinstance(inputs, (tuple, list)):
        xs = list(inputs)
    else:
        xs = [inputs]
    if len(xs) != len(graph.inputs):
        raise RangeError(f"the graph takes {len(graph.inputs)} inputs {list(graph.inputs)}, got {len(xs)}")
    out, single = [], None
    for t, x in zip(graph.inputs, xs):
        x = jnp.asarray(x)
        shape = tuple(graph.tensors[t].shape)
        if tuple(x.shape) == shape:
            s = True
        elif tuple(x.shape[1:]) == shape:
            s = False
        else:
            raise ShapeError(
                f"input {t!r} must have shape {shape} or (batch, {', '.join(map(str, shape))}), got {tuple(x.shape)}"
            )
        if single is not None and s != single:
            raise ShapeError("either every input has a batch axis or none has")
        single = s
        out.append(x[None] if s else x)
    return out, bool(single)


def run(graph: Graph, inputs, target=None, *, intermediates: bool = False, return_stats: bool = False):
    """Evaluates ``graph`` exactly on ``target``.

    Args:
      graph: a :class:`Graph`, portable or lowered.
      inputs: one array, a sequence in ``graph.inputs`` order, or a mapping by name;
        each of the input tensor's shape (one example) or with a leading batch axis.
        Integer inputs hold the tensor's values (any integer dtype, read as int32); a
        float input feeds a ``quantize`` node.
      target: a target object (:func:`hwjax.targets.get` resolves a name); default the graph's.
        A portable graph is first :func:`lower`-ed (inside the trace).
      intermediates: also return every tensor, by name.
      return_stats: also return, per node with accumulators, ``{"count", "saturated"}``.

    Returns:
      The output (a tuple for several outputs) as int32 arrays holding the tensors'
      values (float32 for float tensors), batched like the inputs; then the dict of
      intermediates and/or statistics when asked for.

    Pure and jittable (``jax.jit(run, static_argnames=...)`` or :func:`jit_run`), and it
    batches with ``jax.vmap`` over a leading axis: every example is computed
    independently and exactly.
    """
    target = _resolve_target(graph, target)
    graph = lower(graph, target)
    xs, single = _batched(graph, inputs)
    # Between nodes an int8 / uint8 tensor is held in its storage type (a quarter of the
    # memory traffic of int32); an op reads it as int32 unless it asks for the storage type
    # (OpImpl.narrow_inputs). The values fit: every producer keeps a tensor in its type's
    # range, and Model.run checks concrete inputs. Integer inputs are converted here, not by
    # the caller: under jit_run(chunk=...) one chunk at a time.
    xs = [
        _stored(x.astype(jnp.int32), graph.tensors[t].dtype)
        if graph.tensors[t].dtype in INT_DTYPES and jnp.issubdtype(x.dtype, jnp.integer)
        else x
        for t, x in zip(graph.inputs, xs)
    ]
    env: dict[str, jax.Array] = dict(zip(graph.inputs, xs))
    stats: dict[str, Any] = {}
    trigger = _runtime_scalar(graph, xs[0])
    consumed = {t for n in graph.nodes for t in n.inputs}
    for node in graph.nodes:
        impl = target.lowering(node.op)
        args = [env[t] for t in node.inputs]
        if not impl.narrow_inputs:
            args = [_widened(a) for a in args]
        out_dtypes = [graph.tensors[t].dtype for t in node.outputs]
        # each node's result is computed once and materialised (compute_once): XLA would
        # otherwise fuse it into its consumers and recompute it per use (2-3x slower).
        # A node no other node reads (the graph's last) has nothing to fuse into, and a
        # reshape (OpSpec.layout_only) nothing to recompute.
        materialise = consumed.intersection(node.outputs) and not get_op(node.op).layout_only
        once = compute_once if materialise else _direct
        # the node's name in the operations' metadata: a profile of the compiled program
        # (jax.profiler, XLA's dumps) attributes each kernel to the node it computes
        with jax.named_scope(f"{node.op}:{node.name}"):
            if return_stats:
                y, acc = once(
                    lambda p, *a: _stored_outputs(
                        impl.run(target, node.attrs, p, *a, return_acc=True), out_dtypes, True
                    ),
                    (node.params, *args),
                    trigger,
                )
                if acc is not None:
                    stats[node.name] = acc
            else:
                y = once(
                    lambda p, *a: _stored_outputs(impl.run(target, node.attrs, p, *a), out_dtypes),
                    (node.params, *args),
                    trigger,
                )
        ys = y if isinstance(y, tuple) else (y,)
        for t, v in zip(node.outputs, ys):
            env[t] = v
    unb = (lambda v: _widened(v[0])) if single else _widened
    outs = tuple(unb(env[t]) for t in graph.outputs)
    result: Any = outs[0] if len(outs) == 1 else outs
    extra = []
    if intermediates:
        extra.append({k: unb(v) for k, v in env.items()})
    if return_stats:
        extra.append(stats)
    return (result, *extra) if extra else result


def _stored(x: jax.Array, dtype: str) -> jax.Array:
    """An int8/uint8 tensor's int32 values in its storage type (as held between nodes and
    handed to :attr:`OpImpl.narrow_inputs` ops); other tensors unchanged. The values fit:
    every producer keeps a tensor in its type's range, and :meth:`hwjax.tflite.Model.run`
    checks concrete inputs."""
    narrow = dtype in ("int8", "uint8") and jnp.issubdtype(x.dtype, jnp.integer)
    return x.astype(_NP_DTYPES[dtype]) if narrow else x


def _stored_outputs(y, dtypes: list[str], with_acc: bool = False):
    """An op's result (one array or a tuple; ``(result, acc)`` when ``with_acc``) with each
    int8/uint8 output in its storage type (:func:`_stored`)."""
    if with_acc:
        return _stored_outputs(y[0], dtypes), y[1]
    if isinstance(y, tuple):
        return tuple(_stored(v, d) for v, d in zip(y, dtypes))
    return _stored(y, dtypes[0])


def _widened(x: jax.Array) -> jax.Array:
    """A stored int8/uint8 (or int16) tensor as int32 values, what ops and callers read."""
    if jnp.issubdtype(x.dtype, jnp.integer) and x.dtype.itemsize < 4:
        return x.astype(jnp.int32)
    return x


def _direct(fn, operands: tuple, trigger):
    """``fn(*operands)`` (:func:`hwjax.core.compute_once`'s signature, nothing materialised)."""
    del trigger
    return fn(*operands)


def _runtime_scalar(graph: Graph, x: jax.Array) -> jax.Array:
    """An int32 scalar only known at run time (:func:`hwjax.core.compute_once`'s trigger),
    which a ``vmap`` does not map: the bits of the graph's first parameter or quantisation
    value XOR the bits of the first input value (:func:`_first_bits`). The input makes it
    a run-time value also where the graph is a constant of the program (closed over by
    the caller's ``jit``: XLA would fold a trigger made of the graph alone, and with it
    every barrier; a parameter of a nested ``jit`` is such a constant once inlined)."""
    first = next((a for a in jax.tree.leaves(graph) if jnp.size(a)), None)
    bits = _first_bits(jax.lax.stop_gradient(x))
    return bits if first is None else bits ^ _first_bits(first)


@jax.custom_batching.custom_vmap
def _first_bits(v: jax.Array) -> jax.Array:
    """The bits of ``v``'s first value as an int32 scalar; under ``vmap``, those of the first
    example's (not mapped: a mapped trigger would turn the barriers into selects)."""
    return jax.lax.bitcast_convert_type(jnp.ravel(v)[0].astype(jnp.float32), jnp.int32)


@_first_bits.def_vmap
def _first_bits_rule(axis_size, in_batched, v):
    del axis_size, in_batched
    return _first_bits(v), False


def jit_run(
    graph: Graph,
    inputs,
    target=None,
    *,
    intermediates: bool = False,
    return_stats: bool = False,
    chunk: Optional[int] = None,
):
    """:func:`run` under ``jax.jit``: compiled once per graph structure, target and input
    shapes (the parameters are traced, so new parameter values reuse the program).

    ``chunk``: when the batch is larger, and larger than
    :data:`hwjax.core.ONE_PASS_EXAMPLES`, run it as consecutive chunks of ``chunk``
    examples (``jax.lax.map`` in the same program; the last chunk padded, the padding
    dropped); a batch of at most ``ONE_PASS_EXAMPLES`` runs in one pass, its kernels too
    (:func:`hwjax.core.one_pass`). Same values (every example is computed
    independently); on CPU it keeps each node's buffers cache-sized instead of mapping
    fresh memory per call for large batches. Not with ``intermediates`` or
    ``return_stats``.
    """
    _check_graph(graph)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise RangeError(f"jit_run: chunk must be a positive int (examples per chunk) or None, got {chunk!r}")
    return _jit_run(
        graph,
        inputs,
        target,
        intermediates=V.check_flag(intermediates, "intermediates"),
        return_stats=V.check_flag(return_stats, "return_stats"),
        chunk=chunk,
    )


@functools.partial(jax.jit, static_argnames=("target", "intermediates", "return_stats", "chunk"))
def _jit_run(
    graph: Graph,
    inputs,
    target=None,
    *,
    intermediates: bool = False,
    return_stats: bool = False,
    chunk: Optional[int] = None,
):
    if chunk is None:
        return run(graph, inputs, target, intermediates=intermediates, return_stats=return_stats)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise RangeError(f"jit_run: chunk must be a positive int (examples per chunk) or None, got {chunk!r}")
    if intermediates or return_stats:
        raise ShapeError("jit_run: chunk cannot be combined with intermediates or return_stats")
    xs, single = _batched(graph, inputs)
    n = xs[0].shape[0]
    if n <= ONE_PASS_EXAMPLES:
        with one_pass():
            return run(graph, inputs, target)
    if single or n <= chunk:
        return run(graph, inputs, target)
    m = -(-n // chunk)
    parts = tuple(
        jnp.pad(x, [(0, m * chunk - n)] + [(0, 0)] * (x.ndim - 1)).reshape(m, chunk, *x.shape[1:]) for x in xs
    )
    ys = jax.lax.map(lambda c: run(graph, list(c), target), parts)
    return jax.tree.map(lambda y: y.reshape(m * chunk, *y.shape[2:])[:n], ys)


def as_dtype(x: jax.Array, dtype: str) -> np.ndarray:
    """Host copy of ``x`` in the tensor dtype ``dtype`` (values are range-checked)."""
    a = np.asarray(x)
    dt = np.dtype(_NP_DTYPES[dtype])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise FormatError(f"values outside {dtype} in a tensor declared {dtype}")
    return a.astype(dt)
