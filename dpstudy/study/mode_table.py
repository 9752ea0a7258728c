"""The modes' table: every mode's facts (dpstudy.study.mode_facts says what each is) and every
knob's schema, as data. A new mode is a row here, a class in dpstudy.engine.modes, a probe and
tests (docs/extending.md)."""

from __future__ import annotations

from dpstudy.study.mode_facts import NO_SHARD, STATE, Collective, ModeFacts, Scheme

# and its meaning. The schema (dpstudy.study.schema) adds them to $defs/settings and $defs/spec.
KNOBS: dict[str, dict] = {
    # DistributedDataParallel's own arguments, the knobs people sweep to tune DDP
    "bucket_cap_mb": {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "description": (
            "DDP only: MiB per gradient bucket (bucket_cap_mb); null: DDP's default, 25 with a first bucket of "
            "1 MiB. A cap given caps the first bucket too, as DDP does."
        ),
    },
    "gradient_as_bucket_view": {
        "type": ["boolean", "null"],
        "description": (
            "DDP only: gradients as views into the buckets, one copy of them fewer; null: DDP's default (false)."
        ),
    },
    "broadcast_buffers": {
        "type": ["boolean", "null"],
        "description": (
            "DDP only: rank 0's buffers (BatchNorm's statistics) sent to every rank before each forward; null: DDP's "
            "default (true)."
        ),
    },
    "static_graph": {
        "type": ["boolean", "null"],
        "description": (
            "DDP only: the graph is the same every step, so DDP plans its buckets once; null: DDP's default (false)."
        ),
    },
    "replicate": {
        "type": ["integer", "null"],
        "minimum": 1,
        "description": (
            "shard hybrid only: how many replicas the cell's devices form (the replicate dimension of a replicate x "
            "shard device mesh); each replica shards the model over devices / replicate devices. Needs 2 or more "
            "replicas of 2 or more devices each. null: one replica per node (nodes > 1; on one node give it)."
        ),
    },
    # DeepSpeed's ZeRO config (zero_optimization) a study may set
    "reduce_bucket_size": {
        "type": ["integer", "null"],
        "minimum": 1,
        "description": (
            "deepspeed only: gradient elements ZeRO reduces in one bucket (zero_optimization.reduce_bucket_size); "
            "the bucket is allocated whole, and a ZeRO-3 rank keeps it; null: DeepSpeed's default, 500,000,000 "
            "(2 GB in fp32)."
        ),
    },
    "stage3_param_persistence_threshold": {
        "type": ["integer", "null"],
        "minimum": 0,
        "description": (
            "shard zero3 only: parameters of fewer elements stay whole on every rank, never partitioned "
            "(zero_optimization.stage3_param_persistence_threshold); 0 partitions every one; null: DeepSpeed's "
            "default, 100,000."
        ),
    },
}
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "broadcast_buffers", "static_graph")
GATHER, SCATTER = Collective("all_gather", "units", "gather_bytes"), Collective("reduce_scatter", "units", "grad_bytes")
# ZeRO's, as DeepSpeed 0.19 runs them: the gradients reduced in buckets during backward (all-reduced
# under ZeRO-1 and 2, reduce-scattered under ZeRO-3), the parameters all-gathered (after the step; under
# ZeRO-3 per module in forward and backward): `gathers` and `gather_bytes` are a step's, as counted
ZERO_REDUCE = Collective("all_reduce", "buckets", "grad_bytes")
ZERO_GATHER = Collective("all_gather", "gathers", "gather_bytes")

TABLE: dict[str, ModeFacts] = {
    mode.name: mode
    for mode in (
        ModeFacts(
            "single",
            "one device",
            "one device",
            "one device, one process",
            "one",
            (Scheme(NO_SHARD, ""),),
            one_device=True,
        ),
        ModeFacts(
            "dp",
            "DP",
            "nn.DataParallel",
            "nn.DataParallel: one process drives every GPU of the cell",
            "one",
            (Scheme(NO_SHARD, "", unpriced="its scatter, replicate and gather"),),
            memory="dp",
            needs_cuda="nn.DataParallel splits batches over GPUs only",
            transfers=True,
        ),
        ModeFacts(
            "ddp",
            "DDP",
            "DistributedDataParallel",
            "DistributedDataParallel via torchrun",
            "per_device",
            (Scheme(NO_SHARD, "", (Collective("all_reduce", "buckets", "grad_bytes"),), buckets=True),),
            knobs=DDP_KNOBS,
        ),
        ModeFacts(
            "fsdp",
            "FSDP",
            "FSDP2's fully_shard",
            "fully_shard (FSDP2) per block and at the root, via torchrun",
            "per_device",
            (
                Scheme(
                    "full",
                    "full",
                    (GATHER, GATHER, SCATTER),
                    sharded=STATE,
                    description="parameters re-gathered for backward, like ZeRO-3",
                ),
                Scheme(
                    "grad_op",
                    "grad_op",
                    (GATHER, SCATTER),
                    sharded=STATE,
                    description="parameters kept from forward to backward, like ZeRO-2",
                ),
                Scheme(
                    "hybrid",
                    "hybrid",
                    unpriced="its two-level collectives",
                    sharded=STATE,
                    over="replica",
                    knobs=("replicate",),
                    description=(
                        "HSDP: `replicate` replicas, each sharded full over devices / replicate devices, "
                        "their gradients all-reduced between replicas"
                    ),
                ),
            ),
            memory="fake",
        ),
        ModeFacts(
            "deepspeed",
            "DeepSpeed",
            "DeepSpeed's ZeRO",
            "deepspeed.initialize with ZeRO stage 1, 2 or 3 (shard zero1, zero2, zero3), via torchrun",
            "per_device",
            (
                Scheme(
                    "zero3",
                    "ZeRO-3",
                    (ZERO_GATHER, Collective("reduce_scatter", "buckets", "grad_bytes")),
                    sharded=STATE,
                    master=True,
                    bucket="reduce_bucket_size",
                    kept_whole="stage3_param_persistence_threshold",
                    gathered="stage3_max_live_parameters",
                    knobs=("stage3_param_persistence_threshold",),
                    description="parameters, gradients and optimizer state partitioned; parameters gathered per module",
                ),
                Scheme(
                    "zero2",
                    "ZeRO-2",
                    (ZERO_REDUCE, ZERO_GATHER),
                    sharded=("grads", "optimizer"),
                    master=True,
                    bucket="reduce_bucket_size",
                    description="gradients and optimizer state partitioned",
                ),
                Scheme(
                    "zero1",
                    "ZeRO-1",
                    (ZERO_REDUCE, ZERO_GATHER),
                    sharded=("optimizer",),
                    master=True,
                    bucket="reduce_bucket_size",
                    description="optimizer state partitioned",
                ),
            ),
            knobs=("reduce_bucket_size",),
            extra="deepspeed",
            package="deepspeed",
            no_compile="DeepSpeed compiles through its own engine, which dpstudy does not drive",
            casts_module=True,
            cuda_backends=("nccl",),  # DeepSpeed's CUDA accelerator communicates over NCCL
            layout="deepspeed",
            knob_defaults={
                "reduce_bucket_size": 500_000_000,
                "stage3_param_persistence_threshold": 100_000,
                "stage3_max_live_parameters": 1_000_000_000,  # DeepSpeed's; not a study's knob
            },
        ),
    )
}
# The plainest process-group scheme: the one whose calibration a priced scheme that did not run
# borrows (the same ranks on the same host and backend), and the one the backends figure compares.
REFERENCE = ("ddp", NO_SHARD)
