"""hwjax.tflite.load + Model.run against LiteRT itself (differential: random int8 models
built with the flatbuffer object API, run in ai-edge-litert under BUILTIN_REF, builtin
optimized kernels and the default XNNPACK delegate). Exact equality, zero mismatches."""

import jax
import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.graph as hg
import hwjax.tflite as tfl
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets import TFLite
from hwjax.tflite import testing as T

ALL = ("reference", "optimized", "xnnpack")


def _cases(rng):
    L = T.linear_model
    return [
        ("fc_per_tensor", L(rng, "FULLY_CONNECTED", in_shape=(37,), out_ch=11, per_channel=False), ALL),
        ("fc_per_channel_relu6", L(rng, "FULLY_CONNECTED", in_shape=(29,), out_ch=9, activation="relu6"), ALL),
        ("fc_relu_nobias", L(rng, "FULLY_CONNECTED", in_shape=(16,), out_ch=5, activation="relu", bias=False), ALL),
        ("conv_same_s2_relu", L(rng, "CONV_2D", in_shape=(9, 8, 3), out_ch=5, stride=(2, 2), activation="relu"), ALL),
        (
            "conv_valid_per_tensor",
            L(rng, "CONV_2D", in_shape=(7, 6, 4), out_ch=3, k=(3, 2), padding="VALID", per_channel=False),
            ALL,
        ),
        (
            "conv_same_k5_s12_n1to1",
            L(rng, "CONV_2D", in_shape=(8, 9, 2), out_ch=7, k=(5, 5), stride=(1, 2), activation="relu_n1_to_1"),
            ALL,
        ),
        ("dw_same_s21", L(rng, "DEPTHWISE_CONV_2D", in_shape=(8, 7, 5), stride=(2, 1)), ALL),
        (
            "dw_valid_relu6_per_tensor",
            L(
                rng,
                "DEPTHWISE_CONV_2D",
                in_shape=(6, 6, 3),
                k=(2, 3),
                padding="VALID",
                per_channel=False,
                activation="relu6",
            ),
            ALL,
        ),
        (
            "avgpool_same_s2",
            T.pool_model(rng, "AVERAGE_POOL_2D", in_shape=(7, 7, 3), window=(3, 3), stride=(2, 2), padding="SAME"),
            ALL,
        ),
        (
            "avgpool_valid_relu",
            T.pool_model(
                rng,
                "AVERAGE_POOL_2D",
                in_shape=(6, 5, 3),
                window=(2, 2),
                stride=(2, 1),
                padding="VALID",
                activation="relu",
            ),
            ALL,
        ),
        (
            "maxpool_same_relu6",
            T.pool_model(
                rng, "MAX_POOL_2D", in_shape=(7, 7, 3), window=(3, 3), stride=(2, 2), padding="SAME", activation="relu6"
            ),
            ALL,
        ),
        ("add_relu6", T.add_model(rng, shape=(4, 4, 3), activation="relu6"), ALL),
        ("add_relu_tail", T.add_model(rng, shape=(3, 3, 5), activation="relu"), ALL),
        ("chain_quantize", T.chain_model(rng), ALL),
        ("chain", T.chain_model(rng, quantize=False), ALL),
        ("relu_requantising", T.unary_model(rng, "RELU"), ALL),
        ("relu6_requantising", T.unary_model(rng, "RELU6"), ALL),
        ("relu_n1_to_1_requantising", T.unary_model(rng, "RELU_N1_TO_1"), ALL),
        ("quantize_int8", T.unary_model(rng, "QUANTIZE"), ALL),
        ("quantize_int8_tail", T.unary_model(rng, "QUANTIZE", shape=(7, 5)), ALL),
    ]


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(20250601)
    out = []
    for name, (data, shape), runtimes in _cases(rng):
        x = rng.integers(-128, 128, (5, *shape)).astype(np.int8)
        x[0] = -128  # extremes
        x[1] = 127
        want = {rt: T.run_litert(data, x, rt) for rt in runtimes}
        out.append((name, data, x, want))
    return out


@pytest.mark.parametrize("runtime", ALL)
def test_matches_litert(cases, runtime):
    checked = 0
    for name, data, x, want in cases:
        if runtime not in want:
            continue
        got = np.asarray(tfl.load(data).run(x, runtime=runtime))
        assert got.dtype == np.int8
        bad = int((got != want[runtime]).sum())
        assert bad == 0, f"{name} on {runtime}: {bad} of {got.size} outputs differ"
        checked += 1
    assert checked >= 9


def test_runtimes_are_distinct(cases):
    """A conv model whose outputs differ between the runtimes: each is matched, so a
    single shared convention could not pass."""
    differ = 0
    for name, data, x, want in cases:
        if len(want) == 3 and not (
            np.array_equal(want["reference"], want["optimized"]) and np.array_equal(want["optimized"], want["xnnpack"])
        ):
            differ += 1
    assert differ >= 1


def test_model_description_and_intermediates(cases):
    name, data, x, want = next(c for c in cases if c[0] == "chain")
    m = tfl.load(data)
    assert m.inputs[0].shape == (1, 9, 8, 3) and m.inputs[0].dtype == "int8"
    assert m.outputs[0].shape == (1, 7) and m.outputs[0].scale.shape == (1,)
    assert [n.op for n in m.graph.nodes] == ["conv", "activation", "depthwise_conv", "maxpool", "flatten", "dense"]
    y, inter = m.run(x, runtime="reference", intermediates=True)
    assert np.array_equal(np.asarray(inter[m.outputs[0].name]), np.asarray(y, np.int32))
    assert inter[m.graph.nodes[2].outputs[0]].shape == (5, 5, 4, 5)


def test_portable_graph_under_jit_and_vmap(cases):
    """The portable graph lowers inside jit (recipes through pure_callback) and vmaps."""
    name, data, x, want = next(c for c in cases if c[0] == "conv_same_s2_relu")
    m = tfl.load(data)
    target = TFLite("optimized")
    y = hg.jit_run(m.graph, x.astype(np.int32), target)
    assert np.array_equal(np.asarray(y), want["optimized"])
    yv = jax.vmap(lambda xi: hg.run(m.lowered("optimized"), xi))(x.astype(np.int32))
    assert np.array_equal(np.asarray(yv), want["optimized"])


def test_a_fresh_model_runs_under_jit(cases):
    """``jax.jit(lambda x: model.run(x))`` on a model never run before: the lowering done
    inside the trace is computed at once (constants of the program), so the result equals
    LiteRT's, and the model's cached lowering holds no tracer: an eager call afterwards
    runs (it raised UnexpectedTracerError)."""
    name, data, x, want = next(c for c in cases if c[0] == "chain")
    m = tfl.load(data)
    jitted = np.asarray(jax.jit(lambda v: m.run(v, runtime="optimized"))(x))
    assert np.array_equal(jitted, want["optimized"])
    assert not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(m.lowered("optimized")))
    assert np.array_equal(np.asarray(m.run(x, runtime="optimized")), want["optimized"])
    seen = {}  # a model loaded inside a trace: its graph holds the file's constants, not tracers
    jax.jit(lambda v: seen.update(graph=tfl.load(data).graph) or v)(x)
    assert not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(seen["graph"]))


def test_linear_ops_read_int8_inputs_without_a_range_check(cases):
    """FULLY_CONNECTED and CONV_2D get their int8 inputs as int8 (``OpImpl.narrow_inputs``):
    the program holds no run-time reduction over the input to tell int8 from uint8 values
    (it cost 20-30% of an MLP's and a conv net's run time)."""
    for name in ("fc_per_channel_relu6", "conv_same_s2_relu"):
        _, data, x, want = next(c for c in cases if c[0] == name)
        m = tfl.load(data)
        jaxpr = str(jax.make_jaxpr(lambda v: m.run(v, runtime="optimized"))(x))
        assert "reduce_max" not in jaxpr, name
        assert np.array_equal(np.asarray(m.run(x, runtime="optimized")), want["optimized"])


def test_load_errors(tmp_path, cases):
    data = cases[0][1]
    with pytest.raises(FormatError, match="not a TFLite model"):
        tfl.load(b"\x00" * 64)
    with pytest.raises(FormatError):
        tfl.load(data[: len(data) // 2])
    p = tmp_path / "m.tflite"
    p.write_bytes(data)
    assert tfl.load(str(p)).graph.nodes[0].op == "dense"
    # a float model
    mb = T.ModelBuilder()
    a = mb.tensor((1, 4), "float32")
    b = mb.tensor((1, 4), "float32")
    mb.op("RELU", [a], [b])
    with pytest.raises(FormatError, match="float"):
        tfl.load(mb.finish([a], [b]))
    # an op outside the list: named with its index and the supported ops
    mb = T.ModelBuilder()
    a = mb.tensor((1, 4), "int8", 0.1, 0)
    b = mb.tensor((1, 4), "int8", 0.1, 0)
    c = mb.tensor((1, 4), "int8", 0.1, 0)
    mb.op("RELU", [a], [b])
    mb.op("SIN", [b], [c])
    with pytest.raises(UnsupportedOpError, match=r"operator #1 is SIN.*FULLY_CONNECTED"):
        tfl.load(mb.finish([a], [c]))


def test_unverified_runtime_ops_raise(cases, monkeypatch):
    """An op kind declared verified only on some runtimes raises UnsupportedOpError on the
    others rather than guess (every op kind the importer emits is verified on reference,
    optimized and xnnpack today, so the declaration is narrowed here); an unknown runtime
    name is a ValueError."""
    from hwjax.targets import _tflite

    monkeypatch.setitem(_tflite._VERIFIED, "requantize", ("reference",))
    TFLite("reference").lowering("requantize")
    with pytest.raises(UnsupportedOpError, match="requantize.*xnnpack"):
        TFLite("xnnpack").lowering("requantize")
    name, data, x, want = next(c for c in cases if c[0] == "chain_quantize")
    with pytest.raises(ValueError, match="runtime"):
        tfl.load(data).run(x, runtime="fast")


def test_uint8_outputs_of_int8_op_kinds_are_refused():
    """requantize / add compute int8 outputs: a uint8 output tensor is refused at load
    (it gave wrong values on every runtime), naming the operator."""
    mb = T.ModelBuilder()
    a = mb.tensor((1, 8), "int8", 0.05, 3)
    b = mb.tensor((1, 8), "uint8", 0.04, 128)
    mb.op("QUANTIZE", [a], [b])
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(QUANTIZE\).*uint8"):
        tfl.load(mb.finish([a], [b]))
    mb = T.ModelBuilder()
    a = mb.tensor((1, 8), "int8", 0.05, 3)
    c = mb.tensor((1, 8), "int8", 0.05, 1)
    d = mb.tensor((1, 8), "uint8", 0.1, 120)
    mb.op("ADD", [a, c], [d], ("AddOptions", {"fusedActivationFunction": 0}))
    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(ADD\).*uint8"):
        tfl.load(mb.finish([a, c], [d]))


def test_large_batches_run_in_chunks_with_the_same_bits(cases):
    """Batches above Model.run's chunk size run as padded chunks in one program: every
    example equals LiteRT's, also in the last, partial chunk."""
    from hwjax.tflite._model import batch_chunk

    name, data, x, want = next(c for c in cases if c[0] == "conv_same_s2_relu")
    chunk = batch_chunk(tfl.load(data).lowered("reference"))
    assert 8 <= chunk <= 1024
    rng = np.random.default_rng(5)
    xb = rng.integers(-128, 128, (2 * chunk + 7, *x.shape[1:])).astype(np.int8)
    for rt in ("reference", "xnnpack"):
        np.testing.assert_array_equal(np.asarray(tfl.load(data).run(xb, runtime=rt)), T.run_litert(data, xb, rt))
    g = tfl.load(data).lowered("reference")
    np.testing.assert_array_equal(
        np.asarray(hg.jit_run(g, xb.astype(np.int32), chunk=16)), np.asarray(hg.jit_run(g, xb.astype(np.int32)))
    )
    # at most ONE_PASS_EXAMPLES examples: one pass, no loop over examples (the graph's
    # chunks or a kernel's; the loops left are those of one example, e.g. over the taps of
    # a window); more: the graph's chunk loop
    from hwjax.core import ONE_PASS_EXAMPLES

    def loops(n):
        v = xb[:n].astype(np.int32)
        return str(jax.make_jaxpr(lambda a: hg.jit_run(g, a, chunk=8))(v)).count("scan[")

    assert loops(ONE_PASS_EXAMPLES) == loops(1) < loops(ONE_PASS_EXAMPLES + 1)
    # the int8 batch is read as int32 chunk by chunk, not first copied whole into int32
    m = tfl.load(data)
    jaxpr = jax.make_jaxpr(lambda v: m.run(v, runtime="reference"))(xb).jaxpr
    while len(jaxpr.eqns) == 1 and "jaxpr" in jaxpr.eqns[0].params:  # into the jitted program
        jaxpr = jaxpr.eqns[0].params["jaxpr"].jaxpr
    widened = [
        e
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type"
        and e.outvars[0].aval.dtype == np.int32
        and e.outvars[0].aval.shape[:1] == (xb.shape[0],)
    ]
    assert not widened, widened
