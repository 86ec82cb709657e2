"""Writing a graph of ONNX op kinds back as a QOperator-format ONNX model (:func:`save`)."""

from __future__ import annotations

import os

import numpy as np

from hwjax.errors import ArgTypeError, FileError, UnsupportedOpError
from hwjax.graph import Graph

_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6}
_NP = {"uint8": np.uint8, "int8": np.int8, "int32": np.int32, "float32": np.float32}
_MS = "com.microsoft"


class _Writer:
    def __init__(self, graph: Graph):
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.g = graph
        self.nodes, self.inits = [], []
        self.names: set[str] = set(graph.tensors)
        self.node_names: set[str] = set()

    def init(self, base: str, value) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        self.inits.append(self.nh.from_array(np.asarray(value), name))
        return name

    def q(self, tensor: str, where: str) -> list[str]:
        """The scale and zero point initializers of quantised ``tensor``."""
        t = self.g.tensors[tensor]
        if t.quant is None or np.size(t.quant.scale) != 1:
            raise UnsupportedOpError(f"{where}: tensor {tensor!r} needs a per-tensor quantisation")
        s = np.float32(np.asarray(t.quant.scale).reshape(()))
        z = _NP[t.dtype](int(np.asarray(t.quant.zero_point).reshape(())))
        return [self.init(f"{tensor}/scale", s), self.init(f"{tensor}/zero_point", z)]

    def node(self, op, ins, outs, name, domain="", **attrs):
        base, k = name, 0
        while name in self.node_names:  # ONNX node names are unique
            k += 1
            name = f"{base}_{k}"
        self.node_names.add(name)
        self.nodes.append(self.h.make_node(op, ins, outs, name=name, domain=domain, **attrs))


def _pads(attrs):
    (t, b), (l, r) = attrs.get("pads", ((0, 0), (0, 0)))
    return [int(t), int(l), int(b), int(r)]


def _window(attrs):
    return {
        "kernel_shape": [int(k) for k in attrs["kernel_size"]],
        "strides": [int(s) for s in attrs.get("strides", (1, 1))],
        "pads": _pads(attrs),
    }


def _write_node(w: _Writer, n) -> None:
    a, p, ins, outs, name = n.attrs, n.params or {}, list(n.inputs), list(n.outputs), n.name
    where = f"node {name!r} ({n.op})"
    if n.op == "quantize":
        w.node("QuantizeLinear", [ins[0], *w.q(outs[0], where)], outs, name)
    elif n.op == "dequantize":
        w.node("DequantizeLinear", [ins[0], *w.q(ins[0], where)], outs, name)
    elif n.op in ("qlinear_conv", "conv_integer"):
        weight = np.asarray(p["weight"])
        wz = np.asarray(p["w_zero_point"]).astype(weight.dtype)
        attrs = {**_window(a), "dilations": [int(d) for d in a.get("dilations", (1, 1))], "group": int(a["group"])}
        if n.op == "conv_integer":
            xz = np.asarray(p["x_zero_point"]).astype(_NP[w.g.tensors[ins[0]].dtype])
            wi = [ins[0], w.init(f"{name}/W", weight), w.init(f"{name}/x_zero_point", xz), w.init(f"{name}/wz", wz)]
            w.node("ConvInteger", wi, outs, name, **attrs)
            return
        wi = [ins[0], *w.q(ins[0], where), w.init(f"{name}/W", weight)]
        wi += [w.init(f"{name}/w_scale", np.asarray(p["w_scale"], np.float32)), w.init(f"{name}/w_zero_point", wz)]
        wi += w.q(outs[0], where)
        if p.get("bias") is not None:
            wi.append(w.init(f"{name}/B", np.asarray(p["bias"], np.int32)))
        w.node("QLinearConv", wi, outs, name, **attrs)
    elif n.op in ("qlinear_matmul", "matmul_integer"):
        weight = np.asarray(p["weight"])
        wz = np.asarray(p["w_zero_point"]).astype(weight.dtype)
        if n.op == "matmul_integer":
            xz = np.asarray(p["x_zero_point"]).astype(_NP[w.g.tensors[ins[0]].dtype])
            wi = [ins[0], w.init(f"{name}/W", weight), w.init(f"{name}/x_zero_point", xz), w.init(f"{name}/wz", wz)]
            w.node("MatMulInteger", wi, outs, name)
            return
        ws = np.asarray(p["w_scale"], np.float32)
        if np.all(ws == ws.reshape(-1)[0]) and wz.size <= 1:
            ws = ws.reshape(-1)[:1].reshape(())
        if wz.size > 1 or ws.size > 1:
            wz = np.broadcast_to(wz, ws.shape).astype(weight.dtype)
        alpha, bias = float(a.get("alpha", 1.0)), p.get("bias")
        if _is_plain_matmul(n):  # per-column scales and zero points allowed
            wi = [ins[0], *w.q(ins[0], where), w.init(f"{name}/W", weight), w.init(f"{name}/w_scale", ws)]
            wi += [w.init(f"{name}/w_zero_point", wz), *w.q(outs[0], where)]
            w.node("QLinearMatMul", wi, outs, name)
            return
        if len(w.g.tensors[ins[0]].shape) != 1:
            raise UnsupportedOpError(f"{where}: QGemm (a bias or alpha) takes (N, K) inputs only")
        c = np.zeros(weight.shape[1], np.int32) if bias is None else np.asarray(bias, np.int32)
        wi = [ins[0], *w.q(ins[0], where), w.init(f"{name}/W", weight), w.init(f"{name}/w_scale", ws)]
        wi += [w.init(f"{name}/w_zero_point", wz), w.init(f"{name}/C", c), *w.q(outs[0], where)]
        w.node("QGemm", wi, outs, name, domain=_MS, alpha=alpha)
    elif n.op == "qlinear_binary":
        op = "QLinearAdd" if a["fn"] == "add" else "QLinearMul"
        operands = [[t, *w.q(t, where)] for t in ins]
        ci = a.get("const_index")
        if ci is not None:
            dt = a.get("out_dtype", "uint8")
            const = [
                w.init(f"{name}/const", np.asarray(p["const"]).astype(_NP[dt])),
                w.init(f"{name}/const_scale", np.float32(np.asarray(p["const_scale"]).reshape(()))),
                w.init(f"{name}/const_zero_point", _NP[dt](int(np.asarray(p["const_zero_point"]).reshape(())))),
            ]
            operands.insert(ci, const)
        w.node(op, [*operands[0], *operands[1], *w.q(outs[0], where)], outs, name, domain=_MS)
    elif n.op == "qlinear_avgpool":
        wi = [ins[0], *w.q(ins[0], where), *w.q(outs[0], where)]
        cip = int(bool(a.get("count_include_pad", False)))
        w.node("QLinearAveragePool", wi, outs, name, domain=_MS, count_include_pad=cip, **_window(a))
    elif n.op == "qlinear_global_avgpool":
        wi = [ins[0], *w.q(ins[0], where), *w.q(outs[0], where)]
        w.node("QLinearGlobalAveragePool", wi, outs, name, domain=_MS, channels_last=0)
    elif n.op == "qlinear_lut":
        wi = [ins[0], *w.q(ins[0], where), *w.q(outs[0], where)]
        if a["fn"] == "sigmoid":
            w.node("QLinearSigmoid", wi, outs, name, domain=_MS)
        else:
            w.node("QLinearLeakyRelu", wi, outs, name, domain=_MS, alpha=float(a.get("alpha", 0.01)))
    elif n.op == "qlinear_concat":
        wi = [*w.q(outs[0], where)] + [v for t in ins for v in (t, *w.q(t, where))]
        w.node("QLinearConcat", wi, outs, name, domain=_MS, axis=int(a["axis"]) + 1)
    elif n.op == "onnx_concat":
        w.node("Concat", ins, outs, name, axis=int(a["axis"]) + 1)
    elif n.op == "onnx_maxpool":
        w.node("MaxPool", ins, outs, name, dilations=[int(d) for d in a.get("dilations", (1, 1))], **_window(a))
    elif n.op == "onnx_transpose":
        w.node("Transpose", ins, outs, name, perm=[0, *(int(i) + 1 for i in a["perm"])])
    elif n.op == "reshape":
        shape = w.init(f"{name}/shape", np.array([0, *(int(d) for d in a["shape"])], np.int64))
        w.node("Reshape", [ins[0], shape], outs, name)
    elif n.op == "onnx_float_binary":
        operands = list(ins)
        if a.get("const_index") is not None:
            operands.insert(a["const_index"], w.init(f"{name}/const", np.asarray(p["const"], np.float32)))
        w.node("Add" if a["fn"] == "add" else "Mul", operands, outs, name)
    elif n.op == "onnx_float_unary":
        fn = a["fn"]
        if fn == "clip":
            bounds = [w.init(f"{name}/{k}", np.float32(a.get(k))) for k in ("lo", "hi")]
            w.node("Clip", [ins[0], *bounds], outs, name)
        elif fn == "leaky_relu":
            w.node("LeakyRelu", ins, outs, name, alpha=float(a.get("alpha", 0.01)))
        else:
            w.node({"relu": "Relu", "sigmoid": "Sigmoid"}[fn], ins, outs, name)
    else:
        raise UnsupportedOpError(f"{where}: hwjax.onnx.save writes the op kinds of hwjax.graph.ops.onnx only")


def _opset(graph: Graph) -> int:
    """The default domain's opset to write: 21 when a QLinearMatMul must stay out of ONNX
    Runtime's ``session.x64quantprecision`` rewrite (``x64_u8_weights`` False: it was read from
    an opset-21 file, and the rewrite matches QLinearMatMul of opsets 10 to 20 only), else 13.
    Every operator written means the same in both."""
    keep = any(
        n.op == "qlinear_matmul" and not n.attrs.get("x64_u8_weights", True) and _is_plain_matmul(n)
        for n in graph.nodes
    )
    return 21 if keep else 13


def _is_plain_matmul(n) -> bool:
    """Whether a ``qlinear_matmul`` node is written as QLinearMatMul (not QGemm)."""
    return float(n.attrs.get("alpha", 1.0)) == 1.0 and (n.params or {}).get("bias") is None


def to_bytes(graph: Graph) -> bytes:
    """The QOperator-format ONNX model of a portable ``graph`` of ONNX op kinds (opset 13, or
    21 where a QLinearMatMul needs it (:func:`_opset`), and ``com.microsoft`` 1; the batch axis
    ``N``)."""
    from onnx import helper

    if not isinstance(graph, Graph):
        raise ArgTypeError(f"model: expected a hwjax.onnx.Model or a hwjax.graph.Graph, got {type(graph).__name__}")
    if graph.target is not None:
        raise UnsupportedOpError("model: save writes a portable graph (Model.graph), not a lowered one")
    w = _Writer(graph)
    for n in graph.nodes:
        _write_node(w, n)

    def vi(t):
        tt = graph.tensors[t]
        return helper.make_tensor_value_info(t, _TYPES[tt.dtype], ["N", *tt.shape])

    g = helper.make_graph(w.nodes, "hwjax", [vi(t) for t in graph.inputs], [vi(t) for t in graph.outputs], w.inits)
    opset = _opset(graph)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(_MS, 1)])
    m.ir_version = 8 if opset < 21 else 10
    m.producer_name = "hwjax"
    return m.SerializeToString()


def save(model, path=None) -> bytes:
    """Writes ``model`` (a :class:`hwjax.onnx.Model` or its portable graph) as a QOperator-format
    ONNX model: each node of the graph (the QDQ groups already fused as ONNX Runtime fuses
    them) becomes the ONNX operator it stands for, so that ONNX Runtime computes what
    :meth:`hwjax.onnx.Model.run` computes. Returns the file's bytes; with ``path``, also writes
    them there (FileError when it cannot). UnsupportedOpError names a node of another op kind.
    """
    graph = getattr(model, "graph", model)
    data = to_bytes(graph)
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgTypeError(f"path must be a path, got {type(path).__name__}")
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise FileError(f"path {os.fspath(path)!r}: cannot be written ({e.strerror})") from None
    return data
