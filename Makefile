# The two commands that matter on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
# Any Python >= 3.11: the first of these whose version says so (PY=... overrides).
PY ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; \
	done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The lock: exact versions of every dependency of every extra, for all platforms and
# Pythons >= 3.11. `make install` (and so CI) installs through it; `make lock` refreshes it.
LOCK := requirements/constraints.txt

.PHONY: install stack-build browser postgres production-build test-production test-k8s image demo test lint typecheck unit integration bench soak model-check chaos down lock

$(STAMP): pyproject.toml perago-dev/pyproject.toml $(LOCK)
	@test -n "$(PY)" || { echo "Python >= 3.11 is required (none of python3, python3.13, python3.12, python3.11 is); set PY=/path/to/python"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# The distribution was called `perago` before it became perago-runtime.
	$(BIN)/pip uninstall -q -y perago 2>/dev/null || true
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev]' -e ./perago-dev
	touch $(STAMP)

## lock: re-resolve requirements/constraints.txt after a change of pyproject.toml's dependencies
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml perago-dev/pyproject.toml --all-extras --universal \
		--python-version 3.11 \
		--no-emit-package perago-runtime --custom-compile-command "make lock" -o $(LOCK)

## install: virtualenv + dependencies + stack binaries + a browser for the UI test (idempotent)
install: $(STAMP) stack-build browser

# $(call apt_install,PACKAGES,WHY): Debian's packages, installed when root on Debian (else say so).
apt_install = if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's $(1) ($(2))"; \
		apt-get install -y -q --no-install-recommends $(1) >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(1) >/dev/null; }; \
	else \
		echo "missing: install $(1) (Debian: sudo apt-get install $(1)); $(2) needs it"; \
	fi

# Debian's Chromium, for the test that looks at lakeFS's web UI.
browser:
	@command -v chromium >/dev/null || { $(call apt_install,chromium,tests/integration/test_webui.py); }

stack-build: $(STAMP)
	$(BIN)/perago dev build

# PostgreSQL for the production profile.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
	{ $(call apt_install,postgresql,the production profile); }

production-build: $(STAMP) postgres
	$(BIN)/perago dev build --profile production

## demo: the example pipeline end to end on the local stack (leaves the stack running)
demo: install
	$(BIN)/python -m workers.demo

LINTED := $(wildcard perago perago-dev workers tests benchmarks model chaos)

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) -m "not exhaustive" tests/unit

integration: install
	$(BIN)/pytest -q tests/integration

# Test processes beside each other (pytest-xdist): most tests wait on servers, not on CPU.
TEST_WORKERS ?= 4

## test: install, lint, typecheck, all tests (CI calls this). Two phases on one stack: the
## isolated tests in TEST_WORKERS processes, then those marked `serial` alone (they restart
## the stack or its servers, or run a worker whose start-up janitor sweeps every repository).
test: install lint typecheck
	@run=$$($(BIN)/python -c 'import uuid; print(uuid.uuid4().hex)'); status=0; \
	export PERAGO_STACK_PROFILE=embedded; \
	PERAGO_TEST_RUN=$$run PERAGO_TEST_KEEP_STACK=1 $(BIN)/pytest -q -ra --durations=25 \
		-n $(TEST_WORKERS) --dist loadgroup -m "not serial and not exhaustive" tests || status=$$?; \
	PERAGO_TEST_RUN=$$run $(BIN)/pytest -q -ra --durations=10 -m "serial and not exhaustive" tests || status=$$?; \
	exit $$status

## test-production: the integration suite on the production profile (PostgreSQL under Conductor
## and lakeFS, lakeFS's objects on versitygw), in the same two phases; the embedded stack is
## stopped first (one stack at a time). PRODUCTION_TESTS narrows it to some files.
PRODUCTION_TESTS ?= tests/integration
test-production: install production-build
	$(BIN)/perago dev down
	@run=$$($(BIN)/python -c 'import uuid; print(uuid.uuid4().hex)'); status=0; \
	export PERAGO_STACK_PROFILE=production; \
	PERAGO_TEST_RUN=$$run PERAGO_TEST_KEEP_STACK=1 $(BIN)/pytest -q -ra --durations=15 \
		-n $(TEST_WORKERS) --dist loadgroup -m "not serial and not exhaustive" $(PRODUCTION_TESTS) || status=$$?; \
	PERAGO_TEST_RUN=$$run $(BIN)/pytest -q -ra --durations=10 -m "serial and not exhaustive" $(PRODUCTION_TESTS) || status=$$?; \
	exit $$status

## image: the worker image without a registry (debootstrap + buildah, as root; an OCI archive in
## .stack/image), then its entrypoint checked in a read-only chroot against the production profile
image: install production-build
	@command -v debootstrap >/dev/null && command -v buildah >/dev/null || \
	{ $(call apt_install,debootstrap buildah,perago dev image); }
	$(BIN)/perago dev down
	PERAGO_STACK_PROFILE=production $(BIN)/perago dev image

bench: install
	$(BIN)/python -m benchmarks.run

## soak: long race and crash loops, the 100k-file workspace, a 64-way publication group
## killed at every failpoint, and 2,000 attempts through one worker (figures in docs/)
soak: install
	PERAGO_RACE_ROUNDS=30 PERAGO_CRASH_ROUNDS=3 PERAGO_MANY_FILES=100000 \
	PERAGO_GROUP_KILL_WIDTH=64 PERAGO_GROUP_KILL_POINTS=all \
		$(BIN)/pytest -q -ra --durations=0 \
		tests/integration/test_exclusion.py tests/integration/test_bad_input.py \
		tests/integration/test_crash_suite.py \
		"tests/integration/test_fanout.py::test_a_worker_killed_while_a_publication_group_is_in_flight"
	$(BIN)/python -m benchmarks.worker_soak 2000

## model-check: the exhaustive model check (docs/model-check.md), 2 and 3 attempts of a step, fan-out
## and named inputs (reads), then the model tests too large for `make test` (marked exhaustive);
## CI runs it after `make test` (.ci/run), about 43 minutes on two cores
model-check: $(STAMP)
	$(BIN)/pytest -q -ra -m exhaustive -n 2 tests/unit
	$(BIN)/python -m model
	$(BIN)/python -m model --retries 2 --extensions 0
	$(BIN)/python -m model.fanout --no-traces
	$(BIN)/python -m model.reads --no-traces
	$(BIN)/python -m model --redelivery --extensions 0 --no-traces

## test-k8s: the worker chart against a real Kubernetes API server: etcd, kube-apiserver,
## kube-controller-manager and kube-scheduler built from pinned Go modules (cached in .stack/bin;
## the first build takes several minutes), KWOK for the nodes and pods (not part of `make test`)
## (the image check needs root: debootstrap and buildah come from Debian's packages)
test-k8s: install
	@command -v debootstrap >/dev/null && command -v buildah >/dev/null || \
	{ $(call apt_install,debootstrap buildah,make test-k8s); }
	$(BIN)/perago dev build --helm --k8s
	PERAGO_TEST_K8S=1 $(BIN)/pytest -q -ra --durations=10 tests/k8s

## chaos: workers under seeded faults (kills, pauses, server restarts, Toxiproxy), then an
## audit of Conductor's and lakeFS's records; figures prepended to docs/chaos.md. Not in `test`.
CHAOS_ARGS ?= --seed 1 --minutes 20 --workflows 200
chaos: install
	$(BIN)/python -m chaos $(CHAOS_ARGS)

down:
	$(BIN)/perago dev down
