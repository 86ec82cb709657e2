"""The ``hwjax run`` and ``hwjax compare`` commands on ``.tflite`` files: functions that
return data (:func:`read_model`, :func:`read_input`, :func:`run_file`, :func:`compare`)
and formatters (:func:`format_run`, :func:`format_compare`). The argparse wiring is in
``train/__main__.py``; :data:`COMMANDS` maps a command to the function it calls with the
parsed arguments (it returns the text to print and raises :class:`hwjax.errors.HwjaxError`
or OSError, each message one line, for bad paths and inputs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from hwjax.errors import FormatError, RangeError, ShapeError, UnsupportedOpError
from hwjax.tflite._model import MODEL_RUNTIMES, RUNTIMES, Model, load

_INPUT_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def read_model(path) -> Model:
    """The :class:`Model` in ``.tflite`` file ``path``; FormatError (naming the path) for
    a missing, unreadable or malformed file."""
    if not os.path.isfile(path):
        raise FormatError(f"MODEL {str(path)!r}: no such file")
    try:
        return load(path)
    except (FormatError, UnsupportedOpError) as e:
        raise type(e)(f"MODEL {str(path)!r}: {e}") from None


def read_input(path, model: Model) -> np.ndarray:
    """The ``.npy`` array at ``path`` as a batch for ``model``'s single input.

    The array has shape ``(batch, *per_example)`` or ``per_example`` (one example: a
    batch axis is added), where ``per_example`` is the file's input shape without its
    batch-1 axis; an integer dtype; values in the input's int8 / uint8 range. Returns an
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


def run_file(model_path, input_path, runtime: str = "reference") -> RunResult:
    """Runs ``.tflite`` file ``model_path`` on the ``.npy`` batch ``input_path``
    (:func:`read_input`) as ``runtime`` does (:meth:`Model.run`)."""
    if runtime not in MODEL_RUNTIMES:
        raise RangeError(f"--runtime must be one of {MODEL_RUNTIMES}, got {runtime!r}")
    model = read_model(model_path)
    x = read_input(input_path, model)
    y = np.asarray(model.run(x, runtime=runtime))
    return RunResult(str(model_path), runtime, x, y)


def _stats(a: np.ndarray) -> str:
    return (
        f"{tuple(a.shape)} {a.dtype}, values in [{int(a.min())}, {int(a.max())}]"
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
    of ``size`` values differ, by at most ``max_abs`` (0 when none)."""

    tensor: str
    op: str
    size: int
    differ: int
    max_abs: int

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


def compare(model: Model, x, runtimes: Sequence[str] = RUNTIMES, reference: str = "reference") -> Comparison:
    """Every node output of ``model`` on batch ``x`` under each of ``runtimes`` (other
    than ``reference``), compared value by value with ``reference``'s.

    A runtime whose ops raise UnsupportedOpError gets ``layers=None`` and the error's
    message as ``reason``; the reference must run (its error propagates).
    """
    _, ref = model.run(x, runtime=reference, intermediates=True)
    tensors = _tensors(model)
    ref = {t: np.asarray(ref[t], np.int64) for t, _ in tensors}
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
            d = np.abs(np.asarray(got[t], np.int64) - ref[t])
            layers.append(LayerDiff(t, op, int(d.size), int(np.count_nonzero(d)), int(d.max(initial=0))))
        out.append(RuntimeDiff(rt, tuple(layers)))
    return Comparison(reference, tensors, tuple(out))


def _cell(d: LayerDiff) -> str:
    return "0" if d.differ == 0 else f"{d.differ} ({d.percent:.2f}%) max {d.max_abs}"


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_compare(c: Comparison) -> str:
    """A table, one row per tensor in graph order, one column per runtime that ran:
    ``0`` where every value equals the reference's, else ``N (P%) max D`` (P with two decimals) (N differing
    values, P percent of the tensor, D the largest absolute difference); a line
    ``RUNTIME: n/a (reason)`` for each runtime that could not run."""
    ran = [r for r in c.runtimes if r.layers is not None]
    header = ["tensor", "op", *[f"{r.runtime} vs {c.reference}" for r in ran]]
    rows = [[t, op, *[_cell(r.layers[i]) for r in ran]] for i, (t, op) in enumerate(c.tensors)]
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header).rstrip(), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*row).rstrip() for row in rows]
    lines += [f"{r.runtime}: n/a ({_one_line(r.reason or '')})" for r in c.runtimes if r.layers is None]
    return "\n".join(lines)


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
    """``hwjax compare MODEL --input X``: the table to print."""
    model = read_model(args.model)
    return format_compare(compare(model, read_input(args.input, model)))


#: command name -> ``fn(parsed args) -> text to print``
COMMANDS = {"run": run_command, "compare": compare_command}
