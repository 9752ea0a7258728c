"""Versions, ranges and pins: pyproject.toml's supported ranges of torch and torchvision, the lock
files' pins, and whether a host's version meets a range.

Versions and specifiers are `packaging`'s, as pip vendors it: this runs with the system's python3,
before anything is installed. A python3 without pip (Debian's without python3-pip) may still have
packaging itself; failing both, the pip wheel that `python -m venv` installs from (ensurepip's)
is imported from.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from pathlib import Path

from dpstudy_setup import PYPROJECT


def _pip_wheel() -> str | None:
    """The pip wheel ensurepip installs into a new venv: bundled with CPython, or the distribution's
    copy (Debian's /usr/share/python-wheels, with python3-venv)."""
    try:
        import ensurepip
    except ImportError:  # Debian's python3 without python3-venv: no venv can be made either
        return None
    import sysconfig

    folders = [os.path.join(os.path.dirname(ensurepip.__file__), "_bundled"), sysconfig.get_config_var("WHEEL_PKG_DIR")]
    wheels = [wheel for folder in filter(None, folders) for wheel in sorted(glob.glob(f"{folder}/pip-*.whl"))]
    return wheels[-1] if wheels else None


try:
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version
except ImportError:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.utils import canonicalize_name
        from packaging.version import Version
    except ImportError:
        wheel = _pip_wheel()
        if wheel is None:
            raise
        sys.path.append(wheel)  # a wheel is a zip archive: its pure-Python modules import from it as it is
        from pip._vendor.packaging.specifiers import SpecifierSet
        from pip._vendor.packaging.utils import canonicalize_name
        from pip._vendor.packaging.version import Version


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: '2.7.0a0+79aa17489c.nv25.04' -> (2, 7, 0).

    Pre-release and local labels are dropped on purpose: vendor builds (NVIDIA's containers) are
    labelled as pre-releases of the version whose API they carry."""
    return Version(version).release


def satisfies(version: str, specifier: str) -> bool:
    """Whether `version`'s release (release(): without its pre-release and local labels) meets
    every clause of `specifier` (e.g. '>=2.6,<3'): 2.6.0a0+nv25.01 is in >=2.6."""
    return Version(".".join(map(str, release(version)))) in SpecifierSet(specifier)


def same_release(expected: str, version: str) -> bool:
    """Whether `version` is the release `expected` names, to the precision it names ('2.14' or '2.14.1')."""
    wanted = release(expected)
    return release(version)[: len(wanted)] == wanted


def torchvision_build_for(torchvision: str) -> str | None:
    """The torch release a torchvision release is built for: 0.21 <-> 2.6, ..., 0.29 <-> 2.14."""
    major, minor = (release(torchvision) + (0,))[:2]
    return f"2.{minor - 15}" if major == 0 and minor >= 15 else None


def declared_ranges(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{'torch': '>=2.6,<3', 'torchvision': ...}: the supported range of each, from pyproject.toml,
    as written there (the messages quote it)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip carries the same parser
        from pip._vendor import tomli as tomllib
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    ranges = {}
    for dependency in dependencies:
        match = re.fullmatch(r"\s*(torchvision|torch)\s*([<>=!][^;]*?)\s*(;.*)?", dependency)
        if match:
            ranges[match.group(1)] = match.group(2)
    return ranges


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins
