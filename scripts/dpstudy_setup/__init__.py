"""The modules behind scripts/setup_venv.py (`make setup`, `make wheelhouse`), one job each:

- versions: versions, ranges and pins (pyproject.toml's ranges, the lock files);
- hosttorch: the host's PyTorch under TORCH=system, probed and checked against those ranges;
- venv: the venv made, remembered (.venv/dpstudy-setup.json) and installed into;
- wheelhouse: a folder of wheels for an offline install.

They run with the system's python3 before the venv exists: only the standard library, and the
`packaging` that pip vendors (dpstudy_setup.versions), may be imported. What they share is here.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements" / "lock.txt"
TORCH_LOCK = REPO / "requirements" / "torch.txt"


class SetupError(RuntimeError):
    """Setup cannot go on; the message says why and what to do."""


def say(message: str) -> None:
    print(f"dpstudy setup: {message}", flush=True)
