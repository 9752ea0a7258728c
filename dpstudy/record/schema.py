"""The fields of record.json's parts, each a JSON Schema node with its type and, as its
`description`, its meaning: the one place a field is explained. dpstudy.record.fields makes
RECORD_SCHEMA of them; docs/record.md is rendered from that (python -m dpstudy.record.reference)."""

from __future__ import annotations

from typing import Any

SCHEMA_ID = "dpstudy.record/1"
STATUSES = ("ok", "oom", "skipped", "failed")
# ends the reason of a cell skipped because the memory plan predicted it would not fit
# (dpstudy.workflow.memory_plan): how the tables tell it from a cell the hardware cannot run
BUDGET_MARK = "(study memory_budget_gib, memory plan)"


def field(kind: str | list[str], description: str, **more: Any) -> dict[str, Any]:
    """A schema node: its type, its other keywords and its meaning."""
    return {"type": kind, **more, "description": description}


def per_rank(description: str, values: dict | None = None) -> dict[str, Any]:
    """A list of one value per rank (DP: per device), numbers unless `values` says otherwise."""
    return field("array", description, items=values or {"type": "number"})


NUMBER, MAYBE_NUMBER, MAYBE_STRING = "number", ["number", "null"], ["string", "null"]
MAYBE_OBJECT = ["object", "null"]

EPOCH_FIELDS = {
    "epoch": field("integer", "The epoch's number, from 1.", minimum=1),
    "train_loss": field(NUMBER, "Mean training loss over the epoch's samples, all ranks together."),
    "train_acc": field(NUMBER, "Share of the epoch's training samples classified right, all ranks together."),
    "test_loss": field(NUMBER, "Mean loss over the whole test set, evaluated once after the epoch."),
    "test_acc": field(
        NUMBER, "Share of the test set classified right: ranks take disjoint shards, counts all-reduced."
    ),
    "wall_s": field(
        NUMBER,
        "Seconds of the epoch's training part (`data_wait_s + compute_s`), clocks read after a device synchronize.",
    ),
    "eval_s": field(NUMBER, "Seconds evaluating the whole test set, exactly once."),
    "data_wait_s": field(NUMBER, "Seconds blocked waiting for the next batch."),
    "compute_s": field(NUMBER, "`wall_s - data_wait_s`."),
    "samples": field("integer", "Training samples processed, all ranks together."),
    "samples_per_s": field(NUMBER, "`samples / wall_s`: the whole epoch, warm-up included."),
    "peak_mem_mb": per_rank(
        "Peak memory in MB, one per rank (DP: per device): CUDA's max_memory_allocated over the epoch"
        " (training and evaluation), or on a CPU the process's peak resident memory so far (ru_maxrss)."
    ),
}
# Optional: records made before a field existed have none.
STEADY_FIELDS = {
    "steady_s": field(
        NUMBER,
        "Seconds of the epoch's steady steps: every training step after the run's first `warmup_steps`"
        " (0 while still warming up); compiling steps are left out.",
    ),
    "steady_samples": field("integer", "The steady steps' samples, all ranks together."),
    "other_load": field(
        NUMBER,
        "Cores the rest of the machine used during the epoch's training (other jobs, a hypervisor's steal"
        " time), averaged over nodes (dpstudy.engine.monitor.HostLoad).",
    ),
    "compile_s": field(
        NUMBER, "`compile: true` only: seconds of the epoch's training steps that compiled a graph (not in steady_s)."
    ),
    "eval_compile_s": field(NUMBER, "`compile: true` only: seconds of its evaluation batches that compiled a graph."),
    "machine_gflops": field(
        NUMBER,
        "The machine's speed after the epoch, every rank's in-cell gauge averaged"
        " (dpstudy.engine.reference.InCell): GFLOP/s of small matmuls.",
    ),
    "machine_mops": field(NUMBER, "The same gauge: million dispatched operators per second."),
    "machine_gbps": field(NUMBER, "The same gauge, CPU cells: GB/s copied."),
    "peak_reserved_mb": per_rank(
        "CUDA cells: max_memory_reserved over the epoch (training and evaluation) in MB, one per rank (DP:"
        " per device), beside peak_mem_mb's max_memory_allocated over the same span."
    ),
}
IN_CELL_RATES = ("machine_gflops", "machine_mops", "machine_gbps")

SUMMARY_FIELDS = {
    "final_test_acc": field(MAYBE_NUMBER, "test_acc of the last epoch; null without epochs."),
    "median_epoch_s": field(
        MAYBE_NUMBER, "Median wall_s of the epochs after the first (epoch 1 warms up), or of the only one."
    ),
    "samples_per_s": field(
        MAYBE_NUMBER,
        "Throughput over the steady window: every training step after the run's first `warmup_steps`,"
        " in whichever epoch (dpstudy.engine.outcome.steady_throughput); a run too short to leave the"
        " warm-up falls back to the epochs after the first. Compiling steps are never in it.",
    ),
    "startup_s": field(MAYBE_NUMBER, "Seconds from process start to the first epoch; null if training never began."),
    "total_s": field(MAYBE_NUMBER, "Seconds from process start to the record."),
}
# Optional: records of cells without them (and records made before) have none.
OPTIONAL_SUMMARY_FIELDS = {
    "compile_s": field(
        MAYBE_NUMBER, "`compile: true`: seconds of the training steps and evaluation batches that compiled."
    ),
    "learned": field(
        "boolean", "Whether the run learned (dpstudy.record.learning; ok cells): the status stays ok either way."
    ),
    "learned_reason": field(MAYBE_STRING, "Why it did not learn; null when it did."),
    "stopped_early": field(MAYBE_STRING, "Why training ended before its last epoch (`stop_on_divergence`), if it did."),
}

# The split of one training step's peak (dpstudy.engine.memory), in MB; their sum is peak_mb.
MEMORY_SPLIT = {
    "params_mb": "Parameters and buffers (FSDP: this rank's shards and the unsharded parameters all-gathers make).",
    "grads_mb": "Gradients (FSDP: the unsharded ones and the reduce-scatter's input, then the sharded ones).",
    "optimizer_mb": "Optimizer state (momentum, Adam's moments).",
    "activations_mb": "What forward keeps for backward, backward's temporaries and the step's inputs; under"
    " `compile: true` also the gradients the compiled backward makes.",
    "peak_mb": "The step's peak: the sum of the four parts above.",
}
# CUDA cells: what the device's allocator and driver held over the same step. The tracker counts
# tensors; these are what a user runs out of.
ALLOCATOR_SPLIT = {
    "allocated_mb": "CUDA: torch.cuda.max_memory_allocated over the step (peaks reset before it).",
    "reserved_mb": "CUDA: torch.cuda.max_memory_reserved over the step: the caching allocator's segments.",
    "context_mb": "CUDA: the process's device memory (NVML) minus what the allocator reserved: the CUDA context,"
    " cuBLAS/cuDNN workspaces outside the allocator, NCCL's buffers; null without NVML.",
    "total_mb": "CUDA: the device's memory.",
    "resident_mb": "CUDA: the data a `device` loader keeps on the device (train and test splits).",
}
HOST_SPLIT = {
    "rss_growth_mb": "CPU cells, where no allocator keeps a peak: how much the process's resident memory grew over"
    " the step (its peak, VmHWM after /proc/self/clear_refs reset it, minus VmRSS before the step), one per"
    " rank; null where the kernel does not allow the reset.",
}
MEMORY_PARTS, ALLOCATOR_PARTS, HOST_PARTS = tuple(MEMORY_SPLIT), tuple(ALLOCATOR_SPLIT), tuple(HOST_SPLIT)

# record.probe (dpstudy.engine.probe writes it, dpstudy.analysis.scaling reads it): the one
# definition of its fields; the schema's probe part is made from it and admits no other field.
UTIL_SAMPLE = {
    "t": field("number", "Seconds since sampling began."),
    "gpu_util": field("number", "Percent of the sample period the GPU was busy."),
    "mem_util": field("number", "Percent of the sample period device memory was read or written."),
    "mem_mb": field("number", "Device memory in use, every process's, in MB."),
}

# env (dpstudy.record.envinfo builds it, dpstudy.engine.cell adds ranks and user_hash). A record no
# rank measured (the launcher's) has only the job's facts: torch, torch_provider, torch_path,
# python, hostname, world_size, nodes, code_version, job. Few are required, as older records lack some.
ALLOCATOR_FIELDS = {
    "name": field(
        "string",
        "`jemalloc` or `tcmalloc` when that library is mapped in; else `glibc` when glibc's malloc runs with"
        " dpstudy's settings (dpstudy.util.allocator.GLIBC_KEEP), `system` when it does not.",
    ),
    "library": field(MAYBE_STRING, "The mapped library's path; null for glibc and system."),
    "variables": field(
        "object",
        "The allocator's environment variables set in the process (MALLOC_CONF, LD_PRELOAD, glibc's"
        " MALLOC_*), by name.",
        additionalProperties={"type": "string"},
    ),
}
RANK_FIELDS = {
    "rank": field("integer", "The rank."),
    "local_rank": field("integer", "Its rank on its node."),
    "hostname": field("string", "The host it ran on."),
    "node": field("string", "SLURM's node name when a SLURM step started it (SLURMD_NODENAME), else its hostname."),
    "cores": field(
        "array",
        "The cores it was pinned to (dpstudy.engine.cores); empty when it was not pinned. A skipped"
        " record's rank was never pinned and has none.",
        items={"type": "integer"},
    ),
    "allocator": field(
        "object", "The memory allocator in its process (dpstudy.util.allocator).", properties=ALLOCATOR_FIELDS
    ),
}
CODE_FIELDS = {
    "git_commit": field(MAYBE_STRING, "The checkout's commit (12 hex digits); null outside a git checkout."),
    "source_hash": field(
        "string",
        "sha256 (12 hex digits) of the training code: every file the engine imports and the extension's"
        " sources (dpstudy.record.provenance).",
    ),
    "user_hash": field(
        "string",
        "Factory models only: sha256 (12 hex digits) of the user's factory's source file; editing it flags"
        " the cells made with it.",
    ),
}
JOB_FIELDS = {
    "scheduler": field("string", "`slurm` when SLURM started the job, else `local`."),
    "job_id": field(MAYBE_STRING, "SLURM's job id; null for a local job."),
    "cuda_visible_devices": field(
        MAYBE_STRING, "CUDA_VISIBLE_DEVICES as the job's ranks saw it (their GPU slots); null when unset."
    ),
    "pack": field(
        MAYBE_STRING,
        "The pack (scheduler job shared with other cells, one after another) the cell ran in; null for a job of"
        " its own or a run that packs nothing (docs/cluster.md).",
    ),
    "estimated_s": field(
        MAYBE_NUMBER, "The cell's wall time as estimated before the run (dpstudy.jobs.plan_file); null if none."
    ),
}
ENV_FIELDS = {
    "torch": field(
        MAYBE_STRING,
        "torch.__version__ with its local label (e.g. 2.9.0+cu130); in a record no rank measured, read from"
        " torch's version file without importing it (null when it cannot be read).",
    ),
    "torch_provider": field(
        MAYBE_STRING,
        "`venv` when dpstudy's own venv (`make setup`) installed torch, `host` when anything else provided it"
        " (`make setup TORCH=system`, a cluster module, a container's Python); null without torch.",
    ),
    "torch_path": field(MAYBE_STRING, "The folder that holds the torch package; null without torch."),
    "cuda": field(MAYBE_STRING, "torch.version.cuda: the CUDA torch was built with; null for a CPU-only build."),
    "cudnn": field(["integer", "null"], "torch.backends.cudnn.version() (e.g. 92400); null without cuDNN."),
    "nccl": field(MAYBE_STRING, "NCCL's version as torch reports it; null without CUDA."),
    "python": field("string", "Python's version."),
    "hostname": field("string", "The host of the process that wrote the record."),
    "cpu": field("string", "The CPU's model name."),
    "cpu_count": field("integer", "Cores the writing process may run on (its CPU affinity, after pinning)."),
    "gpus": field("array", "Names of the CUDA devices the process sees; empty without CUDA.", items={"type": "string"}),
    "driver": field(MAYBE_STRING, "The NVIDIA driver's version (NVML); null without one."),
    "world_size": field("integer", "Processes (ranks) of the cell, every node's."),
    "nodes": field("integer", "Nodes the cell ran on."),
    "device": field("string", "What the ranks trained on: `cpu` or `cuda`."),
    "threads_per_process": field("integer", "torch's threads in each rank: its share of the job's cores."),
    "code_version": field(
        "object",
        "The code the cell ran: collect marks a record stale when it differs from the current code's.",
        properties=CODE_FIELDS,
    ),
    "ranks": field(
        "array",
        "Every rank in rank order: where it ran, its cores and its allocator (a skipped record: the writing"
        " rank's only).",
        items={"type": "object", "properties": RANK_FIELDS},
    ),
    "job": field("object", "The scheduler's view of the job.", properties=JOB_FIELDS),
}

# What one training sample costs (dpstudy.engine.cost): the record's `cost`, made before training.
COST_FIELDS = {
    "task": {"enum": ["image", "text"], "description": "`image`: one class per image; `text`: every next token."},
    "tokens_per_sample": field(
        ["integer", "null"],
        "Text: the tokens a sample trains on (its window's seq_len), so that tokens/s is samples/s times it;"
        " null for images.",
    ),
    "flops_per_sample": field(
        MAYBE_NUMBER,
        "Model FLOPs of one training step per sample, forward and backward, counted by PyTorch's"
        " FlopCounterMode on the meta device (no data, no kernels) for the model as built, without activation"
        " checkpointing; operators the counter does not know (the project's custom kernels) count 0. MFU's"
        " numerator is samples/s times it. null when it could not be counted (`flops_reason`).",
    ),
    "hardware_flops_per_sample": field(
        MAYBE_NUMBER,
        "With activation checkpointing: the same count with the recomputed forward included (HFU's"
        " numerator); null without checkpointing.",
    ),
    "flops_reason": field(MAYBE_STRING, "Why the FLOPs were not counted; null when they were."),
}
