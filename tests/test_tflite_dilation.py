"""Dilated CONV_2D / DEPTHWISE_CONV_2D (and depthwise channel multipliers) against live
LiteRT on every runtime; targets without dilated kernels refuse them."""

import zlib

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.tflite as tfl
from hwjax.errors import UnsupportedOpError
from hwjax.graph import run as graph_run
from hwjax.targets import get
from hwjax.tflite import testing as T
from hwjax.litert import conv_geometry

ALL = ("reference", "optimized", "xnnpack")


def _model(rng, kind, *, in_shape, k, dilation, padding, out_ch=None, multiplier=1, per_channel=True):
    """One dilated conv / depthwise between int8 tensors, random weights, bias and quantisation."""
    mb = T.ModelBuilder()
    s_in = np.float32(10 ** rng.uniform(-2.5, -1))
    x = mb.tensor((1, *in_shape), "int8", s_in, int(rng.integers(-20, 20)))
    c = in_shape[-1]
    if kind == "CONV_2D":
        n, fan, w_shape, axis = out_ch, k[0] * k[1] * c, (out_ch, *k, c), 0
    else:
        n, fan, w_shape, axis = c * multiplier, k[0] * k[1], (1, *k, c * multiplier), 3
    s_w = rng.uniform(0.002, 0.02, n if per_channel else 1).astype(np.float32)
    w = mb.tensor(w_shape, "int8", s_w, np.zeros(s_w.shape), rng.integers(-127, 128, w_shape), axis=axis)
    b = mb.tensor((n,), "int32", (s_in * s_w).astype(np.float32), np.zeros(s_w.shape), rng.integers(-3000, 3000, n))
    g = conv_geometry(in_shape[:2], k, (1, 1), padding, dilation)
    s_out = np.float32(float(s_in) * float(s_w.max()) * 40.0 * np.sqrt(fan) / 30.0)
    y = mb.tensor((1, *g.out_hw, n), "int8", s_out, int(rng.integers(-20, 20)))
    f = {
        "padding": 0 if padding == "SAME" else 1,
        "strideH": 1,
        "strideW": 1,
        "fusedActivationFunction": 0,
        "dilationHFactor": dilation[0],
        "dilationWFactor": dilation[1],
    }
    if kind == "DEPTHWISE_CONV_2D":
        f["depthMultiplier"] = multiplier
    mb.op(kind, [x, w, b], [y], ("Conv2DOptions" if kind == "CONV_2D" else "DepthwiseConv2DOptions", f), 3)
    return mb.finish([x], [y])


CASES = [
    ("conv_same_d2", "CONV_2D", dict(in_shape=(9, 8, 3), k=(3, 3), dilation=(2, 2), padding="SAME", out_ch=4)),
    ("conv_valid_d23", "CONV_2D", dict(in_shape=(9, 10, 2), k=(3, 2), dilation=(2, 3), padding="VALID", out_ch=5)),
    (
        "conv_same_d23",
        "CONV_2D",
        dict(in_shape=(7, 9, 3), k=(2, 3), dilation=(2, 3), padding="SAME", out_ch=3, per_channel=False),
    ),
    ("dw_same_d2", "DEPTHWISE_CONV_2D", dict(in_shape=(9, 8, 4), k=(3, 3), dilation=(2, 2), padding="SAME")),
    (
        "dw_mult2",
        "DEPTHWISE_CONV_2D",
        dict(in_shape=(7, 6, 3), k=(3, 3), dilation=(1, 1), padding="SAME", multiplier=2),
    ),
    (
        "dw_mult3_valid_d23",
        "DEPTHWISE_CONV_2D",
        dict(in_shape=(9, 10, 2), k=(2, 3), dilation=(2, 3), padding="VALID", multiplier=3),
    ),
]


@pytest.mark.parametrize("runtime", ALL)
@pytest.mark.parametrize("name,kind,kw", CASES, ids=[c[0] for c in CASES])
def test_dilated_matches_litert(name, kind, kw, runtime):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    model = _model(rng, kind, **kw)
    m = tfl.load(model)
    node = m.graph.nodes[0]
    assert tuple(node.attrs.get("dilation", (1, 1))) == kw["dilation"]
    assert node.attrs.get("depth_multiplier", 1) == kw.get("multiplier", 1)
    x = rng.integers(-128, 128, (6, *kw["in_shape"])).astype(np.int8)
    got = np.asarray(m.run(x, runtime=runtime))
    want = T.run_litert(model, x, runtime)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", ["nvdla", "xs3", "xs3-legacy"])
@pytest.mark.parametrize("kind", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_other_targets_refuse_dilation_and_multiplier(target, kind):
    rng = np.random.default_rng(7)
    m = tfl.load(_model(rng, kind, in_shape=(8, 8, 4), k=(3, 3), dilation=(2, 2), padding="VALID", out_ch=4))
    x = rng.integers(-128, 128, (2, 8, 8, 4)).astype(np.int32)
    with pytest.raises(UnsupportedOpError, match=r"dilation \(2, 2\)"):
        graph_run(m.graph, x, get(target))
    if kind == "DEPTHWISE_CONV_2D":
        m = tfl.load(_model(rng, kind, in_shape=(8, 8, 4), k=(3, 3), dilation=(1, 1), padding="VALID", multiplier=2))
        with pytest.raises(UnsupportedOpError, match="depth_multiplier 2"):
            graph_run(m.graph, x, get(target))


@pytest.mark.parametrize("name,kind,kw", CASES, ids=[c[0] for c in CASES])
def test_save_writes_dilation_and_multiplier(name, kind, kw):
    """load -> save keeps the dilation and the channel multiplier: LiteRT runs the saved
    file exactly as the original, and it reads back into the same node attributes."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    model = _model(rng, kind, **kw)
    saved = tfl.save(tfl.load(model))
    node = tfl.load(saved).graph.nodes[0]
    assert tuple(node.attrs.get("dilation", (1, 1))) == kw["dilation"]
    assert node.attrs.get("depth_multiplier", 1) == kw.get("multiplier", 1)
    x = rng.integers(-128, 128, (4, *kw["in_shape"])).astype(np.int8)
    np.testing.assert_array_equal(T.run_litert(saved, x, "reference"), T.run_litert(model, x, "reference"))
