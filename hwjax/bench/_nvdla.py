"""``python -m hwjax.bench nvdla``: the exact SDP LUT against ``jnp.interp`` on one table.

Both run jitted on the same int32 inputs (default 10**7 elements spread over the whole
table range plus under/overflow margins). ``jnp.interp`` interpolates the LO table in
float32 (no LE table, no priorities, no exact rounding): it is the plain-XLA baseline.
Target: the exact LUT within 4x of it.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.bench._timing import time_fn
from hwjax.nvdla import LO_DEPTH, sdp_lut, sigmoid_lut

TARGET_RATIO = 4.0


def _inputs(cfg, n: int, seed: int) -> jax.Array:
    span = cfg.lo_end - cfg.lo_start
    lo, hi = cfg.lo_start - span // 4, cfg.lo_end + span // 4
    return jnp.asarray(np.random.default_rng(seed).integers(lo, hi, n, dtype=np.int64).astype(np.int32))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hwjax.bench nvdla", description=__doc__)
    ap.add_argument("--n", type=int, default=10**7, help="number of int32 elements")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    cfg = sigmoid_lut()
    x = _inputs(cfg, args.n, args.seed)
    xp = jnp.asarray(cfg.lo_start + np.arange(LO_DEPTH, dtype=np.float64) * 2.0**cfg.lo_index_select, jnp.float32)
    fp = jnp.asarray(cfg.lo_table, jnp.float32)

    exact = jax.jit(lambda v: sdp_lut(v, cfg))
    interp = jax.jit(lambda v: jnp.interp(v.astype(jnp.float32), xp, fp))
    t_exact = time_fn(exact, x, repeats=args.repeats)
    t_interp = time_fn(interp, x, repeats=args.repeats)
    ratio = t_exact.best / t_interp.best
    print(f"device: {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), n = {args.n}")
    for name, t in (("sdp_lut (exact, jit)", t_exact), ("jnp.interp (LO, f32)", t_interp)):
        print(f"{name:22s}  best {t.best * 1e3:9.2f} ms   median {t.median * 1e3:9.2f} ms")
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    print(f"ratio sdp_lut / jnp.interp = {ratio:.2f}x ({verdict} the {TARGET_RATIO:.0f}x target)")
    return 0
