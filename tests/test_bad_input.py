"""Bad inputs to the public functions of hwjax.core and the targets' main entry points.

Hypothesis generates out-of-range, wrong-dtype, wrong-shape, non-finite and wrong-type
arguments. Every call must end in one of two ways:

* an :class:`hwjax.errors.HwjaxError` whose message names the argument (never an error
  raised from inside JAX, Flax or NumPy, never a silent result), or
* for inputs that are valid in another form (a list, a NumPy int64 scalar, an
  integer-valued float array), the same result as the canonical call.

Shapes are fixed and small and the calls are eager, so each configuration compiles
once and the suite stays fast.
"""

from __future__ import annotations

import inspect
import os
import re

import jax
import jax.monitoring
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hwjax import core
from hwjax.errors import ArgTypeError, HwjaxError, RangeError, ShapeError

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
X8 = np.array([[3, -7, 100], [0, 1, -128]], np.int8)  # (2, 3)
W8 = np.array([[1, 2, 3], [-4, 5, -6], [7, -8, 9], [0, 1, 0]], np.int8)  # (4, 3)
V32 = np.array([5, -9, 2**30, -(2**31)], np.int32)


def _names(arg: str, exc: BaseException) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(arg)}(?![A-Za-z0-9_])", str(exc)) is not None


def _raised_in_hwjax(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    f = tb.tb_frame.f_code.co_filename if tb is not None else ""
    return "site-packages" not in f and os.sep + "hwjax" + os.sep in f


_LOWERED = [0]  # programs traced and lowered for XLA in this process (in-memory cache misses)


def _count_lowering(event: str, secs: float, **kw) -> None:
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
        _LOWERED[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_lowering)


def check_one_program(funcs, call, multi: dict[str, str]) -> None:
    """Every function of a bad-input table, called eagerly on its canonical arguments,
    compiles at most one XLA program (after its checks: one program, not one per
    operation), except those named in ``multi`` (name -> what still compiles separately).
    The in-memory caches are cleared first, so programs compiled by earlier tests count;
    a program that an earlier function of the table compiled counts 0 (functions that
    share a whole program), so the check never fails for one that compiles at most one."""
    over = {}
    jax.clear_caches()  # so that programs compiled by earlier tests count
    for name in funcs:
        before = _LOWERED[0]
        call(name)
        if _LOWERED[0] - before > 1 and name not in multi:
            over[name] = _LOWERED[0] - before
    assert not over, f"eager calls compiling more than one program: {over}"
    assert set(multi) <= set(funcs), set(multi) - set(funcs)


def check_traceable(funcs, call) -> None:
    """Every function of a bad-input table, called on its canonical (concrete) arguments
    inside a function that ``jit`` traces, traces: public functions work inside a jitted
    user function, host-side ones (tables, layouts, parameter recipes that read values)
    included. Traced only (``jax.make_jaxpr``), not compiled: the values are tested
    elsewhere."""
    failed = {}
    for name in funcs:
        try:
            jax.make_jaxpr(lambda: [a for a in jax.tree.leaves(call(name)) if isinstance(a, (jax.Array, np.ndarray))])()
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    assert not failed, f"public functions that fail inside a jit trace: {failed}"


def check_covers_public(funcs, *modules, elsewhere=()) -> None:
    """Every public function of ``modules`` (their ``__all__``, else their names without a
    leading underscore) is called by a bad-input table ``funcs`` (name -> (function, ...)),
    or named in ``elsewhere`` (covered by another table, or taking no arrays)."""
    public = set()
    for m in modules:
        names = getattr(m, "__all__", None) or [n for n in dir(m) if not n.startswith("_")]
        public |= {n for n in names if inspect.isfunction(getattr(m, n))}
    missing = public - set(elsewhere) - {entry[0].__name__ for entry in funcs.values()}
    assert not missing, f"public functions missing from the bad-input table: {sorted(missing)}"


def table_caller(funcs):
    """``call(name, **override)``: the function ``funcs[name] = (fn, canonical kwargs)`` with
    some arguments replaced (the bad-input tables of the other test_bad_input_* files)."""

    def call(fname, **override):
        fn, kw = funcs[fname]
        return fn(**{**kw, **override})

    return call


def with_value(a, pos, v, dtype=None):
    """A copy of array ``a`` with the flat element ``pos`` set to ``v`` (which may lie outside
    ``a``'s dtype: the copy is then of ``dtype``)."""
    b = np.array(a, np.int64 if dtype is None else dtype)
    b.flat[pos] = v
    return b if dtype is not None else b.astype(np.asarray(a).dtype)


def case_id(c) -> str:
    """Test id of a table case ``(function, argument, ...)``."""
    return f"{c[0]}-{c[1]}"


def table_params(cases) -> list:
    """The table cases as ``pytest.param``s with readable ids."""
    return [pytest.param(c, id=case_id(c)) for c in cases]


def expect_table_error(call, case) -> None:
    """A table case ``(function, argument, bad kwargs, error classes)``: the call with the
    bad keyword arguments raises one of the classes, naming the argument."""
    fname, arg, bad, kinds = case
    expect_error(lambda: call(fname, **bad), arg, kinds)


def expect_error(call, arg: str, kinds=(HwjaxError,), *, strict: bool = True):
    """``call()`` must raise an HwjaxError of ``kinds`` whose message names ``arg``.

    ``strict=False`` (the targets' own argument checks, outside hwjax.core) also accepts a
    builtin TypeError or ValueError of ``kinds`` raised by hwjax code itself."""
    with pytest.raises(Exception) as e:
        call()
    err = e.value
    if strict or not isinstance(err, (TypeError, ValueError)):
        assert isinstance(err, HwjaxError), f"{type(err).__module__}.{type(err).__name__}: {err}"
    else:
        assert isinstance(err, HwjaxError) or _raised_in_hwjax(err), (
            f"{type(err).__name__} raised inside a dependency: {err}"
        )
    assert isinstance(err, kinds), f"{type(err).__name__} is not one of {kinds}: {err}"
    assert _names(arg, err), f"the message does not name {arg!r}: {err}"


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ the functions
# name -> (call(**kwargs), canonical kwargs, {array argument: (lo, hi) of its values})


def _shift(**k):
    return core.shift_right(**{"rounding": "half_up", **k})


FUNCS = {
    "saturate": (lambda **k: core.saturate(**k), dict(x=V32, bits=8), {"x": (I32_MIN, I32_MAX)}),
    "shift_right": (_shift, dict(x=V32, shift=np.int32(3)), {"x": (I32_MIN, I32_MAX), "shift": (0, I32_MAX)}),
    "fixed_mul": (
        lambda **k: core.fixed_mul(**k),
        dict(x=V32, m=V32[::-1].copy(), frac_bits=31),
        {"x": (I32_MIN, I32_MAX), "m": (I32_MIN, I32_MAX)},
    ),
    "mac": (
        lambda **k: core.mac(**k),
        dict(acc0=np.int32(7), x=X8, w=W8, acc_bits=20),
        {"acc0": (-(2**19), 2**19 - 1)},
    ),
    "mac_reference": (
        lambda **k: core.mac_reference(**k),
        dict(acc0=np.int32(7), x=X8, w=W8, acc_bits=20),
        {"acc0": (-(2**19), 2**19 - 1)},
    ),
    "quantize_affine": (
        lambda **k: core.quantize_affine(**k),
        dict(x=np.array([0.5, -3.25, 1e3], np.float32), scale=np.float32(0.25), zero_point=3),
        {},
    ),
    "div_rn": (lambda **k: core.div_rn(**k), dict(a=np.float32([1.0, 3.0]), b=np.float32([3.0, 7.0])), {}),
    "mul_rn": (lambda **k: core.mul_rn(**k), dict(a=np.float32([1.0, 3.0]), b=np.float32([3.0, 7.0])), {}),
    "int_dot": (lambda **k: core.int_dot(**k), dict(x=X8, w=W8, dimension_numbers=(((1,), (1,)), ((), ()))), {}),
    "to_float16": (lambda **k: core.to_float16(**k), dict(x=np.float32([1.5, -2.25, 7e4])), {}),
    "floor_divmod_small": (
        lambda **k: core.floor_divmod_small(**k),
        dict(r=np.int32([-7, 9, 2**20 - 1]), d=np.int32([2, 2**24, 1])),
        {"d": (1, 2**24)},
    ),
}

# every argument of each function that takes an array or a number
ARRAY_ARGS = [
    (f, a)
    for f, (_, kw, _) in FUNCS.items()
    for a, v in kw.items()
    if isinstance(v, (np.ndarray, np.generic, int, float)) and a not in ("bits", "frac_bits", "acc_bits")
]
RANGED = [(f, a) for f, (_, _, ranges) in FUNCS.items() for a in ranges]
STATIC_INTS = [
    ("saturate", "bits", 2, 32),
    ("fixed_mul", "frac_bits", 0, 62),
    ("fixed_mul", "bits", 2, 32),
    ("mac", "acc_bits", 2, 32),
    ("mac", "chunk", 1, 2**20),
    ("mac_reference", "chunk", 1, 2**20),
    ("int_bounds", "bits", 1, 64),
]
FLAGS = [
    ("saturate", "symmetric"),
    ("fixed_mul", "symmetric"),
    ("shift_right", "allow_left"),
    ("mac", "return_clipped"),
    ("mac_reference", "return_clipped"),
    ("int_bounds", "symmetric"),
]
CHOICES = [
    ("saturate", "saturation_grad"),
    ("shift_right", "rounding"),
    ("shift_right", "saturation_grad"),
    ("fixed_mul", "rounding"),
    ("mac", "route"),
    ("mac", "saturation_grad"),
]
FUNCS["int_bounds"] = (lambda **k: core.int_bounds(**k), dict(bits=8, symmetric=True), {})


def call(fname, **override):
    fn, kw, _ = FUNCS[fname]
    return fn(**{**kw, **override})


WRONG_TYPES = st.sampled_from(
    [
        "abc",
        b"\x01",
        None,
        object(),
        {"a": 1},
        {1, 2},
        [[1, 2], [3]],
        [1, "a"],
        True,
        np.bool_(False),
        np.array([True, False]),
        np.array([1 + 2j]),
        np.array(["a", "b"]),
        np.array([object()]),
        1 + 1j,
        np.array([1, 2], np.uint32),
        np.datetime64("2020-01-01"),
    ]
)


@SETTINGS
@given(st.sampled_from(ARRAY_ARGS), WRONG_TYPES)
@example(("fixed_mul", "x"), np.array([1, 2], np.uint32))  # a wrong type and a wrong shape: the type is reported
@example(("floor_divmod_small", "r"), np.array([1, 2], np.uint32))
def test_wrong_types_name_the_argument(case, bad):
    fname, arg = case
    if fname in ("div_rn", "mul_rn") and isinstance(bad, np.ndarray) and bad.dtype == np.uint32:
        return  # an integer array is a valid div_rn / mul_rn operand
    expect_error(lambda: call(fname, **{arg: bad}), arg, (TypeError,))


@SETTINGS
@given(st.sampled_from(RANGED), st.data())
def test_out_of_range_values_in_every_form(case, data):
    fname, arg = case
    lo, hi = FUNCS[fname][2][arg]
    canonical = FUNCS[fname][1][arg]
    shape = np.shape(canonical)
    big = data.draw(
        st.one_of(st.integers(hi + 1, 2**70), st.integers(-(2**70), lo - 1))
        if lo > -(2**70)
        else st.integers(hi + 1, 2**70),
        label="value",
    )
    form = data.draw(st.sampled_from(["python", "np.int64", "list", "np.array", "float array"]), label="form")
    vals = np.full(shape, 0, object)
    vals.flat[data.draw(st.integers(0, max(vals.size - 1, 0)))] = big
    if form == "python":
        bad = big
    elif form == "np.int64" and -(2**63) <= big < 2**63:
        bad = np.int64(big)
    elif form == "list":
        bad = vals.tolist() if shape else big
    elif form == "np.array" and -(2**63) <= big < 2**63:
        bad = vals.astype(np.int64)
    else:
        bad = vals.astype(np.float32)
        f = np.float32(big)
        if np.float32(lo) <= f <= np.float32(hi):
            return  # float32 rounds it to a bound: the float32 spelling of that bound (documented)
    # a float shift is the wrong type before it is out of range
    kinds = (RangeError, TypeError) if (fname, arg) == ("shift_right", "shift") else (RangeError,)
    expect_error(lambda: call(fname, **{arg: bad}), arg, kinds)


@SETTINGS
@given(st.sampled_from(RANGED), st.data())
def test_in_range_values_in_other_forms_give_the_canonical_result(case, data):
    fname, arg = case
    lo, hi = FUNCS[fname][2][arg]
    canonical = np.asarray(FUNCS[fname][1][arg])
    v = np.asarray(
        data.draw(
            st.lists(st.integers(max(lo, -(2**40)), min(hi, 2**40)), min_size=canonical.size, max_size=canonical.size)
        ),
        np.int64,
    ).reshape(canonical.shape)
    want = call(fname, **{arg: v.astype(canonical.dtype)})
    form = data.draw(st.sampled_from(["list", "np.int64", "python"] + (["float"] if fname != "shift_right" else [])))
    if form == "list":
        got = call(fname, **{arg: v.tolist()})
    elif form == "np.int64":
        got = call(fname, **{arg: v})
    elif form == "python" and v.ndim == 0:
        got = call(fname, **{arg: int(v)})
    elif form == "float" and np.all(np.abs(v) <= 2**24):
        got = call(fname, **{arg: v.astype(np.float32)})
        if fname not in ("mac_reference", "floor_divmod_small"):  # int32 for every input (documented)
            want = np.asarray(want).astype(np.float32)
    else:
        return
    same(got, want)


NON_FINITE = st.sampled_from([np.nan, np.inf, -np.inf, 1.5, -0.25])


@SETTINGS
@given(
    st.sampled_from([c for c in ARRAY_ARGS if c[0] not in ("div_rn", "mul_rn", "to_float16")]),
    NON_FINITE,
    st.integers(0, 3),
    st.sampled_from([np.float32, np.float16, "bfloat16"]),
)
def test_non_finite_and_non_integer_floats(case, bad, pos, dtype):
    fname, arg = case
    canonical = FUNCS[fname][1][arg]
    with np.errstate(over="ignore"):  # float16 turns the int32 extremes into +-inf: non-finite too
        v = np.array(canonical, np.float32).astype(dtype)  # bfloat16: NumPy kind "V", a float all the same
    v.flat[pos % v.size] = bad
    if fname == "quantize_affine" and np.isfinite(bad) and (arg == "x" or (arg == "scale" and bad > 0)):
        return  # fractional real values and positive fractional scales are valid there
    # every other operand holds integers: a float one must be finite and integer-valued
    expect_error(lambda: call(fname, **{arg: v if v.ndim else v[()]}), arg, (RangeError, TypeError))


@SETTINGS
@given(
    st.sampled_from(
        [
            ("saturate", None),
            ("shift_right", "shift"),
            ("fixed_mul", "m"),
            ("mac", "acc0"),
            ("mac", "x"),
            ("mac", "w"),
            ("quantize_affine", "scale"),
            ("quantize_affine", "zero_point"),
            ("div_rn", "b"),
            ("mul_rn", "b"),
        ]
    ),
    st.lists(st.integers(2, 5), min_size=1, max_size=3),
)
def test_wrong_shapes(case, dims):
    fname, arg = case
    if arg is None:  # element-wise with a single operand: any shape works, including empty
        x = np.zeros(dims, np.int32)
        same(call(fname, x=x), np.zeros(dims, np.int32))
        return
    bad = np.ones(
        tuple(dims) + (7,), FUNCS[fname][1][arg].dtype if hasattr(FUNCS[fname][1][arg], "dtype") else np.int32
    )
    if fname == "quantize_affine" and arg == "zero_point":
        bad = bad.astype(np.int32)
    expect_error(lambda: call(fname, **{arg: bad}), arg, (ShapeError, TypeError))


@SETTINGS
@given(
    st.sampled_from(STATIC_INTS),
    st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2.0, "8", None, True, [8], np.float32(8)])),
)
def test_static_ints(case, bad):
    fname, arg, lo, hi = case
    if isinstance(bad, int) and not isinstance(bad, bool) and lo <= bad <= hi:
        call(fname, **{arg: bad})  # valid: must run (mac may refuse a chunk too wide for its products)
        return
    expect_error(lambda: call(fname, **{arg: bad}), arg, (RangeError, TypeError))


@SETTINGS
@given(st.sampled_from(FLAGS), st.sampled_from(["yes", "", 1, 0, None, 1.0, np.array(True), [True]]))
def test_flags_must_be_bools(case, bad):
    fname, arg = case
    expect_error(lambda: call(fname, **{arg: bad}), arg, (TypeError,))


@SETTINGS
@given(st.sampled_from(CHOICES), st.sampled_from(["HALF_UP", "", None, 3, np.array(["zero"]), ("zero",), b"zero"]))
def test_choices(case, bad):
    fname, arg = case
    expect_error(lambda: call(fname, **{arg: bad}), arg, (RangeError,))


def test_eager_calls_compile_one_program():
    check_one_program(FUNCS, lambda name: FUNCS[name][0](**FUNCS[name][1]), {})


def test_every_function_runs_inside_a_jit_trace():
    check_traceable(FUNCS, lambda name: FUNCS[name][0](**FUNCS[name][1]))


def test_empty_and_zero_size_arrays():
    same(core.saturate(np.zeros((0,), np.int32), 8), np.zeros((0,), np.int32))
    same(core.shift_right(np.zeros((0, 3), np.int16), 2, rounding="floor"), np.zeros((0, 3), np.int32))
    same(core.mac(0, np.zeros((0, 3), np.int8), W8), np.zeros((0, 4), np.int32))
    expect_error(lambda: core.mac(0, X8, np.zeros((4, 0), np.int8)), "x", (ShapeError,))
    same(core.saturate([], 8), np.zeros((0,), np.float32))  # [] is a float array in NumPy
    expect_error(lambda: core.mac(0, [], W8), "x", (ShapeError, TypeError))


# --------------------------------------------------------------- div_rn is IEEE


FLOATS32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=False)


@SETTINGS
@given(st.lists(FLOATS32, min_size=8, max_size=8), st.lists(FLOATS32, min_size=8, max_size=8))
def test_div_rn_is_ieee_division(a, b):
    a, b = np.array(a, np.float32), np.array(b, np.float32)
    with np.errstate(all="ignore"):
        want = a / b
    got = np.asarray(core.div_rn(a, b))
    tiny = np.isfinite(want) & (np.abs(want) < np.finfo(np.float32).tiny)  # denormal results flush to 0
    want = np.where(tiny, np.float32(0), want)
    np.testing.assert_array_equal(np.abs(got), np.abs(want))  # NaN == NaN here; zero signs are not specified
    finite = np.isfinite(want) & (want != 0)
    np.testing.assert_array_equal(np.sign(got[finite]), np.sign(want[finite]))


# ---------------------------------------------------------------- geometry


@SETTINGS
@given(
    st.sampled_from(["in_hw", "kernel", "stride", "dilation"]),
    st.one_of(st.integers(-5, 0), st.integers(2**31, 2**40), st.sampled_from(["3", None, 2.5, (1, 2, 3), [None, 1]])),
)
def test_geometry_fields(field, bad):
    kw = dict(in_hw=(6, 6), kernel=(3, 3), stride=(1, 1), dilation=(1, 1))
    expect_error(lambda: core.ConvGeometry.make(**{**kw, field: bad}), field, (RangeError, TypeError))


@SETTINGS
@given(
    st.sampled_from(
        [
            ("x", "abc"),
            ("x", None),
            ("x", np.zeros((6, 6), np.int8)),
            ("x", np.zeros((1, 5, 6, 2))),
            ("x", np.array([[["a"]]])),
            ("pad_value", 300),
            ("pad_value", "0"),
            ("pad_value", None),
            ("pad_value", np.zeros(2, np.int8)),
            ("pad_value", 0.5),
            ("geom", (6, 6)),
        ]
    ),
    st.sampled_from(["extract_patches", "window_taps"]),
)
def test_patches(case, fname):
    arg, bad = case
    geom = core.ConvGeometry.make((6, 6), (3, 3), padding="SAME")
    kw = dict(x=np.zeros((1, 6, 6, 2), np.int8), geom=geom, pad_value=0)
    kw[arg] = bad
    expect_error(lambda: getattr(core, fname)(kw.pop("x"), kw.pop("geom"), **kw), arg)


def test_magnitude_bits_and_pool_out_hw():
    assert [core.magnitude_bits(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)] == [7, 8, 15, 16, 31]
    for bad in ("int7", None, np.float32, np.uint32):
        expect_error(lambda: core.magnitude_bits(bad), "dtype", (TypeError,))
    expect_error(lambda: core.pool_out_hw((2, 2), 3), "window", (ShapeError,))
    expect_error(lambda: core.pool_out_hw((4, 4), 0), "window", (RangeError,))


# ------------------------------------------------------- targets' main entry points


def _targets():
    from hwjax import gemmlowp as G
    from hwjax import litert as tfl
    from hwjax import xs3
    from hwjax.nvdla import cvt

    x8 = np.array([1, -5, 100, -128], np.int8)
    tkw = dict(
        input_scale=0.5,
        input_zero_point=1,
        filter_scales=[0.1],
        output_scale=0.7,
        output_zero_point=-3,
        requant="double",
    )
    return {
        "xs3.vlmul": (lambda **k: xs3.vlmul(**k, mode=8), dict(x=x8, m=x8[::-1].copy())),
        "xs3.vladd": (lambda **k: xs3.vladd(**k, mode=16), dict(vr=x8.astype(np.int16), mem=x8.astype(np.int16))),
        "xs3.vlsat": (
            lambda **k: xs3.vlsat(**k, mode=8),
            dict(acc=np.array([1000, -5000, 7, 9], np.int32), shift=np.int16(3)),
        ),
        "gemmlowp.srdhm": (lambda **k: G.srdhm(**k), dict(a=np.int32(2**30), b=np.int32(5))),
        "gemmlowp.rounding_divide_by_pot": (
            lambda **k: G.rounding_divide_by_pot(**k),
            dict(x=np.int32(77), exponent=np.int32(3)),
        ),
        "nvdla.cvt": (
            lambda **k: cvt(**{"out_bits": 8, **k}),
            dict(x=np.array([1000, -5], np.int32), offset=0, scale=3, shift=2),
        ),
        "tflite.fully_connected": (
            lambda **k: tfl.fully_connected(**k, **tkw),
            dict(x=np.ones((2, 3), np.int8), w=np.ones((4, 3), np.int8), b=None),
        ),
    }


TARGETS = _targets()
TARGET_ARGS = [(f, a) for f, (_, kw) in TARGETS.items() for a, v in kw.items() if v is not None]
TARGET_OUT_OF_RANGE = [
    ("xs3.vlmul", "x", 128),
    ("xs3.vladd", "vr", 2**15),
    ("gemmlowp.srdhm", "a", 2**31),
    ("gemmlowp.rounding_divide_by_pot", "exponent", 32),
    ("nvdla.cvt", "scale", 2**15),
    ("nvdla.cvt", "shift", 64),
    ("tflite.fully_connected", "x", 128),
]


@SETTINGS
@given(st.sampled_from(TARGET_ARGS), st.one_of(WRONG_TYPES, st.sampled_from([np.nan, np.inf, 0.5])))
def test_target_entry_points_wrong_types_and_non_finite(case, bad):
    fname, arg = case
    fn, kw = TARGETS[fname]
    if isinstance(bad, float):
        v = np.array(kw[arg], np.float32)
        v.flat[0] = bad
        bad = v
    elif isinstance(bad, np.ndarray) and bad.dtype == np.uint32:
        bad = np.resize(bad, np.shape(kw[arg])).astype(np.uint32)
    expect_error(lambda: fn(**{**kw, arg: bad}), arg, (TypeError, ValueError))


@SETTINGS
@given(st.sampled_from(TARGET_OUT_OF_RANGE), st.sampled_from(["python", "np.int64", "list", "int32"]), st.booleans())
def test_target_entry_points_out_of_range(case, form, negative):
    fname, arg, big = case
    fn, kw = TARGETS[fname]
    if negative and fname != "gemmlowp.rounding_divide_by_pot":
        big = -big - 2  # below the range too (the ranges are symmetric up to one)
    elif negative:
        big = -1
    v = np.array(kw[arg], np.int64)
    v.flat[0] = big
    if form == "python":
        bad = int(big) if v.ndim == 0 else v.tolist()
    elif form == "np.int64":
        bad = v if v.ndim else np.int64(big)
    elif form == "list":
        bad = v.tolist()
    elif -(2**31) <= big < 2**31:
        bad = v.astype(np.int32)
    else:
        return
    expect_error(lambda: fn(**{**kw, arg: bad}), arg, (ValueError, TypeError))


# ------------------------------------------- the targets' own checks raise HwjaxErrors


def _target_checks():
    from hwjax import gemmlowp as G
    from hwjax import litert as tfl
    from hwjax import xs3
    from hwjax.nvdla import cvt

    f8 = np.array([1.0, 2.0], np.float32)
    tkw = dict(
        input_scale=0.5,
        input_zero_point=1,
        filter_scales=[0.1],
        output_scale=0.7,
        output_zero_point=-3,
        requant="double",
    )
    fc = dict(x=np.ones((2, 3), np.int8), w=np.ones((4, 3), np.int8), b=None)
    cv = dict(x=np.array([1000, -5], np.int32), offset=0, scale=3, shift=2, out_bits=8)
    return [  # (call, argument, error class)
        (lambda: G.rounding_divide_by_pot(np.int32(77), f8), "exponent", ArgTypeError),
        (lambda: G.rounding_divide_by_pot(np.ones(3, np.int32), np.ones(2, np.int32)), "exponent", ShapeError),
        (lambda: G.shift_left(f8, 1), "x", ArgTypeError),
        (lambda: G.shift_left(np.int32(5), f8), "exponent", ArgTypeError),
        (lambda: cvt(**{**cv, "offset": f8}), "offset", ArgTypeError),
        (lambda: cvt(**{**cv, "scale": f8}), "scale", ArgTypeError),
        (lambda: cvt(**{**cv, "shift": f8}), "shift", ArgTypeError),
        (lambda: cvt(**{**cv, "offset": np.zeros(3, np.int32)}), "offset", ShapeError),
        (lambda: tfl.fully_connected(**{**fc, "x": np.ones((2, 3), np.float32)}, **tkw), "x", ArgTypeError),
        (lambda: tfl.fully_connected(**{**fc, "w": np.ones((4, 3), np.float32)}, **tkw), "w", ArgTypeError),
        (lambda: tfl.fully_connected(**{**fc, "b": np.ones(4, np.float32)}, **tkw), "b", ArgTypeError),
        (lambda: tfl.multiply_by_quantized_multiplier(f8, 2**30, 1), "x", ArgTypeError),
        (lambda: xs3.vlmul(np.ones(4, np.int8), np.ones(4, np.int8), mode=7), "mode", RangeError),
        (
            lambda: G.gemm(np.ones((2, 3), np.float32), np.ones((3, 2), np.uint8), lhs_offset=0, rhs_offset=0),
            "lhs",
            ArgTypeError,
        ),
        (
            lambda: G.gemm(np.ones(3, np.uint8), np.ones((3, 2), np.uint8), lhs_offset=0, rhs_offset=0),
            "lhs",
            ShapeError,
        ),
    ]


@pytest.mark.parametrize("i", range(len(_target_checks())))
def test_target_argument_checks_raise_hwjax_errors(i):
    fn, arg, kind = _target_checks()[i]
    expect_error(fn, arg, (kind,))


@SETTINGS
@given(st.lists(FLOATS32, min_size=8, max_size=8), st.lists(FLOATS32, min_size=8, max_size=8))
def test_mul_rn_is_ieee_multiplication(a, b):
    a, b = np.array(a, np.float32), np.array(b, np.float32)
    with np.errstate(all="ignore"):
        want = a * b  # NumPy's float32 multiplication is IEEE (correctly rounded)
    got = np.asarray(core.mul_rn(a, b))
    tiny = np.isfinite(want) & (np.abs(want) < np.finfo(np.float32).tiny)  # denormal results flush to 0
    want = np.where(tiny, np.float32(0), want)
    np.testing.assert_array_equal(np.abs(got), np.abs(want))  # NaN == NaN here
    nonzero = ~np.isnan(want) & (want != 0)
    np.testing.assert_array_equal(np.sign(got[nonzero]), np.sign(want[nonzero]))
