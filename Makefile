# fwbench: `make bench` runs the quick suite on the CPU; `make test` runs the test suite.
# Both create .venv on first use and reuse it afterwards (reinstalling when the pins change).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.fwbench-installed
# Framework caches stay inside the checkout (ignored by git).
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export KERAS_HOME ?= $(CURDIR)/.cache/keras

.PHONY: bench test install clean oracles bench-zoo

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --constraint constraints.txt --editable '.[all,test]'
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/fwbench run --suite quick --db results/fwbench.db
	$(BIN)/fwbench report --db results/fwbench.db --run latest --format csv --out results/latest.csv
	$(BIN)/fwbench report --db results/fwbench.db --run latest --format json --out results/latest.json

test: $(STAMP)
	$(BIN)/python -m pytest

# transformers' TensorFlow models need tf-keras; --no-deps, or it pulls the full tensorflow package.
oracles: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps tf-keras==2.21.0

# Our implementations against transformers' (benchmarks/zoo_speed.py); one process per framework.
bench-zoo: oracles
	$(BIN)/python benchmarks/zoo_speed.py --framework torch
	$(BIN)/python benchmarks/zoo_speed.py --framework tensorflow

clean:
	rm -rf $(VENV) .cache *.egg-info
