"""Datasets for the training demo: scikit-learn's bundled digits, or an ``.npz`` file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """Train and test splits: ``x`` float32 (N, ...), ``y`` int32 (N,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    def limit(self, n_train: Optional[int], n_test: Optional[int] = None) -> "Dataset":
        """The first ``n_train`` / ``n_test`` examples (for quick runs and tests)."""
        nt = n_test if n_test is not None else n_train
        return Dataset(self.x_train[:n_train], self.y_train[:n_train], self.x_test[:nt], self.y_test[:nt], self.name)


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple:
    from sklearn.model_selection import train_test_split

    return train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)


def digits(*, flat: bool = False, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 digits (1797 images, bundled, no download), pixels scaled to
    [0, 1]; images (N, 8, 8, 1), or (N, 64) with ``flat``. Stratified split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    x_tr, x_te, y_tr, y_te = _split(x, d.target.astype(np.int32), test_fraction, seed)
    ds = Dataset(x_tr, y_tr, x_te, y_te, "digits")
    return _flatten(ds) if flat else ds


def _flatten(ds: Dataset) -> Dataset:
    f = lambda a: a.reshape(a.shape[0], -1)
    return Dataset(f(ds.x_train), ds.y_train, f(ds.x_test), ds.y_test, ds.name)


def from_npz(path, *, flat: bool = False, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """An ``.npz`` with ``x_train, y_train, x_test, y_test`` or with ``x, y`` (then split).

    ``x`` holds float images (N, H, W[, C]) or vectors (N, D); integer ``x`` is scaled
    by its maximum into [0, 1].
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--data file {p} not found")
    z = np.load(p)
    keys = set(z.files)
    if {"x_train", "y_train", "x_test", "y_test"} <= keys:
        parts = [z["x_train"], z["y_train"], z["x_test"], z["y_test"]]
    elif {"x", "y"} <= keys:
        x_tr, x_te, y_tr, y_te = _split(z["x"], z["y"], test_fraction, seed)
        parts = [x_tr, y_tr, x_te, y_te]
    else:
        raise ValueError(f"{p} must contain x_train, y_train, x_test, y_test or x, y; it has {sorted(keys)}")
    xs = [np.asarray(a) for a in parts[0::2]]
    scale = max(float(a.max()) for a in xs) if np.issubdtype(xs[0].dtype, np.integer) else 1.0
    xs = [a.astype(np.float32) / scale for a in xs]
    xs = [a[..., None] if a.ndim == 3 else a for a in xs]
    ds = Dataset(xs[0], parts[1].astype(np.int32), xs[1], parts[3].astype(np.int32), p.stem)
    return _flatten(ds) if flat else ds
