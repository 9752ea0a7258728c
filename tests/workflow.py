"""Helpers for the workflow tests: a private copy of the checkout and real snakemake runs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def copy_checkout(dest: Path) -> Path:
    """The workflow's files (tracked or not ignored), without results or .snakemake."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, config: dict | None = None, check: bool = True,
              timeout: int = 1200) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "snakemake"), *args]
    if config is not None:
        path = workdir / "config" / "test_study.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd += ["--configfile", str(path.relative_to(workdir))]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def planned(proc: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """{rule: [cell wildcard or '']} of the jobs a dry run would execute."""
    jobs: dict[str, list[str]] = {}
    rule = None
    for line in (proc.stdout + proc.stderr).splitlines():
        match = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if match:
            rule = match.group(1)
            jobs.setdefault(rule, []).append("")
            continue
        match = re.match(r"^wildcards: .*cell=([^,\s]+)", line.strip())
        if match and rule:
            jobs[rule][-1] = match.group(1)
    return jobs


def dry_run(workdir: Path, config: dict | None = None, *extra: str) -> dict[str, list[str]]:
    return planned(snakemake(workdir, "-n", *extra, config=config))
