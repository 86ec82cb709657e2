"""``python -m train deployed``: a deployed model from load to fine-tuned file, on digits.

The model is ``tests/data/keras/digits_cnn.tflite``: TensorFlow's full-integer conversion of a
small Keras CNN trained on scikit-learn's 8x8 digits (``scripts/keras_digits.py``). The demo

1. quantises the held-out digits (the split ``python -m train digits`` uses) with the file's
   input scale and zero point, and measures top-1 accuracy under each runtime;
2. fine-tunes the model for one runtime (``--runtime``, default ``xs3``) on the training digits
   with :func:`hwjax.tflite.finetune`;
3. writes the tuned file (:func:`hwjax.tflite.save`), loads it again and checks that it computes
   on that runtime exactly the trained modules' output integers;
4. prints the accuracy of the original and the tuned file under each runtime, and how many
   held-out predictions fine-tuning changed.

It exits 1 if the written file does not compute the trained modules' integers.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

import numpy as np

#: the stored converter-made digits model (found in the repository checkout)
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "tests" / "data" / "keras" / "digits_cnn.tflite"


def add_args(p: argparse.ArgumentParser, positive, count, rate) -> None:
    """The ``deployed`` subcommand's options (``positive`` / ``count`` / ``rate``: the CLI's
    argument types for ints >= 1, ints >= 0 and positive floats)."""
    from hwjax.tflite import MODEL_RUNTIMES

    p.add_argument("--model", default=str(DEFAULT_MODEL), metavar="MODEL.tflite", help="an int8 digits classifier")
    p.add_argument("--runtime", default="xs3", choices=MODEL_RUNTIMES, help="the runtime to fine-tune for")
    p.add_argument(
        "--runtimes",
        default=",".join(MODEL_RUNTIMES),
        metavar="A,B,...",
        help="runtimes to measure accuracy under (default all)",
    )
    p.add_argument("--epochs", type=positive, default=2)
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--lr", type=rate, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=count, default=0, help="shuffling seed")
    p.add_argument("--limit", type=positive, default=None, help="use only the first N train / held-out digits")
    p.add_argument("--out", default="runs/deployed", help="folder for the tuned file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def quantise(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Float inputs as the file's int8 input: ``round(x / scale) + zero_point`` (half to even),
    clipped to [-128, 127]."""
    return np.clip(np.round(x / np.float32(scale)) + zero_point, -128, 127).astype(np.int8)


def _accuracy(outputs, labels) -> float:
    return float(np.mean(np.asarray(outputs).reshape(len(labels), -1).argmax(axis=1) == labels))


def run(args) -> int:
    """The demo; returns the exit code (0, or 1 when the reload check fails). A bad option
    exits 2 with one line naming it."""
    import optax

    import hwjax.tflite as tfl
    from hwjax.errors import HwjaxError

    from ._data import digits

    def fail(option: str, why: str):
        raise SystemExit(f"hwjax deployed: error: {option}: {why}")

    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    bad = [r for r in runtimes if r not in tfl.MODEL_RUNTIMES]
    if not runtimes or bad:
        fail("--runtimes", f"choose from {','.join(tfl.MODEL_RUNTIMES)} (got {args.runtimes!r})")
    if args.runtime not in runtimes:
        runtimes.append(args.runtime)
    try:
        model = tfl.load(args.model)
    except (HwjaxError, OSError) as e:
        fail("--model", " ".join(str(e).split()))
    info = model.inputs[0]
    if info.dtype != "int8" or tuple(info.shape[1:]) != (8, 8, 1) or int(np.prod(model.outputs[0].shape[1:])) != 10:
        fail("--model", f"expected an int8 (1, 8, 8, 1) -> 10 classes model, got {info.dtype} {info.shape}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail("--out", f"cannot create {out} ({e.strerror or e})")

    scale, zero = float(np.asarray(info.scale).reshape(-1)[0]), int(np.asarray(info.zero_point).reshape(-1)[0])
    ds = digits(seed=0)
    if args.limit:
        ds = ds.limit(args.limit)
    x_tr, x_te = quantise(ds.x_train, scale, zero), quantise(ds.x_test, scale, zero)
    y_tr, y_te = ds.y_train, ds.y_test
    print(f"model: {args.model}")
    print(
        f"digits: {len(x_tr)} training and {len(x_te)} held-out images, quantised with the file's input scale "
        f"{scale:.6g} and zero point {zero}"
    )

    t0 = time.perf_counter()
    before = {r: _outputs(model, x_te, r) for r in runtimes}
    print(f"accuracy of the original under {len(runtimes)} runtimes ({time.perf_counter() - t0:.1f} s)")

    t0 = time.perf_counter()
    r = tfl.finetune(
        model,
        x_tr,
        y_tr,
        runtime=args.runtime,
        optimizer=optax.adam(args.lr),
        epochs=args.epochs,
        batch_size=args.batch_size,
        validation=(x_te, y_te),
        seed=args.seed,
        progress=not args.quiet,
    )
    print(
        f"fine-tuned for {args.runtime}: {r.steps} steps of {min(args.batch_size, len(x_tr))} examples, Adam "
        f"{args.lr:g}; training loss per epoch {', '.join(f'{v:.4f}' for v in r.losses)} "
        f"({time.perf_counter() - t0:.1f} s)"
    )

    path = out / f"{Path(args.model).stem}.{args.runtime}.tflite"
    tfl.save(r.model, str(path))
    tuned = tfl.load(str(path))
    mine = tfl.predict(r.trainable, x_te)
    again = np.asarray(tuned.run(x_te, runtime=args.runtime))
    differ = int(np.sum(again != mine))
    after = {rt: (again if rt == args.runtime else _outputs(tuned, x_te, rt)) for rt in runtimes}

    rows = [("runtime", "original", "tuned", "predictions changed")]
    for rt in runtimes:
        b, a = before[rt], after[rt]
        if b is None or a is None:
            rows.append((rt, "n/a", "n/a", ""))
            continue
        changed = int(np.sum(b.argmax(axis=1) != a.argmax(axis=1)))
        rows.append((rt, f"{_accuracy(b, y_te):.4f}", f"{_accuracy(a, y_te):.4f}", str(changed)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print(f"\ntop-1 accuracy on the {len(x_te)} held-out digits, original file and the file tuned for {args.runtime}:")
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(_summary(before.get(args.runtime), again, y_te, args.runtime))
    verdict = "exact" if differ == 0 else "MISMATCH"
    print(
        f"\nwrote {path}; loaded again, on {args.runtime} it computes the trained modules' outputs: "
        f"{differ} of {again.size} values differ ({verdict})"
    )
    return 0 if differ == 0 else 1


def _outputs(model, x, runtime) -> Optional[np.ndarray]:
    """``model.run(x, runtime)`` as an int8 array, or None where the runtime cannot run it."""
    from hwjax.errors import UnsupportedOpError

    try:
        return np.asarray(model.run(x, runtime=runtime))
    except UnsupportedOpError:
        return None


def _summary(before: Optional[np.ndarray], after: np.ndarray, labels: np.ndarray, runtime: str) -> str:
    """What fine-tuning changed on its own runtime, in words: predictions that became right,
    that became wrong, and the net change."""
    if before is None:
        return ""
    pb, pa = before.argmax(axis=1), after.argmax(axis=1)
    fixed = int(np.sum((pb != labels) & (pa == labels)))
    broke = int(np.sum((pb == labels) & (pa != labels)))
    moved = int(np.sum(pb != pa))
    if moved == 0:
        values = int(np.sum(before != after))
        return (
            f"on {runtime}, fine-tuning changed no held-out prediction ({values} of {after.size} output values moved)"
        )
    between = moved - fixed - broke
    return (
        f"on {runtime}, fine-tuning changed {moved} held-out predictions: {fixed} became right, {broke} became "
        f"wrong"
        + (f", {between} moved from one wrong class to another" if between else "")
        + f" (net {fixed - broke:+d})"
    )
