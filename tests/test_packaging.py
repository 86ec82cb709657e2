"""Packaging: every hwjax package is installed, and no generic top-level names are claimed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_and_models_train_live_under_hwjax():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hwjax").rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert not any(p.split(".")[0] != "hwjax" for p in listed)
    assert cfg["package-dir"] == {"hwjax": "hwjax", "hwjax.models": "models", "hwjax.train": "train"}


def test_the_mapped_packages_import_under_hwjax():
    from hwjax import models
    from hwjax.train import __main__ as cli

    assert "cnn" in models.MODELS and callable(cli.main)
