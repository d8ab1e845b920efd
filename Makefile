# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if it is missing and install what they need; the second time they are quick.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned here (not in pyproject) so that a machine with a local CPU wheel of this
# version uses it instead of downloading the newest CUDA build; users may override:
#   make demo TORCH_SPEC='torch>=2.6'
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test install dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/shoestring cram

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs/cram
