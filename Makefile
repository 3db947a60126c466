# The two commands a newcomer needs: `make run` and `make test`. Both create the virtualenv on first use.
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.run-stamp
DEV_STAMP := $(VENV)/.dev-stamp
# This machine's pip configuration names an index folder that may be missing; its warnings are noise.
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
QUIET_PIP := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }

.PHONY: run run-slurm test lint bench clean venv slurm-up slurm-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e . $(QUIET_PIP)
	touch $@

# OPA's own evaluator as a library, for the OPA engines' tests and `--policy-engine opa-inprocess`: OPA v1.20.2
# compiled as a shared library. It declares Python >= 3.14 but loads on 3.11, and pip installs it only when told
# to ignore that, so it cannot be in the dev extra: it is a step of its own, pinned exactly. Keep the pin equal to
# OPA_GOLIB_PIN in gateway/decisions/policy/opa_inprocess.py (a test checks).
OPA_GOLIB := opa-golib-python-bindings==0.4.4

$(DEV_STAMP): pyproject.toml Makefile | $(BIN)/python
	$(PIP) -e '.[dev]' $(QUIET_PIP)
	$(PIP) --no-deps --ignore-requires-python '$(OPA_GOLIB)' $(QUIET_PIP)
	touch $@ $(RUN_STAMP)

venv: $(DEV_STAMP)

## Start the whole system on the embedded default (SQLite, embedded Rego, two local node agents).
## `make run PORT=8081` when 8080 is taken.
PORT ?= 8080
run: $(RUN_STAMP)
	$(BIN)/jobgate up --demo --port $(PORT)

## Create the environment and run the whole test suite.
test: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Benchmarks print JSON figures, each beside a baseline measured in the same run. The replicas' need a
## PostgreSQL server to make their databases in: `make bench BENCH_PG_URL=postgresql://...` elsewhere.
BENCH_PG_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
bench: $(DEV_STAMP)
	@for b in bench/*.py; do echo "== $$b"; JOBGATE_BENCH_PG_URL=$${JOBGATE_BENCH_PG_URL:-$(BENCH_PG_URL)} $(BIN)/python $$b || exit 1; done

## A local Slurm 22.05 cluster from Debian's packages (as root), for jobgate in front of Slurm:
## `make slurm-up SLURM_NODES=16`, then `. /tmp/jobgate-slurm/env.sh` (deploy/slurm/README.md).
SLURM_NODES ?= 8
slurm-up:
	deploy/slurm/up $(SLURM_NODES)

slurm-down:
	deploy/slurm/down

## jobgate in front of that cluster (as root): `deploy/slurm/up`, then the gateway on it with the demo organisation
## (no demo node agents: Slurm's nodes run the jobs; env.sh names slurm.conf, jobgate's service user and where the
## jobs' checkpoints go, reached by the service user and the nodes), its data in var-slurm. `make slurm-down` stops it.
SLURM_DIR ?= /tmp/jobgate-slurm
SLURM_DATA ?= var-slurm
run-slurm: $(RUN_STAMP)
	JOBGATE_SLURM_DIR=$(SLURM_DIR) deploy/slurm/up $(SLURM_NODES)
	. $(SLURM_DIR)/env.sh && $(BIN)/jobgate up --backend slurm --demo --port $(PORT) --data-dir $(SLURM_DATA)

clean:
	rm -rf $(VENV) var var-slurm .pytest_cache .mypy_cache .ruff_cache
