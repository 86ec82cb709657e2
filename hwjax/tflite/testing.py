"""Random int8 TFLite models for differential tests, and running them in LiteRT.

Needs ``ai-edge-litert`` (the ``test`` extra): models are written with the flatbuffer
object API in ``ai_edge_litert.schema_py_generated`` (no TensorFlow).
"""

from __future__ import annotations

import numpy as np

RESOLVERS = {"reference": "BUILTIN_REF", "optimized": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "xnnpack": "AUTO"}
ACTIVATION_CODES = {None: 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}


class ModelBuilder:
    """A one-subgraph int8 model: add tensors and operators, then :meth:`finish`."""

    def __init__(self):
        import ai_edge_litert.schema_py_generated as s

        self.s = s
        self.buffers = [s.BufferT()]
        self.tensors = []
        self.ops = []
        self.codes: dict[int, int] = {}

    def tensor(self, shape, dtype="int8", scale=None, zero_point=None, data=None, axis=0, name=None) -> int:
        s = self.s
        t = s.TensorT()
        t.shape = np.asarray(shape, np.int32)
        t.type = {
            "int8": s.TensorType.INT8,
            "int32": s.TensorType.INT32,
            "uint8": s.TensorType.UINT8,
            "float32": s.TensorType.FLOAT32,
        }[dtype]
        t.name = name or f"t{len(self.tensors)}"
        if data is not None:
            b = s.BufferT()
            b.data = np.frombuffer(
                np.ascontiguousarray(data).astype(np.dtype(dtype).newbyteorder("<")).tobytes(), np.uint8
            )
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        else:
            t.buffer = 0
        if scale is not None:
            q = s.QuantizationParametersT()
            q.scale = np.asarray(scale, np.float32).reshape(-1)
            q.zeroPoint = np.asarray(
                zero_point if zero_point is not None else np.zeros(q.scale.shape), np.int64
            ).reshape(-1)
            q.quantizedDimension = axis
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, name: str, inputs, outputs, options=None, version: int = 1):
        s = self.s
        code = getattr(s.BuiltinOperator, name)
        if code not in self.codes:
            self.codes[code] = (len(self.codes), version)
        o = s.OperatorT()
        o.opcodeIndex = self.codes[code][0]
        o.inputs = np.asarray(inputs, np.int32)
        o.outputs = np.asarray(outputs, np.int32)
        if options is not None:
            kind, fields = options
            opt = getattr(s, kind + "T")()
            for k, v in fields.items():
                setattr(opt, k, v)
            o.builtinOptionsType = getattr(s.BuiltinOptions, kind)
            o.builtinOptions = opt
        self.ops.append(o)

    def finish(self, inputs, outputs) -> bytes:
        import flatbuffers

        s = self.s
        sg = s.SubGraphT()
        sg.tensors, sg.operators = self.tensors, self.ops
        sg.inputs, sg.outputs = np.asarray(inputs, np.int32), np.asarray(outputs, np.int32)
        m = s.ModelT()
        m.version = 3
        m.subgraphs = [sg]
        m.buffers = self.buffers
        codes = []
        for code, (_, version) in sorted(self.codes.items(), key=lambda kv: kv[1][0]):
            c = s.OperatorCodeT()
            c.builtinCode = code
            c.deprecatedBuiltinCode = min(code, 127)
            c.version = version
            codes.append(c)
        m.operatorCodes = codes
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def run_litert(model: bytes, x: np.ndarray, runtime: str) -> np.ndarray:
    """Runs ``model`` in LiteRT (one sample at a time; ``x`` has a leading batch axis)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=model, num_threads=1, experimental_op_resolver_type=getattr(OpResolverType, RESOLVERS[runtime])
    )
    it.allocate_tensors()
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    ys = []
    for xi in x:
        it.set_tensor(i["index"], xi[None].astype(i["dtype"]))
        it.invoke()
        ys.append(it.get_tensor(o["index"])[0].copy())
    return np.stack(ys)


# ----------------------------------------------------------------------- random models


def random_scale(rng, lo=-3.0, hi=-1.0):
    return np.float32(10.0 ** rng.uniform(lo, hi))


def act_tensor(mb, rng, shape, scale=None, zp=None):
    return mb.tensor(
        (1, *shape),
        "int8",
        scale if scale is not None else random_scale(rng, -2, -0.5),
        zp if zp is not None else int(rng.integers(-20, 20)),
    )


def random_filter_scales(rng, n, per_channel):
    return rng.uniform(0.002, 0.02, n if per_channel else 1).astype(np.float32)


def out_scale_for(s_in, s_w, fan_in):
    # output scale so that outputs spread over the int8 range without much saturation
    return np.float32(float(s_in) * float(np.max(s_w)) * 40.0 * np.sqrt(fan_in) / 30.0)


def linear_model(
    rng,
    kind: str,
    *,
    in_shape,
    out_ch=None,
    k=(3, 3),
    stride=(1, 1),
    padding="SAME",
    per_channel=True,
    activation=None,
    bias=True,
) -> tuple[bytes, tuple]:
    """A one-op FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D model with random int8 weights."""
    mb = ModelBuilder()
    s_in = random_scale(rng)
    x = act_tensor(mb, rng, in_shape, s_in)
    if kind == "FULLY_CONNECTED":
        n, fan = out_ch, in_shape[-1]
        w_shape, axis = (n, in_shape[-1]), 0
    elif kind == "CONV_2D":
        n, fan = out_ch, k[0] * k[1] * in_shape[-1]
        w_shape, axis = (n, *k, in_shape[-1]), 0
    else:
        n, fan = in_shape[-1], k[0] * k[1]
        w_shape, axis = (1, *k, n), 3
    s_w = random_filter_scales(rng, n, per_channel)
    w = mb.tensor(w_shape, "int8", s_w, np.zeros(s_w.shape), rng.integers(-127, 128, w_shape), axis=axis)
    bias_t = (
        mb.tensor(
            (n,),
            "int32",
            (np.float32(s_in) * s_w).astype(np.float32),
            np.zeros(s_w.shape),
            rng.integers(-3000, 3000, n),
        )
        if bias
        else -1
    )
    s_out = out_scale_for(s_in, s_w, fan)
    if kind == "FULLY_CONNECTED":
        out_shape = (n,)
        opts = ("FullyConnectedOptions", {"fusedActivationFunction": ACTIVATION_CODES[activation]})
        version = 4 if per_channel else 1
    else:
        from hwjax.litert import conv_geometry

        g = conv_geometry(in_shape[:2], k, stride, padding)
        out_shape = (*g.out_hw, n)
        pad = 0 if padding == "SAME" else 1
        f = {
            "padding": pad,
            "strideH": stride[0],
            "strideW": stride[1],
            "fusedActivationFunction": ACTIVATION_CODES[activation],
            "dilationHFactor": 1,
            "dilationWFactor": 1,
        }
        if kind == "DEPTHWISE_CONV_2D":
            f["depthMultiplier"] = 1
        opts = ("Conv2DOptions" if kind == "CONV_2D" else "DepthwiseConv2DOptions", f)
        version = 3
    y = act_tensor(mb, rng, out_shape, s_out)
    mb.op(kind, [x, w, bias_t], [y], opts, version)
    return mb.finish([x], [y]), in_shape


def pool_model(rng, kind: str, *, in_shape, window, stride, padding, activation=None):
    mb = ModelBuilder()
    s, zp = random_scale(rng), int(rng.integers(-20, 20))
    x = act_tensor(mb, rng, in_shape, s, zp)
    from hwjax.litert import conv_geometry

    g = conv_geometry(in_shape[:2], window, stride, padding)
    y = act_tensor(mb, rng, (*g.out_hw, in_shape[-1]), s, zp)
    mb.op(
        kind,
        [x],
        [y],
        (
            "Pool2DOptions",
            {
                "padding": 0 if padding == "SAME" else 1,
                "strideH": stride[0],
                "strideW": stride[1],
                "filterHeight": window[0],
                "filterWidth": window[1],
                "fusedActivationFunction": ACTIVATION_CODES[activation],
            },
        ),
    )
    return mb.finish([x], [y]), in_shape


def add_model(rng, *, shape, activation=None):
    """``y = a(x) + b(x)`` is not expressible with one input; the model is x -> conv -> add(x, conv)."""
    mb = ModelBuilder()
    s_in = random_scale(rng)
    x = act_tensor(mb, rng, shape, s_in)
    c = shape[-1]
    s_w = random_filter_scales(rng, c, True)
    w = mb.tensor((c, 1, 1, c), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 1, 1, c)))
    b = mb.tensor((c,), "int32", (s_in * s_w).astype(np.float32), np.zeros(c), rng.integers(-500, 500, c))
    h = act_tensor(mb, rng, shape, out_scale_for(s_in, s_w, c))
    mb.op("CONV_2D", [x, w, b], [h], ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}), 3)
    y = act_tensor(mb, rng, shape, np.float32(2 * max(float(s_in), float(mb.tensors[h].quantization.scale[0]))))
    mb.op("ADD", [x, h], [y], ("AddOptions", {"fusedActivationFunction": ACTIVATION_CODES[activation]}))
    return mb.finish([x], [y]), shape


def chain_model(rng, *, in_shape=(9, 8, 3), quantize=True):
    """conv (relu6) -> depthwise (SAME, stride 2) -> maxpool -> reshape -> [quantize] -> FC (relu)."""
    mb = ModelBuilder()
    s_in = random_scale(rng)
    x = act_tensor(mb, rng, in_shape, s_in)
    c1 = 5
    s_w = random_filter_scales(rng, c1, True)
    w = mb.tensor((c1, 3, 3, in_shape[-1]), "int8", s_w, np.zeros(c1), rng.integers(-127, 128, (c1, 3, 3, 3)))
    s1 = np.float32(0.05)
    b1 = mb.tensor((c1,), "int32", (s_in * s_w).astype(np.float32), np.zeros(c1), rng.integers(-500, 500, c1))
    h1 = act_tensor(mb, rng, (*in_shape[:2], c1), s1, -128)
    mb.op(
        "CONV_2D",
        [x, w, b1],
        [h1],
        ("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1, "fusedActivationFunction": 3}),
        3,
    )
    s_w2 = random_filter_scales(rng, c1, True)
    w2 = mb.tensor((1, 3, 3, c1), "int8", s_w2, np.zeros(c1), rng.integers(-127, 128, (1, 3, 3, c1)), axis=3)
    b2 = mb.tensor((c1,), "int32", (s1 * s_w2).astype(np.float32), np.zeros(c1), rng.integers(-500, 500, c1))
    h2 = act_tensor(mb, rng, (5, 4, c1), out_scale_for(s1, s_w2, 9))
    mb.op(
        "DEPTHWISE_CONV_2D",
        [h1, w2, b2],
        [h2],
        ("DepthwiseConv2DOptions", {"padding": 0, "strideH": 2, "strideW": 2, "depthMultiplier": 1}),
        3,
    )
    q2 = mb.tensors[h2].quantization
    h3 = act_tensor(mb, rng, (2, 2, c1), q2.scale[0], int(q2.zeroPoint[0]))
    mb.op(
        "MAX_POOL_2D",
        [h2],
        [h3],
        ("Pool2DOptions", {"padding": 1, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}),
    )
    h4 = act_tensor(mb, rng, (4 * c1,), q2.scale[0], int(q2.zeroPoint[0]))
    shape_t = mb.tensor((2,), "int32", data=np.array([1, 4 * c1], np.int32))
    mb.op("RESHAPE", [h3, shape_t], [h4], ("ReshapeOptions", {"newShape": [1, 4 * c1]}))
    if quantize:
        h5 = act_tensor(mb, rng, (4 * c1,), np.float32(q2.scale[0] * 1.7), 3)
        mb.op("QUANTIZE", [h4], [h5], None)
    else:
        h5 = h4
    s5 = mb.tensors[h5].quantization.scale[0]
    s_w3 = random_filter_scales(rng, 1, False)
    w3 = mb.tensor((7, 4 * c1), "int8", s_w3, np.zeros(1), rng.integers(-127, 128, (7, 4 * c1)))
    b3 = mb.tensor((7,), "int32", (np.float32(s5) * s_w3).astype(np.float32), np.zeros(1), rng.integers(-900, 900, 7))
    y = act_tensor(mb, rng, (7,), out_scale_for(s5, s_w3, 4 * c1))
    mb.op("FULLY_CONNECTED", [h5, w3, b3], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 1}))
    return mb.finish([x], [y]), in_shape


def unary_model(rng, name: str, *, shape=(64,)):
    """One RELU / RELU6 / RELU_N1_TO_1 / QUANTIZE op between differently quantised int8 tensors."""
    mb = ModelBuilder()
    a = act_tensor(mb, rng, shape)
    b = act_tensor(mb, rng, shape)
    mb.op(name, [a], [b])
    return mb.finish([a], [b]), shape
