"""Differential run of hwjax.onnx against live ONNX Runtime on tests/randonnx.py's random models.

    python scripts/onnx_fuzz.py static 100 300   # quantize_static models, seeds 100..299
    python scripts/onnx_fuzz.py qop 100 250      # QOperator models

Prints one line per seed (exact / refused / MISMATCH) and the counts per quantisation
setting; the exit status is 1 when any value differs.
"""

from __future__ import annotations

import collections
import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hwjax.onnx as ho
from hwjax.errors import UnsupportedOpError
from tests import randonnx as R


def main(kind: str, start: int, stop: int) -> int:
    logging.disable(logging.WARNING)
    counts: dict = collections.defaultdict(collections.Counter)
    bad_total = 0
    for seed in range(start, stop):
        if kind == "static":
            data, x, desc = R.model(seed)
            setting = desc.split("(")[1].split(")")[0]
        else:
            data, x, desc = R.qop_model(seed)
            setting = desc.split()[3]
        ref = R.ort_run(data, x)
        try:
            y = np.asarray(ho.load(data).run(x))
        except UnsupportedOpError as e:
            counts[setting]["refused"] += 1
            print(seed, "refused:", str(e)[:160], flush=True)
            continue
        a = y.view(np.int32) if y.dtype == np.float32 else y.astype(np.int64)
        b = ref.view(np.int32) if ref.dtype == np.float32 else ref.astype(np.int64)
        bad = int((a != b).sum()) if a.shape == b.shape else a.size
        bad_total += bad
        counts[setting]["exact" if bad == 0 else "MISMATCH"] += 1
        counts[setting]["values"] += ref.size
        print(seed, "exact" if bad == 0 else f"MISMATCH {bad} of {ref.size}: {desc}", flush=True)
    for setting, c in sorted(counts.items()):
        print(f"{setting}: {dict(c)}")
    return 1 if bad_total else 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("static", "qop"):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
