# `make train` and `make test` create the virtual environment on first use: `make train` the core
# (requirements.txt), `make test` and `make lint` add the extras and the tools of requirements/.
VENV ?= .venv
VENV_PYTHON := $(VENV)/bin/python
CONFIG ?= configs/default.py
ARGS ?=
# The interpreter that creates the environment: python3 when it is 3.11 to 3.14, else the newest
# python3.N that runs; `make PYTHON=/path/to/python3.12` chooses another. Python 3.15 has no wheels
# of tensorstore (orbax-checkpoint's) or of the pinned scipy yet: pip would try to compile them.
SUPPORTED := import sys; sys.exit(not 0x30B0000 <= sys.hexversion < 0x30F0000)
PYTHON ?= $(shell for p in python3 python3.14 python3.13 python3.12 python3.11; do \
  $$p -c '$(SUPPORTED)' >/dev/null 2>&1 && { command -v $$p; break; }; done)
# PYTHON as the shell runs it: the path of one in a folder with spaces (a clone in "~/My Projects",
# its environment activated) escaped; a `~` or flags in a PYTHON given left as they are.
SPACE := $(subst ,, )
PYTHON_RUN = $(if $(shell test -x "$(PYTHON)" && echo yes),$(subst $(SPACE),\ ,$(PYTHON)),$(PYTHON))
NO_PYTHON = error: this project needs Python 3.11 to 3.14, and $(or $(PYTHON),python3) is \
  $(or $(shell $(or $(PYTHON_RUN),python3) --version 2>/dev/null),not found). Get one: python3 \
  -m pip install --user uv && ~/.local/bin/uv python install 3.12 (Linux, a TPU VM's Ubuntu \
  22.04 too); brew install python@3.13 (macOS). Then rerun make, or name it: make \
  PYTHON=~/.local/bin/python3.12
PYTHON_OK = $(and $(PYTHON),$(shell $(PYTHON_RUN) -c '$(SUPPORTED)' 2>/dev/null && echo yes))
# An environment of another Python is made anew, not over: venv keeps the old Python's links and
# writes the new one's name, an environment of neither.
MINOR := import sys; print(f"{sys.hexversion >> 24}.{sys.hexversion >> 16 & 255}")
PYTHON_MINOR = $(shell $(PYTHON_RUN) -c '$(MINOR)' 2>/dev/null)
OTHER_PYTHON = $(filter-out $(PYTHON_MINOR),$(shell $(VENV_PYTHON) -c '$(MINOR)' 2>/dev/null))
# The accelerator's JAX plugin at the JAX version the lock chose: `make train ACCELERATOR=tpu` (or
# cuda12) on a fresh clone; empty for the CPU.
ACCELERATOR ?=
# An environment whose Python no longer runs (uninstalled, or moved by a Homebrew or pyenv upgrade)
# is made again, not patched: its compiled packages were built for that Python.
ifneq ($(wildcard $(VENV)/installed),)
ifeq ($(filter clean-env,$(MAKECMDGOALS)),)
ifneq ($(shell $(VENV_PYTHON) -c 'print("runs")' 2>/dev/null),runs)
$(error error: the environment $(VENV) was made by a Python that no longer runs ($(VENV_PYTHON), \
  of $(or $(shell sed -n 's/^home *= *//p' $(VENV)/pyvenv.cfg 2>/dev/null),an unknown home)); \
  make it again with a Python that does: make clean-env train (or make clean-env train PYTHON=...))
endif
endif
endif
# JAX's extras that add a device's plugin, on both stacks. pip takes any other name with a warning
# alone and installs JAX for the CPU: a typo (gpu, CUDA12) is stopped here, before anything is made.
ACCELERATORS := tpu cuda cuda12 cuda13 cuda12-local cuda13-local rocm7-local
ifneq ($(filter-out $(ACCELERATORS),$(ACCELERATOR))$(word 2,$(ACCELERATOR)),)
$(error error: ACCELERATOR=$(ACCELERATOR) names no accelerator of JAX's, and pip would install \
  JAX for the CPU alone; pass one of $(ACCELERATORS) (make train ACCELERATOR=cuda12), or none \
  for the CPU)
endif
REQUIREMENTS := requirements.txt requirements/tfds.txt requirements/profile.txt requirements/dev.txt \
  requirements/onnx.txt requirements/search.txt

.PHONY: train test test-all test-numbers-every-isa lint lock clean-env

$(VENV)/installed: requirements.txt
	$(if $(PYTHON_OK),,$(error $(NO_PYTHON)))
	$(if $(OTHER_PYTHON),$(error error: the environment $(VENV) runs Python $(OTHER_PYTHON), and \
	  make chose $(PYTHON) (Python $(PYTHON_MINOR)); make clean-env train makes it anew with that \
	  one, or name the one it has: make train PYTHON=python$(OTHER_PYTHON)))
	$(PYTHON_RUN) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip
	$(VENV_PYTHON) -m pip install --quiet -r requirements.txt
	[ -z "$(ACCELERATOR)" ] || $(VENV_PYTHON) -m pip install --quiet -r requirements.txt \
	  "jax[$(ACCELERATOR)]==$$($(VENV_PYTHON) -c 'import jax; print(jax.__version__)')"
	touch $@

$(VENV)/installed-dev: $(VENV)/installed $(REQUIREMENTS)
	$(VENV_PYTHON) -m pip install --quiet $(addprefix -r ,$(REQUIREMENTS))
	touch $@

train: $(VENV)/installed
	$(VENV_PYTHON) train.py --config=$(CONFIG) $(ARGS)

# One test file per worker, on every core (pytest-xdist). `make test`: every test but the slow ones
# (pytest.ini's `slow`: multi-process runs, kill -9, buckets, long runs), under 5 minutes on 2 cores;
# `make test-all`: the whole suite, as CI runs it.
test: $(VENV)/installed-dev
	$(VENV_PYTHON) -m pytest -q -n auto --dist=loadfile -m "not slow"

test-all: $(VENV)/installed-dev
	$(VENV_PYTHON) -m pytest -q -n auto --dist=loadfile

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
	  XLA_FLAGS="$(XLA_FLAGS) $$isa" $(VENV_PYTHON) -m pytest -q -n auto --dist=loadfile -m numeric \
	    || exit 1; \
	done

# ruff (pyflakes, pycodestyle) over the repository and mypy over the code; settings in pyproject.toml.
lint: $(VENV)/installed-dev
	$(VENV_PYTHON) -m ruff check .
	$(VENV_PYTHON) -m mypy

# The pins, written again from requirements/*.in: one resolution, with markers, for Python 3.11 to
# 3.14; each extra constrained by the files before it, so that they install together. docs (the
# dashboard's screenshot) is pinned last, and neither make test nor CI installs it.
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 \
  --custom-compile-command 'make lock'
lock: $(VENV)/installed-dev
	$(UV_COMPILE) requirements/core.in -o requirements.txt
	constraints="-c requirements.txt"; for extra in tfds profile dev onnx search docs; do \
	  $(UV_COMPILE) requirements/$$extra.in $$constraints -o requirements/$$extra.txt || exit 1; \
	  constraints="$$constraints -c requirements/$$extra.txt"; done

clean-env:
	rm -rf $(VENV)
