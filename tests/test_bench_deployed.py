"""Smoke test of ``python -m hwjax.bench deployed`` at tiny sizes (the figures are in BENCHMARKS.md)."""

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

from hwjax.bench import BENCHES
from hwjax.bench import _deployed as D


def test_registered():
    assert BENCHES["deployed"] == "hwjax.bench._deployed"


def test_models_load():
    import hwjax.tflite as T

    for name, build in D.SHAPES.items():
        model_bytes, in_shape, note = build(np.random.default_rng(0))
        m = T.load(model_bytes)
        assert tuple(m.inputs[0].shape[1:]) == in_shape, name
        if name == "cnn":
            assert ("MEAN" in T.SUPPORTED_OPS) == (note == "global mean: MEAN")


def test_main_tiny(capsys):
    rc = D.main(
        [
            "--jax-threads", "all", "--shapes", "mlp", "--batches", "3", "--repeats", "1", "--min-time", "0.001",
            "--mlperf", "none",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all hwjax outputs bit-exact against LiteRT: True" in out
    assert "hwjax optimized" in out and "litert xnnpack" in out


def test_mlperf_tiny(capsys):
    """One MLPerf Tiny model on one runtime: exact on the stored runtime outputs, timed
    against both LiteRT loops, and its first result in two fresh processes (cold, warm)."""
    if not (D.mlperf_dir() / "ad01_int8.tflite").is_file():
        pytest.skip("tests/data/mlperf/ad01_int8.tflite is missing (scripts/mlperf_testdata.py)")
    args = ["--jax-threads", "all", "--shapes", "none", "--mlperf", "ad01_int8", "--runtimes", "xnnpack"]
    rc = D.main([*args, "--mlperf-batch", "8", "--mlperf-repeats", "1", "--min-time", "0.001"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all hwjax outputs equal to the stored runtime outputs: True" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("hwjax xnnpack"))
    assert "exact on the stored outputs; first result" in row and "warm cache" in row
    assert "litert xnnpack loop" in out and "litert optimized batch" in out


def test_mlperf_bad_option():
    with pytest.raises(SystemExit):
        D.main(["--jax-threads", "all", "--mlperf", "no_such_model"])
