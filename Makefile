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
PYTEST := $(BIN)/python -m pytest
# Run with the network blocked where the machine allows it: after setup the course is offline.
OFFLINE := $(BIN)/python -m utils.offline
# Two commands side by side: the tests run torch on one thread, so the second core is free.
LANES := $(BIN)/python -m utils.lanes

.PHONY: lab lab-settings test test-all setup build grade clean-venv

# Jupyter refuses root unless told; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP) lab-settings
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

test: $(STAMP)
	$(BIN)/ruff check .
	@echo "The machinery's own tests; beside them, online (pip needs the package registry), a"
	@echo "notebook's Colab cell installs the course into a fresh virtual environment."
	$(LANES) "COURSE_TEST_THREADS=2 $(PYTEST) tests/machinery \
		 --ignore=tests/machinery/test_notebooks_run.py --ignore=tests/machinery/test_grading.py \
		 --ignore=tests/machinery/test_kernels_compile.py --ignore=tests/machinery/test_browser.py \
		 --ignore=tests/machinery/test_colab_setup.py" \
		"$(PYTEST) tests/machinery/test_colab_setup.py"
	$(BIN)/course corpus
	@echo "Offline from here on, in two lanes: every chapter's notebook in a kernel started from a"
	@echo "learner's environment (teacher builds: every check passes; blank builds: every check"
	@echo "fails), chapter 1 in JupyterLab in a headless Chromium (skipped, saying why, without"
	@echo "one), the grading of broken notebooks and chapter 6's kernels compiled for a GPU (no GPU"
	@echo "needed); beside it the graded tests on the solutions, then on the blank stubs, where every"
	@echo "graded test must FAIL (inverted: a pass there means it does not), then the learner-style"
	@echo "mutants (tests/machinery/mutants/), each of which must fail a test of its exercise."
	@echo "Then, in the second lane, the peers' own tests (tests/peers/: HF, vLLM, FlashInfer) on"
	@echo "the solutions."
	$(LANES) "$(OFFLINE) $(PYTEST) -rs tests/machinery/test_notebooks_run.py \
		 tests/machinery/test_browser.py && \
		 $(OFFLINE) $(PYTEST) tests/machinery/test_grading.py \
		 tests/machinery/test_kernels_compile.py" \
		"$(OFFLINE) $(PYTEST) tests/graded --impl solutions && \
		 $(OFFLINE) $(PYTEST) tests/graded --impl stubs --must-fail && \
		 $(OFFLINE) $(PYTEST) tests/graded --mutants -q && \
		 $(OFFLINE) $(PYTEST) -q tests/peers"

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
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/course corpus
	$(MAKE) lab-settings
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
