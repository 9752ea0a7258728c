"""The scripts people run by hand or through the rules (benchmarks/, scripts/): every module they
import is there to import from where they run, without running them (a benchmark takes minutes).

A script run as `python benchmarks/X.py` finds its own folder first, then what it puts on sys.path
(the checkout, tests/ for the private SLURM and the workflow helpers), then the venv."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import REPO

SCRIPTS = sorted([*REPO.glob("benchmarks/*.py"), *REPO.glob("scripts/*.py")])


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, at any depth (imports inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            found.append((node.lineno, node.module))
    return found


def unresolved(path: Path) -> list[str]:
    """'line: module' for each import of the file that its folder, the checkout, tests/ and the
    venv do not hold."""
    saved = list(sys.path)
    sys.path[:0] = [str(path.parent), str(REPO), str(REPO / "tests")]
    try:
        return [f"{line}: {module}" for line, module in imported_modules(path) if not _found(module)]
    finally:
        sys.path[:] = saved


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def test_the_check_sees_an_import_that_cannot_resolve(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(
        "import json\n\ndef main():\n    from slurm_cluster import SlurmCluster\n    from helpers.nothing import x\n"
    )
    assert unresolved(script) == ["4: slurm_cluster", "5: helpers.nothing"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_import_of_a_script_resolves(script):
    assert unresolved(script) == []
