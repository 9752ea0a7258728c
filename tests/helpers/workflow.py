"""Helpers for the workflow tests: a private copy of the checkout and real snakemake runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from helpers import REPO

BIN = Path(sys.executable).parent


def copy_checkout(dest: Path) -> Path:
    """The workflow's files (tracked or not ignored), without results or .snakemake."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def command(workdir: Path, args: tuple[str, ...], config: dict | None, env: dict | None) -> tuple[list, dict]:
    """The snakemake command line and environment (the venv first on PATH, then `env`)."""
    cmd = [str(BIN / "snakemake"), *args]
    if config is not None:
        path = workdir / "config" / "test_study.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd += ["--configfile", str(path.relative_to(workdir))]
    env = {**os.environ, **(env or {})}
    return cmd, {**env, "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}


def snakemake(
    workdir: Path,
    *args: str,
    config: dict | None = None,
    check: bool = True,
    timeout: int = 1200,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    cmd, env = command(workdir, args, config, env)
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def start_snakemake(
    workdir: Path, *args: str, config: dict | None = None, env: dict | None = None, log: Path | None = None
) -> subprocess.Popen:
    """snakemake in the background, in a process group (session) of its own."""
    cmd, env = command(workdir, args, config, env)
    out = open(log or workdir / "snakemake.out", "w")
    return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def planned(proc: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """{rule: [cell (or repeat) wildcard, or '']} of the jobs a dry run would execute."""
    jobs: dict[str, list[str]] = {}
    rule = None
    for line in (proc.stdout + proc.stderr).splitlines():
        match = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if match:
            rule = match.group(1)
            jobs.setdefault(rule, []).append("")
            continue
        match = re.match(r"^wildcards: .*(?:cell|repeat)=([^,\s]+)", line.strip())
        if match and rule:
            jobs[rule][-1] = match.group(1)
    return jobs


def dry_run(workdir: Path, config: dict | None = None, *extra: str, env: dict | None = None) -> dict[str, list[str]]:
    return planned(snakemake(workdir, "-n", *extra, config=config, env=env))


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until `path` holds `text`, while `proc` (a background snakemake) runs."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert proc.poll() is None, f"snakemake ended before {path} showed {text!r}"
        assert time.monotonic() < deadline, f"{path} did not show {text!r} in {timeout} s"
        time.sleep(0.3)


def processes_with(fragment: str) -> list[int]:
    """Pids of the live processes whose command line contains `fragment`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().split()[2]
            except OSError:
                continue
            if fragment in cmdline and state != "Z" and int(proc.name) != os.getpid():
                pids.append(int(proc.name))
    return pids


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after `timeout` seconds (empty when all ended)."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [
            p for p in alive if Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
        ]
    return alive
