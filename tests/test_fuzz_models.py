"""A seeded mutation fuzzer of the ``.tflite`` reader: model files are untrusted input.

Every mutated file must either load, or raise a :class:`hwjax.errors.HwjaxError` from
:func:`hwjax.tflite.load`; a file that loads must run (one example of zeros of the declared
input shape and dtype: ``"reference"`` for an original model, ``"xs3"`` for an
xformer-converted one) or raise a ``HwjaxError``. Anything else fails: another exception,
a case that runs past its time limit (a hang), or a load that allocates far more than the
file holds.

The corpus (:data:`CORPUS`) is stored models of every kind the reader takes, chosen to
reach every converter family: TFLM kernel test models (CONV_2D; MEAN and a broadcasting MUL;
SOFTMAX), two Keras models (convolutions, pools, CONCATENATION, MUL, LOGISTIC,
FULLY_CONNECTED), an original xformer test model (CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D,
FULLY_CONNECTED, RELU) and xformer-converted ones whose XC custom operators keep their options
as flexbuffers (``XC_conv2d_v2`` of each kernel type, ``XC_lookup``, ``XC_pad``,
``XC_pad_3_to_4``, ``XC_slice``, ``XC_maxpool2d``, ``XC_add``, ``XC_mean``, ``XC_concat``,
``XC_mul``).

Mutations (:func:`mutate`; case ``(file, seed)`` always gives the same bytes):

* ``flip``: one byte XORed with a random nonzero mask; ``flips``: 2-32 random bytes replaced;
* ``truncate``: the file cut at a random length;
* ``word``: an extreme 32-bit little-endian word (0, 1, 0x7fffffff, 0x80000000, 0xffffffff,
  0xfffffffe, the file length, large sizes ...) written at a random 4-aligned offset;
* ``field``: an extreme value of the field's own width written at a *structural* position
  found by walking the original file's flatbuffer (:func:`structure`): uoffsets to tables,
  vectors and strings, vector lengths, vtable offsets and vtable entries, shape entries,
  tensor/buffer/opcode indices, tensor types, scales (NaN, inf, 0, denormals), zero points,
  builtin options; the failure message names the field (``subgraphs[0].tensors[3].shape[1]``);
* ``region``: random bytes or extreme words inside one byte vector: an XC operator's
  flexbuffer custom options (most often; half of those bytes are flexbuffer packed types,
  byte widths or small offsets), a constant buffer, a name;
* ``swap`` / ``dup``: two 4-aligned regions swapped, or one copied over another;
* ``multi``: 2-4 of the length-preserving mutations above at once.

Guards:

* Time: each case runs under ``signal.setitimer`` (SIGALRM, main thread, as also in a
  pytest-xdist worker; :data:`LOAD_SECONDS` for the load, :data:`RUN_SECONDS` for the run,
  both generous: loads and runs compile XLA programs, slowly on a busy machine). The
  handler raises a ``BaseException`` so that no ``except Exception`` in the reader swallows it.
  A loop inside C code (XLA) is only interrupted when it returns to Python.
* Memory of the load: ``tracemalloc`` measures the peak of Python and NumPy allocations
  (NumPy reports its array buffers to it) during :func:`hwjax.tflite.load`. The bound is
  ``LOAD_BYTES_PER_FILE_BYTE * len(file) + LOAD_BYTES_FIXED`` (64x + 8 MB). Why that shape:
  everything a load should allocate is derived from the bytes that are there: the file is
  copied a few times (``bytes``, NumPy views made contiguous, int8 kernels widened to
  int32/float32, XC weight blobs reordered back, lookup tables), and the graph's Python
  objects (dataclasses, dicts, attribute tuples, JAX arrays' wrappers) cost a few hundred
  bytes per tensor or node that the file spends tens of bytes on. So the legitimate peak is
  linear in the file's size, plus a fixed part (the first load of a process imports and
  traces: 2.6 MB measured). Measured on this corpus: the loaded mutants peak at 9-24x their
  size (16-330 KB), the unmutated files at 11-47x (the XC files' weight reordering). 64x and
  8 MB leave a wide margin over that while still catching what the bound is for: a count or
  shape read from the file (a vector length, a declared tensor shape, a struct field) used to
  size an allocation before it is checked against the bytes actually there; a declared
  0x7fffffff is gigabytes, hundreds of times past the bound. The bound is not tight against
  adversarial files in general: a vector of many tensor offsets that all point at one table
  costs ~1 KB of objects per 4 file bytes, linear but above 64x; mutations of real files do
  not build those, and what the bound guards is sizes taken from the file, not that constant.
  The run allocates what the declared shapes need (the file declares them, and XLA's
  buffers are not Python allocations): a mutant whose largest declared tensor exceeds
  :data:`RUN_MAX_ELEMENTS` is loaded but not run.
* Address space: on Linux each case runs with a soft ``RLIMIT_AS`` of the process's current
  size plus :data:`AS_HEADROOM`, so that a runaway allocation becomes a ``MemoryError`` (a
  reported failure) instead of the kernel's OOM killer ending the test run.

Reproducing a failure: the message names the file, the seed and the mutation;
``tests.test_fuzz_models.run_case(file, seed)`` replays it
(``.venv/bin/python -c "from tests.test_fuzz_models import run_case; print(run_case('xformer/chain.xc.tflite', 123))"``).
``HWJAX_FUZZ_CASES=N`` sets the number of cases of the slow test (``make test-full``);
``HWJAX_FUZZ_SEED=S`` shifts the seeds of both tests.

Crashes this fuzzer found are kept as named regression cases (:data:`REGRESSIONS`), each the
smallest mutation of a corpus file that reproduced it, as patches at named structural
positions. Those not fixed yet are ``xfail(strict=True)``, and the fuzz tests count mutants
that crash with the same exception in the same function as "known crash <name>" instead of
failing (so `make test-full` stays green for known bugs and red for new ones).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import re
import resource
import signal
import struct
import sys
import threading
import time
import tracemalloc
import traceback
from pathlib import Path

import numpy as np
import pytest

import hwjax.tflite
from hwjax.errors import HwjaxError

DATA = Path(__file__).resolve().parent / "data"

#: (file under tests/data, runtime its mutants run on)
CORPUS = (
    ("tflm/conv_same_s2_relu.tflite", "reference"),
    ("tflm/mul_broadcast_mean.tflite", "reference"),
    ("tflm/softmax_len37.tflite", "reference"),
    ("keras/cnn_branches.tflite", "reference"),
    ("keras/mlp_sigmoid.tflite", "reference"),
    ("xformer/chain.tflite", "reference"),
    ("xformer/chain.xc.tflite", "xs3"),
    ("xformer/add.xc.tflite", "xs3"),
    ("xformer/mean.xc.tflite", "xs3"),
    ("keras_mcu/mlp_sigmoid.xc.tflite", "xs3"),
    ("keras_mcu/cnn_branches.xc.tflite", "xs3"),
)
RUNTIME = dict(CORPUS)

#: time limits of one case: generous, as a load may compile (an XC file's weight reordering
#: is a jitted program per kernel shape: a mutated shape compiles a new one; one such load
#: took over 10 s on a busy 2-core machine) and a run compiles the model; a hang runs forever
LOAD_SECONDS = 60.0
RUN_SECONDS = 300.0
#: the bound on a load's traced peak allocation: 64 bytes per file byte + 8 MB (docstring)
LOAD_BYTES_PER_FILE_BYTE = 64
LOAD_BYTES_FIXED = 8 << 20
#: mutants whose largest declared tensor has more elements are loaded, not run
RUN_MAX_ELEMENTS = 1 << 20
#: address space a case may add to the process (RLIMIT_AS) before allocations fail
AS_HEADROOM = 4 << 30

SEED_BASE = int(os.environ.get("HWJAX_FUZZ_SEED", "0"))
#: cases of the quick test (`make test`): every one loaded, the first RUN_QUICK that load also run
QUICK_CASES = 400
RUN_QUICK = 20
#: cases of the slow test (`make test-full`): every one loaded, one in SLOW_RUN_EVERY that load also run
SLOW_CASES = int(os.environ.get("HWJAX_FUZZ_CASES", "3000"))
SLOW_RUN_EVERY = 4


# ------------------------------------------------------------------ the corpus's structure

# The tables of schema.fbs the walker follows: field index -> (name, kind). Kinds: a scalar
# format ("u8", "i8", "i32", "u32", "u64"), "str", ("vec", element format), ("tab", table)
# or ("tabs", table) (a vector of tables); table None is walked generically (builtin
# options: every present field a scalar).
_SCHEMA = {
    "Model": {
        0: ("version", "u32"),
        1: ("operator_codes", ("tabs", "OperatorCode")),
        2: ("subgraphs", ("tabs", "SubGraph")),
        3: ("description", "str"),
        4: ("buffers", ("tabs", "Buffer")),
        5: ("metadata_buffer", ("vec", "i32")),
        6: ("metadata", ("tabs", "Metadata")),
        7: ("signature_defs", ("tabs", "SignatureDef")),
    },
    "OperatorCode": {
        0: ("deprecated_builtin_code", "i8"),
        1: ("custom_code", "str"),
        2: ("version", "i32"),
        3: ("builtin_code", "i32"),
    },
    "SubGraph": {
        0: ("tensors", ("tabs", "Tensor")),
        1: ("inputs", ("vec", "i32")),
        2: ("outputs", ("vec", "i32")),
        3: ("operators", ("tabs", "Operator")),
        4: ("name", "str"),
    },
    "Tensor": {
        0: ("shape", ("vec", "i32")),
        1: ("type", "i8"),
        2: ("buffer", "u32"),
        3: ("name", "str"),
        4: ("quantization", ("tab", "Quantization")),
        5: ("is_variable", "u8"),
        6: ("sparsity", ("tab", None)),
        7: ("shape_signature", ("vec", "i32")),
    },
    "Quantization": {
        0: ("min", ("vec", "f32")),
        1: ("max", ("vec", "f32")),
        2: ("scale", ("vec", "f32")),
        3: ("zero_point", ("vec", "i64")),
        4: ("details_type", "u8"),
        5: ("details", ("tab", None)),
        6: ("quantized_dimension", "i32"),
    },
    "Operator": {
        0: ("opcode_index", "u32"),
        1: ("inputs", ("vec", "i32")),
        2: ("outputs", ("vec", "i32")),
        3: ("builtin_options_type", "u8"),
        4: ("builtin_options", ("tab", None)),
        5: ("custom_options", ("vec", "u8")),
        6: ("custom_options_format", "i8"),
        7: ("mutating_variable_inputs", ("vec", "u8")),
        8: ("intermediates", ("vec", "i32")),
    },
    "Buffer": {0: ("data", ("vec", "u8")), 1: ("offset", "u64"), 2: ("size", "u64")},
    "Metadata": {0: ("name", "str"), 1: ("buffer", "u32")},
    "SignatureDef": {
        0: ("inputs", ("tabs", "TensorMap")),
        1: ("outputs", ("tabs", "TensorMap")),
        2: ("signature_key", "str"),
        4: ("subgraph_index", "u32"),
    },
    "TensorMap": {0: ("name", "str"), 1: ("tensor_index", "u32")},
}
_WIDTH = {"u8": 1, "i8": 1, "u16": 2, "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8}


@dataclasses.dataclass(frozen=True)
class Field:
    """A structural position of a file: ``kind`` is a scalar format of _WIDTH, or "uoffset"
    (a uoffset32 to a table, vector or string), "soffset" (a table's offset to its vtable),
    "veclen" (a vector's length), "vt16" (a vtable entry) or "scalar" (a builtin option of
    unknown width)."""

    pos: int
    kind: str
    label: str


class _Walker:
    """The structural positions (:class:`Field`) and byte vectors (start, length, label) of
    a valid TFLite flatbuffer, found by walking it with :data:`_SCHEMA` (independently of
    the reader under test)."""

    def __init__(self, data: bytes):
        self.d = data
        self.fields: dict[int, Field] = {}
        self.regions: list[tuple[int, int, str]] = []
        self._tables: set = set()

    def _u(self, fmt: str, pos: int) -> int:
        return struct.unpack_from("<" + fmt, self.d, pos)[0]

    def _add(self, pos: int, kind: str, label: str) -> None:
        self.fields.setdefault(pos, Field(pos, kind, label))

    def _offset(self, pos: int, label: str) -> int:
        self._add(pos, "uoffset", label)
        return pos + self._u("I", pos)

    def table(self, pos: int, schema, label: str) -> None:
        if (pos, schema) in self._tables:
            return
        self._tables.add((pos, schema))
        self._add(pos, "soffset", f"{label}.<vtable offset>")
        vt = pos - self._u("i", pos)
        vt_size = self._u("H", vt)
        self._add(vt, "vt16", f"{label}.<vtable size>")
        self._add(vt + 2, "vt16", f"{label}.<table size>")
        fields = _SCHEMA.get(schema, {}) if schema else {}
        for i in range((vt_size - 4) // 2):
            name, kind = fields.get(i, (f"field{i}", "scalar"))
            self._add(vt + 4 + 2 * i, "vt16", f"{label}.<vtable entry {i}: {name}>")
            off = self._u("H", vt + 4 + 2 * i)
            if off == 0:
                continue
            at, lab = pos + off, f"{label}.{name}"
            if kind == "scalar":
                self._add(at, "i32" if at % 4 == 0 else "u8", lab)
            elif isinstance(kind, str) and kind != "str":
                self._add(at, kind, lab)
            elif kind == "str" or kind[0] == "vec":
                v = self._offset(at, lab)
                n = self._u("I", v)
                self._add(v, "veclen", f"{lab}.<length>")
                elem = "u8" if kind == "str" else kind[1]
                if elem == "u8":
                    if n:
                        self.regions.append((v + 4, n, lab))
                else:
                    for k in range(min(n, 64)):
                        self._add(v + 4 + k * _WIDTH[elem], elem, f"{lab}[{k}]")
            elif kind[0] == "tab":
                self.table(self._offset(at, lab), kind[1], lab)
            else:  # a vector of tables
                v = self._offset(at, lab)
                self._add(v, "veclen", f"{lab}.<length>")
                for k in range(self._u("I", v)):
                    e = v + 4 + 4 * k
                    self.table(self._offset(e, f"{lab}[{k}]"), kind[1], f"{lab}[{k}]")


_STRUCTURE: dict[str, tuple[list[Field], list[tuple[int, int, str]]]] = {}


def original(name: str) -> bytes:
    return (DATA / name).read_bytes()


def structure(name: str) -> tuple[list[Field], list[tuple[int, int, str]]]:
    """The structural positions and byte vectors of corpus file ``name`` (cached)."""
    if name not in _STRUCTURE:
        data = original(name)
        w = _Walker(data)
        w._add(0, "uoffset", "<root>")
        w.table(struct.unpack_from("<I", data, 0)[0], "Model", "model")
        _STRUCTURE[name] = (sorted(w.fields.values(), key=lambda f: f.pos), w.regions)
    return _STRUCTURE[name]


def field_groups(name: str) -> dict[str, list[Field]]:
    """The structural positions of ``name`` by group: the kind for the flatbuffer's own
    offsets, lengths and vtable entries; else the field's name without indices and its
    table's (``tensors.shape``, ``operators.inputs``, ``quantization.scale``,
    ``builtin_options.field2`` ...), so that each sort of field is mutated as often."""
    if name not in _GROUPS:
        groups: dict[str, list[Field]] = {}
        for f in structure(name)[0]:
            key = f.kind if f.kind in ("uoffset", "soffset", "veclen", "vt16") else None
            key = key or ".".join(re.sub(r"\[\d+\]", "", f.label).split(".")[-2:])
            groups.setdefault(key, []).append(f)
        _GROUPS[name] = groups
    return _GROUPS[name]


_GROUPS: dict[str, dict[str, list[Field]]] = {}

# ------------------------------------------------------------------------------ mutations

_SMALL32 = (0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000)
_EXTREME32 = _SMALL32 + (0x1000000, 0x3FFFFFFF, 0x40000000, 0x7FFFFFFF, 0x80000000, 0xFFFFFF80, 0xFFFFFFFE, 0xFFFFFFFF)
#: flexbuffer bytes: packed types (type << 2 | log2 width) of ints, floats, keys, strings, maps,
#: vectors, typed vectors, blobs, bools; byte widths; small offsets
_FLEX_BYTES = tuple((t << 2) | w for t in (0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 14, 25, 26, 36) for w in range(4)) + tuple(
    range(9)
)
_I64 = (0, 1, -1, 127, 128, -128, -129, 255, 1 << 31, -(1 << 31) - 1, (1 << 63) - 1, -(1 << 63))
_F32 = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-38, 3.4e38, -1.0, 1.0, 1e-10, 1e10, 2.0**-32)


def _value32(rng: random.Random, n: int, pos: int, orig: int) -> int:
    """An extreme 32-bit word for position ``pos`` of an ``n``-byte file holding ``orig``."""
    pick = rng.random()
    if pick < 0.6:
        return rng.choice(_EXTREME32)
    if pick < 0.8:  # sizes and offsets of this file: its length, past its end, its last word
        return rng.choice((n, n - 4, n + 4, n // 2, n // 4, n - pos, n - pos - 4, n - pos + 4)) & 0xFFFFFFFF
    if pick < 0.95:  # the value nudged
        return (orig + rng.choice((-4, -2, -1, 1, 2, 4, 8, 0x100))) & 0xFFFFFFFF
    return rng.getrandbits(32)


def _write_field(rng: random.Random, buf: bytearray, f: Field) -> str:
    n = len(buf)
    if f.kind in ("uoffset", "soffset", "veclen", "i32", "u32"):
        orig = struct.unpack_from("<I", buf, f.pos)[0]
        v = _value32(rng, n, f.pos, orig)
        if f.kind == "soffset" and rng.random() < 0.3:  # the vtable at byte 0, or just before the table
            v = rng.choice((f.pos, 4, (f.pos - n) & 0xFFFFFFFF, 0xFFFFFFFC))
        struct.pack_into("<I", buf, f.pos, v)
        return f"{f.label} @{f.pos:#x} = {v:#x}"
    if f.kind in ("u8", "i8"):
        v = rng.choice(
            (0, 1, 2, 0x7F, 0x80, 0xFF, (buf[f.pos] + 1) & 0xFF, (buf[f.pos] - 1) & 0xFF, rng.getrandbits(8))
        )
        buf[f.pos] = v
        return f"{f.label} @{f.pos:#x} = {v:#x} (byte)"
    if f.kind == "vt16":
        orig = struct.unpack_from("<H", buf, f.pos)[0]
        v = rng.choice((0, 1, 2, 4, 0x8000, 0xFFFE, 0xFFFF, orig + 2, orig - 2, orig + 4, rng.getrandbits(16)))
        v &= 0xFFFF
        struct.pack_into("<H", buf, f.pos, v)
        return f"{f.label} @{f.pos:#x} = {v:#x} (16-bit)"
    if f.kind == "f32":
        v = rng.choice(_F32)
        struct.pack_into("<f", buf, f.pos, v)
        return f"{f.label} @{f.pos:#x} = {v!r} (float32)"
    if f.kind == "i64":
        v = rng.choice(_I64)
        struct.pack_into("<q", buf, f.pos, v)
        return f"{f.label} @{f.pos:#x} = {v} (int64)"
    if f.kind == "u64":
        v = rng.choice((0, 1, 1 << 32, 1 << 63, (1 << 64) - 1, n))
        struct.pack_into("<Q", buf, f.pos, v)
        return f"{f.label} @{f.pos:#x} = {v:#x} (uint64)"
    raise AssertionError(f.kind)


def _one(rng: random.Random, name: str, buf: bytearray) -> str:
    """Applies one length-preserving mutation to ``buf``; returns its description."""
    n = len(buf)
    kind = rng.choices(("flip", "flips", "word", "field", "region", "swap", "dup"), (10, 8, 15, 40, 15, 6, 6))[0]
    if kind == "flip":
        p, m = rng.randrange(n), rng.randrange(1, 256)
        buf[p] ^= m
        return f"flip @{p:#x} ^= {m:#x}"
    if kind == "flips":
        ps = sorted(rng.sample(range(n), rng.randint(2, 32)))
        for p in ps:
            buf[p] = rng.getrandbits(8)
        return f"flips @{[hex(p) for p in ps]}"
    if kind == "word":
        p = 4 * rng.randrange(n // 4)
        v = _value32(rng, n, p, struct.unpack_from("<I", buf, p)[0])
        struct.pack_into("<I", buf, p, v)
        return f"word @{p:#x} = {v:#x}"
    if kind == "field":  # a group of like fields first (all shape entries, all vtable entries ...), then one
        groups = field_groups(name)
        return "field " + _write_field(rng, buf, rng.choice(groups[rng.choice(sorted(groups))]))
    if kind == "region":
        _, regions = structure(name)
        # the XC operators' flexbuffer options most often: their parser is reached only through them
        custom = [r for r in regions if r[2].endswith("custom_options")]
        start, length, label = rng.choice(custom if custom and rng.random() < 0.6 else regions)
        if length >= 4 and rng.random() < 0.5:
            p = start + rng.randrange(length - 3)
            v = _value32(rng, n, p, struct.unpack_from("<I", buf, p)[0])
            struct.pack_into("<I", buf, p, v)
            return f"region {label} word @{p:#x} = {v:#x}"
        ps = sorted(rng.sample(range(start, start + length), min(length, rng.randint(1, 4))))
        for p in ps:  # in a flexbuffer, often a packed type byte, a byte width or a small offset
            flex = label.endswith("custom_options") and rng.random() < 0.5
            buf[p] = rng.choice(_FLEX_BYTES) if flex else rng.getrandbits(8)
        return f"region {label} bytes @{[hex(p) for p in ps]} = {[hex(buf[p]) for p in ps]}"
    ln = 4 * rng.randint(1, min(16, n // 8))
    a, b = 4 * rng.randrange((n - ln) // 4), 4 * rng.randrange((n - ln) // 4)
    if kind == "swap":
        if abs(a - b) < ln:
            b = (a + ln) if a + 2 * ln <= n else a - ln
        buf[a : a + ln], buf[b : b + ln] = bytes(buf[b : b + ln]), bytes(buf[a : a + ln])
        return f"swap {ln} bytes @{a:#x} <-> @{b:#x}"
    buf[b : b + ln] = bytes(buf[a : a + ln])
    return f"dup {ln} bytes @{a:#x} -> @{b:#x}"


def mutate(name: str, seed: int) -> tuple[bytes, str]:
    """Case ``(name, seed)``: the mutated bytes of corpus file ``name`` and a description."""
    rng = random.Random(f"{name}:{seed}")
    buf = bytearray(original(name))
    pick = rng.random()
    if pick < 0.08:
        k = rng.randrange(len(buf))
        return bytes(buf[:k]), f"truncate to {k} of {len(buf)} bytes"
    if pick < 0.23:
        desc = "multi: " + "; ".join([_one(rng, name, buf) for _ in range(rng.randint(2, 4))])
    else:
        desc = _one(rng, name, buf)
    return bytes(buf), desc


# ------------------------------------------------------------------------------ the checks


class _Timeout(BaseException):
    """Raised by the SIGALRM handler (a BaseException: no ``except Exception`` stops it)."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _vm_size() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _address_space_limit(headroom: int):
    """A soft RLIMIT_AS of the current size plus ``headroom`` (Linux; else nothing)."""
    size = _vm_size()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if size is None or (soft != resource.RLIM_INFINITY and soft <= size + headroom):
        yield
        return
    limit = size + headroom if hard == resource.RLIM_INFINITY else min(size + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _peak_allocation(out: list):
    """Appends the peak of traced (Python and NumPy) allocations of the block to ``out``."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        yield
    finally:
        out.append(tracemalloc.get_traced_memory()[1] - base)
        if not tracing:
            tracemalloc.stop()


def load_bound(n: int) -> int:
    return LOAD_BYTES_PER_FILE_BYTE * n + LOAD_BYTES_FIXED


_NP_DTYPES = {"int8": np.int8, "uint8": np.uint8, "float32": np.float32}


@dataclasses.dataclass
class Outcome:
    """``status``: "rejected" (load raised a HwjaxError), "loaded" (not run), "too big to run",
    "ran", "run rejected" (run raised a HwjaxError) or "FAIL"; ``detail``: the error or the
    traceback."""

    status: str
    detail: str = ""
    peak: int = 0
    #: of a non-hwjax exception: (its type, the innermost hwjax frame as "path:function")
    signature: tuple = ()

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def check_bytes(data: bytes, runtime: str | None) -> Outcome:
    """Loads ``data`` and, when it loads and ``runtime`` is given, runs one example of zeros."""
    peak: list[int] = []
    out = _check(data, runtime, peak)
    if peak:
        out.peak = peak[0]
        if peak[0] > load_bound(len(data)):  # (also when the load raised: it allocated first)
            out = Outcome(
                "FAIL",
                f"load allocated {peak[0]:,} bytes at its peak, over the bound {load_bound(len(data)):,} "
                f"for a {len(data):,}-byte file ({out.status}: {out.detail})",
                peak[0],
            )
    return out


def _check(data: bytes, runtime: str | None, peak: list) -> Outcome:
    phase = "load"
    try:
        with _address_space_limit(AS_HEADROOM):
            with _time_limit(LOAD_SECONDS), _peak_allocation(peak):
                model = hwjax.tflite.load(data)
            for info in model.inputs:
                if any(d < 0 for d in info.shape):
                    return Outcome("FAIL", f"loaded with input {info.name!r} of negative shape {info.shape}")
            if runtime is None:
                return Outcome("loaded")
            sizes = [int(np.prod(t.shape, dtype=object)) for t in model.graph.tensors.values()]
            if max(sizes, default=0) > RUN_MAX_ELEMENTS:
                return Outcome("too big to run")
            x = [np.zeros((1, *info.shape[1:]), _NP_DTYPES.get(info.dtype, np.int8)) for info in model.inputs]
            phase = "run"
            with _time_limit(RUN_SECONDS):
                model.run(x[0] if len(x) == 1 else x, runtime=runtime)
            return Outcome("ran")
    except HwjaxError as e:
        return Outcome("rejected" if phase == "load" else "run rejected", f"{type(e).__name__}: {e}")
    except _Timeout:
        limit = LOAD_SECONDS if phase == "load" else RUN_SECONDS
        return Outcome("FAIL", f"{phase} ran past its {limit:g} s limit (a hang?)\n{traceback.format_exc()}")
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f"{os.sep}hwjax{os.sep}" in f.filename]
        where = f"{frames[-1].filename.rsplit(os.sep + 'hwjax' + os.sep, 1)[1]}:{frames[-1].name}" if frames else ""
        return Outcome(
            "FAIL",
            f"{phase} raised a non-hwjax exception\n{traceback.format_exc()}",
            signature=(type(e).__name__, where),
        )


def run_case(name: str, seed: int, run: bool = True) -> Outcome:
    """Replays case ``(name, seed)`` (run on the file's runtime when ``run``)."""
    data, desc = mutate(name, seed)
    out = check_bytes(data, RUNTIME[name] if run else None)
    if out.failed:
        out.detail = f"{name} seed {seed}: {desc}\n{out.detail}"
    return out


def _fuzz(seeds, run_when) -> None:
    """Runs case ``(CORPUS[k % len(CORPUS)], seed)`` for each ``(k, seed)``; runs the loaded
    mutant when ``run_when(k, loaded_so_far)``; fails with every failing case."""
    known = [(r.signature, k) for k, r in REGRESSIONS.items() if r.signature and not r.fixed]
    failures, counts, loaded = [], {}, 0
    t0 = time.perf_counter()
    for k, seed in seeds:
        name = CORPUS[k % len(CORPUS)][0]
        out = run_case(name, seed, run=False)
        if out.status == "loaded":
            loaded += 1
            if run_when(k, loaded):
                out = run_case(name, seed, run=True)
        status = out.status
        for (kind, where), reg in known if out.failed else ():
            if out.signature and out.signature[0] == kind and out.signature[1].startswith(where):
                status = f"known crash {reg}"
        counts[status] = counts.get(status, 0) + 1
        if status == "FAIL":
            failures.append(out)
    print(f"\nfuzz: {sum(counts.values())} cases in {time.perf_counter() - t0:.1f} s: {counts}")
    if failures:
        kinds = collections.Counter(f.signature or f.detail.split("\n")[1] for f in failures)
        shown = "\n\n".join(f.detail for f in failures[:8])
        pytest.fail(
            f"{len(failures)} of {sum(counts.values())} mutated files failed ({dict(kinds)}):\n\n{shown}", pytrace=False
        )


# ------------------------------------------------------------------------------ regressions


@dataclasses.dataclass(frozen=True)
class Regression:
    """A crash the fuzzer found, as the smallest mutation of a corpus file that reproduced
    it: ``patches`` of ``(label, offset, format, value)``: the value packed little-endian at
    the structural position ``label`` (a :class:`Field`'s, or a byte vector's start) plus
    ``offset``. ``run``: the crash was in the run (the mutant is run on the file's runtime).
    ``fixed``: where (the case must now load or raise a HwjaxError); None: not fixed yet
    (xfail, strict: the test fails once it passes, to be turned into a fixed case)."""

    file: str
    patches: tuple
    run: bool
    crash: str
    fixed: str | None
    #: of a crash not fixed yet: its Outcome.signature (the function, or a prefix of it); the
    #: fuzz tests count the mutants that crash so as known, not as failures (once it is fixed,
    #: the regression case fails until it is marked fixed, which ends that)
    signature: tuple = ()


REGRESSIONS = {
    "conv_zero_input_channels": Regression(
        "xformer/chain.tflite",
        (("model.subgraphs[0].tensors[3].shape[3]", 0, "<i", 0),),
        False,
        "ZeroDivisionError in tflite/_convert.py _conv (DEPTHWISE_CONV_2D: filter channels // input channels 0)",
        "_import.py: Builder.act refuses activation tensors without elements (UnsupportedOpError)",
    ),
    "no_model_inputs": Regression(
        "keras/mlp_sigmoid.tflite",  # the subgraph's vtable moved: no inputs, outputs or operators read
        (("model.subgraphs[0].<vtable offset>", 0, "<I", 2),),
        True,
        "a model without inputs loaded; Model.run: IndexError in graph/_run.py _jit_run (xs[0].shape)",
        "_import.py: read refuses a subgraph without inputs or outputs (FormatError)",
    ),
    "no_model_inputs_empty_vtable": Regression(
        "xformer/add.xc.tflite",
        (("model.subgraphs[0].<vtable size>", 0, "<H", 0),),
        True,
        "as no_model_inputs",
        "as no_model_inputs",
    ),
    "denormal_activation_scale": Regression(
        "keras/mlp_sigmoid.tflite",  # 7.9e-42: read as 0 by the lowering's XLA program
        (("model.subgraphs[0].tensors[7].quantization.scale[0]", 0, "<I", 0x161C),),
        True,
        "Model.run: jax's JaxRuntimeError (a ValueError) 'CpuCallback error' wrapping the LOGISTIC table "
        "recipe's RangeError 's_in must be finite and > 0' (raised inside jax.pure_callback)",
        "_import.py: Builder.act refuses activation scales that are not positive normal float32 (FormatError)",
    ),
    "activation_zero_point_out_of_range": Regression(
        "keras/mlp_sigmoid.tflite",  # the LOGISTIC's output
        (("model.subgraphs[0].tensors[12].quantization.zero_point[0]", 0, "<q", 1000),),
        True,
        "Model.run: JaxRuntimeError wrapping the table recipe's RangeError 'z_out must lie in [-128, 255]' "
        "(a zero point of 2**40 was silently wrapped to 0 by np.int32)",
        "_import.py: Builder.act refuses zero points outside the tensor's int8/uint8 range (FormatError)",
    ),
    "flexbuffer_self_reference": Regression(
        "xformer/chain.xc.tflite",  # a type byte of XC_pad's options map: a map whose value is itself
        (("model.subgraphs[0].operators[1].custom_options", 66, "<B", 0x26),),
        False,
        "RecursionError in tflite/_xcore.py _value (flex_loads follows a cycle of flexbuffer offsets)",
        "tflite/_xcore.py _value: FormatError past 16 nested levels",
        ("RecursionError", "tflite/_xcore.py:"),  # (_value, _uint or _int: where the stack ran out)
    ),
    "xc_option_of_another_type": Regression(
        "keras_mcu/mlp_sigmoid.xc.tflite",  # XC_conv2d_v2's 'mp' struct (a string) read as an int
        (("model.subgraphs[0].operators[0].custom_options", 144, "<I", 4),),
        False,
        "TypeError in tflite/_xcore.py _conv2d_v2: len(opts['mp']) of an int",
        "tflite/_xcore.py _conv2d_v2: a non-bytes 'mp' goes to _struct's FormatError",
        ("TypeError", "tflite/_xcore.py:_conv2d_v2"),
    ),
    "xc_add_output_shape": Regression(
        "xformer/add.xc.tflite",
        (("model.subgraphs[0].tensors[5].shape[3]", 0, "<i", 9),),
        True,
        "Model.run (xs3): TypeError in targets/_xs3_runtime.py _shaped (XC_add's out_shape (4, 4, 9) holds "
        "more values than its (4, 4, 8) inputs; neither the converter nor xc_add's infer checks it)",
        "graph/ops/xcore.py: element-wise XC ops check their shapes (ShapeError at load)",
        ("TypeError", "targets/_xs3_runtime.py:_shaped"),
    ),
    "xc_lookup_output_shape": Regression(
        "keras_mcu/mlp_sigmoid.xc.tflite",
        (("model.subgraphs[0].tensors[19].shape[1]", 0, "<i", 0x7F),),
        True,
        "Model.run (xs3): TypeError in targets/_xs3_runtime.py _shaped (XC_lookup's out_shape (127,) for a "
        "(10,) input)",
        "graph/ops/xcore.py: element-wise XC ops check their shapes (ShapeError at load)",
        ("TypeError", "targets/_xs3_runtime.py:_shaped"),
    ),
}


def regression_bytes(r: Regression) -> bytes:
    fields, regions = structure(r.file)
    at = {f.label: f.pos for f in fields} | {label: start for start, _, label in regions}
    buf = bytearray(original(r.file))
    for label, offset, fmt, value in r.patches:
        struct.pack_into(fmt, buf, at[label] + offset, value)
    return bytes(buf)


# ------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("name", [n for n, _ in CORPUS])
def test_corpus_loads_runs_and_stays_in_bounds(name):
    """The unmutated files load within the allocation bound and run (also warms the imports
    and caches of a load, so that they do not count towards the mutants' peaks)."""
    out = check_bytes(original(name), RUNTIME[name])
    assert out.status == "ran", out.detail
    fields, regions = structure(name)
    assert len(fields) > 50 and regions


def test_the_guards_catch_hangs_allocations_and_other_exceptions(monkeypatch):
    """The harness itself: a load that loops, one that allocates past the bound and one that
    raises a builtin exception fail; a HwjaxError is a rejection."""
    from hwjax.errors import FormatError

    def hang(data):
        while True:
            pass

    def hog(data):
        return np.ones(load_bound(len(data)) + 1, np.uint8).sum()  # (then fails: not a Model)

    def foreign(data):
        raise TypeError("boom")

    def refuse(data):
        raise FormatError("bad file")

    monkeypatch.setattr(sys.modules[__name__], "LOAD_SECONDS", 0.2)
    data = original(CORPUS[0][0])
    for fn, want in ((hang, "ran past its 0.2 s limit"), (hog, "load allocated"), (foreign, "TypeError: boom")):
        monkeypatch.setattr(hwjax.tflite, "load", fn)
        out = check_bytes(data, None)
        assert out.failed and want in out.detail, out
    monkeypatch.setattr(hwjax.tflite, "load", refuse)
    assert check_bytes(data, None).status == "rejected"


def test_mutated_models_load_or_raise_hwjax_errors():
    """QUICK_CASES mutants loaded; the first RUN_QUICK that load are also run."""
    _fuzz(((k, SEED_BASE + k) for k in range(QUICK_CASES)), lambda k, loaded: loaded <= RUN_QUICK)


@pytest.mark.slow
def test_mutated_models_load_or_raise_hwjax_errors_many():
    """SLOW_CASES mutants (other seeds than the quick test's) loaded; one in SLOW_RUN_EVERY of
    those that load is also run."""
    _fuzz(
        ((k, SEED_BASE + 1_000_000 + k) for k in range(SLOW_CASES)),
        lambda k, loaded: loaded % SLOW_RUN_EVERY == 0,
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(k, marks=() if r.fixed else pytest.mark.xfail(strict=True, reason=f"not fixed: {r.crash}"))
        for k, r in REGRESSIONS.items()
    ],
)
def test_regressions(case):
    """Each crash the fuzzer found, replayed: it must load or raise a HwjaxError."""
    r = REGRESSIONS[case]
    out = check_bytes(regression_bytes(r), RUNTIME[r.file] if r.run else None)
    assert not out.failed, f"{case} ({r.crash}):\n{out.detail}"
    assert out.status in ("rejected", "run rejected"), out  # each of these mutants is broken
