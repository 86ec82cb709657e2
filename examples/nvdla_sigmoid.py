"""Program NVDLA's SDP LUT with a sigmoid, run it exactly, report the error, plot it."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import hwjax.nvdla as nv

IN_SCALE, OUT_SCALE = 2.0**12, 32767.0  # int32 input = x * 2**12, int16 output = y * 32767
cfg, report = nv.program_lut(
    lambda x: 1 / (1 + np.exp(-x)),
    input_scale=IN_SCALE,
    output_scale=OUT_SCALE,
    x_range=(-8.0, 8.0),
    uflow_slope=0.0,
    oflow_slope=0.0,
    return_report=True,
)
print(report)

x = jnp.asarray(np.linspace(-12, 12, 9) * IN_SCALE, jnp.int32)
y, stats = jax.jit(nv.sdp_lut)(x, cfg)
for xi, yi in zip(np.asarray(x), np.asarray(y)):
    print(
        f"x={xi / IN_SCALE:+6.1f}  lut={int(yi):6d}  ({int(yi) / OUT_SCALE:.5f}, "
        f"exact {1 / (1 + np.exp(-xi / IN_SCALE)):.5f})"
    )
print({k: int(v) for k, v in stats.items()})

path = sys.argv[1] if len(sys.argv) > 1 else "sigmoid_lut.png"
nv.plot_lut(
    cfg, lambda x: 1 / (1 + np.exp(-x)), path, input_scale=IN_SCALE, output_scale=OUT_SCALE, x_range=(-10.0, 10.0)
)
print("plot written to", path)
