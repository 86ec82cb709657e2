"""Printed reports and the training-curve figure of the demo."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def saturation_report(stats: dict, activations: dict[str, Optional[str]]) -> str:
    """A table of per-layer clipping: outputs at the int8 bounds (for the input layer:
    inputs the quantiser clips) and saturated 32-bit accumulators, in layer order.

    ``activations`` maps layer names (in order) to their fused activation; for ReLU
    layers the lower bound is the ReLU itself and is not counted.
    """
    rows = [("layer", "outputs", "at -128", "at +127", "acc saturated")]
    order = {n: i for i, n in enumerate(activations)}
    for name in sorted(stats, key=lambda n: order.get(n, len(order))):
        s = stats[name]
        f = s.fractions()
        low = "(ReLU)" if activations.get(name) == "relu" else f"{100 * f['low']:.2f}%"
        acc = f"{100 * f['acc_saturated']:.4f}%" if int(s.acc_count) else "-"
        rows.append((name, f"{int(s.count)}", low, f"{100 * f['high']:.2f}%", acc))
    return _table(rows)


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(rows[0]), sep] + [line(r) for r in rows[1:]])


def final_table(
    float_acc: float,
    ptq_acc: float,
    hat_acc: float,
    export_path,
    target: str,
    timings: Optional[dict[str, float]] = None,
) -> str:
    rows = [
        ("result", "value"),
        ("target", target),
        ("float accuracy (test)", f"{100 * float_acc:.2f}%"),
        ("post-training quantisation accuracy (bit-exact)", f"{100 * ptq_acc:.2f}%"),
        ("hardware-aware training accuracy (bit-exact)", f"{100 * hat_acc:.2f}%"),
        ("exported model", str(export_path)),
    ]
    for k, v in (timings or {}).items():
        rows.append((f"time: {k}", f"{v:.1f} s"))
    return _table(rows)


def plot_curves(history: dict, ptq_acc: Optional[float], path) -> Path:
    """Loss and test accuracy per epoch (float phase, then hardware-aware phase) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    nf = len(history.get("float", {}).get("loss", []))
    for phase, offset, style in (("float", 0, "-"), ("hat", nf, "--")):
        h = history.get(phase, {})
        if not h.get("loss"):
            continue
        xs = [offset + i + 1 for i in range(len(h["loss"]))]
        label = "float" if phase == "float" else "hardware-aware (bit-exact eval)"
        ax1.plot(xs, h["loss"], style, label=label)
        ax2.plot(xs, [100 * a for a in h["test_acc"]], style, label=label)
    if ptq_acc is not None:
        ax2.axhline(100 * ptq_acc, color="gray", linestyle=":", label="post-training quantisation")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss")
    ax1.set_yscale("log")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
