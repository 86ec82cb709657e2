"""Fine-tuning ONNX models in ONNX Runtime's arithmetic (``hwjax.onnx.finetune``, the layers of
``hwjax.nn`` for the ONNX op kinds), checked against live ONNX Runtime.

* The untrained modules of quantize_static models (the small mobile-style CNN of
  ``tests/randonnx.py`` in the u8 settings, and random generator models) compute what
  ``Model.run`` computes, bit for bit, eagerly and jitted, on each CPU's arithmetic.
* A fine-tuned model, saved with ``hwjax.onnx.save``, is run by ONNX Runtime itself to the
  trained modules' outputs, bit for bit (and fine-tuning changed them).
* ``Quantize`` of a uint8 input rounds as ONNX Runtime's QuantizeLinear (ties to even before
  the zero point is added), checked against ONNX Runtime on every tie.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import hwjax.nn as hn
import hwjax.onnx as ho
from hwjax.errors import ArgTypeError, UnsupportedOpError
from tests import randonnx as R

U8_SETTINGS = [s for s in R.SETTINGS if s[1] == "uint8"]
#: the settings make test runs (the others in make test-full): QDQ u8s8, QOperator u8u8
FAST_SETTINGS = [R.SETTINGS[0], R.SETTINGS[5]]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int32) if a.dtype == np.float32 else a.astype(np.int64)


def _cnn(setting, seed: int = 1, n: int = 16):
    fm, shape = R.small_cnn()
    rng = np.random.default_rng(seed)
    data, scale = R.quantize(fm, shape, rng, setting)
    x = rng.normal(0, scale * 1.3, (n, *shape)).astype(np.float32)
    return data, x


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(
            s, id=f"{s[0]}-{s[1]}-{s[2]}-pc{int(s[3])}", marks=[] if s in FAST_SETTINGS else [pytest.mark.slow]
        )
        for s in U8_SETTINGS
    ],
)
def test_untrained_modules_compute_model_run(setting):
    data, x = _cnn(setting)
    m = ho.load(data)
    for runtime in ("onnxruntime", "onnxruntime-avx2"):
        tuned = m.trainable(runtime)
        expected = _bits(m.run(x, runtime=runtime))
        assert np.array_equal(_bits(ho.predict(tuned, x, batch_size=8)), expected), runtime  # jitted
        if runtime == "onnxruntime":  # eager: the layers' host-side paths
            assert np.array_equal(_bits(tuned(jnp.asarray(x))), expected)
    # written back unchanged: ONNX Runtime computes the same bits
    again = ho.save(m.with_weights(m.trainable()))
    assert np.array_equal(_bits(R.ort_run(again, x)), _bits(m.run(x)))


#: random generator models (seed, setting) that together hold every op kind with a layer
#: except the float groups (the model of ``R.float_groups_model``)
RANDOM = [(3, R.SETTINGS[3]), (7, R.SETTINGS[1]), (11, R.SETTINGS[5])]


def _random_models():
    yield from (R.model(seed, setting)[:2] for seed, setting in RANDOM)
    yield R.float_groups_model()


def test_untrained_random_models_compute_model_run():
    kinds = set()
    for data, x in _random_models():
        m = ho.load(data)
        kinds |= {n.op for n in m.graph.nodes}
        assert np.array_equal(_bits(ho.predict(m.trainable(), x)), _bits(m.run(x)))
    onnx_layers = {k for k, c in hn.HwLayer.LAYERS.items() if issubclass(c, hn.OnnxNode)}
    assert onnx_layers - kinds == {"onnx_concat"}  # (a float Concat: no generator makes one)


@pytest.mark.slow  # (make test: the CLI test below makes the same round trip)
def test_finetune_round_trip_through_onnxruntime():
    data, x = _cnn(R.SETTINGS[1], n=32)
    m = ho.load(data)
    y = np.arange(32) % 10
    r = ho.finetune(m, x, y, optimizer=optax.adam(1e-2), epochs=1, batch_size=16, progress=False)
    assert r.steps == 2 and len(r.losses) == 1
    mine = _bits(ho.predict(r.trainable, x))
    saved = ho.save(r.model)
    assert np.array_equal(_bits(R.ort_run(saved, x)), mine)  # ONNX Runtime runs the tuned file so
    assert np.array_equal(_bits(ho.load(saved).run(x)), mine)
    assert np.count_nonzero(mine != _bits(m.run(x))) > 0  # the weights did change


def test_gradients_reach_every_trainable_layer():
    data, x = _cnn(R.SETTINGS[0])
    tuned = ho.load(data).trainable()
    grads = nnx.grad(lambda t: jnp.sum(hn.as_float(t(jnp.asarray(x))) ** 2))(tuned)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert len(leaves) == 13  # kernel and bias of 5 QLinearConv and a QGemm; a MatMul's kernel
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) >= len(leaves) - 1


def _quantize_model(scale: float, zp: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.float32(scale), "s"),
        numpy_helper.from_array(np.uint8(zp), "z"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, ["N", 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("zp", [7, 8, 0, 255])
def test_quantize_layer_rounds_ties_as_onnxruntime(zp):
    """Every half step of a uint8 QuantizeLinear: the ``Quantize`` layer equals ONNX Runtime
    (rounding after adding an odd zero point would move half of them)."""
    data = _quantize_model(0.5, zp)
    x = (np.arange(-300, 340, 2.5, dtype=np.float32)[:256] * np.float32(0.5)).reshape(4, 64)
    expected = R.ort_run(data, x).astype(np.int64)
    m = ho.load(data)
    g = m.graph
    assert [n.op for n in g.nodes] == ["quantize"]
    assert np.array_equal(np.asarray(m.run(x)).astype(np.int64), expected)
    layer = hn.from_graph(g, m.target("onnxruntime"))
    q = layer(jnp.asarray(x))
    assert np.array_equal(np.asarray(q.q).astype(np.int64), expected)


def test_refusals_name_the_problem():
    data, _ = _cnn(R.SETTINGS[0])
    m = ho.load(data)
    with pytest.raises(ArgTypeError, match="GraphModel"):
        m.with_weights(object())
    with pytest.raises(ArgTypeError, match="hwjax.onnx.Model"):
        ho.trainable(object())
    with pytest.raises(UnsupportedOpError, match="matmul_integer"):
        ho.load(_matmul_integer_model()).trainable()


def _matmul_integer_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.int8).reshape(4, 3)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.float32(0.1), "s"),
        numpy_helper.from_array(np.uint8(3), "z"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.int8(0), "wz"),
    ]
    graph = helper.make_graph(
        nodes,
        "mi",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["N", 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_cli_finetune_onnx_end_to_end(tmp_path, capsys):
    from train.__main__ import main

    data, x = _cnn(R.SETTINGS[0], n=32)
    (tmp_path / "m.onnx").write_bytes(data)
    np.savez(tmp_path / "train.npz", x=x, y=np.arange(32) % 10)
    out = tmp_path / "tuned.onnx"
    argv = ["finetune", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "train.npz"), "--out", str(out)]
    main([*argv, "--batch-size", "16", "--lr", "0.01", "--runtimes", "onnxruntime,onnxruntime-sse", "--quiet"])
    text = capsys.readouterr().out
    assert "onnxruntime-sse" in text and "(exact)" in text, text
    assert np.array_equal(_bits(R.ort_run(out.read_bytes(), x)), _bits(ho.load(out).run(x)))


def _tuned_round_trip(data: bytes, x: np.ndarray, seed: int) -> tuple[int, int]:
    """Fine-tunes ``data`` two steps with a large learning rate (weights and biases move far,
    some to the ends of their ranges), saves it, and returns ``(values ONNX Runtime computes
    differently from the trained modules, values fine-tuning changed)``."""
    m = ho.load(data)
    y = np.random.default_rng(seed).integers(0, 4, len(x))
    loss = lambda out, yb: jnp.mean((out.reshape(len(out), -1)[:, 0] - yb) ** 2)
    r = ho.finetune(m, x, y, optimizer=optax.sgd(0.5), loss=loss, batch_size=len(x) // 2, progress=False)
    mine = _bits(ho.predict(r.trainable, x))
    return int(np.count_nonzero(_bits(R.ort_run(ho.save(r.model), x)) != mine)), int(
        np.count_nonzero(mine != _bits(m.run(x)))
    )


#: generator seeds whose models fine-tune (the others hold no quantised op, a float group hwjax
#: refuses, or MatMulInteger / ConvInteger, which have no layers)
STATIC_SEEDS = (0, 1, 2, 3, 5, 6, 7, 9, 11, 12, 13, 14, 15)
QOP_SEEDS = (1, 2, 3, 4, 5, 6, 7, 9, 14)


@pytest.mark.slow
@pytest.mark.parametrize("kind, seed", [("static", s) for s in STATIC_SEEDS] + [("qop", s) for s in QOP_SEEDS], ids=str)
def test_finetuned_random_models_round_trip(kind, seed):
    """The generator's models, fine-tuned two steps with a large step and saved: ONNX Runtime
    computes the trained modules' outputs, bit for bit."""
    data, x, desc = R.model(seed, R.SETTINGS[seed % 6]) if kind == "static" else R.qop_model(seed)
    differ, _ = _tuned_round_trip(data, x, seed)
    assert differ == 0, desc
