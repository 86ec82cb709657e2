"""``python -m hwjax.bench <name> [options]``: run one entry of ``BENCHES``."""

from __future__ import annotations

import os
import sys

# Benchmarks time compilation and first results as a user first meets them: no
# persistent compilation cache by default (a benchmark that measures a warm cache sets
# JAX_COMPILATION_CACHE_DIR itself). Set before hwjax is imported; children inherit it.
os.environ.setdefault("HWJAX_COMPILATION_CACHE", "0")

from hwjax._cli import dispatch
from hwjax.bench import BENCHES


def main(argv: list[str] | None = None) -> int:
    return dispatch("hwjax.bench", BENCHES, argv)


if __name__ == "__main__":
    sys.exit(main())
