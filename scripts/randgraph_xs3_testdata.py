"""Oracle data for runtime="xs3" on random graphs: xformer conversions and host-interpreter outputs.

Re-run from the repository root (xmos-ai-tools needs numpy < 2, so it lives in its own venv,
see scripts/xformer_testdata.py)::

    .venv/bin/python scripts/randgraph_xs3_testdata.py [.venv-xmos/bin/python]

For each seed of :data:`SEEDS` it takes the graph of ``tests.randgraph.generate(seed)``
(built by ``tests.randgraph.build``, no hwjax involved), and for each entry of
:data:`REGRESSIONS` (minimised specs of the mismatch classes found on these graphs) that
spec, and writes into ``tests/data/randgraph_xs3/``, for each NAME (``seedN`` or the
regression's name):

* ``NAME.tflite``: the original graph, ``NAME.json``: its spec (as when the data was made);
* ``NAME.xc.tflite``: xformer's conversion of it (default options);
* ``NAME.npz``: ``x`` (``tests.randgraph.inputs(spec, 5)``: all -128, all 127, all the
  zero point, 5 random; for a one-element input all 256 values), ``y_xs3`` (the converted
  file in xmos-ai-tools' ``TFLMHostInterpreter``, one example per invoke) and ``y_tflm``
  (the original in the same interpreter: TFLM's reference kernels of xmos-ai-tools 1.4.2).

Graphs xformer rejects (or does not convert within :data:`TIMEOUT_S`), or whose conversion
the host interpreter cannot run, are listed in ``refused.txt`` with the reason instead.
The host interpreter needs xformer's ``xcoreSharedConfig`` metadata also on the original,
so the original runs with that one metadata entry copied from its converted file (a
temporary file; operators untouched).

Stages: build, convert (the xmos venv's ``xcore-opt`` executable, ``xcore-opt -o OUT IN``,
which is what ``xmos_ai_tools.xformer.convert`` runs with default options, here with a time
limit) and attach run in hwjax's venv (``ai-edge-litert``'s flatbuffer schema); ``run_one``
runs per graph in the xmos venv's interpreter, in its own process (it may abort).

``--only NAME[,NAME]`` remakes just those entries (the others' files stay). ``--seeds A:B``
makes seeds A..B-1 instead of the sample and the regressions: a probe, written where
``RANDGRAPH_XS3_OUT`` says (not into the stored data); check it with
``HWJAX_RANDGRAPH_XS3_DATA=<that folder> .venv/bin/python -m pytest -m slow tests/test_random_graphs.py -k xs3``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.environ.get("RANDGRAPH_XS3_OUT", os.path.join(ROOT, "tests", "data", "randgraph_xs3"))  # (probes: elsewhere)
#: the sample: seeds 0-29 of the random-graph generator (small graphs; a few are refused)
SEEDS = list(range(30))
TIMEOUT_S = 90

#: minimised specs of the classes the sample showed (the tests name them)
REGRESSIONS = {
    # seed 5 minimised: an AVERAGE_POOL_2D whose channel count is not a multiple of 4,
    # which xformer writes as a builtin DEPTHWISE_CONV_2D (weights 1 at scale 1/4, a bias
    # without quantisation) that TFLM runs; hwjax's "xs3" gives the average pool's rounding
    # instead (+-1), on the converted file and on the original
    "regress_avgpool_1ch_as_depthwise": {
        "seed": 5,
        "input": {"shape": [1, 2, 2, 1], "scale": 0.03125, "zp": -128},
        "ops": [
            {
                "op": "AVERAGE_POOL_2D",
                "in": [0],
                "kernel": [2, 2],
                "stride": [1, 1],
                "padding": "VALID",
                "act": "NONE",
                "out": None,
            }
        ],
        "output": 1,
    },
    # seed 21: LOGISTIC on an input of scale 170.7 (xformer makes it an XC_lookup; hwjax's
    # own compilation of the original raised OverflowError computing the table)
    # seed 55: a DEPTHWISE_CONV_2D with channel multiplier 3, which xformer writes as an
    # XC_conv2d_v2 depthwise of 8 -> 24 channels; hwjax refuses both files (it read the
    # converted one as malformed)
    "regress_depthwise_multiplier": {
        "seed": 55,
        "input": {"shape": [1, 4, 4, 8], "scale": 0.15801043808460236, "zp": -2},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 3,
                "kernel": [3, 1],
                "stride": [2, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 55001, "max": 127, "scale": 0.015625, "per_channel": True, "spread": 2.0},
                "bias": {"seed": 55002, "max": 1597},
                "act": "RELU6",
                "out": [0.0235294122248888, -128],
            }
        ],
        "output": 1,
    },
    # seed 271: MEAN whose float32 value is a tie (a sum of 140 at scale fl32(1/56): 2.5):
    # XC_mean rounds it away from zero (3), XNNPACK to even (2)
    "regress_mean_tie_away": {
        "seed": 271,
        "input": {"shape": [1, 7, 8, 7], "scale": 0.013678213581442833, "zp": 0},
        "ops": [{"op": "MEAN", "in": [0], "axes": [1, 2], "keep_dims": True, "out": None}],
        "output": 1,
    },
    # seed 309: a FULLY_CONNECTED over a flattened 4x8x8 input, which xformer writes as a
    # direct (1x1, 256 input channels) XC_conv2d_v2 on the input read as one pixel; the
    # reader took its 8 channels and refused the file as malformed
    "regress_fc_direct_over_flattened_input": {
        "seed": 309,
        "input": {"shape": [1, 1, 11, 8], "scale": 0.05259808525443077, "zp": 0},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 1,
                "kernel": [2, 5],
                "stride": [2, 2],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 309001, "max": 20, "scale": 0.03074788674712181, "per_channel": True, "spread": 0.5},
                "bias": {"seed": 309002, "max": 1438},
                "act": "NONE",
                "out": [0.19554255902767181, -30],
            },
            {"op": "PAD", "in": [1], "pads": [[0, 0], [1, 2], [0, 2], [0, 0]], "out": None},
            {"op": "RESHAPE", "in": [2], "to": "flat", "out": None},
            {
                "op": "FULLY_CONNECTED",
                "in": [3],
                "units": 31,
                "keep_num_dims": False,
                "w": {"seed": 309003, "max": 127, "scale": 0.07468527555465698, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 309004, "max": 14759},
                "act": "RELU",
                "out": [6.038784980773926, -128],
            },
        ],
        "output": 4,
    },
    # seed 375: a CONV_2D followed by a RESHAPE, which xformer writes into the reshaped
    # (1, 1, 1, 560) tensor; the reader refused its output shape as malformed
    "regress_conv_into_reshaped_output": {
        "seed": 375,
        "input": {"shape": [1, 10, 7, 8], "scale": 0.006864147260785103, "zp": 46},
        "ops": [
            {
                "op": "CONV_2D",
                "in": [0],
                "out_ch": 8,
                "kernel": [1, 7],
                "stride": [1, 1],
                "dilation": [2, 2],
                "padding": "SAME",
                "w": {"seed": 375001, "max": 127, "scale": 0.044393349438905716, "per_channel": True, "spread": 2.0},
                "bias": {"seed": 375002, "max": 40769},
                "act": "RELU",
                "out": [0.214003324508667, -128],
            },
            {"op": "RESHAPE", "in": [1], "to": "4d", "out": None},
        ],
        "output": 2,
    },
    # seed 828 minimised: SOFTMAX at input scale 0.537: XC_softmax's table is not shifted by
    # the row's maximum, an entry above 37 overflows to inf, the sum is inf, and the entry
    # (inf * 0, NaN) reads 0 on the host interpreter (hwjax gave -128)
    "regress_softmax_exp_overflow": {
        "seed": 828,
        "input": {"shape": [1, 8], "scale": 0.5370854139328003, "zp": -128},
        "ops": [{"op": "SOFTMAX", "in": [0], "beta": 1.0, "out": [0.00390625, -128]}],
        "output": 1,
    },
    # seed 561: an ADD of a tensor at scale 1578 to one at 0.54, for which xformer stores the
    # XC_add shift -3 (the reader refused it as out of range); VLSAT reads it as 65533
    "regress_add_negative_shift": {
        "seed": 561,
        "input": {"shape": [1, 9, 3, 5], "scale": 0.5372229814529419, "zp": -128},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 1,
                "kernel": [3, 1],
                "stride": [1, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 561001, "max": 3, "scale": 0.0035330664832144976, "per_channel": True, "spread": 4.0},
                "bias": {"seed": 561002, "max": 67108864},
                "act": "NONE",
                "out": [1577.7127685546875, -16],
            },
            {"op": "ADD", "in": [0, 1], "act": "RELU6", "out": [0.0235294122248888, -128]},
            {
                "op": "CONV_2D",
                "in": [2],
                "out_ch": 3,
                "kernel": [7, 3],
                "stride": [2, 2],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 561003, "max": 127, "scale": 0.004258887376636267, "per_channel": True, "spread": 2.0},
                "bias": {"seed": 561004, "max": 236360},
                "act": "RELU_N1_TO_1",
                "out": [0.007843137718737125, 0],
            },
        ],
        "output": 3,
    },
    # seed 447: a MAX_POOL_2D with a fused RELU6 at zero point 0, which xformer makes an
    # XC_maxpool2d and drops the activation (hwjax's compilation of the original clamped)
    "regress_maxpool_fused_relu6": {
        "seed": 447,
        "input": {"shape": [1, 6, 6, 16], "scale": 0.49543601274490356, "zp": 0},
        "ops": [
            {
                "op": "MAX_POOL_2D",
                "in": [0],
                "kernel": [2, 3],
                "stride": [2, 3],
                "padding": "VALID",
                "act": "RELU6",
                "out": None,
            }
        ],
        "output": 1,
    },
    # seed 942: a FULLY_CONNECTED with per-channel scales that xformer leaves to TFLM, as the
    # 1x1 CONV_2D it rewrote it into (per-channel scales applied); hwjax ran xmos' TFLM
    # FULLY_CONNECTED, which applies the first scale to every channel
    "regress_fc_left_to_tflm": {
        "seed": 942,
        "input": {"shape": [1, 10, 1, 9], "scale": 0.0021813660860061646, "zp": 69},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 1,
                "kernel": [1, 3],
                "stride": [3, 3],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 942001, "max": 3, "scale": 0.046070344746112823, "per_channel": True, "spread": 0.5},
                "bias": {"seed": 942002, "max": 36},
                "act": "RELU6",
                "out": [0.0235294122248888, -128],
            },
            {"op": "RESHAPE", "in": [1], "to": "flat", "out": None},
            {
                "op": "FULLY_CONNECTED",
                "in": [2],
                "units": 16,
                "keep_num_dims": False,
                "w": {"seed": 942003, "max": 3, "scale": 0.02685575559735298, "per_channel": True, "spread": 1.0},
                "bias": {"seed": 942004, "max": 7},
                "act": "NONE",
                "out": [0.0001220703125, 68],
            },
        ],
        "output": 3,
    },
    # seed 1148: a MEAN whose float32 product 88.5 plus the zero point -110 is the tie -21.5
    # (-22 on the host interpreter); XLA:CPU had contracted the product and the addition
    # into one fused multiply-add despite an optimisation barrier: -21.499997, -21
    "regress_mean_product_rounded": {
        "seed": 1148,
        "input": {"shape": [1, 11, 4, 7], "scale": 0.23787222802639008, "zp": -110},
        "ops": [
            {"op": "MEAN", "in": [0], "axes": [1, 2], "keep_dims": True, "out": None},
            {
                "op": "MAX_POOL_2D",
                "in": [1],
                "kernel": [1, 3],
                "stride": [1, 2],
                "padding": "SAME",
                "act": "NONE",
                "out": None,
            },
        ],
        "output": 2,
    },
    # seed 1964 minimised: an ADD of a per-channel constant, which xformer writes as an
    # XC_broadcast of the constant into an XC_add (hwjax did not read XC_broadcast, and
    # refused the ADD's constant operand on the original route)
    "regress_add_const_broadcast": {
        "seed": 1964,
        "input": {"shape": [1, 1, 9, 7], "scale": 0.48118624091148376, "zp": 19},
        "ops": [
            {
                "op": "ADD",
                "in": [0],
                "const": {"shape": "1c", "seed": 1964001, "scale": 1.0916012525558472, "zp": 124},
                "act": "NONE",
                "out": [1.3258113861083984, 118],
            }
        ],
        "output": 1,
    },
    # seed 1979 minimised: an ADD of a constant of the input's shape: an XC_add with a
    # constant tensor as its second operand (read as unsupported before)
    "regress_add_const_full_shape": {
        "seed": 1979,
        "input": {"shape": [1, 116], "scale": 0.0078125, "zp": 0},
        "ops": [
            {
                "op": "ADD",
                "in": [0],
                "const": {"shape": "c", "seed": 1979001, "scale": 0.006374194752424955, "zp": 88},
                "act": "NONE",
                "out": [0.016611579805612564, 25],
            }
        ],
        "output": 1,
    },
    # seed 1978 minimised: a MUL by a per-channel constant (XC_broadcast into XC_mul)
    "regress_mul_const_broadcast": {
        "seed": 1978,
        "input": {"shape": [1, 3, 5, 17], "scale": 0.16955429315567017, "zp": -27},
        "ops": [
            {
                "op": "MUL",
                "in": [0],
                "const": {"shape": "c", "seed": 1978003, "scale": 0.005759266670793295, "zp": 0},
                "act": "NONE",
                "out": [0.06240803003311157, -9],
            }
        ],
        "output": 1,
    },
    # a MUL by a scalar constant: an XC_broadcast of one byte (lib_tflite_micro's memset path)
    "regress_mul_const_scalar": {
        "seed": 3001,
        "input": {"shape": [1, 4, 4, 3], "scale": 0.05, "zp": 3},
        "ops": [
            {
                "op": "MUL",
                "in": [0],
                "const": {"shape": "scalar", "seed": 3001001, "scale": 0.02, "zp": -5},
                "act": "NONE",
                "out": [0.04, -2],
            }
        ],
        "output": 1,
    },
    # seed 1316: a SOFTMAX over the rows of a 4-D tensor, which xformer writes as an
    # XC_batched_softmax of the (1, 10, 5) reshaped input (lib_nn's softmax_single per row;
    # at input scale 0.9 it differs from TFLM's SOFTMAX on 207 of 400 values)
    "regress_softmax_batched": {
        "seed": 1316,
        "input": {"shape": [1, 5, 2, 5], "scale": 0.9001082181930542, "zp": -128},
        "ops": [{"op": "SOFTMAX", "in": [0], "beta": 1.0, "out": [0.00390625, -128]}],
        "output": 1,
    },
    # seed 1956 minimised: a MUL by a constant with a fused RELU6, and seed 49: a MUL of two
    # tensors with a fused RELU; xformer writes an XC_mul and an XC_lookup of the activation
    # after it (hwjax refused a fused activation on MUL on the original route)
    "regress_mul_const_fused_relu6": {
        "seed": 1956,
        "input": {"shape": [1, 81], "scale": 0.5998943448066711, "zp": -128},
        "ops": [
            {
                "op": "MUL",
                "in": [0],
                "const": {"shape": "c", "seed": 1956001, "scale": 0.009099120274186134, "zp": -59},
                "act": "RELU6",
                "out": [0.0235294122248888, -128],
            }
        ],
        "output": 1,
    },
    "regress_mul_fused_relu": {
        "seed": 49,
        "input": {"shape": [1, 2, 6, 16], "scale": 0.24776089191436768, "zp": -128},
        "ops": [
            {
                "op": "CONV_2D",
                "in": [0],
                "out_ch": 16,
                "kernel": [1, 3],
                "stride": [1, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 49001, "max": 127, "scale": 0.015625, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 49002, "max": 150314},
                "act": "NONE",
                "out": [16.0, -25],
            },
            {"op": "MUL", "in": [0, 1], "act": "RELU", "out": [151.31167602539062, -128]},
        ],
        "output": 2,
    },
    # seeds 83 and 125 minimised: an AVERAGE_POOL_2D with SAME padding, which xformer writes
    # as an XC_pad holding the input zero point and the depthwise replacement over VALID
    # windows (an XC_conv2d_v2 for 4 channels, a builtin DEPTHWISE_CONV_2D for 7): the padded
    # taps count in the divisor, where TFLite's average counts the in-image taps only
    "regress_avgpool_same_4ch": {
        "seed": 83,
        "input": {"shape": [1, 1, 6, 4], "scale": 1.328236699104309, "zp": -85},
        "ops": [
            {
                "op": "AVERAGE_POOL_2D",
                "in": [0],
                "kernel": [3, 4],
                "stride": [2, 3],
                "padding": "SAME",
                "act": "NONE",
                "out": None,
            }
        ],
        "output": 1,
    },
    "regress_avgpool_same_7ch": {
        "seed": 125,
        "input": {"shape": [1, 3, 3, 7], "scale": 0.2637295, "zp": -103},
        "ops": [
            {
                "op": "AVERAGE_POOL_2D",
                "in": [0],
                "kernel": [2, 2],
                "stride": [2, 1],
                "padding": "SAME",
                "act": "NONE",
                "out": None,
            }
        ],
        "output": 1,
    },
    # seed 90 minimised: a MAX_POOL_2D with SAME padding: an XC_pad of -128 and an
    # XC_maxpool2d (the values of TFLite's max pool over the in-image taps)
    "regress_maxpool_same": {
        "seed": 90,
        "input": {"shape": [1, 4, 7, 7], "scale": 0.15374415, "zp": -128},
        "ops": [
            {
                "op": "MAX_POOL_2D",
                "in": [0],
                "kernel": [4, 4],
                "stride": [1, 2],
                "padding": "SAME",
                "act": "NONE",
                "out": None,
            }
        ],
        "output": 1,
    },
    # seed 581: an XC_add with shift 0 over 45 values: lib_nn's C code for the last 13 (the
    # count mod 16) rounds with 1 << -1, which x86 computes as 1 << 31, flipping the sign
    # (127 for -128 and the reverse); its dilated depthwise convolutions also run exactly
    "regress_add_shift_zero_tail": {
        "seed": 581,
        "input": {"shape": [1, 1, 5, 9], "scale": 0.049397919327020645, "zp": -128},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 1,
                "kernel": [3, 1],
                "stride": [1, 1],
                "dilation": [3, 2],
                "padding": "SAME",
                "w": {"seed": 581001, "max": 20, "scale": 0.030020814388990402, "per_channel": True, "spread": 1.0},
                "bias": {"seed": 581002, "max": 7024},
                "act": "NONE",
                "out": [0.2343408763408661, -8],
            },
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [1],
                "mult": 1,
                "kernel": [1, 3],
                "stride": [1, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 581003, "max": 20, "scale": 0.0033901461865752935, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 581004, "max": 67108864},
                "act": "RELU",
                "out": [314.5195007324219, -128],
            },
            {"op": "ADD", "in": [1, 2], "act": "RELU6", "out": [0.0235294122248888, -128]},
        ],
        "output": 3,
    },
    # seed 30 minimised: a depthwise convolution with channel multiplier 2 on 3 channels,
    # which xformer leaves to TFLM (after an XC_pad for SAME); on a multiple of 4 channels it
    # writes an XC_conv2d_v2 instead (regress_depthwise_multiplier, refused)
    "regress_depthwise_multiplier_3ch": {
        "seed": 30,
        "input": {"shape": [1, 6, 3, 3], "scale": 0.015625, "zp": 72},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 2,
                "kernel": [3, 4],
                "stride": [1, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 30001, "max": 127, "scale": 0.002078381, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 30002, "max": 1000},
                "act": "NONE",
                "out": [0.011642771, -32],
            }
        ],
        "output": 1,
    },
    # seed 1602: an XC_batched_softmax at input scale 2.0 whose row sums exceed 2**126: the
    # host's 1/S is a float32 subnormal, which XLA flushed to zero (-128 for 127)
    "regress_softmax_subnormal_reciprocal": {
        "seed": 1602,
        "input": {"shape": [1, 1, 9, 2], "scale": 0.09885076433420181, "zp": -110},
        "ops": [
            {
                "op": "CONV_2D",
                "in": [0],
                "out_ch": 12,
                "kernel": [3, 3],
                "stride": [1, 1],
                "dilation": [1, 2],
                "padding": "SAME",
                "w": {"seed": 1602001, "max": 20, "scale": 0.10251127928495407, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 1602002, "max": 6631},
                "act": "NONE",
                "out": [2.0, 15],
            },
            {
                "op": "AVERAGE_POOL_2D",
                "in": [1],
                "kernel": [1, 2],
                "stride": [2, 1],
                "padding": "VALID",
                "act": "RELU",
                "out": None,
            },
            {"op": "SOFTMAX", "in": [2], "beta": 1.0, "out": [0.00390625, -128]},
        ],
        "output": 3,
    },
    # a SOFTMAX whose exp table holds subnormals (input scale 0.5, zero point 56: -128 gives
    # exp(-92)): a row of them sums to a subnormal on the host, 127 everywhere (XLA flushes)
    "regress_softmax_subnormal_table": {
        "seed": 3002,
        "input": {"shape": [1, 3, 10], "scale": 0.5, "zp": 56},
        "ops": [{"op": "SOFTMAX", "in": [0], "beta": 1.0, "out": [0.00390625, -128]}],
        "output": 1,
    },
    # seed 40 minimised: a SOFTMAX with beta 0.5, which xformer leaves to TFLM
    "regress_softmax_beta_half": {
        "seed": 40,
        "input": {"shape": [1, 6, 1, 17], "scale": 0.17462819814682007, "zp": -128},
        "ops": [{"op": "SOFTMAX", "in": [0], "beta": 0.5, "out": [0.00390625, -128]}],
        "output": 1,
    },
    # seed 2208: an XC_add with stored shift -1 over 8 values (all in the C tail): x86
    # shifts by -1 mod 32, (acc + 2**30) >> 31, 0 where VLSAT gives -1
    "regress_add_negative_shift_tail": {
        "seed": 2208,
        "input": {"shape": [1, 8, 4, 1], "scale": 0.3268930912017822, "zp": 0},
        "ops": [
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [0],
                "mult": 1,
                "kernel": [1, 2],
                "stride": [2, 2],
                "dilation": [1, 1],
                "padding": "VALID",
                "w": {"seed": 2208001, "max": 20, "scale": 0.0015007838374003768, "per_channel": False, "spread": 0.0},
                "bias": {"seed": 2208002, "max": 67108864},
                "act": "RELU",
                "out": [257.2135314941406, 127],
            },
            {
                "op": "DEPTHWISE_CONV_2D",
                "in": [1],
                "mult": 1,
                "kernel": [1, 3],
                "stride": [1, 1],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 2208003, "max": 127, "scale": 0.0078125, "per_channel": True, "spread": 1.0},
                "bias": {"seed": 2208004, "max": 1},
                "act": "NONE",
                "out": [0.029665052890777588, -11],
            },
            {"op": "ADD", "in": [1, 2], "act": "RELU", "out": [0.012522290460765362, -128]},
        ],
        "output": 3,
    },
    # seed 856: an ADD of a constant with a fused RELU6 at output scale 1/32 (zero point -128:
    # the clamp at 6.0 is 64, not the int8 range), which xformer writes as XC_add and an
    # XC_lookup of RELU6 (refused on the original route before)
    "regress_add_const_fused_relu6": {
        "seed": 856,
        "input": {"shape": [1, 1, 11, 16], "scale": 0.058507658541202545, "zp": 126},
        "ops": [
            {
                "op": "ADD",
                "in": [0],
                "const": {"shape": "1c", "seed": 856001, "scale": 0.010085558518767357, "zp": 67},
                "act": "RELU6",
                "out": [0.03125, -128],
            }
        ],
        "output": 1,
    },
    # seed 3215 minimised: a SOFTMAX over one row of a (1, 1, n) tensor, which xformer leaves to
    # TFLM (it makes XC_softmax of (1, n) and XC_batched_softmax of several rows); at input
    # scale 62983 the two differ
    "regress_softmax_one_row_3d": {
        "seed": 3215,
        "input": {"shape": [1, 1, 3], "scale": 62983.5234375, "zp": 11},
        "ops": [{"op": "SOFTMAX", "in": [0], "beta": 1.0, "out": [0.00390625, -128]}],
        "output": 1,
    },
    # seed 3171: a 1x1 CONV_2D with stride 2 whose one output pixel steps over its (1, 2)
    # input: its memcpy params look like a fully connected layer's flattened input (read as
    # malformed: "inconsistent parameter structs"); the patch size tells them apart
    "regress_conv_1x1_strided_one_pixel": {
        "seed": 3171,
        "input": {"shape": [1, 1, 4, 17], "scale": 0.16332489252090454, "zp": -128},
        "ops": [
            {
                "op": "CONV_2D",
                "in": [0],
                "out_ch": 9,
                "kernel": [3, 1],
                "stride": [1, 2],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 3171001, "max": 127, "scale": 0.04871804267168045, "per_channel": True, "spread": 4.0},
                "bias": {"seed": 3171002, "max": 37220},
                "act": "NONE",
                "out": [79.06250762939453, -34],
            },
            {
                "op": "ADD",
                "in": [1],
                "const": {"shape": "c", "seed": 3171003, "scale": 8.34752368927002, "zp": -128},
                "act": "NONE",
                "out": [54.80600357055664, 1],
            },
            {
                "op": "CONV_2D",
                "in": [2],
                "out_ch": 4,
                "kernel": [1, 1],
                "stride": [2, 2],
                "dilation": [1, 1],
                "padding": "SAME",
                "w": {"seed": 3171004, "max": 64, "scale": 0.029550081118941307, "per_channel": True, "spread": 4.0},
                "bias": {"seed": 3171005, "max": 32203},
                "act": "NONE",
                "out": [2612.02490234375, -36],
            },
        ],
        "output": 3,
    },
    "regress_logistic_large_input_scale": {
        "seed": 21,
        "input": {"shape": [1, 1, 1, 1], "scale": 170.72467041015625, "zp": -22},
        "ops": [{"op": "LOGISTIC", "in": [0], "out": [0.00390625, -128]}],
        "output": 1,
    },
}


def entries(seeds=None) -> dict:
    """The sample and the regressions; with ``seeds``, those seeds only (a probe)."""
    sys.path.insert(0, ROOT)
    from tests import randgraph as rg

    out = {f"seed{s}": rg.generate(s) for s in (SEEDS if seeds is None else seeds)}
    if seeds is None:
        out.update(REGRESSIONS)
    return out


def inputs(spec) -> np.ndarray:
    from tests import randgraph as rg

    if int(np.prod(spec["input"]["shape"])) == 1:
        return np.arange(-128, 128, dtype=np.int8).reshape(256, *spec["input"]["shape"][1:])
    return rg.inputs(spec, 5)


def build(work: str, specs: dict) -> None:
    """``OUT/NAME.tflite``, ``OUT/NAME.json`` and ``work/NAME.x.npy``."""
    from tests import randgraph as rg

    os.makedirs(OUT, exist_ok=True)
    for name, spec in specs.items():
        for suffix in (".tflite", ".xc.tflite", ".npz", ".json"):
            if os.path.exists(os.path.join(OUT, name + suffix)):
                os.remove(os.path.join(OUT, name + suffix))
        with open(os.path.join(OUT, f"{name}.tflite"), "wb") as f:
            f.write(rg.build(spec))
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(spec, f)
        np.save(os.path.join(work, f"{name}.x.npy"), inputs(spec))
        print(f"{name}: {rg.describe(spec)}")


def convert(work: str, names, xcore_opt: str) -> dict:
    """``OUT/NAME.xc.tflite`` for every name; returns ``{name: reason}`` of the rejected ones."""
    refused = {}
    for name in names:
        src, dst = os.path.join(OUT, f"{name}.tflite"), os.path.join(work, f"{name}.xc.tflite")
        try:
            p = subprocess.run([xcore_opt, "-o", dst, src], capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            refused[name] = f"xformer: no result within {TIMEOUT_S} s"
            continue
        if p.returncode != 0 or not os.path.exists(dst):
            tail = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            refused[name] = f"xformer: exit code {p.returncode}: {tail}"
            continue
        os.replace(dst, os.path.join(OUT, f"{name}.xc.tflite"))
    return refused


def attach(work: str, name: str) -> bool:
    """``work/NAME.tflm.tflite``: the original plus its conversion's ``xcoreSharedConfig``."""
    import flatbuffers
    import ai_edge_litert.schema_py_generated as s

    def read(path):
        with open(path, "rb") as f:
            return s.ModelT.InitFromPackedBuf(bytearray(f.read()), 0)

    orig, xc = read(os.path.join(OUT, f"{name}.tflite")), read(os.path.join(OUT, f"{name}.xc.tflite"))
    cfg = [m for m in (xc.metadata or []) if m.name == b"xcoreSharedConfig"]
    if len(cfg) != 1:
        return False
    buf = s.BufferT()
    buf.data = xc.buffers[cfg[0].buffer].data
    orig.buffers.append(buf)
    md = s.MetadataT()
    md.name, md.buffer = "xcoreSharedConfig", len(orig.buffers) - 1
    orig.metadata = [md]
    b = flatbuffers.Builder(1024)
    b.Finish(orig.Pack(b), file_identifier=b"TFL3")
    with open(os.path.join(work, f"{name}.tflm.tflite"), "wb") as f:
        f.write(bytes(b.Output()))
    return True


def _host(path: str, x: np.ndarray) -> np.ndarray:
    """The host interpreter's outputs, one invoke per example (the loop of xformer_testdata.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from xformer_testdata import _run_host

    return _run_host(path, x)


def run_one(work: str, name: str) -> None:
    """``OUT/NAME.npz`` (xmos venv; its own process per graph)."""
    x = np.load(os.path.join(work, f"{name}.x.npy"))
    y_xs3 = _host(os.path.join(OUT, f"{name}.xc.tflite"), x)
    y_tflm = _host(os.path.join(work, f"{name}.tflm.tflite"), x)
    np.savez_compressed(os.path.join(OUT, f"{name}.npz"), x=x, y_xs3=y_xs3, y_tflm=y_tflm)
    print(f"{name}: xs3 differs from TFLM on {int(np.sum(y_xs3 != y_tflm))} of {y_xs3.size} outputs")


def main(xmos_python: str, only=None, seeds=None) -> None:
    me = os.path.abspath(__file__)
    if seeds is not None and os.path.abspath(OUT) == os.path.join(ROOT, "tests", "data", "randgraph_xs3"):
        sys.exit("--seeds writes a probe: set RANDGRAPH_XS3_OUT to another folder")
    specs = entries(seeds)
    if only:
        specs = {k: v for k, v in specs.items() if k in only}
    refused_path = os.path.join(OUT, "refused.txt")
    refused = {}
    if only and os.path.exists(refused_path):  # keep the other entries' reasons
        with open(refused_path) as f:
            refused = dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)
        for k in specs:
            refused.pop(k, None)
    with tempfile.TemporaryDirectory() as work:
        build(work, specs)
        new = convert(work, list(specs), os.path.join(os.path.dirname(xmos_python), "xcore-opt"))
        for name in specs:
            if name in new:
                continue
            if not attach(work, name):
                new[name] = "no xcoreSharedConfig metadata in the conversion"
                continue
            p = subprocess.run([xmos_python, me, "run_one", work, name], capture_output=True, text=True)
            sys.stdout.write(p.stdout)
            if p.returncode != 0:
                tail = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
                new[name] = f"host interpreter: exit code {p.returncode}: {tail}"
        refused.update(new)
        with open(refused_path, "w") as f:
            for name in sorted(refused):
                f.write(f"{name}: {refused[name]}\n")
        print(f"{len(specs) - len(new)} graphs stored, {len(new)} refused (refused.txt)")


if __name__ == "__main__":
    args = sys.argv[1:]
    only = seeds = None
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1].split(","))
        del args[i : i + 2]
    if "--seeds" in args:
        i = args.index("--seeds")
        lo, hi = (int(v) for v in args[i + 1].split(":"))
        seeds = list(range(lo, hi))
        del args[i : i + 2]
    if len(args) == 3 and args[0] == "run_one":
        run_one(args[1], args[2])
    elif len(args) <= 1:
        main(args[0] if args else os.path.join(ROOT, ".venv-xmos", "bin", "python"), only, seeds)
    else:
        sys.exit(
            "usage: randgraph_xs3_testdata.py [XMOS_PYTHON] [--only NAME,...] [--seeds A:B]  (see the module docstring)"
        )
