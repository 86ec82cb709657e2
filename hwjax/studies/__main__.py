"""``python -m hwjax.studies <name> [options]``: run one entry of ``STUDIES``."""

from __future__ import annotations

import sys

from hwjax._cli import dispatch
from hwjax.studies import STUDIES


def main(argv: list[str] | None = None) -> int:
    return dispatch("hwjax.studies", STUDIES, argv)


if __name__ == "__main__":
    sys.exit(main())
