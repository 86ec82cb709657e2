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

import math
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


def _model_error(m, beta, amin, amax, qp) -> float:
    """lib_nn's high-precision error of a channel-wise transform, one accumulator at a
    time in Python integers: each step of the 64-bit emulation saturated to 2**16 (2**8
    for the last), against C's round of ``acc m + beta`` clamped to int8."""

    def sat(v, bits):
        return max(-(1 << bits), min((1 << bits) - 1, v))

    def shr(v, s, bits=16):
        return sat((v + (1 << (s - 1))) >> s if s > 0 else v << -s, bits)

    worst = 0.0
    for c in range(len(m)):
        errors = []
        for acc in range(int(amin[c]), int(amax[c]) + 1):
            t = shr(acc, int(qp["shifts"][c]))
            t = sat((t * int(qp["multipliers"][c]) + (1 << 13)) >> 14, 16)
            t = sat(t + int(qp["biases"][c]), 16)
            t = sat(shr(shr(t, int(qp["final_shr"])), 8), 8)
            v = float(acc) * float(m[c]) + float(beta[c])
            r = math.floor(abs(v) + 0.5)
            expected = max(-128, min(127, int(math.copysign(r, v)) if r else 0))
            errors.append(abs(expected - t))
        if errors:
            worst = max(worst, sum(errors) / len(errors))
    return worst


def test_channelwise_error_is_the_per_accumulator_model():
    """xformer's channel-wise error estimate (which decides between the channel-wise
    transform and the TFLM op) equals the model evaluated one accumulator at a time;
    empty ranges count nothing; stopping early above a threshold tells the same side of it."""
    import hwjax.targets._xformer as X

    rng = np.random.default_rng(3)
    for _ in range(6):
        c = int(rng.integers(1, 7))
        m = rng.uniform(1e-4, 3e-2, c)
        beta = rng.uniform(-60, 60, c)
        amin = rng.integers(-700, 0, c)
        amax = amin + rng.integers(-3, 900, c)
        qp = X.channelwise_params(m, beta, amin, amax)
        full = _model_error(m, beta, amin, amax, qp)
        assert X.channelwise_error(m, beta, amin, amax, qp) == full
        for stop in (0.0, full / 2, full, 0.25):  # early exit: the same side of the threshold
            early = X.channelwise_error(m, beta, amin, amax, qp, stop_above=stop)
            assert (early > stop) == (full > stop) and early <= full
