"""Real converter output for the hwjax.tflite tests: tests/data/keras/<name>.{tflite,npz}.

Re-run from the repository root (TensorFlow 2.21.0, tensorflow-cpu wheel, Keras 3):

    python3 -m venv .venv-tf && .venv-tf/bin/pip install tensorflow-cpu==2.21.0
    .venv-tf/bin/python scripts/keras_testdata.py build     # train + convert -> <name>.tflite
    .venv/bin/python scripts/keras_testdata.py outputs      # inputs + LiteRT outputs -> <name>.npz

``build`` (TensorFlow venv) trains three small Keras models for a few seconds on
synthetic numpy data, with fixed seeds, and converts each with
``tf.lite.TFLiteConverter.from_keras_model`` to a full-integer int8 model
(optimizations DEFAULT, a representative dataset, TFLITE_BUILTINS_INT8, int8 input and
output). ``outputs`` (the main venv, the ai-edge-litert the tests use) writes 16 int8
inputs per model (quantised held-out samples, the two int8 extremes, uniform noise) and
the outputs of LiteRT under each resolver (``hwjax.tflite.testing.run_litert``):
``reference`` (BUILTIN_REF), ``optimized`` (BUILTIN_WITHOUT_DEFAULT_DELEGATES),
``xnnpack`` (AUTO). The data generators below are numpy-only so both steps share them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "keras"
SEED = 20251125
N_TRAIN, N_REP, N_INPUTS = 512, 64, 16
IMG = (16, 16, 3)
FEATURES = 20
CLASSES = 10


# --------------------------------------------------------------------- synthetic data
def images(n: int, rng: np.random.Generator):
    """16x16x3 images, 10 classes: a tinted bright square in one cell of a 3x3 grid
    (classes 0-8) or none (class 9), over noise."""
    y = rng.integers(0, CLASSES, n)
    x = rng.normal(0.0, 0.3, (n, *IMG)).astype(np.float32)
    tints = np.array([[1.0, 0.2, 0.2], [0.2, 1.0, 0.2], [0.2, 0.2, 1.0], [1.0, 1.0, 0.2]], np.float32)
    for i, k in enumerate(y):
        if k < 9:
            r0, c0 = (k // 3) * 5 + rng.integers(0, 2), (k % 3) * 5 + rng.integers(0, 2)
            x[i, r0 : r0 + 4, c0 : c0 + 4, :] += 1.5 * tints[k % 4]
    return x, y


def features(n: int, rng: np.random.Generator):
    """20 features, 10 independent binary labels (signs of fixed linear forms)."""
    proj = np.random.default_rng(SEED + 7).normal(size=(FEATURES, CLASSES)).astype(np.float32)
    x = rng.normal(0.0, 1.0, (n, FEATURES)).astype(np.float32)
    return x, (x @ proj > 0).astype(np.float32)


DATA = {"mobilenet_v2_tiny": images, "cnn_branches": images, "mlp_sigmoid": features}


# --------------------------------------------------------------------- Keras models (TF venv)
def _mobilenet_v2_tiny(keras):
    # BatchNormalization (folded into the convolutions by the converter) with momentum 0.9:
    # its moving statistics settle within the few training steps
    L = keras.layers

    def conv_bn(x, ch, k=1, stride=1, relu6=True):
        x = L.Conv2D(ch, k, strides=stride, padding="same", use_bias=False)(x)
        x = L.BatchNormalization(momentum=0.9)(x)
        return L.ReLU(6.0)(x) if relu6 else x

    def inverted_residual(x, out_ch, expand, stride):
        in_ch = x.shape[-1]
        h = conv_bn(x, in_ch * expand)  # 1x1 expand
        if stride == 2:  # explicit symmetric zero padding, VALID depthwise (not SAME's: stays a PAD op)
            h = L.ZeroPadding2D(1)(h)
        h = L.DepthwiseConv2D(3, strides=stride, padding="same" if stride == 1 else "valid", use_bias=False)(h)
        h = L.ReLU(6.0)(L.BatchNormalization(momentum=0.9)(h))  # depthwise 3x3
        h = conv_bn(h, out_ch, relu6=False)  # 1x1 linear project
        return L.Add()([x, h]) if stride == 1 and in_ch == out_ch else h

    x = inp = keras.Input(IMG)
    x = conv_bn(x, 8, 3, 2)  # stem: 8x8x8
    x = inverted_residual(x, 8, 3, 1)
    x = inverted_residual(x, 16, 3, 2)  # 4x4x16
    x = inverted_residual(x, 16, 3, 1)
    x = conv_bn(x, 32)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(CLASSES, activation="softmax")(x)), "sparse_categorical_crossentropy"


def _cnn_branches(keras):
    L = keras.layers
    x = inp = keras.Input(IMG)
    x = L.Conv2D(8, 3, padding="same", activation="tanh")(x)
    a = L.MaxPooling2D(2)(x)  # 8x8x8
    a = L.Conv2D(6, 3, padding="same", activation="relu")(a)
    b = L.AveragePooling2D(2)(x)  # 8x8x8
    b = L.Conv2D(6, 1, activation="sigmoid")(b)
    x = L.Concatenate()([a, L.Multiply()([a, b])])  # 8x8x12: a and a gated by b
    x = L.Conv2D(8, 3, strides=2, padding="valid", activation="tanh")(x)  # 3x3x8
    x = L.AveragePooling2D(2, strides=1, padding="valid")(x)  # 2x2x8
    x = L.Flatten()(x)
    return keras.Model(inp, L.Dense(CLASSES)(x)), "sparse_categorical_crossentropy_logits"


def _mlp_sigmoid(keras):
    L = keras.layers
    x = inp = keras.Input((FEATURES,))
    x = L.Dense(32, activation="sigmoid")(x)
    x = L.Dense(16, activation="sigmoid")(x)
    return keras.Model(inp, L.Dense(CLASSES, activation="sigmoid")(x)), "binary_crossentropy"


# brief training: weights move away from their initialisation, outputs not yet saturated
LR = {"mobilenet_v2_tiny": 3e-3, "cnn_branches": 3e-3, "mlp_sigmoid": 1e-2}
MODELS = {"mobilenet_v2_tiny": _mobilenet_v2_tiny, "cnn_branches": _cnn_branches, "mlp_sigmoid": _mlp_sigmoid}


def build():
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for k, (name, make) in enumerate(MODELS.items()):
        keras.utils.set_random_seed(SEED + k)
        model, loss = make(keras)
        if loss.endswith("_logits"):
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(LR[name]), loss=loss)
        x, y = DATA[name](N_TRAIN, np.random.default_rng(SEED + k))
        hist = model.fit(x, y, batch_size=32, epochs=4, verbose=0, shuffle=True)
        rep = x[:N_REP]

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
        (OUT / f"{name}.tflite").write_bytes(data)
        print(
            f"{name}: loss {hist.history['loss'][0]:.3f} -> {hist.history['loss'][-1]:.3f}, "
            f"{len(data)} bytes, TF {tf.__version__}"
        )


# --------------------------------------------------------------------- LiteRT outputs (main venv)
def outputs():
    from ai_edge_litert.interpreter import Interpreter

    from hwjax.tflite.testing import run_litert

    for k, name in enumerate(MODELS):
        data = (OUT / f"{name}.tflite").read_bytes()
        it = Interpreter(model_content=data)
        d = it.get_input_details()[0]
        (scale,), (zp,) = d["quantization_parameters"]["scales"], d["quantization_parameters"]["zero_points"]
        rng = np.random.default_rng(SEED + 100 + k)
        xf, _ = DATA[name](N_INPUTS - 4, rng)
        x = np.clip(np.round(xf / scale) + zp, -128, 127).astype(np.int8)
        extremes = np.stack([np.full(x.shape[1:], -128, np.int8), np.full(x.shape[1:], 127, np.int8)])
        noise = rng.integers(-128, 128, (2, *x.shape[1:])).astype(np.int8)
        x = np.concatenate([x, extremes, noise])
        assert x.shape[0] == N_INPUTS and tuple(d["shape"][1:]) == x.shape[1:]
        ys = {rt: run_litert(data, x, rt) for rt in ("reference", "optimized", "xnnpack")}
        np.savez_compressed(OUT / f"{name}.npz", x=x, **ys)
        diff = {
            f"{a}/{b}": int((ys[a] != ys[b]).sum())
            for a, b in (("reference", "optimized"), ("reference", "xnnpack"), ("optimized", "xnnpack"))
        }
        print(f"{name}: x {x.shape}, y {ys['reference'].shape} {ys['reference'].dtype}, differing outputs {diff}")


if __name__ == "__main__":
    step = sys.argv[1] if len(sys.argv) > 1 else ""
    if step not in ("build", "outputs"):
        sys.exit(__doc__)
    build() if step == "build" else outputs()
