"""xformer's XC operators and the xcore.ai runtime against xmos-ai-tools 1.4.2.

The oracle data in tests/data/xformer/ was made by scripts/xformer_testdata.py: original
int8 models, their xformer conversions, and the outputs of both in the xmos host
interpreter (TFLMHostInterpreter) on 8 fixed inputs. Every comparison is exact.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hwjax.tflite as T
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets import get
from hwjax.tflite._xcore import flex_loads

DATA = os.path.join(os.path.dirname(__file__), "data", "xformer")
MODELS = sorted(f[:-4] for f in os.listdir(DATA) if f.endswith(".npz"))
# originals whose builtin ops the TFLite("tflm") target runs as the host interpreter does
TFLM_MODELS = ["add", "chain", "conv_16_17_s2", "conv_1x1", "conv_3_5_same", "conv_8_12_valid", "conv_direct",
               "depthwise", "depthwise_valid_s2", "maxpool", "pad"]


def _data(name):
    return np.load(os.path.join(DATA, f"{name}.npz"))


def test_the_data_covers_the_xc_ops():
    assert len(MODELS) == 14
    ops = set()
    for name in MODELS:
        ops |= {n.op for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes}
    assert {"xc_conv2d", "xc_pad", "xc_pad_3_to_4", "xc_slice", "xc_lookup", "xc_add", "xc_mean",
            "xc_maxpool2d", "reshape", "flatten", "depthwise_conv", "maxpool"} <= ops


@pytest.mark.parametrize("name", MODELS)
def test_xformed_model_equals_host_interpreter(name):
    d = _data(name)
    y = np.asarray(T.load(os.path.join(DATA, f"{name}.xc.tflite")).run(d["x"], runtime="xs3"))
    assert y.dtype == d["y_xs3"].dtype
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0


@pytest.mark.parametrize("name", TFLM_MODELS)
def test_original_model_tflm_equals_host_interpreter(name):
    d = _data(name)
    y = np.asarray(T.load(os.path.join(DATA, f"{name}.tflite")).run(d["x"], runtime="tflm"))
    assert int(np.sum(y.reshape(d["y_tflm"].shape) != d["y_tflm"])) == 0


def test_conv_kernel_types_are_decoded():
    kinds = {}
    for name in ("conv_1x1", "conv_3_5_same", "depthwise_valid_s2", "fully_connected"):
        for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes:
            if n.op == "xc_conv2d":
                kinds[name] = (n.attrs["kernel_type"], tuple(n.attrs["kernel_size"]), tuple(n.attrs["stride"]))
    assert kinds == {"conv_1x1": ("direct", (1, 1), (1, 1)), "conv_3_5_same": ("indirect", (3, 3), (1, 1)),
                     "depthwise_valid_s2": ("depthwise", (3, 3), (2, 2)),
                     "fully_connected": ("indirect", (1, 1), (1, 1))}


def test_xformer_weights_are_the_original_weights():
    """The kernel recovered from the reordered blob is the original model's (conv 8 -> 12)."""
    orig = T.load(os.path.join(DATA, "conv_8_12_valid.tflite")).graph.nodes[0].params["kernel"]
    xc = [n for n in T.load(os.path.join(DATA, "conv_8_12_valid.xc.tflite")).graph.nodes if n.op == "xc_conv2d"]
    np.testing.assert_array_equal(np.asarray(xc[0].params["kernel"]), np.asarray(orig))


def test_hardware_variant_is_available():
    d = _data("conv_3_5_same")
    m = T.load(os.path.join(DATA, "conv_3_5_same.xc.tflite"))
    y = np.asarray(m.run(d["x"], runtime=get("xs3-tflm", variant="hardware")))
    assert y.shape == d["y_xs3"].shape and np.abs(y.astype(int) - d["y_xs3"]).max() <= 1


# ------------------------------------------------------------------ flexbuffers, errors


def test_flex_loads_reads_binary_strings():
    import flatbuffers.flexbuffers as fx

    raw = bytes(range(200, 256)) + b"\xff\x00"
    buf = fx.Dumps({"k": 3, "s": raw.decode("latin-1"), "f": 0.5, "v": True, "n": -7})
    got = flex_loads(buf)
    assert got["k"] == 3 and got["f"] == 0.5 and got["v"] is True and got["n"] == -7
    assert got["s"] == raw.decode("latin-1").encode("utf-8")  # the bytes as stored
    with pytest.raises(FormatError):
        flex_loads(b"\x01")


def _patched(name, old: bytes, new: bytes) -> bytes:
    with open(os.path.join(DATA, f"{name}.xc.tflite"), "rb") as f:
        data = f.read()
    assert data.count(old) == 1
    return data.replace(old, new)


def test_unsupported_kernel_type_raises():
    # the flexbuffer map's value for "k" (kernel type 1, an inline int) -> 2 (PaddedIndirect)
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._xcore import KERNEL_TYPES

    assert 2 not in KERNEL_TYPES
    m = T.load(os.path.join(DATA, "conv_8_12_valid.xc.tflite"))  # loads
    assert any(n.op == "xc_conv2d" for n in m.graph.nodes)
    opts = fx.Dumps({"k": 2, "t": 0, "mp": "", "a": "", "o": "", "p": ""})
    from hwjax.tflite._import import OpContext
    from hwjax.tflite._xcore import _conv2d_v2

    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(CUSTOM\(XC_conv2d_v2\)\): kernel type 2"):
        _conv2d_v2(None, OpContext("CUSTOM(XC_conv2d_v2)", 0, None, bytes(opts), (0, 1, 2), (3,)))


def test_unknown_option_raises():
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._import import OpContext
    from hwjax.tflite._xcore import _add

    opts = bytes(fx.Dumps({"m1": 1, "m2": 1, "bias": 0, "shift": 1, "act": 1}))
    with pytest.raises(UnsupportedOpError, match=r"XC_add.*\['act'\]"):
        _add(None, OpContext("CUSTOM(XC_add)", 4, None, opts, (0, 1), (2,)))
