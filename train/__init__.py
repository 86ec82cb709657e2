"""Hardware-aware training demo and the ``hwjax`` command line (``python -m train``; installed
as ``hwjax.train``)."""

from ._loop import Trainer, calibrate, layer_stats, make_optimizer, make_step

__all__ = ["Trainer", "calibrate", "layer_stats", "make_optimizer", "make_step"]
