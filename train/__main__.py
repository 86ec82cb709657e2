"""``python -m train digits --target xs3 --epochs N`` and the ``hwjax`` command line.

Subcommands:

* ``digits`` (alias ``train``): train the float baseline, calibrate, measure
  post-training quantisation (PTQ) accuracy bit-exactly, fine-tune in hardware mode
  (hardware-aware training, HAT), print a per-layer saturation report, checkpoint
  (orbax; ``--resume`` continues), plot the curves, export, and print a summary table.
* ``eval``: bit-exact accuracy of an exported model (``hwjax.load``) on the test split.
* ``export``: export the latest checkpoint of a training run.
* ``run``: run an int8 ``.tflite`` or ``.onnx`` file on a ``.npy`` batch bit-exactly as a
  runtime does (``--runtime``: LiteRT, TFLM, xcore.ai, ONNX Runtime on a CPU), optionally
  writing the outputs (``--output``).
* ``compare``: per tensor of a ``.tflite`` or ``.onnx`` file, how many values each runtime
  computes differently from the reference runtime, and by how much (``--json``, ``--plot``).
* ``finetune``: fine-tune a ``.tflite`` file in a runtime's exact arithmetic, write it back,
  and check the written file against the trained modules.
* ``deployed``: the deployed-model demo (``train/_deployed.py``): a converter-made digits model's
  accuracy under every runtime, a fine-tune for one, the file written and re-checked.

Run outputs go to ``runs/<name>`` (relative to the working directory) by default.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np


# ----------------------------------------------------------------------------- setup


def target_names() -> tuple[str, ...]:
    """The registered targets (:func:`hwjax.targets.available`)."""
    from hwjax import targets

    return targets.available()


def make_target(name: str, variant: Optional[str], options: Optional[dict] = None):
    """``hwjax.targets.get(name, variant=..., **options)`` (``variant`` only where given)."""
    from hwjax import targets

    opts = {**({"variant": variant} if variant else {}), **(options or {})}
    try:
        return targets.get(name, **opts)
    except ValueError as e:
        raise SystemExit(f"--target {name} with options {opts}: {e}") from None


def _option_value(text: str):
    """A ``--target-opt`` value: true/false, an int, a float, or the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def target_options(args) -> dict:
    """The options passed to :func:`hwjax.targets.get`: ``--target-opt KEY=VALUE`` (repeatable)
    and ``--bits L,R`` (shorthand for ``lhs_bits=L``, ``rhs_bits=R``: the gemmlowp target's
    weight and activation bit depths)."""
    opts: dict = {}
    for item in getattr(args, "target_opt", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--target-opt takes KEY=VALUE, got {item!r}")
        opts[key] = _option_value(value)
    bits = getattr(args, "bits", None)
    if bits:
        parts = bits.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise SystemExit(f"--bits takes two integers L,R (weights, activations), e.g. 4,4; got {bits!r}")
        opts.update(lhs_bits=int(parts[0]), rhs_bits=int(parts[1]))
    return opts


def target_label(target) -> str:
    """``name (variant)`` or ``name (key=value, ...)`` of a target's ``describe()``."""
    d = {k: v for k, v in target.describe().items() if k != "name"}
    if not d:
        return f"{target.name} (-)"
    if list(d) == ["variant"]:
        return f"{target.name} ({d['variant']})"
    return f"{target.name} ({', '.join(f'{k}={v}' for k, v in d.items())})"


def make_mesh(devices: Optional[int]):
    if not devices or devices == 1:
        return None
    import jax
    from jax.sharding import Mesh

    have = jax.devices()
    if devices > len(have):
        raise SystemExit(
            f"--devices {devices}: only {len(have)} JAX devices are available (on CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} before starting)"
        )
    return Mesh(np.asarray(have[:devices]), ("data",))


def load_data(args):
    from . import _data

    flat = args.model in ("mlp", "lut_mlp")
    ds = _data.from_npz(args.data, flat=flat, seed=args.seed) if args.data else _data.digits(flat=flat, seed=args.seed)
    if args.limit:
        ds = ds.limit(args.limit)
    return ds


def _split_val(x, y, fraction: float, seed: int):
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y)
    strat = y if counts[counts > 0].min() >= 2 and int(len(y) * fraction) >= len(counts) else None
    return train_test_split(x, y, test_size=fraction, random_state=seed, stratify=strat)


def build_model(args, target, classes: int, input_dim: int):
    from flax import nnx

    from hwjax import models

    kwargs = {"classes": classes, "learn_scale": bool(getattr(args, "learn_scale", False))}
    if args.model in ("mlp", "lut_mlp"):
        kwargs["in_features"] = input_dim
    if args.model == "lut_mlp":
        kwargs["fn"] = args.lut_fn
    return models.build(args.model, target, rngs=nnx.Rngs(args.seed), **kwargs)


# ------------------------------------------------------------------------ pipeline


@dataclass
class Run:
    """Everything one training run shares between its steps."""

    args: Any
    model: Any
    target: Any
    data: Any
    x_tr: np.ndarray
    y_tr: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    mesh: Any
    ckpt: Any
    out: Path
    meta: dict
    start_step: Optional[int]
    rng: np.random.Generator
    say: Callable[..., None]
    timings: dict = field(default_factory=dict)

    @property
    def steps_per_epoch(self) -> int:
        return max(1, len(self.x_tr) // self.args.batch_size)

    def accuracy(self, x, y, batch_size: int = 256) -> float:
        from hwjax import evaluate

        return evaluate(self.model, (x, y), batch_size=batch_size, mesh=self.mesh).accuracy

    def save(self, step: int, trainer) -> None:
        from flax import nnx

        self.ckpt.save(step, nnx.state(self.model), trainer.opt_state, self.meta)

    @property
    def best_path(self) -> Path:
        return self.out / "best_hat.npz"


def _setup(args) -> Run:
    """Data, target, model, mesh, output folder and checkpoints; restores ``--resume``."""
    from ._ckpt import Checkpoints
    from ._loop import make_optimizer

    make_optimizer(args.optimizer, args.lr, 1)  # fail fast on an unknown optimiser
    ds = load_data(args)
    x_tr, x_val, y_tr, y_val = _split_val(ds.x_train, ds.y_train, args.val_fraction, args.seed)
    target = make_target(args.target, args.variant, target_options(args))
    try:
        model = build_model(args, target, ds.classes, int(np.prod(ds.x_train.shape[1:])))
    except (NotImplementedError, ValueError) as e:
        raise SystemExit(f"cannot build the {args.model} model for {target!r}: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.resume and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")  # a fresh run must not mix with an older one
    history = {p: {"loss": [], "train_acc": [], "test_acc": [], "val_acc": []} for p in ("float", "hat")}
    run = Run(
        args,
        model,
        target,
        ds,
        x_tr,
        y_tr,
        x_val,
        y_val,
        make_mesh(args.devices),
        Checkpoints(out / "checkpoints"),
        out,
        {"phase": "float", "epoch": 0, "history": history, "config": _config(args)},
        None,
        np.random.default_rng(args.seed),
        (lambda *a: None) if args.quiet else print,
    )
    if args.resume:
        _resume(run)
    return run


def _resume(run: Run) -> None:
    from flax import nnx

    step = run.ckpt.latest()
    if step is None:
        run.say(f"--resume: no checkpoint in {run.ckpt.folder}, starting from scratch")
        return
    meta = run.ckpt.restore_meta(step)
    if (
        meta["config"].get("model") != run.args.model
        or meta["config"].get("target") != run.args.target
        or meta["config"].get("target_options", {}) != target_options(run.args)
    ):
        raise SystemExit(f"--resume: the checkpoint was made with {meta['config']}, not these arguments")
    state, _, _ = run.ckpt.restore(step, nnx.state(run.model), None)
    nnx.update(run.model, state)
    run.say(f"resumed from checkpoint {step} ({meta['phase']} phase, {meta['epoch']} epochs done)")
    if meta["phase"] == "done" and meta["epoch"] < run.args.hat_epochs:
        # a finished run asked for more hardware-aware epochs: continue from the selected
        # model (with a fresh optimiser state)
        meta.update(phase="hat", resumed_done=True)
    run.meta, run.start_step = meta, step


def _trainer(run: Run, mode: str, lr: float, epochs: int):
    """A :class:`Trainer` in ``mode`` whose optimiser state continues the checkpoint when
    the run resumes inside this phase."""
    from flax import nnx

    import hwjax.nn as hn

    from ._loop import Trainer, make_optimizer

    hn.set_mode(run.model, mode)
    trainer = Trainer(
        run.model, make_optimizer(run.args.optimizer, lr, run.steps_per_epoch * max(1, epochs)), mesh=run.mesh
    )
    if run.start_step is not None and run.meta["epoch"] > 0 and not run.meta.pop("resumed_done", False):
        _, trainer.opt_state, _ = run.ckpt.restore(run.start_step, nnx.state(run.model), trainer.opt_state)
    return trainer


def _epochs(
    run: Run, phase: str, trainer, epochs: int, first_step: int, after: Optional[Callable[[int], dict]] = None
) -> None:
    """The training loop (both phases): ``epochs`` epochs from the checkpointed epoch on,
    recording loss, accuracies and ``after(epoch)``'s extra figures, checkpointing each."""
    from tqdm import tqdm

    desc = {"float": "float training", "hat": "hardware-aware training"}[phase]
    bar = tqdm(range(run.meta["epoch"], epochs), desc=desc, disable=run.args.quiet, unit="epoch")
    for ep in bar:
        loss, tr_acc = trainer.epoch(run.x_tr, run.y_tr, run.args.batch_size, run.rng)
        extra = after(ep) if after is not None else {"val_acc": None}
        te = run.accuracy(run.data.x_test, run.data.y_test)
        for k, v in {"loss": loss, "train_acc": tr_acc, "test_acc": te, **extra}.items():
            run.meta["history"][phase][k].append(v)
        bar.set_postfix(loss=f"{loss:.4f}", test=f"{100 * te:.2f}%")
        run.meta.update(epoch=ep + 1)
        run.save(first_step + ep, trainer)


def _float_phase(run: Run) -> None:
    """Float baseline, calibration, post-training quantisation (bit-exact)."""
    import jax
    from flax import nnx

    import hwjax.nn as hn

    from ._loop import calibrate

    args, meta = run.args, run.meta
    t0 = time.perf_counter()
    trainer = _trainer(run, "float", args.lr, args.epochs)
    _epochs(run, "float", trainer, args.epochs, first_step=1)
    meta["float_acc"] = run.accuracy(run.data.x_test, run.data.y_test)
    calibrate(run.model, run.x_tr)
    hn.set_mode(run.model, "hardware")
    meta["ptq_acc"] = run.accuracy(run.data.x_test, run.data.y_test)
    meta["ptq_val_acc"] = run.accuracy(run.x_val, run.y_val)
    meta.update(phase="hat", epoch=0, best_val=meta["ptq_val_acc"], best_epoch=0)
    np.savez(run.best_path, *jax.tree.leaves(nnx.state(run.model)))
    run.save(args.epochs + 1, trainer)
    run.timings["float training + calibration + PTQ"] = time.perf_counter() - t0


def _hat_phase(run: Run) -> None:
    """Hardware-aware fine-tuning with model selection on the validation split (epoch 0 =
    the PTQ model)."""
    import jax
    from flax import nnx

    args, meta = run.args, run.meta
    t0 = time.perf_counter()
    trainer = _trainer(run, "hardware", args.hat_lr, args.hat_epochs)

    def select(ep: int) -> dict:
        va = run.accuracy(run.x_val, run.y_val)
        if va >= meta["best_val"]:  # ties go to the later, hardware-trained model
            meta.update(best_val=va, best_epoch=ep + 1)
            np.savez(run.best_path, *jax.tree.leaves(nnx.state(run.model)))
        return {"val_acc": va}

    _epochs(run, "hat", trainer, args.hat_epochs, first_step=args.epochs + 2, after=select)
    saved = np.load(run.best_path)
    leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    nnx.update(run.model, jax.tree.unflatten(jax.tree.structure(nnx.state(run.model)), leaves))
    meta["hat_acc"] = run.accuracy(run.data.x_test, run.data.y_test)
    meta.update(phase="done")
    run.save(args.epochs + 2 + args.hat_epochs, trainer)
    run.timings["hardware-aware training"] = time.perf_counter() - t0


def _finish(run: Run, t_start: float) -> dict:
    """Saturation report, curves, export, results.json and the summary table."""
    import hwjax.nn as hn
    from hwjax import export

    from ._loop import layer_stats
    from ._report import final_table, plot_curves, saturation_report

    meta, model = run.meta, run.model
    hn.set_mode(model, "hardware")
    stats = layer_stats(model, run.data.x_test)
    acts = {n: getattr(l, "activation", None) for n, l in model.named_layers()}
    run.say(f"\nper-layer saturation on the test split (hardware mode, best epoch {meta['best_epoch']}):")
    run.say(saturation_report(stats, acts))
    png = plot_curves(meta["history"], meta["ptq_acc"], run.out / "training_curves.png")
    export_dir = export(model, run.out / "export", input_shape=run.data.x_train.shape[1:])
    (run.out / "results.json").write_text(
        json.dumps(
            {k: meta[k] for k in ("float_acc", "ptq_acc", "hat_acc", "best_epoch")} | {"export": str(export_dir)},
            indent=1,
        )
    )
    run.timings["total"] = time.perf_counter() - t_start
    print(
        "\n"
        + final_table(
            meta["float_acc"], meta["ptq_acc"], meta["hat_acc"], export_dir, target_label(run.target), run.timings
        )
    )
    run.say(f"training curves: {png}")
    return {
        "float_acc": meta["float_acc"],
        "ptq_acc": meta["ptq_acc"],
        "hat_acc": meta["hat_acc"],
        "export": export_dir,
        "stats": stats,
        "history": meta["history"],
        "model": model,
        "best_epoch": meta["best_epoch"],
    }


def run_training(args) -> dict:
    """The full demo pipeline (see the module docstring); returns the results dict."""
    t_start = time.perf_counter()
    run = _setup(args)
    if run.meta["phase"] == "float":
        _float_phase(run)
    run.say(
        f"float accuracy {100 * run.meta['float_acc']:.2f}%, post-training quantisation (bit-exact, "
        f"{target_label(run.target)}) {100 * run.meta['ptq_acc']:.2f}%"
    )
    if run.meta["phase"] == "hat":
        _hat_phase(run)
    return _finish(run, t_start)


def _config(args) -> dict:
    return {
        **{
            k: getattr(args, k)
            for k in ("model", "target", "variant", "lut_fn", "data", "seed", "limit", "val_fraction", "learn_scale")
        },
        "target_options": target_options(args),
    }


# -------------------------------------------------------------------- eval / export


def run_eval(args) -> dict:
    from hwjax import evaluate
    from hwjax import load

    from . import _data

    m = load(args.export)
    flat = len(m.input_shape) == 1
    ds = _data.from_npz(args.data, flat=flat, seed=args.seed) if args.data else _data.digits(flat=flat, seed=args.seed)
    r = evaluate(m, (ds.x_test, ds.y_test), batch_size=args.batch_size, mesh=make_mesh(args.devices))
    print(
        f"{args.export}: {m.target.name} integer model, test accuracy {100 * r.accuracy:.2f}% "
        f"on {len(ds.y_test)} examples (bit-exact)"
    )
    return {"accuracy": r.accuracy, "outputs": r.outputs}


def run_export(args) -> Path:
    from flax import nnx

    import hwjax.nn as hn
    from hwjax import export

    from ._ckpt import Checkpoints

    ckpt = Checkpoints(Path(args.run) / "checkpoints")
    step = ckpt.latest()
    if step is None:
        raise SystemExit(f"no checkpoint under {Path(args.run) / 'checkpoints'}")
    meta = ckpt.restore_meta(step)
    if meta["phase"] == "float":
        raise SystemExit("the run has not been calibrated yet (still in the float phase); resume it first")
    cfg = argparse.Namespace(**meta["config"])
    ds = load_data(cfg)
    model = build_model(
        cfg,
        make_target(cfg.target, cfg.variant, getattr(cfg, "target_options", None)),
        ds.classes,
        int(np.prod(ds.x_train.shape[1:])),
    )
    state, _, _ = ckpt.restore(step, nnx.state(model), None)
    nnx.update(model, state)
    hn.set_mode(model, "hardware")
    path = export(model, args.out or Path(args.run) / "export", input_shape=ds.x_train.shape[1:])
    print(f"exported checkpoint {step} of {args.run} to {path}")
    return path


# ------------------------------------------------------------------------ argparse


def _number(kind: type, lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse ``type`` accepting ``kind`` values in the range; anything else exits 2
    with one line naming the option and the range."""
    rng = f"{'(' if lo_open else '['}{lo}, {'inf)' if hi is None else f'{hi}' + (')' if hi_open else ']')}"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'} in {rng}, got {text!r}"
            ) from None
        ok = (v > lo if lo_open else v >= lo) and (hi is None or (v < hi if hi_open else v <= hi))
        if not ok or v != v:  # v != v: NaN
            raise argparse.ArgumentTypeError(f"must be in {rng}, got {text!r}")
        return v

    return parse


class _Parser(argparse.ArgumentParser):
    """Bad options exit 2 with one line naming the option (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


_COUNT, _POSITIVE = _number(int, 0), _number(int, 1)
_RATE = _number(float, 0.0, lo_open=True)
_FRACTION = _number(float, 0.0, 1.0, lo_open=True, hi_open=True)


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="xs3",
        choices=target_names(),
        help="chip to train for (default xs3; the registered hwjax.targets)",
    )
    p.add_argument(
        "--variant", default=None, help="target variant, e.g. the XS3 VPU model: hardware (default), host or v2021"
    )
    p.add_argument(
        "--target-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the target (repeatable), passed to hwjax.targets.get, e.g. "
        "--target-opt requantize=always for gemmlowp",
    )
    p.add_argument(
        "--bits",
        default=None,
        metavar="L,R",
        help="gemmlowp bit depths of the weights (LHS) and activations (RHS), 1..8 each: "
        "shorthand for --target-opt lhs_bits=L --target-opt rhs_bits=R",
    )
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "lut_mlp"))
    p.add_argument("--lut-fn", default="tanh", choices=("tanh", "sigmoid"), help="lut_mlp activation")
    p.add_argument(
        "--data", default=None, help=".npz with x_train/y_train/x_test/y_test or x/y (default: scikit-learn digits)"
    )
    p.add_argument("--epochs", type=_COUNT, default=40, help="float training epochs")
    p.add_argument("--hat-epochs", type=_COUNT, default=10, help="hardware-aware training epochs")
    p.add_argument("--batch-size", type=_POSITIVE, default=64)
    p.add_argument("--optimizer", default="adam", help="any optax optimiser name (adam, adamw, sgd, lion, ...)")
    p.add_argument("--lr", type=_RATE, default=3e-3, help="float learning rate (cosine decay)")
    p.add_argument("--hat-lr", type=_RATE, default=3e-4, help="hardware-aware learning rate (cosine decay)")
    p.add_argument(
        "--learn-scale",
        action="store_true",
        help="learn the activation step sizes in hardware-aware training (LSQ-style)",
    )
    p.add_argument("--val-fraction", type=_FRACTION, default=0.1, help="training data held out for model selection")
    p.add_argument("--seed", type=_COUNT, default=0)
    p.add_argument("--limit", type=_POSITIVE, default=None, help="use only the first N train/test examples")
    p.add_argument("--devices", type=_POSITIVE, default=None, help="data-parallel over this many devices")
    p.add_argument("--out", default=None, help="output folder (default runs/<dataset>)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--quiet", action="store_true")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hwjax", description="hwjax: hardware-aware training, evaluation, export")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("digits", "the digits demo: float, PTQ and hardware-aware training, export"),
        ("train", "same as digits (use --data for another dataset)"),
    ):
        _train_args(sub.add_parser(name, help=helptext))
    e = sub.add_parser("eval", help="bit-exact accuracy of an exported model")
    e.add_argument("--export", required=True, help="folder written by hwjax.export")
    e.add_argument("--data", default=None)
    e.add_argument("--seed", type=_COUNT, default=0)
    e.add_argument("--batch-size", type=_POSITIVE, default=256)
    e.add_argument("--devices", type=_POSITIVE, default=None)
    x = sub.add_parser("export", help="export the latest checkpoint of a training run")
    x.add_argument("--run", required=True, help="training output folder (with checkpoints/)")
    x.add_argument("--out", default=None, help="export folder (default <run>/export)")
    _model_args(sub)
    from ._deployed import add_args as deployed_args

    deployed_args(
        sub.add_parser(
            "deployed",
            help="the deployed-model demo: a converter-made digits model under every runtime, fine-tuned, saved, re-checked",
        ),
        _POSITIVE,
        _COUNT,
        _RATE,
    )
    return p


def _model_args(sub) -> None:
    """``run``, ``compare`` and ``finetune``: an int8 ``.tflite`` or ``.onnx`` file run and
    fine-tuned bit-exactly as a runtime does (:mod:`hwjax.cli`)."""
    from hwjax.cli import FORMATS

    per_format = "; ".join(f"{s}: {','.join(f.runtimes)}" for s, f in FORMATS.items())
    r = sub.add_parser(
        "run",
        help="run a .tflite or .onnx model on a .npy batch exactly as a runtime (LiteRT, TFLM, xcore.ai, "
        "ONNX Runtime) does",
    )
    r.add_argument("model", metavar="MODEL")
    r.add_argument("--runtime", default=None, help=f"default: the format's first ({per_format})")
    r.add_argument(
        "--input",
        required=True,
        metavar="X.npy",
        help="integer batch (batch, *input shape) or one example (*input shape)",
    )
    r.add_argument("--output", default=None, metavar="Y.npy", help="write the outputs here (numpy .npy)")
    c = sub.add_parser(
        "compare",
        help="per tensor, how many values each runtime computes differently from the reference, and by how much",
    )
    c.add_argument("model", metavar="MODEL")
    c.add_argument("--input", required=True, metavar="X.npy")
    c.add_argument(
        "--runtimes",
        default=None,
        metavar="A,B,...",
        help=f"runtimes to compare, comma-separated (default: all of the format's: {per_format})",
    )
    c.add_argument("--reference", default=None, help="the runtime compared against (default: the format's first)")
    c.add_argument("--json", default=None, metavar="FILE.json", help="write every count, with full tensor names")
    c.add_argument("--plot", default=None, metavar="FILE.png", help="per-tensor bar charts of the differences")
    f = sub.add_parser(
        "finetune",
        help="fine-tune a .tflite or .onnx model in a runtime's exact arithmetic and write it back",
        description="Fine-tune MODEL (.tflite or .onnx) in --runtime's exact integer arithmetic (optax Adam, "
        "cross-entropy on the real-valued outputs; the negative log-likelihood after a .tflite SOFTMAX), write "
        "it to --out (same format), report top-1 accuracy of the original and the tuned file under each "
        "runtime, and check that the written file, loaded again, computes exactly what the trained modules "
        "compute (exit 1 if not).",
    )
    f.add_argument("model", metavar="MODEL")
    f.add_argument(
        "--data", required=True, metavar="TRAIN.npz", help="arrays x (inputs as the file takes them), y (int labels)"
    )
    f.add_argument("--validation", default=None, metavar="VAL.npz", help="held-out x, y (default: the training data)")
    f.add_argument(
        "--runtime", default=None, help=f"the runtime to fine-tune for (default: the format's first; {per_format})"
    )
    f.add_argument("--epochs", type=_POSITIVE, default=1)
    f.add_argument("--batch-size", type=_POSITIVE, default=32)
    f.add_argument("--lr", type=_RATE, default=1e-3, help="Adam learning rate")
    f.add_argument("--seed", type=_COUNT, default=0, help="shuffling seed")
    f.add_argument("--out", required=True, metavar="TUNED", help="the tuned file (MODEL's suffix)")
    f.add_argument(
        "--runtimes",
        default=None,
        metavar="A,B,...",
        help="runtimes to measure accuracy under (default: all of the format's)",
    )
    f.add_argument("--quiet", action="store_true", help="no progress bar")


def run_model_command(args) -> None:
    """``run`` / ``compare`` / ``finetune`` (:data:`hwjax.cli.COMMANDS`): prints the
    result; a bad path or input exits 2 with one line; a failed check (``finetune``'s reload
    check) exits with the result's ``exit_code``."""
    from hwjax.cli import COMMANDS as CLI_COMMANDS
    from hwjax.errors import HwjaxError

    try:
        text = CLI_COMMANDS[args.command](args)
    except (HwjaxError, OSError, ImportError) as e:  # ImportError: a format's optional reader
        print(f"hwjax {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None
    print(text)
    if getattr(text, "exit_code", 0):
        raise SystemExit(text.exit_code)


def run_deployed(args) -> None:
    """``deployed``: :func:`train._deployed.run`, exiting with its code."""
    from ._deployed import run

    code = run(args)
    if code:
        raise SystemExit(code)


def run_train_command(args) -> None:
    if args.out is None:
        args.out = str(Path("runs") / (Path(args.data).stem if args.data else "digits"))
    run_training(args)


#: subcommand -> ``fn(parsed args)``
COMMANDS: dict[str, Callable[[Any], Any]] = {
    "digits": run_train_command,
    "train": run_train_command,
    "eval": run_eval,
    "export": run_export,
    "run": run_model_command,
    "compare": run_model_command,
    "finetune": run_model_command,
    "deployed": run_deployed,
}


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    COMMANDS[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
