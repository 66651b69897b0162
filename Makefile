# `make demo` runs the factory on the embedded default; `make test` runs the test suite, `make test-fast`
# its unit tier (docs/architecture.md#tests-and-their-tiers).
# Both create .venv/ and install the project when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .gymfoundry
# The Prefect and Hugging Face environment defaults are Python's: gymfoundry.flows.defaults

.PHONY: install demo test test-fast bench loop clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gymfoundry demo --data-dir $(DATA_DIR)

test: $(STAMP)
	$(BIN)/pytest -q

# The unit tier: the inner loop (no Prefect server, subprocess, sandbox or trainer).
test-fast: $(STAMP)
	$(BIN)/pytest -q -m unit

# Every benchmark in a quick mode, one table (about 10 minutes on 2 CPU cores; not part of `make test`).
bench: $(STAMP)
	$(BIN)/python tests/benchmarks/run_all.py

# The closed loop (about 70 minutes on 2 CPU cores; not part of `make test`).
loop: $(STAMP)
	$(BIN)/gymfoundry loop --data-dir .gymfoundry-loop

clean:
	rm -rf $(VENV) $(DATA_DIR)
