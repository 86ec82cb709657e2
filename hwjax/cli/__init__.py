"""The ``hwjax run``, ``hwjax compare`` and ``hwjax finetune`` commands on model files.

* :data:`FORMATS`: the file formats read, by suffix (``.tflite``: :mod:`hwjax.tflite`,
  ``.onnx``: :mod:`hwjax.onnx`), each with its runtimes; :func:`register_format` adds one.
* :data:`COMMANDS`: command name -> ``fn(parsed args)`` returning the text to print
  (argparse wiring: ``hwjax.train``'s ``__main__``).
* :func:`compare` (per tensor, how many values each runtime computes differently from a
  reference runtime), :func:`format_compare`, :func:`comparison_json`, :func:`plot_compare`;
  :func:`read_model`, :func:`read_input`, :func:`run_file`.
"""

from hwjax.cli._commands import (
    COMMANDS,
    Comparison,
    LayerDiff,
    RuntimeDiff,
    compare,
    comparison_json,
    format_compare,
    plot_compare,
    read_input,
    read_model,
    run_file,
    runtimes_of,
    short_name,
)
from hwjax.cli._formats import FORMATS, ModelFormat, format_of, register_format

__all__ = [
    "COMMANDS",
    "Comparison",
    "FORMATS",
    "LayerDiff",
    "ModelFormat",
    "RuntimeDiff",
    "compare",
    "comparison_json",
    "format_compare",
    "format_of",
    "plot_compare",
    "read_input",
    "read_model",
    "register_format",
    "run_file",
    "runtimes_of",
    "short_name",
]
