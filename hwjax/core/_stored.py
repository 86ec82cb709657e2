"""Compiled programs kept between processes: a traced program stored on disk.

JAX's persistent compilation cache saves the compile, but every new process still traces
and lowers a model's program before it can look the compile up: a second or two for a
whole network. :func:`stored_program` keeps the traced program itself
(:mod:`jax.export`, serialised StableHLO) next to JAX's cache, so a later process
deserialises it, and JAX's cache answers the compile.

The stored program is the program the traced function gives: the same StableHLO, so the
same compiled code and the same bits. It is found again only under the same key: the
caller's key (what determines the program, e.g. a model file's digest, the runtime and
options), the arguments' structure, shapes and dtypes, the backend, the versions of
jax and jaxlib, and a digest of hwjax's own source files (a changed kernel is never
answered by an old program).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

ENV = "HWJAX_STORED_PROGRAMS"
SUBFOLDER = "hwjax-programs"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 over hwjax's Python source files (relative paths and contents)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def program_folder() -> Optional[Path]:
    """Where programs are stored: ``hwjax-programs`` inside JAX's persistent compilation
    cache folder; None when JAX has none (or ``HWJAX_STORED_PROGRAMS=0``)."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "false", "off", "no"):
        return None
    folder = jax.config.jax_compilation_cache_dir
    if not folder or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(folder) / SUBFOLDER


_LOADED: dict[str, Callable[..., Any]] = {}


def stored_program(fn: Callable[..., Any], args: tuple, key: Sequence[Any]) -> Optional[Callable[[], Any]]:
    """``fn(*args)`` through a program stored on disk: returns a thunk giving that value,
    or None where programs are not stored (:func:`program_folder`) or ``fn`` cannot be
    exported (the caller then calls ``fn`` itself).

    ``args``: a pytree of arrays (traced as arguments, never baked into the program);
    ``key``: values whose ``repr`` determines ``fn``'s program beyond the arguments'
    structure (the ``repr`` of their pytree definition: static fields included), shapes and
    dtypes, e.g. ``fn``'s name and static options. The first call of a key traces and stores the program; later calls, in this
    process or another, deserialise it (once per process)."""
    folder = program_folder()
    if folder is None:
        return None
    leaves, treedef = jax.tree.flatten(args)
    if any(isinstance(a, jax.core.Tracer) for a in leaves):
        return None  # inside the caller's own trace: its program, not a stored one
    structure = str(treedef)  # the static fields of the arguments' pytree nodes (a graph's ops, attributes, target)
    if "0x" in structure or "..." in structure:
        return None  # an object without a faithful repr (an address, a truncated array): no stable key
    avals = [jax.ShapeDtypeStruct(np.shape(a), a.dtype if hasattr(a, "dtype") else np.result_type(a)) for a in leaves]
    ident = repr(
        (
            tuple(key),
            [(a.shape, str(a.dtype)) for a in avals],
            structure,
            jax.default_backend(),
            jax.__version__,
            jax.lib.__version__,
            bool(jax.config.jax_enable_x64),
            source_digest(),
        )
    )
    digest = hashlib.sha256(ident.encode()).hexdigest()
    call = _LOADED.get(digest)
    if call is None:
        path = folder / f"{digest}.jaxexport"
        exported = None
        if path.is_file():
            try:
                exported = jax.export.deserialize(bytearray(path.read_bytes()))
            except Exception:  # a damaged or foreign file: traced and stored again
                exported = None
        if exported is None:
            try:
                exported = jax.export.export(jax.jit(lambda *xs: fn(*jax.tree.unflatten(treedef, xs))))(*avals)
                blob = exported.serialize()
            except Exception:  # not exportable (e.g. a host callback): the caller runs fn
                return None
            try:
                folder.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as f:
                    f.write(blob)
                os.replace(f.name, path)  # atomic: concurrent processes write the same bytes
            except OSError:
                pass  # a read-only cache: this process still uses the program it traced
        call = _LOADED[digest] = jax.jit(exported.call)
    return lambda: call(*leaves)


def stored_value(make: Callable[[], Any], inputs: Any, key: Sequence[Any]) -> Any:
    """``make()``, a pytree of arrays computed from ``inputs`` (a pytree of arrays) alone,
    kept on disk next to the stored programs: a later call with the same ``key``, the same
    ``inputs`` (structure and every value: a digest of their bytes) and the same hwjax
    sources and jax versions loads it instead (its arrays as device arrays). Used for host
    work that no compiler cache covers, e.g. a model's lowering (xformer's per-channel
    recipes in NumPy). Where programs are not stored (:func:`program_folder`), or
    ``inputs`` holds tracers, ``make()`` is returned as it is.

    The file is a pickle, read only from the cache folder, which JAX's persistent cache
    trusts already with compiled code it runs."""
    import pickle

    folder = program_folder()
    leaves, treedef = jax.tree.flatten(inputs)
    structure = str(treedef)
    if folder is None or any(isinstance(a, jax.core.Tracer) for a in leaves) or "0x" in structure:
        return make()
    h = hashlib.sha256(repr((tuple(key), structure, jax.__version__, jax.lib.__version__, source_digest())).encode())
    for a in leaves:
        a = np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    path = folder / f"{h.hexdigest()}.pickle"
    if path.is_file():
        try:
            value = pickle.loads(path.read_bytes())
            with jax.ensure_compile_time_eval():  # device arrays, also when loaded inside a trace
                return jax.tree.map(jax.device_put, value)
        except Exception:  # damaged, or written by other code: made again
            pass
    value = make()
    try:
        blob = pickle.dumps(jax.tree.map(np.asarray, value))
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as f:
            f.write(blob)
        os.replace(f.name, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # not picklable or a read-only cache: this process keeps its value
    return value


def call_stored(fn: Callable[..., Any], args: tuple, name: str, **options) -> Any:
    """``fn(*args, **options)``, through a program stored on disk (:func:`stored_program`,
    keyed by ``name`` and the static ``options``) where one can be; ``fn`` itself otherwise."""
    thunk = stored_program(functools.partial(fn, **options), args, (name, sorted(options.items())))
    return thunk() if thunk is not None else fn(*args, **options)
