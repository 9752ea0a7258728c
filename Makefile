# The two commands a new user needs: `make run` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2
GPUS ?= 2

.PHONY: setup test test-fast run clean

setup: $(STAMP)

# Reinstall only when the dependency list changes; the package itself is an editable install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "dpstudy (python3)" >/dev/null
	touch $@

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

run: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) --resources gpu=$(GPUS)

clean:
	rm -rf results/* .snakemake
