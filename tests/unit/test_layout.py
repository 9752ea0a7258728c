"""The package's shape: stages import only the stages below them, modules import in no circle, the
workflow plans without torch or pandas, and no module reaches outside the package for files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

from dpstudy.record import provenance

PACKAGE = provenance.PACKAGE
# Bottom to top: a stage may import the stages before it, never one after it.
LAYERS = (
    "util",
    "record",
    "data",
    "ext",
    "models",
    "study",
    "engine",
    "jobs",
    "workflow",
    "analysis",
    "report",
    "microbench",
    "gpucheck",
)


def modules() -> dict[str, Path]:
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    return {provenance.module_name(p): p for p in files}


def imports(path: Path) -> set[str]:
    """The dpstudy modules `path` imports (statements anywhere, module-name strings), as modules
    that exist; a package's own __init__ imported implicitly is not counted."""
    found = {provenance.module_file(n) for n in provenance.imported_names(path)}
    return {provenance.module_name(f) for f in found if f is not None} - {provenance.module_name(path)}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "dpstudy"


def test_every_subpackage_is_a_layer_and_the_top_level_holds_nothing_else():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


def test_stages_import_only_the_stages_below_them():
    upward = []
    for module, path in modules().items():
        for target in imports(path):
            here, there = stage(module), stage(target)
            if there != "dpstudy" and here != there and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_module_imports_itself_through_others():
    graph = {m: {t for t in imports(p) if not m.startswith(t + ".")} for m, p in modules().items()}
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(trail[trail.index(target) :] + [node, target]))
            elif target not in state:
                visit(target, trail + [node])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


def test_the_layer_check_sees_an_upward_import(tmp_path):
    # The checks above read sources; this one shows they would catch a report module in the engine.
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from dpstudy.report import findings\n    return 'dpstudy.analysis.stats'\n")
    assert {"dpstudy.report.findings", "dpstudy.analysis.stats"} <= provenance.imported_names(module)


def workflow_imports() -> list[str]:
    """The import statements of dpstudy in the Snakefile and rules/*.smk (run while planning)."""
    lines = []
    for path in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        # a parenthesised list (snakefmt wraps a long one) whole, up to its closing parenthesis
        lines += re.findall(
            r"^(?:from dpstudy[\w.]* import (?:\([^)]*\)|.+)|import dpstudy[\w.]*)$", path.read_text(), re.M
        )
    return lines


def test_the_workflow_plans_without_torch_pandas_or_matplotlib():
    lines = workflow_imports()
    assert "from dpstudy.study import outputs, sweeps" in lines
    assert "from dpstudy.workflow.planning import load_study" in lines
    code = (
        "import sys\n"
        + "".join(f"{line}\n" for line in lines)
        + "print(sorted(m for m in ('torch', 'pandas', 'matplotlib', 'scipy', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_reads_files_outside_the_package():
    # A non-editable install has no checkout around the package: paths above it do not exist.
    outside = re.compile(r"parents\[[1-9]\]|parent\.parent|\.\./")
    # Two lines may climb: to the package folder itself, and to where dpstudy is imported from (a
    # child process, the extension's compile, imports the same package).
    allowed = (
        "PACKAGE = Path(__file__).resolve().parents[1]",
        'IMPORT_ROOT = str(Path(importlib.util.find_spec("dpstudy").origin).parents[1])',
    )
    offenders = [
        f"{provenance.module_name(p)}: {line.strip()}"
        for p in modules().values()
        for line in p.read_text().splitlines()
        if outside.search(line) and not line.lstrip().startswith("#") and not line.startswith(allowed)
    ]
    assert offenders == []


def test_the_extension_is_looked_for_where_the_workflow_builds_it():
    from dpstudy.ext import loader
    from dpstudy.study import outputs

    assert loader.DEFAULT_DIR == outputs.EXT_DIR


MAX_LINES = 300  # a module of one job; past this it holds two (issue 23)


def test_no_module_of_the_package_or_the_scripts_is_over_300_lines():
    files = [*PACKAGE.rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    long = {str(f.relative_to(REPO)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert len(files) > 100 and long == {}


def test_every_test_module_has_a_name_of_its_own():
    # pytest imports test modules by basename (no packages under tests/): a second test_x.py in
    # another folder fails to collect whenever both are collected, which `-k` or one folder hides.
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
