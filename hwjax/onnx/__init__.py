"""ONNX int8 models, run bit-exactly as ONNX Runtime's CPU execution provider runs them.

* :func:`load` reads an ONNX model (QOperator or QDQ format, e.g. from
  ``onnxruntime.quantization.quantize_static``) into a :class:`Model`, applying the QDQ
  rewrites ONNX Runtime applies at ``ORT_ENABLE_ALL`` on x86-64 (:data:`SUPPORTED_OPS`
  after them). ``Model.graph`` is a :class:`hwjax.graph.Graph`.
* ``Model.run(x, runtime="onnxruntime")`` runs a batch as ONNX Runtime 1.32 computes it
  (:class:`hwjax.targets.OnnxRuntime`, whose ``cpu`` option selects the machine).
* :func:`save` writes a model's graph back as a QOperator-format ONNX model that ONNX
  Runtime runs to the same bits.
* :func:`finetune` (or ``Model.trainable(runtime)`` -> optax -> ``Model.with_weights``):
  fine-tuning in ONNX Runtime's exact arithmetic, written back with :func:`save`.

Reading needs the ``onnx`` package; running does not need ONNX Runtime.
"""

from hwjax.onnx._model import RUNTIMES, Model, load
from hwjax.onnx._read import FLOAT_REFUSED, TensorInfo, supported_ops
from hwjax.onnx._save import save
from hwjax.onnx._finetune import finetune, predict, trainable, with_weights

#: ONNX operators :func:`load` converts (after the QDQ rewrites)
SUPPORTED_OPS = supported_ops()

__all__ = [
    "FLOAT_REFUSED",
    "Model",
    "RUNTIMES",
    "SUPPORTED_OPS",
    "TensorInfo",
    "finetune",
    "load",
    "predict",
    "save",
    "trainable",
    "with_weights",
]
