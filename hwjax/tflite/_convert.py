"""Converters of the linear operators, the pools, ADD, RESHAPE, the clamping activations
and QUANTIZE (int8 -> int8, float32 -> int8/uint8) into graph nodes (registered with :func:`converts`)."""

from __future__ import annotations

import math

import jax
import numpy as np

from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.graph import Node, Tensor
from hwjax.tflite._import import (
    PADDING,
    Builder,
    OpContext,
    bias_vector,
    converts,
    explicit_padding,
    same_quant,
    w_scales,
)


def _split_act(act):
    """``(attr, separate)``: ReLU fuses into the op's own ``activation`` attribute; RELU6 and
    RELU_N1_TO_1 become a separate ``activation`` node after it."""
    return ("relu" if act == "relu" else None), (act if act not in (None, "relu") else None)


@converts("FULLY_CONNECTED")
def _fully_connected(b: Builder, op: OpContext) -> None:
    """FULLY_CONNECTED -> ``dense``. TFLite reads the input as rows of the filter's depth
    ``I``; with one row per example (any input shape of ``I`` elements, e.g. a 4-D tensor
    without a RESHAPE) the input is flattened first, and with ``keep_num_dims`` the ``(N,)``
    result is reshaped to the output's shape (its leading axes all 1). Several rows per
    example (an input of ``(..., depth)``) are read with ``keep_num_dims`` only (a ``dense``
    node over the last axis); without it they are refused."""
    where, ins, o = op.where, op.inputs, op.one_output()
    x = b.act(ins[0], where)
    w = b.const(ins[1], where, "filter")
    bias = b.const(ins[2], where, "bias") if len(ins) > 2 and ins[2] >= 0 else None
    act = op.activation(0)
    if op.option(1, "b", 0) != 0:
        raise UnsupportedOpError(f"{where}: shuffled weights are not supported")
    if w.data.ndim != 2:
        raise FormatError(f"{where}: filter {w.name!r} has shape {w.data.shape}; (N, I) expected")
    n, depth = (int(v) for v in w.data.shape)
    shape = b.tensors[x].shape
    rows = tuple(shape[:-1])
    if op.option(2, "b", 0) != 0 and len(shape) > 1 and shape[-1] == depth and tuple(b.ft[o].shape[1:]) == (*rows, n):
        # keep_num_dims over several rows: (..., depth) -> (..., n), one product per row
        params = jax.device_put(
            {
                "kernel": np.asarray(w.data, np.int8),
                "bias": np.asarray(bias_vector(bias, n, where)),
                "w_scale": np.asarray(w_scales(w, n, 0, where)),
            }
        )
        fused, separate = _split_act(act)
        b.node("dense", (x,), o, {"features": n, "activation": fused}, params, separate, where)
        return
    if math.prod(shape) != depth:
        raise UnsupportedOpError(
            f"{where}: input {b.ft[ins[0]].shape} holds {math.prod(shape)} values per example, "
            f"the filter's depth is {depth}: only one row per example is supported"
        )
    if shape != (depth,):  # one row of the filter's depth: flatten first (as TFLite reads it)
        flat = x + ":rows"
        b.tensors[flat] = Tensor(flat, (depth,), b.tensors[x].dtype, b.tensors[x].quant)
        b.nodes.append(Node("flatten", (x,), (flat,), {}, None, name=flat))
        x = flat
    params = jax.device_put(
        {
            "kernel": np.asarray(w.data, np.int8),
            "bias": np.asarray(bias_vector(bias, n, where)),
            "w_scale": np.asarray(w_scales(w, n, 0, where)),
        }
    )  # (1,) per tensor: TFLite's float32 product
    fused, separate = _split_act(act)
    out_shape = tuple(b.ft[o].shape[1:])
    if out_shape == (n,):
        b.node("dense", (x,), o, {"features": n, "activation": fused}, params, separate, where)
        return
    if math.prod(out_shape) != n:
        raise FormatError(f"{where}: output {b.ft[o].shape} does not hold the {n} features of one row")
    out = b.act(o, where)  # keep_num_dims: (1, ..., 1, N)
    rows = out + ":rows"
    b.tensors[rows] = Tensor(rows, (n,), b.tensors[out].dtype, b.tensors[out].quant)
    b.nodes.append(Node("dense", (x,), (rows,), {"features": n, "activation": fused}, params, name=rows))
    b.node("reshape", (rows,), o, {"shape": out_shape}, None, separate, where)


@converts("CONV_2D", "DEPTHWISE_CONV_2D")
def _conv(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    x = b.act(ins[0], where)
    w = b.const(ins[1], where, "filter")
    bias = b.const(ins[2], where, "bias") if len(ins) > 2 and ins[2] >= 0 else None
    dw = op.name == "DEPTHWISE_CONV_2D"
    padding = PADDING.get(op.option(0, "b", 0))
    stride = (op.option(2, "i", 0), op.option(1, "i", 0))
    i_act, i_dw, i_dh = (4, 5, 6) if dw else (3, 4, 5)
    act = op.activation(i_act)
    dil = (op.option(i_dh, "i", 1), op.option(i_dw, "i", 1))
    if padding is None or min(stride) < 1:
        raise FormatError(f"{where}: bad padding or strides {stride}")
    if min(dil) < 1:
        raise FormatError(f"{where}: bad dilation {dil}")
    in_shape = b.tensors[x].shape
    if len(in_shape) != 3 or w.data.ndim != 4:
        raise FormatError(f"{where}: input {in_shape} / filter {w.data.shape} are not NHWC / 4-D")
    mult = 1
    if dw:
        c = in_shape[2]
        if w.data.shape[0] != 1 or w.data.shape[3] % max(c, 1) or w.data.shape[3] == 0:
            raise FormatError(f"{where}: filter {w.data.shape} does not fit {c} input channels (1, kh, kw, C * M)")
        mult = w.data.shape[3] // c
        if op.option(3, "i", mult) not in (0, mult):  # the option, when written, must agree with the filter
            raise FormatError(
                f"{where}: depth_multiplier {op.option(3, 'i', mult)} but filter {w.data.shape} for {c} input channels"
            )
        kern, n, axis = w.data[0], c * mult, 3
    else:
        if w.data.shape[3] != in_shape[2]:
            raise UnsupportedOpError(f"{where}: grouped convolution (filter {w.data.shape}, input {in_shape})")
        kern, n, axis = w.data, w.data.shape[0], 0
    ks = tuple(kern.shape[:2]) if dw else tuple(kern.shape[1:3])
    pads = explicit_padding(in_shape[:2], ks, stride, padding, dil)
    s = w_scales(w, n, axis, where)
    params = jax.device_put(
        {
            "kernel": np.asarray(kern, np.int8),
            "bias": np.asarray(bias_vector(bias, n, where)),
            "w_scale": np.broadcast_to(s, (n,)).astype(np.float32),
        }
    )
    fused, separate = _split_act(act)
    attrs = {"kernel_size": ks, "stride": stride, "padding": pads, "activation": fused}
    if dil != (1, 1):
        attrs["dilation"] = dil
    if mult != 1:
        attrs["depth_multiplier"] = mult
    if not dw:
        attrs["features"] = n
    b.node("depthwise_conv" if dw else "conv", (x,), o, attrs, params, separate, where)


@converts("AVERAGE_POOL_2D", "MAX_POOL_2D")
def _pool(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    x = b.act(ins[0], where)
    padding = PADDING.get(op.option(0, "b", 0))
    stride = (op.option(2, "i", 0), op.option(1, "i", 0))
    window = (op.option(4, "i", 0), op.option(3, "i", 0))
    act = op.activation(5)
    if padding is None or min(stride) < 1 or min(window) < 1:
        raise FormatError(f"{where}: bad padding, strides {stride} or window {window}")
    same_quant(b, ins[0], o, where)
    fn = "avg" if op.name == "AVERAGE_POOL_2D" else "max"
    if padding == "VALID":
        b.node(fn + "pool", (x,), o, {"window": window, "strides": stride}, None, act, where)
    else:
        pads = explicit_padding(b.tensors[x].shape[:2], window, stride, padding)
        b.node("pool", (x,), o, {"fn": fn, "window": window, "strides": stride, "padding": pads}, None, act, where)


@converts("ADD")
def _add(b: Builder, op: OpContext) -> None:
    """ADD -> ``add`` of two tensors of one shape, or ``add_const`` of a tensor and a
    constant int8 operand broadcast against it (e.g. one value per channel)."""
    from hwjax.tflite._convert_tensor import const_operand

    where, ins, o = op.where, op.inputs, op.one_output()
    if len(ins) != 2:
        raise FormatError(f"{where}: takes 2 inputs, got {len(ins)}")
    fused, separate = _split_act(op.activation(0))
    consts = [b.is_const(i) for i in ins]
    if all(consts):
        raise UnsupportedOpError(f"{where}: an ADD of two constants is not supported")
    if any(consts):
        k = consts.index(True)
        x = b.act(ins[1 - k], where)
        params = const_operand(b, ins[k], len(b.ft[o].shape), where)
        out = tuple(b.ft[o].shape[1:])
        if out != b.tensors[x].shape:
            raise UnsupportedOpError(
                f"{where}: ADD of {b.ft[ins[1 - k]].shape} and a constant {b.ft[ins[k]].shape} "
                f"broadcasts the tensor to {b.ft[o].shape}; only the constant may broadcast"
            )
        attrs = {"activation": fused, "const_first": k == 0, "clamp_after": separate or "none"}
        b.node("add_const", (x,), o, attrs, params, separate, where)
        return
    x1, x2 = b.act(ins[0], where), b.act(ins[1], where)
    if b.tensors[x1].shape != b.tensors[x2].shape:
        raise UnsupportedOpError(
            f"{where}: broadcasting ADD ({b.ft[ins[0]].shape} + {b.ft[ins[1]].shape}) is not supported"
        )
    b.node("add", (x1, x2), o, {"activation": fused, "clamp_after": separate or "none"}, None, separate, where)


@converts("RESHAPE")
def _reshape(b: Builder, op: OpContext) -> None:
    where, ins, o = op.where, op.inputs, op.one_output()
    x = b.act(ins[0], where)
    same_quant(b, ins[0], o, where)
    out = b.ft[o]
    if len(out.shape) < 1 or out.shape[0] != 1:
        raise UnsupportedOpError(f"{where}: output shape {out.shape} has no leading batch axis of 1")
    shape = tuple(out.shape[1:])
    if len(shape) == 1:
        b.node("flatten", (x,), o, {}, None, None, where)
    else:
        b.node("reshape", (x,), o, {"shape": shape}, None, None, where)


@converts("RELU", "RELU6", "RELU_N1_TO_1")
def _relu(b: Builder, op: OpContext) -> None:
    x = b.act(op.inputs[0], op.where)
    b.node("activation", (x,), op.one_output(), {"fn": op.name.lower()}, None, None, op.where)


@converts("QUANTIZE")
def _quantize(b: Builder, op: OpContext) -> None:
    """QUANTIZE int8/uint8 -> int8/uint8 (``requantize``), or float32 -> int8/uint8 of a float32
    model input (a float interface, as TFLiteConverter writes it without
    ``inference_input_type``): a ``quantize`` node with the output's dtype, which the
    TFLite target rounds as each runtime does."""
    where, o = op.where, op.one_output()
    if len(op.inputs) != 1:
        raise FormatError(f"{where}: takes 1 input, got {len(op.inputs)}")
    if b.ft[op.inputs[0]].dtype == "float32":
        x = b.float_input(op.inputs[0], where)
        out = b.ft[o]
        if out.dtype not in ("int8", "uint8"):
            raise UnsupportedOpError(
                f"{where}: QUANTIZE float32 -> {out.dtype}: only int8 and uint8 outputs are supported"
            )
        b.node("quantize", (x,), o, {"dtype": out.dtype}, None, None, where)
        return
    x = b.act(op.inputs[0], where)
    b.node("requantize", (x,), o, {}, None, None, where)
