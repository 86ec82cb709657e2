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

import hwjax.graph as hg
import hwjax.tflite as tfl
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets import TFLite
from hwjax.tflite.testing import ACTIVATION_CODES as _ACT
from hwjax.tflite.testing import RESOLVERS, ModelBuilder

ALL = ("reference", "optimized", "xnnpack")
N_SAMPLES = 48


def litert_outputs(model: bytes, xs, runtime: str) -> list[np.ndarray]:
    """Every output of ``model`` in LiteRT, one sample at a time (``xs``: one batched array
    per input)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=model, num_threads=1, experimental_op_resolver_type=getattr(OpResolverType, RESOLVERS[runtime])
    )
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
        return self.mb.tensor(
            tuple(self.mb.tensors[t].shape) if shape is None else (1, *shape), "int8", q.scale[0], int(q.zeroPoint[0])
        )

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
    m3 = n.act((22,), s_x * 0.8, 30)
    n.mb.op("MEAN", [p, n.i32([1, 2])], [m3], ("ReducerOptions", {"keepDims": False}))
    y4 = n.out(n.act((22,), 0.0021, 5))
    n.mb.op("MUL", [m2, m3], [y4], ("MulOptions", {"fusedActivationFunction": _ACT["relu_n1_to_1"]}))
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
    n.mb.op(
        "STRIDED_SLICE",
        [shape, n.i32([0]), n.i32([1]), n.i32([1])],
        [batch],
        ("StridedSliceOptions", {"shrinkAxisMask": 1}),
    )
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


def broadcast_model():
    """One input (4, 7, 35): MEAN over W (keep_dims) times x (the broadcast operand first,
    relu), MEAN over H and W (keep_dims; 35 channels: 32 lanes + 3) times x, MEAN over H
    without keep_dims, CONCATENATION along W, DEQUANTIZE of x (980: 976 lanes + 4), MUL
    by constants: per channel (relu6), a scalar (first operand), a full-shape one (a
    multiplier of 1.43: the optimized kernel's int16 lanes wrap)."""
    n = Net(13)
    x = n.act((4, 7, 35), 0.021, -33)
    mw = n.act((4, 1, 35), 0.017, 9)
    n.mb.op("MEAN", [x, n.i32([-2])], [mw], ("ReducerOptions", {"keepDims": True}))
    n.out(mw)
    y1 = n.out(n.act((4, 7, 35), 0.011, -50))
    n.mb.op("MUL", [mw, x], [y1], ("MulOptions", {"fusedActivationFunction": _ACT["relu"]}))
    m = n.out(n.act((1, 1, 35), 0.009, 4))
    n.mb.op("MEAN", [x, n.i32([1, 2])], [m], ("ReducerOptions", {"keepDims": True}))
    mh = n.out(n.act((7, 35), 0.013, -2))
    n.mb.op("MEAN", [x, n.i32([1])], [mh], ("ReducerOptions", {"keepDims": False}))
    y2 = n.out(n.act((4, 7, 35), 0.004, 3))
    n.mb.op("MUL", [x, m], [y2], ("MulOptions", {"fusedActivationFunction": 0}))
    c = n.out(n.like(x, (4, 14, 35)))
    n.mb.op("CONCATENATION", [x, x], [c], ("ConcatenationOptions", {"axis": 2}))
    d = n.out(n.mb.tensor((1, 4, 7, 35), "float32"))
    n.mb.op("DEQUANTIZE", [x], [d])
    cv = n.mb.tensor((35,), "int8", 0.013, -6, data=n.rng.integers(-128, 128, 35))
    y3 = n.out(n.act((4, 7, 35), 0.006, -20))
    n.mb.op("MUL", [x, cv], [y3], ("MulOptions", {"fusedActivationFunction": _ACT["relu6"]}))
    cs = n.mb.tensor((), "int8", 0.02, 1, data=np.array(-97, np.int8))
    y4 = n.out(n.act((4, 7, 35), 0.017, 11))
    n.mb.op("MUL", [cs, x], [y4], ("MulOptions", {}))
    cf = n.mb.tensor((1, 4, 7, 35), "int8", 0.03, 50, data=n.rng.integers(-128, 128, (1, 4, 7, 35)))
    y5 = n.out(n.act((4, 7, 35), 0.021 * 0.03 * 0.7, -3))
    n.mb.op("MUL", [x, cf], [y5], ("MulOptions", {}))
    return n.mb.finish([x], n.outputs), ((4, 7, 35),)


MODELS = {"spatial": spatial_model, "shape_chain": shape_chain_model, "broadcast": broadcast_model}


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
    for name, build in MODELS.items():
        data, shapes = build()
        xs = _samples(rng, shapes)
        want = {rt: litert_outputs(data, xs, rt) for rt in ALL}
        out[name] = (data, xs, want)
    return out


@pytest.mark.parametrize("runtime", ALL)
@pytest.mark.parametrize("name", list(MODELS))
def test_matches_litert(cases, name, runtime):
    data, xs, want = cases[name]
    got = tfl.load(data).run(xs[0] if len(xs) == 1 else xs, runtime=runtime)
    _assert_equal(got, want[runtime], f"{name} on {runtime}")


def _assert_equal(got, want, what):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype == np.float32:  # bit-equal floats
            bad = int((g.view(np.int32) != w.view(np.int32)).sum())
        else:
            bad = int((g != w).sum())
        assert bad == 0, f"{what}, output #{k}: {bad} of {g.size} differ"


def test_runtimes_differ(cases):
    """Outputs of MEAN, MUL, the squaring and DEQUANTIZE on which the runtimes disagree:
    each runtime is matched, so no single convention could pass."""
    want = cases["spatial"][2]
    ref, opt, xnn = (want[rt] for rt in ALL)
    assert not np.array_equal(ref[2], opt[2])  # MEAN keep_dims: optimized's float32 recipe and lanes
    assert not np.array_equal(opt[2], xnn[2]) and not np.array_equal(ref[3], xnn[3])  # XNNPACK's float MEAN
    assert not np.array_equal(ref[4], xnn[4])  # MUL: XNNPACK's float32 requantisation
    assert not np.array_equal(ref[5], opt[5])  # x * x: optimized's int16 lanes wrap
    assert not np.array_equal(ref[6], xnn[6])  # x * x: XNNPACK's square table
    assert not np.array_equal(ref[10], opt[10])  # DEQUANTIZE: optimized's multiply-then-add lanes
    assert not np.array_equal(want["reference"][0], want["reference"][0][:, :, ::-1])  # PAD is not symmetric
    want = cases["broadcast"][2]
    assert not np.array_equal(want["reference"][9], want["optimized"][9])  # full-shape constant: int16 lanes
    assert not np.array_equal(want["reference"][7], want["xnnpack"][7])  # per-channel constant: XNNPACK


def test_graph_structure(cases):
    m = tfl.load(cases["shape_chain"][0])
    # the shape chain folds away: no node reads the int32 tensors
    assert [n.op for n in m.graph.nodes] == ["flatten", "mean", "flatten", "reshape"]
    assert m.graph.nodes[1].attrs["count"] == 12 and m.graph.nodes[1].attrs["axes"] == (0, 1)
    ops = [n.op for n in tfl.load(cases["spatial"][0]).graph.nodes]
    assert ops.count("square") == 2 and ops.count("mul") == 2 and ops.count("dequantize") == 2
    assert {
        "PAD",
        "PADV2",
        "CONCATENATION",
        "SQUEEZE",
        "SHAPE",
        "STRIDED_SLICE",
        "PACK",
        "MEAN",
        "MUL",
        "DEQUANTIZE",
    } <= set(tfl.SUPPORTED_OPS)


def test_jit_vmap_and_x64(cases):
    """The lowered graph vmaps; the portable graph lowers inside jit (recipes through
    pure_callback); results do not depend on jax_enable_x64."""
    data, xs, want = cases["broadcast"]
    m = tfl.load(data)
    x = xs[0].astype(np.int32)
    yv = jax.jit(jax.vmap(lambda g, xi: hg.run(g, xi), in_axes=(None, 0)))(m.lowered("optimized"), x)
    _assert_equal(
        tuple(np.asarray(v).astype(w.dtype) for v, w in zip(yv, want["optimized"])),
        want["optimized"],
        "vmap on optimized",
    )
    yj = hg.jit_run(m.graph, x, TFLite("xnnpack"))
    _assert_equal(
        tuple(np.asarray(v).astype(w.dtype) for v, w in zip(yj, want["xnnpack"])),
        want["xnnpack"],
        "portable graph under jit on xnnpack",
    )
    with jax.enable_x64(True):
        y64 = tfl.load(data).run(xs[0], runtime="optimized")
    _assert_equal(y64, want["optimized"], "optimized with jax_enable_x64")


# ------------------------------------------------------------------------------ errors


def _litert_refuses(model, shapes):
    for rt in ALL:
        with pytest.raises(Exception, match="failed to (prepare|delegate)"):
            litert_outputs(model, [np.zeros((1, *s), np.int8) for s in shapes], rt)


def test_concatenation_of_different_quantisation_raises():
    """LiteRT refuses an int8 CONCATENATION whose inputs are quantised unlike the output
    (all three runtimes); hwjax raises, naming the operator."""
    for q in ((0.1, 3), (0.05, 4)):
        n = Net(1)
        a, b = n.act((3, 4, 5), 0.05, 3), n.act((3, 4, 2), *q)
        y = n.act((3, 4, 7), 0.05, 3)
        n.mb.op("CONCATENATION", [a, b], [y], ("ConcatenationOptions", {"axis": 3}))
        data = n.mb.finish([a, b], [y])
        _litert_refuses(data, [(3, 4, 5), (3, 4, 2)])
        with pytest.raises(UnsupportedOpError, match=r"operator #0 \(CONCATENATION\).*quantis"):
            tfl.load(data)


def _one_op(name, inputs_of, out_shape, options=None, in_shape=(3, 4, 5), same=True):
    n = Net(2)
    x = n.act(in_shape, 0.05, 3)
    y = n.like(x, out_shape) if same else n.act(out_shape)
    n.mb.op(name, inputs_of(n, x), [y], options)
    return n.mb.finish([x], [y])


@pytest.mark.parametrize(
    "name,inputs_of,out_shape,options,match",
    [
        ("PAD", lambda n, x: [x, n.i32([[1, 0], [0, 0], [0, 0], [0, 0]])], (3, 4, 5), None, "batch axis"),
        ("MEAN", lambda n, x: [x, n.i32([0, 1])], (4, 5), ("ReducerOptions", {"keepDims": False}), "batch axis"),
        (
            "STRIDED_SLICE",
            lambda n, x: [x, n.i32([0, 0, 0, 0]), n.i32([1, 2, 4, 5]), n.i32([1, 1, 1, 1])],
            (2, 4, 5),
            ("StridedSliceOptions", {}),
            "int8 tensor",
        ),
        ("SQUEEZE", lambda n, x: [x], (3, 4, 5), ("SqueezeOptions", {"squeezeDims": [1]}), "cannot squeeze"),
        ("CONCATENATION", lambda n, x: [x, x], (6, 4, 5), ("ConcatenationOptions", {"axis": 0}), "batch axis"),
    ],
)
def test_unsupported_configurations_raise(name, inputs_of, out_shape, options, match):
    data = _one_op(name, inputs_of, out_shape, options)
    with pytest.raises((UnsupportedOpError, FormatError), match=rf"operator #0 \({name}\).*{match}"):
        tfl.load(data)


def test_mul_broadcast_beyond_int16_is_refused_on_optimized_only():
    """A broadcasting MUL whose products could overflow LiteRT's optimized int16 lanes
    loads; ``runtime="optimized"`` refuses it, naming the node (hwjax does not model where
    those lanes fall in a broadcast); the other runtimes compute in int32 or float and
    equal LiteRT."""
    n = Net(3)
    x, m = n.act((3, 4, 5), 0.05, 3), n.act((1, 1, 5), 0.05, 3)
    n.mb.op("MEAN", [x, n.i32([1, 2])], [m], ("ReducerOptions", {"keepDims": True}))
    y = n.act((3, 4, 5), 0.05 * 0.05, 0)
    n.mb.op("MUL", [x, m], [y], ("MulOptions", {}))
    data = n.mb.finish([x], [y])
    model = tfl.load(data)
    xs = np.random.default_rng(5).integers(-128, 128, (6, 3, 4, 5)).astype(np.int8)
    xs[0], xs[1] = -128, 127
    with pytest.raises(UnsupportedOpError, match=r"\(mul\): a broadcasting MUL.*int16.*'optimized'"):
        model.run(xs, runtime="optimized")
    for runtime in ("reference", "xnnpack"):
        np.testing.assert_array_equal(
            np.asarray(model.run(xs, runtime=runtime)), litert_outputs(data, [xs], runtime)[0]
        )


def test_uint8_arithmetic_raises():
    n = Net(4)
    x = n.mb.tensor((1, 3, 4, 5), "uint8", 0.05, 128)
    y = n.mb.tensor((1, 5), "uint8", 0.05, 128)
    n.mb.op("MEAN", [x, n.i32([1, 2])], [y], ("ReducerOptions", {"keepDims": False}))
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(MEAN\).*int8 only"):
        tfl.load(n.mb.finish([x], [y]))


def test_unverified_runtime_raises(cases):
    """An op kind whose arithmetic is not declared for a runtime raises, naming both."""
    from hwjax.targets import _tflite

    m = tfl.load(cases["spatial"][0])
    saved = _tflite._VERIFIED.get("mean")
    try:
        _tflite.verified_on("mean", "reference")
        with pytest.raises(UnsupportedOpError, match="'mean'.*tflm"):
            m.run(cases["spatial"][1][0], runtime="tflm")
    finally:
        _tflite._VERIFIED["mean"] = saved
