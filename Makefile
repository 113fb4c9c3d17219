# Quickstart: `make demo` (installs into .venv, runs compress/default.yaml) and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
# This machine's pip config names local indexes that may be absent; their warnings are noise.
PIP_FILTER := grep -v "^WARNING: Location '" || true

.PHONY: install demo test bench sysdeps clean help

help:
	@echo "make demo   - install into $(VENV) (if needed) and run the default pipeline on embedded data"
	@echo "make test   - install into $(VENV) (if needed) and run the test suite"
	@echo "make bench  - slow tests and the CIFAR-10 pipeline on ../shared/datasets"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing effvision and its pinned dependencies into $(VENV) ..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | $(PIP_FILTER)
	@$(BIN)/python -c "import effvision, torch, onnxruntime, torch_pruning, timm" 
	@touch $(STAMP)

install: $(STAMP)

# System libraries some optional readers need (libusb for open3d): installed when we are root
# with apt-get; otherwise the tests that need them skip and say what to install.
sysdeps:
	@if ! ldconfig -p 2>/dev/null | grep -q libusb-1.0; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq libusb-1.0-0 >/dev/null) || echo "note: could not install libusb-1.0-0"; \
	  else echo "note: libusb-1.0-0 missing (apt-get install libusb-1.0-0); tests needing it will skip"; fi; \
	fi

demo: $(STAMP)
	$(BIN)/effvision compress compress/default.yaml --run-dir runs/demo

test: $(STAMP) sysdeps
	EFFVISION_QUIET=1 $(BIN)/python -m pytest -m "not slow"

bench: $(STAMP)
	EFFVISION_QUIET=1 $(BIN)/python -m pytest -m slow
	$(BIN)/effvision compress compress/cifar10.yaml --set data.root=../shared/datasets --run-dir runs/cifar10

clean:
	rm -rf runs .pytest_cache
