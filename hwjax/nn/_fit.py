"""The fine-tuning loop shared by every model format: :func:`fit` runs optax over a module of
``hwjax.nn`` layers (a loaded model's modules, e.g. ``hwjax.tflite.Model.trainable``), with
the losses and the batched :func:`predict` it uses."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.nn._qarray import QArray, as_float


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


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax (first maximum) over the flattened output equals the label."""
    pred = np.asarray(outputs).reshape(len(outputs), -1).argmax(axis=1)
    return float(np.mean(pred == np.asarray(labels).reshape(-1)))


@dataclass
class FinetuneResult:
    """What a fine-tuning run returns (:func:`fit`; ``hwjax.tflite.finetune``,
    ``hwjax.onnx.finetune``).

    Attributes:
      model: the tuned model of the format (``Model.with_weights``), ready to save; None from
        :func:`fit` itself.
      trainable: the trained module.
      losses: the mean training loss of each epoch.
      accuracy_before, accuracy_after: top-1 accuracy (argmax of the outputs, ties to the
        first) of the module on the validation data (the training data when no validation is
        given), before the first step and after the last; ``None`` for non-integer labels.
      val_accuracy: the accuracy after each epoch (same data; empty for non-integer labels).
      steps: optimizer steps taken.
    """

    model: Any
    trainable: Any
    losses: list = field(default_factory=list)
    accuracy_before: Optional[float] = None
    accuracy_after: Optional[float] = None
    val_accuracy: list = field(default_factory=list)
    steps: int = 0


def check_int(value, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise RangeError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _labels(y, n: int, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.shape[:1] != (n,):
        raise ShapeError(f"{name} must have {n} rows (one per example), got shape {tuple(y.shape)}")
    return y


def predict(module, x, *, batch_size: int = 256) -> np.ndarray:
    """The outputs of ``module`` (a model of ``hwjax.nn`` layers) for a whole batch ``x``: the
    integer values of a :class:`QArray` output as int32, a float output as float32; computed in
    compiled chunks of ``batch_size`` examples (the last chunk padded with copies of the first
    example, then dropped): one compilation per ``batch_size``."""
    check_int(batch_size, "batch_size", 1)
    x = np.asarray(x)
    n = len(x)
    b = min(batch_size, n)
    fwd = _forward()
    out = []
    for i in range(0, n, b):
        chunk = x[i : i + b]
        if len(chunk) < b:
            chunk = np.concatenate([chunk, np.repeat(x[:1], b - len(chunk), axis=0)])
        out.append(np.asarray(fwd(module, chunk)))
    return np.concatenate(out)[:n]


def _values(y):
    return y.q.astype(jnp.int32) if isinstance(y, QArray) else y


@functools.cache
def _forward():
    """One jitted forward for every :func:`predict` call: a new ``nnx.jit`` per call traced and
    compiled the model again each time (about 8 s for a four-layer model on 2 cores)."""
    return nnx.jit(lambda m, xb: _values(m(xb)))


def fit(
    module,
    x,
    y,
    *,
    optimizer: Any = None,
    loss: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    epochs: int = 1,
    batch_size: int = 32,
    validation: Optional[tuple] = None,
    seed: int = 0,
    progress: bool = True,
) -> FinetuneResult:
    """Trains ``module`` in place with optax on ``(x, y)``.

    Runs ``epochs`` epochs of steps (``nnx.Optimizer(module, optimizer, wrt=nnx.Param)``, one
    jitted step per batch) on ``loss(as_float(module(xb)), yb)``: in ``"hardware"`` mode the
    forward pass is the target's integers and the gradients the layers' float surrogates. Each
    epoch shuffles the examples (NumPy ``default_rng(seed)``) and takes ``len(x) //
    batch_size`` full batches (the remainder is left out of that epoch; with fewer than
    ``batch_size`` examples, one batch of all of them), so every step has the same shape and
    compiles once.

    Args:
      module: an ``nnx.Module`` whose call on a batch returns a :class:`QArray` or a float array.
      x: the training inputs, ``(n, ...)``, as ``module`` takes them.
      y: the targets, ``n`` rows: integer class labels for the default loss.
      optimizer: an ``optax.GradientTransformation``; default ``optax.adam(1e-3)``.
      loss: ``loss(outputs, labels) -> scalar`` on the real-valued outputs (float32, batch
        first) and a batch of ``y``; default :func:`cross_entropy`.
      epochs: passes over the data, >= 1. batch_size: examples per step, >= 1.
      validation: ``(x_val, y_val)`` on which accuracy is measured before, after each epoch,
        and after (integer labels only); default the training data.
      seed: the shuffling seed. progress: show a tqdm progress bar on stderr (when tqdm is
        installed).
    Returns:
      A :class:`FinetuneResult` with ``model`` None.
    """
    import optax

    epochs = check_int(epochs, "epochs", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    seed = check_int(seed, "seed", 0)
    x = np.asarray(x)
    y = _labels(y, len(x), "y")
    if validation is None:
        xv, yv = x, y
    else:
        if not isinstance(validation, (tuple, list)) or len(validation) != 2:
            raise ArgTypeError("validation must be a pair (x_val, y_val)")
        xv = np.asarray(validation[0])
        yv = _labels(validation[1], len(xv), "validation y")
    if optimizer is None:
        optimizer = optax.adam(1e-3)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ArgTypeError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    if not callable(loss):
        raise ArgTypeError(f"loss must be a callable loss(outputs, labels), got {type(loss).__name__}")
    labelled = np.issubdtype(y.dtype, np.integer) and y.ndim == 1
    opt = nnx.Optimizer(module, optimizer, wrt=nnx.Param)

    @nnx.jit
    def step(m, o, xb, yb):
        value, grads = nnx.value_and_grad(lambda mm: loss(as_float(mm(xb)), yb))(m)
        o.update(m, grads)
        return value

    result = FinetuneResult(None, module)
    eval_batch = min(256, len(xv))
    if labelled:
        result.accuracy_before = accuracy(predict(module, xv, batch_size=eval_batch), yv)
    b = min(batch_size, len(x))
    per_epoch = len(x) // b
    rng = np.random.default_rng(seed)
    bar = _bar(epochs * per_epoch, progress)
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(per_epoch):
            idx = order[i * b : (i + 1) * b]
            total += float(step(module, opt, jnp.asarray(x[idx]), jnp.asarray(y[idx])))
            result.steps += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{total / (i + 1):.4f}")
        result.losses.append(total / per_epoch)
        if labelled:
            result.val_accuracy.append(accuracy(predict(module, xv, batch_size=eval_batch), yv))
            if bar is not None:
                bar.set_postfix(epoch=epoch + 1, loss=f"{result.losses[-1]:.4f}", acc=f"{result.val_accuracy[-1]:.3f}")
    if bar is not None:
        bar.close()
    result.accuracy_after = result.val_accuracy[-1] if labelled else None
    return result


def _bar(total: int, progress: bool):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional (the "train" extra)
        return None
    return tqdm(total=total, desc="fine-tuning", unit="step", file=sys.stderr, leave=True)
