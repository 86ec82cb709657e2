"""hwjax.graph and the Target registry: the seams are real (a toy op and target from outside
the package), graphs from hwjax.nn models run bit-exactly, validation names the node,
and NVDLA runs depthwise conv, add and average pooling through the same seams."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hwjax
import hwjax.graph as hg
import hwjax.nn as hn
from hwjax import nvdla
from hwjax import targets as T
from hwjax.errors import ArgTypeError, FormatError, UnsupportedOpError

RNG = np.random.default_rng(99)


# ------------------------------------------------------- a toy op and target from outside


class _Double(hg.OpSpec):
    """``y = clip(2 x + offset, -128, 127)`` on int8 values."""

    name = "toy_double"
    attrs = {"offset": 0}


def _double_params(target, attrs, portable, q_in, q_out):
    return {"gain": jnp.int32(target.gain)}


def _double_run(target, attrs, params, x, return_acc=False):
    y = jnp.clip(params["gain"] * x.astype(jnp.int32) + attrs["offset"], -128, 127)
    return (y, None) if return_acc else y


@dataclasses.dataclass(frozen=True)
class _ToyChip(T.Target):
    name = "toy-chip"
    gain: int = 2


@pytest.fixture(scope="module")
def toy():
    if "toy_double" not in hg.ops():
        hg.register_op(_Double())
    _ToyChip.implements("toy_double", params=_double_params)(_double_run)
    T.register("toy-chip", _ToyChip, replace=True)
    return T.get("toy-chip", gain=3)


def _toy_graph():
    q = hg.Quant.of(0.5, 0)
    tensors = {
        "x": hg.Tensor("x", (4,), "float32"),
        "q": hg.Tensor("q", (4,), "int8", q),
        "y": hg.Tensor("y", (4,), "int8", q),
    }
    nodes = (hg.Node("quantize", ("x",), ("q",)), hg.Node("toy_double", ("q",), ("y",), {"offset": 1}))
    return hg.Graph(tensors, nodes, ("x",), ("y",)).validate()


def test_a_toy_op_and_target_registered_from_outside_run(toy):
    assert "toy-chip" in T.available() and "toy_double" in hg.ops()
    assert toy.ops() == {"toy_double", "quantize", "flatten"}
    g = _toy_graph()
    x = np.array([[0.0, 1.0, -1.5, 30.0], [2.0, -0.5, 0.25, -100.0]], np.float32)
    q = np.clip(np.round(x / 0.5), -128, 127)
    want = np.clip(3 * q + 1, -128, 127)
    np.testing.assert_array_equal(np.asarray(hg.run(g, x, toy)), want)
    np.testing.assert_array_equal(np.asarray(hg.jit_run(g, x, toy)), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda v: hg.run(g, v, toy))(x)), want)  # one example each
    np.testing.assert_array_equal(np.asarray(hg.run(g, x[0], T.get("toy-chip"))), np.clip(2 * q[0] + 1, -128, 127))
    with pytest.raises(ArgTypeError, match=r"hwjax.targets.get\('toy-chip'\) resolves a name"):
        hg.run(g, x[0], "toy-chip")  # the graph layer resolves no names
    lowered = hg.lower(g, toy)
    assert lowered.target == toy and int(lowered.nodes[1].params["gain"]) == 3
    with pytest.raises(ValueError, match="lowered for"):
        hg.run(lowered, x, T.XS3())
    with pytest.raises(UnsupportedOpError, match="cannot run a 'toy_double' op"):
        hg.run(g, x, T.XS3())
    y, inter = hg.run(g, x, toy, intermediates=True)
    np.testing.assert_array_equal(np.asarray(inter["q"]), q)


def test_validation_names_the_node():
    g = _toy_graph()
    bad = g.replace(nodes=(g.nodes[1], g.nodes[0]))
    with pytest.raises(FormatError, match="node #0 'y' .toy_double.: input 'q' is not a graph input"):
        bad.validate()
    t = dict(g.tensors, y=hg.Tensor("y", (5,), "int8", g.tensors["y"].quant))
    with pytest.raises(FormatError, match="output 'y' has shape \\(5,\\), the op infers \\(4,\\)"):
        g.replace(tensors=t).validate()
    with pytest.raises(FormatError, match="unknown op kind 'nope'"):
        g.replace(nodes=(g.nodes[0], g.nodes[1].replace(op="nope"))).validate()
    with pytest.raises(FormatError, match="unknown attributes \\['stride'\\]"):
        g.replace(nodes=(g.nodes[0], g.nodes[1].replace(attrs=hg.Attrs({"stride": 1})))).validate()
    with pytest.raises(ValueError, match="already registered"):
        hg.register_op(_Double())


# ------------------------------------------------------------- nn models as graphs


def _calibrated(model, x):
    hn.set_mode(model, "calibrate")
    model(x)
    hn.set_mode(model, "hardware")
    return model


def _block_model(target):
    r = nnx.Rngs(5)
    body = hn.Sequential({"dw": hn.DepthwiseConv(8, 3, target=target, rngs=r)})
    return hn.Sequential(
        {
            "input": hn.Quantize(target=target),
            "conv": hn.Conv(2, 8, 3, activation="relu", target=target, rngs=r),
            "block": hn.Residual(body, hn.Add(target=target)),
            "avg": hn.AvgPool(2, strides=1, target=target),
            "max": hn.MaxPool(2, target=target),
            "flat": hn.Flatten(target=target),
            "fc": hn.Dense(2 * 2 * 8, 5, target=target, rngs=r),
        }
    )


@pytest.mark.parametrize("target", [T.XS3(), T.NVDLA()], ids=["xs3", "nvdla"])
def test_graph_of_a_model_runs_its_hardware_mode_bit_exactly(target, tmp_path):
    x = jnp.asarray(RNG.uniform(-1, 1, (16, 6, 6, 2)), jnp.float32)
    model = _calibrated(_block_model(target), x)
    g = hn.to_graph(model, (6, 6, 2))
    assert [n.op for n in g.nodes] == [
        "quantize",
        "conv",
        "depthwise_conv",
        "add",
        "avgpool",
        "maxpool",
        "flatten",
        "dense",
    ]
    want = np.asarray(model(x).q, np.int32)
    np.testing.assert_array_equal(np.asarray(hg.jit_run(g, x, target)), want)
    np.testing.assert_array_equal(np.asarray(hg.jit_run(hg.lower(g, target), x)), want)
    loaded = hwjax.load(hwjax.export(model, tmp_path / "m", input_shape=(6, 6, 2)))
    np.testing.assert_array_equal(np.asarray(loaded(x)), want)
    assert loaded.graph.target == target


def test_run_materialises_each_read_result_but_a_reshape():
    """run computes each node's result once (compute_once, a conditional at the top of the
    program) where another node reads it, except for layout-only ops (flatten): the last
    node (dense) and the flatten get none."""
    t = T.XS3()
    x = jnp.asarray(RNG.uniform(-1, 1, (4, 6, 6, 2)), jnp.float32)
    g = hg.lower(hn.to_graph(_calibrated(_block_model(t), x), (6, 6, 2)), t)
    jaxpr = jax.make_jaxpr(lambda gr, v: hg.run(gr, v))(g, x).jaxpr
    assert hg.get_op("flatten").layout_only and not hg.get_op("maxpool").layout_only
    assert sum(e.primitive.name == "cond" for e in jaxpr.eqns) == len(g.nodes) - 2


def test_lowering_in_a_program_derives_the_linear_nodes_with_one_recipe(xs3_recipe_batches):
    """jit_run on a portable graph lowers it in the program: the XS3 parameters of its three
    linear nodes come from one batched recipe (derive_params), equal to the host recipe's."""
    batches = xs3_recipe_batches
    t = T.XS3()
    x = jnp.asarray(RNG.uniform(-1, 1, (4, 6, 6, 2)), jnp.float32)
    g = hn.to_graph(_calibrated(_block_model(t), x), (6, 6, 2))
    in_program = jax.jit(lambda gr: hg.lower(gr, t))(g)
    assert batches == [3]
    host = hg.lower(g, t)  # xformer's host recipe, node by node
    assert batches == [3]
    for a, b in zip(in_program.nodes, host.nodes):
        for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=a.name)


def test_nvdla_depthwise_add_and_avgpool_are_the_nvdla_kernels():
    t = T.NVDLA()
    x = jnp.asarray(RNG.uniform(-1, 1, (8, 6, 6, 2)), jnp.float32)
    model = _calibrated(_block_model(t), x)
    g = hg.lower(hn.to_graph(model, (6, 6, 2)), t)
    _, v = hg.run(g, x, intermediates=True)
    dw, add, avg = (g.node(n) for n in ("block.body.dw", "block.add", "avg"))
    p = dw.params
    y_dw, _ = nvdla.depthwise_conv2d_int8(
        v["conv"],
        p.kernel,
        stride=1,
        padding=((1, 1), (1, 1)),
        bias16=p.bias16,
        bias_shift=p.bias_shift,
        mul16=p.mul16,
        mul_shift=p.mul_shift,
    )
    np.testing.assert_array_equal(np.asarray(v["block.body.dw"]), np.asarray(y_dw, np.int32))
    a = add.params
    y_add = nvdla.sdp_add_int8(
        v["conv"],
        v["block.body.dw"],
        x_mul=a["x_mul"],
        x_shift=a["x_shift"],
        y_scale=a["y_scale"],
        y_shift=a["y_shift"],
        out_scale=1,
        out_shift=8,
    )
    np.testing.assert_array_equal(np.asarray(v["block.add"]), np.asarray(y_add, np.int32))
    y_avg = nvdla.pdp_avgpool_int8(v["block.add"], (2, 2), (1, 1))
    np.testing.assert_array_equal(np.asarray(v["avg"]), np.asarray(y_avg, np.int32))
    assert int(avg.params["recip_kernel_width"]) == 2**16 // 2
    # the add is close to the real sum of its dequantised inputs (within 1 LSB + rounding)
    s = {n: float(np.asarray(g.tensors[n].quant.scale)) for n in ("conv", "block.body.dw", "block.add")}
    real = (np.asarray(v["conv"]) * s["conv"] + np.asarray(v["block.body.dw"]) * s["block.body.dw"]) / s["block.add"]
    inside = np.abs(real) < 127
    assert np.max(np.abs(np.asarray(v["block.add"])[inside] - real[inside])) <= 1.0
    with pytest.raises(UnsupportedOpError, match="no ReLU after the element-wise"):
        hn.Add(activation="relu", target=t)


@pytest.mark.parametrize("target", [T.XS3(), T.NVDLA()], ids=["xs3", "nvdla"])
def test_from_graph_rebuilds_trainable_modules_with_the_same_bits(target):
    import optax

    x = jnp.asarray(RNG.uniform(-1, 1, (16, 6, 6, 2)), jnp.float32)
    g = hn.to_graph(_calibrated(_block_model(target), x), (6, 6, 2))
    m = hn.from_graph(g, target)
    assert [type(l).__name__ for l in m.layers] == [
        "Quantize",
        "Conv",
        "DepthwiseConv",
        "Add",
        "AvgPool",
        "MaxPool",
        "Flatten",
        "Dense",
    ]
    want = np.asarray(hg.jit_run(g, x, target))
    np.testing.assert_array_equal(np.asarray(m(x).q, np.int32), want)
    # the rebuilt modules emit the same portable integers
    g2 = hn.to_graph(m)
    for a, b in zip(g.nodes, g2.nodes):
        assert a.op == b.op and a.attrs == b.attrs
        for k in ("kernel", "bias"):
            if a.params is not None:
                np.testing.assert_array_equal(np.asarray(a.params[k]), np.asarray(b.params[k]))
    # one optax step in hardware mode (the exact forward, surrogate gradients) updates the weights
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    tx = optax.sgd(0.05)

    def loss(p):
        logits = hn.as_float(nnx.merge(graphdef, p, rest)(x))
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(16) % 5).mean()

    @jax.jit
    def step(p):  # one program, as users train
        grads = jax.grad(loss)(p)
        return grads, optax.apply_updates(p, tx.update(grads, tx.init(p), p)[0])

    grads, new = step(params)
    assert float(sum(jnp.abs(v).sum() for v in jax.tree.leaves(grads))) > 0
    assert any(
        not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params))
    )
    y_new = np.asarray(nnx.merge(graphdef, new, rest)(x).q)
    np.testing.assert_array_equal(y_new, np.round(y_new))  # still the exact integer pipeline
    with pytest.raises(ValueError, match="portable graph"):
        hn.from_graph(hg.lower(g, target), target)


def test_the_hwjax_0_1_target_methods_still_work_with_a_deprecation_warning():
    t = T.XS3()
    k = jnp.asarray(RNG.integers(-127, 128, (4, 3, 3, 2)), jnp.int8)
    b = jnp.asarray(RNG.integers(-500, 500, 4), jnp.int32)
    q = dict(
        s_in=jnp.float32(0.02),
        z_in=jnp.int32(-3),
        s_w=jnp.full(4, 0.01, jnp.float32),
        s_out=jnp.float32(0.05),
        z_out=jnp.int32(5),
    )
    with pytest.warns(DeprecationWarning, match="conv_params is deprecated"):
        p = t.conv_params(k, b, **q)
    new = t.lowering("conv").params(
        t,
        hg.Attrs({"activation": None}),
        {"kernel": k, "bias": b, "w_scale": q["s_w"]},
        [hg.Quant.of(q["s_in"], q["z_in"])],
        hg.Quant.of(q["s_out"], q["z_out"]),
    )
    assert jax.tree.all(jax.tree.map(lambda u, v: bool(np.array_equal(u, v)), p, new))
    x = jnp.asarray(RNG.integers(-128, 128, (2, 5, 5, 2)), jnp.int32)
    geom = T.ConvGeometry.make((5, 5), (3, 3), (1, 1), "SAME")
    with pytest.warns(DeprecationWarning, match="Target.conv is deprecated"):
        y, _ = t.conv(x, p, geom)
    attrs = hg.Attrs({"kernel_size": (3, 3), "stride": (1, 1), "padding": geom.padding})
    np.testing.assert_array_equal(np.asarray(y), np.asarray(t.lowering("conv").run(t, attrs, p, x)))


def test_barriers_stay_when_the_graph_is_a_constant_of_the_program():
    """With the graph closed over by the caller's jit (its values constants XLA folds),
    directly or through jit_run's nested jit, and under vmap, each materialised node still
    passes through a conditional in the compiled program: the trigger reads the input too
    (unmapped), so XLA cannot fold the barriers away. The values equal the eager run's."""
    t = T.XS3()
    x = jnp.asarray(RNG.uniform(-1, 1, (4, 6, 6, 2)), jnp.float32)
    g = hg.lower(hn.to_graph(_calibrated(_block_model(t), x), (6, 6, 2)), t)
    want = np.asarray(hg.run(g, x))
    programs = {
        "closed over": jax.jit(lambda v: hg.run(g, v)),
        "jit_run nested": jax.jit(lambda v: hg.jit_run(g, v)),
        "vmap": jax.jit(jax.vmap(lambda v: hg.run(g, v))),
    }
    for name, f in programs.items():
        np.testing.assert_array_equal(np.asarray(f(x)), want, err_msg=name)
        hlo = f.lower(x).compile().as_text()
        assert hlo.count(" conditional(") >= len(g.nodes) - 2, name
