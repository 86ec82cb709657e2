"""hwjax's default persistent compilation cache (hwjax._cache): where it points, when it
stays off, and that a second process loads the first one's program from it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

_MODEL = Path(__file__).parent / "data" / "mlperf" / "kws_ref_model.tflite"

_PROBE = "import hwjax, jax; print(jax.config.jax_compilation_cache_dir)"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "HWJAX_COMPILATION"))}
    env.update(extra)
    return env


def _probe(code: str, **extra) -> str:
    r = subprocess.run([sys.executable, "-c", code], env=_env(**extra), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"XDG_CACHE_HOME": "{tmp}"}, "{tmp}/hwjax/jax"),
        ({"HWJAX_COMPILATION_CACHE": "{tmp}/mine"}, "{tmp}/mine"),
        ({"HWJAX_COMPILATION_CACHE": "0", "XDG_CACHE_HOME": "{tmp}"}, "None"),
        ({"JAX_COMPILATION_CACHE_DIR": "{tmp}/jax-own", "XDG_CACHE_HOME": "{tmp}"}, "{tmp}/jax-own"),
        ({"JAX_ENABLE_COMPILATION_CACHE": "false", "XDG_CACHE_HOME": "{tmp}"}, "None"),
    ],
)
def test_default_cache_folder(tmp_path, extra, expected):
    extra = {k: v.format(tmp=tmp_path) for k, v in extra.items()}
    assert _probe(_PROBE, **extra) == expected.format(tmp=tmp_path)


@pytest.mark.parametrize("stored", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_second_process_loads_the_program(tmp_path, stored):
    """A second process answers KWS on xs3 from the cache: the compiled executable stored
    by hwjax (stored_program), neither traced nor compiled again; without stored programs,
    JAX's cache still answers the compile (the xs3 route holds no host callback, and JAX
    caches no program that does)."""
    code = (
        "import logging, numpy as np, jax, hwjax.tflite as T\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "logging.getLogger('jax._src.compiler').setLevel(logging.DEBUG)\n"
        f"m = T.load({str(_MODEL)!r})\n"
        "print(np.asarray(m.run(np.zeros((2, *m.inputs[0].shape[1:]), np.int8), runtime='xs3')).tolist())\n"
    )
    env = _env(HWJAX_COMPILATION_CACHE=str(tmp_path), HWJAX_STORED_PROGRAMS="1" if stored else "0")
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout == runs[1].stdout
    programs = list((tmp_path / "hwjax-programs").glob("*.executable"))
    if stored:
        assert len(programs) == 1
        assert not list((tmp_path / "hwjax-programs").glob("*.jaxexport"))  # the compiler made it: no export
        # the lowering and the passed xformer check (stored_value)
        assert len(list((tmp_path / "hwjax-programs").glob("*.pickle"))) == 2
        assert "PERSISTENT COMPILATION CACHE MISS for 'jit__run_file'" in runs[0].stderr
        assert "'jit__run_file'" not in runs[1].stderr  # neither traced nor compiled: loaded
    else:
        assert programs == []
        assert "PERSISTENT COMPILATION CACHE MISS for 'jit__run_file'" in runs[0].stderr
        assert "Persistent compilation cache hit for 'jit__run_file'" in runs[1].stderr


def test_stored_program_stores_only_what_the_compiler_made(tmp_path, monkeypatch):
    """stored_program stores the executable the compiler made; where JAX's cache answers
    the compile instead (an executable that cannot be stored again), the traced program,
    from which a later call compiles and stores the executable; then it loads that. Every
    call gives the function's value. (Its files go to a folder of its own, so that other
    test workers' stored programs do not mix in; JAX's cache is the session's.)"""
    import uuid

    import jax
    import numpy as np

    from hwjax.core import _stored
    from hwjax.core._stored import program_folder, stored_program

    if program_folder() is None:
        pytest.skip("no persistent compilation cache in this test session (HWJAX_TEST_JAX_CACHE=0)")
    folder = tmp_path / "programs"
    monkeypatch.setattr(_stored, "program_folder", lambda: folder)
    c = uuid.uuid4().int % 1000 + 3  # a program no earlier session compiled
    x = np.arange(6, dtype=np.int32)
    want = x * c + 1
    key = ("test_stored_program", c)

    def fn(v):
        return v * c + 1

    def call_fresh():
        """stored_program as in a new process; the suffixes of the files then stored."""
        _stored._LOADED.clear()
        thunk = stored_program(fn, (x,), key)
        assert np.array_equal(np.asarray(thunk()), want)
        return sorted(p.suffix for p in folder.glob("*"))

    saved = (
        jax.config.jax_persistent_cache_min_compile_time_secs,
        jax.config.jax_persistent_cache_min_entry_size_bytes,
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # JAX's cache keeps this small program
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    try:
        assert call_fresh() == [".executable"]  # compiled: its executable stored
        (exe,) = folder.glob("*.executable")
        exe.unlink()
        assert call_fresh() == [".jaxexport"]  # JAX's cache answered: the traced program stored
        assert call_fresh() == [".executable", ".jaxexport"]  # compiled from it: executable stored
        compiles = []
        real = _stored._compile
        monkeypatch.setattr(_stored, "_compile", lambda *a: compiles.append(a) or real(*a))
        call_fresh()  # loaded
        assert compiles == []
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[0])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", saved[1])


def test_stored_value_is_keyed_by_every_input_value():
    """stored_value makes a value once per key and input values, then loads it."""
    import uuid

    import numpy as np

    from hwjax.core import stored_value
    from hwjax.core._stored import program_folder

    if program_folder() is None:
        pytest.skip("no persistent compilation cache in this test session (HWJAX_TEST_JAX_CACHE=0)")
    key, made = (str(uuid.uuid4()),), []

    def make(v):
        made.append(1)
        return {"twice": np.asarray(v) * 2}

    a, b = np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32)
    b[3] = 7
    first = stored_value(lambda: make(a), {"a": a}, key)
    again = stored_value(lambda: make(a), {"a": a}, key)
    other = stored_value(lambda: make(b), {"a": b}, key)
    assert len(made) == 2  # a made once, then loaded; b (one value differs) made
    assert np.array_equal(np.asarray(again["twice"]), np.asarray(first["twice"]))
    assert np.array_equal(np.asarray(other["twice"]), b * 2)


def test_model_run_on_arrays_of_another_device():
    """Model.run on an input placed on another device than the default one: the caller's
    program, not a stored executable compiled for the default device (which refused it);
    the same values."""
    import jax
    import numpy as np

    import hwjax.tflite as T

    if len(jax.devices()) < 2:
        pytest.skip("one device in this test session (the conftest asks XLA for several CPU devices)")
    m = T.load(str(_MODEL.parent / "ad01_int8.tflite"))
    x = np.random.default_rng(0).integers(-128, 128, (4, *m.inputs[0].shape[1:])).astype(np.int8)
    want = np.asarray(m.run(x))
    got = m.run(jax.device_put(x, jax.devices()[1]))
    assert np.array_equal(np.asarray(got), want)


@pytest.mark.parametrize("stored", [True, False])
def test_embedded_leaves_are_constants_of_the_program(tmp_path, monkeypatch, stored):
    """stored_program(embed=...) makes the small leaves of those arguments constants of the
    program (XLA folds them: a 4-byte shift here) and passes the larger ones; another value
    of an embedded leaf is another program, with its own value; also where programs are not
    stored (then kept for the process). Every call gives the function's value."""
    import numpy as np

    from hwjax.core import _stored
    from hwjax.core._stored import stored_program

    monkeypatch.setattr(_stored, "program_folder", lambda: tmp_path / "programs" if stored else None)
    limit = _stored.EMBED_MAX_BYTES
    x = np.arange(-8, 8, dtype=np.int32)
    w = np.arange(limit // 4 + 1, dtype=np.int32)  # one element more than what is embedded

    def fn(params, v):
        return (v >> params["shift"]) + params["w"].sum()

    seen = []
    real = _stored._compile
    monkeypatch.setattr(
        _stored, "_compile", lambda jitted, passed, options: seen.append(len(passed)) or real(jitted, passed, options)
    )
    for shift in (1, 2, 1):
        params = {"shift": np.int32(shift), "w": w}
        thunk = stored_program(fn, (params, x), ("test_embedded", str(tmp_path)), embed=(0,))
        assert np.array_equal(np.asarray(thunk()), (x >> shift) + w.sum())
    assert seen == [2, 2]  # w and x passed; shift 1 and 2 compiled once each (1 again: the same program)


def test_stored_programs_compile_with_hwjax_compiler_options(tmp_path, monkeypatch):
    """stored_program compiles with compiler_options() (on CPU, XLA's classic emitters at
    LLVM level 1, 512-bit vectors, one code-generation part where one core is usable), part
    of the program's key; an option this XLA does not know falls back to its defaults."""
    import jax
    import numpy as np

    from hwjax.core import _stored
    from hwjax.core._stored import stored_program

    monkeypatch.setattr(_stored, "program_folder", lambda: tmp_path / "programs")
    monkeypatch.setattr(_stored, "_usable_cores", lambda: 2)
    seen = []
    real = jax.stages.Lowered.compile

    def compile_(self, compiler_options=None, **kw):
        seen.append(compiler_options)
        return real(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_)
    x = np.arange(12, dtype=np.int32)
    thunk = stored_program(lambda v: v * 3 + 1, (x,), ("test_options", str(tmp_path)))
    assert np.asarray(thunk()).tolist() == (x * 3 + 1).tolist()
    want = (
        {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1, "xla_cpu_prefer_vector_width": 512}
        if jax.default_backend() == "cpu"
        else {}
    )
    assert _stored.compiler_options() == want and seen == [want or None]
    monkeypatch.setattr(_stored, "_usable_cores", lambda: 1)  # one core: code generation in one part
    one_core = {**want, "xla_cpu_parallel_codegen_split_count": 1} if want else {}
    assert _stored.compiler_options() == one_core
    monkeypatch.setattr(_stored, "_usable_cores", lambda: 2)

    # a looping (data-set) program: LLVM level 2, a program of its own
    seen.clear()
    looping = {**want, "xla_backend_optimization_level": 2} if want else {}
    assert _stored.compiler_options(looping=True) == looping
    thunk = stored_program(lambda v: v * 3 + 1, (x,), ("test_options", str(tmp_path)), looping=True)
    assert np.asarray(thunk()).tolist() == (x * 3 + 1).tolist() and seen == [looping or None]

    seen.clear()
    monkeypatch.setattr(_stored, "CPU_COMPILER_OPTIONS", (("xla_no_such_option_anywhere", True),))
    thunk = stored_program(lambda v: v * 5 - 2, (x,), ("test_options_unknown", str(tmp_path)))
    assert np.asarray(thunk()).tolist() == (x * 5 - 2).tolist()
    if jax.default_backend() == "cpu":
        assert seen == [{"xla_no_such_option_anywhere": True}, None]  # refused, then the defaults


def test_a_program_is_identified_once_per_graph_object(monkeypatch):
    """stored_program describes an immutable embed argument (every leaf a JAX array) once:
    called again with the same object and inputs of the same shape, it reuses its key; a new
    object with other values is described again and runs its own program."""
    import jax
    import numpy as np

    from hwjax.core import _stored
    from hwjax.core._stored import stored_program

    monkeypatch.setattr(_stored, "program_folder", lambda: None)
    described = []
    real = _stored._embedded
    monkeypatch.setattr(_stored, "_embedded", lambda args, embed: described.append(1) or real(args, embed))

    def fn(params, v):
        return (v >> params["shift"]) * params["w"]

    w = jax.device_put(np.arange(300, dtype=np.int32))  # above the embedding limit: an argument
    params = {"shift": jax.device_put(np.int32(1)), "w": w}
    for seed in range(3):
        x = np.random.default_rng(seed).integers(-100, 100, 300).astype(np.int32)
        got = stored_program(fn, (params, x), ("test_identified",), embed=(0,))()
        assert np.asarray(got).tolist() == ((x >> 1) * np.arange(300)).tolist()
    assert len(described) == 1
    other = {"shift": jax.device_put(np.int32(2)), "w": w}
    got = stored_program(fn, (other, x), ("test_identified",), embed=(0,))()
    assert np.asarray(got).tolist() == ((x >> 2) * np.arange(300)).tolist() and len(described) == 2
    host = {"shift": np.int32(3), "w": w}  # a NumPy leaf: mutable, described on every call
    for _ in range(2):
        got = stored_program(fn, (host, x), ("test_identified",), embed=(0,))()
        assert np.asarray(got).tolist() == ((x >> 3) * np.arange(300)).tolist()
    assert len(described) == 4
