"""A converter-made digits classifier for ``python -m train deployed``:
tests/data/keras/digits_cnn.{tflite,npz}.

Re-run from the repository root (TensorFlow 2.21.0, tensorflow-cpu wheel, Keras 3; the same
venv as scripts/keras_testdata.py, with scikit-learn):

    python3 -m venv .venv-tf && .venv-tf/bin/pip install tensorflow-cpu==2.21.0 scikit-learn
    .venv-tf/bin/python scripts/keras_digits.py build     # train + convert -> digits_cnn.tflite
    .venv/bin/python scripts/keras_digits.py outputs      # held-out inputs + LiteRT outputs -> digits_cnn.npz

``build`` trains a small Keras CNN (3x3 conv, 8 channels, ReLU; 3x3 conv stride 2, 16
channels, ReLU; dense 10, softmax) on scikit-learn's bundled 8x8 digits, pixels scaled to
[0, 1], on the training part of the split ``python -m train digits`` uses (20% held out,
stratified, ``random_state=0``), with fixed seeds, and converts it with
``tf.lite.TFLiteConverter.from_keras_model`` to a full-integer int8 model (optimizations
DEFAULT, 128 training images as the representative dataset, TFLITE_BUILTINS_INT8, int8 input
and output). ``outputs`` (the main venv) writes the 360 held-out images quantised with the
file's input scale and zero point (``x``, round half to even, clipped), their labels (``y``)
and LiteRT's outputs under each resolver (``y_reference``, ``y_optimized``, ``y_xnnpack``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "keras"
NAME = "digits_cnn"
SEED = 20260101
EPOCHS, N_REP = 12, 128


def split():
    """``(x_train, y_train, x_test, y_test)``: the digits split of ``train/_data.py`` (float32
    images (N, 8, 8, 1) in [0, 1])."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, d.target.astype(np.int32), test_size=0.2, random_state=0, stratify=d.target
    )
    return x_tr, y_tr, x_te, y_te


def build():
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(SEED)
    L = keras.layers
    inp = keras.Input((8, 8, 1))
    x = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    x = L.Flatten()(x)
    model = keras.Model(inp, L.Dense(10, activation="softmax")(x))
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x_tr, y_tr, x_te, y_te = split()
    hist = model.fit(x_tr, y_tr, batch_size=32, epochs=EPOCHS, verbose=0, shuffle=True)
    _, acc = model.evaluate(x_te, y_te, verbose=0)
    rep = x_tr[:N_REP]

    def representative():
        for i in range(N_REP):
            yield [rep[i : i + 1]]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    data = conv.convert()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{NAME}.tflite").write_bytes(data)
    print(
        f"{NAME}: loss {hist.history['loss'][0]:.3f} -> {hist.history['loss'][-1]:.3f}, float held-out accuracy "
        f"{acc:.4f}, {len(data)} bytes, TF {tf.__version__}"
    )


def outputs():
    from ai_edge_litert.interpreter import Interpreter

    from hwjax.tflite.testing import run_litert

    data = (OUT / f"{NAME}.tflite").read_bytes()
    d = Interpreter(model_content=data).get_input_details()[0]
    (scale,), (zp,) = d["quantization_parameters"]["scales"], d["quantization_parameters"]["zero_points"]
    _, _, x_te, y_te = split()
    x = np.clip(np.round(x_te / scale) + zp, -128, 127).astype(np.int8)
    ys = {f"y_{rt}": run_litert(data, x, rt) for rt in ("reference", "optimized", "xnnpack")}
    np.savez_compressed(OUT / f"{NAME}.npz", x=x, y=y_te.astype(np.int32), **ys)
    for k, v in ys.items():
        print(f"{NAME} {k}: held-out accuracy {np.mean(v.argmax(axis=1) == y_te):.4f}")


if __name__ == "__main__":
    step = sys.argv[1] if len(sys.argv) > 1 else ""
    if step not in ("build", "outputs"):
        sys.exit(__doc__)
    build() if step == "build" else outputs()
