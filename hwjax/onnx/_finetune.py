"""Fine-tuning a loaded ONNX model in ONNX Runtime's exact arithmetic.

* :func:`trainable` (``Model.trainable(runtime)``): the model as a
  :class:`hwjax.nn.GraphModel` in ``"hardware"`` mode, one layer per node of
  ``Model.graph`` (QLinearConv and QLinearMatMul / QGemm weights and biases trainable, the
  other nodes frozen): its forward pass is what :meth:`Model.run` computes on ``runtime``, bit
  for bit, and it trains with optax through the layers' float surrogates.
* :func:`with_weights` (``Model.with_weights(tuned)``): the :class:`Model` with the trained
  weights, for :func:`hwjax.onnx.save`.
* :func:`finetune`: :func:`hwjax.nn.fit` from a model and labelled data to the tuned model.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import numpy as np

import hwjax.nn as hn
from hwjax.errors import ArgTypeError, RangeError, ShapeError, UnsupportedOpError
from hwjax.onnx._model import Model


def _check_model(model) -> Model:
    if not isinstance(model, Model):
        raise ArgTypeError(f"model must be a hwjax.onnx.Model (hwjax.onnx.load(path)), got {type(model).__name__}")
    g = model.graph
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedOpError(
            f"fine-tuning takes one-input, one-output models; this one has {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs"
        )
    if model.inputs[0].dtype != "float32" or g.nodes[0].op != "quantize" or g.nodes[0].inputs[0] != g.inputs[0]:
        raise UnsupportedOpError(
            "fine-tuning takes models with a float32 input that a QuantizeLinear reads first "
            f"(input {model.inputs[0].name!r} is {model.inputs[0].dtype})"
        )
    return model


def trainable(model: Model, runtime="onnxruntime") -> hn.GraphModel:
    """``model`` as trainable NNX modules whose forward pass is ``runtime``'s arithmetic.

    Args:
      model: a loaded one-input, one-output :class:`Model` with a float32 input (quantised by
        its first node).
      runtime: one of :data:`hwjax.onnx.RUNTIMES` or a :class:`hwjax.targets.OnnxRuntime`.
    Returns:
      A :class:`hwjax.nn.GraphModel` in ``"hardware"`` mode: ``tuned(x)`` on a float32 batch
      ``(batch, *input_shape[1:])`` returns the output as ``Model.run`` computes it (a float32
      array after a final DequantizeLinear, else a :class:`hwjax.nn.QArray` of the integers).
      Raises :class:`hwjax.errors.UnsupportedOpError` for op kinds without a layer
      (ConvInteger, MatMulInteger).
    """
    _check_model(model)
    return hn.from_graph(model.graph, model.target(runtime))


def with_weights(model: Model, tuned: hn.GraphModel) -> Model:
    """``model`` with ``tuned``'s current weights: a new :class:`Model` whose graph is
    :func:`hwjax.nn.to_graph` of ``tuned`` (the file's node and tensor names, attributes and
    quantisation; the layers' integer weights and int32 biases). ``Model.run`` of the result
    computes exactly ``tuned(x)``, and :func:`hwjax.onnx.save` writes it as a file that ONNX
    Runtime runs to the same bits."""
    _check_model(model)
    if not isinstance(tuned, hn.GraphModel):
        raise ArgTypeError(
            f"tuned must be a hwjax.nn.GraphModel (model.trainable(runtime)), got {type(tuned).__name__}"
        )
    g = hn.to_graph(tuned)
    if set(g.tensors) != set(model.graph.tensors) or g.outputs != model.graph.outputs:
        raise ShapeError("tuned's layers are not this model's (their tensors differ from the model's)")
    return Model(g, model.inputs, model.outputs)


def _as_batch(model: Model, x, name: str) -> np.ndarray:
    per = tuple(model.inputs[0].shape[1:])
    x = np.asarray(x)
    if x.ndim != len(per) + 1 or tuple(x.shape[1:]) != per or x.shape[0] < 1:
        raise ShapeError(f"{name} must have shape (batch >= 1, {', '.join(map(str, per))}), got {tuple(x.shape)}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ArgTypeError(f"{name}: the model's input is float32; got {x.dtype}")
    if not np.all(np.isfinite(x)):
        raise RangeError(f"{name} holds NaN or infinite values")
    return x.astype(np.float32)


def predict(tuned: hn.GraphModel, x, *, batch_size: int = 256) -> np.ndarray:
    """``tuned``'s outputs for a whole batch (float32 after a final DequantizeLinear, else the
    integers as int32), in compiled chunks of ``batch_size`` examples (:func:`hwjax.nn.predict`)."""
    return hn.predict(tuned, x, batch_size=batch_size)


def finetune(
    model: Model,
    x,
    y,
    *,
    runtime="onnxruntime",
    optimizer: Any = None,
    loss: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
    epochs: int = 1,
    batch_size: int = 32,
    validation: Optional[tuple] = None,
    seed: int = 0,
    progress: bool = True,
) -> hn.FinetuneResult:
    """Fine-tunes ``model`` on ``(x, y)`` in ONNX Runtime's exact arithmetic on ``runtime``'s CPU.

    :func:`trainable`, then :func:`hwjax.nn.fit` (optax steps on ``loss(outputs, labels)``, the
    outputs real-valued), then :func:`with_weights`.

    Args:
      model: a loaded :class:`Model` (see :func:`trainable` for which).
      x: float32 training inputs ``(n, *input_shape[1:])``. y: ``n`` integer class labels (for
        the default loss; anything ``loss`` takes otherwise).
      runtime: one of :data:`hwjax.onnx.RUNTIMES` or a :class:`hwjax.targets.OnnxRuntime`.
      optimizer: an ``optax.GradientTransformation``; default ``optax.adam(1e-3)``.
      loss: ``loss(outputs, labels) -> scalar``; default :func:`hwjax.nn.cross_entropy` of the
        outputs as logits.
      epochs, batch_size, validation, seed, progress: as :func:`hwjax.nn.fit`.
    Returns:
      A :class:`hwjax.nn.FinetuneResult`; ``result.model`` is the tuned :class:`Model`.
    """
    _check_model(model)
    x = _as_batch(model, x, "x")
    if isinstance(validation, (tuple, list)) and len(validation) == 2:
        validation = (_as_batch(model, validation[0], "validation x"), validation[1])
    tuned = trainable(model, runtime)
    result = hn.fit(
        tuned,
        x,
        y,
        optimizer=optimizer,
        loss=hn.cross_entropy if loss is None else loss,
        epochs=epochs,
        batch_size=batch_size,
        validation=validation,
        seed=seed,
        progress=progress,
    )
    result.model = with_weights(model, tuned)
    return result
