"""Containers: :class:`Sequential` (named layers in order) and :class:`Residual`.

They thread ``return_stats`` through their layers and define the layer graph that
:func:`hwjax.export` writes.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

from flax import nnx

from hwjax.nn._base import HwLayer
from hwjax.nn._layers import Add

Node = Union[HwLayer, "Sequential", "Residual"]


class Sequential(nnx.Module):
    """Named layers applied in order: ``Sequential({"conv1": Conv(...), ...})`` or a list.

    ``__call__(x, return_stats=False)``; with ``return_stats=True`` returns
    ``(y, stats)`` where ``stats`` maps each layer's (dotted) name to its
    :class:`hwjax.nn.LayerStats`.
    """

    def __init__(self, layers: Union[Mapping[str, Node], Sequence[Node]]):
        items = list(layers.items()) if isinstance(layers, Mapping) else \
            [(f"{type(l).__name__.lower()}{i}", l) for i, l in enumerate(layers)]
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"layer names must be unique, got {names}")
        for n, l in items:
            if not isinstance(n, str) or not n.isidentifier():
                raise ValueError(f"layer name {n!r} must be a Python identifier")
            if not isinstance(l, (HwLayer, Sequential, Residual)):
                raise TypeError(f"layer {n!r} must be a hwjax.nn layer or container, got {type(l).__name__}")
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
            raise TypeError(f"body must be a hwjax.nn.Sequential, got {type(body).__name__}")
        if not isinstance(add, Add):
            raise TypeError(f"add must be a hwjax.nn.Add, got {type(add).__name__}")
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
      by its dotted path, e.g. ``"block.body.conv"``), int8 tensors with the calibrated
      quantisation, and the layers' portable integer parameters: what hardware mode runs
      once :func:`hwjax.graph.lower` applies the target's recipe, bit for bit.
    """
    from hwjax.graph import Graph, Tensor

    if not isinstance(model, Sequential):
        raise TypeError(f"to_graph needs a hwjax.nn.Sequential model, got {type(model).__name__}")
    shape = tuple(input_shape if input_shape is not None else getattr(model, "input_shape", ()) or ())
    if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints (the model has no "
                         f"input_shape attribute), got {input_shape!r}")
    layers = [(p, m) for p, m in nnx.iter_modules(model) if isinstance(m, HwLayer)]
    bad = ["/".join(map(str, p)) for p, m in layers if not m.is_calibrated()]
    if bad:
        raise ValueError(f"layers {bad} are not calibrated (run the model in 'calibrate' mode first)")
    first = next(iter(model.layers), None)
    if getattr(first, "kind", None) != "quantize":
        raise ValueError("the model's first layer must be a hwjax.nn.Quantize")
    targets = {m.target for _, m in layers}
    if len(targets) != 1:
        raise ValueError(f"the model's layers use several targets {sorted(map(repr, targets))}; use one")
    nodes: list = []
    tensors = {INPUT: Tensor(INPUT, shape, "float32", None)}
    out = model.emit(nodes, tensors, "", "", [tensors[INPUT]])
    if len(tensors) != len(nodes) + 1:
        raise ValueError(f"layer names collide with the graph input name {INPUT!r}")
    return Graph(tensors, tuple(nodes), (INPUT,), (out.name,)).validate()
