"""What the tests share besides fixtures (those are in tests/conftest.py): generated records and
archives, a private SLURM, a copy of the checkout for workflow runs, and the offline browser."""

import getpass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def left_in_tmpdir(folder: Path) -> list[str]:
    """What a process run with TMPDIR=folder left there, but Inductor's per-user cache: importing
    torchvision makes it, and Inductor keeps it across processes on purpose."""
    cache = f"torchinductor_{getpass.getuser()}"
    return sorted(path.name for path in folder.iterdir() if path.name != cache)
