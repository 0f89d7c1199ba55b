# grpoflow — the two set-up commands are `make demo` and `make test`; each bootstraps .venv.
#   make demo      run the pipeline on the embedded defaults (CPU, no downloads)
#   make test      run the test suite (fast + slow tiny-model tests)
#   make bench     run the benchmarks (JSON on stdout)
#   make ui        serve the MLflow UI on 127.0.0.1:5000
#   make lock      re-record requirements/constraints.txt from .venv
# On a GPU machine choose the torch build, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
EXTRAS      ?= dev
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.grpoflow-installed

export PATH := $(abspath $(VENV))/bin:$(PATH)
export DO_NOT_TRACK ?= true
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export HF_HUB_DISABLE_TELEMETRY ?= 1

.PHONY: venv demo test test-fast bench ui lock clean

venv: $(STAMP)

# torch goes in first so that nothing later resolves a multi-GB CUDA build on a CPU machine.
$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -c requirements/constraints.txt -e ".[$(EXTRAS)]"
	@touch $(STAMP)

demo: venv
	$(VENV)/bin/grpoflow run

test: venv
	$(PY) -m pytest -q tests

test-fast: venv
	$(PY) -m pytest -q tests -m "not slow"

bench: venv
	$(PY) benchmarks/grpo_gain.py

ui: venv
	$(VENV)/bin/grpoflow ui

lock: venv
	@{ echo "# The working set grpoflow was built and tested with (pip freeze, torch excluded:"; \
	   echo "# the Makefile installs torch first, TORCH_SPEC picks the build). Regenerate: make lock"; \
	   $(PIP) freeze --exclude-editable | grep -viE '^(torch|grpoflow)[=@ ]'; } > requirements/constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
