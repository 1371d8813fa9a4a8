# `make train` and `make test` create the virtual environment on first use.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
CONFIG ?= configs/default.py
ARGS ?=

.PHONY: train test test-fast test-numbers-other-cpu lint clean-env

$(VENV)/installed: requirements.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/installed-dev: $(VENV)/installed requirements-dev.txt
	$(PYTHON) -m pip install --quiet -r requirements-dev.txt
	touch $@

train: $(VENV)/installed
	$(PYTHON) train.py --config=$(CONFIG) $(ARGS)

# One test file per worker, on every core (pytest-xdist).
test: $(VENV)/installed
	$(PYTHON) -m pytest -q -n auto --dist=loadfile

test-fast: $(VENV)/installed
	$(PYTHON) -m pytest -q -n auto --dist=loadfile -m "not slow"

# The numeric-contract tests as XLA compiles them for an older x86 instruction set (other float bits).
test-numbers-other-cpu: $(VENV)/installed
	XLA_FLAGS="$(XLA_FLAGS) --xla_cpu_max_isa=SSE4_2" $(PYTHON) -m pytest -q -n auto --dist=loadfile -m numeric

# ruff (pyflakes, pycodestyle) over the repository and mypy over the code; settings in pyproject.toml.
lint: $(VENV)/installed-dev
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

clean-env:
	rm -rf $(VENV)
