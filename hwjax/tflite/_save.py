"""The TFLite writer: a portable :class:`hwjax.graph.Graph` back into a ``.tflite`` file,
the mirror of the importer (:mod:`hwjax.tflite._import`).

Each graph op kind has one writer, registered with :func:`writes`; a writer reads its
node and emits TFLite operators through a :class:`FileBuilder`. Op kinds defined in
other modules register their writer in their own module: adding one is one decorated
function, never a branch here. :func:`writable_ops` is what the registry holds.

Fused activations: the importer turns a TFLite operator with a fused RELU6 or
RELU_N1_TO_1 (and a pool with any fused activation) into the op's node writing
``<out> + PRE_ACTIVATION`` (the importer's constant ``":pre_activation"``) followed by
an ``activation`` node writing ``<out>``. The writer fuses such a pair back into one
operator when the op's writer declares the function in ``fuses``, the intermediate
tensor is read by the activation alone, is no graph output, and has the activation
output's quantisation; any other ``activation`` node becomes a standalone RELU / RELU6 /
RELU_N1_TO_1 operator. So ``load(save(load(f)))`` has the nodes, attributes and
parameters of ``load(f)``.

Writers are registered for the op kinds the importer produces from builtin operators
(this module: the linear ops, pools, ADD, the clamping activations, QUANTIZE, RESHAPE;
:mod:`hwjax.tflite._convert_tensor` and :mod:`hwjax.tflite._convert_nonlinear`: the
writer of each of their op kinds next to its converter) and for xformer's ``xc_*`` op
kinds (:mod:`hwjax.tflite._xcore`: each written back as its ``XC_*`` custom operator,
options as a flexbuffer map, weights and parameters in the layouts xformer writes).

Model metadata: :func:`save` of a :class:`hwjax.tflite.Model` copies the file's
metadata entries (``Model.metadata``; xformer's ``xcoreSharedConfig``, which the xcore
runtime reads, and ``min_runtime_version``) except those that index the file's tensors
(:data:`DROPPED_METADATA`: ``OfflineMemoryAllocation``, an arena plan of the original
tensor numbering; the runtime then plans the arena itself). Saving a bare Graph writes
no metadata.

Writing needs the ``flatbuffers`` package and ``ai_edge_litert`` (its flatbuffer object
API ``schema_py_generated``), imported on first use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from hwjax.errors import ArgTypeError, FileError, FormatError, RangeError, ShapeError, UnsupportedOpError
from hwjax.graph import PRE_ACTIVATION, Graph, Node, Quant

#: TFLite ``ActivationFunctionType`` codes of the graph's activation functions
ACTIVATION_CODES = {None: 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}
_TENSOR_TYPES = {"float32": "FLOAT32", "int32": "INT32", "uint8": "UINT8", "int8": "INT8", "int16": "INT16"}
_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}
#: metadata entries :func:`save` does not copy: they refer to the original file's tensor indices
DROPPED_METADATA = ("OfflineMemoryAllocation",)


def _schema():
    """``(schema_py_generated, flatbuffers)``; ImportError naming the packages otherwise."""
    try:
        import flatbuffers
        import ai_edge_litert.schema_py_generated as schema
    except ImportError as e:
        raise ImportError(
            "hwjax.tflite.save needs the 'flatbuffers' and 'ai-edge-litert' packages "
            "(pip install ai-edge-litert, which brings flatbuffers; or the hwjax 'test' extra): "
            f"{e}"
        ) from None
    return schema, flatbuffers


# ------------------------------------------------------------------------ registry


WriterFn = Callable[["FileBuilder", Node], None]


@dataclass(frozen=True)
class _Entry:
    fn: WriterFn
    fuses: tuple[str, ...]


_WRITERS: dict[str, _Entry] = {}


def writes(*kinds: str, fuses: tuple[str, ...] = ()) -> Callable[[WriterFn], WriterFn]:
    """Registers the decorated ``fn(builder, node)`` as the writer of graph op ``kinds``.

    ``fuses``: the ``activation`` functions (``"relu"``, ``"relu6"``,
    ``"relu_n1_to_1"``) the written operator can carry as its fused activation; the
    writer then reads the node's output and activation with
    :meth:`FileBuilder.output`. ValueError when a kind already has a writer.
    """

    def deco(fn: WriterFn) -> WriterFn:
        for k in kinds:
            if k in _WRITERS:
                raise RangeError(f"graph op kind {k!r} already has a TFLite writer")
            _WRITERS[k] = _Entry(fn, tuple(fuses))
        return fn

    return deco


def writable_ops() -> tuple[str, ...]:
    """The graph op kinds :func:`save` writes, sorted."""
    return tuple(sorted(_WRITERS))


# ------------------------------------------------------------------------- builder


def same_quant(a: Optional[Quant], b: Optional[Quant]) -> bool:
    """Both quantisations are None, or both have equal axis, scales and zero points."""
    if a is None or b is None:
        return a is b
    return (
        a.axis == b.axis
        and np.array_equal(np.asarray(a.scale), np.asarray(b.scale))
        and np.array_equal(np.asarray(a.zero_point), np.asarray(b.zero_point))
    )


def fusion_plan(graph: Graph) -> dict[str, Node]:
    """``{producer node name: activation node}`` for every ``activation`` node to fuse
    into its producer (the conditions in the module docstring)."""
    plan = {}
    for node in graph.nodes:
        if node.op != "activation":
            continue
        pre, out = node.inputs[0], node.outputs[0]
        producer = graph.producer(pre)
        entry = _WRITERS.get(producer.op) if producer is not None else None
        if (
            pre == out + PRE_ACTIVATION
            and entry is not None
            and node.attrs["fn"] in entry.fuses
            and producer.attrs.get("activation") is None
            and pre not in graph.outputs
            and [c.name for c in graph.consumers(pre)] == [node.name]
            and len(producer.outputs) == 1
            and same_quant(graph.tensors[pre].quant, graph.tensors[out].quant)
        ):
            plan[producer.name] = node
    return plan


class FileBuilder:
    """The ``.tflite`` being written: one subgraph, filled by the writers.

    ``graph`` is the graph being saved; ``schema`` the flatbuffer object API module.
    Activation tensors are added on first use (:meth:`tensor`), constants with
    :meth:`const`, operators with :meth:`op`.
    """

    def __init__(self, graph: Graph, fused: dict[str, Node], metadata: Optional[dict] = None):
        self.graph, self.fused = graph, fused
        self.metadata = {str(k): bytes(v) for k, v in (metadata or {}).items() if k not in DROPPED_METADATA}
        self.schema, self._fb = _schema()
        self.buffers = [self.schema.BufferT()]  # buffer 0: the empty buffer of computed tensors
        self.tensors: list = []
        self._index: dict[str, int] = {}
        self.operators: list = []
        self.codes: dict[tuple[int, str], tuple[int, int]] = {}  # (builtin, custom) -> (index, version)

    # -- tensors
    def _add(self, name: str, shape, dtype: str, buffer: int, scale=None, zero_point=None, axis: int = 0) -> int:
        s = self.schema
        t = s.TensorT()
        t.name, t.shape, t.buffer = name, np.asarray(shape, np.int32), buffer
        t.type = getattr(s.TensorType, _TENSOR_TYPES[dtype])
        if scale is not None:
            q = s.QuantizationParametersT()
            q.scale = np.asarray(scale, np.float32).reshape(-1)
            q.zeroPoint = np.broadcast_to(np.asarray(zero_point, np.int64).reshape(-1), q.scale.shape).copy()
            q.quantizedDimension = int(axis)
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def tensor(self, name: str) -> int:
        """The file tensor of graph tensor ``name``: shape ``(1, *shape)``, its dtype and
        per-tensor quantisation (added on first use)."""
        if name in self._index:
            return self._index[name]
        t = self.graph.tensor(name)
        if t.dtype not in ("int8", "uint8"):
            raise UnsupportedOpError(f"tensor {name!r} is {t.dtype}: hwjax.tflite.save writes int8/uint8 activations")
        if t.quant is None or np.asarray(t.quant.scale).size != 1:
            raise UnsupportedOpError(f"tensor {name!r} needs one (per-tensor) scale and zero point, got {t.quant}")
        scale = np.asarray(t.quant.scale, np.float32).reshape(1)
        if not (np.isfinite(scale).all() and scale[0] > 0):
            raise RangeError(f"tensor {name!r} has scale {scale[0]}; a positive finite float32 is needed")
        self._index[name] = self._add(name, (1, *t.shape), t.dtype, 0, scale, np.asarray(t.quant.zero_point))
        return self._index[name]

    def float_tensor(self, name: str) -> int:
        """The file tensor of float32 graph tensor ``name`` (no quantisation; shape
        ``(1, *shape)``), added on first use: the output of a ``dequantize`` node.
        UnsupportedOpError for any other dtype or a quantised tensor."""
        if name in self._index:
            return self._index[name]
        t = self.graph.tensor(name)
        if t.dtype != "float32" or t.quant is not None:
            raise UnsupportedOpError(
                f"tensor {name!r} is {t.dtype} with quantisation {t.quant}; an unquantised float32 tensor is expected"
            )
        self._index[name] = self._add(name, (1, *t.shape), "float32", 0)
        return self._index[name]

    def const(self, name: str, data, dtype: str, scale=None, zero_point=None, axis: int = 0) -> int:
        """A constant tensor holding ``data`` as ``dtype`` (little-endian), with optional
        quantisation; its values must fit ``dtype`` (RangeError naming ``name``)."""
        arr = np.asarray(data)
        lo, hi = _RANGES.get(dtype, (None, None))
        if lo is not None and arr.size and (arr.min() < lo or arr.max() > hi):
            raise RangeError(f"{name}: values in [{arr.min()}, {arr.max()}] do not fit {dtype} [{lo}, {hi}]")
        b = self.schema.BufferT()
        b.data = np.frombuffer(np.ascontiguousarray(arr.astype(np.dtype(dtype).newbyteorder("<"))).tobytes(), np.uint8)
        self.buffers.append(b)
        return self._add(name, arr.shape, dtype, len(self.buffers) - 1, scale, zero_point, axis)

    def scratch(self, name: str, size: int, dtype: str = "int8") -> int:
        """A computed 1-D tensor of ``size`` elements without quantisation (an operator's
        scratch memory, e.g. xformer's im2col buffers): the runtime allocates it."""
        return self._add(name, (int(size),), dtype, 0)

    def output(self, node: Node) -> tuple[int, int]:
        """``(file tensor, activation code)`` of ``node``'s output: the fused activation
        node's output and function where the plan fuses one, else the node's own output
        and its ``activation`` attribute."""
        act = self.fused.get(node.name)
        if act is not None:
            return self.tensor(act.outputs[0]), ACTIVATION_CODES[act.attrs["fn"]]
        return self.tensor(node.outputs[0]), ACTIVATION_CODES[node.attrs.get("activation")]

    # -- operators
    def op(
        self,
        name: str,
        inputs,
        outputs,
        options: Optional[tuple[str, dict]] = None,
        version: int = 1,
        custom_options: Optional[bytes] = None,
    ) -> None:
        """Appends operator ``name`` (a builtin such as ``"CONV_2D"`` or ``"CUSTOM(name)"``)
        reading and writing file tensors; ``options`` is ``(OptionsTableName, fields)``
        (e.g. ``("AddOptions", {"fusedActivationFunction": 3})``)."""
        s = self.schema
        custom = name[7:-1] if name.startswith("CUSTOM(") and name.endswith(")") else ""
        code = s.BuiltinOperator.CUSTOM if custom else getattr(s.BuiltinOperator, name)
        if (code, custom) not in self.codes:
            self.codes[(code, custom)] = (len(self.codes), version)
        o = s.OperatorT()
        o.opcodeIndex = self.codes[(code, custom)][0]
        o.inputs, o.outputs = np.asarray(inputs, np.int32), np.asarray(outputs, np.int32)
        if options is not None:
            kind, fields = options
            opt = getattr(s, kind + "T")()
            for k, v in fields.items():
                if not hasattr(opt, k):
                    raise AttributeError(f"{kind} has no field {k!r}")
                setattr(opt, k, v)
            o.builtinOptionsType, o.builtinOptions = getattr(s.BuiltinOptions, kind), opt
        if custom_options is not None:
            o.customOptions = np.frombuffer(bytes(custom_options), np.uint8)
        self.operators.append(o)

    def finish(self) -> bytes:
        """The file's bytes (schema version 3, identifier ``TFL3``)."""
        s = self.schema
        sg = s.SubGraphT()
        sg.name = "main"
        sg.tensors, sg.operators = self.tensors, self.operators
        sg.inputs = np.asarray([self.tensor(t) for t in self.graph.inputs], np.int32)
        sg.outputs = np.asarray([self.tensor(t) for t in self.graph.outputs], np.int32)
        m = s.ModelT()
        m.version, m.description = 3, "hwjax.tflite.save"
        m.subgraphs, m.buffers = [sg], self.buffers
        m.metadata = []
        for name, data in self.metadata.items():
            buf = s.BufferT()
            buf.data = np.frombuffer(data, np.uint8)
            self.buffers.append(buf)
            md = s.MetadataT()
            md.name, md.buffer = name, len(self.buffers) - 1
            m.metadata.append(md)
        m.metadata = m.metadata or None
        m.operatorCodes = []
        for (code, custom), (_, version) in sorted(self.codes.items(), key=lambda kv: kv[1][0]):
            c = s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), version
            c.customCode = custom or None
            m.operatorCodes.append(c)
        b = self._fb.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


# -------------------------------------------------------------------------- helpers


def where(node: Node) -> str:
    """``"node 'name' (op)"``, the prefix of every error message about a node."""
    return f"node {node.name!r} ({node.op})"


def param(node: Node, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """``node.params[key]`` as a numpy array of ``shape`` (ShapeError naming both)."""
    try:
        arr = np.asarray(node.params[key])
    except (KeyError, TypeError):
        raise FormatError(f"{where(node)}: parameter {key!r} is missing") from None
    if arr.shape != tuple(shape):
        raise ShapeError(f"{where(node)}: parameter {key!r} has shape {arr.shape}, expected {tuple(shape)}")
    if not np.issubdtype(arr.dtype, np.number):
        raise FormatError(f"{where(node)}: parameter {key!r} has dtype {arr.dtype}")
    return arr


def integer_param(node: Node, key: str, shape) -> np.ndarray:
    """An integer-valued parameter (FormatError for fractional values) as int64."""
    arr = param(node, key, shape)
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.round(arr)):
            raise FormatError(f"{where(node)}: parameter {key!r} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def constant_operand(b: FileBuilder, node: Node) -> int:
    """The int8 constant tensor of a node's constant operand: the parameter ``value``
    quantised per tensor by ``scale`` (positive, finite) and ``zero_point``. A ``value``
    with as many axes as an example is written with the batch axis prepended (shape
    ``(1, *value.shape)``), as the reader drops it; one with fewer axes as it is (a
    broadcast)."""
    value = integer_param(node, "value", np.shape((node.params or {}).get("value")))
    scale = np.asarray(param(node, "scale", ()), np.float32)
    zero_point = integer_param(node, "zero_point", ())
    if not (np.isfinite(scale) and scale > 0):
        raise RangeError(f"{where(node)}: parameter 'scale' must be positive and finite, got {scale}")
    if value.ndim == len(b.graph.tensor(node.outputs[0]).shape):
        value = value[None]
    return b.const(f"{node.name}/operand", value, "int8", scale.reshape(1), zero_point.reshape(1))


def weight_scales(node: Node, n: int, per_tensor_if_equal: bool) -> np.ndarray:
    """``w_scale`` of a linear node: (1,) or (n,) positive finite float32 values. With
    ``per_tensor_if_equal`` n equal values are written as one per-tensor scale."""
    try:
        s = np.asarray(node.params["w_scale"], np.float32).reshape(-1)
    except (KeyError, TypeError):
        raise FormatError(f"{where(node)}: parameter 'w_scale' is missing") from None
    if s.size not in (1, n):
        raise ShapeError(f"{where(node)}: parameter 'w_scale' has {s.size} values for {n} channels")
    if not (np.all(np.isfinite(s)) and np.all(s > 0)):
        raise RangeError(f"{where(node)}: parameter 'w_scale' must be positive and finite, got {s}")
    return s[:1] if per_tensor_if_equal and np.all(s == s[0]) else s


def _bias(b: FileBuilder, node: Node, n: int, s_w: np.ndarray) -> int:
    s_in = np.float32(np.asarray(b.graph.tensor(node.inputs[0]).quant.scale).reshape(-1)[0])
    bias = integer_param(node, "bias", (n,))
    return b.const(f"{node.name}/bias", bias, "int32", (s_in * s_w).astype(np.float32), np.zeros(s_w.shape), 0)


def padding_name(node: Node, in_hw, window, stride, padding, dilation=(1, 1)) -> int:
    """TFLite ``Padding`` code of explicit ``padding``: SAME (0) where it is SAME's
    padding (of the dilated window), else VALID (1) where it is zero; UnsupportedOpError
    otherwise."""
    from hwjax.litert import conv_geometry

    pads = tuple(tuple(int(v) for v in p) for p in padding)
    if pads == conv_geometry(in_hw, window, stride, "SAME", dilation).padding:
        return 0
    if pads == ((0, 0), (0, 0)):
        return 1
    raise UnsupportedOpError(
        f"{where(node)}: padding {pads} is neither TFLite SAME nor VALID for input "
        f"{tuple(in_hw)}, window {tuple(window)} and stride {tuple(stride)}"
    )


def _int_pair(v) -> tuple[int, int]:
    return tuple(int(i) for i in v)  # type: ignore[return-value]


# ------------------------------------------------------------------------- writers

_ALL_ACTS = ("relu", "relu6", "relu_n1_to_1")


@writes("dense", fuses=("relu6", "relu_n1_to_1"))
def _dense(b: FileBuilder, node: Node) -> None:
    *rows, n_in = b.graph.tensor(node.inputs[0]).shape
    n = int(node.attrs["features"])
    s_w = weight_scales(node, n, False)
    w = b.const(f"{node.name}/kernel", integer_param(node, "kernel", (n, n_in)), "int8", s_w, np.zeros(s_w.shape), 0)
    out, act = b.output(node)
    fields = {"fusedActivationFunction": act}
    if rows:  # one product per row of an (..., n_in) input: keep_num_dims
        fields["keepNumDims"] = True
    b.op(
        "FULLY_CONNECTED",
        [b.tensor(node.inputs[0]), w, _bias(b, node, n, s_w)],
        [out],
        ("FullyConnectedOptions", fields),
        version=4 if s_w.size > 1 else 1,
    )


@writes("conv", "depthwise_conv", fuses=("relu6", "relu_n1_to_1"))
def _conv(b: FileBuilder, node: Node) -> None:
    h, w_, c = b.graph.tensor(node.inputs[0]).shape
    kh, kw = _int_pair(node.attrs["kernel_size"])
    stride = _int_pair(node.attrs["stride"])
    dil = _int_pair(node.attrs.get("dilation", (1, 1)))
    pad = padding_name(node, (h, w_), (kh, kw), stride, node.attrs["padding"], dil)
    out, act = b.output(node)
    fields = {
        "padding": pad,
        "strideH": stride[0],
        "strideW": stride[1],
        "fusedActivationFunction": act,
        "dilationHFactor": dil[0],
        "dilationWFactor": dil[1],
    }
    if node.op == "depthwise_conv":
        mult = int(node.attrs.get("depth_multiplier", 1))
        n = c * mult
        s_w = weight_scales(node, n, True)
        kern = integer_param(node, "kernel", (kh, kw, n))[None]
        w = b.const(f"{node.name}/kernel", kern, "int8", s_w, np.zeros(s_w.shape), 3)
        name, opts = "DEPTHWISE_CONV_2D", ("DepthwiseConv2DOptions", {**fields, "depthMultiplier": mult})
    else:
        n = int(node.attrs["features"])
        s_w = weight_scales(node, n, True)
        kern = integer_param(node, "kernel", (n, kh, kw, c))
        w = b.const(f"{node.name}/kernel", kern, "int8", s_w, np.zeros(s_w.shape), 0)
        name, opts = "CONV_2D", ("Conv2DOptions", fields)
    b.op(name, [b.tensor(node.inputs[0]), w, _bias(b, node, n, s_w)], [out], opts, version=3)


def _pool_op(b: FileBuilder, node: Node, fn: str, padding) -> None:
    """A pool operator; ``padding`` None is VALID (``maxpool``/``avgpool``, read back as
    such even where SAME would pad nothing), else explicit pairs."""
    t_in = b.graph.tensor(node.inputs[0])
    window, stride = _int_pair(node.attrs["window"]), _int_pair(node.attrs["strides"])
    pad = 1 if padding is None else padding_name(node, t_in.shape[:2], window, stride, padding)
    out, act = b.output(node)
    out_name = b.tensors[out].name
    if not same_quant(t_in.quant, b.graph.tensor(out_name).quant):
        raise UnsupportedOpError(
            f"{where(node)}: TFLite pools keep the quantisation; input {node.inputs[0]!r} and "
            f"output {out_name!r} differ"
        )
    b.op(
        "AVERAGE_POOL_2D" if fn == "avg" else "MAX_POOL_2D",
        [b.tensor(node.inputs[0])],
        [out],
        (
            "Pool2DOptions",
            {
                "padding": pad,
                "strideH": stride[0],
                "strideW": stride[1],
                "filterHeight": window[0],
                "filterWidth": window[1],
                "fusedActivationFunction": act,
            },
        ),
        version=2,
    )


@writes("maxpool", "avgpool", fuses=_ALL_ACTS)
def _valid_pool(b: FileBuilder, node: Node) -> None:
    _pool_op(b, node, node.op[:3], None)


@writes("pool", fuses=_ALL_ACTS)
def _padded_pool(b: FileBuilder, node: Node) -> None:
    _pool_op(b, node, node.attrs["fn"], node.attrs["padding"])


@writes("add", fuses=("relu6", "relu_n1_to_1"))
def _add(b: FileBuilder, node: Node) -> None:
    out, act = b.output(node)
    b.op(
        "ADD",
        [b.tensor(node.inputs[0]), b.tensor(node.inputs[1])],
        [out],
        ("AddOptions", {"fusedActivationFunction": act}),
        version=2,
    )


@writes("add_const", fuses=("relu6", "relu_n1_to_1"))
def _add_const(b: FileBuilder, node: Node) -> None:
    """``add_const`` -> ADD of the input and an int8 constant (``value`` quantised per tensor
    by ``scale``, ``zero_point``), in the operand order the node records. A ``value`` with as
    many axes as an example gets the batch axis prepended, as the reader drops it."""
    c = constant_operand(b, node)
    ins = [c, b.tensor(node.inputs[0])] if node.attrs.get("const_first") else [b.tensor(node.inputs[0]), c]
    out, act = b.output(node)
    b.op("ADD", ins, [out], ("AddOptions", {"fusedActivationFunction": act}), version=2)


@writes("activation")
def _activation(b: FileBuilder, node: Node) -> None:
    b.op(node.attrs["fn"].upper(), [b.tensor(node.inputs[0])], [b.tensor(node.outputs[0])])


@writes("requantize")
def _requantize(b: FileBuilder, node: Node) -> None:
    b.op("QUANTIZE", [b.tensor(node.inputs[0])], [b.tensor(node.outputs[0])], version=2)


@writes("flatten", "reshape")
def _reshape(b: FileBuilder, node: Node) -> None:
    t_in, t_out = b.graph.tensor(node.inputs[0]), b.graph.tensor(node.outputs[0])
    if not same_quant(t_in.quant, t_out.quant) or t_in.dtype != t_out.dtype:
        raise UnsupportedOpError(
            f"{where(node)}: TFLite RESHAPE keeps the quantisation; input {t_in.name!r} and "
            f"output {t_out.name!r} differ"
        )
    shape = [1, *(int(d) for d in t_out.shape)]
    shape_t = b.const(f"{node.name}/shape", np.asarray(shape, np.int32), "int32")
    b.op("RESHAPE", [b.tensor(t_in.name), shape_t], [b.tensor(t_out.name)], ("ReshapeOptions", {"newShape": shape}))


# ---------------------------------------------------------------------------- save


def to_bytes(graph: Graph, metadata: Optional[dict] = None) -> bytes:
    """The ``.tflite`` bytes of portable ``graph`` (see :func:`save`); ``metadata``:
    ``{name: bytes}`` entries to write (less :data:`DROPPED_METADATA`)."""
    if not isinstance(graph, Graph):
        raise ArgTypeError(f"expected a hwjax.graph.Graph, got {type(graph).__name__}")
    if graph.target is not None:
        raise FormatError(
            f"the graph is lowered for {graph.target.name}; save needs a portable graph "
            "(graph.target is None), e.g. Model.graph"
        )
    graph.validate()
    missing = sorted({n.op for n in graph.nodes} - set(_WRITERS))
    if missing:
        raise UnsupportedOpError(f"graph op kinds {missing} have no TFLite writer; writable: {list(writable_ops())}")
    plan = fusion_plan(graph)
    skip = {a.name for a in plan.values()}
    b = FileBuilder(graph, plan, metadata)
    for t in graph.inputs:
        b.tensor(t)
    for node in graph.nodes:
        if node.name not in skip:
            _WRITERS[node.op].fn(b, node)
    return b.finish()


def save(model_or_graph: Any, path=None) -> bytes:
    """Writes a :class:`hwjax.tflite.Model` (its ``graph``) or a portable
    :class:`hwjax.graph.Graph` as an int8 ``.tflite`` file that LiteRT loads and runs.

    Every node becomes the TFLite operator(s) its registered writer emits
    (:func:`writes`); inputs and outputs are the graph's, with shape ``(1, *shape)``.
    Activations are int8 / uint8 quantised per tensor; the float32 output of a
    ``dequantize`` node is an unquantised FLOAT32 tensor.
    Weights are written as int8, biases as int32 with scale ``s_in * w_scale`` (float32
    product), weight scales per channel (a conv/depthwise node whose scales are all
    equal gets one per-tensor scale, as :func:`load` broadcasts it back). ReLU6 and
    RELU_N1_TO_1 the importer split off are fused back (module docstring).
    xformer's ``xc_*`` nodes become their ``XC_*`` custom operators, and a Model's
    metadata is copied (less :data:`DROPPED_METADATA`), so an xformer-compiled file
    saves to a file the xcore runtime runs.

    Args:
      model_or_graph: a Model or a portable Graph (``graph.target is None``).
      path: file to write (str or PathLike); ``None`` writes nothing.
    Returns:
      The file's bytes.
    Raises:
      UnsupportedOpError: an op kind without a writer, or a configuration TFLite
        cannot express (padding neither SAME nor VALID, per-channel activations, a
        LOGISTIC output scale other than 1/256, ...).
      RangeError / ShapeError / FormatError: parameters outside int8/int32, of the
        wrong shape, or a malformed graph (each naming the node).
      FileError: ``path`` cannot be written (its folder is missing, no permission).
      ImportError: ``flatbuffers`` / ``ai-edge-litert`` are not installed.
    """
    graph = getattr(model_or_graph, "graph", model_or_graph)
    data = to_bytes(graph, getattr(model_or_graph, "metadata", None) if graph is not model_or_graph else None)
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise FileError(f"path {os.fspath(path)!r}: cannot be written ({e.strerror})") from None
    return data
