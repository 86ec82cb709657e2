"""Reading an ONNX int8 model into a :class:`hwjax.graph.Graph` (after ONNX Runtime's QDQ rewrites)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.graph import Graph, Node, Quant, Tensor
from hwjax.graph.ops.onnx import broadcast_shapes, window_geometry
from hwjax.onnx._qdq import ONode, fuse

_ELEM = {1: "float32", 2: "uint8", 3: "int8", 6: "int32"}
_NP = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int32": np.int32}
#: float ops whose MLAS float kernels' summation order is not reproduced: a model that
#: runs one of them in float (an unfused QDQ group) is refused
_MS_OPS = (
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
)
FLOAT_REFUSED = ("Conv", "MatMul", "Gemm", "AveragePool", "GlobalAveragePool", "ConvTranspose")


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as the file declares it: ``shape`` with the batch axis (1),
    ``dtype`` (``"float32"``, ``"uint8"``, ``"int8"``, ``"int32"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def supported_ops() -> tuple[str, ...]:
    """The ONNX operators :func:`hwjax.onnx.load` reads (after the QDQ rewrites)."""
    return tuple(sorted(_CONVERTERS))


def _np_dtype_name(a) -> str:
    for k, v in _NP.items():
        if np.asarray(a).dtype == v:
            return k
    raise UnsupportedOpError(f"tensor type {np.asarray(a).dtype} is not supported (float32, uint8, int8, int32)")


class _Builder:
    def __init__(self, consts, opset: int = 13):
        self.consts = consts
        self.opset = opset  # of the default domain
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []

    # -- tensors
    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            if name in self.consts:
                raise UnsupportedOpError(f"constant {name!r} used where hwjax needs a computed tensor") from None
            raise FormatError(f"tensor {name!r} is used before any node writes it") from None

    def add(self, name, shape, dtype, quant=None):
        if name in self.tensors:
            raise FormatError(f"tensor {name!r} is written twice")
        self.tensors[name] = Tensor(name, tuple(int(d) for d in shape), dtype, quant)

    def const(self, name: str, what: str):
        if not name:
            return None
        if name not in self.consts:
            raise UnsupportedOpError(f"{what} {name!r} must be a constant (an initializer)")
        return self.consts[name]

    def set_quant(self, name: str, scale, zp) -> str:
        """Attaches the quantisation to integer tensor ``name`` and returns ``name``; a tensor
        read with another quantisation than it has is relabelled (an identity node whose
        output carries the other quantisation), and the relabelled name is returned."""
        t = self.tensor(name)
        s = np.float32(np.asarray(scale, np.float32).reshape(()))
        z = int(np.asarray(zp).reshape(()))
        if t.quant is None:
            self.tensors[name] = Tensor(t.name, t.shape, t.dtype, Quant.of(s, z))
            return name
        if np.float32(t.quant.scale) == s and int(t.quant.zero_point) == z:
            return name
        k = 0
        while f"{name}:q{k}" in self.tensors and not (
            np.float32(self.tensors[f"{name}:q{k}"].quant.scale) == s
            and int(self.tensors[f"{name}:q{k}"].quant.zero_point) == z
        ):
            k += 1
        alias = f"{name}:q{k}"
        if alias not in self.tensors:
            self.add(alias, t.shape, t.dtype, Quant.of(s, z))
            self.emit("reshape", [name], [alias], {"shape": t.shape}, name=alias)
        return alias

    def emit(self, op, inputs, outputs, attrs=None, params=None, name=""):
        self.nodes.append(Node(op, tuple(inputs), tuple(outputs), attrs or {}, params, name))


_CONVERTERS: dict[str, Any] = {}


def _converts(*ops):
    def deco(fn):
        for op in ops:
            _CONVERTERS[op] = fn
        return fn

    return deco


def _scalar_q(b: _Builder, node: ONode, i_scale: int, i_zp: int, what: str):
    s = b.const(node.inputs[i_scale], f"{what} scale")
    z = b.const(node.inputs[i_zp], f"{what} zero point") if len(node.inputs) > i_zp and node.inputs[i_zp] else None
    if s is None or np.size(s) != 1 or (z is not None and np.size(z) != 1):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: {what} must be quantised per tensor")
    z = np.zeros((), np.uint8) if z is None else np.asarray(z).reshape(())
    sv = np.float32(np.asarray(s, np.float32).reshape(()))
    if not (np.isfinite(sv) and sv > 0):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: {what} scale must be positive and finite, got {sv}")
    return sv, z


def _input_q(b, node, idx, i_scale, i_zp, what="input"):
    """Checks that input ``idx`` is an integer tensor of the zero point's type and attaches its quantisation."""
    s, z = _scalar_q(b, node, i_scale, i_zp, what)
    t = b.tensor(node.inputs[idx])
    if t.dtype != _np_dtype_name(z):
        raise FormatError(f"{node.op} {node.name!r}: {what} {t.name!r} is {t.dtype}, its zero point {z.dtype}")
    node.inputs[idx] = b.set_quant(node.inputs[idx], s, z)
    return s, z


def _output(b, node, out_shape, i_scale, i_zp, k=0):
    s, z = _scalar_q(b, node, i_scale, i_zp, "output")
    dt = _np_dtype_name(z)
    if dt not in ("int8", "uint8"):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: output type {dt} is not supported (int8, uint8)")
    b.add(node.outputs[k], out_shape, dt, Quant.of(s, int(z)))
    return dt


@_converts("QuantizeLinear")
def _quantize(b, node):
    x = b.tensor(node.inputs[0])
    if x.dtype != "float32":
        raise UnsupportedOpError(f"QuantizeLinear {node.name!r}: input must be float32, got {x.dtype}")
    dt = _output(b, node, x.shape, 1, 2)
    b.emit("quantize", [x.name], node.outputs[:1], {"dtype": dt}, name=node.name)


@_converts("DequantizeLinear")
def _dequantize(b, node):
    _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    b.add(node.outputs[0], x.shape, "float32")
    b.emit("dequantize", [x.name], node.outputs[:1], name=node.name)


def _pads2d(node, kernel):
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: auto_pad {node.attrs['auto_pad']!r} is not supported")
    p = tuple(node.attrs.get("pads", (0, 0, 0, 0)))
    if len(kernel) != 2 or len(p) != 4:
        raise UnsupportedOpError(f"{node.op} {node.name!r}: only 2-D windows are supported")
    if min(p) < 0:
        raise FormatError(f"{node.op} {node.name!r}: negative pads {p}")
    return ((int(p[0]), int(p[2])), (int(p[1]), int(p[3])))


def _window_attrs(node, kernel):
    return {
        "kernel_size": tuple(int(k) for k in kernel),
        "strides": tuple(int(s) for s in node.attrs.get("strides", (1, 1))),
        "pads": _pads2d(node, kernel),
    }


def _weights(b, node, i_w, i_scale, i_zp, n_out_axis):
    w = b.const(node.inputs[i_w], "weight")
    ws = b.const(node.inputs[i_scale], "weight scale") if i_scale is not None else None
    wz = b.const(node.inputs[i_zp], "weight zero point") if len(node.inputs) > i_zp and node.inputs[i_zp] else None
    if _np_dtype_name(w) not in ("int8", "uint8"):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: weights must be int8 or uint8, got {w.dtype}")
    wz = np.zeros((), w.dtype) if wz is None else np.asarray(wz)
    if wz.dtype != w.dtype:
        raise FormatError(f"{node.op} {node.name!r}: weight zero point type {wz.dtype} differs from {w.dtype}")
    n = w.shape[n_out_axis]
    for v, what in ((ws, "scale"), (wz, "zero point")):
        if v is not None and np.size(v) not in (1, n):
            raise FormatError(f"{node.op} {node.name!r}: weight {what} has {np.size(v)} entries for {n} channels")
    if ws is not None and not np.all(np.asarray(ws, np.float32) > 0):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: weight scales must be positive")
    wz = wz.astype(np.int32).reshape(-1)
    wz = wz.reshape(()) if wz.size == 1 else wz
    return w, (None if ws is None else np.asarray(ws, np.float32).reshape(-1)), wz


def _conv_common(b, node, i_w, i_wscale, i_wzp):
    x = b.tensor(node.inputs[0])
    w, ws, wz = _weights(b, node, i_w, i_wscale, i_wzp, 0)
    if len(x.shape) != 3 or w.ndim != 4:
        raise UnsupportedOpError(f"{node.op} {node.name!r}: only 2-D convolutions (NCHW) are supported")
    if np.size(wz) > 1 and np.any(wz != wz.reshape(-1)[0]):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: per-channel weight zero points must all be equal")
    kernel = tuple(node.attrs.get("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]):
        raise FormatError(f"{node.op} {node.name!r}: kernel_shape {kernel} differs from the weights {w.shape}")
    group = int(node.attrs.get("group", 1))
    attrs = {
        **_window_attrs(node, kernel),
        "dilations": tuple(int(d) for d in node.attrs.get("dilations", (1, 1))),
        "group": group,
        "features": int(w.shape[0]),
    }
    if group < 1 or x.shape[0] != w.shape[1] * group or w.shape[0] % group:
        raise FormatError(f"{node.op} {node.name!r}: {x.shape[0]} input channels, weights {w.shape}, group {group}")
    geom = window_geometry(attrs, x.shape)
    return x, w, ws, wz, attrs, (w.shape[0], *geom.out_hw)


@_converts("QLinearConv")
def _qlinear_conv(b, node):
    if node.attrs.get("channels_last", 0):
        raise UnsupportedOpError(f"QLinearConv {node.name!r}: channels_last is not supported")
    _input_q(b, node, 0, 1, 2)
    x, w, ws, wz, attrs, shape = _conv_common(b, node, 3, 4, 5)
    bias = b.const(node.inputs[8], "bias") if len(node.inputs) > 8 and node.inputs[8] else None
    if bias is not None and (bias.dtype != np.int32 or bias.size != w.shape[0]):
        raise FormatError(f"QLinearConv {node.name!r}: bias must be int32 ({w.shape[0]},)")
    dt = _output(b, node, shape, 6, 7)
    ws = np.broadcast_to(ws, (w.shape[0],)).astype(np.float32)
    params = {"weight": w, "w_scale": ws, "w_zero_point": wz}
    if bias is not None:
        params["bias"] = bias.reshape(-1)
    attrs = {**attrs, "out_dtype": dt, "x64_u8_weights": not node.attrs.get(_NHWC, 0)}
    b.emit("qlinear_conv", [x.name], node.outputs[:1], attrs, params, node.name)


@_converts("ConvInteger")
def _conv_integer(b, node):
    x, w, _, wz, attrs, shape = _conv_common(b, node, 1, None, 3)
    xz = b.const(node.inputs[2], "input zero point") if len(node.inputs) > 2 and node.inputs[2] else None
    xz = np.zeros((), _NP[x.dtype]) if xz is None else np.asarray(xz).reshape(())
    _check_zp_type(node, x, xz)
    b.add(node.outputs[0], shape, "int32")
    params = {"weight": w, "w_zero_point": wz, "x_zero_point": np.int32(int(xz))}
    b.emit("conv_integer", [x.name], node.outputs[:1], attrs, params, node.name)


def _check_zp_type(node, x, xz):
    if x.dtype != _np_dtype_name(xz):
        raise FormatError(f"{node.op} {node.name!r}: input {x.name!r} is {x.dtype}, its zero point {xz.dtype}")


def _matmul_out(b, node, x, w):
    if not x.shape or x.shape[-1] != w.shape[0] or w.ndim != 2:
        raise UnsupportedOpError(
            f"{node.op} {node.name!r}: needs a constant 2-D right operand matching {x.shape}, got {w.shape}"
        )
    return (*x.shape[:-1], w.shape[1])


@_converts("QLinearMatMul")
def _qlinear_matmul(b, node):
    _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    w, ws, wz = _weights(b, node, 3, 4, 5, 1)
    shape = _matmul_out(b, node, x, w)
    dt = _output(b, node, shape, 6, 7)
    params = {"weight": w, "w_scale": np.broadcast_to(ws, (w.shape[1],)).astype(np.float32), "w_zero_point": wz}
    attrs = {"features": w.shape[1], "out_dtype": dt, "x64_u8_weights": b.opset < 21}  # QLinearMatMul-21: no
    b.emit("qlinear_matmul", [x.name], node.outputs[:1], attrs, params, node.name)


@_converts("QGemm")
def _qgemm(b, node):
    if node.attrs.get("transA", 0):
        raise UnsupportedOpError(f"QGemm {node.name!r}: transA is not supported")
    if len(node.inputs) < 8 or not node.inputs[7]:
        raise UnsupportedOpError(f"QGemm {node.name!r}: a float output (no y_scale) is not supported")
    _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    w, ws, wz = _weights(b, node, 3, 4, 5, 0 if node.attrs.get("transB", 0) else 1)
    if node.attrs.get("transB", 0):
        w = np.ascontiguousarray(w.T)
    shape = _matmul_out(b, node, x, w)
    c = b.const(node.inputs[6], "C") if node.inputs[6] else None
    if c is not None and (c.dtype != np.int32 or c.size != w.shape[1]):
        raise UnsupportedOpError(f"QGemm {node.name!r}: C must be int32 with one value per column")
    dt = _output(b, node, shape, 7, 8)
    params = {"weight": w, "w_scale": np.broadcast_to(ws, (w.shape[1],)).astype(np.float32), "w_zero_point": wz}
    if c is not None:
        params["bias"] = c.reshape(-1)
    attrs = {"features": w.shape[1], "alpha": float(node.attrs.get("alpha", 1.0)), "out_dtype": dt}
    b.emit("qlinear_matmul", [x.name], node.outputs[:1], attrs, params, node.name)


@_converts("MatMulInteger")
def _matmul_integer(b, node):
    x = b.tensor(node.inputs[0])
    w, _, wz = _weights(b, node, 1, None, 3, 1)
    shape = _matmul_out(b, node, x, w)
    xz = b.const(node.inputs[2], "input zero point") if len(node.inputs) > 2 and node.inputs[2] else None
    xz = np.zeros((), _NP[x.dtype]) if xz is None else np.asarray(xz).reshape(())
    _check_zp_type(node, x, xz)
    b.add(node.outputs[0], shape, "int32")
    params = {"weight": w, "w_zero_point": wz, "x_zero_point": np.int32(int(xz))}
    b.emit("matmul_integer", [x.name], node.outputs[:1], {"features": w.shape[1]}, params, node.name)


def _operand(b, node, i, i_scale, i_zp):
    """``(tensor or None, const values or None, scale, zp)`` of a QLinear binary operand."""
    if node.inputs[i] in b.tensors:
        s, z = _input_q(b, node, i, i_scale, i_zp)
        return b.tensors[node.inputs[i]], None, s, z
    c = b.const(node.inputs[i], "operand")
    s, z = _scalar_q(b, node, i_scale, i_zp, "operand")
    return None, c.astype(np.int32), s, z


def _const_example_shape(c, rank: int) -> tuple[int, ...]:
    """A constant's shape as seen by one example: ONNX broadcasting aligns it with the
    batched tensor's rank + 1 axes, the leading (batch) axis must be 1."""
    shape = tuple(np.shape(c))
    if len(shape) == rank + 1:
        if shape[0] != 1:
            raise UnsupportedOpError(f"a constant operand of shape {shape} broadcasts over the batch axis")
        return shape[1:]
    return shape


def first_is_scalar_span(a_shape, b_shape) -> bool:
    """Whether ONNX Runtime's broadcaster hands the first operand of a binary op to its kernel
    as the single value of each span (then QLinearAdd's kernel takes the operands the other
    way round): after dropping the trailing axes where the output is 1, the first operand
    is 1 on the last axis and the second is not (a single-value first operand included)."""
    r = max(len(a_shape), len(b_shape))
    a = (1,) * (r - len(a_shape)) + tuple(a_shape)
    b = (1,) * (r - len(b_shape)) + tuple(b_shape)
    while a and a[-1] == 1 and b[-1] == 1:
        a, b = a[:-1], b[:-1]
    return bool(a) and a[-1] == 1 and b[-1] != 1


@_converts("QLinearAdd", "QLinearMul")
def _qlinear_binary(b, node):
    ta, ca, _, za = _operand(b, node, 0, 1, 2)
    tb, cb, _, zb = _operand(b, node, 3, 4, 5)
    fn = "add" if node.op == "QLinearAdd" else "mul"
    if ta is None and tb is None:
        raise UnsupportedOpError(f"{node.op} {node.name!r}: both operands are constants")
    dts = {_np_dtype_name(za), _np_dtype_name(zb)}
    s, zc = _scalar_q(b, node, 6, 7, "output")
    dt = _np_dtype_name(zc)
    if dts != {dt}:
        raise FormatError(f"{node.op} {node.name!r}: operand and output types differ")
    if ta is not None and tb is not None:
        shape = broadcast_shapes(ta.shape, tb.shape)
        attrs = {"fn": fn, "out_dtype": dt, "swap": first_is_scalar_span(ta.shape, tb.shape)}
        b.add(node.outputs[0], shape, dt, Quant.of(s, int(zc)))
        b.emit("qlinear_binary", [ta.name, tb.name], node.outputs[:1], attrs, name=node.name)
        return
    ci = 0 if ta is None else 1
    t = tb if ta is None else ta
    c = ca if ta is None else cb
    cs, cz = _scalar_q(b, node, 1 if ci == 0 else 4, 2 if ci == 0 else 5, "operand")
    c = c.reshape(_const_example_shape(c, len(t.shape)))
    shape = broadcast_shapes(t.shape, c.shape)
    a_shape, b_shape = (c.shape, t.shape) if ci == 0 else (t.shape, c.shape)
    attrs = {"fn": fn, "out_dtype": dt, "const_index": ci, "swap": first_is_scalar_span(a_shape, b_shape)}
    params = {"const": c, "const_scale": cs, "const_zero_point": np.int32(int(cz))}
    b.add(node.outputs[0], shape, dt, Quant.of(s, int(zc)))
    b.emit("qlinear_binary", [t.name], node.outputs[:1], attrs, params, node.name)


def _pool_kernel(node):
    if node.attrs.get("ceil_mode", 0):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: ceil_mode=1 is not supported")
    if "kernel_shape" not in node.attrs:
        raise FormatError(f"{node.op} {node.name!r}: kernel_shape is required")
    return tuple(int(k) for k in node.attrs["kernel_shape"])


@_converts("QLinearAveragePool")
def _qlinear_avgpool(b, node):
    if node.attrs.get("channels_last", 0):
        raise UnsupportedOpError(f"QLinearAveragePool {node.name!r}: channels_last is not supported")
    _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    kernel = _pool_kernel(node)
    attrs = _window_attrs(node, kernel)
    if len(x.shape) != 3:
        raise UnsupportedOpError(f"QLinearAveragePool {node.name!r}: only 2-D pools (NCHW) are supported")
    geom = window_geometry(attrs, x.shape)
    shape = (x.shape[0], *geom.out_hw)
    dt = _output(b, node, shape, 3, 4)
    if kernel == tuple(x.shape[1:]) and attrs["pads"] == ((0, 0), (0, 0)):  # MLAS's global path
        b.emit("qlinear_global_avgpool", [x.name], node.outputs[:1], {"count": math.prod(kernel), "out_dtype": dt})
        return
    attrs = {**attrs, "count_include_pad": bool(node.attrs.get("count_include_pad", 0)), "out_dtype": dt}
    b.emit("qlinear_avgpool", [x.name], node.outputs[:1], attrs, name=node.name)


@_converts("QLinearGlobalAveragePool")
def _qlinear_global(b, node):
    if node.attrs.get("channels_last", 0):
        raise UnsupportedOpError(f"QLinearGlobalAveragePool {node.name!r}: channels_last is not supported")
    _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    if len(x.shape) != 3:
        raise UnsupportedOpError(f"QLinearGlobalAveragePool {node.name!r}: only (N, C, H, W) inputs are supported")
    dt = _output(b, node, (x.shape[0], 1, 1), 3, 4)
    attrs = {"count": x.shape[1] * x.shape[2], "out_dtype": dt}
    b.emit("qlinear_global_avgpool", [x.name], node.outputs[:1], attrs, name=node.name)


@_converts("QLinearSigmoid", "QLinearLeakyRelu")
def _qlinear_lut(b, node):
    _, z = _input_q(b, node, 0, 1, 2)
    x = b.tensor(node.inputs[0])
    dt = _output(b, node, x.shape, 3, 4)
    fn = "sigmoid" if node.op == "QLinearSigmoid" else "leaky_relu"
    attrs = {"fn": fn, "in_dtype": x.dtype, "out_dtype": dt}
    if fn == "leaky_relu":
        attrs["alpha"] = float(np.float32(node.attrs.get("alpha", 0.01)))
    b.emit("qlinear_lut", [x.name], node.outputs[:1], attrs, name=node.name)


def _axis(node, rank_with_batch: int) -> int:
    a = int(node.attrs.get("axis", 0 if node.op != "Flatten" else 1))
    if not -rank_with_batch <= a < rank_with_batch:
        raise FormatError(f"{node.op} {node.name!r}: axis {a} outside {rank_with_batch} axes")
    a %= rank_with_batch
    if a == 0 and node.op != "Flatten":
        raise UnsupportedOpError(f"{node.op} {node.name!r}: an op along the batch axis is not supported")
    return a


@_converts("QLinearConcat")
def _qlinear_concat(b, node):
    if (len(node.inputs) - 2) % 3 or len(node.inputs) < 5:
        raise FormatError(f"QLinearConcat {node.name!r}: inputs must be Y_scale, Y_zp and triples")
    ins = []
    for k in range(2, len(node.inputs), 3):
        if node.inputs[k] not in b.tensors:
            raise UnsupportedOpError(f"QLinearConcat {node.name!r}: constant inputs are not supported")
        _input_q(b, node, k, k + 1, k + 2)
        ins.append(b.tensors[node.inputs[k]])
    a = _axis(node, len(ins[0].shape) + 1) - 1
    shapes = [t.shape for t in ins]
    if any(len(s) != len(shapes[0]) for s in shapes):
        raise FormatError(f"QLinearConcat {node.name!r}: inputs of different ranks")
    shape = (*shapes[0][:a], sum(s[a] for s in shapes), *shapes[0][a + 1 :])
    dt = _output(b, node, shape, 0, 1)
    attrs = {"axis": a, "in_dtypes": tuple(t.dtype for t in ins), "out_dtype": dt}
    b.emit("qlinear_concat", [t.name for t in ins], node.outputs[:1], attrs, name=node.name)


@_converts("Concat")
def _concat(b, node):
    ins = [b.tensor(t) for t in node.inputs]
    a = _axis(node, len(ins[0].shape) + 1) - 1
    if len({t.dtype for t in ins}) != 1:
        raise FormatError(f"Concat {node.name!r}: inputs of different types")
    shape = (*ins[0].shape[:a], sum(t.shape[a] for t in ins), *ins[0].shape[a + 1 :])
    q = ins[0].quant
    b.add(node.outputs[0], shape, ins[0].dtype, q)
    b.emit("onnx_concat", [t.name for t in ins], node.outputs[:1], {"axis": a}, name=node.name)


@_converts("MaxPool")
def _maxpool(b, node):
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOpError(f"MaxPool {node.name!r}: the Indices output is not supported")
    if node.attrs.get("storage_order", 0):
        raise UnsupportedOpError(f"MaxPool {node.name!r}: storage_order=1 is not supported")
    x = b.tensor(node.inputs[0])
    kernel = _pool_kernel(node)
    attrs = {**_window_attrs(node, kernel), "dilations": tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))}
    if len(x.shape) != 3:
        raise UnsupportedOpError(f"MaxPool {node.name!r}: only 2-D pools (NCHW) are supported")
    geom = window_geometry(attrs, x.shape)
    b.add(node.outputs[0], (x.shape[0], *geom.out_hw), x.dtype, x.quant)
    b.emit("onnx_maxpool", [x.name], node.outputs[:1], attrs, name=node.name)


def _reshape_to(b, node, x, full):
    """Emits a reshape of ``x`` to the batched ONNX shape ``full`` (its batch axis 1)."""
    full = tuple(int(d) for d in full)
    if not full or full[0] != 1 or math.prod(full) != math.prod(x.shape):
        raise UnsupportedOpError(
            f"{node.op} {node.name!r}: reshaping (1, {', '.join(map(str, x.shape))}) to {full} moves the batch axis"
        )
    b.add(node.outputs[0], full[1:], x.dtype, x.quant)
    b.emit("reshape", [x.name], node.outputs[:1], {"shape": full[1:]}, name=node.name)


@_converts("Reshape")
def _reshape(b, node):
    x = b.tensor(node.inputs[0])
    shape = [int(d) for d in np.asarray(b.const(node.inputs[1], "shape")).reshape(-1)]
    src = (1, *x.shape)
    if node.attrs.get("allowzero", 0) and 0 in shape:
        raise UnsupportedOpError(f"Reshape {node.name!r}: allowzero with a 0 entry is not supported")
    shape = [src[i] if d == 0 else d for i, d in enumerate(shape)]
    if shape.count(-1) > 1:
        raise FormatError(f"Reshape {node.name!r}: more than one -1 in {shape}")
    if -1 in shape:
        rest = math.prod(d for d in shape if d != -1)
        if rest == 0 or math.prod(src) % rest:
            raise FormatError(f"Reshape {node.name!r}: cannot reshape {src} to {shape}")
        shape[shape.index(-1)] = math.prod(src) // rest
    _reshape_to(b, node, x, shape)


@_converts("Flatten")
def _flatten(b, node):
    x = b.tensor(node.inputs[0])
    src = (1, *x.shape)
    a = _axis(node, len(src))
    _reshape_to(b, node, x, (math.prod(src[:a]), math.prod(src[a:])))


@_converts("Squeeze", "Unsqueeze")
def _squeeze(b, node):
    x = b.tensor(node.inputs[0])
    src = [1, *x.shape]
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = [int(a) for a in np.asarray(b.const(node.inputs[1], "axes")).reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes", [])]
    if node.op == "Squeeze":
        axes = [a % len(src) for a in axes] if axes else [i for i, d in enumerate(src) if d == 1 and i > 0]
        if 0 in axes or any(src[a] != 1 for a in axes):
            raise UnsupportedOpError(f"Squeeze {node.name!r}: axes {axes} of {tuple(src)}")
        full = [d for i, d in enumerate(src) if i not in axes]
    else:
        r = len(src) + len(axes)
        axes = sorted(a % r for a in axes)
        if 0 in axes:
            raise UnsupportedOpError(f"Unsqueeze {node.name!r}: a new leading axis moves the batch axis")
        full, it = [], iter(src)
        for i in range(r):
            full.append(1 if i in axes else next(it))
    _reshape_to(b, node, x, full)


@_converts("Transpose")
def _transpose(b, node):
    x = b.tensor(node.inputs[0])
    r = len(x.shape) + 1
    perm = [int(p) for p in node.attrs.get("perm", list(range(r))[::-1])]
    if sorted(perm) != list(range(r)):
        raise FormatError(f"Transpose {node.name!r}: perm {perm} for {r} axes")
    if perm[0] != 0:
        raise UnsupportedOpError(f"Transpose {node.name!r}: perm {perm} moves the batch axis")
    per = tuple(p - 1 for p in perm[1:])
    b.add(node.outputs[0], tuple(x.shape[p] for p in per), x.dtype, x.quant)
    b.emit("onnx_transpose", [x.name], node.outputs[:1], {"perm": per}, name=node.name)


@_converts("Identity")
def _identity(b, node):
    x = b.tensor(node.inputs[0])
    b.add(node.outputs[0], x.shape, x.dtype, x.quant)
    b.emit("reshape", [x.name], node.outputs[:1], {"shape": x.shape}, name=node.name)


def _float_in(b, node, t):
    x = b.tensor(t)
    if x.dtype != "float32":
        raise UnsupportedOpError(f"{node.op} {node.name!r}: an integer input ({x.dtype}) is not supported")
    return x


@_converts("Add", "Mul")
def _float_binary(b, node):
    fn = node.op.lower()
    have = [t in b.tensors for t in node.inputs[:2]]
    if all(have):
        xa, xb = (_float_in(b, node, t) for t in node.inputs[:2])
        b.add(node.outputs[0], broadcast_shapes(xa.shape, xb.shape), "float32")
        b.emit("onnx_float_binary", [xa.name, xb.name], node.outputs[:1], {"fn": fn}, name=node.name)
        return
    if not any(have):
        raise UnsupportedOpError(f"{node.op} {node.name!r}: both operands are constants")
    ci = 0 if not have[0] else 1
    x = _float_in(b, node, node.inputs[1 - ci])
    c = b.const(node.inputs[ci], "operand")
    if c.dtype != np.float32:
        raise UnsupportedOpError(f"{node.op} {node.name!r}: a {c.dtype} constant is not supported")
    c = c.reshape(_const_example_shape(c, len(x.shape)))
    b.add(node.outputs[0], broadcast_shapes(x.shape, c.shape), "float32")
    b.emit("onnx_float_binary", [x.name], node.outputs[:1], {"fn": fn, "const_index": ci}, {"const": c}, node.name)


@_converts("Relu", "LeakyRelu", "Sigmoid", "Clip")
def _float_unary(b, node):
    x = _float_in(b, node, node.inputs[0])
    fn = {"Relu": "relu", "LeakyRelu": "leaky_relu", "Sigmoid": "sigmoid", "Clip": "clip"}[node.op]
    attrs = {"fn": fn}
    if fn == "clip":
        bounds = []
        for i, default in ((1, float("-inf")), (2, float("inf"))):
            if len(node.inputs) > i and node.inputs[i]:
                v = np.asarray(b.const(node.inputs[i], "Clip bound"), np.float32)
                if v.size != 1:
                    raise FormatError(f"Clip {node.name!r}: bounds must be scalars")
                bounds.append(float(v.reshape(())))
            else:
                bounds.append(float(node.attrs.get("min" if i == 1 else "max", default)))
        attrs["lo"], attrs["hi"] = bounds
    if fn == "leaky_relu":
        attrs["alpha"] = float(np.float32(node.attrs.get("alpha", 0.01)))
    b.add(node.outputs[0], x.shape, "float32")
    b.emit("onnx_float_unary", [x.name], node.outputs[:1], attrs, name=node.name)


# ---------------------------------------------------------------------------------- file


def _attr_value(a):
    import onnx

    t = a.type
    A = onnx.AttributeProto
    if t == A.INT:
        return int(a.i)
    if t == A.FLOAT:
        return float(a.f)
    if t == A.STRING:
        return a.s.decode("utf-8")
    if t == A.INTS:
        return [int(v) for v in a.ints]
    if t == A.FLOATS:
        return [float(v) for v in a.floats]
    if t == A.TENSOR:
        from onnx import numpy_helper

        return numpy_helper.to_array(a.t)
    raise UnsupportedOpError(f"attribute {a.name!r} of type {t} is not supported")


def _dims(vi) -> tuple[list, str]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"graph input/output {vi.name!r} is not a tensor")
    dtype = _ELEM.get(tt.elem_type)
    if dtype is None:
        raise UnsupportedOpError(f"graph input/output {vi.name!r} has element type {tt.elem_type}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dims, dtype


def parse(data: bytes):
    """``(nodes, consts, inputs, outputs, opset)`` of an ONNX file's main graph: :class:`ONode` s,
    initializers (and Constant nodes) as NumPy arrays, the declared graph inputs and
    outputs as ``(name, dims, dtype)``, and the file's opset of the default domain."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(data)
    if not model.HasField("graph"):
        raise FormatError("the file holds no graph")
    gr = model.graph
    consts = {}
    for init in gr.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    nodes = []
    for i, n in enumerate(gr.node):
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            if "value" not in attrs:
                raise UnsupportedOpError(f"Constant {n.name!r}: only the 'value' attribute is supported")
            consts[n.output[0]] = np.asarray(attrs["value"])
            continue
        nodes.append(ONode(n.op_type, list(n.input), list(n.output), attrs, n.domain, n.name or f"{n.op_type}_{i}"))
    ins = [(vi.name, *_dims(vi)) for vi in gr.input if vi.name not in consts]
    outs = [(vi.name, *_dims(vi)) for vi in gr.output]
    opset = max([int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")] or [1])
    return nodes, consts, ins, outs, opset


def _topo(nodes: list[ONode], known: set[str]) -> list[ONode]:
    order, done, pending = [], set(known), list(nodes)
    while pending:
        ready = [n for n in pending if all(not t or t in done for t in n.inputs)]
        if not ready:
            raise FormatError(f"the graph has a cycle or reads undefined tensors (at node {pending[0].name!r})")
        for n in ready:
            order.append(n)
            done.update(n.outputs)
            pending.remove(n)
    return order


def _fold_dequantize(nodes, consts):
    """DequantizeLinear of constants (per tensor or per axis), computed as the runtime does:
    float32 constants; the nodes that are left."""
    rest = []
    for n in nodes:
        if n.op == "DequantizeLinear" and n.inputs[0] in consts and all(not t or t in consts for t in n.inputs):
            q = consts[n.inputs[0]]
            s = np.asarray(consts[n.inputs[1]], np.float32)
            z = consts[n.inputs[2]] if len(n.inputs) > 2 and n.inputs[2] else np.zeros((), q.dtype)
            if s.size > 1:
                ax = int(n.attrs.get("axis", 1)) % q.ndim
                sh = [1] * q.ndim
                sh[ax] = -1
                s, z = s.reshape(sh), np.asarray(z).reshape(sh)
            d = (q.astype(np.int64) - np.asarray(z).astype(np.int64)).astype(np.float32) * s
            consts[n.outputs[0]] = d.astype(np.float32)
        else:
            rest.append(n)
    return rest


#: the attribute by which :func:`_channels_first` marks a QLinearConv that ran as ONNX
#: Runtime's NHWC kernel (not an ONNX attribute: a name ONNX cannot hold)
_NHWC = "hwjax:nhwc"

_CHANNELS_LAST = ("QLinearConv", "QLinearAveragePool", "QLinearGlobalAveragePool", "NhwcMaxPool")


def _channels_first(nodes: list[ONode]) -> list[ONode]:
    """ONNX Runtime's NHWC kernels (``channels_last=1`` QLinear ops and ``NhwcMaxPool``, as in
    the models ORT saves with ``optimized_model_filepath``) as their NCHW forms between two
    Transposes (the same values)."""
    out = []
    for n in nodes:
        nhwc = n.domain == "com.microsoft" and n.op in _CHANNELS_LAST
        if not nhwc or not (n.op == "NhwcMaxPool" or n.attrs.get("channels_last", 0)):
            out.append(n)
            continue
        x, y = n.inputs[0], n.outputs[0]
        xt, yt = f"{x}:nchw:{n.name}", f"{y}:nchw"
        op = "MaxPool" if n.op == "NhwcMaxPool" else n.op
        attrs = {k: v for k, v in n.attrs.items() if k != "channels_last"}
        if n.op == "QLinearConv":  # ONNX Runtime's x64quantprecision rewrite does not match it
            attrs[_NHWC] = 1
        domain = "" if op in ("MaxPool", "QLinearConv") else n.domain
        out.append(ONode("Transpose", [x], [xt], {"perm": [0, 3, 1, 2]}, "", xt))
        out.append(ONode(op, [xt, *n.inputs[1:]], [yt, *n.outputs[1:]], attrs, domain, n.name))
        out.append(ONode("Transpose", [yt], [y], {"perm": [0, 2, 3, 1]}, "", y))
    return out


def read(data: bytes):
    """``(graph, inputs, outputs)`` of an ONNX int8 model (``data``: the file's bytes) as ONNX
    Runtime's CPU provider runs it at ``ORT_ENABLE_ALL`` (module :mod:`hwjax.onnx._qdq`)."""
    nodes, consts, ins, outs, opset = parse(data)
    nodes = _topo(nodes, {n for n, _, _ in ins} | set(consts))
    nodes = fuse(nodes, consts, [n for n, _, _ in outs])
    refused = [f"{n.op} {n.name!r}" for n in nodes if n.op in FLOAT_REFUSED and n.domain in ("", "ai.onnx")]
    if refused:
        raise UnsupportedOpError(
            "ONNX Runtime runs these groups in float32 (unfused QDQ groups whose MLAS float kernels "
            f"hwjax does not reproduce): {', '.join(refused)}"
        )
    nodes = _channels_first(_fold_dequantize(nodes, consts))
    b = _Builder(consts, opset)
    in_infos = []
    for name, dims, dtype in ins:
        if not dims or any(d is None for d in dims[1:]) or dims[0] not in (1, None):
            raise UnsupportedOpError(f"input {name!r}: shape {dims} (needs a batch axis of 1 and fixed sizes)")
        b.add(name, dims[1:], dtype)
        in_infos.append(TensorInfo(name, (1, *dims[1:]), dtype))
    for n in nodes:
        if n.domain not in ("", "ai.onnx", "com.microsoft"):
            raise UnsupportedOpError(f"operator {n.domain}.{n.op} ({n.name!r}) is not supported")
        conv = _CONVERTERS.get(n.op)
        ms = n.domain == "com.microsoft"
        if conv is None or (ms != (n.op in _MS_OPS) and n.op != "QLinearConv"):
            raise UnsupportedOpError(f"operator {n.op} ({n.name!r}) is not supported; supported: {supported_ops()}")
        conv(b, n)
    out_infos = []
    for name, dims, dtype in outs:
        t = b.tensor(name)
        if t.dtype != dtype:
            raise FormatError(f"output {name!r} is declared {dtype}, computed {t.dtype}")
        out_infos.append(TensorInfo(name, (1, *t.shape), dtype))
    graph = Graph(b.tensors, b.nodes, tuple(n for n, _, _ in ins), tuple(n for n, _, _ in outs)).validate()
    return graph, in_infos, out_infos
