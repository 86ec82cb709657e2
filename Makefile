# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,train]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m train digits

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m hwjax.bench mac

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
