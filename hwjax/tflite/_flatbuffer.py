"""A minimal, bounds-checked reader of the TFLite flatbuffer schema (``schema.fbs``,
file identifier ``TFL3``): only the tables and fields the importer reads. Any
malformed offset raises :class:`hwjax.errors.FormatError`."""

from __future__ import annotations

import struct
from typing import Optional

import numpy as np

from hwjax.errors import ArgTypeError, FormatError


class _Buf:
    def __init__(self, data: bytes):
        self.data = data

    def unpack(self, fmt: str, pos: int):
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise FormatError(
                f"truncated or corrupt TFLite flatbuffer: read of {size} bytes at offset {pos} "
                f"outside the {len(self.data)}-byte file"
            )
        return struct.unpack_from("<" + fmt, self.data, pos)[0]


class Table:
    """One flatbuffer table at ``pos``."""

    def __init__(self, buf: _Buf, pos: int):
        self.buf, self.pos = buf, pos
        vt = pos - buf.unpack("i", pos)
        self.vt = vt
        self.vt_size = buf.unpack("H", vt)

    def _field(self, i: int) -> int:
        o = 4 + 2 * i
        if o + 2 > self.vt_size:
            return 0
        return self.buf.unpack("H", self.vt + o)

    def scalar(self, i: int, fmt: str, default=0):
        off = self._field(i)
        return default if off == 0 else self.buf.unpack(fmt, self.pos + off)

    def _target(self, i: int) -> Optional[int]:
        off = self._field(i)
        if off == 0:
            return None
        p = self.pos + off
        return p + self.buf.unpack("I", p)

    def table(self, i: int) -> Optional["Table"]:
        t = self._target(i)
        return None if t is None else Table(self.buf, t)

    def vector_len(self, i: int) -> tuple[Optional[int], int]:
        t = self._target(i)
        if t is None:
            return None, 0
        n = self.buf.unpack("I", t)
        return t + 4, n

    def tables(self, i: int) -> list["Table"]:
        start, n = self.vector_len(i)
        if start is None:
            return []
        out = []
        for k in range(n):
            p = start + 4 * k
            out.append(Table(self.buf, p + self.buf.unpack("I", p)))
        return out

    def array(self, i: int, dtype) -> Optional[np.ndarray]:
        start, n = self.vector_len(i)
        if start is None:
            return None
        dt = np.dtype(dtype).newbyteorder("<")
        end = start + n * dt.itemsize
        if end > len(self.buf.data):
            raise FormatError(
                f"truncated or corrupt TFLite flatbuffer: a vector of {n} {dt} ends at byte {end} "
                f"beyond the {len(self.buf.data)}-byte file"
            )
        return np.frombuffer(self.buf.data, dt, n, start).astype(dt.newbyteorder("="))

    def string(self, i: int) -> str:
        a = self.array(i, np.uint8)
        return "" if a is None else a.tobytes().decode("utf-8", "replace")


def root(data: bytes) -> Table:
    """The ``Model`` table of a TFLite file (FormatError for anything else)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgTypeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < 8:
        raise FormatError(f"not a TFLite model: {len(data)} bytes is too short for a flatbuffer")
    if data[4:8] != b"TFL3":
        raise FormatError(f"not a TFLite model: file identifier is {data[4:8]!r}, expected b'TFL3'")
    buf = _Buf(data)
    return Table(buf, buf.unpack("I", 0))
