"""``hwjax run`` and ``hwjax compare`` on ``.onnx`` files (hwjax/cli), checked against ONNX
Runtime's outputs stored on three x86 CPUs (tests/data/onnx, scripts/onnx_cpu_outputs.py):
``onnxruntime`` (VNNI), ``onnxruntime-avx2`` (Haswell under qemu) and ``onnxruntime-sse``
(Nehalem under qemu)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")

from train.__main__ import main

DATA = os.path.join(os.path.dirname(__file__), "data", "onnx")
RUNTIME = {"native": "onnxruntime", "haswell": "onnxruntime-avx2", "nehalem": "onnxruntime-sse"}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A stored QLinearConv case whose AVX2 outputs differ from the VNNI ones (pairs of
    products saturating to int16): the model, its input, ONNX Runtime's outputs per CPU."""
    stored = {}
    for cpu in RUNTIME:
        path = os.path.join(DATA, f"{cpu}.npz")
        if not os.path.exists(path):
            pytest.skip(f"{path} is absent (scripts/onnx_cpu_outputs.py writes it)")
        stored[cpu] = np.load(path)
    names = sorted({k.split("/")[0] for k in stored["native"].files if k.startswith("qlinearconv")})
    name = next(n for n in names if np.any(stored["native"][f"{n}/y"] != stored["haswell"][f"{n}/y"]))
    d = tmp_path_factory.mktemp("onnx_cli")
    (d / "m.onnx").write_bytes(stored["native"][f"{name}/model"].tobytes())
    np.save(d / "x.npy", stored["native"][f"{name}/x"])
    return d, {cpu: stored[cpu][f"{name}/y"] for cpu in RUNTIME}


@pytest.mark.parametrize("cpu", sorted(RUNTIME))
def test_run_writes_what_onnxruntime_computed_on_that_cpu(case, cpu, capsys):
    d, ys = case
    out = d / f"y_{cpu}.npy"
    main(["run", str(d / "m.onnx"), "--input", str(d / "x.npy"), "--runtime", RUNTIME[cpu], "--output", str(out)])
    assert f"({RUNTIME[cpu]})" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out), ys[cpu])


def test_run_defaults_to_onnxruntime(case, capsys):
    d, ys = case
    main(["run", str(d / "m.onnx"), "--input", str(d / "x.npy"), "--output", str(d / "y.npy")])
    assert "(onnxruntime)" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(d / "y.npy"), ys["native"])


def test_compare_counts_the_cpus_differences(case, capsys):
    """The output row of ``compare --json``: per CPU, the number of values (and the largest
    difference) where ONNX Runtime's stored outputs on that CPU differ from the VNNI ones."""
    d, ys = case
    js = d / "c.json"
    main(["compare", str(d / "m.onnx"), "--input", str(d / "x.npy"), "--json", str(js)])
    table = capsys.readouterr().out
    assert "onnxruntime-avx2" in table and "onnxruntime-sse" in table
    data = json.loads(js.read_text())
    assert data["reference"] == "onnxruntime"
    row = data["tensors"][-1]
    for cpu in ("haswell", "nehalem"):
        diff = np.abs(ys[cpu].astype(np.int64) - ys["native"].astype(np.int64))
        assert row["differ"][RUNTIME[cpu]] == int(np.count_nonzero(diff))
        assert row["max_abs"][RUNTIME[cpu]] == int(diff.max())
    assert row["differ"]["onnxruntime-avx2"] > 0  # the case is exercised


@pytest.mark.parametrize(
    "argv, word",
    [
        (["run", "--runtime", "xs3"], "--runtime"),
        (["compare", "--runtimes", "onnxruntime,reference"], "--runtimes"),
        (["compare", "--reference", "reference"], "--reference"),
        (["finetune", "--data", "x.npz", "--out", "t.tflite"], "--out"),
        (["finetune", "--data", "x.npz", "--out", "t.onnx", "--runtime", "reference"], "--runtime"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(case, capsys, argv, word):
    d, _ = case
    cmd, rest = argv[0], argv[1:]
    extra = [] if cmd == "finetune" else ["--input", str(d / "x.npy")]
    with pytest.raises(SystemExit) as e:
        main([cmd, str(d / "m.onnx"), *extra, *rest])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and word in err, err


def test_unknown_suffix_is_refused(tmp_path, capsys):
    (tmp_path / "m.pb").write_bytes(b"x")
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.int8))
    with pytest.raises(SystemExit) as e:
        main(["run", str(tmp_path / "m.pb"), "--input", str(tmp_path / "x.npy")])
    assert e.value.code == 2 and ".tflite, .onnx" in capsys.readouterr().err


def test_without_the_onnx_package_one_line_names_it(case, capsys, monkeypatch):
    d, _ = case
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(SystemExit) as e:
        main(["run", str(d / "m.onnx"), "--input", str(d / "x.npy")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs the 'onnx' package" in err, err
