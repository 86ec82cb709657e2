"""The built-in op kinds, one module per family; importing this package registers them.

=================  =======  ==========================================================
op                 inputs   attributes (portable parameters)
=================  =======  ==========================================================
``quantize``       1        -- (float32 input -> int8 with the output tensor's quant)
``flatten``        1        --
``conv``           1        ``features``, ``kernel_size``, ``stride``, ``padding``,
                            ``activation`` (``kernel`` int8 (O, kh, kw, I), ``bias``
                            int32 (O,), ``w_scale`` float32 (O,))
``dense``          1        ``features``, ``activation`` (``kernel`` int8 (O, I), ...)
``depthwise_conv`` 1        ``kernel_size``, ``stride``, ``padding``, ``activation``
                            (``kernel`` int8 (kh, kw, C), ...)
``maxpool``        1        ``window``, ``strides`` (VALID windows)
``avgpool``        1        ``window``, ``strides`` (VALID windows)
``add``            2        ``activation``
``lut``            1        ``fn`` (``"sigmoid"``, ``"tanh"``)
=================  =======  ==========================================================
"""

from hwjax.graph.ops import basic, elementwise, linear, nonlinear, pool, tensor, tflite, xcore  # noqa: F401  (registration)
