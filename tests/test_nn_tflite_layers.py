"""hwjax.nn layers for the op kinds of imported .tflite graphs: ``activation`` (a separate
RELU6), ``requantize`` (QUANTIZE int8 -> int8), ``reshape`` (a 3-D RESHAPE) and ``pool``
(SAME MAX_POOL_2D / AVERAGE_POOL_2D with explicit padding).

A random model conv -> RELU6 -> QUANTIZE -> MAX_POOL (SAME) -> AVERAGE_POOL (SAME) ->
RESHAPE (3-D) -> RESHAPE (2-D) -> FULLY_CONNECTED is written with
:mod:`hwjax.tflite.testing`; :func:`hwjax.nn.from_graph` of its graph in hardware mode on
``TFLite("reference")`` must give exactly ``Model.run`` (and LiteRT's reference kernels),
and after a few optax steps the trained layers must equal :func:`hwjax.graph.run` of
:func:`hwjax.nn.to_graph` of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import hwjax.graph as hg
import hwjax.nn as hn
import hwjax.tflite as tfl
from hwjax.graph import Graph, Node, Tensor
from hwjax.errors import RangeError, ShapeError
from hwjax.targets import TFLite


TARGET = TFLite("reference")


def _model_bytes(seed: int = 0) -> bytes:
    from hwjax.tflite.testing import ModelBuilder

    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    s_in, c = np.float32(0.02), 4
    x = mb.tensor((1, 8, 8, 2), "int8", s_in, 3, name="input")
    s_w = rng.uniform(0.004, 0.01, c).astype(np.float32)
    w = mb.tensor((c, 3, 3, 2), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 3, 3, 2)))
    b = mb.tensor((c,), "int32", s_in * s_w, np.zeros(c), rng.integers(-300, 300, c))
    h1 = mb.tensor((1, 8, 8, c), "int8", np.float32(0.03), 5, name="conv")
    mb.op(
        "CONV_2D",
        [x, w, b],
        [h1],
        ("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1, "fusedActivationFunction": 0}),
        3,
    )
    h2 = mb.tensor((1, 8, 8, c), "int8", np.float32(6 / 255), -128, name="relu6")
    mb.op("RELU6", [h1], [h2])
    h3 = mb.tensor((1, 8, 8, c), "int8", np.float32(0.05), -100, name="requant")
    mb.op("QUANTIZE", [h2], [h3])
    h4 = mb.tensor((1, 4, 4, c), "int8", np.float32(0.05), -100, name="maxpool")
    mb.op(
        "MAX_POOL_2D",
        [h3],
        [h4],
        ("Pool2DOptions", {"padding": 0, "strideH": 2, "strideW": 2, "filterHeight": 3, "filterWidth": 3}),
    )
    h5 = mb.tensor((1, 4, 4, c), "int8", np.float32(0.05), -100, name="avgpool")
    mb.op(
        "AVERAGE_POOL_2D",
        [h4],
        [h5],
        ("Pool2DOptions", {"padding": 0, "strideH": 1, "strideW": 1, "filterHeight": 3, "filterWidth": 3}),
    )
    n = 4 * 4 * c
    h6 = mb.tensor((1, 8, n // 8), "int8", np.float32(0.05), -100, name="reshape3d")
    st = mb.tensor((3,), "int32", data=np.array([1, 8, n // 8], np.int32), name="shape3d")
    mb.op("RESHAPE", [h5, st], [h6], ("ReshapeOptions", {"newShape": [1, 8, n // 8]}))
    h7 = mb.tensor((1, n), "int8", np.float32(0.05), -100, name="flat")
    st2 = mb.tensor((2,), "int32", data=np.array([1, n], np.int32), name="shape2d")
    mb.op("RESHAPE", [h6, st2], [h7], ("ReshapeOptions", {"newShape": [1, n]}))
    s_w2 = np.float32([0.004])
    w2 = mb.tensor((5, n), "int8", s_w2, np.zeros(1), rng.integers(-127, 128, (5, n)))
    b2 = mb.tensor((5,), "int32", np.float32(0.05) * s_w2, np.zeros(1), rng.integers(-500, 500, 5))
    y = mb.tensor((1, 5), "int8", np.float32(0.1), 2, name="logits")
    mb.op("FULLY_CONNECTED", [h7, w2, b2], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 0}))
    return mb.finish([x], [y])


def _with_quantize(graph: Graph) -> Graph:
    """A float input and a ``quantize`` node writing the int8 input tensor (the model-input
    layer from_graph / to_graph expect; an integer batch passes it unchanged)."""
    inp = graph.tensors[graph.inputs[0]]
    node = Node("quantize", ("float_input",), (inp.name,), {}, None)
    return Graph(
        {"float_input": Tensor("float_input", inp.shape, "float32", None), **graph.tensors},
        (node, *graph.nodes),
        ("float_input",),
        graph.outputs,
    ).validate()


def _qarray(graph: Graph, x) -> hn.QArray:
    q = graph.tensors[graph.inputs[0]].quant
    return hn.QArray(
        jnp.asarray(x, jnp.float32), jnp.asarray(q.scale, jnp.float32), jnp.asarray(q.zero_point, jnp.int32)
    )


@pytest.fixture(scope="module")
def setup():
    data = _model_bytes()
    model = tfl.load(data)
    x = np.random.default_rng(1).integers(-128, 128, (16, 8, 8, 2)).astype(np.int8)
    return data, model, x


def test_import_has_the_new_ops(setup):
    _, model, _ = setup
    ops = [n.op for n in model.graph.nodes]
    assert ops == ["conv", "activation", "requantize", "pool", "pool", "reshape", "flatten", "dense"]
    layers = hn.from_graph(_with_quantize(model.graph), TARGET)
    kinds = [type(l) for l in layers.layers]
    assert kinds[2:7] == [hn.Activation, hn.Requantize, hn.Pool, hn.Pool, hn.Reshape]


def test_hardware_mode_is_exact_then_trains_and_round_trips(setup):
    from hwjax.tflite.testing import run_litert

    data, model, x = setup
    gq = _with_quantize(model.graph)
    layers = hn.from_graph(gq, TARGET)
    forward = nnx.jit(lambda m, xq: m(xq).q)
    xq = _qarray(model.graph, x)
    start = np.asarray(forward(layers, xq), np.int64)
    expected = np.asarray(model.run(x, runtime="reference"), np.int64)
    assert np.array_equal(start, expected)
    assert np.array_equal(start, run_litert(data, x, "reference").astype(np.int64))  # LiteRT itself
    assert len(np.unique(start)) > 5  # not a constant output

    before = [np.asarray(l.kernel[...]) for l in layers.layers if hasattr(l, "kernel")]
    optimizer = nnx.Optimizer(layers, optax.adam(3e-3), wrt=nnx.Param)
    labels = jnp.asarray(np.random.default_rng(2).integers(0, 5, len(x)))

    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(xq).dequantize(), labels).mean()

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        opt.update(m, grads)
        return loss, grads

    _, grads = step(layers, optimizer)
    g_conv = np.asarray(grads.layers[1].kernel[...])  # the conv's gradient flows back through the new layers
    assert np.all(np.isfinite(g_conv)) and np.any(g_conv != 0)
    for _ in range(4):
        step(layers, optimizer)
    after = [np.asarray(l.kernel[...]) for l in layers.layers if hasattr(l, "kernel")]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))

    tuned = hn.to_graph(layers)
    assert [(n.op, dict(n.attrs)) for n in tuned.nodes] == [(n.op, dict(n.attrs)) for n in gq.nodes]
    for name, t in gq.tensors.items():  # the pinned quantisation round-trips
        if t.quant is not None:
            assert float(tuned.tensors[name].quant.scale) == float(t.quant.scale)
            assert int(tuned.tensors[name].quant.zero_point) == int(t.quant.zero_point)
    trained = np.asarray(forward(layers, xq), np.int64)
    assert np.array_equal(trained, np.asarray(hg.run(tuned, x, TARGET), np.int64))
    assert not np.array_equal(trained, start)


def test_float_modes():
    x = jnp.asarray(np.random.default_rng(3).normal(0, 4, (2, 5, 5, 3)), jnp.float32)
    assert np.array_equal(hn.Activation("relu6", target=TARGET)(x), np.clip(np.asarray(x), 0, 6))
    assert np.array_equal(hn.Activation("relu_n1_to_1", target=TARGET)(x), np.clip(np.asarray(x), -1, 1))
    assert np.array_equal(hn.Activation("relu", target=TARGET)(x), np.maximum(np.asarray(x), 0))
    assert np.array_equal(hn.Requantize(target=TARGET)(x), x)
    assert hn.Reshape((5, 15), target=TARGET)(x).shape == (2, 5, 15)
    xn = np.asarray(x)
    avg = hn.Pool("avg", 2, strides=2, padding=((0, 1), (0, 1)), target=TARGET)(x)
    assert avg.shape == (2, 3, 3, 3)
    np.testing.assert_allclose(avg[:, 0, 0], xn[:, :2, :2].mean(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(avg[:, 2, 2], xn[:, 4, 4], rtol=1e-6)  # one in-image tap: divided by 1
    mx = hn.Pool("max", 2, strides=2, padding=((0, 1), (0, 1)), target=TARGET)(x)
    assert np.array_equal(mx[:, 2, 1], xn[:, 4, 2:4].max(axis=1))


def test_activation_calibrates_and_grads():
    act = hn.Activation("relu6", target=TARGET, mode="calibrate")
    act(jnp.linspace(-3.0, 9.0, 50)[None])
    hn.set_mode(act, "hardware")
    s, z = act.out_qparams()
    xq = hn.QArray(jnp.arange(-128.0, 128.0)[None], jnp.float32(0.05), jnp.int32(0))
    g = jax.grad(lambda q: act(hn.QArray(q, xq.scale, xq.zero_point)).q.sum())(xq.q)
    real = np.asarray(xq.dequantize())[0]
    g = np.asarray(g)[0]
    assert np.all(g[(real < 0) | (real > 6)] == 0)  # clamped: no gradient
    inside = (real > 0) & (real < 6)
    np.testing.assert_allclose(g[inside], 0.05 / float(s), rtol=1e-5)  # s_in / s_out
    assert int(z) == -128 and np.isclose(float(s), 6 / 255)


@pytest.mark.parametrize("kind", ["maxpool", "avgpool"])
def test_unpadded_pools_on_tflite_hardware(kind):
    """The int8 bug: MaxPool / AvgPool hardware mode on TFLite (maxpool_int pads with -2**31)."""
    from hwjax.tflite.testing import pool_model

    rng = np.random.default_rng(4)
    data, in_shape = pool_model(
        rng,
        "MAX_POOL_2D" if kind == "maxpool" else "AVERAGE_POOL_2D",
        in_shape=(6, 6, 3),
        window=(2, 2),
        stride=(2, 2),
        padding="VALID",
    )
    model = tfl.load(data)
    assert [n.op for n in model.graph.nodes] == [kind]
    layers = hn.from_graph(_with_quantize(model.graph), TARGET)
    x = rng.integers(-128, 128, (4, *in_shape)).astype(np.int8)
    y = np.asarray(layers(_qarray(model.graph, x)).q, np.int64)
    assert np.array_equal(y, np.asarray(model.run(x, runtime="reference"), np.int64))


@pytest.mark.parametrize("op", ["RELU", "RELU6", "RELU_N1_TO_1", "QUANTIZE"])
def test_unary_ops_on_every_runtime(op):
    """A separate activation / QUANTIZE between differently quantised tensors, per runtime
    (TFLM's RELU6 does not requantise: the target's recipe, reproduced by the layer)."""
    from hwjax.tflite.testing import unary_model

    rng = np.random.default_rng(6)
    data, shape = unary_model(rng, op)
    model = tfl.load(data)
    x = rng.integers(-128, 128, (8, *shape)).astype(np.int8)
    for rt in ("reference", "optimized", "xnnpack", "tflm"):
        layers = hn.from_graph(_with_quantize(model.graph), TFLite(rt))
        y = np.asarray(layers(_qarray(model.graph, x)).q, np.int64)
        assert np.array_equal(y, np.asarray(model.run(x, runtime=rt), np.int64)), rt


@pytest.mark.parametrize("runtime", ["optimized"])
def test_chain_model_on_other_runtimes(setup, runtime):
    _, model, x = setup
    layers = hn.from_graph(_with_quantize(model.graph), TFLite(runtime))
    y = np.asarray(layers(_qarray(model.graph, x)).q, np.int64)
    assert np.array_equal(y, np.asarray(model.run(x, runtime=runtime), np.int64))


def _layers_equal_the_runtime(data: bytes, x, runtime: str, ops, kinds):
    """from_graph of the model ``data`` (op kinds ``ops``, layer classes ``kinds`` after the
    input quantiser) in hardware mode equals Model.run and LiteRT on ``runtime``; returns the
    layers, the input QArray, their int8 output and the target."""
    from hwjax.tflite.testing import run_litert

    model = tfl.load(data)
    assert [n.op for n in model.graph.nodes] == ops
    target = TFLite(runtime)
    layers = hn.from_graph(_with_quantize(model.graph), target)
    assert [type(l) for l in layers.layers][1:] == kinds
    xq = _qarray(model.graph, x)
    got = np.asarray(nnx.jit(lambda m, v: m(v).q)(layers, xq), np.int64)
    assert np.array_equal(got, np.asarray(model.run(x, runtime=runtime), np.int64))
    assert np.array_equal(got, run_litert(data, x, runtime).astype(np.int64))
    assert len(np.unique(got)) > 3
    return layers, xq, got, target


def _pad_concat_mean_bytes(seed: int = 3) -> bytes:
    """conv 3x3 -> PAD -> CONCATENATION (of the pad with itself) -> PADV2 -> MEAN (H, W) -> FULLY_CONNECTED."""
    from hwjax.tflite.testing import ModelBuilder

    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    s_in, c = np.float32(0.02), 3
    x = mb.tensor((1, 6, 6, 2), "int8", s_in, -4, name="input")
    s_w = rng.uniform(0.004, 0.01, c).astype(np.float32)
    w = mb.tensor((c, 3, 3, 2), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 3, 3, 2)))
    b = mb.tensor((c,), "int32", s_in * s_w, np.zeros(c), rng.integers(-300, 300, c))
    h = mb.tensor((1, 4, 4, c), "int8", np.float32(0.03), 5, name="conv")
    mb.op(
        "CONV_2D",
        [x, w, b],
        [h],
        ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1, "fusedActivationFunction": 0}),
    )

    def i32(v, name):
        v = np.asarray(v, np.int32)
        return mb.tensor(v.shape, "int32", data=v, name=name)

    p = mb.tensor((1, 6, 5, c), "int8", np.float32(0.03), 5, name="pad")
    mb.op("PAD", [h, i32([[0, 0], [1, 1], [0, 1], [0, 0]], "paddings")], [p])
    cc = mb.tensor((1, 6, 5, 2 * c), "int8", np.float32(0.03), 5, name="concat")
    mb.op("CONCATENATION", [p, p], [cc], ("ConcatenationOptions", {"axis": 3}))
    cv = mb.tensor((), "int8", np.float32(0.03), 5, data=np.array(40, np.int8), name="pad_value")
    p2 = mb.tensor((1, 7, 5, 2 * c), "int8", np.float32(0.03), 5, name="padv2")
    mb.op("PADV2", [cc, i32([[0, 0], [0, 1], [0, 0], [0, 0]], "paddings2"), cv], [p2])
    m = mb.tensor((1, 2 * c), "int8", np.float32(0.011), -7, name="mean")
    mb.op("MEAN", [p2, i32([1, 2], "axes")], [m], ("ReducerOptions", {"keepDims": False}))
    w2 = mb.tensor((4, 2 * c), "int8", np.float32([0.01]), np.zeros(1), rng.integers(-127, 128, (4, 2 * c)))
    b2 = mb.tensor((4,), "int32", np.float32(0.011 * 0.01), np.zeros(1), rng.integers(-200, 200, 4))
    y = mb.tensor((1, 4), "int8", np.float32(0.05), 1, name="logits")
    mb.op("FULLY_CONNECTED", [m, w2, b2], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 0}))
    return mb.finish([x], [y])


def _pad_concat_mean_layers(runtime):
    x = np.random.default_rng(4).integers(-128, 128, (16, 6, 6, 2)).astype(np.int8)
    return _layers_equal_the_runtime(
        _pad_concat_mean_bytes(),
        x,
        runtime,
        ["conv", "pad", "concat", "pad", "mean", "dense"],
        [hn.Conv, hn.Pad, hn.Concat, hn.Pad, hn.Mean, hn.Dense],
    )


@pytest.mark.parametrize("runtime", ["reference", "optimized"])
def test_pad_concat_and_mean_layers_are_exact(runtime):
    """from_graph of a model with PAD, PADV2, CONCATENATION and MEAN: hardware mode equals
    Model.run and LiteRT."""
    _pad_concat_mean_layers(runtime)


@pytest.mark.slow
def test_pad_concat_and_mean_layers_train_and_round_trip():
    """A gradient reaches the conv through the PAD/CONCATENATION/MEAN layers; to_graph of
    the layers runs the same integers (training and the round trip do not depend on the
    runtime's rounding: reference only)."""
    layers, xq, got, target = _pad_concat_mean_layers("reference")
    labels = jnp.asarray(np.random.default_rng(2).integers(0, 4, xq.q.shape[0]))
    grads = nnx.jit(
        nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(xq).dequantize(), labels).mean())
    )(layers)
    assert np.abs(np.asarray(grads.layers[1].kernel[...])).sum() > 0  # the conv, behind pad/concat/mean

    g2 = hn.to_graph(layers, input_shape=(6, 6, 2))
    again = np.asarray(hg.jit_run(g2, xq.dequantize(), target))
    assert np.array_equal(np.asarray(again, np.int64), got)


def test_pad_concat_mean_float_modes_and_bad_arguments():
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    t = TFLite("reference")
    np.testing.assert_array_equal(
        np.asarray(hn.Pad(((1, 0), (0, 2), (0, 0)), target=t)(x)), np.pad(x, ((0, 0), (1, 0), (0, 2), (0, 0)))
    )
    np.testing.assert_array_equal(np.asarray(hn.Concat(2, target=t)(x, x)), np.concatenate([x, x], axis=3))
    np.testing.assert_allclose(np.asarray(hn.Mean((0, 1), target=t)(x)), x.mean(axis=(1, 2)), rtol=1e-6)
    with pytest.raises(RangeError, match="non-negative"):
        hn.Pad(((1, -1),), target=t)
    with pytest.raises(ShapeError):
        hn.Pad(((1, 0),), target=t)(x)
    with pytest.raises(RangeError):
        hn.Mean((1, 0), target=t)
    np.testing.assert_allclose(
        np.asarray(hn.Mul(activation="relu6", target=t)(x, x[:, :1])), np.clip(x * x[:, :1], 0, 6), rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(hn.Softmax(beta=0.5, target=t)(x)), np.asarray(jax.nn.softmax(0.5 * x, axis=-1)), rtol=1e-6
    )
    with pytest.raises(RangeError, match="activation"):
        hn.Mul(activation="tanh", target=t)
    with pytest.raises(RangeError, match="beta"):
        hn.Softmax(beta=0.0, target=t)


def _mul_softmax_bytes(seed: int = 5) -> bytes:
    """FULLY_CONNECTED a, b (two branches) -> MUL (relu6) -> FULLY_CONNECTED -> SOFTMAX."""
    from hwjax.tflite.testing import ModelBuilder

    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    s_in = np.float32(0.02)
    x = mb.tensor((1, 12), "int8", s_in, 6, name="input")

    def fc(inp, s, n_in, n_out, s_out, z_out, name):
        w = mb.tensor((n_out, n_in), "int8", np.float32([0.01]), np.zeros(1), rng.integers(-127, 128, (n_out, n_in)))
        b = mb.tensor((n_out,), "int32", np.float32(s * 0.01), np.zeros(1), rng.integers(-300, 300, n_out))
        y = mb.tensor((1, n_out), "int8", np.float32(s_out), z_out, name=name)
        mb.op("FULLY_CONNECTED", [inp, w, b], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 0}))
        return y

    a = fc(x, s_in, 12, 8, 0.02, -3, "a")
    b = fc(x, s_in, 12, 8, 0.025, 4, "b")
    m = mb.tensor((1, 8), "int8", np.float32(0.004), -20, name="mul")
    mb.op("MUL", [a, b], [m], ("MulOptions", {"fusedActivationFunction": 3}))  # RELU6
    logits = fc(m, np.float32(0.004), 8, 5, 0.08, 2, "logits")
    y = mb.tensor((1, 5), "int8", np.float32(1 / 256), -128, name="probs")
    mb.op("SOFTMAX", [logits], [y], ("SoftmaxOptions", {"beta": 1.0}))
    return mb.finish([x], [y])


def _mul_softmax_layers(runtime):
    x = np.random.default_rng(6).integers(-128, 128, (32, 12)).astype(np.int8)
    return _layers_equal_the_runtime(
        _mul_softmax_bytes(),
        x,
        runtime,
        ["dense", "dense", "mul", "dense", "softmax"],
        [hn.Dense, hn.Dense, hn.Mul, hn.Dense, hn.Softmax],
    )


@pytest.mark.parametrize("runtime", ["reference", "optimized"])
def test_mul_and_softmax_layers_are_exact(runtime):
    """from_graph of a model with MUL and SOFTMAX: hardware mode equals Model.run and LiteRT."""
    _mul_softmax_layers(runtime)


@pytest.mark.slow
def test_mul_and_softmax_layers_train_and_round_trip():
    """A gradient reaches the first branch behind MUL and SOFTMAX; to_graph of the layers
    runs the same integers (reference only, as above)."""
    layers, xq, got, target = _mul_softmax_layers("reference")
    n = xq.q.shape[0]
    labels = jnp.asarray(np.random.default_rng(2).integers(0, 5, n))
    grads = nnx.jit(nnx.grad(lambda m: -jnp.mean(jnp.log(m(xq).dequantize()[jnp.arange(n), labels] + 1e-3))))(layers)
    assert np.abs(np.asarray(grads.layers[1].kernel[...])).sum() > 0  # the first branch, behind mul/softmax
    g2 = hn.to_graph(layers, input_shape=(12,))
    assert np.array_equal(np.asarray(hg.jit_run(g2, xq.dequantize(), target), np.int64), got)
