"""hwjax.nn layers and hwjax.targets: modes, bit-exact hardware mode, gradients, errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hwjax
import hwjax.nn as hn
from hwjax import targets as T
from hwjax import xs3
from hwjax.graph import Attrs, Quant

RNG = np.random.default_rng(1234)


def _calibrated(model, x):
    hn.set_mode(model, "calibrate")
    model(x)
    hn.set_mode(model, "hardware")
    return model


def _conv_model(target, c_in=3, c_out=20, k=3, stride=1, padding="SAME", act="relu"):
    r = nnx.Rngs(0)
    return hn.Sequential(
        {
            "input": hn.Quantize(target=target),
            "conv": hn.Conv(c_in, c_out, k, strides=stride, padding=padding, activation=act, target=target, rngs=r),
        }
    )


def _lut_params(t, fn, s_in, z_in, s_out, z_out):
    return t.lowering("lut").params(t, Attrs({"fn": fn}), None, [Quant.of(s_in, z_in)], Quant.of(s_out, z_out))


# ------------------------------------------------------------------------- targets


def test_targets_construct_and_reject():
    assert T.XS3().variant == "hardware"
    for v in ("hardware", "host", "v2021"):
        assert T.XS3(variant=v).describe() == {"name": "xs3", "variant": v}
    with pytest.raises(ValueError, match="variant"):
        T.XS3(variant="chip")
    assert {"xs3", "xs3-legacy", "nvdla"} <= set(T.available())
    assert T.get("xs3", variant="host") == T.XS3(variant="host")
    assert T.get("xs3-legacy") == T.XS3Legacy() and T.get("nvdla") == T.NVDLA()
    with pytest.raises(ValueError, match="unknown target 'chip9'; available"):
        T.get("chip9")
    with pytest.raises(ValueError, match="does not take the options"):
        T.get("nvdla", variant="host")


def test_layer_a_target_cannot_run_fails_at_construction():
    @dataclasses.dataclass(frozen=True)
    class DenseOnly(T.Target):
        name = "dense-only"

    DenseOnly.implement("dense", T.XS3().lowering("dense"))
    t = DenseOnly()
    hn.Dense(4, 2, target=t, rngs=nnx.Rngs(0))
    with pytest.raises(NotImplementedError, match="cannot run a 'conv' op"):
        hn.Conv(1, 2, 3, target=t, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="target must be"):
        hn.Dense(4, 2, target=42, rngs=nnx.Rngs(0))
    assert hn.Dense(4, 2, target="xs3", rngs=nnx.Rngs(0)).target == T.XS3()  # registered names work


def test_bad_arguments_name_themselves():
    t = T.XS3()
    with pytest.raises(ValueError, match="activation"):
        hn.Conv(1, 2, 3, activation="gelu", target=t, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="padding"):
        hn.Conv(1, 2, 3, padding="FULL", target=t, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="mode"):
        hn.Quantize(target=t, mode="int8")
    with pytest.raises(ValueError, match="fn must be one of"):
        hn.LutActivation("relu", target=t)


def test_bad_sizes_and_inputs_name_the_layer():
    from hwjax.errors import HwjaxError, RangeError, ShapeError

    t, r = T.XS3(), nnx.Rngs(0)
    for make, msg in [
        (lambda: hn.Dense(0, 4, target=t, rngs=r), "Dense: in_features must be a positive int, got 0"),
        (lambda: hn.Dense(3, -1, target=t, rngs=r), "Dense: out_features"),
        (lambda: hn.Conv(3, 0, 3, target=t, rngs=r), "Conv: out_features"),
        (lambda: hn.Conv(3, 4, 0, target=t, rngs=r), "Conv: kernel_size"),
        (lambda: hn.Conv(3, 4, 3, strides=(1, -1), target=t, rngs=r), "Conv: strides"),
        (lambda: hn.DepthwiseConv(0, 3, target=t, rngs=r), "DepthwiseConv: features"),
        (lambda: hn.MaxPool(0, target=t), "MaxPool: window"),
    ]:
        with pytest.raises(RangeError, match=msg):
            make()
    with pytest.raises(TypeError, match="Dense: in_features must be a positive int, got 3.0") as e:
        hn.Dense(3.0, 4, target=t, rngs=r)
    assert isinstance(e.value, HwjaxError)
    conv, dw, dense = (
        hn.Conv(3, 4, 3, target=t, rngs=r),
        hn.DepthwiseConv(3, 3, target=t, rngs=r),
        hn.Dense(3, 4, target=t, rngs=r),
    )
    for layer, x, msg in [
        (conv, jnp.ones((1, 5, 5, 2)), r"Conv: input x .* 3 = in_features .*\(1, 5, 5, 2\)"),
        (conv, jnp.ones((5, 5, 3)), r"Conv: input x must have shape \(batch, height"),
        (dw, jnp.ones((1, 5, 5, 2)), r"DepthwiseConv: input x .* 3 = features"),
        (dense, jnp.ones((2, 5)), r"Dense: input x .* 3 = in_features .*\(2, 5\)"),
        (hn.MaxPool(9, target=t), jnp.ones((1, 5, 5, 2)), r"MaxPool: window \(9, 9\) does not fit"),
        (hn.AvgPool(2, target=t), jnp.ones((5, 5, 2)), r"AvgPool: input x must have shape"),
    ]:
        with pytest.raises(ShapeError, match=msg):
            layer(x)
    with pytest.raises(ShapeError, match=r"Add: inputs x1 and x2 must have the same shape"):
        hn.Add(target=t)(jnp.ones((1, 2, 2, 3)), jnp.ones((1, 2, 2, 4)))
    np.testing.assert_array_equal(np.asarray(dense([[1.0, 2.0, 3.0]])), np.asarray(dense(jnp.array([[1.0, 2.0, 3.0]]))))


def test_quantize_nan_rule():
    from hwjax.errors import RangeError

    t = T.XS3()
    m = _calibrated(_conv_model(t, c_in=1, c_out=2), jnp.asarray(RNG.uniform(0, 1, (4, 5, 5, 1)), jnp.float32))
    x = jnp.asarray(RNG.uniform(0, 1, (2, 5, 5, 1)), jnp.float32)
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        with pytest.raises(RangeError, match="Quantize input x must be finite"):
            m(x.at[1, 2, 3, 0].set(bad))
    q = hn.Quantize(target=t, mode="calibrate")
    q(x)
    before = np.asarray(q.out_range[...])
    with pytest.raises(RangeError, match="Quantize input x must be finite"):
        q(x.at[0, 0, 0, 0].set(jnp.nan))
    np.testing.assert_array_equal(np.asarray(q.out_range[...]), before)  # the range was not poisoned
    hn.set_mode(q, "float")
    assert np.isnan(np.asarray(q(x.at[0, 0, 0, 0].set(jnp.nan)))[0, 0, 0, 0])  # float mode: the float model
    hn.set_mode(q, "hardware")  # under jit: reported by hwjax.checked (the quantiser alone: no conv to compile)
    f = jax.jit(lambda v: q(v).q)
    np.testing.assert_array_equal(np.asarray(hwjax.checked(f)(x)), np.asarray(f(x)))
    with pytest.raises(RangeError, match="x must be finite"):
        hwjax.checked(f)(x.at[0, 1, 1, 0].set(jnp.nan))


# --------------------------------------------------------------------------- modes


def test_float_mode_is_the_plain_float_layer():
    t = T.XS3()
    conv = hn.Conv(3, 5, 3, strides=2, activation="relu", target=t, rngs=nnx.Rngs(0))
    x = jnp.asarray(RNG.normal(size=(2, 9, 7, 3)), jnp.float32)
    want = jax.nn.relu(
        jax.lax.conv_general_dilated(x, conv.kernel[...], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        + conv.bias[...]
    )
    np.testing.assert_array_equal(np.asarray(conv(x)), np.asarray(want))


def test_calibrate_records_ranges_and_hardware_needs_them():
    t = T.XS3()
    m = _conv_model(t)
    with pytest.raises(ValueError, match="not calibrated"):
        hn.set_mode(m, "hardware")
    x = jnp.asarray(RNG.uniform(-1, 2, (4, 6, 6, 3)), jnp.float32)
    hn.set_mode(m, "calibrate")
    y = m(x)
    r = np.asarray(m.layers[0].out_range[...])
    assert r[0] == float(x.min()) and r[1] == float(x.max())
    assert np.asarray(m.layers[1].out_range[...])[1] == float(y.max())
    assert np.asarray(m.layers[1].out_range[...])[0] == 0.0  # ReLU output
    hn.set_mode(m, "hardware")
    assert hn.get_mode(m) == "hardware"
    s, z = m.layers[1].out_qparams()
    assert int(z) == -128  # a ReLU range starts at 0: the int8 clamp is the ReLU


@pytest.mark.parametrize(
    "variant, geom", [("hardware", (3, 1, "SAME")), ("host", (2, 2, "VALID")), ("v2021", (3, 2, ((0, 2), (1, 1))))]
)
def test_conv_hardware_mode_equals_xs3_conv2d(variant, geom):
    k, stride, padding = geom
    t = T.XS3(variant=variant)
    m = _calibrated(
        _conv_model(t, c_in=3, c_out=20, k=k, stride=stride, padding=padding),
        jnp.asarray(RNG.uniform(-1, 1, (8, 7, 6, 3)), jnp.float32),
    )
    x = jnp.asarray(RNG.uniform(-1.2, 1.2, (5, 7, 6, 3)), jnp.float32)
    q_in = m.layers[0](x)
    y = jax.jit(lambda v: m(v).q)(x)
    conv = m.layers[1]
    geom_ = T.ConvGeometry.make((7, 6), (k, k), (stride, stride), conv.padding)
    hw = conv.integer_params(q_in.scale, q_in.zero_point, geom_)
    p = hw.params
    want = xs3.conv2d(
        np.asarray(q_in.q, np.int8),
        np.asarray(p.kernel),
        np.asarray(p.multipliers),
        np.asarray(p.biases),
        initial_shift=int(p.initial_shift),
        final_shr=int(p.final_shr),
        stride=(stride, stride),
        pad_top_left=geom_.pad_top_left,
        pad_value=int(p.pad_value),
        out_shape=geom_.out_hw,
        variant=variant,
    )
    np.testing.assert_array_equal(np.asarray(y).astype(np.int8), np.asarray(want))
    assert np.all(np.asarray(y) == np.round(np.asarray(y)))


def test_dense_and_depthwise_hardware_match_references():
    t = T.XS3()
    r = nnx.Rngs(1)
    m = hn.Sequential(
        {
            "input": hn.Quantize(target=t),
            "dw": hn.DepthwiseConv(8, 3, activation="relu", target=t, rngs=r),
            "flat": hn.Flatten(target=t),
            "fc": hn.Dense(5 * 5 * 8, 6, target=t, rngs=r),
        }
    )
    x = jnp.asarray(RNG.uniform(-1, 1, (6, 5, 5, 8)), jnp.float32)
    _calibrated(m, x)
    q_in = m.layers[0](x)
    h = m.layers[1](q_in)
    flat = m.layers[2](h)
    y, st = m.layers[3](flat, return_stats=True)
    # depthwise: per-tap saturating accumulation from 0 (exact sums here), then otfn_int8
    dw = m.layers[1]
    g = T.ConvGeometry.make((5, 5), (3, 3), (1, 1), "SAME")
    p = dw.integer_params(q_in.scale, q_in.zero_point, g).params
    xp = np.pad(np.asarray(q_in.q, np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=int(p.pad_value))
    acc = sum(
        xp[:, i : i + 5, j : j + 5, :] * np.asarray(p.kernel, np.int64)[:, i, j] for i in range(3) for j in range(3)
    )
    want = xs3.otfn_int8(
        acc.astype(np.int32),
        np.asarray(p.multipliers),
        np.asarray(p.biases),
        initial_shift=int(p.initial_shift),
        final_shr=int(p.final_shr),
    )
    np.testing.assert_array_equal(np.asarray(h.q).astype(np.int8), np.asarray(want))
    # dense: a 1x1 convolution of a 1x1 image
    fc = m.layers[3]
    pf = fc.integer_params(flat.scale, flat.zero_point, T.ConvGeometry.make((1, 1), (1, 1), (1, 1), "VALID")).params
    want_fc = xs3.conv2d(
        np.asarray(flat.q, np.int8)[:, None, None, :],
        np.asarray(pf.kernel),
        np.asarray(pf.multipliers),
        np.asarray(pf.biases),
        initial_shift=int(pf.initial_shift),
        final_shr=int(pf.final_shr),
        stride=(1, 1),
        pad_top_left=(0, 0),
        pad_value=int(pf.pad_value),
        out_shape=(1, 1),
    )
    np.testing.assert_array_equal(np.asarray(y.q).astype(np.int8), np.asarray(want_fc)[:, 0, 0, :])
    assert int(st.count) == 6 * 6 and int(st.acc_count) == 6 * 6 and int(st.acc_saturated) == 0


def test_pools_add_and_lut_hardware_match_the_xs3_kernels():
    t = T.XS3()
    r = nnx.Rngs(2)
    body = hn.Sequential({"c": hn.Conv(4, 4, 3, activation=None, target=t, rngs=r)})
    m = hn.Sequential(
        {
            "input": hn.Quantize(target=t),
            "res": hn.Residual(body, hn.Add(activation="relu", target=t)),
            "avg": hn.AvgPool(3, strides=1, target=t),
            "max": hn.MaxPool(2, target=t),
            "act": hn.LutActivation("tanh", target=t),
        }
    )
    x = jnp.asarray(RNG.uniform(-1, 1, (3, 6, 6, 4)), jnp.float32)
    _calibrated(m, x)
    q0 = m.layers[0](x)
    qr = m.layers[1](q0)
    c = m.layers[1].body(q0)
    add = m.layers[1].add
    s, z = add.out_qparams()
    p = T.xs3_add_params(s1=q0.scale, z1=q0.zero_point, s2=c.scale, z2=c.zero_point, s_out=s, z_out=z)
    a0, a1 = np.asarray(q0.q, np.int64), np.asarray(c.q, np.int64)
    acc = int(p["bias"]) + a0 * int(p["m1"]) + a1 * int(p["m2"])  # far from sat32
    sh = int(p["shift"])
    want = np.clip((acc + (1 << (sh - 1))) >> sh, -128, 127) if sh else np.clip(acc, -128, 127)
    np.testing.assert_array_equal(np.asarray(qr.q, np.int64), want)
    qa = m.layers[2](qr)
    np.testing.assert_array_equal(
        np.asarray(qa.q).astype(np.int8),
        np.asarray(xs3.avgpool2d(np.asarray(qr.q, np.int8), window_shape=(3, 3), window_stride=(1, 1))),
    )
    qm = m.layers[3](qa)
    np.testing.assert_array_equal(np.asarray(qm.q), np.asarray(qa.q).reshape(3, 2, 2, 2, 2, 4).max(axis=(2, 4)))
    ql = m.layers[4](qm)
    s, z = m.layers[4].out_qparams()
    table = np.asarray(T.lut_table("tanh", s_in=qm.scale, z_in=qm.zero_point, s_out=s, z_out=z))
    v = np.asarray(qm.q, np.int64)
    np.testing.assert_array_equal(np.asarray(ql.q, np.int64), table[v & 0xFF])
    real = np.tanh(float(qm.scale) * (v - int(qm.zero_point)))
    assert np.max(np.abs(float(s) * (np.asarray(ql.q) - int(z)) - real)) <= float(s) * 0.5 + 1e-6


def test_hardware_mode_works_under_jit_and_vmap_and_is_batch_independent(xs3_recipe_batches):
    batches = xs3_recipe_batches
    t = T.XS3()
    m = _calibrated(_conv_model(t), jnp.asarray(RNG.uniform(-1, 1, (8, 6, 6, 3)), jnp.float32))
    x = jnp.asarray(RNG.uniform(-1, 1, (6, 6, 6, 3)), jnp.float32)
    eager = np.asarray(m(x).q)  # each layer's hardware forward is itself jitted
    vmapped = np.asarray(jax.vmap(lambda v: m(v[None]).q[0])(x))
    jitted = np.asarray(jax.jit(lambda v: m(v).q)(x))  # the model closed over
    # weights and quantisation known, only the data traced: the host recipe at trace time,
    # no recipe program (the quantisation is computed at trace time too)
    assert batches == []
    halves = np.concatenate([np.asarray(m(x[i : i + 3]).q) for i in (0, 3)])
    np.testing.assert_array_equal(eager, vmapped)
    np.testing.assert_array_equal(eager, jitted)
    np.testing.assert_array_equal(eager, halves)


def test_hardware_gradients_flow_through_the_surrogate(xs3_recipe_batches):
    """Also: traced, the model derives the XS3 parameters of its linear layers with one
    batched recipe (hwjax.graph.derive_params), and its forward has the bits of the eager
    one (xformer's host recipe, layer by layer)."""
    batches = xs3_recipe_batches
    t = T.XS3()
    r = nnx.Rngs(3)
    m = hn.Sequential(
        {
            "input": hn.Quantize(target=t),
            "conv": hn.Conv(3, 8, 3, activation="relu", target=t, rngs=r, learn_scale=True),
            "flat": hn.Flatten(target=t),
            "fc": hn.Dense(6 * 6 * 8, 4, target=t, rngs=r),
        }
    )
    x = jnp.asarray(RNG.uniform(-1, 1, (8, 6, 6, 3)), jnp.float32)
    _calibrated(m, x)
    g, params, rest = nnx.split(m, nnx.Param, ...)

    def loss(p):
        out = nnx.merge(g, p, rest)(x)
        return jnp.sum(out.dequantize() ** 2), out

    (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert batches == [2]
    np.testing.assert_array_equal(np.asarray(out.q), np.asarray(m(x).q))
    assert batches == [2]  # eager: the host recipe
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves)
    assert np.abs(np.asarray(grads["layers"][1]["kernel"][...])).sum() > 0
    assert np.abs(np.asarray(grads["layers"][1]["scale_factor"][...])) > 0  # LSQ-style step size
    assert np.abs(np.asarray(grads["layers"][3]["bias"][...])).sum() > 0
    # the forward value inside the differentiated function is the integer pipeline's (int8
    # values; test_conv_hardware_mode_equals_xs3_conv2d checks them bit for bit)
    q = np.asarray(out.q)
    assert np.all(q == np.round(q)) and q.min() >= -128 and q.max() <= 127
    np.testing.assert_allclose(np.asarray(value), np.asarray(jnp.sum(out.dequantize() ** 2)), rtol=1e-6)


def test_exact_forward_is_exact_and_has_the_surrogate_gradient():
    exact = jnp.asarray([3.0, -128.0, 127.0])
    sur = jnp.asarray([2.9, -128.4, 126.6])
    np.testing.assert_array_equal(np.asarray(hn.exact_forward(exact, sur)), np.asarray(exact))
    g = jax.grad(lambda s: jnp.sum(hn.exact_forward(exact, s * 2.0)))(sur)
    np.testing.assert_array_equal(np.asarray(g), [2.0, 2.0, 2.0])


def test_exact_forward_reads_minus_zero_as_zero_and_masks_non_finite_surrogates():
    # the value and gradient of exact + (s - stop_gradient(s)), where(finite): written out
    exact = jnp.asarray([-0.0, 0.0, 5.0, -7.0])
    sur = jnp.asarray([0.1, jnp.inf, jnp.nan, -7.2])
    y = np.asarray(hn.exact_forward(exact, sur))
    assert y.tobytes() == np.asarray([0.0, 0.0, 5.0, -7.0], np.float32).tobytes()  # +0.0, bit for bit
    g_sur = jax.grad(lambda s: jnp.sum(hn.exact_forward(exact, s)))(sur)
    np.testing.assert_array_equal(np.asarray(g_sur), [1.0, 0.0, 0.0, 1.0])
    g_exact = jax.grad(lambda e: jnp.sum(3.0 * hn.exact_forward(e, sur)))(exact)  # a float exact's own tangent
    np.testing.assert_array_equal(np.asarray(g_exact), [3.0, 3.0, 3.0, 3.0])
    ints = jnp.asarray([1, -2, 0], jnp.int32)  # an integer exact: no tangent of its own
    g = jax.grad(lambda s: jnp.sum(hn.exact_forward(ints, s)))(jnp.asarray([0.5, 1.5, -0.5]))
    np.testing.assert_array_equal(np.asarray(g), [1.0, 1.0, 1.0])
    vm = jax.vmap(hn.exact_forward)(exact[:, None], sur[:, None])
    assert np.asarray(vm).tobytes() == y[:, None].tobytes()


def test_a_hardware_forward_computes_no_float_surrogate():
    # exact_forward's value ignores the surrogate: a forward-only program holds the integer
    # pipeline alone (no float convolution or dot), a training step both
    m = _conv_model(T.XS3())
    x = jnp.asarray(RNG.uniform(-1, 1, (4, 6, 6, 3)), jnp.float32)
    hn.set_mode(m, "calibrate")
    m(x)
    hn.set_mode(m, "hardware")
    import re

    float_ops = re.compile(r"= f32\[[^\]]*\]\S* (convolution|dot)\(")
    forward = jax.jit(lambda v: m(v).q).lower(x).compile().as_text()
    assert not float_ops.search(forward)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(m(v).q))).lower(x).compile().as_text()
    assert float_ops.search(grad)


def test_stats_count_saturated_outputs():
    t = T.XS3()
    m = _conv_model(t, act=None)
    x = jnp.asarray(RNG.uniform(-1, 1, (8, 6, 6, 3)), jnp.float32)
    hn.set_mode(m, "calibrate")
    m(x)
    m.layers[1].out_range[...] = jnp.asarray([-0.01, 0.01])  # far too narrow: outputs saturate
    hn.set_mode(m, "hardware")
    y, st = m(x, return_stats=True)
    q = np.asarray(y.q)
    assert int(st["conv"].high) == int((q == 127).sum()) > 0
    assert int(st["conv"].low) == int((q == -128).sum()) > 0
    assert int(st["conv"].acc_saturated) == 0
    hn.set_mode(m, "float")
    _, st_f = m(x, return_stats=True)  # float mode: what quantisation would clip
    assert int(st_f["conv"].high) > 0


# ----------------------------------------------------------- legacy XS3 and NVDLA


def test_legacy_and_nvdla_targets_reject_layers_they_cannot_run():
    with pytest.raises(NotImplementedError, match="multiple of 4"):
        hn.Conv(1, 8, 3, target=T.XS3Legacy(), rngs=nnx.Rngs(0))
    with pytest.raises(NotImplementedError, match="PDP pools windows of at most 8 x 8"):
        hn.AvgPool(9, target=T.NVDLA())
    with pytest.raises(NotImplementedError, match="no ReLU after the element-wise"):
        hn.Add(activation="relu", target=T.NVDLA())
    hn.AvgPool(2, target=T.NVDLA()), hn.Add(target=T.NVDLA())  # both run on NVDLA's PDP / SDP


def _mlp(target, fn=None):
    r = nnx.Rngs(5)
    layers = {
        "input": hn.Quantize(target=target),
        "fc": hn.Dense(16, 8, activation=None if fn else "relu", target=target, rngs=r),
    }
    if fn:
        layers["act"] = hn.LutActivation(fn, target=target)
    m = hn.Sequential(layers)
    return _calibrated(m, jnp.asarray(RNG.uniform(-1, 1, (32, 16)), jnp.float32))


def test_legacy_dense_is_fully_connected_8_with_tflite2xcore_bso():
    t = T.XS3Legacy(variant="host")
    m = _mlp(t)
    x = jnp.asarray(RNG.uniform(-1, 1, (7, 16)), jnp.float32)
    q = m.layers[0](x)
    y = m.layers[1](q)
    fc = m.layers[1]
    lq = fc.integer_params(q.scale, q.zero_point, T.ConvGeometry.make((1, 1), (1, 1), (1, 1), "VALID"))
    f = xs3.derive_bso_fields(
        np.asarray(lq.b_int, np.int32),
        np.asarray(lq.w_int, np.int8)[0, 0].T,
        input_scale=float(q.scale),
        input_zero_point=int(q.zero_point),
        weight_scales=np.asarray(lq.s_w),
        output_scale=float(lq.s_out),
        output_zero_point=int(lq.z_out),
    )
    want = xs3.fully_connected_8(
        np.asarray(q.q, np.int8), np.asarray(lq.w_int, np.int8)[0, 0].T, xs3.make_bso(*f), variant="host"
    )
    np.testing.assert_array_equal(np.asarray(y.q).astype(np.int8), np.asarray(want))


def test_nvdla_dense_and_lut_follow_the_sdp_pipeline():
    from hwjax import nvdla

    t = T.NVDLA()
    m = _mlp(t, fn="sigmoid")
    x = jnp.asarray(RNG.uniform(-1, 1, (7, 16)), jnp.float32)
    q = m.layers[0](x)
    assert int(q.zero_point) == 0  # symmetric activations
    h = m.layers[1](q)
    y = m.layers[2](h)
    fc = m.layers[1]
    p = fc.integer_params(q.scale, q.zero_point, T.ConvGeometry.make((1, 1), (1, 1), (1, 1), "VALID")).params
    acc = np.asarray(q.q, np.int64) @ np.asarray(p.kernel, np.int64)[:, 0, 0, :].T
    v = np.clip(acc + (np.asarray(p.bias16, np.int64) << int(p.bias_shift)), -(2**31), 2**31 - 1)
    prod = v * np.asarray(p.mul16, np.int64)
    s = int(p.mul_shift)
    v = np.sign(prod) * ((np.abs(prod) + (1 << (s - 1))) >> s) if s else prod  # round half away from zero
    want = np.clip(v, -128, 127)
    np.testing.assert_array_equal(np.asarray(h.q, np.int64), want)
    lp = _lut_params(t, "sigmoid", h.scale, h.zero_point, y.scale, y.zero_point)
    xq = nvdla.cvt(np.asarray(h.q, np.int32), offset=0, scale=lp.m_in, shift=lp.sh_in, out_bits=32)
    lut_y = nvdla.sdp_lut(xq, nvdla.sigmoid_lut())[0]
    want = nvdla.cvt(lut_y, offset=0, scale=lp.m_out, shift=lp.sh_out, out_bits=8, stage_bits=17)
    np.testing.assert_array_equal(np.asarray(y.q, np.int32), np.asarray(want))
    real = 1 / (1 + np.exp(-float(h.scale) * np.asarray(h.q)))
    inside = np.asarray(y.q) < 127  # outputs beyond the calibrated range saturate
    err = np.abs(float(y.scale) * np.asarray(y.q) - real)[inside]
    assert inside.sum() > 20 and err.max() < 1.5 * float(y.scale)


def test_nvdla_lut_gradient_is_the_lut_slope():
    from hwjax import nvdla

    t = T.NVDLA()
    m = _mlp(t, fn="sigmoid")
    x = jnp.asarray(RNG.uniform(-1, 1, (7, 16)), jnp.float32)
    h = m.layers[1](m.layers[0](x))
    lut = m.layers[2]
    s_out, z_out = lut.out_qparams()
    lp = _lut_params(t, "sigmoid", h.scale, h.zero_point, s_out, z_out)
    q = jnp.asarray(h.q, jnp.float32)
    grad = jax.grad(lambda v: lut(hn.QArray(v, h.scale, h.zero_point)).q.sum())(q)
    # chain of separately tested pieces: input convertor scale, LUT segment slope, output convertor scale
    xq = nvdla.cvt(np.asarray(h.q, np.int32), offset=0, scale=lp.m_in, shift=lp.sh_in, out_bits=32)
    slope = jax.grad(lambda v: nvdla.sdp_lut(v, nvdla.sigmoid_lut())[0].sum())(jnp.asarray(xq, jnp.float32))
    y = np.asarray(lut(h).q)
    inside = (y > -128) & (y < 127)
    want = (int(lp.m_in) * 2.0 ** -int(lp.sh_in)) * np.asarray(slope) * (int(lp.m_out) * 2.0 ** -int(lp.sh_out))
    np.testing.assert_array_equal(np.asarray(grad)[inside], want.astype(np.float32)[inside])
    assert inside.sum() > 20 and np.all(np.asarray(grad)[~inside] == 0)
