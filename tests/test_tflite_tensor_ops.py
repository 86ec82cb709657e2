"""The tensor operators of hwjax.tflite (PAD, PADV2, CONCATENATION, SQUEEZE, the SHAPE ->
STRIDED_SLICE -> PACK -> RESHAPE chain, MEAN, MUL, DEQUANTIZE) against LiteRT itself.

Differential: hand-built int8 models with several outputs (one per op under test) run in
ai-edge-litert under BUILTIN_REF, the builtin optimized kernels and the default XNNPACK
delegate; hwjax must give every output exactly (integers equal, float32 bit-equal).
Each model is compiled once per runtime (module-scoped fixtures)."""

import jax
import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.graph as hg  # noqa: E402
import hwjax.tflite as tfl  # noqa: E402
from hwjax.errors import UnsupportedOpError  # noqa: E402
from hwjax.targets import TFLite  # noqa: E402
from hwjax.tflite._testing import RESOLVERS, ModelBuilder  # noqa: E402

ALL = ("reference", "optimized", "xnnpack")
_ACT = {None: 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}
N_SAMPLES = 48


def litert_outputs(model: bytes, xs, runtime: str) -> list[np.ndarray]:
    """Every output of ``model`` in LiteRT, one sample at a time (``xs``: one batched array
    per input)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model, num_threads=1,
                     experimental_op_resolver_type=getattr(OpResolverType, RESOLVERS[runtime]))
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()
    ys = [[] for _ in outs]
    for k in range(len(xs[0])):
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], x[k][None].astype(d["dtype"]))
        it.invoke()
        for y, d in zip(ys, outs):
            y.append(it.get_tensor(d["index"])[0].copy())
    return [np.stack(y) for y in ys]


class Net:
    """A :class:`ModelBuilder` with helpers for int8 activations and int32 constants."""

    def __init__(self, seed: int):
        self.mb = ModelBuilder()
        self.rng = np.random.default_rng(seed)
        self.outputs: list[int] = []

    def act(self, shape, scale=None, zp=None, name=None):
        s = np.float32(10 ** self.rng.uniform(-2, -0.7)) if scale is None else np.float32(scale)
        z = int(self.rng.integers(-40, 40)) if zp is None else int(zp)
        return self.mb.tensor((1, *shape), "int8", s, z, name=name)

    def like(self, t, shape=None):
        """A tensor with ``t``'s quantisation (and shape, unless given)."""
        q = self.mb.tensors[t].quantization
        return self.mb.tensor(tuple(self.mb.tensors[t].shape) if shape is None else (1, *shape), "int8",
                              q.scale[0], int(q.zeroPoint[0]))

    def quant(self, t):
        q = self.mb.tensors[t].quantization
        return float(q.scale[0]), int(q.zeroPoint[0])

    def i32(self, values, shape=None):
        v = np.asarray(values, np.int32)
        return self.mb.tensor(v.shape if shape is None else shape, "int32", data=v.reshape(shape or v.shape))

    def out(self, t):
        self.outputs.append(t)
        return t


def spatial_model():
    """One input (5, 6, 19) and an output per op: PAD (spatial + channel), PADV2, MEAN
    keep_dims with new quantisation (19 channels: 16 lanes + 3), MEAN without keep_dims
    with equal quantisation (the global average Keras writes) of the padded tensor (22
    channels), MUL by the broadcast mean (relu6), MUL x * x (570 elements: 560 lanes + 10;
    a multiplier of 2.5 so that LiteRT's optimized int16 lanes wrap), MUL x * x relu,
    MUL of two vectors (relu_n1_to_1), CONCATENATION along H and along C, DEQUANTIZE of
    the global average (22: 16 lanes + 6) and of a MUL (570: 568 lanes + 2)."""
    n = Net(11)
    x = n.act((5, 6, 19), 0.043, 7)
    s_x, z_x = n.quant(x)
    p = n.out(n.like(x, (6, 9, 22)))
    n.mb.op("PAD", [x, n.i32([[0, 0], [1, 0], [2, 1], [1, 2]])], [p])
    p2 = n.out(n.like(x, (5, 8, 20)))
    cv = n.mb.tensor((), "int8", s_x, z_x, data=np.array(-77, np.int8))
    n.mb.op("PADV2", [x, n.i32([[0, 0], [0, 0], [1, 1], [0, 1]]), cv], [p2])
    m1 = n.out(n.act((1, 1, 19), s_x * 0.37, -11))
    n.mb.op("MEAN", [x, n.i32([1, 2])], [m1], ("ReducerOptions", {"keepDims": True}))
    m2 = n.out(n.like(x, (22,)))
    n.mb.op("MEAN", [p, n.i32([2, 1])], [m2], ("ReducerOptions", {"keepDims": False}))
    y1 = n.out(n.act((5, 6, 19), 0.05, -3))
    n.mb.op("MUL", [x, m1], [y1], ("MulOptions", {"fusedActivationFunction": _ACT["relu6"]}))
    y2 = n.out(n.act((5, 6, 19), s_x * s_x * 0.4, 21))
    n.mb.op("MUL", [x, x], [y2], ("MulOptions", {"fusedActivationFunction": 0}))
    y3 = n.out(n.act((5, 6, 19), s_x * s_x * 97.0, -100))
    n.mb.op("MUL", [x, x], [y3], ("MulOptions", {"fusedActivationFunction": _ACT["relu"]}))
    y4 = n.out(n.act((22,), 0.0021, 5))
    n.mb.op("MUL", [m2, m2], [y4], ("MulOptions", {"fusedActivationFunction": _ACT["relu_n1_to_1"]}))
    c1 = n.out(n.like(x, (10, 6, 19)))
    n.mb.op("CONCATENATION", [x, x], [c1], ("ConcatenationOptions", {"axis": 1}))
    q = n.like(x, (5, 6, 22))
    n.mb.op("PAD", [x, n.i32([[0, 0], [0, 0], [0, 0], [0, 3]])], [q])
    c2 = n.out(n.like(x, (5, 6, 41)))
    n.mb.op("CONCATENATION", [x, q], [c2], ("ConcatenationOptions", {"axis": -1}))
    d1 = n.out(n.mb.tensor((1, 22), "float32"))
    n.mb.op("DEQUANTIZE", [m2], [d1])
    d2 = n.out(n.mb.tensor((1, 5, 6, 19), "float32"))
    n.mb.op("DEQUANTIZE", [y3], [d2])
    return n.mb.finish([x], n.outputs), ((5, 6, 19),)


def shape_chain_model():
    """Keras 3 Flatten's shape chain (SHAPE -> STRIDED_SLICE (shrink) -> PACK with -1 ->
    RESHAPE whose shape is that computed tensor), SQUEEZE of a keep_dims MEAN (7 channels),
    and a RESHAPE whose shape comes from a CONCATENATION of int32 vectors."""
    n = Net(12)
    x = n.act((3, 4, 7))
    shape = n.mb.tensor((4,), "int32")
    n.mb.op("SHAPE", [x], [shape], ("ShapeOptions", {"outType": 2}))
    batch = n.mb.tensor((), "int32")
    n.mb.op("STRIDED_SLICE", [shape, n.i32([0]), n.i32([1]), n.i32([1])], [batch],
            ("StridedSliceOptions", {"shrinkAxisMask": 1}))
    packed = n.mb.tensor((2,), "int32")
    n.mb.op("PACK", [batch, n.i32(-1, ())], [packed], ("PackOptions", {"valuesCount": 2, "axis": 0}))
    f = n.out(n.like(x, (84,)))
    n.mb.op("RESHAPE", [x, packed], [f])
    m = n.act((1, 1, 7))
    n.mb.op("MEAN", [x, n.i32([1, 2])], [m], ("ReducerOptions", {"keepDims": True}))
    sq = n.out(n.like(m, (7,)))
    n.mb.op("SQUEEZE", [m], [sq], ("SqueezeOptions", {"squeezeDims": [1, 2]}))
    hw = n.mb.tensor((2,), "int32")
    n.mb.op("STRIDED_SLICE", [shape, n.i32([1]), n.i32([3]), n.i32([1])], [hw], ("StridedSliceOptions", {}))
    new = n.mb.tensor((3,), "int32")
    n.mb.op("CONCATENATION", [n.i32([1]), n.i32([12]), n.i32([7])], [new], ("ConcatenationOptions", {"axis": 0}))
    r = n.out(n.like(x, (12, 7)))
    n.mb.op("RESHAPE", [x, new], [r])
    return n.mb.finish([x], n.outputs), ((3, 4, 7),)


def _samples(rng, shapes):
    xs = []
    for shape in shapes:
        x = rng.integers(-128, 128, (N_SAMPLES, *shape)).astype(np.int8)
        x[0], x[1] = -128, 127  # the extremes
        xs.append(x)
    return xs


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(2026)
    out = {}
    for name, build in (("spatial", spatial_model), ("shape_chain", shape_chain_model)):
        data, shapes = build()
        xs = _samples(rng, shapes)
        want = {rt: litert_outputs(data, xs, rt) for rt in ALL}
        out[name] = (data, xs, want)
    return out


@pytest.mark.parametrize("runtime", ALL)
@pytest.mark.parametrize("name", ["spatial", "shape_chain"])
def test_matches_litert(cases, name, runtime):
    data, xs, want = cases[name]
    got = tfl.load(data).run(xs[0] if len(xs) == 1 else xs, runtime=runtime)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want[runtime])
    for k, (g, w) in enumerate(zip(got, want[runtime])):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype == np.float32:  # bit-equal floats
            bad = int((g.view(np.int32) != w.view(np.int32)).sum())
        else:
            bad = int((g != w).sum())
        assert bad == 0, f"{name} output #{k} on {runtime}: {bad} of {g.size} differ"
