"""record.json (docs/record.md): RECORD_SCHEMA, the schema every stage reads, made of the parts'
fields (dpstudy.record.schema), and the record's making, atomic writing and reading. What a field
means is its `description` (docs/record.md is rendered from them), how a record is written the
schema's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from dpstudy.record.probe_fields import PROBE_FIELDS
from dpstudy.record.schema import (
    ALLOCATOR_PARTS,
    ALLOCATOR_SPLIT,
    BUDGET_MARK,
    COST_FIELDS,
    ENV_FIELDS,
    EPOCH_FIELDS,
    HOST_PARTS,
    HOST_SPLIT,
    IN_CELL_RATES,
    MAYBE_NUMBER,
    MAYBE_OBJECT,
    MAYBE_STRING,
    MEMORY_PARTS,
    MEMORY_SPLIT,
    OPTIONAL_SUMMARY_FIELDS,
    SCHEMA_ID,
    STATUSES,
    STEADY_FIELDS,
    SUMMARY_FIELDS,
    UTIL_SAMPLE,
    field,
    per_rank,
)
from dpstudy.record.trace_fields import TRACE_FIELDS
from dpstudy.util.atomic import write_json

# What other modules import from here: the parts' names and tables live in dpstudy.record.schema.
__all__ = [
    "ALLOCATOR_PARTS",
    "BUDGET_MARK",
    "EPOCH_FIELDS",
    "HOST_PARTS",
    "IN_CELL_RATES",
    "MEMORY_PARTS",
    "OPTIONAL_SUMMARY_FIELDS",
    "PROBE_FIELDS",
    "RECORD_SCHEMA",
    "SCHEMA_ID",
    "STATUSES",
    "STEADY_FIELDS",
    "SUMMARY_FIELDS",
    "empty_summary",
    "make",
    "read",
    "validate",
    "write",
]

RECORD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "record.json",
    "description": (
        "One per cell, `results/cells/{cell}/record.json`, the only output of its job. It exists only when"
        " finished: written to a temporary file in the same folder and renamed into place, so a killed job"
        " leaves none (and the next run reruns the cell). It is validated against this schema when written"
        f" and when read; its schema id is `{SCHEMA_ID}`."
    ),
    "type": "object",
    "required": ["schema", "cell", "status", "reason", "spec", "env", "epochs", "summary"],
    "properties": {
        "schema": {"const": SCHEMA_ID, "description": "The schema the record follows."},
        "cell": field("string", "The cell's id, the name of its folder."),
        "status": {
            "enum": list(STATUSES),
            "description": (
                "`ok`: trained (rank 0 writes it). `oom`: a rank ran out of memory; it writes the record and"
                " every rank stops at once (dpstudy.engine.outcome). `skipped`: the hardware cannot run the"
                " cell, or the memory plan predicted it would not fit (its reason then ends with"
                f" `{BUDGET_MARK}`). `failed`: an error; the launcher also writes one when the ranks end"
                " without a record, when the cell passes its time limit outside SLURM, and on a retry after"
                " SLURM stopped the job at its time or memory limit."
            ),
        },
        "reason": field(
            MAYBE_STRING,
            "Why the cell is not ok: the error (`rank N: ...`, naming a dead or silent peer first), what the"
            " hardware lacks, the limit it passed; null when ok.",
        ),
        "spec": field("object", "The complete settings the cell ran with: the `spec` of docs/config.md."),
        "env": field(
            "object",
            "The environment the cell ran in (dpstudy.record.envinfo).",
            required=["torch", "python", "hostname", "world_size", "code_version"],
            properties=ENV_FIELDS,
        ),
        "epochs": field(
            "array",
            "One entry per epoch finished, in order: empty when none was.",
            items={"type": "object", "required": list(EPOCH_FIELDS), "properties": {**EPOCH_FIELDS, **STEADY_FIELDS}},
        ),
        "summary": field(
            "object",
            "The run over its epochs (dpstudy.engine.outcome); the numbers are null without epochs.",
            required=list(SUMMARY_FIELDS),
            properties={**SUMMARY_FIELDS, **OPTIONAL_SUMMARY_FIELDS},
        ),
        "util": field(
            MAYBE_OBJECT,
            "GPU utilisation and memory, sampled by NVML every 0.5 s (dpstudy.engine.monitor.UtilSampler) on"
            " the devices the writing rank drives (DP: every GPU), keyed by CUDA device index; null where"
            " nothing was sampled (CPU cells, no NVML).",
            additionalProperties={"type": "array", "items": {"type": "object", "properties": UTIL_SAMPLE}},
        ),
        "probe": field(
            MAYBE_OBJECT,
            "DDP, FSDP and DP cells, after training: the parts of a step the step model needs, timed by"
            " dpstudy.engine.probe. The step with and without communication take turns over `rounds` rounds, so"
            " that a drift of the machine touches both alike (medians); times are seconds per step, the slowest"
            " rank's. Each mode writes its own fields.",
            additionalProperties=False,
            properties=PROBE_FIELDS,
        ),
        "cost": field(
            MAYBE_OBJECT,
            "What one training sample costs, counted before training (dpstudy.engine.cost); null in a record"
            " no rank trained (skipped before torch started, a launcher's).",
            additionalProperties=False,
            properties=COST_FIELDS,
        ),
        "trace": field(
            MAYBE_OBJECT,
            "ok cells with trace_steps (by default those on more than one device), last: a torch.profiler trace"
            " of a few training steps on every rank, reduced in the job (dpstudy.engine.trace_figures). The"
            " cell's figures are its pace-setting rank's; `ranks` holds every rank's and where its trace file is."
            " null where nothing was traced; a record from before traces has none.",
            additionalProperties=False,
            properties=TRACE_FIELDS,
        ),
        "memory": field(
            MAYBE_OBJECT,
            "ok cells: one more training step after the last evaluation, its peak memory on each device split"
            " by what holds it (PyTorch's MemTracker, FSDPMemTracker; dpstudy.engine.memory): a list per part,"
            " one value per device in rank order (DP: per GPU), in MB, null where unknown. Tensors that exist"
            " before the step and are not the model's or the optimizer's (a `device` loader's resident data,"
            " DDP's gradient buckets) are not in the split; peak_mem_mb holds them. CUDA cells add what the"
            " allocator and driver held over the step, CPU cells how resident memory grew.",
            required=list(MEMORY_PARTS),
            additionalProperties=False,
            properties={
                part: per_rank(meaning, {"type": MAYBE_NUMBER})
                for part, meaning in {**MEMORY_SPLIT, **ALLOCATOR_SPLIT, **HOST_SPLIT}.items()
            },
        ),
    },
}


def validate(record: dict[str, Any]) -> None:
    Draft202012Validator(RECORD_SCHEMA).validate(record)


def empty_summary() -> dict[str, Any]:
    return {key: None for key in SUMMARY_FIELDS}


def make(
    cell: str,
    status: str,
    reason: str | None,
    spec: dict[str, Any],
    env: dict[str, Any],
    epochs: list[dict[str, Any]] | None = None,
    summary: dict[str, Any] | None = None,
    util: dict | None = None,
    probe: dict | None = None,
    memory: dict | None = None,
    cost: dict | None = None,
    trace: dict | None = None,
) -> dict[str, Any]:
    """A record with every required field; what is not given stays empty."""
    return {
        "schema": SCHEMA_ID,
        "cell": cell,
        "status": status,
        "reason": reason,
        "spec": spec,
        "env": env,
        "epochs": list(epochs or []),
        "summary": {**empty_summary(), **(summary or {})},
        "util": util,
        "probe": probe,
        "memory": memory,
        "cost": cost,
        "trace": trace,
    }


def write(path: str | Path, record: dict[str, Any]) -> None:
    validate(record)
    write_json(path, record)


def read(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        record = json.load(f)
    validate(record)
    return record
