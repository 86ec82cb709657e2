"""Fine-tuning a loaded ``.tflite`` model in a runtime's exact arithmetic.

* :func:`trainable` (``Model.trainable(runtime)``): the model as NNX modules
  (:class:`Trainable`) that take the file's own input and whose forward pass is the runtime's
  integers, bit for bit, trainable with optax through :mod:`hwjax.nn`'s surrogates.
* :func:`with_weights` (``Model.with_weights(trainable)``): the :class:`Model` again with the
  trained weights, for :func:`hwjax.tflite.save`.
* :func:`finetune`: the optax loop (shuffled mini-batches, a progress bar) from a model and
  labelled data to the tuned :class:`Model`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hwjax.nn as hn
from hwjax.nn import P_MIN, FinetuneResult, accuracy, cross_entropy, nll  # noqa: F401  (this module's API)
from hwjax.errors import ArgTypeError, RangeError, ShapeError, UnsupportedOpError
from hwjax.graph import Graph, Node, Tensor
from hwjax.tflite._model import MODEL_RUNTIMES, Model

#: name of the float tensor put in front of an int8-input graph for :func:`hwjax.nn.from_graph`
FRONT = "float_input"


def _runtime_name(runtime) -> str:
    if not isinstance(runtime, str) or runtime not in MODEL_RUNTIMES:
        raise RangeError(f"runtime must be one of {MODEL_RUNTIMES}, got {runtime!r}")
    return runtime


def _check_model(model) -> Model:
    if not isinstance(model, Model):
        raise ArgTypeError(f"model must be a hwjax.tflite.Model (hwjax.tflite.load(path)), got {type(model).__name__}")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedOpError(
            f"fine-tuning takes one-input, one-output models; this one has {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs"
        )
    if any(n.op.startswith("xc_") for n in model.graph.nodes):
        raise UnsupportedOpError(
            "the model is an xformer-converted file (XC operators), which hwjax.nn has no layers for: "
            "fine-tune the original model with runtime='xs3' (xformer's arithmetic) and convert the result"
        )
    return model


class Trainable(nnx.Module):
    """A loaded model as NNX modules for ``runtime``: ``layers`` is the
    :class:`hwjax.nn.GraphModel` that :func:`hwjax.nn.from_graph` builds (one layer per node,
    in ``"hardware"`` mode), called on the file's own input.

    ``trainable(x)`` takes a batch as :meth:`Model.run` does (``(batch, *input_shape[1:])``:
    int8 values for an int8 input, float32 for a float interface) and returns a
    :class:`hwjax.nn.QArray`: ``.q`` holds the output's int8 values, exactly the integers
    ``Model.run(x, runtime=runtime)`` gives, and ``.dequantize()`` the real values whose
    gradients are the layers' float surrogates. An int8 input enters as a QArray with the
    input tensor's scale and zero point, which the ``Quantize`` layer in front passes through,
    so the layers see the file's integers.

    Attributes: ``layers``, ``runtime`` (the name), ``int_input`` (the file's input is int8),
    ``input_name`` (the file's input tensor), ``input_scale`` / ``input_zero_point`` (its
    quantisation, for an int8 input).
    """

    def __init__(self, model: Model, runtime: str = "reference"):
        _check_model(model)
        self.runtime = _runtime_name(runtime)
        graph = model.graph
        info = model.inputs[0]
        self.input_name = graph.inputs[0]
        self.int_input = info.dtype != "float32"
        if info.dtype not in ("int8", "float32"):
            raise UnsupportedOpError(f"fine-tuning takes int8 or float32 inputs; input {info.name!r} is {info.dtype}")
        if self.int_input:
            q = graph.tensors[self.input_name].quant
            self.input_scale = float(np.asarray(q.scale, np.float32).reshape(-1)[0])
            self.input_zero_point = int(np.asarray(q.zero_point).reshape(-1)[0])
            graph = _with_front_quantize(graph)
        elif graph.nodes[0].op != "quantize" or graph.nodes[0].inputs[0] != self.input_name:
            raise UnsupportedOpError("a float-input model must start with its QUANTIZE to be fine-tuned")
        self.layers = hn.from_graph(graph, model.target(runtime))

    def __call__(self, x) -> hn.QArray:
        if self.int_input:
            x = hn.QArray(
                jnp.asarray(x).astype(jnp.float32),
                jnp.float32(self.input_scale),
                jnp.int32(self.input_zero_point),
            )
        else:
            x = jnp.asarray(x, jnp.float32)
        return self.layers(x)


def _with_front_quantize(graph: Graph) -> Graph:
    """``graph`` with a float32 input :data:`FRONT` and a ``quantize`` node writing its int8
    input tensor: the model input layer :func:`hwjax.nn.from_graph` expects."""
    inp = graph.tensors[graph.inputs[0]]
    if FRONT in graph.tensors:
        raise RangeError(f"the model already has a tensor named {FRONT!r}")
    front = Tensor(FRONT, inp.shape, "float32", None)
    node = Node("quantize", (FRONT,), (inp.name,), {}, None)
    return Graph({FRONT: front, **graph.tensors}, (node, *graph.nodes), (FRONT,), graph.outputs).validate()


def trainable(model: Model, runtime: str = "reference") -> Trainable:
    """``model`` as trainable NNX modules whose forward pass is ``runtime``'s arithmetic.

    Args:
      model: a loaded one-input, one-output :class:`Model` with an int8 or float32 input
        (an original model; xformer-converted files have no layers).
      runtime: one of :data:`hwjax.tflite.MODEL_RUNTIMES`; ``"xs3"`` is the model compiled as
        xformer compiles it (:class:`hwjax.targets.XS3Compiled`).
    Returns:
      A :class:`Trainable`. Raises :class:`hwjax.errors.UnsupportedOpError` for ops that have no
      :mod:`hwjax.nn` layer or that ``runtime`` does not run.
    """
    return Trainable(model, runtime)


def with_weights(model: Model, tuned: Trainable) -> Model:
    """``model`` with ``tuned``'s current weights: a new :class:`Model` whose graph is
    :func:`hwjax.nn.to_graph` of ``tuned.layers`` (the file's node and tensor names, attributes
    and quantisation; the layers' int8 kernels and int32 biases), the quantize in front of an
    int8 input removed again; inputs, outputs and metadata are ``model``'s. ``Model.run`` of the
    result on ``tuned.runtime`` computes exactly ``tuned(x).q``, and :func:`hwjax.tflite.save`
    writes it as a file."""
    _check_model(model)
    if not isinstance(tuned, Trainable):
        raise ArgTypeError(
            f"tuned must be a hwjax.tflite.Trainable (model.trainable(runtime)), got {type(tuned).__name__}"
        )
    g = hn.to_graph(tuned.layers)
    if tuned.int_input:
        first = g.nodes[0]
        tensors = {k: v for k, v in g.tensors.items() if k != first.inputs[0]}
        g = Graph(tensors, g.nodes[1:], first.outputs, g.outputs)
    elif g.inputs[0] != tuned.input_name:  # to_graph names the float input FRONT
        old, new = g.inputs[0], tuned.input_name
        t = g.tensors[old]
        tensors = {new: Tensor(new, t.shape, t.dtype, t.quant), **{k: v for k, v in g.tensors.items() if k != old}}
        nodes = tuple(replace(n, inputs=tuple(new if i == old else i for i in n.inputs)) for n in g.nodes)
        g = Graph(tensors, nodes, (new,), g.outputs)
    g = g.validate()
    if set(g.tensors) != set(model.graph.tensors) or g.outputs != model.graph.outputs:
        raise ShapeError("tuned's layers are not this model's (their tensors differ from the model's)")
    return Model(g, model.inputs, model.outputs, model.metadata)


# ---------------------------------------------------------------------------- the loop


def default_loss(model: Model) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """:func:`nll` for a model whose last node is a SOFTMAX, else :func:`cross_entropy`."""
    return nll if model.graph.nodes[-1].op == "softmax" else cross_entropy


def _as_batch(model: Model, x, name: str) -> np.ndarray:
    info = model.inputs[0]
    x = np.asarray(x)
    per = tuple(info.shape[1:])
    if x.ndim != len(per) + 1 or tuple(x.shape[1:]) != per or x.shape[0] < 1:
        raise ShapeError(f"{name} must have shape (batch >= 1, {', '.join(map(str, per))}), got {tuple(x.shape)}")
    if info.dtype == "float32":
        if not np.issubdtype(x.dtype, np.floating):
            raise ArgTypeError(f"{name}: the model's input is float32; got {x.dtype}")
        if not np.all(np.isfinite(x)):
            raise RangeError(f"{name} holds NaN or infinite values")
        return x.astype(np.float32)
    if not np.issubdtype(x.dtype, np.integer):
        raise ArgTypeError(f"{name}: the model's input is int8; pass int8 values, got {x.dtype}")
    if int(x.min()) < -128 or int(x.max()) > 127:
        raise RangeError(f"{name} holds values outside int8 [-128, 127]")
    return x.astype(np.int8)


def predict(tuned: Trainable, x, *, batch_size: int = 256) -> np.ndarray:
    """The output integers ``tuned(x).q`` of a whole batch, as an int8 array, computed in
    compiled chunks of ``batch_size`` examples (:func:`hwjax.nn.predict`)."""
    return hn.predict(tuned, x, batch_size=batch_size).astype(np.int8)


def finetune(
    model: Model,
    x,
    y,
    *,
    runtime: str = "reference",
    optimizer: Any = None,
    loss: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
    epochs: int = 1,
    batch_size: int = 32,
    validation: Optional[tuple] = None,
    seed: int = 0,
    progress: bool = True,
) -> FinetuneResult:
    """Fine-tunes ``model`` on ``(x, y)`` in ``runtime``'s exact arithmetic.

    Builds ``model.trainable(runtime)`` and runs ``epochs`` epochs of optax steps
    (``nnx.Optimizer(trainable, optimizer, wrt=nnx.Param)``, one jitted step per batch) on
    ``loss(trainable(xb).dequantize(), yb)``: the forward pass is the runtime's integers, the
    gradients the layers' float surrogates. Each epoch shuffles the examples (NumPy
    ``default_rng(seed)``) and takes ``len(x) // batch_size`` full batches (the remainder is
    left out of that epoch; with fewer than ``batch_size`` examples, one batch of all of them),
    so every step has the same shape and compiles once.

    Args:
      model: a loaded :class:`Model` (see :func:`trainable` for which).
      x: the training inputs as :meth:`Model.run` takes them, ``(n, *input_shape[1:])``: int8
        values (any integer dtype) for an int8 input, float32 for a float interface.
      y: the targets, ``n`` rows: integer class labels for the default losses, anything
        ``loss`` takes otherwise.
      runtime: one of :data:`hwjax.tflite.MODEL_RUNTIMES`.
      optimizer: an ``optax.GradientTransformation``; default ``optax.adam(1e-3)``.
      loss: ``loss(outputs, labels) -> scalar`` on the dequantised outputs (float32, with the
        batch axis) and a batch of ``y``; default :func:`default_loss` (:func:`nll` after a
        SOFTMAX, :func:`cross_entropy` otherwise).
      epochs: passes over the data, >= 1. batch_size: examples per step, >= 1.
      validation: ``(x_val, y_val)`` on which accuracy is measured before, after each epoch,
        and after; default the training data.
      seed: the shuffling seed. progress: show a tqdm progress bar on stderr (when tqdm is
        installed).
    Returns:
      A :class:`FinetuneResult`; ``result.model`` is the tuned model (:func:`with_weights`).
    """
    _check_model(model)
    runtime = _runtime_name(runtime)
    x = _as_batch(model, x, "x")
    if isinstance(validation, (tuple, list)) and len(validation) == 2:
        validation = (_as_batch(model, validation[0], "validation x"), validation[1])
    tuned = trainable(model, runtime)
    result = hn.fit(
        tuned,
        x,
        y,
        optimizer=optimizer,
        loss=default_loss(model) if loss is None else loss,
        epochs=epochs,
        batch_size=batch_size,
        validation=validation,
        seed=seed,
        progress=progress,
    )
    result.model = with_weights(model, tuned)
    return result
