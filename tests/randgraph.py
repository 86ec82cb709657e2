"""Random int8 TFLite graphs (Csmith-style) and the oracles that run them.

This module is deliberately independent of hwjax: it builds ``.tflite`` files itself
(flatbuffer object API of ``ai_edge_litert.schema_py_generated``) and runs them in the
real runtimes, so that the differential tests compare hwjax with something hwjax did not
write.

The three parts
---------------
* :func:`generate` ``(seed) -> spec``: a random graph as a plain dict (JSON-able and
  printable, see "The spec" below). Same seed, same spec.
* :func:`build` ``(spec) -> bytes``: the ``.tflite`` file of a spec (the weights are drawn
  from the seeds in the spec, so the spec alone reproduces the file).
* :func:`run_oracle` / :func:`run_oracles`: the file run by LiteRT (``"reference"``:
  BUILTIN_REF, ``"optimized"``: BUILTIN_WITHOUT_DEFAULT_DELEGATES, ``"xnnpack"``: AUTO, i.e.
  the default XNNPACK delegate; ``num_threads=1``, one example per invoke) and by the
  official TensorFlow Lite Micro interpreter (``"tflm"``). A runtime that raises at load,
  allocation or invoke gives a :class:`Refused` (with its message) instead of an array.
  :class:`OracleProcess` runs them in a child process, so that a runtime that crashes
  (LiteRT's XNNPACK delegate aborts on some graphs, TFLM segfaults on others) is a
  ``Refused("crashed ...")`` of that runtime only.
* :func:`minimise` ``(spec, fails) -> spec``: greedy delta debugging on the spec (drop ops,
  cut the graph short, shrink shapes, channels and kernels, simplify attributes and
  quantisation) for as long as ``fails(candidate)`` stays true.

What the generator covers
-------------------------
Graphs of 1-4 ops (plus residual branches) on an int8 input of at most ~2000 elements,
``[1, H, W, C]`` (H or W may be 1) or ``[1, N]``:

* CONV_2D and DEPTHWISE_CONV_2D: any kernel shape (kx1, 1xk, square), strides 1-3,
  dilation 1-3, depth multiplier 1-3, SAME/VALID, odd channel counts, a bias (3% of the
  CONV_2D have none: LiteRT refuses those, TFLM runs them; a DEPTHWISE_CONV_2D always has
  one: TFLM crashes without);
  weights symmetric int8 (zero point 0), one scale per output channel (per-channel) or one
  scale (per-tensor); int32 biases at scale ``s_in * s_w[c]``.
* FULLY_CONNECTED on a 2-D input, and on a 4-D input without a RESHAPE (``keep_num_dims``
  false: weights over all of ``H*W*C``; true: weights over C, output ``[1, H, W, units]``),
  per-tensor and per-channel, with or without bias.
* ADD and MUL of two tensors of one shape (residual branches), or of a tensor and an int8
  constant broadcast over the channels (shape ``[C]``, ``[1, 1, 1, C]``) or a scalar;
  fused NONE/RELU/RELU6/RELU_N1_TO_1.
* MAX_POOL_2D / AVERAGE_POOL_2D (also global windows), MEAN (axes [1, 2] mostly, keep_dims
  both ways), PAD, CONCATENATION (channels, or a tensor with itself on any axis), RESHAPE
  (flatten, ``[1, H*W, C]``, ``[1, 1, 1, N]``), SOFTMAX (beta 1 mostly), LOGISTIC, TANH with
  the output quantisation converters use (softmax/logistic 1/256 zp -128, tanh 1/128 zp 0).
* Chains and residual branches (``x + f(x)``, ``x * f(x)``, ``concat(x, f(x))``), and
  SiLU as converters write it (``x * LOGISTIC(x)``).

Quantisation is derived the way a converter's calibration would see it: every tensor
carries a rough estimate (mean, standard deviation) of its real values, each op's output
range is a few standard deviations of its accumulator, and fused activations clip that
range as converters do (RELU: ``[0, hi]``, zp -128; RELU6: usually exactly ``[0, 6]``, i.e.
scale 6/255 zp -128; RELU_N1_TO_1: ``[-1, 1]``). Ops that need equal input and output
quantisation (pools, PAD, RESHAPE, CONCATENATION inputs) get it. About one scale in eight
is rounded to a power of two (as quantisation-aware training and fixed-range ops make
them: requantisation multipliers then are exact powers of two, which exposes rounding of
ties); about one MUL or per-tensor conv/FC in ten has the output scale
``s_in * s_w * 2^k`` (multiplier next to a power of two). About one op in twelve has an
extreme output quantisation instead (scale off by 2^4-2^7, zero point at a rail), and
about one conv/FC in twenty an extreme bias (up to 2^26).

The spec
--------
``{"seed": s, "input": {"shape": [1, H, W, C], "scale": f, "zp": z}, "ops": [...],
"output": t}``. Tensor 0 is the input; op ``i`` writes tensor ``i + 1``; ``"in"`` lists an
op's tensor operands, ``"out": [scale, zp]`` its output quantisation (``None``: the
first input's). Weights are ``{"seed", "max", "scale", "per_channel", "spread"}``: int8
values uniform in ``[-max, max]``, per-channel scales ``scale * 2**U(-spread, spread)``;
biases ``{"seed", "max"}``: int32 uniform in ``[-max, max]``; an ADD/MUL constant
``{"shape": "c" | "1c" | "scalar", "seed", "scale", "zp"}`` (optional ``"range": [lo, hi]``
of its int8 values).
Only the ops the output depends on are written to the file.

Reproducing a seed
------------------
::

    import tests.randgraph as rg
    spec = rg.generate(1234); print(rg.spec_repr(spec))
    model = rg.build(spec); x = rg.inputs(spec)
    want = rg.run_oracle(model, x, "optimized")
    got = hwjax.tflite.load(model).run(x, runtime="optimized")

``.venv/bin/python -m tests.randgraph 1234`` prints the spec and every runtime's result.
"""

from __future__ import annotations

import copy
import json
import math
import sys

import numpy as np

RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")
_RESOLVERS = {"reference": "BUILTIN_REF", "optimized": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "xnnpack": "AUTO"}
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")  # schema codes 0..3
_SAME_QUANT_OPS = ("MAX_POOL_2D", "AVERAGE_POOL_2D", "PAD", "RESHAPE", "CONCATENATION")
MAX_ELEMENTS = 4096  # largest tensor the generator makes


class SpecError(ValueError):
    """A spec that does not describe a valid graph (shapes that do not fit)."""


def _f32(x: float) -> float:
    """``x`` rounded to float32 (what the file stores), as a Python float."""
    return float(np.float32(x))


# =============================================================================== shapes
def _conv_out(n: int, k: int, s: int, d: int, padding: str) -> int:
    if padding == "SAME":
        return -(-n // s)
    eff = (k - 1) * d + 1
    if n < eff:
        raise SpecError(f"VALID window {eff} larger than input {n}")
    return (n - eff) // s + 1


def _reshape_target(shape, to: str):
    n = int(np.prod(shape[1:]))
    if to == "flat":
        return [1, n]
    if to == "rows":
        if len(shape) != 4:
            raise SpecError("reshape 'rows' needs a 4-D input")
        return [1, shape[1] * shape[2], shape[3]]
    if to == "4d":
        return [1, 1, 1, n]
    raise SpecError(f"unknown reshape {to!r}")


def _const_shape(kind: str, c: int):
    return {"c": [c], "1c": [1, 1, 1, c], "scalar": [1]}[kind]


def shapes(spec) -> list[list[int]]:
    """The shape of every tensor (index 0: the input, ``i + 1``: op ``i``'s output).

    Raises :class:`SpecError` where the ops' attributes do not fit their inputs."""
    out = [list(spec["input"]["shape"])]
    for i, op in enumerate(spec["ops"]):
        ins = op["in"]
        if not ins or any(not (0 <= t <= i) for t in ins):
            raise SpecError(f"op {i} reads a tensor that is not written before it: {ins}")
        x = out[ins[0]]
        k = op["op"]
        if k in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D"):
            if len(x) != 4:
                raise SpecError(f"op {i} {k} needs a 4-D input, got {x}")
            kh, kw = op["kernel"]
            sh, sw = op["stride"]
            dh, dw = op.get("dilation", [1, 1])
            ho = _conv_out(x[1], kh, sh, dh, op["padding"])
            wo = _conv_out(x[2], kw, sw, dw, op["padding"])
            c = op["out_ch"] if k == "CONV_2D" else x[3] * op["mult"] if k == "DEPTHWISE_CONV_2D" else x[3]
            y = [1, ho, wo, c]
        elif k == "FULLY_CONNECTED":
            y = x[:-1] + [op["units"]] if op["keep_num_dims"] else [1, op["units"]]
        elif k in ("ADD", "MUL"):
            if len(ins) == 2:
                if out[ins[1]] != x:
                    raise SpecError(f"op {i} {k} operands {x} and {out[ins[1]]} differ")
            elif len(ins) != 1 or "const" not in op:
                raise SpecError(f"op {i} {k} needs two tensors or a constant")
            elif op["const"]["shape"] == "1c" and len(x) != 4:
                raise SpecError(f"op {i} {k}: [1, 1, 1, C] constant on a {len(x)}-D input")
            y = list(x)
        elif k == "MEAN":
            axes = op["axes"]
            if any(not (1 <= a < len(x)) for a in axes):
                raise SpecError(f"op {i} MEAN axes {axes} on {x}")
            y = (
                [1 if a in axes else n for a, n in enumerate(x)]
                if op["keep_dims"]
                else [n for a, n in enumerate(x) if a not in axes]
            )
        elif k == "PAD":
            if len(op["pads"]) != len(x) or op["pads"][0] != [0, 0]:
                raise SpecError(f"op {i} PAD {op['pads']} on {x}")
            y = [n + a + b for n, (a, b) in zip(x, op["pads"])]
        elif k == "CONCATENATION":
            ax = op["axis"] % len(x)
            if ax == 0:
                raise SpecError("concatenation on the batch axis")
            for t in ins[1:]:
                z = out[t]
                if len(z) != len(x) or any(a != b for j, (a, b) in enumerate(zip(x, z)) if j != ax):
                    raise SpecError(f"op {i} CONCATENATION {x} and {z} on axis {ax}")
            y = list(x)
            y[ax] = sum(out[t][ax] for t in ins)
        elif k == "RESHAPE":
            y = _reshape_target(x, op["to"])
        elif k in ("SOFTMAX", "LOGISTIC", "TANH"):
            y = list(x)
        else:
            raise SpecError(f"unknown op {k!r}")
        if any(n < 1 for n in y) or int(np.prod(y)) > 4 * MAX_ELEMENTS:
            raise SpecError(f"op {i} {k} output shape {y}")
        out.append(y)
    if not 1 <= spec["output"] <= len(spec["ops"]):
        raise SpecError(f"output {spec['output']} is not an op's output")
    return out


def quants(spec) -> list[tuple[float, int]]:
    """The (scale, zero point) of every tensor (``None`` outputs resolved)."""
    q = [(spec["input"]["scale"], spec["input"]["zp"])]
    for op in spec["ops"]:
        q.append(q[op["in"][0]] if op.get("out") is None else (op["out"][0], op["out"][1]))
    return q


def live_ops(spec) -> list[int]:
    """Indices of the ops the output depends on, in order."""
    need = {spec["output"]}
    for i in range(len(spec["ops"]) - 1, -1, -1):
        if i + 1 in need:
            need |= set(spec["ops"][i]["in"])
    return [i for i in range(len(spec["ops"])) if i + 1 in need]


# ============================================================================ constants
def weight_values(w: dict, shape) -> np.ndarray:
    """The int8 values of a weights/constant description (uniform in [-max, max])."""
    m = int(w["max"])
    return np.random.default_rng([int(w["seed"]), 0]).integers(-m, m + 1, size=shape).astype(np.int8)


def weight_scales(w: dict, n: int) -> list[float]:
    """Per-channel scales (``n`` of them) or the one per-tensor scale, as float32 values."""
    if not w["per_channel"]:
        return [_f32(w["scale"])]
    u = np.random.default_rng([int(w["seed"]), 1]).uniform(-1.0, 1.0, size=n)
    return [_f32(w["scale"] * 2.0 ** (w["spread"] * v)) for v in u]


def bias_values(b: dict, n: int) -> np.ndarray:
    m = int(b["max"])
    return np.random.default_rng([int(b["seed"]), 2]).integers(-m, m + 1, size=n).astype(np.int32)


def const_values(c: dict, n: int) -> np.ndarray:
    lo, hi = c.get("range", [-128, 127])
    return np.random.default_rng([int(c["seed"]), 3]).integers(lo, hi + 1, size=n).astype(np.int8)


# ================================================================================ build
def build(spec) -> bytes:
    """The ``.tflite`` file (bytes) of a spec: one subgraph, int8 input and output."""
    import flatbuffers
    import ai_edge_litert.schema_py_generated as s

    shp = shapes(spec)
    qs = quants(spec)
    buffers = [s.BufferT()]
    tensors = []
    codes: dict[int, int] = {}
    code_list = []
    operators = []

    def buffer(arr) -> int:
        b = s.BufferT()
        b.data = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)
        buffers.append(b)
        return len(buffers) - 1

    def tensor(shape, dtype, name, scales=None, zps=None, axis=0, data=None) -> int:
        t = s.TensorT()
        t.shape = np.asarray(shape, np.int32)
        t.type = {"int8": s.TensorType.INT8, "int32": s.TensorType.INT32}[dtype]
        t.name = name
        t.buffer = 0 if data is None else buffer(data)
        if scales is not None:
            q = s.QuantizationParametersT()
            q.scale = np.asarray(scales, np.float32)
            q.zeroPoint = np.asarray(zps, np.int64)
            q.quantizedDimension = axis
            t.quantization = q
        tensors.append(t)
        return len(tensors) - 1

    def operator(name: str, version: int, ins, outs, opt_type=None, opt=None):
        code = getattr(s.BuiltinOperator, name)
        if code not in codes:
            oc = s.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = version
            codes[code] = len(code_list)
            code_list.append(oc)
        o = s.OperatorT()
        o.opcodeIndex = codes[code]
        o.inputs = np.asarray(ins, np.int32)
        o.outputs = np.asarray(outs, np.int32)
        if opt is not None:
            o.builtinOptionsType = getattr(s.BuiltinOptions, opt_type)
            o.builtinOptions = opt
        operators.append(o)

    tid = {0: tensor(shp[0], "int8", "input", [qs[0][0]], [qs[0][1]])}
    for i in live_ops(spec):
        op = spec["ops"][i]
        k = op["op"]
        x = shp[op["in"][0]]
        sx, zx = qs[op["in"][0]]
        sy, zy = qs[i + 1]
        ins = [tid[t] for t in op["in"]]
        name = f"op{i}_{k.lower()}"
        act = getattr(s.ActivationFunctionType, op.get("act", "NONE"))
        if k in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            if k == "CONV_2D":
                n_out = op["out_ch"]
                wshape, axis = [n_out, op["kernel"][0], op["kernel"][1], x[3]], 0
            elif k == "DEPTHWISE_CONV_2D":
                n_out = x[3] * op["mult"]
                wshape, axis = [1, op["kernel"][0], op["kernel"][1], n_out], 3
            else:
                n_out = op["units"]
                depth = x[-1] if op["keep_num_dims"] else int(np.prod(x[1:]))
                wshape, axis = [n_out, depth], 0
            w = op["w"]
            ws = weight_scales(w, n_out)
            ins.append(tensor(wshape, "int8", name + "/weights", ws, [0] * len(ws), axis, weight_values(w, wshape)))
            if op.get("bias") is not None:
                bs = [_f32(float(np.float32(sx)) * v) for v in ws]
                ins.append(
                    tensor([n_out], "int32", name + "/bias", bs, [0] * len(bs), 0, bias_values(op["bias"], n_out))
                )
            else:
                ins.append(-1)
            if k == "CONV_2D":
                opt = s.Conv2DOptionsT()
                opt.padding = getattr(s.Padding, op["padding"])
                opt.strideH, opt.strideW = op["stride"]
                opt.dilationHFactor, opt.dilationWFactor = op["dilation"]
                opt.fusedActivationFunction = act
                opt_type, version = "Conv2DOptions", 3
            elif k == "DEPTHWISE_CONV_2D":
                opt = s.DepthwiseConv2DOptionsT()
                opt.padding = getattr(s.Padding, op["padding"])
                opt.strideH, opt.strideW = op["stride"]
                opt.dilationHFactor, opt.dilationWFactor = op["dilation"]
                opt.depthMultiplier = op["mult"]
                opt.fusedActivationFunction = act
                opt_type, version = "DepthwiseConv2DOptions", 3
            else:
                opt = s.FullyConnectedOptionsT()
                opt.fusedActivationFunction = act
                opt.keepNumDims = bool(op["keep_num_dims"])
                opt_type, version = "FullyConnectedOptions", 5 if op["keep_num_dims"] else 4
        elif k in ("ADD", "MUL"):
            if len(op["in"]) == 1:
                c = op["const"]
                cshape = _const_shape(c["shape"], x[-1])
                ins.append(
                    tensor(
                        cshape,
                        "int8",
                        name + "/const",
                        [c["scale"]],
                        [c["zp"]],
                        0,
                        const_values(c, int(np.prod(cshape))),
                    )
                )
            opt = s.AddOptionsT() if k == "ADD" else s.MulOptionsT()
            opt.fusedActivationFunction = act
            opt_type, version = ("AddOptions" if k == "ADD" else "MulOptions"), 2
        elif k in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            opt = s.Pool2DOptionsT()
            opt.padding = getattr(s.Padding, op["padding"])
            opt.strideH, opt.strideW = op["stride"]
            opt.filterHeight, opt.filterWidth = op["kernel"]
            opt.fusedActivationFunction = act
            opt_type, version = "Pool2DOptions", 2
        elif k == "MEAN":
            ins.append(tensor([len(op["axes"])], "int32", name + "/axes", data=np.asarray(op["axes"], np.int32)))
            opt = s.ReducerOptionsT()
            opt.keepDims = bool(op["keep_dims"])
            opt_type, version = "ReducerOptions", 2
        elif k == "PAD":
            ins.append(tensor([len(x), 2], "int32", name + "/paddings", data=np.asarray(op["pads"], np.int32)))
            opt_type, opt, version = "PadOptions", s.PadOptionsT(), 2
        elif k == "CONCATENATION":
            opt = s.ConcatenationOptionsT()
            opt.axis = op["axis"]
            opt.fusedActivationFunction = act
            opt_type, version = "ConcatenationOptions", 2
        elif k == "RESHAPE":
            y = shp[i + 1]
            ins.append(tensor([len(y)], "int32", name + "/shape", data=np.asarray(y, np.int32)))
            opt = s.ReshapeOptionsT()
            opt.newShape = np.asarray(y, np.int32)
            opt_type, version = "ReshapeOptions", 1
        elif k == "SOFTMAX":
            opt = s.SoftmaxOptionsT()
            opt.beta = op.get("beta", 1.0)
            opt_type, version = "SoftmaxOptions", 2
        else:  # LOGISTIC, TANH
            opt_type, opt, version = None, None, 2
        tid[i + 1] = tensor(shp[i + 1], "int8", name, [sy], [zy])
        operator(k, version, ins, [tid[i + 1]], opt_type, opt)

    sg = s.SubGraphT()
    sg.tensors = tensors
    sg.operators = operators
    sg.inputs = np.asarray([tid[0]], np.int32)
    sg.outputs = np.asarray([tid[spec["output"]]], np.int32)
    sg.name = "main"
    m = s.ModelT()
    m.version = 3
    m.description = "tests/randgraph.py"
    m.operatorCodes = code_list
    m.subgraphs = [sg]
    m.buffers = buffers
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


# =============================================================================== inputs
def inputs(spec, n_random: int = 5) -> np.ndarray:
    """The test batch of a spec: all -128, all 127, all the input zero point (real 0), then
    ``n_random`` uniform int8 examples (seeded by the spec's seed), shape ``(batch, *shape[1:])``."""
    per = tuple(spec["input"]["shape"][1:])
    rng = np.random.default_rng([int(spec.get("seed", 0)), 99])
    fixed = [np.full(per, v, np.int8) for v in (-128, 127, spec["input"]["zp"])]
    rand = [rng.integers(-128, 128, size=per).astype(np.int8) for _ in range(n_random)]
    return np.stack(fixed + rand)


# =============================================================================== oracles
class Refused:
    """A runtime that would not run the model (the exception it raised)."""

    def __init__(self, message: str):
        self.message = message

    def __repr__(self):
        return f"Refused({self.message!r})"


def run_oracle(model: bytes, x: np.ndarray, runtime: str):
    """``model`` run by ``runtime`` on every example of ``x`` (one invoke each, batch-1
    tensors): an int8 array ``(batch, *out_shape[1:])``, or a :class:`Refused`."""
    try:
        if runtime == "tflm":
            from tflite_micro.python.tflite_micro import runtime as tflm

            it = tflm.Interpreter.from_bytes(model, arena_size=max(1 << 20, 16 * len(model)))
            ys = []
            for xi in x:
                it.set_input(np.ascontiguousarray(xi[None]), 0)
                it.invoke()
                ys.append(np.array(it.get_output(0))[0])
            return np.stack(ys)
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        it = Interpreter(
            model_content=model,
            num_threads=1,
            experimental_op_resolver_type=getattr(OpResolverType, _RESOLVERS[runtime]),
        )
        it.allocate_tensors()
        i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
        ys = []
        for xi in x:
            it.set_tensor(i, np.ascontiguousarray(xi[None]))
            it.invoke()
            ys.append(it.get_tensor(o)[0].copy())
        return np.stack(ys)
    except Exception as e:  # any refusal of the runtime is recorded
        return Refused(f"{type(e).__name__}: {str(e).strip()[:300]}")


def run_oracles(model: bytes, x: np.ndarray, runtimes=RUNTIMES) -> dict:
    """``{runtime: result}`` of :func:`run_oracle` in this process (see :class:`OracleProcess`
    for a crash-safe way)."""
    return {r: run_oracle(model, x, r) for r in runtimes}


def _serve(conn):
    """The child of :class:`OracleProcess`: answers ``(model, x, runtimes)`` requests."""
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        model, x, runtimes = req
        conn.send({r: run_oracle(model, x, r) for r in runtimes})


class OracleProcess:
    """The oracles in a child process, so that a runtime that crashes (TFLM segfaults on
    some models) is recorded as ``Refused("crashed ...")`` instead of killing the caller.

    The child is started on first use (``spawn``: no fork of a process that holds JAX's
    threads) and again after a crash; :meth:`close` (or ``with``) ends it."""

    def __init__(self):
        self._proc = None
        self._conn = None

    def _start(self):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def run(self, model: bytes, x: np.ndarray, runtimes=RUNTIMES) -> dict:
        """``{runtime: array or Refused}``; a crash runs each runtime again in a fresh child
        so that only the ones that crash are refused."""
        res = self._ask(model, x, tuple(runtimes))
        if res is not None:
            return res
        out = {}
        for r in runtimes:
            one = self._ask(model, x, (r,))
            out[r] = one[r] if one is not None else Refused(f"crashed (exit code {self._last_exit})")
        return out

    def _ask(self, model, x, runtimes):
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((model, np.asarray(x), runtimes))
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(5)
            self._last_exit = self._proc.exitcode
            self._proc = None
            return None

    def close(self):
        if self._proc is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.terminate()
            self._proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ============================================================================= generator
_OP_WEIGHTS = {
    "CONV_2D": 20,
    "DEPTHWISE_CONV_2D": 16,
    "FULLY_CONNECTED": 9,
    "ADD": 7,
    "MUL": 4,
    "MAX_POOL_2D": 5,
    "AVERAGE_POOL_2D": 5,
    "MEAN": 4,
    "PAD": 4,
    "RESHAPE": 3,
    "SOFTMAX": 3,
    "LOGISTIC": 3,
    "TANH": 3,
    "RESIDUAL": 8,
    "SWISH": 3,
    "CONCATENATION": 2,
}
_NEEDS_4D = {"CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D", "RESIDUAL"}


class _Gen:
    """Builds one spec; keeps per tensor its shape, quantisation and a (mean, std) estimate
    of its real values."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.spec = {"seed": seed, "input": None, "ops": [], "output": None}
        self.shape: list[list[int]] = []
        self.quant: list[tuple[float, int]] = []
        self.stats: list[tuple[float, float]] = []
        self._sub = 0

    # ---------------------------------------------------------------- helpers
    def r(self) -> float:
        return float(self.rng.random())

    def pick(self, items, p=None):
        return items[int(self.rng.choice(len(items), p=p))]

    def subseed(self) -> int:
        self._sub += 1
        return int(self.seed) * 1000 + self._sub

    def add(self, op: dict, shape, quant, stats) -> int:
        self.spec["ops"].append(op)
        self.shape.append(list(shape))
        self.quant.append(quant)
        self.stats.append(stats)
        return len(self.shape) - 1

    def _post_stats(self, m, sd, act, quant):
        """(mean, std) after the fused activation and the output's int8 range."""
        s, z = quant
        lo, hi = s * (-128 - z), s * (127 - z)
        a_lo, a_hi = {
            "NONE": (-math.inf, math.inf),
            "RELU": (0.0, math.inf),
            "RELU6": (0.0, 6.0),
            "RELU_N1_TO_1": (-1.0, 1.0),
        }[act]
        v = self.rng.normal(m, max(sd, 1e-12), 512)
        v = np.clip(np.clip(v, a_lo, a_hi), lo, hi)
        return float(v.mean()), float(max(v.std(), 1e-9))

    def out_quant(self, m, sd, act="NONE") -> tuple[float, int]:
        """A converter-like output quantisation for values ~N(m, sd) after ``act``."""
        sd = max(sd, 1e-9)
        k = self.rng.uniform(2.0, 4.0)
        lo, hi = m - k * sd, m + k * sd
        if act == "RELU":
            lo, hi = 0.0, max(hi, 1e-6)
        elif act == "RELU6":
            lo, hi = 0.0, 6.0 if self.r() < 0.7 else min(max(hi, 1e-3), 6.0)
        elif act == "RELU_N1_TO_1":
            lo, hi = (-1.0, 1.0) if self.r() < 0.8 else (max(lo, -1.0), min(hi, 1.0))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi - lo < 1e-6:
            hi = lo + 1e-6
        scale = (hi - lo) / 255.0
        if act == "NONE":
            scale *= 2.0 ** self.rng.uniform(-0.5, 0.5)
        scale = self.nice(scale)
        zp = int(np.clip(round(-128 - lo / scale), -128, 127))
        if self.r() < 0.08:  # an extreme case
            if self.r() < 0.6:
                scale *= 2.0 ** (float(self.pick([-7, -5, -4, 4, 5, 7])))
            else:
                zp = int(self.pick([-128, 127, 0]))
        return _f32(scale), zp

    def nice(self, scale: float, p: float = 0.12) -> float:
        """Sometimes the nearest power of two instead (quantisation-aware training and
        fixed-range ops give such scales; products of them make dyadic multipliers)."""
        return 2.0 ** round(math.log2(scale)) if self.r() < p else scale

    def product_scale(self, q, s_acc: float, p: float = 0.1):
        """Sometimes an output scale of ``s_acc * 2^k`` (the accumulator's scale, as a few
        converters give a MUL; float32-rounded, the multiplier lands next to a power of
        two), k from the chosen scale; else ``q``."""
        if self.r() >= p or s_acc <= 0:
            return q
        k = round(math.log2(q[0] / s_acc))
        return (_f32(s_acc * 2.0**k), q[1])

    def act(self, p_none=0.5) -> str:
        return "NONE" if self.r() < p_none else self.pick(["RELU", "RELU6", "RELU_N1_TO_1"], p=[0.45, 0.4, 0.15])

    def weights(self, n_max=127):
        per_channel = self.r() < 0.65
        w = {
            "seed": self.subseed(),
            "max": int(self.pick([127, 127, 64, 20, 3])) if n_max == 127 else n_max,
            "scale": _f32(self.nice(2.0 ** self.rng.uniform(-10, -3))),
            "per_channel": per_channel,
            "spread": float(self.pick([0.5, 1.0, 2.0, 4.0])) if per_channel else 0.0,
        }
        return w

    @staticmethod
    def w_var(w) -> float:
        """Variance of one real weight (values uniform in [-max, max], scales ~ scale)."""
        m, a = w["max"], 2.0 * w["spread"] * math.log(2.0)
        mean_sq = (math.exp(a) - math.exp(-a)) / (2 * a) if w["per_channel"] and a > 0 else 1.0  # E[2^(2 spread U)]
        return w["scale"] ** 2 * mean_sq * m * (m + 1) / 3.0

    # ---------------------------------------------------------------- input
    def make_input(self):
        if self.r() < 0.15:
            shape = [1, int(self.rng.integers(1, 200))]
        else:

            def dim():
                return 1 if self.r() < 0.15 else int(self.rng.integers(2, 13))

            h, w = dim(), dim()
            c = int(self.pick([1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17]))
            while h * w * c > 2048:
                h, w = max(1, h // 2), max(1, w // 2)
            shape = [1, h, w, c]
        zp = int(self.pick([-128, 0, int(self.rng.integers(-128, 128))], p=[0.4, 0.3, 0.3]))
        scale = _f32(self.nice(2.0 ** self.rng.uniform(-9, 0), 0.15))
        self.spec["input"] = {"shape": shape, "scale": scale, "zp": zp}
        self.shape.append(shape)
        self.quant.append((scale, zp))
        self.stats.append((scale * (-0.5 - zp), scale * 73.9))

    # ---------------------------------------------------------------- ops
    def linear(self, kind: str, t: int, *, same_spatial=False, out_ch=None, force_quant=None) -> int | None:
        x = self.shape[t]
        m_in, sd_in = self.stats[t]
        if kind == "FULLY_CONNECTED":
            keep = len(x) > 2 and self.r() < 0.5 or len(x) == 2 and self.r() < 0.2
            depth = x[-1] if keep else int(np.prod(x[1:]))
            units = int(self.pick([1, 2, 3, 5, 8, 10, 16, 31]))
            op = {"op": kind, "in": [t], "units": units, "keep_num_dims": keep}
            y = x[:-1] + [units] if keep else [1, units]
            fan = depth
        else:

            def k():
                return int(self.pick([1, 2, 3, 3, 3, 4, 5, 7]))

            if same_spatial:
                kh, kw = self.pick([(1, 1), (3, 3), (1, 3), (3, 1)])
                stride, dil, pad = [1, 1], [1, 1], "SAME"
            else:
                kh, kw = k(), k()
                if self.r() < 0.2:
                    kh, kw = (kh, 1) if self.r() < 0.5 else (1, kw)
                stride = [int(self.pick([1, 1, 2, 3])), int(self.pick([1, 1, 2, 3]))]
                if self.r() < 0.5:
                    stride = [stride[0], stride[0]]
                dil = [1, 1]
                if self.r() < 0.2:
                    stride = [1, 1]
                    dil = [int(self.pick([1, 2, 3])), int(self.pick([1, 2, 3]))]
                pad = "SAME" if self.r() < 0.6 else "VALID"
                # a VALID window must fit; fall back to SAME
                if pad == "VALID" and ((kh - 1) * dil[0] + 1 > x[1] or (kw - 1) * dil[1] + 1 > x[2]):
                    pad = "SAME"
            op = {"op": kind, "in": [t]}
            if kind == "CONV_2D":
                oc = out_ch if out_ch is not None else int(self.pick([1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24]))
                op["out_ch"] = oc
                fan = kh * kw * x[3]
            else:
                mult = 1 if (same_spatial or self.r() < 0.7) else int(self.pick([2, 3]))
                op["mult"] = mult
                oc = x[3] * mult
                fan = kh * kw
            op.update({"kernel": [kh, kw], "stride": stride, "dilation": dil, "padding": pad})
            y = [1, _conv_out(x[1], kh, stride[0], dil[0], pad), _conv_out(x[2], kw, stride[1], dil[1], pad), oc]
        if int(np.prod(y)) > MAX_ELEMENTS:
            return None
        w = self.weights()
        op["w"] = w
        var = fan * (sd_in**2 + m_in**2) * self.w_var(w)
        # converters always give convolutions a bias (LiteRT refuses int8 CONV_2D and
        # DEPTHWISE_CONV_2D without one, TFLM crashes on a depthwise one without)
        if kind == "DEPTHWISE_CONV_2D" or self.r() < (0.97 if kind == "CONV_2D" else 0.85):
            s_acc = self.quant[t][0] * w["scale"]
            bmax = int(min(2**24, max(1, math.sqrt(var) / s_acc * self.pick([0.1, 0.5, 1.0, 2.0]))))
            if self.r() < 0.05:
                bmax = 2**26  # an extreme bias
            op["bias"] = {"seed": self.subseed(), "max": bmax}
            var += (bmax * s_acc) ** 2 / 3.0
        else:
            op["bias"] = None
        act = "NONE" if force_quant is not None else self.act()
        op["act"] = act
        q = force_quant if force_quant is not None else self.out_quant(0.0, math.sqrt(var), act)
        if force_quant is None and not w["per_channel"]:
            q = self.product_scale(q, self.quant[t][0] * w["scale"])
        op["out"] = list(q)
        return self.add(op, y, q, self._post_stats(0.0, math.sqrt(var), act, q))

    def binary(self, kind: str, t: int, u: int | None) -> int:
        x = self.shape[t]
        (ma, sa) = self.stats[t]
        op = {"op": kind, "in": [t]}
        if u is None:
            c_kind = (
                self.pick(["c", "1c", "scalar"], p=[0.6, 0.25, 0.15])
                if len(x) == 4
                else self.pick(["c", "scalar"], p=[0.8, 0.2])
            )
            cz = int(self.pick([0, -128, int(self.rng.integers(-128, 128))]))
            if kind == "ADD":
                cs = _f32(self.nice(max(sa, 1e-6) * 2.0 ** self.rng.uniform(-9, -5)))
            else:
                cs = _f32(self.nice(2.0 ** self.rng.uniform(-9, -5)))
            op["const"] = {"shape": c_kind, "seed": self.subseed(), "scale": cs, "zp": cz}
            mb, sb = cs * (-0.5 - cz), cs * 73.9
        else:
            op["in"].append(u)
            mb, sb = self.stats[u]
        if kind == "ADD":
            m, sd = ma + mb, math.sqrt(sa**2 + sb**2)
        else:
            m = ma * mb
            sd = math.sqrt(max((sa**2 + ma**2) * (sb**2 + mb**2) - ma**2 * mb**2, 1e-18))
        act = self.act(0.6)
        q = self.out_quant(m, sd, act)
        if kind == "MUL":
            q = self.product_scale(q, self.quant[t][0] * (op["const"]["scale"] if u is None else self.quant[u][0]))
        op["act"], op["out"] = act, list(q)
        return self.add(op, x, q, self._post_stats(m, sd, act, q))

    def random_op(self, t: int) -> int | None:
        x = self.shape[t]
        kinds = [k for k in _OP_WEIGHTS if len(x) == 4 or k not in _NEEDS_4D]
        p = np.asarray([_OP_WEIGHTS[k] for k in kinds], float)
        kind = self.pick(kinds, p=p / p.sum())
        q_in = self.quant[t]
        st = self.stats[t]
        if kind == "FULLY_CONNECTED" and len(x) > 2 and self.r() < 0.4:
            # Flatten + Dense as converters write it: RESHAPE to [1, N], then FULLY_CONNECTED
            # (otherwise FULLY_CONNECTED reads the 4-D tensor itself)
            if int(np.prod(x[1:])) > MAX_ELEMENTS // 2:
                return None
            t = self.add({"op": "RESHAPE", "in": [t], "to": "flat", "out": None}, _reshape_target(x, "flat"), q_in, st)
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            return self.linear(kind, t)
        if kind in ("ADD", "MUL"):
            same = [u for u in range(len(self.shape)) if self.shape[u] == x and u != t]
            if same and self.r() < 0.3:
                return self.binary(kind, t, self.pick(same))
            return self.binary(kind, t, None)
        if kind == "RESIDUAL":
            b = self.linear(
                self.pick(["CONV_2D", "DEPTHWISE_CONV_2D"]),
                t,
                same_spatial=True,
                out_ch=x[3] if self.r() < 0.7 else None,
            )
            if b is None:
                return None
            if self.shape[b] == x and self.r() < 0.75:
                return self.binary("ADD" if self.r() < 0.8 else "MUL", t, b)
            # concatenation: the branch gets the input's quantisation, as converters make it
            self.spec["ops"][b - 1]["out"] = list(q_in)
            self.spec["ops"][b - 1]["act"] = "NONE"
            self.quant[b] = q_in
            op = {"op": "CONCATENATION", "in": [t, b], "axis": int(self.pick([-1, 3])), "act": "NONE", "out": None}
            y = x[:3] + [x[3] + self.shape[b][3]]
            return self.add(op, y, q_in, st)
        if kind == "CONCATENATION":  # a tensor with itself (or another of its shape and quantisation)
            ax = int(self.rng.integers(1, len(x)))
            same = [
                u
                for u in range(len(self.shape))
                if self.quant[u] == q_in
                and len(self.shape[u]) == len(x)
                and all(a == b for j, (a, b) in enumerate(zip(self.shape[u], x)) if j != ax)
            ]
            u = self.pick(same)
            y = list(x)
            y[ax] += self.shape[u][ax]
            if int(np.prod(y)) > MAX_ELEMENTS:
                return None
            ax_spec = ax - len(x) if self.r() < 0.3 else ax  # negative axes too
            return self.add(
                {"op": "CONCATENATION", "in": [t, u], "axis": ax_spec, "act": "NONE", "out": None}, y, q_in, st
            )
        if kind == "SWISH":  # x * LOGISTIC(x), as converters write SiLU
            q = (_f32(1 / 256), -128)
            sig = self.add({"op": "LOGISTIC", "in": [t], "out": list(q)}, x, q, (0.5, 0.2))
            return self.binary("MUL", t, sig)
        if kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            if self.r() < 0.2:
                kh, kw, stride, pad = x[1], x[2], [1, 1], "VALID"  # global pooling
            else:
                kh, kw = int(self.pick([1, 2, 2, 3, 3, 4])), int(self.pick([1, 2, 2, 3, 3, 4]))
                if self.r() < 0.5:
                    kw = kh
                stride = [int(self.pick([1, 2, 2, 3])), int(self.pick([1, 2, 2, 3]))]
                pad = "SAME" if self.r() < 0.5 or kh > x[1] or kw > x[2] else "VALID"
            op = {
                "op": kind,
                "in": [t],
                "kernel": [kh, kw],
                "stride": stride,
                "padding": pad,
                "act": "NONE",
                "out": None,
            }
            if self.r() < 0.1:
                op["act"] = self.pick(["RELU", "RELU6"])
            y = [1, _conv_out(x[1], kh, stride[0], 1, pad), _conv_out(x[2], kw, stride[1], 1, pad), x[3]]
            return self.add(op, y, q_in, st)
        if kind == "MEAN":
            if len(x) == 4:
                axes = [1, 2] if self.r() < 0.75 else self.pick([[1], [2], [3], [1, 2, 3]])
            else:
                axes = [len(x) - 1] if self.r() < 0.7 else list(range(1, len(x)))
            keep = self.r() < 0.5 or len(x) - len(axes) < 2  # (no rank-1 [batch] tensors)
            op = {"op": "MEAN", "in": [t], "axes": axes, "keep_dims": keep}
            n = int(np.prod([x[a] for a in axes]))
            m, sd = st[0], st[1] / math.sqrt(n)
            if self.r() < 0.5:
                op["out"], q = None, q_in
            else:
                q = self.out_quant(m, sd)
                op["out"] = list(q)
            y = (
                [1 if a in axes else d for a, d in enumerate(x)]
                if keep
                else [d for a, d in enumerate(x) if a not in axes]
            )
            return self.add(op, y, q, (m, sd))
        if kind == "PAD":
            pads = [[0, 0]] + [[int(self.pick([0, 0, 1, 2])), int(self.pick([0, 1, 1, 2]))] for _ in x[1:]]
            if len(x) == 4 and self.r() < 0.75:
                pads[3] = [0, 0]
            op = {"op": "PAD", "in": [t], "pads": pads, "out": None}
            return self.add(op, [n + a + b for n, (a, b) in zip(x, pads)], q_in, st)
        if kind == "RESHAPE":
            to = self.pick(["flat", "rows", "4d"] if len(x) == 4 else ["flat", "4d"])
            if to == "flat" and len(x) == 2:
                to = "4d"
            return self.add({"op": "RESHAPE", "in": [t], "to": to, "out": None}, _reshape_target(x, to), q_in, st)
        if kind == "SOFTMAX":
            beta = 1.0 if self.r() < 0.85 else float(self.pick([0.5, 2.0]))
            q = (_f32(1 / 256), -128)
            return self.add(
                {"op": "SOFTMAX", "in": [t], "beta": beta, "out": list(q)}, x, q, (1.0 / max(x[-1], 1), 0.1)
            )
        if kind == "LOGISTIC":
            q = (_f32(1 / 256), -128)
            return self.add({"op": "LOGISTIC", "in": [t], "out": list(q)}, x, q, (0.5, 0.2))
        q = (_f32(1 / 128), 0)
        return self.add({"op": "TANH", "in": [t], "out": list(q)}, x, q, (0.0, 0.5))


def generate(seed: int) -> dict:
    """The random graph spec of ``seed`` (a plain dict; see the module docstring)."""
    g = _Gen(seed)
    g.make_input()
    n_ops = int(g.rng.choice([1, 2, 3, 4], p=[0.3, 0.35, 0.25, 0.1]))
    cur = 0
    tries = 0
    while len(g.spec["ops"]) < n_ops and tries < 40:
        tries += 1
        # mostly a chain; sometimes the op reads an earlier tensor (a branch)
        t = cur if g.r() < 0.85 or cur == 0 else int(g.rng.integers(0, cur + 1))
        u = g.random_op(t)
        if u is not None:
            cur = u
    g.spec["output"] = cur
    if cur == 0:  # nothing fitted: one 1x1 convolution
        g.spec["output"] = (
            g.linear("CONV_2D", 0, same_spatial=True) if len(g.shape[0]) == 4 else g.linear("FULLY_CONNECTED", 0)
        )
    shapes(g.spec)  # (checks it)
    return g.spec


# ============================================================================= coverage
def features(spec) -> set[str]:
    """The kinds of things a spec exercises (op kinds, fused activations, kernel and stride
    shapes, quantisation kinds, FULLY_CONNECTED / ADD / MUL / MEAN / CONCATENATION /
    RESHAPE variants, graph shape), as short names; for coverage checks."""
    f = set()
    shp = shapes(spec)
    live = live_ops(spec)
    for i in live:
        op = spec["ops"][i]
        k, x = op["op"], shp[op["in"][0]]
        f.add(k)
        if "act" in op:
            f.add(f"{k}:{op['act']}")
        if k in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            kh, kw = op["kernel"]
            if kh != kw and 1 in (kh, kw):
                f.add("conv kx1/1xk")
            if max(op["stride"]) == 3:
                f.add("conv stride 3")
            if max(op["dilation"]) > 1:
                f.add("conv dilation")
            f.add(f"conv {op['padding']}")
            if 1 in (x[1], x[2]):
                f.add("conv H or W = 1")
            if x[3] % 2:
                f.add("conv odd channels")
            if op.get("bias") is not None and op["bias"]["max"] >= 2**24:
                f.add("extreme bias")
        if k == "DEPTHWISE_CONV_2D" and op["mult"] > 1:
            f.add("depth multiplier")
        if "w" in op:
            f.add(f"{k} per-channel" if op["w"]["per_channel"] else f"{k} per-tensor")
        if k == "FULLY_CONNECTED":
            f.add(f"FC {len(x)}-D keep_num_dims={op['keep_num_dims']}")
        if k in ("ADD", "MUL"):
            f.add(f"{k} constant {op['const']['shape']}" if "const" in op else f"{k} two tensors")
        if k in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            f.add(f"pool {op['padding']}")
            if op["kernel"] == x[1:3]:
                f.add("global pool")
        if k == "MEAN":
            f.add(f"MEAN axes {op['axes']} keep_dims={op['keep_dims']}")
        if k == "CONCATENATION":
            f.add("CONCATENATION channels" if op["axis"] % len(x) == len(x) - 1 else "CONCATENATION other axis")
        if k == "RESHAPE":
            f.add(f"RESHAPE {op['to']}")
        if k == "SOFTMAX" and op.get("beta", 1.0) != 1.0:
            f.add("SOFTMAX beta != 1")
    if len(live) >= 3:
        f.add("3+ ops")
    if any(len(spec["ops"][i]["in"]) == 2 for i in live):
        f.add("two-input op (branch)")
    if len(shp[0]) == 2:
        f.add("2-D input")
    return f


# ============================================================================= minimise
def _canonical(spec) -> str:
    return json.dumps(spec, sort_keys=True)


def _drop_op(spec, i):
    """Op ``i`` removed, its readers reading its first input instead."""
    s = copy.deepcopy(spec)
    src = s["ops"][i]["in"][0]
    del s["ops"][i]

    def remap(t):
        return src if t == i + 1 else t - 1 if t > i + 1 else t

    for op in s["ops"]:
        op["in"] = [remap(t) for t in op["in"]]
    s["output"] = remap(s["output"])
    return s


def _prune(spec):
    """Only the live ops, renumbered."""
    live = live_ops(spec)
    if len(live) == len(spec["ops"]):
        return spec
    new = {0: 0}
    for j, i in enumerate(live):
        new[i + 1] = j + 1
    s = copy.deepcopy(spec)
    s["ops"] = [dict(s["ops"][i], **{"in": [new[t] for t in s["ops"][i]["in"]]}) for i in live]
    s["output"] = new[spec["output"]]
    return s


def _from_tensor(spec, t):
    """The graph after tensor ``t``, with ``t`` (its shape and quantisation) as the input;
    None when an op after ``t`` reads a tensor before it."""
    ops = spec["ops"][t:]
    if any(u < t for op in ops for u in op["in"]):
        return None
    s = copy.deepcopy(spec)
    q = quants(spec)[t]
    s["input"] = {"shape": shapes(spec)[t], "scale": q[0], "zp": int(q[1])}
    s["ops"] = [dict(copy.deepcopy(op), **{"in": [u - t for u in op["in"]]}) for op in ops]
    s["output"] = spec["output"] - t
    return s


def _candidates(spec):
    """Smaller or simpler variants of ``spec``, the most aggressive first."""
    n = len(spec["ops"])
    # start the graph later (an intermediate tensor as the input), cut it short, drop ops
    for t in range(spec["output"] - 1, 0, -1):
        s = _from_tensor(spec, t)
        if s is not None:
            yield s
    for out in range(1, spec["output"]):
        yield dict(copy.deepcopy(spec), output=out)
    for i in range(n - 1, -1, -1):
        if n > 1:
            yield _drop_op(spec, i)
    # input shape
    shp = spec["input"]["shape"]
    for d in range(1, len(shp)):
        for v in sorted({1, shp[d] // 2, shp[d] - 1}):
            if 1 <= v < shp[d]:
                s = copy.deepcopy(spec)
                s["input"]["shape"][d] = v
                yield s
    if spec["input"]["zp"] != 0:
        s = copy.deepcopy(spec)
        s["input"]["zp"] = 0
        yield s
    # per op
    for i, op in enumerate(spec["ops"]):

        def variant(**kw):
            s = copy.deepcopy(spec)
            s["ops"][i].update(copy.deepcopy(kw))
            return s

        for key in ("out_ch", "units", "mult"):
            if key in op and op[key] > 1:
                for v in sorted({1, op[key] // 2, op[key] - 1}):
                    if 1 <= v < op[key]:
                        yield variant(**{key: v})
        if "kernel" in op:
            kh, kw = op["kernel"]
            for v in [[1, kw], [kh, 1], [kh - 1, kw], [kh, kw - 1]]:
                if v != op["kernel"] and min(v) >= 1:
                    yield variant(kernel=v)
        for key in ("stride", "dilation"):
            if key in op and op[key] != [1, 1]:
                yield variant(**{key: [1, 1]})
                yield variant(**{key: [op[key][0], 1]})
                yield variant(**{key: [1, op[key][1]]})
        if op.get("padding") == "SAME":
            yield variant(padding="VALID")
        if op.get("act", "NONE") != "NONE":
            yield variant(act="NONE")
        if op.get("bias") is not None:
            yield variant(bias=None)
            for v in (0, 1, 16, 256, op["bias"]["max"] // 4):
                if v < op["bias"]["max"]:
                    yield variant(bias=dict(op["bias"], max=v))
        if "w" in op:
            w = op["w"]
            if w["per_channel"]:
                yield variant(w=dict(w, per_channel=False, spread=0.0))
                if w["spread"] > 0:
                    yield variant(w=dict(w, spread=0.0))
            for v in (1, 3, w["max"] // 4):
                if 1 <= v < w["max"]:
                    yield variant(w=dict(w, max=v))
        if op.get("keep_num_dims"):
            yield variant(keep_num_dims=False)
        if "pads" in op:
            for d, (a, b) in enumerate(op["pads"]):
                if a or b:
                    p = copy.deepcopy(op["pads"])
                    p[d] = [0, 0]
                    yield variant(pads=p)
        if op["op"] in ("ADD", "MUL") and len(op["in"]) == 2:
            yield variant(**{"in": [op["in"][0]], "const": {"shape": "c", "seed": 1, "scale": 0.01, "zp": 0}})
        if "const" in op and op["const"]["shape"] != "c":
            yield variant(const=dict(op["const"], shape="c"))
        if (
            op["op"] not in _SAME_QUANT_OPS
            and op.get("out") is not None
            and op["out"][1] != 0
            and op["op"] not in ("SOFTMAX", "LOGISTIC")
        ):
            yield variant(out=[op["out"][0], 0])


def minimise(spec, fails, max_steps: int = 400, log=None):
    """A smaller spec for which ``fails(spec)`` still holds (greedy delta debugging).

    ``fails(spec)`` must be true for ``spec``; candidates that are not valid graphs
    (:func:`shapes` raises) or whose :func:`build` fails are skipped. Each accepted step
    restarts the candidate list. ``max_steps`` bounds the number of ``fails`` calls."""
    cur = _prune(spec)
    seen = {_canonical(cur)}
    calls = 0
    improved = True
    while improved and calls < max_steps:
        improved = False
        for cand in _candidates(cur):
            try:
                cand = _prune(cand)
                shapes(cand)
            except (SpecError, KeyError, IndexError):
                continue
            key = _canonical(cand)
            if key in seen:
                continue
            seen.add(key)
            calls += 1
            try:
                ok = fails(cand)
            except Exception:  # a candidate the tools cannot even build
                ok = False
            if ok:
                cur = cand
                improved = True
                if log:
                    log(f"minimise: {len(cur['ops'])} ops, input {cur['input']['shape']}")
                break
            if calls >= max_steps:
                break
    return cur


# ================================================================================ print
def spec_repr(spec) -> str:
    """The spec as a Python/JSON literal, one op per line (paste it into a test)."""
    lines = ["{", f'    "seed": {spec.get("seed", 0)},', f'    "input": {json.dumps(spec["input"])},', '    "ops": [']
    for i, op in enumerate(spec["ops"]):
        lines.append(f"        {json.dumps(op)},  # -> t{i + 1}")
    lines += ["    ],", f'    "output": {spec["output"]},', "}"]
    return "\n".join(lines).replace("null", "None").replace("true", "True").replace("false", "False")


def describe(spec) -> str:
    """One line: the op kinds and the input shape."""
    return f"{spec['input']['shape']} " + " ".join(
        f"{op['op']}" + (f"({op['act']})" if op.get("act", "NONE") != "NONE" else "") for op in spec["ops"]
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    for a in argv:
        spec = generate(int(a))
        print(spec_repr(spec))
        model = build(spec)
        x = inputs(spec)
        for r, y in run_oracles(model, x).items():
            print(r, y if isinstance(y, Refused) else y.reshape(len(x), -1)[:, :12])


if __name__ == "__main__":
    main()
