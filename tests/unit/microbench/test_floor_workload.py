"""The machine's floor workload (dpstudy.microbench.floor): its timing, its rates and its file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from helpers.engine import PINNED

from dpstudy.engine import reference
from dpstudy.microbench import floor


def test_rates_are_work_over_timed_seconds_the_workloads_taking_turns_after_the_warm_up():
    calls = []

    def sleeper(name, seconds):
        def step():
            calls.append((name, time.perf_counter()))
            time.sleep(seconds)

        return step

    cpu = torch.device("cpu")
    rates = reference.timed_rates({"a": (sleeper("a", 0.01), 2.0), "b": (sleeper("b", 0.02), 3.0)}, 0.4, cpu)
    assert rates["a"] == pytest.approx(2.0 / 0.0101, rel=0.2) and rates["b"] == pytest.approx(3.0 / 0.0201, rel=0.2)
    # the warm-up ran first and is not in the rates: about WARMUP_S + 0.4 s of steps in all
    assert calls[-1][1] - calls[0][1] == pytest.approx(reference.WARMUP_S + 0.4, abs=0.1)
    # turns of SLICE_S: over the timed 0.4 s each workload ran in several turns, not once
    turns = sum(1 for first, second in zip(calls, calls[1:]) if first[0] != second[0])
    assert turns >= 2 * 0.4 / (2 * reference.SLICE_S) - 2


def test_a_cpu_run_measures_all_three_parts_pinned_like_a_one_device_cell():
    run = floor.measure(repeat=2, seconds=0.4, device="cpu")
    allowed = len(os.sched_getaffinity(0))
    assert run["repeat"] == 2 and run["device"] == "cpu" and run["device_name"] is None
    assert run["threads"] == allowed and run["seconds"] == 0.4
    assert run["cores"] in ([], sorted(os.sched_getaffinity(0)))
    # a 256x256 matmul is 33.6 MFLOP; any CPU of this decade does 0.1-10,000 GFLOP/s and copies 0.1-1,000 GB/s
    assert 0.1 < run["compute_gflops"] < 10_000 and 0.1 < run["memory_gbps"] < 1_000
    # an in-place add of one element costs 0.3-30 us on the host: 0.03-3 million per second
    assert 0.03 < run["dispatch_mops"] < 3
    assert run["other_load"] >= 0


def test_dispatch_counts_every_operator_it_runs(monkeypatch):
    # The rate is operators per second: DISPATCH_BATCH adds per step, each one applied.
    added = []
    monkeypatch.setattr(torch.Tensor, "add_", lambda self, v: added.append(v) or self)
    step, work = reference.dispatch(torch.device("cpu"))
    step()
    step()
    assert work == reference.DISPATCH_BATCH / 1e6 and len(added) == 2 * reference.DISPATCH_BATCH


def test_the_command_writes_its_run_and_refuses_bad_arguments(tmp_path):
    out = tmp_path / "floor" / "r1.json"
    cmd = [sys.executable, "-m", "dpstudy.microbench.floor", "--repeat", "1", "--seconds", "0.2"]
    # --cores: the one-device cell's, one core here as on a CPU study; the floor takes just that
    pinned = {**os.environ, **PINNED}  # as a study's floor pins itself (tests/conftest.py turns it off)
    proc = subprocess.run(
        [*cmd, "--cores", "1", "--device", "cpu", "--out", str(out)], capture_output=True, text=True, env=pinned
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads(out.read_text())
    assert run["repeat"] == 1 and run["device"] == "cpu" and run["threads"] == 1
    assert run["cores"] == [min(os.sched_getaffinity(0))]
    assert f"floor r1 on {run['device']}" in proc.stdout and "GFLOP/s" in proc.stdout and "M ops/s" in proc.stdout
    assert [p.name for p in out.parent.iterdir()] == ["r1.json"]  # no temporary file left
    bad = subprocess.run([*cmd[:-1], "0", "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--seconds 0.0: must be above 0" in bad.stderr
    bad = subprocess.run([*cmd, "--cores", "0", "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--cores 0: must be 1 or more" in bad.stderr
    assert not (tmp_path / "x.json").exists()
