"""Set up dpstudy's virtual environment, with the lock's PyTorch or the host's, online or offline.

    python3 scripts/setup_venv.py setup [--venv .venv] [--torch lock|system] [--wheels DIR]
                                        [--extras test,browser,timm,text,transformers] [--installer auto|pip]
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
- `--installer pip`: pip installs everything; by default (auto) uv installs online from the lock
  (seconds from its cache instead of a minute and more), pip offline and on a host's torch
  (dpstudy_setup.installer says why).
- `--wheels DIR`: install from DIR alone (`pip --no-index`, no configured index or find-links):
  no network is needed. `wheelhouse` fills such a folder on a connected machine, for this Python
  or another (`--python-version 3.12` downloads that version's wheels).

The venv remembers how it was made (.venv/dpstudy-setup.json): a later plain `make run` keeps a
TORCH=system venv and its extras, and asking for the other mode makes the venv anew. Up to date, it prints
nothing.

This file is the command line; the work is done by the package beside it, scripts/dpstudy_setup
(versions, hosttorch, venv, wheelhouse). Only the standard library and pip's vendored `packaging`
are used: this runs with the system's python3, before anything is installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from dpstudy_setup import REPO, SetupError
from dpstudy_setup.installer import INSTALLERS
from dpstudy_setup.venv import DEFAULT_EXTRAS, setup
from dpstudy_setup.wheelhouse import wheelhouse


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
    make.add_argument(
        "--installer",
        choices=INSTALLERS,
        default="auto",
        help="auto (default): uv online from the lock, pip offline and for the host's torch; pip: pip always",
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
                args.installer,
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
