"""Benchmarks: ``python -m hwjax.bench <name>`` (names: see ``BENCHES``).

Each benchmark times its candidates in one run and prints ratios against the plain
XLA baseline and the literal reference measured in that same run.
"""

from hwjax.bench._timing import Timing, time_fn

BENCHES = {
    "mac": "hwjax.bench._mac",
    "xs3": "hwjax.bench._xs3",
    "nvdla": "hwjax.bench._nvdla",
    "train": "hwjax.bench._train",
    "gemmlowp": "hwjax.bench._gemmlowp",
    "deployed": "hwjax.bench._deployed",
    "compile": "hwjax.bench._compile",
    "onnx": "hwjax.bench._onnx",
    "all": "hwjax.bench._all",
}

__all__ = ["BENCHES", "Timing", "time_fn"]
