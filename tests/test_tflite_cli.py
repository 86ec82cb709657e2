"""``hwjax run`` and ``hwjax compare`` (train/__main__.py + hwjax/cli/_commands.py), called
in-process through ``main([...])`` and, for ``compare``'s ``--json`` / ``--plot``, as a
subprocess. Outputs are checked against LiteRT itself: ``run``'s
written outputs against LiteRT's, ``compare``'s per-tensor difference counts against
LiteRT's own intermediate tensors (``experimental_preserve_all_tensors``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

import hwjax.tflite as tfl
from hwjax.cli import _commands as _cli
from hwjax.tflite import testing as T
from train.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    rng = np.random.default_rng(7)
    d = tmp_path_factory.mktemp("cli")
    chain, shape = T.chain_model(rng, quantize=False)
    add, add_shape = T.add_model(rng, shape=(4, 4, 3), activation="relu6")
    (d / "chain.tflite").write_bytes(chain)
    (d / "add.tflite").write_bytes(add)
    fc, fc_shape = T.linear_model(rng, "FULLY_CONNECTED", in_shape=(21,), out_ch=7)
    (d / "fc.tflite").write_bytes(fc)
    np.save(d / "x_fc.npy", rng.integers(-128, 128, (5, *fc_shape)).astype(np.int8))
    mb = T.ModelBuilder()  # LOGISTIC writing zero point 0: TFLite Micro refuses it
    a, b = T.act_tensor(mb, rng, (16,)), T.act_tensor(mb, rng, (16,), scale=1 / 256, zp=0)
    mb.op("LOGISTIC", [a], [b])
    (d / "logistic.tflite").write_bytes(mb.finish([a], [b]))
    np.save(d / "x_logistic.npy", rng.integers(-128, 128, (5, 16)).astype(np.int8))
    x = rng.integers(-128, 128, (6, *shape)).astype(np.int8)
    x[0], x[1] = -128, 127
    np.save(d / "x.npy", x)
    np.save(d / "x_add.npy", rng.integers(-128, 128, (3, *add_shape)).astype(np.int8))
    return d, chain, x


@pytest.fixture(scope="module")
def wide_conv():
    """A conv with 9216 outputs for 4 examples: enough that the runtimes' roundings differ."""
    rng = np.random.default_rng(1)
    data, shape = T.linear_model(rng, "CONV_2D", in_shape=(12, 12, 4), out_ch=16)
    return data, rng.integers(-128, 128, (4, *shape)).astype(np.int8)


def _all_tensors(model: bytes, x: np.ndarray, resolver: str) -> dict[str, np.ndarray]:
    """Every tensor of ``model`` by name after LiteRT runs each example of ``x``."""
    it = Interpreter(
        model_content=model,
        num_threads=1,
        experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=getattr(OpResolverType, resolver),
    )
    it.allocate_tensors()
    inp = it.get_input_details()[0]["index"]
    out: dict[str, list] = {}
    for xi in x:
        it.set_tensor(inp, xi[None])
        it.invoke()
        for t in it.get_tensor_details():
            if len(t["shape"]) and t["shape"][0] == 1 and t["dtype"] == np.int8:
                out.setdefault(t["name"], []).append(it.get_tensor(t["index"])[0].copy())
    return {k: np.stack(v) for k, v in out.items()}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err


def test_run_writes_litert_outputs(files, capsys):
    d, chain, x = files
    y = d / "y.npy"
    assert (
        main(["run", str(d / "chain.tflite"), "--runtime", "xnnpack", "--input", str(d / "x.npy"), "--output", str(y)])
        == 0
    )
    got = np.load(y)
    assert got.dtype == np.int8 and got.shape == (6, 7)
    assert np.array_equal(got, T.run_litert(chain, x, "xnnpack"))
    out = capsys.readouterr().out
    assert "(xnnpack)" in out and "input (6, 9, 8, 3) int8" in out and "output (6, 7) int8" in out
    assert f"wrote {y}" in out


def test_run_on_xs3_equals_the_stored_host_interpreter_outputs(capsys, tmp_path):
    """``--runtime xs3`` on an xformer file gives what xmos' host interpreter gave."""
    import os

    data = os.path.join(os.path.dirname(__file__), "data", "xformer")
    d = np.load(os.path.join(data, "chain.npz"))
    np.save(tmp_path / "x.npy", d["x"])
    model = os.path.join(data, "chain.xc.tflite")
    assert (
        main(["run", model, "--runtime", "xs3", "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y")])
        == 0
    )
    assert np.array_equal(np.load(tmp_path / "y").reshape(d["y_xs3"].shape), d["y_xs3"])
    assert "(xs3)" in capsys.readouterr().out


def test_run_takes_one_example_without_batch_axis(files, capsys, tmp_path):
    d, chain, x = files
    np.save(tmp_path / "one.npy", x[3])
    assert (
        main(["run", str(d / "chain.tflite"), "--input", str(tmp_path / "one.npy"), "--output", str(tmp_path / "y")])
        == 0
    )
    assert np.array_equal(np.load(tmp_path / "y"), T.run_litert(chain, x[3:4], "reference"))
    assert "output (1, 7) int8" in capsys.readouterr().out


def test_compare_counts_match_litert_intermediates(files):
    """Per file tensor, the optimized-vs-reference difference counts and maxima are those
    of LiteRT's own intermediate tensors under the two resolvers."""
    d, chain, x = files
    model = _cli.read_model(d / "chain.tflite")
    c = _cli.compare(model, x, runtimes=("reference", "optimized"))
    assert c.reference == "reference" and [r.runtime for r in c.runtimes] == ["optimized"]
    assert [t for t, _ in c.tensors] == [n.outputs[0] for n in model.graph.nodes]
    ref = _all_tensors(chain, x, "BUILTIN_REF")
    opt = _all_tensors(chain, x, "BUILTIN_WITHOUT_DEFAULT_DELEGATES")
    layers = {ld.tensor: ld for ld in c.runtimes[0].layers}
    checked = 0
    for name in ref:
        if name in layers:
            diff = np.abs(opt[name].astype(np.int64) - ref[name])
            assert (layers[name].size, layers[name].differ, layers[name].max_abs) == (
                diff.size,
                np.count_nonzero(diff),
                diff.max(),
            ), name
            checked += 1
    assert checked == 5  # conv (relu6), depthwise, maxpool, reshape, fully connected


def test_compare_counts_match_litert_where_runtimes_differ(wide_conv):
    data, x = wide_conv
    c = _cli.compare(tfl.load(data), x, runtimes=("optimized", "xnnpack"))
    ref = T.run_litert(data, x, "reference").astype(np.int64)
    for r in c.runtimes:
        (ld,) = r.layers
        diff = np.abs(T.run_litert(data, x, r.runtime) - ref)
        assert (ld.size, ld.differ, ld.max_abs) == (diff.size, np.count_nonzero(diff), diff.max()), r.runtime
        assert ld.differ > 0 and ld.percent == 100.0 * ld.differ / ld.size
        cells = []
        for r2 in c.runtimes:
            ld2 = r2.layers[0]
            pct = f"{ld2.percent:.0f}" if ld2.percent >= 10 else f"{ld2.percent:.2g}"
            cells += [f"{ld2.differ}", f"({pct}%)", f"\u00b1{ld2.max_abs}"]
        assert _cli.format_compare(c).splitlines()[3].split()[3:] == cells


def test_compare_table(files, capsys):
    """The table through main: header, one row per tensor in graph order; a runtime that
    cannot run the model (TFLM: LOGISTIC writing zero point 0) listed as n/a with the reason."""
    d, _, _ = files
    rts = ["--runtimes", "reference,optimized,xnnpack,tflm"]
    assert main(["compare", str(d / "fc.tflite"), "--input", str(d / "x_fc.npy"), *rts]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("values that differ from reference's")
    assert lines[1].split() == ["#", "op", "tensor", "optimized", "xnnpack", "tflm"]
    model = _cli.read_model(d / "fc.tflite")
    rows = lines[3 : 3 + len(model.graph.nodes)]
    assert [ln.split()[:3] for ln in rows] == [
        [str(i), n.op, _cli.short_name(n.outputs[0])] for i, n in enumerate(model.graph.nodes)
    ]
    assert len(lines) == 3 + len(model.graph.nodes)
    assert main(["compare", str(d / "logistic.tflite"), "--input", str(d / "x_logistic.npy"), *rts]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["#", "op", "tensor", "optimized", "xnnpack"]
    assert lines[-1].startswith("tflm: n/a (") and "zero point" in lines[-1] and lines[-1].endswith(")")


def test_short_names_and_table_width():
    """TensorFlow's fused names shorten to their first name's last two parts; a table of
    every runtime over a converted model's long names stays within 100 columns."""
    assert _cli.short_name("functional_1/activation_1/Relu;functional_1/batch_normalization_1/FusedBatchNormV3") == (
        "activation_1/Relu"
    )
    assert _cli.short_name("StatefulPartitionedCall:0") == "StatefulPartitionedCall"
    long = _cli.short_name("a/" + "b" * 40 + "/Conv2D", 20)
    assert len(long) == 20 and long.startswith("...") and long.endswith("/Conv2D")
    model = tfl.load(os.path.join(os.path.dirname(__file__), "data", "keras", "cnn_branches.tflite"))
    tensors = _cli._tensors(model)
    worst = tuple(_cli.LayerDiff(t, op, 123456, 123456, 255) for t, op in tensors)
    c = _cli.Comparison(
        "reference", tensors, tuple(_cli.RuntimeDiff(r, worst) for r in ("optimized", "xnnpack", "tflm", "xs3"))
    )
    text = _cli.format_compare(c)
    assert max(map(len, text.splitlines())) <= _cli.TABLE_WIDTH == 100, text
    assert "123k (100%) \u00b1255" in text


def test_compare_json_and_plot_end_to_end(files, tmp_path):
    """``hwjax compare`` as a subprocess with ``--runtimes``, ``--json`` and ``--plot``: the
    JSON's counts are LiteRT's own intermediate tensors' differences; the PNG is written."""
    d, chain, x = files
    js, png = tmp_path / "c.json", tmp_path / "c.png"
    p = subprocess.run(
        [sys.executable, "-m", "train", "compare", str(d / "chain.tflite"), "--input", str(d / "x.npy"),
         "--runtimes", "optimized,xnnpack", "--json", str(js), "--plot", str(png)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"wrote {js}" in p.stdout and f"wrote {png}" in p.stdout
    data = json.loads(js.read_text())
    assert data["examples"] == len(x) and data["reference"] == "reference"
    assert [r["runtime"] for r in data["runtimes"]] == ["optimized", "xnnpack"]
    model = tfl.load(chain)
    assert [t["name"] for t in data["tensors"]] == [n.outputs[0] for n in model.graph.nodes]
    ref = _all_tensors(chain, x, "BUILTIN_REF")
    opt = _all_tensors(chain, x, "BUILTIN_WITHOUT_DEFAULT_DELEGATES")
    checked = 0
    for t in data["tensors"]:
        if t["name"] in ref:
            diff = np.abs(opt[t["name"]].astype(np.int64) - ref[t["name"]])
            assert (t["size"], t["differ"]["optimized"], t["max_abs"]["optimized"]) == (
                diff.size, np.count_nonzero(diff), diff.max()
            ), t["name"]  # fmt: skip
            checked += 1
    assert checked == 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    "argv, word",
    [
        (["--runtimes", "reference,fast"], "--runtimes"),
        (["--runtimes", ""], "--runtimes"),
        (["--reference", "fast"], "--reference"),
        (["--json", "/nonexistent-dir/c.json"], "--json"),
        (["--plot", "/nonexistent-dir/c.png"], "--plot"),
    ],
)
def test_compare_bad_options_exit_2_naming_the_option(files, capsys, argv, word):
    d, _, _ = files
    base = ["compare", str(d / "fc.tflite"), "--input", str(d / "x_fc.npy")]
    extra = [] if argv[0] in ("--runtimes", "--reference") else ["--runtimes", "optimized"]
    with pytest.raises(SystemExit) as e:
        main(base + argv + extra)
    assert e.value.code == 2
    assert word in _one_line_error(capsys)


@pytest.mark.slow
def test_compare_on_mlperf_counts_the_stored_runtimes_outputs(tmp_path):
    """``hwjax compare`` over every runtime on MLPerf Tiny's KWS model and its stored inputs:
    the output row's counts (JSON) are those of the stored LiteRT, TFLM and xcore host
    interpreter outputs against LiteRT's reference ones."""
    mlperf = os.path.join(os.path.dirname(__file__), "data", "mlperf")
    z = np.load(os.path.join(mlperf, "kws_ref_model.npz"))
    np.save(tmp_path / "x.npy", z["x"])
    js = tmp_path / "c.json"
    assert main(["compare", os.path.join(mlperf, "kws_ref_model.tflite"), "--input", str(tmp_path / "x.npy"),
                 "--json", str(js), "--plot", str(tmp_path / "c.png")]) == 0  # fmt: skip
    last = json.loads(js.read_text())["tensors"][-1]
    ref = z["y_reference"].astype(np.int64)
    for rt in ("optimized", "xnnpack", "tflm", "xs3"):
        diff = np.abs(z[f"y_{rt}"].astype(np.int64) - ref)
        assert (last["differ"][rt], last["max_abs"][rt]) == (np.count_nonzero(diff), diff.max()), rt


@pytest.mark.parametrize(
    "case", ["no_model", "not_tflite", "no_input", "bad_npy", "shape", "dtype", "range", "runtime", "output_dir"]
)
def test_bad_arguments_exit_2_with_one_line(files, capsys, tmp_path, case):
    d, _, x = files
    model, xin = str(d / "chain.tflite"), str(d / "x.npy")
    (tmp_path / "junk.tflite").write_bytes(b"\x00" * 64)
    (tmp_path / "junk.npy").write_text("not an array")
    np.save(tmp_path / "shape.npy", x[:, :, :4])
    np.save(tmp_path / "dtype.npy", x.astype(np.float32))
    np.save(tmp_path / "range.npy", x.astype(np.int16) * 3)
    argv, word = {
        "no_model": (["run", str(tmp_path / "none.tflite"), "--input", xin], "no such file"),
        "not_tflite": (["compare", str(tmp_path / "junk.tflite"), "--input", xin], "not a TFLite model"),
        "no_input": (["run", model, "--input", str(tmp_path / "none.npy")], "no such file"),
        "bad_npy": (["compare", model, "--input", str(tmp_path / "junk.npy")], "not a .npy"),
        "shape": (["run", model, "--input", str(tmp_path / "shape.npy")], "shape (6, 9, 4, 3)"),
        "dtype": (["run", model, "--input", str(tmp_path / "dtype.npy")], "dtype float32"),
        "range": (["compare", model, "--input", str(tmp_path / "range.npy")], "outside int8"),
        "runtime": (["run", model, "--runtime", "fast", "--input", xin], "--runtime"),
        "output_dir": (["run", model, "--input", xin, "--output", str(tmp_path / "no" / "y.npy")], "--output"),
    }[case]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert word in _one_line_error(capsys)


def test_help_lists_run_compare_and_finetune():
    from train.__main__ import COMMANDS, parser

    text = parser().format_help()
    assert "run" in text and "compare" in text
    assert "finetune" in text
    assert "deployed" in text
    assert set(COMMANDS) == {"digits", "train", "eval", "export", "run", "compare", "finetune", "deployed"}


def test_plot_with_equal_differing_and_unrunnable_runtimes(tmp_path):
    """``plot_compare`` draws a runtime equal to the reference everywhere (a legend entry, no
    bars), one that differs, one that could not run (named in the title), and the all-equal case
    (a linear axis and a note)."""
    tensors = (("a", "conv"), ("b", "depthwise_conv"), ("c", "dense"))
    equal = _cli.RuntimeDiff("optimized", tuple(_cli.LayerDiff(t, op, 10, 0, 0) for t, op in tensors))
    differ = _cli.RuntimeDiff("xs3", tuple(_cli.LayerDiff(t, op, 10, i, i) for i, (t, op) in enumerate(tensors)))
    na = _cli.RuntimeDiff("tflm", None, "UnsupportedOpError: x")
    for k, runtimes in enumerate([(equal, differ, na), (equal,)]):
        png = tmp_path / f"{k}.png"
        _cli.plot_compare(_cli.Comparison("reference", tensors, runtimes), png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
