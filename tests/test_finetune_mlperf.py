"""The six MLPerf Tiny models fine-tuned through ``hwjax.tflite.finetune`` on every runtime,
written back with ``hwjax.tflite.save`` and loaded again (``slow``: ``make test-full``).

Per model and runtime:

* the untrained modules (``Model.trainable(runtime)``) compute the stored outputs of the real
  runtime (``y_<runtime>`` in ``tests/data/mlperf/<name>.npz``: LiteRT 2.3.0, the
  ``tflite-micro`` package, and for ``"xs3"`` the xcore host interpreter on xformer's file);
* two optax steps (``finetune``, batches of 4 of the 8 stored inputs) change the weights;
* the saved file, loaded again, computes on that runtime exactly the trained modules' integers
  (``hwjax.tflite.predict``), and on the LiteRT runtimes LiteRT itself runs the saved file so.

The classifiers are fitted to random labels with the default loss (the negative log-likelihood
after their SOFTMAX); the anomaly-detection autoencoder to its own input (mean squared
reconstruction error). An xformer-converted file (``*.xc.tflite``) loads and runs on ``"xs3"`` but
has no trainable layers (``hwjax.nn`` has none for its XC operators): its case is a strict
``xfail`` raising ``UnsupportedOpError``, and the refusal names the route (fine-tune the original
on ``"xs3"``, then convert).

``python tests/test_finetune_mlperf.py`` prints the table of losses and seconds.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import hwjax.tflite as tfl
from hwjax.errors import UnsupportedOpError

MLPERF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mlperf")
MODELS = [
    "ad01_int8",
    "kws_ref_model",
    "pretrainedResnet_quant",
    "pretrainedResnet_large_int8",
    "str_ww_ref_model",
    "vww_96_int8",
]
RUNTIMES = ["reference", "optimized", "xnnpack", "tflm", "xs3"]
LITERT = ("reference", "optimized", "xnnpack")
EPOCHS, BATCH = 1, 4  # 8 stored examples: 2 steps


def _dequantize(model: tfl.Model, q) -> np.ndarray:
    t = model.graph.tensors[model.graph.outputs[0]]
    scale = np.float32(np.asarray(t.quant.scale).reshape(-1)[0])
    zero = np.int32(np.asarray(t.quant.zero_point).reshape(-1)[0])
    return (np.asarray(q, np.int32) - zero).astype(np.float32) * scale


def _task(name: str, model: tfl.Model, x: np.ndarray):
    """``(y, loss)``: the autoencoder reconstructs its input; the classifiers fit random labels."""
    if name == "ad01_int8":
        q = model.graph.tensors[model.graph.inputs[0]].quant
        scale = np.float32(np.asarray(q.scale).reshape(-1)[0])
        zero = np.int32(np.asarray(q.zero_point).reshape(-1)[0])
        y = (x.astype(np.int32) - zero).astype(np.float32) * scale

        def mse(outputs, target):
            return ((outputs - target) ** 2).mean()

        return y, mse
    classes = int(np.prod(model.outputs[0].shape[1:]))
    return np.random.default_rng(0).integers(0, classes, len(x)), tfl.default_loss(model)


def finetune_and_reload(name: str, runtime: str, tmp_dir: str, *, xformed: bool = False) -> dict:
    """Runs the checks of this module for one model and runtime (``xformed``: xformer's file
    ``<name>.xc.tflite`` on ``"xs3"``); returns the losses (before and after, on the 8 stored
    examples, in the runtime's integers) and the seconds taken."""
    t0 = time.perf_counter()
    model = tfl.load(os.path.join(MLPERF, f"{name}{'.xc' if xformed else ''}.tflite"))
    z = np.load(os.path.join(MLPERF, f"{name}.npz"))
    x = z["x"]
    y, loss = _task(name, model, x)

    start = tfl.predict(model.trainable(runtime), x)
    np.testing.assert_array_equal(start, z[f"y_{runtime}"])  # the real runtime's outputs

    r = tfl.finetune(model, x, y, runtime=runtime, loss=loss, epochs=EPOCHS, batch_size=BATCH, progress=False)
    assert r.steps == EPOCHS * len(x) // BATCH
    tuned = tfl.predict(r.trainable, x)
    path = os.path.join(tmp_dir, f"{name}.{runtime}.tflite")
    tfl.save(r.model, path)
    reloaded = tfl.load(path)
    np.testing.assert_array_equal(np.asarray(reloaded.run(x, runtime=runtime)), tuned)
    if runtime in LITERT:
        pytest.importorskip("ai_edge_litert")
        from hwjax.tflite.testing import run_litert

        with open(path, "rb") as f:
            np.testing.assert_array_equal(run_litert(f.read(), x, runtime), tuned)
    changed = sum(
        not np.array_equal(a.params["kernel"], b.params["kernel"])
        for a, b in zip(model.graph.nodes, reloaded.graph.nodes)
        if a.params is not None and "kernel" in a.params
    )
    assert changed > 0, "no kernel changed"
    return {
        "loss_before": float(loss(_dequantize(model, start), y)),
        "loss_after": float(loss(_dequantize(model, tuned), y)),
        "outputs_changed": int(np.sum(start != tuned)),
        "kernels_changed": changed,
        "seconds": time.perf_counter() - t0,
    }


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", MODELS)
def test_mlperf_finetune_save_reload(name, runtime, tmp_path):
    finetune_and_reload(name, runtime, str(tmp_path))


XFORMED_REASON = (
    "an xformer-converted file has only XC operators, which hwjax.nn has no layers for: "
    "Model.trainable raises UnsupportedOpError (fine-tune the original with runtime='xs3')"
)


@pytest.mark.slow
@pytest.mark.xfail(raises=UnsupportedOpError, strict=True, reason=XFORMED_REASON)
@pytest.mark.parametrize("name", MODELS)
def test_mlperf_xformed_file_finetune_save_reload_on_xs3(name, tmp_path):
    finetune_and_reload(name, "xs3", str(tmp_path), xformed=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_mlperf_xformer_files_are_refused_naming_the_route(name):
    model = tfl.load(os.path.join(MLPERF, f"{name}.xc.tflite"))
    with pytest.raises(UnsupportedOpError, match="fine-tune the original model with runtime='xs3'"):
        model.trainable("xs3")


if __name__ == "__main__":
    import sys
    import tempfile

    names = sys.argv[1:] or MODELS
    print(f"{'model':28} {'runtime':10} {'loss before':>12} {'loss after':>11} {'outputs changed':>16} {'s':>6}")
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            for runtime in RUNTIMES:
                try:
                    m = finetune_and_reload(name, runtime, d)
                    print(
                        f"{name:28} {runtime:10} {m['loss_before']:12.4f} {m['loss_after']:11.4f} "
                        f"{m['outputs_changed']:16d} {m['seconds']:6.1f}",
                        flush=True,
                    )
                except Exception as e:  # the table reports every failure and goes on
                    print(f"{name:28} {runtime:10} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
