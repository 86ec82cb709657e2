"""``python -m hwjax.bench train``: hardware-aware vs float training step, bit-exact eval throughput.

One run measures, with :func:`hwjax.bench.time_fn` (compile excluded), on the demo's
digits CNN (or ``--model mlp``):

* one float training step (forward, backward, adam update) and one hardware-aware
  training step (exact integer forward + surrogate backward) of the same model and
  batch, and their ratio (target: <= 3x);
* evaluation throughput in images/s: the float Flax model (the baseline), and bit-exact
  in hardware mode, the Flax model and the exported integer-only model
  (:func:`hwjax.load`), each with its ratio to the float model.
"""

from __future__ import annotations

import argparse
import tempfile

import jax
import jax.numpy as jnp
import numpy as np


def _steps(model, tx):
    from flax import nnx

    from hwjax.train import make_step

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return jax.jit(make_step(graphdef, tx)), (params, tx.init(params), rest)


def main(argv: list[str] | None = None) -> int:
    import optax
    from flax import nnx

    import hwjax.nn as hn
    from hwjax import models
    from hwjax import targets as T
    from hwjax import export, load
    from hwjax.bench import time_fn

    p = argparse.ArgumentParser(prog="python -m hwjax.bench train", description=__doc__)
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"))
    p.add_argument("--target", default="xs3", choices=T.available(), help="a registered hwjax target")
    p.add_argument("--variant", default=None, help="target variant (e.g. XS3: hardware, host, v2021)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch (the demo's default)")
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args([] if argv is None else argv)

    rng = np.random.default_rng(0)
    shape = (8, 8, 1) if args.model == "cnn" else (64,)
    target = T.get(args.target, **({"variant": args.variant} if args.variant else {}))
    model = models.build(args.model, target, rngs=nnx.Rngs(0))
    x_cal = rng.uniform(0, 1, (512,) + shape).astype(np.float32)
    hn.set_mode(model, "calibrate")
    model(jnp.asarray(x_cal))
    x = jnp.asarray(x_cal[: args.batch_size])
    y = jnp.asarray(rng.integers(0, 10, args.batch_size), jnp.int32)
    tx = optax.adam(1e-3)

    times = {}
    for mode in ("float", "hardware"):
        hn.set_mode(model, mode)
        step, (params, opt_state, rest) = _steps(model, tx)
        times[mode] = time_fn(step, params, opt_state, rest, x, y, repeats=args.repeats)
    ratio = times["hardware"].median / times["float"].median

    xe = jnp.asarray(rng.uniform(0, 1, (args.eval_batch_size,) + shape).astype(np.float32))
    hn.set_mode(model, "float")
    graphdef, state = nnx.split(model)
    float_eval = jax.jit(lambda st, v: nnx.merge(graphdef, st)(v))
    t_float = time_fn(float_eval, state, xe, repeats=args.repeats)
    hn.set_mode(model, "hardware")
    graphdef, state = nnx.split(model)
    flax_eval = jax.jit(lambda st, v: nnx.merge(graphdef, st)(v).q)
    t_flax = time_fn(flax_eval, state, xe, repeats=args.repeats)
    with tempfile.TemporaryDirectory() as d:
        loaded = load(export(model, d, input_shape=shape))
    loaded_eval = jax.jit(lambda st, v: loaded.apply(st, v).q)
    t_loaded = time_fn(loaded_eval, loaded.state(), xe, repeats=args.repeats)
    same = bool(np.array_equal(np.asarray(flax_eval(state, xe)), np.asarray(loaded_eval(loaded.state(), xe))))

    dev = jax.devices()[0]
    print(
        f"hwjax train benchmark: {args.model} on {target!r}, {dev.platform} ({dev.device_kind}), "
        f"{jax.device_count()} device(s)"
    )
    print(
        f"  float training step          (batch {args.batch_size}): {1e3 * times['float'].median:8.3f} ms "
        f"(best {1e3 * times['float'].best:.3f})"
    )
    print(
        f"  hardware-aware training step (batch {args.batch_size}): {1e3 * times['hardware'].median:8.3f} ms "
        f"(best {1e3 * times['hardware'].best:.3f})"
    )
    print(f"  ratio hardware-aware / float: {ratio:.2f}x (target <= 3x)")
    ips = {k: args.eval_batch_size / t.median for k, t in (("float", t_float), ("flax", t_flax), ("loaded", t_loaded))}
    print(
        f"  evaluation (batch {args.eval_batch_size}): float Flax model {ips['float']:,.0f} images/s; bit-exact: "
        f"Flax hardware mode {ips['flax']:,.0f} images/s ({ips['flax'] / ips['float']:.2f}x float), exported "
        f"integer model {ips['loaded']:,.0f} images/s ({ips['loaded'] / ips['float']:.2f}x float; outputs "
        f"identical: {same})"
    )
    return 0 if same else 1
