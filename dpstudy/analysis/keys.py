"""The columns that identify a cell, a setting, a single-device baseline, a strategy, a workload and
a forecast group in the tables: every key tuple of the analysis, here and nowhere else."""

from __future__ import annotations

import json
from typing import Any

from dpstudy.study import modes, schema

SPEC_KEYS = tuple(schema.schema()["$defs"]["spec"]["properties"])


def _numeric_dtype(prop: dict) -> str | None:
    """The column dtype of a nullable numeric spec key: a column of nulls stays numeric, so that
    tables group and join on it alike however they were made (CSV reads an empty column as float)."""
    prop = schema.resolve(prop)
    kinds = prop.get("type") if isinstance(prop.get("type"), list) else [prop.get("type")]
    if "null" not in kinds:
        return None
    return "Int64" if "integer" in kinds else "float64" if "number" in kinds else None


NUMERIC_SPEC_DTYPES = {
    key: dtype
    for key, prop in schema.schema()["$defs"]["spec"]["properties"].items()
    if (dtype := _numeric_dtype(prop)) is not None
}
# A record made before a setting existed ran with that setting's default (nodes: one node).
SPEC_DEFAULTS = schema.defaults("spec")
# Text settings whose null means a value: the tables hold the value, never an all-null column of
# text (grouped, it turns into numbers, and joins on it fail).
NULL_MEANS = {"activation_checkpointing": "none"}
# Keys that may differ between a cell and its single-device baseline. batch_scope and
# lr_scaling change nothing on one device, so the baseline ignores them too.
BASELINE_IGNORES = (
    "mode",
    "gpus",
    "nodes",
    "backend",
    "shard",
    "data_root",
    "code_path",
    "repeat",
    "batch_scope",
    "lr_scaling",
    *modes.knobs(),  # a mode's or a shard's own settings (DDP's, hybrid's replicate): one device runs without
    "trace_steps",  # steps traced after the timed epochs: no timed figure changes with it
)
BASELINE_KEYS = tuple(k for k in SPEC_KEYS if k not in BASELINE_IGNORES) + ("env_device",)
# A setting: a cell up to its repeat index; the repeats of a setting are summarised together.
# (data_root and code_path say where the data and the user's code are, not what the cell does;
# trace_steps what is recorded after the timed epochs)
SETTING_KEYS = [k for k in SPEC_KEYS if k not in ("repeat", "data_root", "code_path", "trace_steps")] + [
    "devices",
    "env_device",
    "global_batch",
]


def column_value(value: Any) -> Any:
    """A spec value as a table holds it: a dict (model_args) as its key-sorted JSON text, which
    groups, compares and reads back from CSV as itself."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


# A mode's and a shard's own settings, in the order the tables show them: the shard's beside it.
SHARD_KNOBS = tuple(k for m in modes.TABLE.values() for s in m.schemes for k in s.knobs)
MODE_KNOBS = tuple(k for m in modes.TABLE.values() for k in m.knobs)
# How a workload is spread over devices (docs/glossary.md, strategy)
STRATEGY_KEYS = (
    *("mode", "gpus", "nodes", "backend", "shard", *SHARD_KNOBS, "compile", "batch_scope", "lr_scaling"),
    *MODE_KNOBS,
)
# follow from the strategy at the workload's global batch
DERIVED_KEYS = ("devices", "batch")
# A setting up to its strategy (docs/glossary.md, workload): what strategies are compared on
WORKLOAD_KEYS = tuple(k for k in SETTING_KEYS if k not in (*STRATEGY_KEYS, *DERIVED_KEYS))
# A workload up to its global batch: what a strategy's largest batch is sought within
# (dpstudy.analysis.largest_batch)
GROUP_KEYS = tuple(k for k in WORKLOAD_KEYS if k != "global_batch")
BATCH_KEYS = ("batch", "global_batch", "devices")
# What one calibration of the step model covers (dpstudy.analysis.calibration). compile stays in it
# though the strategies table counts it a strategy key: a compiled step is not an eager one, so
# each calibrates only on cells of its own kind
FORECAST_GROUP = tuple(k for k in SETTING_KEYS if k == "compile" or k not in (*STRATEGY_KEYS, *BATCH_KEYS))
