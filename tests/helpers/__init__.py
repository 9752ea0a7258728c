"""What the tests share besides fixtures (those are in tests/conftest.py): generated records and
archives, a private SLURM, a copy of the checkout for workflow runs, and the offline browser."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
