"""``python -m hwjax.bench <name> [options]``: run one benchmark and print ratios."""

from __future__ import annotations

import importlib
import sys

from hwjax.bench import BENCHES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m hwjax.bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
