"""The Keras-converted int8 models (tests/data/keras/) on the microcontroller runtimes,
against xmos-ai-tools 1.4.2's host interpreter (TFLMHostInterpreter).

scripts/keras_mcu_testdata.py made tests/data/keras_mcu/: each model's xformer conversion
(NAME.xc.tflite, default options) and, on 8 inputs (the first 8 of tests/data/keras/NAME.npz),
the interpreter's outputs for the converted model (y_xs3) and for the original (y_tflm:
TFLM's reference kernels). Every comparison is exact (int8 equality):

* the xformed file on runtime="xs3" (XC ops incl. XC_concat, XC_mul, XC_softmax) == y_xs3;
* hwjax's own compilation of the original on runtime="xs3" (xformer's recipe) == y_xs3;
* the original on xmos' TFLM (``TFLite("tflm", tflm="xmos-1.4.2")``) == y_tflm: every model
  ends in a FULLY_CONNECTED with per-channel filter scales, which that TFLM build requantises
  with the first scale only, and so does that target (tests/test_tflite_tflm.py).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hwjax.tflite as T

HERE = os.path.dirname(__file__)
ORIG = os.path.join(HERE, "data", "keras")
DATA = os.path.join(HERE, "data", "keras_mcu")
MODELS = ("mobilenet_v2_tiny", "cnn_branches", "mlp_sigmoid")

pytestmark = pytest.mark.skipif(
    not os.path.isdir(DATA), reason=f"no oracle data folder {DATA} (make it with scripts/keras_mcu_testdata.py)"
)

_cache: dict = {}


def _data(name):
    if name not in _cache:
        with np.load(os.path.join(DATA, f"{name}.npz")) as z:
            _cache[name] = {k: z[k] for k in z.files}
    return _cache[name]


def _original(name):
    return T.load(os.path.join(ORIG, f"{name}.tflite"))


def _xformed(name):
    return T.load(os.path.join(DATA, f"{name}.xc.tflite"))


def _check(got, want, what):
    got = np.asarray(got)
    assert got.dtype == want.dtype == np.int8, what
    got = got.reshape(want.shape)
    bad = int(np.sum(got != want))
    assert bad == 0, (
        f"{what}: {bad} of {want.size} outputs differ (max |diff| {int(np.abs(got.astype(int) - want).max())})"
    )


def test_the_data_is_complete():
    ops = set()
    for name in MODELS:
        d = _data(name)
        assert d["x"].shape[0] == 8 and d["x"].dtype == np.int8
        with np.load(os.path.join(ORIG, f"{name}.npz")) as z:
            np.testing.assert_array_equal(d["x"], z["x"][:8])
        assert d["y_xs3"].shape == d["y_tflm"].shape == (8, 10)
        assert int(np.sum(d["y_xs3"] != d["y_tflm"])) > 0  # two arithmetics, not one
        ops |= {n.op for n in _xformed(name).graph.nodes}
    assert {
        "xc_conv2d",
        "xc_pad",
        "xc_pad_3_to_4",
        "xc_slice",
        "xc_lookup",
        "xc_add",
        "xc_mean",
        "xc_maxpool2d",
        "xc_concat",
        "xc_mul",
        "xc_softmax",
    } <= ops


@pytest.mark.parametrize("name", MODELS)
def test_xformed_xs3_equals_host_interpreter(name):
    d = _data(name)
    _check(_xformed(name).run(d["x"], runtime="xs3"), d["y_xs3"], f"{name}.xc.tflite on xs3")


@pytest.mark.parametrize("name", [pytest.param(MODELS[0], marks=pytest.mark.slow), *MODELS[1:]])
def test_original_xs3_equals_host_interpreter_of_xformed(name):
    """hwjax's own xformer compilation of the original model on ``"xs3"``. The largest
    model (MobileNetV2) is ``slow``: its XC ops are checked in the fast suite through its
    xformed file, and the compilation recipe through the other two models."""
    d = _data(name)
    _check(_original(name).run(d["x"], runtime="xs3"), d["y_xs3"], f"{name}.tflite on xs3 (hwjax's compilation)")


@pytest.mark.parametrize("name", MODELS)
def test_original_on_tflm_equals_host_interpreter(name):
    """The original model on xmos' TFLM 1.4.2: its per-channel FULLY_CONNECTED layers run
    with the first filter scale for every channel."""
    from hwjax.targets import TFLite

    m = _original(name)
    assert any(n.op == "dense" and np.size(n.params["w_scale"]) > 1 for n in m.graph.nodes)
    d = _data(name)
    _check(m.run(d["x"], runtime=TFLite("tflm", tflm="xmos-1.4.2")), d["y_tflm"], f"{name}.tflite on tflm")


def test_compiled_parameters_equal_xformers():
    """hwjax's transcriptions of xformer's recipes (XC_lookup tables of TANH / LOGISTIC,
    XC_softmax's float32 exp table, XC_mul's nn_mul_params_t) equal what xformer wrote."""
    from hwjax.targets._xformer import xformer_lut_table, xformer_mul_params, xformer_softmax_table

    seen = {"lut": 0, "softmax": 0, "mul": 0}
    for name in MODELS:
        g, xc = _original(name).graph, _xformed(name).graph

        def q(t):
            return g.tensors[t].quant

        def pairs(op, xc_op):
            a, b = [n for n in g.nodes if n.op == op], [n for n in xc.nodes if n.op == xc_op]
            assert len(a) == len(b), (name, op)
            seen[op] += len(a)
            return zip(a, b)

        for a, b in pairs("lut", "xc_lookup"):
            qi, qo = q(a.inputs[0]), q(a.outputs[0])
            np.testing.assert_array_equal(
                xformer_lut_table(a.attrs["fn"], qi.scale, qi.zero_point, qo.scale, qo.zero_point),
                np.asarray(b.params["table"]),
            )
        for a, b in pairs("softmax", "xc_softmax"):
            qi = q(a.inputs[0])
            np.testing.assert_array_equal(
                xformer_softmax_table(qi.scale, qi.zero_point).view(np.int32),
                np.asarray(b.params["table"], np.float32).view(np.int32),
            )
        for a, b in pairs("mul", "xc_mul"):
            q1, q2, qo = q(a.inputs[0]), q(a.inputs[1]), q(a.outputs[0])
            got = xformer_mul_params(q1.scale, q1.zero_point, q2.scale, q2.zero_point, qo.scale, qo.zero_point)
            assert {k: int(v) for k, v in got.items()} == {k: b.attrs[k] for k in got}
    assert seen == {"lut": 6, "softmax": 1, "mul": 1}


def test_c_expf_equals_the_c_librarys():
    """:func:`c_expf` (glibc's algorithm, which xformer's table calls) against this
    machine's libm, where that is glibc; and it is not simply the correctly rounded value."""
    import ctypes
    import ctypes.util

    from hwjax.targets._xformer import c_expf

    path = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(path or "libm.so.6")
        gnu = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        pytest.skip("no glibc libm here")
    gnu.restype = ctypes.c_char_p
    if tuple(int(v) for v in gnu().decode().split(".")[:2]) < (2, 28):
        pytest.skip("glibc < 2.28 has another expf")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    rng = np.random.default_rng(0)
    # arguments where expf is not the correctly rounded float, then random ones
    odd = np.float32([float.fromhex(h) for h in ("0x1.224672p+2", "-0x1.a6865ap+1", "0x1.42a2b4p+1")])
    assert np.all(c_expf(odd) != np.exp(odd.astype(np.float64)).astype(np.float32))
    x = np.concatenate([odd, rng.uniform(-110, 95, 20000), rng.uniform(-2, 2, 5000)]).astype(np.float32)
    want = np.array([libm.expf(float(v)) for v in x], np.float32)
    np.testing.assert_array_equal(c_expf(x).view(np.int32), want.view(np.int32))
