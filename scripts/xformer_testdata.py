"""Oracle data for the xcore.ai (XS3A) runtime: xformer-converted models and their outputs.

Re-run (from the repository root; xmos-ai-tools needs numpy < 2, so it has its own venv):

    python3 -m venv .venv-xmos
    .venv-xmos/bin/pip install xmos-ai-tools==1.4.2 'numpy<2' flatbuffers
    .venv/bin/python scripts/xformer_testdata.py [.venv-xmos/bin/python]

Run with hwjax's venv (it builds the models with :mod:`hwjax.tflite.testing`, which
needs ``ai-edge-litert``); the steps that need xmos-ai-tools run in the xmos venv's
interpreter (the optional argument; default ``.venv-xmos/bin/python``). For every model
NAME in :func:`_models` (random int8 weights, seeded, no TensorFlow) it writes into
``tests/data/xformer/``:

* ``NAME.tflite``: the original model;
* ``NAME.xc.tflite``: ``xmos_ai_tools.xformer.convert(NAME.tflite, ...)`` with default options;
* ``NAME.npz``: ``x`` (8 fixed random int8 inputs, batch first), ``y_xs3`` (the converted
  model in ``TFLMHostInterpreter``: lib_nn's host build for the XC ops) and ``y_tflm`` (the
  original model in the same interpreter: TFLM's reference kernels), one sample per invoke.

The host interpreter crashes on a model without xformer's ``xcoreSharedConfig`` metadata,
so the original runs with that one metadata entry copied from its converted version
(:func:`attach`; a temporary file, operators untouched).
"""

from __future__ import annotations

import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "xformer")
N_SAMPLES = 8


# ------------------------------------------------------------------ stage 1: models (hwjax venv)


def _models():
    """name -> (seed, builder(rng) -> (model bytes, per-example input shape))."""
    from hwjax.tflite import testing as T

    def conv(in_shape, out_ch, k, stride, padding, act=None):
        return lambda rng: T.linear_model(
            rng, "CONV_2D", in_shape=in_shape, out_ch=out_ch, k=k, stride=stride, padding=padding, activation=act
        )

    def mean(rng):
        mb = T.ModelBuilder()
        shape = (4, 5, 8)
        x = T.act_tensor(mb, rng, shape)
        axes = mb.tensor((2,), "int32", data=np.array([1, 2], np.int32))
        y = T.act_tensor(mb, rng, (1, 1, shape[2]))
        mb.op("MEAN", [x, axes], [y], ("ReducerOptions", {"keepDims": True}), 2)
        return mb.finish([x], [y]), shape

    def pad(rng):
        mb = T.ModelBuilder()
        shape = (5, 6, 4)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        p = mb.tensor((4, 2), "int32", data=np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32))
        y = T.act_tensor(mb, rng, (8, 9, 4), s, zp)
        mb.op("PAD", [x, p], [y], ("PadOptions", {}), 2)
        return mb.finish([x], [y]), shape

    def reshape(rng):
        mb = T.ModelBuilder()
        shape = (4, 6, 4)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        st = mb.tensor((3,), "int32", data=np.array([1, 12, 8], np.int32))
        y = T.act_tensor(mb, rng, (12, 8), s, zp)
        mb.op("RESHAPE", [x, st], [y], ("ReshapeOptions", {"newShape": [1, 12, 8]}))
        return mb.finish([x], [y]), shape

    def spread_conv(rng):
        """A VALID 3x3 conv 8 -> 8 whose weight scales spread over up to 4 decades: xformer
        then picks the group transform, the channel-wise one, or leaves the TFLM op."""
        mb = T.ModelBuilder()
        s_in = np.float32(10 ** rng.uniform(-2.5, -0.5))
        x = mb.tensor((1, 6, 6, 8), "int8", s_in, int(rng.integers(-30, 30)))
        s_w = (0.01 * 10 ** rng.uniform(-rng.uniform(0, 4), 0, 8)).astype(np.float32)
        w = mb.tensor((8, 3, 3, 8), "int8", s_w, np.zeros(8), rng.integers(-127, 128, (8, 3, 3, 8)))
        b = mb.tensor((8,), "int32", (s_in * s_w).astype(np.float32), np.zeros(8), rng.integers(-3000, 3000, 8))
        s_out = np.float32(s_in * s_w.max() * 10 ** rng.uniform(0, 2.5))
        y = mb.tensor((1, 4, 4, 8), "int8", s_out, int(rng.integers(-30, 30)))
        mb.op("CONV_2D", [x, w, b], [y], ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}), 3)
        return mb.finish([x], [y]), (6, 6, 8)

    return {
        "spread_group": (1000, spread_conv),
        "spread_channelwise_a": (1002, spread_conv),
        "spread_channelwise_b": (1007, spread_conv),
        "spread_tflm": (1001, spread_conv),
        "conv_3_5_same": (1, conv((8, 8, 3), 5, (3, 3), (1, 1), "SAME")),
        # one input channel: xformer pads it to four (XC_pad_1_to_4), as in a KWS front end
        "conv_1ch_3x3": (20, conv((10, 8, 1), 8, (3, 3), (1, 1), "SAME", "relu")),
        "conv_1ch_10x4_s2": (21, conv((49, 10, 1), 16, (10, 4), (2, 2), "SAME", "relu")),
        "conv_8_12_valid": (2, conv((7, 6, 8), 12, (3, 3), (1, 1), "VALID", "relu")),
        "conv_16_17_s2": (3, conv((9, 9, 16), 17, (3, 3), (2, 2), "SAME", "relu6")),
        "conv_1x1": (4, conv((5, 5, 32), 16, (1, 1), (1, 1), "VALID")),
        "conv_direct": (5, conv((6, 6, 32), 16, (3, 3), (1, 1), "VALID")),
        "depthwise": (
            6,
            lambda rng: T.linear_model(
                rng, "DEPTHWISE_CONV_2D", in_shape=(8, 8, 16), k=(3, 3), stride=(1, 1), padding="SAME"
            ),
        ),
        "depthwise_valid_s2": (
            7,
            lambda rng: T.linear_model(
                rng, "DEPTHWISE_CONV_2D", in_shape=(9, 9, 8), k=(3, 3), stride=(2, 2), padding="VALID"
            ),
        ),
        "fully_connected": (8, lambda rng: T.linear_model(rng, "FULLY_CONNECTED", in_shape=(20,), out_ch=10)),
        "mean": (9, mean),
        "pad": (10, pad),
        "maxpool": (
            11,
            lambda rng: T.pool_model(
                rng, "MAX_POOL_2D", in_shape=(8, 8, 8), window=(2, 2), stride=(2, 2), padding="VALID"
            ),
        ),
        "add": (12, lambda rng: T.add_model(rng, shape=(4, 4, 8))),
        "reshape": (13, reshape),
        "chain": (14, lambda rng: T.chain_model(rng, in_shape=(9, 8, 3), quantize=False)),
    }


def build(work: str) -> None:
    """``OUT/NAME.tflite`` and ``work/NAME.inputs.npy`` for every model."""
    os.makedirs(OUT, exist_ok=True)
    for name, (seed, make) in _models().items():
        rng = np.random.default_rng(seed)
        data, shape = make(rng)
        x = rng.integers(-128, 128, (N_SAMPLES, *shape)).astype(np.int8)
        with open(os.path.join(OUT, f"{name}.tflite"), "wb") as f:
            f.write(data)
        np.save(os.path.join(work, f"{name}.inputs.npy"), x)
        print(f"built {name}: input {shape}, {len(data)} bytes")


# ------------------------------------------------------ stage 2: xformer (xmos venv)


def convert(work: str) -> None:
    """xformer on every ``OUT/NAME.tflite`` (not ``*.xc.tflite``) into ``OUT/NAME.xc.tflite``."""
    from xmos_ai_tools import xformer

    # xformer.convert runs the ``xcore-opt`` executable installed beside this interpreter
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    for name in _names():
        src, dst = os.path.join(OUT, f"{name}.tflite"), os.path.join(work, f"{name}.xc.tflite")
        rc = xformer.convert(src, dst, None)
        if rc != 0 or not os.path.exists(dst):
            sys.exit(f"xformer failed on {name} (rc={rc})")
        os.replace(dst, os.path.join(OUT, f"{name}.xc.tflite"))  # its .cpp/.h side files stay in work


# ------------------------------------------- stage 3: host-runnable originals (hwjax venv)


def attach(work: str) -> None:
    """``work/NAME.tflm.tflite``: the original model plus the ``xcoreSharedConfig`` metadata
    of its xformed version. The host interpreter dereferences that metadata entry
    unconditionally (a model without it crashes the process); metadata does not touch
    any operator, so the builtin ops still run as TFLM's reference kernels."""
    import flatbuffers
    import ai_edge_litert.schema_py_generated as s

    def load(path):
        with open(path, "rb") as f:
            return s.ModelT.InitFromPackedBuf(bytearray(f.read()), 0)

    for name in _names():
        orig, xc = load(os.path.join(OUT, f"{name}.tflite")), load(os.path.join(OUT, f"{name}.xc.tflite"))
        cfg = [m for m in xc.metadata if m.name == b"xcoreSharedConfig"]
        if len(cfg) != 1:
            sys.exit(f"{name}.xc.tflite has no xcoreSharedConfig metadata")
        buf = s.BufferT()
        buf.data = xc.buffers[cfg[0].buffer].data
        orig.buffers.append(buf)
        md = s.MetadataT()
        md.name, md.buffer = "xcoreSharedConfig", len(orig.buffers) - 1
        orig.metadata = [md]
        b = flatbuffers.Builder(1024)
        b.Finish(orig.Pack(b), file_identifier=b"TFL3")
        with open(os.path.join(work, f"{name}.tflm.tflite"), "wb") as f:
            f.write(bytes(b.Output()))


# ------------------------------------------------------ stage 4: host interpreter (xmos venv)


def _run_host(path: str, x: np.ndarray) -> np.ndarray:
    from xmos_ai_tools.xinterpreters import TFLMHostInterpreter

    it = TFLMHostInterpreter()
    it.set_model(model_path=path)
    out = it.get_output_details()[0]
    ys = []
    for xi in x:
        it.set_tensor(0, np.ascontiguousarray(xi[None]))
        it.invoke()
        ys.append(it.get_tensor(out["index"]).reshape(out["shape"])[0].copy())
    it.close()
    return np.stack(ys)


def run(work: str) -> None:
    """``OUT/NAME.npz`` from ``work/NAME.inputs.npy``, the xformed and the host-runnable original."""
    for name in _names():
        x = np.load(os.path.join(work, f"{name}.inputs.npy"))
        y_xs3 = _run_host(os.path.join(OUT, f"{name}.xc.tflite"), x)
        y_tflm = _run_host(os.path.join(work, f"{name}.tflm.tflite"), x)
        np.savez_compressed(os.path.join(OUT, f"{name}.npz"), x=x, y_xs3=y_xs3, y_tflm=y_tflm)
        diff = int(np.sum(y_xs3.astype(int) != y_tflm.astype(int)))
        print(f"{name}: output {y_xs3.shape[1:]}, xs3 differs from TFLM on {diff} of {y_xs3.size}")


def _names() -> list[str]:
    return sorted(f[: -len(".tflite")] for f in os.listdir(OUT) if f.endswith(".tflite") and ".xc." not in f)


def main(xmos_python: str) -> None:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        build(work)
        me = os.path.abspath(__file__)
        subprocess.run([xmos_python, me, "convert", work], check=True)
        attach(work)
        subprocess.run([xmos_python, me, "run", work], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("convert", "run"):
        {"convert": convert, "run": run}[sys.argv[1]](sys.argv[2])
    elif len(sys.argv) <= 2:
        main(
            sys.argv[1]
            if len(sys.argv) == 2
            else os.path.join(os.path.dirname(OUT), "..", "..", ".venv-xmos", "bin", "python")
        )
    else:
        sys.exit("usage: xformer_testdata.py [XMOS_PYTHON]  (see the module docstring)")
