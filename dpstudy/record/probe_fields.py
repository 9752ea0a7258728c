"""record.json's `probe` (dpstudy.engine.probe): what each mode's probe measures after training, one
field each, with its meaning."""

from __future__ import annotations

from dpstudy.record.schema import field

PROBE_FIELDS = {
    "steps": field("integer", "Steps each variant timed (2 to 8: fewer when a step is slow)."),
    "sync_step_s": field(
        "number", "DDP: the step with the gradient all-reduce; FSDP: as FSDP runs it (rounds median)."
    ),
    "nosync_step_s": field(
        "number", "DDP: the same step under no_sync; FSDP: the same step on an unsharded replica (its compute)."
    ),
    "exposed_s": field(
        "number", "DDP, FSDP: the median over the rounds of the step minus the step without communication."
    ),
    "exposed_spread_s": field("number", "DDP, FSDP: the interquartile range of exposed_s's rounds."),
    "rounds": field("integer", "DDP, FSDP: rounds in which the two steps took turns."),
    "allreduce_s": field("number", "DDP: one all-reduce of the gradients alone."),
    "grad_bytes": field(
        "integer",
        "DDP: the gradients' bytes all-reduced; FSDP: every unit's gradients, reduced in fp32; deepspeed: the "
        "bytes a ZeRO step all-reduces (ZeRO-1, 2) or reduce-scatters (ZeRO-3), counted.",
    ),
    "allgather_s": field("number", "FSDP: one all-gather of every unit's parameters."),
    "reduce_scatter_s": field("number", "FSDP: the reduce-scatter of every unit's gradients."),
    "gather_bytes": field(
        "integer",
        "FSDP: the bytes that all-gather moves (in the mixed-precision dtype, if any); deepspeed: every byte a "
        "ZeRO step all-gathers, counted.",
    ),
    "units": field(
        "integer",
        "FSDP: the units that hold parameters of their own; DDP: those FSDP would make of the model (its forecast).",
    ),
    "gathers": field("integer", "deepspeed: the all-gathers of the parameters a ZeRO step makes, counted."),
    "buckets": field(
        "integer",
        "DDP: the buckets a steady step all-reduces (dpstudy.engine.grad_layout); deepspeed: the gradient "
        "reductions a ZeRO step makes, counted.",
    ),
    "scatter_s": field("number", "DP: scattering the batch."),
    "replicate_s": field("number", "DP: replicating the model."),
    "gather_s": field("number", "DP: gathering the outputs."),
    "graphs_compiled": field(
        "integer", "`compile: true`: graphs the probe compiled (0: it timed training's own graphs)."
    ),
}
