"""The op registry: every op kind is declared once, as an :class:`OpSpec`.

An op spec says what a node of that kind looks like (inputs, attributes and their
defaults, the portable parameters) and infers its output shapes. How the op *runs* is
the business of each target (:meth:`hwjax.targets.Target.lowering`); an op that runs
the same everywhere (quantize, flatten) carries a ``generic`` implementation that every
target inherits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Sequence

from hwjax.errors import ArgTypeError, FormatError, RangeError, UnknownOpError

_OPS: dict[str, "OpSpec"] = {}


@dataclass(frozen=True)
class OpImpl:
    """How one target runs one op kind: the target-side half of the seam.

    Attributes:
      run: ``run(target, attrs, params, *xs, return_acc=False)``: the exact integer
        forward on batched integer arrays (int32 holding the tensor's values; float32
        for float tensors). Returns ``y``, or ``(y, acc)`` with ``return_acc=True`` where
        ``acc`` is None or an accumulator statistic ``{"count", "saturated"}``.
      params: the quantisation recipe ``params(target, attrs, portable, q_in, q_out)``
        from the node's portable parameters and the input/output
        :class:`hwjax.graph.Quant` to the target's integer parameters (jittable; no
        gradient). None: the op has no parameters on this target.
      export: ``export(target, attrs, params) -> (tensors, meta)``: the chip-native
        arrays (name -> numpy array, written as raw little-endian blobs) and JSON
        scalars. None: nothing to write.
      load: ``load(target, attrs, tensors, meta) -> params``, the inverse of ``export``
        (ValueError on inconsistent data).
      host_params: optional ``host_params(target, attrs, portable, q_in, q_out)``, the
        same recipe on concrete (NumPy) values, run on the host by
        :func:`hwjax.graph.lower` instead of compiling ``params``; it must give the
        parameters ``params`` gives (the chip vendor's own host recipe, typically), or
        return None to defer to ``params`` for this node.
      params_many: optional ``params_many(target, requests) -> list``, the recipe of
        several nodes in one evaluation, with ``requests`` a list of ``(op, attrs,
        portable, q_in, q_out)``: the same parameters as ``params`` on each, node by node,
        but one copy of the recipe in a compiled program instead of one per node (a
        batched recipe). :func:`hwjax.graph.derive_params` hands every node whose op's
        impl shares the same ``params_many`` function (e.g. a target's conv, depthwise
        and dense) to one call.
      narrow_inputs: when True, :func:`hwjax.graph.run` hands ``run`` each input of an
        ``int8`` or ``uint8`` tensor as an int8 or uint8 array (the same values, in the
        tensor's storage type) instead of int32, so that the op knows from the dtype, at
        trace time, which of the two it reads (e.g. whether an int8 dot needs an offset)
        instead of finding out from the values at run time.
    """

    run: Callable[..., Any]
    params: Optional[Callable[..., Any]] = None
    export: Optional[Callable[..., Any]] = None
    load: Optional[Callable[..., Any]] = None
    host_params: Optional[Callable[..., Any]] = None
    params_many: Optional[Callable[..., Any]] = None
    narrow_inputs: bool = False


class OpSpec:
    """Base class of op kinds. Subclass, set the class attributes, override :meth:`infer`
    (and :meth:`check` for attribute validation), and :func:`register_op` an instance.

    Class attributes:
      name: the op's registry key.
      num_inputs: how many input tensors it takes.
      attrs: allowed attribute names and their defaults (``REQUIRED`` for none).
      params: names of the portable parameters (a dict of arrays), for documentation
        and validation.
      choices: attributes restricted to a set of values (name -> allowed values).
      generic: an :class:`OpImpl` every target inherits unless it implements the op
        itself (None: targets must implement it).
      layout_only: the output holds the input's values, rearranged (a reshape), on every
        target. :func:`hwjax.graph.run` then does not materialise it: there is no
        arithmetic for a consumer to repeat, and its input is materialised already.
    """

    REQUIRED: ClassVar[object] = object()
    name: ClassVar[str] = ""
    num_inputs: ClassVar[int] = 1
    attrs: ClassVar[dict[str, Any]] = {}
    params: ClassVar[tuple[str, ...]] = ()
    choices: ClassVar[dict[str, tuple]] = {}
    generic: ClassVar[Optional[OpImpl]] = None
    layout_only: ClassVar[bool] = False

    def attr(self, node, key: str):
        """``node.attrs[key]`` or its default."""
        if key in node.attrs:
            return node.attrs[key]
        default = self.attrs[key]
        if default is OpSpec.REQUIRED:
            raise KeyError(f"attribute {key!r} is required")
        return default

    def arity(self, node) -> int:
        """How many input tensors ``node`` takes (:attr:`num_inputs` unless an op kind's
        attributes change it)."""
        return self.num_inputs

    def check(self, node, ins: Sequence) -> None:
        """Validates the node's arity and attribute names (ValueError naming the problem)."""
        n = self.arity(node)
        if len(node.inputs) != n:
            raise RangeError(f"takes {n} inputs, got {len(node.inputs)}")
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise RangeError(f"unknown attributes {sorted(unknown)}; {self.name} takes {sorted(self.attrs)}")
        for k, v in self.attrs.items():
            if v is OpSpec.REQUIRED and k not in node.attrs:
                raise RangeError(f"attribute {k!r} is required")
        for k, allowed in self.choices.items():
            if self.attr(node, k) not in allowed:
                raise RangeError(f"{k} must be one of {allowed}, got {self.attr(node, k)!r}")

    def infer(self, node, ins: Sequence) -> list[tuple[int, ...]]:
        """Output shapes (per example) from the input tensors (:class:`hwjax.graph.Tensor`)."""
        return [tuple(ins[0].shape)]


def register_op(spec: OpSpec, *, replace: bool = False) -> OpSpec:
    """Adds an op kind to the registry (RangeError if the name is taken, unless ``replace``;
    ArgTypeError for anything but a named :class:`OpSpec` instance)."""
    if not isinstance(spec, OpSpec) or not isinstance(spec.name, str) or not spec.name:
        raise ArgTypeError(f"spec: register_op takes an OpSpec instance with a name, got {spec!r}")
    if spec.name in _OPS and not replace:
        raise RangeError(f"op kind {spec.name!r} is already registered (pass replace=True to replace it)")
    _OPS[spec.name] = spec
    return spec


def get_op(name: str) -> OpSpec:
    """The :class:`OpSpec` registered as ``name`` (:class:`hwjax.errors.UnknownOpError`, a
    KeyError, naming the known kinds)."""
    if not isinstance(name, str) or name not in _OPS:
        raise UnknownOpError(f"unknown op kind {name!r}; registered: {sorted(_OPS)}")
    return _OPS[name]


def ops() -> tuple[str, ...]:
    """Names of every registered op kind."""
    return tuple(sorted(_OPS))


def check_node_op(name: str) -> OpSpec:
    try:
        return get_op(name)
    except KeyError as e:
        raise FormatError(e.args[0]) from None
