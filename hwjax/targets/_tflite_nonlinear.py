"""TFLite target: the nonlinear op kinds (see :mod:`hwjax.graph.ops.nonlinear`)."""
