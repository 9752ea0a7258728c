"""Staleness is derived, not listed: the training code is every module a cell imports, and an edit
to any of it (and to nothing else) changes the source hash that flags finished cells as stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from dpstudy.record import provenance
from dpstudy.study.spec import complete

# Loaded at the start of every Python process of the job (the launcher, torchrun, each rank): at
# exit it lists the dpstudy modules the process had imported, whichever way (importlib included).
SITECUSTOMIZE = """
import atexit, os, sys
def _dump():
    names = [m for m in sys.modules if m == "dpstudy" or m.startswith("dpstudy.")]
    with open(os.path.join(os.environ["DPSTUDY_MODULES_DIR"], f"{os.getpid()}.txt"), "w") as f:
        f.write("\\n".join(names))
atexit.register(_dump)
"""


def imported_modules(argv: list[str], tmp_path: Path, ext_dir: Path) -> set[str]:
    """The dpstudy modules a job really imports, in all of its processes (lenet_ext loading the
    extension built in `ext_dir`)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "modules").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
        "DPSTUDY_MODULES_DIR": str(tmp_path / "modules"),
        "DPSTUDY_EXT_DIR": str(ext_dir),
    }
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumps = list((tmp_path / "modules").glob("*.txt"))
    assert len(dumps) >= 3  # launcher, torchrun, rank
    return {name for dump in dumps for name in dump.read_text().split()}


def test_every_module_a_cell_imports_is_training_code(tmp_path, synthetic_root, ext_test_dir):
    spec = complete(
        {
            "dataset": "synthetic",
            "model": "lenet_ext",
            "mode": "ddp",
            "backend": "gloo",
            "gpus": 1,
            "batch": 64,
            "epochs": 1,
            "data_root": str(synthetic_root),
            "device": "cpu",
        }
    )
    # The real job: the launcher, torchrun and a rank (lenet_ext loads the extension's layers).
    modules = imported_modules(
        [
            sys.executable,
            "-m",
            "dpstudy.jobs.launch",
            "--spec",
            json.dumps(spec),
            "--cell",
            "probe",
            "--out",
            str(tmp_path / "cell"),
            "--log",
            str(tmp_path / "cell.log"),
            "--gpus",
            "0",
            "--cores",
            "2",
        ],
        tmp_path,
        ext_test_dir,  # the session's build: the job loads it instead of building results/ext
    )
    modules |= {"dpstudy.jobs.launch", "dpstudy.engine.__main__"}  # run as __main__, not imported
    assert {
        "dpstudy.record.provenance",
        "dpstudy.engine.train",
        "dpstudy.engine.outcome",
        "dpstudy.engine.monitor",
        "dpstudy.models.lenet_ext",
    } <= modules
    assert (tmp_path / "cell" / "record.json").is_file()
    training = set(provenance.training_paths())
    outside = sorted(m for m in modules if provenance.module_file(m) not in training)
    assert outside == []


def test_the_training_code_holds_no_aggregation_or_report_code():
    stages = {p.relative_to(provenance.PACKAGE).parts[0] for p in provenance.training_paths()}
    assert {"engine", "data", "models", "ext", "jobs", "record", "study", "util"} <= stages
    assert not stages & {"analysis", "report", "microbench", "gpucheck"}


HASH_EACH_EDIT = """
import json, sys
from pathlib import Path
from dpstudy.record import provenance
package = provenance.PACKAGE
def fresh_hash():
    provenance.training_paths.cache_clear(); provenance.source_hash.cache_clear()
    return provenance.source_hash()
before, changed = fresh_hash(), {}
for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".yaml", ".cpp", ".cu", ".cuh", ".h")
                   and "__pycache__" not in p.parts):
    original = path.read_bytes()
    comment = b"// edit" if path.suffix in (".cpp", ".cu", ".cuh", ".h") else b"# edit"
    path.write_bytes(original + b"\\n" + comment + b"\\n")
    changed[str(path.relative_to(package))] = fresh_hash() != before
    path.write_bytes(original)
print(json.dumps(changed))
"""


@pytest.fixture(scope="module")
def hash_changes(tmp_path_factory) -> dict[str, bool]:
    """{file of the package: whether an edit of it changes the source hash}, on a copy of the package."""
    root = tmp_path_factory.mktemp("package")
    shutil.copytree(provenance.PACKAGE, root / "dpstudy", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-c", HASH_EACH_EDIT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "module",
    [
        "engine/outcome.py",
        "engine/monitor.py",
        "engine/train.py",
        "engine/loaders.py",
        "data/store.py",
        "data/synthetic.py",
        "models/resnet.py",
        "ext/ops.py",
        "ext/csrc/conv2d.cpp",
        "study/spec.py",
        "study/schema.yaml",
        "jobs/launch.py",
    ],
)
def test_an_edit_of_training_code_flags_finished_cells(hash_changes, module):
    assert hash_changes[module] is True


@pytest.mark.parametrize(
    "module",
    [
        "analysis/collect.py",
        "analysis/stats.py",
        "report/findings/speedup.py",
        "report/text.py",
        "report/figures/layout.py",
        "report/sources.yaml",
        "microbench/kernels.py",
        "gpucheck/runner.py",
        "study/outputs.py",
    ],
)
def test_an_edit_of_aggregation_or_report_code_flags_nothing(hash_changes, module):
    assert hash_changes[module] is False


def test_the_hash_covers_exactly_the_training_code(hash_changes):
    training = {str(p.relative_to(provenance.PACKAGE)) for p in provenance.training_paths()}
    assert {f for f, changed in hash_changes.items() if changed} == training


def test_each_rule_depends_on_the_code_it_runs():
    collect = provenance.code_files("scripts/collect.py")
    figures = provenance.code_files("scripts/figures.py")
    report = provenance.code_files("scripts/report.py", "notebooks/report.ipynb")
    assert "dpstudy/analysis/stats.py" in collect and "dpstudy/engine/outcome.py" in collect  # it hashes it
    assert "dpstudy/report/text.py" in figures and "dpstudy/engine/train.py" not in figures
    assert {
        "dpstudy/report/findings/__init__.py",
        "dpstudy/report/findings/strategies.py",
        "dpstudy/report/sources.py",
        "dpstudy/report/sources.yaml",
    } <= set(report)
    assert "dpstudy/report/figures/strategies.py" in figures  # a topic module, found through the registry's imports
    assert not any(path.startswith("dpstudy/engine/") for path in report)
