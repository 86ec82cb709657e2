"""XC_softmax where float32 subnormals occur: the host interpreter computes them, XLA flushes
them to zero. hwjax's subnormal-safe form (``softmax_rows_subnormal``, taken where the exp
table can meet them) against lib_nn's softmax written out in NumPy float32, which keeps
subnormals as x86 does without flush-to-zero."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwjax.targets._xs3_runtime import SoftmaxTable, softmax_lowered, softmax_rows_subnormal


def _host(rows: np.ndarray) -> np.ndarray:
    """lib_nn ``softmax_single`` per row: the sum in order, ``inv = fl(1/S) * 256``,
    ``clamp8(roundf(e * inv) - 128)`` with NaN reading 0 and inf 127 (the host's float to
    int8 conversion)."""
    out = np.zeros(rows.shape, np.int32)
    with np.errstate(all="ignore"):
        for r, row in enumerate(rows):
            s = np.float32(0)
            for v in row:
                s = np.float32(s + v)
            inv = np.float32(np.float32(1) / s) * np.float32(256)
            for i, v in enumerate(row):
                p = np.float32(v * inv)
                if np.isnan(p) or np.isinf(p):
                    out[r, i] = 0 if np.isnan(p) else 127
                    continue
                q = np.floor(p) + (1 if p - np.floor(p) >= 0.5 else 0)  # roundf of p >= 0
                out[r, i] = int(np.clip(q - 128, -128, 127))
    return out


def _rows(seed: int, count: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    two = np.float32(2.0)
    pools = [
        lambda k: rng.integers(1, 2**23, k).astype(np.int32).view(np.float32),  # subnormal
        lambda k: (two ** rng.integers(-135, -100, k).astype(np.float32) * rng.uniform(1, 2, k)).astype(np.float32),
        lambda k: (two ** rng.integers(100, 127, k).astype(np.float32) * rng.uniform(1, 2, k)).astype(np.float32),
        lambda k: rng.uniform(0, 10, k).astype(np.float32),
        lambda k: np.zeros(k, np.float32),
        lambda k: np.full(k, np.inf, np.float32),
    ]
    rows = []
    for _ in range(count):
        kinds = rng.choice(len(pools), size=2, p=[0.25, 0.2, 0.25, 0.2, 0.05, 0.05])
        vals = np.concatenate([pools[k](n) for k in kinds])
        rows.append(rng.permutation(vals)[:n])
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("n", [1, 3, 12])
def test_subnormal_safe_form_equals_the_host_arithmetic(n):
    rows = _rows(n, 300, n)
    got = np.asarray(jax.jit(softmax_rows_subnormal)(jnp.asarray(rows.view(np.int32))))
    np.testing.assert_array_equal(got, _host(rows))


def test_plain_float32_under_xla_differs_where_subnormals_occur():
    """The reason for the form: a row of subnormal entries (the host: a subnormal sum, an
    infinite inverse, 127) and a row whose sum exceeds 2**126 (a subnormal reciprocal)."""
    rows = np.array([[1e-40] * 4, [2.0**126, 2.0**125, 1.0, 0.0]], np.float32)

    @jax.jit
    def plain(e):
        inv = (jnp.float32(1) / e.sum(axis=1)) * 256
        return e * inv[:, None]

    assert not np.array_equal(np.asarray(plain(rows)), _np_products(rows))
    np.testing.assert_array_equal(np.asarray(softmax_rows_subnormal(jnp.asarray(rows.view(np.int32)))), _host(rows))


def _np_products(rows):
    with np.errstate(all="ignore"):
        return rows * ((np.float32(1) / rows.sum(axis=1, dtype=np.float32)) * np.float32(256))[:, None]


def test_the_lowering_marks_only_tables_that_can_meet_subnormals():
    ordinary = np.exp(np.linspace(-20, 20, 256)).astype(np.float32)
    assert softmax_lowered(ordinary, 10)["form"] == SoftmaxTable(subnormals=False)
    assert "bits" not in softmax_lowered(ordinary, 10)
    tiny = ordinary.copy()
    tiny[0] = np.float32(1e-40)
    big = ordinary.copy()
    big[-1] = np.float32(2.0**124)
    for t, n in ((tiny, 10), (big, 4), (ordinary * np.float32(2.0**80), 2**24)):
        low = softmax_lowered(t, n)
        assert low["form"].subnormals and np.array_equal(low["bits"], t.view(np.int32))
