"""Installing into the venv: uv where it can, pip where it cannot.

Online from the lock (the default set-up), uv installs: it downloads in parallel, keeps unpacked
wheels in its cache (~/.cache/uv; UV_CACHE_DIR moves it) and links them into a new venv, made
without pip (uv installs pip); then byte_compile compiles the venv on every core. From uv's cache
a new venv takes a fraction of pip's time, most of it byte-compiling (docs/setup.md quotes it);
the same packages at the same versions either way (`pip freeze` identical).

pip stays where uv would change what is tested: offline from a folder of wheels (WHEELS=, which
`make wheelhouse` fills for pip) and on a host's PyTorch (TORCH=system: uv does not see packages a
.pth file adds). `make setup INSTALLER=pip` (--installer pip) makes pip do it all, and when uv
fails (an index only pip's configuration names, say) pip tries again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dpstudy_setup import REPO, SetupError, say

# The uv that installs: pinned, like everything else the set-up depends on.
UV = "uv==0.13.9"
INSTALLERS = ("auto", "pip")
# pip settings that would let an offline install reach an index or another folder of wheels.
PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def pip_environment(wheels: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if wheels:
        # The folder alone: no index and no find-links from pip's configuration files or environment.
        env = {k: v for k, v in env.items() if k not in PIP_SOURCES}
        env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip(venv: Path, args: list[str], wheels: Path | None) -> None:
    sources = ["--no-index", "--find-links", str(wheels)] if wheels else []
    cmd = [str(venv_python(venv)), "-m", "pip", *args[:1], "--quiet", *sources, *args[1:]]
    proc = subprocess.run(cmd, env=pip_environment(wheels), cwd=REPO)
    if proc.returncode != 0:
        hint = f" (offline, from {wheels}: is every wheel there? `make wheelhouse` writes them)" if wheels else ""
        raise SetupError(f"pip install failed{hint}; its messages are above")


def uv_environment() -> dict[str, str]:
    """uv reads no pip configuration file: an index the environment gives pip is given to uv too."""
    env = dict(os.environ)
    for pip_name, uv_name in (("PIP_INDEX_URL", "UV_DEFAULT_INDEX"), ("PIP_EXTRA_INDEX_URL", "UV_INDEX")):
        if env.get(pip_name) and uv_name not in env:
            env[uv_name] = env[pip_name]
    return env


# Whether the venv has a pip of its own (not one --system-site-packages shows it). A venv for uv is
# made without: uv installs pip there in 0.2 s where ensurepip takes 4 s; only when uv fails does
# pip need ensurepip's.
HAS_OWN_PIP = """
import importlib.util, sys, sysconfig
spec = importlib.util.find_spec("pip")
sys.exit(0 if spec and spec.origin.startswith(sysconfig.get_path("purelib")) else 1)
"""


def ensure_pip(venv: Path) -> None:
    """ensurepip's pip in the venv, as `python -m venv` would have put it, unless it has its own."""
    python = str(venv_python(venv))
    if subprocess.run([python, "-c", HAS_OWN_PIP], cwd=REPO).returncode != 0:
        subprocess.run(
            [python, "-m", "ensurepip", "--upgrade", "--default-pip"], check=True, stdout=subprocess.DEVNULL, cwd=REPO
        )


def install_uv(venv: Path, python: str) -> bool:
    """uv into the venv, by the pip of `python` (the Python the venv is made from: pip 22.3 and later
    install into another environment with --python), else by the venv's own pip; False when both
    failed (the second's messages are above)."""
    target = ["--python", str(venv_python(venv)), "install", "--quiet", UV]
    if subprocess.run([python, "-m", "pip", *target], capture_output=True, cwd=REPO).returncode == 0:
        return True
    ensure_pip(venv)
    return subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--quiet", UV], cwd=REPO).returncode == 0


def with_uv(venv: Path, args: list[str], python: str) -> bool:
    """`uv pip install ARGS` into the venv, uv itself and then pip installed there first; False when
    any failed (uv's or pip's messages are above)."""
    if not (venv / "bin" / "uv").exists() and not install_uv(venv, python):
        return False
    for step in (["install", "--upgrade", "pip"], args):
        cmd = [str(venv / "bin" / "uv"), "pip", step[0], "--quiet", "--python", str(venv_python(venv)), *step[1:]]
        if subprocess.run(cmd, env=uv_environment(), cwd=REPO).returncode != 0:
            return False
    return True


# Byte-compiles the venv's packages but not their own test suites (a quarter of the 13,400 files:
# pandas', sympy's, scipy's tests/ folders), which nothing imports, on every core in chunks of files:
# faster than `uv --compile-bytecode` on all of them and than compileall's compile_dir (a file per
# task) on the same three quarters. Compiling at all is needed: with PYTHONDONTWRITEBYTECODE set,
# every process would compile torch from source, seconds an import.
# Files that are not this Python's syntax (torch's py312 test helpers) are skipped, as uv does.
# So are transformers' model folders (2,600 files, a fifth of the source's bytes, 3.7 CPU-s here): a
# study imports the one architecture it builds, which Python compiles on that first import.
BYTE_COMPILE = """
import compileall, functools, os, re, sysconfig
from concurrent.futures import ProcessPoolExecutor
site = sysconfig.get_path("purelib")
skipped = re.compile(re.escape(site) + r"/((.+/)?tests?|transformers/models)/")
files = [os.path.join(d, f) for d, _, names in os.walk(site) for f in names if f.endswith(".py")]
with ProcessPoolExecutor() as pool:
    compile_file = functools.partial(compileall.compile_file, quiet=2)
    list(pool.map(compile_file, [f for f in files if not skipped.search(f)], chunksize=64))
"""


def byte_compile(venv: Path) -> None:
    subprocess.run([str(venv_python(venv)), "-c", BYTE_COMPILE], check=True, cwd=REPO)


def uses_uv(wheels: Path | None, mode: str, installer: str) -> bool:
    """Whether uv installs (online from the lock) rather than pip."""
    return wheels is None and mode == "lock" and installer == "auto"


def install(
    venv: Path, args: list[str], wheels: Path | None, mode: str, installer: str = "auto", python: str = sys.executable
) -> None:
    """`pip install ARGS` into the venv: by uv online from the lock unless `installer` is pip, else
    (or when uv failed) by pip; then byte-compiles it, the same way whichever installed."""
    uv_first = uses_uv(wheels, mode, installer)
    if not (uv_first and with_uv(venv, args, python)):
        if uv_first:
            say("uv could not install them (its messages are above); installing with pip instead")
        ensure_pip(venv)
        if not wheels:
            pip(venv, ["install", "--no-compile", "--upgrade", "pip"], None)
        pip(venv, [args[0], "--no-compile", *args[1:]], wheels)
    byte_compile(venv)
