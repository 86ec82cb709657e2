"""Converters (and integer kernels) of TFLite's tensor operators: data movement, shape
chains, MEAN, MUL, DEQUANTIZE."""
