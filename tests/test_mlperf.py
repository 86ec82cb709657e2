"""Acceptance: the six MLPerf Tiny int8 reference models, bit-exact on every runtime.

The models (tests/data/mlperf/NAME.tflite, unchanged from github.com/mlcommons/tiny; see
NOTICE there), xformer's conversions (NAME.xc.tflite) and the oracle outputs
(NAME.npz) were made by scripts/mlperf_testdata.py: 8 inputs per model (all -128, all
127, 6 seeded random), run one example per invoke by the real runtimes. Each case runs
hwjax on the stored inputs and compares with ``==``, no tolerance:

* ``reference`` / ``optimized`` / ``xnnpack``: LiteRT 2.3.0 (BUILTIN_REF,
  BUILTIN_WITHOUT_DEFAULT_DELEGATES, AUTO; ``num_threads=1``) -> ``y_reference`` ...;
* ``tflm``: the official ``tflite_micro`` package -> ``y_tflm``;
* ``xs3``: hwjax compiles the original file as xformer would; ``xs3-xc``: hwjax runs the
  stored xformer conversion's XC operators; both against the conversion run in
  xmos-ai-tools 1.4.2's ``TFLMHostInterpreter`` -> ``y_xs3``.

(``y_tflm_xmos``, the original in that host interpreter, the TFLM inside xmos-ai-tools,
is stored for reference; it equals ``y_tflm`` on all six models.)

A case hwjax does not match yet is marked ``xfail(strict=True)`` with its cause, so an
XPASS says it was fixed (scripts/mlperf_diff.py finds the first differing operator).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import hwjax.tflite as T
from hwjax.errors import UnsupportedOpError

DATA = os.path.join(os.path.dirname(__file__), "data", "mlperf")

#: the published files (sha256 of github.com/mlcommons/tiny's bytes, as in NOTICE)
MODELS = {
    "ad01_int8": "87cf24194ef93d1d9b11a591d805526b98008e351655d29883c825c9c106ba24",
    "kws_ref_model": "aeea436800704fce17b17292e4412630ad856e9d777c044c64ef748a880bd0ae",
    "pretrainedResnet_quant": "3c002613d1b2475eb51dd78dfb85a546c8ae658dee71cf6ade43b022fe205415",
    "pretrainedResnet_large_int8": "dc27dcd823f5665533352f7da516b0c9bc6f089914b8283782e55961b3423fcf",
    "vww_96_int8": "597a384c8c2c8a1276f04702f25013b7838f2f814f1ca7c174d295b73e3d6b7b",
    "str_ww_ref_model": "3af8550895ba7d5c584277102b5075c52dcfa63ba9d2b2240f37c4e6abd5dd2b",
}

#: case id -> (hwjax runtime, file suffix, stored oracle key)
RUNTIMES = {
    "reference": ("reference", "", "y_reference"),
    "optimized": ("optimized", "", "y_optimized"),
    "xnnpack": ("xnnpack", "", "y_xnnpack"),
    "tflm": ("tflm", "", "y_tflm"),
    "xs3": ("xs3", "", "y_xs3"),
    "xs3-xc": ("xs3", ".xc", "y_xs3"),
}

#: (model, case id) -> cause, for the cases hwjax does not match today
XFAIL: dict[tuple[str, str], str] = {}
#: (model, case id) -> cause, for the cases hwjax refuses (UnsupportedOpError; none at present)
REFUSED: dict[tuple[str, str], str] = {}
#: cases left to `make test-full` (marked slow) to keep this file's share of `make test` under
#: a minute on one core: xs3 on the original files, where hwjax derives xformer's parameters
#: itself (-n 0, fast compile, no persistent cache: 11.7, 6.4, 6.0, 5.8 and 4.3 s of the whole
#: file's 87 s; ad01_int8, 2.6 s, stays in)
SLOW = {
    ("vww_96_int8", "xs3"),
    ("kws_ref_model", "xs3"),
    ("pretrainedResnet_large_int8", "xs3"),
    ("pretrainedResnet_quant", "xs3"),
    ("str_ww_ref_model", "xs3"),
}


def _cases():
    for model in MODELS:
        for case in RUNTIMES:
            marks = []
            if (model, case) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[model, case]))
            if (model, case) in REFUSED:
                marks.append(pytest.mark.xfail(strict=True, raises=UnsupportedOpError, reason=REFUSED[model, case]))
            if (model, case) in SLOW:
                marks.append(pytest.mark.slow)
            yield pytest.param(model, case, marks=marks, id=f"{model}-{case}")


def _path(name: str) -> str:
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is missing (scripts/mlperf_testdata.py makes the MLPerf Tiny data)")
    return path


def _oracle(model: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    d = np.load(_path(f"{model}.npz"))
    if key not in d.files:
        runtime = key[2:]
        for who in (runtime, "xformer"):
            refused = os.path.join(DATA, f"{model}.{who}.refused.txt")
            if os.path.exists(refused):
                with open(refused) as f:
                    pytest.skip(f"the real runtime refuses {model} ({who}): {f.readline().strip()}")
        pytest.skip(f"{model}.npz holds no {key}")
    return d["x"], d[key]


@pytest.mark.parametrize("model,case", list(_cases()))
def test_model_equals_the_runtime(model, case):
    runtime, suffix, key = RUNTIMES[case]
    x, want = _oracle(model, key)
    got = np.asarray(T.load(_path(f"{model}{suffix}.tflite")).run(x, runtime=runtime))
    assert got.dtype == want.dtype, f"{model} on {case}: dtype {got.dtype}, the runtime gives {want.dtype}"
    assert got.shape == want.shape, f"{model} on {case}: shape {got.shape}, the runtime gives {want.shape}"
    bad = got != want
    if bad.any():
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        examples = sorted({int(i) for i in np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0]})
        pytest.fail(
            f"{model} on {case}: {int(bad.sum())} of {want.size} values differ from {key}, "
            f"max |diff| {int(diff.max())} (examples {examples}; scripts/mlperf_diff.py finds the first operator)"
        )


@pytest.mark.parametrize("model", list(MODELS))
def test_the_models_are_the_published_files(model):
    with open(_path(f"{model}.tflite"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == MODELS[model]


def test_the_inputs_cover_the_extremes():
    for model in MODELS:
        x = np.load(_path(f"{model}.npz"))["x"]
        assert x.dtype == np.int8 and len(x) == 8, model
        assert (x[0] == -128).all() and (x[1] == 127).all(), model


@pytest.mark.parametrize(
    "model, runtime",
    [("kws_ref_model", "xs3"), ("kws_ref_model", "reference"), ("vww_96_int8", "xs3")],  # VWW: ops left to TFLite
)
def test_host_lowering_compiles_no_program(monkeypatch, model, runtime):
    """Model.lowered on concrete parameters is host work (NumPy recipes, one transfer of the
    results): no XLA program is compiled for it (each would cost a cold process ~25 ms)."""
    import jax

    from hwjax.core import _stored

    monkeypatch.setattr(_stored, "program_folder", lambda: None)  # lowered now, not loaded
    jax.clear_caches()
    compiles = []
    listen = lambda event, secs, **_: compiles.append(event) if event.endswith("backend_compile_duration") else None
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        T.load(os.path.join(DATA, f"{model}.tflite")).lowered(runtime)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []


@pytest.mark.parametrize("runtime", ["reference", "xs3"])
def test_the_models_dots_take_the_backends_fast_operand(runtime):
    """Every dot of a conv model's program takes its activations in the backend's fast
    8-bit type (``hwjax.core.lhs8_dtype``: uint8 x int8 on a CPU with VNNI, which XLA runs
    in YNNPACK's VNNI kernels) and none is widened to int16 or int32: the speed of the
    MLPerf models rests on it (BENCHMARKS.md)."""
    import jax

    from hwjax.core import lhs8_dtype

    m = T.load(_path("pretrainedResnet_quant.tflite"))
    x = np.load(_path("pretrainedResnet_quant.npz"))["x"]
    text = jax.jit(lambda a: m.run(a, runtime=runtime)).lower(x).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line and "tensor<" in line]
    lhs = "ui8" if lhs8_dtype() == np.uint8 else "i8"
    assert len(dots) >= 9  # eight convolutions and the dense layer, at least
    for d in dots:
        operands = d.split(":", 1)[1].split("->")[0]
        assert f"x{lhs}>" in operands and "xi16>" not in operands and "xi32>, tensor" not in operands, d
