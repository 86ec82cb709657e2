"""``python -m hwjax.studies <name> [options]``: run one study."""

from __future__ import annotations

import importlib
import sys

from hwjax.studies import STUDIES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in STUDIES:
        print(f"usage: python -m hwjax.studies {{{','.join(STUDIES)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(STUDIES[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
