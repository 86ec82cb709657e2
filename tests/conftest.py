"""Shared test fixtures: golden vectors (via HWJAX_GOLDEN) and hypothesis profiles.

`pytest --compile-stats` prints, per test file, the number of XLA compilations
(backend compiles, persistent-cache hits excluded) and the seconds they took.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

GOLDEN_ROOT = Path(os.environ.get("HWJAX_GOLDEN", Path(__file__).resolve().parents[1] / ".." / "shared" / "golden")).resolve()


def golden_path(*parts: str) -> Path:
    """Path of a golden file; skips the test with a clear message when it is absent."""
    p = GOLDEN_ROOT.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"golden vectors not found at {p} (set HWJAX_GOLDEN to the golden folder)")
    return p


# ---------------------------------------------------------------- compile statistics
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_stats = {"file": None, "test": None}
_per_file = collections.defaultdict(lambda: [0, 0.0, 0, 0.0])  # compiles, secs, cache hits, wall
_per_test = collections.Counter()


def pytest_addoption(parser):
    parser.addoption("--compile-stats", action="store_true", default=False,
                     help="report XLA compilations per test file and the top tests by compile count")


def _on_duration(event, secs, **kw):
    if event == _COMPILE_EVENT and _stats["file"] is not None:
        rec = _per_file[_stats["file"]]
        rec[0] += 1
        rec[1] += secs
        _per_test[_stats["test"]] += 1


def _on_event(event, **kw):
    if event == _CACHE_HIT_EVENT and _stats["file"] is not None:
        _per_file[_stats["file"]][2] += 1


def pytest_configure(config):
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
    tot = [0, 0.0, 0, 0.0]
    for f, (n, s, hits, wall) in sorted(_per_file.items()):
        tr.write_line(f"{f:40s} compiles={n:5d} compile_s={s:7.1f} cache_hits={hits:5d} wall_s={wall:7.1f}")
        tot = [tot[0] + n, tot[1] + s, tot[2] + hits, tot[3] + wall]
    tr.write_line(f"{'total':40s} compiles={tot[0]:5d} compile_s={tot[1]:7.1f} cache_hits={tot[2]:5d} wall_s={tot[3]:7.1f}")
    tr.section("tests with the most compilations")
    for nodeid, n in _per_test.most_common(25):
        tr.write_line(f"{n:5d}  {nodeid}")
