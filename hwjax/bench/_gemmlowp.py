"""``python -m hwjax.bench gemmlowp``: ``gemm_lt8`` against a NumPy implementation of the
same definition (spec §3.12), measured in the same run.

Default problem: 256 x 1024 x 256 uint8, L7R5 (``A5B7``), ``rounding="auto"`` (depth 1024
>= 384: ProbabilisticAddmod), scalar offsets, legacy uint8 output stage. The NumPy
reference computes the same definition vectorised: the closed-form draw index of every
packed element, the requantization, the exact product and the ``RMCF`` rescaling in
int64. Its product runs either as an int64 ``matmul`` (NumPy has no integer BLAS) or,
exactly as well since every partial sum stays below 2**53, as a float64 BLAS
``matmul``; both are timed. Target: ``gemm_lt8`` at least 10x faster than the NumPy
reference. The exact uint8 ``gemm`` is timed alongside for scale.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import hwjax.gemmlowp as G
from hwjax.bench._timing import time_fn

TARGET_RATIO = 10.0
_XORSHIFT = np.asarray(G.xorshift_offsets(255), np.int32)


# ------------------------------------------------------------------ NumPy reference


def _cdiv(a, b):
    return -(-a // b)


def np_draw_index(w, d, wp, depth, l1_depth):
    """Generator draw number of element (w, d) in its packing call (spec §3.8)."""
    d0 = (d // l1_depth) * l1_depth
    krd = _cdiv(np.minimum(l1_depth, depth - d0), 16) * 16
    dd = d - d0
    return (
        wp * d0
        + (w // 8) * 8 * krd
        + (dd // 16) * 128
        + ((dd % 16) // 4) * 32
        + ((w % 8) // 4) * 16
        + (w % 4) * 4
        + (d % 4)
    )


def np_offsets(n, mode):
    if mode == "nearest":
        return np.full(n.shape, 127, np.int32)
    if mode == "addmod":
        return (98 + 97 * (n % 255)) % 255
    return _XORSHIFT[n % 255]


def np_pack(lhs, rhs, lhs_bits, rhs_bits, mode, bp):
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    _, l2_cols, _, _, _, l1_depth = bp
    ar = lambda n: np.arange(n, dtype=np.int32)
    w, d = np.meshgrid(ar(rows), ar(depth), indexing="ij")
    nl = np_draw_index(w, d, _cdiv(rows, 8) * 8, depth, l1_depth)
    d, c = np.meshgrid(ar(depth), ar(cols), indexing="ij")
    c0 = (c // l2_cols) * l2_cols
    nr = np_draw_index(c - c0, d, _cdiv(np.minimum(l2_cols, cols - c0), 8) * 8, depth, l1_depth)
    pl = (lhs.astype(np.int32) * (2**lhs_bits - 1) + np_offsets(nl, mode)) // 255 if lhs_bits < 8 else lhs
    pr = (rhs.astype(np.int32) * (2**rhs_bits - 1) + np_offsets(nr, mode)) // 255 if rhs_bits < 8 else rhs
    return pl.astype(np.int64), pr.astype(np.int64)


def np_wrap32(v):
    return ((v + 2**31) % 2**32) - 2**31


def np_rmcf(x, n, d):
    if n == d:
        return x
    q = (n + d // 2) // d
    rem = n - q * d
    s = abs(rem) * 2**31 // d * (1 if rem >= 0 else -1)
    p = x * s  # |p| < 2**62
    t = np.where(p > 0, (p + 2**30) // 2**31, -((-p + 2**30) // 2**31))
    return np_wrap32(x * q + t)


def np_rdbpot(x, e):
    mask = (1 << e) - 1
    return (x >> e) + ((x & mask) > (mask >> 1) + (x < 0))


def np_gemm_lt8(lhs, rhs, lhs_offset, rhs_offset, lhs_bits, rhs_bits, mode, legacy, float_blas=False):
    """gemmlowp's requantizing GEMM in NumPy (requantization is worth it and < 8 bits
    somewhere; the caller checks)."""
    rows, depth = lhs.shape
    cols = rhs.shape[1]
    pl, pr = np_pack(lhs, rhs, lhs_bits, rhs_bits, mode, G.block_params(rows, depth, cols))
    if float_blas:
        xx = (pl.astype(np.float64) @ pr.astype(np.float64)).astype(np.int64)
    else:
        xx = pl @ pr
    ml, mr = 2**lhs_bits - 1, 2**rhs_bits - 1
    acc = (
        np_rmcf(xx, 65025, ml * mr)
        + np_rmcf(np_wrap32(pl.sum(1)[:, None] * rhs_offset), 255, ml)
        + np_rmcf(np_wrap32(pr.sum(0)[None, :] * lhs_offset), 255, mr)
        + np_wrap32(lhs_offset * rhs_offset * depth)
    )
    acc = np_wrap32(acc)
    off, mult, shift = legacy
    return np.clip(np_rdbpot(np_wrap32(np_wrap32(acc + off) * mult), shift), 0, 255).astype(np.uint8)


def _time_numpy(fn, repeats):
    fn()
    best = float("inf")
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    best = samples[0]
    return best, samples[len(samples) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hwjax.bench gemmlowp", description=__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--depth", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows, depth, cols = args.rows, args.depth, args.cols
    if not G.is_requantization_worth_it(rows, cols):
        raise SystemExit(
            f"{rows}x{cols} is below gemmlowp's IsRequantizationWorthIt threshold: "
            "gemm_lt8 would run the exact 8-bit GEMM"
        )

    rng = np.random.default_rng(args.seed)
    lhs = rng.integers(0, 256, (rows, depth)).astype(np.uint8)
    rhs = rng.integers(0, 256, (depth, cols)).astype(np.uint8)
    lo, ro = -128, -120
    legacy = (40000, 3, 18)
    mode = G.rounding_mode(depth)
    L, R = G.A5B7.lhs_bits, G.A5B7.rhs_bits

    lt8 = jax.jit(
        lambda a, b: G.gemm_lt8(
            a,
            b,
            lhs_offset=lo,
            rhs_offset=ro,
            bit_depth=G.A5B7,
            result_offset=legacy[0],
            result_mult_int=legacy[1],
            result_shift=legacy[2],
        )
    )
    exact = jax.jit(
        lambda a, b: G.gemm(
            a,
            b,
            lhs_offset=lo,
            rhs_offset=ro,
            output_stages=(G.QuantizeDownInt32ToUint8Scale(*legacy), G.SaturatingCastToUint8()),
        )
    )
    a, b = jax.device_put(lhs), jax.device_put(rhs)
    t_lt8 = time_fn(lt8, a, b, repeats=args.repeats)
    t_exact = time_fn(exact, a, b, repeats=args.repeats)

    ref_int = lambda: np_gemm_lt8(lhs, rhs, lo, ro, L, R, mode, legacy)
    ref_blas = lambda: np_gemm_lt8(lhs, rhs, lo, ro, L, R, mode, legacy, float_blas=True)
    n_int = _time_numpy(ref_int, max(2, args.repeats // 2))
    n_blas = _time_numpy(ref_blas, args.repeats)

    got = np.asarray(lt8(a, b))
    same_int = np.array_equal(got, ref_int())
    same_blas = np.array_equal(got, ref_blas())

    dev = jax.devices()[0]
    print(
        f"device: {dev.platform} ({dev.device_kind}); gemm_lt8 {rows}x{depth}x{cols} uint8, A5B7 (L7R5), "
        f"rounding auto -> {mode}, legacy uint8 output stage"
    )
    print(f"{'candidate':44s} {'best ms':>9s} {'median ms':>10s}")
    print(f"{'gemm_lt8 (jit)':44s} {t_lt8.best * 1e3:9.2f} {t_lt8.median * 1e3:10.2f}")
    print(f"{'gemm exact uint8 (jit, same output stage)':44s} {t_exact.best * 1e3:9.2f} {t_exact.median * 1e3:10.2f}")
    print(f"{'NumPy reference, int64 matmul':44s} {n_int[0] * 1e3:9.2f} {n_int[1] * 1e3:10.2f}")
    print(f"{'NumPy reference, float64 BLAS matmul':44s} {n_blas[0] * 1e3:9.2f} {n_blas[1] * 1e3:10.2f}")
    r_int = n_int[0] / t_lt8.best
    r_blas = n_blas[0] / t_lt8.best
    print(
        f"speed-up over NumPy (best/best): int64 matmul {r_int:.1f}x, float64 BLAS {r_blas:.1f}x "
        f"(target >= {TARGET_RATIO:.0f}x: {'met' if min(r_int, r_blas) >= TARGET_RATIO else 'met vs int64 only' if r_int >= TARGET_RATIO else 'NOT met'})"
    )
    print(f"bit-exact against both NumPy references: {same_int and same_blas}")
    return 0 if same_int and same_blas else 1
