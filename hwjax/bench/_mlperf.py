"""The MLPerf Tiny part of ``python -m hwjax.bench deployed``: the six published int8
models, hwjax on every runtime against LiteRT on one pinned core, and the time to a first
result in a fresh process.

Per model (the files of a source checkout's ``tests/data/mlperf``, ``--mlperf-dir``):

* **exactness first**: hwjax on the 8 stored inputs of ``NAME.npz`` against the outputs the
  real runtimes gave (``y_reference`` ... ``y_xs3``; scripts/mlperf_testdata.py made them
  with LiteRT, TFLM and xmos-ai-tools' host interpreter), compared by equality;
* **images/s**: hwjax ``jax.jit(lambda x: model.run(x, runtime=r))`` on a batch of random
  int8 inputs (default 256), warm; LiteRT optimized (BUILTIN_WITHOUT_DEFAULT_DELEGATES) and
  XNNPACK (AUTO), ``num_threads=1``, invoking the batch-1 file once per example (a loop over
  64 examples) and, where the model allows it, the file resized to the batch; best of
  interleaved rounds, all in this process (pinned to one core by the parent);
* **first result**: a fresh Python process imports hwjax, loads the file and runs 32
  examples; once with an empty persistent compilation cache (what a user meets the first
  time) and once more with the cache the first process left (a later session). The
  seconds are from the process's start to the result: import (about 1.5 s), load, trace,
  compile or cache read, run.
"""

from __future__ import annotations

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
GOAL_SPEED, GOAL_COLD, GOAL_WARM = 1.0, 2.0, 0.5

_FIRST = """
import time, sys
t0 = time.perf_counter()
import numpy as np
import hwjax.tflite as T
t1 = time.perf_counter()
m = T.load(sys.argv[1])
x = np.resize(np.load(sys.argv[2])["x"], (32, *m.inputs[0].shape[1:]))
y = np.asarray(m.run(x, runtime=sys.argv[3]))
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def default_dir() -> Path:
    """``tests/data/mlperf`` of the source checkout this hwjax runs from."""
    return Path(__file__).resolve().parents[2] / "tests" / "data" / "mlperf"


def first_result(path: Path, npz: Path, runtime: str, cache: str) -> tuple[float, float, float]:
    """(whole, import, load + first run) seconds of a fresh process with the persistent
    compilation cache folder ``cache``; the whole from before the process starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "HWJAX_"))}
    env["HWJAX_COMPILATION_CACHE"] = cache
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", _FIRST, str(path), str(npz), runtime], env=env, capture_output=True, text=True
    )
    whole = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"first-result process failed: {r.stderr.strip().splitlines()[-1:]}")
    imp, run = (float(v) for v in r.stdout.split())
    return whole, imp, run


def bench_mlperf(folder: Path, models, runtimes, batch: int, repeats: int, min_time: float, first: bool, out=print):
    """Prints a table per model and a summary; returns ``{model: {runtime: figures}}``."""
    import jax

    import hwjax.tflite as T
    from hwjax.bench._deployed import LiteRT, time_interleaved  # here: _deployed imports this module

    results: dict = {}
    for name in models:
        path, npz = folder / f"{name}.tflite", folder / f"{name}.npz"
        if not path.is_file() or not npz.is_file():
            out(f"\n[{name}] not found in {folder.name}/ (a source checkout has it): skipped")
            continue
        data = np.load(npz)
        model_bytes = path.read_bytes()
        model = T.load(model_bytes)
        info = model.inputs[0]
        x = np.random.default_rng(0).integers(-128, 128, (batch, *info.shape[1:])).astype(info.dtype)
        xd = jax.device_put(x)
        out(
            f"\n[{name}] input {tuple(info.shape[1:])} {info.dtype}, {len(model.graph.nodes)} hwjax nodes, batch {batch}"
        )
        fns, row = {}, {}
        for rt in ("optimized", "xnnpack"):
            loop = LiteRT(model_bytes, rt, 1)
            xl = x[:64]
            fns[f"litert {rt} loop"] = (lambda loop=loop, xl=xl: [loop(xl[i : i + 1]) for i in range(len(xl))], len(xl))
            lite = LiteRT(model_bytes, rt, batch)
            if lite.batched:
                fns[f"litert {rt} batch"] = (lambda lite=lite: lite(x), batch)
            else:
                row[f"litert {rt} batch"] = "the file cannot be resized"
        exact: dict = {}
        for rt in runtimes:
            key = f"y_{rt}"
            fn = jax.jit(lambda v, rt=rt: model.run(v, runtime=rt))
            got = np.asarray(model.run(data["x"], runtime=rt))
            exact[rt] = bool(key in data.files and np.array_equal(got, data[key]))
            jax.block_until_ready(fn(xd))  # compiled before timing
            fns[f"hwjax {rt}"] = (lambda fn=fn: jax.block_until_ready(fn(xd)), batch)
        best = time_interleaved({k: f for k, (f, _) in fns.items()}, repeats, min_time)
        ips = {k: fns[k][1] / s for k, s in best.items()}
        xnn = ips["litert xnnpack loop"]
        out(f"  {'candidate':24s} {'images/s':>10s} {'vs XNNPACK':>10s}  note")
        for k in [k for k in fns if k.startswith("litert")] + [k for k in row]:
            if k in ips:
                out(
                    f"  {k:24s} {ips[k]:10,.0f} {ips[k] / xnn:9.2f}x  {'batch-1 file, one invoke per example' if k.endswith('loop') else 'resized to the batch'}"
                )
            else:
                out(f"  {k:24s} {'-':>10s} {'':>10s}  {row[k]}")
        firsts = {}
        for rt in runtimes:
            note = "exact on the stored outputs" if exact[rt] else "NOT EXACT on the stored outputs"
            if first:
                with tempfile.TemporaryDirectory() as cache:
                    cold = first_result(path, npz, rt, cache)
                    warm = first_result(path, npz, rt, cache)
                firsts[rt] = (cold, warm)
                note += f"; first result {cold[2]:.2f} s cold, {warm[2]:.2f} s warm cache (+ import {cold[1]:.1f} s)"
            out(f"  {'hwjax ' + rt:24s} {ips['hwjax ' + rt]:10,.0f} {ips['hwjax ' + rt] / xnn:9.2f}x  {note}")
        results[name] = {"ips": ips, "exact": exact, "first": firsts}
    _summary(results, runtimes, first, out)
    return results


def _summary(results, runtimes, first: bool, out=print) -> None:
    out(
        f"\nsummary (MLPerf Tiny): hwjax images/s / LiteRT XNNPACK's (batch-1 loop), goal >= {GOAL_SPEED:g}x"
        + (
            f"; load + first run in a fresh process, goal <= {GOAL_COLD:g} s cold, <= {GOAL_WARM:g} s warm"
            if first
            else ""
        )
    )
    for name, r in results.items():
        xnn = r["ips"]["litert xnnpack loop"]
        speed = " ".join(f"{rt} {r['ips']['hwjax ' + rt] / xnn:.2f}x" for rt in runtimes)
        out(f"  {name:28s} {speed}")
        if first:
            cold = max(v[0][2] for v in r["first"].values())
            warm = max(v[1][2] for v in r["first"].values())
            out(f"  {'':28s} first result, slowest runtime: {cold:.2f} s cold, {warm:.2f} s warm")
    ok = all(all(r["exact"].values()) for r in results.values())
    out(f"all hwjax outputs equal to the stored runtime outputs: {ok}")
