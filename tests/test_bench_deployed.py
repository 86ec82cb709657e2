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
            "--jax-threads", "all", "--models", "mlp", "--batches", "3", "--repeats", "1", "--min-time", "0.001",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all hwjax outputs bit-exact against LiteRT: True" in out
    assert "hwjax optimized" in out and "litert xnnpack" in out


@pytest.mark.slow
def test_mlperf_tiny(capsys):
    """One MLPerf Tiny model on one runtime: equal to its live LiteRT peer on the timed
    batch, timed against both LiteRT loops and resized batches, and its first result in
    three fresh processes (no cache, filling one, reading it)."""
    if not (D.mlperf_dir() / "ad01_int8.tflite").is_file():
        pytest.skip("tests/data/mlperf/ad01_int8.tflite is missing (scripts/mlperf_testdata.py)")
    args = ["--jax-threads", "all", "--models", "ad01_int8", "--runtimes", "xnnpack", "--batch", "8"]
    rc = D.main([*args, "--repeats", "1", "--min-time", "0.001"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all hwjax outputs equal to their peer's: True" in out
    lines = [line.strip() for line in out.splitlines()]
    row = next(line for line in lines if line.startswith("hwjax xnnpack"))
    assert "== LiteRT AUTO (XNNPACK) on all of 8" in row
    first = next(line for line in lines if line.startswith("xnnpack "))
    assert "== LiteRT AUTO (XNNPACK) (3 processes)" in first
    # the warm process loads the executable the first one stored: nothing compiled
    assert "no program compiled or read from JAX's cache (hwjax's stored executables)" in first
    for k in ("litert xnnpack loop", "litert optimized loop", "litert xnnpack batch", "litert optimized batch"):
        assert any(line.startswith(k) for line in lines), k
    summary = next(line for line in lines if line.startswith("ad01_int8"))
    assert "x" in summary and "(xnnpack)" in summary


def test_mlperf_unresizable():
    """A resize that changes the output is reported, not timed."""
    pytest.importorskip("ai_edge_litert")
    from hwjax.bench import _mlperf as M

    model = (
        (D.mlperf_dir() / "ad01_int8.tflite").read_bytes() if (D.mlperf_dir() / "ad01_int8.tflite").is_file() else None
    )
    if model is None:
        pytest.skip("tests/data/mlperf/ad01_int8.tflite is missing")
    x = np.zeros((3, 640), np.int8)
    want = M.Loop(model, "optimized")(x)
    call, note = M.resized(model, "optimized", x, want)
    assert call is not None and note == ""
    call, note = M.resized(model, "optimized", x, want + 1)
    assert call is None and "differs from the loop's on 3 of 3" in note


def test_mlperf_bad_option():
    with pytest.raises(SystemExit):
        D.main(["--jax-threads", "all", "--models", "no_such_model"])
    with pytest.raises(SystemExit):
        D.main(["--jax-threads", "all", "--runtimes", "xnnpack", "--first", "xs3"])
