"""The host's PyTorch (TORCH=system): what a Python imports, probed in a child process, and
whether it can serve dpstudy: torch and torchvision in pyproject.toml's ranges, and torchvision
built for that very torch. Each problem is named, so setup refuses with every reason at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

from dpstudy_setup import SetupError
from dpstudy_setup.versions import declared_ranges, same_release, satisfies, torchvision_build_for

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
