"""Oracle data for runtime="tflm": small int8 models and TensorFlow Lite Micro's outputs.

Re-run (from the repository root; xmos-ai-tools needs numpy < 2, so it has its own venv):

    python3 -m venv .venv-xmos
    .venv-xmos/bin/pip install xmos-ai-tools==1.4.2 'numpy<2'
    .venv/bin/python scripts/tflm_testdata.py [.venv-xmos/bin/python]

Run with hwjax's venv (it builds the models with :mod:`hwjax.tflite.testing`, which needs
``ai-edge-litert``); the steps that need xmos-ai-tools run in the xmos venv's interpreter
(the optional argument; default ``.venv-xmos/bin/python``). The only TFLite Micro runnable
here is that package's host interpreter (``TFLMHostInterpreter``): TFLM's builtin
reference kernels compiled for the host. For every model NAME in :func:`_models` (random
int8 weights and quantisation, seeded; one op kind under test, plus at most a 1x1 conv to
make a second operand) it writes into ``tests/data/tflm/``:

* ``NAME.tflite``: the model exactly as the interpreter ran it. The host interpreter
  dereferences the ``xcoreSharedConfig`` metadata entry unconditionally, so every model
  carries that one entry, copied from xformer's conversion of a tiny fixed model
  (metadata touches no operator: the builtin ops run as TFLM's reference kernels);
* ``NAME.npz``: ``x`` (16 int8 inputs, batch first: all -128, all 127, every int8 value
  when the example has at least 256 elements, then random) and ``y`` (the interpreter's
  output, one sample per ``invoke``; int8, or float32 for DEQUANTIZE).

A model the interpreter refuses to prepare is written as ``NAME.tflite`` plus
``NAME.refused.txt`` (the error), without outputs.
"""

from __future__ import annotations

import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tflm")
N_SAMPLES = 16


# ------------------------------------------------------------------ stage 1: models (hwjax venv)


def _models():
    """name -> builder(rng) -> (model bytes, per-example input shape)."""
    from hwjax.tflite import testing as T

    L = T.linear_model

    def lin(kind, **kw):
        return lambda rng: L(rng, kind, **kw)

    def pool(kind, **kw):
        return lambda rng: T.pool_model(rng, kind, **kw)

    def unary(op, shape=(64,), s_in=None, z_in=None, s_out=None, z_out=None, options=None):
        def make(rng):
            mb = T.ModelBuilder()
            a = T.act_tensor(mb, rng, shape, s_in, z_in)
            b = T.act_tensor(mb, rng, shape, s_out, z_out)
            mb.op(op, [a], [b], options)
            return mb.finish([a], [b]), shape

        return make

    def same_quant_unary(op, shape=(64,), s=None):
        def make(rng):
            mb = T.ModelBuilder()
            sc, zp = (T.random_scale(rng, -2, 0) if s is None else np.float32(s)), int(rng.integers(-40, 40))
            a = T.act_tensor(mb, rng, shape, sc, zp)
            b = T.act_tensor(mb, rng, shape, sc, zp)
            mb.op(op, [a], [b])
            return mb.finish([a], [b]), shape

        return make

    def dequantize(rng):
        mb = T.ModelBuilder()
        shape = (5, 7)
        a = T.act_tensor(mb, rng, shape)
        # the host interpreter's output details read a scale: a unit one (unused by the op)
        b = mb.tensor((1, *shape), "float32", np.float32(1.0), 0)
        mb.op("DEQUANTIZE", [a], [b])
        return mb.finish([a], [b]), shape

    def second_operand(mb, rng, x, shape, s_in):
        """x -> 1x1 conv (same shape, new quantisation): a second int8 tensor from one input."""
        c = shape[-1]
        s_w = T.random_filter_scales(rng, c, True)
        w = mb.tensor((c, 1, 1, c), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 1, 1, c)))
        b = mb.tensor((c,), "int32", (s_in * s_w).astype(np.float32), np.zeros(c), rng.integers(-500, 500, c))
        h = T.act_tensor(mb, rng, shape, T.out_scale_for(s_in, s_w, c))
        mb.op("CONV_2D", [x, w, b], [h], ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}), 3)
        return h

    def mul(act=None, kind="pair"):
        def make(rng):
            mb = T.ModelBuilder()
            shape = (4, 4, 5)
            s_in = T.random_scale(rng)
            x = T.act_tensor(mb, rng, shape, s_in)
            if kind == "pair":
                other = second_operand(mb, rng, x, shape, s_in)
                s_o = float(s_in) * float(mb.tensors[other].quantization.scale[0])
            elif kind == "square":
                other, s_o = x, float(s_in) ** 2
            elif kind == "broadcast":  # x * mean(x) over H, W (keep dims): (4,4,5) * (1,1,5)
                s_m = np.float32(s_in * 0.6)
                other = T.act_tensor(mb, rng, (1, 1, shape[-1]), s_m)
                axes = mb.tensor((2,), "int32", data=np.array([1, 2], np.int32))
                mb.op("MEAN", [x, axes], [other], ("ReducerOptions", {"keepDims": True}))
                s_o = float(s_in) * float(s_m)
            else:  # a constant operand of the example's shape
                sc = np.float32(0.011)
                other = mb.tensor((1, *shape), "int8", sc, 7, rng.integers(-128, 128, (1, *shape)))
                s_o = float(s_in) * float(sc)
            y = T.act_tensor(mb, rng, shape, np.float32(s_o * 10 ** rng.uniform(1.0, 2.2)))
            mb.op("MUL", [x, other], [y], ("MulOptions", {"fusedActivationFunction": T.ACTIVATION_CODES[act]}))
            return mb.finish([x], [y]), shape

        return make

    def add(act=None):
        return lambda rng: T.add_model(rng, shape=(4, 4, 6), activation=act)

    def mean(shape, axes, keep, same_quant=False):
        def make(rng):
            mb = T.ModelBuilder()
            s, zp = T.random_scale(rng, -2, -0.5), int(rng.integers(-40, 40))
            x = T.act_tensor(mb, rng, shape, s, zp)
            a = mb.tensor((len(axes),), "int32", data=np.array(axes, np.int32))
            out = (
                [1 if i + 1 in axes else d for i, d in enumerate(shape)]
                if keep
                else [d for i, d in enumerate(shape) if i + 1 not in axes]
            )
            if same_quant:
                y = T.act_tensor(mb, rng, tuple(out), s, zp)
            else:
                y = T.act_tensor(mb, rng, tuple(out), np.float32(s * 10 ** rng.uniform(-0.7, 0.3)))
            mb.op("MEAN", [x, a], [y], ("ReducerOptions", {"keepDims": keep}))
            return mb.finish([x], [y]), shape

        return make

    def pad(v2=False):
        def make(rng):
            mb = T.ModelBuilder()
            shape = (5, 6, 3)
            s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
            x = T.act_tensor(mb, rng, shape, s, zp)
            p = mb.tensor((4, 2), "int32", data=np.array([[0, 0], [1, 2], [2, 1], [0, 1]], np.int32))
            y = T.act_tensor(mb, rng, (8, 9, 4), s, zp)
            if v2:
                cv = mb.tensor((), "int8", s, zp, data=np.array(-77, np.int8))
                mb.op("PADV2", [x, p, cv], [y], ("PadV2Options", {}))
            else:
                mb.op("PAD", [x, p], [y], ("PadOptions", {}), 2)
            return mb.finish([x], [y]), shape

        return make

    def concat(rng):
        mb = T.ModelBuilder()
        shape = (4, 3, 5)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        p = mb.tensor((4, 2), "int32", data=np.array([[0, 0], [0, 0], [0, 0], [0, 2]], np.int32))
        q = T.act_tensor(mb, rng, (4, 3, 7), s, zp)
        mb.op("PAD", [x, p], [q], ("PadOptions", {}), 2)
        y = T.act_tensor(mb, rng, (4, 3, 12), s, zp)
        mb.op("CONCATENATION", [x, q], [y], ("ConcatenationOptions", {"axis": -1}))
        z = T.act_tensor(mb, rng, (8, 3, 12), s, zp)
        mb.op("CONCATENATION", [y, y], [z], ("ConcatenationOptions", {"axis": 1}))
        return mb.finish([x], [z]), shape

    def reshape(rng):
        mb = T.ModelBuilder()
        shape = (4, 6, 4)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        st = mb.tensor((3,), "int32", data=np.array([1, 12, 8], np.int32))
        y = T.act_tensor(mb, rng, (12, 8), s, zp)
        mb.op("RESHAPE", [x, st], [y], ("ReshapeOptions", {"newShape": [1, 12, 8]}))
        return mb.finish([x], [y]), shape

    def flatten(rng):
        mb = T.ModelBuilder()
        shape = (3, 5, 4)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        st = mb.tensor((2,), "int32", data=np.array([1, 60], np.int32))
        y = T.act_tensor(mb, rng, (60,), s, zp)
        mb.op("RESHAPE", [x, st], [y], ("ReshapeOptions", {"newShape": [1, 60]}))
        return mb.finish([x], [y]), shape

    def squeeze(rng):
        mb = T.ModelBuilder()
        shape = (4, 1, 6)
        s, zp = T.random_scale(rng), int(rng.integers(-20, 20))
        x = T.act_tensor(mb, rng, shape, s, zp)
        y = T.act_tensor(mb, rng, (4, 6), s, zp)
        mb.op("SQUEEZE", [x], [y], ("SqueezeOptions", {"squeezeDims": [2]}))
        return mb.finish([x], [y]), shape

    def lut(op, s_in, z_in, s_out, z_out):
        return unary(op, (256,), np.float32(s_in), z_in, np.float32(s_out), z_out)

    def softmax(shape, s_in, z_in, beta):
        return unary(
            "SOFTMAX", shape, np.float32(s_in), z_in, np.float32(1 / 256), -128, ("SoftmaxOptions", {"beta": beta})
        )

    return {
        # linear ops
        "fc_per_tensor": lin("FULLY_CONNECTED", in_shape=(37,), out_ch=11, per_channel=False),
        "fc_per_tensor_relu6": lin("FULLY_CONNECTED", in_shape=(29,), out_ch=9, per_channel=False, activation="relu6"),
        "fc_per_channel": lin("FULLY_CONNECTED", in_shape=(24,), out_ch=7),
        "fc_relu_nobias": lin(
            "FULLY_CONNECTED", in_shape=(16,), out_ch=5, activation="relu", bias=False, per_channel=False
        ),
        "conv_same_s2_relu": lin("CONV_2D", in_shape=(9, 8, 3), out_ch=5, stride=(2, 2), activation="relu"),
        "conv_valid_per_tensor": lin(
            "CONV_2D", in_shape=(7, 6, 4), out_ch=3, k=(3, 2), padding="VALID", per_channel=False
        ),
        "conv_same_k5_s12_n1to1": lin(
            "CONV_2D", in_shape=(8, 9, 2), out_ch=7, k=(5, 5), stride=(1, 2), activation="relu_n1_to_1"
        ),
        "conv_1x1_relu6": lin("CONV_2D", in_shape=(5, 5, 9), out_ch=6, k=(1, 1), activation="relu6"),
        "dw_same_s21": lin("DEPTHWISE_CONV_2D", in_shape=(8, 7, 5), stride=(2, 1)),
        "dw_valid_relu6_per_tensor": lin(
            "DEPTHWISE_CONV_2D", in_shape=(6, 6, 3), k=(2, 3), padding="VALID", per_channel=False, activation="relu6"
        ),
        "dw_same_s2_relu_odd": lin("DEPTHWISE_CONV_2D", in_shape=(7, 7, 7), stride=(2, 2), activation="relu"),
        "dw_valid_n1to1": lin("DEPTHWISE_CONV_2D", in_shape=(6, 5, 4), padding="VALID", activation="relu_n1_to_1"),
        # pools
        "avgpool_same_s2": pool("AVERAGE_POOL_2D", in_shape=(7, 7, 3), window=(3, 3), stride=(2, 2), padding="SAME"),
        "avgpool_valid_relu": pool(
            "AVERAGE_POOL_2D", in_shape=(6, 5, 3), window=(2, 2), stride=(2, 1), padding="VALID", activation="relu"
        ),
        "maxpool_same_relu6": pool(
            "MAX_POOL_2D", in_shape=(7, 7, 3), window=(3, 3), stride=(2, 2), padding="SAME", activation="relu6"
        ),
        "maxpool_valid": pool("MAX_POOL_2D", in_shape=(8, 6, 4), window=(2, 2), stride=(2, 2), padding="VALID"),
        # element-wise
        "add": add(),
        "add_relu6": add("relu6"),
        "mul": mul(),
        "mul_relu6": mul("relu6"),
        "mul_square": mul(kind="square"),
        "mul_broadcast_mean": mul("relu", kind="broadcast"),
        "mul_const_n1to1": mul("relu_n1_to_1", kind="const"),
        # reductions and data movement
        "mean_hw_keep": mean((5, 6, 7), (1, 2), True),
        "mean_hw_keep_same_quant": mean((4, 4, 6), (1, 2), True, same_quant=True),
        "mean_hw": mean((5, 6, 7), (1, 2), False),
        "mean_hw_same_quant": mean((3, 5, 9), (2, 1), False, same_quant=True),
        "mean_c": mean((4, 5, 6), (3,), False),
        "mean_w_keep": mean((4, 5, 6), (2,), True),
        "pad": pad(),
        "padv2": pad(v2=True),
        "concat": concat,
        "reshape": reshape,
        "flatten": flatten,
        "squeeze": squeeze,
        # requantising unary ops
        "relu": unary("RELU"),
        "relu6": unary("RELU6", s_in=np.float32(0.08)),  # Q_in(6) = 75 + z_in: inside the int8 range
        "relu_n1_to_1": unary("RELU_N1_TO_1"),
        "relu_same_quant": same_quant_unary("RELU"),
        "relu6_same_quant": same_quant_unary("RELU6", s=0.05),
        "relu_n1_to_1_same_quant": same_quant_unary("RELU_N1_TO_1", s=0.01),
        "quantize": unary("QUANTIZE"),
        "quantize_tail": unary("QUANTIZE", shape=(7, 5)),
        "dequantize": dequantize,
        # nonlinear ops (every int8 value is one of the inputs)
        "logistic": lut("LOGISTIC", 0.05, 3, 1 / 256, -128),
        "logistic_large_scale": lut("LOGISTIC", 10.0, -128, 1 / 256, -128),
        "logistic_tiny_scale": lut("LOGISTIC", 1e-5, 127, 1 / 256, -128),
        "logistic_huge_scale": lut("LOGISTIC", 40.0, 3, 1 / 256, -128),
        "logistic_zp0": lut("LOGISTIC", 0.0123, -7, 1 / 256, 0),
        "tanh": lut("TANH", 0.02, 0, 1 / 128, 0),
        "tanh_large_scale": lut("TANH", 4.0, 50, 1 / 128, 0),
        "tanh_tiny_scale": lut("TANH", 2e-5, -100, 1 / 128, 0),
        "tanh_huge_scale": lut("TANH", 100.0, -3, 1 / 128, 0),
        "tanh_other_out": lut("TANH", 0.031, 9, 0.01, 5),
        "softmax_len5_beta0.5": softmax((5,), 0.029639151, 0, 0.5),
        "softmax_len37": softmax((37,), 0.0065199365, -3, 1.0),
        "softmax_len37_large_scale": softmax((37,), 40.0, 0, 1.0),
        "softmax_len37_beta2.3": softmax((37,), 0.1, 5, 2.3),
        "softmax_hwc": softmax((4, 3, 7), 0.2, 10, 0.7),
    }


def _inputs(rng, shape) -> np.ndarray:
    x = rng.integers(-128, 128, (N_SAMPLES, *shape)).astype(np.int8)
    x[0], x[1] = -128, 127
    n = int(np.prod(shape))
    if n >= 256:
        flat = x[2].reshape(-1)
        flat[:256] = rng.permutation(np.arange(-128, 128))
        x[2] = flat.reshape(shape)
    return x


def _cfg_model() -> bytes:
    """A tiny fixed FULLY_CONNECTED model: xformer's conversion of it gives the metadata."""
    from hwjax.tflite import testing as T

    return T.linear_model(np.random.default_rng(0), "FULLY_CONNECTED", in_shape=(16,), out_ch=8)[0]


def build(work: str) -> None:
    """``work/NAME.tflite`` and ``work/NAME.x.npy`` for every model; ``work/_cfg.tflite``."""
    for seed, (name, make) in enumerate(_models().items()):
        rng = np.random.default_rng(7000 + seed)
        data, shape = make(rng)
        with open(os.path.join(work, f"{name}.tflite"), "wb") as f:
            f.write(data)
        np.save(os.path.join(work, f"{name}.x.npy"), _inputs(rng, shape))
    with open(os.path.join(work, "_cfg.tflite"), "wb") as f:
        f.write(_cfg_model())


# ------------------------------------------------------ stage 2: xformer (xmos venv)


def convert(work: str) -> None:
    """``work/_cfg.xc.tflite``: xformer's conversion of the tiny model (default options)."""
    from xmos_ai_tools import xformer

    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    src, dst = os.path.join(work, "_cfg.tflite"), os.path.join(work, "_cfg.xc.tflite")
    rc = xformer.convert(src, dst, None)
    if rc != 0 or not os.path.exists(dst):
        sys.exit(f"xformer failed (rc={rc})")


# ---------------------------------------- stage 3: metadata, into OUT (hwjax venv)


def attach(work: str) -> None:
    """``OUT/NAME.tflite``: ``work/NAME.tflite`` plus the ``xcoreSharedConfig`` metadata entry
    of ``work/_cfg.xc.tflite`` (operators, tensors and buffers untouched)."""
    import flatbuffers
    import ai_edge_litert.schema_py_generated as s

    def load(path):
        with open(path, "rb") as f:
            return s.ModelT.InitFromPackedBuf(bytearray(f.read()), 0)

    xc = load(os.path.join(work, "_cfg.xc.tflite"))
    cfg = [m for m in xc.metadata if m.name == b"xcoreSharedConfig"]
    if len(cfg) != 1:
        sys.exit("_cfg.xc.tflite has no xcoreSharedConfig metadata")
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith((".tflite", ".npz", ".refused.txt")):
            os.remove(os.path.join(OUT, f))
    for name in _models_in(work):
        m = load(os.path.join(work, f"{name}.tflite"))
        buf = s.BufferT()
        buf.data = xc.buffers[cfg[0].buffer].data
        m.buffers.append(buf)
        md = s.MetadataT()
        md.name, md.buffer = "xcoreSharedConfig", len(m.buffers) - 1
        m.metadata = [md]
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        with open(os.path.join(OUT, f"{name}.tflite"), "wb") as f:
            f.write(bytes(b.Output()))


def _models_in(work: str) -> list[str]:
    return sorted(f[: -len(".x.npy")] for f in os.listdir(work) if f.endswith(".x.npy"))


# ------------------------------------------------------ stage 4: host interpreter (xmos venv)


def _run_host(path: str, x: np.ndarray) -> np.ndarray:
    from xmos_ai_tools.xinterpreters import TFLMHostInterpreter

    it = TFLMHostInterpreter()
    try:
        it.set_model(model_path=path)
        out = it.get_output_details()[0]
        ys = []
        for xi in x:
            it.set_tensor(0, np.ascontiguousarray(xi[None]))
            it.invoke()
            ys.append(it.get_tensor(out["index"]).reshape(out["shape"])[0].copy())
    finally:
        it.close()
    return np.stack(ys)


def run_one(work: str, name: str) -> None:
    """``OUT/NAME.npz`` (or ``OUT/NAME.refused.txt``) for one model (its own process: a
    model the interpreter cannot run may abort it)."""
    x = np.load(os.path.join(work, f"{name}.x.npy"))
    try:
        y = _run_host(os.path.join(OUT, f"{name}.tflite"), x)
    except Exception as e:
        with open(os.path.join(OUT, f"{name}.refused.txt"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
        print(f"{name}: refused ({type(e).__name__}: {e})")
        return
    np.savez_compressed(os.path.join(OUT, f"{name}.npz"), x=x, y=y)
    print(f"{name}: input {x.shape[1:]}, output {y.shape[1:]} {y.dtype}")


def main(xmos_python: str) -> None:
    import subprocess
    import tempfile

    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as work:
        build(work)
        subprocess.run([xmos_python, me, "convert", work], check=True)
        attach(work)
        for name in _models_in(work):
            r = subprocess.run([xmos_python, me, "run", work, name], capture_output=True, text=True)
            if r.returncode != 0:
                # the interpreter prints why it failed to prepare, then the process dies
                lines = [ln.split("/tflite-micro/")[-1] for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
                with open(os.path.join(OUT, f"{name}.refused.txt"), "w") as f:
                    lines.append(f"(the interpreter's process exited with status {r.returncode})")
                    f.write("\n".join(lines) + "\n")
                print(f"{name}: refused by the interpreter ({lines[:1]})")
            else:
                print(r.stdout, end="")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "convert":
        convert(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run_one(sys.argv[2], sys.argv[3])
    elif len(sys.argv) <= 2:
        main(
            sys.argv[1]
            if len(sys.argv) == 2
            else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv-xmos", "bin", "python")
        )
    else:
        sys.exit("usage: tflm_testdata.py [XMOS_PYTHON]  (see the module docstring)")
