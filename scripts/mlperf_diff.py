"""The first operator where hwjax's run of a ``.tflite`` file differs from the real runtime.

    .venv/bin/python scripts/mlperf_diff.py MODEL.tflite RUNTIME [--random N [--seed S]] [--all]
        [--xmos-python .venv-xmos/bin/python]

RUNTIME: ``reference``, ``optimized``, ``xnnpack`` (LiteRT 2.3.0's resolvers BUILTIN_REF,
BUILTIN_WITHOUT_DEFAULT_DELEGATES, AUTO; ``num_threads=1``), ``tflm`` (the official
``tflite_micro`` package) or ``xs3`` (xmos-ai-tools 1.4.2's ``TFLMHostInterpreter``, run in
the xmos venv). The inputs are ``x`` of ``NAME.npz`` beside the model (``NAME`` without
``.xc``; as scripts/mlperf_testdata.py writes it), or ``N`` seeded uniform random ones.

How: the real runtime runs a *probe* copy of the file whose graph outputs are every
operator's outputs (operators, tensors and buffers untouched; the probe's final output is
checked against the unprobed file's), one example per invoke; on ``xs3`` (xformer plans
the arena offline and shares buffers) one copy per operator, cut after it, instead. hwjax
runs the file with ``Model.run(x, runtime=..., intermediates=True)``. Operators are walked in the file's
order and each output tensor compared by name, exactly; the first operator with a
difference is printed with its kind, shapes and options (``--all``: every operator).

``xs3`` on an original (not ``.xc.``) file: hwjax compiles the original as xformer would,
the oracle is the host interpreter on ``NAME.xc.tflite`` beside it (made with xformer's
default options when missing, into a temporary file). xformer renames most tensors, so each
of the original's operator outputs is paired with the converted tensor of the same name,
else with the next converted operator output of the same size (the converted file's
reshapes and ``XC_no_op`` skipped); both operators are printed: check the pairing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

RESOLVERS = {"reference": "BUILTIN_REF", "optimized": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "xnnpack": "AUTO"}
#: operators that only reshape (the converted file's no-ops among them)
RESHAPES = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "XC_no_op")
DEFAULT_XMOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv-xmos", "bin", "python")


# -------------------------------------------------------------------------- the file itself


def _schema():
    try:
        import ai_edge_litert.schema_py_generated as s
    except ImportError:  # the xmos venv
        import tflite as s  # (the probe is written in the main venv)
    return s


def _load(data: bytes):
    return _schema().ModelT.InitFromPackedBuf(bytearray(data), 0)


def _pack(m) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def probe(data: bytes) -> tuple[bytes, list[str]]:
    """The file with every operator output (first subgraph) made a graph output, and
    those tensors' names in output order (the file's own outputs first)."""
    m = _load(data)
    sg = m.subgraphs[0]
    outs = [int(i) for i in sg.outputs]
    for op in sg.operators:
        outs += [int(i) for i in op.outputs if i >= 0 and int(i) not in outs]
    sg.outputs = outs
    return _pack(m), [sg.tensors[i].name.decode() for i in outs]


def cuts(data: bytes) -> list[tuple[bytes, list[str]]]:
    """Per operator k: the file cut after it (operators 0..k kept, its outputs the graph's
    outputs) and those outputs' names. For xformer's files, whose arena is planned offline
    (``OfflineMemoryAllocation``; ``XC_no_op`` and in-place operators share buffers): a
    probe would read tensors that later operators overwrote, a cut keeps the plan."""
    n = len(_load(data).subgraphs[0].operators)
    out = []
    for k in range(n):
        m = _load(data)
        sg = m.subgraphs[0]
        sg.operators = sg.operators[: k + 1]
        sg.outputs = [int(i) for i in sg.operators[k].outputs if i >= 0]
        out.append((_pack(m), [sg.tensors[i].name.decode() for i in sg.outputs]))
    return out


def _op_name(m, op) -> str:
    s = _schema()
    oc = m.operatorCodes[op.opcodeIndex]
    if oc.customCode:
        return oc.customCode.decode()
    code = max(oc.builtinCode, oc.deprecatedBuiltinCode)
    return {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}.get(code, str(code))


def _short(v):
    """A custom option's value, binary strings and long vectors summarised."""
    if isinstance(v, (list, tuple)):
        return [_short(e) for e in v] if len(v) <= 8 else f"<{len(v)} values>"
    if isinstance(v, (bytes, bytearray, str)) and (len(v) > 24 or not str(v).isprintable()):
        return f"<{len(v)} bytes>"
    return v


def _options(op) -> str:
    if op.builtinOptions is not None:
        kv = {k: v for k, v in vars(op.builtinOptions).items() if v is not None}
        return ", ".join(f"{k}={v}" for k, v in kv.items())
    if op.customOptions is not None:
        from flatbuffers import flexbuffers

        try:
            root = flexbuffers.GetRoot(bytes(bytearray(op.customOptions))).AsMap
        except Exception:  # not a flexbuffer map
            return f"<{len(op.customOptions)} custom option bytes>"
        parts = []
        for k, v in zip(root.Keys, root.Values):
            try:
                val = v.Value
            except Exception:  # a blob
                val = "<blob>"
            parts.append(f"{k.Value}={_short(val)}")
        return ", ".join(parts)
    return ""


def operators(data: bytes) -> list[dict]:
    """Per operator of the first subgraph: index, kind, options, input/output names and shapes."""
    m = _load(data)
    sg = m.subgraphs[0]

    def t(i):
        x = sg.tensors[i]
        return x.name.decode(), tuple(int(d) for d in x.shape) if x.shape is not None else ()

    ops = []
    for k, op in enumerate(sg.operators):
        ins = [t(i) for i in op.inputs if i >= 0]
        ops.append(
            {
                "index": k,
                "kind": _op_name(m, op),
                "options": _options(op),
                "inputs": ins,
                "outputs": [t(i) for i in op.outputs if i >= 0],
            }
        )
    return ops


# -------------------------------------------------------------------------- the real runtimes


def run_litert(data: bytes, x: np.ndarray, runtime: str) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=data,
        num_threads=1,
        experimental_op_resolver_type=getattr(OpResolverType, RESOLVERS[runtime]),
    )
    it.allocate_tensors()
    i = it.get_input_details()[0]["index"]
    outs = [d["index"] for d in it.get_output_details()]
    ys = []
    for xi in x:
        it.set_tensor(i, np.ascontiguousarray(xi[None]))
        it.invoke()
        ys.append([it.get_tensor(o).copy() for o in outs])
    return [np.stack(v) for v in zip(*ys)]


def run_tflm(data: bytes, x: np.ndarray) -> list[np.ndarray]:
    from tflite_micro.python.tflite_micro import runtime

    it = runtime.Interpreter.from_bytes(data, arena_size=max(4 << 20, 16 * len(data)))
    n = len(_load(data).subgraphs[0].outputs)
    ys = []
    for xi in x:
        it.set_input(np.ascontiguousarray(xi[None]), 0)
        it.invoke()
        ys.append([np.array(it.get_output(k)).copy() for k in range(n)])
    return [np.stack(v) for v in zip(*ys)]


def host_child(x_path: str, out_path: str, *model_paths: str) -> None:
    """(xmos venv) the host interpreter on every example, per model: ``out_path`` holds
    ``y{model}_{output}``."""
    from xmos_ai_tools.xinterpreters import TFLMHostInterpreter

    x = np.load(x_path)
    res = {}
    for j, path in enumerate(model_paths):
        it = TFLMHostInterpreter()
        try:
            it.set_model(model_path=path)
            outs = it.get_output_details()
            ys = []
            for xi in x:
                it.set_tensor(0, np.ascontiguousarray(xi[None]))
                it.invoke()
                ys.append([it.get_tensor(d["index"]).reshape(d["shape"]).copy() for d in outs])
        finally:
            it.close()
        res.update({f"y{j}_{k}": np.stack(v) for k, v in enumerate(zip(*ys))})
    np.savez(out_path, **res)


def run_host(models: list[bytes], x: np.ndarray, xmos_python: str) -> list[list[np.ndarray]]:
    """Each model's outputs in the host interpreter (one process, in the xmos venv)."""
    with tempfile.TemporaryDirectory() as work:
        xp, op = os.path.join(work, "x.npy"), os.path.join(work, "y.npz")
        paths = []
        for j, data in enumerate(models):
            paths.append(os.path.join(work, f"m{j}.tflite"))
            with open(paths[-1], "wb") as f:
                f.write(data)
        np.save(xp, x)
        r = subprocess.run(
            [xmos_python, os.path.abspath(__file__), "_host", xp, op, *paths], capture_output=True, text=True
        )
        if r.returncode != 0:
            sys.exit(f"the host interpreter failed (status {r.returncode}):\n{r.stdout}{r.stderr}")
        d = np.load(op)
        return [
            [d[f"y{j}_{k}"] for k in range(sum(f.startswith(f"y{j}_") for f in d.files))] for j in range(len(models))
        ]


def xformer_child(src: str, dst: str) -> None:
    """(xmos venv) xformer with default options."""
    from xmos_ai_tools import xformer

    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    rc = xformer.convert(src, dst, None)
    if rc != 0 or not os.path.exists(dst):
        sys.exit(f"xformer failed (rc={rc})")


def converted(path: str, xmos_python: str) -> bytes:
    """``NAME.xc.tflite`` beside ``path``, else xformer's conversion (default options)."""
    xc = path[: -len(".tflite")] + ".xc.tflite"
    if os.path.exists(xc):
        with open(xc, "rb") as f:
            return f.read()
    with tempfile.TemporaryDirectory() as work:
        dst = os.path.join(work, "m.xc.tflite")
        subprocess.run([xmos_python, os.path.abspath(__file__), "_xformer", path, dst], check=True)
        with open(dst, "rb") as f:
            return f.read()


def oracle(data: bytes, x: np.ndarray, runtime: str, xmos_python: str) -> dict[str, np.ndarray]:
    """Every operator output of ``data`` by tensor name, as the real runtime computes it."""
    if runtime == "xs3":
        parts = cuts(data)
        ys = run_host([data] + [d for d, _ in parts], x, xmos_python)
        plain, names, values = ys[0][0], [n for _, ns in parts for n in ns], [y for ws in ys[1:] for y in ws]
    else:
        run = (lambda d: run_tflm(d, x)) if runtime == "tflm" else (lambda d: run_litert(d, x, runtime))
        p, names = probe(data)
        values, plain = run(p), run(data)[0]
        if not np.array_equal(plain, values[0]):
            print("warning: the probe changes the runtime's final output; per-operator results may mislead")
    out = {n: y.reshape(len(x), *y.shape[2:]) if y.shape[1:2] == (1,) else y for n, y in zip(names, values)}
    out[""] = plain  # the unmodified file's first output
    return out


# -------------------------------------------------------------------------- the comparison


def _compare(got, want) -> tuple[int, int, int]:
    g = np.asarray(got).astype(np.int64).reshape(want.shape)  # (a converted tensor may be reshaped)
    w = want.astype(np.int64)
    bad = g != w
    return int(bad.sum()), int(w.size), int(np.abs(g - w).max()) if bad.any() else 0


def _describe(op) -> str:
    ins = ", ".join(f"{s}" for _, s in op["inputs"])
    outs = ", ".join(f"{s}" for _, s in op["outputs"])
    return f"#{op['index']} {op['kind']} in {ins} -> out {outs}" + (f" [{op['options']}]" if op["options"] else "")


def diff(path: str, runtime: str, x: np.ndarray, show_all: bool, xmos_python: str) -> int:
    """Print the per-operator comparison; returns the number of operators with differences."""
    import hwjax.tflite as T

    with open(path, "rb") as f:
        data = f.read()
    original_xs3 = runtime == "xs3" and ".xc." not in os.path.basename(path)
    ref_data = converted(path, xmos_python) if original_xs3 else data
    want = oracle(ref_data, x, runtime, xmos_python)
    y, inter = T.load(path).run(x, runtime=runtime, intermediates=True)
    ops = operators(ref_data)
    bad_ops = 0
    if original_xs3:
        # pair each original operator output with the converted tensor of the same name, else
        # with the next converted operator output of its size (skipping the converted file's
        # reshapes and no-ops, unless the original operator is a reshape)
        mine = [(op, n, int(np.prod(s))) for op in operators(data) for n, s in op["outputs"]]
        theirs = [(op, n, int(np.prod(s))) for op in ops for n, s in op["outputs"]]
        names = {tn: k for k, (_, tn, _) in enumerate(theirs)}
        j = 0
        for op, n, s in mine:
            reshape = op["kind"] in RESHAPES
            k = names.get(n)
            if k is None or theirs[k][2] != s:
                k = next(
                    (
                        k
                        for k in range(j, len(theirs))
                        if theirs[k][2] == s and (reshape or theirs[k][0]["kind"] not in RESHAPES)
                    ),
                    None,
                )
            if k is None:
                if show_all or not reshape:
                    print(f"{_describe(op)}: no converted tensor of {s} values to compare with")
                continue
            j = k + 1
            top, tn, _ = theirs[k]
            nb, size, mx = _compare(inter[n], want[tn])
            line = f"{_describe(op)}\n    ~ converted {_describe(top)}: {nb} of {size} differ, max |diff| {mx}"
            if nb or show_all:
                print(line)
            if nb:
                bad_ops += 1
                if not show_all:
                    break
    else:
        for op in ops:
            for n, _ in op["outputs"]:
                if n not in inter:
                    print(f"{_describe(op)}: hwjax has no tensor {n!r}")
                    continue
                nb, size, mx = _compare(inter[n], want[n])
                if nb or show_all:
                    print(f"{_describe(op)}: {nb} of {size} differ, max |diff| {mx}")
                if nb:
                    bad_ops += 1
            if bad_ops and not show_all:
                break
    y = y[0] if isinstance(y, tuple) else y
    nb, size, mx = _compare(y, want[""])
    print(f"final output: {nb} of {size} differ, max |diff| {mx}; operators with differences: {bad_ops or 'none'}")
    return bad_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("runtime", choices=[*RESOLVERS, "tflm", "xs3"])
    ap.add_argument("--random", type=int, default=0, help="N seeded uniform random inputs instead of NAME.npz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="every operator, not only up to the first difference")
    ap.add_argument("--xmos-python", default=DEFAULT_XMOS)
    a = ap.parse_args()
    if a.random:
        import hwjax.tflite as T

        info = T.load(a.model).inputs[0]
        rng = np.random.default_rng(a.seed)
        shape = (a.random, *info.shape[1:])
        if info.dtype == "float32":
            sys.exit("--random makes integer inputs only")
        lo, hi = (-128, 127) if info.dtype == "int8" else (0, 255)
        x = rng.integers(lo, hi + 1, shape).astype(np.int8 if info.dtype == "int8" else np.uint8)
    else:
        base = a.model[: -len(".tflite")].removesuffix(".xc")
        x = np.load(base + ".npz")["x"]
    diff(a.model, a.runtime, x, a.all, a.xmos_python)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "_host":
        host_child(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "_xformer":
        xformer_child(*sys.argv[2:])
    else:
        main()
