"""Converters (and integer kernels) of TFLite's nonlinear operators: SOFTMAX, LOGISTIC, TANH."""
