"""Fine-tune an int8 ``.tflite`` model in a LiteRT runtime's exact arithmetic, write it
back with :func:`hwjax.tflite.save`, and check that LiteRT runs the saved file exactly as
hwjax does.

    python examples/finetune_tflite.py [MODEL.tflite] [--steps 20] [--out tuned.tflite]

Without MODEL, a small random model (CONV_2D -> DEPTHWISE_CONV_2D, both with ReLU ->
RESHAPE -> FULLY_CONNECTED) is written with :mod:`hwjax.tflite.testing`. The data are synthetic:
random int8 inputs with random labels to fit.

Steps:

1. ``hwjax.tflite.load`` -> ``model.graph``; :func:`hwjax.nn.from_graph` builds trainable
   NNX layers whose hardware mode runs the graph's integers bit for bit on
   ``TFLite("reference")`` (the forward pass is the runtime's; gradients come from the
   layers' float surrogates).
2. The file's input is int8, while ``hwjax.nn`` models start with a ``Quantize`` layer
   (float in, int8 out). :func:`with_quantize_input` puts a ``quantize`` node in front
   (pinned to the input tensor's scale and zero point), and the int8 batch is fed as a
   :class:`hwjax.nn.QArray` with that quantisation (:func:`int8_input`), which the
   ``Quantize`` layer passes through unchanged: the layers see the file's integers.
3. A few optax steps (softmax cross-entropy on the dequantised outputs).
4. :func:`hwjax.nn.to_graph` turns the layers back into a graph (:func:`tuned_graph`: same
   names, attributes and tensor quantisation, new int8 kernels and int32 biases), the
   quantize in front is dropped again, ``hwjax.tflite.save`` writes
   the file, and LiteRT's reference kernels run it: equal to ``Model.run`` of the saved
   file and to the trained layers' own integer outputs.

Needs ``ai-edge-litert`` (and ``flatbuffers``, which it brings).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import hwjax.nn as hn
import hwjax.tflite as tfl
from hwjax.graph import Graph, Node, Tensor
from hwjax.targets import TFLite

FLOAT_INPUT = "float_input"


def demo_model(seed: int = 0, in_shape=(8, 8, 2), classes: int = 4) -> bytes:
    """A random int8 model: CONV_2D 3x3 SAME (6 channels, fused ReLU) -> DEPTHWISE_CONV_2D
    3x3 SAME stride 2 (fused ReLU) -> RESHAPE -> FULLY_CONNECTED (``classes`` outputs)."""
    from hwjax.tflite.testing import ModelBuilder

    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    s_in, s_h, c = np.float32(0.02), np.float32(0.03), 6
    x = mb.tensor((1, *in_shape), "int8", s_in, 0, name="input")
    s_w = rng.uniform(0.004, 0.01, c).astype(np.float32)
    w = mb.tensor((c, 3, 3, in_shape[2]), "int8", s_w, np.zeros(c), rng.integers(-127, 128, (c, 3, 3, in_shape[2])))
    b = mb.tensor((c,), "int32", s_in * s_w, np.zeros(c), rng.integers(-200, 200, c))
    h1 = mb.tensor((1, *in_shape[:2], c), "int8", s_h, -128, name="conv")
    mb.op(
        "CONV_2D",
        [x, w, b],
        [h1],
        ("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1, "fusedActivationFunction": 1}),
        3,
    )
    hw = ((in_shape[0] + 1) // 2, (in_shape[1] + 1) // 2)
    s_w1 = rng.uniform(0.01, 0.03, c).astype(np.float32)
    w1 = mb.tensor((1, 3, 3, c), "int8", s_w1, np.zeros(c), rng.integers(-127, 128, (1, 3, 3, c)), axis=3)
    b1 = mb.tensor((c,), "int32", s_h * s_w1, np.zeros(c), rng.integers(-200, 200, c))
    h2 = mb.tensor((1, *hw, c), "int8", s_h, -128, name="depthwise")
    mb.op(
        "DEPTHWISE_CONV_2D",
        [h1, w1, b1],
        [h2],
        (
            "DepthwiseConv2DOptions",
            {"padding": 0, "strideH": 2, "strideW": 2, "depthMultiplier": 1, "fusedActivationFunction": 1},
        ),
        3,
    )
    n = hw[0] * hw[1] * c
    h3 = mb.tensor((1, n), "int8", s_h, -128, name="flat")
    shape = mb.tensor((2,), "int32", data=np.array([1, n], np.int32), name="flat_shape")
    mb.op("RESHAPE", [h2, shape], [h3], ("ReshapeOptions", {"newShape": [1, n]}))
    s_w2 = np.float32([0.004])
    w2 = mb.tensor((classes, n), "int8", s_w2, np.zeros(1), rng.integers(-127, 128, (classes, n)))
    b2 = mb.tensor((classes,), "int32", s_h * s_w2, np.zeros(1), rng.integers(-500, 500, classes))
    y = mb.tensor((1, classes), "int8", np.float32(0.1), 0, name="logits")
    mb.op("FULLY_CONNECTED", [h3, w2, b2], [y], ("FullyConnectedOptions", {"fusedActivationFunction": 0}))
    return mb.finish([x], [y])


def with_quantize_input(graph: Graph) -> Graph:
    """``graph`` with a float32 input ``"float_input"`` and a ``quantize`` node in front
    writing the original int8 input tensor: the model-input layer :func:`hwjax.nn.from_graph`
    expects (a :class:`hwjax.nn.Quantize` pinned to the input's scale and zero point,
    which passes an already-quantised :class:`hwjax.nn.QArray` through unchanged)."""
    inp = graph.tensors[graph.inputs[0]]
    front = Tensor(FLOAT_INPUT, inp.shape, "float32", None)
    node = Node("quantize", (FLOAT_INPUT,), (inp.name,), {}, None)
    return Graph({FLOAT_INPUT: front, **graph.tensors}, (node, *graph.nodes), (FLOAT_INPUT,), graph.outputs).validate()


def without_quantize_input(graph: Graph) -> Graph:
    """The inverse of :func:`with_quantize_input`: the int8 input tensor is the input again."""
    first = graph.nodes[0]
    if first.op != "quantize":
        raise ValueError(f"the graph's first node is {first.op!r}, not the quantize in front")
    tensors = {k: v for k, v in graph.tensors.items() if k != first.inputs[0]}
    return Graph(tensors, graph.nodes[1:], first.outputs, graph.outputs).validate()


def int8_input(graph: Graph, x) -> hn.QArray:
    """The int8 batch ``x`` of ``graph``'s (int8) input as a :class:`hwjax.nn.QArray`
    (values in float32, the input tensor's scale and zero point): the front ``Quantize``
    layer passes it through, so the layers see exactly the file's input integers."""
    q = graph.tensors[graph.inputs[0]].quant
    return hn.QArray(
        jnp.asarray(x, jnp.float32), jnp.asarray(q.scale, jnp.float32), jnp.asarray(q.zero_point, jnp.int32)
    )


def tuned_graph(layers: hn.GraphModel) -> Graph:
    """The portable int8-input graph of the (fine-tuned) layers: :func:`hwjax.nn.to_graph`
    (each layer emits its node again: the original names, attributes and quantisation,
    the layers' current int8 kernels and int32 biases) without the quantize in front."""
    return without_quantize_input(hn.to_graph(layers))


def finetune(layers: hn.GraphModel, graph: Graph, x, labels, steps: int, lr: float) -> list[float]:
    """``steps`` Adam steps on softmax cross-entropy of the dequantised outputs (the
    forward pass is the runtime's integers, gradients the surrogates'). Returns the
    loss before each step."""
    optimizer = nnx.Optimizer(layers, optax.adam(lr), wrt=nnx.Param)
    xq, yb = int8_input(graph, x), jnp.asarray(labels)

    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(xq).dequantize(), yb).mean()

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        opt.update(m, grads)
        return loss

    return [float(step(layers, optimizer)) for _ in range(steps)]


def main(argv: Optional[list[str]] = None) -> dict:
    from hwjax.tflite.testing import run_litert

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None, help=".tflite file (default: a random demo model)")
    p.add_argument("--steps", type=int, default=20, help="optax steps (at least 1)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default=None, help="where to write the fine-tuned .tflite (default: not written)")
    args = p.parse_args(argv)

    model = tfl.load(args.model if args.model else demo_model())
    graph, info = model.graph, model.inputs[0]
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (args.batch, *info.shape[1:])).astype(np.int8)
    classes = model.outputs[0].shape[-1]
    labels = rng.integers(0, classes, args.batch)

    layers = hn.from_graph(with_quantize_input(graph), TFLite("reference"))
    forward = nnx.jit(lambda m, xq: m(xq).q)  # the layers' integer outputs (one compilation)
    start = np.asarray(forward(layers, int8_input(graph, x)), np.int64)
    assert np.array_equal(start, np.asarray(model.run(x), np.int64)), "from_graph is not bit-exact"
    losses = finetune(layers, graph, x, labels, args.steps, args.lr)

    tuned = tuned_graph(layers)
    data = tfl.save(tuned, args.out)
    litert = run_litert(data, x, "reference")
    hw_file = np.asarray(tfl.load(data).run(x, runtime="reference"))
    hw_layers = np.asarray(forward(layers, int8_input(graph, x))).astype(np.int8)
    changed = sum(
        int(np.sum(np.asarray(a.params["kernel"]) != np.asarray(b.params["kernel"])))
        for a, b in zip(graph.nodes, tuned.nodes)
        if a.params is not None
    )
    result = {
        "x": x,
        "losses": losses,
        "changed_weights": changed,
        "litert": litert,
        "hwjax_file": hw_file,
        "hwjax_layers": hw_layers,
        "bytes": data,
        "graph": tuned,
        "exact": bool(np.array_equal(litert, hw_file) and np.array_equal(litert, hw_layers)),
    }
    print(
        f"loss {losses[0]:.4f} before, {losses[-1]:.4f} before the last of {args.steps} steps; {changed} int8 "
        "weights changed"
    )
    print(
        f"saved {len(data)} bytes{f' to {args.out}' if args.out else ''}; LiteRT (reference kernels) on "
        f"{len(x)} inputs: {int(np.sum(litert != hw_file))} outputs differ from hwjax's Model.run of the saved file, "
        f"{int(np.sum(litert != hw_layers))} from the fine-tuned layers"
    )
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["exact"] else 1)
