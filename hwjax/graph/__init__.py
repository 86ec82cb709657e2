"""The model graph every hwjax path shares: ``hwjax.nn`` models, exports, and model files.

A :class:`Graph` is an ordered list of :class:`Node` s over named :class:`Tensor` s,
each with its integer dtype, per-example shape and :class:`Quant` (scale, zero point,
per-channel axis). Nodes are pytrees: their ``params`` are leaves, their ``attrs``
static. Each op kind is declared once, in the op registry (:func:`register_op`,
:class:`OpSpec`; the built-in kinds are in :mod:`hwjax.graph.ops`); each target says how
it runs each kind it supports (:class:`OpImpl`, :mod:`hwjax.targets`).

* :func:`lower` derives a target's integer parameters from the portable ones;
  :func:`derive_params` derives several ops' at once (one batched recipe where the target
  has one).
* :func:`run` evaluates a graph exactly: jittable, and batched over a leading axis
  (``jax.vmap`` works too). :func:`jit_run` is its compiled form.

Example::

    import hwjax, hwjax.graph as hg
    g = hwjax.nn.to_graph(model, input_shape=(8, 8, 1))   # a calibrated hwjax.nn model
    y = hg.jit_run(g, x_int8, hwjax.targets.get("xs3"))  # (batch, 10) int8 values
"""

from hwjax.graph import ops as _builtin_ops
from hwjax.graph._ir import DTYPES, INT_DTYPES, PRE_ACTIVATION, Attrs, Graph, Node, Quant, Tensor
from hwjax.graph._ops import OpImpl, OpSpec, get_op, ops, register_op
from hwjax.graph._run import derive_params, jit_run, lower, lower_node, run
from hwjax.graph.ops.linear import geometry
from hwjax.graph.ops.pool import pool_geometry

__all__ = [
    "PRE_ACTIVATION",
    "Attrs",
    "DTYPES",
    "Graph",
    "INT_DTYPES",
    "Node",
    "OpImpl",
    "OpSpec",
    "Quant",
    "Tensor",
    "geometry",
    "derive_params",
    "get_op",
    "jit_run",
    "lower",
    "lower_node",
    "ops",
    "pool_geometry",
    "register_op",
    "run",
]
