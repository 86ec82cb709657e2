"""gemmlowp output stages (spec §1.3) as small frozen dataclasses that are JAX pytrees.

Numeric fields are pytree leaves (they may be traced or batched by ``vmap``); string
fields (vector shapes, overflow behaviour) are static. Values are checked when the
stage is applied and the value is concrete; under ``jit`` traced values are the
caller's contract (ranges stated per stage).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.gemmlowp._fixedpoint import INT32_MAX, INT32_MIN, _rdbpot_int, _shift_left_int, _srdhm_int

_I32 = jnp.int32
_SHAPES = ("row", "col")


def _pytree(cls=None, *, meta: tuple[str, ...] = ()):
    """A frozen dataclass registered as a pytree: numeric fields are children, ``meta``
    fields are static. The auxiliary data holds the class itself, because JAX compares
    the tree structures of two registered dataclasses with the same static values as
    equal even when their classes differ (e.g. two field-less cast stages), which would
    let ``jit`` reuse one stage's compiled program for another."""

    def wrap(c):
        c = dataclasses.dataclass(frozen=True)(c)
        fields = [f.name for f in dataclasses.fields(c)]
        data = [f for f in fields if f not in meta]

        def flatten(obj):
            return [getattr(obj, f) for f in data], (c, tuple(getattr(obj, m) for m in meta))

        def unflatten(aux, children):
            obj = object.__new__(c)
            for name, value in zip(data, children):
                object.__setattr__(obj, name, value)
            for name, value in zip(meta, aux[1]):
                object.__setattr__(obj, name, value)
            return obj

        jax.tree_util.register_pytree_node(c, flatten, unflatten)
        return c

    return wrap if cls is None else wrap(cls)


def _scalar(value: Any, lo: int, hi: int, name: str) -> jax.Array:
    """An int32 scalar stage parameter (Python/NumPy int, 0-d array or tracer)."""
    a = value if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if isinstance(value, bool) or a.shape != () or not jnp.issubdtype(a.dtype, jnp.integer):
        raise ArgTypeError(f"{name} must be an integer scalar in [{lo}, {hi}], got {value!r}")
    V.check_range(a, lo, hi, name)
    return _to_i32(a)


def _to_i32(a) -> jax.Array:
    if isinstance(a, jax.core.Tracer):
        return a.astype(_I32)
    return jax.device_put(np.asarray(a).astype(np.int32))  # (jnp.asarray compiles a copy program)


def _vector(value: Any, length: int, lo: int, hi: int, name: str) -> jax.Array:
    a = value if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if a.ndim != 1 or not jnp.issubdtype(a.dtype, jnp.integer):
        raise ArgTypeError(f"{name} must be a 1-D integer vector of length {length}, got {a.dtype}{list(a.shape)}")
    if a.shape[0] != length:
        raise ShapeError(f"{name} must have length {length}, got {a.shape[0]}")
    V.check_range(a, lo, hi, name)
    return _to_i32(a)


def _per_channel(value: Any, shape: str, acc_shape: tuple, lo: int, hi: int, name: str) -> jax.Array:
    """A vector indexed by row (``"col"`` shape) or by column (``"row"`` shape),
    broadcastable against an accumulator of shape (rows, cols)."""
    V.check_choice(shape, _SHAPES, f"{name} shape")
    rows, cols = acc_shape[-2], acc_shape[-1]
    if shape == "col":
        return _vector(value, rows, lo, hi, f"{name} (column-shaped: one per row)")[:, None]
    return _vector(value, cols, lo, hi, f"{name} (row-shaped: one per column)")[None, :]


class _Stage:
    """``stage(x)`` = ``_apply(x, _params(x.shape))``: ``_params`` converts and checks the
    parameters (concrete values only), ``_apply`` computes on int32 ``x``."""

    def _params(self, acc_shape: tuple) -> tuple:
        return ()

    def _apply(self, x: jax.Array, p: tuple) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        return self._apply(x, self._params(x.shape))


@_pytree
class QuantizeDownInt32ToUint8Scale(_Stage):
    """``y = RDBPOT(wrap32(wrap32(x + result_offset) * result_mult_int), result_shift)``.

    Output int32; nothing is clamped despite the name (follow with
    :class:`SaturatingCastToUint8` for the legacy pipeline). The product wraps modulo
    2**32; rounding is to nearest with ties away from zero (``RDBPOT``; gemmlowp before
    2017-01-10 rounded ties toward +inf). ``result_offset`` and ``result_mult_int`` are
    int32 scalars, ``result_shift`` in 0..31.
    """

    result_offset: Any
    result_mult_int: Any
    result_shift: Any

    def _params(self, acc_shape):
        return (
            _scalar(self.result_offset, INT32_MIN, INT32_MAX, "result_offset"),
            _scalar(self.result_mult_int, INT32_MIN, INT32_MAX, "result_mult_int"),
            _scalar(self.result_shift, 0, 31, "result_shift"),
        )

    def _apply(self, x, p):
        off, mult, shift = p
        return _rdbpot_int((x + off) * mult, shift)


@_pytree(meta=("shape",))
class QuantizeDownInt32ToUint8ScalePC(_Stage):
    """:class:`QuantizeDownInt32ToUint8Scale` with per-channel ``result_offset`` and
    ``result_mult_int`` vectors: ``shape="col"`` indexes them by row (length rows),
    ``shape="row"`` by column (length cols). ``result_shift`` stays a scalar (0..31).
    """

    result_offset: Any
    result_mult_int: Any
    result_shift: Any
    shape: str = "row"

    def _params(self, acc_shape):
        return (
            _per_channel(self.result_offset, self.shape, acc_shape, INT32_MIN, INT32_MAX, "result_offset"),
            _per_channel(self.result_mult_int, self.shape, acc_shape, INT32_MIN, INT32_MAX, "result_mult_int"),
            _scalar(self.result_shift, 0, 31, "result_shift"),
        )

    def _apply(self, x, p):
        off, mult, shift = p
        return _rdbpot_int((x + off) * mult, shift)


@_pytree
class QuantizeDownInt32ByFixedPoint(_Stage):
    """``y = wrap32(RDBPOT(SRDHM(x, m), result_shift) + result_offset_after_shift)``.

    ``m = result_fixedpoint_multiplier`` (int32), ``result_shift`` in 0..31, the offset
    (int32) is added after scaling. ``SRDHM`` rounds ties toward +inf, ``RDBPOT`` away
    from zero. (Old name ``QuantizeDownInt32ToUint8ScaleByFixedPoint``.)
    """

    result_fixedpoint_multiplier: Any
    result_shift: Any
    result_offset_after_shift: Any

    def _params(self, acc_shape):
        return (
            _scalar(self.result_fixedpoint_multiplier, INT32_MIN, INT32_MAX, "result_fixedpoint_multiplier"),
            _scalar(self.result_shift, 0, 31, "result_shift"),
            _scalar(self.result_offset_after_shift, INT32_MIN, INT32_MAX, "result_offset_after_shift"),
        )

    def _apply(self, x, p):
        m, s, o = p
        return _rdbpot_int(_srdhm_int(x, m), s) + o


def _scale_by_fixed_point_and_exponent(x, m, e, o, overflow):
    ls = jnp.maximum(e, 0)
    rs = jnp.maximum(-e, 0)
    return _rdbpot_int(_srdhm_int(_shift_left_int(x, ls, overflow), m), rs) + o


_OVERFLOWS = ("saturate", "wrap")


@_pytree(meta=("shift_left_overflow",))
class ScaleInt32ByFixedPointAndExponent(_Stage):
    """``ls = max(e, 0); rs = max(-e, 0)``,
    ``y = wrap32(RDBPOT(SRDHM(SHL(x, ls), m), rs) + result_offset_after_shift)``.

    ``m = result_fixedpoint_multiplier`` (int32), ``e = result_exponent`` in -31..31.
    ``SHL(x, ls) = x * 2**ls`` when it fits int32; on overflow it saturates to
    INT32_MIN/INT32_MAX with ``shift_left_overflow="saturate"`` (default: gemmlowp's
    scalar reference build) or wraps modulo 2**32 with ``"wrap"`` (gemmlowp's SIMD
    registers; TFLite's double-rounding ``MultiplyByQuantizedMultiplier``). gemmlowp's
    SSE4 build mixes both by output position; that mixture is not reproduced.
    """

    result_fixedpoint_multiplier: Any
    result_exponent: Any
    result_offset_after_shift: Any
    shift_left_overflow: str = "saturate"

    def _params(self, acc_shape):
        V.check_choice(self.shift_left_overflow, _OVERFLOWS, "shift_left_overflow")
        return (
            _scalar(self.result_fixedpoint_multiplier, INT32_MIN, INT32_MAX, "result_fixedpoint_multiplier"),
            _scalar(self.result_exponent, -31, 31, "result_exponent"),
            _scalar(self.result_offset_after_shift, INT32_MIN, INT32_MAX, "result_offset_after_shift"),
        )

    def _apply(self, x, p):
        return _scale_by_fixed_point_and_exponent(x, *p, self.shift_left_overflow)


@_pytree(meta=("shape", "shift_left_overflow"))
class ScaleInt32ByFixedPointAndExponentPC(_Stage):
    """:class:`ScaleInt32ByFixedPointAndExponent` with per-channel multiplier and exponent
    vectors (``shape="col"``: one per row; ``"row"``: one per column); the offset is a
    scalar. Exponents in -31..31.
    """

    result_fixedpoint_multiplier: Any
    result_exponent: Any
    result_offset_after_shift: Any
    shape: str = "row"
    shift_left_overflow: str = "saturate"

    def _params(self, acc_shape):
        V.check_choice(self.shift_left_overflow, _OVERFLOWS, "shift_left_overflow")
        return (
            _per_channel(
                self.result_fixedpoint_multiplier,
                self.shape,
                acc_shape,
                INT32_MIN,
                INT32_MAX,
                "result_fixedpoint_multiplier",
            ),
            _per_channel(self.result_exponent, self.shape, acc_shape, -31, 31, "result_exponent"),
            _scalar(self.result_offset_after_shift, INT32_MIN, INT32_MAX, "result_offset_after_shift"),
        )

    def _apply(self, x, p):
        return _scale_by_fixed_point_and_exponent(x, *p, self.shift_left_overflow)


@_pytree(meta=("shape",))
class BiasAddition(_Stage):
    """``y = wrap32(x + bias[c])`` for a row-shaped vector (``shape="row"``, default,
    length cols) or ``wrap32(x + bias[r])`` for a column-shaped one (``shape="col"``,
    length rows). int32 values."""

    bias: Any
    shape: str = "row"

    def _params(self, acc_shape):
        return (_per_channel(self.bias, self.shape, acc_shape, INT32_MIN, INT32_MAX, "bias"),)

    def _apply(self, x, p):
        return x + p[0]


@_pytree
class Clamp(_Stage):
    """``y = min(max(x, min), max)`` (the lower bound first: ``min > max`` yields ``max``);
    int32 bounds."""

    min: Any
    max: Any

    def _params(self, acc_shape):
        return (_scalar(self.min, INT32_MIN, INT32_MAX, "min"), _scalar(self.max, INT32_MIN, INT32_MAX, "max"))

    def _apply(self, x, p):
        return jnp.minimum(jnp.maximum(x, p[0]), p[1])


@_pytree
class SaturatingCastToUint8(_Stage):
    """``clamp(x, 0, 255)`` as uint8. A cast stage must be the last stage."""

    def _apply(self, x, p):
        return jnp.clip(x, 0, 255).astype(jnp.uint8)


@_pytree
class SaturatingCastToInt8(_Stage):
    """``clamp(x, -128, 127)`` as int8. A cast stage must be the last stage."""

    def _apply(self, x, p):
        return jnp.clip(x, -128, 127).astype(jnp.int8)


@_pytree
class SaturatingCastToInt16(_Stage):
    """``clamp(x, -32768, 32767)`` as int16. A cast stage must be the last stage."""

    def _apply(self, x, p):
        return jnp.clip(x, -32768, 32767).astype(jnp.int16)


@_pytree
class TruncatingCastToUint8(_Stage):
    """Narrowing to uint8 without clamping: the low 8 bits of ``x`` (upstream's contract
    requires ``x`` in 0..255 already, where it is the identity). Must be the last stage."""

    def _apply(self, x, p):
        return (x & 0xFF).astype(jnp.uint8)


OutputStage = (
    QuantizeDownInt32ToUint8Scale,
    QuantizeDownInt32ToUint8ScalePC,
    QuantizeDownInt32ByFixedPoint,
    ScaleInt32ByFixedPointAndExponent,
    ScaleInt32ByFixedPointAndExponentPC,
    BiasAddition,
    Clamp,
    SaturatingCastToUint8,
    SaturatingCastToInt8,
    SaturatingCastToInt16,
    TruncatingCastToUint8,
)
_CASTS = (SaturatingCastToUint8, SaturatingCastToInt8, SaturatingCastToInt16, TruncatingCastToUint8)


def check_output_stages(output_stages) -> tuple:
    """Validates a pipeline: a sequence of stage objects, a cast only as the last stage."""
    if isinstance(output_stages, OutputStage):
        output_stages = (output_stages,)
    try:
        stages = tuple(output_stages)
    except TypeError as e:
        raise ArgTypeError(f"output_stages must be a sequence of output stages, got {output_stages!r}") from e
    for i, st in enumerate(stages):
        if not isinstance(st, OutputStage):
            raise ArgTypeError(f"output_stages[{i}] is not a gemmlowp output stage: {st!r}")
        if isinstance(st, _CASTS) and i != len(stages) - 1:
            raise RangeError(
                f"output_stages[{i}] ({type(st).__name__}) is a cast stage and must be "
                f"the last stage, but {len(stages) - 1 - i} stage(s) follow it"
            )
    return stages


def check_stage_params(stages: tuple, acc_shape: tuple) -> None:
    """Converts and range-checks every stage's parameters (concrete values) now."""
    for st in stages:
        st._params(tuple(acc_shape))


def _apply_stages(x: jax.Array, stages: tuple) -> jax.Array:
    x = x.astype(_I32)
    for st in stages:
        x = st._apply(x, st._params(x.shape))
    return x


def apply_output_stages(acc, output_stages) -> jax.Array:
    """Applies a gemmlowp output pipeline (spec §1.2) to an int32 accumulator matrix.

    Args:
      acc: int32 array of shape (rows, cols) (the GEMM accumulator).
      output_stages: stages applied left to right; a cast stage may only be last.
        The empty pipeline returns ``acc`` (int32).

    Returns:
      The output of the last stage (int32, or uint8/int8/int16 after a cast).
    """
    stages = check_output_stages(output_stages)
    x = V.as_array(acc, "acc")
    if V.kind(x, "acc") != "int":
        raise ArgTypeError(f"acc must be an integer array, got dtype {x.dtype}")
    if np.dtype(x.dtype) == np.int64:
        V.check_range(x, INT32_MIN, INT32_MAX, "acc")
    if x.ndim != 2:
        raise ShapeError(f"acc must be a (rows, cols) matrix, got shape {x.shape}")
    check_stage_params(stages, x.shape)
    return _apply_stages_jit(x, stages)


_apply_stages_jit = jax.jit(_apply_stages)
