# fwbench: `make bench` runs the quick suite on the CPU; `make test` runs the test suite.
# Both create .venv on first use and reuse it afterwards (reinstalling when the pins change).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.fwbench-installed
# The tests' require() fails, not skips, a missing package: the targets below install every extra.
export FWBENCH_TESTS_NEED_EXTRAS ?= all
# Framework caches stay inside the checkout (ignored by git).
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export KERAS_HOME ?= $(CURDIR)/.cache/keras
# Compiled bytecode is kept (__pycache__, ignored by git) even where the shell sets PYTHONDONTWRITEBYTECODE: without it
# every worker process compiles fwbench's modules again and every pytest process rewrites every test module's asserts
# again (about 9 s of each collection).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: node-packages system-packages bench test test-matrix test-avx2 format install clean oracles bench-zoo

install: $(STAMP) node-packages

# --no-compile: pip would compile every module of every package (TensorFlow's, torch's, JAX's: 40 s of the 90);
# Python compiles and keeps those a process imports, once, at first import.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile --constraint constraints.txt --editable '.[all,test]'
	touch $(STAMP)

# The tfjs runtimes' Node.js packages (npm ci, once per lockfile; nothing without Node.js: those runtimes are skipped).
node-packages:
	scripts/ensure-node-packages

# The quick suite into the store, then the latest run as CSV, JSON and the HTML page; the last line names them all.
bench: $(STAMP) node-packages
	$(BIN)/fwbench run --suite quick --db results/fwbench.db
	$(BIN)/fwbench report --db results/fwbench.db --run latest --format csv --out results/latest.csv
	$(BIN)/fwbench report --db results/fwbench.db --run latest --format json --out results/latest.json
	$(BIN)/fwbench report --db results/fwbench.db --run latest --html results/latest.html
	@echo "make bench wrote: results/fwbench.db (every run), results/latest.csv, results/latest.json, results/latest.html"

# Lint, format, type and import-contract checks (pyproject.toml's [tool.importlinter]), then the tests: the parallel
# pass in one pytest-xdist process per physical core (each pinned to its own core, tests/conftest.py), then the tests
# marked serial (two CPUs each). (Run beside the parallel pass, they made both slower: spinning thread pools.)
TEST_PROCS ?= $(shell $(BIN)/python -c "from fwbench.measure.environment import physical_core_count as n; print(max(1, n()))" 2>/dev/null || echo 1)
CHECKED := fwbench tests benchmarks

# `make test WITH_MATRIX=1` (what CI runs) takes the matrix's tests into the same two passes: one collection each and
# one work queue for both tiers, instead of make test then make test-matrix.
NOT_MATRIX := $(if $(WITH_MATRIX),,and not matrix)

# The system packages some tests need, installed where missing (never failing the run; each script says why).
system-packages:
	scripts/ensure-chromium
	scripts/ensure-java

test: $(STAMP) node-packages system-packages
	$(BIN)/ruff check $(CHECKED)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_PROCS) --dist loadgroup -m "not serial $(NOT_MATRIX)"
	$(BIN)/python -m pytest -m "serial $(NOT_MATRIX)"

# The runtime × model matrix beyond make test's (tests marked matrix: every training runtime on the MLP and
# resnet-tiny and every model in each framework's model code, every framework's resnet-tiny fit loop, every
# deployment engine on every tiny model, ...).
# CI runs both tiers in make test's two passes (make test WITH_MATRIX=1).
test-matrix: $(STAMP) node-packages
	$(BIN)/python -m pytest -n $(TEST_PROCS) --dist loadgroup -m "matrix and not serial"
	$(BIN)/python -m pytest -m "matrix and serial"

# The same tests with every framework capped to AVX2 kernels (for AVX-512 / AVX512_BF16 / AMX machines: one machine
# checks that no numeric threshold depends on the ISA).
test-avx2: $(STAMP)
	FWBENCH_TEST_ISA=avx2 $(BIN)/python -m pytest -n $(TEST_PROCS) --dist loadgroup -m "not serial"

# Apply the formatter and the safe lint fixes that `make test` checks for.
format: $(STAMP)
	$(BIN)/ruff check --fix $(CHECKED)
	$(BIN)/ruff format $(CHECKED)

# transformers' TensorFlow models need tf-keras; --no-deps, or it pulls the full tensorflow package.
oracles: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps tf-keras==2.21.0

# Our implementations against transformers' (benchmarks/zoo_speed.py); one process per framework.
bench-zoo: oracles
	$(BIN)/python benchmarks/zoo_speed.py --framework torch
	$(BIN)/python benchmarks/zoo_speed.py --framework tensorflow

clean:
	rm -rf $(VENV) .cache *.egg-info fwbench/frameworks/tfjs/node_modules
