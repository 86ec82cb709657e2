"""Modes, calibration state, statistics and the base class of every hwjax layer."""

from __future__ import annotations

import contextvars
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwjax.core import evaluated_if_concrete
from hwjax.errors import ArgTypeError, RangeError
from hwjax.nn._qarray import QArray
from hwjax.targets import resolve as resolve_target
from hwjax.nn._quant import INT8_MAX, INT8_MIN, act_qparams, compute_once

Mode = Literal["float", "calibrate", "hardware"]
MODES: tuple[str, ...] = ("float", "calibrate", "hardware")
Activation = Literal[None, "relu"]
ACTIVATIONS: tuple = (None, "relu")


def check_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise RangeError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def check_activation(activation: Any) -> Activation:
    if activation not in ACTIVATIONS:
        raise RangeError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


class Calibration(nnx.Variable):
    """Recorded real range ``[lo, hi]`` of a layer's output (not trained).

    Starts empty (``[+inf, -inf]``); every ``"calibrate"``-mode call widens it to the
    batch's min and max.
    """


class Pinned(nnx.Variable):
    """Quantisation fixed from outside (an imported graph), not trained: NaN where unset.

    On requantising layers ``[scale, zero_point]`` of the output (overrides the
    calibrated range); on linear layers also the per-channel weight scales."""


class Derived(nnx.Variable):
    """Target parameters derived on the host from concrete quantisation parameters, with
    the key they were derived for: ``{"key": float32 (4,) [s_in, z_in, s_out, z_out],
    "params": ...}`` (not trained; NaN key when empty). An eager call fills it; a jitted
    forward whose key matches reuses it instead of calling back to the host."""


class ScaleFactor(nnx.Param):
    """Learned factor on a calibrated activation scale (LSQ-style step size learning)."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LayerStats:
    """Saturation / clipping counts of one layer over one call (int32 scalars).

    Attributes:
      count: number of output elements.
      low: outputs at the int8 lower bound -128 (hardware mode) or below the
        calibrated range (float/calibrate modes: what post-training quantisation
        would clip). Not counted for ReLU layers, whose lower bound *is* the ReLU.
      high: outputs at the upper bound 127, or above the calibrated range.
      acc_count: number of accumulators (0 where the layer has none).
      acc_saturated: accumulators for which at least one saturating accumulation step
        clipped (the unsaturated sum left ``[-(2**31-1), 2**31-1]``): the one statistic of
        :func:`hwjax.core.mac`'s ``return_clipped``, on every target.

    Stats add up over batches with ``+``.
    """

    count: jax.Array
    low: jax.Array
    high: jax.Array
    acc_count: jax.Array
    acc_saturated: jax.Array

    def __add__(self, other: "LayerStats") -> "LayerStats":
        return jax.tree.map(jnp.add, self, other)

    def fractions(self) -> dict[str, float]:
        """Host-side fractions: ``low``, ``high`` of outputs, ``acc_saturated`` of accumulators."""
        c = max(int(self.count), 1)
        a = max(int(self.acc_count), 1)
        return {"low": int(self.low) / c, "high": int(self.high) / c, "acc_saturated": int(self.acc_saturated) / a}


def _i32(v) -> jax.Array:
    return jnp.asarray(v, jnp.int32)


def make_stats(
    y_int: jax.Array | None,
    *,
    relu: bool,
    acc: dict | None = None,
    y_float: jax.Array | None = None,
    bounds: tuple | None = None,
) -> LayerStats:
    """Counts for :class:`LayerStats` from an integer output (hardware) or a float
    output and its representable real ``bounds`` (float modes)."""
    return _make_stats(y_int, y_float, bounds, acc, relu=bool(relu))


@functools.partial(jax.jit, static_argnames="relu")
def _make_stats(y_int, y_float, bounds, acc, *, relu: bool) -> LayerStats:
    """:func:`make_stats` as one program (an eager layer call compiles it once per shape,
    not one program per comparison and sum)."""
    if y_int is not None:
        low, high, n = (y_int <= INT8_MIN).sum(), (y_int >= INT8_MAX).sum(), y_int.size
    elif bounds is not None:
        low, high, n = (y_float < bounds[0]).sum(), (y_float > bounds[1]).sum(), y_float.size
    else:
        low, high, n = 0, 0, y_float.size
    acc_n, acc_sat = (0, 0) if acc is None else (acc["count"], acc["saturated"])  # the OpImpl's statistic
    return LayerStats(_i32(n), _i32(0 if relu else low), _i32(high), _i32(acc_n), _i32(acc_sat))


@jax.jit
def _widened(r: jax.Array, y: jax.Array) -> jax.Array:
    """The range ``r = [lo, hi]`` widened to cover ``y`` (one program)."""
    return jnp.stack([jnp.minimum(r[0], jnp.min(y)), jnp.maximum(r[1], jnp.max(y))])


class Plan:
    """A model's hardware-mode call, planned (see :func:`planned_call`): the output
    quantisation of every layer, computed once, and the target parameters of every linear
    layer, derived together before the layers run.

    ``collect`` is True during the first (shape-only) pass, when linear layers record their
    requests instead of running; ``finish`` then derives the parameters (one batched recipe
    per target where the target has one, :func:`hwjax.graph.derive_params`)."""

    def __init__(self):
        self.collect = True
        self.ranged: dict[int, tuple] = {}  # id(layer) -> act_qparams of its recorded range
        self.qparams: dict[int, tuple] = {}  # id(layer) -> (scale, zero point)
        self.requests: list = []  # (layer, request) in call order
        self.params: dict[int, tuple] = {}  # id(layer) -> (s_in, z_in, derived parameters)

    def prime(self, layers) -> None:
        """:func:`hwjax.nn.act_qparams` of every requantising layer's recorded range, in one
        vectorised evaluation per kind of range (symmetric or not) instead of one per layer
        (the same operations on each range: the same values)."""
        groups: dict = {}
        for m in layers:
            if m.requantizes:
                groups.setdefault(m.target.symmetric_activations, []).append(m)
        for sym, ms in groups.items():
            r = jnp.stack([jax.lax.stop_gradient(m.out_range[...]) for m in ms])
            trigger = jax.lax.bitcast_convert_type(r[0, 0], jnp.int32)
            scale, zp = compute_once(jax.vmap(lambda v, sym=sym: act_qparams(v, symmetric=sym)), (r,), trigger)
            for i, m in enumerate(ms):
                self.ranged[id(m)] = (scale[i], zp[i])

    def record(self, layer, request) -> None:
        self.requests.append((layer, request))

    def derived(self, layer, s_in, z_in):
        """The layer's derived parameters when they were derived for exactly this input
        quantisation (the same traced values), else None (the layer derives its own)."""
        entry = self.params.get(id(layer))
        if entry is None or entry[0] is not s_in or entry[1] is not z_in:
            return None
        return entry[2]

    def finish(self, derive_many) -> None:
        """Derives the recorded requests with ``derive_many(target, requests) -> list``,
        grouped by target, and ends the collecting pass."""
        by_target: dict = {}
        for layer, req in self.requests:
            by_target.setdefault(layer.target, []).append((layer, req))
        for target, items in by_target.items():
            for (layer, req), p in zip(items, derive_many(target, [r for _, r in items])):
                self.params[id(layer)] = (req[2], req[3], p)
        self.collect = False


_PLAN: contextvars.ContextVar = contextvars.ContextVar("hwjax_nn_plan", default=None)


def current_plan() -> Plan | None:
    return _PLAN.get()


def planned_call(first, call, derive_many, wanted, layers):
    """``call()`` (a model's forward), planned when no plan is active and ``wanted()``: a
    first pass ``first()`` (the forward without statistics) records each linear layer's
    parameter request and the layers' output quantisations (linear layers return zeros of
    their output's shape, which nothing uses: XLA removes that pass's dead work), the
    parameters are derived together (``derive_many``, see :meth:`Plan.finish`), and
    ``call()`` runs the layers with them. The values are those of the unplanned call, bit
    for bit (the same recipes on the same traced inputs; a layer whose input quantisation
    is not the one planned derives its own). ``layers()``: the model's hwjax layers, whose
    output quantisations are derived together first (:meth:`Plan.prime`)."""
    if _PLAN.get() is not None or not wanted():
        return call()
    plan = Plan()
    token = _PLAN.set(plan)
    try:
        plan.prime(layers())
        first()
        plan.finish(derive_many)
        return call()
    finally:
        _PLAN.reset(token)


class HwLayer(nnx.Module):
    """Base of every hwjax layer: a target, a mode and (optionally) an output quantiser.

    Modes (attribute ``mode``, set with :func:`hwjax.nn.set_mode`):

    * ``"float"``: the plain float layer (the baseline).
    * ``"calibrate"``: the float layer, and the real range of its output is recorded
      (:class:`Calibration`), which fixes the int8 output scale and zero point.
    * ``"hardware"``: the forward pass is the target's exact integer pipeline on int8
      :class:`QArray` activations. Values are bit-exact; gradients come from a float
      surrogate (see each layer).
    """

    kind: ClassVar[str] = "layer"
    requantizes: ClassVar[bool] = False  # owns an output scale / zero point
    LAYERS: ClassVar[dict[str, type]] = {}  # op kind -> the layer class that runs it

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            HwLayer.LAYERS[cls.kind] = cls

    def __init__(self, target, *, mode: Mode = "float", learn_scale: bool = False, **cfg):
        try:
            target = resolve_target(target)
        except (TypeError, ValueError) as e:
            raise ArgTypeError(f"target must be a hwjax.targets.Target or a registered target name: {e}") from None
        target.check_op(self.kind, **cfg)
        self.target = target
        self.mode = check_mode(mode)
        if self.requantizes:
            self.out_range = Calibration(jnp.array([np.inf, -np.inf], jnp.float32))
            self.out_pin = Pinned(jnp.full((2,), jnp.nan, jnp.float32))
            self.learn_scale = bool(learn_scale)
            if self.learn_scale:
                self.scale_factor = ScaleFactor(jnp.ones((), jnp.float32))
        elif learn_scale:
            raise RangeError(f"{type(self).__name__} keeps its input's scale: learn_scale is not available")

    # ------------------------------------------------------------ the graph op

    def node_attrs(self, in_shape=None):
        """The :class:`hwjax.graph.Attrs` of this layer's graph node (per-example input
        shape ``in_shape`` where the attributes depend on it)."""
        from hwjax.graph import Attrs

        return Attrs()

    def op_params(self, attrs, portable, q_in, q_out):
        """The target's recipe for this layer's op (:class:`hwjax.graph.OpImpl`.params)."""
        impl = self.target.lowering(self.kind)
        return None if impl.params is None else impl.params(self.target, attrs, portable, q_in, q_out)

    def op_run(self, attrs, params, *xs):
        """The target's exact integer forward of this layer's op on integer arrays."""
        return self.target.lowering(self.kind).run(self.target, attrs, params, *xs)

    def portable_params(self, inputs):
        """The node's portable parameters for input tensors ``inputs`` (None: none)."""
        return None

    def to_node(self, name: str, inputs):
        """This layer as a :class:`hwjax.graph.Node` named ``name`` reading the
        :class:`hwjax.graph.Tensor` s ``inputs``, and the tensor it writes. The layer must be
        calibrated (requantising layers take their output quantisation from it)."""
        from hwjax.graph import Node, Quant, Tensor, get_op

        attrs = self.node_attrs(tuple(inputs[0].shape))
        quant = Quant.of(*self.out_qparams()) if self.requantizes else inputs[0].quant
        node = Node(self.kind, tuple(t.name for t in inputs), (name,), attrs, self.portable_params(inputs), name)
        shape = get_op(self.kind).infer(node, inputs)[0]
        return node, Tensor(name, tuple(shape), self.out_dtype() or inputs[0].dtype, quant)

    def out_dtype(self) -> str | None:
        """The type of the output tensor :meth:`to_node` writes: ``"int8"`` for requantising
        layers, None (the input's type) for those that keep their input's quantisation."""
        return "int8" if self.requantizes else None

    def emit(self, graph_nodes: list, tensors: dict, prefix: str, name: str, inputs: list):
        """Appends this layer's node (``prefix + name``) to ``graph_nodes``; returns its
        output tensor (used by :func:`hwjax.nn.to_graph`; containers override it)."""
        node, out = self.to_node(prefix + name, inputs)
        graph_nodes.append(node)
        tensors[out.name] = out
        return out

    # ------------------------------------------------------------ output quantiser

    def record(self, y: jax.Array) -> None:
        """Calibrate mode: widens the recorded output range to cover ``y``."""
        self.out_range[...] = _widened(self.out_range[...], y)

    def out_qparams(self) -> tuple[jax.Array, jax.Array]:
        """(scale, zero_point) of the output: :func:`hwjax.nn.act_qparams` of the recorded
        range (symmetric if the target wants it); with ``learn_scale`` the scale is
        multiplied by the learned :class:`ScaleFactor` (the zero point stays), and its
        gradient is LSQ's: it flows through every surrogate that uses the scale.

        Where that state is concrete (a model closed over by ``jit``), the values are
        computed at trace time (:func:`hwjax.core.evaluated_if_concrete`) rather than in the
        program, so the layers that read them derive their integer parameters on the host
        once per trace."""
        state = [
            v[...]
            for v in (self.out_range, getattr(self, "out_pin", None), getattr(self, "scale_factor", None))
            if isinstance(v, nnx.Variable)
        ]
        plan = _PLAN.get()
        planned = () if plan is None else (plan.qparams.get(id(self)), plan.ranged.get(id(self)))
        with evaluated_if_concrete((state, planned)):  # a plan's values may be traced
            return self._out_qparams()

    def _out_qparams(self) -> tuple[jax.Array, jax.Array]:
        plan = _PLAN.get()
        if plan is not None and id(self) in plan.qparams:
            return plan.qparams[id(self)]
        if plan is not None and id(self) in plan.ranged:
            scale, zp = plan.ranged[id(self)]
        else:
            r = jax.lax.stop_gradient(self.out_range[...])
            sym = self.target.symmetric_activations
            trigger = jax.lax.bitcast_convert_type(r[0], jnp.int32)
            scale, zp = compute_once(lambda v: act_qparams(v, symmetric=sym), (r,), trigger)
        if self.requantizes:
            pin = jax.lax.stop_gradient(self.out_pin[...])
            pinned = jnp.isfinite(pin[0])
            scale = jnp.where(pinned, pin[0], scale)
            zp = jnp.where(pinned, jnp.nan_to_num(pin[1]).astype(jnp.int32), zp)
        if self.requantizes and self.learn_scale:
            scale = scale * jnp.maximum(self.scale_factor[...], 1e-3)
        if plan is not None:
            plan.qparams[id(self)] = (scale, zp)
        return scale, zp

    def out_bounds(self) -> tuple[jax.Array, jax.Array]:
        """Real values of the int8 bounds -128 and 127 under the output quantisation."""
        s, z = self.out_qparams()
        return s * (INT8_MIN - z), s * (INT8_MAX - z)

    def pin_quant(self, scale, zero_point) -> None:
        """Fixes the output quantisation to ``(scale, zero_point)`` (as imported from a
        graph); the calibrated range is set to the real range it represents."""
        s, z = float(np.asarray(scale, np.float32)), int(np.asarray(zero_point))
        self.out_pin[...] = jnp.asarray([s, z], jnp.float32)
        self.out_range[...] = jnp.asarray([s * (INT8_MIN - z), s * (INT8_MAX - z)], jnp.float32)

    @classmethod
    def from_node(cls, node, inputs, output, target) -> "HwLayer":
        """A layer of this class initialised from a graph node (see :func:`hwjax.nn.from_graph`);
        requantising layers pin their output quantisation to ``output.quant``."""
        layer = cls(target=target, **cls.node_kwargs(node, inputs))
        if cls.requantizes:
            layer.pin_quant(output.quant.scale, output.quant.zero_point)
        return layer

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        """Constructor arguments of this layer class from a graph node."""
        return {}

    def is_calibrated(self) -> bool:
        if not self.requantizes:
            return True
        r = np.asarray(self.out_range[...])
        return bool(np.all(np.isfinite(r)) and r[0] <= r[1])

    def float_stats(self, y: jax.Array, relu: bool) -> LayerStats:
        """Float/calibrate-mode stats: outputs outside the calibrated int8 range (what
        post-training quantisation would clip); zero counts before calibration."""
        if not self.requantizes:
            return make_stats(None, relu=relu, y_float=y)
        calibrated = jnp.all(jnp.isfinite(self.out_range[...]))
        lo, hi = self.out_bounds()
        bounds = (jnp.where(calibrated, lo, -jnp.inf), jnp.where(calibrated, hi, jnp.inf))
        return make_stats(None, relu=relu, y_float=y, bounds=bounds)

    def _require_q(self, x, name: str = "x") -> QArray:
        if not isinstance(x, QArray):
            raise ArgTypeError(
                f"{type(self).__name__} in hardware mode needs a QArray input for {name} "
                f"(start the model with hwjax.nn.Quantize), got {type(x).__name__}"
            )
        return x


def _check_model(model) -> None:
    if not isinstance(model, nnx.Module):
        raise ArgTypeError(f"model must be a flax.nnx.Module holding hwjax.nn layers, got {type(model).__name__}")


def set_mode(model: nnx.Module, mode: Mode) -> nnx.Module:
    """Sets ``mode`` on every hwjax layer inside ``model`` (in place); returns ``model``.

    Switching to ``"hardware"`` requires calibrated layers (run the model in
    ``"calibrate"`` mode on representative data first); ValueError names the
    uncalibrated layers otherwise.
    """
    check_mode(mode)
    _check_model(model)
    layers = [(p, m) for p, m in nnx.iter_modules(model) if isinstance(m, HwLayer)]
    if mode == "hardware":
        bad = ["/".join(map(str, p)) or "<root>" for p, m in layers if not m.is_calibrated()]
        if bad:
            raise RangeError(
                f"cannot switch to hardware mode: layers {bad} are not calibrated; "
                f"run the model in 'calibrate' mode on representative inputs first"
            )
    for _, m in layers:
        m.mode = mode
    return model


def get_mode(model: nnx.Module) -> str:
    """The common mode of the hwjax layers in ``model`` (RangeError if they differ or there
    are none)."""
    _check_model(model)
    modes = {m.mode for _, m in nnx.iter_modules(model) if isinstance(m, HwLayer)}
    if len(modes) != 1:
        raise RangeError(f"model layers are in modes {sorted(modes)}; expected exactly one")
    return modes.pop()
