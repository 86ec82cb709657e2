"""hwjax.evaluate: jitted batches, batch-size independence, sharding over a device mesh."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hwjax.nn as hn
from hwjax import targets as T
from hwjax._evaluate import evaluate

RNG = np.random.default_rng(3)


def _model():
    t = T.XS3()
    r = nnx.Rngs(0)
    m = hn.Sequential(
        {
            "input": hn.Quantize(target=t),
            "conv": hn.Conv(1, 8, 3, strides=2, activation="relu", target=t, rngs=r),
            "flat": hn.Flatten(target=t),
            "fc": hn.Dense(4 * 4 * 8, 5, target=t, rngs=r),
        }
    )
    x = RNG.uniform(0, 1, (37, 8, 8, 1)).astype(np.float32)
    hn.set_mode(m, "calibrate")
    m(jnp.asarray(x))
    hn.set_mode(m, "hardware")
    return m, x


def test_batch_size_does_not_change_a_bit():
    m, x = _model()
    y = RNG.integers(0, 5, len(x))
    results = [evaluate(m, (x, y), batch_size=b) for b in (5, 64)]
    for r in results[1:]:
        np.testing.assert_array_equal(r.outputs, results[0].outputs)
    r = results[0]
    assert r.outputs.dtype == np.int8 and r.outputs.shape == (37, 5)
    np.testing.assert_array_equal(r.predictions, r.outputs.argmax(-1))
    assert r.accuracy == float(np.mean(r.predictions == y))
    hn.set_mode(m, "float")
    f = evaluate(m, {"x": x}, batch_size=16)
    assert f.outputs.dtype == np.float32 and f.accuracy is None and f.scale is None


def test_bad_arguments():
    m, x = _model()
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(m, x, batch_size=0)
    with pytest.raises(ValueError, match="37 examples but y has 3"):
        evaluate(m, (x, np.zeros(3)), batch_size=8)
    with pytest.raises(TypeError, match="mesh must be"):
        evaluate(m, x, batch_size=8, mesh="cpu")
    with pytest.raises(TypeError, match="flax.nnx.Module"):
        evaluate(object(), x, batch_size=8)


def test_bad_labels_and_inputs_name_themselves():
    from hwjax.errors import HwjaxError, RangeError

    m, x = _model()
    y = np.zeros(37, np.int64)
    assert evaluate(m, (x, y), batch_size=64).accuracy is not None
    with pytest.raises(RangeError, match=r"labels must lie in \[0, 4\] .*5 output classes.*found 5"):
        evaluate(m, (x, y + 5), batch_size=64)
    with pytest.raises(RangeError, match=r"labels must lie in \[0, .*found -1"):
        evaluate(m, (x, y - 1), batch_size=64)
    with pytest.raises(TypeError, match="labels must be integer class indices.*0.5") as e:
        evaluate(m, (x, y + 0.5), batch_size=64)
    assert isinstance(e.value, HwjaxError)
    with pytest.raises(TypeError, match="labels must be an array of numbers"):
        evaluate(m, (x, ["a"] * 37), batch_size=64)
    with pytest.raises(ValueError, match=r"labels \(y\) must have shape \(37,\)"):
        evaluate(m, (x, np.zeros((37, 2))), batch_size=64)
    np.testing.assert_equal(
        evaluate(m, (x, y.astype(np.float32)), batch_size=64).accuracy, evaluate(m, (x, y), batch_size=64).accuracy
    )  # integer-valued floats are labels
    with pytest.raises(RangeError, match="x must be finite"):
        evaluate(m, np.where(np.arange(37)[:, None, None, None] == 3, np.nan, x), batch_size=64)
    with pytest.raises(TypeError, match="x must be an array of numbers"):
        evaluate(m, "images", batch_size=64)


def _four_devices():
    import jax
    from jax.sharding import Mesh

    if jax.device_count() < 4:
        pytest.skip("needs 4 devices: run under tests/conftest.py (XLA_FLAGS --xla_force_host_platform_device_count=4)")
    return Mesh(np.asarray(jax.devices()[:4]), ("data",))


def _mesh_model():
    rng = np.random.default_rng(0)
    t = T.XS3()
    r = nnx.Rngs(0)
    m = hn.Sequential(
        {
            "input": hn.Quantize(target=t),
            "conv": hn.Conv(1, 8, 3, strides=2, activation="relu", target=t, rngs=r),
            "flat": hn.Flatten(target=t),
            "fc": hn.Dense(128, 5, target=t, rngs=r),
        }
    )
    x = rng.uniform(0, 1, (50, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 5, 50).astype(np.int32)
    hn.set_mode(m, "calibrate")
    m(jnp.asarray(x))
    hn.set_mode(m, "hardware")
    return m, x, y


def test_sharded_evaluation_on_4_cpu_devices(tmp_path):
    """Evaluation over a 4-device mesh gives what one device gives, bit for bit (the test
    run has 4 virtual CPU devices, see conftest), for the model and its exported files."""
    from hwjax._export import export, load

    mesh = _four_devices()
    m, x, y = _mesh_model()
    one = evaluate(m, (x, y), batch_size=16)
    four = evaluate(m, (x, y), batch_size=16, mesh=mesh)
    assert np.array_equal(one.outputs, four.outputs) and one.accuracy == four.accuracy
    loaded = load(export(m, str(tmp_path), input_shape=(8, 8, 1)))
    assert np.array_equal(evaluate(loaded, x, batch_size=8, mesh=mesh).outputs, one.outputs)


@pytest.mark.slow
def test_data_parallel_training_on_4_cpu_devices():
    """A data-parallel hardware-aware training step over a 4-device mesh is the step on
    one device: the same loss (exact forward) and the same updated parameters."""
    import jax
    import optax

    from train._loop import Trainer

    mesh = _four_devices()
    m, x, y = _mesh_model()
    xb, yb = x[:16], y[:16]
    state = nnx.state(m)
    single = Trainer(m, optax.sgd(0.1))
    loss1, _ = single.step(xb, yb)
    p1 = jax.device_get(single.params)
    nnx.update(m, state)
    multi = Trainer(m, optax.sgd(0.1), mesh=mesh)
    loss4, _ = multi.step(xb, yb)
    p4 = jax.device_get(multi.params)
    assert float(loss1) == float(loss4), (float(loss1), float(loss4))  # exact forward on both
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_integer_results_do_not_depend_on_jax_enable_x64():
    """The same model built, calibrated and evaluated with 64-bit JAX types off and on
    (``jax.enable_x64`` for the whole run, in this process) gives the same int8 outputs."""
    import hashlib

    import jax

    from hwjax import models

    digests = []
    for flag in (False, True):
        with jax.enable_x64(flag):
            rng = np.random.default_rng(0)
            m = models.build("lut_mlp", T.XS3(variant="host"), rngs=nnx.Rngs(0), hidden=(16,))
            x = rng.uniform(0, 1, (32, 64)).astype(np.float32)
            hn.set_mode(m, "calibrate")
            m(jnp.asarray(x))
            hn.set_mode(m, "hardware")
            out = evaluate(m, x, batch_size=32).outputs
            assert jnp.asarray(1.0).dtype == (jnp.float64 if flag else jnp.float32)  # the flag took effect
            digests.append(hashlib.sha256(out.tobytes()).hexdigest())
    assert digests[0] == digests[1]
