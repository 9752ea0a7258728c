"""What the step model (dpstudy.analysis.step_model) is calibrated on, per cell and per setting: the
measured step and its waiting for data (the steady epochs), the communication the step left exposed
and DP's transfers (the cell's trace, else its probe).

Per cell (`cell_parts`):
  step_s           the global batch / the cell's throughput (samples_per_s, its steady epochs): the
                   step that the throughput, the speedup and the forecasts all speak of
  data_step_s      its share of the median steady epoch spent waiting for data x step_s
  exposed_step_s   the collectives' time on the critical path per step, never below 0, by the
                   device kind's order of EXPOSED_FROM: the trace's (trace_exposed_comm_s,
                   dpstudy.engine.trace_figures) or the probe's rounds (exposed_s; older probes:
                   sync_step_s - nosync_step_s), the other where the first is missing
  exposed_source   trace, probe, or none
  traced_exposed_s the trace's exposed communication per step whichever the model read (NaN: untraced)
  transfers_s      DP's scatter + replicate + gather per step (the probe of a dp cell)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.study import modes

CELL_PARTS = ("step_s", "data_step_s", "exposed_step_s", "transfers_s", "traced_exposed_s")
# Which measurement of the exposed communication the step model reads first, per device kind. On a
# GPU the trace times the NCCL kernels on the device, beside the compute kernels. On a CPU the two
# disagree on what to call the compute that slows down while Gloo's threads share its cores: the trace
# counts it as compute, the probe (the step with its collectives minus without) as what the
# collectives cost; the probe's is what a forecast needs, and the one that forecasts other settings
# better (benchmarks/prediction_accuracy.py --cpu-exposed trace compares the two; docs/traces.md).
EXPOSED_FROM = {"cuda": ("trace", "probe")}
PROBE_FIRST = ("probe", "trace")
NUMBERS = ("wall_s", "compute_s", "data_wait_s", "samples")


def epoch_medians(epochs: pd.DataFrame) -> pd.DataFrame:
    """Per cell: median wall, compute, data wait and samples over its steady epochs. The steps that
    compiled a graph (compile: true) are not training work: their seconds leave wall and compute,
    as they leave the throughput's steady window."""
    if epochs is None or epochs.empty:
        return pd.DataFrame(columns=list(NUMBERS), index=pd.Index([], name="cell"))
    steady = epochs[~epochs["warmup"].astype(bool)]
    compiling = steady["compile_s"].fillna(0.0) if "compile_s" in steady else 0.0
    steady = steady.assign(wall_s=steady["wall_s"] - compiling, compute_s=steady["compute_s"] - compiling)
    return steady.groupby("cell")[list(NUMBERS)].median()


def column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name].astype(float) if name in frame else pd.Series(math.nan, index=frame.index, dtype=float)


def cell_parts(cells: pd.DataFrame, epochs: pd.DataFrame | None) -> pd.DataFrame:
    """The module's per-cell parts, indexed by cell; data_step_s NaN without epochs."""
    indexed = cells.set_index("cell")
    out = pd.DataFrame(index=indexed.index)
    medians = epoch_medians(epochs).reindex(out.index)
    out["step_s"] = column(indexed, "global_batch") / column(indexed, "samples_per_s")
    out["data_step_s"] = medians["data_wait_s"].astype(float) / medians["wall_s"].astype(float) * out["step_s"]
    measured = {
        "trace": column(indexed, "trace_exposed_comm_s"),
        "probe": column(indexed, "exposed_s").fillna(column(indexed, "sync_step_s") - column(indexed, "nosync_step_s")),
    }
    devices = indexed["env_device"] if "env_device" in indexed else pd.Series("cpu", index=indexed.index)
    first = np.array([EXPOSED_FROM.get(d, PROBE_FIRST)[0] for d in devices], dtype=object)
    preferred = measured["trace"].where(first == "trace", measured["probe"])
    other = measured["probe"].where(first == "trace", measured["trace"])
    other_name = np.where(first == "trace", "probe", "trace")
    out["exposed_step_s"] = preferred.fillna(other).clip(lower=0.0)
    out["exposed_source"] = np.where(preferred.notna(), first, np.where(other.notna(), other_name, "none"))
    out["traced_exposed_s"] = measured["trace"]
    transfers = [column(indexed, k) for k in ("scatter_s", "replicate_s", "gather_s")]
    out["transfers_s"] = sum(transfers) if transfers else math.nan
    return out


def setting_parts(settings: pd.DataFrame, parts: pd.DataFrame) -> pd.DataFrame:
    """`settings` with the medians of CELL_PARTS over each setting's finished repeats (its `cells`,
    space-separated) and the commonest exposed_source; a DP setting's exposed is 0 (it has no
    collective), everyone's transfers 0 but DP's."""
    out = settings.copy()
    ids = [str(c).split() if isinstance(c, str) else [] for c in out["cells"]]
    for name in CELL_PARTS:
        out[name] = [float(parts.loc[i, name].median()) if i else math.nan for i in ids]
    out["exposed_source"] = [parts.loc[i, "exposed_source"].mode().iloc[0] if i else "none" for i in ids]
    dp = out["mode"].isin(modes.transfer_modes()).to_numpy()
    out.loc[dp, "exposed_step_s"] = 0.0
    out.loc[~dp, "transfers_s"] = 0.0
    out["data_step_s"] = out["data_step_s"].fillna(0.0)
    return out
