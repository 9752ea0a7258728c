"""The record's `trace` (dpstudy.engine.tracing writes it, dpstudy.engine.trace_figures reduces
it): its fields' one definition, from which the record's schema is made."""

from __future__ import annotations

from dpstudy.record.schema import MAYBE_NUMBER, MAYBE_OBJECT, MAYBE_STRING, field

# Seconds of the median traced step; data_wait + compute + exposed_comm + idle = step.
TRACE_PARTS = {
    "step_s": field(
        MAYBE_NUMBER,
        "The median traced step (the lower middle one of an even count), from its `dpstudy:step` span; the"
        " parts below are this step's.",
    ),
    "data_wait_s": field(MAYBE_NUMBER, "Waiting for the batch (`dpstudy:data`)."),
    "compute_s": field(
        MAYBE_NUMBER,
        "Computing, outside the data wait: a GPU's kernels but the collectives'; a CPU's training thread in its"
        " dispatcher operators but the collectives' and waits.",
    ),
    "exposed_comm_s": field(
        MAYBE_NUMBER,
        "A collective in flight (issued, not finished) while the step neither computes nor waits for data:"
        " on its critical path.",
    ),
    "idle_s": field(
        MAYBE_NUMBER,
        "The rest of the step: the host between operators (Python, hooks, the dispatcher) and waits with no"
        " collective in flight.",
    ),
    "comm_s": field(MAYBE_NUMBER, "Every collective's time in flight in the step, hidden by compute or not."),
    "step_spread_s": field(MAYBE_NUMBER, "The interquartile range of the traced steps' lengths: their noise."),
    "overlap": field(MAYBE_NUMBER, "1 - exposed_comm_s / comm_s: the share of the collectives compute hid."),
    "collectives": field(
        MAYBE_OBJECT,
        "Per collective (all_reduce, all_gather, ...; Gloo runs a reduce-scatter as an all-reduce) per step:"
        " calls, bytes of the tensor the rank handed it (null where the trace does not say) and seconds.",
        additionalProperties={
            "type": "object",
            "properties": {
                "calls": field("number", "Calls per step (a mean: a call across two steps counts where it started)."),
                "bytes": field(MAYBE_NUMBER, "Bytes per step of the tensors the rank handed it."),
                "seconds": field("number", "Seconds per step it ran."),
            },
        },
    ),
}
TRACE_RANK_FIELDS = {
    "rank": field("integer", "The rank."),
    "steps": field("integer", "Steps its trace holds."),
    "activity": {"enum": ["cpu", "cuda"], "description": "What compute was read from: CUDA kernels or CPU operators."},
    **TRACE_PARTS,
    "file": field(MAYBE_STRING, "Its trace, relative to the cell's folder (gzip Chrome-trace JSON); null: not kept."),
    "bytes": field(["integer", "null"], "The file's size."),
    "reason": field(MAYBE_STRING, "Why this rank has no figures or no file; null when it has both."),
}
TRACE_FIELDS = {
    "steps": field("integer", "Training steps traced on every rank (trace_steps)."),
    "pace_rank": field(
        ["integer", "null"],
        "The rank whose figures are the cell's: the one that computed longest, which every collective waits for.",
    ),
    **TRACE_PARTS,
    "reason": field(MAYBE_STRING, "Why a rank has no figures or no file, every rank's reason; null when none."),
    "ranks": field(
        "array", "Every rank's figures, in rank order.", items={"type": "object", "properties": TRACE_RANK_FIELDS}
    ),
}
