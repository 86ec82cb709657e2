"""hwjax.tflite.save for the op kinds of the tensor and nonlinear families (``lut``,
``softmax``, ``pad``, ``concat``, ``mean``, ``mul``, ``mul_const``, ``square``,
``dequantize``, and the ``flatten`` / ``reshape`` nodes SQUEEZE and the folded Keras
shape chain become) and for the TensorFlow-made models of tests/data/keras.

Each file is loaded and saved; then (a) LiteRT runs the saved file exactly as the
original under the reference, optimized and XNNPACK resolvers (integers equal, float32
outputs bit-equal; for the Keras models also equal to the outputs stored with them),
(b) the saved file loads into the same graph (nodes, attributes, parameters, tensors),
(c) after a change of attributes and parameters, LiteRT runs the saved file exactly as
hwjax runs the changed graph (so the writers write what the graph means, not only what
the importer reads back)."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.tflite as tfl
from hwjax.errors import UnsupportedOpError
from hwjax.graph import Attrs, Graph, Quant, Tensor
from hwjax.tflite import _save
from hwjax.litert import mul_int16_safe
from hwjax.graph import PRE_ACTIVATION
from tests.test_tflite_keras import file_ops
from tests.test_tflite_tensor_ops import (
    Net,
    broadcast_model,
    litert_outputs,
    shape_chain_model,
    spatial_model,
)

ALL = ("reference", "optimized", "xnnpack")
KERAS = Path(__file__).resolve().parent / "data" / "keras"
XFORMER = Path(__file__).resolve().parent / "data" / "xformer"
N_SAMPLES = 12


# ------------------------------------------------------------------------------ models


def nonlinear_model():
    """One input (4, 3, 7), an output per op: LOGISTIC (the converter's 1/256, -128),
    LOGISTIC with zero point 0, TANH (1/128, 0), TANH with another output quantisation,
    SOFTMAX (beta 0.7) over the last axis, SOFTMAX (beta 1) of a flattened tensor."""
    n = Net(21)
    x = n.act((4, 3, 7), 0.061, 9)
    for s, z in ((1 / 256, -128), (1 / 256, 0)):
        y = n.out(n.act((4, 3, 7), s, z))
        n.mb.op("LOGISTIC", [x], [y], None, 2)
    for s, z in ((1 / 128, 0), (0.011, 5)):
        y = n.out(n.act((4, 3, 7), s, z))
        n.mb.op("TANH", [x], [y], None, 2)
    y = n.out(n.act((4, 3, 7), 1 / 256, -128))
    n.mb.op("SOFTMAX", [x], [y], ("SoftmaxOptions", {"beta": 0.7}), 2)
    f = n.like(x, (84,))
    n.mb.op("RESHAPE", [x, n.i32([1, 84])], [f], ("ReshapeOptions", {"newShape": [1, 84]}))
    y = n.out(n.act((84,), 1 / 256, -128))
    n.mb.op("SOFTMAX", [f], [y], ("SoftmaxOptions", {"beta": 1.0}), 2)
    return n.mb.finish([x], n.outputs), ((4, 3, 7),)


def changeable_model():
    """One input (5, 4, 6): PADV2 (pad value -77) -> MUL by a per-channel int8 constant,
    SOFTMAX (beta 0.5), PAD -> MEAN over H and W -> DEQUANTIZE. Small enough to run in
    hwjax on every runtime."""
    n = Net(22)
    x = n.act((5, 4, 6), 0.043, 7)
    s_x, z_x = n.quant(x)
    p = n.out(n.like(x, (6, 6, 6)))
    cv = n.mb.tensor((), "int8", s_x, z_x, data=np.array(-77, np.int8))
    n.mb.op("PADV2", [x, n.i32([[0, 0], [1, 0], [1, 1], [0, 0]]), cv], [p])
    c = n.mb.tensor((6,), "int8", 0.013, -6, data=n.rng.integers(-128, 128, 6))
    y = n.out(n.act((6, 6, 6), 0.006, -20))
    n.mb.op("MUL", [p, c], [y], ("MulOptions", {"fusedActivationFunction": 3}), 2)
    sm = n.out(n.act((5, 4, 6), 1 / 256, -128))
    n.mb.op("SOFTMAX", [x], [sm], ("SoftmaxOptions", {"beta": 0.5}), 2)
    p2 = n.like(x, (5, 6, 6))
    n.mb.op("PAD", [x, n.i32([[0, 0], [0, 0], [2, 0], [0, 0]])], [p2])
    m = n.act((6,), 0.02, 3)
    n.mb.op("MEAN", [p2, n.i32([1, 2])], [m], ("ReducerOptions", {"keepDims": False}), 2)
    d = n.out(n.mb.tensor((1, 6), "float32"))
    n.mb.op("DEQUANTIZE", [m], [d], None, 2)
    return n.mb.finish([x], n.outputs), ((5, 4, 6),)


#: the models, and the operators save must write for each (the original's operators, with
#: SQUEEZE and the folded SHAPE -> STRIDED_SLICE -> PACK chain written as RESHAPE)
MODELS = {
    "spatial": (
        spatial_model,
        [
            "PAD",
            "PADV2",
            "MEAN",
            "MEAN",
            "MUL",
            "MUL",
            "MUL",
            "MEAN",
            "MUL",
            "CONCATENATION",
            "PAD",
            "CONCATENATION",
            "DEQUANTIZE",
            "DEQUANTIZE",
        ],
    ),
    "shape_chain": (shape_chain_model, ["RESHAPE", "MEAN", "RESHAPE", "RESHAPE"]),
    "broadcast": (
        broadcast_model,
        ["MEAN", "MUL", "MEAN", "MEAN", "MUL", "CONCATENATION", "DEQUANTIZE", "MUL", "MUL", "MUL"],
    ),
    "nonlinear": (nonlinear_model, ["LOGISTIC", "LOGISTIC", "TANH", "TANH", "SOFTMAX", "RESHAPE", "SOFTMAX"]),
    "changeable": (changeable_model, ["PADV2", "MUL", "SOFTMAX", "PAD", "MEAN", "DEQUANTIZE"]),
}
KERAS_MODELS = ("cnn_branches", "mlp_sigmoid", "mobilenet_v2_tiny")
NEW_KINDS = {
    "lut",
    "softmax",
    "pad",
    "concat",
    "mean",
    "mul",
    "mul_const",
    "square",
    "dequantize",
    "flatten",
    "reshape",
}


def _samples(rng, shape):
    x = rng.integers(-128, 128, (N_SAMPLES, *shape)).astype(np.int8)
    x[0], x[1] = -128, 127  # the extremes
    return x


@pytest.fixture(scope="module")
def cases():
    """name -> (original bytes, model, saved bytes, x, LiteRT outputs of the original per runtime)."""
    rng = np.random.default_rng(1125)
    out = {}
    for name, (build, _) in MODELS.items():
        data, (shape,) = build()
        model = tfl.load(data)
        x = _samples(rng, shape)
        out[name] = (data, model, tfl.save(model), x, {rt: litert_outputs(data, [x], rt) for rt in ALL})
    return out


def _assert_outputs_equal(got, want, what):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (what, k, g.dtype, w.dtype, g.shape, w.shape)
        bits = {1: np.uint8, 4: np.uint32}[w.dtype.itemsize]  # float32: bit-equal
        bad = int((g.view(bits) != w.view(bits)).sum())
        assert bad == 0, f"{what}, output #{k}: {bad} of {g.size} differ"


def _assert_same_graph(a: Graph, b: Graph, name: str) -> None:
    assert (a.inputs, a.outputs) == (b.inputs, b.outputs), name
    assert set(a.tensors) == set(b.tensors), name
    for k, t in a.tensors.items():
        u = b.tensors[k]
        assert (t.shape, t.dtype, t.quant is None) == (u.shape, u.dtype, u.quant is None), (name, k)
        for f in ("scale", "zero_point") if t.quant is not None else ():
            va, vb = np.asarray(getattr(t.quant, f)), np.asarray(getattr(u.quant, f))
            assert va.dtype == vb.dtype and np.array_equal(va, vb), (name, k, f)
    assert len(a.nodes) == len(b.nodes), name
    for n, m in zip(a.nodes, b.nodes):
        assert (n.op, n.name, n.inputs, n.outputs, n.attrs) == (m.op, m.name, m.inputs, m.outputs, m.attrs), name
        assert (n.params is None) == (m.params is None), (name, n.name)
        for key in n.params or {}:
            pa, pb = np.asarray(n.params[key]), np.asarray(m.params[key])
            assert pa.dtype == pb.dtype and pa.shape == pb.shape and np.array_equal(pa, pb), (name, n.name, key)


# ----------------------------------------------------------------------- round trips


def test_the_models_cover_the_new_op_kinds(cases):
    kinds = {n.op for _, m, _, _, _ in cases.values() for n in m.graph.nodes}
    assert NEW_KINDS <= kinds and NEW_KINDS <= set(_save.writable_ops())


def test_saved_operators(cases):
    """The saved file holds the operators listed in MODELS (PADV2 only where the pad value
    is set, one MUL per mul / mul_const / square, no shape-chain operators)."""
    for name, (data, _, saved, _, _) in cases.items():
        assert file_ops(saved) == MODELS[name][1], name


@pytest.mark.parametrize("runtime", ALL)
def test_saved_file_runs_as_the_original(cases, runtime):
    """(a) Every output of the saved file equals the original's in LiteRT."""
    for name, (_, _, saved, x, want) in cases.items():
        _assert_outputs_equal(litert_outputs(saved, [x], runtime), want[runtime], f"{name} on {runtime}")


def test_saved_file_loads_into_the_same_graph(cases):
    """(b) load(save(load(f))).graph == load(f).graph."""
    for name, (_, model, saved, _, _) in cases.items():
        _assert_same_graph(model.graph, tfl.load(saved).graph, name)


def test_operand_shapes_and_constants(cases):
    """The constant tensors the writers add: MEAN's axes, PAD's paddings (batch row 0),
    PADV2's value with the output's quantisation, MUL's int8 operand with its own (a
    full-shape constant with the batch axis, so LiteRT sees equal shapes)."""
    import ai_edge_litert.schema_py_generated as s

    def constants(data):
        m = s.ModelT.InitFromPackedBuf(data, 0)
        out = {}
        for t in m.subgraphs[0].tensors:
            raw = m.buffers[t.buffer].data
            if raw is not None and len(raw):
                dt = {s.TensorType.INT32: "<i4", s.TensorType.INT8: "i1"}[t.type]
                q = t.quantization
                quant = None if q is None or q.scale is None else (q.scale.tolist(), q.zeroPoint.tolist())
                out[t.name.decode()] = (np.frombuffer(bytes(raw), dt).reshape(t.shape), quant)
        return out

    g = cases["spatial"][1].graph
    c = constants(cases["spatial"][2])
    pad, pad2 = (n.name for n in g.nodes[:2])
    assert c[f"{pad}/paddings"][0].tolist() == [[0, 0], [1, 0], [2, 1], [1, 2]]
    q = g.tensors[pad2].quant
    v, quant = c[f"{pad2}/constant_value"]
    assert v.shape == () and int(v) == -77 and quant == ([float(q.scale)], [int(q.zero_point)])
    mean = g.nodes[2].name
    assert c[f"{mean}/axes"][0].tolist() == [1, 2] and c[f"{mean}/axes"][1] is None
    g = cases["broadcast"][1].graph
    c = constants(cases["broadcast"][2])
    per_channel, scalar, full = (n for n in g.nodes if n.op == "mul_const")
    assert c[f"{per_channel.name}/operand"][0].shape == (35,)
    assert c[f"{scalar.name}/operand"][0].shape == ()
    assert c[f"{full.name}/operand"][0].shape == (1, 4, 7, 35)
    v, (scale, zp) = c[f"{full.name}/operand"]
    assert np.array_equal(v[0], np.asarray(full.params["value"])) and (scale, zp) == ([np.float32(0.03)], [50])


# ------------------------------------------------------------ changed graph vs hwjax


def _changed(graph: Graph) -> Graph:
    """The pad value -77 -> 40, every mul_const value below 127 plus one, beta 0.5 -> 1.25."""
    nodes = []
    for n in graph.nodes:
        if n.op == "pad" and n.attrs["value"] is not None:
            n = n.replace(attrs=n.attrs.replace(value=40))
        elif n.op == "mul_const":
            v = np.asarray(n.params["value"])
            n = n.replace(params=dict(n.params, value=np.where(v < 127, v + 1, v).astype(np.int8)))
        elif n.op == "softmax":
            n = n.replace(attrs=n.attrs.replace(beta=1.25))
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes))


def test_changed_graph_runs_in_litert_as_in_hwjax(cases):
    """(c) The saved file of a changed graph: LiteRT's outputs equal hwjax's outputs of the
    changed graph on every runtime, and differ from the original's (the change reached
    the file)."""
    data, model, _, x, want = cases["changeable"]
    g = model.graph
    mul = next(n for n in g.nodes if n.op == "mul_const")
    t_in, t_out = g.tensors[mul.inputs[0]], g.tensors[mul.outputs[0]]
    # the broadcast stays within the int16-safe bound the importer requires
    assert mul_int16_safe(t_in.quant.scale, mul.params["scale"], t_out.quant.scale, t_out.quant.zero_point)
    changed = tfl.Model(_changed(g), model.inputs, model.outputs)
    saved = tfl.save(changed)
    assert [n.attrs for n in tfl.load(saved).graph.nodes] == [n.attrs for n in changed.graph.nodes]
    for rt in ALL:
        got = litert_outputs(saved, [x], rt)
        _assert_outputs_equal(got, list(changed.run(x, runtime=rt)), f"changed graph on {rt}")
        for k in range(3):  # pad value, MUL operand, beta
            assert not np.array_equal(got[k], want[rt][k]), f"{rt}: output #{k} did not change"


# ------------------------------------------------------------------ the Keras models


@pytest.mark.parametrize("name", KERAS_MODELS)
def test_keras_model_round_trip(name):
    """TensorFlow-converted files: load -> save gives a file whose LiteRT outputs equal the
    outputs stored with the original and a live run of the original, under all three
    resolvers; the saved file loads into the same graph."""
    data = (KERAS / f"{name}.tflite").read_bytes()
    with np.load(KERAS / f"{name}.npz") as z:
        stored = {k: z[k] for k in z.files}
    model = tfl.load(data)
    saved = tfl.save(model)
    _assert_same_graph(model.graph, tfl.load(saved).graph, name)
    ops = [o for o in file_ops(data) if o not in ("SHAPE", "STRIDED_SLICE", "PACK")]
    assert file_ops(saved) == ops, name  # the same operators, the shape chain folded
    x = stored["x"]
    for rt in ALL:
        live = litert_outputs(data, [x], rt)
        _assert_outputs_equal(live, [stored[rt]], f"{name}: original on {rt} vs stored")
        _assert_outputs_equal(litert_outputs(saved, [x], rt), [stored[rt]], f"{name}: saved on {rt}")


def test_pre_activation_is_the_importers():
    assert _save.PRE_ACTIVATION is PRE_ACTIVATION
    g = tfl.load(KERAS / "mobilenet_v2_tiny.tflite").graph
    split = [n for n in g.nodes if n.op == "activation"]
    assert split and all(n.inputs[0] == n.outputs[0] + PRE_ACTIVATION for n in split)
    # each pair is written back as one operator with the activation fused
    assert len(file_ops(tfl.save(g))) == len(g.nodes) - len(split)


# --------------------------------------------------------------------------- errors


def test_xformer_graphs_are_written_back():
    """xc_* nodes are written as their XC custom operators (tests/test_tflite_save_xcore.py)."""
    g = tfl.load(XFORMER / "chain.xc.tflite").graph
    assert any(n.op.startswith("xc_") for n in g.nodes)
    assert [n.op for n in tfl.load(tfl.save(g)).graph.nodes] == [n.op for n in g.nodes]


def _with_node(graph: Graph, k: int, **kw) -> Graph:
    """``graph`` with node ``k`` replaced by ``node.replace(**kw)``."""
    return graph.replace(nodes=tuple(n.replace(**kw) if i == k else n for i, n in enumerate(graph.nodes)))


def test_unwritable_configurations_raise(cases):
    """Graphs whose operator LiteRT would refuse to prepare, or would run otherwise than
    hwjax, are refused by save, naming the node: LOGISTIC into an output scale other than
    1/256, SOFTMAX into a zero point other than -128, CONCATENATION of differently
    quantised tensors. (A broadcasting MUL beyond the int16-safe bound is written: only
    ``runtime="optimized"`` refuses to run it.)"""
    g = cases["nonlinear"][1].graph
    tanh = g.nodes[2]
    assert (tanh.op, tanh.attrs["fn"]) == ("lut", "tanh")
    assert tfl.save(g)  # as loaded: writable
    with pytest.raises(UnsupportedOpError, match=r"\(lut\).*1/256"):  # into the tanh output (1/128)
        tfl.save(_with_node(g, 2, attrs=tanh.attrs.replace(fn="sigmoid")))
    with pytest.raises(UnsupportedOpError, match=r"\(softmax\).*-128"):  # into the tanh output (zero point 0)
        tfl.save(_with_node(g, 2, op="softmax", attrs=Attrs({"beta": 1.0, "axis": -1})))
    g = cases["broadcast"][1].graph
    k, cat = next((k, n) for k, n in enumerate(g.nodes) if n.op == "concat")
    x, other = cat.inputs[0], g.nodes[1].outputs[0]  # the input and the first MUL's output, same shape
    assert cat.inputs == (x, x) and g.tensors[other].shape == g.tensors[x].shape
    assert g.tensors[other].quant != g.tensors[x].quant
    with pytest.raises(UnsupportedOpError, match=r"\(concat\).*keeps the quantisation"):
        tfl.save(_with_node(g, k, inputs=(x, other)))
    mul = g.nodes[1]
    assert mul.op == "mul" and g.tensors[mul.inputs[0]].shape != g.tensors[mul.inputs[1]].shape
    s1, s2 = (float(g.tensors[i].quant.scale) for i in mul.inputs)
    t = g.tensors[mul.outputs[0]]
    tiny = Tensor(
        t.name, t.shape, t.dtype, Quant.of(np.float32(s1 * s2 / 10), np.int32(0))
    )  # products up to 10 * 255**2
    assert not mul_int16_safe(s1, s2, tiny.quant.scale, 0)
    wide = tfl.load(tfl.save(g.replace(tensors={**g.tensors, t.name: tiny})))
    assert wide.graph.nodes[1].op == "mul"
    with pytest.raises(UnsupportedOpError, match=r"\(mul\): a broadcasting MUL.*int16"):
        wide.run(np.zeros((1, *wide.inputs[0].shape[1:]), np.int8), runtime="optimized")
