"""Target objects: which chip (and which model of it) a hwjax layer runs on.

A target is a frozen dataclass. ``hwjax.nn`` layers call its methods to turn their
quantised float-side parameters into the chip's integer parameters (``*_params``,
jittable) and to run the chip's exact integer kernels (``conv``, ``depthwise``,
``maxpool``, ``avgpool``, ``add``, ``lut``). Targets compose the chip packages
(:mod:`hwjax.xs3`, :mod:`hwjax.nvdla`), which compose :mod:`hwjax.core`.

Every target answers ``check_layer(kind, **config)`` at layer construction and raises
``NotImplementedError`` naming the layer kind and the kinds it supports when it cannot
run a layer.
"""

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


@jax.jit
def div_rn(a, b) -> jax.Array:
    """IEEE float32 division ``a / b``, correctly rounded (ties to even), on every backend.

    XLA's float32 division is not correctly rounded on every backend (on CPU it differs
    from IEEE division in the last bit for a large fraction of inputs), so every float
    computation that feeds integer parameters or integer activations uses this
    instead: the quotient of the 24-bit mantissas is formed with an approximate
    division and then corrected exactly in integer arithmetic. Handles signs and
    zeros; normal (non-denormal, finite) operands and results. No gradient (used on
    quantisation parameters and inside straight-through constructions).
    """
    from hwjax.core import wide as W

    a = jax.lax.stop_gradient(jnp.asarray(a, jnp.float32))
    b = jax.lax.stop_gradient(jnp.asarray(b, jnp.float32))
    a, b = jnp.broadcast_arrays(a, b)
    fa, ea = jnp.frexp(jnp.abs(a))
    fb, eb = jnp.frexp(jnp.abs(b))
    ma = (fa * 2.0**24).astype(jnp.int32)  # in [2**23, 2**24)
    mb = jnp.maximum((fb * 2.0**24).astype(jnp.int32), 1)
    s = jnp.where(ma >= mb, 23, 24)  # ma 2**s / mb in [2**23, 2**24)
    q0 = jnp.floor(ma.astype(jnp.float32) / mb.astype(jnp.float32) * _pow2(s)).astype(jnp.int32)
    r = W.sub(W.shift_left(W.from_int32(ma), s), W.mul_int32(q0, mb))  # small: |r| < 16 mb
    r32 = jax.lax.bitcast_convert_type(r.lo, jnp.int32)
    q = q0 + jnp.floor_divide(r32, mb)
    rem = jnp.mod(r32, mb)
    up = (2 * rem > mb) | ((2 * rem == mb) & ((q & 1) == 1))
    q = q + up.astype(jnp.int32)
    e = ea - eb - s
    e1 = jnp.clip(e, -126, 127)
    mag = q.astype(jnp.float32) * _pow2(e1) * _pow2(jnp.clip(e - e1, -126, 127))
    out = jnp.where(jnp.signbit(a) != jnp.signbit(b), -mag, mag)
    return jnp.where(a == 0, jnp.zeros_like(out), out)


def _pow2(n) -> jax.Array:
    """``2.0**n`` as float32, exactly, for int32 ``n`` in [-126, 127] (built from its bits)."""
    n = jnp.clip(jnp.asarray(n, jnp.int32), -126, 127)
    return jax.lax.bitcast_convert_type((n + 127) << 23, jnp.float32)


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


def _pytree(cls):
    """Registers a frozen dataclass as a pytree: array fields are leaves, the rest static."""
    fields = [f.name for f in dataclasses.fields(cls)]
    meta = [f.name for f in dataclasses.fields(cls) if f.metadata.get("static")]
    data = [f for f in fields if f not in meta]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)


def _static():
    return dataclasses.field(metadata={"static": True})


# --------------------------------------------------------------------- base class


@dataclass(frozen=True)
class Target:
    """Base class of hwjax targets (see the module docstring)."""

    name: ClassVar[str] = "target"
    layers: ClassVar[frozenset[str]] = frozenset()
    symmetric_activations: ClassVar[bool] = False

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




# =============================================================================== XS3


def _xs3():
    import hwjax.xs3 as xs3  # imported lazily: the chip package is built separately

    return xs3


def _need(module, name: str, what: str):
    fn = getattr(module, name, None)
    if fn is None:
        raise NotImplementedError(f"{module.__name__}.{name} is not available, so {what} cannot run yet")
    return fn


def _float_exponent(v: jax.Array) -> jax.Array:
    """frexp exponent ``e`` with ``v = f * 2**e``, ``0.5 <= |f| < 1`` (0 for v = 0)."""
    return jnp.where(v == 0, 0, jnp.frexp(v)[1]).astype(jnp.int32)


def _pad_image(x, pad_value, geom: ConvGeometry) -> jax.Array:
    """int8 NHWC ``x`` padded by ``geom.padding`` with ``pad_value`` (may be traced)."""
    (pt, pb), (pl, pr) = geom.padding
    return jnp.pad(x.astype(jnp.int8), ((0, 0), (pt, pb), (pl, pr), (0, 0)),
                   constant_values=jnp.asarray(pad_value).astype(jnp.int8))


def _rint_wide(t, s) -> jax.Array:
    """``rint(t / 2**s)`` (ties to even) saturated to int32, for Wide ``t`` and int32
    ``s`` (negative ``s`` shifts left)."""
    from hwjax.core import wide as W

    right = W.shift_right(t, jnp.clip(s, 0, 63), "half_even")
    left = W.shift_left(t, jnp.clip(-s, 0, 62))
    return W.saturate_to_int32(W.where(s >= 0, right, left), -(2**31), 2**31 - 1)[0]


def _sig_bits(v: jax.Array) -> jax.Array:
    """Two's-complement width of int32 ``v``, sign bit included."""
    return 33 - jax.lax.clz(jnp.where(v >= 0, v, ~v))


@jax.jit
def xs3_otfn_params(kernel_q, bias_q, *, s_in, z_in, s_w, s_out, z_out):
    """xformer's group-wise ``otfn_int8`` parameters (spec xs3.md §4.5), jittable and exact.

    The same recipe as :func:`hwjax.xs3.otfn_params_from_scales` (host-side NumPy,
    float64) in exact integer arithmetic, so that it runs inside ``jit`` on the
    device (hardware-aware training re-derives the parameters at every step). Every
    quantity is evaluated exactly: ``m_c = float32(float32(s_in s_w[c]) / s_out)`` is
    split into ``mant * 2**e`` and ``beta_c = (bias_q[c] - z_in sum_k w[c,k]) m_c +
    z_out`` is kept as an exact two-word rational; the narrowing floors/ceils, the
    ``rint`` roundings (ties to even) and the A/M search (channel order, first
    failing channel decides, significant-bit tracking) follow the helper step by
    step. The results are therefore identical to the helper's wherever its float64
    arithmetic is exact, which holds for int8 layers with
    ``|bias_q - z_in sum w| < 2**29`` (tested against it on random layers).

    Args:
      kernel_q: int8 values, output channel first (C, ...).
      bias_q: (C,) int32 biases in units of ``s_in * s_w``.
      s_in, z_in, s_w ((C,)), s_out, z_out: the quantisation parameters.

    Returns:
      ``(multipliers, biases, shifts)``: int32 arrays (C,), (C,) of int16 values and
      ``shifts = [initial_shift, final_shr]``. (The helper raises when the shifts leave
      the assembly's ranges; here they are returned as found and checked by callers
      when concrete, e.g. :func:`hwjax.export`.)
    """
    from hwjax.core import shift_right
    from hwjax.core import wide as W

    c = kernel_q.shape[0]
    w = kernel_q.reshape(c, -1).astype(jnp.int32)
    f32 = jnp.float32
    m = div_rn(jnp.asarray(s_in, f32) * jnp.asarray(s_w, f32), jnp.asarray(s_out, f32))
    z_in, z_out = jnp.asarray(z_in, jnp.int32), jnp.asarray(z_out, jnp.int32)
    frac, exp = jnp.frexp(m)
    mant = jnp.where(m > 0, (frac * 2.0**24).astype(jnp.int32), 0)  # m = mant * 2**-k exactly
    k = jnp.clip(jnp.where(m > 0, 24 - exp, 0), 0, 62).astype(jnp.int32)  # m >= 2**-38 assumed
    i32 = jnp.int32  # explicit accumulation types: results must not depend on jax_enable_x64
    bq = bias_q.astype(i32) - z_in * w.sum(axis=1, dtype=i32)
    amax = jnp.where(w > 0, 127 * w, -128 * w).sum(axis=1, dtype=i32)
    amin = jnp.where(w > 0, -128 * w, 127 * w).sum(axis=1, dtype=i32)

    def shl(v, s):  # int32 v * 2**s as Wide
        return W.shift_left(W.from_int32(v), s)

    def floor_div_m(n):
        """floor(n / m) for int32 n (|n| <= 255), exact where |n / m| <= 2**30, else +-2**30."""
        q = n.astype(f32) / jnp.where(m > 0, m, 1.0)
        big = jnp.abs(q) > 2.0**30
        f1 = jnp.floor(jnp.clip(q, -(2.0**30), 2.0**30)).astype(jnp.int32)
        r = W.sub(shl(n, k), W.mul_int32(f1, mant))  # n 2**k - f1 mant, |r| < 2**31
        r32 = jax.lax.bitcast_convert_type(r.lo, jnp.int32)
        f = f1 + jnp.floor_divide(r32, jnp.maximum(mant, 1))
        return jnp.where(big, jnp.where(q > 0, 2**30, -(2**30)), f)

    # §4.5 step 2: narrow to the accumulators whose output is not clamped
    lo_end = floor_div_m(-128 - z_out) - bq
    hi_end = -floor_div_m(z_out - 127) - bq  # ceil((127 - z_out) / m) - bq
    live = m > 0
    amin = jnp.where(live, jnp.maximum(amin, lo_end), amin)
    amax = jnp.where(live, jnp.minimum(amax, hi_end), amax)
    const = ~live | (amin > amax)
    # beta = t * 2**-k with t = bq mant + z_out 2**k; constant channels: clip(beta + m amin)
    t = W.add(W.mul_int32(bq, mant), shl(z_out, k))
    t_const = W.add(t, W.mul_int32(amin, mant))
    lo_b, hi_b = shl(jnp.full_like(k, -128), k), shl(jnp.full_like(k, 127), k)
    t_const = W.where(W.lt(t_const, lo_b), lo_b, W.where(W.lt(hi_b, t_const), hi_b, t_const))
    t = W.where(const, t_const, t)
    mant = jnp.where(const, 0, mant)
    amin, amax = jnp.where(const, 0, amin), jnp.where(const, 0, amax)

    # §4.5 step 3: the exponent search
    def bitlen(v):
        return 32 - jax.lax.clz(jnp.abs(v))

    has_accu = jnp.any(amin != 0) | jnp.any(amax != 0)
    has_mul = jnp.any(mant != 0)
    frexp_m = jnp.where(mant != 0, exp, -(2**20))  # frexp exponent of the live multipliers
    A0 = 15 - jnp.maximum(bitlen(amin), bitlen(amax)).max()
    M0 = 15 - frexp_m.max()

    def scale_accu(v, A):  # v * 2**A, or rshr(v, -A); values that matter fit int32
        return jnp.where(A >= 0, v << jnp.clip(A, 0, 31), shift_right(v, jnp.maximum(-A, 0), rounding="half_up"))

    def mul16(M):  # rint(m * 2**M)
        return _rint_wide(W.from_int32(mant), k - M)

    def b16(B):  # rint(beta * 2**B)
        return _rint_wide(t, k - B)

    nz_accu = lambda v: jnp.where(v != 0, _sig_bits(v), 0)  # noqa: E731
    accu_bits0 = jnp.maximum(nz_accu(scale_accu(amin, A0)), nz_accu(scale_accu(amax, A0))).max()
    mul_bits0 = jnp.where(mant != 0, _sig_bits(mul16(M0)), 0).max()

    def fits16(v):
        return (v >= -(2**15)) & (v <= 2**15 - 1)

    def finals(A, M):  # §4.5 step 4 for exponents (A, M)
        B = A + M - 14
        mul = jnp.clip(mul16(M), -(2**15), 2**15 - 1)
        s = k - B  # beta 2**B = t / 2**s;  beta 2**B - 1 = (t - 2**s) / 2**s
        one = shl(jnp.ones_like(k), jnp.clip(s, 0, 62))
        bias = _rint_wide(W.where(s >= 0, W.sub(t, one), t), s)
        bias = jnp.where(s >= 0, bias, jnp.maximum(bias, -(2**31) + 1) - 1)
        bias = jnp.where(B >= 0, bias, b16(B))
        return mul, jnp.clip(bias, -(2**15), 2**15 - 1)

    def body(state):
        A, M, ab, mb, _, it, mul, bias = state
        e_lo, e_hi = scale_accu(amin, A), scale_accu(amax, A)
        fail_a = ~(fits16(e_lo) & fits16(e_hi))
        m16 = mul16(M)
        fail_m = ~fits16(m16)
        b = b16(A + M - 14)
        m16c = jnp.clip(m16, -(2**15), 2**15 - 1)
        p_lo = shift_right(jnp.clip(e_lo, -(2**15), 2**15) * m16c, 14, rounding="half_up")
        p_hi = shift_right(jnp.clip(e_hi, -(2**15), 2**15) * m16c, 14, rounding="half_up")
        fail_o = ~(fits16(p_lo) & fits16(p_hi) & fits16(p_lo + b) & fits16(p_hi + b) & fits16(b))
        kind = jnp.where(fail_a, 1, jnp.where(fail_m, 2, jnp.where(fail_o, 3, 0)))
        first = kind[jnp.argmax(kind != 0)]  # the first failing channel decides
        dec_a = (first == 1) | ((first == 3) & ((A >= 0) | (ab > mb)))
        dec_m = (first == 2) | ((first == 3) & ~((A >= 0) | (ab > mb)))
        di, dm = dec_a.astype(jnp.int32), dec_m.astype(jnp.int32)
        A, M = A - di, M - dm
        mul, bias = finals(A, M)
        return A, M, ab - di, mb - dm, first == 0, it + 1, mul, bias

    def cond(state):
        return (~state[4]) & (state[5] < 512)

    # The final parameters are carried through the loop: XLA cannot fuse a loop's
    # outputs into their consumers, so they are computed once, not per activation.
    trivial = ~has_accu | ~has_mul
    A0, M0 = jnp.where(trivial, 0, A0), jnp.where(trivial, 14, M0)
    init = (A0, M0, accu_bits0, mul_bits0, trivial, jnp.int32(0)) + finals(A0, M0)
    A, M, _, _, _, _, mul, bias = jax.lax.while_loop(cond, body, init)
    return mul, bias, jnp.stack([-A, A + M - 22]).astype(jnp.int32)


def xs3_otfn_int8(acc, multipliers, biases, initial_shift, final_shr, *, variant: str = "hardware"):
    """``otfn_int8`` (spec xs3.md §4.1) with *traced* ``initial_shift`` / ``final_shr``.

    The same VPU instruction sequence as :func:`hwjax.xs3.otfn_int8` (which needs static
    shifts), composed from the public instructions: ``t = VLSAT16(acc, max(s1, 0))``;
    if ``s1 <= 0``: ``t = VLASHR16(t, s1)``; ``t = VLMUL16(t, mul)``;
    ``t = VLADD16(t, bias)``; ``t = VLASHR16(t, final_shr)``; ``y = -128`` where
    ``VLADD16(t, 0x7F80) < 0``, else ``VDEPTH8(t)``. Equal to ``hwjax.xs3.otfn_int8``
    bit for bit (tested over every supported shift pair). Returns int32 int8 values.
    """
    xs3 = _xs3()
    s1 = jnp.asarray(initial_shift, jnp.int32)
    t = xs3.vlsat(acc, jnp.maximum(s1, 0), mode=16, variant=variant)
    t = jnp.where(s1 > 0, t, xs3.vlashr(t, jnp.minimum(s1, 0), mode=16, variant=variant))
    t = xs3.vlmul(t, multipliers, mode=16, variant=variant)
    t = xs3.vladd(t, biases, mode=16, variant=variant)
    t = xs3.vlashr(t, jnp.asarray(final_shr, jnp.int32), mode=16, variant=variant)
    low = xs3.vladd(t, 0x7F80, mode=16, variant=variant) < 0
    return jnp.where(low, jnp.int32(-128), xs3.vdepth8(t, mode=16, variant=variant))


@_pytree
@dataclass(frozen=True)
class XS3ConvParams:
    """Integer parameters of one XS3 (current lib_nn API) convolution or dense layer.

    ``kernel``: int8 (C_out, kh, kw, C_in) (depthwise: (C, kh, kw)); ``multipliers``,
    ``biases``: int16-valued (C_out,) output-transform vectors; ``initial_shift``,
    ``final_shr``: int32 scalars; ``pad_value``: the input zero point read for padded taps.
    """

    kernel: jax.Array
    multipliers: jax.Array
    biases: jax.Array
    initial_shift: jax.Array
    final_shr: jax.Array
    pad_value: jax.Array


@dataclass(frozen=True)
class XS3(Target):
    """XMOS xcore.ai XS3, current lib_nn API (xformer's ``XC_conv2d_v2``), spec xs3.md §4–§6.

    ``variant``: ``"hardware"`` (the chip; default), ``"host"`` (xmos-ai-tools 1.4.2
    host interpreter) or ``"v2021"``; see :mod:`hwjax.xs3`.

    Layers: ``conv``/``dense`` (im2col ``mat_mul_generic_int8``, 32-product chunks with
    sat32 after each, then ``otfn_int8`` with xformer's parameters), ``depthwise_conv``
    (one saturating VLMACC per tap, then ``otfn_int8``), ``maxpool`` (int8 max),
    ``avgpool`` (``avgpool2d`` scale-and-shift, §6.1), ``add`` (``add_elementwise``,
    §6.4) and ``lut`` (``lookup8``: a 256-entry table, §6.6).
    """

    variant: str = "hardware"
    name: ClassVar[str] = "xs3"
    layers: ClassVar[frozenset[str]] = frozenset(
        {"conv", "dense", "depthwise_conv", "maxpool", "avgpool", "add", "lut"})

    def __post_init__(self):
        variants = ("hardware", "host", "v2021")
        if self.variant not in variants:
            raise ValueError(f"variant must be one of {variants}, got {self.variant!r}")

    # -------------------------------------------------------------- linear layers

    def conv_params(self, kernel_ohwi, bias_q, *, s_in, z_in, s_w, s_out, z_out, relu: bool = False) -> XS3ConvParams:
        """xformer's parameters (:func:`xs3_otfn_params`) for an OHWI int8 kernel. (A fused
        ReLU needs no parameter: its output range starts at 0, so ``z_out = -128`` and the
        int8 clamp is the ReLU.)"""
        mul, bias, shifts = xs3_otfn_params(kernel_ohwi, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out,
                                            z_out=z_out)
        return XS3ConvParams(kernel_ohwi.astype(jnp.int8), mul, bias, shifts[0], shifts[1],
                             jnp.asarray(z_in, jnp.int32))

    def conv(self, x, params: XS3ConvParams, geom: ConvGeometry, *, return_acc: bool = False):
        """The current-API convolution (``hwjax.xs3.conv2d``'s pipeline) on int8 NHWC ``x``.

        ``im2col`` patches with the pad value (:func:`hwjax.xs3.im2col`), accumulators
        from 0 with sat32 after every 32-byte chunk (:func:`hwjax.core.mac`,
        ``chunk=32``), then :func:`xs3_otfn_int8` with the (possibly traced) shifts.
        Returns ``(y, acc)``: int32 int8-valued outputs and the accumulators (or None).
        """
        from hwjax.core import mac

        c_out = params.kernel.shape[0]
        # pad with the (traced) pad value first: every im2col tap is then inside the image
        patches = _xs3().im2col(_pad_image(x, params.pad_value, geom), geom.kernel, stride=geom.stride,
                                pad_top_left=(0, 0), pad_value=0, out_hw=geom.out_hw)
        w = params.kernel.reshape(c_out, -1)
        if w.shape[1] * 2**14 <= 2**31 - 1:
            # Every chunk prefix is bounded by L * 128 * 128 <= 2**31 - 1, so no sat32 can
            # act (§5.8): the chunked accumulation is exactly one integer dot product.
            acc = jax.lax.dot_general(patches, w, (((patches.ndim - 1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.int32)
        else:
            acc = mac(jnp.zeros((), jnp.int32), patches, w, chunk=32)
        y = xs3_otfn_int8(acc, params.multipliers, params.biases, params.initial_shift, params.final_shr,
                          variant=self.variant)
        return y, (acc if return_acc else None)

    def depthwise_params(self, kernel_hwc, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                         relu: bool = False) -> XS3ConvParams:
        """xformer's parameters for a depthwise (kh, kw, C) int8 kernel (stored as (C, kh, kw))."""
        k = jnp.transpose(kernel_hwc, (2, 0, 1))
        mul, bias, shifts = xs3_otfn_params(k, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out)
        return XS3ConvParams(k.astype(jnp.int8), mul, bias, shifts[0], shifts[1], jnp.asarray(z_in, jnp.int32))

    def depthwise(self, x, params: XS3ConvParams, geom: ConvGeometry, *, return_acc: bool = False):
        """``mat_mul_dw_direct`` (§5.4): accumulators from 0, one VLMACC (sat32 after the
        product) per tap in row-major (kh, kw) order, padded taps read the pad value;
        then :func:`xs3_otfn_int8`."""
        xs3 = _xs3()
        xp = _pad_image(x, params.pad_value, geom)
        kh, kw = geom.kernel
        sh, sw = geom.stride
        ho, wo = geom.out_hw
        acc = jnp.zeros((x.shape[0], ho, wo, x.shape[-1]), jnp.int32)
        k = params.kernel
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw, :]
                acc = xs3.vlmacc(acc, tap, k[:, i, j], mode=8, variant=self.variant)
        y = xs3_otfn_int8(acc, params.multipliers, params.biases, params.initial_shift, params.final_shr,
                          variant=self.variant)
        return y, (acc if return_acc else None)

    # ----------------------------------------------------------------------- pools

    def maxpool(self, x, window, strides):
        """``maxpool`` (§6.3, :func:`hwjax.xs3.maxpool2d`): per channel, the max over the window
        starting from -128 (no padding)."""
        y = _xs3().maxpool2d(x.astype(jnp.int8), window_shape=tuple(window), window_stride=tuple(strides),
                             variant=self.variant)
        return y.astype(jnp.int32)

    def avgpool(self, x, window, strides):
        """``avgpool2d`` (§6.1, :func:`hwjax.xs3.avgpool2d`): ``clamp(rshr(sum(x) * scale, shift),
        -128, 127)`` with (scale, shift) from the window size; channels a multiple of 4."""
        y = _xs3().avgpool2d(x.astype(jnp.int8), window_shape=tuple(window), window_stride=tuple(strides),
                             variant=self.variant)
        return y.astype(jnp.int32)

    # ------------------------------------------------------------------------ add

    def add_params(self, *, s1, z1, s2, z2, s_out, z_out, relu: bool = False) -> dict:
        """``add_elementwise`` parameters (§6.4): ``m1, m2`` int16, ``bias`` int32, ``shift``.

        Chooses the largest ``shift`` in [0, 24] for which ``m_i = round(s_i / s_out *
        2**shift)`` fit int16, and ``bias = round((z_out - z1 s1/s_out - z2 s2/s_out)
        2**shift)``. ``relu`` needs no parameter: a fused ReLU's output range starts at
        0, so ``z_out = -128`` and the int8 clamp is the ReLU.
        """
        r1, r2 = div_rn(s1, s_out), div_rn(s2, s_out)
        big = jnp.maximum(jnp.abs(r1), jnp.abs(r2))
        e = jnp.clip(14 - _float_exponent(big), 0, 24)
        m1 = jnp.clip(jnp.round(jnp.ldexp(r1, e)), -32767, 32767)
        m2 = jnp.clip(jnp.round(jnp.ldexp(r2, e)), -32767, 32767)
        b = z_out.astype(jnp.float32) - z1.astype(jnp.float32) * r1 - z2.astype(jnp.float32) * r2
        bias = jnp.clip(jnp.round(jnp.ldexp(b, e)), -(2.0**30), 2.0**30)
        return {"m1": m1.astype(jnp.int32), "m2": m2.astype(jnp.int32), "bias": bias.astype(jnp.int32),
                "shift": e.astype(jnp.int32)}

    def add(self, x1, x2, params: dict):
        """``add_elementwise`` (§6.4, full 16-lane groups): ``acc = sat32(sat32(bias + x1 m1)
        + x2 m2)``, ``y = clamp(R(acc, shift), -128, 127)`` with the variant's 8-bit VLSAT
        rounding R. (lib_nn's C model computes the ``count mod 16`` tail elements in plain
        int32 with ``rshr``; with these parameters ``|acc| < 2**31 - 2**23``, where both agree.)"""
        xs3 = _xs3()
        acc = jnp.broadcast_to(params["bias"], x1.shape)
        acc = xs3.vlmacc(acc, x1.astype(jnp.int32), params["m1"], mode=16, variant=self.variant)
        acc = xs3.vlmacc(acc, x2.astype(jnp.int32), params["m2"], mode=16, variant=self.variant)
        return xs3.vlsat(acc, params["shift"], mode=8, variant=self.variant, symmetric=False)

    # ------------------------------------------------------------------------ LUT

    def lut_params(self, fn: str, *, s_in, z_in, s_out, z_out) -> dict:
        """The 256-entry int8 table of ``lookup8`` (§6.6) for ``fn`` (:func:`lut_table`)."""
        return {"table": lut_table(fn, s_in=s_in, z_in=z_in, s_out=s_out, z_out=z_out)}

    def lut(self, x, params: dict):
        """``lookup8`` (§6.6, :func:`hwjax.xs3.lookup8`): ``y = table[u8(x)]``, the table bytes
        read back as int8."""
        table_u8 = (params["table"] & 0xFF).astype(jnp.uint8)
        y = _xs3().lookup8(x.astype(jnp.int8), table_u8, variant=self.variant).astype(jnp.int32)
        return jnp.where(y > 127, y - 256, y)

    # ------------------------------------------------------------- memory formats

    def export_tensors(self, kind: str, params) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The integer tensors of one layer in XS3 memory format, plus the scalars.

        * ``conv``/``dense``: ``weights`` = :func:`hwjax.xs3.reorder_kernel_weights` of the
          OHWI kernel (int8 stream), ``output_transform`` =
          :func:`hwjax.xs3.serialise_output_transform` (int16); scalars
          ``initial_shift``, ``final_shr``, ``pad_value``, ``kernel_shape``.
        * ``depthwise_conv``: ``weights`` (kh, kw, C) int8 (channels innermost, the
          ``mat_mul_dw_direct`` layout), ``output_transform`` as above.
        * ``add``: ``params`` (5, 16) int16 lanes ``m1, m2, shift, bias_hi, bias_lo``.
        * ``lut``: ``table`` (256,) uint8, indexed by the input byte.

        Raises ValueError when a shift leaves the range the chip's assembly supports.
        """
        xs3 = _xs3()
        if kind in ("conv", "dense", "depthwise_conv"):
            ish, fsh = int(params.initial_shift), int(params.final_shr)
            if not (-16 <= ish <= 16 and -16 <= fsh <= 15):
                raise ValueError(f"initial_shift={ish} / final_shr={fsh} outside the XS3 otfn_int8 assembly's "
                                 f"ranges [-16, 16] / [-16, 15]: this layer cannot be exported for the chip")
            k = np.asarray(params.kernel, np.int8)
            weights = (np.asarray(xs3.reorder_kernel_weights(k, pad_value=0), np.int8) if kind != "depthwise_conv"
                       else np.ascontiguousarray(np.transpose(k, (1, 2, 0))))
            ot = np.asarray(xs3.serialise_output_transform(np.asarray(params.multipliers, np.int32),
                                                           np.asarray(params.biases, np.int32)), np.int16)
            meta = {"initial_shift": ish, "final_shr": fsh, "pad_value": int(params.pad_value),
                    "kernel_shape": list(k.shape)}
            return {"weights": weights, "output_transform": ot}, meta
        if kind == "add":
            bias = int(params["bias"])
            lanes = [int(params["m1"]), int(params["m2"]), int(params["shift"]), bias >> 16,
                     ((bias & 0xFFFF) ^ 0x8000) - 0x8000]  # bias_lo: the low 16 bits' int16 pattern
            return {"params": np.repeat(np.asarray(lanes, np.int16)[:, None], 16, axis=1)}, {}
        if kind == "lut":
            return {"table": (np.asarray(params["table"]) & 0xFF).astype(np.uint8)}, {}
        return {}, {}

    def import_tensors(self, kind: str, tensors: dict[str, np.ndarray], meta: dict[str, Any]):
        """Inverse of :meth:`export_tensors` (ValueError on inconsistent sizes)."""
        xs3 = _xs3()
        if kind in ("conv", "dense", "depthwise_conv"):
            shape = tuple(int(v) for v in meta["kernel_shape"])
            if kind == "depthwise_conv":
                w = tensors["weights"]
                if w.shape != (shape[1], shape[2], shape[0]):
                    raise ValueError(f"depthwise weights have shape {w.shape}, expected {(shape[1], shape[2], shape[0])}")
                k = jnp.asarray(np.transpose(w, (2, 0, 1)))
            else:
                k = xs3.reorder_kernel_weights_inverse(jnp.asarray(tensors["weights"]), shape)
            ot = xs3.deserialise_output_transform(tensors["output_transform"], shape[0])
            return XS3ConvParams(k.astype(jnp.int8), jnp.asarray(ot["multipliers"], jnp.int32),
                                 jnp.asarray(ot["biases"], jnp.int32), jnp.int32(meta["initial_shift"]),
                                 jnp.int32(meta["final_shr"]), jnp.int32(meta["pad_value"]))
        if kind == "add":
            p = np.asarray(tensors["params"], np.int32)
            if p.shape != (5, 16):
                raise ValueError(f"add params must have shape (5, 16), got {p.shape}")
            bias = (p[3, 0] << 16) + (p[4, 0] & 0xFFFF)
            return {"m1": jnp.int32(p[0, 0]), "m2": jnp.int32(p[1, 0]), "bias": jnp.int32(bias),
                    "shift": jnp.int32(p[2, 0])}
        if kind == "lut":
            t = np.asarray(tensors["table"]).astype(np.int32)
            if t.shape != (256,):
                raise ValueError(f"a LUT table must have 256 entries, got shape {t.shape}")
            return {"table": jnp.asarray(np.where(t > 127, t - 256, t), jnp.int32)}
        return None


# ======================================================================= XS3 legacy


def _host_bso_fields(bias_q, weights, s_in, z_in, s_w, s_out, z_out, *, channel_axis: int):
    f = _xs3().derive_bso_fields(np.asarray(bias_q, np.int64), np.asarray(weights).astype(np.int8),
                                 input_scale=float(np.float32(s_in)), input_zero_point=int(z_in),
                                 weight_scales=np.asarray(s_w, np.float32), output_scale=float(np.float32(s_out)),
                                 output_zero_point=int(z_out), channel_axis=channel_axis)
    return tuple(np.asarray(v, np.int32) for v in f)


def xs3_bso(kernel_q, bias_q, *, s_in, z_in, s_w, s_out, z_out, channel_axis: int = 0) -> jax.Array:
    """The legacy BSO tensor (spec xs3.md §3.1) that tflite2xcore derived (§4.6), for
    traced or concrete inputs: :func:`hwjax.xs3.derive_bso_fields` (host NumPy, float64)
    through ``jax.pure_callback``, packed by :func:`hwjax.xs3.make_bso`. No gradient."""
    c = kernel_q.shape[channel_axis]
    shapes = tuple(jax.ShapeDtypeStruct((c,), jnp.int32) for _ in range(6))
    args = [jnp.asarray(a, d) for a, d in ((bias_q, jnp.int32), (kernel_q, jnp.int32), (s_in, jnp.float32),
                                           (z_in, jnp.int32), (s_w, jnp.float32), (s_out, jnp.float32),
                                           (z_out, jnp.int32))]
    fields = jax.pure_callback(functools.partial(_host_bso_fields, channel_axis=channel_axis), shapes,
                               *jax.lax.stop_gradient(args), vmap_method="sequential")
    return _xs3().make_bso(*fields)


@_pytree
@dataclass(frozen=True)
class XS3LegacyParams:
    """Integer parameters of one legacy (BSO) layer: ``kernel`` int8 (conv: OHWI, dense:
    (C_out, N), depthwise: (kh, kw, C)), ``bso`` int16 (G, 7, 16), ``zero_point`` (the
    input zero point, read for padded taps)."""

    kernel: jax.Array
    bso: jax.Array
    zero_point: jax.Array


def _legacy_acc_stats(stats, n: int):
    return None if stats is None else {"count": n, "saturated": stats.acc_saturations.sum(dtype=jnp.int32)}


@dataclass(frozen=True)
class XS3Legacy(XS3):
    """XMOS XS3 with the legacy lib_nn kernels (≤ 2021, tflite2xcore): BSO output stages
    (spec xs3.md §3) with bias-seeded accumulators.

    Layers: ``conv`` (``conv2d_deep``; C_in and C_out multiples of 4), ``dense``
    (``fully_connected_8``; inputs a multiple of 4), ``depthwise_conv``
    (``conv2d_depthwise``; channels a multiple of 4), ``maxpool``, ``avgpool``, ``lut``
    (as :class:`XS3`) and ``add`` (legacy ``add_elementwise``). Parameters are derived
    the tflite2xcore way (:func:`xs3_bso`). ``variant`` as for :class:`XS3`.
    """

    name: ClassVar[str] = "xs3-legacy"

    def check_layer(self, kind: str, **config: Any) -> None:
        super().check_layer(kind, **config)
        need = {"conv": ("in_features", "out_features"), "dense": ("in_features",),
                "depthwise_conv": ("features",)}.get(kind, ())
        for key in need:
            if config.get(key) is not None and config[key] % 4:
                raise NotImplementedError(f"target {self!r}: the legacy {kind} kernel needs {key} to be a multiple "
                                          f"of 4, got {config[key]}")

    def conv_params(self, kernel_ohwi, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                    relu: bool = False) -> XS3LegacyParams:
        bso = xs3_bso(kernel_ohwi, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out)
        return XS3LegacyParams(kernel_ohwi.astype(jnp.int8), bso, jnp.asarray(z_in, jnp.int32))

    def conv(self, x, params: XS3LegacyParams, geom: ConvGeometry, *, return_acc: bool = False):
        """``conv2d_deep`` (1x1 kernels on a 1x1 image: ``fully_connected_8``)."""
        xs3 = _xs3()
        c_out = params.kernel.shape[0]
        if geom.in_hw == (1, 1) and geom.kernel == (1, 1) and geom.padding == ((0, 0), (0, 0)):
            out = xs3.fully_connected_8(x[:, 0, 0, :].astype(jnp.int8), params.kernel.reshape(c_out, -1),
                                        params.bso, variant=self.variant, return_stats=return_acc)
            y, st = out if return_acc else (out, None)
            return y[:, None, None, :].astype(jnp.int32), _legacy_acc_stats(st, x.shape[0] * c_out)
        pt, pl = geom.pad_top_left
        out = xs3.conv2d_deep(x.astype(jnp.int8), params.kernel, params.bso, zero_point=params.zero_point,
                              window_start=(-pt, -pl), window_stride=geom.stride, out_shape=geom.out_hw,
                              variant=self.variant, return_stats=return_acc)
        y, st = out if return_acc else (out, None)
        return y.astype(jnp.int32), _legacy_acc_stats(st, x.shape[0] * geom.out_hw[0] * geom.out_hw[1] * c_out)

    def depthwise_params(self, kernel_hwc, bias_q, *, s_in, z_in, s_w, s_out, z_out,
                         relu: bool = False) -> XS3LegacyParams:
        bso = xs3_bso(kernel_hwc, bias_q, s_in=s_in, z_in=z_in, s_w=s_w, s_out=s_out, z_out=z_out, channel_axis=-1)
        return XS3LegacyParams(kernel_hwc.astype(jnp.int8), bso, jnp.asarray(z_in, jnp.int32))

    def depthwise(self, x, params: XS3LegacyParams, geom: ConvGeometry, *, return_acc: bool = False):
        """``conv2d_depthwise`` (bias-seeded, one saturating VLMACC per tap)."""
        pt, pl = geom.pad_top_left
        out = _xs3().conv2d_depthwise(x.astype(jnp.int8), params.kernel, params.bso, zero_point=params.zero_point,
                                      window_start=(-pt, -pl), window_stride=geom.stride, out_shape=geom.out_hw,
                                      variant=self.variant, return_stats=return_acc)
        y, st = out if return_acc else (out, None)
        return y.astype(jnp.int32), _legacy_acc_stats(st, y.size)

    def add_params(self, *, s1, z1, s2, z2, s_out, z_out, relu: bool = False) -> dict:
        """Legacy ``add_elementwise`` parameters: ``acc = bias + x0 m0 + x1 m1`` (input shifts
        0), ``y = clamp(rshr(acc, output_shr), -128, 127)``; the same scale choice as
        :meth:`XS3.add_params`, with ``output_shr = shift``."""
        return XS3.add_params(self, s1=s1, z1=z1, s2=s2, z2=z2, s_out=s_out, z_out=z_out, relu=relu)

    def add(self, x1, x2, params: dict):
        """Legacy ``add_elementwise`` (exact 64-bit accumulation)."""
        y = _xs3().add_elementwise(x1.astype(jnp.int8), x2.astype(jnp.int8), shr0=0, multiplier0=params["m1"],
                                   shr1=0, multiplier1=params["m2"], bias=params["bias"],
                                   output_shr=params["shift"], variant=self.variant)
        return y.astype(jnp.int32)

    def export_tensors(self, kind: str, params):
        """``conv``/``dense``/``depthwise_conv``: ``weights`` (the int8 kernel in the layout
        the legacy kernel reads: OHWI, (C_out, N), (kh, kw, C)) and ``bso`` (the (G, 7, 16)
        int16 BSO tensor); ``add``/``lut`` as :meth:`XS3.export_tensors`."""
        if kind not in ("conv", "dense", "depthwise_conv"):
            return XS3.export_tensors(self, kind, params)
        k = np.asarray(params.kernel, np.int8)
        if kind == "dense":
            k = k.reshape(k.shape[0], -1)
        return ({"weights": k, "bso": np.asarray(params.bso, np.int16)},
                {"pad_value": int(params.zero_point), "kernel_shape": list(np.asarray(params.kernel).shape)})

    def import_tensors(self, kind: str, tensors: dict, meta: dict):
        if kind not in ("conv", "dense", "depthwise_conv"):
            return XS3.import_tensors(self, kind, tensors, meta)
        shape = tuple(int(v) for v in meta["kernel_shape"])
        k = np.asarray(tensors["weights"])
        if int(np.prod(k.shape)) != int(np.prod(shape)):
            raise ValueError(f"weights hold {k.size} values, kernel_shape {list(shape)} needs {int(np.prod(shape))}")
        c_out = shape[-1] if kind == "depthwise_conv" else shape[0]
        bso = np.asarray(tensors["bso"])
        if bso.shape != (-(-c_out // 16), 7, 16):
            raise ValueError(f"bso has shape {bso.shape}, expected {(-(-c_out // 16), 7, 16)}")
        return XS3LegacyParams(jnp.asarray(k.reshape(shape), jnp.int8), jnp.asarray(bso),
                               jnp.int32(meta["pad_value"]))


# ============================================================================= NVDLA


def _nvdla():
    import hwjax.nvdla as nvdla  # imported lazily: the chip package is built separately

    return nvdla


def _scale_shift(r: jax.Array, max_shift: int = 63) -> tuple[jax.Array, jax.Array]:
    """An int16 ``scale`` and a right ``shift`` in [0, max_shift] with ``scale * 2**-shift``
    ~ ``r`` (> 0; per-channel ``r`` shares the shift of its largest entry): the largest
    shift that keeps ``|scale| <= 32767``."""
    e = _float_exponent(jnp.max(r))
    shift = jnp.clip(15 - e, 0, max_shift).astype(jnp.int32)
    scale = jnp.clip(jnp.round(r * _pow2(jnp.minimum(shift, 127))), -32767, 32767).astype(jnp.int32)
    return scale, shift


@_pytree
@dataclass(frozen=True)
class NVDLAConvParams:
    """Integer parameters of one NVDLA convolution / dense layer (int8 pipeline).

    ``kernel`` int8 OHWI; ``bias16`` (C,) int16 SDP X1 ALU operands with the left shift
    ``bias_shift``; ``mul16`` (C,) int16 X1 MUL operands with the right shift
    ``mul_shift``; ``relu`` (static) the X1 ReLU.
    """

    kernel: jax.Array
    bias16: jax.Array
    bias_shift: jax.Array
    mul16: jax.Array
    mul_shift: jax.Array
    relu: bool = _static()


@functools.lru_cache(maxsize=None)
def nvdla_lut_config(fn: str):
    """The SDP LUT programmed for ``fn`` on a Q12 input (``X = round(x * 2**12)``), output
    ``Y = round(32767 * fn(x))``: :func:`hwjax.nvdla.sigmoid_lut` / ``tanh_lut`` presets
    (spec nvdla.md §4.6 layout), computed once per function."""
    nvdla = _nvdla()
    presets = {"sigmoid": nvdla.sigmoid_lut, "tanh": nvdla.tanh_lut}
    if fn not in presets:
        raise NotImplementedError(f"no NVDLA LUT preset for {fn!r} (available: {sorted(presets)})")
    return presets[fn]()


@_pytree
@dataclass(frozen=True)
class NVDLALutParams:
    """An NVDLA LUT activation: X1 MUL ``(m_in, sh_in)`` to the Q12 LUT input, the two
    tables (registers: :func:`nvdla_lut_config` of ``fn``), output convertor
    ``(m_out, sh_out)``."""

    m_in: jax.Array
    sh_in: jax.Array
    m_out: jax.Array
    sh_out: jax.Array
    le_table: jax.Array
    lo_table: jax.Array
    fn: str = _static()


_LUT_IN_BITS = 12  # the LUT input is Q12
_LUT_OUT_SCALE = 32767.0


@dataclass(frozen=True)
class NVDLA(Target):
    """NVIDIA NVDLA (``nv_full``), INT8 pipeline, spec nvdla.md: symmetric int8 activations
    (zero point 0), per-channel int8 weights.

    * ``conv``/``dense``: exact int32 accumulation (CMAC/CACC), then the SDP X1 stage:
      ALU ``sat32(acc + bias16 * 2**bias_shift)``, MUL ``sat32(rshift_rhaz(v * mul16[c],
      mul_shift))``, optional ReLU, then the SDP output convertor to int8 (int17 stage,
      :func:`hwjax.nvdla.cvt`). ``mul16 * 2**-mul_shift ~ s_in s_w[c] / s_out``.
    * ``lut``: X1 MUL to the LUT's Q12 input, the SDP LUT (:func:`hwjax.nvdla.sdp_lut`,
      programmed by the ``sigmoid_lut`` / ``tanh_lut`` presets), and the output
      convertor from ``32767 * fn(x)`` to int8.
    * ``maxpool``: PDP max pooling (exact int8 maximum).
    """

    name: ClassVar[str] = "nvdla"
    layers: ClassVar[frozenset[str]] = frozenset({"conv", "dense", "maxpool", "lut"})
    symmetric_activations: ClassVar[bool] = True

    def check_layer(self, kind: str, **config: Any) -> None:
        super().check_layer(kind, **config)
        if kind == "lut":
            nvdla_lut_config(config.get("fn"))

    def conv_params(self, kernel_ohwi, bias_q, *, s_in, z_in, s_w, s_out, z_out, relu: bool = False):
        from hwjax.core import shift_right

        b = bias_q.astype(jnp.int32)
        bits = 32 - jax.lax.clz(jnp.max(jnp.abs(b)))
        bias_shift = jnp.maximum(bits - 15, 0).astype(jnp.int32)
        bias16 = jnp.clip(shift_right(b, bias_shift, rounding="half_away"), -32768, 32767)
        mul16, mul_shift = _scale_shift(div_rn(s_in * s_w, s_out))
        return NVDLAConvParams(kernel_ohwi.astype(jnp.int8), bias16, bias_shift, mul16, mul_shift, bool(relu))

    def conv(self, x, params: NVDLAConvParams, geom: ConvGeometry, *, return_acc: bool = False):
        cvt = _nvdla().cvt
        (pt, pb), (pl, pr) = geom.padding
        xp = jnp.pad(x.astype(jnp.int8), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
        (kh, kw), (sh, sw), (ho, wo) = geom.kernel, geom.stride, geom.out_hw
        taps = [xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw, :] for i in range(kh) for j in range(kw)]
        patches = jnp.concatenate(taps, axis=-1)  # (B, Ho, Wo, kh*kw*C) in (kh, kw, c) order
        k = params.kernel.reshape(params.kernel.shape[0], -1)
        acc = jax.lax.dot_general(patches, k, (((3,), (1,)), ((), ())), preferred_element_type=jnp.int32)
        v = cvt(acc, offset=-(params.bias16 << params.bias_shift), scale=1, shift=0, out_bits=32)
        v = cvt(v, offset=0, scale=params.mul16, shift=params.mul_shift, out_bits=32)
        if params.relu:
            v = jnp.maximum(v, 0)
        y = cvt(v, offset=0, scale=1, shift=0, out_bits=8, stage_bits=17)
        return y.astype(jnp.int32), (acc if return_acc else None)

    def maxpool(self, x, window, strides):
        """PDP max pooling: the int8 maximum over each window (no padding)."""
        return jax.lax.reduce_window(x.astype(jnp.int32), jnp.int32(-128), jax.lax.max, (1, *window, 1),
                                     (1, *strides, 1), "VALID")

    def lut_params(self, fn: str, *, s_in, z_in, s_out, z_out) -> dict:
        """X1 MUL ``(m_in, sh_in)`` with ``m_in 2**-sh_in ~ s_in 2**12`` (int8 -> Q12) and the
        output convertor ``(m_out, sh_out)`` with ``m_out 2**-sh_out ~ 1 / (32767 s_out)``."""
        m_in, sh_in = _scale_shift(jnp.asarray(s_in, jnp.float32) * float(2**_LUT_IN_BITS))
        m_out, sh_out = _scale_shift(div_rn(jnp.float32(1.0), _LUT_OUT_SCALE * jnp.asarray(s_out, jnp.float32)))
        cfg = nvdla_lut_config(fn)
        return NVDLALutParams(m_in, sh_in, m_out, sh_out, jnp.asarray(cfg.le_table, jnp.int16),
                              jnp.asarray(cfg.lo_table, jnp.int16), fn)

    def lut(self, x, params: NVDLALutParams):
        nvdla = _nvdla()
        cfg = nvdla_lut_config(params.fn).replace(le_table=params.le_table, lo_table=params.lo_table)
        xq = nvdla.cvt(x.astype(jnp.int32), offset=0, scale=params.m_in, shift=params.sh_in, out_bits=32)
        y = nvdla.sdp_lut(xq, cfg)[0]
        return nvdla.cvt(y, offset=0, scale=params.m_out, shift=params.sh_out, out_bits=8,
                         stage_bits=17).astype(jnp.int32)

    # ------------------------------------------------------------- memory formats

    def export_tensors(self, kind: str, params):
        """``conv``/``dense``: ``weights`` = :func:`hwjax.nvdla.pack_dc_weights` of the KCRS
        kernel (the direct-convolution byte image), ``sdp`` =
        :func:`hwjax.nvdla.pack_sdp_per_channel` of the (bias16, mul16) operands.
        ``lut``: the ``le_table`` (65) and ``lo_table`` (257) int16 entries; registers and
        convertor settings go to the manifest."""
        nvdla = _nvdla()
        if kind in ("conv", "dense"):
            k = np.asarray(params.kernel, np.int8)
            kcrs = np.transpose(k, (0, 3, 1, 2))
            image = np.asarray(nvdla.pack_dc_weights(kcrs, dtype=np.int8), np.uint8)
            sdp = np.asarray(nvdla.pack_sdp_per_channel(np.asarray(params.bias16, np.int16),
                                                        np.asarray(params.mul16, np.int16), dtype=np.int16),
                             np.uint8)
            meta = {"kernel_shape": list(k.shape), "bias_shift": int(params.bias_shift),
                    "mul_shift": int(params.mul_shift), "relu": bool(params.relu)}
            return {"weights": image, "sdp": sdp}, meta
        if kind == "lut":
            cfg = nvdla_lut_config(params.fn)
            regs = {k: (v if isinstance(v, (str, int)) else int(v)) for k, v in cfg.registers().items()}
            meta = {"fn": params.fn, "registers": regs,
                    **{k: int(getattr(params, k)) for k in ("m_in", "sh_in", "m_out", "sh_out")}}
            return {"le_table": np.asarray(params.le_table, np.int16),
                    "lo_table": np.asarray(params.lo_table, np.int16)}, meta
        return {}, {}

    def import_tensors(self, kind: str, tensors: dict, meta: dict):
        nvdla = _nvdla()
        if kind in ("conv", "dense"):
            shape = tuple(int(v) for v in meta["kernel_shape"])
            kcrs = nvdla.unpack_dc_weights(jnp.asarray(tensors["weights"]), (shape[0], shape[3], shape[1], shape[2]),
                                           dtype=jnp.int8)
            bias16, mul16 = nvdla.unpack_sdp_per_channel(jnp.asarray(tensors["sdp"]), shape[0], dtype=jnp.int16)
            return NVDLAConvParams(jnp.transpose(kcrs, (0, 2, 3, 1)).astype(jnp.int8), bias16.astype(jnp.int32),
                                   jnp.int32(meta["bias_shift"]), mul16.astype(jnp.int32),
                                   jnp.int32(meta["mul_shift"]), bool(meta["relu"]))
        if kind == "lut":
            regs = meta["registers"]
            cfg = nvdla_lut_config(meta["fn"])
            if regs != {k: (v if isinstance(v, (str, int)) else int(v)) for k, v in cfg.registers().items()}:
                raise ValueError(f"LUT registers differ from this hwjax's {meta['fn']} preset")
            for t, n in (("le_table", 65), ("lo_table", 257)):
                if np.asarray(tensors[t]).shape != (n,):
                    raise ValueError(f"{t} must have {n} entries, got shape {np.asarray(tensors[t]).shape}")
            return NVDLALutParams(*(jnp.int32(meta[k]) for k in ("m_in", "sh_in", "m_out", "sh_out")),
                                  jnp.asarray(tensors["le_table"], jnp.int16),
                                  jnp.asarray(tensors["lo_table"], jnp.int16), meta["fn"])
        return None


__all__ = ["ConvGeometry", "Gemmlowp", "LUT_FUNCTIONS", "NVDLA", "NVDLAConvParams", "NVDLALutParams", "Target", "TFLite", "XS3", "XS3ConvParams",
           "XS3Legacy", "XS3LegacyParams", "div_rn", "lut_function", "lut_table", "nvdla_lut_config", "xs3_bso", "xs3_otfn_int8",
           "xs3_otfn_params"]
