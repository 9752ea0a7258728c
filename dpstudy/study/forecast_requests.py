"""The study's `forecast:` block (schema.yaml): settings to forecast without running them, as the
list of requests dpstudy.analysis.calibration answers, checked when the study loads so that a setting
the model cannot forecast is an error naming its key before any job starts."""

from __future__ import annotations

import itertools
from typing import Any

from dpstudy.study import modes
from dpstudy.util.errors import ConfigError

GRID_KEYS = ("mode", "shard", "gpus", "nodes", "batch", "backend")
FILTER_KEYS = ("dataset", "model")
DEFAULTS = {"mode": [modes.REFERENCE[0]], "nodes": [1]}


def requests(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One request per combination of every `forecast:` item's lists (mode, shard, gpus, nodes,
    batch, backend), with the item's dataset and model filters (None: every workload); a DDP
    request's shard is "none" (shard is FSDP's); ConfigError names the item and key of a setting
    that cannot be forecast."""
    out = []
    for index, item in enumerate(study.get("forecast", []), start=1):
        where = f"forecast #{index}: "
        grid = {k: item.get(k, DEFAULTS.get(k)) for k in GRID_KEYS}
        forecast = modes.forecast_modes()
        for mode in grid["mode"]:
            if mode not in forecast:
                unforecast = modes.listed([m for m in modes.TABLE if m not in forecast], "and")
                raise ConfigError(
                    f"{where}mode {mode!r} cannot be forecast: the model forecasts "
                    f"{', '.join(forecast)} ({unforecast} are measured, not forecast)"
                )
        for nodes in grid["nodes"]:
            if nodes != 1:
                raise ConfigError(f"{where}nodes {nodes} cannot be forecast: the model knows no link between nodes")
        for gpus, batch in itertools.product(grid["gpus"], grid["batch"]):
            if batch % gpus:
                raise ConfigError(f"{where}batch {batch} is not divisible by gpus {gpus} (batch is the global batch)")
        filters = {k: item.get(k) for k in FILTER_KEYS}
        if grid["shard"] is None:
            grid["shard"] = [modes.NO_SHARD]  # each mode's default
        for shard in (s for s in grid["shard"] if s != modes.NO_SHARD):
            takers = [m for m in grid["mode"] if shard in modes.TABLE[m].shards]
            if not takers:
                raise ConfigError(f"{where}shard {shard!r} is no shard of mode {modes.listed(grid['mode'])}")
            for mode in takers:
                if modes.scheme_name(mode, shard) not in modes.priced_schemes():
                    why = modes.scheme(mode, shard).unpriced
                    raise ConfigError(
                        f"{where}mode {mode} with shard {shard!r} cannot be forecast: {why} are not priced"
                    )
        combos = (dict(zip(GRID_KEYS, combo, strict=True)) for combo in itertools.product(*grid.values()))
        seen = []
        for combo in combos:
            facts, shard = modes.TABLE[combo["mode"]], combo["shard"]
            if shard not in (*facts.shards, modes.NO_SHARD) and facts.shards != (modes.NO_SHARD,):
                continue  # another sharding mode's shard
            combo["shard"] = modes.shard_of(combo["mode"], shard)
            if combo not in seen:  # a DDP request once, whatever FSDP's shards
                seen.append(combo)
        out += [{**combo, **filters} for combo in seen]
    return out
