"""hwjax.onnx against live ONNX Runtime (CPU provider, one thread, ORT_ENABLE_ALL): bit for bit.

Random models come from tests/randonnx.py (quantize_static-calibrated float models in every
common setting, and QOperator models with random quantisation parameters). A model hwjax
refuses must be one that ONNX Runtime runs partly in float32 (checked on ORT's optimised
graph). Every mismatch class found is kept below as a named regression test.
"""

from __future__ import annotations

import logging
import os
import re
import zlib

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx
from onnx import TensorProto, helper, numpy_helper

import hwjax.onnx as ho
from hwjax.errors import ArgTypeError, FileError, HwjaxError, ShapeError, UnsupportedOpError
from tests import randonnx as R

logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice on pre-processing

MS = "com.microsoft"


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int32) if a.dtype == np.float32 else a.astype(np.int64)


def check_model(data: bytes, x, desc: str = "", *, roundtrip: bool = True) -> str:
    """Runs ``data`` on ``x`` with ONNX Runtime and hwjax and asserts equal bits; returns
    ``"exact"`` or ``"refused"`` (hwjax refused a model that ORT runs partly in float). With
    ``roundtrip``, also ``hwjax.onnx.save``'s QOperator model run by ONNX Runtime: equal bits."""
    ref = R.ort_run(data, x)
    try:
        m = ho.load(data)
    except UnsupportedOpError as e:
        msg = str(e)
        if "transpose optimizer" in msg:
            return "refused"
        assert "float32" in msg, f"{desc}: unexpected refusal: {msg}"
        ops = R.ort_optimized_ops(data)
        named = {k for k in ho.FLOAT_REFUSED if re.search(rf"(?<![A-Za-z]){k} '", msg)}
        assert named and named <= set(ops), f"{desc}: refused {named}, but ORT's optimised graph is {ops}"
        return "refused"
    y = np.asarray(m.run(x))
    assert y.shape == ref.shape and y.dtype == ref.dtype, (desc, y.shape, ref.shape, y.dtype, ref.dtype)
    bad = np.flatnonzero(_bits(y).ravel() != _bits(ref).ravel())
    assert bad.size == 0, f"{desc}: {bad.size} of {ref.size} values differ, first at {bad[:5]}"
    if roundtrip:
        saved = R.ort_run(ho.save(m), x)
        bad = np.flatnonzero(_bits(saved).ravel() != _bits(ref).ravel())
        assert bad.size == 0, f"{desc}: the saved model: {bad.size} of {ref.size} values differ"
    return "exact"


# ------------------------------------------------------------------- random models: a sample

SAMPLE_SETTINGS = [(i, s) for i, s in enumerate(R.SETTINGS) if i in (1, 2, 3, 5, 6)]


@pytest.mark.parametrize(
    "seed,setting", SAMPLE_SETTINGS, ids=[f"{s[0]}-{s[1]}-{s[2]}-pc{int(s[3])}" for _, s in SAMPLE_SETTINGS]
)
def test_quantize_static_sample(seed, setting):
    data, x, desc = R.model(seed, setting)
    check_model(data, x, desc)


@pytest.mark.parametrize("seed", [1, 2, 3, 7])
def test_qoperator_sample(seed):
    data, x, desc = R.qop_model(seed)
    check_model(data, x, desc)


#: quantize_static's common settings: u8s8 per-tensor and per-channel QDQ, QOperator u8s8 and
#: u8u8, and its default (s8s8 QDQ)
CNN_SETTINGS = [
    ("QDQ", "uint8", "int8", False),
    ("QDQ", "uint8", "int8", True),
    ("QOperator", "uint8", "int8", False),
    ("QOperator", "uint8", "uint8", False),
    ("QDQ", "int8", "int8", False),
]


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(
            s, id=f"{s[0]}-{s[1]}-{s[2]}-pc{int(s[3])}", marks=[pytest.mark.slow] if s[0] == "QOperator" else []
        )
        for s in CNN_SETTINGS
    ],
)
def test_small_cnn_quantize_static(setting):
    """A small mobile-style CNN quantised by quantize_static in its common settings: exact,
    except the default s8s8 QDQ model, whose groups around activations that feed two nodes
    ORT runs in float32 (refused, naming them)."""
    fm, shape = R.small_cnn()
    rng = np.random.default_rng(1)
    data, scale = R.quantize(fm, shape, rng, setting)
    x = rng.normal(0, scale * 1.3, (16, *shape)).astype(np.float32)
    expected = "refused" if setting[1] == "int8" else "exact"
    assert check_model(data, x, str(setting)) == expected


def test_ort_optimized_model(tmp_path):
    """The model ONNX Runtime itself saves after its rewrites (``optimized_model_filepath``:
    NHWC ``channels_last`` QLinear kernels, NhwcMaxPool, the Transposes around them) reads and
    runs to the same bits as the original."""
    fm, shape = R.small_cnn()
    rng = np.random.default_rng(2)
    data, scale = R.quantize(fm, shape, rng, ("QDQ", "uint8", "int8", True))
    path = tmp_path / "opt.onnx"
    R._optimize(data, str(path))
    opt = path.read_bytes()
    assert {"NhwcMaxPool", "QLinearConv"} <= set(n.op_type for n in onnx.load_model_from_string(opt).graph.node)
    x = rng.normal(0, scale, (8, *shape)).astype(np.float32)
    assert check_model(opt, x) == "exact"
    np.testing.assert_array_equal(np.asarray(ho.load(opt).run(x)), R.ort_run(data, x))


# ------------------------------------------------------------------- random models: make test-full


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 300))
def test_quantize_static_random(seed):
    data, x, desc = R.model(seed)
    check_model(data, x, desc)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 250))
def test_qoperator_random(seed):
    data, x, desc = R.qop_model(seed)
    check_model(data, x, desc)


# --------------------------------------------------------------------- exhaustive code grids


def _binary_grid_model(op: str, dt: str, sa, za, sb, zb, sc, zc, a_shape, b_shape):
    """``op`` (QLinearAdd / QLinearMul, com.microsoft) on uint8/int8 graph inputs of the given shapes."""
    et = TensorProto.UINT8 if dt == "uint8" else TensorProto.INT8
    npt = np.uint8 if dt == "uint8" else np.int8
    inits = [
        numpy_helper.from_array(np.float32(v), n) if n.startswith("s") else numpy_helper.from_array(npt(v), n)
        for n, v in (("sa", sa), ("za", za), ("sb", sb), ("zb", zb), ("sc", sc), ("zc", zc))
    ]
    node = helper.make_node(op, ["A", "sa", "za", "B", "sb", "zb", "sc", "zc"], ["Y"], domain=MS)
    g = helper.make_graph(
        [node],
        "grid",
        [helper.make_tensor_value_info("A", et, list(a_shape)), helper.make_tensor_value_info("B", et, list(b_shape))],
        [helper.make_tensor_value_info("Y", et, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _ort_multi(data, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _grid_operands(mode: str, codes: np.ndarray, npt, v=None):
    """Shapes and values of the two operands covering every pair of codes (or one code ``v``
    against all): ``outer`` A (1, 256, 1) + B (1, 1, 256) (A is a single value per span of
    ORT's broadcaster), ``outer_rev`` the transpose (B single per span), ``same`` both
    (1, 65536), ``a_scalar`` / ``b_scalar`` one (1, 1, 1) operand."""
    c = codes.astype(npt)
    if mode == "outer":
        return c.reshape(1, 256, 1), c.reshape(1, 1, 256)
    if mode == "outer_rev":
        return c.reshape(1, 1, 256), c.reshape(1, 256, 1)
    if mode == "same":
        a, b = np.meshgrid(c, c, indexing="ij")
        return a.reshape(1, -1), b.reshape(1, -1)
    one = np.full((1, 1, 1), v, npt)
    return (one, c.reshape(1, 1, 256)) if mode == "a_scalar" else (c.reshape(1, 1, 256), one)


def _check_binary_grid(op, dt, mode, rng, trials):
    lo, hi = (0, 255) if dt == "uint8" else (-128, 127)
    npt = np.uint8 if dt == "uint8" else np.int8
    codes = np.arange(lo, hi + 1)
    for trial in range(trials):
        if trial == 0:
            sa, sb, sc = 2.0**-4, 2.0**-5, 2.0 ** (-3 if op == "QLinearAdd" else -6)
        else:
            sa, sb, sc = (float(np.float32(np.exp(rng.uniform(-5, -1)))) for _ in range(3))
        za, zb, zc = (int(rng.integers(lo, hi + 1)) for _ in range(3))
        values = codes[::37] if mode in ("a_scalar", "b_scalar") else [None]
        a0, b0 = _grid_operands(mode, codes, npt, values[0])
        data = _binary_grid_model(op, dt, sa, za, sb, zb, sc, zc, a0.shape, b0.shape)
        model = ho.load(data)
        for v in values:
            a, b = _grid_operands(mode, codes, npt, v)
            ref = _ort_multi(data, {"A": a, "B": b})
            np.testing.assert_array_equal(np.asarray(model.run([a, b])), ref, err_msg=f"{sa} {za} {sb} {zb} {sc} {zc}")


GRID_MODES = ["outer", "outer_rev", "same", "a_scalar", "b_scalar"]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", ["uint8", "int8"])
@pytest.mark.parametrize("mode", GRID_MODES)
def test_binary_every_code_pair(op, dt, mode):
    """QLinearAdd / QLinearMul on every pair of codes, power-of-two scales (exact ties) and a
    random set, in each broadcasting pattern (ORT swaps QLinearAdd's kernel operands when the
    first is a single value per span)."""
    _check_binary_grid(op, dt, mode, np.random.default_rng(zlib.crc32(f"{op} {dt} {mode}".encode())), 2)


@pytest.mark.slow
@pytest.mark.parametrize("dt", ["uint8", "int8"])
@pytest.mark.parametrize("mode", GRID_MODES)
def test_qlinear_add_every_code_pair_many_scales(dt, mode):
    """QLinearAdd's grids for 12 more random scale and zero-point sets per pattern."""
    _check_binary_grid("QLinearAdd", dt, mode, np.random.default_rng(zlib.crc32(f"many {dt} {mode}".encode())), 12)


@pytest.mark.parametrize("fn", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dt", ["uint8", "int8"])
def test_lookup_every_code(fn, dt):
    """QLinearSigmoid (MLAS's FMA3 logistic, not the exact sigmoid) and QLinearLeakyRelu on
    all 256 codes, for several scale / zero point sets."""
    rng = np.random.default_rng(5)
    et = TensorProto.UINT8 if dt == "uint8" else TensorProto.INT8
    npt = np.uint8 if dt == "uint8" else np.int8
    lo, hi = (0, 255) if dt == "uint8" else (-128, 127)
    x = np.arange(lo, hi + 1).astype(npt).reshape(1, 256)
    for _ in range(6):
        sx = np.float32(np.exp(rng.uniform(-5, -1)))
        sy = np.float32(rng.choice([1 / 256, np.exp(rng.uniform(-6, -2))]))
        zx, zy = npt(rng.integers(lo, hi + 1)), npt(rng.integers(lo, hi + 1))
        inits = [numpy_helper.from_array(v, n) for n, v in (("sx", sx), ("zx", zx), ("sy", sy), ("zy", zy))]
        attrs = {"alpha": float(rng.choice([0.01, 0.2]))} if fn == "QLinearLeakyRelu" else {}
        node = helper.make_node(fn, ["X", "sx", "zx", "sy", "zy"], ["Y"], domain=MS, **attrs)
        g = helper.make_graph(
            [node],
            "lut",
            [helper.make_tensor_value_info("X", et, [1, 256])],
            [helper.make_tensor_value_info("Y", et, [1, 256])],
            inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])
        m.ir_version = 8
        data = m.SerializeToString()
        np.testing.assert_array_equal(np.asarray(ho.load(data).run(x)), _ort_multi(data, {"X": x}))


# ------------------------------------------------------------------ regressions (named classes)


def _model(nodes, inits, in_shape, out_name, *, ms=False):
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *in_shape])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()],
    )
    ops = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(MS, 1)] if ms else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m.SerializeToString()


def test_regression_s8_q_feeding_two_nodes_stays_int8():
    """Found at quantize_static seed 75 (s8s8 QDQ): ORT duplicates a DQ that feeds two nodes
    *before* its s8 -> u8 rewrite, so the Q before it keeps int8 and the groups on both sides
    (here LeakyRelu, with a u8 input and an s8 output, the MaxPool and the Add) stay float.
    Rewriting first fused them (64 of 1664 values differed)."""
    data, x = R.float_groups_model()
    assert check_model(data, x) == "exact"
    kinds = [n.op for n in ho.load(data).graph.nodes]
    assert kinds.count("onnx_float_unary") == 1 and kinds.count("onnx_float_binary") == 1
    assert "qlinear_lut" not in kinds and "onnx_maxpool" in kinds
    assert {"LeakyRelu", "Add", "MaxPool"} <= set(R.ort_optimized_ops(data))


def test_regression_double_qdq_pairs():
    """``Q1 -> DQ1 -> Q2 -> DQ2`` with different parameters: ORT removes the middle pair and
    gives the outer one the parameters of the intersection of both ranges (computed in
    float32), before it fuses the group that follows."""
    rng = np.random.default_rng(0)
    for trial in range(6):
        dt = np.uint8 if trial % 2 == 0 else np.int8
        lo = 0 if dt == np.uint8 else -128
        inits = {
            "s1": np.float32(np.exp(rng.uniform(-4, -1))),
            "z1": dt(rng.integers(lo, lo + 256)),
            "s2": np.float32(np.exp(rng.uniform(-4, -1))),
            "z2": dt(rng.integers(lo, lo + 256)),
            "s3": np.float32(1 / 256),
            "z3": dt(lo),
        }
        nodes = [
            helper.make_node("QuantizeLinear", ["input", "s1", "z1"], ["q1"]),
            helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
            helper.make_node("QuantizeLinear", ["d1", "s2", "z2"], ["q2"]),
            helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["d2"]),
            helper.make_node("Sigmoid", ["d2"], ["g"]),
            helper.make_node("QuantizeLinear", ["g", "s3", "z3"], ["q3"]),
            helper.make_node("DequantizeLinear", ["q3", "s3", "z3"], ["y"]),
        ]
        data = _model(nodes, inits, (64,), "y")
        assert check_model(data, rng.normal(0, 3, (8, 64)).astype(np.float32)) == "exact"
    assert [n.op for n in ho.load(data).graph.nodes] == ["quantize", "qlinear_lut", "dequantize"]


def test_regression_float_transpose_between_quantisations_is_refused():
    """Found at quantize_static seed 102 (a Clip folded into the Q after a Transpose gave it
    another scale; 43 of 448 values differed): ORT's transpose optimizer moves a Transpose
    that runs in float between two quantisations (and cancels Transpose pairs), after which
    the Q/DQ pairs fuse differently. hwjax refuses such a Transpose, naming it."""
    inits = {"s1": np.float32(0.05), "z": np.uint8(128), "s2": np.float32(0.03), "s3": np.float32(0.02)}
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "s1", "z"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"]),
        helper.make_node("Transpose", ["d1"], ["t1"], perm=[0, 1, 3, 2]),
        helper.make_node("QuantizeLinear", ["t1", "s2", "z"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"]),
        helper.make_node("Transpose", ["d2"], ["t2"], perm=[0, 1, 3, 2]),
        helper.make_node("QuantizeLinear", ["t2", "s2", "z"], ["q3"]),
        helper.make_node("DequantizeLinear", ["q3", "s2", "z"], ["d3"]),
        helper.make_node("Sigmoid", ["d3"], ["g"]),
        helper.make_node("QuantizeLinear", ["g", "s3", "z"], ["q4"]),
        helper.make_node("DequantizeLinear", ["q4", "s3", "z"], ["y"]),
    ]
    data = _model(nodes, inits, (2, 3, 4), "y")
    with pytest.raises(UnsupportedOpError, match="Transpose .* transpose optimizer"):
        ho.load(data)
    assert R.ort_optimized_ops(data).count("Transpose") < 2


def test_regression_tensor_read_with_two_quantisations():
    """A QOperator model may read one integer tensor with two scales (QLinearConcat of a
    tensor and itself relabelled): each reading gets its own quantisation."""
    data, x, desc = R.qop_model(14)
    assert check_model(data, x, desc) == "exact"


def test_matmul_without_output_q_is_named():
    """A QDQ MatMul whose output is not quantised becomes ORT's MatMulIntegerToFloat, which
    hwjax names and refuses."""
    rng = np.random.default_rng(0)
    inits = {
        "s": np.float32(0.1),
        "z": np.uint8(128),
        "W": rng.integers(-128, 128, (4, 3)).astype(np.int8),
        "ws": np.float32(0.01),
        "wz": np.int8(0),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("DequantizeLinear", ["W", "ws", "wz"], ["dw"]),
        helper.make_node("MatMul", ["d", "dw"], ["y"]),
    ]
    data = _model(nodes, inits, (4,), "y")
    with pytest.raises(UnsupportedOpError, match="MatMulIntegerToFloat"):
        ho.load(data)
    assert "MatMulIntegerToFloat" in R.ort_optimized_ops(data)


def test_s8s8_default_conv_is_refused_naming_the_groups():
    """quantize_static's default (s8s8 QDQ) on x86: a Conv whose input Q feeds two nodes keeps
    int8 and runs in float32 in ORT; hwjax refuses it with an UnsupportedOpError naming it."""
    rng = np.random.default_rng(0)
    inits = {
        "s": np.float32(0.05),
        "z": np.int8(0),
        "W": rng.integers(-128, 128, (3, 3, 3, 3)).astype(np.int8),
        "ws": np.float32(0.01),
        "s2": np.float32(0.2),
        "s3": np.float32(0.3),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("DequantizeLinear", ["W", "ws", "z"], ["dw"]),
        helper.make_node("Conv", ["d", "dw"], ["c"], pads=[1, 1, 1, 1], name="the_conv"),
        helper.make_node("QuantizeLinear", ["c", "s2", "z"], ["qc"]),
        helper.make_node("DequantizeLinear", ["qc", "s2", "z"], ["dc"]),
        helper.make_node("Add", ["d", "dc"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "s3", "z"], ["qa"]),
        helper.make_node("DequantizeLinear", ["qa", "s3", "z"], ["y"]),
    ]
    data = _model(nodes, inits, (3, 6, 6), "y")
    with pytest.raises(UnsupportedOpError, match="Conv 'the_conv'"):
        ho.load(data)
    assert check_model(data, np.zeros((2, 3, 6, 6), np.float32)) == "refused"
    assert "Conv" in R.ort_optimized_ops(data)


# ---------------------------------------------------------------------------- bad files, API


def _good_bytes():
    data, _, _ = R.qop_model(1)
    return data


def test_save_writes_a_path(tmp_path):
    data, x, _ = R.model(1, R.SETTINGS[0])
    m = ho.load(data)
    p = tmp_path / "q.onnx"
    assert ho.save(m, p) == p.read_bytes()
    np.testing.assert_array_equal(np.asarray(ho.load(p).run(x)), np.asarray(m.run(x)))
    with pytest.raises(ArgTypeError):
        ho.save(m, 3)
    with pytest.raises(FileError):
        ho.save(m, tmp_path / "no" / "such" / "dir.onnx")


def test_bad_bytes_raise_hwjax_errors():
    good = _good_bytes()
    for bad in (b"", b"garbage", good[: len(good) // 2], good[:7], b"\x08" * 100, os.urandom(300)):
        with pytest.raises(HwjaxError):
            ho.load(bad)
    rng = np.random.default_rng(0)
    for _ in range(60):  # flipped bytes: either a model or a hwjax error, nothing else
        b = bytearray(good)
        for i in rng.integers(0, len(b), 3):
            b[i] = int(rng.integers(0, 256))
        try:
            ho.load(bytes(b))
        except HwjaxError:
            pass


def test_bad_arguments(tmp_path):
    with pytest.raises(FileError):
        ho.load(str(tmp_path / "missing.onnx"))
    with pytest.raises(ArgTypeError):
        ho.load(12)
    p = tmp_path / "m.onnx"
    p.write_bytes(_good_bytes())
    m = ho.load(p)
    shape = m.inputs[0].shape
    with pytest.raises(ShapeError):
        m.run(np.zeros((2, *shape[1:-1], shape[-1] + 1), np.float32))
    with pytest.raises(ArgTypeError):
        m.run(np.zeros((2, *shape[1:]), np.float64))
    with pytest.raises(HwjaxError):
        m.run(np.full((1, *shape[1:]), np.nan, np.float32))
    with pytest.raises(HwjaxError):
        m.run(np.zeros((1, *shape[1:]), np.float32), runtime="xnnpack")


def test_unsupported_op_is_named():
    inits = {"s": np.float32(0.1), "z": np.uint8(128)}
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("Softmax", ["d"], ["y"], axis=-1),
    ]
    with pytest.raises(UnsupportedOpError, match="Softmax"):
        ho.load(_model(nodes, inits, (10,), "y"))


def test_model_metadata_and_intermediates():
    data, x, _ = R.qop_model(2)
    m = ho.load(data)
    assert m.inputs[0].dtype == "float32" and m.inputs[0].shape[0] == 1
    y, t = m.run(x[:3], intermediates=True)
    assert np.asarray(y).shape[0] == 3 and all(np.asarray(v).shape[0] == 3 for v in t.values())
    assert isinstance(onnx.load_model_from_string(data), onnx.ModelProto)
    assert "QLinearConv" in ho.SUPPORTED_OPS and ho.RUNTIMES == ("onnxruntime", "onnxruntime-avx2", "onnxruntime-sse")


def test_cpu_option():
    import hwjax.targets as T

    assert T.get("onnxruntime").cpu == "vnni"
    with pytest.raises(HwjaxError):
        T.get("onnxruntime", cpu="arm")
    data, x, _ = R.qop_model(1)
    m = ho.load(data)
    for cpu in ("avx2", "sse"):  # matched against stored outputs in tests/test_onnx_cpus.py
        assert np.asarray(m.run(x, runtime=T.get("onnxruntime", cpu=cpu))).shape[0] == x.shape[0]


def test_fma32_is_exact():
    from fractions import Fraction

    from hwjax.ort import fma32

    rng = np.random.default_rng(1)
    a, b, c = ((rng.standard_normal(400) * 2.0 ** rng.integers(-30, 30, 400)).astype(np.float32) for _ in range(3))
    got = fma32(a, b, c)
    for i in range(400):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        r = np.float32(float(exact))
        cands = [r, np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))]
        best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.int32)) & 1))
        assert got[i] == best, (a[i], b[i], c[i])


def test_kernel_arguments_are_checked():
    import jax.numpy as jnp

    from hwjax.core import ConvGeometry
    from hwjax.ort import conv_acc, lut_table, matmul_acc, type_range

    g = ConvGeometry.make((4, 4), (3, 3), (1, 1), 1)
    x, w = jnp.ones((2, 3, 4, 4), jnp.int32), jnp.ones((6, 3, 3, 3), jnp.int32)
    with pytest.raises(ShapeError, match="w "):
        conv_acc(x, w[:, :2], 0, 0, g, 1)
    with pytest.raises(ArgTypeError, match="geom"):
        conv_acc(x, w, 0, 0, "g", 1)
    with pytest.raises(ArgTypeError, match="x must hold integers"):
        conv_acc(x.astype(jnp.float32), w, 0, 0, g, 1)
    with pytest.raises(ShapeError, match="group"):
        conv_acc(x, w, 0, 0, g, 2)
    with pytest.raises(ShapeError, match="b_zp"):
        matmul_acc(jnp.ones((2, 5), jnp.int32), jnp.ones((5, 3), jnp.int32), 0, jnp.zeros(2, jnp.int32))
    with pytest.raises(HwjaxError, match="dtype"):
        type_range("int16")
    with pytest.raises(HwjaxError, match="fn"):
        lut_table("tanh", 0.1, 0, "uint8", 0.1, 0, "uint8")


@pytest.mark.parametrize("xt, wt", [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8")])
def test_conv_and_matmul_accumulators_equal_the_integer_model(xt, wt):
    """conv_acc (one group: one 8-bit dot, the zero-point terms added exactly) and matmul_acc
    against int64 sums of (x - x_zp)(w - w_zp), padding reading x_zp: every data and weight
    type, scalar and per-channel weight zero points, the types' extremes included."""
    import jax
    import jax.numpy as jnp

    from hwjax.core import ConvGeometry
    from hwjax.ort import conv_acc, matmul_acc

    rng = np.random.default_rng(len(xt) * 7 + len(wt))
    lo = {"uint8": 0, "int8": -128}
    x = rng.integers(lo[xt], lo[xt] + 256, (2, 5, 6, 7))
    w = rng.integers(lo[wt], lo[wt] + 256, (4, 5, 3, 3))
    x[0], w[0] = lo[xt], lo[wt] + 255  # extremes: every product at its largest magnitude
    g = ConvGeometry.make((6, 7), (3, 3), (1, 1), 1)
    for xz, wz in ((lo[xt] + 255, lo[wt]), (lo[xt] + 3, rng.integers(lo[wt], lo[wt] + 256, 4))):
        xp = np.pad(x - xz, ((0, 0), (0, 0), (1, 1), (1, 1)))  # padded taps read x_zp
        wd = w - np.reshape(wz, (-1, 1, 1, 1))
        want = np.zeros((2, 4, 6, 7), np.int64)
        for i in range(3):
            for j in range(3):
                want += np.einsum("bchw,oc->bohw", xp[:, :, i : i + 6, j : j + 7], wd[:, :, i, j])
        got = jax.jit(lambda a, b: conv_acc(a, b, xz, wz, g, 1))(jnp.asarray(x, jnp.int32), jnp.asarray(w, jnp.int32))
        np.testing.assert_array_equal(np.asarray(got), want)
        a, b = x.reshape(-1, 42)[:, :9], w.reshape(4, -1)[:, :9].T
        want_mm = (a - xz).astype(np.int64) @ (b - np.reshape(wz, (1, -1))).astype(np.int64)
        got_mm = matmul_acc(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32), xz, wz)
        np.testing.assert_array_equal(np.asarray(got_mm), want_mm)
