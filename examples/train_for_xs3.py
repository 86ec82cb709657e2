"""Train a small MLP for the XS3 with optax, its forward pass the chip's integer pipeline.

Float training, calibration, post-training quantisation (PTQ), hardware-aware
fine-tuning, bit-exact evaluation, export and reload, using only the public API.
Run: ``python examples/train_for_xs3.py`` (about a minute on a 2-core CPU).
"""

import tempfile

import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import hwjax
import hwjax.nn as hn
from hwjax.targets import XS3

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int32)
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]

target = XS3(variant="hardware")
rngs = nnx.Rngs(0)
model = hn.Sequential(
    {
        "input": hn.Quantize(target=target),
        "hidden": hn.Dense(64, 32, activation="relu", target=target, rngs=rngs),
        "logits": hn.Dense(32, 10, target=target, rngs=rngs),
    }
)


def train(model, epochs: int, lr: float) -> None:
    optimizer = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, xb, yb):
        def loss_fn(model):
            logits = hn.as_float(model(xb))  # hardware mode: dequantised int8 logits
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)  # surrogate gradients in hardware mode
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(0)
    for _ in range(epochs):
        for idx in rng.permutation(len(x_train)).reshape(-1, 50):
            step(model, optimizer, x_train[idx], y_train[idx])


def accuracy(model) -> float:
    return hwjax.evaluate(model, (x_test, y_test), batch_size=128).accuracy


train(model, epochs=30, lr=3e-3)  # 1. the float baseline
float_acc = accuracy(model)

hn.set_mode(model, "calibrate")  # 2. record activation ranges
model(x_train)
hn.set_mode(model, "hardware")  # 3. from here on the forward pass is XS3 integer arithmetic
ptq_acc = accuracy(model)

train(model, epochs=5, lr=3e-4)  # 4. hardware-aware fine-tuning
hat_acc = accuracy(model)

with tempfile.TemporaryDirectory() as folder:  # 5. export in the chip's formats, reload
    hwjax.export(model, folder, input_shape=(64,))
    loaded = hwjax.load(folder)
    same = np.array_equal(hwjax.evaluate(loaded, x_test).outputs, hwjax.evaluate(model, x_test).outputs)

print(f"float {float_acc:.2%}  PTQ {ptq_acc:.2%}  hardware-aware {hat_acc:.2%}  exported model bit-identical: {same}")
assert same
