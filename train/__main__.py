"""``python -m train digits --target xs3 --epochs N`` and the ``hwjax`` command line.

Subcommands:

* ``digits`` (alias ``train``): train the float baseline, calibrate, measure
  post-training quantisation (PTQ) accuracy bit-exactly, fine-tune in hardware mode
  (hardware-aware training, HAT), print a per-layer saturation report, checkpoint
  (orbax; ``--resume`` continues), plot the curves, export, and print a summary table.
* ``eval``: bit-exact accuracy of an exported model (``hwjax.load``) on the test split.
* ``export``: export the latest checkpoint of a training run.

Run outputs go to ``runs/<name>`` (relative to the working directory) by default.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

_TARGETS = ("xs3", "xs3-legacy", "nvdla")


# ----------------------------------------------------------------------------- setup


def make_target(name: str, variant: str):
    from hwjax import targets as T

    if name == "xs3":
        return T.XS3(variant=variant)
    if name == "xs3-legacy" and hasattr(T, "XS3Legacy"):
        return T.XS3Legacy(variant=variant)
    if name == "nvdla" and hasattr(T, "NVDLA"):
        return T.NVDLA()
    raise SystemExit(f"target {name!r} is not available in this build (choose from {_TARGETS})")


def make_mesh(devices: Optional[int]):
    if not devices or devices == 1:
        return None
    import jax
    from jax.sharding import Mesh

    have = jax.devices()
    if devices > len(have):
        raise SystemExit(f"--devices {devices}: only {len(have)} JAX devices are available (on CPU, set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} before starting)")
    return Mesh(np.asarray(have[:devices]), ("data",))


def load_data(args):
    from train import _data

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

    import models

    kwargs = {"classes": classes, "learn_scale": bool(getattr(args, "learn_scale", False))}
    if args.model in ("mlp", "lut_mlp"):
        kwargs["in_features"] = input_dim
    if args.model == "lut_mlp":
        kwargs["fn"] = args.lut_fn
    return models.build(args.model, target, rngs=nnx.Rngs(args.seed), **kwargs)


# ------------------------------------------------------------------------ pipeline


def run_training(args) -> dict:
    """The full demo pipeline (see the module docstring); returns the results dict."""
    import jax
    from flax import nnx
    from tqdm import tqdm

    import hwjax.nn as hn
    from hwjax._evaluate import evaluate
    from hwjax._export import export
    from train._ckpt import Checkpoints
    from train._loop import Trainer, calibrate, layer_stats, make_optimizer
    from train._report import final_table, plot_curves, saturation_report

    t_start = time.perf_counter()
    make_optimizer(args.optimizer, args.lr, 1)  # fail fast on an unknown optimiser
    ds = load_data(args)
    x_tr, x_val, y_tr, y_val = _split_val(ds.x_train, ds.y_train, args.val_fraction, args.seed)
    target = make_target(args.target, args.variant)
    try:
        model = build_model(args, target, ds.classes, int(np.prod(ds.x_train.shape[1:])))
    except (NotImplementedError, ValueError) as e:
        raise SystemExit(f"cannot build the {args.model} model for {target!r}: {e}") from None
    mesh = make_mesh(args.devices)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.resume and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")  # a fresh run must not mix with an older one
    ckpt = Checkpoints(out / "checkpoints")
    rng = np.random.default_rng(args.seed)
    steps = max(1, len(x_tr) // args.batch_size)
    history = {p: {"loss": [], "train_acc": [], "test_acc": [], "val_acc": []} for p in ("float", "hat")}
    meta = {"phase": "float", "epoch": 0, "history": history, "config": _config(args)}
    best_path = out / "best_hat.npz"
    say = (lambda *a: None) if args.quiet else print

    def acc(x, y, bs=256):
        return evaluate(model, (x, y), batch_size=bs, mesh=mesh).accuracy

    def save(step, trainer):
        ckpt.save(step, nnx.state(model), trainer.opt_state, meta)

    start_step = ckpt.latest() if args.resume else None
    if args.resume and start_step is None:
        say(f"--resume: no checkpoint in {ckpt.folder}, starting from scratch")
    if start_step is not None:
        meta = ckpt.restore_meta(start_step)
        history = meta["history"]
        if meta["config"].get("model") != args.model or meta["config"].get("target") != args.target:
            raise SystemExit(f"--resume: the checkpoint was made with {meta['config']}, not these arguments")
        state, _, _ = ckpt.restore(start_step, nnx.state(model), None)
        nnx.update(model, state)
        say(f"resumed from checkpoint {start_step} ({meta['phase']} phase, {meta['epoch']} epochs done)")
        if meta["phase"] == "done" and meta["epoch"] < args.hat_epochs:
            # a finished run asked for more hardware-aware epochs: continue from the selected
            # model (with a fresh optimiser state)
            meta.update(phase="hat", resumed_done=True)
    timings: dict[str, float] = {}

    # ---- float baseline
    if meta["phase"] == "float":
        t0 = time.perf_counter()
        hn.set_mode(model, "float")
        trainer = Trainer(model, make_optimizer(args.optimizer, args.lr, steps * args.epochs), mesh=mesh)
        if start_step is not None and meta["epoch"] > 0:
            _, trainer.opt_state, _ = ckpt.restore(start_step, nnx.state(model), trainer.opt_state)
        bar = tqdm(range(meta["epoch"], args.epochs), desc="float training", disable=args.quiet, unit="epoch")
        for ep in bar:
            loss, tr_acc = trainer.epoch(x_tr, y_tr, args.batch_size, rng)
            te = acc(ds.x_test, ds.y_test)
            for k, v in (("loss", loss), ("train_acc", tr_acc), ("test_acc", te), ("val_acc", None)):
                history["float"][k].append(v)
            bar.set_postfix(loss=f"{loss:.4f}", test=f"{100 * te:.2f}%")
            meta.update(epoch=ep + 1)
            save(ep + 1, trainer)
        meta["float_acc"] = acc(ds.x_test, ds.y_test)
        calibrate(model, x_tr)
        hn.set_mode(model, "hardware")
        meta["ptq_acc"] = acc(ds.x_test, ds.y_test)
        meta["ptq_val_acc"] = acc(x_val, y_val)
        meta.update(phase="hat", epoch=0, best_val=meta["ptq_val_acc"], best_epoch=0)
        np.savez(best_path, *jax.tree.leaves(nnx.state(model)))
        save(args.epochs + 1, trainer)
        timings["float training + calibration + PTQ"] = time.perf_counter() - t0
    say(f"float accuracy {100 * meta['float_acc']:.2f}%, post-training quantisation (bit-exact, "
        f"{target.name} {getattr(target, 'variant', '')}) {100 * meta['ptq_acc']:.2f}%")

    # ---- hardware-aware training
    if meta["phase"] == "hat":
        t0 = time.perf_counter()
        hn.set_mode(model, "hardware")
        trainer = Trainer(model, make_optimizer(args.optimizer, args.hat_lr, steps * max(1, args.hat_epochs)),
                          mesh=mesh)
        if start_step is not None and meta["epoch"] > 0 and not meta.pop("resumed_done", False):
            _, trainer.opt_state, _ = ckpt.restore(start_step, nnx.state(model), trainer.opt_state)
        bar = tqdm(range(meta["epoch"], args.hat_epochs), desc="hardware-aware training", disable=args.quiet,
                   unit="epoch")
        for ep in bar:
            loss, tr_acc = trainer.epoch(x_tr, y_tr, args.batch_size, rng)
            va, te = acc(x_val, y_val), acc(ds.x_test, ds.y_test)
            for k, v in (("loss", loss), ("train_acc", tr_acc), ("test_acc", te), ("val_acc", va)):
                history["hat"][k].append(v)
            bar.set_postfix(loss=f"{loss:.4f}", val=f"{100 * va:.2f}%", test=f"{100 * te:.2f}%")
            if va >= meta["best_val"]:  # ties go to the later, hardware-trained model
                meta.update(best_val=va, best_epoch=ep + 1)
                np.savez(best_path, *jax.tree.leaves(nnx.state(model)))
            meta.update(epoch=ep + 1)
            save(args.epochs + 2 + ep, trainer)
        # model selection on the validation split (epoch 0 = the PTQ model)
        saved = np.load(best_path)
        leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        nnx.update(model, jax.tree.unflatten(jax.tree.structure(nnx.state(model)), leaves))
        meta["hat_acc"] = acc(ds.x_test, ds.y_test)
        meta.update(phase="done")
        save(args.epochs + 2 + args.hat_epochs, trainer)
        timings["hardware-aware training"] = time.perf_counter() - t0
    else:  # resumed after the end
        hn.set_mode(model, "hardware")

    # ---- reports, figure, export
    stats = layer_stats(model, ds.x_test)
    acts = {n: getattr(l, "activation", None) for n, l in model.named_layers()}
    say(f"\nper-layer saturation on the test split (hardware mode, best epoch {meta['best_epoch']}):")
    say(saturation_report(stats, acts))
    png = plot_curves(history, meta["ptq_acc"], out / "training_curves.png")
    export_dir = export(model, out / "export", input_shape=ds.x_train.shape[1:])
    (out / "results.json").write_text(json.dumps(
        {k: meta[k] for k in ("float_acc", "ptq_acc", "hat_acc", "best_epoch")} | {"export": str(export_dir)},
        indent=1))
    timings["total"] = time.perf_counter() - t_start
    say("\n" + final_table(meta["float_acc"], meta["ptq_acc"], meta["hat_acc"], export_dir,
                           f"{target.name} ({getattr(target, 'variant', '-')})", timings))
    say(f"training curves: {png}")
    return {"float_acc": meta["float_acc"], "ptq_acc": meta["ptq_acc"], "hat_acc": meta["hat_acc"],
            "export": export_dir, "stats": stats, "history": history, "model": model, "best_epoch": meta["best_epoch"]}


def _config(args) -> dict:
    return {k: getattr(args, k) for k in ("model", "target", "variant", "lut_fn", "data", "seed", "limit",
                                          "val_fraction", "learn_scale")}


# -------------------------------------------------------------------- eval / export


def run_eval(args) -> dict:
    from hwjax._evaluate import evaluate
    from hwjax._export import load
    from train import _data

    m = load(args.export)
    flat = len(m.input_shape) == 1
    ds = _data.from_npz(args.data, flat=flat, seed=args.seed) if args.data else _data.digits(flat=flat, seed=args.seed)
    r = evaluate(m, (ds.x_test, ds.y_test), batch_size=args.batch_size, mesh=make_mesh(args.devices))
    print(f"{args.export}: {m.target.name} integer model, test accuracy {100 * r.accuracy:.2f}% "
          f"on {len(ds.y_test)} examples (bit-exact)")
    return {"accuracy": r.accuracy, "outputs": r.outputs}


def run_export(args) -> Path:
    from flax import nnx

    import hwjax.nn as hn
    from hwjax._export import export
    from train._ckpt import Checkpoints

    ckpt = Checkpoints(Path(args.run) / "checkpoints")
    step = ckpt.latest()
    if step is None:
        raise SystemExit(f"no checkpoint under {Path(args.run) / 'checkpoints'}")
    meta = ckpt.restore_meta(step)
    if meta["phase"] == "float":
        raise SystemExit("the run has not been calibrated yet (still in the float phase); resume it first")
    cfg = argparse.Namespace(**meta["config"])
    ds = load_data(cfg)
    model = build_model(cfg, make_target(cfg.target, cfg.variant), ds.classes, int(np.prod(ds.x_train.shape[1:])))
    state, _, _ = ckpt.restore(step, nnx.state(model), None)
    nnx.update(model, state)
    hn.set_mode(model, "hardware")
    path = export(model, args.out or Path(args.run) / "export", input_shape=ds.x_train.shape[1:])
    print(f"exported checkpoint {step} of {args.run} to {path}")
    return path


# ------------------------------------------------------------------------ argparse


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="xs3", choices=_TARGETS, help="chip to train for (default xs3)")
    p.add_argument("--variant", default="hardware", help="XS3 VPU model: hardware, host or v2021")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "lut_mlp"))
    p.add_argument("--lut-fn", default="tanh", choices=("tanh", "sigmoid"), help="lut_mlp activation")
    p.add_argument("--data", default=None, help=".npz with x_train/y_train/x_test/y_test or x/y "
                                               "(default: scikit-learn digits)")
    p.add_argument("--epochs", type=int, default=40, help="float training epochs")
    p.add_argument("--hat-epochs", type=int, default=10, help="hardware-aware training epochs")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--optimizer", default="adam", help="any optax optimiser name (adam, adamw, sgd, lion, ...)")
    p.add_argument("--lr", type=float, default=3e-3, help="float learning rate (cosine decay)")
    p.add_argument("--hat-lr", type=float, default=3e-4, help="hardware-aware learning rate (cosine decay)")
    p.add_argument("--learn-scale", action="store_true",
                   help="learn the activation step sizes in hardware-aware training (LSQ-style)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="training data held out for model selection")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use only the first N train/test examples")
    p.add_argument("--devices", type=int, default=None, help="data-parallel over this many devices")
    p.add_argument("--out", default=None, help="output folder (default runs/<dataset>)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--quiet", action="store_true")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hwjax", description="hwjax: hardware-aware training, evaluation, export")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("digits", "the digits demo: float, PTQ and hardware-aware training, export"),
                           ("train", "same as digits (use --data for another dataset)")):
        _train_args(sub.add_parser(name, help=helptext))
    e = sub.add_parser("eval", help="bit-exact accuracy of an exported model")
    e.add_argument("--export", required=True, help="folder written by hwjax.export")
    e.add_argument("--data", default=None)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--devices", type=int, default=None)
    x = sub.add_parser("export", help="export the latest checkpoint of a training run")
    x.add_argument("--run", required=True, help="training output folder (with checkpoints/)")
    x.add_argument("--out", default=None, help="export folder (default <run>/export)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in ("digits", "train"):
        if args.out is None:
            args.out = str(Path("runs") / (Path(args.data).stem if args.data else "digits"))
        run_training(args)
    elif args.command == "eval":
        run_eval(args)
    else:
        run_export(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
