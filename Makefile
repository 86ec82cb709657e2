# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Test workers (pytest-xdist processes); TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: demo test test-full bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,train,tflite]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m train digits

# What CI runs: every golden vector and property, and every test model against its oracle,
# without the tests marked `slow` (end-to-end and training runs; see pyproject.toml). Compiled with
# fast-compile XLA flags (see tests/conftest.py) and a persistent compilation cache in
# .jax_cache/; files are spread over $(TEST_WORKERS) workers, each file kept on one worker
# (module fixtures run once).
test: $(STAMP)
	$(PYTEST) -m "not slow"

# Before a release: every test, `slow` ones included, compiled with XLA's default
# optimisation (no fast-compile flags), as users run it.
test-full: $(STAMP)
	HWJAX_TEST_FAST_COMPILE=0 $(PYTEST)

bench: $(STAMP)
	$(PY) -m hwjax.bench mac

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .jax_cache
