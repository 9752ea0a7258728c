"""Lines through measured points, kept physical: how a step's time (StepTime: straight on CPU,
bent where a GPU overlaps the host) and its memory grow with the batch (dpstudy.analysis.calibration,
dpstudy.analysis.memory_forecast)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def line_fit(xs: Iterable[float], ys: Iterable[float]) -> tuple[float, float]:
    """(a, c) of y = a + c x by least squares; one x: (0, y / x). Neither below 0: a noisy pair that
    would put the fixed part below zero gives the line through the origin instead."""
    x, y = np.asarray(list(xs), float), np.asarray(list(ys), float)
    if len(x) == 1 or np.ptp(x) == 0:
        return 0.0, float(np.mean(y / x))
    c, a = np.polyfit(x, y, 1)
    if a < 0 or c < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(c)


@dataclass(frozen=True)
class StepTime:
    """A training step's seconds against its batch b.

    serial      a + c b: the host does the fixed work and the batch's work one after the other
                (a CPU cell: one set of cores does both);
    overlapped  sqrt(a^2 + (c b)^2): the host launches the step's kernels while the device runs
                the ones before, so the slower of the two sets the pace, with a smooth turn where
                they are even (a CUDA cell). It is a line in the squares, fitted as one.

    On an H100 (gpu-check's forecast item, resnet18 and simplecnn at batches 128-1024) the line
    through the smallest and largest batch missed the two between by 5 % at the median and 13 % at
    worst, every miss but one too slow: a small model's step stays at the host's launch time until
    the device's work overtakes it, a bend that no straight line follows.
    """

    a: float
    c: float
    overlapped: bool = False

    @classmethod
    def fit(cls, batches: Iterable[float], seconds: Iterable[float], overlapped: bool = False) -> StepTime:
        b, t = np.asarray(list(batches), float), np.asarray(list(seconds), float)
        if overlapped:
            a2, c2 = line_fit(b * b, t * t)
            return cls(math.sqrt(a2), math.sqrt(c2), True)
        return cls(*line_fit(b, t), False)

    def __call__(self, batch: float) -> float:
        return math.hypot(self.a, self.c * batch) if self.overlapped else self.a + self.c * batch
