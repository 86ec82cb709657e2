"""The exceptions hwjax raises at its public boundary.

Every error hwjax raises on purpose is a :class:`HwjaxError`; each also derives from
the builtin exception a caller would expect (``ValueError``, ``TypeError``, ``NotImplementedError``),
so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class HwjaxError(Exception):
    """Base class of every hwjax error."""


class RangeError(HwjaxError, ValueError):
    """An argument is outside its allowed range (the message names both)."""


class ShapeError(HwjaxError, ValueError):
    """An argument has a shape the operation cannot take."""


class FormatError(HwjaxError, ValueError):
    """A model graph, export folder or model file is malformed or inconsistent."""


class ArgTypeError(HwjaxError, TypeError):
    """An argument has a type or dtype the function does not take (the message names it)."""


class FileError(HwjaxError, FileNotFoundError):
    """A file a public function was asked to read is missing or unreadable, or one it was
    asked to write cannot be written (the message names the argument and the path; also a
    FileNotFoundError, hence an OSError)."""


class UnsupportedOpError(HwjaxError, NotImplementedError):
    """An op kind (or an op configuration) that a target or file reader does not support."""


class UnknownOpError(UnsupportedOpError, KeyError):
    """An op kind name that no registry knows (also a KeyError, as registry lookups are)."""

    def __str__(self) -> str:  # the message as given, not KeyError's quoted repr
        return str(self.args[0]) if self.args else ""


__all__ = [
    "ArgTypeError",
    "FileError",
    "FormatError",
    "HwjaxError",
    "RangeError",
    "ShapeError",
    "UnknownOpError",
    "UnsupportedOpError",
]
