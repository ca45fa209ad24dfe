# The two commands of the README: `make lab` starts the course, `make test` checks it.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: the rest of the install then accepts it as it is. On Linux, PyPI's torch
# wheel brings NVIDIA's CUDA libraries (about 3 GB more) whatever the hardware; `make lab
# TORCH_CPU=1` takes PyTorch's CPU-only build of the same version from PyTorch's own index.
TORCH ?= torch==2.13.0
TORCH_CPU ?=
TORCH_INDEX := $(if $(TORCH_CPU),--index-url https://download.pytorch.org/whl/cpu)
# The rest of the install goes through uv, which fetches and unpacks packages in parallel: on a
# 2-core machine about 25 s where pip took 64 (same versions resolved). uv does not read pip's
# settings (its index, a local torch file), so torch comes from pip, first; uv then keeps it.
# Should uv fail, pip does the same install.
UV ?= uv>=0.9,<1
PYTEST := $(BIN)/python -m pytest
# Run with the network blocked where the machine allows it: after setup the course is offline.
OFFLINE := $(BIN)/python -m utils.offline
# Commands side by side: the tests run torch on one thread each, so two lanes fill two cores.
LANES := $(BIN)/python -m utils.lanes
# Each time limit in the tests is an idle machine's, stretched by COURSE_TIME_SCALE
# (utils/timing.py): a 2-core machine with other jobs on both cores ran the suite 5.6 times
# slower than an idle one. The limits catch hangs; a hang still fails, only later.
TIME_SCALE ?= 6

.PHONY: lab lab-settings test test-all setup build grade clean-venv

# Jupyter refuses root unless told; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP) lab-settings
	@$(BIN)/python -m utils.update
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(LAB_FLAGS)

# JupyterLab's defaults for the course's environment: no "get notified about Jupyter news?"
# pop-up over the notebook on first open, no update check (the course is offline after setup),
# and a server that gives a notebook its kernel's metadata as it opens it, so that a notebook
# just opened is not "modified" (utils/lab_contents.py).
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
SERVER_CONFIG := $(VENV)/etc/jupyter/jupyter_server_config.json
lab-settings:
	mkdir -p $(dir $(LAB_SETTINGS)) $(dir $(SERVER_CONFIG))
	cp utils/lab-overrides.json $(LAB_SETTINGS)
	cp utils/jupyter_server_config.json $(SERVER_CONFIG)

# The runs on the blank stubs and on the mutants grade in their own process (COURSE_NO_FORK=1:
# the grader's path where it cannot fork, on Windows or in a kernel that started CUDA). Pristine
# stubs cannot loop or exit; a mutant that loops is stopped by the same alarm, and one that
# changed a shared model in place would fail the run, named (tests/conftest.py, MutantRun). A
# forked child for each test doubled the stubs' time and cost the mutants 80 of 210 CPU-seconds.
test: export COURSE_TIME_SCALE = $(TIME_SCALE)
test: $(STAMP)
	$(BIN)/ruff check .
# The layers (pyproject.toml's import-linter contracts): no arrow back up, no circle.
	$(BIN)/lint-imports --no-logo
	$(BIN)/course corpus
	@echo "Three lanes at once, on one torch thread each. One, offline: every chapter's notebook in"
	@echo "a kernel started from a learner's environment (teacher builds: every check passes; blank"
	@echo "builds: every check fails), then the grading of broken notebooks."
	@echo "Two, offline: the kernels compiled for a GPU (no GPU needed), the machinery's own checks,"
	@echo "models and tools tests with the peers' (tests/peers/: HF, vLLM, FlashInfer) on the"
	@echo "solutions, then the learner-style mutants (tests/machinery/mutants/), each of which must"
	@echo "fail a test of its exercise. Three: the course installed from a notebook's Colab cell into a"
	@echo "fresh virtual environment (online: pip needs the package registry), chapter 1 driven in"
	@echo "JupyterLab in a headless Chromium, offline (skipped, saying why, without one), the"
	@echo "benchmarks smoke-run, the engine's and the server's tests, the course command and"
	@echo "Triton's mode, then the graded tests on the"
	@echo "solutions and on the blank stubs, where"
	@echo "every graded test must FAIL (inverted: a pass there means it does not)."
# tests/machinery/ holds one folder per kind of test (tests/machinery/__init__.py says which); the
# lanes name the folders. learner/'s tests are named by file, each in the command it needs: the
# notebooks first, beside the heaviest work; the Colab install online; the browser on its own.
	$(LANES) "$(OFFLINE) $(PYTEST) -rs tests/machinery/learner/test_notebooks_run.py && \
		 $(OFFLINE) $(PYTEST) tests/machinery/learner/test_grading.py" \
		"$(OFFLINE) $(PYTEST) tests/machinery/compile && \
		 $(OFFLINE) $(PYTEST) tests/machinery/checks tests/machinery/models \
		 tests/machinery/tools tests/peers && \
		 COURSE_NO_FORK=1 $(OFFLINE) $(PYTEST) tests/graded --mutants -q" \
		"$(PYTEST) tests/machinery/learner/test_colab_setup.py && \
		 $(OFFLINE) $(PYTEST) -rs tests/machinery/learner/test_browser.py && \
		 $(OFFLINE) $(PYTEST) tests/machinery/benchmarks tests/machinery/engine \
		 tests/machinery/learner/test_cli.py tests/machinery/learner/test_triton_mode.py && \
		 $(OFFLINE) $(PYTEST) tests/graded --impl solutions && \
		 COURSE_NO_FORK=1 $(OFFLINE) $(PYTEST) tests/graded --impl stubs --must-fail"

# Everything `make test` runs, then the tests marked slow (larger sizes of the peers' tests,
# statistical tests repeated over many seeds).
test-all: test
	COURSE_TEST_THREADS=2 $(OFFLINE) $(PYTEST) --runslow -m slow tests/peers tests/machinery

setup: $(STAMP)

build: $(STAMP)
	$(BIN)/course build

grade: $(STAMP)
	$(BIN)/course grade

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Python 3.11 or newer is needed (PYTHON=$(PYTHON))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q "$(UV)"
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -e ".[dev]" || \
		$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/course corpus
	$(MAKE) lab-settings
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
