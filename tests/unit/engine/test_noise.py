"""What keeps a throughput from being noise: the run order of repeats, pinned ranks, the steady
window, and the measure of other processes' load."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from dpstudy.engine.cores import PIN_ENV, core_block, pin_to_cores, visible_gpu
from dpstudy.engine.monitor import HostLoad
from dpstudy.engine.outcome import steady_throughput
from dpstudy.study import sweeps as study


def test_repeats_run_interleaved_across_settings():
    config = yaml.safe_load("""
study: t
device: cpu
defaults: {repeats: 3}
sweeps:
  - {name: s, dataset: synthetic, model: lenet, grid: {mode: [single], batch: [64, 256, 512]}}
""")
    cells = study.expand(study.load(config))
    priorities = study.run_priorities(cells)
    order = sorted(priorities, key=priorities.get, reverse=True)  # Snakemake runs higher first
    repeats = [c[-2:] for c in order]
    assert repeats == ["r0"] * 3 + ["r1"] * 3 + ["r2"] * 3
    assert [c.split("-")[4] for c in order[:3]] == ["b64", "b256", "b512"]  # sweep order in a round
    assert len(set(priorities.values())) == 9


def test_the_floor_runs_once_per_round_as_the_round_ends():
    config = yaml.safe_load("""
study: t
device: cpu
defaults: {repeats: 3}
sweeps:
  - {name: s, dataset: synthetic, model: lenet, grid: {mode: [single, ddp], batch: [64, 256], backend: [gloo]}}
""")
    cells = study.expand(study.load(config))
    priorities = study.run_priorities(cells)
    rounds = study.floor_rounds(cells, priorities)
    assert list(rounds) == [0, 1, 2]
    for repeat, priority in rounds.items():
        own = [priorities[c.id] for c in cells if c.spec["repeat"] == repeat]
        later = [priorities[c.id] for c in cells if c.spec["repeat"] > repeat]
        # the lowest of its round (the workflow runs it after them: their records are its inputs)
        # and above every later round's, so it runs before them
        assert priority == min(own) and all(priority > p for p in later)
    one = study.expand(study.load({**config, "defaults": {"repeats": 1}}))
    assert study.floor_rounds(one, study.run_priorities(one)) == {}  # one run: no CV to measure


def test_steady_throughput_counts_the_steps_after_warmup():
    epochs = [
        {"samples": 1000, "wall_s": 2.0, "steady_samples": 800, "steady_s": 1.0},
        {"samples": 1000, "wall_s": 1.2, "steady_samples": 1000, "steady_s": 1.2},
    ]
    assert steady_throughput(epochs) == pytest.approx(1800 / 2.2)
    # records without the window (or a run shorter than the warm-up): epochs after the first
    old = [{"samples": 1000, "wall_s": 2.0}, {"samples": 1000, "wall_s": 1.25}]
    assert steady_throughput(old) == pytest.approx(800.0)
    warm = [dict(e, steady_samples=0, steady_s=0.0) for e in old]
    assert steady_throughput(warm) == pytest.approx(800.0)


def pinned_cores(local_rank: int, threads: int, queue) -> None:
    cores = pin_to_cores(local_rank, threads)
    queue.put((cores, sorted(os.sched_getaffinity(0))))


@pytest.mark.parametrize("local_rank, threads", [(0, 1), (1, 1), (0, 2), (1, 2)])
def test_ranks_are_pinned_to_their_own_cores(local_rank, threads, monkeypatch):
    monkeypatch.setenv(PIN_ENV, "1")  # the suite's processes pin nothing (tests/conftest.py)
    allowed = sorted(os.sched_getaffinity(0))
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=pinned_cores, args=(local_rank, threads, queue))
    child.start()
    cores, affinity = queue.get(timeout=30)
    child.join()
    expected = allowed[local_rank * threads : (local_rank + 1) * threads]
    if len(expected) < threads:  # more ranks than cores: nothing pinned
        assert cores == [] and affinity == allowed
    else:
        assert cores == affinity == expected


def test_gpu_ranks_take_blocks_in_their_gpus_share_of_the_host():
    cores = list(range(16))
    # one GPU: its share is the whole host; a 1-core rank takes the first core
    assert core_block(cores, 0, 1, gpu=0, host_gpus=1) == [0]
    # 4 GPUs, 4 cores each: cells on GPUs 1 and 3 never share a core, whatever their local rank
    assert core_block(cores, 0, 2, gpu=1, host_gpus=4) == [4, 5]
    assert core_block(cores, 0, 2, gpu=3, host_gpus=4) == [12, 13]
    # a share too small for the block, an unknown GPU, or a GPU the count does not cover: the
    # rank's own block among the cores it may use (a scheduler's cgroup gives it only its own)
    assert core_block(cores, 1, 5, gpu=1, host_gpus=4) == [5, 6, 7, 8, 9]
    assert core_block([4, 5], 1, 1, gpu=None, host_gpus=8) == [5]
    assert core_block([4, 5], 0, 1, gpu=6, host_gpus=8) == [4]
    assert core_block([4, 5], 2, 1) == []  # more ranks than cores: nothing pinned


@pytest.mark.parametrize(
    "visible, local_rank, gpu",
    [("2,3", 0, 2), ("2,3", 1, 3), ("5", 1, 5), ("", 0, None), ("GPU-6f1c2b", 0, None), (None, 0, None)],
)
def test_a_rank_finds_its_gpus_number_on_the_host(monkeypatch, visible, local_rank, gpu):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu(local_rank) == gpu


def test_host_load_tells_our_cpu_from_other_processes():
    # Busy until the kernel has given this process 0.3 CPU-s, however loaded the machine is (another
    # test worker may hold the other core and part of this one): psutil's /proc reading of our share
    # agrees with Python's own clock, and the machine's busy time includes ours.
    host = HostLoad()
    start, cpu_start = host.mark(), time.process_time()
    deadline = time.monotonic() + 20
    while time.process_time() - cpu_start < 0.3 and time.monotonic() < deadline:
        pass
    end, cpu_end = host.mark(), time.process_time()
    machine, own = HostLoad.cores(start, end)
    given = (cpu_end - cpu_start) / (end[0] - start[0])
    assert cpu_end - cpu_start >= 0.3 and own == pytest.approx(given, abs=0.1) and machine >= own * 0.9
    # A busy process that is not ours (orphaned: its parent shell exits at once) counts as other:
    # the machine's busy time over a window is at least ours plus what the kernel gave it then.
    busy = "import time; t = time.time() + 4\nwhile time.time() < t: pass"
    spin = f"{sys.executable} -c '{busy}' >/dev/null 2>&1 & echo $!"
    spinner = psutil.Process(int(subprocess.run(["sh", "-c", spin], check=True, capture_output=True).stdout))
    time.sleep(0.5)  # let it start
    start, spun = host.mark(), sum(spinner.cpu_times()[:2])
    time.sleep(1.5)
    spun = sum(spinner.cpu_times()[:2]) - spun
    end = host.mark()
    machine, own = HostLoad.cores(start, end)
    other = spun / (end[0] - start[0])
    assert own < 0.2 and other > 0.05 and machine - own >= other - 0.05
