"""``hwjax run`` and ``hwjax compare`` (train/__main__.py + hwjax/tflite/_cli.py), called
in-process through ``main([...])``. Outputs are checked against LiteRT itself: ``run``'s
written outputs against LiteRT's, ``compare``'s per-tensor difference counts against
LiteRT's own intermediate tensors (``experimental_preserve_all_tensors``)."""

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

import hwjax.tflite as tfl
from hwjax.tflite import _cli
from hwjax.tflite import testing as T
from train.__main__ import main


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
        assert _cli.format_compare(c).splitlines()[2].split()[2:] == [
            f"{c.runtimes[0].layers[0].differ}",
            f"({c.runtimes[0].layers[0].percent:.2f}%)",
            "max",
            f"{c.runtimes[0].layers[0].max_abs}",
            f"{c.runtimes[1].layers[0].differ}",
            f"({c.runtimes[1].layers[0].percent:.2f}%)",
            "max",
            f"{c.runtimes[1].layers[0].max_abs}",
        ]


def test_compare_table(files, capsys):
    """The table through main: header, one row per tensor in graph order; a runtime that
    cannot run the model (TFLM: LOGISTIC writing zero point 0) listed as n/a with the reason."""
    d, _, _ = files
    assert main(["compare", str(d / "fc.tflite"), "--input", str(d / "x_fc.npy")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "tensor",
        "op",
        "optimized",
        "vs",
        "reference",
        "xnnpack",
        "vs",
        "reference",
        "tflm",
        "vs",
        "reference",
    ]
    model = _cli.read_model(d / "fc.tflite")
    rows = lines[2 : 2 + len(model.graph.nodes)]
    assert [ln.split()[:2] for ln in rows] == [[n.outputs[0], n.op] for n in model.graph.nodes]
    assert len(lines) == 2 + len(model.graph.nodes)
    assert main(["compare", str(d / "logistic.tflite"), "--input", str(d / "x_logistic.npy")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["tensor", "op", "optimized", "vs", "reference", "xnnpack", "vs", "reference"]
    assert lines[-1].startswith("tflm: n/a (") and "zero point" in lines[-1] and lines[-1].endswith(")")


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


def test_help_lists_run_and_compare():
    from train.__main__ import COMMANDS, parser

    text = parser().format_help()
    assert "run" in text and "compare" in text
    assert set(COMMANDS) == {"digits", "train", "eval", "export", "run", "compare"}
