"""Model definitions for the demos: plain Flax NNX modules built from ``hwjax.nn`` layers.

Every model takes the target it is trained for; ``build(name, target, rngs=...)``
builds one by name (``"cnn"``, ``"mlp"``, ``"lut_mlp"``). ``learn_scale=True`` gives the
requantising layers a learned (LSQ-style) output step size for hardware-aware training.
"""

from __future__ import annotations

from typing import Callable

from flax import nnx

import hwjax.nn as hn


class DigitsCNN(hn.Sequential):
    """Small CNN for 8x8x1 images, 10 classes (~7k parameters).

    Quantize -> Conv 3x3 (16, ReLU) -> Conv 3x3 stride 2 (32, ReLU) -> MaxPool 2x2
    -> Flatten (128) -> Dense (10).
    """

    input_shape = (8, 8, 1)

    def __init__(self, target, *, rngs: nnx.Rngs, width: int = 16, classes: int = 10, learn_scale: bool = False):
        ls = {"learn_scale": learn_scale}
        super().__init__(
            {
                "input": hn.Quantize(target=target),
                "conv1": hn.Conv(1, width, 3, activation="relu", target=target, rngs=rngs, **ls),
                "conv2": hn.Conv(width, 2 * width, 3, strides=2, activation="relu", target=target, rngs=rngs, **ls),
                "pool": hn.MaxPool(2, target=target),
                "flatten": hn.Flatten(target=target),
                "logits": hn.Dense(2 * width * 4, classes, target=target, rngs=rngs, **ls),
            }
        )


class DigitsMLP(hn.Sequential):
    """MLP on flattened 8x8 images: Quantize -> Dense 64 (ReLU) -> Dense 32 (ReLU) -> Dense 10."""

    input_shape = (64,)

    def __init__(
        self,
        target,
        *,
        rngs: nnx.Rngs,
        hidden: tuple[int, ...] = (64, 32),
        classes: int = 10,
        in_features: int = 64,
        learn_scale: bool = False,
    ):
        layers: dict = {"input": hn.Quantize(target=target)}
        n = in_features
        for i, h in enumerate(hidden):
            layers[f"dense{i + 1}"] = hn.Dense(
                n, h, activation="relu", target=target, rngs=rngs, learn_scale=learn_scale
            )
            n = h
        layers["logits"] = hn.Dense(n, classes, target=target, rngs=rngs, learn_scale=learn_scale)
        super().__init__(layers)


class LutMLP(hn.Sequential):
    """MLP with table-lookup activations: Quantize -> [Dense -> LutActivation(fn)] x 2 -> Dense 10.

    ``fn`` is ``"tanh"`` (default) or ``"sigmoid"``; on NVDLA the activations run on the
    SDP LUT, on XS3 as ``lookup8`` tables.
    """

    input_shape = (64,)

    def __init__(
        self,
        target,
        *,
        rngs: nnx.Rngs,
        fn: str = "tanh",
        hidden: tuple[int, ...] = (64, 32),
        classes: int = 10,
        in_features: int = 64,
        learn_scale: bool = False,
    ):
        layers: dict = {"input": hn.Quantize(target=target)}
        n = in_features
        for i, h in enumerate(hidden):
            layers[f"dense{i + 1}"] = hn.Dense(n, h, target=target, rngs=rngs, learn_scale=learn_scale)
            layers[f"act{i + 1}"] = hn.LutActivation(fn, target=target, learn_scale=learn_scale)
            n = h
        layers["logits"] = hn.Dense(n, classes, target=target, rngs=rngs, learn_scale=learn_scale)
        super().__init__(layers)


MODELS: dict[str, Callable[..., hn.Sequential]] = {"cnn": DigitsCNN, "mlp": DigitsMLP, "lut_mlp": LutMLP}


def build(name: str, target, *, rngs: nnx.Rngs, **kwargs) -> hn.Sequential:
    """Builds the model ``name`` (one of ``MODELS``) for ``target``."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {tuple(MODELS)}, got {name!r}")
    return MODELS[name](target, rngs=rngs, **kwargs)


__all__ = ["DigitsCNN", "DigitsMLP", "LutMLP", "MODELS", "build"]
