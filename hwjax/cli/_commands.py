"""The ``hwjax run``, ``hwjax compare`` and ``hwjax finetune`` commands on model files
(``.tflite``, ``.onnx``: :data:`hwjax.cli.FORMATS`):
functions that return data (:func:`read_model`, :func:`read_input`, :func:`read_data`,
:func:`run_file`, :func:`compare`, :func:`comparison_json`), formatters (:func:`format_run`,
:func:`format_compare`) and :func:`plot_compare`. The argparse wiring is in
``train/__main__.py``; :data:`COMMANDS` maps a command to the function it calls with the
parsed arguments (it returns the text to print and raises :class:`hwjax.errors.HwjaxError`
or OSError, each message one line, for bad paths and inputs).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from hwjax.cli._formats import FORMATS, format_of, format_of_model
from hwjax.errors import FormatError, RangeError, ShapeError, UnsupportedOpError

_INPUT_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}

#: a loaded model of any format (``hwjax.tflite.Model``, ``hwjax.onnx.Model``): ``run(x, *,
#: runtime, intermediates)``, ``graph``, ``inputs`` / ``outputs`` with ``shape`` and ``dtype``
Model = Any


def read_model(path) -> Model:
    """The model in file ``path`` (its format by suffix: :func:`hwjax.cli.format_of`);
    FormatError (naming the path) for a missing, unreadable or malformed file."""
    fmt = format_of(path)
    if not os.path.isfile(path):
        raise FormatError(f"MODEL {str(path)!r}: no such file")
    try:
        return fmt.module.load(path)
    except (FormatError, UnsupportedOpError) as e:
        raise type(e)(f"MODEL {str(path)!r}: {e}") from None


def runtimes_of(model: Model) -> tuple[str, ...]:
    """The runtime names ``model``'s format runs (the first is its default reference)."""
    return format_of_model(model).runtimes


def _runtimes_option(args, fmt) -> tuple[str, ...]:
    """``--runtimes`` (default: every runtime of the model file's format), checked."""
    given = getattr(args, "runtimes", None)
    return check_runtimes(fmt.runtimes if given is None else given, allowed=fmt.runtimes)


def _check_runtime(runtime, allowed, option: str = "--runtime") -> str:
    if runtime not in allowed:
        raise RangeError(f"{option} must be one of {', '.join(allowed)} for this model, got {runtime!r}")
    return runtime


def read_input(path, model: Model) -> np.ndarray:
    """The ``.npy`` array at ``path`` as a batch for ``model``'s single input.

    The array has shape ``(batch, *per_example)`` or ``per_example`` (one example: a
    batch axis is added), where ``per_example`` is the file's input shape without its
    batch-1 axis; an integer dtype with values in the input's int8 / uint8 range, or finite
    floats for a float32 input. Returns an
    array of the input's dtype. FormatError for a missing or non-``.npy`` file,
    ShapeError / RangeError for a wrong shape, dtype or values, UnsupportedOpError for a
    model with several inputs.
    """
    if len(model.inputs) != 1:
        raise UnsupportedOpError(f"the model has {len(model.inputs)} inputs; run/compare take one-input models")
    info = model.inputs[0]
    if not os.path.isfile(path):
        raise FormatError(f"--input {str(path)!r}: no such file")
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"--input {str(path)!r}: not a .npy array file ({type(e).__name__})") from None
    per = tuple(info.shape[1:])
    if tuple(x.shape) == per:
        x = x[None]
    if x.ndim != len(per) + 1 or tuple(x.shape[1:]) != per or x.shape[0] < 1:
        raise ShapeError(
            f"--input {str(path)!r}: shape {tuple(x.shape)}; the model takes (batch, "
            f"{', '.join(map(str, per))}) or ({', '.join(map(str, per))})"
        )
    if info.dtype == "float32":
        if not np.issubdtype(x.dtype, np.floating) or not np.all(np.isfinite(x)):
            raise RangeError(f"--input {str(path)!r}: the model's input is float32; give finite floats, got {x.dtype}")
        return x.astype(np.float32)
    if not np.issubdtype(x.dtype, np.integer):
        raise ShapeError(f"--input {str(path)!r}: dtype {x.dtype}; the model takes integer ({info.dtype}) values")
    lo, hi = _INPUT_RANGES[info.dtype]
    if x.size and (int(x.min()) < lo or int(x.max()) > hi):
        raise RangeError(
            f"--input {str(path)!r}: values in [{int(x.min())}, {int(x.max())}] outside {info.dtype} [{lo}, {hi}]"
        )
    return x.astype(info.dtype)


# ------------------------------------------------------------------------------ run


@dataclass(frozen=True)
class RunResult:
    """One ``hwjax run``: the model file, the runtime, its input and output batches."""

    model: str
    runtime: str
    x: np.ndarray
    y: np.ndarray


def run_file(model_path, input_path, runtime: Optional[str] = None) -> RunResult:
    """Runs model file ``model_path`` on the ``.npy`` batch ``input_path``
    (:func:`read_input`) as ``runtime`` does (``Model.run``; default: the format's first
    runtime)."""
    fmt = format_of(model_path)
    runtime = _check_runtime(fmt.reference if runtime is None else runtime, fmt.runtimes)
    model = read_model(model_path)
    x = read_input(input_path, model)
    y = np.asarray(model.run(x, runtime=runtime))
    return RunResult(str(model_path), runtime, x, y)


def _stats(a: np.ndarray) -> str:
    return (
        f"{tuple(a.shape)} {a.dtype}, values in [{a.min():.6g}, {a.max():.6g}]"
        if a.size and np.issubdtype(a.dtype, np.floating)
        else f"{tuple(a.shape)} {a.dtype}, values in [{int(a.min())}, {int(a.max())}]"
        if a.size
        else f"{tuple(a.shape)} {a.dtype}"
    )


def format_run(r: RunResult, output: Optional[str] = None) -> str:
    """``MODEL (runtime): input SHAPE DTYPE, values in [lo, hi] -> output ...`` and, when
    ``output`` is given, where the output was written."""
    text = f"{r.model} ({r.runtime}): input {_stats(r.x)} -> output {_stats(r.y)}"
    return text + (f"\nwrote {output}" if output else "")


# -------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class LayerDiff:
    """How one tensor of one runtime differs from the reference runtime's: ``differ``
    of ``size`` values differ, by at most ``max_abs`` (0 when none; a float for float
    tensors, whose values are compared bit for bit)."""

    tensor: str
    op: str
    size: int
    differ: int
    max_abs: int | float

    @property
    def percent(self) -> float:
        return 100.0 * self.differ / self.size if self.size else 0.0


@dataclass(frozen=True)
class RuntimeDiff:
    """One runtime against the reference: ``layers`` in graph order, or ``None`` with
    ``reason`` when the runtime cannot run the model (an UnsupportedOpError)."""

    runtime: str
    layers: Optional[tuple[LayerDiff, ...]]
    reason: Optional[str] = None


@dataclass(frozen=True)
class Comparison:
    """:func:`compare`'s result: the reference runtime, the tensors (name, producing op
    kind) in graph order, and one :class:`RuntimeDiff` per other runtime."""

    reference: str
    tensors: tuple[tuple[str, str], ...]
    runtimes: tuple[RuntimeDiff, ...]


def _tensors(model: Model) -> tuple[tuple[str, str], ...]:
    return tuple((t, n.op) for n in model.graph.nodes for t in n.outputs)


def check_runtimes(runtimes, option: str = "--runtimes", allowed: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """``runtimes`` (a sequence of names or one comma-separated string) as a tuple of
    distinct names from ``allowed`` (default: ``.tflite``'s runtimes); RangeError naming
    ``option`` otherwise."""
    if allowed is None:
        from hwjax.tflite import MODEL_RUNTIMES as allowed
    if isinstance(runtimes, str):
        runtimes = [r.strip() for r in runtimes.split(",") if r.strip()]
    runtimes = tuple(runtimes)
    bad = [r for r in runtimes if r not in allowed]
    if bad or not runtimes:
        raise RangeError(
            f"{option} takes a comma-separated list from {', '.join(allowed)} for this model; got {bad or 'none'}"
        )
    return tuple(dict.fromkeys(runtimes))


def _as_compared(a) -> np.ndarray:
    """Integers as int64; floats as float64 (every float32 value exactly)."""
    a = np.asarray(a)
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a.astype(np.int64)


def compare(model: Model, x, runtimes: Optional[Sequence[str]] = None, reference: Optional[str] = None) -> Comparison:
    """Every node output of ``model`` on batch ``x`` under each of ``runtimes`` (other
    than ``reference``), compared value by value with ``reference``'s (floats bit for bit:
    NaNs equal where both are NaN). Defaults: every runtime of the model's format, and its
    first as the reference.

    A runtime whose ops raise UnsupportedOpError gets ``layers=None`` and the error's
    message as ``reason``; the reference must run (its error propagates). A tensor that a
    runtime's graph does not hold with the reference's shape counts as all values differing,
    ``max_abs`` -1.
    """
    allowed = runtimes_of(model)
    runtimes = check_runtimes(allowed if runtimes is None else runtimes, allowed=allowed)
    reference = allowed[0] if reference is None else reference
    check_runtimes([reference], "--reference", allowed)
    _, ref = model.run(x, runtime=reference, intermediates=True)
    tensors = _tensors(model)
    ref = {t: _as_compared(ref[t]) for t, _ in tensors}
    out = []
    for rt in runtimes:
        if rt == reference:
            continue
        try:
            _, got = model.run(x, runtime=rt, intermediates=True)
        except UnsupportedOpError as e:
            out.append(RuntimeDiff(rt, None, str(e)))
            continue
        layers = []
        for t, op in tensors:
            g = got.get(t)
            if g is None or tuple(np.shape(g)) != ref[t].shape:
                layers.append(LayerDiff(t, op, int(ref[t].size), int(ref[t].size), -1))
                continue
            g = _as_compared(g)
            if g.dtype == np.float64 or ref[t].dtype == np.float64:
                g, r = g.astype(np.float64), ref[t].astype(np.float64)
                same = (g == r) | (np.isnan(g) & np.isnan(r))
                d = np.where(same, 0.0, np.abs(g - r))
                d = np.where(np.isnan(d), np.inf, d)
                layers.append(LayerDiff(t, op, int(d.size), int(np.count_nonzero(~same)), float(d.max(initial=0.0))))
                continue
            d = np.abs(g - ref[t])
            layers.append(LayerDiff(t, op, int(d.size), int(np.count_nonzero(d)), int(d.max(initial=0))))
        out.append(RuntimeDiff(rt, tuple(layers)))
    return Comparison(reference, tensors, tuple(out))


def short_name(name: str, limit: int = 28) -> str:
    """A readable form of a (TensorFlow-fused) tensor name, at most ``limit`` characters: the
    first of its ``;``-separated names, without a ``:N`` suffix, its last two ``/`` parts;
    longer ones keep their end after ``...``."""
    first = re.sub(r":\d+$", "", name.split(";")[0])
    parts = [p for p in first.split("/") if p]
    s = "/".join(parts[-2:]) if parts else first
    return s if len(s) <= limit else "..." + s[-(limit - 3) :]


def _pct(d: LayerDiff) -> str:
    p = d.percent
    return f"{p:.0f}" if p >= 10 else f"{p:.2g}"


def _count(n: int) -> str:
    """``n`` below 10,000 as it is; larger with a k (thousands) or M (millions) suffix, three
    significant digits at most."""
    if n < 10_000:
        return str(n)
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div:
            v = n / div
            return f"{v:.0f}{suffix}" if v >= 100 else f"{v:.3g}{suffix}"
    return str(n)


def _cell(d: LayerDiff) -> str:
    if d.max_abs < 0:
        return "missing"
    size = f"{d.max_abs:.3g}" if isinstance(d.max_abs, float) else str(d.max_abs)
    return "0" if d.differ == 0 else f"{_count(d.differ)} ({_pct(d)}%) \u00b1{size}"


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: the widest line :func:`format_compare` writes (tensor names are shortened to fit)
TABLE_WIDTH = 100


def format_compare(c: Comparison, width: int = TABLE_WIDTH) -> str:
    """A table, one row per tensor in graph order (its index, op kind and :func:`short_name`),
    one column per runtime that ran: ``0`` where every value equals the reference's, else
    ``N (P%) ±D``: N differing values (from 10,000 on with a k or M suffix), P percent of the
    tensor (a whole number from 10 on, else two significant digits), D the largest absolute
    difference; a line ``RUNTIME: n/a (reason)`` for each runtime
    that could not run. Lines are at most ``width`` characters where the runtime columns
    leave at least 12 for the tensor names (the full names are in :func:`comparison_json`)."""
    ran = [r for r in c.runtimes if r.layers is not None]
    cells = [[_cell(r.layers[i]) for r in ran] for i in range(len(c.tensors))]
    idx_w = len(str(max(len(c.tensors) - 1, 0)))
    op_w = max([2, *(len(op) for _, op in c.tensors)])
    rt_w = [max([len(r.runtime), *(len(row[k]) for row in cells)]) for k, r in enumerate(ran)]
    fixed = idx_w + op_w + sum(rt_w) + 2 * (len(ran) + 2)
    name_w = max(12, min(width - fixed, max([6, *(len(short_name(t, 60)) for t, _ in c.tensors)])))
    header = ["#", "op", "tensor", *[r.runtime for r in ran]]
    rows = [[str(i), op, short_name(t, name_w), *cells[i]] for i, (t, op) in enumerate(c.tensors)]
    widths = [idx_w, op_w, name_w, *rt_w]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [
        f"values that differ from {c.reference}'s: count (percent of the tensor) \u00b1largest difference",
        fmt.format(*header).rstrip(),
        fmt.format(*["-" * w for w in widths]),
    ]
    lines += [fmt.format(*row).rstrip() for row in rows]
    lines += [
        f"{r.runtime}: n/a ({_one_line(r.reason or '', width - len(r.runtime) - 8)})"
        for r in c.runtimes
        if r.layers is None
    ]
    return "\n".join(lines)


def comparison_json(c: Comparison, *, model: str = "", examples: int = 0) -> dict:
    """:func:`compare`'s result as JSON-ready data: ``model``, ``examples``, ``reference``,
    ``runtimes`` (``[{"runtime", "ran", "reason"}]``) and ``tensors``, in graph order:
    ``{"index", "name" (the full tensor name), "short", "op", "size", "differ": {runtime: N},
    "max_abs": {runtime: D}}`` for the runtimes that ran (``max_abs`` -1: the runtime's graph
    does not hold the tensor)."""
    ran = [r for r in c.runtimes if r.layers is not None]
    return {
        "model": model,
        "examples": examples,
        "reference": c.reference,
        "runtimes": [{"runtime": r.runtime, "ran": r.layers is not None, "reason": r.reason} for r in c.runtimes],
        "tensors": [
            {
                "index": i,
                "name": t,
                "short": short_name(t),
                "op": op,
                "size": ran[0].layers[i].size if ran else None,
                "differ": {r.runtime: r.layers[i].differ for r in ran},
                "max_abs": {r.runtime: r.layers[i].max_abs for r in ran},
            }
            for i, (t, op) in enumerate(c.tensors)
        ],
    }


def plot_compare(c: Comparison, path, *, title: str = "") -> None:
    """Writes a PNG at ``path`` (matplotlib, Agg): per tensor in graph order (x axis, labelled
    ``index op``), the percent of its values each runtime computes differently from the
    reference (top, grouped bars, log scale) and the largest absolute difference (bottom). The
    legend, above the bars, says per runtime how many tensors differ (a runtime equal to the
    reference everywhere has no bars); runtimes that could not run are named in the title.
    FormatError naming ``--plot`` when matplotlib is missing or the file cannot be written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise FormatError("--plot needs matplotlib (pip install 'hwjax[train]')") from None
    ran = [r for r in c.runtimes if r.layers is not None]
    n = len(c.tensors)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8.0, 0.32 * n + 2), 6.5), sharex=True)
    xs = np.arange(n)
    differing = [r for r in ran if any(d.differ for d in r.layers)]  # the others take no bar slot
    w = 0.8 / max(len(differing), 1)
    handles = []
    for k, r in enumerate(ran):
        differ = sum(d.differ > 0 for d in r.layers)
        if not differ:  # a legend entry without bars: an empty box
            handles.append(Patch(facecolor="none", edgecolor="0.5", label=f"{r.runtime}: equal everywhere"))
            continue
        off = xs - 0.4 + w * (differing.index(r) + 0.5)
        label = f"{r.runtime}: {differ} of {n} tensors differ"
        handles.append(top.bar(off, [d.percent for d in r.layers], w, label=label, color=f"C{k}"))
        bottom.bar(off, [max(d.max_abs, 0) for d in r.layers], w, color=f"C{k}")
    if differing:
        top.set_yscale("log")  # a few values in a large tensor stay visible
    elif ran:
        top.text(0.5, 0.5, f"every value equals {c.reference}'s", transform=top.transAxes, ha="center", va="center")
    top.set_ylabel(f"% of values != {c.reference}" + (" (log)" if differing else ""))
    top.set_xlim(-0.5, n - 0.5)
    bottom.set_ylabel("max |difference| (LSB)")
    bottom.set_xticks(xs)
    bottom.set_xticklabels([f"{i} {op}" for i, (_, op) in enumerate(c.tensors)], rotation=70, fontsize=7)
    bottom.set_xlabel("tensor (graph order)")
    skipped = [r.runtime for r in c.runtimes if r.layers is None]
    head = title or "values computed differently from the reference, per tensor"
    fig.suptitle(head + (f" ({', '.join(skipped)}: n/a)" if skipped else ""), fontsize=10)
    if ran:  # above the bars, never over them
        cols = len(ran) if len(ran) <= 3 else (len(ran) + 1) // 2
        top.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=cols, fontsize=8, frameon=False)
    for ax in (top, bottom):
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as e:
        raise FormatError(f"--plot {str(path)!r}: cannot write ({e.strerror or e})") from None
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------- CLI glue


def run_command(args) -> str:
    """``hwjax run MODEL --runtime RT --input X [--output Y]``: the summary to print
    (writes ``Y`` with :func:`numpy.save` when given)."""
    r = run_file(args.model, args.input, args.runtime)
    if args.output:
        try:
            with open(args.output, "wb") as f:  # exactly this path (np.save(name) would add ".npy")
                np.save(f, r.y)
        except OSError as e:
            raise FormatError(f"--output {args.output!r}: cannot write ({e.strerror or e})") from None
    return format_run(r, args.output)


def compare_command(args) -> str:
    """``hwjax compare MODEL --input X [--runtimes A,B] [--reference R] [--json F] [--plot P]``:
    the table to print; writes the JSON (:func:`comparison_json`) and the PNG
    (:func:`plot_compare`) when asked."""
    fmt = format_of(args.model)
    runtimes = _runtimes_option(args, fmt)
    reference = getattr(args, "reference", None) or fmt.reference
    check_runtimes([reference], "--reference", fmt.runtimes)
    model = read_model(args.model)
    x = read_input(args.input, model)
    c = compare(model, x, runtimes, reference)
    text = format_compare(c)
    if getattr(args, "json", None):
        data = comparison_json(c, model=str(args.model), examples=len(x))
        _write(args.json, "--json", lambda f: f.write(json.dumps(data, indent=1).encode()))
        text += f"\nwrote {args.json}"
    if getattr(args, "plot", None):
        plot_compare(c, args.plot, title=f"{os.path.basename(str(args.model))}: values != {reference}, per tensor")
        text += f"\nwrote {args.plot}"
    return text


def _write(path, option: str, fn) -> None:
    try:
        with open(path, "wb") as f:
            fn(f)
    except OSError as e:
        raise FormatError(f"{option} {str(path)!r}: cannot write ({e.strerror or e})") from None


# ------------------------------------------------------------------------- finetune


def read_data(path, model: Model, option: str = "--data") -> tuple[np.ndarray, np.ndarray]:
    """The ``.npz`` file at ``path`` as ``(x, y)`` for ``model``: ``x`` the inputs as the file
    takes them (``(n, *input_shape[1:])``; integer values in int8 range for an int8 input,
    float for a float32 one), ``y`` the ``n`` integer class labels in ``[0, classes)``.
    FormatError / ShapeError / RangeError naming ``option`` otherwise."""
    where = f"{option} {str(path)!r}"
    if not os.path.isfile(path):
        raise FormatError(f"{where}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{where}: not a .npz archive ({type(e).__name__})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise FormatError(f"{where}: needs arrays 'x' and 'y', has {sorted(arrays)}")
    x, y = arrays["x"], arrays["y"]
    info = model.inputs[0]
    per = tuple(info.shape[1:])
    if x.ndim != len(per) + 1 or tuple(x.shape[1:]) != per or len(x) < 1:
        raise ShapeError(f"{where}: x has shape {tuple(x.shape)}; the model takes (n, {', '.join(map(str, per))})")
    if info.dtype == "float32":
        if not np.issubdtype(x.dtype, np.floating) or not np.all(np.isfinite(x)):
            raise RangeError(f"{where}: the model's input is float32; x must hold finite floats, got {x.dtype}")
        x = x.astype(np.float32)
    else:
        if not np.issubdtype(x.dtype, np.integer):
            raise RangeError(f"{where}: x has dtype {x.dtype}; the model takes integer ({info.dtype}) values")
        lo, hi = _INPUT_RANGES[info.dtype]
        if int(x.min()) < lo or int(x.max()) > hi:
            raise RangeError(
                f"{where}: x holds values in [{int(x.min())}, {int(x.max())}] outside {info.dtype} [{lo}, {hi}]"
            )
        x = x.astype(info.dtype)
    classes = int(np.prod(model.outputs[0].shape[1:]))
    if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
        raise ShapeError(
            f"{where}: y must be {len(x)} integer labels (shape ({len(x)},)), got {y.dtype} {tuple(y.shape)}"
        )
    if int(y.min()) < 0 or int(y.max()) >= classes:
        raise RangeError(f"{where}: labels in [{int(y.min())}, {int(y.max())}]; the model has {classes} classes")
    return x, y.astype(np.int32)


class Report(str):
    """A command's text with the process exit code (``exit_code``, 0 when the command's checks
    passed)."""

    exit_code: int = 0


def _accuracies(model: Model, x, y, runtimes) -> dict:
    from hwjax.nn import accuracy

    out = {}
    for rt in runtimes:
        try:
            out[rt] = accuracy(np.asarray(model.run(x, runtime=rt)), y)
        except UnsupportedOpError as e:
            out[rt] = _one_line(str(e), 70)
    return out


def finetune_command(args) -> Report:
    """``hwjax finetune MODEL --data TRAIN.npz [--validation VAL.npz] --runtime RT --epochs N
    --batch-size B --lr LR --out TUNED.tflite [--runtimes A,B] [--seed S] [--quiet]``.

    Fine-tunes with the format's ``finetune`` (:func:`hwjax.tflite.finetune`,
    :func:`hwjax.onnx.finetune`; Adam at ``--lr``, the default loss), writes
    the tuned file, and reports top-1 accuracy of the original and the written file under each
    of ``--runtimes`` (default all) on the validation data (the training data without
    ``--validation``), and the reload check: the written file, loaded again, run under
    ``--runtime`` on those inputs, against the trained modules' outputs (floats bit for bit).
    The exit code is 1 when any value differs."""
    import optax

    fmt = format_of(args.model)
    if not fmt.finetune:
        raise UnsupportedOpError(
            f"MODEL {str(args.model)!r}: hwjax finetune takes "
            f"{', '.join(f.suffix for f in FORMATS.values() if f.finetune)} files, not {fmt.suffix}"
        )
    if os.path.splitext(str(args.out))[1].lower() != fmt.suffix:
        raise FormatError(f"--out {args.out!r}: the tuned model is written as a {fmt.suffix} file; name it so")
    finetune, load, predict, save = (getattr(fmt.module, n) for n in ("finetune", "load", "predict", "save"))
    runtime = _check_runtime(args.runtime or fmt.reference, fmt.runtimes)
    runtimes = _runtimes_option(args, fmt)
    for name in ("epochs", "batch_size"):
        v = getattr(args, name)
        if not isinstance(v, int) or v < 1:
            raise RangeError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
    if not (isinstance(args.lr, float) and np.isfinite(args.lr) and args.lr > 0):
        raise RangeError(f"--lr must be a finite number > 0, got {args.lr!r}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise FormatError(f"--out {args.out!r}: folder {out_dir!r} does not exist")
    model = read_model(args.model)
    x, y = read_data(args.data, model, "--data")
    xv, yv = read_data(args.validation, model, "--validation") if args.validation else (x, y)
    before = _accuracies(model, xv, yv, runtimes)
    r = finetune(
        model,
        x,
        y,
        runtime=runtime,
        optimizer=optax.adam(args.lr),
        epochs=args.epochs,
        batch_size=args.batch_size,
        validation=(xv, yv),
        seed=args.seed,
        progress=not args.quiet,
    )
    _write(args.out, "--out", lambda f: f.write(save(r.model)))
    tuned = load(args.out)
    mine = _as_compared(predict(r.trainable, xv))
    theirs = _as_compared(tuned.run(xv, runtime=runtime))
    differ = int(np.count_nonzero((mine != theirs) & ~(np.isnan(mine) & np.isnan(theirs))))
    after = _accuracies(tuned, xv, yv, runtimes)
    on = f"{len(xv)} {'validation' if args.validation else 'training'} examples"
    lines = [
        f"fine-tuned {args.model} in {runtime}'s arithmetic: {args.epochs} epoch(s), {r.steps} steps of "
        f"{min(args.batch_size, len(x))} examples; mean loss per epoch {', '.join(f'{v:.4f}' for v in r.losses)}",
        f"wrote {args.out}",
        "",
        f"top-1 accuracy on {on}:",
    ]
    w = max(len(rt) for rt in runtimes)
    lines.append(f"{'runtime':<{w}}  {'original':>8}  {'tuned':>8}")
    for rt in runtimes:
        b, a = before[rt], after[rt]
        if isinstance(b, float) and isinstance(a, float):
            lines.append(f"{rt:<{w}}  {b:>8.4f}  {a:>8.4f}")
        else:
            lines.append(f"{rt:<{w}}  n/a ({a if isinstance(a, str) else b})")
    lines += [
        "",
        f"reload check: {args.out} loaded again, run on {runtime} over the {on}: {differ} of {mine.size} "
        f"output values differ from the trained modules' ({'exact' if differ == 0 else 'FAILED'})",
    ]
    rep = Report("\n".join(lines))
    rep.exit_code = 0 if differ == 0 else 1
    return rep


#: command name -> ``fn(parsed args) -> text to print`` (a :class:`Report` carries an exit code)
COMMANDS = {"run": run_command, "compare": compare_command, "finetune": finetune_command}
