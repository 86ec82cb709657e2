"""``python -m hwjax.studies lt8``: error of gemmlowp's less-than-8-bit GEMMs against the
exact 8-bit GEMM as the depth grows, for nearest vs xorshift vs addmod rounding.

For every depth K, bit-depth pair (L7R5, L5R5, L4R4 by default) and rounding mode
(forced for both sides, whatever the depth), ``hwjax.gemmlowp.gemm_lt8`` runs on
``rows x K x cols`` uint8 matrices (several seeds, batched with ``vmap``) and its int32
accumulators (already rescaled to the 8-bit scale, spec §3.10) are compared with the
exact accumulators of ``hwjax.gemmlowp.gemm`` on the same inputs:

* relative RMS error  = rms(lt8 - exact) / rms(exact)
* relative bias       = |mean(lt8 - exact)| / rms(exact)

Data sets (``model`` trains a small network first; the others are synthetic):

* ``model``: a trained model's values. A 64-64-10 float MLP is trained with optax on
  scikit-learn's bundled 8x8 digits (300 full-batch adam steps, seed 0); the LHS entries
  are drawn (with replacement, per depth) from its first layer's weights quantised to
  uint8 (``round(w / s) + 128``, ``s = max|w| / 127``, zero point 128), the RHS entries
  from its input pixels quantised to uint8 (``round(255 * x / 16)``, zero point 0: mostly
  zeros, 17 distinct values). So the operands have the value distributions a deployed
  first layer sees, at every depth.

* ``uniform``: both operands uniform on 0..255, zero points 128 (offsets -128).
* ``relu``: LHS like post-ReLU activations, ``max(0, round(N(0, 60)))`` clipped to 255
  with zero point 0 (about half the entries 0), RHS like weights, ``round(N(128, 20))``
  with zero point 128.
* ``narrow``: both operands clustered a little off their zero point 128,
  ``round(N(140, 6))`` and ``round(N(120, 6))``: few distinct values, so round-to-nearest
  makes the same error on every occurrence of a value and the errors do not average out.

gemmlowp itself (``rounding="auto"``) uses nearest below depth 384 and addmod from 384.
Prints a markdown table per data set and writes a PNG plot.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import hwjax.gemmlowp as G
from hwjax.errors import RangeError

_BITS = {"L7R5": (7, 5), "L5R5": (5, 5), "L4R4": (4, 4), "L6R6": (6, 6), "L3R3": (3, 3)}


_MODEL_VALUES: dict = {}


def _trained_values() -> tuple[np.ndarray, np.ndarray]:
    """uint8 values of a trained digits MLP's first-layer weights and of its input pixels
    (see the module docstring), computed once per process."""
    if not _MODEL_VALUES:
        import jax.numpy as jnp
        import optax
        from sklearn.datasets import load_digits

        d = load_digits()
        x = jnp.asarray(d.data / 16.0, jnp.float32)
        y = jnp.asarray(d.target)
        k1, k2 = jax.random.split(jax.random.PRNGKey(0))
        params = {
            "w1": jax.random.normal(k1, (64, 64)) / 8.0,
            "b1": jnp.zeros(64),
            "w2": jax.random.normal(k2, (64, 10)) / 8.0,
            "b2": jnp.zeros(10),
        }

        def loss(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], y).mean()

        tx = optax.adam(1e-2)

        @jax.jit
        def step(p, s):
            g = jax.grad(loss)(p)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        p, s = params, tx.init(params)
        for _ in range(300):
            p, s = step(p, s)
        w = np.asarray(p["w1"], np.float64)
        wq = np.clip(np.round(w / (np.abs(w).max() / 127.0)) + 128, 0, 255).astype(np.uint8)
        xq = np.clip(np.round(255.0 * d.data / 16.0), 0, 255).astype(np.uint8)
        _MODEL_VALUES["w"], _MODEL_VALUES["x"] = wq.ravel(), xq.ravel()
    return _MODEL_VALUES["w"], _MODEL_VALUES["x"]


def make_data(kind: str, n: int, rows: int, depth: int, cols: int, seed: int):
    rng = np.random.default_rng([seed, depth])
    if kind == "model":
        w, x = _trained_values()
        lhs = rng.choice(w, (n, rows, depth))
        rhs = rng.choice(x, (n, depth, cols))
        return lhs, rhs, -128, 0
    if kind == "uniform":
        lhs = rng.integers(0, 256, (n, rows, depth))
        rhs = rng.integers(0, 256, (n, depth, cols))
        return lhs.astype(np.uint8), rhs.astype(np.uint8), -128, -128
    if kind == "relu":
        lhs = np.clip(np.round(rng.normal(0.0, 60.0, (n, rows, depth))), 0, 255)
        rhs = np.clip(np.round(rng.normal(128.0, 20.0, (n, depth, cols))), 0, 255)
        return lhs.astype(np.uint8), rhs.astype(np.uint8), 0, -128
    if kind == "narrow":
        lhs = np.clip(np.round(rng.normal(140.0, 6.0, (n, rows, depth))), 0, 255)
        rhs = np.clip(np.round(rng.normal(120.0, 6.0, (n, depth, cols))), 0, 255)
        return lhs.astype(np.uint8), rhs.astype(np.uint8), -128, -128
    raise RangeError(f"unknown data set {kind!r}")


def run(kinds, pairs, modes, depths, rows, cols, seeds, seed):
    """Returns {(kind, pair, mode, depth): (rel_rms, rel_bias)}."""
    results = {}
    fns = {}
    for kind in kinds:
        for depth in depths:
            lhs, rhs, lo, ro = make_data(kind, seeds, rows, depth, cols, seed)
            exact_fn = fns.setdefault(
                ("exact", lo, ro),
                jax.jit(jax.vmap(lambda a, b, lo=lo, ro=ro: G.gemm(a, b, lhs_offset=lo, rhs_offset=ro))),
            )
            exact = np.asarray(exact_fn(lhs, rhs)).astype(np.float64)
            scale = np.sqrt(np.mean(exact**2))
            for pair in pairs:
                lb, rb = _BITS[pair]
                for mode in modes:
                    key = ("lt8", lo, ro, lb, rb, mode)
                    fn = fns.setdefault(
                        key,
                        jax.jit(
                            jax.vmap(
                                lambda a, b, lo=lo, ro=ro, lb=lb, rb=rb, mode=mode: G.gemm_lt8(
                                    a, b, lhs_offset=lo, rhs_offset=ro, lhs_bits=lb, rhs_bits=rb, rounding=mode
                                )
                            )
                        ),
                    )
                    err = np.asarray(fn(lhs, rhs)).astype(np.float64) - exact
                    results[(kind, pair, mode, depth)] = (np.sqrt(np.mean(err**2)) / scale, abs(np.mean(err)) / scale)
    return results


def markdown(results, kind, pairs, modes, depths) -> str:
    head = "| depth | " + " | ".join(f"{p} {m}" for p in pairs for m in modes) + " |"
    sep = "| ---: | " + " | ".join("---:" for _ in pairs for _ in modes) + " |"
    lines = [head, sep]
    for d in depths:
        cells = []
        for p in pairs:
            for m in modes:
                rms, bias = results[(kind, p, m, d)]
                auto = m == G.rounding_mode(d)
                cell = f"{100 * rms:.2f} ({100 * bias:.2f})"
                cells.append(f"**{cell}**" if auto else cell)
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, kinds, pairs, modes, depths, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(kinds), len(pairs), figsize=(4.2 * len(pairs), 3.4 * len(kinds)), squeeze=False, sharex=True
    )
    styles = {"nearest": ("C0", "o"), "xorshift": ("C1", "s"), "addmod": ("C2", "^")}
    for i, kind in enumerate(kinds):
        for j, pair in enumerate(pairs):
            ax = axes[i][j]
            for m in modes:
                c, mk = styles.get(m, (None, "x"))
                rms = [100 * results[(kind, pair, m, d)][0] for d in depths]
                bias = [100 * results[(kind, pair, m, d)][1] for d in depths]
                ax.plot(depths, rms, color=c, marker=mk, label=f"{m} RMS")
                ax.plot(depths, bias, color=c, marker=mk, linestyle=":", alpha=0.7, label=f"{m} |bias|")
            ax.axvline(G.PROBABILISTIC_THRESHOLD, color="grey", linewidth=0.8, linestyle="--")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{pair}, {kind} data")
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("error / rms(exact)  [%]")
            if i == len(kinds) - 1:
                ax.set_xlabel("depth K (dashed: gemmlowp's 384 switch)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("gemmlowp less-than-8-bit GEMM vs exact 8-bit (hwjax.gemmlowp.gemm_lt8)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hwjax.studies lt8", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--cols", type=int, default=128)
    ap.add_argument("--depths", default="64,128,256,512,1024,2048,4096")
    ap.add_argument("--pairs", default="L7R5,L5R5,L4R4", help=f"from {','.join(_BITS)}")
    ap.add_argument("--modes", default="nearest,xorshift,addmod")
    ap.add_argument("--data", default="uniform,relu,narrow,model", help="uniform, relu, narrow, model")
    ap.add_argument("--seeds", type=int, default=4, help="independent GEMMs per point (vmapped)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="lt8_study.png", help="PNG path")
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    pairs = args.pairs.split(",")
    modes = args.modes.split(",")
    kinds = args.data.split(",")
    for p in pairs:
        if p not in _BITS:
            raise SystemExit(f"unknown pair {p!r}; choose from {', '.join(_BITS)}")
    for m in modes:
        if m not in G.MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(G.MODES)}")
    if not G.is_requantization_worth_it(args.rows, args.cols):
        raise SystemExit(f"{args.rows}x{args.cols} outputs: gemmlowp would not requantize (IsRequantizationWorthIt)")

    t0 = time.perf_counter()
    results = run(kinds, pairs, modes, depths, args.rows, args.cols, args.seeds, args.seed)
    print(
        f"gemmlowp less-than-8-bit GEMM error vs exact 8-bit: {args.rows} x K x {args.cols}, "
        f"{args.seeds} random GEMMs per point (seed {args.seed}); cell = relative RMS error % "
        f"(relative |bias| %); bold = the mode gemmlowp's default strategy picks at that depth"
    )
    for kind in kinds:
        print(f"\n{kind} data\n")
        print(markdown(results, kind, pairs, modes, depths))
    plot(results, kinds, pairs, modes, depths, args.out)
    print(f"\nplot written to {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0
