"""The wheelhouse: every locked dependency as a wheel in one folder, downloaded on a connected
machine, for this Python or another, so that `make setup WHEELS=DIR` installs with no network.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dpstudy_setup import LOCK, TORCH_LOCK, SetupError, say


def target_options(python_version: str | None) -> list[str]:
    """pip download options for another Python than this one (binary wheels only)."""
    if not python_version or python_version == "{}.{}".format(*sys.version_info[:2]):
        return []
    machine = platform.machine()
    tags = [f"manylinux_2_{n}_{machine}" for n in (28, 27, 26, 24, 17)] + [
        f"manylinux2014_{machine}",
        f"manylinux1_{machine}",
        f"linux_{machine}",
    ]
    return [
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        *[option for tag in tags for option in ("--platform", tag)],
    ]


def download(dest: Path, options: list[str]) -> None:
    """pip download into `dest`, reusing what it holds; --no-deps: the locks are closures (resolving
    would fetch the newest torch for timm)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest)]
        + ["--find-links", str(dest), *options],
        check=True,
    )


def build_sources(folder: Path, dest: Path, python_version: str | None) -> None:
    """Wheels in `dest` of the packages `folder` holds as source only (they are pure Python); the
    sources themselves go."""
    sources = [p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".whl")]
    if not sources:
        return
    say(f"building wheels of {', '.join(p.name for p in sources)} (published as source only)")
    with tempfile.TemporaryDirectory() as built:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", built, *map(str, sources)],
            check=True,
        )
        for wheel in Path(built).iterdir():
            if target_options(python_version) and not wheel.name.endswith("-none-any.whl"):
                raise SetupError(
                    f"{wheel.name} is published as source only and is not pure Python: build it "
                    f"on a machine with Python {python_version}"
                )
            shutil.move(str(wheel), dest / wheel.name)
    for source in sources:
        source.unlink()


def wheelhouse(dest: Path, python_version: str | None, with_torch: bool) -> None:
    """Every locked dependency as a wheel in `dest`: the ones published only as source are built
    here (they are pure Python), the rest downloaded for the target Python, exactly the locked
    versions (without WITH_TORCH, not torch: timm asks for it, the host brings it)."""
    dest.mkdir(parents=True, exist_ok=True)
    locks = ["-r", str(LOCK), *(["-r", str(TORCH_LOCK)] if with_torch else [])]
    target = target_options(python_version)
    if target:
        # Which packages are source only shows in what pip picks for this Python; the target's own
        # wheels come after, binary only.
        with tempfile.TemporaryDirectory() as tmp:
            download(Path(tmp), ["-r", str(LOCK)])
            build_sources(Path(tmp), dest, python_version)
        download(dest, [*target, *locks])
    else:  # this Python: one download is the wheelhouse, once its sources are built
        download(dest, locks)
        build_sources(dest, dest, python_version)
    count = len(list(dest.glob("*.whl")))
    size = sum(p.stat().st_size for p in dest.glob("*.whl")) / 2**20
    target_name = f"Python {python_version}" if python_version else f"this Python ({platform.python_version()})"
    say(
        f"{dest}: {count} wheels, {size:.0f} MiB, for {target_name}"
        + ("" if with_torch else "; no torch: set up with TORCH=system, or add WITH_TORCH=1")
    )
