"""A straight line through measured points, kept physical: how a step's time and its memory grow
with the batch (dpstudy.analysis.forecast, dpstudy.analysis.memory_forecast)."""

from __future__ import annotations

from collections.abc import Iterable

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
