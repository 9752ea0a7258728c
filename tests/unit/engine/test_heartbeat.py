"""The ranks' heartbeats and what the launcher and a failing rank read from them."""

from __future__ import annotations

import os
import subprocess
import time

from dpstudy.engine import heartbeat
from dpstudy.engine.heartbeat import BACKWARD, EVALUATING, FORWARD, LOADING, Heartbeat
from dpstudy.jobs import exits

# torchrun's report when rank 1 was killed (torch 2.x, abridged to the block the launcher reads)
TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
dpstudy.engine FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-26_05:44:19
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 26433)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 26433
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_05:44:19
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 26434)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26434
============================================================
"""


def beats(tmp_path, positions, ages=None):
    """Heartbeats of ranks at (epoch, step, phase), written `ages` seconds ago."""
    for rank, (epoch, step, phase) in enumerate(positions):
        beat = Heartbeat(tmp_path, rank)
        beat.epoch(epoch, 32)
        beat.beat(phase, step)
        if ages:
            heartbeat.LAYOUT.pack_into(
                beat.map, 0, time.time() - ages[rank], *heartbeat.LAYOUT.unpack_from(beat.map)[1:]
            )
    return heartbeat.read(tmp_path)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_beat_reads_back_with_its_rank_position_and_process(tmp_path):
    (b0, b1) = beats(tmp_path, [(2, 5, BACKWARD), (2, 5, FORWARD)])
    assert (b0.rank, b0.position, b0.pid) == (0, (2, 5, BACKWARD), os.getpid())
    assert b1.where() == "at epoch 2, step 5 of 32, in forward" and b1.alive() is True
    assert abs(b1.time - time.time()) < 5
    assert heartbeat.read(tmp_path / "nothing") == []


def test_the_laggard_is_the_rank_furthest_behind_with_the_others_beside_it(tmp_path):
    found = beats(tmp_path, [(2, 6, LOADING), (2, 5, FORWARD), (2, 6, FORWARD)], ages=[40, 58, 40])
    assert heartbeat.laggard(found) == (
        "rank 1 at epoch 2, step 5 of 32, in forward, silent for 58 s "
        "(rank 0 at epoch 2, step 6 of 32, loading its batch; rank 2 at epoch 2, step 6 of 32, in forward)"
    )
    same = beats(tmp_path / "same", [(1, 3, EVALUATING), (1, 3, EVALUATING)], ages=[20, 20])
    assert heartbeat.laggard(same) == "every rank evaluating after epoch 1, silent for 20 s"
    (one,) = beats(tmp_path / "one", [(1, 4, LOADING)], ages=[12])
    assert heartbeat.laggard([one]) == "the process at epoch 1, step 4 of 32, loading its batch, silent for 12 s"
    assert heartbeat.laggard([]) is None


def test_a_failing_rank_blames_a_dead_peer_or_one_behind_and_silent_not_a_racing_one(tmp_path):
    racing = beats(tmp_path / "racing", [(1, 5, BACKWARD), (1, 5, LOADING)], ages=[0, 1])
    assert (
        racing and heartbeat.culprit(heartbeat.read(tmp_path / "racing"), 0) is None
    )  # one step phase apart, just now
    beats(tmp_path / "hung", [(1, 5, BACKWARD), (1, 5, FORWARD)], ages=[30, 30])
    assert heartbeat.culprit(heartbeat.read(tmp_path / "hung"), 0) == (
        "rank 1 stopped answering at epoch 1, step 5 of 32, in forward (silent for 30 s)"
    )
    assert heartbeat.culprit(heartbeat.read(tmp_path / "hung"), 1) is None  # rank 1 itself: rank 0 is ahead of it
    beats(tmp_path / "dead", [(1, 5, BACKWARD), (1, 5, BACKWARD)])
    rank1 = heartbeat.folder(tmp_path / "dead") / "rank1"
    fields = list(heartbeat.LAYOUT.unpack(rank1.read_bytes()))
    fields[1] = pid = dead_pid()
    rank1.write_bytes(heartbeat.LAYOUT.pack(*fields))
    assert heartbeat.culprit(heartbeat.read(tmp_path / "dead"), 0) == (
        f"rank 1 died (process {pid} ended without a record) "
        "at epoch 1, step 5 of 32, in backward or the optimizer step"
    )
    assert heartbeat.culprit(heartbeat.read(tmp_path / "dead"), 0, check_alive=False) is None


def test_the_launcher_names_the_rank_torchrun_saw_fail_and_how(tmp_path):
    log = tmp_path / "train.log"
    beats(tmp_path, [(1, 5, BACKWARD), (1, 5, FORWARD)])
    log.write_text("epoch 1/3 ...\n" + TORCHRUN_REPORT.replace("{code}", "-9"))
    assert exits.first_failure(log.read_text()) == (1, -9)
    assert exits.reason(1, log, tmp_path) == (
        "rank 1 killed by SIGKILL (the kernel's out-of-memory killer?) at epoch 1, step 5 of 32, in forward, "
        "without a record; torchrun stopped the other ranks; see train.log"
    )
    log.write_text(TORCHRUN_REPORT.replace("{code}", "3"))
    assert exits.reason(1, log, tmp_path).startswith("rank 1 exited with code 3 at epoch 1, step 5 of 32")
    # rank 0 ended waiting in a collective for rank 1, silent for a minute: rank 1 is named first
    beats(tmp_path / "hung", [(1, 5, BACKWARD), (1, 5, FORWARD)], ages=[60, 60])
    report = TORCHRUN_REPORT.replace("{code}", "1")
    report = report.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    log.write_text(report)
    assert exits.reason(1, log, tmp_path / "hung").startswith(
        "rank 1 stopped answering at epoch 1, step 5 of 32, in forward (silent for 60 s); then rank 0 "
    )
    # no torchrun report (a single process, or torchrun itself killed): the exit code, as before
    log.write_text("epoch 1/3 ...\n")
    assert exits.reason(-9, log, tmp_path / "none") == (
        "the training processes ended (killed by SIGKILL) without writing a record "
        "(the kernel's out-of-memory killer?); see train.log"
    )
