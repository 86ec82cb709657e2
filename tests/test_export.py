"""hwjax export / load: bit-exact round trip, the XS3 memory formats, rejected exports."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hwjax.nn as hn
from hwjax import targets as T
from hwjax import xs3
from hwjax._evaluate import evaluate
from hwjax._export import ExportError, export, load

RNG = np.random.default_rng(7)


def _model(target):
    r = nnx.Rngs(0)
    body = hn.Sequential({"dw": hn.DepthwiseConv(8, 3, activation=None, target=target, rngs=r)})
    return hn.Sequential(
        {
            "input": hn.Quantize(target=target),
            "conv": hn.Conv(1, 8, 3, activation="relu", target=target, rngs=r),
            "block": hn.Residual(body, hn.Add(activation="relu", target=target)),
            "avg": hn.AvgPool(2, strides=1, target=target),
            "max": hn.MaxPool(2, target=target),
            "act": hn.LutActivation("sigmoid", target=target),
            "flat": hn.Flatten(target=target),
            "fc": hn.Dense(3 * 3 * 8, 10, target=target, rngs=r),
        }
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = _model(T.XS3())
    x = jnp.asarray(RNG.uniform(0, 1, (64, 7, 7, 1)), jnp.float32)
    hn.set_mode(model, "calibrate")
    model(x)
    hn.set_mode(model, "hardware")
    path = export(model, tmp_path_factory.mktemp("export") / "model", input_shape=(7, 7, 1))
    return model, x, path


def test_round_trip_is_bit_exact(exported):
    model, x, path = exported
    loaded = load(path)
    flax_out = evaluate(model, x, batch_size=32)
    loaded_out = evaluate(loaded, x, batch_size=32)
    assert flax_out.outputs.dtype == np.int8
    np.testing.assert_array_equal(flax_out.outputs, loaded_out.outputs)
    np.testing.assert_array_equal(np.asarray(loaded(x)), flax_out.outputs.astype(np.int32))
    assert (loaded.output_scale, loaded.output_zero_point) == (flax_out.scale, flax_out.zero_point)
    # int8 inputs skip the input quantiser
    q = np.asarray(model.layers[0](x).q, np.int8)
    np.testing.assert_array_equal(np.asarray(loaded(q)), flax_out.outputs.astype(np.int32))


def test_manifest_describes_the_graph(exported):
    _, _, path = exported
    m = json.loads((path / "manifest.json").read_text())
    assert m["format"] == "hwjax.export" and m["format_version"] == 2
    assert m["target"] == {"name": "xs3", "variant": "hardware"}
    names = [n["name"] for n in m["nodes"]]
    assert names == ["input", "conv", "block.body.dw", "block.add", "avg", "max", "act", "flat", "fc"]
    assert [n["op"] for n in m["nodes"]] == [
        "quantize",
        "conv",
        "depthwise_conv",
        "add",
        "avgpool",
        "maxpool",
        "lut",
        "flatten",
        "dense",
    ]
    add = m["nodes"][3]
    assert add["inputs"] == ["conv", "block.body.dw"] and add["outputs"] == ["block.add"]
    conv = m["nodes"][1]
    assert conv["tensors"]["weights"]["dtype"] == "int8"
    assert conv["tensors"]["output_transform"]["dtype"] == "int16"
    assert conv["attrs"] == {
        "activation": "relu",
        "features": 8,
        "kernel_size": [3, 3],
        "stride": [1, 1],
        "padding": [[1, 1], [1, 1]],
    }
    assert m["tensors"]["conv"]["zero_point"] == -128 and m["tensors"]["conv"]["shape"] == [7, 7, 8]
    assert m["inputs"] == ["float_input"] and m["outputs"] == ["fc"]
    for node in m["nodes"]:
        for t in node["tensors"].values():
            assert (path / t["file"]).stat().st_size == t["bytes"]
    assert load(path).graph.summary().splitlines()[1].split()[:2] == ["conv", "conv"]


def test_exported_tensors_feed_xs3_conv2d_directly(exported):
    model, x, path = exported
    m = json.loads((path / "manifest.json").read_text())
    spec = m["nodes"][1]
    meta, cfg = spec["meta"], spec["attrs"]

    def blob(role):
        t = spec["tensors"][role]
        return np.frombuffer((path / t["file"]).read_bytes(), dtype=np.dtype(t["dtype"]).newbyteorder("<"))

    kshape = tuple(meta["kernel_shape"])
    k = xs3.reorder_kernel_weights_inverse(blob("weights").astype(np.int8), kshape)
    ot = xs3.deserialise_output_transform(blob("output_transform"), kshape[0])
    q_in = model.layers[0](x)
    y = xs3.conv2d(
        np.asarray(q_in.q, np.int8),
        k,
        ot["multipliers"],
        ot["biases"],
        initial_shift=meta["initial_shift"],
        final_shr=meta["final_shr"],
        stride=tuple(cfg["stride"]),
        pad_top_left=(cfg["padding"][0][0], cfg["padding"][1][0]),
        pad_value=meta["pad_value"],
        out_shape=tuple(m["tensors"]["conv"]["shape"][:2]),
        variant=m["target"]["variant"],
    )
    want = model.layers[1](q_in)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want.q).astype(np.int8))
    # the stream is lib_nn's reordered layout, byte for byte
    np.testing.assert_array_equal(blob("weights"), np.asarray(xs3.reorder_kernel_weights(k)))


def _copy(path, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(path, dst)
    return dst


def _edit_manifest(folder, fn, *, redigest=True):
    """Edits the manifest; with ``redigest`` also recomputes its digest (a deliberate,
    consistent-looking edit that load's semantic checks must still catch)."""
    from hwjax._export import manifest_digest

    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    if redigest:
        m["digest"] = manifest_digest(m)
    p.write_text(json.dumps(m))


def test_missing_truncated_and_tampered_files_are_rejected(exported, tmp_path):
    _, _, path = exported
    with pytest.raises(ExportError, match="no manifest.json"):
        load(tmp_path / "nowhere")
    d = _copy(path, tmp_path)
    (d / "conv.weights.bin").unlink()
    with pytest.raises(ExportError, match="layer conv: tensor file conv.weights.bin is missing"):
        load(d)
    shutil.rmtree(d)
    d = _copy(path, tmp_path)
    data = (d / "fc.output_transform.bin").read_bytes()
    (d / "fc.output_transform.bin").write_bytes(data[:-2])
    with pytest.raises(ExportError, match="truncated"):
        load(d)
    shutil.rmtree(d)
    d = _copy(path, tmp_path)
    data = bytearray((d / "conv.weights.bin").read_bytes())
    data[5] ^= 1
    (d / "conv.weights.bin").write_bytes(bytes(data))
    with pytest.raises(ExportError, match="checksum mismatch"):
        load(d)
    shutil.rmtree(d)
    d = _copy(path, tmp_path)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ExportError, match="not valid JSON"):
        load(d)
    shutil.rmtree(d)
    d = _copy(path, tmp_path)  # any edit of the manifest without its digest: a layer's shift
    _edit_manifest(
        d, lambda m: m["nodes"][1]["meta"].update(final_shr=m["nodes"][1]["meta"]["final_shr"] + 1), redigest=False
    )
    with pytest.raises(ExportError, match="digest mismatch"):
        load(d)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(format_version=1), "format version 1 is not supported"),
        (lambda m: m.update(hwjax_version="9.0.0"), "written by hwjax 9.0.0"),
        (lambda m: m.update(format="other"), "not a hwjax.export manifest"),
        (lambda m: m["target"].update(name="tpu"), "unknown target 'tpu'"),
        (lambda m: m["target"].update(variant="chip"), "invalid target"),
        (
            lambda m: m["nodes"][1]["meta"].update(kernel_shape=[8, 3, 3, 2]),
            r"'conv' \(conv\): its xs3 parameters do not fit its inputs \[\(7, 7, 1\)\]",
        ),
        (lambda m: m["tensors"]["conv"].update(shape=[7, 7, 9]), "'conv' has shape"),
        (lambda m: m["nodes"][4]["attrs"].update(window=[3, 3]), "'avg' has shape"),
        (lambda m: m["nodes"][3].update(inputs=["conv", "fc"]), "not a graph input or an earlier node"),
        (lambda m: m["nodes"][2].update(op="fancy"), "unknown op kind 'fancy'"),
        (lambda m: m["tensors"]["input"].update(scale=0.0), "scale must be finite and > 0"),
        (lambda m: m["tensors"]["input"].update(zero_point=500), r"zero_point must be an integer in \[-128, 127\]"),
    ],
)
def test_inconsistent_manifests_are_rejected(exported, tmp_path, edit, message):
    _, _, path = exported
    d = _copy(path, tmp_path)
    _edit_manifest(d, edit)
    with pytest.raises(ExportError, match=message):
        load(d)


def test_export_needs_a_calibrated_model(tmp_path):
    model = _model(T.XS3())
    with pytest.raises(ValueError, match="not calibrated"):
        export(model, tmp_path / "x", input_shape=(7, 7, 1))


def test_export_rejects_non_finite_weights_and_shapes_the_model_cannot_take(exported, tmp_path):
    from hwjax.errors import RangeError, ShapeError

    model, x, path = exported
    with pytest.raises(ShapeError, match=r"input_shape \(7, 7, 2\) does not fit the model"):
        export(model, tmp_path / "a", input_shape=(7, 7, 2))
    with pytest.raises(ShapeError, match=r"input_shape \(9, 9, 1\) does not fit the model"):
        export(model, tmp_path / "a", input_shape=(9, 9, 1))
    with pytest.raises(ShapeError, match="input_shape must be a non-empty tuple of positive ints"):
        export(model, tmp_path / "a", input_shape=(7, 0, 1))
    loaded = load(path)
    xb = np.array(x[:2])
    xb[1, 3, 4, 0] = np.nan
    with pytest.raises(RangeError, match="x must be finite"):
        loaded(xb)
    with pytest.raises(RangeError, match=r"x \(int8 input\) must lie in \[-128, 127\]; found 300"):
        loaded(np.full((1, 7, 7, 1), 300, np.int32))
    dw = model.layers[2].body.layers[0]
    old = dw.bias[...]
    try:
        dw.bias[...] = old.at[3].set(jnp.inf)
        with pytest.raises(RangeError, match="layer block.body.dw: parameter bias holds non-finite values"):
            export(model, tmp_path / "b", input_shape=(7, 7, 1))
    finally:
        dw.bias[...] = old
    assert not (tmp_path / "b" / "manifest.json").exists()


@pytest.mark.parametrize("target", [T.XS3Legacy(variant="v2021"), T.NVDLA()], ids=["xs3-legacy", "nvdla"])
def test_round_trip_on_the_other_targets(target, tmp_path):
    r = nnx.Rngs(1)
    layers = {
        "input": hn.Quantize(target=target),
        "fc1": hn.Dense(12, 8, activation="relu", target=target, rngs=r),
        "fc2": hn.Dense(8, 4, target=target, rngs=r),
    }
    if isinstance(target, T.NVDLA):
        layers["act"] = hn.LutActivation("tanh", target=target)
    model = hn.Sequential(layers)
    x = jnp.asarray(RNG.uniform(-1, 1, (40, 12)), jnp.float32)
    hn.set_mode(model, "calibrate")
    model(x)
    hn.set_mode(model, "hardware")
    loaded = load(export(model, tmp_path / "m", input_shape=(12,)))
    assert loaded.target == target
    np.testing.assert_array_equal(evaluate(loaded, x, batch_size=16).outputs, evaluate(model, x, batch_size=16).outputs)
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    roles = sorted(m["nodes"][1]["tensors"])
    assert roles == (["bso", "weights"] if isinstance(target, T.XS3Legacy) else ["sdp", "weights"])


def _blobs(path, spec):
    out = {}
    for role, t in spec["tensors"].items():
        raw = np.frombuffer((path / t["file"]).read_bytes(), dtype=np.dtype(t["dtype"]).newbyteorder("<"))
        out[role] = raw.reshape(t["shape"]) if "shape" in t else raw
    return out


def _hardware_model(target, layers, x):
    model = hn.Sequential(layers)
    hn.set_mode(model, "calibrate")
    model(x)
    hn.set_mode(model, "hardware")
    return model


def test_exported_legacy_tensors_feed_fully_connected_8(tmp_path):
    t = T.XS3Legacy(variant="host")
    x = jnp.asarray(RNG.uniform(-1, 1, (40, 12)), jnp.float32)
    model = _hardware_model(
        t, {"input": hn.Quantize(target=t), "fc": hn.Dense(12, 20, activation="relu", target=t, rngs=nnx.Rngs(3))}, x
    )
    path = export(model, tmp_path / "m", input_shape=(12,))
    spec = json.loads((path / "manifest.json").read_text())["nodes"][1]
    b = _blobs(path, spec)
    q = model.layers[0](x)
    y = xs3.fully_connected_8(
        np.asarray(q.q, np.int8),
        b["weights"].astype(np.int8).reshape(20, 12),
        b["bso"].astype(np.int16).reshape(-1, 7, 16),
        variant="host",
    )
    np.testing.assert_array_equal(np.asarray(y), np.asarray(model.layers[1](q).q).astype(np.int8))


def test_exported_nvdla_tensors_feed_the_sdp_kernels(tmp_path):
    from hwjax import nvdla

    t = T.NVDLA()
    x = jnp.asarray(RNG.uniform(-1, 1, (40, 12)), jnp.float32)
    model = _hardware_model(
        t,
        {
            "input": hn.Quantize(target=t),
            "fc": hn.Dense(12, 8, target=t, rngs=nnx.Rngs(4)),
            "act": hn.LutActivation("sigmoid", target=t),
        },
        x,
    )
    path = export(model, tmp_path / "m", input_shape=(12,))
    specs = json.loads((path / "manifest.json").read_text())["nodes"]
    q = model.layers[0](x)
    h, y = model.layers[1](q), model.layers[2](model.layers[1](q))
    # dense: the direct-convolution weight image and the SDP operand image, through the convertors
    fc, b = specs[1]["meta"], _blobs(path, specs[1])
    kcrs = nvdla.unpack_dc_weights(b["weights"], (8, 12, 1, 1), dtype=jnp.int8)
    bias16, mul16 = nvdla.unpack_sdp_per_channel(b["sdp"], 8, dtype=jnp.int16)
    acc = np.asarray(q.q, np.int64) @ np.asarray(kcrs, np.int64)[:, :, 0, 0].T  # exact int32 (CMAC/CACC)
    v = nvdla.cvt(
        acc.astype(np.int32), offset=-(np.asarray(bias16, np.int32) << fc["bias_shift"]), scale=1, shift=0, out_bits=32
    )
    v = nvdla.cvt(v, offset=0, scale=np.asarray(mul16, np.int32), shift=fc["mul_shift"], out_bits=32)
    want_h = nvdla.cvt(v, offset=0, scale=1, shift=0, out_bits=8, stage_bits=17)
    np.testing.assert_array_equal(np.asarray(h.q, np.int32), np.asarray(want_h))
    # LUT: the register words and the two tables, between the X1 multiplier and the output convertor
    meta, b = specs[2]["meta"], _blobs(path, specs[2])
    cfg = nvdla.SdpLutConfig(**meta["registers"], le_table=b["le_table"], lo_table=b["lo_table"])
    xq = nvdla.cvt(np.asarray(h.q, np.int32), offset=0, scale=meta["m_in"], shift=meta["sh_in"], out_bits=32)
    want_y = nvdla.cvt(
        nvdla.sdp_lut(xq, cfg)[0], offset=0, scale=meta["m_out"], shift=meta["sh_out"], out_bits=8, stage_bits=17
    )
    np.testing.assert_array_equal(np.asarray(y.q, np.int32), np.asarray(want_y))
