"""ONNX models fine-tuned in the arithmetic of an older CPU, for tests/test_onnx_cpus.py.

Run natively from the repository root (needs hwjax, onnx and onnxruntime):

    .venv/bin/python scripts/onnx_tuned_models.py

For the small CNN of tests/randonnx.py quantised by quantize_static (u8s8 QDQ per-tensor and
per-channel, QOperator u8s8), fine-tunes each on ``onnxruntime-avx2`` and on
``onnxruntime-sse`` (``hwjax.onnx.finetune``, four epochs of Adam at 0.03 on 64 examples),
saves it (``hwjax.onnx.save``) and writes ``tests/data/onnx/tuned_models.npz``: per case the
tuned file, 16 inputs and the trained modules' outputs on them (``hwjax.onnx.predict``).
``scripts/onnx_cpu_outputs.py haswell_tuned`` / ``nehalem_tuned``, run under
``qemu-x86_64 -cpu Haswell`` / ``-cpu Nehalem``, then store what ONNX Runtime computes for the
files tuned for that CPU.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import optax

import hwjax.onnx as ho
from tests import randonnx as R

SETTINGS = (R.SETTINGS[0], R.SETTINGS[1], R.SETTINGS[3])
RUNTIMES = ("onnxruntime-avx2", "onnxruntime-sse")


def main() -> None:
    fm, shape = R.small_cnn()
    out = {}
    for i, setting in enumerate(SETTINGS):
        rng = np.random.default_rng(1)
        data, scale = R.quantize(fm, shape, rng, setting)
        x = rng.normal(0, scale * 1.3, (64, *shape)).astype(np.float32)
        y = np.arange(64) % 10
        m = ho.load(data)
        for rt in RUNTIMES:
            r = ho.finetune(m, x, y, runtime=rt, optimizer=optax.adam(3e-2), epochs=4, batch_size=16, progress=False)
            case = f"cnn{i}-{rt}"
            out[f"{case}/model"] = np.frombuffer(ho.save(r.model), np.uint8)
            out[f"{case}/x"] = x[:16]
            out[f"{case}/trained"] = ho.predict(r.trainable, x[:16])
            print(case, setting, "losses", [round(v, 4) for v in r.losses], flush=True)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "onnx", "tuned_models.npz")
    np.savez_compressed(path, **out)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
