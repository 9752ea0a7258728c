"""record.json (docs/design.md, record.json): the schema every stage reads, and atomic writing.

A record exists only when finished: it is written to a temporary file in the same folder and
renamed into place, so a killed job never leaves a half-written record behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from dpstudy.util.atomic import write_json

SCHEMA_ID = "dpstudy.record/1"
STATUSES = ("ok", "oom", "skipped", "failed")
# ends the reason of a cell skipped because the memory plan predicted it would not fit
# (dpstudy.jobs.memory_plan): how the tables tell it from a cell the hardware cannot run
BUDGET_MARK = "(study memory_budget_gib, memory plan)"

_number = {"type": "number"}
_maybe_number = {"type": ["number", "null"]}

EPOCH_FIELDS = {
    "epoch": {"type": "integer", "minimum": 1},
    "train_loss": _number,
    "train_acc": _number,
    "test_loss": _number,
    "test_acc": _number,
    "wall_s": _number,  # training part of the epoch, clocks read after a device synchronize
    "eval_s": _number,  # evaluation of the whole test set
    "data_wait_s": _number,  # blocked waiting for the next batch
    "compute_s": _number,  # wall_s - data_wait_s
    "samples": {"type": "integer"},  # training samples processed, all ranks together
    "samples_per_s": _number,
    "peak_mem_mb": {"type": "array", "items": _number},  # one per rank (DP: per device)
}
# The epoch's steady window (training steps after the run's first `warmup_steps`); optional, as
# records made before it existed have none.
STEADY_FIELDS = {
    "steady_s": _number,  # wall time of the epoch's steady steps (0 while still warming up)
    "steady_samples": {"type": "integer"},  # their samples, all ranks together
    "other_load": _number,  # cores the rest of the machine used during the epoch (dpstudy.engine.monitor.HostLoad)
    # compile: true only: wall time of the epoch's training steps (left out of steady_s and
    # steady_samples) and of its evaluation batches that compiled a graph
    "compile_s": _number,
    "eval_compile_s": _number,
    # the machine's speed after the epoch, every rank's gauge averaged (dpstudy.engine.reference.InCell):
    # GFLOP/s of small matmuls, million dispatched operators per second, GB/s copied (CPU cells)
    "machine_gflops": _number,
    "machine_mops": _number,
    "machine_gbps": _number,
    # CUDA cells: max_memory_reserved over the epoch (training and evaluation), one per rank (DP:
    # per device), beside peak_mem_mb, which is max_memory_allocated over the same span
    "peak_reserved_mb": {"type": "array", "items": _number},
}
IN_CELL_RATES = ("machine_gflops", "machine_mops", "machine_gbps")

SUMMARY_FIELDS = {
    "final_test_acc": _maybe_number,
    "median_epoch_s": _maybe_number,  # epochs >= 2 when there are several
    "samples_per_s": _maybe_number,  # over the steady window (see outcome.steady_throughput)
    "startup_s": _maybe_number,  # process start to the first epoch
    "total_s": _maybe_number,  # process start to the record
}

# Optional summary fields: records of cells without them (and records made before) have none.
OPTIONAL_SUMMARY_FIELDS = {
    "compile_s": _maybe_number,  # compile: true: wall time of the training steps and evaluation batches that compiled
    # whether the run learned, and why not (dpstudy.record.learning); status stays ok either way
    "learned": {"type": "boolean"},
    "learned_reason": {"type": ["string", "null"]},
    # why training ended before its last epoch (stop_on_divergence), if it did
    "stopped_early": {"type": ["string", "null"]},
}

# The split of a step's peak (dpstudy.engine.memory), in MB; their sum is peak_mb.
MEMORY_PARTS = ("params_mb", "grads_mb", "optimizer_mb", "activations_mb", "peak_mb")
# What the device's allocator and driver held over the same step, in MB, one per device (CUDA
# cells; None where unknown): the tracker above counts tensors, these are what a user runs out of.
ALLOCATOR_PARTS = (
    "allocated_mb",  # torch.cuda.max_memory_allocated over the step (peaks reset before it)
    "reserved_mb",  # torch.cuda.max_memory_reserved over the step: the caching allocator's segments
    "context_mb",  # the process's device memory (NVML) minus what the allocator reserved: the CUDA
    # context, cuBLAS/cuDNN workspaces outside the allocator, NCCL's buffers
    "total_mb",  # the device's memory
    "resident_mb",  # the data a `device` loader keeps on the device (train and test splits)
)
# CPU cells, where no allocator keeps a peak: how much the process's resident memory grew over the
# same step (its peak, VmHWM after /proc/self/clear_refs reset it, minus VmRSS before the step), in
# MB, one per rank; None where the kernel does not allow the reset.
HOST_PARTS = ("rss_growth_mb",)

# record.probe (dpstudy.engine.probe writes it, dpstudy.analysis.scaling reads it): the parts of a
# step the scaling model needs, by mode, and how the probe ran. The one definition of its fields:
# name -> JSON Schema (type, and the meaning as its description); times are seconds per step, the
# slowest rank's. The schema's probe part is made from it and admits no other field.
PROBE_FIELDS = {
    "steps": {"type": "integer", "description": "steps each variant timed (2 to 8: fewer when a step is slow)"},
    "sync_step_s": {
        "type": "number",
        "description": "DDP: the step with the gradient all-reduce; FSDP: as FSDP runs it (rounds median)",
    },
    "nosync_step_s": {
        "type": "number",
        "description": "DDP: the same step under no_sync; FSDP: the same step on an unsharded replica (its compute)",
    },
    "exposed_s": {
        "type": "number",
        "description": "DDP, FSDP: the median over the rounds of the step minus the step without communication",
    },
    "exposed_spread_s": {"type": "number", "description": "DDP, FSDP: the interquartile range of exposed_s's rounds"},
    "rounds": {"type": "integer", "description": "DDP, FSDP: rounds in which the two steps took turns"},
    "allreduce_s": {"type": "number", "description": "DDP: one all-reduce of the gradients alone"},
    "grad_bytes": {
        "type": "integer",
        "description": "DDP: the gradients' bytes all-reduced; FSDP: every unit's gradients, reduced in fp32",
    },
    "allgather_s": {"type": "number", "description": "FSDP: one all-gather of every unit's parameters"},
    "reduce_scatter_s": {"type": "number", "description": "FSDP: the reduce-scatter of every unit's gradients"},
    "gather_bytes": {
        "type": "integer",
        "description": "FSDP: the bytes that all-gather moves (in the mixed-precision dtype, if any)",
    },
    "units": {
        "type": "integer",
        "description": "FSDP: the units that hold parameters of their own; DDP: those FSDP would make of the model",
    },
    "buckets": {
        "type": "integer",
        "description": "DDP: the buckets a steady step all-reduces (dpstudy.engine.grad_layout)",
    },
    "scatter_s": {"type": "number", "description": "DP: scattering the batch"},
    "replicate_s": {"type": "number", "description": "DP: replicating the model"},
    "gather_s": {"type": "number", "description": "DP: gathering the outputs"},
    "graphs_compiled": {
        "type": "integer",
        "description": "compile: true: graphs the probe compiled (0: it timed training's own graphs)",
    },
}

RECORD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "cell", "status", "reason", "spec", "env", "epochs", "summary"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "cell": {"type": "string"},
        "status": {"enum": list(STATUSES)},
        "reason": {"type": ["string", "null"]},
        "spec": {"type": "object"},
        "env": {
            "type": "object",
            "required": ["torch", "python", "hostname", "world_size", "code_version"],
        },
        "epochs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": list(EPOCH_FIELDS),
                "properties": {**EPOCH_FIELDS, **STEADY_FIELDS},
            },
        },
        "summary": {
            "type": "object",
            "required": list(SUMMARY_FIELDS),
            "properties": {**SUMMARY_FIELDS, **OPTIONAL_SUMMARY_FIELDS},
        },
        "util": {"type": ["object", "null"]},
        # optional: the parts of a step for the scaling model (dpstudy.engine.probe), DDP, FSDP and DP only
        "probe": {"type": ["object", "null"], "additionalProperties": False, "properties": PROBE_FIELDS},
        # optional: one training step's peak memory per device split by what holds it
        # (dpstudy.engine.memory), a list per part in rank order (DP: per GPU); ok cells only
        "memory": {
            "type": ["object", "null"],
            "required": list(MEMORY_PARTS),
            "additionalProperties": False,
            "properties": {
                part: {"type": "array", "items": _maybe_number}
                for part in (*MEMORY_PARTS, *ALLOCATOR_PARTS, *HOST_PARTS)
            },
        },
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
    }


def write(path: str | Path, record: dict[str, Any]) -> None:
    validate(record)
    write_json(path, record)


def read(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        record = json.load(f)
    validate(record)
    return record
