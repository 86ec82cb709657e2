"""runtime="tflm" against TensorFlow Lite Micro itself.

The oracle data in tests/data/tflm/ was made by scripts/tflm_testdata.py: one small random
int8 model per case (every builtin op hwjax imports), run in the TFLM host interpreter of
xmos-ai-tools 1.4.2 (TFLM's reference kernels) on 16 fixed inputs. Every comparison is
exact (integers equal, float32 bit for bit); no stored output is computed by hwjax.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import hwjax.graph as hg
import hwjax.tflite as T
from hwjax.errors import UnsupportedOpError
from hwjax.targets import TFLite

DATA = os.path.join(os.path.dirname(__file__), "data", "tflm")
MODELS = sorted(f[:-4] for f in os.listdir(DATA) if f.endswith(".npz"))
REFUSED_BY_TFLM = sorted(f[: -len(".refused.txt")] for f in os.listdir(DATA) if f.endswith(".refused.txt"))
# the stored outputs are those of the TFLM inside xmos-ai-tools 1.4.2
XMOS = TFLite("tflm", tflm="xmos-1.4.2")
# xmos' TFLM runs it with the first filter scale for every channel (test below)
REFUSED_BY_HWJAX = {"fc_per_channel"}
# TFLM's arithmetic differs from LiteRT's reference kernel on these (each needs its tflm path)
DIFFER_FROM_LITERT_REFERENCE = ["logistic_large_scale", "relu6", "tanh_other_out"]


def _data(name):
    return np.load(os.path.join(DATA, f"{name}.npz"))


def _model(name):
    return T.load(os.path.join(DATA, f"{name}.tflite"))


def _mismatches(got, want) -> int:
    got = np.asarray(got).reshape(want.shape)
    if want.dtype == np.float32:
        assert got.dtype == np.float32
        return int(np.sum(got.view(np.int32) != want.view(np.int32)))
    assert got.dtype == want.dtype == np.int8
    return int(np.sum(got != want))


def test_the_data_covers_every_op():
    assert len(MODELS) >= 50
    kinds = set()
    for name in MODELS + REFUSED_BY_TFLM:
        kinds |= {(n.op, n.attrs.get("fn")) for n in _model(name).graph.nodes}
    ops = {k for k, _ in kinds}
    assert {
        "dense",
        "conv",
        "depthwise_conv",
        "maxpool",
        "avgpool",
        "pool",
        "add",
        "mul",
        "square",
        "mul_const",
        "mean",
        "pad",
        "concat",
        "reshape",
        "flatten",
        "activation",
        "requantize",
        "dequantize",
        "lut",
        "softmax",
    } <= ops
    assert {("activation", f) for f in ("relu", "relu6", "relu_n1_to_1")} <= kinds
    assert {("lut", "sigmoid"), ("lut", "tanh"), ("pool", "avg"), ("pool", "max")} <= kinds
    for name in MODELS:
        x = _data(name)["x"]
        assert x.shape[0] == 16 and (x[0] == -128).all() and (x[1] == 127).all()


@pytest.mark.parametrize("name", [m for m in MODELS if m not in REFUSED_BY_HWJAX])
def test_model_equals_tflm(name):
    d = _data(name)
    bad = _mismatches(_model(name).run(d["x"], runtime=XMOS), d["y"])
    assert bad == 0, f"{name}: {bad} of {d['y'].size} outputs differ from TFLM"


@pytest.mark.parametrize("name", MODELS)
def test_model_equals_the_official_tflite_micro_package(name):
    """runtime="tflm" (current TFLM) against the official ``tflite-micro`` interpreter,
    live, on the same stored models and inputs (one example per invoke)."""
    runtime = pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    d = _data(name)
    with open(os.path.join(DATA, f"{name}.tflite"), "rb") as f:
        ip = runtime.Interpreter.from_bytes(f.read())
    want = []
    for x in d["x"]:
        ip.set_input(x[None], 0)
        ip.invoke()
        want.append(ip.get_output(0)[0].copy())
    bad = _mismatches(_model(name).run(d["x"], runtime="tflm"), np.stack(want))
    assert bad == 0, f"{name}: {bad} outputs differ from the official TFLM"


def test_tflm_differs_from_litert_reference_where_it_has_its_own_kernels():
    """hwjax's "reference" (LiteRT BUILTIN_REF, checked elsewhere) gives other outputs on
    these models: TFLM's LOGISTIC / TANH kernels and its RELU6 without requantisation are
    not LiteRT's arithmetic."""
    for name in DIFFER_FROM_LITERT_REFERENCE:
        d = _data(name)
        assert _mismatches(_model(name).run(d["x"], runtime="reference"), d["y"]) > 0, name


def test_per_channel_fully_connected_uses_the_first_filter_scale_on_xmos_tflm():
    """xmos' TFLM 1.4.2 requantises every channel of a per-channel FULLY_CONNECTED with the
    first filter scale (its outputs equal a per-tensor model's); hwjax's target with
    ``tflm="xmos-1.4.2"`` does the same. Current TFLM (``runtime="tflm"``) applies each
    channel's scale, as LiteRT's reference kernel does."""
    d = _data("fc_per_channel")
    m = _model("fc_per_channel")
    assert _mismatches(m.run(d["x"], runtime=XMOS), d["y"]) == 0
    assert _mismatches(m.run(d["x"], runtime="reference"), d["y"]) > 0
    assert _mismatches(m.run(d["x"], runtime="tflm"), d["y"]) > 0


def test_models_tflm_refuses():
    """The interpreter refuses to prepare these (the reasons are stored beside them): a
    LOGISTIC whose output zero point is not -128 (hwjax raises too), and RELU_N1_TO_1 and
    SQUEEZE, which the host interpreter's op resolver does not register (hwjax runs them as
    on the other runtimes: the clamp of TFLM's fused activations, a row-major reshape)."""
    assert REFUSED_BY_TFLM == ["logistic_zp0", "relu_n1_to_1", "relu_n1_to_1_same_quant", "squeeze"]
    x = np.zeros((2, 256), np.int8)
    with pytest.raises(UnsupportedOpError, match="zero point"):
        _model("logistic_zp0").run(x, runtime="tflm")
    assert _model("logistic_zp0").run(x, runtime="reference").shape == (2, 256)


def test_jit_and_x64_do_not_change_the_results():
    """The tflm kernels inside jit (recipes through pure_callback) and under
    jax_enable_x64 give the same integers."""
    for name in ("tanh_other_out", "relu6"):
        d = _data(name)
        m = _model(name)
        y = hg.jit_run(m.graph, d["x"].astype(np.int32), XMOS)
        assert _mismatches(np.asarray(y).astype(np.int8), d["y"]) == 0, name
        with jax.enable_x64(True):
            assert _mismatches(m.run(d["x"], runtime=XMOS), d["y"]) == 0, name
