"""hwjax.tflite.save on xformer-compiled files: every XC custom operator is written back.

For every ``*.xc.tflite`` under tests/data/{xformer,xformer_act,keras_mcu} (and two random-graph
regressions of tests/data/randgraph_xs3): load, save,
load again; the reloaded graph has the same nodes (op kinds, attributes, parameters),
and its xs3 run on the stored inputs equals the stored outputs of xmos-ai-tools 1.4.2's
host interpreter (``y_xs3``) exactly. The written custom options and blobs are also
compared with xformer's: equal, except bytes xformer leaves uninitialised.

(Outside this suite, the saved files were also run in the real host interpreter,
``TFLMHostInterpreter`` of xmos-ai-tools 1.4.2, which needs its own numpy<2 environment:
all outputs equal ``y_xs3``.)
"""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import hwjax.tflite as tfl
from hwjax.tflite._xcore import F32, flex_dumps, flex_loads

DATA = Path(__file__).resolve().parent / "data"
FILES = sorted(p for d in ("xformer", "xformer_act", "keras_mcu") for p in (DATA / d).glob("*.xc.tflite"))
# and the random-graph regressions whose XC_conv2d_v2 reads its input as one pixel with a
# direct kernel, or writes into a reshaped tensor
FILES += [
    DATA / "randgraph_xs3" / f"{name}.xc.tflite"
    for name in ("regress_fc_direct_over_flattened_input", "regress_conv_into_reshaped_output")
]
# and an XC_add with a constant tensor as its second operand, an XC_batched_softmax
FILES += [
    DATA / "randgraph_xs3" / f"{name}.xc.tflite" for name in ("regress_add_const_full_shape", "regress_softmax_batched")
]
IDS = [f"{p.parent.name}/{p.name[: -len('.xc.tflite')]}" for p in FILES]
# files whose XC_broadcast of a constant is folded at import: written back as an XC_add /
# XC_mul with the broadcast constant as a tensor of the file, so their operators differ
# from xformer's, but not their values
FOLDED = [
    DATA / "randgraph_xs3" / f"{name}.xc.tflite" for name in ("regress_add_const_broadcast", "regress_mul_const_scalar")
]
ROUND_TRIP, ROUND_TRIP_IDS = FILES + FOLDED, IDS + [f"randgraph_xs3/{p.name[: -len('.xc.tflite')]}" for p in FOLDED]
XC_KINDS = {
    "xc_conv2d",
    "xc_pad",
    "xc_pad_3_to_4",
    "xc_slice",
    "xc_lookup",
    "xc_add",
    "xc_mean",
    "xc_maxpool2d",
    "xc_concat",
    "xc_mul",
    "xc_softmax",
}


@lru_cache(maxsize=None)
def _load(path: Path):
    return tfl.load(path)


@lru_cache(maxsize=None)
def _saved(path: Path) -> bytes:
    return tfl.save(_load(path))


def _stored(path: Path):
    return np.load(path.with_name(path.name[: -len(".xc.tflite")] + ".npz"))


def _assert_same_nodes(g1, g2):
    assert [n.op for n in g1.nodes] == [n.op for n in g2.nodes]
    for n1, n2 in zip(g1.nodes, g2.nodes):
        assert (n1.name, n1.inputs, n1.outputs) == (n2.name, n2.inputs, n2.outputs)
        assert n1.attrs == n2.attrs, n1.name
        p1, p2 = dict(n1.params or {}), dict(n2.params or {})
        assert sorted(p1) == sorted(p2), n1.name
        for k in p1:
            a, b = np.asarray(p1[k]), np.asarray(p2[k])
            assert a.dtype == b.dtype and np.array_equal(a, b), (n1.name, k)
    assert (g1.inputs, g1.outputs) == (g2.inputs, g2.outputs)
    for name, t in g1.tensors.items():
        u = g2.tensors[name]
        assert (t.shape, t.dtype) == (u.shape, u.dtype)
        assert np.array_equal(np.asarray(t.quant.scale), np.asarray(u.quant.scale))
        assert np.array_equal(np.asarray(t.quant.zero_point), np.asarray(u.quant.zero_point))


def test_the_files_cover_every_xc_op_kind():
    assert len(FILES) >= 70
    kinds = set().union(*({n.op for n in _load(p).graph.nodes} for p in FILES))
    assert XC_KINDS <= kinds
    from hwjax.tflite._save import writable_ops

    assert XC_KINDS <= set(writable_ops())


@pytest.mark.parametrize("path", ROUND_TRIP, ids=ROUND_TRIP_IDS)
def test_save_load_round_trips_and_runs_as_the_host_interpreter(path, tmp_path):
    model = _load(path)
    out = tmp_path / "saved.xc.tflite"
    data = tfl.save(model, out)
    assert out.read_bytes() == data
    again = tfl.load(out)
    _assert_same_nodes(model.graph, again.graph)
    assert [(i.name, i.shape, i.dtype) for i in again.inputs] == [(i.name, i.shape, i.dtype) for i in model.inputs]
    d = _stored(path)
    y = np.asarray(again.run(d["x"], runtime="xs3"))
    assert y.dtype == d["y_xs3"].dtype == np.int8
    np.testing.assert_array_equal(y.reshape(d["y_xs3"].shape), d["y_xs3"])


# ------------------------------------------------------------ the bytes xformer writes


def _file(data: bytes):
    import ai_edge_litert.schema_py_generated as s

    return s.ModelT.InitFromPackedBuf(bytearray(data), 0)


def _custom_ops(data: bytes) -> dict:
    """``{output tensor name: (custom code, options, inputs)}``: inputs as ``(type, shape,
    bytes or None)`` or None for an absent one."""
    m = _file(data)
    sg = m.subgraphs[0]
    out = {}
    for op in sg.operators:
        code = m.operatorCodes[op.opcodeIndex].customCode
        if not code or code == b"XC_no_op":  # XC_no_op is read as a reshape and written as RESHAPE
            continue
        raw = b"" if op.customOptions is None else bytes(op.customOptions)
        ins = []
        for i in op.inputs:
            t = None if i < 0 else sg.tensors[i]
            buf = None if t is None else m.buffers[t.buffer].data
            ins.append(
                None if t is None else (t.type, tuple(t.shape), None if buf is None or not len(buf) else bytes(buf))
            )
        out[sg.tensors[op.outputs[0]].name.decode()] = (code.decode(), flex_loads(raw) if raw else None, ins)
    return out


def _defined(code: str, opts):
    """``opts`` less the bytes xformer leaves uninitialised: the upper half of
    XC_maxpool2d's output-transform struct, XC_concat's sizes past its input count."""
    if opts is None:
        return None
    opts = dict(opts)
    if code == "XC_maxpool2d":
        opts["o"] = opts["o"][:4]
    if code == "XC_concat":
        opts["s"] = opts["s"][: opts["i"]]
    return opts


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_custom_options_and_blobs_equal_xformers(path):
    theirs, ours = _custom_ops(path.read_bytes()), _custom_ops(_saved(path))
    assert sorted(theirs) == sorted(ours)
    for name, (code, opts, ins) in theirs.items():
        code2, opts2, ins2 = ours[name]
        assert code2 == code
        assert _defined(code, opts2) == _defined(code, opts), (name, code)
        assert len(ins2) == len(ins)
        for k, (a, b) in enumerate(zip(ins, ins2)):
            if k == 0 or a is None:  # the data input; absent optional inputs
                assert (a is None) == (b is None)
                continue
            assert b is not None and b[0] == a[0] and b[2] == a[2], (name, code, k)  # type, bytes
            if a[2] is None:  # a scratch tensor: same size
                assert b[1] == a[1]


def test_metadata_is_copied_less_the_offline_memory_plan():
    path = DATA / "xformer" / "chain.xc.tflite"
    model = _load(path)
    assert {"xcoreSharedConfig", "OfflineMemoryAllocation"} <= set(model.metadata)

    def entries(data):
        m = _file(data)
        return {md.name.decode(): bytes(m.buffers[md.buffer].data) for md in (m.metadata or [])}

    saved = entries(_saved(path))
    assert "OfflineMemoryAllocation" not in saved  # it indexes the original file's tensors
    assert saved == {k: v for k, v in model.metadata.items() if k != "OfflineMemoryAllocation"}
    assert tfl.load(_saved(path)).metadata == saved
    assert entries(tfl.save(model.graph)) == {}  # a bare graph has none


def test_flex_dumps_round_trips_every_value_type():
    opts = {
        "k": 3,
        "neg": -5,
        "big": 2**31 - 1,
        "b": True,
        "f": F32(-128.0),
        "raw": b"\xfc\x00\xffab",
        "p": [b"\x01\x02", b""],
        "s": [6, -416864624, 0],
    }
    data = flex_dumps(opts)
    back = flex_loads(data)
    assert back == {**opts, "f": -128.0}
    assert isinstance(back["b"], bool) and isinstance(back["f"], float)
    import flatbuffers.flexbuffers as F

    ref = F.GetRoot(data).AsMap  # the flatbuffers package's reader: same types as xformer's files
    assert [k.AsKey for k in ref.Keys] == sorted(opts)
    types = {k.AsKey: v._type.name for k, v in zip(ref.Keys, ref.Values)}
    assert types == {
        "k": "INT",
        "neg": "INT",
        "big": "INT",
        "b": "BOOL",
        "f": "INDIRECT_FLOAT",
        "raw": "STRING",
        "p": "VECTOR",
        "s": "VECTOR",
    }
    assert struct.unpack("<f", struct.pack("<f", ref["f"].AsFloat)) == (-128.0,)
    with pytest.raises(TypeError):
        flex_dumps({"x": 1.5})  # a plain float: no encoding chosen
