"""The code version of a record: which finished cells were made with older code, and which code
each aggregation rule depends on.

Nothing here is a hand-kept list. The code behind a rule (or behind a record) is the import
closure of its entry point: every dpstudy module it imports, directly or through another, found by
reading the sources (no import happens). Two things count as imports besides import statements:
a string naming a dpstudy module ("dpstudy.models.lenet:LeNet", how the model registry loads a
class) and a module's package data (.yaml, .json next to it, e.g. the schema with its defaults).
The extension's C++/CUDA sources count for the training code: the engine loads what they build.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from pathlib import Path

from dpstudy.record import closure_cache
from dpstudy.util.hashing import files_under, tree_sha256
from dpstudy.util.proc import output_of

PACKAGE = Path(__file__).resolve().parents[1]
# What a cell runs: the job wrapper (how processes start, pinning, GPU visibility) and each rank.
# Paths, not module names: naming them is not importing them (see imported_names).
TRAINING_ENTRY_POINTS = (PACKAGE / "jobs" / "launch.py", PACKAGE / "engine" / "__main__.py")
# Compiled by dpstudy.ext.builder into the library the engine loads.
NATIVE_SOURCES = PACKAGE / "ext" / "csrc"
PACKAGE_DATA = (".yaml", ".json")
MODULE_NAME = re.compile(r"dpstudy(\.\w+)+")


def module_file(name: str) -> Path | None:
    """The source file of dpstudy module `name` (a package's __init__.py), or None."""
    parts = name.split(".")
    if parts[0] != "dpstudy":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_of(path: Path) -> str:
    """Python source of a module, a script or a notebook (its code cells, without IPython magics)."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    lines = [line for cell in cells if cell["cell_type"] == "code" for line in "".join(cell["source"]).splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def imported_names(path: Path) -> set[str]:
    """Every dpstudy module name `path` may import: statements anywhere in it (lazy imports
    too) and strings that are exactly a module name (registries, `python -m` commands)."""
    return set(_names_in(path, source_of(path)))


@functools.cache
def _names_in(path: Path, source: str) -> frozenset[str]:
    """imported_names of `path` holding `source`: parsed once per content, as the workflow asks
    for the closure of every rule (the file is read each time: an edit is parsed anew)."""
    tree = ast.parse(source, str(path))
    inside = path.is_relative_to(PACKAGE)
    package = (
        "" if not inside else module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # submodules, if they are
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_NAME.fullmatch(node.value.split(":")[0])
            if match:
                names.add(match.group(0))
    return frozenset(n for n in names if n == "dpstudy" or n.startswith("dpstudy."))


def closure(roots: tuple[str | Path, ...]) -> list[Path]:
    """The files of `roots` (module names, or paths of scripts and notebooks) and of every dpstudy
    module they import, transitively, with the packages that contain them and their package data.
    Code that imports this module depends on the training code too: it hashes it.
    Kept on disk (closure_cache) under the state of every file it may read."""
    starts = [Path(r).resolve() if str(r).endswith((".py", ".ipynb")) else module_file(r) for r in roots]
    entry = closure_cache.entry(starts, PACKAGE)
    known = closure_cache.lookup(entry)
    if known is not None:
        return known
    found = _closure(starts, roots)
    closure_cache.store(entry, found)
    return found


def _closure(starts: list[Path | None], roots: tuple[str | Path, ...]) -> list[Path]:
    pending = list(starts)
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        names = imported_names(path)
        if path.is_relative_to(PACKAGE):  # the packages a module lives in are imported with it
            parts = module_name(path).split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts)))
        pending += [module_file(n) for n in names]
    data = {
        p for path in seen if path.is_relative_to(PACKAGE) for p in path.parent.iterdir() if p.suffix in PACKAGE_DATA
    }
    hashed = set(training_paths()) if Path(__file__).resolve() in seen and roots != TRAINING_ENTRY_POINTS else set()
    return sorted(seen | data | hashed)


def shown(path: Path) -> str:
    """A path as a rule input: relative to the working directory when below it."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


def code_files(*entry_points: str) -> list[str]:
    """The code behind a rule: its entry points (scripts, notebooks or module names) and their import closure."""
    return [shown(p) for p in closure(entry_points)]


def native_files() -> list[str]:
    """The extension's C++/CUDA sources."""
    return [shown(p) for p in files_under(NATIVE_SOURCES)]


@functools.cache
def training_paths() -> tuple[Path, ...]:
    return tuple(sorted({*closure(TRAINING_ENTRY_POINTS), *files_under(NATIVE_SOURCES)}))


def training_files() -> list[str]:
    """Everything that decides what a cell measures: editing any of these flags finished cells as
    made with older code (stale), and nothing else does."""
    return [shown(p) for p in training_paths()]


@functools.cache
def source_hash() -> str:
    """sha256 over the training code, by path inside the package and content (12 hex digits)."""
    return tree_sha256(training_paths(), PACKAGE)[:12]


@functools.cache
def git_commit() -> str | None:
    return output_of(["git", "-C", str(PACKAGE), "rev-parse", "--short=12", "HEAD"], timeout_s=10) or None


def code_version() -> dict[str, str | None]:
    return {"git_commit": git_commit(), "source_hash": source_hash()}


def export_checkout(basedir: str) -> None:
    """Make jobs started from here import dpstudy from `basedir` (the workflow's checkout),
    not from wherever the package happens to be installed."""
    paths = [basedir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
