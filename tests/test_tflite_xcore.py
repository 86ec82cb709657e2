"""xformer's XC operators and the xcore.ai runtime against xmos-ai-tools 1.4.2.

The oracle data in tests/data/xformer/ was made by scripts/xformer_testdata.py: original
int8 models, their xformer conversions, and the outputs of both in the xmos host
interpreter (TFLMHostInterpreter) on 8 fixed inputs. Every comparison is exact.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hwjax.tflite as T
from hwjax.errors import FormatError, UnsupportedOpError
from hwjax.targets import get
from hwjax.tflite._xcore import flex_loads

DATA = os.path.join(os.path.dirname(__file__), "data", "xformer")
MODELS = sorted(f[:-4] for f in os.listdir(DATA) if f.endswith(".npz"))
# originals whose builtin ops the TFLite("tflm") target runs as the host interpreter does
TFLM_MODELS = ["add", "chain", "conv_3_5_same", "depthwise_valid_s2", "maxpool", "pad", "reshape"]


def _data(name):
    return np.load(os.path.join(DATA, f"{name}.npz"))


def test_the_data_covers_the_xc_ops():
    assert len(MODELS) == 20
    ops = set()
    for name in MODELS:
        ops |= {n.op for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes}
    assert {
        "xc_conv2d",
        "xc_pad",
        "xc_pad_3_to_4",
        "xc_pad_1_to_4",
        "xc_slice",
        "xc_lookup",
        "xc_add",
        "xc_mean",
        "xc_maxpool2d",
        "reshape",
        "flatten",
        "depthwise_conv",
        "maxpool",
    } <= ops


@pytest.mark.parametrize("name", MODELS)
def test_xformed_model_equals_host_interpreter(name):
    d = _data(name)
    y = np.asarray(T.load(os.path.join(DATA, f"{name}.xc.tflite")).run(d["x"], runtime="xs3"))
    assert y.dtype == d["y_xs3"].dtype
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0


@pytest.mark.parametrize("name", TFLM_MODELS)
def test_original_model_tflm_equals_host_interpreter(name):
    d = _data(name)
    from hwjax.targets import TFLite

    xmos_tflm = TFLite("tflm", tflm="xmos-1.4.2")  # the host interpreter's TFLM build
    y = np.asarray(T.load(os.path.join(DATA, f"{name}.tflite")).run(d["x"], runtime=xmos_tflm))
    assert int(np.sum(y.reshape(d["y_tflm"].shape) != d["y_tflm"])) == 0


def test_conv_kernel_types_are_decoded():
    kinds = {}
    for name in ("conv_1x1", "conv_3_5_same", "depthwise_valid_s2", "fully_connected"):
        for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes:
            if n.op == "xc_conv2d":
                kinds[name] = (n.attrs["kernel_type"], tuple(n.attrs["kernel_size"]), tuple(n.attrs["stride"]))
    assert kinds == {
        "conv_1x1": ("direct", (1, 1), (1, 1)),
        "conv_3_5_same": ("indirect", (3, 3), (1, 1)),
        "depthwise_valid_s2": ("depthwise", (3, 3), (2, 2)),
        "fully_connected": ("indirect", (1, 1), (1, 1)),
    }


def test_xformer_weights_are_the_original_weights():
    """The kernel recovered from the reordered blob is the original model's (conv 8 -> 12)."""
    orig = T.load(os.path.join(DATA, "conv_8_12_valid.tflite")).graph.nodes[0].params["kernel"]
    xc = [n for n in T.load(os.path.join(DATA, "conv_8_12_valid.xc.tflite")).graph.nodes if n.op == "xc_conv2d"]
    np.testing.assert_array_equal(np.asarray(xc[0].params["kernel"]), np.asarray(orig))


def test_hardware_variant_is_available():
    d = _data("conv_3_5_same")
    m = T.load(os.path.join(DATA, "conv_3_5_same.xc.tflite"))
    y = np.asarray(m.run(d["x"], runtime=get("xs3-tflm", variant="hardware")))
    assert y.shape == d["y_xs3"].shape and np.abs(y.astype(int) - d["y_xs3"]).max() <= 1


# ------------------------------------------------------------------ flexbuffers, errors


def test_flex_loads_reads_binary_strings():
    import flatbuffers.flexbuffers as fx

    raw = bytes(range(200, 256)) + b"\xff\x00"
    buf = fx.Dumps({"k": 3, "s": raw.decode("latin-1"), "f": 0.5, "v": True, "n": -7})
    got = flex_loads(buf)
    assert got["k"] == 3 and got["f"] == 0.5 and got["v"] is True and got["n"] == -7
    assert got["s"] == raw.decode("latin-1").encode("utf-8")  # the bytes as stored
    with pytest.raises(FormatError):
        flex_loads(b"\x01")


def test_unsupported_kernel_type_raises():
    """Kernel type 2 (PaddedIndirect) is not implemented: refused before anything is read."""
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._xcore import KERNEL_TYPES

    assert 2 not in KERNEL_TYPES
    opts = fx.Dumps({"k": 2, "t": 0, "mp": "", "a": "", "o": "", "p": ""})
    from hwjax.tflite._import import OpContext
    from hwjax.tflite._xcore import _conv2d_v2

    with pytest.raises(UnsupportedOpError, match=r"operator #0 \(CUSTOM\(XC_conv2d_v2\)\): kernel type 2"):
        _conv2d_v2(None, OpContext("CUSTOM(XC_conv2d_v2)", 0, None, bytes(opts), (0, 1, 2), (3,)))


def test_unknown_option_raises():
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._import import OpContext
    from hwjax.tflite._xcore import _add

    opts = bytes(fx.Dumps({"m1": 1, "m2": 1, "bias": 0, "shift": 1, "act": 1}))
    with pytest.raises(UnsupportedOpError, match=r"XC_add.*\['act'\]"):
        _add(None, OpContext("CUSTOM(XC_add)", 4, None, opts, (0, 1), (2,)))


# ------------------------------------------- runtime="xs3" on original models (xformer's recipe)

XS3_ORIGINALS = [
    "conv_3_5_same",
    "depthwise_valid_s2",
    "fully_connected",
    "mean",
    "spread_channelwise_a",
    "spread_tflm",
]


@pytest.mark.parametrize("name", XS3_ORIGINALS)
def test_original_model_xs3_equals_host_interpreter_of_xformed(name):
    d = _data(name)
    y = np.asarray(T.load(os.path.join(DATA, f"{name}.tflite")).run(d["x"], runtime="xs3"))
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0


def test_original_model_xs3_under_jit_before_any_eager_call():
    """runtime="xs3" on an original model checks xformer's lowering on the host: inside a
    ``jit`` trace of a model never run before it raised TracerArrayConversionError."""
    import jax

    d = _data("fully_connected")
    m = T.load(os.path.join(DATA, "fully_connected.tflite"))
    y = np.asarray(jax.jit(lambda v: m.run(v, runtime="xs3"))(d["x"]))
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0
    y = np.asarray(m.run(d["x"], runtime="xs3"))
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0


def _xc_blobs(name):
    """(weights int8, multipliers/biases int16) of every XC_conv2d_v2 in the xformed file,
    read straight from the flatbuffer (not through the importer)."""
    import ai_edge_litert.schema_py_generated as s

    with open(os.path.join(DATA, f"{name}.xc.tflite"), "rb") as f:
        m = s.ModelT.InitFromPackedBuf(bytearray(f.read()), 0)
    sg, out = m.subgraphs[0], []
    for o in sg.operators:
        code = m.operatorCodes[o.opcodeIndex]
        if code.builtinCode == 32 and code.customCode == b"XC_conv2d_v2":

            def raw(i):
                return bytes(m.buffers[sg.tensors[o.inputs[i]].buffer].data)

            out.append((np.frombuffer(raw(1), np.int8), np.frombuffer(raw(2), "<i2")))
    return out


@pytest.mark.parametrize("name", ["chain", "conv_16_17_s2", "conv_3_5_same", "depthwise_valid_s2", "fully_connected"])
def test_hwjax_blobs_equal_xformers_byte_for_byte(name):
    """The weight stream and the multiplier/bias memory of xformer's recipe, computed by
    hwjax from the ORIGINAL model (zero-scale pad channels included), equal the blobs in
    the xformed file. (chain: its depthwise layer stays a TFLM op.)"""
    from hwjax import xs3
    from hwjax.targets._xs3_compiled import xformer_linear_params

    g = T.load(os.path.join(DATA, f"{name}.tflite")).graph
    lin = [n for n in g.nodes if n.op in ("conv", "depthwise_conv", "dense")]
    if name == "chain":
        lin = [n for n in lin if n.op != "depthwise_conv"]
    blobs = _xc_blobs(name)
    assert len(blobs) == len(lin)
    for node, (w_blob, mb_blob) in zip(lin, blobs):
        p = xformer_linear_params(
            node.op, node.params, [g.tensors[node.inputs[0]].quant], g.tensors[node.outputs[0]].quant
        )
        mem = xs3.serialise_output_transform(np.asarray(p["multipliers"]), np.asarray(p["biases"]))
        np.testing.assert_array_equal(mem, mb_blob)
        k = np.asarray(p["kernel"])
        if node.op == "depthwise_conv":  # groups of 16 channels, taps row-major, 16 bytes each
            c = k.shape[0]
            kern = np.moveaxis(k[..., 0], 0, -1)
            kern = np.concatenate([kern, np.zeros((*kern.shape[:2], -c % 16), np.int8)], axis=-1)
            mine = kern.reshape(*kern.shape[:2], -1, 16).transpose(2, 0, 1, 3).reshape(-1)
            mine = np.concatenate([mine, np.zeros(16, np.int8)])
        else:
            if k.shape[-1] == 3:  # XC_pad_3_to_4
                k = np.concatenate([k, np.zeros((*k.shape[:-1], 1), np.int8)], axis=-1)
            mine = np.asarray(xs3.reorder_kernel_weights(k))
        np.testing.assert_array_equal(mine, w_blob)


def test_original_model_xs3_refuses_what_it_cannot_decide():
    """chain's conv has a fused RELU6 with output zero point -128, which xformer 1.4.2 drops
    (tests/test_tflite_xformer_act.py): the original on xs3 equals the host interpreter of
    the converted file. A RELU6 (zero point -128) or RELU_N1_TO_1 between equal
    quantisations that is not fused into a conv is kept by xformer (RELU6 as XC_lookup,
    tests/data/xformer_act/standalone_relu6_same_zm128; RELU_N1_TO_1 as the TFLM op, by
    its source), which hwjax's rule cannot tell from a fused one: refused."""
    d = _data("chain")
    y = np.asarray(T.load(os.path.join(DATA, "chain.tflite")).run(d["x"], runtime="xs3"))
    assert int(np.sum(y.reshape(d["y_xs3"].shape) != d["y_xs3"])) == 0
    assert int(np.sum(d["y_tflm"] != d["y_xs3"])) > 0  # TFLM's clamp differs: the drop is visible
    pytest.importorskip("ai_edge_litert")
    from hwjax.tflite import testing as TT

    for fn, zp in (("RELU6", -128), ("RELU_N1_TO_1", 0)):
        mb = TT.ModelBuilder()
        a, b = (mb.tensor((1, 16), "int8", np.float32(0.05), zp) for _ in range(2))
        mb.op(fn, [a], [b])
        with pytest.raises(UnsupportedOpError, match=f"{fn.lower()} with output zero point {zp} that is not fused"):
            T.load(mb.finish([a], [b])).run(np.zeros((1, 16), np.int8), runtime="xs3")


@pytest.mark.parametrize(
    "name", ["spread_group", "spread_channelwise_a", "spread_channelwise_b", "spread_tflm", "chain"]
)
def test_transform_choice_equals_xformers(name):
    """Group transform, channel-wise transform (with its parameters) or the TFLM op: hwjax's
    transcription of xformer's decision against what xformer wrote into the file."""
    from hwjax.targets._xformer import TRANSFORM_MODES, xformer_transform_choice
    from hwjax.targets._xs3_compiled import _linear_kernel, _padded_channels

    g = T.load(os.path.join(DATA, f"{name}.tflite")).graph
    xc = [
        n
        for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes
        if n.op in ("xc_conv2d", "conv", "depthwise_conv", "dense")
    ]
    lin = [n for n in g.nodes if n.op in ("conv", "depthwise_conv", "dense")]
    assert len(lin) == len(xc)
    for node, done in zip(lin, xc):
        k = np.asarray(_linear_kernel(node.op, np.asarray(node.params["kernel"])))
        co, cp = k.shape[0], _padded_channels(k.shape[0])
        q_in, q_out = g.tensors[node.inputs[0]].quant, g.tensors[node.outputs[0]].quant
        got = xformer_transform_choice(
            np.concatenate([k, np.zeros((cp - co, *k.shape[1:]), np.int8)]),
            np.concatenate([np.asarray(node.params["bias"]), np.zeros(cp - co, np.int32)]),
            np.asarray(q_in.scale),
            int(q_in.zero_point),
            np.concatenate([np.broadcast_to(np.asarray(node.params["w_scale"]), (co,)), np.zeros(cp - co, np.float32)]),
            np.asarray(q_out.scale),
            int(q_out.zero_point),
        )
        mode = TRANSFORM_MODES[int(got["mode"])]
        assert mode == (done.attrs["transform"] if done.op == "xc_conv2d" else "tflm")
        if mode == "channelwise":
            assert int(got["final_shr"]) == done.attrs["final_shr"]
            for key in ("shifts", "multipliers", "biases"):
                np.testing.assert_array_equal(got[key], np.asarray(done.params[key]))


def test_add_and_mean_options_equal_xformers():
    """XC_add's m1, m2, bias, shift and XC_mean's scale from hwjax's transcription of
    xformer's recipe equal the stored options."""
    from hwjax.targets._xformer import xformer_add_params, xformer_mean_scale

    for name, op in (("add", "add"), ("mean", "mean")):
        g = T.load(os.path.join(DATA, f"{name}.tflite")).graph
        node = [n for n in g.nodes if n.op == op][0]
        q = [g.tensors[t].quant for t in node.inputs] + [g.tensors[node.outputs[0]].quant]
        xc = [n for n in T.load(os.path.join(DATA, f"{name}.xc.tflite")).graph.nodes if n.op == "xc_" + op][0]
        if op == "add":
            got = xformer_add_params(
                q[0].scale, q[0].zero_point, q[1].scale, q[1].zero_point, q[2].scale, q[2].zero_point
            )
            assert {k: int(v) for k, v in got.items()} == {
                "m1": xc.attrs["multiplier1"],
                "m2": xc.attrs["multiplier2"],
                "bias": xc.attrs["bias"],
                "shift": xc.attrs["shift"],
            }
        else:
            assert float(xformer_mean_scale(q[0].scale, q[1].scale, node.attrs["count"])) == xc.attrs["scale"]


def _tensor(i, shape, data=None):
    from hwjax.tflite._import import _FileTensor

    return _FileTensor(i, f"t{i}", tuple(shape), "int8", data, np.float32([0.5]), np.int64([3]), 0)


def test_xc_broadcast_of_a_constant_is_folded():
    """lib_tflite_micro's XC_broadcast repeats each of ``b`` blocks of ``s`` bytes ``n``
    times: folded at import into the constant its consumer (XC_add / XC_mul) reads."""
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._import import Builder, OpContext
    from hwjax.tflite._xcore import _broadcast

    src = np.int8([[1, -2, 3], [4, 5, -6]])
    b = Builder([_tensor(0, (2, 3), src), _tensor(1, (1, 2, 4, 3))])
    opts = bytes(fx.Dumps({"b": 2, "n": 4, "s": 3, "v": False}))
    _broadcast(b, OpContext("CUSTOM(XC_broadcast)", 0, None, opts, (0,), (1,)))
    want = np.repeat(src[:, None, :], 4, axis=1).reshape(1, 2, 4, 3)
    assert b.is_const(1) and np.array_equal(b.const(1, "here", "operand").data, want)
    with pytest.raises(UnsupportedOpError, match="as a data input"):
        b.act(1, "here")

    bad = bytes(fx.Dumps({"b": 2, "n": 3, "s": 3}))  # 18 bytes for an output of 24
    with pytest.raises(FormatError, match=r"2 blocks of 3 bytes repeated 3 times"):
        _broadcast(
            Builder([_tensor(0, (2, 3), src), _tensor(1, (1, 2, 4, 3))]),
            OpContext("CUSTOM(XC_broadcast)", 0, None, bad, (0,), (1,)),
        )
    computed = Builder([_tensor(0, (1, 2, 3)), _tensor(1, (1, 2, 4, 3))])
    with pytest.raises(UnsupportedOpError, match="of a computed tensor"):
        _broadcast(computed, OpContext("CUSTOM(XC_broadcast)", 0, None, opts, (0,), (1,)))


def test_xc_add_with_a_constant_operand_is_one_input_and_a_parameter():
    import flatbuffers.flexbuffers as fx

    from hwjax.graph import Graph
    from hwjax.tflite._import import Builder, OpContext
    from hwjax.tflite._xcore import _add

    c = np.arange(-6, 6, dtype=np.int8).reshape(1, 12)
    b = Builder([_tensor(0, (1, 3, 4)), _tensor(1, (1, 12), c), _tensor(2, (1, 3, 4))])
    opts = bytes(fx.Dumps({"m1": 1, "m2": 1, "bias": 0, "shift": 1}))
    _add(b, OpContext("CUSTOM(XC_add)", 0, None, opts, (1, 0), (2,)))
    (node,) = b.nodes
    assert node.inputs == ("t0",) and node.attrs["const_index"] == 0
    assert np.array_equal(node.params["value"], c.reshape(3, 4)) and float(node.params["scale"]) == 0.5
    Graph(b.tensors, b.nodes, ("t0",), ("t2",))  # a valid node
    with pytest.raises(UnsupportedOpError, match="both operands are constants"):
        _add(
            Builder([_tensor(0, (1, 12), c), _tensor(1, (1, 12), c), _tensor(2, (1, 12))]),
            OpContext("CUSTOM(XC_add)", 0, None, opts, (0, 1), (2,)),
        )


def test_xc_broadcast_to_a_huge_declared_shape_is_refused_before_allocating():
    import flatbuffers.flexbuffers as fx

    from hwjax.tflite._import import Builder, OpContext
    from hwjax.tflite._xcore import _broadcast

    opts = bytes(fx.Dumps({"b": 1, "n": 2**31 - 1, "s": 1}))
    huge = Builder([_tensor(0, (1,), np.int8([3])), _tensor(1, (1, 2**16, 2**15, 1))])
    with pytest.raises(UnsupportedOpError, match="is not folded"):
        _broadcast(huge, OpContext("CUSTOM(XC_broadcast)", 0, None, opts, (0,), (1,)))
