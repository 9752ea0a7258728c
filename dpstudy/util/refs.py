"""References to a user's code, `<module>:<callable>` (a model factory, a dataset function): parsed,
turned into a short token for cell ids and paths, located and imported from a study's folder.

Parsing and locating import nothing of the user's; `load` runs the module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import re
import sys
from collections.abc import Callable
from pathlib import Path

from dpstudy.util.errors import ConfigError

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
REFERENCE = re.compile(rf"^(?P<module>{IDENTIFIER}(?:\.{IDENTIFIER})*):(?P<name>{IDENTIFIER})$(?!\n)")
TOKEN_HASH = 6  # hex digits that tell two factories of the same name apart


def split(reference: str) -> tuple[str, str] | None:
    """(module, callable) of `module:callable`, or None when `reference` is not one."""
    match = REFERENCE.match(reference)
    return (match["module"], match["name"]) if match else None


def safe_token(text: str) -> str:
    """`text` as a cell id or folder name takes it: lowercase, anything but a-z, 0-9 and _ as _."""
    return re.sub(r"[^a-z0-9_]", "_", text.lower())


def token(reference: str) -> str:
    """A short stable token of `module:callable`: the callable's name and a hash of the whole
    reference (`make_net_3fa2c1`), so two modules' `make_net` never share an id."""
    module, name = split(reference) or ("", reference)
    digest = hashlib.sha1(reference.encode()).hexdigest()[:TOKEN_HASH]
    return f"{safe_token(name)}_{digest}"


def source_file(reference: str, folder: str | Path | None = None) -> Path | None:
    """The file of the module of `module:callable` as an import from `folder` (then the Python
    path) would find it, or None; a package's module is its __init__.py. Found by path, not by
    import: nothing of the user's runs, and a module of that name imported earlier from another
    folder does not stand in."""
    module, _ = split(reference) or (None, None)
    if module is None:
        return None
    search = ([str(Path(folder).resolve())] if folder is not None else []) + sys.path
    parts = module.split(".")
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                return None
            search = list(spec.submodule_search_locations)
    if not spec.origin or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin)


def load(reference: str, folder: str | Path | None = None) -> Callable:
    """The callable of `module:callable`, its module imported with `folder` first on the path.
    The folder stays on sys.path: DataLoader workers and pickled objects import the module again."""
    module, name = split(reference) or (None, None)
    if module is None:
        raise ConfigError(f"{reference!r} is not a reference of the form module:callable")
    if folder is not None and str(Path(folder).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(folder).resolve()))
    try:
        loaded = importlib.import_module(module)
    except Exception as error:
        where = f" (looked in {folder} and on the Python path)" if folder is not None else ""
        raise ConfigError(f"cannot import module {module!r}{where}: {type(error).__name__}: {error}") from error
    target = getattr(loaded, name, None)
    if not callable(target):
        raise ConfigError(f"module {module!r} ({loaded.__file__}) has no callable {name!r}")
    return target
