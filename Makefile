# The two commands a new user needs: `make run` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2
GPUS ?= 2

# Debian packages of the tests: a private SLURM (the cluster tests) and Chromium (the HTML report,
# opened headless); `make test` installs the missing ones when it runs as root, otherwise those
# tests are skipped with the reason.
SYSTEM_PACKAGES := slurmctld slurmd slurm-client munge chromium

.PHONY: setup system-packages test test-fast run clean

setup: $(STAMP)

# Reinstall only when the dependency list changes; the package itself is an editable install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "dpstudy (python3)" >/dev/null
	touch $@

system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing" $$missing "(Debian) for the tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
			|| echo "could not install" $$missing": the tests that need them will be skipped"; \
	else \
		echo "not installing" $$missing "(needs root and apt-get): the tests that need them will be skipped"; \
	fi

test: setup system-packages
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

run: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) --resources gpu=$(GPUS)

clean:
	rm -rf results/* .snakemake
