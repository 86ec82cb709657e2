"""A seeded random generator of int8 ONNX models, for differential tests against ONNX Runtime.

Written from the ONNX operator definitions alone (it imports nothing from hwjax): a float
CNN or MLP is built with ``onnx.helper`` from random layers, then quantised with
``onnxruntime.quantization.quantize_static`` (random calibration data) in a random
setting: QDQ or QOperator format, uint8 or int8 activations and weights, per-tensor or
per-channel weights. ``model(seed)`` returns ``(onnx bytes, input batch, description)``.
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np

# float ops the generator draws from, image and vector stages
IMAGE_OPS = (
    "conv",
    "depthwise",
    "relu",
    "clip",
    "leaky_relu",
    "sigmoid",
    "maxpool",
    "avgpool",
    "add",
    "mul",
    "concat",
    "transpose",
)
VECTOR_OPS = ("gemm", "matmul", "relu", "sigmoid", "add_const", "reshape_matmul", "unsqueeze")

#: quantize_static settings: (format, activation type, weight type, per_channel)
SETTINGS = (
    ("QDQ", "uint8", "int8", False),
    ("QDQ", "uint8", "int8", True),
    ("QDQ", "uint8", "uint8", False),
    ("QOperator", "uint8", "int8", False),
    ("QOperator", "uint8", "int8", True),
    ("QOperator", "uint8", "uint8", False),
    ("QDQ", "int8", "int8", False),
    ("QOperator", "int8", "int8", False),
)


class _Net:
    def __init__(self, rng):
        self.rng = rng
        self.nodes, self.inits = [], []
        self.n = 0

    def name(self, base):
        self.n += 1
        return f"{base}{self.n}"

    def init(self, base, arr):
        from onnx import numpy_helper

        nm = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def node(self, op, ins, **attrs):
        from onnx import helper

        out = self.name(op.lower() + "_")
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out


def _conv(net, x, shape, depthwise=False):
    rng = net.rng
    c, h, w = shape
    k = int(rng.choice([1, 2, 3, 5]))
    d = int(rng.choice([1, 1, 2])) if k > 1 else 1
    ek = (k - 1) * d + 1
    s = int(rng.choice([1, 1, 2]))
    pads = [int(rng.integers(0, k)) for _ in range(4)]
    if h + pads[0] + pads[2] < ek or w + pads[1] + pads[3] < ek:
        pads = [ek // 2] * 4
    if h + pads[0] + pads[2] < ek or w + pads[1] + pads[3] < ek:
        k, d, ek, pads = 1, 1, 1, [0, 0, 0, 0]
    if depthwise:
        g = c
        o = c * int(rng.choice([1, 1, 2]))
    else:
        g = int(rng.choice([d_ for d_ in (1, 1, 1, 2, 3) if c % d_ == 0]))
        o = g * int(rng.integers(1, 9))
    wt = rng.normal(0, 1 / np.sqrt(k * k * c / g), (o, c // g, k, k)).astype(np.float32)
    b = rng.normal(0, 0.2, o).astype(np.float32)
    ins = [x, net.init("w", wt)] + ([net.init("b", b)] if rng.random() < 0.8 else [])
    y = net.node("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=g)
    oh = (h + pads[0] + pads[2] - ek) // s + 1
    ow = (w + pads[1] + pads[3] - ek) // s + 1
    return y, (o, oh, ow)


def _pool(net, x, shape, op):
    rng = net.rng
    c, h, w = shape
    k = int(rng.choice([2, 3]))
    s = int(rng.choice([1, 2]))
    pads = [int(rng.integers(0, k)) for _ in range(4)] if rng.random() < 0.5 else [0, 0, 0, 0]
    if h + pads[0] + pads[2] < k or w + pads[1] + pads[3] < k:
        return x, shape
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads)
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    y = net.node(op, [x], **attrs)
    return y, (c, (h + pads[0] + pads[2] - k) // s + 1, (w + pads[1] + pads[3] - k) // s + 1)


def float_model(rng, *, image=True):
    """A random float ONNX model (``ModelProto``) with a batch axis ``N`` and its input shape."""
    from onnx import TensorProto, helper

    net = _Net(rng)
    if image:
        shape = (int(rng.integers(1, 9)), int(rng.integers(4, 13)), int(rng.integers(4, 13)))
    else:
        shape = (int(rng.integers(2, 40)),)
    x = "input"
    in_shape = shape
    if image:
        for i in range(int(rng.integers(1, 6))):
            # quantize_static quantises from the first linear op on: most models start with one
            op = "conv" if i == 0 and rng.random() < 0.7 else str(rng.choice(IMAGE_OPS))
            if op in ("conv", "depthwise"):
                x, shape = _conv(net, x, shape, op == "depthwise")
            elif op == "relu":
                x = net.node("Relu", [x])
            elif op == "clip":
                x = net.node("Clip", [x, net.init("lo", np.float32(0)), net.init("hi", np.float32(6))])
            elif op == "transpose":  # swap H and W
                x = net.node("Transpose", [x], perm=[0, 1, 3, 2])
                shape = (shape[0], shape[2], shape[1])
            elif op == "leaky_relu":
                x = net.node("LeakyRelu", [x], alpha=float(rng.choice([0.01, 0.1, 0.2])))
            elif op == "sigmoid":
                x = net.node("Sigmoid", [x])
            elif op == "maxpool":
                x, shape = _pool(net, x, shape, "MaxPool")
            elif op == "avgpool":
                x, shape = _pool(net, x, shape, "AveragePool")
            elif op in ("add", "mul", "concat"):
                # a residual branch: a 1x1 or 3x3 same-size conv of x, then merged
                c, h, w = shape
                o = c if op != "concat" else int(rng.integers(1, 6))
                k = int(rng.choice([1, 3]))
                wt = rng.normal(0, 1 / np.sqrt(k * k * c), (o, c, k, k)).astype(np.float32)
                br = net.node("Conv", [x, net.init("w", wt)], kernel_shape=[k, k], pads=[k // 2] * 4)
                if op == "concat":
                    x = net.node("Concat", [x, br], axis=1)
                    shape = (c + o, h, w)
                else:
                    x = net.node(op.capitalize(), [x, br])
        if rng.random() < 0.5:
            x = net.node("GlobalAveragePool", [x])
            shape = (shape[0], 1, 1)
        x = net.node("Flatten", [x], axis=1)
        shape = (int(np.prod(shape)),)
    for _ in range(int(rng.integers(1, 4))):
        op = str(rng.choice(VECTOR_OPS))
        n = shape[0]
        if op in ("gemm", "matmul"):
            m = int(rng.integers(1, 33))
            wt = rng.normal(0, 1 / np.sqrt(n), (n, m)).astype(np.float32)
            if op == "gemm":
                b = rng.normal(0, 0.2, m).astype(np.float32)
                x = net.node("Gemm", [x, net.init("w", wt.T.copy()), net.init("b", b)], transB=1)
            else:
                x = net.node("MatMul", [x, net.init("w", wt)])
            shape = (m,)
        elif op == "relu":
            x = net.node("Relu", [x])
        elif op == "sigmoid":
            x = net.node("Sigmoid", [x])
        elif op == "reshape_matmul":  # (N, n) -> (N, a, n / a) @ (n / a, m) -> (N, a * m)
            a = int(rng.choice([d for d in range(1, min(n, 8) + 1) if n % d == 0]))
            x = net.node("Reshape", [x, net.init("shape", np.array([-1, a, n // a], np.int64))])
            m = int(rng.integers(1, 17))
            wt = rng.normal(0, 1 / np.sqrt(n // a), (n // a, m)).astype(np.float32)
            x = net.node("MatMul", [x, net.init("w", wt)])
            x = net.node("Flatten", [x], axis=1)
            shape = (a * m,)
        elif op == "unsqueeze":
            x = net.node("Unsqueeze", [x, net.init("ax", np.array([1], np.int64))])
            x = net.node("Squeeze", [x, net.init("ax", np.array([1], np.int64))])
        else:
            x = net.node("Add", [x, net.init("c", rng.normal(0, 0.5, n).astype(np.float32))])
    out = net.node("Identity", [x])
    graph = helper.make_graph(
        net.nodes,
        "rand",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *in_shape])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", *shape])],
        net.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, in_shape


class _Reader:
    def __init__(self, batches):
        self.it = iter(batches)

    def get_next(self):
        b = next(self.it, None)
        return None if b is None else {"input": b}

    def rewind(self):  # pragma: no cover
        pass


def quantize(model, in_shape, rng, setting):
    """``model`` quantised by ``quantize_static`` in ``setting`` (:data:`SETTINGS`) with 8
    random calibration batches; returns the quantised model's bytes."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    fmt, act, wt, per_channel = setting
    qt = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    scale = float(rng.choice([0.5, 1.0, 3.0]))
    calib = [(rng.normal(0, scale, (4, *in_shape))).astype(np.float32) for _ in range(8)]
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        with open(src, "wb") as f:
            f.write(model.SerializeToString())
        quantize_static(
            src,
            dst,
            _Reader(calib),
            quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
            activation_type=qt[act],
            weight_type=qt[wt],
            per_channel=per_channel,
        )
        with open(dst, "rb") as f:
            return f.read(), scale


def model(seed: int, setting=None):
    """``(onnx bytes, float32 input batch (16, ...), description)`` for ``seed``: a random float
    model quantised in a random (or the given) setting."""
    rng = np.random.default_rng(seed)
    image = bool(rng.random() < 0.75)
    fm, in_shape = float_model(rng, image=image)
    if setting is None:
        setting = SETTINGS[int(rng.integers(len(SETTINGS)))]
    data, scale = quantize(fm, in_shape, rng, setting)
    x = rng.normal(0, scale * 1.3, (16, *in_shape)).astype(np.float32)
    ops = [n.op_type for n in fm.graph.node]
    return data, x, f"seed {seed} {setting} {ops}"


def ort_run(data: bytes, x: np.ndarray, *, optimized_path=None, config: dict | None = None):
    """ONNX Runtime's CPU output for ``x`` (one thread, ``ORT_ENABLE_ALL``; ``config``: session
    configuration entries, e.g. ``{"session.x64quantprecision": "1"}``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return sess.run(None, {name: x})[0]


def ort_optimized_ops(data: bytes) -> list[str]:
    """The op types of ONNX Runtime's optimised graph of ``data``."""
    import onnx

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "opt.onnx")
        ort_run(data, np.zeros((1,), np.float32), optimized_path=p) if False else _optimize(data, p)
        m = onnx.load(p)
    return [n.op_type for n in m.graph.node]


def _optimize(data: bytes, path: str) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = path
    so.log_severity_level = 3
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


__all__ = ["SETTINGS", "float_model", "io", "model", "ort_optimized_ops", "ort_run", "quantize"]


# --------------------------------------------------------------- QOperator models, built directly

QOP_OPS = (
    "conv",
    "conv",
    "depthwise",
    "add",
    "mul",
    "avgpool",
    "gavgpool",
    "sigmoid",
    "leaky_relu",
    "concat",
    "maxpool",
)


def _scale(rng, std):
    """An output scale for values of standard deviation ``std``: sometimes a power of two
    (exact ties), mostly a random float32 near ``6 std / 255``."""
    s = max(float(std), 1e-3) * 6 / 255 * float(np.exp(rng.uniform(-1.0, 0.7)))
    if rng.random() < 0.3:
        s = float(2.0 ** np.round(np.log2(s)))
    return np.float32(s)


def _zp(rng, dt):
    if dt == "uint8":
        return np.uint8(rng.choice([0, 128, int(rng.integers(0, 256))]))
    return np.int8(rng.choice([0, int(rng.integers(-128, 128))]))


def qop_model(seed: int):
    """``(onnx bytes, float32 input batch, description)``: a random model of QOperator ops with
    random quantisation parameters (power-of-two scales for exact ties, per-channel weight
    scales, nonzero weight zero points, large biases, saturating output scales), ending in
    DequantizeLinear, or in an int32 ConvInteger / MatMulInteger."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(10_000 + seed)
    net = _Net(rng)
    act = str(rng.choice(["uint8", "uint8", "int8"]))
    npt = {"uint8": np.uint8, "int8": np.int8}
    c, h, w = int(rng.integers(1, 10)), int(rng.integers(3, 11)), int(rng.integers(3, 11))
    in_shape = (c, h, w)
    xs = float(rng.choice([0.5, 1.0, 2.0]))
    std = xs
    s, z = _scale(rng, std), _zp(rng, act)
    cur = net.node("QuantizeLinear", ["input", net.init("s", s), net.init("z", z)])
    ops = []
    shape = in_shape
    ms = "com.microsoft"
    integer_end = False
    for _ in range(int(rng.integers(1, 6))):
        op = str(rng.choice(QOP_OPS))
        c, h, w = shape
        ops.append(op)
        if op in ("conv", "depthwise"):
            k = int(rng.choice([1, 2, 3]))
            d = int(rng.choice([1, 2])) if k > 1 else 1
            ek = (k - 1) * d + 1
            st = int(rng.choice([1, 2]))
            pads = [int(rng.integers(0, k)) for _ in range(4)]
            if h + pads[0] + pads[2] < ek or w + pads[1] + pads[3] < ek:
                k, d, ek, pads = 1, 1, 1, [0, 0, 0, 0]
            g = c if op == "depthwise" else int(rng.choice([g_ for g_ in (1, 1, 2, 3) if c % g_ == 0]))
            o = c * int(rng.choice([1, 2])) if op == "depthwise" else g * int(rng.integers(1, 7))
            wt = "int8" if act == "int8" else str(rng.choice(["int8", "uint8"]))
            lo, hi = (-128, 127) if wt == "int8" else (0, 255)
            W = rng.integers(lo, hi + 1, (o, c // g, k, k)).astype(npt[wt])
            wz = np.zeros((), npt[wt]) if wt == "int8" and rng.random() < 0.6 else _zp(rng, wt)
            per_channel = rng.random() < 0.5
            wsc = (
                (
                    np.float32(2.0 ** rng.integers(-9, -5, o))
                    if rng.random() < 0.3
                    else np.float32(np.exp(rng.uniform(-7, -4, o)))
                )
                if per_channel
                else np.float32(2.0**-7)
            )
            acc_std = np.sqrt(k * k * c / g) * std * float(np.mean(wsc)) * 74
            bias_big = rng.random() < 0.3
            B = rng.integers(-(2**25) if bias_big else -(2**12), 2**25 if bias_big else 2**12, o).astype(np.int32)
            sy, zy = _scale(rng, acc_std), _zp(rng, act)
            if integer_end or (rng.random() < 0.1 and act == "uint8" and wt == "uint8"):
                pass
            if rng.random() < 0.08:  # ConvInteger: an int32 result ends the model
                y = net.node(
                    "ConvInteger",
                    [cur, net.init("W", W), net.init("xz", z), net.init("wz", wz)],
                    kernel_shape=[k, k],
                    strides=[st, st],
                    pads=pads,
                    dilations=[d, d],
                    group=g,
                )
                cur, integer_end = y, True
                break
            ins = [
                cur,
                net.init("s", s),
                net.init("z", z),
                net.init("W", W),
                net.init("ws", wsc),
                net.init("wz", wz),
                net.init("ys", sy),
                net.init("yz", zy),
            ]
            if rng.random() < 0.8:
                ins.append(net.init("B", B))
            cur = net.node(
                "QLinearConv", ins, kernel_shape=[k, k], strides=[st, st], pads=pads, dilations=[d, d], group=g
            )
            shape = (o, (h + pads[0] + pads[2] - ek) // st + 1, (w + pads[1] + pads[3] - ek) // st + 1)
            s, z, std = sy, zy, acc_std
        elif op in ("add", "mul"):
            kind = rng.choice(["same", "const_c", "scalar"])
            if kind == "same":
                other, so, zo = cur, s, z
            else:
                cshape = (c, 1, 1) if kind == "const_c" else (1,)
                lo, hi = (0, 255) if act == "uint8" else (-128, 127)
                other = net.init("c", rng.integers(lo, hi + 1, cshape).astype(npt[act]))
                so, zo = _scale(rng, std), _zp(rng, act)
            sy, zy = _scale(rng, std * (2 if op == "add" else std)), _zp(rng, act)
            a_ins = [cur, net.init("s", s), net.init("z", z)]
            b_ins = [other, net.init("s", so), net.init("z", zo)]
            if rng.random() < 0.3:
                a_ins, b_ins = b_ins, a_ins
            y = net.name("q" + op)
            net.nodes.append(
                helper.make_node(
                    "QLinear" + op.capitalize(),
                    a_ins + b_ins + [net.init("ys", sy), net.init("yz", zy)],
                    [y],
                    domain=ms,
                    name=y,
                )
            )
            cur, s, z = y, sy, zy
            std = std * 2 if op == "add" else std * std
        elif op in ("avgpool", "maxpool"):
            k = int(rng.choice([2, 3])) if h >= 3 and w >= 3 else 2
            if h < k or w < k:
                continue
            st = int(rng.choice([1, 2]))
            pads = [int(rng.integers(0, k)) for _ in range(4)] if rng.random() < 0.5 else [0, 0, 0, 0]
            if rng.random() < 0.2:
                k, st, pads = None, 1, [0, 0, 0, 0]  # the window is the whole image
            kk = [h, w] if k is None else [k, k]
            if op == "maxpool":
                cur = net.node("MaxPool", [cur], kernel_shape=kk, strides=[st, st], pads=pads)
            else:
                sy, zy = _scale(rng, std), _zp(rng, act)
                y = net.name("qavg")
                net.nodes.append(
                    helper.make_node(
                        "QLinearAveragePool",
                        [cur, net.init("s", s), net.init("z", z), net.init("ys", sy), net.init("yz", zy)],
                        [y],
                        domain=ms,
                        name=y,
                        kernel_shape=kk,
                        strides=[st, st],
                        pads=pads,
                        count_include_pad=int(rng.integers(0, 2)),
                    )
                )
                cur, s, z = y, sy, zy
            shape = (c, (h + pads[0] + pads[2] - kk[0]) // st + 1, (w + pads[1] + pads[3] - kk[1]) // st + 1)
        elif op == "gavgpool":
            sy, zy = _scale(rng, std), _zp(rng, act)
            y = net.name("qgap")
            net.nodes.append(
                helper.make_node(
                    "QLinearGlobalAveragePool",
                    [cur, net.init("s", s), net.init("z", z), net.init("ys", sy), net.init("yz", zy)],
                    [y],
                    domain=ms,
                    name=y,
                    channels_last=0,
                )
            )
            cur, s, z, shape = y, sy, zy, (c, 1, 1)
        elif op in ("sigmoid", "leaky_relu"):
            if op == "sigmoid":
                sy, zy = np.float32(rng.choice([1 / 256, 1 / 255, float(_scale(rng, 0.3))])), _zp(rng, act)
                y = net.name("qsig")
                net.nodes.append(
                    helper.make_node(
                        "QLinearSigmoid",
                        [cur, net.init("s", s), net.init("z", z), net.init("ys", sy), net.init("yz", zy)],
                        [y],
                        domain=ms,
                        name=y,
                    )
                )
            else:
                sy, zy = _scale(rng, std), _zp(rng, act)
                y = net.name("qlrelu")
                net.nodes.append(
                    helper.make_node(
                        "QLinearLeakyRelu",
                        [cur, net.init("s", s), net.init("z", z), net.init("ys", sy), net.init("yz", zy)],
                        [y],
                        domain=ms,
                        name=y,
                        alpha=float(rng.choice([0.01, 0.1, 0.3])),
                    )
                )
            cur, s, z = y, sy, zy
        else:  # concat with a requantised copy of itself
            s2, z2 = _scale(rng, std), _zp(rng, act)
            sy, zy = (s, z) if rng.random() < 0.4 else (_scale(rng, std), _zp(rng, act))
            y = net.name("qcat")
            net.nodes.append(
                helper.make_node(
                    "QLinearConcat",
                    [
                        net.init("ys", sy),
                        net.init("yz", zy),
                        cur,
                        net.init("s", s),
                        net.init("z", z),
                        cur,
                        net.init("s", s2),
                        net.init("z", z2),
                    ],
                    [y],
                    domain=ms,
                    name=y,
                    axis=1,
                )
            )
            cur, s, z, shape = y, sy, zy, (2 * c, h, w)
    if not integer_end:
        cur = net.node("Flatten", [cur], axis=1)
        n = int(np.prod(shape))
        kind = rng.choice(["matmul", "gemm", "matmul_integer", "none"])
        m = int(rng.integers(1, 20))
        wt = "int8" if act == "int8" else str(rng.choice(["int8", "uint8"]))
        lo, hi = (-128, 127) if wt == "int8" else (0, 255)
        W = rng.integers(lo, hi + 1, (n, m)).astype(npt[wt])
        wz = np.zeros((), npt[wt]) if wt == "int8" and rng.random() < 0.6 else _zp(rng, wt)
        ws = np.float32(np.exp(rng.uniform(-7, -4, m))) if rng.random() < 0.5 else np.float32(2.0**-7)
        wz = np.full(np.shape(ws), wz, npt[wt])  # QGemm: a zero point per scale
        acc_std = np.sqrt(n) * std * float(np.mean(ws)) * 74
        sy, zy = _scale(rng, acc_std), _zp(rng, act)
        if kind == "matmul":
            cur = net.node(
                "QLinearMatMul",
                [
                    cur,
                    net.init("s", s),
                    net.init("z", z),
                    net.init("W", W),
                    net.init("ws", ws),
                    net.init("wz", wz),
                    net.init("ys", sy),
                    net.init("yz", zy),
                ],
            )
            s, z = sy, zy
        elif kind == "gemm":
            C = rng.integers(-(2**14), 2**14, m).astype(np.int32)
            y = net.name("qgemm")
            net.nodes.append(
                helper.make_node(
                    "QGemm",
                    [
                        cur,
                        net.init("s", s),
                        net.init("z", z),
                        net.init("W", W.T.copy()),
                        net.init("ws", ws),
                        net.init("wz", wz),
                        net.init("C", C),
                        net.init("ys", sy),
                        net.init("yz", zy),
                    ],
                    [y],
                    domain=ms,
                    name=y,
                    transB=1,
                    alpha=float(rng.choice([1.0, 1.0, 0.5, 0.3])),
                )
            )
            cur, s, z = y, sy, zy
        elif kind == "matmul_integer":
            cur = net.node("MatMulInteger", [cur, net.init("W", W), net.init("z", z), net.init("wz", wz)])
            integer_end = True
        ops.append(str(kind))
        if not integer_end:
            cur = net.node("DequantizeLinear", [cur, net.init("s", s), net.init("z", z)])
    out_type = TensorProto.INT32 if integer_end else TensorProto.FLOAT
    graph = helper.make_graph(
        net.nodes,
        "qop",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *in_shape])],
        [helper.make_tensor_value_info(cur, out_type, None)],
        net.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(ms, 1)])
    model.ir_version = 8
    x = rng.normal(0, xs * 1.5, (16, *in_shape)).astype(np.float32)
    return model.SerializeToString(), x, f"qop seed {seed} {act} {ops}"


def small_cnn(seed: int = 0):
    """A fixed small float CNN (the op mix of a mobile classifier): Conv + Relu, MaxPool,
    depthwise Conv, 1x1 Conv, a residual Add, LeakyRelu, AveragePool, a Sigmoid gate (Mul),
    Concat, GlobalAveragePool, Flatten, Gemm and MatMul; ``(ModelProto, input shape)``."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    net = _Net(rng)

    def conv(x, cin, cout, k, group=1, stride=1):
        w = rng.normal(0, 1 / np.sqrt(k * k * cin / group), (cout, cin // group, k, k)).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        return net.node(
            "Conv",
            [x, net.init("w", w), net.init("b", b)],
            kernel_shape=[k, k],
            pads=[k // 2] * 4,
            group=group,
            strides=[stride, stride],
        )

    x = net.node("Relu", [conv("input", 3, 8, 3)])  # 8 x 16 x 16
    x = net.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])  # 8 x 8 x 8
    d = net.node("Relu", [conv(x, 8, 8, 3, group=8)])
    p = conv(d, 8, 8, 1)
    x = net.node("Add", [x, p])
    x = net.node("LeakyRelu", [x], alpha=0.1)
    x = net.node("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    g = net.node("Sigmoid", [conv(x, 8, 8, 1)])
    x = net.node("Mul", [x, g])
    y = conv(x, 8, 4, 3, stride=2)  # 4 x 4 x 4
    z = net.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])  # 8 x 4 x 4
    x = net.node("Concat", [y, z], axis=1)  # 12 x 4 x 4
    x = net.node("GlobalAveragePool", [x])
    x = net.node("Flatten", [x], axis=1)
    w1 = rng.normal(0, 1 / np.sqrt(12), (16, 12)).astype(np.float32)
    x = net.node("Gemm", [x, net.init("w", w1), net.init("b", rng.normal(0, 0.1, 16).astype(np.float32))], transB=1)
    x = net.node("Relu", [x])
    x = net.node("MatMul", [x, net.init("w", rng.normal(0, 0.25, (16, 10)).astype(np.float32))])
    graph = helper.make_graph(
        net.nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 10])],
        net.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, (3, 16, 16)


def float_groups_model():
    """A QDQ model with an int8 quantisation that feeds two nodes, so that ONNX Runtime keeps
    the groups around it in float32 (LeakyRelu, Add; the MaxPool on int8): ``(ONNX bytes,
    input batch)``. Found at quantize_static seed 75 (s8s8 QDQ)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {
        "s": np.float32(0.05),
        "z8": np.int8(3),
        "s2": np.float32(0.07),
        "z2": np.int8(-5),
        "s3": np.float32(0.11),
        "s4": np.float32(0.09),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "s", "z8"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s", "z8"], ["d1"]),
        helper.make_node("LeakyRelu", ["d1"], ["l"], alpha=0.1),
        helper.make_node("QuantizeLinear", ["l", "s2", "z2"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["d2"]),
        helper.make_node("MaxPool", ["d2"], ["g"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["g", "s4", "z8"], ["q4"]),
        helper.make_node("DequantizeLinear", ["q4", "s4", "z8"], ["d4"]),
        helper.make_node("Add", ["d2", "d4"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "s3", "z8"], ["q3"]),
        helper.make_node("DequantizeLinear", ["q3", "s3", "z8"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = np.random.default_rng(0).normal(0, 3, (16, 3, 5, 5)).astype(np.float32)
    return m.SerializeToString(), x
