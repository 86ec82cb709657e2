"""hwjax.checked: documented value ranges become runtime checks for traced values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import hwjax
from hwjax.core import _checked, fixed_mul, mac, quantize_affine, saturate, shift_right
from hwjax.errors import HwjaxError, RangeError


def _shift(x, s):
    return shift_right(x, s, rounding="half_up")


X = np.array([5, -7, 100, 3], np.int32)


def test_exported():
    assert hwjax.checked is hwjax.core.checked


def test_jit_out_of_range_raises_naming_argument():
    f = jax.jit(_shift)
    # unchecked, as documented: a traced negative shift is the caller's error, treated as 0
    np.testing.assert_array_equal(f(X, jnp.int32(-1)), X)
    with pytest.raises(RangeError, match=r"shift .*must lie in \[0, 2147483647\]; found -1$"):
        hwjax.checked(f)(X, jnp.int32(-1))
    # the unchecked program is still the unchecked one (no check leaked into jit's cache)
    np.testing.assert_array_equal(f(X, jnp.int32(-1)), X)


def test_vmap_out_of_range_raises_naming_argument():
    f = jax.vmap(_shift)
    s = jnp.array([1, 2, -3, 0])
    np.testing.assert_array_equal(f(X, s), np.asarray(_shift(X, np.array([1, 2, 0, 0]))))
    with pytest.raises(RangeError, match=r"shift .*; found -3"):
        hwjax.checked(f)(X, s)
    with pytest.raises(RangeError, match=r"shift .*; found -3"):
        hwjax.checked(jax.jit(jax.vmap(f)))(X[None], s[None])


def test_mac_operand_and_acc0_ranges():
    x = np.ones((2, 3), np.float32)
    w = np.ones((4, 3), np.int8)
    f = jax.jit(lambda a, x, w: mac(a, x, w))
    with pytest.raises(RangeError, match=r"x \(declared int8\) must lie in \[-128, 127\]; found 300"):
        hwjax.checked(f)(jnp.zeros(()), x * 300, w)
    with pytest.raises(RangeError, match=r"x is a float array and must hold integer values only; found 1.5"):
        hwjax.checked(f)(jnp.zeros(()), x * 1.5, w)
    with pytest.raises(RangeError, match=r"acc0 is a float array and must hold integer values only; found 2.5"):
        hwjax.checked(f)(jnp.float32(2.5), x, w)
    g = jax.jit(lambda a, x, w: mac(a, x, w, acc_bits=16))
    a = jnp.array([0, 40000, 0, 0], jnp.int32)
    assert g(a, x.astype(np.int8), w).shape == (2, 4)  # unchecked: runs
    with pytest.raises(RangeError, match=r"acc0 \(acc_bits=16\) must lie in \[-32768, 32767\]; found 40000"):
        hwjax.checked(g)(a, x.astype(np.int8), w)


def test_quantizer_nan_rule_under_jit():
    f = jax.jit(lambda x, s: quantize_affine(x, s, 3))
    x = jnp.array([1.0, jnp.nan, 2.0])
    assert np.isnan(np.asarray(f(x, 0.5))[1])  # unchecked: the formula's NaN
    with pytest.raises(RangeError, match=r"x must be finite \(no NaN or Inf\); found nan"):
        hwjax.checked(f)(x, 0.5)
    with pytest.raises(RangeError, match=r"x must be finite .*; found -inf"):
        hwjax.checked(f)(jnp.array([1.0, -jnp.inf]), 0.5)
    with pytest.raises(RangeError, match=r"scale must be finite and > 0; found 0"):
        hwjax.checked(f)(jnp.ones(2), jnp.float32(0.0))


def test_float_operands_must_hold_integers():
    f = jax.jit(lambda x: saturate(x, 8))
    with pytest.raises(RangeError, match=r"^x is a float array and must hold integer values only; found 2.5$"):
        hwjax.checked(f)(jnp.array([1.0, 2.5]))
    with pytest.raises(RangeError, match=r"x must lie in \[-2147483648, 2147483647\]; found 4294967296"):
        hwjax.checked(f)(jnp.array([1.0, 2.0**32]))


def test_in_range_results_identical():
    x = jnp.asarray(np.random.default_rng(0).integers(-128, 128, (3, 40)), jnp.int8)
    w = jnp.asarray(np.random.default_rng(1).integers(-128, 128, (5, 40)), jnp.int8)
    xv = jnp.asarray(np.random.default_rng(2).integers(-(2**31), 2**31, (3, 8), dtype=np.int64), jnp.int32)
    cases = [
        (jax.jit(_shift), (xv, jnp.int32(3))),
        (jax.vmap(_shift), (xv, jnp.array([0, 5, 31]))),
        (jax.jit(lambda v: saturate(v, 12, symmetric=False)), (xv,)),
        (jax.jit(lambda v, m: fixed_mul(v, m, 31)), (xv, xv[::-1])),
        (jax.jit(lambda a, x, w: mac(a, x, w, chunk=4, acc_bits=20)), (jnp.int32(7), x, w)),
        (jax.vmap(lambda a, x: mac(a, x, w)), (jnp.arange(3, dtype=jnp.int32), x)),
        (jax.jit(lambda v: quantize_affine(v, 0.37, -5)), (jnp.linspace(-90.0, 90.0, 64),)),
        (jax.jit(jax.grad(lambda v: saturate(v, 8).sum())), (jnp.array([1.0, 300.0, -2.0]),)),
    ]
    for f, args in cases:
        want = f(*args)
        got = hwjax.checked(f)(*args)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert np.asarray(got).dtype == np.asarray(want).dtype


def test_default_path_has_no_checks():
    f = jax.jit(_shift)
    assert "check" not in str(jax.make_jaxpr(f)(X, jnp.int32(1)))
    # the same trace in checked mode does contain the check (so the assertion above can fail)
    with _checked._on():
        err, _ = checkify.checkify(f, errors=checkify.user_checks)(X, jnp.int32(-1))
    assert "shift" in err.get()


def test_nested_and_misuse():
    f = jax.jit(_shift)
    with pytest.raises(RangeError, match="shift"):
        hwjax.checked(lambda x, s: hwjax.checked(f)(x, s) + 1)(X, jnp.int32(-2))
    with pytest.raises(TypeError, match="outermost"):
        jax.jit(hwjax.checked(f))(X, jnp.int32(1))
    with pytest.raises(TypeError, match="callable"):
        hwjax.checked(3)


def test_users_own_checks_are_not_range_errors():
    def f(x):
        checkify.check(jnp.all(x > 0), "my own check")
        return _shift(x, 1)

    with pytest.raises(Exception, match="my own check") as e:
        hwjax.checked(jax.jit(f))(jnp.array([-1, 2]))
    assert not isinstance(e.value, HwjaxError)
