"""``python -m hwjax.bench deployed``: images/s of whole int8 models, hwjax against LiteRT.

By default the six MLPerf Tiny models (the published acceptance set): every hwjax runtime
(``--runtimes``) against LiteRT's optimized kernels and XNNPACK as a batch-1 loop and
resized to the batch (``--batch``), every output checked against its live peer, and the
time to a first result in a fresh process without a cache and with a warm one
(:mod:`hwjax.bench._mlperf`). ``--models`` picks among them and three synthetic model
shapes, built with :class:`hwjax.tflite.testing.ModelBuilder` (random int8 weights, fixed
seed; ``--models mlp,cnn,deep`` or ``shapes``, ``all`` for both sets), timed at
``--batches``. The shapes:

* ``mlp``: FULLY_CONNECTED 784 -> 512 (relu) -> 256 (relu) -> 10;
* ``cnn``: a small MobileNet-like CNN on 32x32x3: conv 3x3/2 (16, relu6), depthwise 3x3
  (relu6), conv 1x1 (32, relu6), depthwise 3x3/2 (relu6), conv 1x1 (64, relu6), a global
  mean over H, W (MEAN when the importer reads it, else a global AVERAGE_POOL_2D plus a
  RESHAPE: the output says which), FULLY_CONNECTED 64 -> 10;
* ``deep``: six conv 3x3 SAME 32 -> 32 (relu) on 16x16x32, MAX_POOL 2x2/2, RESHAPE,
  FULLY_CONNECTED 2048 -> 10.

For each shape and batch, the same int8 batch runs in

* hwjax: ``model.run(x, runtime=r)`` for ``r`` in ``"optimized"`` and ``"xnnpack"`` (warm:
  compiled before timing, with hwjax's XLA options);
* LiteRT (``ai_edge_litert``): ``Interpreter(num_threads=1)`` with the resolver
  ``BUILTIN_WITHOUT_DEFAULT_DELEGATES`` (builtin optimized kernels) and ``AUTO`` (the
  default XNNPACK delegate); the input is resized to the whole batch
  (``resize_tensor_input`` + ``allocate_tensors``), falling back to one sample per
  ``invoke`` (said in the output) when a model cannot be resized.

Every hwjax output is first compared with LiteRT's on that batch (exact equality); then
the candidates of a (shape, batch) are timed in ``--repeats`` interleaved rounds (each
round one sample of at least ``--min-time`` seconds per candidate; the best sample is
kept), so that load from other processes falls on all of them alike. LiteRT is charged
set_tensor + invoke + get_tensor; hwjax its call on a device array.

Threads: LiteRT runs on one thread. By default the benchmark re-runs itself in a child
process with ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` (set before JAX is
imported), pinned to one CPU (the flag alone left XLA:CPU using both cores of a 2-core VM
at times), so that XLA's CPU kernels also run on one core; ``--jax-threads all`` keeps
XLA's default thread pool and ``--jax-threads both`` prints both.

Experiments for the road to XNNPACK (BENCHMARKS.md): ``--chunk 64`` also times
``Model.run`` mapped over chunks of 64 examples (``jax.lax.map``, one jit);
``--xla-flags=--xla_cpu_use_xnnpack=true`` lets XLA run its dots with XNNPACK;
``--malloc-hugetlb`` backs malloc with transparent huge pages. Each hwjax row also shows
the process's minor page faults per call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from hwjax.bench._mlperf import MODELS as MLPERF_MODELS, RUNTIMES as MLPERF_RUNTIMES, bench_mlperf
from hwjax.bench._mlperf import default_dir as mlperf_dir

_ONE_THREAD_FLAG = "--xla_cpu_multi_thread_eigen=false"
_CHILD_ENV = "HWJAX_BENCH_DEPLOYED_CHILD"


# ------------------------------------------------------------------------------ models


def _conv(mb, rng, x, s_in, in_hw, cin, cout, k, stride, act, depthwise=False):
    from hwjax.litert import conv_geometry
    from hwjax.tflite.testing import ACTIVATION_CODES, random_filter_scales, out_scale_for

    n = cin if depthwise else cout
    w_shape = (1, k, k, n) if depthwise else (n, k, k, cin)
    s_w = random_filter_scales(rng, n, True)
    w = mb.tensor(w_shape, "int8", s_w, np.zeros(n), rng.integers(-127, 128, w_shape), axis=3 if depthwise else 0)
    b = mb.tensor((n,), "int32", (np.float32(s_in) * s_w).astype(np.float32), np.zeros(n), rng.integers(-2000, 2000, n))
    g = conv_geometry(in_hw, (k, k), (stride, stride), "SAME")
    s_out = np.float32(out_scale_for(s_in, s_w, k * k * (1 if depthwise else cin)))
    zp = -128 if act in ("relu", "relu6") else int(rng.integers(-10, 10))
    y = mb.tensor((1, *g.out_hw, n), "int8", s_out, zp)
    opts = {
        "padding": 0,
        "strideH": stride,
        "strideW": stride,
        "fusedActivationFunction": ACTIVATION_CODES[act],
        "dilationHFactor": 1,
        "dilationWFactor": 1,
    }
    if depthwise:
        opts["depthMultiplier"] = 1
        mb.op("DEPTHWISE_CONV_2D", [x, w, b], [y], ("DepthwiseConv2DOptions", opts), 3)
    else:
        mb.op("CONV_2D", [x, w, b], [y], ("Conv2DOptions", opts), 3)
    return y, s_out, g.out_hw


def _fc(mb, rng, x, s_in, n_in, n_out, act, per_channel=False):
    from hwjax.tflite.testing import ACTIVATION_CODES, random_filter_scales, out_scale_for

    s_w = random_filter_scales(rng, n_out, per_channel)
    w = mb.tensor((n_out, n_in), "int8", s_w, np.zeros(s_w.shape), rng.integers(-127, 128, (n_out, n_in)))
    b = mb.tensor(
        (n_out,),
        "int32",
        (np.float32(s_in) * s_w).astype(np.float32),
        np.zeros(s_w.shape),
        rng.integers(-3000, 3000, n_out),
    )
    s_out = np.float32(out_scale_for(s_in, s_w, n_in))
    zp = -128 if act == "relu" else int(rng.integers(-10, 10))
    y = mb.tensor((1, n_out), "int8", s_out, zp)
    mb.op(
        "FULLY_CONNECTED",
        [x, w, b],
        [y],
        ("FullyConnectedOptions", {"fusedActivationFunction": ACTIVATION_CODES[act]}),
        4 if per_channel else 1,
    )
    return y, s_out


def _flatten(mb, x, n):
    q = mb.tensors[x].quantization
    y = mb.tensor((1, n), "int8", q.scale[0], int(q.zeroPoint[0]))
    shape = mb.tensor((2,), "int32", data=np.array([-1, n], np.int32))
    mb.op("RESHAPE", [x, shape], [y], ("ReshapeOptions", {"newShape": [-1, n]}))
    return y


def build_mlp(rng):
    from hwjax.tflite.testing import ModelBuilder

    mb = ModelBuilder()
    s = np.float32(0.02)
    x = mb.tensor((1, 784), "int8", s, -5)
    h, s = _fc(mb, rng, x, s, 784, 512, "relu")
    h, s = _fc(mb, rng, h, s, 512, 256, "relu", per_channel=True)
    y, _ = _fc(mb, rng, h, s, 256, 10, None)
    return mb.finish([x], [y]), (784,), ""


def _has_mean() -> bool:
    import hwjax.tflite

    return "MEAN" in hwjax.tflite.SUPPORTED_OPS


def build_cnn(rng):
    from hwjax.tflite.testing import ModelBuilder

    mb = ModelBuilder()
    s = np.float32(0.03)
    x = mb.tensor((1, 32, 32, 3), "int8", s, 3)
    h, s, hw = _conv(mb, rng, x, s, (32, 32), 3, 16, 3, 2, "relu6")
    h, s, hw = _conv(mb, rng, h, s, hw, 16, 16, 3, 1, "relu6", depthwise=True)
    h, s, hw = _conv(mb, rng, h, s, hw, 16, 32, 1, 1, "relu6")
    h, s, hw = _conv(mb, rng, h, s, hw, 32, 32, 3, 2, "relu6", depthwise=True)
    h, s, hw = _conv(mb, rng, h, s, hw, 32, 64, 1, 1, "relu6")
    if _has_mean():
        s_m = np.float32(s * 0.5)
        m = mb.tensor((1, 64), "int8", s_m, -100)
        axes = mb.tensor((2,), "int32", data=np.array([1, 2], np.int32))
        mb.op("MEAN", [h, axes], [m], ("ReducerOptions", {"keepDims": False}))
        note, s = "global mean: MEAN", s_m
    else:
        q = mb.tensors[h].quantization
        p = mb.tensor((1, 1, 1, 64), "int8", q.scale[0], int(q.zeroPoint[0]))
        mb.op(
            "AVERAGE_POOL_2D",
            [h],
            [p],
            ("Pool2DOptions", {"padding": 1, "strideH": 1, "strideW": 1, "filterHeight": hw[0], "filterWidth": hw[1]}),
        )
        m = _flatten(mb, p, 64)
        note = "global mean: AVERAGE_POOL_2D over 8x8 + RESHAPE (MEAN is not in hwjax.tflite.SUPPORTED_OPS yet)"
    y, _ = _fc(mb, rng, m, s, 64, 10, None)
    return mb.finish([x], [y]), (32, 32, 3), note


def build_deep(rng):
    from hwjax.tflite.testing import ModelBuilder

    mb = ModelBuilder()
    s = np.float32(0.03)
    h = x = mb.tensor((1, 16, 16, 32), "int8", s, -7)
    hw = (16, 16)
    for _ in range(6):
        h, s, hw = _conv(mb, rng, h, s, hw, 32, 32, 3, 1, "relu")
    q = mb.tensors[h].quantization
    p = mb.tensor((1, 8, 8, 32), "int8", q.scale[0], int(q.zeroPoint[0]))
    mb.op(
        "MAX_POOL_2D",
        [h],
        [p],
        ("Pool2DOptions", {"padding": 1, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}),
    )
    f = _flatten(mb, p, 2048)
    y, _ = _fc(mb, rng, f, s, 2048, 10, None)
    return mb.finish([x], [y]), (16, 16, 32), ""


SHAPES = {"mlp": build_mlp, "cnn": build_cnn, "deep": build_deep}
RESOLVER = {"optimized": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "xnnpack": "AUTO"}


# ------------------------------------------------------------------------------ LiteRT


class LiteRT:
    """One LiteRT interpreter (one thread) running whole batches when it can resize."""

    def __init__(self, model: bytes, runtime: str, batch: int):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        self.note = ""
        make = lambda: Interpreter(
            model_content=model,
            num_threads=1,
            experimental_op_resolver_type=getattr(OpResolverType, RESOLVER[runtime]),
        )
        it = make()
        i = it.get_input_details()[0]
        try:
            it.resize_tensor_input(i["index"], [batch, *i["shape"][1:]])
            it.allocate_tensors()
            self.batched = True
        except Exception as e:
            it = make()
            it.allocate_tensors()
            self.batched = False
            self.note = f"per-sample invoke (resize failed: {type(e).__name__})"
        self.it = it
        self.i, self.o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        it = self.it
        if self.batched:
            it.set_tensor(self.i, x)
            it.invoke()
            return it.get_tensor(self.o)
        ys = []
        for xi in x:
            it.set_tensor(self.i, xi[None])
            it.invoke()
            ys.append(it.get_tensor(self.o)[0].copy())
        return np.stack(ys)


def _sample(fn, min_time: float) -> float:
    """Seconds per call of ``fn`` (which blocks on its result) over at least ``min_time``."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return dt / n


def _page_faults(fn, calls: int = 3) -> float:
    """Minor page faults of this process per call of ``fn`` (memory the call maps afresh)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / calls


def time_interleaved(fns: dict, repeats: int, min_time: float = 0.2) -> dict:
    """Best seconds per call of each (warm) candidate over ``repeats`` rounds; each round
    takes one sample of every candidate in turn, so that load from other processes on a
    shared machine falls on all candidates alike."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            best[k] = min(best[k], _sample(fn, min_time))
    return best


# ------------------------------------------------------------------------------ run


def _hwjax_fn(model, runtime):
    model.lowered(runtime)
    return lambda x: model.run(x, runtime=runtime)  # the call README shows: hwjax's compiled program


def _hwjax_chunked_fn(model, runtime, chunk: int):
    """``model.run`` on consecutive chunks of ``chunk`` examples (``jax.lax.map``) in one jit."""
    import jax

    model.lowered(runtime)

    def f(x):
        xs = x.reshape(x.shape[0] // chunk, chunk, *x.shape[1:])
        ys = jax.lax.map(lambda c: model.run(c, runtime=runtime), xs)
        return ys.reshape(x.shape[0], *ys.shape[2:])

    return jax.jit(f)


def bench(shapes, batches, repeats: int, *, out=print, seed: int = 0, min_time: float = 0.2, chunk: int = 0) -> dict:
    """Times every shape at every batch; returns ``{(shape, batch): {candidate: (img/s, exact)}}``
    and prints one table per shape. ``exact`` is None where the candidate did not run."""
    import jax

    import hwjax.tflite as T
    from hwjax.errors import UnsupportedOpError

    results = {}
    for name in shapes:
        model_bytes, in_shape, note = SHAPES[name](np.random.default_rng(seed))
        model = T.load(model_bytes)
        out(f"\n[{name}] input {in_shape}, {len(model.graph.nodes)} hwjax nodes" + (f"; {note}" if note else ""))
        out(f"  {'batch':>5s} {'candidate':22s} {'images/s':>11s} {'exact':>6s}  note")
        for batch in batches:
            x = np.random.default_rng(seed + batch).integers(-128, 128, (batch, *in_shape)).astype(np.int8)
            xd = jax.device_put(x)
            row, fns = {}, {}
            for rt in ("optimized", "xnnpack"):
                lite = LiteRT(model_bytes, rt, batch)
                want = lite(x)
                fns[f"litert {rt}"] = lambda lite=lite: lite(x)
                row[f"litert {rt}"] = [None, None, lite.note]
                try:
                    cands = {f"hwjax {rt}": (_hwjax_fn(model, rt), "")}
                except UnsupportedOpError as e:
                    row[f"hwjax {rt}"] = [None, None, f"not run: {str(e).split(': ', 1)[-1][:90]}"]
                    continue
                if chunk and batch > chunk and batch % chunk == 0:
                    cands[f"hwjax {rt} map{chunk}"] = (
                        _hwjax_chunked_fn(model, rt, chunk),
                        f"lax.map over chunks of {chunk}",
                    )
                for cand, (fn, nt) in cands.items():
                    got = np.asarray(fn(xd))  # compiles; the exactness check comes before any timing
                    exact = bool(got.shape == want.shape and np.array_equal(got, want))
                    row[cand] = [None, exact, nt if exact else f"MISMATCH on {int((got != want).sum())} outputs"]
                    fns[cand] = lambda fn=fn: jax.block_until_ready(fn(xd))
            for cand, sec in time_interleaved(fns, repeats, min_time).items():
                row[cand][0] = batch / sec
                if cand.startswith("hwjax"):
                    row[cand][2] = (
                        row[cand][2] + "; " if row[cand][2] else ""
                    ) + f"{_page_faults(fns[cand]):,.0f} page faults/call"
            for cand, (ips, exact, nt) in row.items():
                ips_s = f"{ips:11,.0f}" if ips is not None else f"{'-':>11s}"
                ex_s = "" if exact is None else str(exact)
                out(f"  {batch:5d} {cand:22s} {ips_s} {ex_s:>6s}  {nt}")
            for rt in ("optimized", "xnnpack"):
                h, lt = row[f"hwjax {rt}"][0], row[f"litert {rt}"][0]
                hopt = row["hwjax optimized"][0]
                if h is not None:
                    hc = row.get(f"hwjax {rt} map{chunk}", (None,))[0]
                    extra = f" (map{chunk}: {hc / lt:.2f}x)" if hc is not None else ""
                    out(f"  {batch:5d} ratio hwjax/LiteRT {rt:9s} {h / lt:6.2f}x{extra}")
                elif hopt is not None:
                    out(
                        f"  {batch:5d} ratio hwjax/LiteRT {rt:9s}    n/a (hwjax optimized / LiteRT {rt}: "
                        f"{hopt / lt:.2f}x)"
                    )
            results[(name, batch)] = row
    return results


def _summary(results, out=print):
    out(
        "\nsummary: hwjax / LiteRT images/s (same runtime arithmetic, same batch; goal >= 1x optimized on every "
        "shape at the largest batch and on the conv shapes at every batch)"
    )
    for (name, batch), row in results.items():
        parts = []
        for rt in ("optimized", "xnnpack"):
            h, lt = row[f"hwjax {rt}"][0], row[f"litert {rt}"][0]
            parts.append(f"{rt} {h / lt:.2f}x" if h is not None else f"{rt} n/a")
        exact = all(v[1] in (None, True) for v in row.values())
        out(f"  {name:5s} batch {batch:5d}: " + ", ".join(parts) + ("" if exact else "  (NOT EXACT)"))


def _idlest_cpu(cpus, seconds: float = 0.5) -> int:
    """The CPU among ``cpus`` that was idle the most over ``seconds`` (``/proc/stat``); the
    lowest-numbered where that cannot be read. On a shared machine other benchmarks pin
    themselves too: taking the idler core keeps two runs off the same one."""

    def idle() -> dict:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *v = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    out[int(name[3:])] = int(v[3]) + int(v[4])  # idle + iowait
        return out

    try:
        a = idle()
        time.sleep(seconds)
        b = idle()
        return max(sorted(cpus), key=lambda c: b.get(c, 0) - a.get(c, 0))
    except (OSError, ValueError, IndexError):
        return min(cpus)


def _one_core() -> None:
    """Pins the calling process (and every thread it starts) to one CPU, the idlest of
    those it may use. The XLA flag alone does not make XLA:CPU single-threaded: with it, a
    2-core VM still showed both cores busy while hwjax ran, and hwjax's figures flipped
    between two modes 2x apart."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {_idlest_cpu(os.sched_getaffinity(0))})


GROUPS = {"mlperf": tuple(MLPERF_MODELS), "shapes": tuple(SHAPES), "all": (*SHAPES, *MLPERF_MODELS)}
QUICK_MODELS = "mlp,cnn,deep,ad01_int8"
#: the runtimes whose first result is measured by default (three fresh processes per model
#: and runtime cost minutes): Model.run's default runtime and the one slowest to compile
FIRST_DEFAULT = "reference,xs3"


def _names(value: str, allowed, groups=None) -> list[str]:
    """A comma-separated list, groups expanded, order kept, 'none' empty; unknown names raise."""
    names: list[str] = []
    for v in (v.strip() for v in value.split(",")):
        if not v or v == "none":
            continue
        for n in (groups or {}).get(v, (v,)):
            if n not in allowed:
                raise ValueError(n)
            if n not in names:
                names.append(n)
    return names


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m hwjax.bench deployed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated models: the MLPerf Tiny ones ("
        + ", ".join(MLPERF_MODELS)
        + f"), the synthetic shapes ({', '.join(SHAPES)}), or the groups mlperf, shapes, all "
        f"(default mlperf; with --quick {QUICK_MODELS})",
    )
    ap.add_argument(
        "--runtimes",
        default=",".join(MLPERF_RUNTIMES),
        help="hwjax runtimes timed on the MLPerf models (default all: " + ",".join(MLPERF_RUNTIMES) + "); the "
        "shapes always time optimized and xnnpack",
    )
    ap.add_argument("--batch", type=int, default=None, help="hwjax's batch on the MLPerf models (default 256)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes of the shapes (default 64,1024)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved timing rounds, the best sample kept (default 5 on the shapes, 3 on the MLPerf models)",
    )
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed sample (default 0.2)")
    ap.add_argument(
        "--time-budget",
        type=float,
        default=8.0,
        help="MLPerf: no new round after this many seconds of a model's timing (never under 2 rounds; default 8)",
    )
    ap.add_argument(
        "--check",
        type=int,
        default=32,
        help="MLPerf: examples of the batch compared with the slow peers (LiteRT BUILTIN_REF, tflite_micro; "
        "default 32); the fast ones (optimized, XNNPACK) run the whole batch",
    )
    ap.add_argument(
        "--first",
        default=None,
        help="MLPerf: runtimes whose first result in a fresh process is measured, three processes each "
        f"(default {FIRST_DEFAULT}: hwjax's default runtime and the slowest to compile; 'all' for every one of "
        "--runtimes; 'none' skips it)",
    )
    ap.add_argument("--no-first-result", action="store_true", help="skip the fresh-process time to the first result")
    ap.add_argument("--mlperf-dir", default=None, help="folder of NAME.tflite + NAME.npz (default tests/data/mlperf)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: models {QUICK_MODELS} unless --models, shapes at batches 8,64, MLPerf batch 16, "
        "first result on xnnpack only, 2 (shapes) / 1 (MLPerf) rounds of 0.05 s",
    )
    ap.add_argument(
        "--jax-threads",
        choices=("1", "all", "both"),
        default="1",
        help="XLA CPU threads: 1 (default: a child process with " + _ONE_THREAD_FLAG + "), all, both",
    )
    ap.add_argument(
        "--xla-flags", default="", help="extra XLA_FLAGS for the one-thread child (e.g. --xla_cpu_use_xnnpack=true)"
    )
    ap.add_argument(
        "--malloc-hugetlb",
        action="store_true",
        help="run the child with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (transparent huge pages for "
        "malloc: fewer page faults on the large buffers XLA maps per call)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="shapes: also time Model.run mapped over chunks of this many examples (lax.map, one jit)",
    )
    args = ap.parse_args(argv)
    try:
        models = _names(args.models or (QUICK_MODELS if args.quick else "mlperf"), GROUPS["all"], GROUPS)
    except ValueError as e:
        ap.error(f"--models: unknown {e}; choose among {list(GROUPS['all'])} or {list(GROUPS)}")
    try:
        runtimes = _names(args.runtimes, MLPERF_RUNTIMES)
    except ValueError as e:
        ap.error(f"--runtimes: unknown {e}; choose among {list(MLPERF_RUNTIMES)}")
    try:
        first = [] if args.no_first_result else _names(args.first, runtimes, {"all": runtimes}) if args.first else None
    except ValueError as e:
        ap.error(f"--first: {e} is not among the runtimes {runtimes}")
    if first is None:  # the default: those of FIRST_DEFAULT (quick: xnnpack) that run, else all (quick: one)
        pref = [r for r in ("xnnpack" if args.quick else FIRST_DEFAULT).split(",") if r in runtimes]
        first = pref or (runtimes[:1] if args.quick else runtimes)
    if args.jax_threads != "all" and os.environ.get(_CHILD_ENV) != "1":
        env = dict(os.environ)
        env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), _ONE_THREAD_FLAG, args.xla_flags) if f)
        env[_CHILD_ENV] = "1"
        if args.malloc_hugetlb:
            env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES", ""), "glibc.malloc.hugetlb=1") if t)
        child_only = ("--jax-threads", "--xla-flags", "--malloc-hugetlb")
        rest = [
            a
            for i, a in enumerate(argv)
            if not a.startswith(child_only) and not (i > 0 and argv[i - 1] in child_only[:2])
        ]
        if args.jax_threads == "both":
            print("=== XLA default threads ===", flush=True)
            rc = main([*rest, "--jax-threads", "all"])
            print("\n=== XLA on one thread ===", flush=True)
        r = subprocess.run(
            [sys.executable, "-m", "hwjax.bench", "deployed", *rest, "--jax-threads", "1"],
            env=env,
            preexec_fn=_one_core,
        )
        return r.returncode if args.jax_threads == "1" else max(rc, r.returncode)

    import jax

    shapes = [m for m in models if m in SHAPES]
    mlperf = [m for m in models if m in MLPERF_MODELS]
    batches = [int(b) for b in (args.batches or ("8,64" if args.quick else "64,1024")).split(",")]
    batch = args.batch or (16 if args.quick else 256)
    min_time = 0.05 if args.quick else args.min_time
    rep_shapes = args.repeats or (2 if args.quick else 5)
    rep_mlperf = args.repeats or (1 if args.quick else 3)
    flags = os.environ.get("XLA_FLAGS", "")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    threads = (
        ("1 thread" if _ONE_THREAD_FLAG in flags else "XLA default thread pool")
        + (f" (XLA_FLAGS={flags})" if flags else "")
        + (f", pinned to CPU {cores[0]}" if cores is not None and len(cores) == 1 else "")
    )
    tun = os.environ.get("GLIBC_TUNABLES", "")
    print(
        f"device: {jax.devices()[0].platform}, {os.cpu_count()} CPUs visible, load average "
        f"{os.getloadavg()[0]:.1f}; LiteRT num_threads=1; JAX: {threads}"
        + (f"; GLIBC_TUNABLES={tun}" if tun else "")
        + (f"; shapes: batches {batches}, best of {rep_shapes} interleaved rounds" if shapes else "")
        + (f"; MLPerf Tiny: batch {batch}, up to {rep_mlperf} interleaved rounds" if mlperf else "")
    )
    t_start = time.perf_counter()
    exact = True
    if shapes:
        results = bench(shapes, batches, rep_shapes, min_time=min_time, chunk=args.chunk)
        _summary(results)
        exact = all(v[1] in (None, True) for row in results.values() for v in row.values())
        print(f"\nall hwjax outputs bit-exact against LiteRT: {exact}")
    if mlperf:
        from pathlib import Path

        folder = Path(args.mlperf_dir) if args.mlperf_dir else mlperf_dir()
        res = bench_mlperf(
            folder,
            mlperf,
            runtimes,
            batch,
            rep_mlperf,
            min_time,
            first,
            check=args.check,
            budget=args.time_budget,
        )
        exact = exact and all(v is not False for r in res.values() for v in r["exact"].values())
    print(f"\n({time.perf_counter() - t_start:.0f} s after JAX's import)")
    return 0 if exact else 1
