"""Jitted, batched (and optionally sharded) evaluation of hwjax models."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nn import QArray


@dataclass(frozen=True)
class EvalResult:
    """Outputs of :func:`evaluate`.

    Attributes:
      outputs: (N, ...) model outputs: int8 values for quantised outputs (hardware-mode
        models and :func:`hwjax.load` models), float32 otherwise.
      predictions: (N,) ``argmax`` over the last output axis (first maximum).
      accuracy: fraction of ``predictions == labels`` (None without labels).
      scale, zero_point: the output quantisation (None for float outputs).
    """

    outputs: np.ndarray
    predictions: np.ndarray
    accuracy: Optional[float]
    scale: Optional[float]
    zero_point: Optional[int]


def _split_data(data) -> tuple[np.ndarray, Optional[np.ndarray]]:
    if isinstance(data, dict):
        if "x" not in data:
            raise ShapeError("data dict must have an 'x' entry (and optionally 'y')")
        x, y = data["x"], data.get("y")
    elif isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise ShapeError(f"data must be x, (x, y) or {{'x': ..., 'y': ...}}; got a sequence of {len(data)}")
        x, y = data
    else:
        x, y = data, None
    return _numeric(x, "x"), (None if y is None else _numeric(y, "labels"))


def _numeric(v, name: str) -> np.ndarray:
    """``v`` as a NumPy array of numbers (ArgTypeError naming ``name`` otherwise)."""
    if v is None or isinstance(v, (str, bytes)):
        raise ArgTypeError(f"{name} must be an array of numbers, got {type(v).__name__}")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise ArgTypeError(f"{name} must be an array of numbers of one shape: {e}") from None
    if a.dtype.kind not in "iuf" and not jnp.issubdtype(a.dtype, jnp.floating):  # (bfloat16 is kind "V")
        raise ArgTypeError(f"{name} must be an array of numbers, got dtype {a.dtype}")
    return a


def _check_labels(y: np.ndarray, n: int, n_classes: Optional[int]) -> np.ndarray:
    """The labels as an (n,) int array: integer class indices in ``[0, n_classes)``."""
    if y.ndim >= 1 and y.shape[0] != n:
        raise ShapeError(f"x has {n} examples but y has {y.shape[0]}: labels must have shape ({n},)")
    if y.ndim == 0 or y.size != n:
        raise ShapeError(f"labels (y) must have shape ({n},), one class index per example, got {y.shape}")
    y = y.reshape(n)
    if jnp.issubdtype(y.dtype, jnp.floating):
        if not np.all(np.isfinite(y) & (np.floor(y) == y)):
            bad = y[~(np.isfinite(y) & (np.floor(y) == y))][0]
            raise ArgTypeError(f"labels must be integer class indices, got dtype {y.dtype} holding {bad}")
    if y.size:
        lo, hi = y.min(), y.max()
        top = n_classes - 1 if n_classes is not None else None
        if lo < 0 or (top is not None and hi > top):
            raise RangeError(
                f"labels must lie in [0, {top if top is not None else 'n_classes - 1'}] "
                f"(the model has {n_classes} output classes); found {lo if lo < 0 else hi}"
            )
    return y.astype(np.int64)


def _as_output(y) -> tuple[jax.Array, Any]:
    if isinstance(y, QArray):
        return y.q.astype(jnp.int8), (y.scale, y.zero_point)
    return jnp.asarray(y), None


@functools.lru_cache(maxsize=32)
def _nnx_predict(graphdef) -> Callable:
    def fn(st, x):
        return _as_output(nnx.merge(graphdef, st)(x))

    return fn


_JITS: dict = {}


def _jitted(fn: Callable, mesh: Optional[Mesh], names: tuple) -> Callable:
    """One jitted (and, with a mesh, sharded) wrapper per (function, mesh, axes): repeated
    evaluations of the same model compile once."""
    key = (fn, mesh, names)
    if key not in _JITS:
        if mesh is None:
            _JITS[key] = jax.jit(fn)
        else:
            # outputs replicated: every process (multi-host: every host) reads all of them
            rep = NamedSharding(mesh, P())
            _JITS[key] = jax.jit(fn, in_shardings=(rep, NamedSharding(mesh, P(names))), out_shardings=rep)
        if len(_JITS) > 64:
            _JITS.pop(next(iter(_JITS)))
    return _JITS[key]


def _graph_predict(graph, x):
    """``(int8 outputs, (scale, zero_point))`` of a lowered graph on a batch."""
    from hwjax.graph import run

    q = graph.tensors[graph.outputs[0]].quant
    y = run(graph, x)
    return y.astype(jnp.int8), (jnp.asarray(q.scale, jnp.float32), jnp.asarray(q.zero_point, jnp.int32))


def hardware_graph(model, input_shape=None):
    """The lowered :class:`hwjax.graph.Graph` that computes a hardware-mode ``hwjax.nn``
    model's outputs bit for bit, or ``None`` when the model is not one
    (:func:`hwjax.nn.to_graph` + :func:`hwjax.graph.lower` on the layers' common target).

    Evaluating through it derives the layers' integer parameters once, on the host,
    instead of inside every compiled forward: the program that runs is the graph's
    (same integers; ``tests/test_graph.py`` checks graph against hardware mode).
    """
    from hwjax.graph import lower
    from hwjax.nn import GraphModel, HwLayer, Sequential, to_graph

    shape = getattr(model, "input_shape", None) or input_shape
    if not isinstance(model, (Sequential, GraphModel)) or not shape:
        return None
    layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, HwLayer)]
    targets = {m.target for m in layers}
    if not layers or len(targets) != 1 or any(m.mode != "hardware" for m in layers):
        return None
    if not all(m.is_calibrated() for m in layers):
        return None
    return jax.device_get(lower(to_graph(model, tuple(shape)), targets.pop()))


def _predict_fn(model, input_shape=None) -> tuple[Callable, Any]:
    """A pure ``fn(state, x) -> (outputs, qparams)`` and its state for ``model``."""
    if isinstance(model, nnx.Module):
        graph = hardware_graph(model, input_shape)
        if graph is not None:
            return _graph_predict, graph
        graphdef, state = nnx.split(model)
        return _nnx_predict(graphdef), state
    if hasattr(model, "apply") and hasattr(model, "state"):
        fn = getattr(model, "_hwjax_predict", None)
        if fn is None:

            def fn(st, x):
                return _as_output(model.apply(st, x))

            model._hwjax_predict = fn
        return fn, model.state()
    raise ArgTypeError(f"model must be a flax.nnx.Module or a hwjax.load() model, got {type(model).__name__}")


def evaluate(
    model, data, *, batch_size: int = 256, mesh: Optional[Mesh] = None, axis: Optional[str | tuple[str, ...]] = None
) -> EvalResult:
    """Runs ``model`` over ``data`` in jitted batches; optionally data-parallel over ``mesh``.

    Args:
      model: a ``flax.nnx`` model built from ``hwjax.nn`` layers (evaluated in the mode
        its layers are in; its state is not modified) or a model from :func:`hwjax.load`.
      data: inputs ``x`` (N, ...), a pair ``(x, y)`` or a dict with ``"x"`` and ``"y"``:
        ``y`` (the labels) holds one integer class index in ``[0, n_classes)`` per example
        (``n_classes`` = the size of the model's flattened output); integer-valued floats
        are accepted. Labels outside that range raise RangeError, non-integer labels
        ArgTypeError (a TypeError), a label count other than N ShapeError, all naming
        ``labels``. Float ``x`` must be finite (RangeError otherwise: the NaN rule).
      batch_size: examples per jitted call (>= 1); the last batch is padded with zeros
        and the padding dropped. With a mesh it is rounded up to a multiple of the
        number of devices the batch is split over.
      mesh: a ``jax.sharding.Mesh``; each batch is split over the mesh axes ``axis``
        (default: all of them) and the model state is replicated.
      axis: mesh axis name(s) to shard the batch over.

    Returns:
      :class:`EvalResult`. Integer results (hardware mode, loaded models) are
      bit-identical with and without a mesh and for every ``batch_size``: each example
      is computed independently and exactly.
    """
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise ArgTypeError(f"batch_size must be a positive int, got {batch_size!r}")
    if batch_size < 1:
        raise RangeError(f"batch_size must be a positive int, got {batch_size!r}")
    x, y = _split_data(data)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ShapeError(f"data must hold at least one example, got x of shape {x.shape}")
    if jnp.issubdtype(x.dtype, jnp.floating) and not np.all(np.isfinite(x)):
        raise RangeError(f"x must be finite (no NaN or Inf); found {x[~np.isfinite(x)].ravel()[0]}")
    if y is not None:
        _check_labels(y, x.shape[0], None)  # before the model runs; the class range after
    fn, state = _predict_fn(model, x.shape[1:])
    names: tuple = ()
    x_sharding = None
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise ArgTypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        names = tuple(mesh.axis_names) if axis is None else ((axis,) if isinstance(axis, str) else tuple(axis))
        bad = [a for a in names if a not in mesh.axis_names]
        if bad:
            raise ShapeError(f"axis {bad} not in mesh axes {mesh.axis_names}")
        n_dev = int(np.prod([mesh.shape[a] for a in names]))
        batch_size = -(-batch_size // n_dev) * n_dev
        x_sharding = NamedSharding(mesh, P(names))
        state = jax.device_put(state, NamedSharding(mesh, P()))
    jitted = _jitted(fn, mesh, names)
    n = x.shape[0]
    outs, qp = [], None
    for start in range(0, n, batch_size):
        xb = x[start : start + batch_size]
        pad = batch_size - xb.shape[0]
        if pad:
            xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], xb.dtype)])
        if x_sharding is not None:  # each process supplies its own devices' slices (multi-host safe)
            xb = jax.make_array_from_callback(xb.shape, x_sharding, xb.__getitem__)
        out, qp = jitted(state, xb)
        outs.append(np.asarray(out)[: batch_size - pad])
    outputs = np.concatenate(outs)
    preds = outputs.reshape(n, -1).argmax(axis=-1) if outputs.ndim > 1 else outputs
    acc = None
    if y is not None:
        y = _check_labels(y, n, outputs.reshape(n, -1).shape[1] if outputs.ndim > 1 else None)
        acc = float(np.mean(preds == y))
    scale = zp = None
    if qp is not None:
        scale, zp = float(np.asarray(qp[0])), int(np.asarray(qp[1]))
    return EvalResult(outputs, preds, acc, scale, zp)
