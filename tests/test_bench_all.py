"""``python -m hwjax.bench all``: the page it writes, its option checks, and (slow) a smoke run of every bench."""

import subprocess
import sys

import pytest

from hwjax.bench import BENCHES
from hwjax.bench import _all as A


def test_registered_and_every_bench_described():
    assert BENCHES["all"] == "hwjax.bench._all"
    assert set(A.ABOUT) == set(A.QUICK_ARGS) == set(BENCHES) - {"all"}


def test_markdown_page_names_the_machine_and_each_bench():
    info = {"processor": "CPU X", "cores": "2", "memory": "24 GiB", "python": "3.11", "jax": "0.1 (cpu: cpu)"}
    page = A.markdown([("mac", [], 0, "table of mac", 3.0), ("xs3", ["--batch", "4"], 1, "boom", 1.0)], info)
    assert page.startswith("# Benchmarks\n")
    assert "| processor | CPU X |" in page and "| jax | 0.1 (cpu: cpu) |" in page
    assert "## mac" in page and "`python -m hwjax.bench mac` (3 s)" in page and "table of mac" in page
    assert "`python -m hwjax.bench xs3 --batch 4` (1 s)" in page and "**Failed (exit code 1).**" in page
    assert "session" not in page.lower()


def test_machine_describes_this_one():
    info = A.machine()
    assert set(info) == {"processor", "cores", "memory", "python", "jax"} and all(info.values())


def test_unknown_bench_is_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        A.main(["--only", "mac,nope"])
    assert e.value.code == 2
    assert "--only: unknown benchmarks ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_every_bench_runs_in_its_quick_form(tmp_path):
    out = tmp_path / "BENCH.md"
    r = subprocess.run(
        [sys.executable, "-m", "hwjax.bench", "all", "--quick", "--markdown", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    page = out.read_text()
    assert all(f"## {name}" in page for name in A.ABOUT) and "**Failed" not in page
