"""Memory per device of a DDP setting from the measured ones (dpstudy.analysis.forecast asks).

What a DDP rank holds at a step's peak, by PyTorch's tracker (the memory_split table's peak_mb on
the fullest device): the model, its gradients and the optimizer's state, fixed in the batch, and
one per-device batch's activations, growing with it. So peak(b) = fixed + per_sample b at the
per-device batch b: the line through the workload's single-device settings, plus what DDP holds
beyond one device (its reducer's buckets, about one more gradient): the median over the
calibrating DDP settings of their peak above the line at their b. Without single-device memory,
the line through the DDP settings alone. The figure is the tracker's: what an allocator reserves
beside it (a CUDA context, the caching allocator's rounding) is not in it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis.linefit import line_fit


def setting_memory(settings: pd.DataFrame, split: pd.DataFrame | None) -> pd.Series:
    """Per setting (settings' index): the median over its finished cells (`cells`, space-separated)
    of the fullest device's step peak in MB; NaN where no cell measured one."""
    if split is None or split.empty:
        return pd.Series(math.nan, index=settings.index)
    fullest = split.dropna(subset=["peak_mb"]).groupby("cell")["peak_mb"].max()
    return pd.Series([fullest.reindex(ids.split()).median() for ids in settings["cells"]], index=settings.index)


class MemoryLine:
    """peak(b) of one workload's DDP ranks, calibrated on (per-device batch, MB) pairs."""

    def __init__(self, single: list[tuple[float, float]], ddp: list[tuple[float, float]]):
        single = [(b, mb) for b, mb in single if np.isfinite(mb)]
        ddp = [(b, mb) for b, mb in ddp if np.isfinite(mb)]
        self.known = bool(single or ddp)
        if single:
            self.fixed, self.per_sample = line_fit(*zip(*single, strict=True))
            self.extra = float(np.median([mb - self.line(b) for b, mb in ddp])) if ddp else 0.0
            self.basis = f"memory from {len(single)} single-device and {len(ddp)} DDP setting(s)"
        elif ddp:
            self.fixed, self.per_sample = line_fit(*zip(*ddp, strict=True))
            self.extra = 0.0
            self.basis = f"memory from {len(ddp)} DDP setting(s)"
        else:
            self.fixed = self.per_sample = self.extra = math.nan
            self.basis = "no measured memory"

    def line(self, b: float) -> float:
        return self.fixed + self.per_sample * b

    def at(self, b: float) -> float:
        """MB on the fullest device of a DDP rank at per-device batch b (NaN: nothing measured)."""
        return self.line(b) + self.extra if self.known else math.nan
