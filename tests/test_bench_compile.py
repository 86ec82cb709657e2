"""Smoke test of ``python -m hwjax.bench compile`` on the MLP (the figures are in BENCHMARKS.md).
About 10 s of compiling: `make test-full` runs it."""

import pytest

from hwjax.bench import BENCHES


@pytest.mark.slow
def test_main_tiny(capsys):
    from hwjax.bench import _compile as C

    assert BENCHES["compile"] == "hwjax.bench._compile"
    assert C.main(["--model", "mlp", "--repeats", "1", "--batch-size", "4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("x")]
    names = [" ".join(r[:-3]) for r in rows]
    assert names == [
        "float forward (jit)",
        "float training step",
        "hardware forward (jit)",
        "hardware forward (jit, model closed over)",
        "hardware forward, lowered graph (jit_run)",
        "hardware training step",
    ]
    assert rows[0][-1] == "1.0x" and all(float(r[-3]) > 0 for r in rows)
