"""``python -m hwjax.<tool> <name> [options]``: run one entry of a name -> module registry."""

from __future__ import annotations

import importlib
import sys


def dispatch(prog: str, registry: dict[str, str], argv: list[str] | None) -> int:
    """Runs ``main(rest)`` of the module ``registry[argv[0]]``; exit code 2 with a usage
    line naming the choices for an unknown or missing name."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in registry:
        print(f"usage: python -m {prog} {{{','.join(registry)}}} [options]", file=sys.stderr)
        return 2
    return int(importlib.import_module(registry[argv[0]]).main(argv[1:]) or 0)
