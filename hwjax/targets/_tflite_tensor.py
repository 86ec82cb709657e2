"""TFLite target: the tensor op kinds (see :mod:`hwjax.graph.ops.tensor`)."""
