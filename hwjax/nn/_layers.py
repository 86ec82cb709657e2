"""Flax NNX layers whose ``"hardware"`` mode is a target's exact integer pipeline.

Every layer takes a ``target`` (``hwjax.targets.XS3()``, ...) and checks at
construction that the target can run it. See :class:`hwjax.nn.HwLayer` for the modes.

Hardware-mode gradients (all layers) use the exact-forward straight-through
construction of :func:`hwjax.nn.exact_forward`: the output *value* is the target's
integer result bit for bit, the *gradient* is that of a float affine surrogate of the
same integer layer, clipped to ``[-128, 127]`` so that outputs the int8 clamp
saturated (including the ReLU floor) get zero gradient.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.errors import TraceContextError

from hwjax.nn._base import (
    Derived,
    HwLayer,
    LayerStats,
    Mode,
    Pinned,
    check_activation,
    current_plan,
    make_stats,
    planned_call,
)
from hwjax.nn._qarray import QArray
from hwjax.nn._quant import (
    bias_int,
    clip_int8,
    compute_once,
    exact_forward,
    sg,
    weight_scales,
    weights_int,
)
from hwjax.core import ConvGeometry, div_rn, evaluated_if_concrete
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, RangeError, ShapeError
from hwjax.graph import Attrs, Quant, derive_params, geometry
from hwjax.graph.ops.basic import QUANTIZE_RANGES
from hwjax.targets import LUT_FUNCTIONS, lut_function

Padding = Union[str, int, Sequence[tuple[int, int]]]
_DN = ("NHWC", "HWIO", "NHWC")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _pair(v, name: str, layer: str = "") -> tuple[int, int]:
    """A positive int or a pair of positive ints as a pair (RangeError names ``layer`` and
    ``name`` otherwise)."""
    try:
        t = (v, v) if _is_int(v) else tuple(v)
    except TypeError:
        t = ()
    if len(t) != 2 or not all(_is_int(i) and i >= 1 for i in t):
        raise RangeError(
            f"{layer + ': ' if layer else ''}{name} must be a positive int or a pair of positive ints, got {v!r}"
        )
    return (int(t[0]), int(t[1]))


def _positive_int(v, name: str, layer: str) -> int:
    """A layer size: a positive int (ArgTypeError / RangeError name the layer and argument)."""
    if not _is_int(v):
        raise ArgTypeError(f"{layer}: {name} must be a positive int, got {v!r}")
    if v < 1:
        raise RangeError(f"{layer}: {name} must be a positive int, got {v}")
    return int(v)


def _check_input(layer, x, *, ndim: int, channels: int | None = None, name: str = "x", what: str = "in_features"):
    """The input ``x`` (a QArray, or anything :func:`hwjax.core.validate.as_array` takes,
    converted): ShapeError naming the layer unless it has ``ndim`` axes and (unless
    ``channels`` is None) ``channels`` entries on the last one."""
    if not isinstance(x, QArray):
        x = V.as_array(x, f"{type(layer).__name__} input {name}")
    shape = tuple((x.q if isinstance(x, QArray) else x).shape)
    layout = "(batch, features)" if ndim == 2 else "(batch, height, width, channels)"
    if len(shape) != ndim or (channels is not None and shape[-1] != channels):
        req = f" with {channels} = {what} on the last axis" if channels is not None else ""
        raise ShapeError(f"{type(layer).__name__}: input {name} must have shape {layout}{req}, got shape {shape}")
    return x


def _check_padding(padding: Padding) -> Padding:
    if isinstance(padding, str):
        if padding not in ("SAME", "VALID"):
            raise RangeError(
                f"padding must be 'SAME', 'VALID', an int or ((top, bottom), (left, right)), got {padding!r}"
            )
        return padding
    if isinstance(padding, int):
        if padding < 0:
            raise RangeError(f"padding must be >= 0, got {padding}")
        return ((padding, padding), (padding, padding))
    p = tuple(tuple(int(a) for a in q) for q in padding)
    if len(p) != 2 or any(len(q) != 2 or min(q) < 0 for q in p):
        raise RangeError(f"padding must be ((top, bottom), (left, right)) of non-negative ints, got {padding!r}")
    return p


def _float_conv(x: jax.Array, kernel: jax.Array, geom: ConvGeometry, groups: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x, kernel, geom.stride, geom.padding, dimension_numbers=_DN, feature_group_count=groups
    )


def _relu(y: jax.Array, activation) -> jax.Array:
    return jax.nn.relu(y) if activation == "relu" else y


def _ret(y, stats: LayerStats, return_stats: bool):
    return (y, stats) if return_stats else y


# --------------------------------------------------------------------------- Quantize


class Quantize(HwLayer):
    """Model input: float tensor -> ``dtype`` :class:`QArray` (identity in float modes).

    ``dtype``: ``"int8"`` (default) or ``"uint8"`` (ONNX models), the range ``[lo, hi]`` of
    the integers. Hardware mode: the target's own float32 -> integer quantisation (the graph
    op ``quantize``) with the scale and zero point of the calibrated input range: exactly
    what :func:`hwjax.graph.run` and the loaded models compute on float inputs (for most
    targets ``clip(round(x / scale) + zero_point, lo, hi)`` with ties to even; LiteRT's
    reference kernel rounds half away from zero, ONNX Runtime rounds before adding the zero
    point). Gradient: straight-through ``1/scale`` inside the range, 0 where clipped. A
    :class:`QArray` input passes through unchanged.

    NaN rule: in ``"calibrate"`` and ``"hardware"`` modes a NaN or an infinity in the
    input raises :class:`hwjax.errors.RangeError` ("Quantize input x must be finite")
    when the input is concrete, and under :func:`hwjax.checked` when it is traced
    (inside ``jit``); traced and unchecked, a NaN quantises as the target's formula gives
    it (not meaningful) and would poison a calibrated range. ``"float"`` mode is the float
    model: values pass unchanged.
    """

    kind = "quantize"
    requantizes = True

    def __init__(self, *, dtype: str = "int8", target, mode: Mode = "float", learn_scale: bool = False):
        if dtype not in QUANTIZE_RANGES:
            raise RangeError(f"Quantize: dtype must be one of {tuple(QUANTIZE_RANGES)}, got {dtype!r}")
        self.dtype = dtype
        super().__init__(target, mode=mode, learn_scale=learn_scale)

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"dtype": node.attrs.get("dtype", "int8")}

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"dtype": self.dtype}) if self.dtype != "int8" else Attrs()

    def out_dtype(self) -> str:
        return self.dtype

    def __call__(self, x, *, return_stats: bool = False):
        if isinstance(x, QArray):
            return _ret(x, make_stats(x.q, relu=False), return_stats)
        x = V.as_array(x, "Quantize input x")
        V.kind(x, "Quantize input x")
        x = x.astype(jnp.float32)
        if self.mode != "float":  # the NaN rule (see the class docstring)
            V.check_finite(x, "Quantize input x")
        if self.mode == "calibrate":
            self.record(x)
        if self.mode != "hardware":
            return _ret(x, self.float_stats(x, relu=False), return_stats)
        scale, zp = self.out_qparams()
        lo, hi = QUANTIZE_RANGES[self.dtype]
        attrs = self.node_attrs()

        def exact(v, s, z):
            params = self.op_params(attrs, None, [None], Quant.of(s, z))
            return self.op_run(attrs, params, v).astype(jnp.float32)

        q = exact_forward(
            compute_once(exact, (sg(x), sg(scale), zp), zp), jnp.clip(x / scale + zp.astype(jnp.float32), lo, hi)
        )
        stats = None
        if return_stats:  # inputs that quantisation clips (not merely the ones at a bound)
            pre = jnp.round(div_rn(sg(x), scale) + zp.astype(jnp.float32))
            stats = make_stats(None, relu=False, y_float=pre, bounds=(float(lo), float(hi)))
        return _ret(QArray(q, scale, zp), stats, return_stats)


class Flatten(HwLayer):
    """Flattens all but the batch axis (row-major NHWC, the targets' memory order). Exact."""

    kind = "flatten"

    def __init__(self, *, target, mode: Mode = "float"):
        super().__init__(target, mode=mode)

    def __call__(self, x, *, return_stats: bool = False):
        if isinstance(x, QArray):
            y = x.with_q(x.q.reshape(x.q.shape[0], -1))
            return _ret(y, make_stats(None, relu=False, y_float=y.q), return_stats)
        y = x.reshape(x.shape[0], -1)
        return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)


# --------------------------------------------------------------- linear layers (shared)


class _Linear(HwLayer):
    """Shared forward of Dense / Conv / DepthwiseConv (kernel HWIO, output channel last).

    Hardware mode, with input ``(q, s_in, z_in)`` and output ``(s_out, z_out)``:

    * weights ``w_q = clip(round(w / s_w), -127, 127)``, ``s_w[c] = max|w_c| / 127``;
    * bias ``b_q = round(b / (s_in * s_w[c]))`` (int32);
    * the target derives its integer output transform from these (XS3: the xformer
      recipe) and runs its kernel: the output is exactly the chip's int8 result.

    Surrogate (gradient only): ``clip((conv(q - z_in, w_q) + b_q) * s_in * s_w / s_out
    + z_out, lo, 127)`` with ``lo = -128``, or ``z_out`` with a fused ReLU (the same
    thing on asymmetric targets, where a ReLU output has ``z_out = -128``), and
    straight-through ``w_q`` and ``b_q``, so
    ``d/dw = d/dw_q / s_w`` and ``d/db = d/db_q / (s_in * s_w)``; gradients also flow to
    the input values and (if learned) to ``s_in`` and ``s_out``.
    """

    requantizes = True
    groups_is_depthwise = False

    def _init_linear(
        self,
        kernel_shape,
        n_out,
        use_bias,
        activation,
        strides,
        padding,
        rngs,
        kernel_init,
        target,
        mode,
        learn_scale,
        **cfg,
    ):
        self.activation = check_activation(activation)
        self.strides = _pair(strides, "strides", type(self).__name__)
        self.padding = _check_padding(padding)
        super().__init__(target, mode=mode, learn_scale=learn_scale, strides=self.strides, padding=self.padding, **cfg)
        self.kernel = nnx.Param(kernel_init(rngs.params(), kernel_shape, jnp.float32))
        self.use_bias = bool(use_bias)
        self.bias = nnx.Param(jnp.zeros((n_out,), jnp.float32)) if use_bias else None
        self.w_pin = Pinned(jnp.full((n_out,), jnp.nan, jnp.float32))

    def _geometry(self, x_shape) -> ConvGeometry:
        return ConvGeometry.make(tuple(x_shape[1:3]), tuple(self.kernel.shape[:2]), self.strides, self.padding)

    def _groups(self, x_shape) -> int:
        return x_shape[-1] if self.groups_is_depthwise else 1

    def _bias(self) -> jax.Array:
        return self.bias[...] if self.bias is not None else jnp.zeros((self.kernel.shape[-1],), jnp.float32)

    def _forward4d(self, x, return_stats: bool):
        kernel = self.kernel[...]
        if self.kind != "dense":  # Dense checks its 2-D input itself
            depthwise = self.groups_is_depthwise
            x = _check_input(
                self,
                x,
                ndim=4,
                channels=kernel.shape[-1] if depthwise else kernel.shape[2],
                what="features" if depthwise else "in_features",
            )
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            geom = self._geometry(x.shape)
            y = _relu(_float_conv(x, kernel, geom, self._groups(x.shape)) + self._bias(), self.activation)
            if self.mode == "calibrate":
                self.record(y)
            return y, self.float_stats(y, relu=self.activation == "relu")
        if self.mode != "hardware":
            raise ArgTypeError(f"{type(self).__name__} in {self.mode!r} mode takes float inputs, got a QArray")
        s_out, z_out = self.out_qparams()
        args = (kernel, self._bias(), x.q, x.scale, x.zero_point, s_out, z_out, self.w_pin[...])
        attrs = self.node_attrs(x.shape[1:])
        plan = current_plan()
        if plan is not None and plan.collect:  # a planned call's first pass: the request only
            plan.record(self, (kernel, args[1], x.scale, x.zero_point, s_out, z_out, args[7], self.kind, attrs))
            out_shape = (x.shape[0], *self._geometry(x.shape).out_hw, kernel.shape[-1])
            return QArray(jnp.zeros(out_shape, jnp.float32), s_out, z_out), None
        cfg = dict(target=self.target, op=self.kind, attrs=attrs, return_stats=return_stats)
        out = _hw_linear_eager(*args, **cfg) if _all_concrete(args) else None
        hw = plan.derived(self, x.scale, x.zero_point) if plan is not None else None
        recipe_args = args[:2] + args[3:]
        if hw is None and not _all_concrete(args) and _all_concrete(recipe_args):  # only the input is traced
            hw = _host_linear_quant(*recipe_args, self.target, self.kind, attrs)
        y, stats = out if out is not None else _hw_linear(*args, hw, **cfg)
        return QArray(y, s_out, z_out), stats

    def node_attrs(self, in_shape) -> Attrs:
        """The graph attributes of this layer for a per-example input shape (padding made
        explicit)."""
        a = {"activation": self.activation}
        if self.kind != "dense":
            geom = self._geometry((None, *in_shape))
            a.update(kernel_size=tuple(self.kernel.shape[:2]), stride=geom.stride, padding=geom.padding)
        if self.kind != "depthwise_conv":
            a["features"] = int(self.kernel.shape[-1])
        return Attrs(a)

    @classmethod
    def from_node(cls, node, inputs, output, target) -> "_Linear":
        """The layer whose hardware mode reproduces ``node``'s portable integers: float
        weights ``kernel * w_scale`` and biases ``bias * s_in * w_scale`` (exact round trip
        for |bias| < 2**24), the weight scales and the output quantisation pinned."""
        p = node.params
        layer = cls(target=target, rngs=nnx.Rngs(0), **cls.node_kwargs(node, inputs))
        kernel, bias, s_w = _float_weights(cls.kind, p["kernel"], p["w_scale"], p["bias"], inputs[0].quant.scale)
        layer.kernel[...], layer.bias[...], layer.w_pin[...] = kernel, bias, s_w
        layer.pin_quant(output.quant.scale, output.quant.zero_point)
        return layer

    def portable_params(self, inputs):
        """int8 ``kernel``, int32 ``bias`` and ``w_scale`` (see :mod:`hwjax.graph.ops.linear`)
        for an input tensor quantised with ``inputs[0].quant``."""
        q = inputs[0].quant
        return _portable_jit(
            self.kernel[...], self._bias(), jnp.asarray(q.scale, jnp.float32), self.w_pin[...], self.kind
        )[3]

    def integer_params(self, s_in, z_in, geom: ConvGeometry | None = None, *, in_shape=None) -> "LinearQuant":
        """Integer weights and biases, weight scales, the output quantisation, the portable
        parameters and the target's integer parameters for an input quantised with
        ``(s_in, z_in)``: what hardware mode runs and :func:`hwjax.export` writes.
        ``in_shape`` (or ``geom``) gives the per-example input shape for the padding."""
        if in_shape is None:
            in_shape = (*geom.in_hw, self.kernel.shape[2]) if geom is not None else (1, 1, self.kernel.shape[2])
        s_out, z_out = self.out_qparams()
        return _linear_quant_jit(
            self.kernel[...],
            self._bias(),
            jnp.asarray(s_in, jnp.float32),
            jnp.asarray(z_in, jnp.int32),
            s_out,
            z_out,
            self.w_pin[...],
            self.target,
            self.kind,
            self.node_attrs(in_shape if self.kind != "dense" else (in_shape[-1],)),
        )


class LinearQuant(NamedTuple):
    """Hardware-mode quantisation of a linear layer (see :meth:`_Linear.integer_params`)."""

    params: Any  # the target's integer parameters
    w_int: jax.Array  # float32 integer weights (HWIO)
    b_int: jax.Array  # float32 integer biases
    s_w: jax.Array  # (C_out,) weight scales
    s_out: jax.Array
    z_out: jax.Array
    portable: Any = None  # the node's portable parameters (see hwjax.graph.ops.linear)


def portable_kernel(op: str, w_int: jax.Array) -> jax.Array:
    """The portable int8 kernel layout of ``op`` from an HWIO kernel: conv (O, kh, kw, I),
    depthwise (kh, kw, C), dense (O, I)."""
    w = w_int.astype(jnp.int32)
    if op == "depthwise_conv":
        return w[:, :, 0, :].astype(jnp.int8)
    if op == "dense":
        return jnp.transpose(w[0, 0], (1, 0)).astype(jnp.int8)
    return jnp.transpose(w, (3, 0, 1, 2)).astype(jnp.int8)


def _portable(kernel, bias, s_in, w_pin, op: str):
    """``(w_int, b_int, s_w, portable)``: :func:`weight_scales` (or the pinned scales
    ``w_pin`` where finite), :func:`weights_int`, :func:`bias_int` and the node's portable
    parameters (no gradient)."""
    kernel, bias, s_in = sg(kernel), sg(bias), sg(s_in)
    # Each step computed once (see compute_once): XLA would otherwise inline the exact
    # divisions behind the scales into every consumer, at a large cost in compile time.
    trigger = jax.lax.bitcast_convert_type(s_in, jnp.int32)
    s_w = compute_once(
        lambda k, p: jnp.where(jnp.isfinite(p), p, weight_scales(k, (0, 1, 2))), (kernel, w_pin), trigger
    )
    w_int, b_int = compute_once(
        lambda k, b, si, sw: (weights_int(k, sw), bias_int(b, si * sw)), (kernel, bias, s_in, s_w), trigger
    )
    return w_int, b_int, s_w, {"kernel": portable_kernel(op, w_int), "bias": b_int.astype(jnp.int32), "w_scale": s_w}


# one program per layer shape, shared by to_graph (the portable parameters) and the host recipe
_portable_jit = jax.jit(_portable, static_argnums=4)


def _linear_quant(kernel, bias, s_in, z_in, s_out, z_out, w_pin, target, op: str, attrs) -> LinearQuant:
    """The layer's integer constants (no gradient): :func:`_portable` and the target's
    recipe."""
    return _linear_quant_many(target, [(kernel, bias, s_in, z_in, s_out, z_out, w_pin, op, attrs)])[0]


def _linear_quant_many(target, requests) -> list[LinearQuant]:
    """:func:`_linear_quant` of several layers (``(kernel, bias, s_in, z_in, s_out, z_out,
    w_pin, op, attrs)`` each) on one target, their recipes derived together
    (:func:`hwjax.graph.derive_params`: one batched recipe where the target has one)."""
    parts = [_portable(k, b, s_in, w_pin, op) for k, b, s_in, _, _, _, w_pin, op, _ in requests]
    params = derive_params(
        target,
        [
            (op, attrs, part[3], [Quant.of(sg(s_in), z_in)], Quant.of(sg(s_out), z_out))
            for (_, _, s_in, z_in, s_out, z_out, _, op, attrs), part in zip(requests, parts)
        ],
    )
    return [
        LinearQuant(p, w_int, b_int, s_w, sg(req[4]), req[5], portable)
        for p, (w_int, b_int, s_w, portable), req in zip(params, parts, requests)
    ]


def planned(model, first, call):
    """``call()``, a container's forward, as :func:`hwjax.nn._base.planned_call` plans it
    when that pays: the model is traced (under ``jit`` or ``grad``), in hardware mode, with
    two or more linear layers on targets whose recipe derives several layers at once
    (``OpImpl.params_many``); then their parameters are derived by one recipe per program
    instead of one per layer. Eager calls derive them on the host (no program) and are
    not planned."""

    def layers() -> list[HwLayer]:
        return [m for _, m in nnx.iter_modules(model) if isinstance(m, HwLayer)]

    def wanted() -> bool:
        linear = [m for m in layers() if isinstance(m, _Linear) and m.mode == "hardware"]
        return (
            len(linear) >= 2
            and any(isinstance(m.kernel[...], jax.core.Tracer) for m in linear)
            and any(m.target.lowering(m.kind).params_many is not None for m in linear)
        )

    return planned_call(first, call, _derive_planned, wanted, layers)


def _derive_planned(target, requests) -> list[LinearQuant]:
    """A planned model call's linear layers on ``target`` (:class:`hwjax.nn._base.Plan`):
    :func:`_linear_quant_many`, computed once (materialised, like :func:`_hw_linear`'s)."""
    arrays = [tuple(sg(a) for a in r[:7]) for r in requests]
    static = [r[7:] for r in requests]
    return compute_once(
        lambda *rs: _linear_quant_many(target, [(*a, *st) for a, st in zip(rs, static)]), tuple(arrays), requests[0][3]
    )


_linear_quant_jit = jax.jit(_linear_quant, static_argnums=(7, 8, 9))


def _all_concrete(args) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(args))


def _hw_linear_eager(kernel, bias, xq, s_in, z_in, s_out, z_out, w_pin, *, target, op: str, attrs, return_stats: bool):
    """Hardware mode called eagerly (no jit, no grad: every argument concrete): the same
    integers as :func:`_hw_linear`, with the target's parameters from its host recipe
    (:func:`_host_linear_quant`) instead of compiling the in-graph recipe. None when the
    target has no host recipe or it defers."""
    hw = _host_linear_quant(kernel, bias, s_in, z_in, s_out, z_out, w_pin, target, op, attrs)
    if hw is None:
        return None
    return _hw_run(xq, hw.params, target=target, op=op, attrs=attrs, return_stats=return_stats)


def _host_linear_quant(kernel, bias, s_in, z_in, s_out, z_out, w_pin, target, op: str, attrs):
    """:func:`_linear_quant` on concrete values with the target's host recipe
    (``OpImpl.host_params``, the vendor's own: no recipe program compiled), or None when the
    target has none or it defers. For layers whose weights and quantisation are known
    while their input is traced (a model closed over by ``jit``, a ``vmap`` over the data),
    and for eager calls."""
    impl = target.lowering(op)
    if impl.host_params is None:
        return None
    with evaluated_if_concrete((kernel, bias, s_in, z_in, s_out, z_out, w_pin)):  # computed now, also in a trace
        w_int, b_int, s_w, portable = _portable_jit(kernel, bias, jnp.asarray(s_in, jnp.float32), w_pin, op)
        q_in = [Quant.of(np.float32(s_in), np.int32(z_in))]
        params = impl.host_params(
            target, attrs, jax.tree.map(np.asarray, portable), q_in, Quant.of(np.float32(s_out), np.int32(z_out))
        )
        if params is None:
            return None
        return LinearQuant(
            jax.tree.map(jnp.asarray, params),
            w_int,
            b_int,
            s_w,
            jnp.asarray(s_out, jnp.float32),
            jnp.asarray(z_out, jnp.int32),
            portable,
        )


@functools.partial(jax.jit, static_argnames=("target", "op", "attrs", "return_stats"))
def _hw_run(xq, params, *, target, op: str, attrs, return_stats: bool):
    """The target's exact forward of a linear layer on NHWC ``xq`` (dense: (B, 1, 1, N))
    with given integer parameters; float32 values, as :func:`_hw_linear` returns them."""
    x_int = xq.astype(jnp.int32)
    if op == "dense":
        x_int = x_int[:, 0, 0, :]
    impl = target.lowering(op)
    y, acc = (
        impl.run(target, attrs, params, x_int, return_acc=True)
        if return_stats
        else (impl.run(target, attrs, params, x_int), None)
    )
    if op == "dense":
        y = y[:, None, None, :]
    stats = make_stats(y, relu=attrs.get("activation") == "relu", acc=acc) if return_stats else None
    return y.astype(jnp.float32), stats


@functools.partial(jax.jit, static_argnames=("target", "op", "attrs", "return_stats"))
def _hw_linear(
    kernel, bias, xq, s_in, z_in, s_out, z_out, w_pin, hw=None, *, target, op: str, attrs, return_stats: bool
):
    """Hardware-mode forward of a linear layer (jitted once per configuration): the
    target's exact result with the surrogate's gradient (see :class:`_Linear`). ``xq`` is
    NHWC (dense: (B, 1, 1, N)). ``hw``: the layer's :class:`LinearQuant` when derived
    beforehand for these arguments (a planned model call), else derived here."""
    if hw is None:
        hw = compute_once(
            lambda k, b, si, so, wp: _linear_quant(k, b, si, z_in, so, z_out, wp, target, op, attrs),
            (sg(kernel), sg(bias), sg(s_in), sg(s_out), sg(w_pin)),
            z_in,
        )
    w_q = exact_forward(hw.w_int, kernel / hw.s_w)  # straight-through: d w_q / d w = 1 / s_w
    b_q = exact_forward(hw.b_int, bias / (s_in * hw.s_w))
    x_int = sg(xq).astype(jnp.int32)
    if op == "dense":
        x_int = x_int[:, 0, 0, :]
    impl = target.lowering(op)
    y, acc = (
        compute_once(lambda v, p: impl.run(target, attrs, p, v, return_acc=True), (x_int, hw.params), z_in)
        if return_stats
        else (compute_once(lambda v, p: impl.run(target, attrs, p, v), (x_int, hw.params), z_in), None)
    )
    if op == "dense":
        y = y[:, None, None, :]
    geom = geometry(attrs, xq.shape) if op != "dense" else ConvGeometry.make((1, 1), (1, 1), (1, 1), "VALID")
    groups = xq.shape[-1] if op == "depthwise_conv" else 1
    acc_sur = _float_conv(xq - z_in.astype(jnp.float32), w_q, geom, groups) + b_q
    y_sur = acc_sur * (s_in * hw.s_w / s_out) + z_out.astype(jnp.float32)
    relu = attrs.get("activation") == "relu"
    # clipped where the output saturates; a ReLU also clips at the zero point (on
    # asymmetric targets that is -128 already)
    y_sur = jnp.clip(y_sur, z_out.astype(jnp.float32) if relu else -128.0, 127.0)
    stats = make_stats(y, relu=relu, acc=acc) if return_stats else None
    return exact_forward(y, y_sur), stats


@functools.partial(jax.jit, static_argnums=0)
def _float_weights(kind: str, kernel, w_scale, bias, s_in):
    """Float HWIO weights ``kernel * w_scale``, biases ``bias * (s_in * w_scale)`` and the
    float32 weight scales of a portable linear node (one program; float32 products)."""
    k = jnp.asarray(kernel).astype(jnp.float32)
    s_w = jnp.asarray(w_scale, jnp.float32)
    hwio = {
        "conv": lambda v: jnp.transpose(v, (1, 2, 3, 0)),
        "dense": lambda v: v.T[None, None],
        "depthwise_conv": lambda v: v[:, :, None, :],
    }[kind](k)
    b = jnp.asarray(bias).astype(jnp.float32) * (jnp.asarray(s_in, jnp.float32) * s_w)
    return hwio * s_w, b, s_w


class Conv(_Linear):
    """2-D convolution, NHWC input, kernel ``(kh, kw, in, out)`` (HWIO), optional fused ReLU.

    ``padding``: ``"SAME"``, ``"VALID"``, an int, or ``((top, bottom), (left, right))``.
    In hardware mode padded taps read the input zero point (xformer's pad value), so
    they are real zeros. ReLU is fused the TFLite way: the output range starts at 0,
    hence ``zero_point = -128`` and the int8 clamp is the ReLU. See :class:`_Linear`
    for the quantisation and the surrogate gradient.
    """

    kind = "conv"

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        a = node.attrs
        return dict(
            in_features=inputs[0].shape[-1],
            out_features=a["features"],
            kernel_size=a["kernel_size"],
            strides=a.get("stride", (1, 1)),
            padding=a.get("padding", ((0, 0), (0, 0))),
            activation=a.get("activation"),
        )

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size,
        *,
        strides=1,
        padding: Padding = "SAME",
        activation=None,
        use_bias: bool = True,
        target,
        mode: Mode = "float",
        learn_scale: bool = False,
        rngs: nnx.Rngs,
        kernel_init: Callable = nnx.initializers.lecun_normal(),
    ):
        kh, kw = _pair(kernel_size, "kernel_size", "Conv")
        in_features = _positive_int(in_features, "in_features", "Conv")
        out_features = _positive_int(out_features, "out_features", "Conv")
        self._init_linear(
            (kh, kw, in_features, out_features),
            out_features,
            use_bias,
            activation,
            strides,
            padding,
            rngs,
            kernel_init,
            target,
            mode,
            learn_scale,
            in_features=in_features,
            out_features=out_features,
            kernel_size=(kh, kw),
        )

    def __call__(self, x, *, return_stats: bool = False):
        y, stats = self._forward4d(x, return_stats)
        return _ret(y, stats, return_stats)


class DepthwiseConv(_Linear):
    """Depthwise 2-D convolution (channel multiplier 1): kernel ``(kh, kw, 1, C)``.

    Same modes, padding rule, ReLU fusion and surrogate as :class:`Conv`; in hardware
    mode the target's depthwise kernel runs (XS3: one saturating VLMACC per tap).
    """

    kind = "depthwise_conv"

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        a = node.attrs
        return dict(
            features=inputs[0].shape[-1],
            kernel_size=a["kernel_size"],
            strides=a.get("stride", (1, 1)),
            padding=a.get("padding", ((0, 0), (0, 0))),
            activation=a.get("activation"),
        )

    groups_is_depthwise = True

    def __init__(
        self,
        features: int,
        kernel_size,
        *,
        strides=1,
        padding: Padding = "SAME",
        activation=None,
        use_bias: bool = True,
        target,
        mode: Mode = "float",
        learn_scale: bool = False,
        rngs: nnx.Rngs,
        kernel_init: Callable = nnx.initializers.lecun_normal(),
    ):
        kh, kw = _pair(kernel_size, "kernel_size", "DepthwiseConv")
        features = _positive_int(features, "features", "DepthwiseConv")
        self._init_linear(
            (kh, kw, 1, features),
            features,
            use_bias,
            activation,
            strides,
            padding,
            rngs,
            kernel_init,
            target,
            mode,
            learn_scale,
            features=features,
            kernel_size=(kh, kw),
        )

    def __call__(self, x, *, return_stats: bool = False):
        y, stats = self._forward4d(x, return_stats)
        return _ret(y, stats, return_stats)


class Dense(_Linear):
    """Fully connected layer ``y = x @ kernel + bias``, kernel ``(in, out)``, optional ReLU.

    Hardware mode runs it as the target's 1x1 convolution on a 1x1 image (how xformer
    lowers FULLY_CONNECTED for XS3); quantisation and surrogate as :class:`_Linear`.
    """

    kind = "dense"

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return dict(
            in_features=inputs[0].shape[-1],
            out_features=node.attrs["features"],
            activation=node.attrs.get("activation"),
        )

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation=None,
        use_bias: bool = True,
        target,
        mode: Mode = "float",
        learn_scale: bool = False,
        rngs: nnx.Rngs,
        kernel_init: Callable = nnx.initializers.lecun_normal(),
    ):
        in_features = _positive_int(in_features, "in_features", "Dense")
        out_features = _positive_int(out_features, "out_features", "Dense")
        self._init_linear(
            (1, 1, in_features, out_features),
            out_features,
            use_bias,
            activation,
            1,
            "VALID",
            rngs,
            kernel_init,
            target,
            mode,
            learn_scale,
            in_features=in_features,
            out_features=out_features,
        )

    def __call__(self, x, *, return_stats: bool = False):
        x = _check_input(self, x, ndim=2, channels=self.kernel.shape[2])
        q = isinstance(x, QArray)
        v = x.q if q else x
        x4 = x.with_q(v[:, None, None, :]) if q else v[:, None, None, :]
        y, stats = self._forward4d(x4, return_stats)
        y = y.with_q(y.q[:, 0, 0, :]) if isinstance(y, QArray) else y[:, 0, 0, :]
        return _ret(y, stats, return_stats)


# ------------------------------------------------------------------------------ pools


class _Pool(HwLayer):
    def __init__(self, window, *, strides=None, target, mode: Mode = "float"):
        self.window = _pair(window, "window", type(self).__name__)
        self.strides = _pair(strides if strides is not None else self.window, "strides", type(self).__name__)
        super().__init__(target, mode=mode, window=self.window, strides=self.strides)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"window": self.window, "strides": self.strides})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"window": tuple(node.attrs["window"]), "strides": tuple(node.attrs["strides"])}

    def _pool_int(self, x_int, x: QArray):
        """The target's exact pool of ``x_int`` (the output keeps ``x``'s quantisation)."""
        attrs, q = self.node_attrs(), Quant.of(sg(x.scale), x.zero_point)
        return self.op_run(attrs, self.op_params(attrs, None, [q], q), x_int)

    def _check(self, x):
        """The 4-D input, checked: ShapeError naming the layer when the window does not fit
        (the pool would have no output pixel)."""
        x = _check_input(self, x, ndim=4)
        hw = tuple((x.q if isinstance(x, QArray) else x).shape[1:3])
        if hw[0] < self.window[0] or hw[1] < self.window[1]:
            raise ShapeError(
                f"{type(self).__name__}: window {self.window} does not fit the input's "
                f"(height, width) = {hw} (no output pixel)"
            )
        return x

    def _reduce(self, x, init, op):
        return jax.lax.reduce_window(x, init, op, (1, *self.window, 1), (1, *self.strides, 1), "VALID")


class MaxPool(_Pool):
    """Max pooling over ``window`` (no padding), NHWC. Keeps the input scale and zero point.

    Hardware mode: the target's int8 max (exact); gradient flows to the maximal input
    (surrogate: float max pooling of the same integers).
    """

    kind = "maxpool"

    def __call__(self, x, *, return_stats: bool = False):
        x = self._check(x)
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            y = self._reduce(x, -jnp.inf, jax.lax.max)
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        x_int = sg(x.q).astype(jnp.int32)  # int32: TFLite's maxpool pads with -2**31
        y_int = compute_once(lambda v: self._pool_int(v, x), (x_int,), x.zero_point)
        y = exact_forward(y_int, self._reduce(x.q, -jnp.inf, jax.lax.max))
        return _ret(x.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)  # cannot clip


class AvgPool(_Pool):
    """Average pooling over ``window`` (no padding), NHWC. Keeps the input scale and zero point.

    Hardware mode: the target's integer average (XS3: ``avgpool2d`` scale-and-shift,
    spec §6.1); surrogate: the float mean of the same integers.
    """

    kind = "avgpool"

    def __call__(self, x, *, return_stats: bool = False):
        n = self.window[0] * self.window[1]
        x = self._check(x)
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            y = self._reduce(x, 0.0, jax.lax.add) / n
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        x_int = sg(x.q).astype(jnp.int32)  # int32: TFLite's maxpool pads with -2**31
        y_int = compute_once(lambda v: self._pool_int(v, x), (x_int,), x.zero_point)
        y = exact_forward(y_int, clip_int8(self._reduce(x.q, 0.0, jax.lax.add) / n))
        return _ret(x.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)  # an average of int8


# ------------------------------------------------------------------------- Add, LUT


class Add(HwLayer):
    """Element-wise sum of two tensors, optional ReLU, requantised to its own output scale.

    Hardware mode: the target's integer add (XS3: ``add_elementwise``, spec §6.4).
    Surrogate: ``clip((s1 (q1 - z1) + s2 (q2 - z2)) / s_out + z_out, -128, 127)``.
    """

    kind = "add"
    requantizes = True

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"activation": self.activation})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"activation": node.attrs.get("activation")}

    def __init__(self, *, activation=None, target, mode: Mode = "float", learn_scale: bool = False):
        self.activation = check_activation(activation)
        super().__init__(target, mode=mode, learn_scale=learn_scale, activation=self.activation)

    def __call__(self, x1, x2, *, return_stats: bool = False):
        relu = self.activation == "relu"
        x1 = x1 if isinstance(x1, QArray) else V.as_array(x1, "Add input x1")
        x2 = x2 if isinstance(x2, QArray) else V.as_array(x2, "Add input x2")
        s1, s2 = ((v.q if isinstance(v, QArray) else v).shape for v in (x1, x2))
        if s1 != s2:
            raise ShapeError(f"Add: inputs x1 and x2 must have the same shape, got {s1} and {s2}")
        return binary_forward(self, x1, x2, lambda a, b: _relu(a + b, self.activation), relu, return_stats)


def binary_forward(layer: HwLayer, x1, x2, real_fn, relu: bool, return_stats: bool):
    """The forward of a requantising two-input layer (:class:`Add`, :class:`hwjax.nn.Mul`):
    float modes ``real_fn(x1, x2)`` (calibrate mode records its range); hardware mode the
    target's integer op on both inputs' integers with their and the output's quantisation,
    with the straight-through surrogate ``clip(real_fn(real(x1), real(x2)) / s_out + z_out,
    -128, 127)``."""
    if not (isinstance(x1, QArray) and isinstance(x2, QArray)):
        if layer.mode == "hardware":
            layer._require_q(x1, "x1")
            layer._require_q(x2, "x2")
        y = real_fn(x1, x2)
        if layer.mode == "calibrate":
            layer.record(y)
        return _ret(y, layer.float_stats(y, relu), return_stats)
    s_out, z_out = layer.out_qparams()
    attrs = layer.node_attrs()
    params = layer.op_params(
        attrs,
        None,
        [Quant.of(sg(x1.scale), x1.zero_point), Quant.of(sg(x2.scale), x2.zero_point)],
        Quant.of(sg(s_out), z_out),
    )
    a, b = sg(x1.q).astype(jnp.int32), sg(x2.q).astype(jnp.int32)
    y_int = compute_once(lambda u, v, p: layer.op_run(attrs, p, u, v), (a, b, params), z_out)
    y_sur = clip_int8(real_fn(x1.dequantize(), x2.dequantize()) / s_out + z_out.astype(jnp.float32))
    return _ret(QArray(exact_forward(y_int, y_sur), s_out, z_out), make_stats(y_int, relu=relu), return_stats)


class LutActivation(HwLayer):
    """Element-wise activation ``fn`` (``"sigmoid"``, ``"tanh"``, ...) run by the target's LUT.

    Float modes: ``fn(x)``. Hardware mode: the target's table lookup (XS3: a 256-entry
    int8 table, ``lookup8``; NVDLA: the SDP LUT programmed for ``fn``) requantised to
    the calibrated output range.

    Gradient in hardware mode: on targets whose LUT has slopes (NVDLA), the LUT's true
    slopes: the derivative of the integer pipeline's piecewise-linear interpolation
    at the input (segment or extrapolation actually used, times the convertors'
    scales; 0 where a convertor saturated). Elsewhere (XS3's table) the surrogate
    ``clip(fn(s_in (q - z_in)) / s_out + z_out, -128, 127)``, i.e. the gradient of
    ``fn`` at the dequantised input. The learned output scale (``learn_scale``) gets
    the gradient of that surrogate in both cases.
    """

    kind = "lut"
    requantizes = True

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"fn": self.fn})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"fn": node.attrs["fn"]}

    def __init__(self, fn: str, *, target, mode: Mode = "float", learn_scale: bool = False):
        if fn not in LUT_FUNCTIONS:
            raise RangeError(f"fn must be one of {tuple(LUT_FUNCTIONS)}, got {fn!r}")
        self.fn = fn
        super().__init__(target, mode=mode, learn_scale=learn_scale, fn=fn)
        q = Quant.of(jnp.float32(1.0), jnp.int32(0))
        shapes = jax.eval_shape(lambda: self.op_params(self.node_attrs(), None, [q], q))
        self.derived = Derived(
            {
                "key": jnp.full((4,), jnp.nan, jnp.float32),
                "params": jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes),
            }
        )

    def lut_params(self, attrs, q_in, q_out):
        """The target's table parameters for ``(q_in, q_out)``: derived (and kept in
        :class:`Derived`) when the scales are concrete; inside ``jit`` the kept ones where
        the key matches, so a training step with fixed scales never calls back to the
        host, and derived in the program (a host callback on XS3) where it does not."""
        key = jnp.stack(
            [jnp.asarray(v, jnp.float32) for v in (q_in[0].scale, q_in[0].zero_point, q_out.scale, q_out.zero_point)]
        )
        if _all_concrete(key):
            params = self.op_params(attrs, None, q_in, q_out)
            try:
                self.derived.set_value({"key": key, "params": params})
            except TraceContextError:  # called inside a transformation (e.g. grad): not kept
                pass
            return params
        kept = self.derived.get_value()
        return jax.lax.cond(
            jnp.all(kept["key"] == key), lambda: kept["params"], lambda: self.op_params(attrs, None, q_in, q_out)
        )

    def __call__(self, x, *, return_stats: bool = False):
        f = lut_function(self.fn)
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            y = f(x)
            if self.mode == "calibrate":
                self.record(y)
            return _ret(y, self.float_stats(y, relu=False), return_stats)
        s_out, z_out = self.out_qparams()
        attrs = self.node_attrs()
        params = self.lut_params(attrs, [Quant.of(sg(x.scale), x.zero_point)], Quant.of(sg(s_out), z_out))
        x_int = sg(x.q).astype(jnp.int32)
        y_int = compute_once(lambda v, p: self.op_run(attrs, p, v), (x_int, params), z_out)
        y_sur = clip_int8(f(x.dequantize()) / s_out + z_out.astype(jnp.float32))
        if self.target.lut_slopes:  # input gradient from the LUT itself, scale gradient from y_sur
            y_scale = clip_int8(sg(f(x.dequantize())) / s_out + z_out.astype(jnp.float32))
            y_sur = self.op_run(attrs, params, x.q.astype(jnp.float32)) + (y_scale - sg(y_scale))
        return _ret(QArray(exact_forward(y_int, y_sur), s_out, z_out), make_stats(y_int, relu=False), return_stats)


# ------------------------------------------------ ops of imported TFLite graphs


_CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def _clamp_fn(fn: str) -> Callable[[jax.Array], jax.Array]:
    lo, hi = _CLAMPS[fn]
    return lambda v: jnp.clip(v, lo, hi)


class _Unary(HwLayer):
    """Shared forward of the requantising element-wise ops :class:`Activation` and
    :class:`Requantize`: ``y = q_out(f(real(x)))`` with ``f`` :meth:`real_fn`."""

    requantizes = True

    def real_fn(self, v: jax.Array) -> jax.Array:
        raise NotImplementedError

    def __call__(self, x, *, return_stats: bool = False):
        relu = self.kind == "activation"  # the lower bound is the clamp: not counted as saturation
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            x = V.as_array(x, f"{type(self).__name__} input x")
            y = self.real_fn(x)
            if self.mode == "calibrate":
                self.record(y)
            return _ret(y, self.float_stats(y, relu=relu), return_stats)
        if self.mode != "hardware":
            raise ArgTypeError(f"{type(self).__name__} in {self.mode!r} mode takes float inputs, got a QArray")
        s_out, z_out = self.out_qparams()
        attrs = self.node_attrs(tuple(x.q.shape[1:]))
        params = self.op_params(attrs, None, [Quant.of(sg(x.scale), x.zero_point)], Quant.of(sg(s_out), z_out))
        x_int = sg(x.q).astype(jnp.int32)
        y_int = compute_once(lambda v, p: self.op_run(attrs, p, v), (x_int, params), z_out)
        y_sur = clip_int8(self.real_fn(x.dequantize()) / s_out + z_out.astype(jnp.float32))
        return _ret(QArray(exact_forward(y_int, y_sur), s_out, z_out), make_stats(y_int, relu=relu), return_stats)


class Activation(_Unary):
    """Clamping activation ``fn`` requantised to its own output scale (graph op ``activation``,
    e.g. TFLite's separate RELU / RELU6 / RELU_N1_TO_1 operators).

    ``fn``: ``"relu"`` (``max(v, 0)``), ``"relu6"`` (``clip(v, 0, 6)``) or
    ``"relu_n1_to_1"`` (``clip(v, -1, 1)``).

    Float modes: ``fn(x)`` (calibrate mode records its range). Hardware mode: the
    target's exact integer op on the input integers with the input's and the output's
    quantisation (TFLite: ``clamp(MBQM(q - z_in, m, e) + z_out, act_min, act_max)``, per
    runtime; on ``"tflm"`` RELU6 does not requantise, as the target documents).
    Gradient (straight-through surrogate): that of
    ``clip(fn(s_in (q - z_in)) / s_out + z_out, -128, 127)``, i.e. ``s_in / s_out`` where the
    input lies strictly inside the clamp and the output is not saturated, 0 outside
    (exactly at a clamp bound JAX's min/max tie rule gives a fraction of it); the
    output scale gets this surrogate's gradient when learned.
    """

    kind = "activation"

    def __init__(self, fn: str, *, target, mode: Mode = "float", learn_scale: bool = False):
        if fn not in _CLAMPS:
            raise RangeError(f"fn must be one of {tuple(_CLAMPS)}, got {fn!r}")
        self.fn = fn
        super().__init__(target, mode=mode, learn_scale=learn_scale, fn=fn)

    def real_fn(self, v):
        return _clamp_fn(self.fn)(v)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"fn": self.fn})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"fn": node.attrs["fn"]}


class Requantize(_Unary):
    """Changes the quantisation of an integer tensor (graph op ``requantize``, TFLite's
    QUANTIZE int8 -> int8): ``y = q_out(real(x))``.

    Float modes: the identity (calibrate mode records the range, which fixes the output
    quantisation). Hardware mode: the target's exact integer requantisation (TFLite:
    LiteRT's ``Requantize`` per runtime). Gradient (straight-through surrogate): that of
    ``clip(s_in (q - z_in) / s_out + z_out, -128, 127)``: ``s_in / s_out`` where the
    output is not saturated, 0 where it is.
    """

    kind = "requantize"

    def __init__(self, *, target, mode: Mode = "float", learn_scale: bool = False):
        super().__init__(target, mode=mode, learn_scale=learn_scale)

    def real_fn(self, v):
        return v


class Reshape(HwLayer):
    """Row-major reshape of each example to ``shape`` (graph op ``reshape``; the batch axis
    stays). Keeps the quantisation; exact in every mode (hardware mode runs the
    target's reshape on the integers of a :class:`QArray`; a float array, such as a float
    tensor of an imported ONNX graph, is reshaped as it is). Gradient: reshaped back (the
    identity)."""

    kind = "reshape"

    def __init__(self, shape, *, target, mode: Mode = "float"):
        try:
            self.shape = tuple(int(_positive_int(d, "shape entry", "Reshape")) for d in shape)
        except TypeError:
            raise ArgTypeError(f"Reshape: shape must be a sequence of positive ints, got {shape!r}") from None
        super().__init__(target, mode=mode)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"shape": self.shape})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        return {"shape": tuple(node.attrs["shape"])}

    def _check(self, shape):
        if int(np.prod(shape[1:])) != int(np.prod(self.shape)):
            raise ShapeError(f"Reshape: cannot reshape examples of shape {tuple(shape[1:])} to {self.shape}")

    def __call__(self, x, *, return_stats: bool = False):
        if not isinstance(x, QArray):  # float modes, or a float tensor of an imported graph
            x = V.as_array(x, "Reshape input x")
            self._check(x.shape)
            y = x.reshape(x.shape[0], *self.shape)
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        self._check(x.q.shape)
        attrs = self.node_attrs()
        y_int = compute_once(lambda v: self.op_run(attrs, None, v), (sg(x.q).astype(jnp.int32),), x.zero_point)
        y = exact_forward(y_int, x.q.reshape(x.q.shape[0], *self.shape))
        return _ret(x.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)


class Pool(HwLayer):
    """Average or maximum pooling with explicit padding (graph op ``pool``: TFLite's SAME
    pools), NHWC. Keeps the input's scale and zero point.

    ``fn``: ``"avg"`` or ``"max"``; ``padding``: ``((top, bottom), (left, right))``. Taps
    outside the image are left out: a max ignores them, an average divides by the number
    of in-image taps of its window.

    Float modes: that float pool. Hardware mode: the target's exact integer pool on the
    input integers (TFLite: LiteRT's rounding average / max, clamped to int8). Gradient
    (surrogate): the same float pool of the integers ``q`` (the max's gradient goes to
    the maximal in-image tap, the average's equally to the in-image taps), clipped to
    ``[-128, 127]``.
    """

    kind = "pool"

    def __init__(self, fn: str, window, *, strides=None, padding=((0, 0), (0, 0)), target, mode: Mode = "float"):
        if fn not in ("avg", "max"):
            raise RangeError(f"fn must be 'avg' or 'max', got {fn!r}")
        self.fn = fn
        self.window = _pair(window, "window", "Pool")
        self.strides = _pair(strides if strides is not None else self.window, "strides", "Pool")
        p = _check_padding(padding)
        if isinstance(p, str):
            raise RangeError(f"Pool: padding must be explicit ((top, bottom), (left, right)), got {padding!r}")
        self.padding = p
        super().__init__(target, mode=mode)

    def node_attrs(self, in_shape=None) -> Attrs:
        return Attrs({"fn": self.fn, "window": self.window, "strides": self.strides, "padding": self.padding})

    @classmethod
    def node_kwargs(cls, node, inputs) -> dict:
        a = node.attrs
        return {
            "fn": a["fn"],
            "window": tuple(a["window"]),
            "strides": tuple(a["strides"]),
            "padding": tuple(tuple(int(v) for v in q) for q in a.get("padding", ((0, 0), (0, 0)))),
        }

    def _float_pool(self, v: jax.Array) -> jax.Array:
        dims, strides = (1, *self.window, 1), (1, *self.strides, 1)
        pad = ((0, 0), *self.padding, (0, 0))
        if self.fn == "max":
            return jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, dims, strides, pad)
        total = jax.lax.reduce_window(v, 0.0, jax.lax.add, dims, strides, pad)
        count = jax.lax.reduce_window(jnp.ones((1, *v.shape[1:3], 1), v.dtype), 0.0, jax.lax.add, dims, strides, pad)
        return total / count

    def __call__(self, x, *, return_stats: bool = False):
        x = _check_input(self, x, ndim=4)
        if not isinstance(x, QArray):
            if self.mode == "hardware":
                self._require_q(x)
            y = self._float_pool(x.astype(jnp.float32))
            return _ret(y, make_stats(None, relu=False, y_float=y), return_stats)
        attrs, q = self.node_attrs(), Quant.of(sg(x.scale), x.zero_point)
        x_int = sg(x.q).astype(jnp.int32)
        y_int = compute_once(
            lambda v: self.op_run(attrs, self.op_params(attrs, None, [q], q), v), (x_int,), x.zero_point
        )
        y = exact_forward(y_int, clip_int8(self._float_pool(x.q)))
        return _ret(x.with_q(y), make_stats(None, relu=False, y_float=y), return_stats)
