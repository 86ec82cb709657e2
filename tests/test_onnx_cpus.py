"""hwjax.onnx's CPU option against ONNX Runtime's outputs stored on other x86 CPUs.

tests/data/onnx/<name>.npz hold models, inputs and ONNX Runtime's outputs, written by
scripts/onnx_cpu_outputs.py: ``native`` on an AVX-512 VNNI / AMX machine, ``haswell`` and
``nehalem`` under ``qemu-x86_64 -cpu Haswell`` (AVX2 + FMA3, no VNNI) and ``-cpu Nehalem``
(SSE4.2), ``haswell_x64`` on Haswell with the session option ``session.x64quantprecision``.
Each file is matched bit for bit by the target of its CPU, and the files show that the CPUs
(and the option) differ, so the match is not vacuous.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnx")

import hwjax.onnx as ho
import hwjax.targets as T
from hwjax.errors import UnsupportedOpError

DATA = os.path.join(os.path.dirname(__file__), "data", "onnx")
CPUS = {"native": "vnni", "haswell": "avx2", "nehalem": "sse"}


def _cases(name):
    path = os.path.join(DATA, f"{name}.npz")
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent (scripts/onnx_cpu_outputs.py writes it)")
    z = np.load(path)
    names = sorted({k.split("/")[0] for k in z.files})
    return [(n, z[f"{n}/model"].tobytes(), z[f"{n}/x"], z[f"{n}/y"]) for n in names]


def _bits(a):
    a = np.asarray(a)
    return a.view(np.int32) if a.dtype == np.float32 else a.astype(np.int64)


def _check(name, prefixes=None, target=None) -> int:
    """Runs every stored case of ``name`` (those starting with ``prefixes``) on ``target``
    (default: the target of its CPU); returns how many ran (hwjax refuses some QDQ models)."""
    target = target or T.get("onnxruntime", cpu=CPUS[name])
    ran = 0
    for case, data, x, y in _cases(name):
        if prefixes is not None and not case.startswith(prefixes):
            continue
        try:
            model = ho.load(data)
        except UnsupportedOpError:
            assert case.startswith("qdq"), case  # only quantize_static's models may be refused
            continue
        got = np.asarray(model.run(x, runtime=target))
        bad = int((_bits(got) != _bits(y)).sum())
        assert bad == 0, f"{name} {case}: {bad} of {y.size} values differ"
        ran += 1
    return ran


def test_haswell_saturating_sample():
    """AVX2 without VNNI: u8 x s8 QLinearConv / QLinearMatMul / QGemm / MatMulInteger whose
    pairs of products overflow int16, and ConvInteger (exact there)."""
    _check("haswell", ("qlinearconv", "matmul", "convinteger1"))


def test_nehalem_sigmoid_tables():
    """SSE4.2: QLinearSigmoid's table from MLAS's logistic without FMA."""
    _check("nehalem", ("sigmoid",))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CPUS))
def test_stored_cpu_outputs(name):
    """Every stored case (the random QOperator models included) on each CPU."""
    _check(name)


def test_x64quantprecision_on_haswell():
    """``session.x64quantprecision`` on an AVX2 CPU without VNNI: the saturating cases (opset
    13) and quantize_static's u8s8 QDQ models are exact there, while QLinearMatMul of opset
    21, which ONNX Runtime's rewrite does not match, still saturates; ``x64quantprecision=True``
    matches every stored output."""
    target = T.get("onnxruntime", cpu="avx2", x64quantprecision=True)
    assert _check("haswell_x64", target=target) >= 20
    x64 = {c: y for c, _, _, y in _cases("haswell_x64")}
    plain = {c: y for c, _, _, y in _cases("haswell")}
    native = {c: y for c, _, _, y in _cases("native")}
    sat = [c for c in plain if c.startswith(("qlinearconv", "matmul"))]
    assert all(np.array_equal(x64[c], native[c]) for c in sat)  # exact with the option
    assert sum(int((x64[c] != plain[c]).sum()) for c in sat) > 0  # and not without it
    differ = sum(
        int((np.asarray(ho.load(data).run(x)) != y).sum())
        for c, data, x, y in _cases("haswell_x64")
        if c.startswith("opset21")
    )
    assert differ > 0  # opset 21: some products still saturate under the option


def test_the_cpus_differ():
    """The Haswell outputs of the saturating cases differ from the native ones, and the
    Nehalem sigmoid tables from the Haswell ones (each CPU's data can tell the targets apart)."""
    runs = {}
    for name in CPUS:
        runs[name] = {c: y for c, _, _, y in _cases(name)}
    sat = [c for c in runs["native"] if c.startswith(("qlinearconv", "convinteger", "matmul"))]
    assert sum(int((runs["native"][c] != runs["haswell"][c]).sum()) for c in sat) > 0
    sig = [c for c in runs["native"] if c.startswith("sigmoid")]
    assert sum(int((runs["haswell"][c] != runs["nehalem"][c]).sum()) for c in sig) > 0


TUNED = {"haswell_tuned": "avx2", "nehalem_tuned": "sse"}


@pytest.mark.parametrize("name", sorted(TUNED))
def test_models_finetuned_for_an_older_cpu(name):
    """Models fine-tuned in an AVX2 / SSE CPU's arithmetic and saved
    (scripts/onnx_tuned_models.py): ONNX Runtime on that CPU computes exactly the trained
    modules' outputs, and so does ``Model.run`` on its target. On a VNNI machine the AVX2-tuned
    files compute other values (the CPU's arithmetic is what was trained in)."""
    path = os.path.join(DATA, "tuned_models.npz")
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent (scripts/onnx_tuned_models.py writes it)")
    trained = np.load(path)
    cases = _cases(name)
    assert _check(name, target=T.get("onnxruntime", cpu=TUNED[name])) == len(cases) == 3
    for case, _, _, y in cases:
        assert np.array_equal(_bits(trained[f"{case}/trained"]), _bits(y)), case
    if TUNED[name] == "avx2":
        assert sum(int((_bits(ho.load(d).run(x)) != _bits(y)).sum()) for _, d, x, y in cases) > 0


def test_saved_opset21_matmul_keeps_its_saturation_under_x64quantprecision():
    """An opset-21 QLinearMatMul, which ``session.x64quantprecision`` does not rewrite, is
    saved at opset 21 (at 13 ONNX Runtime would rewrite it): the saved file, read again,
    still computes the outputs ONNX Runtime computed on Haswell with the option."""
    target = T.get("onnxruntime", cpu="avx2", x64quantprecision=True)
    ran = 0
    for case, data, x, y in _cases("haswell_x64"):
        if not case.startswith("opset21"):
            continue
        m = ho.load(data)
        kept = [n for n in m.graph.nodes if n.op == "qlinear_matmul" and not n.attrs.get("x64_u8_weights", True)]
        if not kept:
            continue
        again = ho.load(ho.save(m))
        assert [n.attrs.get("x64_u8_weights", True) for n in again.graph.nodes if n.op == "qlinear_matmul"] == [
            False
        ] * len(kept)
        assert np.array_equal(_bits(again.run(x, runtime=target)), _bits(y)), case
        ran += 1
    assert ran > 0
