# Two commands for a fresh clone: `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
TORCH   ?= torch==2.13.0
CONFIG  ?= configs/digits.yaml
ARGS    ?=

.PHONY: install run test bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	# torch first: with it present, pip keeps the local CPU build instead of pulling a CUDA one.
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

run: install
	$(VPY) -m fdlit fit --config $(CONFIG) $(ARGS)

test: install
	$(VPY) -m ruff check fdlit tests benchmarks scripts
	$(VPY) -m pytest -q $(ARGS)

bench: install
	$(VPY) benchmarks/round_time.py $(ARGS)

clean:
	rm -rf $(VENV) runs wandb .pytest_cache
