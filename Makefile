# Two commands for a fresh clone: `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
TORCH   ?= torch==2.13.0
# CPU wheels where no NVIDIA GPU answers `nvidia-smi -L`: pip's default index would pull the CUDA build
# plus ~20 nvidia packages (GBs) onto a laptop. Override either way: make run TORCH_INDEX=<url> (empty: default).
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_INDEX ?= $(if $(HAS_GPU),,https://download.pytorch.org/whl/cpu)
# An extra index, not a replacement: where it answers, its local-version build (2.13.0+cpu sorts after
# 2.13.0 in PEP 440) wins; where it cannot be reached (an offline mirror, a local wheelhouse), pip
# gives up on it after one quick retry and installs from what it is configured with.
TORCH_PIP := $(TORCH)$(if $(TORCH_INDEX), --extra-index-url $(TORCH_INDEX) --retries 1 --timeout 20)
CONFIG  ?= configs/digits.yaml
FASHION_MNIST_DIR ?= /usr/share/datasets/fashion-mnist
ARGS    ?=
# the suite on every core (pytest-xdist): CI has two; TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= auto

.PHONY: install install-test run test bench compat clean torch-choice data-hint

# `make run` installs what a run needs (torch, then fdlit's core dependencies); `make test` adds the
# extras the suite needs (.[test]: report, privacy, paper, ray, flower, pytest, ruff, playwright).
$(VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	# torch first, from the index chosen above: with it present, pip keeps that build for fdlit's deps.
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(TORCH_PIP)
	$(VPY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(VPY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed data-hint

install-test: $(VENV)/.installed-test

data-hint:  # where Fashion-MNIST (configs/fashion_mnist.yaml) comes from, when it is not installed
	@test -d $(FASHION_MNIST_DIR) || echo "Fashion-MNIST (configs/fashion_mnist.yaml) is not in $(FASHION_MNIST_DIR): sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu), or put its IDX files in DIR and pass --data.data_dir DIR"

torch-choice:  # what `make install` would install, and why
	@echo "torch: $(TORCH_PIP) (NVIDIA GPU: $(if $(HAS_GPU),yes,no))"

run: install
	$(VPY) -m fdlit fit --config $(CONFIG) $(ARGS)

test: install install-test
	$(VPY) -m ruff check fdlit tests benchmarks scripts examples
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(ARGS)

bench: install install-test
	$(VPY) benchmarks/round_time.py $(ARGS)

compat: install  # fdlit's smoke set on the oldest and newest releases of its tested ranges (scripts/compat.py)
	$(VPY) scripts/compat.py $(ARGS)

clean:
	rm -rf $(VENV) runs wandb .pytest_cache
