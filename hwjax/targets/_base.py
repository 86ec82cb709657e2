"""The :class:`Target` interface, the target registry, and LUT tables shared by targets."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import ConvGeometry  # noqa: F401  (re-exported: hwjax.targets.ConvGeometry)
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, HwjaxError, RangeError, UnsupportedOpError
from hwjax.graph import OpImpl, get_op, ops as registered_ops

LUT_FUNCTIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


def lut_function(name: str) -> Callable[[jax.Array], jax.Array]:
    """The float function of a LUT activation name (``"sigmoid"``, ``"tanh"``)."""
    if name not in LUT_FUNCTIONS:
        raise RangeError(f"LUT function must be one of {tuple(LUT_FUNCTIONS)}, got {name!r}")
    return LUT_FUNCTIONS[name]


_LUT_NUMPY = {"sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "tanh": np.tanh}


def _host_lut_table(fn: str, s_in, z_in, s_out, z_out) -> np.ndarray:
    v = np.arange(256)
    v = np.where(v > 127, v - 256, v)  # entry i serves the int8 whose byte is i
    y = _LUT_NUMPY[fn](np.float64(np.float32(s_in)) * (v - int(z_in))) / np.float64(np.float32(s_out))
    return np.clip(np.rint(y) + int(z_out), -128, 127).astype(np.int32)


def lut_table(fn: str, *, s_in, z_in, s_out, z_out) -> jax.Array:
    """A 256-entry int8 activation table, indexed by the input byte ``u8(v)``:
    ``clip(rint(fn(s_in (v - z_in)) / s_out) + z_out, -128, 127)`` for the int8 input
    ``v``, in float64 on the host, so the table does not depend on the device's
    transcendental functions: directly when the four parameters are concrete (a
    calibrated layer called eagerly, a graph being lowered), through one
    ``jax.pure_callback`` per call when they are traced. Returns int32 (256,)."""
    lut_function(fn)  # validates the name
    for v, name in ((s_in, "s_in"), (s_out, "s_out")):
        V.check_positive(V.as_array(v, name), name)
    for v, name in ((z_in, "z_in"), (z_out, "z_out")):
        V.check_range(V.as_array(v, name), -128, 127, name)
    if not any(isinstance(a, jax.core.Tracer) for a in (s_in, z_in, s_out, z_out)):
        return jnp.asarray(_host_lut_table(fn, *(np.asarray(a) for a in (s_in, z_in, s_out, z_out))))
    args = [
        jnp.asarray(a, d) for a, d in ((s_in, jnp.float32), (z_in, jnp.int32), (s_out, jnp.float32), (z_out, jnp.int32))
    ]
    return jax.pure_callback(
        functools.partial(_host_lut_table, fn),
        jax.ShapeDtypeStruct((256,), jnp.int32),
        *jax.lax.stop_gradient(args),
        vmap_method="sequential",
    )


def pytree(cls):
    """Registers a frozen dataclass as a pytree: array fields are leaves, the rest static."""
    fields = [f.name for f in dataclasses.fields(cls)]
    meta = [f.name for f in dataclasses.fields(cls) if f.metadata.get("static")]
    data = [f for f in fields if f not in meta]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)


def host_array(a):
    """A concrete array as NumPy (host work at lowering compiles nothing); a traced one as
    it is."""
    return a if isinstance(a, jax.core.Tracer) else np.asarray(a)


def static():
    return dataclasses.field(metadata={"static": True})


def float_exponent(v: jax.Array) -> jax.Array:
    """frexp exponent ``e`` with ``v = f * 2**e``, ``0.5 <= |f| < 1`` (0 for v = 0)."""
    return jnp.where(v == 0, 0, jnp.frexp(v)[1]).astype(jnp.int32)


# --------------------------------------------------------------------- the interface


@dataclass(frozen=True)
class Target:
    """One chip (or runtime convention) that runs hwjax graphs: the interface every target
    implements, as optax's ``GradientTransformation`` is for optimisers.

    A target is a frozen, hashable dataclass (its fields are variants of the chip). For
    each op kind it supports it holds one :class:`hwjax.graph.OpImpl`: the exact
    integer lowering (``run``), the quantisation recipe from portable parameters to the
    chip's integer parameters (``params``), and the chip-native tensor formats
    (``export`` / ``load``). Implementations are registered on the class in the target's
    own module::

        @MyChip.implements("conv", params=_conv_params, export=_conv_export, load=_conv_load)
        def _conv(target, attrs, params, x, return_acc=False): ...

    Subclasses inherit their parent's implementations and may override any. Op kinds
    with a ``generic`` implementation (``quantize``, ``flatten``) run on every target.

    Class attributes: ``name`` (the registry name), ``symmetric_activations`` (int8
    activations with zero point 0), ``lut_slopes`` (the ``lut`` op's ``run`` accepts
    float inputs and differentiates with the table's own slopes).
    """

    name: ClassVar[str] = "target"
    symmetric_activations: ClassVar[bool] = False
    lut_slopes: ClassVar[bool] = False
    _impls: ClassVar[dict[str, OpImpl]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._impls = dict(cls._impls)  # a subclass starts from its parent's implementations

    @classmethod
    def implement(cls, op: str, impl: OpImpl) -> None:
        """Registers ``impl`` as this target class's implementation of op kind ``op``."""
        get_op(op)  # the op kind must exist
        if not isinstance(impl, OpImpl):
            raise ArgTypeError(f"impl must be a hwjax.graph.OpImpl, got {type(impl).__name__}")
        cls._impls[op] = impl

    @classmethod
    def implements(
        cls, op: str, *, params=None, export=None, load=None, host_params=None, params_many=None
    ) -> Callable:
        """Decorator form of :meth:`implement` around the ``run`` function."""

        def deco(run):
            cls.implement(
                op,
                OpImpl(run, params=params, export=export, load=load, host_params=host_params, params_many=params_many),
            )
            return run

        return deco

    def ops(self) -> frozenset[str]:
        """Op kinds this target runs (its own and the generic ones)."""
        generic = {o for o in registered_ops() if get_op(o).generic is not None}
        return frozenset(self._impls) | generic

    def lowering(self, op: str) -> OpImpl:
        """The :class:`hwjax.graph.OpImpl` of ``op`` (UnsupportedOpError naming the
        supported kinds when this target cannot run it)."""
        impl = self._impls.get(op)
        if impl is None:
            try:
                impl = get_op(op).generic
            except KeyError:
                impl = None
        if impl is None:
            raise UnsupportedOpError(f"target {self!r} cannot run a {op!r} op; it supports {sorted(self.ops())}")
        return impl

    def check_op(self, op: str, **config: Any) -> None:
        """Raises UnsupportedOpError if this target cannot run ``op`` with ``config`` (the
        layer's construction arguments). Targets with restrictions override it."""
        self.lowering(op)

    def check_layer(self, kind: str, **config: Any) -> None:
        """Alias of :meth:`check_op` (the name hwjax 0.1 layers called)."""
        self.check_op(kind, **config)

    # ------------------------------------------------- hwjax 0.1 methods (deprecated)

    def _deprecated(self, old: str, new: str):
        warnings.warn(
            f"Target.{old} is deprecated; use {new} (see hwjax.graph.OpImpl)", DeprecationWarning, stacklevel=3
        )

    def _old_params(self, op, kernel, bias_q, *, s_in, z_in, s_w, s_out, z_out, relu=False):
        from hwjax.graph import Attrs, Quant

        self._deprecated(f"{op}_params", f'target.lowering("{op}").params')
        attrs = Attrs({"activation": "relu" if relu else None})
        return self.lowering(op).params(
            self,
            attrs,
            {"kernel": kernel, "bias": bias_q, "w_scale": s_w},
            [Quant.of(s_in, z_in)],
            Quant.of(s_out, z_out),
        )

    def conv_params(self, kernel_ohwi, bias_q, **q):
        """Deprecated: ``target.lowering("conv").params(...)``."""
        return self._old_params("conv", kernel_ohwi, bias_q, **q)

    def depthwise_params(self, kernel_hwc, bias_q, **q):
        """Deprecated: ``target.lowering("depthwise_conv").params(...)``."""
        return self._old_params("depthwise_conv", kernel_hwc, bias_q, **q)

    def _old_run(self, op, geom, params, *xs, return_acc=False):
        from hwjax.graph import Attrs

        self._deprecated(op if op != "depthwise_conv" else "depthwise", f'target.lowering("{op}").run')
        attrs = Attrs(
            {} if geom is None else {"kernel_size": geom.kernel, "stride": geom.stride, "padding": geom.padding}
        )
        out = self.lowering(op).run(self, attrs, params, *xs, return_acc=return_acc)
        return out if return_acc or geom is None else (out, None)

    def conv(self, x, params, geom, *, return_acc: bool = False):
        """Deprecated: ``target.lowering("conv").run(...)`` (returns ``(y, acc_stat)``)."""
        return self._old_run("conv", geom, params, x, return_acc=return_acc)

    def depthwise(self, x, params, geom, *, return_acc: bool = False):
        """Deprecated: ``target.lowering("depthwise_conv").run(...)``."""
        return self._old_run("depthwise_conv", geom, params, x, return_acc=return_acc)

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable identity of the target (written to export manifests);
        :func:`hwjax.targets.get` ``(**describe())`` rebuilds it."""
        return {"name": self.name, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


# ---------------------------------------------------------------------- the registry


_REGISTRY: dict[str, Callable[..., Target]] = {}


def register(name: str, factory: Callable[..., Target], *, replace: bool = False) -> None:
    """Adds a target under ``name``: ``factory(**options)`` builds one (a Target subclass
    works). ValueError if the name is taken (unless ``replace``)."""
    if not isinstance(name, str) or not name:
        raise ArgTypeError(f"target name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise RangeError(f"target {name!r} is already registered")
    _REGISTRY[name] = factory


def available() -> tuple[str, ...]:
    """Names of the registered targets."""
    return tuple(sorted(_REGISTRY))


def get(name: str, **options: Any) -> Target:
    """The target registered as ``name``, built with ``options`` (e.g. ``variant="host"``).

    ValueError names the registered targets for an unknown name, and the problem for
    bad options."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise RangeError(f"unknown target {name!r}; available: {list(available())}")
    try:
        return _REGISTRY[name](**options)
    except HwjaxError:
        raise
    except TypeError as e:
        raise RangeError(f"target {name!r} does not take the options {options}: {e}") from None


def resolve(target: Any) -> Target:
    """A :class:`Target` from a Target, a registered name, or a ``describe()`` dict."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return get(target)
    if isinstance(target, dict) and "name" in target:
        return get(target["name"], **{k: v for k, v in target.items() if k != "name"})
    raise ArgTypeError(
        f"target must be a hwjax.targets.Target, a registered name {list(available())} or a "
        f"describe() dict, got {target!r}"
    )


def no_acc(y, return_acc: bool):
    """``y``, or ``(y, None)`` when accumulator statistics were asked for (ops without
    accumulators)."""
    return (y, None) if return_acc else y


def empty_export(target, attrs, params) -> tuple[dict, dict]:
    return {}, {}


def as_np(v, dtype) -> np.ndarray:
    return np.asarray(v).astype(dtype)
