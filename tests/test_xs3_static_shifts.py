"""Shifts known while tracing (NumPy / Python ints) select one form of each VPU step; a
traced shift gets the form for every shift. Both must give the same values, for every
variant and every shift the instructions define (in and out of the assembly's ranges)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwjax import xs3
from hwjax.xs3 import _otfn, _vpu

VARIANTS = ("hardware", "host", "v2021")


def _extremes(bits: int, rng, n: int = 512) -> np.ndarray:
    """Values of a ``bits``-wide signed lane: the ends, ties of every rounding shift, random."""
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    ties = [s * (2**k) + d for k in range(min(bits, 31)) for s in (-1, 1) for d in (-1, 0, 1) if k < bits - 1]
    vals = np.concatenate([[lo, lo + 1, -1, 0, 1, hi - 1, hi], ties, rng.integers(lo, hi, n, endpoint=True)])
    return np.clip(vals, lo, hi).astype(np.int32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_vlsat_raw_known_shift_equals_traced(variant):
    x = jnp.asarray(_extremes(32, np.random.default_rng(0)))
    traced = jax.jit(lambda x, s: _vpu.vlsat_raw(x, s, variant=variant))
    for s in [*range(0, 40), 100, 0xFFFF]:
        want = np.asarray(traced(x, jnp.int32(s)))
        got = np.asarray(jax.jit(lambda x: _vpu.vlsat_raw(x, np.int32(s), variant=variant))(x))
        np.testing.assert_array_equal(got, want, err_msg=f"shift {s}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", [8, 16])
def test_vlashr_raw_known_shift_equals_traced(variant, mode):
    x = jnp.asarray(_extremes(mode, np.random.default_rng(1)))
    traced = jax.jit(lambda x, s: _vpu.vlashr_raw(x, s, mode=mode, variant=variant))
    for s in range(-40, 41):
        want = np.asarray(traced(x, jnp.int32(s)))
        got = np.asarray(jax.jit(lambda x: _vpu.vlashr_raw(x, s, mode=mode, variant=variant))(x))
        np.testing.assert_array_equal(got, want, err_msg=f"shift {s}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_steps_known_shifts_equal_traced(variant):
    """Every intermediate and clip flag of the output transform, over the assembly's whole
    shift ranges and past them (each shift over its range with the other one cycling)."""
    rng = np.random.default_rng(2)
    acc = jnp.asarray(_extremes(32, rng, 256)[:, None] * np.ones((1, 4), np.int32))
    mul = jnp.asarray([16384, -32768, 32767, 12345], jnp.int32)
    bias = jnp.asarray([0, -32768, 32767, -77], jnp.int32)
    others = (-20, -16, -1, 0, 1, 7, 14, 15, 16, 33)
    pairs = [(s1, others[i % len(others)]) for i, s1 in enumerate(range(-18, 19))]
    pairs += [(others[i % len(others)], s2) for i, s2 in enumerate(range(-20, 20))]
    steps = lambda a, s1, s2: _otfn.int8_steps(a, mul, bias, s1, s2, variant=variant)
    s1s, s2s = (jnp.asarray(v, jnp.int32) for v in zip(*pairs))
    want = jax.jit(jax.vmap(steps, in_axes=(None, 0, 0)))(acc, s1s, s2s)
    got = jax.jit(lambda a: [steps(a, np.int32(s1), s2) for s1, s2 in pairs])(acc)
    for i, (s1, s2) in enumerate(pairs):
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[i][k]), np.asarray(want[k][i]), err_msg=f"{k} at {s1}, {s2}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_conv2d_and_depthwise_inside_jit_with_int_shifts_equal_eager(variant):
    """A model's lowering calls the kernels inside its program with int shifts (the known
    forms); an eager call traces them (the general forms)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 6, 6, 8)).astype(np.int8)
    k = rng.integers(-128, 128, (5, 3, 3, 8)).astype(np.int8)
    kd = rng.integers(-128, 128, (3, 3, 8)).astype(np.int8)
    for s1, s2 in ((3, -2), (-4, 5), (0, 0), (16, 15), (-16, -16)):
        common = dict(
            initial_shift=s1,
            final_shr=s2,
            stride=(1, 1),
            pad_top_left=(1, 1),
            pad_value=-3,
            out_shape=(6, 6),
            variant=variant,
        )
        mul, bias = rng.integers(-(2**15), 2**15, 5), rng.integers(-(2**15), 2**15, 5)
        want = xs3.conv2d(x, k, mul, bias, **common)
        got = jax.jit(lambda x: xs3.conv2d(x, k, mul, bias, **common))(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        mul, bias = rng.integers(-(2**15), 2**15, 8), rng.integers(-(2**15), 2**15, 8)
        want = xs3.depthwise_conv2d(x, kd, mul, bias, **common)
        got = jax.jit(lambda x: xs3.depthwise_conv2d(x, kd, mul, bias, **common))(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_static_shift_reads_only_known_integers():
    assert _vpu.static_shift(3) == 3 and _vpu.static_shift(np.int32(-4)) == -4
    assert _vpu.static_shift(np.asarray(5)) == 5
    assert _vpu.static_shift(True) is None and _vpu.static_shift(np.zeros(2, np.int32)) is None
    assert _vpu.static_shift(1.0) is None
    jax.jit(lambda s: (_vpu.static_shift(s) is None) or pytest.fail("a traced shift is not known"))(jnp.int32(1))
