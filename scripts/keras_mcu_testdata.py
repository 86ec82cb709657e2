"""Oracle data for the microcontroller runtimes on the Keras-converted models (issue 14).

Re-run (from the repository root; xmos-ai-tools needs numpy < 2, so it has its own venv):

    python3 -m venv .venv-xmos
    .venv-xmos/bin/pip install xmos-ai-tools==1.4.2 'numpy<2' flatbuffers
    .venv/bin/python scripts/keras_mcu_testdata.py [.venv-xmos/bin/python]

Run with hwjax's venv (attaching the metadata needs ``ai-edge-litert``'s schema); the steps
that need xmos-ai-tools run in the xmos venv's interpreter (the optional argument; default
``.venv-xmos/bin/python``). For each model NAME of ``tests/data/keras/`` (the int8 files
``scripts/keras_testdata.py`` made with TensorFlow's converter: mobilenet_v2_tiny,
cnn_branches, mlp_sigmoid) it writes into ``tests/data/keras_mcu/``:

* ``NAME.xc.tflite``: ``xmos_ai_tools.xformer.convert(NAME.tflite, ...)`` with default options;
* ``NAME.npz``: ``x`` (the first 8 inputs of ``tests/data/keras/NAME.npz``), ``y_xs3`` (the
  converted model in ``TFLMHostInterpreter``: lib_nn's host build for the XC ops, TFLM's
  reference kernels for the rest) and ``y_tflm`` (the original model in the same
  interpreter: TFLM's reference kernels), one sample per invoke.

The original is not copied (the tests read it from ``tests/data/keras/``). A re-run gives
the same ``.npz`` files; the ``.xc.tflite`` files can differ in a few bytes xformer leaves
uninitialised (e.g. the unused slots of XC_concat's size vector), not in what they compute.
The steps are those of ``scripts/xformer_testdata.py``, whose functions run here on a
staging copy: its ``convert`` (xformer), ``attach`` (the host interpreter crashes on a
model without xformer's ``xcoreSharedConfig`` metadata, so the original runs with that one
entry copied from its converted version; operators untouched) and ``_run_host``.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "tests", "data", "keras")
OUT = os.path.join(HERE, "..", "tests", "data", "keras_mcu")
MODELS = ("mobilenet_v2_tiny", "cnn_branches", "mlp_sigmoid")
N_SAMPLES = 8

sys.path.insert(0, HERE)
import xformer_testdata as xt  # noqa: E402


def _stage(work: str) -> str:
    """Point xformer_testdata's functions at ``work/src`` (the staging copy of the originals)."""
    src = os.path.join(work, "src")
    xt.OUT = src
    xt._names = lambda: list(MODELS)
    return src


def prepare(work: str) -> None:
    """``work/src/NAME.tflite`` (copies of the originals) and ``work/NAME.inputs.npy``."""
    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    for name in MODELS:
        shutil.copyfile(os.path.join(SRC, f"{name}.tflite"), os.path.join(src, f"{name}.tflite"))
        with np.load(os.path.join(SRC, f"{name}.npz")) as z:
            x = z["x"][:N_SAMPLES]
        assert x.dtype == np.int8 and x.shape[0] == N_SAMPLES
        np.save(os.path.join(work, f"{name}.inputs.npy"), x)


def run(work: str) -> None:
    """``OUT/NAME.npz`` and ``OUT/NAME.xc.tflite`` (xmos venv)."""
    src = _stage(work)
    os.makedirs(OUT, exist_ok=True)
    for name in MODELS:
        x = np.load(os.path.join(work, f"{name}.inputs.npy"))
        xc = os.path.join(src, f"{name}.xc.tflite")
        y_xs3 = xt._run_host(xc, x)
        y_tflm = xt._run_host(os.path.join(work, f"{name}.tflm.tflite"), x)
        shutil.copyfile(xc, os.path.join(OUT, f"{name}.xc.tflite"))
        np.savez_compressed(os.path.join(OUT, f"{name}.npz"), x=x, y_xs3=y_xs3, y_tflm=y_tflm)
        diff = int(np.sum(y_xs3.astype(int) != y_tflm.astype(int)))
        print(f"{name}: output {y_xs3.shape[1:]} {y_xs3.dtype}, xs3 differs from TFLM on {diff} of {y_xs3.size}")


def main(xmos_python: str) -> None:
    import subprocess
    import tempfile

    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as work:
        prepare(work)
        subprocess.run([xmos_python, me, "convert", work], check=True)
        _stage(work)
        xt.attach(work)
        subprocess.run([xmos_python, me, "run", work], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "convert":
        _stage(sys.argv[2])
        xt.convert(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) <= 2:
        main(sys.argv[1] if len(sys.argv) == 2 else os.path.join(HERE, "..", ".venv-xmos", "bin", "python"))
    else:
        sys.exit("usage: keras_mcu_testdata.py [XMOS_PYTHON]  (see the module docstring)")
