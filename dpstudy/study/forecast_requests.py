"""The study's `forecast:` block (schema.yaml): settings to forecast without running them, as the
list of requests dpstudy.analysis.forecast answers, checked when the study loads so that a setting
the model cannot forecast is an error naming its key before any job starts."""

from __future__ import annotations

import itertools
from typing import Any

from dpstudy.util.errors import ConfigError

GRID_KEYS = ("mode", "shard", "gpus", "nodes", "batch", "backend")
FILTER_KEYS = ("dataset", "model")
FORECAST_MODES = ("ddp", "fsdp")  # what dpstudy.analysis.forecast models
DEFAULTS = {"mode": ["ddp"], "shard": ["full"], "nodes": [1]}


def requests(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One request per combination of every `forecast:` item's lists (mode, shard, gpus, nodes,
    batch, backend), with the item's dataset and model filters (None: every workload); a DDP
    request's shard is "none" (shard is FSDP's); ConfigError names the item and key of a setting
    that cannot be forecast."""
    out = []
    for index, item in enumerate(study.get("forecast", []), start=1):
        where = f"forecast #{index}: "
        grid = {k: item.get(k, DEFAULTS.get(k)) for k in GRID_KEYS}
        for mode in grid["mode"]:
            if mode not in FORECAST_MODES:
                raise ConfigError(
                    f"{where}mode {mode!r} cannot be forecast: the model forecasts "
                    f"{', '.join(FORECAST_MODES)} (single and dp are measured, not forecast)"
                )
        for nodes in grid["nodes"]:
            if nodes != 1:
                raise ConfigError(f"{where}nodes {nodes} cannot be forecast: the model knows no link between nodes")
        for gpus, batch in itertools.product(grid["gpus"], grid["batch"]):
            if batch % gpus:
                raise ConfigError(f"{where}batch {batch} is not divisible by gpus {gpus} (batch is the global batch)")
        filters = {k: item.get(k) for k in FILTER_KEYS}
        if "shard" in item and "fsdp" not in grid["mode"]:
            raise ConfigError(f"{where}shard is FSDP's: the item forecasts mode {', '.join(grid['mode'])}")
        combos = (dict(zip(GRID_KEYS, combo, strict=True)) for combo in itertools.product(*grid.values()))
        seen = []
        for combo in combos:
            fsdp = combo["mode"] == "fsdp"
            combo["shard"] = ("full" if combo["shard"] == "none" else combo["shard"]) if fsdp else "none"
            if combo not in seen:  # a DDP request once, whatever FSDP's shards
                seen.append(combo)
        out += [{**combo, **filters} for combo in seen]
    return out
