"""The QDQ graph rewrites ONNX Runtime's CPU provider applies at ``ORT_ENABLE_ALL`` (x86-64).

A QDQ model (``onnxruntime.quantization.quantize_static``'s default format) holds float
ops between DequantizeLinear and QuantizeLinear nodes. ONNX Runtime rewrites groups of
``DQ -> op -> Q`` into its QLinear kernels before it runs the model; what is left runs in
float32. :func:`fuse` applies the same rewrites to a list of :class:`ONode` s, in ONNX
Runtime's order:

0. ``Q1 -> DQ1 -> Q2 -> DQ2`` chains lose their middle pair (``_double_qdq``); a Transpose
   left in float between a DQ and a Q is refused (ORT's transpose optimizer moves it).
1. ``Relu`` / ``Clip`` directly before a ``Q`` whose range they cannot change (the Q's
   zero point is its type's lowest value for Relu; Clip's bounds cover the Q's range) are
   dropped.
2. Every DQ that feeds several nodes is duplicated, one per consumer.
3. s8 -> u8: a ``Q`` with an int8 zero point whose only consumer is a ``DQ`` with equal,
   constant, scalar scale and zero point becomes a uint8 pair with ``zero_point + 128``
   (x86 CPUs run the QLinear kernels of Conv and MatMul with uint8 activations only). After
   step 2, a Q whose value feeds several nodes has several DQs and keeps int8.
4. Groups become QLinear nodes: Conv -> QLinearConv, MatMul -> QLinearMatMul, Gemm ->
   QGemm, Add / Mul -> QLinearAdd / QLinearMul, AveragePool / GlobalAveragePool /
   Sigmoid / LeakyRelu -> their QLinear forms, Concat -> QLinearConcat; MaxPool, Reshape,
   Flatten, Transpose, Squeeze, Unsqueeze between a DQ and a Q with the same quantisation
   run on the integers (the DQ and Q dropped). Conv, MatMul and Gemm groups need uint8
   activations; the others take int8 or uint8, with one type throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwjax.errors import UnsupportedOpError


@dataclass
class ONode:
    """One ONNX node: ``op`` (op_type), ``domain`` (``""`` or ``"com.microsoft"``), input and
    output names (``""`` for an absent optional input), attributes as Python values."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    name: str = ""


_LINEAR = {"Conv": "QLinearConv", "MatMul": "QLinearMatMul", "Gemm": "QGemm"}
_UNARY = {
    "AveragePool": "QLinearAveragePool",
    "GlobalAveragePool": "QLinearGlobalAveragePool",
    "Sigmoid": "QLinearSigmoid",
    "LeakyRelu": "QLinearLeakyRelu",
}
_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}
_DROP = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze")


class _Graph:
    def __init__(self, nodes: list[ONode], consts: dict[str, np.ndarray], outputs: set[str]):
        self.nodes, self.consts, self.outputs = nodes, consts, outputs

    def producer(self, t: str):
        for n in self.nodes:
            if t in n.outputs:
                return n
        return None

    def consumers(self, t: str) -> list[ONode]:
        return [n for n in self.nodes if t in n.inputs]

    def const(self, t: str):
        return self.consts.get(t) if t else None

    def only_consumer(self, t: str):
        """The single consumer of ``t`` (None when several, none, or ``t`` is a graph output)."""
        cs = self.consumers(t)
        if len(cs) != 1 or t in self.outputs or sum(i == t for i in cs[0].inputs) != 1:
            return None
        return cs[0]

    def qparams(self, node: ONode):
        """``(scale, zero_point)`` of a per-tensor Q or DQ node with constant parameters, the
        zero point as a NumPy scalar of its type (uint8 when absent), or None."""
        s = self.const(node.inputs[1]) if len(node.inputs) > 1 else None
        z = self.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else np.zeros((), np.uint8)
        if s is None or z is None or np.size(s) != 1 or np.size(z) != 1:
            return None
        return np.float32(np.asarray(s).reshape(())), np.asarray(z).reshape(())

    def new_name(self, base: str) -> str:
        names = {t for n in self.nodes for t in (*n.inputs, *n.outputs)} | set(self.consts)
        i, name = 0, base
        while name in names:
            i += 1
            name = f"{base}_{i}"
        return name


def _is(node, op):
    return node is not None and node.op == op and node.domain in ("", "ai.onnx")


def _same_q(a, b) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] == b[1] and a[1].dtype == b[1].dtype


def fuse(nodes: list[ONode], consts: dict[str, np.ndarray], outputs) -> list[ONode]:
    """The node list after ONNX Runtime's QDQ rewrites (module docstring); ``consts`` (the
    initializers) gains the new zero points and is updated in place."""
    g = _Graph(list(nodes), consts, set(outputs))
    _drop_activations(g)
    _double_qdq(g)
    _unique_dq(g)
    _s8_to_u8(g)
    _fuse_groups(g)
    _refuse_float_transposes(g)
    return g.nodes


def _double_qdq(g: _Graph) -> None:
    """``Q1 -> DQ1 -> Q2 -> DQ2`` (single edges, constant per-tensor parameters, each pair's
    Q and DQ equal, one zero-point type) becomes ``Q -> DQ`` with the parameters of the
    intersection of the two pairs' ranges, in float32: ``lo = max(f32(qmin - z1) * s1,
    f32(qmin - z2) * s2)``, ``hi = min(...)`` likewise, ``s = f32(hi - lo) / f32(qmax - qmin)``,
    ``z = round(f32(qmin - f32(lo / s)))`` (half away from zero)."""
    for dq1 in list(g.nodes):
        if dq1 not in g.nodes or not _is(dq1, "DequantizeLinear"):
            continue
        q1 = g.producer(dq1.inputs[0])
        q2 = g.only_consumer(dq1.outputs[0])
        if not _is(q1, "QuantizeLinear") or not _is(q2, "QuantizeLinear") or g.only_consumer(q1.outputs[0]) is not dq1:
            continue
        dq2 = g.only_consumer(q2.outputs[0])
        if not _is(dq2, "DequantizeLinear"):
            continue
        p1, p2 = g.qparams(dq1), g.qparams(q2)
        if not (_same_q(g.qparams(q1), p1) and _same_q(p2, g.qparams(dq2))) or p1[1].dtype != p2[1].dtype:
            continue
        if len(q1.inputs) < 3 or len(q2.inputs) < 3:
            continue
        if not (p1[0] == p2[0] and p1[1] == p2[1]):
            (s1, z1), (s2, z2) = p1, p2
            info = np.iinfo(z1.dtype)
            f = np.float32
            lo = max(f(info.min - int(z1)) * s1, f(info.min - int(z2)) * s2)
            hi = min(f(info.max - int(z1)) * s1, f(info.max - int(z2)) * s2)
            s = f(f(hi - lo) / f(info.max - info.min))
            t = f(f(info.min) - f(lo / s))
            z = np.asarray(np.copysign(np.floor(abs(float(t)) + 0.5), float(t))).astype(z1.dtype)  # std::round
            for node in (q1, dq2):
                sn, zn = g.new_name(node.inputs[1] + "_dqdq"), g.new_name(node.inputs[2] + "_dqdq")
                g.consts[sn], g.consts[zn] = np.asarray(s, np.float32), np.asarray(z, z1.dtype)
                node.inputs[1], node.inputs[2] = sn, zn
        dq2.inputs[0] = q1.outputs[0]
        _remove(g, dq1, q2)


def _refuse_float_transposes(g: _Graph) -> None:
    """A Transpose left between a DQ and a Q: ORT's transpose optimizer moves it through
    the Q / DQ nodes (which then fuse differently), which is not reproduced."""
    for n in g.nodes:
        if _is(n, "Transpose") and _is(g.producer(n.inputs[0]), "DequantizeLinear"):
            raise UnsupportedOpError(
                f"Transpose {n.name!r} runs on float32 between quantised tensors of different "
                "quantisations; ONNX Runtime's transpose optimizer moves it through the Q/DQ nodes, "
                "which hwjax does not reproduce"
            )


def _drop_activations(g: _Graph) -> None:
    for n in list(g.nodes):
        if not (_is(n, "Relu") or _is(n, "Clip")):
            continue
        q = g.only_consumer(n.outputs[0])
        if not _is(q, "QuantizeLinear"):
            continue
        qp = g.qparams(q)
        if qp is None:
            continue
        s, z = qp
        lo, hi = (0, 255) if z.dtype == np.uint8 else (-128, 127)
        if n.op == "Relu":
            ok = int(z) == lo
        else:
            mn = g.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else n.attrs.get("min")
            mx = g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else n.attrs.get("max")
            if (len(n.inputs) > 1 and n.inputs[1] and mn is None) or (len(n.inputs) > 2 and n.inputs[2] and mx is None):
                continue
            qlo = np.float32(s) * np.float32(lo - int(z))
            qhi = np.float32(s) * np.float32(hi - int(z))
            ok = (mn is None or float(np.asarray(mn).reshape(())) <= qlo) and (
                mx is None or float(np.asarray(mx).reshape(())) >= qhi
            )
        if ok:
            q.inputs[0] = n.inputs[0]
            g.nodes.remove(n)


def _s8_to_u8(g: _Graph) -> None:
    for q in list(g.nodes):
        if not _is(q, "QuantizeLinear") or len(q.inputs) < 3:
            continue
        qp = g.qparams(q)
        if qp is None or qp[1].dtype != np.int8:
            continue
        dq = g.only_consumer(q.outputs[0])
        if not _is(dq, "DequantizeLinear") or not _same_q(qp, g.qparams(dq)):
            continue
        u8 = np.uint8(int(qp[1]) + 128)
        for node in (q, dq):
            name = g.new_name(node.inputs[2] + "_u8")
            g.consts[name] = np.asarray(u8, np.uint8)
            node.inputs[2] = name


def _unique_dq(g: _Graph) -> None:
    for dq in list(g.nodes):
        if not _is(dq, "DequantizeLinear"):
            continue
        users = g.consumers(dq.outputs[0])
        if len(users) + (dq.outputs[0] in g.outputs) <= 1:
            continue
        keep_first = dq.outputs[0] not in g.outputs
        for k, user in enumerate(users):
            if k == 0 and keep_first:
                continue
            name = g.new_name(dq.outputs[0] + "_dup")
            copy = ONode(dq.op, list(dq.inputs), [name], dict(dq.attrs), dq.domain, name)
            g.nodes.insert(g.nodes.index(dq) + 1, copy)
            user.inputs = [name if t == dq.outputs[0] else t for t in user.inputs]


def _dq_of(g: _Graph, t: str):
    p = g.producer(t)
    return p if _is(p, "DequantizeLinear") and g.only_consumer(t) is not None else None


def _q_after(g: _Graph, node: ONode):
    q = g.only_consumer(node.outputs[0])
    return q if _is(q, "QuantizeLinear") and g.qparams(q) is not None else None


def _act_type(g: _Graph, dq: ONode):
    qp = g.qparams(dq)
    return None if qp is None else qp[1].dtype


def _fuse_groups(g: _Graph) -> None:
    for n in list(g.nodes):
        if n not in g.nodes or n.domain not in ("", "ai.onnx"):
            continue
        if n.op in _LINEAR:
            _fuse_linear(g, n)
        elif n.op in _UNARY or n.op in _BINARY or n.op == "Concat":
            _fuse_other(g, n)
        elif n.op in _DROP:
            _drop_qdq(g, n)


def _remove(g: _Graph, *nodes) -> None:
    for x in nodes:
        if x is not None and x in g.nodes:
            g.nodes.remove(x)


def _fuse_linear(g: _Graph, n: ONode) -> None:
    dqx = _dq_of(g, n.inputs[0])
    dqw = _dq_of(g, n.inputs[1]) if len(n.inputs) > 1 else None
    if dqx is None or dqw is None:
        return
    q = _q_after(g, n)
    tx = _act_type(g, dqx)
    if tx != np.uint8:
        return  # int8 activations: rejected on x86
    if q is None and n.op in ("MatMul", "Gemm"):
        # ORT makes MatMulIntegerToFloat / a QGemm with a float output: named, not emulated
        g.nodes[g.nodes.index(n)] = ONode(
            "MatMulIntegerToFloat" if n.op == "MatMul" else "QGemmFloatOutput",
            n.inputs,
            n.outputs,
            {},
            "com.microsoft",
            n.name,
        )
        return
    if q is None or g.qparams(q)[1].dtype != np.uint8:
        return
    ws = g.const(dqw.inputs[1])
    w = g.const(dqw.inputs[0])
    if ws is not None and w is not None and np.size(ws) > 1:
        out_axis = 0 if n.op == "Conv" or (n.op == "Gemm" and n.attrs.get("transB", 0)) else 1
        if int(dqw.attrs.get("axis", 1)) % w.ndim != out_axis:
            raise UnsupportedOpError(
                f"{n.op} {n.name!r}: per-channel weight scales along axis {dqw.attrs.get('axis', 1)}, "
                f"not the output-channel axis {out_axis}"
            )
    dqb = None
    if len(n.inputs) > 2 and n.inputs[2]:
        dqb = _dq_of(g, n.inputs[2])
        if dqb is None or g.const(dqb.inputs[0]) is None or g.const(dqb.inputs[0]).dtype != np.int32:
            return
    if n.op == "Gemm" and (n.attrs.get("transA", 0) or (dqb is not None and n.attrs.get("beta", 1.0) != 1.0)):
        return
    ins = [dqx.inputs[0], *_sz(dqx), dqw.inputs[0], *_sz(dqw)]
    if n.op == "Gemm":
        ins += [dqb.inputs[0] if dqb is not None else ""]
    ins += [q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else ""]
    if n.op == "Conv" and dqb is not None:
        ins.append(dqb.inputs[0])
    attrs = dict(n.attrs)
    if n.op == "Gemm":
        attrs.pop("beta", None)
    fused = ONode(_LINEAR[n.op], ins, [q.outputs[0]], attrs, "com.microsoft" if n.op == "Gemm" else "", n.name)
    g.nodes[g.nodes.index(n)] = fused
    _remove(g, dqx, dqw, dqb, q)


def _sz(dq: ONode) -> list[str]:
    return [dq.inputs[1], dq.inputs[2] if len(dq.inputs) > 2 else ""]


def _fuse_other(g: _Graph, n: ONode) -> None:
    dqs = [_dq_of(g, t) for t in n.inputs]
    if n.op in _BINARY:
        if len(dqs) != 2:
            return
    elif n.op in _UNARY:
        dqs = dqs[:1]
    if any(d is None or g.qparams(d) is None for d in dqs):
        return
    q = _q_after(g, n)
    if q is None:
        return
    types = {_act_type(g, d) for d in dqs} | {g.qparams(q)[1].dtype}
    if len(types) != 1:
        return
    qs = [q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else ""]
    if n.op in _BINARY:
        ins = [dqs[0].inputs[0], *_sz(dqs[0]), dqs[1].inputs[0], *_sz(dqs[1]), *qs]
        new = ONode(_BINARY[n.op], ins, [q.outputs[0]], {}, "com.microsoft", n.name)
    elif n.op == "Concat":
        ins = [*qs] + [t for d in dqs for t in (d.inputs[0], *_sz(d))]
        new = ONode("QLinearConcat", ins, [q.outputs[0]], dict(n.attrs), "com.microsoft", n.name)
    else:
        ins = [dqs[0].inputs[0], *_sz(dqs[0]), *qs]
        new = ONode(_UNARY[n.op], ins, [q.outputs[0]], dict(n.attrs), "com.microsoft", n.name)
    g.nodes[g.nodes.index(n)] = new
    _remove(g, *dqs, q)


def _drop_qdq(g: _Graph, n: ONode) -> None:
    dq = _dq_of(g, n.inputs[0])
    if dq is None or len(n.outputs) != 1:
        return
    q = _q_after(g, n)
    if q is None or not _same_q(g.qparams(dq), g.qparams(q)):
        return
    n.inputs[0] = dq.inputs[0]
    out = q.outputs[0]
    n.outputs = [out]
    _remove(g, dq, q)
