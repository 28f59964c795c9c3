# Every target does its own set-up: a virtualenv in .venv, the project installed into it,
# the protos generated into the `amc` package. Nothing here needs root.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PROTOS := $(wildcard protos/amc/v1/*.proto)
GENERATED := amc/v1/.generated
# buf (lint, and `buf curl` in the tests) from the npm registry, into .tools/
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf

.PHONY: help setup tools protos run test lint bench chaos fuzz clean

help:
	@echo "make run    - embedded PostgreSQL + control plane + a host agent (local farm)"
	@echo "make test   - the test suite (PYTEST_ARGS= to pass pytest flags)"
	@echo "make lint   - buf lint, ruff (with complexity), mypy (--strict on the control plane and agent), import contracts"
	@echo "make setup  - the virtualenv in .venv, the project and the generated protos (every target does this first)"
	@echo "make tools  - buf, for make lint and the tests"
	@echo "make protos - regenerate the amc.v1 Python package from protos/"
	@echo "make bench  - throughput and latency figures beside PostgreSQL's and pgqueuer's"
	@echo "make chaos  - DURATION s (180) of random faults on 3 agents + HOSTS (60) fleet hosts; 7 invariants"
	@echo "make fuzz   - 100,000 fuzzed requests across every RPC"
	@echo "make clean  - remove the virtualenv, the generated code and the tools"
	@echo "make help   - this list"

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

$(BUF):
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

tools: $(BUF)

protos: $(INSTALLED)
	$(PY) scripts/gen_protos.py
	touch $(GENERATED)

run: setup
	$(PY) scripts/localfarm.py $(ARGS)

test: setup tools
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup tools
	$(BUF) lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict control_plane host_agent
	$(VENV)/bin/mypy amc_common amc_cli
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) scripts/bench.py $(ARGS)

# >= 100,000 fuzzed requests across every RPC (make test runs a few thousand)
fuzz: setup
	AMC_FUZZ_EXAMPLES=100000 $(PY) -m pytest tests/test_fuzz.py -p no:cacheprovider -o timeout=0 $(PYTEST_ARGS)

DURATION ?= 180
# Fleet hosts besides the 3 agents (each the real agent, own host id and parked Acquire; 0: none)
HOSTS ?= 60
chaos: setup
	$(PY) scripts/chaos.py --duration $(DURATION) --hosts $(HOSTS) $(ARGS)

clean:
	rm -rf $(VENV) amc .tools .pytest_cache
