"""Bad inputs to the public functions of hwjax.nn, hwjax.graph, hwjax.targets and the top-level API.

Each case must raise an :class:`hwjax.errors.HwjaxError` whose message names the
argument (never an error from inside JAX, Flax or NumPy, never a silent result); the
valid alternative forms (a list for an array) give the canonical result.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hwjax
import hwjax.graph as hg
import hwjax.nn as hn
from hwjax import targets as T
from hwjax.errors import ArgTypeError, FileError, FormatError, HwjaxError, RangeError, ShapeError, UnknownOpError

F = np.float32


def _model():
    return hn.Sequential({"q": hn.Quantize(target=T.XS3())})


CASES = [
    # (call, error class, the name the message must contain)
    (lambda: hn.act_qparams("x"), ArgTypeError, "rng"),
    (lambda: hn.act_qparams(np.zeros(3, F)), ShapeError, "rng"),
    (lambda: hn.act_qparams(np.array([np.nan, 1.0], F)), RangeError, "rng"),
    (lambda: hn.act_qparams(np.array([0.0, 1.0], F), symmetric="yes"), ArgTypeError, "symmetric"),
    (lambda: hn.weight_scales("w", (0,)), ArgTypeError, "w"),
    (lambda: hn.weight_scales(np.ones((3, 3), F), (5,)), RangeError, "reduce_axes"),
    (lambda: hn.weight_scales(np.full((3, 3), np.nan, F), (0,)), RangeError, "w"),
    (lambda: hn.quantize_weights(np.ones((3, 2), F), np.zeros(2, F)), RangeError, "scales"),
    (lambda: hn.quantize_weights(np.ones((3, 2), F), np.ones(5, F)), ShapeError, "scales"),
    (lambda: hn.quantize_act(np.array([np.nan], F), 0.1, 0), RangeError, "x"),
    (lambda: hn.quantize_act(np.array([1.0], F), 0.0, 0), RangeError, "scale"),
    (lambda: hn.quantize_act(np.array([1.0], F), 0.1, 300), RangeError, "zero_point"),
    (lambda: hn.as_float("x"), ArgTypeError, "x"),
    (lambda: hn.exact_forward(np.ones(3, F), np.ones(4, F)), ShapeError, "surrogate"),
    (lambda: hn.exact_forward(np.ones(3, F), np.ones(3, np.int32)), ArgTypeError, "surrogate"),
    (lambda: hn.set_mode(_model(), "fast"), RangeError, "mode"),
    (lambda: hn.set_mode("m", "float"), ArgTypeError, "model"),
    (lambda: hn.get_mode(3), ArgTypeError, "model"),
    (lambda: hn.to_graph("m"), ArgTypeError, "model"),
    (lambda: hn.to_graph(_model(), (-1, 3)), RangeError, "input_shape"),
    (lambda: hn.from_graph("g", T.XS3()), ArgTypeError, "graph"),
    (lambda: hg.get_op("nonsense"), UnknownOpError, "nonsense"),
    (lambda: hg.get_op(3), UnknownOpError, "op kind"),
    (lambda: hg.lower("g", T.XS3()), ArgTypeError, "graph"),
    (lambda: hg.jit_run("g", np.zeros(3)), ArgTypeError, "graph"),
    (lambda: hg.derive_params(3, []), ArgTypeError, "target"),
    (lambda: hg.derive_params(T.XS3(), [("dense", None)]), ArgTypeError, "requests"),
    (lambda: hg.derive_params(T.XS3(), "dense"), ArgTypeError, "requests"),
    (lambda: hg.pool_geometry({"window": (2, 2)}, (1, 4, 4, 1)), ArgTypeError, "strides"),
    (lambda: hg.pool_geometry({"window": (2, 2), "strides": (1, 1)}, (4, 4)), ShapeError, "input"),
    (lambda: hg.register_op("x"), ArgTypeError, "spec"),
    (lambda: hwjax.evaluate("m", np.zeros((2, 3), F)), ArgTypeError, "model"),
    (lambda: hwjax.export("m", "unused"), ArgTypeError, "model"),
    (lambda: hwjax.checked(3), ArgTypeError, "fn"),
    (lambda: T.get("nochip"), RangeError, "nochip"),
    (lambda: T.get(3), RangeError, "target"),
    (lambda: T.get("xs3", variant="v9"), RangeError, "variant"),
    (lambda: T.get("xs3", colour="red"), RangeError, "colour"),
    (lambda: T.resolve(3), ArgTypeError, "target"),
    (lambda: T.register("", lambda: None), ArgTypeError, "target name"),
    (lambda: T.lut_function("relu9"), RangeError, "LUT function"),
    (lambda: T.lut_table("tanh", s_in=0.0, z_in=0, s_out=0.1, z_out=0), RangeError, "s_in"),
    (lambda: T.lut_table("tanh", s_in=0.1, z_in=300, s_out=0.1, z_out=0), RangeError, "z_in"),
    (lambda: T.lut_table("tanh", s_in=0.1, z_in=0, s_out=np.nan, z_out=0), RangeError, "s_out"),
    (
        lambda: T.xs3_bso(
            np.ones((4, 3), np.int8),
            np.ones(4, np.int32),
            s_in=0.0,
            z_in=0,
            s_w=np.full(4, 0.01, F),
            s_out=0.1,
            z_out=0,
        ),
        RangeError,
        "s_in",
    ),
    (lambda: T.xs3_add_params(s1=0.0, z1=0, s2=0.1, z2=0, s_out=0.1, z_out=0), RangeError, "s1"),
    (lambda: T.xs3_add_params(s1=0.1, z1=0, s2=0.1, z2=999, s_out=0.1, z_out=0), RangeError, "z2"),
    (lambda: T.check_xformer_lowering("g"), ArgTypeError, "graph"),
    (lambda: hwjax.load(3), ArgTypeError, "path"),
    (lambda: hwjax.load("no/such/export/folder"), FormatError, "no/such/export/folder"),
    (lambda: _tflite().load("no/such/model.tflite"), FileError, "path_or_bytes"),
    (lambda: _tflite().load(os.path.dirname(__file__)), FileError, "path_or_bytes"),
    (lambda: _tflite().save(_tflite().load(_TFLITE), "no/such/folder/m.tflite"), FileError, "path"),
    (lambda: _tflite().batch_chunk("g"), ArgTypeError, "graph"),
    (lambda: hn.Pad("ab", target="tflite"), ArgTypeError, "paddings"),
    (lambda: hn.Pad(((1, -1),), target="tflite"), RangeError, "paddings"),
    (lambda: hn.Pad(((1, 1),), value=300, target="tflite"), RangeError, "Pad value"),
    (lambda: hn.Concat(-1, target="tflite"), RangeError, "Concat axis"),
    (lambda: hn.Concat(1, target="tflite")(), ShapeError, "Concat"),
    (lambda: hn.Mean("ab", target="tflite"), ArgTypeError, "axes"),
    (lambda: hn.Mean((2, 1), target="tflite"), RangeError, "axes"),
    (lambda: hn.Mean((1,), keep_dims="yes", target="tflite"), ArgTypeError, "keep_dims"),
    (lambda: hn.Mul(activation="tanh", target="tflite"), RangeError, "activation"),
    (lambda: hn.Softmax(beta="x", target="tflite"), ArgTypeError, "beta"),
    (lambda: hn.Softmax(beta=-1.0, target="tflite"), RangeError, "beta"),
]


def _tflite():
    import hwjax.tflite

    return hwjax.tflite


_TFLITE = os.path.join(os.path.dirname(__file__), "data", "tflm", "add.tflite")


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bad_argument_is_a_named_hwjax_error(i):
    call, kind, name = CASES[i]
    with pytest.raises(HwjaxError) as e:
        call()
    assert isinstance(e.value, kind), f"{type(e.value).__name__}: {e.value}"
    assert name in str(e.value), str(e.value)


def test_valid_alternative_forms_give_the_canonical_result():
    want = hn.act_qparams(np.array([-1.0, 2.0], F))
    got = hn.act_qparams([-1.0, 2.0])
    assert [float(v) for v in got] == [float(v) for v in want]
    np.testing.assert_array_equal(np.asarray(hn.as_float([1.0, 2.0])), [1.0, 2.0])
    np.testing.assert_array_equal(
        np.asarray(hn.weight_scales(np.ones((2, 3), F) * 127, 0)),
        np.asarray(hn.weight_scales(np.ones((2, 3), F) * 127, (0,))),
    )
    # an empty range (an uncalibrated layer) is allowed: scale 1
    assert float(hn.act_qparams(np.array([np.inf, -np.inf], F))[0]) == 1.0
    # an unknown op kind is also a KeyError, as registry lookups are
    with pytest.raises(KeyError):
        hg.get_op("nonsense")
    # a missing file is also the builtin FileNotFoundError
    with pytest.raises(FileNotFoundError):
        _tflite().load("no/such/model.tflite")
