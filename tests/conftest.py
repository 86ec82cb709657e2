"""Shared test fixtures: golden vectors (via HWJAX_GOLDEN) and hypothesis profiles.

`pytest --compile-stats` prints, per test file, the number of XLA compilations (compile
requests that missed JAX's in-memory caches: ``requests``; those answered by the
persistent cache: ``cache_hits``; so ``requests - cache_hits`` programs were compiled)
and the seconds they took, then the tests and the functions with the most of them.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import os
import time
from pathlib import Path

# Compile-time settings of the test run, set before JAX creates its CPU backend, and in
# the environment so that subprocess tests inherit them.
# The suite is dominated by XLA compilation of many small programs (eager calls, one
# program per shape and option), not by running them. JAX's "disable most optimizations"
# mode (LLVM optimisation level 0, no expensive LLVM passes) with XLA:CPU's classic
# (non-MLIR) fusion emitters compiles the large integer kernels 3-4x faster. Neither
# changes what a program computes (XLA's HLO passes still run; no fast-math): every
# exact-equality check still holds. `HWJAX_TEST_FAST_COMPILE=0` (used by
# `make test-full`) runs the suite with XLA's default optimisation instead.
FAST_COMPILE = os.environ.get("HWJAX_TEST_FAST_COMPILE", "1") != "0"
if FAST_COMPILE:
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    # XLA:CPU also splits each program's LLVM module into parts compiled on a thread pool;
    # with every core busy (one pytest-xdist worker per core) the parts only add set-up
    # work (the generated code is the same). One part: six test files run with and without it
    # side by side, CPU 205.3 / 197.8 s -> 187.9 / 188.7 s (BENCHMARKS.md).
    _flags = os.environ.get("XLA_FLAGS", "").split()
    for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"):
        if not any(f.startswith(_flag.split("=")[0]) for f in _flags):
            _flags.append(_flag)
    os.environ["XLA_FLAGS"] = " ".join(_flags)

# Four virtual CPU devices, so that the sharding tests run in-process (a mesh over them);
# everything else runs on the first device, as without the flag.
_flags = os.environ.get("XLA_FLAGS", "").split()
if not any(f.startswith("--xla_force_host_platform_device_count") for f in _flags):
    os.environ["XLA_FLAGS"] = " ".join(_flags + ["--xla_force_host_platform_device_count=4"])

# A persistent compilation cache (git-ignored .jax_cache/ at the repository root, or
# $HWJAX_TEST_JAX_CACHE; "0" disables it): programs compiled by another pytest-xdist
# worker, a subprocess test or an earlier run are loaded instead of compiled again. Every
# program is cached, however fast it compiled: most of the suite's take well under 1 s.
_CACHE = os.environ.get("HWJAX_TEST_JAX_CACHE", str(Path(__file__).resolve().parents[1] / ".jax_cache"))
if _CACHE == "0":  # nor hwjax's default cache in the user's cache folder
    os.environ.setdefault("HWJAX_COMPILATION_CACHE", "0")
else:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# (In case JAX was imported before this file read the environment.)
if FAST_COMPILE:
    jax.config.update("jax_disable_most_optimizations", True)

if _CACHE != "0":
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _share_one_mlir_context() -> None:
    """Lower every program in one MLIR context instead of a fresh one per program.

    JAX builds a new MLIR context (every dialect loaded again) for each program it lowers,
    and drops it afterwards: about a quarter of the lowering time of this suite's programs,
    and contexts pile up until Python's collector frees them. Programs lowered in a shared
    context are the same modules (a context only interns types and attributes), so the
    compiled programs and every result are unchanged. Measured on tests/test_nn.py
    (`-n 0`, cold cache): 47.7-50.0 s -> 44.4-45.0 s, peak memory 1.2 GB -> 0.6 GB.

    This replaces a private JAX function, so it is confined to the fast-compile test run:
    `make test-full` (``HWJAX_TEST_FAST_COMPILE=0``) lowers with JAX as it ships, and
    ``HWJAX_TEST_SHARED_MLIR_CONTEXT=0`` turns it off. If JAX renames the function, it is
    left alone.
    """
    from jax._src.interpreters import mlir

    make = getattr(mlir, "make_ir_context", None)
    if make is None or getattr(make, "_hwjax_shared", False):
        return
    shared = functools.cache(make)  # made on the first call, then returned again
    shared._hwjax_shared = True
    mlir.make_ir_context = shared


if FAST_COMPILE and os.environ.get("HWJAX_TEST_SHARED_MLIR_CONTEXT", "1") != "0":
    _share_one_mlir_context()


settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

GOLDEN_ROOT = Path(
    os.environ.get("HWJAX_GOLDEN", Path(__file__).resolve().parents[1] / ".." / "shared" / "golden")
).resolve()


def golden_path(*parts: str) -> Path:
    """Path of a golden file; skips the test with a clear message when it is absent."""
    p = GOLDEN_ROOT.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"golden vectors not found at {p} (set HWJAX_GOLDEN to the golden folder)")
    return p


_RNG_STATES: dict = {}


@pytest.fixture(autouse=True)
def _module_rng_from_its_start(request):
    """A test module's shared ``RNG`` (a NumPy Generator) starts every test where it stood
    before the module's first test, so a test draws the same inputs whichever tests of its
    module ran before it in its process (pytest-xdist hands a worker a varying subset)."""
    rng = getattr(request.module, "RNG", None)
    if isinstance(rng, np.random.Generator):
        state = _RNG_STATES.setdefault(request.module.__name__, copy.deepcopy(rng.bit_generator.state))
        rng.bit_generator.state = copy.deepcopy(state)


@pytest.fixture
def xs3_recipe_batches(monkeypatch):
    """A list that records, for every call to the XS3 target's batched parameter recipe
    (``otfn_params_many``, what ``OpImpl.params_many`` runs), how many layers it derived."""
    import hwjax.targets._xs3 as X

    batches = []
    many = X.otfn_params_many
    monkeypatch.setattr(X, "otfn_params_many", lambda layers: batches.append(len(layers)) or many(layers))
    return batches


# ---------------------------------------------------------------- compile statistics
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
#: the three stages of making a program, as jax.monitoring reports them (a trace nested in
#: another's is reported too, so trace seconds may count twice)
_STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": 0,
    "/jax/core/compile/jaxpr_to_mlir_module_duration": 1,
    _COMPILE_EVENT: 2,
}
_stats = {"file": None, "test": None}
_per_file = collections.defaultdict(lambda: [0, 0.0, 0, 0.0, 0.0, 0.0])  # compiles, secs, hits, wall, trace, lower
_per_test = collections.Counter()
_per_name = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # function name: compiles, compile, trace, lower s


def pytest_addoption(parser):
    parser.addoption(
        "--compile-stats",
        action="store_true",
        default=False,
        help="report XLA compilations (and trace/lowering time) per test file and the top tests "
        "and functions (use with -n 0: the workers' numbers are not collected)",
    )


def _on_duration(event, secs, **kw):
    stage = _STAGES.get(event)
    if stage is None or _stats["file"] is None:
        return
    rec, name = _per_file[_stats["file"]], _per_name[str(kw.get("fun_name", "?"))]
    if stage == 2:
        rec[0] += 1
        rec[1] += secs
        _per_test[_stats["test"]] += 1
        name[0] += 1
        name[1] += secs
    else:
        rec[4 + stage] += secs
        name[1 + stage] += secs


def _on_event(event, **kw):
    if event == _CACHE_HIT_EVENT and _stats["file"] is not None:
        _per_file[_stats["file"]][2] += 1


# Python's cyclic garbage collector: JAX's tracing and lowering allocate many short-lived
# objects, so with the default thresholds (700, 10, 10) full collections rescan everything
# that JAX, Flax and the test modules hold, again and again (4-5% of the suite's CPU time
# under `perf`). Objects alive after collection are frozen (never rescanned) and the
# thresholds raised; cycles are still collected. test_nn.py alone: 48-50 s -> 45-47 s.
_GC_THRESHOLDS = (200_000, 50, 1_000)


def _freeze_live_objects():
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _freeze_live_objects()


def pytest_configure(config):
    _freeze_live_objects()
    gc.set_threshold(*_GC_THRESHOLDS)
    if config.getoption("--compile-stats"):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _stats["file"] = item.location[0]
    _stats["test"] = item.nodeid
    t0 = time.perf_counter()
    yield
    _per_file[item.location[0]][3] += time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--compile-stats"):
        return
    tr = terminalreporter
    tr.section("XLA compilations per test file")
    tot = [0] * 6
    for f, rec in sorted(_per_file.items(), key=lambda kv: -kv[1][3]):
        n, s, hits, wall, tr_s, lo_s = rec
        tr.write_line(
            f"{f:40s} requests={n:5d} cache_hits={hits:5d} trace_s={tr_s:6.1f} lower_s={lo_s:6.1f} "
            f"compile_s={s:6.1f} wall_s={wall:6.1f}"
        )
        tot = [a + b for a, b in zip(tot, rec)]
    n, s, hits, wall, tr_s, lo_s = tot
    tr.write_line(
        f"{'total':40s} requests={n:5d} cache_hits={hits:5d} trace_s={tr_s:6.1f} lower_s={lo_s:6.1f} "
        f"compile_s={s:6.1f} wall_s={wall:6.1f}"
    )
    tr.section("tests with the most compilations")
    for nodeid, n in _per_test.most_common(25):
        tr.write_line(f"{n:5d}  {nodeid}")
    tr.section("functions with the most trace + lowering + compile time")
    for name, (n, secs, tr_s, lo_s) in sorted(_per_name.items(), key=lambda kv: -sum(kv[1][1:]))[:40]:
        tr.write_line(f"{n:5d} compiles {secs:7.1f}s  trace {tr_s:6.1f}s  lower {lo_s:6.1f}s  {name}")


# ------------------------------------------------------------ scheduling of test files
# Seconds each file's tests took on a cold cache (2-core VM, 2026-11-29, two xdist workers). Files
# are handed to the workers heaviest first (longest processing time first), so that no
# worker ends the run alone on a heavy file; `make test` passes --no-loadscope-reorder so
# that pytest-xdist keeps this order instead of sorting files by their number of tests.
# Files not listed (new or light ones) come last, in collection order. Only the order
# changes: every test still runs.
_FILE_SECONDS = {
    "test_mlperf": 103,
    "test_random_graphs": 70,
    "test_nn": 68,
    "test_xs3_current": 67,
    "test_graph": 58,
    "test_xs3_grad": 40,
    "test_nvdla_lut": 39,
    "test_gemmlowp_target": 37,
    "test_core_mac": 37,
    "test_compilation_cache": 36,
    "test_bad_input_nvdla": 35,
    "test_gemmlowp_lt8": 32,
    "test_nn_tflite_layers": 30,
    "test_nvdla_program": 28,
    "test_onnx": 26,
    "test_onnx_finetune": 50,
    "test_finetune": 26,
    "test_bad_input_xs3": 25,
    "test_export": 25,
    "test_tflite_keras_mcu": 24,
    "test_nvdla_layers": 24,
    "test_tflite_keras": 23,
    "test_fuzz_models": 23,
    "test_xs3_legacy": 22,
    "test_nvdla_formats": 21,
    "test_tflite_tflm": 21,
    "test_bad_input_kernels": 20,
    "test_tflite_models": 20,
    "test_tflite_nonlinear": 17,
    "test_nvdla_cvt": 16,
    "test_random_graph_regressions": 16,
    "test_tflite_save_xcore": 15,
    "test_tflite_cli": 15,
    "test_core_ops": 15,
    "test_onnx_cpus": 14,
    "test_tflite_xnnpack": 13,
    "test_evaluate": 13,
    "test_tflite_xcore": 13,
    "test_xs3_vpu": 13,
    "test_gemmlowp": 12,
    "test_tflite_save": 10,
    "test_tflite_xformer_act": 10,
    "test_checked": 10,
    "test_tflite_tensor_ops": 9,
    "test_tflite_arith": 8,
    "test_tflite_dilation": 7,
    "test_tflite_float_io": 6,
    "test_bad_input": 6,
    "test_core_geometry": 6,
    "test_bench_deployed": 5,
    "test_tflite_save_ops": 5,
    "test_bench_onnx": 4,
}


def pytest_collection_modifyitems(session, config, items):
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.location[0], i)
    items.sort(key=lambda it: (-_FILE_SECONDS.get(os.path.basename(it.location[0])[:-3], 0), first[it.location[0]]))
