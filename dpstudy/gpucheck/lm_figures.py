"""The figures of gpu-check's `lm` item (dpstudy.gpucheck.lm) from what it measured. Pure and
without torch: the unit tests check them on made-up numbers, and the keys are the registry's."""

from __future__ import annotations

from dpstudy.util import peaks

HOWS = ("none", "full")  # activation_checkpointing: the memory plan is checked for both


def peak_of(device_name: str) -> tuple[float | None, str, str | None]:
    """(dense BF16 peak in TFLOP/s, what it is, its source) of a device by its torch name; for a
    device not in dpstudy.util.peaks: None and why, never another device's figure."""
    peak = peaks.lookup(device_name)
    tflops = peak.tflops("bf16") if peak else None
    if not tflops:
        return None, f"unknown: {device_name} is not in dpstudy.util.peaks", None
    return tflops, f"{peak.label} dense BF16", peak.source


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the peak; None without a peak."""
    if not peak_tflops:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def throughput_result(t: dict, flops_per_token: float, device_name: str) -> dict:
    """Figures from lm.measure_throughput's record `t`."""
    peak, what, source = peak_of(device_name)
    step_s, loss_s = t["step_s"], t["loss_s"]
    model_s = step_s - loss_s  # the step less the eager loss, timed alone
    figures = {
        "mfu": mfu(t["tokens_per_s"], flops_per_token, peak),
        "tokens_per_s": t["tokens_per_s"],
        "achieved_tflops": t["tokens_per_s"] * flops_per_token / 1e12,
        "step_ms": step_s * 1e3,
        "loss_share": loss_s / step_s,
        "mfu_without_loss": mfu(t["tokens_per_s"] * step_s / model_s, flops_per_token, peak) if model_s > 0 else None,
        "compile_s": t["compile_s"],
        "loss_finite": t["loss_finite"],
    }
    epochs = ", ".join(f"{v:,.0f}" for v in t["epoch_tokens_per_s"])
    details = {
        "mfu": f"of {peak:,.1f} TFLOP/s, {what}" if peak else what,
        "tokens_per_s": f"{t['steady_steps']} steps in {t['steady_s']:.2f} s; by epoch {epochs}",
        "loss_share": f"{loss_s * 1e3:.1f} ms: the logits in fp32, cross-entropy and its backward, argmax",
        "compile_s": f"the warm-up epoch took {t['warmup_s']:.1f} s",
        "loss_finite": f"loss {t['first_loss']:.3f} (warm-up epoch) -> {t['final_loss']:.3f}",
    }
    if not peak:
        details["mfu_without_loss"] = what
    elif model_s > 0:
        details["mfu_without_loss"] = f"of {peak:,.1f} TFLOP/s: the step in {model_s * 1e3:.1f} ms"
    else:
        details["mfu_without_loss"] = f"the loss alone ({loss_s * 1e3:.1f} ms) took the whole step"
    if t["steady_compile_s"]:
        details["compile_s"] += f"; {t['steady_compile_s']:.1f} s recompiling in steady epochs, outside their window"
    return {"figures": figures, "details": details, "notes": [f"peak: {source}"] if source else []}


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _parts(split: dict) -> str:
    return ", ".join(
        f"{part} {_mb(split.get(f'{part}_mb'))}" for part in ("params", "grads", "optimizer", "activations")
    )


def memory_result(rows: dict[str, dict]) -> dict:
    """Figures from lm.measure_memory's {how: {"predicted", "measured", "errors"}}: the plan's
    allocator peak against max_memory_allocated, and what checkpointing saved."""
    figures: dict = {}
    details: dict[str, str] = {}
    notes: list[str] = []
    held: dict[str, tuple[float | None, float]] = {}
    for how in HOWS:
        row = rows.get(how) or {"errors": ["did not run"]}
        key = f"memory_{how}_error"
        plan, step = row.get("predicted") or {}, row.get("measured") or {}
        predicted, allocated = plan.get("allocated_mb"), step.get("allocated_mb")
        if allocated is not None:
            held[how] = (predicted, allocated)
        if predicted is None or allocated is None:
            why = row.get("errors") or ["no allocator peak" + (" measured (not on CUDA)" if allocated is None else "")]
            details[key] = "not measured: " + "; ".join(why)
            continue
        error = predicted / allocated - 1
        figures[key] = abs(error)
        side = "above" if error >= 0 else "below"
        details[key] = f"plan {predicted:,.0f} MB, {side} max_memory_allocated {allocated:,.0f} MB"
        notes.append(
            f"checkpointing {how}: plan {_mb(predicted)} MB = fake step {_mb(plan.get('peak_mb'))} "
            f"({_parts(plan)}) + cuBLAS workspaces {_mb(plan.get('workspace_mb'))} + resident data; measured "
            f"allocated {_mb(allocated)} MB, its tracker {_mb(step.get('peak_mb'))} ({_parts(step)}), reserved "
            f"{_mb(step.get('reserved_mb'))}, CUDA context {_mb(step.get('context_mb'))} ({error:+.1%})"
        )
    if set(held) == set(HOWS):
        figures["checkpointing_saving_mb"] = held["none"][1] - held["full"][1]
        planned = [held[how][0] for how in HOWS]
        if None not in planned:
            details["checkpointing_saving_mb"] = f"planned {planned[0] - planned[1]:,.0f} MB"
    return {"figures": figures, "details": details, "notes": notes}


def setup_note(made: dict, spec: dict) -> str:
    """What ran, in one line."""
    args, batch, seq_len = spec["model_args"], spec["batch"], spec["seq_len"]
    vocab = args.get("vocab_size")
    return (
        f"{spec['model']} size {args.get('size')} ({made['params']:,} parameters, "
        f"{f'vocabulary {vocab:,}' if vocab else 'the data vocabulary'}) on random bytes, windows of "
        f"{seq_len:,} tokens, batch {batch} ({batch * seq_len:,} tokens a step), {spec['precision']} autocast, "
        f"{spec['optimizer']} (lr {spec['lr']:g}), compile {spec['compile']} (the model, as in a cell: the loss "
        f"runs eagerly), one device, the project's Trainer and device token loader on {made['device_name']}; a "
        f"warm-up epoch of {spec['warmup_steps']} steps, then steady epochs of {spec['warmup_steps']}. Memory: one "
        "eager step each, after a first step (Adam's state exists), as a cell's record measures it"
    )


def lm_result(made: dict, spec: dict) -> dict:
    """The item's figures, details, notes and data from lm.measure's record `made` and the
    throughput cell's `spec`."""
    figures: dict = {"flops_per_token": made["flops_per_token"]}
    details = {"flops_per_token": f"{made['params']:,} parameters"}
    notes = [setup_note(made, spec)]
    t = made.get("throughput") or {"error": "did not run"}
    if "error" in t:
        details.update({key: f"not measured: {t['error']}" for key in ("mfu", "tokens_per_s", "loss_finite")})
    else:
        made_t = throughput_result(t, made["flops_per_token"], made["device_name"])
        figures.update(made_t["figures"])
        details.update(made_t["details"])
        notes += made_t["notes"]
    memory = memory_result(made.get("memory") or {})
    figures.update(memory["figures"])
    details.update(memory["details"])
    notes += memory["notes"]
    return {"figures": figures, "details": details, "notes": notes, "data": made}
