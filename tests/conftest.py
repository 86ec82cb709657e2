"""Shared test fixtures: golden vectors (via HWJAX_GOLDEN) and hypothesis profiles."""

from __future__ import annotations

import os
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
