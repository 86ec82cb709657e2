"""The TFLite importer: the flatbuffer's tensors and operators into a
:class:`hwjax.graph.Graph`.

Each builtin (or custom) operator has one converter, registered with
:func:`converts`; a converter reads the operator's options and tensors through an
:class:`OpContext` and adds graph nodes with :class:`Builder`. :func:`supported_ops` is
what the registry holds. Adding an operator is one registered function in the module of
its family (``_convert.py`` for the linear ops, pools, ADD, RESHAPE, the activations and
QUANTIZE), never a branch here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from hwjax.errors import FormatError, RangeError, UnsupportedOpError
from hwjax.graph import PRE_ACTIVATION, Graph, Node, Quant, Tensor
from hwjax.tflite import _flatbuffer as fb
from hwjax.litert import conv_geometry

_TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8"}
NP = {
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "int16": np.int16,
    "float32": np.float32,
    "int64": np.int64,
}
# TFLite builtin operator codes (schema.fbs) -> names, for reading and for error messages
OPS = {
    0: "ADD",
    1: "AVERAGE_POOL_2D",
    2: "CONCATENATION",
    3: "CONV_2D",
    4: "DEPTHWISE_CONV_2D",
    6: "DEQUANTIZE",
    9: "FULLY_CONNECTED",
    11: "L2_NORMALIZATION",
    14: "LOGISTIC",
    17: "MAX_POOL_2D",
    18: "MUL",
    19: "RELU",
    20: "RELU_N1_TO_1",
    21: "RELU6",
    22: "RESHAPE",
    23: "RESIZE_BILINEAR",
    25: "SOFTMAX",
    28: "TANH",
    32: "CUSTOM",
    34: "PAD",
    36: "GATHER",
    39: "TRANSPOSE",
    40: "MEAN",
    41: "SUB",
    42: "DIV",
    43: "SQUEEZE",
    45: "STRIDED_SLICE",
    47: "EXP",
    49: "SPLIT",
    53: "CAST",
    54: "PRELU",
    55: "MAXIMUM",
    56: "ARG_MAX",
    57: "MINIMUM",
    60: "PADV2",
    65: "SLICE",
    66: "SIN",
    67: "TRANSPOSE_CONV",
    70: "EXPAND_DIMS",
    74: "SUM",
    76: "RSQRT",
    77: "SHAPE",
    82: "REDUCE_MAX",
    83: "PACK",
    88: "UNPACK",
    97: "RESIZE_NEAREST_NEIGHBOR",
    98: "LEAKY_RELU",
    99: "SQUARED_DIFFERENCE",
    114: "QUANTIZE",
    117: "HARD_SWISH",
    126: "BATCH_MATMUL",
    150: "GELU",
}
ACT = {0: None, 1: "relu", 2: "relu_n1_to_1", 3: "relu6"}
PADDING = {0: "SAME", 1: "VALID"}


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as the file declares it: ``shape`` includes the file's
    batch axis; ``scale`` / ``zero_point`` are numpy arrays (one entry per tensor, or
    per channel along ``quantized_dimension``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: np.ndarray
    zero_point: np.ndarray
    quantized_dimension: int = 0


@dataclass
class _FileTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    data: Optional[np.ndarray]
    scale: Optional[np.ndarray]
    zero_point: Optional[np.ndarray]
    axis: int


def _read_tensors(model: fb.Table, sub: fb.Table) -> list[_FileTensor]:
    buffers = model.tables(4)
    out, seen = [], {}
    for i, t in enumerate(sub.tables(0)):
        shape = t.array(0, np.int32)
        shape = () if shape is None else tuple(int(v) for v in shape)
        code = t.scalar(1, "b", 0)
        dtype = _TENSOR_TYPES.get(code, f"type{code}")
        name = t.string(3) or f"tensor_{i}"
        if name in seen:
            name = f"{name}#{i}"
        seen[name] = i
        if any(v < 0 for v in shape):
            raise FormatError(f"tensor #{i} {name!r} has shape {shape}: dimensions cannot be negative")
        data = None
        b = t.scalar(2, "I", 0)
        if b:
            if b >= len(buffers):
                raise FormatError(f"tensor #{i} {name!r} refers to buffer {b}; the file has {len(buffers)}")
            raw = buffers[b].array(0, np.uint8)
            if raw is None and buffers[b].scalar(1, "Q", 0):
                raise UnsupportedOpError(
                    f"tensor #{i} {name!r}: buffers stored outside the flatbuffer (offset/size) are not supported"
                )
            if raw is not None and raw.size:
                if dtype not in NP:
                    raise FormatError(f"constant tensor #{i} {name!r} has unsupported type {dtype}")
                dt = np.dtype(NP[dtype]).newbyteorder("<")
                if raw.size != math.prod(shape) * dt.itemsize:
                    raise FormatError(
                        f"constant tensor #{i} {name!r}: buffer of {raw.size} bytes for shape {shape} {dtype}"
                    )
                data = np.frombuffer(raw.tobytes(), dt).reshape(shape).astype(NP[dtype])
        q = t.table(4)
        scale = zp = None
        axis = 0
        if q is not None:
            scale = q.array(2, np.float32)
            zp = q.array(3, np.int64)
            axis = q.scalar(6, "i", 0)
            if scale is not None and scale.size == 0:
                scale = None
            if scale is not None and (zp is None or zp.size == 0):
                zp = np.zeros(scale.shape, np.int64)
        out.append(_FileTensor(i, name, shape, dtype, data, scale, zp, axis))
    return out


@dataclass(frozen=True)
class OpContext:
    """One operator of the file as a converter sees it.

    ``name``: the operator's name (``"CONV_2D"``, ``"CUSTOM(XC_conv2d_v2)"``); ``index``:
    its position in the subgraph; ``options``: its builtin options table (or ``None``);
    ``custom``: its custom options bytes (or ``None``); ``inputs`` / ``outputs``: tensor
    indices (``-1`` for an absent optional input).
    """

    name: str
    index: int
    options: Optional[fb.Table]
    custom: Optional[bytes]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @property
    def where(self) -> str:
        """``"operator #k (NAME)"``, the prefix of every error message about it."""
        return f"operator #{self.index} ({self.name})"

    def option(self, field: int, fmt: str, default=0):
        """Scalar ``field`` of the builtin options table (``default`` when absent)."""
        return default if self.options is None else self.options.scalar(field, fmt, default)

    def activation(self, field: int):
        """The fused activation in options ``field`` (``None``, ``"relu"``, ``"relu6"``,
        ``"relu_n1_to_1"``); UnsupportedOpError for any other."""
        act = ACT.get(self.option(field, "b", 0), "?")
        check_act(self.where, act)
        return act

    def one_output(self) -> int:
        if len(self.outputs) != 1:
            raise UnsupportedOpError(f"{self.where}: {len(self.outputs)} outputs")
        return self.outputs[0]


#: op kinds whose output may be uint8 (the others clamp to the int8 range)
UINT8_OUTPUT_OPS = frozenset({"quantize", "flatten", "reshape"})

Converter = Callable[["Builder", OpContext], None]
_CONVERTERS: dict[str, Converter] = {}


def converts(*names: str) -> Callable[[Converter], Converter]:
    """Registers the decorated ``fn(builder, op)`` as the converter of operators ``names``
    (builtin names such as ``"MEAN"``, or ``"CUSTOM(name)"`` for a custom operator)."""

    def deco(fn: Converter) -> Converter:
        for n in names:
            if n in _CONVERTERS:
                raise RangeError(f"TFLite operator {n!r} already has a converter")
            _CONVERTERS[n] = fn
        return fn

    return deco


def supported_ops() -> tuple[str, ...]:
    """The operators the importer reads, sorted."""
    return tuple(sorted(_CONVERTERS))


class Builder:
    """Turns the file's operators into graph nodes: ``ft`` the file's tensors,
    ``tensors`` / ``nodes`` the graph being built."""

    def __init__(self, tensors: list[_FileTensor]):
        self.ft = tensors
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        # values of computed int32 tensors folded at import time (shape chains), by index
        self.folded: dict[int, np.ndarray] = {}
        # indices of the model's inputs (a float32 one may feed QUANTIZE: float_input)
        self.model_inputs: frozenset[int] = frozenset()

    def fold(self, i: int, value) -> None:
        """Records the import-time value of computed tensor ``i`` (an int32 shape
        computation, or an int8 constant that an op copies, e.g. ``XC_broadcast``);
        :meth:`const` then returns it like a constant tensor."""
        self.folded[i] = np.asarray(value, np.int32)

    def is_const(self, i: int) -> bool:
        """Whether tensor ``i`` is a constant of the file or folded at import (:meth:`fold`)."""
        return i >= 0 and (self.ft[i].data is not None or i in self.folded)

    # -- tensors
    def act(self, i: int, where: str) -> str:
        """The graph tensor of activation tensor ``i`` (per-example shape)."""
        if i < 0:
            raise FormatError(f"{where}: a required tensor is missing (index {i})")
        t = self.ft[i]
        if self.is_const(i):
            raise UnsupportedOpError(f"{where}: a constant tensor {t.name!r} as a data input is not supported")
        if t.dtype == "float32":
            raise FormatError(
                f"{where}: tensor {t.name!r} is float32: hwjax.tflite runs integer-quantised (int8) "
                "models; a float32 tensor may only be a model input read by QUANTIZE or a model "
                "output written by DEQUANTIZE (this is a float model?)"
            )
        if t.name in self.tensors:
            return t.name
        if t.dtype not in ("int8", "uint8"):
            raise FormatError(f"{where}: activation tensor {t.name!r} has type {t.dtype}; int8 or uint8 expected")
        if t.scale is None:
            raise FormatError(f"{where}: tensor {t.name!r} has no quantisation parameters")
        if t.scale.size != 1:
            raise UnsupportedOpError(f"{where}: activation tensor {t.name!r} is quantised per channel")
        if len(t.shape) < 1 or t.shape[0] != 1:
            raise UnsupportedOpError(
                f"{where}: activation tensor {t.name!r} has shape {t.shape}; hwjax.tflite "
                "needs a leading batch axis of 1 (batches replace it)"
            )
        if 0 in t.shape:
            raise UnsupportedOpError(
                f"{where}: activation tensor {t.name!r} has shape {t.shape}: tensors without elements are not supported"
            )
        if not (np.isfinite(t.scale[0]) and t.scale[0] >= np.finfo(np.float32).tiny):
            raise FormatError(
                f"{where}: activation tensor {t.name!r} has scale {float(t.scale[0])!r}; a positive "
                "normal float32 expected"
            )
        lo, hi = (-128, 127) if t.dtype == "int8" else (0, 255)
        if not lo <= t.zero_point[0] <= hi:
            raise FormatError(
                f"{where}: activation tensor {t.name!r} has zero point {int(t.zero_point[0])}, outside "
                f"the {t.dtype} range [{lo}, {hi}]"
            )
        self.tensors[t.name] = Tensor(
            t.name, tuple(t.shape[1:]), t.dtype, Quant.of(np.float32(t.scale[0]), np.int32(t.zero_point[0]))
        )
        return t.name

    def float_input(self, i: int, where: str) -> str:
        """The graph tensor of float32 model input ``i`` (a float interface: only QUANTIZE
        reads it); FormatError for any other tensor."""
        if i < 0:
            raise FormatError(f"{where}: a required tensor is missing (index {i})")
        t = self.ft[i]
        if t.dtype != "float32" or t.data is not None or i not in self.model_inputs:
            raise FormatError(f"{where}: tensor {t.name!r} ({t.dtype}) is not a float32 model input")
        if len(t.shape) < 1 or t.shape[0] != 1:
            raise UnsupportedOpError(
                f"{where}: input tensor {t.name!r} has shape {t.shape}; hwjax.tflite needs a "
                "leading batch axis of 1 (batches replace it)"
            )
        if 0 in t.shape:
            raise UnsupportedOpError(
                f"{where}: input tensor {t.name!r} has shape {t.shape}: tensors without elements are not supported"
            )
        if t.name not in self.tensors:
            self.tensors[t.name] = Tensor(t.name, tuple(t.shape[1:]), "float32", None)
        return t.name

    def const(self, i: int, where: str, what: str) -> _FileTensor:
        if i < 0:
            raise FormatError(f"{where}: the {what} input is missing")
        t = self.ft[i]
        if t.data is None and i in self.folded:
            return dataclasses.replace(t, data=self.folded[i], shape=tuple(self.folded[i].shape))
        if t.data is None:
            raise UnsupportedOpError(f"{where}: the {what} must be a constant tensor, {t.name!r} is computed")
        return t

    def node(self, op, inputs, out_i, attrs, params=None, act=None, where=""):
        out = self.act(out_i, where)
        if self.tensors[out].dtype == "uint8" and op not in UINT8_OUTPUT_OPS:
            raise UnsupportedOpError(
                f"{where}: output {out!r} is uint8; the {op!r} op kind computes int8 outputs "
                f"(uint8 outputs only from {sorted(UINT8_OUTPUT_OPS)})"
            )
        if act is not None:
            pre = out + PRE_ACTIVATION
            self.tensors[pre] = Tensor(pre, self.tensors[out].shape, self.tensors[out].dtype, self.tensors[out].quant)
            self.nodes.append(Node(op, inputs, (pre,), attrs, params, name=pre))
            self.nodes.append(Node("activation", (pre,), (out,), {"fn": act}, None, name=out))
        else:
            self.nodes.append(Node(op, inputs, (out,), attrs, params, name=out))


def w_scales(w: _FileTensor, n: int, axis: int, where: str) -> np.ndarray:
    if w.dtype != "int8":
        raise FormatError(f"{where}: filter {w.name!r} has type {w.dtype}; int8 expected (float model?)")
    if w.scale is None:
        raise FormatError(f"{where}: filter {w.name!r} has no quantisation parameters")
    if np.any(w.zero_point != 0):
        raise UnsupportedOpError(f"{where}: filter {w.name!r} has a nonzero zero point; int8 filters are symmetric")
    if w.scale.size not in (1, n):
        raise FormatError(f"{where}: filter {w.name!r} has {w.scale.size} scales for {n} channels")
    if w.scale.size > 1 and w.axis != axis:
        raise FormatError(f"{where}: filter {w.name!r} is quantised along axis {w.axis}, expected {axis}")
    return w.scale.astype(np.float32)


def bias_vector(b: _FileTensor | None, n: int, where: str) -> np.ndarray:
    if b is None:
        return np.zeros((n,), np.int32)
    if b.dtype != "int32" or b.data.shape != (n,):
        raise FormatError(f"{where}: bias {b.name!r} must be int32 ({n},), got {b.dtype} {b.data.shape}")
    return b.data.astype(np.int32)


def explicit_padding(in_hw, k, stride, padding, dilation=(1, 1)):
    return conv_geometry(in_hw, k, stride, padding, dilation).padding


def check_act(where: str, act) -> None:
    if act == "?":
        raise UnsupportedOpError(f"{where}: unsupported fused activation")


def same_quant(b: Builder, i: int, o: int, where: str) -> None:
    ti, to = b.ft[i], b.ft[o]
    if (
        ti.dtype != to.dtype
        or ti.scale is None
        or to.scale is None
        or not (np.array_equal(ti.scale, to.scale) and np.array_equal(ti.zero_point, to.zero_point))
    ):
        raise UnsupportedOpError(
            f"{where}: input and output quantisation differ ({ti.scale}, {ti.zero_point} vs "
            f"{to.scale}, {to.zero_point})"
        )


def read(data: bytes):
    """The graph and the input/output :class:`TensorInfo` of a TFLite file's first subgraph."""
    model = fb.root(data)
    subs = model.tables(2)
    if not subs:
        raise FormatError("TFLite model has no subgraph")
    codes = []
    for c in model.tables(1):
        code = max(int(c.scalar(0, "b", 0)), int(c.scalar(3, "i", 0)))
        codes.append((code, c.string(1)))
    sub = subs[0]
    ft = _read_tensors(model, sub)
    b = Builder(ft)
    inputs = [int(i) for i in (sub.array(1, np.int32) if sub.array(1, np.int32) is not None else [])]
    outputs = [int(i) for i in (sub.array(2, np.int32) if sub.array(2, np.int32) is not None else [])]
    if not inputs or not outputs:
        raise FormatError(
            f"the subgraph declares {len(inputs)} inputs and {len(outputs)} outputs; a model needs at least one of each"
        )
    for i in inputs + outputs:
        if not 0 <= i < len(ft):
            raise FormatError(f"a model input or output refers to tensor {i}; the subgraph has {len(ft)}")
    b.model_inputs = frozenset(inputs)
    for i in inputs:
        if ft[i].dtype == "float32":
            b.float_input(i, f"model input #{i}")
        else:
            b.act(i, f"model input #{i}")
    ops = sub.tables(3)
    for k, op in enumerate(ops):
        idx = op.scalar(0, "I", 0)
        if idx >= len(codes):
            raise FormatError(f"operator #{k} refers to operator code {idx}; the file has {len(codes)}")
        code, custom = codes[idx]
        name = f"CUSTOM({custom})" if code == 32 else OPS.get(code, f"BUILTIN_OPERATOR_{code}")
        convert = _CONVERTERS.get(name)
        if convert is None:
            raise UnsupportedOpError(
                f"operator #{k} is {name}, which hwjax.tflite does not support; supported: {list(supported_ops())}"
            )
        ins = [int(i) for i in (op.array(1, np.int32) if op.array(1, np.int32) is not None else [])]
        outs = [int(i) for i in (op.array(2, np.int32) if op.array(2, np.int32) is not None else [])]
        for i in ins + outs:
            if not -1 <= i < len(ft) or (i == -1 and i in outs):  # -1: an absent optional input
                raise FormatError(f"operator #{k} ({name}) refers to tensor {i}; the subgraph has {len(ft)}")
        custom_opts = op.array(5, np.uint8)
        convert(
            b,
            OpContext(
                name, k, op.table(4), None if custom_opts is None else custom_opts.tobytes(), tuple(ins), tuple(outs)
            ),
        )
    used = {t for n in b.nodes for t in (*n.inputs, *n.outputs)} | {ft[i].name for i in inputs}
    tensors = {k: v for k, v in b.tensors.items() if k in used}
    for i in outputs:
        if ft[i].name not in tensors:
            raise FormatError(f"model output {ft[i].name!r} is never written")
    graph = Graph(tensors, b.nodes, [ft[i].name for i in inputs], [ft[i].name for i in outputs]).validate()

    def info(i):
        t = ft[i]
        return TensorInfo(t.name, t.shape, t.dtype, np.asarray(t.scale, np.float32), np.asarray(t.zero_point), t.axis)

    return graph, tuple(info(i) for i in inputs), tuple(info(i) for i in outputs)
