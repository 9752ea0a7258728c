"""The figures of gpu-check's `zero` item (dpstudy.gpucheck.zero) from what it measured. Pure and
without torch: the unit tests check them on made-up numbers, and the keys are the registry's."""

from __future__ import annotations

from dpstudy.gpucheck.lm_figures import mfu, peak_of

# the strategies the item runs, by the name that prefixes their figures
SCHEMES = {"fsdp": ("fsdp", "full"), "zero2": ("deepspeed", "zero2"), "zero3": ("deepspeed", "zero3")}


def zero_result(made: dict, spec: dict) -> dict:
    """Per strategy: tokens/s, MFU, the plan's allocator peak against max_memory_allocated; ZeRO's
    tokens/s over FSDP's."""
    peak, what, source = peak_of(made["device_name"])
    figures: dict = {}
    details: dict[str, str] = {}
    for name in SCHEMES:
        row = made.get(name) or {"errors": ["did not run"]}
        why = "not measured: " + ("; ".join(row.get("errors") or []) or "no figure")
        tp = row.get("throughput") or {}
        if "tokens_per_s" in tp:
            figures[f"{name}_tokens_per_s"] = tp["tokens_per_s"]
            figures[f"{name}_mfu"] = mfu(tp["tokens_per_s"], made["flops_per_token"], peak)
            details[f"{name}_mfu"] = f"of {peak:,.1f} TFLOP/s, {what}" if peak else what
        else:
            details[f"{name}_tokens_per_s"] = why
        predicted = (row.get("predicted") or {}).get("allocated_mb")
        allocated = (row.get("measured") or {}).get("allocated_mb")
        if predicted is not None and allocated is not None:
            figures[f"{name}_allocated_mb"] = allocated
            figures[f"{name}_memory_error"] = abs(predicted / allocated - 1)
            details[f"{name}_memory_error"] = f"plan {predicted:,.0f} MB, max_memory_allocated {allocated:,.0f} MB"
        else:
            details[f"{name}_memory_error"] = why
    for name in ("zero2", "zero3"):
        if f"{name}_tokens_per_s" in figures and "fsdp_tokens_per_s" in figures:
            figures[f"{name}_vs_fsdp"] = figures[f"{name}_tokens_per_s"] / figures["fsdp_tokens_per_s"]
    args = spec["model_args"]
    notes = [
        f"{spec['model']} size {args.get('size')} ({made['params']:,} parameters), windows of {spec['seq_len']:,} "
        f"tokens, batch {spec['batch']}, {spec['precision']}, eager, one GPU over {spec['backend']} on "
        f"{made['device_name']}: FSDP full, DeepSpeed ZeRO-2 and ZeRO-3 with DeepSpeed's defaults"
    ]
    if source:
        notes.append(f"peak: {source}")
    return {"figures": figures, "details": details, "notes": notes, "data": made}
