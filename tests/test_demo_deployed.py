"""``python -m train deployed`` (train/_deployed.py), the deployed-model demo, on a short run.

Oracle: LiteRT's stored outputs on the held-out digits (``tests/data/keras/digits_cnn.npz``,
``scripts/keras_digits.py``) for the original file's accuracy, and LiteRT itself on the tuned
file the demo writes.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from train.__main__ import main

KERAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "keras")
N = 64


@pytest.mark.slow
def test_demo_runs_and_reports_what_litert_computes(tmp_path, capsys):
    z = np.load(os.path.join(KERAS, "digits_cnn.npz"))
    from train._data import digits
    from train._deployed import quantise

    import hwjax.tflite as tfl

    info = tfl.load(os.path.join(KERAS, "digits_cnn.tflite")).inputs[0]
    x = quantise(digits().x_test, float(info.scale.reshape(-1)[0]), int(info.zero_point.reshape(-1)[0]))
    np.testing.assert_array_equal(x, z["x"])  # the demo's held-out inputs are the stored ones

    argv = ["deployed", "--runtime", "reference", "--runtimes", "reference", "--epochs", "1", "--batch-size", "16"]
    main([*argv, "--limit", str(N), "--lr", "0.003", "--out", str(tmp_path), "--quiet"])
    text = capsys.readouterr().out
    assert f"{N} held-out images" in text, text
    row = re.search(r"^\s+reference\s+(\d\.\d{4})\s+(\d\.\d{4})\s+(\d+)$", text, re.M)
    assert row, text
    y = z["y"][:N]
    assert row.group(1) == f"{np.mean(z['y_reference'][:N].argmax(axis=1) == y):.4f}"
    assert re.search(
        rf"on reference it computes the trained modules' outputs: 0 of {N * 10} values differ \(exact\)", text
    )
    tuned = tmp_path / "digits_cnn.reference.tflite"
    pytest.importorskip("ai_edge_litert")
    from hwjax.tflite.testing import run_litert

    litert = run_litert(tuned.read_bytes(), z["x"][:N], "reference")
    assert row.group(2) == f"{np.mean(litert.argmax(axis=1) == y):.4f}"
    assert int(row.group(3)) == int(np.sum(litert.argmax(axis=1) != z["y_reference"][:N].argmax(axis=1)))


def test_demo_bad_options_exit_naming_the_option(tmp_path, capsys):
    for extra, word in [
        (["--runtimes", "reference,tpu"], "--runtimes"),
        (["--model", str(tmp_path / "none.tflite")], "--model"),
        (["--model", os.path.join(KERAS, "mlp_sigmoid.tflite")], "--model"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["deployed", "--out", str(tmp_path), *extra])
        assert word in str(e.value.code), extra
    with pytest.raises(SystemExit) as e:
        main(["deployed", "--epochs", "0"])
    assert e.value.code == 2 and "--epochs" in capsys.readouterr().err
