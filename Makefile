# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Test workers (pytest-xdist processes); TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: demo demo-deployed test test-full lint bench benchmarks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,train,tflite]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m train digits

# A deployed model: TensorFlow's int8 digits CNN under every runtime, fine-tuned for xs3,
# written to runs/deployed/ and checked again (about a minute of CPU time on 2 cores).
demo-deployed: $(STAMP)
	$(PY) -m train deployed

# What CI runs: every golden vector and property, and every test model against its oracle,
# without the tests marked `slow` (end-to-end and training runs; see pyproject.toml). Compiled with
# fast-compile XLA flags (see tests/conftest.py) and a persistent compilation cache in
# .jax_cache/; files are spread over $(TEST_WORKERS) workers, each file kept on one worker
# (module fixtures run once).
test: lint
	$(PYTEST) -m "not slow"

# The house rules, in seconds: the import contracts of pyproject.toml (layers, no private
# cross-package imports, no import circles), ruff's lint rules and its formatting.
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Before a release: every test, `slow` ones included, compiled with XLA's default
# optimisation (no fast-compile flags), as users run it.
test-full: lint
	HWJAX_TEST_FAST_COMPILE=0 $(PYTEST)

bench: $(STAMP)
	$(PY) -m hwjax.bench mac

# BENCHMARKS.md: every benchmark, each in a fresh process, on this machine (about five minutes on 2 cores).
benchmarks: $(STAMP)
	$(PY) -m hwjax.bench all --markdown --out BENCHMARKS.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .jax_cache
