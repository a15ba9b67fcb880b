# Two commands set everything up on a fresh machine:
#   make demo   create .venv, install, run the main lab on 2 ranks (CPU over gloo when no GPU)
#   make test   create .venv, install, run the whole test suite
#
# torch: on Linux the public index's torch is the CUDA build, several GB of nvidia-* packages. On a
# machine without an NVIDIA GPU (no nvidia-smi) pip also reads PyTorch's CPU wheel index and, reading
# both, takes its 2.13.0+cpu (a local version sorts above 2.13.0). With nvidia-smi, the public index's
# CUDA build. Another build: make clean && make demo TORCH_INDEX=https://download.pytorch.org/whl/cu126
# Versions: constraints.txt, what the references were measured with; CONSTRAINTS= lifts them.
PYTHON      ?= python3
VENV        ?= .venv
CPU_INDEX   := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(CPU_INDEX))
TORCH_SPEC  ?= torch
CONSTRAINTS ?= constraints.txt
DEMO_LAB    ?= zero2
TEST_WORKERS ?= 2
BIN         := $(VENV)/bin
PINS        := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: setup demo test bench clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PINS) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) $(TORCH_SPEC)
	$(BIN)/pip install -q $(PINS) -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/plscale lab run $(DEMO_LAB) --gpus 2

# Two workers, each a whole test file at a time (module fixtures run once), in the files' order
# (tests/conftest.py puts the JAX-in-process files last): the labs' ranks and the single-process
# tests share the cores, about 18 min in all on 2 cores instead of 22 in one. TEST_WORKERS=0, or
# no pytest-xdist in the venv, runs the suite in one process, one test after another.
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),$(shell $(BIN)/python -c 'import xdist' 2>/dev/null && \
          printf -- '-n %s --dist loadfile --no-loadscope-reorder' $(TEST_WORKERS)))
test: setup
	$(BIN)/python -m pytest -q $(XDIST)

bench: setup
	$(BIN)/python benchmarks/cli_startup.py

clean:
	rm -rf $(VENV) runs
