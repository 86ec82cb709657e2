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

import functools
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hwjax.nn as hn
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


def cross_entropy(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of real-valued ``outputs`` (batch, classes) against integer
    ``labels`` (batch,): the default loss of a model whose output is not a SOFTMAX."""
    import optax

    logits = outputs.reshape(outputs.shape[0], -1)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32)).mean()


#: added to the probability :func:`nll` takes the log of (int8 SOFTMAX outputs are multiples of
#: 1/256, so a label's probability is often exactly 0)
P_MIN = 1.0 / 512


def nll(probabilities: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean negative log-likelihood ``-log(p[label] + P_MIN)`` of ``probabilities``
    (batch, classes), the real values of a SOFTMAX output: the default loss of a model ending
    in SOFTMAX (finite, and with a gradient through the SOFTMAX's surrogate, where the label's
    quantised probability is 0)."""
    p = probabilities.reshape(probabilities.shape[0], -1)
    picked = jnp.take_along_axis(p, labels.reshape(-1, 1).astype(jnp.int32), axis=1)[:, 0]
    return -jnp.log(picked + P_MIN).mean()


def default_loss(model: Model) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """:func:`nll` for a model whose last node is a SOFTMAX, else :func:`cross_entropy`."""
    return nll if model.graph.nodes[-1].op == "softmax" else cross_entropy


@dataclass
class FinetuneResult:
    """What :func:`finetune` returns.

    Attributes:
      model: the tuned :class:`Model` (:func:`with_weights`), ready for :func:`hwjax.tflite.save`.
      trainable: the trained :class:`Trainable`.
      losses: the mean training loss of each epoch.
      accuracy_before, accuracy_after: top-1 accuracy (argmax of the output integers, ties to
        the first) of the modules on the validation data (the training data when no validation
        is given), before the first step and after the last; ``None`` for non-integer labels.
      val_accuracy: the accuracy after each epoch (same data; empty for non-integer labels).
      steps: optimizer steps taken.
    """

    model: Model
    trainable: Trainable
    losses: list = field(default_factory=list)
    accuracy_before: Optional[float] = None
    accuracy_after: Optional[float] = None
    val_accuracy: list = field(default_factory=list)
    steps: int = 0


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


def _as_labels(y, n: int, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.shape[:1] != (n,):
        raise ShapeError(f"{name} must have {n} rows (one per example), got shape {tuple(y.shape)}")
    return y


def _check_int(value, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise RangeError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def predict(tuned: Trainable, x, *, batch_size: int = 256) -> np.ndarray:
    """The output integers ``tuned(x).q`` of a whole batch, as an int8 array, computed in
    compiled chunks of ``batch_size`` examples (the last chunk padded with copies of the first
    example, then dropped): one compilation per ``batch_size``."""
    _check_int(batch_size, "batch_size", 1)
    x = np.asarray(x)
    n = len(x)
    b = min(batch_size, n)
    fwd = _forward()
    out = []
    for i in range(0, n, b):
        chunk = x[i : i + b]
        if len(chunk) < b:
            chunk = np.concatenate([chunk, np.repeat(x[:1], b - len(chunk), axis=0)])
        out.append(np.asarray(fwd(tuned, chunk)))
    return np.concatenate(out)[:n].astype(np.int8)


@functools.cache
def _forward():
    """One jitted forward for every :func:`predict` call: a new ``nnx.jit`` per call traced and
    compiled the model again each time (about 8 s for a four-layer model on 2 cores)."""
    return nnx.jit(lambda m, xb: m(xb).q.astype(jnp.int32))


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax (first maximum) over the flattened output equals the label."""
    pred = np.asarray(outputs).reshape(len(outputs), -1).argmax(axis=1)
    return float(np.mean(pred == np.asarray(labels).reshape(-1)))


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
    import optax

    _check_model(model)
    runtime = _runtime_name(runtime)
    epochs = _check_int(epochs, "epochs", 1)
    batch_size = _check_int(batch_size, "batch_size", 1)
    seed = _check_int(seed, "seed", 0)
    x = _as_batch(model, x, "x")
    y = _as_labels(y, len(x), "y")
    if validation is None:
        xv, yv = x, y
    else:
        if not isinstance(validation, (tuple, list)) or len(validation) != 2:
            raise ArgTypeError("validation must be a pair (x_val, y_val)")
        xv = _as_batch(model, validation[0], "validation x")
        yv = _as_labels(validation[1], len(xv), "validation y")
    if optimizer is None:
        optimizer = optax.adam(1e-3)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ArgTypeError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    loss = default_loss(model) if loss is None else loss
    if not callable(loss):
        raise ArgTypeError(f"loss must be a callable loss(outputs, labels), got {type(loss).__name__}")
    labelled = np.issubdtype(y.dtype, np.integer) and y.ndim == 1

    tuned = trainable(model, runtime)
    opt = nnx.Optimizer(tuned, optimizer, wrt=nnx.Param)

    @nnx.jit
    def step(m, o, xb, yb):
        value, grads = nnx.value_and_grad(lambda mm: loss(mm(xb).dequantize(), yb))(m)
        o.update(m, grads)
        return value

    result = FinetuneResult(model, tuned)
    eval_batch = min(256, len(xv))
    if labelled:
        result.accuracy_before = accuracy(predict(tuned, xv, batch_size=eval_batch), yv)
    b = min(batch_size, len(x))
    per_epoch = len(x) // b
    rng = np.random.default_rng(seed)
    bar = _bar(epochs * per_epoch, progress)
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(per_epoch):
            idx = order[i * b : (i + 1) * b]
            total += float(step(tuned, opt, jnp.asarray(x[idx]), jnp.asarray(y[idx])))
            result.steps += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{total / (i + 1):.4f}")
        result.losses.append(total / per_epoch)
        if labelled:
            result.val_accuracy.append(accuracy(predict(tuned, xv, batch_size=eval_batch), yv))
            if bar is not None:
                bar.set_postfix(epoch=epoch + 1, loss=f"{result.losses[-1]:.4f}", acc=f"{result.val_accuracy[-1]:.3f}")
    if bar is not None:
        bar.close()
    result.accuracy_after = result.val_accuracy[-1] if labelled else None
    result.model = with_weights(model, tuned)
    return result


def _bar(total: int, progress: bool):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional (the "train" extra)
        return None
    return tqdm(total=total, desc="fine-tuning", unit="step", file=sys.stderr, leave=True)
