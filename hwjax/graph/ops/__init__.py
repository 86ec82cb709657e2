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

Families that TFLite models need (:mod:`.tflite`, :mod:`.tensor`, :mod:`.nonlinear`):
``activation`` (``fn``), ``requantize``, ``reshape`` (``shape``), ``pool`` (``fn``,
``window``, ``strides``, ``padding``), ``pad`` (``paddings``, ``value``), ``concat``
(``axis``), ``mean`` (``axes``, ``keep_dims``, ``count``), ``mul`` / ``square``
(``activation``), ``mul_const`` (``activation``; ``value`` int8 and its quantisation),
``dequantize`` (float32 output), ``softmax`` (``beta``, ``axis``). xformer's XC ops
(:mod:`.xcore`): ``xc_conv2d``, ``xc_pad``, ``xc_pad_3_to_4``, ``xc_slice``,
``xc_mean``, ``xc_add``, ``xc_lookup``, ``xc_maxpool2d``, each with the attributes
and blobs the op's custom options and tensors hold. ONNX models (:mod:`.onnx`, NCHW):
``qlinear_conv``, ``conv_integer``, ``qlinear_matmul``, ``matmul_integer``,
``qlinear_binary``, ``qlinear_avgpool``, ``qlinear_global_avgpool``, ``qlinear_lut``,
``qlinear_concat``, ``onnx_maxpool``, ``onnx_transpose``, ``onnx_concat``,
``onnx_float_binary``, ``onnx_float_unary``. Each op kind's exact semantics is the
docstring of its ``OpSpec``.
"""

from hwjax.graph.ops import basic, elementwise, linear, nonlinear, onnx, pool, tensor, tflite, xcore
