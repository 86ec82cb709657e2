"""``python -m hwjax.bench <name> [options]``: run one entry of ``BENCHES``."""

from __future__ import annotations

import sys

from hwjax._cli import dispatch
from hwjax.bench import BENCHES


def main(argv: list[str] | None = None) -> int:
    return dispatch("hwjax.bench", BENCHES, argv)


if __name__ == "__main__":
    sys.exit(main())
