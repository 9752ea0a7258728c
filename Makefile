# The two commands a new user needs: `make run` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
GPUS ?= 2
# make setup's options (scripts/setup_venv.py):
#   TORCH=system   use the PyTorch that $(PYTHON) imports (a cluster module, a container's) instead of
#                  the lock's; the venv remembers it, so a later `make run` keeps it
#   WHEELS=DIR     install from a folder of wheels alone, with no network (make wheelhouse fills one)
#   INSTALLER=pip  pip installs everything (default: uv online from the lock, from its cache
#                  ~/.cache/uv; pip offline and for TORCH=system)
#   EXTRAS=test    dpstudy's extras (default test,browser,timm,text,transformers,deepspeed; browser is
#                  playwright, 50 MB; timm for timm:<name> models, text for BPE tokenizers, transformers
#                  for transformers:<name> models, deepspeed for mode deepspeed)
# The venv remembers TORCH and EXTRAS: a later `make run` or `make test` keeps them.
TORCH ?=
WHEELS ?=
INSTALLER ?=
EXTRAS ?=
# make test's and make test-fast's: pytest-xdist workers, one per core (0: none, all in one process),
# and one more for the tests that mostly wait (tests/conftest.py WAITING: SLURM, time limits)
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(shell expr $(TEST_WORKERS) + 1) --waiting-lane)
# make wheelhouse's: WHEELS (default wheelhouse/), WHEELS_PYTHON=3.12 for another Python,
# WITH_TORCH=1 to add torch, torchvision and their CUDA libraries (several GB).
WHEELS_PYTHON ?=
WITH_TORCH ?=

# Debian packages. Of a study: jemalloc, the allocator its cells run with (config allocator: auto
# falls back to glibc's malloc, tuned, without it); `make run` installs it when it runs as root.
# Of the tests besides: a private SLURM (the cluster tests) and Chromium (the HTML report, opened
# headless); `make test` installs the missing ones when it runs as root, otherwise those tests are
# skipped with the reason.
RUN_PACKAGES := libjemalloc2
SYSTEM_PACKAGES := $(RUN_PACKAGES) slurmctld slurmd slurm-client munge chromium

.PHONY: setup docs wheelhouse lock run-packages system-packages lint test test-fast run example gpu-check clean

# Quick and silent when .venv is up to date; (re)installs when pyproject.toml or the lock changed.
setup:
	@$(PYTHON) scripts/setup_venv.py setup --venv $(VENV) $(if $(EXTRAS),--extras $(EXTRAS)) \
		$(if $(TORCH),--torch $(TORCH)) $(if $(WHEELS),--wheels $(WHEELS)) \
		$(if $(INSTALLER),--installer $(INSTALLER))

# docs/config.md, the study config reference, from dpstudy/study/schema.yaml, and docs/record.md,
# the record reference, from dpstudy/record/fields.py (tests/unit/test_docs.py fails while either is
# not current).
docs: setup
	$(BIN)/python -m dpstudy.study.reference --out docs/config.md
	$(BIN)/python -m dpstudy.record.reference --out docs/record.md

wheelhouse:
	$(PYTHON) scripts/setup_venv.py wheelhouse --dest $(or $(WHEELS),wheelhouse) \
		$(if $(WHEELS_PYTHON),--python-version $(WHEELS_PYTHON)) $(if $(WITH_TORCH),--with-torch)

# After a change of pyproject.toml: pin what the tests now pass with.
lock:
	$(BIN)/python -m pip install --quiet -e '.[test,browser,timm,text,transformers,deepspeed]'
	$(BIN)/python scripts/lock_requirements.py

# $(call apt_install,PACKAGES,WHAT WITHOUT THEM): install the missing ones as root, else say so.
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing" $$missing "(Debian)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
			|| echo "could not install" $$missing": $(2)"; \
	else \
		echo "not installing" $$missing "(needs root and apt-get): $(2)"; \
	fi
endef

run-packages:
	$(call apt_install,$(RUN_PACKAGES),cells run with glibc's malloc told to keep its memory instead)

system-packages:
	$(call apt_install,$(SYSTEM_PACKAGES),the tests that need them will be skipped)

# ruff (lint and format) over the Python code, snakefmt and Snakemake's own linter over the workflow.
# `ruff format .` and `snakefmt Snakefile rules` fix what they report.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint

# The tests run in TEST_WORKERS processes (pytest-xdist) and one that runs only the tests that mostly
# wait: a test module is one unit of work (tests/conftest.py), the longest first. TEST_WORKERS=0 runs
# them in this process, one by one.
test: setup system-packages lint
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

test-fast: setup
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow"

run: setup run-packages
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) --resources gpu=$(GPUS)

# Your own model and data (examples/own_model): its image folder, then its study to the report.
example: setup run-packages
	$(BIN)/python examples/own_model/make_images.py
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) --resources gpu=$(GPUS) \
		--configfile examples/own_model/study.yaml

# On a GPU host: every CUDA path of dpstudy in one run, summarised in results/gpu-check/summary.md.
# ONLY=tests,study runs some of the eight checks (the summary keeps the others' last results).
# Without a GPU it says so in one line and runs nothing (python -m dpstudy.gpucheck exits 77).
gpu-check: setup
	@PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m dpstudy.gpucheck $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf results/* .snakemake
