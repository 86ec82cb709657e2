"""An int8 ``.tflite`` model as a runnable :class:`Model` (:func:`load`).

The importer is :mod:`hwjax.tflite._import`; the converters of each operator family
register themselves when their module is imported below.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import ONE_PASS_EXAMPLES, evaluated_if_concrete, call_stored, stored_value
from hwjax.core import validate as V
from hwjax.errors import ArgTypeError, FileError, FormatError, RangeError, ShapeError, UnsupportedOpError
from hwjax.graph import Graph, jit_run, lower
from hwjax.tflite import _convert, _convert_nonlinear, _convert_tensor, _xcore  # noqa: F401  (register converters)
from hwjax.tflite._import import NP as _NP
from hwjax.tflite._import import read, supported_ops

RUNTIMES = ("reference", "optimized", "xnnpack", "tflm")
#: every runtime name :meth:`Model.run` takes: the LiteRT/TFLM ones and ``"xs3"`` (xcore.ai)
MODEL_RUNTIMES = (*RUNTIMES, "xs3")
#: int32 bytes of the largest intermediate tensor one chunk of examples may hold: larger
#: batches run as consecutive chunks inside one program (:func:`hwjax.graph.jit_run`), so
#: every node's buffers stay cache-sized (see :func:`batch_chunk`)
CHUNK_BYTES = 512 * 1024


def batch_chunk(graph: Graph) -> int:
    """Examples per chunk with which :meth:`Model.run` runs ``graph`` on large batches.

    The largest power of two in [8, 1024] whose chunk keeps the graph's largest per-example
    tensor, as int32 (the width accumulators and requantisation work in), within
    :data:`CHUNK_BYTES`. Measured with ``python -m hwjax.bench deployed`` shapes on one CPU
    thread, batch 1024 (images/s, chunk 16 / 64 / 128 / whole batch): the CNN 16.0k / 12.2k /
    10.4k / 5.6k, the deep conv net 2.09k / 1.83k / 1.76k / 1.48k, the MLP 35.8k / 55.8k /
    64.9k / 89.9k. Re-measured on an AMD EPYC (AVX-512) pinned to one core, batch 1024,
    chunk 16 / 64 (and the conv kernels' chunks at 1 / 4 MiB): the CNN 40.5k / 30.1k
    (40.6k / 40.3k), the deep conv net 3.50k / 3.45k (2.44k / 2.86k); the MLP at chunk
    128 / 512 138.6k / 143.0k. Chunking changes no value: every example is computed alone.
    """
    if not isinstance(graph, Graph):
        raise ArgTypeError(
            f"graph must be a hwjax.graph.Graph (e.g. Model.lowered(runtime)), got {type(graph).__name__}"
        )
    biggest = max((math.prod(t.shape) for t in graph.tensors.values()), default=1)
    chunk = 1024
    while chunk > 8 and chunk * biggest * 4 > CHUNK_BYTES:
        chunk //= 2
    return chunk


#: TFLite operators :func:`load` reads (``CUSTOM(name)`` for custom operators)
SUPPORTED_OPS = supported_ops()


class Model:
    """An int8 ``.tflite`` model, runnable bit-exactly as each LiteRT runtime runs it.

    Attributes:
      graph: the portable :class:`hwjax.graph.Graph` (its nodes keep the file's int8
        weights, int32 biases and float32 scales).
      inputs, outputs: :class:`TensorInfo` of the file's inputs and outputs.
      metadata: the file's metadata entries, ``{name: bytes}`` (e.g. xformer's
        ``xcoreSharedConfig``), which :func:`hwjax.tflite.save` copies.
    """

    def __init__(self, graph: Graph, inputs, outputs, metadata=None, *, source_digest: Optional[bytes] = None):
        self.graph, self.inputs, self.outputs = graph, tuple(inputs), tuple(outputs)
        self.metadata: dict[str, bytes] = dict(metadata or {})
        self._lowered: dict[Any, Graph] = {}
        # the SHA-256 of the file this model was read from (load): it determines this graph,
        # so the stored lowering is keyed by it instead of every array of the graph
        self._source = (graph, source_digest)

    def __repr__(self):
        return (
            f"Model({len(self.graph.nodes)} nodes, inputs {[i.shape for i in self.inputs]}, "
            f"outputs {[o.shape for o in self.outputs]})"
        )

    def target(self, runtime):
        from hwjax.targets import Target, get

        if isinstance(runtime, Target):
            return runtime
        if runtime == "xs3":  # xcore.ai as xmos-ai-tools' host interpreter runs it
            if getattr(self, "_xs3", None) is None:
                # an xformer-converted file: XC ops, or xformer's metadata (a converted file
                # may hold builtins only, e.g. an AVERAGE_POOL_2D written as a DEPTHWISE_CONV_2D)
                if "xcoreSharedConfig" in self.metadata or any(n.op.startswith("xc_") for n in self.graph.nodes):
                    self._xs3 = get("xs3-tflm", variant="host")
                else:  # an original model, compiled as xformer (default options) would
                    from hwjax.targets import check_xformer_lowering

                    check_xformer_lowering(self.graph)
                    self._xs3 = get("xs3-xformer", variant="host")
            return self._xs3
        if runtime not in RUNTIMES:
            raise RangeError(f"runtime must be one of {MODEL_RUNTIMES} or a hwjax.targets.Target, got {runtime!r}")
        from hwjax.targets import check_tflite_lowering

        check_tflite_lowering(self.graph, runtime)
        return get("tflite", runtime=runtime)

    def lowered(self, runtime="reference") -> Graph:
        """The graph lowered for ``runtime`` (its integer parameters; cached)."""
        t = self.target(runtime)
        if t not in self._lowered:  # a later process loads the lowering from disk (stored_value)
            graph, digest = self._source
            src = np.frombuffer(digest, np.uint8) if digest is not None and graph is self.graph else self.graph
            self._lowered[t] = stored_value(lambda: lower(self.graph, t), src, ("hwjax.tflite.Model.lowered", repr(t)))
        return self._lowered[t]

    def trainable(self, runtime: str = "reference"):
        """The model as NNX modules whose forward pass is ``runtime``'s arithmetic, taking the
        file's own input: :func:`hwjax.tflite.trainable` (a :class:`hwjax.tflite.Trainable`)."""
        from hwjax.tflite._finetune import trainable

        return trainable(self, runtime)

    def with_weights(self, tuned) -> "Model":
        """A new model with the weights of ``tuned`` (a :class:`hwjax.tflite.Trainable` made
        from this model): :func:`hwjax.tflite.with_weights`."""
        from hwjax.tflite._finetune import with_weights

        return with_weights(self, tuned)

    def run(self, x, *, runtime="reference", intermediates: bool = False):
        """The model's output(s) for every sample of ``x``, as ``runtime`` computes them.

        Args:
          x: array of shape ``(batch, *input_shape[1:])`` (the file's batch-1 axis
            replaced by the batch), or a sequence of such arrays for several inputs: an
            integer array (int8 or uint8 values) for an int8/uint8 input, a float32 array
            for a float32 input (a float interface: the file's QUANTIZE rounds it as the
            runtime does, each example as LiteRT runs the batch-1 tensor). Non-finite
            float values raise :class:`hwjax.errors.RangeError` (concrete inputs; traced
            ones under :func:`hwjax.checked`).
          runtime: ``"reference"``, ``"optimized"``, ``"xnnpack"``, ``"tflm"``, ``"xs3"``
            (xcore.ai: an xformer-converted file's XC ops as the xmos-ai-tools host
            interpreter computes them; an original model compiled with xformer's recipe)
            or a :class:`hwjax.targets.Target`.
          intermediates: also return a dict of every tensor by name (batched, int32).
        Returns:
          The output array (the file's dtype), a tuple for several outputs; then the
          intermediates when asked for.
        """
        g = self.lowered(runtime)
        xs = list(x) if isinstance(x, (tuple, list)) else [x]
        if len(xs) != len(self.inputs):
            raise RangeError(f"the model takes {len(self.inputs)} inputs, got {len(xs)}")
        arrays = []
        for info, a in zip(self.inputs, xs):
            if info.dtype == "float32" and getattr(a, "dtype", None) == np.float64:
                raise ArgTypeError(
                    f"input {info.name!r} is float32: pass a float32 array, got float64 (round it "
                    "explicitly with astype(np.float32))"
                )
            # host data stays a NumPy array (checked here, converted inside the compiled
            # run): no eager device program per input shape and dtype
            if not isinstance(a, (jax.Array, np.ndarray, np.generic)):  # a list: Python floats are float32
                a = np.asarray(a)
                a = a.astype(np.float32) if a.dtype == np.float64 else a
            a = a if isinstance(a, jax.Array) else np.asarray(a)
            per = tuple(info.shape[1:])
            if a.ndim != len(per) + 1 or tuple(a.shape[1:]) != per:
                raise ShapeError(
                    f"input {info.name!r} must have shape (batch, {', '.join(map(str, per))}), got {tuple(a.shape)}"
                )
            if info.dtype == "float32":
                if not jnp.issubdtype(a.dtype, jnp.floating) or a.dtype.itemsize > 4:
                    raise ArgTypeError(
                        f"input {info.name!r} is float32: pass a float32 (or float16/bfloat16) array, got {a.dtype}"
                    )
                V.check_finite(a, f"input {info.name!r}")
                arrays.append(a)
                continue
            if not jnp.issubdtype(a.dtype, jnp.integer):
                raise ArgTypeError(f"input {info.name!r} must be an integer array ({info.dtype} values), got {a.dtype}")
            lo, hi = (-128, 127) if info.dtype == "int8" else (0, 255)
            # an array of the input's own dtype holds only values in range: no check (a device
            # array's check would wait for it and read two values back on every call)
            if not isinstance(a, jax.core.Tracer) and a.size and a.dtype != np.dtype(info.dtype):
                amin, amax = (a.min(), a.max()) if isinstance(a, np.ndarray) else jax.device_get(_min_max(a))
                if int(amin) < lo or int(amax) > hi:
                    raise RangeError(f"input {info.name!r} holds values outside {info.dtype} [{lo}, {hi}]")
            arrays.append(a)
        options = dict(
            in_dtypes=tuple(info.dtype for info in self.inputs),
            out_dtypes=tuple(info.dtype for info in self.outputs),
            intermediates=intermediates,
            chunk=None if intermediates else batch_chunk(g),
        )
        if intermediates:
            res = _run_file(g, tuple(arrays), **options)
        else:  # a later process loads this program from disk instead of tracing it; the
            # graph's scalars are constants of the program (XLA folds shifts, zero points,
            # branch choices), its arrays arguments
            # a batch that runs in chunks is a data set's: compiled for speed, not for its first result
            looping = bool(arrays) and arrays[0].ndim > 0 and arrays[0].shape[0] > ONE_PASS_EXAMPLES
            res = call_stored(
                _run_file, (g, tuple(arrays)), "hwjax.tflite.Model.run", embed=(0,), looping=looping, **options
            )
        out = res[0] if intermediates else res
        y = out[0] if len(out) == 1 else out
        return (y, res[1]) if intermediates else y


_min_max = jax.jit(lambda a: (jnp.min(a), jnp.max(a)))


@functools.partial(jax.jit, static_argnames=("in_dtypes", "out_dtypes", "intermediates", "chunk"))
def _run_file(g: Graph, arrays: tuple, *, in_dtypes: tuple, out_dtypes: tuple, intermediates: bool, chunk):
    """:func:`hwjax.graph.jit_run` with the file's input conversion (float32; integer inputs
    as they are: the graph reads them as int32 chunk by chunk) and output dtypes, all in one
    program; outputs as a tuple."""
    xs = tuple(a.astype(jnp.float32) if dt == "float32" else a for a, dt in zip(arrays, in_dtypes))
    res = jit_run(g, xs, intermediates=intermediates, chunk=chunk)
    out = res[0] if intermediates else res
    outs = tuple(o.astype(_NP[dt]) for o, dt in zip(out if isinstance(out, tuple) else (out,), out_dtypes))
    return (outs, res[1]) if intermediates else outs


def load(path_or_bytes) -> Model:
    """Reads an int8 ``.tflite`` model (a path or the file's bytes) into a :class:`Model`.

    Raises :class:`hwjax.errors.FileError` (also a FileNotFoundError) for a path that is
    not a readable file, :class:`hwjax.errors.FormatError` for a file that is not a TFLite flatbuffer,
    is truncated, or is a float model, and :class:`hwjax.errors.UnsupportedOpError`
    naming the first operator (index and name) outside :data:`SUPPORTED_OPS`.
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
        raise ArgTypeError(f"load takes a path or bytes, got {type(path_or_bytes).__name__}")
    try:
        with evaluated_if_concrete():  # the file's constants as arrays, also when loaded inside a trace
            graph, ins, outs = read(data)
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, (FormatError, UnsupportedOpError, ShapeError)):
            raise
        raise FormatError(f"corrupt TFLite flatbuffer: {type(e).__name__}: {e}") from None
    return Model(graph, ins, outs, _metadata(data), source_digest=hashlib.sha256(data).digest())


def _metadata(data: bytes) -> dict[str, bytes]:
    """The file's metadata entries ``{name: buffer bytes}`` (``{}`` where unreadable)."""
    from hwjax.tflite import _flatbuffer as fb

    try:
        model = fb.root(data)
        buffers = model.tables(4)
        out = {}
        for md in model.tables(6):
            i = md.scalar(1, "I", 0)
            raw = buffers[i].array(0, np.uint8) if i < len(buffers) else None
            out[md.string(0)] = b"" if raw is None else raw.tobytes()
        return out
    except (FormatError, IndexError, ValueError):
        return {}
