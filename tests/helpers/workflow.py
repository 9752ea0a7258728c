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


# How long a background run may show no progress at all (no line in its log, no file written
# under its results) before a wait calls it hung. Only a hang reaches it: a wait never guesses how
# long this machine takes to do the work, it follows what the work reports.
STALL_S = 300.0


def progress(workdir: Path, log: Path | None = None):
    """A function whose value changes whenever a run in `workdir` makes progress: its log grows, or a
    file under results/ appears, grows or is rewritten (records, train logs, heartbeats' folders)."""

    def now() -> tuple:
        seen = [log.stat().st_size] if log is not None and log.exists() else []
        for path in (workdir / "results").rglob("*"):
            try:
                stat = path.stat()
            except OSError:  # written and renamed meanwhile
                continue
            seen.append((str(path), stat.st_size, stat.st_mtime_ns))
        return tuple(seen)

    return now


def wait_for(condition, proc: subprocess.Popen | None, what: str, progressed, stall_s: float = STALL_S) -> None:
    """Until condition(), while `proc` (a background snakemake; None: no process to watch) runs; fails
    when it ended first, or when `progressed()` (see progress) stayed the same for `stall_s`: a hang,
    not a slow machine."""
    last, quiet_since = progressed(), time.monotonic()
    while not condition():
        assert proc is None or proc.poll() is None, f"snakemake ended before {what}"
        now = progressed()
        if now != last:
            last, quiet_since = now, time.monotonic()
        assert time.monotonic() - quiet_since < stall_s, f"no {what}, and no progress at all for {stall_s:.0f} s"
        time.sleep(0.3)


def wait_to_end(proc: subprocess.Popen, progressed, stall_s: float = STALL_S) -> int:
    """`proc`'s exit status once it ends; fails when it made no progress for `stall_s` (see wait_for)."""
    wait_for(lambda: proc.poll() is not None, None, "end of snakemake", progressed, stall_s)
    return proc.returncode


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, progressed) -> None:
    """Until `path` holds `text`, while `proc` (a background snakemake) runs and `progressed()`
    changes (see wait_for)."""
    wait_for(
        lambda: path.exists() and text in path.read_text(errors="replace"), proc, f"{text!r} in {path}", progressed
    )


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
