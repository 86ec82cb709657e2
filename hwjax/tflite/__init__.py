"""``.tflite`` files: read, run per runtime, write back (spec deployed.md).

* :func:`load` reads an int8 ``.tflite`` file into a :class:`Model` (``Model.graph`` is a
  :class:`hwjax.graph.Graph`); ``Model.run(x, runtime=...)`` runs a batch bit-exactly as
  the runtime does (the targets :class:`hwjax.targets.TFLite` and, for ``"xs3"``,
  :class:`hwjax.targets.XS3Runtime` / :class:`hwjax.targets.XS3Compiled`).
* :func:`save` writes a graph back as a ``.tflite`` file.
* :func:`finetune` (or ``Model.trainable(runtime)`` -> optax -> ``Model.with_weights``):
  fine-tuning in a runtime's exact arithmetic, written back with :func:`save`.
* The ``hwjax run`` / ``compare`` / ``finetune`` commands are :mod:`hwjax.cli`.

The runtimes' integer arithmetic (requantisation, kernels, tables) is :mod:`hwjax.litert`;
its names are still reachable here (``hwjax.tflite.fully_connected`` ...) with a
:class:`DeprecationWarning`.
"""

import warnings as _warnings

from hwjax.graph import PRE_ACTIVATION  # (suffix of a fused activation's input tensor)
from hwjax.tflite._import import TensorInfo
from hwjax.tflite._model import CHUNK_BYTES, MODEL_RUNTIMES, RUNTIMES, SUPPORTED_OPS, Model, batch_chunk, load
from hwjax.tflite._save import save
from hwjax.tflite._finetune import (
    FinetuneResult,
    Trainable,
    accuracy,
    cross_entropy,
    default_loss,
    finetune,
    nll,
    predict,
    trainable,
    with_weights,
)

__all__ = [
    "CHUNK_BYTES",
    "FinetuneResult",
    "MODEL_RUNTIMES",
    "Model",
    "PRE_ACTIVATION",
    "RUNTIMES",
    "SUPPORTED_OPS",
    "TensorInfo",
    "Trainable",
    "accuracy",
    "batch_chunk",
    "cross_entropy",
    "default_loss",
    "finetune",
    "load",
    "nll",
    "predict",
    "save",
    "trainable",
    "with_weights",
]


def __getattr__(name: str):
    """The arithmetic names that moved to :mod:`hwjax.litert`, with a DeprecationWarning."""
    import hwjax.litert as _litert

    if name in _litert.__all__:
        _warnings.warn(
            f"hwjax.tflite.{name} moved to hwjax.litert.{name}; the old path will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_litert, name)
    raise AttributeError(f"module 'hwjax.tflite' has no attribute {name!r}")
