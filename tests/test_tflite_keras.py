"""hwjax.tflite on real converter output: small Keras models (a MobileNetV2-style net, a
two-branch CNN, a sigmoid MLP) converted by TensorFlow 2.21's TFLiteConverter to
full-integer int8 (scripts/keras_testdata.py builds tests/data/keras/). Every model
under every runtime must equal, with zero mismatches, both the LiteRT outputs stored
with it and a live LiteRT run."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import hwjax.tflite as tfl
from hwjax.tflite import testing as T

DATA = Path(__file__).resolve().parent / "data" / "keras"
RUNTIMES = ("reference", "optimized", "xnnpack")

#: the builtin operators the converter wrote into each file (read from the file below)
EXPECTED_OPS = {
    "mobilenet_v2_tiny": {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "PAD", "MEAN", "FULLY_CONNECTED", "SOFTMAX"},
    "cnn_branches": {
        "CONV_2D",
        "TANH",
        "LOGISTIC",
        "MAX_POOL_2D",
        "AVERAGE_POOL_2D",
        "MUL",
        "CONCATENATION",
        "SHAPE",
        "STRIDED_SLICE",
        "PACK",
        "RESHAPE",
        "FULLY_CONNECTED",
    },
    "mlp_sigmoid": {"FULLY_CONNECTED", "LOGISTIC"},
}
MODELS = sorted(EXPECTED_OPS)


def file_ops(data: bytes) -> list[str]:
    """The operator names of the first subgraph, in order, read with LiteRT's schema."""
    import ai_edge_litert.schema_py_generated as s

    names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    m = s.Model.GetRootAs(data, 0)
    codes = []
    for i in range(m.OperatorCodesLength()):
        c = m.OperatorCodes(i)
        code = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
        codes.append(f"CUSTOM({c.CustomCode().decode()})" if code == s.BuiltinOperator.CUSTOM else names[code])
    sg = m.Subgraphs(0)
    return [codes[sg.Operators(i).OpcodeIndex()] for i in range(sg.OperatorsLength())]


_cache: dict = {}


def _stored(name):
    if name not in _cache:
        data = (DATA / f"{name}.tflite").read_bytes()
        with np.load(DATA / f"{name}.npz") as z:
            stored = {k: z[k] for k in z.files}
        _cache[name] = (data, stored)
    return _cache[name]


#: stored here by other scripts, with other checks (scripts/keras_digits.py: the deployed demo's model)
OTHERS = {"digits_cnn"}


def test_files_present():
    assert sorted(p.stem for p in DATA.glob("*.tflite") if p.stem not in OTHERS) == MODELS
    assert sorted(p.stem for p in DATA.glob("*.npz") if p.stem not in OTHERS) == MODELS


@pytest.mark.parametrize("name", MODELS)
def test_ops_supported(name):
    data, _ = _stored(name)
    ops = set(file_ops(data))
    assert ops == EXPECTED_OPS[name]
    missing = sorted(ops - set(tfl.SUPPORTED_OPS))
    assert not missing, f"{name}: operators not in hwjax.tflite.SUPPORTED_OPS: {missing}"


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", MODELS)
def test_matches_litert(name, runtime):
    data, stored = _stored(name)
    x, want = stored["x"], stored[runtime]
    assert x.dtype == np.int8 and x.shape[0] == 16 and want.dtype == np.int8
    live = T.run_litert(data, x, runtime)
    assert np.array_equal(live, want), (
        f"{name} on {runtime}: this ai-edge-litert differs from the stored outputs in {int((live != want).sum())}"
    )
    got = np.asarray(tfl.load(DATA / f"{name}.tflite").run(x, runtime=runtime))
    assert got.dtype == np.int8 and got.shape == want.shape
    bad = int((got != want).sum())
    assert bad == 0, f"{name} on {runtime}: {bad} of {got.size} outputs differ from LiteRT"


def test_stored_runtimes_differ():
    """The three LiteRT runtimes disagree on these files (so matching each of them checks
    three arithmetics, not one): pairwise differing outputs of the stored results."""
    for name in ("mobilenet_v2_tiny", "cnn_branches"):
        _, stored = _stored(name)
        for a, b in (("reference", "optimized"), ("reference", "xnnpack"), ("optimized", "xnnpack")):
            assert not np.array_equal(stored[a], stored[b]), f"{name}: {a} and {b} agree"
