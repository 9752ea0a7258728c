"""The end-to-end tests' costly fixtures, made once per session: `make run`'s default study, shared
by every test that needs a real one (tests/e2e/test_default_study.py asserts what it made,
tests/e2e/test_reruns.py what a change of it reruns), and the private SLURM of the cluster tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.slurm_cluster import SlurmCluster, unavailable
from helpers.workflow import copy_checkout, dry_run, snakemake


@dataclass
class Study:
    """A workflow folder without dpstudy/ and the site folder its jobs import dpstudy from."""

    workdir: Path
    site: Path
    seconds: float = 0.0

    @property
    def env(self) -> dict:
        return {"PYTHONPATH": str(self.site)}

    def code(self, module: str) -> Path:
        """Where the workflow's jobs read `module` (a path like dpstudy/engine/train.py)."""
        return self.site / module

    def run(self, *args: str, config: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
        return snakemake(self.workdir, *args, config=config, env=self.env, **kwargs)

    def dry_run(self, config: dict | None = None, *extra: str) -> dict[str, list[str]]:
        return dry_run(self.workdir, config, *extra, env=self.env)

    def copy(self, dest: Path) -> Study:
        """A copy of the folder and its results whose jobs import the same installed package. The
        package stays where it is: its files are the rules' code inputs, and a new path for each
        would rerun every rule that has them (the extension's build, the microbenchmarks)."""
        shutil.copytree(self.workdir, dest / "workflow", symlinks=True)
        return Study(dest / "workflow", self.site)


def installed_workflow(root: Path) -> Study:
    """A workflow folder without dpstudy/, and a site folder with dpstudy installed from a copy of
    this checkout with `pip install .` (not editable): every job imports it from site-packages."""
    source = copy_checkout(root / "source")
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(site), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    workdir = root / "workflow"
    shutil.copytree(source, workdir, ignore=lambda folder, names: ["dpstudy"] if Path(folder) == source else [])
    where = subprocess.run(
        [sys.executable, "-c", "import dpstudy; print(dpstudy.__file__)"],
        cwd=workdir,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        check=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(site)
    return Study(workdir, site)


@pytest.fixture(scope="session")
def default_study(tmp_path_factory) -> Study:
    """`make run` on this machine, once: the default study (config/config.yaml), run by the
    workflow against dpstudy installed with `pip install .`. Tests read it, dry-run changes of it
    and restore what they edit; a test that runs jobs works on a copy (Study.copy)."""
    study = installed_workflow(tmp_path_factory.mktemp("default_study"))
    started = time.monotonic()
    study.run("--cores", "2", "--resources", "gpu=2", timeout=900)
    study.seconds = time.monotonic() - started
    print(f"the default study: {study.seconds:.0f} s")
    return study


@pytest.fixture(scope="session")
def cluster():
    """The private two-node SLURM of the cluster tests (tests/helpers/slurm_cluster.py), once per
    session: tests/e2e/test_cluster.py and test_packs.py run on one pytest-xdist worker
    (tests/helpers/schedule.py SHARED), one after the other."""
    why = unavailable()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
