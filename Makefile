# The two commands of the README: `make lab` starts the course, `make test` checks it.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: the rest of the install then accepts it as it is.
TORCH ?= torch==2.13.0
PYTEST := $(BIN)/python -m pytest

.PHONY: lab test setup build grade clean-venv

# Jupyter refuses root unless told; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(LAB_FLAGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(PYTEST) tests/machinery
	$(PYTEST) tests/graded --impl solutions
	@echo "Every graded test must FAIL on the blank stubs (inverted: a pass below means it does):"
	$(PYTEST) tests/graded --impl stubs --must-fail

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
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
