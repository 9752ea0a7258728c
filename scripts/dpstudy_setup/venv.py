"""The venv: made (with the host's packages visible under TORCH=system), installed into from the
lock or a folder of wheels, and remembered.

The venv remembers how it was made (.venv/dpstudy-setup.json): a later plain `make run` keeps a
TORCH=system venv and its extras, and asking for the other mode makes the venv anew. Up to date
(the same inputs: pyproject.toml, the locks, this code, the mode and extras), setup prints nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from dpstudy_setup import LOCK, PYPROJECT, REPO, TORCH_LOCK, SetupError, say
from dpstudy_setup.hosttorch import check_host_torch, describe_torch, probe
from dpstudy_setup.installer import INSTALLERS, install, uses_uv, venv_python
from dpstudy_setup.versions import canonicalize_name, read_pins

STATE_FILE = "dpstudy-setup.json"
HOST_PTH = "dpstudy-host-torch.pth"
MODES = ("lock", "system")
DEFAULT_EXTRAS = "test,browser,timm,text,transformers,deepspeed"
# The code that sets a venv up: a change of it sets the venv up again.
SETUP_CODE = (REPO / "scripts" / "setup_venv.py", *sorted(Path(__file__).parent.glob("*.py")))


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


def create_venv(venv: Path, python: str, mode: str, pip: bool) -> None:
    system = mode == "system"
    current = includes_system_site(venv)
    if current is not None and current == system:
        return
    if venv.exists():
        say(f"making {venv} anew: it was set up for {'the host' if current else 'the lock'}'s PyTorch")
        shutil.rmtree(venv)
    say(f"creating {venv} with {python}" + (" (it sees the host's packages)" if system else ""))
    # Without pip where uv installs: it puts pip there (dpstudy_setup.installer.with_uv).
    options = [*([] if pip else ["--without-pip"]), *(["--system-site-packages"] if system else [])]
    subprocess.run([python, "-m", "venv", *options, str(venv)], check=True)


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
    host = {canonicalize_name(name) for name in host_packages}
    kept = {name: version for name, version in read_pins(LOCK).items() if name not in host}
    path = tmp / "constraints.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(kept.items())))
    return ["-c", str(path)]


def inputs_digest(mode: str, extras: str) -> str:
    digest = hashlib.sha256(f"{mode}\0{extras}\0".encode())
    for path in (PYPROJECT, LOCK, TORCH_LOCK, *SETUP_CODE):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def read_state(venv: Path) -> dict:
    try:
        return json.loads((venv / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def setup(
    venv: Path, mode: str | None, wheels: Path | None, extras: str | None, python: str, installer: str = "auto"
) -> dict:
    """Make `venv` up to date for `mode` (lock or system; None: as it was made) and `extras`, from
    `wheels` alone when given, with `python`; returns its state (what STATE_FILE holds)."""
    state = read_state(venv)
    mode = mode or state.get("torch") or "lock"
    extras = extras or state.get("extras") or DEFAULT_EXTRAS
    if mode not in MODES:
        raise SetupError(f"TORCH={mode!r}: use TORCH=system (the host's PyTorch) or leave it unset (the lock's)")
    if installer not in INSTALLERS:
        raise SetupError(f"INSTALLER={installer!r}: use INSTALLER=pip, or leave it unset (uv where it can)")
    if wheels is not None and not wheels.is_dir():
        raise SetupError(f"WHEELS={wheels}: no such folder (make wheelhouse WHEELS={wheels} writes one)")
    digest = inputs_digest(mode, extras)
    if state.get("inputs") == digest and includes_system_site(venv) == (mode == "system"):
        return state
    if mode == "system":
        # Checked before the venv is touched: a refusal leaves an existing venv as it was.
        host = probe(python)
        check_host_torch(host)
    create_venv(venv, python, mode, pip=not uses_uv(wheels, mode, installer))
    found = {}
    if mode == "system":
        found = expose_host_torch(venv, host)
        check_host_torch(found)
        say(f"using the host's {describe_torch(found)}")
    with tempfile.TemporaryDirectory() as tmp:
        host_packages = found.get("distributions", {})
        requirements = [*constraints(mode, host_packages, Path(tmp)), "-e", f"{REPO}[{extras}]"]
        install(venv, ["install", *requirements], wheels, mode, installer, python)
        # TMPDIR here: ipykernel stages the spec in a mkdtemp folder it empties but never removes
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
            env={**os.environ, "TMPDIR": tmp},
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
