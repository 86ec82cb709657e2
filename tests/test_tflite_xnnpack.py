"""ADD, QUANTIZE (int8 -> int8) and AVERAGE_POOL_2D against live LiteRT on its three x86
runtimes (BUILTIN_REF, the builtin optimized kernels, the default XNNPACK delegate): random
multi-op models, exact equality, zero mismatches.

Scale ratios in/out span 1/300..300 (plus the edges of XNNPACK's delegation ranges), zero
points span the int8 range, every op sees the whole int8 input range (ADD: all 65536 input
pairs), element counts leave scalar tails after LiteRT's 16-lane vector loops, pools use
2x2 / 3x3 / 3x2 windows, strides, SAME (edge windows with fewer taps) and VALID padding,
odd channel counts and fused RELU / RELU6."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.graph as hg
import hwjax.tflite as tfl
from hwjax.errors import UnsupportedOpError
from hwjax.targets import TFLite
from hwjax.tflite import testing as T
from hwjax.litert import _xnnpack as X
from hwjax.litert._arith import rdbpot32, shift_half_up32, srdhm32

RUNTIMES = ("reference", "optimized", "xnnpack")
B = 72  # examples per batch


def _litert(data: bytes, xs, runtime: str):
    """Every output of ``data`` for each example of the inputs ``xs`` (LiteRT, one thread),
    and the indices of the output tensors the XNNPACK delegate produced."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=data, num_threads=1, experimental_op_resolver_type=getattr(OpResolverType, T.RESOLVERS[runtime])
    )
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()
    ys = [[] for _ in outs]
    for b in range(xs[0].shape[0]):
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], x[b][None])
        it.invoke()
        for y, d in zip(ys, outs):
            y.append(it.get_tensor(d["index"])[0].copy())
    delegated = set()
    for op in it._get_ops_details():
        if op["op_name"] == "DELEGATE":
            delegated |= {int(i) for i in op["outputs"]}
    return [np.stack(y) for y in ys], [d["index"] in delegated for d in outs]


def _fill(rng, shape, pairs=False):
    """(B, *shape) int8 examples holding every int8 value (or, with ``pairs``, every pair of
    values as far as B * prod(shape) allows, the rest random), at random positions."""
    n = B * int(np.prod(shape))
    if pairs:
        grid = np.stack(np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij"), -1).reshape(-1, 2)
        grid = grid[rng.permutation(len(grid))[:n]]
        v = np.concatenate([grid, rng.integers(-128, 128, (n - len(grid), 2))])[rng.permutation(n)]
        return [v[:, i].astype(np.int8).reshape(B, *shape) for i in range(2)]
    v = np.concatenate([np.tile(np.arange(-128, 128), n // 256 + 1)[: max(256, n // 4)], rng.integers(-128, 128, n)])[
        :n
    ]
    return v[rng.permutation(n)].astype(np.int8).reshape(B, *shape)


def _s(v):
    return np.float32(v)


# --------------------------------------------------------------------------- models


def _add_specs(rng):
    """(shape, sa, za, sb, zb, so, zo, activation): random, plus cases at XNNPACK's
    delegation edges, an optimized-kernel int16 wrap, a tiny relative input scale and
    power-of-two scales (rounding ties, where the runtimes' conventions differ)."""
    specs = []
    shapes = [(33, 31), (3, 5, 7), (2, 3, 3)]
    acts = [None, "relu", "relu6"]
    for shape, act in zip(shapes, acts):
        so = _s(10 ** rng.uniform(-3, -1))
        sa, sb = (_s(so * 10 ** rng.uniform(-np.log10(300), np.log10(300))) for _ in range(2))
        za, zb, zo = (int(v) for v in rng.integers(-128, 128, 3))
        specs.append((shape, sa, za, sb, zb, so, zo, act))
    so = _s(0.003)
    specs += [
        ((7, 11), _s(so * 143.0), -128, _s(so * 0.04), 127, so, 5, None),  # int16 wrap in the vector loop
        ((6, 6), _s(so * 280.0), 17, _s(so * 0.5), -3, so, -100, None),  # ratio >= 256: not delegated
        ((5, 7), _s(so / 1500.0), 100, _s(so * 3.0), -90, so, 127, "relu"),  # ratio < 1/1024: not delegated
        ((3, 13), _s(so * 3e-6), -7, _s(so * 20.0), 0, so, -128, None),  # 20 + input shift < 0
        ((4, 9), _s(so * 255.0), 0, _s(so * 255.0), 1, so, 0, "relu6"),  # both near the top, delegated
        ((8, 8), _s(2.0**-7), 3, _s(2.0**-8), -9, _s(2.0**-6), 4, None),  # exact ratios 1/2, 1/4: many ties
    ]
    return specs


def _add_model(specs) -> bytes:
    mb = T.ModelBuilder()
    ins, outs = [], []
    for shape, sa, za, sb, zb, so, zo, act in specs:
        a = mb.tensor((1, *shape), "int8", sa, za)
        b = mb.tensor((1, *shape), "int8", sb, zb)
        y = mb.tensor((1, *shape), "int8", so, zo)
        mb.op("ADD", [a, b], [y], ("AddOptions", {"fusedActivationFunction": T.ACTIVATION_CODES[act]}))
        ins += [a, b]
        outs.append(y)
    return mb.finish(ins, outs)


def _quantize_specs(rng):
    """(shape, s_in, z_in, s_out, z_out): ratios 1/300..300 and XNNPACK's edges [1/256, 128]."""
    shapes = [(64,), (7, 5), (3, 3, 3), (17,), (5, 11)]
    specs = []
    for i, shape in enumerate(shapes):
        s_in = _s(10 ** rng.uniform(-3, -1))
        r = 10 ** np.linspace(-np.log10(300), np.log10(300), len(shapes))[i] * 10 ** rng.uniform(-0.1, 0.1)
        specs.append((shape, s_in, int(rng.integers(-128, 128)), _s(s_in / r), int(rng.integers(-128, 128))))
    s = _s(0.01)
    specs += [
        ((20,), _s(s * 128), -5, s, 3),  # exactly 128: delegated
        ((21,), np.nextafter(_s(s * 128), np.float32(np.inf)), 0, s, -1),  # just above 128: not delegated
        ((19,), s, 40, _s(s * 256), -40),  # exactly 1/256: delegated (multiplier 1)
        ((18,), s, 127, np.nextafter(_s(s * 256), np.float32(np.inf)), -128),  # just below 1/256: not delegated
        ((40,), _s(0.0105), -128, _s(0.0105 * 0.75), 127),
    ]
    return specs


def _quantize_model(specs) -> bytes:
    mb = T.ModelBuilder()
    ins, outs = [], []
    for shape, s_in, z_in, s_out, z_out in specs:
        a = mb.tensor((1, *shape), "int8", s_in, z_in)
        y = mb.tensor((1, *shape), "int8", s_out, z_out)
        mb.op("QUANTIZE", [a], [y])
        ins.append(a)
        outs.append(y)
    return mb.finish(ins, outs)


POOLS = [  # in_shape, window, stride, padding, activation
    ((7, 7, 3), (3, 3), (2, 2), "SAME", None),
    ((6, 5, 5), (2, 2), (2, 1), "VALID", "relu"),
    ((5, 9, 1), (3, 2), (1, 2), "SAME", "relu6"),
    ((8, 8, 7), (3, 3), (1, 1), "SAME", None),
    ((9, 6, 3), (2, 2), (3, 3), "SAME", "relu"),
    ((4, 7, 9), (3, 3), (1, 1), "VALID", None),
    ((3, 3, 5), (3, 3), (2, 2), "SAME", "relu6"),
]


def _pool_model(rng) -> bytes:
    from hwjax.litert import conv_geometry

    mb = T.ModelBuilder()
    ins, outs = [], []
    for in_shape, window, stride, padding, act in POOLS:
        s, zp = _s(10 ** rng.uniform(-3, -1)), int(rng.integers(-128, 128))
        x = mb.tensor((1, *in_shape), "int8", s, zp)
        g = conv_geometry(in_shape[:2], window, stride, padding)
        y = mb.tensor((1, *g.out_hw, in_shape[-1]), "int8", s, zp)
        mb.op(
            "AVERAGE_POOL_2D",
            [x],
            [y],
            (
                "Pool2DOptions",
                {
                    "padding": 0 if padding == "SAME" else 1,
                    "strideH": stride[0],
                    "strideW": stride[1],
                    "filterHeight": window[0],
                    "filterWidth": window[1],
                    "fusedActivationFunction": T.ACTIVATION_CODES[act],
                },
            ),
        )
        ins.append(x)
        outs.append(y)
    return mb.finish(ins, outs)


def _chain_model(rng) -> bytes:
    """x -> CONV_2D 1x1 (delegated) -> AVERAGE_POOL_2D SAME (not) -> QUANTIZE (delegated)."""
    mb = T.ModelBuilder()
    c = 5
    x = mb.tensor((1, 7, 6, 3), "int8", _s(0.02), -3)
    w = mb.tensor(
        (c, 1, 1, 3), "int8", np.full(c, 0.01, np.float32), np.zeros(c), rng.integers(-127, 128, (c, 1, 1, 3))
    )
    b = mb.tensor((c,), "int32", np.full(c, 0.0002, np.float32), np.zeros(c), rng.integers(-900, 900, c))
    h = mb.tensor((1, 7, 6, c), "int8", _s(0.05), 9)
    mb.op("CONV_2D", [x, w, b], [h], ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}), 3)
    p = mb.tensor((1, 4, 3, c), "int8", _s(0.05), 9)
    mb.op(
        "AVERAGE_POOL_2D",
        [h],
        [p],
        ("Pool2DOptions", {"padding": 0, "strideH": 2, "strideW": 2, "filterHeight": 3, "filterWidth": 3}),
    )
    y = mb.tensor((1, 4, 3, c), "int8", _s(0.05 / 0.37), -20)
    mb.op("QUANTIZE", [p], [y])
    return mb.finish([x], [y])


def _mini_model(add_specs, quantize_specs) -> bytes:
    """ADD and QUANTIZE ops (the cases here: an ADD XNNPACK does not take, a QUANTIZE it takes)."""
    mb = T.ModelBuilder()
    ins, outs = [], []
    for shape, sa, za, sb, zb, so, zo, act in add_specs:
        a, b = mb.tensor((1, *shape), "int8", sa, za), mb.tensor((1, *shape), "int8", sb, zb)
        y = mb.tensor((1, *shape), "int8", so, zo)
        mb.op("ADD", [a, b], [y], ("AddOptions", {"fusedActivationFunction": T.ACTIVATION_CODES[act]}))
        ins += [a, b]
        outs.append(y)
    for shape, s_in, z_in, s_out, z_out in quantize_specs:
        a, y = mb.tensor((1, *shape), "int8", s_in, z_in), mb.tensor((1, *shape), "int8", s_out, z_out)
        mb.op("QUANTIZE", [a], [y])
        ins.append(a)
        outs.append(y)
    return mb.finish(ins, outs)


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(20251125)
    out = {}
    specs = _add_specs(rng)
    xs = [v for sp in specs for v in _fill(rng, sp[0], pairs=True)]
    out["add"] = (_add_model(specs), xs, specs)
    specs = _quantize_specs(rng)
    out["quantize"] = (_quantize_model(specs), [_fill(rng, sp[0]) for sp in specs], specs)
    out["avgpool"] = (_pool_model(rng), [_fill(rng, p[0]) for p in POOLS], POOLS)
    out["chain"] = (_chain_model(rng), [_fill(rng, (7, 6, 3))], None)
    mini = [_add_specs(rng)[4]], [_quantize_specs(rng)[5]]
    out["mini"] = (
        _mini_model(*mini),
        [v for sp in mini[0] for v in _fill(rng, sp[0], pairs=True)] + [_fill(rng, sp[0]) for sp in mini[1]],
        mini,
    )
    for name, (data, xs, specs) in out.items():
        res = {rt: _litert(data, xs, rt) for rt in RUNTIMES}
        out[name] = (data, xs, specs, {rt: r[0] for rt, r in res.items()}, res["xnnpack"][1])
    return out


def _check(got, want, what):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        bad = int((g.astype(np.int32) != w.astype(np.int32)).sum())
        assert bad == 0, f"{what}, output {k}: {bad} of {w.size} values differ from LiteRT"


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("name", "runtime"),
    [
        ("add", "optimized"),
        ("add", "xnnpack"),
        ("quantize", "optimized"),
        ("quantize", "xnnpack"),
        # the integer average pool is one kernel on every runtime, and LiteRT's three runtimes
        # agree on these pools (test_runtimes_differ_where_modelled); the chain's pool runs
        # between delegated ops; "reference" runs are in tests/test_tflite_models.py
        ("avgpool", "xnnpack"),
        ("chain", "xnnpack"),
        ("chain", "optimized"),
    ],
)
def test_matches_litert(cases, name, runtime):
    data, xs, specs, want, delegated = cases[name]
    got = tfl.load(data).run(xs, runtime=runtime)
    for g in got if isinstance(got, tuple) else (got,):
        assert g.dtype == np.int8
    _check(got, want[runtime], f"{name} on {runtime}")


def test_delegation_rules_match_litert(cases):
    """XNNPACK takes ADD iff both fl32 ratios are in [2**-10, 2**8), QUANTIZE iff its ratio
    is in [2**-8, 2**7], and never an int8 AVERAGE_POOL_2D; the cases hold both kinds."""
    _, _, specs, _, delegated = cases["add"]
    rule = [X.xnn_add_delegated(sa, sb, so) for _, sa, _, sb, _, so, _, _ in specs]
    assert rule == delegated and any(rule) and not all(rule)
    _, _, specs, _, delegated = cases["quantize"]
    rule = [X.xnn_cvt_delegated(s_in, s_out) for _, s_in, _, s_out, _ in specs]
    assert rule == delegated and any(rule) and not all(rule)
    assert not any(cases["avgpool"][4])


def test_runtimes_differ_where_modelled(cases):
    """LiteRT's runtimes really differ on these cases, so one shared formula cannot pass:
    XNNPACK differs from the optimized kernels (ADD, QUANTIZE), the optimized kernels from
    the reference ones; average pooling is the same everywhere."""
    for name in ("add", "quantize"):
        w = cases[name][3]
        assert any(not np.array_equal(a, b) for a, b in zip(w["xnnpack"], w["optimized"])), name
        assert any(not np.array_equal(a, b) for a, b in zip(w["optimized"], w["reference"])), name
    w = cases["avgpool"][3]
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(*(w[r] for r in RUNTIMES)))


def test_vector_tail_positions():
    """The optimized loops' scalar tail: the last N mod 16 elements of each example."""
    m = X.vector_lanes((3, 7))
    assert m.sum() == 16 and m.reshape(-1)[:16].all() and not m.reshape(-1)[16:].any()
    assert X.vector_lanes((16,)).all() and not X.vector_lanes((15,)).any()


def test_xnnpack_params():
    """XNNPACK's recipes: the add multipliers of a 2:1 ratio pair, the clamp quantisation
    (float32, ties to even) and the convert multiplier."""
    p = X.xnn_add_params(0.02, 3, 0.01, -4, 0.01, 0)
    assert (int(p["shift"]), int(p["a_mult"]), int(p["b_mult"])) == (19, 2**20, 2**19)
    assert int(p["bias"]) == 2**18 - 3 * 2**20 + 4 * 2**19
    assert X.xnn_qs8_quantize(6.0, np.float32(6.0 / 12.5), 0) == 12  # 12.5 rounds to even
    assert X.xnn_qs8_quantize(np.inf, 0.1, 5) == 127 and X.xnn_qs8_quantize(0.0, 0.1, -128) == -128
    assert int(X.xnn_cvt_params(0.5, 1.0)["cvt_mult"]) == 128
    with pytest.raises(Exception, match="outside"):
        X.xnn_add_params(1.0, 0, 0.001, 0, 0.001, 0)


def test_int32_primitives_exact():
    """The int32 forms of SRDHM (multiplier >= 0), RoundingDivideByPOT and the half-up
    rounding shift that the NEON/XNNPACK kernels use equal their definitions evaluated
    with Python integers."""
    rng = np.random.default_rng(5)
    a = np.concatenate(
        [
            rng.integers(-(2**31), 2**31, 1200),
            rng.integers(-300, 300, 400),
            [-(2**31), 2**31 - 1, -1, 0, 1, -(2**30), 2**30],
        ]
    ).astype(np.int32)
    b = np.concatenate(
        [
            rng.integers(0, 2**31, 1200),
            rng.integers(2**30, 2**31, 400),
            [2**31 - 1, 2**30, 1, 0, 2**31 - 1, 2**30, 2**30 + 1],
        ]
    ).astype(np.int32)
    want = [(int(x) * int(y) + 2**30) >> 31 for x, y in zip(a, b)]
    assert np.asarray(srdhm32(jnp.asarray(a), jnp.asarray(b))).tolist() == want
    for e in (0, 1, 2, 7, 15, 30, 31):
        half = (1 << e) >> 1
        away = [(abs(int(x)) + half) >> e if x >= 0 else -((abs(int(x)) + half) >> e) for x in a]
        up = [(int(x) + half) >> e for x in a]
        assert np.asarray(rdbpot32(jnp.asarray(a), e)).tolist() == away, e
        assert np.asarray(shift_half_up32(jnp.asarray(a), e)).tolist() == up, e


def test_add_relu6_at_a_rounding_tie():
    """Output scale 0.48: 6 / s_out is 12.5 in float32, so XNNPACK clamps RELU6 at 12 and
    LiteRT's kernels at 13. The optimized runtime matches; on xnnpack the ADD raises (the
    importer splits RELU6 into its own node, which clamps with LiteRT's bound) rather than
    answer wrongly."""
    rng = np.random.default_rng(3)
    spec = ((16, 16), _s(0.1), 0, _s(0.2), -7, _s(0.48), 0, "relu6")
    data, xs = _add_model([spec]), _fill(rng, spec[0], pairs=True)
    want = {rt: _litert(data, xs, rt)[0] for rt in ("optimized", "xnnpack")}
    assert want["optimized"][0].max() == 13 and want["xnnpack"][0].max() == 12
    assert X.xnn_clamp_disagrees(_s(0.48), 0) == ["relu6"] and X.xnn_clamp_disagrees(_s(0.5), 0) == []
    _check(tfl.load(data).run(xs, runtime="optimized"), want["optimized"], "relu6 tie on optimized")
    with pytest.raises((UnsupportedOpError, jax.errors.JaxRuntimeError), match="ADD on xnnpack.*not supported"):
        tfl.load(data).run(xs, runtime="xnnpack")


def test_jit_vmap_and_x64(cases):
    """The lowered graph vmaps; the portable graph lowers inside jit (recipes through
    pure_callback); results do not depend on jax_enable_x64."""
    data, xs, _, want, delegated = cases["mini"]
    assert delegated == [False, True]
    m = tfl.load(data)
    x32 = [x.astype(np.int32) for x in xs]
    yv = jax.jit(jax.vmap(lambda g, *a: hg.run(g, a), in_axes=(None, *[0] * len(x32))))(m.lowered("xnnpack"), *x32)
    _check(yv, want["xnnpack"], "vmapped on xnnpack")
    yj = hg.jit_run(m.graph, tuple(x32), TFLite("optimized"))
    _check(yj, want["optimized"], "portable graph under jit on optimized")
    with jax.enable_x64(True):
        y64 = tfl.load(data).run(xs, runtime="xnnpack")
    _check(y64, want["xnnpack"], "xnnpack with jax_enable_x64")
