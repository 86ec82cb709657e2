"""Smoke test of ``python -m hwjax.bench onnx`` at tiny sizes (the figures are in BENCHMARKS.md)."""

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import hwjax.onnx as ho
from hwjax.bench import BENCHES
from hwjax.bench import _onnx as B


def test_registered():
    assert BENCHES["onnx"] == "hwjax.bench._onnx"


def test_differing_counts_bits():
    a = np.array([1.0, -0.0, 2.0], np.float32)
    assert B.differing(a, a.copy()) == 0
    assert B.differing(a, np.array([1.0, 0.0, 2.0], np.float32)) == 1  # -0.0 and 0.0: other bits
    assert B.differing(a, a[:2]) == 3


def test_main_quick(capsys):
    rc = B.main(["--quick", "--settings", "qdq", "--jax-threads", "all", "--no-first-result"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all hwjax outputs bit-identical to onnxruntime (batch-1): True" in out
    assert "onnxruntime batched" in out and "ratio hwjax / onnxruntime batch-1" in out
    assert "MISMATCH" not in out


def test_a_mismatch_is_reported(capsys, monkeypatch):
    run = ho.Model.run
    monkeypatch.setattr(ho.Model, "run", lambda self, x, **kw: run(self, x, **kw) * 2)
    argv = ["--settings", "qoperator", "--batch", "2", "--repeats", "1", "--min-time", "0.001"]
    rc = B.main([*argv, "--jax-threads", "all", "--no-first-result"])
    cap = capsys.readouterr()
    assert rc == 1
    assert "MISMATCH: " in cap.out and "bit-identical to onnxruntime (batch-1): False" in cap.out
    assert "MISMATCH" in cap.err
