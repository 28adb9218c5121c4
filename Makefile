# Two commands do all set-up on a fresh Debian/Ubuntu machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO ?= examples/data_parallel.py

.PHONY: setup demo test test-torch bench lint clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "wgpar needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test,examples,dev,mpi]"
	@touch $@

# PyTorch is optional: every test checks against NumPy in float64 without it. `make test-torch`
# installs it (the CPU wheel where one is available) and runs the side-by-side comparisons
# (the tests marked `torch`); WITH_TORCH=1 makes `make test` install it too.
$(VENV)/.torch: | $(VENV)/.installed
	$(BIN)/python -m pip install -q torch==2.13.0
	@touch $@

setup: $(VENV)/.installed $(if $(filter 1,$(WITH_TORCH)),$(VENV)/.torch)
	@bash tools/ensure_adapter.sh $(BIN)/python

demo: setup
	$(BIN)/python $(DEMO)

# Two pytest workers (pytest-xdist), a test file each at a time: the suite is mostly Python and process
# start-up, so a 2-core machine runs it in about 7 minutes instead of 10. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-torch: setup $(VENV)/.torch
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m torch

bench: setup
	$(BIN)/python benchmarks/bench_ops.py
	$(BIN)/python benchmarks/bench_matmul.py

lint: setup
	$(BIN)/ruff check wgpar tests examples benchmarks tools

clean:
	rm -rf $(VENV) build dist .pytest_cache
