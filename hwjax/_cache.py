"""hwjax's default for JAX's persistent compilation cache.

A model's program takes seconds to compile on CPU (a whole network's integer pipeline),
and the same model is usually run again in a later process. So, on import, hwjax points
JAX's persistent compilation cache at a folder in the user's cache directory, unless
JAX already has one or the user said otherwise:

* ``HWJAX_COMPILATION_CACHE=0`` (or ``false``/``off``): hwjax leaves JAX's configuration alone;
* ``HWJAX_COMPILATION_CACHE=/some/folder``: that folder;
* otherwise ``$XDG_CACHE_HOME/hwjax/jax`` (``~/.cache/hwjax/jax``).

It does nothing when ``JAX_COMPILATION_CACHE_DIR`` / ``jax_compilation_cache_dir`` is set
or ``jax_enable_compilation_cache`` is false. Programs that took at least 0.1 s to
compile are kept (JAX's default keeps those over 1 s). A cached program is the same
program, so results do not change; only the time to the first result does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import jax

ENV = "HWJAX_COMPILATION_CACHE"
MIN_COMPILE_SECONDS = 0.1


def default_cache_dir() -> Optional[str]:
    """The folder hwjax would use (None when ``HWJAX_COMPILATION_CACHE`` turns it off)."""
    v = os.environ.get(ENV, "").strip()
    if v.lower() in ("0", "false", "off", "no"):
        return None
    if v and v.lower() not in ("1", "true", "on", "yes"):
        return v
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "hwjax" / "jax")


def enable_compilation_cache(path: Optional[str] = None) -> Optional[str]:
    """Points JAX's persistent compilation cache at ``path`` (default
    :func:`default_cache_dir`), keeping programs that took at least
    :data:`MIN_COMPILE_SECONDS` to compile. Returns the folder, or None when turned off by
    ``HWJAX_COMPILATION_CACHE=0``. Call it before the first compilation: JAX reads the
    setting when it first uses the cache."""
    path = default_cache_dir() if path is None else os.fspath(path)
    if path is None:
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    if jax.config.jax_persistent_cache_min_compile_time_secs > MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path


def default_enable() -> None:
    """What ``import hwjax`` does (see the module docstring)."""
    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return
    enable_compilation_cache()
