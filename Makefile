# Two commands do all set-up on a fresh machine:
#   make run    the main job on the embedded defaults (twin workload, SQLite ledger, local executor)
#   make test   installs what it needs, starts PostgreSQL and the local Slurm cluster, runs pytest
# and one is the developer's loop:
#   make check  the fast tier: no services (Slurm, PostgreSQL, chromium) and no `long` end-to-end test; minutes
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest workers: the suite often waits on jobs, sweeps and Slurm, so more workers than cores still pays (docs/faults.md:
# idle, 3 workers left 31% of the 2 cores idle and 4 about 12%)
TEST_WORKERS ?= 4
STAMP := $(VENV)/.installed-$(shell md5sum pyproject.toml | cut -c1-8)
# each tier's last run (junit xml: wall time, per-test times), read by `make bench` (tests/bench/bench_suite.py)
TIMES ?= .test-times
# what `make check` leaves out: tests/conftest.py fails a test that reaches a service without its marker, and
# `make bench` (tests/bench/bench_suite.py) names the check tier's tests that took long without the `long` marker
CHECK_MARKERS := not slurm and not postgres and not chromium and not long
# pytest and every process it starts (CLI calls, sweeps, jobs, Megatron's tree) write and reuse bytecode, whatever the
# shell says: with PYTHONDONTWRITEBYTECODE set each of the suite's thousands of Python processes compiled the project
# (and Megatron's tree) from source again (docs/faults.md). __pycache__/ is git-ignored.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

.PHONY: install run check test lint bench services services-down clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch from the local wheel first: never let pip resolve an unpinned (CUDA) torch.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# megatron-core 0.19.x declares Python>=3.12; its cp311 wheel works for the parser and RankGenerator.
	$(PY) -m pip install -q --ignore-requires-python --no-deps megatron-core==0.19.2
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

run: install
	$(PY) -m orchestrator sweep +stage=1k cluster=local; rc=$$?; \
	echo "(run the commands above in the venv: source $(VENV)/bin/activate)"; exit $$rc

services: install
	bash tests/cluster/services.sh up
	# Debian's chromium renders the HTML report in tests/report/test_report.py (recorded: services-down removes it).
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium \
		&& mkdir -p /var/lib/orch-slurm-local && touch /var/lib/orch-slurm-local/installed-packages.chromium)

# Undo what `make test` did to this host: Slurm daemons, /etc/hosts line, /etc/slurm links, state, the packages.
services-down:
	bash tests/cluster/services.sh down --undo

check: install
	mkdir -p $(TIMES)
	ORCH_TEST_TIER=check $(PYTEST) tests -n $(TEST_WORKERS) --dist loadgroup -m "$(CHECK_MARKERS)" \
		--junitxml=$(TIMES)/check.xml --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

test: install services lint
	mkdir -p $(TIMES)
	$(PYTEST) tests -n $(TEST_WORKERS) --dist loadgroup --junitxml=$(TIMES)/test.xml --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy orchestrator

bench: install
	$(PY) tests/bench/run_all.py

clean:
	rm -rf $(VENV) runs reports ledger.sqlite* .pytest_cache .hypothesis .mypy_cache $(TIMES)
