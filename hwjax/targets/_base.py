"""Target base class, convolution geometry, LUT tables, and not-yet-landed targets."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np


LUT_FUNCTIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


def lut_function(name: str) -> Callable[[jax.Array], jax.Array]:
    """The float function of a LUT activation name (``"sigmoid"``, ``"tanh"``)."""
    if name not in LUT_FUNCTIONS:
        raise ValueError(f"LUT function must be one of {tuple(LUT_FUNCTIONS)}, got {name!r}")
    return LUT_FUNCTIONS[name]


# ------------------------------------------------------------- exact float division


_LUT_NUMPY = {"sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "tanh": np.tanh}


def _host_lut_table(fn: str, s_in, z_in, s_out, z_out) -> np.ndarray:
    v = np.arange(256)
    v = np.where(v > 127, v - 256, v)  # entry i serves the int8 whose byte is i
    y = _LUT_NUMPY[fn](np.float64(np.float32(s_in)) * (v - int(z_in))) / np.float64(np.float32(s_out))
    return np.clip(np.rint(y) + int(z_out), -128, 127).astype(np.int32)


def lut_table(fn: str, *, s_in, z_in, s_out, z_out) -> jax.Array:
    """A 256-entry int8 activation table, indexed by the input byte ``u8(v)``:
    ``clip(rint(fn(s_in (v - z_in)) / s_out) + z_out, -128, 127)`` for the int8 input
    ``v`` (float64 on the host through ``jax.pure_callback``, so the table does not
    depend on the device's transcendental functions). Returns int32 (256,)."""
    lut_function(fn)  # validates the name
    args = [jnp.asarray(a, d) for a, d in ((s_in, jnp.float32), (z_in, jnp.int32), (s_out, jnp.float32),
                                           (z_out, jnp.int32))]
    return jax.pure_callback(functools.partial(_host_lut_table, fn), jax.ShapeDtypeStruct((256,), jnp.int32),
                             *jax.lax.stop_gradient(args), vmap_method="sequential")


# ------------------------------------------------------------------------ geometry


@dataclass(frozen=True)
class ConvGeometry:
    """Static geometry of one convolution: NHWC input, kernel (kh, kw), stride, padding.

    ``padding`` is explicit ``((top, bottom), (left, right))``; ``out_hw`` follows the
    usual ``(H + top + bottom - kh) // sh + 1`` rule.
    """

    in_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]

    @staticmethod
    def make(in_hw, kernel, stride, padding) -> "ConvGeometry":
        """From ``padding`` = ``"SAME"``, ``"VALID"`` or explicit pairs (XLA's SAME rule)."""
        if isinstance(padding, str):
            pads = jax.lax.padtype_to_pads(tuple(in_hw), tuple(kernel), tuple(stride), padding)
            padding = tuple((int(a), int(b)) for a, b in pads)
        geom = ConvGeometry(tuple(int(v) for v in in_hw), tuple(int(v) for v in kernel),
                            tuple(int(v) for v in stride), tuple(tuple(int(v) for v in p) for p in padding))
        if min(geom.out_hw) < 1:
            raise ValueError(f"convolution of a {in_hw} input with a {kernel} kernel, stride {stride} and "
                             f"padding {padding} has no output pixels")
        return geom

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((self.in_hw[i] + sum(self.padding[i]) - self.kernel[i]) // self.stride[i] + 1
                     for i in range(2))  # type: ignore[return-value]

    @property
    def pad_top_left(self) -> tuple[int, int]:
        return (self.padding[0][0], self.padding[1][0])


def pytree(cls):
    """Registers a frozen dataclass as a pytree: array fields are leaves, the rest static."""
    fields = [f.name for f in dataclasses.fields(cls)]
    meta = [f.name for f in dataclasses.fields(cls) if f.metadata.get("static")]
    data = [f for f in fields if f not in meta]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)


def static():
    return dataclasses.field(metadata={"static": True})


# --------------------------------------------------------------------- base class


@dataclass(frozen=True)
class Target:
    """Base class of hwjax targets (see the module docstring)."""

    name: ClassVar[str] = "target"
    layers: ClassVar[frozenset[str]] = frozenset()
    symmetric_activations: ClassVar[bool] = False
    lut_slopes: ClassVar[bool] = False  # ``lut`` takes float inputs and differentiates with the LUT's slopes

    def check_layer(self, kind: str, **config: Any) -> None:
        """Raises NotImplementedError if this target cannot run a ``kind`` layer with ``config``."""
        always = {"quantize", "flatten"}
        if kind not in self.layers | always:
            raise NotImplementedError(
                f"target {self!r} cannot run a {kind!r} layer; it supports {sorted(self.layers | always)}")

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable identity of the target (written to export manifests)."""
        return {"name": self.name, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


def _not_landed(name: str):
    raise NotImplementedError(f"target {name!r} not landed yet")


@dataclass(frozen=True)
class TFLite(Target):
    """TFLite int8 reference kernels (not landed yet: constructing one raises)."""

    name: ClassVar[str] = "tflite"

    def __post_init__(self):
        _not_landed(self.name)


@dataclass(frozen=True)
class Gemmlowp(Target):
    """gemmlowp uint8 GEMM pipelines (not landed yet: constructing one raises)."""

    name: ClassVar[str] = "gemmlowp"

    def __post_init__(self):
        _not_landed(self.name)


def float_exponent(v: jax.Array) -> jax.Array:
    """frexp exponent ``e`` with ``v = f * 2**e``, ``0.5 <= |f| < 1`` (0 for v = 0)."""
    return jnp.where(v == 0, 0, jnp.frexp(v)[1]).astype(jnp.int32)
