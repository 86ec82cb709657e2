"""The model file formats the ``hwjax run`` / ``compare`` / ``finetune`` commands read: a
registry from file suffix to the package that loads and runs such files."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from hwjax.errors import FormatError


@dataclass(frozen=True)
class ModelFormat:
    """One model file format.

    Attributes:
      suffix: the file name's suffix (``".tflite"``).
      package: the package with ``load(path)`` and the ``Model`` class (imported when first used).
      runtimes_attr: the package's tuple of runtime names ``Model.run`` takes; the first is the
        default ``--runtime`` and ``--reference``.
      finetune: whether ``hwjax finetune`` takes such files (the package then has
        ``finetune``, ``predict`` and ``save`` like :mod:`hwjax.tflite`).
    """

    suffix: str
    package: str
    runtimes_attr: str
    finetune: bool

    @property
    def module(self):
        return importlib.import_module(self.package)

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(getattr(self.module, self.runtimes_attr))

    @property
    def reference(self) -> str:
        return self.runtimes[0]


#: suffix -> :class:`ModelFormat`
FORMATS: dict[str, ModelFormat] = {}


def register_format(fmt: ModelFormat) -> ModelFormat:
    FORMATS[fmt.suffix] = fmt
    return fmt


register_format(ModelFormat(".tflite", "hwjax.tflite", "MODEL_RUNTIMES", finetune=True))
register_format(ModelFormat(".onnx", "hwjax.onnx", "RUNTIMES", finetune=True))


def format_of(path) -> ModelFormat:
    """The :class:`ModelFormat` of a model file, by its suffix; FormatError naming ``MODEL``
    and the suffixes read otherwise."""
    suffix = os.path.splitext(str(path))[1].lower()
    if suffix not in FORMATS:
        raise FormatError(f"MODEL {str(path)!r}: hwjax reads {', '.join(FORMATS)} files, got {suffix or 'no suffix'!r}")
    return FORMATS[suffix]


def format_of_model(model) -> ModelFormat:
    """The :class:`ModelFormat` whose package's ``Model`` class ``model`` is."""
    for fmt in FORMATS.values():
        if type(model).__module__.startswith(fmt.package + "."):
            return fmt
    raise FormatError(f"model: a Model of {', '.join(f.package for f in FORMATS.values())}, got {type(model).__name__}")
