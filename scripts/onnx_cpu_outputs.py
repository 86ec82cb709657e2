"""Stored ONNX Runtime outputs on other x86 CPUs, for tests/test_onnx_cpus.py.

Run under user-mode emulation of the CPU (Debian's ``qemu-user``), from the repository root:

    qemu-x86_64 -cpu Haswell .venv/bin/python scripts/onnx_cpu_outputs.py haswell
    qemu-x86_64 -cpu Nehalem .venv/bin/python scripts/onnx_cpu_outputs.py nehalem
    qemu-x86_64 -cpu Haswell .venv/bin/python scripts/onnx_cpu_outputs.py haswell_x64
    qemu-x86_64 -cpu Haswell .venv/bin/python scripts/onnx_cpu_outputs.py haswell_tuned
    qemu-x86_64 -cpu Nehalem .venv/bin/python scripts/onnx_cpu_outputs.py nehalem_tuned

``-cpu Haswell`` is AVX2 + FMA3 without VNNI (the u8 x s8 kernels saturate pairs of products
to int16), ``-cpu Nehalem`` SSE4.2 only (no FMA: another logistic). Each run writes
``tests/data/onnx/<name>.npz``: for every case its model bytes, input batch and ONNX Runtime's
output (one thread, ORT_ENABLE_ALL). Cases: models built to saturate (uint8 inputs near 255
against large int8 weights: QLinearConv with odd channel counts, groups, padding, depthwise;
QLinearMatMul, QGemm, MatMulInteger, ConvInteger), every-code QLinearSigmoid tables, and the
random QOperator models of tests/randonnx.py. ``haswell_x64`` sets the session option
``session.x64quantprecision`` (ONNX Runtime then rewrites int8 weights as uint8 on this CPU)
and runs the saturating cases, the same QLinearMatMul / MatMulInteger cases in opset 21, and
quantize_static's u8s8 QDQ models of tests/randonnx.py. ``haswell_tuned`` / ``nehalem_tuned``
run the models of ``tests/data/onnx/tuned_models.npz`` fine-tuned for that CPU (written natively
by scripts/onnx_tuned_models.py).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from onnx import TensorProto, helper, numpy_helper

from tests import randonnx as R

MS = "com.microsoft"


def _model(nodes, inits, inputs, output, out_type, opset: int = 13):
    g = helper.make_graph(
        nodes,
        "m",
        inputs,
        [helper.make_tensor_value_info(output, out_type, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8 if opset < 21 else 10
    return m.SerializeToString()


def saturating_cases(rng, opset: int = 13):
    """``(name, model bytes, input)`` of u8 x s8 linear ops whose pairs of products overflow
    int16; with ``opset`` 21 the matrix products only (QLinearConv did not change there)."""
    cases = []
    for i in range(12 if opset < 21 else 0):
        c = int(rng.choice([1, 3, 4, 5, 8]))
        h, w = int(rng.integers(3, 8)), int(rng.integers(3, 8))
        k = int(rng.choice([1, 2, 3]))
        g = int(rng.choice([g_ for g_ in (1, 1, c) if c % g_ == 0]))
        o = g * int(rng.choice([1, 2, 3])) if g > 1 else int(rng.integers(1, 20))
        pads = [int(rng.integers(0, k)) for _ in range(4)]
        W = rng.integers(-128, 128, (o, c // g, k, k)).astype(np.int8)
        W[W > 0] = np.int8(127)
        W[W < 0] = np.int8(-128 + int(rng.integers(0, 3)))
        xz = np.uint8(rng.choice([0, 128, 200]))
        wz = np.int8(0)
        x = rng.integers(200, 256, (4, c, h, w)).astype(np.uint8)
        inp = [helper.make_tensor_value_info("X", TensorProto.UINT8, ["N", c, h, w])]
        attrs = dict(kernel_shape=[k, k], pads=pads, group=g)
        if i % 3 == 2:
            inits = {"W": W, "xz": xz, "wz": wz}
            node = helper.make_node("ConvInteger", ["X", "W", "xz", "wz"], ["Y"], **attrs)
            cases.append((f"convinteger{i}", _model([node], inits, inp, "Y", TensorProto.INT32), x))
            continue
        inits = {
            "xs": np.float32(0.02),
            "xz": xz,
            "W": W,
            "ws": np.float32(np.exp(rng.uniform(-8, -5, o))) if i % 2 else np.float32(2.0**-7),
            "wz": wz,
            "ys": np.float32(rng.choice([4.0, 16.0, 37.5])),
            "yz": np.uint8(128),
            "B": rng.integers(-5000, 5000, o).astype(np.int32),
        }
        node = helper.make_node("QLinearConv", ["X", "xs", "xz", "W", "ws", "wz", "ys", "yz", "B"], ["Y"], **attrs)
        cases.append((f"qlinearconv{i}", _model([node], inits, inp, "Y", TensorProto.UINT8), x))
    for i in range(6):
        kk, n = int(rng.choice([7, 16, 33, 64])), int(rng.integers(1, 24))
        W = np.where(rng.random((kk, n)) < 0.5, 127, -128).astype(np.int8)
        x = rng.integers(180, 256, (5, kk)).astype(np.uint8)
        inp = [helper.make_tensor_value_info("X", TensorProto.UINT8, ["N", kk])]
        az = np.uint8(rng.choice([0, 100]))
        if i % 3 == 0:
            node = helper.make_node("MatMulInteger", ["X", "W", "az", "wz"], ["Y"])
            model = _model([node], {"W": W, "az": az, "wz": np.int8(0)}, inp, "Y", TensorProto.INT32, opset)
        elif i % 3 == 1:
            inits = {"as": np.float32(0.05), "az": az, "W": W, "ws": np.float32(0.01), "wz": np.int8(0)}
            inits.update({"ys": np.float32(rng.choice([2.0, 9.0])), "yz": np.uint8(128)})
            node = helper.make_node("QLinearMatMul", ["X", "as", "az", "W", "ws", "wz", "ys", "yz"], ["Y"])
            model = _model([node], inits, inp, "Y", TensorProto.UINT8, opset)
        else:
            inits = {"as": np.float32(0.05), "az": az, "W": np.ascontiguousarray(W.T), "ws": np.float32(0.01)}
            inits.update({"wz": np.int8(0), "C": np.zeros(n, np.int32), "ys": np.float32(5.0), "yz": np.uint8(128)})
            ins = ["X", "as", "az", "W", "ws", "wz", "C", "ys", "yz"]
            node = helper.make_node("QGemm", ins, ["Y"], domain=MS, transB=1)
            model = _model([node], inits, inp, "Y", TensorProto.UINT8, opset)
        cases.append((f"matmul{i}" if opset < 21 else f"opset21_matmul{i}", model, x))
    return cases


def sigmoid_cases(rng):
    """QLinearSigmoid on every code, for parameter sets where MLAS's FMA3 and SSE logistic
    tables can differ."""
    cases = []
    for i in range(8):
        dt = "uint8" if i % 2 == 0 else "int8"
        et, npt = (TensorProto.UINT8, np.uint8) if dt == "uint8" else (TensorProto.INT8, np.int8)
        lo = 0 if dt == "uint8" else -128
        inits = {
            "xs": np.float32(np.exp(rng.uniform(-5, -2))),
            "xz": npt(rng.integers(lo, lo + 256)),
            "ys": np.float32(np.exp(rng.uniform(-12, -8))),
            "yz": npt(lo),
        }
        node = helper.make_node("QLinearSigmoid", ["X", "xs", "xz", "ys", "yz"], ["Y"], domain=MS)
        inp = [helper.make_tensor_value_info("X", et, [1, 256])]
        x = np.arange(lo, lo + 256).astype(npt).reshape(1, 256)
        cases.append((f"sigmoid{i}", _model([node], inits, inp, "Y", et), x))
    return cases


def main(name: str) -> None:
    rng = np.random.default_rng(2024)
    config = {}
    if name.endswith("_tuned"):
        runtime = {"haswell_tuned": "onnxruntime-avx2", "nehalem_tuned": "onnxruntime-sse"}[name]
        z = np.load(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "onnx", "tuned_models.npz")
        )
        cases = [
            (k[: -len("/model")], z[k].tobytes(), z[k[: -len("/model")] + "/x"])
            for k in sorted(z.files)
            if k.endswith(f"-{runtime}/model")
        ]
    elif name == "haswell_x64":
        config = {"session.x64quantprecision": "1"}
        cases = saturating_cases(rng) + saturating_cases(np.random.default_rng(2025), opset=21)
        for seed in range(6):
            data, x, _ = R.model(seed, ("QDQ", "uint8", "int8", bool(seed % 2)))
            cases.append((f"qdq{seed}", data, x[:4] * np.float32(8)))  # large activations: pairs saturate
    else:
        cases = saturating_cases(rng) + sigmoid_cases(rng)
        for seed in range(20):
            data, x, _ = R.qop_model(seed)
            cases.append((f"qop{seed}", data, x[:4]))
    out = {}
    for case, data, x in cases:
        y = R.ort_run(data, x, config=config)
        out[f"{case}/model"] = np.frombuffer(data, np.uint8)
        out[f"{case}/x"] = x
        out[f"{case}/y"] = y
        print(case, y.dtype, y.shape, flush=True)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "onnx", f"{name}.npz")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez_compressed(path, **out)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
