"""Memory per device of a DDP or FSDP setting from the measured ones (dpstudy.analysis.calibration asks).

What a rank holds at a step's peak, by PyTorch's tracker (the memory_split table's peak_mb on the
fullest device): the model, its gradients and the optimizer's state, fixed in the batch, and one
per-device batch's activations, growing with it. So one device's peak(b) = fixed + per_sample b: the
line through the forecast group's single-device settings. A DDP rank holds all of `fixed` and what
DDP keeps beyond one device (its reducer's buckets, about one more gradient); an FSDP rank holds
`fixed` / n, its shard, and what FSDP keeps beyond it (the units it has gathered). Each scheme's
(dpstudy.study.modes.scheme_name) extra is the median over its calibrating settings of their
peak above that base; a scheme none of whose settings measured memory adds nothing, and says so in
the basis. Without single-device memory, the line through the DDP settings alone. The line is the
tracker's; on CUDA the allocator holds more at the same step (library workspaces, a `device`
loader's data, DDP's buckets: max_memory_allocated beyond the tracked peak, `outside_tracker`),
which does not shard or grow with the batch: dpstudy.analysis.calibration adds the forecast group's
median of it to every forecast, so that a CUDA forecast is of what the allocator holds. The CUDA
context is outside both.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis.linefit import line_fit
from dpstudy.study import modes


def setting_memory(settings: pd.DataFrame, split: pd.DataFrame | None) -> pd.Series:
    """Per setting (settings' index): the median over its finished cells (`cells`, space-separated)
    of the fullest device's step peak in MB; NaN where no cell measured one."""
    if split is None or split.empty:
        return pd.Series(math.nan, index=settings.index)
    fullest = split.dropna(subset=["peak_mb"]).groupby("cell")["peak_mb"].max()
    return _per_setting(settings, fullest)


def outside_tracker(settings: pd.DataFrame, split: pd.DataFrame | None) -> pd.Series:
    """Per setting: MB the CUDA allocator held at the measured step beyond the tracker's peak
    (allocated_mb - peak_mb, the largest over a cell's devices), the median over its cells; NaN
    where no cell has an allocator peak (CPU cells, records made before it was recorded)."""
    if split is None or split.empty or "allocated_mb" not in split:
        return pd.Series(math.nan, index=settings.index)
    both = split.dropna(subset=["peak_mb", "allocated_mb"])
    gap = (both["allocated_mb"] - both["peak_mb"]).groupby(both["cell"]).max()
    return _per_setting(settings, gap)


def setting_state(settings: pd.DataFrame, split: pd.DataFrame | None) -> pd.DataFrame:
    """Per setting: the medians over its finished cells of the fullest device's model state parts
    (params_mb, grads_mb, optimizer_mb: dpstudy.engine.memory's split), NaN where none measured."""
    columns = [f"{part}_mb" for part in modes.STATE]
    if split is None or split.empty or not set(columns) <= set(split):
        return pd.DataFrame(math.nan, index=settings.index, columns=columns)
    measured = split.dropna(subset=["peak_mb"])
    fullest = measured.loc[measured.groupby("cell")["peak_mb"].idxmax()].set_index("cell")
    return pd.DataFrame({c: _per_setting(settings, fullest[c]) for c in columns}, index=settings.index)


def held_memory(settings: pd.DataFrame, split: pd.DataFrame | None) -> pd.Series:
    """Per setting: what its fullest device held at the step, the allocator's peak on CUDA (the
    tracker's plus outside_tracker), the tracker's elsewhere: what a forecast of it is checked on."""
    return setting_memory(settings, split) + outside_tracker(settings, split).fillna(0.0)


def _per_setting(settings: pd.DataFrame, per_cell: pd.Series) -> pd.Series:
    return pd.Series([per_cell.reindex(ids.split()).median() for ids in settings["cells"]], index=settings.index)


def sharded(scheme: str) -> bool:
    """Whether a scheme's devices hold a shard of the model state (dpstudy.study.modes)."""
    return bool(modes.of_scheme(scheme)[1].sharded)


class MemoryLine:
    """peak(b) of one forecast group's ranks, calibrated on single-device (batch, MB) pairs and the
    multi-device settings' (scheme, per-device batch, ranks, MB); `state` the single-device model
    state's parts (params, grads, optimizer: MB), by which a scheme that shards some of them and
    not others (ZeRO-1, ZeRO-2) divides only those."""

    def __init__(
        self,
        single: list[tuple[float, float]],
        multi: list[tuple[str, float, int, float]],
        state: dict[str, float] | None = None,
    ):
        self.state = {k: v for k, v in (state or {}).items() if np.isfinite(v)}
        single = [(b, mb) for b, mb in single if np.isfinite(mb)]
        multi = [(s, b, n, mb) for s, b, n, mb in multi if np.isfinite(mb)]
        ddp = [(b, mb) for s, b, _, mb in multi if not sharded(s)]  # replicas: one device's state
        self.known = bool(single or ddp)
        self.extra: dict[str, float] = {}
        if single:
            self.fixed, self.per_sample = line_fit(*zip(*single, strict=True))
            by_scheme: dict[str, list[float]] = {}
            for scheme, b, n, mb in multi:
                by_scheme.setdefault(scheme, []).append(mb - self.base(b, n, scheme))
            self.extra = {scheme: float(np.median(extras)) for scheme, extras in by_scheme.items()}
            self.basis = f"memory from {len(single)} single-device and {len(multi)} multi-device setting(s)"
        elif ddp:
            self.fixed, self.per_sample = line_fit(*zip(*ddp, strict=True))
            self.basis = f"memory from {len(ddp)} DDP setting(s)"
        else:
            self.fixed = self.per_sample = math.nan
            self.basis = "no measured memory"

    def base(self, b: float, n: int, scheme: str) -> float:
        made = modes.of_scheme(scheme)[1]
        if set(made.sharded) == set(modes.STATE) or not made.sharded or len(self.state) < len(modes.STATE):
            return self.fixed / (n if sharded(scheme) else 1) + self.per_sample * b
        kept = sum(mb * modes.state_share(made, part, n) for part, mb in self.state.items())
        return self.fixed - sum(self.state.values()) + kept + self.per_sample * b

    def at(self, b: float, n: int, scheme: str) -> float:
        """MB on the fullest device of a rank of `scheme` over n ranks at per-device batch b (NaN:
        nothing measured)."""
        return self.base(b, n, scheme) + self.extra.get(scheme, 0.0) if self.known else math.nan
