# The two commands that matter on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install stack-build demo test lint typecheck unit integration bench soak clean-stack down

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "Python 3.11 is required ($(PY) not found)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## install: virtualenv + dependencies + stack binaries (idempotent)
install: $(STAMP) stack-build

stack-build: $(STAMP)
	$(BIN)/perago dev build

## demo: the example pipeline end to end on the local stack (leaves the stack running)
demo: install
	$(BIN)/python -m workers.demo

lint: $(STAMP)
	$(BIN)/ruff check perago workers tests benchmarks
	$(BIN)/ruff format --check perago workers tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: install
	$(BIN)/pytest -q tests/integration

## test: install, lint, typecheck, all tests (CI calls this)
test: install lint typecheck
	$(BIN)/pytest -q -ra tests

bench: install
	$(BIN)/python -m benchmarks.run

soak: install
	PERAGO_SOAK=1 $(BIN)/pytest -q -ra tests/soak

down:
	$(BIN)/perago dev down
