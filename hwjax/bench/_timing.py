"""Wall-clock timing of jitted functions (compile excluded, results blocked on)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import jax


@dataclass(frozen=True)
class Timing:
    """Best and median seconds per call over ``repeats`` timed calls."""

    best: float
    median: float
    repeats: int


def time_fn(fn: Callable[..., Any], *args: Any, repeats: int = 5, min_time: float = 0.2) -> Timing:
    """Times ``fn(*args)`` after one warm-up call (which compiles).

    Each timed sample repeats the call until ``min_time`` seconds have passed, so short
    calls are not dominated by timer resolution. Returns per-call seconds.
    """
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            jax.block_until_ready(fn(*args))
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        samples.append(dt / n)
    samples.sort()
    return Timing(best=samples[0], median=samples[len(samples) // 2], repeats=repeats)
