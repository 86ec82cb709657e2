"""Converters and writers of TFLite's nonlinear operators: SOFTMAX, LOGISTIC, TANH.

LOGISTIC and TANH become the portable ``lut`` op (``fn`` ``"sigmoid"`` / ``"tanh"``);
SOFTMAX becomes the ``softmax`` op (:mod:`hwjax.graph.ops.nonlinear`); the writers at
the end of this module (:func:`hwjax.tflite._save.writes`) turn them back. The integer
kernels that run them are in :mod:`hwjax.litert`.
"""

from __future__ import annotations

import numpy as np

from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.litert import SIGMOID_OUTPUT_SCALE, softmax_quant_error
from hwjax.tflite import _save as S
from hwjax.tflite._import import Builder, OpContext, converts

# ---------------------------------------------------------------------- converters


def _int8_io(b: Builder, op: OpContext) -> tuple[str, int]:
    """The int8 input tensor's graph name and the output's file index (one of each, same
    shape, positive finite scales)."""
    where = op.where
    if len(op.inputs) != 1:
        raise FormatError(f"{where}: takes 1 input, got {len(op.inputs)}")
    o = op.one_output()
    for i in (op.inputs[0], o):
        t = b.ft[i]
        if t.dtype not in ("int8", "float32"):  # float32: b.act names the float model
            raise UnsupportedOpError(f"{where}: tensor {t.name!r} is {t.dtype}; only int8 {op.name} is supported")
    x = b.act(op.inputs[0], where)
    b.act(o, where)
    for i in (op.inputs[0], o):
        t = b.ft[i]
        if not (np.isfinite(t.scale[0]) and t.scale[0] > 0):
            raise FormatError(f"{where}: tensor {t.name!r} has scale {float(t.scale[0])!r}; positive expected")
    if b.ft[o].shape != b.ft[op.inputs[0]].shape:
        raise FormatError(f"{where}: output shape {b.ft[o].shape} differs from input shape {b.ft[op.inputs[0]].shape}")
    return x, o


def _out_quant(b: Builder, o: int) -> tuple[np.float32, int]:
    t = b.ft[o]
    return np.float32(t.scale[0]), int(t.zero_point[0])


@converts("LOGISTIC")
def _logistic(b: Builder, op: OpContext) -> None:
    """LOGISTIC -> ``lut`` (fn ``"sigmoid"``). LiteRT's kernels require the output scale
    to be exactly 1/256 (any zero point; the converter writes -128)."""
    x, o = _int8_io(b, op)
    s_out, z_out = _out_quant(b, o)
    if float(s_out) != SIGMOID_OUTPUT_SCALE:
        raise UnsupportedOpError(
            f"{op.where}: output scale {float(s_out)!r} (zero point {z_out}); LiteRT's "
            "LOGISTIC requires an output scale of exactly 1/256"
        )
    b.node("lut", (x,), o, {"fn": "sigmoid"}, None, None, op.where)


@converts("TANH")
def _tanh(b: Builder, op: OpContext) -> None:
    """TANH -> ``lut`` (fn ``"tanh"``); any output quantisation (the converter writes
    1/128, zero point 0)."""
    x, o = _int8_io(b, op)
    b.node("lut", (x,), o, {"fn": "tanh"}, None, None, op.where)


@converts("SOFTMAX")
def _softmax(b: Builder, op: OpContext) -> None:
    """SOFTMAX (option ``beta``) over the last axis -> ``softmax`` (``beta``, axis -1)."""
    x, o = _int8_io(b, op)
    beta = float(np.float32(op.option(0, "f", 0.0)))
    s_in = np.float32(b.ft[op.inputs[0]].scale[0])
    s_out, z_out = _out_quant(b, o)
    if len(b.tensors[x].shape) < 1:
        raise UnsupportedOpError(
            f"{op.where}: input {b.ft[op.inputs[0]].shape} has only the batch axis; "
            "softmax over the batch axis is not supported"
        )
    why = softmax_quant_error(s_in, beta, s_out, z_out)
    if why is not None:
        raise UnsupportedOpError(f"{op.where}: {why}")
    b.node("softmax", (x,), o, {"beta": beta, "axis": -1}, None, None, op.where)


# ------------------------------------------------------------------------------ writers


def _int8_io_tensors(b: "S.FileBuilder", node) -> tuple:
    """The graph tensors of the node's input and output; UnsupportedOpError unless both are
    int8 (the arithmetic the converters accept)."""
    t_in, t_out = b.graph.tensor(node.inputs[0]), b.graph.tensor(node.outputs[0])
    for t in (t_in, t_out):
        if t.dtype != "int8":
            raise UnsupportedOpError(
                f"{S.where(node)}: tensor {t.name!r} is {t.dtype}; {node.op} is written for int8 only"
            )
    return t_in, t_out


def _scalar_quant(t) -> tuple[np.float32, int]:
    return (
        np.float32(np.asarray(t.quant.scale, np.float32).reshape(-1)[0]),
        int(np.asarray(t.quant.zero_point).reshape(-1)[0]),
    )


@S.writes("lut")
def _write_lut(b: "S.FileBuilder", node) -> None:
    """``lut`` -> LOGISTIC (``fn`` ``"sigmoid"``) or TANH (``"tanh"``), int8, no options.
    UnsupportedOpError for a sigmoid whose output scale is not exactly 1/256 (LiteRT's
    LOGISTIC refuses it; the converter too)."""
    t_in, t_out = _int8_io_tensors(b, node)
    fn = node.attrs["fn"]
    if fn == "sigmoid":
        s_out, z_out = _scalar_quant(t_out)
        if float(s_out) != SIGMOID_OUTPUT_SCALE:
            raise UnsupportedOpError(
                f"{S.where(node)}: output scale {float(s_out)!r} (zero point {z_out}); "
                "LiteRT's LOGISTIC requires an output scale of exactly 1/256"
            )
    b.op("LOGISTIC" if fn == "sigmoid" else "TANH", [b.tensor(t_in.name)], [b.tensor(t_out.name)], version=2)


@S.writes("softmax")
def _write_softmax(b: "S.FileBuilder", node) -> None:
    """``softmax`` (axis -1) -> SOFTMAX with option ``beta`` (float32), int8.
    UnsupportedOpError for parameters LiteRT rejects (:func:`softmax_quant_error`).
    The file stores ``fl32(beta)``, which is what every kernel (and hwjax's recipes)
    uses; a ``beta`` that is not a float32 value reads back as ``fl32(beta)``."""
    t_in, t_out = _int8_io_tensors(b, node)
    beta = float(np.float32(node.attrs["beta"]))
    if int(node.attrs.get("axis", -1)) != -1:
        raise UnsupportedOpError(f"{S.where(node)}: axis {node.attrs['axis']}; SOFTMAX runs over the last axis")
    why = softmax_quant_error(_scalar_quant(t_in)[0], beta, *_scalar_quant(t_out))
    if why is not None:
        raise UnsupportedOpError(f"{S.where(node)}: {why}")
    b.op("SOFTMAX", [b.tensor(t_in.name)], [b.tensor(t_out.name)], ("SoftmaxOptions", {"beta": beta}), version=2)
