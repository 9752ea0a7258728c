"""Set up dpstudy's virtual environment, with the lock's PyTorch or the host's, online or offline.

    python3 scripts/setup_venv.py setup [--venv .venv] [--torch lock|system] [--wheels DIR] [--extras test,browser,timm]
    python3 scripts/setup_venv.py wheelhouse --dest DIR [--python-version 3.12] [--with-torch]

`make setup`, `make wheelhouse` and `make run`/`make test` call it; the Makefile's variables TORCH,
WHEELS, EXTRAS and PYTHON become its options.

- `--torch lock` (the default for a new venv): torch and torchvision at the versions of
  requirements/torch.txt, everything else at requirements/lock.txt's.
- `--torch system`: the torch that `--python` imports (a cluster module, a container image, a vendor
  build). The venv is made with --system-site-packages; when that torch lives elsewhere (another
  venv, a conda env) a .pth file makes its folder visible. The torch must be in the range
  pyproject.toml declares and torchvision must be its own build, else setup refuses with the
  reason. The host's other packages stay where they satisfy dpstudy's requirements; the lock
  supplies the rest.
- `--wheels DIR`: install from DIR alone (`pip --no-index`, no configured index or find-links):
  no network is needed. `wheelhouse` fills such a folder on a connected machine, for this Python
  or another (`--python-version 3.12` downloads that version's wheels).

The venv remembers how it was made (.venv/dpstudy-setup.json): a later plain `make run` keeps a
TORCH=system venv and its extras, and asking for the other mode makes the venv anew. Up to date, it prints
nothing. Only the standard library is used: this runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements" / "lock.txt"
TORCH_LOCK = REPO / "requirements" / "torch.txt"
STATE_FILE = "dpstudy-setup.json"
HOST_PTH = "dpstudy-host-torch.pth"
MODES = ("lock", "system")
DEFAULT_EXTRAS = "test,browser,timm"
# pip settings that would let an offline install reach an index or another folder of wheels.
PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


class SetupError(RuntimeError):
    """Setup cannot go on; the message says why and what to do."""


def say(message: str) -> None:
    print(f"dpstudy setup: {message}", flush=True)


# ---- versions and ranges ------------------------------------------------------------------------


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: '2.7.0a0+79aa17489c.nv25.04' -> (2, 7, 0).

    Pre-release and local labels are dropped on purpose: vendor builds (NVIDIA's containers) are
    labelled as pre-releases of the version whose API they carry."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


OPERATORS = {
    ">=": lambda c: c >= 0,
    ">": lambda c: c > 0,
    "<=": lambda c: c <= 0,
    "<": lambda c: c < 0,
    "==": lambda c: c == 0,
    "!=": lambda c: c != 0,
}


def satisfies(version: str, specifier: str) -> bool:
    """Whether `version`'s release numbers meet every clause of `specifier` (e.g. '>=2.6,<3')."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.fullmatch(r"(>=|<=|==|!=|>|<)\s*([0-9.]+)", clause)
        if not match:
            raise ValueError(f"unsupported version clause {clause!r} in {specifier!r}")
        operator, bound = match.groups()
        if not OPERATORS[operator](_compare(release(version), release(bound))):
            return False
    return True


def declared_ranges(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{'torch': '>=2.6,<3', 'torchvision': ...}: the supported range of each, from pyproject.toml."""
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


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonical(name)] = version.strip()
    return pins


# ---- the host's PyTorch -------------------------------------------------------------------------

# Runs inside the venv's Python: what torch and torchvision it imports, and which distributions it
# sees. Importing torchvision's ops is the test that torchvision was built for this torch (a
# mismatched build fails with "operator torchvision::nms does not exist").
PROBE = r"""
import json, os, sys
from importlib import metadata
out = {"python": sys.executable, "prefix": sys.prefix}
try:
    import torch
    out.update(torch=torch.__version__, torch_path=os.path.dirname(os.path.dirname(torch.__file__)),
               cuda=torch.version.cuda, gpus=torch.cuda.device_count() if torch.version.cuda else 0)
except Exception as error:
    out["torch_error"] = f"{type(error).__name__}: {error}"
if "torch" in out:
    try:
        import torchvision
        out.update(torchvision=torchvision.__version__,
                   torchvision_path=os.path.dirname(os.path.dirname(torchvision.__file__)))
        torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    except Exception as error:
        out["torchvision_error"] = f"{type(error).__name__}: {error}"
    try:
        out["torchvision_requires"] = [r for r in metadata.requires("torchvision") or []
                                       if r.split(";")[0].replace(" ", "").startswith("torch=")]
    except metadata.PackageNotFoundError:
        out["torchvision_requires"] = []
out["distributions"] = {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}
print(json.dumps(out))
"""


def probe(python: Path | str) -> dict:
    proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SetupError(f"{python} could not be probed for torch:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torchvision_build_for(torchvision: str) -> str | None:
    """The torch release a torchvision release is built for: 0.21 <-> 2.6, ..., 0.29 <-> 2.14."""
    major, minor = (release(torchvision) + (0,))[:2]
    return f"2.{minor - 15}" if major == 0 and minor >= 15 else None


def same_release(expected: str, version: str) -> bool:
    """Whether `version` is the release `expected` names, to the precision it names ('2.14' or '2.14.1')."""
    wanted = release(expected)
    return release(version)[: len(wanted)] == wanted


def host_torch_problems(found: dict, ranges: dict[str, str]) -> list[str]:
    """Why the probed torch/torchvision cannot serve dpstudy; [] when they can."""
    if "torch" not in found:
        return [
            f"{found['python']} cannot import torch ({found.get('torch_error', 'not found')}); "
            "load your PyTorch (module load, conda activate, ...) or name its Python with PYTHON=..., "
            "or leave TORCH unset to install the lock's PyTorch"
        ]
    torch, where = found["torch"], found["torch_path"]
    problems = []
    if not satisfies(torch, ranges["torch"]):
        problems.append(
            f"torch {torch} (in {where}) is outside dpstudy's supported range torch{ranges['torch']} (pyproject.toml)"
        )
    vision = found.get("torchvision")
    if vision is None:
        problems.append(
            f"torchvision is not importable beside torch {torch} "
            f"({found.get('torchvision_error', 'not installed')}); install the torchvision built "
            "for this torch"
        )
        return problems
    if not satisfies(vision, ranges["torchvision"]):
        problems.append(f"torchvision {vision} is outside dpstudy's supported range torchvision{ranges['torchvision']}")
    pins = [re.sub(r"^torch\s*==\s*", "", r.split(";")[0]).strip() for r in found.get("torchvision_requires", [])]
    expected = pins[0] if pins else torchvision_build_for(vision)
    if expected and not same_release(expected, torch):
        problems.append(
            f"torchvision {vision} was built for torch {expected}, but the host's torch is {torch}: "
            "install the torchvision release that matches it"
        )
    if found.get("torchvision_error"):
        problems.append(f"torchvision {vision} does not work with torch {torch}: {found['torchvision_error']}")
    return problems


def check_host_torch(found: dict) -> None:
    problems = host_torch_problems(found, declared_ranges())
    if problems:
        raise SetupError("TORCH=system cannot use this PyTorch:\n  - " + "\n  - ".join(problems))


def describe_torch(found: dict) -> str:
    gpus = found.get("gpus", 0)
    cuda = f"CUDA {found['cuda']}, {gpus} GPU{'s' if gpus != 1 else ''} visible" if found.get("cuda") else "no CUDA"
    return f"torch {found['torch']} ({cuda}) and torchvision {found.get('torchvision')} from {found['torch_path']}"


# ---- the venv -----------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out)


def includes_system_site(venv: Path) -> bool | None:
    """pyvenv.cfg's include-system-site-packages, or None when `venv` is not a working venv."""
    cfg = venv / "pyvenv.cfg"
    if not cfg.exists() or not venv_python(venv).exists():
        return None
    match = re.search(r"include-system-site-packages\s*=\s*(\w+)", cfg.read_text())
    return bool(match) and match.group(1).lower() == "true"


def create_venv(venv: Path, python: str, mode: str) -> None:
    system = mode == "system"
    current = includes_system_site(venv)
    if current is not None and current == system:
        return
    if venv.exists():
        say(f"making {venv} anew: it was set up for {'the host' if current else 'the lock'}'s PyTorch")
        shutil.rmtree(venv)
    say(f"creating {venv} with {python}" + (" (it sees the host's packages)" if system else ""))
    subprocess.run([python, "-m", "venv", *(["--system-site-packages"] if system else []), str(venv)], check=True)


def expose_host_torch(venv: Path, host: dict) -> dict:
    """Make the venv see the host's torch (`host`: its probe) when --system-site-packages did not
    (torch in another venv or a conda env): a .pth file adds the folders that hold torch and
    torchvision. Returns the venv's probe."""
    pth = site_packages(venv) / HOST_PTH
    pth.unlink(missing_ok=True)
    inside = probe(venv_python(venv))
    folders = list(dict.fromkeys(host[key] for key in ("torch_path", "torchvision_path") if key in host))
    if "torch" in inside or not folders:
        return inside
    pth.write_text("".join(f"{folder}\n" for folder in folders))
    say(f"the venv sees {', '.join(folders)} (through {pth.name})")
    return probe(venv_python(venv))


def constraints(mode: str, host_packages: dict[str, str], tmp: Path) -> list[str]:
    """pip's -c options: the lock, less what the host provides under TORCH=system."""
    if mode == "lock":
        return ["-c", str(LOCK), "-c", str(TORCH_LOCK)]
    host = {canonical(name) for name in host_packages}
    kept = {name: version for name, version in read_pins(LOCK).items() if name not in host}
    path = tmp / "constraints.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(kept.items())))
    return ["-c", str(path)]


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


def inputs_digest(mode: str, extras: str) -> str:
    digest = hashlib.sha256(f"{mode}\0{extras}\0".encode())
    for path in (PYPROJECT, LOCK, TORCH_LOCK, Path(__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def read_state(venv: Path) -> dict:
    try:
        return json.loads((venv / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def setup(venv: Path, mode: str | None, wheels: Path | None, extras: str | None, python: str) -> dict:
    state = read_state(venv)
    mode = mode or state.get("torch") or "lock"
    extras = extras or state.get("extras") or DEFAULT_EXTRAS
    if mode not in MODES:
        raise SetupError(f"TORCH={mode!r}: use TORCH=system (the host's PyTorch) or leave it unset (the lock's)")
    if wheels is not None and not wheels.is_dir():
        raise SetupError(f"WHEELS={wheels}: no such folder (make wheelhouse WHEELS={wheels} writes one)")
    digest = inputs_digest(mode, extras)
    if state.get("inputs") == digest and includes_system_site(venv) == (mode == "system"):
        return state
    if mode == "system":
        # Checked before the venv is touched: a refusal leaves an existing venv as it was.
        host = probe(python)
        check_host_torch(host)
    create_venv(venv, python, mode)
    found = {}
    if mode == "system":
        found = expose_host_torch(venv, host)
        check_host_torch(found)
        say(f"using the host's {describe_torch(found)}")
    if not wheels:
        pip(venv, ["install", "--upgrade", "pip"], None)
    with tempfile.TemporaryDirectory() as tmp:
        host_packages = found.get("distributions", {})
        pip(venv, ["install", *constraints(mode, host_packages, Path(tmp)), "-e", f"{REPO}[{extras}]"], wheels)
    subprocess.run(
        [
            str(venv_python(venv)),
            "-m",
            "ipykernel",
            "install",
            "--sys-prefix",
            "--name",
            "python3",
            "--display-name",
            "dpstudy (python3)",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    installed = probe(venv_python(venv))
    state = {
        "torch": mode,
        "inputs": digest,
        "extras": extras,
        "wheels": str(wheels) if wheels else None,
        "torch_version": installed.get("torch"),
        "torch_path": installed.get("torch_path"),
        "torchvision_version": installed.get("torchvision"),
        "cuda": installed.get("cuda"),
    }
    (venv / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
    origin = "the host's" if mode == "system" else "the lock's"
    say(
        f"{venv} is ready: {origin} {describe_torch(installed)}"
        + (f"; installed offline from {wheels}" if wheels else "")
    )
    return state


# ---- the wheelhouse -----------------------------------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("setup", help="create or update the venv")
    make.add_argument("--venv", type=Path, default=REPO / ".venv")
    make.add_argument("--torch", choices=None, help="lock (default for a new venv) or system")
    make.add_argument("--wheels", type=Path, help="install from this folder of wheels alone (no network)")
    make.add_argument("--extras", help=f"dpstudy's extras to install (default: the venv's, else {DEFAULT_EXTRAS})")
    make.add_argument(
        "--python",
        default=sys.executable,
        help="the Python the venv is made from (and, under --torch system, whose torch it uses)",
    )
    house = commands.add_parser("wheelhouse", help="download every non-torch dependency as wheels")
    house.add_argument("--dest", type=Path, required=True)
    house.add_argument("--python-version", help="the target Python, e.g. 3.12 (default: this one)")
    house.add_argument("--with-torch", action="store_true", help="also torch, torchvision and their CUDA libraries")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            setup(
                args.venv.absolute(),
                args.torch or None,
                args.wheels.absolute() if args.wheels else None,
                args.extras,
                args.python,
            )
        else:
            wheelhouse(args.dest.absolute(), args.python_version, args.with_torch)
    except SetupError as error:
        print(f"dpstudy setup: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        print(f"dpstudy setup: {' '.join(map(str, error.cmd))} failed (exit {error.returncode})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
