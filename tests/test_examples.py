"""The scripts in examples/ run to the end (each checks its own bit-exactness claims where
it makes one: finetune_tflite against LiteRT, train_for_xs3 against its export).

Marked ``slow`` (training runs, some 25 s in all): ``make test-full`` runs them."""

from __future__ import annotations

import os
import runpy

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
SCRIPTS = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))


def test_every_example_is_listed():
    assert SCRIPTS == ["finetune_tflite.py", "nvdla_sigmoid.py", "train_for_xs3.py", "xs3_conv2d_deep.py"]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script, tmp_path, monkeypatch, capsys):
    if script == "finetune_tflite.py":
        pytest.importorskip("ai_edge_litert")
    monkeypatch.chdir(tmp_path)  # files an example writes (a plot, an export) land here
    monkeypatch.setattr("sys.argv", [script])
    try:
        runpy.run_path(os.path.join(EXAMPLES, script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), f"{script} exited with {e.code}"
    assert capsys.readouterr().out.strip(), f"{script} printed nothing"
