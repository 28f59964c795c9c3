# Every target does its own set-up: a virtualenv in .venv, the project installed into it,
# the protos generated into the `amc` package. Nothing here needs root.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PROTOS := $(wildcard protos/amc/v1/*.proto)
GENERATED := amc/v1/.generated

.PHONY: help setup protos run test lint bench chaos fuzz clean

help:
	@echo "make run    - embedded PostgreSQL + control plane + a host agent (local farm)"
	@echo "make test   - the test suite"
	@echo "make lint   - ruff and mypy"
	@echo "make protos - regenerate the amc.v1 Python package from protos/"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	touch $@

$(GENERATED): $(PROTOS) scripts/gen_protos.py $(INSTALLED)
	$(PY) scripts/gen_protos.py
	touch $@

setup: $(INSTALLED) $(GENERATED)

protos: $(INSTALLED)
	$(PY) scripts/gen_protos.py
	touch $(GENERATED)

run: setup
	$(PY) scripts/localfarm.py $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy control_plane host_agent amc_common amc_cli

clean:
	rm -rf $(VENV) amc .pytest_cache
