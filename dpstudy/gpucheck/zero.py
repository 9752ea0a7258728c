"""Item 11 of `make gpu-check`: DeepSpeed's ZeRO-2 and ZeRO-3 beside FSDP full, the lm item's GPT-2
small (dpstudy.gpucheck.lm) on one GPU over NCCL, each as a cell trains it (its mode started on a
process group of one rank, the device token loader, the Trainer), eagerly: DeepSpeed's engine
takes no torch.compile, so FSDP runs eager too and the three compare like for like.

- throughput: tokens/s and MFU of steady epochs (lm.measure_throughput), each strategy's own.
- memory: the memory plan (memory_plan.predict: ZeRO's from the plain model's fake step and its
  scheme's facts, FSDP's on fake tensors) against max_memory_allocated over one training step, as
  a cell measures it; DeepSpeed's defaults, so its 500-million-element bucket (1 GB in bf16) is in it.

`measure` runs on a CPU too (the unit tests, a tiny model over Gloo); the figures are
dpstudy.gpucheck.zero_figures'.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

from dpstudy.gpucheck import lm
from dpstudy.gpucheck.zero_figures import SCHEMES, zero_result


def zero_spec(mode: str, shard: str, device: str = "cuda", **settings: Any) -> dict:
    """The cell of one strategy; `settings` override (tests), a knob only where its mode takes it."""
    from dpstudy.study import modes

    own = (*modes.TABLE[mode].knobs, *modes.scheme(mode, shard).knobs)
    settings = {k: v for k, v in settings.items() if k not in modes.knobs() or k in own}
    backend = "nccl" if device == "cuda" else "gloo"
    return lm.lm_spec("none", False, device, mode=mode, shard=shard, gpus=1, backend=backend, **settings)


def one_rank() -> None:
    """The environment torchrun gives a rank, for a process group of one (DeepSpeed reads LOCAL_RANK)."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def ended() -> None:
    """The process group the strategies shared (DeepSpeed keeps the groups it made of it: each
    strategy trains on the one the first started), destroyed at the end."""
    import torch.distributed as dist

    from dpstudy.engine.modes.distributed import destroy_process_group

    if dist.is_initialized():
        destroy_process_group()


def measure(device: str = "cuda", min_steady_s: float = lm.MIN_STEADY_S, **settings: Any) -> dict:
    """{name: {"throughput": lm.measure_throughput's, "predicted": the plan's, "measured": the step's}}
    for each of SCHEMES, and the model's parameters and FLOPs per token."""
    import torch

    from dpstudy.workflow import memory_plan

    one_rank()
    specs = {name: zero_spec(mode, shard, device, **settings) for name, (mode, shard) in SCHEMES.items()}
    some = next(iter(specs.values()))
    made: dict[str, Any] = {"device_name": torch.cuda.get_device_name(0) if device == "cuda" else device}
    made["params"], made["flops_per_token"] = lm.count(some)
    tokens = lm.random_bytes(some["batch"], some["seq_len"], some["seed"])
    steps: dict = {}
    for name, spec in specs.items():  # every plan first: cuBLAS's workspaces at the first product
        made[name] = {"errors": []}
        try:
            made[name]["predicted"] = lm._first(memory_plan.predict(spec, steps, (len(tokens), 0)))
        except Exception as error:
            traceback.print_exc()
            made[name]["errors"].append(f"the plan: {lm.describe(error)}")
    for name, spec in specs.items():
        for part, work in (
            ("measured", lambda spec=spec: lm.allocator_step(spec, tokens)),
            ("throughput", lambda spec=spec: lm.measure_throughput(spec, min_steady_s)),
        ):
            try:
                made[name][part] = work()
            except Exception as error:  # out of memory, say: the other parts and strategies still run
                traceback.print_exc()
                made[name]["errors"].append(f"{part}: {lm.describe(error)}")
            lm.release(device)
        tp = made[name].get("throughput", {})
        lm.say(f"{name}: {tp.get('tokens_per_s', float('nan')):,.0f} tokens/s")
    ended()
    return made


def run_zero(out: Path) -> dict:
    from dpstudy.study import modes

    missing = modes.missing_extra("deepspeed")
    if missing:  # a host set up without the extra (make setup EXTRAS=test): nothing to check
        return {"not_applicable": missing}
    made = measure("cuda")
    return zero_result(made, zero_spec(*SCHEMES["zero3"]))
