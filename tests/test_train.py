"""The training demo / ``hwjax`` command line on a tiny subset (1 epoch per phase)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from train.__main__ import main, parser

TINY = ["--model", "mlp", "--epochs", "1", "--hat-epochs", "1", "--limit", "240", "--batch-size", "32", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "digits"
    assert main(["digits", *TINY, "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_demo_writes_everything(run):
    res = json.loads((run / "results.json").read_text())
    for k in ("float_acc", "ptq_acc", "hat_acc"):
        assert 0.0 <= res[k] <= 1.0
    assert (run / "training_curves.png").stat().st_size > 1000
    assert (run / "export" / "manifest.json").is_file()
    assert any((run / "checkpoints").iterdir())


@pytest.mark.slow
def test_eval_and_export_subcommands(run, tmp_path, capsys):
    assert main(["eval", "--export", str(run / "export")]) == 0
    assert "test accuracy" in capsys.readouterr().out
    again = tmp_path / "again"
    assert main(["export", "--run", str(run), "--out", str(again)]) == 0
    a = json.loads((run / "export" / "manifest.json").read_text())
    b = json.loads((again / "manifest.json").read_text())
    # the checkpointed model exports the same integers, byte for byte
    assert [[t["sha256"] for t in l["tensors"].values()] for l in a["nodes"]] == [
        [t["sha256"] for t in l["tensors"].values()] for l in b["nodes"]
    ]


@pytest.mark.slow
def test_resume_continues_the_hardware_aware_phase(run, capsys):
    before = json.loads((run / "results.json").read_text())
    assert (
        main(["digits", *[a for a in TINY if a != "--quiet"], "--hat-epochs", "2", "--out", str(run), "--resume"]) == 0
    )
    out = capsys.readouterr().out
    assert "resumed from checkpoint" in out and "hardware-aware training accuracy" in out
    after = json.loads((run / "results.json").read_text())
    assert after["float_acc"] == before["float_acc"] and after["ptq_acc"] == before["ptq_acc"]


def test_npz_data_and_optimizer_by_name(tmp_path):
    from train import _data
    from train._loop import make_optimizer

    rng = np.random.default_rng(0)
    x = rng.integers(0, 17, (120, 8, 8)).astype(np.uint8)
    y = (x.reshape(120, -1).sum(1) > 8 * 64).astype(np.int32)
    np.savez(tmp_path / "toy.npz", x=x, y=y)
    ds = _data.from_npz(tmp_path / "toy.npz")
    assert ds.x_train.shape[1:] == (8, 8, 1) and ds.x_train.dtype == np.float32 and ds.x_train.max() <= 1.0
    assert len(ds.y_train) + len(ds.y_test) == 120
    assert _data.from_npz(tmp_path / "toy.npz", flat=True).x_test.shape[1:] == (64,)
    np.savez(tmp_path / "bad.npz", a=x)
    with pytest.raises(ValueError, match="must contain"):
        _data.from_npz(tmp_path / "bad.npz")
    for name in ("adam", "sgd", "adamw", "lion"):
        make_optimizer(name, 1e-3, 10)
    with pytest.raises(ValueError, match="unknown optax optimiser"):
        main(["digits", *TINY, "--optimizer", "nope", "--out", str(tmp_path / "bad")])


def test_cli_help_lists_the_subcommands():
    text = parser().format_help()
    for cmd in ("digits", "train", "eval", "export"):
        assert cmd in text


@pytest.mark.parametrize(
    "args, option",
    [
        (["--epochs", "-1"], "--epochs"),
        (["--hat-epochs", "x"], "--hat-epochs"),
        (["--lr", "-0.1"], "--lr"),
        (["--hat-lr", "nan"], "--hat-lr"),
        (["--batch-size", "0"], "--batch-size"),
        (["--limit", "-5"], "--limit"),
        (["--val-fraction", "1.5"], "--val-fraction"),
        (["--devices", "0"], "--devices"),
    ],
)
def test_cli_rejects_bad_numbers_with_one_line_and_exit_2(args, option, capsys):
    with pytest.raises(SystemExit) as e:
        main(["digits", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and "must be" in err[0], err


@pytest.mark.slow
def test_lut_tables_are_not_derived_on_the_host_inside_training_steps(monkeypatch):
    """XS3 LUT tables come from the host (float64): the trainer derives them once before
    its first step (hwjax.nn.Derived), and the jitted steps reuse them, with the same
    losses as steps that derive them in the program (a host callback per step)."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import hwjax.nn as hn
    import hwjax.targets._base as B
    from hwjax import models
    from train import Trainer

    calls = []
    host = B._host_lut_table
    monkeypatch.setattr(B, "_host_lut_table", lambda *a: calls.append(1) or host(*a))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    losses = {}
    for kept in (True, False):
        m = models.build("lut_mlp", "xs3", rngs=nnx.Rngs(0), hidden=(16,))  # one table layer
        hn.set_mode(m, "calibrate")
        m(jnp.asarray(x))
        hn.set_mode(m, "hardware")
        tr = Trainer(m, optax.sgd(0.1))
        tr._derive = tr._derive and kept
        calls.clear()
        if kept:
            tr._fill_derived(x)
            derived = len(calls)
            assert derived >= 1
        losses[kept] = [float(tr.step(x[i : i + 16], y[i : i + 16])[0]) for i in range(0, 64, 16)]
        if kept:
            assert len(calls) == derived  # no table derived while training
        else:
            assert len(calls) >= 4  # one host call per step and layer
    assert losses[True] == losses[False]
