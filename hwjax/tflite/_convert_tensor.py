"""Converters and writers of TFLite's tensor operators: data movement, shape
chains, MEAN, MUL, DEQUANTIZE.

Converters (registered with :func:`converts`):

* PAD, PADV2 -> ``pad`` (pad value: the output zero point, or PADV2's constant value);
* CONCATENATION -> ``concat`` (LiteRT requires every int8 input to share the output's
  quantisation; int32 shape vectors are folded);
* SQUEEZE -> ``reshape`` / ``flatten``;
* SHAPE, STRIDED_SLICE, PACK on int32 shape vectors: folded at import time
  (:meth:`Builder.fold`), so that the shape chain Keras' Flatten writes (SHAPE ->
  STRIDED_SLICE -> PACK -> RESHAPE) reads as a constant (RESHAPE itself takes its output
  shape from the file's output tensor);
* MEAN -> ``mean``; MUL -> ``mul`` (``square`` for a tensor times itself, ``mul_const``
  with a constant int8 operand); DEQUANTIZE (int8 -> float32) -> ``dequantize``.

Writers (registered with :func:`hwjax.tflite._save.writes`, the mirror of the
converters): ``pad`` -> PAD / PADV2, ``concat`` -> CONCATENATION, ``mean`` -> MEAN,
``mul`` / ``mul_const`` / ``square`` -> MUL, ``dequantize`` -> DEQUANTIZE. SQUEEZE and
the folded shape chains became ``reshape`` / ``flatten`` nodes, which are written as
RESHAPE (:mod:`hwjax.tflite._save`).

The integer kernels that run these ops are in :mod:`hwjax.litert`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.graph import Node, Tensor
from hwjax.tflite import _save as S
from hwjax.tflite._import import Builder, OpContext, converts, same_quant

_I32 = jnp.int32


# ------------------------------------------------------------------------------ helpers


def example_axis(axis: int, rank: int, where: str) -> int:
    """The per-example axis of the file's ``axis`` of a rank-``rank`` tensor (negative
    axes count from the end); the batch axis 0 raises UnsupportedOpError."""
    a = int(axis) + rank if int(axis) < 0 else int(axis)
    if not 0 <= a < rank:
        raise FormatError(f"{where}: axis {axis} is outside the input's {rank} axes")
    if a == 0:
        raise UnsupportedOpError(f"{where}: operating along the batch axis is not supported (batches replace it)")
    return a - 1


def _foldable(b: Builder, i: int) -> bool:
    """Tensor ``i`` is an int32 (or int64) constant or an already folded shape value."""
    return i >= 0 and b.ft[i].dtype in ("int32", "int64") and (b.ft[i].data is not None or i in b.folded)


def _int_vector(b: Builder, i: int, where: str, what: str) -> np.ndarray:
    t = b.const(i, where, what)
    if t.dtype not in ("int32", "int64"):
        raise FormatError(f"{where}: the {what} {t.name!r} has type {t.dtype}; int32 expected")
    return np.asarray(t.data).astype(np.int64)


def _batch_one(b: Builder, i: int, where: str) -> tuple[int, ...]:
    shape = b.ft[i].shape
    if len(shape) < 1 or shape[0] != 1:
        raise UnsupportedOpError(
            f"{where}: tensor {b.ft[i].name!r} has shape {shape}; a leading batch axis of 1 "
            "is needed (batches replace it)"
        )
    return tuple(shape[1:])


def _int8_act(b: Builder, i: int, where: str) -> str:
    """The graph tensor of int8 activation ``i`` (the arithmetic below is derived and
    verified for int8 only: uint8 raises UnsupportedOpError)."""
    x = b.act(i, where)
    if b.tensors[x].dtype != "int8":
        raise UnsupportedOpError(
            f"{where}: tensor {b.ft[i].name!r} is {b.tensors[x].dtype}; this operator is supported for int8 only"
        )
    return x


def _reshape_node(b: Builder, x: str, o: int, where: str) -> None:
    shape = _batch_one(b, o, where)
    if len(shape) == 1:
        b.node("flatten", (x,), o, {}, None, None, where)
    else:
        b.node("reshape", (x,), o, {"shape": shape}, None, None, where)


# ----------------------------------------------------------------------- data movement


@converts("PAD", "PADV2")
def _pad(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if len(ins) < 2:
        raise FormatError(f"{where}: takes the input and the paddings, got {len(ins)} inputs")
    x = b.act(ins[0], where)
    same_quant(b, ins[0], o, where)
    pads = _int_vector(b, ins[1], where, "paddings")
    rank = len(b.ft[ins[0]].shape)
    if pads.shape != (rank, 2) or np.any(pads < 0):
        raise FormatError(f"{where}: paddings must be ({rank}, 2) non-negative, got {pads.tolist()}")
    if tuple(pads[0]) != (0, 0):
        raise UnsupportedOpError(f"{where}: padding the batch axis ({tuple(pads[0])}) is not supported")
    value = None
    if op.name == "PADV2" and len(ins) > 2 and ins[2] >= 0:
        v = b.const(ins[2], where, "constant value")
        to = b.ft[o]
        if v.dtype != to.dtype or v.data.size != 1:
            raise FormatError(
                f"{where}: the constant value {v.name!r} must be one {to.dtype}, got {v.dtype} {v.data.shape}"
            )
        if v.scale is None or not (np.array_equal(v.scale, to.scale) and np.array_equal(v.zero_point, to.zero_point)):
            raise UnsupportedOpError(
                f"{where}: the constant value's quantisation differs from the output's (LiteRT requires them equal)"
            )
        value = int(v.data.reshape(()))
    paddings = tuple((int(a), int(c)) for a, c in pads[1:])
    b.node("pad", (x,), o, {"paddings": paddings, "value": value}, None, None, where)


@converts("CONCATENATION")
def _concatenation(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if not ins:
        raise FormatError(f"{where}: no inputs")
    if op.activation(1) is not None:
        raise UnsupportedOpError(f"{where}: a fused activation on CONCATENATION is not supported")
    axis = op.option(0, "i", 0)
    if all(_foldable(b, i) for i in ins):  # an int32 shape computation
        vals = [_int_vector(b, i, where, f"input #{k}") for k, i in enumerate(ins)]
        b.fold(o, np.concatenate(vals, axis=axis))
        return
    xs = tuple(b.act(i, where) for i in ins)
    to = b.ft[o]
    for k, i in enumerate(ins):
        ti = b.ft[i]
        if not (
            ti.dtype == to.dtype and np.array_equal(ti.scale, to.scale) and np.array_equal(ti.zero_point, to.zero_point)
        ):
            raise UnsupportedOpError(
                f"{where}: input #{k} {ti.name!r} is quantised ({ti.scale}, {ti.zero_point}), the output "
                f"({to.scale}, {to.zero_point}): LiteRT's int8 CONCATENATION requires equal quantisation "
                "(its reference, optimized and XNNPACK paths all refuse to prepare such a model)"
            )
    rank = len(b.ft[ins[0]].shape)
    b.node("concat", xs, o, {"axis": example_axis(axis, rank, where)}, None, None, where)


@converts("SQUEEZE")
def _squeeze(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    x = b.act(ins[0], where)
    same_quant(b, ins[0], o, where)
    shape = b.ft[ins[0]].shape
    dims = None if op.options is None else op.options.array(0, np.int32)
    if dims is None or dims.size == 0:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = {int(d) + len(shape) if d < 0 else int(d) for d in dims}
        if any(not 0 <= d < len(shape) or shape[d] != 1 for d in drop):
            raise FormatError(f"{where}: cannot squeeze axes {dims.tolist()} of shape {shape}")
    if 0 in drop:
        raise UnsupportedOpError(f"{where}: squeezing the batch axis is not supported (batches replace it)")
    want = tuple(d for i, d in enumerate(shape) if i not in drop)
    if want != tuple(b.ft[o].shape):
        raise FormatError(f"{where}: squeezing {shape} gives {want}, the output tensor is {b.ft[o].shape}")
    _reshape_node(b, x, o, where)


# ------------------------------------------------------------- int32 shape computations


@converts("SHAPE")
def _shape(b: Builder, op: OpContext) -> None:
    """The file's (static, batch-1) shape of the input, folded."""
    b.fold(op.one_output(), np.asarray(b.ft[op.inputs[0]].shape, np.int64))


def strided_slice_1d(
    v: np.ndarray, begin, end, strides, begin_mask: int, end_mask: int, shrink_mask: int
) -> np.ndarray:
    """TFLite STRIDED_SLICE of a constant array (no ellipsis / new-axis masks): per axis
    ``i``, ``v[begin[i]:end[i]:strides[i]]`` with bit ``i`` of ``begin_mask`` /
    ``end_mask`` dropping the bound and of ``shrink_mask`` taking element ``begin[i]``
    and removing the axis (Python's slicing rules, which TFLite's clamping follows)."""
    index = []
    for i in range(len(begin)):
        if shrink_mask >> i & 1:
            index.append(int(begin[i]))
            continue
        lo = None if begin_mask >> i & 1 else int(begin[i])
        hi = None if end_mask >> i & 1 else int(end[i])
        index.append(slice(lo, hi, int(strides[i])))
    return np.asarray(v[tuple(index)])


@converts("STRIDED_SLICE")
def _strided_slice(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if len(ins) != 4:
        raise FormatError(f"{where}: takes 4 inputs, got {len(ins)}")
    if not _foldable(b, ins[0]):
        raise UnsupportedOpError(
            f"{where}: only int32 shape vectors are sliced (folded at import); slicing the "
            f"computed {b.ft[ins[0]].dtype} tensor {b.ft[ins[0]].name!r} is not supported"
        )
    v = _int_vector(b, ins[0], where, "input")
    begin, end, strides = (_int_vector(b, i, where, w) for i, w in zip(ins[1:], ("begin", "end", "strides")))
    if not begin.shape == end.shape == strides.shape == (v.ndim,) or np.any(strides == 0):
        raise FormatError(
            f"{where}: begin/end/strides {begin.tolist()}, {end.tolist()}, {strides.tolist()} do "
            f"not fit an input of rank {v.ndim}"
        )
    if op.option(2, "i", 0) or op.option(3, "i", 0) or op.option(5, "b", 0):
        raise UnsupportedOpError(f"{where}: ellipsis / new-axis masks and offset are not supported")
    b.fold(
        o, strided_slice_1d(v, begin, end, strides, op.option(0, "i", 0), op.option(1, "i", 0), op.option(4, "i", 0))
    )


@converts("PACK")
def _pack(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if not ins or not all(_foldable(b, i) for i in ins):
        raise UnsupportedOpError(
            f"{where}: only int32 shape values are packed (folded at import); packing "
            "computed activations is not supported"
        )
    vals = [_int_vector(b, i, where, f"input #{k}") for k, i in enumerate(ins)]
    if len({v.shape for v in vals}) != 1:
        raise FormatError(f"{where}: inputs of shapes {[v.shape for v in vals]} cannot be packed")
    axis = op.option(1, "i", 0)
    b.fold(o, np.stack(vals, axis=axis + vals[0].ndim + 1 if axis < 0 else axis))


# ---------------------------------------------------------------------- arithmetic ops


@converts("MEAN")
def _mean(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if len(ins) != 2:
        raise FormatError(f"{where}: takes the input and the axes, got {len(ins)} inputs")
    x = _int8_act(b, ins[0], where)
    _int8_act(b, o, where)
    rank = len(b.ft[ins[0]].shape)
    axes = tuple(sorted({example_axis(a, rank, where) for a in _int_vector(b, ins[1], where, "axes").reshape(-1)}))
    if not axes:
        raise UnsupportedOpError(f"{where}: a MEAN over no axes is not supported")
    keep = bool(op.option(0, "b", 0))
    count = math.prod(b.tensors[x].shape[a] for a in axes)
    b.node("mean", (x,), o, {"axes": axes, "keep_dims": keep, "count": count}, None, None, where)


def const_operand(b: Builder, i: int, out_rank: int, where: str) -> dict:
    """The portable parameters of a constant int8 operand (MUL, ADD): its value with the file's
    batch axis dropped when it has one, and its (per-tensor) quantisation."""
    t = b.const(i, where, "operand")
    if t.dtype != "int8" or t.scale is None or t.scale.size != 1:
        raise UnsupportedOpError(
            f"{where}: a constant operand must be int8 quantised per tensor, {t.name!r} is {t.dtype}"
        )
    v = np.asarray(t.data)
    if v.ndim == out_rank:
        if v.shape[0] != 1:
            raise UnsupportedOpError(f"{where}: constant {t.name!r} of shape {v.shape} varies along the batch axis")
        v = v[0]
    elif v.ndim > out_rank:
        raise FormatError(f"{where}: constant {t.name!r} of shape {v.shape} has more axes than the output")
    return {
        "value": jnp.asarray(v, jnp.int8),
        "scale": jnp.float32(t.scale[0]),
        "zero_point": jnp.int32(t.zero_point[0]),
    }


@converts("MUL")
def _mul(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    if len(ins) != 2:
        raise FormatError(f"{where}: takes 2 inputs, got {len(ins)}")
    act = op.activation(0)
    _int8_act(b, o, where)
    to = b.ft[o]
    consts = [b.is_const(i) for i in ins]
    if all(consts):
        raise UnsupportedOpError(f"{where}: a MUL of two constants is not supported")
    if any(consts):
        k = consts.index(True)
        x = _int8_act(b, ins[1 - k], where)
        node = ("mul_const", (x,), const_operand(b, ins[k], len(to.shape), where))
    elif ins[0] == ins[1]:  # x * x: a squaring (XNNPACK rewrites it so, with its own rounding)
        node = ("square", (_int8_act(b, ins[0], where),), None)
    else:
        node = ("mul", (_int8_act(b, ins[0], where), _int8_act(b, ins[1], where)), None)
    # (a broadcast whose products can overflow LiteRT's optimized int16 intermediates is
    # refused on runtime "optimized" only: hwjax.targets.check_tflite_lowering)
    b.node(node[0], node[1], o, {"activation": act}, node[2], None, where)


@converts("DEQUANTIZE")
def _dequantize(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    x = _int8_act(b, op.inputs[0], where)
    t = b.ft[o]
    if t.dtype != "float32":
        raise UnsupportedOpError(f"{where}: DEQUANTIZE to {t.dtype} is not supported (float32 only)")
    shape = _batch_one(b, o, where)
    b.tensors[t.name] = Tensor(t.name, shape, "float32", None)
    b.nodes.append(Node("dequantize", (x,), (t.name,), {}, None, name=t.name))


# ------------------------------------------------------------------------------ writers
#
# Each writer emits the operator its converter reads back into the same node: the batch
# axis (1) is prepended to every per-example axis, shape and padding, and the operator
# code versions are those TensorFlow's converter writes for int8.


def _keeps_quant(b: "S.FileBuilder", node: Node, ins, what: str) -> None:
    """UnsupportedOpError unless every tensor of ``ins`` has the dtype and quantisation of
    the node's output (``what``: the operator, for the message)."""
    t_out = b.graph.tensor(node.outputs[0])
    for name in ins:
        t = b.graph.tensor(name)
        if t.dtype != t_out.dtype or not S.same_quant(t.quant, t_out.quant):
            raise UnsupportedOpError(
                f"{S.where(node)}: LiteRT's {what} keeps the quantisation; input {name!r} "
                f"({t.dtype}, {t.quant}) and output {t_out.name!r} ({t_out.dtype}, "
                f"{t_out.quant}) differ"
            )


@S.writes("pad")
def _write_pad(b: "S.FileBuilder", node: Node) -> None:
    """``pad`` -> PAD (``value`` None: the pad value is the output's zero point) or PADV2
    (``value``: a scalar constant of the output's dtype and quantisation), reading an
    int32 ``(rank + 1, 2)`` paddings tensor whose batch row is ``(0, 0)``."""
    _keeps_quant(b, node, node.inputs, "PAD")
    t_out = b.graph.tensor(node.outputs[0])
    pads = np.asarray([(0, 0), *(tuple(int(v) for v in p) for p in node.attrs["paddings"])], np.int32)
    ins = [b.tensor(node.inputs[0]), b.const(f"{node.name}/paddings", pads, "int32")]
    value = node.attrs.get("value")
    if value is None:
        b.op("PAD", ins, [b.tensor(t_out.name)], ("PadOptions", {}), version=2)
        return
    q = t_out.quant
    ins.append(
        b.const(
            f"{node.name}/constant_value",
            np.asarray(int(value)),
            t_out.dtype,
            np.asarray(q.scale, np.float32).reshape(1),
            np.asarray(q.zero_point).reshape(1),
        )
    )
    b.op("PADV2", ins, [b.tensor(t_out.name)], ("PadV2Options", {}), version=2)


@S.writes("concat")
def _write_concat(b: "S.FileBuilder", node: Node) -> None:
    """``concat`` -> CONCATENATION along ``axis + 1``, no fused activation. Every input
    must share the output's quantisation (UnsupportedOpError otherwise: LiteRT refuses
    to prepare such an int8 CONCATENATION)."""
    _keeps_quant(b, node, node.inputs, "int8 CONCATENATION")
    axis = int(node.attrs["axis"]) + 1
    b.op(
        "CONCATENATION",
        [b.tensor(x) for x in node.inputs],
        [b.tensor(node.outputs[0])],
        ("ConcatenationOptions", {"axis": axis, "fusedActivationFunction": 0}),
        version=2,
    )


def _int8_only(b: "S.FileBuilder", node: Node, names, what: str) -> None:
    """UnsupportedOpError unless the tensors ``names`` are int8 (the converters of MEAN,
    MUL and DEQUANTIZE read int8 only)."""
    for name in names:
        if b.graph.tensor(name).dtype != "int8":
            raise UnsupportedOpError(
                f"{S.where(node)}: tensor {name!r} is {b.graph.tensor(name).dtype}; {what} is written for int8 only"
            )


@S.writes("mean")
def _write_mean(b: "S.FileBuilder", node: Node) -> None:
    """``mean`` -> MEAN over the int32 axes ``[a + 1 for a in axes]`` (ascending), option
    ``keepDims``. int8 only, as the converter (UnsupportedOpError otherwise)."""
    _int8_only(b, node, (*node.inputs, *node.outputs), "MEAN")
    axes = np.asarray([int(a) + 1 for a in node.attrs["axes"]], np.int32)
    b.op(
        "MEAN",
        [b.tensor(node.inputs[0]), b.const(f"{node.name}/axes", axes, "int32")],
        [b.tensor(node.outputs[0])],
        ("ReducerOptions", {"keepDims": bool(node.attrs.get("keep_dims", False))}),
        version=2,
    )


def _write_mul_op(b: "S.FileBuilder", node: Node, ins: list) -> None:
    """MUL of file tensors ``ins``, the node's ``activation`` fused."""
    _int8_only(b, node, (*node.inputs, *node.outputs), "MUL")
    out, act = b.output(node)  # checks the output's quantisation
    b.op("MUL", ins, [out], ("MulOptions", {"fusedActivationFunction": act}), version=2)


@S.writes("mul")
def _write_mul(b: "S.FileBuilder", node: Node) -> None:
    """``mul`` -> MUL of its two inputs in order, the ``activation`` fused."""
    _write_mul_op(b, node, [b.tensor(x) for x in node.inputs])


@S.writes("square")
def _write_square(b: "S.FileBuilder", node: Node) -> None:
    """``square`` -> MUL reading its input twice (the form the converter reads as
    ``square`` and XNNPACK rewrites into its squaring), the ``activation`` fused."""
    x = b.tensor(node.inputs[0])
    _write_mul_op(b, node, [x, x])


@S.writes("mul_const")
def _write_mul_const(b: "S.FileBuilder", node: Node) -> None:
    """``mul_const`` -> MUL of the input (first operand) and an int8 constant holding
    ``value`` quantised (``scale``, ``zero_point``) per tensor, the ``activation`` fused.
    A ``value`` with as many axes as an example is written with the batch axis
    prepended (shape ``(1, *value.shape)``): then LiteRT, like hwjax, sees operands of
    equal shape where ``value`` has the example's shape (its element-wise kernels);
    a ``value`` with fewer axes is written as it is (a broadcast). Either way the
    converter reads back the same ``value``."""
    _write_mul_op(b, node, [b.tensor(node.inputs[0]), S.constant_operand(b, node)])


@S.writes("dequantize")
def _write_dequantize(b: "S.FileBuilder", node: Node) -> None:
    """``dequantize`` -> DEQUANTIZE of the int8 input into an unquantised float32 tensor."""
    _int8_only(b, node, node.inputs, "DEQUANTIZE")
    b.op("DEQUANTIZE", [b.tensor(node.inputs[0])], [b.float_tensor(node.outputs[0])], version=2)
