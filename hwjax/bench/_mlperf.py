"""The MLPerf Tiny part of ``python -m hwjax.bench deployed``: the six published int8
models, hwjax on every runtime against LiteRT on one pinned core, and the time to a first
result in a fresh process.

Per model (``NAME.tflite`` and ``NAME.npz`` of a source checkout's ``tests/data/mlperf``,
``--mlperf-dir``; the xs3 runtime also runs the original file, hwjax compiling it with
xformer's recipe; ``NAME.xc.tflite`` is what xformer itself made of it):

* **inputs**: a batch of random int8 inputs (``--batch``, default 256; seeded per model);
* **exactness first**: every hwjax runtime's output on that batch is compared by equality
  with its live peer's on the same inputs, the interpreter whose arithmetic it reproduces
  (:data:`PEERS`): LiteRT ``BUILTIN_REF`` (reference), ``BUILTIN_WITHOUT_DEFAULT_DELEGATES``
  (optimized), ``AUTO`` (xnnpack; the default XNNPACK delegate), the ``tflite_micro``
  interpreter (tflm), each on the batch-1 file, one invoke per example. The fast peers
  (optimized, xnnpack) run the whole batch; the slow reference kernels (reference, tflm)
  the first ``--check`` examples (default 32). xs3 has no live peer (xcore.ai's kernels):
  not checked on the batch; its first-result output below is compared with the outputs
  xmos' host interpreter gave on the stored inputs (``y_xs3`` of ``NAME.npz``);
* **images/s**: hwjax ``model.run(x, runtime=r)`` on the batch (a device array), warm: the
  program ``Model.run`` compiles with hwjax's XLA options (``hwjax.core.compiler_options``;
  inside a caller's own ``jax.jit`` the caller's options apply);
  LiteRT optimized and XNNPACK, ``num_threads=1``, as a batch-1 loop (one
  set_tensor + invoke + get_tensor per example over the first 64 examples) and, where the
  model allows it, the file resized to the batch (``resize_tensor_input``; a file whose
  resize fails, or whose resized output differs from the loop's, is said so in its row);
  best of interleaved rounds (``--repeats``, fewer where a model's rounds take longer than
  ``--time-budget`` seconds, never under 2), all in this process (pinned to one core by
  the parent), so the ratios come from the same process and the same moments;
* **first result**: a fresh Python process imports hwjax, loads the file and runs 32
  examples (the stored inputs of ``NAME.npz`` repeated; random ones without it), three
  times per runtime: without a persistent compilation cache (``HWJAX_COMPILATION_CACHE=0``,
  ``JAX_ENABLE_COMPILATION_CACHE=false``), then twice with a new cache folder
  (``JAX_COMPILATION_CACHE_DIR``, every program kept: min compile time 0, min entry size
  -1): the first of these fills it (what hwjax's default cache costs the first time), the
  second reads it (a later session: "warm"). The processes inherit the pinning and the
  one-thread XLA flag. By default only on ``reference`` (``Model.run``'s default) and
  ``xs3`` (the slowest to compile): three processes per model and runtime take minutes
  (``--first all`` for every runtime). Reported: load + first run (the issue's measure, what the goals
  are about) and the import before it; the warm process also says how many of its
  compilations JAX answered from the cache. Every output of these processes is compared
  with the peer's on the same inputs as above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = (
    "ad01_int8",
    "kws_ref_model",
    "pretrainedResnet_quant",
    "vww_96_int8",
    "str_ww_ref_model",
    "pretrainedResnet_large_int8",
)
RUNTIMES = ("reference", "optimized", "xnnpack", "tflm", "xs3")
#: the live interpreter whose outputs each hwjax runtime must equal (xs3 has none)
PEERS = {
    "reference": "LiteRT BUILTIN_REF",
    "optimized": "LiteRT BUILTIN_WITHOUT_DEFAULT_DELEGATES",
    "xnnpack": "LiteRT AUTO (XNNPACK)",
    "tflm": "tflite_micro",
}
RESOLVERS = {"reference": "BUILTIN_REF", "optimized": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "xnnpack": "AUTO"}
#: peers fast enough to run on the whole timed batch
FAST_PEERS = ("optimized", "xnnpack")
GOAL_SPEED, GOAL_COLD, GOAL_WARM = 1.0, 2.0, 0.5
LOOP = 64  # examples per timed LiteRT batch-1 loop
FIRST_N = 32  # examples of the first run in a fresh process

_FIRST = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import jax
import hwjax.tflite as T
t1 = time.perf_counter()
n = {"hit": 0, "compiles": 0}
def _event(name, **kw):
    if name == "/jax/compilation_cache/cache_hits":
        n["hit"] += 1
def _duration(name, secs, **kw):
    if name == "/jax/core/compile/backend_compile_duration":
        n["compiles"] += 1
jax.monitoring.register_event_listener(_event)
jax.monitoring.register_event_duration_secs_listener(_duration)
t2 = time.perf_counter()
m = T.load(sys.argv[1])
y = np.asarray(m.run(np.load(sys.argv[2]), runtime=sys.argv[3]))
t3 = time.perf_counter()
np.save(sys.argv[4], y)
print(json.dumps({"import": t1 - t0, "run": t3 - t2, **n}))
"""


def default_dir() -> Path:
    """``tests/data/mlperf`` of the source checkout this hwjax runs from."""
    return Path(__file__).resolve().parents[2] / "tests" / "data" / "mlperf"


# ------------------------------------------------------------------------------ peers


def _litert(model: bytes, resolver: str):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter(
        model_content=model, num_threads=1, experimental_op_resolver_type=getattr(OpResolverType, resolver)
    )


class Loop:
    """A peer on the batch-1 file, one invoke per example (LiteRT with a resolver, or TFLM)."""

    def __init__(self, model: bytes, runtime: str):
        if runtime == "tflm":
            from tflite_micro.python.tflite_micro import runtime as tflm

            it = tflm.Interpreter.from_bytes(model, arena_size=max(1 << 20, 16 * len(model)))

            def one(xi):
                it.set_input(xi, 0)
                it.invoke()
                return np.array(it.get_output(0))

        else:
            it = _litert(model, RESOLVERS[runtime])
            it.allocate_tensors()
            i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

            def one(xi):
                it.set_tensor(i, xi)
                it.invoke()
                return it.get_tensor(o)

        self.one = one

    def __call__(self, x: np.ndarray) -> np.ndarray:
        one = self.one
        return np.concatenate([one(x[k : k + 1]) for k in range(len(x))])


def resized(model: bytes, runtime: str, x: np.ndarray, want: np.ndarray):
    """``(call, note)``: a LiteRT interpreter resized to the batch ``x`` (``call()`` runs
    it on ``x``), or ``(None, why not)`` when the resize fails or its output differs from
    the batch-1 loop's ``want``."""
    try:
        it = _litert(model, RESOLVERS[runtime])
        i, o = it.get_input_details()[0], it.get_output_details()[0]["index"]
        it.resize_tensor_input(i["index"], [len(x), *i["shape"][1:]])
        it.allocate_tensors()
        i = i["index"]
        it.set_tensor(i, x)
        it.invoke()
        y = it.get_tensor(o)
    except Exception as e:  # a refusal is the finding
        msg = str(e).strip().splitlines()[0][:70] if str(e).strip() else ""
        return None, f"cannot be resized ({type(e).__name__}{': ' + msg if msg else ''})"
    if y.shape != want.shape:
        return None, f"cannot be resized (resized output shape {y.shape}, the loop's {want.shape})"
    if not np.array_equal(y, want):
        bad = int((y != want).reshape(len(y), -1).any(axis=1).sum())
        return None, f"cannot be resized (resized output differs from the loop's on {bad} of {len(y)} examples)"

    def call():
        it.set_tensor(i, x)
        it.invoke()
        return it.get_tensor(o)

    return call, ""


def peer_outputs(model: bytes, runtime: str, x: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The peer's outputs on ``x`` (one invoke per example), or ``(None, why not)``."""
    try:
        return Loop(model, runtime)(x), ""
    except ImportError as e:
        return None, f"{PEERS[runtime]} not installed ({e.name})"
    except Exception as e:  # a peer refusing the file is data
        return None, f"{PEERS[runtime]} failed ({type(e).__name__}: {str(e).strip()[:70]})"


def _differ(got: np.ndarray, want: np.ndarray) -> str:
    """'' when equal, else how they differ."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if np.array_equal(got, want):
        return ""
    bad = (got != want).reshape(len(got), -1)
    return f"{int(bad.any(axis=1).sum())} of {len(got)} examples differ ({int(bad.sum())} values)"


# ------------------------------------------------------------------------------ first result


def first_result(path: Path, x: np.ndarray, runtime: str, cache: str | None) -> dict:
    """A fresh process: import hwjax, load ``path``, run ``x`` on ``runtime``; with the
    persistent compilation cache folder ``cache`` (every program kept), or with none.
    Returns ``{"import", "run" (load + first run), "hit", "compiles", "y"}``: ``compiles``
    the programs JAX compiled or read from the cache, ``hit`` those it read."""
    drop = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_ENABLE_COMPILATION_CACHE", "HWJAX_COMPILATION_CACHE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if cache is None:
        env["HWJAX_COMPILATION_CACHE"] = "0"
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
    with tempfile.TemporaryDirectory() as io:
        xp, yp = os.path.join(io, "x.npy"), os.path.join(io, "y.npy")
        np.save(xp, x)
        r = subprocess.run(
            [sys.executable, "-c", _FIRST, str(path), xp, runtime, yp], env=env, capture_output=True, text=True
        )
        if r.returncode:
            raise RuntimeError(f"first-result process failed: {r.stderr.strip().splitlines()[-1:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["y"] = np.load(yp)
    return out


def _first_inputs(npz: Path, shape, dtype, x: np.ndarray) -> tuple[np.ndarray, int, dict]:
    """The inputs of the fresh processes: ``(inputs, distinct, stored)``. The stored
    examples of ``npz`` repeated to 32 (the first ``distinct`` are all there are) and the
    stored outputs that go with them (``{runtime: outputs}``); without them the batch's
    first 32 (all distinct, nothing stored)."""
    if npz.is_file():
        data = np.load(npz)
        xs = data["x"]
        if tuple(xs.shape[1:]) == tuple(shape) and xs.dtype == dtype:
            reps = -(-FIRST_N // len(xs))
            stored = {k[2:]: np.concatenate([data[k]] * reps)[:FIRST_N] for k in data.files if k.startswith("y_")}
            return np.concatenate([xs] * reps)[:FIRST_N], len(xs), stored
    return x[:FIRST_N], len(x[:FIRST_N]), {}


# ------------------------------------------------------------------------------ bench


def _interleaved(fns: dict, repeats: int, min_time: float, budget: float) -> tuple[dict, int]:
    """Best seconds per call of each candidate over up to ``repeats`` interleaved rounds
    (at least 2, or ``repeats`` when smaller; no new round once ``budget`` seconds have
    gone): ``(best, rounds)``."""
    from hwjax.bench._deployed import _sample  # here: _deployed imports this module

    best = {k: float("inf") for k in fns}
    t0, rounds = time.perf_counter(), 0
    while rounds < repeats:
        for k, fn in fns.items():
            best[k] = min(best[k], _sample(fn, min_time))
        rounds += 1
        if rounds >= 2 and time.perf_counter() - t0 > budget:
            break
    return best, rounds


def bench_mlperf(
    folder: Path,
    models,
    runtimes,
    batch: int,
    repeats: int,
    min_time: float,
    first=None,
    *,
    check: int = 32,
    budget: float = 8.0,
    out=print,
):
    """Prints a table per model and a summary; returns ``{model: figures}``. ``first``:
    the runtimes whose first result in a fresh process is measured (None: all of
    ``runtimes``; empty: none)."""
    import jax

    import hwjax.tflite as T

    first = list(runtimes) if first is None else [rt for rt in runtimes if rt in first]
    results: dict = {}
    for index, name in enumerate(models):
        path, npz = folder / f"{name}.tflite", folder / f"{name}.npz"
        if not path.is_file():
            out(f"\n[{name}] not found in {folder.name}/ (a source checkout has it): skipped")
            continue
        model_bytes = path.read_bytes()
        model = T.load(model_bytes)
        info = model.inputs[0]
        shape, dtype = tuple(info.shape[1:]), np.dtype(info.dtype)
        rng = np.random.default_rng(index)
        if dtype.kind in "iu":
            lim = np.iinfo(dtype)
            x = rng.integers(lim.min, lim.max + 1, (batch, *shape)).astype(dtype)
        else:
            x = rng.uniform(-1, 1, (batch, *shape)).astype(dtype)
        xd = jax.device_put(x)
        nl = min(LOOP, batch)

        # the peers' outputs, and LiteRT's timed candidates
        want, why, fns, rows = {}, {}, {}, {}
        n_check = {rt: batch if rt in FAST_PEERS else min(check, batch) for rt in PEERS}
        for rt in [r for r in PEERS if r in runtimes or r in FAST_PEERS]:
            want[rt], why[rt] = peer_outputs(model_bytes, rt, x[: n_check[rt]])
        for rt in FAST_PEERS:
            loop = Loop(model_bytes, rt)
            fns[f"litert {rt} loop"] = (lambda loop=loop: loop(x[:nl]), nl)
            rows[f"litert {rt} loop"] = f"batch-1 file, one invoke per example ({nl} examples)"
            call, note = resized(model_bytes, rt, x, want[rt]) if want[rt] is not None else (None, why[rt])
            if call is None:
                rows[f"litert {rt} batch"] = note
            else:
                fns[f"litert {rt} batch"] = (call, batch)
                rows[f"litert {rt} batch"] = f"resized to {batch}"

        # hwjax: compiled, then checked, before any timing
        exact: dict = {}
        for rt in runtimes:
            t0 = time.perf_counter()
            model.lowered(rt)
            fn = lambda v, rt=rt: model.run(v, runtime=rt)  # the call README shows
            got = np.asarray(fn(xd))
            prep = time.perf_counter() - t0
            if rt not in PEERS:
                exact[rt], note = None, "not checked: no live peer"
            elif want[rt] is None:
                exact[rt], note = None, f"not checked: {why[rt]}"
            else:
                d = _differ(got[: n_check[rt]], want[rt])
                exact[rt] = not d
                of = "all" if n_check[rt] == batch else f"the first {n_check[rt]}"
                note = f"== {PEERS[rt]} on {of} of {batch}" if not d else f"NOT EXACT vs {PEERS[rt]}: {d}"
            fns[f"hwjax {rt}"] = (lambda fn=fn: jax.block_until_ready(fn(xd)), batch)
            rows[f"hwjax {rt}"] = f"{note}; lower + compile + first run {prep:.1f} s"

        best, rounds = _interleaved({k: f for k, (f, _) in fns.items()}, repeats, min_time, budget)
        ips = {k: fns[k][1] / s for k, s in best.items()}
        xnn, opt = ips["litert xnnpack loop"], ips["litert optimized loop"]
        out(
            f"\n[{name}] input {shape} {dtype}, {len(model.graph.nodes)} hwjax nodes; hwjax batch {batch}, "
            f"best of {rounds} interleaved rounds"
        )
        out(f"  {'candidate':22s} {'images/s':>10s} {'/ optim.':>8s} {'/ XNNPACK':>9s}  note")
        for k, note in rows.items():
            if k in ips:
                out(f"  {k:22s} {ips[k]:10,.0f} {ips[k] / opt:7.2f}x {ips[k] / xnn:8.2f}x  {note}")
            else:
                out(f"  {k:22s} {'-':>10s} {'':8s} {'':9s}  {note}")

        # first result in fresh processes
        firsts: dict = {}
        if first:
            xf, distinct, stored = _first_inputs(npz, shape, dtype, x)
            from_batch = not stored and distinct == len(xf)
            out(
                f"  first result, fresh process: load + first run of {len(xf)} examples "
                + ("(the batch's first)" if from_batch else f"({npz.name}'s {distinct} inputs repeated)")
                + ", seconds; import before it"
            )
            out(f"  {'runtime':10s} {'no cache':>8s} {'empty':>7s} {'warm':>6s} {'import':>6s}  output; warm run")
            for rt in first:
                cold = first_result(path, xf, rt, None)
                with tempfile.TemporaryDirectory() as cache:
                    fill = first_result(path, xf, rt, cache)
                    warm = first_result(path, xf, rt, cache)
                ref, tag = None, "no live peer"
                if rt in PEERS:
                    tag = PEERS[rt]
                    if from_batch and want[rt] is not None and len(want[rt]) >= len(xf):
                        ref = want[rt][: len(xf)]
                    else:
                        base, tag = peer_outputs(model_bytes, rt, xf[:distinct])
                        tag = tag or PEERS[rt]
                        if base is not None:
                            ref = np.concatenate([base] * -(-len(xf) // distinct))[: len(xf)]
                elif rt in stored:
                    ref, tag = stored[rt], f"the stored {rt} outputs ({npz.name}; no live peer)"
                if ref is None:
                    ok, note = None, f"not checked ({tag})"
                else:
                    ds = [_differ(r["y"], ref) for r in (cold, fill, warm)]
                    ok = not any(ds)
                    note = f"== {tag} (3 processes)" if ok else f"NOT EXACT vs {tag}: {'; '.join(d for d in ds if d)}"
                exact[f"{rt} first"] = ok
                hits = (
                    f"{warm['hit']} of {warm['compiles']} compilations from the cache"
                    if warm["compiles"]
                    else "no program compiled or read from JAX's cache (hwjax's stored executables)"
                )
                out(
                    f"  {rt:10s} {cold['run']:8.2f} {fill['run']:7.2f} {warm['run']:6.2f} {cold['import']:6.2f}  "
                    f"{note}; {hits}"
                )
                firsts[rt] = {"cold": cold["run"], "fill": fill["run"], "warm": warm["run"], "import": cold["import"]}
        results[name] = {"ips": ips, "exact": exact, "first": firsts, "rounds": rounds}
    _summary(results, runtimes, batch, out)
    return results


def _summary(results, runtimes, batch: int, out=print) -> None:
    if not results:
        return
    out(
        f"\nsummary (MLPerf Tiny, one pinned core): hwjax batch-{batch} images/s / LiteRT XNNPACK batch-1 loop's "
        f"(goal >= {GOAL_SPEED:g}x); first result: load + first run of {FIRST_N} in a fresh process, the slowest "
        f"of the runtimes measured (goal <= {GOAL_COLD:g} s without a cache, <= {GOAL_WARM:g} s warm; import "
        "not counted)"
    )
    out(f"  {'model':28s} " + " ".join(f"{rt:>9s}" for rt in runtimes) + "  speed    no cache       warm cache")
    for name, r in results.items():
        xnn = r["ips"]["litert xnnpack loop"]
        ratios = [r["ips"][f"hwjax {rt}"] / xnn for rt in runtimes]
        met = sum(v >= GOAL_SPEED for v in ratios)
        line = f"  {name:28s} " + " ".join(f"{v:8.2f}x" for v in ratios) + f"  {met}/{len(ratios)} met"
        if r["first"]:
            f = r["first"]
            cold = max(f, key=lambda rt: f[rt]["cold"])
            warm = max(f, key=lambda rt: f[rt]["warm"])
            c, w = f[cold]["cold"], f[warm]["warm"]
            line += (
                f"  {c:5.2f} s {'met' if c <= GOAL_COLD else 'NOT'} ({cold})"
                f"  {w:5.2f} s {'met' if w <= GOAL_WARM else 'NOT'} ({warm})"
            )
        out(line)
    checks = [v for r in results.values() for v in r["exact"].values()]
    ok = all(v is not False for v in checks)
    skipped = sum(v is None for v in checks)
    out(
        f"all hwjax outputs equal to their peer's: {ok} ({len(checks) - skipped} checks"
        + (f"; {skipped} not checked: no peer, see the rows" if skipped else "")
        + ")"
    )
