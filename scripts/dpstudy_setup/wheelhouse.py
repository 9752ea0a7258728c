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


def wheelhouse(dest: Path, python_version: str | None, with_torch: bool) -> None:
    """Every locked dependency as a wheel in `dest`: the ones published only as source are built
    here (they are pure Python), the rest downloaded for the target Python, exactly the locked
    versions (without WITH_TORCH, not torch: timm asks for it, the host brings it)."""
    dest.mkdir(parents=True, exist_ok=True)
    locks = ["-r", str(LOCK), *(["-r", str(TORCH_LOCK)] if with_torch else [])]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, "-r", str(LOCK)],
            check=True,
        )
        sources = [p for p in Path(tmp).iterdir() if not p.name.endswith(".whl")]
        if sources:
            say(f"building wheels of {', '.join(p.name for p in sources)} (published as source only)")
            built = Path(tmp, "built")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--wheel-dir",
                    str(built),
                    *map(str, sources),
                ],
                check=True,
            )
            for wheel in built.iterdir():
                if target_options(python_version) and not wheel.name.endswith("-none-any.whl"):
                    raise SetupError(
                        f"{wheel.name} is published as source only and is not pure Python: build it "
                        f"on a machine with Python {python_version}"
                    )
                shutil.move(str(wheel), dest / wheel.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",  # the locks are closures; resolving would fetch the newest torch for timm
            "--dest",
            str(dest),
            "--find-links",
            str(dest),
            *target_options(python_version),
            *locks,
        ],
        check=True,
    )
    count = len(list(dest.glob("*.whl")))
    size = sum(p.stat().st_size for p in dest.glob("*.whl")) / 2**20
    target = f"Python {python_version}" if python_version else f"this Python ({platform.python_version()})"
    say(
        f"{dest}: {count} wheels, {size:.0f} MiB, for {target}"
        + ("" if with_torch else "; no torch: set up with TORCH=system, or add WITH_TORCH=1")
    )
