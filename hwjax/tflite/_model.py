"""Reading a ``.tflite`` file into a :class:`hwjax.graph.Graph`, and :class:`Model`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.errors import FormatError, ShapeError, UnsupportedOpError
from hwjax.graph import Graph, Node, Quant, Tensor, jit_run, lower
from hwjax.tflite import _flatbuffer as fb
from hwjax.tflite._kernels import conv_geometry

_TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8"}
_NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int16": np.int16, "float32": np.float32,
       "int64": np.int64}
# TFLite builtin operator codes (schema.fbs) -> names, for reading and for error messages
OPS = {
       0: "ADD", 1: "AVERAGE_POOL_2D", 2: "CONCATENATION", 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D", 6:
       "DEQUANTIZE", 9: "FULLY_CONNECTED", 11: "L2_NORMALIZATION", 14: "LOGISTIC", 17: "MAX_POOL_2D", 18: "MUL",
       19: "RELU", 20: "RELU_N1_TO_1", 21: "RELU6", 22: "RESHAPE", 23: "RESIZE_BILINEAR", 25: "SOFTMAX", 28:
       "TANH", 32: "CUSTOM", 34: "PAD", 36: "GATHER", 39: "TRANSPOSE", 40: "MEAN", 41: "SUB", 42: "DIV", 43:
       "SQUEEZE", 45: "STRIDED_SLICE", 47: "EXP", 49: "SPLIT", 53: "CAST", 54: "PRELU", 55: "MAXIMUM", 56:
       "ARG_MAX", 57: "MINIMUM", 60: "PADV2", 65: "SLICE", 66: "SIN", 67: "TRANSPOSE_CONV", 70: "EXPAND_DIMS",
       74: "SUM", 76: "RSQRT", 77: "SHAPE", 82: "REDUCE_MAX", 83: "PACK", 88: "UNPACK", 97:
       "RESIZE_NEAREST_NEIGHBOR", 98: "LEAKY_RELU", 99: "SQUARED_DIFFERENCE", 114: "QUANTIZE", 117:
       "HARD_SWISH", 126: "BATCH_MATMUL", 150: "GELU"}
_ACT = {0: None, 1: "relu", 2: "relu_n1_to_1", 3: "relu6"}
_PADDING = {0: "SAME", 1: "VALID"}
#: TFLite builtin operators :func:`load` reads
SUPPORTED_OPS = ("ADD", "AVERAGE_POOL_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D",
                 "QUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE")
RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")


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
        data = None
        b = t.scalar(2, "I", 0)
        if b:
            if b >= len(buffers):
                raise FormatError(f"tensor #{i} {name!r} refers to buffer {b}; the file has {len(buffers)}")
            raw = buffers[b].array(0, np.uint8)
            if raw is None and buffers[b].scalar(1, "Q", 0):
                raise UnsupportedOpError(f"tensor #{i} {name!r}: buffers stored outside the flatbuffer "
                                         "(offset/size) are not supported")
            if raw is not None and raw.size:
                if dtype not in _NP:
                    raise FormatError(f"constant tensor #{i} {name!r} has unsupported type {dtype}")
                dt = np.dtype(_NP[dtype]).newbyteorder("<")
                if raw.size != math.prod(shape) * dt.itemsize:
                    raise FormatError(f"constant tensor #{i} {name!r}: buffer of {raw.size} bytes for shape {shape} "
                                      f"{dtype}")
                data = np.frombuffer(raw.tobytes(), dt).reshape(shape).astype(_NP[dtype])
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


class _Builder:
    """Turns the file's operators into graph nodes."""

    def __init__(self, tensors: list[_FileTensor]):
        self.ft = tensors
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []

    # -- tensors
    def act(self, i: int, where: str) -> str:
        """The graph tensor of activation tensor ``i`` (per-example shape)."""
        t = self.ft[i]
        if t.data is not None:
            raise UnsupportedOpError(f"{where}: a constant tensor {t.name!r} as a data input is not supported")
        if t.name in self.tensors:
            return t.name
        if t.dtype == "float32":
            raise FormatError(f"{where}: tensor {t.name!r} is float32: hwjax.tflite runs integer-quantised (int8) "
                              "models; this is a float model (or has a float interface)")
        if t.dtype not in ("int8", "uint8"):
            raise FormatError(f"{where}: activation tensor {t.name!r} has type {t.dtype}; int8 or uint8 expected")
        if t.scale is None:
            raise FormatError(f"{where}: tensor {t.name!r} has no quantisation parameters")
        if t.scale.size != 1:
            raise UnsupportedOpError(f"{where}: activation tensor {t.name!r} is quantised per channel")
        if len(t.shape) < 1 or t.shape[0] != 1:
            raise UnsupportedOpError(f"{where}: activation tensor {t.name!r} has shape {t.shape}; hwjax.tflite "
                                     "needs a leading batch axis of 1 (batches replace it)")
        self.tensors[t.name] = Tensor(t.name, tuple(t.shape[1:]), t.dtype,
                                      Quant.of(np.float32(t.scale[0]), np.int32(t.zero_point[0])))
        return t.name

    def const(self, i: int, where: str, what: str) -> _FileTensor:
        if i < 0:
            raise FormatError(f"{where}: the {what} input is missing")
        t = self.ft[i]
        if t.data is None:
            raise UnsupportedOpError(f"{where}: the {what} must be a constant tensor, {t.name!r} is computed")
        return t

    def node(self, op, inputs, out_i, attrs, params=None, act=None, where=""):
        out = self.act(out_i, where)
        if act is not None:
            pre = f"{out}:pre_activation"
            self.tensors[pre] = Tensor(pre, self.tensors[out].shape, self.tensors[out].dtype, self.tensors[out].quant)
            self.nodes.append(Node(op, inputs, (pre,), attrs, params, name=pre))
            self.nodes.append(Node("activation", (pre,), (out,), {"fn": act}, None, name=out))
        else:
            self.nodes.append(Node(op, inputs, (out,), attrs, params, name=out))


def _w_scales(w: _FileTensor, n: int, axis: int, where: str) -> np.ndarray:
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


def _bias(b: _FileTensor | None, n: int, where: str) -> np.ndarray:
    if b is None:
        return np.zeros((n,), np.int32)
    if b.dtype != "int32" or b.data.shape != (n,):
        raise FormatError(f"{where}: bias {b.name!r} must be int32 ({n},), got {b.dtype} {b.data.shape}")
    return b.data.astype(np.int32)


def _options(op: fb.Table) -> fb.Table | None:
    return op.table(4)


def _explicit_padding(in_hw, k, stride, padding, dilation=(1, 1)):
    return conv_geometry(in_hw, k, stride, padding, dilation).padding


def _convert(b: _Builder, k: int, name: str, op: fb.Table, ins: list[int], outs: list[int]) -> None:
    where = f"operator #{k} ({name})"
    opt = _options(op)
    if len(outs) != 1:
        raise UnsupportedOpError(f"{where}: {len(outs)} outputs")
    o = outs[0]
    if name == "FULLY_CONNECTED":
        x = b.act(ins[0], where)
        w = b.const(ins[1], where, "filter")
        bias = b.const(ins[2], where, "bias") if len(ins) > 2 and ins[2] >= 0 else None
        act = _ACT.get(opt.scalar(0, "b", 0) if opt else 0, "?")
        if opt is not None and (opt.scalar(1, "b", 0) != 0 or opt.scalar(2, "b", 0) != 0):
            raise UnsupportedOpError(f"{where}: shuffled weights or keep_num_dims are not supported")
        if w.data.ndim != 2 or b.tensors[x].shape != (w.data.shape[1],):
            raise UnsupportedOpError(f"{where}: input {b.ft[ins[0]].shape} and filter {w.data.shape}: only (1, I) "
                                     "inputs are supported")
        n = w.data.shape[0]
        params = {"kernel": jnp.asarray(w.data, jnp.int8), "bias": jnp.asarray(_bias(bias, n, where)),
                  "w_scale": jnp.asarray(_w_scales(w, n, 0, where))}  # (1,) per tensor: TFLite's float32 product
        _act(where, act)
        b.node("dense", (x,), o, {"features": n, "activation": "relu" if act == "relu" else None}, params,
               act if act not in (None, "relu") else None, where)
    elif name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        x = b.act(ins[0], where)
        w = b.const(ins[1], where, "filter")
        bias = b.const(ins[2], where, "bias") if len(ins) > 2 and ins[2] >= 0 else None
        dw = name == "DEPTHWISE_CONV_2D"
        padding = _PADDING.get(opt.scalar(0, "b", 0) if opt else 0)
        stride = (opt.scalar(2, "i", 0), opt.scalar(1, "i", 0)) if opt else (0, 0)
        i_act, i_dw, i_dh = (4, 5, 6) if dw else (3, 4, 5)
        act = _ACT.get(opt.scalar(i_act, "b", 0) if opt else 0, "?")
        dil = (opt.scalar(i_dh, "i", 1), opt.scalar(i_dw, "i", 1)) if opt else (1, 1)
        if padding is None or min(stride) < 1:
            raise FormatError(f"{where}: bad padding or strides {stride}")
        if dil != (1, 1):
            raise UnsupportedOpError(f"{where}: dilation {dil} is not supported yet (dilation 1 only)")
        _act(where, act)
        in_shape = b.tensors[x].shape
        if len(in_shape) != 3 or w.data.ndim != 4:
            raise FormatError(f"{where}: input {in_shape} / filter {w.data.shape} are not NHWC / 4-D")
        if dw:
            c = in_shape[2]
            if w.data.shape[0] != 1 or w.data.shape[3] != c:
                raise UnsupportedOpError(f"{where}: depth multiplier {w.data.shape[3] // max(c, 1)} (filter "
                                         f"{w.data.shape}, {c} input channels): only multiplier 1 is supported")
            kern, n, axis = w.data[0], c, 3
        else:
            if w.data.shape[3] != in_shape[2]:
                raise UnsupportedOpError(f"{where}: grouped convolution (filter {w.data.shape}, input {in_shape})")
            kern, n, axis = w.data, w.data.shape[0], 0
        ks = tuple(kern.shape[:2]) if dw else tuple(kern.shape[1:3])
        pads = _explicit_padding(in_shape[:2], ks, stride, padding)
        s = _w_scales(w, n, axis, where)
        params = {"kernel": jnp.asarray(kern, jnp.int8), "bias": jnp.asarray(_bias(bias, n, where)),
                  "w_scale": jnp.asarray(np.broadcast_to(s, (n,)).astype(np.float32))}
        attrs = {"kernel_size": ks, "stride": stride, "padding": pads,
                 "activation": "relu" if act == "relu" else None}
        if not dw:
            attrs["features"] = n
        b.node("depthwise_conv" if dw else "conv", (x,), o, attrs, params,
               act if act not in (None, "relu") else None, where)
    elif name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        x = b.act(ins[0], where)
        padding = _PADDING.get(opt.scalar(0, "b", 0) if opt else 0)
        stride = (opt.scalar(2, "i", 0), opt.scalar(1, "i", 0)) if opt else (0, 0)
        window = (opt.scalar(4, "i", 0), opt.scalar(3, "i", 0)) if opt else (0, 0)
        act = _ACT.get(opt.scalar(5, "b", 0) if opt else 0, "?")
        _act(where, act)
        if padding is None or min(stride) < 1 or min(window) < 1:
            raise FormatError(f"{where}: bad padding, strides {stride} or window {window}")
        _same_quant(b, ins[0], o, where)
        fn = "avg" if name == "AVERAGE_POOL_2D" else "max"
        if padding == "VALID":
            b.node(fn + "pool", (x,), o, {"window": window, "strides": stride}, None, act, where)
        else:
            pads = _explicit_padding(b.tensors[x].shape[:2], window, stride, padding)
            b.node("pool", (x,), o, {"fn": fn, "window": window, "strides": stride, "padding": pads}, None, act, where)
    elif name == "ADD":
        if len(ins) != 2:
            raise FormatError(f"{where}: takes 2 inputs, got {len(ins)}")
        x1, x2 = b.act(ins[0], where), b.act(ins[1], where)
        if b.tensors[x1].shape != b.tensors[x2].shape:
            raise UnsupportedOpError(f"{where}: broadcasting ADD ({b.ft[ins[0]].shape} + {b.ft[ins[1]].shape}) is "
                                     "not supported")
        act = _ACT.get(opt.scalar(0, "b", 0) if opt else 0, "?")
        _act(where, act)
        b.node("add", (x1, x2), o, {"activation": "relu" if act == "relu" else None}, None,
               act if act not in (None, "relu") else None, where)
    elif name == "RESHAPE":
        x = b.act(ins[0], where)
        _same_quant(b, ins[0], o, where)
        out = b.ft[o]
        if len(out.shape) < 1 or out.shape[0] != 1:
            raise UnsupportedOpError(f"{where}: output shape {out.shape} has no leading batch axis of 1")
        shape = tuple(out.shape[1:])
        if len(shape) == 1:
            b.node("flatten", (x,), o, {}, None, None, where)
        else:
            b.node("reshape", (x,), o, {"shape": shape}, None, None, where)
    elif name in ("RELU", "RELU6", "RELU_N1_TO_1"):
        x = b.act(ins[0], where)
        b.node("activation", (x,), o, {"fn": name.lower()}, None, None, where)
    elif name == "QUANTIZE":
        t = b.ft[ins[0]]
        if t.dtype == "float32":
            raise UnsupportedOpError(f"{where}: QUANTIZE from float32 (a float model interface) is not supported; "
                                     "int8 -> int8 requantisation is")
        x = b.act(ins[0], where)
        b.node("requantize", (x,), o, {}, None, None, where)
    else:  # pragma: no cover - filtered by the caller
        raise UnsupportedOpError(name)


def _act(where: str, act) -> None:
    if act == "?":
        raise UnsupportedOpError(f"{where}: unsupported fused activation")


def _same_quant(b: _Builder, i: int, o: int, where: str) -> None:
    ti, to = b.ft[i], b.ft[o]
    if ti.dtype != to.dtype or ti.scale is None or to.scale is None or not (
            np.array_equal(ti.scale, to.scale) and np.array_equal(ti.zero_point, to.zero_point)):
        raise UnsupportedOpError(f"{where}: input and output quantisation differ ({ti.scale}, {ti.zero_point} vs "
                                 f"{to.scale}, {to.zero_point})")


def _read(data: bytes):
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
    b = _Builder(ft)
    inputs = [int(i) for i in (sub.array(1, np.int32) if sub.array(1, np.int32) is not None else [])]
    outputs = [int(i) for i in (sub.array(2, np.int32) if sub.array(2, np.int32) is not None else [])]
    for i in inputs:
        b.act(i, f"model input #{i}")
    ops = sub.tables(3)
    for k, op in enumerate(ops):
        idx = op.scalar(0, "I", 0)
        if idx >= len(codes):
            raise FormatError(f"operator #{k} refers to operator code {idx}; the file has {len(codes)}")
        code, custom = codes[idx]
        name = f"CUSTOM({custom})" if code == 32 else OPS.get(code, f"BUILTIN_OPERATOR_{code}")
        if name not in SUPPORTED_OPS:
            raise UnsupportedOpError(f"operator #{k} is {name}, which hwjax.tflite does not support; supported: "
                                     f"{list(SUPPORTED_OPS)}")
        ins = [int(i) for i in (op.array(1, np.int32) if op.array(1, np.int32) is not None else [])]
        outs = [int(i) for i in (op.array(2, np.int32) if op.array(2, np.int32) is not None else [])]
        for i in ins + outs:
            if i >= len(ft):
                raise FormatError(f"operator #{k} ({name}) refers to tensor {i}; the subgraph has {len(ft)}")
        _convert(b, k, name, op, ins, outs)
    used = {t for n in b.nodes for t in (*n.inputs, *n.outputs)} | {ft[i].name for i in inputs}
    tensors = {k: v for k, v in b.tensors.items() if k in used}
    for i in outputs:
        if ft[i].name not in tensors:
            raise FormatError(f"model output {ft[i].name!r} is never written")
    graph = Graph(tensors, b.nodes, [ft[i].name for i in inputs], [ft[i].name for i in outputs]).validate()

    def info(i):
        t = ft[i]
        return TensorInfo(t.name, t.shape, t.dtype, np.asarray(t.scale, np.float32), np.asarray(t.zero_point),
                          t.axis)

    return graph, tuple(info(i) for i in inputs), tuple(info(i) for i in outputs)


class Model:
    """An int8 ``.tflite`` model, runnable bit-exactly as each LiteRT runtime runs it.

    Attributes:
      graph: the portable :class:`hwjax.graph.Graph` (its nodes keep the file's int8
        weights, int32 biases and float32 scales).
      inputs, outputs: :class:`TensorInfo` of the file's inputs and outputs.
    """

    def __init__(self, graph: Graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, tuple(inputs), tuple(outputs)
        self._lowered: dict[Any, Graph] = {}

    def __repr__(self):
        return f"Model({len(self.graph.nodes)} nodes, inputs {[i.shape for i in self.inputs]}, " \
               f"outputs {[o.shape for o in self.outputs]})"

    def target(self, runtime):
        from hwjax.targets import Target, get

        if isinstance(runtime, Target):
            return runtime
        if runtime == "xs3":
            raise UnsupportedOpError("runtime 'xs3' (xformer's XC ops) is not implemented yet")
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES} or a hwjax.targets.Target, got {runtime!r}")
        return get("tflite", runtime=runtime)

    def lowered(self, runtime="reference") -> Graph:
        """The graph lowered for ``runtime`` (its integer parameters; cached)."""
        t = self.target(runtime)
        if t not in self._lowered:
            self._lowered[t] = lower(self.graph, t)
        return self._lowered[t]

    def run(self, x, *, runtime="reference", intermediates: bool = False):
        """The model's output(s) for every sample of ``x``, as ``runtime`` computes them.

        Args:
          x: integer array (int8 or uint8 values, as the file's input) of shape
            ``(batch, *input_shape[1:])`` (the file's batch-1 axis replaced by the
            batch), or a sequence of such arrays for several inputs.
          runtime: ``"reference"``, ``"optimized"``, ``"xnnpack"``, ``"tflm"`` or a
            :class:`hwjax.targets.Target`.
          intermediates: also return a dict of every tensor by name (batched, int32).
        Returns:
          The output array (the file's dtype), a tuple for several outputs; then the
          intermediates when asked for.
        """
        g = self.lowered(runtime)
        xs = list(x) if isinstance(x, (tuple, list)) else [x]
        if len(xs) != len(self.inputs):
            raise ValueError(f"the model takes {len(self.inputs)} inputs, got {len(xs)}")
        arrays = []
        for info, a in zip(self.inputs, xs):
            a = jnp.asarray(a)
            per = tuple(info.shape[1:])
            if a.ndim != len(per) + 1 or tuple(a.shape[1:]) != per:
                raise ShapeError(f"input {info.name!r} must have shape (batch, {', '.join(map(str, per))}), "
                                 f"got {tuple(a.shape)}")
            if not jnp.issubdtype(a.dtype, jnp.integer):
                raise TypeError(f"input {info.name!r} must be an integer array ({info.dtype} values), got {a.dtype}")
            lo, hi = (-128, 127) if info.dtype == "int8" else (0, 255)
            if not isinstance(a, jax.core.Tracer) and a.size and (int(a.min()) < lo or int(a.max()) > hi):
                raise ValueError(f"input {info.name!r} holds values outside {info.dtype} [{lo}, {hi}]")
            arrays.append(a.astype(jnp.int32))
        res = jit_run(g, tuple(arrays), intermediates=intermediates)
        out = res[0] if intermediates else res
        outs = out if isinstance(out, tuple) else (out,)
        outs = tuple(o.astype(_NP[info.dtype]) for o, info in zip(outs, self.outputs))
        y = outs[0] if len(outs) == 1 else outs
        return (y, res[1]) if intermediates else y


def load(path_or_bytes) -> Model:
    """Reads an int8 ``.tflite`` model (a path or the file's bytes) into a :class:`Model`.

    Raises :class:`hwjax.errors.FormatError` for a file that is not a TFLite flatbuffer,
    is truncated, or is a float model, and :class:`hwjax.errors.UnsupportedOpError`
    naming the first operator (index and name) outside :data:`SUPPORTED_OPS`.
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        with open(path_or_bytes, "rb") as f:
            data = f.read()
    else:
        raise TypeError(f"load takes a path or bytes, got {type(path_or_bytes).__name__}")
    try:
        graph, ins, outs = _read(data)
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, (FormatError, UnsupportedOpError, ShapeError)):
            raise
        raise FormatError(f"corrupt TFLite flatbuffer: {type(e).__name__}: {e}") from None
    return Model(graph, ins, outs)
