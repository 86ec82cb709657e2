"""Export a hardware-mode model to the target's memory formats, and load it back.

``export(model, path)`` writes one binary blob per integer tensor (the bytes the chip
reads, little-endian) and ``manifest.json``: format and hwjax versions, the target
and its variant, the layer graph (each layer's kind, inputs, configuration and
shapes), every scale and zero point, and the size and sha256 of every blob.

``load(path)`` verifies all of that and returns a :class:`LoadedModel`: an
integer-only model that runs the same target kernels on the loaded integers, so its
outputs equal the Flax model's hardware-mode outputs bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "hwjax.export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class ExportError(ValueError):
    """An export folder is missing, damaged, or does not describe a valid model."""


def _version() -> str:
    from hwjax import __version__

    return __version__


def _major_minor(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(v).split(".")[:2])
    except ValueError:
        raise ExportError(f"unreadable hwjax_version {v!r} in the manifest") from None


def _f32(v) -> float:
    """A float32 value as the Python float that holds it exactly (JSON round-trips it)."""
    return float(np.float32(np.asarray(v)))


# ============================================================================ export


def _layer_walk(model) -> list[tuple[str, Any, list[str]]]:
    """(name, layer, input names) in execution order; input "" is the model input."""
    from hwjax.nn._graph import Residual, Sequential

    out: list[tuple[str, Any, list[str]]] = []

    def walk_seq(seq, prefix: str, inp: str) -> str:
        cur = inp
        for name, child in seq.named_layers():
            full = f"{prefix}{name}"
            if isinstance(child, Sequential):
                cur = walk_seq(child, full + ".", cur)
            elif isinstance(child, Residual):
                body_out = walk_seq(child.body, full + ".body.", cur)
                out.append((full + ".add", child.add, [cur, body_out]))
                cur = full + ".add"
            else:
                out.append((full, child, [cur]))
                cur = full
        return cur

    if not isinstance(model, Sequential):
        raise TypeError(f"export needs a hwjax.nn.Sequential model, got {type(model).__name__}")
    walk_seq(model, "", "")
    return out


def _write_blob(folder: Path, fname: str, arr: np.ndarray) -> dict[str, Any]:
    arr = np.ascontiguousarray(arr)
    data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    (folder / fname).write_bytes(data)
    return {"file": fname, "dtype": arr.dtype.name, "shape": list(arr.shape), "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def export(model, path, *, input_shape: Optional[tuple[int, ...]] = None) -> Path:
    """Writes the integer model of a calibrated hwjax model to the folder ``path``.

    Args:
      model: a ``hwjax.nn.Sequential`` (possibly nested, with ``Residual`` blocks)
        whose first layer is a ``Quantize``; every layer must be calibrated. The
        integers written are those its hardware mode runs (the mode it is in does not
        matter).
      path: output folder (created; existing export files are overwritten).
      input_shape: per-example input shape, e.g. ``(8, 8, 1)``; defaults to the
        model's ``input_shape`` attribute.

    Returns:
      The folder path. Raises ValueError for uncalibrated layers or parameters the
      target's memory format cannot hold.
    """
    from hwjax.nn import _layers as L
    from hwjax.nn._base import HwLayer
    from hwjax.targets import ConvGeometry

    shape = tuple(input_shape if input_shape is not None else getattr(model, "input_shape", ()) or ())
    if not shape:
        raise ValueError("input_shape is required (the model has no input_shape attribute)")
    walk = _layer_walk(model)
    bad = [n for n, l, _ in walk if isinstance(l, HwLayer) and not l.is_calibrated()]
    if bad:
        raise ValueError(f"cannot export: layers {bad} are not calibrated")
    if not walk or not isinstance(walk[0][1], L.Quantize):
        raise ValueError("the model's first layer must be a hwjax.nn.Quantize")
    targets = {l.target for _, l, _ in walk}
    if len(targets) != 1:
        raise ValueError(f"export needs one target for the whole model, got {sorted(map(repr, targets))}")
    target = targets.pop()
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, dict[str, Any]] = {}  # name -> {"shape", "scale", "zero_point"}
    layers = []
    for name, layer, inputs in walk:
        src = [info[i] if i else None for i in inputs]
        node: dict[str, Any] = {"name": name, "kind": layer.kind, "inputs": [i or "input" for i in inputs]}
        tensors: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {}
        if isinstance(layer, L.Quantize):
            s, z = layer.out_qparams()
            out = {"shape": list(shape), "scale": _f32(s), "zero_point": int(z)}
        elif isinstance(layer, L.Flatten):
            out = {**src[0], "shape": [math.prod(src[0]["shape"])]}
        elif isinstance(layer, L._Linear):
            in_shape = src[0]["shape"]
            if isinstance(layer, L.Dense):
                if len(in_shape) != 1:
                    raise ValueError(f"layer {name}: Dense needs a flat input, got shape {in_shape}")
                hw_in = (1, 1)
            else:
                hw_in = tuple(in_shape[:2])
            geom = ConvGeometry.make(hw_in, tuple(layer.kernel.shape[:2]), layer.strides, layer.padding)
            hw = layer.integer_params(jnp.float32(src[0]["scale"]), jnp.int32(src[0]["zero_point"]), geom)
            try:
                tensors, meta = target.export_tensors(layer.kind, hw.params)
            except ValueError as e:
                raise ValueError(f"layer {name}: {e}") from None
            c_out = int(layer.kernel.shape[-1])
            out_shape = [c_out] if isinstance(layer, L.Dense) else [*geom.out_hw, c_out]
            out = {"shape": out_shape, "scale": _f32(hw.s_out), "zero_point": int(hw.z_out)}
            node["config"] = {"kernel": list(geom.kernel), "stride": list(geom.stride),
                              "padding": [list(p) for p in geom.padding], "activation": layer.activation}
            node["weight_scales"] = [_f32(v) for v in np.asarray(hw.s_w)]
        elif isinstance(layer, (L.MaxPool, L.AvgPool)):
            h, w, c = src[0]["shape"]
            (kh, kw), (sh, sw) = layer.window, layer.strides
            out = {**src[0], "shape": [(h - kh) // sh + 1, (w - kw) // sw + 1, c]}
            node["config"] = {"window": [kh, kw], "strides": [sh, sw]}
        elif isinstance(layer, L.Add):
            if src[0]["shape"] != src[1]["shape"]:
                raise ValueError(f"layer {name}: inputs have shapes {src[0]['shape']} and {src[1]['shape']}")
            s, z = layer.out_qparams()
            params = target.add_params(s1=jnp.float32(src[0]["scale"]), z1=jnp.int32(src[0]["zero_point"]),
                                       s2=jnp.float32(src[1]["scale"]), z2=jnp.int32(src[1]["zero_point"]),
                                       s_out=s, z_out=z, relu=layer.activation == "relu")
            tensors, meta = target.export_tensors("add", params)
            out = {"shape": src[0]["shape"], "scale": _f32(s), "zero_point": int(z)}
            node["config"] = {"activation": layer.activation}
        elif isinstance(layer, L.LutActivation):
            s, z = layer.out_qparams()
            params = target.lut_params(layer.fn, s_in=jnp.float32(src[0]["scale"]),
                                       z_in=jnp.int32(src[0]["zero_point"]), s_out=s, z_out=z)
            tensors, meta = target.export_tensors("lut", params)
            out = {"shape": src[0]["shape"], "scale": _f32(s), "zero_point": int(z)}
            node["config"] = {"fn": layer.fn}
        else:
            raise TypeError(f"layer {name}: cannot export a {type(layer).__name__}")
        node["meta"] = meta
        node["output"] = out
        node["tensors"] = {role: _write_blob(folder, f"{name}.{role}.bin", arr) for role, arr in tensors.items()}
        info[name] = out
        layers.append(node)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "hwjax_version": _version(),
        "target": target.describe(),
        "input": {"shape": list(shape), "dtype": "float32 or int8", "scale": info[walk[0][0]]["scale"],
                  "zero_point": info[walk[0][0]]["zero_point"]},
        "output": walk[-1][0],
        "layers": layers,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)
    return folder


# ============================================================================== load


@jax.tree_util.register_pytree_node_class
@dataclass
class _Node:
    name: str
    kind: str
    inputs: tuple[str, ...]
    config: dict
    params: Any
    out: dict

    def tree_flatten(self):
        return (self.params,), (self.name, self.kind, self.inputs, json.dumps(self.config), json.dumps(self.out))

    @classmethod
    def tree_unflatten(cls, aux, children):
        name, kind, inputs, config, out = aux
        return cls(name, kind, inputs, json.loads(config), children[0], json.loads(out))


class LoadedModel:
    """An integer-only model read by :func:`load`.

    ``model(x)`` takes float inputs (quantised exactly as the Flax ``Quantize`` layer
    does) or int8 inputs, shape ``(batch, *input_shape)``, and returns the int8
    outputs (int32 array). ``model.apply(model.state(), x)`` is the pure, jittable
    form used by :func:`hwjax.evaluate` (it returns a :class:`hwjax.nn.QArray`).
    Attributes: ``manifest``, ``target``, ``input_shape``, ``output_scale``,
    ``output_zero_point``.
    """

    def __init__(self, manifest: dict, target, nodes: list[_Node]):
        self.manifest = manifest
        self.target = target
        self._nodes = nodes
        self.input_shape = tuple(manifest["input"]["shape"])
        out = nodes[-1].out
        self.output_scale, self.output_zero_point = out["scale"], out["zero_point"]

    def state(self) -> tuple[list[_Node], jax.Array]:
        """The pytree ``apply`` takes: the nodes (integer parameters as leaves) and a
        runtime scalar used by :func:`hwjax.nn._quant.compute_once`."""
        return self._nodes, jnp.int32(0)

    def apply(self, state, x):
        from hwjax.nn._qarray import QArray
        from hwjax.nn._quant import act_int, compute_once
        from hwjax.targets import ConvGeometry

        nodes, trigger = state
        t = self.target
        x = jnp.asarray(x)
        if x.shape[1:] != self.input_shape:
            raise ValueError(f"input must have shape (batch, {', '.join(map(str, self.input_shape))}), got {x.shape}")
        vals: dict[str, jax.Array] = {}
        for node in nodes:
            src = [vals.get(i) for i in node.inputs]
            cfg, k = node.config, node.kind
            if k == "quantize":
                if jnp.issubdtype(x.dtype, jnp.integer):
                    y = x.astype(jnp.int32)
                else:
                    y = act_int(x.astype(jnp.float32), jnp.float32(node.out["scale"]),
                                jnp.int32(node.out["zero_point"])).astype(jnp.int32)
            elif k == "flatten":
                y = src[0].reshape(src[0].shape[0], -1)
            elif k in ("conv", "dense", "depthwise_conv"):
                v = src[0][:, None, None, :] if k == "dense" else src[0]
                geom = ConvGeometry(tuple(v.shape[1:3]), tuple(cfg["kernel"]), tuple(cfg["stride"]),
                                    tuple(tuple(p) for p in cfg["padding"]))
                run = t.depthwise if k == "depthwise_conv" else t.conv
                y = run(v.astype(jnp.int8), node.params, geom)[0]
                y = y[:, 0, 0, :] if k == "dense" else y
            elif k == "maxpool":
                y = t.maxpool(src[0].astype(jnp.int8), tuple(cfg["window"]), tuple(cfg["strides"]))
            elif k == "avgpool":
                y = t.avgpool(src[0].astype(jnp.int8), tuple(cfg["window"]), tuple(cfg["strides"]))
            elif k == "add":
                y = t.add(src[0].astype(jnp.int8), src[1].astype(jnp.int8), node.params)
            elif k == "lut":
                y = t.lut(src[0].astype(jnp.int8), node.params)
            else:  # pragma: no cover - rejected by load()
                raise ValueError(f"unknown layer kind {k!r}")
            # each layer's result is materialised once (see compute_once): no re-fusion
            vals[node.name] = compute_once(lambda v: v.astype(jnp.int32), (y,), trigger)
        out = nodes[-1]
        return QArray(vals[out.name].astype(jnp.float32), jnp.float32(out.out["scale"]),
                      jnp.int32(out.out["zero_point"]))

    def __call__(self, x) -> jax.Array:
        return self.apply(self.state(), x).q.astype(jnp.int32)


_KINDS = {"quantize", "flatten", "conv", "dense", "depthwise_conv", "maxpool", "avgpool", "add", "lut"}


def _read_blob(folder: Path, layer: str, role: str, spec: dict) -> np.ndarray:
    try:
        fname, dtype, shape, nbytes, digest = (spec["file"], np.dtype(spec["dtype"]), tuple(spec["shape"]),
                                               int(spec["bytes"]), spec["sha256"])
    except (KeyError, TypeError) as e:
        raise ExportError(f"layer {layer}: malformed tensor entry {role!r} in the manifest ({e})") from None
    if os.sep in fname or fname.startswith(".") or "/" in fname:
        raise ExportError(f"layer {layer}: tensor file name {fname!r} must be a plain file name")
    f = folder / fname
    if not f.is_file():
        raise ExportError(f"layer {layer}: tensor file {fname} is missing")
    data = f.read_bytes()
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise ExportError(f"layer {layer}: {fname}: manifest says {nbytes} bytes but shape {list(shape)} of "
                          f"{dtype.name} needs {expected}")
    if len(data) != expected:
        raise ExportError(f"layer {layer}: {fname} holds {len(data)} bytes, expected {expected} "
                          f"({'truncated' if len(data) < expected else 'too long'})")
    if hashlib.sha256(data).hexdigest() != digest:
        raise ExportError(f"layer {layer}: {fname}: sha256 checksum mismatch (the file was modified)")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _target_from(desc: dict):
    from hwjax import targets as T

    classes = {c.name: c for c in (T.XS3, getattr(T, "XS3Legacy", None), getattr(T, "NVDLA", None)) if c}
    name = desc.get("name") if isinstance(desc, dict) else None
    if name not in classes:
        raise ExportError(f"unknown target {name!r} in the manifest (known: {sorted(classes)})")
    kwargs = {k: v for k, v in desc.items() if k != "name"}
    try:
        return classes[name](**kwargs)
    except (TypeError, ValueError) as e:
        raise ExportError(f"invalid target description {desc}: {e}") from None


def _expect_shape(layer: str, what: str, got, want) -> None:
    if list(got) != list(want):
        raise ExportError(f"layer {layer}: {what} has shape {list(got)}, expected {list(want)}")


def load(path) -> LoadedModel:
    """Reads an :func:`export` folder and returns its integer-only :class:`LoadedModel`.

    Every check fails with :class:`ExportError` (a ValueError) naming the problem: a
    missing folder, manifest or tensor file; an unreadable manifest; another format,
    format version or hwjax major.minor version; an unknown target or layer kind; a
    truncated, over-long or modified file (byte count and sha256 are checked); a
    tensor or layer shape that does not fit the layer graph.
    """
    folder = Path(path)
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
        raise ExportError(f"export format version {m.get('format_version')!r} is not supported "
                          f"(this hwjax reads version {FORMAT_VERSION})")
    if _major_minor(m.get("hwjax_version", "")) != _major_minor(_version()):
        raise ExportError(f"the export was written by hwjax {m.get('hwjax_version')}, this is hwjax {_version()}: "
                          f"integer semantics are only guaranteed within one major.minor version")
    target = _target_from(m.get("target"))
    nodes: list[_Node] = []
    shapes: dict[str, list] = {}
    try:
        layer_list = list(m["layers"])
        in_shape = list(m["input"]["shape"])
    except (KeyError, TypeError) as e:
        raise ExportError(f"malformed manifest: {e}") from None
    for i, spec in enumerate(layer_list):
        try:
            name, kind, inputs, out = spec["name"], spec["kind"], list(spec["inputs"]), spec["output"]
            out_shape = list(out["shape"])
        except (KeyError, TypeError) as e:
            raise ExportError(f"layer #{i}: malformed manifest entry ({e})") from None
        if kind not in _KINDS:
            raise ExportError(f"layer {name}: unknown layer kind {kind!r}")
        if i == 0 and kind != "quantize":
            raise ExportError("the first layer must be a quantize layer")
        srcs = []
        for inp in inputs:
            if inp == "input" and i == 0:
                srcs.append(in_shape)
            elif inp in shapes:
                srcs.append(shapes[inp])
            else:
                raise ExportError(f"layer {name}: input {inp!r} is not an earlier layer")
        tensors = {role: _read_blob(folder, name, role, t) for role, t in spec.get("tensors", {}).items()}
        cfg = spec.get("config", {})
        meta = spec.get("meta", {})
        try:
            params = target.import_tensors(kind, tensors, meta) if tensors else None
        except (KeyError, ValueError) as e:
            raise ExportError(f"layer {name}: {e}") from None
        _check_layer_shapes(name, kind, srcs, out_shape, cfg, meta, params, tensors)
        nodes.append(_Node(name, kind, tuple(inputs), cfg, params, out))
        shapes[name] = out_shape
    if not nodes or m.get("output") != nodes[-1].name:
        raise ExportError(f"manifest output {m.get('output')!r} is not the last layer")
    return LoadedModel(m, target, nodes)


def _check_layer_shapes(name, kind, srcs, out_shape, cfg, meta, params, tensors) -> None:
    """Shape consistency of one layer against its inputs and tensors (ExportError)."""
    need = {"conv": 2, "dense": 2, "depthwise_conv": 2, "add": 1, "lut": 1}.get(kind, 0)
    if len(tensors) < need:
        raise ExportError(f"layer {name}: expected {need} tensors, found {sorted(tensors)}")
    n_in = 2 if kind == "add" else 1
    if len(srcs) != n_in:
        raise ExportError(f"layer {name}: a {kind} layer takes {n_in} inputs, got {len(srcs)}")
    src = srcs[0]
    if kind == "quantize":
        _expect_shape(name, "output", out_shape, src)
    elif kind == "flatten":
        _expect_shape(name, "output", out_shape, [math.prod(src)])
    elif kind in ("conv", "dense", "depthwise_conv"):
        kshape = list(meta.get("kernel_shape", []))
        c_in = src[-1]
        if kind == "depthwise_conv":
            _expect_shape(name, "kernel", [kshape[0]] if kshape else [], [c_in])
        elif len(kshape) != 4 or kshape[3] != c_in:
            raise ExportError(f"layer {name}: kernel shape {kshape} does not take {c_in} input channels")
        if kind == "dense":
            if len(src) != 1 or kshape[1:3] != [1, 1]:
                raise ExportError(f"layer {name}: dense input {src} / kernel {kshape} are inconsistent")
            _expect_shape(name, "output", out_shape, [kshape[0]])
        else:
            if len(src) != 3:
                raise ExportError(f"layer {name}: input shape {src} is not (H, W, C)")
            from hwjax.targets import ConvGeometry

            try:
                geom = ConvGeometry(tuple(src[:2]), tuple(cfg["kernel"]), tuple(cfg["stride"]),
                                    tuple(tuple(p) for p in cfg["padding"]))
            except (KeyError, TypeError) as e:
                raise ExportError(f"layer {name}: malformed geometry ({e})") from None
            if list(geom.kernel) != list(kshape[1:3]):
                raise ExportError(f"layer {name}: kernel {kshape} does not match the window {cfg['kernel']}")
            _expect_shape(name, "output", out_shape, [*geom.out_hw, kshape[0]])
    elif kind in ("maxpool", "avgpool"):
        (kh, kw), (sh, sw) = cfg["window"], cfg["strides"]
        _expect_shape(name, "output", out_shape, [(src[0] - kh) // sh + 1, (src[1] - kw) // sw + 1, src[2]])
    elif kind == "add":
        _expect_shape(name, "second input", srcs[1], src)
        _expect_shape(name, "output", out_shape, src)
    elif kind == "lut":
        _expect_shape(name, "output", out_shape, src)
