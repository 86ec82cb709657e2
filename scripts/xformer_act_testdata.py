"""Oracle data for fused activations under xformer: what xmos-ai-tools 1.4.2 makes of a
NONE / RELU / RELU6 / RELU_N1_TO_1 fused into CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED and AVERAGE_POOL_2D, for several output quantisations.

Re-run (from the repository root; the xmos venv as in scripts/xformer_testdata.py):

    .venv/bin/python scripts/xformer_act_testdata.py [.venv-xmos/bin/python]

It reuses the stages of :mod:`xformer_testdata` (build, xformer convert, attach the
``xcoreSharedConfig`` metadata, run both files in ``TFLMHostInterpreter``) with its own
model list and output folder ``tests/data/xformer_act/``: for every NAME
``OP_ACT_zZP`` it writes ``NAME.tflite`` (the original), ``NAME.xc.tflite`` (xformer's
conversion, default options) and ``NAME.npz`` (``x``: 8 fixed int8 inputs, ``y_xs3``: the
converted model's host outputs, ``y_tflm``: the original's, TFLM reference kernels).

``standalone_FN`` and ``standalone_FN_same_zm128`` hold one RELU / RELU6 op that is not
fused: between different random quantisations, or between equal ones (scale 0.05, zero
point -128). (xformer fails on a model of one RELU_N1_TO_1: "Could not set up compiler".)

Every other model is one op with 4 (conv, depthwise, pool) or 8 (dense) output channels,
weights and scales chosen so that the real pre-activation values spread over about
[-10, 10] (AVERAGE_POOL_2D: input quantised as its output, as xformer requires), and the
activations' bounds fall inside the int8 range (output scale 0.05 for zero point -128 and
0, 0.08 for zero point 40: RELU6's upper bound at -8, 120 and 115; RELU_N1_TO_1's bounds
20 or 12.5 steps either side of the zero point).

A re-run reproduces the originals and the ``.npz`` files byte for byte; xformer's
``.xc.tflite`` files differ in a few bytes from run to run (seen, not investigated).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xformer_testdata as xt

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "xformer_act")
ACTS = {"none": 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}
OPS = ("conv", "depthwise", "dense", "avgpool")
OUT_Q = {-128: 0.05, 0: 0.05, 40: 0.08}  # output zero point -> scale


def _model(op: str, act: str, zp: int):
    """builder(rng) -> (model bytes, per-example input shape) of one op."""
    from hwjax.tflite import testing as T

    def make(rng):
        mb = T.ModelBuilder()
        s_out = np.float32(OUT_Q[zp])
        fa = ACTS[act]
        if op == "avgpool":
            x = mb.tensor((1, 4, 4, 4), "int8", s_out, zp)  # xformer: the same quantisation in and out
            y = mb.tensor((1, 2, 2, 4), "int8", s_out, zp)
            mb.op(
                "AVERAGE_POOL_2D",
                [x],
                [y],
                (
                    "Pool2DOptions",
                    {
                        "padding": 1,
                        "strideH": 2,
                        "strideW": 2,
                        "filterHeight": 2,
                        "filterWidth": 2,
                        "fusedActivationFunction": fa,
                    },
                ),
            )
            return mb.finish([x], [y]), (4, 4, 4)
        s_in = np.float32(0.05)
        if op == "dense":
            in_shape, n, w_shape, axis, s_w = (16,), 8, (8, 16), 0, np.full(1, 0.0055, np.float32)
        elif op == "conv":
            in_shape, n, w_shape, axis = (4, 4, 4), 4, (4, 3, 3, 4), 0
            s_w = rng.uniform(0.003, 0.005, 4).astype(np.float32)
        else:
            in_shape, n, w_shape, axis = (4, 4, 4), 4, (1, 3, 3, 4), 3
            s_w = rng.uniform(0.006, 0.01, 4).astype(np.float32)
        x = mb.tensor((1, *in_shape), "int8", s_in, -5)
        w = mb.tensor(w_shape, "int8", s_w, np.zeros(s_w.shape), rng.integers(-127, 128, w_shape), axis=axis)
        b = mb.tensor((n,), "int32", (s_in * s_w).astype(np.float32), np.zeros(s_w.shape), rng.integers(-3000, 3000, n))
        if op == "dense":
            y = mb.tensor((1, n), "int8", s_out, zp)
            mb.op("FULLY_CONNECTED", [x, w, b], [y], ("FullyConnectedOptions", {"fusedActivationFunction": fa}), 1)
        else:
            y = mb.tensor((1, 2, 2, n), "int8", s_out, zp)
            f = {
                "padding": 1,
                "strideH": 1,
                "strideW": 1,
                "fusedActivationFunction": fa,
                "dilationHFactor": 1,
                "dilationWFactor": 1,
            }
            if op == "depthwise":
                f["depthMultiplier"] = 1
            mb.op(
                "CONV_2D" if op == "conv" else "DEPTHWISE_CONV_2D",
                [x, w, b],
                [y],
                ("Conv2DOptions" if op == "conv" else "DepthwiseConv2DOptions", f),
                3,
            )
        return mb.finish([x], [y]), in_shape

    return make


def _standalone(fn: str, same_quant: bool):
    """One RELU / RELU6 / RELU_N1_TO_1 op (not fused): between different random
    quantisations, or (``same_quant``) both tensors at scale 0.05, zero point -128."""
    from hwjax.tflite import testing as T

    def make(rng):
        if not same_quant:
            return T.unary_model(rng, fn, shape=(32,))
        mb = T.ModelBuilder()
        a, b = (mb.tensor((1, 32), "int8", np.float32(0.05), -128) for _ in range(2))
        mb.op(fn, [a], [b])
        return mb.finish([a], [b]), (32,)

    return make


def _models():
    out = {}
    for i, op in enumerate(OPS):
        for j, act in enumerate(ACTS):
            for k, zp in enumerate(OUT_Q):
                out[f"{op}_{act}_z{zp}".replace("-", "m")] = (100 * i + 10 * j + k, _model(op, act, zp))
    for j, fn in enumerate(("RELU", "RELU6")):
        out[f"standalone_{fn.lower()}"] = (500 + j, _standalone(fn, False))
        out[f"standalone_{fn.lower()}_same_zm128"] = (510 + j, _standalone(fn, True))
    return out


def _use_our_data():
    xt.OUT = OUT
    xt._models = _models


def main(xmos_python: str) -> None:
    import subprocess
    import tempfile

    _use_our_data()
    with tempfile.TemporaryDirectory() as work:
        xt.build(work)
        me = os.path.abspath(__file__)
        subprocess.run([xmos_python, me, "convert", work], check=True)
        xt.attach(work)
        subprocess.run([xmos_python, me, "run", work], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("convert", "run"):
        _use_our_data()
        {"convert": xt.convert, "run": xt.run}[sys.argv[1]](sys.argv[2])
    elif len(sys.argv) <= 2:
        main(
            sys.argv[1]
            if len(sys.argv) == 2
            else os.path.join(os.path.dirname(OUT), "..", "..", ".venv-xmos", "bin", "python")
        )
    else:
        sys.exit("usage: xformer_act_testdata.py [XMOS_PYTHON]  (see the module docstring)")
