"""The launcher's time limit on a real cell: a DDP cell over Gloo whose rank hangs is stopped at its
limit, every process with it. A unit of its own: it mostly waits for the limit, so `make test` runs
it on the worker for waiting tests (tests/helpers/schedule.py WAITING)."""

import re
import subprocess

import pytest
from helpers.engine import launch

from dpstudy.record import fields as record


@pytest.mark.slow
def test_a_hung_rank_is_stopped_at_the_time_limit_with_all_its_processes(synthetic_root, tmp_path):
    # Rank 1 stops answering after epoch 1 and rank 0 waits in its all-reduce: under Snakemake's
    # local executor nothing but the launcher's limit ends it (Gloo's own timeout is 30 min).
    spec = {
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "ddp",
        "gpus": 2,
        "backend": "gloo",
        "batch": 64,
        "epochs": 3,
        "data_root": str(synthetic_root),
    }
    out = tmp_path / "cell"
    proc = launch(spec, out, env={"DPSTUDY_INJECT_FAULT": "hang:1:2:1"}, extra=("--limit-s", "30"), timeout=120)
    assert proc.returncode == 0, proc.log
    rec = record.read(out / "record.json")
    assert rec["status"] == "failed" and re.fullmatch(
        r"stopped at its time limit of 30 s \(resources.runtime_min\) after (3\d|4[0-4]) s; "
        r"last progress: epoch 1/3 train_loss .* samples/s; "
        # the heartbeats: rank 1 hung before its forward pass, rank 0 waits in its all-reduce
        r"rank 1 at epoch 2, step 1 of (?P<steps>\d+), in forward, silent for (1\d|2\d|3\d) s "
        r"\(rank 0 at epoch 2, step 1 of (?P=steps), in backward or the optimizer step\); see train.log",
        rec["reason"],
    ), rec["reason"]
    assert 30 <= proc.seconds < 30 + 15  # SIGTERM to torchrun, its ranks with it
    leftover = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert leftover == [], "processes of the stopped cell still run"
