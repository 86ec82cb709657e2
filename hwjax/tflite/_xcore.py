"""Converters (and decoders) of xformer's XC custom operators (XS3A; spec deployed.md §3).

xformer stores each XC operator's options as a flexbuffer map; ``XC_conv2d_v2`` and
``XC_maxpool2d`` keep lib_nn's parameter structs (``MemCpyFn``, ``AggregateFn``,
``OutputTransformFn``, ``AbstractKernel``) as raw little-endian bytes in flexbuffer
*strings*. :func:`flex_loads` reads the map (strings and blobs as ``bytes``); the
converters below decode the structs, recover the geometry (kernel size, strides,
dilation) and the original kernel from the reordered weight blob, and add ``xc_*``
graph nodes (the ``xc_*`` op kinds of :mod:`hwjax.graph.ops.xcore`). Anything they do not understand raises
:class:`hwjax.errors.UnsupportedOpError` or :class:`hwjax.errors.FormatError` naming the
operator.

The writers at the end (registered with :func:`hwjax.tflite._save.writes`) do the
reverse for :func:`hwjax.tflite.save`: each ``xc_*`` node becomes its ``XC_*`` custom
operator, its options encoded by :func:`flex_dumps` and its structs and blobs rebuilt
from the node as xformer 1.4.2 lays them out.
"""

from __future__ import annotations

import struct

import jax.numpy as jnp
import numpy as np

from hwjax.errors import ArgTypeError, FormatError, UnsupportedOpError
from hwjax.graph.ops.xcore import xc_conv2d_out_hw
from hwjax.tflite._import import Builder, OpContext, converts
from hwjax.xs3 import deserialise_output_transform, reorder_kernel_weights_inverse

# ------------------------------------------------------------------------ flexbuffers

_BW = {1: 0, 2: 1, 4: 2, 8: 3}


def _uint(b: bytes, at: int, w: int) -> int:
    if at < 0 or at + w > len(b):
        raise FormatError(f"flexbuffer reference at byte {at} lies outside the {len(b)}-byte buffer")
    return int.from_bytes(b[at : at + w], "little", signed=False)


def _int(b: bytes, at: int, w: int) -> int:
    v = _uint(b, at, w)
    return v - (1 << (8 * w)) if v >> (8 * w - 1) else v


def _float(b: bytes, at: int, w: int) -> float:
    if w not in (4, 8):
        raise FormatError(f"flexbuffer float of {w} bytes")
    _uint(b, at, w)
    return struct.unpack("<f" if w == 4 else "<d", b[at : at + w])[0]


#: the deepest nesting of maps and vectors a flexbuffer may have (xformer's options nest
#: two deep); deeper, or a container that contains itself, is a FormatError
_MAX_DEPTH = 16


def _value(b: bytes, at: int, parent_w: int, packed: int, depth: int = 0):
    """The flexbuffer value stored at ``at`` (``parent_w`` bytes wide) with packed type
    ``packed`` (type << 2 | log2 of the child's byte width)."""
    if depth > _MAX_DEPTH:
        raise FormatError(f"flexbuffer nested deeper than {_MAX_DEPTH} levels (a cycle?)")
    t, w = packed >> 2, 1 << (packed & 3)
    if t == 0:  # null
        return None
    if t in (1, 2, 3, 26):  # inline int, uint, float, bool
        return {1: _int, 2: _uint, 3: _float, 26: lambda *a: bool(_uint(*a))}[t](b, at, parent_w)
    target = at - _uint(b, at, parent_w)
    if t in (6, 7, 8):  # indirect int, uint, float
        return {6: _int, 7: _uint, 8: _float}[t](b, target, w)
    if t == 4:  # key: NUL-terminated
        end = b.find(b"\0", target)
        if end < 0:
            raise FormatError("unterminated flexbuffer key")
        return b[target:end].decode("utf-8", "replace")
    if t in (5, 25):  # string (raw bytes: xformer stores binary structs in strings), blob
        n = _uint(b, target - w, w)
        return bytes(b[target : target + n])
    if t in (9, 10):  # map, vector
        n = _uint(b, target - w, w)
        vals = [_value(b, target + i * w, w, _uint(b, target + n * w + i, 1), depth + 1) for i in range(n)]
        if t == 10:
            return vals
        keys_at = target - 3 * w
        keys, kw = keys_at - _uint(b, keys_at, w), _uint(b, target - 2 * w, w)
        if kw not in _BW:
            raise FormatError(f"flexbuffer map keys of byte width {kw}")
        return {_value(b, keys + i * kw, kw, (4 << 2) | _BW[kw], depth + 1): v for i, v in enumerate(vals)}
    if 11 <= t <= 14:  # typed vectors of int, uint, float, key
        n = _uint(b, target - w, w)
        return [_value(b, target + i * w, w, ((t - 10) << 2) | (packed & 3), depth + 1) for i in range(n)]
    raise FormatError(f"flexbuffer type {t} is not supported")


def flex_loads(data: bytes):
    """Decodes a flexbuffer (the custom options of an XC operator): maps as ``dict``,
    vectors as ``list``, ints, floats, bools; strings and blobs as ``bytes`` (never
    decoded as text). FormatError for a malformed buffer."""
    b = bytes(data)
    if len(b) < 3:
        raise FormatError(f"flexbuffer of {len(b)} bytes")
    root_w = b[-1]
    if root_w not in _BW:
        raise FormatError(f"flexbuffer root byte width {root_w}")
    return _value(b, len(b) - 2 - root_w, root_w, b[-2])


def _options(op: OpContext, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """The op's flexbuffer options map, with exactly the ``required`` keys (plus any of
    ``optional``); UnsupportedOpError naming unknown keys (a feature not implemented)."""
    if not op.custom:
        raise FormatError(f"{op.where}: custom options are missing")
    try:
        opts = flex_loads(op.custom)
    except FormatError as e:
        raise FormatError(f"{op.where}: custom options: {e}") from None
    if not isinstance(opts, dict):
        raise FormatError(f"{op.where}: custom options are not a flexbuffer map")
    missing = [k for k in required if k not in opts]
    if missing:
        raise FormatError(f"{op.where}: custom options lack {missing} (have {sorted(opts)})")
    unknown = sorted(set(opts) - set(required) - set(optional))
    if unknown:
        raise UnsupportedOpError(f"{op.where}: custom options {unknown} are not supported")
    return opts


def _struct(op: OpContext, opts: dict, key: str, fmt: str) -> tuple:
    """Unpacks the lib_nn struct stored as bytes under ``key`` (little-endian ``fmt``;
    trailing bytes beyond the struct are ignored)."""
    raw = opts[key]
    n = struct.calcsize("<" + fmt)
    if not isinstance(raw, bytes) or len(raw) < n:
        raise FormatError(f"{op.where}: option {key!r} must hold a {n}-byte parameter struct, got {raw!r}")
    return struct.unpack("<" + fmt, raw[:n])


def _int_option(op: OpContext, opts: dict, key: str) -> int:
    v = opts[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise FormatError(f"{op.where}: option {key!r} must be an integer, got {v!r}")
    return v


def _replicated_byte(op: OpContext, word: int, key: str) -> int:
    """The int8 value whose byte is replicated in the 32-bit ``word``."""
    raw = (word & 0xFFFFFFFF).to_bytes(4, "little")
    if len(set(raw)) != 1:
        raise UnsupportedOpError(f"{op.where}: option {key!r} = {word:#x} is not one byte replicated")
    return raw[0] - 256 if raw[0] > 127 else raw[0]


# ------------------------------------------------------------------------ XC_conv2d_v2

KERNEL_TYPES = {0: "direct", 1: "indirect", 3: "depthwise"}  # lib_tflite_micro's Conv2DType enum
OUTPUT_TRANSFORMS = {0: "group", 1: "channelwise"}  # xformer's OtType: otfn_int8, otfn_int8_channelwise
_AK = "10i"  # abstract_kernel_params_t: h/w begin/end, channel groups, offsets, strides


def _exact_div(op: OpContext, a: int, b: int, what: str) -> int:
    if b <= 0 or a % b or a // b < 1:
        raise FormatError(f"{op.where}: inconsistent parameter structs: {what} = {a}/{b}")
    return a // b


def _check_regions(op: OpContext, regions: list, out_hw, groups: int) -> None:
    """The threads' output regions must tile the whole output with all channel groups
    (what a single-model deployment does); anything else is not supported."""
    cover = np.zeros(out_hw, np.int32)
    for r in regions:
        h0, h1, w0, w1, g0, g1, ch_off, _, _, in_off = r
        if (g0, g1, ch_off, in_off) != (0, groups, 0, 0):
            raise UnsupportedOpError(f"{op.where}: kernel region {r} splits channels or offsets tensors")
        cover[max(h0, 0) : h1, max(w0, 0) : w1] += 1
    if not np.all(cover == 1):
        raise UnsupportedOpError(f"{op.where}: the kernel regions {regions} do not tile the {out_hw} output once")


@converts("CUSTOM(XC_conv2d_v2)")
def _conv2d_v2(b: Builder, op: OpContext) -> None:
    """``XC_conv2d_v2`` with kernel type 0, 1 or 3 and output transform 0 (group-wise
    ``otfn_int8``) or 1 (``otfn_int8_channelwise``); inputs: data, reordered int8 weights,
    the int16 output-transform memory (xs3.md §4.1 / §4.2 layout), then unused/scratch
    tensors."""
    where, ins, o = op.where, op.inputs, op.one_output()
    opts = _options(op, ("k", "t", "mp", "a", "o", "p"), ("s",))
    k = _int_option(op, opts, "k")
    if k not in KERNEL_TYPES:
        raise UnsupportedOpError(f"{where}: kernel type {k} is not supported (supported: {KERNEL_TYPES})")
    transform = OUTPUT_TRANSFORMS.get(_int_option(op, opts, "t"))
    if transform is None:
        raise UnsupportedOpError(
            f"{where}: output transform type {opts['t']} is not supported (supported: {OUTPUT_TRANSFORMS})"
        )
    if len(ins) < 3:
        raise FormatError(f"{where}: takes at least 3 inputs (data, weights, multipliers/biases), got {len(ins)}")
    kind = KERNEL_TYPES[k]
    x = b.act(ins[0], where)
    w_t, mb_t = b.const(ins[1], where, "weights"), b.const(ins[2], where, "multipliers/biases")
    if w_t.dtype != "int8" or mb_t.dtype != "int16":
        raise FormatError(f"{where}: weights must be int8 and multipliers/biases int16, got {w_t.dtype}, {mb_t.dtype}")
    in_shape = b.tensors[x].shape
    hwc = (1, 1, in_shape[0]) if len(in_shape) == 1 else tuple(in_shape)
    out = b.ft[o]
    out_shape = tuple(out.shape[1:])
    ohwc = (1, 1, out_shape[0]) if len(out_shape) == 1 else out_shape
    if len(hwc) != 3 or len(ohwc) != 3:
        raise UnsupportedOpError(f"{where}: input {in_shape} / output {out_shape} are not (H, W, C)")
    (H, W, C), (OH, OW, CO) = hwc, ohwc
    if kind == "indirect" and OH == OW == 1 and isinstance(opts["mp"], bytes) and len(opts["mp"]) >= 16:
        # a fully connected layer: xformer reads the whole input as one pixel of H*W*C bytes
        mp = _struct(op, opts, "mp", "4i")
        patch = _struct(op, opts, "a", "2i")[1] if isinstance(opts.get("a"), bytes) and len(opts["a"]) == 8 else None
        # (a 1x1 conv with a stride whose one output pixel steps over the whole input has the
        # same memcpy params: its patch is one pixel of C bytes; probe seed 3171)
        if mp[2] == mp[3] == 0 and mp[1] == H * W * C and (H, W) != (1, 1) and patch == H * W * C:
            hwc = (H, W, C) = (1, 1, H * W * C)
    if (
        kind == "direct"
        and OH == OW == 1
        and (H, W) != (1, 1)
        and isinstance(opts["a"], bytes)
        and len(opts["a"]) >= 24
    ):
        # the same with the direct kernel (H*W*C a multiple of 32): a 1x1 kernel over
        # H*W*C / 32 input channel groups
        agg = _struct(op, opts, "a", "6i")
        if agg[1] == agg[2] == 0 and (H * W * C) % 32 == 0 and agg[3] == H * W * C // 32 - 1:
            hwc = (H, W, C) = (1, 1, H * W * C)
    if transform == "group":  # otfn_int8_params_t
        n_out, initial_shift, final_shr = _struct(op, opts, "o", "ihh")
    else:  # otfn_int8_channelwise_params_t
        (n_out, final_shr), initial_shift = _struct(op, opts, "o", "ih"), 0
    size = int(np.prod(out_shape))
    flat = n_out != CO and n_out > 0 and size % n_out == 0
    if flat:  # xformer wrote the conv into a reshaped tensor (a RESHAPE after it): (OH, OW) below
        CO = n_out
    if n_out != CO:
        raise FormatError(f"{where}: the output transform is for {n_out} channels, the output has {CO}")
    row = W * C
    if kind == "indirect":
        mp = _struct(op, opts, "mp", "10i")
        sr, sc = _exact_div(op, mp[0], row, "row bytes"), _exact_div(op, mp[1], C, "pixel bytes")
        kh, kw = mp[2] + 1, mp[3] + 1
        copied = (mp[4] + 1) * 32
        dc = _exact_div(op, mp[6] + copied, C, "horizontal dilation")
        dr = _exact_div(op, mp[7] + kw * C * dc, row, "vertical dilation")
        agg = _struct(op, opts, "a", "2i")
        if agg != (CO, kh * kw * C):
            raise FormatError(f"{where}: aggregate params {agg} != ({CO}, {kh * kw * C})")
    else:
        mp = _struct(op, opts, "mp", "2i")
        sr, sc = _exact_div(op, mp[0], row, "row bytes"), _exact_div(op, mp[1], C, "pixel bytes")
        if kind == "direct":
            agg = _struct(op, opts, "a", "6i")
            kh, kw = agg[1] + 1, agg[2] + 1
            if C % 32 or agg[3] != C // 32 - 1 or agg[0] != kh * kw * C * 16:
                raise FormatError(f"{where}: direct kernel params {agg} for {C} input channels")
            dc = _exact_div(op, agg[4] + C, C, "horizontal dilation")
            dr = _exact_div(op, agg[5] + kw * C * dc, row, "vertical dilation")
        else:
            agg = _struct(op, opts, "a", "5i")
            kh, kw = agg[1] + 1, agg[2] + 1
            if CO != C and CO % C == 0 and agg[0] == kh * kw * 16:  # what xformer makes of a multiplier
                raise UnsupportedOpError(
                    f"{where}: a depthwise convolution with channel multiplier {CO // C} ({C} -> {CO} "
                    "channels) is not supported"
                )
            if CO != C or agg[0] != kh * kw * 16:
                raise FormatError(f"{where}: depthwise params {agg} for {C} -> {CO} channels")
            dc = _exact_div(op, agg[3], C, "horizontal dilation")
            dr = _exact_div(op, agg[4] + kw * C * dc, row, "vertical dilation")
    valid = xc_conv2d_out_hw((H, W, C), (kh, kw), (sr, sc), (dr, dc))
    if flat:
        OH, OW = valid
        if OH < 1 or OW < 1 or OH * OW * CO != size:
            raise FormatError(f"{where}: an output of shape {out_shape} is not {OH}x{OW}x{CO} values")
    if (OH, OW) != valid:
        raise FormatError(
            f"{where}: a {kh}x{kw} kernel, strides {(sr, sc)}, dilation {(dr, dc)} on "
            f"{(H, W)} does not give the {(OH, OW)} output"
        )
    regions = opts["p"] if isinstance(opts["p"], list) else [opts["p"]]
    _check_regions(op, [_struct(op, {"p": r}, "p", _AK) for r in regions], (OH, OW), -(-CO // 16))
    blob = np.asarray(w_t.data, np.int8).reshape(-1)
    if kind == "depthwise":
        groups = -(-C // 16)
        if blob.size != groups * kh * kw * 16 + 16:
            raise FormatError(f"{where}: depthwise weight blob of {blob.size} bytes for a {kh}x{kw}x{C} kernel")
        kernel = blob[: groups * kh * kw * 16].reshape(groups, kh, kw, 16).transpose(1, 2, 0, 3)
        kernel = kernel.reshape(kh, kw, groups * 16)[..., :C]
    else:
        try:
            kernel = np.asarray(reorder_kernel_weights_inverse(blob, (CO, kh, kw, C)))
        except ValueError as e:
            raise FormatError(f"{where}: weight blob: {e}") from None
    mb = np.asarray(mb_t.data, np.int16).reshape(-1)
    if mb.size < 2 * CO:
        raise FormatError(f"{where}: multiplier/bias blob of {mb.size} values for {CO} channels")
    if mb.size < (2 if transform == "group" else 3) * CO:
        raise FormatError(f"{where}: multiplier/bias blob of {mb.size} values for {CO} channels")
    ot = deserialise_output_transform(mb, CO, with_leading=transform == "channelwise")
    attrs = {
        "kernel_type": kind,
        "transform": transform,
        "in_shape": hwc,
        "kernel_size": (kh, kw),
        "stride": (sr, sc),
        "dilation": (dr, dc),
        "initial_shift": int(initial_shift),
        "final_shr": int(final_shr),
        "out_shape": out_shape,
    }
    params = {
        "kernel": jnp.asarray(kernel, jnp.int8),
        "multipliers": jnp.asarray(ot["multipliers"], jnp.int32),
        "biases": jnp.asarray(ot["biases"], jnp.int32),
    }
    if transform == "channelwise":  # per-channel VLSAT shifts, read as uint16
        params["shifts"] = jnp.asarray(ot["leading"].view(np.uint16), jnp.int32)
    b.node("xc_conv2d", (x,), o, attrs, params, None, where)


# ------------------------------------------------------------------ byte-moving ops


def _out_shape(b: Builder, o: int) -> tuple[int, ...]:
    return tuple(int(v) for v in b.ft[o].shape[1:])


@converts("CUSTOM(XC_pad)")
def _pad(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("s", "p", "l", "n", "e", "z"), ("v",))
    x = b.act(op.inputs[0], where)
    attrs = {
        "start": _int_option(op, opts, "s"),
        "pad": _int_option(op, opts, "p"),
        "length": _int_option(op, opts, "l"),
        "copies": _int_option(op, opts, "n"),
        "end": _int_option(op, opts, "e"),
        "value": _replicated_byte(op, _int_option(op, opts, "z"), "z"),
        "out_shape": _out_shape(b, o),
    }
    if min(attrs["start"], attrs["pad"], attrs["length"], attrs["copies"], attrs["end"]) < 0:
        raise FormatError(f"{where}: negative sizes in {opts}")
    b.node("xc_pad", (x,), o, attrs, None, None, where)


@converts("CUSTOM(XC_pad_3_to_4)", "CUSTOM(XC_pad_1_to_4)")
def _pad_to_4(b: Builder, op: OpContext) -> None:
    """``XC_pad_3_to_4`` / ``XC_pad_1_to_4``: pixels of 3 or 1 channels padded to 4 with the
    byte ``pv`` (xformer puts them before a conv whose padded input channels have zero weights)."""
    where, o = op.where, op.one_output()
    opts = _options(op, ("pv",))
    x = b.act(op.inputs[0], where)
    c = 3 if op.name == "CUSTOM(XC_pad_3_to_4)" else 1
    if b.tensors[x].shape[-1:] != (c,) or _out_shape(b, o) != (*b.tensors[x].shape[:-1], 4):
        raise FormatError(f"{where}: maps {b.tensors[x].shape} to {_out_shape(b, o)}, not {c} to 4 channels")
    value = _replicated_byte(op, _int_option(op, opts, "pv"), "pv")
    attrs = {"value": value, "out_shape": _out_shape(b, o)}
    b.node(f"xc_pad_{c}_to_4", (x,), o, attrs, None, None, where)


@converts("CUSTOM(XC_slice)")
def _slice(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("s", "o", "l", "n"), ("v",))
    x = b.act(op.inputs[0], where)
    s, stride, length, n = (_int_option(op, opts, k) for k in ("s", "o", "l", "n"))
    size = int(np.prod(b.tensors[x].shape))
    if (
        min(s, stride, length, n) < 0
        or (n and s + (n - 1) * stride + length > size)
        or n * length != int(np.prod(_out_shape(b, o)))
    ):
        raise FormatError(f"{where}: slice {opts} does not fit input {b.tensors[x].shape} / output {_out_shape(b, o)}")
    b.node(
        "xc_slice",
        (x,),
        o,
        {"start": s, "stride": stride, "length": length, "copies": n, "out_shape": _out_shape(b, o)},
        None,
        None,
        where,
    )


@converts("CUSTOM(XC_no_op)")
def _no_op(b: Builder, op: OpContext) -> None:
    """A reshape (the bytes are unchanged)."""
    where, o = op.where, op.one_output()
    x = b.act(op.inputs[0], where)
    shape = _out_shape(b, o)
    if int(np.prod(shape)) != int(np.prod(b.tensors[x].shape)):
        raise FormatError(f"{where}: cannot reshape {b.tensors[x].shape} to {shape}")
    if len(shape) == 1:
        b.node("flatten", (x,), o, {}, None, None, where)
    else:
        b.node("reshape", (x,), o, {"shape": shape}, None, None, where)


# ------------------------------------------------------------------- arithmetic ops


@converts("CUSTOM(XC_lookup)")
def _lookup(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    if len(op.inputs) != 2:
        raise FormatError(f"{where}: takes 2 inputs (data, table), got {len(op.inputs)}")
    x = b.act(op.inputs[0], where)
    t = b.const(op.inputs[1], where, "lookup table")
    if t.data.size != 256 or t.dtype not in ("uint8", "int8"):
        raise UnsupportedOpError(f"{where}: lookup table {t.dtype} {t.data.shape}: only 256-entry 8-bit tables")
    if b.ft[o].dtype != "int8" or b.ft[op.inputs[0]].dtype != "int8":
        raise UnsupportedOpError(f"{where}: only int8 -> int8 lookups are supported")
    table = np.asarray(t.data).reshape(256).astype(np.uint8).view(np.int8).astype(np.int32)
    b.node("xc_lookup", (x,), o, {"out_shape": _out_shape(b, o)}, {"table": jnp.asarray(table)}, None, where)


@converts("CUSTOM(XC_add)")
def _add(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("m1", "m2", "bias", "shift"))
    xs, k, params = _binary_operands(b, op, same_shape=True)
    attrs = {
        "multiplier1": _int_option(op, opts, "m1"),
        "multiplier2": _int_option(op, opts, "m2"),
        "bias": _int_option(op, opts, "bias"),
        "shift": _int_option(op, opts, "shift"),
        "out_shape": _out_shape(b, o),
        "const_index": k,
    }
    b.node("xc_add", xs, o, attrs, params, None, where)


def _binary_operands(b: Builder, op: OpContext, *, same_shape: bool):
    """The operands of ``XC_add`` / ``XC_mul``: ``(inputs, const_index, params)``, two
    activations (``const_index`` None, no params) or one activation and a constant of the
    file (a constant tensor, or the import-time value of an ``XC_broadcast``), which
    becomes the parameters ``value`` (int8, the activation's shape), ``scale`` and
    ``zero_point``. Every operand must hold the output's number of values (the kernels
    are element-wise, no broadcasting); ``same_shape``: also the same shape."""
    where, o = op.where, op.one_output()
    if len(op.inputs) != 2:
        raise FormatError(f"{where}: takes 2 inputs, got {len(op.inputs)}")
    n = int(np.prod(_out_shape(b, o)))
    consts = [b.is_const(i) for i in op.inputs]
    if all(consts):
        raise UnsupportedOpError(f"{where}: both operands are constants")
    if b.ft[o].dtype != "int8" or any(b.ft[i].dtype != "int8" for i in op.inputs):
        raise UnsupportedOpError(f"{where}: only int8 tensors are supported")
    if not any(consts):
        xs = tuple(b.act(i, where) for i in op.inputs)
        shapes = [b.tensors[x].shape for x in xs]
        if (same_shape and shapes[0] != shapes[1]) or any(int(np.prod(s)) != n for s in shapes):
            raise UnsupportedOpError(
                f"{where}: inputs {shapes[0]} and {shapes[1]} do not both have the output's {n} values "
                f"{'in one shape ' if same_shape else ''}(no broadcasting)"
            )
        return xs, None, None
    k = consts.index(True)
    x = b.act(op.inputs[1 - k], where)
    t = b.const(op.inputs[k], where, "constant operand")
    shape = b.tensors[x].shape
    if t.scale is None or t.scale.size != 1 or int(np.prod(t.shape)) != n or int(np.prod(shape)) != n:
        raise UnsupportedOpError(
            f"{where}: a constant operand {t.name!r} of shape {t.shape} (quantised per tensor, the "
            f"output's {n} values) is needed for input {shape}"
        )
    params = {
        "value": jnp.asarray(np.asarray(t.data).astype(np.int8).reshape(shape)),
        "scale": jnp.float32(t.scale[0]),
        "zero_point": jnp.int32(t.zero_point[0]),
    }
    return (x,), k, params


#: the most values an ``XC_broadcast`` is folded into at import (a file's shapes are untrusted)
_MAX_FOLDED = 1 << 24


@converts("CUSTOM(XC_broadcast)")
def _broadcast(b: Builder, op: OpContext) -> None:
    """``XC_broadcast`` of a constant (xformer's ``broadcast_to`` of an ADD's or MUL's
    constant operand): folded at import. The kernel repeats each of ``b`` blocks of ``s``
    input bytes ``n`` times (lib_tflite_micro ``xcore_broadcast.cc``); the folded tensor
    then feeds ``XC_add`` / ``XC_mul`` as a constant operand."""
    where, o = op.where, op.one_output()
    opts = _options(op, ("b", "n", "s"), ("v",))
    blocks, copies, size = (_int_option(op, opts, k) for k in ("b", "n", "s"))
    if len(op.inputs) != 1:
        raise FormatError(f"{where}: takes 1 input, got {len(op.inputs)}")
    if not b.is_const(op.inputs[0]):
        raise UnsupportedOpError(f"{where}: XC_broadcast of a computed tensor is not supported (only of a constant)")
    t = b.const(op.inputs[0], where, "broadcast input")
    out = b.ft[o]
    if t.dtype != "int8" or out.dtype != "int8":
        raise UnsupportedOpError(f"{where}: only int8 tensors are supported")
    src = np.asarray(t.data).reshape(-1)
    total = int(np.prod(out.shape, dtype=np.int64))
    if total > _MAX_FOLDED:
        raise UnsupportedOpError(f"{where}: a broadcast to {total} values (more than {_MAX_FOLDED}) is not folded")
    if min(blocks, copies, size) < 1 or blocks * size != src.size or blocks * copies * size != total:
        raise FormatError(
            f"{where}: {blocks} blocks of {size} bytes repeated {copies} times do not map input "
            f"{t.shape} to output {out.shape}"
        )
    b.fold(o, np.repeat(src.reshape(blocks, 1, size), copies, axis=1).reshape(out.shape))


@converts("CUSTOM(XC_mean)")
def _mean(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("s", "m", "e", "i", "o", "sm"))
    x = b.act(op.inputs[0], where)
    outer, reduced, inner = (_int_option(op, opts, k) for k in ("s", "m", "e"))
    if (
        outer * reduced * inner != int(np.prod(b.tensors[x].shape))
        or outer * inner != int(np.prod(_out_shape(b, o)))
        or reduced < 1
    ):
        raise FormatError(
            f"{where}: mean sizes ({outer}, {reduced}, {inner}) do not fit input "
            f"{b.tensors[x].shape} / output {_out_shape(b, o)}"
        )
    f32 = {k: float(np.float32(opts[k])) for k in ("i", "o", "sm")}
    b.node(
        "xc_mean",
        (x,),
        o,
        {
            "outer": outer,
            "reduced": reduced,
            "inner": inner,
            "in_zero_point": f32["i"],
            "out_zero_point": f32["o"],
            "scale": f32["sm"],
            "out_shape": _out_shape(b, o),
        },
        None,
        None,
        where,
    )


@converts("CUSTOM(XC_maxpool2d)")
def _maxpool(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("mp", "a", "o", "p"), ("s",))
    x = b.act(op.inputs[0], where)
    shape, out_shape = b.tensors[x].shape, _out_shape(b, o)
    if len(shape) != 3 or len(out_shape) != 3 or shape[2] != out_shape[2]:
        raise FormatError(f"{where}: input {shape} / output {out_shape} are not (H, W, C) with equal C")
    (H, W, C), (OH, OW, _) = shape, out_shape
    mp, agg = _struct(op, opts, "mp", "2i"), _struct(op, opts, "a", "5i")
    sr, sc = _exact_div(op, mp[0], W * C, "row bytes"), _exact_div(op, mp[1], C, "pixel bytes")
    kh, kw = agg[1] + 1, agg[2] + 1
    if agg[3] != C or agg[4] != W * C - kw * C:
        raise UnsupportedOpError(f"{where}: maxpool params {agg}: only undilated windows are supported")
    if (OH, OW) != ((H - kh) // sr + 1, (W - kw) // sc + 1):
        raise FormatError(f"{where}: a {kh}x{kw} window, strides {(sr, sc)} on {(H, W)} does not give {(OH, OW)}")
    regions = opts["p"] if isinstance(opts["p"], list) else [opts["p"]]
    _check_regions(op, [_struct(op, {"p": r}, "p", _AK) for r in regions], (OH, OW), -(-C // 16))
    b.node("xc_maxpool2d", (x,), o, {"window": (kh, kw), "stride": (sr, sc), "out_shape": out_shape}, None, None, where)


@converts("CUSTOM(XC_concat)")
def _concat(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("i", "n", "s"), ("v",))
    n_in, copies = _int_option(op, opts, "i"), _int_option(op, opts, "n")
    sizes = opts["s"]
    if not isinstance(sizes, list) or n_in != len(op.inputs) or not 1 <= n_in <= len(sizes):
        raise FormatError(f"{where}: {len(op.inputs)} inputs, option i = {n_in}, sizes {sizes!r}")
    sizes = [int(v) for v in sizes[:n_in]]  # entries past i are not read by the kernel
    xs = tuple(b.act(i, where) for i in op.inputs)
    out = b.act(o, where)
    if b.ft[o].dtype != "int8" or any(b.ft[i].dtype != "int8" for i in op.inputs):
        raise UnsupportedOpError(f"{where}: only int8 tensors are supported")
    q = {(float(b.tensors[t].quant.scale), int(b.tensors[t].quant.zero_point)) for t in (*xs, out)}
    if len(q) != 1:
        raise UnsupportedOpError(
            f"{where}: the inputs and the output are quantised differently ({q}); XC_concat copies bytes"
        )
    if (
        copies < 1
        or min(sizes) < 0
        or copies * sum(sizes) != int(np.prod(_out_shape(b, o)))
        or any(int(np.prod(b.tensors[x].shape)) != copies * s for x, s in zip(xs, sizes))
    ):
        raise FormatError(
            f"{where}: {copies} rows of {sizes} bytes do not fit inputs "
            f"{[b.tensors[x].shape for x in xs]} / output {_out_shape(b, o)}"
        )
    b.node(
        "xc_concat", xs, o, {"copies": copies, "sizes": tuple(sizes), "out_shape": _out_shape(b, o)}, None, None, where
    )


@converts("CUSTOM(XC_mul)")
def _mul(b: Builder, op: OpContext) -> None:
    where, o = op.where, op.one_output()
    opts = _options(op, ("mp",))
    z1, z2, bias, scalar, shr = _struct(op, opts, "mp", "bbhhh")
    xs, k, params = _binary_operands(b, op, same_shape=False)
    b.node(
        "xc_mul",
        xs,
        o,
        {
            "in1_zero_point": z1,
            "in2_zero_point": z2,
            "bias": bias,
            "scalar": scalar,
            "vlashr_shr": shr,
            "out_shape": _out_shape(b, o),
            "const_index": k,
        },
        params,
        None,
        where,
    )


@converts("CUSTOM(XC_softmax)", "CUSTOM(XC_batched_softmax)")
def _softmax(b: Builder, op: OpContext) -> None:
    """``XC_softmax`` over all the values of an example; ``XC_batched_softmax`` over each row
    of a (1, rows, n) tensor (lib_tflite_micro's kernel takes the rows from the second-last
    axis and their length from the last: other ranks are refused)."""
    where, o = op.where, op.one_output()
    if op.custom:
        opts = flex_loads(op.custom)
        if opts:
            raise UnsupportedOpError(
                f"{where}: custom options {sorted(opts) if isinstance(opts, dict) else opts!r} are not supported"
            )
    if len(op.inputs) != 2:
        raise FormatError(f"{where}: takes 2 inputs (data, table), got {len(op.inputs)}")
    x = b.act(op.inputs[0], where)
    t = b.const(op.inputs[1], where, "exponential table")
    if t.dtype != "float32" or np.asarray(t.data).size != 256:
        raise UnsupportedOpError(f"{where}: table {t.dtype} {np.asarray(t.data).shape}: only 256 float32 entries")
    if b.ft[o].dtype != "int8" or b.ft[op.inputs[0]].dtype != "int8":
        raise UnsupportedOpError(f"{where}: only int8 -> int8 softmax is supported")
    table = np.asarray(t.data, np.float32).reshape(256)
    attrs = {"out_shape": _out_shape(b, o)}
    if op.name == "CUSTOM(XC_batched_softmax)":
        shape = b.tensors[x].shape
        if len(shape) != 2 or _out_shape(b, o) != shape:
            raise UnsupportedOpError(
                f"{where}: a batched softmax of {shape} -> {_out_shape(b, o)}: only (rows, n) -> (rows, n) examples"
            )
        attrs["row_size"] = int(shape[1])
    b.node("xc_softmax", (x,), o, attrs, {"table": jnp.asarray(table)}, None, where)


# ------------------------------------------------------------------ the writer side
#
# hwjax.tflite.save writes every xc_* node back as the XC custom operator it was read
# from (:mod:`hwjax.tflite._save`'s registry): the custom options as a flexbuffer map
# with the keys and value types xformer 1.4.2 writes (lib_nn's parameter structs as raw
# bytes in flexbuffer strings, rebuilt from the node's geometry), the weights and
# parameter blobs in the layouts the converters above read back. The parts of an
# xformer file the graph does not keep are written as a single-threaded deployment
# (one kernel region covering the whole output) with freshly sized scratch tensors.

from hwjax.tflite._save import FileBuilder, constant_operand, integer_param, where, writes  # noqa: E402
from hwjax.xs3 import reorder_kernel_weights, serialise_output_transform  # noqa: E402


class F32(float):
    """A float written as a 4-byte indirect flexbuffer float (xformer's ``XC_mean``)."""


def flex_dumps(options: dict) -> bytes:
    """Encodes ``options`` as a flexbuffer map (keys sorted, 4-byte slots): ``bool`` ->
    BOOL, ``int`` -> INT, :class:`F32` -> INDIRECT_FLOAT (float32), ``bytes`` -> STRING
    holding those raw bytes (how xformer stores lib_nn's structs), a list of ``bytes`` ->
    VECTOR of STRING, a list of ``int`` -> VECTOR of INT. :func:`flex_loads` reads it
    back; so does lib_tflite_micro's flexbuffers reader (``AsString``, ``AsVector``,
    ``AsInt32``, ``AsFloat``, ``AsBool``)."""
    w = 4
    buf = bytearray()

    def align(n: int) -> None:
        buf.extend(b"\0" * (-len(buf) % n))

    def uint(v: int) -> None:
        buf.extend(int(v).to_bytes(w, "little", signed=False))

    def sint(v: int) -> None:
        if not -(2**31) <= v < 2**31:
            raise FormatError(f"flexbuffer integer {v} does not fit 32 bits")
        buf.extend(int(v).to_bytes(w, "little", signed=True))

    def string(raw: bytes) -> int:
        align(w)
        uint(len(raw))
        at = len(buf)
        buf.extend(bytes(raw) + b"\0")
        return at

    def vector(slots: list) -> int:
        """``slots``: ``(type, value)``, value an int (inline) or a target position."""
        align(w)
        uint(len(slots))
        at = len(buf)
        for t, v in slots:
            if t in (1, 26):
                sint(int(v))
            else:
                uint(len(buf) - v)
        buf.extend(bytes((t << 2) | 2 for t, _ in slots))
        return at

    keys = sorted(options)
    key_at = {}
    for k in keys:
        key_at[k] = len(buf)
        buf.extend(k.encode("ascii") + b"\0")
    slots = []
    for k in keys:
        v = options[k]
        if isinstance(v, bool):
            slots.append((26, int(v)))
        elif isinstance(v, F32):
            align(4)
            slots.append((8, len(buf)))
            buf.extend(struct.pack("<f", v))
        elif isinstance(v, (int, np.integer)):
            slots.append((1, int(v)))
        elif isinstance(v, (bytes, bytearray)):
            slots.append((5, string(v)))
        elif isinstance(v, list) and all(isinstance(e, (bytes, bytearray)) for e in v):
            slots.append((10, vector([(5, string(e)) for e in v])))
        elif isinstance(v, list) and all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in v):
            slots.append((10, vector([(1, int(e)) for e in v])))
        else:
            raise ArgTypeError(f"flex_dumps: option {k!r} = {v!r} has no flexbuffer encoding here")
    align(w)
    uint(len(keys))
    keys_vec = len(buf)
    for k in keys:
        uint(len(buf) - key_at[k])
    align(w)
    uint(len(buf) - keys_vec)  # the keys vector, relative to this slot
    uint(w)  # the keys' byte width
    root = vector(slots)
    at = len(buf)
    uint(at - root)
    buf.extend(bytes(((9 << 2) | 2, w)))
    return bytes(buf)


def _pair(v) -> tuple[int, int]:
    a, b = (int(i) for i in v)
    return a, b


def _replicated_word(value: int) -> int:
    """The int32 whose four bytes are the int8 ``value`` (xformer's pad values)."""
    return int.from_bytes(bytes([int(value) & 0xFF] * 4), "little", signed=True)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v


def _round32(n: int) -> int:
    return -(-n // 32) * 32


def _regions(out_h: int, out_w: int, channels: int) -> list[bytes]:
    """One ``abstract_kernel_params_t`` covering the whole output with all channel groups
    (a one-thread deployment), with the two trailing bytes xformer writes."""
    return [struct.pack("<10i", 0, out_h, 0, out_w, 0, -(-channels // 16), 0, 0, channels, 0) + b"00"]


def _scratch(b: FileBuilder, node, size: int) -> int:
    return b.scratch(f"{node.name}/scratch", size) if size else -1


@writes("xc_conv2d")
def _write_conv2d(b: FileBuilder, node) -> None:
    a = node.attrs
    kind, transform = a["kernel_type"], a["transform"]
    k = {v: key for key, v in KERNEL_TYPES.items()}.get(kind)
    t = {v: key for key, v in OUTPUT_TRANSFORMS.items()}.get(transform)
    if k is None or t is None:
        raise UnsupportedOpError(f"{where(node)}: kernel type {kind!r} / transform {transform!r} cannot be written")
    H, W, C = (int(v) for v in a["in_shape"])
    kh, kw = _pair(a["kernel_size"])
    sr, sc = _pair(a["stride"])
    dr, dc = _pair(a["dilation"])
    OH, OW = xc_conv2d_out_hw((H, W, C), (kh, kw), (sr, sc), (dr, dc))
    if "multipliers" not in node.params:
        raise FormatError(f"{where(node)}: parameter 'multipliers' is missing")
    CO = int(np.size(node.params["multipliers"]))  # out_shape may hold the output reshaped
    row = W * C
    if kind == "indirect":  # im_to_col_valid + mat_mul: lib_nn's ImToColValid params
        copied = _round32(C)
        mask = (1 << (C & 31)) - 1 if C & 31 else 0xFFFFFFFF
        mp = struct.pack(
            "<10i",
            row * sr,
            C * sc,
            kh - 1,
            kw - 1,
            copied // 32 - 1,
            copied - C - 32,
            C * dc - copied,
            row * dr - kw * C * dc,
            _s32(mask),
            0,
        )
        agg = struct.pack("<2i", CO, kh * kw * C)
        scratch = _round32(kh * kw * C) + 32
    elif kind == "direct":
        if C % 32:
            raise UnsupportedOpError(f"{where(node)}: a direct kernel needs a multiple of 32 input channels, got {C}")
        mp = struct.pack("<2i", row * sr, C * sc)
        agg = struct.pack("<6i", kh * kw * C * 16, kh - 1, kw - 1, C // 32 - 1, C * (dc - 1), row * dr - kw * C * dc)
        scratch = 0
    else:
        mp = struct.pack("<2i", row * sr, C * sc)
        agg = struct.pack("<5i", kh * kw * 16, kh - 1, kw - 1, C * dc, row * dr - kw * C * dc)
        scratch = 0
    if transform == "group":
        ot = struct.pack("<ihh", CO, int(a["initial_shift"]), int(a["final_shr"]))
    else:
        ot = struct.pack("<ihh", CO, int(a["final_shr"]), 0)
    if kind == "depthwise":
        groups = -(-C // 16)
        kern = integer_param(node, "kernel", (kh, kw, C))
        kern = np.pad(kern, ((0, 0), (0, 0), (0, groups * 16 - C))).reshape(kh, kw, groups, 16)
        blob = np.concatenate([kern.transpose(2, 0, 1, 3).reshape(-1), np.zeros(16, np.int64)])
    else:
        blob = np.asarray(reorder_kernel_weights(np.asarray(integer_param(node, "kernel", (CO, kh, kw, C)), np.int8)))
    leading = None
    if transform == "channelwise":
        leading = np.asarray(integer_param(node, "shifts", (CO,)))
    mb = serialise_output_transform(
        integer_param(node, "multipliers", (CO,)), integer_param(node, "biases", (CO,)), leading=leading
    )
    opts = {"k": k, "t": t, "mp": mp, "a": agg, "o": ot, "p": _regions(OH, OW, CO), "s": scratch}
    ins = [
        b.tensor(node.inputs[0]),
        b.const(f"{node.name}/weights", blob, "int8"),
        b.const(f"{node.name}/multipliers_biases", mb, "int16"),
        -1,
        _scratch(b, node, scratch),
    ]
    b.op("CUSTOM(XC_conv2d_v2)", ins, [b.tensor(node.outputs[0])], custom_options=flex_dumps(opts))


def _aligned(*sizes) -> bool:
    return all(int(s) % 4 == 0 for s in sizes)


@writes("xc_pad")
def _write_pad(b: FileBuilder, node) -> None:
    a = node.attrs
    s, p, n, l, e = (int(a[k]) for k in ("start", "pad", "copies", "length", "end"))
    opts = {"s": s, "p": p, "l": l, "n": n, "e": e, "z": _replicated_word(a["value"]), "v": _aligned(s, p, l, e)}
    b.op("CUSTOM(XC_pad)", [b.tensor(node.inputs[0])], [b.tensor(node.outputs[0])], custom_options=flex_dumps(opts))


@writes("xc_pad_3_to_4", "xc_pad_1_to_4")
def _write_pad_to_4(b: FileBuilder, node) -> None:
    name = "CUSTOM(XC_pad_3_to_4)" if node.op == "xc_pad_3_to_4" else "CUSTOM(XC_pad_1_to_4)"
    b.op(
        name,
        [b.tensor(node.inputs[0])],
        [b.tensor(node.outputs[0])],
        custom_options=flex_dumps({"pv": _replicated_word(node.attrs["value"])}),
    )


@writes("xc_slice")
def _write_slice(b: FileBuilder, node) -> None:
    a = node.attrs
    s, o, l, n = (int(a[k]) for k in ("start", "stride", "length", "copies"))
    opts = {"s": s, "o": o, "l": l, "n": n, "v": _aligned(s, o, l)}
    b.op("CUSTOM(XC_slice)", [b.tensor(node.inputs[0])], [b.tensor(node.outputs[0])], custom_options=flex_dumps(opts))


@writes("xc_lookup")
def _write_lookup(b: FileBuilder, node) -> None:
    table = integer_param(node, "table", (256,))
    t = b.const(f"{node.name}/table", table.astype(np.int8).view(np.uint8), "uint8")
    b.op("CUSTOM(XC_lookup)", [b.tensor(node.inputs[0]), t], [b.tensor(node.outputs[0])], custom_options=b"")


@writes("xc_add")
def _write_add(b: FileBuilder, node) -> None:
    a = node.attrs
    opts = {"m1": int(a["multiplier1"]), "m2": int(a["multiplier2"]), "bias": int(a["bias"]), "shift": int(a["shift"])}
    b.op("CUSTOM(XC_add)", _binary_inputs(b, node), [b.tensor(node.outputs[0])], custom_options=flex_dumps(opts))


def _binary_inputs(b: FileBuilder, node) -> list[int]:
    """The two input tensors of an ``xc_add`` / ``xc_mul`` node: its inputs, or its input and
    its constant operand (an int8 tensor of the file, in the place ``const_index``)."""
    k = node.attrs.get("const_index")
    if k is None:
        return [b.tensor(i) for i in node.inputs]
    c = constant_operand(b, node)
    ins = [b.tensor(node.inputs[0])]
    ins.insert(int(k), c)
    return ins


@writes("xc_mean")
def _write_mean(b: FileBuilder, node) -> None:
    a = node.attrs
    opts = {
        "s": int(a["outer"]),
        "m": int(a["reduced"]),
        "e": int(a["inner"]),
        "i": F32(a["in_zero_point"]),
        "o": F32(a["out_zero_point"]),
        "sm": F32(a["scale"]),
    }
    b.op("CUSTOM(XC_mean)", [b.tensor(node.inputs[0])], [b.tensor(node.outputs[0])], custom_options=flex_dumps(opts))


@writes("xc_maxpool2d")
def _write_maxpool(b: FileBuilder, node) -> None:
    H, W, C = b.graph.tensor(node.inputs[0]).shape
    kh, kw = _pair(node.attrs["window"])
    sr, sc = _pair(node.attrs["stride"])
    OH, OW, _ = (int(v) for v in node.attrs["out_shape"])
    scratch = max(kh * kw * 16, _round32(kh * kw * C) + 32)  # xformer: 64 for a 2x2 window on 8 channels
    opts = {
        "mp": struct.pack("<2i", W * C * sr, C * sc),
        "a": struct.pack("<5i", kh * kw * 16, kh - 1, kw - 1, C, W * C - kw * C),
        "o": struct.pack("<2i", C, 0),
        "p": _regions(OH, OW, C),
        "s": scratch,
    }
    b.op(
        "CUSTOM(XC_maxpool2d)",
        [b.tensor(node.inputs[0]), _scratch(b, node, scratch)],
        [b.tensor(node.outputs[0])],
        custom_options=flex_dumps(opts),
    )


@writes("xc_concat")
def _write_concat(b: FileBuilder, node) -> None:
    sizes = [int(s) for s in node.attrs["sizes"]]
    opts = {"i": len(sizes), "n": int(node.attrs["copies"]), "s": sizes, "v": _aligned(*sizes)}
    b.op(
        "CUSTOM(XC_concat)",
        [b.tensor(i) for i in node.inputs],
        [b.tensor(node.outputs[0])],
        custom_options=flex_dumps(opts),
    )


@writes("xc_mul")
def _write_mul(b: FileBuilder, node) -> None:
    a = node.attrs
    mp = struct.pack(
        "<bbhhh", *(int(a[k]) for k in ("in1_zero_point", "in2_zero_point", "bias", "scalar", "vlashr_shr"))
    )
    b.op("CUSTOM(XC_mul)", _binary_inputs(b, node), [b.tensor(node.outputs[0])], custom_options=flex_dumps({"mp": mp}))


@writes("xc_softmax")
def _write_softmax(b: FileBuilder, node) -> None:
    try:
        table = np.asarray(node.params["table"], np.float32).reshape(256)
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{where(node)}: parameter 'table' must hold 256 float32 values") from None
    t = b.const(f"{node.name}/table", table, "float32")
    code = "CUSTOM(XC_softmax)"
    if node.attrs.get("row_size") is not None:
        shape = tuple(b.graph.tensor(node.inputs[0]).shape)
        if len(shape) != 2 or shape[1] != node.attrs["row_size"]:
            raise UnsupportedOpError(
                f"{where(node)}: XC_batched_softmax runs over the rows of a (rows, n) example; the input "
                f"is {shape} with row_size {node.attrs['row_size']}"
            )
        code = "CUSTOM(XC_batched_softmax)"
    b.op(code, [b.tensor(node.inputs[0]), t], [b.tensor(node.outputs[0])], custom_options=b"")
