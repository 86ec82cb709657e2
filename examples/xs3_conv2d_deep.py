"""A legacy XS3 conv2d_deep call with a saturation report (the README's example)."""

import jax
import numpy as np

import hwjax.xs3 as xs3

rng = np.random.default_rng(0)
x = rng.integers(-128, 128, (8, 16, 16, 32), dtype=np.int8)  # batch of 8 HWC images
k = rng.integers(-128, 128, (16, 3, 3, 32), dtype=np.int8)  # OHWI kernel
bias = np.full(16, 1000, np.int32)
bias[3] = 2**31 - 1 - 200_000  # a channel seeded next to the int32 bound
bso = xs3.make_bso(
    bias,
    shift1=np.full(16, 8),
    scale=np.full(16, 16384),
    offset_scale=np.zeros(16, np.int16),
    offset=np.zeros(16, np.int16),
    shift2=np.full(16, 17),
)

conv = jax.jit(
    lambda x: xs3.conv2d_deep(
        x,
        k,
        bso,
        zero_point=0,
        window_start=(-1, -1),
        window_stride=(1, 1),
        out_shape=(16, 16),
        variant="hardware",
        return_stats=True,
    )
)
y, stats = conv(x)
print("output", y.shape, y.dtype)
print(
    "channels certified saturation-free:",
    np.flatnonzero(np.asarray(xs3.certify_no_saturation(k, bias, (-128, 127)))).tolist(),
)
print("accumulator saturations per channel:", np.asarray(stats.acc_saturations).tolist())
print("shift1 clips per channel:           ", np.asarray(stats.shift1_clips).tolist())
print("output clips per channel:           ", np.asarray(stats.output_clips).tolist())
