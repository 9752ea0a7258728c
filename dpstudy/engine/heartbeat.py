"""Each rank's progress, where the launcher and the other ranks can read it.

A rank writes `<cell>/heartbeat/rank<R>`: one fixed-size struct in a memory-mapped file, rewritten
in place at every phase of every step (no system call, well under a microsecond, so it can sit
inside the timed window). When a cell goes wrong, the beats say who stopped where:
- the launcher, at the time limit or when torchrun ends without a record, names the rank
  furthest behind, its position and how long it has been silent (dpstudy.jobs.timelimit);
- a rank whose collective failed checks its peers first (dpstudy.engine.outcome): a peer whose
  process is gone died; a peer behind it and silent stopped answering. The record blames that
  rank, not the one that only saw the consequence.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

FOLDER = "heartbeat"
# time, pid, epoch, step, steps in the epoch, phase, host
LAYOUT = struct.Struct("<dqqqqq64s")
# In the order a step goes through them; a position compares as (epoch, step, phase).
PHASES = ("starting", "loading its batch", "in forward", "in backward or the optimizer step", "evaluating")
STARTING, LOADING, FORWARD, BACKWARD, EVALUATING = range(len(PHASES))
SILENT_S = 5.0  # a peer behind this rank and silent this long stopped answering


def folder(out_dir: str | Path) -> Path:
    return Path(out_dir) / FOLDER


class Heartbeat:
    """This rank's beat: `epoch()` once an epoch, `beat()` at each phase of a step (the step
    number kept when None)."""

    def __init__(self, out_dir: str | Path, rank: int):
        path = folder(out_dir) / f"rank{rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w+b") as f:
            f.truncate(LAYOUT.size)
            self.map = mmap.mmap(f.fileno(), LAYOUT.size)
        self.pid, self.host = os.getpid(), socket.gethostname().encode()[:64]
        self.epoch_number, self.steps, self.step = 0, 0, 0
        self.beat(STARTING)

    def epoch(self, epoch: int, steps: int) -> None:
        self.epoch_number, self.steps, self.step = epoch, steps, 0

    def beat(self, phase: int, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        LAYOUT.pack_into(self.map, 0, time.time(), self.pid, self.epoch_number, self.step, self.steps, phase, self.host)


class NoHeartbeat:
    """For a Trainer run outside a cell (benchmarks): beats go nowhere."""

    def epoch(self, epoch: int, steps: int) -> None:
        pass

    def beat(self, phase: int, step: int | None = None) -> None:
        pass


@dataclass(frozen=True)
class Beat:
    rank: int
    time: float
    pid: int
    epoch: int
    step: int
    steps: int
    phase: int
    host: str

    @property
    def position(self) -> tuple[int, int, int]:
        return self.epoch, self.step, self.phase

    def where(self) -> str:
        if self.epoch == 0:
            return "before its first epoch"
        if self.phase == EVALUATING:
            return f"evaluating after epoch {self.epoch}"
        return f"at epoch {self.epoch}, step {self.step} of {self.steps}, {PHASES[self.phase]}"

    def alive(self) -> bool | None:
        """Whether its process still runs; None where that cannot be known (another node)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not is_zombie(self.pid)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def read(out_dir: str | Path) -> list[Beat]:
    """Every rank's last beat, by rank (files not yet written or torn are left out)."""
    beats = []
    for path in sorted(folder(out_dir).glob("rank*")):
        try:
            fields = LAYOUT.unpack(path.read_bytes()[: LAYOUT.size])
            rank = int(path.name[4:])
        except (OSError, struct.error, ValueError):
            continue
        if fields[1] > 0:
            beats.append(Beat(rank, fields[0], *fields[1:6], fields[6].rstrip(b"\0").decode(errors="replace")))
    return sorted(beats, key=lambda b: b.rank)


def silent(beat: Beat, now: float) -> str:
    return f"silent for {round(now - beat.time)} s"


def laggard(beats: list[Beat], now: float | None = None) -> str | None:
    """The rank furthest behind and where, beside where the others are: for a hang's reason
    (one process: where it is). None without beats."""
    now = time.time() if now is None else now
    if len(beats) < 2:
        return f"the process {beats[0].where()}, {silent(beats[0], now)}" if beats else None
    behind = min(beats, key=lambda b: (b.position, b.time))
    others = [b for b in beats if b.rank != behind.rank]
    if all(b.position == behind.position for b in others):
        return f"every rank {behind.where()}, {silent(behind, now)}"
    ahead = "; ".join(f"rank {b.rank} {b.where()}" for b in others)
    return f"rank {behind.rank} {behind.where()}, {silent(behind, now)} ({ahead})"


def behind(beats: list[Beat], rank: int) -> Beat | None:
    """The peer furthest behind `rank`'s last position, if any is behind it."""
    own = next((b for b in beats if b.rank == rank), None)
    peers = [b for b in beats if own is not None and b.rank != rank and b.position < own.position]
    return min(peers, key=lambda b: (b.position, b.time)) if peers else None


def culprit(beats: list[Beat], rank: int, now: float | None = None, check_alive: bool = True) -> str | None:
    """Seen from `rank`, whose collective just failed: the peer that caused it, and how, from the
    ranks' `beats` (read()). A peer whose process is gone died (`check_alive`: while the cell
    runs); one behind this rank and silent for SILENT_S stopped answering (a peer a step behind
    for less is only racing it)."""
    now = time.time() if now is None else now
    for beat in beats if check_alive else ():
        if beat.rank != rank and beat.alive() is False:
            return f"rank {beat.rank} died (process {beat.pid} ended without a record) {beat.where()}"
    peer = behind(beats, rank)
    if peer is not None and now - peer.time >= SILENT_S:
        return f"rank {peer.rank} stopped answering {peer.where()} ({silent(peer, now)})"
    return None
