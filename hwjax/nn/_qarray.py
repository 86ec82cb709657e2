"""Quantised activations passed between layers in ``"hardware"`` mode."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hwjax.core import validate as V


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QArray:
    """An integer activation tensor with its affine quantisation.

    ``real = scale * (q - zero_point)``.

    Attributes:
      q: the integer values (int8 range for the targets here), held in a float32
        array so that gradients can flow through the layers' surrogates. The values
        are exact integers; ``q.astype(jnp.int32)`` is lossless.
      scale: float32 scalar, the real value of one integer step.
      zero_point: int32 scalar, the integer that represents real 0.
    """

    q: jax.Array
    scale: jax.Array
    zero_point: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @property
    def ndim(self) -> int:
        return self.q.ndim

    def ints(self, dtype=jnp.int8) -> jax.Array:
        """The integer values as ``dtype`` (default int8); exact."""
        return self.q.astype(dtype)

    def dequantize(self) -> jax.Array:
        """``scale * (q - zero_point)`` in float32."""
        return _dequantize(self.q, self.zero_point, self.scale)

    def with_q(self, q: jax.Array) -> "QArray":
        return QArray(q, self.scale, self.zero_point)


def as_float(x) -> jax.Array:
    """Dequantises a :class:`QArray`; returns any other array (or array-like: a list, a
    NumPy array) as a JAX array, unchanged in value; ArgTypeError for anything else."""
    if isinstance(x, QArray):
        return x.dequantize()
    return V.as_array(x, "x")


@jax.jit
def _dequantize(q, zero_point, scale):
    return (q - zero_point.astype(q.dtype)) * scale
