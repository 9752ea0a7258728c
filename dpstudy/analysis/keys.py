"""The columns that identify a cell, a setting and a single-device baseline in the tables."""

from __future__ import annotations

from dpstudy.study import schema

SPEC_KEYS = tuple(schema.schema()["$defs"]["spec"]["properties"])
# A record made before a setting existed ran with that setting's default (nodes: one node).
SPEC_DEFAULTS = schema.defaults("spec")
# Keys that may differ between a cell and its single-device baseline. batch_scope and
# lr_scaling change nothing on one device, so the baseline ignores them too.
BASELINE_IGNORES = ("mode", "gpus", "nodes", "backend", "shard", "data_root", "repeat", "batch_scope", "lr_scaling")
BASELINE_KEYS = tuple(k for k in SPEC_KEYS if k not in BASELINE_IGNORES) + ("env_device",)
# A setting: a cell up to its repeat index; the repeats of a setting are summarised together.
SETTING_KEYS = [k for k in SPEC_KEYS if k not in ("repeat", "data_root")] + ["devices", "env_device", "global_batch"]
