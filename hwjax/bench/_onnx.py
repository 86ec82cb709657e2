"""``python -m hwjax.bench onnx``: images/s of an int8 ONNX model, hwjax against ONNX Runtime.

The model: a small MobileNet-like float CNN on 3x32x32 (NCHW) images, built with
``onnx.helper`` from a fixed seed: Conv 3x3/2 (16) + Relu, depthwise 3x3 + Relu, Conv 1x1
(32) + Relu, depthwise 3x3/2 + Relu, Conv 1x1 (64) + Relu, a residual Conv 1x1 (64) + Relu
added back (Add), GlobalAveragePool, Flatten, Gemm 64 -> 10. It is quantised by
``onnxruntime.quantization.quantize_static`` (8 seeded random calibration batches) in two
settings (``--settings``):

* ``qoperator``: QOperator format, uint8 activations, int8 weights, per-tensor;
* ``qdq``: QDQ format, uint8 activations, int8 weights, per-channel.

For each setting the same float32 batch of ``--batch`` images (default 256) runs in

* ONNX Runtime (CPU execution provider, ``intra_op_num_threads=1``,
  ``inter_op_num_threads=1``, ``ORT_ENABLE_ALL``): one ``session.run`` per image
  (``onnxruntime batch-1``), and one ``session.run`` on the whole batch (``onnxruntime
  batched``; the model's batch axis is symbolic);
* hwjax: ``jax.jit(lambda x: model.run(x, runtime="onnxruntime"))`` on a device array
  (compiled before timing; the host-side input checks of a direct ``Model.run`` call are
  not timed).

Every output is compared before any timing, as bits (float32 outputs as int32 patterns:
exact equality), with ONNX Runtime's batch-1 outputs (the reference: hwjax computes each
example as ONNX Runtime computes a batch-1 input); a mismatch prints ``MISMATCH`` with the
number of differing values, and the exit code is 1. Then the three candidates are timed in
``--repeats`` interleaved rounds (each round one sample of at least ``--min-time`` seconds
per candidate; the best sample is kept), so that load from other processes falls on all
of them alike. Rows give images/s; the ratios are hwjax / ONNX Runtime.

Time to first result: for each setting, two fresh Python processes (same threads and CPU,
no persistent JAX compilation cache) each write how long they took from before their
first import to the first output of the batch in hand: ``import onnxruntime``, session
creation, ``session.run`` on the whole batch; and ``import hwjax.onnx``, ``load``, the
first ``Model.run`` (tracing and XLA compilation included). ``--no-first-result`` skips it.

Threads: as ``python -m hwjax.bench deployed``, the benchmark re-runs itself in a child
process with ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` pinned to one CPU, so that
ONNX Runtime and XLA both run on one core; ``--jax-threads all`` keeps XLA's default
thread pool (ONNX Runtime stays on one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from hwjax.bench._deployed import _ONE_THREAD_FLAG, _one_core, time_interleaved

_CHILD_ENV = "HWJAX_BENCH_ONNX_CHILD"
IN_SHAPE = (3, 32, 32)

#: quantize_static settings: (format, activation type, weight type, per_channel)
SETTINGS = {
    "qoperator": ("QOperator", "uint8", "int8", False),
    "qdq": ("QDQ", "uint8", "int8", True),
}


# ------------------------------------------------------------------------------ the model


def float_cnn(seed: int = 0):
    """The float CNN of the module docstring (``onnx.ModelProto``, batch axis ``N``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    def node(op, ins, name, **attrs):
        nodes.append(helper.make_node(op, ins, [name], name=name, **attrs))
        return name

    def conv_relu(x, name, cin, cout, k, stride=1, group=1, relu=True):
        w = rng.normal(0, 1 / np.sqrt(k * k * cin / group), (cout, cin // group, k, k))
        b = rng.normal(0, 0.1, cout)
        y = node(
            "Conv",
            [x, init(name + "_w", w), init(name + "_b", b)],
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[k // 2] * 4,
            group=group,
        )
        return node("Relu", [y], name + "_relu") if relu else y

    x = conv_relu("input", "conv1", 3, 16, 3, stride=2)  # 16 x 16 x 16
    x = conv_relu(x, "dw1", 16, 16, 3, group=16)
    x = conv_relu(x, "pw1", 16, 32, 1)
    x = conv_relu(x, "dw2", 32, 32, 3, stride=2, group=32)  # 32 x 8 x 8
    x = conv_relu(x, "pw2", 32, 64, 1)
    r = conv_relu(x, "res", 64, 64, 1)
    x = node("Add", [x, r], "add")
    x = node("GlobalAveragePool", [x], "gap")
    x = node("Flatten", [x], "flatten", axis=1)
    w = rng.normal(0, 1 / 8, (10, 64))
    x = node("Gemm", [x, init("fc_w", w), init("fc_b", rng.normal(0, 0.1, 10))], "fc", transB=1)
    graph = helper.make_graph(
        nodes,
        "bench_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *IN_SHAPE])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


class _Calibration:
    def __init__(self, batches):
        self.it = iter(batches)

    def get_next(self):
        b = next(self.it, None)
        return None if b is None else {"input": b}

    def rewind(self):  # pragma: no cover
        pass


def build(setting: str, seed: int = 0) -> bytes:
    """The int8 model of ``setting`` (a key of :data:`SETTINGS`): :func:`float_cnn` quantised
    by ``quantize_static`` with 8 seeded random calibration batches of 4 images."""
    import logging

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    fmt, act, wt, per_channel = SETTINGS[setting]
    qt = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    rng = np.random.default_rng(seed + 1)
    calib = [rng.normal(0, 1, (4, *IN_SHAPE)).astype(np.float32) for _ in range(8)]
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice on pre-processing
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        with open(src, "wb") as f:
            f.write(float_cnn(seed).SerializeToString())
        quantize_static(
            src,
            dst,
            _Calibration(calib),
            quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
            activation_type=qt[act],
            weight_type=qt[wt],
            per_channel=per_channel,
        )
        with open(dst, "rb") as f:
            return f.read()


def ort_session(data: bytes):
    """An ONNX Runtime CPU session of ``data`` on one thread (intra- and inter-op), ``ORT_ENABLE_ALL``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int32) if a.dtype == np.float32 else a.astype(np.int64)


def differing(got, want) -> int:
    """How many values of ``got`` differ from ``want`` as bits (all of them if the shapes or
    dtypes differ); 0 means bit-identical."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size)
    return int((_bits(got) != _bits(want)).sum())


# ------------------------------------------------------------------------------ first result

_FIRST_ORT = """
import time; t0 = time.perf_counter()
import sys, json, numpy as np
import onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL; so.log_severity_level = 3
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
y = s.run(None, {s.get_inputs()[0].name: np.load(sys.argv[2])})[0]
t3 = time.perf_counter()
print(json.dumps([t3 - t0, t1 - t0, t2 - t1, t3 - t2]))
"""

_FIRST_HWJAX = """
import time; t0 = time.perf_counter()
import sys, json, numpy as np
import jax, hwjax.onnx
t1 = time.perf_counter()
m = hwjax.onnx.load(sys.argv[1])
t2 = time.perf_counter()
y = np.asarray(m.run(np.load(sys.argv[2]), runtime="onnxruntime"))
t3 = time.perf_counter()
print(json.dumps([t3 - t0, t1 - t0, t2 - t1, t3 - t2]))
"""


def first_result(data: bytes, x: np.ndarray) -> dict:
    """``{"onnxruntime"|"hwjax": [total, import, load, first run]}`` seconds, each measured
    in a fresh process (this one's environment without a persistent JAX compilation cache;
    its CPU affinity), from before its first import to the first output for ``x``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    res = {}
    with tempfile.TemporaryDirectory() as d:
        mp, xp = os.path.join(d, "m.onnx"), os.path.join(d, "x.npy")
        with open(mp, "wb") as f:
            f.write(data)
        np.save(xp, x)
        for name, script in (("onnxruntime", _FIRST_ORT), ("hwjax", _FIRST_HWJAX)):
            r = subprocess.run([sys.executable, "-c", script, mp, xp], capture_output=True, text=True, env=env)
            if r.returncode:
                raise RuntimeError(f"first-result process ({name}) failed:\n{r.stderr[-2000:]}")
            res[name] = json.loads(r.stdout.strip().splitlines()[-1])
    return res


# ------------------------------------------------------------------------------ run


def bench(settings, batch: int, repeats: int, *, min_time: float = 0.2, seed: int = 0, first: bool = True, out=print):
    """Checks and times every setting; returns ``{setting: {"ips": {candidate: images/s},
    "diff": {candidate: differing values}, "first": first_result(...) or None}}`` and prints
    one table per setting."""
    import jax

    import hwjax.onnx as ho

    results = {}
    for setting in settings:
        data = build(setting, seed)
        model = ho.load(data)
        sess = ort_session(data)
        name = sess.get_inputs()[0].name
        x = np.random.default_rng(seed + batch).normal(0, 1, (batch, *IN_SHAPE)).astype(np.float32)
        xd = jax.device_put(x)
        ones = [x[i : i + 1] for i in range(batch)]

        def ort_loop():
            return np.concatenate([sess.run(None, {name: xi})[0] for xi in ones])

        def ort_batched():
            return sess.run(None, {name: x})[0]

        model.lowered("onnxruntime")  # lowered (and cached) outside the trace
        hw = jax.jit(lambda v: model.run(v, runtime="onnxruntime"))
        want = ort_loop()
        diff = {
            "onnxruntime batch-1": 0,
            "onnxruntime batched": differing(ort_batched(), want),
            "hwjax": differing(hw(xd), want),  # compiles; checked before any timing
        }
        fns = {
            "onnxruntime batch-1": ort_loop,
            "onnxruntime batched": ort_batched,
            "hwjax": lambda: jax.block_until_ready(hw(xd)),
        }
        ips = {k: batch / s for k, s in time_interleaved(fns, repeats, min_time).items()}
        fr = first_result(data, x) if first else None
        ops = sorted({n.op for n in model.graph.nodes})
        out(f"\n[{setting}] {SETTINGS[setting]}, input {IN_SHAPE}, batch {batch}; hwjax graph: {', '.join(ops)}")
        out(f"  {'candidate':22s} {'images/s':>11s}  bit-identical to onnxruntime batch-1")
        for k in fns:
            ex = "reference" if k == "onnxruntime batch-1" else ("True" if diff[k] == 0 else "")
            if diff[k]:
                ex = f"MISMATCH: {diff[k]} of {want.size} values differ"
            out(f"  {k:22s} {ips[k]:11,.0f}  {ex}")
        for k in ("onnxruntime batch-1", "onnxruntime batched"):
            out(f"  ratio hwjax / {k:20s} {ips['hwjax'] / ips[k]:6.2f}x")
        if fr:
            out(f"  time to first result in a fresh process (batch {batch}): total = import + load + first run")
            for k, (tot, imp, ld, run) in fr.items():
                out(f"    {k:12s} {tot:6.2f} s = {imp:5.2f} + {ld:5.2f} + {run:5.2f}")
        results[setting] = {"ips": ips, "diff": diff, "first": fr}
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m hwjax.bench onnx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=256, help="images per batch (default 256)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, among {list(SETTINGS)}")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (best sample is kept)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed sample (default 0.2)")
    ap.add_argument("--quick", action="store_true", help="batch 16, 2 repeats of 0.05 s (a smoke run)")
    ap.add_argument("--no-first-result", action="store_true", help="skip the fresh-process time to first result")
    ap.add_argument(
        "--jax-threads",
        choices=("1", "all"),
        default="1",
        help="XLA CPU threads: 1 (default: a child process with " + _ONE_THREAD_FLAG + ", pinned to one CPU), all",
    )
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        ap.error(f"unknown settings {bad}; choose among {list(SETTINGS)}")
    if args.jax_threads == "1" and os.environ.get(_CHILD_ENV) != "1":
        env = dict(os.environ)
        env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), _ONE_THREAD_FLAG) if f)
        env[_CHILD_ENV] = "1"
        r = subprocess.run([sys.executable, "-m", "hwjax.bench", "onnx", *argv], env=env, preexec_fn=_one_core)
        return r.returncode

    import jax
    import onnxruntime

    batch = 16 if args.quick else args.batch
    repeats, min_time = (2, 0.05) if args.quick else (args.repeats, args.min_time)
    flags = os.environ.get("XLA_FLAGS", "")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    threads = (
        ("1 thread" if _ONE_THREAD_FLAG in flags else "XLA default thread pool")
        + (f" (XLA_FLAGS={flags})" if flags else "")
        + (f", pinned to CPU {cores[0]}" if cores is not None and len(cores) == 1 else "")
    )
    print(
        f"device: {jax.devices()[0].platform}, {os.cpu_count()} CPUs visible, load average "
        f"{os.getloadavg()[0]:.1f}; onnxruntime {onnxruntime.__version__} (CPU provider, intra_op 1, inter_op 1, "
        f"ORT_ENABLE_ALL); JAX: {threads}; best of {repeats} interleaved rounds"
    )
    results = bench(settings, batch, repeats, min_time=min_time, first=not args.no_first_result)
    exact = all(r["diff"]["hwjax"] == 0 for r in results.values())
    print(f"\nall hwjax outputs bit-identical to onnxruntime (batch-1): {exact}")
    if not exact:
        print("MISMATCH: hwjax differs from onnxruntime (see the tables above)", file=sys.stderr)
    return 0 if exact else 1
