"""NVDLA in-memory formats (spec 6): golden byte images, loop models of the spec, round trips."""

from __future__ import annotations

import json
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwjax.nvdla import (
    check_alignment,
    compress_sequence,
    compress_weights,
    dc_weight_offsets,
    decompress_sequence,
    decompress_weights,
    feature_offsets,
    image_post_extension_factor,
    image_weight_offsets,
    pack_dc_weights,
    pack_feature,
    pack_image_weights,
    pack_sdp_per_channel,
    pack_sdp_per_element,
    pack_winograd_transformed,
    pack_winograd_weights,
    pre_extend_image_weights,
    sdp_per_element_offsets,
    unextend_image_weights,
    unpack_dc_weights,
    unpack_feature,
    unpack_image_weights,
    unpack_sdp_per_channel,
    unpack_sdp_per_element,
    unpack_winograd_weights,
    weight_group_elements,
    wgs_image,
    winograd_transform,
    winograd_weight_offsets,
)
from tests.conftest import golden_path

BPE = {"int8": 1, "int16": 2, "float16": 2}
NPDT = {"int8": np.int8, "int16": np.int16, "float16": np.float16}


def hexof(a) -> str:
    return bytes(np.asarray(a, np.uint8)).hex()


def rnd_tensor(seed: int, shape, dtype: str, zero_frac: float = 0.0) -> np.ndarray:
    """Random values of ``dtype`` (fp16: random bit patterns except NaN/INF), some zeros."""
    rng = np.random.default_rng(seed)
    if dtype == "float16":
        bits = rng.integers(0, 2**16, size=shape, dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16)
        t = bits.view(np.float16)
    else:
        info = np.iinfo(NPDT[dtype])
        t = rng.integers(info.min, info.max + 1, size=shape).astype(NPDT[dtype])
    if zero_frac:
        t = np.where(rng.random(shape) < zero_frac, np.zeros((), t.dtype), t)
    return t


# ------------------------------------------------------ plain-Python models written from spec 6


def elem_bytes(v, dtype: str) -> bytes:
    """Little-endian bytes of one element (fp16 by its bit pattern)."""
    if dtype == "float16":
        return int(np.float16(v).view(np.uint16)).to_bytes(2, "little")
    return (int(v) & (0xFF if BPE[dtype] == 1 else 0xFFFF)).to_bytes(BPE[dtype], "little")


def model_image(t: np.ndarray, pos: dict, dtype: str, size: int) -> str:
    """Image with element ``idx`` of ``t`` at element position ``pos[idx]``."""
    img = bytearray(size)
    b = BPE[dtype]
    for idx, p in pos.items():
        img[p * b : p * b + b] = elem_bytes(t[idx], dtype)
    return img.hex()


def pad128(n: int) -> int:
    return -(-n // 128) * 128


def model_dc_positions(K, C, R, S, kpg, cpb=64) -> dict:
    """Spec 6.3 emission order: kernel group, channel block, r, s, kernel, channel."""
    pos, n = {}, 0
    for k0 in range(0, K, kpg):
        for c0 in range(0, C, cpb):
            for r in range(R):
                for s in range(S):
                    for k in range(k0, min(K, k0 + kpg)):
                        for c in range(c0, min(C, c0 + cpb)):
                            pos[(k, c, r, s)] = n
                            n += 1
    return pos


def model_pre_extend(t: np.ndarray, cin: int) -> np.ndarray:
    K, C, R, S = t.shape
    out = np.zeros((K, S * cin, R, 1), t.dtype)
    for k in range(K):
        for c in range(C):
            for r in range(R):
                for s in range(S):
                    out[k, s * cin + c, r, 0] = t[k, c, r, s]
    return out


def model_post_ext_factor(cin, S, R, sx, compiler=True) -> int:
    cp = S * cin
    if sx > S:
        return 1
    f = 4 if (cin * sx * 3 + cp <= 64 and cp <= 16) else 2 if (cin * sx + cp <= 64 and cp <= 32) else 1
    return 1 if f > 1 and compiler and R // f < 2 else f


def model_post_ext_positions(K, CP, R, kpg, f) -> dict:
    """Spec 6.4: kernel group, row group, kernel, row in group, channel."""
    pos, n = {}, 0
    for k0 in range(0, K, kpg):
        for r0 in range(0, R, f):
            for k in range(k0, min(K, k0 + kpg)):
                for r in range(r0, min(R, r0 + f)):
                    for c in range(CP):
                        pos[(k, c, r, 0)] = n
                        n += 1
    return pos


def model_wg_positions(K, CP, kpg) -> dict:
    """Spec 6.5: kernel group, 4-channel block, kernel, r, s, channel in block."""
    pos, n = {}, 0
    for k0 in range(0, K, kpg):
        for c0 in range(0, CP, 4):
            for k in range(k0, min(K, k0 + kpg)):
                for r in range(4):
                    for s in range(4):
                        for c in range(c0, c0 + 4):
                            pos[(k, c, r, s)] = n
                            n += 1
    return pos


def model_winograd_int(g) -> list:
    """trunc((G' g G'^T) / 4) with G' = 2G, exactly (spec 6.5 for integer weights)."""
    Gp = [[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]]
    tmp = [[sum(Gp[m][n] * int(g[n][p]) for n in range(3)) for p in range(3)] for m in range(4)]
    full = [[sum(tmp[r][n] * Gp[s][n] for n in range(3)) for s in range(4)] for r in range(4)]
    return [[int(Fraction(v, 4)) for v in row] for row in full]  # int() truncates toward zero


def model_compress(seq_bits: list, bpe: int, fp16: bool, groups) -> tuple[str, str, list]:
    """Spec 6.6 on element bit patterns: (weight hex, WMB hex, WGS); fp16 -0 counts as zero."""
    mask = [(b & 0x7FFF if fp16 else b) != 0 for b in seq_bits]
    wmb = bytearray(pad128(-(-len(mask) // 8)))
    for j, m in enumerate(mask):
        wmb[j // 8] |= m << (j % 8)
    data = b"".join(b.to_bytes(bpe, "little") for b, m in zip(seq_bits, mask) if m)
    wgs, start = [], 0
    for g in groups:
        wgs.append(sum(mask[start : start + g]) * bpe)
        start += g
    return (data + bytes(pad128(len(data)) - len(data))).hex(), wmb.hex(), wgs


def bits_of(t: np.ndarray) -> np.ndarray:
    return t.view(np.uint8 if t.dtype.itemsize == 1 else np.uint16).astype(np.int64)


# ------------------------------------------------------------------------ golden examples


def _golden():
    return json.loads(golden_path("nvdla", "formats_examples.json").read_text())["examples"]


def test_golden_feature_cubes():
    for e in _golden()["feature_cube"]:
        t = np.array(e["tensor_nchw"])
        kw = dict(line_stride=e["line_stride"], surf_stride=e["surf_stride"], batch_stride=e["batch_stride"])
        img = pack_feature(t, dtype=e["dtype"], **kw)
        assert hexof(img) == e["image_hex"] and img.shape == (e["image_bytes"],), e["name"]
        np.testing.assert_array_equal(feature_offsets(t.shape, e["dtype"], **kw), e["byte_offset_nchw"])
        np.testing.assert_array_equal(np.asarray(unpack_feature(img, t.shape, dtype=e["dtype"], **kw)), t)
        if e["shape_nchw"][0] == 1 and e["line_stride"] == 32 * t.shape[3]:  # packed: the defaults
            assert hexof(pack_feature(t, dtype=e["dtype"])) == e["image_hex"]


def test_golden_dc_weights():
    for e in _golden()["dc_weights"]:
        t = np.array(e["tensor_kcrs"])
        img = pack_dc_weights(t, dtype=e["dtype"])
        assert hexof(img) == e["image_hex"] and img.shape == (e["image_bytes"],), e["name"]
        off = dc_weight_offsets(t.shape, e["dtype"], atomic_k=e["atomic_k"], atomic_c=e["atomic_c"])
        np.testing.assert_array_equal(off, e["byte_offset_kcrs"])
        assert off.max() + e["element_bytes"] == e["data_bytes"]
        np.testing.assert_array_equal(np.asarray(unpack_dc_weights(img, t.shape, dtype=e["dtype"])), t)


def test_golden_image_weights():
    for e in _golden()["image_weights"]:
        t = np.array(e["tensor_kcrs"])
        K, C, R, S = t.shape
        cin, sx = e["input_surface_channels"], e["stride_x"]
        pre = pre_extend_image_weights(jnp.asarray(t), input_channels=cin)
        assert list(pre.shape) == e["pre_extended_shape_kcrs"]
        np.testing.assert_array_equal(np.asarray(pre), e["pre_extended_kcrs"])
        padded = np.asarray(unextend_image_weights(pre, channels=cin, kernel_width=S))
        np.testing.assert_array_equal(padded, e["zero_padded_kcrs"])
        assert (
            image_post_extension_factor(input_channels=cin, kernel_width=S, kernel_height=R, stride_x=sx)
            == e["post_extension_factor"]
        )
        img = pack_image_weights(t, dtype=e["dtype"], input_channels=cin, stride_x=sx)
        assert hexof(img) == e["image_hex"] and img.shape == (e["image_bytes"],), e["name"]
        forced = pack_image_weights(
            t, dtype=e["dtype"], input_channels=cin, stride_x=sx, post_extension=e["post_extension_factor"]
        )
        assert hexof(forced) == e["image_hex"]
        back = unpack_image_weights(img, t.shape, dtype=e["dtype"], input_channels=cin, stride_x=sx)
        np.testing.assert_array_equal(np.asarray(back), t)


def test_golden_winograd_weights():
    for e in _golden()["winograd_weights"]:
        t = np.array(e["tensor_kcrs"])
        w4 = winograd_transform(t, dtype=e["dtype"])
        assert w4.shape[1] == e["padded_channels"]
        np.testing.assert_array_equal(np.asarray(w4), e["transformed_kc44"])
        img = pack_winograd_weights(t, dtype=e["dtype"])
        assert hexof(img) == e["image_hex"] and img.shape == (e["image_bytes"],), e["name"]
        np.testing.assert_array_equal(
            np.asarray(unpack_winograd_weights(img, w4.shape, dtype=e["dtype"])), e["transformed_kc44"]
        )


def test_golden_sparse_compression():
    for e in _golden()["sparse_compression"]:
        t = np.array(e["tensor_kcrs"])
        dt = e["dtype"]
        assert hexof(pack_dc_weights(t, dtype=dt)) == e["uncompressed_image_hex"]
        assert weight_group_elements(t.shape, dt) == tuple(e["group_elements"])
        sw = compress_weights(t, dtype=dt)
        assert hexof(sw.weight) == e["weight_hex"] and sw.weight.shape == (e["weight_bytes"],), e["name"]
        assert hexof(sw.wmb) == e["wmb_hex"] and sw.wmb.shape == (e["wmb_bytes"],)
        assert [int(v) for v in np.asarray(sw.wgs)] == e["wgs"]
        assert sum(e["wgs"]) == e["nonzero_elements"] * e["element_bytes"]
        # the same from the uncompressed image's element sequence
        n = sum(e["group_elements"])
        raw = np.frombuffer(bytes.fromhex(e["uncompressed_image_hex"]), np.dtype(dt).newbyteorder("<"))[:n]
        sw2 = compress_sequence(raw.astype(dt), e["group_elements"])
        assert hexof(sw2.weight) == e["weight_hex"] and hexof(sw2.wmb) == e["wmb_hex"]
        back = decompress_weights(sw.weight, sw.wmb, t.shape, dtype=dt)
        np.testing.assert_array_equal(np.asarray(back), t)
        words = wgs_image(np.array(e["wgs"]))
        assert words.shape == (128,)
        assert hexof(words[: 4 * len(e["wgs"])]) == b"".join(v.to_bytes(4, "little") for v in e["wgs"]).hex()


def test_golden_sdp_operands():
    for e in _golden()["sdp_operands"]:
        dt = {1: "int8", 2: "int16"}[e["component_bytes"]]
        if e["kind"] == "per_channel":
            img = pack_sdp_per_channel(np.array(e["alu"]), np.array(e["mul"]), dtype=dt)
            assert hexof(img) == e["image_hex"], e["name"]
            alu, mul = unpack_sdp_per_channel(img, len(e["alu"]), dtype=dt)
        else:
            kw = dict(proc_precision=e["proc_precision"], line_stride=e["line_stride"], surf_stride=e["surf_stride"])
            img = pack_sdp_per_element(np.array(e["alu_chw"]), np.array(e["mul_chw"]), dtype=dt, **kw)
            assert hexof(img) == e["image_hex"], e["name"]
            alu, mul = unpack_sdp_per_element(img, np.array(e["alu_chw"]).shape, dtype=dt, **kw)
            assert e["bytes_per_atom"] == e["elements_per_atom"] * 2 * e["component_bytes"]
            e = dict(e, alu=e["alu_chw"], mul=e["mul_chw"])
        np.testing.assert_array_equal(np.asarray(alu), e["alu"])
        np.testing.assert_array_equal(np.asarray(mul), e["mul"])


# --------------------------------------------------------------- property tests vs models

DTYPES = st.sampled_from(["int8", "int16", "float16"])


@settings(max_examples=20)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 40),
    h=st.integers(1, 3),
    w=st.integers(1, 3),
    dtype=DTYPES,
    gaps=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    seed=st.integers(0, 2**32 - 1),
)
def test_feature_cube_matches_spec_and_round_trips(n, c, h, w, dtype, gaps, seed):
    t = rnd_tensor(seed, (n, c, h, w), dtype)
    epa = 32 // BPE[dtype]
    groups = -(-c // epa)
    line = 32 * w + 32 * gaps[0]
    surf = line * h + 32 * gaps[1]
    batch = surf * groups + 32 * gaps[2]
    kw = dict(line_stride=line, surf_stride=surf, batch_stride=batch)
    img = pack_feature(t, **kw)
    size = (n - 1) * batch + (groups - 1) * surf + (h - 1) * line + 32 * w
    pos = {}
    for idx in np.ndindex(t.shape):
        nn, cc, hh, ww = idx
        off = nn * batch + (cc // epa) * surf + hh * line + ww * 32 + (cc % epa) * BPE[dtype]
        pos[idx] = off // BPE[dtype]
    assert hexof(img) == model_image(t, pos, dtype, size)
    back = np.asarray(unpack_feature(img, t.shape, dtype=dtype, **kw))
    np.testing.assert_array_equal(bits_of(back), bits_of(t))
    if n == 1:  # CHW input, packed defaults
        packed = pack_feature(t[0])
        assert packed.shape == (groups * h * w * 32,)
        np.testing.assert_array_equal(
            np.asarray(unpack_feature(packed, t.shape[1:], dtype=dtype)).view(np.uint8), t[0].view(np.uint8)
        )


@settings(max_examples=20)
@given(
    k=st.integers(1, 40),
    c=st.integers(1, 70),
    r=st.integers(1, 2),
    s=st.integers(1, 3),
    dtype=DTYPES,
    seed=st.integers(0, 2**32 - 1),
)
def test_dc_weights_match_spec_and_round_trip(k, c, r, s, dtype, seed):
    t = rnd_tensor(seed, (k, c, r, s), dtype)
    kpg = 32 // BPE[dtype]
    pos = model_dc_positions(k, c, r, s, kpg)
    img = pack_dc_weights(t)
    assert hexof(img) == model_image(t, pos, dtype, pad128(t.size * BPE[dtype]))
    off = dc_weight_offsets(t.shape, dtype)
    assert all(off[i] == p * BPE[dtype] for i, p in pos.items())
    np.testing.assert_array_equal(bits_of(np.asarray(unpack_dc_weights(img, t.shape, dtype=dtype))), bits_of(t))


@settings(max_examples=15)
@given(
    k=st.integers(1, 20),
    c=st.integers(1, 4),
    extra=st.integers(0, 2),
    r=st.integers(1, 9),
    s=st.integers(1, 7),
    sx=st.integers(1, 3),
    dtype=DTYPES,
    seed=st.integers(0, 2**32 - 1),
)
def test_image_weights_match_spec_and_round_trip(k, c, extra, r, s, sx, dtype, seed):
    cin = c + extra
    t = rnd_tensor(seed, (k, c, r, s), dtype)
    f = image_post_extension_factor(input_channels=cin, kernel_width=s, kernel_height=r, stride_x=sx)
    assert f == model_post_ext_factor(cin, s, r, sx)
    pre = model_pre_extend(t, cin)
    np.testing.assert_array_equal(bits_of(np.asarray(pre_extend_image_weights(t, input_channels=cin))), bits_of(pre))
    kpg = 32 // BPE[dtype]
    for factor in {1, model_post_ext_factor(cin, s, r, sx, compiler=False)}:
        if factor == 1:
            pos = model_dc_positions(k, s * cin, r, 1, kpg)
        else:
            pos = model_post_ext_positions(k, s * cin, r, kpg, factor)
        img = pack_image_weights(t, input_channels=cin, stride_x=sx, post_extension=factor)
        assert hexof(img) == model_image(pre, pos, dtype, pad128(pre.size * BPE[dtype]))
        off = image_weight_offsets(t.shape, dtype, input_channels=cin, stride_x=sx, post_extension=factor)
        assert all(off[i] == p * BPE[dtype] for i, p in pos.items())
        back = unpack_image_weights(img, t.shape, input_channels=cin, stride_x=sx, post_extension=factor, dtype=dtype)
        np.testing.assert_array_equal(bits_of(np.asarray(back)), bits_of(t))


@settings(max_examples=15)
@given(k=st.integers(1, 40), cb=st.integers(1, 6), dtype=DTYPES, seed=st.integers(0, 2**32 - 1))
def test_winograd_layout_matches_spec_and_round_trips(k, cb, dtype, seed):
    w4 = rnd_tensor(seed, (k, 4 * cb, 4, 4), dtype)
    pos = model_wg_positions(k, 4 * cb, 32 // BPE[dtype])
    img = pack_winograd_transformed(w4)
    assert hexof(img) == model_image(w4, pos, dtype, pad128(w4.size * BPE[dtype]))
    off = winograd_weight_offsets(w4.shape, dtype)
    assert all(off[i] == p * BPE[dtype] for i, p in pos.items())
    np.testing.assert_array_equal(bits_of(np.asarray(unpack_winograd_weights(img, w4.shape, dtype=dtype))), bits_of(w4))


@settings(max_examples=12)
@given(
    k=st.integers(1, 3), c=st.integers(1, 20), dtype=st.sampled_from(["int8", "int16"]), seed=st.integers(0, 2**32 - 1)
)
def test_winograd_transform_integer_model(k, c, dtype, seed):
    lim = 56 if dtype == "int8" else 14563  # |G g G^T| <= 2.25 * max|g| must fit the type
    g = np.random.default_rng(seed).integers(-lim, lim + 1, size=(k, c, 3, 3)).astype(dtype)
    got = np.asarray(winograd_transform(g))
    cp = -(-c // (32 // BPE[dtype])) * (32 // BPE[dtype])
    assert got.shape == (k, cp, 4, 4) and got.dtype == np.dtype(dtype)
    for kk in range(k):
        for cc in range(cp):
            want = model_winograd_int(g[kk, cc]) if cc < c else [[0] * 4] * 4
            assert got[kk, cc].tolist() == want


def _fp16_toward_zero(v: float) -> int:
    """Largest-magnitude fp16 bit pattern not beyond |v| (binary search over 0..0x7BFF)."""
    target = abs(Fraction(v))
    lo, hi = 0, 0x7BFF
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if Fraction(float(np.uint16(mid).view(np.float16))) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo | (0x8000 if v < 0 or (v == 0 and str(v).startswith("-")) else 0)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1))
def test_winograd_transform_fp16_model(seed):
    g = rnd_tensor(seed, (1, 2, 3, 3), "float16")
    g = np.where(np.abs(g.astype(np.float32)) > 8000, np.float16(1.5), g).astype(np.float16)
    got = bits_of(np.asarray(winograd_transform(g)))
    G = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
    for cc in range(2):
        gg = g[0, cc].astype(np.float32)
        tmp = [[np.float32(0)] * 3 for _ in range(4)]
        for m in range(4):
            for p in range(3):
                for n in range(3):
                    tmp[m][p] = np.float32(tmp[m][p] + np.float32(G[m][n]) * gg[n][p])
        for r in range(4):
            for s in range(4):
                acc = np.float32(0)
                for n in range(3):
                    acc = np.float32(acc + tmp[r][n] * np.float32(G[s][n]))
                assert got[0, cc, r, s] == _fp16_toward_zero(float(acc)), (cc, r, s, acc)


@settings(max_examples=10)
@given(
    k=st.sampled_from([1, 16, 33]),
    c=st.integers(1, 30),
    s=st.integers(1, 3),
    dtype=DTYPES,
    zero_frac=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sparse_matches_spec_and_round_trips(k, c, s, dtype, zero_frac, seed):
    t = rnd_tensor(seed, (k, c, 1, s), dtype, zero_frac)
    if dtype == "float16":  # both zeros count as zero
        t = np.where(np.random.default_rng(seed + 1).random(t.shape) < 0.2, np.float16(-0.0), t)
    pos = model_dc_positions(k, c, 1, s, 32 // BPE[dtype])
    seq = [0] * t.size
    for idx, p in pos.items():
        seq[p] = int(bits_of(t[idx][None])[0])
    groups = weight_group_elements(t.shape, dtype)
    want_w, want_m, want_g = model_compress(seq, BPE[dtype], dtype == "float16", groups)
    sw = compress_weights(t)
    assert (hexof(sw.weight), hexof(sw.wmb), [int(v) for v in np.asarray(sw.wgs)]) == (want_w, want_m, want_g)
    back = np.asarray(decompress_weights(sw.weight, sw.wmb, t.shape, dtype=dtype))
    canon = np.where(bits_of(t) == 0x8000, 0, bits_of(t)) if dtype == "float16" else bits_of(t)
    np.testing.assert_array_equal(bits_of(back), canon)


@pytest.mark.parametrize("layout", ["image", "winograd"])
def test_sparse_image_and_winograd_layouts(layout):
    """The compressed sequence is the layout's image without tail padding (spec 6.6)."""
    if layout == "image":
        t = rnd_tensor(3, (20, 3, 9, 4), "int16", zero_frac=0.5)
        kw = dict(input_channels=4, stride_x=1)
        img, per_kernel = pack_image_weights(t, **kw), 4 * 4 * 9
    else:
        t = rnd_tensor(4, (20, 8, 4, 4), "float16", zero_frac=0.5)
        t = np.where(np.random.default_rng(9).random(t.shape) < 0.1, np.float16(-0.0), t)
        kw = {}
        img, per_kernel = pack_winograd_transformed(t), 8 * 16
    dt = t.dtype.name
    groups = weight_group_elements(t.shape, dt, layout=layout, **kw)
    assert groups == (16 * per_kernel, 4 * per_kernel)
    seq = np.asarray(img)[: 20 * per_kernel * 2].view(np.dtype(dt).newbyteorder("<")).astype(dt)
    want_w, want_m, want_g = model_compress([int(b) for b in bits_of(seq)], 2, dt == "float16", groups)
    got = compress_weights(t, layout=layout, **kw)
    assert (hexof(got.weight), hexof(got.wmb), [int(v) for v in np.asarray(got.wgs)]) == (want_w, want_m, want_g)
    back = np.asarray(decompress_weights(got.weight, got.wmb, t.shape, dtype=dt, layout=layout, **kw))
    canon = np.where(bits_of(t) == 0x8000, 0, bits_of(t))
    np.testing.assert_array_equal(bits_of(back), canon)


@settings(max_examples=12)
@given(
    c=st.sampled_from([1, 16, 33]),
    h=st.integers(1, 2),
    w=st.integers(1, 3),
    dtype=DTYPES,
    proc=st.sampled_from(["INT8", "INT16", "FP16"]),
    comps=st.sampled_from([("alu",), ("mul",), ("alu", "mul")]),
    gap=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
)
def test_sdp_per_element_matches_spec_and_round_trips(c, h, w, dtype, proc, comps, gap, seed):
    ops = {n: rnd_tensor(seed + i, (c, h, w), dtype) for i, n in enumerate(comps)}
    epa = 32 if proc == "INT8" else 16
    cb = BPE[dtype]
    bpa = epa * len(comps) * cb
    if bpa not in (32, 64, 128):  # spec 6.7: atoms of 32, 64 or 128 bytes only
        with pytest.raises(ValueError, match="32, 64 or 128 bytes per atom"):
            pack_sdp_per_element(**ops, proc_precision=proc)
        return
    line = w * bpa + 32 * gap
    surf = line * h
    img = pack_sdp_per_element(**ops, proc_precision=proc, line_stride=line)
    size = (-(-c // epa) - 1) * surf + (h - 1) * line + w * bpa
    expect = bytearray(size)
    off = sdp_per_element_offsets((c, h, w), dtype, proc_precision=proc, components=comps, line_stride=line)
    for ci, hi, wi in np.ndindex(c, h, w):
        for j, n in enumerate(comps):
            o = (ci // epa) * surf + hi * line + wi * bpa + (ci % epa) * len(comps) * cb + j * cb
            expect[o : o + cb] = elem_bytes(ops[n][ci, hi, wi], dtype)
            assert off[ci, hi, wi, j] == o
    assert hexof(img) == expect.hex()
    back = unpack_sdp_per_element(img, (c, h, w), dtype=dtype, proc_precision=proc, components=comps, line_stride=line)
    for arr, n in zip(back, comps):
        np.testing.assert_array_equal(bits_of(np.asarray(arr)), bits_of(ops[n]))


@settings(max_examples=20)
@given(
    c=st.integers(1, 50),
    dtype=DTYPES,
    comps=st.sampled_from([("alu",), ("mul",), ("alu", "mul")]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sdp_per_channel_matches_spec_and_round_trips(c, dtype, comps, seed):
    ops = {n: rnd_tensor(seed + i, (c,), dtype) for i, n in enumerate(comps)}
    img = pack_sdp_per_channel(**ops)
    assert hexof(img) == b"".join(elem_bytes(ops[n][i], dtype) for i in range(c) for n in comps).hex()
    back = unpack_sdp_per_channel(img, c, dtype=dtype, components=comps)
    for arr, n in zip(back, comps):
        np.testing.assert_array_equal(bits_of(np.asarray(arr)), bits_of(ops[n]))


# ------------------------------------------------------------------- jit / vmap / x64


def test_layouts_under_jit_and_vmap():
    batch = np.stack([rnd_tensor(i, (18, 65, 1, 2), "int16") for i in range(3)])
    eager = [np.asarray(pack_dc_weights(b)) for b in batch]
    vm = np.asarray(jax.vmap(pack_dc_weights)(batch))
    np.testing.assert_array_equal(vm, np.stack(eager))
    un = jax.jit(jax.vmap(lambda im: unpack_dc_weights(im, (18, 65, 1, 2), dtype="int16")))(vm)
    np.testing.assert_array_equal(np.asarray(un), batch)
    f = rnd_tensor(7, (2, 5, 2, 2), "int8")
    kw = dict(line_stride=96, surf_stride=256, batch_stride=512)
    jf = jax.jit(lambda x: pack_feature(x, **kw))
    np.testing.assert_array_equal(np.asarray(jf(f)), np.asarray(pack_feature(f, **kw)))
    img_w = rnd_tensor(3, (4, 3, 3, 3), "float16")
    ji = jax.jit(lambda x: pack_image_weights(x, input_channels=4))
    np.testing.assert_array_equal(np.asarray(ji(img_w)), np.asarray(pack_image_weights(img_w, input_channels=4)))
    g = np.random.default_rng(0).integers(-28, 29, size=(2, 3, 3, 3)).astype(np.int8)
    np.testing.assert_array_equal(np.asarray(jax.jit(pack_winograd_weights)(g)), np.asarray(pack_winograd_weights(g)))
    alu = rnd_tensor(1, (34, 1, 2), "int16")
    jp = jax.jit(lambda a, m: pack_sdp_per_element(a, m, proc_precision="INT8"))
    np.testing.assert_array_equal(
        np.asarray(jp(alu, alu)), np.asarray(pack_sdp_per_element(alu, alu, proc_precision="INT8"))
    )


def test_sparse_under_jit_has_fixed_size_buffer():
    t = rnd_tensor(5, (34, 66, 1, 2), "int8", zero_frac=0.6)
    eager = compress_weights(t)
    jitted = jax.jit(compress_weights)(t)
    full = pad128(t.size)
    assert jitted.weight.shape == (full,)
    n = eager.weight.shape[0]
    np.testing.assert_array_equal(np.asarray(jitted.weight[:n]), np.asarray(eager.weight))
    assert not np.asarray(jitted.weight[n:]).any()
    np.testing.assert_array_equal(np.asarray(jitted.wmb), np.asarray(eager.wmb))
    np.testing.assert_array_equal(np.asarray(jitted.wgs), np.asarray(eager.wgs))
    back = jax.jit(lambda w, m: decompress_weights(w, m, t.shape, dtype="int8"))(jitted.weight, jitted.wmb)
    np.testing.assert_array_equal(np.asarray(back), t)
    seq = jax.vmap(lambda w, m: decompress_sequence(w, m, t.size, dtype="int8"))(
        jnp.stack([jitted.weight] * 2), jnp.stack([jitted.wmb] * 2)
    )
    assert seq.shape == (2, t.size)


def test_identical_with_x64():
    t = rnd_tensor(11, (34, 66, 1, 2), "int8", zero_frac=0.5)
    f = rnd_tensor(12, (2, 5, 2, 2), "int8").astype(np.int64)  # int64 input with dtype=
    g = (rnd_tensor(13, (2, 3, 3, 3), "int8") // 8).astype(np.int8)
    h = rnd_tensor(14, (3, 20, 3, 3), "float16")
    kw = dict(line_stride=96, surf_stride=256, batch_stride=512)

    def run():
        sw = compress_weights(t)
        outs = (
            pack_dc_weights(t),
            pack_feature(f, dtype="int8", **kw),
            sw.weight,
            sw.wmb,
            sw.wgs,
            winograd_transform(g),
            winograd_transform(np.clip(h, -8000, 8000).astype(np.float16)),
            pack_image_weights(h, input_channels=20),
        )
        return [np.asarray(a) for a in outs]

    base = run()
    with jax.enable_x64(True):
        got = run()
    for a, b in zip(base, got):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: pack_feature(np.zeros((1, 5, 2, 3), np.int32)), TypeError, "pass dtype="),
        (
            lambda: pack_feature(np.zeros((5, 2, 3), np.int8), line_stride=64),
            ValueError,
            "line_stride must be a multiple of 32 and >= 96",
        ),
        (lambda: pack_feature(np.zeros((5, 2, 3), np.int8), line_stride=100), ValueError, "multiple of 32"),
        (lambda: pack_feature(np.zeros((5, 2, 3), np.int8), surf_stride=160), ValueError, "surf_stride"),
        (lambda: pack_feature(np.zeros((2, 5, 2, 3), np.int8), batch_stride=96), ValueError, "batch_stride"),
        (lambda: pack_feature(np.zeros((5, 3), np.int8)), ValueError, "rank 3 or 4"),
        (lambda: pack_feature(np.full((1, 2, 2), 300), dtype="int8"), ValueError, r"x must lie in \[-128, 127\]"),
        (lambda: pack_feature(np.zeros((1, 2, 2)), dtype="int4"), TypeError, "dtype must be one of"),
        (lambda: unpack_feature(np.zeros(10, np.uint8), (1, 2, 2), dtype="int8"), ValueError, "needs at least 128"),
        (lambda: unpack_feature(np.zeros(64, np.int8), (1, 2, 2), dtype="int8"), TypeError, "uint8"),
        (lambda: pack_dc_weights(np.full((1, 1, 1, 1), 40000), dtype="int16"), ValueError, r"w must lie in"),
        (lambda: pack_dc_weights(np.zeros((1, 1, 1), np.int8)), ValueError, "rank 4"),
        (lambda: pack_dc_weights(np.zeros((1, 1, 1, 1), np.int8), atomic_k=0), ValueError, "atomic_k"),
        (lambda: pack_image_weights(np.zeros((1, 5, 1, 1), np.int8), input_channels=4), ValueError, "input_channels"),
        (
            lambda: pack_image_weights(np.zeros((1, 4, 9, 7), np.int8), input_channels=4, post_extension=4),
            ValueError,
            "post_extension must be 1 or an eligible factor",
        ),
        (
            lambda: pack_image_weights(np.zeros((1, 4, 9, 4), np.int8), input_channels=4, post_extension=3),
            ValueError,
            "post_extension",
        ),
        (lambda: winograd_transform(np.zeros((1, 1, 2, 3), np.int8)), ValueError, "3x3"),
        (
            lambda: winograd_transform(np.full((1, 1, 3, 3), 100, np.int8)),
            ValueError,
            r"outside the int8 range \[-128, 127\]",
        ),
        (lambda: winograd_transform(np.full((1, 1, 3, 3), 30000, np.float16)), ValueError, "fp16"),
        (lambda: winograd_transform(np.full((1, 1, 3, 3), np.inf, np.float16)), ValueError, "finite"),
        (lambda: pack_winograd_transformed(np.zeros((1, 3, 4, 4), np.int8)), ValueError, "multiple of 4"),
        (lambda: compress_sequence(np.zeros(10, np.int8), (4, 5)), ValueError, "sum to the sequence length 10"),
        (lambda: compress_weights(np.zeros((1, 1, 1, 1), np.int8), layout="sparse"), ValueError, "layout must be"),
        (lambda: compress_weights(np.zeros((1, 1, 1, 1), np.int8), layout="image"), ValueError, "input_channels"),
        (
            lambda: decompress_sequence(np.zeros(128, np.uint8), np.zeros(1, np.uint8), 20, dtype="int8"),
            ValueError,
            "wmb has 1 bytes",
        ),
        (
            lambda: decompress_sequence(np.zeros(1, np.uint8), np.full(128, 255, np.uint8), 20, dtype="int8"),
            ValueError,
            "mask selects 20",
        ),
        (lambda: pack_sdp_per_channel(dtype="int8"), ValueError, "at least one"),
        (lambda: pack_sdp_per_channel(np.zeros(3, np.int8), np.zeros(4, np.int8)), ValueError, "same shape"),
        (
            lambda: pack_sdp_per_element(np.zeros((3, 1, 1), np.int8), proc_precision="INT4"),
            ValueError,
            "proc_precision",
        ),
        (
            lambda: unpack_sdp_per_element(
                np.zeros(64, np.uint8), (3, 1, 1), dtype="int8", proc_precision="INT8", components=("mul", "alu")
            ),
            ValueError,
            "components",
        ),
        (lambda: wgs_image(np.array([-1])), ValueError, "wgs must lie in"),
        (lambda: check_alignment("weight", address=128), ValueError, "multiple of 256"),
        (lambda: check_alignment("feature", line_stride=48), ValueError, "multiple of 32"),
        (lambda: check_alignment("tensor", size=1), ValueError, "kind must be one of"),
    ],
)
def test_bad_input_raises(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_alignment_accepts_valid_values():
    check_alignment("weight", address=512, size=4608)
    check_alignment("feature", address=32, line_stride=96, surf_stride=192, cube_stride=384)
    check_alignment("prelu", address=64, line_stride=7)  # no line-stride rule for PReLU
