"""``python -m hwjax.bench xs3``: XS3 convolutions against the fastest plain XLA paths.

Two sections, each timing its candidates in the same run:

``conv2d`` (current API, :func:`hwjax.xs3.conv2d`: im2col + ``mat_mul_generic_int8``
chunks + ``otfn_int8``): 12x12x32 images, 32 output channels, 3x3, padding 1 with a
pad value of -5, for a single image and a batch of 64. The baselines compute the same
int32 accumulators with plain XLA: (a) an int8 ``lax.conv_general_dilated`` with int32
accumulation on the image padded with the pad value, (b) the same convolution in
float32 at ``precision=HIGHEST`` (included only where it is provably exact: every
partial sum is an integer of magnitude <= K * 2**14 < 2**24, K = 3*3*32), (c)
:func:`hwjax.core.extract_patches` + one int8 ``dot_general``. Printed: every time,
the fastest baseline, and conv2d's speed relative to it (``t_fastest / t_conv2d``,
target >= 0.5x). Every baseline's accumulators must equal conv2d's
(``return_accumulators=True``) and conv2d's output must equal ``otfn_int8`` of them.

``deep`` (legacy :func:`hwjax.xs3.conv2d_deep`): 64 images of 32x32x32, 32 outputs,
3x3, padding 1, data certified saturation-free (:func:`hwjax.xs3.certify_no_saturation`),
against the plain int8 convolution; bit-exact against plain convolution + bias + the
same BSO output stage.

Timing: the candidates of a section are timed in interleaved rounds (``--repeats``),
each round one :func:`hwjax.bench.time_fn` sample per candidate; best and median over
the rounds are printed; the ratios use the best times (conv2d also prints the ratio of
the medians).
"""

from __future__ import annotations

import argparse
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.bench._timing import time_fn
from hwjax.core import ConvGeometry, extract_patches
from hwjax.xs3 import bso_output, certify_no_saturation, conv2d, conv2d_deep, make_bso, otfn_int8, split_bso

TARGET_RATIO = 3.0  # conv2d_deep / plain conv, at most
TARGET_SPEED = 0.5  # conv2d speed / fastest plain path, at least
_DN = ("NHWC", "OHWI", "NHWC")


def _timed_rounds(fns: dict[str, tuple[Callable, tuple]], repeats: int, min_time: float):
    """Best and median seconds per call of every candidate, timed in interleaved rounds."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, args) in fns.items():
            samples[name].append(time_fn(fn, *args, repeats=1, min_time=min_time).best)
    return {name: (min(v), sorted(v)[len(v) // 2]) for name, v in samples.items()}


# ------------------------------------------------------------------ current conv2d


def _conv2d_section(
    batches: list[int], size: int, c_in: int, c_out: int, k: int, pad_value: int, repeats: int, seed: int
) -> bool:
    rng = np.random.default_rng(seed)
    kern = jnp.asarray(rng.integers(-128, 128, (c_out, k, k, c_in)), jnp.int8)
    mul = jnp.asarray(rng.integers(2000, 16000, c_out), jnp.int16)
    bias = jnp.asarray(rng.integers(-200, 200, c_out), jnp.int16)
    pad = k // 2
    geom = ConvGeometry.make((size, size), (k, k), (1, 1), pad)
    big_k = k * k * c_in
    f32_exact = big_k * 2**14 < 2**24  # |every partial sum| <= K * 128 * 128
    shifts = dict(initial_shift=0, final_shr=8)

    def padded(x, pv):
        return jax.lax.pad(x, pv.astype(x.dtype), [(0, 0, 0), (pad, pad, 0), (pad, pad, 0), (0, 0, 0)])

    def int8_conv(x, kern, pv):
        return jax.lax.conv_general_dilated(
            padded(x, pv), kern, (1, 1), "VALID", dimension_numbers=_DN, preferred_element_type=jnp.int32
        )

    def f32_conv(x, kern, pv):
        y = jax.lax.conv_general_dilated(
            padded(x, pv).astype(jnp.float32),
            kern.astype(jnp.float32),
            (1, 1),
            "VALID",
            dimension_numbers=_DN,
            precision=jax.lax.Precision.HIGHEST,
        )
        return y.astype(jnp.int32)

    def patches_dot(x, kern, pv):
        p = extract_patches(x, geom, pad_value=pv)
        return jax.lax.dot_general(
            p, kern.reshape(c_out, -1), (((3,), (1,)), ((), ())), preferred_element_type=jnp.int32
        )

    baselines = {"int8 lax.conv_general_dilated": int8_conv, "extract_patches + int8 dot": patches_dot}
    if f32_exact:
        baselines["float32 conv (HIGHEST, exact)"] = f32_conv
    baselines = {name: jax.jit(f) for name, f in baselines.items()}
    run = functools.partial(
        conv2d, multipliers=mul, biases=bias, stride=(1, 1), pad_top_left=(pad, pad), out_shape=(size, size), **shifts
    )
    xs3_conv = jax.jit(lambda x, kern, pv: run(x, kern, pad_value=pv))
    xs3_both = jax.jit(lambda x, kern, pv: run(x, kern, pad_value=pv, return_accumulators=True))

    ok = True
    print(
        f"xs3 conv2d: {size}x{size}x{c_in} -> {c_out}, {k}x{k}, padding {pad}, pad value {pad_value} "
        f"(K = {big_k}; device {jax.devices()[0].platform})"
    )
    for b in batches:
        x = jnp.asarray(rng.integers(-128, 128, (b, size, size, c_in)), jnp.int8)
        pv = jnp.asarray(pad_value, jnp.int32)
        y, acc = xs3_both(x, kern, pv)
        # the reference accumulators: the integer patches dot on the CPU (the test suite's ground)
        cpu = jax.devices("cpu")[0]
        want = np.asarray(baselines["extract_patches + int8 dot"](*jax.device_put((x, kern, pv), cpu)))
        exact = bool(np.array_equal(np.asarray(y), np.asarray(otfn_int8(acc, mul, bias, **shifts))))
        exact &= bool(np.array_equal(np.asarray(acc), want))
        usable = {}
        for n, f in baselines.items():  # a baseline this backend cannot run, or runs inexactly, is left out
            try:
                same = np.array_equal(np.asarray(f(x, kern, pv)), want)
            except Exception as e:
                print(f"    baseline {n}: not available on {jax.default_backend()} ({type(e).__name__})")
                continue
            if not same:
                print(f"    baseline {n}: NOT exact on {jax.default_backend()} (left out of the comparison)")
                continue
            usable[n] = f
        cands = {**{n: (f, (x, kern, pv)) for n, f in usable.items()}, "xs3.conv2d (jit)": (xs3_conv, (x, kern, pv))}
        t = _timed_rounds(cands, repeats, 0.1)
        fastest = min(usable, key=lambda n: t[n][0])
        speed = t[fastest][0] / t["xs3.conv2d (jit)"][0]
        speed_med = min(t[n][1] for n in usable) / t["xs3.conv2d (jit)"][1]
        print(f"  batch {b}:")
        for n, (best, med) in t.items():
            print(f"    {n:<32} best {best * 1e3:8.3f} ms  median {med * 1e3:8.3f} ms")
        print(
            f"    speed of conv2d relative to the fastest plain path ({fastest}): {speed:.2f}x "
            f"(target >= {TARGET_SPEED}x: {'met' if speed >= TARGET_SPEED else 'NOT met'}); "
            f"from the medians: {speed_med:.2f}x"
        )
        print(
            f"    accumulators equal to the CPU integer reference, output = otfn_int8(acc): {'yes' if exact else 'NO'}"
        )
        ok &= exact
    return ok


# -------------------------------------------------------------- legacy conv2d_deep


def _data(batch: int, size: int, c_in: int, c_out: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (batch, size, size, c_in), dtype=np.int8)
    kern = rng.integers(-128, 128, (c_out, k, k, c_in), dtype=np.int8)
    bias = rng.integers(-(2**20), 2**20, c_out).astype(np.int32)
    bso = make_bso(
        bias,
        np.full(c_out, 6),
        rng.integers(8000, 30000, c_out),
        rng.integers(-100, 100, c_out),
        rng.integers(-100, 100, c_out),
        np.full(c_out, 20),
    )
    return x, kern, bso


def _deep_section(batch: int, size: int, c: int, repeats: int, seed: int) -> bool:
    ks, zp = 3, -3
    x, kern, bso = _data(batch, size, c, c, ks, seed)
    fields = split_bso(bso, c)
    certified = np.asarray(certify_no_saturation(kern, fields.bias, (-128, 127)))
    if not certified.all():
        print("benchmark data is not certified saturation-free")
        return False
    geometry = dict(window_start=(-1, -1), window_stride=(1, 1), out_shape=(size, size))
    deep = jax.jit(functools.partial(conv2d_deep, **geometry))

    on_gpu = jax.default_backend() == "gpu"  # cuDNN has no int8 -> int32 convolution

    def plain_acc(x, kern):
        xp = jax.lax.pad(x, jnp.int8(zp), [(0, 0, 0), (1, 1, 0), (1, 1, 0), (0, 0, 0)])
        if on_gpu:  # float32 at HIGHEST: exact, every partial sum below 9 * c * 2**14 < 2**24
            assert ks * ks * c * 2**14 < 2**24
            return jax.lax.conv_general_dilated(
                xp.astype(jnp.float32),
                kern.astype(jnp.float32),
                (1, 1),
                "VALID",
                dimension_numbers=_DN,
                precision=jax.lax.Precision.HIGHEST,
            ).astype(jnp.int32)
        return jax.lax.conv_general_dilated(
            xp, kern, window_strides=(1, 1), padding="VALID", dimension_numbers=_DN, preferred_element_type=jnp.int32
        )

    plain = jax.jit(plain_acc)

    @jax.jit
    def plain_pipeline(x, kern, bso):
        f = split_bso(bso, c)
        y = bso_output(plain_acc(x, kern) + f.bias, f, out_bits=8, symmetric=False, variant="hardware")[0]
        return y.astype(jnp.int8)

    xj, kj, zj = jnp.asarray(x), jnp.asarray(kern), jnp.asarray(zp, jnp.int32)
    y_deep = np.asarray(deep(xj, kj, bso, zero_point=zj))
    y_plain = np.asarray(plain_pipeline(xj, kj, bso))
    equal = np.array_equal(y_deep, y_plain)

    t = _timed_rounds(
        {
            "conv2d_deep (jit)": (lambda a, b, s: deep(a, b, s, zero_point=zj), (xj, kj, bso)),
            "lax.conv_general_dilated": (plain, (xj, kj)),
        },
        repeats,
        0.2,
    )
    ratio = t["conv2d_deep (jit)"][0] / t["lax.conv_general_dilated"][0]
    print(
        f"xs3 conv2d_deep: {batch} images {size}x{size}x{c}, {c} outputs, "
        f"{ks}x{ks}, padding 1 (device {jax.devices()[0].platform})"
    )
    for n, (best, med) in t.items():
        print(f"  {n:<27} median {med * 1e3:9.2f} ms  best {best * 1e3:9.2f} ms")
    print(
        f"  ratio conv2d_deep / plain conv: {ratio:.2f}x (target <= {TARGET_RATIO:.0f}x: "
        f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})"
    )
    print(f"  bit-exact against plain conv + BSO pipeline: {'yes' if equal else 'NO'}")
    return equal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hwjax.bench xs3", description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("conv2d", "deep"), help="run one section (default: both)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="conv2d batch sizes")
    p.add_argument("--conv-size", type=int, default=12, help="conv2d image height = width")
    p.add_argument("--batch", type=int, default=64, help="conv2d_deep batch")
    p.add_argument("--size", type=int, default=32, help="conv2d_deep image height = width")
    p.add_argument("--channels", type=int, default=32, help="C_in = C_out")
    p.add_argument("--repeats", type=int, default=15, help="conv2d timing rounds")
    p.add_argument("--deep-repeats", type=int, default=5, help="conv2d_deep timing rounds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ok = True
    if args.only in (None, "conv2d"):
        ok &= _conv2d_section(
            args.batches, args.conv_size, args.channels, args.channels, 3, -5, args.repeats, args.seed
        )
    if args.only in (None, "deep"):
        ok &= _deep_section(args.batch, args.size, args.channels, args.deep_repeats, args.seed)
    return 0 if ok else 1
