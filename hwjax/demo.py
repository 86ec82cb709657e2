"""``python -m hwjax.demo``: a short tour that runs real exact computations.

1. The ordered saturating MAC: the same products in two orders give different
   accumulators near the int32 bound, and ``mac`` equals the literal reference.
2. XS3: a batched legacy ``conv2d_deep`` with a channel seeded next to the bound, its
   saturation report, and the host-interpreter variant's disagreement with the chip.
3. NVDLA: a sigmoid programmed into the SDP LUT, its error and counters.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.nvdla as nv
import hwjax.xs3 as xs3
from hwjax.core import mac, mac_reference

M32 = 2**31 - 1


def _mac_demo(rng: np.random.Generator) -> None:
    print("== core.mac: order matters once the accumulator saturates")
    x = np.abs(rng.integers(0, 128, (4, 64))).astype(np.int8)
    w = np.concatenate([np.full((3, 32), 120), np.full((3, 32), -120)], axis=1).astype(np.int8)
    acc0 = np.full((4, 3), M32 - 100_000, np.int32)
    up_first = mac(acc0, x, w, chunk=1)
    down_first = mac(acc0, x, w, chunk=1, order=np.r_[32:64, 0:32])
    ref = mac_reference(acc0, x, w, chunk=1)
    print(f"  positive products first: {np.asarray(up_first)[0].tolist()}")
    print(f"  negative products first: {np.asarray(down_first)[0].tolist()}")
    print(f"  mac == mac_reference: {bool(jnp.array_equal(up_first, ref))}")


def _xs3_demo(rng: np.random.Generator) -> None:
    print("== XS3 conv2d_deep (legacy BSO kernel), batch of 16 images 16x16x32 -> 16 channels")
    x = rng.integers(-128, 128, (16, 16, 16, 32), dtype=np.int8)
    k = rng.integers(-128, 128, (16, 3, 3, 32), dtype=np.int8)
    bias = np.full(16, 1000, np.int32)
    bias[3] = M32 - 200_000
    bso = xs3.make_bso(
        bias, np.full(16, 8), np.full(16, 16384), np.zeros(16, np.int16), np.zeros(16, np.int16), np.full(16, 17)
    )
    geo = dict(zero_point=0, window_start=(-1, -1), window_stride=(1, 1), out_shape=(16, 16))
    run = {
        v: jax.jit(lambda a, v=v: xs3.conv2d_deep(a, k, bso, variant=v, return_stats=True, **geo))
        for v in ("hardware", "host")
    }
    (y_hw, stats), (y_host, _) = run["hardware"](x), run["host"](x)
    t0 = time.perf_counter()
    jax.block_until_ready(run["hardware"](x))
    print(f"  output {y_hw.shape} {y_hw.dtype}, {1e3 * (time.perf_counter() - t0):.1f} ms per batch (jitted)")
    print(f"  accumulator saturations per channel: {np.asarray(stats.acc_saturations).tolist()}")
    print(f"  output clips per channel:            {np.asarray(stats.output_clips).tolist()}")
    diff = int(jnp.sum(y_hw != y_host))
    print(f"  outputs where the host interpreter differs from the chip: {diff}")


def _nvdla_demo() -> None:
    print("== NVDLA SDP LUT programmed with a sigmoid")
    sig = lambda v: 1 / (1 + np.exp(-v))
    cfg, report = nv.program_lut(
        sig,
        input_scale=2.0**12,
        output_scale=32767.0,
        x_range=(-8.0, 8.0),
        uflow_slope=0.0,
        oflow_slope=0.0,
        return_report=True,
    )
    print(
        f"  max error {report.max_abs_lsb:.2f} LSB, mean {report.mean_abs_lsb:.2f} LSB over {report.num_points} points"
    )
    xs = jnp.asarray(np.array([-10.0, -2.0, 0.0, 2.0, 10.0]) * 2.0**12, jnp.int32)
    y, stats = jax.jit(nv.sdp_lut)(xs, cfg)
    print(f"  sdp_lut({[-10, -2, 0, 2, 10]}) = {np.asarray(y).tolist()}  (x 1/32767)")
    print(f"  counters: { {k: int(v) for k, v in stats.items()} }")


def main() -> int:
    rng = np.random.default_rng(0)
    print(f"hwjax demo on {jax.default_backend()} ({jax.devices()[0].device_kind})")
    _mac_demo(rng)
    _xs3_demo(rng)
    _nvdla_demo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
