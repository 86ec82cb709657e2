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

    def __call__(self, x, *, return_stats: bool = False):
        if not return_stats:
            return self.add(x, self.body(x))
        y, stats = self.body(x, return_stats=True)
        out, s = self.add(x, y, return_stats=True)
        return out, {**{f"body.{k}": v for k, v in stats.items()}, "add": s}
