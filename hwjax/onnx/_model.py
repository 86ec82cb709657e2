"""An ONNX int8 model as a runnable :class:`Model` (:func:`load`)."""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import call_stored, evaluated_if_concrete
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, FileError, FormatError, HwjaxError, RangeError, ShapeError
from hwjax.graph import Graph, jit_run, lower
from hwjax.onnx._read import read

#: the runtime names :meth:`Model.run` takes: ONNX Runtime's CPU provider on a VNNI / AMX
#: CPU (the default), on an AVX2 CPU without VNNI, on an SSE4.2-only CPU
#: (:class:`hwjax.targets.OnnxRuntime`'s ``cpu`` ``"vnni"``, ``"avx2"``, ``"sse"``)
RUNTIMES = ("onnxruntime", "onnxruntime-avx2", "onnxruntime-sse")
_CPU = {"onnxruntime": "vnni", "onnxruntime-avx2": "avx2", "onnxruntime-sse": "sse"}
_NP = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int32": np.int32}
_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


class Model:
    """An ONNX int8 model, runnable bit-exactly as ONNX Runtime's CPU provider runs it.

    Attributes:
      graph: the portable :class:`hwjax.graph.Graph` after ONNX Runtime's QDQ rewrites
        (op kinds of :mod:`hwjax.graph.ops.onnx`, ONNX's NCHW layout, per-example shapes).
      inputs, outputs: :class:`hwjax.onnx.TensorInfo` of the file's inputs and outputs
        (shapes with the batch axis, 1).
    """

    def __init__(self, graph: Graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, tuple(inputs), tuple(outputs)
        self._lowered: dict[Any, Graph] = {}

    def __repr__(self):
        return (
            f"Model({len(self.graph.nodes)} nodes, inputs {[i.shape for i in self.inputs]}, "
            f"outputs {[o.shape for o in self.outputs]})"
        )

    def target(self, runtime):
        """The :class:`hwjax.targets.OnnxRuntime` a ``runtime`` name or target stands for."""
        from hwjax.targets import OnnxRuntime, get

        if isinstance(runtime, OnnxRuntime):
            return runtime
        if not isinstance(runtime, str) or runtime not in RUNTIMES:
            raise RangeError(f"runtime must be one of {RUNTIMES} or a hwjax.targets.OnnxRuntime, got {runtime!r}")
        return get("onnxruntime", cpu=_CPU[runtime])

    def lowered(self, runtime="onnxruntime") -> Graph:
        """The graph lowered for ``runtime`` (its integer parameters and tables; cached)."""
        t = self.target(runtime)
        if t not in self._lowered:
            self._lowered[t] = lower(self.graph, t)
        return self._lowered[t]

    def trainable(self, runtime="onnxruntime"):
        """The model as NNX modules whose forward pass is ``runtime``'s arithmetic:
        :func:`hwjax.onnx.trainable` (a :class:`hwjax.nn.GraphModel`)."""
        from hwjax.onnx._finetune import trainable

        return trainable(self, runtime)

    def with_weights(self, tuned) -> "Model":
        """A new model with the weights of ``tuned`` (made by :meth:`trainable` from this
        model): :func:`hwjax.onnx.with_weights`."""
        from hwjax.onnx._finetune import with_weights

        return with_weights(self, tuned)

    def run(self, x, *, runtime="onnxruntime", intermediates: bool = False):
        """The model's output(s) for every example of ``x``, as ONNX Runtime computes them.

        Args:
          x: an array of shape ``(batch, *input_shape[1:])`` (the file's batch-1 axis replaced
            by the batch; each example is computed as ONNX Runtime computes a batch-1 input),
            or a sequence of such arrays for several inputs: float32 for a float input (NaN
            and infinities raise :class:`hwjax.errors.RangeError`), integers within the
            type's range for a uint8 / int8 input.
          runtime: one of :data:`RUNTIMES` (``"onnxruntime"``: a VNNI / AMX CPU;
            ``"onnxruntime-avx2"``, ``"onnxruntime-sse"``: the older CPUs) or an
            :class:`hwjax.targets.OnnxRuntime` (e.g. ``hwjax.targets.get("onnxruntime",
            cpu="sse")``).
          intermediates: also return a dict of every tensor by name (batched; int32 for
            integer tensors).
        Returns:
          The output array in the file's dtype (a tuple for several outputs); then the
          intermediates when asked for.
        """
        intermediates = V.check_flag(intermediates, "intermediates")
        g = self.lowered(runtime)
        xs = list(x) if isinstance(x, (tuple, list)) else [x]
        if len(xs) != len(self.inputs):
            raise RangeError(f"x: the model takes {len(self.inputs)} inputs, got {len(xs)}")
        arrays = []
        for info, a in zip(self.inputs, xs):
            if not isinstance(a, (jax.Array, np.ndarray, np.generic)):
                raise ArgTypeError(f"x: input {info.name!r} must be an array, got {type(a).__name__}")
            per = tuple(info.shape[1:])
            if a.ndim != len(per) + 1 or tuple(a.shape[1:]) != per:
                raise ShapeError(
                    f"x: input {info.name!r} must have shape (batch, {', '.join(map(str, per))}), got {tuple(a.shape)}"
                )
            if info.dtype == "float32":
                if a.dtype != np.float32:
                    raise ArgTypeError(f"x: input {info.name!r} is float32, got {a.dtype}")
                V.check_finite(a, f"input {info.name!r}")
            else:
                if not jnp.issubdtype(a.dtype, jnp.integer):
                    raise ArgTypeError(f"x: input {info.name!r} must hold {info.dtype} values, got {a.dtype}")
                lo, hi = _RANGES.get(info.dtype, (-(2**31), 2**31 - 1))
                # an array of the input's own dtype holds only values in range: not read back
                same = a.dtype == np.dtype(info.dtype)
                if (
                    not isinstance(a, jax.core.Tracer)
                    and a.size
                    and not same
                    and (int(a.min()) < lo or int(a.max()) > hi)
                ):
                    raise RangeError(f"x: input {info.name!r} holds values outside {info.dtype} [{lo}, {hi}]")
            arrays.append(a)
        options = dict(
            out_dtypes=tuple(o.dtype for o in self.outputs),
            intermediates=intermediates,
            chunk=None if intermediates else batch_chunk(g),
        )
        if intermediates:
            res = _run(g, tuple(arrays), **options)
        else:  # a later process loads this program from disk instead of tracing it; the
            # graph's scalars are constants of the program (XLA folds shifts, zero points,
            # branch choices), its arrays arguments
            res = call_stored(_run, (g, tuple(arrays)), "hwjax.onnx.Model.run", embed=(0,), **options)
        out = res[0] if intermediates else res
        y = out[0] if len(out) == 1 else out
        return (y, res[1]) if intermediates else y


#: int32 bytes of the largest per-example tensor one chunk of examples may hold: larger
#: batches run as consecutive chunks inside one program (:func:`hwjax.graph.jit_run`)
CHUNK_BYTES = 512 * 1024


def batch_chunk(graph: Graph) -> int:
    """Examples per chunk with which :meth:`Model.run` runs ``graph``: the largest power of
    two in [8, 1024] whose chunk keeps the graph's largest per-example tensor, as int32,
    within :data:`CHUNK_BYTES` (chunking changes no value: every example is computed alone)."""
    biggest = max((math.prod(t.shape) for t in graph.tensors.values()), default=1)
    chunk = 1024
    while chunk > 8 and chunk * biggest * 4 > CHUNK_BYTES:
        chunk //= 2
    return chunk


@functools.partial(jax.jit, static_argnames=("out_dtypes", "intermediates", "chunk"))
def _run(g: Graph, arrays: tuple, *, out_dtypes: tuple, intermediates: bool, chunk):
    res = jit_run(g, arrays, intermediates=intermediates, chunk=chunk)
    out = res[0] if intermediates else res
    outs = tuple(o.astype(_NP[dt]) for o, dt in zip(out if isinstance(out, tuple) else (out,), out_dtypes))
    return (outs, res[1]) if intermediates else outs


def load(path_or_bytes) -> Model:
    """Reads an ONNX int8 model (a path or the file's bytes) into a :class:`Model`, with
    ONNX Runtime's QDQ rewrites applied (:mod:`hwjax.onnx`).

    Raises ImportError without the ``onnx`` package, :class:`hwjax.errors.FileError` for a
    path that is not a readable file,
    :class:`hwjax.errors.FormatError` for bytes that are not a well-formed ONNX model, and
    :class:`hwjax.errors.UnsupportedOpError` naming the first operator (or the groups ONNX
    Runtime runs in float32) outside what hwjax reproduces; no other exception type.
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        if not os.path.isfile(path_or_bytes):
            raise FileError(f"path_or_bytes {os.fspath(path_or_bytes)!r}: no such file")
        try:
            with open(path_or_bytes, "rb") as f:
                data = f.read()
        except OSError as e:
            raise FileError(f"path_or_bytes {os.fspath(path_or_bytes)!r}: cannot be read ({e.strerror})") from None
    else:
        raise ArgTypeError(f"path_or_bytes: load takes a path or bytes, got {type(path_or_bytes).__name__}")
    if not data:
        raise FormatError("path_or_bytes: the file is empty")
    try:
        import onnx  # noqa: F401  (reading only: running needs neither onnx nor ONNX Runtime)
    except ImportError:
        raise ImportError(
            "hwjax.onnx.load needs the 'onnx' package (pip install onnx, or the hwjax 'onnx' extra)"
        ) from None
    try:
        with evaluated_if_concrete():
            graph, ins, outs = read(data)
    except HwjaxError:
        raise
    except Exception as e:  # the protobuf parser and onnx's helpers raise many types
        raise FormatError(f"corrupt ONNX model: {type(e).__name__}: {e}") from None
    return Model(graph, ins, outs)
