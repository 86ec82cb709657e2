"""Fine-tuning a loaded ``.tflite`` model (``hwjax.tflite.finetune``, ``Model.trainable``,
``Model.with_weights``) and ``hwjax finetune``.

Oracles: LiteRT itself runs the saved file (``hwjax.tflite.testing.run_litert``), and
``Model.run`` of the file loaded again, on each runtime, against the trained modules' own
output integers (``hwjax.tflite.predict``); the untrained modules against ``Model.run`` of the
original. The default run fine-tunes a four-node model on ``"reference"`` (and ``hwjax
finetune`` end to end, whose compiled programs the persistent cache shares); every runtime is
``slow``. The MLPerf Tiny models are fine-tuned in ``tests/test_finetune_mlperf.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import hwjax.tflite as tfl
from hwjax.errors import ArgTypeError, RangeError, ShapeError, UnsupportedOpError
from hwjax.tflite.testing import ModelBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLPERF = os.path.join(ROOT, "tests", "data", "mlperf")
IN_SHAPE, CLASSES = (8, 8, 2), 4


def small_model(seed: int = 0) -> bytes:
    """CONV_2D 3x3 SAME (6 channels, ReLU) -> DEPTHWISE_CONV_2D 3x3 SAME stride 2 (ReLU) ->
    RESHAPE -> FULLY_CONNECTED (4 outputs), random int8 weights."""
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    s_in, s_h, c = np.float32(0.02), np.float32(0.03), 6
    x = mb.tensor((1, *IN_SHAPE), "int8", s_in, 0, name="input")
    s_w = rng.uniform(0.004, 0.01, c).astype(np.float32)
    w = mb.tensor((c, 3, 3, 2), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 3, 3, 2)))
    b = mb.tensor((c,), "int32", s_in * s_w, np.zeros(c), rng.integers(-200, 200, c))
    h1 = mb.tensor((1, 8, 8, c), "int8", s_h, -128, name="conv")
    conv = {"padding": 0, "strideH": 1, "strideW": 1, "fusedActivationFunction": 1}
    mb.op("CONV_2D", [x, w, b], [h1], ("Conv2DOptions", conv), 3)
    s_w1 = rng.uniform(0.01, 0.03, c).astype(np.float32)
    w1 = mb.tensor((1, 3, 3, c), "int8", s_w1, np.zeros(c), rng.integers(-127, 128, (1, 3, 3, c)), axis=3)
    b1 = mb.tensor((c,), "int32", s_h * s_w1, np.zeros(c), rng.integers(-200, 200, c))
    h2 = mb.tensor((1, 4, 4, c), "int8", s_h, -128, name="depthwise")
    dw = {"padding": 0, "strideH": 2, "strideW": 2, "depthMultiplier": 1, "fusedActivationFunction": 1}
    mb.op("DEPTHWISE_CONV_2D", [h1, w1, b1], [h2], ("DepthwiseConv2DOptions", dw), 3)
    n = 16 * c
    h3 = mb.tensor((1, n), "int8", s_h, -128, name="flat")
    shape = mb.tensor((2,), "int32", data=np.array([1, n], np.int32), name="flat_shape")
    mb.op("RESHAPE", [h2, shape], [h3], ("ReshapeOptions", {"newShape": [1, n]}))
    s_w2 = np.float32([0.004])
    w2 = mb.tensor((CLASSES, n), "int8", s_w2, np.zeros(1), rng.integers(-127, 128, (CLASSES, n)))
    b2 = mb.tensor((CLASSES,), "int32", s_h * s_w2, np.zeros(1), rng.integers(-500, 500, CLASSES))
    y = mb.tensor((1, CLASSES), "int8", np.float32(0.1), 0, name="logits")
    mb.op("FULLY_CONNECTED", [h3, w2, b2], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 0}))
    return mb.finish([x], [y])


def data(n: int = 32, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, (n, *IN_SHAPE)).astype(np.int8), rng.integers(0, CLASSES, n)


def kernels(model: tfl.Model) -> list[np.ndarray]:
    return [np.asarray(n.params["kernel"]) for n in model.graph.nodes if n.params is not None and "kernel" in n.params]


def check_tuned(model: tfl.Model, r: tfl.FinetuneResult, x, runtime: str) -> bytes:
    """The tuned model saved, then: the file loaded again computes on ``runtime`` exactly the
    trained modules' integers, and (LiteRT runtimes) LiteRT runs the file so too."""
    saved = tfl.save(r.model)
    mine = tfl.predict(r.trainable, x)
    assert mine.dtype == np.int8 and mine.shape[0] == len(x)
    np.testing.assert_array_equal(np.asarray(tfl.load(saved).run(x, runtime=runtime)), mine)
    if runtime in ("reference", "optimized", "xnnpack"):
        pytest.importorskip("ai_edge_litert")
        from hwjax.tflite.testing import run_litert

        np.testing.assert_array_equal(run_litert(saved, x, runtime), mine)
    assert any(not np.array_equal(a, b) for a, b in zip(kernels(model), kernels(r.model))), "no weight changed"
    return saved


def test_finetune_on_reference_writes_what_litert_runs():
    model = tfl.load(small_model())
    x, y = data()
    start = model.trainable("reference")
    assert isinstance(start, tfl.Trainable) and start.int_input
    np.testing.assert_array_equal(tfl.predict(start, x), np.asarray(model.run(x)))  # untrained == the file
    r = tfl.finetune(model, x, y, runtime="reference", epochs=2, batch_size=16, progress=False)
    assert r.steps == 4 and len(r.losses) == 2 and len(r.val_accuracy) == 2
    assert r.accuracy_before is not None and r.accuracy_after == r.val_accuracy[-1]
    check_tuned(model, r, x, "reference")
    # with_weights is the method form, and keeps the file's tensors and metadata
    again = model.with_weights(r.trainable)
    assert set(again.graph.tensors) == set(model.graph.tensors) and again.metadata == model.metadata


def test_bad_arguments_name_the_argument():
    model = tfl.load(small_model())
    x, y = data(8)
    cases = [
        (dict(runtime="tpu"), RangeError, "runtime"),
        (dict(epochs=0), RangeError, "epochs"),
        (dict(batch_size=-1), RangeError, "batch_size"),
        (dict(optimizer="adam"), ArgTypeError, "optimizer"),
        (dict(loss=3), ArgTypeError, "loss"),
        (dict(validation=x), ArgTypeError, "validation"),
    ]
    for kwargs, exc, word in cases:
        with pytest.raises(exc, match=word):
            tfl.finetune(model, x, y, progress=False, **kwargs)
    with pytest.raises(ShapeError, match="x must have shape"):
        tfl.finetune(model, x[:, :4], y)
    with pytest.raises(RangeError, match="int8"):
        tfl.finetune(model, x.astype(np.int32) * 2, y)
    with pytest.raises(ShapeError, match="y must have 8 rows"):
        tfl.finetune(model, x, y[:5])
    with pytest.raises(ArgTypeError, match="model"):
        tfl.finetune(small_model(), x, y)
    with pytest.raises(ArgTypeError, match="tuned"):
        model.with_weights(object())
    with pytest.raises(UnsupportedOpError, match="xformer"):
        tfl.load(os.path.join(MLPERF, "kws_ref_model.xc.tflite")).trainable("xs3")


def _hwjax(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "train", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=900
    )


def test_cli_finetune_end_to_end(tmp_path):
    model = small_model()
    (tmp_path / "m.tflite").write_bytes(model)
    x, y = data()
    xv, yv = data(16, seed=2)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "val.npz", x=xv, y=yv)
    out = tmp_path / "tuned.tflite"
    p = _hwjax(
        "finetune", str(tmp_path / "m.tflite"), "--data", str(tmp_path / "train.npz"), "--validation",
        str(tmp_path / "val.npz"), "--runtime", "reference", "--epochs", "2", "--batch-size", "16",
        "--out", str(out), "--runtimes", "reference,tflm",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "fine-tuning" in p.stderr  # the progress bar
    assert "4 steps of 16 examples" in p.stdout
    rows = dict(re.findall(r"^(reference|tflm)\s+(\d\.\d{4}\s+\d\.\d{4})$", p.stdout, re.M))
    assert set(rows) == {"reference", "tflm"}, p.stdout
    assert re.search(r"reload check: .* 0 of 64 output values differ .* \(exact\)", p.stdout), p.stdout
    # the accuracies printed are those of the files as LiteRT / hwjax run them
    pytest.importorskip("ai_edge_litert")
    from hwjax.tflite.testing import run_litert

    for name, data_ in (("original", model), ("tuned", out.read_bytes())):
        acc = np.mean(run_litert(data_, xv, "reference").argmax(axis=1) == yv)
        col = 0 if name == "original" else 1
        assert rows["reference"].split()[col] == f"{acc:.4f}"
    tuned = tfl.load(str(out))
    acc_tflm = np.mean(np.asarray(tuned.run(xv, runtime="tflm")).argmax(axis=1) == yv)
    assert rows["tflm"].split()[1] == f"{acc_tflm:.4f}"


def _main_error(argv, capsys) -> str:
    from train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err


def test_cli_finetune_bad_arguments_name_the_option(tmp_path, capsys):
    m = tmp_path / "m.tflite"
    m.write_bytes(small_model())
    x, y = data(8)
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    np.savez(tmp_path / "noy.npz", x=x)
    np.savez(tmp_path / "badlabel.npz", x=x, y=y + CLASSES)
    np.savez(tmp_path / "shape.npz", x=x[:, :3], y=y)
    base = ["finetune", str(m), "--out", str(tmp_path / "o.tflite")]
    ok = ["--data", str(tmp_path / "ok.npz")]
    for extra, word in [
        (["--data", str(tmp_path / "nope.npz")], "--data"),
        (["--data", str(tmp_path / "noy.npz")], "--data"),
        (["--data", str(tmp_path / "badlabel.npz")], "--data"),
        (ok + ["--validation", str(tmp_path / "shape.npz")], "--validation"),
        (ok + ["--epochs", "0"], "--epochs"),
        (ok + ["--batch-size", "x"], "--batch-size"),
        (ok + ["--lr", "-1"], "--lr"),
        (ok + ["--runtime", "tpu"], "--runtime"),
        (ok + ["--runtimes", "reference,tpu"], "--runtimes"),
    ]:
        assert word in _main_error(base + extra, capsys), extra
    err = _main_error(["finetune", str(m), *ok, "--out", str(tmp_path / "no" / "o.tflite")], capsys)
    assert "--out" in err


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["optimized", "xnnpack", "tflm", "xs3"])
def test_finetune_small_model_on_every_runtime(runtime):
    model = tfl.load(small_model())
    x, y = data()
    np.testing.assert_array_equal(tfl.predict(model.trainable(runtime), x), np.asarray(model.run(x, runtime=runtime)))
    r = tfl.finetune(model, x, y, runtime=runtime, epochs=1, batch_size=16, progress=False)
    check_tuned(model, r, x, runtime)


def test_tflm_per_channel_fully_connected_modules_equal_the_runtime():
    """On ``"tflm"`` a per-channel FULLY_CONNECTED applies each channel's scale (current TFLM):
    the untrained modules compute what ``Model.run(runtime="tflm")`` does."""
    from hwjax.tflite import testing as T

    rng = np.random.default_rng(3)
    data_, _ = T.linear_model(rng, "FULLY_CONNECTED", in_shape=(21,), out_ch=7, per_channel=True)
    model = tfl.load(data_)
    assert np.shape(model.graph.nodes[0].params["w_scale"]) == (7,)
    x = rng.integers(-128, 128, (16, 21)).astype(np.int8)
    np.testing.assert_array_equal(tfl.predict(model.trainable("tflm"), x), np.asarray(model.run(x, runtime="tflm")))


def test_default_losses():
    """After a SOFTMAX the loss is -log(p + 1/512): finite with a gradient (-512 per example)
    where the label's quantised probability is 0; otherwise softmax cross-entropy."""
    import jax
    import jax.numpy as jnp

    from hwjax.tflite._finetune import P_MIN, cross_entropy, default_loss, nll

    p, label = jnp.array([[0.0, 1.0]]), jnp.array([0])
    assert float(nll(p, label)) == float(-np.log(np.float32(P_MIN)))
    assert np.asarray(jax.grad(nll)(p, label)).tolist() == [[-512.0, 0.0]]
    assert default_loss(tfl.load(os.path.join(MLPERF, "kws_ref_model.tflite"))) is nll
    assert default_loss(tfl.load(small_model())) is cross_entropy
