# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if it is missing and install what they need; the second time they are quick.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned here (not in pyproject) so that a machine with a local CPU wheel of this
# version uses it instead of downloading the newest CUDA build; users may override:
#   make demo TORCH_SPEC='torch>=2.9'
TORCH_SPEC ?= torch==2.13.0

# Every install takes the versions CI tests from constraints.txt (pip's -c: a pin applies to a
# package only if something asks for it), so what CI tests is what installs. `make constraints`
# rewrites it from this venv's packages (pip freeze, minus the editable shoestring and torch,
# which TORCH_SPEC pins): run it after adding or upgrading a dependency, then run the tests.
CONSTRAINTS := constraints.txt

.PHONY: demo test test-all test-floors install dev clean browser constraints gpu-wheels gpu-data gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e ".[dev]"
	@$(MAKE) --no-print-directory browser
	touch $@

# The serving page's test drives a real headless Chromium (Debian's packages: browser
# downloads from elsewhere are not reachable in CI). Installed when missing and this is root
# with apt-get (CI); a no-op when present; otherwise the test skips and prints why.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null) \
	  || echo "note: could not install chromium; the browser test will skip"; \
	else echo "note: chromium/chromedriver missing (installing needs root and apt-get); the browser test will skip"; fi

install: $(VENV)/.installed

constraints: $(BIN)/python
	@{ echo "# The versions CI tests (make constraints: pip freeze of .venv, without shoestring"; \
	  echo "# itself, torch, which the Makefile's TORCH_SPEC pins, or packages from local paths)."; \
	  $(BIN)/pip freeze --exclude-editable | grep -v -i -E '^(torch|shoestring)==| @ '; } > $(CONSTRAINTS)
	@echo "wrote $(CONSTRAINTS): $$(grep -vc '^#' $(CONSTRAINTS)) packages"

dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/shoestring cram

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m "not heavy"

test-all: $(VENV)/.installed-dev  # also the torchrun parity, compiled and bench smoke runs
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(FLOORS_VENV) runs/cram

# ------------------------------------------------------------------------- the floors
# constraints.txt is one tested end (the newest, what `make test` installs); this is the other:
# .ci/floors.py turns every `>=X` of pyproject.toml (core and dev) into `==X`, a separate venv
# installs exactly those (torch's CPU build where that index is reachable, else PyPI's), and the
# tests that exercise each floored package run there (docs/dependencies.md: the last result).
# A floor that does not install or fail these tests is raised in pyproject.toml, not here.
FLOORS_VENV := .venv-floors
FLOORS_BIN  := $(FLOORS_VENV)/bin
FLOORS_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
FLOORS_TESTS := tests/test_tokenizer.py tests/test_wordpiece_cache.py tests/test_config.py \
  tests/test_sources.py tests/test_glue.py tests/test_curate_dedup.py tests/test_report.py \
  tests/test_serve.py tests/test_serve_transport.py tests/test_serve_fastpath.py \
  tests/test_serve_backends.py \
  tests/test_serve_openai.py tests/test_hf_export.py tests/test_retrieval.py \
  tests/test_privacy_dp.py tests/test_substring_dedup.py tests/test_prep_scale.py \
  tests/test_prep_ray.py tests/test_cli_errors.py

$(FLOORS_VENV)/.installed: pyproject.toml .ci/floors.py
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_BIN)/pip install --quiet --upgrade pip packaging "tomli; python_version < '3.11'"
	$(FLOORS_BIN)/python .ci/floors.py > $(FLOORS_VENV)/floors.txt
	@# an unreachable extra index costs pip minutes of retries: probe it once
	if $(FLOORS_BIN)/python -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=10)' \
	    $(FLOORS_TORCH_INDEX)/torch/ 2>/dev/null; then idx="--extra-index-url $(FLOORS_TORCH_INDEX)"; \
	  else echo "note: $(FLOORS_TORCH_INDEX) unreachable: torch from PyPI (with CUDA libraries)"; idx=; fi; \
	  $(FLOORS_BIN)/pip install --quiet $$idx -c $(FLOORS_VENV)/floors.txt torch
	$(FLOORS_BIN)/pip install --quiet -c $(FLOORS_VENV)/floors.txt -e ".[dev]"
	touch $@

test-floors: $(FLOORS_VENV)/.installed
	@$(FLOORS_BIN)/pip check
	$(FLOORS_BIN)/python -m pytest -m "not heavy" $(FLOORS_TESTS)

# ---------------------------------------------------------------------------- GPU check
# docs/gpu.md: on a machine with a package index, `make gpu-wheels` fetches the wheels of what
# shoestring imports that the lent GPU machine (Python 3.12, torch/transformers/... preinstalled,
# no network) lacks; there, `make gpu-check` installs them and runs the CUDA tests and the GPU
# benchmark. The list is the pyproject dependencies (and the dev extras the CUDA tests use)
# minus the machine's package list (/work/.library/device/KINDS.md), each with what it needs
# that the machine lacks too, at the versions the CPU suite runs with (constraints.txt pins them).
GPU_WHEELS_DIR ?= .gpu-wheels
GPU_WHEELS := pydantic pydantic-core annotated-types typing-inspection typing-extensions \
  zstandard rensa datasets dill multiprocess fastapi starlette opentelemetry-api uvicorn \
  httptools opacus orjson
GPU_PLATFORMS := $(foreach n,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1,--platform $(n)_x86_64)
GPU_SITE ?= /tmp/shoestring-gpu-site
GPU_OUT  ?= $(if $(OUT),$(OUT),runs/gpu-check)
GPU_SECONDS ?= 10
GPU_PART ?= all
GPU_DATA ?= .gpu-data/wiki-books-32k
GPU_QUALITY_SECONDS ?= 120
GPU_PLANNER_BUDGET ?= 5m
GPU_RTD_BUDGET ?= 120s

gpu-wheels:
	mkdir -p $(GPU_WHEELS_DIR)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp $(GPU_PLATFORMS) -d $(GPU_WHEELS_DIR) -c $(CONSTRAINTS) $(GPU_WHEELS)
	@du -sh $(GPU_WHEELS_DIR)

# Here, before a GPU_PART=default, planner or rtd check: the deterministic wiki-books slice it
# trains on (every 4th document of each source, ~17.9M train tokens, ~38 MiB) and SST-2's
# first 5,000 rows beside it (rtd's task), prepped by bench/gpu_data.py
# into the ignored folder the device command carries (docs/gpu.md). Minutes on 2 cores.
gpu-data:
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_data.py --out $(GPU_DATA)
	@tree=$$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1); \
	  wheels=$$(du -sb $(GPU_WHEELS_DIR) 2>/dev/null | cut -f1); data=$$(du -sb $(dir $(GPU_DATA)) | cut -f1); \
	  awk -v t=$$tree -v w=$${wheels:-0} -v d=$$data 'BEGIN { m = 1048576; printf \
	    "what travels: tree %.1f MiB + $(GPU_WHEELS_DIR) %.1f MiB + $(dir $(GPU_DATA)) %.1f MiB = %.1f MiB (64 MiB at most)\n", \
	    t / m, w / m, d / m, (t + w + d) / m }'

# On the GPU machine: bench/gpu_check.sh (also runnable without make) installs the wheels
# into a side folder on PYTHONPATH, runs the `cuda` tests, then the benchmark, and writes the
# results under $(GPU_OUT) (the device tool's $OUT when set). GPU_PART=tests or bench: one half
# (each fits one 10-minute device command); GPU_PART=default: issue 48's default-path and
# quality rows with the hand-configured mlm-base row, on $(GPU_DATA) (`make gpu-data`);
# GPU_PART=planner: issue 51's calibrated plan, trained and evaluated, at $(GPU_PLANNER_BUDGET);
# GPU_PART=serve: issue 49's serving rows (1, 2 and 4 replicas of the mlm-cram run);
# GPU_PART=rtd: issue 60's RTD-vs-MLM BERT-base row, $(GPU_RTD_BUDGET) each, on $(GPU_DATA).
gpu-check:
	GPU_WHEELS_DIR=$(GPU_WHEELS_DIR) GPU_SITE=$(GPU_SITE) GPU_OUT=$(GPU_OUT) \
	  GPU_SECONDS=$(GPU_SECONDS) GPU_PART=$(GPU_PART) GPU_DATA=$(GPU_DATA) \
	  GPU_QUALITY_SECONDS=$(GPU_QUALITY_SECONDS) GPU_PLANNER_BUDGET=$(GPU_PLANNER_BUDGET) \
	  GPU_RTD_BUDGET=$(GPU_RTD_BUDGET) bash bench/gpu_check.sh
