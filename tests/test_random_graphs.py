"""Random int8 graphs (tests/randgraph.py) run by hwjax and by the runtimes themselves.

For every seed of a fixed list, :func:`tests.randgraph.generate` makes a graph spec,
:func:`tests.randgraph.build` its ``.tflite`` file, and the file runs

* in the oracles: LiteRT 2.3.0's three op resolvers (``reference``: BUILTIN_REF,
  ``optimized``: BUILTIN_WITHOUT_DEFAULT_DELEGATES, ``xnnpack``: AUTO) and the official
  TensorFlow Lite Micro interpreter (``tflm``), in a child process (a crashing runtime is
  recorded as refusing), one example per invoke;
* in hwjax: ``hwjax.tflite.load(bytes).run(x, runtime=r)`` on the whole batch (all -128,
  all 127, all the input zero point, 13 random inputs).

Where the oracle ran, hwjax must give the same integers exactly. Outcomes per runtime:
``exact``; ``wrong`` (a failure, unless the graph matches a known class of
:data:`KNOWN_WRONG`, then ``known-wrong``, reported); ``hwjax-refused`` (hwjax raised
:class:`hwjax.errors.UnsupportedOpError`: reported, not failed); ``oracle-refused`` (the
runtime raised or crashed; hwjax is not run). Any other hwjax exception is a failure.
The counts are printed by the last test, :func:`test_summary` (``-s`` or ``-rA`` shows them;
they are also emitted as a :class:`RandGraphSummary` warning, which pytest's warnings
summary shows, also under pytest-xdist).

Samples: seeds ``0 .. HWJAX_RANDGRAPH_COUNT - 1`` (default 40) in ``make test``; seeds up
to 500 (or ``HWJAX_RANDGRAPH_COUNT`` if larger) more in tests marked ``slow``
(``make test-full``). Graphs are checked ten per test (one JAX program per graph and
runtime: XLA compilation dominates).

runtime="xs3" (:func:`test_random_graphs_xs3`): graphs of the same generator converted by
xformer (xmos-ai-tools 1.4.2) with the host interpreter's outputs, stored in
tests/data/randgraph_xs3/ by scripts/randgraph_xs3_testdata.py (no live oracle: it needs
its own venv); hwjax runs the converted file and the original (its own compilation with
xformer's recipe), both must equal the host interpreter on the converted file.

Reproducing a failure: the message prints the seed and the spec. Then::

    .venv/bin/python -m tests.test_random_graphs SEED              # every runtime's outcome
    .venv/bin/python -m tests.test_random_graphs SEED RUNTIME --minimise [--max-diff N]

the second prints a minimised spec (tests/randgraph.py :func:`minimise`) to paste into
tests/test_random_graph_regressions.py (``--max-diff N``: keep only candidates whose largest
difference is at most N, so that a +-1 class stays one; the minimised graph can still
show a difference that started upstream: check its intermediate tensors).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import warnings

import numpy as np
import pytest

from tests import randgraph as rg

COUNT = int(os.environ.get("HWJAX_RANDGRAPH_COUNT", "40"))
FULL_COUNT = max(500, COUNT)  # seeds make test-full runs (the ones above COUNT are `slow`)
PER_TEST = 10
N_RANDOM = 13  # random examples per graph (after all -128, all 127, all the zero point)


# ------------------------------------------------------------------ known failing classes
#: Classes of wrong results hwjax is known to give today, as ``name: (runtimes,
#: predicate(spec, detail))``: a mismatch on one of ``runtimes`` for which the predicate
#: holds (``detail``: the :func:`compare` text) counts as ``known-wrong`` (reported, not
#: failed). Each class has strict-xfail cases in tests/test_random_graph_regressions.py;
#: remove the entry here when those pass.
KNOWN_WRONG: dict = {}


#: The same for runtime="xs3" (keys ``xs3-converted`` / ``xs3-original``; an ``error``
#: outcome of the class counts too). Regressions: test_random_graph_regressions.py::test_xs3_regression.
KNOWN_XS3 = {}


def known_class(spec, runtime, detail="") -> str | None:
    for name, (runtimes, pred) in {**KNOWN_WRONG, **KNOWN_XS3}.items():
        if runtime in runtimes and pred(spec, detail):
            return name
    return None


# ------------------------------------------------------------------------------- checking
def compare(want, got) -> str | None:
    """None when equal, else a short description of the difference."""
    if got.shape != want.shape:
        return f"shape {got.shape} != oracle {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != oracle {want.dtype}"
    bad = got != want
    if not bad.any():
        return None
    d = got.astype(np.int32) - want.astype(np.int32)
    idx = np.argwhere(bad)
    first = ", ".join(
        f"{tuple(int(v) for v in j)}: hwjax {int(got[tuple(j)])} oracle {int(want[tuple(j)])}" for j in idx[:4]
    )
    return (
        f"{int(bad.sum())} of {bad.size} outputs differ (max |diff| {int(np.abs(d).max())}, examples "
        f"{sorted({int(j[0]) for j in idx})}); {first}"
    )


def check_spec(spec, runtimes=rg.RUNTIMES, oracle=None, n_random=5, x=None) -> dict:
    """``{runtime: (outcome, detail)}`` for one spec on ``x`` (default:
    :func:`tests.randgraph.inputs` with ``n_random`` random examples); outcome in exact /
    wrong / known-wrong / hwjax-refused / oracle-refused / error."""
    from hwjax.errors import UnsupportedOpError

    model = rg.build(spec)
    x = rg.inputs(spec, n_random) if x is None else x
    want = oracle.run(model, x, runtimes) if oracle is not None else rg.run_oracles(model, x, runtimes)
    import hwjax.tflite as T

    try:
        loaded = T.load(model)
    except UnsupportedOpError as e:
        loaded = e
    out = {}
    for r in runtimes:
        if isinstance(want[r], rg.Refused):
            out[r] = ("oracle-refused", want[r].message)
            continue
        if isinstance(loaded, Exception):
            out[r] = ("hwjax-refused", str(loaded))
            continue
        try:
            got = np.asarray(loaded.run(x, runtime=r))
        except UnsupportedOpError as e:
            out[r] = ("hwjax-refused", str(e))
            continue
        except Exception as e:  # reported with the seed
            out[r] = ("error", f"{type(e).__name__}: {e}")
            continue
        diff = compare(want[r], got)
        if diff is None:
            out[r] = ("exact", "")
        else:
            k = known_class(spec, r, diff)
            out[r] = ("known-wrong", f"[{k}] {diff}") if k else ("wrong", diff)
    return out


def max_diff(detail: str) -> int:
    """The ``max |diff|`` of a :func:`compare` description (-1: a shape or dtype difference)."""
    key = "max |diff| "
    return int(detail[detail.index(key) + len(key) :].split(",")[0]) if key in detail else -1


def fails_on(runtime, oracle=None, max_abs_diff=None):
    """A ``fails(spec)`` for :func:`tests.randgraph.minimise`: hwjax runs and differs from
    the oracle on ``runtime`` (by at most ``max_abs_diff`` where given, so that the
    minimised graph keeps the original's kind of difference)."""

    def fails(spec):
        outcome, detail = check_spec(spec, (runtime,), oracle, n_random=60)[runtime]
        if outcome not in ("wrong", "known-wrong"):
            return False
        return max_abs_diff is None or 0 < max_diff(detail) <= max_abs_diff

    return fails


# ---------------------------------------------------------------------------------- tests
COUNTS = collections.Counter()  # (runtime, outcome) -> graphs
DETAILS = collections.defaultdict(list)  # (runtime, outcome) -> [seed, ...]
REASONS = collections.Counter()  # (runtime, outcome, first line of the reason) -> graphs


@pytest.fixture(scope="module")
def oracle():
    with rg.OracleProcess() as o:
        yield o


def _chunks():
    for lo in range(0, FULL_COUNT, PER_TEST):
        seeds = range(lo, min(lo + PER_TEST, FULL_COUNT))
        marks = () if lo < COUNT else (pytest.mark.slow,)
        yield pytest.param(seeds.start, seeds.stop, id=f"seeds{seeds.start}-{seeds.stop - 1}", marks=marks)


@pytest.mark.parametrize("lo,hi", list(_chunks()))
def test_random_graphs(lo, hi, oracle):
    failures = []
    for seed in range(lo, hi):
        spec = rg.generate(seed)
        for r, (outcome, detail) in check_spec(spec, oracle=oracle, n_random=N_RANDOM).items():
            COUNTS[r, outcome] += 1
            DETAILS[r, outcome].append(seed)
            if outcome != "exact":
                REASONS[r, outcome, _reason(detail)] += 1
            if outcome in ("wrong", "error"):
                failures.append(
                    f"seed {seed} runtime {r!r}: {outcome}: {detail}\n"
                    f"  graph: {rg.describe(spec)}\n  spec = {rg.spec_repr(spec)}"
                )
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures)


def _reason(detail: str) -> str:
    """A refusal or mismatch message without its numbers and names (for counting)."""
    import re

    line = detail.strip().splitlines()[0] if detail.strip() else ""
    line = re.sub(r"'[^']*'", "'.'", line)
    return re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?", "N", line)[:110]


# ------------------------------------------------------------------- xcore.ai (xs3)
#: random graphs converted by xformer, with the xmos host interpreter's outputs (made by
#: scripts/randgraph_xs3_testdata.py; the stored files are used, not regenerated)
#: (``HWJAX_RANDGRAPH_XS3_DATA`` points the xs3 tests at a probe of other seeds made by that
#: script's ``--seeds``)
XS3_DATA = os.environ.get("HWJAX_RANDGRAPH_XS3_DATA") or os.path.join(
    os.path.dirname(__file__), "data", "randgraph_xs3"
)
XS3_SEEDS = (
    sorted(int(f[4:-4]) for f in os.listdir(XS3_DATA) if f.startswith("seed") and f.endswith(".npz"))
    if os.path.isdir(XS3_DATA)
    else []
)


def check_xs3(name: str) -> dict:
    """``{"xs3-converted" / "xs3-original": (outcome, detail)}`` for ``NAME`` (``seedN`` or a
    regression) of tests/data/randgraph_xs3/: hwjax's runtime="xs3" on the converted file
    and on the original (hwjax's compilation with xformer's recipe), both against the host
    interpreter on the converted file."""
    import hwjax.tflite as T
    from hwjax.errors import UnsupportedOpError

    d = np.load(os.path.join(XS3_DATA, f"{name}.npz"))
    out = {}
    for key, fname in (("xs3-converted", f"{name}.xc.tflite"), ("xs3-original", f"{name}.tflite")):
        try:
            got = np.asarray(T.load(os.path.join(XS3_DATA, fname)).run(d["x"], runtime="xs3"))
        except UnsupportedOpError as e:
            out[key] = ("hwjax-refused", str(e))
            continue
        except Exception as e:  # reported with the seed
            out[key] = ("error", f"{type(e).__name__}: {e}")
            continue
        diff = compare(d["y_xs3"], got.reshape(d["y_xs3"].shape) if got.size == d["y_xs3"].size else got)
        out[key] = ("exact", "") if diff is None else ("wrong", diff)
    with open(os.path.join(XS3_DATA, f"{name}.json")) as f:
        spec = json.load(f)
    for key, (outcome, detail) in out.items():
        k = known_class(spec, key, detail) if outcome in ("wrong", "error") else None
        if k:
            out[key] = ("known-wrong", f"[{k}] {detail}")
    return out


@pytest.mark.parametrize(
    "seeds",
    [
        pytest.param(
            XS3_SEEDS[i : i + PER_TEST], id=f"xs3-{i // PER_TEST}", marks=() if i == 0 else (pytest.mark.slow,)
        )
        for i in range(0, len(XS3_SEEDS), PER_TEST)
    ],
)
def test_random_graphs_xs3(seeds):
    """The stored sample (the first ten graphs in ``make test``, all in ``make test-full``)."""
    failures = []
    for seed in seeds:
        for key, (outcome, detail) in check_xs3(f"seed{seed}").items():
            COUNTS[key, outcome] += 1
            DETAILS[key, outcome].append(seed)
            if outcome != "exact":
                REASONS[key, outcome, _reason(detail)] += 1
            if outcome in ("wrong", "error"):
                with open(os.path.join(XS3_DATA, f"seed{seed}.json")) as f:
                    spec = json.load(f)
                failures.append(f"seed {seed} {key}: {outcome}: {detail}\n  spec = {rg.spec_repr(spec)}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures)


XS3_KEYS = ("xs3-converted", "xs3-original")


#: what the generator must make within the seeds of ``make test-full`` (tests/randgraph.py
#: :func:`features`; the brief of the tester)
MUST_COVER = {
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "ADD",
    "MUL",
    "MAX_POOL_2D",
    "AVERAGE_POOL_2D",
    "MEAN",
    "PAD",
    "CONCATENATION",
    "RESHAPE",
    "SOFTMAX",
    "LOGISTIC",
    "TANH",
    *(f"{k}:{a}" for k in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "MUL") for a in rg.ACTIVATIONS),
    "conv kx1/1xk",
    "conv stride 3",
    "conv dilation",
    "conv SAME",
    "conv VALID",
    "conv H or W = 1",
    "conv odd channels",
    "depth multiplier",
    "extreme bias",
    *(f"{k} {q}" for k in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") for q in ("per-channel", "per-tensor")),
    "FC 2-D keep_num_dims=False",
    "FC 2-D keep_num_dims=True",
    "FC 4-D keep_num_dims=False",
    "FC 4-D keep_num_dims=True",
    "ADD constant c",
    "ADD constant 1c",
    "ADD constant scalar",
    "ADD two tensors",
    "MUL constant c",
    "MUL two tensors",
    "pool SAME",
    "pool VALID",
    "global pool",
    "MEAN axes [1, 2] keep_dims=True",
    "MEAN axes [1, 2] keep_dims=False",
    "CONCATENATION channels",
    "CONCATENATION other axis",
    "RESHAPE flat",
    "RESHAPE rows",
    "RESHAPE 4d",
    "SOFTMAX beta != 1",
    "3+ ops",
    "two-input op (branch)",
    "2-D input",
}


def test_the_generator_covers_what_it_should():
    """Every feature of :data:`MUST_COVER` occurs in the graphs of ``make test-full`` (a
    change to the generator that loses one fails here; generating is cheap), and in the
    default sample the op kinds and fused activations of CONV_2D / DEPTHWISE_CONV_2D."""
    seen = set()
    for seed in range(FULL_COUNT):
        seen |= rg.features(rg.generate(seed))
    assert MUST_COVER <= seen, sorted(MUST_COVER - seen)
    default = set()
    for seed in range(COUNT):
        default |= rg.features(rg.generate(seed))
    want = {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "ADD",
        "MUL",
        "MEAN",
        "PAD",
        "CONCATENATION",
        "RESHAPE",
        "SOFTMAX",
        "LOGISTIC",
        "TANH",
        "MAX_POOL_2D",
        "AVERAGE_POOL_2D",
        *(f"{k}:{a}" for k in ("CONV_2D", "DEPTHWISE_CONV_2D") for a in rg.ACTIVATIONS),
    }
    if COUNT >= 40:  # (a smaller HWJAX_RANDGRAPH_COUNT may miss some)
        assert want <= default, sorted(want - default)


class RandGraphSummary(UserWarning):
    """The outcome counts of the random graphs (not a problem: a report)."""


def summary_table() -> str:
    outcomes = ("exact", "wrong", "known-wrong", "hwjax-refused", "oracle-refused", "error")
    lines = ["random graphs per runtime: " + " / ".join(outcomes)]
    for r in rg.RUNTIMES + XS3_KEYS:
        if any(COUNTS[r, o] for o in outcomes):
            lines.append(f"  {r:13s} " + " / ".join(str(COUNTS[r, o]) for o in outcomes))
    for r in rg.RUNTIMES + XS3_KEYS:
        for o in ("known-wrong", "wrong", "error"):
            if DETAILS[r, o]:
                lines.append(f"  {r} {o} seeds: {DETAILS[r, o][:40]}")
    lines.append("reasons (graphs: runtime, outcome, message):")
    for (r, o, why), n in sorted(REASONS.items(), key=lambda kv: (kv[0][1], kv[0][0], -kv[1])):
        lines.append(f"  {n:4d}  {r:13s} {o:14s} {why}")
    return "\n".join(lines)


def test_summary():
    """Prints the counts (after the graph tests of this run; none: nothing to report) and
    checks that the sample is not degenerate: on every runtime at least a third of the
    graphs ran in the oracle and in hwjax and were compared."""
    total = sum(
        COUNTS[rg.RUNTIMES[0], o] for o in ("exact", "wrong", "known-wrong", "hwjax-refused", "oracle-refused", "error")
    )
    if not total:
        pytest.skip("no random graph ran in this session")
    text = summary_table()
    print("\n" + text)
    warnings.warn(RandGraphSummary(text), stacklevel=1)
    for r in rg.RUNTIMES:
        compared = COUNTS[r, "exact"] + COUNTS[r, "wrong"] + COUNTS[r, "known-wrong"]
        assert compared >= total / 3, f"{r}: only {compared} of {total} graphs compared\n{text}"


# ------------------------------------------------------------------------ command line
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    seed = int(argv[0])
    spec = rg.generate(seed)
    print(rg.spec_repr(spec))
    with rg.OracleProcess() as o:
        if "--minimise" in argv:
            runtime = argv[1]
            md = int(argv[argv.index("--max-diff") + 1]) if "--max-diff" in argv else None
            small = rg.minimise(spec, fails_on(runtime, o, md), log=lambda m: print(m, file=sys.stderr))
            print(rg.spec_repr(small))
            print(check_spec(small, (runtime,), o))
        else:
            for r, res in check_spec(spec, oracle=o).items():
                print(r, *res)


if __name__ == "__main__":
    main()
