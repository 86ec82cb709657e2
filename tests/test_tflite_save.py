"""hwjax.tflite.save against LiteRT: random int8 models (hwjax.tflite.testing) are loaded,
saved and (a) the saved file runs in LiteRT exactly as the original under the three
resolvers, (b) loads back into the same graph (nodes, attributes, parameters, tensors),
(c) after a change of the parameters, LiteRT runs the saved file exactly as hwjax runs
the changed graph. Exact equality throughout."""

import numpy as np
import pytest

import hwjax.tflite as tfl
from hwjax.errors import FormatError, RangeError, ShapeError, UnsupportedOpError
from hwjax.graph import Graph
from hwjax.tflite import _flatbuffer as fb
from hwjax.tflite import testing as T
from hwjax.tflite._save import writable_ops, writes

ALL = ("reference", "optimized", "xnnpack")
NO_XNN = ("reference", "optimized")


def _standalone_relu6(rng):
    """conv -> RELU6 as two operators with equal quantisation (not a fused activation)."""
    mb = T.ModelBuilder()
    x = mb.tensor((1, 5, 5, 2), "int8", 0.05, 3)
    w = mb.tensor((3, 1, 1, 2), "int8", [0.01, 0.02, 0.015], np.zeros(3), rng.integers(-127, 128, (3, 1, 1, 2)))
    b = mb.tensor(
        (3,), "int32", np.float32(0.05) * np.float32([0.01, 0.02, 0.015]), np.zeros(3), rng.integers(-300, 300, 3)
    )
    h = mb.tensor((1, 5, 5, 3), "int8", 0.02, -5)
    y = mb.tensor((1, 5, 5, 3), "int8", 0.02, -5)
    mb.op("CONV_2D", [x, w, b], [h], ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}), 3)
    mb.op("RELU6", [h], [y])
    return mb.finish([x], [y]), (5, 5, 2)


def _reshape_3d(rng):
    """RESHAPE (1, 4, 6, 2) -> (1, 8, 3, 2) then MAX_POOL_2D (VALID)."""
    mb = T.ModelBuilder()
    x = mb.tensor((1, 4, 6, 2), "int8", 0.03, 1)
    r = mb.tensor((1, 8, 3, 2), "int8", 0.03, 1)
    y = mb.tensor((1, 4, 1, 2), "int8", 0.03, 1)
    s = mb.tensor((4,), "int32", data=np.array([1, 8, 3, 2], np.int32))
    mb.op("RESHAPE", [x, s], [r], ("ReshapeOptions", {"newShape": [1, 8, 3, 2]}))
    mb.op(
        "MAX_POOL_2D",
        [r],
        [y],
        ("Pool2DOptions", {"padding": 1, "strideH": 2, "strideW": 3, "filterHeight": 2, "filterWidth": 3}),
    )
    return mb.finish([x], [y]), (4, 6, 2)


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
            "conv_same_k5_n1to1",
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
            "avgpool_same_relu6",
            T.pool_model(
                rng,
                "AVERAGE_POOL_2D",
                in_shape=(7, 7, 3),
                window=(3, 3),
                stride=(2, 2),
                padding="SAME",
                activation="relu6",
            ),
            NO_XNN,
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
            NO_XNN,
        ),
        (
            "maxpool_same_relu6",
            T.pool_model(
                rng, "MAX_POOL_2D", in_shape=(7, 7, 3), window=(3, 3), stride=(2, 2), padding="SAME", activation="relu6"
            ),
            ALL,
        ),
        ("add_relu6", T.add_model(rng, shape=(4, 4, 3), activation="relu6"), NO_XNN),
        ("add_relu", T.add_model(rng, shape=(3, 5, 2), activation="relu"), NO_XNN),
        ("chain_quantize", T.chain_model(rng), ("reference",)),
        ("chain", T.chain_model(rng, quantize=False), ALL),
        ("relu_requantising", T.unary_model(rng, "RELU"), ALL),
        ("relu6_requantising", T.unary_model(rng, "RELU6"), ALL),
        ("relu_n1_to_1_requantising", T.unary_model(rng, "RELU_N1_TO_1"), ALL),
        ("quantize_int8", T.unary_model(rng, "QUANTIZE"), ("reference",)),
        ("conv_then_standalone_relu6", _standalone_relu6(rng), ALL),
        ("reshape_3d_maxpool", _reshape_3d(rng), ALL),
    ]


def _operators(data: bytes) -> int:
    return len(fb.root(data).tables(2)[0].tables(3))


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(20251125)
    out = {}
    for name, (data, shape), runtimes in _cases(rng):
        x = rng.integers(-128, 128, (6, *shape)).astype(np.int8)
        x[0], x[1] = -128, 127  # extremes
        model = tfl.load(data)
        out[name] = (data, model, tfl.save(model), x, runtimes)
    return out


def test_every_imported_op_kind_has_a_writer(cases):
    kinds = {n.op for _, m, _, _, _ in cases.values() for n in m.graph.nodes}
    assert kinds == {
        "dense",
        "conv",
        "depthwise_conv",
        "maxpool",
        "avgpool",
        "pool",
        "add",
        "activation",
        "requantize",
        "flatten",
        "reshape",
    }
    assert kinds <= set(writable_ops())


@pytest.mark.parametrize("runtime", ALL)
def test_saved_file_runs_as_the_original(cases, runtime):
    """(a) LiteRT's outputs of the saved file equal its outputs of the original file."""
    for name, (data, _, saved, x, _) in cases.items():
        want = T.run_litert(data, x, runtime)
        got = T.run_litert(saved, x, runtime)
        assert got.dtype == want.dtype
        bad = int((got != want).sum())
        assert bad == 0, f"{name} on {runtime}: {bad} of {got.size} outputs differ"


def _assert_same_graph(a: Graph, b: Graph, name: str) -> None:
    assert (a.inputs, a.outputs) == (b.inputs, b.outputs), name
    assert set(a.tensors) == set(b.tensors), name
    for k, t in a.tensors.items():
        u = b.tensors[k]
        assert (t.shape, t.dtype) == (u.shape, u.dtype), (name, k)
        for f in ("scale", "zero_point"):
            va, vb = np.asarray(getattr(t.quant, f)), np.asarray(getattr(u.quant, f))
            assert va.dtype == vb.dtype and np.array_equal(va, vb), (name, k, f)
    assert len(a.nodes) == len(b.nodes), name
    for n, m in zip(a.nodes, b.nodes):
        assert (n.op, n.name, n.inputs, n.outputs, n.attrs) == (m.op, m.name, m.inputs, m.outputs, m.attrs), name
        assert (n.params is None) == (m.params is None), (name, n.name)
        for key in n.params or {}:
            pa, pb = np.asarray(n.params[key]), np.asarray(m.params[key])
            assert pa.dtype == pb.dtype and pa.shape == pb.shape and np.array_equal(pa, pb), (name, n.name, key)


def test_saved_file_loads_into_the_same_graph(cases):
    """(b) load(save(load(f))).graph == load(f).graph."""
    for name, (_, model, saved, _, _) in cases.items():
        _assert_same_graph(model.graph, tfl.load(saved).graph, name)


def test_activations_fused_where_the_file_fused_them(cases):
    """A fused RELU6 is written back fused (one operator), a standalone one stays standalone."""
    for name, ops in (
        ("fc_per_channel_relu6", 1),
        ("dw_valid_relu6_per_tensor", 1),
        ("avgpool_same_relu6", 1),
        ("add_relu6", 2),
        ("chain", 5),
        ("conv_then_standalone_relu6", 2),
    ):
        data, _, saved, _, _ = cases[name]
        assert _operators(saved) == _operators(data) == ops, name


def _changed(graph: Graph) -> Graph:
    """Every kernel value below 127 plus one, every bias plus 37 (still int8 / int32)."""
    nodes = []
    for n in graph.nodes:
        if n.params is not None and "kernel" in n.params:
            k = np.asarray(n.params["kernel"])
            p = dict(
                n.params,
                kernel=np.where(k < 127, k + 1, k).astype(np.int8),
                bias=(np.asarray(n.params["bias"]) + 37).astype(np.int32),
            )
            n = n.replace(params=p)
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes))


@pytest.mark.parametrize("name", ["chain", "chain_quantize", "add_relu6"])
def test_changed_parameters_run_in_litert_as_in_hwjax(cases, name, tmp_path):
    """(c) A graph with changed parameters saves to a file LiteRT runs exactly as hwjax
    runs the changed graph, and the change is visible in the outputs."""
    data, model, _, x, runtimes = cases[name]
    changed = tfl.Model(_changed(model.graph), model.inputs, model.outputs)
    path = tmp_path / "changed.tflite"
    saved = tfl.save(changed, path)
    assert path.read_bytes() == saved
    for rt in runtimes:
        got = T.run_litert(saved, x, rt)
        want = np.asarray(changed.run(x, runtime=rt))
        assert np.array_equal(got, want), f"{name} on {rt}: {int((got != want).sum())} outputs differ"
        assert not np.array_equal(got, T.run_litert(data, x, rt)), f"{name}: the change did not reach the file"


def test_save_errors(cases):
    _, model, _, _, _ = cases["conv_same_s2_relu"]
    g = model.graph
    with pytest.raises(FormatError, match="portable"):
        tfl.save(model.lowered("reference"))
    conv = g.nodes[0]
    assert conv.attrs["padding"] == ((1, 1), (0, 1))  # SAME on (9, 8) with a 3x3 kernel, stride 2
    k = np.asarray(conv.params["kernel"]).astype(np.int32)
    k.flat[0] = 128
    with pytest.raises(RangeError, match="kernel"):
        tfl.save(g.replace(nodes=(conv.replace(params=dict(conv.params, kernel=k)),)))
    with pytest.raises(ShapeError, match="'w_scale' has 2 values for 5 channels"):
        tfl.save(g.replace(nodes=(conv.replace(params=dict(conv.params, w_scale=np.ones(2, np.float32))),)))
    with pytest.raises(RangeError, match="'w_scale' must be positive"):
        negative = dict(conv.params, w_scale=-np.asarray(conv.params["w_scale"]))
        tfl.save(g.replace(nodes=(conv.replace(params=negative),)))
    with pytest.raises(UnsupportedOpError, match="neither TFLite SAME nor VALID"):
        tfl.save(g.replace(nodes=(conv.replace(attrs=conv.attrs.replace(padding=((1, 1), (1, 0)))),)))
    bad = tfl.Model(g.replace(nodes=(conv.replace(op="depthwise_conv"),)), model.inputs, model.outputs)
    with pytest.raises(FormatError):
        tfl.save(bad)  # the graph does not validate
    with pytest.raises(TypeError, match="Graph"):
        tfl.save(object())


def test_unwritable_op_kind_is_named():
    from hwjax.graph import Node, Quant, Tensor

    # the graph's float ``quantize`` op kind has no writer (QUANTIZE is written from ``requantize``)
    g = Graph(
        {"f": Tensor("f", (4,), "float32", None), "q": Tensor("q", (4,), "int8", Quant.of(0.5, 0))},
        [Node("quantize", ("f",), ("q",), {"dtype": "int8"}, name="q")],
        ["f"],
        ["q"],
    )
    with pytest.raises(UnsupportedOpError, match=r"\['quantize'\].*writable"):
        tfl.save(g)


def test_writer_registry_refuses_a_second_writer():
    with pytest.raises(ValueError, match="already has a TFLite writer"):
        writes("conv")(lambda b, node: None)


def test_finetune_example_runs(tmp_path, monkeypatch):
    """examples/finetune_tflite.py on a one-layer model, one epoch: it exits 0 only when the
    written file, run by hwjax and by LiteRT, equals the trained modules' integers; the file
    keeps the original graph's structure with changed weights."""
    import runpy
    from pathlib import Path

    data, _ = T.linear_model(np.random.default_rng(3), "FULLY_CONNECTED", in_shape=(16,), out_ch=4)
    (tmp_path / "fc.tflite").write_bytes(data)
    out = tmp_path / "tuned.tflite"
    script = Path(__file__).resolve().parent.parent / "examples" / "finetune_tflite.py"
    monkeypatch.setattr("sys.argv", [str(script), str(tmp_path / "fc.tflite"), "--epochs", "1", "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(script), run_name="__main__")
    assert e.value.code == 0
    saved = out.read_bytes()
    g0, g1 = tfl.load(data).graph, tfl.load(saved).graph
    assert [(n.op, n.name, n.inputs, n.outputs, n.attrs) for n in g0.nodes] == [
        (n.op, n.name, n.inputs, n.outputs, n.attrs) for n in g1.nodes
    ]
    assert not np.array_equal(np.asarray(g0.nodes[0].params["kernel"]), np.asarray(g1.nodes[0].params["kernel"]))


def test_missing_writer_packages_are_named(cases, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ai_edge_litert.schema_py_generated", None)
    with pytest.raises(ImportError, match="'flatbuffers' and 'ai-edge-litert'"):
        tfl.save(cases["fc_per_tensor"][1])
