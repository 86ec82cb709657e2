"""Find where a computation's GPU result departs from the CPU's: ``python scripts/gpu_diff.py``.

On a machine with both backends, each case below runs whole on the CPU and on the GPU.
Where the two differ, its jaxpr (traced with the CPU as default device) is replayed one
equation at a time on both devices with the same (CPU) inputs: an equation whose
outputs differ is reported, and a call inside it (jit, custom_jvp, ...) is descended
into. A call that differs while none of its equations does differs by fusion (e.g. a
multiply and an add contracted into one FMA on the GPU); trace-time constants that
differ show as equal replays with different whole runs.

Needs the golden folder (HWJAX_GOLDEN) for the gemmlowp and LiteRT cases.
"""

from __future__ import annotations

import os
import sys
import traceback

os.environ.setdefault("HWJAX_TEST_FAST_COMPILE", "0")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np

CPU = jax.devices("cpu")[0]
try:
    ACC = jax.devices("gpu")[0]
except RuntimeError:
    ACC = CPU  # a dry run of the script itself
CALLS = (
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "remat",
    "checkpoint",
)
GOLDEN = os.environ.get("HWJAX_GOLDEN", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden"))
_reported: list[str] = []
MAX_LINES = 30  # reports per case


def _on(dev, fn, *args):
    with jax.default_device(dev):
        args = jax.device_put(args, dev)
        out = fn(*args)
        return jax.tree.map(np.asarray, out)


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def _differ(x, y) -> int:
    xs, ys = jax.tree.leaves(x), jax.tree.leaves(y)
    n = 0
    for a, b in zip(xs, ys):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == jax.dtypes.float0:
            continue
        if a.shape != b.shape:
            return -1
        n += int(np.sum(_bits(a) != _bits(b)))
    return n


def _subjaxpr(eqn):
    if eqn.primitive.name not in CALLS:
        return None
    for k in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if k in eqn.params:
            return eqn.params[k]
    return None


def _descend(eqn, ins):
    """(jaxpr, inputs) to replay inside ``eqn``: a call's body; a loop's first iteration;
    the branch a ``cond`` takes. None for other primitives."""
    name, p = eqn.primitive.name, eqn.params
    sub = _subjaxpr(eqn)
    if sub is not None:
        return sub, ins
    if name == "while":
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        return p["body_jaxpr"], ins[nc : nc + nb] + ins[nc + nb :]
    if name == "scan":
        n = p["num_consts"] + p["num_carry"]
        xs = [np.asarray(x)[-1 if p.get("reverse") else 0] for x in ins[n:]]
        return p["jaxpr"], ins[:n] + xs
    if name == "cond":
        idx = int(np.clip(np.asarray(ins[0]), 0, len(p["branches"]) - 1))
        return p["branches"][idx], ins[1:]
    return None


def _eqn_fn(eqn):
    return jax.jit(lambda *a: eqn.primitive.bind(*a, **eqn.params))


def _short(eqn) -> str:
    if eqn.primitive.name in CALLS:
        return f"name={eqn.params.get('name', '?')}"
    return ", ".join(f"{k}={v}" for k, v in eqn.params.items())[:300]


def _example(ins, cpu, acc) -> str:
    a, b = np.asarray(jax.tree.leaves(cpu)[0]), np.asarray(jax.tree.leaves(acc)[0])
    if a.shape != b.shape or a.ndim == 0:
        return f"cpu {a!r} gpu {b!r}"
    idx = np.argwhere(_bits(a) != _bits(b))
    if not len(idx):
        return ""
    i = tuple(idx[0])
    parts = []
    for v in ins:
        v = np.asarray(v)
        parts.append(repr(v[i]) if v.shape == a.shape else (repr(v) if v.size == 1 else f"{v.dtype}{v.shape}"))
    return f"at {i}: inputs {', '.join(parts)} -> cpu {a[i]!r} gpu {b[i]!r}"


def walk(closed, args, path: str, depth: int = 0) -> int:
    """Replays ``closed`` (a ClosedJaxpr or Jaxpr) equation by equation; returns the
    number of differing equations found at any depth."""
    jaxpr = getattr(closed, "jaxpr", closed)
    consts = getattr(closed, "consts", [])
    env = {}

    def read(v):
        return v.val if type(v).__name__ == "Literal" else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    found = 0
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [read(v) for v in eqn.invars]
        f = _eqn_fn(eqn)
        try:
            cpu = _on(CPU, f, *ins)
            acc = _on(ACC, f, *ins)
        except Exception as e:
            print(f"{'  ' * depth}{path}/{i}:{eqn.primitive.name}: could not replay ({type(e).__name__}: {e})"[:400])
            return found
        outs = cpu if eqn.primitive.multiple_results else [cpu]
        n = _differ(cpu, acc)
        if n and len(_reported) >= _budget[0]:
            return found + 1
        if n:
            found += 1
            avals = ", ".join(str(getattr(v, "aval", v)) for v in eqn.invars)
            line = f"{'  ' * depth}{path}/{i}:{eqn.primitive.name} differs in {n} outputs; in ({avals}) {_short(eqn)}"
            print(line)
            print(f"{'  ' * depth}    {_example(ins, cpu, acc)}"[:600])
            sub = _descend(eqn, ins)
            if sub is not None and depth < 12:
                inner = walk(sub[0], sub[1], f"{path}/{i}:{eqn.primitive.name}", depth + 1)
                if inner == 0:
                    prims = sorted({e.primitive.name for e in getattr(sub[0], "jaxpr", sub[0]).eqns})
                    print(
                        f"{'  ' * depth}    no single equation differs: fusion-level difference; "
                        f"its primitives: {prims}"
                    )
            _reported.append(eqn.primitive.name)
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return found


_budget = [MAX_LINES]


def case(name: str, fn, *args) -> None:
    print(f"\n=== {name}")
    _budget[0] = len(_reported) + MAX_LINES
    try:
        cpu = _on(CPU, fn, *args)
        acc = _on(ACC, fn, *args)
        n = _differ(cpu, acc)
        print(f"whole run: {n} outputs differ")
        if not n:
            return
        with jax.default_device(CPU):
            closed = jax.make_jaxpr(fn)(*args)
        with jax.default_device(ACC):
            closed_acc = jax.make_jaxpr(fn)(*args)
        for j, (c1, c2) in enumerate(zip(closed.consts, closed_acc.consts)):
            if _differ(c1, c2):
                print(
                    f"trace-time constant {j} {np.shape(c1)} differs between the two traces: computed eagerly "
                    "on the default device"
                )
        found = walk(closed, [np.asarray(a) for a in args], name)
        if not found:
            print("no equation differs on replay: the difference is in trace-time constants or fusion at top level")
    except Exception:
        traceback.print_exc(limit=6)


def fma_probe() -> None:
    """Does the GPU contract ``a*b - c`` into one FMA (no rounding of the product)?"""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4096).astype(np.float32)
    b = rng.standard_normal(4096).astype(np.float32)
    p = (a.astype(np.float32) * b).astype(np.float32)
    f = jax.jit(lambda a, b, p: a * b - p)
    for dev in (CPU, ACC):
        r = _on(dev, f, a, b, p)
        print(f"fma probe on {dev.platform}: a*b - fl(a*b) nonzero for {int(np.count_nonzero(r))} of 4096")


def main() -> int:
    print("devices:", CPU, ACC, "jax", jax.__version__)
    fma_probe()
    import hwjax.gemmlowp as G
    import hwjax.tflite as T
    from hwjax import nvdla as nv

    gp = os.path.join(GOLDEN, "gemmlowp", "gemm_uint8_pipelines.npz")
    if os.path.exists(gp):
        g = np.load(gp)
        lo, ro = int(g["A__lhs_offset"]), int(g["A__rhs_offset"])
        case(
            "gemmlowp gemm accumulator A",
            lambda l, r: G.gemm(l, r, lhs_offset=lo, rhs_offset=ro),
            g["A__lhs"],
            g["A__rhs"],
        )
    lp = os.path.join(GOLDEN, "gemmlowp", "litert_int8_cases.npz")
    if os.path.exists(lp):
        d = np.load(lp)
        n = "fc_per_channel_relu6_b10_i29_o9"
        kw = dict(
            input_scale=d[f"{n}__input_scale"],
            input_zero_point=d[f"{n}__input_zero_point"],
            filter_scales=d[f"{n}__filter_scales"],
            output_scale=d[f"{n}__output_scale"],
            output_zero_point=d[f"{n}__output_zero_point"],
            activation="relu6",
        )
        for rq in ("ruy", "float64"):
            case(
                f"tflite fully_connected per-channel {rq}",
                lambda x, w, b, rq=rq: T.fully_connected(x, w, b, requant=rq, **kw),
                d[f"{n}__input"],
                d[f"{n}__filter"],
                d[f"{n}__bias"],
            )
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (2, 5, 6, 3)).astype(np.int8)
    k = rng.integers(-128, 128, (4, 3, 2, 3)).astype(np.int8)
    case(
        "nvdla conv2d_int8 stride (2,1), explicit padding",
        lambda x, k: nv.conv2d_int8(
            x,
            k,
            stride=(2, 1),
            padding=((1, 0), (1, 1)),
            pad_value=0,
            relu=False,
            cacc_truncate=0,
            bias16=np.zeros(4, np.int32),
            bias_shift=0,
            mul16=np.ones(4, np.int32),
            mul_shift=0,
            out_offset=0,
            out_scale=1,
            out_shift=0,
        )[1],
        x,
        k,
    )
    from hwjax.nvdla import winograd_transform

    g = rng.uniform(-3000, 3000, (1, 2, 3, 3)).astype(np.float16)
    case("nvdla winograd_transform fp16", winograd_transform, g)
    data = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tflm")
    for m in ("add", "mul", "fc_relu_nobias"):
        z = np.load(os.path.join(data, f"{m}.npz"))
        model = T.load(os.path.join(data, f"{m}.tflite"))
        case(f"tflm model {m}", lambda x, model=model: model.run(x, runtime="tflm"), z["x"])
    # XLA's own integer dots, and int_dot's integer route (which widens 8-bit operands on GPU)
    from hwjax import core

    a = rng.integers(-128, 128, (11, 45)).astype(np.int8)
    b = rng.integers(-128, 128, (45, 13)).astype(np.int8)
    dims = (((1,), (0,)), ((), ()))
    for dt in (np.int8, np.int16, np.int32):
        case(
            f"XLA dot_general {np.dtype(dt).name} -> int32",
            lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.int32),
            a.astype(dt),
            b.astype(dt),
        )
    for route in ("int", "float"):
        case(f"core.int_dot route={route}", lambda a, b, r=route: core.int_dot(a, b, dims, route=r), a, b)
        case(f"core.mac route={route}", lambda a, b, r=route: core.mac(np.int32(0), a, b.T, route=r), a, b)
    print("\ndiffering primitives:", sorted(set(_reported)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
