"""The model graph: quantised tensors, nodes and graphs (pytrees), with validation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.errors import ArgTypeError, FormatError

INT_DTYPES = ("int8", "uint8", "int16", "int32")
#: suffix of the tensor between a linear op and the activation fused into it in the source file
#: (``<out> + PRE_ACTIVATION``): readers split a fused activation into its own node on it,
#: writers fuse it back, targets that fuse activations as the file did recognise it
PRE_ACTIVATION = ":pre_activation"
DTYPES = INT_DTYPES + ("float32",)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Quant:
    """Affine quantisation of a tensor: ``real = scale * (q - zero_point)``.

    ``scale`` (float32) and ``zero_point`` (int32) are scalars (per tensor) or 1-D
    arrays along ``axis`` (per channel). They are pytree leaves, so a graph whose scales
    are being learned can be traced; ``axis`` is static.
    """

    scale: Any
    zero_point: Any
    axis: Optional[int] = field(default=None, metadata={"static": True})

    @staticmethod
    def of(scale, zero_point, axis: Optional[int] = None) -> "Quant":
        """Quant with ``scale`` as float32 and ``zero_point`` as int32 arrays."""
        return Quant(_as_array(scale, np.float32), _as_array(zero_point, np.int32), axis)


def _as_array(v, dtype) -> jax.Array:
    """``v`` as a JAX array of ``dtype``; host values are converted by NumPy first (the same
    rounding as XLA's conversion), so a model's import runs no device program per shape."""
    if isinstance(v, jax.Array):
        return jnp.asarray(v, dtype)
    return jax.device_put(np.asarray(v, dtype))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Tensor:
    """A named tensor of a graph: per-example ``shape`` (no batch axis), ``dtype`` (one of
    ``DTYPES``) and quantisation (None for float tensors). Producers and consumers are
    derived from the nodes, never stored."""

    name: str = field(metadata={"static": True})
    shape: tuple[int, ...] = field(metadata={"static": True})
    dtype: str = field(metadata={"static": True})
    quant: Optional[Quant] = None


class Attrs(Mapping[str, Any]):
    """Static, hashable node attributes (a read-only mapping of hashable values)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | Sequence[tuple[str, Any]] = ()):
        d = dict(items)
        for k, v in d.items():
            try:
                hash(v)
            except TypeError:
                raise ArgTypeError(f"attribute {k!r} must be hashable (use tuples, not lists), got {v!r}") from None
        self._items = tuple(sorted(d.items()))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"

    def replace(self, **kw) -> "Attrs":
        return Attrs({**dict(self._items), **kw})


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Node:
    """One operation of a graph.

    Attributes:
      op: the op kind, a key of the op registry (:func:`hwjax.graph.get_op`).
      inputs, outputs: tensor names.
      attrs: static :class:`Attrs` (strides, padding, activation, function names, ...).
      params: the arrays of the node (a pytree: weights, biases, multipliers, tables);
        the leaves that training updates or a target derived.
      name: the node's name (defaults to its first output).
    """

    op: str = field(metadata={"static": True})
    inputs: tuple[str, ...] = field(metadata={"static": True})
    outputs: tuple[str, ...] = field(metadata={"static": True})
    attrs: Attrs = field(default_factory=Attrs, metadata={"static": True})
    params: Any = None
    name: str = field(default="", metadata={"static": True})

    def __post_init__(self):
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if not self.name:
            object.__setattr__(self, "name", self.outputs[0] if self.outputs else self.op)

    def replace(self, **kw) -> "Node":
        return dataclasses.replace(self, **kw)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Graph:
    """A model: tensors, nodes in execution (topological) order, graph inputs and outputs.

    ``target`` is None for a *portable* graph, whose nodes hold target-independent
    integer parameters (int8 weights, int32 biases, weight scales: what a ``.tflite``
    file or a calibrated ``hwjax.nn`` model holds), or the :class:`hwjax.targets.Target`
    whose integer parameters the nodes hold (what :func:`hwjax.graph.lower` and
    :func:`hwjax.load` return). A graph is a pytree: node params and tensor
    quantisations are leaves.
    """

    tensors: dict[str, Tensor]
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...] = field(metadata={"static": True})
    outputs: tuple[str, ...] = field(metadata={"static": True})
    target: Any = field(default=None, metadata={"static": True})

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    def replace(self, **kw) -> "Graph":
        return dataclasses.replace(self, **kw)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise FormatError(f"graph has no tensor {name!r}") from None

    def producer(self, name: str) -> Optional[Node]:
        """The node that writes tensor ``name`` (None for graph inputs)."""
        return next((n for n in self.nodes if name in n.outputs), None)

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.nodes if name in n.inputs]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise FormatError(f"graph has no node {name!r}")

    def validate(self) -> "Graph":
        """Checks every link, dtype and inferred shape; raises :class:`hwjax.errors.FormatError`
        naming the node. Returns the graph."""
        from hwjax.graph._ops import get_op

        seen = set(self.inputs)
        for t in self.inputs:
            self.tensor(t)
        for i, node in enumerate(self.nodes):
            where = f"node #{i} {node.name!r} ({node.op})"
            try:
                spec = get_op(node.op)
            except KeyError as e:
                raise FormatError(f"{where}: {e.args[0]}") from None
            for t in node.inputs:
                if t not in seen:
                    raise FormatError(f"{where}: input {t!r} is not a graph input or an earlier node's output")
            ins = [self.tensor(t) for t in node.inputs]
            try:
                spec.check(node, ins)
                shapes = spec.infer(node, ins)
            except (ValueError, TypeError, KeyError) as e:
                raise FormatError(f"{where}: {e}") from None
            if self.target is not None:
                self._check_lowered(node, ins, shapes, where)
            if len(shapes) != len(node.outputs):
                raise FormatError(f"{where}: produces {len(shapes)} tensors, names {len(node.outputs)}")
            for t, shape in zip(node.outputs, shapes):
                out = self.tensor(t)
                if tuple(out.shape) != tuple(shape):
                    raise FormatError(f"{where}: output {t!r} has shape {out.shape}, the op infers {tuple(shape)}")
                if t in seen:
                    raise FormatError(f"{where}: tensor {t!r} is written twice")
                seen.add(t)
        for t in self.outputs:
            if t not in seen:
                raise FormatError(f"graph output {t!r} is never written")
        for name, t in self.tensors.items():
            if t.name != name:
                raise FormatError(f"tensor key {name!r} holds a tensor named {t.name!r}")
            if t.dtype not in DTYPES:
                raise FormatError(f"tensor {name!r} has dtype {t.dtype!r}; supported: {DTYPES}")
        return self

    def _check_lowered(self, node: Node, ins, shapes, where: str) -> None:
        """Traces the target's ``run`` on abstract inputs (no computation): its parameters
        must fit the input shapes and produce the inferred output shapes."""
        try:
            impl = self.target.lowering(node.op)
        except NotImplementedError as e:
            raise FormatError(f"{where}: {e}") from None
        xs = [jax.ShapeDtypeStruct((1, *t.shape), jnp.float32 if t.dtype == "float32" else jnp.int32) for t in ins]
        try:
            out = jax.eval_shape(lambda p, *a: impl.run(self.target, node.attrs, p, *a), node.params, *xs)
        except Exception as e:
            raise FormatError(
                f"{where}: its {self.target.name} parameters do not fit its inputs "
                f"{[tuple(t.shape) for t in ins]}: {type(e).__name__}: {e}"
            ) from None
        outs = out if isinstance(out, tuple) else (out,)
        got = [tuple(o.shape[1:]) for o in outs]
        if got != [tuple(sh) for sh in shapes]:
            raise FormatError(
                f"{where}: its {self.target.name} parameters produce shapes {got}, "
                f"the op infers {[tuple(sh) for sh in shapes]}"
            )

    def summary(self) -> str:
        """One line per node: name, op, inputs -> outputs with shapes."""
        lines = []
        for n in self.nodes:
            outs = ", ".join(f"{t}{list(self.tensors[t].shape)}" for t in n.outputs)
            lines.append(f"{n.name:<24} {n.op:<16} {', '.join(n.inputs)} -> {outs}")
        return "\n".join(lines)


def concrete_scalar(v, what: str) -> float:
    """A concrete Python number from a scalar array (FormatError when traced)."""
    try:
        return np.asarray(v).item()
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise FormatError(f"{what} must be concrete here, got a traced value") from None
