"""Fused activations under xformer (xmos-ai-tools 1.4.2): CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED and AVERAGE_POOL_2D with NONE / RELU / RELU6 / RELU_N1_TO_1 at output zero
points -128, 0 and 40, and RELU / RELU6 ops that are not fused (``standalone_*``).

tests/data/xformer_act/ was made by scripts/xformer_act_testdata.py: the originals, their
xformer conversions and the host interpreter's outputs of the conversions on 8 fixed
inputs. xformer turns a fused RELU / RELU6 whose output zero point is not -128 into a
separate XC_lookup and drops every other fused activation; runtime="xs3" must equal the
host interpreter exactly, from the original (compiled as xformer does) and from the
converted file. A standalone RELU / RELU6 is an XC_lookup whatever its quantisation; the
one standalone case hwjax cannot tell from a dropped fused activation (RELU6 between equal
quantisations at zero point -128) is refused on the original.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hwjax.tflite as T
from hwjax.errors import UnsupportedOpError

DATA = os.path.join(os.path.dirname(__file__), "data", "xformer_act")
ALL = sorted(f[:-4] for f in os.listdir(DATA) if f.endswith(".npz"))
MODELS = [m for m in ALL if not m.startswith("standalone_")]
STANDALONE = [m for m in ALL if m.startswith("standalone_")]
REFUSED = ["standalone_relu6_same_zm128"]


def _data(name):
    return np.load(os.path.join(DATA, f"{name}.npz"))


def test_the_data_covers_every_op_activation_and_zero_point():
    assert len(MODELS) == 48
    assert {m.rsplit("_z", 1)[0] for m in MODELS} == {
        f"{op}_{act}"
        for op in ("conv", "depthwise", "dense", "avgpool")
        for act in ("none", "relu", "relu6", "relu_n1_to_1")
    }


def test_xformer_splits_relu_and_relu6_off_unless_the_zero_point_is_minus_128():
    """The rule as the converted files show it: an XC_lookup after the conv exactly for a
    fused RELU / RELU6 with output zero point other than -128."""
    for name in MODELS:
        ops = [n.op for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes]
        act, zp = name.rsplit("_z", 1)[0].split("_", 1)[1], name.rsplit("_z", 1)[1]
        assert ("xc_lookup" in ops) == (act in ("relu", "relu6") and zp != "m128"), name


def test_standalone_relu_and_relu6_become_lookups():
    assert STANDALONE == [
        "standalone_relu",
        "standalone_relu6",
        "standalone_relu6_same_zm128",
        "standalone_relu_same_zm128",
    ]
    for name in STANDALONE:
        assert [n.op for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes] == ["xc_lookup"]


@pytest.mark.parametrize("kind", ["original", "converted"])
def test_xs3_equals_host_interpreter(kind):
    bad = {}
    for name in ALL:
        if kind == "original" and name in REFUSED:
            continue
        d = _data(name)
        path = os.path.join(DATA, f"{name}.tflite" if kind == "original" else f"{name}.xc.tflite")
        y = np.asarray(T.load(path).run(d["x"], runtime="xs3"))
        assert y.dtype == np.int8
        n = int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"]))
        if n:
            bad[name] = n
    assert bad == {}


def test_what_cannot_be_told_from_a_dropped_activation_is_refused():
    d = _data(REFUSED[0])
    with pytest.raises(UnsupportedOpError, match="relu6 with output zero point -128 that is not fused"):
        T.load(os.path.join(DATA, f"{REFUSED[0]}.tflite")).run(d["x"], runtime="xs3")
