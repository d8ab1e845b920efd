# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if it is missing and install what they need; the second time they are quick.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned here (not in pyproject) so that a machine with a local CPU wheel of this
# version uses it instead of downloading the newest CUDA build; users may override:
#   make demo TORCH_SPEC='torch>=2.6'
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test install dev clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev]"
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

dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/shoestring cram

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs/cram
