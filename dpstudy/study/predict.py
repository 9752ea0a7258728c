"""The study's `predict:` block (schema.yaml): settings to forecast without running them, as the
list of requests dpstudy.analysis.forecast answers, checked when the study loads so that a setting
the model cannot forecast is an error naming its key before any job starts."""

from __future__ import annotations

import itertools
from typing import Any

from dpstudy.util.errors import ConfigError

GRID_KEYS = ("mode", "gpus", "nodes", "batch", "backend")
FILTER_KEYS = ("dataset", "model")
FORECAST_MODES = ("ddp",)  # what dpstudy.analysis.forecast models


def requests(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One request per combination of every `predict:` item's lists (mode, gpus, nodes, batch,
    backend), with the item's dataset and model filters (None: every workload); ConfigError names
    the item and key of a setting that cannot be forecast."""
    out = []
    for index, item in enumerate(study.get("predict", []), start=1):
        where = f"predict #{index}: "
        grid = {k: item.get(k, {"mode": ["ddp"], "nodes": [1]}.get(k)) for k in GRID_KEYS}
        for mode in grid["mode"]:
            if mode not in FORECAST_MODES:
                raise ConfigError(
                    f"{where}mode {mode!r} cannot be forecast: the model forecasts "
                    f"{', '.join(FORECAST_MODES)} (single, dp and fsdp are measured, not forecast)"
                )
        for nodes in grid["nodes"]:
            if nodes != 1:
                raise ConfigError(f"{where}nodes {nodes} cannot be forecast: the model knows no link between nodes")
        for gpus, batch in itertools.product(grid["gpus"], grid["batch"]):
            if batch % gpus:
                raise ConfigError(f"{where}batch {batch} is not divisible by gpus {gpus} (batch is the global batch)")
        filters = {k: item.get(k) for k in FILTER_KEYS}
        out += [{**dict(zip(GRID_KEYS, combo, strict=True)), **filters} for combo in itertools.product(*grid.values())]
    return out
