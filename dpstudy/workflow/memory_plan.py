"""Before any training: every cell's peak memory per device, predicted where Snakemake plans,
without the cell's hardware, and the verdict that keeps a cell predicted not to fit from launching
(read by the cell's own job: dpstudy.jobs.launch.skip_reason).

The prediction runs the cell's own Trainer on fake tensors (FakeTensorMode: shapes, dtypes and
devices, no data, no kernels): it builds the model, wraps it as the mode does and takes two
training steps at the cell's per-device batch, the second followed by the same tracker that
dpstudy.engine.memory measures the cell with after training, so predicted and measured split the
same peak the same way. Per mode:

  single  the model at the cell's batch
  ddp     the model at the per-device batch, plus one copy of the gradients: a DDP step (its
          buckets, gradient_as_bucket_view off) peaks that much above the plain model's step, in
          the tracker's temporaries (measured: resnet18 +42.6 MB, its parameters' bytes, at
          batch 8 and 32 per rank over Gloo); the buckets themselves exist before the step and
          are outside the tracker in both numbers. Fake tensors cannot run DDP itself: its
          reducer needs real collectives
  fsdp    FSDP2 over a fake process group of the cell's world size (torch's FakeStore): rank 0's
          shards, the largest when they are uneven, stand for every rank; shard hybrid over the
          same group as its two-dimensional mesh (replicate x shard), each rank holding
          1 / (world / replicate) of the state
  dp      nn.DataParallel cannot run on fake devices: device 0 is the model's step at the
          per-device batch plus the rest of the batch, which the loader puts on device 0 before
          DataParallel scatters it; every other device holds a replica of the parameters, their
          gradients before they are summed onto device 0, and its share of the activations

The plan is a CSV (outputs.MEMORY_PLAN): one row per cell and device, the four parts and the
peak in MB, or the reason a cell could not be predicted; and, under the study's
memory_budget_gib, `skip`: why a cell predicted not to fit is not launched. The verdict lives in
the plan, not in the train jobs' params, so that a new budget reruns no cell that already ran.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable

from dpstudy.data.task import Task
from dpstudy.record.fields import BUDGET_MARK, MEMORY_PARTS
from dpstudy.study import modes
from dpstudy.study import spec as specs
from dpstudy.study.budget import CUDA_RUNTIME_MB, FRAGMENTATION, GIB, need_of
from dpstudy.util.atomic import atomic_output
from dpstudy.workflow.fake_step import faked, tracked_fake_step, workspace_on_this_gpu

# the record's memory parts (params_mb ... peak_mb), one source with dpstudy.engine.memory's split
PARTS = tuple(part.removesuffix("_mb") for part in MEMORY_PARTS if part != "peak_mb")
# allocated_mb: what the CUDA allocator will hold at the step's peak (see predict)
# workspace_mb: what cuBLAS's and cuDNN's workspaces add to it, measured where the plan has a GPU
MB = 2**20
PLAN_COLUMNS = ("cell", "device", *MEMORY_PARTS, "allocated_mb", "workspace_mb", "reason", "skip")


# Settings no prediction depends on: the plan predicts eager (compile), on fake tensors over a
# fake process group (backend), and a repeat trains the same step (repeat, seed).
UNPREDICTED = ("repeat", "seed", "compile", "backend")
# ... and those that reach the fake step only through its per-device batch and its sharding.
STEP_SHAPING = ("mode", "gpus", "nodes", "batch", "batch_scope", "shard")


def setting_key(spec: dict) -> str:
    """Cells with the same key have the same prediction."""
    return repr(sorted((k, v) for k, v in spec.items() if k not in UNPREDICTED))


def step_key(spec: dict) -> str:
    """Cells with the same key run the same fake step (single, DP and DDP at one per-device batch)."""
    fake = faked(spec)
    sharding = specs.shard_of(spec["mode"], spec.get("shard")) if fake else modes.NO_SHARD  # the plain model
    world = specs.devices(spec) if fake else 1
    rest = sorted((k, v) for k, v in spec.items() if k not in UNPREDICTED + STEP_SHAPING)
    return repr((sharding, world, specs.per_device_batch(spec), rest))


def predict(spec: dict, steps: dict | None = None, sizes: tuple[int, int] | None = None) -> dict[str, list[float]]:
    """{"params_mb": [...], ..., "peak_mb": [...], "allocated_mb": [...]}, one value per device, the
    parts as dpstudy.engine.memory measures them; raises when the model cannot run on fake tensors
    (e.g. a custom kernel). `steps` keeps the fake steps already run (by step_key) for the next
    call; `sizes` are the dataset's (train, test) samples (None: unknown, see allocated)."""
    from dpstudy.models.tasks import cell_task

    task = cell_task(spec)  # a user's dataset: once prepared
    devices, batch = specs.devices(spec), specs.per_device_batch(spec)
    steps = {} if steps is None else steps
    key = step_key(spec)
    if key not in steps:
        steps[key] = tracked_fake_step(spec, task, batch)
        steps[key] += (workspace_on_this_gpu(spec, steps[key][0]["peak"], steps[key][2]),)
    parts, param_bytes, _, workspace = steps[key]
    gradient_mb = sum(param_bytes) / MB
    scheme = modes.scheme(spec["mode"], spec.get("shard"))
    if scheme.sharded and not faked(spec):  # ZeRO: no fake step of its own
        parts = sharded_parts(spec, parts, param_bytes)
    if scheme.buckets:
        parts = {**parts, "activations": parts["activations"] + gradient_mb, "peak": parts["peak"] + gradient_mb}
    split = {f"{p}_mb": [parts[p]] * devices for p in PARTS} | {"peak_mb": [parts["peak"]] * devices}
    if modes.TABLE[spec["mode"]].memory == "dp" and devices > 1:
        # device 0: the whole batch arrives there; the others: a replica, its gradients, its activations
        rest_of_batch = (specs.global_batch(spec) - batch) * input_bytes(task) / 2**20
        replica = {"params": parts["params"], "grads": parts["grads"], "optimizer": 0.0}
        replica["activations"] = parts["activations"]
        split = {f"{p}_mb": [parts[p]] + [replica[p]] * (devices - 1) for p in PARTS}
        split["activations_mb"][0] += rest_of_batch
        split["peak_mb"] = [sum(split[f"{p}_mb"][d] for p in PARTS) for d in range(devices)]
    held = allocated(spec, split["peak_mb"], gradient_mb, resident_mb(spec, task, sizes), workspace or 0.0)
    return split | {"allocated_mb": held, "workspace_mb": [workspace] * devices}


def sharded_parts(spec: dict, parts: dict, param_bytes: tuple[int, ...]) -> dict:
    """The plain step's parts as one device of a scheme that shards the model state and has no fake
    step of its own (DeepSpeed's ZeRO, which fake tensors cannot run), from the modes' table: each
    sharded part over its degree; the module in the compute dtype where the mode casts it; the fp32
    master copy of the device's partition beside the optimizer's state (the ZeRO paper counts it
    there); the gradient bucket, allocated whole, in the gradients; the parameters below the
    kept-whole threshold whole on every device (fp32 elements: bytes / 4); where the scheme gathers
    parameters (ZeRO-3), as many as it keeps live at once and their full gradients, in the
    activations' part, which the step's own buffers fall in."""
    facts, scheme = modes.TABLE[spec["mode"]], modes.scheme(spec["mode"], spec.get("shard"))
    n = modes.degree(scheme, specs.devices(spec), specs.replicas(spec))
    cast = 0.5 if facts.casts_module and spec["precision"] in ("bf16", "fp16") else 1.0

    def knob(name: str) -> float:
        return spec.get(name) if spec.get(name) is not None else facts.knob_defaults[name]

    def share(part: str) -> float:
        return modes.state_share(scheme, part, specs.devices(spec), specs.replicas(spec))

    whole = sum(b for b in param_bytes if b / 4 < knob(scheme.kept_whole)) / MB if scheme.kept_whole else 0.0
    bucket = knob(scheme.bucket) * 4 * cast / MB if scheme.bucket else 0.0
    live = min(sum(param_bytes), knob(scheme.gathered) * 4) * cast / MB if scheme.gathered else 0.0
    made = {
        "params": ((parts["params"] - whole) * share("params") + whole) * cast,
        "grads": parts["grads"] * cast * share("grads") + bucket,
        "optimizer": parts["optimizer"] * share("optimizer") + (sum(param_bytes) / MB / n if scheme.master else 0.0),
        "activations": parts["activations"] + 2 * live,
    }
    return {**made, "peak": sum(made.values())}


def input_bytes(task: Task) -> int:
    """Bytes of one sample as the step takes it: a float32 image, or a window of seq_len + 1 int64
    tokens (input and target are views of it)."""
    return (task.seq_len + 1) * 8 if task.is_text else math.prod(task.input_shape(1)) * 4


def resident_mb(spec: dict, task: Task, sizes: tuple[int, int] | None) -> float | None:
    """MB a `device` loader keeps on each device it feeds before the step: both splits (uint8
    images and int64 labels, or the tokens as stored: one byte each up to 256 symbols, else four)
    and this rank's epoch indices; None where the sizes (samples, or a text's tokens) are unknown."""
    if spec["loader"] != "device":
        return 0.0
    if sizes is None:
        return None
    train, test = sizes
    ranks = specs.devices(spec) if specs.one_process_per_device(spec) else 1
    if task.is_text:
        token = 1 if task.vocab_size <= 256 else 4
        windows = max(0, (train - 1) // task.seq_len)
        return ((train + test) * token + math.ceil(windows / ranks) * 8) / 2**20
    return ((train + test) * (math.prod(task.input_shape(1)) + 8) + math.ceil(train / ranks) * 8) / 2**20


def allocated(
    spec: dict, peaks: list[float], gradient_mb: float, resident: float | None, workspace: float = 0.0
) -> list[float | None]:
    """The allocator's peak per device: the tracker's step plus what exists before the step and
    is not the model's or the optimizer's: the loader's resident data (DP: on device 0 only) and
    DDP's gradient buckets (one copy of the gradients); plus the libraries' workspaces, where
    measured (workspace_on_this_gpu). Not seen: the allocator's rounding and what the Trainer keeps
    beside the step (one input batch for evaluation), which measurements show (memory_split)."""
    if resident is None:
        return [None] * len(peaks)
    buckets = gradient_mb if modes.scheme(spec["mode"], spec.get("shard")).buckets else 0.0
    one_process = not modes.TABLE[spec["mode"]].per_device  # DP: its loader feeds device 0 only
    fed = [not one_process or d == 0 for d in range(len(peaks))]
    return [peak + buckets + workspace + (resident if holds else 0.0) for peak, holds in zip(peaks, fed, strict=True)]


def plan_rows(
    cells: dict[str, dict], budget_gib: float | None = None, log=print, sizes: dict | None = None
) -> list[dict]:
    """The plan's rows for {cell id: spec}; cells of equal specs but for UNPREDICTED settings are
    predicted once, and one fake step serves every cell that runs it (step_key). With
    `budget_gib`, a cell whose fullest device is predicted above it gets its `skip` reason on
    every row. `sizes`: {dataset: (train, test) samples or None} (store.split_sizes)."""
    sizes = sizes or {}
    done: dict[str, dict | str] = {}
    steps: dict = {}
    rows = []
    for cell, spec in cells.items():
        key = setting_key(spec)
        if key not in done:
            try:
                done[key] = predict(spec, steps, sizes.get(spec["dataset"]))
            except Exception as error:  # a model fake tensors cannot run: the plan says why
                done[key] = f"not predicted: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
            peak = done[key] if isinstance(done[key], str) else f"{max(done[key]['peak_mb']):.1f} MB"
            if not isinstance(done[key], str) and done[key]["workspace_mb"][0] is not None:
                peak += f", the libraries' workspaces +{done[key]['workspace_mb'][0]:.1f} MB on this host's GPU"
            log(f"[dpstudy] memory plan: {cell}: {peak}")
        split = done[key]
        if isinstance(split, str):
            rows.append({"cell": cell, "device": None, "reason": split, "skip": None})
            continue
        skip = over_budget(*need_mb(spec, split), budget_gib) if budget_gib is not None else None
        for device in range(len(split["peak_mb"])):
            parts = {k: v[device] for k, v in split.items()}
            rows.append({"cell": cell, "device": device, **parts, "reason": None, "skip": skip})
    return rows


def write_plan(rows: Iterable[dict], path: str) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PLAN_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def need_mb(spec: dict, split: dict[str, list]) -> tuple[float, str]:
    """What the cell's fullest device must have free (MB), and what it is made of: the allocator's
    predicted peak (the tracker's where the data's size is unknown) with its fragmentation margin,
    and outside device: cpu the CUDA context and workspaces."""
    held = [p if a is None else a for a, p in zip(split["allocated_mb"], split["peak_mb"], strict=True)]
    peak = max(held)
    runtime = 0.0 if spec["device"] == "cpu" else CUDA_RUNTIME_MB
    parts = f"allocator peak {peak / GIB:.2f} GiB + {FRAGMENTATION:.0%}"
    if runtime:
        parts += f" + {runtime / GIB:.2f} GiB CUDA context and workspaces"
    return need_of(peak, on_cuda=bool(runtime)), parts


def over_budget(need: float, parts: str, budget_gib: float) -> str | None:
    """The skipped record's reason when a cell's predicted need does not fit `budget_gib` per device."""
    if need <= budget_gib * GIB:
        return None
    return f"predicted {need / GIB:.2f} GiB ({parts}) > {budget_gib:g} GiB per device {BUDGET_MARK}"
