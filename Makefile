# `make train` and `make test` create the virtual environment on first use (`make test` and
# `make lint` add the tools of requirements-dev.txt).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
CONFIG ?= configs/default.py
ARGS ?=

.PHONY: train test test-fast test-numbers-every-isa lint clean-env

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
test: $(VENV)/installed-dev
	$(PYTHON) -m pytest -q -n auto --dist=loadfile

test-fast: $(VENV)/installed-dev
	$(PYTHON) -m pytest -q -n auto --dist=loadfile -m "not slow"

# The numeric-contract tests compiled for each x86 instruction-set level this CPU offers, by XLA's
# names (each sums floats in other orders); on another architecture, its native build only.
test-numbers-every-isa: $(VENV)/installed-dev
	@cpu_flags=" $$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "; \
	levels=""; for pair in SSE4_2:sse4_2 AVX:avx AVX2:avx2 AVX512:avx512f; do \
	  case "$$cpu_flags" in *" $${pair#*:} "*) levels="$$levels $${pair%%:*}";; esac; done; \
	[ -n "$$levels" ] || levels=native; \
	for level in $$levels; do \
	  echo "numeric tests, XLA:CPU instruction set: $$level"; \
	  isa=$$([ $$level = native ] || echo "--xla_cpu_max_isa=$$level"); \
	  XLA_FLAGS="$(XLA_FLAGS) $$isa" $(PYTHON) -m pytest -q -n auto --dist=loadfile -m numeric \
	    || exit 1; \
	done

# ruff (pyflakes, pycodestyle) over the repository and mypy over the code; settings in pyproject.toml.
lint: $(VENV)/installed-dev
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

clean-env:
	rm -rf $(VENV)
