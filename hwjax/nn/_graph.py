"""Containers: :class:`Sequential` (named layers in order) and :class:`Residual`.

They thread ``return_stats`` through their layers and define the layer graph that
:func:`hwjax.export` writes.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

from flax import nnx

from hwjax.errors import ArgTypeError, RangeError, ShapeError, UnsupportedOpError
from hwjax.nn._base import HwLayer, check_mode
from hwjax.nn._layers import Add, planned

Node = Union[HwLayer, "Sequential", "Residual"]


class Sequential(nnx.Module):
    """Named layers applied in order: ``Sequential({"conv1": Conv(...), ...})`` or a list.

    ``__call__(x, return_stats=False)``; with ``return_stats=True`` returns
    ``(y, stats)`` where ``stats`` maps each layer's (dotted) name to its
    :class:`hwjax.nn.LayerStats`.
    """

    def __init__(self, layers: Union[Mapping[str, Node], Sequence[Node]]):
        items = (
            list(layers.items())
            if isinstance(layers, Mapping)
            else [(f"{type(l).__name__.lower()}{i}", l) for i, l in enumerate(layers)]
        )
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            raise RangeError(f"layer names must be unique, got {names}")
        for n, l in items:
            if not isinstance(n, str) or not n.isidentifier():
                raise RangeError(f"layer name {n!r} must be a Python identifier")
            if not isinstance(l, (HwLayer, Sequential, Residual)):
                raise ArgTypeError(f"layer {n!r} must be a hwjax.nn layer or container, got {type(l).__name__}")
        self.names = tuple(names)
        self.layers = nnx.List([l for _, l in items])

    def named_layers(self):
        return zip(self.names, self.layers)

    def emit(self, graph_nodes: list, tensors: dict, prefix: str, name: str, inputs: list):
        cur = inputs[0]
        inner = f"{prefix}{name}." if name else prefix
        for child_name, child in self.named_layers():
            cur = child.emit(graph_nodes, tensors, inner, child_name, [cur])
        return cur

    def __call__(self, x, *, return_stats: bool = False):
        return planned(self, lambda: self._call(x, False), lambda: self._call(x, return_stats))

    def _call(self, x, return_stats: bool):
        stats = {}
        for name, layer in self.named_layers():
            if return_stats:
                x, s = layer(x, return_stats=True)
                if isinstance(s, dict):
                    stats.update({f"{name}.{k}": v for k, v in s.items()})
                else:
                    stats[name] = s
            else:
                x = layer(x)
        return (x, stats) if return_stats else x


class Residual(nnx.Module):
    """``add(x, body(x))``: a residual block; ``add`` is a :class:`hwjax.nn.Add`."""

    def __init__(self, body: Sequential, add: Add):
        if not isinstance(body, Sequential):
            raise ArgTypeError(f"body must be a hwjax.nn.Sequential, got {type(body).__name__}")
        if not isinstance(add, Add):
            raise ArgTypeError(f"add must be a hwjax.nn.Add, got {type(add).__name__}")
        self.body = body
        self.add = add

    def emit(self, graph_nodes: list, tensors: dict, prefix: str, name: str, inputs: list):
        body_out = self.body.emit(graph_nodes, tensors, f"{prefix}{name}.", "body", inputs)
        return self.add.emit(graph_nodes, tensors, f"{prefix}{name}.", "add", [inputs[0], body_out])

    def __call__(self, x, *, return_stats: bool = False):
        if not return_stats:
            return self.add(x, self.body(x))
        y, stats = self.body(x, return_stats=True)
        out, s = self.add(x, y, return_stats=True)
        return out, {**{f"body.{k}": v for k, v in stats.items()}, "add": s}


class GraphModel(nnx.Module):
    """NNX modules wired as a :class:`hwjax.graph.Graph`: one hwjax layer per node, run in
    the graph's order over its named tensors (built by :func:`from_graph`).

    ``__call__(*xs, return_stats=False)`` takes the graph inputs (float arrays for
    ``quantize`` inputs) with a leading batch axis and returns the output (a tuple for
    several), like :class:`Sequential`; ``stats`` are keyed by node name.
    """

    def __init__(self, graph, target):
        self.graph_inputs = tuple(graph.inputs)
        self.graph_outputs = tuple(graph.outputs)
        # shapes only: a Tensor's Quant holds arrays, which nnx keeps out of static attributes
        self.input_shapes = tuple(tuple(graph.tensors[t].shape) for t in graph.inputs)
        self.wiring = tuple((n.name, n.inputs, n.outputs) for n in graph.nodes)
        layers = []
        for n in graph.nodes:
            cls = HwLayer.LAYERS.get(n.op)
            if cls is None:
                raise UnsupportedOpError(
                    f"node {n.name!r}: no hwjax.nn layer runs op {n.op!r} (layers exist for {sorted(HwLayer.LAYERS)})"
                )
            layers.append(cls.from_node(n, [graph.tensors[t] for t in n.inputs], graph.tensors[n.outputs[0]], target))
        self.layers = nnx.List(layers)

    @property
    def input_shape(self):
        return self.input_shapes[0]

    def __call__(self, *xs, return_stats: bool = False):
        return planned(self, lambda: self._call(xs, False), lambda: self._call(xs, return_stats))

    def _call(self, xs, return_stats: bool):
        env = dict(zip(self.graph_inputs, xs))
        stats = {}
        for (name, ins, outs), layer in zip(self.wiring, self.layers):
            y = layer(*[env[t] for t in ins], return_stats=return_stats)
            if return_stats:
                y, stats[name] = y
            env[outs[0]] = y
        out = tuple(env[t] for t in self.graph_outputs)
        out = out[0] if len(out) == 1 else out
        return (out, stats) if return_stats else out

    def emit(self, graph_nodes: list, tensors: dict, prefix: str, name: str, inputs: list):
        env = dict(zip(self.graph_inputs, inputs))
        for (node_name, ins, outs), layer in zip(self.wiring, self.layers):
            env[outs[0]] = layer.emit(graph_nodes, tensors, prefix, node_name, [env[t] for t in ins])
        return env[self.graph_outputs[0]]


def from_graph(graph, target=None, *, mode: str = "hardware") -> GraphModel:
    """NNX modules initialised from a portable graph's integer parameters, e.g. to
    fine-tune an imported model with optax.

    Every node becomes the ``hwjax.nn`` layer of its op kind (:attr:`HwLayer.LAYERS`),
    built by its ``from_node``: linear layers get float weights ``kernel * w_scale`` and
    biases ``bias * s_in * w_scale`` with the weight scales pinned, and every requantising
    layer pins its output quantisation to the node's output tensor. So in ``"hardware"``
    mode (the default) the model runs the graph's integers exactly, bit for bit what
    :func:`hwjax.graph.run` gives on ``target``, and trains through the layers'
    surrogates. Single-input, single-output graphs whose ops all have layers.

    Args:
      graph: a portable :class:`hwjax.graph.Graph` (``graph.target is None``).
      target: the target to run on (a Target or registered name; required).
      mode: the layers' mode.
    """
    from hwjax.graph import Graph
    from hwjax.targets import resolve

    if not isinstance(graph, Graph):
        raise ArgTypeError(
            f"graph must be a hwjax.graph.Graph (e.g. hwjax.nn.to_graph(model) or "
            f"hwjax.tflite.load(path).graph), got {type(graph).__name__}"
        )
    if graph.target is not None:
        raise RangeError(
            "from_graph needs a portable graph (its target's integer parameters cannot be turned back "
            "into float weights); lowered graphs come from hwjax.load"
        )
    if target is None:
        raise ArgTypeError("from_graph needs the target to run the layers on (a Target or a registered name)")
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise UnsupportedOpError(
            f"from_graph supports one input and one output, got {len(graph.inputs)} and {len(graph.outputs)}"
        )
    model = GraphModel(graph.validate(), resolve(target))
    check_mode(mode)
    for _, m in nnx.iter_modules(model):
        if isinstance(m, HwLayer):
            m.mode = mode
    return model


INPUT = "float_input"


def to_graph(model, input_shape=None):
    """The portable :class:`hwjax.graph.Graph` of a calibrated ``hwjax.nn`` model.

    Args:
      model: a :class:`Sequential` (possibly nested, with :class:`Residual` blocks) of
        calibrated layers whose first layer is a ``Quantize``.
      input_shape: per-example input shape, e.g. ``(8, 8, 1)``; defaults to the model's
        ``input_shape`` attribute.

    Returns:
      A graph with one float32 input tensor ``"float_input"``, one node per layer (named
      by its dotted path, e.g. ``"block.body.conv"``; a :class:`GraphModel`'s graph keeps
      the node and tensor names of the graph it was built from), int8 tensors with the calibrated
      quantisation, and the layers' portable integer parameters: what hardware mode runs
      once :func:`hwjax.graph.lower` applies the target's recipe, bit for bit.
    """
    from hwjax.graph import Graph, Tensor

    if not isinstance(model, (Sequential, GraphModel)):
        raise ArgTypeError(f"model: to_graph needs a hwjax.nn.Sequential or GraphModel, got {type(model).__name__}")
    shape = tuple(input_shape if input_shape is not None else getattr(model, "input_shape", ()) or ())
    if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
        raise RangeError(
            f"input_shape must be a non-empty tuple of positive ints (the model has no "
            f"input_shape attribute), got {input_shape!r}"
        )
    layers = [(p, m) for p, m in nnx.iter_modules(model) if isinstance(m, HwLayer)]
    bad = ["/".join(map(str, p)) for p, m in layers if not m.is_calibrated()]
    if bad:
        raise RangeError(f"layers {bad} are not calibrated (run the model in 'calibrate' mode first)")
    first = next(iter(model.layers), None)  # (a GraphModel's first node)
    if getattr(first, "kind", None) != "quantize":
        raise RangeError("the model's first layer must be a hwjax.nn.Quantize")
    targets = {m.target for _, m in layers}
    if len(targets) != 1:
        raise ShapeError(f"the model's layers use several targets {sorted(map(repr, targets))}; use one")
    nodes: list = []
    name = model.graph_inputs[0] if isinstance(model, GraphModel) else INPUT
    tensors = {name: Tensor(name, shape, "float32", None)}
    out = model.emit(nodes, tensors, "", "", [tensors[name]])
    if len(tensors) != len(nodes) + 1:
        raise RangeError(f"layer names collide with the graph input name {name!r}")
    graph = Graph(tensors, tuple(nodes), (name,), (out.name,))
    if isinstance(model, GraphModel):  # the imported graph's tensor names (nodes keep theirs)
        graph = _renamed(graph, {n.outputs[0]: w[2][0] for n, w in zip(nodes, model.wiring)})
    return graph.validate()


def _renamed(graph, names: dict):
    """``graph`` with its tensors renamed by ``names`` (old -> new; a one-to-one map onto
    names the graph does not otherwise use)."""
    from dataclasses import replace

    def r(t: str) -> str:
        return names.get(t, t)

    return replace(
        graph,
        tensors={r(k): replace(t, name=r(k)) for k, t in graph.tensors.items()},
        nodes=tuple(replace(n, inputs=tuple(map(r, n.inputs)), outputs=tuple(map(r, n.outputs))) for n in graph.nodes),
        inputs=tuple(map(r, graph.inputs)),
        outputs=tuple(map(r, graph.outputs)),
    )
