"""Every path the workflow writes under results/, named once: the rules, the jobs and the report
read them from here. Relative paths: the workflow runs in its working directory."""

from __future__ import annotations

RESULTS = "results"
CELLS_DIR = f"{RESULTS}/cells"
EXT_DIR = f"{RESULTS}/ext"
EXT_BUILD = f"{EXT_DIR}/build.json"
TABLES_DIR = f"{RESULTS}/tables"
FIGURES_DIR = f"{RESULTS}/figures"
BENCH_DIR = f"{RESULTS}/bench"
REPORT_DIR = f"{RESULTS}/report"
LOGS_DIR = f"{RESULTS}/logs"
# The machine's floor (dpstudy.microbench.floor): one JSON per repeat round.
FLOOR_DIR = f"{RESULTS}/floor"

# dpstudy.analysis.collect writes one CSV per table, and the list of stale records: the tables of
# records (cells ... util), then what collect.summarise derives from them; every number the report
# states is a column of one of them.
TABLES = (
    "cells",
    "epochs",
    "ranks",
    "util",
    "memory_split",
    "settings",
    "scaling",
    "scaling_settings",
    "comparisons",
    "strategies",
    "summary",
    "data_wait",
    "memory",
    "memory_accuracy",
    "memory_spread",
    "util_means",
    "varied",
    "pivot",
    "floor",
    "comm_fit",
    "forecasts",
    "largest_batch",
)
STALE_FILE = "stale.txt"
UNREADABLE_FILE = "unreadable.txt"  # records collect could not read (--keep-going), one per line
# The one list of figure files: dpstudy.report.figures draws each with the function named after it
# (scaling.png: scaling), and the Snakefile names the figure rule's outputs from it without matplotlib.
FIGURES = (
    "overview.png",
    "throughput.png",
    "scaling.png",
    "model.png",
    "forecasts.png",
    "epoch_split.png",
    "accuracy_epochs.png",
    "accuracy_batch.png",
    "memory.png",
    "memory_split.png",
    "strategies.png",
    "backends.png",
    "utilisation.png",
)
# The microbenchmarks (config `bench`): the CSV and the figure of each.
BENCHMARKS = ("kernels", "comm")
REPORT_HTML = f"{REPORT_DIR}/report.html"
REPORT_NOTEBOOK = f"{REPORT_DIR}/report.ipynb"
STUDY_YAML = f"{REPORT_DIR}/study.yaml"
# Every cell's predicted peak memory per device, written before any training (dpstudy.workflow.memory_plan).
MEMORY_PLAN = f"{RESULTS}/plan/memory.csv"
# The last check of the study's own models and data that passed (dpstudy.workflow.usercheck).
USER_CHECK = f"{RESULTS}/plan/user_check.json"


def cell_dir(cell: str) -> str:
    return f"{CELLS_DIR}/{cell}"


def record_path(cell: str) -> str:
    return f"{cell_dir(cell)}/record.json"


def floor_path(repeat: int | str) -> str:
    return f"{FLOOR_DIR}/r{repeat}.json"


def table_files() -> list[str]:
    lists = [f"{TABLES_DIR}/{name}" for name in (STALE_FILE, UNREADABLE_FILE)]
    return [f"{TABLES_DIR}/{name}.csv" for name in TABLES] + lists


def figure_files() -> list[str]:
    return [f"{FIGURES_DIR}/{name}" for name in FIGURES]


def bench_csv(name: str) -> str:
    return f"{BENCH_DIR}/{name}.csv"
