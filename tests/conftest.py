"""Fixtures every stage's tests share. Layout: tests/unit/<stage>/ holds the fast tests of one
subpackage of dpstudy (a few marked slow start real processes), tests/e2e/ the runs of the whole
workflow, a real SLURM, the report in Chromium and the GPU paths; tests/helpers/ what they import."""

from __future__ import annotations

import fcntl
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import machine

from dpstudy.engine.cores import PIN_ENV
from dpstudy.ext.cache import ENV as EXT_CACHE_ENV
from dpstudy.record.closure_cache import ENV as CODE_CACHE_ENV


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    """A data root holding the generated `synthetic` dataset, prepared small (512 train, 128 test
    images): enough for a cell of one or two epochs. Tests only read it."""
    from dpstudy.data import store

    root = tmp_path_factory.mktemp("data")
    store.prepare("synthetic", root, {"train_size": 512, "test_size": 128})
    return root


@pytest.fixture(scope="session")
def python3_kernel() -> None:
    """The kernel papermill runs the report in; `make setup` installs it, a bare venv may lack it."""
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run(
            [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
            check=True,
            capture_output=True,
        )


@pytest.fixture(scope="session")
def ext_test_dir() -> Path:
    """The extension, built once for the session into results/ext-test: CPU-only unless a GPU
    can run the CUDA kernels. Every test that loads the library shares it (the operator tests,
    the kernel benchmark, a lenet_ext job through DPSTUDY_EXT_DIR); it persists, so a later
    session reuses it and ninja recompiles only the unit of changed sources."""
    import torch
    from helpers import REPO

    import dpstudy.ext

    folder = REPO / "results" / "ext-test"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / "ext-test.lock", "w") as lock:  # pytest-xdist's workers build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        dpstudy.ext.build(folder, cpu_only=not torch.cuda.is_available())
    return folder


pytest_plugins = ("helpers.schedule",)


def pytest_configure(config):
    """Set once for the run, in the process that starts pytest-xdist's workers (they inherit it):
    tests/e2e/test_gpu.py's seed, drawn each run, so that every worker collects the same tests;
    and a cache of built extensions of this run's own (dpstudy.ext.cache), so that the run
    compiles each distinct build once, never none; and one of import closures
    (dpstudy.record.closure_cache), so that the package copies tests make and edit leave nothing in
    the user's cache.

    And OpenMP's threads wait for work asleep instead of spinning (OMP_WAIT_POLICY=PASSIVE, inherited
    by every process a test starts): two workers on this 2-core machine each run torch on both cores,
    and a thread spinning at a barrier while the other worker holds its core burns that core for
    nothing. Measured: tests/unit/engine/test_train.py's LeNet-to-90 % cell beside a 2-thread torch
    loop took 33 s and 33 CPU-s spinning, 12 s and 12.5 CPU-s asleep (8 s alone). No test asserts
    a speed; a study run by hand spins as OpenMP does by default.

    And no process pins itself to cores (DPSTUDY_PIN_CORES=0, dpstudy.engine.cores): a cell pins
    its ranks to the first cores it may use, right where it has them to itself (a local study gives
    a CPU cell every core; a cluster binds each job to its own), but here the workers run cells of
    several tests at once, and every one-core cell of the default study, the language-model study
    and the private SLURM took the first core while the second idled (58 core-s of idle in one run,
    18 of them in its second and third minutes, when those three run one-core cells). The tests of
    the pinning itself turn it back on (helpers.engine.PINNED)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault(PIN_ENV, "0")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        config.machine_at_start = machine.reference()  # before any worker starts: an idle machine
        config.cpu_ticks_at_start = machine.cpu_ticks()
        os.environ.setdefault("DPSTUDY_GPU_SEED", str(secrets.randbelow(2**31)))
        config.ext_cache = tempfile.mkdtemp(prefix="dpstudy-ext-cache-")
        os.environ[EXT_CACHE_ENV] = config.ext_cache
        config.code_cache = tempfile.mkdtemp(prefix="dpstudy-code-cache-")
        os.environ[CODE_CACHE_ENV] = config.code_cache


def pytest_unconfigure(config):
    for cache in (getattr(config, "ext_cache", None), getattr(config, "code_cache", None)):
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_worker():
    """Under pytest-xdist two workers share the cores: torch's intra-op threads in a worker would
    wait at every parallel region for a thread the other worker's work has descheduled (a 2-thread
    op on a taken core ran 40x slower). One thread each; cells started as processes set their own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    yield


# --- where the time goes: CPU beside wall per test phase ----------------------------------------

# A test waiting (for a timeout, a scheduler, a killed rank) holds its worker but no core; one that
# starts processes uses more than its wall. --durations shows the wall; the summary below adds the
# CPU of the worker and every process it waited for, so that a slow test is seen as busy or idle.
CPU_AT_START = pytest.StashKey[float]()
CPU_SUMMARY_LINES = 15
CPU_SPENT: list[tuple[float, float, str, str]] = []  # (wall s, CPU s, phase, test) as reports arrive
# every phase, however short, summed per test module and per pytest-xdist worker: {name: [wall, CPU]}
BY_MODULE: dict[str, list[float]] = {}
BY_WORKER: dict[str, list[float]] = {}
MODULE_SUMMARY_LINES = 20


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[CPU_AT_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item.stash[CPU_AT_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    item.stash[CPU_AT_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if CPU_AT_START in item.stash:  # travels to pytest-xdist's controller with the report
        report.user_properties.append(("cpu_s", cpu_seconds() - item.stash[CPU_AT_START]))


def pytest_runtest_logreport(report):
    cpu = dict(report.user_properties).get("cpu_s")
    worker = getattr(getattr(report, "node", None), "gateway", None)
    for table, name in ((BY_MODULE, report.nodeid.split("::")[0]), (BY_WORKER, getattr(worker, "id", "main"))):
        total = table.setdefault(name, [0.0, 0.0])
        total[0] += report.duration
        total[1] += cpu or 0.0
    if cpu is not None and report.duration >= 5:
        CPU_SPENT.append((report.duration, cpu, report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "machine_at_start", None):  # once every worker has finished: idle again
        ticks = machine.cpu_ticks()  # before the reference below takes a core
        terminalreporter.section("the machine (tests/helpers/machine.py)")
        terminalreporter.write_line(f"at the start: {config.machine_at_start}; at the end: {machine.reference()}")
        if config.cpu_ticks_at_start and ticks:
            terminalreporter.write_line(f"over the run, {machine.usage(config.cpu_ticks_at_start, ticks)}")
    if BY_MODULE:
        terminalreporter.section("time per test module (every phase; a module's fixtures included)")
        ranked = sorted(BY_MODULE.items(), key=lambda item: -item[1][0])
        for module, (wall, cpu) in ranked[:MODULE_SUMMARY_LINES]:
            terminalreporter.write_line(f"{wall:7.1f}s wall {cpu:7.1f}s CPU  {module}")
        rest = ranked[MODULE_SUMMARY_LINES:]
        if rest:
            wall, cpu = sum(w for _, (w, _) in rest), sum(c for _, (_, c) in rest)
            terminalreporter.write_line(f"{wall:7.1f}s wall {cpu:7.1f}s CPU  the other {len(rest)} modules")
        busy = ", ".join(f"{name} {wall:.0f} s ({cpu:.0f} CPU-s)" for name, (wall, cpu) in sorted(BY_WORKER.items()))
        terminalreporter.write_line(f"busy per worker: {busy}")
    if not CPU_SPENT:
        return
    terminalreporter.section("CPU beside wall (phases of 5 s or more, longest first)")
    for wall, cpu, when, nodeid in sorted(CPU_SPENT, reverse=True)[:CPU_SUMMARY_LINES]:
        terminalreporter.write_line(f"{wall:7.1f}s wall {cpu:7.1f}s CPU ({cpu / wall:4.2f} cores) {when:8s} {nodeid}")
    wall, cpu = sum(w for w, *_ in CPU_SPENT), sum(c for _, c, *_ in CPU_SPENT)
    terminalreporter.write_line(f"all of them: {wall:.0f} s wall, {cpu:.0f} s CPU ({cpu / wall:.2f} cores)")
