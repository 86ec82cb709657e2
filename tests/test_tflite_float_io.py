"""Float interfaces (float32 input -> QUANTIZE -> ... -> DEQUANTIZE -> float32 output) against
live LiteRT, bit for bit, on every runtime (differential: the expected values come from
LiteRT only)."""

import jax
import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.tflite as tfl
from hwjax.errors import FormatError, RangeError
from hwjax.tflite import testing as T

ALL = ("reference", "optimized", "xnnpack")


def _quantize_model(shape, scale, zp, dtype="int8"):
    mb = T.ModelBuilder()
    x = mb.tensor((1, *shape), "float32", name="x")
    y = mb.tensor((1, *shape), dtype, np.float32(scale), zp, name="y")
    mb.op("QUANTIZE", [x], [y])
    return mb.finish([x], [y])


def _hard_inputs(rng, shape, s, batch):
    """Random values, exact ties ``(k + 1/2) s`` (in and beyond the int8 range), signed zeros,
    subnormals, huge values and values around ``2**31 s`` (where the int32 conversion
    overflows)."""
    k = rng.integers(-400, 400, (batch, *shape)).astype(np.float32)
    x = (rng.normal(0, 80, k.shape) * s).astype(np.float32)
    u = rng.random(k.shape)
    sign = rng.choice(np.float32([-1, 1]), k.shape)
    x = np.where(u < 0.4, ((k + np.float32(0.5)) * np.float32(s)).astype(np.float32), x)
    x = np.where((u >= 0.4) & (u < 0.45), sign * np.float32(0.0), x)
    x = np.where((u >= 0.45) & (u < 0.5), sign * np.float32(1e-40), x)
    x = np.where((u >= 0.5) & (u < 0.6), sign * (10.0 ** rng.uniform(4, 38, k.shape)).astype(np.float32), x)
    near = np.float32(2.0**31) * np.float32(s) * rng.choice(np.float32([1, 0.99999994, 1.0000001, 0.9999999]), k.shape)
    x = np.where((u >= 0.6) & (u < 0.67), sign * near.astype(np.float32), x)
    return x.astype(np.float32)


@pytest.mark.parametrize("runtime", ALL)
def test_quantize_float_int8_matches_litert(runtime):
    # 3 x 5 = 15 elements per example: 8 on the optimized kernel's vector loop, 7 on its tail
    rng = np.random.default_rng(11)
    shape = (3, 5)
    for trial in range(4):
        s = np.float32(10 ** rng.uniform(-4, 0.5))
        zp = int(rng.integers(-128, 128)) if trial else -3  # a negative zero point: overflow clamps to 127
        model = _quantize_model(shape, s, zp)
        x = _hard_inputs(rng, shape, s, 40)
        m = tfl.load(model)
        got = np.asarray(m.run(x, runtime=runtime))
        want = T.run_litert(model, x, runtime)
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want, err_msg=f"scale {s} zero point {zp}")


@pytest.mark.parametrize("runtime", ALL)
def test_quantize_float_uint8_matches_litert(runtime):
    rng = np.random.default_rng(12)
    shape = (13,)  # 8 + 5
    for zp in (0, 131, 255):
        s = np.float32(10 ** rng.uniform(-3, 0))
        model = _quantize_model(shape, s, zp, "uint8")
        x = _hard_inputs(rng, shape, s, 40)
        got = np.asarray(tfl.load(model).run(x, runtime=runtime))
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, T.run_litert(model, x, runtime), err_msg=f"scale {s} zero point {zp}")


def _float_conv_model(rng, in_shape=(5, 5, 3), c_out=4):
    """float32 -> QUANTIZE -> CONV_2D (SAME, relu) -> DEQUANTIZE -> float32."""
    mb = T.ModelBuilder()
    x = mb.tensor((1, *in_shape), "float32", name="x")
    s_in = np.float32(0.02)
    q = mb.tensor((1, *in_shape), "int8", s_in, 5)
    mb.op("QUANTIZE", [x], [q])
    s_w = rng.uniform(0.002, 0.02, c_out).astype(np.float32)
    w = mb.tensor(
        (c_out, 3, 3, in_shape[2]), "int8", s_w, np.zeros(c_out), rng.integers(-127, 128, (c_out, 3, 3, in_shape[2]))
    )
    b = mb.tensor((c_out,), "int32", (s_in * s_w).astype(np.float32), np.zeros(c_out), rng.integers(-900, 900, c_out))
    h = mb.tensor((1, *in_shape[:2], c_out), "int8", np.float32(0.03), -128)
    mb.op(
        "CONV_2D",
        [q, w, b],
        [h],
        ("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1, "fusedActivationFunction": 1}),
        3,
    )
    y = mb.tensor((1, *in_shape[:2], c_out), "float32", name="y")
    mb.op("DEQUANTIZE", [h], [y])
    return mb.finish([x], [y]), in_shape


@pytest.mark.parametrize("runtime", ALL)
def test_float_interface_model_matches_litert(runtime):
    rng = np.random.default_rng(3)
    model, shape = _float_conv_model(rng)
    m = tfl.load(model)
    assert m.inputs[0].dtype == "float32" and m.outputs[0].dtype == "float32"
    x = _hard_inputs(rng, shape, np.float32(0.02), 12)
    got = np.asarray(m.run(x, runtime=runtime))
    want = T.run_litert(model, x, runtime)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))  # bit-equal floats
    if runtime != "optimized":
        return
    # jit and vmap give the same bits (the optimized runtime: both rounding paths)
    jitted = np.asarray(jax.jit(lambda v: m.run(v, runtime=runtime))(x))
    np.testing.assert_array_equal(jitted.view(np.int32), want.view(np.int32))
    vm = np.asarray(jax.vmap(lambda v: m.run(v[None], runtime=runtime)[0])(x))
    np.testing.assert_array_equal(vm.view(np.int32), want.view(np.int32))


def test_float_input_policy():
    rng = np.random.default_rng(4)
    model = _quantize_model((4,), 0.1, 0)
    m = tfl.load(model)
    assert m.inputs[0].dtype == "float32" and m.outputs[0].dtype == "int8"
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros((2, 4), np.float32)
        x[1, 2] = bad
        with pytest.raises(RangeError, match="'x'"):
            m.run(x)
    with pytest.raises(TypeError, match="float32"):
        m.run(np.zeros((2, 4), np.int8))
    with pytest.raises(TypeError, match="float32"):
        m.run(np.zeros((2, 4), np.float64))
    # a float32 tensor anywhere but a model input read by QUANTIZE is refused, naming the operator
    mb = T.ModelBuilder()
    x = mb.tensor((1, 4), "float32", name="x")
    w = mb.tensor((2, 4), "int8", np.float32(0.01), 0, rng.integers(-9, 9, (2, 4)))
    y = mb.tensor((1, 2), "int8", np.float32(0.1), 0)
    mb.op("FULLY_CONNECTED", [x, w, -1], [y], ("FullyConnectedOptions", {}))
    with pytest.raises(FormatError, match=r"operator #0 \(FULLY_CONNECTED\).*float32"):
        tfl.load(mb.finish([x], [y]))


@pytest.mark.parametrize("runtime", ALL)
def test_trainable_quantize_matches_litert_on_ties(runtime):
    """The fine-tuning modules of a float-input model quantise its input as the runtime does
    (the reference kernel rounds ties away from zero, XNNPACK to even): on exact ties and huge
    values, ``Model.trainable(runtime)`` gives LiteRT's integers."""
    rng = np.random.default_rng(13)
    shape = (3, 5)
    s, zp = np.float32(0.05), 7
    model = _quantize_model(shape, s, zp)
    x = _hard_inputs(rng, shape, s, 40)
    x = np.where(np.abs(x) < 1e6, x, np.float32(-1e6))  # (the layer's float surrogate stays finite)
    got = np.asarray(tfl.load(model).trainable(runtime)(x).q).astype(np.int64)
    np.testing.assert_array_equal(got, T.run_litert(model, x, runtime).astype(np.int64))
