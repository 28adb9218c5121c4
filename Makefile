# Two commands do all set-up on a fresh Debian/Ubuntu machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO ?= examples/data_parallel.py

.PHONY: setup demo test bench lint clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "wgpar needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test,examples,dev,mpi]"
	@touch $@

# WITH_TORCH=1 also installs PyTorch (CPU wheels where available) so the tests compare against it;
# without it those comparisons are skipped and the NumPy float64 references still run.
$(VENV)/.torch: | $(VENV)/.installed
	-@$(BIN)/python -m pip install -q torch==2.13.0 && touch $@ || echo "torch not installed: PyTorch comparisons will be skipped"

setup: $(VENV)/.installed $(if $(filter 1,$(WITH_TORCH)),$(VENV)/.torch)
	@bash tools/ensure_adapter.sh $(BIN)/python

demo: setup
	$(BIN)/python $(DEMO)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_ops.py
	$(BIN)/python benchmarks/bench_matmul.py

lint: setup
	$(BIN)/ruff check wgpar tests examples benchmarks tools

clean:
	rm -rf $(VENV) build dist .pytest_cache
