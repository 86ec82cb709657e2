"""Export a model graph in its target's memory formats, and load it back.

``export(model, path)`` lowers the model's graph (:func:`hwjax.nn.to_graph`,
:func:`hwjax.graph.lower`) and writes one binary blob per integer tensor (the bytes the
chip reads, little-endian, from each op's ``OpImpl.export``) and ``manifest.json``:
format and hwjax versions, the target, the graph (tensors with shape, dtype and
quantisation; nodes with op, inputs, outputs, attributes), each blob's size and
sha256, and a sha256 ``digest`` of the manifest itself.

``load(path)`` verifies all of that and returns a :class:`LoadedModel`, a thin wrapper
around the lowered :class:`hwjax.graph.Graph` (``.graph``) whose outputs equal the
Flax model's hardware-mode outputs bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, FormatError, RangeError, ShapeError
from hwjax.graph import Graph, Node, Quant, Tensor, jit_run, lower

FORMAT = "hwjax.export"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"


class ExportError(FormatError):
    """An export folder is missing, damaged, or does not describe a valid model."""


def _version() -> str:
    from hwjax._version import __version__

    return __version__


def _major_minor(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(v).split(".")[:2])
    except ValueError:
        raise ExportError(f"unreadable hwjax_version {v!r} in the manifest") from None


def manifest_digest(m: dict) -> str:
    """sha256 of the manifest without its ``digest`` entry (canonical JSON: sorted keys,
    no whitespace). A checksum against accidental or careless edits, not a signature."""
    body = {k: v for k, v in m.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------- JSON forms


def _json(v):
    """Attribute values to JSON (tuples become lists)."""
    if isinstance(v, (tuple, list)):
        return [_json(i) for i in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def _unjson(v):
    """JSON attribute values back to hashable attributes (lists become tuples)."""
    return tuple(_unjson(i) for i in v) if isinstance(v, list) else v


def _quant_json(q: Optional[Quant]) -> dict:
    if q is None:
        return {}
    scale, zp = np.asarray(q.scale, np.float32), np.asarray(q.zero_point, np.int32)
    # float32 values as the Python floats that hold them exactly (JSON round-trips them)
    out = {"scale": scale.tolist(), "zero_point": zp.tolist()}
    if q.axis is not None:
        out["axis"] = q.axis
    return out


def _write_blob(folder: Path, fname: str, arr: np.ndarray) -> dict[str, Any]:
    arr = np.ascontiguousarray(arr)
    data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    (folder / fname).write_bytes(data)
    return {
        "file": fname,
        "dtype": arr.dtype.name,
        "shape": list(arr.shape),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


# ============================================================================ export


def _check_finite_weights(model) -> None:
    """RangeError naming the layer and parameter when a trained parameter (``nnx.Param``:
    kernels, biases, learned scale factors) of ``model`` holds a NaN or an infinity."""
    from flax import nnx

    if not isinstance(model, nnx.Module):
        return
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        a = np.asarray(value.get_value() if hasattr(value, "get_value") else value)
        if V.is_float_dtype(a.dtype) and not np.all(np.isfinite(a)):
            raise RangeError(
                f"layer {_layer_name(model, path)}: parameter {path[-1]} holds non-finite values "
                f"(NaN or Inf); a model with non-finite weights cannot be exported"
            )


def _layer_name(model, path) -> str:
    """The graph node name (``block.body.dw``) of the layer owning the parameter at the NNX
    ``path`` (``('layers', 2, 'body', 'layers', 0, 'kernel')``); the dotted path if the
    model is not made of Sequential containers."""
    from hwjax.nn import Sequential

    obj, parts, i, inner = model, [], 0, tuple(path[:-1])
    try:
        while i < len(inner):
            if isinstance(obj, Sequential) and inner[i] == "layers" and i + 1 < len(inner):
                parts.append(obj.names[inner[i + 1]])
                obj, i = obj.layers[inner[i + 1]], i + 2
            else:
                parts.append(str(inner[i]))
                obj, i = getattr(obj, str(inner[i])), i + 1
    except (AttributeError, IndexError, KeyError, TypeError):
        parts = [str(p) for p in inner]
    return ".".join(parts) or "<root>"


def _check_finite_graph(graph: Graph) -> None:
    """RangeError naming the node (or tensor) when a float parameter or quantisation
    scale of the lowered graph is not finite."""
    for t in graph.tensors.values():
        if t.quant is not None and not np.all(np.isfinite(np.asarray(t.quant.scale, np.float64))):
            raise RangeError(
                f"tensor {t.name}: quantisation scale {np.asarray(t.quant.scale)} is not finite; it cannot be exported"
            )
    for n in graph.nodes:
        for path, leaf in jax.tree_util.tree_flatten_with_path(n.params)[0]:
            a = np.asarray(leaf)
            if V.is_float_dtype(a.dtype) and not np.all(np.isfinite(a)):
                raise RangeError(
                    f"layer {n.name}: parameter {jax.tree_util.keystr(path)} holds non-finite values "
                    f"(NaN or Inf); it cannot be exported"
                )


def _check_input_shape(input_shape) -> Optional[tuple[int, ...]]:
    if input_shape is None:
        return None
    if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__"):
        raise V.ArgTypeError(f"input_shape must be a tuple of positive ints, got {input_shape!r}")
    shape = tuple(input_shape)
    if not shape or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 1 for d in shape
    ):
        raise ShapeError(
            f"input_shape must be a non-empty tuple of positive ints (one example, no batch axis), got {input_shape!r}"
        )
    return tuple(int(d) for d in shape)


def _as_graph(model, input_shape, target) -> Graph:
    """The lowered graph of a ``hwjax.nn`` model or a graph."""
    from hwjax.nn import to_graph

    _check_finite_weights(model)
    graph = model if isinstance(model, Graph) else to_graph(model, _check_input_shape(input_shape))
    if target is None and graph.target is None:
        target = _model_target(model)
    graph = jax.device_get(lower(graph, target))
    if not isinstance(model, Graph):
        try:
            graph.validate()
        except FormatError as e:  # the layers do not fit input_shape
            raise ShapeError(
                f"input_shape {tuple(graph.tensors[graph.inputs[0]].shape)} does not fit the model: {e}"
            ) from None
    _check_finite_graph(graph)
    return graph


def _model_target(model):
    from flax import nnx

    from hwjax.nn import HwLayer

    found = {m.target for _, m in nnx.iter_modules(model) if isinstance(m, HwLayer)}
    if len(found) != 1:
        raise RangeError(f"pass target=: the model's layers use {len(found)} targets")
    return found.pop()


def _node_entry(graph: Graph, node: Node, folder: Path) -> dict[str, Any]:
    """The manifest entry of one node, writing its blobs (ValueError names the node)."""
    impl = graph.target.lowering(node.op)
    try:
        tensors, meta = impl.export(graph.target, node.attrs, node.params) if impl.export else ({}, {})
    except ValueError as e:
        raise RangeError(f"layer {node.name}: {e}") from None
    return {
        "name": node.name,
        "op": node.op,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "attrs": {k: _json(v) for k, v in node.attrs.items()},
        "meta": meta,
        "tensors": {role: _write_blob(folder, f"{node.name}.{role}.bin", arr) for role, arr in tensors.items()},
    }


def export(model, path, *, input_shape: Optional[tuple[int, ...]] = None, target=None) -> Path:
    """Writes the integer model of a calibrated hwjax model (or a graph) to the folder ``path``.

    Args:
      model: a calibrated ``hwjax.nn.Sequential`` (see :func:`hwjax.nn.to_graph`; the
        integers written are those its hardware mode runs, whatever mode it is in) or a
        :class:`hwjax.graph.Graph` (portable graphs need ``target``).
      path: output folder (created; existing export files are overwritten).
      input_shape: per-example input shape of a ``hwjax.nn`` model, e.g. ``(8, 8, 1)``;
        defaults to the model's ``input_shape`` attribute.
      target: the target to lower for (default: the model's layers' target).

    Returns:
      The folder path. Raises ValueError for uncalibrated layers, a shape the model cannot
      take (ShapeError), or parameters the target's memory format cannot hold; RangeError
      naming the layer and parameter for non-finite (NaN or Inf) weights, biases or scales:
      they cannot be exported.
    """
    graph = _as_graph(model, input_shape, target)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    nodes = [_node_entry(graph, n, folder) for n in graph.nodes]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "hwjax_version": _version(),
        "target": graph.target.describe(),
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "tensors": {
            t.name: {"shape": list(t.shape), "dtype": t.dtype, **_quant_json(t.quant)} for t in graph.tensors.values()
        },
        "nodes": nodes,
    }
    manifest["digest"] = manifest_digest(manifest)
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)
    return folder


# ============================================================================== load


class LoadedModel:
    """An integer-only model read by :func:`load`: a thin wrapper around its lowered graph.

    ``model(x)`` takes float inputs (quantised exactly as the Flax ``Quantize`` layer
    does; a NaN or Inf raises RangeError, under ``jit`` only in :func:`hwjax.checked`) or
    integer inputs holding int8 values (others raise RangeError), shape
    ``(batch, *input_shape)``, and returns the int8 outputs
    (int32 array), through :func:`hwjax.graph.jit_run`. ``model.apply(model.state(), x)``
    is the pure form used by :func:`hwjax.evaluate` (it returns a
    :class:`hwjax.nn.QArray`). Attributes: ``graph``, ``manifest``, ``target``,
    ``input_shape``, ``output_scale``, ``output_zero_point``.
    """

    def __init__(self, manifest: dict, graph: Graph):
        self.manifest = manifest
        self.graph = graph
        self.target = graph.target
        self.input_shape = tuple(graph.tensors[graph.inputs[0]].shape)
        out = graph.tensors[graph.outputs[0]].quant
        self.output_scale = float(np.asarray(out.scale))
        self.output_zero_point = int(np.asarray(out.zero_point))

    def state(self) -> Graph:
        """The pytree ``apply`` takes: the graph (integer parameters as leaves)."""
        return self.graph

    def apply(self, graph: Graph, x):
        from hwjax.nn import QArray

        x = V.as_array(x, "x")
        if x.shape[1:] != self.input_shape:
            raise ShapeError(f"input x must have shape (batch, {', '.join(map(str, self.input_shape))}), got {x.shape}")
        if V.kind(x, "x") == "float":
            V.check_finite(x, "x")  # the NaN rule (traced: under hwjax.checked)
        else:
            V.check_range(x, -128, 127, "x (int8 input)")
        y = jit_run(graph, x) if not isinstance(x, jax.core.Tracer) else _run(graph, x)
        q = graph.tensors[graph.outputs[0]].quant
        return QArray(y.astype(jnp.float32), jnp.asarray(q.scale, jnp.float32), jnp.asarray(q.zero_point, jnp.int32))

    def __call__(self, x) -> jax.Array:
        return self.apply(self.graph, x).q.astype(jnp.int32)


def _run(graph: Graph, x):
    from hwjax.graph import run

    return run(graph, x)


def _read_blob(folder: Path, node: str, role: str, spec: dict) -> np.ndarray:
    try:
        fname, dtype, shape, nbytes, digest = (
            spec["file"],
            np.dtype(spec["dtype"]),
            tuple(spec["shape"]),
            int(spec["bytes"]),
            spec["sha256"],
        )
    except (KeyError, TypeError) as e:
        raise ExportError(f"layer {node}: malformed tensor entry {role!r} in the manifest ({e})") from None
    if os.sep in fname or fname.startswith(".") or "/" in fname:
        raise ExportError(f"layer {node}: tensor file name {fname!r} must be a plain file name")
    f = folder / fname
    if not f.is_file():
        raise ExportError(f"layer {node}: tensor file {fname} is missing")
    data = f.read_bytes()
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise ExportError(
            f"layer {node}: {fname}: manifest says {nbytes} bytes but shape {list(shape)} of "
            f"{dtype.name} needs {expected}"
        )
    if len(data) != expected:
        raise ExportError(
            f"layer {node}: {fname} holds {len(data)} bytes, expected {expected} "
            f"({'truncated' if len(data) < expected else 'too long'})"
        )
    if hashlib.sha256(data).hexdigest() != digest:
        raise ExportError(f"layer {node}: {fname}: sha256 checksum mismatch (the file was modified)")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _read_manifest(folder: Path) -> dict:
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise ExportError(f"no {MANIFEST} in {folder} (not a hwjax export folder)")
    try:
        m = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{mpath} is not valid JSON: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ExportError(f"{mpath} is not a {FORMAT} manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise ExportError(
            f"export format version {m.get('format_version')!r} is not supported "
            f"(this hwjax reads version {FORMAT_VERSION})"
        )
    if m.get("digest") != manifest_digest(m):
        raise ExportError(f"{mpath}: digest mismatch (the manifest was modified after export)")
    if _major_minor(m.get("hwjax_version", "")) != _major_minor(_version()):
        raise ExportError(
            f"the export was written by hwjax {m.get('hwjax_version')}, this is hwjax {_version()}: "
            f"integer semantics are only guaranteed within one major.minor version"
        )
    return m


def _target_from(desc: Any):
    from hwjax import targets as T

    name = desc.get("name") if isinstance(desc, dict) else None
    if name not in T.available():
        raise ExportError(f"unknown target {name!r} in the manifest (known: {list(T.available())})")
    try:
        return T.resolve(desc)
    except (TypeError, ValueError) as e:
        raise ExportError(f"invalid target description {desc}: {e}") from None


def _tensor_from(name: str, spec: Any) -> Tensor:
    """A graph tensor from its manifest entry, range-checked (ExportError names it)."""
    from hwjax.graph import DTYPES

    try:
        shape, dtype = tuple(int(d) for d in spec["shape"]), spec["dtype"]
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"tensor {name!r}: malformed entry ({e})") from None
    if dtype not in DTYPES or min(shape, default=1) < 1:
        raise ExportError(f"tensor {name!r}: dtype {dtype!r} / shape {list(shape)} invalid")
    if "scale" not in spec:
        return Tensor(name, shape, dtype, None)
    scale, zp = np.asarray(spec["scale"], np.float64), np.asarray(spec["zero_point"])
    info = np.iinfo(dtype) if dtype != "float32" else np.iinfo(np.int32)
    if not (np.all(np.isfinite(scale)) and np.all(scale > 0) and np.all(scale < 3.4e38)):
        raise ExportError(f"tensor {name!r}: scale must be finite and > 0, got {spec['scale']}")
    if zp.dtype.kind not in "iu" or np.any(zp < info.min) or np.any(zp > info.max):
        raise ExportError(
            f"tensor {name!r}: zero_point must be an integer in [{info.min}, {info.max}], got {spec['zero_point']}"
        )
    return Tensor(name, shape, dtype, Quant.of(scale.astype(np.float32), zp.astype(np.int32), spec.get("axis")))


def _node_from(folder: Path, target, i: int, spec: Any) -> Node:
    from hwjax.graph import Attrs, get_op

    try:
        name, op = spec["name"], spec["op"]
        ins, outs = tuple(spec["inputs"]), tuple(spec["outputs"])
        attrs = Attrs({k: _unjson(v) for k, v in spec.get("attrs", {}).items()})
    except (KeyError, TypeError) as e:
        raise ExportError(f"node #{i}: malformed manifest entry ({e})") from None
    try:
        get_op(op)
        impl = target.lowering(op)
    except (KeyError, NotImplementedError) as e:
        raise ExportError(f"layer {name}: {e.args[0]}") from None
    tensors = {role: _read_blob(folder, name, role, t) for role, t in spec.get("tensors", {}).items()}
    try:
        params = impl.load(target, attrs, tensors, spec.get("meta", {})) if impl.load else None
    except (KeyError, ValueError, TypeError) as e:
        raise ExportError(f"layer {name}: {e}") from None
    return Node(op, ins, outs, attrs, params, name)


def load(path) -> LoadedModel:
    """Reads an :func:`export` folder and returns its integer-only :class:`LoadedModel`
    (``.graph`` is the lowered :class:`hwjax.graph.Graph`).

    Every check fails with :class:`ExportError` (a :class:`hwjax.errors.FormatError`,
    hence a ValueError) naming the problem: a missing folder, manifest or tensor file;
    an unreadable manifest; another format, format version or hwjax major.minor
    version; a manifest whose digest does not match its content; an unknown target or
    op; a scale that is not finite and positive or a zero point outside its dtype; a
    truncated, over-long or modified blob (byte count and sha256); a tensor or node
    that does not fit the graph (links, attributes, inferred shapes).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgTypeError(f"path must be a str or os.PathLike (an export folder), got {type(path).__name__}")
    folder = Path(path)
    m = _read_manifest(folder)
    target = _target_from(m.get("target"))
    try:
        tensors = {n: _tensor_from(n, t) for n, t in dict(m["tensors"]).items()}
        nodes = [_node_from(folder, target, i, s) for i, s in enumerate(list(m["nodes"]))]
        graph = Graph(tensors, tuple(nodes), tuple(m["inputs"]), tuple(m["outputs"]), target)
    except (KeyError, TypeError) as e:
        raise ExportError(f"malformed manifest: {e}") from None
    graph = _bind_quantize(graph)
    try:
        graph.validate()
    except FormatError as e:
        raise ExportError(str(e)) from None
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ExportError("an export has one input and one output")
    return LoadedModel(m, graph)


def _bind_quantize(graph: Graph) -> Graph:
    """Quantize nodes take their parameters from their output tensors' quantisation."""
    nodes = []
    for n in graph.nodes:
        if n.op == "quantize" and n.outputs and n.outputs[0] in graph.tensors:
            q = graph.tensors[n.outputs[0]].quant
            if q is None:
                raise ExportError(f"layer {n.name}: a quantize output needs a scale and zero point")
            n = n.replace(params={"scale": q.scale, "zero_point": q.zero_point})
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes))
