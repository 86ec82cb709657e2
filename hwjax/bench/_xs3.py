"""``python -m hwjax.bench xs3``: legacy ``conv2d_deep`` against a plain XLA convolution.

Times, in one run, the jitted batched :func:`hwjax.xs3.conv2d_deep` (ordered saturating
accumulation + BSO output pipeline) and a plain ``jax.lax.conv_general_dilated`` on the
same int8 data with int32 accumulation, prints both and their ratio, and checks that
conv2d_deep equals the plain pipeline (plain convolution + bias, then the same BSO
output stage) bit for bit. The data is certified saturation-free
(:func:`hwjax.xs3.certify_no_saturation`), so the two must agree.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.bench._timing import time_fn
from hwjax.xs3._bso import make_bso, split_bso
from hwjax.xs3._legacy import _bso_output, certify_no_saturation, conv2d_deep

TARGET_RATIO = 3.0


def _data(batch: int, size: int, c_in: int, c_out: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (batch, size, size, c_in), dtype=np.int8)
    kern = rng.integers(-128, 128, (c_out, k, k, c_in), dtype=np.int8)
    bias = rng.integers(-(2**20), 2**20, c_out).astype(np.int32)
    bso = make_bso(bias, np.full(c_out, 6), rng.integers(8000, 30000, c_out),
                   rng.integers(-100, 100, c_out), rng.integers(-100, 100, c_out),
                   np.full(c_out, 20))
    return x, kern, bso


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hwjax.bench xs3", description=__doc__)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=32, help="image height = width")
    p.add_argument("--channels", type=int, default=32, help="C_in = C_out")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    c, ks, zp = args.channels, 3, -3
    x, kern, bso = _data(args.batch, args.size, c, c, ks, args.seed)
    fields = split_bso(bso, c)
    certified = np.asarray(certify_no_saturation(kern, fields.bias, (-128, 127)))
    if not certified.all():
        print("benchmark data is not certified saturation-free")
        return 1
    geometry = dict(window_start=(-1, -1), window_stride=(1, 1), out_shape=(args.size, args.size))
    deep = jax.jit(functools.partial(conv2d_deep, **geometry))

    def plain_acc(x, kern):
        xp = jax.lax.pad(x, jnp.int8(zp), [(0, 0, 0), (1, 1, 0), (1, 1, 0), (0, 0, 0)])
        return jax.lax.conv_general_dilated(
            xp, kern, window_strides=(1, 1), padding="VALID",
            dimension_numbers=("NHWC", "OHWI", "NHWC"), preferred_element_type=jnp.int32)

    plain = jax.jit(plain_acc)

    @jax.jit
    def plain_pipeline(x, kern, bso):
        f = split_bso(bso, c)
        y = _bso_output(plain_acc(x, kern) + f.bias, f, out_bits=8, symmetric=False,
                        variant="hardware")[0]
        return y.astype(jnp.int8)

    xj, kj, zj = jnp.asarray(x), jnp.asarray(kern), jnp.asarray(zp, jnp.int32)
    y_deep = np.asarray(deep(xj, kj, bso, zero_point=zj))
    y_plain = np.asarray(plain_pipeline(xj, kj, bso))
    equal = np.array_equal(y_deep, y_plain)

    t_deep = time_fn(lambda a, b, s: deep(a, b, s, zero_point=zj), xj, kj, bso, repeats=args.repeats)
    t_plain = time_fn(plain, xj, kj, repeats=args.repeats)
    ratio = t_deep.median / t_plain.median
    print(f"xs3 conv2d_deep: {args.batch} images {args.size}x{args.size}x{c}, {c} outputs, "
          f"{ks}x{ks}, padding 1 (device {jax.devices()[0].platform})")
    print(f"  conv2d_deep (jit)           median {t_deep.median * 1e3:9.2f} ms  best {t_deep.best * 1e3:9.2f} ms")
    print(f"  lax.conv_general_dilated    median {t_plain.median * 1e3:9.2f} ms  best {t_plain.best * 1e3:9.2f} ms")
    print(f"  ratio conv2d_deep / plain conv: {ratio:.2f}x (target <= {TARGET_RATIO:.0f}x: "
          f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})")
    print(f"  bit-exact against plain conv + BSO pipeline: {'yes' if equal else 'NO'}")
    return 0 if equal else 1
