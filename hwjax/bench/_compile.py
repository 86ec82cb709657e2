"""``python -m hwjax.bench compile``: how long users wait for XLA, against the float model.

One round compiles each program once, ahead of time (``jax.jit(f).lower(...).compile()``:
trace, lowering and XLA), after ``jax.clear_caches()`` and one untimed compile that pays
the process's one-time setup, so every program starts as cold as in a new process; the
run keeps each program's fastest of ``--repeats`` rounds (default 3). On the demo's digits
CNN (or ``--model mlp``) for a batch of 64. The programs:

* the float forward (the baseline, 1.0x);
* the hardware forward as the lowered graph runs it (:func:`hwjax.graph.jit_run` on
  ``to_graph`` + ``lower``: the integer parameters derived once on the host by the
  target's recipe and passed in, what :func:`hwjax.evaluate` and a loaded model run);
* the hardware forward of the Flax model under ``jit`` with its state passed in (the
  parameters re-derived in the program from the float weights, what a training step
  contains);
* the same forward with the model closed over (``jax.jit(lambda x: model(x))``): its
  weights and quantisation are concrete, so the layers derive their integer parameters on
  the host at trace time, as an eager call does (the model is called once in hardware mode
  beforehand, as the lowered graph is lowered beforehand);
* one float and one hardware-aware training step (forward, backward, adam).

Each line prints seconds, the size of the optimised HLO and the ratio to the float
forward. Set no persistent compilation cache when timing (``JAX_COMPILATION_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def _compile(fn, *args) -> tuple[float, int]:
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return time.perf_counter() - t, len(compiled.as_text() or "")


def main(argv: list[str] | None = None) -> int:
    import optax
    from flax import nnx

    import hwjax.nn as hn
    from hwjax import graph as G
    from hwjax import models
    from hwjax import targets as T
    from hwjax.train import make_step

    p = argparse.ArgumentParser(prog="python -m hwjax.bench compile", description=__doc__)
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"))
    p.add_argument("--target", default="xs3", choices=T.available(), help="a registered hwjax target")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="rounds; each program's fastest is kept")
    args = p.parse_args([] if argv is None else argv)

    rng = np.random.default_rng(0)
    shape = (8, 8, 1) if args.model == "cnn" else (64,)
    target = T.get(args.target)
    model = models.build(args.model, target, rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.uniform(0, 1, (args.batch_size,) + shape).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 10, args.batch_size), jnp.int32)
    hn.set_mode(model, "calibrate")
    model(x)

    tx = optax.adam(1e-3)

    def one_round() -> list:
        jax.clear_caches()
        rows = []
        for mode in ("float", "hardware"):
            hn.set_mode(model, mode)
            graphdef, state = nnx.split(model)
            if mode == "float":  # a first compile in a process pays one-time setup: not the baseline's
                _compile(lambda st, v, g=graphdef: nnx.merge(g, st)(v), state, x)
            rows.append((f"{mode} forward (jit)", _compile(lambda st, v, g=graphdef: nnx.merge(g, st)(v), state, x)))
            if mode == "hardware":
                model(x)  # the host recipe's programs, compiled once per shape (as lowering does below)
                rows.append(("hardware forward (jit, model closed over)", _compile(lambda v, m=model: m(v), x)))
                g = G.lower(hn.to_graph(model, input_shape=shape), target)
                rows.append(
                    ("hardware forward, lowered graph (jit_run)", _compile(lambda gr, v: G.run(gr, v, target), g, x))
                )
            gd, params, rest = nnx.split(model, nnx.Param, ...)
            rows.append((f"{mode} training step", _compile(make_step(gd, tx), params, tx.init(params), rest, x, y)))
        return rows

    rounds = [one_round() for _ in range(max(1, args.repeats))]
    rows = [(name, min((r[i][1] for r in rounds), key=lambda v: v[0])) for i, (name, _) in enumerate(rounds[0])]
    base = rows[0][1][0]
    dev = jax.devices()[0]
    print(
        f"hwjax compile benchmark: {args.model} on {target!r}, batch {args.batch_size}, "
        f"{dev.platform} ({dev.device_kind}), fastest of {len(rounds)} rounds"
    )
    print(f"  {'program':<45} {'compile s':>9} {'HLO chars':>10} {'x float fwd':>11}")
    for name, (sec, size) in rows:
        print(f"  {name:<45} {sec:9.2f} {size:10,d} {sec / base:10.1f}x")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
