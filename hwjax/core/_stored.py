"""Compiled programs kept between processes: a compiled executable stored on disk.

JAX's persistent compilation cache saves the compile, but every new process still traces
and lowers a model's program before it can look the compile up: a second or two for a
whole network. :func:`stored_program` keeps the compiled executable itself
(:mod:`jax.experimental.serialize_executable`) next to JAX's cache, so a later process
loads it and calls it: no tracing, lowering or compiler-cache lookup.

The stored executable is the one this process compiled: the same code, so the same bits.
It is found again only under the same key: the caller's key (what determines the
program, e.g. a model file's digest, the runtime and options), the arguments' structure,
shapes and dtypes, the backend and its devices, the processor's instruction set,
``XLA_FLAGS``, the versions of jax and jaxlib, and a digest of hwjax's own source files
(a changed kernel is never answered by an old program).

The folder is trusted as JAX's persistent cache folder is: both hold compiled code that a
later process runs.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import pickle
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.experimental import serialize_executable

from hwjax.core._program import cpu_flags, evaluated_if_concrete

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


def stored_program(
    fn: Callable[..., Any], args: tuple, key: Sequence[Any], *, embed: Sequence[int] = (), looping: bool = False
) -> Optional[Callable[[], Any]]:
    """``fn(*args)`` through a compiled program stored on disk: returns a thunk giving that
    value, or None where programs are not stored (:func:`program_folder`), or ``args`` holds
    tracers or arrays on another device than the default one (the caller then calls ``fn``
    itself).

    ``args``: a pytree of arrays (traced as arguments, never baked into the program);
    ``key``: values whose ``repr`` determines ``fn``'s program beyond the arguments'
    structure (the ``repr`` of their pytree definition: static fields included), shapes and
    dtypes, e.g. ``fn``'s name and static options. The first call of a key traces and
    compiles the program and, when the compiler made it, stores the compiled executable
    (:mod:`jax.experimental.serialize_executable`); later calls, in this process or another
    on the same kind of processor, load it (once per process): no tracing, lowering or
    compiler-cache lookup. Where JAX's persistent cache answered the compile instead (its
    executable cannot be stored again: see :func:`_compile`), the traced program is stored
    (:mod:`jax.export`), and a later process compiles that, through JAX's cache, storing the
    executable once the compiler makes it. A program that cannot be serialised (e.g. one
    with a host callback) is compiled and kept for this process only.

    ``embed``: positions in ``args`` whose small leaves (at most :data:`EMBED_MAX_BYTES`)
    become constants of the program, their values part of the key, so that XLA folds them
    and what is derived from them (a model's shifts, zero points, branch choices,
    per-channel requantisation parameters); the other leaves stay arguments. With
    ``embed``, the program is compiled and kept for this process also where programs are
    not stored. ``looping``: the program loops over chunks of a large batch; it is compiled
    with :func:`compiler_options` ``(looping=True)``."""
    folder = program_folder()
    if folder is None and not embed:
        return None
    leaves, treedef = jax.tree.flatten(args)
    if any(isinstance(a, jax.core.Tracer) for a in leaves):
        return None  # inside the caller's own trace: its program, not a stored one
    options = compiler_options(looping=looping)
    found = _identify(args, leaves, treedef, key, embed, options)
    if found is None:
        return None
    digest, constants = found
    passed = [a for i, a in enumerate(leaves) if i not in constants]
    call = _LOADED.get(digest)
    if call is None:
        executable, export = (
            (None, None) if folder is None else (folder / f"{digest}.executable", folder / f"{digest}.jaxexport")
        )
        call = None if folder is None else _read(executable, _deserialize_executable)
        if call is None:
            exported = None if folder is None else _read(export, lambda b: jax.export.deserialize(bytearray(b)))
            if exported is not None:  # JAX's cache answered this program before
                jitted = jax.jit(exported.call)
            else:

                def program(*xs):
                    it = iter(xs)
                    full = [constants[i] if i in constants else next(it) for i in range(len(leaves))]
                    return fn(*jax.tree.unflatten(treedef, full))

                # named as fn (a partial's function), as JAX's logs and profiles name programs
                program.__name__ = getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "program"))
                jitted = jax.jit(program)
            call, fresh = _compile(jitted, passed, options)
            if folder is None:
                pass  # kept for this process only
            elif fresh:  # e.g. a host callback or hoisted constants cannot be serialised: not stored
                _store(executable, lambda: pickle.dumps(serialize_executable.serialize(call)))
            elif exported is None:
                # JAX's cache answered, so this executable cannot be stored (_compile): the
                # traced program is, so that a later process skips tracing and lowering
                _store(export, lambda: jax.export.export(jitted)(*passed).serialize())
        _LOADED[digest] = call
    return lambda: call(*passed)


#: :func:`_identify`'s results for the calls whose ``embed`` arguments are immutable (every
#: leaf a JAX array: a model's lowered graph, passed again on every call), by their
#: identity and the other arguments' shapes: ``{memo key: (embed arguments, result)}``
_IDENTIFIED: dict[str, tuple[tuple, tuple[str, dict]]] = {}


def _identify(args: tuple, leaves: list, treedef, key: Sequence[Any], embed: Sequence[int], options: dict):
    """``(digest, constants)`` of a call of :func:`stored_program`: the program's key (a
    SHA-256 over everything its executable depends on) and the embedded leaves
    (:func:`_embedded`); None where the call has no stable key. Remembered for a call whose
    ``embed`` arguments are the same immutable objects as before and whose other arguments
    have the same structure, shapes and dtypes (a model run again on another batch of the
    same shape: no per-call description of every parameter)."""
    memo = None
    if embed and all(all(isinstance(v, jax.Array) for v in jax.tree.leaves(args[i])) for i in embed):
        others = [
            i if i in embed else (str(jax.tree.structure(a)), _avals(jax.tree.leaves(a))) for i, a in enumerate(args)
        ]
        memo = repr((tuple(key), others, bool(jax.config.jax_enable_x64), sorted(options.items())))
        hit = _IDENTIFIED.get(memo)
        if hit is not None and all(h is args[i] for h, i in zip(hit[0], embed)):
            found = hit[1]
            if _placed_here([v for i, a in enumerate(args) if i not in embed for v in jax.tree.leaves(a)]):
                return found
            return None
    constants = _embedded(args, embed)
    structure = str(treedef)  # the static fields of the arguments' pytree nodes (a graph's ops, attributes, target)
    if "0x" in structure or "..." in structure:
        return None  # an object without a faithful repr (an address, a truncated array): no stable key
    if not _placed_here(leaves):
        return None
    ident = repr(
        (
            tuple(key),
            _avals(leaves),
            sorted((i, c.tobytes().hex()) for i, c in constants.items()),
            structure,
            jax.default_backend(),
            [d.device_kind for d in jax.local_devices()],
            host_processor(),
            os.environ.get("XLA_FLAGS", ""),  # the compiler's options (an executable depends on them)
            sorted(options.items()),
            jax.__version__,
            jax.lib.__version__,
            bool(jax.config.jax_enable_x64),
            source_digest(),
        )
    )
    found = (hashlib.sha256(ident.encode()).hexdigest(), constants)
    if memo is not None:
        while len(_IDENTIFIED) >= 16:
            _IDENTIFIED.pop(next(iter(_IDENTIFIED)))
        _IDENTIFIED[memo] = (tuple(args[i] for i in embed), found)
    return found


def _avals(leaves: list) -> list:
    """Shapes and dtypes of ``leaves`` (arrays or Python scalars)."""
    return [(np.shape(a), str(a.dtype if hasattr(a, "dtype") else np.result_type(a))) for a in leaves]


def _placed_here(leaves: list) -> bool:
    """False where an array sits elsewhere than on the default device (another device,
    sharded): the caller's ``jit`` then places the program."""
    device = {jax.devices()[0]}
    return not any(isinstance(a, jax.Array) and a.sharding.device_set != device for a in leaves)


#: Bytes up to which a leaf of an ``embed`` argument becomes a constant of the program: a
#: per-channel vector of up to 256 int32 values. A model's per-channel requantisation
#: parameters (multipliers, shifts) are arguments of the node's kernel, which derives from
#: them a handful of per-channel vectors; as arguments, XLA compiles a small kernel for each
#: derivation (about ten per convolution), as constants it folds them while compiling.
#: ResNet-8 (MLPerf Tiny, runtime="reference"): 193 -> 124 fused kernels, XLA compile time
#: 6.8-8.1 -> 5.1-6.9 s (4 fresh processes each, one core); images/s unchanged. (A
#: caller's ``jit`` embeds up to ``jax_embedded_constants_max_bytes``, 32 bytes.)
EMBED_MAX_BYTES = 1024

#: the last few ``_embedded`` results by the identity of their argument (a model's lowered
#: graph, passed again on every call): ``{id: (argument, {leaf index: value})}``
_EMBEDDED: dict[int, tuple[Any, dict[int, np.ndarray]]] = {}


def _embedded(args: tuple, embed: Sequence[int]) -> dict[int, np.ndarray]:
    """``{leaf index: value}`` of the leaves of ``args[i]`` (``i`` in ``embed``) of at most
    :data:`EMBED_MAX_BYTES`, as host arrays. Read from the device once
    per argument object whose leaves are all (immutable) JAX arrays, not on every call."""
    limit = EMBED_MAX_BYTES
    out, start = {}, 0
    for i, a in enumerate(args):
        sub = jax.tree.leaves(a)
        if i in embed:
            hit = _EMBEDDED.get(id(a))
            if hit is not None and hit[0] is a:
                values = hit[1]
            else:
                picked = {
                    j: v
                    for j, v in enumerate(sub)
                    if hasattr(v, "dtype") and math.prod(np.shape(v)) * np.dtype(v.dtype).itemsize <= limit
                }
                got = jax.device_get(list(picked.values()))  # one transfer for every device array
                values = {j: np.asarray(v) for j, v in zip(picked, got)}
                if all(isinstance(v, jax.Array) for v in sub):
                    while len(_EMBEDDED) >= 8:
                        _EMBEDDED.pop(next(iter(_EMBEDDED)))
                    _EMBEDDED[id(a)] = (a, values)
            out.update({start + j: v for j, v in values.items()})
        start += len(sub)
    return out


@functools.lru_cache(maxsize=1)
def host_processor() -> str:
    """What a compiled CPU program depends on beyond JAX's versions: the machine type and
    (on Linux) the processor's instruction-set flags, so that a cache folder shared between
    machines never hands one a program compiled for another's instructions."""
    return hashlib.sha256(f"{platform.machine()} {platform.processor()} {cpu_flags()}".encode()).hexdigest()


_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def _compile(jitted, leaves: list, options: dict) -> tuple[Any, bool]:
    """``jitted`` compiled for ``leaves`` (lowered with the arguments themselves, so that the
    executable takes exactly their types, weak types included), and whether the compiler
    made it (False: JAX's persistent cache answered). ``options``: XLA's, as
    :func:`compiler_options` gives them.

    Only an executable the compiler made is stored: one that JAX's cache answered was itself
    deserialised, and serialising it again gives a program that fails when run ("Function
    ... not found", jax/jaxlib 0.10.2 on CPU); that process uses it, a later one finds the
    same entry in JAX's cache."""
    hits: list[str] = []

    def listen(event: str, **_) -> None:
        if event == _CACHE_HIT:
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        lowered = jitted.lower(*leaves)
        try:
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
        except Exception:  # an XLA without the option: its defaults
            if not options:
                raise
            compiled = lowered.compile()
    finally:
        jax.monitoring.unregister_event_listener(listen)
    return compiled, not hits


def compiler_options(*, looping: bool = False) -> dict[str, Any]:
    """XLA options of the programs compiled here (none off CPU): what ``Model.run`` compiles
    with. A program of your own ``jax.jit`` gets them with
    ``jax.jit(f).lower(*args).compile(compiler_options=compiler_options())`` (a plain
    ``jax.jit`` compiles with XLA's defaults: KWS on ``"reference"`` at batch 256, one
    core, 15.9k images/s against 20.9k with these options).

    On CPU, options that change how long XLA compiles or how wide the vectors of its
    loop kernels are, not what a program computes: no fast-math either way, and the
    integer kernels give the same bits at any vector width, and so do the float ones
    (element-wise steps, each rounded once; a float sum whose order matters is written as
    a sequential ``scan``, which no vector width reorders). The published-model tests run
    the models' programs under them:

    * XLA's classic loop emitters instead of its MLIR fusion emitters
      (``xla_cpu_use_fusion_emitters=False``): the same HLO, fused the same way, each fusion
      turned into LLVM IR by the older code path, which skips an MLIR pipeline per fusion.
      Measured on the MLPerf Tiny models, one core, fresh processes (two each): XLA compile
      time ResNet-8 4.9-7.9 -> 3.3-3.5 s, VWW xs3 5.9-6.9 -> 4.4-5.5 s, str_ww 1.5-2.2 ->
      1.0-1.2 s; images/s the same within noise, str_ww 13.7-18.5k -> 22.8-24.0k.
    * LLVM's optimisation level 1 instead of 2 (``xla_backend_optimization_level=1``): the
      integer kernels' loops are vectorised at either level, and the dots run in library
      kernels. Measured on an AMD EPYC core, fresh processes, the batch-32 and batch-256
      programs of ``Model.run``: XLA compile time ResNet-8 2.95 -> 2.78 s, KWS 2.58 -> 1.92
      s, VWW 4.57 -> 4.11 s, VWW xs3 5.21 -> 4.37 s, ResNet-large 3.42 -> 2.90 s (first
      result 0.1-0.5 s sooner); images/s at batch 256 the same or higher (ResNet-large
      1,166 -> 1,427, KWS xnnpack 17.3k -> 19.7k). Level 0 compiles faster still but runs
      about 25x slower.
    * 512-bit vectors where the processor has them (``xla_cpu_prefer_vector_width=512``;
      XLA's default of 256 bits leaves half of an AVX-512 unit idle in the loop kernels:
      depthwise convolutions, requantisation, padding; a processor without AVX-512 keeps
      its own width). Measured on an AMD EPYC (Zen 4) core, batch 256, images/s: KWS
      xnnpack 19.9k -> 24.4k, reference 14.9k -> 16.9k; str_ww reference 67k -> 77k; VWW
      xnnpack 4.2k -> 4.7k; ResNet-8 4.4k -> 4.5k.
    * Where this process may run on one processor core only (``taskset``, a one-core
      container), XLA's code generation in one part
      (``xla_cpu_parallel_codegen_split_count=1``) instead of several parts meant for
      parallel threads: with one core the parts are compiled one after the other, each with
      its own setup. VWW xs3's batch-32 program, one pinned core: XLA compile 1.11-1.18 ->
      0.97-0.98 s. With two cores the parts pay (0.78-0.89 s split, 1.01-1.05 s not).
    * ``looping=True`` (a program that loops over chunks of a large batch, which
      ``Model.run`` compiles for batches above :data:`hwjax.core.ONE_PASS_EXAMPLES`): LLVM's
      level 2 after all. At level 1 LLVM leaves some byte-granular kernels unvectorised: a
      96x96 RGB image's pad ran 9x slower (2.87 against 0.33 ms for 64 chunks of 4
      images). Batch 256, one AMD EPYC core: VWW 3-7% and ResNet-8 3% more images/s, KWS,
      str_ww and ResNet-large the same; VWW xs3's batch-32 program compiled 0.06-0.1 s
      later at level 2, which is why the small (first-result) programs keep level 1."""
    if jax.default_backend() != "cpu":
        return {}
    options = dict(CPU_COMPILER_OPTIONS)
    if looping:
        options["xla_backend_optimization_level"] = 2
    if _usable_cores() == 1:
        options["xla_cpu_parallel_codegen_split_count"] = 1
    return options


#: see :func:`compiler_options`
CPU_COMPILER_OPTIONS = (
    ("xla_cpu_use_fusion_emitters", False),
    ("xla_backend_optimization_level", 1),
    ("xla_cpu_prefer_vector_width", 512),
)


def _usable_cores() -> int:
    """The processor cores this process may run on (its affinity where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _deserialize_executable(blob: bytes):
    """An executable from :func:`stored_program`'s file, loaded on one device, as it was
    compiled (a program, not a sharded computation)."""
    payload, in_tree, out_tree = pickle.loads(blob)
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree, execution_devices=jax.devices()[:1])


def _read(path: Path, decode: Callable[[bytes], Any]) -> Any:
    """``decode`` of the bytes stored at ``path``; None where there are none or they do not
    decode (damaged, or written by other code: the caller makes them again)."""
    if not path.is_file():
        return None
    try:
        return decode(path.read_bytes())
    except Exception:
        return None


def _store(path: Path, serialise: Callable[[], bytes]) -> None:
    """``serialise()`` written to ``path`` atomically (concurrent processes write the same
    bytes); nothing where it cannot serialise its value or the cache is read-only (this
    process keeps what it has)."""
    try:
        blob = serialise()
    except Exception:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(blob)
        os.replace(f.name, path)
    except OSError:
        pass


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
    stored = _read(path, pickle.loads)
    if stored is not None:
        with evaluated_if_concrete():  # device arrays, also when loaded inside a trace
            return jax.device_put(stored)  # one transfer call for every array
    value = make()
    _store(path, lambda: pickle.dumps(jax.tree.map(np.asarray, value)))
    return value


def call_stored(
    fn: Callable[..., Any], args: tuple, name: str, *, embed: Sequence[int] = (), looping: bool = False, **options
) -> Any:
    """``fn(*args, **options)``, through a program stored on disk (:func:`stored_program`,
    keyed by ``name`` and the static ``options``; ``embed`` and ``looping`` as there) where
    one can be; ``fn`` itself otherwise."""
    key = (name, sorted(options.items()))
    thunk = stored_program(functools.partial(fn, **options), args, key, embed=embed, looping=looping)
    return thunk() if thunk is not None else fn(*args, **options)
