"""Fine-tune an int8 ``.tflite`` model in a runtime's exact arithmetic and write it back:
``python examples/finetune_tflite.py [MODEL.tflite] [--runtime xs3] [--epochs 3] [--out tuned.tflite]``
(default: a small Keras CNN of tests/data/keras, on random int8 inputs and labels). The saved
file, run by hwjax and (LiteRT runtimes) by LiteRT itself, must equal the trained modules."""

import argparse
import os

import numpy as np
import optax

import hwjax.tflite as tfl

p = argparse.ArgumentParser()
p.add_argument(
    "model", nargs="?", default=os.path.join(os.path.dirname(__file__), "../tests/data/keras/cnn_branches.tflite")
)
p.add_argument("--runtime", default="reference", choices=tfl.MODEL_RUNTIMES)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--out", default="tuned.tflite")
args = p.parse_args()

model = tfl.load(args.model)
rng = np.random.default_rng(0)
x = rng.integers(-128, 128, (64, *model.inputs[0].shape[1:])).astype(np.int8)
y = rng.integers(0, model.outputs[0].shape[-1], len(x))

r = tfl.finetune(model, x, y, runtime=args.runtime, optimizer=optax.adam(3e-3), epochs=args.epochs, batch_size=16)
tfl.save(r.model, args.out)
print(f"loss per epoch {np.round(r.losses, 4)}; accuracy {r.accuracy_before:.3f} -> {r.accuracy_after:.3f}")

mine = tfl.predict(r.trainable, x)  # the trained modules' int8 outputs
checks = {"hwjax, reloaded": tfl.load(args.out).run(x, runtime=args.runtime)}
if args.runtime in ("reference", "optimized", "xnnpack"):  # LiteRT itself on the saved file
    from hwjax.tflite.testing import run_litert

    checks["LiteRT"] = run_litert(open(args.out, "rb").read(), x, args.runtime)
for name, out in checks.items():
    print(f"{name} ({args.runtime}): {int(np.sum(out != mine))} outputs differ from the trained modules'")
raise SystemExit(0 if all(np.array_equal(out, mine) for out in checks.values()) else 1)
