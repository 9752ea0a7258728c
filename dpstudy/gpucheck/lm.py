"""Item 5 of `make gpu-check`: a language model on one GPU, trained as an lm_gpt cell trains it.

The model is the registry's `gpt` at size gpt2 (GPT-2 small: 12 layers, 768 wide, context 1,024)
with GPT-2's vocabulary of 50,257 symbols (model_args vocab_size): its parameters (124 M) and FLOPs
per token are GPT-2's, so its MFU compares with published figures; with the byte tokenizer's 256
symbols the output layer, 27 % of GPT-2's FLOPs, would be missing. The data are random bytes
(synthetic_text's 256 symbols) made in memory: nothing to prepare, and a step's speed does not
depend on the tokens. Windows of SEQ_LEN tokens, BATCH windows a step.

- throughput: the cell's own path (mode_for, the device token loader, the Trainer; `compile: true`
  compiles the model as a cell does, so the loss stays eager), bf16 autocast, Adam. A warm-up
  epoch of STEPS steps (the compile, the allocator) outside the window, then steady epochs of
  STEPS steps until MIN_STEADY_S (the Trainer's steady window: clocks after a device synchronize).
  FLOPs per token are counted on the meta device (dpstudy.models.flops: 6N + 12 L d T); MFU is
  the achieved FLOP/s over the device's dense BF16 peak (dpstudy.util.peaks: a device not in the
  table has no MFU, never another device's). The eager loss (B x T x 50,257 logits in fp32, the
  cross-entropy, its backward, the accuracy's argmax) is timed alone at the same shape, so that a
  missed target can be told apart from the compiled model's own speed.
- memory: for activation_checkpointing none and full, the memory plan (memory_plan.predict: a fake
  step, plus cuBLAS's workspaces measured on this GPU) against max_memory_allocated over one eager
  training step, as a cell measures it (dpstudy.engine.memory.measure). The plans run before
  anything else multiplies matrices on the GPU: cuBLAS's workspaces are measured at the process's
  first matrix product (dpstudy.workflow.workspaces.blas_once).

`measure` runs on a CPU too (the unit tests, at a tiny size); its figures are
dpstudy.gpucheck.lm_figures', pure.
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from pathlib import Path
from typing import Any

from dpstudy.gpucheck.lm_figures import HOWS, lm_result

MODEL, DATASET = "gpt", "synthetic_text"
MODEL_ARGS = {"size": "gpt2", "vocab_size": 50257}
SEQ_LEN, BATCH = 1024, 16  # 16,384 tokens a step; the plan: 17.9 GB an eager step, 13.1 GB checkpointed
STEPS = 25  # steps an epoch; the first epoch is the warm-up
MIN_STEADY_S, MAX_STEADY_EPOCHS = 3.0, 4
LR = 6e-4  # GPT-2 small's; the spec's default (0.05) is SGD's for images
LOSS_REPEATS = 5


def lm_spec(how: str = "none", compiled: bool = False, device: str = "cuda", **settings: Any) -> dict:
    """The cell this item measures, as the study would complete it; `settings` override (tests)."""
    from dpstudy.study.spec import complete

    return complete(
        {
            "dataset": DATASET,
            "model": MODEL,
            "model_args": MODEL_ARGS,
            "seq_len": SEQ_LEN,
            "batch": BATCH,
            "mode": "single",
            "device": device,
            "precision": "bf16",
            "compile": compiled,
            "loader": "device",
            "optimizer": "adam",
            "lr": LR,
            "warmup_steps": STEPS,
            "activation_checkpointing": how,
            **settings,
        }
    )


def say(line: str) -> None:
    print(f"[gpu-check] lm: {line}", flush=True)


def describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def random_bytes(windows: int, seq_len: int, seed: int):
    """uint8 tokens for exactly `windows` windows of seq_len + 1 (they overlap by one token)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (windows * seq_len + 1,), generator=generator, dtype=torch.uint8)


def build_trainer(spec: dict, tokens):
    """The cell's mode, device token loader, model and Trainer (as dpstudy.engine.cell builds them)."""
    import torch

    from dpstudy import models
    from dpstudy.engine.modes import mode_for
    from dpstudy.engine.token_loader import make_token_loader
    from dpstudy.engine.train import Trainer
    from dpstudy.models.tasks import cell_task

    mode = mode_for(spec)
    mode.start()  # a process-group mode's group of one (the zero item's); nothing for one device
    task = cell_task(spec)
    loader = make_token_loader(
        "device",
        tokens,
        seq_len=task.seq_len,
        batch=spec["batch"],
        partition=mode.partition,
        seed=spec["seed"],
        device=mode.device,
        train=True,
    )
    torch.manual_seed(spec["seed"])
    model = models.build(spec["model"], task, spec["model_args"]).to(mode.device)
    return Trainer(spec, mode, loader, None, model, log=lambda line: None)


def count(spec: dict) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of the spec's model, counted on the meta device."""
    from dpstudy import models
    from dpstudy.models import flops
    from dpstudy.models.tasks import cell_task

    task = cell_task(spec)
    params, step = flops.counted(lambda: models.build(spec["model"], task, spec["model_args"]), task)
    return params, step / flops.BATCH / task.seq_len


def vocab_of(spec: dict) -> int:
    from dpstudy.models.gpt_config import resolve
    from dpstudy.models.tasks import cell_task

    return resolve(spec["model_args"]).vocab_size or cell_task(spec).vocab_size


def release(device) -> None:
    """Free what the last part left (its tensors died with its Trainer), cached blocks included."""
    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_throughput(spec: dict, min_steady_s: float = MIN_STEADY_S, max_epochs: int = MAX_STEADY_EPOCHS) -> dict:
    """A warm-up epoch, then steady epochs of spec["warmup_steps"] steps each; then the eager
    loss alone (logits_path_s)."""
    trainer = build_trainer(spec, random_bytes(spec["warmup_steps"] * spec["batch"], spec["seq_len"], spec["seed"]))
    device = trainer.mode.device
    warmup = trainer.train_epoch(1)
    say(f"warm-up epoch {warmup['wall_s']:.1f} s (compile {warmup.get('compile_s', 0.0):.1f} s)")
    steady: list[dict] = []
    while not steady or (sum(e["steady_s"] for e in steady) < min_steady_s and len(steady) < max_epochs):
        steady.append(trainer.train_epoch(len(steady) + 2))
    del trainer
    release(device)
    seconds = sum(e["steady_s"] for e in steady)
    samples = sum(e["steady_samples"] for e in steady)
    losses = [warmup["train_loss"], *(e["train_loss"] for e in steady)]
    return {
        "tokens_per_s": samples * spec["seq_len"] / seconds,
        "step_s": seconds * spec["batch"] / samples,
        "steady_s": seconds,
        "steady_steps": samples // spec["batch"],
        "epoch_tokens_per_s": [e["steady_samples"] * spec["seq_len"] / e["steady_s"] for e in steady],
        "warmup_s": warmup["wall_s"],
        "compile_s": warmup.get("compile_s", 0.0),
        "steady_compile_s": sum(e.get("compile_s", 0.0) for e in steady),  # a recompile, left out of the window
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "loss_finite": all(math.isfinite(loss) for loss in losses),
        "loss_s": logits_path_s(spec["batch"], spec["seq_len"], vocab_of(spec), device),
    }


def logits_path_s(batch: int, seq_len: int, vocab: int, device, repeats: int = LOSS_REPEATS) -> float:
    """Seconds a step spends on what the Trainer does with the logits outside the compiled model
    (dpstudy.engine.objective: the loss in fp32 and its backward, the accuracy's argmax), timed
    alone on bf16 logits of the step's shape."""
    import torch

    from dpstudy.engine import objective

    logits = torch.randn(batch, seq_len, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, vocab, (batch, seq_len), device=device)

    def once() -> None:
        logits.grad = None
        objective.loss(logits, y).backward()
        objective.correct(logits.detach(), y)

    once()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def _first(split: dict) -> dict:
    """One device's values of a per-device split (single mode has one)."""
    return {k: v[0] if isinstance(v, list) else v for k, v in split.items()}


def measure_memory(specs: dict[str, dict]) -> dict[str, dict]:
    """{how: {"predicted": the plan's parts, "measured": memory.measure's, "errors": [...]}}: every
    plan first (see the module's docstring), then one eager step each, measured as a cell's."""
    from dpstudy.workflow import memory_plan

    some = next(iter(specs.values()))
    tokens = random_bytes(some["batch"], some["seq_len"], some["seed"])  # one batch: nothing else resident
    rows: dict[str, dict] = {how: {"predicted": None, "measured": None, "errors": []} for how in specs}
    steps: dict = {}
    for how, spec in specs.items():
        try:
            rows[how]["predicted"] = _first(memory_plan.predict(spec, steps, (len(tokens), 0)))
            say(f"checkpointing {how}: planned {rows[how]['predicted']['allocated_mb']:,.0f} MB")
        except Exception as error:  # the other figures still count
            traceback.print_exc()
            rows[how]["errors"].append(f"the plan: {describe(error)}")
    for how, spec in specs.items():
        try:
            rows[how]["measured"] = held = allocator_step(spec, tokens)
            peak = held.get("allocated_mb")  # none on a CPU: the tracker's peak instead
            say(f"checkpointing {how}: {'allocated' if peak else 'tracker'} {peak or held['peak_mb']:,.0f} MB")
        except Exception as error:  # out of memory, say: the other setting still runs
            traceback.print_exc()
            rows[how]["errors"].append(f"the step: {describe(error)}")
        release(spec["device"])
    return rows


def allocator_step(spec: dict, tokens) -> dict:
    """memory.measure's split of one eager training step after a first one (Adam's state then
    exists, as after training and in the plan's fake step); the Trainer is gone on return."""
    from dpstudy.engine import memory

    trainer = build_trainer(spec, tokens)
    x, y = next(iter(trainer.train_data))
    trainer.step(x, y)
    del x, y
    return _first(memory.measure(trainer))


def measure(device: str = "cuda", compiled: bool = True, min_steady_s: float = MIN_STEADY_S, **settings: Any) -> dict:
    """Everything the item measures, in its order (the plans first); `settings` override the
    spec (tests: a tiny model on the CPU)."""
    import torch

    made: dict[str, Any] = {"device_name": torch.cuda.get_device_name(0) if device == "cuda" else device}
    specs = {how: lm_spec(how, device=device, **settings) for how in HOWS}
    made["params"], made["flops_per_token"] = count(specs["none"])
    say(f"{made['params']:,} parameters, {made['flops_per_token'] / 1e6:,.1f} MFLOP a token; the memory plans")
    made["memory"] = measure_memory(specs)
    try:
        say("throughput: compiling" if compiled else "throughput")
        spec = lm_spec("none", compiled, device, **settings)
        made["throughput"] = measure_throughput(spec, min_steady_s)
    except Exception as error:  # the memory figures still count
        traceback.print_exc()
        made["throughput"] = {"error": describe(error)}
    return made


def run_lm(out: Path) -> dict:
    made = measure("cuda")
    spec = lm_spec("none", compiled=True)
    keys = ("model", "model_args", "dataset", "seq_len", "batch", "precision", "compile", "optimizer", "lr")
    result = lm_result(made, spec)
    tp = made["throughput"]
    if "tokens_per_s" in tp:
        say(f"{tp['tokens_per_s']:,.0f} tokens/s, MFU {result['figures'].get('mfu') or float('nan'):.1%}")
    return {**result, "params": {**{k: spec[k] for k in keys}, "steps_per_epoch": spec["warmup_steps"]}}
