# Two commands set everything up on a fresh machine:
#   make demo   create .venv, install, run the main lab on 2 ranks (CPU over gloo when no GPU)
#   make test   create .venv, install, run the whole test suite
# TORCH_SPEC picks the torch build; the default is the CPU wheel. A GPU user sets e.g.
#   make demo TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu126"
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
DEMO_LAB   ?= zero2
BIN        := $(VENV)/bin

.PHONY: setup demo test bench clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/plscale lab run $(DEMO_LAB) --gpus 2

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/cli_startup.py

clean:
	rm -rf $(VENV) runs
